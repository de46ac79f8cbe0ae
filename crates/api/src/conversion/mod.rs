//! Conversion between the served versions of a built-in kind stored in one version (upstream
//! converts through the internal version; here the stored version is the hub): autoscaling/v1
//! HorizontalPodAutoscalers, and the removed workload versions (`removed`). A resource
//! listed in [`storage_resource`] is served by the API server as its storage resource, the
//! request's objects converted on the way in and the answer's on the way out.

pub mod autoscaling;
pub mod removed;

use serde_json::Value;

use crate::registry::{self, Resource};

/// The resource a served version is stored as, when it is another version of the same kind.
pub fn storage_resource(res: &Resource) -> Option<&'static Resource> {
    match (res.group, res.version, res.plural) {
        ("autoscaling", "v1", "horizontalpodautoscalers") => {
            registry::lookup("autoscaling", "v2", "horizontalpodautoscalers")
        }
        _ if registry::is_removed(res) => {
            let (group, version) = removed::replacement(res)?;
            registry::lookup(group, version, res.plural)
        }
        _ => None,
    }
}

/// Whether `res` is a version served through another one's storage (it holds no objects of
/// its own: listing every stored resource skips it).
pub fn is_converted(res: &Resource) -> bool {
    storage_resource(res).is_some()
}

/// An object of `res` (a served version that [`storage_resource`] names) in its storage version.
pub fn to_storage(res: &Resource, obj: &Value) -> Value {
    match (res.group, res.version, res.kind) {
        ("autoscaling", "v1", "HorizontalPodAutoscaler") => autoscaling::hpa_to_v2(obj),
        _ if registry::is_removed(res) => removed::to_storage(res, obj),
        _ => obj.clone(),
    }
}

/// A stored object as `res` serves it. Objects of other kinds (a Status, a Table) are
/// returned as they are.
pub fn from_storage(res: &Resource, obj: &Value) -> Value {
    if obj.get("kind").and_then(Value::as_str) != Some(res.kind) {
        return obj.clone();
    }
    match (res.group, res.version, res.kind) {
        ("autoscaling", "v1", "HorizontalPodAutoscaler") => autoscaling::hpa_to_v1(obj),
        _ if registry::is_removed(res) => removed::from_storage(res, obj),
        _ => obj.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_other_versions_are_converted() {
        let v1 = registry::lookup("autoscaling", "v1", "horizontalpodautoscalers").expect("served");
        let v2 = registry::lookup("autoscaling", "v2", "horizontalpodautoscalers").expect("served");
        assert_eq!(storage_resource(v1).map(|r| r.version), Some("v2"));
        assert!(storage_resource(v2).is_none());
        assert!(is_converted(v1) && !is_converted(v2));
        let status = serde_json::json!({"kind": "Status", "code": 404});
        assert_eq!(from_storage(v1, &status), status);
    }
}
