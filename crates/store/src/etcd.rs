//! The scale-out backend: etcd v3, as upstream's `storage/etcd3`.
//!
//! Keys: a store key `/registry/<rest>` is the etcd key `<prefix>/<rest>`, so the default prefix
//! `/registry` gives upstream's exact keys. Keys outside `/registry/` (tests use them) live under
//! `<prefix>/\x01`, and the store's own bookkeeping under `<prefix>/\0` (the marker below).
//!
//! Revisions are etcd's, counted from the revision at which this store first wrote to its prefix
//! (the marker's create revision), so an empty store starts at 0 as the other backends do.
//!
//! Every replica (one `EtcdStore` per API server) lists the prefix once, then keeps ONE etcd watch
//! from that revision feeding the in-memory state shared with the SQLite backend (latest values,
//! event window, watchers): gets, lists and watches are served from memory.
//!
//! Consistency: a read first asks etcd for its current revision (a linearizable count of the
//! marker key) and waits until the watch has applied it. Revisions taken by keys outside the
//! prefix never arrive through the watch: after a short wait the read checks, with two counts at
//! that revision, that nothing under the prefix changed since what memory holds (no key modified
//! later, as many keys) and then serves memory, or else reads etcd directly at that revision.
//! A write returns once its revision is applied locally (read-your-writes on one replica).
//!
//! The marker key `<prefix>/\0skiff` is written on first start; a prefix holding keys without it
//! is someone else's, and the store refuses to start. Each start touches the marker, so that a
//! prefix event sits exactly at the revision memory was loaded at (history reads end on it).
//!
//! Compaction follows upstream's `compact_rev_key` protocol: every interval each replica tries a
//! compare-and-swap on the key's version; the one that wins compacts etcd to the revision it saw
//! an interval earlier, the others learn the compacted revision from the key.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use async_trait::async_trait;
use futures::stream::BoxStream;
use skiff_etcd::{
    Certificate, Client, CompactionOptions, Compare, CompareOp, ConnectOptions, DeleteOptions, EventType, GetOptions,
    Identity, PutOptions, TlsOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use tokio::sync::watch as tokio_watch;

use crate::state::{self, Limits, ListPlan, Op, State};
use crate::{Event, KeyValue, ListOptions, ListResult, Result, Revision, Store, StoreError};

/// Upstream's key (at the root of etcd, shared by every API server on it) whose version counts
/// compactions and whose value is the revision last compacted to.
pub const COMPACT_REV_KEY: &str = "compact_rev_key";
/// Keys per page when reading ranges from etcd; halved when a page exceeds the 4 MiB response
/// limit of the client.
const PAGE: i64 = 1000;

/// Where and how to reach etcd.
#[derive(Clone, Debug)]
pub struct EtcdOptions {
    pub endpoints: Vec<String>,
    /// Prefix of every key in etcd (upstream's `--etcd-prefix`).
    pub prefix: String,
    pub ca_file: Option<std::path::PathBuf>,
    pub cert_file: Option<std::path::PathBuf>,
    pub key_file: Option<std::path::PathBuf>,
    /// How often compaction is attempted (zero: never, as upstream).
    pub compaction_interval: Duration,
    /// Recent events kept in memory for watchers and lists at recent revisions.
    pub event_window: usize,
    /// Most bytes of written values the window holds; older events are read from disk.
    pub event_window_bytes: usize,
    /// Live events buffered per watcher before a slow watcher is dropped.
    pub watch_buffer: usize,
    /// How long a read waits for the watch to catch up with etcd before checking etcd itself.
    pub sync_wait: Duration,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        EtcdOptions {
            endpoints: vec!["http://127.0.0.1:2379".into()],
            prefix: "/registry".into(),
            ca_file: None,
            cert_file: None,
            key_file: None,
            compaction_interval: Duration::from_secs(300),
            event_window: state::DEFAULT_EVENT_WINDOW,
            event_window_bytes: state::DEFAULT_EVENT_WINDOW_BYTES,
            watch_buffer: state::DEFAULT_WATCH_BUFFER,
            sync_wait: Duration::from_millis(100),
        }
    }
}

/// Maps store keys to etcd keys under the prefix and back.
#[derive(Clone, Debug)]
struct Keys {
    /// `<prefix>/`: the start of every etcd key of this store.
    root: Vec<u8>,
}

const REGISTRY: &str = "/registry/";
const RAW: u8 = 1;
const INTERNAL: u8 = 0;

impl Keys {
    fn new(prefix: &str) -> Keys {
        let mut root = prefix.trim_end_matches('/').as_bytes().to_vec();
        root.push(b'/');
        Keys { root }
    }

    fn encode(&self, key: &str) -> Result<Vec<u8>> {
        if key.bytes().any(|b| b == RAW || b == INTERNAL) {
            return Err(StoreError::Backend(anyhow::anyhow!(
                "key {key:?} holds a control character"
            )));
        }
        let mut out = self.root.clone();
        match key.strip_prefix(REGISTRY) {
            Some(rest) => out.extend_from_slice(rest.as_bytes()),
            None => {
                out.push(RAW);
                out.extend_from_slice(key.as_bytes());
            }
        }
        Ok(out)
    }

    /// The store key of an etcd key; `None` for the store's own keys and for what is not valid UTF-8.
    fn decode(&self, key: &[u8]) -> Option<String> {
        let rest = key.strip_prefix(&self.root[..])?;
        match rest.first() {
            Some(&INTERNAL) => None,
            Some(&RAW) => String::from_utf8(rest[1..].to_vec()).ok(),
            _ => {
                let rest = std::str::from_utf8(rest).ok()?;
                Some(format!("{REGISTRY}{rest}"))
            }
        }
    }

    fn marker(&self) -> Vec<u8> {
        let mut k = self.root.clone();
        k.push(INTERNAL);
        k.extend_from_slice(b"skiff");
        k
    }

    /// The etcd range holding every key of this store.
    fn all(&self) -> (Vec<u8>, Vec<u8>) {
        (self.root.clone(), range_end(&self.root))
    }

    /// An etcd range holding every key under the store prefix `prefix`, and whether etcd's order
    /// of it is the store's key order (only registry keys in it).
    fn range_of(&self, prefix: &str) -> (Vec<u8>, Vec<u8>, bool) {
        if prefix.starts_with(REGISTRY)
            && let Ok(start) = self.encode(prefix)
        {
            let end = range_end(&start);
            return (start, end, true);
        }
        let (start, end) = self.all();
        (start, end, false)
    }
}

/// The smallest key greater than every key starting with `prefix` (etcd's prefix range end).
fn range_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

fn backend(e: skiff_etcd::Error) -> StoreError {
    StoreError::Backend(anyhow::Error::new(e).context("etcd"))
}

fn is_compacted(e: &skiff_etcd::Error) -> bool {
    e.to_string().contains("required revision has been compacted")
}

fn is_future(e: &skiff_etcd::Error) -> bool {
    e.to_string().contains("required revision is a future revision")
}

fn is_too_large(e: &skiff_etcd::Error) -> bool {
    matches!(e, skiff_etcd::Error::GRpcStatus(s)
        if matches!(s.code(), tonic::Code::OutOfRange | tonic::Code::ResourceExhausted))
}

pub struct EtcdStore {
    client: Client,
    keys: Keys,
    /// Store revision = etcd revision - base.
    base: i64,
    state: Arc<State>,
    /// The etcd revision the state has applied (sent after each apply).
    applied: tokio_watch::Sender<i64>,
    watch_up: Arc<AtomicBool>,
    opts: EtcdOptions,
    /// Readers waiting for etcd's current revision (see [`revision_reader`]).
    revision_requests: tokio::sync::mpsc::UnboundedSender<RevisionWaiter>,
    /// Revision requests sent to etcd (each answers a batch of readers).
    revision_round_trips: Arc<std::sync::atomic::AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// One reader's wait for etcd's current revision (an error as its message: one answer goes to
/// every reader of a batch).
type RevisionWaiter = tokio::sync::oneshot::Sender<std::result::Result<i64, String>>;

/// Reads etcd's current revision for batches of readers: it takes the first waiting reader and
/// every other one already queued, sends one linearizable request and answers them all. A reader
/// only ever joins a request sent after it started waiting (never one already in flight, whose
/// answer could predate writes acknowledged before the reader began), so consistent reads stay
/// linearizable while many concurrent ones cost one round trip: upstream's consistent reads
/// from cache ask etcd per request, which under load is as many ReadIndex rounds as reads.
async fn revision_reader(
    client: Client,
    marker: Vec<u8>,
    mut requests: tokio::sync::mpsc::UnboundedReceiver<RevisionWaiter>,
    round_trips: Arc<std::sync::atomic::AtomicU64>,
) {
    let mut kv = client.kv_client();
    while let Some(first) = requests.recv().await {
        let mut batch = vec![first];
        while let Ok(more) = requests.try_recv() {
            batch.push(more);
        }
        round_trips.fetch_add(1, Ordering::Relaxed);
        let answer = read_revision(&mut kv, &marker).await;
        for waiter in batch {
            let _ = waiter.send(answer.clone());
        }
    }
}

/// etcd's current revision, linearizably (a count of the marker key). Retried a few times: a
/// member that went down or an election fails a request or two.
async fn read_revision(kv: &mut skiff_etcd::KvClient, marker: &[u8]) -> std::result::Result<i64, String> {
    let mut tries = 0;
    loop {
        match kv.get(marker, Some(GetOptions::new().with_count_only())).await {
            Ok(resp) => return Ok(resp.header().map_or(0, |h| h.revision())),
            Err(e) if tries < 3 => {
                tries += 1;
                tracing::debug!(error = %e, "asking etcd for its revision failed; trying again");
                tokio::time::sleep(Duration::from_millis(100 * tries)).await;
            }
            Err(e) => return Err(format!("etcd: {e}")),
        }
    }
}

impl Drop for EtcdStore {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// A replica's view of the data at one etcd revision: the state's keys and its revision.
struct Loaded {
    kvs: BTreeMap<String, KeyValue>,
    /// The etcd revision of the load (the marker's touch).
    revision: i64,
}

async fn connect(opts: &EtcdOptions) -> anyhow::Result<Client> {
    anyhow::ensure!(!opts.endpoints.is_empty(), "no etcd endpoints given");
    let mut connect = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(5))
        .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
        .with_keep_alive_while_idle(true);
    if opts.ca_file.is_some() || opts.cert_file.is_some() {
        let mut tls = TlsOptions::new();
        if let Some(ca) = &opts.ca_file {
            let pem = std::fs::read(ca).with_context(|| format!("read etcd CA file {}", ca.display()))?;
            tls = tls.ca_certificate(Certificate::from_pem(pem));
        }
        match (&opts.cert_file, &opts.key_file) {
            (Some(cert), Some(key)) => {
                let cert = std::fs::read(cert).with_context(|| format!("read etcd cert file {}", cert.display()))?;
                let key = std::fs::read(key).with_context(|| format!("read etcd key file {}", key.display()))?;
                tls = tls.identity(Identity::from_pem(cert, key));
            }
            (None, None) => {}
            _ => anyhow::bail!("--etcd-certfile and --etcd-keyfile go together"),
        }
        connect = connect.with_tls(tls);
    }
    Client::connect(&opts.endpoints, Some(connect))
        .await
        .with_context(|| format!("connect to etcd at {}", opts.endpoints.join(",")))
}

impl EtcdStore {
    /// Connects, checks the prefix is this store's (or empty), loads it and starts the watch.
    pub async fn open(opts: EtcdOptions) -> anyhow::Result<Arc<EtcdStore>> {
        let client = connect(&opts).await?;
        let keys = Keys::new(&opts.prefix);
        // A member that is down or an election fails a request now and then: try again for a while.
        let mut tries = 0;
        let (base, loaded, compacted) = loop {
            let attempt = async {
                let (base, created) = claim_prefix(&client, &keys, &opts.prefix).await?;
                let loaded = load(&client, &keys, base, created.then_some(base)).await?;
                // Read in the same attempt: the member that answered the load may be gone now.
                let compacted = read_compacted(&client).await?.map_or(0, |c| (c - base).max(0));
                anyhow::Ok((base, loaded, compacted))
            };
            match attempt.await {
                Ok(done) => break done,
                Err(e) if tries < 10 && e.downcast_ref::<Refused>().is_none() => {
                    tries += 1;
                    tracing::warn!(error = format!("{e:#}"), "opening the etcd store failed; trying again");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => return Err(e),
            }
        };
        let limits = Limits {
            event_window_bytes: opts.event_window_bytes.max(1),
            event_window: opts.event_window.max(1),
            watch_buffer: opts.watch_buffer,
            compact_with_window: false,
        };
        tracing::info!(
            endpoints = %opts.endpoints.join(","),
            prefix = %opts.prefix,
            keys = loaded.kvs.len(),
            revision = loaded.revision,
            base,
            "opened etcd store"
        );
        let state = Arc::new(State::new(loaded.kvs, loaded.revision - base, compacted, limits));
        let (applied, _) = tokio_watch::channel(loaded.revision);
        let watch_up = Arc::new(AtomicBool::new(false));
        let (revision_requests, requests) = tokio::sync::mpsc::unbounded_channel();
        let mut store = EtcdStore {
            client: client.clone(),
            keys: keys.clone(),
            base,
            state: state.clone(),
            applied: applied.clone(),
            watch_up: watch_up.clone(),
            opts: opts.clone(),
            revision_requests,
            revision_round_trips: Arc::default(),
            tasks: Vec::new(),
        };
        store.tasks.push(tokio::spawn(revision_reader(
            client.clone(),
            store.keys.marker(),
            requests,
            store.revision_round_trips.clone(),
        )));
        let watcher = Watcher {
            client: client.clone(),
            keys,
            base,
            state: state.clone(),
            applied,
            up: watch_up,
        };
        store.tasks.push(tokio::spawn(watcher.run()));
        // Ready once the watch is established (health reports a watch that is not).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !store.watch_up.load(Ordering::Acquire) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if !opts.compaction_interval.is_zero() {
            store
                .tasks
                .push(tokio::spawn(compactor(client, state, base, opts.compaction_interval)));
        }
        Ok(Arc::new(store))
    }

    fn kv(&self) -> skiff_etcd::KvClient {
        self.client.kv_client()
    }

    fn to_store(&self, rev: i64) -> Revision {
        rev - self.base
    }

    fn decode_kv(&self, kv: &skiff_etcd::KeyValue) -> Option<KeyValue> {
        let key = self.keys.decode(kv.key())?;
        Some(KeyValue {
            key,
            value: Arc::from(kv.value()),
            create_revision: kv.create_revision() - self.base,
            mod_revision: kv.mod_revision() - self.base,
        })
    }

    /// etcd's current revision, linearizably: through the revision reader, which answers every
    /// reader waiting when it sends its request with that one request.
    async fn etcd_revision(&self) -> Result<i64> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.revision_requests
            .send(tx)
            .map_err(|_| StoreError::Backend(anyhow::anyhow!("the etcd revision reader has stopped")))?;
        match rx.await {
            Ok(Ok(rev)) => Ok(rev),
            Ok(Err(e)) => Err(StoreError::Backend(anyhow::anyhow!(e))),
            Err(_) => Err(StoreError::Backend(anyhow::anyhow!(
                "the etcd revision reader has stopped"
            ))),
        }
    }

    fn applied(&self) -> i64 {
        *self.applied.borrow()
    }

    /// Waits until the state has applied etcd revision `rev`, at most `wait`.
    async fn wait_applied(&self, rev: i64, wait: Duration) -> bool {
        let mut rx = self.applied.subscribe();
        tokio::time::timeout(wait, rx.wait_for(|a| *a >= rev))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Makes memory fresh for a read: `Ok(None)` when memory may serve a read that must see
    /// every write etcd had acknowledged when the read began, `Ok(Some(rev))` when etcd must be
    /// read directly at `rev`.
    async fn sync(&self, wait: Duration) -> Result<Option<i64>> {
        let now = self.etcd_revision().await?;
        if self.applied() >= now || self.wait_applied(now, wait).await {
            return Ok(None);
        }
        // Behind: either the watch lags, or revisions went to keys outside the prefix.
        let (applied, count) = {
            let inner = self.state.read();
            (inner.revision() + self.base, inner.len())
        };
        if self.unchanged_between(applied, count, now).await? {
            let inner = self.state.read();
            if inner.revision() + self.base == applied || self.applied() >= now {
                return Ok(None);
            }
        }
        Ok(Some(now))
    }

    /// Whether the prefix at etcd revision `now` is what it was at `applied` (when memory held
    /// `count` keys): no key under it modified after `applied`, and as many keys. Every key at
    /// `now` then existed unchanged at `applied`, and none was removed.
    async fn unchanged_between(&self, applied: i64, count: usize, now: i64) -> Result<bool> {
        let (start, end) = self.keys.all();
        // Not count-only: etcd counts the range before it filters by modification revision,
        // so a count would be every key. One key modified after `applied`, if any, says it.
        let modified = GetOptions::new()
            .with_range(end.clone())
            .with_keys_only()
            .with_limit(1)
            .with_revision(now)
            .with_min_mod_revision(applied + 1);
        let all = GetOptions::new().with_range(end).with_count_only().with_revision(now);
        let txn = Txn::new().and_then([TxnOp::get(start.clone(), Some(modified)), TxnOp::get(start, Some(all))]);
        let resp = match self.kv().txn(txn).await {
            Ok(resp) => resp,
            Err(e) if is_compacted(&e) => return Ok(false),
            Err(e) => return Err(backend(e)),
        };
        let gets: Vec<(usize, i64)> = resp
            .op_responses()
            .into_iter()
            .filter_map(|r| match r {
                TxnOpResponse::Get(g) => Some((g.kvs().len(), g.count())),
                _ => None,
            })
            .collect();
        // The marker is the one key of the prefix memory does not hold.
        Ok(gets.len() == 2 && gets[0].0 == 0 && gets[1].1 == count as i64 + 1)
    }

    /// After a write at etcd revision `rev`: returns once memory holds it, or after a while
    /// (reads stay consistent without it: they fall back on etcd).
    async fn written(&self, rev: i64) {
        if !self.wait_applied(rev, Duration::from_secs(5)).await {
            tracing::warn!(revision = rev, "etcd watch slow to deliver a write");
        }
    }

    /// Reads keys under `prefix` from etcd at `rev` (paginated: any size), in store key order.
    async fn list_direct(&self, prefix: &str, opts: &ListOptions, rev: i64) -> Result<ListResult> {
        let (start, end, ordered) = self.keys.range_of(prefix);
        let limit = if opts.limit == 0 { usize::MAX } else { opts.limit };
        let mut from = start;
        if ordered
            && let Some(after) = &opts.start_after
            && after.as_str() >= prefix
        {
            let mut k = self.keys.encode(after)?;
            k.push(0);
            from = from.max(k);
        }
        let mut items = Vec::new();
        let mut page = PAGE;
        loop {
            let get = GetOptions::new()
                .with_range(end.clone())
                .with_revision(rev)
                .with_limit(page);
            let resp = match self.kv().get(from.clone(), Some(get)).await {
                Ok(resp) => resp,
                Err(e) if is_too_large(&e) && page > 1 => {
                    page = (page / 2).max(1);
                    continue;
                }
                Err(e) if is_compacted(&e) => {
                    return Err(StoreError::Compacted {
                        requested: self.to_store(rev),
                        compacted: self.state.read().compacted().max(self.to_store(rev) + 1),
                    });
                }
                Err(e) if is_future(&e) => return Err(StoreError::FutureRevision(self.to_store(rev))),
                Err(e) => return Err(backend(e)),
            };
            let kvs = resp.kvs();
            for kv in kvs {
                if let Some(kv) = self.decode_kv(kv)
                    && kv.key.starts_with(prefix)
                    && opts.start_after.as_ref().is_none_or(|a| &kv.key > a)
                {
                    items.push(kv);
                }
            }
            let Some(last) = kvs.last() else { break };
            if !resp.more() || (ordered && items.len() > limit) {
                break;
            }
            from = last.key().to_vec();
            from.push(0);
        }
        if !ordered {
            items.sort_by(|a, b| a.key.cmp(&b.key));
        }
        let more = items.len() > limit;
        items.truncate(limit);
        Ok(ListResult {
            items,
            revision: self.to_store(rev),
            more,
        })
    }

    /// Events under `prefix` in `(after, until]` (store revisions) from etcd's history. An
    /// event sits exactly at `until` (the window floor), which ends the read.
    async fn history(&self, prefix: &str, after: Revision, until: Revision) -> Result<Vec<Event>> {
        let (start, end) = self.keys.all();
        let options = WatchOptions::new()
            .with_range(end)
            .with_start_revision(after + self.base + 1)
            .with_prev_key();
        let mut stream = self
            .client
            .watch_client()
            .watch(start, Some(options))
            .await
            .map_err(backend)?;
        let until_etcd = until + self.base;
        let mut events = Vec::new();
        let read = async {
            loop {
                let Some(resp) = stream.message().await.map_err(backend)? else {
                    return Err(StoreError::Backend(anyhow::anyhow!("etcd ended a history watch")));
                };
                if resp.canceled() {
                    if resp.compact_revision() > 0 {
                        return Err(StoreError::Compacted {
                            requested: after,
                            compacted: self.to_store(resp.compact_revision()),
                        });
                    }
                    return Err(StoreError::Backend(anyhow::anyhow!(
                        "etcd canceled a history watch: {}",
                        resp.cancel_reason()
                    )));
                }
                let mut done = false;
                for e in resp.events() {
                    let Some(kv) = e.kv() else { continue };
                    if kv.mod_revision() > until_etcd {
                        done = true;
                        break;
                    }
                    if kv.mod_revision() == until_etcd {
                        done = true;
                    }
                    if let Some(event) = self.history_event(e)?
                        && event.key().starts_with(prefix)
                    {
                        events.push(event);
                    }
                }
                if done {
                    return Ok(());
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(60), read)
            .await
            .map_err(|_| StoreError::Backend(anyhow::anyhow!("reading etcd history timed out")))??;
        // Dropping the stream cancels the watch.
        drop(stream);
        Ok(events)
    }

    fn history_event(&self, e: &skiff_etcd::Event) -> Result<Option<Event>> {
        let Some(kv) = e.kv() else { return Ok(None) };
        let Some(key) = self.keys.decode(kv.key()) else {
            return Ok(None);
        };
        let prev = e.prev_kv().and_then(|p| self.decode_kv(p));
        Ok(Some(match e.event_type() {
            EventType::Put => Event::Put {
                kv: KeyValue {
                    key,
                    value: Arc::from(kv.value()),
                    create_revision: kv.create_revision() - self.base,
                    mod_revision: kv.mod_revision() - self.base,
                },
                prev: if kv.version() > 1 { prev } else { None },
            },
            EventType::Delete => Event::Delete {
                prev: prev.ok_or_else(|| {
                    StoreError::Backend(anyhow::anyhow!("etcd gave no previous value for the delete of {key}"))
                })?,
                revision: kv.mod_revision() - self.base,
            },
        }))
    }

    /// The error of the first op of a failed transaction, from the values etcd returned.
    fn txn_error(&self, ops: &[Op], current: &HashMap<String, KeyValue>) -> StoreError {
        for op in ops {
            let now = current.get(op.key());
            let failed = match op {
                Op::Create { key, .. } => now.is_some().then(|| StoreError::AlreadyExists(key.clone())),
                Op::Update { key, expected, .. }
                | Op::Delete {
                    key,
                    expected: Some(expected),
                } => match now {
                    None => Some(StoreError::NotFound(key.clone())),
                    Some(kv) if kv.mod_revision != *expected => Some(StoreError::Conflict {
                        key: key.clone(),
                        expected: *expected,
                        actual: kv.mod_revision,
                    }),
                    Some(_) => None,
                },
                Op::Delete { key, expected: None } => now.is_none().then(|| StoreError::NotFound(key.clone())),
            };
            if let Some(e) = failed {
                return e;
            }
        }
        StoreError::Backend(anyhow::anyhow!("etcd refused a transaction whose compares all hold"))
    }

    /// Runs `ops` as one etcd transaction (a compare per op).
    async fn run_txn(&self, ops: Vec<Op>) -> Result<Vec<KeyValue>> {
        let mut seen = HashSet::new();
        let mut compares = Vec::with_capacity(ops.len());
        let mut then = Vec::with_capacity(ops.len());
        let mut otherwise = Vec::with_capacity(ops.len());
        for op in &ops {
            if !seen.insert(op.key().to_owned()) {
                return Err(StoreError::Backend(anyhow::anyhow!(
                    "a transaction writes {} twice",
                    op.key()
                )));
            }
            let k = self.keys.encode(op.key())?;
            match op {
                Op::Create { value, .. } => {
                    compares.push(Compare::mod_revision(k.clone(), CompareOp::Equal, 0));
                    then.push(TxnOp::put(k.clone(), value.clone(), None));
                }
                Op::Update { value, expected, .. } => {
                    compares.push(Compare::mod_revision(k.clone(), CompareOp::Equal, expected + self.base));
                    then.push(TxnOp::put(
                        k.clone(),
                        value.clone(),
                        Some(PutOptions::new().with_prev_key()),
                    ));
                }
                Op::Delete { expected, .. } => {
                    compares.push(match expected {
                        Some(e) => Compare::mod_revision(k.clone(), CompareOp::Equal, e + self.base),
                        None => Compare::version(k.clone(), CompareOp::Greater, 0),
                    });
                    then.push(TxnOp::delete(k.clone(), Some(DeleteOptions::new().with_prev_key())));
                }
            }
            otherwise.push(TxnOp::get(k, None));
        }
        let txn = Txn::new().when(compares).and_then(then).or_else(otherwise);
        let resp = self.kv().txn(txn).await.map_err(backend)?;
        let rev = resp.header().map_or(0, |h| h.revision());
        let responses = resp.op_responses();
        if !resp.succeeded() {
            let mut current = HashMap::new();
            for r in responses {
                if let TxnOpResponse::Get(g) = r {
                    for kv in g.kvs() {
                        if let Some(kv) = self.decode_kv(kv) {
                            current.insert(kv.key.clone(), kv);
                        }
                    }
                }
            }
            return Err(self.txn_error(&ops, &current));
        }
        let mut out = Vec::with_capacity(ops.len());
        for (op, r) in ops.into_iter().zip(responses) {
            let kv = match (op, r) {
                (Op::Create { key, value }, _) => KeyValue {
                    key,
                    value: Arc::from(value),
                    create_revision: self.to_store(rev),
                    mod_revision: self.to_store(rev),
                },
                (Op::Update { key, value, .. }, TxnOpResponse::Put(p)) => KeyValue {
                    key,
                    value: Arc::from(value),
                    create_revision: p.prev_key().map_or(rev, |p| p.create_revision()) - self.base,
                    mod_revision: self.to_store(rev),
                },
                (Op::Delete { key, .. }, TxnOpResponse::Delete(d)) => {
                    let prev = d.prev_kvs().first().and_then(|p| self.decode_kv(p)).ok_or_else(|| {
                        StoreError::Backend(anyhow::anyhow!("etcd gave no previous value for the delete of {key}"))
                    })?;
                    KeyValue {
                        mod_revision: self.to_store(rev),
                        ..prev
                    }
                }
                (op, _) => {
                    return Err(StoreError::Backend(anyhow::anyhow!(
                        "etcd answered the write of {} with another kind of response",
                        op.key()
                    )));
                }
            };
            out.push(kv);
        }
        self.written(rev).await;
        Ok(out)
    }

    async fn write_one(&self, op: Op) -> Result<KeyValue> {
        self.run_txn(vec![op])
            .await?
            .pop()
            .ok_or_else(|| StoreError::Backend(anyhow::anyhow!("an empty transaction result")))
    }

    /// Compacts etcd to store revision `revision`.
    async fn compact_to(&self, revision: Revision, physical: bool) -> Result<()> {
        if revision <= self.state.read().compacted() {
            return Ok(());
        }
        let mut options = CompactionOptions::new();
        if physical {
            options = options.with_physical();
        }
        match self.kv().compact(revision + self.base, Some(options)).await {
            Ok(_) => {}
            Err(e) if is_compacted(&e) => {}
            Err(e) if is_future(&e) => return Err(StoreError::FutureRevision(revision)),
            Err(e) => return Err(backend(e)),
        }
        self.state.set_compacted(revision);
        Ok(())
    }
}

/// The prefix belongs to someone else.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Refused(String);

/// Claims the prefix for this store: refuses one holding keys without the marker, writes the
/// marker on first use. Returns the base revision (the marker's create revision) and whether
/// this call wrote it.
async fn claim_prefix(client: &Client, keys: &Keys, prefix: &str) -> anyhow::Result<(i64, bool)> {
    let mut kv = client.kv_client();
    let marker = kv
        .get(keys.marker(), None)
        .await
        .context("read the store marker in etcd")?;
    if let Some(m) = marker.kvs().first() {
        return Ok((m.create_revision(), false));
    }
    let (start, end) = keys.all();
    let existing = kv
        .get(
            start,
            Some(GetOptions::new().with_range(end).with_keys_only().with_limit(1)),
        )
        .await
        .context("look for keys under the etcd prefix")?;
    if let Some(first) = existing.kvs().first() {
        return Err(Refused(format!(
            "etcd prefix {prefix:?} already holds {} keys (such as {:?}) that this store did not write \
             (it has no marker key {:?}); refusing to use it: choose another --etcd-prefix or an etcd \
             that is Skiff's",
            existing.count(),
            String::from_utf8_lossy(first.key()),
            String::from_utf8_lossy(&keys.marker()),
        ))
        .into());
    }
    let txn = Txn::new()
        .when([Compare::create_revision(keys.marker(), CompareOp::Equal, 0)])
        .and_then([TxnOp::put(keys.marker(), b"skiff".to_vec(), None)])
        .or_else([TxnOp::get(keys.marker(), None)]);
    let resp = kv.txn(txn).await.context("write the store marker in etcd")?;
    if resp.succeeded() {
        return Ok((resp.header().map_or(0, |h| h.revision()), true));
    }
    for r in resp.op_responses() {
        if let TxnOpResponse::Get(g) = r
            && let Some(m) = g.kvs().first()
        {
            return Ok((m.create_revision(), false));
        }
    }
    anyhow::bail!("the store marker in etcd vanished while it was written")
}

/// Lists the prefix at a revision where a prefix event sits: `at` (the marker's creation), or
/// else a touch of the marker.
async fn load(client: &Client, keys: &Keys, base: i64, at: Option<i64>) -> anyhow::Result<Loaded> {
    let mut kv = client.kv_client();
    let revision = match at {
        Some(at) => at,
        None => {
            let touched = kv
                .put(keys.marker(), b"skiff".to_vec(), None)
                .await
                .context("touch the store marker in etcd")?;
            touched.header().map_or(0, |h| h.revision())
        }
    };
    let (mut from, end) = keys.all();
    let mut kvs = BTreeMap::new();
    let mut page = PAGE;
    loop {
        let get = GetOptions::new()
            .with_range(end.clone())
            .with_revision(revision)
            .with_limit(page);
        let resp = match kv.get(from.clone(), Some(get)).await {
            Ok(resp) => resp,
            Err(e) if is_too_large(&e) && page > 1 => {
                page = (page / 2).max(1);
                continue;
            }
            Err(e) => return Err(anyhow::Error::new(e).context("list the etcd prefix")),
        };
        for e in resp.kvs() {
            if let Some(key) = keys.decode(e.key()) {
                kvs.insert(
                    key.clone(),
                    KeyValue {
                        key,
                        value: Arc::from(e.value()),
                        create_revision: e.create_revision() - base,
                        mod_revision: e.mod_revision() - base,
                    },
                );
            }
        }
        match resp.kvs().last() {
            Some(last) if resp.more() => {
                from = last.key().to_vec();
                from.push(0);
            }
            _ => break,
        }
    }
    Ok(Loaded { kvs, revision })
}

/// The revision recorded by the last compaction (upstream's `compact_rev_key`), if any.
async fn read_compacted(client: &Client) -> anyhow::Result<Option<i64>> {
    let resp = client
        .kv_client()
        .get(COMPACT_REV_KEY, None)
        .await
        .context("read compact_rev_key")?;
    Ok(resp
        .kvs()
        .first()
        .and_then(|kv| std::str::from_utf8(kv.value()).ok()?.parse().ok()))
}

/// The one watch of a replica: applies every event under the prefix to the state.
struct Watcher {
    client: Client,
    keys: Keys,
    base: i64,
    state: Arc<State>,
    applied: tokio_watch::Sender<i64>,
    up: Arc<AtomicBool>,
}

enum WatchEnd {
    /// The stream broke: watch again from the last applied revision.
    Broken(String),
    /// The revision to continue from was compacted: relist.
    Compacted(i64),
}

impl Watcher {
    async fn run(self) {
        let mut backoff = Duration::from_millis(50);
        loop {
            match self.watch_once().await {
                WatchEnd::Broken(reason) => {
                    tracing::warn!(
                        reason,
                        applied = *self.applied.borrow(),
                        "etcd watch broke; watching again"
                    );
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
                WatchEnd::Compacted(compacted) => {
                    tracing::warn!(
                        applied = *self.applied.borrow(),
                        compacted,
                        "etcd compacted past the watch; relisting"
                    );
                    match load(&self.client, &self.keys, self.base, None).await {
                        Ok(loaded) => {
                            self.state
                                .write()
                                .reset(loaded.kvs, loaded.revision - self.base, compacted - self.base);
                            self.applied.send_replace(loaded.revision);
                            backoff = Duration::from_millis(50);
                        }
                        Err(e) => {
                            tracing::warn!(error = format!("{e:#}"), "relisting etcd failed");
                            tokio::time::sleep(backoff).await;
                            backoff = (backoff * 2).min(Duration::from_secs(2));
                        }
                    }
                }
            }
        }
    }

    async fn watch_once(&self) -> WatchEnd {
        let from = *self.applied.borrow() + 1;
        let (start, end) = self.keys.all();
        let options = WatchOptions::new().with_range(end).with_start_revision(from);
        let mut stream = match self.client.watch_client().watch(start, Some(options)).await {
            Ok(stream) => stream,
            Err(e) => return WatchEnd::Broken(e.to_string()),
        };
        let end = loop {
            let resp = match stream.message().await {
                Ok(Some(resp)) => resp,
                Ok(None) => break WatchEnd::Broken("the stream ended".into()),
                Err(e) => break WatchEnd::Broken(e.to_string()),
            };
            if resp.created() {
                self.up.store(true, Ordering::Release);
            }
            if resp.canceled() {
                if resp.compact_revision() > 0 {
                    break WatchEnd::Compacted(resp.compact_revision());
                }
                break WatchEnd::Broken(format!("canceled: {}", resp.cancel_reason()));
            }
            self.apply(resp.events());
        };
        self.up.store(false, Ordering::Release);
        end
    }

    fn apply(&self, events: &[skiff_etcd::Event]) {
        let Some(last) = events.iter().filter_map(|e| e.kv()).map(|kv| kv.mod_revision()).max() else {
            return;
        };
        {
            let mut inner = self.state.write();
            let mut pending: HashMap<String, Option<KeyValue>> = HashMap::new();
            let mut out = Vec::with_capacity(events.len());
            for e in events {
                let Some(kv) = e.kv() else { continue };
                let Some(key) = self.keys.decode(kv.key()) else {
                    continue;
                };
                let prev = match pending.get(&key) {
                    Some(p) => p.clone(),
                    None => inner.get(&key).cloned(),
                };
                let event = match e.event_type() {
                    EventType::Put => Event::Put {
                        kv: KeyValue {
                            key: key.clone(),
                            value: Arc::from(kv.value()),
                            create_revision: kv.create_revision() - self.base,
                            mod_revision: kv.mod_revision() - self.base,
                        },
                        prev,
                    },
                    EventType::Delete => match prev {
                        Some(prev) => Event::Delete {
                            prev,
                            revision: kv.mod_revision() - self.base,
                        },
                        None => {
                            tracing::warn!(key, "etcd deleted a key memory did not hold");
                            continue;
                        }
                    },
                };
                pending.insert(key, state::after_event(&event).cloned());
                out.push(event);
            }
            inner.apply(out);
            inner.advance(last - self.base);
        }
        self.applied.send_replace(last);
    }
}

/// Upstream's compactor: every interval, the replica whose compare-and-swap on
/// `compact_rev_key`'s version wins compacts etcd to the revision it saw one interval earlier;
/// every replica takes the compacted revision as the floor of its history.
async fn compactor(client: Client, state: Arc<State>, base: i64, interval: Duration) {
    let mut version = 0i64;
    let mut last_seen = 0i64;
    loop {
        tokio::time::sleep(interval).await;
        match compact_once(&client, version, last_seen).await {
            Ok((v, seen, compacted)) => {
                version = v;
                last_seen = seen;
                if let Some(c) = compacted
                    && c - base > 0
                {
                    state.set_compacted(c - base);
                }
            }
            Err(e) => tracing::warn!(error = format!("{e:#}"), "etcd compaction failed"),
        }
    }
}

/// One round of upstream's protocol: returns the key's version, etcd's current revision and the
/// revision compacted to (by this replica or another one), if known.
async fn compact_once(client: &Client, version: i64, rev: i64) -> anyhow::Result<(i64, i64, Option<i64>)> {
    let mut kv = client.kv_client();
    let txn = Txn::new()
        .when([Compare::version(COMPACT_REV_KEY, CompareOp::Equal, version)])
        .and_then([TxnOp::put(COMPACT_REV_KEY, rev.to_string(), None)])
        .or_else([TxnOp::get(COMPACT_REV_KEY, None)]);
    let resp = kv.txn(txn).await.context("compare-and-swap compact_rev_key")?;
    let current = resp.header().map_or(0, |h| h.revision());
    if !resp.succeeded() {
        for r in resp.op_responses() {
            if let TxnOpResponse::Get(g) = r
                && let Some(k) = g.kvs().first()
            {
                let compacted = std::str::from_utf8(k.value()).ok().and_then(|v| v.parse().ok());
                return Ok((k.version(), current, compacted));
            }
        }
        return Ok((version, current, None));
    }
    if rev == 0 {
        // No compaction on the first round (nothing seen an interval ago).
        return Ok((version + 1, current, None));
    }
    match kv.compact(rev, None).await {
        Ok(_) => {}
        Err(e) if is_compacted(&e) => {}
        Err(e) => return Err(anyhow::Error::new(e).context(format!("compact etcd to {rev}"))),
    }
    tracing::info!(revision = rev, "compacted etcd");
    Ok((version + 1, current, Some(rev)))
}

#[async_trait]
impl Store for EtcdStore {
    async fn create(&self, key: &str, value: Vec<u8>) -> Result<KeyValue> {
        self.write_one(Op::Create {
            key: key.to_owned(),
            value,
        })
        .await
    }

    async fn update(&self, key: &str, value: Vec<u8>, expected: Revision) -> Result<KeyValue> {
        self.write_one(Op::Update {
            key: key.to_owned(),
            value,
            expected,
        })
        .await
    }

    async fn delete(&self, key: &str, expected: Option<Revision>) -> Result<KeyValue> {
        self.write_one(Op::Delete {
            key: key.to_owned(),
            expected,
        })
        .await
    }

    async fn txn(&self, ops: Vec<Op>) -> Result<Vec<KeyValue>> {
        if ops.is_empty() {
            return Ok(Vec::new());
        }
        self.run_txn(ops).await
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        let k = self.keys.encode(key)?;
        match self.sync(self.opts.sync_wait).await? {
            None => Ok(self.state.read().get(key).cloned()),
            Some(rev) => {
                let resp = self
                    .kv()
                    .get(k, Some(GetOptions::new().with_revision(rev)))
                    .await
                    .map_err(backend)?;
                Ok(resp.kvs().first().and_then(|kv| self.decode_kv(kv)))
            }
        }
    }

    async fn get_cached(&self, key: &str) -> Result<Option<KeyValue>> {
        Ok(self.state.read().get(key).cloned())
    }

    async fn list_cached(&self, prefix: &str) -> Result<Vec<KeyValue>> {
        let plan = self.state.read().list(prefix, &ListOptions::default())?;
        match plan {
            ListPlan::Done(result) => Ok(result.items),
            ListPlan::Disk(_) => Ok(self.list(prefix, ListOptions::default()).await?.items),
        }
    }

    async fn list(&self, prefix: &str, opts: ListOptions) -> Result<ListResult> {
        match opts.revision {
            None => match self.sync(self.opts.sync_wait).await? {
                None => match self.state.read().list(prefix, &opts)? {
                    ListPlan::Done(result) => Ok(result),
                    ListPlan::Disk(rev) => Err(StoreError::Backend(anyhow::anyhow!(
                        "a current list reached history at {rev}"
                    ))),
                },
                Some(rev) => self.list_direct(prefix, &opts, rev).await,
            },
            Some(revision) => {
                let etcd_rev = revision + self.base;
                if self.applied() < etcd_rev {
                    let now = self.etcd_revision().await?;
                    if etcd_rev > now {
                        return Err(StoreError::FutureRevision(revision));
                    }
                    if !self.wait_applied(etcd_rev, self.opts.sync_wait).await {
                        let compacted = self.state.read().compacted();
                        if revision < compacted {
                            return Err(StoreError::Compacted {
                                requested: revision,
                                compacted,
                            });
                        }
                        return self.list_direct(prefix, &opts, etcd_rev).await;
                    }
                }
                let plan = self.state.read().list(prefix, &opts)?;
                match plan {
                    ListPlan::Done(result) => Ok(result),
                    ListPlan::Disk(rev) => self.list_direct(prefix, &opts, rev + self.base).await,
                }
            }
        }
    }

    async fn watch(&self, prefix: &str, after: Revision) -> Result<BoxStream<'static, Event>> {
        let sub = self.state.write().subscribe(prefix, after)?;
        let history = match sub.disk {
            Some((from, until)) => self.history(prefix, from, until).await?,
            None => Vec::new(),
        };
        Ok(sub.into_stream(history))
    }

    async fn current_revision(&self) -> Result<Revision> {
        match self.sync(self.opts.sync_wait).await? {
            None => Ok(self.state.read().revision()),
            Some(rev) => Ok(self.to_store(rev)),
        }
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        self.compact_to(revision, true).await
    }

    async fn compacted_revision(&self) -> Result<Revision> {
        Ok(self.state.read().compacted())
    }

    /// Compacts, then defragments every member, which rewrites its database file without the
    /// freed pages.
    async fn erase_history(&self, revision: Revision) -> Result<()> {
        if revision + self.base > self.etcd_revision().await? {
            return Err(StoreError::FutureRevision(revision));
        }
        self.compact_to(revision, true).await?;
        for endpoint in &self.opts.endpoints {
            let one = EtcdOptions {
                endpoints: vec![endpoint.clone()],
                ..self.opts.clone()
            };
            let mut client = connect(&one).await.map_err(StoreError::Backend)?;
            client.defragment().await.map_err(backend)?;
        }
        Ok(())
    }

    async fn health(&self) -> Result<()> {
        let wait = Duration::from_secs(2);
        let synced = tokio::time::timeout(Duration::from_secs(5), self.sync(wait))
            .await
            .map_err(|_| StoreError::Backend(anyhow::anyhow!("etcd did not answer within 5s")))??;
        if !self.watch_up.load(Ordering::Acquire) {
            return Err(StoreError::Backend(anyhow::anyhow!("the etcd watch is down")));
        }
        if synced.is_some() {
            return Err(StoreError::Backend(anyhow::anyhow!(
                "the etcd watch lags behind etcd's revision"
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_testkit::EtcdCluster;

    /// A store on a fresh one-member etcd (the suite counts revisions from an empty store).
    pub(super) async fn fresh() -> (Arc<dyn Store>, EtcdCluster) {
        let cluster = tokio::task::spawn_blocking(|| EtcdCluster::start(1)).await.unwrap();
        let store = EtcdStore::open(EtcdOptions {
            endpoints: cluster.endpoints(),
            compaction_interval: Duration::ZERO,
            ..Default::default()
        })
        .await
        .unwrap();
        (store, cluster)
    }

    mod conformance {
        crate::conformance::suite!(super::fresh().await);
    }

    #[test]
    fn keys_map_under_the_prefix() {
        let keys = Keys::new("/registry");
        assert_eq!(keys.encode("/registry/pods/ns/a").unwrap(), b"/registry/pods/ns/a");
        assert_eq!(keys.encode("/w/a").unwrap(), b"/registry/\x01/w/a");
        assert_eq!(
            keys.decode(b"/registry/pods/ns/a").as_deref(),
            Some("/registry/pods/ns/a")
        );
        assert_eq!(keys.decode(b"/registry/\x01/w/a").as_deref(), Some("/w/a"));
        assert_eq!(keys.decode(&keys.marker()), None);
        assert_eq!(keys.decode(b"/registryx/a"), None);
        let other = Keys::new("/skiff/");
        assert_eq!(other.encode("/registry/pods/ns/a").unwrap(), b"/skiff/pods/ns/a");
        assert_eq!(
            other.decode(b"/skiff/pods/ns/a").as_deref(),
            Some("/registry/pods/ns/a")
        );
        assert!(keys.encode("/a\0b").is_err());
        assert_eq!(range_end(b"/registry/"), b"/registry0");
    }
}

/// What only a shared store shows: several replicas on one 3-member cluster.
#[cfg(test)]
mod replicas {
    use std::sync::Mutex as StdMutex;

    use futures::StreamExt;
    use skiff_testkit::EtcdCluster;

    use super::*;
    use crate::conformance::{next_event, take_events};

    async fn cluster(n: usize) -> EtcdCluster {
        tokio::task::spawn_blocking(move || EtcdCluster::start(n))
            .await
            .unwrap()
    }

    async fn replica(endpoints: Vec<String>, prefix: &str) -> Arc<EtcdStore> {
        EtcdStore::open(EtcdOptions {
            endpoints,
            prefix: prefix.into(),
            compaction_interval: Duration::ZERO,
            ..Default::default()
        })
        .await
        .unwrap()
    }

    /// A write acknowledged by one replica is seen by the next read on the other, also when
    /// writes outside the prefix took the latest revisions (they never reach the watch).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_on_one_replica_is_read_on_the_other() {
        let etcd = cluster(3).await;
        let a = replica(etcd.endpoints(), "/registry").await;
        let b = replica(etcd.endpoints(), "/registry").await;
        let mut foreign = Client::connect(etcd.endpoints(), None).await.unwrap();
        for i in 0..100 {
            let key = format!("/registry/pods/ns/p{i}");
            let (w, r) = if i % 2 == 0 { (&a, &b) } else { (&b, &a) };
            let kv = w.create(&key, format!("v{i}").into_bytes()).await.unwrap();
            assert_eq!(r.get(&key).await.unwrap(), Some(kv.clone()), "write {i}");
            let listed = r.list("/registry/pods/", ListOptions::default()).await.unwrap();
            assert_eq!(listed.items.len(), i + 1);
            assert!(listed.revision >= kv.mod_revision);
            if i % 10 == 0 {
                foreign.put(format!("/elsewhere/{i}"), "x", None).await.unwrap();
                let updated = w.update(&key, b"u".to_vec(), kv.mod_revision).await.unwrap();
                foreign.put(format!("/elsewhere/{i}"), "y", None).await.unwrap();
                assert_eq!(r.get(&key).await.unwrap(), Some(updated.clone()));
                // Memory serves while only foreign keys move.
                assert!(r.get(&key).await.unwrap().is_some());
                let deleted = r.delete(&key, None).await.unwrap();
                assert_eq!(w.get(&key).await.unwrap(), None);
                w.create(&key, format!("v{i}").into_bytes()).await.unwrap();
                assert!(deleted.mod_revision > updated.mod_revision);
            }
        }
        // Both replicas watch the same history.
        let mut wa = a.watch("/registry/pods/", 0).await.unwrap();
        let mut wb = b.watch("/registry/pods/", 0).await.unwrap();
        let ea = take_events(&mut wa, 100).await;
        let eb = take_events(&mut wb, 100).await;
        assert_eq!(ea, eb);
    }

    /// Concurrent consistent reads share the revision requests they wait on, and each still sees
    /// every write acknowledged (by the other replica) before it began; cached reads see the
    /// replica's own writes at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_reads_share_revision_requests_and_stay_linearizable() {
        let etcd = cluster(3).await;
        let a = replica(etcd.endpoints(), "/registry").await;
        let b = replica(etcd.endpoints(), "/registry").await;
        for round in 0..20 {
            let key = format!("/registry/configmaps/ns/c{round}");
            let kv = a.create(&key, b"v".to_vec()).await.unwrap();
            assert_eq!(
                a.get_cached(&key).await.unwrap(),
                Some(kv.clone()),
                "own write, round {round}"
            );
            let reads: Vec<_> = (0..32)
                .map(|_| {
                    let b = b.clone();
                    let key = key.clone();
                    tokio::spawn(async move { b.get(&key).await })
                })
                .collect();
            for read in reads {
                assert_eq!(read.await.unwrap().unwrap(), Some(kv.clone()), "round {round}");
            }
        }
        let round_trips = b.revision_round_trips.load(Ordering::Relaxed);
        assert!(round_trips < 320, "640 reads took {round_trips} revision requests");
        let listed = b.list_cached("/registry/configmaps/").await.unwrap();
        assert_eq!(listed.len(), 20);
    }

    /// Read-modify-write loops on both replicas against the same keys lose no increment: the
    /// loser of each race gets a conflict and retries against the winner's value.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn conflicting_updates_from_two_replicas() {
        let etcd = cluster(3).await;
        let stores = [
            replica(etcd.endpoints(), "/registry").await,
            replica(etcd.endpoints(), "/registry").await,
        ];
        stores[0].create("/registry/counters/c", b"0".to_vec()).await.unwrap();
        let conflicts = Arc::new(StdMutex::new(0));
        let tasks: Vec<_> = (0..8)
            .map(|t| {
                let store = stores[t % 2].clone();
                let conflicts = conflicts.clone();
                tokio::spawn(async move {
                    for _ in 0..20 {
                        loop {
                            let kv = store.get("/registry/counters/c").await.unwrap().unwrap();
                            let n: u64 = std::str::from_utf8(&kv.value).unwrap().parse().unwrap();
                            match store
                                .update(
                                    "/registry/counters/c",
                                    (n + 1).to_string().into_bytes(),
                                    kv.mod_revision,
                                )
                                .await
                            {
                                Ok(_) => break,
                                Err(StoreError::Conflict { actual, .. }) => {
                                    assert!(actual > kv.mod_revision);
                                    *conflicts.lock().unwrap() += 1;
                                }
                                Err(e) => panic!("{e}"),
                            }
                        }
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        for store in &stores {
            let kv = store.get("/registry/counters/c").await.unwrap().unwrap();
            assert_eq!(&kv.value[..], b"160");
        }
        assert!(*conflicts.lock().unwrap() > 0, "the replicas raced");
    }

    /// More than the client's 4 MiB response limit: loaded, listed and listed at an old revision
    /// (read from etcd, paginated).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn lists_larger_than_a_response() {
        let etcd = cluster(1).await;
        let a = EtcdStore::open(EtcdOptions {
            endpoints: etcd.endpoints(),
            compaction_interval: Duration::ZERO,
            event_window: 4,
            ..Default::default()
        })
        .await
        .unwrap();
        let value = vec![b'x'; 200 * 1024];
        for i in 0..40 {
            a.create(&format!("/registry/configmaps/ns/c{i:02}"), value.clone())
                .await
                .unwrap();
        }
        let at = a.current_revision().await.unwrap();
        for i in 0..10 {
            a.delete(&format!("/registry/configmaps/ns/c{i:02}"), None)
                .await
                .unwrap();
        }
        let old = a
            .list(
                "/registry/configmaps/",
                ListOptions {
                    revision: Some(at),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(old.items.len(), 40);
        assert_eq!(old.revision, at);
        assert!(old.items.iter().all(|kv| kv.value.len() == value.len()));
        let paged = a
            .list(
                "/registry/configmaps/",
                ListOptions {
                    revision: Some(at),
                    limit: 25,
                    start_after: Some("/registry/configmaps/ns/c04".into()),
                },
            )
            .await
            .unwrap();
        assert_eq!(paged.items.len(), 25);
        assert!(paged.more);
        assert_eq!(paged.items[0].key, "/registry/configmaps/ns/c05");
        // A new replica loads all of it.
        let b = replica(etcd.endpoints(), "/registry").await;
        let now = b.list("/registry/configmaps/", ListOptions::default()).await.unwrap();
        assert_eq!(now.items.len(), 30);
        // A watch from before the window reads etcd's history.
        let mut w = b.watch("/registry/configmaps/", at).await.unwrap();
        let events = take_events(&mut w, 10).await;
        assert!(
            events
                .iter()
                .all(|e| matches!(e, Event::Delete { prev, .. } if prev.value.len() == value.len()))
        );
    }

    /// A replica whose watch breaks while etcd compacts past it relists: its watchers end, a
    /// watch from before gets `Compacted` (the API's 410), and a relist sees everything.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_watch_resumed_after_compaction_gets_compacted() {
        let mut etcd = cluster(3).await;
        // b talks to one follower only, a to the two others.
        let victim = (tokio::task::block_in_place(|| etcd.leader()) + 1) % 3;
        let others: Vec<String> = (0..3).filter(|&i| i != victim).map(|i| etcd.endpoint(i)).collect();
        let a = replica(others, "/registry").await;
        let b = replica(vec![etcd.endpoint(victim)], "/registry").await;
        let first = a.create("/registry/pods/ns/first", b"1".to_vec()).await.unwrap();
        assert!(b.get("/registry/pods/ns/first").await.unwrap().is_some());
        let mut live = b.watch("/registry/pods/", first.mod_revision).await.unwrap();
        tokio::task::block_in_place(|| etcd.kill(victim));
        let mut last = 0;
        for i in 0..20 {
            last = a
                .create(&format!("/registry/pods/ns/p{i}"), b"x".to_vec())
                .await
                .unwrap()
                .mod_revision;
        }
        a.compact(last).await.unwrap();
        tokio::task::block_in_place(|| {
            etcd.restart(victim);
            etcd.wait_healthy(Duration::from_secs(30));
        });
        // The watcher's stream ends once the replica relists (it gets no event it missed). The
        // replica first has to notice its only member died (keep-alive: up to 15 s) and reconnect
        // with backoff, which under a loaded machine takes longer than the 2 s it takes alone.
        let ended = tokio::time::timeout(Duration::from_secs(90), live.by_ref().collect::<Vec<_>>())
            .await
            .expect("the watch stream ends");
        assert!(ended.is_empty(), "{ended:?}");
        let err = b.watch("/registry/pods/", first.mod_revision).await.err().unwrap();
        assert!(matches!(err, StoreError::Compacted { .. }), "{err:?}");
        let relisted = b.list("/registry/pods/", ListOptions::default()).await.unwrap();
        assert_eq!(relisted.items.len(), 21);
        let mut again = b.watch("/registry/pods/", relisted.revision).await.unwrap();
        a.create("/registry/pods/ns/after", b"y".to_vec()).await.unwrap();
        assert_eq!(next_event(&mut again).await.key(), "/registry/pods/ns/after");
        assert!(b.health().await.is_ok());
    }

    /// kill -9 of the leader while two replicas write: every acknowledged write survives.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn killing_the_leader_loses_no_acknowledged_write() {
        let mut etcd = cluster(3).await;
        let stores = [
            replica(etcd.endpoints(), "/registry").await,
            replica(etcd.endpoints(), "/registry").await,
        ];
        let acked = Arc::new(StdMutex::new(Vec::new()));
        let failed = Arc::new(StdMutex::new(0usize));
        let stop = Arc::new(AtomicBool::new(false));
        let tasks: Vec<_> = (0..16)
            .map(|t| {
                let store = stores[t % 2].clone();
                let (acked, failed, stop) = (acked.clone(), failed.clone(), stop.clone());
                tokio::spawn(async move {
                    let mut i = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let key = format!("/registry/pods/ns/w{t}-{i}");
                        i += 1;
                        match store.create(&key, vec![t as u8; 64]).await {
                            Ok(_) => acked.lock().unwrap().push(key),
                            Err(StoreError::Backend(_)) => {
                                *failed.lock().unwrap() += 1;
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                            // A retried create that had committed.
                            Err(StoreError::AlreadyExists(_)) => {}
                            Err(e) => panic!("{e}"),
                        }
                    }
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let before = acked.lock().unwrap().len();
        let leader = tokio::task::block_in_place(|| etcd.leader());
        tokio::task::block_in_place(|| etcd.kill(leader));
        tokio::time::sleep(Duration::from_secs(4)).await;
        let during = acked.lock().unwrap().len();
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            t.await.unwrap();
        }
        assert!(before > 50, "writes went through before the kill ({before})");
        assert!(during > before, "writes went on after the kill");
        tokio::task::block_in_place(|| {
            etcd.restart(leader);
            etcd.wait_healthy(Duration::from_secs(30));
        });
        let fresh = replica(etcd.endpoints(), "/registry").await;
        let listed = fresh.list("/registry/pods/", ListOptions::default()).await.unwrap();
        let present: HashSet<String> = listed.items.into_iter().map(|kv| kv.key).collect();
        let acked = acked.lock().unwrap().clone();
        for key in acked.iter() {
            assert!(present.contains(key), "{key} lost");
            assert!(
                stores[0].get(key).await.unwrap().is_some(),
                "{key} not seen by a replica"
            );
        }
        println!(
            "{} acknowledged, {} failed during the election",
            acked.len(),
            failed.lock().unwrap()
        );
    }

    /// A prefix holding keys this store did not write is refused, with the reason.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn refuses_a_prefix_it_did_not_write() {
        let etcd = cluster(1).await;
        tokio::task::block_in_place(|| etcd.etcdctl(&["put", "/theirs/pods/ns/x", "{}"]));
        let err = EtcdStore::open(EtcdOptions {
            endpoints: etcd.endpoints(),
            prefix: "/theirs".into(),
            compaction_interval: Duration::ZERO,
            ..Default::default()
        })
        .await
        .err()
        .expect("refused");
        let msg = format!("{err:#}");
        assert!(
            msg.contains("refusing to use it") && msg.contains("/theirs/pods/ns/x"),
            "{msg}"
        );
        // Nothing was written there; an empty prefix next to it is taken, and taken again.
        assert_eq!(
            tokio::task::block_in_place(|| etcd.etcdctl(&["get", "--prefix", "--keys-only", "/theirs"])).trim(),
            "/theirs/pods/ns/x"
        );
        let mine = replica(etcd.endpoints(), "/mine").await;
        mine.create("/registry/pods/ns/a", b"{}".to_vec()).await.unwrap();
        drop(mine);
        let again = replica(etcd.endpoints(), "/mine").await;
        assert!(again.get("/registry/pods/ns/a").await.unwrap().is_some());
        assert_eq!(
            tokio::task::block_in_place(|| etcd.etcdctl(&["get", "/mine/pods/ns/a", "--print-value-only"])).trim(),
            "{}"
        );
    }

    /// Health fails once etcd is gone, and recovers with it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn health_follows_etcd() {
        let mut etcd = cluster(1).await;
        let store = replica(etcd.endpoints(), "/registry").await;
        store.health().await.unwrap();
        tokio::task::block_in_place(|| etcd.stop_all());
        assert!(store.health().await.is_err());
        tokio::task::block_in_place(|| etcd.start_all());
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while store.health().await.is_err() {
            assert!(std::time::Instant::now() < deadline, "health never recovered");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Revisions taken by keys outside the prefix (the compactor's compact_rev_key, another
    /// cluster's prefix) leave memory fresh: health passes and reads are served from memory,
    /// for as long as nothing under the prefix changes. (etcd counts a range before it applies
    /// min_mod_revision, so a count-only request cannot tell whether anything changed.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writes_outside_the_prefix_keep_memory_fresh() {
        let etcd = cluster(1).await;
        let store = replica(etcd.endpoints(), "/registry").await;
        store.create("/registry/a", b"1".to_vec()).await.unwrap();
        store.health().await.unwrap();
        let applied = store.applied();
        for i in 0..3 {
            store.kv().put(format!("/elsewhere/{i}"), "x", None).await.unwrap();
        }
        assert!(store.etcd_revision().await.unwrap() > applied);
        assert_eq!(store.sync(Duration::from_millis(100)).await.unwrap(), None);
        store.health().await.unwrap();
        // A change under the prefix the watch has not applied yet is still caught.
        let (applied, count) = {
            let inner = store.state.read();
            (inner.revision() + store.base, inner.len())
        };
        store.kv().put("/registry/b", "2", None).await.unwrap();
        let now = store.etcd_revision().await.unwrap();
        assert!(!store.unchanged_between(applied, count, now).await.unwrap());
    }

    /// Upstream's compactor: replicas take turns through compact_rev_key, and every replica's
    /// history floor follows.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn periodic_compaction_through_compact_rev_key() {
        let etcd = cluster(1).await;
        let open = || {
            EtcdStore::open(EtcdOptions {
                endpoints: etcd.endpoints(),
                compaction_interval: Duration::from_millis(700),
                ..Default::default()
            })
        };
        let (a, b) = (open().await.unwrap(), open().await.unwrap());
        let first = a.create("/registry/pods/ns/a", b"1".to_vec()).await.unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            a.create(&format!("/registry/events/ns/{}", std::process::id()), b"x".to_vec())
                .await
                .ok();
            let (ca, cb) = (
                a.compacted_revision().await.unwrap(),
                b.compacted_revision().await.unwrap(),
            );
            if ca > first.mod_revision && cb > first.mod_revision {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "no compaction: {ca} {cb}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let err = b.watch("/registry/pods/", first.mod_revision - 1).await.err().unwrap();
        assert!(matches!(err, StoreError::Compacted { .. }), "{err:?}");
        let version = tokio::task::block_in_place(|| etcd.etcdctl(&["get", "compact_rev_key", "-w", "json"]));
        assert!(version.contains("\"version\""), "{version}");
    }
}

#[cfg(test)]
mod bench {
    use super::*;

    /// `cargo test -p skiff-store --profile dist -- --ignored bench_etcd --nocapture`: creates through
    /// one replica on a local 3-member cluster, beside `etcdctl check perf` on the same cluster.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "benchmark"]
    async fn bench_etcd_creates() {
        let etcd = tokio::task::spawn_blocking(|| skiff_testkit::EtcdCluster::start(3))
            .await
            .unwrap();
        let store = EtcdStore::open(EtcdOptions {
            endpoints: etcd.endpoints(),
            compaction_interval: Duration::ZERO,
            ..Default::default()
        })
        .await
        .unwrap();
        let result = crate::bench::bench_creates(store, 10_000, 64).await;
        println!(
            "EtcdStore on etcd (3 members): 10000 creates, 64 clients: {:.0} creates/s, p50 {:.2} ms, p99 {:.2} ms, {} errors",
            result.creates_per_second, result.p50_ms, result.p99_ms, result.errors
        );
        // The same creates (a transaction comparing mod_revision to 0) straight to etcd.
        let client = Client::connect(etcd.endpoints(), None).await.unwrap();
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let started = std::time::Instant::now();
        let tasks: Vec<_> = (0..64)
            .map(|_| {
                let mut kv = client.kv_client();
                let next = next.clone();
                tokio::spawn(async move {
                    let mut lat = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= 10_000 {
                            return lat;
                        }
                        let key = format!("/raw/pods/bench/p{i}");
                        let t = std::time::Instant::now();
                        let txn = Txn::new()
                            .when([Compare::mod_revision(key.clone(), CompareOp::Equal, 0)])
                            .and_then([TxnOp::put(key, vec![b'x'; 64], None)]);
                        kv.txn(txn).await.unwrap();
                        lat.push(t.elapsed().as_secs_f64() * 1000.0);
                    }
                })
            })
            .collect();
        let mut lat = Vec::new();
        for t in tasks {
            lat.extend(t.await.unwrap());
        }
        let secs = started.elapsed().as_secs_f64();
        lat.sort_by(f64::total_cmp);
        println!(
            "raw etcd txn creates (3 members): 10000, 64 clients: {:.0} creates/s, p50 {:.2} ms, p99 {:.2} ms",
            10_000.0 / secs,
            lat[lat.len() / 2],
            lat[lat.len() * 99 / 100]
        );
        let perf = tokio::task::block_in_place(|| etcd.etcdctl(&["check", "perf", "--load=m"]));
        let summary: Vec<&str> = perf
            .lines()
            .filter(|l| l.contains("PASS") || l.contains("FAIL"))
            .collect();
        println!("etcdctl check perf --load=m: {}", summary.join("; "));
    }
}
