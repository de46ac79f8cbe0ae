//! PodTopologySpread: `whenUnsatisfiable: DoNotSchedule` constraints filter (skew against the
//! emptiest eligible domain), `ScheduleAnyway` constraints score.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::cache::Cache;
use crate::counts::{Domain, Domains, Matcher};
use crate::framework::{CycleState, MAX_NODE_SCORE, Plugin, Status};
use crate::labels::Selector;
use crate::plugins::node_affinity::PodNodeAffinity;
use crate::plugins::taint_toleration::find_untolerated;
use crate::types::{NodeInfo, PodInfo};

pub const NAME: &str = "PodTopologySpread";
pub const ERR_REASON_CONSTRAINTS_NOT_MATCH: &str = "node(s) didn't match pod topology spread constraints";
pub const ERR_REASON_NODE_LABEL_NOT_MATCH: &str =
    "node(s) didn't match pod topology spread constraints (missing required label)";
const LABEL_HOSTNAME: &str = "kubernetes.io/hostname";

#[derive(Debug, Clone)]
pub struct Constraint {
    max_skew: i64,
    topology_key: String,
    selector: Selector,
    min_domains: i64,
    honor_node_affinity: bool,
    honor_taints: bool,
}

fn constraints(pod: &PodInfo, hard: bool) -> Vec<Constraint> {
    let Some(spec) = pod.pod.spec.as_ref() else {
        return Vec::new();
    };
    let want = if hard { "DoNotSchedule" } else { "ScheduleAnyway" };
    spec.topology_spread_constraints
        .iter()
        .flatten()
        .filter(|c| c.when_unsatisfiable == want)
        .map(|c| {
            let mut selector = Selector::from_label_selector(c.label_selector.as_ref());
            for k in c.match_label_keys.iter().flatten() {
                if let Some(v) = pod.labels.get(k) {
                    selector.add_equals(k, v);
                }
            }
            Constraint {
                max_skew: i64::from(c.max_skew),
                topology_key: c.topology_key.clone(),
                selector,
                min_domains: i64::from(c.min_domains.unwrap_or(1)),
                honor_node_affinity: c.node_affinity_policy.as_deref() != Some("Ignore"),
                honor_taints: c.node_taints_policy.as_deref() == Some("Honor"),
            }
        })
        .collect()
}

/// Upstream's systemDefaultConstraints.
fn system_default_constraints(selector: Selector) -> Vec<Constraint> {
    [(LABEL_HOSTNAME, 3), ("topology.kubernetes.io/zone", 5)]
        .into_iter()
        .map(|(key, skew)| Constraint {
            max_skew: skew,
            topology_key: key.to_string(),
            selector: selector.clone(),
            min_domains: 1,
            honor_node_affinity: true,
            honor_taints: false,
        })
        .collect()
}

fn count_matching(node: &NodeInfo, sel: &Selector, ns: &str) -> i64 {
    node.pods
        .iter()
        .filter(|p| !p.deleting && p.namespace == ns && sel.matches(&p.labels))
        .count() as i64
}

fn has_all_keys(node: &NodeInfo, cs: &[Constraint]) -> bool {
    cs.iter().all(|c| node.labels.contains_key(&c.topology_key))
}

fn eligible(node: &NodeInfo, c: &Constraint, pod: &PodInfo, aff: &PodNodeAffinity) -> bool {
    (!c.honor_node_affinity || aff.matches(node))
        && (!c.honor_taints || find_untolerated(&node.taints, &pod.tolerations).is_none())
}

/// The sorted, distinct topology keys of the constraints.
fn required_keys(cs: &[Constraint]) -> Vec<String> {
    let mut keys: Vec<String> = cs.iter().map(|c| c.topology_key.clone()).collect();
    keys.sort_unstable();
    keys.dedup();
    keys
}

/// Matching pods (of the pod's namespace, not being deleted) per value of the constraint's
/// key, over the nodes that are eligible for it and have every `required` key (a node
/// without the key counts under ""). Read from the cache's counts; only when the constraint
/// honors a node affinity the pod has, or taints, are the nodes walked (still without
/// looking at their pods).
fn domain_counts(
    cache: &Cache,
    pod: &PodInfo,
    c: &Constraint,
    required: &[String],
    aff: &PodNodeAffinity,
) -> Arc<Domains> {
    let m = Matcher::Spread {
        namespace: pod.namespace.clone(),
        selector: c.selector.clone(),
    };
    if (!c.honor_node_affinity || !aff.has_required()) && !c.honor_taints {
        return cache.domains(&m, required, &c.topology_key);
    }
    let nodes = cache.nodes();
    cache.with_per_node(&m, |per_node| {
        let mut out = Domains::default();
        for (node, &n) in nodes.iter().zip(per_node) {
            if node.node.is_none()
                || !required.iter().all(|k| node.labels.contains_key(k))
                || !eligible(node, c, pod, aff)
            {
                continue;
            }
            let v = node.labels.get(&c.topology_key).map(String::as_str).unwrap_or("");
            let d = match out.get_mut(v) {
                Some(d) => d,
                None => out.entry(v.to_string()).or_default(),
            };
            d.pods += n;
            d.nodes += 1;
        }
        Arc::new(out)
    })
}

#[derive(Debug, Default)]
pub struct PreFilterState {
    constraints: Vec<Constraint>,
    /// Per constraint: domain value -> matching pods (and eligible nodes).
    counts: Vec<Arc<Domains>>,
    /// Per constraint: the minimum over eligible domains (0 below minDomains).
    min_match: Vec<i64>,
}

#[derive(Debug, Default)]
pub struct PreScoreState {
    constraints: Vec<Constraint>,
    /// False for system-default constraints: nodes missing a key still score on the others.
    require_all: bool,
    ignored: HashSet<usize>,
    pair_counts: Vec<HashMap<String, i64>>,
    /// Per hostname constraint: matching pods per feasible node (by node name), read from the
    /// cache's per-node counts rather than from each node's pods.
    node_counts: Vec<HashMap<String, i64>>,
    weights: Vec<f64>,
}

pub struct PodTopologySpread;

impl Plugin for PodTopologySpread {
    fn name(&self) -> &'static str {
        NAME
    }

    fn has_filter(&self) -> bool {
        true
    }

    fn pre_filter(&self, state: &mut CycleState, pod: &PodInfo, cache: &Cache) -> Status {
        let cs = constraints(pod, true);
        if cs.is_empty() {
            return Status::skip();
        }
        let fallback;
        let aff = match &state.node_affinity {
            Some(a) => a,
            None => {
                fallback = PodNodeAffinity::new(pod);
                &fallback
            }
        };
        let required = required_keys(&cs);
        let counts: Vec<Arc<Domains>> = cs
            .iter()
            .map(|c| domain_counts(cache, pod, c, &required, aff))
            .collect();
        let min_match = cs
            .iter()
            .zip(&counts)
            .map(|(c, m)| {
                let eligible = m.values().filter(|d| d.nodes > 0);
                if (eligible.clone().count() as i64) < c.min_domains {
                    0
                } else {
                    eligible.map(|d| d.pods).min().unwrap_or(0)
                }
            })
            .collect();
        state.spread = Some(PreFilterState {
            constraints: cs,
            counts,
            min_match,
        });
        Status::success()
    }

    fn filter(&self, state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        let Some(s) = &state.spread else {
            return Status::success();
        };
        for (i, c) in s.constraints.iter().enumerate() {
            let Some(v) = node.labels.get(&c.topology_key) else {
                return Status::unresolvable(ERR_REASON_NODE_LABEL_NOT_MATCH);
            };
            let self_match = i64::from(c.selector.matches(&pod.labels));
            let matched = s.counts[i].get(v).map(|d: &Domain| d.pods).unwrap_or(0);
            let skew = matched + self_match - s.min_match[i];
            if skew > c.max_skew {
                return Status::unschedulable(ERR_REASON_CONSTRAINTS_NOT_MATCH);
            }
        }
        Status::success()
    }

    fn score_weight(&self) -> i64 {
        2
    }

    fn pre_score(&self, state: &mut CycleState, pod: &PodInfo, cache: &Cache, feasible: &[usize]) -> bool {
        let mut cs = constraints(pod, false);
        let mut require_all = true;
        let has_own = pod
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.topology_spread_constraints.as_ref())
            .is_some_and(|c| !c.is_empty());
        if !has_own {
            // Upstream's system defaulting: spread by hostname (maxSkew 3) and zone (maxSkew 5)
            // the pods of the same services / controller.
            let Some(selector) = cache.spread_sources.default_selector(pod) else {
                return false;
            };
            cs = system_default_constraints(selector);
            require_all = false;
        }
        if cs.is_empty() {
            return false;
        }
        let nodes = cache.nodes();
        let mut s = PreScoreState {
            pair_counts: vec![HashMap::new(); cs.len()],
            require_all,
            ..Default::default()
        };
        let mut domains: Vec<HashSet<&str>> = vec![HashSet::new(); cs.len()];
        for &idx in feasible {
            let n = &nodes[idx];
            if require_all && !has_all_keys(n, &cs) {
                s.ignored.insert(idx);
                continue;
            }
            for (i, c) in cs.iter().enumerate() {
                let v = n.labels.get(&c.topology_key).map(String::as_str).unwrap_or("");
                domains[i].insert(v);
                if c.topology_key != LABEL_HOSTNAME && !s.pair_counts[i].contains_key(v) {
                    s.pair_counts[i].insert(v.to_string(), 0);
                }
            }
        }
        let usable = feasible.len() - s.ignored.len();
        s.weights = cs
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let size = if c.topology_key == LABEL_HOSTNAME {
                    usable
                } else {
                    domains[i].len()
                };
                ((size + 2) as f64).ln()
            })
            .collect();
        let fallback;
        let aff = match &state.node_affinity {
            Some(a) => a,
            None => {
                fallback = PodNodeAffinity::new(pod);
                &fallback
            }
        };
        let required = if require_all { required_keys(&cs) } else { Vec::new() };
        s.node_counts = vec![HashMap::new(); cs.len()];
        for (i, c) in cs.iter().enumerate() {
            if c.topology_key == LABEL_HOSTNAME {
                let m = Matcher::Spread {
                    namespace: pod.namespace.clone(),
                    selector: c.selector.clone(),
                };
                s.node_counts[i] = cache.with_per_node(&m, |per_node| {
                    feasible
                        .iter()
                        .filter(|idx| !s.ignored.contains(idx))
                        .map(|&idx| (nodes[idx].name.clone(), per_node.get(idx).copied().unwrap_or(0)))
                        .collect()
                });
                continue;
            }
            let domains = domain_counts(cache, pod, c, &required, aff);
            for (v, slot) in s.pair_counts[i].iter_mut() {
                *slot = domains.get(v).map(|d| d.pods).unwrap_or(0);
            }
        }
        s.constraints = cs;
        state.spread_score = Some(s);
        true
    }

    fn score(&self, state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> i64 {
        let Some(s) = &state.spread_score else {
            return 0;
        };
        if s.require_all && !has_all_keys(node, &s.constraints) {
            return -1;
        }
        let mut score = 0.0;
        for (i, c) in s.constraints.iter().enumerate() {
            let Some(v) = node.labels.get(&c.topology_key) else {
                continue;
            };
            let cnt = if c.topology_key == LABEL_HOSTNAME {
                match s.node_counts.get(i).and_then(|m| m.get(&node.name)) {
                    Some(&n) => n,
                    None => count_matching(node, &c.selector, &pod.namespace),
                }
            } else {
                s.pair_counts[i].get(v).copied().unwrap_or(0)
            };
            score += cnt as f64 * s.weights[i] + (c.max_skew - 1) as f64;
        }
        score.round() as i64
    }

    fn normalize(&self, _s: &CycleState, scores: &mut [i64]) {
        // Negative scores mark ignored nodes (missing a topology key).
        let valid = scores.iter().copied().filter(|s| *s >= 0);
        let min = valid.clone().min().unwrap_or(0);
        let max = valid.max().unwrap_or(0);
        for s in scores.iter_mut() {
            *s = if *s < 0 {
                0
            } else if max == 0 {
                MAX_NODE_SCORE
            } else {
                MAX_NODE_SCORE * (max + min - *s) / max
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::Code;
    use crate::types::testutil::*;
    use k8s_openapi::api::core::v1::{Pod, TopologySpreadConstraint};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    use std::sync::Arc;

    fn spread_pod(name: &str, when: &str, max_skew: i32) -> Pod {
        let mut p = pod(name, "", "");
        p.metadata.labels = Some([("foo".to_string(), "".to_string())].into());
        p.spec.as_mut().unwrap().topology_spread_constraints = Some(vec![TopologySpreadConstraint {
            max_skew,
            topology_key: "zone".into(),
            when_unsatisfiable: when.into(),
            label_selector: Some(LabelSelector {
                match_expressions: Some(vec![
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement {
                        key: "foo".into(),
                        operator: "Exists".into(),
                        values: None,
                    },
                ]),
                ..Default::default()
            }),
            ..Default::default()
        }]);
        p
    }

    /// Upstream's classic case: zone1 {node-a: 2 pods, node-b: 1}, zone2 {node-x: 0, node-y: 0}.
    fn cluster() -> Cache {
        let mut c = Cache::new();
        for (n, z) in [
            ("node-a", "zone1"),
            ("node-b", "zone1"),
            ("node-x", "zone2"),
            ("node-y", "zone2"),
        ] {
            let mut nd = node(n, "4", "8Gi", "110");
            nd.metadata.labels.as_mut().unwrap().insert("zone".into(), z.into());
            c.upsert_node(Arc::new(nd));
        }
        for (i, n) in ["node-a", "node-a", "node-b"].iter().enumerate() {
            let mut p = pod(&format!("e{i}"), "", "");
            p.metadata.labels = Some([("foo".to_string(), "".to_string())].into());
            p.spec.as_mut().unwrap().node_name = Some(n.to_string());
            c.upsert_bound_pod(Arc::new(PodInfo::new(p)));
        }
        c
    }

    #[test]
    fn hard_constraint_filters_crowded_zone() {
        let c = cluster();
        let p = PodInfo::new(spread_pod("p", "DoNotSchedule", 1));
        let mut s = CycleState::default();
        assert!(PodTopologySpread.pre_filter(&mut s, &p, &c).is_success());
        let res: Vec<bool> = ["node-a", "node-b", "node-x", "node-y"]
            .iter()
            .map(|n| PodTopologySpread.filter(&s, &p, c.node(n).unwrap()).is_success())
            .collect();
        assert_eq!(res, vec![false, false, true, true]);
        let st = PodTopologySpread.filter(&s, &p, c.node("node-a").unwrap());
        assert_eq!(st.code, Code::Unschedulable);
        assert_eq!(st.reasons, vec![ERR_REASON_CONSTRAINTS_NOT_MATCH]);
    }

    #[test]
    fn missing_label_is_unresolvable() {
        let mut c = cluster();
        c.upsert_node(Arc::new(node("bare", "4", "8Gi", "110")));
        let p = PodInfo::new(spread_pod("p", "DoNotSchedule", 1));
        let mut s = CycleState::default();
        PodTopologySpread.pre_filter(&mut s, &p, &c);
        let st = PodTopologySpread.filter(&s, &p, c.node("bare").unwrap());
        assert_eq!(st.code, Code::UnschedulableAndUnresolvable);
        assert_eq!(st.reasons, vec![ERR_REASON_NODE_LABEL_NOT_MATCH]);
    }

    #[test]
    fn system_default_spreads_controller_pods_by_hostname() {
        use crate::labels::Selector;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
        let mut c = Cache::new();
        for n in ["a", "b"] {
            c.upsert_node(Arc::new(node(n, "4", "8Gi", "110")));
        }
        let rs_pod = |name: &str| {
            let mut p = pod(name, "", "");
            p.metadata.labels = Some([("app".to_string(), "web".to_string())].into());
            p.metadata.owner_references = Some(vec![OwnerReference {
                api_version: "apps/v1".into(),
                kind: "ReplicaSet".into(),
                name: "web-1".into(),
                uid: "rs".into(),
                controller: Some(true),
                ..Default::default()
            }]);
            p
        };
        for i in 0..2 {
            let mut p = rs_pod(&format!("e{i}"));
            p.spec.as_mut().unwrap().node_name = Some("a".into());
            c.upsert_bound_pod(Arc::new(PodInfo::new(p)));
        }
        let p = PodInfo::new(rs_pod("new"));
        let feasible: Vec<usize> = c.node_indices().collect();
        let mut s = CycleState::default();
        // Unknown controller and no services: no default spreading.
        assert!(!PodTopologySpread.pre_score(&mut s, &p, &c, &feasible));
        c.spread_sources.controllers.insert(
            ("ReplicaSet", "default".into(), "web-1".into()),
            Selector::from_map(&[("app".to_string(), "web".to_string())].into()),
        );
        assert!(PodTopologySpread.pre_score(&mut s, &p, &c, &feasible));
        let mut scores: Vec<i64> = feasible
            .iter()
            .map(|&i| PodTopologySpread.score(&s, &p, &c.nodes()[i]))
            .collect();
        PodTopologySpread.normalize(&s, &mut scores);
        // Node a already runs two replicas (and no node has a zone label): b wins.
        assert!(scores[1] > scores[0], "{scores:?}");
    }

    #[test]
    fn soft_constraint_prefers_empty_zone() {
        let c = cluster();
        let p = PodInfo::new(spread_pod("p", "ScheduleAnyway", 1));
        let mut s = CycleState::default();
        let feasible: Vec<usize> = c.node_indices().collect();
        assert!(PodTopologySpread.pre_score(&mut s, &p, &c, &feasible));
        let mut scores: Vec<i64> = feasible
            .iter()
            .map(|&i| PodTopologySpread.score(&s, &p, &c.nodes()[i]))
            .collect();
        PodTopologySpread.normalize(&s, &mut scores);
        // zone1 has 3 matching pods, zone2 none.
        assert!(scores[2] > scores[0]);
        assert_eq!(scores[2], 100);
        assert_eq!(scores[0], scores[1]);
    }
}
