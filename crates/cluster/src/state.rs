//! What a cluster is made of, recorded in `DIR/NAME/cluster.json` as soon as its network is
//! allocated, so that `delete` finds everything even after a creation that failed half-way.
//! Every other name (network namespaces, interfaces, cgroups, sockets) is derived from it.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

/// The /16 the clusters' own networks are cut from, one /24 per cluster.
pub const CLUSTER_NETWORKS: [u8; 2] = [172, 29];
/// The /16 the nodes' pod bridges are cut from, one /24 per node (private to the node's
/// namespace, so clusters reuse them).
pub const POD_BRIDGES: [u8; 2] = [172, 30];
/// The host's own address on a cluster's network (nodes have `.1` up to `.253`).
pub const HOST_OCTET: u8 = 254;
/// Where the engines' runtime state lives: sockets must fit in 108 bytes, which a data dir under
/// a temporary HOME need not.
pub const RUNTIME_ROOT: &str = "/run/skiff/clusters";
/// Where nodes' cgroups are made, under each cgroup hierarchy.
pub const CGROUP_ROOT: &str = "skiff-clusters";
/// The port of the API server, on the first node's own address.
pub const API_PORT: u16 = 6443;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ClusterState {
    pub name: String,
    /// The cluster's /24 is `172.29.INDEX.0/24`; also names its namespaces and interfaces.
    pub index: u8,
    pub nodes: Vec<NodeState>,
    /// Extra flags of the first node's `skiff server`.
    #[serde(default)]
    pub server_args: Vec<String>,
    /// Extra flags of every node's agent (the first node's `skiff server` included).
    #[serde(default)]
    pub agent_args: Vec<String>,
    /// The binary the nodes run.
    pub skiff: PathBuf,
    /// The cluster's directory (`DIR/NAME`).
    #[serde(skip)]
    pub dir: PathBuf,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NodeState {
    /// The Node's name and its hostname.
    pub name: String,
    /// 1 for the control plane, then 2, 3, ...
    pub index: u8,
}

impl ClusterState {
    /// `skiffINDEX`: the host's interface on the cluster's network and the namespace of the
    /// switch (the bridge every node is plugged into).
    pub fn tag(&self) -> String {
        tag(self.index)
    }

    pub fn state_file(&self) -> PathBuf {
        self.dir.join("cluster.json")
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }

    pub fn host_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(CLUSTER_NETWORKS[0], CLUSTER_NETWORKS[1], self.index, HOST_OCTET)
    }

    pub fn subnet(&self) -> String {
        format!("{}.{}.{}.0/24", CLUSTER_NETWORKS[0], CLUSTER_NETWORKS[1], self.index)
    }

    pub fn control_plane(&self) -> anyhow::Result<&NodeState> {
        self.nodes.first().context("the cluster has no nodes")
    }

    /// The API server's URL, reachable from the host and every node.
    pub fn server_url(&self) -> anyhow::Result<String> {
        Ok(format!("https://{}:{API_PORT}", self.node_ip(self.control_plane()?)))
    }

    pub fn node(&self, name: &str) -> anyhow::Result<&NodeState> {
        self.nodes.iter().find(|n| n.name == name).with_context(|| {
            let names: Vec<&str> = self.nodes.iter().map(|n| n.name.as_str()).collect();
            format!(
                "cluster {:?} has no node {name:?} (its nodes: {})",
                self.name,
                names.join(", ")
            )
        })
    }

    pub fn node_ip(&self, node: &NodeState) -> Ipv4Addr {
        Ipv4Addr::new(CLUSTER_NETWORKS[0], CLUSTER_NETWORKS[1], self.index, node.index)
    }

    /// The node's network namespace (`/run/netns/skiffINDEX-N`).
    pub fn netns(&self, node: &NodeState) -> String {
        format!("{}-{}", self.tag(), node.index)
    }

    pub fn node_dir(&self, node: &NodeState) -> PathBuf {
        self.dir.join("nodes").join(&node.name)
    }

    /// The engine's data root (images, containers).
    pub fn data_root(&self, node: &NodeState) -> PathBuf {
        self.node_dir(node).join("docker")
    }

    /// The data dir of the node's `skiff server` or `skiff agent`.
    pub fn skiff_dir(&self, node: &NodeState) -> PathBuf {
        self.node_dir(node).join("skiff")
    }

    pub fn runtime_dir(&self) -> PathBuf {
        Path::new(RUNTIME_ROOT).join(self.tag())
    }

    /// The engine's exec root, socket and pid file.
    pub fn node_runtime_dir(&self, node: &NodeState) -> PathBuf {
        self.runtime_dir().join(node.index.to_string())
    }

    pub fn docker_socket(&self, node: &NodeState) -> PathBuf {
        self.node_runtime_dir(node).join("docker.sock")
    }

    /// `unix://SOCKET`, the node engine's `DOCKER_HOST`.
    pub fn docker_host(&self, node: &NodeState) -> String {
        format!("unix://{}", self.docker_socket(node).display())
    }

    /// The cgroup (relative to a hierarchy's root) holding every process of the node: its agent,
    /// its engine and the engine's containers.
    pub fn cgroup(&self, node: &NodeState) -> PathBuf {
        self.cluster_cgroup().join(node.index.to_string())
    }

    pub fn cluster_cgroup(&self) -> PathBuf {
        Path::new(CGROUP_ROOT).join(self.tag())
    }

    /// The node's pod bridge (`cbr0`) address: `172.30.N.1/24`.
    pub fn pod_bridge(&self, node: &NodeState) -> String {
        format!("{}.{}.{}.1/24", POD_BRIDGES[0], POD_BRIDGES[1], node.index)
    }

    pub fn save(&self) -> anyhow::Result<()> {
        std::fs::create_dir_all(&self.dir).with_context(|| format!("creating {}", self.dir.display()))?;
        let text = serde_json::to_string_pretty(self).context("encoding the cluster's state")?;
        let tmp = self.dir.join("cluster.json.tmp");
        std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, self.state_file()).with_context(|| format!("writing {}", self.state_file().display()))
    }

    /// The cluster recorded in `dir`, if any.
    pub fn load(dir: &Path) -> anyhow::Result<Option<ClusterState>> {
        let path = dir.join("cluster.json");
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        let mut state: ClusterState =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        state.dir = dir.to_path_buf();
        Ok(Some(state))
    }
}

pub fn tag(index: u8) -> String {
    format!("skiff{index}")
}

/// Node names as kind gives them: `NAME-control-plane`, `NAME-worker`, `NAME-worker2`, ...
pub fn node_names(cluster: &str, nodes: u8) -> Vec<NodeState> {
    (1..=nodes)
        .map(|index| NodeState {
            name: match index {
                1 => format!("{cluster}-control-plane"),
                2 => format!("{cluster}-worker"),
                n => format!("{cluster}-worker{}", n - 1),
            },
            index,
        })
        .collect()
}

/// A cluster's name: a DNS label short enough that its nodes' names are hostnames (64 bytes).
pub fn validate_name(name: &str) -> anyhow::Result<()> {
    let ok_chars = name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    let ok_ends = !name.starts_with('-') && !name.ends_with('-');
    anyhow::ensure!(
        !name.is_empty() && name.len() <= 40 && ok_chars && ok_ends,
        "invalid cluster name {name:?}: lowercase letters, digits and '-', starting and ending \
         with a letter or digit, at most 40 characters"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(nodes: u8) -> ClusterState {
        ClusterState {
            name: "dev".into(),
            index: 7,
            nodes: node_names("dev", nodes),
            server_args: vec![],
            agent_args: vec![],
            skiff: "/bin/skiff".into(),
            dir: "/home/u/.skiff/clusters/dev".into(),
        }
    }

    #[test]
    fn nodes_are_named_as_kind_names_them() {
        let names: Vec<String> = node_names("dev", 4).into_iter().map(|n| n.name).collect();
        assert_eq!(names, ["dev-control-plane", "dev-worker", "dev-worker2", "dev-worker3"]);
    }

    #[test]
    fn addresses_and_names_derive_from_the_index() {
        let c = cluster(3);
        let n3 = &c.nodes[2];
        assert_eq!(c.node_ip(n3).to_string(), "172.29.7.3");
        assert_eq!(c.host_ip().to_string(), "172.29.7.254");
        assert_eq!(c.server_url().unwrap(), "https://172.29.7.1:6443");
        assert_eq!(c.netns(n3), "skiff7-3");
        assert_eq!(c.pod_bridge(n3), "172.30.3.1/24");
        assert_eq!(c.docker_host(n3), "unix:///run/skiff/clusters/skiff7/3/docker.sock");
        assert_eq!(c.cgroup(n3), Path::new("skiff-clusters/skiff7/3"));
        // Interface names are at most 15 bytes.
        assert!(tag(255).len() <= 15);
    }

    #[test]
    fn unknown_nodes_are_named_in_the_error() {
        let err = cluster(2).node("dev-worker9").unwrap_err().to_string();
        assert!(err.contains("dev-control-plane, dev-worker"), "{err}");
    }

    #[test]
    fn names_are_dns_labels() {
        for ok in ["skiff", "a", "e2e-42", &"x".repeat(40)] {
            assert!(validate_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", &"x".repeat(41)] {
            assert!(validate_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn state_survives_a_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = cluster(2);
        c.dir = dir.path().join("dev");
        c.save().unwrap();
        let back = ClusterState::load(&c.dir).unwrap().unwrap();
        assert_eq!(back.index, 7);
        assert_eq!(back.nodes.len(), 2);
        assert_eq!(back.dir, c.dir);
        assert!(ClusterState::load(&dir.path().join("none")).unwrap().is_none());
    }
}
