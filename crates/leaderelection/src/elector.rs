//! The elector: upstream's `LeaderElector` over a `LeaseLock`.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};

use crate::{Config, ConfigError, Fence, JITTER_FACTOR};

/// What a Lease's spec says of the election: upstream's `LeaderElectionRecord`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Record {
    pub holder_identity: String,
    pub lease_duration_seconds: i32,
    pub acquire_time: Option<Timestamp>,
    pub renew_time: Option<Timestamp>,
    pub leader_transitions: i32,
}

impl Record {
    /// Upstream's `LeaseSpecToLeaderElectionRecord`: what is absent reads as empty.
    pub fn from_lease(lease: &Lease) -> Record {
        let Some(spec) = &lease.spec else {
            return Record::default();
        };
        Record {
            holder_identity: spec.holder_identity.clone().unwrap_or_default(),
            lease_duration_seconds: spec.lease_duration_seconds.unwrap_or(0),
            acquire_time: spec.acquire_time.as_ref().map(|t| t.0),
            renew_time: spec.renew_time.as_ref().map(|t| t.0),
            leader_transitions: spec.lease_transitions.unwrap_or(0),
        }
    }

    /// Upstream's `LeaderElectionRecordToLeaseSpec`: every field written, `holderIdentity` too
    /// when it is empty (a released Lease).
    fn to_spec(&self) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.holder_identity.clone()),
            lease_duration_seconds: Some(self.lease_duration_seconds),
            acquire_time: Some(MicroTime(self.acquire_time.unwrap_or(Timestamp::UNIX_EPOCH))),
            renew_time: Some(MicroTime(self.renew_time.unwrap_or(Timestamp::UNIX_EPOCH))),
            lease_transitions: Some(self.leader_transitions),
            ..Default::default()
        }
    }
}

/// One candidate in the election of one Lease.
pub struct LeaderElector {
    config: Config,
    identity: String,
    client: kube::Client,
    api: Api<Lease>,
    namespace: String,
    name: String,
    /// The recorder of the component events are recorded for (`source.component`), if any.
    events: Option<skiff_record::EventRecorder>,
    /// The Lease as last read or written: its resourceVersion makes every update conditional.
    lease: Option<Lease>,
    /// The record last seen, and when (by this process's clock) it was first seen as it is.
    observed: Option<Record>,
    observed_time: Option<Instant>,
    /// The holder last reported in the log (upstream's `OnNewLeader`).
    reported_leader: String,
    /// When the last successful acquisition or renewal began.
    renewed_at: Option<Instant>,
    /// Set when a term was lost, until the next is won: the candidate campaigns as a new one
    /// would, waiting out even a record that names it (upstream's component exits when it
    /// loses, and its restart is a candidate of another identity). So a standby that saw the
    /// lapse takes over, and a paused process resumed does not win back at once.
    rejoining: bool,
    /// Tests hold the renew loop still with this, as a paused process's is.
    #[cfg(test)]
    pub(crate) paused: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl LeaderElector {
    /// A candidate `identity` for the Lease `namespace/name`, reading and writing it with
    /// `client` (whose identity must be allowed to get, create and update it).
    pub fn new(
        client: kube::Client,
        namespace: &str,
        name: &str,
        identity: impl Into<String>,
        config: Config,
    ) -> Result<LeaderElector, ConfigError> {
        config.validate()?;
        let identity = identity.into();
        if identity.is_empty() {
            return Err(ConfigError::EmptyIdentity);
        }
        Ok(LeaderElector {
            config,
            identity,
            api: Api::namespaced(client.clone(), namespace),
            client,
            namespace: namespace.to_string(),
            name: name.to_string(),
            events: None,
            lease: None,
            observed: None,
            observed_time: None,
            reported_leader: String::new(),
            renewed_at: None,
            rejoining: false,
            #[cfg(test)]
            paused: Default::default(),
        })
    }

    /// Record upstream's `LeaderElection` events (`ID became leader`, `ID stopped leading`) on
    /// the Lease, from `component`.
    pub fn with_events(mut self, component: &str) -> Self {
        self.events = Some(skiff_record::EventRecorder::new(
            self.client.clone(),
            skiff_record::Options {
                reporting_instance: Some(self.identity.clone()),
                ..skiff_record::Options::component(component)
            },
        ));
        self
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// `namespace/name`, upstream's `Describe`.
    pub fn describe(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The holder last observed ("" if none).
    pub fn leader(&self) -> &str {
        self.observed.as_ref().map_or("", |r| r.holder_identity.as_str())
    }

    /// Whether the last observed holder is this candidate.
    pub fn is_leader(&self) -> bool {
        self.leader() == self.identity
    }

    /// Upstream's `isLeaseValid`: the observed record has not been seen unchanged for its
    /// `leaseDurationSeconds` yet, by this process's clock.
    fn is_lease_valid(&self, now: Instant) -> bool {
        match (&self.observed, self.observed_time) {
            (Some(r), Some(seen)) => {
                seen + Duration::from_secs(u64::try_from(r.lease_duration_seconds).unwrap_or(0)) > now
            }
            _ => false,
        }
    }

    fn set_observed(&mut self, record: Record) {
        self.observed = Some(record);
        self.observed_time = Some(Instant::now());
    }

    /// Write `record` over the Lease last read or written, conditional on its resourceVersion.
    async fn update(&mut self, record: &Record) -> Result<(), kube::Error> {
        let Some(mut lease) = self.lease.clone() else {
            return Err(kube::Error::Service(
                "lease not initialized, call get or create first".into(),
            ));
        };
        lease.spec = Some(record.to_spec());
        let written = self.api.replace(&self.name, &PostParams::default(), &lease).await?;
        self.set_observed(Record::from_lease(&written));
        self.lease = Some(written);
        Ok(())
    }

    /// One attempt to acquire the Lease, or to renew it if this candidate holds it: upstream's
    /// `tryAcquireOrRenew`. True on success.
    pub async fn try_acquire_or_renew(&mut self) -> bool {
        let started = Instant::now();
        let now = Timestamp::now();
        let mut record = Record {
            holder_identity: self.identity.clone(),
            lease_duration_seconds: self.config.lease_duration_seconds(),
            acquire_time: Some(now),
            renew_time: Some(now),
            leader_transitions: 0,
        };
        let lease = self.describe();

        // 1. The holder's fast path: update the record it last saw, assuming it is current.
        if self.is_leader()
            && !self.rejoining
            && self.is_lease_valid(started)
            && let Some(observed) = &self.observed
        {
            record.acquire_time = observed.acquire_time;
            record.leader_transitions = observed.leader_transitions;
            match self.update(&record).await {
                Ok(()) => {
                    self.renewed_at = Some(started);
                    return true;
                }
                Err(e) => {
                    tracing::info!(%lease, error = %e, "failed to update the lease optimistically, falling back to the slow path")
                }
            }
        }

        // 2. Read the record, or create it.
        let current = match self.api.get_opt(&self.name).await {
            Ok(Some(current)) => current,
            Ok(None) => {
                let new = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        namespace: Some(self.namespace.clone()),
                        ..Default::default()
                    },
                    spec: Some(record.to_spec()),
                };
                return match self.api.create(&PostParams::default(), &new).await {
                    Ok(created) => {
                        self.set_observed(Record::from_lease(&created));
                        self.lease = Some(created);
                        self.renewed_at = Some(started);
                        self.rejoining = false;
                        true
                    }
                    Err(e) => {
                        tracing::error!(%lease, error = %e, "error initially creating the leader election record");
                        false
                    }
                };
            }
            Err(e) => {
                tracing::error!(%lease, error = %e, "error retrieving the resource lock");
                return false;
            }
        };

        // 3. A record that changed is seen now: its lease runs from this instant.
        let old = Record::from_lease(&current);
        self.lease = Some(current);
        if self.observed.as_ref() != Some(&old) {
            self.set_observed(old.clone());
        }
        let holds = self.is_leader() && !self.rejoining;
        if !old.holder_identity.is_empty() && self.is_lease_valid(started) && !holds {
            tracing::debug!(%lease, holder = %old.holder_identity, "the lease is held and has not yet expired");
            return false;
        }

        // 4. Take it over, or renew it.
        if holds {
            record.acquire_time = old.acquire_time;
            record.leader_transitions = old.leader_transitions;
        } else {
            record.leader_transitions = old.leader_transitions.saturating_add(1);
        }
        match self.update(&record).await {
            Ok(()) => {
                self.renewed_at = Some(started);
                self.rejoining = false;
                true
            }
            Err(e) => {
                tracing::error!(%lease, error = %e, "failed to update the lease");
                false
            }
        }
    }

    /// Log a new holder once (upstream's `OnNewLeader`).
    fn report_transition(&mut self) {
        let leader = self.leader().to_string();
        if leader == self.reported_leader {
            return;
        }
        tracing::info!(lease = %self.describe(), leader = %leader, "new leader observed");
        self.reported_leader = leader;
    }

    /// Until this candidate holds the Lease: an attempt, then another every retry period with
    /// upstream's jitter. The fence returned is the term's, open until the renew deadline.
    pub async fn acquire(&mut self) -> Fence {
        let lease = self.describe();
        tracing::info!(%lease, identity = %self.identity, "attempting to acquire the leader lease");
        loop {
            let acquired = self.try_acquire_or_renew().await;
            self.report_transition();
            if acquired && let Some(at) = self.renewed_at {
                tracing::info!(%lease, "successfully acquired the lease");
                self.record_event("became leader");
                return Fence::new(lease, at + self.config.renew_deadline);
            }
            let jitter = self.config.retry_period.mul_f64(rand::random::<f64>() * JITTER_FACTOR);
            tokio::time::sleep(self.config.retry_period + jitter).await;
        }
    }

    /// Renew every retry period while this candidate leads; returns when it no longer does,
    /// with `fence` closed: when no renewal succeeded within the renew deadline of the last one
    /// (a process resumed after a pause finds it past at once), or as soon as another holder is
    /// seen (upstream would keep trying until the deadline; the other holder already leads).
    pub async fn renew(&mut self, fence: &Fence) {
        let lease = self.describe();
        'renewals: loop {
            tokio::time::sleep(self.config.retry_period).await;
            loop {
                #[cfg(test)]
                while self.paused.load(std::sync::atomic::Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                let Some(deadline) = self.renewed_at.map(|at| at + self.config.renew_deadline) else {
                    break 'renewals;
                };
                if Instant::now() >= deadline {
                    tracing::warn!(%lease, "failed to renew the lease within the renew deadline");
                    break 'renewals;
                }
                let renewed = tokio::time::timeout_at(deadline.into(), self.try_acquire_or_renew())
                    .await
                    .unwrap_or(false);
                self.report_transition();
                if renewed && let Some(at) = self.renewed_at {
                    fence.extend(at + self.config.renew_deadline);
                    tracing::trace!(%lease, "successfully renewed the lease");
                    continue 'renewals;
                }
                if self.observed.is_some() && !self.is_leader() {
                    tracing::warn!(%lease, holder = %self.leader(), "the lease is held by another candidate");
                    break 'renewals;
                }
                let retry = (Instant::now() + self.config.retry_period).min(deadline);
                tokio::time::sleep_until(retry.into()).await;
            }
        }
        fence.revoke();
        self.record_event("stopped leading");
        self.lost();
    }

    /// The term ended without a release: campaign again as a new candidate.
    pub(crate) fn lost(&mut self) {
        self.renewed_at = None;
        self.observed = None;
        self.observed_time = None;
        self.rejoining = true;
    }

    /// Give the Lease up if this candidate holds it (upstream's `release`, for
    /// `ReleaseOnCancel`): an empty holder and a one-second lease, so a standby takes it at its
    /// next attempt. True if nothing is held any more.
    pub async fn release(&mut self) -> bool {
        if !self.is_leader() {
            return true;
        }
        let now = Timestamp::now();
        let record = Record {
            holder_identity: String::new(),
            lease_duration_seconds: 1,
            acquire_time: Some(now),
            renew_time: Some(now),
            leader_transitions: self.observed.as_ref().map_or(0, |r| r.leader_transitions),
        };
        self.renewed_at = None;
        // A renewal cut short by the stop may still have been written after the record this
        // candidate last saw: on a conflict, read the Lease again and release it if it is still
        // ours.
        for _ in 0..3 {
            match self.update(&record).await {
                Ok(()) => {
                    tracing::info!(lease = %self.describe(), "released the lease");
                    return true;
                }
                Err(kube::Error::Api(e)) if e.code == 409 => match self.api.get_opt(&self.name).await {
                    Ok(Some(current)) => {
                        let held = Record::from_lease(&current).holder_identity == self.identity;
                        self.lease = Some(current);
                        if !held {
                            return true;
                        }
                    }
                    Ok(None) => return true,
                    Err(e) => {
                        tracing::error!(lease = %self.describe(), error = %e, "failed to release the lease");
                        return false;
                    }
                },
                Err(e) => {
                    tracing::error!(lease = %self.describe(), error = %e, "failed to release the lease");
                    return false;
                }
            }
        }
        tracing::error!(lease = %self.describe(), "failed to release the lease: it kept changing");
        false
    }

    /// Upstream's `LeaseLock.RecordEvent`: a Normal `LeaderElection` event on the Lease,
    /// `IDENTITY MESSAGE`, sent without waiting for it.
    fn record_event(&self, message: &str) {
        let (Some(events), Some(lease)) = (&self.events, &self.lease) else {
            return;
        };
        let involved = ObjectReference {
            api_version: Some("coordination.k8s.io/v1".into()),
            kind: Some("Lease".into()),
            namespace: Some(self.namespace.clone()),
            name: Some(self.name.clone()),
            uid: lease.metadata.uid.clone(),
            resource_version: lease.metadata.resource_version.clone(),
            ..Default::default()
        };
        events.record(
            involved,
            skiff_record::NORMAL,
            "LeaderElection",
            None,
            format!("{} {message}", self.identity),
        );
    }
}
