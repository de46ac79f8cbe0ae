//! InterPodAffinity: required pod affinity / anti-affinity (the pod's own and existing pods'
//! anti-affinity) filter; preferred terms (both ways) and existing pods' required affinity
//! score.

use std::collections::HashMap;
use std::sync::Arc;

use crate::cache::Cache;
use crate::counts::{Domains, Matcher, TermKind};
use crate::framework::{CycleState, MAX_NODE_SCORE, Plugin, Status};
use crate::types::{AffinityTerm, NodeInfo, PodInfo};

pub const NAME: &str = "InterPodAffinity";
pub const ERR_REASON_EXISTING_ANTI_AFFINITY: &str = "node(s) didn't satisfy existing pods anti-affinity rules";
pub const ERR_REASON_AFFINITY: &str = "node(s) didn't match pod affinity rules";
pub const ERR_REASON_ANTI_AFFINITY: &str = "node(s) didn't match pod anti-affinity rules";
/// Upstream's default hardPodAffinityWeight.
const HARD_POD_AFFINITY_WEIGHT: i64 = 1;

/// Per topology key, the pods counted per value (several maps may share a key: they add up).
#[derive(Debug, Default)]
struct TopologyCounts(Vec<(String, Arc<Domains>)>);

impl TopologyCounts {
    fn push(&mut self, key: &str, domains: Arc<Domains>) {
        self.0.push((key.to_string(), domains));
    }

    fn get(&self, key: &str, value: &str) -> i64 {
        self.0
            .iter()
            .filter(|(k, _)| k == key)
            .filter_map(|(_, m)| m.get(value))
            .map(|d| d.pods)
            .sum()
    }

    /// Whether no domain has a pod counted.
    fn is_empty(&self) -> bool {
        self.0.iter().all(|(_, m)| m.values().all(|d| d.pods == 0))
    }

    /// Whether the node is in a domain with a positive count.
    fn hits(&self, node: &NodeInfo) -> bool {
        self.0
            .iter()
            .any(|(k, m)| node.labels.get(k).and_then(|v| m.get(v)).is_some_and(|d| d.pods > 0))
    }
}

/// Pods the terms all select, per value of `key` over the nodes that have it.
fn term_counts(cache: &Cache, terms: &[AffinityTerm], key: &str) -> Arc<Domains> {
    cache.domains(&Matcher::Terms(terms.to_vec()), &[key.to_string()], key)
}

#[derive(Debug, Default)]
pub struct PreFilterState {
    /// Topology pairs where an existing pod's required anti-affinity selects the pod.
    existing_anti: TopologyCounts,
    /// Topology pairs with pods matching all of the pod's required affinity terms.
    affinity: TopologyCounts,
    /// Topology pairs with pods matching the pod's required anti-affinity terms.
    anti_affinity: TopologyCounts,
    /// The pod matches all of its own required affinity terms.
    self_match: bool,
    /// No pod matches the pod's required affinity terms anywhere (asked per node, known once).
    no_affinity_pods: bool,
}

#[derive(Debug, Default)]
pub struct PreScoreState {
    scores: HashMap<String, HashMap<String, i64>>,
}

fn matches_all(terms: &[AffinityTerm], pod: &PodInfo, cache: &Cache) -> bool {
    let ns = cache.namespace_labels(&pod.namespace);
    !terms.is_empty() && terms.iter().all(|t| t.matches(pod, ns))
}

pub struct InterPodAffinity;

impl Plugin for InterPodAffinity {
    fn name(&self) -> &'static str {
        NAME
    }

    fn has_filter(&self) -> bool {
        true
    }

    fn pre_filter(&self, state: &mut CycleState, pod: &PodInfo, cache: &Cache) -> Status {
        let own = !pod.required_affinity.is_empty() || !pod.required_anti_affinity.is_empty();
        let existing = cache.any_pod_with_required_anti_affinity();
        if !own && !existing {
            return Status::skip();
        }
        let mut s = PreFilterState {
            self_match: matches_all(&pod.required_affinity, pod, cache),
            ..Default::default()
        };
        let pod_ns = cache.namespace_labels(&pod.namespace);
        if existing {
            for (t, domains) in cache.carried_terms(TermKind::RequiredAntiAffinity) {
                if t.matches(pod, pod_ns) {
                    s.existing_anti.push(&t.topology_key, domains);
                }
            }
        }
        if own {
            if !pod.required_affinity.is_empty() {
                for t in &pod.required_affinity {
                    s.affinity.push(
                        &t.topology_key,
                        term_counts(cache, &pod.required_affinity, &t.topology_key),
                    );
                }
            }
            for t in &pod.required_anti_affinity {
                s.anti_affinity.push(
                    &t.topology_key,
                    term_counts(cache, std::slice::from_ref(t), &t.topology_key),
                );
            }
        }
        s.no_affinity_pods = s.affinity.is_empty();
        state.inter_pod = Some(s);
        Status::success()
    }

    fn filter(&self, state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        let Some(s) = &state.inter_pod else {
            return Status::success();
        };
        // Required affinity: every topology key present, and a matching pod in each domain
        // (or no matching pod anywhere and the pod matches its own terms).
        if !pod.required_affinity.is_empty() {
            let mut pods_exist = true;
            for t in &pod.required_affinity {
                match node.labels.get(&t.topology_key) {
                    None => return Status::unresolvable(ERR_REASON_AFFINITY),
                    Some(v) => {
                        if s.affinity.get(&t.topology_key, v) <= 0 {
                            pods_exist = false;
                        }
                    }
                }
            }
            if !pods_exist && (!s.no_affinity_pods || !s.self_match) {
                return Status::unresolvable(ERR_REASON_AFFINITY);
            }
        }
        for t in &pod.required_anti_affinity {
            if let Some(v) = node.labels.get(&t.topology_key)
                && s.anti_affinity.get(&t.topology_key, v) > 0
            {
                return Status::unschedulable(ERR_REASON_ANTI_AFFINITY);
            }
        }
        if s.existing_anti.hits(node) {
            return Status::unschedulable(ERR_REASON_EXISTING_ANTI_AFFINITY);
        }
        Status::success()
    }

    fn score_weight(&self) -> i64 {
        2
    }

    fn pre_score(&self, state: &mut CycleState, pod: &PodInfo, cache: &Cache, _f: &[usize]) -> bool {
        let own = !pod.preferred_affinity.is_empty() || !pod.preferred_anti_affinity.is_empty();
        if !own && !cache.any_pod_with_affinity() {
            return false;
        }
        let mut s = PreScoreState::default();
        let mut any = false;
        let mut bump = |key: &str, domains: &Domains, w: i64| {
            for (v, d) in domains {
                if d.pods == 0 {
                    continue;
                }
                any = true;
                let values = match s.scores.get_mut(key) {
                    Some(m) => m,
                    None => s.scores.entry(key.to_string()).or_default(),
                };
                match values.get_mut(v) {
                    Some(c) => *c += w * d.pods,
                    None => {
                        values.insert(v.clone(), w * d.pods);
                    }
                }
            }
        };
        for t in &pod.preferred_affinity {
            bump(
                &t.topology_key,
                &term_counts(cache, std::slice::from_ref(t), &t.topology_key),
                t.weight,
            );
        }
        for t in &pod.preferred_anti_affinity {
            bump(
                &t.topology_key,
                &term_counts(cache, std::slice::from_ref(t), &t.topology_key),
                -t.weight,
            );
        }
        if cache.any_pod_with_affinity() {
            let pod_ns = cache.namespace_labels(&pod.namespace);
            for (kind, sign) in [
                (TermKind::RequiredAffinity, 0),
                (TermKind::PreferredAffinity, 1),
                (TermKind::PreferredAntiAffinity, -1),
            ] {
                for (t, domains) in cache.carried_terms(kind) {
                    if t.matches(pod, pod_ns) {
                        let w = if sign == 0 {
                            HARD_POD_AFFINITY_WEIGHT
                        } else {
                            sign * t.weight
                        };
                        bump(&t.topology_key, &domains, w);
                    }
                }
            }
        }
        if !any {
            return false;
        }
        state.inter_pod_score = Some(s);
        true
    }

    fn score(&self, state: &CycleState, _pod: &PodInfo, node: &NodeInfo) -> i64 {
        let Some(s) = &state.inter_pod_score else {
            return 0;
        };
        let mut total = 0;
        for (key, values) in &s.scores {
            if let Some(v) = node.labels.get(key) {
                total += values.get(v).copied().unwrap_or(0);
            }
        }
        total
    }

    fn normalize(&self, _s: &CycleState, scores: &mut [i64]) {
        let (Some(min), Some(max)) = (scores.iter().min().copied(), scores.iter().max().copied()) else {
            return;
        };
        let diff = max - min;
        for s in scores.iter_mut() {
            *s = if diff > 0 {
                (MAX_NODE_SCORE as f64 * ((*s - min) as f64 / diff as f64)) as i64
            } else {
                0
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::Code;
    use crate::types::testutil::*;
    use k8s_openapi::api::core::v1::{
        Affinity, Pod, PodAffinity, PodAffinityTerm, PodAntiAffinity, WeightedPodAffinityTerm,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    use std::sync::Arc;

    fn term(app: &str, key: &str) -> PodAffinityTerm {
        PodAffinityTerm {
            label_selector: Some(LabelSelector {
                match_labels: Some([("app".to_string(), app.to_string())].into()),
                ..Default::default()
            }),
            topology_key: key.into(),
            ..Default::default()
        }
    }

    fn labelled_pod(name: &str, app: &str) -> Pod {
        let mut p = pod(name, "", "");
        p.metadata.labels = Some([("app".to_string(), app.to_string())].into());
        p
    }

    fn zone_node(name: &str, zone: &str) -> NodeInfo {
        let mut n = node(name, "4", "8Gi", "110");
        n.metadata.labels.as_mut().unwrap().insert("zone".into(), zone.into());
        node_info(n)
    }

    fn cache_with(pods: &[(&str, Pod)]) -> Cache {
        let mut c = Cache::new();
        for (n, z) in [("n1", "z1"), ("n2", "z1"), ("n3", "z2")] {
            let ni = zone_node(n, z);
            c.upsert_node(ni.node.clone().unwrap());
        }
        for (node, p) in pods {
            let mut p = p.clone();
            p.spec.as_mut().unwrap().node_name = Some(node.to_string());
            c.upsert_bound_pod(Arc::new(PodInfo::new(p)));
        }
        c
    }

    fn run(c: &Cache, p: &PodInfo) -> Vec<Status> {
        let mut s = CycleState::default();
        let pre = InterPodAffinity.pre_filter(&mut s, p, c);
        c.node_indices()
            .map(|i| {
                if pre.is_skip() {
                    Status::success()
                } else {
                    InterPodAffinity.filter(&s, p, &c.nodes()[i])
                }
            })
            .collect()
    }

    #[test]
    fn required_affinity_by_zone() {
        let c = cache_with(&[("n1", labelled_pod("db", "db"))]);
        let mut p = labelled_pod("web", "web");
        p.spec.as_mut().unwrap().affinity = Some(Affinity {
            pod_affinity: Some(PodAffinity {
                required_during_scheduling_ignored_during_execution: Some(vec![term("db", "zone")]),
                ..Default::default()
            }),
            ..Default::default()
        });
        let st = run(&c, &PodInfo::new(p));
        assert!(st[0].is_success() && st[1].is_success());
        assert_eq!(st[2].code, Code::UnschedulableAndUnresolvable);
        assert_eq!(st[2].reasons, vec![ERR_REASON_AFFINITY]);
    }

    #[test]
    fn first_pod_of_self_affine_series_allowed() {
        let c = cache_with(&[]);
        let mut p = labelled_pod("web", "web");
        p.spec.as_mut().unwrap().affinity = Some(Affinity {
            pod_affinity: Some(PodAffinity {
                required_during_scheduling_ignored_during_execution: Some(vec![term("web", "zone")]),
                ..Default::default()
            }),
            ..Default::default()
        });
        assert!(run(&c, &PodInfo::new(p)).iter().all(Status::is_success));
    }

    #[test]
    fn anti_affinity_own_and_existing() {
        let mut existing = labelled_pod("a", "web");
        existing.spec.as_mut().unwrap().affinity = Some(Affinity {
            pod_anti_affinity: Some(PodAntiAffinity {
                required_during_scheduling_ignored_during_execution: Some(vec![term("web", "kubernetes.io/hostname")]),
                ..Default::default()
            }),
            ..Default::default()
        });
        let c = cache_with(&[("n1", existing.clone())]);
        // A plain pod matching the existing pod's anti-affinity cannot go to n1.
        let st = run(&c, &PodInfo::new(labelled_pod("b", "web")));
        assert_eq!(st[0].reasons, vec![ERR_REASON_EXISTING_ANTI_AFFINITY]);
        assert!(st[1].is_success() && st[2].is_success());
        // The pod's own anti-affinity by zone excludes n1 and n2.
        let mut p = labelled_pod("c", "other");
        p.spec.as_mut().unwrap().affinity = Some(Affinity {
            pod_anti_affinity: Some(PodAntiAffinity {
                required_during_scheduling_ignored_during_execution: Some(vec![term("web", "zone")]),
                ..Default::default()
            }),
            ..Default::default()
        });
        let st = run(&c, &PodInfo::new(p));
        assert_eq!(st[0].reasons, vec![ERR_REASON_ANTI_AFFINITY]);
        assert_eq!(st[1].code, Code::Unschedulable);
        assert!(st[2].is_success());
    }

    #[test]
    fn namespace_selector_uses_namespace_labels() {
        let mut existing = labelled_pod("db", "db");
        existing.metadata.namespace = Some("prod".into());
        let mut c = cache_with(&[("n1", existing)]);
        let mut t = term("db", "zone");
        t.namespace_selector = Some(LabelSelector {
            match_labels: Some([("env".to_string(), "prod".to_string())].into()),
            ..Default::default()
        });
        let mut p = labelled_pod("web", "web");
        p.spec.as_mut().unwrap().affinity = Some(Affinity {
            pod_affinity: Some(PodAffinity {
                required_during_scheduling_ignored_during_execution: Some(vec![t]),
                ..Default::default()
            }),
            ..Default::default()
        });
        let p = PodInfo::new(p);
        // Namespace labels unknown: the db pod is not selected, nothing matches anywhere.
        let st = run(&c, &p);
        assert!(st.iter().all(|s| !s.is_success()));
        c.set_namespace("prod", [("env".to_string(), "prod".to_string())].into());
        let st = run(&c, &p);
        assert!(st[0].is_success() && st[1].is_success() && !st[2].is_success());
    }

    #[test]
    fn preferred_affinity_scores() {
        let c = cache_with(&[("n1", labelled_pod("db", "db"))]);
        let mut p = labelled_pod("web", "web");
        p.spec.as_mut().unwrap().affinity = Some(Affinity {
            pod_affinity: Some(PodAffinity {
                preferred_during_scheduling_ignored_during_execution: Some(vec![WeightedPodAffinityTerm {
                    weight: 5,
                    pod_affinity_term: term("db", "zone"),
                }]),
                ..Default::default()
            }),
            ..Default::default()
        });
        let p = PodInfo::new(p);
        let mut s = CycleState::default();
        assert!(InterPodAffinity.pre_score(&mut s, &p, &c, &[]));
        let mut scores: Vec<i64> = c
            .node_indices()
            .map(|i| InterPodAffinity.score(&s, &p, &c.nodes()[i]))
            .collect();
        assert_eq!(scores, vec![5, 5, 0]);
        InterPodAffinity.normalize(&s, &mut scores);
        assert_eq!(scores, vec![100, 100, 0]);
    }
}
