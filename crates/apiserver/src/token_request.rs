//! `POST serviceaccounts/NAME/token`: a TokenRequest (`authentication.k8s.io/v1`), as
//! upstream's `TokenREST.Create`. The service account must exist; `spec.audiences` default to
//! the API server's, `spec.expirationSeconds` to an hour (at least 10 minutes, at most 2^32
//! seconds); `spec.boundObjectRef` binds the token to a Pod, Secret or Node that must exist
//! (with its uid, when one is given). The answer is the request with `status.token` and
//! `status.expirationTimestamp`.

use axum::response::Response;
use bytes::Bytes;
use http::StatusCode;
use serde_json::{Value, json};
use skiff_api::{FieldError, StatusError};

use crate::body;
use crate::handlers::Ctx;
use crate::objects;
use crate::serviceaccount::{self, Bound, ObjectRef};
use crate::write;

const KIND: &str = "TokenRequest";
const GROUP: &str = "authentication.k8s.io";
const API_VERSION: &str = "authentication.k8s.io/v1";
const DEFINITION: &str = "io.k8s.api.authentication.v1.TokenRequest";

/// `spec.expirationSeconds` when the request has none (upstream's defaulting).
const DEFAULT_EXPIRATION_SECONDS: i64 = 60 * 60;
/// The shortest lifetime a token may be asked for.
const MIN_EXPIRATION_SECONDS: i64 = 10 * 60;
/// The longest.
const MAX_EXPIRATION_SECONDS: i64 = 1 << 32;

pub async fn create(ctx: &Ctx, bytes: Bytes) -> Result<Response, StatusError> {
    let mut req = body::decode(&ctx.headers, &bytes)?;
    write::check_kind(KIND, API_VERSION, &mut req)?;
    if let Some(m) = objects::type_mismatch(DEFINITION, &req) {
        return Err(StatusError::bad_request(format!(
            "{KIND} in version \"v1\" cannot be handled as a {KIND}: {}",
            m.message()
        )));
    }
    let name = ctx.rr.name.as_str();
    let namespace = ctx.rr.namespace.as_str();

    // Name and namespace in the body, if any, must be the URL's.
    for (field, want, what) in [
        ("name", name, "must match the service account name if specified"),
        (
            "namespace",
            namespace,
            "must match the service account namespace if specified",
        ),
    ] {
        let given = objects::meta_str(&req, field);
        if !given.is_empty() && given != want {
            let errs = [FieldError::invalid(format!("metadata.{field}"), &json!(given), what)];
            return Err(StatusError::invalid(GROUP, KIND, name, &errs));
        }
    }

    let (service_account, _) = ctx.current().await?;

    let spec = req.get("spec").cloned().unwrap_or_else(|| json!({}));
    let mut audiences: Vec<String> = spec
        .get("audiences")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .unwrap_or_default();
    if audiences.is_empty() {
        audiences = ctx.state.service_accounts.api_audiences().to_vec();
    }
    // A number too large for an int64 is out of range all the same.
    let expiration = match spec.get("expirationSeconds").filter(|v| !v.is_null()) {
        None => DEFAULT_EXPIRATION_SECONDS,
        Some(v) => v.as_i64().unwrap_or(i64::MAX),
    };
    let mut errs = Vec::new();
    if expiration < MIN_EXPIRATION_SECONDS {
        errs.push(FieldError::invalid(
            "spec.expirationSeconds",
            &json!(expiration),
            "may not specify a duration less than 10 minutes",
        ));
    }
    if expiration > MAX_EXPIRATION_SECONDS {
        errs.push(FieldError::invalid(
            "spec.expirationSeconds",
            &json!(expiration),
            "may not specify a duration larger than 2^32 seconds",
        ));
    }
    if !errs.is_empty() {
        return Err(StatusError::invalid(GROUP, KIND, "", &errs));
    }

    let bound = match spec.get("boundObjectRef").filter(|r| r.is_object()) {
        Some(r) => bound_object(ctx, name, r).await?,
        None => Bound::Nothing,
    };
    // NodeRestriction: a node asks only for tokens bound to its own pods (or to itself, for
    // the agent's own parts).
    let binding = match &bound {
        Bound::Nothing => crate::noderestriction::TokenBinding::Nothing,
        Bound::Pod { node, .. } => crate::noderestriction::TokenBinding::Pod(node.as_ref().map(|n| n.name.as_str())),
        Bound::Node(node) => crate::noderestriction::TokenBinding::Node(&node.name),
        Bound::Secret(_) => crate::noderestriction::TokenBinding::Other("Secret"),
    };
    crate::noderestriction::admit_token(ctx, name, binding)?;
    crate::webhook::admit_subresource(
        ctx,
        crate::webhook::Operation::Create,
        &req,
        crate::webhook::Gvk {
            group: "authentication.k8s.io",
            version: "v1",
            kind: "TokenRequest",
        },
    )
    .await?;

    // Pod-bound tokens of the kubelet's default lifetime, for the API server, live a year
    // and are flagged stale after the hour they asked for.
    let api_audiences = ctx.state.service_accounts.api_audiences();
    let (lifetime, warn_after) = if matches!(bound, Bound::Pod { .. })
        && expiration == serviceaccount::WARN_ONLY_BOUND_TOKEN_EXPIRATION_SECONDS
        && audiences.iter().all(|a| api_audiences.contains(a))
    {
        (serviceaccount::EXPIRATION_EXTENSION_SECONDS, expiration)
    } else {
        (expiration, 0)
    };

    let now = jiff::Timestamp::now();
    let now_seconds = now.as_second();
    let claims = serviceaccount::claims(
        &service_account,
        bound,
        lifetime,
        warn_after,
        audiences.clone(),
        now_seconds,
    );
    let token = ctx
        .state
        .service_accounts
        .sign(&claims)
        .map_err(|e| StatusError::internal(format!("failed to generate token: {e:#}")))?;

    let expires = jiff::Timestamp::from_second(now_seconds.saturating_add(expiration))
        .map_err(|e| StatusError::internal(format!("computing the expiration: {e}")))?;
    let mut out = req;
    if let Some(m) = out.as_object_mut() {
        let md = m.entry("metadata").or_insert_with(|| json!({}));
        if !md.is_object() {
            *md = json!({});
        }
        md["name"] = json!(objects::name(&service_account));
        md["namespace"] = json!(objects::namespace(&service_account));
        md["creationTimestamp"] = json!(rfc3339(now));
        let mut spec = spec;
        if !spec.is_object() {
            spec = json!({});
        }
        spec["audiences"] = json!(audiences);
        spec["expirationSeconds"] = json!(expiration);
        m.insert("spec".into(), spec);
        m.insert(
            "status".into(),
            json!({"token": token, "expirationTimestamp": rfc3339(expires)}),
        );
    }
    Ok(body::value_response(StatusCode::CREATED, &out))
}

fn rfc3339(t: jiff::Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// The object a token is to be bound to, checked as upstream does.
async fn bound_object(ctx: &Ctx, service_account: &str, r: &Value) -> Result<Bound, StatusError> {
    let field = |k: &str| r.get(k).and_then(Value::as_str).unwrap_or("");
    let (kind, ref_name, ref_uid) = (field("kind"), field("name"), field("uid"));
    // schema.FromAPIVersionAndKind: "v1" is the core group.
    let (group, version) = field("apiVersion").split_once('/').unwrap_or(("", field("apiVersion")));
    let namespace = ctx.rr.namespace.as_str();
    let (bound, uid) = match (group, kind) {
        ("", "Pod") => {
            let pod = get(ctx, "pods", namespace, ref_name)
                .await?
                .ok_or_else(|| StatusError::not_found("", "pods", ref_name))?;
            if pod.pointer("/spec/serviceAccountName").and_then(Value::as_str) != Some(service_account) {
                return Err(StatusError::bad_request(format!(
                    "cannot bind token for serviceaccount \"{service_account}\" to pod running with different \
                     serviceaccount name."
                )));
            }
            let node_name = pod.pointer("/spec/nodeName").and_then(Value::as_str).unwrap_or("");
            // The node is recorded when known; without its object, by name alone.
            let node = if node_name.is_empty() {
                None
            } else {
                Some(match get(ctx, "nodes", "", node_name).await? {
                    Some(node) => ObjectRef::of(&node),
                    None => ObjectRef {
                        name: node_name.to_string(),
                        uid: String::new(),
                    },
                })
            };
            let uid = objects::uid(&pod).to_string();
            (
                Bound::Pod {
                    pod: ObjectRef::of(&pod),
                    node,
                },
                uid,
            )
        }
        ("", "Node") => {
            let node = get(ctx, "nodes", "", ref_name)
                .await?
                .ok_or_else(|| StatusError::not_found("", "nodes", ref_name))?;
            (Bound::Node(ObjectRef::of(&node)), objects::uid(&node).to_string())
        }
        ("", "Secret") => {
            let secret = get(ctx, "secrets", namespace, ref_name)
                .await?
                .ok_or_else(|| StatusError::not_found("", "secrets", ref_name))?;
            (Bound::Secret(ObjectRef::of(&secret)), objects::uid(&secret).to_string())
        }
        _ => {
            return Err(StatusError::bad_request(format!(
                "cannot bind token to object of type {group}/{version}, Kind={kind}"
            )));
        }
    };
    if !ref_uid.is_empty() && ref_uid != uid {
        return Err(StatusError::conflict(
            group,
            kind,
            ref_name,
            &format!(
                "the UID in the bound object reference ({ref_uid}) does not match the UID in record. The object \
                 might have been deleted and then recreated"
            ),
        ));
    }
    Ok(bound)
}

/// A stored core/v1 object, if it exists.
async fn get(ctx: &Ctx, plural: &str, namespace: &str, name: &str) -> Result<Option<Value>, StatusError> {
    let resource = skiff_api::registry::lookup("", "v1", plural)
        .ok_or_else(|| StatusError::internal(format!("no resource {plural}")))?;
    if name.is_empty() {
        return Ok(None);
    }
    let kv = ctx
        .state
        .store
        .get(&objects::key(resource, namespace, name))
        .await
        .map_err(|e| crate::read::store_error("", plural, name, e))?;
    match kv {
        None => Ok(None),
        Some(kv) => objects::decode_kv(&kv)
            .map(Some)
            .ok_or_else(|| StatusError::internal("stored object is not valid JSON")),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::{Value, json};

    use crate::server::ApiState;

    const URI: &str = "/api/v1/namespaces/default/serviceaccounts/bot/token";

    async fn server() -> (Arc<ApiState>, String, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("dir");
        let (state, token) = ApiState::for_tests(dir.path());
        create(
            &state,
            &token,
            "/api/v1/namespaces",
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}}),
        )
        .await;
        (state, token, dir)
    }

    async fn call(state: &Arc<ApiState>, token: &str, method: &str, uri: &str, body: &str) -> (u16, Value) {
        state.call_for_tests(token, method, uri, body).await
    }

    async fn create(state: &Arc<ApiState>, admin: &str, uri: &str, obj: Value) -> Value {
        let (code, v) = call(state, admin, "POST", uri, &obj.to_string()).await;
        assert_eq!(code, 201, "{v}");
        v
    }

    #[tokio::test]
    async fn token_requests_as_upstream_answers_them() {
        let (state, admin, _dir) = server().await;
        let request = |spec: Value| {
            json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}).to_string()
        };

        // No service account yet.
        let (code, v) = call(&state, &admin, "POST", URI, &request(json!({}))).await;
        assert_eq!(code, 404, "{v}");
        assert_eq!(v["message"], "serviceaccounts \"bot\" not found");
        assert_eq!(v["reason"], "NotFound");
        assert_eq!(v["details"]["kind"], "serviceaccounts");

        let sa = create(
            &state,
            &admin,
            "/api/v1/namespaces/default/serviceaccounts",
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "bot"}}),
        )
        .await;

        // Defaults filled in, the token in the status.
        let (code, v) = call(&state, &admin, "POST", URI, &request(json!({}))).await;
        assert_eq!(code, 201, "{v}");
        assert_eq!(v["kind"], "TokenRequest");
        assert_eq!(v["apiVersion"], "authentication.k8s.io/v1");
        assert_eq!(v["metadata"]["name"], "bot");
        assert_eq!(v["metadata"]["namespace"], "default");
        assert_eq!(
            v["spec"]["audiences"],
            json!(["https://kubernetes.default.svc.cluster.local"])
        );
        assert_eq!(v["spec"]["expirationSeconds"], 3600);
        let created: jiff::Timestamp = v["metadata"]["creationTimestamp"].as_str().unwrap().parse().unwrap();
        let expires: jiff::Timestamp = v["status"]["expirationTimestamp"].as_str().unwrap().parse().unwrap();
        assert_eq!(expires.as_second() - created.as_second(), 3600);
        let token = v["status"]["token"].as_str().expect("token").to_string();

        // The token authenticates (as its service account, which no role allows to list pods:
        // 403, not 401), and a changed one does not.
        let (code, v) = call(&state, &token, "GET", "/api/v1/namespaces/default/pods", "").await;
        assert_eq!(code, 403, "{v}");
        assert_eq!(
            v["message"],
            "pods is forbidden: User \"system:serviceaccount:default:bot\" cannot list resource \"pods\" in API group \"\" in the namespace \"default\""
        );
        let claims = state
            .service_accounts
            .verify(&token, jiff::Timestamp::now().as_second())
            .expect("valid");
        assert_eq!(
            claims.kubernetes.serviceaccount.uid,
            sa["metadata"]["uid"].as_str().unwrap()
        );
        let mut tampered = token.clone();
        tampered.insert(20, 'x');
        let (code, v) = call(&state, &tampered, "GET", "/api/v1/namespaces/default/pods", "").await;
        assert_eq!(code, 401);
        assert_eq!(v["message"], "Unauthorized");

        // Too short, too long.
        let (code, v) = call(&state, &admin, "POST", URI, &request(json!({"expirationSeconds": 599}))).await;
        assert_eq!(code, 422, "{v}");
        assert_eq!(
            v["message"],
            "TokenRequest.authentication.k8s.io \"\" is invalid: spec.expirationSeconds: Invalid value: 599: may not \
             specify a duration less than 10 minutes"
        );
        assert_eq!(v["details"]["group"], "authentication.k8s.io");
        assert_eq!(v["details"]["kind"], "TokenRequest");
        assert_eq!(v["details"]["causes"][0]["field"], "spec.expirationSeconds");
        let (code, v) = call(
            &state,
            &admin,
            "POST",
            URI,
            &request(json!({"expirationSeconds": 4294967297i64})),
        )
        .await;
        assert_eq!(code, 422, "{v}");
        assert!(
            v["message"]
                .as_str()
                .unwrap()
                .ends_with("may not specify a duration larger than 2^32 seconds")
        );

        // Bad bodies.
        for (body, message) in [
            ("{", "couldn't get version/kind; json parse error"),
            ("[1]", "Object 'Kind' is missing in request body; expected an object"),
            (
                r#"{"kind":"Pod","apiVersion":"v1"}"#,
                "the API version in the data (v1) does not match the expected API version \
                 (authentication.k8s.io/v1) or kind Pod does not match TokenRequest",
            ),
            (
                r#"{"spec":{"expirationSeconds":"long"}}"#,
                "TokenRequest in version \"v1\" cannot be handled as a TokenRequest: json: cannot unmarshal string \
                 into Go struct field TokenRequestSpec.spec.expirationSeconds of type int64",
            ),
            (
                r#"{"spec":{"audiences":"api"}}"#,
                "TokenRequest in version \"v1\" cannot be handled as a TokenRequest: json: cannot unmarshal string \
                 into Go struct field TokenRequestSpec.spec.audiences of type []string",
            ),
        ] {
            let (code, v) = call(&state, &admin, "POST", URI, body).await;
            assert_eq!(code, 400, "{body}: {v}");
            assert_eq!(v["reason"], "BadRequest");
            assert!(v["message"].as_str().unwrap().starts_with(message), "{body}: {v}");
        }
        let (code, v) = call(&state, &admin, "POST", URI, "").await;
        assert_eq!(code, 400, "{v}");

        // The body's name, if any, is the service account's.
        let (code, v) = call(
            &state,
            &admin,
            "POST",
            URI,
            r#"{"metadata":{"name":"someone-else"},"spec":{}}"#,
        )
        .await;
        assert_eq!(code, 422, "{v}");
        assert_eq!(
            v["message"],
            "TokenRequest.authentication.k8s.io \"bot\" is invalid: metadata.name: Invalid value: \"someone-else\": \
             must match the service account name if specified"
        );

        // Only the token verb is there.
        let (code, _) = call(&state, &admin, "GET", URI, "").await;
        assert_eq!(code, 405);
    }

    #[tokio::test]
    async fn bound_object_references() {
        let (state, admin, _dir) = server().await;
        for name in ["bot", "other"] {
            create(
                &state,
                &admin,
                "/api/v1/namespaces/default/serviceaccounts",
                json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}}),
            )
            .await;
        }
        let pod = create(
            &state,
            &admin,
            "/api/v1/namespaces/default/pods",
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                "spec": {"serviceAccountName": "bot", "nodeName": "n1", "containers": [{"name": "c", "image": "busybox"}]}}),
        )
        .await;
        let pod_uid = pod["metadata"]["uid"].as_str().unwrap().to_string();
        let secret = create(
            &state,
            &admin,
            "/api/v1/namespaces/default/secrets",
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}}),
        )
        .await;
        let bound = |r: Value| json!({"spec": {"boundObjectRef": r}}).to_string();

        // A pod: its name and uid, and its node's name (there is no Node object), in the claims.
        let (code, v) = call(
            &state,
            &admin,
            "POST",
            URI,
            &bound(json!({"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": pod_uid})),
        )
        .await;
        assert_eq!(code, 201, "{v}");
        assert_eq!(v["spec"]["boundObjectRef"]["name"], "p");
        let now = jiff::Timestamp::now().as_second();
        let token = v["status"]["token"].as_str().unwrap();
        let claims = state.service_accounts.verify(token, now).unwrap();
        assert_eq!(claims.kubernetes.pod.as_ref().unwrap().uid, pod_uid);
        assert_eq!(claims.kubernetes.node.as_ref().unwrap().name, "n1");
        assert_eq!(claims.exp.unwrap() - claims.iat.unwrap(), 3600);

        // The kubelet's default lifetime for a pod: a year, stale after the hour asked for.
        let (code, v) = call(
            &state,
            &admin,
            "POST",
            URI,
            &json!({"spec": {"expirationSeconds": 3607, "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": "p"}}})
                .to_string(),
        )
        .await;
        assert_eq!(code, 201, "{v}");
        let claims = state
            .service_accounts
            .verify(v["status"]["token"].as_str().unwrap(), now)
            .unwrap();
        assert_eq!(claims.exp.unwrap() - claims.iat.unwrap(), 365 * 24 * 3600);
        assert_eq!(claims.kubernetes.warnafter.unwrap() - claims.iat.unwrap(), 3607);
        assert_eq!(v["spec"]["expirationSeconds"], 3607);
        let created: jiff::Timestamp = v["metadata"]["creationTimestamp"].as_str().unwrap().parse().unwrap();
        let expires: jiff::Timestamp = v["status"]["expirationTimestamp"].as_str().unwrap().parse().unwrap();
        assert_eq!(expires.as_second() - created.as_second(), 3607);

        // A secret.
        let (code, v) = call(
            &state,
            &admin,
            "POST",
            URI,
            &bound(json!({"apiVersion": "v1", "kind": "Secret", "name": "s"})),
        )
        .await;
        assert_eq!(code, 201, "{v}");
        let claims = state
            .service_accounts
            .verify(v["status"]["token"].as_str().unwrap(), now)
            .unwrap();
        assert_eq!(
            claims.kubernetes.secret.as_ref().unwrap().uid,
            secret["metadata"]["uid"].as_str().unwrap()
        );

        for (r, code, message) in [
            (
                json!({"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "old"}),
                409,
                "Operation cannot be fulfilled on Pod \"p\": the UID in the bound object reference (old) does not \
                 match the UID in record. The object might have been deleted and then recreated",
            ),
            (
                json!({"apiVersion": "v1", "kind": "Pod", "name": "nope"}),
                404,
                "pods \"nope\" not found",
            ),
            (
                json!({"apiVersion": "v1", "kind": "Node", "name": "n1"}),
                404,
                "nodes \"n1\" not found",
            ),
            (
                json!({"apiVersion": "v1", "kind": "ConfigMap", "name": "c"}),
                400,
                "cannot bind token to object of type /v1, Kind=ConfigMap",
            ),
            (
                json!({"apiVersion": "apps/v1", "kind": "Pod", "name": "p"}),
                400,
                "cannot bind token to object of type apps/v1, Kind=Pod",
            ),
        ] {
            let (got, v) = call(&state, &admin, "POST", URI, &bound(r.clone())).await;
            assert_eq!(got, code, "{r}: {v}");
            assert_eq!(v["message"], message, "{r}");
        }
        let (code, v) = call(
            &state,
            &admin,
            "POST",
            "/api/v1/namespaces/default/serviceaccounts/other/token",
            &bound(json!({"apiVersion": "v1", "kind": "Pod", "name": "p"})),
        )
        .await;
        assert_eq!(code, 400, "{v}");
        assert_eq!(
            v["message"],
            "cannot bind token for serviceaccount \"other\" to pod running with different serviceaccount name."
        );
    }
}
