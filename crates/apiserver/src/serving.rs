//! Serving HTTPS connections, as upstream's `SecureServingInfo.Serve` (`secure_serving.go`) and
//! Go's `http.Server` with kube-apiserver's settings: 1 MiB of request headers at most (431
//! beyond, HTTP/1.1 and HTTP/2 alike), headers read within `--header-read-timeout` (32 s, Go's
//! `ReadHeaderTimeout`), a connection without a request for 90 s closed (`IdleTimeout`; hyper
//! times an idle HTTP/1.1 connection's next head from its last response, so those close after the
//! header timeout), TCP keep-alive every 3 minutes as upstream's listener sets it, and HTTP/2
//! PINGs so a connection whose peer is gone is dropped.
//!
//! Beyond upstream: at most `--max-connections` connections are open at once (by default the
//! open-file limit less [`RESERVED_DESCRIPTORS`]); at the cap the listener stops accepting, so new
//! connections wait in the kernel's backlog until others close, and the server never runs out of
//! descriptors for its store, its node agent and its own outgoing connections.
//! [`raise_open_file_limit`] lifts the process's soft limit to the hard one at start, as Go's
//! runtime does for every program.
//!
//! Shutdown ([`Serving::stop_accepting`], then [`Serving::close`]): the listener is closed and
//! every connection asked to close once its requests are answered (HTTP/2 GOAWAY), then whatever
//! is still open (watches, streams) is dropped.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use tokio::sync::{Semaphore, watch};
use tokio::time::Instant;

use crate::coalesce::{Coalesce, Polled};
use crate::tls::{Identity, identity_from_cert};

/// Go's `http.Server.ReadHeaderTimeout` as kube-apiserver sets it.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(32);
/// Go's `http.Server.IdleTimeout` (and HTTP/2's) as kube-apiserver sets it.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// kube-apiserver's `MaxHeaderBytes`: request line and headers, HTTP/1.1; the header list, HTTP/2.
pub const MAX_HEADER_BYTES: usize = 1 << 20;
/// Descriptors left to everything but client connections when `--max-connections` is automatic.
pub const RESERVED_DESCRIPTORS: u64 = 1024;
/// How long a client may take to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Concurrent streams one HTTP/2 connection may carry: kube-apiserver's
/// `--http2-max-streams-per-connection` as clusters set it, so a client multiplexing its requests
/// over one connection (client-go, skiff's scheduler) is not held to hyper's 200.
const HTTP2_MAX_STREAMS: u32 = 1000;
/// HTTP/2 PINGs on a connection: how often, and how long an answer may take.
const HTTP2_PING_INTERVAL: Duration = Duration::from_secs(30);
const HTTP2_PING_TIMEOUT: Duration = Duration::from_secs(20);
/// upstream's `defaultKeepAlivePeriod` of its listener.
const TCP_KEEPALIVE: Duration = Duration::from_secs(180);

/// How connections are served.
#[derive(Clone, Debug)]
pub struct ServingOptions {
    /// `--max-connections`: 0 is the open-file limit less [`RESERVED_DESCRIPTORS`].
    pub max_connections: usize,
    /// `--header-read-timeout`: how long a request's line and headers may take to arrive.
    pub header_read_timeout: Duration,
    /// How long a connection without a request in flight stays open.
    pub idle_timeout: Duration,
}

impl Default for ServingOptions {
    fn default() -> Self {
        ServingOptions {
            max_connections: 0,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
        }
    }
}

impl ServingOptions {
    /// The cap on open connections: the option, or the open-file limit less the reserve.
    pub fn connection_limit(&self) -> usize {
        if self.max_connections > 0 {
            return self.max_connections;
        }
        let soft = open_file_limit().map(|(soft, _)| soft).unwrap_or(1024);
        soft.saturating_sub(RESERVED_DESCRIPTORS).clamp(64, 1 << 20) as usize
    }
}

/// The soft and hard `RLIMIT_NOFILE`.
pub fn open_file_limit() -> std::io::Result<(u64, u64)> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((limit.rlim_cur, limit.rlim_max))
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit, as Go's runtime does at start; the limit
/// in force after.
pub fn raise_open_file_limit() -> std::io::Result<u64> {
    let (soft, hard) = open_file_limit()?;
    if soft >= hard {
        return Ok(soft);
    }
    let limit = libc::rlimit {
        rlim_cur: hard,
        rlim_max: hard,
    };
    // SAFETY: setrlimit reads the struct it is given.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(hard)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Serving,
    /// No new connections; open ones close once their requests are answered.
    Draining,
    /// Every connection is closed.
    Closed,
}

/// The HTTPS listener and its connections.
pub struct Serving {
    phase: watch::Sender<Phase>,
    open: Arc<AtomicUsize>,
    limit: usize,
}

impl Serving {
    /// Serves `router` over TLS on `listener`, on tasks of their own.
    ///
    /// HTTP/1.1 (with upgrades, for WebSockets) and HTTP/2 are both spoken, whichever the client
    /// negotiates. Each request carries an `Option<Identity>` extension, the user of the client
    /// certificate if any, and `axum::extract::ConnectInfo<SocketAddr>`.
    pub fn start(
        listener: tokio::net::TcpListener,
        config: Arc<rustls::ServerConfig>,
        router: axum::Router,
        opts: &ServingOptions,
    ) -> Serving {
        let limit = opts.connection_limit();
        let open = Arc::new(AtomicUsize::new(0));
        let (phase, _) = watch::channel(Phase::Serving);
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        tokio::spawn(accept(
            listener,
            acceptor,
            router,
            opts.clone(),
            phase.subscribe(),
            Arc::new(Semaphore::new(limit)),
            open.clone(),
        ));
        Serving { phase, open, limit }
    }

    /// Closes the listener and asks every connection to close once its requests are answered.
    pub fn stop_accepting(&self) {
        self.phase.send_if_modified(|p| {
            let serving = *p == Phase::Serving;
            if serving {
                *p = Phase::Draining;
            }
            serving
        });
    }

    /// Closes every connection still open.
    pub fn close(&self) {
        self.phase.send_replace(Phase::Closed);
    }

    /// Connections open now (TLS handshakes included).
    pub fn open_connections(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// The cap on open connections.
    pub fn connection_limit(&self) -> usize {
        self.limit
    }
}

/// Until the phase is past `Serving`; never when the `Serving` handle is dropped (the server then
/// serves for the life of the process).
async fn stopping(phase: &mut watch::Receiver<Phase>) {
    if phase.wait_for(|p| *p != Phase::Serving).await.is_err() {
        std::future::pending::<()>().await;
    }
}

async fn accept(
    listener: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    router: axum::Router,
    opts: ServingOptions,
    phase: watch::Receiver<Phase>,
    connections: Arc<Semaphore>,
    open: Arc<AtomicUsize>,
) {
    let mut stop = phase.clone();
    let mut warned: Option<Instant> = None;
    loop {
        let permit = match connections.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                if warned.is_none_or(|at| at.elapsed() > Duration::from_secs(10)) {
                    tracing::warn!(
                        limit = opts.connection_limit(),
                        "at --max-connections: new connections wait until others close"
                    );
                    warned = Some(Instant::now());
                }
                tokio::select! {
                    permit = connections.clone().acquire_owned() => match permit {
                        Ok(permit) => permit,
                        Err(_) => return,
                    },
                    _ = stopping(&mut stop) => break,
                }
            }
        };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stopping(&mut stop) => break,
        };
        let (tcp, peer) = match accepted {
            Ok(conn) => conn,
            Err(e) => {
                // Usually out of file descriptors: back off instead of spinning.
                tracing::warn!(error = %e, "accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let acceptor = acceptor.clone();
        let router = router.clone();
        let opts = opts.clone();
        let phase = phase.clone();
        let open = open.clone();
        open.fetch_add(1, Ordering::AcqRel);
        tokio::spawn(async move {
            let _permit = permit;
            connection(tcp, peer, acceptor, router, opts, phase).await;
            open.fetch_sub(1, Ordering::AcqRel);
        });
    }
    tracing::info!(addr = ?listener.local_addr().ok(), "stopped listening");
}

async fn connection(
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    acceptor: tokio_rustls::TlsAcceptor,
    router: axum::Router,
    opts: ServingOptions,
    mut phase: watch::Receiver<Phase>,
) {
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!(%peer, error = %e, "setting TCP_NODELAY failed");
    }
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(TCP_KEEPALIVE)
        .with_interval(TCP_KEEPALIVE);
    if let Err(e) = socket2::SockRef::from(&tcp).set_tcp_keepalive(&keepalive) {
        tracing::debug!(%peer, error = %e, "setting TCP keep-alive failed");
    }
    let handshake = tokio::select! {
        handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)) => handshake,
        _ = stopping(&mut phase) => return,
    };
    let tls = match handshake {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "TLS handshake failed");
            return;
        }
        Err(_) => {
            tracing::debug!(%peer, "TLS handshake timed out");
            return;
        }
    };
    let identity = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|certs| certs.first())
        .and_then(|cert| identity_from_cert(cert));
    // HTTP/2 connections write out once per poll of their task (see `coalesce`).
    if tls.get_ref().1.alpn_protocol() == Some(b"h2".as_slice()) {
        Polled::new(serve_connection(
            Coalesce::new(tls),
            peer,
            identity,
            router,
            opts,
            phase,
        ))
        .await;
    } else {
        serve_connection(tls, peer, identity, router, opts, phase).await;
    }
}

/// Whether a connection has requests in flight, and since when it has had none.
struct Activity {
    started: Instant,
    active: AtomicUsize,
    /// Milliseconds after `started` when the last request ended.
    idle_since: AtomicU64,
}

impl Activity {
    fn begin(self: &Arc<Self>) -> ActiveRequest {
        self.active.fetch_add(1, Ordering::AcqRel);
        ActiveRequest(self.clone())
    }

    fn idle_for(&self) -> Option<Duration> {
        if self.active.load(Ordering::Acquire) > 0 {
            return None;
        }
        let since = Duration::from_millis(self.idle_since.load(Ordering::Acquire));
        Some(self.started.elapsed().saturating_sub(since))
    }
}

/// A request from its headers to the end of its response body.
struct ActiveRequest(Arc<Activity>);

impl Drop for ActiveRequest {
    fn drop(&mut self) {
        let now = self.0.started.elapsed().as_millis() as u64;
        self.0.idle_since.store(now, Ordering::Release);
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that keeps its request active until it ends.
struct Tracked {
    inner: Body,
    _active: ActiveRequest,
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The bytes of a request's line and headers, as they came (HTTP/1.1) or as HTTP/2 counts a
/// header list (32 bytes a field).
fn head_bytes<B>(req: &http::Request<B>) -> usize {
    let line = req.method().as_str().len() + req.uri().path_and_query().map_or(1, |p| p.as_str().len()) + 11;
    let per_field = if req.version() == http::Version::HTTP_2 { 32 } else { 4 };
    req.headers().iter().fold(line, |n, (name, value)| {
        n + name.as_str().len() + value.len() + per_field
    })
}

/// Go's answer to headers over `MaxHeaderBytes`.
fn header_fields_too_large() -> axum::response::Response {
    let mut r = axum::response::Response::new(Body::from("431 Request Header Fields Too Large"));
    *r.status_mut() = http::StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE;
    let h = r.headers_mut();
    h.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert(http::header::CONNECTION, http::HeaderValue::from_static("close"));
    r
}

async fn serve_connection<S>(
    stream: S,
    peer: SocketAddr,
    identity: Option<Identity>,
    router: axum::Router,
    opts: ServingOptions,
    mut phase: watch::Receiver<Phase>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    use tower::ServiceExt;
    let activity = Arc::new(Activity {
        started: Instant::now(),
        active: AtomicUsize::new(0),
        idle_since: AtomicU64::new(0),
    });
    let requests = activity.clone();
    let service = hyper::service::service_fn(move |mut req: http::Request<hyper::body::Incoming>| {
        let active = requests.begin();
        req.extensions_mut().insert(identity.clone());
        req.extensions_mut().insert(axum::extract::ConnectInfo(peer));
        let router = router.clone();
        async move {
            // hyper bounds what it buffers of a head, not the head itself (a last read may
            // complete one past its buffer's limit); Go's limit is on the head.
            let response = if head_bytes(&req) > MAX_HEADER_BYTES + 4096 {
                header_fields_too_large()
            } else {
                match router.oneshot(req.map(Body::new)).await {
                    Ok(r) => r,
                    Err(never) => match never {},
                }
            };
            Ok::<_, Infallible>(response.map(|inner| Body::new(Tracked { inner, _active: active })))
        }
    });
    let mut builder = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
    builder
        .http1()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(opts.header_read_timeout)
        // Heads up to twice the limit are read whole and answered 431 by `head_bytes`'s check
        // (the client has sent all, so it reads the answer); hyper refuses larger ones itself.
        .max_buf_size(2 * MAX_HEADER_BYTES);
    builder
        .http2()
        .timer(hyper_util::rt::TokioTimer::new())
        .max_concurrent_streams(HTTP2_MAX_STREAMS)
        .max_header_list_size(MAX_HEADER_BYTES as u32)
        .keep_alive_interval(HTTP2_PING_INTERVAL)
        .keep_alive_timeout(HTTP2_PING_TIMEOUT);
    let conn = builder.serve_connection_with_upgrades(hyper_util::rt::TokioIo::new(stream), service);
    tokio::pin!(conn);
    let mut idle_check = tokio::time::interval((opts.idle_timeout / 4).max(Duration::from_millis(100)));
    idle_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut closing = false;
    let mut watching = true;
    loop {
        tokio::select! {
            served = conn.as_mut() => {
                if let Err(e) = served {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                return;
            }
            _ = idle_check.tick(), if !closing => {
                if activity.idle_for().is_some_and(|idle| idle >= opts.idle_timeout) {
                    tracing::debug!(%peer, "closing an idle connection");
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                }
            }
            changed = phase.changed(), if watching => {
                if changed.is_err() {
                    watching = false;
                    continue;
                }
                let now = *phase.borrow_and_update();
                match now {
                    Phase::Serving => {}
                    Phase::Draining if !closing => {
                        conn.as_mut().graceful_shutdown();
                        closing = true;
                    }
                    Phase::Draining => {}
                    Phase::Closed => return,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_file_limit_raised_to_the_hard_limit() {
        // nextest runs each test in a process of its own: lowering the limit here touches no
        // other test.
        let (_, hard) = open_file_limit().unwrap();
        let lower = hard.min(256);
        let limit = libc::rlimit {
            rlim_cur: lower,
            rlim_max: hard,
        };
        // SAFETY: setrlimit reads the struct it is given.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
        assert_eq!(open_file_limit().unwrap(), (lower, hard));
        assert_eq!(raise_open_file_limit().unwrap(), hard);
        assert_eq!(open_file_limit().unwrap(), (hard, hard));
        // Automatic: the limit less the reserve; explicit: as given.
        let auto = ServingOptions::default();
        assert_eq!(
            auto.connection_limit() as u64,
            hard.saturating_sub(RESERVED_DESCRIPTORS).clamp(64, 1 << 20)
        );
        let explicit = ServingOptions {
            max_connections: 7,
            ..Default::default()
        };
        assert_eq!(explicit.connection_limit(), 7);
    }

    use rustls::pki_types::pem::PemObject;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A server whose `/stream` answers a body that never ends and everything else `ok`.
    async fn start(dir: &std::path::Path) -> (Serving, SocketAddr, Arc<rustls::ClientConfig>) {
        let pki = crate::pki::load_or_create(dir, &[]).unwrap();
        let router = axum::Router::new()
            .route(
                "/stream",
                axum::routing::get(|| async {
                    let chunks = futures::stream::once(async { Ok::<_, std::io::Error>(Bytes::from_static(b"first")) })
                        .chain(futures::stream::pending());
                    Body::from_stream(chunks)
                }),
            )
            .fallback(|| async { "ok" });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let serving = Serving::start(
            listener,
            crate::tls::server_config(&pki).unwrap(),
            router,
            &ServingOptions::default(),
        );
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(rustls::pki_types::CertificateDer::from_pem_slice(pki.ca_cert_pem.as_bytes()).unwrap())
            .unwrap();
        let mut client =
            rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth();
        client.alpn_protocols = vec![b"http/1.1".to_vec()];
        (serving, addr, Arc::new(client))
    }

    async fn connect(
        addr: SocketAddr,
        config: &Arc<rustls::ClientConfig>,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        tokio_rustls::TlsConnector::from(config.clone())
            .connect(name, tcp)
            .await
    }

    /// Reads until `needle` has come, or the connection ends; what was read.
    async fn read_until<S: tokio::io::AsyncRead + Unpin>(stream: &mut S, needle: &str) -> String {
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        loop {
            match tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => break,
                Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
                Err(_) => panic!("nothing more within 10 s: {}", String::from_utf8_lossy(&got)),
            }
            if String::from_utf8_lossy(&got).contains(needle) {
                break;
            }
        }
        String::from_utf8_lossy(&got).into_owned()
    }

    use futures::StreamExt;

    #[tokio::test]
    async fn shutdown_stops_accepting_then_closes_what_is_open() {
        let dir = tempfile::tempdir().unwrap();
        let (serving, addr, client) = start(dir.path()).await;
        // An idle keep-alive connection and a streamed response.
        let mut idle = connect(addr, &client).await.unwrap();
        idle.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        assert!(read_until(&mut idle, "ok").await.ends_with("ok"));
        let mut stream = connect(addr, &client).await.unwrap();
        stream
            .write_all(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        assert!(read_until(&mut stream, "first").await.contains("first"));
        assert_eq!(serving.open_connections(), 2);

        serving.stop_accepting();
        // The listener is closed.
        let refused = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                if tokio::net::TcpStream::connect(addr).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        assert!(refused.is_ok(), "still accepting");
        // The idle connection is closed; the stream goes on.
        assert_eq!(read_until(&mut idle, "never").await, "");
        let mut buf = [0u8; 16];
        let more = tokio::time::timeout(Duration::from_millis(200), stream.read(&mut buf)).await;
        assert!(more.is_err(), "the streamed response ended early: {more:?}");
        // Closing ends it.
        serving.close();
        let ended = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf)).await;
        assert!(matches!(ended, Ok(Ok(0)) | Ok(Err(_))), "{ended:?}");
        let drained = tokio::time::timeout(Duration::from_secs(10), async {
            while serving.open_connections() > 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        assert!(drained.is_ok());
    }
}
