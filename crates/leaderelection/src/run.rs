//! Running components only while their Lease is held.

use std::future::Future;

use anyhow::Context;

use crate::{Fence, Fenced, LeaderElector};

/// One term of leadership, as its components see it: the fence their clients check, and the
/// runtime their requests are served on.
#[derive(Clone)]
pub struct Term {
    fence: Fence,
    server: tokio::runtime::Handle,
}

impl Term {
    /// A term gated by `fence`, whose clients' requests are served on `server`.
    pub fn new(fence: Fence, server: tokio::runtime::Handle) -> Term {
        Term { fence, server }
    }

    pub fn fence(&self) -> &Fence {
        &self.fence
    }

    /// A client over `service` (an in-process API server's) whose writes this term's fence
    /// gates.
    pub fn client<S, B>(&self, service: S) -> kube::Client
    where
        S: tower::Service<http::Request<kube::client::Body>, Response = http::Response<B>> + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
        B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        kube::Client::new(Fenced::new(service, self.fence.clone(), self.server.clone()), "default")
    }
}

/// How a term ended.
enum End {
    Cancelled,
    Lost,
    Exited(anyhow::Result<()>),
}

/// Campaign for `elector`'s Lease until `cancel` completes, and while it is held run the
/// components `lead` makes for the term: upstream's `RunOrDie` with `ReleaseOnCancel`, where
/// losing the Lease does not end the process but stops the components and campaigns again.
///
/// Each term's components run on a runtime of their own (`worker_threads` threads named after
/// the Lease), built when the Lease is won and dropped, with every task they spawned, when it is
/// lost: the next term starts them from nothing. Their clients ([`Term::client`]) refuse writes
/// from the moment the fence closes, before the runtime is gone.
///
/// On `cancel` the components are stopped and then the Lease released. If the components end on
/// their own, the Lease is released and their result returned (an error because the fence closed
/// counts as a loss).
pub async fn run<F, Fut>(
    mut elector: LeaderElector,
    worker_threads: usize,
    cancel: impl Future<Output = ()>,
    mut lead: F,
) -> anyhow::Result<()>
where
    F: FnMut(Term) -> Fut,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let server = tokio::runtime::Handle::current();
    let lease = elector.describe();
    let mut cancel = std::pin::pin!(cancel);
    loop {
        let fence = tokio::select! {
            _ = &mut cancel => {
                // An attempt cut short may have written the record as ours.
                elector.release().await;
                return Ok(());
            }
            fence = elector.acquire() => fence,
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(worker_threads.max(1))
            .thread_name(lease.rsplit('/').next().unwrap_or("leader"))
            .enable_all()
            .build()
            .context("starting the runtime of the leader's components")?;
        let term = Term::new(fence.clone(), server.clone());
        let mut components = {
            // Whatever `lead` spawns before its future runs belongs to the term too.
            let _entered = runtime.enter();
            runtime.spawn(lead(term))
        };
        tracing::info!(%lease, "started leading");
        let end = tokio::select! {
            _ = &mut cancel => End::Cancelled,
            _ = elector.renew(&fence) => End::Lost,
            ended = &mut components => {
                let result = ended.context("the leader's components panicked").and_then(|r| r);
                if fence.holds() {
                    End::Exited(result)
                } else {
                    elector.lost();
                    End::Lost
                }
            }
        };
        fence.revoke();
        components.abort();
        runtime.shutdown_background();
        match end {
            End::Lost => tracing::warn!(%lease, "leader election lost: the components stopped; campaigning again"),
            End::Cancelled => {
                elector.release().await;
                return Ok(());
            }
            End::Exited(result) => {
                elector.release().await;
                return result;
            }
        }
    }
}
