//! End-to-end test harness: a real `skiff server` on a free port with a temporary data dir,
//! driven by the real kubectl with a fresh HOME. Everything is stopped and removed on drop.

#![allow(dead_code)]
#![cfg(test)]

pub mod multinode;
pub mod node;
pub mod seeds;
pub mod storage;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub struct Cluster {
    pub child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub home: tempfile::TempDir,
    pub port: u16,
    pub kubeconfig: PathBuf,
    args: Vec<String>,
    /// The service range the harness gave the cluster (see [`own_service_range`]).
    pub service_range: Option<String>,
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A service range of a cluster's own, a /24 of 10.192.0.0/12 chosen by its port: the node agent's
/// proxy names its nftables table after the range and rejects the unallocated addresses of it, so
/// clusters running at once on this host must not share or overlap ranges (or the default one, a
/// developer's own cluster may use it).
pub fn own_service_range(port: u16) -> String {
    let i = port % 4096;
    format!("10.{}.{}.0/24", 192 + i / 256, i % 256)
}

/// The proxy's table for a service range (as `skiff_agent::proxy::table_name`).
pub fn proxy_table(range: &str) -> String {
    format!("skiff-{}", range.replace(['.', '/'], "-"))
}

/// The eviction thresholds of test nodes, as kind configures its nodes: upstream's memory
/// threshold, none on disk. The disk is the host's, shared with everything else on the machine;
/// how full it happens to be must not evict a test's pods.
/// Says whether any address of the given ranges would be routed off this machine; every test
/// runs it before it sends traffic to the service or the cluster range.
pub const RANGES_STAY_LOCAL: &str = "/work/shared/tools/ranges-stay-local.sh";

pub const TEST_EVICTION_HARD: &str =
    "memory.available<100Mi,nodefs.available<0%,nodefs.inodesFree<0%,imagefs.available<0%,imagefs.inodesFree<0%";

/// A kubeconfig from `skiff kubeconfig ARGS` (a user's or a node's), written to the data dir as
/// `FILE`.
pub fn issued_kubeconfig(c: &Cluster, args: &[&str], file: &str) -> PathBuf {
    let out = Command::new(skiff_bin())
        .arg("kubeconfig")
        .args(args)
        .arg("--data-dir")
        .arg(c.path())
        .output()
        .expect("skiff kubeconfig");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let path = c.path().join(file);
    std::fs::write(&path, &out.stdout).expect("write the kubeconfig");
    path
}

/// A kubeconfig for node `name` (`system:node:NAME` in `system:nodes`), from `skiff kubeconfig
/// node`: what a `skiff agent` joining the cluster runs with.
pub fn node_kubeconfig(c: &Cluster, name: &str) -> PathBuf {
    issued_kubeconfig(c, &["node", name], &format!("node-{name}.kubeconfig"))
}

/// The kubectl the tests drive: `$SKIFF_KUBECTL` when set (the test script runs the kubectl
/// suite again with kubectl 1.33 and 1.37, the version skew upstream supports), else the
/// system's `kubectl`.
pub fn kubectl_bin() -> String {
    std::env::var("SKIFF_KUBECTL").unwrap_or_else(|_| "kubectl".to_string())
}

pub fn skiff_bin() -> &'static str {
    env!("CARGO_BIN_EXE_skiff")
}

impl Cluster {
    /// A control plane without a local node agent.
    pub fn start(extra: &[&str]) -> Cluster {
        let dir = tempfile::tempdir().expect("data dir");
        let home = tempfile::tempdir().expect("home");
        let port = free_port();
        let kubeconfig = dir.path().join("kubeconfig");
        let mut args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        if !extra.contains(&"--eviction-hard") {
            args.extend(["--eviction-hard".to_string(), TEST_EVICTION_HARD.to_string()]);
        }
        let mut service_range = None;
        // Also without an agent of its own: a test may start `skiff agent` against it.
        if !extra.contains(&"--service-cluster-ip-range") {
            let range = own_service_range(port);
            args.extend(["--service-cluster-ip-range".to_string(), range.clone()]);
            service_range = Some(range);
        }
        let mut c = Cluster {
            child: None,
            dir,
            home,
            port,
            kubeconfig,
            args,
            service_range,
        };
        c.spawn();
        if extra.contains(&"--no-controllers") {
            // No service account controller and no root CA publisher: the `default` account,
            // which the ServiceAccount admission plugin requires of every pod, and the
            // `kube-root-ca.crt` its credentials volume projects, are made as they would be.
            let ca = c.dir.path().join("pki").join("ca.crt");
            for args in [
                vec!["create".to_string(), "serviceaccount".into(), "default".into()],
                vec![
                    "create".to_string(),
                    "configmap".into(),
                    "kube-root-ca.crt".into(),
                    format!("--from-file=ca.crt={}", ca.display()),
                ],
            ] {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                let out = c.kubectl(&args);
                let err = String::from_utf8_lossy(&out.stderr);
                assert!(out.status.success() || err.contains("AlreadyExists"), "{err}");
            }
        }
        c
    }

    fn spawn(&mut self) {
        let log = std::fs::File::create(self.dir.path().join("server.log")).expect("log file");
        let child = Command::new(skiff_bin())
            .arg("server")
            .arg("--data-dir")
            .arg(self.dir.path())
            .arg("--port")
            .arg(self.port.to_string())
            .args(&self.args)
            .env("HOME", self.home.path())
            .env("SKIFF_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start skiff server");
        self.child = Some(child);
        self.wait_ready();
    }

    pub fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if self.kubeconfig.exists() {
                let out = self.kubectl(&["get", "--raw", "/readyz"]);
                if out.status.success() {
                    return;
                }
            }
            if Instant::now() > deadline {
                panic!("server did not become ready; log:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    /// kill -9 the server (containers and data stay).
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM the server and wait for it to exit (60 s at most); whether it exited cleanly.
    pub fn terminate(&mut self) -> bool {
        let Some(mut c) = self.child.take() else {
            return false;
        };
        // SAFETY: kill(2) on the pid of a child this harness started and has not reaped.
        let rc = unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        assert_eq!(rc, 0, "SIGTERM to the server");
        let exited = eventually(Duration::from_secs(60), || c.try_wait().ok().flatten());
        match exited {
            Some(status) => status.success(),
            None => {
                let _ = c.kill();
                let _ = c.wait();
                false
            }
        }
    }

    /// Start the server again on the same data dir and port.
    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    pub fn kubectl_cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(kubectl_bin());
        cmd.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .env("HOME", self.home.path())
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null());
        cmd
    }

    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_cmd(args).output().expect("run kubectl")
    }

    /// kubectl that must succeed; returns stdout.
    pub fn k(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(
            out.status.success(),
            "kubectl {args:?} failed ({:?}):\nstdout: {stdout}\nstderr: {stderr}\nserver log tail:\n{}",
            out.status,
            tail(&self.log(), 40)
        );
        stdout
    }

    /// kubectl that must fail; returns stderr.
    pub fn k_err(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            !out.status.success(),
            "kubectl {args:?} unexpectedly succeeded: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8_lossy(&out.stderr).to_string()
    }

    /// kubectl apply -f - with this YAML.
    pub fn apply(&self, yaml: &str, extra: &[&str]) -> String {
        self.stdin_kubectl(&[&["apply", "-f", "-"], extra].concat(), yaml)
    }

    /// Runs kubectl with `input` on its stdin and returns what it printed and its exit status.
    pub fn kubectl_with_stdin(&self, args: &[&str], input: &str) -> std::process::Output {
        use std::io::Write;
        let mut child = self
            .kubectl_cmd(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input.as_bytes())
            .expect("write stdin");
        child.wait_with_output().expect("kubectl output")
    }

    pub fn stdin_kubectl(&self, args: &[&str], input: &str) -> String {
        let out = self.kubectl_with_stdin(args, input);
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "kubectl {args:?} failed:\nstdout: {stdout}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    /// kubectl reading `input` on stdin, which must fail; returns its stderr.
    pub fn stdin_kubectl_err(&self, args: &[&str], input: &str) -> String {
        let out = self.kubectl_with_stdin(args, input);
        assert!(
            !out.status.success(),
            "kubectl {args:?} unexpectedly succeeded: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8_lossy(&out.stderr).to_string()
    }

    /// Parsed `kubectl get ... -o json`.
    pub fn get_json(&self, args: &[&str]) -> serde_json::Value {
        let out = self.k(&[&["get"], args, &["-o", "json"]].concat());
        serde_json::from_str(&out).expect("kubectl json")
    }

    /// The messages of the events (in every namespace) that `selector` selects, one a line.
    pub fn event_messages(&self, selector: &str) -> String {
        self.k(&[
            "get",
            "events",
            "-A",
            "--field-selector",
            selector,
            "-o",
            "custom-columns=MSG:.message",
        ])
    }

    /// `(type, reason, message)` of the events (in every namespace) about an object.
    pub fn events(&self, kind: &str, name: &str) -> Vec<(String, String, String)> {
        let ev = self.get_json(&[
            "events",
            "-A",
            "--field-selector",
            &format!("involvedObject.kind={kind},involvedObject.name={name}"),
        ]);
        ev["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| {
                let s = |k: &str| e[k].as_str().unwrap_or_default().to_string();
                (s("type"), s("reason"), s("message"))
            })
            .collect()
    }

    /// Waits (30 s at most) for an event about the object with `reason` and exactly `message`.
    pub fn wait_event(&self, kind: &str, name: &str, reason: &str, message: &str) {
        self.wait_event_where(kind, name, reason, message, |m| m == message);
    }

    /// Waits (30 s at most) for an event about the object with `reason` and a message that
    /// contains `part`.
    pub fn wait_event_containing(&self, kind: &str, name: &str, reason: &str, part: &str) {
        self.wait_event_where(kind, name, reason, part, |m| m.contains(part));
    }

    fn wait_event_where(&self, kind: &str, name: &str, reason: &str, message: &str, matches: impl Fn(&str) -> bool) {
        let ok = eventually(Duration::from_secs(30), || {
            self.events(kind, name)
                .iter()
                .any(|(_, r, m)| r == reason && matches(m))
                .then_some(())
        });
        assert!(
            ok.is_some(),
            "no {reason} event {message:?} for {kind} {name}: {:?}\n{}",
            self.events(kind, name),
            tail(&self.log(), 30)
        );
    }

    /// `kubectl get ARGS -o json`, or None once the object is gone (any other error fails).
    pub fn get_opt(&self, args: &[&str]) -> Option<serde_json::Value> {
        let out = self.kubectl(&[&["get"], args, &["-o", "json"]].concat());
        if out.status.success() {
            return serde_json::from_slice(&out.stdout).ok();
        }
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("NotFound"), "kubectl get {args:?}: {err}");
        None
    }

    /// Waits for `kubectl get ARGS` to find nothing.
    pub fn wait_gone(&self, args: &[&str], timeout: Duration) {
        let gone = eventually(timeout, || self.get_opt(args).is_none().then_some(()));
        assert!(
            gone.is_some(),
            "{args:?} still there:\n{}\n{}",
            self.k(&[&["get"], args, &["-o", "yaml"]].concat()),
            tail(&self.log(), 40)
        );
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The bootstrap administrator's bearer token (the first line of `tokens.csv`).
    pub fn admin_token(&self) -> String {
        let text = std::fs::read_to_string(self.path().join("tokens.csv")).expect("tokens.csv");
        text.lines()
            .next()
            .and_then(|l| l.split(',').next())
            .expect("token")
            .to_string()
    }

    /// One request with curl as the administrator, sent as a program sends it (an agent of
    /// its own: upstream indents its answers for curl's); the answer's code and body.
    pub fn admin_curl(&self, method: &str, path: &str, content_type: &str, body: &[u8]) -> (u16, String) {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let body_file = self.path().join(format!("body-{}", N.fetch_add(1, Ordering::Relaxed)));
        std::fs::write(&body_file, body).expect("body file");
        let mut cmd = Command::new("curl");
        cmd.args([
            "-sk",
            "-A",
            "skiff-tests",
            "-X",
            method,
            "-w",
            "\n%{http_code}",
            "--max-time",
            "20",
        ])
        .arg("-H")
        .arg(format!("Authorization: Bearer {}", self.admin_token()))
        .arg("-H")
        .arg(format!("Content-Type: {content_type}"));
        if !body.is_empty() {
            cmd.arg("--data-binary").arg(format!("@{}", body_file.display()));
        }
        let out = cmd
            .arg(format!("https://127.0.0.1:{}{path}", self.port))
            .output()
            .expect("curl");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let (answer, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
        (code.trim().parse().unwrap_or(0), answer.to_string())
    }
}

/// The whitespace-split cells of `kubectl get` output: the header, then each row.
pub fn table(out: &str) -> Vec<Vec<String>> {
    out.lines()
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect()
}

/// An object's `metadata.finalizers`.
pub fn finalizers(v: &serde_json::Value) -> Vec<String> {
    v["metadata"]["finalizers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f.as_str().map(str::to_string))
        .collect()
}

/// Unmounts whatever is mounted under `dir` (the agent's subPath bind mounts of pods it had no time
/// to remove), deepest first, so removing the directory never reaches into a volume's data.
pub fn unmount_under(dir: &Path) {
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut points: Vec<String> = mountinfo
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4))
        .filter(|p| Path::new(p).starts_with(dir))
        .map(str::to_string)
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for point in points {
        let _ = Command::new("umount").args(["--lazy", &point]).status();
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.kill9();
        unmount_under(self.dir.path());
        // The agent leaves its proxy table and the range's local route (as kube-proxy leaves its
        // rules); a test cluster's go with it.
        if let Some(range) = &self.service_range {
            let _ = Command::new("nft")
                .args(["delete", "table", "ip", &proxy_table(range)])
                .stderr(Stdio::null())
                .status();
            let _ = Command::new("ip")
                .args(["route", "del", "local", range, "dev", "lo", "table", "local"])
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// A client the end-to-end tests drive besides the system kubectl (helm 3 and 4, kubectl 1.33 and
/// 1.37), installed by `scripts/client-tools.sh` into `$SKIFF_CLIENTS` (default
/// `/opt/skiff-clients`). A missing client fails the test: it is part of what the tests prove.
pub fn client_tool(name: &str) -> PathBuf {
    let dir = std::env::var("SKIFF_CLIENTS").unwrap_or_else(|_| "/opt/skiff-clients".to_string());
    let path = Path::new(&dir).join(name);
    assert!(
        path.is_file(),
        "{} is missing: run scripts/client-tools.sh (scripts/install-deps.sh runs it)",
        path.display()
    );
    path
}

impl Cluster {
    /// A client program pointed at this cluster (`KUBECONFIG`) with the test's HOME.
    pub fn client_cmd(&self, program: &Path, args: &[&str]) -> Command {
        let mut cmd = Command::new(program);
        cmd.args(args)
            .env("HOME", self.home.path())
            .env("KUBECONFIG", &self.kubeconfig)
            .stdin(Stdio::null());
        cmd
    }

    /// Runs a client program; returns its stdout, stderr and whether it succeeded.
    pub fn client(&self, program: &Path, args: &[&str]) -> (String, String, bool) {
        let out = self.client_cmd(program, args).output().expect("run client");
        (
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
            out.status.success(),
        )
    }

    /// A client program that must succeed; returns its stdout.
    pub fn client_ok(&self, program: &Path, args: &[&str]) -> String {
        let (stdout, stderr, ok) = self.client(program, args);
        assert!(
            ok,
            "{} {args:?} failed:\nstdout: {stdout}\nstderr: {stderr}\nserver log tail:\n{}",
            program.display(),
            tail(&self.log(), 40)
        );
        stdout
    }
}

impl Cluster {
    /// A kube-rs client from this cluster's kubeconfig.
    pub async fn kube_client(&self) -> kube::Client {
        let kc = kube::config::Kubeconfig::read_from(&self.kubeconfig).expect("kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .expect("config");
        kube::Client::try_from(config).expect("client")
    }

    /// Runs a Python script with the `kubernetes` client (its first argument is this cluster's
    /// kubeconfig); it must exit 0.
    pub fn python(&self, script: &str) {
        let out = Command::new("python3")
            .arg("-c")
            .arg(script)
            .arg(&self.kubeconfig)
            .env("HOME", self.home.path())
            .output()
            .expect("python3 with the kubernetes client (scripts/install-deps.sh installs it)");
        assert!(
            out.status.success(),
            "python client failed:\n{}\n{}\nserver log tail:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            tail(&self.log(), 30)
        );
    }
}

pub fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Poll `f` until it returns Some or the timeout passes.
pub fn eventually<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A `kubectl port-forward` running in the background, its output collected; killed when dropped.
pub struct PortForward {
    child: std::process::Child,
    stdout: std::sync::Arc<std::sync::Mutex<String>>,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl PortForward {
    pub fn start(c: &Cluster, args: &[&str]) -> PortForward {
        use std::io::Read;
        let mut child = c
            .kubectl_cmd(&[&["port-forward"], args].concat())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start kubectl port-forward");
        let collect = |mut pipe: Box<dyn Read + Send>| {
            let buf = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
            let out = buf.clone();
            std::thread::spawn(move || {
                let mut chunk = [0u8; 4096];
                while let Ok(n) = pipe.read(&mut chunk) {
                    if n == 0 {
                        break;
                    }
                    if let Ok(mut b) = out.lock() {
                        b.push_str(&String::from_utf8_lossy(&chunk[..n]));
                    }
                }
            });
            buf
        };
        let stdout = collect(Box::new(child.stdout.take().expect("stdout")));
        let stderr = collect(Box::new(child.stderr.take().expect("stderr")));
        PortForward { child, stdout, stderr }
    }

    pub fn stdout(&self) -> String {
        self.stdout.lock().map(|s| s.clone()).unwrap_or_default()
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().map(|s| s.clone()).unwrap_or_default()
    }

    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for PortForward {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.0 GET through a local port: the whole response, or what the connection gave before it
/// closed.
pub fn http_get(port: u16, path: &str) -> String {
    try_http_get(port, path).expect("connect to the forwarded port")
}

/// [`http_get`] for a port that may not be listening yet: the connection's error instead of a panic.
pub fn try_http_get(port: u16, path: &str) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let mut tcp = std::net::TcpStream::connect(("127.0.0.1", port))?;
    tcp.set_read_timeout(Some(Duration::from_secs(20)))?;
    tcp.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())?;
    let mut response = Vec::new();
    let _ = tcp.read_to_end(&mut response);
    Ok(String::from_utf8_lossy(&response).into_owned())
}
