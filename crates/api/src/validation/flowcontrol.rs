//! FlowSchema and PriorityLevelConfiguration (`flowcontrol.apiserver.k8s.io/v1`), as upstream's
//! `pkg/apis/flowcontrol/validation` (`ValidateFlowSchema`, `ValidatePriorityLevelConfiguration`,
//! their status rules); mandatory objects must keep the spec the server ships.

use std::collections::HashSet;

use serde_json::{Value, json};

use super::meta::{is_dns1123_label, name_is_dns_subdomain};
use super::{
    Path, arr_at, duplicate, field, forbidden, invalid, invalid_raw, invalid_str, not_supported, required, str_at,
};
use crate::status::{FieldError, FieldErrorKind};

const SUPPORTED_VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "proxy",
    "update",
    "watch",
];
const MAX_MATCHING_PRECEDENCE: i64 = 10000;
const MAX_QUEUES: i64 = 10_000_000;
/// Shuffle sharding's hash width (`shufflesharding.MaxHashBits`).
const MAX_HASH_BITS: f64 = 60.0;

fn strings(v: &[Value]) -> Vec<&str> {
    v.iter().map(|s| s.as_str().unwrap_or("")).collect()
}

/// Go's `%#v` of a `[]string`.
fn go_strings(v: &[Value]) -> String {
    super::go_string_slice(Some(&Value::Array(v.to_vec())))
}

/// An unsupported value already rendered as upstream renders it (Go's `%#v`).
fn not_supported_raw(p: &Path, rendered: String, supported: &[&str]) -> FieldError {
    let mut e = not_supported(p, &Value::Null, supported);
    if let FieldErrorKind::NotSupported { value, .. } = &mut e.kind {
        *value = rendered;
    }
    e
}

fn int(v: Option<&Value>, key: &str) -> i64 {
    field(v, key).and_then(Value::as_i64).unwrap_or(0)
}

/// Mandatory objects keep their fixed spec (upstream compares with `Semantic.DeepEqual`).
fn validate_mandatory(kind: &str, obj: &Value, errs: &mut Vec<FieldError>) {
    let name = str_at(obj.get("metadata"), "name");
    let Some(fixed) = crate::flowcontrol::mandatory_spec(kind, name) else {
        return;
    };
    let spec = obj.get("spec").cloned().unwrap_or(Value::Null);
    if spec != fixed {
        errs.push(invalid_raw(
            &Path::new("spec"),
            spec.to_string(),
            &format!("spec of '{name}' must equal the fixed value"),
        ));
    }
}

/// `ValidateFlowSchema` past its object meta (the same on update).
pub(crate) fn validate_flow_schema(obj: &Value, errs: &mut Vec<FieldError>) {
    let name = str_at(obj.get("metadata"), "name");
    let spec = obj.get("spec");
    let sp = Path::new("spec");
    let precedence = int(spec, "matchingPrecedence");
    let pp = sp.child("matchingPrecedence");
    if precedence <= 0 {
        errs.push(invalid(&pp, &json!(precedence), "must be a positive value"));
    }
    if precedence > MAX_MATCHING_PRECEDENCE {
        errs.push(invalid(
            &pp,
            &json!(precedence),
            &format!("must not be greater than {MAX_MATCHING_PRECEDENCE}"),
        ));
    }
    if precedence == 1 && name != crate::flowcontrol::EXEMPT {
        errs.push(invalid(
            &pp,
            &json!(precedence),
            "only the schema named 'exempt' may have matchingPrecedence 1",
        ));
    }
    if let Some(dm) = field(spec, "distinguisherMethod") {
        let ty = str_at(Some(dm), "type");
        if !matches!(ty, "ByNamespace" | "ByUser") {
            // upstream reports the whole method struct.
            errs.push(not_supported_raw(
                &sp.child("distinguisherMethod").child("type"),
                format!("flowcontrol.FlowDistinguisherMethod{{Type:{ty:?}}}"),
                &["ByNamespace", "ByUser"],
            ));
        }
    }
    let level = str_at(field(spec, "priorityLevelConfiguration"), "name");
    let lp = sp.child("priorityLevelConfiguration").child("name");
    if level.is_empty() {
        errs.push(required(&lp, "must reference a priority level"));
    } else {
        for m in name_is_dns_subdomain(level, false) {
            errs.push(invalid_str(&lp, level, &m));
        }
    }
    for (i, rule) in arr_at(spec, "rules").iter().enumerate() {
        validate_rule(rule, &sp.child("rules").index(i), errs);
    }
    validate_mandatory("FlowSchema", obj, errs);
    validate_conditions(obj, errs);
}

fn validate_rule(rule: &Value, p: &Path, errs: &mut Vec<FieldError>) {
    let rule = Some(rule);
    let subjects = arr_at(rule, "subjects");
    if subjects.is_empty() {
        errs.push(required(
            &p.child("subjects"),
            "subjects must contain at least one value",
        ));
    }
    for (i, s) in subjects.iter().enumerate() {
        validate_subject(s, &p.child("subjects").index(i), errs);
    }
    let resource_rules = arr_at(rule, "resourceRules");
    let non_resource_rules = arr_at(rule, "nonResourceRules");
    if resource_rules.is_empty() && non_resource_rules.is_empty() {
        errs.push(required(
            p,
            "at least one of resourceRules and nonResourceRules has to be non-empty",
        ));
    }
    for (i, r) in resource_rules.iter().enumerate() {
        validate_resource_rule(r, &p.child("resourceRules").index(i), errs);
    }
    for (i, r) in non_resource_rules.iter().enumerate() {
        validate_non_resource_rule(r, &p.child("nonResourceRules").index(i), errs);
    }
}

fn validate_subject(s: &Value, p: &Path, errs: &mut Vec<FieldError>) {
    let s = Some(s);
    let kind = str_at(s, "kind");
    let forbid = |errs: &mut Vec<FieldError>, key: &str, message: &str| {
        if field(s, key).is_some() {
            errs.push(forbidden(&p.child(key), message));
        }
    };
    let user_forbidden = "user is forbidden when subject kind is not 'User'";
    let group_forbidden = "group is forbidden when subject kind is not 'Group'";
    let sa_forbidden = "serviceAccount is forbidden when subject kind is not 'ServiceAccount'";
    match kind {
        "ServiceAccount" => {
            let sp = p.child("serviceAccount");
            match field(s, "serviceAccount") {
                None => errs.push(required(
                    &sp,
                    "serviceAccount is required when subject kind is 'ServiceAccount'",
                )),
                Some(sa) => {
                    let name = str_at(Some(sa), "name");
                    if name.is_empty() {
                        errs.push(required(&sp.child("name"), ""));
                    } else if name != "*" {
                        for m in name_is_dns_subdomain(name, false) {
                            errs.push(invalid_str(&sp.child("name"), name, &m));
                        }
                    }
                    let ns = str_at(Some(sa), "namespace");
                    if ns.is_empty() {
                        errs.push(required(
                            &sp.child("namespace"),
                            "must specify namespace for service account",
                        ));
                    } else {
                        for m in is_dns1123_label(ns) {
                            errs.push(invalid_str(&sp.child("namespace"), ns, &m));
                        }
                    }
                }
            }
            forbid(errs, "user", user_forbidden);
            forbid(errs, "group", group_forbidden);
        }
        "User" => {
            named_subject(s, "user", "user is required when subject kind is 'User'", p, errs);
            forbid(errs, "serviceAccount", sa_forbidden);
            forbid(errs, "group", group_forbidden);
        }
        "Group" => {
            named_subject(s, "group", "group is required when subject kind is 'Group'", p, errs);
            forbid(errs, "serviceAccount", sa_forbidden);
            forbid(errs, "user", user_forbidden);
        }
        _ => errs.push(not_supported(
            &p.child("kind"),
            &json!(kind),
            &["Group", "ServiceAccount", "User"],
        )),
    }
}

fn named_subject(s: Option<&Value>, key: &str, missing: &str, p: &Path, errs: &mut Vec<FieldError>) {
    match field(s, key) {
        None => errs.push(required(&p.child(key), missing)),
        Some(v) => {
            if str_at(Some(v), "name").is_empty() {
                errs.push(required(&p.child(key).child("name"), ""));
            }
        }
    }
}

fn validate_verbs(verbs: &[Value], p: &Path, errs: &mut Vec<FieldError>) {
    let list = strings(verbs);
    if list.is_empty() {
        errs.push(required(p, "verbs must contain at least one value"));
    } else if list.contains(&"*") {
        if list.len() > 1 {
            errs.push(invalid_raw(
                p,
                go_strings(verbs),
                "if '*' is present, must not specify other verbs",
            ));
        }
    } else if !list.iter().all(|v| SUPPORTED_VERBS.contains(v)) {
        errs.push(not_supported_raw(p, go_strings(verbs), SUPPORTED_VERBS));
    }
}

fn validate_resource_rule(r: &Value, p: &Path, errs: &mut Vec<FieldError>) {
    let r = Some(r);
    validate_verbs(arr_at(r, "verbs"), &p.child("verbs"), errs);
    for (key, what) in [("apiGroups", "api group"), ("resources", "resource")] {
        let list = arr_at(r, key);
        if list.is_empty() {
            errs.push(required(
                &p.child(key),
                &format!("resource rules must supply at least one {what}"),
            ));
        } else if list.len() > 1 && strings(list).contains(&"*") {
            errs.push(invalid_raw(
                &p.child(key),
                go_strings(list),
                &format!("if '*' is present, must not specify other {what}s"),
            ));
        }
    }
    let namespaces = arr_at(r, "namespaces");
    let cluster_scope = field(r, "clusterScope").and_then(Value::as_bool).unwrap_or(false);
    let np = p.child("namespaces");
    if namespaces.is_empty() && !cluster_scope {
        errs.push(required(
            &np,
            "resource rules that are not cluster scoped must supply at least one namespace",
        ));
    } else if strings(namespaces).contains(&"*") {
        if namespaces.len() > 1 {
            errs.push(invalid_raw(
                &np,
                go_strings(namespaces),
                "if '*' is present, must not specify other namespaces",
            ));
        }
    } else {
        for (i, ns) in strings(namespaces).into_iter().enumerate() {
            for m in is_dns1123_label(ns) {
                errs.push(invalid_str(
                    &np.index(i),
                    ns,
                    &format!("each member of this list must be '*' or a DNS-1123 label; {m}"),
                ));
            }
        }
    }
}

fn validate_non_resource_rule(r: &Value, p: &Path, errs: &mut Vec<FieldError>) {
    let r = Some(r);
    validate_verbs(arr_at(r, "verbs"), &p.child("verbs"), errs);
    let urls = arr_at(r, "nonResourceURLs");
    let up = p.child("nonResourceURLs");
    if urls.is_empty() {
        errs.push(required(&up, "nonResourceURLs must contain at least one value"));
    } else if strings(urls).contains(&"*") {
        if urls.len() > 1 {
            errs.push(invalid_raw(
                &up,
                go_strings(urls),
                "if '*' is present, must not specify other non-resource URLs",
            ));
        }
    } else {
        for (i, url) in strings(urls).into_iter().enumerate() {
            if let Some(m) = non_resource_url_problem(url) {
                errs.push(invalid_str(&up.index(i), url, m));
            }
        }
    }
}

/// upstream's `ValidateNonResourceURLPath`.
fn non_resource_url_problem(path: &str) -> Option<&'static str> {
    if path.is_empty() {
        return Some("must not be empty");
    }
    if path == "/" {
        return None;
    }
    if !path.starts_with('/') {
        return Some("must start with slash");
    }
    if path.contains(' ') {
        return Some("must not contain white-space");
    }
    if path.contains("//") {
        return Some("must not contain double slash");
    }
    let wildcards = path.matches('*').count();
    if wildcards > 1 || (wildcards == 1 && !path.ends_with("/*")) {
        return Some("wildcard can only do suffix matching");
    }
    None
}

/// The status rules of both kinds: condition types are set and unique.
pub(crate) fn validate_conditions(obj: &Value, errs: &mut Vec<FieldError>) {
    let cp = Path::new("status").child("conditions");
    let mut seen = HashSet::new();
    for (i, c) in arr_at(obj.get("status"), "conditions").iter().enumerate() {
        let ty = str_at(Some(c), "type");
        if !seen.insert(ty) {
            errs.push(duplicate(&cp.index(i).child("type"), &json!(ty)));
        }
        if ty.is_empty() {
            errs.push(required(&cp.index(i).child("type"), "must not be empty"));
        }
    }
}

/// `ValidatePriorityLevelConfiguration` past its object meta (the same on update).
pub(crate) fn validate_priority_level(obj: &Value, errs: &mut Vec<FieldError>) {
    let name = str_at(obj.get("metadata"), "name");
    let spec = obj.get("spec");
    let sp = Path::new("spec");
    let ty = str_at(spec, "type");
    if (name == crate::flowcontrol::EXEMPT) != (ty == "Exempt") {
        errs.push(invalid_str(
            &sp.child("type"),
            ty,
            "type must be 'Exempt' if and only if name is 'exempt'",
        ));
    }
    match ty {
        "Exempt" => {
            if field(spec, "limited").is_some() {
                errs.push(forbidden(
                    &sp.child("limited"),
                    "must be nil if the type is not Limited",
                ));
            }
            if let Some(exempt) = field(spec, "exempt") {
                let ep = sp.child("exempt");
                let shares = int(Some(exempt), "nominalConcurrencyShares");
                if shares < 0 {
                    errs.push(invalid(
                        &ep.child("nominalConcurrencyShares"),
                        &json!(shares),
                        "must be a non-negative integer",
                    ));
                }
                lendable_percent(Some(exempt), &ep, errs);
            }
        }
        "Limited" => {
            if field(spec, "exempt").is_some() {
                errs.push(forbidden(&sp.child("exempt"), "must be nil if the type is Limited"));
            }
            match field(spec, "limited") {
                None => errs.push(required(&sp.child("limited"), "must not be empty when type is Limited")),
                Some(l) => validate_limited(l, &sp.child("limited"), errs),
            }
        }
        _ => errs.push(not_supported(&sp.child("type"), &json!(ty), &["Exempt", "Limited"])),
    }
    validate_mandatory("PriorityLevelConfiguration", obj, errs);
    validate_conditions(obj, errs);
}

fn lendable_percent(v: Option<&Value>, p: &Path, errs: &mut Vec<FieldError>) {
    if let Some(lp) = field(v, "lendablePercent").and_then(Value::as_i64)
        && !(0..=100).contains(&lp)
    {
        errs.push(invalid(
            &p.child("lendablePercent"),
            &json!(lp),
            "must be between 0 and 100, inclusive",
        ));
    }
}

fn validate_limited(l: &Value, p: &Path, errs: &mut Vec<FieldError>) {
    let l = Some(l);
    let shares = int(l, "nominalConcurrencyShares");
    if shares < 0 {
        errs.push(invalid(
            &p.child("nominalConcurrencyShares"),
            &json!(shares),
            "must be a non-negative integer",
        ));
    }
    let lr = field(l, "limitResponse");
    let lp = p.child("limitResponse");
    match str_at(lr, "type") {
        "Reject" => {
            if field(lr, "queuing").is_some() {
                errs.push(forbidden(
                    &lp.child("queuing"),
                    "must be nil if limited.limitResponse.type is not Limited",
                ));
            }
        }
        "Queue" => match field(lr, "queuing") {
            None => errs.push(required(
                &lp.child("queuing"),
                "must not be empty if limited.limitResponse.type is Limited",
            )),
            Some(q) => validate_queuing(q, &lp.child("queuing"), errs),
        },
        other => errs.push(not_supported(&lp.child("type"), &json!(other), &["Queue", "Reject"])),
    }
    lendable_percent(l, p, errs);
    if let Some(b) = field(l, "borrowingLimitPercent").and_then(Value::as_i64)
        && b < 0
    {
        errs.push(invalid(
            &p.child("borrowingLimitPercent"),
            &json!(b),
            "if specified, must be a non-negative integer",
        ));
    }
}

/// The entropy shuffle sharding needs to deal `hand_size` of `deck_size` queues.
fn required_entropy_bits(deck_size: i64, hand_size: i64) -> f64 {
    // `math.Ceil(math.Log2(float64(deckSize)) * float64(handSize))`
    ((deck_size as f64).log2() * hand_size as f64).ceil()
}

fn validate_queuing(q: &Value, p: &Path, errs: &mut Vec<FieldError>) {
    let q = Some(q);
    let queue_length_limit = int(q, "queueLengthLimit");
    if queue_length_limit <= 0 {
        errs.push(invalid(
            &p.child("queueLengthLimit"),
            &json!(queue_length_limit),
            "must be positive",
        ));
    }
    let queues = int(q, "queues");
    if queues <= 0 {
        errs.push(invalid(&p.child("queues"), &json!(queues), "must be positive"));
    } else if queues > MAX_QUEUES {
        errs.push(invalid(
            &p.child("queues"),
            &json!(queues),
            &format!("must not be greater than {MAX_QUEUES}"),
        ));
    }
    let hand_size = int(q, "handSize");
    let hp = p.child("handSize");
    if hand_size <= 0 {
        errs.push(invalid(&hp, &json!(hand_size), "must be positive"));
    } else if hand_size > queues {
        errs.push(invalid(
            &hp,
            &json!(hand_size),
            &format!("should not be greater than queues ({queues})"),
        ));
    } else if required_entropy_bits(queues, hand_size) > MAX_HASH_BITS {
        errs.push(invalid(
            &hp,
            &json!(hand_size),
            &format!(
                "required entropy bits of deckSize {queues} and handSize {hand_size} should not be greater than {}",
                MAX_HASH_BITS as i64
            ),
        ));
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use crate::registry::lookup_kind;

    fn errors(kind: &str, obj: Value) -> Vec<String> {
        let res = lookup_kind("flowcontrol.apiserver.k8s.io", kind).expect("served");
        let mut obj = obj;
        crate::defaults::apply_defaults(res, &mut obj);
        super::super::validate(res, &obj, None)
            .iter()
            .map(|e| format!("{}: {}", e.field, e.body()))
            .collect()
    }

    #[test]
    fn a_flow_schema_in_upstream_words() {
        let ok = json!({"metadata": {"name": "mine"}, "spec": {"priorityLevelConfiguration": {"name": "workload-low"},
            "distinguisherMethod": {"type": "ByUser"},
            "rules": [{"subjects": [{"kind": "User", "user": {"name": "alice"}}],
                "resourceRules": [{"verbs": ["get", "list"], "apiGroups": [""], "resources": ["pods"], "namespaces": ["default"]}]}]}});
        assert_eq!(errors("FlowSchema", ok), Vec::<String>::new());
        let bad = json!({"metadata": {"name": "mine"}, "spec": {"priorityLevelConfiguration": {"name": ""},
            "matchingPrecedence": 1, "distinguisherMethod": {"type": "ByGroup"},
            "rules": [{"subjects": [{"kind": "Robot"}, {"kind": "Group"}],
                "resourceRules": [{"verbs": ["get", "fly"], "apiGroups": [], "resources": ["*", "pods"], "namespaces": ["Bad_NS"]}],
                "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["metrics", "/a/*/b"]}]}]}});
        assert_eq!(
            errors("FlowSchema", bad),
            [
                "spec.matchingPrecedence: Invalid value: 1: only the schema named 'exempt' may have matchingPrecedence 1",
                "spec.distinguisherMethod.type: Unsupported value: flowcontrol.FlowDistinguisherMethod{Type:\"ByGroup\"}: supported values: \"ByNamespace\", \"ByUser\"",
                "spec.priorityLevelConfiguration.name: Required value: must reference a priority level",
                "spec.rules[0].subjects[0].kind: Unsupported value: \"Robot\": supported values: \"Group\", \"ServiceAccount\", \"User\"",
                "spec.rules[0].subjects[1].group: Required value: group is required when subject kind is 'Group'",
                "spec.rules[0].resourceRules[0].verbs: Unsupported value: []string{\"get\", \"fly\"}: supported values: \"create\", \"delete\", \"deletecollection\", \"get\", \"list\", \"patch\", \"proxy\", \"update\", \"watch\"",
                "spec.rules[0].resourceRules[0].apiGroups: Required value: resource rules must supply at least one api group",
                "spec.rules[0].resourceRules[0].resources: Invalid value: []string{\"*\", \"pods\"}: if '*' is present, must not specify other resources",
                "spec.rules[0].resourceRules[0].namespaces[0]: Invalid value: \"Bad_NS\": each member of this list must be '*' or a DNS-1123 label; a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
                "spec.rules[0].nonResourceRules[0].nonResourceURLs[0]: Invalid value: \"metrics\": must start with slash",
                "spec.rules[0].nonResourceRules[0].nonResourceURLs[1]: Invalid value: \"/a/*/b\": wildcard can only do suffix matching",
            ]
        );
    }

    #[test]
    fn matching_precedence_defaults_to_1000_and_is_bounded() {
        let fs = json!({"metadata": {"name": "x"}, "spec": {"priorityLevelConfiguration": {"name": "p"}, "matchingPrecedence": 10001,
            "rules": [{"subjects": [{"kind": "Group", "group": {"name": "g"}}]}]}});
        assert_eq!(
            errors("FlowSchema", fs),
            [
                "spec.matchingPrecedence: Invalid value: 10001: must not be greater than 10000",
                "spec.rules[0]: Required value: at least one of resourceRules and nonResourceRules has to be non-empty",
            ]
        );
    }

    #[test]
    fn mandatory_objects_keep_their_spec() {
        let fs = json!({"metadata": {"name": "catch-all"}, "spec": {"priorityLevelConfiguration": {"name": "catch-all"},
            "matchingPrecedence": 9999, "rules": []}});
        let errs = errors("FlowSchema", fs);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(errs[0].starts_with("spec: Invalid value: "), "{errs:?}");
        assert!(
            errs[0].ends_with(": spec of 'catch-all' must equal the fixed value"),
            "{errs:?}"
        );
    }

    #[test]
    fn a_priority_level_in_upstream_words() {
        let ok = json!({"metadata": {"name": "mine"}, "spec": {"type": "Limited",
            "limited": {"limitResponse": {"type": "Queue", "queuing": {}}}}});
        assert_eq!(errors("PriorityLevelConfiguration", ok), Vec::<String>::new());
        let bad = json!({"metadata": {"name": "mine"}, "spec": {"type": "Exempt",
            "limited": {"nominalConcurrencyShares": -1, "lendablePercent": 101,
                "limitResponse": {"type": "Queue", "queuing": {"queues": 4, "handSize": 5, "queueLengthLimit": 0}}}}});
        assert_eq!(
            errors("PriorityLevelConfiguration", bad),
            [
                "spec.type: Invalid value: \"Exempt\": type must be 'Exempt' if and only if name is 'exempt'",
                "spec.limited: Forbidden: must be nil if the type is not Limited",
            ]
        );
        let bad = json!({"metadata": {"name": "mine"}, "spec": {"type": "Limited",
            "limited": {"nominalConcurrencyShares": -1, "lendablePercent": 101,
                "limitResponse": {"type": "Queue", "queuing": {"queues": 4, "handSize": 5, "queueLengthLimit": -2}}}}});
        assert_eq!(
            errors("PriorityLevelConfiguration", bad),
            [
                "spec.limited.nominalConcurrencyShares: Invalid value: -1: must be a non-negative integer",
                "spec.limited.limitResponse.queuing.queueLengthLimit: Invalid value: -2: must be positive",
                "spec.limited.limitResponse.queuing.handSize: Invalid value: 5: should not be greater than queues (4)",
                "spec.limited.lendablePercent: Invalid value: 101: must be between 0 and 100, inclusive",
            ]
        );
        let entropy = json!({"metadata": {"name": "mine"}, "spec": {"type": "Limited",
            "limited": {"limitResponse": {"type": "Queue", "queuing": {"queues": 128, "handSize": 9}}}}});
        assert_eq!(
            errors("PriorityLevelConfiguration", entropy),
            [
                "spec.limited.limitResponse.queuing.handSize: Invalid value: 9: required entropy bits of deckSize 128 and handSize 9 should not be greater than 60"
            ]
        );
        let limited_without = json!({"metadata": {"name": "mine"}, "spec": {"type": "Limited"}});
        assert_eq!(
            errors("PriorityLevelConfiguration", limited_without),
            ["spec.limited: Required value: must not be empty when type is Limited"]
        );
    }
}
