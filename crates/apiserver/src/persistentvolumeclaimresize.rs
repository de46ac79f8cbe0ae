//! Upstream's PersistentVolumeClaimResize admission plugin
//! (`plugin/pkg/admission/storage/persistentvolume/resize`): a claim's storage request may grow
//! only when the claim is bound and its StorageClass (the same before and after) allows volume
//! expansion. It runs after validation, which has already refused shrinking and changes to an
//! unbound claim's request.

use serde_json::Value;
use skiff_api::StatusError;
use skiff_api::quantity::Quantity;
use skiff_api::volume::class_of;

use crate::handlers::Ctx;
use crate::objects;

fn requested(pvc: &Value) -> Quantity {
    pvc.pointer("/spec/resources/requests/storage")
        .and_then(|v| Quantity::from_json(v).ok())
        .unwrap_or_default()
}

/// Why growing `old` into `new` is refused, given the claim's StorageClass when it exists.
pub fn refusal(new: &Value, old: &Value, storage_class: Option<&Value>) -> Option<&'static str> {
    if requested(new) <= requested(old) {
        return None;
    }
    if old.pointer("/status/phase").and_then(Value::as_str) != Some("Bound") {
        return Some("Only bound persistent volume claims can be expanded");
    }
    let (new_class, old_class) = (class_of(new), class_of(old));
    let allowed = !new_class.is_empty()
        && new_class == old_class
        && storage_class
            .and_then(|sc| sc.get("allowVolumeExpansion"))
            .and_then(Value::as_bool)
            == Some(true);
    (!allowed).then_some(
        "only dynamically provisioned pvc can be resized and the storageclass that provisions the pvc must support resize",
    )
}

/// Checks an update of a claim (not of its status) that may grow it.
pub async fn admit(ctx: &Ctx, new: &Value, old: &Value) -> Result<(), StatusError> {
    if requested(new) <= requested(old) {
        return Ok(());
    }
    let name = class_of(new);
    let storage_class = match skiff_api::registry::lookup("storage.k8s.io", "v1", "storageclasses") {
        Some(res) if !name.is_empty() => ctx
            .state
            .store
            .get(&objects::key(res, "", name))
            .await
            .map_err(|e| ctx.store_err(e))?
            .and_then(|kv| objects::decode_kv(&kv)),
        _ => None,
    };
    match refusal(new, old, storage_class.as_ref()) {
        None => Ok(()),
        Some(why) => Err(StatusError::forbidden_resource(
            "",
            "persistentvolumeclaims",
            objects::name(new),
            why,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pvc(size: &str, phase: &str, class: &str) -> Value {
        json!({
            "metadata": {"name": "data"},
            "spec": {"storageClassName": class, "resources": {"requests": {"storage": size}}},
            "status": {"phase": phase},
        })
    }

    #[test]
    fn only_bound_claims_of_expandable_classes_grow() {
        let expandable = json!({"allowVolumeExpansion": true});
        let fixed = json!({"allowVolumeExpansion": false});
        let old = pvc("1Gi", "Bound", "local-path");
        assert_eq!(
            refusal(&pvc("2Gi", "Bound", "local-path"), &old, Some(&expandable)),
            None
        );
        // Not growing: nothing to say.
        assert_eq!(refusal(&pvc("1024Mi", "Bound", "local-path"), &old, None), None);
        assert_eq!(
            refusal(&pvc("1Gi", "Pending", "x"), &pvc("2Gi", "Pending", "x"), None),
            None
        );
        let resize = "only dynamically provisioned pvc can be resized and the storageclass that provisions the pvc \
                      must support resize";
        assert_eq!(
            refusal(&pvc("2Gi", "Bound", "local-path"), &old, Some(&fixed)),
            Some(resize)
        );
        assert_eq!(
            refusal(&pvc("2Gi", "Bound", "local-path"), &old, Some(&json!({}))),
            Some(resize)
        );
        assert_eq!(refusal(&pvc("2Gi", "Bound", "local-path"), &old, None), Some(resize));
        let classless = pvc("1Gi", "Bound", "");
        assert_eq!(
            refusal(&pvc("2Gi", "Bound", ""), &classless, Some(&expandable)),
            Some(resize)
        );
        assert_eq!(
            refusal(
                &pvc("2Gi", "Pending", "local-path"),
                &pvc("1Gi", "Pending", "local-path"),
                Some(&expandable)
            ),
            Some("Only bound persistent volume claims can be expanded")
        );
    }
}
