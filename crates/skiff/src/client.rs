//! API clients built from a kubeconfig.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use anyhow::Context as _;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use skiff_apiserver::coalesce::{Coalesce, PolledExecutor};

pub async fn kube_config(kubeconfig: &std::path::Path) -> anyhow::Result<kube::Config> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("reading kubeconfig {}", kubeconfig.display()))?;
    kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .context("loading kubeconfig")
}

pub async fn kube_client(kubeconfig: &std::path::Path) -> anyhow::Result<kube::Client> {
    kube::Client::try_from(kube_config(kubeconfig).await?).context("building the API client")
}

/// A client speaking HTTP/2 over one connection, as client-go does against an API server: the
/// requests of many tasks share TLS records and system calls instead of taking one connection
/// each. What the connection writes in one poll of its task goes out in one write (see
/// `skiff_apiserver::coalesce`). For the components that only make API calls (scheduler,
/// benchmarks); streams that upgrade the connection (exec, attach, port-forward) need HTTP/1.1.
pub async fn kube_client_h2(kubeconfig: &std::path::Path) -> anyhow::Result<kube::Client> {
    use kube::client::ConfigExt;
    let config = kube_config(kubeconfig).await?;
    // The connector offers h2 by ALPN itself.
    let tls = config
        .rustls_client_config()
        .context("building the TLS configuration")?;
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http2()
        .wrap_connector(http);
    let connector = tower::ServiceBuilder::new().map_response(Coalesced::new).service(https);
    // The connection tasks hyper spawns are `Polled`, so that their streams can tell one poll
    // from the next.
    let hyper_client = hyper_util::client::legacy::Client::builder(PolledExecutor)
        .http2_only(true)
        .timer(hyper_util::rt::TokioTimer::new())
        .http2_keep_alive_interval(std::time::Duration::from_secs(30))
        .build(connector);
    let service = tower::ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer().context("building the client's authentication")?)
        .map_err(|e: hyper_util::client::legacy::Error| -> Box<dyn std::error::Error + Send + Sync> { Box::new(e) })
        .service(hyper_client);
    Ok(kube::Client::new(service, config.default_namespace))
}

/// A connector's stream whose writes are held until the next poll of the connection task.
struct Coalesced<T>(TokioIo<Coalesce<TokioIo<T>>>);

impl<T> Coalesced<T> {
    fn new(stream: T) -> Self {
        Coalesced(TokioIo::new(Coalesce::new(TokioIo::new(stream))))
    }
}

impl<T: Connection> Connection for Coalesced<T> {
    fn connected(&self) -> Connected {
        self.0.inner().get_ref().inner().connected()
    }
}

impl<T> hyper::rt::Read for Coalesced<T>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin,
{
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<T> hyper::rt::Write for Coalesced<T>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin,
{
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}
