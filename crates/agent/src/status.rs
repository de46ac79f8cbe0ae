//! Pod status as upstream's kubelet computes it (`generateAPIPodStatus`, `getPhase`, the condition
//! generators and `GetPodQOS`), from what the runtime reports plus the agent's own notes. Pure code.

use std::collections::HashMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting, ContainerStatus,
    HostIP, Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::docker::{ContainerRecord, PodRuntime, RunState};

/// What the agent knows about a container beyond the runtime's view.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ContainerNote {
    /// A waiting reason and message (CrashLoopBackOff, ErrImagePull, CreateContainerConfigError, ...).
    pub waiting: Option<(String, String)>,
    /// The readiness probe's last result (true when there is no readiness probe).
    pub ready: bool,
    /// The startup probe has succeeded (true when there is no startup probe).
    pub started: bool,
    /// The termination message read after the container exited, by container ID.
    pub messages: HashMap<String, String>,
}

/// Everything the status is computed from.
pub struct StatusInput<'a> {
    pub pod: &'a Pod,
    pub runtime: &'a PodRuntime,
    /// Keyed by (is_init, container name).
    pub notes: &'a HashMap<(bool, String), ContainerNote>,
    pub host_ip: &'a str,
    pub now: Timestamp,
}

pub fn compute(input: &StatusInput<'_>) -> PodStatus {
    let pod = input.pod;
    let spec = pod.spec.clone().unwrap_or_default();
    let old = pod.status.clone().unwrap_or_default();
    let restart_policy = spec.restart_policy.as_deref().unwrap_or("Always");
    let host_network = spec.host_network == Some(true);
    let sandbox = input.runtime.running_sandbox();
    let pod_ip = if host_network {
        sandbox.map(|_| input.host_ip.to_string())
    } else {
        sandbox.and_then(|s| s.ip.clone())
    };

    let init_statuses: Vec<ContainerStatus> = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| container_status(c, true, input, false))
        .collect();
    let init_done = init_statuses
        .iter()
        .all(|s| matches!(&s.state, Some(ContainerState { terminated: Some(t), .. }) if t.exit_code == 0));
    let init_failed_never = restart_policy == "Never"
        && init_statuses
            .iter()
            .any(|s| matches!(&s.state, Some(ContainerState { terminated: Some(t), .. }) if t.exit_code != 0));
    let statuses: Vec<ContainerStatus> = spec
        .containers
        .iter()
        .map(|c| container_status(c, false, input, !init_done))
        .collect();

    // Ephemeral containers never make a pod ready or unready.
    let ephemeral_statuses: Vec<ContainerStatus> = spec
        .ephemeral_containers
        .iter()
        .flatten()
        .filter_map(|ec| {
            let mut v = serde_json::to_value(ec).ok()?;
            v.as_object_mut()?.remove("targetContainerName");
            let c: Container = serde_json::from_value(v).ok()?;
            let mut s = container_status(&c, false, input, false);
            s.ready = false;
            Some(s)
        })
        .collect();

    let phase = if init_failed_never {
        "Failed"
    } else if !init_done {
        "Pending"
    } else {
        app_phase(&statuses, restart_policy)
    };

    let now = Time(input.now);
    let mut conditions: Vec<PodCondition> = Vec::new();
    let mut push = |type_: &str, ok: bool, reason: Option<&str>, message: Option<String>| {
        let status = if ok { "True" } else { "False" };
        let previous = old.conditions.iter().flatten().find(|c| c.type_ == type_);
        let transition = match previous {
            Some(p) if p.status == status => p.last_transition_time.clone(),
            _ => Some(now.clone()),
        };
        conditions.push(PodCondition {
            type_: type_.to_string(),
            status: status.to_string(),
            reason: reason.map(str::to_string),
            message,
            last_transition_time: transition,
            last_probe_time: None,
            observed_generation: None,
        });
    };
    let terminal = phase == "Succeeded" || phase == "Failed";
    push("PodReadyToStartContainers", sandbox.is_some(), None, None);
    let incomplete: Vec<&str> = init_statuses
        .iter()
        .filter(|s| !matches!(&s.state, Some(ContainerState { terminated: Some(t), .. }) if t.exit_code == 0))
        .map(|s| s.name.as_str())
        .collect();
    if incomplete.is_empty() {
        push("Initialized", true, None, None);
    } else {
        push(
            "Initialized",
            false,
            Some("ContainersNotInitialized"),
            Some(format!("containers with incomplete status: [{}]", incomplete.join(" "))),
        );
    }
    let unready: Vec<&str> = statuses.iter().filter(|s| !s.ready).map(|s| s.name.as_str()).collect();
    for type_ in ["ContainersReady", "Ready"] {
        if phase == "Succeeded" || (terminal && !unready.is_empty()) {
            push(type_, false, Some("PodCompleted"), None);
        } else if unready.is_empty() {
            push(type_, true, None, None);
        } else {
            push(
                type_,
                false,
                Some("ContainersNotReady"),
                Some(format!("containers with unready status: [{}]", unready.join(" "))),
            );
        }
    }
    match old.conditions.iter().flatten().find(|c| c.type_ == "PodScheduled") {
        Some(c) => conditions.push(c.clone()),
        None => push("PodScheduled", true, None, None),
    }

    let start_time = old.start_time.clone().or(Some(now));
    PodStatus {
        phase: Some(phase.to_string()),
        conditions: Some(conditions),
        host_ip: Some(input.host_ip.to_string()).filter(|s| !s.is_empty()),
        host_ips: Some(vec![HostIP {
            ip: input.host_ip.to_string(),
        }])
        .filter(|_| !input.host_ip.is_empty()),
        pod_ip: pod_ip.clone(),
        pod_ips: pod_ip.map(|ip| vec![PodIP { ip }]),
        start_time,
        qos_class: Some(qos_class(pod).to_string()),
        init_container_statuses: Some(init_statuses).filter(|s| !s.is_empty()),
        container_statuses: Some(statuses),
        ephemeral_container_statuses: Some(ephemeral_statuses).filter(|s| !s.is_empty()),
        message: old.message.clone(),
        reason: old.reason.clone(),
        nominated_node_name: old.nominated_node_name.clone(),
        ..Default::default()
    }
}

fn app_phase(statuses: &[ContainerStatus], restart_policy: &str) -> &'static str {
    let (mut waiting, mut running, mut stopped, mut failed) = (0, 0, 0, 0);
    for s in statuses {
        let state = s.state.clone().unwrap_or_default();
        if state.running.is_some() {
            running += 1;
        } else if let Some(t) = &state.terminated {
            stopped += 1;
            if t.exit_code != 0 {
                failed += 1;
            }
        } else if state.waiting.is_some() {
            match s.last_state.as_ref().and_then(|l| l.terminated.as_ref()) {
                Some(t) => {
                    stopped += 1;
                    if t.exit_code != 0 {
                        failed += 1;
                    }
                }
                None => waiting += 1,
            }
        }
    }
    if waiting > 0 {
        "Pending"
    } else if running > 0 {
        "Running"
    } else if stopped > 0 {
        match restart_policy {
            "Always" => "Running",
            "OnFailure" if failed > 0 => "Running",
            "Never" if failed > 0 => "Failed",
            _ => "Succeeded",
        }
    } else {
        "Pending"
    }
}

fn terminated(record: &ContainerRecord, message: Option<&String>) -> ContainerStateTerminated {
    let reason = if record.oom_killed {
        "OOMKilled"
    } else if record.exit_code == 0 {
        "Completed"
    } else {
        "Error"
    };
    ContainerStateTerminated {
        container_id: Some(format!("docker://{}", record.id)),
        exit_code: record.exit_code as i32,
        reason: Some(reason.to_string()),
        message: message.cloned().filter(|m| !m.is_empty()),
        started_at: record.started_at.map(Time),
        finished_at: record.finished_at.map(Time),
        signal: None,
    }
}

fn container_status(container: &Container, init: bool, input: &StatusInput<'_>, blocked: bool) -> ContainerStatus {
    let instances = input.runtime.instances(&container.name, init);
    let default_note = ContainerNote {
        ready: true,
        started: true,
        ..Default::default()
    };
    let note = input
        .notes
        .get(&(init, container.name.clone()))
        .unwrap_or(&default_note);
    let latest = instances.first().copied();
    let previous = instances.get(1).copied();
    let waiting = |reason: &str, message: Option<String>| ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(reason.to_string()),
            message,
        }),
        ..Default::default()
    };
    let mut last_state = previous.map(|p| ContainerState {
        terminated: Some(terminated(p, note.messages.get(&p.id))),
        ..Default::default()
    });
    let state = match (latest, &note.waiting) {
        (Some(l), Some((reason, message))) if l.state == RunState::Exited => {
            last_state = Some(ContainerState {
                terminated: Some(terminated(l, note.messages.get(&l.id))),
                ..Default::default()
            });
            waiting(reason, Some(message.clone()).filter(|m| !m.is_empty()))
        }
        (None, Some((reason, message))) => waiting(reason, Some(message.clone()).filter(|m| !m.is_empty())),
        (Some(l), _) => match l.state {
            RunState::Running => ContainerState {
                running: Some(ContainerStateRunning {
                    started_at: l.started_at.map(Time),
                }),
                ..Default::default()
            },
            RunState::Exited => ContainerState {
                terminated: Some(terminated(l, note.messages.get(&l.id))),
                ..Default::default()
            },
            RunState::Created => waiting("ContainerCreating", None),
        },
        (None, None) if blocked && !init => waiting("PodInitializing", None),
        (None, None) => waiting("ContainerCreating", None),
    };
    let running = latest.is_some_and(|l| l.state == RunState::Running);
    ContainerStatus {
        name: container.name.clone(),
        image: container.image.clone().unwrap_or_default(),
        image_id: latest.map(|l| format!("docker://{}", l.image_id)).unwrap_or_default(),
        container_id: latest.map(|l| format!("docker://{}", l.id)),
        restart_count: latest.map(|l| l.restart_count).unwrap_or(0),
        ready: running && note.ready && note.started,
        started: Some(running && note.started),
        state: Some(state),
        last_state: Some(last_state.unwrap_or_default()),
        ..Default::default()
    }
}

/// Upstream's QoS classes: BestEffort (no requests or limits), Guaranteed (cpu and memory limits equal to
/// requests in every container), else Burstable.
pub fn qos_class(pod: &Pod) -> &'static str {
    let Some(spec) = pod.spec.as_ref() else {
        return "BestEffort";
    };
    let all: Vec<&Container> = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .collect();
    let mut any = false;
    let mut guaranteed = true;
    for c in &all {
        let res = c.resources.clone().unwrap_or_default();
        let limits = res.limits.unwrap_or_default();
        let requests = res.requests.unwrap_or_default();
        for name in ["cpu", "memory"] {
            let limit = limits
                .get(name)
                .and_then(|q| crate::quantity::parse_milli(&q.0))
                .filter(|v| *v != 0);
            let request = requests
                .get(name)
                .and_then(|q| crate::quantity::parse_milli(&q.0))
                .filter(|v| *v != 0)
                .or(limit);
            if limit.is_some() || request.is_some() {
                any = true;
            }
            if limit.is_none() || request != limit {
                guaranteed = false;
            }
        }
    }
    if !any {
        "BestEffort"
    } else if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use std::collections::BTreeMap;

    fn record(name: &str, restart: i32, state: RunState, exit: i64, init: bool) -> ContainerRecord {
        ContainerRecord {
            id: format!("{name}-{restart}"),
            name: name.into(),
            restart_count: restart,
            init,
            hash: String::new(),
            image: "busybox".into(),
            image_id: "sha256:abc".into(),
            state,
            exit_code: exit,
            oom_killed: false,
            error: String::new(),
            started_at: Some(Timestamp::from_second(100).unwrap()),
            finished_at: (state == RunState::Exited).then(|| Timestamp::from_second(200).unwrap()),
            ip: None,
            labels: HashMap::new(),
        }
    }

    fn sandbox() -> ContainerRecord {
        let mut s = record("POD", 0, RunState::Running, 0, false);
        s.ip = Some("172.17.0.9".into());
        s
    }

    fn pod(policy: &str, containers: &[&str], inits: &[&str]) -> Pod {
        let mk = |n: &&str| Container {
            name: n.to_string(),
            image: Some("busybox".into()),
            ..Default::default()
        };
        Pod {
            spec: Some(PodSpec {
                restart_policy: Some(policy.into()),
                containers: containers.iter().map(mk).collect(),
                init_containers: Some(inits.iter().map(mk).collect()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn run(pod: &Pod, rt: &PodRuntime, notes: &HashMap<(bool, String), ContainerNote>) -> PodStatus {
        compute(&StatusInput {
            pod,
            runtime: rt,
            notes,
            host_ip: "10.0.0.1",
            now: Timestamp::from_second(300).unwrap(),
        })
    }

    fn condition<'a>(s: &'a PodStatus, t: &str) -> &'a PodCondition {
        s.conditions.as_ref().unwrap().iter().find(|c| c.type_ == t).unwrap()
    }

    #[test]
    fn running_pod_is_ready_with_ip() {
        let p = pod("Always", &["a"], &[]);
        let rt = PodRuntime {
            sandboxes: vec![sandbox()],
            containers: vec![record("a", 0, RunState::Running, 0, false)],
        };
        let s = run(&p, &rt, &HashMap::new());
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert_eq!(s.pod_ip.as_deref(), Some("172.17.0.9"));
        assert_eq!(condition(&s, "Ready").status, "True");
        assert_eq!(condition(&s, "PodScheduled").status, "True");
        let cs = &s.container_statuses.as_ref().unwrap()[0];
        assert!(cs.ready);
        assert_eq!(cs.container_id.as_deref(), Some("docker://a-0"));
        assert_eq!(cs.image_id, "docker://sha256:abc");
        assert_eq!(s.qos_class.as_deref(), Some("BestEffort"));
    }

    #[test]
    fn crash_loop_shows_waiting_and_last_state() {
        let p = pod("Always", &["a"], &[]);
        let rt = PodRuntime {
            sandboxes: vec![sandbox()],
            containers: vec![
                record("a", 0, RunState::Exited, 1, false),
                record("a", 1, RunState::Exited, 1, false),
            ],
        };
        let notes = HashMap::from([(
            (false, "a".to_string()),
            ContainerNote {
                waiting: Some((
                    "CrashLoopBackOff".into(),
                    "back-off 10s restarting failed container=a pod=p_ns(u)".into(),
                )),
                ready: true,
                started: true,
                ..Default::default()
            },
        )]);
        let s = run(&p, &rt, &notes);
        assert_eq!(s.phase.as_deref(), Some("Running"));
        let cs = &s.container_statuses.as_ref().unwrap()[0];
        assert_eq!(cs.restart_count, 1);
        assert_eq!(
            cs.state.as_ref().unwrap().waiting.as_ref().unwrap().reason.as_deref(),
            Some("CrashLoopBackOff")
        );
        let last = cs.last_state.as_ref().unwrap().terminated.as_ref().unwrap();
        assert_eq!((last.exit_code, last.reason.as_deref()), (1, Some("Error")));
        assert!(!cs.ready);
        let ready = condition(&s, "Ready");
        assert_eq!(ready.reason.as_deref(), Some("ContainersNotReady"));
        assert_eq!(ready.message.as_deref(), Some("containers with unready status: [a]"));
    }

    #[test]
    fn phases_follow_restart_policy() {
        let rt = |exit| PodRuntime {
            sandboxes: vec![],
            containers: vec![record("a", 0, RunState::Exited, exit, false)],
        };
        let notes = HashMap::new();
        assert_eq!(
            run(&pod("Never", &["a"], &[]), &rt(0), &notes).phase.as_deref(),
            Some("Succeeded")
        );
        assert_eq!(
            run(&pod("Never", &["a"], &[]), &rt(2), &notes).phase.as_deref(),
            Some("Failed")
        );
        assert_eq!(
            run(&pod("OnFailure", &["a"], &[]), &rt(0), &notes).phase.as_deref(),
            Some("Succeeded")
        );
        assert_eq!(
            run(&pod("OnFailure", &["a"], &[]), &rt(1), &notes).phase.as_deref(),
            Some("Running")
        );
        assert_eq!(
            run(&pod("Always", &["a"], &[]), &rt(0), &notes).phase.as_deref(),
            Some("Running")
        );
        let done = run(&pod("Never", &["a"], &[]), &rt(0), &notes);
        assert_eq!(condition(&done, "Ready").reason.as_deref(), Some("PodCompleted"));
        let empty = PodRuntime::default();
        assert_eq!(
            run(&pod("Always", &["a"], &[]), &empty, &notes).phase.as_deref(),
            Some("Pending")
        );
    }

    #[test]
    fn init_containers_gate_the_pod() {
        let p = pod("Always", &["a"], &["i1", "i2"]);
        let rt = PodRuntime {
            sandboxes: vec![sandbox()],
            containers: vec![
                record("i1", 0, RunState::Exited, 0, true),
                record("i2", 0, RunState::Running, 0, true),
            ],
        };
        let s = run(&p, &rt, &HashMap::new());
        assert_eq!(s.phase.as_deref(), Some("Pending"));
        let init = condition(&s, "Initialized");
        assert_eq!(init.status, "False");
        assert_eq!(init.message.as_deref(), Some("containers with incomplete status: [i2]"));
        let waiting = s.container_statuses.as_ref().unwrap()[0]
            .state
            .as_ref()
            .unwrap()
            .waiting
            .clone()
            .unwrap();
        assert_eq!(waiting.reason.as_deref(), Some("PodInitializing"));
        let failed = PodRuntime {
            sandboxes: vec![],
            containers: vec![record("i1", 0, RunState::Exited, 1, true)],
        };
        assert_eq!(
            run(&pod("Never", &["a"], &["i1"]), &failed, &HashMap::new())
                .phase
                .as_deref(),
            Some("Failed")
        );
    }

    #[test]
    fn qos_classes() {
        let with = |limits: &[(&str, &str)], requests: &[(&str, &str)]| {
            let q = |v: &[(&str, &str)]| {
                Some(
                    v.iter()
                        .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                        .collect::<BTreeMap<_, _>>(),
                )
            };
            Pod {
                spec: Some(PodSpec {
                    containers: vec![Container {
                        name: "a".into(),
                        resources: Some(ResourceRequirements {
                            limits: q(limits),
                            requests: q(requests),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                ..Default::default()
            }
        };
        assert_eq!(qos_class(&with(&[], &[])), "BestEffort");
        assert_eq!(qos_class(&with(&[("cpu", "1"), ("memory", "1Gi")], &[])), "Guaranteed");
        assert_eq!(
            qos_class(&with(&[("cpu", "1"), ("memory", "1Gi")], &[("cpu", "500m")])),
            "Burstable"
        );
        assert_eq!(qos_class(&with(&[], &[("memory", "1Gi")])), "Burstable");
    }
}
