//! Writes the scheduler makes besides bindings: FailedScheduling/Scheduled events (aggregated
//! like client-go's recorder), the PodScheduled condition, explain annotations, evictions.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use skiff_record::{EventRecorder, Options};
use tokio::sync::Semaphore;

use crate::explain::EXPLAIN_ANNOTATION;
use crate::types::PodInfo;

/// Kubernetes timestamp (seconds precision, UTC).
pub fn now_rfc3339() -> String {
    jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Performs the writes on background tasks, at most `concurrency` at a time. Events go through
/// the one event recorder (`skiff_record`) with a queue and a pool of writes of their own, so a
/// burst's bindings come first and its events follow.
#[derive(Clone)]
pub struct Writer {
    client: Client,
    limit: Arc<Semaphore>,
    events: EventRecorder,
}

/// Events waiting to be written beyond which new ones are dropped (upstream's broadcaster
/// queues 1,000).
const MAX_QUEUED_EVENTS: usize = 10_000;

impl Writer {
    pub fn new(client: Client, component: String, concurrency: usize, event_concurrency: usize) -> Self {
        let events = EventRecorder::new(
            client.clone(),
            Options {
                queue_limit: MAX_QUEUED_EVENTS,
                concurrency: event_concurrency,
                ..Options::component(&component)
            },
        );
        Writer {
            client,
            limit: Arc::new(Semaphore::new(concurrency.max(1))),
            events,
        }
    }

    /// Records an event about a pod (a repeat bumps the existing event's count, as client-go's
    /// correlator does). The event carries the time it was recorded, however long it waits to
    /// be written; recording never waits.
    pub fn event(
        &self,
        pod: &PodInfo,
        type_: &'static str,
        reason: &'static str,
        action: &'static str,
        message: String,
    ) {
        let involved = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(pod.name.clone()),
            namespace: Some(pod.namespace.clone()),
            uid: Some(pod.uid.clone()),
            resource_version: pod.pod.metadata.resource_version.clone(),
            field_path: None,
        };
        self.events.record(involved, type_, reason, Some(action), message);
    }

    /// Sets PodScheduled=False (and nominatedNodeName) on the status subresource when it
    /// changed, and stores the explanation annotation.
    pub fn unschedulable(
        &self,
        pod: Arc<PodInfo>,
        reason: &'static str,
        message: String,
        nominated: Option<String>,
        explain: Option<String>,
    ) {
        let w = self.clone();
        tokio::spawn(async move {
            let Ok(_permit) = w.limit.acquire().await else {
                return;
            };
            let api: Api<Pod> = Api::namespaced(w.client.clone(), &pod.namespace);
            if let Some(patch) = status_patch(&pod.pod, reason, &message, nominated.as_deref())
                && let Err(e) = api
                    .patch_status(&pod.name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
            {
                tracing::debug!(error = %e, pod = %pod.key(), "updating pod status failed");
            }
            if let Some(explain) = explain {
                let current = pod
                    .pod
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(EXPLAIN_ANNOTATION));
                if current != Some(&explain) {
                    let patch = json!({"metadata": {"annotations": {EXPLAIN_ANNOTATION: explain}}});
                    if let Err(e) = api
                        .patch(&pod.name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                    {
                        tracing::debug!(error = %e, pod = %pod.key(), "storing explanation failed");
                    }
                }
            }
        });
    }

    /// Stores an explanation annotation on a pod.
    pub fn explain(&self, pod: Arc<PodInfo>, explain: String) {
        let w = self.clone();
        tokio::spawn(async move {
            let Ok(_permit) = w.limit.acquire().await else { return };
            let api: Api<Pod> = Api::namespaced(w.client.clone(), &pod.namespace);
            let patch = json!({"metadata": {"annotations": {EXPLAIN_ANNOTATION: explain}}});
            if let Err(e) = api
                .patch(&pod.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                tracing::debug!(error = %e, pod = %pod.key(), "storing explanation failed");
            }
        });
    }

    /// Evicts a preemption victim.
    pub fn delete_victim(&self, victim: Arc<PodInfo>) {
        let w = self.clone();
        tokio::spawn(async move {
            let Ok(_permit) = w.limit.acquire().await else {
                return;
            };
            let api: Api<Pod> = Api::namespaced(w.client.clone(), &victim.namespace);
            let dp = DeleteParams {
                preconditions: Some(kube::api::Preconditions {
                    uid: Some(victim.uid.clone()),
                    resource_version: None,
                }),
                ..Default::default()
            };
            match api.delete(&victim.name, &dp).await {
                // Already gone: a victim chosen again before its deletion reached the cache (as
                // upstream's PreemptPod, not an error).
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    tracing::debug!(pod = %victim.key(), "preemption victim already deleted")
                }
                Err(e) => tracing::warn!(error = %e, pod = %victim.key(), "deleting preemption victim failed"),
                Ok(_) => {}
            }
        });
    }
}

/// The merge patch for PodScheduled=False, or None when the pod already says so.
pub fn status_patch(pod: &Pod, reason: &str, message: &str, nominated: Option<&str>) -> Option<Value> {
    let status = pod.status.as_ref();
    let conditions = status.and_then(|s| s.conditions.clone()).unwrap_or_default();
    let current_nominated = status.and_then(|s| s.nominated_node_name.as_deref());
    let old = conditions.iter().find(|c| c.type_ == "PodScheduled");
    let same = old.is_some_and(|c| {
        c.status == "False" && c.reason.as_deref() == Some(reason) && c.message.as_deref() == Some(message)
    });
    let nominated_same = nominated.is_none() || nominated == current_nominated;
    if same && nominated_same {
        return None;
    }
    let now = now_rfc3339();
    let transition = match old {
        Some(c) if c.status == "False" => c
            .last_transition_time
            .as_ref()
            .and_then(|t| serde_json::to_value(t).ok())
            .unwrap_or(Value::String(now.clone())),
        _ => Value::String(now),
    };
    let mut list: Vec<Value> = conditions
        .iter()
        .filter(|c| c.type_ != "PodScheduled")
        .filter_map(|c| serde_json::to_value(c).ok())
        .collect();
    list.push(json!({
        "type": "PodScheduled",
        "status": "False",
        "reason": reason,
        "message": message,
        "lastProbeTime": null,
        "lastTransitionTime": transition,
    }));
    let mut patch = json!({"status": {"conditions": list}});
    if let Some(n) = nominated {
        patch["status"]["nominatedNodeName"] = Value::String(n.to_string());
    }
    Some(patch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};

    #[test]
    fn status_patch_only_when_changed() {
        let mut pod = Pod::default();
        let p = status_patch(&pod, "Unschedulable", "0/1 nodes are available", None).unwrap();
        let conds = p["status"]["conditions"].as_array().unwrap();
        assert_eq!(conds.len(), 1);
        assert_eq!(conds[0]["type"], "PodScheduled");
        assert_eq!(conds[0]["status"], "False");
        assert_eq!(conds[0]["reason"], "Unschedulable");
        pod.status = Some(PodStatus {
            conditions: Some(vec![PodCondition {
                type_: "PodScheduled".into(),
                status: "False".into(),
                reason: Some("Unschedulable".into()),
                message: Some("0/1 nodes are available".into()),
                ..Default::default()
            }]),
            ..Default::default()
        });
        assert!(status_patch(&pod, "Unschedulable", "0/1 nodes are available", None).is_none());
        let p = status_patch(&pod, "Unschedulable", "0/1 nodes are available", Some("n1")).unwrap();
        assert_eq!(p["status"]["nominatedNodeName"], "n1");
    }
}
