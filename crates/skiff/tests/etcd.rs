//! `skiff server --etcd-servers`: the cluster's objects in a real 3-member etcd, driven by the
//! real kubectl; a restart keeps everything; `/readyz` follows etcd.

#![cfg(test)]

mod common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::Duration;

use common::{Cluster, eventually};
use skiff_testkit::EtcdCluster;

fn etcd_args(etcd: &EtcdCluster, prefix: &str) -> Vec<String> {
    vec![
        "--no-agent".into(),
        "--no-scheduler".into(),
        "--etcd-servers".into(),
        etcd.endpoints_arg(),
        "--etcd-prefix".into(),
        prefix.into(),
    ]
}

fn start(etcd: &EtcdCluster, prefix: &str) -> Cluster {
    let args = etcd_args(etcd, prefix);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Cluster::start(&args)
}

#[test]
fn kubectl_on_an_etcd_backed_server() {
    let mut etcd = EtcdCluster::start(3);
    let mut c = start(&etcd, "/skiff-e2e");
    c.k(&["create", "namespace", "team"]);
    // A watch opened before the writes sees them.
    let mut watch = c
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
    for i in 0..5 {
        c.k(&[
            "create",
            "configmap",
            &format!("cm{i}"),
            "-n",
            "team",
            &format!("--from-literal=k=v{i}"),
        ]);
    }
    let mut seen = Vec::new();
    while seen.len() < 5 {
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the watch delivers the creates");
        // The namespace's root CA ConfigMap comes from a controller.
        if line.starts_with("configmap/cm") {
            seen.push(line);
        }
    }
    let _ = watch.kill();
    let _ = watch.wait();
    assert_eq!(seen, (0..5).map(|i| format!("configmap/cm{i}")).collect::<Vec<_>>());
    let listed = c.k(&["get", "configmaps", "-n", "team", "-o", "name"]);
    for i in 0..5 {
        assert!(listed.contains(&format!("configmap/cm{i}")), "{listed}");
    }
    // Stored under the prefix with upstream's key layout.
    let keys = etcd.etcdctl(&["get", "--prefix", "--keys-only", "/skiff-e2e/configmaps/team/cm"]);
    assert_eq!(keys.lines().filter(|l| !l.is_empty()).count(), 5, "{keys}");
    let verbose = c.k(&["get", "--raw", "/readyz?verbose"]);
    assert!(verbose.contains("[+]etcd ok"), "{verbose}");

    // A restart keeps everything (nothing of it is in the data dir's SQLite).
    c.restart();
    assert_eq!(
        c.k(&["get", "configmap", "cm3", "-n", "team", "-o", "jsonpath={.data.k}"]),
        "v3"
    );
    assert!(!c.path().join("state.db").exists());
    c.k(&["delete", "configmap", "cm0", "-n", "team"]);
    assert!(c.k_err(&["get", "configmap", "cm0", "-n", "team"]).contains("NotFound"));

    // etcd gone: /readyz and /livez fail with upstream's line; back: ready again.
    etcd.stop_all();
    for check in ["/readyz", "/livez"] {
        let out = eventually(Duration::from_secs(20), || {
            let out = c.kubectl(&["--request-timeout", "15s", "get", "--raw", &format!("{check}?verbose")]);
            (!out.status.success()).then_some(out)
        })
        .unwrap_or_else(|| panic!("{check} stays ok without etcd"));
        let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        assert!(text.contains("etcd failed: reason withheld"), "{check}: {text}");
    }
    etcd.start_all();
    c.wait_ready();
    assert_eq!(
        c.k(&["get", "configmap", "cm4", "-n", "team", "-o", "jsonpath={.data.k}"]),
        "v4"
    );
}

/// A prefix holding someone else's keys: the server refuses to start and says why.
#[test]
fn refuses_a_foreign_prefix() {
    let etcd = EtcdCluster::start(1);
    etcd.etcdctl(&["put", "/theirs/pods/default/x", "{}"]);
    let dir = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(common::skiff_bin())
        .args(["server", "--no-agent", "--no-scheduler", "--no-controllers"])
        .arg("--data-dir")
        .arg(dir.path())
        .args(["--port", &common::free_port().to_string()])
        .args(["--etcd-servers", &etcd.endpoints_arg(), "--etcd-prefix", "/theirs"])
        .env("HOME", home.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("refusing to use it"), "{err}");
    assert_eq!(
        etcd.etcdctl(&["get", "--prefix", "--keys-only", "/theirs"]).trim(),
        "/theirs/pods/default/x"
    );
}

/// Kills the server and unmounts the tmpfs when the test ends, however it ends.
struct TinyDisk {
    dir: tempfile::TempDir,
    server: Option<std::process::Child>,
}

impl Drop for TinyDisk {
    fn drop(&mut self) {
        if let Some(mut s) = self.server.take() {
            let _ = s.kill();
            let _ = s.wait();
        }
        let _ = std::process::Command::new("umount").arg(self.dir.path()).status();
    }
}

/// The SQLite store's check commits for real: on a full disk `/readyz` fails with upstream's
/// `[-]etcd failed` line, and passes again once there is room.
#[test]
fn readyz_fails_when_the_sqlite_disk_is_full() {
    let mut disk = TinyDisk {
        dir: tempfile::tempdir().unwrap(),
        server: None,
    };
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=48m", "tmpfs"])
        .arg(disk.dir.path())
        .status()
        .unwrap();
    assert!(mounted.success(), "mount a tmpfs (needs root)");
    let data = disk.dir.path().join("data");
    let home = tempfile::tempdir().unwrap();
    let port = common::free_port();
    disk.server = Some(
        std::process::Command::new(common::skiff_bin())
            .args(["server", "--no-agent", "--no-scheduler", "--no-controllers"])
            .arg("--data-dir")
            .arg(&data)
            .args(["--port", &port.to_string()])
            .env("HOME", home.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let kubeconfig = data.join("kubeconfig");
    let readyz = || {
        std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["--request-timeout", "15s", "get", "--raw", "/readyz?verbose"])
            .env("HOME", home.path())
            .output()
            .unwrap()
    };
    eventually(Duration::from_secs(30), || {
        (kubeconfig.exists() && readyz().status.success()).then_some(())
    })
    .expect("the server becomes ready");
    // Fill the disk.
    let filler = disk.dir.path().join("filler");
    let _ = std::process::Command::new("dd")
        .args(["if=/dev/zero", "bs=1M"])
        .arg(format!("of={}", filler.display()))
        .stderr(Stdio::null())
        .status();
    let out = readyz();
    assert!(!out.status.success(), "ready on a full disk");
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("etcd failed: reason withheld"), "{text}");
    std::fs::remove_file(&filler).unwrap();
    let out = readyz();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("[+]etcd ok"));
}

struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A second API server on the same prefix, given a copy of the first one's data dir (the same
/// CA, service-account and encryption keys): a write through either is read through the other.
#[test]
fn two_servers_share_one_prefix() {
    let etcd = EtcdCluster::start(3);
    let c = start(&etcd, "/registry");
    let dir2 = tempfile::tempdir().unwrap();
    let copied = std::process::Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", c.path().display()))
        .arg(dir2.path())
        .status()
        .unwrap();
    assert!(copied.success());
    let kubeconfig2 = dir2.path().join("kubeconfig");
    std::fs::remove_file(&kubeconfig2).unwrap();
    let home2 = tempfile::tempdir().unwrap();
    let log2 = std::fs::File::create(dir2.path().join("server.log")).unwrap();
    let _server2 = Server(
        std::process::Command::new(common::skiff_bin())
            .args(["server", "--no-agent", "--no-scheduler", "--no-controllers"])
            .arg("--data-dir")
            .arg(dir2.path())
            .args(["--port", &common::free_port().to_string()])
            .args(["--etcd-servers", &etcd.endpoints_arg(), "--etcd-prefix", "/registry"])
            .env("HOME", home2.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log2)
            .spawn()
            .unwrap(),
    );
    let k2 = |args: &[&str]| {
        std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kubeconfig2)
            .args(args)
            .env("HOME", home2.path())
            .output()
            .unwrap()
    };
    eventually(Duration::from_secs(30), || {
        (kubeconfig2.exists() && k2(&["get", "--raw", "/readyz"]).status.success()).then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "the second server never became ready:\n{}",
            std::fs::read_to_string(dir2.path().join("server.log")).unwrap_or_default()
        )
    });
    for i in 0..10 {
        let name = format!("shared{i}");
        if i % 2 == 0 {
            c.k(&["create", "configmap", &name, "--from-literal=k=v"]);
            let out = k2(&["get", "configmap", &name, "-o", "jsonpath={.data.k}"]);
            assert_eq!(
                String::from_utf8_lossy(&out.stdout),
                "v",
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        } else {
            let out = k2(&["create", "configmap", &name, "--from-literal=k=w"]);
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            assert_eq!(c.k(&["get", "configmap", &name, "-o", "jsonpath={.data.k}"]), "w");
        }
    }
    let out = k2(&["get", "configmaps", "-o", "name"]);
    let listed = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        listed.lines().filter(|l| l.starts_with("configmap/shared")).count(),
        10,
        "{listed}"
    );
}
