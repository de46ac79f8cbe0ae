//! `skiff`: Kubernetes in one binary. This file only wires the command line to the crates.

mod audit_security;
mod auth_why;
mod bench;
mod bench_churn;
mod bench_density;
mod bench_services;
mod client;
mod token;

/// The API server allocates and frees many small JSON values per request; mimalloc handles
/// that pattern far better than the system allocator.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The store's hook after a compaction dropped history from memory (`skiff_store::set_release_memory`):
/// gives the freed memory back to the OS instead of keeping it for a burst that may not come.
fn release_memory() {
    // Collects this thread's heap and purges the free pages of every arena now rather than as
    // later allocations pass by (an idle server makes none).
    #[cfg(feature = "mimalloc")]
    {
        // SAFETY: mi_collect takes no pointers; it walks the allocator's own structures.
        unsafe {
            libmimalloc_sys::mi_collect(true);
        }
        RELEASE_EPOCH.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    // SQLite allocates from the C heap, which keeps freed memory too.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointers and is thread-safe.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Bumped by [`release_memory`]. `mi_collect` reaches only the calling thread's heap, and a
/// runtime worker's pages whose blocks other threads freed (a request's body, freed by the store
/// writer) stay its own until it collects them: each worker does, the next time it parks.
#[cfg(feature = "mimalloc")]
static RELEASE_EPOCH: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The runtime's `on_thread_park`: one atomic load, unless a release is due on this worker.
#[cfg(feature = "mimalloc")]
fn collect_on_park() {
    thread_local! {
        static SEEN: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    }
    let epoch = RELEASE_EPOCH.load(std::sync::atomic::Ordering::Relaxed);
    SEEN.with(|seen| {
        if seen.get() != epoch {
            seen.set(epoch);
            // SAFETY: as in `release_memory`.
            unsafe {
                libmimalloc_sys::mi_collect(true);
            }
        }
    });
}

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "skiff", version, about = "Kubernetes rebuilt in Rust, in one binary")]
struct Cli {
    /// How log lines are written to stderr: `text` for people (coloured only on a terminal),
    /// `json` (one object per line) for log collectors.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// Logs to stderr at `SKIFF_LOG`'s levels (default info), without colour codes unless stderr is
/// a terminal (and `NO_COLOR` is unset).
fn init_logging(format: LogFormat) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_env("SKIFF_LOG").unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().with_current_span(false).init(),
        LogFormat::Text => {
            let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
            builder.with_ansi(colour).init();
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Start the control plane (API server, scheduler, controllers) and a local node.
    Server(Box<ServerArgs>),
    /// Run the scheduler alone against an API server.
    Scheduler {
        #[arg(long)]
        kubeconfig: PathBuf,
    },
    /// Run a node agent that joins a cluster and runs pods in Docker: with `--server URL --token
    /// TOKEN` (the join command `skiff server` prints), or with a node's `--kubeconfig`.
    Agent {
        /// A kubeconfig with the node's identity (`skiff kubeconfig node NAME`), instead of a token.
        #[arg(long, conflicts_with_all = ["server", "token"])]
        kubeconfig: Option<PathBuf>,
        /// The API server to join, e.g. https://HOST:6443.
        #[arg(long, required_unless_present = "kubeconfig")]
        server: Option<String>,
        /// The join token (`K10<sha256 of the CA>::<id>.<secret>`); not needed once the data dir
        /// holds a valid node certificate.
        #[arg(long, env = "SKIFF_TOKEN", hide_env_values = true)]
        token: Option<String>,
        #[arg(long)]
        node_name: Option<String>,
        #[arg(long)]
        data_dir: Option<PathBuf>,
        #[command(flatten)]
        agent: AgentArgs,
    },
    /// Register simulated nodes (as kwok does).
    Sim(SimArgs),
    /// Show a pod's last scheduling attempt (every node's verdict), or why a Service has the
    /// endpoints it has.
    Explain {
        /// "pod" or "service"
        kind: String,
        name: String,
        #[arg(short, long, default_value = "default")]
        namespace: String,
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
    },
    /// Benchmarks (figures in BENCHMARKS.md).
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Local images (no registry is needed).
    #[command(subcommand)]
    Images(ImagesCommand),
    /// Issue a kubeconfig with a client certificate from the cluster CA (printed to stdout).
    #[command(subcommand)]
    Kubeconfig(KubeconfigCommand),
    /// Questions about authorization.
    #[command(subcommand)]
    Auth(AuthCommand),
    /// Reviews of a running cluster.
    #[command(subcommand)]
    Audit(AuditCommand),
    /// Clusters of several nodes on this machine, each node in a network namespace of its own.
    Cluster {
        #[command(subcommand)]
        command: ClusterCommand,
        /// Where clusters are kept (default ~/.skiff/clusters).
        #[arg(long, global = true)]
        dir: Option<PathBuf>,
    },
    /// Join tokens for `skiff agent --token` (bootstrap tokens, as `kubeadm token`).
    Token {
        #[command(subcommand)]
        command: TokenCommand,
        /// The administrator's kubeconfig (default ~/.skiff/kubeconfig).
        #[arg(long, global = true)]
        kubeconfig: Option<PathBuf>,
    },
    /// Remove what Skiff put on this machine (as k3s-uninstall.sh): the local node's pod
    /// containers, its Docker network, nftables tables, routes and DOCKER-USER rules, and the
    /// clusters of `skiff cluster`. Stop `skiff server` and `skiff agent` first: a running
    /// agent puts its rules back.
    Uninstall {
        /// The data dir the server or agent used (default ~/.skiff); its node's record is in
        /// `DATA_DIR/agent`.
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Also delete the data dir: the store, certificates, kubeconfigs and volumes.
        #[arg(long)]
        data: bool,
    },
    /// Encryption at rest of Secrets on the running server (as k3s's secrets-encrypt).
    SecretsEncrypt {
        #[command(subcommand)]
        command: SecretsEncryptCommand,
        /// The administrator's kubeconfig (default ~/.skiff/kubeconfig).
        #[arg(long, global = true)]
        kubeconfig: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum AuditCommand {
    /// What a security reviewer checks first, from the cluster's live state: anonymous access,
    /// system:masters, who reads every Secret, namespaces without a Pod Security level, pods
    /// baseline would refuse, node agents answering without credentials; each with its fix.
    Security {
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum AuthCommand {
    /// Why USER may or may not VERB RESOURCE: the binding and rule that allow it, or the smallest
    /// grant that would, as kubectl commands. RESOURCE is `pods`, `deployments.apps`,
    /// `pods/log`, or a path such as `/metrics`.
    Why {
        #[arg(long = "as")]
        user: String,
        #[arg(long = "as-group")]
        groups: Vec<String>,
        verb: String,
        resource: String,
        name: Option<String>,
        #[arg(short, long, default_value = "default")]
        namespace: String,
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum KubeconfigCommand {
    /// A user (CN=NAME), optionally in a group (O=GROUP); RBAC decides what it may do.
    User {
        name: String,
        #[arg(long)]
        group: Option<String>,
        #[command(flatten)]
        target: KubeconfigTarget,
    },
    /// A node agent's identity: `system:node:NAME` in `system:nodes`, for `skiff agent`.
    Node {
        name: String,
        #[command(flatten)]
        target: KubeconfigTarget,
    },
}

#[derive(clap::Args)]
struct KubeconfigTarget {
    /// The server's data dir, which holds the CA (default ~/.skiff).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// The API server's URL (default: the admin kubeconfig's).
    #[arg(long)]
    server: Option<String>,
}

#[derive(Subcommand)]
enum ClusterCommand {
    /// Create a cluster: the control plane on the first node, an agent on each other, every node
    /// with an engine of its own; returns once every Node is Ready and prints the kubeconfig.
    Create {
        #[arg(long, default_value_t = 1)]
        nodes: u8,
        #[arg(long, default_value = "skiff")]
        name: String,
        /// A flag for the first node's `skiff server` (repeat for more).
        #[arg(long = "server-arg", allow_hyphen_values = true)]
        server_args: Vec<String>,
        /// A flag for every node's agent, the first node's `skiff server` included (repeat for
        /// more).
        #[arg(long = "agent-arg", allow_hyphen_values = true)]
        agent_args: Vec<String>,
        /// An image of the host's engine to copy into every node's (default: busybox and the
        /// pause image, as `skiff images build` makes them).
        #[arg(long = "image")]
        images: Vec<String>,
        /// How long to wait for the nodes to be Ready.
        #[arg(long, default_value = "120s", value_parser = parse_duration)]
        timeout: std::time::Duration,
    },
    /// Delete a cluster: its processes, containers, mounts, namespaces, interfaces and files.
    Delete {
        #[arg(long, default_value = "skiff")]
        name: String,
    },
    /// List the clusters.
    List,
    /// Stop or start one node of a cluster.
    Node {
        #[command(subcommand)]
        command: ClusterNodeCommand,
    },
}

#[derive(Subcommand)]
enum ClusterNodeCommand {
    /// Kill everything running on the node (agent, engine, containers), as a power cut would.
    Stop {
        node: String,
        #[arg(long, default_value = "skiff")]
        name: String,
    },
    /// Start a stopped node again; returns once it is Ready.
    Start {
        node: String,
        #[arg(long, default_value = "skiff")]
        name: String,
        #[arg(long, default_value = "120s", value_parser = parse_duration)]
        timeout: std::time::Duration,
    },
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Create a bootstrap token and print its join token.
    Create {
        /// How long the token authenticates (`0`: for ever).
        #[arg(long, default_value = "24h")]
        ttl: String,
        /// A description kept with the token.
        #[arg(long, default_value = "")]
        description: String,
        /// Extra groups the token authenticates in (`system:bootstrappers:...`).
        #[arg(long, value_delimiter = ',')]
        groups: Vec<String>,
    },
    /// List the bootstrap tokens.
    List,
    /// Delete bootstrap tokens by id or `id.secret`.
    Delete { tokens: Vec<String> },
}

#[derive(Subcommand, Clone, Copy)]
enum SecretsEncryptCommand {
    /// The active provider and key, and how many Secrets are stored under each key.
    Status,
    /// Put a new key first in the generated configuration (the old ones stay, to decrypt) and
    /// re-encrypt every Secret with it.
    RotateKeys,
    /// Rewrite every Secret with the configuration's first provider, then erase the store's
    /// history up to that point from disk.
    Reencrypt,
}

#[derive(clap::Args, Clone)]
struct ServerArgs {
    /// Where the store, certificates and kubeconfig live (default ~/.skiff).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    #[arg(long, default_value_t = 6443)]
    port: u16,
    /// The address the API server listens on (default: every address). Replicas on one machine
    /// listen on different addresses with the same port, e.g. 127.0.0.2 and 127.0.0.3.
    #[arg(long)]
    bind_address: Option<std::net::IpAddr>,
    /// Also serve the workload versions upstream has removed (extensions/v1beta1 Deployments,
    /// DaemonSets and ReplicaSets, apps/v1beta1 and apps/v1beta2, batch/v1beta1 CronJobs),
    /// stored as apps/v1 and batch/v1, so that old manifests apply as written. Each answer
    /// carries upstream's deprecation warning naming the replacement.
    #[arg(long)]
    serve_removed_apis: bool,
    /// How the `kubernetes` Service's endpoints are kept: lease (each API server's record with a
    /// TTL; the default on etcd), master-count (this server alone; the default of the embedded
    /// store) or none.
    #[arg(long)]
    endpoint_reconciler_type: Option<skiff_apiserver::reconcilers::ReconcilerType>,
    /// How long an API server's endpoint record lives without renewal (the lease reconciler);
    /// it is renewed every 10 s, or every two thirds of the TTL when that is shorter.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    master_endpoint_reconcile_ttl: std::time::Duration,
    /// Where to write the admin kubeconfig (default DATA_DIR/kubeconfig).
    #[arg(long)]
    write_kubeconfig: Option<PathBuf>,
    /// Also register N simulated nodes.
    #[arg(long, default_value_t = 0)]
    sim_nodes: usize,
    /// Do not run a node agent for this machine.
    #[arg(long)]
    no_agent: bool,
    /// The local node's name (default: the host name).
    #[arg(long)]
    node_name: Option<String>,
    /// Do not run the scheduler in this process.
    #[arg(long)]
    no_scheduler: bool,
    /// Do not run the controllers in this process.
    #[arg(long)]
    no_controllers: bool,
    /// The range Services' ClusterIPs come from.
    #[arg(long, default_value = "10.96.0.0/12")]
    service_cluster_ip_range: String,
    /// The range of NodePorts.
    #[arg(long, default_value = "30000-32767")]
    service_node_port_range: String,
    /// The address nodes reach the API server on (default: this host's default-route address).
    #[arg(long)]
    advertise_address: Option<std::net::IpAddr>,
    /// Upstream's EncryptionConfiguration for Secrets at rest (default: one generated in the
    /// data dir at first start, encryption-config.yaml).
    #[arg(long)]
    encryption_provider_config: Option<PathBuf>,
    /// Upstream's AdmissionConfiguration: the PodSecurity plugin's cluster-wide defaults and
    /// exemptions (default: every namespace `privileged` unless labelled, nothing exempt).
    #[arg(long)]
    admission_control_config_file: Option<PathBuf>,
    /// Do not create the default `local-path` StorageClass.
    #[arg(long)]
    disable_local_storage: bool,
    /// How long pods tolerate a not-ready node unless they say otherwise (the
    /// DefaultTolerationSeconds admission plugin).
    #[arg(long, default_value_t = 300)]
    default_not_ready_toleration_seconds: i64,
    /// How long pods tolerate an unreachable node unless they say otherwise.
    #[arg(long, default_value_t = 300)]
    default_unreachable_toleration_seconds: i64,
    #[command(flatten)]
    serving: ServingArgs,
    #[command(flatten)]
    etcd: EtcdArgs,
    /// Give every Node a podCIDR from --cluster-cidr (the node IPAM controller).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    allocate_node_cidrs: bool,
    /// The length of each Node's podCIDR prefix.
    #[arg(long, default_value_t = 24)]
    node_cidr_mask_size: u8,
    /// The longest validity of certificates the cluster signs for CertificateSigningRequests
    /// (kube-controller-manager's flag).
    #[arg(long, default_value = "8760h", value_parser = parse_duration)]
    cluster_signing_duration: std::time::Duration,
    /// How often every ResourceQuota's usage is recalculated in full (kube-controller-manager's
    /// flag; upstream's default is 5m).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    resource_quota_sync_period: std::time::Duration,
    #[command(flatten)]
    agent: AgentArgs,
    #[command(flatten)]
    node_lifecycle: NodeLifecycleArgs,
    #[command(flatten)]
    audit: AuditArgs,
    #[command(flatten)]
    leader_election: LeaderElectionArgs,
}

/// Upstream's leader election flags (kube-scheduler's and kube-controller-manager's).
#[derive(clap::Args, Clone)]
struct LeaderElectionArgs {
    /// Run the scheduler, the controllers and the simulated nodes only while this process holds
    /// their Lease in kube-system (kube-scheduler, kube-controller-manager, skiff-sim), so that
    /// one replica of several over a shared store is active. Default: on when the store is
    /// shared, off for the embedded store (a restart need not wait out a lease).
    #[arg(long, num_args = 0..=1, default_missing_value = "true", require_equals = true)]
    leader_elect: Option<bool>,
    /// How long a standby waits, from the last renewal it saw, before taking a Lease over.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    leader_elect_lease_duration: std::time::Duration,
    /// How long the holder keeps trying to renew before it stops its components.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    leader_elect_renew_deadline: std::time::Duration,
    /// How long candidates wait between attempts to acquire or renew.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    leader_elect_retry_period: std::time::Duration,
}

impl LeaderElectionArgs {
    /// The election's timing if leader election is on: by `--leader-elect`, else by whether
    /// the store is shared with other servers (the one place that default is decided).
    fn config(&self, store_is_shared: bool) -> anyhow::Result<Option<skiff_leaderelection::Config>> {
        if !self.leader_elect.unwrap_or(store_is_shared) {
            return Ok(None);
        }
        let config = skiff_leaderelection::Config {
            lease_duration: self.leader_elect_lease_duration,
            renew_deadline: self.leader_elect_renew_deadline,
            retry_period: self.leader_elect_retry_period,
        };
        config.validate().context("invalid leader election flags")?;
        Ok(Some(config))
    }
}

/// Upstream's limits on requests, and Skiff's on connections.
#[derive(clap::Args, Clone)]
struct ServingArgs {
    /// How long a request that is not long-running (watch, exec, attach, logs, port-forward,
    /// proxy) may take before it is answered 504; a request's `?timeout=` may shorten it.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    request_timeout: std::time::Duration,
    /// Read-only requests (get, list) served at once; more are answered 429 (0: no limit).
    #[arg(long, default_value_t = skiff_apiserver::filters::DEFAULT_MAX_REQUESTS_INFLIGHT)]
    max_requests_inflight: usize,
    /// Mutating requests served at once; more are answered 429 (0: no limit).
    #[arg(long, default_value_t = skiff_apiserver::filters::DEFAULT_MAX_MUTATING_REQUESTS_INFLIGHT)]
    max_mutating_requests_inflight: usize,
    /// Client connections open at once; more wait to be accepted (0: the open-file limit less
    /// 1024).
    #[arg(long, default_value_t = 0)]
    max_connections: usize,
    /// How long a request's line and headers may take to arrive before the connection is closed.
    #[arg(long, default_value = "32s", value_parser = parse_duration)]
    header_read_timeout: std::time::Duration,
}

/// Upstream's audit flags. The log is on by default, under the data dir.
#[derive(clap::Args, Clone)]
struct AuditArgs {
    /// An audit.k8s.io/v1 Policy (default: Metadata for every request but health checks and
    /// node heartbeats).
    #[arg(long)]
    audit_policy_file: Option<PathBuf>,
    /// Where the audit log goes: a file, `-` for standard output, empty for none
    /// (default DATA_DIR/audit/audit.log).
    #[arg(long)]
    audit_log_path: Option<String>,
    /// Days rotated audit logs are kept (0: no limit).
    #[arg(long, default_value_t = 0)]
    audit_log_maxage: u64,
    /// Rotated audit logs kept (0: no limit).
    #[arg(long, default_value_t = 5)]
    audit_log_maxbackup: usize,
    /// Megabytes an audit log grows to before it is rotated (0: never).
    #[arg(long, default_value_t = 100)]
    audit_log_maxsize: u64,
}

/// The node agent's flags: its Service roles and the kubelet's eviction thresholds.
#[derive(clap::Args, Clone)]
struct AgentArgs {
    /// Hard eviction thresholds (SIGNAL<QUANTITY,...), against which the node reports
    /// MemoryPressure, DiskPressure and PIDPressure.
    #[arg(long, default_value = skiff_agent::eviction::DEFAULT_EVICTION_HARD)]
    eviction_hard: String,
    /// Do not run the service proxy (kube-proxy's role) on this node.
    #[arg(long)]
    disable_kube_proxy: bool,
    /// Do not serve cluster DNS on this node (pods then use the node's resolvers).
    #[arg(long)]
    disable_cluster_dns: bool,
    /// Where the local-path provisioner keeps this node's volumes (default DATA_DIR/storage, the
    /// agent's data dir).
    #[arg(long)]
    default_storage_path: Option<PathBuf>,
    /// The address this node publishes as its InternalIP (default: the source address of this
    /// host's default route).
    #[arg(long)]
    node_ip: Option<std::net::IpAddr>,
    /// The cluster's pod range (Nodes' podCIDRs come from it).
    #[arg(long, default_value = "10.244.0.0/16")]
    cluster_cidr: skiff_api::cidr::Ipv4Cidr,
}

impl AgentArgs {
    fn thresholds(&self) -> anyhow::Result<Vec<skiff_agent::eviction::Threshold>> {
        skiff_agent::eviction::parse_thresholds(&self.eviction_hard).context("parsing --eviction-hard")
    }

    fn config(&self) -> skiff_agent::service_network::ServiceNetworkConfig {
        skiff_agent::service_network::ServiceNetworkConfig {
            proxy: !self.disable_kube_proxy,
            dns: !self.disable_cluster_dns,
        }
    }

    /// Applies the flags to an agent's configuration.
    fn apply(&self, cfg: &mut skiff_agent::AgentConfig) -> anyhow::Result<()> {
        cfg.services = self.config();
        cfg.eviction_hard = self.thresholds()?;
        if let Some(path) = &self.default_storage_path {
            cfg.storage_path = path.clone();
        }
        if self.node_ip.is_some() {
            cfg.node_ip = self.node_ip;
        }
        cfg.cluster_cidr = self.cluster_cidr;
        Ok(())
    }
}

/// The node lifecycle controller's flags, as kube-controller-manager's.
#[derive(clap::Args, Clone)]
struct NodeLifecycleArgs {
    /// How often node health is checked.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    node_monitor_period: std::time::Duration,
    /// How long a node may go without a heartbeat before it is marked Unknown.
    #[arg(long, default_value = "50s", value_parser = parse_duration)]
    node_monitor_grace_period: std::time::Duration,
    /// The same for a node that never posted its Ready condition.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    node_startup_grace_period: std::time::Duration,
    /// Nodes per second tainted NoExecute in a healthy zone.
    #[arg(long, default_value_t = 0.1)]
    node_eviction_rate: f64,
    /// Nodes per second tainted NoExecute in an unhealthy zone of a large cluster.
    #[arg(long, default_value_t = 0.01)]
    secondary_node_eviction_rate: f64,
    /// Share of not-Ready nodes (more than two) that makes a zone unhealthy.
    #[arg(long, default_value_t = 0.55)]
    unhealthy_zone_threshold: f64,
    /// Zones of at most this many nodes get no evictions while unhealthy.
    #[arg(long, default_value_t = 50)]
    large_cluster_size_threshold: usize,
    /// Terminated pods kept before the oldest are deleted (0: all are kept).
    #[arg(long, default_value_t = 12_500)]
    terminated_pod_gc_threshold: usize,
}

impl NodeLifecycleArgs {
    fn config(&self) -> skiff_controllers::nodelifecycle::NodeLifecycleConfig {
        skiff_controllers::nodelifecycle::NodeLifecycleConfig {
            monitor_period: self.node_monitor_period,
            grace_period: self.node_monitor_grace_period,
            startup_grace_period: self.node_startup_grace_period,
            eviction_rate: self.node_eviction_rate,
            secondary_eviction_rate: self.secondary_node_eviction_rate,
            unhealthy_zone_threshold: self.unhealthy_zone_threshold,
            large_cluster_threshold: self.large_cluster_size_threshold,
        }
    }
}

/// The etcd backend (kube-apiserver's flags); without `--etcd-servers` the store is SQLite in the
/// data dir.
#[derive(clap::Args, Debug, Clone)]
struct EtcdArgs {
    /// etcd client URLs, comma-separated: keep the cluster's objects in etcd instead of SQLite
    /// (several API servers can then share it).
    #[arg(long, value_delimiter = ',')]
    etcd_servers: Vec<String>,
    /// The prefix of every key in etcd.
    #[arg(long, default_value = "/registry")]
    etcd_prefix: String,
    /// CA bundle to verify etcd's serving certificate.
    #[arg(long)]
    etcd_cafile: Option<PathBuf>,
    /// Client certificate for etcd.
    #[arg(long)]
    etcd_certfile: Option<PathBuf>,
    /// Client key for etcd.
    #[arg(long)]
    etcd_keyfile: Option<PathBuf>,
    /// How often the store's history is compacted, up to the revision seen an interval
    /// before (0s: never); on etcd one API server per interval does it.
    #[arg(long, default_value = "5m", value_parser = parse_duration_or_zero)]
    etcd_compaction_interval: std::time::Duration,
}

impl EtcdArgs {
    /// The etcd store these flags ask for, if any.
    fn config(&self) -> Option<skiff_apiserver::EtcdConfig> {
        (!self.etcd_servers.is_empty()).then(|| skiff_apiserver::EtcdConfig {
            endpoints: self.etcd_servers.clone(),
            prefix: self.etcd_prefix.clone(),
            ca_file: self.etcd_cafile.clone(),
            cert_file: self.etcd_certfile.clone(),
            key_file: self.etcd_keyfile.clone(),
        })
    }
}

/// A duration as Go writes them: `500ms`, `5s`, `1m`, `1h` (or bare seconds).
pub(crate) fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{s:?} is not a duration such as 40s"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "s" | "" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (ms, s, m, h)")),
    };
    if !seconds.is_finite() || seconds <= 0.0 {
        return Err(format!("{s:?} must be positive"));
    }
    Ok(std::time::Duration::from_secs_f64(seconds))
}

/// As [`parse_duration`], where zero means "never".
fn parse_duration_or_zero(s: &str) -> Result<std::time::Duration, String> {
    match s.trim().trim_end_matches(['s', 'm', 'h']) {
        "0" => Ok(std::time::Duration::ZERO),
        _ => parse_duration(s),
    }
}

#[derive(clap::Args, Clone)]
struct SimArgs {
    #[arg(long)]
    kubeconfig: PathBuf,
    #[arg(long)]
    nodes: usize,
    #[arg(long, default_value = "4")]
    cpu: String,
    #[arg(long, default_value = "16Gi")]
    memory: String,
    #[arg(long, default_value_t = 110)]
    pods: u32,
    #[arg(long, default_value = "sim-node-")]
    name_prefix: String,
    /// Extra labels, k=v,k2=v2.
    #[arg(long, default_value = "")]
    labels: String,
}

#[derive(Subcommand)]
enum ImagesCommand {
    /// Build busybox:latest and the pause image from local packages.
    Build,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    skiff_store::set_release_memory(release_memory);
    // Before any thread starts, so every thread and child process is in it.
    if matches!(cli.command, Command::Bench(bench::BenchCommand::Services { .. })) {
        bench_services::enter_private_network()?;
    }
    // Before the runtime and clients allocate. A node agent's heap is small and stays small; the
    // API server's and the scheduler's churn, and each 2 MiB page the kernel zeroes whole when the
    // allocator returns and takes it back again (measured: 12% of the server's CPU time and 15% of
    // the scheduling benchmark's).
    if let Err(e) = skiff_agent::disable_transparent_huge_pages() {
        tracing::warn!(error = %e, "could not disable transparent huge pages");
    }
    // The scheduler is one loop that owns its cache and queue; on a thread of its own with its
    // API calls it trades no work between threads (no cross-thread wake-ups or frees). The agent
    // waits on the engine and the API server; every thread more keeps a heap of its own.
    let single_threaded = matches!(
        cli.command,
        Command::Agent { .. } | Command::Scheduler { .. } | Command::Bench(bench::BenchCommand::Scheduling { .. })
    );
    let mut runtime = if single_threaded {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    #[cfg(feature = "mimalloc")]
    runtime.on_thread_park(collect_on_park);
    let rt = runtime.enable_all().build().context("starting the async runtime")?;
    let result = rt.block_on(run(cli));
    // Tasks still running (a request's handler past the grace period) are dropped where they
    // wait; a blocking call is not waited for past this.
    rt.shutdown_timeout(std::time::Duration::from_millis(500));
    result
}

fn default_data_dir() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."))
        .join(".skiff")
}

fn parse_labels(s: &str) -> anyhow::Result<std::collections::BTreeMap<String, String>> {
    let mut out = std::collections::BTreeMap::new();
    for part in s.split(',').filter(|p| !p.trim().is_empty()) {
        let (k, v) = part
            .split_once('=')
            .with_context(|| format!("label {part:?} is not key=value"))?;
        out.insert(k.trim().to_string(), v.trim().to_string());
    }
    Ok(out)
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Server(args) => server(*args).await,
        Command::Scheduler { kubeconfig } => {
            let client = client::kube_client_h2(&kubeconfig).await?;
            skiff_scheduler::run(client, Default::default()).await
        }
        Command::Agent {
            kubeconfig,
            server,
            token,
            node_name,
            data_dir,
            agent,
        } => {
            let mut cfg =
                skiff_agent::AgentConfig::for_this_host(data_dir.unwrap_or_else(|| default_data_dir().join("agent")));
            if let Some(n) = node_name {
                cfg.node_name = n;
            }
            agent.apply(&mut cfg)?;
            if let Some(kubeconfig) = kubeconfig {
                let config = client::kube_config(&kubeconfig).await?;
                let client = kube::Client::try_from(config.clone()).context("building the API client")?;
                cfg.kubeconfig = Some(kubeconfig);
                return skiff_agent::run(client, skiff_agent::parts::Parts::Tokens(Box::new(config)), cfg).await;
            }
            let join = skiff_agent::bootstrap::Join {
                server: server.context("--server or --kubeconfig is required")?,
                token,
                node_name: cfg.node_name.clone(),
                data_dir: cfg.data_dir.clone(),
            };
            let identity = skiff_agent::bootstrap::join(&join).await?;
            cfg.cluster_ca_pem = Some(identity.ca_pem.clone());
            let rotating = skiff_agent::certificate_manager::RotatingClient::new(identity.client().await?);
            let parts = skiff_agent::parts::Parts::Tokens(Box::new(identity.config().await?));
            let paths = skiff_agent::bootstrap::Paths::new(&cfg.data_dir);
            tokio::spawn(skiff_agent::certificate_manager::run(identity, paths, rotating.clone()));
            skiff_agent::run(rotating.client(), parts, cfg).await
        }
        Command::Sim(a) => {
            let client = client::kube_client(&a.kubeconfig).await?;
            let cfg = skiff_agent::sim::SimConfig {
                nodes: a.nodes,
                cpu: a.cpu,
                memory: a.memory,
                pods: a.pods,
                name_prefix: a.name_prefix,
                labels: parse_labels(&a.labels)?,
            };
            skiff_agent::sim::run(client, cfg).await
        }
        Command::Explain {
            kind,
            name,
            namespace,
            kubeconfig,
        } => {
            let path = kubeconfig.unwrap_or_else(|| default_data_dir().join("kubeconfig"));
            let client = client::kube_client(&path).await?;
            if matches!(kind.as_str(), "service" | "services" | "svc") {
                return explain_service(client, &namespace, &name).await;
            }
            anyhow::ensure!(
                kind == "pod" || kind == "pods" || kind == "po",
                "only pods and services can be explained"
            );
            let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::namespaced(client, &namespace);
            let pod = pods
                .get(&name)
                .await
                .with_context(|| format!("getting pod {namespace}/{name}"))?;
            match skiff_scheduler::Explain::from_pod(&pod) {
                Some(e) => print!(
                    "{}",
                    skiff_scheduler::render_explain(&format!("{namespace}/{name}"), &e)
                ),
                None => println!("pod {namespace}/{name} has no recorded scheduling attempt"),
            }
            Ok(())
        }
        Command::Bench(b) => bench::run(b).await,
        Command::Audit(AuditCommand::Security { kubeconfig }) => {
            let path = kubeconfig.unwrap_or_else(|| default_data_dir().join("kubeconfig"));
            let client = client::kube_client(&path).await?;
            let findings = audit_security::run(client).await?;
            audit_security::print(&findings);
            Ok(())
        }
        Command::Auth(AuthCommand::Why {
            user,
            groups,
            verb,
            resource,
            name,
            namespace,
            kubeconfig,
        }) => {
            let path = kubeconfig.unwrap_or_else(|| default_data_dir().join("kubeconfig"));
            let client = client::kube_client(&path).await?;
            let query = auth_why::Query {
                user,
                groups,
                verb,
                resource,
                name,
                namespace,
            };
            auth_why::run(client, query).await
        }
        Command::Kubeconfig(k) => {
            let (user, group, target) = match k {
                KubeconfigCommand::User { name, group, target } => (name, group, target),
                KubeconfigCommand::Node { name, target } => {
                    (format!("system:node:{name}"), Some("system:nodes".to_string()), target)
                }
            };
            let dir = target.data_dir.unwrap_or_else(default_data_dir);
            let text = skiff_apiserver::pki::user_kubeconfig(&dir, target.server.as_deref(), &user, group.as_deref())?;
            print!("{text}");
            Ok(())
        }
        Command::Token { command, kubeconfig } => {
            let path = kubeconfig.unwrap_or_else(|| default_data_dir().join("kubeconfig"));
            let client = client::kube_client(&path).await?;
            token::run(client, command).await
        }
        Command::SecretsEncrypt { command, kubeconfig } => {
            use skiff_apiserver::encryption::Command as Op;
            let path = kubeconfig.unwrap_or_else(|| default_data_dir().join("kubeconfig"));
            let client = client::kube_client(&path).await?;
            let op = match command {
                SecretsEncryptCommand::Status => Op::Status,
                SecretsEncryptCommand::RotateKeys => Op::RotateKeys,
                SecretsEncryptCommand::Reencrypt => Op::Reencrypt,
            };
            print!("{}", skiff_apiserver::encryption::request(client, op).await?);
            Ok(())
        }
        Command::Cluster { command, dir } => cluster(command, dir.unwrap_or_else(skiff_cluster::default_dir)).await,
        Command::Images(ImagesCommand::Build) => {
            let docker = skiff_agent::docker::connect().await?;
            skiff_agent::build_local_images(&docker).await
        }
        Command::Uninstall { data_dir, data } => uninstall(&data_dir.unwrap_or_else(default_data_dir), data).await,
    }
}

/// `skiff uninstall`: each thing removed is printed; a step that fails is reported and the
/// others still run, and the command then fails.
async fn uninstall(data_dir: &std::path::Path, data: bool) -> anyhow::Result<()> {
    let mut failed = Vec::new();
    let clusters = data_dir.join("clusters");
    for c in skiff_cluster::list(&clusters).unwrap_or_default() {
        match skiff_cluster::delete(&clusters, &c.name).await {
            Ok(_) => println!("removed: cluster {}", c.name),
            Err(e) => failed.push(format!("cluster {}: {e:#}", c.name)),
        }
    }
    for dir in [data_dir.join("agent"), data_dir.to_path_buf()] {
        if !skiff_agent::host_record::HostRecord::path(&dir).exists() {
            continue;
        }
        let report = skiff_agent::uninstall::uninstall(&dir).await?;
        for line in report.removed {
            println!("removed: {line}");
        }
        failed.extend(report.failed);
    }
    if data && data_dir.exists() {
        match skiff_agent::uninstall::remove_data_dir(data_dir) {
            Ok(()) => println!("removed: {}", data_dir.display()),
            Err(e) => failed.push(format!("{}: {e:#}", data_dir.display())),
        }
    }
    if !failed.is_empty() {
        anyhow::bail!("some of Skiff is still on this machine:\n  {}", failed.join("\n  "));
    }
    println!("skiff: uninstalled");
    Ok(())
}

async fn cluster(command: ClusterCommand, dir: PathBuf) -> anyhow::Result<()> {
    match command {
        ClusterCommand::Create {
            nodes,
            name,
            server_args,
            agent_args,
            images,
            timeout,
        } => {
            let started = std::time::Instant::now();
            let opts = skiff_cluster::CreateOptions {
                name,
                nodes,
                server_args,
                agent_args,
                images,
                skiff: std::env::current_exe().context("finding this binary")?,
                timeout,
            };
            let c = skiff_cluster::create(&dir, opts).await?;
            let kubeconfig = c.kubeconfig();
            println!(
                "skiff: cluster {} ready in {:.1} s: {} nodes on {}",
                c.name,
                started.elapsed().as_secs_f64(),
                c.nodes.len(),
                c.subnet()
            );
            println!("skiff: kubeconfig written to {}", kubeconfig.display());
            println!("skiff: export KUBECONFIG={}", kubeconfig.display());
            Ok(())
        }
        ClusterCommand::Delete { name } => {
            if skiff_cluster::delete(&dir, &name).await? {
                println!("skiff: cluster {name} deleted");
            } else {
                println!("skiff: no cluster {name} in {}", dir.display());
            }
            Ok(())
        }
        ClusterCommand::List => {
            let clusters = skiff_cluster::list(&dir)?;
            if clusters.is_empty() {
                println!("No clusters found.");
                return Ok(());
            }
            println!("{:<20} {:<6} {:<16} {:<8}", "NAME", "NODES", "NETWORK", "RUNNING");
            for c in clusters {
                let running = c.nodes.iter().filter(|n| skiff_cluster::node_running(&c, n)).count();
                println!(
                    "{:<20} {:<6} {:<16} {:<8}",
                    c.name,
                    c.nodes.len(),
                    c.subnet(),
                    format!("{running}/{}", c.nodes.len())
                );
            }
            Ok(())
        }
        ClusterCommand::Node {
            command: ClusterNodeCommand::Stop { node, name },
        } => {
            skiff_cluster::stop_node(&dir, &name, &node).await?;
            println!("skiff: node {node} stopped");
            Ok(())
        }
        ClusterCommand::Node {
            command: ClusterNodeCommand::Start { node, name, timeout },
        } => {
            skiff_cluster::start_node(&dir, &name, &node, timeout).await?;
            println!("skiff: node {node} Ready");
            Ok(())
        }
    }
}

async fn explain_service(client: kube::Client, namespace: &str, name: &str) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::{Pod, Service};
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    let svc = kube::Api::<Service>::namespaced(client.clone(), namespace)
        .get(name)
        .await
        .with_context(|| format!("getting service {namespace}/{name}"))?;
    let pods = kube::Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&Default::default())
        .await
        .context("listing pods")?
        .items;
    let slices = kube::Api::<EndpointSlice>::namespaced(client, namespace)
        .list(&kube::api::ListParams::default().labels(&format!("kubernetes.io/service-name={name}")))
        .await
        .context("listing EndpointSlices")?
        .items;
    print!("{}", skiff_controllers::service_explain::explain(&svc, &pods, &slices));
    print!("{}", skiff_agent::dns::explain_service(&svc, &slices, "cluster.local"));
    Ok(())
}

async fn server(args: ServerArgs) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    // As Go's runtime does: many idle connections must not exhaust a low soft limit.
    match skiff_apiserver::serving::raise_open_file_limit() {
        Ok(limit) => tracing::debug!(limit, "open file limit"),
        Err(e) => tracing::warn!(error = %e, "could not raise the open file limit"),
    }
    // Registered before anything starts, so a SIGTERM during start-up is not fatal to a write.
    let mut sigterm =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).context("listening for SIGTERM")?;
    // With leader election, each elected part runs only while this process holds its Lease
    // (its identity is this process's), and its clients refuse writes once it may not.
    // Checked before anything starts.
    let election = args.leader_election.config(store_is_shared(&args))?;
    skiff_api::registry::serve_removed(args.serve_removed_apis);
    let data_dir = args.data_dir.clone().unwrap_or_else(default_data_dir);
    let mut opts = skiff_apiserver::ServerOptions::new(data_dir.clone(), args.port);
    opts.kubeconfig = args.write_kubeconfig.clone();
    if let Some(bind) = args.bind_address {
        opts.bind = bind;
    }
    opts.endpoint_reconciler = skiff_apiserver::reconcilers::ReconcilerOptions {
        kind: args.endpoint_reconciler_type,
        ttl: args.master_endpoint_reconcile_ttl,
        ..Default::default()
    };
    opts.service_ranges = skiff_apiserver::allocator::ServiceRanges::parse(
        &args.service_cluster_ip_range,
        &args.service_node_port_range,
    )?;
    opts.advertise_address = Some(args.advertise_address.unwrap_or_else(skiff_agent::node::detect_host_ip));
    opts.audit = skiff_apiserver::audit::AuditOptions {
        policy_file: args.audit.audit_policy_file.clone(),
        log_path: args.audit.audit_log_path.clone().map(PathBuf::from),
        max_age_days: args.audit.audit_log_maxage,
        max_backups: args.audit.audit_log_maxbackup,
        max_size_mb: args.audit.audit_log_maxsize,
    };
    opts.encryption_provider_config = args.encryption_provider_config.clone();
    opts.admission_control_config_file = args.admission_control_config_file.clone();
    opts.local_storage = !args.disable_local_storage;
    opts.compaction_interval = args.etcd.etcd_compaction_interval;
    opts.limits = skiff_apiserver::filters::Limits {
        request_timeout: args.serving.request_timeout,
        max_requests_inflight: args.serving.max_requests_inflight,
        max_mutating_requests_inflight: args.serving.max_mutating_requests_inflight,
    };
    opts.serving = skiff_apiserver::serving::ServingOptions {
        max_connections: args.serving.max_connections,
        header_read_timeout: args.serving.header_read_timeout,
        ..Default::default()
    };
    skiff_api::defaults::set_default_toleration_seconds(
        args.default_not_ready_toleration_seconds,
        args.default_unreachable_toleration_seconds,
    );
    opts.etcd = args.etcd.config();
    let running = skiff_apiserver::start(opts).await?;
    println!("skiff: API server listening on {}", running.url);
    println!("skiff: kubeconfig written to {}", running.kubeconfig.display());
    println!("skiff: export KUBECONFIG={}", running.kubeconfig.display());
    println!(
        "skiff: join other nodes with: skiff agent --server {} --token {}",
        running.join_url, running.join_token
    );
    let ready_line = ReadyLine {
        started,
        kubeconfig: running.kubeconfig.clone(),
        join: format!(
            "skiff agent --server {} --token {}",
            running.join_url, running.join_token
        ),
    };
    // Each part calls the API server in-process as its upstream identity, with what RBAC
    // grants that identity and nothing more.
    let client_as = {
        let state = running.state.clone();
        move |identity| skiff_apiserver::client_as(state.clone(), identity)
    };
    let nodeipam = args
        .allocate_node_cidrs
        .then(|| skiff_controllers::nodeipam::NodeIpamConfig {
            cluster_cidr: args.agent.cluster_cidr,
            node_cidr_mask_size: args.node_cidr_mask_size,
            service_cidr: args.service_cluster_ip_range.parse().ok(),
        });
    if let Some(config) = &nodeipam {
        // Refused at start, as kube-controller-manager refuses its flags.
        skiff_controllers::nodeipam::CidrSet::new(config.cluster_cidr, config.node_cidr_mask_size)?;
    }
    let mut tasks = tokio::task::JoinSet::new();
    let elected = Elected::new(election, &running);
    if !args.no_controllers {
        running.state.components.runs("controller-manager");
        let cfg = skiff_controllers::ControllersConfig {
            root_ca_pem: Some(running.state.pki.ca_cert_pem.clone()),
            // The signer runs here, beside the CA's key.
            csr_signing: Some(skiff_controllers::csrsigning::SigningConfig {
                ca_cert_pem: running.state.pki.ca_cert_pem.clone(),
                ca_key_pem: running.state.pki.ca_key_pem.clone(),
                duration: args.cluster_signing_duration,
            }),
            nodelifecycle: Some(args.node_lifecycle.config()),
            nodeipam: nodeipam.clone(),
            podgc: Some(skiff_controllers::podgc::PodGcConfig {
                terminated_pod_threshold: args.node_lifecycle.terminated_pod_gc_threshold,
                ..Default::default()
            }),
            resource_quota: Some(skiff_controllers::resource_quota::ResourceQuotaConfig {
                resync: args.resource_quota_sync_period,
            }),
            ..Default::default()
        };
        let state = running.state.clone();
        elected.spawn(
            &mut tasks,
            "kube-controller-manager",
            skiff_apiserver::identities::controller_manager(),
            move |term| {
                let (state, cfg) = (state.clone(), cfg.clone());
                async move {
                    let clients = move |name: &str| match &term {
                        Some(term) => term.client(skiff_apiserver::controller_service(state.clone(), name)),
                        None => skiff_apiserver::controller_client(state.clone(), name),
                    };
                    skiff_controllers::run(clients, cfg).await.context("controllers")
                }
            },
        )?;
    }
    if !args.no_scheduler {
        running.state.components.runs("scheduler");
        let state = running.state.clone();
        elected.spawn(
            &mut tasks,
            "kube-scheduler",
            skiff_apiserver::identities::scheduler(),
            move |term| {
                let c = Elected::client(&state, skiff_apiserver::identities::scheduler(), term.as_ref());
                async move { skiff_scheduler::run(c, Default::default()).await.context("scheduler") }
            },
        )?;
    }
    if args.sim_nodes > 0 {
        let state = running.state.clone();
        let cfg = skiff_agent::sim::SimConfig {
            nodes: args.sim_nodes,
            ..Default::default()
        };
        elected.spawn(
            &mut tasks,
            "skiff-sim",
            skiff_apiserver::identities::node_simulator(),
            move |term| {
                let c = Elected::client(&state, skiff_apiserver::identities::node_simulator(), term.as_ref());
                let cfg = cfg.clone();
                async move { skiff_agent::sim::run(c, cfg).await.context("simulated nodes") }
            },
        )?;
    }
    if !args.no_agent {
        match skiff_agent::docker::connect().await {
            Ok(_) => {
                let mut cfg = skiff_agent::AgentConfig::for_this_host(data_dir.join("agent"));
                if let Some(n) = &args.node_name {
                    cfg.node_name = n.clone();
                }
                let c = client_as(skiff_apiserver::identities::node(&cfg.node_name));
                let part = |account| client_as(skiff_apiserver::identities::node_part(&cfg.node_name, account));
                let parts = skiff_agent::parts::Parts::Given {
                    network: part(skiff_rbac::skiff_policy::NODE_NETWORK_SA),
                    volumes: part(skiff_rbac::skiff_policy::LOCAL_PATH_PROVISIONER_SA),
                };
                cfg.cluster_ca_pem = Some(running.state.pki.ca_cert_pem.clone());
                args.agent.apply(&mut cfg)?;
                // The node IPAM controller runs in this process, or nothing will give a podCIDR.
                if nodeipam.is_none() || args.no_controllers {
                    cfg.pod_cidr_wait = std::time::Duration::ZERO;
                }
                let node = cfg.node_name.clone();
                tasks.spawn(async move { skiff_agent::run(c, parts, cfg).await.context("node agent") });
                tokio::spawn(summarize(running.state.clone(), ready_line, Some(node)));
            }
            Err(e) => {
                tracing::warn!(error = %e, "no Docker Engine reachable: running without a local node");
                tokio::spawn(summarize(running.state.clone(), ready_line, None));
            }
        }
    } else {
        tokio::spawn(summarize(running.state.clone(), ready_line, None));
    }
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupted, shutting down"),
        _ = sigterm.recv() => tracing::info!("terminated, shutting down"),
        Some(res) = tasks.join_next() => {
            return match res {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(e),
                Err(e) => Err(anyhow::anyhow!("a component panicked: {e}")),
            };
        }
    }
    shut_down(&running, &elected, tasks).await;
    Ok(())
}

/// What the one line that says the cluster is usable names.
struct ReadyLine {
    started: std::time::Instant,
    kubeconfig: PathBuf,
    join: String,
}

/// Prints one line once the cluster is usable: where its kubeconfig is, the local node's state
/// (Ready, or what it is after two minutes of waiting) and the command that joins other nodes.
async fn summarize(state: std::sync::Arc<skiff_apiserver::ApiState>, line: ReadyLine, node: Option<String>) {
    use k8s_openapi::api::core::v1::Node;
    let node_state = match &node {
        None => "no local node".to_string(),
        Some(name) => {
            let nodes: kube::Api<Node> = kube::Api::all(skiff_apiserver::client(state));
            let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(120);
            loop {
                let ready = nodes.get_opt(name).await.ok().flatten().and_then(|n| {
                    let conditions = n.status?.conditions?;
                    conditions
                        .into_iter()
                        .find(|c| c.type_ == "Ready")
                        .map(|c| c.status == "True")
                });
                if ready == Some(true) {
                    break format!("node {name} Ready");
                }
                if tokio::time::Instant::now() >= deadline {
                    break format!("node {name} not Ready after 2m (kubectl describe node {name})");
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    };
    println!(
        "skiff: ready in {:.1}s: export KUBECONFIG={}; {node_state}; join other nodes with: {}",
        line.started.elapsed().as_secs_f64(),
        line.kubeconfig.display(),
        line.join
    );
}

/// Whether other servers may share this server's store: what `--leader-elect` defaults to.
/// The embedded SQLite store is this process's alone (as k3s' single server, which does not
/// elect); a store shared by several servers (etcd) is.
fn store_is_shared(args: &ServerArgs) -> bool {
    !args.etcd.etcd_servers.is_empty()
}

/// The parts of `skiff server` that run on one replica at a time: with leader election, each
/// while this process holds its Lease in kube-system, else always.
struct Elected {
    config: Option<skiff_leaderelection::Config>,
    identity: String,
    state: std::sync::Arc<skiff_apiserver::ApiState>,
    /// Set on shutdown: the holders stop their parts and release their Leases.
    stop: tokio::sync::watch::Sender<bool>,
}

impl Elected {
    fn new(config: Option<skiff_leaderelection::Config>, running: &skiff_apiserver::Running) -> Elected {
        Elected {
            config,
            identity: skiff_leaderelection::identity(),
            state: running.state.clone(),
            stop: tokio::sync::watch::channel(false).0,
        }
    }

    /// An in-process client as `identity`, gated by the term's fence if there is one.
    fn client(
        state: &std::sync::Arc<skiff_apiserver::ApiState>,
        identity: skiff_apiserver::tls::Identity,
        term: Option<&skiff_leaderelection::Term>,
    ) -> kube::Client {
        match term {
            Some(term) => term.client(skiff_apiserver::service_as(state.clone(), identity)),
            None => skiff_apiserver::client_as(state.clone(), identity),
        }
    }

    /// Run the part `start` makes: at once without leader election (`start(None)`), else on
    /// each term this process wins of the Lease `kube-system/LEASE`, contested as
    /// `elector_identity` (upstream's component's own user, which RBAC lets update that Lease).
    fn spawn<F, Fut>(
        &self,
        tasks: &mut tokio::task::JoinSet<anyhow::Result<()>>,
        lease: &str,
        elector_identity: skiff_apiserver::tls::Identity,
        mut start: F,
    ) -> anyhow::Result<()>
    where
        F: FnMut(Option<skiff_leaderelection::Term>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        let Some(config) = self.config else {
            tasks.spawn(start(None));
            return Ok(());
        };
        let elector = skiff_leaderelection::LeaderElector::new(
            skiff_apiserver::client_as(self.state.clone(), elector_identity),
            "kube-system",
            lease,
            self.identity.clone(),
            config,
        )?
        .with_events(lease);
        let mut stop = self.stop.subscribe();
        // Held until the Lease is released: shutdown waits for every one to go.
        let releasing = self.stop.subscribe();
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
        let lease = lease.to_string();
        tasks.spawn(async move {
            let _releasing = releasing;
            skiff_leaderelection::run(
                elector,
                threads,
                async move {
                    let _ = stop.wait_for(|stop| *stop).await;
                },
                move |term| start(Some(term)),
            )
            .await
            .with_context(|| format!("leader election for kube-system/{lease}"))
        });
        Ok(())
    }
}

/// The whole shutdown takes at most this long.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(4);

/// Upstream's graceful termination, bounded by [`SHUTDOWN_GRACE`]: no new connections, the
/// components stopped where they wait (the node agent leaves its containers running: a new
/// agent finds them by their labels), the requests in flight answered (their writes are
/// committed before they answer), then the connections still open (watches) closed.
async fn shut_down(
    running: &skiff_apiserver::Running,
    elected: &Elected,
    mut tasks: tokio::task::JoinSet<anyhow::Result<()>>,
) {
    let started = tokio::time::Instant::now();
    let deadline = started + SHUTDOWN_GRACE;
    running.stop_accepting();
    // Out of the kubernetes Service's endpoints at once, not after the TTL.
    if tokio::time::timeout(SHUTDOWN_GRACE / 4, running.remove_endpoints())
        .await
        .is_err()
    {
        tracing::warn!("not removed from the kubernetes Service's endpoints in time");
    }
    if elected.config.is_some() {
        // Leaders stop their parts and release their Leases (upstream's ReleaseOnCancel), so a
        // standby takes over at once; the rest of the grace is kept for the requests.
        elected.stop.send_replace(true);
        // Each holder drops its receiver once it has released.
        if tokio::time::timeout(SHUTDOWN_GRACE / 2, elected.stop.closed())
            .await
            .is_err()
        {
            tracing::warn!("leases not released in time");
        }
    }
    tasks.abort_all();
    let components = tokio::time::timeout_at(deadline, async { while tasks.join_next().await.is_some() {} }).await;
    if components.is_err() {
        tracing::warn!("components did not stop in time");
    }
    let drained = running.drain(deadline).await;
    if !drained {
        tracing::warn!(
            requests = running.state.filters.in_flight(),
            "requests still in flight at the end of the grace period"
        );
    }
    running.close_connections();
    tracing::info!(elapsed = ?started.elapsed(), "stopped");
}
