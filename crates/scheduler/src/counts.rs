//! Matching-pod counts kept current as pods and nodes come and go, so that PodTopologySpread
//! and InterPodAffinity read per-topology counts instead of walking every pod each cycle
//! (upstream keeps the same sums in its PreFilter states and snapshot lists).
//!
//! A counter counts, per node slot, the pods a [`Matcher`] selects; its views sum those
//! counts per topology value over the nodes that carry the view's required keys. Counters
//! for the selectors plugins ask about are built on first use (one walk over the pods) and
//! kept for the most recently used ones; counters for the (anti-)affinity terms that placed
//! pods carry are kept for every such term, as the plugins must enumerate them.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::labels::Selector;
use crate::types::{AffinityTerm, NodeInfo, PodInfo};

/// How many selector counters are kept; the least recently used beyond this are dropped
/// (and rebuilt if asked for again).
const MAX_COUNTERS: usize = 256;

/// Pods in one domain and the nodes that make it up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Domain {
    pub pods: i64,
    /// Nodes with this value (0 in views that do not track nodes).
    pub nodes: i64,
}

/// Topology value -> domain. Filters look a node's value up here for every node they pass,
/// so the map hashes with foldhash (seeded per process) rather than SipHash.
pub type Domains = HashMap<String, Domain, foldhash::fast::RandomState>;

/// Which pods a counter counts.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Matcher {
    /// Pods of `namespace` the selector matches, except those being deleted
    /// (PodTopologySpread's countPodsMatchSelector).
    Spread { namespace: String, selector: Selector },
    /// Pods every term selects (InterPodAffinity; a single term for anti-affinity).
    Terms(Vec<AffinityTerm>),
}

impl Matcher {
    fn count(&self, pod: &PodInfo, namespaces: &NamespaceLabels) -> i64 {
        let hit = match self {
            Matcher::Spread { namespace, selector } => {
                !pod.deleting && pod.namespace == *namespace && selector.matches(&pod.labels)
            }
            Matcher::Terms(terms) => {
                let ns = namespaces.get(&pod.namespace);
                !terms.is_empty() && terms.iter().all(|t| t.matches(pod, ns))
            }
        };
        i64::from(hit)
    }

    /// Whether the counts depend on namespaces' labels.
    fn reads_namespace_labels(&self) -> bool {
        match self {
            Matcher::Spread { .. } => false,
            Matcher::Terms(terms) => terms.iter().any(|t| t.namespace_selector.is_some()),
        }
    }
}

/// The kinds of terms placed pods carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TermKind {
    RequiredAffinity,
    RequiredAntiAffinity,
    PreferredAffinity,
    PreferredAntiAffinity,
}

impl TermKind {
    const ALL: [TermKind; 4] = [
        TermKind::RequiredAffinity,
        TermKind::RequiredAntiAffinity,
        TermKind::PreferredAffinity,
        TermKind::PreferredAntiAffinity,
    ];

    fn terms(self, pod: &PodInfo) -> &[AffinityTerm] {
        match self {
            TermKind::RequiredAffinity => &pod.required_affinity,
            TermKind::RequiredAntiAffinity => &pod.required_anti_affinity,
            TermKind::PreferredAffinity => &pod.preferred_affinity,
            TermKind::PreferredAntiAffinity => &pod.preferred_anti_affinity,
        }
    }
}

pub type NamespaceLabels = HashMap<String, BTreeMap<String, String>>;

#[derive(Debug)]
struct View {
    /// Nodes missing any of these keys are left out.
    required: Vec<String>,
    /// Grouping key; nodes without it (when not required) count under "".
    key: String,
    track_nodes: bool,
    domains: Arc<Domains>,
}

impl View {
    fn value<'a>(&self, node: &'a NodeInfo) -> Option<&'a str> {
        if node.node.is_none() || !self.required.iter().all(|k| node.labels.contains_key(k)) {
            return None;
        }
        Some(node.labels.get(&self.key).map(String::as_str).unwrap_or(""))
    }

    fn apply(&mut self, node: &NodeInfo, pods: i64, nodes: i64) {
        let nodes = if self.track_nodes { nodes } else { 0 };
        if pods == 0 && nodes == 0 {
            return;
        }
        let Some(v) = self.value(node) else {
            return;
        };
        let domains = Arc::make_mut(&mut self.domains);
        let d = match domains.get_mut(v) {
            Some(d) => d,
            None => domains.entry(v.to_string()).or_default(),
        };
        d.pods += pods;
        d.nodes += nodes;
        if d.pods == 0 && d.nodes == 0 {
            domains.remove(v);
        }
    }
}

#[derive(Debug)]
struct Counter {
    /// Matching pods per node slot (aligned with the cache's slots).
    per_node: Vec<i64>,
    total: i64,
    views: Vec<View>,
    last_used: u64,
}

impl Counter {
    fn new(slots: usize) -> Self {
        Counter {
            per_node: vec![0; slots],
            total: 0,
            views: Vec::new(),
            last_used: 0,
        }
    }

    fn add(&mut self, nodes: &[NodeInfo], i: usize, n: i64) {
        if n == 0 {
            return;
        }
        self.per_node[i] += n;
        self.total += n;
        for v in &mut self.views {
            v.apply(&nodes[i], n, 0);
        }
    }

    fn view(&mut self, nodes: &[NodeInfo], required: &[String], key: &str, track_nodes: bool) -> &mut View {
        let pos = self
            .views
            .iter()
            .position(|v| v.key == key && v.required == required && v.track_nodes == track_nodes);
        let pos = match pos {
            Some(p) => p,
            None => {
                let mut v = View {
                    required: required.to_vec(),
                    key: key.to_string(),
                    track_nodes,
                    domains: Arc::default(),
                };
                for (i, n) in nodes.iter().enumerate() {
                    v.apply(n, self.per_node[i], 1);
                }
                self.views.push(v);
                self.views.len() - 1
            }
        };
        &mut self.views[pos]
    }
}

/// All counters; owned by the cache.
#[derive(Debug, Default)]
pub struct Counts {
    selected: HashMap<Matcher, Counter>,
    carried: HashMap<(TermKind, AffinityTerm), Counter>,
    slots: usize,
    tick: u64,
}

impl Counts {
    /// A node slot was appended.
    pub fn add_slot(&mut self) {
        self.slots += 1;
        for c in self.selected.values_mut().chain(self.carried.values_mut()) {
            c.per_node.push(0);
        }
    }

    /// Slot `i` was removed by swapping the last one into it (the node there is gone and
    /// no pod is counted on it).
    pub fn drop_slot(&mut self, i: usize) {
        self.slots -= 1;
        for c in self.selected.values_mut().chain(self.carried.values_mut()) {
            c.per_node.swap_remove(i);
        }
    }

    /// A pod was counted on (`sign` 1) or removed from (-1) slot `i`.
    pub fn pod_changed(&mut self, nodes: &[NodeInfo], i: usize, pod: &PodInfo, ns: &NamespaceLabels, sign: i64) {
        for (m, c) in &mut self.selected {
            c.add(nodes, i, sign * m.count(pod, ns));
        }
        for kind in TermKind::ALL {
            for t in kind.terms(pod) {
                let key = (kind, t.clone());
                let c = match self.carried.get_mut(&key) {
                    Some(c) => c,
                    None if sign < 0 => continue,
                    None => {
                        let mut c = Counter::new(self.slots);
                        c.view(nodes, std::slice::from_ref(&t.topology_key), &t.topology_key, false);
                        self.carried.entry(key.clone()).or_insert(c)
                    }
                };
                c.add(nodes, i, sign);
                if c.total == 0 {
                    self.carried.remove(&key);
                }
            }
        }
    }

    /// The node in slot `i` joins (`sign` 1, after it is added or relabelled) or leaves (-1,
    /// before it is removed or relabelled) the views.
    pub fn node_changed(&mut self, nodes: &[NodeInfo], i: usize, sign: i64) {
        for c in self.selected.values_mut().chain(self.carried.values_mut()) {
            let pods = c.per_node[i];
            for v in &mut c.views {
                v.apply(&nodes[i], sign * pods, sign);
            }
        }
    }

    /// Namespace labels changed: counters that read them are rebuilt when next asked for.
    pub fn namespaces_changed(&mut self) {
        self.selected.retain(|m, _| !m.reads_namespace_labels());
    }

    fn counter(&mut self, nodes: &[NodeInfo], ns: &NamespaceLabels, m: &Matcher) -> &mut Counter {
        self.tick += 1;
        let tick = self.tick;
        if !self.selected.contains_key(m) {
            if self.selected.len() >= MAX_COUNTERS
                && let Some(old) = self
                    .selected
                    .iter()
                    .min_by_key(|(_, c)| c.last_used)
                    .map(|(k, _)| k.clone())
            {
                self.selected.remove(&old);
            }
            let mut c = Counter::new(self.slots);
            for (i, n) in nodes.iter().enumerate() {
                let k: i64 = n.pods.iter().map(|p| m.count(p, ns)).sum();
                c.per_node[i] = k;
                c.total += k;
            }
            self.selected.insert(m.clone(), c);
        }
        let c = self.selected.entry(m.clone()).or_insert_with(|| Counter::new(0));
        c.last_used = tick;
        c
    }

    /// Pods `m` selects per value of `key`, over the nodes that have every `required` key;
    /// each domain also says how many such nodes it has.
    pub fn domains(
        &mut self,
        nodes: &[NodeInfo],
        ns: &NamespaceLabels,
        m: &Matcher,
        required: &[String],
        key: &str,
    ) -> Arc<Domains> {
        self.counter(nodes, ns, m)
            .view(nodes, required, key, true)
            .domains
            .clone()
    }

    /// Pods `m` selects per node slot.
    pub fn per_node(&mut self, nodes: &[NodeInfo], ns: &NamespaceLabels, m: &Matcher) -> &[i64] {
        &self.counter(nodes, ns, m).per_node
    }

    /// The terms of `kind` placed pods carry, with how many pods carry each per value of the
    /// term's topology key (over the nodes with that key).
    pub fn carried(&self, kind: TermKind) -> Vec<(AffinityTerm, Arc<Domains>)> {
        self.carried
            .iter()
            .filter(|((k, _), _)| *k == kind)
            .filter_map(|((_, t), c)| c.views.first().map(|v| (t.clone(), v.domains.clone())))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::Cache;
    use crate::types::testutil::*;
    use k8s_openapi::api::core::v1::{
        Affinity, PodAffinity, PodAffinityTerm, PodAntiAffinity, WeightedPodAffinityTerm,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

    /// xorshift: a fixed pseudo-random sequence of cache operations.
    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    fn selector(app: &str) -> LabelSelector {
        LabelSelector {
            match_labels: Some([("app".to_string(), app.to_string())].into()),
            ..Default::default()
        }
    }

    fn term(app: &str, key: &str, team: Option<&str>) -> PodAffinityTerm {
        PodAffinityTerm {
            label_selector: Some(selector(app)),
            topology_key: key.into(),
            namespace_selector: team.map(|t| LabelSelector {
                match_labels: Some([("team".to_string(), t.to_string())].into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn compiled(pod_ns: &str, t: &PodAffinityTerm) -> AffinityTerm {
        let mut p = pod("t", "", "");
        p.metadata.namespace = Some(pod_ns.into());
        p.spec.as_mut().unwrap().affinity = Some(Affinity {
            pod_anti_affinity: Some(PodAntiAffinity {
                required_during_scheduling_ignored_during_execution: Some(vec![t.clone()]),
                ..Default::default()
            }),
            ..Default::default()
        });
        PodInfo::new(p).required_anti_affinity.remove(0)
    }

    /// What the views must equal: a walk over every node and pod.
    fn recount(cache: &Cache, selects: &dyn Fn(&PodInfo) -> bool, required: &[String], key: &str) -> Domains {
        let mut out = Domains::default();
        for n in cache.nodes() {
            if n.node.is_none() || !required.iter().all(|k| n.labels.contains_key(k)) {
                continue;
            }
            let v = n.labels.get(key).cloned().unwrap_or_default();
            let d = out.entry(v).or_default();
            d.nodes += 1;
            d.pods += n.pods.iter().filter(|p| selects(p)).count() as i64;
        }
        out
    }

    fn recount_carried(cache: &Cache, kind: TermKind) -> HashMap<AffinityTerm, Domains> {
        let mut out: HashMap<AffinityTerm, Domains> = HashMap::new();
        for n in cache.nodes() {
            for p in &n.pods {
                for t in kind.terms(p) {
                    let m = out.entry(t.clone()).or_default();
                    if n.node.is_some()
                        && let Some(v) = n.labels.get(&t.topology_key)
                    {
                        m.entry(v.clone()).or_default().pods += 1;
                    }
                }
            }
        }
        out.retain(|_, m| !m.is_empty());
        out
    }

    fn random_pod(rng: &mut Rng, k: u64) -> PodInfo {
        let mut p = pod(&format!("p{k}"), "", "");
        let app = ["a", "b"][rng.below(2) as usize];
        p.metadata.labels = Some([("app".to_string(), app.to_string())].into());
        p.metadata.namespace = Some(["default", "other"][rng.below(2) as usize].into());
        let key = ["kubernetes.io/hostname", "zone"][rng.below(2) as usize];
        let mut aff = Affinity::default();
        match rng.below(4) {
            0 => {
                aff.pod_anti_affinity = Some(PodAntiAffinity {
                    required_during_scheduling_ignored_during_execution: Some(vec![term("a", key, None)]),
                    preferred_during_scheduling_ignored_during_execution: Some(vec![WeightedPodAffinityTerm {
                        weight: 3,
                        pod_affinity_term: term("b", "zone", Some("x")),
                    }]),
                })
            }
            1 => {
                aff.pod_affinity = Some(PodAffinity {
                    required_during_scheduling_ignored_during_execution: Some(vec![
                        term("b", key, None),
                        term("b", key, None),
                    ]),
                    ..Default::default()
                })
            }
            _ => {}
        }
        p.spec.as_mut().unwrap().affinity = Some(aff);
        let mut info = PodInfo::new(p);
        info.deleting = rng.below(5) == 0;
        info
    }

    /// After every add, assume, confirm, forget, update and removal of pods, relabelling,
    /// removal and return of nodes, and namespace relabelling, the incrementally kept counts
    /// equal a full recount.
    #[test]
    fn incremental_counts_equal_a_recount() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut cache = Cache::new();
        let zone = "zone".to_string();
        let host = "kubernetes.io/hostname".to_string();
        let spread = |ns: &str, app: &str| Matcher::Spread {
            namespace: ns.into(),
            selector: Selector::from_label_selector(Some(&selector(app))),
        };
        let term_a = compiled("default", &term("a", "zone", None));
        let term_x = compiled("default", &term("b", "zone", Some("x")));
        type Selects = Box<dyn Fn(&PodInfo) -> bool>;
        let queries: Vec<(Matcher, Selects)> = vec![
            (
                spread("default", "a"),
                Box::new(|p: &PodInfo| !p.deleting && p.namespace == "default" && p.labels["app"] == "a"),
            ),
            (
                spread("other", "b"),
                Box::new(|p: &PodInfo| !p.deleting && p.namespace == "other" && p.labels["app"] == "b"),
            ),
            (
                Matcher::Terms(vec![term_a.clone()]),
                Box::new(|p: &PodInfo| p.namespace == "default" && p.labels["app"] == "a"),
            ),
        ];
        let keys: Vec<(Vec<String>, String)> = vec![
            (vec![zone.clone()], zone.clone()),
            (vec![], zone.clone()),
            (vec![host.clone(), zone.clone()], host.clone()),
        ];
        for step in 0..3000 {
            match rng.below(10) {
                0 | 1 => {
                    let name = format!("n{}", rng.below(8));
                    let mut n = node(&name, "4", "8Gi", "110");
                    if rng.below(4) != 0 {
                        let z = format!("z{}", rng.below(3));
                        n.metadata.labels.as_mut().unwrap().insert("zone".into(), z);
                    }
                    cache.upsert_node(Arc::new(n));
                }
                2 => cache.remove_node(&format!("n{}", rng.below(8))),
                3 | 4 => {
                    let mut p = {
                        let k = rng.below(40);
                        random_pod(&mut rng, k)
                    };
                    // n8 is never a node: its pods wait in a placeholder slot.
                    p.node_name = Some(format!("n{}", rng.below(9)));
                    cache.upsert_bound_pod(Arc::new(p));
                }
                5 | 6 => {
                    let p = {
                        let k = rng.below(40);
                        random_pod(&mut rng, k)
                    };
                    let node = format!("n{}", rng.below(9));
                    cache.assume_pod(Arc::new(p), &node);
                }
                7 => {
                    cache.remove_pod(&format!("uid-p{}", rng.below(40)));
                }
                8 => cache.forget_pod(&format!("uid-p{}", rng.below(40))),
                _ => {
                    let team = ["x", "y"][rng.below(2) as usize];
                    cache.set_namespace("other", [("team".to_string(), team.to_string())].into());
                }
            }
            for (m, selects) in &queries {
                for (required, key) in &keys {
                    let want = recount(&cache, selects.as_ref(), required, key);
                    assert_eq!(
                        *cache.domains(m, required, key),
                        want,
                        "step {step}: {m:?} {required:?} {key}"
                    );
                }
                let per_node: Vec<i64> = cache
                    .nodes()
                    .iter()
                    .map(|n| n.pods.iter().filter(|p| selects(p)).count() as i64)
                    .collect();
                assert_eq!(cache.with_per_node(m, |c| c.to_vec()), per_node, "step {step}: {m:?}");
            }
            // A namespace-selector term, asked for every few steps (rebuilt after relabels).
            if step % 7 == 0 {
                let other_x = cache.namespace_labels("other").is_some_and(|l| l["team"] == "x");
                let m = Matcher::Terms(vec![term_x.clone()]);
                let selects = |p: &PodInfo| p.namespace == "other" && other_x && p.labels["app"] == "b";
                let want = recount(&cache, &selects, std::slice::from_ref(&zone), &zone);
                assert_eq!(
                    *cache.domains(&m, std::slice::from_ref(&zone), &zone),
                    want,
                    "step {step}"
                );
            }
            for kind in TermKind::ALL {
                let got: HashMap<AffinityTerm, Domains> = cache
                    .carried_terms(kind)
                    .into_iter()
                    .map(|(t, d)| (t, (*d).clone()))
                    .filter(|(_, d)| !d.is_empty())
                    .collect();
                assert_eq!(got, recount_carried(&cache, kind), "step {step}: {kind:?}");
            }
        }
    }
}
