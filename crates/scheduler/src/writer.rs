//! Writes the scheduler makes besides bindings: FailedScheduling/Scheduled events (aggregated
//! like client-go's recorder), the PodScheduled condition, explain annotations, evictions.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use crate::explain::EXPLAIN_ANNOTATION;
use crate::types::PodInfo;

/// Kubernetes timestamp (seconds precision, UTC).
pub fn now_rfc3339() -> String {
    jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// A core/v1 Event as the scheduler records it, serialized without building a JSON tree.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct EventBody<'a> {
    api_version: &'static str,
    kind: &'static str,
    metadata: EventMeta<'a>,
    involved_object: Involved<'a>,
    reason: &'a str,
    message: &'a str,
    #[serde(rename = "type")]
    type_: &'a str,
    action: &'a str,
    source: Source<'a>,
    reporting_component: &'a str,
    reporting_instance: &'a str,
    first_timestamp: &'a str,
    last_timestamp: &'a str,
    count: i64,
}

#[derive(serde::Serialize)]
struct EventMeta<'a> {
    name: &'a str,
    namespace: &'a str,
}

#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct Involved<'a> {
    kind: &'static str,
    namespace: &'a str,
    name: &'a str,
    uid: &'a str,
    api_version: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    resource_version: Option<&'a str>,
}

#[derive(serde::Serialize)]
struct Source<'a> {
    component: &'a str,
}

/// (pod uid, reason, message) -> the event recording them.
type AggregateMap = HashMap<(String, String, String), Aggregate>;

struct Aggregate {
    name: String,
    count: i64,
}

/// Performs the writes on background tasks: events at most `event_concurrency` at a time,
/// the other writes at most `concurrency` at a time.
#[derive(Clone)]
pub struct Writer {
    client: Client,
    component: String,
    limit: Arc<Semaphore>,
    event_limit: Arc<Semaphore>,
    /// Events recorded and waiting for a write slot.
    queued_events: Arc<AtomicUsize>,
    /// Events dropped because too many were waiting.
    dropped_events: Arc<AtomicU64>,
    aggregates: Arc<Mutex<AggregateMap>>,
    seq: Arc<AtomicU64>,
}

const MAX_AGGREGATES: usize = 10_000;

/// Events waiting to be written beyond which new ones are dropped (upstream's broadcaster
/// queues 1,000).
const MAX_QUEUED_EVENTS: usize = 10_000;

impl Writer {
    pub fn new(client: Client, component: String, concurrency: usize, event_concurrency: usize) -> Self {
        Writer {
            client,
            component,
            limit: Arc::new(Semaphore::new(concurrency.max(1))),
            event_limit: Arc::new(Semaphore::new(event_concurrency.max(1))),
            queued_events: Arc::new(AtomicUsize::new(0)),
            dropped_events: Arc::new(AtomicU64::new(0)),
            aggregates: Arc::new(Mutex::new(HashMap::new())),
            seq: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Records an event about a pod; a repeat of the same (pod, reason, message) bumps the
    /// existing event's count instead of creating a new one. The event carries the time it
    /// was recorded, however long it waits to be written.
    pub fn event(
        &self,
        pod: &PodInfo,
        type_: &'static str,
        reason: &'static str,
        action: &'static str,
        message: String,
    ) {
        let w = self.clone();
        let ns = pod.namespace.clone();
        let name = pod.name.clone();
        let uid = pod.uid.clone();
        let rv = pod.pod.metadata.resource_version.clone();
        let now = now_rfc3339();
        if self.queued_events.fetch_add(1, Ordering::Relaxed) >= MAX_QUEUED_EVENTS {
            self.queued_events.fetch_sub(1, Ordering::Relaxed);
            // One line for the first drop and one per thousand after it, not one per event.
            let dropped = self.dropped_events.fetch_add(1, Ordering::Relaxed) + 1;
            if dropped == 1 || dropped.is_multiple_of(1000) {
                tracing::warn!(pod = %name, reason, dropped, "too many events waiting to be written; dropping events");
            }
            return;
        }
        tokio::spawn(async move {
            let permit = w.event_limit.acquire().await;
            w.queued_events.fetch_sub(1, Ordering::Relaxed);
            let Ok(_permit) = permit else {
                return;
            };
            let api: Api<Event> = Api::namespaced(w.client.clone(), &ns);
            let key = (uid.clone(), reason.to_string(), message.clone());
            let existing = w.aggregates.lock().get(&key).map(|a| (a.name.clone(), a.count));
            if let Some((ev_name, count)) = existing {
                let patch = json!({"count": count + 1, "lastTimestamp": now});
                match api
                    .patch(&ev_name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => {
                        if let Some(a) = w.aggregates.lock().get_mut(&key) {
                            a.count = count + 1;
                        }
                        return;
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "updating event failed; creating a new one")
                    }
                }
            }
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0)
                .wrapping_add(w.seq.fetch_add(1, Ordering::Relaxed));
            let ev_name = format!("{name}.{nanos:x}");
            let ev = EventBody {
                api_version: "v1",
                kind: "Event",
                metadata: EventMeta {
                    name: &ev_name,
                    namespace: &ns,
                },
                involved_object: Involved {
                    kind: "Pod",
                    namespace: &ns,
                    name: &name,
                    uid: &uid,
                    api_version: "v1",
                    resource_version: rv.as_deref(),
                },
                reason,
                message: &message,
                type_,
                action,
                source: Source {
                    component: &w.component,
                },
                reporting_component: &w.component,
                reporting_instance: &w.component,
                first_timestamp: &now,
                last_timestamp: &now,
                count: 1,
            };
            let created = match serde_json::to_vec(&ev) {
                Ok(bytes) => {
                    match kube::core::Request::new(format!("/api/v1/namespaces/{ns}/events"))
                        .create(&PostParams::default(), bytes)
                    {
                        Ok(req) => w.client.request_text(req).await.map(|_| ()),
                        Err(e) => Err(kube::Error::BuildRequest(e)),
                    }
                }
                Err(e) => Err(kube::Error::SerdeError(e)),
            };
            match created {
                Ok(_) => {
                    let mut agg = w.aggregates.lock();
                    if agg.len() >= MAX_AGGREGATES {
                        agg.clear();
                    }
                    agg.insert(
                        key,
                        Aggregate {
                            name: ev_name,
                            count: 1,
                        },
                    );
                }
                Err(e) => tracing::debug!(error = %e, pod = %name, "recording event failed"),
            }
        });
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
            if let Err(e) = api.delete(&victim.name, &dp).await {
                tracing::warn!(error = %e, pod = %victim.key(), "deleting preemption victim failed");
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
    fn event_body_is_a_core_v1_event() {
        let ev = EventBody {
            api_version: "v1",
            kind: "Event",
            metadata: EventMeta {
                name: "p.1",
                namespace: "ns",
            },
            involved_object: Involved {
                kind: "Pod",
                namespace: "ns",
                name: "p",
                uid: "u",
                api_version: "v1",
                resource_version: None,
            },
            reason: "Scheduled",
            message: "Successfully assigned ns/p to n1",
            type_: "Normal",
            action: "Binding",
            source: Source {
                component: "default-scheduler",
            },
            reporting_component: "default-scheduler",
            reporting_instance: "default-scheduler",
            first_timestamp: "2026-01-01T00:00:00Z",
            last_timestamp: "2026-01-01T00:00:00Z",
            count: 1,
        };
        let parsed: Event = serde_json::from_slice(&serde_json::to_vec(&ev).unwrap()).unwrap();
        assert_eq!(parsed.metadata.name.as_deref(), Some("p.1"));
        assert_eq!(parsed.involved_object.uid.as_deref(), Some("u"));
        assert_eq!(parsed.involved_object.resource_version, None);
        assert_eq!(parsed.type_.as_deref(), Some("Normal"));
        assert_eq!(parsed.reason.as_deref(), Some("Scheduled"));
        assert_eq!(
            parsed.source.and_then(|s| s.component).as_deref(),
            Some("default-scheduler")
        );
        assert_eq!(parsed.reporting_component.as_deref(), Some("default-scheduler"));
        assert_eq!(parsed.count, Some(1));
    }

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
