//! Compiled label selectors for pod affinity and topology spread terms.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Op {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Requirement {
    key: String,
    op: Op,
    values: Vec<String>,
}

/// A label selector ready to match. A missing selector matches nothing, an empty one everything
/// (as upstream's `LabelSelectorAsSelector`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Selector {
    nothing: bool,
    reqs: Vec<Requirement>,
}

impl Selector {
    pub fn nothing() -> Self {
        Selector {
            nothing: true,
            reqs: Vec::new(),
        }
    }

    pub fn everything() -> Self {
        Selector {
            nothing: false,
            reqs: Vec::new(),
        }
    }

    /// Compiles a selector; an invalid operator makes it match nothing.
    pub fn from_label_selector(sel: Option<&LabelSelector>) -> Self {
        let Some(sel) = sel else {
            return Self::nothing();
        };
        let mut reqs = Vec::new();
        if let Some(ml) = &sel.match_labels {
            for (k, v) in ml {
                reqs.push(Requirement {
                    key: k.clone(),
                    op: Op::In,
                    values: vec![v.clone()],
                });
            }
        }
        if let Some(exprs) = &sel.match_expressions {
            for e in exprs {
                let op = match e.operator.as_str() {
                    "In" => Op::In,
                    "NotIn" => Op::NotIn,
                    "Exists" => Op::Exists,
                    "DoesNotExist" => Op::DoesNotExist,
                    _ => return Self::nothing(),
                };
                reqs.push(Requirement {
                    key: e.key.clone(),
                    op,
                    values: e.values.clone().unwrap_or_default(),
                });
            }
        }
        Selector { nothing: false, reqs }
    }

    /// Adds `key in (value)` requirements (used for matchLabelKeys).
    pub fn add_equals(&mut self, key: &str, value: &str) {
        self.reqs.push(Requirement {
            key: key.to_string(),
            op: Op::In,
            values: vec![value.to_string()],
        });
    }

    /// `key in (value)` for each pair (a label map as a selector; empty selects everything).
    pub fn from_map(map: &BTreeMap<String, String>) -> Self {
        let mut s = Self::everything();
        for (k, v) in map {
            s.add_equals(k, v);
        }
        s
    }

    /// Adds the other selector's requirements (both must then hold).
    pub fn and(&mut self, other: &Selector) {
        self.nothing |= other.nothing;
        self.reqs.extend(other.reqs.iter().cloned());
    }

    pub fn is_empty_match_all(&self) -> bool {
        !self.nothing && self.reqs.is_empty()
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        if self.nothing {
            return false;
        }
        self.reqs.iter().all(|r| {
            let v = labels.get(&r.key);
            match r.op {
                Op::In => v.is_some_and(|v| r.values.iter().any(|x| x == v)),
                Op::NotIn => v.is_none_or(|v| r.values.iter().all(|x| x != v)),
                Op::Exists => v.is_some(),
                Op::DoesNotExist => v.is_none(),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn nil_matches_nothing_empty_matches_all() {
        assert!(!Selector::from_label_selector(None).matches(&labels(&[])));
        assert!(Selector::from_label_selector(Some(&LabelSelector::default())).matches(&labels(&[])));
    }

    #[test]
    fn expressions() {
        let sel = LabelSelector {
            match_labels: Some([("app".to_string(), "web".to_string())].into()),
            match_expressions: Some(vec![
                LabelSelectorRequirement {
                    key: "tier".into(),
                    operator: "NotIn".into(),
                    values: Some(vec!["db".into()]),
                },
                LabelSelectorRequirement {
                    key: "x".into(),
                    operator: "DoesNotExist".into(),
                    values: None,
                },
            ]),
        };
        let s = Selector::from_label_selector(Some(&sel));
        assert!(s.matches(&labels(&[("app", "web")])));
        assert!(s.matches(&labels(&[("app", "web"), ("tier", "fe")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("tier", "db")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("x", "1")])));
        assert!(!s.matches(&labels(&[("app", "db")])));
    }
}
