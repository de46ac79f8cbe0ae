//! Node IPAM, as upstream's range allocator (`pkg/controller/nodeipam/ipam/range_allocator.go`
//! on `cidrset`): every Node without a podCIDR gets the next free subnet of `--cluster-cidr`
//! (`--node-cidr-mask-size` bits long) as `spec.podCIDR` and `spec.podCIDRs`, which its agent
//! puts its pods on.
//!
//! - The occupied subnets are rebuilt from the Nodes at every (re)list, before anything is
//!   allocated, and a subnet is released when its Node is deleted. The part of the service range
//!   that overlaps the cluster CIDR is never handed out (upstream's `filterOutServiceRange`).
//! - Subnets are handed out round robin from the one after the last given, as `cidrset` does, so
//!   a released subnet is not reused at once.
//! - A Node the range cannot serve gets upstream's `CIDRNotAvailable` event once and waits: it is
//!   tried again when a subnet is released, never in a loop.
//! - Simulated nodes (`skiff.dev/simulated`) get none: the simulator gives them its own (from
//!   10.64.0.0/10) as it registers them, and thousands of them would exhaust any range (one they
//!   carry inside the cluster CIDR is still counted as occupied).
//! - A podCIDR never changes once set (the API server's validation, as upstream's
//!   `ValidateNodeUpdate`); a patch that finds one set by someone else releases the reservation.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher;
use parking_lot::Mutex;
use skiff_api::cidr::Ipv4Cidr;

use crate::controller_utils::{self as cu, Recorder, WorkQueue};

const CONTROLLER_NAME: &str = "node-ipam-controller";
/// Upstream's recorder component for the range allocator's events.
const EVENT_COMPONENT: &str = "cidrAllocator";
/// The annotation on nodes that `skiff sim` registers.
const SIMULATED_ANNOTATION: &str = "skiff.dev/simulated";
/// The widest bitmap of subnets a set keeps (2^24 bits, 2 MiB), as upstream caps IPv6 sets.
const MAX_SUBNET_BITS: u8 = 24;

/// The controller's configuration (kube-controller-manager's `--cluster-cidr`,
/// `--node-cidr-mask-size`, and the service range it keeps out).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeIpamConfig {
    pub cluster_cidr: Ipv4Cidr,
    pub node_cidr_mask_size: u8,
    pub service_cidr: Option<Ipv4Cidr>,
}

/// Why a [`CidrSet`] refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CidrSetError {
    /// Upstream's `ErrCIDRRangeNoCIDRsRemaining`.
    #[error("CIDR allocation failed; there are no remaining CIDRs left to allocate in the accepted range")]
    NoCidrsRemaining,
    /// Upstream's `ErrCIDRSetSubNetTooBig`.
    #[error("New CIDR set failed; the node CIDR size is too big")]
    SubNetTooBig,
    /// kube-controller-manager's check of its flags.
    #[error(
        "Controller: Invalid --cluster-cidr, mask size of cluster CIDR must be less than or equal to --node-cidr-mask-size configured for CIDR family"
    )]
    MaskTooSmall,
    #[error("cidr {cidr} is out the range of cluster cidr {cluster}")]
    OutOfRange { cidr: Ipv4Cidr, cluster: Ipv4Cidr },
}

/// Upstream's `cidrset.CidrSet`: which `/mask` subnets of the cluster CIDR are taken.
#[derive(Clone, Debug)]
pub struct CidrSet {
    cluster: Ipv4Cidr,
    mask: u8,
    max: u32,
    used: Vec<u64>,
    allocated: u32,
    next_candidate: u32,
}

impl CidrSet {
    pub fn new(cluster: Ipv4Cidr, mask: u8) -> Result<CidrSet, CidrSetError> {
        if mask < cluster.prefix_len() || mask > 32 {
            return Err(CidrSetError::MaskTooSmall);
        }
        let bits = mask - cluster.prefix_len();
        if bits > MAX_SUBNET_BITS {
            return Err(CidrSetError::SubNetTooBig);
        }
        let max = 1u32 << bits;
        Ok(CidrSet {
            cluster,
            mask,
            max,
            used: vec![0; max.div_ceil(64) as usize],
            allocated: 0,
            next_candidate: 0,
        })
    }

    fn is_used(&self, i: u32) -> bool {
        self.used[(i / 64) as usize] & (1 << (i % 64)) != 0
    }

    fn set(&mut self, i: u32, used: bool) {
        if self.is_used(i) == used {
            return;
        }
        let word = &mut self.used[(i / 64) as usize];
        if used {
            *word |= 1 << (i % 64);
            self.allocated += 1;
        } else {
            *word &= !(1 << (i % 64));
            self.allocated -= 1;
        }
    }

    fn subnet(&self, i: u32) -> Ipv4Cidr {
        let step = 1u64 << (32 - u32::from(self.mask));
        let addr = u64::from(u32::from(self.cluster.network())) + u64::from(i) * step;
        Ipv4Cidr::new(std::net::Ipv4Addr::from(addr as u32), self.mask).unwrap_or(self.cluster)
    }

    /// The next free subnet, searching round robin from the one after the last handed out.
    pub fn allocate_next(&mut self) -> Result<Ipv4Cidr, CidrSetError> {
        if self.allocated >= self.max {
            return Err(CidrSetError::NoCidrsRemaining);
        }
        for offset in 0..self.max {
            let candidate = (self.next_candidate + offset) % self.max;
            if !self.is_used(candidate) {
                self.set(candidate, true);
                self.next_candidate = (candidate + 1) % self.max;
                return Ok(self.subnet(candidate));
            }
        }
        Err(CidrSetError::NoCidrsRemaining)
    }

    /// The indexes of the subnets `cidr` overlaps (upstream's `getBeginningAndEndIndices`).
    fn indexes(&self, cidr: &Ipv4Cidr) -> Result<(u32, u32), CidrSetError> {
        if !self.cluster.overlaps(cidr) {
            return Err(CidrSetError::OutOfRange {
                cidr: *cidr,
                cluster: self.cluster,
            });
        }
        let shift = 32 - u32::from(self.mask);
        let base = u32::from(self.cluster.network()) >> shift;
        let (first, last) = if cidr.prefix_len() <= self.cluster.prefix_len() {
            (self.cluster.nth(0), self.cluster.nth(u32::MAX))
        } else {
            (cidr.nth(0), cidr.nth(u32::MAX))
        };
        Ok(((u32::from(first) >> shift) - base, (u32::from(last) >> shift) - base))
    }

    /// Marks every subnet `cidr` overlaps as taken.
    pub fn occupy(&mut self, cidr: &Ipv4Cidr) -> Result<(), CidrSetError> {
        let (begin, end) = self.indexes(cidr)?;
        for i in begin..=end {
            self.set(i, true);
        }
        Ok(())
    }

    /// Marks every subnet `cidr` overlaps as free.
    pub fn release(&mut self, cidr: &Ipv4Cidr) -> Result<(), CidrSetError> {
        let (begin, end) = self.indexes(cidr)?;
        for i in begin..=end {
            self.set(i, false);
        }
        Ok(())
    }

    /// How many subnets are taken.
    pub fn allocated(&self) -> u32 {
        self.allocated
    }
}

/// The podCIDRs a Node's spec holds (`podCIDRs`, else `podCIDR`).
pub fn pod_cidrs(node: &Node) -> Vec<String> {
    let spec = node.spec.as_ref();
    let list = spec.and_then(|s| s.pod_cidrs.clone()).unwrap_or_default();
    if !list.is_empty() {
        return list;
    }
    spec.and_then(|s| s.pod_cidr.clone())
        .filter(|c| !c.is_empty())
        .into_iter()
        .collect()
}

fn is_simulated(node: &Node) -> bool {
    node.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.get(SIMULATED_ANNOTATION).is_some_and(|v| v == "true"))
}

/// What the allocator knows, behind one lock.
struct State {
    config: NodeIpamConfig,
    set: CidrSet,
    /// The subnet each Node holds: the one in its spec, or the one reserved for it while the
    /// patch that gives it is in flight.
    holds: HashMap<String, Ipv4Cidr>,
    /// Nodes waiting for a subnet (their latest object), by name.
    waiting: HashMap<String, Node>,
    /// Nodes that were told `CIDRNotAvailable` and have not been served since.
    unavailable: HashSet<String>,
}

impl State {
    fn new(config: NodeIpamConfig) -> anyhow::Result<State> {
        let mut set = CidrSet::new(config.cluster_cidr, config.node_cidr_mask_size)?;
        if let Some(service) = config.service_cidr
            && service.overlaps(&config.cluster_cidr)
        {
            // Cannot fail: the two overlap.
            let _ = set.occupy(&service);
        }
        Ok(State {
            config,
            set,
            holds: HashMap::new(),
            waiting: HashMap::new(),
            unavailable: HashSet::new(),
        })
    }

    /// The Node as the watch shows it now: what it holds is occupied; one without a subnet
    /// waits for one. Returns whether it needs a sync.
    fn observe(&mut self, node: &Node) -> bool {
        let Some(name) = node.metadata.name.clone() else {
            return false;
        };
        let cidrs = pod_cidrs(node);
        if let Some(first) = cidrs.first() {
            self.waiting.remove(&name);
            self.unavailable.remove(&name);
            match first.parse::<Ipv4Cidr>() {
                Ok(cidr) => {
                    if let Some(old) = self.holds.insert(name.clone(), cidr)
                        && old != cidr
                    {
                        let _ = self.set.release(&old);
                    }
                    if let Err(e) = self.set.occupy(&cidr) {
                        // Simulated nodes carry the simulator's own (10.64.0.0/10).
                        if is_simulated(node) {
                            tracing::trace!(node = %name, error = %e, "a simulated node's podCIDR");
                        } else {
                            tracing::warn!(node = %name, error = %e, "a node's podCIDR is outside the cluster CIDR");
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(node = %name, cidr = %first, error = %format!("{e:#}"), "a node's podCIDR does not parse")
                }
            }
            return false;
        }
        if is_simulated(node) {
            return false;
        }
        self.waiting.insert(name, node.clone());
        true
    }

    /// The Node is gone: its subnet is free, and every node the range could not serve is tried
    /// again. Returns the names to sync.
    fn forget(&mut self, node: &Node) -> Vec<String> {
        let Some(name) = node.metadata.name.as_deref() else {
            return Vec::new();
        };
        self.waiting.remove(name);
        self.unavailable.remove(name);
        let mut freed = false;
        if let Some(cidr) = self.holds.remove(name) {
            freed |= self.set.release(&cidr).is_ok();
        }
        for c in pod_cidrs(node) {
            if let Ok(cidr) = c.parse::<Ipv4Cidr>() {
                freed |= self.set.release(&cidr).is_ok();
            }
        }
        if freed {
            self.unavailable.iter().cloned().collect()
        } else {
            Vec::new()
        }
    }

    /// Starts over from a full list of the Nodes: the occupied set is rebuilt from them alone.
    fn relist(&mut self, nodes: &[Node]) -> anyhow::Result<Vec<String>> {
        let unavailable = std::mem::take(&mut self.unavailable);
        *self = State::new(self.config.clone())?;
        // Occupy every subnet in use before any node waits for one.
        let mut needs = Vec::new();
        for node in nodes.iter().filter(|n| !pod_cidrs(n).is_empty()) {
            self.observe(node);
        }
        for node in nodes.iter().filter(|n| pod_cidrs(n).is_empty()) {
            if self.observe(node)
                && let Some(name) = node.metadata.name.clone()
            {
                needs.push(name);
            }
        }
        // Nodes already told keep quiet until a subnet is freed.
        self.unavailable = unavailable
            .into_iter()
            .filter(|n| self.waiting.contains_key(n))
            .collect();
        Ok(needs)
    }

    /// What a sync of node `name` does: patch it with its reserved or a new subnet, tell it the
    /// range is exhausted (once), or nothing.
    fn decide(&mut self, name: &str) -> Step {
        let Some(node) = self.waiting.get(name).cloned() else {
            return Step::Nothing;
        };
        // A reservation from an earlier attempt whose result the watch has not shown yet.
        if let Some(cidr) = self.holds.get(name).copied() {
            return Step::Patch(node, cidr);
        }
        match self.set.allocate_next() {
            Ok(cidr) => {
                self.holds.insert(name.to_string(), cidr);
                self.unavailable.remove(name);
                Step::Patch(node, cidr)
            }
            Err(_) if self.unavailable.insert(name.to_string()) => Step::NotAvailable(node),
            Err(_) => Step::Nothing,
        }
    }
}

/// What a sync decided, taken under the lock and acted on outside it.
enum Step {
    Nothing,
    Patch(Node, Ipv4Cidr),
    /// The range is exhausted: tell the node (once).
    NotAvailable(Node),
}

pub struct NodeIpam {
    state: Mutex<State>,
    recorder: Recorder,
    client: kube::Client,
}

pub async fn run(client: kube::Client, config: NodeIpamConfig) -> anyhow::Result<()> {
    let ipam = std::sync::Arc::new(NodeIpam {
        state: Mutex::new(State::new(config.clone())?),
        recorder: Recorder::for_component(client.clone(), EVENT_COMPONENT),
        client: client.clone(),
    });
    tracing::info!(cluster_cidr = %config.cluster_cidr, node_cidr_mask_size = config.node_cidr_mask_size, "starting the node IPAM controller");
    let queue = WorkQueue::new();
    let feed = ipam.clone();
    let q = queue.clone();
    tokio::spawn(async move {
        let mut stream = watcher::watcher(Api::<Node>::all(client), watcher::Config::default()).boxed();
        let mut listed: Vec<Node> = Vec::new();
        while let Some(event) = stream.next().await {
            let keys = match event {
                Ok(watcher::Event::Init) => {
                    listed.clear();
                    Vec::new()
                }
                Ok(watcher::Event::InitApply(node)) => {
                    listed.push(node);
                    Vec::new()
                }
                Ok(watcher::Event::InitDone) => {
                    let nodes = std::mem::take(&mut listed);
                    match feed.state.lock().relist(&nodes) {
                        Ok(keys) => keys,
                        Err(e) => {
                            tracing::error!(error = %format!("{e:#}"), "node IPAM");
                            Vec::new()
                        }
                    }
                }
                Ok(watcher::Event::Apply(node)) => {
                    let needs = feed.state.lock().observe(&node);
                    needs
                        .then(|| node.metadata.name.clone())
                        .flatten()
                        .into_iter()
                        .collect()
                }
                Ok(watcher::Event::Delete(node)) => feed.state.lock().forget(&node),
                Err(e) => {
                    tracing::debug!(error = %e, "node IPAM: watch error");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    Vec::new()
                }
            };
            for key in keys {
                q.add(key);
            }
        }
    });
    queue.run(CONTROLLER_NAME, |name| ipam.clone().sync(name)).await
}

impl NodeIpam {
    async fn sync(self: std::sync::Arc<Self>, name: String) -> anyhow::Result<Option<Duration>> {
        let step = self.state.lock().decide(&name);
        match step {
            Step::Nothing => Ok(None),
            Step::NotAvailable(node) => {
                tracing::warn!(node = %name, "{}", CidrSetError::NoCidrsRemaining);
                self.recorder.event(
                    &node,
                    "Normal",
                    "CIDRNotAvailable",
                    format!("Node {name} status is now: CIDRNotAvailable"),
                );
                Ok(None)
            }
            Step::Patch(node, cidr) => {
                let text = cidr.to_string();
                let patch = serde_json::json!({"spec": {"podCIDR": text, "podCIDRs": [text]}});
                let api = Api::<Node>::all(self.client.clone());
                match api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                    Ok(patched) => {
                        tracing::info!(node = %name, cidr = %text, "set node podCIDR");
                        self.state.lock().observe(&patched);
                        Ok(None)
                    }
                    Err(e) if cu::is_not_found(&e) => {
                        self.release(&name, cidr);
                        Ok(None)
                    }
                    Err(e) => {
                        // Someone else set another podCIDR first (it cannot change once set):
                        // ours goes back, the watch brings theirs.
                        tracing::warn!(node = %name, cidr = %text, error = %e, "setting the node's podCIDR");
                        let invalid = matches!(&e, kube::Error::Api(s) if s.code == 422);
                        if invalid {
                            self.release(&name, cidr);
                            self.recorder.event(
                                &node,
                                "Normal",
                                "CIDRAssignmentFailed",
                                format!("Node {name} status is now: CIDRAssignmentFailed"),
                            );
                            return Ok(None);
                        }
                        Err(e.into())
                    }
                }
            }
        }
    }

    fn release(&self, name: &str, cidr: Ipv4Cidr) {
        let mut state = self.state.lock();
        if state.holds.get(name) == Some(&cidr) {
            state.holds.remove(name);
            let _ = state.set.release(&cidr);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cidr(s: &str) -> Ipv4Cidr {
        s.parse().expect("a CIDR")
    }

    fn node(name: &str, pod_cidr: Option<&str>, simulated: bool) -> Node {
        let mut v = json!({"metadata": {"name": name, "uid": format!("uid-{name}")}, "spec": {}});
        if let Some(c) = pod_cidr {
            v["spec"] = json!({"podCIDR": c, "podCIDRs": [c]});
        }
        if simulated {
            v["metadata"]["annotations"] = json!({SIMULATED_ANNOTATION: "true"});
        }
        serde_json::from_value(v).expect("a Node")
    }

    fn config() -> NodeIpamConfig {
        NodeIpamConfig {
            cluster_cidr: cidr("10.244.0.0/16"),
            node_cidr_mask_size: 24,
            service_cidr: Some(cidr("10.96.0.0/12")),
        }
    }

    #[test]
    fn subnets_are_handed_out_in_order_and_round_robin() {
        let mut set = CidrSet::new(cidr("10.244.0.0/22"), 24).expect("a set");
        assert_eq!(set.allocate_next(), Ok(cidr("10.244.0.0/24")));
        assert_eq!(set.allocate_next(), Ok(cidr("10.244.1.0/24")));
        set.release(&cidr("10.244.0.0/24")).expect("release");
        // The search goes on from the last one given, as upstream's nextCandidate.
        assert_eq!(set.allocate_next(), Ok(cidr("10.244.2.0/24")));
        assert_eq!(set.allocate_next(), Ok(cidr("10.244.3.0/24")));
        assert_eq!(set.allocate_next(), Ok(cidr("10.244.0.0/24")));
        assert_eq!(set.allocate_next(), Err(CidrSetError::NoCidrsRemaining));
        assert_eq!(
            CidrSetError::NoCidrsRemaining.to_string(),
            "CIDR allocation failed; there are no remaining CIDRs left to allocate in the accepted range"
        );
        assert_eq!(set.allocated(), 4);
    }

    #[test]
    fn occupy_and_release_cover_every_overlapped_subnet() {
        let mut set = CidrSet::new(cidr("10.0.0.0/8"), 16).expect("a set");
        // A wider range inside the cluster CIDR takes all its subnets (a service range).
        set.occupy(&cidr("10.96.0.0/12")).expect("occupy");
        assert_eq!(set.allocated(), 16);
        // A narrower one takes the subnet it lies in.
        set.occupy(&cidr("10.1.2.0/24")).expect("occupy");
        assert_eq!(set.allocated(), 17);
        assert_eq!(
            set.occupy(&cidr("192.168.0.0/24")),
            Err(CidrSetError::OutOfRange {
                cidr: cidr("192.168.0.0/24"),
                cluster: cidr("10.0.0.0/8")
            })
        );
        set.release(&cidr("10.96.0.0/12")).expect("release");
        assert_eq!(set.allocated(), 1);
        // A range containing the whole cluster CIDR takes everything.
        let mut small = CidrSet::new(cidr("10.244.0.0/23"), 24).expect("a set");
        small.occupy(&cidr("10.0.0.0/8")).expect("occupy");
        assert_eq!(small.allocate_next(), Err(CidrSetError::NoCidrsRemaining));
    }

    #[test]
    fn flags_are_checked_as_upstreams() {
        assert_eq!(
            CidrSet::new(cidr("10.244.0.0/16"), 15).err(),
            Some(CidrSetError::MaskTooSmall)
        );
        assert_eq!(
            CidrSet::new(cidr("10.0.0.0/4"), 30).err(),
            Some(CidrSetError::SubNetTooBig)
        );
        let whole = CidrSet::new(cidr("10.244.0.0/24"), 24).expect("one subnet");
        assert_eq!(whole.max, 1);
    }

    #[test]
    fn the_occupied_set_is_rebuilt_from_the_nodes_before_allocating() {
        let mut state = State::new(config()).expect("state");
        let nodes = vec![
            node("new", None, false),
            node("a", Some("10.244.0.0/24"), false),
            node("b", Some("10.244.1.0/24"), false),
            node("sim", None, true),
        ];
        let needs = state.relist(&nodes).expect("relist");
        assert_eq!(needs, ["new"]);
        assert_eq!(state.set.allocated(), 2);
        // The new node gets the first free subnet, not one another node holds.
        let Step::Patch(_, c) = state.decide("new") else {
            panic!("a subnet for the new node");
        };
        assert_eq!(c, cidr("10.244.2.0/24"));
        // The simulated node waits for nothing.
        assert!(matches!(state.decide("sim"), Step::Nothing));
        // A second sync before the watch shows the patch gives the same subnet again.
        let Step::Patch(_, again) = state.decide("new") else {
            panic!("the same subnet");
        };
        assert_eq!(again, c);
        state.observe(&node("new", Some("10.244.2.0/24"), false));
        assert_eq!(state.set.allocated(), 3);
    }

    #[test]
    fn the_service_range_is_kept_out_of_the_cluster_cidr() {
        let mut state = State::new(NodeIpamConfig {
            cluster_cidr: cidr("10.96.0.0/11"),
            node_cidr_mask_size: 13,
            service_cidr: Some(cidr("10.96.0.0/12")),
        })
        .expect("state");
        state.relist(&[node("n", None, false)]).expect("relist");
        let Step::Patch(_, c) = state.decide("n") else {
            panic!("a subnet");
        };
        assert_eq!(c, cidr("10.112.0.0/13"));
    }

    #[test]
    fn an_exhausted_range_tells_a_node_once_and_serves_it_when_a_subnet_is_freed() {
        let mut state = State::new(NodeIpamConfig {
            cluster_cidr: cidr("10.244.0.0/24"),
            node_cidr_mask_size: 24,
            service_cidr: None,
        })
        .expect("state");
        let a = node("a", Some("10.244.0.0/24"), false);
        let needs = state.relist(&[a.clone(), node("b", None, false)]).expect("relist");
        assert_eq!(needs, ["b"]);
        assert!(matches!(state.decide("b"), Step::NotAvailable(_)));
        // Further syncs (the node's updates) stay quiet.
        assert!(state.observe(&node("b", None, false)));
        assert!(matches!(state.decide("b"), Step::Nothing));
        // A relist does not tell it again either.
        state.relist(&[a.clone(), node("b", None, false)]).expect("relist");
        assert!(matches!(state.decide("b"), Step::Nothing));
        // Node a goes: b is queued and gets its subnet.
        assert_eq!(state.forget(&a), ["b"]);
        let Step::Patch(_, c) = state.decide("b") else {
            panic!("a subnet for b");
        };
        assert_eq!(c, cidr("10.244.0.0/24"));
    }
}
