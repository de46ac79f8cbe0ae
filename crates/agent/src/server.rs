//! The agent's HTTPS endpoint, with upstream kubelet paths, for the API server to proxy to:
//!
//! - `GET /containerLogs/{ns}/{pod}/{container}?follow&tailLines&timestamps&previous&sinceSeconds&limitBytes`
//! - `GET /exec/{ns}/{pod}/{container}?command=..&command=..&stdin&stdout&stderr&tty` (WebSocket)
//! - `GET /attach/{ns}/{pod}/{container}?stdin&stdout&stderr&tty` (WebSocket)
//! - `GET /portForward/{ns}/{pod}?ports=8080,9090` (WebSocket)
//! - `GET /healthz`
//!
//! Exec and attach speak the `v5.channel.k8s.io` (also v4, v3, v2, `channel.k8s.io`) framing: each binary
//! message starts with a channel byte: 0 stdin, 1 stdout, 2 stderr, 3 status (a `metav1.Status` JSON on
//! v4+), 4 resize (`{"Width":W,"Height":H}`), and on v5, 255 closes the channel named by the next byte.
//! Port forwarding speaks two protocols. Offered `SPDY/3.1+portforward.k8s.io` (kubectl's tunneling
//! dialer), every binary message carries bytes of a SPDY/3.1 session in which the client opens a data and
//! an error stream per forwarded connection (headers `streamType`, `port`, `requestID`), as upstream's
//! kubelet serves it over SPDY (see `spdy`). Otherwise it is upstream kubelet's WebSocket port-forward
//! protocol (`v4.channel.k8s.io` or no subprotocol): for the i-th port of `ports=`, channel 2i carries data
//! and 2i+1 errors, and the first frame the server sends on each carries the port as two little-endian
//! bytes. Connections go to the pod IP.
//! TLS uses a self-signed serving certificate. A caller presents a certificate the cluster CA
//! signed or a bearer token, and every request is authorized by the API server
//! ([`crate::server_auth`]), as upstream's kubelet authorizes them.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use axum::Router;
use axum::body::Body;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{FromRequestParts, Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use bollard::Docker;
use bollard::container::LogOutput;
use bollard::exec::{StartExecOptions, StartExecResults};
use bollard::models::ExecConfig;
use bollard::query_parameters::{
    AttachContainerOptionsBuilder, ListContainersOptionsBuilder, LogsOptionsBuilder, ResizeContainerTTYOptionsBuilder,
    ResizeExecOptionsBuilder,
};
use futures::{SinkExt, Stream, StreamExt};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::io::AsyncWriteExt;

use crate::docker::{
    LABEL_CONTAINER_NAME, LABEL_POD_NAME, LABEL_POD_NAMESPACE, LABEL_RESTART_COUNT, LABEL_TYPE, Owner, TYPE_CONTAINER,
    label,
};
use crate::server_auth;

/// The subprotocols offered, most preferred first.
pub const PROTOCOLS: [&str; 5] = [
    "v5.channel.k8s.io",
    "v4.channel.k8s.io",
    "v3.channel.k8s.io",
    "v2.channel.k8s.io",
    "channel.k8s.io",
];

#[derive(Clone)]
pub struct ServerState {
    pub docker: Docker,
    pub node: String,
    /// The cluster's identity, which the node's containers are labelled with.
    pub cluster: String,
    /// The API client `/pods` lists this node's pods with (none: `/pods` is not served).
    pub client: Option<kube::Client>,
    /// The node's resource usage, served at `/stats/summary`.
    pub stats: crate::stats::Sampler,
}

impl ServerState {
    fn owner(&self) -> crate::docker::Owner<'_> {
        crate::docker::Owner {
            node: &self.node,
            cluster: &self.cluster,
        }
    }
}

/// A started endpoint: where it listens and the SHA-256 (hex) of its serving certificate,
/// which the Node publishes so the API server can pin it.
#[derive(Clone, Debug)]
pub struct Endpoint {
    pub addr: SocketAddr,
    pub cert_sha256: String,
}

/// Starts serving on `addr`.
pub async fn serve(addr: SocketAddr, ca_pem: &str, sans: Vec<String>, state: ServerState) -> anyhow::Result<Endpoint> {
    let (tls, cert_sha256) = tls_config(ca_pem, sans)?;
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        // Another agent (or kubelet) holds the port: any free port will do, since the Node
        // publishes the bound one.
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && addr.port() != 0 => {
            tracing::info!(%addr, "port in use; the agent endpoint takes a free port");
            tokio::net::TcpListener::bind(SocketAddr::new(addr.ip(), 0))
                .await
                .with_context(|| format!("binding {} on a free port", addr.ip()))?
        }
        Err(e) => return Err(e).with_context(|| format!("binding {addr}")),
    };
    let bound = listener.local_addr()?;
    crate::metrics::init();
    let authorizer = Arc::new(server_auth::Authorizer::new(state.client.clone(), &state.node));
    let app = router(state);
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a connection");
                    continue;
                }
            };
            let acceptor = acceptor.clone();
            let app = app.clone();
            let authorizer = authorizer.clone();
            tokio::spawn(async move {
                let tls = match acceptor.accept(tcp).await {
                    Ok(t) => t,
                    Err(e) => {
                        tracing::debug!(%peer, error = %e, "TLS handshake failed");
                        return;
                    }
                };
                // The caller its certificate names (the cluster CA signed it), if it has one;
                // every request is then authorized by the API server, whoever it is.
                let cert_caller = tls
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .and_then(|c| server_auth::Caller::from_certificate(c));
                let app = app.layer(axum::middleware::from_fn(move |req, next| {
                    authorize(authorizer.clone(), cert_caller.clone(), peer, req, next)
                }));
                let service = hyper_util::service::TowerToHyperService::new(app);
                let conn = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                    .with_upgrades();
                if let Err(e) = conn.await {
                    tracing::debug!(%peer, error = %e, "serving a connection");
                }
            });
        }
    });
    tracing::info!(%bound, "agent endpoint listening");
    Ok(Endpoint {
        addr: bound,
        cert_sha256,
    })
}

/// The process's metrics (the agent's `kubelet_*` and the process's), in the Prometheus text format.
async fn metrics() -> Response {
    let mut r = Response::new(axum::body::Body::from(skiff_metrics::encode()));
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(skiff_metrics::CONTENT_TYPE),
    );
    r
}

/// Upstream kubelet's filter: the caller (its certificate, else its bearer token through
/// TokenReview; neither: 401), then a SubjectAccessReview of what it asks (refused: 403 in the
/// kubelet's words).
async fn authorize(
    authorizer: Arc<server_auth::Authorizer>,
    cert_caller: Option<server_auth::Caller>,
    peer: SocketAddr,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let caller = match cert_caller {
        Some(c) => Some(c),
        None => match req
            .headers()
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
        {
            Some(token) => authorizer.authenticate_token(token.trim()).await,
            None => None,
        },
    };
    let Some(caller) = caller else {
        tracing::info!(%peer, path = %req.uri().path(), "refused a caller without credentials");
        return (StatusCode::UNAUTHORIZED, "Unauthorized").into_response();
    };
    let (verb, subresources) = server_auth::attributes(req.method(), req.uri().path());
    for sub in subresources {
        if authorizer.allowed(&caller, verb, sub).await {
            return next.run(req).await;
        }
    }
    let sub = subresources.last().copied().unwrap_or("proxy");
    tracing::info!(%peer, user = %caller.user, verb, subresource = sub, "refused a request the API server does not authorize");
    (
        StatusCode::FORBIDDEN,
        format!(
            "Forbidden (user={}, verb={verb}, resource=nodes, subresource={sub})",
            caller.user
        ),
    )
        .into_response()
}

/// The TLS configuration: a fresh self-signed serving certificate, client certificates required.
pub fn tls_config(ca_pem: &str, sans: Vec<String>) -> anyhow::Result<(rustls::ServerConfig, String)> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots
            .add(cert.context("parsing the cluster CA")?)
            .context("adding the cluster CA")?;
    }
    // A certificate is optional: a caller may bring a bearer token instead.
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .allow_unauthenticated()
        .build()
        .context("building the client certificate verifier")?;
    let certified = rcgen::generate_simple_self_signed(sans).context("generating the serving certificate")?;
    let cert_sha256 = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(certified.cert.der().as_ref()))
    };
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(certified.signing_key.serialize_der()));
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("choosing TLS versions")?
        .with_client_cert_verifier(verifier)
        .with_single_cert(vec![certified.cert.der().clone()], key)
        .context("configuring the serving certificate")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok((config, cert_sha256))
}

pub fn router(state: ServerState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/pods", get(node_pods))
        .route("/stats/summary", get(stats_summary))
        .route("/metrics", get(metrics))
        .route("/containerLogs/{ns}/{pod}/{container}", get(container_logs))
        .route("/exec/{ns}/{pod}/{container}", any(exec))
        .route("/exec/{ns}/{pod}/{uid}/{container}", any(exec_with_uid))
        .route("/attach/{ns}/{pod}/{container}", any(attach))
        .route("/attach/{ns}/{pod}/{uid}/{container}", any(attach_with_uid))
        .route("/portForward/{ns}/{pod}", any(port_forward))
        .route("/portForward/{ns}/{pod}/{uid}", any(port_forward_with_uid))
        .with_state(state)
}

/// `/pods`: the pods bound to this node, as a PodList (the kubelet's `/pods`).
/// The kubelet's Summary API: the node's and its pods' containers' CPU and memory.
async fn stats_summary(State(state): State<ServerState>) -> Response {
    let summary = state.stats.summary(&state.node);
    ([(http::header::CONTENT_TYPE, "application/json")], summary.to_string()).into_response()
}

async fn node_pods(State(state): State<ServerState>) -> Response {
    let Some(client) = state.client.clone() else {
        return error(StatusCode::NOT_FOUND, "404 page not found".into());
    };
    let api: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::all(client);
    let params = kube::api::ListParams::default().fields(&format!("spec.nodeName={}", state.node));
    match api.list(&params).await {
        Ok(list) => {
            let pods = serde_json::json!({
                "kind": "PodList",
                "apiVersion": "v1",
                "metadata": {},
                "items": list.items,
            });
            ([(http::header::CONTENT_TYPE, "application/json")], pods.to_string()).into_response()
        }
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, format!("listing pods: {e}")),
    }
}

/// Parses a query string into repeated key/values (percent-decoded, `+` as space).
pub fn parse_query(query: &str) -> Vec<(String, String)> {
    fn decode(s: &str) -> String {
        let bytes = s.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'+' => out.push(b' '),
                b'%' if i + 2 < bytes.len() => {
                    match u8::from_str_radix(std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("zz"), 16) {
                        Ok(b) => {
                            out.push(b);
                            i += 2;
                        }
                        Err(_) => out.push(b'%'),
                    }
                }
                b => out.push(b),
            }
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    }
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (decode(k), decode(v)),
            None => (decode(p), String::new()),
        })
        .collect()
}

fn flag(params: &[(String, String)], name: &str) -> bool {
    params
        .iter()
        .find(|(k, _)| k == name)
        .is_some_and(|(_, v)| matches!(v.as_str(), "" | "1" | "true" | "True" | "TRUE" | "t" | "T"))
}

fn value<'a>(params: &'a [(String, String)], name: &str) -> Option<&'a str> {
    params.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

fn error(code: StatusCode, message: String) -> Response {
    (code, message).into_response()
}

/// Finds a container of a pod on this node; `previous` picks the instance before the newest.
pub async fn find_container(
    docker: &Docker,
    owner: Owner<'_>,
    namespace: &str,
    pod: &str,
    container: &str,
    previous: bool,
) -> anyhow::Result<Option<String>> {
    let filters = owner.filters([
        label(LABEL_POD_NAMESPACE, namespace),
        label(LABEL_POD_NAME, pod),
        label(LABEL_CONTAINER_NAME, container),
        label(LABEL_TYPE, TYPE_CONTAINER),
    ]);
    let options = ListContainersOptionsBuilder::default()
        .all(true)
        .filters(&filters)
        .build();
    let mut list = docker
        .list_containers(Some(options))
        .await
        .context("listing containers")?;
    let count = |c: &bollard::models::ContainerSummary| -> i64 {
        c.labels
            .as_ref()
            .and_then(|l| l.get(LABEL_RESTART_COUNT))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    list.sort_by_key(|c| std::cmp::Reverse(count(c)));
    let index = usize::from(previous);
    Ok(list.get(index).and_then(|c| c.id.clone()))
}

async fn container_logs(
    State(state): State<ServerState>,
    Path((ns, pod, container)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
) -> Response {
    let params = parse_query(query.as_deref().unwrap_or(""));
    let previous = flag(&params, "previous");
    let id = match find_container(&state.docker, state.owner(), &ns, &pod, &container, previous).await {
        Ok(Some(id)) => id,
        Ok(None) if previous => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("previous terminated container \"{container}\" in pod \"{pod}\" not found"),
            );
        }
        Ok(None) => {
            return error(
                StatusCode::NOT_FOUND,
                format!("container \"{container}\" in pod \"{pod}\" not found"),
            );
        }
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")),
    };
    let mut builder = LogsOptionsBuilder::default()
        .stdout(true)
        .stderr(true)
        .follow(flag(&params, "follow"))
        .timestamps(flag(&params, "timestamps"));
    if let Some(tail) = value(&params, "tailLines").and_then(|t| t.parse::<i64>().ok()) {
        builder = builder.tail(&tail.max(0).to_string());
    }
    let since = value(&params, "sinceSeconds")
        .and_then(|s| s.parse::<i64>().ok())
        .map(|s| jiff::Timestamp::now().as_second() - s)
        .or_else(|| {
            value(&params, "sinceTime")
                .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                .map(|t| t.as_second())
        });
    if let Some(since) = since {
        builder = builder.since(since.clamp(0, i64::from(i32::MAX)) as i32);
    }
    let limit = value(&params, "limitBytes").and_then(|l| l.parse::<usize>().ok());
    let logs = state.docker.logs(&id, Some(builder.build()));
    let body = limit_bytes(
        logs.filter_map(|item| async move { item.ok().map(|o| o.into_bytes()) }),
        limit,
    );
    Response::builder()
        .header("content-type", "text/plain")
        .body(Body::from_stream(body.map(Ok::<_, std::convert::Infallible>)))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

fn limit_bytes(
    stream: impl Stream<Item = bytes::Bytes> + Send + 'static,
    limit: Option<usize>,
) -> impl Stream<Item = bytes::Bytes> + Send + 'static {
    let mut left = limit.unwrap_or(usize::MAX);
    stream
        .take_while(move |_| {
            let go = left > 0;
            async move { go }
        })
        .map(move |mut chunk| {
            if chunk.len() > left {
                chunk.truncate(left);
            }
            left = left.saturating_sub(chunk.len());
            chunk
        })
}

struct StreamOptions {
    stdin: bool,
    stdout: bool,
    stderr: bool,
    tty: bool,
    command: Vec<String>,
}

fn stream_options(query: Option<String>) -> StreamOptions {
    let params = parse_query(query.as_deref().unwrap_or(""));
    StreamOptions {
        stdin: flag(&params, "stdin") || flag(&params, "input"),
        stdout: flag(&params, "stdout") || flag(&params, "output"),
        stderr: flag(&params, "stderr") || flag(&params, "error"),
        tty: flag(&params, "tty"),
        command: params
            .iter()
            .filter(|(k, _)| k == "command")
            .map(|(_, v)| v.clone())
            .collect(),
    }
}

async fn upgrade_or_error(request: axum::extract::Request) -> Result<WebSocketUpgrade, Response> {
    let (mut parts, _) = request.into_parts();
    WebSocketUpgrade::from_request_parts(&mut parts, &())
        .await
        .map_err(|_| {
            error(
                StatusCode::BAD_REQUEST,
                "this endpoint speaks WebSocket (v5.channel.k8s.io); SPDY is not supported".into(),
            )
        })
}

async fn exec(
    State(state): State<ServerState>,
    Path((ns, pod, container)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
    request: axum::extract::Request,
) -> Response {
    exec_inner(state, ns, pod, container, query, request).await
}

async fn exec_with_uid(
    State(state): State<ServerState>,
    Path((ns, pod, _uid, container)): Path<(String, String, String, String)>,
    RawQuery(query): RawQuery,
    request: axum::extract::Request,
) -> Response {
    exec_inner(state, ns, pod, container, query, request).await
}

async fn attach(
    State(state): State<ServerState>,
    Path((ns, pod, container)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
    request: axum::extract::Request,
) -> Response {
    attach_inner(state, ns, pod, container, query, request).await
}

async fn attach_with_uid(
    State(state): State<ServerState>,
    Path((ns, pod, _uid, container)): Path<(String, String, String, String)>,
    RawQuery(query): RawQuery,
    request: axum::extract::Request,
) -> Response {
    attach_inner(state, ns, pod, container, query, request).await
}

async fn exec_inner(
    state: ServerState,
    ns: String,
    pod: String,
    container: String,
    query: Option<String>,
    request: axum::extract::Request,
) -> Response {
    let ws = match upgrade_or_error(request).await {
        Ok(ws) => ws,
        Err(r) => return r,
    };
    let opts = stream_options(query);
    if opts.command.is_empty() {
        return error(StatusCode::BAD_REQUEST, "you must specify at least 1 command".into());
    }
    let id = match find_container(&state.docker, state.owner(), &ns, &pod, &container, false).await {
        Ok(Some(id)) => id,
        Ok(None) => {
            return error(
                StatusCode::NOT_FOUND,
                format!("container \"{container}\" in pod \"{pod}\" not found"),
            );
        }
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")),
    };
    let exec = state
        .docker
        .create_exec(
            &id,
            ExecConfig {
                cmd: Some(opts.command.clone()),
                attach_stdin: Some(opts.stdin),
                attach_stdout: Some(opts.stdout),
                attach_stderr: Some(opts.stderr),
                tty: Some(opts.tty),
                ..Default::default()
            },
        )
        .await;
    let exec = match exec {
        Ok(e) => e.id,
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let docker = state.docker.clone();
    ws.protocols(PROTOCOLS).on_upgrade(move |socket| async move {
        let protocol = socket
            .protocol()
            .and_then(|p| p.to_str().ok())
            .unwrap_or("")
            .to_string();
        let started = docker
            .start_exec(
                &exec,
                Some(StartExecOptions {
                    detach: false,
                    tty: opts.tty,
                    output_capacity: None,
                }),
            )
            .await;
        let (output, input) = match started {
            Ok(StartExecResults::Attached { output, input }) => (output, input),
            Ok(StartExecResults::Detached) => return,
            Err(e) => {
                let _ = send_status(socket.split().0, &protocol, Err(e.to_string())).await;
                return;
            }
        };
        let resize_docker = docker.clone();
        let resize_id = exec.clone();
        let resize = move |w: u16, h: u16| {
            let docker = resize_docker.clone();
            let id = resize_id.clone();
            async move {
                let options = ResizeExecOptionsBuilder::default()
                    .w(i32::from(w))
                    .h(i32::from(h))
                    .build();
                let _ = docker.resize_exec(&id, options).await;
            }
        };
        let socket = pump(socket, output, input, opts.tty, resize).await;
        // An exit code Docker does not report is no success.
        match crate::probes::exit_code(&docker, &exec).await {
            Ok(0) => {
                let _ = send_exit(socket, &protocol, Ok(()), &opts.command).await;
            }
            Ok(code) => {
                let _ = send_exit(socket, &protocol, Err(code.to_string()), &opts.command).await;
            }
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "exec ended without an exit code");
                let _ = send_status(socket, &protocol, Err(format!("{e:#}"))).await;
            }
        }
    })
}

async fn attach_inner(
    state: ServerState,
    ns: String,
    pod: String,
    container: String,
    query: Option<String>,
    request: axum::extract::Request,
) -> Response {
    let ws = match upgrade_or_error(request).await {
        Ok(ws) => ws,
        Err(r) => return r,
    };
    let opts = stream_options(query);
    let id = match find_container(&state.docker, state.owner(), &ns, &pod, &container, false).await {
        Ok(Some(id)) => id,
        Ok(None) => {
            return error(
                StatusCode::NOT_FOUND,
                format!("container \"{container}\" in pod \"{pod}\" not found"),
            );
        }
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")),
    };
    let docker = state.docker.clone();
    ws.protocols(PROTOCOLS).on_upgrade(move |socket| async move {
        let protocol = socket
            .protocol()
            .and_then(|p| p.to_str().ok())
            .unwrap_or("")
            .to_string();
        let options = AttachContainerOptionsBuilder::default()
            .stdin(opts.stdin)
            .stdout(opts.stdout)
            .stderr(opts.stderr)
            .stream(true)
            .logs(false)
            .build();
        let attached = match docker.attach_container(&id, Some(options)).await {
            Ok(a) => a,
            Err(e) => {
                let _ = send_status(socket.split().0, &protocol, Err(e.to_string())).await;
                return;
            }
        };
        let resize_docker = docker.clone();
        let resize_id = id.clone();
        let resize = move |w: u16, h: u16| {
            let docker = resize_docker.clone();
            let id = resize_id.clone();
            async move {
                let options = ResizeContainerTTYOptionsBuilder::default()
                    .w(i32::from(w))
                    .h(i32::from(h))
                    .build();
                let _ = docker.resize_container_tty(&id, options).await;
            }
        };
        let socket = pump(socket, attached.output, attached.input, opts.tty, resize).await;
        let _ = send_status(socket, &protocol, Ok(())).await;
    })
}

type Sink = futures::stream::SplitSink<WebSocket, Message>;

/// Moves bytes between the WebSocket and the process until its output ends; returns the sending half.
async fn pump<R, F>(
    socket: WebSocket,
    mut output: std::pin::Pin<Box<dyn Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>>,
    mut input: std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
    tty: bool,
    resize: R,
) -> Sink
where
    R: Fn(u16, u16) -> F + Send + 'static,
    F: std::future::Future<Output = ()> + Send,
{
    let (mut sink, mut stream) = socket.split();
    let reader = tokio::spawn(async move {
        while let Some(Ok(msg)) = stream.next().await {
            let data = match msg {
                Message::Binary(b) => b.to_vec(),
                Message::Text(t) => t.as_bytes().to_vec(),
                Message::Close(_) => break,
                _ => continue,
            };
            let Some((&channel, payload)) = data.split_first() else {
                continue;
            };
            match channel {
                0 => {
                    if input.write_all(payload).await.is_err() {
                        break;
                    }
                    let _ = input.flush().await;
                }
                4 => {
                    if let Ok(size) = serde_json::from_slice::<serde_json::Value>(payload) {
                        let w = size.get("Width").and_then(|v| v.as_u64()).unwrap_or(0) as u16;
                        let h = size.get("Height").and_then(|v| v.as_u64()).unwrap_or(0) as u16;
                        resize(w, h).await;
                    }
                }
                255 if payload.first() == Some(&0) => {
                    let _ = input.shutdown().await;
                }
                _ => {}
            }
        }
        stream
    });
    while let Some(item) = output.next().await {
        let Ok(out) = item else { break };
        let (channel, bytes) = match out {
            LogOutput::StdErr { message } if !tty => (2u8, message),
            LogOutput::StdErr { message }
            | LogOutput::StdOut { message }
            | LogOutput::Console { message }
            | LogOutput::StdIn { message } => (1u8, message),
        };
        let mut frame = Vec::with_capacity(bytes.len() + 1);
        frame.push(channel);
        frame.extend_from_slice(&bytes);
        if sink.send(Message::Binary(frame.into())).await.is_err() {
            break;
        }
    }
    reader.abort();
    sink
}

async fn port_forward(
    State(state): State<ServerState>,
    Path((ns, pod)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    request: axum::extract::Request,
) -> Response {
    port_forward_inner(state, ns, pod, String::new(), query, request).await
}

async fn port_forward_with_uid(
    State(state): State<ServerState>,
    Path((ns, pod, uid)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
    request: axum::extract::Request,
) -> Response {
    port_forward_inner(state, ns, pod, uid, query, request).await
}

/// The pod IP of a pod on this node: its running sandbox's address (127.0.0.1 on the host network).
pub async fn pod_address(
    docker: &Docker,
    owner: Owner<'_>,
    namespace: &str,
    pod: &str,
) -> anyhow::Result<Option<String>> {
    Ok(pod_sandbox(docker, owner, namespace, pod).await?.map(|(_, ip)| ip))
}

/// The running sandbox of a pod on this node: its container id and the pod IP (127.0.0.1 on the host
/// network).
pub async fn pod_sandbox(
    docker: &Docker,
    owner: Owner<'_>,
    namespace: &str,
    pod: &str,
) -> anyhow::Result<Option<(String, String)>> {
    let filters = owner.filters([
        label(LABEL_POD_NAMESPACE, namespace),
        label(LABEL_POD_NAME, pod),
        label(LABEL_TYPE, crate::docker::TYPE_SANDBOX),
    ]);
    let options = ListContainersOptionsBuilder::default().filters(&filters).build();
    let list = docker
        .list_containers(Some(options))
        .await
        .context("listing sandboxes")?;
    for summary in list {
        let Some(id) = summary.id else { continue };
        let Some(record) = crate::docker::inspect(docker, &id).await? else {
            continue;
        };
        if record.state == crate::docker::RunState::Running {
            return Ok(Some((id, record.ip.unwrap_or_else(|| "127.0.0.1".to_string()))));
        }
    }
    Ok(None)
}

async fn port_forward_inner(
    state: ServerState,
    ns: String,
    pod: String,
    uid: String,
    query: Option<String>,
    request: axum::extract::Request,
) -> Response {
    let ws = match upgrade_or_error(request).await {
        Ok(ws) => ws,
        Err(r) => return r,
    };
    if ws
        .requested_protocols()
        .any(|p| p.as_bytes() == SPDY_PORT_FORWARD_PROTOCOL.as_bytes())
    {
        // Ports come from each stream's headers, not from the query.
        let (sandbox, ip) = match pod_sandbox(&state.docker, state.owner(), &ns, &pod).await {
            Ok(Some(found)) => found,
            Ok(None) => return error(StatusCode::NOT_FOUND, format!("pod \"{pod}\" has no running sandbox")),
            Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")),
        };
        let target = PortForwardTarget { pod: sandbox, uid, ip };
        return ws
            .protocols([SPDY_PORT_FORWARD_PROTOCOL])
            .on_upgrade(move |socket| forward_spdy_websocket(socket, target));
    }
    let params = parse_query(query.as_deref().unwrap_or(""));
    let mut ports = Vec::new();
    for (_, v) in params.iter().filter(|(k, _)| k == "ports" || k == "port") {
        for p in v.split(',').filter(|p| !p.is_empty()) {
            match p.trim().parse::<u16>() {
                Ok(port) if port > 0 => ports.push(port),
                _ => return error(StatusCode::BAD_REQUEST, format!("invalid port value \"{p}\"")),
            }
        }
    }
    if ports.is_empty() {
        return error(StatusCode::BAD_REQUEST, "at least 1 port must be specified".into());
    }
    let ip = match pod_address(&state.docker, state.owner(), &ns, &pod).await {
        Ok(Some(ip)) => ip,
        Ok(None) => return error(StatusCode::NOT_FOUND, format!("pod \"{pod}\" has no running sandbox")),
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")),
    };
    ws.protocols(["v4.channel.k8s.io"])
        .on_upgrade(move |socket| forward_ports(socket, ip, ports))
}

async fn forward_ports(socket: WebSocket, ip: String, ports: Vec<u16>) {
    let (mut sink, mut stream) = socket.split();
    let (out_tx, mut out_rx) = tokio::sync::mpsc::channel::<Vec<u8>>(64);
    let mut writers = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let data = (2 * i) as u8;
        let err = data + 1;
        for channel in [data, err] {
            let frame = vec![channel, (*port & 0xff) as u8, (*port >> 8) as u8];
            if sink.send(Message::Binary(frame.into())).await.is_err() {
                return;
            }
        }
        match tokio::net::TcpStream::connect((ip.as_str(), *port)).await {
            Ok(tcp) => {
                let (mut read, write) = tcp.into_split();
                writers.push(Some(write));
                let tx = out_tx.clone();
                tokio::spawn(async move {
                    use tokio::io::AsyncReadExt;
                    let mut buf = vec![0u8; 32 * 1024];
                    loop {
                        match read.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                let mut frame = Vec::with_capacity(n + 1);
                                frame.push(data);
                                frame.extend_from_slice(&buf[..n]);
                                if tx.send(frame).await.is_err() {
                                    break;
                                }
                            }
                        }
                    }
                });
            }
            Err(e) => {
                writers.push(None);
                let mut frame = vec![err];
                frame.extend_from_slice(format!("error forwarding port {port} to pod: {e}").as_bytes());
                let _ = out_tx.send(frame).await;
            }
        }
    }
    drop(out_tx);
    let sender = tokio::spawn(async move {
        while let Some(frame) = out_rx.recv().await {
            if sink.send(Message::Binary(frame.into())).await.is_err() {
                break;
            }
        }
        let _ = sink.send(Message::Close(None)).await;
    });
    while let Some(Ok(msg)) = stream.next().await {
        let data = match msg {
            Message::Binary(b) => b.to_vec(),
            Message::Close(_) => break,
            _ => continue,
        };
        let Some((&channel, payload)) = data.split_first() else {
            continue;
        };
        if channel % 2 != 0 {
            continue;
        }
        if let Some(Some(writer)) = writers.get_mut(usize::from(channel / 2))
            && writer.write_all(payload).await.is_err()
        {
            writers[usize::from(channel / 2)] = None;
        }
    }
    drop(writers);
    sender.abort();
}

/// The WebSocket subprotocol of kubectl's tunneling dialer: SPDY/3.1 port forwarding inside binary messages.
pub const SPDY_PORT_FORWARD_PROTOCOL: &str = "SPDY/3.1+portforward.k8s.io";

/// How long the data and error streams of one forwarded connection may arrive apart (upstream's
/// `DefaultStreamCreationTimeout`).
const STREAM_CREATION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Where forwarded connections go, and how errors name the pod (as upstream's CRI streaming server does:
/// the sandbox id and the uid from the request path, often empty).
#[derive(Debug, Clone)]
pub struct PortForwardTarget {
    pub pod: String,
    pub uid: String,
    pub ip: String,
}

async fn forward_spdy_websocket(socket: WebSocket, target: PortForwardTarget) {
    let (mut sink, stream) = socket.split();
    // Only binary messages carry the session; a text message or a close ends it (as upstream's
    // tunneling connection, which refuses other message types).
    let incoming = stream
        .take_while(|m| {
            futures::future::ready(matches!(
                m,
                Ok(Message::Binary(_) | Message::Ping(_) | Message::Pong(_))
            ))
        })
        .filter_map(|m| {
            futures::future::ready(match m {
                Ok(Message::Binary(b)) => Some(b),
                _ => None,
            })
        });
    let outgoing = (&mut sink).with(|b: bytes::Bytes| futures::future::ready(Ok::<_, axum::Error>(Message::Binary(b))));
    serve_port_forward(Box::pin(incoming), outgoing, target).await;
    let _ = sink
        .send(Message::Close(Some(axum::extract::ws::CloseFrame {
            code: axum::extract::ws::close_code::NORMAL,
            reason: "".into(),
        })))
        .await;
}

/// Serves upstream kubelet's SPDY port-forward protocol on a session: pairs each forwarded connection's
/// data and error streams by `requestID`, connects to the pod's port and copies both ways.
pub async fn serve_port_forward<I, O, E>(incoming: I, outgoing: O, target: PortForwardTarget)
where
    I: futures::Stream<Item = bytes::Bytes> + Unpin,
    O: futures::Sink<bytes::Bytes, Error = E> + Unpin,
    E: std::fmt::Display,
{
    let (accepted_tx, accepted) = tokio::sync::mpsc::channel(16);
    let target = Arc::new(target);
    let session = crate::spdy::serve(incoming, outgoing, check_port_forward_stream, accepted_tx);
    let (result, ()) = tokio::join!(session, pair_streams(accepted, target.clone()));
    match result {
        Ok(()) => tracing::debug!(pod = %target.pod, "port-forward session ended"),
        Err(e) => tracing::info!(pod = %target.pod, error = %e, "port-forward session ended"),
    }
}

/// Accepts a stream only with a valid `port` and `streamType` (upstream's `httpStreamReceived`).
fn check_port_forward_stream(headers: &crate::spdy::Headers) -> Result<(), String> {
    let port = headers
        .get("port")
        .filter(|p| !p.is_empty())
        .ok_or("\"port\" header is required")?;
    let parsed = match port.parse::<u16>() {
        Ok(p) if !port.starts_with('+') => p,
        Err(e) if *e.kind() == std::num::IntErrorKind::PosOverflow => {
            return Err(format!(
                "unable to parse \"{port}\" as a port: strconv.ParseUint: parsing \"{port}\": value out of range"
            ));
        }
        _ => {
            return Err(format!(
                "unable to parse \"{port}\" as a port: strconv.ParseUint: parsing \"{port}\": invalid syntax"
            ));
        }
    };
    if parsed < 1 {
        return Err(format!("port \"{port}\" must be > 0"));
    }
    match headers.get("streamType").filter(|t| !t.is_empty()) {
        None => Err("\"streamType\" header is required".into()),
        Some("error" | "data") => Ok(()),
        Some(other) => Err(format!("invalid stream type \"{other}\"")),
    }
}

/// The request a stream belongs to: its `requestID`, or for clients too old to send one, a pseudo id
/// from the stream id (error stream N and data stream N+2 form a pair), as upstream does.
fn request_id(stream: &crate::spdy::Stream) -> String {
    match stream.headers.get("requestID").filter(|r| !r.is_empty()) {
        Some(id) => id.to_string(),
        None if stream.headers.get("streamType") == Some("data") => (i64::from(stream.id) - 2).to_string(),
        None => stream.id.to_string(),
    }
}

/// The streams of one forwarded connection, as they arrive.
struct StreamPair {
    data: Option<crate::spdy::Stream>,
    error: Option<crate::spdy::Stream>,
    deadline: tokio::time::Instant,
}

async fn print_error(stream: &mut Option<crate::spdy::Stream>, message: &str) {
    if let Some(s) = stream {
        let _ = s.writer.write(message.as_bytes()).await;
    }
}

async fn pair_streams(mut accepted: tokio::sync::mpsc::Receiver<crate::spdy::Stream>, target: Arc<PortForwardTarget>) {
    let mut pairs: HashMap<String, StreamPair> = HashMap::new();
    loop {
        let deadline = pairs.values().map(|p| p.deadline).min();
        let stream = tokio::select! {
            s = accepted.recv() => match s {
                Some(s) => s,
                None => break,
            },
            () = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => futures::future::pending().await,
                }
            } => {
                let now = tokio::time::Instant::now();
                let expired: Vec<String> =
                    pairs.iter().filter(|(_, p)| p.deadline <= now).map(|(id, _)| id.clone()).collect();
                for id in expired {
                    let Some(mut pair) = pairs.remove(&id) else { continue };
                    let message = format!("(conn={}, request={id}) timed out waiting for streams", target.pod);
                    tracing::warn!("{message}");
                    print_error(&mut pair.error, &message).await;
                    if let Some(e) = pair.error.as_mut() {
                        let _ = e.writer.close().await;
                    }
                }
                continue;
            }
        };
        let id = request_id(&stream);
        let kind = stream.headers.get("streamType").unwrap_or("").to_string();
        let pair = pairs.entry(id.clone()).or_insert_with(|| StreamPair {
            data: None,
            error: None,
            deadline: tokio::time::Instant::now() + STREAM_CREATION_TIMEOUT,
        });
        let slot = if kind == "error" {
            &mut pair.error
        } else {
            &mut pair.data
        };
        if slot.is_some() {
            let message = format!("error processing stream for request {id}: {kind} stream already assigned");
            tracing::warn!("{message}");
            print_error(&mut pair.error, &message).await;
            continue;
        }
        *slot = Some(stream);
        if pair.data.is_some()
            && pair.error.is_some()
            && let Some(StreamPair {
                data: Some(data),
                error: Some(error),
                ..
            }) = pairs.remove(&id)
        {
            tokio::spawn(forward_pair(data, error, target.clone()));
        }
    }
}

/// Forwards one connection: copies the data stream to and from the pod's port, then writes any error to
/// the error stream and closes both (upstream's `httpStreamHandler.portForward`).
async fn forward_pair(data: crate::spdy::Stream, error: crate::spdy::Stream, target: Arc<PortForwardTarget>) {
    let port = data
        .headers
        .get("port")
        .and_then(|p| p.parse::<u16>().ok())
        .unwrap_or(0);
    let crate::spdy::Stream {
        reader: data_in,
        writer: mut data_out,
        ..
    } = data;
    // Nothing is read from the error stream: dropping its reader lets the session drop what comes.
    let crate::spdy::Stream {
        writer: mut error_out, ..
    } = error;
    if let Err(e) = copy_to_pod(&target.ip, port, data_in, &mut data_out).await {
        let message = format!(
            "error forwarding port {port} to pod {}, uid {}: {e:#}",
            target.pod, target.uid
        );
        tracing::info!("{message}");
        let _ = error_out.write(message.as_bytes()).await;
    }
    let _ = data_out.close().await;
    let _ = error_out.close().await;
}

/// An I/O error as Go prints a syscall error ("connection refused").
fn go_error_text(e: &std::io::Error) -> String {
    let text = e.to_string();
    let text = match text.find(" (os error ") {
        Some(i) => &text[..i],
        None => text.as_str(),
    };
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// Connects to `ip:port` and copies both ways until one side ends, then gives the other side a second
/// to finish (as upstream's CRI runtimes do).
async fn copy_to_pod(
    ip: &str,
    port: u16,
    mut data_in: crate::spdy::StreamReader,
    data_out: &mut crate::spdy::StreamWriter,
) -> anyhow::Result<()> {
    use tokio::io::AsyncReadExt;
    let addr = match ip.parse::<std::net::IpAddr>() {
        Ok(ip) => SocketAddr::new(ip, port),
        Err(_) => anyhow::bail!("invalid pod IP {ip:?}"),
    };
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| anyhow::anyhow!("dial tcp {addr}: connect: {}", go_error_text(&e)))?;
    let (mut tcp_in, mut tcp_out) = tcp.into_split();
    let to_pod = async {
        while let Some(chunk) = data_in.read().await {
            tcp_out
                .write_all(&chunk)
                .await
                .map_err(|e| anyhow::anyhow!("write tcp {addr}: {}", go_error_text(&e)))?;
        }
        // The client sends no more: pass the half-close on.
        let _ = tcp_out.shutdown().await;
        Ok::<(), anyhow::Error>(())
    };
    let from_pod = async {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            let n = tcp_in
                .read(&mut buf)
                .await
                .map_err(|e| anyhow::anyhow!("read tcp {addr}: {}", go_error_text(&e)))?;
            if n == 0 {
                // The pod's side ended: finish the data stream now, so the client sees the end at once.
                let _ = data_out.close().await;
                return Ok::<(), anyhow::Error>(());
            }
            if data_out.write(&buf[..n]).await.is_err() {
                return Ok(());
            }
        }
    };
    tokio::pin!(to_pod);
    tokio::pin!(from_pod);
    let (first, other_done) = tokio::select! {
        r = &mut to_pod => (r, tokio::time::timeout(std::time::Duration::from_secs(1), &mut from_pod).await),
        r = &mut from_pod => (r, tokio::time::timeout(std::time::Duration::from_secs(1), &mut to_pod).await),
    };
    first.and(other_done.unwrap_or(Ok(())))
}

/// The `metav1.Status` written on the status channel (v4 and later).
pub fn exit_status(result: Result<(), String>, command: &[String]) -> serde_json::Value {
    match result {
        Ok(()) => serde_json::json!({"metadata": {}, "status": "Success"}),
        Err(code) => serde_json::json!({
            "metadata": {},
            "status": "Failure",
            "message": format!(
                "command terminated with non-zero exit code: error executing command [{}], exit code {code}",
                command.join(" ")
            ),
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": code}]}
        }),
    }
}

async fn send_exit(socket: Sink, protocol: &str, result: Result<(), String>, command: &[String]) -> anyhow::Result<()> {
    let body = exit_status(result.clone(), command);
    send_frame(
        socket,
        protocol,
        body,
        result
            .err()
            .map(|c| format!("command terminated with non-zero exit code: {c}")),
    )
    .await
}

async fn send_status(socket: Sink, protocol: &str, result: Result<(), String>) -> anyhow::Result<()> {
    let body = match &result {
        Ok(()) => serde_json::json!({"metadata": {}, "status": "Success"}),
        Err(message) => serde_json::json!({
            "metadata": {}, "status": "Failure", "message": message, "reason": "InternalError", "code": 500
        }),
    };
    send_frame(socket, protocol, body, result.err()).await
}

async fn send_frame(
    mut socket: Sink,
    protocol: &str,
    status: serde_json::Value,
    legacy_error: Option<String>,
) -> anyhow::Result<()> {
    let payload = if protocol.starts_with("v4.") || protocol.starts_with("v5.") {
        Some(serde_json::to_vec(&status)?)
    } else {
        legacy_error.map(String::into_bytes)
    };
    if let Some(payload) = payload {
        let mut frame = vec![3u8];
        frame.extend_from_slice(&payload);
        socket.send(Message::Binary(frame.into())).await?;
    }
    socket.send(Message::Close(None)).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_parsing_keeps_repeats_and_decodes() {
        let q = parse_query("command=sh&command=-c&command=echo+hi%21&stdin=true&tty");
        let commands: Vec<_> = q
            .iter()
            .filter(|(k, _)| k == "command")
            .map(|(_, v)| v.as_str())
            .collect();
        assert_eq!(commands, vec!["sh", "-c", "echo hi!"]);
        assert!(flag(&q, "stdin"));
        assert!(flag(&q, "tty"));
        assert!(!flag(&q, "stdout"));
    }

    #[test]
    fn exit_status_matches_upstream_shape() {
        let ok = exit_status(Ok(()), &[]);
        assert_eq!(ok["status"], "Success");
        let failed = exit_status(Err("3".into()), &["sh".into(), "-c".into(), "exit 3".into()]);
        assert_eq!(failed["reason"], "NonZeroExitCode");
        assert_eq!(failed["details"]["causes"][0]["reason"], "ExitCode");
        assert_eq!(failed["details"]["causes"][0]["message"], "3");
    }

    #[test]
    fn port_forward_streams_are_checked_as_upstream() {
        use crate::spdy::Headers;
        let h = |pairs: &[(&str, &str)]| pairs.iter().copied().collect::<Headers>();
        assert_eq!(
            check_port_forward_stream(&h(&[("port", "80"), ("streamType", "data")])),
            Ok(())
        );
        assert_eq!(
            check_port_forward_stream(&h(&[("port", "80"), ("streamtype", "error")])),
            Ok(())
        );
        let cases = [
            (h(&[("streamType", "data")]), "\"port\" header is required"),
            (
                h(&[("port", "http"), ("streamType", "data")]),
                "unable to parse \"http\" as a port: strconv.ParseUint: parsing \"http\": invalid syntax",
            ),
            (
                h(&[("port", "70000"), ("streamType", "data")]),
                "unable to parse \"70000\" as a port: strconv.ParseUint: parsing \"70000\": value out of range",
            ),
            (h(&[("port", "0"), ("streamType", "data")]), "port \"0\" must be > 0"),
            (h(&[("port", "80")]), "\"streamType\" header is required"),
            (
                h(&[("port", "80"), ("streamType", "stdin")]),
                "invalid stream type \"stdin\"",
            ),
        ];
        for (headers, want) in cases {
            assert_eq!(check_port_forward_stream(&headers), Err(want.to_string()));
        }
        assert_eq!(
            go_error_text(&std::io::Error::from_raw_os_error(libc::ECONNREFUSED)),
            "connection refused"
        );
    }

    /// kubectl's side of a tunneled port-forward session, over in-memory channels.
    struct PortForwardClient {
        encoder: crate::spdy::Encoder,
        decoder: crate::spdy::Decoder,
        to_agent: futures::channel::mpsc::UnboundedSender<bytes::Bytes>,
        from_agent: futures::channel::mpsc::UnboundedReceiver<bytes::Bytes>,
    }

    impl PortForwardClient {
        fn send(&mut self, frame: crate::spdy::Frame) {
            let bytes = self.encoder.encode(&frame).expect("encode");
            self.to_agent.unbounded_send(bytes.into()).expect("send");
        }

        fn open(&mut self, stream_id: u32, kind: &str, port: u16, request: &str) {
            self.send(crate::spdy::Frame::SynStream {
                stream_id,
                associated_to: 0,
                priority: 0,
                slot: 0,
                flags: 0,
                headers: [
                    ("streamType", kind),
                    ("port", &port.to_string()),
                    ("requestID", request),
                ]
                .into_iter()
                .collect(),
            });
        }

        async fn recv(&mut self) -> crate::spdy::Frame {
            loop {
                if let Some(f) = self.decoder.next_frame().expect("agent frames decode") {
                    return f;
                }
                let chunk = tokio::time::timeout(std::time::Duration::from_secs(10), self.from_agent.next())
                    .await
                    .expect("a frame within 10s")
                    .expect("the session is open");
                self.decoder.push(&chunk);
            }
        }

        /// Reads frames until both streams are finished: what each carried.
        async fn until_finished(&mut self, data: u32, error: u32) -> (Vec<u8>, Vec<u8>) {
            use crate::spdy::{FLAG_FIN, Frame};
            let (mut got_data, mut got_error) = (Vec::new(), Vec::new());
            let (mut data_done, mut error_done) = (false, false);
            while !(data_done && error_done) {
                match self.recv().await {
                    Frame::Data {
                        stream_id,
                        flags,
                        data: bytes,
                    } => {
                        let fin = flags & FLAG_FIN != 0;
                        if stream_id == data {
                            got_data.extend_from_slice(&bytes);
                            if fin {
                                data_done = true;
                                // kubectl resets the data stream once the remote side is done.
                                self.send(Frame::RstStream {
                                    stream_id: data,
                                    status: crate::spdy::CANCEL,
                                });
                            }
                        } else if stream_id == error {
                            got_error.extend_from_slice(&bytes);
                            error_done |= fin;
                        }
                    }
                    Frame::SynReply { .. } => {}
                    other => panic!("unexpected {other:?}"),
                }
            }
            (got_data, got_error)
        }
    }

    #[tokio::test]
    async fn spdy_port_forward_pairs_streams_and_reports_errors() {
        use tokio::io::AsyncReadExt;
        // The "pod": answers each connection's line and closes.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let open_port = listener.local_addr().expect("addr").port();
        tokio::spawn(async move {
            while let Ok((mut tcp, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut line = Vec::new();
                    let mut byte = [0u8; 1];
                    while tcp.read(&mut byte).await.unwrap_or(0) == 1 && byte[0] != b'\n' {
                        line.push(byte[0]);
                    }
                    let _ = tcp.write_all(&[b"echo:", &line[..], b"\n"].concat()).await;
                });
            }
        });
        let closed_port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr").port()
        };

        let (to_agent, incoming) = futures::channel::mpsc::unbounded::<bytes::Bytes>();
        let (outgoing, from_agent) = futures::channel::mpsc::unbounded::<bytes::Bytes>();
        let target = PortForwardTarget {
            pod: "sandbox-1".into(),
            uid: String::new(),
            ip: "127.0.0.1".into(),
        };
        let session = tokio::spawn(serve_port_forward(incoming, outgoing, target));
        let mut client = PortForwardClient {
            encoder: crate::spdy::Encoder::new().expect("encoder"),
            decoder: crate::spdy::Decoder::new(),
            to_agent,
            from_agent,
        };

        // Two connections in turn, as kubectl opens them: error stream (closed at once), then data.
        for (request, error, data) in [("0", 1, 3), ("1", 5, 7)] {
            client.open(error, "error", open_port, request);
            client.send(crate::spdy::Frame::Data {
                stream_id: error,
                flags: crate::spdy::FLAG_FIN,
                data: bytes::Bytes::new(),
            });
            client.open(data, "data", open_port, request);
            client.send(crate::spdy::Frame::Data {
                stream_id: data,
                flags: 0,
                data: bytes::Bytes::from(format!("request {request}\n")),
            });
            let (got, err) = client.until_finished(data, error).await;
            assert_eq!(String::from_utf8_lossy(&got), format!("echo:request {request}\n"));
            assert!(err.is_empty(), "{}", String::from_utf8_lossy(&err));
        }

        // A port nothing listens on: the error stream says why, both streams end.
        client.open(9, "error", closed_port, "2");
        client.open(11, "data", closed_port, "2");
        let (got, err) = client.until_finished(11, 9).await;
        assert!(got.is_empty());
        assert_eq!(
            String::from_utf8_lossy(&err),
            format!(
                "error forwarding port {closed_port} to pod sandbox-1, uid : dial tcp 127.0.0.1:{closed_port}: \
                 connect: connection refused"
            )
        );

        // The session goes on serving after an error.
        client.open(13, "error", open_port, "3");
        client.open(15, "data", open_port, "3");
        client.send(crate::spdy::Frame::Data {
            stream_id: 15,
            flags: 0,
            data: bytes::Bytes::from_static(b"after the error\n"),
        });
        let (got, err) = client.until_finished(15, 13).await;
        assert_eq!(String::from_utf8_lossy(&got), "echo:after the error\n");
        assert!(err.is_empty());

        // A second error stream for a request is an error on the request's first one.
        client.open(17, "error", open_port, "4");
        client.open(19, "error", open_port, "4");
        let mut replies = 0;
        let mut error_text = Vec::new();
        while replies < 2 || error_text.is_empty() {
            match client.recv().await {
                crate::spdy::Frame::SynReply { .. } => replies += 1,
                crate::spdy::Frame::Data {
                    stream_id: 17, data, ..
                } => error_text.extend_from_slice(&data),
                _ => {}
            }
        }
        assert_eq!(
            String::from_utf8_lossy(&error_text),
            "error processing stream for request 4: error stream already assigned"
        );

        // A stream without a valid port is refused.
        client.send(crate::spdy::Frame::SynStream {
            stream_id: 21,
            associated_to: 0,
            priority: 0,
            slot: 0,
            flags: 0,
            headers: [("streamType", "data"), ("port", "http")].into_iter().collect(),
        });
        loop {
            if let crate::spdy::Frame::RstStream { stream_id, status } = client.recv().await {
                assert_eq!((stream_id, status), (21, crate::spdy::CANCEL));
                break;
            }
        }

        // Pings are answered; closing the transport ends the session.
        client.send(crate::spdy::Frame::Ping { id: 1 });
        loop {
            if client.recv().await == (crate::spdy::Frame::Ping { id: 1 }) {
                break;
            }
        }
        drop(client.to_agent);
        tokio::time::timeout(std::time::Duration::from_secs(10), session)
            .await
            .expect("the session ends")
            .expect("join");
    }

    #[tokio::test]
    async fn limit_bytes_truncates() {
        let chunks = futures::stream::iter(vec![bytes::Bytes::from("hello "), bytes::Bytes::from("world")]);
        let out: Vec<bytes::Bytes> = limit_bytes(chunks, Some(8)).collect().await;
        assert_eq!(out.concat(), b"hello wo");
    }
}
