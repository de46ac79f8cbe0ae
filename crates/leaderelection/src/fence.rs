//! The fence of a term: whether this process still knows itself the holder, by its monotonic
//! clock, and the client wrapper that refuses writes once it does not.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll};
use std::time::Instant;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The monotonic clock's origin for fences (instants are kept as nanoseconds since it, in an
/// atomic that writes read without a lock).
static ORIGIN: LazyLock<Instant> = LazyLock::new(Instant::now);

fn nanos(at: Instant) -> u64 {
    u64::try_from(at.saturating_duration_since(*ORIGIN).as_nanos()).unwrap_or(u64::MAX)
}

/// Whether the holder of one term may still write: open until an instant the elector moves on
/// with every successful renewal (its start plus the renew deadline), closed for good once the
/// term ends. Clones share the state.
#[derive(Clone, Debug)]
pub struct Fence(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    /// Nanoseconds since [`ORIGIN`] up to which writes pass; 0 once the term ended.
    until: AtomicU64,
    /// `namespace/name` of the Lease, for the error.
    lease: String,
}

/// A write refused because the term it belongs to no longer holds its Lease.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[error("leader election lost (lease {lease} not renewed within the renew deadline): write refused")]
pub struct FenceError {
    pub lease: String,
}

impl Fence {
    /// A fence for `lease` (`namespace/name`), open until `until`.
    pub fn new(lease: impl Into<String>, until: Instant) -> Fence {
        LazyLock::force(&ORIGIN);
        Fence(Arc::new(Inner {
            until: AtomicU64::new(nanos(until).max(1)),
            lease: lease.into(),
        }))
    }

    /// Whether writes pass now. One atomic load and one read of the monotonic clock.
    pub fn holds(&self) -> bool {
        nanos(Instant::now()) < self.0.until.load(Ordering::Acquire)
    }

    /// `Ok` while the fence holds, else the error a refused write gets.
    pub fn check(&self) -> Result<(), FenceError> {
        if self.holds() {
            Ok(())
        } else {
            Err(FenceError {
                lease: self.0.lease.clone(),
            })
        }
    }

    /// Keep writes passing until `until` (a renewal), unless the term has ended.
    pub(crate) fn extend(&self, until: Instant) {
        let until = nanos(until).max(1);
        let _ = self
            .0
            .until
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| (now != 0).then_some(until));
    }

    /// End the term: no write passes again, whatever the clock says.
    pub fn revoke(&self) {
        self.0.until.store(0, Ordering::Release);
    }

    pub fn lease(&self) -> &str {
        &self.0.lease
    }
}

/// Methods that change nothing: everything else is a write.
fn is_read(method: &http::Method) -> bool {
    matches!(*method, http::Method::GET | http::Method::HEAD | http::Method::OPTIONS)
}

/// A client service gated by a [`Fence`]: a write while the fence does not hold fails with
/// [`FenceError`] and never reaches `inner`. Calls that pass are served by a task on `server`,
/// the runtime of the process's API server, so nothing a call starts belongs to the term's
/// runtime (which is dropped, with its tasks, when the term ends).
#[derive(Clone)]
pub struct Fenced<S> {
    inner: S,
    fence: Fence,
    server: tokio::runtime::Handle,
}

impl<S> Fenced<S> {
    pub fn new(inner: S, fence: Fence, server: tokio::runtime::Handle) -> Self {
        Fenced { inner, fence, server }
    }
}

impl<S, B> tower::Service<http::Request<B>> for Fenced<S>
where
    S: tower::Service<http::Request<B>>,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Into<BoxError> + Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if !is_read(req.method())
            && let Err(e) = self.fence.check()
        {
            tracing::debug!(method = %req.method(), uri = %req.uri(), "{e}");
            return Box::pin(std::future::ready(Err(Box::new(e) as BoxError)));
        }
        // A write is checked again when its handling starts: the task may run later than this
        // call (a busy runtime, a pause in between).
        let write = (!is_read(req.method())).then(|| self.fence.clone());
        let call = self.inner.call(req);
        let served = self.server.spawn(async move {
            if let Some(fence) = write {
                fence.check()?;
            }
            call.await.map_err(Into::into)
        });
        Box::pin(async move {
            match served.await {
                Ok(answer) => answer,
                Err(e) => Err(Box::new(e) as BoxError),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_fence_holds_until_its_instant_moves_with_renewals_and_never_reopens_once_revoked() {
        let fence = Fence::new("kube-system/x", Instant::now() + Duration::from_millis(50));
        assert!(fence.holds());
        std::thread::sleep(Duration::from_millis(60));
        assert!(!fence.holds());
        assert_eq!(
            fence.check(),
            Err(FenceError {
                lease: "kube-system/x".into()
            })
        );
        fence.extend(Instant::now() + Duration::from_secs(5));
        assert!(fence.holds());
        fence.revoke();
        assert!(!fence.holds());
        fence.extend(Instant::now() + Duration::from_secs(5));
        assert!(!fence.holds(), "a revoked fence stays closed");
    }
}
