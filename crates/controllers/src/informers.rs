//! Shared informers (upstream's `client-go/informers` `SharedInformerFactory` with its
//! `SharedIndexInformer`s): for each kind, ONE list + watch and ONE cache of decoded objects for
//! every controller of the process. A controller asks the factory for the informer of a kind,
//! registers event handlers (which only queue keys) and reads the cache through listers; the
//! factory starts each informer once.
//!
//! The cache holds each object once, behind an `Arc` (a lister hands out clones of the `Arc`,
//! never of the object), with the indexes the workload controllers read by: the namespace, the
//! uid of the object's controller (its `ownerReference` with `controller: true`), and the objects
//! without a controller per namespace, so "the pods ReplicaSet X controls" and "the orphans that
//! selector S may adopt in namespace N" are lookups rather than scans of every pod.
//!
//! The watch is kube's `watcher` (list, then watch from the list's resourceVersion, relisting when
//! the server answers 410 Gone). A relist replaces the cache: objects it no longer returns are
//! delivered to the handlers as deleted, changed ones as updated.

use std::any::Any;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::runtime::watcher;
use parking_lot::{Mutex, RwLock};
use serde::de::DeserializeOwned;
use skiff_api::selector::LabelSelector;
use tokio::sync::Notify;

use crate::controller_utils as cu;

/// What changed, as handed to every registered handler (upstream's `ResourceEventHandler`:
/// `OnAdd`, `OnUpdate`, `OnDelete`). The cache already holds the outcome when a handler runs.
pub enum Change<'a, K> {
    Added(&'a Arc<K>),
    Updated { old: &'a Arc<K>, new: &'a Arc<K> },
    Deleted(&'a Arc<K>),
}

type Handler<K> = Arc<dyn Fn(Change<'_, K>) + Send + Sync>;

/// The bounds of a kind an informer can hold.
pub trait InformerKind:
    kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static
{
}

impl<K> InformerKind for K where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static
{
}

/// One cache per kind, keyed by `namespace/name` (`name` for cluster-scoped objects).
struct Cache<K> {
    objects: HashMap<String, Arc<K>>,
    by_namespace: HashMap<String, HashSet<String>>,
    by_controller: HashMap<String, HashSet<String>>,
    orphans_by_namespace: HashMap<String, HashSet<String>>,
}

impl<K> Default for Cache<K> {
    fn default() -> Self {
        Cache {
            objects: HashMap::new(),
            by_namespace: HashMap::new(),
            by_controller: HashMap::new(),
            orphans_by_namespace: HashMap::new(),
        }
    }
}

/// The cache key of an object.
pub fn object_key(meta: &ObjectMeta) -> String {
    match &meta.namespace {
        Some(ns) if !ns.is_empty() => cu::key(ns, meta.name.as_deref().unwrap_or_default()),
        _ => meta.name.clone().unwrap_or_default(),
    }
}

fn remove_from(index: &mut HashMap<String, HashSet<String>>, value: &str, key: &str) {
    if let Some(set) = index.get_mut(value) {
        set.remove(key);
        if set.is_empty() {
            index.remove(value);
        }
    }
}

impl<K: kube::Resource> Cache<K> {
    fn index(&mut self, key: &str, meta: &ObjectMeta) {
        let ns = meta.namespace.clone().unwrap_or_default();
        match cu::controller_ref(meta) {
            Some(c) => {
                self.by_controller
                    .entry(c.uid.clone())
                    .or_default()
                    .insert(key.to_string());
            }
            None => {
                self.orphans_by_namespace
                    .entry(ns.clone())
                    .or_default()
                    .insert(key.to_string());
            }
        }
        self.by_namespace.entry(ns).or_default().insert(key.to_string());
    }

    fn unindex(&mut self, key: &str, meta: &ObjectMeta) {
        let ns = meta.namespace.as_deref().unwrap_or_default();
        match cu::controller_ref(meta) {
            Some(c) => remove_from(&mut self.by_controller, &c.uid, key),
            None => remove_from(&mut self.orphans_by_namespace, ns, key),
        }
        remove_from(&mut self.by_namespace, ns, key);
    }

    /// Stores `obj`; returns what it replaced.
    fn upsert(&mut self, obj: Arc<K>) -> Option<Arc<K>> {
        let key = object_key(obj.meta());
        let old = self.objects.insert(key.clone(), obj.clone());
        if let Some(o) = &old {
            self.unindex(&key, o.meta());
        }
        self.index(&key, obj.meta());
        old
    }

    fn remove(&mut self, key: &str) -> Option<Arc<K>> {
        let old = self.objects.remove(key)?;
        self.unindex(key, old.meta());
        Some(old)
    }

    fn collect(&self, keys: Option<&HashSet<String>>) -> Vec<Arc<K>> {
        keys.map(|ks| ks.iter().filter_map(|k| self.objects.get(k).cloned()).collect())
            .unwrap_or_default()
    }
}

struct Inner<K> {
    api: Api<K>,
    cache: RwLock<Cache<K>>,
    handlers: RwLock<Vec<Handler<K>>>,
    started: AtomicBool,
    synced: AtomicBool,
    synced_notify: Notify,
}

/// One kind's shared informer: its cache (the lister) and its handlers. Cheap to clone.
pub struct Informer<K> {
    inner: Arc<Inner<K>>,
}

impl<K> Clone for Informer<K> {
    fn clone(&self) -> Self {
        Informer {
            inner: self.inner.clone(),
        }
    }
}

impl<K: InformerKind> Informer<K> {
    fn new(api: Api<K>) -> Self {
        Informer {
            inner: Arc::new(Inner {
                api,
                cache: RwLock::new(Cache::default()),
                handlers: RwLock::new(Vec::new()),
                started: AtomicBool::new(false),
                synced: AtomicBool::new(false),
                synced_notify: Notify::new(),
            }),
        }
    }

    /// Registers a handler. On an informer that already holds objects, the handler is first
    /// told of each as added (upstream's `AddEventHandler` on a started informer).
    pub fn add_handler(&self, handler: impl Fn(Change<'_, K>) + Send + Sync + 'static) {
        let handler: Handler<K> = Arc::new(handler);
        let existing: Vec<Arc<K>> = {
            let mut handlers = self.inner.handlers.write();
            let existing = self.inner.cache.read().objects.values().cloned().collect();
            handlers.push(handler.clone());
            existing
        };
        for o in &existing {
            handler(Change::Added(o));
        }
    }

    /// Whether the first list has been stored (upstream's `HasSynced`).
    pub fn has_synced(&self) -> bool {
        self.inner.synced.load(Ordering::Acquire)
    }

    /// Waits until the first list has been stored (upstream's `WaitForCacheSync`).
    pub async fn wait_synced(&self) {
        loop {
            let notified = self.inner.synced_notify.notified();
            if self.has_synced() {
                return;
            }
            let _ = tokio::time::timeout(Duration::from_millis(200), notified).await;
        }
    }

    /// The object `namespace/name` (`name` alone for cluster-scoped kinds).
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        let key = if namespace.is_empty() {
            name.to_string()
        } else {
            cu::key(namespace, name)
        };
        self.inner.cache.read().objects.get(&key).cloned()
    }

    /// The object of a work queue key.
    pub fn get_key(&self, key: &str) -> Option<Arc<K>> {
        self.inner.cache.read().objects.get(key).cloned()
    }

    /// Every object.
    pub fn list(&self) -> Vec<Arc<K>> {
        self.inner.cache.read().objects.values().cloned().collect()
    }

    /// The objects of a namespace.
    pub fn list_namespace(&self, namespace: &str) -> Vec<Arc<K>> {
        let cache = self.inner.cache.read();
        cache.collect(cache.by_namespace.get(namespace))
    }

    /// The objects of a namespace whose labels `selector` matches.
    pub fn list_selected(&self, namespace: &str, selector: &LabelSelector) -> Vec<Arc<K>> {
        let cache = self.inner.cache.read();
        let Some(keys) = cache.by_namespace.get(namespace) else {
            return Vec::new();
        };
        keys.iter()
            .filter_map(|k| cache.objects.get(k))
            .filter(|o| cu::labels_match(selector, o.meta()))
            .cloned()
            .collect()
    }

    /// The objects whose controller has this uid.
    pub fn list_controlled_by(&self, uid: &str) -> Vec<Arc<K>> {
        let cache = self.inner.cache.read();
        cache.collect(cache.by_controller.get(uid))
    }

    /// What an owner of uid `uid` with `selector` in `namespace` may claim (upstream's
    /// `ClaimObjects` input): the objects it controls, and the objects of the namespace without
    /// a controller that the selector matches. Objects other controllers own are left out.
    pub fn list_claimable(&self, namespace: &str, uid: &str, selector: &LabelSelector) -> Vec<Arc<K>> {
        let cache = self.inner.cache.read();
        let mut out = cache.collect(cache.by_controller.get(uid));
        if let Some(orphans) = cache.orphans_by_namespace.get(namespace) {
            out.extend(
                orphans
                    .iter()
                    .filter_map(|k| cache.objects.get(k))
                    .filter(|o| cu::labels_match(selector, o.meta()))
                    .cloned(),
            );
        }
        out
    }

    /// How many objects the cache holds.
    pub fn len(&self) -> usize {
        self.inner.cache.read().objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn dispatch(&self, change: Change<'_, K>) {
        let handlers: Vec<Handler<K>> = self.inner.handlers.read().clone();
        for h in &handlers {
            let c = match &change {
                Change::Added(o) => Change::Added(o),
                Change::Updated { old, new } => Change::Updated { old, new },
                Change::Deleted(o) => Change::Deleted(o),
            };
            h(c);
        }
    }

    /// Applies one object as added or updated, then tells the handlers.
    fn apply(&self, obj: K) {
        let new = Arc::new(obj);
        let old = self.inner.cache.write().upsert(new.clone());
        match old {
            Some(old) => {
                // The same version again (a relist of an unchanged object) tells nothing.
                if old.meta().resource_version.is_some() && old.meta().resource_version == new.meta().resource_version {
                    return;
                }
                self.dispatch(Change::Updated { old: &old, new: &new });
            }
            None => self.dispatch(Change::Added(&new)),
        }
    }

    fn delete(&self, obj: K) {
        let key = object_key(obj.meta());
        let old = self.inner.cache.write().remove(&key);
        let gone = old.unwrap_or_else(|| Arc::new(obj));
        self.dispatch(Change::Deleted(&gone));
    }

    /// After a (re)list: whatever the list did not return is gone.
    fn replace_done(&self, listed: &HashSet<String>) {
        let gone: Vec<Arc<K>> = {
            let mut cache = self.inner.cache.write();
            let stale: Vec<String> = cache.objects.keys().filter(|k| !listed.contains(*k)).cloned().collect();
            stale.iter().filter_map(|k| cache.remove(k)).collect()
        };
        for o in &gone {
            self.dispatch(Change::Deleted(o));
        }
        if !self.inner.synced.swap(true, Ordering::AcqRel) {
            self.inner.synced_notify.notify_waiters();
        }
    }

    /// Starts the list + watch, once.
    fn start(&self) {
        if self.inner.started.swap(true, Ordering::AcqRel) {
            return;
        }
        let informer = self.clone();
        tokio::spawn(async move { informer.run().await });
    }

    async fn run(self) {
        let mut stream = cu::trimmed_watcher(self.inner.api.clone()).boxed();
        let mut listed: Option<HashSet<String>> = None;
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(watcher::Event::Init) => listed = Some(HashSet::new()),
                Ok(watcher::Event::InitApply(o)) => {
                    if let Some(l) = listed.as_mut() {
                        l.insert(object_key(o.meta()));
                    }
                    self.apply(o);
                }
                Ok(watcher::Event::InitDone) => {
                    if let Some(l) = listed.take() {
                        self.replace_done(&l);
                    }
                }
                Ok(watcher::Event::Apply(o)) => self.apply(o),
                Ok(watcher::Event::Delete(o)) => self.delete(o),
                Err(e) => {
                    tracing::debug!(
                        kind = %K::kind(&()),
                        error = %e,
                        "shared informer watch error"
                    );
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }
}

/// A kind's group, version and resource (plural).
type KindId = (String, String, String);
/// An `Informer<K>` of some kind.
type AnyInformer = Arc<dyn Any + Send + Sync>;
/// Starts one informer.
type Starter = Box<dyn Fn() + Send + Sync>;

/// Upstream's `SharedInformerFactory`: one informer per kind (group, version, resource) for the
/// whole process. Informers asked for before [`start`](Self::start) start with it; those asked
/// for after it start at once.
#[derive(Clone)]
pub struct SharedInformerFactory {
    client: kube::Client,
    informers: Arc<Mutex<HashMap<KindId, AnyInformer>>>,
    starters: Arc<Mutex<Vec<Starter>>>,
    started: Arc<AtomicBool>,
}

impl SharedInformerFactory {
    /// Informers reading through `client` (its lists and watches).
    pub fn new(client: kube::Client) -> Self {
        SharedInformerFactory {
            client,
            informers: Default::default(),
            starters: Default::default(),
            started: Default::default(),
        }
    }

    /// The informer of kind `K`, made on first use.
    pub fn informer<K: InformerKind>(&self) -> Informer<K> {
        let id = (
            K::group(&()).into_owned(),
            K::version(&()).into_owned(),
            K::plural(&()).into_owned(),
        );
        let mut informers = self.informers.lock();
        if let Some(i) = informers
            .get(&id)
            .and_then(|a| a.clone().downcast::<Informer<K>>().ok())
        {
            return (*i).clone();
        }
        let informer = Informer::new(Api::<K>::all(self.client.clone()));
        informers.insert(id, Arc::new(informer.clone()));
        // Under the registry's lock, which `start` takes too: an informer is either started
        // here or left for `start`, never missed by both.
        if self.started.load(Ordering::Acquire) {
            informer.start();
        } else {
            let i = informer.clone();
            self.starters.lock().push(Box::new(move || i.start()));
        }
        informer
    }

    /// Starts every informer made so far (upstream's `Start`); later ones start when made.
    pub fn start(&self) {
        let starters = {
            let _registry = self.informers.lock();
            self.started.store(true, Ordering::Release);
            std::mem::take(&mut *self.starters.lock())
        };
        for s in starters {
            s();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn pod(ns: &str, name: &str, rv: &str, controller: Option<&str>, labels: &[(&str, &str)]) -> Pod {
        Pod {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                resource_version: Some(rv.into()),
                labels: Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
                owner_references: controller.map(|uid| {
                    vec![OwnerReference {
                        api_version: "apps/v1".into(),
                        kind: "ReplicaSet".into(),
                        name: "rs".into(),
                        uid: uid.into(),
                        controller: Some(true),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn informer() -> Informer<Pod> {
        // The client is never called: these tests feed the informer by hand.
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        Informer::new(Api::all(kube::Client::try_from(config).unwrap()))
    }

    #[tokio::test]
    async fn one_informer_per_kind_started_once() {
        use k8s_openapi::api::core::v1::{Node, Service};
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let f = SharedInformerFactory::new(kube::Client::try_from(config).unwrap());
        let a = f.informer::<Pod>();
        let b = f.clone().informer::<Pod>();
        assert!(Arc::ptr_eq(&a.inner, &b.inner), "two informers of one kind");
        let nodes = f.informer::<Node>();
        assert!(!nodes.inner.started.load(Ordering::Acquire));
        f.start();
        assert!(a.inner.started.load(Ordering::Acquire));
        assert!(nodes.inner.started.load(Ordering::Acquire));
        // Asked for after the start: started at once.
        let late = f.informer::<Service>();
        assert!(late.inner.started.load(Ordering::Acquire));
        assert!(!late.has_synced());
    }

    fn names(v: Vec<Arc<Pod>>) -> Vec<String> {
        let mut n: Vec<String> = v.iter().filter_map(|p| p.metadata.name.clone()).collect();
        n.sort();
        n
    }

    #[tokio::test]
    async fn indexes_follow_owner_changes_and_deletes() {
        let i = informer();
        i.apply(pod("a", "p1", "1", Some("u1"), &[("app", "web")]));
        i.apply(pod("a", "p2", "2", None, &[("app", "web")]));
        i.apply(pod("a", "p3", "3", None, &[("app", "db")]));
        i.apply(pod("b", "p4", "4", None, &[("app", "web")]));
        let web = LabelSelector::from_k8s(Some(&k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
            match_labels: Some([("app".to_string(), "web".to_string())].into()),
            ..Default::default()
        }))
        .unwrap();
        assert_eq!(names(i.list_controlled_by("u1")), ["p1"]);
        assert_eq!(names(i.list_claimable("a", "u1", &web)), ["p1", "p2"]);
        assert_eq!(names(i.list_namespace("a")), ["p1", "p2", "p3"]);
        assert_eq!(names(i.list_selected("a", &web)), ["p1", "p2"]);
        // Adopted: out of the orphans, into its controller's index.
        i.apply(pod("a", "p2", "5", Some("u1"), &[("app", "web")]));
        assert_eq!(names(i.list_controlled_by("u1")), ["p1", "p2"]);
        assert_eq!(names(i.list_claimable("a", "u2", &web)), Vec::<String>::new());
        i.delete(pod("a", "p1", "6", Some("u1"), &[]));
        assert_eq!(names(i.list_controlled_by("u1")), ["p2"]);
        assert!(i.get("a", "p1").is_none());
        assert_eq!(i.len(), 3);
    }

    #[tokio::test]
    async fn handlers_see_adds_updates_deletes_and_relists() {
        let i = informer();
        let seen = Arc::new(Mutex::new(Vec::<String>::new()));
        i.apply(pod("a", "p1", "1", None, &[]));
        let s = seen.clone();
        i.add_handler(move |c| {
            let line = match c {
                Change::Added(p) => format!("add {}", p.metadata.name.as_deref().unwrap_or("")),
                Change::Updated { old, new } => format!(
                    "update {} {}->{}",
                    new.metadata.name.as_deref().unwrap_or(""),
                    old.metadata.resource_version.as_deref().unwrap_or(""),
                    new.metadata.resource_version.as_deref().unwrap_or("")
                ),
                Change::Deleted(p) => format!("delete {}", p.metadata.name.as_deref().unwrap_or("")),
            };
            s.lock().push(line);
        });
        i.apply(pod("a", "p2", "2", None, &[]));
        i.apply(pod("a", "p2", "3", None, &[]));
        // The same version again changes nothing.
        i.apply(pod("a", "p2", "3", None, &[]));
        assert!(!i.has_synced());
        // A relist that returns only p2: p1 is gone.
        let listed: HashSet<String> = ["a/p2".to_string()].into();
        i.replace_done(&listed);
        assert!(i.has_synced());
        i.delete(pod("a", "p2", "4", None, &[]));
        assert_eq!(
            *seen.lock(),
            ["add p1", "add p2", "update p2 2->3", "delete p1", "delete p2"]
        );
        i.wait_synced().await;
    }
}
