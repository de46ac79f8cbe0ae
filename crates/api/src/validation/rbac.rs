//! Role, ClusterRole, RoleBinding and ClusterRoleBinding, as upstream's
//! `pkg/apis/rbac/validation` (`ValidateRole`, `ValidateClusterRole`, `ValidateRoleBinding`,
//! `ValidateClusterRoleBinding` and their `...Update`) called the way upstream's
//! `pkg/registry/rbac/*/strategy.go` call them.
//!
//! On update upstream's strategies validate the object and then call `ValidateXxxUpdate`,
//! which validates it again before its own checks: every error of the object itself is
//! reported twice (the Status message lists it once, as upstream's aggregate does).

use serde_json::Value;

use super::meta::{self, label_selector_is_invalid, name_is_dns_subdomain, validate_label_selector_with};
use super::{Path, arr_at, field, go_string_slice, invalid_raw, invalid_str, not_supported, required, str_at};
use crate::status::FieldError;

/// The RBAC API group: the only group a role reference, a user or a group subject may name.
const GROUP_NAME: &str = "rbac.authorization.k8s.io";

/// The subject kinds upstream knows, in its order.
const SUBJECT_KINDS: &[&str] = &["ServiceAccount", "User", "Group"];

/// upstream's `ValidateRBACName`: a name only has to be usable as a path segment
/// (`path.IsValidPathSegmentName`); `generateName` is held to the same rule.
pub(crate) fn path_segment_name(name: &str, _prefix: bool) -> Vec<String> {
    for illegal in [".", ".."] {
        if name == illegal {
            return vec![format!("may not be '{illegal}'")];
        }
    }
    ["/", "%"]
        .iter()
        .filter(|illegal| name.contains(*illegal))
        .map(|illegal| format!("may not contain '{illegal}'"))
        .collect()
}

/// Every error of an RBAC object of `kind`, created (`old` is `None`) or updated.
pub(crate) fn validate(kind: &str, namespaced: bool, obj: &Value, old: Option<&Value>, errs: &mut Vec<FieldError>) {
    // A ClusterRole stored with invalid values in its aggregation selectors may keep them.
    let allow_invalid_values = kind == "ClusterRole" && old.is_some_and(has_invalid_aggregation_selector);
    let validate_object = |errs: &mut Vec<FieldError>| {
        meta::validate_object_meta(obj.get("metadata"), namespaced, path_segment_name, errs);
        match kind {
            "Role" => validate_rules(obj, true, errs),
            "ClusterRole" => {
                validate_rules(obj, false, errs);
                validate_aggregation_rule(obj, allow_invalid_values, errs);
            }
            "RoleBinding" => validate_binding(obj, true, errs),
            "ClusterRoleBinding" => validate_binding(obj, false, errs),
            _ => {}
        }
    };
    validate_object(errs);
    let Some(old) = old else {
        return;
    };
    validate_object(errs);
    meta::validate_object_meta_update(obj.get("metadata"), old.get("metadata"), errs);
    if matches!(kind, "RoleBinding" | "ClusterRoleBinding") {
        let role_ref = field(Some(obj), "roleRef");
        if role_ref_of(role_ref) != role_ref_of(field(Some(old), "roleRef")) {
            errs.push(invalid_raw(
                &Path::new("roleRef"),
                go_role_ref(role_ref),
                "cannot change roleRef",
            ));
        }
    }
}

// ---- roles ------------------------------------------------------------------------------------

/// upstream's `ValidatePolicyRule` on each of `rules`.
fn validate_rules(obj: &Value, namespaced: bool, errs: &mut Vec<FieldError>) {
    let rules = Path::new("rules");
    for (i, rule) in arr_at(Some(obj), "rules").iter().enumerate() {
        validate_policy_rule(Some(rule), namespaced, &rules.index(i), errs);
    }
}

fn validate_policy_rule(rule: Option<&Value>, namespaced: bool, p: &Path, errs: &mut Vec<FieldError>) {
    let len = |key: &str| arr_at(rule, key).len();
    if len("verbs") == 0 {
        errs.push(required(&p.child("verbs"), "verbs must contain at least one value"));
    }
    if len("nonResourceURLs") > 0 {
        let urls = go_string_slice(field(rule, "nonResourceURLs"));
        if namespaced {
            errs.push(invalid_raw(
                &p.child("nonResourceURLs"),
                urls.clone(),
                "namespaced rules cannot apply to non-resource URLs",
            ));
        }
        if len("apiGroups") > 0 || len("resources") > 0 || len("resourceNames") > 0 {
            errs.push(invalid_raw(
                &p.child("nonResourceURLs"),
                urls,
                "rules cannot apply to both regular resources and non-resource URLs",
            ));
        }
        return;
    }
    if len("apiGroups") == 0 {
        errs.push(required(
            &p.child("apiGroups"),
            "resource rules must supply at least one api group",
        ));
    }
    if len("resources") == 0 {
        errs.push(required(
            &p.child("resources"),
            "resource rules must supply at least one resource",
        ));
    }
}

/// The `ValidateClusterRole` part for `aggregationRule`: at least one selector, each a valid
/// label selector that upstream can also turn into a selector.
fn validate_aggregation_rule(obj: &Value, allow_invalid_values: bool, errs: &mut Vec<FieldError>) {
    let Some(rule) = field(Some(obj), "aggregationRule") else {
        return;
    };
    let p = Path::new("aggregationRule").child("clusterRoleSelectors");
    let selectors = arr_at(Some(rule), "clusterRoleSelectors");
    if selectors.is_empty() {
        errs.push(required(
            &p,
            "at least one clusterRoleSelector required if aggregationRule is non-nil",
        ));
    }
    for (i, selector) in selectors.iter().enumerate() {
        let sp = p.index(i);
        validate_label_selector_with(Some(selector), allow_invalid_values, &sp, errs);
        // upstream reports the selector it failed to build, which is nil: "null".
        if label_selector_is_invalid(Some(selector)) {
            errs.push(invalid_str(&sp, "null", "invalid label selector."));
        }
    }
}

/// upstream's clusterrole `hasInvalidLabelValueInLabelSelector`: any of the stored role's
/// aggregation selectors fails validation.
fn has_invalid_aggregation_selector(old: &Value) -> bool {
    let rule = field(Some(old), "aggregationRule");
    arr_at(rule, "clusterRoleSelectors")
        .iter()
        .any(|s| label_selector_is_invalid(Some(s)))
}

// ---- bindings ---------------------------------------------------------------------------------

/// upstream's `ValidateRoleBinding` (`namespaced`) or `ValidateClusterRoleBinding` after the
/// object's metadata.
fn validate_binding(obj: &Value, namespaced: bool, errs: &mut Vec<FieldError>) {
    let role_ref = field(Some(obj), "roleRef");
    let rp = Path::new("roleRef");
    let api_group = str_at(role_ref, "apiGroup");
    if api_group != GROUP_NAME {
        errs.push(not_supported(
            &rp.child("apiGroup"),
            &str_value(api_group),
            &[GROUP_NAME],
        ));
    }
    let kind = str_at(role_ref, "kind");
    let kinds: &[&str] = if namespaced {
        &["Role", "ClusterRole"]
    } else {
        &["ClusterRole"]
    };
    if !kinds.contains(&kind) {
        errs.push(not_supported(&rp.child("kind"), &str_value(kind), kinds));
    }
    let name = str_at(role_ref, "name");
    if name.is_empty() {
        errs.push(required(&rp.child("name"), ""));
    } else {
        for m in path_segment_name(name, false) {
            errs.push(invalid_str(&rp.child("name"), name, &m));
        }
    }
    let sp = Path::new("subjects");
    for (i, subject) in arr_at(Some(obj), "subjects").iter().enumerate() {
        validate_subject(Some(subject), namespaced, &sp.index(i), errs);
    }
}

/// upstream's `ValidateRoleBindingSubject`.
fn validate_subject(subject: Option<&Value>, namespaced: bool, p: &Path, errs: &mut Vec<FieldError>) {
    let name = str_at(subject, "name");
    if name.is_empty() {
        errs.push(required(&p.child("name"), ""));
    }
    let api_group = str_at(subject, "apiGroup");
    match str_at(subject, "kind") {
        "ServiceAccount" => {
            if !name.is_empty() {
                // upstream's ValidateServiceAccountName: a DNS subdomain.
                for m in name_is_dns_subdomain(name, false) {
                    errs.push(invalid_str(&p.child("name"), name, &m));
                }
            }
            if !api_group.is_empty() {
                errs.push(not_supported(&p.child("apiGroup"), &str_value(api_group), &[""]));
            }
            if !namespaced && str_at(subject, "namespace").is_empty() {
                errs.push(required(&p.child("namespace"), ""));
            }
        }
        "User" | "Group" => {
            if api_group != GROUP_NAME {
                errs.push(not_supported(
                    &p.child("apiGroup"),
                    &str_value(api_group),
                    &[GROUP_NAME],
                ));
            }
        }
        other => errs.push(not_supported(&p.child("kind"), &str_value(other), SUBJECT_KINDS)),
    }
}

/// A role reference's three strings (missing ones are Go's "").
fn role_ref_of(role_ref: Option<&Value>) -> (&str, &str, &str) {
    (
        str_at(role_ref, "apiGroup"),
        str_at(role_ref, "kind"),
        str_at(role_ref, "name"),
    )
}

/// Go's `%#v` of upstream's internal `rbac.RoleRef`, the value `cannot change roleRef` shows.
fn go_role_ref(role_ref: Option<&Value>) -> String {
    let (api_group, kind, name) = role_ref_of(role_ref);
    format!("rbac.RoleRef{{APIGroup:{api_group:?}, Kind:{kind:?}, Name:{name:?}}}")
}

fn str_value(s: &str) -> Value {
    Value::String(s.to_string())
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::path_segment_name;
    use crate::validation::test_util::{errors, errors_defaulted};

    const G: &str = "rbac.authorization.k8s.io";

    fn role(rules: Value) -> Value {
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
               "metadata": {"name": "r", "namespace": "d"}, "rules": rules})
    }

    fn cluster_role(extra: Value) -> Value {
        let mut o = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                           "metadata": {"name": "cr"}});
        if let (Some(m), Some(e)) = (o.as_object_mut(), extra.as_object()) {
            for (k, v) in e {
                m.insert(k.clone(), v.clone());
            }
        }
        o
    }

    fn binding(kind: &str, role_ref: Value, subjects: Value) -> Value {
        let metadata = if kind == "RoleBinding" {
            json!({"name": "b", "namespace": "d"})
        } else {
            json!({"name": "b"})
        };
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": metadata,
               "roleRef": role_ref, "subjects": subjects})
    }

    fn view() -> Value {
        json!({"apiGroup": G, "kind": "ClusterRole", "name": "view"})
    }

    #[test]
    fn path_segment_names() {
        assert!(path_segment_name("system:controller:job-controller", false).is_empty());
        assert!(path_segment_name("Upper_and.dots", false).is_empty());
        assert_eq!(path_segment_name(".", false), vec!["may not be '.'"]);
        assert_eq!(path_segment_name("..", true), vec!["may not be '..'"]);
        assert_eq!(
            path_segment_name("a/b%c", false),
            vec!["may not contain '/'", "may not contain '%'"]
        );
    }

    #[test]
    fn valid_roles_and_bindings() {
        let rules = json!([
            {"verbs": ["get", "list"], "apiGroups": [""], "resources": ["pods"], "resourceNames": ["a"]},
            {"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}
        ]);
        assert!(errors(G, "Role", &role(rules.clone()), None).is_empty());
        assert!(errors(G, "Role", &role(json!([])), None).is_empty());
        let mut with_urls = rules.as_array().cloned().unwrap_or_default();
        with_urls.push(json!({"verbs": ["get"], "nonResourceURLs": ["/healthz", "/metrics/*"]}));
        let cr = cluster_role(json!({"rules": with_urls,
            "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"rbac.example.com/aggregate-to-view": "true"}}]}}));
        assert!(errors(G, "ClusterRole", &cr, None).is_empty());
        // Names only need to be path segments: upstream's system roles have colons.
        let mut system = cluster_role(json!({}));
        system["metadata"]["name"] = json!("system:controller:job-controller");
        assert!(errors(G, "ClusterRole", &system, None).is_empty());

        let subjects = json!([
            {"kind": "User", "name": "alice@example.com"},
            {"kind": "Group", "name": "system:masters"},
            {"kind": "ServiceAccount", "name": "default", "namespace": "kube-system"}
        ]);
        for kind in ["RoleBinding", "ClusterRoleBinding"] {
            let b = binding(kind, view(), subjects.clone());
            assert!(errors_defaulted(G, kind, &b, None).is_empty(), "{kind}");
        }
        // A RoleBinding may reference a Role and name service accounts of its own namespace.
        let b = binding(
            "RoleBinding",
            json!({"kind": "Role", "name": "r"}),
            json!([{"kind": "ServiceAccount", "name": "bot"}]),
        );
        assert!(errors_defaulted(G, "RoleBinding", &b, None).is_empty());
    }

    #[test]
    fn names_are_path_segments() {
        let mut r = role(json!([]));
        r["metadata"]["name"] = json!("a/b");
        assert_eq!(
            errors(G, "Role", &r, None),
            vec!["metadata.name: Invalid value: \"a/b\": may not contain '/'"]
        );
        let mut cr = cluster_role(json!({}));
        cr["metadata"]["name"] = json!("..");
        assert_eq!(
            errors(G, "ClusterRole", &cr, None),
            vec!["metadata.name: Invalid value: \"..\": may not be '..'"]
        );
        let mut b = binding("ClusterRoleBinding", view(), json!([]));
        b["metadata"]["namespace"] = json!("d");
        assert_eq!(
            errors(G, "ClusterRoleBinding", &b, None),
            vec!["metadata.namespace: Forbidden: not allowed on this type"]
        );
        let mut b = binding("RoleBinding", view(), json!([]));
        b["metadata"] = json!({"name": "b"});
        assert_eq!(
            errors(G, "RoleBinding", &b, None),
            vec!["metadata.namespace: Required value"]
        );
    }

    #[test]
    fn policy_rules() {
        let r = role(json!([
            {},
            {"verbs": ["get"], "nonResourceURLs": ["/healthz"]},
            {"verbs": ["get"], "apiGroups": [""], "resources": ["pods"], "nonResourceURLs": ["/a", "/b"]},
            {"verbs": ["get"], "resources": ["pods"]},
            {"verbs": ["get"], "apiGroups": [""]}
        ]));
        assert_eq!(
            errors(G, "Role", &r, None),
            vec![
                "rules[0].verbs: Required value: verbs must contain at least one value",
                "rules[0].apiGroups: Required value: resource rules must supply at least one api group",
                "rules[0].resources: Required value: resource rules must supply at least one resource",
                "rules[1].nonResourceURLs: Invalid value: []string{\"/healthz\"}: namespaced rules cannot apply to non-resource URLs",
                "rules[2].nonResourceURLs: Invalid value: []string{\"/a\", \"/b\"}: namespaced rules cannot apply to non-resource URLs",
                "rules[2].nonResourceURLs: Invalid value: []string{\"/a\", \"/b\"}: rules cannot apply to both regular resources and non-resource URLs",
                "rules[3].apiGroups: Required value: resource rules must supply at least one api group",
                "rules[4].resources: Required value: resource rules must supply at least one resource",
            ]
        );
        // A ClusterRole may hold non-resource URLs, never mixed with resources.
        let cr = cluster_role(json!({"rules": [
            {"verbs": [], "nonResourceURLs": ["/healthz"]},
            {"verbs": ["get"], "resourceNames": ["x"], "nonResourceURLs": ["/version"]}
        ]}));
        assert_eq!(
            errors(G, "ClusterRole", &cr, None),
            vec![
                "rules[0].verbs: Required value: verbs must contain at least one value",
                "rules[1].nonResourceURLs: Invalid value: []string{\"/version\"}: rules cannot apply to both regular resources and non-resource URLs",
            ]
        );
    }

    #[test]
    fn aggregation_rules() {
        assert_eq!(
            errors(G, "ClusterRole", &cluster_role(json!({"aggregationRule": {}})), None),
            vec![
                "aggregationRule.clusterRoleSelectors: Required value: at least one clusterRoleSelector required if aggregationRule is non-nil"
            ]
        );
        // A null rule is no rule; an empty selector selects everything and is valid.
        assert!(errors(G, "ClusterRole", &cluster_role(json!({"aggregationRule": null})), None).is_empty());
        let empty = cluster_role(json!({"aggregationRule": {"clusterRoleSelectors": [{}]}}));
        assert!(errors(G, "ClusterRole", &empty, None).is_empty());

        let bad = cluster_role(json!({"aggregationRule": {"clusterRoleSelectors": [
            {"matchLabels": {"ok": "true"}},
            {"matchExpressions": [{"key": "k", "operator": "Exists", "values": ["x"]}]},
            {"matchExpressions": [{"key": "k", "operator": "In", "values": ["-x"]}]}
        ]}}));
        let e = errors(G, "ClusterRole", &bad, None);
        assert_eq!(e.len(), 4, "{e:?}");
        assert_eq!(
            e[0],
            "aggregationRule.clusterRoleSelectors[1].matchExpressions[0].values: Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'"
        );
        assert_eq!(
            e[1],
            "aggregationRule.clusterRoleSelectors[1]: Invalid value: \"null\": invalid label selector."
        );
        assert!(
            e[2].starts_with(
                "aggregationRule.clusterRoleSelectors[2].matchExpressions[0].values[0]: Invalid value: \"-x\": a valid label must be"
            ),
            "{}",
            e[2]
        );
        assert_eq!(
            e[3],
            "aggregationRule.clusterRoleSelectors[2]: Invalid value: \"null\": invalid label selector."
        );
    }

    #[test]
    fn aggregation_selector_values_stored_invalid_may_stay() {
        let stored = cluster_role(json!({
            "metadata": {"name": "cr", "resourceVersion": "3"},
            "aggregationRule": {"clusterRoleSelectors": [
                {"matchExpressions": [{"key": "k", "operator": "In", "values": ["-x"]}]}
            ]}
        }));
        let mut updated = stored.clone();
        updated["metadata"]["labels"] = json!({"team": "a"});
        // The values are let through; upstream still cannot build the selector, once per pass.
        assert_eq!(
            errors(G, "ClusterRole", &updated, Some(&stored)),
            vec![
                "aggregationRule.clusterRoleSelectors[0]: Invalid value: \"null\": invalid label selector.",
                "aggregationRule.clusterRoleSelectors[0]: Invalid value: \"null\": invalid label selector.",
            ]
        );
        // A role stored valid gets no such allowance.
        let valid = cluster_role(json!({"aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"a": "b"}}]}}));
        let e = errors(G, "ClusterRole", &updated, Some(&valid));
        assert_eq!(e.len(), 4, "{e:?}");
        assert!(e[0].contains("values[0]: Invalid value: \"-x\""), "{}", e[0]);
    }

    #[test]
    fn role_refs() {
        let no_ref = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                            "metadata": {"name": "b", "namespace": "d"}});
        // Defaulting gives the reference its group; kind and name stay empty.
        assert_eq!(
            errors_defaulted(G, "RoleBinding", &no_ref, None),
            vec![
                "roleRef.kind: Unsupported value: \"\": supported values: \"Role\", \"ClusterRole\"",
                "roleRef.name: Required value",
            ]
        );
        let b = binding(
            "RoleBinding",
            json!({"apiGroup": "example.com", "kind": "Secret", "name": "a%b"}),
            json!([]),
        );
        assert_eq!(
            errors(G, "RoleBinding", &b, None),
            vec![
                "roleRef.apiGroup: Unsupported value: \"example.com\": supported values: \"rbac.authorization.k8s.io\"",
                "roleRef.kind: Unsupported value: \"Secret\": supported values: \"Role\", \"ClusterRole\"",
                "roleRef.name: Invalid value: \"a%b\": may not contain '%'",
            ]
        );
        let b = binding(
            "ClusterRoleBinding",
            json!({"apiGroup": G, "kind": "Role", "name": "r"}),
            json!([]),
        );
        assert_eq!(
            errors(G, "ClusterRoleBinding", &b, None),
            vec!["roleRef.kind: Unsupported value: \"Role\": supported values: \"ClusterRole\""]
        );
    }

    #[test]
    fn subjects() {
        let subjects = json!([
            {"kind": "User", "name": ""},
            {"kind": "User", "name": "u", "apiGroup": "example.com"},
            {"kind": "Group", "name": "g", "apiGroup": ""},
            {"kind": "ServiceAccount", "name": "Bad_Name", "apiGroup": G},
            {"kind": "ServiceAccount", "name": "bot"},
            {"kind": "Robot", "name": "r2"},
            {"name": "nameless-kind"}
        ]);
        let b = binding("RoleBinding", view(), subjects.clone());
        let e = errors(G, "RoleBinding", &b, None);
        assert_eq!(
            e,
            vec![
                "subjects[0].name: Required value".to_string(),
                "subjects[0].apiGroup: Unsupported value: \"\": supported values: \"rbac.authorization.k8s.io\"".to_string(),
                "subjects[1].apiGroup: Unsupported value: \"example.com\": supported values: \"rbac.authorization.k8s.io\"".to_string(),
                "subjects[2].apiGroup: Unsupported value: \"\": supported values: \"rbac.authorization.k8s.io\"".to_string(),
                format!(
                    "subjects[3].name: Invalid value: \"Bad_Name\": {}",
                    crate::validation::is_dns1123_subdomain("Bad_Name")[0]
                ),
                "subjects[3].apiGroup: Unsupported value: \"rbac.authorization.k8s.io\": supported values: \"\"".to_string(),
                "subjects[5].kind: Unsupported value: \"Robot\": supported values: \"ServiceAccount\", \"User\", \"Group\"".to_string(),
                "subjects[6].kind: Unsupported value: \"\": supported values: \"ServiceAccount\", \"User\", \"Group\"".to_string(),
            ]
        );
        // A ClusterRoleBinding's service account subjects name their namespace.
        let b = binding(
            "ClusterRoleBinding",
            view(),
            json!([{"kind": "ServiceAccount", "name": "bot"}, {"kind": "ServiceAccount", "name": "ok", "namespace": "ci"}]),
        );
        assert_eq!(
            errors_defaulted(G, "ClusterRoleBinding", &b, None),
            vec!["subjects[0].namespace: Required value"]
        );
    }

    #[test]
    fn role_ref_cannot_change() {
        for kind in ["RoleBinding", "ClusterRoleBinding"] {
            let mut old = binding(kind, view(), json!([{"kind": "User", "name": "alice"}]));
            old["metadata"]["resourceVersion"] = json!("5");
            let mut same = old.clone();
            same["subjects"] = json!([{"kind": "Group", "name": "devs"}]);
            assert!(errors_defaulted(G, kind, &same, Some(&old)).is_empty(), "{kind}");

            let mut changed = old.clone();
            changed["roleRef"]["name"] = json!("edit");
            assert_eq!(
                errors_defaulted(G, kind, &changed, Some(&old)),
                vec![
                    "roleRef: Invalid value: rbac.RoleRef{APIGroup:\"rbac.authorization.k8s.io\", Kind:\"ClusterRole\", Name:\"edit\"}: cannot change roleRef"
                ],
                "{kind}"
            );
        }
        // The stored binding is defaulted before the comparison: leaving the group out is no change.
        let stored = binding("RoleBinding", json!({"kind": "Role", "name": "r"}), json!([]));
        let explicit = binding(
            "RoleBinding",
            json!({"apiGroup": G, "kind": "Role", "name": "r"}),
            json!([]),
        );
        assert!(errors_defaulted(G, "RoleBinding", &explicit, Some(&stored)).is_empty());
    }

    #[test]
    fn updates_report_the_object_twice_as_upstream() {
        let old = binding("RoleBinding", view(), json!([]));
        let mut new = old.clone();
        new["subjects"] = json!([{"kind": "User", "name": "u", "apiGroup": "x"}]);
        new["roleRef"]["kind"] = json!("Role");
        let line = "subjects[0].apiGroup: Unsupported value: \"x\": supported values: \"rbac.authorization.k8s.io\"";
        assert_eq!(
            errors(G, "RoleBinding", &new, Some(&old)),
            vec![
                line.to_string(),
                line.to_string(),
                "roleRef: Invalid value: rbac.RoleRef{APIGroup:\"rbac.authorization.k8s.io\", Kind:\"Role\", Name:\"view\"}: cannot change roleRef".to_string(),
            ]
        );
        let mut renamed = old.clone();
        renamed["metadata"]["name"] = json!("other");
        assert_eq!(
            errors(G, "RoleBinding", &renamed, Some(&old)),
            vec!["metadata.name: Invalid value: \"other\": field is immutable"]
        );
        let mut r = role(json!([{"verbs": []}]));
        let stored = r.clone();
        r["metadata"]["labels"] = json!({"a": "b"});
        assert_eq!(errors(G, "Role", &r, Some(&stored)).len(), 6);
    }
}
