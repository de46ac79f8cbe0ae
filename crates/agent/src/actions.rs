//! What one pass of a pod's sync does, decided apart from doing it, as upstream's kubelet
//! `computePodActions` (`pkg/kubelet/kuberuntime/kuberuntime_manager.go`): from the pod's spec and
//! what the engine and the worker observed (containers, probe results, back-off), a [`PodActions`]
//! saying which sandbox to make, which containers to kill (and why) and which to start. Pure code:
//! the worker ([`crate::worker`]) observes, calls [`compute_pod_actions`] and carries the actions out.
//!
//! A pass that makes a new sandbox decides no container: the worker makes the sandbox, observes what
//! is left and decides again.

use std::collections::HashMap;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Container, EphemeralContainer, Pod};
use sha2::Digest;

use crate::docker::{ContainerRecord, PodRuntime, RunState};
use crate::status::ContainerNote;

/// The first back-off after a container exits, doubled at every restart up to [`MAX_BACKOFF`].
pub const INITIAL_BACKOFF: Duration = Duration::from_secs(10);
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// A container of the pod: (is init container, name).
pub type Key = (bool, String);

/// A container's restart back-off as the worker holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackoffState {
    pub duration: Duration,
    /// Time since the back-off last grew; after twice [`MAX_BACKOFF`] it starts over.
    pub since_update: Duration,
}

/// What the worker observed, besides the pod itself.
pub struct Observed<'a> {
    pub runtime: &'a PodRuntime,
    /// Containers whose probes run, by container id, with the restart a liveness or startup probe
    /// asked for (its message).
    pub probes: &'a HashMap<String, Option<String>>,
    pub notes: &'a HashMap<Key, ContainerNote>,
    pub backoff: &'a HashMap<Key, BackoffState>,
    pub now: Timestamp,
    /// The pod's phase is Succeeded or Failed (as its status computes it).
    pub terminal: bool,
}

/// Why the whole pod stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KillPodReason {
    /// The pod is being deleted: everything stops within its grace period and is removed.
    Deleting,
    /// Succeeded or Failed: what runs stops, the containers stay for their logs.
    Terminal,
}

/// A new sandbox, and what goes with the one it replaces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxChange {
    /// The new sandbox's attempt number.
    pub attempt: i32,
    /// An older sandbox exists (it died): `SandboxChanged`.
    pub changed: bool,
    /// Containers still running in the old sandbox, stopped first.
    pub stop: Vec<String>,
    /// Removed: the old init containers (they run again) and the old sandboxes.
    pub remove: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KillReason {
    /// A liveness or startup probe failed.
    ProbeFailed,
    /// The container's spec (its hash) changed.
    SpecChanged,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerToKill {
    pub init: bool,
    /// Index in `spec.initContainers` or `spec.containers`.
    pub index: usize,
    pub id: String,
    pub grace_seconds: i64,
    pub reason: KillReason,
    /// The `Killing` event's message.
    pub message: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartReason {
    /// No instance of the container exists yet.
    New,
    /// The last instance was created but never started: it is removed and made again.
    NotStarted,
    /// The last instance exited and the restart policy restarts it (its back-off passed).
    Restart,
    /// The running instance's spec changed: it is killed and replaced at once.
    Replace,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerToStart {
    pub init: bool,
    /// Index in `spec.initContainers` or `spec.containers`.
    pub index: usize,
    pub restart_count: i32,
    pub reason: StartReason,
    /// Instances removed before the start (older dead ones; the newest is kept for its logs).
    pub remove: Vec<String>,
    /// The back-off to hold from now on (restarts after an exit).
    pub backoff: Option<Duration>,
}

/// A container that exited and waits for its back-off to pass (`CrashLoopBackOff`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackingOff {
    pub init: bool,
    pub index: usize,
    pub duration: Duration,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EphemeralToStart {
    /// Index in `spec.ephemeralContainers`.
    pub index: usize,
    /// `Some` with a `targetContainerName`: the target's running container id, empty when it runs not.
    pub target: Option<String>,
}

/// One pass's decisions. Kills come before starts, as upstream orders them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodActions {
    pub kill_pod: Option<KillPodReason>,
    pub create_sandbox: Option<SandboxChange>,
    pub containers_to_kill: Vec<ContainerToKill>,
    /// Init containers (at most one besides restartable ones) and app containers, in spec order.
    pub containers_to_start: Vec<ContainerToStart>,
    pub backing_off: Vec<BackingOff>,
    /// Running containers kept as they are whose probes do not run (adopted after a restart).
    pub start_probes: Vec<(bool, usize, String)>,
    /// Init containers that completed: whatever they waited on is over.
    pub init_done: Vec<usize>,
    /// Every init container completed (or, restartable, started): app containers are decided.
    pub initialized: bool,
    pub ephemeral_to_start: Vec<EphemeralToStart>,
}

/// The hash stored on a container; a spec change (other than resources) restarts it.
pub fn container_hash(c: &Container) -> String {
    let mut c = c.clone();
    c.resources = None;
    let json = serde_json::to_vec(&c).unwrap_or_default();
    sha2::Sha256::digest(&json)
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The pod's termination grace period: the deletion's, else the spec's, else 30 s.
pub fn grace_seconds(pod: &Pod) -> i64 {
    pod.metadata
        .deletion_grace_period_seconds
        .or_else(|| pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds))
        .unwrap_or(30)
        .max(0)
}

/// An ephemeral container as the container it runs (the same fields, less the target).
pub fn ephemeral_as_container(ec: &EphemeralContainer) -> Option<Container> {
    let mut v = serde_json::to_value(ec).ok()?;
    v.as_object_mut()?.remove("targetContainerName");
    serde_json::from_value(v).ok()
}

/// upstream's `computePodActions`.
pub fn compute_pod_actions(pod: &Pod, observed: &Observed<'_>) -> PodActions {
    let mut actions = PodActions::default();
    if pod.metadata.deletion_timestamp.is_some() {
        actions.kill_pod = Some(KillPodReason::Deleting);
        return actions;
    }
    if observed.terminal {
        actions.kill_pod = Some(KillPodReason::Terminal);
        return actions;
    }
    let rt = observed.runtime;
    if rt.running_sandbox().is_none() {
        actions.create_sandbox = Some(SandboxChange {
            attempt: rt.next_sandbox_attempt(),
            changed: !rt.sandboxes.is_empty(),
            stop: if rt.sandboxes.is_empty() {
                Vec::new()
            } else {
                rt.containers
                    .iter()
                    .filter(|c| c.state == RunState::Running)
                    .map(|c| c.id.clone())
                    .collect()
            },
            remove: if rt.sandboxes.is_empty() {
                Vec::new()
            } else {
                rt.containers
                    .iter()
                    .filter(|c| c.init)
                    .chain(&rt.sandboxes)
                    .map(|c| c.id.clone())
                    .collect()
            },
        });
        return actions;
    }
    let spec = pod.spec.clone().unwrap_or_default();
    let policy = spec.restart_policy.as_deref().unwrap_or("Always");
    let grace = grace_seconds(pod);

    // Init containers, in order: the first not done is started, restartable ones keep running.
    let mut initialized = true;
    for (index, c) in spec.init_containers.iter().flatten().enumerate() {
        let sidecar = c.restart_policy.as_deref() == Some("Always");
        let instances = rt.instances(&c.name, true);
        match instances.first() {
            None => {
                actions.start(true, index, 0, StartReason::New, Vec::new(), None);
                initialized = false;
            }
            Some(l) if l.state == RunState::Created => {
                actions.start(
                    true,
                    index,
                    l.restart_count,
                    StartReason::NotStarted,
                    vec![l.id.clone()],
                    None,
                );
                initialized = false;
            }
            Some(l) if l.state == RunState::Running => {
                if sidecar {
                    match actions.check_running(c, true, index, l, &instances, observed, grace) {
                        Running::Replaced => {
                            initialized = false;
                            break;
                        }
                        Running::Killed | Running::Kept => {}
                    }
                    let started = observed.notes.get(&(true, c.name.clone())).is_none_or(|n| n.started);
                    if started {
                        continue;
                    }
                }
                initialized = false;
            }
            Some(l) if l.exit_code == 0 && !sidecar => {
                actions.init_done.push(index);
                continue;
            }
            Some(_) => {
                if policy != "Never" || sidecar {
                    actions.restart_with_backoff(c, true, index, &instances, observed);
                }
                initialized = false;
            }
        }
        if !initialized {
            break;
        }
    }
    actions.initialized = initialized;

    if initialized {
        for (index, c) in spec.containers.iter().enumerate() {
            let instances = rt.instances(&c.name, false);
            match instances.first() {
                None => actions.start(false, index, 0, StartReason::New, Vec::new(), None),
                Some(l) if l.state == RunState::Created => actions.start(
                    false,
                    index,
                    l.restart_count,
                    StartReason::NotStarted,
                    vec![l.id.clone()],
                    None,
                ),
                Some(l) if l.state == RunState::Running => {
                    actions.check_running(c, false, index, l, &instances, observed, grace);
                }
                Some(l) => {
                    let restart = match policy {
                        "Always" => true,
                        "OnFailure" => l.exit_code != 0,
                        _ => false,
                    };
                    if restart {
                        actions.restart_with_backoff(c, false, index, &instances, observed);
                    }
                }
            }
        }
    }

    // Ephemeral containers: started once each, whether or not initialization is done (as upstream),
    // never restarted.
    for (index, ec) in spec.ephemeral_containers.iter().flatten().enumerate() {
        if !rt.instances(&ec.name, false).is_empty() || ephemeral_as_container(ec).is_none() {
            continue;
        }
        // The target's PID namespace, when it runs (upstream's targetContainerName).
        let target = ec.target_container_name.as_deref().filter(|t| !t.is_empty()).map(|t| {
            rt.instances(t, false)
                .into_iter()
                .chain(rt.instances(t, true))
                .find(|r| r.state == RunState::Running)
                .map(|r| r.id.clone())
                .unwrap_or_default()
        });
        actions.ephemeral_to_start.push(EphemeralToStart { index, target });
    }
    actions
}

/// What became of a running container.
enum Running {
    Kept,
    /// Killed (a probe failed); the restart policy decides at the next pass.
    Killed,
    /// Killed and replaced (its spec changed), whatever the restart policy (as upstream).
    Replaced,
}

impl PodActions {
    fn start(
        &mut self,
        init: bool,
        index: usize,
        restart_count: i32,
        reason: StartReason,
        remove: Vec<String>,
        backoff: Option<Duration>,
    ) {
        self.containers_to_start.push(ContainerToStart {
            init,
            index,
            restart_count,
            reason,
            remove,
            backoff,
        });
    }

    #[allow(clippy::too_many_arguments)]
    fn check_running(
        &mut self,
        c: &Container,
        init: bool,
        index: usize,
        latest: &ContainerRecord,
        instances: &[&ContainerRecord],
        observed: &Observed<'_>,
        pod_grace: i64,
    ) -> Running {
        let probing = observed.probes.get(&latest.id);
        let restart = probing.cloned().flatten();
        let changed = !latest.hash.is_empty() && latest.hash != container_hash(c);
        let (reason, message, grace) = match (restart, changed) {
            (Some(message), _) => {
                // A liveness or startup probe may carry its own grace period.
                let grace = [c.liveness_probe.as_ref(), c.startup_probe.as_ref()]
                    .into_iter()
                    .flatten()
                    .find_map(|p| p.termination_grace_period_seconds)
                    .unwrap_or(pod_grace);
                (KillReason::ProbeFailed, message, grace)
            }
            (None, true) => (
                KillReason::SpecChanged,
                format!("Container {} definition changed, will be restarted", c.name),
                pod_grace,
            ),
            (None, false) => {
                if probing.is_none() {
                    self.start_probes.push((init, index, latest.id.clone()));
                }
                return Running::Kept;
            }
        };
        self.containers_to_kill.push(ContainerToKill {
            init,
            index,
            id: latest.id.clone(),
            grace_seconds: grace,
            reason,
            message,
        });
        if reason != KillReason::SpecChanged {
            return Running::Killed;
        }
        let remove = instances.iter().skip(1).map(|c| c.id.clone()).collect();
        self.start(
            init,
            index,
            latest.restart_count + 1,
            StartReason::Replace,
            remove,
            None,
        );
        Running::Replaced
    }

    /// Restarts an exited container unless it is in back-off. `instances` is newest first and not empty.
    fn restart_with_backoff(
        &mut self,
        c: &Container,
        init: bool,
        index: usize,
        instances: &[&ContainerRecord],
        observed: &Observed<'_>,
    ) {
        let Some(latest) = instances.first() else {
            return;
        };
        let finished = latest.finished_at.unwrap_or(observed.now);
        let since_finish = Duration::from_secs(observed.now.duration_since(finished).as_secs().max(0) as u64);
        let current = observed
            .backoff
            .get(&(init, c.name.clone()))
            .filter(|b| b.since_update <= MAX_BACKOFF * 2);
        if let Some(b) = current
            && since_finish < b.duration
        {
            self.backing_off.push(BackingOff {
                init,
                index,
                duration: b.duration,
            });
            return;
        }
        let next = current.map_or(INITIAL_BACKOFF, |b| (b.duration * 2).min(MAX_BACKOFF));
        // Keep the newest dead instance (for lastState and `logs --previous`), drop older ones.
        let remove = instances.iter().skip(1).map(|c| c.id.clone()).collect();
        self.start(
            init,
            index,
            latest.restart_count + 1,
            StartReason::Restart,
            remove,
            Some(next),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": spec,
        }))
        .unwrap()
    }

    fn container(pod: &Pod, name: &str) -> Container {
        let spec = pod.spec.as_ref().unwrap();
        spec.containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .find(|c| c.name == name)
            .unwrap()
            .clone()
    }

    fn record(
        id: &str,
        name: &str,
        init: bool,
        state: RunState,
        exit_code: i64,
        restart_count: i32,
    ) -> ContainerRecord {
        ContainerRecord {
            id: id.into(),
            name: name.into(),
            restart_count,
            init,
            hash: String::new(),
            image: "busybox".into(),
            image_id: String::new(),
            state,
            exit_code,
            oom_killed: false,
            error: String::new(),
            started_at: None,
            finished_at: None,
            ip: None,
            labels: HashMap::new(),
        }
    }

    fn sandbox(state: RunState, attempt: i32) -> ContainerRecord {
        record(&format!("sandbox-{attempt}"), "POD", false, state, 0, attempt)
    }

    /// A case: the pod, what runs, and the worker's state.
    struct Case {
        pod: Pod,
        rt: PodRuntime,
        probes: HashMap<String, Option<String>>,
        notes: HashMap<Key, ContainerNote>,
        backoff: HashMap<Key, BackoffState>,
        now: Timestamp,
        terminal: bool,
    }

    impl Case {
        fn new(spec: serde_json::Value, containers: Vec<ContainerRecord>) -> Self {
            Case {
                pod: pod(spec),
                rt: PodRuntime {
                    sandboxes: vec![sandbox(RunState::Running, 0)],
                    containers,
                },
                probes: HashMap::new(),
                notes: HashMap::new(),
                backoff: HashMap::new(),
                now: Timestamp::from_second(1_000_000).unwrap(),
                terminal: false,
            }
        }

        fn actions(&self) -> PodActions {
            compute_pod_actions(
                &self.pod,
                &Observed {
                    runtime: &self.rt,
                    probes: &self.probes,
                    notes: &self.notes,
                    backoff: &self.backoff,
                    now: self.now,
                    terminal: self.terminal,
                },
            )
        }
    }

    fn started(actions: &PodActions) -> Vec<(bool, usize, i32, StartReason)> {
        actions
            .containers_to_start
            .iter()
            .map(|s| (s.init, s.index, s.restart_count, s.reason))
            .collect()
    }

    fn two_apps(policy: &str) -> serde_json::Value {
        serde_json::json!({
            "restartPolicy": policy,
            "containers": [{"name": "a", "image": "busybox"}, {"name": "b", "image": "busybox"}],
        })
    }

    fn init_spec(policy: &str) -> serde_json::Value {
        serde_json::json!({
            "restartPolicy": policy,
            "initContainers": [{"name": "i1", "image": "busybox"}, {"name": "i2", "image": "busybox"}],
            "containers": [{"name": "a", "image": "busybox"}],
        })
    }

    #[test]
    fn a_new_pod_gets_a_sandbox_first() {
        let mut case = Case::new(two_apps("Always"), vec![]);
        case.rt.sandboxes.clear();
        let actions = case.actions();
        assert_eq!(
            actions.create_sandbox,
            Some(SandboxChange {
                attempt: 0,
                changed: false,
                stop: vec![],
                remove: vec![]
            })
        );
        assert!(actions.containers_to_start.is_empty());
    }

    #[test]
    fn a_dead_sandbox_is_replaced_and_its_containers_stopped() {
        let mut case = Case::new(
            init_spec("Always"),
            vec![
                record("i1-0", "i1", true, RunState::Exited, 0, 0),
                record("i2-0", "i2", true, RunState::Exited, 0, 0),
                record("a-0", "a", false, RunState::Running, 0, 0),
            ],
        );
        case.rt.sandboxes = vec![sandbox(RunState::Exited, 0)];
        let change = case.actions().create_sandbox.unwrap();
        assert_eq!(change.attempt, 1);
        assert!(change.changed);
        assert_eq!(change.stop, vec!["a-0".to_string()]);
        assert_eq!(
            change.remove,
            vec!["i1-0".to_string(), "i2-0".to_string(), "sandbox-0".to_string()]
        );
    }

    #[test]
    fn a_new_sandbox_starts_every_app_container() {
        let case = Case::new(two_apps("Always"), vec![]);
        let actions = case.actions();
        assert!(actions.initialized);
        assert_eq!(
            started(&actions),
            vec![(false, 0, 0, StartReason::New), (false, 1, 0, StartReason::New)]
        );
    }

    #[test]
    fn init_containers_run_one_at_a_time_in_order() {
        // None ran: only the first starts.
        let case = Case::new(init_spec("Always"), vec![]);
        let actions = case.actions();
        assert!(!actions.initialized);
        assert_eq!(started(&actions), vec![(true, 0, 0, StartReason::New)]);
        // The first runs: nothing more.
        let case = Case::new(
            init_spec("Always"),
            vec![record("i1-0", "i1", true, RunState::Running, 0, 0)],
        );
        assert_eq!(started(&case.actions()), vec![]);
        // The first completed: the second starts.
        let case = Case::new(
            init_spec("Always"),
            vec![record("i1-0", "i1", true, RunState::Exited, 0, 0)],
        );
        let actions = case.actions();
        assert_eq!(actions.init_done, vec![0]);
        assert_eq!(started(&actions), vec![(true, 1, 0, StartReason::New)]);
        // Both completed: the app container starts.
        let case = Case::new(
            init_spec("Always"),
            vec![
                record("i1-0", "i1", true, RunState::Exited, 0, 0),
                record("i2-0", "i2", true, RunState::Exited, 0, 0),
            ],
        );
        let actions = case.actions();
        assert!(actions.initialized);
        assert_eq!(actions.init_done, vec![0, 1]);
        assert_eq!(started(&actions), vec![(false, 0, 0, StartReason::New)]);
    }

    #[test]
    fn a_failed_init_container_restarts_unless_the_policy_is_never() {
        let failed = || vec![record("i1-0", "i1", true, RunState::Exited, 1, 0)];
        for policy in ["Always", "OnFailure"] {
            let actions = Case::new(init_spec(policy), failed()).actions();
            assert_eq!(started(&actions), vec![(true, 0, 1, StartReason::Restart)], "{policy}");
            assert_eq!(actions.containers_to_start[0].backoff, Some(INITIAL_BACKOFF));
        }
        let actions = Case::new(init_spec("Never"), failed()).actions();
        assert!(actions.containers_to_start.is_empty());
        assert!(!actions.initialized);
    }

    #[test]
    fn restartable_init_containers_keep_running_beside_the_next() {
        let spec = serde_json::json!({
            "restartPolicy": "Never",
            "initContainers": [
                {"name": "side", "image": "busybox", "restartPolicy": "Always"},
                {"name": "i2", "image": "busybox"},
            ],
            "containers": [{"name": "a", "image": "busybox"}],
        });
        // A started sidecar lets the next init container start.
        let mut case = Case::new(
            spec.clone(),
            vec![record("side-0", "side", true, RunState::Running, 0, 0)],
        );
        case.probes.insert("side-0".into(), None);
        let actions = case.actions();
        assert_eq!(started(&actions), vec![(true, 1, 0, StartReason::New)]);
        // One whose startup probe has not succeeded yet holds the rest back.
        case.notes.insert(
            (true, "side".into()),
            ContainerNote {
                started: false,
                ..Default::default()
            },
        );
        assert_eq!(started(&case.actions()), vec![]);
        // One that exited restarts even under restartPolicy Never, even with exit code 0.
        let case = Case::new(spec, vec![record("side-0", "side", true, RunState::Exited, 0, 0)]);
        assert_eq!(started(&case.actions()), vec![(true, 0, 1, StartReason::Restart)]);
    }

    #[test]
    fn exited_containers_follow_the_restart_policy() {
        let exited = || {
            vec![
                record("a-0", "a", false, RunState::Exited, 0, 0),
                record("b-0", "b", false, RunState::Exited, 1, 0),
            ]
        };
        let restarted = |policy: &str| -> Vec<usize> {
            Case::new(two_apps(policy), exited())
                .actions()
                .containers_to_start
                .iter()
                .map(|s| s.index)
                .collect()
        };
        assert_eq!(restarted("Always"), vec![0, 1]);
        assert_eq!(restarted("OnFailure"), vec![1]);
        assert_eq!(restarted("Never"), Vec::<usize>::new());
    }

    #[test]
    fn a_restart_waits_for_its_back_off_and_doubles_it() {
        let mut case = Case::new(
            two_apps("Always"),
            vec![
                record("a-1", "a", false, RunState::Exited, 1, 1),
                record("a-0", "a", false, RunState::Exited, 1, 0),
            ],
        );
        case.pod.spec.as_mut().unwrap().containers.truncate(1);
        case.rt.containers[0].finished_at = Some(case.now - jiff::SignedDuration::from_secs(5));
        case.backoff.insert(
            (false, "a".into()),
            BackoffState {
                duration: Duration::from_secs(20),
                since_update: Duration::from_secs(30),
            },
        );
        let actions = case.actions();
        assert!(actions.containers_to_start.is_empty());
        assert_eq!(
            actions.backing_off,
            vec![BackingOff {
                init: false,
                index: 0,
                duration: Duration::from_secs(20)
            }]
        );
        // Once it passed: restarted, the older dead instance removed, the back-off doubled.
        case.rt.containers[0].finished_at = Some(case.now - jiff::SignedDuration::from_secs(25));
        let actions = case.actions();
        let start = &actions.containers_to_start[0];
        assert_eq!((start.restart_count, start.reason), (2, StartReason::Restart));
        assert_eq!(start.remove, vec!["a-0".to_string()]);
        assert_eq!(start.backoff, Some(Duration::from_secs(40)));
        // It never grows past the maximum, and starts over when it was not used for long.
        case.backoff.get_mut(&(false, "a".into())).unwrap().duration = Duration::from_secs(200);
        case.rt.containers[0].finished_at = Some(case.now - jiff::SignedDuration::from_secs(250));
        assert_eq!(case.actions().containers_to_start[0].backoff, Some(MAX_BACKOFF));
        case.backoff.get_mut(&(false, "a".into())).unwrap().since_update = MAX_BACKOFF * 2 + Duration::from_secs(1);
        case.rt.containers[0].finished_at = Some(case.now);
        assert_eq!(case.actions().containers_to_start[0].backoff, Some(INITIAL_BACKOFF));
    }

    #[test]
    fn a_liveness_failure_kills_and_the_policy_restarts_later() {
        let spec = serde_json::json!({
            "containers": [{
                "name": "a", "image": "busybox",
                "livenessProbe": {"exec": {"command": ["true"]}, "terminationGracePeriodSeconds": 3},
            }],
        });
        let mut case = Case::new(spec, vec![record("a-0", "a", false, RunState::Running, 0, 0)]);
        case.probes.insert(
            "a-0".into(),
            Some("Container a failed liveness probe, will be restarted".into()),
        );
        let actions = case.actions();
        assert_eq!(
            actions.containers_to_kill,
            vec![ContainerToKill {
                init: false,
                index: 0,
                id: "a-0".into(),
                grace_seconds: 3,
                reason: KillReason::ProbeFailed,
                message: "Container a failed liveness probe, will be restarted".into(),
            }]
        );
        assert!(actions.containers_to_start.is_empty());
    }

    #[test]
    fn a_changed_spec_replaces_the_container_whatever_the_policy() {
        let mut case = Case::new(
            two_apps("Never"),
            vec![
                record("a-0", "a", false, RunState::Running, 0, 0),
                record("b-0", "b", false, RunState::Running, 0, 0),
            ],
        );
        case.pod.spec.as_mut().unwrap().termination_grace_period_seconds = Some(7);
        let a = container(&case.pod, "a");
        let mut b = container(&case.pod, "b");
        case.rt.containers[0].hash = container_hash(&a);
        b.image = Some("busybox:old".into());
        case.rt.containers[1].hash = container_hash(&b);
        case.probes.insert("a-0".into(), None);
        case.probes.insert("b-0".into(), None);
        let actions = case.actions();
        assert_eq!(actions.containers_to_kill.len(), 1);
        let kill = &actions.containers_to_kill[0];
        assert_eq!(
            (kill.index, kill.reason, kill.grace_seconds),
            (1, KillReason::SpecChanged, 7)
        );
        assert_eq!(kill.message, "Container b definition changed, will be restarted");
        assert_eq!(started(&actions), vec![(false, 1, 1, StartReason::Replace)]);
        // A change of resources alone restarts nothing.
        let mut a2 = a.clone();
        a2.resources = Some(Default::default());
        assert_eq!(container_hash(&a2), container_hash(&a));
    }

    #[test]
    fn adopted_containers_get_their_probes_again() {
        let case = Case::new(
            two_apps("Always"),
            vec![
                record("a-0", "a", false, RunState::Running, 0, 0),
                record("b-0", "b", false, RunState::Running, 0, 0),
            ],
        );
        let actions = case.actions();
        assert!(actions.containers_to_kill.is_empty() && actions.containers_to_start.is_empty());
        assert_eq!(
            actions.start_probes,
            vec![(false, 0, "a-0".to_string()), (false, 1, "b-0".to_string())]
        );
    }

    #[test]
    fn a_created_but_not_started_container_is_made_again() {
        let case = Case::new(
            two_apps("Always"),
            vec![
                record("a-3", "a", false, RunState::Created, 0, 3),
                record("b-0", "b", false, RunState::Running, 0, 0),
            ],
        );
        let actions = case.actions();
        let start = &actions.containers_to_start[0];
        assert_eq!(
            (start.index, start.restart_count, start.reason),
            (0, 3, StartReason::NotStarted)
        );
        assert_eq!(start.remove, vec!["a-3".to_string()]);
        assert_eq!(actions.containers_to_start.len(), 1);
    }

    #[test]
    fn terminating_and_terminal_pods_are_killed() {
        let mut case = Case::new(two_apps("Always"), vec![]);
        case.terminal = true;
        let actions = case.actions();
        assert_eq!(actions.kill_pod, Some(KillPodReason::Terminal));
        assert!(actions.containers_to_start.is_empty());
        case.pod.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(case.now));
        assert_eq!(case.actions().kill_pod, Some(KillPodReason::Deleting));
    }

    #[test]
    fn ephemeral_containers_start_once_in_their_target() {
        let spec = serde_json::json!({
            "containers": [{"name": "a", "image": "busybox"}],
            "initContainers": [{"name": "i", "image": "busybox"}],
            "ephemeralContainers": [
                {"name": "debug", "image": "busybox", "targetContainerName": "a"},
                {"name": "plain", "image": "busybox"},
                {"name": "done", "image": "busybox"},
            ],
        });
        // Started even before initialization is done; the target does not run yet.
        let case = Case::new(
            spec.clone(),
            vec![
                record("i-0", "i", true, RunState::Running, 0, 0),
                record("done-0", "done", false, RunState::Exited, 0, 0),
            ],
        );
        let actions = case.actions();
        assert!(!actions.initialized);
        assert_eq!(
            actions.ephemeral_to_start,
            vec![
                EphemeralToStart {
                    index: 0,
                    target: Some(String::new())
                },
                EphemeralToStart { index: 1, target: None },
            ]
        );
        let case = Case::new(
            spec,
            vec![
                record("i-0", "i", true, RunState::Exited, 0, 0),
                record("a-0", "a", false, RunState::Running, 0, 0),
            ],
        );
        assert_eq!(case.actions().ephemeral_to_start[0].target, Some("a-0".to_string()));
    }
}
