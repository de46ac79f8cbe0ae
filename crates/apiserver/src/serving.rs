//! Serving HTTPS connections, as upstream's `SecureServingInfo.Serve` (`secure_serving.go`) and
//! Go's `http.Server` with kube-apiserver's settings: 1 MiB of request headers at most (431
//! beyond, HTTP/1.1 and HTTP/2 alike), headers read within `--header-read-timeout` (32 s, Go's
//! `ReadHeaderTimeout`), a connection without a request for 90 s closed (`IdleTimeout`), TCP
//! keep-alive every 3 minutes as upstream's listener sets it, and HTTP/2 PINGs so a connection
//! whose peer is gone is dropped.
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
    connections: Arc<Semaphore>,
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
        let connections = Arc::new(Semaphore::new(limit));
        let (phase, _) = watch::channel(Phase::Serving);
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        tokio::spawn(accept(
            listener,
            acceptor,
            router,
            opts.clone(),
            phase.subscribe(),
            connections.clone(),
        ));
        Serving {
            phase,
            connections,
            limit,
        }
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
        self.limit - self.connections.available_permits()
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
        tokio::spawn(async move {
            let _permit = permit;
            connection(tcp, peer, acceptor, router, opts, phase).await;
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
            let response = match router.oneshot(req.map(Body::new)).await {
                Ok(r) => r,
                Err(never) => match never {},
            };
            Ok::<_, Infallible>(response.map(|inner| Body::new(Tracked { inner, _active: active })))
        }
    });
    let mut builder = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
    builder
        .http1()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(opts.header_read_timeout)
        // Go allows MaxHeaderBytes plus 4 KiB of slack.
        .max_buf_size(MAX_HEADER_BYTES + 4096);
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
}
