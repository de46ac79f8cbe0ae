//! The ReplicaSet controller (upstream's `pkg/controller/replicaset`): keeps `spec.replicas`
//! pods from the template, adopting matching orphans and releasing pods that stopped matching,
//! and reports replicas / fullyLabeledReplicas / readyReplicas / availableReplicas.
//!
//! The same controller manages ReplicationControllers (`replication.rs`): as upstream's, it
//! runs over any [`ReplicaSetLike`] kind, seen as a ReplicaSet through a conversion.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{ReplicaSet, ReplicaSetCondition, ReplicaSetStatus};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, PostParams};

use crate::controller_utils::{
    self as cu, BURST_REPLICAS, ControllerExpectations, Recorder, WorkQueue, is_pod_active, is_pod_available,
    is_pod_ready,
};
use crate::informers::{Change, Informer, InformerKind, SharedInformerFactory, object_key};

pub const COMPONENT: &str = "replicaset-controller";

/// A kind this controller manages: ReplicaSets, and ReplicationControllers through upstream's
/// conversion (`pkg/controller/replication/conversion.go`). The controller reads every object
/// as a ReplicaSet and writes its status back in the kind's own form.
pub trait ReplicaSetLike:
    InformerKind + kube::Resource<Scope = k8s_openapi::NamespaceResourceScope> + serde::Serialize
{
    /// The owner reference's `apiVersion` and `kind` of the pods made.
    const API_VERSION: &'static str;
    const KIND: &'static str;
    /// The work queue's name (its metrics and logs).
    const QUEUE: &'static str;
    /// The object as a ReplicaSet.
    fn as_replica_set(&self) -> Cow<'_, ReplicaSet>;
    /// The object with this status, converted back.
    fn with_status(&self, status: ReplicaSetStatus) -> Self;
}

impl ReplicaSetLike for ReplicaSet {
    const API_VERSION: &'static str = "apps/v1";
    const KIND: &'static str = "ReplicaSet";
    const QUEUE: &'static str = "replicaset";

    fn as_replica_set(&self) -> Cow<'_, ReplicaSet> {
        Cow::Borrowed(self)
    }

    fn with_status(&self, status: ReplicaSetStatus) -> Self {
        let mut out = self.clone();
        out.status = Some(status);
        out
    }
}

struct Ctx<K> {
    client: kube::Client,
    recorder: Recorder,
    replicasets: Informer<K>,
    pods: Informer<Pod>,
    expectations: ControllerExpectations,
}

/// The controller (of kind `K`) a pod's controller reference names, if any.
fn rs_key_of<K: ReplicaSetLike>(p: &Pod) -> Option<String> {
    cu::controller_key(&p.metadata, K::KIND)
}

/// Upstream's `getPodReplicaSets` for an orphan: every ReplicaSet of its namespace whose
/// selector matches it.
fn matching_sets<K: ReplicaSetLike>(replicasets: &Informer<K>, p: &Pod) -> Vec<String> {
    let ns = p.metadata.namespace.as_deref().unwrap_or_default();
    replicasets
        .list_namespace(ns)
        .iter()
        .filter(|rs| {
            let rs = rs.as_replica_set();
            let sel = cu::selector_of(rs.spec.as_ref().map(|s| &s.selector));
            !sel.is_empty() && cu::labels_match(&sel, &p.metadata)
        })
        .map(|rs| object_key(rs.meta()))
        .collect()
}

/// Registers the controller's handlers on the shared informers (upstream's `NewBaseController`
/// event handlers: `addPod`, `updatePod`, `deletePod` with their expectations bookkeeping).
fn register<K: ReplicaSetLike>(
    queue: &WorkQueue,
    replicasets: &Informer<K>,
    pods: &Informer<Pod>,
    exp: &ControllerExpectations,
) {
    {
        let queue = queue.clone();
        let exp = exp.clone();
        replicasets.add_handler(move |c| match c {
            Change::Added(rs) | Change::Updated { new: rs, .. } => queue.add(object_key(rs.meta())),
            Change::Deleted(rs) => {
                let key = object_key(rs.meta());
                exp.delete(&key);
                queue.add(key);
            }
        });
    }
    let queue = queue.clone();
    let exp = exp.clone();
    let sets = replicasets.clone();
    pods.add_handler(move |c| match c {
        Change::Added(p) => {
            if p.metadata.deletion_timestamp.is_some() {
                // Seen first as being deleted (after a relist): a deletion, not a creation.
                if let Some(k) = rs_key_of::<K>(p) {
                    exp.deletion_observed(&k, &object_key(&p.metadata));
                    queue.add(k);
                }
                return;
            }
            match rs_key_of::<K>(p) {
                Some(k) => {
                    exp.creation_observed(&k);
                    queue.add(k);
                }
                None if cu::controller_ref(&p.metadata).is_none() => {
                    for k in matching_sets(&sets, p) {
                        queue.add(k);
                    }
                }
                None => {}
            }
        }
        Change::Updated { old, new } => {
            let pod_key = object_key(&new.metadata);
            if new.metadata.deletion_timestamp.is_some() && old.metadata.deletion_timestamp.is_none() {
                // Upstream counts a graceful deletion as observed when it starts.
                if let Some(k) = rs_key_of::<K>(new) {
                    exp.deletion_observed(&k, &pod_key);
                }
            }
            let (old_rs, new_rs) = (rs_key_of::<K>(old), rs_key_of::<K>(new));
            if old_rs != new_rs
                && let Some(k) = old_rs
            {
                queue.add(k);
            }
            match new_rs {
                Some(k) => queue.add(k),
                None if cu::controller_ref(&new.metadata).is_none()
                    && (old.metadata.labels != new.metadata.labels || cu::controller_ref(&old.metadata).is_some()) =>
                {
                    // An orphan whose labels changed may now be adopted.
                    for k in matching_sets(&sets, new) {
                        queue.add(k);
                    }
                }
                None => {}
            }
        }
        Change::Deleted(p) => {
            if let Some(k) = rs_key_of::<K>(p) {
                exp.deletion_observed(&k, &object_key(&p.metadata));
                queue.add(k);
            }
        }
    });
}

pub async fn run(client: kube::Client, informers: SharedInformerFactory) -> anyhow::Result<()> {
    run_for::<ReplicaSet>(client, informers, COMPONENT).await
}

/// Runs the controller for the objects of kind `K`, its events recorded as `component`.
pub async fn run_for<K: ReplicaSetLike>(
    client: kube::Client,
    informers: SharedInformerFactory,
    component: &str,
) -> anyhow::Result<()> {
    let queue = WorkQueue::new();
    let replicasets = informers.informer::<K>();
    let pods = informers.informer::<Pod>();
    let expectations = ControllerExpectations::new();
    register(&queue, &replicasets, &pods, &expectations);
    replicasets.wait_synced().await;
    pods.wait_synced().await;
    let ctx = Ctx {
        recorder: Recorder::for_component(client.clone(), component),
        client,
        replicasets,
        pods,
        expectations,
    };
    queue.run(K::QUEUE, |key| sync(&ctx, key)).await
}

/// Upstream's `syncReplicaSet`, on the informers' caches: the pods come from the pod
/// informer's owner index (and the orphans of the namespace the selector matches), and pods
/// are created or deleted only when the expectations of the last sync's writes are met.
async fn sync<K: ReplicaSetLike>(ctx: &Ctx<K>, key: String) -> anyhow::Result<Option<Duration>> {
    let (ns, name) = cu::split_key(&key);
    let Some(obj) = ctx.replicasets.get_key(&key) else {
        ctx.expectations.delete(&key);
        return Ok(None);
    };
    let rs = obj.as_replica_set();
    let Some(spec) = rs.spec.as_ref() else {
        return Ok(None);
    };
    let rs_needs_sync = ctx.expectations.satisfied(&key);
    let selector = cu::selector_of(Some(&spec.selector));
    if selector.is_empty() {
        // It would select every pod of the namespace; validation refuses such selectors.
        return Ok(None);
    }
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let uid = rs.metadata.uid.as_deref().unwrap_or_default();
    let candidates: Vec<Arc<Pod>> = ctx
        .pods
        .list_claimable(ns, uid, &selector)
        .into_iter()
        .filter(|p| is_pod_active(p))
        .collect();
    let pods = cu::claim(&pods_api, &rs.metadata, K::API_VERSION, K::KIND, &selector, candidates)
        .await?
        .owned;

    let mut manage_err = None;
    if rs_needs_sync && rs.metadata.deletion_timestamp.is_none() {
        manage_err = manage_replicas(ctx, &key, obj.as_ref(), &rs, &pods).await.err();
    }

    let now = jiff::Timestamp::now();
    let min_ready = spec.min_ready_seconds.unwrap_or(0);
    let pod_refs: Vec<&Pod> = pods.iter().map(|p| p.as_ref()).collect();
    let mut status = calculate_status(&rs, &pod_refs, manage_err.as_ref(), now);
    if status_differs(rs.status.as_ref(), &status) {
        let rs_api: Api<K> = Api::namespaced(ctx.client.clone(), ns);
        // Keep the conditions' transition times when nothing changed.
        if let (Some(old), Some(new)) = (
            rs.status.as_ref().and_then(|s| s.conditions.as_ref()),
            status.conditions.as_mut(),
        ) {
            for c in new.iter_mut() {
                if let Some(o) = old.iter().find(|o| o.type_ == c.type_ && o.status == c.status) {
                    c.last_transition_time = o.last_transition_time.clone();
                }
            }
        }
        let updated = obj.with_status(status);
        match rs_api.replace_status(name, &PostParams::default(), &updated).await {
            Ok(_) => {}
            // The cache was behind: its next event queues the set again.
            Err(e) if cu::is_conflict(&e) || cu::is_not_found(&e) => {}
            Err(e) => return Err(e.into()),
        }
    }
    if let Some(e) = manage_err {
        return Err(e);
    }
    // Sync again when a ready pod turns available.
    let again = pods.iter().filter_map(|p| cu::available_after(p, min_ready, now)).min();
    Ok(again)
}

fn status_differs(old: Option<&ReplicaSetStatus>, new: &ReplicaSetStatus) -> bool {
    let Some(old) = old else { return true };
    let strip = |s: &ReplicaSetStatus| {
        let mut s = s.clone();
        for c in s.conditions.iter_mut().flatten() {
            c.last_transition_time = None;
        }
        serde_json::to_value(s).unwrap_or_default()
    };
    strip(old) != strip(new)
}

fn nz(v: usize) -> Option<i32> {
    (v > 0).then_some(v as i32)
}

/// Upstream's `calculateStatus`.
fn calculate_status(
    rs: &ReplicaSet,
    pods: &[&Pod],
    manage_err: Option<&anyhow::Error>,
    now: jiff::Timestamp,
) -> ReplicaSetStatus {
    let spec = rs.spec.clone().unwrap_or_default();
    let template_labels = spec
        .template
        .as_ref()
        .and_then(|t| t.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    let min_ready = spec.min_ready_seconds.unwrap_or(0);
    let fully_labeled = pods
        .iter()
        .filter(|p| {
            let labels = p.metadata.labels.clone().unwrap_or_default();
            template_labels.iter().all(|(k, v)| labels.get(k) == Some(v))
        })
        .count();
    let ready = pods.iter().filter(|p| is_pod_ready(p)).count();
    let available = pods.iter().filter(|p| is_pod_available(p, min_ready, now)).count();
    let mut conditions: Vec<ReplicaSetCondition> = rs
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c.type_ != "ReplicaFailure")
        .collect();
    if let Some(e) = manage_err {
        let want = spec.replicas.unwrap_or(1);
        let reason = if (pods.len() as i32) < want {
            "FailedCreate"
        } else {
            "FailedDelete"
        };
        conditions.push(ReplicaSetCondition {
            type_: "ReplicaFailure".into(),
            status: "True".into(),
            reason: Some(reason.into()),
            message: Some(format!("{e:#}")),
            last_transition_time: Some(cu::now()),
        });
    }
    ReplicaSetStatus {
        replicas: pods.len() as i32,
        fully_labeled_replicas: nz(fully_labeled),
        ready_replicas: nz(ready),
        available_replicas: nz(available),
        observed_generation: rs.metadata.generation,
        conditions: (!conditions.is_empty()).then_some(conditions),
        terminating_replicas: None,
    }
}

/// Upstream's `manageReplicas`: create or delete pods to reach `spec.replicas`, each write
/// expected first so the next sync waits for the informer to show it.
async fn manage_replicas<K: ReplicaSetLike>(
    ctx: &Ctx<K>,
    key: &str,
    obj: &K,
    rs: &ReplicaSet,
    pods: &[Arc<Pod>],
) -> anyhow::Result<()> {
    let spec = rs.spec.clone().unwrap_or_default();
    let want = spec.replicas.unwrap_or(1).max(0) as usize;
    let ns = rs.metadata.namespace.clone().unwrap_or_default();
    let name = rs.metadata.name.clone().unwrap_or_default();
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    if pods.len() < want {
        let diff = (want - pods.len()).min(BURST_REPLICAS);
        let Some(template) = spec.template.as_ref() else {
            return Ok(());
        };
        ctx.expectations.expect_creations(key, diff);
        let owner = cu::new_controller_ref(&rs.metadata, K::API_VERSION, K::KIND);
        let pod = cu::pod_from_template(template, &cu::pod_name_prefix(&name), Some(owner), &ns);
        // Slow start: batches of 1, 2, 4, ... stop at the first failure.
        let mut created = 0usize;
        let mut batch = 1usize;
        while created < diff {
            let n = batch.min(diff - created);
            let pp = PostParams::default();
            // Events are queued to the recorder, never awaited: they do not hold the batch back.
            let results = futures::future::join_all((0..n).map(|_| pods_api.create(&pp, &pod))).await;
            let mut failed = None;
            for r in results {
                match r {
                    Ok(p) => {
                        let msg = format!("Created pod: {}", p.metadata.name.unwrap_or_default());
                        ctx.recorder.event(obj, "Normal", "SuccessfulCreate", &msg);
                    }
                    Err(e) => {
                        // Never to be observed: expected no more.
                        ctx.expectations.creation_observed(key);
                        if cu::is_namespace_terminating(&e) {
                            continue;
                        }
                        let msg = format!("Error creating: {}", api_message(&e));
                        ctx.recorder.event(obj, "Warning", "FailedCreate", &msg);
                        failed = Some(e);
                    }
                }
            }
            created += n;
            if let Some(e) = failed {
                // The batches not sent will not be observed either.
                for _ in created..diff {
                    ctx.expectations.creation_observed(key);
                }
                return Err(anyhow::Error::new(e).context("creating pods"));
            }
            batch *= 2;
        }
    } else if pods.len() > want {
        let diff = (pods.len() - want).min(BURST_REPLICAS);
        let refs: Vec<&Pod> = pods.iter().map(|p| p.as_ref()).collect();
        let doomed = cu::pods_to_delete(&refs, &refs, diff);
        ctx.expectations
            .expect_deletions(key, doomed.iter().map(|p| object_key(&p.metadata)));
        let mut failed = None;
        for p in doomed {
            let pname = p.metadata.name.clone().unwrap_or_default();
            match pods_api.delete(&pname, &DeleteParams::default()).await {
                Ok(_) => {
                    let msg = format!("Deleted pod: {pname}");
                    ctx.recorder.event(obj, "Normal", "SuccessfulDelete", &msg);
                }
                Err(e) if cu::is_not_found(&e) => {
                    ctx.expectations.deletion_observed(key, &object_key(&p.metadata));
                }
                Err(e) => {
                    ctx.expectations.deletion_observed(key, &object_key(&p.metadata));
                    if failed.is_none() {
                        let msg = format!("Error deleting: {}", api_message(&e));
                        ctx.recorder.event(obj, "Warning", "FailedDelete", &msg);
                        failed = Some(e);
                    }
                }
            }
        }
        if let Some(e) = failed {
            return Err(anyhow::Error::new(e).context("deleting pods"));
        }
    }
    Ok(())
}

/// The message of an API error, as upstream's events show it.
pub(crate) fn api_message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => s.message.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::ReplicaSetSpec;
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus, PodTemplateSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod(labels: &[(&str, &str)], ready: bool) -> Pod {
        Pod {
            metadata: ObjectMeta {
                labels: Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
                ..Default::default()
            },
            spec: None,
            status: Some(PodStatus {
                phase: Some("Running".into()),
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
    fn status_counts_labels_readiness_and_generation() {
        let rs = ReplicaSet {
            metadata: ObjectMeta {
                generation: Some(4),
                ..Default::default()
            },
            spec: Some(ReplicaSetSpec {
                replicas: Some(3),
                template: Some(PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some(
                            [
                                ("app".to_string(), "web".to_string()),
                                ("tier".to_string(), "fe".to_string()),
                            ]
                            .into(),
                        ),
                        ..Default::default()
                    }),
                    spec: None,
                }),
                ..Default::default()
            }),
            status: None,
        };
        let pods = [
            pod(&[("app", "web"), ("tier", "fe")], true),
            pod(&[("app", "web")], true),
            pod(&[("app", "web"), ("tier", "fe")], false),
        ];
        let refs: Vec<&Pod> = pods.iter().collect();
        let s = calculate_status(&rs, &refs, None, jiff::Timestamp::now());
        assert_eq!(s.replicas, 3);
        assert_eq!(s.fully_labeled_replicas, Some(2));
        assert_eq!(s.ready_replicas, Some(2));
        assert_eq!(s.available_replicas, Some(2));
        assert_eq!(s.observed_generation, Some(4));
        assert!(s.conditions.is_none());
    }
}
