//! The node lifecycle controller (upstream's `pkg/controller/nodelifecycle`, kube-controller-manager's
//! `node-lifecycle-controller`): notices nodes that stop reporting and taints them, so the taint
//! eviction controller moves their pods, as seed 000 section 2.4 says Kubernetes does by itself.
//!
//! Every `monitor_period` (upstream's `--node-monitor-period`, 5 s):
//! - A node's last sign of life is the last time this controller saw its Lease in
//!   `kube-node-lease` renewed or its Ready condition's heartbeat change (its own clock, never the
//!   node's). After `grace_period` (`--node-monitor-grace-period`, 50 s; `--node-startup-grace-period`,
//!   60 s, while the node never posted Ready) without one, its Ready, MemoryPressure, DiskPressure
//!   and PIDPressure conditions become `Unknown`: `NodeStatusUnknown`, "Kubelet stopped posting
//!   node status." (`NodeStatusNeverUpdated`, "Kubelet never posted node status." for a condition
//!   it never posted).
//! - When a node stops being Ready: the event `NodeNotReady` ("Node N status is now:
//!   NodeNotReady") and its pods' Ready condition set to False (event `NodeNotReady`, "Node is not
//!   ready", on each).
//! - A node observed `Ready=Unknown` is queued for `node.kubernetes.io/unreachable:NoExecute`, one
//!   observed `Ready=False` for `node.kubernetes.io/not-ready:NoExecute` (the one replaces the other
//!   at once); a Ready node loses both. The queue is one per zone (`topology.kubernetes.io/region`
//!   and `zone`), drained every 100 ms through a token bucket of burst 1: `--node-eviction-rate`
//!   (0.1/s) while the zone is Normal, `--secondary-node-eviction-rate` (0.01/s) in a partial
//!   disruption (at least `--unhealthy-zone-threshold`, 55%, and more than two nodes not Ready) of a
//!   zone larger than `--large-cluster-size-threshold` (50) and none in a smaller one. When every
//!   zone has no Ready node at all (the control plane, not the nodes, is likely cut off), no node
//!   is tainted and the NoExecute taints go; when one comes back every node gets a fresh grace period.
//!
//! On every node change (upstream's TaintNodesByCondition): the NoSchedule taints
//! `node.kubernetes.io/not-ready` (Ready False), `unreachable` (Ready Unknown), `memory-pressure`,
//! `disk-pressure`, `pid-pressure`, `network-unavailable` (those conditions True) and
//! `unschedulable` (`spec.unschedulable`) are added and removed to match.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeCondition, Pod, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use kube::Api;
use kube::api::PostParams;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::informers::{Informer, SharedInformerFactory};

use crate::controller_utils::{self as cu, Recorder, WorkQueue};

pub const CONTROLLER_NAME: &str = "node-controller";
pub const TAINT_NOT_READY: &str = "node.kubernetes.io/not-ready";
pub const TAINT_UNREACHABLE: &str = "node.kubernetes.io/unreachable";
const LEASE_NAMESPACE: &str = "kube-node-lease";
const EXCLUDE_DISRUPTION_LABEL: &str = "node.kubernetes.io/exclude-disruption";
const NO_EXECUTE: &str = "NoExecute";
const NO_SCHEDULE: &str = "NoSchedule";
/// How often the NoExecute queues are drained (upstream's `NodeEvictionPeriod`).
const TAINTING_PERIOD: Duration = Duration::from_millis(100);
/// The conditions a lost node's are set Unknown (NetworkUnavailable is the network plugin's).
const NODE_CONDITIONS: [&str; 4] = ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure"];

/// Upstream's flags, with its defaults (kube-controller-manager 1.33).
#[derive(Clone, Debug, PartialEq)]
pub struct NodeLifecycleConfig {
    pub monitor_period: Duration,
    pub grace_period: Duration,
    pub startup_grace_period: Duration,
    pub eviction_rate: f64,
    pub secondary_eviction_rate: f64,
    pub unhealthy_zone_threshold: f64,
    pub large_cluster_threshold: usize,
}

impl Default for NodeLifecycleConfig {
    fn default() -> Self {
        Self {
            monitor_period: Duration::from_secs(5),
            grace_period: Duration::from_secs(50),
            startup_grace_period: Duration::from_secs(60),
            eviction_rate: 0.1,
            secondary_eviction_rate: 0.01,
            unhealthy_zone_threshold: 0.55,
            large_cluster_threshold: 50,
        }
    }
}

// ---- the rate-limited queue ----

/// A token bucket of burst 1 (`qps` 0: never a token).
#[derive(Debug)]
struct TokenBucket {
    qps: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    fn new(qps: f64, now: Instant) -> Self {
        Self {
            qps,
            tokens: if qps > 0.0 { 1.0 } else { 0.0 },
            last: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        if self.qps > 0.0 {
            let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
            self.tokens = (self.tokens + elapsed * self.qps).min(1.0);
        }
        self.last = now;
    }

    fn try_accept(&mut self, now: Instant) -> bool {
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Upstream's `RateLimitedTimedQueue`: nodes waiting to be tainted, each once until removed.
#[derive(Debug)]
struct TaintQueue {
    /// Names added and not removed (processed ones stay, so they are not added again).
    set: HashSet<String>,
    /// Waiting: name to when it may be processed.
    waiting: BTreeMap<String, Instant>,
    limiter: TokenBucket,
}

impl TaintQueue {
    fn new(qps: f64, now: Instant) -> Self {
        Self {
            set: HashSet::new(),
            waiting: BTreeMap::new(),
            limiter: TokenBucket::new(qps, now),
        }
    }

    fn add(&mut self, name: &str, now: Instant) -> bool {
        if !self.set.insert(name.to_string()) {
            return false;
        }
        self.waiting.insert(name.to_string(), now);
        true
    }

    fn remove(&mut self, name: &str) {
        self.set.remove(name);
        self.waiting.remove(name);
    }

    /// The next node due, if the limiter gives a token (a token is spent even when the head is
    /// not yet due, as upstream's).
    fn next_due(&mut self, now: Instant) -> Option<String> {
        let (name, at) = self
            .waiting
            .iter()
            .min_by_key(|(_, at)| **at)
            .map(|(n, a)| (n.clone(), *a))?;
        if !self.limiter.try_accept(now) || now < at {
            return None;
        }
        Some(name)
    }

    /// Processed: it stays in the set until removed.
    fn done(&mut self, name: &str) {
        self.waiting.remove(name);
    }

    fn retry_at(&mut self, name: &str, at: Instant) {
        if let Some(t) = self.waiting.get_mut(name) {
            *t = at;
        }
    }

    fn swap_limiter(&mut self, qps: f64, now: Instant) {
        if (self.limiter.qps - qps).abs() < f64::EPSILON {
            return;
        }
        let mut limiter = TokenBucket::new(qps.max(0.0), now);
        self.limiter.refill(now);
        if self.limiter.tokens < 1.0 {
            limiter.tokens = 0.0;
        }
        self.limiter = limiter;
    }
}

// ---- zones ----

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ZoneState {
    Initial,
    Normal,
    PartialDisruption,
    FullDisruption,
}

/// Upstream's `GetZoneKey`: region and zone, from the GA or the beta labels.
pub fn zone_key(node: &Node) -> String {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let get = |beta: &str, ga: &str| labels.get(beta).or_else(|| labels.get(ga)).cloned().unwrap_or_default();
    let zone = get("failure-domain.beta.kubernetes.io/zone", "topology.kubernetes.io/zone");
    let region = get(
        "failure-domain.beta.kubernetes.io/region",
        "topology.kubernetes.io/region",
    );
    if zone.is_empty() && region.is_empty() {
        String::new()
    } else {
        format!("{region}:\x00:{zone}")
    }
}

/// Upstream's `ComputeZoneState` from the Ready condition statuses of a zone's nodes.
pub fn zone_state(ready: usize, not_ready: usize, threshold: f64) -> ZoneState {
    if ready == 0 && not_ready > 0 {
        ZoneState::FullDisruption
    } else if not_ready > 2 && not_ready as f64 / (not_ready + ready) as f64 >= threshold {
        ZoneState::PartialDisruption
    } else {
        ZoneState::Normal
    }
}

// ---- node health ----

fn condition<'a>(node: &'a Node, type_: &str) -> Option<&'a NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
}

fn ready_status(node: &Node) -> Option<String> {
    condition(node, "Ready").map(|c| c.status.clone())
}

/// What this controller last saw of a node, in its own clock.
#[derive(Debug)]
struct Health {
    probe: Instant,
    /// The Ready condition's (heartbeat, transition) as last observed.
    ready: Option<(Option<Time>, Option<Time>)>,
    lease_renew: Option<MicroTime>,
}

fn has_taint(node: &Node, key: &str, effect: &str) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == key && t.effect == effect))
}

fn taint(key: &str, effect: &str) -> Taint {
    Taint {
        key: key.into(),
        value: None,
        effect: effect.into(),
        time_added: Some(cu::now()),
    }
}

/// Changes a node's taints with `change` (false: nothing to write), retried on conflicts.
async fn update_taints(
    client: &kube::Client,
    name: &str,
    change: impl Fn(&mut Vec<Taint>) -> bool,
) -> anyhow::Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    for _ in 0..5 {
        let Some(mut node) = api.get_opt(name).await? else {
            return Ok(());
        };
        let spec = node.spec.get_or_insert_with(Default::default);
        let mut taints = spec.taints.clone().unwrap_or_default();
        if !change(&mut taints) {
            return Ok(());
        }
        spec.taints = (!taints.is_empty()).then_some(taints);
        match api.replace(name, &PostParams::default(), &node).await {
            Ok(_) => return Ok(()),
            Err(e) if cu::is_conflict(&e) => continue,
            Err(e) if cu::is_not_found(&e) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    }
    anyhow::bail!("updating the taints of node {name}: conflicts")
}

/// Adds `add` (key, effect) and removes `remove` from a node's taints.
async fn swap_taints(
    client: &kube::Client,
    name: &str,
    add: &[(&str, &str)],
    remove: &[(&str, &str)],
) -> anyhow::Result<()> {
    update_taints(client, name, |taints| {
        let before = taints.len();
        taints.retain(|t| !remove.iter().any(|(k, e)| t.key == *k && t.effect == *e));
        let mut changed = taints.len() != before;
        for (k, e) in add {
            if !taints.iter().any(|t| t.key == *k && t.effect == *e) {
                taints.push(taint(k, e));
                changed = true;
            }
        }
        changed
    })
    .await
}

struct Monitor {
    client: kube::Client,
    config: NodeLifecycleConfig,
    recorder: Recorder,
    health: HashMap<String, Health>,
    zones: HashMap<String, (ZoneState, TaintQueue)>,
    all_disrupted: bool,
}

impl Monitor {
    fn queue(&mut self, zone: &str, now: Instant) -> &mut TaintQueue {
        let rate = self.config.eviction_rate;
        &mut self
            .zones
            .entry(zone.to_string())
            .or_insert_with(|| (ZoneState::Initial, TaintQueue::new(rate, now)))
            .1
    }

    /// Upstream's `tryUpdateNodeHealth`: the Ready status observed and the one now in force.
    async fn update_health(
        &mut self,
        node: &Node,
        lease: Option<&Lease>,
        now: Instant,
    ) -> (Option<String>, Option<String>) {
        let name = node.metadata.name.clone().unwrap_or_default();
        let observed = ready_status(node);
        let ready = condition(node, "Ready").map(|c| (c.last_heartbeat_time.clone(), c.last_transition_time.clone()));
        let grace = if observed.is_some() {
            self.config.grace_period
        } else {
            self.config.startup_grace_period
        };
        let health = self.health.entry(name.clone()).or_insert_with(|| Health {
            probe: now,
            ready: ready.clone(),
            lease_renew: None,
        });
        if health.ready.as_ref().map(|r| &r.0) != ready.as_ref().map(|r| &r.0) {
            health.probe = now;
        }
        health.ready = ready;
        let renew = lease.and_then(|l| l.spec.as_ref()).and_then(|s| s.renew_time.clone());
        if renew.is_some()
            && health
                .lease_renew
                .as_ref()
                .is_none_or(|saved| Some(saved) < renew.as_ref())
        {
            health.lease_renew = renew;
            health.probe = now;
        }
        if now <= health.probe + grace {
            return (observed.clone(), observed);
        }
        // Lost: every condition it posts becomes Unknown.
        let mut updated = node.clone();
        let status = updated.status.get_or_insert_with(Default::default);
        let conditions = status.conditions.get_or_insert_with(Vec::new);
        let stamp = cu::now();
        let mut changed = false;
        for type_ in NODE_CONDITIONS {
            match conditions.iter_mut().find(|c| c.type_ == type_) {
                Some(c) if c.status != "Unknown" => {
                    c.status = "Unknown".into();
                    c.reason = Some("NodeStatusUnknown".into());
                    c.message = Some("Kubelet stopped posting node status.".into());
                    c.last_transition_time = Some(stamp.clone());
                    changed = true;
                }
                Some(_) => {}
                None => {
                    conditions.push(NodeCondition {
                        type_: type_.into(),
                        status: "Unknown".into(),
                        reason: Some("NodeStatusNeverUpdated".into()),
                        message: Some("Kubelet never posted node status.".into()),
                        last_heartbeat_time: node.metadata.creation_timestamp.clone(),
                        last_transition_time: Some(stamp.clone()),
                    });
                    changed = true;
                }
            }
        }
        if changed {
            let api: Api<Node> = Api::all(self.client.clone());
            match api.replace_status(&name, &PostParams::default(), &updated).await {
                Ok(_) => tracing::info!(node = %name, "node stopped posting its status: conditions Unknown"),
                // A newer version: the node may have come back; the next pass sees it.
                Err(e) if cu::is_conflict(&e) || cu::is_not_found(&e) => return (observed.clone(), observed),
                Err(e) => {
                    tracing::warn!(node = %name, error = %e, "marking the node's conditions Unknown");
                    return (observed.clone(), observed);
                }
            }
        }
        (observed, Some("Unknown".to_string()))
    }

    /// Removes both NoExecute taints and forgets any queued tainting (upstream's `markNodeAsReachable`).
    async fn mark_reachable(&mut self, node: &Node, now: Instant) {
        let name = node.metadata.name.clone().unwrap_or_default();
        let zone = zone_key(node);
        self.queue(&zone, now).remove(&name);
        if has_taint(node, TAINT_UNREACHABLE, NO_EXECUTE) || has_taint(node, TAINT_NOT_READY, NO_EXECUTE) {
            let remove = [(TAINT_UNREACHABLE, NO_EXECUTE), (TAINT_NOT_READY, NO_EXECUTE)];
            if let Err(e) = swap_taints(&self.client, &name, &[], &remove).await {
                tracing::warn!(node = %name, error = format!("{e:#}"), "removing the NoExecute taints");
            }
        }
    }

    /// Upstream's `processTaintBaseEviction`, from the Ready status observed.
    async fn taint_by_readiness(&mut self, node: &Node, observed: Option<&str>, now: Instant) {
        let name = node.metadata.name.clone().unwrap_or_default();
        let zone = zone_key(node);
        let (wanted, other) = match observed {
            Some("False") => (TAINT_NOT_READY, TAINT_UNREACHABLE),
            Some("Unknown") => (TAINT_UNREACHABLE, TAINT_NOT_READY),
            Some("True") => {
                self.mark_reachable(node, now).await;
                return;
            }
            _ => return,
        };
        if has_taint(node, other, NO_EXECUTE) {
            // Already evicting: the other reason replaces the first at once.
            let result = swap_taints(&self.client, &name, &[(wanted, NO_EXECUTE)], &[(other, NO_EXECUTE)]).await;
            if let Err(e) = result {
                tracing::warn!(node = %name, error = format!("{e:#}"), "swapping the node's NoExecute taint");
            }
            return;
        }
        let queue = self.queue(&zone, now);
        if !has_taint(node, wanted, NO_EXECUTE) {
            queue.remove(&name);
        }
        queue.add(&name, now);
    }

    /// Sets the Ready condition of the node's pods to False (upstream's `MarkPodsNotReady`).
    async fn mark_pods_not_ready(&self, node: &str, pods: &Informer<Pod>) {
        for pod in pods.list() {
            if pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(node) {
                continue;
            }
            let Some(conditions) = pod.status.as_ref().and_then(|s| s.conditions.clone()) else {
                continue;
            };
            if !conditions.iter().any(|c| c.type_ == "Ready" && c.status != "False") {
                continue;
            }
            let mut updated = (*pod).clone();
            if let Some(c) = updated
                .status
                .as_mut()
                .and_then(|s| s.conditions.as_mut())
                .and_then(|c| c.iter_mut().find(|c| c.type_ == "Ready"))
            {
                c.status = "False".into();
                c.last_transition_time = Some(cu::now());
            }
            let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
            let name = pod.metadata.name.as_deref().unwrap_or_default();
            let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
            match api.replace_status(name, &PostParams::default(), &updated).await {
                Ok(_) => {}
                Err(e) if cu::is_not_found(&e) => continue,
                Err(e) => tracing::debug!(pod = %format!("{ns}/{name}"), error = %e, "marking the pod not ready"),
            }
            self.recorder
                .event(&*pod, "Warning", "NodeNotReady", "Node is not ready");
        }
    }

    /// One pass of upstream's `monitorNodeHealth`.
    async fn monitor(&mut self, nodes: &Store<Node>, leases: &Store<Lease>, pods: &Informer<Pod>) {
        let now = Instant::now();
        let nodes = nodes.state();
        let names: HashSet<String> = nodes.iter().filter_map(|n| n.metadata.name.clone()).collect();
        self.health.retain(|name, _| names.contains(name));
        for (_, queue) in self.zones.values_mut() {
            let gone: Vec<String> = queue.set.iter().filter(|n| !names.contains(*n)).cloned().collect();
            for name in gone {
                queue.remove(&name);
            }
        }
        let mut current_ready: Vec<(String, bool, bool)> = Vec::new();
        for node in &nodes {
            let name = node.metadata.name.clone().unwrap_or_default();
            let first_seen = !self.health.contains_key(&name);
            let lease = leases.get(&ObjectRef::new(&name).within(LEASE_NAMESPACE));
            let (observed, current) = self.update_health(node, lease.as_deref(), now).await;
            if first_seen {
                self.mark_reachable(node, now).await;
            }
            if !self.all_disrupted {
                self.taint_by_readiness(node, observed.as_deref(), now).await;
            }
            if current.as_deref() != Some("True") && observed.as_deref() == Some("True") {
                let message = format!("Node {name} status is now: NodeNotReady");
                self.recorder.event(&**node, "Normal", "NodeNotReady", &message);
                self.mark_pods_not_ready(&name, pods).await;
            }
            let excluded = node
                .metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key(EXCLUDE_DISRUPTION_LABEL));
            current_ready.push((zone_key(node), current.as_deref() == Some("True"), excluded));
        }
        self.handle_disruption(&nodes, &current_ready, now).await;
    }

    /// Upstream's `handleDisruption`: zone states, rates, and the all-zones-down mode.
    async fn handle_disruption(
        &mut self,
        nodes: &[std::sync::Arc<Node>],
        ready: &[(String, bool, bool)],
        now: Instant,
    ) {
        let mut counts: HashMap<&str, (usize, usize)> = HashMap::new();
        for (zone, is_ready, excluded) in ready {
            if *excluded {
                continue;
            }
            let c = counts.entry(zone.as_str()).or_default();
            if *is_ready { c.0 += 1 } else { c.1 += 1 }
        }
        let threshold = self.config.unhealthy_zone_threshold;
        let new_states: HashMap<String, (ZoneState, usize)> = counts
            .iter()
            .map(|(zone, (r, n))| (zone.to_string(), (zone_state(*r, *n, threshold), r + n)))
            .collect();
        self.zones.retain(|zone, _| new_states.contains_key(zone));
        let all_full = !new_states.is_empty() && new_states.values().all(|(s, _)| *s == ZoneState::FullDisruption);
        if all_full && !self.all_disrupted {
            tracing::warn!("every node is not Ready: not tainting any node until one is (disruption mode)");
            for node in nodes {
                self.mark_reachable(node, now).await;
            }
            for (zone, _) in new_states {
                let queue = self.queue(&zone, now);
                queue.swap_limiter(0.0, now);
                if let Some(entry) = self.zones.get_mut(&zone) {
                    entry.0 = ZoneState::FullDisruption;
                }
            }
            self.all_disrupted = true;
            return;
        }
        let recovered = self.all_disrupted && !all_full;
        if recovered {
            tracing::info!("a node is Ready again: leaving disruption mode");
            for health in self.health.values_mut() {
                health.probe = now;
            }
            self.all_disrupted = false;
        }
        if self.all_disrupted {
            return;
        }
        for (zone, (state, size)) in new_states {
            let rate = match state {
                ZoneState::Normal | ZoneState::FullDisruption | ZoneState::Initial => self.config.eviction_rate,
                ZoneState::PartialDisruption if size > self.config.large_cluster_threshold => {
                    self.config.secondary_eviction_rate
                }
                ZoneState::PartialDisruption => 0.0,
            };
            let entry = self
                .zones
                .entry(zone.clone())
                .or_insert_with(|| (ZoneState::Initial, TaintQueue::new(rate, now)));
            if entry.0 != state || recovered {
                if entry.0 != state {
                    tracing::info!(zone = %zone.replace('\0', ""), from = ?entry.0, to = ?state, "zone state changed");
                }
                entry.1.swap_limiter(rate, now);
                entry.0 = state;
            }
        }
    }

    /// Upstream's `doNoExecuteTaintingPass`: the queued nodes whose zone's limiter allows.
    async fn taint_pass(&mut self, nodes: &Store<Node>) {
        let now = Instant::now();
        let zones: Vec<String> = self.zones.keys().cloned().collect();
        for zone in zones {
            while let Some((_, queue)) = self.zones.get_mut(&zone) {
                let Some(name) = queue.next_due(now) else {
                    break;
                };
                let Some(node) = nodes.get(&ObjectRef::new(&name)) else {
                    queue.done(&name);
                    continue;
                };
                let (add, remove) = match ready_status(&node).as_deref() {
                    Some("False") => (TAINT_NOT_READY, TAINT_UNREACHABLE),
                    Some("Unknown") => (TAINT_UNREACHABLE, TAINT_NOT_READY),
                    Some(_) => {
                        queue.done(&name);
                        continue;
                    }
                    None => {
                        queue.retry_at(&name, now + Duration::from_millis(50));
                        break;
                    }
                };
                match swap_taints(&self.client, &name, &[(add, NO_EXECUTE)], &[(remove, NO_EXECUTE)]).await {
                    Ok(()) => {
                        tracing::info!(node = %name, taint = add, "tainted the node NoExecute");
                        if let Some((_, queue)) = self.zones.get_mut(&zone) {
                            queue.done(&name);
                        }
                    }
                    Err(e) => {
                        tracing::warn!(node = %name, error = format!("{e:#}"), "tainting the node");
                        if let Some((_, queue)) = self.zones.get_mut(&zone) {
                            queue.retry_at(&name, now + Duration::from_secs(1));
                        }
                        break;
                    }
                }
            }
        }
    }
}

/// The NoSchedule taints a node's conditions and `spec.unschedulable` call for.
pub fn condition_taints(node: &Node) -> Vec<&'static str> {
    let mut keys = Vec::new();
    match ready_status(node).as_deref() {
        Some("False") => keys.push(TAINT_NOT_READY),
        Some("Unknown") => keys.push(TAINT_UNREACHABLE),
        _ => {}
    }
    for (type_, key) in [
        ("MemoryPressure", "node.kubernetes.io/memory-pressure"),
        ("DiskPressure", "node.kubernetes.io/disk-pressure"),
        ("NetworkUnavailable", "node.kubernetes.io/network-unavailable"),
        ("PIDPressure", "node.kubernetes.io/pid-pressure"),
    ] {
        if condition(node, type_).is_some_and(|c| c.status == "True") {
            keys.push(key);
        }
    }
    if node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true) {
        keys.push("node.kubernetes.io/unschedulable");
    }
    keys
}

const CONDITION_TAINT_KEYS: [&str; 7] = [
    TAINT_NOT_READY,
    TAINT_UNREACHABLE,
    "node.kubernetes.io/memory-pressure",
    "node.kubernetes.io/disk-pressure",
    "node.kubernetes.io/network-unavailable",
    "node.kubernetes.io/pid-pressure",
    "node.kubernetes.io/unschedulable",
];

/// Upstream's `doNoScheduleTaintingPass` for one node.
async fn sync_no_schedule(
    client: &kube::Client,
    nodes: &Store<Node>,
    name: String,
) -> anyhow::Result<Option<Duration>> {
    let Some(node) = nodes.get(&ObjectRef::new(&name)) else {
        return Ok(None);
    };
    let wanted = condition_taints(&node);
    let has: Vec<&str> = CONDITION_TAINT_KEYS
        .iter()
        .copied()
        .filter(|k| has_taint(&node, k, NO_SCHEDULE))
        .collect();
    if has.iter().all(|k| wanted.contains(k)) && wanted.iter().all(|k| has.contains(k)) {
        return Ok(None);
    }
    let add: Vec<(&str, &str)> = wanted.iter().map(|k| (*k, NO_SCHEDULE)).collect();
    let remove: Vec<(&str, &str)> = CONDITION_TAINT_KEYS
        .iter()
        .filter(|k| !wanted.contains(k))
        .map(|k| (*k, NO_SCHEDULE))
        .collect();
    swap_taints(client, &name, &add, &remove).await?;
    Ok(None)
}

pub async fn run(
    client: kube::Client,
    config: NodeLifecycleConfig,
    informers: SharedInformerFactory,
) -> anyhow::Result<()> {
    // NoSchedule taints follow every node change.
    let queue = WorkQueue::new();
    let nodes = cu::spawn_store_watch(Api::<Node>::all(client.clone()), queue.clone(), |n: &Node| {
        n.metadata.name.clone().into_iter().collect()
    });
    let no_schedule = {
        let (client, nodes) = (client.clone(), nodes.clone());
        tokio::spawn(async move {
            queue
                .run("node-lifecycle-taints", |name| sync_no_schedule(&client, &nodes, name))
                .await
        })
    };
    let idle = WorkQueue::new();
    let leases = cu::spawn_store_watch(
        Api::<Lease>::namespaced(client.clone(), LEASE_NAMESPACE),
        idle.clone(),
        |_: &Lease| Vec::new(),
    );
    let pods = informers.informer::<Pod>();
    // Wait for the first lists, so no node looks silent for want of its lease.
    let _ = nodes.wait_until_ready().await;
    let _ = leases.wait_until_ready().await;
    pods.wait_synced().await;
    let mut monitor = Monitor {
        recorder: Recorder::for_component(client.clone(), CONTROLLER_NAME),
        client,
        config: config.clone(),
        health: HashMap::new(),
        zones: HashMap::new(),
        all_disrupted: false,
    };
    let mut monitor_tick = tokio::time::interval(config.monitor_period);
    let mut taint_tick = tokio::time::interval(TAINTING_PERIOD);
    monitor_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    taint_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::select! {
        result = no_schedule => match result {
            Ok(result) => result,
            Err(e) => Err(anyhow::anyhow!("the NoSchedule tainting task failed: {e}")),
        },
        () = async {
            loop {
                tokio::select! {
                    _ = monitor_tick.tick() => monitor.monitor(&nodes, &leases, &pods).await,
                    _ = taint_tick.tick() => monitor.taint_pass(&nodes).await,
                }
            }
        } => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn zone_states_as_upstream_computes_them() {
        assert_eq!(zone_state(3, 0, 0.55), ZoneState::Normal);
        assert_eq!(zone_state(0, 3, 0.55), ZoneState::FullDisruption);
        // Two not ready are never a partial disruption, whatever the share.
        assert_eq!(zone_state(1, 2, 0.55), ZoneState::Normal);
        assert_eq!(zone_state(2, 3, 0.55), ZoneState::PartialDisruption);
        assert_eq!(zone_state(10, 3, 0.55), ZoneState::Normal);
        assert_eq!(zone_state(0, 0, 0.55), ZoneState::Normal);
    }

    #[test]
    fn zone_keys_from_ga_or_beta_labels() {
        let node = |labels: serde_json::Value| -> Node {
            serde_json::from_value(json!({"metadata": {"name": "n", "labels": labels}})).expect("a Node")
        };
        assert_eq!(zone_key(&node(json!({}))), "");
        assert_eq!(
            zone_key(&node(
                json!({"topology.kubernetes.io/zone": "a", "topology.kubernetes.io/region": "r"})
            )),
            "r:\u{0}:a"
        );
        assert_eq!(
            zone_key(&node(
                json!({"failure-domain.beta.kubernetes.io/zone": "b", "topology.kubernetes.io/zone": "a"})
            )),
            ":\u{0}:b"
        );
    }

    #[test]
    fn the_queue_takes_each_node_once_at_the_limiters_pace() {
        let start = Instant::now();
        let mut q = TaintQueue::new(0.1, start);
        assert!(q.add("a", start));
        assert!(q.add("b", start));
        assert!(!q.add("a", start));
        // Burst 1: one now, the next ten seconds later.
        assert_eq!(q.next_due(start), Some("a".to_string()));
        q.done("a");
        assert_eq!(q.next_due(start + Duration::from_secs(1)), None);
        assert_eq!(q.next_due(start + Duration::from_secs(11)), Some("b".to_string()));
        q.done("b");
        // Processed names stay until removed.
        assert!(!q.add("a", start));
        q.remove("a");
        assert!(q.add("a", start));
        // A rate of 0 never gives a token.
        q.swap_limiter(0.0, start + Duration::from_secs(100));
        assert_eq!(q.next_due(start + Duration::from_secs(200)), None);
    }

    #[test]
    fn condition_taints_follow_conditions_and_cordoning() {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "n"},
            "spec": {"unschedulable": true},
            "status": {"conditions": [
                {"type": "Ready", "status": "Unknown"},
                {"type": "MemoryPressure", "status": "True"},
                {"type": "DiskPressure", "status": "False"},
            ]},
        }))
        .expect("a Node");
        assert_eq!(
            condition_taints(&node),
            [
                TAINT_UNREACHABLE,
                "node.kubernetes.io/memory-pressure",
                "node.kubernetes.io/unschedulable"
            ]
        );
    }
}
