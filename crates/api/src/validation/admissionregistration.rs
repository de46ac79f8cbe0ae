//! ValidatingWebhookConfiguration and MutatingWebhookConfiguration (upstream's
//! `pkg/apis/admissionregistration/validation`, admissionregistration/v1): each webhook's name
//! (fully qualified, unique in its configuration), rules, policies, selectors, timeout,
//! admission review versions, side effects and client configuration, with upstream's messages.
//!
//! ValidatingAdmissionPolicy and ValidatingAdmissionPolicyBinding as well: match constraints,
//! parameters, variables and validations, their CEL expressions compiled (an expression that
//! does not compile refuses the object with cel-go's error). Webhooks' `matchConditions` are
//! compiled the same way.

use std::collections::HashSet;

use serde_json::Value;

use super::meta::{is_dns1035_label, is_dns1123_subdomain, validate_label_selector};
use super::{Path, arr_at, duplicate, field, forbidden, invalid, invalid_str, not_supported, required, str_at};
use crate::status::FieldError;

const OPERATIONS: &[&str] = &["*", "CONNECT", "CREATE", "DELETE", "UPDATE"];
const SCOPES: &[&str] = &["*", "Cluster", "Namespaced"];
const FAILURE_POLICIES: &[&str] = &["Fail", "Ignore"];
const MATCH_POLICIES: &[&str] = &["Equivalent", "Exact"];
const REINVOCATION_POLICIES: &[&str] = &["IfNeeded", "Never"];
/// v1 accepts only webhooks without side effects (or none on dry run).
const SIDE_EFFECTS: &[&str] = &["None", "NoneOnDryRun"];
/// The AdmissionReview versions the API server can send.
pub const ACCEPTED_REVIEW_VERSIONS: &[&str] = &["v1", "v1beta1"];

/// upstream's `ValidateValidatingWebhookConfiguration` / `ValidateMutatingWebhookConfiguration`
/// (metadata is checked by the caller).
pub(crate) fn validate_webhook_configuration(obj: &Value, mutating: bool, errs: &mut Vec<FieldError>) {
    let p = Path::new("webhooks");
    let mut names = HashSet::new();
    for (i, hook) in arr_at(Some(obj), "webhooks").iter().enumerate() {
        let hp = p.index(i);
        let name = str_at(Some(hook), "name");
        validate_webhook(hook, mutating, &hp, errs);
        if !name.is_empty() && !names.insert(name) {
            errs.push(duplicate(&hp.child("name"), &Value::String(name.to_string())));
        }
    }
}

fn validate_webhook(hook: &Value, mutating: bool, p: &Path, errs: &mut Vec<FieldError>) {
    is_fully_qualified_name(str_at(Some(hook), "name"), &p.child("name"), errs);
    for (i, rule) in arr_at(Some(hook), "rules").iter().enumerate() {
        validate_rule_with_operations(rule, &p.child("rules").index(i), errs);
    }
    enum_field(hook, "failurePolicy", FAILURE_POLICIES, p, errs);
    enum_field(hook, "matchPolicy", MATCH_POLICIES, p, errs);
    match field(Some(hook), "sideEffects") {
        None => errs.push(required(
            &p.child("sideEffects"),
            &format!("must specify one of {}", SIDE_EFFECTS.join(", ")),
        )),
        Some(v) if !v.as_str().is_some_and(|s| SIDE_EFFECTS.contains(&s)) => {
            errs.push(not_supported(&p.child("sideEffects"), v, SIDE_EFFECTS));
        }
        Some(_) => {}
    }
    if let Some(t) = field(Some(hook), "timeoutSeconds")
        && !t.as_i64().is_some_and(|t| (1..=30).contains(&t))
    {
        errs.push(invalid(
            &p.child("timeoutSeconds"),
            t,
            "the timeout value must be between 1 and 30 seconds",
        ));
    }
    if let Some(sel) = field(Some(hook), "namespaceSelector") {
        validate_label_selector(Some(sel), &p.child("namespaceSelector"), errs);
    }
    if let Some(sel) = field(Some(hook), "objectSelector") {
        validate_label_selector(Some(sel), &p.child("objectSelector"), errs);
    }
    validate_review_versions(
        arr_at(Some(hook), "admissionReviewVersions"),
        &p.child("admissionReviewVersions"),
        errs,
    );
    validate_client_config(field(Some(hook), "clientConfig"), &p.child("clientConfig"), errs);
    if mutating {
        enum_field(hook, "reinvocationPolicy", REINVOCATION_POLICIES, p, errs);
    }
    validate_match_conditions(
        arr_at(Some(hook), "matchConditions"),
        &p.child("matchConditions"),
        WEBHOOK_VARS,
        errs,
    );
}

/// The variables a webhook's match conditions see.
pub const WEBHOOK_VARS: &[&str] = &["object", "oldObject", "request"];
/// The variables a policy's expressions see.
pub const POLICY_VARS: &[&str] = &[
    "object",
    "oldObject",
    "request",
    "params",
    "namespaceObject",
    "variables",
];
/// upstream's limit on match conditions.
const MAX_MATCH_CONDITIONS: usize = 64;
const FAILURE_REASONS: &[&str] = &["Unauthorized", "Forbidden", "Invalid", "RequestEntityTooLarge"];
const VALIDATION_ACTIONS: &[&str] = &["Audit", "Deny", "Warn"];
const PARAM_NOT_FOUND_ACTIONS: &[&str] = &["Allow", "Deny"];

/// An expression compiled for `vars`: its error as upstream's field error.
fn compile_expression(expr: &Value, p: &Path, vars: &[&str], errs: &mut Vec<FieldError>) {
    let text = expr.as_str().unwrap_or("");
    if text.trim().is_empty() {
        errs.push(required(p, ""));
        return;
    }
    if let Err(e) = crate::cel::compile(text, vars) {
        errs.push(invalid(p, expr, &format!("compilation failed: {e}")));
    }
}

/// upstream's `validateMatchConditions`: unique qualified names, compiled expressions.
pub(crate) fn validate_match_conditions(conds: &[Value], p: &Path, vars: &[&str], errs: &mut Vec<FieldError>) {
    if conds.len() > MAX_MATCH_CONDITIONS {
        errs.push(FieldError {
            kind: crate::status::FieldErrorKind::TooMany(conds.len(), MAX_MATCH_CONDITIONS),
            field: p.as_str().to_string(),
            detail: String::new(),
        });
    }
    let mut names = HashSet::new();
    for (i, c) in conds.iter().enumerate() {
        let cp = p.index(i);
        let name = str_at(Some(c), "name");
        if name.is_empty() {
            errs.push(required(&cp.child("name"), ""));
        } else {
            let bad = super::meta::is_qualified_name(name);
            if !bad.is_empty() {
                errs.push(invalid_str(&cp.child("name"), name, &bad.join(",")));
            }
            if !names.insert(name) {
                errs.push(duplicate(&cp.child("name"), &Value::String(name.to_string())));
            }
        }
        compile_expression(
            c.get("expression").unwrap_or(&Value::Null),
            &cp.child("expression"),
            vars,
            errs,
        );
    }
}

/// `matchConstraints` of a policy (rules required) or `matchResources` of a binding.
fn validate_match_resources(mr: &Value, p: &Path, policy: bool, errs: &mut Vec<FieldError>) {
    enum_field(mr, "matchPolicy", MATCH_POLICIES, p, errs);
    if let Some(sel) = field(Some(mr), "namespaceSelector") {
        validate_label_selector(Some(sel), &p.child("namespaceSelector"), errs);
    }
    if let Some(sel) = field(Some(mr), "objectSelector") {
        validate_label_selector(Some(sel), &p.child("objectSelector"), errs);
    }
    let rules = arr_at(Some(mr), "resourceRules");
    if policy && rules.is_empty() {
        errs.push(required(&p.child("resourceRules"), ""));
    }
    for key in ["resourceRules", "excludeResourceRules"] {
        for (i, rule) in arr_at(Some(mr), key).iter().enumerate() {
            validate_rule_with_operations(rule, &p.child(key).index(i), errs);
        }
    }
}

/// upstream's `ValidateValidatingAdmissionPolicy` (metadata is checked by the caller).
pub(crate) fn validate_admission_policy(obj: &Value, errs: &mut Vec<FieldError>) {
    let sp = Path::new("spec");
    let spec = field(Some(obj), "spec");
    match field(spec, "matchConstraints") {
        None => errs.push(required(&sp.child("matchConstraints"), "")),
        Some(mc) => validate_match_resources(mc, &sp.child("matchConstraints"), true, errs),
    }
    if let Some(s) = spec {
        enum_field(s, "failurePolicy", FAILURE_POLICIES, &sp, errs);
    }
    if let Some(pk) = field(spec, "paramKind") {
        let pp = sp.child("paramKind");
        let api_version = str_at(Some(pk), "apiVersion");
        if api_version.is_empty() {
            errs.push(required(&pp.child("apiVersion"), ""));
        } else if api_version.split('/').count() > 2 {
            errs.push(invalid_str(
                &pp.child("apiVersion"),
                api_version,
                "apiVersion must be a valid group version",
            ));
        }
        if str_at(Some(pk), "kind").is_empty() {
            errs.push(required(&pp.child("kind"), ""));
        }
    }
    let validations = arr_at(spec, "validations");
    if validations.is_empty() && arr_at(spec, "auditAnnotations").is_empty() {
        errs.push(required(
            &sp.child("validations"),
            "validations or auditAnnotations must contain at least one item",
        ));
    }
    validate_match_conditions(
        arr_at(spec, "matchConditions"),
        &sp.child("matchConditions"),
        POLICY_VARS,
        errs,
    );
    let mut var_names = HashSet::new();
    for (i, v) in arr_at(spec, "variables").iter().enumerate() {
        let vp = sp.child("variables").index(i);
        let name = str_at(Some(v), "name");
        if name.is_empty() {
            errs.push(required(&vp.child("name"), ""));
        } else if !is_cel_identifier(name) {
            errs.push(invalid_str(
                &vp.child("name"),
                name,
                "name is not a valid CEL identifier",
            ));
        } else if !var_names.insert(name) {
            errs.push(duplicate(&vp.child("name"), &Value::String(name.to_string())));
        }
        compile_expression(
            v.get("expression").unwrap_or(&Value::Null),
            &vp.child("expression"),
            POLICY_VARS,
            errs,
        );
    }
    for (i, v) in validations.iter().enumerate() {
        let vp = sp.child("validations").index(i);
        compile_expression(
            v.get("expression").unwrap_or(&Value::Null),
            &vp.child("expression"),
            POLICY_VARS,
            errs,
        );
        let message = str_at(Some(v), "message");
        if message.contains('\n') || message.contains('\r') {
            errs.push(invalid_str(
                &vp.child("message"),
                message,
                "message must not contain line breaks",
            ));
        }
        if let Some(me) = field(Some(v), "messageExpression")
            && !me.as_str().unwrap_or("").trim().is_empty()
        {
            compile_expression(me, &vp.child("messageExpression"), POLICY_VARS, errs);
        }
        if let Some(r) = field(Some(v), "reason")
            && !r.as_str().is_some_and(|r| FAILURE_REASONS.contains(&r))
        {
            errs.push(not_supported(&vp.child("reason"), r, FAILURE_REASONS));
        }
    }
    for (i, a) in arr_at(spec, "auditAnnotations").iter().enumerate() {
        let ap = sp.child("auditAnnotations").index(i);
        if str_at(Some(a), "key").is_empty() {
            errs.push(required(&ap.child("key"), ""));
        }
        compile_expression(
            a.get("valueExpression").unwrap_or(&Value::Null),
            &ap.child("valueExpression"),
            POLICY_VARS,
            errs,
        );
    }
}

/// CEL identifiers: a letter or `_`, then letters, digits and `_`.
fn is_cel_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// upstream's `ValidateValidatingAdmissionPolicyBinding`.
pub(crate) fn validate_admission_policy_binding(obj: &Value, errs: &mut Vec<FieldError>) {
    let sp = Path::new("spec");
    let spec = field(Some(obj), "spec");
    if str_at(spec, "policyName").is_empty() {
        errs.push(required(&sp.child("policyName"), ""));
    }
    if let Some(mr) = field(spec, "matchResources") {
        validate_match_resources(mr, &sp.child("matchResources"), false, errs);
    }
    if let Some(pr) = field(spec, "paramRef") {
        let pp = sp.child("paramRef");
        let name = str_at(Some(pr), "name");
        let selector = field(Some(pr), "selector");
        match (name.is_empty(), selector) {
            (true, None) => errs.push(required(&pp, "one of name or selector must be specified")),
            (false, Some(_)) => errs.push(forbidden(&pp.child("name"), "name and selector are mutually exclusive")),
            (_, Some(sel)) => validate_label_selector(Some(sel), &pp.child("selector"), errs),
            _ => {}
        }
        match field(Some(pr), "parameterNotFoundAction") {
            None => errs.push(required(&pp.child("parameterNotFoundAction"), "")),
            Some(a) if !a.as_str().is_some_and(|a| PARAM_NOT_FOUND_ACTIONS.contains(&a)) => {
                errs.push(not_supported(
                    &pp.child("parameterNotFoundAction"),
                    a,
                    PARAM_NOT_FOUND_ACTIONS,
                ));
            }
            Some(_) => {}
        }
    }
    let actions = arr_at(spec, "validationActions");
    let ap = sp.child("validationActions");
    if actions.is_empty() {
        errs.push(required(&ap, "at least one validation action is required"));
    }
    let mut seen = HashSet::new();
    for (i, a) in actions.iter().enumerate() {
        match a.as_str() {
            Some(s) if VALIDATION_ACTIONS.contains(&s) => {
                if !seen.insert(s) {
                    errs.push(duplicate(&ap.index(i), a));
                }
            }
            _ => errs.push(not_supported(&ap.index(i), a, VALIDATION_ACTIONS)),
        }
    }
    if seen.contains("Deny") && seen.contains("Warn") {
        // Go's %#v of the list, as upstream's message shows it.
        let shown: Vec<String> = actions.iter().map(crate::status::render_value).collect();
        errs.push(FieldError {
            kind: crate::status::FieldErrorKind::Invalid(format!(
                "[]admissionregistration.ValidationAction{{{}}}",
                shown.join(", ")
            )),
            field: ap.as_str().to_string(),
            detail: "must not contain both Deny and Warn (repeating the same validation failure information in the API response and headers serves no purpose)".to_string(),
        });
    }
}

fn enum_field(hook: &Value, key: &str, supported: &[&str], p: &Path, errs: &mut Vec<FieldError>) {
    if let Some(v) = field(Some(hook), key)
        && !v.as_str().is_some_and(|s| supported.contains(&s))
    {
        errs.push(not_supported(&p.child(key), v, supported));
    }
}

/// upstream's `utilvalidation.IsFullyQualifiedName`.
fn is_fully_qualified_name(name: &str, p: &Path, errs: &mut Vec<FieldError>) {
    if name.is_empty() {
        errs.push(required(p, ""));
        return;
    }
    let name = name.strip_suffix('.').unwrap_or(name);
    let bad = is_dns1123_subdomain(name);
    if !bad.is_empty() {
        errs.push(invalid_str(p, name, &bad.join(",")));
        return;
    }
    if name.split('.').count() < 3 {
        errs.push(invalid_str(
            p,
            name,
            "should be a domain with at least three segments separated by dots",
        ));
    }
}

fn strings(v: &[Value]) -> Vec<&str> {
    v.iter().map(|s| s.as_str().unwrap_or("")).collect()
}

fn has_wildcard(v: &[&str]) -> bool {
    v.contains(&"*")
}

fn validate_rule_with_operations(rule: &Value, p: &Path, errs: &mut Vec<FieldError>) {
    let ops_v = arr_at(Some(rule), "operations");
    let ops = strings(ops_v);
    if ops.is_empty() {
        errs.push(required(&p.child("operations"), ""));
    }
    if ops.len() > 1 && has_wildcard(&ops) {
        errs.push(invalid(
            &p.child("operations"),
            &Value::Array(ops_v.to_vec()),
            "if '*' is present, must not specify other operations",
        ));
    }
    for (i, op) in ops_v.iter().enumerate() {
        if !op.as_str().is_some_and(|o| OPERATIONS.contains(&o)) {
            errs.push(not_supported(&p.child("operations").index(i), op, OPERATIONS));
        }
    }
    validate_rule(rule, p, errs);
}

/// upstream's `validateRule` (subresources allowed).
fn validate_rule(rule: &Value, p: &Path, errs: &mut Vec<FieldError>) {
    let groups_v = arr_at(Some(rule), "apiGroups");
    let groups = strings(groups_v);
    if groups.is_empty() {
        errs.push(required(&p.child("apiGroups"), ""));
    }
    if groups.len() > 1 && has_wildcard(&groups) {
        errs.push(invalid(
            &p.child("apiGroups"),
            &Value::Array(groups_v.to_vec()),
            "if '*' is present, must not specify other API groups",
        ));
    }
    let versions_v = arr_at(Some(rule), "apiVersions");
    let versions = strings(versions_v);
    if versions.is_empty() {
        errs.push(required(&p.child("apiVersions"), ""));
    }
    if versions.len() > 1 && has_wildcard(&versions) {
        errs.push(invalid(
            &p.child("apiVersions"),
            &Value::Array(versions_v.to_vec()),
            "if '*' is present, must not specify other API versions",
        ));
    }
    for (i, v) in versions.iter().enumerate() {
        if v.is_empty() {
            errs.push(required(&p.child("apiVersions").index(i), ""));
        }
    }
    validate_resources(arr_at(Some(rule), "resources"), &p.child("resources"), errs);
    if let Some(scope) = field(Some(rule), "scope")
        && !scope.as_str().is_some_and(|s| SCOPES.contains(&s))
    {
        errs.push(not_supported(&p.child("scope"), scope, SCOPES));
    }
}

/// upstream's `validateResources`: `*`, `*/*`, `x/*`, `*/x` and their conflicts.
fn validate_resources(resources_v: &[Value], p: &Path, errs: &mut Vec<FieldError>) {
    let resources = strings(resources_v);
    if resources.is_empty() {
        errs.push(required(p, ""));
    }
    let mut wildcard_sub_of: HashSet<&str> = HashSet::new();
    let mut wildcard_res_for: HashSet<&str> = HashSet::new();
    let mut double_wildcard = false;
    let mut single_wildcard = false;
    let mut without_subresource = false;
    for (i, rs) in resources.iter().enumerate() {
        if rs.is_empty() {
            errs.push(required(&p.index(i), ""));
            continue;
        }
        if *rs == "*/*" {
            double_wildcard = true;
        }
        if *rs == "*" {
            single_wildcard = true;
        }
        let Some((res, sub)) = rs.split_once('/') else {
            without_subresource = *rs != "*";
            continue;
        };
        if wildcard_sub_of.contains(res) {
            errs.push(invalid_str(
                &p.index(i),
                rs,
                &format!("if '{res}/*' is present, must not specify {rs}"),
            ));
        }
        if wildcard_res_for.contains(sub) {
            errs.push(invalid_str(
                &p.index(i),
                rs,
                &format!("if '*/{sub}' is present, must not specify {rs}"),
            ));
        }
        if sub == "*" {
            wildcard_sub_of.insert(res);
        }
        if res == "*" {
            wildcard_res_for.insert(sub);
        }
    }
    if resources.len() > 1 && double_wildcard {
        errs.push(invalid(
            p,
            &Value::Array(resources_v.to_vec()),
            "if '*/*' is present, must not specify other resources",
        ));
    }
    if single_wildcard && without_subresource {
        errs.push(invalid(
            p,
            &Value::Array(resources_v.to_vec()),
            "if '*' is present, must not specify other resources without subresources",
        ));
    }
}

/// upstream's `validateAdmissionReviewVersions` (required in v1).
fn validate_review_versions(versions: &[Value], p: &Path, errs: &mut Vec<FieldError>) {
    if versions.is_empty() {
        errs.push(required(
            p,
            &format!("must specify one of {}", ACCEPTED_REVIEW_VERSIONS.join(", ")),
        ));
        return;
    }
    let mut seen = HashSet::new();
    let mut accepted = false;
    for (i, v) in versions.iter().enumerate() {
        let s = v.as_str().unwrap_or("");
        if !seen.insert(s) {
            errs.push(invalid_str(&p.index(i), s, "duplicate version"));
            continue;
        }
        for m in is_dns1035_label(s) {
            errs.push(invalid_str(&p.index(i), s, &m));
        }
        accepted |= ACCEPTED_REVIEW_VERSIONS.contains(&s);
    }
    if !accepted {
        errs.push(invalid(
            p,
            &Value::Array(versions.to_vec()),
            &format!("must include at least one of {}", ACCEPTED_REVIEW_VERSIONS.join(", ")),
        ));
    }
}

fn validate_client_config(cc: Option<&Value>, p: &Path, errs: &mut Vec<FieldError>) {
    let url = field(cc, "url");
    let service = field(cc, "service");
    match (url, service) {
        (Some(_), Some(_)) | (None, None) => {
            errs.push(required(p, "exactly one of url or service is required"));
        }
        (Some(u), None) => validate_webhook_url(u.as_str().unwrap_or(""), &p.child("url"), errs),
        (None, Some(s)) => validate_webhook_service(s, &p.child("service"), errs),
    }
    if let Some(ca) = field(cc, "caBundle").and_then(Value::as_str).filter(|c| !c.is_empty())
        && !is_certificate_bundle(ca)
    {
        // A bundle that holds no certificate could never verify the webhook: refused now, not
        // found out at the first call.
        errs.push(invalid(
            &p.child("caBundle"),
            &Value::String("(bytes)".into()),
            "must be a PEM bundle of one or more X.509 certificates",
        ));
    }
}

/// Whether `b64` is the base64 of PEM blocks of which at least one is a certificate that parses.
pub fn is_certificate_bundle(b64: &str) -> bool {
    use base64::Engine;
    let Ok(pem) = base64::engine::general_purpose::STANDARD.decode(b64) else {
        return false;
    };
    let mut any = false;
    for block in x509_parser::pem::Pem::iter_from_buffer(&pem) {
        let Ok(block) = block else { return false };
        if block.label == "CERTIFICATE" {
            if block.parse_x509().is_err() {
                return false;
            }
            any = true;
        }
    }
    any
}

/// The parts of a URL as Go's `url.Parse` splits them.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct UrlParts<'a> {
    pub scheme: &'a str,
    pub user: Option<&'a str>,
    pub host: &'a str,
    pub path: &'a str,
    pub query: &'a str,
    pub fragment: &'a str,
}

pub fn split_url(url: &str) -> UrlParts<'_> {
    let (rest, fragment) = url.split_once('#').unwrap_or((url, ""));
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let Some((scheme, rest)) = rest.split_once("://") else {
        return UrlParts {
            path: rest,
            query,
            fragment,
            ..Default::default()
        };
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let (user, host) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    UrlParts {
        scheme,
        user,
        host,
        path,
        query,
        fragment,
    }
}

/// upstream's `webhook.ValidateWebhookURL` with https forced.
fn validate_webhook_url(url: &str, p: &Path, errs: &mut Vec<FieldError>) {
    const FORM: &str = "; desired format: https://host[/path]";
    let u = split_url(url);
    if u.scheme != "https" {
        errs.push(invalid_str(
            p,
            u.scheme,
            &format!("'https' is the only allowed URL scheme{FORM}"),
        ));
    }
    if u.host.is_empty() {
        errs.push(invalid_str(p, u.host, &format!("host must be specified{FORM}")));
    }
    if let Some(user) = u.user {
        errs.push(invalid_str(p, user, "user information is not permitted in the URL"));
    }
    if !u.fragment.is_empty() {
        errs.push(invalid_str(p, u.fragment, "fragments are not permitted in the URL"));
    }
    if !u.query.is_empty() {
        errs.push(invalid_str(p, u.query, "query parameters are not permitted in the URL"));
    }
}

/// upstream's `webhook.ValidateWebhookService`.
fn validate_webhook_service(svc: &Value, p: &Path, errs: &mut Vec<FieldError>) {
    if str_at(Some(svc), "namespace").is_empty() {
        errs.push(required(&p.child("namespace"), "service namespace is required"));
    }
    if str_at(Some(svc), "name").is_empty() {
        errs.push(required(&p.child("name"), "service name is required"));
    }
    if let Some(port) = field(Some(svc), "port")
        && !port.as_i64().is_some_and(|n| (1..=65535).contains(&n))
    {
        errs.push(invalid(
            &p.child("port"),
            port,
            "port is not valid: must be between 1 and 65535, inclusive",
        ));
    }
    let Some(path) = field(Some(svc), "path").and_then(Value::as_str) else {
        return;
    };
    if path.is_empty() || path == "/" {
        return;
    }
    let pp = p.child("path");
    if path == "//" {
        errs.push(invalid_str(&pp, path, "segment[0] may not be empty"));
    }
    if !path.starts_with('/') {
        errs.push(invalid_str(&pp, path, "must start with a '/'"));
    }
    let check = &path[1.min(path.len())..];
    let check = check.strip_suffix('/').unwrap_or(check);
    for (i, step) in check.split('/').enumerate() {
        if step.is_empty() {
            errs.push(invalid_str(&pp, path, &format!("segment[{i}] may not be empty")));
            continue;
        }
        for m in is_dns1123_subdomain(step) {
            errs.push(invalid_str(&pp, path, &format!("segment[{i}]: {m}")));
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn errors(obj: Value, mutating: bool) -> Vec<String> {
        let mut errs = Vec::new();
        validate_webhook_configuration(&obj, mutating, &mut errs);
        errs.iter().map(|e| format!("{}: {}", e.field, e.body())).collect()
    }

    fn hook() -> Value {
        json!({
            "name": "deny.example.com",
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"]}],
            "clientConfig": {"url": "https://127.0.0.1:8443/validate"},
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
        })
    }

    #[test]
    fn a_valid_webhook_passes() {
        assert_eq!(errors(json!({"webhooks": [hook()]}), false), Vec::<String>::new());
    }

    #[test]
    fn a_ca_bundle_must_hold_a_certificate() {
        use base64::Engine;
        let b64 = |s: &[u8]| base64::engine::general_purpose::STANDARD.encode(s);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["hook.example.com".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let mut h = hook();
        h["clientConfig"]["caBundle"] = json!(b64(cert.pem().as_bytes()));
        assert_eq!(errors(json!({"webhooks": [h.clone()]}), true), Vec::<String>::new());
        for bad in [
            b64(b"not a certificate"),
            "%%%".to_string(),
            b64(key.serialize_pem().as_bytes()),
        ] {
            h["clientConfig"]["caBundle"] = json!(bad);
            assert_eq!(
                errors(json!({"webhooks": [h.clone()]}), true),
                [
                    "webhooks[0].clientConfig.caBundle: Invalid value: \"(bytes)\": must be a PEM bundle of one or more X.509 certificates"
                ]
            );
        }
    }

    #[test]
    fn upstream_messages() {
        let mut h = hook();
        h["name"] = json!("deny");
        h["sideEffects"] = Value::Null;
        h["admissionReviewVersions"] = json!([]);
        h["timeoutSeconds"] = json!(31);
        h["clientConfig"] = json!({"url": "http://x/y?a=b"});
        h["rules"][0]["resources"] = json!(["*/*", "pods"]);
        h["rules"][0]["operations"] = json!(["*", "CREATE"]);
        let errs = errors(json!({"webhooks": [h]}), false);
        assert!(errs.contains(&"webhooks[0].name: Invalid value: \"deny\": should be a domain with at least three segments separated by dots".to_string()), "{errs:?}");
        assert!(
            errs.contains(
                &"webhooks[0].sideEffects: Required value: must specify one of None, NoneOnDryRun".to_string()
            ),
            "{errs:?}"
        );
        assert!(
            errs.contains(
                &"webhooks[0].admissionReviewVersions: Required value: must specify one of v1, v1beta1".to_string()
            ),
            "{errs:?}"
        );
        assert!(
            errs.contains(
                &"webhooks[0].timeoutSeconds: Invalid value: 31: the timeout value must be between 1 and 30 seconds"
                    .to_string()
            ),
            "{errs:?}"
        );
        assert!(errs.contains(&"webhooks[0].clientConfig.url: Invalid value: \"http\": 'https' is the only allowed URL scheme; desired format: https://host[/path]".to_string()), "{errs:?}");
        assert!(
            errs.contains(
                &"webhooks[0].clientConfig.url: Invalid value: \"a=b\": query parameters are not permitted in the URL"
                    .to_string()
            ),
            "{errs:?}"
        );
        assert!(
            errs.iter()
                .any(|e| e.contains("if '*/*' is present, must not specify other resources")),
            "{errs:?}"
        );
        assert!(
            errs.iter()
                .any(|e| e.contains("if '*' is present, must not specify other operations")),
            "{errs:?}"
        );
    }

    #[test]
    fn duplicate_names_and_match_conditions_that_do_not_compile_are_refused() {
        let mut h = hook();
        h["matchConditions"] = json!([
            {"name": "a", "expression": "object.metadata.name == 'x'"},
            {"name": "a", "expression": "object.metadata.name =="},
            {"name": "b", "expression": "params.x"},
        ]);
        let errs = errors(json!({"webhooks": [hook(), h]}), true);
        assert!(
            errs.contains(&"webhooks[1].name: Duplicate value: \"deny.example.com\"".to_string()),
            "{errs:?}"
        );
        assert!(
            errs.contains(&"webhooks[1].matchConditions[1].name: Duplicate value: \"a\"".to_string()),
            "{errs:?}"
        );
        assert!(
            errs.iter().any(|e| e.starts_with(
                "webhooks[1].matchConditions[1].expression: Invalid value: \"object.metadata.name ==\": compilation failed: ERROR: <input>:1:"
            )),
            "{errs:?}"
        );
        assert!(
            errs.contains(&"webhooks[1].matchConditions[2].expression: Invalid value: \"params.x\": compilation failed: ERROR: <input>:1:1: undeclared reference to 'params' (in container '')".to_string()),
            "{errs:?}"
        );
        let mut ok = hook();
        ok["matchConditions"] = json!([{"name": "a", "expression": "object.metadata.name == 'x'"}]);
        assert!(errors(json!({"webhooks": [ok]}), true).is_empty());
    }

    fn policy_errors(obj: Value) -> Vec<String> {
        let mut errs = Vec::new();
        validate_admission_policy(&obj, &mut errs);
        errs.iter().map(ToString::to_string).collect()
    }

    fn binding_errors(obj: Value) -> Vec<String> {
        let mut errs = Vec::new();
        validate_admission_policy_binding(&obj, &mut errs);
        errs.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn policies_need_constraints_and_expressions_that_compile() {
        let rules = json!({"resourceRules": [{"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["deployments"]}]});
        assert!(policy_errors(json!({"spec": {"matchConstraints": rules, "validations": [{"expression": "object.spec.replicas <= 5"}]}})).is_empty());
        assert_eq!(
            policy_errors(json!({"spec": {}})),
            [
                "spec.matchConstraints: Required value",
                "spec.validations: Required value: validations or auditAnnotations must contain at least one item",
            ]
        );
        assert_eq!(
            policy_errors(
                json!({"spec": {"matchConstraints": rules, "failurePolicy": "Maybe", "validations": [
                {"expression": "object.spec.replicas <<= 5"}, {"expression": "true", "reason": "Nope"}]}})
            ),
            [
                "spec.failurePolicy: Unsupported value: \"Maybe\": supported values: \"Fail\", \"Ignore\"",
                "spec.validations[0].expression: Invalid value: \"object.spec.replicas <<= 5\": compilation failed: ERROR: <input>:1:23: Syntax error: extraneous input '<=' expecting {'[', '{', '(', '.', '-', '!', 'true', 'false', 'null', NUM_FLOAT, NUM_INT, NUM_UINT, STRING, BYTES, IDENTIFIER}\n | object.spec.replicas <<= 5\n | ......................^",
                "spec.validations[1].reason: Unsupported value: \"Nope\": supported values: \"Unauthorized\", \"Forbidden\", \"Invalid\", \"RequestEntityTooLarge\"",
            ]
        );
    }

    #[test]
    fn bindings_need_a_policy_and_actions() {
        assert!(binding_errors(json!({"spec": {"policyName": "p", "validationActions": ["Deny"]}})).is_empty());
        assert_eq!(
            binding_errors(json!({"spec": {"validationActions": ["Deny", "Warn"], "paramRef": {"name": "x"}}})),
            [
                "spec.policyName: Required value",
                "spec.paramRef.parameterNotFoundAction: Required value",
                "spec.validationActions: Invalid value: []admissionregistration.ValidationAction{\"Deny\", \"Warn\"}: must not contain both Deny and Warn (repeating the same validation failure information in the API response and headers serves no purpose)",
            ]
        );
        assert_eq!(
            binding_errors(json!({"spec": {"policyName": "p"}})),
            ["spec.validationActions: Required value: at least one validation action is required"]
        );
    }

    #[test]
    fn service_references() {
        let mut h = hook();
        h["clientConfig"] = json!({"service": {"namespace": "", "name": "svc", "port": 0, "path": "/a//b"}});
        let errs = errors(json!({"webhooks": [h]}), false);
        assert!(
            errs.contains(
                &"webhooks[0].clientConfig.service.namespace: Required value: service namespace is required"
                    .to_string()
            ),
            "{errs:?}"
        );
        assert!(errs.iter().any(|e| e.contains("port is not valid")), "{errs:?}");
        assert!(
            errs.iter().any(|e| e.contains("segment[1] may not be empty")),
            "{errs:?}"
        );
        let mut h = hook();
        h["clientConfig"] = json!({});
        let errs = errors(json!({"webhooks": [h]}), false);
        assert_eq!(
            errs,
            vec!["webhooks[0].clientConfig: Required value: exactly one of url or service is required"]
        );
    }

    #[test]
    fn urls_split_as_go_splits_them() {
        let u = split_url("https://user@host:8443/p/q?x=1#frag");
        assert_eq!(
            u,
            UrlParts {
                scheme: "https",
                user: Some("user"),
                host: "host:8443",
                path: "/p/q",
                query: "x=1",
                fragment: "frag"
            }
        );
        assert_eq!(split_url("https://h").path, "");
    }
}
