//! When the API server's own reconcilers (APIService registration and availability, the flow
//! control configuration and its conditions) run a pass: at once, then after every change under
//! their prefixes (events already queued fold into one pass) and every `period`; a watch that
//! ends is set up again from a fresh revision, and a pass follows.

use std::sync::Arc;
use std::time::Duration;

use futures::stream::{BoxStream, SelectAll};
use futures::{FutureExt, StreamExt};
use skiff_store::{Event, Store};

pub struct Triggers {
    store: Arc<dyn Store>,
    prefixes: Vec<String>,
    period: Duration,
    /// Names the work in logs.
    what: &'static str,
    events: Option<SelectAll<BoxStream<'static, Event>>>,
}

impl Triggers {
    pub fn new(store: Arc<dyn Store>, prefixes: Vec<String>, period: Duration, what: &'static str) -> Triggers {
        Triggers {
            store,
            prefixes,
            period,
            what,
            events: None,
        }
    }

    /// Returns when the next pass is due.
    pub async fn next(&mut self) {
        let what = self.what;
        loop {
            let Some(events) = &mut self.events else {
                self.events = self.watch().await;
                if self.events.is_some() {
                    return;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            };
            match tokio::time::timeout(self.period, events.next()).await {
                Err(_) => return,
                Ok(None) => {
                    tracing::debug!(what, "a watch ended; watching again");
                    self.events = None;
                }
                Ok(Some(_)) => {
                    // One pass covers every event already here.
                    loop {
                        match events.next().now_or_never() {
                            Some(Some(_)) => {}
                            Some(None) => {
                                self.events = None;
                                break;
                            }
                            None => break,
                        }
                    }
                    return;
                }
            }
        }
    }

    /// Watches every prefix from the current revision (none if any of it fails). `&mut`: the
    /// streams are not `Sync`, so the borrow held across the awaits must be unique.
    async fn watch(&mut self) -> Option<SelectAll<BoxStream<'static, Event>>> {
        let what = self.what;
        let from = match self.store.current_revision().await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, what, "reading the store's revision failed");
                return None;
            }
        };
        let mut watches = Vec::with_capacity(self.prefixes.len());
        for p in &self.prefixes {
            match self.store.watch(p, from).await {
                Ok(w) => watches.push(w),
                Err(e) => {
                    tracing::warn!(error = %e, what, prefix = %p, "watching failed");
                    return None;
                }
            }
        }
        Some(futures::stream::select_all(watches))
    }
}
