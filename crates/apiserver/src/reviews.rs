//! The review APIs, answered and never stored: `authorization.k8s.io/v1`
//! SubjectAccessReview, LocalSubjectAccessReview, SelfSubjectAccessReview (`kubectl auth
//! can-i`) and SelfSubjectRulesReview (`kubectl auth can-i --list`); `authentication.k8s.io/v1`
//! SelfSubjectReview (`kubectl auth whoami`) and TokenReview.

use std::collections::BTreeMap;

use axum::response::Response;
use bytes::Bytes;
use http::{Method, StatusCode};
use serde_json::{Map, Value, json};
use skiff_api::StatusError;
use skiff_api::status::FieldError;
use skiff_rbac::{Attributes, Decision, PolicyRule};

use crate::authz;
use crate::handlers::Ctx;
use crate::tls::Identity;
use crate::{body, write};

/// Whether this request is for a review resource.
pub fn is_review(group: &str) -> bool {
    matches!(group, "authorization.k8s.io" | "authentication.k8s.io")
}

pub async fn handle(ctx: &Ctx, bytes: Bytes) -> Result<Response, StatusError> {
    let res = ctx.rr.resource;
    if ctx.method != Method::POST || !ctx.rr.name.is_empty() {
        return Err(StatusError::method_not_allowed(
            "the server does not allow this method on the requested resource",
        ));
    }
    let mut obj = body::decode(&ctx.headers, &bytes)?;
    write::check_kind(res.kind, &res.api_version(), &mut obj)?;
    let status = match res.plural {
        "subjectaccessreviews" => access_review(ctx, &obj, Scope::Subject).await?,
        "localsubjectaccessreviews" => access_review(ctx, &obj, Scope::Local).await?,
        "selfsubjectaccessreviews" => access_review(ctx, &obj, Scope::Own).await?,
        "selfsubjectrulesreviews" => rules_review(ctx, &obj)?,
        "selfsubjectreviews" => json!({"userInfo": user_info(&ctx.user)}),
        "tokenreviews" => token_review(ctx, &obj).await?,
        _ => {
            return Err(StatusError::not_found(res.group, res.plural, ""));
        }
    };
    if let Some(m) = obj.as_object_mut() {
        m.insert("status".into(), status);
        let md = m.entry("metadata").or_insert_with(|| json!({}));
        if let Some(md) = md.as_object_mut() {
            md.insert("creationTimestamp".into(), Value::Null);
        }
    }
    Ok(body::value_response(StatusCode::CREATED, &obj))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Scope {
    /// SubjectAccessReview: any user, asked by someone allowed to create reviews.
    Subject,
    /// LocalSubjectAccessReview: any user, in the URL's namespace.
    Local,
    /// SelfSubjectAccessReview: the caller.
    Own,
}

/// A user as the reviews' `userInfo` (the same form as the audit log's).
fn user_info(who: &Identity) -> Value {
    serde_json::to_value(crate::audit::UserInfo(who)).unwrap_or(Value::Null)
}

fn str_of<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k).and_then(Value::as_str).unwrap_or("")
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .unwrap_or_default()
}

fn invalid(ctx: &Ctx, errs: Vec<FieldError>) -> Result<(), StatusError> {
    if errs.is_empty() {
        return Ok(());
    }
    Err(StatusError::invalid(
        ctx.rr.resource.group,
        ctx.rr.resource.kind,
        "",
        &errs,
    ))
}

async fn access_review(ctx: &Ctx, obj: &Value, scope: Scope) -> Result<Value, StatusError> {
    let spec = obj.get("spec").cloned().unwrap_or_else(|| json!({}));
    let resource = spec.get("resourceAttributes").filter(|v| !v.is_null());
    let non_resource = spec.get("nonResourceAttributes").filter(|v| !v.is_null());
    let mut errs = Vec::new();
    match (resource, non_resource) {
        (Some(_), Some(n)) => errs.push(FieldError::invalid(
            "spec.nonResourceAttributes",
            n,
            "cannot be specified in combination with resourceAttributes",
        )),
        (None, None) => errs.push(FieldError::invalid(
            "spec.resourceAttributes",
            &Value::Null,
            "exactly one of nonResourceAttributes or resourceAttributes must be specified",
        )),
        _ => {}
    }
    if scope != Scope::Own && str_of(&spec, "user").is_empty() && strings(spec.get("groups")).is_empty() {
        errs.push(FieldError::invalid(
            "spec.user",
            &json!(""),
            "at least one of user or group must be specified",
        ));
    }
    if scope == Scope::Local {
        if let Some(n) = non_resource {
            errs.push(FieldError::invalid(
                "spec.nonResourceAttributes",
                n,
                "disallowed on this kind of request",
            ));
        }
        if let Some(r) = resource
            && str_of(r, "namespace") != ctx.rr.namespace
        {
            errs.push(FieldError::invalid(
                "spec.resourceAttributes.namespace",
                &json!(str_of(r, "namespace")),
                "must match metadata.namespace",
            ));
        }
    }
    invalid(ctx, errs)?;
    let who = match scope {
        Scope::Own => ctx.user.clone(),
        _ => {
            let extra: BTreeMap<String, Vec<String>> = spec
                .get("extra")
                .and_then(Value::as_object)
                .map(|m| m.iter().map(|(k, v)| (k.clone(), strings(Some(v)))).collect())
                .unwrap_or_default();
            Identity {
                user: str_of(&spec, "user").to_string(),
                uid: str_of(&spec, "uid").to_string(),
                groups: strings(spec.get("groups")),
                extra,
            }
        }
    };
    let attributes = match (resource, non_resource) {
        (Some(r), _) => {
            let mut a = Attributes::resource(
                str_of(r, "verb"),
                str_of(r, "group"),
                str_of(r, "resource"),
                str_of(r, "namespace"),
                str_of(r, "name"),
            )
            .with_subresource(str_of(r, "subresource"));
            a.api_version = str_of(r, "version").to_string();
            if let Some(f) = r.pointer("/fieldSelector/rawSelector").and_then(Value::as_str) {
                a.field_selector = f.to_string();
            }
            a
        }
        (None, Some(n)) => Attributes::non_resource(str_of(n, "verb"), str_of(n, "path")),
        (None, None) => Attributes::default(),
    };
    let (decision, reason) = ctx.state.authz.authorize(&*ctx.state.store, &who, &attributes).await;
    let mut status = Map::new();
    status.insert("allowed".into(), json!(decision == Decision::Allow));
    if decision == Decision::Deny {
        status.insert("denied".into(), json!(true));
    }
    if !reason.is_empty() {
        status.insert("reason".into(), json!(reason));
    }
    Ok(Value::Object(status))
}

/// SelfSubjectRulesReview: the caller's rules in a namespace, as upstream's `RulesFor` over the
/// authorizer chain (everything for `system:masters`; nodes' rules are not enumerable).
fn rules_review(ctx: &Ctx, obj: &Value) -> Result<Value, StatusError> {
    let namespace = obj.pointer("/spec/namespace").and_then(Value::as_str).unwrap_or("");
    let who = &ctx.user;
    let mut rules: Vec<PolicyRule> = Vec::new();
    let mut errors: Vec<String> = Vec::new();
    let mut incomplete = false;
    if who.groups.iter().any(|g| g == authz::MASTERS) {
        rules.push(PolicyRule {
            verbs: vec!["*".into()],
            api_groups: vec!["*".into()],
            resources: vec!["*".into()],
            ..Default::default()
        });
        rules.push(PolicyRule {
            verbs: vec!["*".into()],
            non_resource_urls: vec!["*".into()],
            ..Default::default()
        });
    }
    if crate::node_authorizer::node_name(who).is_some() {
        incomplete = true;
        errors.push("node authorizer does not support user rule resolution".into());
    }
    let (rbac_rules, rbac_errors) = ctx.state.authz.policy().rules_for(who, namespace);
    rules.extend(rbac_rules);
    if !rbac_errors.is_empty() {
        incomplete = true;
        errors.extend(rbac_errors);
    }
    let mut resource_rules = Vec::new();
    let mut non_resource_rules = Vec::new();
    for r in rules {
        if !r.non_resource_urls.is_empty() {
            non_resource_rules.push(json!({"verbs": r.verbs, "nonResourceURLs": r.non_resource_urls}));
        }
        if !r.resources.is_empty() {
            let mut m = Map::new();
            m.insert("verbs".into(), json!(r.verbs));
            m.insert("apiGroups".into(), json!(r.api_groups));
            m.insert("resources".into(), json!(r.resources));
            if !r.resource_names.is_empty() {
                m.insert("resourceNames".into(), json!(r.resource_names));
            }
            resource_rules.push(Value::Object(m));
        }
    }
    let mut status = Map::new();
    status.insert("resourceRules".into(), json!(resource_rules));
    status.insert("nonResourceRules".into(), json!(non_resource_rules));
    status.insert("incomplete".into(), json!(incomplete));
    if !errors.is_empty() {
        let joined = if errors.len() == 1 {
            errors[0].clone()
        } else {
            format!("[{}]", errors.join(", "))
        };
        status.insert("evaluationError".into(), json!(joined));
    }
    Ok(Value::Object(status))
}

/// TokenReview: who a bearer token authenticates as, for `spec.audiences` (the API server's
/// own when it names none), as upstream: a service account token must be for one of them, and
/// `status.audiences` are those it is for; the other tokens know no audience and authenticate
/// only for the API server's own.
async fn token_review(ctx: &Ctx, obj: &Value) -> Result<Value, StatusError> {
    let token = obj.pointer("/spec/token").and_then(Value::as_str).unwrap_or("");
    if token.is_empty() {
        invalid(ctx, vec![FieldError::required("spec.token", "")])?;
    }
    let requested = strings(obj.pointer("/spec/audiences"));
    let api_audiences = ctx.state.service_accounts.api_audiences();
    let targets: Vec<String> = if requested.is_empty() {
        api_audiences.to_vec()
    } else {
        requested
    };
    let refused = |error: String| json!({"authenticated": false, "user": {}, "error": error});
    let now = jiff::Timestamp::now().as_second();
    match ctx
        .state
        .service_accounts
        .authenticate_for(&*ctx.state.store, token, now, &targets)
        .await
    {
        Ok((id, audiences)) => {
            return Ok(json!({"authenticated": true, "user": user_info(&id), "audiences": audiences}));
        }
        Err(crate::serviceaccount::TokenError::NotOurs) => {}
        Err(e) => return Ok(refused(e.to_string())),
    }
    let implicit: Vec<String> = targets.iter().filter(|a| api_audiences.contains(a)).cloned().collect();
    if implicit.is_empty() {
        return Ok(refused("token audiences are invalid for the target audiences".into()));
    }
    let mut headers = http::HeaderMap::new();
    if let Ok(v) = http::HeaderValue::from_str(&format!("Bearer {token}")) {
        headers.insert(http::header::AUTHORIZATION, v);
    }
    let who = ctx
        .state
        .authenticate(&headers, &http::Extensions::new())
        .await
        .filter(|id| id.user != authz::ANONYMOUS);
    Ok(match who {
        Some(id) => json!({"authenticated": true, "user": user_info(&id), "audiences": implicit}),
        None => refused("invalid bearer token".into()),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use axum::body::Body;
    use http::Request;
    use serde_json::{Value, json};
    use tower::ServiceExt;

    use crate::server::{ApiState, router};

    async fn post(state: &Arc<ApiState>, token: &str, uri: &str, body: Value) -> (u16, Value) {
        state.call_for_tests(token, "POST", uri, &body.to_string()).await
    }

    const SAR: &str = "/apis/authorization.k8s.io/v1/subjectaccessreviews";

    #[tokio::test]
    async fn reviews_are_answered_and_never_stored() {
        let dir = tempfile::tempdir().expect("dir");
        let (state, token) = ApiState::for_tests(dir.path());
        crate::bootstrap::reconcile(&state).await.expect("bootstrap policy");
        let review =
            |spec: Value| json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec});

        // The administrators' group is bound to cluster-admin; a stranger to nothing.
        let (code, v) = post(
            &state,
            &token,
            SAR,
            review(json!({"user": "x", "groups": ["skiff:cluster-admins"],
            "resourceAttributes": {"verb": "delete", "resource": "nodes"}})),
        )
        .await;
        assert_eq!(code, 201, "{v}");
        assert_eq!(v["status"]["allowed"], true);
        assert_eq!(
            v["status"]["reason"],
            "RBAC: allowed by ClusterRoleBinding \"skiff:cluster-admins\" of ClusterRole \"cluster-admin\" to Group \"skiff:cluster-admins\""
        );
        let (_, v) = post(
            &state,
            &token,
            SAR,
            review(json!({"user": "jane",
            "resourceAttributes": {"verb": "list", "resource": "pods", "namespace": "default"}})),
        )
        .await;
        assert_eq!(v["status"], json!({"allowed": false}));
        // Everyone may discover the API.
        let (_, v) = post(
            &state,
            &token,
            SAR,
            review(json!({"user": "jane", "groups": ["system:authenticated"],
            "nonResourceAttributes": {"verb": "get", "path": "/apis/apps/v1"}})),
        )
        .await;
        assert_eq!(v["status"]["allowed"], true);

        // Upstream's validation.
        let (code, v) = post(
            &state,
            &token,
            SAR,
            review(json!({"resourceAttributes": {"verb": "get"}})),
        )
        .await;
        assert_eq!(code, 422, "{v}");
        assert_eq!(
            v["message"],
            "SubjectAccessReview.authorization.k8s.io \"\" is invalid: spec.user: Invalid value: \"\": at least one of user or group must be specified"
        );
        let (code, v) = post(&state, &token, SAR, review(json!({"user": "u"}))).await;
        assert_eq!(code, 422);
        assert!(
            v["message"]
                .as_str()
                .unwrap_or("")
                .contains("exactly one of nonResourceAttributes or resourceAttributes must be specified"),
            "{v}"
        );
        let local = "/apis/authorization.k8s.io/v1/namespaces/default/localsubjectaccessreviews";
        let (code, v) = post(
            &state,
            &token,
            local,
            json!({"apiVersion": "authorization.k8s.io/v1", "kind": "LocalSubjectAccessReview",
            "spec": {"user": "u", "resourceAttributes": {"verb": "get", "resource": "pods", "namespace": "other"}}}),
        )
        .await;
        assert_eq!(code, 422);
        assert!(
            v["message"]
                .as_str()
                .unwrap_or("")
                .contains("must match metadata.namespace"),
            "{v}"
        );

        // Reviews are not stored: there is nothing to list.
        let req = Request::builder()
            .uri(SAR)
            .header("authorization", format!("Bearer {token}"))
            .body(Body::empty())
            .expect("request");
        let resp = router(state.clone()).oneshot(req).await.expect("response");
        assert_eq!(resp.status().as_u16(), 405);

        // TokenReview: the static token is the break-glass user; nonsense is not authenticated.
        let tr =
            |t: &str| json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": t}});
        let (code, v) = post(
            &state,
            &token,
            "/apis/authentication.k8s.io/v1/tokenreviews",
            tr(&token),
        )
        .await;
        assert_eq!(code, 201, "{v}");
        assert_eq!(v["status"]["authenticated"], true);
        assert_eq!(v["status"]["user"]["username"], "skiff-super-admin");
        let (_, v) = post(
            &state,
            &token,
            "/apis/authentication.k8s.io/v1/tokenreviews",
            tr("nonsense"),
        )
        .await;
        assert_eq!(v["status"]["authenticated"], false);

        // SelfSubjectReview and SelfSubjectRulesReview describe the caller.
        let (_, v) = post(
            &state,
            &token,
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}),
        )
        .await;
        assert_eq!(
            v["status"]["userInfo"]["groups"],
            json!(["system:masters", "system:authenticated"])
        );
        let (_, v) = post(&state, &token, "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews",
            json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview", "spec": {"namespace": "default"}})).await;
        assert_eq!(
            v["status"]["resourceRules"][0],
            json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]})
        );
        assert_eq!(v["status"]["incomplete"], false);
    }
}
