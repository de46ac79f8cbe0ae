//! The filters upstream's API server runs every request through (`k8s.io/apiserver/pkg/server/filters`
//! and `pkg/endpoints/filters`), applied by [`crate::handlers::handle`] to HTTPS and in-process
//! requests alike:
//!
//! - panic recovery (`WithPanicRecovery`): a handler that panics is answered 500 with upstream's
//!   text and logged with its request; a response body that panics while streaming (a watch) ends
//!   that stream. The process keeps serving.
//! - the request deadline (`WithRequestDeadline`, `WithTimeoutForNonLongRunningRequests`): a
//!   request that is not long-running ([`crate::request::RequestInfo::is_long_running`]) is answered 504 once
//!   `--request-timeout` (or a shorter `?timeout=`) has passed. Its handler runs on a task of its
//!   own and is never cancelled midway, as upstream lets the handler's goroutine finish: a write
//!   is applied whole or not at all, never half (an RBAC write and its authorizer refresh, a
//!   Service and its allocations). What the deadline does stop is the request body: once it has
//!   passed, reading more of it fails, so a client that sends its body slowly cannot have a write
//!   applied after its 504.
//! - max in flight (`WithMaxInFlightLimit`): at most `--max-requests-inflight` read-only and
//!   `--max-mutating-requests-inflight` mutating requests are served at once; one more is answered
//!   429 with `Retry-After: 1`. Long-running requests are not counted; `system:masters` is served
//!   even when the pool is full, as upstream's. Requests of the components inside `skiff server`
//!   (the in-process client, marked [`InProcess`]) are not counted either: they are upstream's
//!   loopback client, whose load is bounded by the components' own design, and a 429 must never
//!   starve the scheduler or a controller because network clients hold every slot.
//! - the wait group of non-long-running requests (`WithWaitGroup`): shutdown waits for it to
//!   drain ([`Filters::drained`]).

use std::any::Any;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderValue, StatusCode, header};
use skiff_api::StatusError;
use skiff_rbac::Attributes;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

use crate::tls::Identity;

/// Upstream's `--request-timeout` default.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Upstream's `--max-requests-inflight` default.
pub const DEFAULT_MAX_REQUESTS_INFLIGHT: usize = 400;
/// Upstream's `--max-mutating-requests-inflight` default.
pub const DEFAULT_MAX_MUTATING_REQUESTS_INFLIGHT: usize = 200;

/// Upstream's `retryAfter` of the max-in-flight filter.
const RETRY_AFTER: &str = "1";
/// What upstream's max-in-flight filter answers (`http.Error`, plain text).
const TOO_MANY_REQUESTS: &str = "Too many requests, please try again later.\n";
/// What upstream's panic recovery answers (`http.Error`, plain text).
const PANICKED: &str = "This request caused apiserver to panic. Look in the logs for details.\n";
/// Upstream's `WithTimeoutForNonLongRunningRequests` message (`NewTimeoutError` prefixes it).
const TIMED_OUT: &str = "Timeout: request did not complete within the allotted timeout";
/// Upstream's `WithRequestDeadline` message for a `?timeout=` that does not parse.
const INVALID_TIMEOUT: &str = "invalid timeout specified in the request URL";

/// The limits of `--request-timeout`, `--max-requests-inflight` and
/// `--max-mutating-requests-inflight` (0: no limit, as upstream).
#[derive(Clone, Debug)]
pub struct Limits {
    pub request_timeout: Duration,
    pub max_requests_inflight: usize,
    pub max_mutating_requests_inflight: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            max_requests_inflight: DEFAULT_MAX_REQUESTS_INFLIGHT,
            max_mutating_requests_inflight: DEFAULT_MAX_MUTATING_REQUESTS_INFLIGHT,
        }
    }
}

/// Set on requests of the in-process client (the components inside `skiff server`).
#[derive(Clone, Copy, Debug)]
pub struct InProcess;

/// The filters' shared state: the limits, the in-flight pools and the wait group.
pub struct Filters {
    request_timeout: Duration,
    read_only: Option<Arc<Semaphore>>,
    mutating: Option<Arc<Semaphore>>,
    waiting: Arc<WaitGroup>,
}

impl Default for Filters {
    fn default() -> Self {
        Filters::new(&Limits::default())
    }
}

/// What [`Filters::admit`] decided.
pub enum Admission {
    /// Served, holding a slot of its pool until it is done.
    Slot(#[allow(dead_code)] OwnedSemaphorePermit),
    /// Served without a slot: not counted, or `system:masters` over the limit.
    Exempt,
    /// Over the limit: answer this 429.
    Refused(Response),
}

impl Filters {
    pub fn new(limits: &Limits) -> Filters {
        let pool = |n: usize| (n > 0).then(|| Arc::new(Semaphore::new(n)));
        Filters {
            request_timeout: limits.request_timeout,
            read_only: pool(limits.max_requests_inflight),
            mutating: pool(limits.max_mutating_requests_inflight),
            waiting: Arc::new(WaitGroup::default()),
        }
    }

    /// Upstream's `WithMaxInFlightLimit`: a slot of the read-only (get, list, watch) or the
    /// mutating pool, else a 429 unless the caller is in `system:masters`.
    pub fn admit(&self, attributes: &Attributes, user: &Identity, in_process: bool, long_running: bool) -> Admission {
        if in_process || long_running {
            return Admission::Exempt;
        }
        let mutating = !matches!(attributes.verb.as_str(), "get" | "list" | "watch");
        let pool = if mutating { &self.mutating } else { &self.read_only };
        let Some(pool) = pool else {
            return Admission::Exempt;
        };
        if let Ok(permit) = pool.clone().try_acquire_owned() {
            return Admission::Slot(permit);
        }
        // A system:master is so powerful that they should always get an answer (upstream).
        if user.groups.iter().any(|g| g == crate::authz::MASTERS) {
            return Admission::Exempt;
        }
        tracing::info!(
            user = %user.user,
            verb = %attributes.verb,
            path = %attributes.path,
            mutating,
            "too many requests in flight, answered 429"
        );
        Admission::Refused(too_many_requests())
    }

    /// Upstream's `WithRequestDeadline`: `--request-timeout`, or the request's `?timeout=` when
    /// shorter and positive; a `timeout` that is no duration is a 400.
    pub fn deadline_of(&self, timeout_param: Option<&str>) -> Result<Duration, StatusError> {
        let Some(value) = timeout_param.filter(|v| !v.is_empty()) else {
            return Ok(self.request_timeout);
        };
        let (negative, unsigned) = match value.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, value.strip_prefix('+').unwrap_or(value)),
        };
        let Some(asked) = skiff_api::validation::parse_go_duration(unsigned) else {
            return Err(StatusError::bad_request(format!(
                "{INVALID_TIMEOUT} - time: invalid duration \"{value}\""
            )));
        };
        if negative || asked.is_zero() || asked >= self.request_timeout {
            return Ok(self.request_timeout);
        }
        Ok(asked)
    }

    /// Counts a non-long-running request until the guard is dropped (not once shutdown waits:
    /// the requests that come after, from components being stopped, are not waited for).
    pub fn track(&self) -> InFlightGuard {
        if self.waiting.closing.load(Ordering::Acquire) {
            return InFlightGuard(None);
        }
        self.waiting.count.fetch_add(1, Ordering::AcqRel);
        InFlightGuard(Some(self.waiting.clone()))
    }

    /// Non-long-running requests being handled.
    pub fn in_flight(&self) -> usize {
        self.waiting.count.load(Ordering::Acquire)
    }

    /// Waits until no non-long-running request that began before is being handled, or
    /// `deadline`; whether they all finished.
    pub async fn drained(&self, deadline: Instant) -> bool {
        self.waiting.closing.store(true, Ordering::Release);
        loop {
            let notified = self.waiting.zero.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.in_flight() == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.in_flight() == 0;
            }
        }
    }
}

#[derive(Default)]
struct WaitGroup {
    count: AtomicUsize,
    zero: Notify,
    /// Shutdown waits: requests from now on are not counted.
    closing: AtomicBool,
}

/// A request counted by [`Filters::track`].
pub struct InFlightGuard(Option<Arc<WaitGroup>>);

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        if let Some(group) = self.0.take()
            && group.count.fetch_sub(1, Ordering::AcqRel) == 1
        {
            group.zero.notify_waiters();
        }
    }
}

/// A plain-text answer, as Go's `http.Error` writes it.
fn plain(code: StatusCode, text: &'static str) -> Response {
    let mut r = Response::new(Body::from(text));
    *r.status_mut() = code;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert("x-content-type-options", HeaderValue::from_static("nosniff"));
    r
}

/// Upstream's 429 of the max-in-flight filter.
pub fn too_many_requests() -> Response {
    let mut r = plain(StatusCode::TOO_MANY_REQUESTS, TOO_MANY_REQUESTS);
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static(RETRY_AFTER));
    r
}

/// Upstream's 504 Status for a request past its deadline.
pub fn timed_out() -> Response {
    crate::body::error_response(&StatusError::timeout(TIMED_OUT))
}

/// Upstream's 500 for a request whose handler panicked.
pub fn panicked() -> Response {
    plain(StatusCode::INTERNAL_SERVER_ERROR, PANICKED)
}

/// The message a panic carried.
pub fn panic_message(payload: &(dyn Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "a panic without a message"
    }
}

/// A request body that fails once `deadline` has passed while more of it is awaited.
pub struct DeadlineBody {
    inner: Body,
    deadline: Instant,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl DeadlineBody {
    pub fn new(inner: Body, deadline: Instant) -> DeadlineBody {
        DeadlineBody {
            inner,
            deadline,
            sleep: None,
        }
    }
}

impl http_body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => Poll::Ready(frame),
            Poll::Pending => {
                // The timer is made only for a body that is still arriving.
                let deadline = this.deadline;
                let sleep = this
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                match sleep.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(axum::Error::new(
                        "the request's deadline passed while its body was being read",
                    )))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// A streaming response body (a watch, a log) whose panic ends the stream with an error instead
/// of the task polling it: the connection's, or an in-process component's.
pub struct RecoverBody {
    inner: Body,
    request: Option<(http::Method, http::Uri)>,
}

impl RecoverBody {
    /// `response` with its body guarded, when it is streamed (a body of known length was made
    /// whole by its handler and cannot panic).
    pub fn wrap(response: Response, method: &http::Method, uri: &http::Uri) -> Response {
        if http_body::Body::size_hint(response.body()).exact().is_some() {
            return response;
        }
        response.map(|inner| {
            Body::new(RecoverBody {
                inner,
                request: Some((method.clone(), uri.clone())),
            })
        })
    }
}

impl http_body::Body for RecoverBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        if this.request.is_none() {
            return Poll::Ready(None);
        }
        let inner = &mut this.inner;
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| Pin::new(inner).poll_frame(cx))) {
            Ok(poll) => poll,
            Err(payload) => {
                if let Some((method, uri)) = this.request.take() {
                    tracing::error!(
                        %method,
                        uri = %uri,
                        panic = panic_message(&*payload),
                        "apiserver panic'd while streaming a response; the stream is closed"
                    );
                }
                Poll::Ready(Some(Err(axum::Error::new("the server panicked while streaming"))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.request.is_none() || self.inner.is_end_stream()
    }
}

/// Handlers that misbehave on purpose, reachable only in the crate's test build (after
/// authentication and max in flight, as any handler).
#[cfg(test)]
pub mod test_routes {
    use super::*;
    use crate::ApiState;

    /// The keys `/skiff-test/slow-writes` writes, 150 ms apart.
    pub const SLOW_KEYS: [&str; 2] = [
        "/registry/configmaps/default/slow-1",
        "/registry/configmaps/default/slow-2",
    ];

    pub async fn serve(state: &Arc<ApiState>, path: &str) -> Option<Response> {
        match path {
            "/skiff-test/panic" => panic!("injected panic"),
            "/skiff-test/panic-stream" => {
                let chunks = futures::stream::unfold(0, |n| async move {
                    if n == 1 {
                        panic!("injected panic in a stream");
                    }
                    Some((Ok::<_, std::io::Error>(Bytes::from_static(b"first\n")), n + 1))
                });
                Some(Response::new(Body::from_stream(chunks)))
            }
            "/skiff-test/slow-writes" => {
                for key in SLOW_KEYS {
                    tokio::time::sleep(Duration::from_millis(150)).await;
                    let value = serde_json::json!({"kind": "ConfigMap", "apiVersion": "v1",
                        "metadata": {"name": key.rsplit('/').next(), "namespace": "default"}});
                    state
                        .store
                        .create(key, crate::objects::encode_for_store(&value))
                        .await
                        .expect("write");
                }
                Some(Response::new(Body::from("written")))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(method: &str, path: &str, query: &[(&str, &str)]) -> crate::request::RequestInfo {
        let params: crate::handlers::Params = query.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let method = http::Method::from_bytes(method.as_bytes()).unwrap();
        crate::request::parse(&method, path, &params).unwrap()
    }

    #[test]
    fn long_running_requests_as_upstream() {
        let long = |m, p, q| info(m, p, q).is_long_running();
        assert!(long("GET", "/api/v1/pods", &[("watch", "true")]));
        assert!(long("GET", "/api/v1/watch/namespaces/default/pods", &[]));
        assert!(long("GET", "/api/v1/namespaces/default/pods/p/log", &[]));
        assert!(long("POST", "/api/v1/namespaces/default/pods/p/exec", &[]));
        assert!(long("GET", "/api/v1/namespaces/default/pods/p/attach", &[]));
        assert!(long("POST", "/api/v1/namespaces/default/pods/p/portforward", &[]));
        assert!(long("GET", "/api/v1/namespaces/default/services/s/proxy/x", &[]));
        assert!(long("POST", "/skiff/secrets-encrypt/reencrypt", &[]));
        assert!(!long("GET", "/api/v1/pods", &[]));
        assert!(!long("GET", "/api/v1/namespaces/default/pods/p", &[]));
        // A named GET is a get, `?watch` or not (upstream authorizes and serves it as one).
        assert!(!long("GET", "/api/v1/namespaces/default/pods/p", &[("watch", "1")]));
        assert!(!long("POST", "/api/v1/namespaces/default/pods", &[]));
        assert!(!long("PUT", "/api/v1/namespaces/default/pods/p/status", &[]));
        assert!(!long("GET", "/healthz", &[]));
        assert!(!long("GET", "/skiff/secrets-encrypt/status", &[]));
    }

    #[test]
    fn deadlines_as_upstream() {
        let f = Filters::new(&Limits {
            request_timeout: Duration::from_secs(60),
            ..Default::default()
        });
        assert_eq!(f.deadline_of(None), Ok(Duration::from_secs(60)));
        assert_eq!(f.deadline_of(Some("")), Ok(Duration::from_secs(60)));
        assert_eq!(f.deadline_of(Some("5s")), Ok(Duration::from_secs(5)));
        assert_eq!(f.deadline_of(Some("1m30s")), Ok(Duration::from_secs(60)));
        assert_eq!(f.deadline_of(Some("0s")), Ok(Duration::from_secs(60)));
        assert_eq!(f.deadline_of(Some("-5s")), Ok(Duration::from_secs(60)));
        let e = f.deadline_of(Some("abc")).unwrap_err();
        assert_eq!(e.code, 400);
        assert_eq!(
            e.message,
            "invalid timeout specified in the request URL - time: invalid duration \"abc\""
        );
    }

    #[test]
    fn max_in_flight_pools() {
        let f = Filters::new(&Limits {
            max_requests_inflight: 1,
            max_mutating_requests_inflight: 1,
            ..Default::default()
        });
        let jane = Identity::new("jane", &["system:authenticated"]);
        let root = Identity::new("root", &["system:masters"]);
        let get = info("GET", "/api/v1/namespaces/default/pods/p", &[]).attributes();
        let create = info("POST", "/api/v1/namespaces/default/pods", &[]).attributes();
        let first = f.admit(&get, &jane, false, false);
        assert!(matches!(first, Admission::Slot(_)));
        // The read-only pool is full; the mutating one is not.
        let Admission::Refused(r) = f.admit(&get, &jane, false, false) else {
            panic!("a second read was admitted");
        };
        assert_eq!(r.status(), 429);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        let write = f.admit(&create, &jane, false, false);
        assert!(matches!(write, Admission::Slot(_)));
        assert!(matches!(f.admit(&create, &jane, false, false), Admission::Refused(_)));
        // Exempt: system:masters, the in-process client, long-running requests.
        assert!(matches!(f.admit(&get, &root, false, false), Admission::Exempt));
        assert!(matches!(f.admit(&get, &jane, true, false), Admission::Exempt));
        assert!(matches!(f.admit(&get, &jane, false, true), Admission::Exempt));
        // A finished request gives its slot back.
        drop(first);
        assert!(matches!(f.admit(&get, &jane, false, false), Admission::Slot(_)));
        // 0 is no limit.
        let unlimited = Filters::new(&Limits {
            max_requests_inflight: 0,
            max_mutating_requests_inflight: 0,
            ..Default::default()
        });
        for _ in 0..1000 {
            assert!(matches!(
                unlimited.admit(&create, &jane, false, false),
                Admission::Exempt
            ));
        }
    }

    #[tokio::test]
    async fn drained_waits_for_tracked_requests() {
        let f = Arc::new(Filters::default());
        let guard = f.track();
        assert_eq!(f.in_flight(), 1);
        assert!(!f.drained(Instant::now() + Duration::from_millis(20)).await);
        let waiter = {
            let f = f.clone();
            tokio::spawn(async move { f.drained(Instant::now() + Duration::from_secs(30)).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(guard);
        assert!(waiter.await.unwrap());
        assert_eq!(f.in_flight(), 0);
        // Requests that begin once shutdown waits are not waited for.
        let late = f.track();
        assert_eq!(f.in_flight(), 0);
        assert!(f.drained(Instant::now()).await);
        drop(late);
    }

    // ---- through the router, as HTTPS and the in-process client reach it ----

    use crate::ApiState;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    /// A state with `limits`, and a `system:masters` token.
    fn state_with(dir: &std::path::Path, limits: Limits) -> (Arc<ApiState>, String) {
        let (state, token) = ApiState::for_tests(dir);
        let mut state = Arc::try_unwrap(state).ok().expect("one reference");
        state.filters = Filters::new(&limits);
        (Arc::new(state), token)
    }

    fn request(method: &str, uri: &str, token: &str, body: Body) -> http::Request<Body> {
        http::Request::builder()
            .method(method)
            .uri(uri)
            .header("authorization", format!("Bearer {token}"))
            .header("content-type", "application/json")
            .body(body)
            .unwrap()
    }

    async fn call(state: &Arc<ApiState>, req: http::Request<Body>) -> (u16, http::HeaderMap, String) {
        let resp = crate::server::router(state.clone()).oneshot(req).await.unwrap();
        let (parts, body) = resp.into_parts();
        let bytes = body.collect().await.unwrap().to_bytes();
        (
            parts.status.as_u16(),
            parts.headers,
            String::from_utf8_lossy(&bytes).into_owned(),
        )
    }

    /// A request body that sends `first` and then nothing, ever.
    fn stalled_body(first: &'static str) -> Body {
        let chunks =
            futures::stream::once(async move { Ok::<_, std::io::Error>(Bytes::from_static(first.as_bytes())) })
                .chain(futures::stream::pending());
        Body::from_stream(chunks)
    }

    use futures::StreamExt;

    #[tokio::test]
    async fn a_panicking_handler_is_a_500_and_the_server_serves_on() {
        let dir = tempfile::tempdir().unwrap();
        let (state, token) = ApiState::for_tests(dir.path());
        let (code, headers, body) = call(&state, request("GET", "/skiff-test/panic", &token, Body::empty())).await;
        assert_eq!(code, 500);
        assert_eq!(body, PANICKED);
        assert_eq!(headers[header::CONTENT_TYPE], "text/plain; charset=utf-8");
        assert!(headers.contains_key("audit-id"));
        let (code, _, body) = call(&state, request("GET", "/api/v1/namespaces", &token, Body::empty())).await;
        assert_eq!(code, 200, "{body}");

        // The in-process client the components use: an error, and the next call is answered.
        let client = crate::client(state.clone());
        let req = http::Request::get("/skiff-test/panic").body(Vec::new()).unwrap();
        match client.request_text(req).await {
            Err(kube::Error::Api(e)) => assert_eq!(e.code, 500, "{e:?}"),
            other => panic!("expected a 500, got {other:?}"),
        }
        let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client);
        namespaces.list(&Default::default()).await.unwrap();
    }

    #[tokio::test]
    async fn a_stream_that_panics_is_closed() {
        let dir = tempfile::tempdir().unwrap();
        let (state, token) = ApiState::for_tests(dir.path());
        let resp = crate::server::router(state.clone())
            .oneshot(request("GET", "/skiff-test/panic-stream", &token, Body::empty()))
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let mut body = resp.into_body();
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(first, "first\n");
        assert!(
            body.frame().await.unwrap().is_err(),
            "the panic ends the stream with an error"
        );
        assert!(body.frame().await.is_none(), "and nothing follows");

        // Read by an in-process client: its task sees an error, not the panic.
        let client = crate::client(state.clone());
        let req = http::Request::get("/skiff-test/panic-stream").body(Vec::new()).unwrap();
        let stream = client.request_stream(req).await.unwrap();
        let mut read = Vec::new();
        let result = futures::AsyncReadExt::read_to_end(&mut Box::pin(stream), &mut read).await;
        assert_eq!(read, b"first\n");
        assert!(result.is_err(), "{result:?}");
        let (code, _, _) = call(&state, request("GET", "/api/v1/namespaces", &token, Body::empty())).await;
        assert_eq!(code, 200);
    }

    #[tokio::test]
    async fn past_its_deadline_a_request_is_a_504_and_its_handler_finishes_whole() {
        let dir = tempfile::tempdir().unwrap();
        let limits = Limits {
            request_timeout: Duration::from_millis(100),
            ..Default::default()
        };
        let (state, token) = state_with(dir.path(), limits);
        let started = Instant::now();
        let (code, headers, body) =
            call(&state, request("GET", "/skiff-test/slow-writes", &token, Body::empty())).await;
        assert!(
            started.elapsed() < Duration::from_millis(290),
            "answered when the writes were done"
        );
        assert_eq!(code, 504, "{body}");
        let status: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(status["reason"], "Timeout");
        assert_eq!(status["code"], 504);
        assert_eq!(
            status["message"],
            "Timeout: request did not complete within the allotted timeout"
        );
        assert!(headers.contains_key("audit-id"));
        // The handler was not cancelled between its two writes.
        assert!(state.filters.drained(Instant::now() + Duration::from_secs(10)).await);
        for key in test_routes::SLOW_KEYS {
            assert!(state.store.get(key).await.unwrap().is_some(), "{key} written");
        }

        // A shorter ?timeout= is kept; one that does not parse is a 400.
        let (code, _, body) = call(
            &state,
            request("GET", "/api/v1/namespaces?timeout=abc", &token, Body::empty()),
        )
        .await;
        assert_eq!(code, 400, "{body}");
        assert!(body.contains("invalid timeout specified in the request URL"), "{body}");
        let (code, _, _) = call(
            &state,
            request("GET", "/api/v1/namespaces?timeout=50ms", &token, Body::empty()),
        )
        .await;
        assert_eq!(code, 200);
    }

    #[tokio::test]
    async fn a_body_still_arriving_at_the_deadline_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let limits = Limits {
            request_timeout: Duration::from_millis(100),
            ..Default::default()
        };
        let (state, token) = state_with(dir.path(), limits);
        let (code, _, body) = call(
            &state,
            request(
                "POST",
                "/api/v1/namespaces/default/configmaps",
                &token,
                stalled_body(r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"late"},"#),
            ),
        )
        .await;
        assert_eq!(code, 504, "{body}");
        assert!(state.filters.drained(Instant::now() + Duration::from_secs(10)).await);
        let (code, _, _) = call(
            &state,
            request(
                "GET",
                "/api/v1/namespaces/default/configmaps/late",
                &token,
                Body::empty(),
            ),
        )
        .await;
        assert_eq!(code, 404);
    }

    #[tokio::test]
    async fn over_max_in_flight_is_a_429_but_not_for_masters_or_in_process() {
        let dir = tempfile::tempdir().unwrap();
        let limits = Limits {
            max_requests_inflight: 1,
            max_mutating_requests_inflight: 1,
            ..Default::default()
        };
        let (state, token) = state_with(dir.path(), limits);
        let as_jane = |method: &str, uri: &str, body: Body| {
            let mut req = http::Request::builder().method(method).uri(uri).body(body).unwrap();
            req.extensions_mut()
                .insert(Some(Identity::new("jane", &["system:authenticated"])));
            req
        };
        // A read whose body never ends holds the read-only pool's only slot.
        let holder = {
            let state = state.clone();
            let req = as_jane("GET", "/api/v1/namespaces/default/configmaps", stalled_body("{"));
            tokio::spawn(async move { call(&state, req).await })
        };
        let refused = loop {
            let (code, headers, body) = call(&state, as_jane("GET", "/api/v1/namespaces", Body::empty())).await;
            if code == 429 {
                break (headers, body);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        assert_eq!(refused.0[header::RETRY_AFTER], "1");
        assert_eq!(refused.1, "Too many requests, please try again later.\n");
        // Mutating requests have a pool of their own.
        let (code, _, _) = call(
            &state,
            as_jane("DELETE", "/api/v1/namespaces/default/configmaps/x", Body::empty()),
        )
        .await;
        assert_ne!(code, 429);
        // system:masters is served over the limit.
        let (code, _, body) = call(&state, request("GET", "/api/v1/namespaces", &token, Body::empty())).await;
        assert_eq!(code, 200, "{body}");
        // So is the in-process client, as jane.
        let client = crate::client_as(state.clone(), Identity::new("jane", &["system:authenticated"]));
        let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client);
        match namespaces.list(&Default::default()).await {
            Err(kube::Error::Api(e)) => assert_eq!(e.code, 403, "{e:?}"),
            other => panic!("expected jane's 403, got {other:?}"),
        }
        holder.abort();
    }
}
