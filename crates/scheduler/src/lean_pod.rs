//! The scheduler's informer form of a Pod: everything but `metadata.managedFields`, which
//! the scheduler never reads and which is the largest part of most pods, and of the status only
//! what scheduling reads (phase, conditions, nominatedNodeName, startTime): the containers'
//! statuses of every running pod are most of the rest. Upstream's scheduler strips
//! managedFields in an informer transform after decoding; here what is not kept is skipped while
//! decoding, so it is never allocated.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, PodCondition, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use serde::Deserialize;

/// A Pod decoded without its managedFields.
#[derive(Clone, Debug, Default)]
pub struct LeanPod(pub Pod);

/// ObjectMeta's fields but managedFields (which serde skips as an unknown field).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LeanMeta {
    annotations: Option<BTreeMap<String, String>>,
    creation_timestamp: Option<Time>,
    deletion_grace_period_seconds: Option<i64>,
    deletion_timestamp: Option<Time>,
    finalizers: Option<Vec<String>>,
    generate_name: Option<String>,
    generation: Option<i64>,
    labels: Option<BTreeMap<String, String>>,
    name: Option<String>,
    namespace: Option<String>,
    owner_references: Option<Vec<OwnerReference>>,
    resource_version: Option<String>,
    self_link: Option<String>,
    uid: Option<String>,
}

/// The status fields scheduling reads; serde skips the others.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LeanStatus {
    conditions: Option<Vec<PodCondition>>,
    nominated_node_name: Option<String>,
    phase: Option<String>,
    start_time: Option<Time>,
}

#[derive(Deserialize)]
struct Wire {
    #[serde(default)]
    metadata: Option<LeanMeta>,
    spec: Option<PodSpec>,
    status: Option<LeanStatus>,
}

impl<'de> Deserialize<'de> for LeanPod {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let w = Wire::deserialize(d)?;
        let metadata = w
            .metadata
            .map(|m| ObjectMeta {
                annotations: m.annotations,
                creation_timestamp: m.creation_timestamp,
                deletion_grace_period_seconds: m.deletion_grace_period_seconds,
                deletion_timestamp: m.deletion_timestamp,
                finalizers: m.finalizers,
                generate_name: m.generate_name,
                generation: m.generation,
                labels: m.labels,
                managed_fields: None,
                name: m.name,
                namespace: m.namespace,
                owner_references: m.owner_references,
                resource_version: m.resource_version,
                self_link: m.self_link,
                uid: m.uid,
            })
            .unwrap_or_default();
        Ok(LeanPod(Pod {
            metadata,
            spec: w.spec,
            status: w.status.map(|s| PodStatus {
                conditions: s.conditions,
                nominated_node_name: s.nominated_node_name,
                phase: s.phase,
                start_time: s.start_time,
                ..Default::default()
            }),
        }))
    }
}

impl kube::Resource for LeanPod {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        <Pod as kube::Resource>::kind(&())
    }
    fn group(_: &()) -> Cow<'_, str> {
        <Pod as kube::Resource>::group(&())
    }
    fn version(_: &()) -> Cow<'_, str> {
        <Pod as kube::Resource>::version(&())
    }
    fn plural(_: &()) -> Cow<'_, str> {
        <Pod as kube::Resource>::plural(&())
    }
    fn meta(&self) -> &ObjectMeta {
        &self.0.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.0.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_everything_but_managed_fields_and_unread_status() {
        let v = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": "p", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                "labels": {"a": "b"}, "annotations": {"x": "y"},
                "deletionTimestamp": "2026-01-01T00:00:00Z", "finalizers": ["f"],
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "r"}],
                "managedFields": [{"manager": "kubectl", "operation": "Update", "fieldsType": "FieldsV1",
                                   "fieldsV1": {"f:metadata": {}}}]
            },
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]},
            "status": {"phase": "Running", "nominatedNodeName": "n2", "startTime": "2026-01-01T00:00:00Z",
                       "conditions": [{"type": "PodScheduled", "status": "True"}], "hostIP": "10.0.0.1",
                       "containerStatuses": [{"name": "c", "image": "i", "imageID": "", "ready": true,
                                              "restartCount": 0, "state": {"running": {}}}]}
        });
        let lean: LeanPod = serde_json::from_value(v.clone()).unwrap();
        let mut full: Pod = serde_json::from_value(v).unwrap();
        assert!(full.metadata.managed_fields.take().is_some());
        let status = full.status.as_mut().unwrap();
        assert!(status.container_statuses.take().is_some());
        assert!(status.host_ip.take().is_some());
        assert_eq!(lean.0, full);
    }

    #[test]
    fn wrong_types_are_errors() {
        let bad = serde_json::json!({"metadata": {"name": 3}});
        assert!(serde_json::from_value::<LeanPod>(bad).is_err());
    }
}
