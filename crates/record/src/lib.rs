//! The one event recorder every Skiff component uses, as client-go's `tools/record`: events
//! made with upstream's fields (`NAME.NANOS` names, first and last timestamps, count, source,
//! reporting component and instance), correlated by [`correlator::EventCorrelator`]
//! (aggregation of similar events, deduplication into count increments, the spam filter) and
//! written in the background.
//!
//! Recording never waits: an event goes into a bounded queue (upstream's broadcaster queues
//! 1,000) and is dropped when the queue is full, so callers on a hot path (the scheduler's
//! bindings) are never delayed by events. One task drains the queue in order, correlates each
//! event and writes it with at most `concurrency` writes in flight.

pub mod correlator;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Patch, PatchParams, PostParams};
use parking_lot::Mutex;
use tokio::sync::{Semaphore, mpsc};

pub use correlator::{Correlated, EventCorrelator};

pub const NORMAL: &str = "Normal";
pub const WARNING: &str = "Warning";

/// upstream's `maxQueuedEvents`.
pub const DEFAULT_QUEUE_LIMIT: usize = 1000;

/// Who records, and how the writes go.
#[derive(Clone, Debug)]
pub struct Options {
    /// The source component (`kubelet`, `default-scheduler`, a controller's name).
    pub component: String,
    /// The source host (the kubelet names its node; others name none).
    pub host: Option<String>,
    /// `reportingInstance`.
    pub reporting_instance: Option<String>,
    /// Events waiting to be written beyond which new ones are dropped.
    pub queue_limit: usize,
    /// Writes in flight at once.
    pub concurrency: usize,
}

impl Options {
    /// A component's options: no host, the component as its reporting instance, upstream's queue.
    pub fn component(component: &str) -> Self {
        Options {
            component: component.to_string(),
            host: None,
            reporting_instance: Some(component.to_string()),
            queue_limit: DEFAULT_QUEUE_LIMIT,
            concurrency: 4,
        }
    }
}

struct Inner {
    source: EventSource,
    reporting_instance: Option<String>,
    tx: mpsc::Sender<Event>,
    /// The queue's receiving end until the first event starts the writer (in a runtime).
    rx: Mutex<Option<(mpsc::Receiver<Event>, kube::Client)>>,
    started: AtomicBool,
    concurrency: usize,
    dropped: AtomicU64,
    seq: AtomicU64,
}

/// Records events; cheap to clone (clones share the queue and the correlator).
#[derive(Clone)]
pub struct EventRecorder {
    inner: Arc<Inner>,
}

/// An object's reference as events carry it.
pub fn reference<K>(obj: &K) -> ObjectReference
where
    K: kube::Resource<DynamicType = ()>,
{
    let meta = obj.meta();
    ObjectReference {
        api_version: Some(K::api_version(&()).into_owned()),
        kind: Some(K::kind(&()).into_owned()),
        name: meta.name.clone(),
        namespace: meta.namespace.clone(),
        uid: meta.uid.clone(),
        resource_version: meta.resource_version.clone(),
        field_path: None,
    }
}

impl EventRecorder {
    pub fn new(client: kube::Client, options: Options) -> Self {
        let (tx, rx) = mpsc::channel(options.queue_limit.max(1));
        EventRecorder {
            inner: Arc::new(Inner {
                source: EventSource {
                    component: Some(options.component.clone()),
                    host: options.host.clone(),
                },
                reporting_instance: options.reporting_instance,
                tx,
                rx: Mutex::new(Some((rx, client))),
                started: AtomicBool::new(false),
                concurrency: options.concurrency.max(1),
                dropped: AtomicU64::new(0),
                seq: AtomicU64::new(0),
            }),
        }
    }

    /// A component's recorder (see [`Options::component`]).
    pub fn for_component(client: kube::Client, component: &str) -> Self {
        Self::new(client, Options::component(component))
    }

    /// The source component.
    pub fn component(&self) -> &str {
        self.inner.source.component.as_deref().unwrap_or("")
    }

    /// Events dropped so far because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.inner.dropped.load(Ordering::Relaxed)
    }

    /// Records an event about `obj` (`type_` is [`NORMAL`] or [`WARNING`]).
    pub fn event<K>(&self, obj: &K, type_: &str, reason: &str, message: impl Into<String>)
    where
        K: kube::Resource<DynamicType = ()>,
    {
        self.record(reference(obj), type_, reason, None, message);
    }

    /// Records an event about the object `involved` names, with upstream's `action` when given.
    /// The event is in the involved object's namespace, `default` for a cluster-scoped one (as
    /// client-go's recorder does). Never waits; dropped when too many wait to be written.
    pub fn record(
        &self,
        involved: ObjectReference,
        type_: &str,
        reason: &str,
        action: Option<&str>,
        message: impl Into<String>,
    ) {
        let event = self.make_event(involved, type_, reason, action, message.into(), Timestamp::now());
        self.start_writer();
        match self.inner.tx.try_send(event) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(event)) => {
                // One line for the first drop and one per thousand after it, not one per event.
                let dropped = self.inner.dropped.fetch_add(1, Ordering::Relaxed) + 1;
                if dropped == 1 || dropped.is_multiple_of(1000) {
                    tracing::warn!(
                        component = self.component(),
                        reason = event.reason.as_deref().unwrap_or(""),
                        dropped,
                        "too many events waiting to be written; dropping events"
                    );
                }
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
    }

    /// upstream's `makeEvent`.
    fn make_event(
        &self,
        involved: ObjectReference,
        type_: &str,
        reason: &str,
        action: Option<&str>,
        message: String,
        now: Timestamp,
    ) -> Event {
        let namespace = involved
            .namespace
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "default".into());
        // Two events of one object in one nanosecond still get two names.
        let nanos = (now.as_nanosecond() as u64).wrapping_add(self.inner.seq.fetch_add(1, Ordering::Relaxed));
        Event {
            metadata: ObjectMeta {
                name: Some(format!("{}.{nanos:x}", involved.name.as_deref().unwrap_or(""))),
                namespace: Some(namespace),
                ..Default::default()
            },
            involved_object: involved,
            reason: Some(reason.to_string()),
            message: Some(message),
            type_: Some(type_.to_string()),
            action: action.map(str::to_string),
            count: Some(1),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            source: Some(self.inner.source.clone()),
            reporting_component: self.inner.source.component.clone(),
            reporting_instance: self.inner.reporting_instance.clone(),
            ..Default::default()
        }
    }

    /// Starts the task that writes the queue, once, in the runtime of the first recording.
    fn start_writer(&self) {
        if self.inner.started.load(Ordering::Acquire) {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if let Some((rx, client)) = self.inner.rx.lock().take() {
            handle.spawn(write_queue(client, rx, self.inner.concurrency));
            self.inner.started.store(true, Ordering::Release);
        }
    }
}

/// Drains the queue in order: correlates each event, then writes it (at most `concurrency` at once).
async fn write_queue(client: kube::Client, mut rx: mpsc::Receiver<Event>, concurrency: usize) {
    let correlator = Arc::new(Mutex::new(EventCorrelator::new()));
    let slots = Arc::new(Semaphore::new(concurrency));
    while let Some(event) = rx.recv().await {
        let correlated = correlator.lock().correlate(event, Timestamp::now());
        if correlated == Correlated::Skip {
            continue;
        }
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let client = client.clone();
        let correlator = correlator.clone();
        tokio::spawn(async move {
            let _permit = permit;
            match write(&client, correlated).await {
                Ok(Some(event)) => correlator.lock().update_state(&event),
                Ok(None) => {}
                Err((reason, e)) => tracing::debug!(%reason, error = %e, "recording an event"),
            }
        });
    }
}

/// Writes one correlated event: a patch, or a create (also when the patched event is gone).
async fn write(client: &kube::Client, correlated: Correlated) -> Result<Option<Event>, (String, kube::Error)> {
    let (event, patch) = match correlated {
        Correlated::Skip => return Ok(None),
        Correlated::Create(event) => (event, None),
        Correlated::Patch { event, patch } => (event, Some(patch)),
    };
    let reason = event.reason.clone().unwrap_or_default();
    let namespace = event.metadata.namespace.clone().unwrap_or_default();
    let name = event.metadata.name.clone().unwrap_or_default();
    let request = kube::core::Request::new(format!("/api/v1/namespaces/{namespace}/events"));
    if let Some(patch) = patch {
        let sent = match request.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)) {
            Ok(req) => client.request_text(req).await.map(|_| ()),
            Err(e) => Err(kube::Error::BuildRequest(e)),
        };
        match sent {
            Ok(()) => return Ok(Some(event)),
            // The event is gone (expired, or never written): made again under its name.
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err((reason, e)),
        }
    }
    // The response is not read back: nothing here needs more than what was sent.
    let body = serde_json::to_vec(&event).map_err(|e| (reason.clone(), kube::Error::SerdeError(e)))?;
    let created = match request.create(&PostParams::default(), body) {
        Ok(req) => client.request_text(req).await.map(|_| ()),
        Err(e) => Err(kube::Error::BuildRequest(e)),
    };
    created.map(|()| Some(event)).map_err(|e| (reason, e))
}
