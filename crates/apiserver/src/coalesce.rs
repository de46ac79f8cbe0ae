//! Fewer, larger writes on an HTTP/2 connection.
//!
//! h2 flushes its connection after every large DATA frame, and the TLS stream turns each
//! flush into a TLS record and a `writev` of its own: a client watching pods and creating
//! them over one connection costs the server one system call (and the client one wake-up)
//! per response and per watch event. [`Coalesce`] holds what h2 writes until the connection
//! task's next poll: everything the connection produces in one poll and the next goes out
//! in one write.
//!
//! The task driving the connection is wrapped in [`Polled`], which numbers each of its polls
//! (a thread-local holds the number while the poll runs). The first flush that finds data
//! held asks for one more poll (waking the task) and reports success; a flush in a later poll
//! writes everything out. A poll always ends in a flush (h2 flushes whenever it has nothing
//! more to do), so held data waits at most one poll of the task. A stream driven outside any
//! [`Polled`] future writes out at every flush, as if it were not wrapped.
//!
//! Only for connections one task drives: an HTTP/1.1 connection may be upgraded and its
//! stream handed to another task, whose polls would not be told apart from the first's.

use std::cell::Cell;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, ready};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Held bytes beyond which a flush writes at once.
const FLUSH_AT: usize = 64 * 1024;

/// Numbers polls of [`Polled`] futures; 0 means "not inside one".
static NEXT_POLL: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// The number of the [`Polled`] poll running on this thread, or 0.
    static CURRENT_POLL: Cell<u64> = const { Cell::new(0) };
}

/// A future whose polls [`Coalesce`] streams can tell apart.
pub struct Polled<F> {
    inner: Pin<Box<F>>,
}

impl<F: Future> Polled<F> {
    pub fn new(inner: F) -> Self {
        Polled { inner: Box::pin(inner) }
    }
}

impl<F: Future> Future for Polled<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let id = NEXT_POLL.fetch_add(1, Ordering::Relaxed);
        let outer = CURRENT_POLL.replace(id);
        let result = self.inner.as_mut().poll(cx);
        CURRENT_POLL.set(outer);
        result
    }
}

/// Spawns futures as [`Polled`] tasks: an executor for hyper's client, whose connection
/// tasks it spawns itself.
#[derive(Clone, Copy, Debug, Default)]
pub struct PolledExecutor;

impl<F> hyper::rt::Executor<F> for PolledExecutor
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, fut: F) {
        tokio::spawn(Polled::new(fut));
    }
}

/// A stream that holds writes until the next poll of the [`Polled`] task driving it.
pub struct Coalesce<S> {
    inner: S,
    held: BytesMut,
    /// The poll in which a flush last found data held and put it off.
    deferred_in: Option<u64>,
}

impl<S> Coalesce<S> {
    /// Wraps `stream`; writes are held only while a [`Polled`] task drives it.
    pub fn new(stream: S) -> Self {
        Coalesce {
            inner: stream,
            held: BytesMut::new(),
            deferred_in: None,
        }
    }

    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: AsyncWrite + Unpin> Coalesce<S> {
    /// Writes out everything held.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.held.is_empty() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.held))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.held.advance(n);
        }
        self.deferred_in = None;
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Coalesce<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Coalesce<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[io::IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.held.len() >= FLUSH_AT {
            ready!(self.poll_drain(cx))?;
        }
        let mut n = 0;
        for b in bufs {
            self.held.extend_from_slice(b);
            n += b.len();
        }
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let now = CURRENT_POLL.get();
        if now != 0 && !self.held.is_empty() && self.held.len() < FLUSH_AT {
            match self.deferred_in {
                None => {
                    // Put off to the next poll, which this wake guarantees.
                    self.deferred_in = Some(now);
                    cx.waker().wake_by_ref();
                    return Poll::Ready(Ok(()));
                }
                Some(poll) if poll == now => return Poll::Ready(Ok(())),
                Some(_) => {}
            }
        }
        ready!(self.poll_drain(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_drain(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Bytes the peer can read without waiting.
    fn readable(peer: &mut tokio::io::DuplexStream) -> Vec<u8> {
        use futures::FutureExt;
        let mut out = vec![0u8; 1024];
        match peer.read(&mut out).now_or_never() {
            Some(Ok(n)) => out[..n].to_vec(),
            _ => Vec::new(),
        }
    }

    #[tokio::test]
    async fn a_flush_writes_out_at_the_next_poll() {
        let (ours, peer) = tokio::io::duplex(1 << 20);
        let mut stream = Coalesce::new(ours);
        let (mut stream, mut peer) = Polled::new(async move {
            let mut peer = peer;
            stream.write_all(b"one ").await.unwrap();
            stream.flush().await.unwrap();
            stream.write_all(b"two").await.unwrap();
            stream.flush().await.unwrap();
            // Still the same poll: both writes are held.
            assert_eq!(readable(&mut peer), b"");
            tokio::task::yield_now().await;
            stream.flush().await.unwrap();
            assert_eq!(readable(&mut peer), b"one two");
            (stream, peer)
        })
        .await;
        // Large writes go out without waiting for a poll.
        stream.write_all(&vec![7u8; FLUSH_AT + 1]).await.unwrap();
        stream.flush().await.unwrap();
        let mut got = vec![0u8; FLUSH_AT + 1];
        peer.read_exact(&mut got).await.unwrap();
        assert!(got.iter().all(|b| *b == 7));
        // Shutting down writes out what is held.
        stream.write_all(b"end").await.unwrap();
        stream.shutdown().await.unwrap();
        let mut rest = Vec::new();
        peer.read_to_end(&mut rest).await.unwrap();
        assert_eq!(rest, b"end");
    }

    #[tokio::test]
    async fn outside_a_polled_task_a_flush_writes_out() {
        let (ours, mut peer) = tokio::io::duplex(1 << 20);
        let mut stream = Coalesce::new(ours);
        stream.write_all(b"now").await.unwrap();
        stream.flush().await.unwrap();
        assert_eq!(readable(&mut peer), b"now");
    }

    #[tokio::test]
    async fn a_polled_future_inside_another_keeps_its_own_polls() {
        let (ours, mut peer) = tokio::io::duplex(1 << 20);
        let mut stream = Coalesce::new(ours);
        Polled::new(async move {
            stream.write_all(b"held").await.unwrap();
            stream.flush().await.unwrap();
            // A nested Polled future's poll is one of its own; when it returns, the outer
            // poll goes on as the same poll.
            Polled::new(async {}).await;
            stream.flush().await.unwrap();
            assert_eq!(readable(&mut peer), b"");
            tokio::task::yield_now().await;
            stream.flush().await.unwrap();
            assert_eq!(readable(&mut peer), b"held");
        })
        .await;
    }
}
