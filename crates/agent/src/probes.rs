//! Liveness, readiness and startup probes (exec, httpGet, tcpSocket, grpc) and lifecycle hooks
//! (postStart, preStop), with upstream's timing fields and messages.

use std::sync::Arc;
use std::time::Duration;

use bollard::Docker;
use bollard::exec::{StartExecOptions, StartExecResults};
use bollard::models::ExecConfig;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Container, ExecAction, HTTPGetAction, LifecycleHandler, Probe, TCPSocketAction};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Notify;

/// Probe results for one running container instance.
#[derive(Debug, Default)]
pub struct ProbeState {
    pub ready: bool,
    pub started: bool,
    /// Set when the liveness or startup probe gave up: (probe kind, message).
    pub restart: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeKind {
    Liveness,
    Readiness,
    Startup,
}

impl ProbeKind {
    pub fn name(self) -> &'static str {
        match self {
            ProbeKind::Liveness => "Liveness",
            ProbeKind::Readiness => "Readiness",
            ProbeKind::Startup => "Startup",
        }
    }
}

/// The outcome of one probe run.
#[derive(Debug, PartialEq)]
pub enum Outcome {
    Success,
    Failure(String),
}

/// What a probe needs to reach its container.
#[derive(Clone)]
pub struct Target {
    pub docker: Docker,
    pub container_id: String,
    pub pod_ip: String,
    pub container: Container,
}

/// Called with every failed probe (for `Unhealthy` events).
pub type FailureHook = Arc<dyn Fn(ProbeKind, &str) + Send + Sync>;

/// Starts the probe tasks of a container instance; abort the returned handles when it stops.
pub fn start(
    target: Target,
    state: Arc<Mutex<ProbeState>>,
    wake: Arc<Notify>,
    on_failure: FailureHook,
) -> Vec<tokio::task::JoinHandle<()>> {
    {
        let mut s = state.lock();
        s.started = target.container.startup_probe.is_none();
        s.ready = target.container.readiness_probe.is_none();
    }
    let mut tasks = Vec::new();
    let probes = [
        (ProbeKind::Startup, target.container.startup_probe.clone()),
        (ProbeKind::Liveness, target.container.liveness_probe.clone()),
        (ProbeKind::Readiness, target.container.readiness_probe.clone()),
    ];
    for (kind, probe) in probes {
        let Some(probe) = probe else { continue };
        let (target, state, wake, on_failure) = (target.clone(), state.clone(), wake.clone(), on_failure.clone());
        tasks.push(tokio::spawn(async move {
            probe_loop(kind, probe, target, state, wake, on_failure).await
        }));
    }
    tasks
}

async fn probe_loop(
    kind: ProbeKind,
    probe: Probe,
    target: Target,
    state: Arc<Mutex<ProbeState>>,
    wake: Arc<Notify>,
    on_failure: FailureHook,
) {
    let period = Duration::from_secs(probe.period_seconds.unwrap_or(10).max(1) as u64);
    let timeout = Duration::from_secs(probe.timeout_seconds.unwrap_or(1).max(1) as u64);
    let success_threshold = probe.success_threshold.unwrap_or(1).max(1);
    let failure_threshold = probe.failure_threshold.unwrap_or(3).max(1);
    tokio::time::sleep(Duration::from_secs(
        probe.initial_delay_seconds.unwrap_or(0).max(0) as u64
    ))
    .await;
    let (mut successes, mut failures) = (0, 0);
    loop {
        if kind != ProbeKind::Startup && !state.lock().started {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        let outcome = run_probe(&probe, &target, timeout).await;
        match outcome {
            Outcome::Success => {
                failures = 0;
                successes += 1;
                if successes >= success_threshold {
                    let mut s = state.lock();
                    match kind {
                        ProbeKind::Startup => {
                            s.started = true;
                            drop(s);
                            wake.notify_one();
                            return;
                        }
                        ProbeKind::Readiness if !s.ready => {
                            s.ready = true;
                            drop(s);
                            wake.notify_one();
                        }
                        _ => {}
                    }
                }
            }
            Outcome::Failure(message) => {
                successes = 0;
                failures += 1;
                on_failure(kind, &message);
                if failures >= failure_threshold {
                    let mut s = state.lock();
                    match kind {
                        ProbeKind::Readiness => {
                            if s.ready {
                                s.ready = false;
                                drop(s);
                                wake.notify_one();
                            }
                        }
                        ProbeKind::Liveness | ProbeKind::Startup => {
                            s.restart = Some(format!(
                                "Container {} failed {} probe, will be restarted",
                                target.container.name,
                                kind.name().to_lowercase()
                            ));
                            drop(s);
                            wake.notify_one();
                            return;
                        }
                    }
                }
            }
        }
        tokio::time::sleep(period).await;
    }
}

/// Runs one probe once.
pub async fn run_probe(probe: &Probe, target: &Target, timeout: Duration) -> Outcome {
    if let Some(exec) = &probe.exec {
        return run_exec(&target.docker, &target.container_id, exec, timeout).await;
    }
    if let Some(http) = &probe.http_get {
        return http_get(http, target, timeout).await;
    }
    if let Some(tcp) = &probe.tcp_socket {
        return tcp_socket(tcp, target, timeout).await;
    }
    if let Some(grpc) = &probe.grpc {
        let Ok(port) = u16::try_from(grpc.port) else {
            return Outcome::Failure(format!("invalid port number: {}", grpc.port));
        };
        let service = grpc.service.as_deref().unwrap_or_default();
        return match crate::grpc_probe::probe(&target.pod_ip, port, service, timeout).await {
            Ok(_) => Outcome::Success,
            Err(message) => Outcome::Failure(message),
        };
    }
    Outcome::Failure("missing probe handler".into())
}

/// Runs a command in a container, returning its exit code and combined output.
pub async fn exec_output(docker: &Docker, container_id: &str, command: &[String]) -> anyhow::Result<(i64, String)> {
    let exec = docker
        .create_exec(
            container_id,
            ExecConfig {
                cmd: Some(command.to_vec()),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                ..Default::default()
            },
        )
        .await?;
    let mut output = String::new();
    if let StartExecResults::Attached { output: mut stream, .. } =
        docker.start_exec(&exec.id, Some(StartExecOptions::default())).await?
    {
        while let Some(chunk) = stream.next().await {
            output.push_str(&chunk?.to_string());
        }
    }
    Ok((exit_code(docker, &exec.id).await?, output))
}

/// The exit code Docker reports for a finished exec. The output stream can end a moment before
/// Docker has recorded the exit, so a running exec is asked again; an exit code Docker never
/// reports is an error (a probe or hook whose result is unknown failed), never a success.
pub(crate) async fn exit_code(docker: &Docker, exec_id: &str) -> anyhow::Result<i64> {
    for _ in 0..50 {
        let inspect = docker.inspect_exec(exec_id).await?;
        match (inspect.running, inspect.exit_code) {
            (Some(true), _) => tokio::time::sleep(Duration::from_millis(20)).await,
            (_, Some(code)) => return Ok(code),
            (_, None) => break,
        }
    }
    anyhow::bail!("the exit code of exec {exec_id} was not reported")
}

async fn run_exec(docker: &Docker, id: &str, exec: &ExecAction, timeout: Duration) -> Outcome {
    let command = exec.command.clone().unwrap_or_default();
    match tokio::time::timeout(timeout, exec_output(docker, id, &command)).await {
        Err(_) => Outcome::Failure(format!("command {command:?} timed out")),
        Ok(Err(e)) => Outcome::Failure(format!("{e:#}")),
        Ok(Ok((0, _))) => Outcome::Success,
        Ok(Ok((_, output))) => Outcome::Failure(output),
    }
}

fn resolve_port(port: &IntOrString, container: &Container) -> Result<u16, String> {
    match port {
        IntOrString::Int(p) => u16::try_from(*p).map_err(|_| format!("invalid port number: {p}")),
        IntOrString::String(name) => {
            if let Ok(p) = name.parse::<u16>() {
                return Ok(p);
            }
            container
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .and_then(|p| u16::try_from(p.container_port).ok())
                .ok_or_else(|| format!("couldn't find port: {name} in {}", container.name))
        }
    }
}

async fn http_get(http: &HTTPGetAction, target: &Target, timeout: Duration) -> Outcome {
    match http_status(http, &target.pod_ip, &target.container, timeout).await {
        Ok(code) if (200..400).contains(&code) => Outcome::Success,
        Ok(code) => Outcome::Failure(format!("HTTP probe failed with statuscode: {code}")),
        Err(e) => Outcome::Failure(e),
    }
}

/// Performs an HTTP GET as upstream's prober does and returns the status code.
pub async fn http_status(
    http: &HTTPGetAction,
    pod_ip: &str,
    container: &Container,
    timeout: Duration,
) -> Result<u16, String> {
    let port = resolve_port(&http.port, container)?;
    let host = http
        .host
        .clone()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| pod_ip.to_string());
    let path = http
        .path
        .clone()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "/".into());
    let path = if path.starts_with('/') {
        path
    } else {
        format!("/{path}")
    };
    let scheme = http.scheme.as_deref().unwrap_or("HTTP").to_lowercase();
    let url = format!("{scheme}://{host}:{port}{path}");
    let mut request = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: kube-probe/1.33\r\nAccept: */*\r\nConnection: close\r\n"
    );
    for h in http.http_headers.iter().flatten() {
        request.push_str(&format!("{}: {}\r\n", h.name, h.value));
    }
    request.push_str("\r\n");
    let work = async {
        let stream = tokio::net::TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|e| format!("Get \"{url}\": dial tcp {host}:{port}: connect: {}", io_reason(&e)))?;
        if scheme == "https" {
            // As upstream's prober: TLS without verifying the certificate, then the same GET.
            let name =
                rustls::pki_types::ServerName::try_from(host.clone()).map_err(|e| format!("Get \"{url}\": {e}"))?;
            let tls = tokio_rustls::TlsConnector::from(insecure_tls_config()?)
                .connect(name, stream)
                .await
                .map_err(|e| format!("Get \"{url}\": {e}"))?;
            status_over(tls, &request, &url).await
        } else {
            status_over(stream, &request, &url).await
        }
    };
    match tokio::time::timeout(timeout, work).await {
        Ok(r) => r,
        Err(_) => Err(format!(
            "Get \"{url}\": context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
        )),
    }
}

/// Sends the request and reads the status code of the answer.
async fn status_over<S>(mut stream: S, request: &str, url: &str) -> Result<u16, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| format!("Get \"{url}\": {e}"))?;
    let mut buf = vec![0u8; 1024];
    let mut read = 0;
    while read < 12 {
        let n = stream
            .read(&mut buf[read..])
            .await
            .map_err(|e| format!("Get \"{url}\": {e}"))?;
        if n == 0 {
            break;
        }
        read += n;
    }
    let head = String::from_utf8_lossy(&buf[..read]).into_owned();
    head.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse::<u16>().ok())
        .ok_or_else(|| format!("Get \"{url}\": malformed HTTP response"))
}

/// Accepts any server certificate (upstream's prober sets InsecureSkipVerify), still checking
/// the handshake's signatures. Also what `skiff audit security` probes node agents with.
#[derive(Debug)]
pub struct AnyCertificate(pub std::sync::Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn insecure_tls_config() -> Result<std::sync::Arc<rustls::ClientConfig>, String> {
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup: {e}"))?
        .dangerous()
        .with_custom_certificate_verifier(std::sync::Arc::new(AnyCertificate(provider)))
        .with_no_client_auth();
    Ok(std::sync::Arc::new(config))
}

fn io_reason(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::ConnectionRefused => "connection refused".into(),
        _ => e.to_string(),
    }
}

async fn tcp_socket(tcp: &TCPSocketAction, target: &Target, timeout: Duration) -> Outcome {
    let port = match resolve_port(&tcp.port, &target.container) {
        Ok(p) => p,
        Err(e) => return Outcome::Failure(e),
    };
    let host = tcp
        .host
        .clone()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| target.pod_ip.clone());
    match tokio::time::timeout(timeout, tokio::net::TcpStream::connect((host.as_str(), port))).await {
        Ok(Ok(_)) => Outcome::Success,
        Ok(Err(e)) => Outcome::Failure(format!("dial tcp {host}:{port}: connect: {}", io_reason(&e))),
        Err(_) => Outcome::Failure(format!("dial tcp {host}:{port}: i/o timeout")),
    }
}

/// Runs a lifecycle handler (postStart / preStop); the error is the message for the hook event.
pub async fn run_handler(handler: &LifecycleHandler, target: &Target) -> Result<(), String> {
    if let Some(exec) = &handler.exec {
        let command = exec.command.clone().unwrap_or_default();
        return match exec_output(&target.docker, &target.container_id, &command).await {
            Ok((0, _)) => Ok(()),
            Ok((code, output)) => Err(format!("command '{}' exited with {code}: {output}", command.join(" "))),
            Err(e) => Err(format!("{e:#}")),
        };
    }
    if let Some(http) = &handler.http_get {
        return match http_status(http, &target.pod_ip, &target.container, Duration::from_secs(10)).await {
            Ok(code) if (200..400).contains(&code) => Ok(()),
            Ok(code) => Err(format!(
                "HTTP lifecycle hook ({}) for Container \"{}\" returned status {code}",
                http.path.as_deref().unwrap_or("/"),
                target.container.name
            )),
            Err(e) => Err(e),
        };
    }
    if let Some(sleep) = &handler.sleep {
        tokio::time::sleep(Duration::from_secs(sleep.seconds.max(0) as u64)).await;
        return Ok(());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ContainerPort;

    fn container() -> Container {
        Container {
            name: "web".into(),
            ports: Some(vec![ContainerPort {
                name: Some("http".into()),
                container_port: 8080,
                ..Default::default()
            }]),
            ..Default::default()
        }
    }

    #[test]
    fn named_ports_resolve() {
        let c = container();
        assert_eq!(resolve_port(&IntOrString::String("http".into()), &c), Ok(8080));
        assert_eq!(resolve_port(&IntOrString::Int(81), &c), Ok(81));
        assert_eq!(resolve_port(&IntOrString::String("90".into()), &c), Ok(90));
        assert!(resolve_port(&IntOrString::String("nope".into()), &c).is_err());
    }

    /// HTTPS probes do the TLS handshake (any certificate, as upstream's) and the GET, and judge
    /// the status code; a port that answers in plain HTTP, or nothing at all, fails them.
    #[tokio::test]
    async fn https_probe_does_tls_and_reads_status_codes() {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["pod.invalid".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let config =
            rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(
                    vec![cert.der().clone()],
                    rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
                )
                .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            for code in ["200 OK", "500 Internal Server Error"] {
                let (s, _) = listener.accept().await.unwrap();
                let mut s = acceptor.accept(s).await.unwrap();
                let mut buf = [0u8; 512];
                let n = s.read(&mut buf).await.unwrap();
                assert!(buf[..n].starts_with(b"GET /healthz HTTP/1.1\r\n"));
                s.write_all(format!("HTTP/1.1 {code}\r\nContent-Length: 0\r\n\r\n").as_bytes())
                    .await
                    .unwrap();
                let _ = s.shutdown().await;
            }
        });
        let action = |port: u16| HTTPGetAction {
            port: IntOrString::Int(port as i32),
            path: Some("/healthz".into()),
            scheme: Some("HTTPS".into()),
            ..Default::default()
        };
        let c = container();
        let t = Duration::from_secs(5);
        assert_eq!(http_status(&action(port), "127.0.0.1", &c, t).await, Ok(200));
        assert_eq!(http_status(&action(port), "127.0.0.1", &c, t).await, Ok(500));
        // A server that speaks plain HTTP is no HTTPS endpoint, though its port is open.
        let plain = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let plain_port = plain.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut s, _) = plain.accept().await.unwrap();
            let mut buf = [0u8; 512];
            let _ = s.read(&mut buf).await;
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n").await;
        });
        let err = http_status(&action(plain_port), "127.0.0.1", &c, t).await.unwrap_err();
        assert!(
            err.starts_with(&format!("Get \"https://127.0.0.1:{plain_port}/healthz\": ")),
            "{err}"
        );
    }

    /// A gRPC probe asks the health service: an open port whose service says NOT_SERVING fails.
    #[tokio::test]
    async fn grpc_probe_asks_the_health_service() {
        let (reporter, service) = tonic_health::server::health_reporter();
        reporter
            .set_service_status("", tonic_health::ServingStatus::NotServing)
            .await;
        reporter
            .set_service_status("db", tonic_health::ServingStatus::Serving)
            .await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let target = Target {
            docker: Docker::connect_with_local_defaults().unwrap(),
            container_id: String::new(),
            pod_ip: "127.0.0.1".into(),
            container: container(),
        };
        let probe = |service: Option<&str>| Probe {
            grpc: Some(k8s_openapi::api::core::v1::GRPCAction {
                port: port as i32,
                service: service.map(str::to_string),
            }),
            ..Default::default()
        };
        let t = Duration::from_secs(2);
        assert_eq!(
            run_probe(&probe(None), &target, t).await,
            Outcome::Failure("service unhealthy (responded with \"NOT_SERVING\")".into())
        );
        assert_eq!(run_probe(&probe(Some("db")), &target, t).await, Outcome::Success);
    }

    #[tokio::test]
    async fn http_probe_reads_status_codes() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            for code in ["200 OK", "503 Service Unavailable"] {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = [0u8; 512];
                let _ = s.read(&mut buf).await.unwrap();
                s.write_all(format!("HTTP/1.1 {code}\r\nContent-Length: 0\r\n\r\n").as_bytes())
                    .await
                    .unwrap();
            }
        });
        let action = HTTPGetAction {
            port: IntOrString::Int(port as i32),
            path: Some("/healthz".into()),
            ..Default::default()
        };
        let c = container();
        assert_eq!(
            http_status(&action, "127.0.0.1", &c, Duration::from_secs(2)).await,
            Ok(200)
        );
        assert_eq!(
            http_status(&action, "127.0.0.1", &c, Duration::from_secs(2)).await,
            Ok(503)
        );
        let err = http_status(&action, "127.0.0.1", &c, Duration::from_secs(2))
            .await
            .unwrap_err();
        assert!(err.contains("connection refused"), "{err}");
    }
}
