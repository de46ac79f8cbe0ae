//! The placement check run after a benchmark: every pod's node read back from the API, and each
//! hard constraint the pods carry checked against the final placement, independently of the
//! scheduler's plugins (its own selector and quantity parsing):
//! - every measured pod is bound to one of the benchmark's nodes;
//! - required node affinity and nodeSelector: the node has the labels;
//! - taints: every NoSchedule / NoExecute taint of the node is tolerated;
//! - topologySpreadConstraints with DoNotSchedule: per constraint, the skew between the domains'
//!   counts of matching pods (over the nodes the constraint's inclusion policies admit) is at most
//!   maxSkew;
//! - required pod affinity: the pod's domain holds another matching pod (unless no other pod
//!   matches the term anywhere: the first pod of a group may go anywhere);
//! - required pod anti-affinity: no other matching pod shares the pod's domain;
//! - resources: on every node, the requests of the pods still there (preemption's victims must be
//!   gone) fit the allocatable CPU, memory and pod count.

use std::collections::{BTreeMap, HashMap, HashSet};

use k8s_openapi::api::core::v1::{
    Node, NodeSelectorRequirement, Pod, PodAffinityTerm, Taint, Toleration, TopologySpreadConstraint,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

type Labels = BTreeMap<String, String>;

/// The benchmark's objects as read back after the run.
#[derive(Debug, Default)]
pub struct Placement {
    pub nodes: Vec<Node>,
    /// The pods of every benchmark namespace, initial and measured.
    pub pods: Vec<Pod>,
    /// Labels of the namespaces (for namespaceSelector).
    pub namespace_labels: HashMap<String, Labels>,
    /// The measured pods' namespace.
    pub measured_namespace: String,
}

/// What the check found.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize)]
pub struct CheckReport {
    pub passed: bool,
    /// Pods checked (initial and measured).
    pub pods: usize,
    /// Measured pods found bound.
    pub measured_bound: usize,
    /// Initial pods no longer there (preemption's victims).
    pub init_pods_gone: usize,
    /// The rules that applied to at least one pod.
    pub rules: Vec<&'static str>,
    pub violation_count: usize,
    /// The first violations, one line each.
    pub violations: Vec<String>,
}

const MAX_LISTED: usize = 20;

impl CheckReport {
    fn violate(&mut self, msg: String) {
        self.violation_count += 1;
        if self.violations.len() < MAX_LISTED {
            self.violations.push(msg);
        }
    }

    fn rule(&mut self, name: &'static str) {
        if !self.rules.contains(&name) {
            self.rules.push(name);
        }
    }

    /// An error naming the violations, when there are any.
    pub fn ensure_passed(&self, workload: &str) -> anyhow::Result<()> {
        if self.passed {
            return Ok(());
        }
        anyhow::bail!(
            "the {workload} placement violates its constraints ({} violation(s)):\n  {}",
            self.violation_count,
            self.violations.join("\n  ")
        )
    }
}

fn labels_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Labels {
    meta.labels.clone().unwrap_or_default()
}

fn key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// A label selector's verdict (nil selects nothing, empty selects everything, as upstream's
/// LabelSelectorAsSelector).
fn selector_matches(sel: Option<&LabelSelector>, labels: &Labels) -> bool {
    let Some(sel) = sel else {
        return false;
    };
    let by_labels = sel.match_labels.iter().flatten().all(|(k, v)| labels.get(k) == Some(v));
    by_labels
        && sel.match_expressions.iter().flatten().all(|e| {
            let values = e.values.as_deref().unwrap_or_default();
            match e.operator.as_str() {
                "In" => labels.get(&e.key).is_some_and(|v| values.contains(v)),
                "NotIn" => labels.get(&e.key).is_none_or(|v| !values.contains(v)),
                "Exists" => labels.contains_key(&e.key),
                "DoesNotExist" => !labels.contains_key(&e.key),
                _ => false,
            }
        })
}

fn requirement_matches(r: &NodeSelectorRequirement, value: Option<&String>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let int = |s: &str| s.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => {
            matches!((value.and_then(|v| int(v)), values.first().and_then(|v| int(v))), (Some(a), Some(b)) if a > b)
        }
        "Lt" => {
            matches!((value.and_then(|v| int(v)), values.first().and_then(|v| int(v))), (Some(a), Some(b)) if a < b)
        }
        _ => false,
    }
}

/// The pod's nodeSelector and required node affinity against a node.
fn node_affinity_matches(pod: &Pod, node: &Node) -> bool {
    let labels = labels_of(&node.metadata);
    let Some(spec) = &pod.spec else {
        return true;
    };
    if let Some(sel) = &spec.node_selector
        && !sel.iter().all(|(k, v)| labels.get(k) == Some(v))
    {
        return false;
    }
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref());
    let Some(required) = required else {
        return true;
    };
    let name = node.metadata.name.clone();
    required.node_selector_terms.iter().any(|t| {
        let exprs = t.match_expressions.as_deref().unwrap_or_default();
        let fields = t.match_fields.as_deref().unwrap_or_default();
        (!exprs.is_empty() || !fields.is_empty())
            && exprs.iter().all(|r| requirement_matches(r, labels.get(&r.key)))
            && fields
                .iter()
                .all(|r| r.key == "metadata.name" && requirement_matches(r, name.as_ref()))
    })
}

fn tolerates(tolerations: &[Toleration], taint: &Taint) -> bool {
    tolerations.iter().any(|t| {
        let effect_ok = t.effect.as_deref().is_none_or(|e| e.is_empty() || e == taint.effect);
        let key_ok = match t.key.as_deref() {
            None | Some("") => t.operator.as_deref() == Some("Exists"),
            Some(k) => k == taint.key,
        };
        let value_ok = match t.operator.as_deref() {
            Some("Exists") => true,
            _ => t.value.as_deref().unwrap_or_default() == taint.value.as_deref().unwrap_or_default(),
        };
        effect_ok && key_ok && value_ok
    })
}

/// The node's NoSchedule / NoExecute taints the pod does not tolerate.
fn untolerated<'a>(pod: &Pod, node: &'a Node) -> Vec<&'a Taint> {
    let tolerations = pod
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default();
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default()
        .iter()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .filter(|t| !tolerates(tolerations, t))
        .collect()
}

/// A quantity in milli-units ("100m", "4", "500Mi", "32Gi", "1k").
fn milli(q: &str) -> Option<i128> {
    let q = q.trim();
    let suffixes: [(&str, i128); 12] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("Pi", 1 << 50),
        ("Ei", 1 << 60),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
        ("P", 1_000_000_000_000_000),
        ("E", 1_000_000_000_000_000_000),
    ];
    if let Some(n) = q.strip_suffix('m') {
        return n.parse::<i128>().ok();
    }
    for (s, mult) in suffixes {
        if let Some(n) = q.strip_suffix(s) {
            return n
                .parse::<f64>()
                .ok()
                .map(|v| (v * mult as f64 * 1000.0).round() as i128);
        }
    }
    q.parse::<f64>().ok().map(|v| (v * 1000.0).round() as i128)
}

/// The pod's requests: the sum over its containers, or the largest init container's if larger.
fn requests(pod: &Pod, resource: &str) -> i128 {
    let Some(spec) = &pod.spec else {
        return 0;
    };
    let of = |c: &k8s_openapi::api::core::v1::Container| {
        c.resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get(resource))
            .and_then(|q| milli(&q.0))
            .unwrap_or(0)
    };
    let sum: i128 = spec.containers.iter().map(of).sum();
    let init = spec.init_containers.iter().flatten().map(of).max().unwrap_or(0);
    sum.max(init)
}

/// The namespaces a pod affinity term covers.
fn term_namespaces(term: &PodAffinityTerm, own: &str, p: &Placement) -> HashSet<String> {
    let mut out: HashSet<String> = term.namespaces.iter().flatten().cloned().collect();
    match &term.namespace_selector {
        Some(sel) => {
            for (ns, labels) in &p.namespace_labels {
                if selector_matches(Some(sel), labels) {
                    out.insert(ns.clone());
                }
            }
        }
        None if out.is_empty() => {
            out.insert(own.to_string());
        }
        None => {}
    }
    out
}

/// Checks the placement; `measured` pods must all be bound.
pub fn check(p: &Placement, measured: usize) -> CheckReport {
    let mut r = CheckReport::default();
    let nodes: HashMap<&str, &Node> = p
        .nodes
        .iter()
        .filter_map(|n| n.metadata.name.as_deref().map(|name| (name, n)))
        .collect();
    // The pods on a node: deleted ones are gone from the API; a pod being deleted still holds
    // its node until it is.
    let bound: Vec<(&Pod, &Node)> = p
        .pods
        .iter()
        .filter_map(|pod| {
            let name = pod.spec.as_ref()?.node_name.as_deref()?;
            nodes.get(name).map(|n| (pod, *n))
        })
        .collect();
    r.pods = p.pods.len();

    r.rule("bound");
    for pod in &p.pods {
        let on = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
        let is_measured = pod.metadata.namespace.as_deref() == Some(p.measured_namespace.as_str());
        match on {
            Some(n) if nodes.contains_key(n) && is_measured => r.measured_bound += 1,
            Some(n) if nodes.contains_key(n) => {}
            Some(n) => r.violate(format!(
                "pod {} is bound to {n}, not one of the benchmark's nodes",
                key(pod)
            )),
            None if is_measured => r.violate(format!("pod {} is not bound", key(pod))),
            None => {}
        }
    }
    if r.measured_bound < measured {
        r.violate(format!("{} of {measured} measured pods are bound", r.measured_bound));
    }

    for (pod, node) in &bound {
        let node_name = node.metadata.name.as_deref().unwrap_or_default();
        let spec = pod.spec.as_ref();
        let has_affinity = spec
            .and_then(|s| s.affinity.as_ref())
            .and_then(|a| a.node_affinity.as_ref())
            .is_some()
            || spec.and_then(|s| s.node_selector.as_ref()).is_some();
        if has_affinity {
            r.rule("node-affinity");
            if !node_affinity_matches(pod, node) {
                r.violate(format!(
                    "pod {} on {node_name}: the node does not match its node affinity (labels {:?})",
                    key(pod),
                    labels_of(&node.metadata)
                ));
            }
        }
        if node.spec.as_ref().and_then(|s| s.taints.as_ref()).is_some() {
            r.rule("taints");
            for t in untolerated(pod, node) {
                r.violate(format!(
                    "pod {} on {node_name}: the taint {}={}:{} is not tolerated",
                    key(pod),
                    t.key,
                    t.value.as_deref().unwrap_or_default(),
                    t.effect
                ));
            }
        }
    }

    check_spread(p, &bound, &mut r);
    check_pod_affinity(p, &bound, &mut r);
    check_resources(p, &bound, &mut r);
    r.passed = r.violation_count == 0;
    r
}

fn check_spread(p: &Placement, bound: &[(&Pod, &Node)], r: &mut CheckReport) {
    // One verdict per distinct (namespace, constraint, node affinity): the skew is global.
    let mut seen: HashSet<String> = HashSet::new();
    for (pod, node) in bound {
        let Some(spec) = &pod.spec else { continue };
        let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
        for c in spec.topology_spread_constraints.iter().flatten() {
            if c.when_unsatisfiable != "DoNotSchedule" {
                continue;
            }
            r.rule("topology-spread");
            let id = format!(
                "{ns}|{}|{}|{}|{}",
                serde_json::to_string(c).unwrap_or_default(),
                serde_json::to_string(&spec.affinity).unwrap_or_default(),
                serde_json::to_string(&spec.node_selector).unwrap_or_default(),
                serde_json::to_string(&spec.tolerations).unwrap_or_default(),
            );
            if !seen.insert(id) {
                continue;
            }
            if let Some(msg) = spread_violation(p, bound, pod, ns, c) {
                let node_name = node.metadata.name.as_deref().unwrap_or_default();
                r.violate(format!("pod {} on {node_name}: {msg}", key(pod)));
            }
        }
    }
}

/// The skew of one constraint over the final placement, when above maxSkew.
fn spread_violation(
    p: &Placement,
    bound: &[(&Pod, &Node)],
    pod: &Pod,
    ns: &str,
    c: &TopologySpreadConstraint,
) -> Option<String> {
    let pod_labels = labels_of(&pod.metadata);
    let mut selector = c.label_selector.clone().unwrap_or_default();
    for k in c.match_label_keys.iter().flatten() {
        if let Some(v) = pod_labels.get(k) {
            selector
                .match_labels
                .get_or_insert_with(Default::default)
                .insert(k.clone(), v.clone());
        }
    }
    let honor_affinity = c.node_affinity_policy.as_deref() != Some("Ignore");
    let honor_taints = c.node_taints_policy.as_deref() == Some("Honor");
    let admitted = |n: &Node| {
        labels_of(&n.metadata).contains_key(&c.topology_key)
            && (!honor_affinity || node_affinity_matches(pod, n))
            && (!honor_taints || untolerated(pod, n).is_empty())
    };
    let mut counts: BTreeMap<String, i64> = BTreeMap::new();
    for n in p.nodes.iter().filter(|n| admitted(n)) {
        if let Some(v) = labels_of(&n.metadata).get(&c.topology_key) {
            counts.entry(v.clone()).or_insert(0);
        }
    }
    for (q, n) in bound {
        if q.metadata.namespace.as_deref() == Some(ns)
            && selector_matches(Some(&selector), &labels_of(&q.metadata))
            && admitted(n)
            && let Some(v) = labels_of(&n.metadata).get(&c.topology_key)
        {
            *counts.entry(v.clone()).or_insert(0) += 1;
        }
    }
    let (min, max) = (counts.values().min()?, counts.values().max()?);
    let skew = max - min;
    (skew > i64::from(c.max_skew)).then(|| {
        let (lo, hi) = (
            counts.iter().find(|(_, v)| *v == min),
            counts.iter().find(|(_, v)| *v == max),
        );
        format!(
            "topology spread over {} has skew {skew} > maxSkew {} ({} domains; {:?} holds {max}, {:?} holds {min})",
            c.topology_key,
            c.max_skew,
            counts.len(),
            hi.map(|(k, _)| k),
            lo.map(|(k, _)| k),
        )
    })
}

fn check_pod_affinity(p: &Placement, bound: &[(&Pod, &Node)], r: &mut CheckReport) {
    // The pods by namespace, with their node's labels.
    let mut by_ns: HashMap<&str, Vec<(&Pod, Labels)>> = HashMap::new();
    for (q, n) in bound {
        by_ns
            .entry(q.metadata.namespace.as_deref().unwrap_or_default())
            .or_default()
            .push((q, labels_of(&n.metadata)));
    }
    for (pod, node) in bound {
        let Some(affinity) = pod.spec.as_ref().and_then(|s| s.affinity.as_ref()) else {
            continue;
        };
        let own_ns = pod.metadata.namespace.as_deref().unwrap_or_default();
        let node_labels = labels_of(&node.metadata);
        let node_name = node.metadata.name.as_deref().unwrap_or_default();
        let required = |terms: Option<&Vec<PodAffinityTerm>>| terms.cloned().unwrap_or_default();
        let affinity_terms = required(
            affinity
                .pod_affinity
                .as_ref()
                .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref()),
        );
        let anti_terms = required(
            affinity
                .pod_anti_affinity
                .as_ref()
                .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref()),
        );
        // Other pods matching a term: (count in the pod's domain, count anywhere).
        let matching = |t: &PodAffinityTerm| {
            let domain = node_labels.get(&t.topology_key);
            let (mut here, mut anywhere) = (0usize, 0usize);
            for ns in term_namespaces(t, own_ns, p) {
                for (q, q_node) in by_ns.get(ns.as_str()).into_iter().flatten() {
                    if std::ptr::eq(*q, *pod) || !selector_matches(t.label_selector.as_ref(), &labels_of(&q.metadata)) {
                        continue;
                    }
                    anywhere += 1;
                    if domain.is_some() && q_node.get(&t.topology_key) == domain {
                        here += 1;
                    }
                }
            }
            (here, anywhere)
        };
        for t in &affinity_terms {
            r.rule("pod-affinity");
            let (here, anywhere) = matching(t);
            if here == 0 && anywhere > 0 {
                r.violate(format!(
                    "pod {} on {node_name}: no pod matching its affinity term shares its {} ({:?}), \
                     though {anywhere} match elsewhere",
                    key(pod),
                    t.topology_key,
                    node_labels.get(&t.topology_key)
                ));
            }
        }
        for t in &anti_terms {
            r.rule("pod-anti-affinity");
            let (here, _) = matching(t);
            if here > 0 {
                r.violate(format!(
                    "pod {} on {node_name}: {here} other pod(s) matching its anti-affinity term share its {} ({:?})",
                    key(pod),
                    t.topology_key,
                    node_labels.get(&t.topology_key)
                ));
            }
        }
    }
}

fn check_resources(p: &Placement, bound: &[(&Pod, &Node)], r: &mut CheckReport) {
    r.rule("resources");
    let mut used: HashMap<&str, (i128, i128, i128)> = HashMap::new();
    for (pod, node) in bound {
        let e = used
            .entry(node.metadata.name.as_deref().unwrap_or_default())
            .or_default();
        e.0 += requests(pod, "cpu");
        e.1 += requests(pod, "memory");
        e.2 += 1000;
    }
    for n in &p.nodes {
        let name = n.metadata.name.as_deref().unwrap_or_default();
        let Some(&(cpu, mem, pods)) = used.get(name) else {
            continue;
        };
        let alloc = |res: &str| {
            n.status
                .as_ref()
                .and_then(|s| s.allocatable.as_ref().or(s.capacity.as_ref()))
                .and_then(|a| a.get(res))
                .and_then(|q| milli(&q.0))
        };
        for (res, want) in [("cpu", cpu), ("memory", mem), ("pods", pods)] {
            if let Some(have) = alloc(res)
                && want > have
            {
                r.violate(format!(
                    "node {name}: the pods on it request {} of {res}, more than its allocatable {} \
                     (victims of preemption still there?)",
                    want as f64 / 1000.0,
                    have as f64 / 1000.0
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::workloads::{PodContext, PodKind, Workload, bench_node, bench_pod};

    fn ctx() -> PodContext {
        PodContext {
            scheduler: "s".into(),
            measured_namespace: "m".into(),
            init_namespace: "i".into(),
            priority_class: "high".into(),
        }
    }

    fn nodes(w: Workload, n: usize) -> Vec<Node> {
        (0..n)
            .map(|i| serde_json::from_value(bench_node("n", i, n, w)).unwrap())
            .collect()
    }

    /// A pod of `kind` in `ns`, bound to node `n-{node}`.
    fn pod(ns: &str, i: usize, kind: PodKind, node: usize) -> Pod {
        let mut p: Pod = serde_json::from_value(bench_pod(&i.to_string(), kind, &ctx())).unwrap();
        p.metadata.namespace = Some(ns.into());
        p.spec.as_mut().unwrap().node_name = Some(format!("n-{node}"));
        p
    }

    fn placement(w: Workload, n: usize, pods: Vec<Pod>) -> Placement {
        let team: Labels = [("team".to_string(), "devops".to_string())].into();
        Placement {
            nodes: nodes(w, n),
            pods,
            namespace_labels: [("m".to_string(), team.clone()), ("i".to_string(), team)].into(),
            measured_namespace: "m".into(),
        }
    }

    fn violations(p: &Placement, measured: usize) -> Vec<String> {
        let r = check(p, measured);
        assert_eq!(r.passed, r.violations.is_empty());
        r.violations
    }

    #[test]
    fn quantities() {
        assert_eq!(milli("100m"), Some(100));
        assert_eq!(milli("4"), Some(4000));
        assert_eq!(milli("500Mi"), Some(500 * 1024 * 1024 * 1000));
        assert_eq!(milli("1k"), Some(1_000_000));
        assert_eq!(milli("x"), None);
    }

    #[test]
    fn unbound_and_foreign_nodes_fail() {
        let mut p = placement(Workload::Basic, 3, vec![pod("m", 0, PodKind::Default, 0)]);
        assert!(violations(&p, 1).is_empty());
        assert!(violations(&p, 2)[0].contains("1 of 2 measured pods are bound"));
        p.pods.push(pod("m", 1, PodKind::Default, 9));
        assert!(violations(&p, 1)[0].contains("is bound to n-9"));
        p.pods[1].spec.as_mut().unwrap().node_name = None;
        assert!(violations(&p, 1)[0].contains("pod m/pod-1 is not bound"));
    }

    #[test]
    fn node_affinity_needs_the_label() {
        let ok = placement(Workload::NodeAffinity, 2, vec![pod("m", 0, PodKind::NodeAffinity, 1)]);
        assert_eq!(check(&ok, 1).rules, vec!["bound", "node-affinity", "resources"]);
        assert!(violations(&ok, 1).is_empty());
        // Plain nodes have no zone.
        let bad = placement(Workload::Basic, 2, vec![pod("m", 0, PodKind::NodeAffinity, 1)]);
        assert!(
            violations(&bad, 1)[0].contains("does not match its node affinity"),
            "{:?}",
            violations(&bad, 1)
        );
    }

    #[test]
    fn taints_must_be_tolerated() {
        let ok = placement(Workload::Taints, 2, vec![pod("m", 0, PodKind::Tolerating, 1)]);
        assert!(violations(&ok, 1).is_empty());
        let bad = placement(Workload::Taints, 2, vec![pod("m", 0, PodKind::Default, 1)]);
        let v = violations(&bad, 1);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(
            v[0].contains("bench.skiff.dev/dedicated=bench:NoSchedule is not tolerated"),
            "{v:?}"
        );
    }

    #[test]
    fn topology_spread_skew_is_bounded() {
        // Three zones (n-0 moon-1, n-1 moon-2, n-2 moon-3); maxSkew 5.
        let on = |zone_node: &[usize]| {
            let pods = zone_node
                .iter()
                .enumerate()
                .map(|(i, n)| pod("m", i, PodKind::TopologySpread, *n))
                .collect();
            placement(Workload::TopologySpread, 3, pods)
        };
        let even: Vec<usize> = (0..18).map(|i| i % 3).collect();
        assert!(violations(&on(&even), 18).is_empty());
        // Six in moon-1, none elsewhere: skew 6.
        let v = violations(&on(&[0; 6]), 6);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].contains("skew 6 > maxSkew 5"), "{v:?}");
        // Preferred spreading is not checked.
        let pods = (0..6)
            .map(|i| pod("m", i, PodKind::PreferredTopologySpread, 0))
            .collect();
        assert!(violations(&placement(Workload::PreferredTopologySpread, 3, pods), 6).is_empty());
    }

    #[test]
    fn node_inclusion_policy_leaves_tainted_nodes_out() {
        // Five nodes, n-4 tainted: maxSkew 1 by hostname over n-0..n-3.
        let pods: Vec<Pod> = (0..4).map(|i| pod("m", i, PodKind::NodeInclusionPolicy, i)).collect();
        assert!(violations(&placement(Workload::NodeInclusionPolicy, 5, pods.clone()), 4).is_empty());
        // Two on n-0, none on n-3: skew 2.
        let mut crowded = pods;
        crowded[3].spec.as_mut().unwrap().node_name = Some("n-0".into());
        let v = violations(&placement(Workload::NodeInclusionPolicy, 5, crowded), 4);
        assert!(v.iter().any(|m| m.contains("skew 2 > maxSkew 1")), "{v:?}");
    }

    #[test]
    fn pod_affinity_needs_a_matching_pod_in_the_domain() {
        // Plain nodes have no zone: with two blue pods, neither has a partner in its zone.
        let pods = vec![
            pod("i", 0, PodKind::PodAffinity, 0),
            pod("m", 1, PodKind::PodAffinity, 1),
        ];
        let v = violations(&placement(Workload::Basic, 2, pods.clone()), 1);
        assert_eq!(v.len(), 2, "{v:?}");
        assert!(v[0].contains("no pod matching its affinity term shares its topology.kubernetes.io/zone"));
        // All in zone1: satisfied.
        assert!(violations(&placement(Workload::PodAffinity, 2, pods), 1).is_empty());
        // A lone pod may go anywhere.
        let lone = vec![pod("m", 1, PodKind::PodAffinity, 1)];
        assert!(violations(&placement(Workload::Basic, 2, lone), 1).is_empty());
        // Namespace selector: a partner counts only in a selected namespace.
        let ns = vec![
            pod("i", 0, PodKind::AffinityNsSelector, 0),
            pod("m", 1, PodKind::AffinityNsSelector, 1),
        ];
        assert!(violations(&placement(Workload::PodAffinityNsSelector, 2, ns.clone()), 1).is_empty());
        let mut p = placement(Workload::Basic, 2, ns);
        assert_eq!(violations(&p, 1).len(), 2);
        // Namespace i unselected: the measured pod's term sees no other pod (a lone pod may go
        // anywhere); the initial pod's term still sees the measured pod elsewhere.
        p.namespace_labels.insert("i".into(), Labels::new());
        let v = violations(&p, 1);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].contains("pod i/pod-0"), "{v:?}");
    }

    #[test]
    fn anti_affinity_keeps_matching_pods_apart() {
        let apart = vec![
            pod("i", 0, PodKind::PodAntiAffinity, 0),
            pod("m", 1, PodKind::PodAntiAffinity, 1),
        ];
        assert!(violations(&placement(Workload::Basic, 2, apart), 1).is_empty());
        // Initial and measured pods repel each other (the term names both namespaces).
        let together = vec![
            pod("i", 0, PodKind::PodAntiAffinity, 1),
            pod("m", 1, PodKind::PodAntiAffinity, 1),
        ];
        let v = violations(&placement(Workload::Basic, 2, together), 1);
        assert_eq!(v.len(), 2, "{v:?}");
        assert!(v[0].contains("other pod(s) matching its anti-affinity term share its kubernetes.io/hostname"));
        // The namespace-selector twin.
        let together = vec![
            pod("i", 0, PodKind::AntiAffinityNsSelector, 1),
            pod("m", 1, PodKind::AntiAffinityNsSelector, 1),
        ];
        assert_eq!(violations(&placement(Workload::Basic, 2, together), 1).len(), 2);
        // Preferred anti-affinity is not checked.
        let soft = vec![
            pod("i", 0, PodKind::PreferredPodAntiAffinity, 1),
            pod("m", 1, PodKind::PreferredPodAntiAffinity, 1),
        ];
        assert!(violations(&placement(Workload::Basic, 2, soft), 1).is_empty());
    }

    #[test]
    fn preemption_victims_must_be_gone() {
        // A high-priority pod (3 CPUs) with one low-priority pod left (0.9): 3.9 of 4.
        let mut pods = vec![
            pod("m", 0, PodKind::HighPriority, 0),
            pod("i", 1, PodKind::LowPriority, 0),
        ];
        assert!(violations(&placement(Workload::Preemption, 1, pods.clone()), 1).is_empty());
        // A victim still there: 4.8 CPUs on a node of 4.
        pods.push(pod("i", 2, PodKind::LowPriority, 0));
        let v = violations(&placement(Workload::Preemption, 1, pods), 1);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(
            v[0].contains("request 4.8 of cpu, more than its allocatable 4"),
            "{v:?}"
        );
    }
}
