//! Streams served by node agents (log, exec, attach, portforward) and `nodes/NAME/proxy/...`, proxied as upstream
//! proxies to the kubelet: the API server finds the pod's node, connects to the node
//! agent's HTTPS endpoint (InternalIP and `status.daemonEndpoints.kubeletEndpoint.port`)
//! presenting the cluster's admin client certificate, and relays the stream.
//!
//! The agent's serving certificate is self-signed. When the Node carries the annotation
//! [`SERVING_CERT_ANNOTATION`] (the SHA-256 of the certificate, hex), the certificate must
//! match it; without it the connection is made as upstream's API server does without
//! `--kubelet-certificate-authority`.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::FromRequestParts;
use axum::extract::ws::{Message as AxMessage, WebSocket, WebSocketUpgrade};
use axum::response::{IntoResponse, Response};
use futures::{SinkExt, StreamExt};
use http::{StatusCode, header};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::Value;
use sha2::Digest;
use skiff_api::StatusError;
use tokio_tungstenite::tungstenite::Message as TMessage;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use crate::handlers::Ctx;
use crate::objects;
use crate::request::ResourceRequest;
use crate::server::ApiState;

/// Node annotation with the hex SHA-256 of the agent's serving certificate.
pub const SERVING_CERT_ANNOTATION: &str = "skiff.dev/serving-cert-sha256";

/// Where a pod's agent listens and which certificate it must present.
struct Target {
    host: String,
    port: u16,
    pin: Option<String>,
    container: String,
}

async fn target(ctx: &Ctx) -> Result<Target, StatusError> {
    let (pod, _) = ctx.current().await?;
    let node_name = pod
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if node_name.is_empty() {
        return Err(StatusError::bad_request(format!(
            "pod {} does not have a host assigned",
            ctx.rr.name
        )));
    }
    let containers: Vec<String> = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|c| c.get("name").and_then(Value::as_str).map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let init: Vec<String> = ["/spec/initContainers", "/spec/ephemeralContainers"]
        .iter()
        .filter_map(|p| pod.pointer(p).and_then(Value::as_array))
        .flatten()
        .filter_map(|c| c.get("name").and_then(Value::as_str).map(str::to_string))
        .collect();
    let container = match ctx.param("container").filter(|c| !c.is_empty()) {
        Some(c) => {
            if !containers.iter().chain(init.iter()).any(|x| x == c) {
                return Err(StatusError::bad_request(format!(
                    "container {c} is not valid for pod {}",
                    ctx.rr.name
                )));
            }
            c.to_string()
        }
        None if containers.len() == 1 => containers[0].clone(),
        None if ctx.rr.subresource == "portforward" => String::new(),
        None => {
            let default = pod
                .pointer("/metadata/annotations/kubectl.kubernetes.io~1default-container")
                .and_then(Value::as_str)
                .map(str::to_string);
            match default {
                Some(d) => d,
                None => {
                    return Err(StatusError::bad_request(format!(
                        "a container name must be specified for pod {}, choose one of: [{}]",
                        ctx.rr.name,
                        containers.join(" ")
                    )));
                }
            }
        }
    };
    let (host, port, pin) = node_endpoint(ctx, &node_name).await?;
    Ok(Target {
        host,
        port,
        pin,
        container,
    })
}

/// Where a node's agent listens: its InternalIP (or Hostname), the kubelet endpoint port, and
/// the pinned serving certificate hash.
async fn node_endpoint(ctx: &Ctx, node_name: &str) -> Result<(String, u16, Option<String>), StatusError> {
    let nodes = skiff_api::registry::lookup("", "v1", "nodes").ok_or_else(|| StatusError::internal("no nodes"))?;
    let kv = ctx
        .state
        .store
        .get(&objects::key(nodes, "", node_name))
        .await
        .map_err(|e| ctx.store_err(e))?
        .ok_or_else(|| StatusError::not_found("", "nodes", node_name))?;
    let node = objects::decode_kv(&kv).ok_or_else(|| StatusError::internal("stored node is not valid JSON"))?;
    let port = node
        .pointer("/status/daemonEndpoints/kubeletEndpoint/Port")
        .and_then(Value::as_u64)
        .unwrap_or(0) as u16;
    let addresses = node
        .pointer("/status/addresses")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let addr_of = |t: &str| {
        addresses
            .iter()
            .find(|a| a.get("type").and_then(Value::as_str) == Some(t))
            .and_then(|a| a.get("address").and_then(Value::as_str))
            .map(str::to_string)
    };
    let host = addr_of("InternalIP").or_else(|| addr_of("Hostname"));
    let (Some(host), true) = (host, port != 0) else {
        return Err(StatusError::new(
            503,
            "ServiceUnavailable",
            format!("node {node_name} does not serve pod streams (no agent endpoint)"),
        ));
    };
    let pin = node
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(SERVING_CERT_ANNOTATION))
        .and_then(Value::as_str)
        .map(str::to_ascii_lowercase);
    Ok((host, port, pin))
}

/// Accepts the agent's certificate if it matches the pinned hash (or, without a pin,
/// any certificate, as upstream does without a kubelet CA).
#[derive(Debug)]
pub(crate) struct PinVerifier {
    pin: Option<String>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl PinVerifier {
    /// A verifier that accepts any certificate (signatures still checked), for best-effort
    /// probes such as the APIService discovery check, which upstream makes without verification.
    pub(crate) fn any(provider: Arc<rustls::crypto::CryptoProvider>) -> PinVerifier {
        PinVerifier { pin: None, provider }
    }
}

impl rustls::client::danger::ServerCertVerifier for PinVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        if let Some(pin) = &self.pin {
            let got = hex::encode(sha2::Sha256::digest(end_entity.as_ref()));
            if &got != pin {
                return Err(rustls::Error::General(
                    "node agent certificate does not match its pinned hash".into(),
                ));
            }
        }
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

type TlsStream = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

async fn connect(state: &ApiState, t: &Target, alpn_http1: bool) -> Result<TlsStream, StatusError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(state.pki.kubelet_client_cert_pem.as_bytes())
            .filter_map(Result::ok)
            .collect();
    let key = PrivateKeyDer::from_pem_slice(state.pki.kubelet_client_key_pem.as_bytes())
        .map_err(|e| StatusError::internal(format!("reading the proxy client key: {e}")))?;
    let mut config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| StatusError::internal(format!("TLS setup: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(PinVerifier {
            pin: t.pin.clone(),
            provider,
        }))
        .with_client_auth_cert(certs, key)
        .map_err(|e| StatusError::internal(format!("TLS client certificate: {e}")))?;
    if alpn_http1 {
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
    }
    let tcp = tokio::net::TcpStream::connect((t.host.as_str(), t.port))
        .await
        .map_err(|e| {
            StatusError::new(
                503,
                "ServiceUnavailable",
                format!("error dialing backend: dial tcp {}:{}: {e}", t.host, t.port),
            )
        })?;
    let name = ServerName::try_from(t.host.clone())
        .map_err(|e| StatusError::internal(format!("node address {}: {e}", t.host)))?;
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| StatusError::new(503, "ServiceUnavailable", format!("error dialing backend: {e}")))
}

/// The query string for the agent: the client's, without `container` (it is in the path).
fn agent_query(raw: Option<&str>) -> String {
    raw.unwrap_or("")
        .split('&')
        .filter(|kv| !kv.is_empty() && !kv.starts_with("container="))
        .collect::<Vec<_>>()
        .join("&")
}

fn agent_path(rr: &ResourceRequest, container: &str, query: &str) -> String {
    let base = match rr.subresource.as_str() {
        "log" => format!("/containerLogs/{}/{}/{}", rr.namespace, rr.name, container),
        "exec" => format!("/exec/{}/{}/{}", rr.namespace, rr.name, container),
        "attach" => format!("/attach/{}/{}/{}", rr.namespace, rr.name, container),
        _ => format!("/portForward/{}/{}", rr.namespace, rr.name),
    };
    if query.is_empty() {
        base
    } else {
        format!("{base}?{query}")
    }
}

/// The options object of a connect request (`PodExecOptions`, `PodAttachOptions`,
/// `PodPortForwardOptions`) read from its query, as admission receives it.
fn connect_options(subresource: &str, query: Option<&str>) -> (&'static str, serde_json::Value) {
    let pairs: Vec<(String, String)> = query.and_then(|q| serde_urlencoded_pairs(q).ok()).unwrap_or_default();
    let one = |k: &str| pairs.iter().find(|(key, _)| key == k).map(|(_, v)| v.as_str());
    let flag = |k: &str| one(k).is_some_and(crate::request::is_true);
    let all = |k: &str| -> Vec<String> {
        pairs
            .iter()
            .filter(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
            .collect()
    };
    let kind = match subresource {
        "exec" => "PodExecOptions",
        "attach" => "PodAttachOptions",
        _ => "PodPortForwardOptions",
    };
    let mut o = serde_json::json!({"kind": kind, "apiVersion": "v1"});
    if kind == "PodPortForwardOptions" {
        let ports: Vec<i64> = all("ports")
            .iter()
            .flat_map(|p| p.split(',').map(str::to_string).collect::<Vec<_>>())
            .filter_map(|p| p.trim().parse().ok())
            .collect();
        o["ports"] = serde_json::json!(ports);
        return (kind, o);
    }
    for k in ["stdin", "stdout", "stderr", "tty"] {
        if flag(k) {
            o[k] = serde_json::json!(true);
        }
    }
    if let Some(c) = one("container") {
        o["container"] = serde_json::json!(c);
    }
    if kind == "PodExecOptions" {
        o["command"] = serde_json::json!(all("command"));
    }
    (kind, o)
}

/// `a=1&b=2&b=3` as its pairs, in order, percent- and plus-decoded.
fn serde_urlencoded_pairs(q: &str) -> Result<Vec<(String, String)>, StatusError> {
    let uri: http::Uri = format!("/?{q}")
        .parse()
        .map_err(|e| StatusError::bad_request(format!("query: {e}")))?;
    axum::extract::Query::<Vec<(String, String)>>::try_from_uri(&uri)
        .map(|q| q.0)
        .map_err(|e| StatusError::bad_request(format!("query: {e}")))
}

/// Proxy a stream request. `parts` is the client's request (for the WebSocket upgrade).
pub async fn handle(ctx: &Ctx, mut parts: http::request::Parts) -> Result<Response, StatusError> {
    if ctx.rr.subresource != "log" {
        // Admission sees the connection as upstream shows it: CONNECT, with the options asked for.
        let (kind, options) = connect_options(&ctx.rr.subresource, parts.uri.query());
        crate::webhook::admit_subresource(
            ctx,
            crate::webhook::Operation::Connect,
            &options,
            crate::webhook::Gvk {
                group: "",
                version: "v1",
                kind,
            },
        )
        .await?;
    }
    let t = target(ctx).await?;
    let query = agent_query(parts.uri.query());
    let path = agent_path(&ctx.rr, &t.container, &query);
    if ctx.rr.subresource == "log" {
        return proxy_logs(ctx, &t, &path).await;
    }

    let offered: Vec<String> = parts
        .headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(|p| p.trim().to_string()))
        .filter(|p| !p.is_empty())
        .collect();
    let upgrade = WebSocketUpgrade::from_request_parts(&mut parts, &())
        .await
        .map_err(|_| {
            StatusError::bad_request(
                "Upgrade request required: this server streams exec, attach and port-forward over WebSocket",
            )
        })?;
    // Connect to the agent first, so a failure is an HTTP error and not a broken socket.
    let stream = connect(&ctx.state, &t, true).await?;
    let mut req = format!("wss://{}:{}{}", t.host, t.port, path)
        .into_client_request()
        .map_err(|e| StatusError::internal(format!("agent request: {e}")))?;
    if !offered.is_empty()
        && let Ok(v) = http::HeaderValue::from_str(&offered.join(", "))
    {
        req.headers_mut().insert(header::SEC_WEBSOCKET_PROTOCOL, v);
    }
    let (agent_ws, resp) = tokio_tungstenite::client_async(req, stream).await.map_err(|e| {
        StatusError::new(
            503,
            "ServiceUnavailable",
            format!("error upgrading the agent connection: {e}"),
        )
    })?;
    let chosen = resp
        .headers()
        .get(header::SEC_WEBSOCKET_PROTOCOL)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let upgrade = match chosen {
        Some(p) => upgrade.protocols([p]),
        None => upgrade,
    };
    Ok(upgrade
        .on_upgrade(move |client_ws| relay(client_ws, agent_ws))
        .into_response())
}

async fn relay(client: WebSocket, agent: tokio_tungstenite::WebSocketStream<TlsStream>) {
    let (mut c_tx, mut c_rx) = client.split();
    let (mut a_tx, mut a_rx) = agent.split();
    let up = async {
        while let Some(Ok(m)) = c_rx.next().await {
            let out = match m {
                AxMessage::Binary(b) => TMessage::Binary(b),
                AxMessage::Text(t) => TMessage::Text(t.as_str().into()),
                AxMessage::Ping(p) => TMessage::Ping(p),
                AxMessage::Pong(p) => TMessage::Pong(p),
                AxMessage::Close(f) => {
                    let _ = a_tx
                        .send(TMessage::Close(f.map(|f| {
                            tokio_tungstenite::tungstenite::protocol::CloseFrame {
                                code: f.code.into(),
                                reason: f.reason.as_str().into(),
                            }
                        })))
                        .await;
                    break;
                }
            };
            if a_tx.send(out).await.is_err() {
                break;
            }
        }
    };
    let down = async {
        while let Some(Ok(m)) = a_rx.next().await {
            let out = match m {
                TMessage::Binary(b) => AxMessage::Binary(b),
                TMessage::Text(t) => AxMessage::Text(t.as_str().into()),
                TMessage::Ping(p) => AxMessage::Ping(p),
                TMessage::Pong(p) => AxMessage::Pong(p),
                TMessage::Close(_) => break,
                TMessage::Frame(_) => continue,
            };
            if c_tx.send(out).await.is_err() {
                return;
            }
        }
        // kubectl treats a close without a status code as an error: always end normally.
        let _ = c_tx
            .send(AxMessage::Close(Some(axum::extract::ws::CloseFrame {
                code: axum::extract::ws::close_code::NORMAL,
                reason: "".into(),
            })))
            .await;
    };
    // The stream ends when the agent's side ends (the command exited); input ending
    // early must not cut the output short.
    tokio::pin!(up);
    tokio::pin!(down);
    tokio::select! {
        _ = &mut down => {}
        _ = &mut up => { down.await; }
    }
}

/// `nodes/NAME/proxy/PATH`: the request relayed to the node agent's endpoint at PATH (with its
/// query), its answer passed back as it is, as upstream's node proxy to the kubelet.
pub async fn node_proxy(ctx: &Ctx, parts: &http::request::Parts, body: bytes::Bytes) -> Result<Response, StatusError> {
    let (host, port, pin) = node_endpoint(ctx, &ctx.rr.name).await?;
    let t = Target {
        host,
        port,
        pin,
        container: String::new(),
    };
    // The path the request was authorized and routed with, not the raw URI read again.
    let mut path = crate::request::encode_path(&ctx.rr.proxy_path);
    if let Some(q) = parts.uri.query().filter(|q| !q.is_empty()) {
        path = format!("{path}?{q}");
    }
    let stream = connect(&ctx.state, &t, true).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
        .await
        .map_err(|e| StatusError::new(503, "ServiceUnavailable", format!("agent connection: {e}")))?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "node proxy connection ended");
        }
    });
    let mut req = http::Request::builder()
        .method(parts.method.clone())
        .uri(&path)
        .header(header::HOST, format!("{}:{}", t.host, t.port));
    for name in [header::CONTENT_TYPE, header::ACCEPT] {
        if let Some(v) = parts.headers.get(&name) {
            req = req.header(name, v);
        }
    }
    let req = req
        .body(http_body_util::Full::new(body))
        .map_err(|e| StatusError::bad_request(format!("proxy request: {e}")))?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| StatusError::new(503, "ServiceUnavailable", format!("error trying to reach service: {e}")))?;
    let (head, body) = resp.into_parts();
    let mut r = Response::new(Body::new(body));
    *r.status_mut() = head.status;
    for name in [header::CONTENT_TYPE, header::CONTENT_ENCODING] {
        if let Some(v) = head.headers.get(&name) {
            r.headers_mut().insert(name, v.clone());
        }
    }
    Ok(r)
}

/// GETs `path` from node `node_name`'s agent and decodes its JSON answer (the Summary API for
/// `metrics.k8s.io`), bounded by `timeout`.
pub async fn node_get_json(
    ctx: &Ctx,
    node_name: &str,
    path: &str,
    timeout: std::time::Duration,
) -> Result<Value, StatusError> {
    let (host, port, pin) = node_endpoint(ctx, node_name).await?;
    let t = Target {
        host,
        port,
        pin,
        container: String::new(),
    };
    let fetch = async {
        let stream = connect(&ctx.state, &t, true).await?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| StatusError::new(503, "ServiceUnavailable", format!("agent connection: {e}")))?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "agent connection ended");
            }
        });
        let req = http::Request::get(path)
            .header(header::HOST, format!("{}:{}", t.host, t.port))
            .header(header::ACCEPT, "application/json")
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .map_err(|e| StatusError::internal(format!("agent request: {e}")))?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| StatusError::new(503, "ServiceUnavailable", format!("agent request failed: {e}")))?;
        let status = resp.status();
        let body = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .map(|b| b.to_bytes())
            .map_err(|e| StatusError::new(503, "ServiceUnavailable", format!("reading the agent's answer: {e}")))?;
        if !status.is_success() {
            return Err(StatusError::new(
                503,
                "ServiceUnavailable",
                format!("node {node_name} answered {path} with {status}"),
            ));
        }
        serde_json::from_slice::<Value>(&body).map_err(|e| {
            StatusError::new(
                503,
                "ServiceUnavailable",
                format!("node {node_name} answered {path}: {e}"),
            )
        })
    };
    tokio::time::timeout(timeout, fetch).await.unwrap_or_else(|_| {
        Err(StatusError::new(
            503,
            "ServiceUnavailable",
            format!("node {node_name} did not answer {path} in {timeout:?}"),
        ))
    })
}

async fn proxy_logs(ctx: &Ctx, t: &Target, path: &str) -> Result<Response, StatusError> {
    let stream = connect(&ctx.state, t, true).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
        .await
        .map_err(|e| StatusError::new(503, "ServiceUnavailable", format!("agent connection: {e}")))?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "log proxy connection ended");
        }
    });
    let req = http::Request::get(path)
        .header(header::HOST, format!("{}:{}", t.host, t.port))
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .map_err(|e| StatusError::internal(format!("agent request: {e}")))?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| StatusError::new(503, "ServiceUnavailable", format!("agent request failed: {e}")))?;
    let status = resp.status();
    if !status.is_success() {
        // The agent answers errors as Status objects or text; pass them on as a Status.
        let body = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        if let Ok(v) = serde_json::from_slice::<Value>(&body)
            && v.get("kind").and_then(Value::as_str) == Some("Status")
        {
            let mut r = crate::body::value_response(status, &v);
            *r.status_mut() = status;
            return Ok(r);
        }
        return Err(StatusError::new(
            status.as_u16(),
            if status == StatusCode::NOT_FOUND {
                "NotFound"
            } else {
                "BadRequest"
            },
            String::from_utf8_lossy(&body).trim().to_string(),
        ));
    }
    let ct = resp.headers().get(header::CONTENT_TYPE).cloned();
    let mut r = Response::new(Body::new(resp.into_body()));
    if let Some(ct) = ct {
        r.headers_mut().insert(header::CONTENT_TYPE, ct);
    }
    Ok(r)
}
