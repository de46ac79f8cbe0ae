//! The in-memory half shared by every backend: the latest value of each key,
//! a bounded window of recent events, and the live watchers.
//!
//! Invariants:
//! - `kvs` is the state at `revision`; every event with a revision greater than
//!   `window_floor` is in `window`, in revision order.
//! - Events are published to watchers under the same lock that applies them, so
//!   a watcher registered under that lock sees every later event exactly once.

use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;
use std::sync::Arc;

use futures::StreamExt;
use futures::stream::BoxStream;
use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use tokio::sync::mpsc;

use crate::{Event, KeyValue, ListOptions, ListResult, Result, Revision, StoreError};

/// Events kept in memory for watchers and lists at recent revisions.
pub const DEFAULT_EVENT_WINDOW: usize = 100_000;
/// Bytes of values the window may hold: on a disk-backed store, what falls out is read from
/// disk when a list or watch reaches it, so a burst of large writes (a 150,000-pod rollout writes
/// each pod several times) costs disk reads for late watchers rather than memory.
pub const DEFAULT_EVENT_WINDOW_BYTES: usize = 64 << 20;
/// Live events buffered per watcher before a slow watcher is dropped.
pub const DEFAULT_WATCH_BUFFER: usize = 10_000;

/// A write, as sent to a backend (alone, or as one of a [`crate::Store::txn`]).
#[derive(Debug)]
pub enum Op {
    Create {
        key: String,
        value: Vec<u8>,
    },
    Update {
        key: String,
        value: Vec<u8>,
        expected: Revision,
    },
    Delete {
        key: String,
        expected: Option<Revision>,
    },
}

impl Op {
    pub fn key(&self) -> &str {
        match self {
            Op::Create { key, .. } | Op::Update { key, .. } | Op::Delete { key, .. } => key,
        }
    }
}

/// Checks `op` against the key's `current` value and, if it holds, returns the
/// event it causes at `revision` and the value to hand back to the caller.
pub(crate) fn plan(current: Option<&KeyValue>, op: Op, revision: Revision) -> Result<(Event, KeyValue)> {
    match op {
        Op::Create { key, value } => {
            if current.is_some() {
                return Err(StoreError::AlreadyExists(key));
            }
            let kv = KeyValue {
                key,
                value: Arc::from(value),
                create_revision: revision,
                mod_revision: revision,
            };
            Ok((
                Event::Put {
                    kv: kv.clone(),
                    prev: None,
                },
                kv,
            ))
        }
        Op::Update { key, value, expected } => {
            let Some(cur) = current else {
                return Err(StoreError::NotFound(key));
            };
            if cur.mod_revision != expected {
                return Err(StoreError::Conflict {
                    key,
                    expected,
                    actual: cur.mod_revision,
                });
            }
            let kv = KeyValue {
                key,
                value: Arc::from(value),
                create_revision: cur.create_revision,
                mod_revision: revision,
            };
            Ok((
                Event::Put {
                    kv: kv.clone(),
                    prev: Some(cur.clone()),
                },
                kv,
            ))
        }
        Op::Delete { key, expected } => {
            let Some(cur) = current else {
                return Err(StoreError::NotFound(key));
            };
            if let Some(expected) = expected
                && cur.mod_revision != expected
            {
                return Err(StoreError::Conflict {
                    key,
                    expected,
                    actual: cur.mod_revision,
                });
            }
            let deleted = KeyValue {
                mod_revision: revision,
                ..cur.clone()
            };
            Ok((
                Event::Delete {
                    prev: cur.clone(),
                    revision,
                },
                deleted,
            ))
        }
    }
}

/// Checks the ops of a transaction in order against `current` (the value of a key before the
/// transaction), each seeing the ones before it, and returns their events and values at
/// consecutive revisions from `first`; the first op that does not hold fails them all.
pub(crate) fn plan_txn<'a>(
    current: impl Fn(&str) -> Option<&'a KeyValue>,
    ops: Vec<Op>,
    first: Revision,
) -> Result<Vec<(Event, KeyValue)>> {
    let mut written: std::collections::HashMap<String, Option<KeyValue>> = std::collections::HashMap::new();
    let mut out = Vec::with_capacity(ops.len());
    for (i, op) in ops.into_iter().enumerate() {
        let key = op.key().to_owned();
        let now = match written.get(&key) {
            Some(kv) => kv.as_ref(),
            None => current(&key),
        };
        let (event, kv) = plan(now, op, first + i as Revision)?;
        written.insert(key, after_event(&event).cloned());
        out.push((event, kv));
    }
    Ok(out)
}

/// The value of the event's key after the event.
pub(crate) fn after_event(event: &Event) -> Option<&KeyValue> {
    match event {
        Event::Put { kv, .. } => Some(kv),
        Event::Delete { .. } => None,
    }
}

/// The value of the event's key before the event.
fn before_event(event: &Event) -> Option<&KeyValue> {
    match event {
        Event::Put { prev, .. } => prev.as_ref(),
        Event::Delete { prev, .. } => Some(prev),
    }
}

/// The smallest string greater than every string starting with `prefix`
/// (`None`: no such bound, the prefix is empty or all `char::MAX`).
pub(crate) fn prefix_end(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let mut next = u32::from(last) + 1;
        if (0xD800..0xE000).contains(&next) {
            next = 0xE000;
        }
        if let Some(c) = char::from_u32(next) {
            chars.push(c);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

/// Where a list starts: keys under `prefix`, strictly after `start_after`.
fn start_bound<'a>(prefix: &'a str, start_after: Option<&'a str>) -> Bound<&'a str> {
    match start_after {
        Some(after) if after >= prefix => Bound::Excluded(after),
        _ => Bound::Included(prefix),
    }
}

fn in_range(key: &str, prefix: &str, start_after: Option<&str>) -> bool {
    key.starts_with(prefix) && start_after.is_none_or(|after| key > after)
}

struct Watcher {
    prefix: String,
    tx: mpsc::Sender<Event>,
}

/// Sizes of the in-memory structures.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    pub event_window: usize,
    /// Most bytes of written values in the window (see [`DEFAULT_EVENT_WINDOW_BYTES`]).
    pub event_window_bytes: usize,
    pub watch_buffer: usize,
    /// Events falling out of the window are gone for good (no disk behind
    /// them): raise the compaction point with the window.
    pub compact_with_window: bool,
}

pub(crate) struct Inner {
    kvs: BTreeMap<String, KeyValue>,
    revision: Revision,
    compacted: Revision,
    window: VecDeque<Event>,
    /// Bytes of the values the window's events wrote (a value also in `kvs` counts too).
    window_bytes: usize,
    window_floor: Revision,
    watchers: Vec<Watcher>,
    limits: Limits,
}

/// Bytes an event adds to the window: the value it wrote (a delete writes none; its previous
/// value is an earlier event's or was already counted in the live state).
fn event_bytes(event: &Event) -> usize {
    match event {
        Event::Put { kv, .. } => kv.value.len(),
        Event::Delete { .. } => 0,
    }
}

/// What a list needs after looking at memory.
pub(crate) enum ListPlan {
    Done(ListResult),
    /// The revision is older than the event window: read it from disk.
    Disk(Revision),
}

/// A registered watcher: events to send before the live ones.
pub(crate) struct Subscription {
    /// Revisions `(after, until]` must be read from disk first.
    pub disk: Option<(Revision, Revision)>,
    backlog: Vec<Event>,
    rx: mpsc::Receiver<Event>,
    after: Revision,
}

impl Subscription {
    /// The watch stream: `disk` events (those of `self.disk`), the backlog
    /// from the window, then live events.
    pub(crate) fn into_stream(self, disk: Vec<Event>) -> BoxStream<'static, Event> {
        let after = self.after;
        let live = futures::stream::unfold(
            self.rx,
            |mut rx| async move { rx.recv().await.map(|event| (event, rx)) },
        )
        .filter(move |event| futures::future::ready(event.revision() > after));
        futures::stream::iter(disk)
            .chain(futures::stream::iter(self.backlog))
            .chain(live)
            .boxed()
    }
}

impl Inner {
    pub(crate) fn get(&self, key: &str) -> Option<&KeyValue> {
        self.kvs.get(key)
    }

    pub(crate) fn revision(&self) -> Revision {
        self.revision
    }

    pub(crate) fn compacted(&self) -> Revision {
        self.compacted
    }

    /// Events held in memory for lists and watches at recent revisions.
    #[cfg(test)]
    pub(crate) fn window_len(&self) -> usize {
        self.window.len()
    }

    /// Events the window has room for without growing.
    #[cfg(test)]
    pub(crate) fn window_capacity(&self) -> usize {
        self.window.capacity()
    }

    /// Number of live keys.
    pub(crate) fn len(&self) -> usize {
        self.kvs.len()
    }

    /// Replaces everything with `kvs` at `revision` (a relist after the source's history was
    /// compacted past what was applied): the window restarts empty and every watcher's stream
    /// ends, so that its owner watches again and learns, from the compaction point, to relist.
    pub(crate) fn reset(&mut self, kvs: BTreeMap<String, KeyValue>, revision: Revision, compacted: Revision) {
        self.kvs = kvs;
        self.revision = revision;
        self.compacted = self.compacted.max(compacted);
        self.window.clear();
        self.window_bytes = 0;
        self.window_floor = revision;
        self.watchers.clear();
    }

    /// Applies committed events (in revision order, all newer than
    /// `revision`) and publishes them to watchers.
    pub(crate) fn apply(&mut self, events: Vec<Event>) {
        let Some(last) = events.last() else {
            return;
        };
        self.revision = last.revision();
        for event in &events {
            match event {
                Event::Put { kv, .. } => {
                    if let Some(slot) = self.kvs.get_mut(&kv.key) {
                        *slot = kv.clone();
                    } else {
                        self.kvs.insert(kv.key.clone(), kv.clone());
                    }
                }
                Event::Delete { prev, .. } => {
                    self.kvs.remove(&prev.key);
                }
            }
        }
        self.watchers.retain(|w| {
            for event in events.iter().filter(|e| e.key().starts_with(&w.prefix)) {
                match w.tx.try_send(event.clone()) {
                    Ok(()) => {}
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        tracing::warn!(
                            prefix = %w.prefix,
                            revision = event.revision(),
                            "watcher fell behind; ending its stream"
                        );
                        return false;
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => return false,
                }
            }
            !w.tx.is_closed()
        });
        self.window_bytes += events.iter().map(event_bytes).sum::<usize>();
        self.window.extend(events);
        let mut dropped = None;
        while self.window.len() > self.limits.event_window
            || (self.window_bytes > self.limits.event_window_bytes && self.window.len() > 1)
        {
            let Some(first) = self.window.pop_front() else {
                break;
            };
            self.window_bytes -= event_bytes(&first);
            dropped = Some(first.revision());
        }
        if let Some(revision) = dropped {
            self.window_floor = revision;
            if self.limits.compact_with_window {
                self.compacted = self.compacted.max(self.window_floor);
            }
        }
    }

    /// Moves the revision to `revision` when the source reports a change at it that carries no
    /// event of its own (a key of the backend's bookkeeping).
    pub(crate) fn advance(&mut self, revision: Revision) {
        self.revision = self.revision.max(revision);
    }

    /// Records a compaction and drops the events at or before it: no list or watch can reach
    /// them any more (a list at `revision` itself starts from the latest values and undoes only
    /// later events), so keeping them would only hold their values in memory.
    /// Returns how many events it dropped.
    pub(crate) fn set_compacted(&mut self, revision: Revision) -> usize {
        self.compacted = self.compacted.max(revision);
        let keep_from = self.window.partition_point(|e| e.revision() <= revision);
        for event in self.window.drain(..keep_from) {
            self.window_bytes -= event_bytes(&event);
        }
        // A VecDeque keeps its capacity: give back most of what a burst grew.
        if self.window.len() < self.window.capacity() / 4 {
            self.window.shrink_to(self.window.len() * 2);
        }
        self.window_floor = self.window_floor.max(revision);
        keep_from
    }

    /// Checks a requested revision against the compaction point and the present.
    pub(crate) fn check_revision(&self, revision: Revision) -> Result<()> {
        if revision < self.compacted {
            return Err(StoreError::Compacted {
                requested: revision,
                compacted: self.compacted,
            });
        }
        if revision > self.revision {
            return Err(StoreError::FutureRevision(revision));
        }
        Ok(())
    }

    pub(crate) fn list(&self, prefix: &str, opts: &ListOptions) -> Result<ListPlan> {
        let at = match opts.revision {
            Some(rev) if rev != self.revision => {
                self.check_revision(rev)?;
                if rev < self.window_floor {
                    return Ok(ListPlan::Disk(rev));
                }
                rev
            }
            _ => self.revision,
        };
        let start_after = opts.start_after.as_deref();
        let start = start_bound(prefix, start_after);
        let current = self
            .kvs
            .range::<str, _>((start, Bound::Unbounded))
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.as_str(), Some(v)));
        let limit = if opts.limit == 0 { usize::MAX } else { opts.limit };
        let mut items = Vec::new();
        let mut more = false;
        let mut push = |kv: &KeyValue| {
            if items.len() == limit {
                more = true;
                false
            } else {
                items.push(kv.clone());
                true
            }
        };
        if at == self.revision {
            for (_, kv) in current {
                if let Some(kv) = kv
                    && !push(kv)
                {
                    break;
                }
            }
        } else {
            // The value at `at` of every key changed since: the value before
            // its first later event. Merge that into the current state.
            let first_later = self.window.partition_point(|e| e.revision() <= at);
            let mut changed: BTreeMap<&str, Option<&KeyValue>> = BTreeMap::new();
            for event in self.window.range(first_later..) {
                if in_range(event.key(), prefix, start_after) {
                    changed.entry(event.key()).or_insert_with(|| before_event(event));
                }
            }
            let mut current = current.peekable();
            let mut changed = changed.into_iter().peekable();
            loop {
                let next = match (current.peek(), changed.peek()) {
                    (None, None) => break,
                    (Some(_), None) => current.next(),
                    (None, Some(_)) => changed.next(),
                    (Some((a, _)), Some((b, _))) => {
                        if a < b {
                            current.next()
                        } else {
                            if a == b {
                                current.next();
                            }
                            changed.next()
                        }
                    }
                };
                if let Some((_, Some(kv))) = next
                    && !push(kv)
                {
                    break;
                }
            }
        }
        Ok(ListPlan::Done(ListResult {
            items,
            revision: at,
            more,
        }))
    }

    /// Registers a watcher of `prefix` for events after `after`.
    pub(crate) fn subscribe(&mut self, prefix: &str, after: Revision) -> Result<Subscription> {
        if after < self.compacted {
            return Err(StoreError::Compacted {
                requested: after,
                compacted: self.compacted,
            });
        }
        let (tx, rx) = mpsc::channel(self.limits.watch_buffer.max(1));
        self.watchers.push(Watcher {
            prefix: prefix.to_owned(),
            tx,
        });
        let disk = (after < self.window_floor).then_some((after, self.window_floor));
        let from = self
            .window
            .partition_point(|e| e.revision() <= after.max(self.window_floor));
        let backlog = self
            .window
            .range(from..)
            .filter(|e| e.key().starts_with(prefix))
            .cloned()
            .collect();
        Ok(Subscription {
            disk,
            backlog,
            rx,
            after,
        })
    }
}

/// The shared state behind one lock.
pub(crate) struct State {
    inner: RwLock<Inner>,
}

impl State {
    /// State at `revision` holding `kvs`; the window starts empty, so history
    /// up to `revision` is only on disk.
    pub(crate) fn new(
        kvs: BTreeMap<String, KeyValue>,
        revision: Revision,
        compacted: Revision,
        limits: Limits,
    ) -> Self {
        State {
            inner: RwLock::new(Inner {
                kvs,
                revision,
                compacted,
                window: VecDeque::new(),
                window_bytes: 0,
                window_floor: revision,
                watchers: Vec::new(),
                limits,
            }),
        }
    }

    pub(crate) fn read(&self) -> RwLockReadGuard<'_, Inner> {
        self.inner.read()
    }

    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, Inner> {
        self.inner.write()
    }

    /// [`Inner::set_compacted`], then, with the lock released, the process's memory release
    /// hook if events were dropped: their values were most of what the writes held.
    pub(crate) fn set_compacted(&self, revision: Revision) {
        let dropped = self.write().set_compacted(revision);
        if dropped > 0 {
            crate::release_memory();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_increments_last_char() {
        assert_eq!(prefix_end("/registry/pods/").as_deref(), Some("/registry/pods0"));
        assert_eq!(prefix_end("a").as_deref(), Some("b"));
        assert_eq!(prefix_end(""), None);
        let max = char::MAX.to_string();
        assert_eq!(prefix_end(&format!("a{max}")).as_deref(), Some("b"));
        assert_eq!(prefix_end(&max), None);
        assert_eq!(prefix_end("\u{D7FF}").as_deref(), Some("\u{E000}"));
    }

    #[test]
    fn start_bound_respects_prefix() {
        assert_eq!(start_bound("/b/", Some("/a")), Bound::Included("/b/"));
        assert_eq!(start_bound("/b/", Some("/b/x")), Bound::Excluded("/b/x"));
        assert_eq!(start_bound("/b/", None), Bound::Included("/b/"));
    }
}
