//! The garbage collector (upstream's `pkg/controller/garbagecollector`): keeps a graph of
//! ownerReferences from metadata watches of every resource and
//! - deletes dependents whose owners are all gone (background cascading deletion),
//! - removes dangling ownerReferences when some owner remains,
//! - for an owner being deleted with the `orphan` finalizer, removes its ownerReference from
//!   every dependent, then the finalizer,
//! - for an owner being deleted with `foregroundDeletion`, deletes its dependents and removes
//!   the finalizer once none is left.
//!
//! Before deleting anything it confirms the owner's absence with a live read (by name, then uid),
//! so a lagging watch never causes a wrong deletion. As upstream's:
//! - an owner whose kind this server cannot resolve (a group, version or kind it does not serve,
//!   such as a custom kind not installed yet) is never taken as gone: the dependent is retried
//!   with a per-object exponential backoff (5 ms doubling to 1,000 s, the controllers' default rate
//!   limiter) and left alone meanwhile;
//! - a cluster-scoped dependent naming an owner of a namespaced kind is invalid: it gets the
//!   Warning event `OwnerRefInvalidNamespace` and is never collected for that owner; so does a
//!   namespaced dependent whose owner's uid is found in another namespace (which, for the
//!   dependent, is absent);
//! - the graph holds only live objects: an object's entry, its place in its owners' dependent
//!   sets and its retry state go with its deletion, so memory follows what exists, not what
//!   ever existed.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{DeleteParams, DynamicObject, PartialObjectMeta, Patch, PatchParams, PropagationPolicy};
use kube::runtime::watcher;
use serde_json::{Value, json};
use skiff_api::Resource;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::controller_utils::Recorder;
use crate::resources;

const ORPHAN: &str = "orphan";
const FOREGROUND: &str = "foregroundDeletion";
const COMPONENT: &str = "garbage-collector-controller";

/// The first retry delay of an object whose collection failed, doubled at each failure.
const BACKOFF_BASE: Duration = Duration::from_millis(5);
/// The longest retry delay.
const BACKOFF_MAX: Duration = Duration::from_secs(1000);

#[derive(Clone, Debug)]
struct OwnerRef {
    api_version: String,
    kind: String,
    name: String,
    uid: String,
}

#[derive(Clone, Debug)]
struct GraphNode {
    res: &'static Resource,
    namespace: String,
    name: String,
    owners: Vec<OwnerRef>,
    deleting: bool,
    finalizers: Vec<String>,
}

enum Change {
    Upsert(String, GraphNode),
    Remove(String),
}

/// Why an object could not be processed; all of them are retried with backoff.
#[derive(Debug, thiserror::Error)]
enum GcError {
    /// upstream's restMappingError: the owner's kind is not served (yet).
    #[error("unable to resolve owner kind {kind} in {api_version}")]
    Unresolvable { api_version: String, kind: String },
    #[error(transparent)]
    Api(#[from] kube::Error),
}

/// What a live read says of one ownerReference of a dependent.
enum OwnerState {
    Alive,
    Absent,
    /// A cluster-scoped dependent naming an owner of a namespaced kind: not resolvable by any
    /// retry (upstream's namespacedOwnerOfClusterScopedObjectErr).
    NamespacedOwnerOfClusterScoped,
}

fn to_node(res: &'static Resource, meta: &kube::api::ObjectMeta) -> Option<(String, GraphNode)> {
    let uid = meta.uid.clone()?;
    let owners = meta
        .owner_references
        .as_ref()
        .map(|refs| {
            refs.iter()
                .map(|o| OwnerRef {
                    api_version: o.api_version.clone(),
                    kind: o.kind.clone(),
                    name: o.name.clone(),
                    uid: o.uid.clone(),
                })
                .collect()
        })
        .unwrap_or_default();
    Some((
        uid,
        GraphNode {
            res,
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            owners,
            deleting: meta.deletion_timestamp.is_some(),
            finalizers: meta.finalizers.clone().unwrap_or_default(),
        },
    ))
}

/// Watch the metadata of one resource into the change channel.
async fn watch_resource(client: kube::Client, res: &'static Resource, tx: mpsc::UnboundedSender<Change>) {
    let ar = resources::api_resource(res);
    let api: kube::Api<PartialObjectMeta<DynamicObject>> = kube::Api::all_with(client, &ar);
    let mut stream = watcher::watcher(api, watcher::Config::default()).boxed();
    while let Some(ev) = stream.next().await {
        let ev = match ev {
            Ok(ev) => ev,
            Err(e) => {
                tracing::debug!(resource = res.plural, error = %e, "garbage collector watch error");
                // A custom resource whose definition went is no longer watched.
                if skiff_api::registry::is_custom(res)
                    && !skiff_api::registry::custom().iter().any(|r| std::ptr::eq(*r, res))
                {
                    return;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let change = match ev {
            watcher::Event::Apply(o) | watcher::Event::InitApply(o) => {
                to_node(res, &o.metadata).map(|(uid, n)| Change::Upsert(uid, n))
            }
            watcher::Event::Delete(o) => o.metadata.uid.clone().map(Change::Remove),
            watcher::Event::Init | watcher::Event::InitDone => None,
        };
        if let Some(c) = change
            && tx.send(c).is_err()
        {
            return;
        }
    }
}

/// The dependency graph of every live object, and what is waiting to be processed.
#[derive(Default)]
struct Graph {
    nodes: HashMap<String, GraphNode>,
    /// uid -> uids of its dependents (only non-empty sets are kept).
    dependents: HashMap<String, HashSet<String>>,
    /// To process at the next turn.
    dirty: HashSet<String>,
    /// Objects whose processing failed: how often in a row, and when to try again.
    retries: HashMap<String, (u32, Instant)>,
}

/// Does the ownerReference `o` of a dependent in `namespace` name `owner` as observed: its
/// kind, name and namespace (a namespaced owner lives in its dependents' namespace)?
fn references(o: &OwnerRef, owner: &GraphNode, namespace: &str) -> bool {
    o.kind == owner.res.kind
        && o.name == owner.name
        && o.api_version.split_once('/').map_or("", |(g, _)| g) == owner.res.group
        && (!owner.res.namespaced || owner.namespace == namespace)
}

/// The delay before the `failures`-th retry: 5 ms doubled each time, at most 1,000 s.
fn backoff_delay(failures: u32) -> Duration {
    let factor = 1u64.checked_shl(failures.saturating_sub(1)).unwrap_or(u64::MAX);
    let ms = (BACKOFF_BASE.as_millis() as u64).saturating_mul(factor);
    Duration::from_millis(ms).min(BACKOFF_MAX)
}

impl Graph {
    fn unlink(&mut self, dependent: &str, owner: &str) {
        if let Some(set) = self.dependents.get_mut(owner) {
            set.remove(dependent);
            if set.is_empty() {
                self.dependents.remove(owner);
            }
        }
    }

    fn apply(&mut self, change: Change) {
        match change {
            Change::Upsert(uid, node) => {
                let old = self.nodes.remove(&uid);
                let first_seen = old.is_none();
                for o in old.iter().flat_map(|old| &old.owners) {
                    self.unlink(&uid, &o.uid);
                }
                for o in &node.owners {
                    self.dependents.entry(o.uid.clone()).or_default().insert(uid.clone());
                    // An owner we have never seen may be gone, and one seen elsewhere than the
                    // reference says may not be this dependent's: check the dependent.
                    match self.nodes.get(&o.uid) {
                        Some(owner) if references(o, owner, &node.namespace) => {}
                        _ => {
                            self.dirty.insert(uid.clone());
                        }
                    }
                }
                // Dependents seen before this owner that it cannot be the owner of (upstream's
                // bad child, then good parent; checked when the owner is first seen).
                if first_seen && let Some(deps) = self.dependents.get(&uid) {
                    for d in deps {
                        let invalid = self.nodes.get(d).is_some_and(|dep| {
                            dep.owners
                                .iter()
                                .any(|o| o.uid == uid && !references(o, &node, &dep.namespace))
                        });
                        if invalid {
                            self.dirty.insert(d.clone());
                        }
                    }
                }
                if node.deleting && (node.finalizers.iter().any(|f| f == ORPHAN || f == FOREGROUND)) {
                    self.dirty.insert(uid.clone());
                }
                self.nodes.insert(uid, node);
            }
            Change::Remove(uid) => {
                if let Some(old) = self.nodes.remove(&uid) {
                    for o in &old.owners {
                        self.unlink(&uid, &o.uid);
                        // An owner waiting in foreground deletion may now be free.
                        if self.nodes.contains_key(&o.uid) {
                            self.dirty.insert(o.uid.clone());
                        }
                    }
                }
                self.retries.remove(&uid);
                self.dirty.remove(&uid);
                if let Some(deps) = self.dependents.get(&uid) {
                    self.dirty.extend(deps.iter().cloned());
                }
            }
        }
    }

    /// Moves the objects whose retry is due into `dirty`; the earliest retry still ahead.
    fn due(&mut self, now: Instant) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        for (uid, (_, at)) in &self.retries {
            if *at <= now {
                self.dirty.insert(uid.clone());
            } else {
                next = Some(next.map_or(*at, |n| n.min(*at)));
            }
        }
        next
    }

    /// Records a failed attempt: the object is tried again after its backoff.
    fn failed(&mut self, uid: &str, now: Instant) {
        let entry = self.retries.entry(uid.to_string()).or_insert((0, now));
        entry.0 = entry.0.saturating_add(1);
        entry.1 = now + backoff_delay(entry.0);
    }

    /// Records a finished attempt (done, or nothing a retry could change).
    fn forget(&mut self, uid: &str) {
        self.retries.remove(uid);
    }

    /// Everything the graph holds, for tests of its size.
    #[cfg(test)]
    fn sizes(&self) -> (usize, usize, usize, usize) {
        (
            self.nodes.len(),
            self.dependents.len(),
            self.dirty.len(),
            self.retries.len(),
        )
    }
}

pub async fn run(client: kube::Client) -> anyhow::Result<()> {
    let (tx, mut rx) = mpsc::unbounded_channel();
    for res in resources::stored_resources() {
        tokio::spawn(watch_resource(client.clone(), res, tx.clone()));
    }
    // Custom resources join the graph as their definitions are served.
    {
        let client = client.clone();
        tokio::spawn(async move {
            let mut watched: Vec<&'static Resource> = Vec::new();
            loop {
                let custom = skiff_api::registry::custom();
                watched.retain(|w| custom.iter().any(|c| std::ptr::eq(*c, *w)));
                for r in custom {
                    if !watched.iter().any(|w| std::ptr::eq(*w, r)) {
                        watched.push(r);
                        tokio::spawn(watch_resource(client.clone(), r, tx.clone()));
                    }
                }
                if tx.is_closed() {
                    return;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
    }
    let recorder = Recorder::for_component(client.clone(), COMPONENT);
    let mut graph = Graph::default();
    let far = Duration::from_secs(3600);
    loop {
        let next = graph.due(Instant::now()).unwrap_or_else(|| Instant::now() + far);
        if graph.dirty.is_empty() {
            tokio::select! {
                change = rx.recv() => {
                    let Some(change) = change else { return Ok(()) };
                    graph.apply(change);
                }
                _ = tokio::time::sleep_until(next) => {}
            }
        }
        // Take everything already queued before acting.
        while let Ok(c) = rx.try_recv() {
            graph.apply(c);
        }
        graph.due(Instant::now());
        let work: Vec<String> = graph.dirty.drain().collect();
        for uid in work {
            match process(&client, &recorder, &uid, &graph).await {
                Ok(()) => graph.forget(&uid),
                Err(e) => {
                    match &e {
                        GcError::Unresolvable { .. } => {
                            tracing::debug!(uid, error = %e, "garbage collection will be retried")
                        }
                        GcError::Api(_) => tracing::info!(uid, error = %e, "garbage collection will be retried"),
                    }
                    graph.failed(&uid, Instant::now());
                }
            }
        }
    }
}

/// upstream's `objectReference.String()`, as its events print an owner.
fn describe_owner(owner: &OwnerRef, namespace: &str) -> String {
    format!(
        "[{}/{}, namespace: {}, name: {}, uid: {}]",
        owner.api_version, owner.kind, namespace, owner.name, owner.uid
    )
}

/// The Warning upstream's graph builder records on a dependent whose ownerReference cannot be
/// valid in its namespace.
async fn report_invalid_namespace_owner_ref(recorder: &Recorder, uid: &str, dep: &GraphNode, owner: &OwnerRef) {
    tracing::info!(
        resource = dep.res.plural,
        namespace = dep.namespace,
        name = dep.name,
        owner = owner.name,
        "item references an owner but does not match namespaces"
    );
    let involved = ObjectReference {
        api_version: Some(dep.res.api_version()),
        kind: Some(dep.res.kind.to_string()),
        name: Some(dep.name.clone()),
        namespace: (!dep.namespace.is_empty()).then(|| dep.namespace.clone()),
        uid: Some(uid.to_string()),
        ..Default::default()
    };
    let message = format!(
        "ownerRef {} does not exist in namespace {:?}",
        describe_owner(owner, &dep.namespace),
        dep.namespace
    );
    recorder.record(involved, "Warning", "OwnerRefInvalidNamespace", None, &message);
}

/// The served resource an ownerReference names (group, version and kind, as upstream's REST
/// mapper resolves it).
fn owner_resource(owner: &OwnerRef) -> Result<&'static Resource, GcError> {
    let (group, version) = match owner.api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", owner.api_version.as_str()),
    };
    skiff_api::registry::all()
        .into_iter()
        .find(|r| r.group == group && r.version == version && r.kind == owner.kind)
        .ok_or_else(|| GcError::Unresolvable {
            api_version: owner.api_version.clone(),
            kind: owner.kind.clone(),
        })
}

/// Does the owner still exist (same uid)? Asked live, not from the graph.
async fn owner_state(client: &kube::Client, dep: &GraphNode, owner: &OwnerRef) -> Result<OwnerState, GcError> {
    let res = owner_resource(owner)?;
    if res.namespaced && dep.namespace.is_empty() {
        return Ok(OwnerState::NamespacedOwnerOfClusterScoped);
    }
    let api = resources::api(client, res, Some(&dep.namespace));
    Ok(match api.get_metadata_opt(&owner.name).await? {
        Some(m) if m.metadata.uid.as_deref() == Some(owner.uid.as_str()) => OwnerState::Alive,
        _ => OwnerState::Absent,
    })
}

async fn process(client: &kube::Client, recorder: &Recorder, uid: &str, graph: &Graph) -> Result<(), GcError> {
    let Some(node) = graph.nodes.get(uid) else {
        // Gone: its dependents were queued by the removal.
        return Ok(());
    };
    let deps: Vec<(&String, &GraphNode)> = graph
        .dependents
        .get(uid)
        .map(|s| s.iter().filter_map(|d| graph.nodes.get(d).map(|n| (d, n))).collect())
        .unwrap_or_default();
    if node.deleting && node.finalizers.iter().any(|f| f == ORPHAN) {
        for (_, dep) in &deps {
            let remaining: Vec<&OwnerRef> = dep.owners.iter().filter(|o| o.uid != uid).collect();
            set_owner_refs(client, dep, &remaining).await?;
        }
        remove_finalizer(client, node, ORPHAN).await?;
        return Ok(());
    }
    if node.deleting && node.finalizers.iter().any(|f| f == FOREGROUND) {
        let mut waiting = false;
        for (_, dep) in &deps {
            waiting = true;
            if !dep.deleting {
                let api = resources::api(client, dep.res, Some(&dep.namespace));
                let dp = DeleteParams {
                    propagation_policy: Some(PropagationPolicy::Foreground),
                    ..Default::default()
                };
                match api.delete(&dep.name, &dp).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        if !waiting {
            remove_finalizer(client, node, FOREGROUND).await?;
        }
        return Ok(());
    }
    // A dependent: are its owners gone?
    if node.owners.is_empty() {
        return Ok(());
    }
    let mut alive = Vec::new();
    let mut dangling = false;
    for o in &node.owners {
        match owner_state(client, node, o).await? {
            OwnerState::Alive => alive.push(o),
            OwnerState::NamespacedOwnerOfClusterScoped => {
                report_invalid_namespace_owner_ref(recorder, uid, node, o).await;
                // No retry resolves it: the object is left alone.
                return Ok(());
            }
            OwnerState::Absent => {
                // The uid alive in another namespace: the reference was never valid here.
                if let Some(elsewhere) = graph.nodes.get(&o.uid)
                    && elsewhere.res.namespaced
                    && elsewhere.namespace != node.namespace
                {
                    report_invalid_namespace_owner_ref(recorder, uid, node, o).await;
                }
                dangling = true;
            }
        }
    }
    if !dangling {
        return Ok(());
    }
    if alive.is_empty() {
        if node.deleting {
            return Ok(());
        }
        tracing::info!(
            resource = node.res.plural,
            namespace = node.namespace,
            name = node.name,
            "deleting object whose owners are gone"
        );
        let api = resources::api(client, node.res, Some(&node.namespace));
        let dp = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            preconditions: Some(kube::api::Preconditions {
                uid: Some(uid.to_string()),
                resource_version: None,
            }),
            ..Default::default()
        };
        match api.delete(&node.name, &dp).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    } else {
        set_owner_refs(client, node, &alive).await?;
    }
    Ok(())
}

/// Replace a dependent's ownerReferences with `keep` (a strategic merge on the list would
/// need the uid key; a JSON merge patch replaces the whole list).
async fn set_owner_refs(client: &kube::Client, dep: &GraphNode, keep: &[&OwnerRef]) -> Result<(), kube::Error> {
    let api = resources::api(client, dep.res, Some(&dep.namespace));
    let current = match api.get_opt(&dep.name).await? {
        Some(o) => o,
        None => return Ok(()),
    };
    let keep_uids: HashSet<&str> = keep.iter().map(|o| o.uid.as_str()).collect();
    let refs: Vec<Value> = current
        .metadata
        .owner_references
        .unwrap_or_default()
        .into_iter()
        .filter(|o| keep_uids.contains(o.uid.as_str()))
        .map(|o| serde_json::to_value(o).unwrap_or(Value::Null))
        .collect();
    let patch = json!({"metadata": {"ownerReferences": if refs.is_empty() { Value::Null } else { Value::Array(refs) },
        "resourceVersion": current.metadata.resource_version}});
    api.patch(&dep.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

async fn remove_finalizer(client: &kube::Client, node: &GraphNode, finalizer: &str) -> Result<(), kube::Error> {
    let api = resources::api(client, node.res, Some(&node.namespace));
    let Some(current) = api.get_opt(&node.name).await? else {
        return Ok(());
    };
    let fins: Vec<String> = current
        .metadata
        .finalizers
        .unwrap_or_default()
        .into_iter()
        .filter(|f| f != finalizer)
        .collect();
    let patch = json!({"metadata": {"finalizers": fins, "resourceVersion": current.metadata.resource_version}});
    api.patch(&node.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(kind: &str) -> &'static Resource {
        let (group, kind) = kind.split_once('/').unwrap_or(("", kind));
        skiff_api::registry::lookup_kind(group, kind).expect("served kind")
    }

    fn node(kind: &str, name: &str, owners: &[(&str, &str)]) -> GraphNode {
        GraphNode {
            res: res(kind),
            namespace: "default".to_string(),
            name: name.to_string(),
            owners: owners
                .iter()
                .map(|(kind, uid)| OwnerRef {
                    api_version: res(kind).api_version(),
                    kind: res(kind).kind.to_string(),
                    name: format!("owner-{uid}"),
                    uid: uid.to_string(),
                })
                .collect(),
            deleting: false,
            finalizers: vec![],
        }
    }

    fn owner(api_version: &str, kind: &str) -> OwnerRef {
        OwnerRef {
            api_version: api_version.to_string(),
            kind: kind.to_string(),
            name: "o".to_string(),
            uid: "u".to_string(),
        }
    }

    #[test]
    fn owners_resolve_by_group_version_and_kind_only_when_served() {
        assert_eq!(
            owner_resource(&owner("apps/v1", "ReplicaSet")).map(|r| r.plural).ok(),
            Some("replicasets")
        );
        assert_eq!(
            owner_resource(&owner("v1", "ConfigMap")).map(|r| r.plural).ok(),
            Some("configmaps")
        );
        for (api_version, kind) in [
            ("example.com/v1", "Widget"),
            ("apps/v1beta1", "Deployment"),
            ("v1", "Deployment"),
            ("apps", "Deployment"),
        ] {
            match owner_resource(&owner(api_version, kind)) {
                Err(GcError::Unresolvable {
                    api_version: a,
                    kind: k,
                }) => {
                    assert_eq!((a.as_str(), k.as_str()), (api_version, kind));
                }
                other => panic!("{api_version} {kind}: {:?}", other.map(|r| r.plural)),
            }
        }
    }

    #[test]
    fn backoff_doubles_from_five_milliseconds_to_a_thousand_seconds() {
        assert_eq!(backoff_delay(1), Duration::from_millis(5));
        assert_eq!(backoff_delay(2), Duration::from_millis(10));
        assert_eq!(backoff_delay(5), Duration::from_millis(80));
        assert_eq!(backoff_delay(18), Duration::from_millis(655_360));
        assert_eq!(backoff_delay(19), BACKOFF_MAX);
        assert_eq!(backoff_delay(200), BACKOFF_MAX);
        assert_eq!(backoff_delay(u32::MAX), BACKOFF_MAX);
    }

    #[test]
    fn a_failed_object_waits_its_backoff_and_a_success_forgets_it() {
        let mut g = Graph::default();
        g.apply(Change::Upsert(
            "cm".into(),
            node("ConfigMap", "cm", &[("ConfigMap", "gone")]),
        ));
        assert!(g.dirty.contains("cm"));
        g.dirty.clear();
        let t0 = Instant::now();
        g.failed("cm", t0);
        g.failed("cm", t0);
        assert_eq!(g.retries.get("cm").map(|r| r.0), Some(2));
        // Not due yet: nothing to do, and the retry is 10 ms away.
        assert_eq!(g.due(t0), Some(t0 + Duration::from_millis(10)));
        assert!(g.dirty.is_empty());
        assert_eq!(g.due(t0 + Duration::from_millis(10)), None);
        assert!(g.dirty.contains("cm"));
        g.forget("cm");
        assert!(g.retries.is_empty());
        // Its removal takes its retry state too.
        g.failed("cm", t0);
        g.apply(Change::Remove("cm".into()));
        assert!(g.retries.is_empty() && !g.dirty.contains("cm"));
    }

    #[test]
    fn the_graph_shrinks_back_after_many_jobs_and_their_pods_come_and_go() {
        let mut g = Graph::default();
        g.apply(Change::Upsert("cron".into(), node("batch/CronJob", "cron", &[])));
        for round in 0..2 {
            for i in 0..50_000 {
                let job = format!("job-{round}-{i}");
                let pod = format!("pod-{round}-{i}");
                g.apply(Change::Upsert(
                    job.clone(),
                    node("batch/Job", &job, &[("batch/CronJob", "cron")]),
                ));
                g.apply(Change::Upsert(pod.clone(), node("Pod", &pod, &[("batch/Job", &job)])));
            }
            assert_eq!(g.dependents.get("cron").map(HashSet::len), Some(50_000));
            for i in 0..50_000 {
                // Half the jobs go before their pods (the pods are then collected), half after.
                let job = format!("job-{round}-{i}");
                let pod = format!("pod-{round}-{i}");
                if i % 2 == 0 {
                    g.apply(Change::Remove(job.clone()));
                    assert!(g.dirty.contains(&pod), "the pod of a removed job is checked");
                    g.apply(Change::Remove(pod));
                } else {
                    g.apply(Change::Remove(pod));
                    g.apply(Change::Remove(job));
                }
                g.failed("cron", Instant::now());
                g.forget("cron");
            }
            g.dirty.clear();
            assert_eq!(g.sizes(), (1, 0, 0, 0), "round {round}");
        }
    }

    #[test]
    fn a_dependent_naming_an_owner_of_another_namespace_is_checked_whichever_is_seen_first() {
        let mut owner = node("ConfigMap", "owner-o1", &[]);
        owner.namespace = "a".into();
        let mut dep = node("ConfigMap", "dep", &[("ConfigMap", "o1")]);
        dep.namespace = "b".into();
        // Owner first.
        let mut g = Graph::default();
        g.apply(Change::Upsert("o1".into(), owner.clone()));
        g.dirty.clear();
        g.apply(Change::Upsert("d".into(), dep.clone()));
        assert!(g.dirty.contains("d"));
        // Dependent first.
        let mut g = Graph::default();
        g.apply(Change::Upsert("d".into(), dep.clone()));
        g.dirty.clear();
        g.apply(Change::Upsert("o1".into(), owner.clone()));
        assert!(g.dirty.contains("d"));
        // In the same namespace nothing is to be checked.
        let mut g = Graph::default();
        dep.namespace = "a".into();
        g.apply(Change::Upsert("o1".into(), owner.clone()));
        g.dirty.clear();
        g.apply(Change::Upsert("d".into(), dep.clone()));
        g.apply(Change::Upsert("o1".into(), owner));
        assert!(g.dirty.is_empty(), "{:?}", g.dirty);
    }

    #[test]
    fn events_name_the_owner_as_upstream_prints_it() {
        let o = OwnerRef {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: "owner".into(),
            uid: "1234".into(),
        };
        assert_eq!(
            describe_owner(&o, ""),
            "[v1/ConfigMap, namespace: , name: owner, uid: 1234]"
        );
    }
}
