//! The node's client certificate kept valid, as client-go's certificate manager
//! (`util/certificate/certificate_manager.go`) runs it for the kubelet: at a random point
//! between 70% and 90% of the certificate's lifetime, a new key and a certificate request
//! posted with the current certificate (the approver approves a node's own renewal through
//! `selfnodeclient`), then the new certificate saved and put to use.
//!
//! Every client the agent holds calls through one [`RotatingClient`]: requests after a
//! rotation go out on connections authenticated with the new certificate; requests already
//! running (watches) finish on theirs, which the API server authenticated when they were made.
//! Nothing restarts, and the pods' containers are not touched.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use http::{Request, Response};
use kube::client::Body;
use parking_lot::RwLock;

use crate::bootstrap::{self, Identity, Paths};

/// A tower service that sends each request through the current client.
#[derive(Clone)]
pub struct RotatingClient {
    current: Arc<RwLock<kube::Client>>,
}

impl RotatingClient {
    pub fn new(client: kube::Client) -> RotatingClient {
        RotatingClient {
            current: Arc::new(RwLock::new(client)),
        }
    }

    /// From now on, requests go through `client`.
    pub fn replace(&self, client: kube::Client) {
        *self.current.write() = client;
    }

    /// A `kube::Client` over this service.
    pub fn client(&self) -> kube::Client {
        kube::Client::new(self.clone(), "default")
    }
}

impl tower::Service<Request<Body>> for RotatingClient {
    type Response = Response<Body>;
    type Error = kube::Error;
    type Future = BoxFuture<'static, Result<Response<Body>, kube::Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let client = self.current.read().clone();
        Box::pin(async move { client.send(req).await })
    }
}

/// When to renew a certificate valid from `not_before` to `not_after` (Unix seconds): at a
/// random 70% to 90% of its lifetime (upstream's `nextRotationDeadline`).
pub fn rotation_deadline(not_before: i64, not_after: i64, jitter: f64) -> i64 {
    let total = (not_after - not_before).max(0) as f64;
    not_before + (total * (0.7 + 0.2 * jitter.clamp(0.0, 1.0))).round() as i64
}

/// Renews `identity`'s certificate for ever, swapping each new one into `client`.
pub async fn run(mut identity: Identity, paths: Paths, client: RotatingClient) {
    let mut backoff = Duration::from_secs(2);
    loop {
        let (start, end) = match bootstrap::validity(&identity.cert_pem) {
            Ok(v) => v,
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "reading the node certificate; not rotating it");
                return;
            }
        };
        let deadline = rotation_deadline(start, end, rand::random::<f64>());
        let now = jiff::Timestamp::now().as_second();
        let wait = Duration::from_secs(u64::try_from(deadline - now).unwrap_or(0));
        tracing::info!(
            expires = %jiff::Timestamp::from_second(end).map(|t| t.to_string()).unwrap_or_default(),
            rotate_in = ?wait,
            "node certificate rotation scheduled"
        );
        tokio::time::sleep(wait).await;
        match rotate(&identity, &client).await {
            Ok(next) => {
                if let Err(e) = next.save(&paths) {
                    tracing::warn!(error = %format!("{e:#}"), "saving the renewed node certificate");
                }
                match next.client().await {
                    Ok(c) => client.replace(c),
                    Err(e) => tracing::warn!(error = %format!("{e:#}"), "a client with the renewed certificate"),
                }
                tracing::info!("node certificate renewed");
                identity = next;
                backoff = Duration::from_secs(2);
            }
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), retry_in = ?backoff, "renewing the node certificate");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(120));
            }
        }
    }
}

async fn rotate(identity: &Identity, client: &RotatingClient) -> anyhow::Result<Identity> {
    let (cert_pem, key_pem) = bootstrap::request_certificate(&client.client(), &identity.node_name, false).await?;
    Ok(Identity {
        cert_pem,
        key_pem,
        ..identity.clone()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_fall_between_70_and_90_percent() {
        assert_eq!(rotation_deadline(0, 1000, 0.0), 700);
        assert_eq!(rotation_deadline(0, 1000, 1.0), 900);
        assert_eq!(rotation_deadline(100, 1100, 0.5), 900);
        assert_eq!(rotation_deadline(100, 50, 0.5), 100);
    }
}
