//! The node agent: registers a Node, runs the pods bound to it through the Docker Engine, reports their
//! status and serves logs / exec / attach to the API server.
//! `sim` runs simulated nodes (as kwok does) for scheduling tests and benchmarks.
//!
//! Code map:
//! - `node`: Node registration, status and Lease heartbeats.
//! - `pods`: the watch on pods bound to this node; one `worker` per pod; adoption of containers.
//! - `worker`: the per-pod sync loop (sandbox, init and app containers, restarts, back-off, deletion);
//!   `actions` decides what each pass does (upstream's computePodActions), the worker does it.
//! - `docker`: the runtime: container records, labels, stop/kill/remove.
//! - `volumes`, `env`, `probes`, `status`, `events`: what the worker is made of (`volumes` includes
//!   persistentVolumeClaim volumes: the bound PersistentVolume's hostPath or local path).
//! - `local_path`: the node's provisioner for the `local-path` StorageClass (directories under the
//!   storage path, their PersistentVolumes, their deletion and expansion).
//! - `server`: the agent's HTTPS endpoint (containerLogs, exec, attach, portForward).
//! - `spdy`: SPDY/3.1 framing and the server session, for kubectl's port-forward tunneled over WebSocket.
//! - `images`: local busybox and pause images.
//! - `bootstrap`: joining with a token (the CA pinned by the token's hash, a node client
//!   certificate through a CertificateSigningRequest), as the kubelet's TLS bootstrap.
//! - `certificate_manager`: the node certificate renewed at 70-90% of its life, swapped into the
//!   one client every part of the agent calls through.
//!
//! Invariant: the agent never stops containers because it exits; containers are found again by label.

pub mod actions;
pub mod bootstrap;
pub mod certificate_manager;
pub mod cleanup;
pub mod dns;
pub mod docker;
pub mod env;
pub mod events;
pub mod eviction;
pub mod grpc_probe;
pub mod host_record;
pub mod images;
pub mod local_path;
pub mod metrics;
pub mod node;
pub mod parts;
pub mod pod_network;
pub mod pods;
pub mod probes;
pub mod progress;
pub mod proxy;
mod quantity;
pub mod resolv_conf;
pub mod server;
pub mod server_auth;
pub mod service_network;
pub mod sim;
pub mod spdy;
pub mod stats;
pub mod status;
pub mod subpath;
pub mod uninstall;
pub mod volumes;
pub mod worker;

#[cfg(test)]
mod fuzz_tests;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;

pub use images::build_local_images;

/// How a node agent runs.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// The Node's name.
    pub node_name: String,
    /// Where pod directories live (`DATA_DIR/pods/UID`).
    pub data_dir: PathBuf,
    /// The address the agent's HTTPS endpoint listens on. When the port is taken, a free port is used
    /// instead (the Node status publishes whichever is bound).
    pub listen: SocketAddr,
    /// The address published as InternalIP; detected from the default route when `None`.
    pub node_ip: Option<IpAddr>,
    /// PEM of the cluster CA: clients of the HTTPS endpoint must present a certificate it signed.
    pub cluster_ca_pem: Option<String>,
    /// A kubeconfig whose current cluster's `certificate-authority(-data)` is the cluster CA, used
    /// when `cluster_ca_pem` is not set. Without either, logs / exec / attach are not served.
    pub kubeconfig: Option<PathBuf>,
    /// The cluster DNS Service's addresses pods are pointed at (the kubelet's `--cluster-dns`);
    /// empty: ClusterFirst pods fall back to the node's resolver, as the kubelet's do.
    pub cluster_dns: Vec<IpAddr>,
    /// The kubelet's `--cluster-domain`.
    pub cluster_domain: String,
    /// Whether this agent runs the service proxy and cluster DNS.
    pub services: service_network::ServiceNetworkConfig,
    /// The kubelet's `--eviction-hard` thresholds (upstream's defaults).
    pub eviction_hard: Vec<eviction::Threshold>,
    /// Where the `local-path` provisioner makes this node's volumes (`--default-storage-path`;
    /// `DATA_DIR/storage` by default).
    pub storage_path: PathBuf,
    /// The cluster's pod range (`--cluster-cidr`): routed locally, masqueraded when left, and the
    /// proxy's cluster CIDR once the node has a podCIDR.
    pub cluster_cidr: proxy::Ipv4Cidr,
    /// How long the agent waits after registering for its Node to get a podCIDR before it puts
    /// pods on Docker's default network (zero when no IPAM runs).
    pub pod_cidr_wait: std::time::Duration,
}

impl AgentConfig {
    pub fn new(node_name: impl Into<String>, data_dir: impl Into<PathBuf>) -> Self {
        let data_dir = data_dir.into();
        Self {
            node_name: node_name.into(),
            storage_path: data_dir.join("storage"),
            data_dir,
            listen: SocketAddr::from(([0, 0, 0, 0], 10250)),
            node_ip: None,
            cluster_ca_pem: None,
            kubeconfig: None,
            cluster_dns: Vec::new(),
            cluster_domain: "cluster.local".into(),
            services: Default::default(),
            // The defaults parse (a unit test says so); none would mean no pressure reported.
            eviction_hard: eviction::parse_thresholds(eviction::DEFAULT_EVICTION_HARD).unwrap_or_default(),
            cluster_cidr: pod_network::DEFAULT_CLUSTER_CIDR,
            pod_cidr_wait: std::time::Duration::from_secs(10),
        }
    }

    /// A configuration for this machine: the node is named after the host (lowercased, as upstream).
    pub fn for_this_host(data_dir: impl Into<PathBuf>) -> Self {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        let host = host.trim().to_lowercase();
        Self::new(if host.is_empty() { "localhost".to_string() } else { host }, data_dir)
    }

    /// The cluster CA, from `cluster_ca_pem` or the kubeconfig.
    pub fn cluster_ca(&self) -> anyhow::Result<Option<String>> {
        if let Some(pem) = &self.cluster_ca_pem {
            return Ok(Some(pem.clone()));
        }
        let Some(path) = &self.kubeconfig else {
            return Ok(None);
        };
        let kubeconfig = kube::config::Kubeconfig::read_from(path)
            .with_context(|| format!("reading kubeconfig {}", path.display()))?;
        let context_name = kubeconfig.current_context.clone().unwrap_or_default();
        let cluster_name = kubeconfig
            .contexts
            .iter()
            .find(|c| c.name == context_name)
            .and_then(|c| c.context.as_ref())
            .map(|c| c.cluster.clone());
        let cluster = kubeconfig
            .clusters
            .iter()
            .find(|c| Some(&c.name) == cluster_name.as_ref())
            .or_else(|| kubeconfig.clusters.first())
            .and_then(|c| c.cluster.clone());
        let Some(cluster) = cluster else {
            return Ok(None);
        };
        if let Some(data) = cluster.certificate_authority_data {
            use base64::Engine;
            let pem = base64::engine::general_purpose::STANDARD
                .decode(data.trim())
                .context("decoding certificate-authority-data")?;
            return Ok(Some(String::from_utf8_lossy(&pem).into_owned()));
        }
        if let Some(file) = cluster.certificate_authority {
            let pem = std::fs::read_to_string(&file).with_context(|| format!("reading {file}"))?;
            return Ok(Some(pem));
        }
        Ok(None)
    }
}

/// No transparent huge pages for this process. The binary's allocator asks for them on its heap
/// (`MADV_HUGEPAGE`), which makes every 2 MiB stretch of heap it touches resident whole, and each
/// one the allocator gives back and takes again is zeroed whole by the kernel. An agent's heap is a
/// few MiB spread over several such stretches, so most of its resident memory would be zero-filled
/// padding; the API server and the scheduler would spend their time zeroing pages.
pub fn disable_transparent_huge_pages() -> std::io::Result<()> {
    // SAFETY: PR_SET_THP_DISABLE takes integer arguments only and changes no memory of ours.
    let rc = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Whether a Docker Engine answers on this machine.
pub async fn docker_available() -> bool {
    match docker::connect().await {
        Ok(d) => d.ping().await.is_ok(),
        Err(_) => false,
    }
}

/// The cluster's identity: the uid of its `kube-system` Namespace, which lives as long as the
/// cluster. The API server may not be up yet (or not have made the namespace): keeps trying.
async fn cluster_id(client: &kube::Client) -> String {
    let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client.clone());
    let mut delay = std::time::Duration::from_millis(500);
    loop {
        match namespaces.get("kube-system").await {
            Ok(ns) if ns.metadata.uid.as_deref().is_some_and(|u| !u.is_empty()) => {
                return ns.metadata.uid.unwrap_or_default();
            }
            Ok(_) => tracing::warn!("the kube-system namespace has no uid; retrying"),
            Err(e) => {
                tracing::warn!(error = %e, "reading the cluster's identity (the kube-system namespace); retrying")
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(std::time::Duration::from_secs(10));
    }
}

/// Runs the agent until its pod watch ends or an error stops it. Containers keep running when it
/// stops. `client` is the node's own; `parts` gives the clients of its proxy, DNS, pod network
/// and provisioner ([`parts`]).
pub async fn run(client: kube::Client, parts: parts::Parts, cfg: AgentConfig) -> anyhow::Result<()> {
    let docker = docker::connect().await?;
    if docker::image_id(&docker, images::PAUSE_IMAGE).await?.is_none() {
        images::build_pause_image(&docker)
            .await
            .context("building the pause image")?;
    }
    let cluster = cluster_id(&client).await;
    host_record::HostRecord::note(&cfg.data_dir, |r| {
        r.cluster.clone_from(&cluster);
        r.node.clone_from(&cfg.node_name);
    });
    let node_ip = cfg.node_ip.unwrap_or_else(node::detect_host_ip);
    // The CA comes from the configuration or, for `skiff agent --kubeconfig`, from the kubeconfig.
    let cluster_ca = cfg.cluster_ca().context("reading the cluster CA")?;
    let (port, cert_sha256) = match &cluster_ca {
        Some(ca) => {
            let sampler = stats::Sampler::default();
            tokio::spawn(
                sampler
                    .clone()
                    .run(docker.clone(), cfg.node_name.clone(), cluster.clone()),
            );
            let state = server::ServerState {
                docker: docker.clone(),
                node: cfg.node_name.clone(),
                cluster: cluster.clone(),
                client: Some(client.clone()),
                stats: sampler,
            };
            let sans = vec![
                node_ip.to_string(),
                cfg.node_name.clone(),
                "localhost".into(),
                "127.0.0.1".into(),
            ];
            let endpoint = server::serve(cfg.listen, ca, sans, state)
                .await
                .context("starting the agent's HTTPS endpoint")?;
            (i32::from(endpoint.addr.port()), Some(endpoint.cert_sha256))
        }
        None => {
            tracing::warn!("no cluster CA configured: logs, exec and attach are not served");
            (0, None)
        }
    };
    let mut facts = node::gather(&docker, &cfg.node_name, &cfg.data_dir, Some(node_ip), port).await?;
    facts.serving_cert_sha256 = cert_sha256;
    // The API server may not be up yet: keep trying, as upstream's kubelet does.
    let mut delay = std::time::Duration::from_millis(500);
    let node = loop {
        match node::register(&client, &facts).await {
            Ok(node) => break node,
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "registering the node; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(std::time::Duration::from_secs(10));
            }
        }
    };
    let clients = parts
        .clients(&client, &node, &cfg.data_dir)
        .await
        .context("the clients of the agent's parts")?;
    let (pressure_tx, pressure_rx) = tokio::sync::watch::channel(eviction::Pressure::default());
    let image_root = match docker.info().await {
        Ok(info) => info.docker_root_dir.map(PathBuf::from),
        Err(e) => {
            tracing::warn!(error = %e, "reading the engine's root dir: imagefs is measured on the data dir");
            None
        }
    };
    let evicted: eviction::Evicted = Default::default();
    let evictor = eviction::Evictor {
        client: client.clone(),
        docker: docker.clone(),
        node: cfg.node_name.clone(),
        cluster: cluster.clone(),
        recorder: events::kubelet(client.clone(), &cfg.node_name),
        evicted: evicted.clone(),
        data_dir: cfg.data_dir.clone(),
    };
    tokio::spawn(eviction::run(
        cfg.eviction_hard.clone(),
        cfg.data_dir.clone(),
        image_root,
        pressure_tx,
        Some(evictor),
    ));
    tokio::spawn(node::heartbeat(
        client.clone(),
        facts.clone(),
        node.metadata.uid.clone(),
        pressure_rx,
    ));
    // The node's volume provisioner; pods run without it if its storage path cannot be made.
    match local_path::LocalPath::new(
        clients.volumes.clone(),
        client.clone(),
        &cfg.node_name,
        &cfg.storage_path,
    ) {
        Ok(provisioner) => {
            tokio::spawn(async move {
                if let Err(e) = provisioner.run().await {
                    tracing::warn!(error = %format!("{e:#}"), "local-path provisioner stopped");
                }
            });
        }
        Err(e) => tracing::warn!(error = %format!("{e:#}"), "local-path provisioner not started"),
    }
    let pods_on = pod_network_of(&client, &clients.network, &docker, &cfg, &node, node_ip).await;
    let network = service_network::start(
        &client,
        &clients.network,
        &pods_on,
        &node,
        node_ip,
        &cfg.cluster_domain,
        cfg.services,
    )
    .await;
    if let Some((service_cidr, table)) = &network.proxied {
        host_record::HostRecord::note(&cfg.data_dir, |r| {
            r.service_cidr = Some(service_cidr.to_string());
            r.add_table(table);
        });
    }
    // The kubelet's --cluster-dns when given, else this node's own cluster DNS.
    let cluster_dns = if cfg.cluster_dns.is_empty() {
        network.cluster_dns.clone()
    } else {
        cfg.cluster_dns.clone()
    };
    let ctx = Arc::new(worker::Ctx {
        client: client.clone(),
        docker,
        node: cfg.node_name.clone(),
        cluster,
        data_dir: cfg.data_dir.clone(),
        host_ip: facts.internal_ip.clone(),
        recorder: events::kubelet(client, &cfg.node_name),
        allocatable_cpu_milli: i128::from(facts.cpus) * 1000,
        allocatable_memory: facts.allocatable_memory(),
        allocatable_storage: facts.allocatable_storage(),
        images: Default::default(),
        dns: resolv_conf::NodeDns::for_host(cluster_dns, &cfg.cluster_domain),
        hairpin_bridge: network.hairpin_bridge.clone(),
        pod_network: pods_on.name.clone(),
        evicted,
    });
    let result = pods::run(ctx).await;
    drop(network);
    result
}

/// The network this node's pods go on: the node's podCIDR on a bridge of Skiff's own, with the
/// routes to the other nodes' podCIDRs kept in a task of its own; Docker's default network when
/// the Node has no podCIDR (none came within `pod_cidr_wait`) or its network cannot be made. The
/// cluster CIDR is routed locally first, whichever it is, before any pod starts.
async fn pod_network_of(
    client: &kube::Client,
    network_client: &kube::Client,
    docker: &bollard::Docker,
    cfg: &AgentConfig,
    node: &k8s_openapi::api::core::v1::Node,
    node_ip: std::net::IpAddr,
) -> pod_network::PodNetwork {
    let netns = proxy::NetworkNamespace::Current;
    host_record::HostRecord::note(&cfg.data_dir, |r| {
        r.cluster_cidr = Some(cfg.cluster_cidr.to_string());
    });
    if let Err(e) = pod_network::ensure_cluster_cidr_route(&netns, cfg.cluster_cidr).await {
        tracing::error!(error = %format!("{e:#}"), "the cluster CIDR is not routed locally");
    }
    let pod_cidr = match pod_network::node_pod_cidr(node) {
        Some(cidr) => Some(cidr),
        None => pod_network::wait_for_pod_cidr(client, &cfg.node_name, cfg.pod_cidr_wait).await,
    };
    if let Some(pod_cidr) = pod_cidr {
        if !cfg.cluster_cidr.covers(&pod_cidr) {
            tracing::warn!(pod_cidr = %pod_cidr, cluster_cidr = %cfg.cluster_cidr, "the node's podCIDR is outside the cluster CIDR (--cluster-cidr)");
        }
        match pod_network::setup(docker, pod_cidr, cfg.cluster_cidr).await {
            Ok(network) => {
                host_record::HostRecord::note(&cfg.data_dir, |r| {
                    r.add_table(&pod_network::table_name(cfg.cluster_cidr));
                    r.docker_network = Some(network.name.clone());
                    r.bridge.clone_from(&network.bridge);
                    r.pod_cidr = Some(pod_cidr.to_string());
                });
                let local = match node_ip {
                    std::net::IpAddr::V4(ip) => Some(ip),
                    std::net::IpAddr::V6(_) => None,
                };
                tokio::spawn(pod_network::run_routes(
                    network_client.clone(),
                    cfg.node_name.clone(),
                    cfg.cluster_cidr,
                    local,
                    netns,
                ));
                return network;
            }
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "the pod network of the node's podCIDR: pods go on Docker's default network")
            }
        }
    } else {
        tracing::info!("the node has no podCIDR: pods go on Docker's default network");
    }
    let default = pod_network::PodNetwork {
        name: pod_network::DOCKER_DEFAULT_NETWORK.into(),
        subnet: None,
        gateway: None,
        bridge: None,
        cluster_cidr: None,
    };
    match pod_network::inspect(docker, pod_network::DOCKER_DEFAULT_NETWORK).await {
        Ok(Some(network)) => network,
        Ok(None) => default,
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "reading Docker's default network");
            default
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn volumes_are_kept_under_the_data_dir_by_default() {
        let cfg = super::AgentConfig::new("n1", "/var/lib/skiff/agent");
        assert_eq!(cfg.storage_path, std::path::Path::new("/var/lib/skiff/agent/storage"));
    }

    #[test]
    fn disabling_transparent_huge_pages_shows_in_the_process_status() {
        super::disable_transparent_huge_pages().expect("PR_SET_THP_DISABLE");
        let status = std::fs::read_to_string("/proc/self/status").expect("reading /proc/self/status");
        let enabled = status
            .lines()
            .find_map(|l| l.strip_prefix("THP_enabled:"))
            .map(str::trim);
        assert_eq!(enabled, Some("0"));
    }
}
