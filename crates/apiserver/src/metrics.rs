//! The API server's metrics, as upstream's `endpoints/metrics`, `storage/etcd3/metrics` and
//! the max-in-flight filter name them, in the process's one registry (`skiff_metrics`).
//!
//! Every label value is a `&'static str` (a registered resource's group, version and plural, a
//! verb, a scope), so recording a request builds no string; a store call resolves its
//! `type` once per resource and operation ([`StoreMetrics`]).

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, OnceLock};
use std::time::Instant;

use async_trait::async_trait;
use futures::stream::BoxStream;
use http::{HeaderMap, Method};
use parking_lot::RwLock;
use skiff_metrics::{Counter, EncodeLabelSet, Family, Gauge, Histogram, HistogramFamily};
use skiff_rbac::Attributes;
use skiff_store::{Event, KeyValue, ListOptions, ListResult, Op, Result, Revision, Store};

#[cfg(test)]
use crate::ApiState;
use crate::handlers::Params;

/// Upstream's `component` label of requests the API server serves itself.
const APISERVER: &str = "apiserver";

/// The labels of `apiserver_request_duration_seconds` (and, with `code`, of
/// `apiserver_request_total`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    verb: &'static str,
    dry_run: &'static str,
    group: &'static str,
    version: &'static str,
    resource: &'static str,
    subresource: &'static str,
    scope: &'static str,
    component: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CodeLabels {
    #[prometheus(flatten)]
    request: RequestLabels,
    code: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LongRunningLabels {
    verb: &'static str,
    group: &'static str,
    version: &'static str,
    resource: &'static str,
    subresource: &'static str,
    scope: &'static str,
    component: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    request_kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WatchLabels {
    group: &'static str,
    version: &'static str,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResourceLabels {
    resource: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EtcdLabels {
    operation: &'static str,
    r#type: String,
}

pub struct ApiMetrics {
    requests: Family<CodeLabels, Counter>,
    durations: HistogramFamily<RequestLabels>,
    longrunning: Family<LongRunningLabels, Gauge>,
    inflight: Family<KindLabels, Gauge>,
    watch_events: Family<WatchLabels, Counter>,
    storage_objects: Family<ResourceLabels, Gauge>,
    etcd: HistogramFamily<EtcdLabels>,
}

fn request_duration_histogram() -> Histogram {
    Histogram::new(skiff_metrics::REQUEST_DURATION_BUCKETS)
}

pub static METRICS: LazyLock<ApiMetrics> = LazyLock::new(|| {
    let m = ApiMetrics {
        requests: Family::default(),
        durations: Family::new_with_constructor(request_duration_histogram),
        longrunning: Family::default(),
        inflight: Family::default(),
        watch_events: Family::default(),
        storage_objects: Family::default(),
        etcd: Family::new_with_constructor(request_duration_histogram),
    };
    skiff_metrics::register(
        "apiserver_request",
        "Counter of apiserver requests broken out for each verb, dry run value, group, version, resource, scope, component, and HTTP response code.",
        m.requests.clone(),
    );
    skiff_metrics::register(
        "apiserver_request_duration_seconds",
        "Response latency distribution in seconds for each verb, dry run value, group, version, resource, subresource, scope and component.",
        m.durations.clone(),
    );
    skiff_metrics::register(
        "apiserver_longrunning_requests",
        "Gauge of all active long-running apiserver requests broken out by verb, group, version, resource, scope and component. Not all requests are tracked this way.",
        m.longrunning.clone(),
    );
    skiff_metrics::register(
        "apiserver_current_inflight_requests",
        "Maximal number of currently used inflight request limit of this apiserver per request kind in last second.",
        m.inflight.clone(),
    );
    skiff_metrics::register(
        "apiserver_watch_events",
        "Number of events sent in watch clients",
        m.watch_events.clone(),
    );
    skiff_metrics::register(
        "apiserver_storage_objects",
        "Number of stored objects at the time of last check split by kind. In case of a fetching error, the value will be -1.",
        m.storage_objects.clone(),
    );
    skiff_metrics::register(
        "etcd_request_duration_seconds",
        "Etcd request latency in seconds for each operation and object type.",
        m.etcd.clone(),
    );
    m
});

/// Registers the API server's metrics (idempotent), so a scrape shows them before any request.
pub fn init() {
    LazyLock::force(&METRICS);
}

/// Upstream's `CleanScope`.
fn scope(a: &Attributes) -> &'static str {
    if !a.name.is_empty() || a.verb == "create" {
        "resource"
    } else if !a.namespace.is_empty() {
        "namespace"
    } else if a.resource_request {
        "cluster"
    } else {
        ""
    }
}

/// The non-resource paths recorded, each under its own path as upstream's `subresource`.
const NON_RESOURCE_PATHS: &[&str] = &[
    "/healthz",
    "/livez",
    "/readyz",
    "/metrics",
    "/version",
    "/api",
    "/apis",
    "/openapi/v3",
];

/// What a request is recorded as, worked out once from its attributes; `None` for a path that is
/// neither a served resource nor a known non-resource path (never a label of its own, so a
/// client cannot grow the series without bound).
pub fn request_labels(a: &Attributes, method: &Method, params: &Params, headers: &HeaderMap) -> Option<RequestLabels> {
    let dry_run = if params.get("dryRun").is_some_and(|v| !v.is_empty()) {
        "All"
    } else {
        ""
    };
    if !a.resource_request {
        let path = a.path.trim_end_matches('/');
        let path = if path.starts_with("/openapi/v3") {
            "/openapi/v3"
        } else {
            path
        };
        let path = *NON_RESOURCE_PATHS.iter().find(|p| **p == path)?;
        let verb = match *method {
            Method::GET => "GET",
            Method::HEAD => "HEAD",
            Method::POST => "POST",
            Method::PUT => "PUT",
            Method::PATCH => "PATCH",
            Method::DELETE => "DELETE",
            _ => return None,
        };
        return Some(RequestLabels {
            verb,
            dry_run,
            group: "",
            version: "",
            resource: "",
            subresource: path,
            scope: "",
            component: APISERVER,
        });
    }
    let res = skiff_api::registry::lookup(&a.api_group, &a.api_version, &a.resource)?;
    let subresource = if a.subresource.is_empty() {
        ""
    } else {
        res.subresources.iter().find(|s| **s == a.subresource)?
    };
    let verb = match a.verb.as_str() {
        _ if matches!(subresource, "exec" | "attach" | "portforward" | "proxy") => "CONNECT",
        "proxy" => "CONNECT",
        "get" => "GET",
        "list" => "LIST",
        "watch" => "WATCH",
        "create" => "POST",
        "update" => "PUT",
        "patch" => {
            let apply = headers
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|t| t.starts_with("application/apply-patch"));
            if apply { "APPLY" } else { "PATCH" }
        }
        "delete" => "DELETE",
        "deletecollection" => "DELETECOLLECTION",
        _ => return None,
    };
    Some(RequestLabels {
        verb,
        dry_run,
        group: res.group,
        version: res.version,
        resource: res.plural,
        subresource,
        scope: scope(a),
        component: APISERVER,
    })
}

/// Counts a finished request and its latency.
pub fn record(labels: RequestLabels, code: u16, start: Instant) {
    let m = &*METRICS;
    m.requests.get_or_create(&CodeLabels { request: labels, code }).inc();
    m.durations
        .get_or_create(&labels)
        .observe(skiff_metrics::seconds_since(start));
}

/// Holds a gauge up until dropped.
pub struct GaugeGuard(Gauge);

impl GaugeGuard {
    fn new(g: Gauge) -> GaugeGuard {
        g.inc();
        GaugeGuard(g)
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// A long-running request (watch, exec, logs, ...) counted in `apiserver_longrunning_requests`
/// while the guard lives (its response's body holds it).
pub fn long_running(labels: &RequestLabels) -> GaugeGuard {
    let l = LongRunningLabels {
        verb: labels.verb,
        group: labels.group,
        version: labels.version,
        resource: labels.resource,
        subresource: labels.subresource,
        scope: labels.scope,
        component: labels.component,
    };
    GaugeGuard::new(METRICS.longrunning.get_or_create_owned(&l))
}

/// A non-long-running request being served, in `apiserver_current_inflight_requests` by
/// upstream's request kinds (`mutating` unless get, list or watch).
pub fn in_flight(verb: &str) -> GaugeGuard {
    let request_kind = if matches!(verb, "get" | "list" | "watch") {
        "readOnly"
    } else {
        "mutating"
    };
    GaugeGuard::new(METRICS.inflight.get_or_create_owned(&KindLabels { request_kind }))
}

/// The counter of watch events sent for a resource (resolved once per watch).
pub fn watch_events(res: &skiff_api::registry::Resource) -> Counter {
    METRICS.watch_events.get_or_create_owned(&WatchLabels {
        group: res.group,
        version: res.version,
        kind: res.kind,
    })
}

/// `apiserver_storage_objects` from one list of every key: the count per stored resource
/// (`pods`, `deployments.apps`), as upstream's `Count` of each resource's prefix.
pub async fn observe_storage_objects(store: &dyn Store) {
    let list = match store.list("/registry/", ListOptions::default()).await {
        Ok(l) => l,
        Err(e) => {
            tracing::debug!(error = %e, "counting stored objects failed");
            return;
        }
    };
    let mut counts: HashMap<&str, i64> = HashMap::new();
    for kv in &list.items {
        *counts.entry(storage_type(&kv.key)).or_default() += 1;
    }
    let m = &*METRICS;
    // Resources whose last object went away are 0, not their last count.
    m.storage_objects.clear();
    for r in skiff_api::registry::RESOURCES {
        if r.is_create_only() || r.is_computed() {
            continue;
        }
        let q = r.qualified_plural();
        let n = counts.get(q.as_str()).copied().unwrap_or(0);
        m.storage_objects.get_or_create(&ResourceLabels { resource: q }).set(n);
    }
}

/// Recounts `apiserver_storage_objects` every minute, as upstream's storage does.
pub async fn storage_objects_loop(store: Arc<dyn Store>) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(60));
    loop {
        tick.tick().await;
        observe_storage_objects(&*store).await;
    }
}

/// A store key's resource: `pods` in `/registry/pods/NS/NAME`, `deployments.apps` in
/// `/registry/deployments.apps/...`; the first segment of Skiff's other keys (`allocations`).
fn storage_type(key: &str) -> &str {
    let rest = key
        .strip_prefix("/registry/")
        .unwrap_or_else(|| key.trim_start_matches('/'));
    rest.split('/').next().unwrap_or("")
}

/// The operations `etcd_request_duration_seconds` tells apart (upstream's names).
#[derive(Clone, Copy)]
enum StoreOp {
    Get = 0,
    List,
    Create,
    Update,
    Delete,
    Txn,
}

const STORE_OPS: [&str; 6] = ["get", "list", "create", "update", "delete", "txn"];

/// One store type's histogram per operation, each resolved on its first use.
type TypeHistograms = [OnceLock<Histogram>; STORE_OPS.len()];

/// The store, timed per call in `etcd_request_duration_seconds{operation,type}` (upstream's
/// `RecordEtcdRequest` around each etcd call). Each (type, operation) histogram is resolved
/// once and then reached by a read lock and a hash of the type.
pub struct StoreMetrics {
    inner: Arc<dyn Store>,
    resolved: RwLock<HashMap<Box<str>, Arc<TypeHistograms>>>,
}

impl StoreMetrics {
    pub fn wrap(inner: Arc<dyn Store>) -> Arc<dyn Store> {
        Arc::new(StoreMetrics {
            inner,
            resolved: RwLock::new(HashMap::new()),
        })
    }

    fn histogram(&self, op: StoreOp, key: &str) -> Histogram {
        let ty = storage_type(key);
        let known = self.resolved.read().get(ty).cloned();
        let slots = match known {
            Some(s) => s,
            None => self.resolved.write().entry(ty.into()).or_default().clone(),
        };
        slots[op as usize]
            .get_or_init(|| {
                METRICS.etcd.get_or_create_owned(&EtcdLabels {
                    operation: STORE_OPS[op as usize],
                    r#type: ty.to_string(),
                })
            })
            .clone()
    }

    fn observe(&self, op: StoreOp, key: &str, start: Instant) {
        self.histogram(op, key).observe(skiff_metrics::seconds_since(start));
    }
}

#[async_trait]
impl Store for StoreMetrics {
    async fn create(&self, key: &str, value: Vec<u8>) -> Result<KeyValue> {
        let start = Instant::now();
        let r = self.inner.create(key, value).await;
        self.observe(StoreOp::Create, key, start);
        r
    }
    async fn update(&self, key: &str, value: Vec<u8>, expected: Revision) -> Result<KeyValue> {
        let start = Instant::now();
        let r = self.inner.update(key, value, expected).await;
        self.observe(StoreOp::Update, key, start);
        r
    }
    async fn delete(&self, key: &str, expected: Option<Revision>) -> Result<KeyValue> {
        let start = Instant::now();
        let r = self.inner.delete(key, expected).await;
        self.observe(StoreOp::Delete, key, start);
        r
    }
    async fn txn(&self, ops: Vec<Op>) -> Result<Vec<KeyValue>> {
        // Recorded under the first operation's resource (a Service with its allocations).
        let first = match ops.first() {
            Some(Op::Create { key, .. } | Op::Update { key, .. } | Op::Delete { key, .. }) => key.clone(),
            None => String::new(),
        };
        let start = Instant::now();
        let r = self.inner.txn(ops).await;
        self.observe(StoreOp::Txn, &first, start);
        r
    }
    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        let start = Instant::now();
        let r = self.inner.get(key).await;
        self.observe(StoreOp::Get, key, start);
        r
    }
    async fn list(&self, prefix: &str, opts: ListOptions) -> Result<ListResult> {
        let start = Instant::now();
        let r = self.inner.list(prefix, opts).await;
        self.observe(StoreOp::List, prefix, start);
        r
    }
    async fn get_cached(&self, key: &str) -> Result<Option<KeyValue>> {
        self.inner.get_cached(key).await
    }
    async fn list_cached(&self, prefix: &str) -> Result<Vec<KeyValue>> {
        self.inner.list_cached(prefix).await
    }
    async fn watch(&self, prefix: &str, after: Revision) -> Result<BoxStream<'static, Event>> {
        self.inner.watch(prefix, after).await
    }
    async fn current_revision(&self) -> Result<Revision> {
        self.inner.current_revision().await
    }
    async fn compact(&self, revision: Revision) -> Result<()> {
        self.inner.compact(revision).await
    }
    async fn compacted_revision(&self) -> Result<Revision> {
        self.inner.compacted_revision().await
    }
    async fn erase_history(&self, revision: Revision) -> Result<()> {
        self.inner.erase_history(revision).await
    }
    async fn health(&self) -> Result<()> {
        self.inner.health().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line_value(text: &str, prefix: &str) -> Option<f64> {
        text.lines().find_map(|l| l.strip_prefix(prefix)?.trim().parse().ok())
    }

    #[tokio::test]
    async fn requests_store_calls_and_watches_are_in_the_exposition() {
        let dir = tempfile::tempdir().unwrap();
        let (state, token) = ApiState::for_tests(dir.path());
        let ns = r#"{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"default"}}"#;
        let (code, _) = state.call_for_tests(&token, "POST", "/api/v1/namespaces", ns).await;
        assert_eq!(code, 201);
        let cm = r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"metrics-a","namespace":"default"}}"#;
        let (code, _) = state
            .call_for_tests(&token, "POST", "/api/v1/namespaces/default/configmaps", cm)
            .await;
        assert_eq!(code, 201);
        let (code, _) = state
            .call_for_tests(&token, "GET", "/api/v1/namespaces/default/configmaps/metrics-a", "")
            .await;
        assert_eq!(code, 200);
        let (code, _) = state
            .call_for_tests(&token, "GET", "/api/v1/namespaces/default/configmaps/nope", "")
            .await;
        assert_eq!(code, 404);
        let (code, _) = state.call_for_tests(&token, "GET", "/api/v1/configmaps", "").await;
        assert_eq!(code, 200);
        let (code, _) = state
            .call_for_tests(
                &token,
                "GET",
                "/api/v1/namespaces/default/configmaps?watch=1&timeoutSeconds=1",
                "",
            )
            .await;
        assert_eq!(code, 200);
        observe_storage_objects(&*state.store).await;

        let req = http::Request::builder()
            .uri("/metrics")
            .header("authorization", format!("Bearer {token}"))
            .body(axum::body::Body::empty())
            .unwrap();
        let resp = tower::ServiceExt::oneshot(crate::server::router(state.clone()), req)
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["content-type"], skiff_metrics::CONTENT_TYPE);
        let bytes = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .unwrap()
            .to_bytes();
        let text = String::from_utf8(bytes.to_vec()).unwrap();

        let request = |verb: &str, scope: &str, code: u16| {
            format!(
                "apiserver_request_total{{verb=\"{verb}\",dry_run=\"\",group=\"\",version=\"v1\",resource=\"configmaps\",subresource=\"\",scope=\"{scope}\",component=\"apiserver\",code=\"{code}\"}} "
            )
        };
        for (verb, scope, code) in [
            ("POST", "resource", 201),
            ("GET", "resource", 200),
            ("GET", "resource", 404),
            ("LIST", "cluster", 200),
            ("WATCH", "namespace", 200),
        ] {
            let n = line_value(&text, &request(verb, scope, code));
            assert!(n.is_some_and(|n| n >= 1.0), "{verb} {scope} {code} missing:\n{text}");
        }
        assert!(
            text.contains("# TYPE apiserver_request_duration_seconds histogram\n"),
            "{text}"
        );
        assert!(text.contains(
            "apiserver_request_duration_seconds_bucket{verb=\"POST\",dry_run=\"\",group=\"\",version=\"v1\",resource=\"configmaps\",subresource=\"\",scope=\"resource\",component=\"apiserver\",le=\"0.005\"} "
        ), "{text}");
        assert!(text.contains("le=\"60\"} "), "upstream's last finite bucket: {text}");
        assert!(
            line_value(
                &text,
                "etcd_request_duration_seconds_count{operation=\"create\",type=\"configmaps\"} "
            )
            .is_some_and(|n| n >= 1.0),
            "{text}"
        );
        assert!(
            line_value(
                &text,
                "etcd_request_duration_seconds_count{operation=\"get\",type=\"configmaps\"} "
            )
            .is_some_and(|n| n >= 1.0),
            "{text}"
        );
        assert!(
            line_value(&text, "apiserver_storage_objects{resource=\"configmaps\"} ").is_some_and(|n| n >= 1.0),
            "{text}"
        );
        assert!(
            line_value(&text, "apiserver_storage_objects{resource=\"deployments.apps\"} ").is_some(),
            "{text}"
        );
        assert!(
            line_value(
                &text,
                "apiserver_watch_events_total{group=\"\",version=\"v1\",kind=\"ConfigMap\"} "
            )
            .is_some_and(|n| n >= 1.0),
            "{text}"
        );
        assert!(text.contains("apiserver_longrunning_requests{verb=\"WATCH\""), "{text}");
        assert!(
            line_value(&text, "apiserver_current_inflight_requests{request_kind=\"readOnly\"} ").is_some(),
            "{text}"
        );
        assert!(text.contains("\nprocess_resident_memory_bytes "), "{text}");
    }

    #[tokio::test]
    async fn metrics_are_refused_to_anonymous_as_upstream() {
        let dir = tempfile::tempdir().unwrap();
        let (state, _) = ApiState::for_tests(dir.path());
        crate::bootstrap::reconcile(&state).await.unwrap();
        let req = http::Request::builder()
            .uri("/metrics")
            .body(axum::body::Body::empty())
            .unwrap();
        let resp = tower::ServiceExt::oneshot(crate::server::router(state.clone()), req)
            .await
            .unwrap();
        assert_eq!(resp.status(), 403);
    }

    #[test]
    fn verbs_and_scopes_follow_upstream() {
        let params = Params::new();
        let mut headers = HeaderMap::new();
        let labels = |m: Method, path: &str, p: &Params, h: &HeaderMap| {
            let a = crate::request::parse(&m, path, p).unwrap().attributes();
            request_labels(&a, &m, p, h)
        };
        let l = labels(
            Method::POST,
            "/apis/apps/v1/namespaces/a/deployments",
            &params,
            &headers,
        )
        .unwrap();
        assert_eq!(
            (l.verb, l.group, l.resource, l.scope),
            ("POST", "apps", "deployments", "resource")
        );
        let l = labels(Method::GET, "/api/v1/namespaces/a/pods", &params, &headers).unwrap();
        assert_eq!((l.verb, l.scope), ("LIST", "namespace"));
        let l = labels(Method::GET, "/api/v1/namespaces/a/pods/p/log", &params, &headers).unwrap();
        assert_eq!((l.verb, l.subresource, l.scope), ("GET", "log", "resource"));
        let l = labels(Method::POST, "/api/v1/namespaces/a/pods/p/exec", &params, &headers).unwrap();
        assert_eq!(l.verb, "CONNECT");
        headers.insert(
            http::header::CONTENT_TYPE,
            "application/apply-patch+yaml".parse().unwrap(),
        );
        let l = labels(Method::PATCH, "/api/v1/nodes/n", &params, &headers).unwrap();
        assert_eq!((l.verb, l.scope), ("APPLY", "resource"));
        let dry: Params = [("dryRun".to_string(), "All".to_string())].into();
        let l = labels(Method::DELETE, "/api/v1/namespaces/a/pods", &dry, &headers).unwrap();
        assert_eq!((l.verb, l.dry_run), ("DELETECOLLECTION", "All"));
        let l = labels(Method::GET, "/readyz", &params, &headers).unwrap();
        assert_eq!((l.verb, l.subresource, l.resource), ("GET", "/readyz", ""));
        // Neither an unknown resource nor an unknown path becomes a series of its own.
        assert!(labels(Method::GET, "/api/v1/namespaces/a/nothings", &params, &headers).is_none());
        assert!(labels(Method::GET, "/random/path", &params, &headers).is_none());
        assert!(labels(Method::GET, "/api/v1/namespaces/a/pods/p/nosuch", &params, &headers).is_none());
        assert_eq!(storage_type("/registry/deployments.apps/a/b"), "deployments.apps");
        assert_eq!(storage_type("/allocations/nodeports/30000"), "allocations");
    }
}
