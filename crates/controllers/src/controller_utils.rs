//! Shared machinery of the workload controllers (upstream's `pkg/controller/controller_utils.go`
//! and friends): a de-duplicating work queue keyed by `namespace/name`, watches that feed it,
//! event recording, pod readiness/availability, controller references with adopt/release,
//! template hashing and the ranking used to pick pods to delete.
//!
//! The ReplicaSet and Deployment controllers read the objects they act on from the process's
//! shared informers (`informers.rs`); the ReplicaSet controller keeps upstream's expectations
//! ([`ControllerExpectations`]) so that a sync never creates or deletes again while the
//! informer has not yet shown its earlier creations and deletions. The other workload
//! controllers take their events from the shared informers and read what they act on with
//! live reads (gets and lists) at the start of each sync.

use std::cmp::Ordering;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet, VecDeque};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use skiff_api::selector::LabelSelector;
use tokio::sync::Notify;

/// How many pods one sync creates or deletes at most (upstream's `burstReplicas`).
pub const BURST_REPLICAS: usize = 500;

/// The pod deletion cost annotation (lower cost is deleted first).
pub const POD_DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";

/// `namespace/name`.
pub fn key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// Splits a `namespace/name` key.
pub fn split_key(key: &str) -> (&str, &str) {
    key.split_once('/').unwrap_or(("", key))
}

pub fn now() -> Time {
    Time(jiff::Timestamp::now())
}

/// How many keys a controller syncs at once (upstream's default `Concurrent*Syncs`).
pub const WORKERS: usize = 5;

/// A work queue: a key is queued at most once, however often it is added, keys wait their
/// turn in order, and a key is never synced twice at the same time (one added while it is
/// being synced is queued again when that sync ends). `add_after` queues later; failures back
/// off per key.
#[derive(Clone, Default)]
pub struct WorkQueue {
    inner: Arc<parking_lot::Mutex<QueueState>>,
    notify: Arc<Notify>,
}

#[derive(Default)]
struct QueueState {
    /// Queued keys and when each was queued.
    queued: HashMap<String, std::time::Instant>,
    order: VecDeque<String>,
    processing: HashSet<String>,
    again: HashSet<String>,
    failures: HashMap<String, u32>,
    /// Keys waiting to be added, each with ONE deadline, the earliest asked for (upstream's
    /// delaying queue's `knownEntries`).
    waiting: HashMap<String, std::time::Instant>,
    /// The same deadlines in time order; an entry whose deadline `waiting` no longer holds
    /// (an earlier one replaced it, or it was added) is skipped.
    deadlines: BinaryHeap<Reverse<(std::time::Instant, String)>>,
    /// The queue's metrics, once [`WorkQueue::run`] has named it.
    metrics: Option<crate::metrics::QueueMetrics>,
}

impl WorkQueue {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn add(&self, key: String) {
        let mut s = self.inner.lock();
        if s.processing.contains(&key) {
            s.again.insert(key);
            return;
        }
        if let std::collections::hash_map::Entry::Vacant(e) = s.queued.entry(key) {
            let key = e.key().clone();
            e.insert(std::time::Instant::now());
            s.order.push_back(key);
            if let Some(m) = &s.metrics {
                m.adds.inc();
                m.depth.set(s.order.len() as i64);
            }
            drop(s);
            self.notify.notify_one();
        }
    }

    /// Adds `key` once `after` has passed. A key waits with one deadline only, the earliest
    /// asked for: asking again for a later time changes nothing, for an earlier one moves it
    /// (upstream's delaying queue, `waitingLoop` with `knownEntries`).
    pub fn add_after(&self, key: String, after: Duration) {
        if after.is_zero() {
            self.add(key);
            return;
        }
        let deadline = std::time::Instant::now() + after;
        {
            let mut s = self.inner.lock();
            match s.waiting.get(&key) {
                Some(t) if *t <= deadline => return,
                _ => {}
            }
            s.waiting.insert(key.clone(), deadline);
            s.deadlines.push(Reverse((deadline, key)));
        }
        // The worker waiting for keys looks at the new deadline.
        self.notify.notify_one();
    }

    /// Adds the waiting keys whose deadline has passed; returns the next deadline.
    fn promote_due(&self) -> Option<std::time::Instant> {
        let now = std::time::Instant::now();
        let mut due = Vec::new();
        let next = {
            let mut s = self.inner.lock();
            loop {
                let Some(Reverse((t, _))) = s.deadlines.peek() else {
                    break None;
                };
                if *t > now {
                    break Some(*t);
                }
                let Some(Reverse((t, k))) = s.deadlines.pop() else {
                    break None;
                };
                if s.waiting.get(&k) == Some(&t) {
                    s.waiting.remove(&k);
                    due.push(k);
                }
            }
        };
        for k in due {
            self.add(k);
        }
        next
    }

    /// How many keys wait for a deadline.
    pub fn waiting_len(&self) -> usize {
        self.inner.lock().waiting.len()
    }

    /// Requeue after a failure, with upstream's per-item exponential backoff (5 ms doubling,
    /// capped here at 30 s).
    fn add_rate_limited(&self, key: String) {
        let n = {
            let mut s = self.inner.lock();
            if let Some(m) = &s.metrics {
                m.retries.inc();
            }
            let n = s.failures.entry(key.clone()).or_insert(0);
            *n = n.saturating_add(1);
            *n
        };
        let ms = 5u64.saturating_mul(1u64 << n.min(20)).min(30_000);
        self.add_after(key, Duration::from_millis(ms));
    }

    fn forget(&self, key: &str) {
        self.inner.lock().failures.remove(key);
    }

    /// The next key, now marked as being processed.
    async fn next(&self) -> String {
        loop {
            let deadline = self.promote_due();
            {
                let mut s = self.inner.lock();
                if let Some(k) = s.order.pop_front() {
                    let queued = s.queued.remove(&k);
                    if let Some(m) = &s.metrics {
                        m.depth.set(s.order.len() as i64);
                        if let Some(t) = queued {
                            m.queue_duration.observe(skiff_metrics::seconds_since(t));
                        }
                    }
                    s.processing.insert(k.clone());
                    return k;
                }
            }
            // Re-check at the next deadline, and now and then, so a wake-up lost to a cancelled
            // wait costs little.
            let mut wait = Duration::from_millis(500);
            if let Some(d) = deadline {
                wait = wait.min(d.saturating_duration_since(std::time::Instant::now()));
            }
            let _ = tokio::time::timeout(wait, self.notify.notified()).await;
        }
    }

    /// The sync of `key` ended: queue it again if it was added meanwhile.
    fn done(&self, key: &str) {
        let again = {
            let mut s = self.inner.lock();
            s.processing.remove(key);
            s.again.remove(key)
        };
        if again {
            self.add(key.to_string());
        }
    }

    /// Process keys, up to [`WORKERS`] at a time, forever: `sync` returns when to sync the key
    /// again.
    pub async fn run<F, Fut>(self, name: &'static str, sync: F) -> anyhow::Result<()>
    where
        F: Fn(String) -> Fut,
        Fut: Future<Output = anyhow::Result<Option<Duration>>>,
    {
        use futures::stream::FuturesUnordered;
        let metrics = crate::metrics::QueueMetrics::new(name);
        {
            let mut s = self.inner.lock();
            metrics.depth.set(s.order.len() as i64);
            s.metrics = Some(metrics.clone());
        }
        let mut inflight = FuturesUnordered::new();
        loop {
            tokio::select! {
                key = self.next(), if inflight.len() < WORKERS => {
                    let fut = sync(key.clone());
                    let work = metrics.work_duration.clone();
                    inflight.push(async move {
                        let start = std::time::Instant::now();
                        let result = fut.await;
                        work.observe(skiff_metrics::seconds_since(start));
                        (key, result)
                    });
                }
                Some((key, result)) = inflight.next(), if !inflight.is_empty() => {
                    self.done(&key);
                    match result {
                        Ok(again) => {
                            self.forget(&key);
                            if let Some(d) = again {
                                self.add_after(key, d);
                            }
                        }
                        Err(e) => {
                            tracing::debug!(controller = name, key, error = format!("{e:#}"), "sync failed; will retry");
                            self.add_rate_limited(key);
                        }
                    }
                }
            }
        }
    }
}

/// How long expectations hold before a sync goes ahead anyway (upstream's `ExpectationsTimeout`).
pub const EXPECTATIONS_TIMEOUT: Duration = Duration::from_secs(5 * 60);

/// Upstream's `ControllerExpectations` with `UIDTrackingControllerExpectations`' deletions: per
/// controller key, how many creations and which deletions it has asked for that its informer
/// has not shown yet. While any are outstanding (and for at most [`EXPECTATIONS_TIMEOUT`]), the
/// controller must not create or delete again: its cache does not show its own writes yet.
#[derive(Clone, Default)]
pub struct ControllerExpectations {
    inner: Arc<parking_lot::Mutex<HashMap<String, Expectation>>>,
}

struct Expectation {
    add: i64,
    del: i64,
    /// The deletions asked for, by the deleted objects' keys.
    deleting: HashSet<String>,
    set_at: std::time::Instant,
}

impl ControllerExpectations {
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether the controller may act: nothing is recorded for `key`, everything recorded was
    /// observed, or the record is older than [`EXPECTATIONS_TIMEOUT`].
    pub fn satisfied(&self, key: &str) -> bool {
        match self.inner.lock().get(key) {
            None => true,
            Some(e) => (e.add <= 0 && e.del <= 0) || e.set_at.elapsed() > EXPECTATIONS_TIMEOUT,
        }
    }

    /// `n` creations are about to be sent (replacing whatever was recorded).
    pub fn expect_creations(&self, key: &str, n: usize) {
        self.inner.lock().insert(
            key.to_string(),
            Expectation {
                add: n as i64,
                del: 0,
                deleting: HashSet::new(),
                set_at: std::time::Instant::now(),
            },
        );
    }

    /// The objects of these keys are about to be deleted (replacing whatever was recorded).
    pub fn expect_deletions(&self, key: &str, deleted: impl IntoIterator<Item = String>) {
        let deleting: HashSet<String> = deleted.into_iter().collect();
        self.inner.lock().insert(
            key.to_string(),
            Expectation {
                add: 0,
                del: deleting.len() as i64,
                deleting,
                set_at: std::time::Instant::now(),
            },
        );
    }

    /// The informer showed one of the controller's creations (or one was not sent, or failed).
    pub fn creation_observed(&self, key: &str) {
        if let Some(e) = self.inner.lock().get_mut(key) {
            e.add -= 1;
        }
    }

    /// The informer showed the deletion of `object` (or it failed); counted once per object.
    pub fn deletion_observed(&self, key: &str, object: &str) {
        if let Some(e) = self.inner.lock().get_mut(key)
            && e.deleting.remove(object)
        {
            e.del -= 1;
        }
    }

    /// The controller is gone: forget its record.
    pub fn delete(&self, key: &str) {
        self.inner.lock().remove(key);
    }
}

/// Queue the keys `map` gives for every object a shared informer adds, changes (the new
/// object) or deletes: the shared informer's counterpart of [`spawn_watch`].
pub fn on_changes<K, F>(informer: &crate::informers::Informer<K>, queue: WorkQueue, map: F)
where
    K: crate::informers::InformerKind,
    F: Fn(&K) -> Vec<String> + Send + Sync + 'static,
{
    use crate::informers::Change;
    informer.add_handler(move |c| {
        let (Change::Added(o) | Change::Updated { new: o, .. } | Change::Deleted(o)) = c;
        for k in map(o) {
            queue.add(k);
        }
    });
}

/// Watch `api` and queue the keys `map` gives for every added, changed or deleted object.
pub fn spawn_watch<K, F>(api: Api<K>, queue: WorkQueue, map: F)
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
    F: Fn(&K) -> Vec<String> + Send + 'static,
{
    spawn_watch_events(api, queue, move |o: &K, _deleted: bool| map(o));
}

/// Like [`spawn_watch`], and `map` is told whether the object was deleted.
pub fn spawn_watch_events<K, F>(api: Api<K>, queue: WorkQueue, map: F)
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
    F: FnMut(&K, bool) -> Vec<String> + Send + 'static,
{
    spawn_watch_config(api, watcher::Config::default(), queue, map);
}

/// Like [`spawn_watch_events`], watching only what `config` selects.
pub fn spawn_watch_config<K, F>(api: Api<K>, config: watcher::Config, queue: WorkQueue, mut map: F)
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
    F: FnMut(&K, bool) -> Vec<String> + Send + 'static,
{
    tokio::spawn(async move {
        let mut stream = watcher::watcher(api, config).boxed();
        while let Some(ev) = stream.next().await {
            let keys = match ev {
                Ok(watcher::Event::Apply(o)) | Ok(watcher::Event::InitApply(o)) => map(&o, false),
                Ok(watcher::Event::Delete(o)) => map(&o, true),
                Ok(_) => Vec::new(),
                Err(e) => {
                    tracing::debug!(error = %e, "controller watch error");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    Vec::new()
                }
            };
            for k in keys {
                queue.add(k);
            }
        }
    });
}

/// Keeps one object named `name` of kind `K` in every namespace that is not being deleted
/// (upstream's ServiceAccounts controller and root CA publisher share this shape): `sync` runs for
/// a namespace when the namespace is seen, when its object is deleted and, with `on_change`, when
/// its object changes; it is skipped while the namespace is being deleted or is gone.
pub async fn run_per_namespace<K, F, Fut>(
    client: kube::Client,
    controller: &'static str,
    name: &'static str,
    on_change: bool,
    sync: F,
) -> anyhow::Result<()>
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static,
    F: Fn(String) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    use k8s_openapi::api::core::v1::Namespace;
    let queue = WorkQueue::new();
    let namespaces = spawn_store_watch(
        Api::<Namespace>::all(client.clone()),
        queue.clone(),
        |ns: &Namespace| match (&ns.metadata.name, &ns.metadata.deletion_timestamp) {
            (Some(n), None) => vec![n.clone()],
            _ => Vec::new(),
        },
    );
    spawn_watch_config(
        Api::<K>::all(client),
        watcher::Config::default().fields(&format!("metadata.name={name}")),
        queue.clone(),
        move |o: &K, deleted| match &o.meta().namespace {
            Some(ns) if deleted || on_change => vec![ns.clone()],
            _ => Vec::new(),
        },
    );
    queue
        .run(controller, |ns| {
            // The store holds what the namespace watch delivered, which queued this sync.
            let active = namespaces
                .get(&kube::runtime::reflector::ObjectRef::new(&ns))
                .is_some_and(|n| n.metadata.deletion_timestamp.is_none());
            let work = active.then(|| sync(ns));
            async move {
                if let Some(work) = work {
                    work.await?;
                }
                Ok(None)
            }
        })
        .await
}

/// The API server's refusal to create anything in a namespace being deleted (upstream's
/// `NamespaceTerminating` cause).
pub fn is_namespace_terminating(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 403
        && s.details.as_ref().is_some_and(|d| d.causes.iter().any(|c| c.reason == "NamespaceTerminating")))
}

/// Watch a kind into a store and queue every object's own key; returns the store.
pub fn spawn_owner_watch<K>(api: Api<K>, queue: WorkQueue) -> Store<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    spawn_store_watch(api, queue, |o: &K| self_key(o))
}

/// Drops an object's managedFields before a cache keeps it, as kube-controller-manager's
/// informers do (its factory's trim transform): no controller reads them, and decoded they are
/// the largest part of a pod in memory.
pub fn trim_managed_fields<K: kube::Resource>(mut obj: K) -> K {
    obj.meta_mut().managed_fields = None;
    obj
}

/// A watch whose objects are trimmed as [`trim_managed_fields`] before anyone sees them.
pub fn trimmed_watcher<K>(api: Api<K>) -> impl futures::Stream<Item = watcher::Result<watcher::Event<K>>> + Send
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    watcher::watcher(api, watcher::Config::default())
        .map(|ev| ev.map(|ev| ev.modify(|o| o.meta_mut().managed_fields = None)))
}

/// Watch a kind into a store, queueing the keys `map` gives for every event; returns the store.
pub fn spawn_store_watch<K, F>(api: Api<K>, queue: WorkQueue, map: F) -> Store<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    F: Fn(&K) -> Vec<String> + Send + 'static,
{
    spawn_store_watch_events(api, queue, move |o: &K, _deleted: bool| map(o))
}

/// Like [`spawn_store_watch`], and `map` is told whether the object was deleted; the store
/// already holds the event's outcome when `map` runs.
pub fn spawn_store_watch_events<K, F>(api: Api<K>, queue: WorkQueue, mut map: F) -> Store<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    F: FnMut(&K, bool) -> Vec<String> + Send + 'static,
{
    let (reader, writer) = reflector::store();
    tokio::spawn(async move {
        let mut stream = reflector::reflector(writer, trimmed_watcher(api)).boxed();
        while let Some(ev) = stream.next().await {
            let (o, deleted) = match ev {
                Ok(watcher::Event::Apply(o)) | Ok(watcher::Event::InitApply(o)) => (o, false),
                Ok(watcher::Event::Delete(o)) => (o, true),
                Ok(_) => continue,
                Err(e) => {
                    tracing::debug!(error = %e, "owner watch error");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            for k in map(&o, deleted) {
                queue.add(k);
            }
        }
    });
    reader
}

/// Keys of the owners (of `kind`, from `store`) a pod concerns: its controller, or for an
/// orphan every owner in its namespace whose selector matches it.
pub fn owner_keys<K>(
    store: &Store<K>,
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    kind: &str,
    selector: impl Fn(&K) -> Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>,
) -> Vec<String>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    if let Some(c) = controller_ref(meta) {
        return if c.kind == kind {
            vec![key(meta.namespace.as_deref().unwrap_or_default(), &c.name)]
        } else {
            Vec::new()
        };
    }
    let ns = meta.namespace.clone().unwrap_or_default();
    store
        .state()
        .iter()
        .filter(|o| o.meta().namespace.as_deref() == Some(ns.as_str()))
        .filter(|o| labels_match(&selector_of(selector(o)), meta))
        .flat_map(|o| self_key(o.as_ref()))
        .collect()
}

/// The key of the object itself.
pub fn self_key<K: kube::Resource>(o: &K) -> Vec<String> {
    let m = o.meta();
    match (&m.namespace, &m.name) {
        (Some(ns), Some(n)) => vec![key(ns, n)],
        _ => Vec::new(),
    }
}

/// The key of the object's controller, when it is of `kind`.
pub fn controller_key(meta: &ObjectMeta, kind: &str) -> Option<String> {
    let c = controller_ref(meta)?;
    (c.kind == kind).then(|| key(meta.namespace.as_deref().unwrap_or_default(), &c.name))
}

/// The controller owner reference, if any.
pub fn controller_ref(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references
        .as_ref()?
        .iter()
        .find(|o| o.controller == Some(true))
}

/// The controller reference an owner sets on what it creates.
pub fn new_controller_ref(owner: &ObjectMeta, api_version: &str, kind: &str) -> OwnerReference {
    OwnerReference {
        api_version: api_version.to_string(),
        kind: kind.to_string(),
        name: owner.name.clone().unwrap_or_default(),
        uid: owner.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// Records core/v1 Events as one component: the one recorder every component uses
/// (`skiff_record`: upstream's correlator, a bounded queue, never waiting for the write).
pub use skiff_record::EventRecorder as Recorder;

// ---- pods ----

pub fn pod_phase(pod: &Pod) -> &str {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("")
}

/// Not terminated and not being deleted (upstream's `IsPodActive`).
pub fn is_pod_active(pod: &Pod) -> bool {
    let phase = pod_phase(pod);
    phase != "Succeeded" && phase != "Failed" && pod.metadata.deletion_timestamp.is_none()
}

pub fn is_pod_terminating(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

fn ready_condition(pod: &Pod) -> Option<&k8s_openapi::api::core::v1::PodCondition> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
}

pub fn is_pod_ready(pod: &Pod) -> bool {
    ready_condition(pod).is_some_and(|c| c.status == "True")
}

/// Ready for at least `min_ready_seconds` (upstream's `IsPodAvailable`).
pub fn is_pod_available(pod: &Pod, min_ready_seconds: i32, now: jiff::Timestamp) -> bool {
    let Some(c) = ready_condition(pod) else {
        return false;
    };
    if c.status != "True" {
        return false;
    }
    if min_ready_seconds <= 0 {
        return true;
    }
    match &c.last_transition_time {
        Some(t) => t.0 + jiff::SignedDuration::from_secs(i64::from(min_ready_seconds)) <= now,
        None => false,
    }
}

/// When a ready pod turns available, so the owner can sync again then.
pub fn available_after(pod: &Pod, min_ready_seconds: i32, now: jiff::Timestamp) -> Option<Duration> {
    if min_ready_seconds <= 0 || !is_pod_ready(pod) || is_pod_available(pod, min_ready_seconds, now) {
        return None;
    }
    let t = ready_condition(pod)?.last_transition_time.as_ref()?.0;
    let at = t + jiff::SignedDuration::from_secs(i64::from(min_ready_seconds));
    let d = at.duration_since(now);
    Some(Duration::from_millis(d.as_millis().max(0) as u64 + 100))
}

/// A pod from a template, as upstream's `GetPodFromTemplate`.
pub fn pod_from_template(
    template: &PodTemplateSpec,
    generate_name: &str,
    owner: Option<OwnerReference>,
    namespace: &str,
) -> Pod {
    let tm = template.metadata.clone().unwrap_or_default();
    Pod {
        metadata: ObjectMeta {
            generate_name: Some(generate_name.to_string()),
            namespace: Some(namespace.to_string()),
            labels: tm.labels,
            annotations: tm.annotations,
            finalizers: tm.finalizers,
            owner_references: owner.map(|o| vec![o]),
            ..Default::default()
        },
        spec: template.spec.clone(),
        status: None,
    }
}

/// Upstream's pod name prefix for generateName: `<owner>-`, trimmed to leave room for the
/// random suffix.
pub fn pod_name_prefix(owner: &str) -> String {
    let mut p = format!("{owner}-");
    if p.len() > 58 {
        p.truncate(58);
    }
    p
}

fn restarts(pod: &Pod) -> i32 {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .map(|cs| cs.iter().map(|c| c.restart_count).max().unwrap_or(0))
        .unwrap_or(0)
}

fn deletion_cost(pod: &Pod) -> i32 {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(POD_DELETION_COST))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn phase_rank(pod: &Pod) -> u8 {
    match pod_phase(pod) {
        "Pending" => 0,
        "Unknown" => 1,
        "Running" => 2,
        _ => 3,
    }
}

/// Upstream's `ActivePodsWithRanks.Less`: `Less` comes first in the delete order.
/// `rank` is how many related pods share the pod's node.
pub fn compare_for_deletion(a: &Pod, rank_a: usize, b: &Pod, rank_b: usize) -> Ordering {
    let node = |p: &Pod| p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
    // 1. unassigned < assigned
    let (na, nb) = (node(a).is_empty(), node(b).is_empty());
    if na != nb {
        return if na { Ordering::Less } else { Ordering::Greater };
    }
    // 2. Pending < Unknown < Running
    let (pa, pb) = (phase_rank(a), phase_rank(b));
    if pa != pb {
        return pa.cmp(&pb);
    }
    // 3. not ready < ready
    let (ra, rb) = (is_pod_ready(a), is_pod_ready(b));
    if ra != rb {
        return if !ra { Ordering::Less } else { Ordering::Greater };
    }
    // 4. lower deletion cost first
    let (ca, cb) = (deletion_cost(a), deletion_cost(b));
    if ca != cb {
        return ca.cmp(&cb);
    }
    // 5. doubled up (higher rank) first
    if rank_a != rank_b {
        return rank_b.cmp(&rank_a);
    }
    // 6. been ready for less time first
    if ra && rb {
        let t = |p: &Pod| ready_condition(p).and_then(|c| c.last_transition_time.as_ref().map(|t| t.0));
        if let (Some(x), Some(y)) = (t(a), t(b))
            && x != y
        {
            return y.cmp(&x);
        }
    }
    // 7. more restarts first
    let (xa, xb) = (restarts(a), restarts(b));
    if xa != xb {
        return xb.cmp(&xa);
    }
    // 8. newer first
    let ct = |p: &Pod| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
    match (ct(a), ct(b)) {
        (Some(x), Some(y)) if x != y => y.cmp(&x),
        _ => Ordering::Equal,
    }
}

/// The `n` pods to delete first, ranked by how many of `related` share their node.
pub fn pods_to_delete<'a>(pods: &[&'a Pod], related: &[&Pod], n: usize) -> Vec<&'a Pod> {
    let mut on_node: HashMap<String, usize> = HashMap::new();
    for p in related {
        if let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.clone())
            && is_pod_active(p)
        {
            *on_node.entry(node).or_default() += 1;
        }
    }
    let rank = |p: &Pod| {
        p.spec
            .as_ref()
            .and_then(|s| s.node_name.as_ref())
            .and_then(|n| on_node.get(n).copied())
            .unwrap_or(0)
    };
    let mut ranked: Vec<(&Pod, usize)> = pods.iter().map(|p| (*p, rank(p))).collect();
    ranked.sort_by(|(a, ra), (b, rb)| compare_for_deletion(a, *ra, b, *rb));
    ranked.into_iter().take(n).map(|(p, _)| p).collect()
}

// ---- ownership ----

/// What claiming found: the objects this owner controls now.
pub struct Claimed<T> {
    pub owned: Vec<T>,
}

/// Upstream's `ClaimObjects` for anything with metadata: keep owned objects that still match,
/// adopt matching orphans (unless the owner is being deleted), release owned ones that no
/// longer match. Adoption and release are merge patches of `ownerReferences` guarded by the
/// object's uid.
///
/// The objects are the owner's kind's values or `Arc`s of them (a shared informer's cache).
pub async fn claim<K, T>(
    api: &Api<K>,
    owner: &ObjectMeta,
    owner_api_version: &str,
    owner_kind: &str,
    selector: &LabelSelector,
    objects: Vec<T>,
) -> anyhow::Result<Claimed<T>>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug,
    T: std::borrow::Borrow<K> + From<K>,
{
    let uid = owner.uid.clone().unwrap_or_default();
    let owner_deleting = owner.deletion_timestamp.is_some();
    let mut owned = Vec::new();
    for obj in objects {
        let m = obj.borrow().meta();
        let labels = m.labels.clone().unwrap_or_default();
        let matches = selector.matches(&labels);
        match controller_ref(m) {
            Some(c) if c.uid == uid => {
                if matches || owner_deleting {
                    owned.push(obj);
                } else if m.deletion_timestamp.is_none() {
                    // Release.
                    let refs: Vec<&OwnerReference> =
                        m.owner_references.iter().flatten().filter(|o| o.uid != uid).collect();
                    let patch = json!({"metadata": {"ownerReferences": refs, "uid": m.uid}});
                    if let Some(name) = &m.name
                        && let Err(e) = api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await
                        && !is_not_found(&e)
                    {
                        return Err(e.into());
                    }
                }
            }
            Some(_) => {}
            None => {
                if !matches || owner_deleting || m.deletion_timestamp.is_some() {
                    continue;
                }
                let mut refs: Vec<OwnerReference> = m.owner_references.clone().unwrap_or_default();
                refs.push(new_controller_ref(owner, owner_api_version, owner_kind));
                let patch = json!({"metadata": {"ownerReferences": refs, "uid": m.uid}});
                let Some(name) = m.name.clone() else { continue };
                match api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                    Ok(adopted) => owned.push(T::from(adopted)),
                    Err(e) if is_not_found(&e) || is_conflict(&e) || is_invalid(&e) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
    Ok(Claimed { owned })
}

pub fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

pub fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

pub fn is_already_exists(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409 && s.reason == "AlreadyExists")
}

fn is_invalid(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 422)
}

/// Delete, treating "already gone" as done.
pub async fn delete_ignoring_missing<K>(api: &Api<K>, name: &str, dp: &DeleteParams) -> anyhow::Result<()>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, dp).await {
        Ok(_) => Ok(()),
        Err(e) if is_not_found(&e) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Get, `None` when missing.
pub async fn get_opt<K>(api: &Api<K>, name: &str) -> anyhow::Result<Option<K>>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    Ok(api.get_opt(name).await?)
}

// ---- hashing ----

/// 32-bit FNV-1a.
pub fn fnv32a(data: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in data {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

const ALPHANUMS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// Upstream's `rand.SafeEncodeString`: every byte mapped into an alphabet without vowels
/// (so no words) and without the look-alikes 0, 1 and 3.
pub fn safe_encode_string(s: &str) -> String {
    s.bytes()
        .map(|b| ALPHANUMS[usize::from(b) % ALPHANUMS.len()] as char)
        .collect()
}

/// Upstream's `controller.ComputeHash`: FNV-1a of the template (its canonical JSON here), then
/// the collision count as 4 little-endian bytes, as the decimal of the sum, safely encoded.
pub fn compute_hash(template: &PodTemplateSpec, collision_count: Option<i32>) -> String {
    let mut data = canonical_json(&serde_json::to_value(template).unwrap_or(Value::Null)).into_bytes();
    if let Some(c) = collision_count {
        data.extend_from_slice(&(c as u32).to_le_bytes());
    }
    safe_encode_string(&fnv32a(&data).to_string())
}

/// JSON with object keys sorted at every level: the same object always hashes the same.
pub fn canonical_json(v: &Value) -> String {
    fn sort(v: &Value) -> Value {
        match v {
            Value::Object(m) => {
                let sorted: BTreeMap<&String, Value> = m.iter().map(|(k, v)| (k, sort(v))).collect();
                let mut out = serde_json::Map::new();
                for (k, v) in sorted {
                    out.insert(k.clone(), v);
                }
                Value::Object(out)
            }
            Value::Array(a) => Value::Array(a.iter().map(sort).collect()),
            other => other.clone(),
        }
    }
    sort(v).to_string()
}

// ---- int-or-percent ----

/// Upstream's `GetScaledValueFromIntOrPercent`: an int as is, `"N%"` of `total` rounded up
/// or down.
pub fn scaled_value(v: Option<&IntOrString>, total: i32, round_up: bool) -> anyhow::Result<i32> {
    match v {
        None => Ok(0),
        Some(IntOrString::Int(i)) => Ok(*i),
        Some(IntOrString::String(s)) => {
            let Some(p) = s.strip_suffix('%') else {
                anyhow::bail!("invalid value for IntOrString: invalid type: string is not a percentage");
            };
            let p: i64 = p
                .parse()
                .map_err(|_| anyhow::anyhow!("invalid value \"{s}\": not a percentage"))?;
            let product = p * i64::from(total);
            let v = if round_up {
                (product + 99).div_euclid(100)
            } else {
                product.div_euclid(100)
            };
            Ok(v as i32)
        }
    }
}

/// A selector parsed from a typed `LabelSelector`; a bad one selects nothing.
pub fn selector_of(s: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>) -> LabelSelector {
    LabelSelector::from_k8s(s).unwrap_or_else(|_| LabelSelector::nothing())
}

/// Whether an object's labels match.
pub fn labels_match(sel: &LabelSelector, meta: &ObjectMeta) -> bool {
    match &meta.labels {
        Some(l) => sel.matches(l),
        None => sel.matches(&BTreeMap::<String, String>::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodCondition, PodSpec, PodStatus};

    fn pod(name: &str, node: Option<&str>, phase: &str, ready: bool) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: node.map(str::to_string),
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some(phase.into()),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn delete_order_prefers_unscheduled_pending_not_ready() {
        let running = pod("running", Some("n1"), "Running", true);
        let unready = pod("unready", Some("n1"), "Running", false);
        let pending = pod("pending", Some("n1"), "Pending", false);
        let unscheduled = pod("unscheduled", None, "Pending", false);
        let all = [&running, &unready, &pending, &unscheduled];
        let order: Vec<&str> = pods_to_delete(&all, &all, 4)
            .iter()
            .map(|p| p.metadata.name.as_deref().unwrap_or(""))
            .collect();
        assert_eq!(order, ["unscheduled", "pending", "unready", "running"]);
    }

    #[test]
    fn delete_order_prefers_doubled_up_nodes() {
        let a = pod("a", Some("n1"), "Running", true);
        let b = pod("b", Some("n2"), "Running", true);
        let c = pod("c", Some("n2"), "Running", true);
        let all = [&a, &b, &c];
        let first = pods_to_delete(&all, &all, 1);
        assert_ne!(first[0].metadata.name.as_deref(), Some("a"));
    }

    #[test]
    fn safe_encoding_uses_upstream_alphabet() {
        // '0' is 48: 48 % 27 = 21 -> '4'; '9' is 57 -> 57 % 27 = 3 -> 'f'.
        assert_eq!(safe_encode_string("09"), "4f");
        assert!(
            safe_encode_string("1234567890")
                .chars()
                .all(|c| ALPHANUMS.contains(&(c as u8)))
        );
    }

    #[test]
    fn fnv32a_matches_reference_vectors() {
        assert_eq!(fnv32a(b""), 0x811c9dc5);
        assert_eq!(fnv32a(b"a"), 0xe40c292c);
        assert_eq!(fnv32a(b"foobar"), 0xbf9cf968);
    }

    #[test]
    fn hash_changes_with_template_and_collisions() {
        let t = PodTemplateSpec::default();
        let h0 = compute_hash(&t, None);
        assert_eq!(h0, compute_hash(&t, None));
        assert_ne!(h0, compute_hash(&t, Some(1)));
        let mut t2 = t.clone();
        t2.metadata = Some(ObjectMeta {
            labels: Some([("a".to_string(), "b".to_string())].into()),
            ..Default::default()
        });
        assert_ne!(h0, compute_hash(&t2, None));
    }

    #[test]
    fn percent_rounding() {
        let p = IntOrString::String("25%".into());
        assert_eq!(scaled_value(Some(&p), 10, true).unwrap(), 3);
        assert_eq!(scaled_value(Some(&p), 10, false).unwrap(), 2);
        assert_eq!(scaled_value(Some(&IntOrString::Int(2)), 10, false).unwrap(), 2);
        assert!(scaled_value(Some(&IntOrString::String("2".into())), 10, false).is_err());
    }

    #[tokio::test]
    async fn queue_metrics_count_adds_retries_and_durations() {
        let q = WorkQueue::new();
        q.add("a".into());
        q.add("a".into());
        q.add("b".into());
        let failed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let runner = {
            let q = q.clone();
            let failed = failed.clone();
            tokio::spawn(q.run("metrics-test-queue", move |key| {
                let failed = failed.clone();
                async move {
                    if key == "b" && !failed.swap(true, std::sync::atomic::Ordering::SeqCst) {
                        anyhow::bail!("first sync of b fails");
                    }
                    Ok(None)
                }
            }))
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        q.add("c".into());
        tokio::time::sleep(Duration::from_millis(300)).await;
        runner.abort();
        let text = skiff_metrics::encode();
        let value = |prefix: &str| -> f64 {
            text.lines()
                .find_map(|l| l.strip_prefix(prefix))
                .unwrap_or_else(|| panic!("{prefix} missing: {text}"))
                .trim()
                .parse()
                .unwrap()
        };
        // "a" and "b" were queued before the controller ran (and named its queue): only "c"
        // and the retry of "b" are adds it saw.
        assert_eq!(value("workqueue_adds_total{name=\"metrics-test-queue\"} "), 2.0);
        assert_eq!(value("workqueue_retries_total{name=\"metrics-test-queue\"} "), 1.0);
        assert_eq!(value("workqueue_depth{name=\"metrics-test-queue\"} "), 0.0);
        assert_eq!(
            value("workqueue_queue_duration_seconds_count{name=\"metrics-test-queue\"} "),
            4.0
        );
        assert_eq!(
            value("workqueue_work_duration_seconds_count{name=\"metrics-test-queue\"} "),
            4.0
        );
        assert!(
            text.contains("workqueue_work_duration_seconds_bucket{name=\"metrics-test-queue\",le=\"1e-08\"}"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn delayed_key_keeps_its_earliest_deadline() {
        let q = WorkQueue::new();
        q.add_after("a/b".into(), Duration::from_secs(30));
        q.add_after("a/b".into(), Duration::from_millis(50));
        // Later than the deadline it holds: nothing changes.
        q.add_after("a/b".into(), Duration::from_secs(60));
        assert_eq!(q.waiting_len(), 1);
        let deadline = q.inner.lock().waiting.get("a/b").copied().unwrap();
        assert!(deadline.saturating_duration_since(std::time::Instant::now()) <= Duration::from_millis(50));
        let start = std::time::Instant::now();
        let k = tokio::time::timeout(Duration::from_secs(5), q.next()).await.unwrap();
        assert_eq!(k, "a/b");
        let waited = start.elapsed();
        assert!(waited >= Duration::from_millis(45), "{waited:?}");
        assert!(waited < Duration::from_secs(5), "{waited:?}");
        q.done("a/b");
        // Handed out once: nothing waits, nothing is queued, the replaced deadlines are stale.
        assert_eq!(q.waiting_len(), 0);
        assert!(q.inner.lock().order.is_empty());
        assert_eq!(q.promote_due().map(|_| ()), Some(()));
        assert!(q.inner.lock().order.is_empty());
        assert!(
            tokio::time::timeout(Duration::from_millis(100), q.next())
                .await
                .is_err(),
            "the key was handed out twice"
        );
    }

    #[tokio::test]
    async fn delayed_keys_come_in_deadline_order() {
        let q = WorkQueue::new();
        q.add_after("late".into(), Duration::from_millis(120));
        q.add_after("early".into(), Duration::from_millis(30));
        q.add_after("now".into(), Duration::ZERO);
        assert_eq!(q.next().await, "now");
        assert_eq!(q.next().await, "early");
        assert_eq!(q.next().await, "late");
    }

    #[test]
    fn expectations_hold_until_observed() {
        let e = ControllerExpectations::new();
        assert!(e.satisfied("ns/rs"));
        e.expect_creations("ns/rs", 2);
        assert!(!e.satisfied("ns/rs"));
        e.creation_observed("ns/rs");
        assert!(!e.satisfied("ns/rs"));
        e.creation_observed("ns/rs");
        assert!(e.satisfied("ns/rs"));
        e.expect_deletions("ns/rs", ["ns/p1".to_string(), "ns/p2".to_string()]);
        assert!(!e.satisfied("ns/rs"));
        e.deletion_observed("ns/rs", "ns/p1");
        // The same deletion seen twice (an update with a deletionTimestamp, then the delete)
        // counts once.
        e.deletion_observed("ns/rs", "ns/p1");
        assert!(!e.satisfied("ns/rs"));
        e.deletion_observed("ns/rs", "ns/p2");
        assert!(e.satisfied("ns/rs"));
        e.expect_creations("ns/rs", 1);
        e.inner.lock().get_mut("ns/rs").unwrap().set_at =
            std::time::Instant::now() - EXPECTATIONS_TIMEOUT - Duration::from_secs(1);
        assert!(e.satisfied("ns/rs"), "expired expectations let the sync go ahead");
        e.delete("ns/rs");
        assert!(e.satisfied("ns/rs"));
    }

    #[tokio::test]
    async fn queue_dedupes_and_never_hands_out_a_key_twice_at_once() {
        let q = WorkQueue::new();
        q.add("a/b".into());
        q.add("a/b".into());
        q.add("a/c".into());
        assert_eq!(q.inner.lock().order.len(), 2);
        let k = q.next().await;
        assert_eq!(k, "a/b");
        // Added while being processed: held back until done.
        q.add("a/b".into());
        assert_eq!(q.next().await, "a/c");
        assert!(q.inner.lock().order.is_empty());
        q.done("a/b");
        assert_eq!(q.next().await, "a/b");
    }
}
