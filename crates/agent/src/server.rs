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
//! Port forwarding speaks upstream kubelet's WebSocket port-forward protocol (`v4.channel.k8s.io` or no
//! subprotocol): for the i-th port, channel 2i carries data and 2i+1 errors, and the first frame the server
//! sends on each carries the port as two little-endian bytes. Connections go to the pod IP.
//! TLS uses a self-signed serving certificate; clients must present a certificate signed by the cluster CA.

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
    LABEL_CONTAINER_NAME, LABEL_NODE, LABEL_POD_NAME, LABEL_POD_NAMESPACE, LABEL_RESTART_COUNT, LABEL_TYPE,
    TYPE_CONTAINER,
};

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
            tokio::spawn(async move {
                let tls = match acceptor.accept(tcp).await {
                    Ok(t) => t,
                    Err(e) => {
                        tracing::debug!(%peer, error = %e, "TLS handshake failed");
                        return;
                    }
                };
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

/// The TLS configuration: a fresh self-signed serving certificate, client certificates required.
pub fn tls_config(ca_pem: &str, sans: Vec<String>) -> anyhow::Result<(rustls::ServerConfig, String)> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots
            .add(cert.context("parsing the cluster CA")?)
            .context("adding the cluster CA")?;
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
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
        .route("/containerLogs/{ns}/{pod}/{container}", get(container_logs))
        .route("/exec/{ns}/{pod}/{container}", any(exec))
        .route("/exec/{ns}/{pod}/{uid}/{container}", any(exec_with_uid))
        .route("/attach/{ns}/{pod}/{container}", any(attach))
        .route("/attach/{ns}/{pod}/{uid}/{container}", any(attach_with_uid))
        .route("/portForward/{ns}/{pod}", any(port_forward))
        .route("/portForward/{ns}/{pod}/{uid}", any(port_forward_with_uid))
        .with_state(state)
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
    node: &str,
    namespace: &str,
    pod: &str,
    container: &str,
    previous: bool,
) -> anyhow::Result<Option<String>> {
    let filters = HashMap::from([(
        "label".to_string(),
        vec![
            format!("{LABEL_NODE}={node}"),
            format!("{LABEL_POD_NAMESPACE}={namespace}"),
            format!("{LABEL_POD_NAME}={pod}"),
            format!("{LABEL_CONTAINER_NAME}={container}"),
            format!("{LABEL_TYPE}={TYPE_CONTAINER}"),
        ],
    )]);
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
    let id = match find_container(&state.docker, &state.node, &ns, &pod, &container, previous).await {
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
    let id = match find_container(&state.docker, &state.node, &ns, &pod, &container, false).await {
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
        let code = docker
            .inspect_exec(&exec)
            .await
            .ok()
            .and_then(|i| i.exit_code)
            .unwrap_or(0);
        let result = if code == 0 { Ok(()) } else { Err(code.to_string()) };
        let _ = send_exit(socket, &protocol, result, &opts.command).await;
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
    let id = match find_container(&state.docker, &state.node, &ns, &pod, &container, false).await {
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
    port_forward_inner(state, ns, pod, query, request).await
}

async fn port_forward_with_uid(
    State(state): State<ServerState>,
    Path((ns, pod, _uid)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
    request: axum::extract::Request,
) -> Response {
    port_forward_inner(state, ns, pod, query, request).await
}

/// The pod IP of a pod on this node: its running sandbox's address (127.0.0.1 on the host network).
pub async fn pod_address(docker: &Docker, node: &str, namespace: &str, pod: &str) -> anyhow::Result<Option<String>> {
    let filters = HashMap::from([(
        "label".to_string(),
        vec![
            format!("{LABEL_NODE}={node}"),
            format!("{LABEL_POD_NAMESPACE}={namespace}"),
            format!("{LABEL_POD_NAME}={pod}"),
            format!("{LABEL_TYPE}={}", crate::docker::TYPE_SANDBOX),
        ],
    )]);
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
            return Ok(Some(record.ip.unwrap_or_else(|| "127.0.0.1".to_string())));
        }
    }
    Ok(None)
}

async fn port_forward_inner(
    state: ServerState,
    ns: String,
    pod: String,
    query: Option<String>,
    request: axum::extract::Request,
) -> Response {
    let ws = match upgrade_or_error(request).await {
        Ok(ws) => ws,
        Err(r) => return r,
    };
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
    let ip = match pod_address(&state.docker, &state.node, &ns, &pod).await {
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

    #[tokio::test]
    async fn limit_bytes_truncates() {
        let chunks = futures::stream::iter(vec![bytes::Bytes::from("hello "), bytes::Bytes::from("world")]);
        let out: Vec<bytes::Bytes> = limit_bytes(chunks, Some(8)).collect().await;
        assert_eq!(out.concat(), b"hello wo");
    }
}
