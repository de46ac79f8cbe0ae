//! gRPC probes: one `grpc.health.v1.Health/Check` unary call over plaintext HTTP/2, judged on the
//! answer's status as upstream's `pkg/probe/grpc` (same messages).
//!
//! The call is framed by hand over hyper's HTTP/2 client (a 5-byte length prefix around the
//! protobuf message, `grpc-status` from the trailers): one unary call needs neither tonic's
//! code generation nor its transport stack in the node agent.

use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;

/// `grpc.health.v1.HealthCheckRequest`.
#[derive(Clone, PartialEq, prost::Message)]
struct HealthCheckRequest {
    #[prost(string, tag = "1")]
    service: String,
}

/// `grpc.health.v1.HealthCheckResponse`.
#[derive(Clone, PartialEq, prost::Message)]
struct HealthCheckResponse {
    #[prost(int32, tag = "1")]
    status: i32,
}

/// The names of `HealthCheckResponse.ServingStatus`.
fn serving_status_name(status: i32) -> String {
    match status {
        0 => "UNKNOWN".into(),
        1 => "SERVING".into(),
        2 => "NOT_SERVING".into(),
        3 => "SERVICE_UNKNOWN".into(),
        other => other.to_string(),
    }
}

/// The names of gRPC status codes, as grpc-go prints them.
fn code_name(code: u32) -> String {
    const NAMES: [&str; 17] = [
        "OK",
        "Canceled",
        "Unknown",
        "InvalidArgument",
        "DeadlineExceeded",
        "NotFound",
        "AlreadyExists",
        "PermissionDenied",
        "ResourceExhausted",
        "FailedPrecondition",
        "Aborted",
        "OutOfRange",
        "Unimplemented",
        "Internal",
        "Unavailable",
        "DataLoss",
        "Unauthenticated",
    ];
    NAMES
        .get(code as usize)
        .map(|n| n.to_string())
        .unwrap_or_else(|| format!("Code({code})"))
}

const UNIMPLEMENTED: u32 = 12;
const DEADLINE_EXCEEDED: u32 = 4;

/// Go's `time.Duration` formatting for whole seconds and milliseconds ("1s", "1.5s", "500ms").
fn go_duration(d: Duration) -> String {
    if d.as_millis() < 1000 {
        format!("{}ms", d.as_millis())
    } else if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}s", d.as_secs_f64())
    }
}

/// What the call ended with, before judging.
enum CallError {
    /// Connecting (TCP or the HTTP/2 handshake) kept failing until the deadline.
    ConnectTimeout,
    /// A gRPC status other than OK: (code, message).
    Status(u32, String),
    /// The call did not finish within the deadline.
    RpcTimeout,
    /// Anything else (malformed answers, broken streams).
    Other(String),
}

/// Runs a gRPC health check against `host:port` for `service`. Ok(message) is a success
/// ("service healthy"); Err(message) is a failure with upstream's message.
pub async fn probe(host: &str, port: u16, service: &str, timeout: Duration) -> Result<String, String> {
    let addr = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let deadline = tokio::time::Instant::now() + timeout;
    match check(&addr, service, timeout, deadline).await {
        Ok(1) => Ok("service healthy".into()),
        Ok(status) => Err(format!(
            "service unhealthy (responded with \"{}\")",
            serving_status_name(status)
        )),
        Err(CallError::ConnectTimeout) => Err(format!(
            "timeout: failed to connect service \"{addr}\" within {}: context deadline exceeded",
            go_duration(timeout)
        )),
        Err(CallError::Status(UNIMPLEMENTED, message)) => Err(format!(
            "error: this server does not implement the grpc health protocol (grpc.health.v1.Health): {message}"
        )),
        Err(CallError::Status(DEADLINE_EXCEEDED, _)) | Err(CallError::RpcTimeout) => Err(format!(
            "timeout: health rpc did not complete within {}",
            go_duration(timeout)
        )),
        Err(CallError::Status(code, message)) => Err(format!(
            "error: health rpc probe failed: rpc error: code = {} desc = {message}",
            code_name(code)
        )),
        Err(CallError::Other(e)) => Err(format!("error: health rpc probe failed: {e}")),
    }
}

type Sender = hyper::client::conn::http2::SendRequest<Full<Bytes>>;

/// Connects as grpc-go's blocking dial does: retries a refused connection or a failed HTTP/2
/// handshake with a growing pause until the deadline.
async fn connect(addr: &str, deadline: tokio::time::Instant) -> Result<Sender, CallError> {
    let mut pause = Duration::from_millis(100);
    loop {
        let attempt = async {
            let stream = tokio::net::TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
            let _ = stream.set_nodelay(true);
            let (sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .map_err(|e| e.to_string())?;
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!("gRPC probe connection: {e}");
                }
            });
            Ok::<_, String>(sender)
        };
        match tokio::time::timeout_at(deadline, attempt).await {
            Ok(Ok(sender)) => return Ok(sender),
            Ok(Err(e)) => tracing::debug!("gRPC probe connecting to {addr}: {e}"),
            Err(_) => return Err(CallError::ConnectTimeout),
        }
        if tokio::time::Instant::now() + pause >= deadline {
            tokio::time::sleep_until(deadline).await;
            return Err(CallError::ConnectTimeout);
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(1));
    }
}

/// One `Health/Check` call; returns the serving status number.
async fn check(addr: &str, service: &str, timeout: Duration, deadline: tokio::time::Instant) -> Result<i32, CallError> {
    let mut sender = connect(addr, deadline).await?;
    let message = HealthCheckRequest {
        service: service.to_string(),
    }
    .encode_to_vec();
    let mut frame = BytesMut::with_capacity(5 + message.len());
    frame.put_u8(0);
    frame.put_u32(message.len() as u32);
    frame.put_slice(&message);
    let request = http::Request::post(format!("http://{addr}/grpc.health.v1.Health/Check"))
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers")
        .header(http::header::USER_AGENT, "kube-probe/1.33")
        .header("grpc-timeout", format!("{}m", timeout.as_millis().max(1)))
        .body(Full::new(frame.freeze()))
        .map_err(|e| CallError::Other(e.to_string()))?;
    let call = async {
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| CallError::Other(format!("rpc error: code = Unavailable desc = {e}")))?;
        let (parts, body) = response.into_parts();
        if parts.status != http::StatusCode::OK {
            return Err(CallError::Status(
                http_status_code(parts.status),
                format!(
                    "unexpected HTTP status code received from server: {}",
                    parts.status.as_u16()
                ),
            ));
        }
        // A trailers-only answer carries grpc-status in the headers.
        if let Some(status) = grpc_status(&parts.headers) {
            return Err(status);
        }
        let collected = body
            .collect()
            .await
            .map_err(|e| CallError::Other(format!("rpc error: code = Internal desc = {e}")))?;
        let trailers = collected.trailers().cloned().unwrap_or_default();
        if let Some(status) = grpc_status(&trailers) {
            return Err(status);
        }
        if trailers.get("grpc-status").is_none() {
            return Err(CallError::Status(
                13,
                "server closed the stream without sending trailers".into(),
            ));
        }
        let mut data = collected.to_bytes();
        if data.len() < 5 {
            return Err(CallError::Status(
                13,
                "cardinality violation: expected <EOF> for non server-streaming RPCs, but received no message".into(),
            ));
        }
        let compressed = data.get_u8();
        let length = data.get_u32() as usize;
        if compressed != 0 || data.len() < length {
            return Err(CallError::Status(13, "grpc: malformed message from server".into()));
        }
        HealthCheckResponse::decode(&data[..length])
            .map(|r| r.status)
            .map_err(|e| CallError::Status(13, format!("grpc: failed to unmarshal the received message: {e}")))
    };
    match tokio::time::timeout_at(deadline, call).await {
        Ok(result) => result,
        Err(_) => Err(CallError::RpcTimeout),
    }
}

/// `grpc-status` and `grpc-message` of a header map, when the status is not OK.
fn grpc_status(headers: &http::HeaderMap) -> Option<CallError> {
    let code = headers.get("grpc-status")?.to_str().ok()?.trim().parse::<u32>().ok()?;
    if code == 0 {
        return None;
    }
    let message = headers
        .get("grpc-message")
        .and_then(|m| m.to_str().ok())
        .map(percent_decode)
        .unwrap_or_default();
    Some(CallError::Status(code, message))
}

/// grpc-go's mapping of a non-200 HTTP status to a gRPC code.
fn http_status_code(status: http::StatusCode) -> u32 {
    match status.as_u16() {
        400 => 13,
        401 => 16,
        403 => 7,
        404 => UNIMPLEMENTED,
        429 | 502..=504 => 14,
        _ => 2,
    }
}

/// Decodes the percent-encoding of `grpc-message`.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic_health::ServingStatus;

    /// Starts tonic's reference health server on a free port; returns its port and reporter.
    async fn health_server() -> (u16, tonic_health::server::HealthReporter) {
        let (reporter, service) = tonic_health::server::health_reporter();
        reporter.set_service_status("", ServingStatus::Serving).await;
        reporter.set_service_status("sick", ServingStatus::NotServing).await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
                .unwrap();
        });
        (port, reporter)
    }

    #[tokio::test]
    async fn judges_the_health_servers_answers() {
        let (port, reporter) = health_server().await;
        let t = Duration::from_secs(2);
        assert_eq!(probe("127.0.0.1", port, "", t).await, Ok("service healthy".into()));
        assert_eq!(
            probe("127.0.0.1", port, "sick", t).await,
            Err("service unhealthy (responded with \"NOT_SERVING\")".into())
        );
        assert_eq!(
            probe("127.0.0.1", port, "nobody", t).await,
            Err("error: health rpc probe failed: rpc error: code = NotFound desc = service not registered".into())
        );
        reporter.set_service_status("sick", ServingStatus::Serving).await;
        assert_eq!(probe("127.0.0.1", port, "sick", t).await, Ok("service healthy".into()));
    }

    #[tokio::test]
    async fn a_port_nobody_listens_on_fails_after_the_timeout() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let started = std::time::Instant::now();
        let err = probe("127.0.0.1", port, "", Duration::from_secs(1)).await.unwrap_err();
        assert_eq!(
            err,
            format!("timeout: failed to connect service \"127.0.0.1:{port}\" within 1s: context deadline exceeded")
        );
        assert!(started.elapsed() >= Duration::from_millis(900));
    }

    /// A server that accepts the connection but never answers (an HTTP/1 server, or a hung
    /// process) fails the probe at its timeout.
    #[tokio::test]
    async fn a_silent_server_times_out() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let mut held = Vec::new();
            loop {
                let (s, _) = listener.accept().await.unwrap();
                held.push(s);
            }
        });
        let started = std::time::Instant::now();
        let err = probe("127.0.0.1", port, "", Duration::from_secs(1)).await.unwrap_err();
        assert!(err.starts_with("timeout: "), "{err}");
        assert!(started.elapsed() < Duration::from_secs(3));
    }

    /// An HTTP/2 server without the health service answers Unimplemented.
    #[tokio::test]
    async fn a_server_without_the_health_service_is_reported() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            // tonic's router with no services answers every method with Unimplemented.
            tonic::transport::Server::builder()
                .add_routes(tonic::service::Routes::default())
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
                .unwrap();
        });
        let err = probe("127.0.0.1", port, "", Duration::from_secs(2)).await.unwrap_err();
        assert!(
            err.starts_with("error: this server does not implement the grpc health protocol (grpc.health.v1.Health)"),
            "{err}"
        );
    }

    #[test]
    fn messages_are_percent_decoded() {
        assert_eq!(percent_decode("unknown%20service%25"), "unknown service%");
        assert_eq!(percent_decode("50%"), "50%");
        assert_eq!(go_duration(Duration::from_secs(1)), "1s");
        assert_eq!(go_duration(Duration::from_millis(500)), "500ms");
    }
}
