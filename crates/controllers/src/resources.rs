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

/// Resources holding objects that can own or be owned (skips virtual ones like bindings and
/// the events.k8s.io view of events).
pub fn stored_resources() -> impl Iterator<Item = &'static Resource> {
    skiff_api::registry::RESOURCES
        .iter()
        .filter(|r| r.plural != "bindings" && r.group != "events.k8s.io")
}

/// An API handle for a resource, in one namespace or across all.
pub fn api(client: &kube::Client, r: &Resource, namespace: Option<&str>) -> Api<DynamicObject> {
    let ar = api_resource(r);
    match namespace {
        Some(ns) if r.namespaced => Api::namespaced_with(client.clone(), ns, &ar),
        _ => Api::all_with(client.clone(), &ar),
    }
}
