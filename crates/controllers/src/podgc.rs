//! Pod garbage collection (upstream's `pkg/controller/podgc`, kube-controller-manager's
//! `pod-garbage-collector`). Every 20 s:
//! - terminated pods (phase Succeeded or Failed) beyond `--terminated-pod-gc-threshold` (12,500;
//!   0 turns this off) are deleted, evicted ones first, then the oldest;
//! - terminating pods on a node that is not Ready and carries the `node.kubernetes.io/out-of-service`
//!   taint are force-deleted (their node will not confirm);
//! - pods bound to a node that no longer exists (still missing 40 s after first noticed, and asked
//!   of the API server itself) are marked Failed with the `DisruptionTarget` condition
//!   (`DeletionByPodGC`, "PodGC: node no longer exists") and force-deleted;
//! - terminating pods that were never bound are force-deleted.
//!
//! "Force-deleted" is a delete with a grace period of 0, as `kubectl delete --force` sends.

use std::cmp::Ordering;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::reflector::{ObjectRef, Store};

use crate::informers::{Informer, SharedInformerFactory};
use serde_json::json;

use crate::controller_utils::{self as cu, WorkQueue};

pub const CONTROLLER_NAME: &str = "pod-garbage-collector";
const OUT_OF_SERVICE_TAINT: &str = "node.kubernetes.io/out-of-service";

#[derive(Clone, Debug, PartialEq)]
pub struct PodGcConfig {
    /// `--terminated-pod-gc-threshold` (0: terminated pods are kept).
    pub terminated_pod_threshold: usize,
    /// How often the collector looks (upstream's `gcCheckPeriod`, 20 s).
    pub check_period: Duration,
    /// How long a node must stay missing before its pods go (upstream's `quarantineTime`, 40 s).
    pub quarantine: Duration,
}

impl Default for PodGcConfig {
    fn default() -> Self {
        Self {
            terminated_pod_threshold: 12_500,
            check_period: Duration::from_secs(20),
            quarantine: Duration::from_secs(40),
        }
    }
}

fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

fn terminated(pod: &Pod) -> bool {
    !matches!(phase(pod), "Pending" | "Running" | "Unknown")
}

fn evicted(pod: &Pod) -> bool {
    phase(pod) == "Failed" && pod.status.as_ref().and_then(|s| s.reason.as_deref()) == Some("Evicted")
}

/// Upstream's `byEvictionAndCreationTimestamp`: evicted first, then oldest, then by name.
pub fn gc_order(a: &Pod, b: &Pod) -> Ordering {
    evicted(b)
        .cmp(&evicted(a))
        .then_with(|| a.metadata.creation_timestamp.cmp(&b.metadata.creation_timestamp))
        .then_with(|| a.metadata.name.cmp(&b.metadata.name))
}

/// The terminated pods to delete so that at most `threshold` remain.
pub fn terminated_to_delete(pods: &[Arc<Pod>], threshold: usize) -> Vec<Arc<Pod>> {
    if threshold == 0 {
        return Vec::new();
    }
    let mut done: Vec<Arc<Pod>> = pods.iter().filter(|p| terminated(p)).cloned().collect();
    if done.len() <= threshold {
        return Vec::new();
    }
    done.sort_by(|a, b| gc_order(a, b));
    done.truncate(done.len() - threshold);
    done
}

fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn out_of_service(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == OUT_OF_SERVICE_TAINT))
}

struct Collector {
    client: kube::Client,
    config: PodGcConfig,
    /// Nodes pods are bound to that the node cache lacks, and since when.
    missing: HashMap<String, Instant>,
}

impl Collector {
    /// Upstream's `markFailedAndDeletePodWithCondition`: a pod not yet terminal is marked Failed
    /// (with `condition`), then it is deleted at once.
    async fn fail_and_delete(&self, pod: &Pod, condition: Option<(&str, &str)>) -> anyhow::Result<()> {
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        if !matches!(phase(pod), "Succeeded" | "Failed") {
            let mut status = json!({"phase": "Failed"});
            if let Some((reason, message)) = condition {
                status["conditions"] = json!([{
                    "type": "DisruptionTarget", "status": "True", "reason": reason, "message": message,
                    "lastTransitionTime": cu::now(),
                }]);
            }
            match api
                .patch_status(
                    name,
                    &PatchParams::default(),
                    &Patch::Strategic(json!({"status": status})),
                )
                .await
            {
                Ok(_) => {}
                Err(e) if cu::is_not_found(&e) => return Ok(()),
                Err(e) => return Err(e.into()),
            }
        }
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: pod.metadata.uid.clone(),
                resource_version: None,
            }),
            ..Default::default()
        };
        match api.delete(name, &dp).await {
            Ok(_) => {
                tracing::info!(pod = %format!("{ns}/{name}"), "garbage-collected a pod");
                Ok(())
            }
            Err(e) if cu::is_not_found(&e) || cu::is_conflict(&e) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    async fn delete_all(&self, pods: Vec<Arc<Pod>>, condition: Option<(&str, &str)>) {
        for pod in pods {
            if let Err(e) = self.fail_and_delete(&pod, condition).await {
                tracing::warn!(pod = ?pod.metadata.name, error = format!("{e:#}"), "garbage-collecting a pod");
            }
        }
    }

    /// Whether the API server itself says the node is gone (the cache may lag).
    async fn node_gone(&self, name: &str) -> bool {
        match Api::<Node>::all(self.client.clone()).get_opt(name).await {
            Ok(node) => node.is_none(),
            Err(e) => {
                tracing::debug!(node = name, error = %e, "checking a node");
                false
            }
        }
    }

    async fn pass(&mut self, pods: &Informer<Pod>, nodes: &Store<Node>) {
        let all = pods.list();
        let now = Instant::now();
        // Terminated pods beyond the threshold.
        let excess = terminated_to_delete(&all, self.config.terminated_pod_threshold);
        self.delete_all(excess, None).await;

        // Terminating pods on out-of-service nodes that are not Ready.
        let mut stuck: Vec<Arc<Pod>> = all
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_some())
            .filter(|p| {
                let node = p.spec.as_ref().and_then(|s| s.node_name.as_deref());
                node.and_then(|n| nodes.get(&ObjectRef::new(n)))
                    .is_some_and(|n| !node_ready(&n) && out_of_service(&n))
            })
            .cloned()
            .collect();
        stuck.sort_by(|a, b| gc_order(a, b));
        self.delete_all(stuck, None).await;

        // Pods of nodes that are gone.
        let mut bound_to: HashSet<String> = HashSet::new();
        for pod in &all {
            if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref())
                && !node.is_empty()
                && nodes.get(&ObjectRef::new(node)).is_none()
            {
                bound_to.insert(node.to_string());
            }
        }
        self.missing.retain(|node, _| bound_to.contains(node));
        let mut gone = HashSet::new();
        for node in bound_to {
            let since = *self.missing.entry(node.clone()).or_insert(now);
            if now.duration_since(since) >= self.config.quarantine && self.node_gone(&node).await {
                gone.insert(node);
            }
        }
        if !gone.is_empty() {
            let orphans: Vec<Arc<Pod>> = all
                .iter()
                .filter(|p| {
                    p.spec
                        .as_ref()
                        .and_then(|s| s.node_name.as_deref())
                        .is_some_and(|n| gone.contains(n))
                })
                .cloned()
                .collect();
            self.delete_all(orphans, Some(("DeletionByPodGC", "PodGC: node no longer exists")))
                .await;
            for node in gone {
                self.missing.remove(&node);
            }
        }

        // Terminating pods that were never bound.
        let unbound: Vec<Arc<Pod>> = all
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_some())
            .filter(|p| {
                p.spec
                    .as_ref()
                    .and_then(|s| s.node_name.as_deref())
                    .unwrap_or("")
                    .is_empty()
            })
            .cloned()
            .collect();
        self.delete_all(unbound, None).await;
    }
}

pub async fn run(client: kube::Client, config: PodGcConfig, informers: SharedInformerFactory) -> anyhow::Result<()> {
    let idle = WorkQueue::new();
    let pods = informers.informer::<Pod>();
    let nodes = cu::spawn_store_watch(Api::<Node>::all(client.clone()), idle, |_: &Node| Vec::new());
    pods.wait_synced().await;
    let _ = nodes.wait_until_ready().await;
    let mut tick = tokio::time::interval(config.check_period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut collector = Collector {
        client,
        config,
        missing: HashMap::new(),
    };
    loop {
        tick.tick().await;
        collector.pass(&pods, &nodes).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, phase: &str, reason: Option<&str>, created: &str) -> Arc<Pod> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "creationTimestamp": created},
                "status": {"phase": phase, "reason": reason},
            }))
            .expect("a Pod"),
        )
    }

    #[test]
    fn terminated_pods_beyond_the_threshold_go_evicted_then_oldest_first() {
        let pods = vec![
            pod("running", "Running", None, "2026-01-01T00:00:00Z"),
            pod("old", "Succeeded", None, "2026-01-01T00:00:01Z"),
            pod("new", "Failed", None, "2026-01-01T00:00:05Z"),
            pod("evicted", "Failed", Some("Evicted"), "2026-01-01T00:00:09Z"),
            pod("middle", "Succeeded", None, "2026-01-01T00:00:03Z"),
        ];
        let names = |v: Vec<Arc<Pod>>| -> Vec<String> { v.iter().filter_map(|p| p.metadata.name.clone()).collect() };
        assert_eq!(names(terminated_to_delete(&pods, 2)), ["evicted", "old"]);
        assert_eq!(names(terminated_to_delete(&pods, 4)), Vec::<String>::new());
        assert_eq!(names(terminated_to_delete(&pods, 0)), Vec::<String>::new());
        assert_eq!(names(terminated_to_delete(&pods, 1)), ["evicted", "old", "middle"]);
    }
}
