//! Revisioned key-value storage with etcd's semantics.
//!
//! One global, strictly increasing revision numbers every write; an object's
//! `resourceVersion` is the revision of the write that last changed it. The API
//! server is the only user of this crate: every other component talks to the API.
//!
//! Backends implement [`Store`]: [`SqliteStore`] (default, durable, group
//! commit), [`EtcdStore`] (scale-out: several API servers on one etcd) and
//! [`MemoryStore`] (tests, simulations). All keep the latest value
//! of every key and a window of recent events in memory (`state`), so reads at
//! the current revision and recent watches never touch disk.
//! `bench::bench_creates` (test builds only) measures a backend's write throughput and latency
//! for the ignored benchmark tests of each backend.

use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use futures::stream::BoxStream;

#[cfg(test)]
mod bench;
#[cfg(test)]
mod conformance;
pub mod etcd;
pub mod memory;
pub mod sqlite;
mod state;

pub use etcd::{EtcdOptions, EtcdStore};
pub use memory::{MemoryOptions, MemoryStore};
pub use sqlite::{SqliteOptions, SqliteStore};
pub use state::Op;

pub type Revision = i64;

static RELEASE_MEMORY: OnceLock<fn()> = OnceLock::new();

/// Sets what a store calls after a compaction has dropped events from memory, on the thread
/// that dropped them and outside the store's lock: the binary that chose the allocator can give
/// the freed pages back to the OS there. An allocator keeps freed pages for reuse and returns
/// them only as later allocations pass by, so a server left idle after a burst of writes would
/// hold the burst's memory until its next one. The first call wins.
pub fn set_release_memory(release: fn()) {
    let _ = RELEASE_MEMORY.set(release);
}

/// Runs the hook of [`set_release_memory`], if any.
pub(crate) fn release_memory() {
    if let Some(release) = RELEASE_MEMORY.get() {
        release();
    }
}

/// One stored value at one revision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    /// The serialized object (JSON bytes). Shared: lists hand out clones cheaply.
    pub value: Arc<[u8]>,
    /// Revision of the write that created the key (etcd's create_revision).
    pub create_revision: Revision,
    /// Revision of the write that last changed the key (etcd's mod_revision).
    pub mod_revision: Revision,
}

/// A change seen by a watcher. `revision` is the revision of the change itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// Created (`prev` is `None`) or updated (`prev` is the value before).
    Put { kv: KeyValue, prev: Option<KeyValue> },
    /// Deleted: `prev` is the last value; `revision` is the delete's revision.
    Delete { prev: KeyValue, revision: Revision },
}

impl Event {
    pub fn revision(&self) -> Revision {
        match self {
            Event::Put { kv, .. } => kv.mod_revision,
            Event::Delete { revision, .. } => *revision,
        }
    }
    pub fn key(&self) -> &str {
        match self {
            Event::Put { kv, .. } => &kv.key,
            Event::Delete { prev, .. } => &prev.key,
        }
    }
}

/// Errors a caller branches on (the API server maps them to Status reasons).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("key {0} already exists")]
    AlreadyExists(String),
    #[error("key {0} not found")]
    NotFound(String),
    /// Compare-on-revision failed: the key's current mod_revision differs.
    #[error("key {key} was modified: expected revision {expected}, found {actual}")]
    Conflict {
        key: String,
        expected: Revision,
        actual: Revision,
    },
    /// The requested revision has been compacted away.
    #[error("required revision {requested} has been compacted (oldest available {compacted})")]
    Compacted { requested: Revision, compacted: Revision },
    /// The requested revision is in the future.
    #[error("required revision {0} is a future revision")]
    FutureRevision(Revision),
    #[error("storage backend: {0}")]
    Backend(#[from] anyhow::Error),
}

pub type Result<T> = std::result::Result<T, StoreError>;

/// A page of a list.
#[derive(Clone, Debug, Default)]
pub struct ListResult {
    /// Items in key order.
    pub items: Vec<KeyValue>,
    /// The revision the list was taken at.
    pub revision: Revision,
    /// True when more keys under the prefix follow the last item.
    pub more: bool,
}

/// Options of a list.
#[derive(Clone, Debug, Default)]
pub struct ListOptions {
    /// Only keys strictly greater than this (pagination).
    pub start_after: Option<String>,
    /// 0 means no limit.
    pub limit: usize,
    /// List as of this revision (None: the current one).
    pub revision: Option<Revision>,
}

#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Create `key`; fails with `AlreadyExists`. Returns the stored value.
    /// Returns only once the write is durable.
    async fn create(&self, key: &str, value: Vec<u8>) -> Result<KeyValue>;

    /// Replace `key` if its mod_revision equals `expected` (`Conflict` otherwise,
    /// `NotFound` if absent). Durable when it returns.
    async fn update(&self, key: &str, value: Vec<u8>, expected: Revision) -> Result<KeyValue>;

    /// Delete `key`, if `expected` is given only at that mod_revision.
    /// Returns the deleted value with `mod_revision` set to the delete's revision.
    async fn delete(&self, key: &str, expected: Option<Revision>) -> Result<KeyValue>;

    /// All of `ops` or none (etcd's `Txn` with a compare per op): each is checked as its own
    /// write would be. Fails with the error of the first op that does not hold, and then nothing
    /// is written. Durable when it returns.
    ///
    /// The writes get revisions after every earlier write and before every later one, in op
    /// order but not necessarily distinct: etcd gives all of them the transaction's one revision,
    /// SQLite and memory consecutive ones. Callers write a key at most once per transaction
    /// (etcd refuses more; the other backends let a later op see an earlier one).
    async fn txn(&self, ops: Vec<Op>) -> Result<Vec<KeyValue>>;

    /// The current value of `key`.
    async fn get(&self, key: &str) -> Result<Option<KeyValue>>;

    /// Keys starting with `prefix`, in key order.
    async fn list(&self, prefix: &str, opts: ListOptions) -> Result<ListResult>;

    /// `key` as this replica's memory holds it, without asking a shared backend how far it has
    /// got: it may lag writes that other API servers acknowledged by this replica's watch delay
    /// (never this replica's own acknowledged writes). For the lookups upstream serves from
    /// informer caches (admission's namespaces, priority classes, limit ranges, quotas). The
    /// embedded backends have one writer, so this is [`Store::get`].
    async fn get_cached(&self, key: &str) -> Result<Option<KeyValue>> {
        self.get(key).await
    }

    /// Every key starting with `prefix`, in key order, as [`Store::get_cached`] sees them.
    async fn list_cached(&self, prefix: &str) -> Result<Vec<KeyValue>> {
        Ok(self.list(prefix, ListOptions::default()).await?.items)
    }

    /// Changes to keys under `prefix` with revision > `after`, in revision order,
    /// then live changes. `Compacted` if `after` is older than the compaction point.
    async fn watch(&self, prefix: &str, after: Revision) -> Result<BoxStream<'static, Event>>;

    /// The latest revision (0 on an empty store).
    async fn current_revision(&self) -> Result<Revision>;

    /// Forget history older than `revision` (the latest value of each key stays).
    async fn compact(&self, revision: Revision) -> Result<()>;

    /// The oldest revision still available to list and watch from.
    async fn compacted_revision(&self) -> Result<Revision>;

    /// Compacts history up to `revision`, as [`Store::compact`], also dropping the values that
    /// the writes at `revision` itself replaced (only reads before it could reach them), and
    /// leaves no copy of what it removed in the backend's files: afterwards an old value is gone
    /// from disk, not only from reads. For rare operations such as re-encrypting Secrets: it
    /// holds writes back while it runs.
    async fn erase_history(&self, revision: Revision) -> Result<()>;

    /// Whether the backend can serve reads and commit writes now (`/readyz`'s `etcd` check):
    /// SQLite's writer commits, etcd is reachable and the replica's watch is up and caught up.
    async fn health(&self) -> Result<()>;
}
