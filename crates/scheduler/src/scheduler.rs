//! The scheduling loop: one task owns the cache and the queue, applies watch events, runs
//! cycles, and hands bindings and other writes to background tasks.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{
    Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod, ReplicationController, Service,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::api::storage::v1::{CSINode, StorageClass};
use kube::api::PostParams;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event as WatchEvent};
use kube::{Api, Client};
use tokio::sync::{Semaphore, mpsc};

use crate::assume_cache::{Updated, key_of};
use crate::cache::{Cache, NodeChange};
use crate::explain::{EXPLAIN_ANNOTATION, Explain, add_excluded, group_rejections, top_scores};
use crate::framework::{Framework, PreBindWork, Reservation, Unreserve};
use crate::labels::Selector;
use crate::lean_pod::LeanPod;
use crate::metrics::AttemptResult;
use crate::plugins;
use crate::plugins::default_preemption::{self, Pdb};
use crate::queue::{QueuedPod, SchedulingQueue};
use crate::types::PodInfo;
use crate::writer::{Writer, now_rfc3339};

/// Condition reason and message for pods with scheduling gates.
pub const REASON_SCHEDULING_GATED: &str = "SchedulingGated";
pub const MSG_SCHEDULING_GATED: &str = "Scheduling is blocked due to non-empty scheduling gates";

/// Upstream's message when the cluster has no nodes.
pub const ERR_NO_NODES_AVAILABLE: &str = "no nodes available to schedule pods";

/// How the scheduler runs.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Pods whose `spec.schedulerName` is one of these are scheduled here.
    pub scheduler_names: Vec<String>,
    /// 0 = upstream's adaptive percentage; 100 = always every node.
    pub percentage_of_nodes_to_score: u32,
    /// Bindings in flight at once.
    pub max_concurrent_binds: usize,
    /// Status, explanation and eviction writes in flight at once.
    pub max_concurrent_writes: usize,
    /// Event writes in flight at once. Events only inform: bindings and status writes get
    /// the rest of the API server's time, so under a burst events are written behind the
    /// binds (upstream's broadcaster writes one at a time and drops what waits beyond 1,000;
    /// here 10,000 may wait). 64 keeps them in step with 5,000 binds a second, at about 15%
    /// of the throughput (`skiff bench scheduling --event-writes`).
    pub max_concurrent_events: usize,
    /// Record Scheduled / FailedScheduling events.
    pub record_events: bool,
    /// Store the last attempt's explanation on the pod (annotation `scheduler.skiff.dev/explain`).
    pub explain: bool,
    /// Run DefaultPreemption when a pod fits nowhere.
    pub preemption: bool,
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    /// Told of every bound pod the pod watch brings (as upstream's scheduler_perf counts
    /// scheduled pods from the scheduler's own informer).
    pub on_bound: Option<BoundObserver>,
    /// How long VolumeBinding's PreBind waits for a pod's claims to be bound (upstream's
    /// `bindTimeoutSeconds`, 600).
    pub volume_bind_timeout: Duration,
}

/// Called with (namespace, name).
pub type BoundFn = dyn Fn(&str, &str) + Send + Sync;

/// A callback given (namespace, name) of each pod seen bound on the scheduler's pod watch.
#[derive(Clone)]
pub struct BoundObserver(pub Arc<BoundFn>);

impl std::fmt::Debug for BoundObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BoundObserver")
    }
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            scheduler_names: vec!["default-scheduler".to_string()],
            percentage_of_nodes_to_score: 0,
            max_concurrent_binds: 256,
            max_concurrent_writes: 64,
            max_concurrent_events: 8,
            record_events: true,
            explain: true,
            preemption: true,
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(10),
            on_bound: None,
            volume_bind_timeout: plugins::volume_binding::DEFAULT_BIND_TIMEOUT,
        }
    }
}

enum Msg {
    Pod(Box<WatchEvent<Pod>>),
    Node(Box<WatchEvent<Node>>),
    PriorityClass(Box<WatchEvent<PriorityClass>>),
    Namespace(Box<WatchEvent<Namespace>>),
    /// A selector source for default spreading changed.
    SpreadSource(SpreadSourceEvent),
    Pvc(Box<WatchEvent<PersistentVolumeClaim>>),
    Pv(Box<WatchEvent<PersistentVolume>>),
    StorageClass(Box<WatchEvent<StorageClass>>),
    CsiNode(Box<WatchEvent<CSINode>>),
    Bound {
        info: Arc<PodInfo>,
        node: String,
        /// Undoes the pod's reservations when the binding failed.
        unreserve: Vec<Unreserve>,
        result: Result<(), BindFailure>,
        timing: AttemptTiming,
    },
}

/// Why a reserved pod was not bound.
#[derive(Debug)]
enum BindFailure {
    /// A PreBind plugin failed: (plugin, message).
    PreBind(&'static str, String),
    /// The API refused the binding: (status code, message).
    Api(u16, String),
}

/// (namespace, name, selector; None when deleted) of a service or (kind-tagged) controller.
enum SpreadSourceEvent {
    Service(String, String, Option<std::collections::BTreeMap<String, String>>),
    Controller(&'static str, String, String, Option<Selector>),
    Pdb(String, String, Option<(Selector, i32)>),
    Noop,
}

/// Bit masks of the plugins a kind of cluster event may help.
struct Masks {
    node_labels: u64,
    node_taints: u64,
    node_schedulable: u64,
    node_allocatable: u64,
    pod_deleted: u64,
    pod_added: u64,
    namespace_labels: u64,
    /// Claims added / updated (for the pods using them), volumes added or updated, classes
    /// added, classes' allowedTopologies updated, CSI nodes added or their migrated plugins
    /// changed.
    pvc_added: u64,
    pvc_updated: u64,
    pv_changed: u64,
    class_added: u64,
    class_topologies: u64,
    csinode_added: u64,
    csinode_migrated: u64,
}

impl Masks {
    fn new(fw: &Framework) -> Self {
        let bit = |name: &str| fw.plugin_index(name).map(|i| 1u64 << i).unwrap_or(0);
        let fit = bit(plugins::node_resources_fit::NAME);
        let ports = bit(plugins::node_ports::NAME);
        let affinity = bit(plugins::node_affinity::NAME);
        let taints = bit(plugins::taint_toleration::NAME);
        let unsched = bit(plugins::node_unschedulable::NAME);
        let spread = bit(plugins::pod_topology_spread::NAME);
        let interpod = bit(plugins::inter_pod_affinity::NAME);
        let restrictions = bit(plugins::volume_restrictions::NAME);
        let limits = bit(plugins::node_volume_limits::NAME);
        let binding = bit(plugins::volume_binding::NAME);
        let zone = bit(plugins::volume_zone::NAME);
        Masks {
            node_labels: affinity | spread | interpod | binding | zone,
            // VolumeZone also listens to taint updates (upstream's guard against missed node adds).
            node_taints: taints | spread | zone,
            node_schedulable: unsched,
            node_allocatable: fit,
            pod_deleted: fit | ports | spread | interpod | restrictions | limits,
            pod_added: spread | interpod,
            namespace_labels: interpod,
            pvc_added: restrictions | limits | binding | zone,
            pvc_updated: binding | zone,
            pv_changed: binding | zone,
            class_added: binding | zone,
            class_topologies: binding,
            csinode_added: limits | binding,
            csinode_migrated: binding,
        }
    }

    fn for_node(&self, ch: &NodeChange) -> u64 {
        if ch.added {
            return u64::MAX;
        }
        let mut m = 0;
        if ch.labels {
            m |= self.node_labels;
        }
        if ch.taints {
            m |= self.node_taints;
        }
        if ch.schedulable {
            m |= self.node_schedulable;
        }
        if ch.allocatable {
            m |= self.node_allocatable;
        }
        m
    }
}

/// The storage watches' lists: which are done, and the keys a list in progress has brought
/// (what it did not bring was deleted while the watch was down).
#[derive(Debug, Default)]
struct StorageSync {
    pvcs: bool,
    pvs: bool,
    classes: bool,
    listing_pvcs: Option<HashSet<String>>,
    listing_pvs: Option<HashSet<String>>,
    listing_classes: Option<HashSet<String>>,
    listing_csinodes: Option<HashSet<String>>,
}

impl StorageSync {
    /// Scheduling waits for claims, volumes and classes (upstream waits for its informers);
    /// CSI nodes only add limits, so they are not waited for.
    fn synced(&self) -> bool {
        self.pvcs && self.pvs && self.classes
    }
}

/// The annotation listing the in-tree plugins a CSI node migrated (upstream's
/// `MigratedPluginsAnnotationKey`).
const MIGRATED_PLUGINS_ANNOTATION: &str = "storage.alpha.kubernetes.io/migrated-plugins";

/// Counters for the periodic debug summary.
#[derive(Debug, Default, Clone, Copy)]
struct Stats {
    attempts: u64,
    scheduled: u64,
    unschedulable: u64,
    bind_errors: u64,
    cycle_time: Duration,
}

struct Scheduler {
    cfg: SchedulerConfig,
    client: Client,
    fw: Framework,
    cache: Cache,
    queue: SchedulingQueue,
    writer: Writer,
    binds: Arc<Semaphore>,
    tx: mpsc::UnboundedSender<Msg>,
    masks: Masks,
    pending_mask: u64,
    priority_classes: HashMap<String, i32>,
    global_default_priority: Option<(String, i32)>,
    pods_synced: bool,
    nodes_synced: bool,
    init_pods: Option<HashSet<String>>,
    init_nodes: Option<HashSet<String>>,
    /// The storage watches: lists done, and the keys seen by a list in progress.
    storage: StorageSync,
    last_stale_flush: Instant,
    /// Explanations sent with bindings, until the bound pod is seen.
    pending_explains: HashMap<String, String>,
    stats: Stats,
    pdbs: HashMap<String, Pdb>,
    /// Each profile's attempt metrics, resolved once.
    profiles: Vec<Arc<crate::metrics::ProfileMetrics>>,
}

/// When a pod's attempt began, when it first entered the queue, and its attempt number: what
/// the attempt and SLI metrics record once its binding is done.
#[derive(Clone, Copy, Debug)]
pub struct AttemptTiming {
    pub start: Instant,
    pub queued: Instant,
    pub attempts: u32,
}

fn spawn_watch<K, F>(api: Api<K>, tx: mpsc::UnboundedSender<Msg>, wrap: F)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    F: Fn(WatchEvent<K>) -> Msg + Send + 'static,
{
    tokio::spawn(async move {
        let mut stream = watcher::watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed();
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(ev) => {
                    if tx.send(wrap(ev)).is_err() {
                        return;
                    }
                }
                Err(e) => tracing::debug!(error = %e, "watch failed; retrying"),
            }
        }
    });
}

fn ns_name(m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> (String, String) {
    (
        m.namespace.clone().unwrap_or_default(),
        m.name.clone().unwrap_or_default(),
    )
}

/// Watches one kind of selector source; `f(object, deleted)` turns events into updates.
fn spawn_source_watch<K, F>(api: Api<K>, tx: mpsc::UnboundedSender<Msg>, f: F)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    F: Fn(K, bool) -> SpreadSourceEvent + Send + 'static,
{
    spawn_watch(api, tx, move |ev| match ev {
        WatchEvent::Apply(o) | WatchEvent::InitApply(o) => Msg::SpreadSource(f(o, false)),
        WatchEvent::Delete(o) => Msg::SpreadSource(f(o, true)),
        WatchEvent::Init | WatchEvent::InitDone => Msg::SpreadSource(SpreadSourceEvent::Noop),
    });
}

/// Runs the scheduler until the client's watches end for good.
pub async fn run(client: Client, cfg: SchedulerConfig) -> anyhow::Result<()> {
    run_with_signal(client, cfg, None).await
}

/// As `run`; `synced` fires once the pod and node caches are filled and scheduling starts.
pub async fn run_with_signal(
    client: Client,
    cfg: SchedulerConfig,
    mut synced: Option<tokio::sync::oneshot::Sender<()>>,
) -> anyhow::Result<()> {
    let (tx, mut rx) = mpsc::unbounded_channel();
    spawn_watch(Api::<LeanPod>::all(client.clone()), tx.clone(), |e| {
        Msg::Pod(Box::new(match e {
            WatchEvent::Apply(p) => WatchEvent::Apply(p.0),
            WatchEvent::InitApply(p) => WatchEvent::InitApply(p.0),
            WatchEvent::Delete(p) => WatchEvent::Delete(p.0),
            WatchEvent::Init => WatchEvent::Init,
            WatchEvent::InitDone => WatchEvent::InitDone,
        }))
    });
    spawn_watch(Api::<Node>::all(client.clone()), tx.clone(), |e| Msg::Node(Box::new(e)));
    spawn_watch(Api::<PriorityClass>::all(client.clone()), tx.clone(), |e| {
        Msg::PriorityClass(Box::new(e))
    });
    spawn_watch(Api::<Namespace>::all(client.clone()), tx.clone(), |e| {
        Msg::Namespace(Box::new(e))
    });
    spawn_source_watch(Api::<Service>::all(client.clone()), tx.clone(), |s, gone| {
        let (ns, name) = ns_name(&s.metadata);
        let sel = s.spec.and_then(|sp| sp.selector).unwrap_or_default();
        SpreadSourceEvent::Service(ns, name, (!gone).then_some(sel))
    });
    spawn_source_watch(
        Api::<PodDisruptionBudget>::all(client.clone()),
        tx.clone(),
        |o, gone| {
            let (ns, name) = ns_name(&o.metadata);
            let sel = o
                .spec
                .as_ref()
                .map(|sp| Selector::from_label_selector(sp.selector.as_ref()));
            let allowed = o.status.as_ref().map(|s| s.disruptions_allowed).unwrap_or(0);
            SpreadSourceEvent::Pdb(ns, name, sel.filter(|_| !gone).map(|s| (s, allowed)))
        },
    );
    spawn_source_watch(Api::<ReplicaSet>::all(client.clone()), tx.clone(), |o, gone| {
        let (ns, name) = ns_name(&o.metadata);
        let sel = o.spec.map(|sp| Selector::from_label_selector(Some(&sp.selector)));
        SpreadSourceEvent::Controller("ReplicaSet", ns, name, sel.filter(|_| !gone))
    });
    spawn_source_watch(Api::<StatefulSet>::all(client.clone()), tx.clone(), |o, gone| {
        let (ns, name) = ns_name(&o.metadata);
        let sel = o.spec.map(|sp| Selector::from_label_selector(Some(&sp.selector)));
        SpreadSourceEvent::Controller("StatefulSet", ns, name, sel.filter(|_| !gone))
    });
    spawn_source_watch(
        Api::<ReplicationController>::all(client.clone()),
        tx.clone(),
        |o, gone| {
            let (ns, name) = ns_name(&o.metadata);
            let sel = o.spec.and_then(|sp| sp.selector).map(|m| Selector::from_map(&m));
            SpreadSourceEvent::Controller("ReplicationController", ns, name, sel.filter(|_| !gone))
        },
    );
    // What the volume plugins read.
    spawn_watch(Api::<PersistentVolumeClaim>::all(client.clone()), tx.clone(), |e| {
        Msg::Pvc(Box::new(e))
    });
    spawn_watch(Api::<PersistentVolume>::all(client.clone()), tx.clone(), |e| {
        Msg::Pv(Box::new(e))
    });
    spawn_watch(Api::<StorageClass>::all(client.clone()), tx.clone(), |e| {
        Msg::StorageClass(Box::new(e))
    });
    spawn_watch(Api::<CSINode>::all(client.clone()), tx.clone(), |e| {
        Msg::CsiNode(Box::new(e))
    });
    let fw = Framework::new(
        plugins::profile(cfg.volume_bind_timeout),
        cfg.percentage_of_nodes_to_score,
    );
    let masks = Masks::new(&fw);
    let component = cfg
        .scheduler_names
        .first()
        .cloned()
        .unwrap_or_else(|| "default-scheduler".to_string());
    let mut s = Scheduler {
        writer: Writer::new(
            client.clone(),
            component,
            cfg.max_concurrent_writes,
            cfg.max_concurrent_events,
        ),
        binds: Arc::new(Semaphore::new(cfg.max_concurrent_binds.max(1))),
        queue: SchedulingQueue::new(cfg.initial_backoff, cfg.max_backoff),
        cache: Cache::new(),
        client,
        fw,
        tx,
        masks,
        pending_mask: 0,
        priority_classes: HashMap::new(),
        global_default_priority: None,
        pods_synced: false,
        nodes_synced: false,
        init_pods: None,
        init_nodes: None,
        storage: StorageSync::default(),
        last_stale_flush: Instant::now(),
        pending_explains: HashMap::new(),
        stats: Stats::default(),
        pdbs: HashMap::new(),
        profiles: cfg
            .scheduler_names
            .iter()
            .map(|n| Arc::new(crate::metrics::ProfileMetrics::new(n)))
            .collect(),
        cfg,
    };
    let mut last_pending = Instant::now() - Duration::from_secs(1);
    tracing::info!(names = ?s.cfg.scheduler_names, "scheduler started");
    let mut last_report = Instant::now();
    let mut reported = Stats::default();
    loop {
        if last_report.elapsed() >= Duration::from_secs(5) && s.stats.attempts != reported.attempts {
            let d = s.stats;
            let attempts = d.attempts - reported.attempts;
            tracing::debug!(
                attempts,
                scheduled = d.scheduled - reported.scheduled,
                unschedulable = d.unschedulable - reported.unschedulable,
                bind_errors = d.bind_errors - reported.bind_errors,
                avg_cycle_us = (d.cycle_time - reported.cycle_time).as_micros() as u64 / attempts.max(1),
                queued = s.queue.len(),
                nodes = s.cache.num_nodes(),
                "scheduling summary"
            );
            reported = d;
            last_report = Instant::now();
        }
        if last_pending.elapsed() >= Duration::from_secs(1) {
            let (active, backoff, unschedulable) = s.queue.pool_counts();
            crate::metrics::pending(active, backoff, unschedulable);
            last_pending = Instant::now();
        }
        let mut drained = 0;
        while drained < 8192 {
            match rx.try_recv() {
                Ok(m) => {
                    s.handle(m);
                    drained += 1;
                }
                Err(_) => break,
            }
        }
        if s.pending_mask != 0 {
            let moved = s.queue.move_all(s.pending_mask);
            if moved > 0 {
                tracing::debug!(moved, "cluster event moved unschedulable pods to active");
            }
            s.pending_mask = 0;
        }
        let now = Instant::now();
        s.queue
            .flush(now, now.duration_since(s.last_stale_flush) >= Duration::from_secs(30));
        if now.duration_since(s.last_stale_flush) >= Duration::from_secs(30) {
            s.last_stale_flush = now;
        }
        if s.pods_synced && s.nodes_synced && s.storage.synced() {
            if let Some(tx) = synced.take() {
                tracing::info!(
                    nodes = s.cache.num_nodes(),
                    pending = s.queue.len(),
                    "scheduler caches synced"
                );
                let _ = tx.send(());
            }
            let mut n = 0;
            while n < 256 {
                let Some(p) = s.queue.pop() else { break };
                s.schedule_one(p);
                n += 1;
            }
            if n > 0 {
                tokio::task::yield_now().await;
                continue;
            }
        }
        let wait = s
            .queue
            .next_backoff()
            .map(|t| t.saturating_duration_since(now))
            .unwrap_or(Duration::from_secs(1))
            .min(Duration::from_secs(1));
        tokio::select! {
            m = rx.recv() => match m {
                Some(m) => s.handle(m),
                None => anyhow::bail!("scheduler event channel closed"),
            },
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

impl Scheduler {
    fn responsible(&self, info: &PodInfo) -> bool {
        self.cfg.scheduler_names.contains(&info.scheduler_name)
    }

    fn make_info(&self, pod: Pod) -> Arc<PodInfo> {
        let mut info = PodInfo::new(pod);
        let spec = info.pod.spec.as_ref();
        if spec.and_then(|s| s.priority).is_none() {
            let class = spec.and_then(|s| s.priority_class_name.as_deref());
            info.priority = match class {
                Some(c) if !c.is_empty() => self.priority_classes.get(c).copied().unwrap_or(0),
                _ => self.global_default_priority.as_ref().map(|g| g.1).unwrap_or(0),
            };
        }
        Arc::new(info)
    }

    fn handle(&mut self, m: Msg) {
        match m {
            Msg::Pod(ev) => self.handle_pod_event(*ev),
            Msg::Node(ev) => self.handle_node_event(*ev),
            Msg::PriorityClass(ev) => self.handle_priority_class(*ev),
            Msg::Namespace(ev) => self.handle_namespace(*ev),
            Msg::SpreadSource(SpreadSourceEvent::Pdb(ns, name, pdb)) => {
                let key = format!("{ns}/{name}");
                match pdb {
                    Some((selector, disruptions_allowed)) => {
                        self.pdbs.insert(
                            key,
                            Pdb {
                                namespace: ns,
                                selector,
                                disruptions_allowed,
                            },
                        );
                    }
                    None => {
                        self.pdbs.remove(&key);
                    }
                }
                self.cache.pdbs = self.pdbs.values().cloned().collect();
            }
            Msg::SpreadSource(ev) => {
                let src = &mut self.cache.spread_sources;
                match ev {
                    SpreadSourceEvent::Service(ns, name, Some(sel)) => {
                        src.services.entry(ns).or_default().insert(name, sel);
                    }
                    SpreadSourceEvent::Service(ns, name, None) => {
                        if let Some(m) = src.services.get_mut(&ns) {
                            m.remove(&name);
                        }
                    }
                    SpreadSourceEvent::Controller(kind, ns, name, Some(sel)) => {
                        src.controllers.insert((kind, ns, name), sel);
                    }
                    SpreadSourceEvent::Controller(kind, ns, name, None) => {
                        src.controllers.remove(&(kind, ns, name));
                    }
                    SpreadSourceEvent::Pdb(..) | SpreadSourceEvent::Noop => {}
                }
            }
            Msg::Pvc(ev) => self.handle_pvc(*ev),
            Msg::Pv(ev) => self.handle_pv(*ev),
            Msg::StorageClass(ev) => self.handle_storage_class(*ev),
            Msg::CsiNode(ev) => self.handle_csinode(*ev),
            Msg::Bound {
                info,
                node,
                unreserve,
                result,
                timing,
            } => self.handle_bound(info, node, unreserve, result, timing),
        }
    }

    /// Moves the unschedulable pods that use claim `ns/name` and were rejected by `mask`
    /// (upstream's QueueingHints of the volume plugins for claim events).
    fn move_for_claim(&mut self, mask: u64, ns: &str, name: &str) {
        let moved = self
            .queue
            .move_matching(mask, |p| p.namespace == ns && p.claims.iter().any(|c| c.name == name));
        if moved > 0 {
            tracing::debug!(moved, claim = %format!("{ns}/{name}"), "claim event moved pods to active");
        }
    }

    fn handle_pvc(&mut self, ev: WatchEvent<PersistentVolumeClaim>) {
        match ev {
            WatchEvent::Init => self.storage.listing_pvcs = Some(HashSet::new()),
            WatchEvent::InitApply(o) | WatchEvent::Apply(o) => {
                let key = key_of(&o);
                let ns = o.metadata.namespace.clone().unwrap_or_default();
                let name = o.metadata.name.clone().unwrap_or_default();
                if let Some(seen) = &mut self.storage.listing_pvcs {
                    seen.insert(key);
                }
                match self.cache.volumes.pvcs.update(Arc::new(o)) {
                    Updated::Added => self.move_for_claim(self.masks.pvc_added, &ns, &name),
                    Updated::Replaced(_) => self.move_for_claim(self.masks.pvc_updated, &ns, &name),
                    Updated::Ignored => {}
                }
            }
            WatchEvent::Delete(o) => {
                self.cache.volumes.pvcs.delete(&key_of(&o));
            }
            WatchEvent::InitDone => {
                if let Some(seen) = self.storage.listing_pvcs.take() {
                    self.cache.volumes.pvcs.retain(|k| seen.contains(k));
                }
                self.storage.pvcs = true;
            }
        }
    }

    fn handle_pv(&mut self, ev: WatchEvent<PersistentVolume>) {
        match ev {
            WatchEvent::Init => self.storage.listing_pvs = Some(HashSet::new()),
            WatchEvent::InitApply(o) | WatchEvent::Apply(o) => {
                if let Some(seen) = &mut self.storage.listing_pvs {
                    seen.insert(key_of(&o));
                }
                if !matches!(self.cache.volumes.pvs.update(Arc::new(o)), Updated::Ignored) {
                    self.pending_mask |= self.masks.pv_changed;
                }
            }
            WatchEvent::Delete(o) => {
                self.cache.volumes.pvs.delete(&key_of(&o));
            }
            WatchEvent::InitDone => {
                if let Some(seen) = self.storage.listing_pvs.take() {
                    self.cache.volumes.pvs.retain(|k| seen.contains(k));
                }
                self.storage.pvs = true;
            }
        }
    }

    fn handle_storage_class(&mut self, ev: WatchEvent<StorageClass>) {
        match ev {
            WatchEvent::Init => self.storage.listing_classes = Some(HashSet::new()),
            WatchEvent::InitApply(o) | WatchEvent::Apply(o) => {
                let name = o.metadata.name.clone().unwrap_or_default();
                if let Some(seen) = &mut self.storage.listing_classes {
                    seen.insert(name.clone());
                }
                let topologies = o.allowed_topologies.clone();
                match self.cache.volumes.classes.insert(name, Arc::new(o)) {
                    None => self.pending_mask |= self.masks.class_added,
                    Some(old) if old.allowed_topologies != topologies => {
                        self.pending_mask |= self.masks.class_topologies
                    }
                    Some(_) => {}
                }
            }
            WatchEvent::Delete(o) => {
                self.cache
                    .volumes
                    .classes
                    .remove(o.metadata.name.as_deref().unwrap_or_default());
            }
            WatchEvent::InitDone => {
                if let Some(seen) = self.storage.listing_classes.take() {
                    self.cache.volumes.classes.retain(|k, _| seen.contains(k));
                }
                self.storage.classes = true;
            }
        }
    }

    fn handle_csinode(&mut self, ev: WatchEvent<CSINode>) {
        match ev {
            WatchEvent::Init => self.storage.listing_csinodes = Some(HashSet::new()),
            WatchEvent::InitApply(o) | WatchEvent::Apply(o) => {
                let name = o.metadata.name.clone().unwrap_or_default();
                if let Some(seen) = &mut self.storage.listing_csinodes {
                    seen.insert(name.clone());
                }
                let migrated = |n: &CSINode| {
                    n.metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(MIGRATED_PLUGINS_ANNOTATION))
                        .cloned()
                };
                let now = migrated(&o);
                match self.cache.volumes.csi_nodes.insert(name, Arc::new(o)) {
                    None => self.pending_mask |= self.masks.csinode_added,
                    Some(old) if migrated(&old) != now => self.pending_mask |= self.masks.csinode_migrated,
                    Some(_) => {}
                }
            }
            WatchEvent::Delete(o) => {
                self.cache
                    .volumes
                    .csi_nodes
                    .remove(o.metadata.name.as_deref().unwrap_or_default());
            }
            WatchEvent::InitDone => {
                if let Some(seen) = self.storage.listing_csinodes.take() {
                    self.cache.volumes.csi_nodes.retain(|k, _| seen.contains(k));
                }
            }
        }
    }

    fn handle_namespace(&mut self, ev: WatchEvent<Namespace>) {
        match ev {
            WatchEvent::Apply(ns) | WatchEvent::InitApply(ns) => {
                let name = ns.metadata.name.clone().unwrap_or_default();
                let labels = ns.metadata.labels.clone().unwrap_or_default();
                if self.cache.set_namespace(&name, labels) {
                    self.pending_mask |= self.masks.namespace_labels;
                }
            }
            WatchEvent::Delete(ns) => {
                self.cache
                    .remove_namespace(ns.metadata.name.as_deref().unwrap_or_default());
            }
            WatchEvent::Init | WatchEvent::InitDone => {}
        }
    }

    fn handle_priority_class(&mut self, ev: WatchEvent<PriorityClass>) {
        match ev {
            WatchEvent::Apply(pc) | WatchEvent::InitApply(pc) => {
                let name = pc.metadata.name.clone().unwrap_or_default();
                self.priority_classes.insert(name.clone(), pc.value);
                if pc.global_default == Some(true) {
                    self.global_default_priority = Some((name, pc.value));
                } else if self.global_default_priority.as_ref().is_some_and(|g| g.0 == name) {
                    self.global_default_priority = None;
                }
            }
            WatchEvent::Delete(pc) => {
                let name = pc.metadata.name.clone().unwrap_or_default();
                self.priority_classes.remove(&name);
                if self.global_default_priority.as_ref().is_some_and(|g| g.0 == name) {
                    self.global_default_priority = None;
                }
            }
            WatchEvent::Init | WatchEvent::InitDone => {}
        }
    }

    fn handle_node_event(&mut self, ev: WatchEvent<Node>) {
        match ev {
            WatchEvent::Init => self.init_nodes = Some(HashSet::new()),
            WatchEvent::InitApply(n) | WatchEvent::Apply(n) => {
                let name = n.metadata.name.clone().unwrap_or_default();
                if let Some(seen) = &mut self.init_nodes {
                    seen.insert(name);
                }
                let ch = self.cache.upsert_node(Arc::new(n));
                self.pending_mask |= self.masks.for_node(&ch);
            }
            WatchEvent::Delete(n) => {
                self.cache.remove_node(n.metadata.name.as_deref().unwrap_or_default());
            }
            WatchEvent::InitDone => {
                if let Some(seen) = self.init_nodes.take() {
                    let gone: Vec<String> = self
                        .cache
                        .node_indices()
                        .map(|i| self.cache.node_name(i).to_string())
                        .filter(|n| !seen.contains(n))
                        .collect();
                    for n in gone {
                        self.cache.remove_node(&n);
                    }
                }
                self.nodes_synced = true;
            }
        }
    }

    fn handle_pod_event(&mut self, ev: WatchEvent<Pod>) {
        match ev {
            WatchEvent::Init => self.init_pods = Some(HashSet::new()),
            WatchEvent::InitApply(p) | WatchEvent::Apply(p) => {
                if let Some(seen) = &mut self.init_pods
                    && let Some(uid) = &p.metadata.uid
                {
                    seen.insert(uid.clone());
                }
                self.apply_pod(p);
            }
            WatchEvent::Delete(p) => {
                let uid = p.metadata.uid.clone().unwrap_or_default();
                self.delete_pod(&uid);
            }
            WatchEvent::InitDone => {
                if let Some(seen) = self.init_pods.take() {
                    let gone: Vec<String> = self
                        .cache
                        .all_pods()
                        .filter(|(_, p)| !self.cache.is_assumed(&p.uid) && !seen.contains(&p.uid))
                        .map(|(_, p)| p.uid.clone())
                        .chain(self.queue.uids().filter(|u| !seen.contains(*u)).cloned())
                        .collect();
                    for uid in gone {
                        self.delete_pod(&uid);
                    }
                }
                self.pods_synced = true;
            }
        }
    }

    fn delete_pod(&mut self, uid: &str) {
        self.pending_explains.remove(uid);
        if let Some(q) = self.queue.delete(uid) {
            self.cache.set_nominated(&q.info, None);
        }
        if self.cache.remove_pod(uid).is_some() {
            self.pending_mask |= self.masks.pod_deleted;
        }
    }

    fn apply_pod(&mut self, pod: Pod) {
        let info = self.make_info(pod);
        if info.terminal {
            // Finished pods hold no resources.
            self.delete_pod(&info.uid);
            return;
        }
        if info.node_name.is_some() {
            if let Some(observer) = &self.cfg.on_bound {
                (observer.0)(&info.namespace, &info.name);
            }
            if let Some(q) = self.queue.delete(&info.uid) {
                self.cache.set_nominated(&q.info, None);
            }
            self.cache.set_nominated(&info, None);
            let known = self.cache.has_pod(&info.uid) && !self.cache.is_assumed(&info.uid);
            let labels_changed = known
                && self
                    .cache
                    .pod_node(&info.uid)
                    .and_then(|n| self.cache.node(n))
                    .and_then(|n| n.pods.iter().find(|p| p.uid == info.uid))
                    .is_some_and(|old| old.labels != info.labels);
            if !known || labels_changed {
                self.pending_mask |= self.masks.pod_added;
            }
            if let Some(explain) = self.pending_explains.remove(&info.uid) {
                // The binding carries the explanation (upstream's API server copies binding
                // annotations onto the pod); when it did not land, write it.
                let current = info
                    .pod
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(EXPLAIN_ANNOTATION));
                if current != Some(&explain) {
                    self.writer.explain(info.clone(), explain);
                }
            }
            self.cache.upsert_bound_pod(info);
            return;
        }
        if !self.responsible(&info) || info.deleting {
            self.queue.delete(&info.uid);
            self.cache.set_nominated(&info, None);
            return;
        }
        if self.cache.is_assumed(&info.uid) {
            // Its binding is in flight.
            return;
        }
        let gated = info
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.scheduling_gates.as_ref())
            .is_some_and(|g| !g.is_empty());
        if gated {
            // As upstream's SchedulingGates PreEnqueue plugin: wait, and say why.
            self.queue.delete(&info.uid);
            self.writer.unschedulable(
                info,
                REASON_SCHEDULING_GATED,
                MSG_SCHEDULING_GATED.to_string(),
                None,
                None,
            );
            return;
        }
        let nominated = info.nominated_node().map(str::to_string);
        self.cache.set_nominated(&info, nominated.as_deref());
        self.queue.add_or_update(info, Instant::now());
    }

    fn handle_bound(
        &mut self,
        info: Arc<PodInfo>,
        node: String,
        unreserve: Vec<Unreserve>,
        result: Result<(), BindFailure>,
        timing: AttemptTiming,
    ) {
        let profile = self.profile_metrics(&info.scheduler_name);
        let failure = match result {
            Ok(()) => {
                profile.attempt(AttemptResult::Scheduled, timing.start);
                crate::metrics::pod_scheduled(timing.attempts, timing.queued);
                if self.cfg.record_events {
                    self.writer.event(
                        &info,
                        "Normal",
                        "Scheduled",
                        "Binding",
                        format!("Successfully assigned {}/{} to {}", info.namespace, info.name, node),
                    );
                }
                return;
            }
            Err(f) => {
                profile.attempt(AttemptResult::Error, timing.start);
                f
            }
        };
        // Upstream's handleBindingCycleError: Unreserve, forget the pod, and retry it.
        Reservation {
            pre_bind: Vec::new(),
            unreserve,
        }
        .unreserve(&mut self.cache);
        if !self.cache.is_assumed(&info.uid) {
            // Deleted meanwhile.
            return;
        }
        self.cache.forget_pod(&info.uid);
        self.pending_explains.remove(&info.uid);
        self.pending_mask |= self.masks.pod_deleted;
        let message = match failure {
            BindFailure::Api(code, msg) if code == 404 || code == 409 => {
                // Deleted, or bound by someone else: the watch brings the truth.
                tracing::debug!(pod = %info.key(), code, %msg, "binding not applied");
                return;
            }
            BindFailure::Api(_, msg) => {
                tracing::warn!(pod = %info.key(), node = %node, %msg, "binding failed");
                format!("Binding rejected: {msg}")
            }
            BindFailure::PreBind(plugin, msg) => {
                tracing::info!(pod = %info.key(), node = %node, plugin, %msg, "PreBind failed");
                format!("running PreBind plugin {plugin:?}: {msg}")
            }
        };
        self.stats.bind_errors += 1;
        self.scheduling_error(info, message);
    }

    /// Upstream's failure handling of a scheduling error (not a FitError): an event, the
    /// PodScheduled condition with reason SchedulerError, and a retry after backoff.
    fn scheduling_error(&mut self, info: Arc<PodInfo>, message: String) {
        if self.cfg.record_events {
            self.writer
                .event(&info, "Warning", "FailedScheduling", "Scheduling", message.clone());
        }
        self.writer
            .unschedulable(info.clone(), "SchedulerError", message, None, None);
        self.queue.requeue_with_backoff(info, Instant::now());
    }

    /// The attempt metrics of the pod's profile (the first profile's for a name not served,
    /// which the queue never admits).
    fn profile_metrics(&self, name: &str) -> Arc<crate::metrics::ProfileMetrics> {
        match self
            .profiles
            .iter()
            .find(|p| p.profile == name)
            .or(self.profiles.first())
        {
            Some(p) => p.clone(),
            None => Arc::new(crate::metrics::ProfileMetrics::new(name)),
        }
    }

    fn schedule_one(&mut self, qp: QueuedPod) {
        let pod = qp.info;
        let now = Instant::now();
        let timing = AttemptTiming {
            start: now,
            queued: qp.added,
            attempts: qp.attempts,
        };
        let profile = self.profile_metrics(&pod.scheduler_name);
        self.stats.attempts += 1;
        let outcome = self.fw.schedule(&pod, &self.cache);
        self.stats.cycle_time += now.elapsed();
        match outcome {
            Ok((res, mut state)) => {
                let node = self.cache.node_name(res.node).to_string();
                let explain = self.cfg.explain.then(|| {
                    let (score_plugins, scores) = top_scores(&self.cache, &res.scores);
                    Explain {
                        time: now_rfc3339(),
                        result: "Scheduled".into(),
                        node: Some(node.clone()),
                        message: None,
                        nodes: self.cache.num_nodes(),
                        evaluated: res.evaluated,
                        feasible: res.feasible,
                        rejected: {
                            let mut r = group_rejections(&self.cache, res.rejected.iter());
                            add_excluded(&mut r, res.excluded.as_ref());
                            r
                        },
                        score_plugins,
                        scores,
                        preemption: None,
                    }
                });
                self.cache.set_nominated(&pod, None);
                self.cache.assume_pod(pod.clone(), &node);
                let reservation = match self.fw.run_reserve(&mut state, &pod, &node, &mut self.cache) {
                    Ok(r) => r,
                    Err(st) => {
                        // Upstream: Unreserve (done), forget the pod, and retry after backoff.
                        self.cache.forget_pod(&pod.uid);
                        tracing::info!(pod = %pod.key(), node = %node, message = %st.message(), "reserve failed");
                        profile.attempt(AttemptResult::Error, now);
                        self.scheduling_error(pod, st.message());
                        return;
                    }
                };
                self.stats.scheduled += 1;
                self.queue.done(&pod.uid);
                let explain = explain.map(|e| e.to_json());
                if let Some(e) = &explain {
                    self.pending_explains.insert(pod.uid.clone(), e.clone());
                }
                self.bind(pod, node, explain, reservation, timing);
            }
            Err(failure) => {
                let (mut diag, state) = *failure;
                let mut nominated = None;
                let mut preemption_msg = None;
                let message = if diag.num_all_nodes == 0 {
                    ERR_NO_NODES_AVAILABLE.to_string()
                } else {
                    if self.cfg.preemption {
                        match default_preemption::preempt(&self.fw, state.as_ref(), &pod, &self.cache, &diag) {
                            Ok(c) => {
                                let node = self.cache.node_name(c.node).to_string();
                                for v in &c.victims {
                                    if self.cfg.record_events {
                                        self.writer.event(
                                            v,
                                            "Normal",
                                            "Preempted",
                                            "Preempting",
                                            format!("Preempted by pod {} on node {}", pod.uid, node),
                                        );
                                    }
                                    self.writer.delete_victim(v.clone());
                                }
                                preemption_msg =
                                    Some(format!("nominated to {node}, evicting {} pod(s)", c.victims.len()));
                                nominated = Some(node);
                            }
                            Err(msg) => {
                                preemption_msg = Some(msg.clone());
                                diag.post_filter_msg = Some(format!("preemption: {msg}"));
                            }
                        }
                    }
                    diag.message()
                };
                self.stats.unschedulable += 1;
                // Upstream: a FitError is `unschedulable`; no nodes at all is an error.
                let result = if diag.num_all_nodes == 0 {
                    AttemptResult::Error
                } else {
                    AttemptResult::Unschedulable
                };
                profile.attempt(result, now);
                tracing::debug!(pod = %pod.key(), %message, "pod is unschedulable");
                self.queue.unschedulable(&pod.uid, diag.unschedulable_plugins, now);
                if let Some(n) = &nominated {
                    self.cache.set_nominated(&pod, Some(n));
                }
                let explain = self.cfg.explain.then(|| {
                    Explain {
                        time: now_rfc3339(),
                        result: "Unschedulable".into(),
                        node: None,
                        message: Some(message.clone()),
                        nodes: diag.num_all_nodes,
                        evaluated: diag.node_statuses.len(),
                        feasible: 0,
                        rejected: {
                            let mut r = group_rejections(&self.cache, diag.node_statuses.iter());
                            add_excluded(&mut r, diag.excluded.as_ref());
                            r
                        },
                        score_plugins: Vec::new(),
                        scores: Vec::new(),
                        preemption: preemption_msg,
                    }
                    .to_json()
                });
                if self.cfg.record_events {
                    self.writer
                        .event(&pod, "Warning", "FailedScheduling", "Scheduling", message.clone());
                }
                self.writer
                    .unschedulable(pod, "Unschedulable", message, nominated, explain);
            }
        }
    }

    /// The binding cycle, on a task of its own: the PreBind work (which may wait long, for
    /// volumes to be bound), then the binding itself.
    fn bind(
        &self,
        pod: Arc<PodInfo>,
        node: String,
        explain: Option<String>,
        reservation: Reservation,
        timing: AttemptTiming,
    ) {
        let client = self.client.clone();
        let tx = self.tx.clone();
        let limit = self.binds.clone();
        let Reservation { pre_bind, unreserve } = reservation;
        tokio::spawn(async move {
            let result = match run_pre_bind(&client, pre_bind).await {
                Err(e) => Err(e),
                Ok(()) => match limit.acquire().await {
                    Ok(_permit) => bind_pod(&client, &pod, &node, explain)
                        .await
                        .map_err(|(code, msg)| BindFailure::Api(code, msg)),
                    Err(_) => Err(BindFailure::Api(0, "scheduler shutting down".to_string())),
                },
            };
            let _ = tx.send(Msg::Bound {
                info: pod,
                node,
                unreserve,
                result,
                timing,
            });
        });
    }
}

/// Runs the PreBind plugins' work in order; the first failure ends the binding cycle.
async fn run_pre_bind(client: &Client, work: Vec<(&'static str, PreBindWork)>) -> Result<(), BindFailure> {
    for (plugin, w) in work {
        w(client.clone())
            .await
            .map_err(|msg| BindFailure::PreBind(plugin, msg))?;
    }
    Ok(())
}

/// The body of a `pods/binding` create, serialized straight from borrowed fields (a bind is
/// sent for every scheduled pod).
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct BindingBody<'a> {
    api_version: &'static str,
    kind: &'static str,
    metadata: BindingMeta<'a>,
    target: BindingTarget<'a>,
}

#[derive(serde::Serialize)]
struct BindingMeta<'a> {
    name: &'a str,
    namespace: &'a str,
    uid: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    annotations: Option<BindingAnnotations<'a>>,
}

/// `{EXPLAIN_ANNOTATION: explain}`.
struct BindingAnnotations<'a>(&'a str);

impl serde::Serialize for BindingAnnotations<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(1))?;
        m.serialize_entry(EXPLAIN_ANNOTATION, self.0)?;
        m.end()
    }
}

#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct BindingTarget<'a> {
    api_version: &'static str,
    kind: &'static str,
    name: &'a str,
}

/// The JSON body binding `pod` to `node`, carrying the scheduling explanation as an annotation.
fn binding_json(pod: &PodInfo, node: &str, explain: Option<&str>) -> serde_json::Result<Vec<u8>> {
    serde_json::to_vec(&BindingBody {
        api_version: "v1",
        kind: "Binding",
        metadata: BindingMeta {
            name: &pod.name,
            namespace: &pod.namespace,
            uid: &pod.uid,
            annotations: explain.map(BindingAnnotations),
        },
        target: BindingTarget {
            api_version: "v1",
            kind: "Node",
            name: node,
        },
    })
}

/// POST pods/NAME/binding (the reply is not decoded: only success matters).
pub async fn bind_pod(
    client: &Client,
    pod: &PodInfo,
    node: &str,
    explain: Option<String>,
) -> Result<(), (u16, String)> {
    let bytes = binding_json(pod, node, explain.as_deref()).map_err(|e| (0, e.to_string()))?;
    let req = kube::core::Request::new(format!("/api/v1/namespaces/{}/pods", pod.namespace))
        .create_subresource("binding", &pod.name, &PostParams::default(), bytes)
        .map_err(|e| (0, e.to_string()))?;
    match client.request_text(req).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) => Err((s.code, s.message.clone())),
        Err(e) => Err((0, e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod_info() -> PodInfo {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "u-1"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        }))
        .expect("a pod");
        PodInfo::new(pod)
    }

    #[test]
    fn binding_body_names_the_pod_by_uid_and_carries_the_explanation() {
        let body: serde_json::Value =
            serde_json::from_slice(&binding_json(&pod_info(), "node-1", Some(r#"{"result":"Scheduled"}"#)).unwrap())
                .unwrap();
        assert_eq!(
            body,
            serde_json::json!({
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {
                    "name": "web",
                    "namespace": "default",
                    "uid": "u-1",
                    "annotations": {EXPLAIN_ANNOTATION: r#"{"result":"Scheduled"}"#},
                },
                "target": {"apiVersion": "v1", "kind": "Node", "name": "node-1"},
            })
        );
        let bare: serde_json::Value =
            serde_json::from_slice(&binding_json(&pod_info(), "node-1", None).unwrap()).unwrap();
        assert!(bare["metadata"].get("annotations").is_none());
        assert_eq!(bare["target"]["name"], "node-1");
    }
}
