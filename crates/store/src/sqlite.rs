//! The default, durable backend: SQLite with kine's schema (one row per revision).
//!
//! Writes go through one writer thread that owns the write connection and
//! commits everything pending in one transaction (group commit: one fsync for
//! many writes). A write is acknowledged only after its transaction commits.
//! The latest value of every key and a window of recent events live in memory
//! (the `state` module); only lists and watches older than that window read SQLite.
//! A checkpointer thread copies the WAL back into the database on a connection of its own,
//! so the writer never stalls for a checkpoint.
//!
//! Table `kv`: `id` is the revision, assigned by the writer. Revisions never repeat, even
//! after compaction: compaction deletes only rows older than its target, never the latest
//! one, so the largest `id` is the current revision. A delete writes a tombstone row
//! (`deleted = 1`) that carries the deleted value; `prev_revision` points at the row it supersedes
//! (0 for a create). Table `meta` records `compact_rev`.
//!
//! The writer's connection runs with `secure_delete`: SQLite overwrites what a compaction deletes
//! (and the pages it frees) with zeros. That leaves the copies page rebalancing left behind, and
//! the WAL's old page images: [`Store::erase_history`] also rebuilds the database (VACUUM) and
//! truncates the WAL, after which no removed value is anywhere in the files.

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc as std_mpsc;
use std::thread::JoinHandle;

use anyhow::Context;
use async_trait::async_trait;
use futures::stream::BoxStream;
use parking_lot::Mutex;
use rusqlite::types::ToSql;
use rusqlite::{Connection, OpenFlags, OptionalExtension, Row, params};
use tokio::sync::{mpsc, oneshot};

use crate::state::{self, Limits, ListPlan, Op, State};
use crate::{Event, KeyValue, ListOptions, ListResult, Result, Revision, Store, StoreError};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS kv (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    created INTEGER NOT NULL,
    deleted INTEGER NOT NULL,
    create_revision INTEGER NOT NULL,
    prev_revision INTEGER NOT NULL,
    value BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS kv_name_id ON kv (name, id);
CREATE TABLE IF NOT EXISTS meta (
    name TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
";

const INSERT: &str = "INSERT INTO kv (id, name, created, deleted, create_revision, prev_revision, value)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)";

/// Reader connections kept open for lists and watches that reach disk.
const MAX_IDLE_READERS: usize = 4;

/// Tuning of a [`SqliteStore`].
#[derive(Clone, Copy, Debug)]
pub struct SqliteOptions {
    /// Recent events kept in memory for watchers and lists at recent revisions.
    pub event_window: usize,
    /// Most bytes of written values the window holds; older events are read from disk.
    pub event_window_bytes: usize,
    /// Live events buffered per watcher before a slow watcher is dropped.
    pub watch_buffer: usize,
    /// Most writes committed in one transaction.
    pub max_batch: usize,
    /// Most revisions one compaction transaction covers; write batches run
    /// between the steps of a larger compaction.
    pub compact_step: Revision,
    /// WAL pages after which a checkpoint is asked for. The append-only table rewrites its
    /// last pages on every commit, so checkpointing every 32 MiB instead of SQLite's 4 MiB
    /// copies far fewer pages per write.
    pub checkpoint_pages: i32,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions {
            event_window: state::DEFAULT_EVENT_WINDOW,
            event_window_bytes: state::DEFAULT_EVENT_WINDOW_BYTES,
            watch_buffer: state::DEFAULT_WATCH_BUFFER,
            max_batch: 4096,
            compact_step: 10_000,
            checkpoint_pages: 8192,
        }
    }
}

enum Request {
    Write(WriteRequest),
    Compact {
        revision: Revision,
        reply: oneshot::Sender<Result<()>>,
    },
    Erase {
        revision: Revision,
        reply: oneshot::Sender<Result<()>>,
    },
    /// Commit a heartbeat: proves the writer runs and the database takes a commit.
    Health {
        reply: oneshot::Sender<Result<()>>,
    },
}

/// Free space below which the store reports itself unhealthy: commits are about to fail.
const MIN_FREE_BYTES: u64 = 1 << 20;

pub struct SqliteStore {
    state: Arc<State>,
    requests: Option<mpsc::Sender<Request>>,
    writer: Option<JoinHandle<()>>,
    readers: Arc<Readers>,
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `path`.
    pub fn open(path: &Path) -> anyhow::Result<Arc<SqliteStore>> {
        Self::open_with(path, SqliteOptions::default())
    }

    pub fn open_with(path: &Path, opts: SqliteOptions) -> anyhow::Result<Arc<SqliteStore>> {
        let conn = Connection::open(path).with_context(|| format!("open sqlite database {}", path.display()))?;
        let mode: String = conn
            .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
            .context("switch to WAL")?;
        anyhow::ensure!(
            mode.eq_ignore_ascii_case("wal"),
            "sqlite database {} refused WAL mode (journal mode {mode})",
            path.display()
        );
        conn.execute_batch("PRAGMA synchronous=FULL; PRAGMA busy_timeout=10000;")
            .context("set pragmas")?;
        // Only deletes (compaction) pay for it: appends free nothing.
        let secure_delete: i64 = conn
            .query_row("PRAGMA secure_delete=ON", [], |r| r.get(0))
            .context("turn secure_delete on")?;
        anyhow::ensure!(secure_delete == 1, "sqlite refused secure_delete");
        // Every commit appends the pages it touched to the WAL; a checkpoint copies each page's
        // latest version back. Checkpoints run on a thread of their own (`checkpointer`), so the
        // writer never stops committing to copy tens of megabytes; this hook (which also turns
        // SQLite's own checkpoints after a commit off) tells the writer how large the WAL is.
        conn.wal_hook(Some(note_wal_pages));
        conn.execute_batch(SCHEMA).context("create schema")?;
        drop_autoincrement(&conn).context("migrate the kv table off AUTOINCREMENT")?;
        let (kvs, revision, compacted) = load(&conn).context("load latest values")?;
        tracing::info!(
            path = %path.display(),
            keys = kvs.len(),
            revision,
            compacted,
            "opened sqlite store"
        );
        let limits = Limits {
            event_window_bytes: opts.event_window_bytes.max(1),
            event_window: opts.event_window.max(1),
            watch_buffer: opts.watch_buffer,
            compact_with_window: false,
        };
        let state = Arc::new(State::new(kvs, revision, compacted, limits));
        let (requests, rx) = mpsc::channel(opts.max_batch.max(1) * 4);
        // One request at a time: while a checkpoint runs, the writer's next ones are dropped.
        let (checkpoint, checkpoints) = std_mpsc::sync_channel(1);
        let db = path.to_owned();
        let checkpointer = std::thread::Builder::new()
            .name("store-checkpointer".into())
            .spawn(move || checkpointer(&db, checkpoints))
            .context("spawn the store checkpointer thread")?;
        let writer = Writer {
            conn,
            state: state.clone(),
            max_batch: opts.max_batch.max(1),
            compact_step: opts.compact_step.max(1),
            checkpoint: Some((checkpoint, checkpointer)),
            checkpoint_pages: opts.checkpoint_pages.max(1),
            compacted_since_release: false,
        };
        let writer = std::thread::Builder::new()
            .name("store-writer".into())
            .spawn(move || writer.run(rx))
            .context("spawn the store writer thread")?;
        Ok(Arc::new(SqliteStore {
            state,
            requests: Some(requests),
            writer: Some(writer),
            readers: Arc::new(Readers {
                path: path.to_owned(),
                idle: Mutex::new(Vec::new()),
            }),
        }))
    }

    async fn request<T>(&self, make: impl FnOnce(oneshot::Sender<Result<T>>) -> Request) -> Result<T> {
        let (reply, rx) = oneshot::channel();
        let requests = self.requests.as_ref().ok_or_else(writer_gone)?;
        requests.send(make(reply)).await.map_err(|_| writer_gone())?;
        rx.await.map_err(|_| writer_gone())?
    }

    async fn write(&self, op: Op) -> Result<KeyValue> {
        self.request(|reply| Request::Write(WriteRequest::One(op, reply))).await
    }

    /// Runs `f` on a reader connection off the async threads.
    async fn read_disk<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let readers = self.readers.clone();
        tokio::task::spawn_blocking(move || readers.with(f))
            .await
            .context("join a store read")?
    }
}

impl Drop for SqliteStore {
    fn drop(&mut self) {
        // Closing the channel lets the writer finish what is queued and exit.
        self.requests.take();
        if let Some(writer) = self.writer.take()
            && writer.join().is_err()
        {
            tracing::error!("store writer thread panicked");
        }
    }
}

fn writer_gone() -> StoreError {
    StoreError::Backend(anyhow::anyhow!("the store writer has stopped"))
}

fn kv_from_row(row: &Row<'_>) -> rusqlite::Result<KeyValue> {
    Ok(KeyValue {
        key: row.get(0)?,
        create_revision: row.get(1)?,
        mod_revision: row.get(2)?,
        value: Arc::from(row.get::<_, Vec<u8>>(3)?),
    })
}

/// Databases created before revisions were assigned by the writer alone declare `kv.id`
/// AUTOINCREMENT, which makes every commit also rewrite the `sqlite_sequence` page. Rebuilds
/// the table without it, once, in one transaction; the sequence's last value is kept in `meta`
/// as a floor for the revision.
fn drop_autoincrement(conn: &Connection) -> anyhow::Result<()> {
    let sql: String = conn.query_row(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'kv'",
        [],
        |r| r.get(0),
    )?;
    if !sql.to_ascii_uppercase().contains("AUTOINCREMENT") {
        return Ok(());
    }
    let started = std::time::Instant::now();
    // The new table and its index come from SCHEMA itself, once the old ones are out of the way.
    conn.execute_batch(&format!(
        "BEGIN IMMEDIATE;
         INSERT INTO meta (name, value)
            SELECT 'revision_floor', seq FROM sqlite_sequence WHERE name = 'kv'
            ON CONFLICT (name) DO UPDATE SET value = MAX(value, excluded.value);
         ALTER TABLE kv RENAME TO kv_old;
         DROP INDEX kv_name_id;
         {SCHEMA}
         INSERT INTO kv (id, name, created, deleted, create_revision, prev_revision, value)
            SELECT id, name, created, deleted, create_revision, prev_revision, value FROM kv_old ORDER BY id;
         DROP TABLE kv_old;
         COMMIT;"
    ))
    .inspect_err(|_| {
        // Leave the database as it was; the next open tries again.
        let _ = conn.execute_batch("ROLLBACK");
    })?;
    tracing::info!(
        elapsed_ms = started.elapsed().as_millis() as u64,
        "kv table migrated off AUTOINCREMENT"
    );
    Ok(())
}

/// The latest value of every live key, the current revision, the compact revision.
fn load(conn: &Connection) -> anyhow::Result<(BTreeMap<String, KeyValue>, Revision, Revision)> {
    let mut stmt = conn.prepare(
        "SELECT k.name, k.create_revision, k.id, k.value FROM kv k
         JOIN (SELECT MAX(id) AS id FROM kv GROUP BY name) m ON k.id = m.id
         WHERE k.deleted = 0",
    )?;
    let mut kvs = BTreeMap::new();
    for kv in stmt.query_map([], kv_from_row)? {
        let kv = kv?;
        kvs.insert(kv.key.clone(), kv);
    }
    let floor: Option<Revision> = conn
        .query_row("SELECT value FROM meta WHERE name = 'revision_floor'", [], |r| r.get(0))
        .optional()?;
    let max_id: Revision = conn.query_row("SELECT COALESCE(MAX(id), 0) FROM kv", [], |r| r.get(0))?;
    let compacted = compact_revision(conn)?;
    Ok((kvs, floor.unwrap_or(0).max(max_id).max(compacted), compacted))
}

fn compact_revision(conn: &Connection) -> rusqlite::Result<Revision> {
    Ok(conn
        .query_row("SELECT value FROM meta WHERE name = 'compact_rev'", [], |r| r.get(0))
        .optional()?
        .unwrap_or(0))
}

fn check_not_compacted(conn: &Connection, revision: Revision) -> Result<()> {
    let compacted = compact_revision(conn).context("read the compact revision")?;
    if revision < compacted {
        return Err(StoreError::Compacted {
            requested: revision,
            compacted,
        });
    }
    Ok(())
}

/// Read connections, opened on demand and kept for reuse.
struct Readers {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
}

impl Readers {
    fn with<T>(&self, f: impl FnOnce(&mut Connection) -> Result<T>) -> Result<T> {
        let idle = self.idle.lock().pop();
        let mut conn = match idle {
            Some(conn) => conn,
            None => {
                let conn = Connection::open_with_flags(
                    &self.path,
                    OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
                )
                .with_context(|| format!("open {} for reading", self.path.display()))?;
                conn.busy_timeout(std::time::Duration::from_secs(10))
                    .context("set busy timeout")?;
                conn
            }
        };
        let out = f(&mut conn);
        let mut idle = self.idle.lock();
        if idle.len() < MAX_IDLE_READERS {
            idle.push(conn);
        }
        out
    }
}

/// Keys under `prefix` as of `revision`: the latest row of each key at or
/// before it, unless that row is a tombstone.
fn list_at(conn: &mut Connection, prefix: &str, opts: &ListOptions, revision: Revision) -> Result<ListResult> {
    let tx = conn.transaction().context("begin a read")?;
    check_not_compacted(&tx, revision)?;
    let end = state::prefix_end(prefix);
    let mut sql = String::from(
        "SELECT k.name, k.create_revision, k.id, k.value FROM kv k
         JOIN (SELECT MAX(id) AS id FROM kv WHERE name >= :prefix AND id <= :rev",
    );
    let mut args: Vec<(&str, &dyn ToSql)> = vec![(":prefix", &prefix), (":rev", &revision)];
    if let Some(end) = &end {
        sql.push_str(" AND name < :end");
        args.push((":end", end));
    }
    if let Some(after) = &opts.start_after {
        sql.push_str(" AND name > :after");
        args.push((":after", after));
    }
    let limit: i64 = if opts.limit == 0 {
        -1
    } else {
        i64::try_from(opts.limit).unwrap_or(i64::MAX - 1) + 1
    };
    sql.push_str(" GROUP BY name) m ON k.id = m.id WHERE k.deleted = 0 ORDER BY k.name LIMIT :limit");
    args.push((":limit", &limit));
    let mut items = Vec::new();
    {
        let mut stmt = tx.prepare_cached(&sql).context("prepare a list")?;
        let rows = stmt.query_map(&args[..], kv_from_row).context("list at a revision")?;
        for kv in rows {
            let kv = kv.context("read a listed row")?;
            if kv.key.starts_with(prefix) {
                items.push(kv);
            }
        }
    }
    let more = opts.limit != 0 && items.len() > opts.limit;
    if more {
        items.truncate(opts.limit);
    }
    Ok(ListResult { items, revision, more })
}

/// Events under `prefix` with revisions in `(after, until]`, in order.
fn events_between(conn: &mut Connection, prefix: &str, after: Revision, until: Revision) -> Result<Vec<Event>> {
    let tx = conn.transaction().context("begin a read")?;
    // A compaction may have committed since the watch was registered.
    check_not_compacted(&tx, after)?;
    let end = state::prefix_end(prefix);
    let mut sql = String::from(
        "SELECT k.id, k.name, k.created, k.deleted, k.create_revision, k.prev_revision, k.value,
                p.create_revision, p.value
         FROM kv k LEFT JOIN kv p ON p.id = k.prev_revision AND k.deleted = 0
         WHERE k.id > :after AND k.id <= :until AND k.name >= :prefix",
    );
    let mut args: Vec<(&str, &dyn ToSql)> = vec![(":after", &after), (":until", &until), (":prefix", &prefix)];
    if let Some(end) = &end {
        sql.push_str(" AND k.name < :end");
        args.push((":end", end));
    }
    sql.push_str(" ORDER BY k.id");
    let mut stmt = tx.prepare_cached(&sql).context("prepare a history read")?;
    let mut rows = stmt.query(&args[..]).context("read history")?;
    let mut events = Vec::new();
    while let Some(row) = rows.next().context("read a history row")? {
        let event = event_from_row(row).context("decode a history row")?;
        if event.key().starts_with(prefix) {
            events.push(event);
        }
    }
    Ok(events)
}

fn event_from_row(row: &Row<'_>) -> rusqlite::Result<Event> {
    let revision: Revision = row.get(0)?;
    let key: String = row.get(1)?;
    let created: bool = row.get(2)?;
    let deleted: bool = row.get(3)?;
    let create_revision: Revision = row.get(4)?;
    let prev_revision: Revision = row.get(5)?;
    let value: Arc<[u8]> = Arc::from(row.get::<_, Vec<u8>>(6)?);
    if deleted {
        return Ok(Event::Delete {
            prev: KeyValue {
                key,
                value,
                create_revision,
                mod_revision: prev_revision,
            },
            revision,
        });
    }
    let prev = if created || prev_revision == 0 {
        None
    } else {
        let prev_create: Option<Revision> = row.get(7)?;
        let prev_value: Option<Vec<u8>> = row.get(8)?;
        match (prev_create, prev_value) {
            (Some(create_revision), Some(value)) => Some(KeyValue {
                key: key.clone(),
                value: Arc::from(value),
                create_revision,
                mod_revision: prev_revision,
            }),
            _ => {
                tracing::warn!(key, revision, prev_revision, "previous row missing from history");
                None
            }
        }
    };
    Ok(Event::Put {
        kv: KeyValue {
            key,
            value,
            create_revision,
            mod_revision: revision,
        },
        prev,
    })
}

struct Writer {
    conn: Connection,
    state: Arc<State>,
    max_batch: usize,
    compact_step: Revision,
    /// Asks the checkpointer thread for a checkpoint.
    checkpoint: Option<(std_mpsc::SyncSender<()>, JoinHandle<()>)>,
    checkpoint_pages: i32,
    /// A compaction step ran since memory was last released.
    compacted_since_release: bool,
}

thread_local! {
    /// Pages in the WAL after the last commit on this thread's connection.
    static WAL_PAGES: Cell<i32> = const { Cell::new(0) };
}

/// SQLite's WAL hook: called on the committing thread after each commit.
fn note_wal_pages(_: &rusqlite::hooks::Wal, pages: std::ffi::c_int) -> rusqlite::Result<()> {
    WAL_PAGES.with(|p| p.set(pages));
    Ok(())
}

/// Copies the WAL back into the database whenever the writer asks, on a connection of its
/// own: a PASSIVE checkpoint neither waits for nor blocks the writer and readers.
fn checkpointer(path: &Path, requests: std_mpsc::Receiver<()>) {
    let conn = match Connection::open(path) {
        Ok(conn) => conn,
        Err(e) => {
            tracing::error!(error = %e, path = %path.display(), "the store checkpointer cannot open the database");
            return;
        }
    };
    while requests.recv().is_ok() {
        let result = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
            Ok((r.get::<_, i64>(1)?, r.get::<_, i64>(2)?))
        });
        match result {
            Ok((frames, copied)) => tracing::debug!(frames, copied, "checkpointed the store's WAL"),
            Err(e) => tracing::warn!(error = %e, "checkpointing the store's WAL failed"),
        }
    }
}

/// A write, or a transaction of several, waiting for the next commit.
enum WriteRequest {
    One(Op, oneshot::Sender<Result<KeyValue>>),
    Txn(Vec<Op>, oneshot::Sender<Result<Vec<KeyValue>>>),
}

/// The answer to a [`WriteRequest`], sent once its batch is committed.
enum Answer {
    One(oneshot::Sender<Result<KeyValue>>, Result<KeyValue>),
    Txn(oneshot::Sender<Result<Vec<KeyValue>>>, Result<Vec<KeyValue>>),
}

impl Writer {
    fn run(mut self, mut rx: mpsc::Receiver<Request>) {
        let mut writes: Vec<WriteRequest> = Vec::new();
        // Accepted compactions, done a step at a time between write batches
        // so that a large one does not stall writers.
        let mut compactions: VecDeque<(Revision, oneshot::Sender<Result<()>>)> = VecDeque::new();
        let mut open = true;
        while open || !compactions.is_empty() {
            let first = if !open {
                None
            } else if compactions.is_empty() {
                rx.blocking_recv()
            } else {
                match rx.try_recv() {
                    Ok(request) => Some(request),
                    Err(mpsc::error::TryRecvError::Empty) => None,
                    Err(mpsc::error::TryRecvError::Disconnected) => {
                        open = false;
                        None
                    }
                }
            };
            if first.is_none() && compactions.is_empty() {
                break;
            }
            let mut next = first;
            let mut taken = 0;
            while let Some(request) = next.take() {
                taken += 1;
                match request {
                    Request::Write(write) => writes.push(write),
                    Request::Compact { revision, reply } => {
                        // Writes queued before the compaction commit first, so
                        // that it is checked against what its caller saw.
                        self.commit_writes(&mut writes);
                        let current = self.state.read().revision();
                        if revision > current {
                            let _ = reply.send(Err(StoreError::FutureRevision(revision)));
                        } else {
                            compactions.push_back((revision, reply));
                        }
                    }
                    Request::Erase { revision, reply } => {
                        self.commit_writes(&mut writes);
                        let current = self.state.read().revision();
                        let result = if revision > current {
                            Err(StoreError::FutureRevision(revision))
                        } else {
                            self.erase_history(revision)
                        };
                        let _ = reply.send(result);
                    }
                    Request::Health { reply } => {
                        self.commit_writes(&mut writes);
                        let _ = reply.send(self.heartbeat().map_err(StoreError::Backend));
                    }
                }
                if taken < self.max_batch {
                    next = rx.try_recv().ok();
                }
            }
            self.commit_writes(&mut writes);
            if let Some((target, _)) = compactions.front() {
                let step = self.compact_step(*target);
                if (step.is_err() || self.state.read().compacted() >= *target)
                    && let Some((_, reply)) = compactions.pop_front()
                {
                    if step.is_ok() && std::mem::take(&mut self.compacted_since_release) {
                        self.release_memory();
                    }
                    let _ = reply.send(step);
                }
            }
        }
        if let Some((checkpoint, checkpointer)) = self.checkpoint.take() {
            drop(checkpoint);
            if checkpointer.join().is_err() {
                tracing::error!("store checkpointer thread panicked");
            }
        }
        tracing::debug!("store writer stopped");
    }

    /// Checks the queued writes in order, commits the ones that hold in one
    /// transaction, publishes their events, then answers every caller.
    fn commit_writes(&mut self, writes: &mut Vec<WriteRequest>) {
        if writes.is_empty() {
            return;
        }
        let mut answers = Vec::with_capacity(writes.len());
        let mut events = Vec::new();
        {
            let current = self.state.read();
            let mut revision = current.revision();
            let mut pending: HashMap<String, Option<KeyValue>> = HashMap::new();
            for write in writes.drain(..) {
                match write {
                    WriteRequest::One(op, reply) => {
                        let key = op.key().to_owned();
                        let now = match pending.get(&key) {
                            Some(kv) => kv.as_ref(),
                            None => current.get(&key),
                        };
                        let answer = state::plan(now, op, revision + 1).map(|(event, kv)| {
                            revision += 1;
                            pending.insert(key, state::after_event(&event).cloned());
                            events.push(event);
                            kv
                        });
                        answers.push(Answer::One(reply, answer));
                    }
                    WriteRequest::Txn(ops, reply) => {
                        let now = |k: &str| match pending.get(k) {
                            Some(kv) => kv.as_ref(),
                            None => current.get(k),
                        };
                        let answer = state::plan_txn(now, ops, revision + 1).map(|planned| {
                            let mut kvs = Vec::with_capacity(planned.len());
                            for (event, kv) in planned {
                                revision += 1;
                                pending.insert(kv.key.clone(), state::after_event(&event).cloned());
                                events.push(event);
                                kvs.push(kv);
                            }
                            kvs
                        });
                        answers.push(Answer::Txn(reply, answer));
                    }
                }
            }
        }
        if !events.is_empty() {
            match self.insert(&events) {
                Ok(()) => {
                    self.state.write().apply(events);
                    if WAL_PAGES.with(Cell::get) >= self.checkpoint_pages
                        && let Some((checkpoint, _)) = &self.checkpoint
                    {
                        // Full means one is pending or running already.
                        let _ = checkpoint.try_send(());
                    }
                }
                Err(err) => {
                    tracing::error!(error = format!("{err:#}"), "store commit failed");
                    let failed = || StoreError::Backend(anyhow::anyhow!("commit a batch of writes: {err:#}"));
                    for answer in &mut answers {
                        match answer {
                            Answer::One(_, a) => *a = Err(failed()),
                            Answer::Txn(_, a) => *a = Err(failed()),
                        }
                    }
                }
            }
        }
        for answer in answers {
            // The caller may have given up waiting; the write stands.
            match answer {
                Answer::One(reply, a) => {
                    let _ = reply.send(a);
                }
                Answer::Txn(reply, a) => {
                    let _ = reply.send(a);
                }
            }
        }
    }

    fn heartbeat(&mut self) -> anyhow::Result<()> {
        let tx = self.conn.transaction().context("begin a heartbeat")?;
        tx.execute(
            "INSERT INTO meta (name, value) VALUES ('heartbeat', 1)
             ON CONFLICT (name) DO UPDATE SET value = value + 1",
            [],
        )
        .context("write a heartbeat")?;
        tx.commit().context("commit a heartbeat")
    }

    fn insert(&mut self, events: &[Event]) -> anyhow::Result<()> {
        let tx = self.conn.transaction().context("begin a write")?;
        {
            let mut stmt = tx.prepare_cached(INSERT).context("prepare insert")?;
            for event in events {
                match event {
                    Event::Put { kv, prev } => stmt.execute(params![
                        kv.mod_revision,
                        kv.key,
                        prev.is_none(),
                        false,
                        kv.create_revision,
                        prev.as_ref().map_or(0, |p| p.mod_revision),
                        &kv.value[..],
                    ]),
                    Event::Delete { prev, revision } => stmt.execute(params![
                        revision,
                        prev.key,
                        false,
                        true,
                        prev.create_revision,
                        prev.mod_revision,
                        &prev.value[..],
                    ]),
                }
                .context("insert a revision")?;
            }
        }
        tx.commit().context("commit")
    }

    /// After a compaction: SQLite's page cache holds the pages it rewrote, and the allocator the
    /// events it dropped from memory; both are given back rather than kept until the next burst.
    fn release_memory(&self) {
        if let Err(e) = self.conn.release_memory() {
            tracing::debug!(error = %e, "releasing the writer's page cache");
        }
        crate::release_memory();
    }

    /// Compacts towards `target`, at most `compact_step` revisions further
    /// than the current compaction point.
    ///
    /// Deletes history rows older than the new point that a later row (also
    /// older than it) supersedes, and tombstones older than it. Each key's
    /// latest row at the point stays, so lists at it and watches from it still
    /// work (with previous values).
    fn compact_step(&mut self, target: Revision) -> Result<()> {
        let old = self.state.read().compacted();
        if target <= old {
            return Ok(());
        }
        let revision = target.min(old.saturating_add(self.compact_step));
        let tx = self.conn.transaction().context("begin a compaction")?;
        // Rows superseded before `old` went in earlier compactions.
        let superseded = tx
            .execute(
                "DELETE FROM kv WHERE id IN (
                    SELECT prev_revision FROM kv
                    WHERE id >= ?1 AND id < ?2 AND prev_revision != 0)",
                [old, revision],
            )
            .context("delete superseded rows")?;
        let tombstones = tx
            .execute(
                "DELETE FROM kv WHERE deleted = 1 AND id >= ?1 AND id < ?2",
                [old, revision],
            )
            .context("delete tombstones")?;
        tx.execute(
            "INSERT INTO meta (name, value) VALUES ('compact_rev', ?1)
             ON CONFLICT (name) DO UPDATE SET value = excluded.value",
            [revision],
        )
        .context("record the compact revision")?;
        tx.commit().context("commit a compaction")?;
        self.state.write().set_compacted(revision);
        self.compacted_since_release = true;
        tracing::debug!(revision, superseded, tombstones, "compacted store history");
        Ok(())
    }

    /// Compacts to `revision` in one go, drops the rows the writes at `revision` replaced,
    /// rebuilds the database and truncates the WAL.
    ///
    /// `secure_delete` zeroes what a delete frees, but not every old copy: when SQLite rebalances
    /// a page it moves cells to a sibling and leaves their old bytes in the page's unallocated
    /// gap, where a later delete of the moved cell does not reach (the store's test finds such
    /// copies). VACUUM writes every page anew from the live rows only; the WAL, which holds the
    /// pages as they were, is then copied back and truncated.
    fn erase_history(&mut self, revision: Revision) -> Result<()> {
        let started = std::time::Instant::now();
        while self.state.read().compacted() < revision {
            self.compact_step(revision)?;
        }
        // A compaction keeps what a read at its revision needs: nothing reads before it, so
        // neither the row the write at `revision` superseded nor a tombstone there is needed. The
        // revision counter survives without that tombstone: `compact_rev` is its floor.
        let tx = self.conn.transaction().context("begin erasing history")?;
        let superseded = tx
            .execute(
                "DELETE FROM kv WHERE id = (SELECT prev_revision FROM kv WHERE id = ?1 AND prev_revision != 0)",
                [revision],
            )
            .context("delete the row superseded at the compaction point")?;
        let tombstone = tx
            .execute("DELETE FROM kv WHERE id = ?1 AND deleted = 1", [revision])
            .context("delete the tombstone at the compaction point")?;
        tx.commit().context("commit erasing history")?;
        self.conn.execute_batch("VACUUM").context("rebuild the database")?;
        self.truncate_wal()?;
        tracing::info!(
            revision,
            rows = superseded + tombstone,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "erased store history"
        );
        Ok(())
    }

    /// Copies the whole WAL into the database and truncates it to nothing. Readers inside a
    /// transaction hold it back; they are short, so this waits for them (busy_timeout) and tries again.
    fn truncate_wal(&mut self) -> Result<()> {
        for _ in 0..50 {
            let busy: i64 = self
                .conn
                .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0))
                .context("checkpoint and truncate the WAL")?;
            if busy == 0 {
                WAL_PAGES.with(|p| p.set(0));
                return Ok(());
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Err(StoreError::Backend(anyhow::anyhow!(
            "the WAL could not be truncated: readers kept it busy"
        )))
    }
}

#[async_trait]
impl Store for SqliteStore {
    async fn create(&self, key: &str, value: Vec<u8>) -> Result<KeyValue> {
        self.write(Op::Create {
            key: key.to_owned(),
            value,
        })
        .await
    }

    async fn update(&self, key: &str, value: Vec<u8>, expected: Revision) -> Result<KeyValue> {
        self.write(Op::Update {
            key: key.to_owned(),
            value,
            expected,
        })
        .await
    }

    async fn delete(&self, key: &str, expected: Option<Revision>) -> Result<KeyValue> {
        self.write(Op::Delete {
            key: key.to_owned(),
            expected,
        })
        .await
    }

    async fn txn(&self, ops: Vec<Op>) -> Result<Vec<KeyValue>> {
        self.request(|reply| Request::Write(WriteRequest::Txn(ops, reply)))
            .await
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        Ok(self.state.read().get(key).cloned())
    }

    async fn list(&self, prefix: &str, opts: ListOptions) -> Result<ListResult> {
        let plan = self.state.read().list(prefix, &opts)?;
        match plan {
            ListPlan::Done(result) => Ok(result),
            ListPlan::Disk(revision) => {
                let prefix = prefix.to_owned();
                self.read_disk(move |conn| list_at(conn, &prefix, &opts, revision))
                    .await
            }
        }
    }

    async fn watch(&self, prefix: &str, after: Revision) -> Result<BoxStream<'static, Event>> {
        let sub = self.state.write().subscribe(prefix, after)?;
        let disk = match sub.disk {
            Some((from, until)) => {
                let prefix = prefix.to_owned();
                self.read_disk(move |conn| events_between(conn, &prefix, from, until))
                    .await?
            }
            None => Vec::new(),
        };
        Ok(sub.into_stream(disk))
    }

    async fn current_revision(&self) -> Result<Revision> {
        Ok(self.state.read().revision())
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        self.request(|reply| Request::Compact { revision, reply }).await
    }

    async fn compacted_revision(&self) -> Result<Revision> {
        Ok(self.state.read().compacted())
    }

    async fn erase_history(&self, revision: Revision) -> Result<()> {
        self.request(|reply| Request::Erase { revision, reply }).await
    }

    /// The writer commits a heartbeat within 5 s, and the database's filesystem has room.
    async fn health(&self) -> Result<()> {
        let dir = match self.readers.path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
            _ => PathBuf::from("."),
        };
        let free = tokio::task::spawn_blocking(move || rustix::fs::statvfs(&dir))
            .await
            .context("join a statvfs")?
            .context("statvfs the database's filesystem")?;
        let free = free.f_bavail.saturating_mul(free.f_frsize);
        if free < MIN_FREE_BYTES {
            return Err(StoreError::Backend(anyhow::anyhow!(
                "the database's filesystem is full ({free} bytes free)"
            )));
        }
        tokio::time::timeout(
            std::time::Duration::from_secs(5),
            self.request(|reply| Request::Health { reply }),
        )
        .await
        .map_err(|_| StoreError::Backend(anyhow::anyhow!("the store writer did not commit within 5s")))?
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Write};
    use std::process::{Command, Stdio};

    use futures::StreamExt;

    use super::*;
    use crate::MemoryStore;
    use crate::conformance::{self, assert_quiet, next_event, take_events};

    fn open_in(dir: &tempfile::TempDir, opts: SqliteOptions) -> Arc<SqliteStore> {
        SqliteStore::open_with(&dir.path().join("state.db"), opts).unwrap()
    }

    fn fresh_with(opts: SqliteOptions) -> (Arc<dyn Store>, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        (open_in(&dir, opts), dir)
    }

    /// Also checkpoints all the time, while writes and reads go on.
    fn tiny_window() -> SqliteOptions {
        SqliteOptions {
            event_window: 1,
            compact_step: 3,
            checkpoint_pages: 2,
            ..Default::default()
        }
    }

    /// A compaction drops the events at or before it from memory as well as from disk: after
    /// objects are created and deleted, their values are not held until the window rolls over.
    #[tokio::test]
    async fn compaction_releases_the_event_window() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_in(&dir, SqliteOptions::default());
        for i in 0..500 {
            store.create(&format!("/c/{i:03}"), vec![b'x'; 256]).await.unwrap();
        }
        let half = store.current_revision().await.unwrap();
        for i in 0..500 {
            store.delete(&format!("/c/{i:03}"), None).await.unwrap();
        }
        assert_eq!(store.state.read().window_len(), 1000);
        store.compact(half).await.unwrap();
        assert_eq!(store.state.read().window_len(), 500);
        // Watches and lists after the compaction point still see the deletes.
        let mut watch = store.watch("/c/", half).await.unwrap();
        assert!(matches!(next_event(&mut watch).await, Event::Delete { .. }));
        let current = store.current_revision().await.unwrap();
        store.compact(current).await.unwrap();
        assert_eq!(store.state.read().window_len(), 0);
        // Nor the room the burst grew the window to.
        assert_eq!(store.state.read().window_capacity(), 0);
        assert!(
            store
                .list("/c/", ListOptions::default())
                .await
                .unwrap()
                .items
                .is_empty()
        );
    }

    /// The window holds at most its byte budget of written values; what falls out is read from
    /// disk, so a watch and a list at an early revision see exactly what they did before.
    #[tokio::test]
    async fn the_event_window_is_bounded_by_bytes_and_disk_serves_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_in(
            &dir,
            SqliteOptions {
                event_window_bytes: 4096,
                ..Default::default()
            },
        );
        for i in 0..100 {
            store.create(&format!("/c/{i:03}"), vec![b'a'; 256]).await.unwrap();
        }
        let mid = store.current_revision().await.unwrap();
        for i in 0..100 {
            let key = format!("/c/{i:03}");
            let kv = store.get(&key).await.unwrap().unwrap();
            store.update(&key, vec![b'b'; 256], kv.mod_revision).await.unwrap();
        }
        assert!(
            store.state.read().window_len() <= 16,
            "{}",
            store.state.read().window_len()
        );
        let mut watch = store.watch("/c/", 0).await.unwrap();
        let events = take_events(&mut watch, 200).await;
        let revisions: Vec<_> = events.iter().map(Event::revision).collect();
        assert_eq!(revisions, (1..=200).collect::<Vec<_>>());
        let at_mid = store
            .list(
                "/c/",
                ListOptions {
                    revision: Some(mid),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(at_mid.items.len(), 100);
        assert!(at_mid.items.iter().all(|kv| kv.value[..] == [b'a'; 256]));
    }

    /// The process's memory release hook runs once a compaction is done, so the binary's
    /// allocator gives back what it dropped from memory.
    #[tokio::test]
    async fn compaction_runs_the_memory_release_hook() {
        static RELEASES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        crate::set_release_memory(|| {
            RELEASES.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        });
        let releases = || RELEASES.load(std::sync::atomic::Ordering::SeqCst);
        let dir = tempfile::tempdir().unwrap();
        let store = open_in(&dir, SqliteOptions::default());
        for i in 0..10 {
            store.create(&format!("/c/{i}"), vec![b'x'; 64]).await.unwrap();
        }
        let before = releases();
        let current = store.current_revision().await.unwrap();
        store.compact(current).await.unwrap();
        assert!(releases() > before, "a compaction that dropped events released memory");
    }

    /// The checkpointer thread copies the WAL back into the database while the store is
    /// open (SQLite's own checkpoints after a commit are off).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_wal_is_checkpointed_while_writing() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_in(
            &dir,
            SqliteOptions {
                checkpoint_pages: 16,
                ..Default::default()
            },
        );
        let db = dir.path().join("state.db");
        let before = std::fs::metadata(&db).unwrap().len();
        for i in 0..200 {
            store.create(&format!("/c/{i:03}"), vec![b'x'; 1024]).await.unwrap();
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::fs::metadata(&db).unwrap().len() < before + 200 * 1024 {
            assert!(std::time::Instant::now() < deadline, "the database file never grew");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        drop(store);
        let store = open_in(&dir, SqliteOptions::default());
        assert_eq!(
            store.list("/c/", ListOptions::default()).await.unwrap().items.len(),
            200
        );
    }

    mod default_window {
        crate::conformance::suite!(super::fresh_with(super::SqliteOptions::default()));
    }

    /// Every list and watch into the past reads SQLite.
    mod tiny_window {
        crate::conformance::suite!(super::fresh_with(super::tiny_window()));
    }

    #[tokio::test]
    async fn reopen_keeps_values_history_and_revisions() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = open_in(&dir, SqliteOptions::default());
        conformance::write_history(&store).await;
        let before = store.list("", ListOptions::default()).await.unwrap();
        let mut live = store.watch("", 0).await.unwrap();
        let history = take_events(&mut live, 6).await;
        drop(live);
        drop(store);

        let store: Arc<dyn Store> = open_in(&dir, SqliteOptions::default());
        assert_eq!(store.current_revision().await.unwrap(), 6);
        assert_eq!(
            store.list("", ListOptions::default()).await.unwrap().items,
            before.items
        );
        let mut replay = store.watch("", 0).await.unwrap();
        assert_eq!(take_events(&mut replay, 6).await, history);
        assert_quiet(&mut replay).await;
        let kv = store.create("/w/new", b"n".to_vec()).await.unwrap();
        assert_eq!(kv.mod_revision, 7);
        assert_eq!(next_event(&mut replay).await.revision(), 7);
        store.compact(7).await.unwrap();
        drop(replay);
        drop(store);

        // The compaction point and the revision counter survive too, even
        // though compaction deleted rows.
        let store: Arc<dyn Store> = open_in(&dir, SqliteOptions::default());
        assert_eq!(store.compacted_revision().await.unwrap(), 7);
        assert_eq!(store.current_revision().await.unwrap(), 7);
        assert!(matches!(
            store.watch("", 5).await.err(),
            Some(StoreError::Compacted {
                requested: 5,
                compacted: 7
            })
        ));
        store.delete("/w/new", None).await.unwrap();
        store.compact(8).await.unwrap();
        drop(store);
        let store: Arc<dyn Store> = open_in(&dir, SqliteOptions::default());
        assert_eq!(store.current_revision().await.unwrap(), 8);
        assert_eq!(store.create("/w/new", b"m".to_vec()).await.unwrap().mod_revision, 9);
        let keys: Vec<_> = store
            .list("", ListOptions::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|kv| kv.key)
            .collect();
        assert_eq!(keys, ["/w/a", "/w/new", "/x/c"]);
    }

    /// A database written with the AUTOINCREMENT schema opens with its values, history and
    /// revision counter, and is rebuilt without AUTOINCREMENT.
    #[tokio::test]
    async fn databases_with_autoincrement_are_migrated() {
        let dir = tempfile::tempdir().unwrap();
        {
            let conn = Connection::open(dir.path().join("state.db")).unwrap();
            conn.execute_batch(
                "CREATE TABLE kv (
                    id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, created INTEGER NOT NULL,
                    deleted INTEGER NOT NULL, create_revision INTEGER NOT NULL,
                    prev_revision INTEGER NOT NULL, value BLOB NOT NULL);
                 CREATE INDEX kv_name_id ON kv (name, id);
                 CREATE TABLE meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
                 INSERT INTO kv VALUES (1, '/w/a', 1, 0, 1, 0, x'6131');
                 INSERT INTO kv VALUES (2, '/w/b', 1, 0, 2, 0, x'6231');
                 INSERT INTO kv VALUES (3, '/w/a', 0, 0, 1, 1, x'6132');
                 INSERT INTO kv VALUES (4, '/w/c', 1, 0, 4, 0, x'6331');
                 DELETE FROM kv WHERE id = 4;",
            )
            .unwrap();
        }
        let store: Arc<dyn Store> = open_in(&dir, SqliteOptions::default());
        // The sequence had reached 4 although row 4 is gone: revision 4 is never reused.
        assert_eq!(store.current_revision().await.unwrap(), 4);
        let items = store.list("", ListOptions::default()).await.unwrap().items;
        let values: Vec<_> = items.iter().map(|kv| (kv.key.as_str(), &kv.value[..])).collect();
        assert_eq!(values, [("/w/a", &b"a2"[..]), ("/w/b", &b"b1"[..])]);
        let mut replay = store.watch("/w/a", 0).await.unwrap();
        assert_eq!(next_event(&mut replay).await.revision(), 1);
        assert_eq!(next_event(&mut replay).await.revision(), 3);
        assert_eq!(store.create("/w/d", b"d".to_vec()).await.unwrap().mod_revision, 5);
        drop(replay);
        drop(store);
        let conn = Connection::open(dir.path().join("state.db")).unwrap();
        let sql: String = conn
            .query_row("SELECT sql FROM sqlite_master WHERE name = 'kv'", [], |r| r.get(0))
            .unwrap();
        assert!(!sql.contains("AUTOINCREMENT"), "{sql}");
        let indexes: i64 = conn
            .query_row(
                "SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND tbl_name = 'kv'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(indexes, 1);
        drop(conn);
        let store: Arc<dyn Store> = open_in(&dir, SqliteOptions::default());
        assert_eq!(store.current_revision().await.unwrap(), 5);
    }

    #[tokio::test]
    async fn compaction_deletes_superseded_rows_in_steps() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = open_in(&dir, tiny_window());
        conformance::write_history(&store).await;
        let rows = || -> Vec<Revision> {
            let conn = Connection::open(dir.path().join("state.db")).unwrap();
            let mut stmt = conn.prepare("SELECT id FROM kv ORDER BY id").unwrap();
            stmt.query_map([], |r| r.get(0)).unwrap().map(|r| r.unwrap()).collect()
        };
        assert_eq!(rows(), [1, 2, 3, 4, 5, 6]);
        // Two steps of 3: superseded 1 (by 3) and 2 (by the tombstone 5), and the
        // tombstone itself; 3, 4 and 6 are each key's latest row at 6.
        store.compact(6).await.unwrap();
        assert_eq!(rows(), [3, 4, 6]);
        assert_eq!(store.compacted_revision().await.unwrap(), 6);
        let mut watch = store.watch("", 6).await.unwrap();
        store.update("/w/a", b"a3".to_vec(), 3).await.unwrap();
        match next_event(&mut watch).await {
            Event::Put { prev: Some(prev), .. } => assert_eq!(&prev.value[..], b"a2"),
            other => panic!("{other:?}"),
        }
    }

    /// Raw bytes of the database and its WAL and shared-memory files.
    fn files_on_disk(dir: &tempfile::TempDir) -> Vec<(String, Vec<u8>)> {
        ["state.db", "state.db-wal", "state.db-shm"]
            .iter()
            .filter_map(|f| Some((f.to_string(), std::fs::read(dir.path().join(f)).ok()?)))
            .collect()
    }

    fn contains(haystack: &[u8], needle: &[u8]) -> bool {
        haystack.windows(needle.len()).any(|w| w == needle)
    }

    /// After `erase_history` no earlier value is anywhere in the files: not in rows compacted
    /// away (zeroed by secure_delete, overflow pages of large values included), not in pages
    /// the rows moved out of, not in the WAL.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn erased_history_leaves_no_copy_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_in(
            &dir,
            SqliteOptions {
                checkpoint_pages: 16,
                ..Default::default()
            },
        );
        let old = |i: usize| {
            // Every tenth value spills into overflow pages.
            let pad = if i.is_multiple_of(10) { 6000 } else { 150 };
            format!("{{\"v\":\"PLAIN-{i:03}-{}\"}}", "p".repeat(pad)).into_bytes()
        };
        for i in 0..400 {
            store.create(&format!("/s/{i:03}"), old(i)).await.unwrap();
            store.create(&format!("/o/{i:03}"), vec![b'o'; 100]).await.unwrap();
        }
        for i in 0..400 {
            let key = format!("/s/{i:03}");
            let kv = store.get(&key).await.unwrap().unwrap();
            if i % 7 == 0 {
                store.delete(&key, Some(kv.mod_revision)).await.unwrap();
            } else {
                let sealed = format!("sealed-{i:03}-{}", "s".repeat(i % 300)).into_bytes();
                store.update(&key, sealed, kv.mod_revision).await.unwrap();
            }
        }
        // Give the checkpointer time to copy the old pages into the database file as well.
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        assert!(
            files_on_disk(&dir).iter().any(|(_, bytes)| contains(bytes, b"PLAIN-")),
            "the old values are on disk before"
        );
        let revision = store.current_revision().await.unwrap();
        store.erase_history(revision).await.unwrap();
        for (file, bytes) in files_on_disk(&dir) {
            assert!(!contains(&bytes, b"PLAIN-"), "{file} still holds an old value");
        }
        assert_eq!(std::fs::metadata(dir.path().join("state.db-wal")).unwrap().len(), 0);
        // The present survives, on disk too, and writes go on at the next revision.
        drop(store);
        let store = open_in(&dir, SqliteOptions::default());
        assert_eq!(store.current_revision().await.unwrap(), revision);
        assert_eq!(store.compacted_revision().await.unwrap(), revision);
        let items = store.list("/s/", ListOptions::default()).await.unwrap().items;
        assert_eq!(items.len(), 400 - 58);
        assert!(items.iter().all(|kv| kv.value.starts_with(b"sealed-")));
        assert_eq!(
            store.list("/o/", ListOptions::default()).await.unwrap().items.len(),
            400
        );
        let kv = store.create("/s/new", b"n".to_vec()).await.unwrap();
        assert_eq!(kv.mod_revision, revision + 1);
    }

    /// Applies the same pseudo-random writes to both stores.
    async fn random_writes(stores: &[Arc<dyn Store>], n: usize, seed: u64) {
        let mut x = seed;
        let mut next = move || {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (x >> 33) as usize
        };
        for i in 0..n {
            let key = format!("/registry/{}/k{}", ["pods", "nodes"][next() % 2], next() % 12);
            let current = stores[0].get(&key).await.unwrap();
            let delete = next() % 3 == 0;
            for store in stores {
                match &current {
                    None => {
                        store.create(&key, format!("c{i}").into_bytes()).await.unwrap();
                    }
                    Some(kv) if delete => {
                        store.delete(&key, Some(kv.mod_revision)).await.unwrap();
                    }
                    Some(kv) => {
                        store
                            .update(&key, format!("u{i}").into_bytes(), kv.mod_revision)
                            .await
                            .unwrap();
                    }
                }
            }
        }
    }

    async fn assert_same_history(memory: &Arc<dyn Store>, disk: &Arc<dyn Store>, from: Revision) {
        let now = memory.current_revision().await.unwrap();
        assert_eq!(disk.current_revision().await.unwrap(), now);
        for prefix in ["", "/registry/pods/", "/registry/nodes/k1"] {
            for rev in from..=now {
                for (limit, start_after) in [(0, None), (3, Some("/registry/nodes/k3".to_owned()))] {
                    let opts = ListOptions {
                        revision: Some(rev),
                        limit,
                        start_after,
                    };
                    let m = memory.list(prefix, opts.clone()).await.unwrap();
                    let d = disk.list(prefix, opts).await.unwrap();
                    assert_eq!(d.items, m.items, "list {prefix:?} at {rev}");
                    assert_eq!(d.more, m.more, "list {prefix:?} at {rev}");
                }
            }
            for after in [from, (from + now) / 2] {
                let mut m = memory.watch(prefix, after).await.unwrap();
                let mut d = disk.watch(prefix, after).await.unwrap();
                let mut expected = Vec::new();
                while let Ok(Some(e)) = tokio::time::timeout(std::time::Duration::from_millis(50), m.next()).await {
                    expected.push(e);
                }
                assert!(!expected.is_empty());
                assert_eq!(take_events(&mut d, expected.len()).await, expected);
                assert_quiet(&mut d).await;
            }
        }
    }

    #[tokio::test]
    async fn disk_history_matches_memory() {
        let dir = tempfile::tempdir().unwrap();
        let memory: Arc<dyn Store> = MemoryStore::new();
        let disk: Arc<dyn Store> = open_in(&dir, tiny_window());
        random_writes(&[memory.clone(), disk.clone()], 150, 7).await;
        drop(disk);
        let disk: Arc<dyn Store> = open_in(&dir, tiny_window());
        assert_same_history(&memory, &disk, 1).await;
        memory.compact(60).await.unwrap();
        disk.compact(60).await.unwrap();
        random_writes(&[memory.clone(), disk.clone()], 50, 11).await;
        memory.compact(90).await.unwrap();
        disk.compact(90).await.unwrap();
        drop(disk);
        let disk: Arc<dyn Store> = open_in(&dir, tiny_window());
        assert_same_history(&memory, &disk, 90).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_creates_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = open_in(&dir, SqliteOptions::default());
        let tasks: Vec<_> = (0..64)
            .map(|t| {
                let store = store.clone();
                tokio::spawn(async move {
                    for i in 0..50 {
                        store
                            .create(&format!("/registry/pods/ns/p-{t:02}-{i:02}"), vec![t, i])
                            .await
                            .unwrap();
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        drop(store);
        let store = open_in(&dir, SqliteOptions::default());
        let all = store.list("/registry/pods/", ListOptions::default()).await.unwrap();
        assert_eq!(all.items.len(), 3200);
        assert_eq!(all.revision, 3200);
        assert_eq!(
            &store.get("/registry/pods/ns/p-63-49").await.unwrap().unwrap().value[..],
            [63, 49]
        );
    }

    /// Watches opened while writes are in flight, from revisions on disk and in
    /// the window, see every revision after their start exactly once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn watches_opened_during_writes_have_no_gaps_or_duplicates() {
        let (store, _dir) = fresh_with(SqliteOptions {
            event_window: 8,
            ..Default::default()
        });
        const WRITES: i64 = 400;
        let writers: Vec<_> = (0..4)
            .map(|t| {
                let store = store.clone();
                tokio::spawn(async move {
                    for i in 0..WRITES / 4 {
                        store.create(&format!("/c/{t}-{i}"), vec![]).await.unwrap();
                    }
                })
            })
            .collect();
        let mut watchers = Vec::new();
        for n in 0..40 {
            let now = store.current_revision().await.unwrap();
            let after = if n % 2 == 0 { now / 2 } else { now };
            watchers.push((after, store.watch("/c/", after).await.unwrap()));
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        for writer in writers {
            writer.await.unwrap();
        }
        for (after, mut stream) in watchers {
            let events = take_events(&mut stream, (WRITES - after) as usize).await;
            let revisions: Vec<_> = events.iter().map(Event::revision).collect();
            assert_eq!(revisions, ((after + 1)..=WRITES).collect::<Vec<_>>());
            assert_quiet(&mut stream).await;
        }
    }

    /// A failing commit fails every write of its batch and applies none of them;
    /// the writes of other batches stand.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn failed_commit_fails_the_whole_batch() {
        let dir = tempfile::tempdir().unwrap();
        drop(open_in(&dir, SqliteOptions::default()));
        Connection::open(dir.path().join("state.db"))
            .unwrap()
            .execute_batch(
                "CREATE TRIGGER fail_on_poison BEFORE INSERT ON kv WHEN NEW.name = '/poison'
                 BEGIN SELECT RAISE(ABORT, 'injected failure'); END;",
            )
            .unwrap();
        let store: Arc<dyn Store> = open_in(&dir, SqliteOptions::default());
        let mut watch = store.watch("", 0).await.unwrap();
        let tasks: Vec<_> = (0..200)
            .map(|i| {
                let store = store.clone();
                tokio::spawn(async move {
                    let key = if i % 50 == 25 {
                        "/poison".to_owned()
                    } else {
                        format!("/ok/{i:03}")
                    };
                    let result = store.create(&key, vec![]).await;
                    (key, result)
                })
            })
            .collect();
        let mut acked = Vec::new();
        let mut failed = 0;
        for task in tasks {
            match task.await.unwrap() {
                (key, Ok(kv)) => acked.push((kv.mod_revision, key)),
                (key, Err(StoreError::Backend(_))) => {
                    failed += 1;
                    assert_eq!(store.get(&key).await.unwrap(), None);
                }
                (key, Err(err)) => panic!("{key}: {err:?}"),
            }
        }
        assert!(failed >= 4, "the poisoned writes fail");
        assert!(acked.iter().all(|(_, k)| k != "/poison"));
        acked.sort();
        let revisions: Vec<_> = acked.iter().map(|(r, _)| *r).collect();
        assert_eq!(revisions, (1..=acked.len() as Revision).collect::<Vec<_>>());
        let events = take_events(&mut watch, acked.len()).await;
        assert_eq!(
            events
                .iter()
                .map(|e| (e.revision(), e.key().to_owned()))
                .collect::<Vec<_>>(),
            acked
        );
        assert_quiet(&mut watch).await;
        drop(watch);
        drop(store);
        let store = open_in(&dir, SqliteOptions::default());
        let listed = store.list("", ListOptions::default()).await.unwrap();
        assert_eq!(listed.revision, acked.len() as Revision);
        let mut keys: Vec<_> = listed.items.into_iter().map(|kv| kv.key).collect();
        let mut expected: Vec<_> = acked.into_iter().map(|(_, k)| k).collect();
        keys.sort();
        expected.sort();
        assert_eq!(keys, expected);
    }

    #[tokio::test]
    async fn slow_watcher_is_dropped_without_blocking_writers() {
        let (store, _dir) = fresh_with(SqliteOptions {
            watch_buffer: 4,
            ..Default::default()
        });
        let mut slow = store.watch("/s/", 0).await.unwrap();
        let mut fast = store.watch("/s/", 0).await.unwrap();
        for i in 0..10 {
            store.create(&format!("/s/{i}"), vec![]).await.unwrap();
            next_event(&mut fast).await;
        }
        let got: Vec<_> = slow.by_ref().collect().await;
        assert_eq!(got.len(), 4, "the buffered events, then the end");
        assert_eq!(got[3].revision(), 4);
        store.create("/s/more", vec![]).await.unwrap();
        assert_eq!(next_event(&mut fast).await.revision(), 11);
    }

    const KILL_DIR: &str = "SKIFF_STORE_KILL_TEST_DIR";

    /// The writer half of `acknowledged_writes_survive_kill_9`: writes until
    /// killed, printing each acknowledged key.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "run by acknowledged_writes_survive_kill_9 in a child process"]
    async fn kill_9_child() {
        let Ok(dir) = std::env::var(KILL_DIR) else {
            return;
        };
        let store = SqliteStore::open(&Path::new(&dir).join("state.db")).unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        for t in 0..32 {
            let store = store.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                for i in 0.. {
                    let key = format!("/k/{t}-{i}");
                    store.create(&key, vec![1; 256]).await.unwrap();
                    if tx.send(key).is_err() {
                        return;
                    }
                }
            });
        }
        let mut out = std::io::stdout().lock();
        while let Some(key) = rx.recv().await {
            writeln!(out, "ACK {key}").unwrap();
            out.flush().unwrap();
        }
    }

    #[test]
    fn acknowledged_writes_survive_kill_9() {
        let dir = tempfile::tempdir().unwrap();
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "sqlite::tests::kill_9_child", "--ignored", "--nocapture"])
            .env(KILL_DIR, dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut acked = Vec::new();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        for line in lines.by_ref() {
            if let Some(key) = line.unwrap().strip_prefix("ACK ") {
                acked.push(key.to_owned());
                if acked.len() == 3000 {
                    child.kill().unwrap(); // SIGKILL
                    break;
                }
            }
        }
        // Acknowledgements printed before the kill.
        for line in lines {
            let Ok(line) = line else { break };
            if let Some(key) = line.strip_prefix("ACK ") {
                acked.push(key.to_owned());
            }
        }
        child.wait().unwrap();
        assert!(acked.len() >= 3000, "child stopped early after {} writes", acked.len());
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let store = SqliteStore::open(&dir.path().join("state.db")).unwrap();
            for key in &acked {
                assert!(store.get(key).await.unwrap().is_some(), "{key} lost");
            }
            let all = store.list("/k/", ListOptions::default()).await.unwrap();
            assert!(all.items.len() >= acked.len());
            assert_eq!(all.revision, all.items.len() as Revision);
        });
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "benchmark: cargo test -p skiff-store -- --ignored bench_sqlite --nocapture"]
    async fn bench_sqlite_creates() {
        let (store, _dir) = fresh_with(SqliteOptions::default());
        let result = crate::bench::bench_creates(store.clone(), 10_000, 64).await;
        println!(
            "sqlite: 10000 creates, 64 clients: {:.0} creates/s, p50 {:.2} ms, p99 {:.2} ms, {} errors",
            result.creates_per_second, result.p50_ms, result.p99_ms, result.errors
        );
        assert_eq!(result.errors, 0);
        // One client: every create pays a whole commit (no batching to share it).
        let single = crate::bench::bench_creates(store, 500, 1).await;
        println!(
            "sqlite: 500 creates, 1 client: {:.0} creates/s, p50 {:.2} ms, p99 {:.2} ms",
            single.creates_per_second, single.p50_ms, single.p99_ms
        );
    }
}
