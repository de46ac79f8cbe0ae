//! The request dispatcher: authentication, routing, and the verbs on resources.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Query, State};
use axum::response::Response;
use bytes::Bytes;
use futures::FutureExt;
use http::{HeaderMap, HeaderValue, Method, Request, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::Value;
use skiff_api::StatusError;

use crate::body::{self, Output};
use crate::request::{self, RequestInfo, ResourceRequest, Route};
use crate::tls::Identity;
use crate::{ApiState, authz, discovery, filters, metrics, objects, openapi, watch};

pub type Params = HashMap<String, String>;

/// The one entry point for every request, HTTPS and in-process: upstream's filters
/// (`filters`: panic recovery, the deadline of non-long-running requests, max in flight), then
/// audited, with its `Audit-Id` on the response.
pub async fn handle(State(state): State<Arc<ApiState>>, req: Request<Body>) -> Response {
    let method = req.method().clone();
    let uri = req.uri().clone();
    let audit = crate::audit_request::AuditCtx::new(&req);
    let audit_id = audit.audit_id().clone();
    let response = match AssertUnwindSafe(filtered(state, req, audit, &method, &uri))
        .catch_unwind()
        .await
    {
        Ok(response) => response,
        Err(payload) => panicked(&method, &uri, &audit_id, &*payload),
    };
    filters::RecoverBody::wrap(response, &method, &uri)
}

/// A request whose handler panicked: upstream's 500, logged with the request.
fn panicked(
    method: &Method,
    uri: &http::Uri,
    audit_id: &HeaderValue,
    payload: &(dyn std::any::Any + Send),
) -> Response {
    tracing::error!(
        %method,
        uri = %uri,
        audit_id = ?audit_id,
        panic = filters::panic_message(payload),
        "apiserver panic'd"
    );
    let mut r = filters::panicked();
    r.headers_mut().insert("audit-id", audit_id.clone());
    r
}

async fn filtered(
    state: Arc<ApiState>,
    req: Request<Body>,
    mut audit: crate::audit_request::AuditCtx,
    method: &Method,
    uri: &http::Uri,
) -> Response {
    let params: Params = Query::<Params>::try_from_uri(req.uri())
        .map(|q| q.0)
        .unwrap_or_default();
    // The one reading of the request: what every step below authorizes, routes, admits,
    // audits, limits and counts.
    let info = match request::parse(req.method(), req.uri().path(), &params) {
        Ok(info) => info,
        Err(e) => {
            let _ = body::read_limited(req.into_body()).await;
            return audit.finish(&state, body::error_response(&e)).await;
        }
    };
    let attributes = info.attributes();
    let long_running = info.is_long_running();
    let start = std::time::Instant::now();
    let labels = metrics::request_labels(&attributes, method, &params, req.headers());
    if long_running {
        let guard = labels.as_ref().map(metrics::long_running);
        let response = serve(&state, req, info, params, attributes, true, &mut audit).await;
        let response = audit.finish(&state, response).await;
        if let Some(labels) = labels {
            metrics::record(labels, response.status().as_u16(), start);
        }
        // Counted as long-running until its stream ends.
        return response.map(|b| {
            Body::new(b.map_frame(move |f| {
                let _ = &guard;
                f
            }))
        });
    }
    let timeout = match state.filters.deadline_of(params.get("timeout").map(String::as_str)) {
        Ok(t) => t,
        Err(e) => return audit.finish(&state, body::error_response(&e)).await,
    };
    let deadline = tokio::time::Instant::now() + timeout;
    // The OpenAPI documents are written as they are, as upstream's OpenAPI handler writes them.
    let pretty = body::wants_pretty(params.get("pretty").map(String::as_str), req.headers())
        && !uri.path().starts_with("/openapi");
    let audit_id = audit.audit_id().clone();
    let req = req.map(|b| Body::new(filters::DeadlineBody::new(b, deadline)));
    // The handler runs to its end on a task of its own (upstream lets its goroutine finish):
    // neither the deadline nor a client that goes away cancels it between two writes.
    let guard = state.filters.track();
    let in_flight = metrics::in_flight(&attributes.verb);
    let mut task = tokio::spawn(async move {
        let _guard = guard;
        let _in_flight = in_flight;
        let mut response = serve(&state, req, info, params, attributes, false, &mut audit).await;
        if pretty {
            response = body::prettify(response).await;
        }
        audit.finish(&state, response).await
    });
    let response = tokio::select! {
        biased;
        _ = tokio::time::sleep_until(deadline) => {
            tracing::warn!(%method, uri = %uri, audit_id = ?audit_id, timeout = ?timeout, "request timed out, answered 504");
            let mut r = filters::timed_out();
            r.headers_mut().insert("audit-id", audit_id);
            r
        }
        joined = &mut task => match joined {
            Ok(response) => response,
            Err(e) if e.is_panic() => panicked(method, uri, &audit_id, &*e.into_panic()),
            Err(e) => {
                // Only when the runtime stops under it.
                tracing::warn!(%method, uri = %uri, error = %e, "request handler cancelled");
                let mut r = body::error_response(&StatusError::internal("the server is shutting down"));
                r.headers_mut().insert("audit-id", audit_id);
                r
            }
        },
    };
    if let Some(labels) = labels {
        metrics::record(labels, response.status().as_u16(), start);
    }
    response
}

async fn serve(
    state: &Arc<ApiState>,
    req: Request<Body>,
    info: RequestInfo,
    params: Params,
    attributes: skiff_rbac::Attributes,
    long_running: bool,
    audit: &mut crate::audit_request::AuditCtx,
) -> Response {
    let (parts, body) = req.into_parts();
    let Some(user) = state.authenticate(&parts.headers, &parts.extensions).await else {
        audit.begin(state, &Identity::default(), &attributes);
        audit.attributes(attributes);
        return body::error_response(&StatusError::unauthorized());
    };
    audit.begin(state, &user, &attributes);
    let user = match crate::impersonation::resolve(&state.authz, &*state.store, user, &parts.headers).await {
        Ok(user) => user,
        Err(e) => {
            audit.attributes(attributes);
            let _ = body::read_limited(body).await;
            return body::error_response(&e);
        }
    };
    audit.impersonating(&user);
    // Upstream's max in flight: after impersonation (it counts the user acted as), before
    // authorization. The slot is held until the handler is done.
    let in_process = parts.extensions.get::<filters::InProcess>().is_some();
    let _slot = match state.filters.admit(&attributes, &user, in_process, long_running) {
        filters::Admission::Refused(response) => {
            audit.attributes(attributes);
            return response;
        }
        admitted => admitted,
    };
    let path = info.path.as_str();
    #[cfg(test)]
    if let Some(response) = crate::filters::test_routes::serve(state, path).await {
        return response;
    }
    let (decision, reason) = state.authz.authorize(&*state.store, &user, &attributes).await;
    // What was refused, and why.
    let mut refusal = (decision != skiff_rbac::Decision::Allow).then(|| (attributes.clone(), reason.clone()));
    // A WebSocket GET of exec, attach or port-forward also needs `create`, as upstream's
    // AuthorizePodWebsocketUpgradeCreatePermission: the verb kubectl's POST always needed.
    if refusal.is_none() && authz::is_stream_upgrade(&attributes) {
        let mut create = attributes.clone();
        create.verb = "create".into();
        let (d, r) = state.authz.authorize(&*state.store, &user, &create).await;
        if d != skiff_rbac::Decision::Allow {
            refusal = Some((create, r));
        }
    }
    audit.decision(
        refusal.is_none(),
        refusal.as_ref().map_or(reason.as_str(), |(_, why)| why.as_str()),
    );
    audit.attributes(attributes);
    if let Some((refused, why)) = refusal {
        // Read what the client sends first, so it gets the 403 rather than a reset.
        let _ = body::read_limited(body).await;
        return body::error_response(&authz::forbidden(&user, &refused, &why));
    }
    let r = info.route();
    let method = parts.method.clone();
    let headers = parts.headers.clone();
    match r {
        Route::Version => body::value_response(StatusCode::OK, &discovery::version_info()),
        Route::Metrics => {
            let mut r = Response::new(Body::from(skiff_metrics::encode()));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(skiff_metrics::CONTENT_TYPE),
            );
            r
        }
        Route::Health(name) => health(state, name, path, params.contains_key("verbose")).await,
        Route::CoreDiscovery => discovery_response(&headers, true),
        Route::GroupsDiscovery => discovery_response(&headers, false),
        Route::Group(g) => match discovery::api_group_doc(&g) {
            Some(group) => body::value_response(StatusCode::OK, &group),
            None => not_found_path(),
        },
        Route::GroupVersion(g, v) => match discovery::api_resource_list(&g, &v) {
            Some(list) => body::value_response(StatusCode::OK, &list),
            None => not_found_path(),
        },
        Route::OpenApiIndex => body::value_response(StatusCode::OK, &openapi::v3_index()),
        Route::OpenApiV2 => {
            let (json, pb) = openapi::v2_document();
            let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("");
            if crate::openapi_v2::wants_protobuf(accept) {
                let mut r = Response::new(Body::from(pb));
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static(crate::openapi_v2::PROTOBUF),
                );
                r
            } else {
                body::json_response(StatusCode::OK, json)
            }
        }
        Route::OpenApiDocument(p) => match openapi::v3_document_bytes(&p) {
            Some(doc) => {
                let mut r = body::json_response(StatusCode::OK, doc);
                r.headers_mut()
                    .insert(header::CACHE_CONTROL, HeaderValue::from_static("public, immutable"));
                r
            }
            None => not_found_path(),
        },
        Route::SecretsEncrypt(op) => {
            // The chain has authorized the path (cluster-admin's `*` non-resource rule allows it).
            let _ = body::read_limited(body).await;
            crate::encryption::serve(state, &method, path, &op).await
        }
        Route::MethodNotAllowed => {
            let _ = body::read_limited(body).await;
            body::error_response(&StatusError::method_not_allowed(
                "the server does not allow this method on the requested resource",
            ))
        }
        Route::Invalid(e) => {
            let _ = body::read_limited(body).await;
            body::error_response(&e)
        }
        Route::UnknownResource(_) | Route::NotFound => {
            // Read what the client sends first, so it gets the 404 rather than a reset.
            let _ = body::read_limited(body).await;
            not_found_path()
        }
        Route::Resource(rr) if is_stream(&rr) => {
            let ctx = Ctx {
                state: state.clone(),
                rr,
                params,
                headers,
                method,
                user,
                warnings: Default::default(),
                audit_annotations: Default::default(),
            };
            match crate::proxy::handle(&ctx, parts).await {
                Ok(resp) => resp,
                Err(e) => body::error_response(&e),
            }
        }
        Route::Resource(rr) if rr.resource.plural == "nodes" && rr.subresource == "proxy" => {
            let bytes = match body::read_limited(body).await {
                Ok(b) => b,
                Err(e) => return body::error_response(&e),
            };
            let ctx = Ctx {
                state: state.clone(),
                rr,
                params,
                headers,
                method,
                user,
                warnings: Default::default(),
                audit_annotations: Default::default(),
            };
            match crate::proxy::node_proxy(&ctx, &parts, bytes).await {
                Ok(resp) => resp,
                Err(e) => body::error_response(&e),
            }
        }
        Route::Resource(rr) => {
            let bytes = match body::read_limited(body).await {
                Ok(b) => b,
                Err(e) => return body::error_response(&e),
            };
            audit.request_body(&bytes);
            let rbac_write = method != Method::GET && authz::is_rbac(rr.resource.group, rr.resource.plural);
            let webhook_write = method != Method::GET && crate::webhook::is_configuration(rr.resource);
            let ctx = Ctx {
                state: state.clone(),
                rr,
                params,
                headers,
                method,
                user,
                warnings: Default::default(),
                audit_annotations: Default::default(),
            };
            let warnings = ctx.warnings.clone();
            let annotations = ctx.audit_annotations.clone();
            let result = match skiff_api::conversion::storage_resource(ctx.rr.resource) {
                Some(storage) => crate::conversion::serve(ctx, bytes, storage).await,
                None => dispatch(ctx, bytes).await,
            };
            if webhook_write {
                // The writer's next request is admitted with what it wrote (the watch brings it
                // to the other replicas).
                crate::webhook::refresh(state).await;
            }
            if rbac_write {
                // The new grants hold before the client hears its write succeeded.
                if let Err(e) = state.authz.refresh(&*state.store).await {
                    tracing::error!(error = %e, "rebuilding the RBAC snapshot failed");
                }
            }
            let mut resp = match result {
                Ok(resp) => resp,
                Err(e) => {
                    if e.code >= 500 {
                        tracing::warn!(error = %e.message, "request failed");
                    }
                    body::error_response(&e)
                }
            };
            body::add_warnings(&mut resp, &warnings.take());
            audit.handled(annotations.take());
            resp
        }
    }
}

/// Subresources served by node agents and relayed as streams.
fn is_stream(rr: &ResourceRequest) -> bool {
    rr.resource.plural == "pods" && matches!(rr.subresource.as_str(), "log" | "exec" | "attach" | "portforward")
}

fn not_found_path() -> Response {
    let mut e = StatusError::new(404, "NotFound", "the server could not find the requested resource");
    e.details.causes.clear();
    body::error_response(&e)
}

/// The checks `/readyz`, `/livez` and `/healthz` run, as upstream names them. The post-start
/// hooks have all run before the server accepts a connection.
const HEALTH_CHECKS: &[&str] = &[
    "ping",
    "log",
    "etcd",
    "poststarthook/rbac/bootstrap-roles",
    "poststarthook/scheduling/bootstrap-system-priority-classes",
    "poststarthook/bootstrap-controller",
];

/// Skiff's check that this replica's RBAC snapshot is current (else it refuses what RBAC grants).
const RBAC_CURRENT: &str = "rbac-snapshot-current";

async fn health(state: &ApiState, name: &str, path: &str, verbose: bool) -> Response {
    let text = |code: StatusCode, body: String| {
        let mut r = Response::new(Body::from(body));
        *r.status_mut() = code;
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        r
    };
    // Readiness also asks whether this replica's RBAC snapshot is current: a replica that
    // cannot say so refuses requests, and a load balancer should send them elsewhere.
    let readiness = name == "readyz" || path.trim_start_matches('/').starts_with("readyz");
    let mut checks: Vec<&str> = HEALTH_CHECKS.to_vec();
    if readiness {
        checks.push(RBAC_CURRENT);
    }
    let store = state.store.health().await;
    let failure = |check: &str| -> Option<String> {
        match check {
            "etcd" => store.as_ref().err().map(|e| e.to_string()),
            RBAC_CURRENT => state.authz.stale(),
            _ => None,
        }
    };
    if name == "check" {
        // `/readyz/CHECK`: one check.
        let check = path.splitn(3, '/').nth(2).unwrap_or("").trim_end_matches('/');
        if !checks.contains(&check) {
            return text(StatusCode::NOT_FOUND, "404 page not found\n".into());
        }
        return match failure(check) {
            Some(e) => text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("internal server error: {e}\n"),
            ),
            None => text(StatusCode::OK, "ok".into()),
        };
    }
    let failed: Vec<(&str, String)> = checks.iter().filter_map(|c| Some((*c, failure(c)?))).collect();
    if failed.is_empty() {
        if verbose {
            let mut body: String = checks.iter().map(|c| format!("[+]{c} ok\n")).collect();
            body.push_str(&format!("{name} check passed\n"));
            return text(StatusCode::OK, body);
        }
        return text(StatusCode::OK, "ok".into());
    }
    for (check, e) in &failed {
        tracing::warn!(check = name, failed = check, error = %e, "health check failed");
    }
    let body: String = checks
        .iter()
        .map(|c| match failed.iter().any(|(f, _)| f == c) {
            true => format!("[-]{c} failed: reason withheld\n"),
            false => format!("[+]{c} ok\n"),
        })
        .collect();
    text(
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("{body}{name} check failed\n"),
    )
}

fn discovery_response(headers: &HeaderMap, core: bool) -> Response {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("");
    if accept.contains("as=APIGroupDiscoveryList") {
        let mut r = body::value_response(StatusCode::OK, &discovery::aggregated_discovery(core));
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(discovery::AGGREGATED_CONTENT_TYPE),
        );
        return r;
    }
    let v = if core {
        discovery::api_versions()
    } else {
        discovery::api_group_list()
    };
    body::value_response(StatusCode::OK, &v)
}

/// Everything a resource handler needs to know about the request.
pub struct Ctx {
    pub state: Arc<ApiState>,
    pub rr: ResourceRequest,
    pub params: Params,
    pub headers: HeaderMap,
    pub method: Method,
    /// The authenticated caller.
    pub user: Identity,
    /// Warnings admission gathered (webhooks'), sent with the answer whatever it is.
    pub warnings: crate::webhook::Warnings,
    /// Annotations admission adds to the request's audit event.
    pub audit_annotations: crate::audit_request::AdmissionAnnotations,
}

impl Ctx {
    /// The same request (parameters, headers, method) addressed to another object.
    pub fn for_object(&self, rr: ResourceRequest) -> Ctx {
        Ctx {
            state: self.state.clone(),
            rr,
            params: self.params.clone(),
            headers: self.headers.clone(),
            method: self.method.clone(),
            user: self.user.clone(),
            warnings: self.warnings.clone(),
            audit_annotations: self.audit_annotations.clone(),
        }
    }

    pub fn param(&self, k: &str) -> Option<&str> {
        self.params.get(k).map(String::as_str)
    }
    pub fn flag(&self, k: &str) -> bool {
        matches!(self.param(k), Some("1" | "t" | "T" | "true" | "TRUE" | "True"))
    }
    pub fn dry_run(&self) -> bool {
        self.params.get("dryRun").is_some_and(|v| !v.is_empty())
    }
    pub fn output(&self) -> Output {
        body::negotiate(&self.headers)
    }
}

pub(crate) async fn dispatch(ctx: Ctx, bytes: Bytes) -> Result<Response, StatusError> {
    let rr = &ctx.rr;
    let res = rr.resource;
    if res.namespaced && rr.name.is_empty() && ctx.method != Method::GET && rr.namespace.is_empty() {
        if ctx.method == Method::POST {
            return Err(StatusError::new(
                404,
                "NotFound",
                "the server could not find the requested resource",
            ));
        }
        return Err(StatusError::method_not_allowed(
            "the server does not allow this method on the requested resource",
        ));
    }
    if crate::reviews::is_review(res.group) {
        return crate::reviews::handle(&ctx, bytes).await;
    }
    if res.is_metrics() {
        return crate::resourcemetrics::handle(&ctx).await;
    }
    if res.is_computed() {
        return crate::componentstatus::handle(&ctx).await;
    }
    if !rr.subresource.is_empty() {
        return crate::subresources::handle(ctx, bytes).await;
    }
    if res.plural == "bindings" {
        if ctx.method == Method::POST {
            return crate::subresources::create_binding(&ctx, bytes, None).await;
        }
        return Err(StatusError::method_not_allowed(
            "the server does not allow this method on the requested resource",
        ));
    }
    let watching = rr.watch;
    match (ctx.method.clone(), rr.name.is_empty()) {
        (Method::GET, true) if watching => watch::serve(ctx, None).await,
        (Method::GET, false) if watching => {
            let name = ctx.rr.name.clone();
            watch::serve(ctx, Some(name)).await
        }
        (Method::GET, true) => crate::read::list(&ctx).await,
        (Method::GET, false) => crate::read::get(&ctx).await,
        (Method::POST, true) => crate::write::create(&ctx, bytes).await,
        (Method::PUT, false) => crate::write::update(&ctx, bytes).await,
        (Method::PATCH, false) => crate::write::patch(&ctx, bytes).await,
        (Method::DELETE, false) => crate::write::delete(&ctx, bytes).await,
        (Method::DELETE, true) => crate::write::delete_collection(&ctx, bytes).await,
        _ => Err(StatusError::method_not_allowed(
            "the server does not allow this method on the requested resource",
        )),
    }
}

/// Answer with one object in the form the client asked for.
pub fn render_one(ctx: &Ctx, code: StatusCode, obj: &Value) -> Response {
    match ctx.output() {
        Output::Object => body::value_response(code, obj),
        Output::PartialMetadata => body::value_response(code, &body::partial_metadata(obj)),
        Output::Table => {
            let now = jiff::Timestamp::now();
            let t =
                skiff_api::printers::table(ctx.rr.resource, &[obj], now, true, objects::resource_version(obj), None);
            let t = body::IncludeObject::from_param(ctx.param("includeObject")).apply(t, &[obj]);
            body::value_response(code, &t)
        }
    }
}
