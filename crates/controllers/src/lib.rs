//! Controllers, one file per controller named as upstream's: they talk to the API only
//! (list + watch + write), never to the store.

pub mod clusterroleaggregation;
pub mod controller_utils;
pub mod cronjob;
pub mod csrapproving;
pub mod csrcleaner;
pub mod csrsigning;
pub mod daemonset;
pub mod deployment;
pub mod disruption;
pub mod endpoints;
pub mod endpointslice;
pub mod endpointutil;
pub mod garbagecollector;
pub mod history;
pub mod informers;
pub mod job;
pub mod metrics;
pub mod namespace;
pub mod nodeipam;
pub mod nodelifecycle;
pub mod persistentvolume;
pub mod podautoscaler;
pub mod podgc;
pub mod protectionutil;
pub mod pvcprotection;
pub mod pvprotection;
pub mod replicaset;
pub mod replication;
pub mod resource_quota;
pub mod resources;
pub mod rootcacertpublisher;
pub mod service_explain;
pub mod serviceaccounts;
pub mod servicelb;
pub mod statefulset;
pub mod tainteviction;
pub mod tokencleaner;

/// Which controllers run.
#[derive(Clone, Debug)]
pub struct ControllersConfig {
    pub garbage_collector: bool,
    pub namespace: bool,
    pub replicaset: bool,
    /// ReplicationControllers, by the ReplicaSet controller's logic.
    pub replication: bool,
    pub deployment: bool,
    pub daemonset: bool,
    pub job: bool,
    pub statefulset: bool,
    pub cronjob: bool,
    pub persistentvolume: bool,
    /// Claims being deleted keep their `kubernetes.io/pvc-protection` finalizer while pods use them.
    pub pvc_protection: bool,
    /// Volumes being deleted keep their `kubernetes.io/pv-protection` finalizer while Bound.
    pub pv_protection: bool,
    pub serviceaccounts: bool,
    pub endpointslice: bool,
    pub endpoints: bool,
    /// k3s' ServiceLB: LoadBalancer Services answered on the nodes' addresses.
    pub servicelb: bool,
    /// Pods evicted from nodes with NoExecute taints they do not tolerate.
    pub tainteviction: bool,
    /// Nodes that stop reporting are tainted (and how soon); `None`: not run.
    pub nodelifecycle: Option<nodelifecycle::NodeLifecycleConfig>,
    /// Node IPAM: a podCIDR for every Node from the cluster CIDR; `None`: not run
    /// (`--allocate-node-cidrs=false`).
    pub nodeipam: Option<nodeipam::NodeIpamConfig>,
    /// Pods of gone nodes, excess terminated pods; `None`: not run.
    pub podgc: Option<podgc::PodGcConfig>,
    /// HorizontalPodAutoscalers scale their targets on resource metrics; `None`: not run.
    pub podautoscaler: Option<podautoscaler::PodAutoscalerConfig>,
    /// Aggregated ClusterRoles (admin, edit, view) collect the rules of the roles labelled for them.
    pub clusterroleaggregation: bool,
    /// The cluster CA (PEM) to publish as `kube-root-ca.crt` in every namespace; None: not published.
    pub root_ca_pem: Option<String>,
    /// Certificate requests: node client requests approved, approved ones signed with this CA,
    /// old ones cleaned; `None`: none of the three runs.
    pub csr_signing: Option<csrsigning::SigningConfig>,
    /// Expired bootstrap token Secrets are deleted.
    pub tokencleaner: bool,
    /// ResourceQuotas' status follows their namespaces' usage; `None`: not run.
    pub resource_quota: Option<resource_quota::ResourceQuotaConfig>,
    /// PodDisruptionBudgets' status says how many of their pods may be evicted now.
    pub disruption: bool,
}

impl Default for ControllersConfig {
    fn default() -> Self {
        ControllersConfig {
            garbage_collector: true,
            namespace: true,
            replicaset: true,
            replication: true,
            deployment: true,
            daemonset: true,
            job: true,
            statefulset: true,
            cronjob: true,
            persistentvolume: true,
            pvc_protection: true,
            pv_protection: true,
            serviceaccounts: true,
            endpointslice: true,
            endpoints: true,
            servicelb: true,
            tainteviction: true,
            clusterroleaggregation: true,
            nodelifecycle: Some(Default::default()),
            nodeipam: None,
            podgc: Some(Default::default()),
            podautoscaler: Some(Default::default()),
            root_ca_pem: None,
            csr_signing: None,
            tokencleaner: true,
            resource_quota: Some(Default::default()),
            disruption: true,
        }
    }
}

/// Run the enabled controllers until one fails.
/// Runs the enabled controllers. Each calls the API server as its own identity, as upstream's
/// `--use-service-account-credentials`: `clients(NAME)` is the client of the service account
/// `kube-system/NAME` whose `system:controller:NAME` role the bootstrap policy binds.
///
/// The workload controllers share one informer per kind (`informers.rs`): their lists and
/// watches are reads, made as `system:kube-controller-manager` by every controller's client.
pub async fn run(clients: impl Fn(&str) -> kube::Client, cfg: ControllersConfig) -> anyhow::Result<()> {
    let mut set = tokio::task::JoinSet::new();
    let informers = informers::SharedInformerFactory::new(clients("kube-controller-manager"));
    if cfg.garbage_collector {
        let c = clients("generic-garbage-collector");
        set.spawn(async move { garbagecollector::run(c).await });
    }
    if cfg.namespace {
        let c = clients("namespace-controller");
        set.spawn(async move { namespace::run(c).await });
    }
    if cfg.replicaset {
        let c = clients("replicaset-controller");
        let i = informers.clone();
        set.spawn(async move { replicaset::run(c, i).await });
    }
    if cfg.replication {
        let c = clients(replication::COMPONENT);
        let i = informers.clone();
        set.spawn(async move { replication::run(c, i).await });
    }
    if cfg.deployment {
        let c = clients("deployment-controller");
        let i = informers.clone();
        set.spawn(async move { deployment::run(c, i).await });
    }
    if cfg.daemonset {
        let c = clients("daemon-set-controller");
        let i = informers.clone();
        set.spawn(async move { daemonset::run(c, i).await });
    }
    if cfg.job {
        let c = clients("job-controller");
        let i = informers.clone();
        set.spawn(async move { job::run(c, i).await });
    }
    if cfg.statefulset {
        let c = clients("statefulset-controller");
        let i = informers.clone();
        set.spawn(async move { statefulset::run(c, i).await });
    }
    if cfg.cronjob {
        let c = clients("cronjob-controller");
        set.spawn(async move { cronjob::run(c).await });
    }
    if cfg.persistentvolume {
        let c = clients("persistent-volume-binder");
        set.spawn(async move { persistentvolume::run(c).await });
    }
    if cfg.pvc_protection {
        let c = clients("pvc-protection-controller");
        let i = informers.clone();
        set.spawn(async move { pvcprotection::run(c, i).await });
    }
    if cfg.pv_protection {
        let c = clients("pv-protection-controller");
        set.spawn(async move { pvprotection::run(c).await });
    }
    if cfg.serviceaccounts {
        let c = clients("service-account-controller");
        set.spawn(async move { serviceaccounts::run(c).await });
    }
    if cfg.endpointslice {
        let c = clients("endpointslice-controller");
        let i = informers.clone();
        set.spawn(async move { endpointslice::run(c, i).await });
    }
    if cfg.endpoints {
        let c = clients("endpoint-controller");
        let i = informers.clone();
        set.spawn(async move { endpoints::run(c, i).await });
    }
    if let Some(config) = cfg.nodelifecycle {
        let c = clients("node-controller");
        let i = informers.clone();
        set.spawn(async move { nodelifecycle::run(c, config, i).await });
    }
    if let Some(config) = cfg.nodeipam {
        // Upstream's node IPAM controller calls as the node controller.
        let c = clients("node-controller");
        set.spawn(async move { nodeipam::run(c, config).await });
    }
    if let Some(config) = cfg.podgc {
        let c = clients("pod-garbage-collector");
        let i = informers.clone();
        set.spawn(async move { podgc::run(c, config, i).await });
    }
    if let Some(config) = cfg.podautoscaler {
        let c = clients(podautoscaler::CONTROLLER_NAME);
        let i = informers.clone();
        set.spawn(async move { podautoscaler::run(c, i, config).await });
    }
    if cfg.tainteviction {
        // Upstream's taint eviction controller calls as the node controller (no role of its own).
        let c = clients("node-controller");
        let i = informers.clone();
        set.spawn(async move { tainteviction::run(c, i).await });
    }
    if cfg.servicelb {
        let c = clients("service-lb-controller");
        set.spawn(async move { servicelb::run(c).await });
    }
    if cfg.clusterroleaggregation {
        let c = clients("clusterrole-aggregation-controller");
        set.spawn(async move { clusterroleaggregation::run(c).await });
    }
    if let Some(pem) = cfg.root_ca_pem {
        let c = clients("root-ca-cert-publisher");
        set.spawn(async move { rootcacertpublisher::run(c, pem).await });
    }
    if let Some(signing) = cfg.csr_signing {
        // Upstream's names: the approving and signing controllers and the cleaner run as
        // `certificate-controller`.
        let c = clients("certificate-controller");
        set.spawn(async move { csrsigning::run(c, signing).await });
        let c = clients("certificate-controller");
        set.spawn(async move { csrapproving::run(c).await });
        let c = clients("certificate-controller");
        set.spawn(async move { csrcleaner::run(c).await });
    }
    if cfg.tokencleaner {
        let c = clients("token-cleaner");
        set.spawn(async move { tokencleaner::run(c).await });
    }
    if let Some(config) = cfg.resource_quota {
        let c = clients(resource_quota::CONTROLLER_NAME);
        let i = informers.clone();
        set.spawn(async move { resource_quota::run(c, i, config).await });
    }
    if cfg.disruption {
        let c = clients(disruption::CONTROLLER_NAME);
        let i = informers.clone();
        set.spawn(async move { disruption::run(c, i).await });
    }
    // Every informer the controllers asked for (and any they ask for later) lists and watches.
    informers.start();
    match set.join_next().await {
        Some(Ok(r)) => r,
        Some(Err(e)) => Err(anyhow::anyhow!("a controller panicked: {e}")),
        None => std::future::pending().await,
    }
}
