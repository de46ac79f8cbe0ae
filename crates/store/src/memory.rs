//! A store without disk, for tests and simulations.
//!
//! Same semantics as the sqlite backend. History lives only in the event
//! window: when old events fall out of it, they count as compacted.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use futures::stream::BoxStream;

use crate::state::{self, Limits, ListPlan, Op, State};
use crate::{Event, KeyValue, ListOptions, ListResult, Result, Revision, Store, StoreError};

/// Events of history a [`MemoryStore`] keeps by default.
pub const DEFAULT_HISTORY: usize = 1_000_000;

/// Sizes of a [`MemoryStore`].
#[derive(Clone, Copy, Debug)]
pub struct MemoryOptions {
    /// Events of history kept; older ones are compacted automatically.
    pub history: usize,
    /// Live events buffered per watcher before a slow watcher is dropped.
    pub watch_buffer: usize,
}

impl Default for MemoryOptions {
    fn default() -> Self {
        MemoryOptions {
            history: DEFAULT_HISTORY,
            watch_buffer: state::DEFAULT_WATCH_BUFFER,
        }
    }
}

pub struct MemoryStore {
    state: State,
}

impl MemoryStore {
    pub fn new() -> Arc<MemoryStore> {
        Self::with_options(MemoryOptions::default())
    }

    pub fn with_options(opts: MemoryOptions) -> Arc<MemoryStore> {
        let limits = Limits {
            event_window_bytes: usize::MAX,
            event_window: opts.history.max(1),
            watch_buffer: opts.watch_buffer,
            compact_with_window: true,
        };
        Arc::new(MemoryStore {
            state: State::new(BTreeMap::new(), 0, 0, limits),
        })
    }

    fn write(&self, op: Op) -> Result<KeyValue> {
        let mut inner = self.state.write();
        let revision = inner.revision() + 1;
        let (event, kv) = state::plan(inner.get(op.key()), op, revision)?;
        inner.apply(vec![event]);
        Ok(kv)
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn create(&self, key: &str, value: Vec<u8>) -> Result<KeyValue> {
        self.write(Op::Create {
            key: key.to_owned(),
            value,
        })
    }

    async fn update(&self, key: &str, value: Vec<u8>, expected: Revision) -> Result<KeyValue> {
        self.write(Op::Update {
            key: key.to_owned(),
            value,
            expected,
        })
    }

    async fn delete(&self, key: &str, expected: Option<Revision>) -> Result<KeyValue> {
        self.write(Op::Delete {
            key: key.to_owned(),
            expected,
        })
    }

    async fn txn(&self, ops: Vec<Op>) -> Result<Vec<KeyValue>> {
        let mut inner = self.state.write();
        let planned = state::plan_txn(|k| inner.get(k), ops, inner.revision() + 1)?;
        let (events, kvs) = planned.into_iter().unzip();
        inner.apply(events);
        Ok(kvs)
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        Ok(self.state.read().get(key).cloned())
    }

    async fn list(&self, prefix: &str, opts: ListOptions) -> Result<ListResult> {
        match self.state.read().list(prefix, &opts)? {
            ListPlan::Done(result) => Ok(result),
            // The window floor never passes the compaction point here.
            ListPlan::Disk(revision) => Err(StoreError::Compacted {
                requested: revision,
                compacted: self.state.read().compacted(),
            }),
        }
    }

    async fn watch(&self, prefix: &str, after: Revision) -> Result<BoxStream<'static, Event>> {
        let sub = self.state.write().subscribe(prefix, after)?;
        if let Some((from, _)) = sub.disk {
            return Err(StoreError::Compacted {
                requested: from,
                compacted: self.state.read().compacted(),
            });
        }
        Ok(sub.into_stream(Vec::new()))
    }

    async fn current_revision(&self) -> Result<Revision> {
        Ok(self.state.read().revision())
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        let dropped = {
            let mut inner = self.state.write();
            if revision > inner.revision() {
                return Err(StoreError::FutureRevision(revision));
            }
            inner.set_compacted(revision)
        };
        if dropped > 0 {
            crate::release_memory();
        }
        Ok(())
    }

    async fn compacted_revision(&self) -> Result<Revision> {
        Ok(self.state.read().compacted())
    }

    /// Without disk, compaction already drops the old events from memory, the only copy.
    async fn erase_history(&self, revision: Revision) -> Result<()> {
        self.compact(revision).await
    }

    async fn health(&self) -> Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance;

    fn fresh() -> (Arc<dyn Store>, ()) {
        (MemoryStore::new(), ())
    }

    conformance::suite!(fresh());

    #[tokio::test]
    async fn history_beyond_the_window_counts_as_compacted() {
        let store = MemoryStore::with_options(MemoryOptions {
            history: 3,
            watch_buffer: 16,
        });
        for i in 0..6 {
            store.create(&format!("/k/{i}"), b"{}".to_vec()).await.unwrap();
        }
        assert_eq!(store.compacted_revision().await.unwrap(), 3);
        assert!(matches!(
            store.watch("/k/", 2).await.err(),
            Some(StoreError::Compacted {
                requested: 2,
                compacted: 3
            })
        ));
        let old = store
            .list(
                "/k/",
                ListOptions {
                    revision: Some(4),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        let keys: Vec<_> = old.items.iter().map(|kv| kv.key.as_str()).collect();
        assert_eq!(keys, ["/k/0", "/k/1", "/k/2", "/k/3"]);
    }
}
