//! ControllerRevision helpers shared by the DaemonSet and StatefulSet controllers (upstream's
//! `pkg/controller/history`): a revision holds the pod template as a strategic-merge patch
//! (`{"spec":{"template":{...,"$patch":"replace"}}}`), which is what `kubectl rollout undo`
//! applies back.

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use serde_json::{Value, json};

use crate::controller_utils as cu;

/// The pod label naming the revision a pod was made from.
pub const CONTROLLER_REVISION_HASH_LABEL: &str = "controller-revision-hash";
/// The label a ControllerRevision carries with its own hash.
pub const REVISION_HASH_LABEL: &str = "controller.kubernetes.io/hash";

/// The patch a revision stores for a template.
pub fn template_patch(template: &PodTemplateSpec) -> Value {
    let mut t = serde_json::to_value(template).unwrap_or_else(|_| json!({}));
    if let Value::Object(m) = &mut t {
        m.insert("$patch".into(), json!("replace"));
    }
    json!({"spec": {"template": t}})
}

/// The template stored in a revision.
pub fn template_of(rev: &ControllerRevision) -> Option<PodTemplateSpec> {
    let mut t = rev.data.as_ref()?.0.get("spec")?.get("template")?.clone();
    if let Value::Object(m) = &mut t {
        m.remove("$patch");
    }
    serde_json::from_value(t).ok()
}

/// Whether a revision holds exactly this template.
pub fn matches(rev: &ControllerRevision, template: &PodTemplateSpec) -> bool {
    rev.data.as_ref().is_some_and(|d| d.0 == template_patch(template))
}

/// Upstream's `HashControllerRevision`: FNV-1a of the data, then the probe (collision count)
/// as 4 little-endian bytes, safely encoded.
pub fn hash_revision(data: &Value, probe: Option<i32>) -> String {
    let mut bytes = cu::canonical_json(data).into_bytes();
    if let Some(p) = probe {
        bytes.extend_from_slice(&(p as u32).to_le_bytes());
    }
    cu::safe_encode_string(&cu::fnv32a(&bytes).to_string())
}

/// Upstream's `ControllerRevisionName`: `<prefix>-<hash>`, the prefix cut to 223 characters.
pub fn revision_name(prefix: &str, hash: &str) -> String {
    let p = if prefix.len() > 223 { &prefix[..223] } else { prefix };
    format!("{p}-{hash}")
}

/// The highest revision number (0 for none).
pub fn max_revision(revs: &[ControllerRevision]) -> i64 {
    revs.iter().map(|r| r.revision).max().unwrap_or(0)
}

/// A new revision object (not yet created) for a template.
pub fn new_revision(
    owner: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    owner_kind: &str,
    name: String,
    hash: &str,
    template: &PodTemplateSpec,
    revision: i64,
) -> ControllerRevision {
    let mut labels = template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    labels.insert(REVISION_HASH_LABEL.to_string(), hash.to_string());
    ControllerRevision {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(name),
            namespace: owner.namespace.clone(),
            labels: Some(labels),
            owner_references: Some(vec![cu::new_controller_ref(owner, "apps/v1", owner_kind)]),
            ..Default::default()
        },
        data: Some(RawExtension(template_patch(template))),
        revision,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    #[test]
    fn template_round_trips_through_a_revision() {
        let t = PodTemplateSpec {
            metadata: Some(ObjectMeta {
                labels: Some([("app".to_string(), "x".to_string())].into()),
                ..Default::default()
            }),
            spec: None,
        };
        let owner = ObjectMeta {
            name: Some("ds".into()),
            namespace: Some("default".into()),
            uid: Some("u".into()),
            ..Default::default()
        };
        let r = new_revision(&owner, "DaemonSet", "ds-abc".into(), "abc", &t, 3);
        assert!(matches(&r, &t));
        assert_eq!(template_of(&r), Some(t));
        assert_eq!(
            r.data.as_ref().map(|d| d.0["spec"]["template"]["$patch"].clone()),
            Some(json!("replace"))
        );
        assert_eq!(
            r.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(REVISION_HASH_LABEL))
                .map(String::as_str),
            Some("abc")
        );
    }

    #[test]
    fn names_and_hashes() {
        assert_eq!(revision_name("web", "abc"), "web-abc");
        assert_eq!(revision_name(&"x".repeat(300), "h").len(), 225);
        let d = json!({"a": 1});
        assert_ne!(hash_revision(&d, None), hash_revision(&d, Some(1)));
    }
}
