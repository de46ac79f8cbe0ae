//! Core/v1 Events about pods, written as upstream's kubelet writes them (source component `kubelet`),
//! and about the objects the node's volume provisioner handles (its own source component), with
//! repeated events folded into one object whose count grows. A repeat within `THROTTLE` of the
//! last write is only counted; the next write carries the count.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use parking_lot::Mutex;

pub const NORMAL: &str = "Normal";
pub const WARNING: &str = "Warning";

const THROTTLE: Duration = Duration::from_secs(30);

/// One folded event: its object name, how many times it happened, when it was last written.
struct Seen {
    name: String,
    count: i32,
    written: Instant,
}

/// What to write for an occurrence.
#[derive(Debug, PartialEq)]
enum Action {
    Create,
    Patch { name: String, count: i32 },
    Skip,
}

#[derive(Clone)]
pub struct Recorder {
    client: kube::Client,
    node: String,
    /// The source component; the kubelet's events also name the node as their source host.
    component: String,
    seen: Arc<Mutex<HashMap<String, Seen>>>,
}

fn decide(seen: &mut HashMap<String, Seen>, key: &str, name: &str, now: Instant) -> Action {
    match seen.get_mut(key) {
        Some(entry) => {
            entry.count += 1;
            if now.duration_since(entry.written) < THROTTLE {
                Action::Skip
            } else {
                entry.written = now;
                Action::Patch {
                    name: entry.name.clone(),
                    count: entry.count,
                }
            }
        }
        None => {
            if seen.len() > 4096 {
                seen.retain(|_, e| now.duration_since(e.written) < THROTTLE * 20);
            }
            seen.insert(
                key.to_string(),
                Seen {
                    name: name.to_string(),
                    count: 1,
                    written: now,
                },
            );
            Action::Create
        }
    }
}

impl Recorder {
    /// The kubelet's recorder for node `node`.
    pub fn new(client: kube::Client, node: &str) -> Self {
        Self::for_component(client, node, "kubelet")
    }

    /// A recorder whose events come from `component` (an external provisioner names itself).
    pub fn for_component(client: kube::Client, node: &str, component: &str) -> Self {
        Self {
            client,
            node: node.to_string(),
            component: component.to_string(),
            seen: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// Records an event about a pod (or one of its containers: `container` is `spec.containers{NAME}`
    /// style field path). Sent in the background; failures are logged.
    pub fn pod_event(&self, pod: &Pod, field_path: Option<String>, type_: &str, reason: &str, message: String) {
        let namespace = pod.metadata.namespace.clone().unwrap_or_else(|| "default".into());
        let involved = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: pod.metadata.name.clone(),
            namespace: Some(namespace.clone()),
            uid: pod.metadata.uid.clone(),
            resource_version: pod.metadata.resource_version.clone(),
            field_path,
        };
        self.record(involved, namespace, type_, reason, message);
    }

    /// Records an event about any object, as client-go's recorder does: one of a cluster-scoped
    /// object goes to the `default` namespace. Sent in the background; failures are logged.
    pub fn object_event<K>(&self, obj: &K, type_: &str, reason: &str, message: String)
    where
        K: kube::Resource<DynamicType = ()>,
    {
        let meta = obj.meta();
        let involved = ObjectReference {
            api_version: Some(K::api_version(&()).into_owned()),
            kind: Some(K::kind(&()).into_owned()),
            name: meta.name.clone(),
            namespace: meta.namespace.clone(),
            uid: meta.uid.clone(),
            resource_version: meta.resource_version.clone(),
            field_path: None,
        };
        let namespace = meta.namespace.clone().unwrap_or_else(|| "default".into());
        self.record(involved, namespace, type_, reason, message);
    }

    fn record(&self, involved: ObjectReference, namespace: String, type_: &str, reason: &str, message: String) {
        let name = involved.name.clone().unwrap_or_default();
        let key = format!(
            "{}\u{0}{}\u{0}{reason}\u{0}{message}",
            involved.uid.as_deref().unwrap_or(""),
            involved.field_path.as_deref().unwrap_or("")
        );
        // The kubelet names its node as the source host; other components name no host, as
        // client-go's recorder leaves it empty when its source has none.
        let host = (self.component == "kubelet").then(|| self.node.clone());
        let now = jiff::Timestamp::now();
        let event = Event {
            metadata: ObjectMeta {
                name: Some(format!("{name}.{:x}", now.as_nanosecond())),
                namespace: Some(namespace.clone()),
                ..Default::default()
            },
            involved_object: involved,
            reason: Some(reason.into()),
            message: Some(message),
            type_: Some(type_.into()),
            count: Some(1),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            event_time: None::<MicroTime>,
            source: Some(EventSource {
                component: Some(self.component.clone()),
                host: host.clone(),
            }),
            reporting_component: Some(self.component.clone()),
            reporting_instance: host,
            ..Default::default()
        };
        let action = decide(
            &mut self.seen.lock(),
            &key,
            &event.metadata.name.clone().unwrap_or_default(),
            Instant::now(),
        );
        if action == Action::Skip {
            return;
        }
        let this = self.clone();
        let reason = reason.to_string();
        tokio::spawn(async move {
            if let Err(e) = this.send(action, &namespace, event).await {
                tracing::debug!(error = %format!("{e:#}"), %reason, "recording an event");
            }
        });
    }

    async fn send(&self, action: Action, namespace: &str, mut event: Event) -> anyhow::Result<()> {
        let api: Api<Event> = Api::namespaced(self.client.clone(), namespace);
        if let Action::Patch { name, count } = &action {
            let patch = serde_json::json!({ "count": count, "lastTimestamp": event.last_timestamp });
            if api
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .is_ok()
            {
                return Ok(());
            }
            // The event is gone (expired or never written): write it again under its name.
            event.metadata.name = Some(name.clone());
            event.count = Some(*count);
        }
        api.create(&PostParams::default(), &event).await?;
        Ok(())
    }
}

/// The field path of a container in a pod, as upstream's references carry it.
pub fn container_field_path(init: bool, name: &str) -> String {
    if init {
        format!("spec.initContainers{{{name}}}")
    } else {
        format!("spec.containers{{{name}}}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeats_are_folded_and_throttled() {
        let mut seen = HashMap::new();
        let t0 = Instant::now();
        assert_eq!(decide(&mut seen, "k", "p.1", t0), Action::Create);
        assert_eq!(decide(&mut seen, "k", "p.2", t0 + Duration::from_secs(1)), Action::Skip);
        assert_eq!(decide(&mut seen, "k", "p.3", t0 + Duration::from_secs(2)), Action::Skip);
        assert_eq!(
            decide(&mut seen, "k", "p.4", t0 + Duration::from_secs(31)),
            Action::Patch {
                name: "p.1".into(),
                count: 4
            }
        );
        assert_eq!(
            decide(&mut seen, "other", "p.5", t0 + Duration::from_secs(31)),
            Action::Create
        );
    }
}
