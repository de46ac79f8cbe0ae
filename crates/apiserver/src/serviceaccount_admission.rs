//! Upstream's ServiceAccount admission plugin, the part that holds for mirror pods: a pod the
//! kubelet mirrors from a static manifest (annotated `kubernetes.io/config.mirror`) may not
//! reference a service account, secrets or projected service account tokens, whoever creates
//! it, with upstream's messages. Otherwise a mirror pod would name objects, and through the
//! Node authorizer's graph its node would be granted them.

use serde_json::Value;
use skiff_api::StatusError;

use crate::node_authorizer::{self, Kind};

/// The annotation of a mirror pod.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Whether `pod` is a mirror pod.
pub fn is_mirror_pod(pod: &Value) -> bool {
    pod.pointer("/metadata/annotations")
        .and_then(|a| a.get(MIRROR_ANNOTATION))
        .is_some()
}

/// Whether any projected volume of `pod` has a source named `source`.
pub fn has_projection(pod: &Value, source: &str) -> bool {
    pod.pointer("/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v.pointer("/projected/sources").and_then(Value::as_array))
        .flatten()
        .any(|s| s.get(source).is_some_and(|v| !v.is_null()))
}

/// Upstream's `Validate` for a mirror pod's create: what it may not reference.
pub fn admit_mirror_pod(pod: &Value) -> Result<(), StatusError> {
    if !is_mirror_pod(pod) {
        return Ok(());
    }
    let refuse = |msg: &str| Err(forbidden(pod, msg));
    if pod
        .pointer("/spec/serviceAccountName")
        .and_then(Value::as_str)
        .is_some_and(|s| !s.is_empty())
    {
        return refuse("a mirror pod may not reference service accounts");
    }
    if !node_authorizer::references(pod, Kind::Secret).is_empty() {
        return refuse("a mirror pod may not reference secrets");
    }
    if has_projection(pod, "serviceAccountToken") {
        return refuse("a mirror pod may not use ServiceAccountToken volume projections");
    }
    Ok(())
}

/// The plugin on a create of `res`: pods only.
pub fn admit_mirror_pod_create(res: &skiff_api::Resource, obj: &Value) -> Result<(), StatusError> {
    if res.group.is_empty() && res.plural == "pods" {
        return admit_mirror_pod(obj);
    }
    Ok(())
}

/// Upstream's `admission.NewForbidden` for a pod: `pods "NAME" is forbidden: MESSAGE`.
pub fn forbidden(pod: &Value, msg: &str) -> StatusError {
    StatusError::forbidden_resource("", "pods", crate::objects::name(pod), msg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn mirror(spec: Value) -> Value {
        let mut spec = spec;
        spec["containers"] = json!([{"name": "c", "image": "busybox"}]);
        json!({"metadata": {"name": "m", "annotations": {MIRROR_ANNOTATION: "x"}}, "spec": spec})
    }

    #[test]
    fn mirror_pods_reference_nothing() {
        assert!(admit_mirror_pod(&mirror(json!({}))).is_ok());
        let e = admit_mirror_pod(&mirror(json!({"serviceAccountName": "default"}))).unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (
                403,
                "pods \"m\" is forbidden: a mirror pod may not reference service accounts"
            )
        );
        for spec in [
            json!({"volumes": [{"name": "v", "secret": {"secretName": "s"}}]}),
            json!({"imagePullSecrets": [{"name": "s"}]}),
            json!({"volumes": [{"name": "v", "projected": {"sources": [{"secret": {"name": "s"}}]}}]}),
        ] {
            let e = admit_mirror_pod(&mirror(spec.clone())).unwrap_err();
            assert!(e.message.ends_with("a mirror pod may not reference secrets"), "{spec}");
        }
        let e = admit_mirror_pod(&mirror(
            json!({"volumes": [{"name": "v", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}]}),
        ))
        .unwrap_err();
        assert!(
            e.message
                .ends_with("a mirror pod may not use ServiceAccountToken volume projections")
        );
        // A pod that is no mirror is not this rule's.
        let mut plain = mirror(json!({"serviceAccountName": "default"}));
        plain["metadata"]["annotations"] = json!({});
        assert!(admit_mirror_pod(&plain).is_ok());
    }
}
