//! Fixtures for Skiff's tests, used only as a dev-dependency: a real etcd cluster of one or
//! more members on loopback ports, with temporary data directories, that tests can kill -9
//! and restart member by member. Everything is killed and removed when the fixture drops.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod history;

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The etcd binary (`SKIFF_TEST_ETCD` overrides).
pub fn etcd_binary() -> String {
    std::env::var("SKIFF_TEST_ETCD").unwrap_or_else(|_| "/usr/bin/etcd".into())
}

/// The etcdctl binary (`SKIFF_TEST_ETCDCTL` overrides).
pub fn etcdctl_binary() -> String {
    std::env::var("SKIFF_TEST_ETCDCTL").unwrap_or_else(|_| "/usr/bin/etcdctl".into())
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
}

/// A running etcd cluster on 127.0.0.1.
pub struct EtcdCluster {
    dir: tempfile::TempDir,
    members: Vec<Member>,
    initial_cluster: String,
    token: String,
}

impl EtcdCluster {
    /// Starts `n` members and waits until the cluster serves requests.
    pub fn start(n: usize) -> EtcdCluster {
        assert!(n >= 1);
        let dir = tempfile::Builder::new().prefix("skiff-etcd-").tempdir().unwrap();
        let members: Vec<Member> = (0..n)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: free_port(),
                peer_port: free_port(),
                child: None,
            })
            .collect();
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let token = dir
            .path()
            .file_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "skiff-test".into());
        let mut cluster = EtcdCluster {
            dir,
            members,
            initial_cluster,
            token,
        };
        for i in 0..n {
            cluster.spawn(i);
        }
        cluster.wait_healthy(Duration::from_secs(60));
        cluster
    }

    fn spawn(&mut self, i: usize) {
        let data = self.dir.path().join(&self.members[i].name);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("{}.log", self.members[i].name)))
            .unwrap();
        let m = &self.members[i];
        let client = format!("http://127.0.0.1:{}", m.client_port);
        let peer = format!("http://127.0.0.1:{}", m.peer_port);
        let child = Command::new(etcd_binary())
            .arg("--name")
            .arg(&m.name)
            .arg("--data-dir")
            .arg(&data)
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &self.initial_cluster])
            .args(["--initial-cluster-state", "new", "--initial-cluster-token", &self.token])
            .args(["--logger", "zap", "--log-level", "warn"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start etcd (apt-get install etcd-server)");
        self.members[i].child = Some(child);
    }

    /// The client URL of every member.
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.members.len()).map(|i| self.endpoint(i)).collect()
    }

    pub fn endpoint(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.members[i].client_port)
    }

    /// `--etcd-servers` style: the endpoints joined by commas.
    pub fn endpoints_arg(&self) -> String {
        self.endpoints().join(",")
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    fn running(&self) -> Vec<usize> {
        (0..self.members.len())
            .filter(|&i| self.members[i].child.is_some())
            .collect()
    }

    /// Waits until every running member answers a health check.
    pub fn wait_healthy(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let eps: Vec<String> = self.running().iter().map(|&i| self.endpoint(i)).collect();
            let ok = Command::new(etcdctl_binary())
                .env("ETCDCTL_API", "3")
                .args([
                    "--endpoints",
                    &eps.join(","),
                    "--command-timeout=2s",
                    "endpoint",
                    "health",
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if ok {
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "etcd did not become healthy; logs in {}:\n{}",
                    self.dir.path().display(),
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Every member's log (for failure messages).
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for m in &self.members {
            let path = self.dir.path().join(format!("{}.log", m.name));
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(20).collect();
            out.push_str(&format!("--- {}\n", m.name));
            for line in tail.into_iter().rev() {
                out.push_str(line);
                out.push('\n');
            }
        }
        out
    }

    /// The index of the current leader (asked of the running members).
    pub fn leader(&self) -> usize {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            for i in self.running() {
                let out = Command::new(etcdctl_binary())
                    .env("ETCDCTL_API", "3")
                    .args(["--endpoints", &self.endpoint(i), "--command-timeout=2s"])
                    .args(["endpoint", "status", "-w", "json"])
                    .output();
                let Ok(out) = out else { continue };
                let Ok(v) = serde_json::from_slice::<serde_json::Value>(&out.stdout) else {
                    continue;
                };
                let status = &v[0]["Status"];
                let (Some(leader), Some(me)) = (status["leader"].as_u64(), status["header"]["member_id"].as_u64())
                else {
                    continue;
                };
                if leader != 0 && leader == me {
                    return i;
                }
            }
            assert!(Instant::now() < deadline, "no etcd leader");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGKILLs member `i` and reaps it.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts member `i` again on its data directory.
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        self.spawn(i);
    }

    /// Kills every member (the data stays until the fixture drops).
    pub fn stop_all(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }

    /// Starts every stopped member and waits for the cluster.
    pub fn start_all(&mut self) {
        for i in 0..self.members.len() {
            if self.members[i].child.is_none() {
                self.spawn(i);
            }
        }
        self.wait_healthy(Duration::from_secs(60));
    }

    /// Runs etcdctl against the cluster and returns its stdout.
    pub fn etcdctl(&self, args: &[&str]) -> String {
        let eps: Vec<String> = self.running().iter().map(|&i| self.endpoint(i)).collect();
        let out = Command::new(etcdctl_binary())
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &eps.join(",")])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "etcdctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().to_owned()
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        self.stop_all();
    }
}
