//! Dynamic access to every served resource, from the shared registry.

use kube::api::{Api, ApiResource, DynamicObject};
use skiff_api::Resource;

/// kube's description of a registry resource.
pub fn api_resource(r: &Resource) -> ApiResource {
    ApiResource {
        group: r.group.to_string(),
        version: r.version.to_string(),
        api_version: r.api_version(),
        kind: r.kind.to_string(),
        plural: r.plural.to_string(),
    }
}

/// Resources holding objects that can own or be owned (skips the create-only ones, bindings
/// and the access and token reviews, which cannot be listed, the resource usage views, and the
/// events.k8s.io view of events, and the versions served through another one's storage, such
/// as autoscaling/v1 HorizontalPodAutoscalers). Custom resources served now are included.
pub fn stored_resources() -> impl Iterator<Item = &'static Resource> {
    skiff_api::registry::all().into_iter().filter(|r| {
        !r.is_create_only() && !r.is_computed() && r.group != "events.k8s.io" && !skiff_api::conversion::is_converted(r)
    })
}

/// An API handle for a resource, in one namespace or across all.
pub fn api(client: &kube::Client, r: &Resource, namespace: Option<&str>) -> Api<DynamicObject> {
    let ar = api_resource(r);
    match namespace {
        Some(ns) if r.namespaced => Api::namespaced_with(client.clone(), ns, &ar),
        _ => Api::all_with(client.clone(), &ar),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_resources_leave_out_what_cannot_be_listed() {
        let plurals: Vec<&str> = stored_resources().map(|r| r.plural).collect();
        let hpas: Vec<&str> = stored_resources()
            .filter(|r| r.plural == "horizontalpodautoscalers")
            .map(|r| r.version)
            .collect();
        assert_eq!(hpas, ["v2"], "one stored version");
        for gone in [
            "bindings",
            "subjectaccessreviews",
            "localsubjectaccessreviews",
            "selfsubjectaccessreviews",
            "selfsubjectrulesreviews",
            "tokenreviews",
            "selfsubjectreviews",
        ] {
            assert!(!plurals.contains(&gone), "{gone}");
        }
        for kept in ["pods", "roles", "rolebindings", "clusterroles", "clusterrolebindings"] {
            assert!(plurals.contains(&kept), "{kept}");
        }
        assert!(stored_resources().all(|r| r.group != "events.k8s.io"));
    }
}
