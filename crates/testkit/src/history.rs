//! Histories of operations against a store or an API server, recorded by concurrent clients
//! while faults are injected, and a checker that says what in them breaks the guarantees a
//! Kubernetes API server gives over etcd:
//!
//! - no acknowledged write is lost: at the end each object holds its last acknowledged write,
//!   or a later one (written by a client that did not hear back);
//! - resourceVersions follow real time: a write acknowledged before another began has the
//!   smaller resourceVersion (they are etcd's global revisions), on one object and across all;
//! - a read begun after a write was acknowledged sees it or something later, on any replica;
//! - no value appears that no client wrote, or whose write was refused;
//! - a watch from resourceVersion `r` delivers every change after `r` once, in order, without
//!   gaps or duplicates, with the values and resourceVersions the writes were acknowledged
//!   with; a watch that ended with 410 Gone is followed by a relist and a new segment.
//!
//! Writes are told apart by their values, which the clients make unique (writer and sequence).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How a write or read ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Acknowledged, at this resourceVersion (for a read: what it saw, see [`Op::observed`]).
    Ok(u64),
    /// Refused: it did not happen (a 4xx answer such as 409 or 404).
    Failed(String),
    /// No answer (timeout, connection lost, 5xx): it may or may not have happened.
    Unknown(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    Create,
    Update,
    Read,
}

/// One operation on one object, with its invocation and completion times.
#[derive(Clone, Debug)]
pub struct Op {
    pub client: String,
    pub kind: OpKind,
    pub key: String,
    /// What a write wrote.
    pub value: Option<String>,
    /// What a successful read saw: None for NotFound, else the value and its resourceVersion.
    pub observed: Option<(String, u64)>,
    pub invoked: Duration,
    pub completed: Duration,
    pub outcome: Outcome,
}

/// How a watch segment ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SegmentEnd {
    /// Still open when the history was taken.
    Open,
    /// The connection ended or broke: the client watched again from its last resourceVersion.
    Broken,
    /// 410 Gone: the client relisted and started a new segment from the list.
    Gone,
}

/// One event a watch delivered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchEvent {
    pub kind: String,
    pub key: String,
    pub value: String,
    pub rv: u64,
}

/// One watch request: from `start` (exclusive), the events in the order they came.
#[derive(Clone, Debug)]
pub struct Segment {
    pub start: u64,
    pub events: Vec<WatchEvent>,
    pub end: SegmentEnd,
}

/// One client's watch over the keys, as the segments it opened one after another.
#[derive(Clone, Debug, Default)]
pub struct Watch {
    pub name: String,
    pub segments: Vec<Segment>,
}

/// Everything recorded, and the final state read once every fault was healed.
#[derive(Clone, Debug, Default)]
pub struct History {
    pub ops: Vec<Op>,
    pub watches: Vec<Watch>,
    /// Key -> (value, resourceVersion) from a final consistent list.
    pub final_state: BTreeMap<String, (String, u64)>,
}

/// A recorder shared by the clients of a test (clone it into each task).
#[derive(Clone)]
pub struct Recorder {
    start: Instant,
    ops: Arc<Mutex<Vec<Op>>>,
    watches: Arc<Mutex<Vec<Watch>>>,
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

impl Recorder {
    pub fn new() -> Recorder {
        Recorder {
            start: Instant::now(),
            ops: Arc::default(),
            watches: Arc::default(),
        }
    }

    /// The time since the recorder started (an operation's invocation time).
    pub fn now(&self) -> Duration {
        self.start.elapsed()
    }

    /// Records a write that was invoked at `invoked` and just completed.
    pub fn write(&self, client: &str, kind: OpKind, key: &str, value: &str, invoked: Duration, outcome: Outcome) {
        let op = Op {
            client: client.into(),
            kind,
            key: key.into(),
            value: Some(value.into()),
            observed: None,
            invoked,
            completed: self.now(),
            outcome,
        };
        self.ops.lock().unwrap().push(op);
    }

    /// Records a read invoked at `invoked` that just completed: `Ok(observed)` (None for
    /// NotFound) or the failure.
    pub fn read(&self, client: &str, key: &str, invoked: Duration, result: Result<Option<(String, u64)>, Outcome>) {
        let (observed, outcome) = match result {
            Ok(Some((value, rv))) => (Some((value, rv)), Outcome::Ok(rv)),
            Ok(None) => (None, Outcome::Ok(0)),
            Err(outcome) => (None, outcome),
        };
        let op = Op {
            client: client.into(),
            kind: OpKind::Read,
            key: key.into(),
            value: None,
            observed,
            invoked,
            completed: self.now(),
            outcome,
        };
        self.ops.lock().unwrap().push(op);
    }

    /// Adds a finished watch.
    pub fn watch(&self, watch: Watch) {
        self.watches.lock().unwrap().push(watch);
    }

    /// The history so far, with the final state.
    pub fn history(&self, final_state: BTreeMap<String, (String, u64)>) -> History {
        History {
            ops: self.ops.lock().unwrap().clone(),
            watches: self.watches.lock().unwrap().clone(),
            final_state,
        }
    }
}

/// Counts of what a history held (for a test's log and for "it did something" asserts).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub acknowledged: usize,
    pub failed: usize,
    pub unknown: usize,
    pub reads: usize,
    pub watch_events: usize,
    pub gone: usize,
}

impl History {
    pub fn summary(&self) -> Summary {
        let mut s = Summary::default();
        for op in &self.ops {
            match (op.kind, &op.outcome) {
                (OpKind::Read, Outcome::Ok(_)) => s.reads += 1,
                (OpKind::Read, _) => {}
                (_, Outcome::Ok(_)) => s.acknowledged += 1,
                (_, Outcome::Failed(_)) => s.failed += 1,
                (_, Outcome::Unknown(_)) => s.unknown += 1,
            }
        }
        for w in &self.watches {
            for seg in &w.segments {
                s.watch_events += seg.events.len();
                s.gone += usize::from(seg.end == SegmentEnd::Gone);
            }
        }
        s
    }

    /// Every violation found, one line each (empty: the history is consistent).
    pub fn check(&self) -> Vec<String> {
        let mut bad = Vec::new();
        let writes: Vec<&Op> = self.ops.iter().filter(|o| o.kind != OpKind::Read).collect();
        let acked: Vec<&Op> = writes
            .iter()
            .copied()
            .filter(|o| matches!(o.outcome, Outcome::Ok(_)))
            .collect();
        let rv = |o: &Op| match o.outcome {
            Outcome::Ok(rv) => rv,
            _ => 0,
        };
        // Writes by value; a value written twice would make the history ambiguous.
        let mut by_value: HashMap<&str, &Op> = HashMap::new();
        for w in &writes {
            let v = w.value.as_deref().unwrap_or_default();
            if by_value.insert(v, w).is_some() {
                bad.push(format!(
                    "value {v:?} written twice: the history cannot tell the writes apart"
                ));
            }
        }
        // Acknowledged resourceVersions are unique.
        let mut by_rv: HashMap<u64, &Op> = HashMap::new();
        for w in &acked {
            if let Some(other) = by_rv.insert(rv(w), w) {
                bad.push(format!(
                    "resourceVersion {} acknowledged twice: {:?} and {:?}",
                    rv(w),
                    other.value,
                    w.value
                ));
            }
        }
        // resourceVersions follow real time, across objects.
        let mut by_completion = acked.clone();
        by_completion.sort_by_key(|o| o.completed);
        let mut by_invocation = acked.clone();
        by_invocation.sort_by_key(|o| o.invoked);
        // For each write, the largest rv of the writes completed before it was invoked.
        let mut i = 0;
        let mut max_before: Option<&Op> = None;
        for w in &by_invocation {
            while i < by_completion.len() && by_completion[i].completed < w.invoked {
                if max_before.is_none_or(|m| rv(by_completion[i]) > rv(m)) {
                    max_before = Some(by_completion[i]);
                }
                i += 1;
            }
            if let Some(m) = max_before
                && rv(m) >= rv(w)
            {
                bad.push(format!(
                    "resourceVersion went back: {} {:?} at {} was acknowledged before {} {:?} began, which got {}",
                    m.key,
                    m.value,
                    rv(m),
                    w.key,
                    w.value,
                    rv(w)
                ));
            }
        }
        // What a value seen somewhere must be: written by someone, not refused, with the
        // resourceVersion its write was acknowledged with.
        let seen = |bad: &mut Vec<String>, place: &str, key: &str, value: &str, at: u64| match by_value.get(value) {
            None => bad.push(format!("{place}: {key}={value:?} at {at} was never written")),
            Some(w) if w.key != key => bad.push(format!("{place}: {value:?} seen on {key}, written to {}", w.key)),
            Some(w) => match &w.outcome {
                Outcome::Failed(why) => bad.push(format!(
                    "{place}: {key}={value:?} seen, but its write was refused ({why})"
                )),
                Outcome::Ok(r) if *r != at => bad.push(format!(
                    "{place}: {key}={value:?} seen at resourceVersion {at}, acknowledged at {r}"
                )),
                _ => {}
            },
        };
        // No acknowledged write lost.
        for w in &acked {
            let value = w.value.as_deref().unwrap_or_default();
            match self.final_state.get(&w.key) {
                None => bad.push(format!(
                    "lost write: {}={value:?} (resourceVersion {}) acknowledged, the object is gone at the end",
                    w.key,
                    rv(w)
                )),
                Some((v, r)) if *r < rv(w) || (*r == rv(w) && v != value) => bad.push(format!(
                    "lost write: {}={value:?} (resourceVersion {}) acknowledged, the end holds {v:?} at {r}",
                    w.key,
                    rv(w)
                )),
                _ => {}
            }
        }
        for (key, (value, r)) in &self.final_state {
            seen(&mut bad, "final state", key, value, *r);
        }
        // Reads see every write acknowledged before they began.
        let mut acked_by_key: HashMap<&str, Vec<&Op>> = HashMap::new();
        for w in &acked {
            acked_by_key.entry(&w.key).or_default().push(w);
        }
        for r in self.ops.iter().filter(|o| o.kind == OpKind::Read) {
            if !matches!(r.outcome, Outcome::Ok(_)) {
                continue;
            }
            let place = format!("read by {} at {:?}", r.client, r.invoked);
            if let Some((value, at)) = &r.observed {
                seen(&mut bad, &place, &r.key, value, *at);
            }
            let before = acked_by_key
                .get(r.key.as_str())
                .into_iter()
                .flatten()
                .filter(|w| w.completed < r.invoked)
                .max_by_key(|w| rv(w));
            if let Some(w) = before {
                match &r.observed {
                    None => bad.push(format!(
                        "stale read: {place} found no {} after {:?} was acknowledged at {}",
                        r.key,
                        w.value,
                        rv(w)
                    )),
                    Some((v, at)) if *at < rv(w) => bad.push(format!(
                        "stale read: {place} saw {}={v:?} at {at} after {:?} was acknowledged at {}",
                        r.key,
                        w.value,
                        rv(w)
                    )),
                    _ => {}
                }
            }
        }
        // Watches.
        let keys: HashSet<&str> = writes.iter().map(|w| w.key.as_str()).collect();
        let final_rv = self.final_state.values().map(|(_, r)| *r).max().unwrap_or(0);
        for watch in &self.watches {
            for (n, seg) in watch.segments.iter().enumerate() {
                let place = format!("watch {} segment {n} (from {})", watch.name, seg.start);
                let mut last = seg.start;
                let mut delivered: HashSet<u64> = HashSet::new();
                for e in &seg.events {
                    if !keys.contains(e.key.as_str()) {
                        continue;
                    }
                    if e.rv <= last {
                        bad.push(format!(
                            "{place}: {} {}={:?} at {} after {last}: out of order or duplicated",
                            e.kind, e.key, e.value, e.rv
                        ));
                    }
                    if !delivered.insert(e.rv) {
                        bad.push(format!("{place}: resourceVersion {} delivered twice", e.rv));
                    }
                    last = last.max(e.rv);
                    seen(&mut bad, &place, &e.key, &e.value, e.rv);
                }
                // The last segment must have caught up with the final state.
                let until = if n + 1 == watch.segments.len() {
                    if seg.end == SegmentEnd::Open && last < final_rv {
                        bad.push(format!(
                            "{place}: ended at {last}, short of the final resourceVersion {final_rv}"
                        ));
                    }
                    last.max(final_rv)
                } else {
                    last
                };
                // No gaps: every acknowledged write in (start, until] was delivered.
                for w in &acked {
                    let r = rv(w);
                    if r > seg.start && r <= until && !delivered.contains(&r) {
                        bad.push(format!(
                            "{place}: gap, {}={:?} acknowledged at {r} never delivered (segment ended at {last})",
                            w.key,
                            w.value.as_deref().unwrap_or_default()
                        ));
                    }
                }
                // A new segment continues where a broken one stopped.
                if let Some(next) = watch.segments.get(n + 1)
                    && seg.end == SegmentEnd::Broken
                    && next.start != last
                {
                    bad.push(format!(
                        "{place}: broke at {last}, the next segment started at {}",
                        next.start
                    ));
                }
            }
        }
        bad
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn write(kind: OpKind, key: &str, value: &str, from: u64, to: u64, outcome: Outcome) -> Op {
        Op {
            client: "w".into(),
            kind,
            key: key.into(),
            value: Some(value.into()),
            observed: None,
            invoked: ms(from),
            completed: ms(to),
            outcome,
        }
    }

    fn read(key: &str, from: u64, to: u64, observed: Option<(&str, u64)>) -> Op {
        Op {
            client: "r".into(),
            kind: OpKind::Read,
            key: key.into(),
            value: None,
            observed: observed.map(|(v, r)| (v.into(), r)),
            invoked: ms(from),
            completed: ms(to),
            outcome: Outcome::Ok(observed.map_or(0, |(_, r)| r)),
        }
    }

    fn ev(kind: &str, key: &str, value: &str, rv: u64) -> WatchEvent {
        WatchEvent {
            kind: kind.into(),
            key: key.into(),
            value: value.into(),
            rv,
        }
    }

    /// a created at 10, updated at 11; b created at 12; an update of b that timed out (and
    /// took effect at 13); a refused create.
    fn good() -> History {
        History {
            ops: vec![
                write(OpKind::Create, "a", "a1", 0, 10, Outcome::Ok(10)),
                write(OpKind::Update, "a", "a2", 11, 20, Outcome::Ok(11)),
                write(OpKind::Create, "b", "b1", 21, 22, Outcome::Ok(12)),
                write(OpKind::Update, "b", "b2", 23, 40, Outcome::Unknown("timeout".into())),
                write(
                    OpKind::Create,
                    "a",
                    "a3",
                    30,
                    31,
                    Outcome::Failed("AlreadyExists".into()),
                ),
                read("a", 21, 25, Some(("a2", 11))),
                read("b", 5, 8, None),
            ],
            watches: vec![Watch {
                name: "w".into(),
                segments: vec![
                    Segment {
                        start: 9,
                        events: vec![ev("ADDED", "a", "a1", 10)],
                        end: SegmentEnd::Broken,
                    },
                    Segment {
                        start: 10,
                        events: vec![ev("MODIFIED", "a", "a2", 11)],
                        end: SegmentEnd::Gone,
                    },
                    Segment {
                        start: 12,
                        events: vec![ev("MODIFIED", "b", "b2", 13)],
                        end: SegmentEnd::Open,
                    },
                ],
            }],
            final_state: [("a".into(), ("a2".into(), 11)), ("b".into(), ("b2".into(), 13))].into(),
        }
    }

    fn fails(h: &History, expect: &str) {
        let bad = h.check();
        assert!(
            bad.iter().any(|b| b.contains(expect)),
            "expected {expect:?} in {bad:#?}"
        );
    }

    #[test]
    fn a_consistent_history_passes() {
        let h = good();
        assert_eq!(h.check(), Vec::<String>::new());
        let s = h.summary();
        assert_eq!(
            (s.acknowledged, s.failed, s.unknown, s.reads, s.watch_events, s.gone),
            (3, 1, 1, 2, 3, 1)
        );
    }

    #[test]
    fn a_lost_write_fails() {
        let mut h = good();
        h.final_state.insert("a".into(), ("a1".into(), 10));
        fails(&h, "lost write: a=\"a2\"");
        let mut h = good();
        h.final_state.remove("b");
        fails(&h, "lost write: b=\"b1\"");
    }

    #[test]
    fn a_refused_or_unwritten_value_fails() {
        let mut h = good();
        h.final_state.insert("a".into(), ("a3".into(), 14));
        fails(&h, "its write was refused");
        let mut h = good();
        h.final_state.insert("a".into(), ("zz".into(), 14));
        fails(&h, "never written");
    }

    #[test]
    fn resource_versions_going_back_fail() {
        let mut h = good();
        // b's create began after a's update was acknowledged at 11, and got 9.
        h.ops[2].outcome = Outcome::Ok(9);
        fails(&h, "resourceVersion went back");
        let mut h = good();
        h.ops[2].outcome = Outcome::Ok(11);
        fails(&h, "acknowledged twice");
    }

    #[test]
    fn a_stale_read_fails() {
        let mut h = good();
        h.ops.push(read("a", 21, 25, Some(("a1", 10))));
        fails(&h, "stale read");
        let mut h = good();
        h.ops.push(read("b", 30, 31, None));
        fails(&h, "stale read: read by r");
    }

    #[test]
    fn a_watch_gap_fails() {
        let mut h = good();
        h.watches[0].segments[1].events.clear();
        h.watches[0].segments[1].events.push(ev("MODIFIED", "b", "b2", 13));
        fails(&h, "gap, a=\"a2\" acknowledged at 11");
        // The open segment has to reach the final state.
        let mut h = good();
        h.watches[0].segments[2].events.clear();
        fails(&h, "short of the final resourceVersion");
        // A broken segment must be resumed from its last resourceVersion.
        let mut h = good();
        h.watches[0].segments[1].start = 11;
        h.watches[0].segments[1].events.clear();
        fails(&h, "the next segment started at 11");
    }

    #[test]
    fn a_watch_duplicate_or_reorder_fails() {
        let mut h = good();
        h.watches[0].segments[1].events.push(ev("MODIFIED", "a", "a2", 11));
        fails(&h, "delivered twice");
        let mut h = good();
        h.watches[0].segments[0].events = vec![ev("ADDED", "a", "a1", 10), ev("ADDED", "a", "a1", 10)];
        fails(&h, "out of order or duplicated");
        let mut h = good();
        h.watches[0].segments[2].events = vec![ev("MODIFIED", "b", "b2", 13), ev("ADDED", "b", "b1", 12)];
        fails(&h, "out of order or duplicated");
    }

    #[test]
    fn a_watch_with_a_wrong_version_fails() {
        let mut h = good();
        h.watches[0].segments[1].events = vec![ev("MODIFIED", "a", "a2", 12)];
        fails(&h, "seen at resourceVersion 12, acknowledged at 11");
    }
}
