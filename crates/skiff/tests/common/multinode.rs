//! A cluster of several real nodes on this machine (`skiff cluster create`): each node a network
//! namespace with its own engine and agent, the control plane on the first. A fresh HOME keeps
//! it apart from any other; dropping it runs `skiff cluster delete`, also when a test fails.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use super::skiff_bin;

pub struct MultiNode {
    pub home: tempfile::TempDir,
    pub name: String,
    pub kubeconfig: PathBuf,
    /// The cluster's record (`cluster.json`): its index, nodes and paths.
    pub state: serde_json::Value,
    /// How long `skiff cluster create` took.
    pub created_in: Duration,
    /// What `skiff cluster create` logged (its progress lines).
    pub create_log: String,
}

impl MultiNode {
    /// `skiff cluster create --nodes N` with extra `--server-arg`s and `--agent-arg`s.
    pub fn create(nodes: u8, server_args: &[&str], agent_args: &[&str]) -> MultiNode {
        let home = tempfile::tempdir().expect("home");
        let name = "e2e".to_string();
        let mut cmd = Command::new(skiff_bin());
        cmd.args(["cluster", "create", "--name", &name, "--nodes", &nodes.to_string()])
            .env("HOME", home.path());
        for a in server_args {
            cmd.arg(format!("--server-arg={a}"));
        }
        for a in agent_args {
            cmd.arg(format!("--agent-arg={a}"));
        }
        let dir = home.path().join(".skiff/clusters").join(&name);
        let started = Instant::now();
        let out = cmd.output().expect("skiff cluster create");
        let created_in = started.elapsed();
        let mut m = MultiNode {
            kubeconfig: dir.join("kubeconfig"),
            state: serde_json::Value::Null,
            home,
            name,
            created_in,
            create_log: String::from_utf8_lossy(&out.stderr).into_owned(),
        };
        assert!(
            out.status.success(),
            "skiff cluster create failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let text = std::fs::read_to_string(dir.join("cluster.json")).expect("cluster.json");
        m.state = serde_json::from_str(&text).expect("cluster.json is JSON");
        m
    }

    pub fn index(&self) -> u64 {
        self.state["index"].as_u64().expect("index")
    }

    /// The node names, control plane first.
    pub fn nodes(&self) -> Vec<String> {
        self.state["nodes"]
            .as_array()
            .expect("nodes")
            .iter()
            .map(|n| n["name"].as_str().expect("name").to_string())
            .collect()
    }

    /// `unix://...`: the engine of node `i` (1-based).
    pub fn docker_host(&self, i: usize) -> String {
        format!("unix:///run/skiff/clusters/skiff{}/{i}/docker.sock", self.index())
    }

    /// `docker ARGS` against node `i`'s engine.
    pub fn docker(&self, i: usize, args: &[&str]) -> String {
        let out = Command::new("docker")
            .arg("--host")
            .arg(self.docker_host(i))
            .args(args)
            .output()
            .expect("docker");
        assert!(
            out.status.success(),
            "docker {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn skiff(&self, args: &[&str]) -> Output {
        Command::new(skiff_bin())
            .args(args)
            .env("HOME", self.home.path())
            .output()
            .expect("skiff")
    }

    /// `skiff cluster ARGS --name NAME`, which must succeed.
    pub fn cluster(&self, args: &[&str]) -> String {
        let out = self.skiff(&[&["cluster"], args, &["--name", &self.name]].concat());
        assert!(
            out.status.success(),
            "skiff cluster {args:?}:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `skiff cluster list`.
    pub fn list(&self) -> String {
        let out = self.skiff(&["cluster", "list"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn kubectl(&self, args: &[&str]) -> Output {
        Command::new("/usr/bin/kubectl")
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HOME", self.home.path())
            .output()
            .expect("kubectl")
    }

    /// kubectl, which must succeed; its standard output.
    pub fn k(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn apply(&self, yaml: &str) {
        use std::io::Write;
        let mut child = Command::new("/usr/bin/kubectl")
            .args(["apply", "-f", "-"])
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HOME", self.home.path())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("kubectl apply");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(yaml.as_bytes())
            .expect("write yaml");
        let out = child.wait_with_output().expect("kubectl apply");
        assert!(
            out.status.success(),
            "kubectl apply: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A node agent's (or the control plane's) log.
    pub fn log(&self, node: &str) -> String {
        let path = self
            .home
            .path()
            .join(".skiff/clusters")
            .join(&self.name)
            .join("nodes")
            .join(node)
            .join("skiff.log");
        std::fs::read_to_string(path).unwrap_or_default()
    }

    /// Everything of the cluster still on this machine: processes in its cgroups, network
    /// namespaces, the host's interface and route, mounts, files. Empty once deleted.
    pub fn leftovers(&self) -> Vec<String> {
        leftovers(self.index(), &self.home.path().join(".skiff/clusters").join(&self.name))
    }
}

/// What of cluster `index` (whose directory is `dir`) is still on this machine.
pub fn leftovers(index: u64, dir: &std::path::Path) -> Vec<String> {
    let tag = format!("skiff{index}");
    let mut out = Vec::new();
    let netns = Command::new("ip").args(["netns", "list"]).output().expect("ip netns");
    for line in String::from_utf8_lossy(&netns.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        if name == tag || name.starts_with(&format!("{tag}-")) {
            out.push(format!("netns {name}"));
        }
    }
    if std::path::Path::new("/sys/class/net").join(&tag).exists() {
        out.push(format!("interface {tag}"));
    }
    let routes = Command::new("ip").args(["-4", "route"]).output().expect("ip route");
    for line in String::from_utf8_lossy(&routes.stdout).lines() {
        if line.starts_with(&format!("172.29.{index}.")) {
            out.push(format!("route {line}"));
        }
    }
    let run_dir = format!("/run/skiff/clusters/{tag}");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for line in mounts.lines() {
        let point = line.split_whitespace().nth(4).unwrap_or("");
        if point.starts_with(&run_dir) || point.starts_with(&*dir.to_string_lossy()) {
            out.push(format!("mount {point}"));
        }
    }
    let hierarchies = std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path());
    for root in hierarchies.chain([std::path::PathBuf::from("/sys/fs/cgroup")]) {
        let p = root.join("skiff-clusters").join(&tag);
        if p.exists() {
            out.push(format!("cgroup {}", p.display()));
        }
    }
    for p in [std::path::PathBuf::from(&run_dir), dir.to_path_buf()] {
        if p.exists() {
            out.push(format!("directory {}", p.display()));
        }
    }
    // Any process whose command line names the cluster's paths.
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(&run_dir) || cmdline.contains(&*dir.to_string_lossy()) {
            out.push(format!("process {}: {cmdline}", entry.file_name().to_string_lossy()));
        }
    }
    out
}

impl Drop for MultiNode {
    fn drop(&mut self) {
        let out = self.skiff(&["cluster", "delete", "--name", &self.name]);
        if !out.status.success() {
            eprintln!("skiff cluster delete: {}", String::from_utf8_lossy(&out.stderr));
        }
    }
}
