//! `skiff cluster`: a whole cluster on one machine, as kind makes one, but with each node in a
//! network namespace of its own rather than in a privileged container.
//!
//! A node is a network namespace (its own addresses, routes, nftables tables and pod bridge),
//! processes started in it with a hostname of their own (`process`), a `dockerd` of its own
//! (`engine`) and `skiff server` (the first node: the control plane and its own node) or
//! `skiff agent` (the others). The namespaces are joined by a bridge of the cluster's own, on a
//! /24 of 172.29.0.0/16 no other cluster on the machine has (`network`). What a cluster is made of
//! is recorded in `DIR/NAME/cluster.json` (`state`); `DIR` is `~/.skiff/clusters` by default.
//!
//! Invariant: `delete` leaves nothing of the cluster on the machine (no process, mount, cgroup,
//! namespace, interface, route or file), whatever state creation or a node stopped left it in,
//! and running it again changes nothing.

pub mod engine;
pub mod network;
pub mod process;
pub mod state;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use k8s_openapi::api::core::v1::Node;
use skiff_agent::progress::Progress;

pub use state::{ClusterState, NodeState};

/// What `skiff cluster create` makes.
#[derive(Clone, Debug)]
pub struct CreateOptions {
    pub name: String,
    pub nodes: u8,
    /// Extra flags of the first node's `skiff server`.
    pub server_args: Vec<String>,
    /// Extra flags of every node's agent (the first node's server included).
    pub agent_args: Vec<String>,
    /// Images copied from the host's engine into every node's.
    pub images: Vec<String>,
    /// The binary the nodes run (this one).
    pub skiff: PathBuf,
    /// How long to wait for every Node to be Ready.
    pub timeout: Duration,
}

/// `~/.skiff/clusters`.
pub fn default_dir() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."))
        .join(".skiff")
        .join("clusters")
}

/// Creates the cluster and returns once every Node is Ready; on failure removes what it made.
pub async fn create(root: &Path, opts: CreateOptions) -> anyhow::Result<ClusterState> {
    state::validate_name(&opts.name)?;
    anyhow::ensure!(
        (1..=100).contains(&opts.nodes),
        "a cluster has 1 to 100 nodes, not {}",
        opts.nodes
    );
    let dir = root.join(&opts.name);
    if ClusterState::load(&dir)?.is_some() {
        anyhow::bail!(
            "cluster {:?} already exists ({}); delete it first with `skiff cluster delete --name {}`",
            opts.name,
            dir.display(),
            opts.name
        );
    }
    let index = network::allocate().await?;
    let c = ClusterState {
        name: opts.name.clone(),
        index,
        nodes: state::node_names(&opts.name, opts.nodes),
        server_args: opts.server_args.clone(),
        agent_args: opts.agent_args.clone(),
        skiff: opts.skiff.clone(),
        dir,
    };
    if let Err(e) = c.save() {
        let _ = network::remove(&c).await;
        return Err(e);
    }
    match build(&c, &opts).await {
        Ok(()) => Ok(c),
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), cluster = %c.name, "creating the cluster failed; removing it");
            if let Err(d) = delete_cluster(&c).await {
                tracing::error!(error = %format!("{d:#}"), "removing the failed cluster");
            }
            Err(e)
        }
    }
}

/// The pod range the cluster's nodes take their podCIDRs from: the servers' `--cluster-cidr`.
fn cluster_cidr(opts: &CreateOptions) -> anyhow::Result<skiff_api::cidr::Ipv4Cidr> {
    let mut value = "10.244.0.0/16".to_string();
    let mut args = opts.server_args.iter().chain(&opts.agent_args);
    while let Some(arg) = args.next() {
        if let Some(v) = arg.strip_prefix("--cluster-cidr=") {
            value = v.to_string();
        } else if arg == "--cluster-cidr"
            && let Some(v) = args.next()
        {
            value = v.clone();
        }
    }
    value
        .parse()
        .with_context(|| format!("parsing --cluster-cidr {value:?}"))
}

async fn build(c: &ClusterState, opts: &CreateOptions) -> anyhow::Result<()> {
    let started = Instant::now();
    let archive = c.dir.join("images.tar");
    let images = if opts.images.is_empty() {
        engine::default_images()
    } else {
        opts.images.clone()
    };
    let step = Progress::start(format!(
        "cluster {}: saving {} for the nodes' engines",
        c.name,
        images.join(", ")
    ));
    let (saved, switch) = tokio::join!(engine::save_images(&images, &archive), network::create_switch(c));
    saved?;
    switch?;
    step.done("");
    // The host sends nothing to pods, and no address of their range may leave it either: the
    // range is routed unreachable here as on every node (the route stays, as an agent's does).
    let cidr = cluster_cidr(opts)?;
    skiff_agent::pod_network::ensure_cluster_cidr_route(&skiff_agent::proxy::NetworkNamespace::Current, cidr).await?;
    // The nodes' namespaces and engines, all at once.
    let step = Progress::start(format!(
        "cluster {}: starting {} Docker engines, one per node, and loading the images into them",
        c.name,
        c.nodes.len()
    ));
    futures::future::try_join_all(c.nodes.iter().map(|node| {
        let archive = &archive;
        async move {
            network::create_node(c, node).await?;
            engine::start(c, node).await?;
            engine::load_images(c, node, archive).await
        }
    }))
    .await?;
    let _ = std::fs::remove_file(&archive);
    step.done("");
    start_skiff(c, c.control_plane()?)?;
    wait_api(c, opts.timeout).await?;
    for node in &c.nodes[1..] {
        start_skiff(c, node)?;
    }
    let names: Vec<&str> = c.nodes.iter().map(|n| n.name.as_str()).collect();
    wait_ready(c, &names, opts.timeout).await?;
    tracing::info!(elapsed = ?started.elapsed(), "every node Ready");
    Ok(())
}

/// How an agent joins the control plane: as upstream's TLS bootstrap, with the join token the
/// first node's `skiff server` keeps (`DATA_DIR/server/token`, `K10<sha256 of the CA>::ID.SECRET`):
/// the agent checks the CA against the token, asks for its `system:node:NAME` certificate with
/// a CertificateSigningRequest, which is approved and signed at once, and keeps it (and renews
/// it) in its data dir. No credential of the control plane is copied to the node. The token goes
/// in the environment (`SKIFF_TOKEN`), not on the command line other users can read.
fn join_args(c: &ClusterState) -> anyhow::Result<(Vec<String>, String)> {
    let cp_dir = c.skiff_dir(c.control_plane()?);
    let path = skiff_apiserver::join::token_path(&cp_dir);
    let token = std::fs::read_to_string(&path)
        .with_context(|| format!("reading the join token {}", path.display()))?
        .trim()
        .to_string();
    Ok((vec!["--server".into(), c.server_url()?], token))
}

fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    f.write_all(text.as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

/// Starts the node's `skiff server` (the first node) or `skiff agent`, on the node's engine.
fn start_skiff(c: &ClusterState, node: &NodeState) -> anyhow::Result<()> {
    let dir = c.node_dir(node);
    let data = c.skiff_dir(node);
    std::fs::create_dir_all(&data).with_context(|| format!("creating {}", data.display()))?;
    let ip = c.node_ip(node).to_string();
    let mut env = vec![("DOCKER_HOST", c.docker_host(node))];
    let mut args: Vec<String> = if node.index == 1 {
        let mut a = vec![
            "server".to_string(),
            "--port".into(),
            state::API_PORT.to_string(),
            "--advertise-address".into(),
            ip.clone(),
        ];
        a.extend(c.server_args.iter().cloned());
        a
    } else {
        let (join, token) = join_args(c)?;
        env.push(("SKIFF_TOKEN", token));
        let mut a = vec!["agent".to_string()];
        a.extend(join);
        a
    };
    args.extend([
        "--data-dir".into(),
        data.display().to_string(),
        "--node-name".into(),
        node.name.clone(),
        "--node-ip".into(),
        ip,
    ]);
    args.extend(c.agent_args.iter().cloned());
    // Into the engine's mount namespace (see `process`).
    let engine = std::fs::read_to_string(dir.join("dockerd.pid"))
        .ok()
        .and_then(|p| p.trim().parse().ok())
        .with_context(|| format!("reading node {}'s engine pid", node.name))?;
    if std::env::var_os("SKIFF_LOG").is_none() {
        env.push(("SKIFF_LOG", "info".into()));
    }
    process::spawn(process::Spawn {
        program: &c.skiff,
        args,
        env,
        netns: &c.netns(node),
        hostname: &node.name,
        cgroup: &process::processes_cgroup(&c.cgroup(node)),
        log: &dir.join("skiff.log"),
        pidfile: &dir.join("skiff.pid"),
        mounts: process::MountNamespace::Join { pid: engine },
    })?;
    Ok(())
}

/// Waits for the API server's admin kubeconfig, then writes the cluster's: the same credentials,
/// the server at the first node's address (which the host reaches through the switch).
async fn wait_api(c: &ClusterState, timeout: Duration) -> anyhow::Result<()> {
    let cp = c.control_plane()?;
    let written = c.skiff_dir(cp).join("kubeconfig");
    // The server writes its kubeconfig before its join token: the agents need both.
    let token = skiff_apiserver::join::token_path(&c.skiff_dir(cp));
    let deadline = Instant::now() + timeout;
    let mut step = Progress::start(format!("cluster {}: starting the control plane on {}", c.name, cp.name));
    let text = loop {
        if let Ok(text) = std::fs::read_to_string(&written)
            && text.contains(&format!("https://127.0.0.1:{}", state::API_PORT))
            && std::fs::metadata(&token).is_ok_and(|m| m.len() > 0)
        {
            break text;
        }
        check_running(c, cp)?;
        anyhow::ensure!(
            Instant::now() < deadline,
            "the API server did not start within {timeout:?}:\n{}",
            engine::tail(&c.node_dir(cp).join("skiff.log"), 30)
        );
        step.tick(|| "waiting for the API server's kubeconfig and join token".to_string());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    step.done("");
    let text = text.replace(&format!("https://127.0.0.1:{}", state::API_PORT), &c.server_url()?);
    write_private(&c.kubeconfig(), &text)
}

fn check_running(c: &ClusterState, node: &NodeState) -> anyhow::Result<()> {
    let dir = c.node_dir(node);
    let pid = std::fs::read_to_string(dir.join("skiff.pid")).unwrap_or_default();
    if pid.trim().parse().is_ok_and(|p| !process::alive(p)) {
        anyhow::bail!(
            "skiff on node {} exited:\n{}",
            node.name,
            engine::tail(&dir.join("skiff.log"), 30)
        );
    }
    Ok(())
}

async fn client(c: &ClusterState) -> anyhow::Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(c.kubeconfig())
        .with_context(|| format!("reading {}", c.kubeconfig().display()))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .context("loading the cluster's kubeconfig")?;
    kube::Client::try_from(config).context("building the API client")
}

fn ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Waits until every named Node is Ready.
async fn wait_ready(c: &ClusterState, names: &[&str], timeout: Duration) -> anyhow::Result<()> {
    let api: kube::Api<Node> = kube::Api::all(client(c).await?);
    let deadline = Instant::now() + timeout;
    let mut step = Progress::start(format!(
        "cluster {}: waiting for {} nodes to be Ready",
        c.name,
        names.len()
    ));
    loop {
        let mut waiting: Vec<&str> = names.to_vec();
        // Not before the API server listens (the client logs every refused connection as an error).
        let listening = tokio::net::TcpStream::connect((c.node_ip(c.control_plane()?), state::API_PORT))
            .await
            .is_ok();
        if listening {
            match api.list(&Default::default()).await {
                Ok(list) => {
                    for n in list.items.iter().filter(|n| ready(n)) {
                        waiting.retain(|w| Some(*w) != n.metadata.name.as_deref());
                    }
                    if waiting.is_empty() {
                        step.done("");
                        return Ok(());
                    }
                }
                Err(e) => tracing::debug!(error = %e, "listing nodes"),
            }
        }
        for node in c.nodes.iter().filter(|n| waiting.contains(&n.name.as_str())) {
            check_running(c, node)?;
        }
        if Instant::now() >= deadline {
            let logs: Vec<String> = c
                .nodes
                .iter()
                .filter(|n| waiting.contains(&n.name.as_str()))
                .map(|n| {
                    format!(
                        "--- {}:\n{}",
                        n.name,
                        engine::tail(&c.node_dir(n).join("skiff.log"), 15)
                    )
                })
                .collect();
            anyhow::bail!(
                "nodes {} not Ready within {timeout:?}\n{}",
                waiting.join(", "),
                logs.join("\n")
            );
        }
        step.tick(|| {
            let verb = if listening {
                "not Ready yet"
            } else {
                "waiting for the API server"
            };
            format!(
                "{} of {} Ready; {verb}: {}",
                names.len() - waiting.len(),
                names.len(),
                waiting.join(", ")
            )
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Removes the cluster named `name` under `root`; nothing to do when there is none.
/// Returns whether there was one.
pub async fn delete(root: &Path, name: &str) -> anyhow::Result<bool> {
    state::validate_name(name)?;
    let dir = root.join(name);
    match ClusterState::load(&dir)? {
        Some(c) => {
            delete_cluster(&c).await?;
            Ok(true)
        }
        None => Ok(false),
    }
}

async fn delete_cluster(c: &ClusterState) -> anyhow::Result<()> {
    // Every process of every node: agents, the server, engines and their containers.
    for node in &c.nodes {
        stop_processes(c, node).await?;
    }
    process::unmount_under(&[c.dir.clone(), c.runtime_dir()])?;
    network::remove(c).await?;
    process::remove_cgroups(&c.cluster_cgroup());
    process::remove_empty_cgroup(Path::new(state::CGROUP_ROOT));
    for dir in [c.runtime_dir(), c.dir.clone()] {
        if let Err(e) = std::fs::remove_dir_all(&dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            return Err(e).with_context(|| format!("removing {}", dir.display()));
        }
    }
    Ok(())
}

/// Kills everything running on the node (as a power cut would) and unmounts what its engine
/// left mounted.
async fn stop_processes(c: &ClusterState, node: &NodeState) -> anyhow::Result<()> {
    process::kill_all(&c.cgroup(node)).await?;
    let run_dir = c.node_runtime_dir(node);
    process::unmount_under(&[c.node_dir(node), run_dir.clone()])?;
    // The engine's runtime state goes with the power, as /run does: a stale pid file or socket
    // would only confuse the next start.
    match std::fs::remove_dir_all(&run_dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", run_dir.display()))
        }
        _ => Ok(()),
    }
}

/// The clusters recorded under `root`.
pub fn list(root: &Path) -> anyhow::Result<Vec<ClusterState>> {
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e).with_context(|| format!("listing {}", root.display())),
    };
    for entry in entries.flatten() {
        if let Some(c) = ClusterState::load(&entry.path())? {
            out.push(c);
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Whether anything runs on the node (its agent or server, its engine, containers).
pub fn node_running(c: &ClusterState, node: &NodeState) -> bool {
    !process::processes(&c.cgroup(node)).is_empty()
}

fn load(root: &Path, name: &str) -> anyhow::Result<ClusterState> {
    state::validate_name(name)?;
    ClusterState::load(&root.join(name))?.with_context(|| format!("no cluster {name:?} in {}", root.display()))
}

/// Stops every process of the node at once (its agent or server, its engine and containers), as
/// a node losing power. Its namespace, address and data stay for `start_node`.
pub async fn stop_node(root: &Path, cluster: &str, node: &str) -> anyhow::Result<()> {
    let c = load(root, cluster)?;
    let node = c.node(node)?;
    stop_processes(&c, node).await
}

/// Starts a stopped node again: its engine, then its server or agent; returns once the Node is
/// Ready (when the control plane is up to say so).
pub async fn start_node(root: &Path, cluster: &str, node: &str, timeout: Duration) -> anyhow::Result<()> {
    let c = load(root, cluster)?;
    let node = c.node(node)?;
    anyhow::ensure!(
        !node_running(&c, node),
        "node {} is running; stop it first with `skiff cluster node stop {}`",
        node.name,
        node.name
    );
    engine::start(&c, node).await?;
    start_skiff(&c, node)?;
    wait_ready(&c, &[&node.name], timeout).await
}
