//! Node selectors, node affinity and taints as upstream's `k8s.io/component-helpers/scheduling/
//! corev1` (and its `nodeaffinity` package): the one implementation the scheduler, the DaemonSet
//! controller, the taint eviction controller and the volume rules share. Selectors are compiled
//! once and matched many times (the scheduler matches a pod's against every node).
//!
//! As upstream's lazy-error selectors: a term with an invalid requirement matches nothing, the
//! other terms still count; an empty term matches nothing; terms are ORed, the requirements of a
//! term ANDed.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    NodeSelector as K8sNodeSelector, NodeSelectorRequirement, NodeSelectorTerm, PodSpec, PreferredSchedulingTerm,
    Taint, Toleration,
};

/// The only field a node selector term's `matchFields` may name.
pub const OBJECT_NAME_FIELD: &str = "metadata.name";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    In,
    NotIn,
    Exists,
    DoesNotExist,
    Gt,
    Lt,
}

/// One compiled requirement on a label (or, in `matchFields`, on the node's name).
#[derive(Debug, Clone)]
struct Requirement {
    key: String,
    op: Op,
    values: Vec<String>,
    int_value: i64,
}

impl Requirement {
    /// A `matchExpressions` requirement as upstream's `labels.NewRequirement` accepts it; None
    /// when invalid.
    fn label(r: &NodeSelectorRequirement) -> Option<Self> {
        let values = r.values.clone().unwrap_or_default();
        let op = match r.operator.as_str() {
            "In" => Op::In,
            "NotIn" => Op::NotIn,
            "Exists" => Op::Exists,
            "DoesNotExist" => Op::DoesNotExist,
            "Gt" => Op::Gt,
            "Lt" => Op::Lt,
            _ => return None,
        };
        let int_value = match op {
            Op::In | Op::NotIn if values.is_empty() => return None,
            Op::Exists | Op::DoesNotExist if !values.is_empty() => return None,
            Op::Gt | Op::Lt => match values.as_slice() {
                [v] => v.parse().ok()?,
                _ => return None,
            },
            _ => 0,
        };
        Some(Requirement {
            key: r.key.clone(),
            op,
            values,
            int_value,
        })
    }

    /// A `matchFields` requirement: `metadata.name`, In or NotIn, exactly one value.
    fn field(r: &NodeSelectorRequirement) -> Option<Self> {
        let values = r.values.clone().unwrap_or_default();
        let op = match r.operator.as_str() {
            "In" => Op::In,
            "NotIn" => Op::NotIn,
            _ => return None,
        };
        (r.key == OBJECT_NAME_FIELD && values.len() == 1).then(|| Requirement {
            key: r.key.clone(),
            op,
            values,
            int_value: 0,
        })
    }

    fn matches(&self, value: Option<&str>) -> bool {
        match self.op {
            Op::In => value.is_some_and(|v| self.values.iter().any(|x| x == v)),
            Op::NotIn => value.is_none_or(|v| self.values.iter().all(|x| x != v)),
            Op::Exists => value.is_some(),
            Op::DoesNotExist => value.is_none(),
            Op::Gt | Op::Lt => match value.and_then(|v| v.parse::<i64>().ok()) {
                Some(have) if self.op == Op::Gt => have > self.int_value,
                Some(have) => have < self.int_value,
                None => false,
            },
        }
    }
}

/// One compiled, valid, non-empty node selector term.
#[derive(Debug, Clone)]
struct Term {
    exprs: Vec<Requirement>,
    fields: Vec<Requirement>,
}

impl Term {
    /// None when the term is empty or holds an invalid requirement (it matches nothing).
    fn compile(t: &NodeSelectorTerm) -> Option<Self> {
        let exprs = t
            .match_expressions
            .iter()
            .flatten()
            .map(Requirement::label)
            .collect::<Option<Vec<_>>>()?;
        let fields = t
            .match_fields
            .iter()
            .flatten()
            .map(Requirement::field)
            .collect::<Option<Vec<_>>>()?;
        (!exprs.is_empty() || !fields.is_empty()).then_some(Term { exprs, fields })
    }

    /// `node_name` None: the node is known by its labels only and `matchFields` are not checked
    /// (a volume's node affinity against a topology).
    fn matches(&self, node_name: Option<&str>, labels: &BTreeMap<String, String>) -> bool {
        self.exprs
            .iter()
            .all(|r| r.matches(labels.get(&r.key).map(String::as_str)))
            && node_name.is_none_or(|name| self.fields.iter().all(|r| r.matches(Some(name))))
    }
}

/// A compiled `NodeSelector`: some term matches.
#[derive(Debug, Clone, Default)]
pub struct NodeSelector {
    terms: Vec<Term>,
}

impl NodeSelector {
    pub fn new(selector: &K8sNodeSelector) -> Self {
        NodeSelector {
            terms: selector.node_selector_terms.iter().filter_map(Term::compile).collect(),
        }
    }

    pub fn matches(&self, node_name: Option<&str>, labels: &BTreeMap<String, String>) -> bool {
        self.terms.iter().any(|t| t.matches(node_name, labels))
    }
}

/// Upstream's `MatchNodeSelectorTerms`, for a selector matched once.
pub fn match_node_selector_terms(
    selector: &K8sNodeSelector,
    node_name: Option<&str>,
    labels: &BTreeMap<String, String>,
) -> bool {
    NodeSelector::new(selector).matches(node_name, labels)
}

/// A pod's `nodeSelector` and required node affinity (upstream's `RequiredNodeAffinity`).
#[derive(Debug, Clone, Default)]
pub struct RequiredNodeAffinity {
    node_selector: Vec<(String, String)>,
    /// None: no required node affinity.
    required: Option<NodeSelector>,
}

impl RequiredNodeAffinity {
    pub fn new(spec: Option<&PodSpec>) -> Self {
        let node_selector = spec
            .and_then(|s| s.node_selector.as_ref())
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default();
        let required = spec
            .and_then(|s| s.affinity.as_ref())
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|na| na.required_during_scheduling_ignored_during_execution.as_ref())
            .map(NodeSelector::new);
        RequiredNodeAffinity {
            node_selector,
            required,
        }
    }

    /// Whether there is anything to check.
    pub fn is_set(&self) -> bool {
        !self.node_selector.is_empty() || self.required.is_some()
    }

    /// Whether the node satisfies the nodeSelector and some required term.
    pub fn matches(&self, node_name: &str, labels: &BTreeMap<String, String>) -> bool {
        self.node_selector.iter().all(|(k, v)| labels.get(k) == Some(v))
            && self
                .required
                .as_ref()
                .is_none_or(|r| r.matches(Some(node_name), labels))
    }
}

/// A pod's preferred node affinity terms with their weights (upstream's
/// `PreferredSchedulingTerms`); terms of weight 0 and invalid terms never count.
#[derive(Debug, Clone, Default)]
pub struct PreferredSchedulingTerms {
    terms: Vec<(i64, Term)>,
}

impl PreferredSchedulingTerms {
    pub fn new(terms: &[PreferredSchedulingTerm]) -> Self {
        PreferredSchedulingTerms {
            terms: terms
                .iter()
                .filter(|t| t.weight != 0)
                .filter_map(|t| Term::compile(&t.preference).map(|c| (i64::from(t.weight), c)))
                .collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    /// The sum of the weights of the terms the node matches.
    pub fn score(&self, node_name: &str, labels: &BTreeMap<String, String>) -> i64 {
        self.terms
            .iter()
            .filter(|(_, t)| t.matches(Some(node_name), labels))
            .map(|(w, _)| *w)
            .sum()
    }
}

/// Upstream's `Toleration.ToleratesTaint`: the effect (when set) and the key (when set) agree,
/// and `Exists`, or `Equal` (the default) with the same value.
pub fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    if t.effect.as_deref().is_some_and(|e| !e.is_empty() && e != taint.effect) {
        return false;
    }
    if t.key.as_deref().is_some_and(|k| !k.is_empty() && k != taint.key) {
        return false;
    }
    match t.operator.as_deref() {
        None | Some("") | Some("Equal") => t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or(""),
        Some("Exists") => true,
        _ => false,
    }
}

/// Upstream's `TolerationsTolerateTaint`.
pub fn tolerations_tolerate_taint(tolerations: &[Toleration], taint: &Taint) -> bool {
    tolerations.iter().any(|t| tolerates(t, taint))
}

/// Upstream's `FindMatchingUntoleratedTaint`: the first taint that `filter` keeps and no
/// toleration tolerates.
pub fn find_matching_untolerated_taint<'a>(
    taints: &'a [Taint],
    tolerations: &[Toleration],
    filter: impl Fn(&Taint) -> bool,
) -> Option<&'a Taint> {
    taints
        .iter()
        .find(|taint| filter(taint) && !tolerations_tolerate_taint(tolerations, taint))
}

/// The taints the scheduler and the DaemonSet controller filter on: NoSchedule and NoExecute.
pub fn does_not_allow_scheduling(taint: &Taint) -> bool {
    taint.effect == "NoSchedule" || taint.effect == "NoExecute"
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Affinity, NodeAffinity};

    fn req(key: &str, op: &str, values: &[&str]) -> NodeSelectorRequirement {
        NodeSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
        }
    }

    fn term(exprs: Vec<NodeSelectorRequirement>) -> NodeSelectorTerm {
        NodeSelectorTerm {
            match_expressions: Some(exprs),
            match_fields: None,
        }
    }

    fn sel(terms: Vec<NodeSelectorTerm>) -> K8sNodeSelector {
        K8sNodeSelector {
            node_selector_terms: terms,
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn operators_as_upstream() {
        let l = labels(&[("gpu", "nvidia-tesla"), ("cores", "8"), ("zone", "z1")]);
        let m = |r: NodeSelectorRequirement| match_node_selector_terms(&sel(vec![term(vec![r])]), Some("n"), &l);
        assert!(m(req("gpu", "In", &["nvidia-tesla", "amd"])));
        assert!(!m(req("gpu", "NotIn", &["nvidia-tesla"])));
        assert!(m(req("tpu", "NotIn", &["x"])));
        assert!(m(req("gpu", "Exists", &[])));
        assert!(m(req("tpu", "DoesNotExist", &[])));
        assert!(m(req("cores", "Gt", &["4"])));
        assert!(!m(req("cores", "Lt", &["4"])));
        assert!(!m(req("zone", "Gt", &["4"])), "a label that is not a number is neither");
        // Invalid requirements: the term matches nothing.
        assert!(!m(req("cores", "Gt", &["x"])));
        assert!(!m(req("cores", "Gt", &["4", "5"])));
        assert!(!m(req("gpu", "In", &[])));
        assert!(!m(req("gpu", "Exists", &["nvidia-tesla"])));
        assert!(!m(req("gpu", "Like", &["nvidia-tesla"])));
    }

    #[test]
    fn terms_are_ored_requirements_anded_and_bad_terms_spoil_only_themselves() {
        let l = labels(&[("zone", "z1"), ("gen", "5")]);
        assert!(match_node_selector_terms(
            &sel(vec![
                term(vec![req("zone", "In", &[])]),
                term(vec![]),
                term(vec![req("zone", "Exists", &[]), req("gen", "Gt", &["4"])]),
            ]),
            None,
            &l
        ));
        assert!(!match_node_selector_terms(
            &sel(vec![term(vec![req("zone", "Exists", &[]), req("gen", "Lt", &["4"])])]),
            None,
            &l
        ));
        assert!(!match_node_selector_terms(&sel(vec![]), None, &l));
        assert!(!match_node_selector_terms(
            &sel(vec![NodeSelectorTerm::default()]),
            None,
            &l
        ));
    }

    #[test]
    fn match_fields_name_the_node_with_one_value_and_only_when_its_name_is_known() {
        let l = labels(&[]);
        let by_name = |op: &str, names: &[&str]| {
            sel(vec![NodeSelectorTerm {
                match_expressions: None,
                match_fields: Some(vec![req(OBJECT_NAME_FIELD, op, names)]),
            }])
        };
        assert!(match_node_selector_terms(&by_name("In", &["n1"]), Some("n1"), &l));
        assert!(!match_node_selector_terms(&by_name("In", &["n1"]), Some("n2"), &l));
        assert!(match_node_selector_terms(&by_name("NotIn", &["n1"]), Some("n2"), &l));
        assert!(match_node_selector_terms(&by_name("In", &["n1"]), None, &l));
        // Upstream's field selector takes one value, and In or NotIn only.
        assert!(!match_node_selector_terms(
            &by_name("In", &["n1", "n2"]),
            Some("n1"),
            &l
        ));
        assert!(!match_node_selector_terms(&by_name("Exists", &[]), Some("n1"), &l));
        let other_field = sel(vec![NodeSelectorTerm {
            match_expressions: None,
            match_fields: Some(vec![req("metadata.uid", "In", &["n1"])]),
        }]);
        assert!(!match_node_selector_terms(&other_field, Some("n1"), &l));
    }

    #[test]
    fn required_affinity_is_node_selector_and_some_term() {
        let spec = PodSpec {
            node_selector: Some([("disk".to_string(), "ssd".to_string())].into()),
            affinity: Some(Affinity {
                node_affinity: Some(NodeAffinity {
                    required_during_scheduling_ignored_during_execution: Some(sel(vec![term(vec![req(
                        "zone",
                        "In",
                        &["z1"],
                    )])])),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let r = RequiredNodeAffinity::new(Some(&spec));
        assert!(r.is_set());
        assert!(r.matches("n", &labels(&[("disk", "ssd"), ("zone", "z1")])));
        assert!(!r.matches("n", &labels(&[("disk", "hdd"), ("zone", "z1")])));
        assert!(!r.matches("n", &labels(&[("disk", "ssd"), ("zone", "z2")])));
        let none = RequiredNodeAffinity::new(None);
        assert!(!none.is_set() && none.matches("n", &labels(&[])));
    }

    #[test]
    fn preferred_terms_add_their_weights() {
        let pref = |w: i32, r: NodeSelectorRequirement| PreferredSchedulingTerm {
            weight: w,
            preference: term(vec![r]),
        };
        let p = PreferredSchedulingTerms::new(&[
            pref(5, req("zone", "In", &["z1"])),
            pref(3, req("gpu", "Exists", &[])),
            pref(0, req("zone", "Exists", &[])),
            pref(7, req("zone", "In", &[])),
        ]);
        assert_eq!(p.score("n", &labels(&[("zone", "z1"), ("gpu", "x")])), 8);
        assert_eq!(p.score("n", &labels(&[("zone", "z2")])), 0);
        assert!(PreferredSchedulingTerms::new(&[]).is_empty());
    }

    fn taint(key: &str, value: &str, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            value: (!value.is_empty()).then(|| value.into()),
            effect: effect.into(),
            time_added: None,
        }
    }

    fn tol(key: &str, op: &str, value: &str, effect: &str) -> Toleration {
        Toleration {
            key: (!key.is_empty()).then(|| key.into()),
            operator: (!op.is_empty()).then(|| op.into()),
            value: (!value.is_empty()).then(|| value.into()),
            effect: (!effect.is_empty()).then(|| effect.into()),
            toleration_seconds: None,
        }
    }

    #[test]
    fn tolerations_as_upstream() {
        let t = taint("dedicated", "user1", "NoSchedule");
        assert!(tolerates(&tol("dedicated", "Equal", "user1", "NoSchedule"), &t));
        assert!(tolerates(&tol("dedicated", "", "user1", ""), &t));
        assert!(!tolerates(&tol("dedicated", "Equal", "user2", "NoSchedule"), &t));
        assert!(tolerates(&tol("dedicated", "Exists", "", "NoSchedule"), &t));
        assert!(tolerates(&tol("dedicated", "Exists", "", ""), &t));
        assert!(!tolerates(&tol("dedicated", "Exists", "", "NoExecute"), &t));
        assert!(tolerates(&tol("", "Exists", "", ""), &t));
        assert!(!tolerates(&tol("other", "Exists", "", ""), &t));
        assert!(!tolerates(&tol("dedicated", "Gt", "user1", ""), &t));
        let taints = [
            taint("a", "", "PreferNoSchedule"),
            t.clone(),
            taint("b", "", "NoExecute"),
        ];
        let found = find_matching_untolerated_taint(
            &taints,
            &[tol("dedicated", "Exists", "", "")],
            does_not_allow_scheduling,
        );
        assert_eq!(found.map(|t| t.key.as_str()), Some("b"));
        assert!(
            find_matching_untolerated_taint(&taints, &[tol("", "Exists", "", "")], does_not_allow_scheduling).is_none()
        );
    }
}
