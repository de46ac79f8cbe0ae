//! The scheduling framework: plugin extension points, the per-cycle state, filtering with
//! upstream's percentageOfNodesToScore, scoring and host selection, and FitError messages.

use std::borrow::Cow;
use std::sync::Arc;

use futures::future::BoxFuture;

use crate::cache::Cache;
use crate::plugins;
use crate::types::{NodeInfo, PodInfo};

/// Highest score a plugin may give a node after normalization.
pub const MAX_NODE_SCORE: i64 = 100;
/// Upstream: at least this many feasible nodes are searched for.
const MIN_FEASIBLE_NODES_TO_FIND: usize = 100;
/// Upstream: at least this percentage of nodes is searched.
const MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND: usize = 5;
const BASE_PERCENTAGE_OF_NODES_TO_SCORE: usize = 50;
/// How many of the best scored nodes a result keeps in order.
pub const TOP_SCORES: usize = 10;

/// Outcome codes of a plugin call, as upstream's framework.Code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Success,
    Error,
    /// Rejected; preemption might help.
    Unschedulable,
    /// Rejected; preemption cannot help.
    UnschedulableAndUnresolvable,
    /// The plugin has nothing to do for this pod.
    Skip,
}

/// A status's reasons. Almost every status has one, usually a constant: it is kept inline,
/// so that rejecting a node (many per cycle once a cluster fills up) allocates nothing.
#[derive(Clone, Default)]
pub struct Reasons(ReasonsRepr);

#[derive(Clone, Default)]
enum ReasonsRepr {
    #[default]
    None,
    One(Cow<'static, str>),
    Many(Vec<Cow<'static, str>>),
}

impl Reasons {
    pub fn one(reason: impl Into<Cow<'static, str>>) -> Self {
        Reasons(ReasonsRepr::One(reason.into()))
    }

    pub fn push(&mut self, reason: impl Into<Cow<'static, str>>) {
        let reason = reason.into();
        self.0 = match std::mem::take(&mut self.0) {
            ReasonsRepr::None => ReasonsRepr::One(reason),
            ReasonsRepr::One(first) => ReasonsRepr::Many(vec![first, reason]),
            ReasonsRepr::Many(mut v) => {
                v.push(reason);
                ReasonsRepr::Many(v)
            }
        };
    }
}

impl std::ops::Deref for Reasons {
    type Target = [Cow<'static, str>];
    fn deref(&self) -> &Self::Target {
        match &self.0 {
            ReasonsRepr::None => &[],
            ReasonsRepr::One(r) => std::slice::from_ref(r),
            ReasonsRepr::Many(v) => v,
        }
    }
}

impl<'a> IntoIterator for &'a Reasons {
    type Item = &'a Cow<'static, str>;
    type IntoIter = std::slice::Iter<'a, Cow<'static, str>>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<R: Into<Cow<'static, str>>> FromIterator<R> for Reasons {
    fn from_iter<I: IntoIterator<Item = R>>(iter: I) -> Self {
        let mut out = Reasons::default();
        for r in iter {
            out.push(r);
        }
        out
    }
}

impl std::fmt::Debug for Reasons {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl PartialEq for Reasons {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for Reasons {}

impl<U> PartialEq<Vec<U>> for Reasons
where
    Cow<'static, str>: PartialEq<U>,
{
    fn eq(&self, other: &Vec<U>) -> bool {
        self.len() == other.len() && self.iter().zip(other).all(|(a, b)| *a == *b)
    }
}

/// A plugin's verdict with its reasons.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub code: Code,
    pub reasons: Reasons,
    pub plugin: &'static str,
}

impl Status {
    pub fn success() -> Self {
        Status {
            code: Code::Success,
            reasons: Reasons::default(),
            plugin: "",
        }
    }
    pub fn skip() -> Self {
        Status {
            code: Code::Skip,
            reasons: Reasons::default(),
            plugin: "",
        }
    }
    pub fn new(code: Code, reason: impl Into<Cow<'static, str>>) -> Self {
        Status {
            code,
            reasons: Reasons::one(reason),
            plugin: "",
        }
    }
    pub fn unschedulable(reason: impl Into<Cow<'static, str>>) -> Self {
        Self::new(Code::Unschedulable, reason)
    }
    pub fn unresolvable(reason: impl Into<Cow<'static, str>>) -> Self {
        Self::new(Code::UnschedulableAndUnresolvable, reason)
    }
    pub fn error(reason: impl Into<Cow<'static, str>>) -> Self {
        Self::new(Code::Error, reason)
    }
    pub fn is_success(&self) -> bool {
        self.code == Code::Success
    }
    pub fn is_skip(&self) -> bool {
        self.code == Code::Skip
    }
    pub fn is_rejected(&self) -> bool {
        matches!(self.code, Code::Unschedulable | Code::UnschedulableAndUnresolvable)
    }
    /// The reasons joined as upstream's Status.Message().
    pub fn message(&self) -> String {
        self.reasons.join(", ")
    }
    fn with_plugin(mut self, plugin: &'static str) -> Self {
        self.plugin = plugin;
        self
    }
}

/// Per-cycle data computed by PreFilter/PreScore and read by Filter/Score.
#[derive(Debug, Default)]
pub struct CycleState {
    /// Bit i set: plugin i skips Filter for this pod.
    pub skip_filter: u64,
    /// Bit i set: plugin i skips Score for this pod.
    pub skip_score: u64,
    pub node_affinity: Option<plugins::node_affinity::PodNodeAffinity>,
    pub inter_pod: Option<plugins::inter_pod_affinity::PreFilterState>,
    pub inter_pod_score: Option<plugins::inter_pod_affinity::PreScoreState>,
    pub spread: Option<plugins::pod_topology_spread::PreFilterState>,
    pub spread_score: Option<plugins::pod_topology_spread::PreScoreState>,
    pub volume_restrictions: Option<plugins::volume_restrictions::PreFilterState>,
    pub node_volume_limits: Option<Box<plugins::node_volume_limits::PreFilterState>>,
    pub volume_binding: Option<Box<plugins::volume_binding::StateData>>,
    pub volume_zone: Option<plugins::volume_zone::StateData>,
    /// A PreFilter result: only these nodes can fit (upstream's PreFilterResult), and the
    /// plugin that narrowed them.
    pub node_names: Option<(Vec<String>, &'static str)>,
}

impl CycleState {
    /// Drops what only Filter and Score read once a node is chosen. The count snapshots
    /// share their maps with the cache's counters: kept alive while the pod is assumed,
    /// every counter the pod changes would copy its whole map (one entry per domain, so
    /// per node for a hostname key).
    pub fn release_filter_state(&mut self) {
        self.inter_pod = None;
        self.inter_pod_score = None;
        self.spread = None;
        self.spread_score = None;
    }
}

/// Work a PreBind plugin does before the pod is bound, on the binding task (never in the
/// scheduling loop): API writes and the wait for them to take effect. Err is the message.
pub type PreBindWork = Box<dyn FnOnce(kube::Client) -> BoxFuture<'static, Result<(), String>> + Send>;

/// Undoes what a plugin's Reserve did to the cache (upstream's Unreserve).
pub type Unreserve = Box<dyn FnOnce(&mut Cache) + Send>;

/// What Reserve left to do for one plugin.
#[derive(Default)]
pub struct Reserved {
    pub unreserve: Option<Unreserve>,
    pub pre_bind: Option<PreBindWork>,
}

/// What the binding of a reserved pod carries: the PreBind work in plugin order, and how to
/// undo the reservations when the binding fails.
#[derive(Default)]
pub struct Reservation {
    pub pre_bind: Vec<(&'static str, PreBindWork)>,
    pub unreserve: Vec<Unreserve>,
}

impl std::fmt::Debug for Reservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reservation")
            .field("pre_bind", &self.pre_bind.iter().map(|(p, _)| *p).collect::<Vec<_>>())
            .field("unreserve", &self.unreserve.len())
            .finish()
    }
}

impl Reservation {
    /// Upstream's Unreserve: in reverse plugin order.
    pub fn unreserve(self, cache: &mut Cache) {
        for u in self.unreserve.into_iter().rev() {
            u(cache);
        }
    }
}

/// One scheduling plugin; every extension point has a no-op default.
pub trait Plugin: Send + Sync {
    fn name(&self) -> &'static str;

    /// Computes per-cycle state. `Skip` disables this plugin's Filter for the pod; a rejection
    /// rejects the pod on every node.
    fn pre_filter(&self, _state: &mut CycleState, _pod: &PodInfo, _cache: &Cache) -> Status {
        Status::skip()
    }

    fn has_filter(&self) -> bool {
        false
    }

    fn filter(&self, _state: &CycleState, _pod: &PodInfo, _node: &NodeInfo) -> Status {
        Status::success()
    }

    /// Filter, for plugins whose check of a node reads more than the node's pods (claims,
    /// volumes, CSINodes) from the cache: they do that work for the nodes a cycle visits, as
    /// upstream's Filter does, rather than for every node in PreFilter.
    fn filter_with_cache(&self, state: &CycleState, pod: &PodInfo, _cache: &Cache, node: &NodeInfo) -> Status {
        self.filter(state, pod, node)
    }

    /// Weight in the final score; 0 means the plugin does not score.
    fn score_weight(&self) -> i64 {
        0
    }

    /// Prepares scoring over the feasible nodes; `false` skips Score for this pod.
    fn pre_score(&self, _state: &mut CycleState, _pod: &PodInfo, _cache: &Cache, _feasible: &[usize]) -> bool {
        true
    }

    fn score(&self, _state: &CycleState, _pod: &PodInfo, _node: &NodeInfo) -> i64 {
        0
    }

    /// Maps raw scores into 0..=MAX_NODE_SCORE.
    fn normalize(&self, _state: &CycleState, _scores: &mut [i64]) {}

    fn has_reserve(&self) -> bool {
        false
    }

    /// Reserve: records in the cache what the pod takes on `node` before its binding is sent,
    /// and says how to undo it and what to do before the binding (PreBind). Err rejects the
    /// node after all.
    fn reserve(
        &self,
        _state: &mut CycleState,
        _pod: &Arc<PodInfo>,
        _node: &str,
        _cache: &mut Cache,
    ) -> Result<Reserved, Status> {
        Ok(Reserved::default())
    }
}

/// Upstream's DefaultNormalizeScore.
pub fn default_normalize(scores: &mut [i64], reverse: bool) {
    let max = scores.iter().copied().max().unwrap_or(0);
    if max == 0 {
        if reverse {
            scores.iter_mut().for_each(|s| *s = MAX_NODE_SCORE);
        }
        return;
    }
    for s in scores.iter_mut() {
        let mut v = MAX_NODE_SCORE * *s / max;
        if reverse {
            v = MAX_NODE_SCORE - v;
        }
        *s = v;
    }
}

/// Why a pod does not fit: what the FitError message is built from.
#[derive(Debug, Clone, Default)]
pub struct Diagnosis {
    pub num_all_nodes: usize,
    /// Set when a PreFilter plugin rejected the pod (then no per-node statuses are counted).
    pub pre_filter_msg: Option<String>,
    /// Statuses of the nodes that were rejected, by node index into the cache.
    pub node_statuses: Vec<(usize, Status)>,
    pub post_filter_msg: Option<String>,
    /// Bit set of plugin indices that rejected the pod somewhere.
    pub unschedulable_plugins: u64,
    /// Nodes a PreFilter result excluded: their common status and how many there were.
    pub excluded: Option<(Status, usize)>,
}

/// Formats upstream's FitError message: "0/N nodes are available: <histogram>. <postfilter>".
pub fn fit_error_message<'a>(
    num_all_nodes: usize,
    pre_filter_msg: Option<&str>,
    statuses: impl Iterator<Item = &'a Status>,
    post_filter_msg: Option<&str>,
) -> String {
    let mut msg = format!("0/{num_all_nodes} nodes are available:");
    if let Some(p) = pre_filter_msg.filter(|p| !p.is_empty()) {
        msg.push_str(&format!(" {p}."));
    } else {
        let mut counts: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
        for s in statuses {
            for r in &s.reasons {
                *counts.entry(r.as_ref()).or_default() += 1;
            }
        }
        let mut parts: Vec<String> = counts.iter().map(|(r, n)| format!("{n} {r}")).collect();
        parts.sort();
        if !parts.is_empty() {
            msg.push_str(&format!(" {}.", parts.join(", ")));
        }
    }
    if let Some(p) = post_filter_msg.filter(|p| !p.is_empty()) {
        msg.push(' ');
        msg.push_str(p);
    }
    msg
}

impl Diagnosis {
    pub fn message(&self) -> String {
        let excluded = self.excluded.iter().flat_map(|(s, n)| std::iter::repeat_n(s, *n));
        fit_error_message(
            self.num_all_nodes,
            self.pre_filter_msg.as_deref(),
            self.node_statuses.iter().map(|(_, s)| s).chain(excluded),
            self.post_filter_msg.as_deref(),
        )
    }
}

/// Final score of one feasible node.
#[derive(Debug, Clone, Copy)]
pub struct NodeScore {
    pub node: usize,
    pub total: i64,
    /// Position in the feasible list (the column in `Scores::per_plugin`).
    pub pos: usize,
}

/// Scores of the feasible nodes: totals and, per scoring plugin, the normalized scores.
#[derive(Debug, Clone, Default)]
pub struct Scores {
    pub nodes: Vec<NodeScore>,
    pub per_plugin: Vec<(&'static str, Vec<i64>)>,
}

/// A failed cycle: why, and the cycle state when PreFilter passed (for preemption).
pub type Failure = Box<(Diagnosis, Option<CycleState>)>;

/// A successful cycle.
#[derive(Debug, Clone)]
pub struct ScheduleResult {
    pub node: usize,
    pub evaluated: usize,
    pub feasible: usize,
    /// Rejected nodes seen while searching (for explain).
    pub rejected: Vec<(usize, Status)>,
    /// Nodes a PreFilter result excluded (status, count).
    pub excluded: Option<(Status, usize)>,
    /// Scores of the feasible nodes; the first TOP_SCORES are the best, in order (empty
    /// when only one node fit).
    pub scores: Scores,
}

/// The plugins of one profile and the state carried between cycles.
pub struct Framework {
    plugins: Vec<Box<dyn Plugin>>,
    /// Bit i: plugin i has a Filter (asked once, not per node).
    filters: u64,
    /// Bit i: plugin i has a Reserve.
    reserves: u64,
    /// 0 = adaptive as upstream.
    pub percentage_of_nodes_to_score: u32,
    next_start: usize,
    rng: u64,
}

impl Framework {
    pub fn new(plugins: Vec<Box<dyn Plugin>>, percentage_of_nodes_to_score: u32) -> Self {
        let filters = plugins
            .iter()
            .enumerate()
            .filter(|(i, p)| *i < 64 && p.has_filter())
            .fold(0u64, |m, (i, _)| m | (1 << i));
        let reserves = plugins
            .iter()
            .enumerate()
            .filter(|(i, p)| *i < 64 && p.has_reserve())
            .fold(0u64, |m, (i, _)| m | (1 << i));
        Framework {
            plugins,
            filters,
            reserves,
            percentage_of_nodes_to_score,
            next_start: 0,
            rng: 0x9E37_79B9_7F4A_7C15,
        }
    }

    /// The default plugin set with upstream's score weights.
    pub fn with_default_plugins(percentage_of_nodes_to_score: u32) -> Self {
        Self::new(plugins::default_plugins(), percentage_of_nodes_to_score)
    }

    pub fn plugin_index(&self, name: &str) -> Option<usize> {
        self.plugins.iter().position(|p| p.name() == name)
    }

    fn next_rand(&mut self) -> u64 {
        // xorshift64*
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Upstream's numFeasibleNodesToFind.
    pub fn num_feasible_nodes_to_find(&self, num_all: usize) -> usize {
        let pct = self.percentage_of_nodes_to_score as usize;
        if num_all < MIN_FEASIBLE_NODES_TO_FIND || pct >= 100 {
            return num_all;
        }
        let adaptive = if pct == 0 {
            BASE_PERCENTAGE_OF_NODES_TO_SCORE
                .saturating_sub(num_all / 125)
                .max(MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND)
        } else {
            pct
        };
        (num_all * adaptive / 100).max(MIN_FEASIBLE_NODES_TO_FIND)
    }

    /// Runs every PreFilter plugin; a rejection ends the cycle for every node.
    pub fn run_pre_filter(&self, pod: &PodInfo, cache: &Cache) -> Result<CycleState, (Status, u64)> {
        let mut state = CycleState::default();
        for (i, p) in self.plugins.iter().enumerate() {
            if !p.has_filter() {
                continue;
            }
            let st = p.pre_filter(&mut state, pod, cache);
            match st.code {
                Code::Skip => state.skip_filter |= 1 << i,
                Code::Success => {}
                _ => return Err((st.with_plugin(p.name()), 1 << i)),
            }
        }
        Ok(state)
    }

    /// Runs the Reserve plugins for the node chosen; on a failure the reservations made so far
    /// are undone and the status says which plugin failed, as upstream's
    /// `running Reserve plugin "NAME": ...`.
    pub fn run_reserve(
        &self,
        state: &mut CycleState,
        pod: &Arc<PodInfo>,
        node: &str,
        cache: &mut Cache,
    ) -> Result<Reservation, Status> {
        let mut out = Reservation::default();
        let mut active = self.reserves;
        while active != 0 {
            let i = active.trailing_zeros() as usize;
            active &= active - 1;
            let p = &self.plugins[i];
            match p.reserve(state, pod, node, cache) {
                Ok(r) => {
                    out.unreserve.extend(r.unreserve);
                    if let Some(w) = r.pre_bind {
                        out.pre_bind.push((p.name(), w));
                    }
                }
                Err(st) => {
                    out.unreserve(cache);
                    let msg = format!("running Reserve plugin {:?}: {}", p.name(), st.message());
                    return Err(Status::error(msg).with_plugin(p.name()));
                }
            }
        }
        Ok(out)
    }

    /// Runs the Filter plugins on one node, stopping at the first rejection.
    pub fn run_filters(&self, state: &CycleState, pod: &PodInfo, cache: &Cache, node: &NodeInfo) -> (Status, usize) {
        let mut active = self.filters & !state.skip_filter;
        while active != 0 {
            let i = active.trailing_zeros() as usize;
            active &= active - 1;
            let p = &self.plugins[i];
            let st = p.filter_with_cache(state, pod, cache, node);
            if !st.is_success() {
                return (st.with_plugin(p.name()), i);
            }
        }
        (Status::success(), usize::MAX)
    }

    /// As upstream's RunFilterPluginsWithNominatedPods: the node must fit the pod both with
    /// the pods nominated to it (of at least the pod's priority) counted and without them.
    pub fn run_filters_with_nominated(
        &self,
        state: &CycleState,
        pod: &PodInfo,
        cache: &Cache,
        node: &NodeInfo,
    ) -> (Status, usize) {
        let noms: Vec<_> = cache
            .nominated_on(&node.name)
            .iter()
            .filter(|p| p.uid != pod.uid && p.priority >= pod.priority)
            .cloned()
            .collect();
        if !noms.is_empty() {
            let mut with = node.clone();
            for p in noms {
                with.add_pod(p);
            }
            let r = self.run_filters(state, pod, cache, &with);
            if !r.0.is_success() {
                return r;
            }
        }
        self.run_filters(state, pod, cache, node)
    }

    /// One scheduling cycle for `pod` over the cache: PreFilter, Filter (on enough nodes),
    /// Score, and host selection. The cache is not modified.
    pub fn schedule(&mut self, pod: &PodInfo, cache: &Cache) -> Result<(ScheduleResult, CycleState), Failure> {
        let num_all = cache.num_nodes();
        let mut diag = Diagnosis {
            num_all_nodes: num_all,
            ..Default::default()
        };
        if num_all == 0 {
            return Err(Box::new((diag, None)));
        }
        let state = match self.run_pre_filter(pod, cache) {
            Ok(s) => s,
            Err((st, bit)) => {
                diag.pre_filter_msg = Some(st.message());
                diag.unschedulable_plugins |= bit;
                for idx in cache.node_indices() {
                    diag.node_statuses.push((idx, st.clone()));
                }
                return Err(Box::new((diag, None)));
            }
        };
        let mut state = state;
        // As upstream's evaluateNominatedNode: a pod nominated by preemption tries its node
        // first and takes it if it fits.
        if let Some(idx) = pod.nominated_node().and_then(|n| cache.node_index(n))
            && cache.nodes()[idx].node.is_some()
        {
            let (st, _) = self.run_filters_with_nominated(&state, pod, cache, &cache.nodes()[idx]);
            if st.is_success() {
                state.release_filter_state();
                return Ok((
                    ScheduleResult {
                        node: idx,
                        evaluated: 1,
                        feasible: 1,
                        rejected: Vec::new(),
                        excluded: None,
                        scores: Scores::default(),
                    },
                    state,
                ));
            }
        }
        let nodes = cache.nodes();
        // A PreFilter result narrows the candidates; the other nodes are rejected together.
        let candidates: Option<Vec<usize>> = state.node_names.as_ref().map(|(names, plugin)| {
            let mut idx: Vec<usize> = names
                .iter()
                .filter_map(|n| cache.node_index(n))
                .filter(|&i| nodes[i].node.is_some())
                .collect();
            idx.sort_unstable();
            idx.dedup();
            let mut st = Status::unresolvable(format!("node(s) didn't satisfy plugin(s) [{plugin}]"));
            st.plugin = plugin;
            diag.excluded = Some((st, num_all - idx.len()));
            idx
        });
        let len = candidates.as_ref().map(Vec::len).unwrap_or(nodes.len());
        let to_find = self.num_feasible_nodes_to_find(len);
        let mut feasible: Vec<usize> = Vec::with_capacity(to_find.min(1024));
        let mut processed = 0;
        let start = if len == 0 { 0 } else { self.next_start % len };
        for off in 0..len {
            let pos = (start + off) % len;
            let idx = match &candidates {
                Some(c) => c[pos],
                None => pos,
            };
            let ni = &nodes[idx];
            if ni.node.is_none() {
                processed += 1;
                continue;
            }
            processed += 1;
            let (st, plugin_idx) = if cache.has_nominated() {
                self.run_filters_with_nominated(&state, pod, cache, ni)
            } else {
                self.run_filters(&state, pod, cache, ni)
            };
            if st.is_success() {
                feasible.push(idx);
                if feasible.len() >= to_find {
                    break;
                }
            } else {
                if plugin_idx < 64 {
                    diag.unschedulable_plugins |= 1 << plugin_idx;
                }
                diag.node_statuses.push((idx, st));
            }
        }
        if len > 0 && candidates.is_none() {
            self.next_start = (start + processed) % len;
        }
        if feasible.is_empty() {
            return Err(Box::new((diag, Some(state))));
        }
        let evaluated = feasible.len() + diag.node_statuses.len();
        if feasible.len() == 1 {
            state.release_filter_state();
            return Ok((
                ScheduleResult {
                    node: feasible[0],
                    evaluated,
                    feasible: 1,
                    rejected: diag.node_statuses,
                    excluded: diag.excluded,
                    scores: Scores::default(),
                },
                state,
            ));
        }
        let mut scores = self.score_nodes(&mut state, pod, cache, &feasible);
        state.release_filter_state();
        // Pick the best; ties broken at random as upstream's selectHost.
        let mut best = 0usize;
        let mut ties = 0u64;
        let totals = &scores.nodes;
        for (i, s) in totals.iter().enumerate() {
            if i == 0 || s.total > totals[best].total {
                best = i;
                ties = 1;
            } else if s.total == totals[best].total {
                ties += 1;
                if self.next_rand().is_multiple_of(ties) {
                    best = i;
                }
            }
        }
        let node = totals[best].node;
        // Only the best few are ever shown: the chosen node first (among equal totals it is the
        // one the tie-break picked), then the best of the others; the rest stay unordered.
        scores.nodes.swap(0, best);
        let others = &mut scores.nodes[1..];
        let keep = (TOP_SCORES - 1).min(others.len());
        if keep > 0 {
            if keep < others.len() {
                others.select_nth_unstable_by_key(keep - 1, |s| std::cmp::Reverse(s.total));
            }
            others[..keep].sort_by_key(|s| std::cmp::Reverse(s.total));
        }
        Ok((
            ScheduleResult {
                node,
                evaluated,
                feasible: feasible.len(),
                rejected: diag.node_statuses,
                excluded: diag.excluded,
                scores,
            },
            state,
        ))
    }

    /// PreScore, Score, NormalizeScore and weights over the feasible nodes.
    pub fn score_nodes(&self, state: &mut CycleState, pod: &PodInfo, cache: &Cache, feasible: &[usize]) -> Scores {
        let nodes = cache.nodes();
        let mut out = Scores {
            nodes: feasible
                .iter()
                .enumerate()
                .map(|(pos, &node)| NodeScore { node, total: 0, pos })
                .collect(),
            per_plugin: Vec::new(),
        };
        for (i, p) in self.plugins.iter().enumerate() {
            let w = p.score_weight();
            if w == 0 {
                continue;
            }
            if !p.pre_score(state, pod, cache, feasible) {
                state.skip_score |= 1 << i;
                continue;
            }
            let mut raw: Vec<i64> = feasible.iter().map(|&idx| p.score(state, pod, &nodes[idx])).collect();
            p.normalize(state, &mut raw);
            for (ns, s) in out.nodes.iter_mut().zip(&raw) {
                ns.total += s * w;
            }
            out.per_plugin.push((p.name(), raw));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn num_feasible_nodes() {
        let f = Framework::new(Vec::new(), 0);
        assert_eq!(f.num_feasible_nodes_to_find(50), 50);
        assert_eq!(f.num_feasible_nodes_to_find(100), 100);
        assert_eq!(f.num_feasible_nodes_to_find(1000), 1000 * 42 / 100);
        assert_eq!(f.num_feasible_nodes_to_find(5000), 500);
        assert_eq!(f.num_feasible_nodes_to_find(6000), 300);
        let f = Framework::new(Vec::new(), 100);
        assert_eq!(f.num_feasible_nodes_to_find(5000), 5000);
    }

    #[test]
    fn fit_error_histogram_sorted_as_strings() {
        let statuses = [
            Status::unresolvable("node(s) didn't match Pod's node affinity/selector"),
            Status::unschedulable("Insufficient cpu"),
            Status::unresolvable("node(s) didn't match Pod's node affinity/selector"),
        ];
        let msg = fit_error_message(
            3,
            None,
            statuses.iter(),
            Some("preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."),
        );
        assert_eq!(
            msg,
            "0/3 nodes are available: 1 Insufficient cpu, 2 node(s) didn't match Pod's node affinity/selector. preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."
        );
    }

    #[test]
    fn fit_error_multiple_reasons_per_node_and_prefilter() {
        let mut s = Status::unschedulable("Insufficient cpu");
        s.reasons.push("Insufficient memory");
        let statuses = [s.clone(), s, Status::unresolvable("node(s) were unschedulable")];
        assert_eq!(
            fit_error_message(3, None, statuses.iter(), None),
            "0/3 nodes are available: 1 node(s) were unschedulable, 2 Insufficient cpu, 2 Insufficient memory."
        );
        assert_eq!(
            fit_error_message(2, Some("boom"), statuses.iter(), None),
            "0/2 nodes are available: boom."
        );
    }

    use crate::plugins::default_preemption::preempt;
    use crate::types::PodInfo;
    use crate::types::testutil::{node, pod};
    use std::sync::Arc;

    /// The task's example: one node short of cpu, two not matching the node selector.
    #[test]
    fn end_to_end_fit_error_message() {
        let mut c = Cache::new();
        let mut n1 = node("node1", "1", "4Gi", "110");
        n1.metadata.labels.as_mut().unwrap().insert("disk".into(), "ssd".into());
        c.upsert_node(Arc::new(n1));
        c.upsert_node(Arc::new(node("node2", "8", "4Gi", "110")));
        c.upsert_node(Arc::new(node("node3", "8", "4Gi", "110")));
        let mut p = pod("x", "2", "");
        p.spec.as_mut().unwrap().node_selector = Some([("disk".to_string(), "ssd".to_string())].into());
        let p = PodInfo::new(p);
        let mut fw = Framework::with_default_plugins(0);
        let (mut diag, state) = *fw.schedule(&p, &c).unwrap_err();
        let msg = preempt(&fw, state.as_ref(), &p, &c, &diag).unwrap_err();
        diag.post_filter_msg = Some(format!("preemption: {msg}"));
        assert_eq!(
            diag.message(),
            "0/3 nodes are available: 1 Insufficient cpu, 2 node(s) didn't match Pod's node affinity/selector. preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."
        );
        assert_eq!(diag.node_statuses.len(), 3);
        let fit = fw.plugin_index("NodeResourcesFit").unwrap();
        let aff = fw.plugin_index("NodeAffinity").unwrap();
        assert_eq!(diag.unschedulable_plugins, (1 << fit) | (1 << aff));
    }

    #[test]
    fn scores_prefer_least_allocated_and_spread_round_robin() {
        let mut c = Cache::new();
        for n in ["a", "b", "c"] {
            c.upsert_node(Arc::new(node(n, "4", "16Gi", "110")));
        }
        let mut fw = Framework::with_default_plugins(0);
        let mut placed = std::collections::HashMap::new();
        for i in 0..6 {
            let p = Arc::new(PodInfo::new(pod(&format!("p{i}"), "1", "1Gi")));
            let (res, _) = fw.schedule(&p, &c).unwrap();
            assert_eq!(res.feasible, 3);
            // The chosen node leads the scores, even when others tie with it.
            assert_eq!(res.scores.nodes[0].node, res.node);
            assert!(res.scores.nodes.iter().all(|s| s.total <= res.scores.nodes[0].total));
            let name = c.node_name(res.node).to_string();
            *placed.entry(name.clone()).or_insert(0) += 1;
            c.assume_pod(p, &name);
        }
        // LeastAllocated + BalancedAllocation spread equal pods evenly.
        assert!(placed.values().all(|n| *n == 2), "{placed:?}");
    }

    #[test]
    fn nominated_pods_reserve_room() {
        let mut c = Cache::new();
        c.upsert_node(Arc::new(node("a", "2", "16Gi", "110")));
        let mut hp = pod("vip", "2", "");
        hp.spec.as_mut().unwrap().priority = Some(100);
        let hp = Arc::new(PodInfo::new(hp));
        c.set_nominated(&hp, Some("a"));
        let mut fw = Framework::with_default_plugins(0);
        let low = PodInfo::new(pod("low", "1", ""));
        let (diag, _) = *fw.schedule(&low, &c).unwrap_err();
        assert_eq!(diag.message(), "0/1 nodes are available: 1 Insufficient cpu.");
        // The nominated pod itself fits.
        assert!(fw.schedule(&hp, &c).is_ok());
    }

    #[test]
    fn nominated_node_is_tried_first() {
        let mut c = Cache::new();
        for n in ["a", "b", "c"] {
            c.upsert_node(Arc::new(node(n, "4", "16Gi", "110")));
        }
        // Make "c" the worst by score; the nominated pod still lands there.
        c.assume_pod(Arc::new(PodInfo::new(pod("busy", "3", "8Gi"))), "c");
        let mut p = pod("vip", "1", "");
        p.status = Some(k8s_openapi::api::core::v1::PodStatus {
            nominated_node_name: Some("c".into()),
            ..Default::default()
        });
        let mut fw = Framework::with_default_plugins(0);
        let (res, _) = fw.schedule(&PodInfo::new(p), &c).unwrap();
        assert_eq!(c.node_name(res.node), "c");
    }

    #[test]
    fn match_fields_narrow_candidates_as_daemonset_pods() {
        use k8s_openapi::api::core::v1::{
            Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
        };
        let mut c = Cache::new();
        for n in ["a", "b", "c"] {
            c.upsert_node(Arc::new(node(n, "1", "16Gi", "110")));
        }
        c.assume_pod(Arc::new(PodInfo::new(pod("busy", "1", ""))), "b");
        let mut p = pod("ds", "1", "");
        p.spec.as_mut().unwrap().affinity = Some(Affinity {
            node_affinity: Some(NodeAffinity {
                required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_expressions: None,
                        match_fields: Some(vec![NodeSelectorRequirement {
                            key: "metadata.name".into(),
                            operator: "In".into(),
                            values: Some(vec!["b".into()]),
                        }]),
                    }],
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
        let mut fw = Framework::with_default_plugins(0);
        let (diag, _) = *fw.schedule(&PodInfo::new(p), &c).unwrap_err();
        assert_eq!(diag.node_statuses.len(), 1);
        assert_eq!(
            diag.message(),
            "0/3 nodes are available: 1 Insufficient cpu, 2 node(s) didn't satisfy plugin(s) [NodeAffinity]."
        );
    }

    /// The state a successful cycle returns shares no count map with the cache: assuming the
    /// pod (with the state still alive, as until Reserve) must not copy those maps.
    #[test]
    fn chosen_node_state_holds_no_count_snapshot() {
        let mut c = Cache::new();
        for n in ["a", "b"] {
            c.upsert_node(Arc::new(node(n, "4", "16Gi", "110")));
        }
        let p: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "default", "uid": "p", "labels": {"app": "x"}},
            "spec": {
                "containers": [{"name": "c"}],
                "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                    "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "x"}}}],
                "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
                    "labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": "kubernetes.io/hostname"}]}},
            },
        }))
        .unwrap();
        let p = Arc::new(PodInfo::new(p));
        let mut fw = Framework::with_default_plugins(0);
        let (res, state) = fw.schedule(&p, &c).unwrap();
        assert!(state.inter_pod.is_none() && state.spread.is_none());
        assert!(state.inter_pod_score.is_none() && state.spread_score.is_none());
        let name = c.node_name(res.node).to_string();
        c.assume_pod(p, &name);
        drop(state);
    }

    #[test]
    fn no_nodes() {
        let c = Cache::new();
        let mut fw = Framework::with_default_plugins(0);
        let (diag, state) = *fw.schedule(&PodInfo::new(pod("x", "", "")), &c).unwrap_err();
        assert_eq!(diag.num_all_nodes, 0);
        assert!(state.is_none());
    }

    #[test]
    fn normalize_default() {
        let mut s = vec![0, 5, 10];
        default_normalize(&mut s, false);
        assert_eq!(s, vec![0, 50, 100]);
        let mut s = vec![0, 5, 10];
        default_normalize(&mut s, true);
        assert_eq!(s, vec![100, 50, 0]);
        let mut s = vec![0, 0];
        default_normalize(&mut s, true);
        assert_eq!(s, vec![100, 100]);
    }
}
