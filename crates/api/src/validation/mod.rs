//! Validation of objects on create and update, as upstream's `pkg/apis/*/validation` for the
//! rules users hit, with upstream's field paths and messages.
//!
//! Objects are JSON as stored; validation runs after defaulting and never panics on any input.
//!
//! Code map:
//! - `meta`: names (DNS-1123 subdomain/label, DNS-1035), qualified names, label values,
//!   labels, annotations, finalizers, label selectors, `metadata` on create and update.
//! - `pod`: pod specs (containers, init containers, resources, ports, env, probes,
//!   lifecycle, volumes and mounts, node selector, affinity, topology spread, tolerations)
//!   and the pod update rules.
//! - `workloads`: Deployment, ReplicaSet, DaemonSet, StatefulSet, Job, CronJob (with the
//!   cron schedule parser), PodDisruptionBudget.
//! - `core`: Service, Node taints, Secret, ConfigMap, PersistentVolumeClaim, PriorityClass.
//! - `storage`: StorageClass, CSINode.
//! - `admissionregistration`: Validating and MutatingWebhookConfigurations.
//! - `apiregistration`: APIService (and its status).
//! - `flowcontrol`: FlowSchema, PriorityLevelConfiguration (mandatory ones keep their spec).
//! - `networking`: Ingress (and its status), IngressClass, NetworkPolicy.
//! - `node`: RuntimeClass.
//! - `csi`: CSIDriver, VolumeAttachment, CSIStorageCapacity.
//! - `certificates`: CertificateSigningRequest (create, update, status and approval).
//! - `rbac`: Role, ClusterRole, RoleBinding, ClusterRoleBinding (their metadata included, as
//!   upstream's strategies validate it in their own order on update).
//!
//! Values inside messages are rendered as upstream's `field.Error` renders them, including
//! Go's `%#v` of structs where upstream passes a struct (selectors, strategies, taints).

pub mod admissionregistration;
mod apiregistration;
mod autoscaling;
mod certificates;
mod core;
mod csi;
mod flowcontrol;
mod meta;
mod networking;
mod node;
mod pod;
mod rbac;
mod storage;
mod workloads;

use std::collections::HashSet;

use serde_json::Value;

use crate::quantity::Quantity;
use crate::registry::Resource;
use crate::status::{FieldError, FieldErrorKind};

pub use certificates::CsrWrite;
pub use meta::{
    is_dns1035_label, is_dns1123_label, is_dns1123_subdomain, is_qualified_name, is_valid_label_value,
    validate_label_selector, validate_labels,
};
pub use workloads::{parse_go_duration, validate_cron_schedule};

/// Every problem with `obj` (and, on update, with the change from `old`), in upstream's order
/// as far as it is deterministic. Empty means valid.
pub fn validate(res: &Resource, obj: &Value, old: Option<&Value>) -> Vec<FieldError> {
    validate_write(res, "", obj, old)
}

/// As [`validate`], for a write through `subresource` ("" for the main resource): the
/// CertificateSigningRequest rules differ between the main resource, `status` and `approval`.
pub fn validate_write(res: &Resource, subresource: &str, obj: &Value, old: Option<&Value>) -> Vec<FieldError> {
    // Upstream defaults the stored object as it decodes it, so an object stored before a
    // default existed compares equal to its defaulted successor.
    let old_defaulted = old.map(|o| {
        let mut o = o.clone();
        crate::defaults::apply_defaults(res, &mut o);
        o
    });
    let old = old_defaulted.as_ref();
    let mut errs = Vec::new();
    if res.group == "rbac.authorization.k8s.io" {
        rbac::validate(res.kind, res.namespaced, obj, old, &mut errs);
        return errs;
    }
    let name_fn = name_validator(res);
    meta::validate_object_meta(obj.get("metadata"), res.namespaced, name_fn, &mut errs);
    if (res.group, res.kind) == ("apiregistration.k8s.io", "APIService") {
        // The name rule needs the spec: its errors go where the name's would.
        let at = errs
            .iter()
            .position(|e| !matches!(e.field.as_str(), "metadata.name" | "metadata.generateName"))
            .unwrap_or(errs.len());
        let mut name_errs = Vec::new();
        apiregistration::validate_name(obj, &mut name_errs);
        errs.splice(at..at, name_errs);
    }
    if let Some(old) = old {
        meta::validate_object_meta_update(obj.get("metadata"), old.get("metadata"), &mut errs);
    }
    match (res.group, res.kind) {
        ("", "Pod") => match (subresource, old) {
            ("ephemeralcontainers", Some(old)) => pod::validate_pod_ephemeral_containers_update(obj, old, &mut errs),
            _ => pod::validate_pod(obj, old, &mut errs),
        },
        ("", "Service") => core::validate_service(obj, old, &mut errs),
        ("", "Node") => core::validate_node(obj, old, &mut errs),
        ("", "Secret") => core::validate_secret(obj, old, &mut errs),
        ("", "ConfigMap") => core::validate_configmap(obj, old, &mut errs),
        // upstream's `ValidatePodTemplate`: the object's metadata (above), then its template.
        ("", "PodTemplate") => {
            pod::validate_pod_template(field(Some(obj), "template"), &Path::new("template"), &mut errs)
        }
        ("", "PersistentVolumeClaim") => core::validate_pvc(obj, old, &mut errs),
        ("", "ResourceQuota") => core::validate_resource_quota(obj, old, &mut errs),
        ("", "LimitRange") => core::validate_limit_range(obj, &mut errs),
        ("scheduling.k8s.io", "PriorityClass") => core::validate_priority_class(obj, old, &mut errs),
        ("networking.k8s.io", "Ingress") => networking::validate_ingress(obj, old, subresource, &mut errs),
        ("networking.k8s.io", "IngressClass") => networking::validate_ingress_class(obj, old, &mut errs),
        ("networking.k8s.io", "NetworkPolicy") => networking::validate_network_policy(obj, old, &mut errs),
        ("node.k8s.io", "RuntimeClass") => node::validate_runtime_class(obj, old, &mut errs),
        ("storage.k8s.io", "CSIDriver") => csi::validate_csi_driver(obj, old, &mut errs),
        ("storage.k8s.io", "VolumeAttachment") => csi::validate_volume_attachment(obj, old, &mut errs),
        ("storage.k8s.io", "CSIStorageCapacity") => csi::validate_csi_storage_capacity(obj, old, &mut errs),
        ("storage.k8s.io", "StorageClass") => storage::validate_storage_class(obj, old, &mut errs),
        ("storage.k8s.io", "CSINode") => storage::validate_csinode(obj, old, &mut errs),
        ("certificates.k8s.io", "CertificateSigningRequest") => {
            let write = match subresource {
                "status" => CsrWrite::Status,
                "approval" => CsrWrite::Approval,
                _ => CsrWrite::Main,
            };
            certificates::validate_csr(obj, old, write, &mut errs)
        }
        ("apps", "Deployment") => workloads::validate_deployment(obj, old, &mut errs),
        ("apps", "ReplicaSet") => workloads::validate_replicaset(obj, old, &mut errs),
        ("", "ReplicationController") => workloads::validate_replication_controller(obj, subresource, &mut errs),
        ("apps", "DaemonSet") => workloads::validate_daemonset(obj, old, &mut errs),
        ("apps", "StatefulSet") => workloads::validate_statefulset(obj, old, &mut errs),
        ("batch", "Job") => workloads::validate_job(obj, old, &mut errs),
        ("batch", "CronJob") => workloads::validate_cronjob(obj, &mut errs),
        ("policy", "PodDisruptionBudget") => workloads::validate_pdb(obj, &mut errs),
        ("autoscaling", "HorizontalPodAutoscaler") => autoscaling::validate_horizontal_pod_autoscaler(obj, &mut errs),
        ("apiregistration.k8s.io", "APIService") => match subresource {
            "status" => apiregistration::validate_api_service_status(obj, &mut errs),
            _ => apiregistration::validate_api_service(obj, &mut errs),
        },
        ("flowcontrol.apiserver.k8s.io", "FlowSchema") => match subresource {
            "status" => flowcontrol::validate_conditions(obj, &mut errs),
            _ => flowcontrol::validate_flow_schema(obj, &mut errs),
        },
        ("flowcontrol.apiserver.k8s.io", "PriorityLevelConfiguration") => match subresource {
            "status" => flowcontrol::validate_conditions(obj, &mut errs),
            _ => flowcontrol::validate_priority_level(obj, &mut errs),
        },
        ("admissionregistration.k8s.io", "ValidatingWebhookConfiguration") => {
            admissionregistration::validate_webhook_configuration(obj, false, &mut errs)
        }
        ("admissionregistration.k8s.io", "MutatingWebhookConfiguration") => {
            admissionregistration::validate_webhook_configuration(obj, true, &mut errs)
        }
        ("admissionregistration.k8s.io", "ValidatingAdmissionPolicy") if subresource.is_empty() => {
            admissionregistration::validate_admission_policy(obj, &mut errs)
        }
        ("admissionregistration.k8s.io", "ValidatingAdmissionPolicyBinding") => {
            admissionregistration::validate_admission_policy_binding(obj, &mut errs)
        }
        _ => {}
    }
    errs
}

/// Which name rule a kind's `metadata.name` follows (upstream's `ValidateXxxName`).
fn name_validator(res: &Resource) -> fn(&str, bool) -> Vec<String> {
    match (res.group, res.kind) {
        ("", "Namespace") => meta::name_is_dns_label,
        ("", "Service") => meta::name_is_dns1035_label,
        ("apps", "StatefulSet") => meta::name_is_dns_label,
        ("certificates.k8s.io", "CertificateSigningRequest") => name_is_path_segment,
        // Checked with the spec in `apiregistration::validate_name`.
        ("apiregistration.k8s.io", "APIService") => |_, _| Vec::new(),
        _ => meta::name_is_dns_subdomain,
    }
}

/// upstream's `ValidateCertificateRequestName` ("We don't care what you call your certificate
/// requests") leaves only the REST layer's `IsValidPathSegmentName`.
fn name_is_path_segment(name: &str, _prefix: bool) -> Vec<String> {
    if name == "." || name == ".." {
        return vec![format!("may not be '{name}'")];
    }
    ["/", "%"]
        .iter()
        .filter(|bad| name.contains(**bad))
        .map(|bad| format!("may not contain '{bad}'"))
        .collect()
}

// ---- field paths ----------------------------------------------------------------------------

/// A field path printed as upstream's `field.Path` (`spec.containers[0].resources.requests[cpu]`).
#[derive(Clone, Debug)]
pub struct Path(String);

impl Path {
    pub fn new(root: &str) -> Path {
        Path(root.to_string())
    }
    // Every field a validation walks gets its path, so these build the string directly rather
    // than through `format!`.
    pub fn child(&self, name: &str) -> Path {
        if self.0.is_empty() {
            Path(name.to_string())
        } else {
            Path(self.joined(".", name, ""))
        }
    }
    pub fn index(&self, i: usize) -> Path {
        use std::fmt::Write;
        let mut s = String::with_capacity(self.0.len() + 4);
        s.push_str(&self.0);
        // Writing to a String cannot fail.
        let _ = write!(s, "[{i}]");
        Path(s)
    }
    pub fn key(&self, k: &str) -> Path {
        Path(self.joined("[", k, "]"))
    }
    fn joined(&self, open: &str, part: &str, close: &str) -> String {
        let mut s = String::with_capacity(self.0.len() + open.len() + part.len() + close.len());
        s.push_str(&self.0);
        s.push_str(open);
        s.push_str(part);
        s.push_str(close);
        s
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Path {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

// ---- error constructors on paths --------------------------------------------------------------

pub(crate) fn required(p: &Path, detail: &str) -> FieldError {
    FieldError::required(p.as_str(), detail)
}

pub(crate) fn invalid(p: &Path, v: &Value, detail: &str) -> FieldError {
    FieldError::invalid(p.as_str(), v, detail)
}

/// An invalid value already rendered the way upstream renders it (Go's `%#v` of a struct).
pub(crate) fn invalid_raw(p: &Path, rendered: String, detail: &str) -> FieldError {
    FieldError {
        kind: FieldErrorKind::Invalid(rendered),
        field: p.as_str().to_string(),
        detail: detail.to_string(),
    }
}

pub(crate) fn invalid_str(p: &Path, v: &str, detail: &str) -> FieldError {
    FieldError::invalid(p.as_str(), &Value::String(v.to_string()), detail)
}

pub(crate) fn not_supported(p: &Path, v: &Value, supported: &[&str]) -> FieldError {
    FieldError::not_supported(p.as_str(), v, supported)
}

pub(crate) fn forbidden(p: &Path, detail: &str) -> FieldError {
    FieldError::forbidden(p.as_str(), detail)
}

pub(crate) fn duplicate(p: &Path, v: &Value) -> FieldError {
    FieldError::duplicate(p.as_str(), v)
}

// ---- reading JSON -----------------------------------------------------------------------------

/// A string field; empty when missing or not a string.
pub(crate) fn str_at<'a>(v: Option<&'a Value>, key: &str) -> &'a str {
    v.and_then(|v| v.get(key)).and_then(Value::as_str).unwrap_or("")
}

/// An array field; empty when missing or not an array.
pub(crate) fn arr_at<'a>(v: Option<&'a Value>, key: &str) -> &'a [Value] {
    v.and_then(|v| v.get(key))
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

/// A field that is present and not null.
pub(crate) fn field<'a>(v: Option<&'a Value>, key: &str) -> Option<&'a Value> {
    v.and_then(|v| v.get(key)).filter(|x| !x.is_null())
}

pub(crate) fn int_at(v: Option<&Value>, key: &str) -> Option<i64> {
    field(v, key).and_then(Value::as_i64)
}

/// upstream's `ValidateNonnegativeField`.
pub(crate) fn nonnegative(v: Option<&Value>, key: &str, p: &Path, errs: &mut Vec<FieldError>) {
    if let Some(x) = field(v, key)
        && x.as_f64().is_some_and(|n| n < 0.0)
    {
        errs.push(invalid(&p.child(key), x, "must be greater than or equal to 0"));
    }
}

/// Go's `%#v` of a `map[string]string`, keys sorted.
pub(crate) fn go_string_map(v: Option<&Value>) -> String {
    match v.and_then(Value::as_object) {
        None => "map[string]string(nil)".to_string(),
        Some(m) => {
            let mut pairs: Vec<(&String, &Value)> = m.iter().collect();
            pairs.sort_by(|a, b| a.0.cmp(b.0));
            let body = pairs
                .iter()
                .map(|(k, v)| format!("{:?}:{}", k, go_quote(v)))
                .collect::<Vec<_>>()
                .join(", ");
            format!("map[string]string{{{body}}}")
        }
    }
}

/// A JSON value as a Go quoted string (strings quoted, others printed then quoted).
pub(crate) fn go_quote(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        other => format!("{:?}", other.to_string()),
    }
}

/// Go's `%#v` of a `[]string`.
pub(crate) fn go_string_slice(v: Option<&Value>) -> String {
    match v.and_then(Value::as_array) {
        None => "[]string(nil)".to_string(),
        Some(a) => format!("[]string{{{}}}", a.iter().map(go_quote).collect::<Vec<_>>().join(", ")),
    }
}

/// Go's `%#v` of a `metav1.LabelSelector`.
pub(crate) fn go_label_selector(v: Option<&Value>) -> String {
    let exprs = match field(v, "matchExpressions").and_then(Value::as_array) {
        None => "[]v1.LabelSelectorRequirement(nil)".to_string(),
        Some(a) => format!(
            "[]v1.LabelSelectorRequirement{{{}}}",
            a.iter()
                .map(|e| format!(
                    "v1.LabelSelectorRequirement{{Key:{:?}, Operator:{:?}, Values:{}}}",
                    str_at(Some(e), "key"),
                    str_at(Some(e), "operator"),
                    go_string_slice(e.get("values"))
                ))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    format!(
        "v1.LabelSelector{{MatchLabels:{}, MatchExpressions:{exprs}}}",
        go_string_map(field(v, "matchLabels"))
    )
}

/// Go's `%#v` of an `intstr.IntOrString`.
pub(crate) fn go_int_or_string(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => format!("intstr.IntOrString{{Type:1, IntVal:0, StrVal:{s:?}}}"),
        Some(Value::Number(n)) => format!("intstr.IntOrString{{Type:0, IntVal:{n}, StrVal:\"\"}}"),
        _ => "intstr.IntOrString{Type:0, IntVal:0, StrVal:\"\"}".to_string(),
    }
}

/// Whether a label selector (JSON `LabelSelector`) matches a label set. A selector that
/// cannot be parsed matches nothing; a missing one matches nothing either.
pub(crate) fn selector_matches(sel: Option<&Value>, labels: Option<&Value>) -> bool {
    let Some(sel) = sel.filter(|s| s.is_object()) else {
        return false;
    };
    let label = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
    if let Some(ml) = sel.get("matchLabels").and_then(Value::as_object) {
        for (k, v) in ml {
            if label(k) != v.as_str() {
                return false;
            }
        }
    }
    for e in arr_at(Some(sel), "matchExpressions") {
        let key = str_at(Some(e), "key");
        let values: Vec<&str> = arr_at(Some(e), "values").iter().filter_map(Value::as_str).collect();
        let ok = match str_at(Some(e), "operator") {
            "In" => label(key).is_some_and(|v| values.contains(&v)),
            "NotIn" => label(key).is_none_or(|v| !values.contains(&v)),
            "Exists" => label(key).is_some(),
            "DoesNotExist" => label(key).is_none(),
            _ => false,
        };
        if !ok {
            return false;
        }
    }
    true
}

/// Whether a selector selects nothing in particular (no labels, no expressions).
pub(crate) fn selector_is_empty(sel: Option<&Value>) -> bool {
    let n = |k| {
        field(sel, k)
            .map(|v| match v {
                Value::Object(m) => m.len(),
                Value::Array(a) => a.len(),
                _ => 0,
            })
            .unwrap_or(0)
    };
    n("matchLabels") + n("matchExpressions") == 0
}

/// Equality where null and missing fields agree and quantities compare by value.
pub(crate) fn semantic_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: HashSet<&String> = x.keys().chain(y.keys()).collect();
            keys.into_iter().all(|k| {
                let (va, vb) = (x.get(k).unwrap_or(&Value::Null), y.get(k).unwrap_or(&Value::Null));
                semantic_eq(va, vb)
            })
        }
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(a, b)| semantic_eq(a, b)),
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::String(_) | Value::Number(_), Value::String(_) | Value::Number(_)) => {
            match (Quantity::from_json(a), Quantity::from_json(b)) {
                (Ok(x), Ok(y)) => x == y,
                _ => a == b,
            }
        }
        _ => a == b,
    }
}

/// The paths where two values differ, for the update message.
pub fn diff_paths(path: &str, old: &Value, new: &Value, out: &mut Vec<String>) {
    if out.len() >= 20 || semantic_eq(old, new) {
        return;
    }
    match (old, new) {
        (Value::Object(o), Value::Object(n)) => {
            let mut keys: Vec<&String> = o.keys().chain(n.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                diff_paths(
                    &format!("{path}.{k}"),
                    o.get(k).unwrap_or(&Value::Null),
                    n.get(k).unwrap_or(&Value::Null),
                    out,
                );
            }
        }
        (Value::Array(o), Value::Array(n)) if o.len() == n.len() => {
            for (i, (a, b)) in o.iter().zip(n).enumerate() {
                diff_paths(&format!("{path}[{i}]"), a, b, out);
            }
        }
        _ => {
            out.push(format!("- {path}: {old}"));
            out.push(format!("+ {path}: {new}"));
        }
    }
}

#[cfg(test)]
pub(crate) mod test_util {
    use super::*;
    use crate::registry::lookup_kind;

    /// Validate an object of a kind and return the errors as upstream prints them.
    pub fn errors(group: &str, kind: &str, obj: &Value, old: Option<&Value>) -> Vec<String> {
        let res = lookup_kind(group, kind).expect("resource");
        validate(res, obj, old).iter().map(|e| e.to_string()).collect()
    }

    /// Defaulted, then validated.
    pub fn errors_defaulted(group: &str, kind: &str, obj: &Value, old: Option<&Value>) -> Vec<String> {
        let res = lookup_kind(group, kind).expect("resource");
        let mut obj = obj.clone();
        crate::defaults::apply_defaults(res, &mut obj);
        validate(res, &obj, old).iter().map(|e| e.to_string()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn paths_print_as_upstream() {
        let p = Path::new("spec")
            .child("containers")
            .index(0)
            .child("resources")
            .child("requests")
            .key("cpu");
        assert_eq!(p.to_string(), "spec.containers[0].resources.requests[cpu]");
    }

    #[test]
    fn go_renderings() {
        assert_eq!(
            go_string_map(Some(&json!({"b": "2", "a": "1"}))),
            "map[string]string{\"a\":\"1\", \"b\":\"2\"}"
        );
        assert_eq!(go_string_map(None), "map[string]string(nil)");
        assert_eq!(
            go_label_selector(Some(&json!({"matchLabels": {"app": "web"}}))),
            "v1.LabelSelector{MatchLabels:map[string]string{\"app\":\"web\"}, MatchExpressions:[]v1.LabelSelectorRequirement(nil)}"
        );
    }

    #[test]
    fn selectors_match() {
        let labels = json!({"app": "web", "tier": "fe"});
        assert!(selector_matches(
            Some(&json!({"matchLabels": {"app": "web"}})),
            Some(&labels)
        ));
        assert!(!selector_matches(
            Some(&json!({"matchLabels": {"app": "db"}})),
            Some(&labels)
        ));
        assert!(selector_matches(
            Some(
                &json!({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["fe", "be"]},
                                               {"key": "x", "operator": "DoesNotExist"}]})
            ),
            Some(&labels)
        ));
        assert!(!selector_matches(
            Some(&json!({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["fe"]}]})),
            Some(&labels)
        ));
        assert!(!selector_matches(None, Some(&labels)));
    }

    /// What `kubectl run/create/expose` send must pass once defaulted.
    #[test]
    fn kubectl_generated_objects_are_valid() {
        use test_util::errors_defaulted;
        let cases = [
            (
                "",
                "Pod",
                json!({"kind": "Pod", "apiVersion": "v1",
                "metadata": {"name": "nginx", "namespace": "default", "creationTimestamp": null, "labels": {"run": "nginx"}},
                "spec": {"containers": [{"name": "nginx", "image": "nginx", "resources": {}}],
                         "dnsPolicy": "ClusterFirst", "restartPolicy": "Always"}, "status": {}}),
            ),
            (
                "apps",
                "Deployment",
                json!({"kind": "Deployment", "apiVersion": "apps/v1",
                "metadata": {"name": "web", "namespace": "default", "creationTimestamp": null, "labels": {"app": "web"}},
                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}}, "strategy": {},
                         "template": {"metadata": {"creationTimestamp": null, "labels": {"app": "web"}},
                                      "spec": {"containers": [{"name": "nginx", "image": "nginx", "resources": {}}]}}},
                "status": {}}),
            ),
            (
                "batch",
                "Job",
                json!({"kind": "Job", "apiVersion": "batch/v1",
                "metadata": {"name": "pi", "namespace": "default", "uid": "0b6c0a0e-1", "creationTimestamp": null},
                "spec": {"template": {"metadata": {"creationTimestamp": null},
                         "spec": {"containers": [{"name": "pi", "image": "perl", "resources": {}}], "restartPolicy": "Never"}}},
                "status": {}}),
            ),
            (
                "batch",
                "CronJob",
                json!({"kind": "CronJob", "apiVersion": "batch/v1",
                "metadata": {"name": "tick", "namespace": "default", "creationTimestamp": null},
                "spec": {"schedule": "*/1 * * * *", "jobTemplate": {"metadata": {"name": "tick", "creationTimestamp": null},
                         "spec": {"template": {"metadata": {"creationTimestamp": null},
                                  "spec": {"containers": [{"name": "tick", "image": "busybox", "resources": {}}], "restartPolicy": "OnFailure"}}}}},
                "status": {}}),
            ),
            (
                "",
                "Service",
                json!({"kind": "Service", "apiVersion": "v1",
                "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"}},
                "spec": {"ports": [{"port": 80, "protocol": "TCP", "targetPort": 80}], "selector": {"app": "web"}},
                "status": {"loadBalancer": {}}}),
            ),
            (
                "",
                "Secret",
                json!({"kind": "Secret", "apiVersion": "v1",
                "metadata": {"name": "s", "namespace": "default"}, "data": {"password": "aHVudGVyMg=="}}),
            ),
            (
                "",
                "ConfigMap",
                json!({"kind": "ConfigMap", "apiVersion": "v1",
                "metadata": {"name": "c", "namespace": "default"}, "data": {"app.properties": "a=b"}}),
            ),
            (
                "",
                "Namespace",
                json!({"kind": "Namespace", "apiVersion": "v1",
                "metadata": {"name": "dev"}, "spec": {}, "status": {}}),
            ),
            (
                "apps",
                "DaemonSet",
                json!({"metadata": {"name": "agent", "namespace": "kube-system"},
                "spec": {"selector": {"matchLabels": {"app": "agent"}},
                         "template": {"metadata": {"labels": {"app": "agent"}},
                                      "spec": {"containers": [{"name": "a", "image": "busybox"}],
                                               "tolerations": [{"operator": "Exists"}]}}}}),
            ),
            (
                "apps",
                "StatefulSet",
                json!({"metadata": {"name": "db", "namespace": "default"},
                "spec": {"serviceName": "db", "selector": {"matchLabels": {"app": "db"}},
                         "template": {"metadata": {"labels": {"app": "db"}},
                                      "spec": {"containers": [{"name": "db", "image": "busybox",
                                               "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]}},
                         "volumeClaimTemplates": [{"metadata": {"name": "data"},
                             "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}]}}),
            ),
            (
                "",
                "Node",
                json!({"metadata": {"name": "node-1", "labels": {"kubernetes.io/hostname": "node-1"}},
                "spec": {"taints": [{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}]},
                "status": {"capacity": {"cpu": "4", "memory": "8Gi", "pods": "110"}}}),
            ),
            (
                "rbac.authorization.k8s.io",
                "RoleBinding",
                json!({"kind": "RoleBinding", "apiVersion": "rbac.authorization.k8s.io/v1",
                "metadata": {"name": "readers", "namespace": "default", "creationTimestamp": null},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
                "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "alice"},
                             {"kind": "ServiceAccount", "name": "bot", "namespace": "default"}]}),
            ),
            (
                "rbac.authorization.k8s.io",
                "ClusterRole",
                json!({"kind": "ClusterRole", "apiVersion": "rbac.authorization.k8s.io/v1",
                "metadata": {"name": "pod-reader", "creationTimestamp": null},
                "rules": [{"verbs": ["get", "list"], "apiGroups": [""], "resources": ["pods"]}]}),
            ),
        ];
        for (group, kind, obj) in cases {
            let e = errors_defaulted(group, kind, &obj, None);
            assert!(e.is_empty(), "{kind}: {e:?}");
        }
    }

    /// Random strings (including multi-byte characters) through every string parser.
    #[test]
    fn random_strings_never_panic() {
        let alphabet: Vec<char> = "09.-+/*,@ eEkKmMGiuµ\u{a0}Ω%:TZ=@every1hs".chars().collect();
        let mut state: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..5000 {
            let len = (next() % 16) as usize;
            let s: String = (0..len)
                .map(|_| alphabet[(next() % alphabet.len() as u64) as usize])
                .collect();
            let _ = crate::quantity::Quantity::parse(&s);
            let _ = validate_cron_schedule(&s);
            let _ = is_qualified_name(&s);
            let _ = is_dns1123_subdomain(&s);
            let _ = is_valid_label_value(&s);
            let _ = meta::name_is_dns_label(&s, true);
            let _ = pod::port_name_errors(&s);
        }
    }

    #[test]
    fn arbitrary_shapes_never_panic() {
        let shapes = [
            json!(null),
            json!(1),
            json!({"metadata": "x"}),
            json!({"metadata": {"name": 5, "labels": [1], "annotations": {"a": 1}}, "spec": []}),
            json!({"metadata": {"name": "a"}, "spec": {"containers": [null, 1, {"name": 1, "resources": {"limits": {"cpu": []}}}],
                   "template": {"metadata": 1, "spec": {"containers": {}}}, "selector": "x", "ports": [1, {"port": "x"}],
                   "taints": [1, {}], "strategy": {"rollingUpdate": 3}, "updateStrategy": "x", "schedule": 1,
                   "jobTemplate": {"spec": {"template": []}}, "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [1]}}},
                   "tolerations": [1, {"operator": 3}], "volumes": [1, {"name": "v", "secret": 1}]}}),
        ];
        for r in crate::registry::RESOURCES {
            for s in &shapes {
                let _ = validate(r, s, None);
                let _ = validate(r, s, Some(s));
                let _ = validate(r, s, Some(&json!({"spec": {"containers": 1}})));
            }
        }
    }
}
