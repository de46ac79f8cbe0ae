//! RuntimeClass (`node.k8s.io/v1`), as upstream's `pkg/apis/node/validation`
//! (`ValidateRuntimeClass`, `ValidateRuntimeClassUpdate`).

use serde_json::{Value, json};

use super::meta::{name_is_dns_label, validate_labels};
use super::pod::{validate_resources, validate_tolerations};
use super::{Path, arr_at, field, invalid_str, str_at};
use crate::status::FieldError;

/// `ValidateRuntimeClass`, and on update `ValidateRuntimeClassUpdate`'s immutable handler.
pub(crate) fn validate_runtime_class(obj: &Value, old: Option<&Value>, errs: &mut Vec<FieldError>) {
    let handler = str_at(Some(obj), "handler");
    let hp = Path::new("handler");
    for m in name_is_dns_label(handler, false) {
        errs.push(invalid_str(&hp, handler, &m));
    }
    if let Some(overhead) = field(Some(obj), "overhead") {
        // upstream reuses the resource requirements' rules, the fixed overhead as limits.
        let as_limits = json!({"limits": field(Some(overhead), "podFixed").cloned().unwrap_or(Value::Null)});
        validate_resources(Some(&as_limits), &Path::new("overhead"), errs);
    }
    if let Some(scheduling) = field(Some(obj), "scheduling") {
        let sp = Path::new("scheduling");
        validate_labels(field(Some(scheduling), "nodeSelector"), &sp.child("nodeSelector"), errs);
        validate_tolerations(arr_at(Some(scheduling), "tolerations"), &sp.child("tolerations"), errs);
    }
    if let Some(old) = old {
        let before = str_at(Some(old), "handler");
        if handler != before {
            errs.push(invalid_str(&hp, handler, "field is immutable"));
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::registry::lookup_kind;

    fn errors(obj: serde_json::Value, old: Option<serde_json::Value>) -> Vec<String> {
        let res = lookup_kind("node.k8s.io", "RuntimeClass").expect("served");
        super::super::validate(res, &obj, old.as_ref())
            .iter()
            .map(|e| format!("{}: {}", e.field, e.body()))
            .collect()
    }

    #[test]
    fn a_valid_runtime_class_passes() {
        let rc = json!({"metadata": {"name": "gvisor"}, "handler": "runsc",
            "overhead": {"podFixed": {"cpu": "250m", "memory": "120Mi"}},
            "scheduling": {"nodeSelector": {"runtime": "gvisor"},
                "tolerations": [{"key": "runtime", "operator": "Equal", "value": "gvisor", "effect": "NoSchedule"}]}});
        assert_eq!(errors(rc, None), Vec::<String>::new());
    }

    #[test]
    fn handler_is_a_dns_label_and_immutable() {
        let rc = json!({"metadata": {"name": "x"}, "handler": "Run_C"});
        assert_eq!(
            errors(rc, None),
            [
                "handler: Invalid value: \"Run_C\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
            ]
        );
        let rc = json!({"metadata": {"name": "x"}, "handler": ""});
        assert_eq!(errors(rc, None).len(), 1);
        let old = json!({"metadata": {"name": "x", "resourceVersion": "1"}, "handler": "runc"});
        let new = json!({"metadata": {"name": "x", "resourceVersion": "1"}, "handler": "runsc"});
        assert_eq!(
            errors(new, Some(old)),
            ["handler: Invalid value: \"runsc\": field is immutable"]
        );
    }

    #[test]
    fn overhead_and_scheduling_are_checked() {
        let rc = json!({"metadata": {"name": "x"}, "handler": "runc",
            "overhead": {"podFixed": {"cpu": "-1"}},
            "scheduling": {"nodeSelector": {"a": "b c"}, "tolerations": [{"operator": "Equal", "value": "v"}]}});
        let errs = errors(rc, None);
        assert_eq!(errs.len(), 3, "{errs:?}");
        assert!(
            errs[0].starts_with("overhead.limits[cpu]: Invalid value: \"-1\": must be greater than or equal to 0"),
            "{errs:?}"
        );
        assert!(
            errs[1].starts_with("scheduling.nodeSelector: Invalid value: \"b c\""),
            "{errs:?}"
        );
        assert!(
            errs[2].starts_with("scheduling.tolerations[0].operator: Invalid value: \"Equal\""),
            "{errs:?}"
        );
    }
}
