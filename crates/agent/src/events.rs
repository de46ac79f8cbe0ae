//! Core/v1 Events about pods, written as upstream's kubelet writes them (source component `kubelet`),
//! with repeated events folded into one object whose count grows.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use parking_lot::Mutex;

pub const NORMAL: &str = "Normal";
pub const WARNING: &str = "Warning";

#[derive(Clone)]
pub struct Recorder {
    client: kube::Client,
    node: String,
    seen: Arc<Mutex<HashMap<String, (String, i32)>>>,
}

impl Recorder {
    pub fn new(client: kube::Client, node: &str) -> Self {
        Self {
            client,
            node: node.to_string(),
            seen: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// Records an event about a pod (or one of its containers: `container` is `spec.containers{NAME}`
    /// style field path). Sent in the background; failures are logged.
    pub fn pod_event(
        &self,
        pod: &Pod,
        field_path: Option<String>,
        type_: &str,
        reason: &str,
        message: String,
    ) {
        let namespace = pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let name = pod.metadata.name.clone().unwrap_or_default();
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let key = format!(
            "{uid}\u{0}{}\u{0}{reason}\u{0}{message}",
            field_path.as_deref().unwrap_or("")
        );
        let involved = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(name.clone()),
            namespace: Some(namespace.clone()),
            uid: Some(uid),
            resource_version: pod.metadata.resource_version.clone(),
            field_path,
        };
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
                component: Some("kubelet".into()),
                host: Some(self.node.clone()),
            }),
            reporting_component: Some("kubelet".into()),
            reporting_instance: Some(self.node.clone()),
            ..Default::default()
        };
        let this = self.clone();
        let reason = reason.to_string();
        tokio::spawn(async move {
            if let Err(e) = this.send(key, &namespace, event).await {
                tracing::debug!(error = %format!("{e:#}"), %reason, "recording an event");
            }
        });
    }

    async fn send(&self, key: String, namespace: &str, event: Event) -> anyhow::Result<()> {
        let api: Api<Event> = Api::namespaced(self.client.clone(), namespace);
        let existing = self.seen.lock().get(&key).cloned();
        if let Some((event_name, count)) = existing {
            let patch =
                serde_json::json!({ "count": count + 1, "lastTimestamp": event.last_timestamp });
            if api
                .patch(&event_name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .is_ok()
            {
                self.seen.lock().insert(key, (event_name, count + 1));
                return Ok(());
            }
        }
        let event_name = event.metadata.name.clone().unwrap_or_default();
        api.create(&PostParams::default(), &event).await?;
        let mut seen = self.seen.lock();
        if seen.len() > 4096 {
            seen.clear();
        }
        seen.insert(key, (event_name, 1));
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
