//! upstream's `EventCorrelator` (client-go `tools/record/events_cache.go`): what becomes of each
//! event before it is written. Three steps, in upstream's order:
//!
//! 1. Aggregation: events that differ only in their message (same source, object, type, reason
//!    and reporter) are counted per 10 minutes; from the 10th different message on, the event
//!    becomes one `(combined from similar events): MESSAGE` event keyed by the group.
//! 2. Deduplication: an event seen before (same key) is the same object again: its name and first
//!    timestamp, its count one more, written as a patch of count, lastTimestamp and message.
//! 3. The spam filter: a token bucket per source and object (25 events, then one per 5 minutes);
//!    events beyond it are skipped.
//!
//! Pure code: the caller gives the time.

use std::collections::HashSet;
use std::time::Duration;

use hashlink::LruCache;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

/// upstream's `maxLruCacheEntries`.
pub const MAX_LRU_CACHE_ENTRIES: usize = 4096;
/// upstream's `defaultAggregateMaxEvents`: similar events before they are combined.
pub const AGGREGATE_MAX_EVENTS: usize = 10;
/// upstream's `defaultAggregateIntervalInSeconds`.
pub const AGGREGATE_INTERVAL: Duration = Duration::from_secs(600);
/// upstream's `defaultSpamBurst` and `defaultSpamQPS`.
pub const SPAM_BURST: f64 = 25.0;
pub const SPAM_QPS: f64 = 1.0 / 300.0;
/// upstream's `EventAggregatorByReasonMessageFunc` prefix.
pub const COMBINED_PREFIX: &str = "(combined from similar events): ";

/// What to write for one event.
#[derive(Clone, Debug, PartialEq)]
pub enum Correlated {
    /// A new Event object.
    Create(Event),
    /// An Event written before, again: the patch (merge patch of count, lastTimestamp, message)
    /// and the whole event, created as it is should the old one be gone.
    Patch { event: Event, patch: serde_json::Value },
    /// Filtered as spam: nothing is written.
    Skip,
}

struct TokenBucket {
    tokens: f64,
    last: Timestamp,
}

struct AggregateRecord {
    local_keys: HashSet<String>,
    last: Timestamp,
}

struct EventLog {
    count: i32,
    first_timestamp: Option<Time>,
    name: String,
}

pub struct EventCorrelator {
    spam: LruCache<String, TokenBucket>,
    aggregates: LruCache<String, AggregateRecord>,
    logs: LruCache<String, EventLog>,
}

impl Default for EventCorrelator {
    fn default() -> Self {
        Self::new()
    }
}

fn source(event: &Event) -> (&str, &str) {
    let s = event.source.as_ref();
    (
        s.and_then(|s| s.component.as_deref()).unwrap_or(""),
        s.and_then(|s| s.host.as_deref()).unwrap_or(""),
    )
}

/// upstream's `getSpamKey`: source and involved object.
fn spam_key(e: &Event) -> String {
    let (component, host) = source(e);
    let o = &e.involved_object;
    [
        component,
        host,
        o.kind.as_deref().unwrap_or(""),
        o.namespace.as_deref().unwrap_or(""),
        o.name.as_deref().unwrap_or(""),
        o.uid.as_deref().unwrap_or(""),
        o.api_version.as_deref().unwrap_or(""),
    ]
    .join("")
}

/// upstream's `getEventKey`: source, involved object (with its field path), type, reason, message.
pub fn event_key(e: &Event) -> String {
    let (component, host) = source(e);
    let o = &e.involved_object;
    [
        component,
        host,
        o.kind.as_deref().unwrap_or(""),
        o.namespace.as_deref().unwrap_or(""),
        o.name.as_deref().unwrap_or(""),
        o.field_path.as_deref().unwrap_or(""),
        o.uid.as_deref().unwrap_or(""),
        o.api_version.as_deref().unwrap_or(""),
        e.type_.as_deref().unwrap_or(""),
        e.reason.as_deref().unwrap_or(""),
        e.message.as_deref().unwrap_or(""),
    ]
    .join("")
}

/// upstream's `EventAggregatorByReasonFunc`: the group (all but the message) and the message.
fn aggregate_key(e: &Event) -> (String, String) {
    let (component, host) = source(e);
    let o = &e.involved_object;
    let key = [
        component,
        host,
        o.kind.as_deref().unwrap_or(""),
        o.namespace.as_deref().unwrap_or(""),
        o.name.as_deref().unwrap_or(""),
        o.uid.as_deref().unwrap_or(""),
        o.api_version.as_deref().unwrap_or(""),
        e.type_.as_deref().unwrap_or(""),
        e.reason.as_deref().unwrap_or(""),
        e.reporting_component.as_deref().unwrap_or(""),
        e.reporting_instance.as_deref().unwrap_or(""),
    ]
    .join("");
    (key, e.message.clone().unwrap_or_default())
}

fn elapsed(since: Timestamp, now: Timestamp) -> Duration {
    Duration::try_from(now.duration_since(since)).unwrap_or(Duration::ZERO)
}

impl EventCorrelator {
    pub fn new() -> Self {
        Self::with_capacity(MAX_LRU_CACHE_ENTRIES)
    }

    pub fn with_capacity(entries: usize) -> Self {
        let entries = entries.max(1);
        EventCorrelator {
            spam: LruCache::new(entries),
            aggregates: LruCache::new(entries),
            logs: LruCache::new(entries),
        }
    }

    /// upstream's `EventCorrelate`.
    pub fn correlate(&mut self, event: Event, now: Timestamp) -> Correlated {
        let (event, key) = self.aggregate(event, now);
        let (event, patch) = self.observe(event, key);
        if self.filtered(&event, now) {
            return Correlated::Skip;
        }
        match patch {
            Some(patch) => Correlated::Patch { event, patch },
            None => Correlated::Create(event),
        }
    }

    /// upstream's `UpdateState`: remembers an event as written (after a successful write).
    pub fn update_state(&mut self, event: &Event) {
        self.logs.insert(
            event_key(event),
            EventLog {
                count: event.count.unwrap_or(1),
                first_timestamp: event.first_timestamp.clone(),
                name: event.metadata.name.clone().unwrap_or_default(),
            },
        );
    }

    /// upstream's `EventAggregate`: the event to record and its cache key.
    fn aggregate(&mut self, event: Event, now: Timestamp) -> (Event, String) {
        let (group, local) = aggregate_key(&event);
        let stale = self
            .aggregates
            .get(&group)
            .is_none_or(|r| elapsed(r.last, now) > AGGREGATE_INTERVAL);
        if stale {
            self.aggregates.insert(
                group.clone(),
                AggregateRecord {
                    local_keys: HashSet::new(),
                    last: now,
                },
            );
        }
        let Some(record) = self.aggregates.get_mut(&group) else {
            let key = event_key(&event);
            return (event, key);
        };
        record.local_keys.insert(local);
        record.last = now;
        if record.local_keys.len() < AGGREGATE_MAX_EVENTS {
            let key = event_key(&event);
            return (event, key);
        }
        // The set never grows past the maximum.
        if let Some(any) = record.local_keys.iter().next().cloned() {
            record.local_keys.remove(&any);
        }
        let name = event.involved_object.name.clone().unwrap_or_default();
        let combined = Event {
            metadata: ObjectMeta {
                name: Some(format!("{name}.{:x}", now.as_nanosecond())),
                namespace: event.metadata.namespace.clone(),
                ..Default::default()
            },
            count: Some(1),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            message: Some(format!("{COMBINED_PREFIX}{}", event.message.as_deref().unwrap_or(""))),
            involved_object: event.involved_object,
            type_: event.type_,
            reason: event.reason,
            source: event.source,
            // Skiff keeps who reports it, so the combined event reads as its parts do.
            reporting_component: event.reporting_component,
            reporting_instance: event.reporting_instance,
            action: event.action,
            ..Default::default()
        };
        (combined, group)
    }

    /// upstream's `eventObserve`: a repeat takes the first occurrence's name and first
    /// timestamp, one more count, and is written as a patch.
    fn observe(&mut self, mut event: Event, key: String) -> (Event, Option<serde_json::Value>) {
        let mut patch = None;
        if let Some(last) = self.logs.get(&key).filter(|l| l.count > 0) {
            event.metadata.name = Some(last.name.clone());
            event.first_timestamp = last.first_timestamp.clone();
            event.count = Some(last.count.saturating_add(1));
            patch = Some(serde_json::json!({
                "count": event.count,
                "lastTimestamp": event.last_timestamp,
                "message": event.message,
            }));
        }
        self.logs.insert(
            key,
            EventLog {
                count: event.count.unwrap_or(1),
                first_timestamp: event.first_timestamp.clone(),
                name: event.metadata.name.clone().unwrap_or_default(),
            },
        );
        (event, patch)
    }

    /// upstream's `EventSourceObjectSpamFilter.Filter`: `true` when the event is to be skipped.
    fn filtered(&mut self, event: &Event, now: Timestamp) -> bool {
        let key = spam_key(event);
        if self.spam.get(&key).is_none() {
            self.spam.insert(
                key.clone(),
                TokenBucket {
                    tokens: SPAM_BURST,
                    last: now,
                },
            );
        }
        let Some(bucket) = self.spam.get_mut(&key) else {
            return false;
        };
        let refill = elapsed(bucket.last, now).as_secs_f64() * SPAM_QPS;
        bucket.tokens = (bucket.tokens + refill).min(SPAM_BURST);
        bucket.last = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            false
        } else {
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{EventSource, ObjectReference};

    fn event(object: &str, reason: &str, message: &str, now: Timestamp) -> Event {
        Event {
            metadata: ObjectMeta {
                name: Some(format!("{object}.{:x}", now.as_nanosecond())),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            involved_object: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(object.into()),
                namespace: Some("ns".into()),
                uid: Some(format!("uid-{object}")),
                ..Default::default()
            },
            reason: Some(reason.into()),
            message: Some(message.into()),
            type_: Some("Normal".into()),
            count: Some(1),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            source: Some(EventSource {
                component: Some("kubelet".into()),
                host: Some("node".into()),
            }),
            ..Default::default()
        }
    }

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }

    #[test]
    fn a_repeated_event_is_the_same_object_with_a_higher_count() {
        let mut c = EventCorrelator::new();
        let first = match c.correlate(event("p", "Pulled", "m", t(0)), t(0)) {
            Correlated::Create(e) => e,
            other => panic!("{other:?}"),
        };
        for n in 2..=4 {
            match c.correlate(event("p", "Pulled", "m", t(n)), t(n)) {
                Correlated::Patch { event, patch } => {
                    assert_eq!(event.metadata.name, first.metadata.name);
                    assert_eq!(event.first_timestamp, first.first_timestamp);
                    assert_eq!(event.last_timestamp, Some(Time(t(n))));
                    assert_eq!(event.count, Some(n as i32));
                    assert_eq!(patch["count"], n);
                    assert_eq!(patch["message"], "m");
                    assert!(patch["lastTimestamp"].is_string());
                }
                other => panic!("{other:?}"),
            }
        }
        // Another reason, another object or another container is another event.
        assert!(matches!(
            c.correlate(event("p", "Created", "m", t(5)), t(5)),
            Correlated::Create(_)
        ));
        assert!(matches!(
            c.correlate(event("q", "Pulled", "m", t(5)), t(5)),
            Correlated::Create(_)
        ));
        let mut other_container = event("p", "Pulled", "m", t(5));
        other_container.involved_object.field_path = Some("spec.containers{b}".into());
        assert!(matches!(c.correlate(other_container, t(5)), Correlated::Create(_)));
    }

    #[test]
    fn similar_events_are_combined_from_the_tenth_message_on() {
        let mut c = EventCorrelator::new();
        for i in 0..9 {
            assert!(
                matches!(
                    c.correlate(event("p", "Failed", &format!("m{i}"), t(i)), t(i)),
                    Correlated::Create(_)
                ),
                "message {i}"
            );
        }
        let combined = match c.correlate(event("p", "Failed", "m9", t(9)), t(9)) {
            Correlated::Create(e) => e,
            other => panic!("{other:?}"),
        };
        assert_eq!(combined.message.as_deref(), Some("(combined from similar events): m9"));
        assert_eq!(combined.count, Some(1));
        assert_eq!(combined.reason.as_deref(), Some("Failed"));
        // The next different message counts on the combined event.
        match c.correlate(event("p", "Failed", "m10", t(10)), t(10)) {
            Correlated::Patch { event, patch } => {
                assert_eq!(event.metadata.name, combined.metadata.name);
                assert_eq!(event.count, Some(2));
                assert_eq!(patch["message"], "(combined from similar events): m10");
            }
            other => panic!("{other:?}"),
        }
        // Another reason is another group.
        assert!(matches!(
            c.correlate(event("p", "Other", "m11", t(11)), t(11)),
            Correlated::Create(_)
        ));
    }

    #[test]
    fn similar_events_start_over_after_the_interval() {
        let mut c = EventCorrelator::new();
        for i in 0..9 {
            c.correlate(event("p", "Failed", &format!("m{i}"), t(i)), t(i));
        }
        let later = t(9 + 601);
        match c.correlate(event("p", "Failed", "m9", later), later) {
            Correlated::Create(e) => assert_eq!(e.message.as_deref(), Some("m9")),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_spam_filter_allows_a_burst_then_one_per_five_minutes() {
        let mut c = EventCorrelator::new();
        // Distinct reasons, so neither deduplication nor aggregation hides them.
        let written = (0..30)
            .filter(|i| {
                let e = event("p", &format!("r{i}"), "m", t(0));
                c.correlate(e, t(0)) != Correlated::Skip
            })
            .count();
        assert_eq!(written, 25);
        // Another object has a bucket of its own.
        assert_ne!(c.correlate(event("q", "r", "m", t(0)), t(0)), Correlated::Skip);
        // Five minutes refill one token.
        assert_eq!(c.correlate(event("p", "x1", "m", t(100)), t(100)), Correlated::Skip);
        assert_ne!(c.correlate(event("p", "x2", "m", t(301)), t(301)), Correlated::Skip);
        assert_eq!(c.correlate(event("p", "x3", "m", t(302)), t(302)), Correlated::Skip);
    }

    #[test]
    fn update_state_remembers_what_was_written() {
        let mut c = EventCorrelator::new();
        let mut written = event("p", "Pulled", "m", t(0));
        written.metadata.name = Some("p.server".into());
        written.count = Some(7);
        c.update_state(&written);
        match c.correlate(event("p", "Pulled", "m", t(1)), t(1)) {
            Correlated::Patch { event, .. } => {
                assert_eq!(event.metadata.name.as_deref(), Some("p.server"));
                assert_eq!(event.count, Some(8));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_caches_are_bounded() {
        let mut c = EventCorrelator::with_capacity(2);
        c.correlate(event("a", "r", "m", t(0)), t(0));
        c.correlate(event("b", "r", "m", t(0)), t(0));
        c.correlate(event("c", "r", "m", t(0)), t(0));
        // `a` was forgotten: its repeat is created again.
        assert!(matches!(
            c.correlate(event("a", "r", "m", t(1)), t(1)),
            Correlated::Create(_)
        ));
        assert!(c.logs.len() <= 2 && c.spam.len() <= 2 && c.aggregates.len() <= 2);
    }
}
