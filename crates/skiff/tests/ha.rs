//! A highly available control plane: two `skiff server` replicas on one 3-member etcd, each
//! listening on its own loopback address with the same port (as replicas behind one address),
//! sharing the first one's `pki/` and `encryption-config.yaml`. kubectl on either sees the same
//! objects and watches; `default/kubernetes` lists exactly the live replicas (a replica killed
//! leaves after its TTL, one stopped cleanly at once, one restarted comes back); the second
//! replica takes the first's join token; a replica with another CA, or without the cluster's
//! encryption keys, refuses to start.

#![cfg(test)]

mod common;

use std::io::{BufRead, BufReader};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{eventually, own_service_range, skiff_bin, tail};
use skiff_testkit::EtcdCluster;

/// The TTL of each replica's endpoint record: short, so the test waits seconds.
const TTL: &str = "3s";

/// A port free on both loopback addresses.
fn shared_port(a: IpAddr, b: IpAddr) -> u16 {
    for _ in 0..20 {
        let Ok(first) = TcpListener::bind(SocketAddr::new(a, 0)) else {
            continue;
        };
        let port = first.local_addr().unwrap().port();
        if TcpListener::bind(SocketAddr::new(b, port)).is_ok() {
            return port;
        }
    }
    panic!("no port free on both {a} and {b}");
}

struct Replica {
    name: &'static str,
    dir: tempfile::TempDir,
    home: tempfile::TempDir,
    args: Vec<String>,
    child: Option<Child>,
}

impl Replica {
    fn new(name: &'static str, etcd: &EtcdCluster, ip: IpAddr, port: u16) -> Replica {
        let args = vec![
            "--no-agent".to_string(),
            "--no-scheduler".into(),
            "--port".into(),
            port.to_string(),
            "--bind-address".into(),
            ip.to_string(),
            "--advertise-address".into(),
            ip.to_string(),
            "--service-cluster-ip-range".into(),
            own_service_range(port),
            "--etcd-servers".into(),
            etcd.endpoints_arg(),
            "--master-endpoint-reconcile-ttl".into(),
            TTL.into(),
        ];
        Replica {
            name,
            dir: tempfile::tempdir().unwrap(),
            home: tempfile::tempdir().unwrap(),
            args,
            child: None,
        }
    }

    /// Copies what docs/ha-etcd.md says to copy from `from`: `pki/`, and the encryption
    /// configuration unless `encryption` is false.
    fn copy_from(&self, from: &Replica, encryption: bool) {
        let ok = Command::new("cp")
            .arg("-a")
            .arg(from.dir.path().join("pki"))
            .arg(self.dir.path())
            .status()
            .unwrap();
        assert!(ok.success());
        if encryption {
            std::fs::copy(
                from.dir.path().join("encryption-config.yaml"),
                self.dir.path().join("encryption-config.yaml"),
            )
            .unwrap();
        }
    }

    fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("server.log"))
            .unwrap();
        let child = Command::new(skiff_bin())
            .arg("server")
            .arg("--data-dir")
            .arg(self.dir.path())
            .args(&self.args)
            .env("HOME", self.home.path())
            .env("SKIFF_LOG", "info")
            // A replica that exits says why in the log's last lines, not under a backtrace.
            .env("RUST_LIB_BACKTRACE", "0")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    /// Starts it and waits until `/readyz` answers.
    fn start(&mut self) {
        let _ = std::fs::remove_file(self.kubeconfig());
        self.spawn();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !(self.kubeconfig().exists() && self.kubectl(&["get", "--raw", "/readyz"]).status.success()) {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().unwrap()) {
                panic!("{} exited ({status}):\n{}", self.name, tail(&self.log(), 40));
            }
            assert!(
                Instant::now() < deadline,
                "{} not ready:\n{}",
                self.name,
                tail(&self.log(), 40)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Starts it and waits for it to exit; its status and log.
    fn start_and_fail(&mut self) -> (std::process::ExitStatus, String) {
        self.spawn();
        let mut child = self.child.take().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return (status, self.log());
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("{} did not refuse to start:\n{}", self.name, tail(&self.log(), 40));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, and wait for the clean exit.
    fn stop(&mut self) {
        let mut c = self.child.take().unwrap();
        // SAFETY: kill(2) on the server this test started.
        let rc = unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        assert_eq!(rc, 0);
        let status = c.wait().unwrap();
        assert!(status.success(), "{} exited with {status}", self.name);
    }

    fn kubectl_cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("kubectl");
        cmd.arg("--kubeconfig")
            .arg(self.kubeconfig())
            .args(["--request-timeout", "10s"])
            .args(args)
            .env("HOME", self.home.path())
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null());
        cmd
    }

    fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_cmd(args).output().unwrap()
    }

    fn k(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "{}: kubectl {args:?}: {}\n{}",
            self.name,
            String::from_utf8_lossy(&out.stderr),
            tail(&self.log(), 30)
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    }

    /// The addresses `default/kubernetes`'s Endpoints and EndpointSlice list, as this replica
    /// serves them.
    fn kubernetes_endpoints(&self) -> (String, String) {
        let endpoints = self.k(&[
            "get",
            "endpoints",
            "kubernetes",
            "-n",
            "default",
            "-o",
            "jsonpath={.subsets[*].addresses[*].ip}",
        ]);
        let slice = self.k(&[
            "get",
            "endpointslice",
            "kubernetes",
            "-n",
            "default",
            "-o",
            "jsonpath={.endpoints[*].addresses[0]}",
        ]);
        (endpoints, slice)
    }

    fn wait_endpoints(&self, want: &str, within: Duration) -> Duration {
        let started = Instant::now();
        let seen = eventually(within, || {
            let (e, s) = self.kubernetes_endpoints();
            (e == want && s == want).then_some(())
        });
        assert!(
            seen.is_some(),
            "{}: the kubernetes endpoints are {:?}, not {want:?}",
            self.name,
            self.kubernetes_endpoints()
        );
        started.elapsed()
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill9();
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

#[test]
fn two_replicas_on_one_etcd() {
    let etcd = EtcdCluster::start(3);
    let (ip_a, ip_b) = (
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)),
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3)),
    );
    let port = shared_port(ip_a, ip_b);
    let mut a = Replica::new("replica a", &etcd, ip_a, port);
    a.start();
    assert!(
        read(&a.kubeconfig()).contains(&format!("server: \"https://{ip_a}:{port}\"")),
        "{}",
        read(&a.kubeconfig())
    );
    a.wait_endpoints("127.0.0.2", Duration::from_secs(5));

    // A replica with a CA of its own refuses to start, and says why.
    let mut stranger = Replica::new("replica with another CA", &etcd, ip_b, port);
    let (status, log) = stranger.start_and_fail();
    assert!(!status.success());
    assert!(log.contains("is not the cluster's"), "{}", tail(&log, 20));
    assert!(log.contains("copy DATA_DIR/pki/"), "{}", tail(&log, 20));
    // The cluster's CA, but not its encryption keys: refused as well, Secrets being unreadable.
    let mut keyless = Replica::new("replica without the encryption keys", &etcd, ip_b, port);
    keyless.copy_from(&a, false);
    let (status, log) = keyless.start_and_fail();
    assert!(!status.success());
    assert!(log.contains("encrypted with keys"), "{status}: {log}");
    drop((stranger, keyless));

    let mut b = Replica::new("replica b", &etcd, ip_b, port);
    b.copy_from(&a, true);
    b.start();
    // One join token for the cluster, whichever replica prints it; one cluster-info.
    assert_eq!(
        read(&b.dir.path().join("server/token")),
        read(&a.dir.path().join("server/token"))
    );
    let cluster_info = a.k(&[
        "get",
        "configmap",
        "cluster-info",
        "-n",
        "kube-public",
        "-o",
        "jsonpath={.data.kubeconfig}",
    ]);
    assert!(
        cluster_info.contains(&format!("https://{ip_a}:{port}")),
        "{cluster_info}"
    );

    // Both replicas in the endpoints, sorted, as each of them serves it.
    a.wait_endpoints("127.0.0.2 127.0.0.3", Duration::from_secs(10));
    b.wait_endpoints("127.0.0.2 127.0.0.3", Duration::from_secs(5));
    let leases = b.k(&[
        "get",
        "leases",
        "-n",
        "kube-system",
        "-l",
        "apiserver.kubernetes.io/identity=kube-apiserver",
        "-o",
        "json",
    ]);
    let leases: serde_json::Value = serde_json::from_str(&leases).unwrap();
    let mut leases: Vec<String> = leases["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            l["metadata"]["annotations"]["skiff.dev/endpoint"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    leases.sort();
    assert_eq!(leases, [format!("{ip_a}:{port}"), format!("{ip_b}:{port}")]);

    // Written through one, read and watched through the other.
    a.k(&["create", "namespace", "team"]);
    let mut watch = b
        .kubectl_cmd(&["get", "configmaps", "-n", "team", "--watch", "-o", "name"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let out = watch.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    std::thread::sleep(Duration::from_millis(500));
    a.k(&[
        "create",
        "configmap",
        "shared",
        "-n",
        "team",
        "--from-literal=k=through-a",
    ]);
    let seen = eventually(Duration::from_secs(10), || {
        rx.recv_timeout(Duration::from_millis(200))
            .ok()
            .filter(|l| l == "configmap/shared")
    });
    let _ = watch.kill();
    let _ = watch.wait();
    assert!(seen.is_some(), "the watch on b did not see the write through a");
    assert_eq!(
        b.k(&["get", "configmap", "shared", "-n", "team", "-o", "jsonpath={.data.k}"]),
        "through-a"
    );
    b.k(&[
        "patch",
        "configmap",
        "shared",
        "-n",
        "team",
        "-p",
        r#"{"data":{"k":"through-b"}}"#,
    ]);
    assert_eq!(
        a.k(&["get", "configmap", "shared", "-n", "team", "-o", "jsonpath={.data.k}"]),
        "through-b"
    );

    // kill -9: b leaves the endpoints once its TTL has passed, and comes back when restarted.
    b.kill9();
    let gone = a.wait_endpoints("127.0.0.2", Duration::from_secs(15));
    eprintln!("a killed replica left the endpoints after {gone:?}");
    b.start();
    a.wait_endpoints("127.0.0.2 127.0.0.3", Duration::from_secs(5));
    assert_eq!(
        b.k(&["get", "configmap", "shared", "-n", "team", "-o", "jsonpath={.data.k}"]),
        "through-b"
    );

    // A clean stop removes the replica at once, well before its TTL.
    b.stop();
    let gone = a.wait_endpoints("127.0.0.2", Duration::from_secs(2));
    eprintln!("a stopped replica left the endpoints after {gone:?}");
    let leases = a.k(&[
        "get",
        "leases",
        "-n",
        "kube-system",
        "-l",
        "apiserver.kubernetes.io/identity=kube-apiserver",
        "-o",
        "name",
    ]);
    assert_eq!(leases.lines().count(), 1, "{leases}");
}

/// Whether `user` may list pods in `default`, as `replica` answers.
fn can_list_pods(replica: &Replica, user: &str) -> bool {
    let out = replica.kubectl(&["auth", "can-i", "list", "pods", "-n", "default", "--as", user]);
    String::from_utf8_lossy(&out.stdout).trim() == "yes"
}

#[test]
fn rbac_written_through_one_replica_holds_on_the_other_and_a_stale_replica_refuses() {
    let mut etcd = EtcdCluster::start(1);
    let (ip_a, ip_b) = (
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, 4)),
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, 5)),
    );
    let port = shared_port(ip_a, ip_b);
    let mut a = Replica::new("replica a", &etcd, ip_a, port);
    a.start();
    let mut b = Replica::new("replica b", &etcd, ip_b, port);
    b.copy_from(&a, true);
    b.start();
    assert!(!can_list_pods(&b, "jane"));

    // A grant written through a holds on b: b's watch brings it.
    a.k(&[
        "create",
        "rolebinding",
        "jane-view",
        "-n",
        "default",
        "--clusterrole=view",
        "--user=jane",
    ]);
    let started = Instant::now();
    assert!(
        eventually(Duration::from_secs(10), || can_list_pods(&b, "jane").then_some(())).is_some(),
        "the grant never held on b:\n{}",
        tail(&b.log(), 30)
    );
    eprintln!("grant through a held on b after {:?}", started.elapsed());
    // And so does its revocation.
    a.k(&["delete", "rolebinding", "jane-view", "-n", "default"]);
    let started = Instant::now();
    assert!(
        eventually(Duration::from_secs(10), || (!can_list_pods(&b, "jane")).then_some(())).is_some(),
        "the revocation never held on b"
    );
    eprintln!("revocation through a held on b after {:?}", started.elapsed());

    // With its store gone, b cannot know what was revoked: it says so, and refuses.
    a.k(&[
        "create",
        "rolebinding",
        "jane-view",
        "-n",
        "default",
        "--clusterrole=view",
        "--user=jane",
    ]);
    assert!(eventually(Duration::from_secs(10), || can_list_pods(&b, "jane").then_some(())).is_some());
    etcd.stop_all();
    let readyz = eventually(Duration::from_secs(20), || {
        let out = b.kubectl(&["get", "--raw", "/readyz?verbose"]);
        let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        (!out.status.success()).then_some(text)
    })
    .expect("b's /readyz fails without its store");
    assert!(readyz.contains("rbac-snapshot-current"), "{readyz}");
    let refused = eventually(Duration::from_secs(20), || {
        let out = b.kubectl(&["get", "pods", "-n", "default", "--as", "jane"]);
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        err.contains("could not bring its view of roles and bindings up to date")
            .then_some(err)
    });
    assert!(
        refused.is_some(),
        "b kept answering from its old grants:\n{}",
        tail(&b.log(), 30)
    );

    // Back with its store, it is ready and current again.
    etcd.start_all();
    etcd.wait_healthy(Duration::from_secs(30));
    assert!(
        eventually(Duration::from_secs(30), || b
            .kubectl(&["get", "--raw", "/readyz"])
            .status
            .success()
            .then_some(()))
        .is_some(),
        "b never became ready again:\n{}",
        tail(&b.log(), 30)
    );
    assert!(can_list_pods(&b, "jane"));
}
