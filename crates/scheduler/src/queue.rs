//! The scheduling queue: an active heap (priority, then arrival), a backoff heap, and the
//! unschedulable pool whose pods cluster events move back to active.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::types::PodInfo;

/// How long a pod may sit in the unschedulable pool before it is retried anyway (upstream's
/// podMaxInUnschedulablePodsDuration).
pub const MAX_IN_UNSCHEDULABLE: Duration = Duration::from_secs(300);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pool {
    Active,
    Backoff,
    Unschedulable,
    InFlight,
}

/// A pod waiting to be scheduled, with its attempt history.
#[derive(Debug, Clone)]
pub struct QueuedPod {
    pub info: Arc<PodInfo>,
    pub attempts: u32,
    pub added: Instant,
    /// Plugins (bit per framework index) that rejected the pod in its last attempt.
    pub unschedulable_plugins: u64,
    backoff_until: Instant,
    unschedulable_since: Instant,
    /// Move-request counter when the pod was popped.
    popped_at_move: u64,
}

#[derive(Debug)]
struct Entry {
    pod: QueuedPod,
    pool: Pool,
    generation: u64,
}

#[derive(Debug, PartialEq, Eq)]
struct ActiveKey {
    priority: i32,
    seq: u64,
    uid: String,
    generation: u64,
}

impl Ord for ActiveKey {
    fn cmp(&self, other: &Self) -> Ordering {
        // Max-heap: higher priority first, then lower sequence (earlier) first.
        self.priority
            .cmp(&other.priority)
            .then_with(|| other.seq.cmp(&self.seq))
    }
}

impl PartialOrd for ActiveKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

#[derive(Debug)]
pub struct SchedulingQueue {
    entries: HashMap<String, Entry>,
    active: BinaryHeap<ActiveKey>,
    backoff: BinaryHeap<Reverse<(Instant, u64, String)>>,
    /// Uids that entered the unschedulable pool (may hold stale uids; checked on use).
    unschedulable_uids: HashSet<String>,
    seq: u64,
    generation: u64,
    move_requests: u64,
    initial_backoff: Duration,
    max_backoff: Duration,
}

impl SchedulingQueue {
    pub fn new(initial_backoff: Duration, max_backoff: Duration) -> Self {
        SchedulingQueue {
            entries: HashMap::new(),
            active: BinaryHeap::new(),
            backoff: BinaryHeap::new(),
            unschedulable_uids: HashSet::new(),
            seq: 0,
            generation: 0,
            move_requests: 0,
            initial_backoff,
            max_backoff,
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn contains(&self, uid: &str) -> bool {
        self.entries.contains_key(uid)
    }

    /// Pods waiting in the active heap, in backoff and in the unschedulable pool.
    pub fn pool_counts(&self) -> (usize, usize, usize) {
        let mut counts = (0, 0, 0);
        for e in self.entries.values() {
            match e.pool {
                Pool::Active => counts.0 += 1,
                Pool::Backoff => counts.1 += 1,
                Pool::Unschedulable => counts.2 += 1,
                Pool::InFlight => {}
            }
        }
        counts
    }

    pub fn num_unschedulable(&self) -> usize {
        self.unschedulable_uids
            .iter()
            .filter(|u| self.entries.get(*u).is_some_and(|e| e.pool == Pool::Unschedulable))
            .count()
    }

    fn push_active(&mut self, uid: &str) {
        let Some(e) = self.entries.get_mut(uid) else {
            return;
        };
        self.generation += 1;
        self.seq += 1;
        e.generation = self.generation;
        e.pool = Pool::Active;
        self.active.push(ActiveKey {
            priority: e.pod.info.priority,
            seq: self.seq,
            uid: uid.to_string(),
            generation: self.generation,
        });
    }

    fn push_backoff(&mut self, uid: &str) {
        let Some(e) = self.entries.get_mut(uid) else {
            return;
        };
        self.generation += 1;
        e.generation = self.generation;
        e.pool = Pool::Backoff;
        self.backoff
            .push(Reverse((e.pod.backoff_until, self.generation, uid.to_string())));
    }

    /// Adds a new pending pod or updates a queued one. An update that may change the
    /// scheduling outcome moves an unschedulable pod back to active.
    pub fn add_or_update(&mut self, info: Arc<PodInfo>, now: Instant) {
        let uid = info.uid.clone();
        match self.entries.get_mut(&uid) {
            None => {
                self.entries.insert(
                    uid.clone(),
                    Entry {
                        pod: QueuedPod {
                            info,
                            attempts: 0,
                            added: now,
                            unschedulable_plugins: 0,
                            backoff_until: now,
                            unschedulable_since: now,
                            popped_at_move: 0,
                        },
                        pool: Pool::Active,
                        generation: 0,
                    },
                );
                self.push_active(&uid);
            }
            Some(e) => {
                let changed = {
                    let old = &e.pod.info;
                    old.pod.spec != info.pod.spec || old.labels != info.labels
                };
                e.pod.info = info;
                if changed && e.pool == Pool::Unschedulable {
                    if e.pod.backoff_until <= now {
                        self.push_active(&uid);
                    } else {
                        self.push_backoff(&uid);
                    }
                }
            }
        }
    }

    pub fn delete(&mut self, uid: &str) -> Option<QueuedPod> {
        self.entries.remove(uid).map(|e| e.pod)
    }

    /// Pops the most important active pod and marks it in flight.
    pub fn pop(&mut self) -> Option<QueuedPod> {
        while let Some(k) = self.active.pop() {
            let Some(e) = self.entries.get_mut(&k.uid) else {
                continue;
            };
            if e.generation != k.generation || e.pool != Pool::Active {
                continue;
            }
            e.pool = Pool::InFlight;
            e.pod.attempts += 1;
            e.pod.popped_at_move = self.move_requests;
            return Some(e.pod.clone());
        }
        None
    }

    /// The pod was assumed onto a node: it leaves the queue.
    pub fn done(&mut self, uid: &str) {
        self.entries.remove(uid);
    }

    fn backoff_for(&self, attempts: u32) -> Duration {
        let mut d = self.initial_backoff;
        for _ in 1..attempts {
            d = d.saturating_mul(2);
            if d >= self.max_backoff {
                return self.max_backoff;
            }
        }
        d.min(self.max_backoff)
    }

    /// The pod did not fit. If the cluster changed while it was being scheduled it goes to
    /// backoff, otherwise to the unschedulable pool.
    pub fn unschedulable(&mut self, uid: &str, plugins: u64, now: Instant) {
        let moved = self.move_requests;
        let backoff = {
            let Some(e) = self.entries.get(uid) else {
                return;
            };
            self.backoff_for(e.pod.attempts)
        };
        let Some(e) = self.entries.get_mut(uid) else {
            return;
        };
        e.pod.unschedulable_plugins = plugins;
        e.pod.backoff_until = now + backoff;
        e.pod.unschedulable_since = now;
        if e.pod.popped_at_move != moved {
            self.push_backoff(uid);
        } else {
            self.generation += 1;
            e.generation = self.generation;
            e.pool = Pool::Unschedulable;
            self.unschedulable_uids.insert(uid.to_string());
        }
    }

    /// Re-adds a pod after an error (e.g. a failed binding): it waits out its backoff.
    pub fn requeue_with_backoff(&mut self, info: Arc<PodInfo>, now: Instant) {
        let uid = info.uid.clone();
        if !self.entries.contains_key(&uid) {
            self.add_or_update(info, now);
        }
        let backoff = self.backoff_for(self.entries.get(&uid).map(|e| e.pod.attempts.max(1)).unwrap_or(1));
        if let Some(e) = self.entries.get_mut(&uid) {
            e.pod.backoff_until = now + backoff;
        }
        self.push_backoff(&uid);
    }

    /// A cluster event that may help pods rejected by the plugins in `plugins_mask`:
    /// those pods go back to active at once.
    pub fn move_all(&mut self, plugins_mask: u64) -> usize {
        self.move_matching(plugins_mask, |_| true)
    }

    /// As `move_all`, for the pods the event concerns (upstream's QueueingHints: a claim's
    /// event concerns the pods that use the claim). Pods rejected by no plugin in particular
    /// move on any event.
    pub fn move_matching(&mut self, plugins_mask: u64, concerns: impl Fn(&PodInfo) -> bool) -> usize {
        self.move_requests += 1;
        let entries = &self.entries;
        self.unschedulable_uids
            .retain(|uid| entries.get(uid).is_some_and(|e| e.pool == Pool::Unschedulable));
        let uids: Vec<String> = self
            .unschedulable_uids
            .iter()
            .filter(|uid| {
                self.entries.get(*uid).is_some_and(|e| {
                    let plugins = e.pod.unschedulable_plugins;
                    plugins == 0 || (plugins & plugins_mask != 0 && concerns(&e.pod.info))
                })
            })
            .cloned()
            .collect();
        for uid in &uids {
            self.unschedulable_uids.remove(uid);
            self.push_active(uid);
        }
        uids.len()
    }

    pub fn uids(&self) -> impl Iterator<Item = &String> {
        self.entries.keys()
    }

    /// Moves pods whose backoff ended to active and, with `stale`, pods stuck too long in
    /// the unschedulable pool.
    pub fn flush(&mut self, now: Instant, stale: bool) {
        while let Some(Reverse((t, generation, uid))) = self.backoff.peek().cloned() {
            if t > now {
                break;
            }
            self.backoff.pop();
            if self
                .entries
                .get(&uid)
                .is_some_and(|e| e.generation == generation && e.pool == Pool::Backoff)
            {
                self.push_active(&uid);
            }
        }
        if !stale {
            return;
        }
        let stale: Vec<String> = self
            .unschedulable_uids
            .iter()
            .filter(|uid| {
                self.entries.get(*uid).is_some_and(|e| {
                    e.pool == Pool::Unschedulable
                        && now.duration_since(e.pod.unschedulable_since) >= MAX_IN_UNSCHEDULABLE
                })
            })
            .cloned()
            .collect();
        for uid in stale {
            self.unschedulable_uids.remove(&uid);
            self.push_active(&uid);
        }
    }

    /// When the earliest backoff ends.
    pub fn next_backoff(&self) -> Option<Instant> {
        self.backoff.peek().map(|Reverse((t, _, _))| *t)
    }

    pub fn has_active(&self) -> bool {
        !self.active.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::testutil::pod;

    fn info(name: &str, prio: i32) -> Arc<PodInfo> {
        let mut p = pod(name, "", "");
        p.spec.as_mut().unwrap().priority = Some(prio);
        Arc::new(PodInfo::new(p))
    }

    fn q() -> SchedulingQueue {
        SchedulingQueue::new(Duration::from_secs(1), Duration::from_secs(10))
    }

    #[test]
    fn priority_then_fifo() {
        let mut q = q();
        let now = Instant::now();
        q.add_or_update(info("a", 0), now);
        q.add_or_update(info("b", 10), now);
        q.add_or_update(info("c", 0), now);
        let order: Vec<String> = std::iter::from_fn(|| q.pop()).map(|p| p.info.name.clone()).collect();
        assert_eq!(order, vec!["b", "a", "c"]);
    }

    #[test]
    fn unschedulable_moves_back_on_matching_event() {
        let mut q = q();
        let now = Instant::now();
        q.add_or_update(info("a", 0), now);
        let p = q.pop().unwrap();
        q.unschedulable(&p.info.uid, 0b100, now);
        assert!(q.pop().is_none());
        assert_eq!(q.move_all(0b010), 0);
        assert!(q.pop().is_none());
        assert_eq!(q.move_all(0b100), 1);
        assert_eq!(q.pop().unwrap().attempts, 2);
    }

    #[test]
    fn hints_move_only_the_pods_an_event_concerns() {
        let mut q = q();
        let now = Instant::now();
        q.add_or_update(info("a", 0), now);
        q.add_or_update(info("b", 0), now);
        for _ in 0..2 {
            let p = q.pop().unwrap();
            q.unschedulable(&p.info.uid, 0b1, now);
        }
        assert_eq!(q.move_matching(0b1, |p| p.name == "b"), 1);
        assert_eq!(q.pop().unwrap().info.name, "b");
        assert!(q.pop().is_none());
        assert_eq!(q.move_matching(0b10, |_| true), 0);
        assert_eq!(q.move_matching(0b1, |_| true), 1);
    }

    #[test]
    fn event_during_cycle_goes_to_backoff() {
        let mut q = q();
        let now = Instant::now();
        q.add_or_update(info("a", 0), now);
        let p = q.pop().unwrap();
        q.move_all(u64::MAX);
        q.unschedulable(&p.info.uid, 1, now);
        assert!(q.pop().is_none());
        assert_eq!(q.next_backoff(), Some(now + Duration::from_secs(1)));
        q.flush(now + Duration::from_secs(1), true);
        assert!(q.pop().is_some());
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let q = q();
        assert_eq!(q.backoff_for(1), Duration::from_secs(1));
        assert_eq!(q.backoff_for(3), Duration::from_secs(4));
        assert_eq!(q.backoff_for(10), Duration::from_secs(10));
    }

    #[test]
    fn spec_update_requeues_unschedulable() {
        let mut q = q();
        let now = Instant::now();
        q.add_or_update(info("a", 0), now);
        let p = q.pop().unwrap();
        q.unschedulable(&p.info.uid, 1, now);
        // Same spec (e.g. our own status write): stays.
        q.add_or_update(info("a", 0), now + Duration::from_secs(2));
        assert!(q.pop().is_none());
        q.add_or_update(info("a", 5), now + Duration::from_secs(2));
        assert!(q.pop().is_some());
    }
}
