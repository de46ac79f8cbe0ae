//! Leader election over `coordination.k8s.io/v1` Leases, as client-go's
//! `tools/leaderelection` with its `LeaseLock`: a candidate takes a Lease only when its record has
//! not changed for the lease's duration by the candidate's own clock (timestamps written by
//! others are never compared with this clock, only watched for change), every write is
//! conditional on the Lease's resourceVersion, the holder renews every retry period and gives up
//! once it could not renew within the renew deadline, and a holder stopping cleanly releases the
//! Lease (an empty `holderIdentity`), so a standby takes over at once.
//!
//! Beyond upstream, which leaves fencing to the caller, a term's [`Fence`] closes the moment the
//! holder can no longer be sure it holds the Lease (its last successful renewal plus the renew
//! deadline has passed by the monotonic clock): the clients of [`Term::client`] then refuse
//! every write without sending it. A process paused (SIGSTOP, a long stall) and resumed after a
//! standby took over therefore writes nothing before its elector notices the loss. [`run`] runs a
//! term's components on a runtime of their own, dropped with every task they spawned when the
//! term ends, so the components of the next term start clean.

mod elector;
mod fence;
mod run;
#[cfg(test)]
mod tests;

use std::time::Duration;

pub use elector::{LeaderElector, Record};
pub use fence::{Fence, FenceError, Fenced};
pub use run::{Term, run};

/// Timing of an election: upstream's `LeaseDuration`, `RenewDeadline` and `RetryPeriod`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// How long a standby waits, from the last change of the record it saw, before taking over.
    pub lease_duration: Duration,
    /// How long the holder keeps trying to renew before it gives up leading.
    pub renew_deadline: Duration,
    /// How long candidates wait between attempts.
    pub retry_period: Duration,
}

/// Upstream's `JitterFactor`: a candidate waits up to this many retry periods more between two
/// attempts to acquire.
pub const JITTER_FACTOR: f64 = 1.2;

impl Default for Config {
    /// kube-scheduler's and kube-controller-manager's defaults: 15 s, 10 s, 2 s.
    fn default() -> Self {
        Config {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// A configuration upstream's `NewLeaderElector` refuses, with its message.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("leaseDuration must be greater than renewDeadline")]
    LeaseNotLongerThanRenewDeadline,
    #[error("renewDeadline must be greater than retryPeriod*JitterFactor")]
    RenewDeadlineTooShort,
    #[error("retryPeriod must be greater than zero")]
    ZeroRetryPeriod,
    #[error("leaseDuration must be at least one second (the Lease counts it in seconds)")]
    LeaseUnderOneSecond,
    #[error("Lock identity is empty")]
    EmptyIdentity,
}

impl Config {
    /// Upstream's checks of `NewLeaderElector`, and the Lease's whole seconds.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.lease_duration <= self.renew_deadline {
            return Err(ConfigError::LeaseNotLongerThanRenewDeadline);
        }
        if self.renew_deadline <= self.retry_period.mul_f64(JITTER_FACTOR) {
            return Err(ConfigError::RenewDeadlineTooShort);
        }
        if self.retry_period.is_zero() {
            return Err(ConfigError::ZeroRetryPeriod);
        }
        if self.lease_duration < Duration::from_secs(1) {
            return Err(ConfigError::LeaseUnderOneSecond);
        }
        Ok(())
    }

    /// `leaseDurationSeconds` as upstream writes it: whole seconds, rounded down.
    pub fn lease_duration_seconds(&self) -> i32 {
        i32::try_from(self.lease_duration.as_secs()).unwrap_or(i32::MAX)
    }
}

/// This process's identity in every election it joins, as upstream's components make theirs:
/// `<hostname>_<uuid>`, the host name for people, the UUID so that two processes on one host (or
/// a process and its restart) are never taken for each other.
pub fn identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let host = host.trim();
    let host = if host.is_empty() { "localhost" } else { host };
    format!("{host}_{}", uuid::Uuid::new_v4())
}

#[cfg(test)]
mod config_tests {
    use super::*;

    #[test]
    fn upstream_defaults_are_valid_and_checks_refuse_what_upstream_refuses() {
        let c = Config::default();
        assert_eq!(c.validate(), Ok(()));
        assert_eq!(c.lease_duration_seconds(), 15);
        let s = Duration::from_secs;
        let cfg = |l, r, p| Config {
            lease_duration: l,
            renew_deadline: r,
            retry_period: p,
        };
        assert_eq!(
            cfg(s(10), s(10), s(2)).validate(),
            Err(ConfigError::LeaseNotLongerThanRenewDeadline)
        );
        // 10 s is not more than 1.2 × 9 s.
        assert_eq!(
            cfg(s(15), s(10), s(9)).validate(),
            Err(ConfigError::RenewDeadlineTooShort)
        );
        assert_eq!(cfg(s(15), s(10), s(0)).validate(), Err(ConfigError::ZeroRetryPeriod));
        assert_eq!(
            cfg(
                Duration::from_millis(900),
                Duration::from_millis(500),
                Duration::from_millis(100)
            )
            .validate(),
            Err(ConfigError::LeaseUnderOneSecond)
        );
    }

    #[test]
    fn identities_are_host_underscore_uuid_and_unique() {
        let a = identity();
        let b = identity();
        assert_ne!(a, b);
        let (host, id) = a.rsplit_once('_').unwrap();
        assert!(!host.is_empty());
        assert!(uuid::Uuid::parse_str(id).is_ok(), "{a}");
    }
}
