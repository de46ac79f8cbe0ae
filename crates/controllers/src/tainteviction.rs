//! The taint eviction controller (upstream's `pkg/controller/tainteviction`, run by
//! kube-controller-manager as `taint-eviction-controller`): a pod bound to a node with a
//! `NoExecute` taint it does not tolerate is deleted at once; a pod that tolerates every such
//! taint, some only for `tolerationSeconds`, is deleted when the shortest of those has passed
//! since the eviction was first scheduled; tolerations without `tolerationSeconds` tolerate
//! forever. Removing the taint (or the pod going away) in time cancels the eviction.
//!
//! As upstream: before the delete, the pod gets the condition `DisruptionTarget`
//! (`DeletionByTaintManager`, "Taint manager: deleting due to NoExecute taint"); the Normal event
//! `TaintManagerEviction` says "Marking for deletion Pod NS/NAME" when the deletion fires and
//! "Cancelling deletion of Pod NS/NAME" when a scheduled one is called off. A scheduled eviction
//! keeps the time it was first given even if the pod's tolerations change.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod, Taint, Toleration};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::reflector::{ObjectRef, Store};

use crate::informers::{Informer, SharedInformerFactory};
use parking_lot::Mutex;
use serde_json::json;
use skiff_api::nodeaffinity::tolerates;

use crate::controller_utils::{self as cu, Recorder, WorkQueue};

pub const CONTROLLER_NAME: &str = "taint-eviction-controller";
const NO_EXECUTE: &str = "NoExecute";

/// Evictions scheduled, by pod key (`NS/NAME`): when they fire.
type Scheduled = Arc<Mutex<HashMap<String, Instant>>>;

pub async fn run(client: kube::Client, informers: SharedInformerFactory) -> anyhow::Result<()> {
    let queue = WorkQueue::new();
    let scheduled: Scheduled = Default::default();
    // A node's NoExecute taints changed (or it came or went): every pod on it is looked at.
    let pods = informers.informer::<Pod>();
    let holder = pods.clone();
    // The NoExecute taints last seen of each node: heartbeats change nothing here.
    let known: Mutex<HashMap<String, Vec<Taint>>> = Default::default();
    let nodes = cu::spawn_store_watch(Api::<Node>::all(client.clone()), queue.clone(), move |node: &Node| {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        let taints = no_execute_taints(node);
        if known
            .lock()
            .insert(name.to_string(), taints.clone())
            .unwrap_or_default()
            == taints
        {
            return Vec::new();
        }
        holder
            .list()
            .iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(name))
            .flat_map(|p| cu::self_key(&**p))
            .collect()
    });
    // A pod matters when it is bound to a node with NoExecute taints, or has an eviction scheduled.
    let (n, s) = (nodes.clone(), scheduled.clone());
    cu::on_changes(&pods, queue.clone(), move |pod: &Pod| {
        let key = cu::self_key(pod);
        let on_tainted = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .and_then(|node| n.get(&ObjectRef::new(node)))
            .is_some_and(|node| !no_execute_taints(&node).is_empty());
        let pending = key.first().is_some_and(|k| s.lock().contains_key(k));
        if on_tainted || pending { key } else { Vec::new() }
    });
    let recorder = Recorder::for_component(client.clone(), CONTROLLER_NAME);
    queue
        .run(CONTROLLER_NAME, |key| {
            sync(&client, &recorder, &nodes, &pods, &scheduled, key)
        })
        .await
}

/// The node's taints of effect `NoExecute`.
fn no_execute_taints(node: &Node) -> Vec<Taint> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .filter(|t| t.effect == NO_EXECUTE)
        .cloned()
        .collect()
}

/// What the pod's tolerations say of the taints (upstream's `GetMatchingTolerations` and
/// `getMinTolerationTime`).
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// No NoExecute taint: nothing to do (a scheduled eviction is cancelled).
    Untainted,
    /// A taint is not tolerated: delete now.
    Now,
    /// Every taint is tolerated, the shortest for this long.
    After(Duration),
    /// Every taint is tolerated forever.
    Never,
}

pub fn verdict(taints: &[Taint], tolerations: &[Toleration]) -> Verdict {
    if taints.is_empty() {
        return Verdict::Untainted;
    }
    let mut used: Vec<&Toleration> = Vec::new();
    for taint in taints {
        match tolerations.iter().find(|t| tolerates(t, taint)) {
            Some(t) => used.push(t),
            None => return Verdict::Now,
        }
    }
    let mut min: Option<i64> = None;
    for t in used {
        if let Some(seconds) = t.toleration_seconds {
            if seconds <= 0 {
                return Verdict::After(Duration::ZERO);
            }
            min = Some(min.map_or(seconds, |m| m.min(seconds)));
        }
    }
    match min {
        Some(seconds) => Verdict::After(Duration::from_secs(seconds.unsigned_abs())),
        None => Verdict::Never,
    }
}

async fn cancel(recorder: &Recorder, scheduled: &Scheduled, key: &str, pod: Option<&Pod>) {
    let was = scheduled.lock().remove(key).is_some();
    if was && let Some(pod) = pod {
        recorder.event(
            pod,
            "Normal",
            "TaintManagerEviction",
            format!("Cancelling deletion of Pod {key}"),
        );
    }
}

async fn sync(
    client: &kube::Client,
    recorder: &Recorder,
    nodes: &Store<Node>,
    pods: &Informer<Pod>,
    scheduled: &Scheduled,
    key: String,
) -> anyhow::Result<Option<Duration>> {
    let (ns, name) = cu::split_key(&key);
    let Some(pod) = pods.get(ns, name) else {
        scheduled.lock().remove(&key);
        return Ok(None);
    };
    if pod.metadata.deletion_timestamp.is_some() {
        scheduled.lock().remove(&key);
        return Ok(None);
    }
    let spec = pod.spec.clone().unwrap_or_default();
    let taints = spec
        .node_name
        .as_deref()
        .and_then(|n| nodes.get(&ObjectRef::new(n)))
        .map(|n| no_execute_taints(&n))
        .unwrap_or_default();
    let now = Instant::now();
    let fire_at = match verdict(&taints, spec.tolerations.as_deref().unwrap_or_default()) {
        Verdict::Untainted | Verdict::Never => {
            cancel(recorder, scheduled, &key, Some(&pod)).await;
            return Ok(None);
        }
        Verdict::Now => now,
        Verdict::After(after) => *scheduled.lock().entry(key.clone()).or_insert(now + after),
    };
    if fire_at > now {
        return Ok(Some(fire_at - now));
    }
    scheduled.lock().remove(&key);
    recorder.event(
        &*pod,
        "Normal",
        "TaintManagerEviction",
        format!("Marking for deletion Pod {key}"),
    );
    evict(client, &pod).await?;
    Ok(None)
}

/// Sets the pod's `DisruptionTarget` condition, then deletes it (this uid only).
async fn evict(client: &kube::Client, pod: &Pod) -> anyhow::Result<()> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let has_condition = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "DisruptionTarget" && c.status == "True"));
    if !has_condition {
        let patch = json!({"status": {"conditions": [{
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "DeletionByTaintManager",
            "message": "Taint manager: deleting due to NoExecute taint",
            "lastTransitionTime": cu::now(),
        }]}});
        match api
            .patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch))
            .await
        {
            Ok(_) => {}
            Err(e) if cu::is_not_found(&e) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    }
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: pod.metadata.uid.clone(),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(name, &dp).await {
        Ok(_) => Ok(()),
        Err(e) if cu::is_not_found(&e) || cu::is_conflict(&e) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taint(key: &str) -> Taint {
        Taint {
            key: key.into(),
            value: Some("value".into()),
            effect: NO_EXECUTE.into(),
            time_added: None,
        }
    }

    fn toleration(key: &str, seconds: Option<i64>) -> Toleration {
        Toleration {
            key: Some(key.into()),
            operator: Some("Exists".into()),
            effect: Some(NO_EXECUTE.into()),
            value: None,
            toleration_seconds: seconds,
        }
    }

    #[test]
    fn verdicts_follow_upstreams_rules() {
        assert_eq!(verdict(&[], &[]), Verdict::Untainted);
        assert_eq!(verdict(&[taint("key")], &[]), Verdict::Now);
        assert_eq!(verdict(&[taint("key")], &[toleration("other", None)]), Verdict::Now);
        assert_eq!(verdict(&[taint("key")], &[toleration("key", None)]), Verdict::Never);
        assert_eq!(
            verdict(&[taint("key")], &[toleration("key", Some(5))]),
            Verdict::After(Duration::from_secs(5))
        );
        // The shortest of the tolerations used wins; zero or less is at once.
        assert_eq!(
            verdict(
                &[taint("a"), taint("b")],
                &[toleration("a", Some(30)), toleration("b", Some(5))]
            ),
            Verdict::After(Duration::from_secs(5))
        );
        assert_eq!(
            verdict(
                &[taint("a"), taint("b")],
                &[toleration("a", None), toleration("b", Some(7))]
            ),
            Verdict::After(Duration::from_secs(7))
        );
        assert_eq!(
            verdict(&[taint("key")], &[toleration("key", Some(-1))]),
            Verdict::After(Duration::ZERO)
        );
        // Only the first toleration that matches a taint is used (upstream's GetMatchingTolerations).
        assert_eq!(
            verdict(&[taint("key")], &[toleration("key", None), toleration("key", Some(3))]),
            Verdict::Never
        );
    }
}
