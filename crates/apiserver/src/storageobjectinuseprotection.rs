//! Upstream's StorageObjectInUseProtection admission plugin: every PersistentVolumeClaim created
//! gets the `kubernetes.io/pvc-protection` finalizer and every PersistentVolume the
//! `kubernetes.io/pv-protection` finalizer, so that deleting one still in use only marks it
//! (`Terminating`). The pvc-protection and pv-protection controllers remove the finalizers once
//! nothing uses the object. Creates only; subresources are left alone.

use serde_json::{Value, json};
use skiff_api::Resource;

/// On claims: removed once no pod uses the claim.
pub const PVC_PROTECTION_FINALIZER: &str = "kubernetes.io/pvc-protection";
/// On volumes: removed once the volume is not Bound.
pub const PV_PROTECTION_FINALIZER: &str = "kubernetes.io/pv-protection";

/// The finalizer this plugin adds to a created object of `res`, if any.
fn finalizer_for(res: &Resource, subresource: &str) -> Option<&'static str> {
    if !res.group.is_empty() || !subresource.is_empty() {
        return None;
    }
    match res.plural {
        "persistentvolumeclaims" => Some(PVC_PROTECTION_FINALIZER),
        "persistentvolumes" => Some(PV_PROTECTION_FINALIZER),
        _ => None,
    }
}

/// Adds the protection finalizer to a claim or volume being created, after any the creator set.
pub fn admit(res: &Resource, subresource: &str, obj: &mut Value) {
    let Some(finalizer) = finalizer_for(res, subresource) else {
        return;
    };
    let name = meta_name(obj).to_string();
    let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    let list = meta.entry("finalizers").or_insert_with(|| json!([]));
    if list.is_null() {
        *list = json!([]);
    }
    let Some(items) = list.as_array_mut() else {
        return;
    };
    if items.iter().any(|f| f.as_str() == Some(finalizer)) {
        return;
    }
    tracing::debug!(
        resource = res.plural,
        name,
        finalizer,
        "adding the storage protection finalizer"
    );
    items.push(json!(finalizer));
}

fn meta_name(obj: &Value) -> &str {
    obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(group: &str, version: &str, plural: &str) -> &'static Resource {
        skiff_api::registry::lookup(group, version, plural).expect("served")
    }

    #[test]
    fn claims_and_volumes_get_their_finalizer_once() {
        let mut pvc = json!({"metadata": {"name": "data"}, "spec": {}});
        admit(res("", "v1", "persistentvolumeclaims"), "", &mut pvc);
        assert_eq!(pvc["metadata"]["finalizers"], json!(["kubernetes.io/pvc-protection"]));
        admit(res("", "v1", "persistentvolumeclaims"), "", &mut pvc);
        assert_eq!(pvc["metadata"]["finalizers"], json!(["kubernetes.io/pvc-protection"]));

        let mut pv = json!({"metadata": {"name": "pv1", "finalizers": ["example.com/mine"]}});
        admit(res("", "v1", "persistentvolumes"), "", &mut pv);
        assert_eq!(
            pv["metadata"]["finalizers"],
            json!(["example.com/mine", "kubernetes.io/pv-protection"])
        );

        let mut null_list = json!({"metadata": {"name": "pv2", "finalizers": null}});
        admit(res("", "v1", "persistentvolumes"), "", &mut null_list);
        assert_eq!(
            null_list["metadata"]["finalizers"],
            json!(["kubernetes.io/pv-protection"])
        );
    }

    #[test]
    fn other_objects_and_subresources_are_left_alone() {
        let mut pod = json!({"metadata": {"name": "p"}});
        admit(res("", "v1", "pods"), "", &mut pod);
        assert!(pod["metadata"].get("finalizers").is_none());
        let mut status = json!({"metadata": {"name": "data"}});
        admit(res("", "v1", "persistentvolumeclaims"), "status", &mut status);
        assert!(status["metadata"].get("finalizers").is_none());
    }
}
