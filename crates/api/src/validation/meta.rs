//! Names, labels, annotations, label selectors and object metadata, as upstream's
//! `apimachinery/pkg/util/validation` and `apimachinery/pkg/api/validation`.

use serde_json::Value;

use super::{Path, arr_at, field, forbidden, invalid, invalid_str, required, str_at};
use crate::status::FieldError;

const DNS1123_LABEL_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const DNS1123_LABEL_ERR: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character";
const DNS1123_SUBDOMAIN_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const DNS1123_SUBDOMAIN_ERR: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";
const DNS1035_LABEL_FMT: &str = "[a-z]([-a-z0-9]*[a-z0-9])?";
const DNS1035_LABEL_ERR: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character";
const QUALIFIED_NAME_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const QUALIFIED_NAME_ERR: &str =
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const LABEL_VALUE_FMT: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";
const LABEL_VALUE_ERR: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";

/// Total size of annotations, upstream's `TotalAnnotationSizeLimitB`.
const TOTAL_ANNOTATION_SIZE_LIMIT: usize = 256 * 1024;

/// upstream's `RegexError`: the message, examples and the regular expression.
pub(crate) fn regex_error(msg: &str, fmt: &str, examples: &[&str]) -> String {
    if examples.is_empty() {
        return format!("{msg} (regex used for validation is '{fmt}')");
    }
    let ex = examples
        .iter()
        .map(|e| format!("'{e}', "))
        .collect::<Vec<_>>()
        .join(" or ");
    format!("{msg} (e.g. {ex}regex used for validation is '{fmt}')")
}

pub(crate) fn max_len_error(n: usize) -> String {
    format!("must be no more than {n} characters")
}

fn is_label_shape(s: &str, first_alpha: bool) -> bool {
    let b = s.as_bytes();
    let (Some(&first), Some(&last)) = (b.first(), b.last()) else {
        return false;
    };
    let ok_first = if first_alpha {
        first.is_ascii_lowercase()
    } else {
        first.is_ascii_lowercase() || first.is_ascii_digit()
    };
    ok_first
        && (last.is_ascii_lowercase() || last.is_ascii_digit())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

fn is_qualified_shape(s: &str) -> bool {
    let b = s.as_bytes();
    let (Some(first), Some(last)) = (b.first(), b.last()) else {
        return false;
    };
    first.is_ascii_alphanumeric()
        && last.is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// upstream's `IsDNS1123Label`.
pub fn is_dns1123_label(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push(max_len_error(63));
    }
    if !is_label_shape(s, false) {
        errs.push(regex_error(
            DNS1123_LABEL_ERR,
            DNS1123_LABEL_FMT,
            &["my-name", "123-abc"],
        ));
    }
    errs
}

/// upstream's `IsDNS1123Subdomain`.
pub fn is_dns1123_subdomain(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 253 {
        errs.push(max_len_error(253));
    }
    if !s.split('.').all(|part| is_label_shape(part, false)) {
        errs.push(regex_error(
            DNS1123_SUBDOMAIN_ERR,
            DNS1123_SUBDOMAIN_FMT,
            &["example.com"],
        ));
    }
    errs
}

/// upstream's `IsDNS1035Label`.
pub fn is_dns1035_label(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push(max_len_error(63));
    }
    if !is_label_shape(s, true) {
        errs.push(regex_error(
            DNS1035_LABEL_ERR,
            DNS1035_LABEL_FMT,
            &["my-name", "abc-123"],
        ));
    }
    errs
}

/// upstream's `IsQualifiedName` (label keys, annotation keys, taint keys).
pub fn is_qualified_name(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = s.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".to_string());
            } else {
                errs.extend(
                    is_dns1123_subdomain(prefix)
                        .into_iter()
                        .map(|m| format!("prefix part {m}")),
                );
            }
            *name
        }
        _ => {
            errs.push(format!(
                "a qualified name {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                regex_error(
                    QUALIFIED_NAME_ERR,
                    QUALIFIED_NAME_FMT,
                    &["MyName", "my.name", "123-abc"]
                )
            ));
            return errs;
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".to_string());
    } else if name.len() > 63 {
        errs.push(format!("name part {}", max_len_error(63)));
    }
    if !is_qualified_shape(name) {
        errs.push(format!(
            "name part {}",
            regex_error(
                QUALIFIED_NAME_ERR,
                QUALIFIED_NAME_FMT,
                &["MyName", "my.name", "123-abc"]
            )
        ));
    }
    errs
}

/// upstream's `IsValidLabelValue`.
pub fn is_valid_label_value(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push(max_len_error(63));
    }
    if !s.is_empty() && !is_qualified_shape(s) {
        errs.push(regex_error(
            LABEL_VALUE_ERR,
            LABEL_VALUE_FMT,
            &["MyValue", "my_value", "12345"],
        ));
    }
    errs
}

/// Trailing dashes are allowed in a `generateName` prefix.
fn mask_trailing_dash(name: &str) -> String {
    if name.len() > 1 && name.ends_with('-') {
        format!("{}a", &name[..name.len() - 1])
    } else {
        name.to_string()
    }
}

pub(crate) fn name_is_dns_subdomain(name: &str, prefix: bool) -> Vec<String> {
    if prefix {
        is_dns1123_subdomain(&mask_trailing_dash(name))
    } else {
        is_dns1123_subdomain(name)
    }
}

pub(crate) fn name_is_dns_label(name: &str, prefix: bool) -> Vec<String> {
    if prefix {
        is_dns1123_label(&mask_trailing_dash(name))
    } else {
        is_dns1123_label(name)
    }
}

pub(crate) fn name_is_dns1035_label(name: &str, prefix: bool) -> Vec<String> {
    if prefix {
        is_dns1035_label(&mask_trailing_dash(name))
    } else {
        is_dns1035_label(name)
    }
}

/// upstream's `ValidateLabelName`: errors at the map's path, valued with the key.
pub(crate) fn validate_label_name(key: &str, p: &Path, errs: &mut Vec<FieldError>) {
    for m in is_qualified_name(key) {
        errs.push(invalid_str(p, key, &m));
    }
}

/// upstream's `ValidateLabels` (also used for node selectors and service selectors).
pub fn validate_labels(labels: Option<&Value>, p: &Path, errs: &mut Vec<FieldError>) {
    let Some(m) = labels.and_then(Value::as_object) else {
        return;
    };
    for (k, v) in m {
        validate_label_name(k, p, errs);
        match v {
            Value::String(s) => {
                for m in is_valid_label_value(s) {
                    errs.push(invalid_str(p, s, &m));
                }
            }
            other => errs.push(invalid(p, other, "must be a string")),
        }
    }
}

fn validate_annotations(ann: Option<&Value>, p: &Path, errs: &mut Vec<FieldError>) {
    let Some(m) = ann.and_then(Value::as_object) else {
        return;
    };
    let mut total = 0usize;
    for (k, v) in m {
        for msg in is_qualified_name(&k.to_lowercase()) {
            errs.push(invalid_str(p, k, &msg));
        }
        total += k.len() + v.as_str().map(str::len).unwrap_or(0);
    }
    if total > TOTAL_ANNOTATION_SIZE_LIMIT {
        errs.push(FieldError::too_long(p.as_str(), TOTAL_ANNOTATION_SIZE_LIMIT));
    }
}

/// upstream's `ValidateLabelSelector` (metav1).
pub fn validate_label_selector(sel: Option<&Value>, p: &Path, errs: &mut Vec<FieldError>) {
    validate_label_selector_with(sel, false, p, errs);
}

/// upstream's `ValidateLabelSelector` with `AllowInvalidLabelValueInSelector`: an update may
/// keep the invalid expression values its stored object already has. `matchLabels` first,
/// then each expression.
pub(crate) fn validate_label_selector_with(
    sel: Option<&Value>,
    allow_invalid_values: bool,
    p: &Path,
    errs: &mut Vec<FieldError>,
) {
    let Some(sel) = sel.filter(|s| !s.is_null()) else {
        return;
    };
    validate_labels(field(Some(sel), "matchLabels"), &p.child("matchLabels"), errs);
    for (i, e) in arr_at(Some(sel), "matchExpressions").iter().enumerate() {
        let ep = p.child("matchExpressions").index(i);
        let values = arr_at(Some(e), "values");
        let op = field(Some(e), "operator")
            .cloned()
            .unwrap_or(Value::String(String::new()));
        match op.as_str().unwrap_or("") {
            "In" | "NotIn" => {
                if values.is_empty() {
                    errs.push(required(
                        &ep.child("values"),
                        "must be specified when `operator` is 'In' or 'NotIn'",
                    ));
                }
            }
            "Exists" | "DoesNotExist" => {
                if !values.is_empty() {
                    errs.push(forbidden(
                        &ep.child("values"),
                        "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
                    ));
                }
            }
            _ => errs.push(invalid(&ep.child("operator"), &op, "not a valid selector operator")),
        }
        validate_label_name(str_at(Some(e), "key"), &ep.child("key"), errs);
        if allow_invalid_values {
            continue;
        }
        for (vi, v) in values.iter().enumerate() {
            for msg in is_valid_label_value(v.as_str().unwrap_or("")) {
                errs.push(invalid(&ep.child("values").index(vi), v, &msg));
            }
        }
    }
}

/// Whether upstream's `metav1.LabelSelectorAsSelector` refuses the selector: a label key or
/// value that is not valid, an unknown operator, or values that do not fit the operator. These
/// are exactly what [`validate_label_selector`] reports.
pub(crate) fn label_selector_is_invalid(sel: Option<&Value>) -> bool {
    let mut errs = Vec::new();
    validate_label_selector(sel, &Path::new(""), &mut errs);
    !errs.is_empty()
}

/// upstream's `ValidateObjectMeta` for a top-level object.
pub(crate) fn validate_object_meta(
    meta: Option<&Value>,
    namespaced: bool,
    name_fn: fn(&str, bool) -> Vec<String>,
    errs: &mut Vec<FieldError>,
) {
    let p = Path::new("metadata");
    let generate_name = str_at(meta, "generateName");
    if !generate_name.is_empty() {
        for m in name_fn(generate_name, true) {
            errs.push(invalid_str(&p.child("generateName"), generate_name, &m));
        }
    }
    let name = str_at(meta, "name");
    if name.is_empty() {
        errs.push(required(&p.child("name"), "name or generateName is required"));
    } else {
        for m in name_fn(name, false) {
            errs.push(invalid_str(&p.child("name"), name, &m));
        }
    }
    let ns = str_at(meta, "namespace");
    if namespaced {
        if ns.is_empty() {
            errs.push(required(&p.child("namespace"), ""));
        } else {
            for m in is_dns1123_label(ns) {
                errs.push(invalid_str(&p.child("namespace"), ns, &m));
            }
        }
    } else if !ns.is_empty() {
        errs.push(forbidden(&p.child("namespace"), "not allowed on this type"));
    }
    super::nonnegative(meta, "generation", &p, errs);
    validate_labels(field(meta, "labels"), &p.child("labels"), errs);
    validate_annotations(field(meta, "annotations"), &p.child("annotations"), errs);
    let finalizers = arr_at(meta, "finalizers");
    let fp = p.child("finalizers");
    for f in finalizers {
        let s = f.as_str().unwrap_or("");
        for m in is_qualified_name(s) {
            errs.push(invalid_str(&fp, s, &m));
        }
    }
    let has = |name: &str| finalizers.iter().any(|f| f.as_str() == Some(name));
    if has("orphan") && has("foregroundDeletion") {
        let list = finalizers.iter().map(super::go_quote).collect::<Vec<_>>().join(", ");
        errs.push(super::invalid_raw(
            &fp,
            format!("[]string{{{list}}}"),
            "finalizer orphan and foregroundDeletion cannot be both set",
        ));
    }
}

/// upstream's `ValidateObjectMetaUpdate`: identity fields never change.
pub(crate) fn validate_object_meta_update(new: Option<&Value>, old: Option<&Value>, errs: &mut Vec<FieldError>) {
    let p = Path::new("metadata");
    for key in ["name", "namespace", "uid"] {
        let (n, o) = (str_at(new, key), str_at(old, key));
        if !o.is_empty() && n != o {
            errs.push(invalid_str(&p.child(key), n, "field is immutable"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validation::test_util::errors;
    use serde_json::json;

    #[test]
    fn dns_messages_match_upstream() {
        assert_eq!(
            is_dns1123_subdomain("Bad_Name"),
            vec![
                "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
            ]
        );
        assert_eq!(
            is_dns1123_label("a.b"),
            vec![
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
            ]
        );
        assert_eq!(
            is_dns1035_label("1abc"),
            vec![
                "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"
            ]
        );
        assert!(is_dns1123_subdomain("a.b-c.d9").is_empty());
        assert!(is_dns1123_subdomain("a..b").len() == 1);
        assert_eq!(
            is_dns1123_label(&"a".repeat(64)),
            vec!["must be no more than 63 characters"]
        );
        assert_eq!(
            is_dns1123_subdomain(&"a".repeat(254)),
            vec!["must be no more than 253 characters"]
        );
    }

    #[test]
    fn qualified_names_and_label_values() {
        assert!(is_qualified_name("app.kubernetes.io/name").is_empty());
        assert!(is_qualified_name("MyName").is_empty());
        assert_eq!(
            is_qualified_name("-bad"),
            vec![
                "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
            ]
        );
        assert_eq!(is_qualified_name("/x"), vec!["prefix part must be non-empty"]);
        assert_eq!(is_qualified_name("a/b/c").len(), 1);
        assert!(is_qualified_name("a/b/c")[0].starts_with("a qualified name must consist of"));
        assert!(
            is_qualified_name("a/b/c")[0]
                .ends_with("with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')")
        );
        assert_eq!(
            is_qualified_name("Example.com/x")[0].split(" must").next(),
            Some("prefix part a lowercase RFC 1123 subdomain")
        );
        assert_eq!(is_qualified_name("x/").len(), 2);
        assert!(is_valid_label_value("").is_empty());
        assert_eq!(
            is_valid_label_value("a b"),
            vec![
                "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
            ]
        );
    }

    #[test]
    fn object_meta() {
        let e = errors("", "ConfigMap", &json!({"metadata": {"namespace": "default"}}), None);
        assert_eq!(
            e,
            vec!["metadata.name: Required value: name or generateName is required"]
        );
        let e = errors(
            "",
            "ConfigMap",
            &json!({"metadata": {"name": "Bad", "namespace": "default"}}),
            None,
        );
        assert_eq!(e.len(), 1);
        assert!(e[0].starts_with("metadata.name: Invalid value: \"Bad\": a lowercase RFC 1123 subdomain"));
        let e = errors("", "ConfigMap", &json!({"metadata": {"name": "a"}}), None);
        assert_eq!(e, vec!["metadata.namespace: Required value"]);
        let e = errors("", "Namespace", &json!({"metadata": {"name": "a.b"}}), None);
        assert!(e[0].starts_with("metadata.name: Invalid value: \"a.b\": a lowercase RFC 1123 label"));
        let e = errors("", "Node", &json!({"metadata": {"name": "n", "namespace": "x"}}), None);
        assert_eq!(e, vec!["metadata.namespace: Forbidden: not allowed on this type"]);
        let e = errors(
            "",
            "Service",
            &json!({"metadata": {"name": "1svc", "namespace": "d"}, "spec": {"ports": [{"port": 80, "protocol": "TCP", "targetPort": 80}], "type": "ClusterIP", "sessionAffinity": "None"}}),
            None,
        );
        assert_eq!(e.len(), 1);
        assert!(e[0].starts_with("metadata.name: Invalid value: \"1svc\": a DNS-1035 label"));
        let e = errors(
            "",
            "ConfigMap",
            &json!({"metadata": {"generateName": "web-", "name": "web-x1", "namespace": "d"}}),
            None,
        );
        assert!(e.is_empty(), "{e:?}");
    }

    #[test]
    fn labels_and_annotations() {
        let e = errors(
            "",
            "ConfigMap",
            &json!({"metadata": {"name": "a", "namespace": "d", "labels": {"ok": "fine", "bad key": "v", "k": "-v"},
                                 "annotations": {"Example.com/Ok": "anything goes here"}}}),
            None,
        );
        assert_eq!(e.len(), 2, "{e:?}");
        assert!(e[0].starts_with("metadata.labels: Invalid value: \"bad key\": name part must consist of"));
        assert!(e[1].starts_with("metadata.labels: Invalid value: \"-v\": a valid label must be an empty string"));
        let big = "x".repeat(TOTAL_ANNOTATION_SIZE_LIMIT);
        let e = errors(
            "",
            "ConfigMap",
            &json!({"metadata": {"name": "a", "namespace": "d", "annotations": {"a": big}}}),
            None,
        );
        assert_eq!(
            e,
            vec!["metadata.annotations: Too long: may not be more than 262144 bytes"]
        );
    }

    #[test]
    fn label_selector() {
        let mut errs = Vec::new();
        validate_label_selector(
            Some(&json!({"matchExpressions": [
                {"key": "a", "operator": "In"},
                {"key": "b", "operator": "Exists", "values": ["x"]},
                {"key": "c", "operator": "Gt", "values": ["1"]}
            ]})),
            &Path::new("spec.selector"),
            &mut errs,
        );
        let e: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
        assert_eq!(
            e,
            vec![
                "spec.selector.matchExpressions[0].values: Required value: must be specified when `operator` is 'In' or 'NotIn'",
                "spec.selector.matchExpressions[1].values: Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
                "spec.selector.matchExpressions[2].operator: Invalid value: \"Gt\": not a valid selector operator",
            ]
        );
    }

    #[test]
    fn label_selector_checks_labels_before_expressions() {
        let sel = json!({
            "matchLabels": {"bad key": "v"},
            "matchExpressions": [{"key": "k", "operator": "In", "values": ["-bad"]}]
        });
        let mut errs = Vec::new();
        validate_label_selector(Some(&sel), &Path::new("s"), &mut errs);
        let e: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
        assert_eq!(e.len(), 2, "{e:?}");
        assert!(e[0].starts_with("s.matchLabels: Invalid value: \"bad key\": name part"));
        assert!(e[1].starts_with("s.matchExpressions[0].values[0]: Invalid value: \"-bad\": a valid label"));
        // Allowing invalid values (an update of an object stored with them) skips only those.
        let mut errs = Vec::new();
        validate_label_selector_with(Some(&sel), true, &Path::new("s"), &mut errs);
        assert_eq!(errs.len(), 1);
        assert!(label_selector_is_invalid(Some(&sel)));
        assert!(!label_selector_is_invalid(Some(&json!({"matchLabels": {"a": "b"}}))));
        assert!(!label_selector_is_invalid(None));
    }

    #[test]
    fn finalizers() {
        let e = errors(
            "",
            "ConfigMap",
            &json!({"metadata": {"name": "a", "namespace": "d", "finalizers": ["example.com/ok", "bad name", "orphan", "foregroundDeletion"]}}),
            None,
        );
        assert_eq!(e.len(), 2, "{e:?}");
        assert!(e[0].starts_with("metadata.finalizers: Invalid value: \"bad name\": name part must consist of"));
        assert_eq!(
            e[1],
            "metadata.finalizers: Invalid value: []string{\"example.com/ok\", \"bad name\", \"orphan\", \"foregroundDeletion\"}: finalizer orphan and foregroundDeletion cannot be both set"
        );
    }

    #[test]
    fn metadata_update_immutability() {
        let old = json!({"metadata": {"name": "a", "namespace": "d", "uid": "1"}});
        let new = json!({"metadata": {"name": "a", "namespace": "d", "uid": "2"}});
        assert_eq!(
            errors("", "ConfigMap", &new, Some(&old)),
            vec!["metadata.uid: Invalid value: \"2\": field is immutable"]
        );
    }
}
