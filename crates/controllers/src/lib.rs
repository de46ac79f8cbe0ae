//! Controllers, one file per controller named as upstream's: they talk to the API only
//! (list + watch + write), never to the store.

pub mod controller_utils;
pub mod cronjob;
pub mod daemonset;
pub mod deployment;
pub mod endpoints;
pub mod endpointslice;
pub mod endpointutil;
pub mod garbagecollector;
pub mod history;
pub mod job;
pub mod namespace;
pub mod nodelifecycle;
pub mod persistentvolume;
pub mod podgc;
pub mod replicaset;
pub mod resources;
pub mod rootcacertpublisher;
pub mod service_explain;
pub mod serviceaccounts;
pub mod servicelb;
pub mod statefulset;
pub mod tainteviction;

/// Which controllers run.
#[derive(Clone, Debug)]
pub struct ControllersConfig {
    pub garbage_collector: bool,
    pub namespace: bool,
    pub replicaset: bool,
    pub deployment: bool,
    pub daemonset: bool,
    pub job: bool,
    pub statefulset: bool,
    pub cronjob: bool,
    pub persistentvolume: bool,
    pub serviceaccounts: bool,
    pub endpointslice: bool,
    pub endpoints: bool,
    /// k3s' ServiceLB: LoadBalancer Services answered on the nodes' addresses.
    pub servicelb: bool,
    /// Pods evicted from nodes with NoExecute taints they do not tolerate.
    pub tainteviction: bool,
    /// Nodes that stop reporting are tainted (and how soon); `None`: not run.
    pub nodelifecycle: Option<nodelifecycle::NodeLifecycleConfig>,
    /// Pods of gone nodes, excess terminated pods; `None`: not run.
    pub podgc: Option<podgc::PodGcConfig>,
    /// The cluster CA (PEM) to publish as `kube-root-ca.crt` in every namespace; None: not published.
    pub root_ca_pem: Option<String>,
}

impl Default for ControllersConfig {
    fn default() -> Self {
        ControllersConfig {
            garbage_collector: true,
            namespace: true,
            replicaset: true,
            deployment: true,
            daemonset: true,
            job: true,
            statefulset: true,
            cronjob: true,
            persistentvolume: true,
            serviceaccounts: true,
            endpointslice: true,
            endpoints: true,
            servicelb: true,
            tainteviction: true,
            nodelifecycle: Some(Default::default()),
            podgc: Some(Default::default()),
            root_ca_pem: None,
        }
    }
}

/// Run the enabled controllers until one fails.
pub async fn run(client: kube::Client, cfg: ControllersConfig) -> anyhow::Result<()> {
    let mut set = tokio::task::JoinSet::new();
    if cfg.garbage_collector {
        let c = client.clone();
        set.spawn(async move { garbagecollector::run(c).await });
    }
    if cfg.namespace {
        let c = client.clone();
        set.spawn(async move { namespace::run(c).await });
    }
    if cfg.replicaset {
        let c = client.clone();
        set.spawn(async move { replicaset::run(c).await });
    }
    if cfg.deployment {
        let c = client.clone();
        set.spawn(async move { deployment::run(c).await });
    }
    if cfg.daemonset {
        let c = client.clone();
        set.spawn(async move { daemonset::run(c).await });
    }
    if cfg.job {
        let c = client.clone();
        set.spawn(async move { job::run(c).await });
    }
    if cfg.statefulset {
        let c = client.clone();
        set.spawn(async move { statefulset::run(c).await });
    }
    if cfg.cronjob {
        let c = client.clone();
        set.spawn(async move { cronjob::run(c).await });
    }
    if cfg.persistentvolume {
        let c = client.clone();
        set.spawn(async move { persistentvolume::run(c).await });
    }
    if cfg.serviceaccounts {
        let c = client.clone();
        set.spawn(async move { serviceaccounts::run(c).await });
    }
    if cfg.endpointslice {
        let c = client.clone();
        set.spawn(async move { endpointslice::run(c).await });
    }
    if cfg.endpoints {
        let c = client.clone();
        set.spawn(async move { endpoints::run(c).await });
    }
    if let Some(config) = cfg.nodelifecycle {
        let c = client.clone();
        set.spawn(async move { nodelifecycle::run(c, config).await });
    }
    if let Some(config) = cfg.podgc {
        let c = client.clone();
        set.spawn(async move { podgc::run(c, config).await });
    }
    if cfg.tainteviction {
        let c = client.clone();
        set.spawn(async move { tainteviction::run(c).await });
    }
    if cfg.servicelb {
        let c = client.clone();
        set.spawn(async move { servicelb::run(c).await });
    }
    if let Some(pem) = cfg.root_ca_pem {
        let c = client.clone();
        set.spawn(async move { rootcacertpublisher::run(c, pem).await });
    }
    match set.join_next().await {
        Some(Ok(r)) => r,
        Some(Err(e)) => Err(anyhow::anyhow!("a controller panicked: {e}")),
        None => std::future::pending().await,
    }
}
