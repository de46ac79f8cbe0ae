//! NodeAffinity: `nodeSelector` and required node affinity filter; preferred terms score.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm};

use crate::cache::Cache;
use crate::framework::{CycleState, Plugin, Status, default_normalize};
use crate::types::{NodeInfo, PodInfo};

pub const NAME: &str = "NodeAffinity";
pub const ERR_REASON_POD: &str = "node(s) didn't match Pod's node affinity/selector";
pub const ERR_REASON_CONFLICT: &str = "pod affinity terms conflict";

#[derive(Debug, Clone, PartialEq, Eq)]
enum Op {
    In,
    NotIn,
    Exists,
    DoesNotExist,
    Gt,
    Lt,
}

#[derive(Debug, Clone)]
struct Req {
    key: String,
    op: Op,
    values: Vec<String>,
    int_value: Option<i64>,
}

impl Req {
    /// None when the requirement is invalid (then the term matches nothing).
    fn compile(r: &NodeSelectorRequirement) -> Option<Self> {
        let op = match r.operator.as_str() {
            "In" => Op::In,
            "NotIn" => Op::NotIn,
            "Exists" => Op::Exists,
            "DoesNotExist" => Op::DoesNotExist,
            "Gt" => Op::Gt,
            "Lt" => Op::Lt,
            _ => return None,
        };
        let values = r.values.clone().unwrap_or_default();
        let int_value = match op {
            Op::Gt | Op::Lt => {
                if values.len() != 1 {
                    return None;
                }
                Some(values[0].parse().ok()?)
            }
            _ => None,
        };
        Some(Req {
            key: r.key.clone(),
            op,
            values,
            int_value,
        })
    }

    fn matches(&self, value: Option<&String>) -> bool {
        match self.op {
            Op::In => value.is_some_and(|v| self.values.iter().any(|x| x == v)),
            Op::NotIn => value.is_none_or(|v| self.values.iter().all(|x| x != v)),
            Op::Exists => value.is_some(),
            Op::DoesNotExist => value.is_none(),
            Op::Gt | Op::Lt => {
                let (Some(v), Some(want)) = (value, self.int_value) else {
                    return false;
                };
                let Ok(have) = v.parse::<i64>() else {
                    return false;
                };
                if self.op == Op::Gt { have > want } else { have < want }
            }
        }
    }
}

/// One compiled node selector term: expressions on labels, fields on metadata.name.
#[derive(Debug, Clone)]
struct Term {
    valid: bool,
    exprs: Vec<Req>,
    fields: Vec<Req>,
}

impl Term {
    fn compile(t: &NodeSelectorTerm) -> Self {
        let mut valid = true;
        let mut exprs = Vec::new();
        let mut fields = Vec::new();
        for r in t.match_expressions.iter().flatten() {
            match Req::compile(r) {
                Some(r) => exprs.push(r),
                None => valid = false,
            }
        }
        for r in t.match_fields.iter().flatten() {
            // Only metadata.name with In/NotIn is a valid field requirement.
            match Req::compile(r) {
                Some(r) if r.key == "metadata.name" && matches!(r.op, Op::In | Op::NotIn) => fields.push(r),
                _ => valid = false,
            }
        }
        if exprs.is_empty() && fields.is_empty() {
            valid = false;
        }
        Term { valid, exprs, fields }
    }

    fn matches(&self, name: &String, labels: &BTreeMap<String, String>) -> bool {
        self.valid
            && self.exprs.iter().all(|r| r.matches(labels.get(&r.key)))
            && self.fields.iter().all(|r| r.matches(Some(name)))
    }
}

/// A pod's node selector and node affinity, compiled once per cycle.
#[derive(Debug, Clone, Default)]
pub struct PodNodeAffinity {
    node_selector: Vec<(String, String)>,
    /// None = no required node affinity.
    required: Option<Vec<Term>>,
    preferred: Vec<(i64, Term)>,
}

impl PodNodeAffinity {
    pub fn new(pod: &PodInfo) -> Self {
        let spec = pod.pod.spec.as_ref();
        let node_selector = spec
            .and_then(|s| s.node_selector.as_ref())
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default();
        let na = spec
            .and_then(|s| s.affinity.as_ref())
            .and_then(|a| a.node_affinity.as_ref());
        let required = na
            .and_then(|na| na.required_during_scheduling_ignored_during_execution.as_ref())
            .map(|sel| sel.node_selector_terms.iter().map(Term::compile).collect());
        let preferred = na
            .and_then(|na| na.preferred_during_scheduling_ignored_during_execution.as_ref())
            .map(|p| {
                p.iter()
                    .filter(|t| t.weight != 0)
                    .map(|t| (i64::from(t.weight), Term::compile(&t.preference)))
                    .collect()
            })
            .unwrap_or_default();
        PodNodeAffinity {
            node_selector,
            required,
            preferred,
        }
    }

    pub fn has_required(&self) -> bool {
        !self.node_selector.is_empty() || self.required.is_some()
    }

    /// Upstream's PreFilter node names: when every required term names nodes through
    /// `metadata.name In`, only those nodes can match. Some(empty) means the terms conflict.
    pub fn node_names(&self) -> Option<Vec<String>> {
        let terms = self.required.as_ref()?;
        let mut all: Vec<String> = Vec::new();
        for t in terms {
            let mut term_names: Option<Vec<String>> = None;
            for f in &t.fields {
                if f.op != Op::In {
                    continue;
                }
                term_names = Some(match term_names {
                    None => f.values.clone(),
                    Some(prev) => prev.into_iter().filter(|n| f.values.contains(n)).collect(),
                });
            }
            // A term without a name requirement lets every node through.
            all.extend(term_names?);
        }
        all.sort();
        all.dedup();
        Some(all)
    }

    pub fn has_preferred(&self) -> bool {
        !self.preferred.is_empty()
    }

    /// Whether the node satisfies nodeSelector and the required terms.
    pub fn matches(&self, node: &NodeInfo) -> bool {
        for (k, v) in &self.node_selector {
            if node.labels.get(k) != Some(v) {
                return false;
            }
        }
        match &self.required {
            None => true,
            Some(terms) => terms.iter().any(|t| t.matches(&node.name, &node.labels)),
        }
    }

    pub fn preferred_score(&self, node: &NodeInfo) -> i64 {
        self.preferred
            .iter()
            .filter(|(_, t)| t.matches(&node.name, &node.labels))
            .map(|(w, _)| *w)
            .sum()
    }
}

pub struct NodeAffinity;

impl Plugin for NodeAffinity {
    fn name(&self) -> &'static str {
        NAME
    }

    fn has_filter(&self) -> bool {
        true
    }

    fn pre_filter(&self, state: &mut CycleState, pod: &PodInfo, _c: &Cache) -> Status {
        let aff = PodNodeAffinity::new(pod);
        let required = aff.has_required();
        let names = aff.node_names();
        state.node_affinity = Some(aff);
        match names {
            Some(n) if n.is_empty() => return Status::unresolvable(ERR_REASON_CONFLICT),
            Some(n) => state.node_names = Some((n, NAME)),
            None => {}
        }
        if required { Status::success() } else { Status::skip() }
    }

    fn filter(&self, state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        let ok = match &state.node_affinity {
            Some(a) => a.matches(node),
            None => PodNodeAffinity::new(pod).matches(node),
        };
        if ok {
            Status::success()
        } else {
            Status::unresolvable(ERR_REASON_POD)
        }
    }

    fn score_weight(&self) -> i64 {
        2
    }

    fn pre_score(&self, state: &mut CycleState, pod: &PodInfo, _c: &Cache, _f: &[usize]) -> bool {
        if state.node_affinity.is_none() {
            state.node_affinity = Some(PodNodeAffinity::new(pod));
        }
        state.node_affinity.as_ref().is_some_and(PodNodeAffinity::has_preferred)
    }

    fn score(&self, state: &CycleState, _pod: &PodInfo, node: &NodeInfo) -> i64 {
        state
            .node_affinity
            .as_ref()
            .map(|a| a.preferred_score(node))
            .unwrap_or(0)
    }

    fn normalize(&self, _s: &CycleState, scores: &mut [i64]) {
        default_normalize(scores, false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::testutil::*;
    use k8s_openapi::api::core::v1::{Affinity, NodeAffinity as NA, NodeSelector, PreferredSchedulingTerm};

    fn req(key: &str, op: &str, values: &[&str]) -> NodeSelectorRequirement {
        NodeSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: Some(values.iter().map(|s| s.to_string()).collect()),
        }
    }

    fn labelled(name: &str, labels: &[(&str, &str)]) -> NodeInfo {
        let mut n = node(name, "1", "1Gi", "10");
        let l = n.metadata.labels.get_or_insert_with(Default::default);
        for (k, v) in labels {
            l.insert(k.to_string(), v.to_string());
        }
        node_info(n)
    }

    fn with_required(terms: Vec<NodeSelectorTerm>) -> PodInfo {
        let mut p = pod("p", "", "");
        p.spec.as_mut().unwrap().affinity = Some(Affinity {
            node_affinity: Some(NA {
                required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                    node_selector_terms: terms,
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
        PodInfo::new(p)
    }

    fn fits(p: &PodInfo, n: &NodeInfo) -> bool {
        let mut s = CycleState::default();
        NodeAffinity.pre_filter(&mut s, p, &Cache::new());
        NodeAffinity.filter(&s, p, n).is_success()
    }

    #[test]
    fn node_selector() {
        let mut p = pod("p", "", "");
        p.spec.as_mut().unwrap().node_selector = Some([("disktype".to_string(), "ssd".to_string())].into());
        let p = PodInfo::new(p);
        assert!(fits(&p, &labelled("a", &[("disktype", "ssd")])));
        let n = labelled("b", &[("disktype", "hdd")]);
        assert!(!fits(&p, &n));
        let mut s = CycleState::default();
        NodeAffinity.pre_filter(&mut s, &p, &Cache::new());
        assert_eq!(NodeAffinity.filter(&s, &p, &n).reasons, vec![ERR_REASON_POD]);
    }

    #[test]
    fn operators() {
        let n = labelled("a", &[("gpu", "nvidia-tesla"), ("cores", "8")]);
        let t = |r: Vec<NodeSelectorRequirement>| NodeSelectorTerm {
            match_expressions: Some(r),
            match_fields: None,
        };
        assert!(fits(
            &with_required(vec![t(vec![req("gpu", "In", &["nvidia-tesla"])])]),
            &n
        ));
        assert!(!fits(
            &with_required(vec![t(vec![req("gpu", "NotIn", &["nvidia-tesla"])])]),
            &n
        ));
        assert!(fits(&with_required(vec![t(vec![req("gpu", "Exists", &[])])]), &n));
        assert!(fits(&with_required(vec![t(vec![req("tpu", "DoesNotExist", &[])])]), &n));
        assert!(fits(&with_required(vec![t(vec![req("cores", "Gt", &["4"])])]), &n));
        assert!(!fits(&with_required(vec![t(vec![req("cores", "Lt", &["4"])])]), &n));
        assert!(!fits(&with_required(vec![t(vec![req("cores", "Gt", &["x"])])]), &n));
        // Terms are ORed, expressions ANDed.
        assert!(fits(
            &with_required(vec![
                t(vec![req("gpu", "In", &["amd"])]),
                t(vec![req("gpu", "Exists", &[]), req("cores", "In", &["8"])]),
            ]),
            &n
        ));
        // Empty terms match nothing.
        assert!(!fits(&with_required(vec![]), &n));
        assert!(!fits(&with_required(vec![NodeSelectorTerm::default()]), &n));
    }

    #[test]
    fn match_fields() {
        let term = NodeSelectorTerm {
            match_expressions: None,
            match_fields: Some(vec![req("metadata.name", "In", &["a"])]),
        };
        let p = with_required(vec![term]);
        assert!(fits(&p, &labelled("a", &[])));
        assert!(!fits(&p, &labelled("b", &[])));
    }

    #[test]
    fn node_names_from_match_fields() {
        let t = |names: &[&str]| NodeSelectorTerm {
            match_expressions: None,
            match_fields: Some(vec![req("metadata.name", "In", names)]),
        };
        let names = |p: &PodInfo| PodNodeAffinity::new(p).node_names();
        assert_eq!(
            names(&with_required(vec![t(&["a"]), t(&["b", "a"])])),
            Some(vec!["a".to_string(), "b".to_string()])
        );
        let mixed = NodeSelectorTerm {
            match_expressions: Some(vec![req("x", "Exists", &[])]),
            match_fields: None,
        };
        assert_eq!(names(&with_required(vec![t(&["a"]), mixed])), None);
        let both = NodeSelectorTerm {
            match_expressions: None,
            match_fields: Some(vec![
                req("metadata.name", "In", &["a"]),
                req("metadata.name", "In", &["b"]),
            ]),
        };
        let p = with_required(vec![both]);
        assert_eq!(names(&p), Some(vec![]));
        let mut s = CycleState::default();
        let st = NodeAffinity.pre_filter(&mut s, &p, &Cache::new());
        assert_eq!(st.reasons, vec![ERR_REASON_CONFLICT]);
    }

    #[test]
    fn preferred_scores() {
        let mut p = pod("p", "", "");
        p.spec.as_mut().unwrap().affinity = Some(Affinity {
            node_affinity: Some(NA {
                preferred_during_scheduling_ignored_during_execution: Some(vec![
                    PreferredSchedulingTerm {
                        weight: 1,
                        preference: NodeSelectorTerm {
                            match_expressions: Some(vec![req("group", "In", &["ai"])]),
                            match_fields: None,
                        },
                    },
                    PreferredSchedulingTerm {
                        weight: 4,
                        preference: NodeSelectorTerm {
                            match_expressions: Some(vec![req("zone", "In", &["z1"])]),
                            match_fields: None,
                        },
                    },
                ]),
                ..Default::default()
            }),
            ..Default::default()
        });
        let p = PodInfo::new(p);
        let mut s = CycleState::default();
        assert!(NodeAffinity.pre_score(&mut s, &p, &Cache::new(), &[]));
        let nodes = [
            labelled("a", &[("group", "ai")]),
            labelled("b", &[("group", "ai"), ("zone", "z1")]),
            labelled("c", &[]),
        ];
        let mut scores: Vec<i64> = nodes.iter().map(|n| NodeAffinity.score(&s, &p, n)).collect();
        assert_eq!(scores, vec![1, 5, 0]);
        NodeAffinity.normalize(&s, &mut scores);
        assert_eq!(scores, vec![20, 100, 0]);
    }
}
