//! OpenAPI v3 schemas of every served kind, generated from the project's own types
//! (`k8s-openapi`'s schemars implementations), with upstream's list metadata
//! (`x-kubernetes-patch-strategy`, `x-kubernetes-patch-merge-key`, `x-kubernetes-list-type`,
//! `x-kubernetes-list-map-keys`) added from [`crate::patch::meta`]. Strategic merge patch
//! and server-side apply navigate these schemas; the API server publishes them.

use std::sync::OnceLock;

use k8s_openapi::api;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as metav1;
use serde_json::{Map, Value};

/// Prefix of every `$ref`.
pub const REF_PREFIX: &str = "#/components/schemas/";

struct Schemas {
    definitions: Map<String, Value>,
    /// (group, version, kind) -> definition name
    roots: Vec<(&'static str, &'static str, &'static str, String)>,
}

macro_rules! roots {
    ($gen:expr, $roots:expr, $( ($group:expr, $version:expr, $kind:expr, $ty:ty) ),* $(,)?) => {
        $(
            let _ = $gen.subschema_for::<$ty>();
            $roots.push(($group, $version, $kind, <$ty as schemars::JsonSchema>::schema_name().into_owned()));
        )*
    };
}

fn build() -> Schemas {
    let mut settings = schemars::generate::SchemaSettings::openapi3();
    settings.definitions_path = REF_PREFIX.into();
    let mut generator = settings.into_generator();
    let mut roots = Vec::new();
    roots!(
        generator,
        roots,
        ("", "v1", "Namespace", api::core::v1::Namespace),
        ("", "v1", "Node", api::core::v1::Node),
        ("", "v1", "Pod", api::core::v1::Pod),
        ("", "v1", "Binding", api::core::v1::Binding),
        ("", "v1", "ComponentStatus", api::core::v1::ComponentStatus),
        ("", "v1", "Event", api::core::v1::Event),
        ("", "v1", "Secret", api::core::v1::Secret),
        ("", "v1", "ConfigMap", api::core::v1::ConfigMap),
        ("", "v1", "PodTemplate", api::core::v1::PodTemplate),
        ("", "v1", "ReplicationController", api::core::v1::ReplicationController),
        ("", "v1", "ResourceQuota", api::core::v1::ResourceQuota),
        ("", "v1", "LimitRange", api::core::v1::LimitRange),
        ("", "v1", "Service", api::core::v1::Service),
        ("", "v1", "Endpoints", api::core::v1::Endpoints),
        ("", "v1", "ServiceAccount", api::core::v1::ServiceAccount),
        ("", "v1", "PersistentVolume", api::core::v1::PersistentVolume),
        ("", "v1", "PersistentVolumeClaim", api::core::v1::PersistentVolumeClaim),
        ("apps", "v1", "Deployment", api::apps::v1::Deployment),
        ("apps", "v1", "ReplicaSet", api::apps::v1::ReplicaSet),
        ("apps", "v1", "StatefulSet", api::apps::v1::StatefulSet),
        ("apps", "v1", "DaemonSet", api::apps::v1::DaemonSet),
        ("apps", "v1", "ControllerRevision", api::apps::v1::ControllerRevision),
        ("batch", "v1", "Job", api::batch::v1::Job),
        ("batch", "v1", "CronJob", api::batch::v1::CronJob),
        ("coordination.k8s.io", "v1", "Lease", api::coordination::v1::Lease),
        (
            "apiextensions.k8s.io",
            "v1",
            "CustomResourceDefinition",
            k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition
        ),
        (
            "certificates.k8s.io",
            "v1",
            "CertificateSigningRequest",
            api::certificates::v1::CertificateSigningRequest
        ),
        ("events.k8s.io", "v1", "Event", api::events::v1::Event),
        (
            "policy",
            "v1",
            "PodDisruptionBudget",
            api::policy::v1::PodDisruptionBudget
        ),
        ("policy", "v1", "Eviction", api::policy::v1::Eviction),
        ("storage.k8s.io", "v1", "CSINode", api::storage::v1::CSINode),
        ("storage.k8s.io", "v1", "StorageClass", api::storage::v1::StorageClass),
        ("storage.k8s.io", "v1", "CSIDriver", api::storage::v1::CSIDriver),
        (
            "storage.k8s.io",
            "v1",
            "CSIStorageCapacity",
            api::storage::v1::CSIStorageCapacity
        ),
        (
            "storage.k8s.io",
            "v1",
            "VolumeAttachment",
            api::storage::v1::VolumeAttachment
        ),
        (
            "discovery.k8s.io",
            "v1",
            "EndpointSlice",
            api::discovery::v1::EndpointSlice
        ),
        ("networking.k8s.io", "v1", "IPAddress", api::networking::v1::IPAddress),
        ("networking.k8s.io", "v1", "Ingress", api::networking::v1::Ingress),
        ("node.k8s.io", "v1", "RuntimeClass", api::node::v1::RuntimeClass),
        (
            "apiregistration.k8s.io",
            "v1",
            "APIService",
            k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService
        ),
        (
            "flowcontrol.apiserver.k8s.io",
            "v1",
            "FlowSchema",
            api::flowcontrol::v1::FlowSchema
        ),
        (
            "flowcontrol.apiserver.k8s.io",
            "v1",
            "PriorityLevelConfiguration",
            api::flowcontrol::v1::PriorityLevelConfiguration
        ),
        (
            "networking.k8s.io",
            "v1",
            "IngressClass",
            api::networking::v1::IngressClass
        ),
        (
            "networking.k8s.io",
            "v1",
            "NetworkPolicy",
            api::networking::v1::NetworkPolicy
        ),
        (
            "networking.k8s.io",
            "v1",
            "ServiceCIDR",
            api::networking::v1::ServiceCIDR
        ),
        (
            "admissionregistration.k8s.io",
            "v1",
            "MutatingWebhookConfiguration",
            api::admissionregistration::v1::MutatingWebhookConfiguration
        ),
        (
            "admissionregistration.k8s.io",
            "v1",
            "ValidatingWebhookConfiguration",
            api::admissionregistration::v1::ValidatingWebhookConfiguration
        ),
        (
            "admissionregistration.k8s.io",
            "v1",
            "ValidatingAdmissionPolicy",
            api::admissionregistration::v1::ValidatingAdmissionPolicy
        ),
        (
            "admissionregistration.k8s.io",
            "v1",
            "ValidatingAdmissionPolicyBinding",
            api::admissionregistration::v1::ValidatingAdmissionPolicyBinding
        ),
        (
            "scheduling.k8s.io",
            "v1",
            "PriorityClass",
            api::scheduling::v1::PriorityClass
        ),
        ("rbac.authorization.k8s.io", "v1", "Role", api::rbac::v1::Role),
        (
            "rbac.authorization.k8s.io",
            "v1",
            "RoleBinding",
            api::rbac::v1::RoleBinding
        ),
        (
            "rbac.authorization.k8s.io",
            "v1",
            "ClusterRole",
            api::rbac::v1::ClusterRole
        ),
        (
            "rbac.authorization.k8s.io",
            "v1",
            "ClusterRoleBinding",
            api::rbac::v1::ClusterRoleBinding
        ),
        (
            "authorization.k8s.io",
            "v1",
            "SubjectAccessReview",
            api::authorization::v1::SubjectAccessReview
        ),
        (
            "authorization.k8s.io",
            "v1",
            "SelfSubjectAccessReview",
            api::authorization::v1::SelfSubjectAccessReview
        ),
        (
            "authorization.k8s.io",
            "v1",
            "SelfSubjectRulesReview",
            api::authorization::v1::SelfSubjectRulesReview
        ),
        (
            "authorization.k8s.io",
            "v1",
            "LocalSubjectAccessReview",
            api::authorization::v1::LocalSubjectAccessReview
        ),
        (
            "authentication.k8s.io",
            "v1",
            "TokenReview",
            api::authentication::v1::TokenReview
        ),
        (
            "authentication.k8s.io",
            "v1",
            "SelfSubjectReview",
            api::authentication::v1::SelfSubjectReview
        ),
        ("autoscaling", "v1", "Scale", api::autoscaling::v1::Scale),
        (
            "autoscaling",
            "v1",
            "HorizontalPodAutoscaler",
            api::autoscaling::v1::HorizontalPodAutoscaler
        ),
        (
            "autoscaling",
            "v2",
            "HorizontalPodAutoscaler",
            api::autoscaling::v2::HorizontalPodAutoscaler
        ),
        (
            "authentication.k8s.io",
            "v1",
            "TokenRequest",
            api::authentication::v1::TokenRequest
        ),
        (
            "metrics.k8s.io",
            "v1beta1",
            "NodeMetrics",
            crate::resourcemetrics::NodeMetrics
        ),
        (
            "metrics.k8s.io",
            "v1beta1",
            "PodMetrics",
            crate::resourcemetrics::PodMetrics
        ),
        ("meta.k8s.io", "v1", "Status", metav1::Status),
        ("meta.k8s.io", "v1", "DeleteOptions", metav1::DeleteOptions),
    );
    let mut definitions: Map<String, Value> = generator.take_definitions(true).into_iter().collect();
    add_list_metadata(&mut definitions);
    any_json_values(&mut definitions);
    Schemas { definitions, roots }
}

/// The apiextensions types that hold any JSON value (`JSON`: defaults, enums, examples) or
/// one of two shapes (`JSONSchemaPropsOrArray`, `...OrBool`, `...OrStringArray`) are any
/// value in upstream's OpenAPI, not the Rust wrappers' shapes.
fn any_json_values(defs: &mut Map<String, Value>) {
    const PREFIX: &str = "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.v1.";
    for (name, def) in defs.iter_mut() {
        let Some(short) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let description = match short {
            "JSON" => {
                "JSON represents any valid JSON value. These types are supported: bool, int64, float64, string, []interface{}, map[string]interface{} and nil."
            }
            "JSONSchemaPropsOrArray" => {
                "JSONSchemaPropsOrArray represents a value that can either be a JSONSchemaProps or an array of JSONSchemaProps. Mainly here for serialization purposes."
            }
            "JSONSchemaPropsOrBool" => {
                "JSONSchemaPropsOrBool represents JSONSchemaProps or a boolean value. Defaults to true for the boolean property."
            }
            "JSONSchemaPropsOrStringArray" => {
                "JSONSchemaPropsOrStringArray represents a JSONSchemaProps or a string array."
            }
            _ => continue,
        };
        *def = serde_json::json!({"description": description, "x-kubernetes-preserve-unknown-fields": true});
    }
}

/// Add upstream's list extensions to the properties the patch metadata names.
fn add_list_metadata(defs: &mut Map<String, Value>) {
    for (name, def) in defs.iter_mut() {
        let Some(props) = def.get_mut("properties").and_then(Value::as_object_mut) else {
            continue;
        };
        for (prop, schema) in props.iter_mut() {
            let Some(meta) = crate::patch::meta::list_meta(name, prop) else {
                continue;
            };
            let Some(obj) = schema.as_object_mut() else { continue };
            if let Some(s) = meta.patch_strategy {
                obj.insert("x-kubernetes-patch-strategy".into(), Value::String(s.to_string()));
            }
            if let Some(k) = meta.patch_merge_key {
                obj.insert("x-kubernetes-patch-merge-key".into(), Value::String(k.to_string()));
            }
            if let Some(t) = meta.list_type {
                obj.insert("x-kubernetes-list-type".into(), Value::String(t.to_string()));
            }
            if !meta.list_map_keys.is_empty() {
                obj.insert(
                    "x-kubernetes-list-map-keys".into(),
                    Value::Array(
                        meta.list_map_keys
                            .iter()
                            .map(|k| Value::String(k.to_string()))
                            .collect(),
                    ),
                );
            }
        }
    }
}

fn schemas() -> &'static Schemas {
    static S: OnceLock<Schemas> = OnceLock::new();
    S.get_or_init(build)
}

/// Every definition, keyed by its name ("io.k8s.api.core.v1.PodSpec").
pub fn definitions() -> &'static Map<String, Value> {
    &schemas().definitions
}

/// Custom resources' schemas by definition name (`com.example.v1.Widget`), for strategic
/// merge and server-side apply. Each distinct schema is made `'static` once.
static CUSTOM: std::sync::Mutex<Vec<(&'static str, &'static Value)>> = std::sync::Mutex::new(Vec::new());

/// Register (or replace) the schema of a custom kind under `name`; returns the name.
pub fn register_custom(name: &str, schema: Value) -> &'static str {
    let name = crate::registry::intern(name);
    let mut custom = match CUSTOM.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    };
    if let Some(entry) = custom.iter_mut().find(|(n, _)| *n == name) {
        if *entry.1 != schema {
            entry.1 = Box::leak(Box::new(schema));
        }
    } else {
        custom.push((name, Box::leak(Box::new(schema))));
    }
    name
}

/// A definition by name: a built-in one, else a registered custom one.
pub fn lookup_definition(name: &str) -> Option<(&'static str, &'static Value)> {
    if let Some((n, d)) = definitions().get_key_value(name) {
        return Some((n.as_str(), d));
    }
    let custom = match CUSTOM.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    };
    custom.iter().find(|(n, _)| *n == name).map(|(n, d)| (*n, *d))
}

/// The definition name of a kind's root type.
pub fn definition_for(group: &str, version: &str, kind: &str) -> Option<&'static str> {
    schemas()
        .roots
        .iter()
        .find(|(g, v, k, _)| *g == group && *v == version && *k == kind)
        .map(|(_, _, _, name)| name.as_str())
}

/// The definition a schema refers to (follows `$ref`, also inside `allOf`).
pub fn resolve(schema: &Value) -> Option<(&'static str, &'static Value)> {
    let r = schema.get("$ref").and_then(Value::as_str).or_else(|| {
        schema
            .get("allOf")
            .and_then(Value::as_array)
            .and_then(|a| a.first())
            .and_then(|s| s.get("$ref"))
            .and_then(Value::as_str)
    })?;
    let name = r.strip_prefix(REF_PREFIX)?;
    definitions().get_key_value(name).map(|(k, v)| (k.as_str(), v))
}

/// The schema of property `prop` of definition `def`.
pub fn property(def: &str, prop: &str) -> Option<&'static Value> {
    definitions().get(def)?.get("properties")?.get(prop)
}

/// Fields of `obj` that definition `def` does not declare, as paths like
/// `spec.containers[0].foo` (what strict field validation reports).
pub fn unknown_fields(def: &str, obj: &Value) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(schema) = definitions().get(def) {
        walk(schema, obj, &mut String::new(), &mut out);
    }
    out
}

/// `path` is the holder's path; each level appends to it and truncates back, so a known field
/// costs no allocation.
fn walk(schema: &Value, v: &Value, path: &mut String, out: &mut Vec<String>) {
    let schema = match resolve(schema) {
        Some((_, s)) => s,
        None => schema,
    };
    let len = path.len();
    match v {
        Value::Object(m) => {
            let props = schema.get("properties").and_then(Value::as_object);
            let extra = schema.get("additionalProperties").filter(|a| a.is_object());
            if props.is_none() && extra.is_none() {
                return;
            }
            for (k, child) in m {
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(k);
                match props {
                    Some(props) => match props.get(k) {
                        Some(s) => walk(s, child, path, out),
                        None => out.push(path.clone()),
                    },
                    None => {
                        if let Some(ap) = extra {
                            walk(ap, child, path, out);
                        }
                    }
                }
                path.truncate(len);
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (i, child) in items.iter().enumerate() {
                    use std::fmt::Write;
                    let _ = write!(path, "[{i}]");
                    walk(item_schema, child, path, out);
                    path.truncate(len);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_fields_are_found() {
        let pod = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "a", "labels": {"x": "y"}},
            "spec": {"foo": 1, "containers": [{"name": "c", "image": "i", "bar": true}]}
        });
        let def = definition_for("", "v1", "Pod").expect("pod");
        assert_eq!(unknown_fields(def, &pod), vec!["spec.foo", "spec.containers[0].bar"]);
    }

    #[test]
    fn rbac_and_review_kinds_have_schemas() {
        for (group, kind, def) in [
            ("rbac.authorization.k8s.io", "Role", "io.k8s.api.rbac.v1.Role"),
            (
                "rbac.authorization.k8s.io",
                "RoleBinding",
                "io.k8s.api.rbac.v1.RoleBinding",
            ),
            (
                "rbac.authorization.k8s.io",
                "ClusterRole",
                "io.k8s.api.rbac.v1.ClusterRole",
            ),
            (
                "rbac.authorization.k8s.io",
                "ClusterRoleBinding",
                "io.k8s.api.rbac.v1.ClusterRoleBinding",
            ),
            (
                "authorization.k8s.io",
                "SubjectAccessReview",
                "io.k8s.api.authorization.v1.SubjectAccessReview",
            ),
            (
                "authorization.k8s.io",
                "SelfSubjectAccessReview",
                "io.k8s.api.authorization.v1.SelfSubjectAccessReview",
            ),
            (
                "authorization.k8s.io",
                "SelfSubjectRulesReview",
                "io.k8s.api.authorization.v1.SelfSubjectRulesReview",
            ),
            (
                "authorization.k8s.io",
                "LocalSubjectAccessReview",
                "io.k8s.api.authorization.v1.LocalSubjectAccessReview",
            ),
            (
                "authentication.k8s.io",
                "TokenReview",
                "io.k8s.api.authentication.v1.TokenReview",
            ),
            (
                "authentication.k8s.io",
                "SelfSubjectReview",
                "io.k8s.api.authentication.v1.SelfSubjectReview",
            ),
        ] {
            assert_eq!(definition_for(group, "v1", kind), Some(def));
        }
        // Strict field validation reaches into subjects, the role reference and rules.
        let binding = serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "b", "namespace": "d"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "r", "x": 1},
            "subjects": [{"kind": "User", "name": "u", "uid": "1"}]
        });
        assert_eq!(
            unknown_fields("io.k8s.api.rbac.v1.RoleBinding", &binding),
            vec!["roleRef.x", "subjects[0].uid"]
        );
        let role = serde_json::json!({"rules": [{"verbs": ["get"], "resource": ["pods"]}]});
        assert_eq!(
            unknown_fields("io.k8s.api.rbac.v1.Role", &role),
            vec!["rules[0].resource"]
        );
        let sar = serde_json::json!({"spec": {"user": "u", "resourceAttributes": {"verb": "get", "nope": 1}}});
        assert_eq!(
            unknown_fields("io.k8s.api.authorization.v1.SubjectAccessReview", &sar),
            vec!["spec.resourceAttributes.nope"]
        );
    }

    #[test]
    fn pod_spec_is_reachable() {
        let pod = definition_for("", "v1", "Pod").expect("pod root");
        assert_eq!(pod, "io.k8s.api.core.v1.Pod");
        let spec = property(pod, "spec").expect("spec");
        let (name, _) = resolve(spec).expect("spec ref");
        assert_eq!(name, "io.k8s.api.core.v1.PodSpec");
        assert!(property(name, "containers").is_some());
    }
}
