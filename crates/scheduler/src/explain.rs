//! Explain: every node's verdict in a pod's last scheduling attempt, stored as compact JSON
//! in the pod annotation `scheduler.skiff.dev/explain` and rendered for `skiff explain pod`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};

use crate::cache::Cache;
use crate::framework::{Scores, Status};

/// The pod annotation holding the last attempt's explanation.
pub const EXPLAIN_ANNOTATION: &str = "scheduler.skiff.dev/explain";
/// At most this many node names are listed per rejection reason.
const MAX_NODES_PER_REASON: usize = 50;
/// At most this many scored nodes are kept (the annotation rides on every bound pod).
const MAX_SCORED_NODES: usize = 5;

/// Nodes rejected by one plugin for one reason.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rejection {
    pub plugin: String,
    pub reason: String,
    pub count: usize,
    /// The first nodes with this verdict (at most 50).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<String>,
}

/// A feasible node's final and per-plugin scores (normalized, before weights).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Scored {
    pub node: String,
    pub total: i64,
    /// Each scoring plugin's score, in the order of [`Explain::score_plugins`]. The names are
    /// written once per explanation: the annotation rides on every bound pod, through its
    /// binding, the store and every watch of pods.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub by_plugin: Vec<i64>,
    /// Per plugin by name, as explanations written before `byPlugin` carry them (read only).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub plugins: BTreeMap<String, i64>,
}

impl Scored {
    /// The score `plugin` gave, from either form.
    pub fn plugin_score(&self, score_plugins: &[String], plugin: &str) -> Option<i64> {
        match score_plugins.iter().position(|p| p == plugin) {
            Some(i) => self.by_plugin.get(i).copied(),
            None => self.plugins.get(plugin).copied(),
        }
    }
}

/// The outcome of one scheduling attempt.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Explain {
    pub time: String,
    /// "Scheduled" or "Unschedulable".
    pub result: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Nodes in the cluster.
    pub nodes: usize,
    /// Nodes the filters ran on (upstream's percentageOfNodesToScore may stop early).
    pub evaluated: usize,
    pub feasible: usize,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rejected: Vec<Rejection>,
    /// The plugins that scored, in the order of each scored node's `byPlugin`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub score_plugins: Vec<String>,
    /// The best scored nodes, best first (at most 5).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scores: Vec<Scored>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preemption: Option<String>,
}

/// Groups per-node statuses by (plugin, reason).
pub fn group_rejections<'a>(cache: &Cache, statuses: impl Iterator<Item = &'a (usize, Status)>) -> Vec<Rejection> {
    let mut groups: BTreeMap<(String, String), Rejection> = BTreeMap::new();
    for (idx, st) in statuses {
        let reason = st.message();
        let g = groups
            .entry((st.plugin.to_string(), reason.clone()))
            .or_insert_with(|| Rejection {
                plugin: st.plugin.to_string(),
                reason,
                count: 0,
                nodes: Vec::new(),
            });
        g.count += 1;
        if g.nodes.len() < MAX_NODES_PER_REASON {
            g.nodes.push(cache.node_name(*idx).to_string());
        }
    }
    let mut out: Vec<Rejection> = groups.into_values().collect();
    out.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.plugin.cmp(&b.plugin)));
    out
}

/// Adds the nodes a PreFilter result excluded as one group.
pub fn add_excluded(rejected: &mut Vec<Rejection>, excluded: Option<&(Status, usize)>) {
    if let Some((st, n)) = excluded
        && *n > 0
    {
        rejected.push(Rejection {
            plugin: st.plugin.to_string(),
            reason: st.message(),
            count: *n,
            nodes: Vec::new(),
        });
        rejected.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.plugin.cmp(&b.plugin)));
    }
}

/// The scoring plugins' names and the best scored nodes (scores must be sorted best first).
pub fn top_scores(cache: &Cache, scores: &Scores) -> (Vec<String>, Vec<Scored>) {
    let names = scores.per_plugin.iter().map(|(p, _)| p.to_string()).collect();
    let top = scores
        .nodes
        .iter()
        .take(MAX_SCORED_NODES)
        .map(|s| Scored {
            node: cache.node_name(s.node).to_string(),
            total: s.total,
            by_plugin: scores.per_plugin.iter().map(|(_, v)| v[s.pos]).collect(),
            plugins: BTreeMap::new(),
        })
        .collect();
    (names, top)
}

impl Explain {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads the explanation a scheduler stored on the pod.
    pub fn from_pod(pod: &Pod) -> Option<Explain> {
        let raw = pod.metadata.annotations.as_ref()?.get(EXPLAIN_ANNOTATION)?;
        serde_json::from_str(raw).ok()
    }
}

/// Renders an explanation for people (used by `skiff explain pod NAME`).
pub fn render_explain(pod_key: &str, e: &Explain) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(out, "Pod:        {pod_key}");
    let _ = writeln!(out, "Attempt:    {}", e.time);
    let _ = writeln!(out, "Result:     {}", e.result);
    if let Some(n) = &e.node {
        let _ = writeln!(out, "Node:       {n}");
    }
    if let Some(m) = &e.message {
        let _ = writeln!(out, "Message:    {m}");
    }
    let _ = writeln!(
        out,
        "Nodes:      {} in cluster, {} evaluated, {} feasible",
        e.nodes, e.evaluated, e.feasible
    );
    if let Some(p) = &e.preemption {
        let _ = writeln!(out, "Preemption: {p}");
    }
    if !e.rejected.is_empty() {
        let _ = writeln!(out, "\nRejected:");
        let w_plugin = e
            .rejected
            .iter()
            .map(|r| r.plugin.len())
            .max()
            .unwrap_or(0)
            .max("PLUGIN".len());
        let _ = writeln!(out, "  {:<w_plugin$}  {:>5}  REASON / NODES", "PLUGIN", "COUNT");
        for r in &e.rejected {
            let _ = writeln!(out, "  {:<w_plugin$}  {:>5}  {}", r.plugin, r.count, r.reason);
            if !r.nodes.is_empty() {
                let more = r.count.saturating_sub(r.nodes.len());
                let mut list = r.nodes.join(", ");
                if more > 0 {
                    let _ = write!(list, " (+{more} more)");
                }
                let _ = writeln!(out, "  {:<w_plugin$}  {:>5}    {}", "", "", list);
            }
        }
    }
    if !e.scores.is_empty() {
        let plugins: Vec<&String> = {
            let mut v: Vec<&String> = e
                .score_plugins
                .iter()
                .chain(e.scores.iter().flat_map(|s| s.plugins.keys()))
                .collect();
            v.sort();
            v.dedup();
            v
        };
        let w_node = e
            .scores
            .iter()
            .map(|s| s.node.len())
            .max()
            .unwrap_or(0)
            .max("NODE".len());
        let _ = writeln!(out, "\nScores (best first; plugin scores 0-100 before weights):");
        let mut header = format!("  {:<w_node$}  {:>6}", "NODE", "TOTAL");
        for p in &plugins {
            let _ = write!(header, "  {p}");
        }
        let _ = writeln!(out, "{header}");
        for s in &e.scores {
            let mut line = format!("  {:<w_node$}  {:>6}", s.node, s.total);
            for p in &plugins {
                let v = s
                    .plugin_score(&e.score_plugins, p)
                    .map(|v| v.to_string())
                    .unwrap_or_else(|| "-".into());
                let _ = write!(line, "  {:>width$}", v, width = p.len());
            }
            let _ = writeln!(out, "{line}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::Status;
    use crate::types::testutil::node;
    use std::sync::Arc;

    #[test]
    fn groups_and_renders() {
        let mut c = Cache::new();
        for n in ["a", "b", "c"] {
            c.upsert_node(Arc::new(node(n, "1", "1Gi", "10")));
        }
        let mut st = Status::unresolvable("node(s) didn't match Pod's node affinity/selector");
        st.plugin = "NodeAffinity";
        let mut cpu = Status::unschedulable("Insufficient cpu");
        cpu.plugin = "NodeResourcesFit";
        let statuses = [(0, st.clone()), (1, cpu), (2, st)];
        let rejected = group_rejections(&c, statuses.iter());
        assert_eq!(rejected.len(), 2);
        assert_eq!(rejected[0].plugin, "NodeAffinity");
        assert_eq!(rejected[0].count, 2);
        assert_eq!(rejected[0].nodes, vec!["a", "c"]);
        let e = Explain {
            time: "2026-01-01T00:00:00Z".into(),
            result: "Unschedulable".into(),
            message: Some("0/3 nodes are available".into()),
            nodes: 3,
            evaluated: 3,
            feasible: 0,
            rejected,
            ..Default::default()
        };
        let json = e.to_json();
        let mut pod = Pod::default();
        pod.metadata.annotations = Some([(EXPLAIN_ANNOTATION.to_string(), json)].into());
        let back = Explain::from_pod(&pod).unwrap();
        assert_eq!(back, e);
        let text = render_explain("default/x", &back);
        assert!(text.contains("NodeAffinity"));
        assert!(text.contains("a, c"));
        assert!(text.contains("Insufficient cpu"));
    }

    #[test]
    fn scores_name_each_plugin_once_and_old_annotations_still_render() {
        let e = Explain {
            result: "Scheduled".into(),
            node: Some("a".into()),
            score_plugins: vec!["NodeResourcesFit".into(), "TaintToleration".into()],
            scores: vec![
                Scored {
                    node: "a".into(),
                    total: 190,
                    by_plugin: vec![90, 100],
                    ..Default::default()
                },
                Scored {
                    node: "b".into(),
                    total: 170,
                    by_plugin: vec![70, 100],
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let json = e.to_json();
        assert_eq!(json.matches("NodeResourcesFit").count(), 1, "{json}");
        let back: Explain = serde_json::from_str(&json).unwrap();
        assert_eq!(back, e);
        let text = render_explain("default/x", &back);
        let row = text.lines().find(|l| l.trim_start().starts_with("b ")).unwrap();
        assert_eq!(row.split_whitespace().collect::<Vec<_>>(), ["b", "170", "70", "100"]);
        // An explanation written with a map of plugin names per node.
        let old = r#"{"time":"t","result":"Scheduled","node":"a","nodes":2,"evaluated":2,"feasible":2,
            "scores":[{"node":"a","total":190,"plugins":{"NodeResourcesFit":90,"TaintToleration":100}}]}"#;
        let old: Explain = serde_json::from_str(old).unwrap();
        let text = render_explain("default/x", &old);
        let row = text.lines().find(|l| l.trim_start().starts_with("a ")).unwrap();
        assert_eq!(row.split_whitespace().collect::<Vec<_>>(), ["a", "190", "90", "100"]);
    }
}
