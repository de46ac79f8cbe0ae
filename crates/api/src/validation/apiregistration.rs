//! APIService (`apiregistration.k8s.io/v1`), as upstream's kube-aggregator
//! `pkg/apis/apiregistration/validation` (`ValidateAPIService`, `ValidateAPIServiceUpdate`,
//! `ValidateAPIServiceStatusUpdate`).

use base64::Engine;
use serde_json::{Value, json};

use super::meta::{is_dns1035_label, is_dns1123_subdomain};
use super::{Path, arr_at, field, invalid, invalid_str, not_supported, required, str_at};
use crate::status::FieldError;

/// The name rule: a path segment that is exactly `spec.version + "." + spec.group`. Run for
/// `metadata.generateName` and `metadata.name` as upstream's name function is; an empty name
/// is left to the object meta rules.
pub(crate) fn validate_name(obj: &Value, errs: &mut Vec<FieldError>) {
    let spec = obj.get("spec");
    let required_name = format!("{}.{}", str_at(spec, "version"), str_at(spec, "group"));
    let md = obj.get("metadata");
    let p = Path::new("metadata");
    for (key, value) in [
        ("generateName", str_at(md, "generateName")),
        ("name", str_at(md, "name")),
    ] {
        if value.is_empty() {
            continue;
        }
        let segment = super::name_is_path_segment(value, key == "generateName");
        let messages = if !segment.is_empty() {
            segment
        } else if value != required_name {
            vec![format!("must be `spec.version+\".\"+spec.group`: {required_name:?}")]
        } else {
            Vec::new()
        };
        for m in messages {
            errs.push(invalid_str(&p.child(key), value, &m));
        }
    }
}

/// `ValidateAPIService` past its object meta.
pub(crate) fn validate_api_service(obj: &Value, errs: &mut Vec<FieldError>) {
    let spec = obj.get("spec");
    let sp = Path::new("spec");
    let group = str_at(spec, "group");
    let version = str_at(spec, "version");
    if group.is_empty() && version != "v1" {
        errs.push(required(
            &sp.child("group"),
            "only v1 may have an empty group and it better be legacy kube",
        ));
    }
    if !group.is_empty() {
        for m in is_dns1123_subdomain(group) {
            errs.push(invalid_str(&sp.child("group"), group, &m));
        }
    }
    for m in is_dns1035_label(version) {
        errs.push(invalid_str(&sp.child("version"), version, &m));
    }
    let number = |key: &str| field(spec, key).and_then(Value::as_i64).unwrap_or(0);
    let group_priority = number("groupPriorityMinimum");
    if group_priority <= 0 || group_priority > 20000 {
        errs.push(invalid(
            &sp.child("groupPriorityMinimum"),
            &json!(group_priority),
            "must be positive and less than 20000",
        ));
    }
    let version_priority = number("versionPriority");
    if version_priority <= 0 || version_priority > 1000 {
        errs.push(invalid(
            &sp.child("versionPriority"),
            &json!(version_priority),
            "must be positive and less than 1000",
        ));
    }
    let ca_bundle_len = ca_bundle_len(spec);
    let insecure = field(spec, "insecureSkipTLSVerify")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let Some(service) = field(spec, "service") else {
        if ca_bundle_len != 0 {
            errs.push(invalid_str(
                &sp.child("caBundle"),
                &format!("{ca_bundle_len} bytes"),
                "local APIServices may not have a caBundle",
            ));
        }
        if insecure {
            errs.push(invalid(
                &sp.child("insecureSkipTLSVerify"),
                &json!(insecure),
                "local APIServices may not have insecureSkipTLSVerify",
            ));
        }
        return;
    };
    let svc = sp.child("service");
    if str_at(Some(service), "namespace").is_empty() {
        errs.push(required(&svc.child("namespace"), ""));
    }
    if str_at(Some(service), "name").is_empty() {
        errs.push(required(&svc.child("name"), ""));
    }
    if insecure && ca_bundle_len > 0 {
        errs.push(invalid(
            &sp.child("insecureSkipTLSVerify"),
            &json!(insecure),
            "may not be true if caBundle is present",
        ));
    }
}

/// The decoded length of `spec.caBundle` (base64 in JSON, bytes in upstream's type).
fn ca_bundle_len(spec: Option<&Value>) -> usize {
    let encoded = str_at(spec, "caBundle");
    base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map(|b| b.len())
        .unwrap_or(encoded.len())
}

/// `ValidateAPIServiceStatus`: each condition's status is True, False or Unknown.
pub(crate) fn validate_api_service_status(obj: &Value, errs: &mut Vec<FieldError>) {
    let cp = Path::new("status").child("conditions");
    for (i, c) in arr_at(obj.get("status"), "conditions").iter().enumerate() {
        let status = str_at(Some(c), "status");
        if !matches!(status, "True" | "False" | "Unknown") {
            errs.push(not_supported(
                &cp.index(i).child("status"),
                &json!(status),
                &["True", "False", "Unknown"],
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use crate::registry::lookup_kind;

    fn errors(obj: Value, old: Option<Value>, subresource: &str) -> Vec<String> {
        let res = lookup_kind("apiregistration.k8s.io", "APIService").expect("served");
        super::super::validate_write(res, subresource, &obj, old.as_ref())
            .iter()
            .map(|e| format!("{}: {}", e.field, e.body()))
            .collect()
    }

    fn service(name: &str, spec: Value) -> Value {
        json!({"metadata": {"name": name}, "spec": spec})
    }

    #[test]
    fn a_local_and_a_remote_api_service_pass() {
        let local = service(
            "v1.apps",
            json!({"group": "apps", "version": "v1", "groupPriorityMinimum": 17800, "versionPriority": 15}),
        );
        assert_eq!(errors(local, None, ""), Vec::<String>::new());
        let core = service(
            "v1.",
            json!({"group": "", "version": "v1", "groupPriorityMinimum": 18000, "versionPriority": 1}),
        );
        assert_eq!(errors(core, None, ""), Vec::<String>::new());
        let remote = service(
            "v1beta1.metrics.k8s.io",
            json!({"group": "metrics.k8s.io", "version": "v1beta1", "groupPriorityMinimum": 100,
                "versionPriority": 100, "insecureSkipTLSVerify": true,
                "service": {"namespace": "kube-system", "name": "metrics-server", "port": 443}}),
        );
        assert_eq!(errors(remote, None, ""), Vec::<String>::new());
    }

    #[test]
    fn the_name_is_version_dot_group() {
        let s = service(
            "metrics",
            json!({"group": "metrics.k8s.io", "version": "v1beta1", "groupPriorityMinimum": 100, "versionPriority": 100}),
        );
        assert_eq!(
            errors(s, None, ""),
            [
                "metadata.name: Invalid value: \"metrics\": must be `spec.version+\".\"+spec.group`: \"v1beta1.metrics.k8s.io\""
            ]
        );
        let s = service(
            "v1%",
            json!({"group": "", "version": "v1", "groupPriorityMinimum": 1, "versionPriority": 1}),
        );
        assert_eq!(
            errors(s, None, ""),
            ["metadata.name: Invalid value: \"v1%\": may not contain '%'"]
        );
    }

    #[test]
    fn spec_rules_in_upstream_words() {
        let s = service(
            "V1_bad.Example",
            json!({"group": "Example", "version": "V1_bad", "groupPriorityMinimum": 0, "versionPriority": 1001,
                "caBundle": "AAAA", "insecureSkipTLSVerify": true}),
        );
        let errs = errors(s, None, "");
        assert_eq!(errs.len(), 6, "{errs:?}");
        assert!(
            errs[0].starts_with("spec.group: Invalid value: \"Example\": a lowercase RFC 1123 subdomain"),
            "{errs:?}"
        );
        assert!(
            errs[1].starts_with("spec.version: Invalid value: \"V1_bad\": a DNS-1035 label"),
            "{errs:?}"
        );
        assert_eq!(
            errs[2],
            "spec.groupPriorityMinimum: Invalid value: 0: must be positive and less than 20000"
        );
        assert_eq!(
            errs[3],
            "spec.versionPriority: Invalid value: 1001: must be positive and less than 1000"
        );
        assert_eq!(
            errs[4],
            "spec.caBundle: Invalid value: \"3 bytes\": local APIServices may not have a caBundle"
        );
        assert_eq!(
            errs[5],
            "spec.insecureSkipTLSVerify: Invalid value: true: local APIServices may not have insecureSkipTLSVerify"
        );
        let s = service(
            "v2.",
            json!({"group": "", "version": "v2", "groupPriorityMinimum": 1, "versionPriority": 1,
                "service": {}, "caBundle": "AAAA", "insecureSkipTLSVerify": true}),
        );
        assert_eq!(
            errors(s, None, ""),
            [
                "spec.group: Required value: only v1 may have an empty group and it better be legacy kube",
                "spec.service.namespace: Required value",
                "spec.service.name: Required value",
                "spec.insecureSkipTLSVerify: Invalid value: true: may not be true if caBundle is present",
            ]
        );
    }

    #[test]
    fn status_conditions_are_true_false_or_unknown() {
        let old = json!({"metadata": {"name": "v1.x", "resourceVersion": "1"},
            "spec": {"group": "x", "version": "v1", "groupPriorityMinimum": 1, "versionPriority": 1}});
        let mut new = old.clone();
        new["status"] = json!({"conditions": [{"type": "Available", "status": "Maybe"}]});
        assert_eq!(
            errors(new, Some(old), "status"),
            [
                "status.conditions[0].status: Unsupported value: \"Maybe\": supported values: \"True\", \"False\", \"Unknown\""
            ]
        );
    }
}
