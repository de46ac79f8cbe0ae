//! NodeAffinity: `nodeSelector` and required node affinity filter; preferred terms score.

use k8s_openapi::api::core::v1::NodeSelectorTerm;
use skiff_api::nodeaffinity::{OBJECT_NAME_FIELD, PreferredSchedulingTerms, RequiredNodeAffinity};

use crate::cache::Cache;
use crate::framework::{CycleState, Plugin, Status, default_normalize};
use crate::types::{NodeInfo, PodInfo};

pub const NAME: &str = "NodeAffinity";
pub const ERR_REASON_POD: &str = "node(s) didn't match Pod's node affinity/selector";
pub const ERR_REASON_CONFLICT: &str = "pod affinity terms conflict";

/// A pod's node selector and node affinity, compiled once per cycle (on skiff_api's one
/// implementation of upstream's `nodeaffinity` helpers).
#[derive(Debug, Clone, Default)]
pub struct PodNodeAffinity {
    required: RequiredNodeAffinity,
    /// Upstream's PreFilter node names: when every required term names nodes through
    /// `metadata.name In`, only those nodes can match. Some(empty) means the terms conflict.
    node_names: Option<Vec<String>>,
    preferred: PreferredSchedulingTerms,
}

/// The nodes the required terms restrict a pod to, read from the terms as written (as
/// upstream's PreFilter does, before any validity check).
fn node_names(terms: &[NodeSelectorTerm]) -> Option<Vec<String>> {
    let mut all: Vec<String> = Vec::new();
    for t in terms {
        let mut term_names: Option<Vec<String>> = None;
        for f in t.match_fields.iter().flatten() {
            if f.key != OBJECT_NAME_FIELD || f.operator != "In" {
                continue;
            }
            let values = f.values.clone().unwrap_or_default();
            term_names = Some(match term_names {
                None => values,
                Some(prev) => prev.into_iter().filter(|n| values.contains(n)).collect(),
            });
        }
        // A term without a name requirement lets every node through.
        all.extend(term_names?);
    }
    all.sort();
    all.dedup();
    Some(all)
}

impl PodNodeAffinity {
    pub fn new(pod: &PodInfo) -> Self {
        let spec = pod.pod.spec.as_ref();
        let na = spec
            .and_then(|s| s.affinity.as_ref())
            .and_then(|a| a.node_affinity.as_ref());
        let node_names = na
            .and_then(|na| na.required_during_scheduling_ignored_during_execution.as_ref())
            .and_then(|sel| node_names(&sel.node_selector_terms));
        let preferred = na
            .and_then(|na| na.preferred_during_scheduling_ignored_during_execution.as_deref())
            .map(PreferredSchedulingTerms::new)
            .unwrap_or_default();
        PodNodeAffinity {
            required: RequiredNodeAffinity::new(spec),
            node_names,
            preferred,
        }
    }

    pub fn has_required(&self) -> bool {
        self.required.is_set()
    }

    pub fn node_names(&self) -> Option<Vec<String>> {
        self.node_names.clone()
    }

    pub fn has_preferred(&self) -> bool {
        !self.preferred.is_empty()
    }

    /// Whether the node satisfies nodeSelector and the required terms.
    pub fn matches(&self, node: &NodeInfo) -> bool {
        self.required.matches(&node.name, &node.labels)
    }

    pub fn preferred_score(&self, node: &NodeInfo) -> i64 {
        self.preferred.score(&node.name, &node.labels)
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
    use k8s_openapi::api::core::v1::{
        Affinity, NodeAffinity as NA, NodeSelector, NodeSelectorRequirement, PreferredSchedulingTerm,
    };

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
