//! The resource metrics API (`metrics.k8s.io/v1beta1`), served as metrics-server serves it, so
//! `kubectl top` (and the HorizontalPodAutoscaler) work with no extra component: a PodMetrics
//! per running pod and a NodeMetrics per node, made from the node agents' Summary API
//! (`/stats/summary`: each container's CPU rate and working set, sampled every 10 s). Read at the
//! request from the nodes concerned; a node that does not answer is left out, and so is a pod
//! whose containers do not all have a CPU rate yet (metrics-server drops both the same way).
//! Only `get` and `list` are served; nothing is stored.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use axum::response::Response;
use futures::StreamExt;
use http::{Method, StatusCode};
use serde_json::{Value, json};
use skiff_api::StatusError;
use skiff_api::registry::Resource;
use skiff_api::selector::{FieldSelector, LabelSelector};
use skiff_store::ListOptions;

use crate::body::{self, Output};
use crate::handlers::Ctx;
use crate::objects;

pub const GROUP: &str = "metrics.k8s.io";

/// The node agents' sampling interval, the window every rate is measured over.
const WINDOW: &str = "10s";

/// How long a node gets to answer.
const NODE_TIMEOUT: Duration = Duration::from_secs(5);

/// Nodes asked at once.
const PARALLEL: usize = 16;

pub async fn handle(ctx: &Ctx) -> Result<Response, StatusError> {
    let res = ctx.rr.resource;
    let watching = ctx.rr.watch;
    if ctx.method != Method::GET || watching || !ctx.rr.subresource.is_empty() {
        return Err(StatusError::method_not_allowed(
            "the server does not allow this method on the requested resource",
        ));
    }
    let labels = match ctx.param("labelSelector").filter(|s| !s.trim().is_empty()) {
        Some(s) => LabelSelector::parse(s).map_err(|e| StatusError::bad_request(e.to_string()))?,
        None => LabelSelector::everything(),
    };
    let fields = match ctx.param("fieldSelector").filter(|s| !s.trim().is_empty()) {
        Some(s) => FieldSelector::parse(res, s).map_err(|e| StatusError::bad_request(e.to_string()))?,
        None => FieldSelector::everything(res),
    };
    let name = (!ctx.rr.name.is_empty()).then_some(ctx.rr.name.as_str());
    let items = match res.plural {
        "pods" => pod_metrics(ctx, name, &labels).await?,
        "nodes" => node_metrics(ctx, name, &labels).await?,
        _ => return Err(StatusError::not_found(res.group, res.plural, &ctx.rr.name)),
    };
    let items: Vec<Value> = items.into_iter().filter(|m| fields.matches(m)).collect();
    if let Some(name) = name {
        let obj = items
            .into_iter()
            .next()
            .ok_or_else(|| StatusError::not_found(res.group, res.plural, name))?;
        return Ok(crate::handlers::render_one(ctx, StatusCode::OK, &obj));
    }
    Ok(render_list(ctx, res, &items))
}

pub(crate) fn render_list(ctx: &Ctx, res: &Resource, items: &[Value]) -> Response {
    match ctx.output() {
        Output::Table => {
            let refs: Vec<&Value> = items.iter().collect();
            let t = skiff_api::printers::table(res, &refs, jiff::Timestamp::now(), true, "", None);
            body::value_response(StatusCode::OK, &t)
        }
        Output::PartialMetadata => body::value_response(
            StatusCode::OK,
            &json!({
                "kind": "PartialObjectMetadataList",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": {},
                "items": items.iter().map(body::partial_metadata).collect::<Vec<_>>(),
            }),
        ),
        Output::Object => body::value_response(
            StatusCode::OK,
            &json!({
                "kind": res.list_kind(),
                "apiVersion": res.api_version(),
                "metadata": {},
                "items": items,
            }),
        ),
    }
}

/// The stored objects of `plural` (core v1) in `namespace` (all when empty) whose labels match.
async fn stored(ctx: &Ctx, plural: &str, namespace: &str, labels: &LabelSelector) -> Result<Vec<Value>, StatusError> {
    let res = skiff_api::registry::lookup("", "v1", plural).ok_or_else(|| StatusError::internal("no core resource"))?;
    let listed = ctx
        .state
        .store
        .list(&objects::prefix(res, namespace), ListOptions::default())
        .await
        .map_err(|e| ctx.store_err(e))?;
    Ok(listed
        .items
        .iter()
        .filter_map(objects::decode_kv)
        .filter(|o| labels.matches_object(o))
        .collect())
}

/// Each node's Summary, asked concurrently; nodes that fail are logged and left out.
async fn summaries(ctx: &Ctx, nodes: impl IntoIterator<Item = String>) -> HashMap<String, Value> {
    futures::stream::iter(nodes)
        .map(|node| async move {
            let got = crate::proxy::node_get_json(ctx, &node, "/stats/summary", NODE_TIMEOUT).await;
            (node, got)
        })
        .buffer_unordered(PARALLEL)
        .filter_map(|(node, got)| async move {
            match got {
                Ok(summary) => Some((node, summary)),
                Err(e) => {
                    tracing::debug!(node, error = %e.message, "no resource usage from node");
                    None
                }
            }
        })
        .collect()
        .await
}

async fn pod_metrics(ctx: &Ctx, name: Option<&str>, labels: &LabelSelector) -> Result<Vec<Value>, StatusError> {
    let mut pods = stored(ctx, "pods", &ctx.rr.namespace, labels).await?;
    if let Some(name) = name {
        pods.retain(|p| p.pointer("/metadata/name").and_then(Value::as_str) == Some(name));
    }
    pods.retain(|p| p.pointer("/status/phase").and_then(Value::as_str) == Some("Running"));
    let nodes: std::collections::BTreeSet<String> = pods
        .iter()
        .filter_map(|p| p.pointer("/spec/nodeName").and_then(Value::as_str))
        .map(str::to_string)
        .collect();
    let summaries = summaries(ctx, nodes).await;
    // The Summaries' pods by uid.
    let mut usage: HashMap<&str, &Value> = HashMap::new();
    for summary in summaries.values() {
        for pod in summary.get("pods").and_then(Value::as_array).into_iter().flatten() {
            if let Some(uid) = pod.pointer("/podRef/uid").and_then(Value::as_str) {
                usage.insert(uid, pod);
            }
        }
    }
    let mut out = Vec::new();
    for pod in &pods {
        let uid = pod.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or_default();
        if let Some(m) = usage.get(uid).and_then(|u| pod_metrics_object(pod, u)) {
            out.push(m);
        }
    }
    out.sort_by_key(key);
    Ok(out)
}

fn key(o: &Value) -> (String, String) {
    let s = |p: &str| o.pointer(p).and_then(Value::as_str).unwrap_or_default().to_string();
    (s("/metadata/namespace"), s("/metadata/name"))
}

/// A PodMetrics from a pod and its Summary entry; `None` unless every container has a CPU rate.
pub fn pod_metrics_object(pod: &Value, summary: &Value) -> Option<Value> {
    let mut containers = Vec::new();
    let mut latest: Option<&str> = None;
    for c in summary.get("containers").and_then(Value::as_array)? {
        let cpu = c.pointer("/cpu/usageNanoCores").and_then(Value::as_u64)?;
        let memory = c
            .pointer("/memory/workingSetBytes")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        if let Some(t) = c.pointer("/cpu/time").and_then(Value::as_str) {
            latest = Some(latest.map_or(t, |l| l.max(t)));
        }
        containers.push(json!({
            "name": c.get("name").cloned().unwrap_or(Value::Null),
            "usage": { "cpu": cpu_quantity(cpu), "memory": memory_quantity(memory) },
        }));
    }
    if containers.is_empty() {
        return None;
    }
    let md = pod.get("metadata")?;
    let mut metadata = json!({
        "name": md.get("name")?,
        "namespace": md.get("namespace")?,
        "creationTimestamp": objects::now_rfc3339(),
    });
    if let Some(labels) = md.get("labels") {
        metadata["labels"] = labels.clone();
    }
    Some(json!({
        "kind": "PodMetrics",
        "apiVersion": "metrics.k8s.io/v1beta1",
        "metadata": metadata,
        "timestamp": latest.map_or_else(objects::now_rfc3339, rfc3339_seconds),
        "window": WINDOW,
        "containers": containers,
    }))
}

async fn node_metrics(ctx: &Ctx, name: Option<&str>, labels: &LabelSelector) -> Result<Vec<Value>, StatusError> {
    let mut nodes = stored(ctx, "nodes", "", labels).await?;
    if let Some(name) = name {
        nodes.retain(|n| n.pointer("/metadata/name").and_then(Value::as_str) == Some(name));
    }
    let by_name: BTreeMap<String, &Value> = nodes
        .iter()
        .filter_map(|n| Some((n.pointer("/metadata/name")?.as_str()?.to_string(), n)))
        .collect();
    let summaries = summaries(ctx, by_name.keys().cloned()).await;
    Ok(by_name
        .iter()
        .filter_map(|(name, node)| node_metrics_object(node, summaries.get(name)?))
        .collect())
}

/// A NodeMetrics from a Node and its Summary; `None` without a CPU rate.
pub fn node_metrics_object(node: &Value, summary: &Value) -> Option<Value> {
    let cpu = summary.pointer("/node/cpu/usageNanoCores").and_then(Value::as_u64)?;
    let memory = summary
        .pointer("/node/memory/workingSetBytes")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let time = summary.pointer("/node/cpu/time").and_then(Value::as_str);
    let md = node.get("metadata")?;
    let mut metadata = json!({ "name": md.get("name")?, "creationTimestamp": objects::now_rfc3339() });
    if let Some(labels) = md.get("labels") {
        metadata["labels"] = labels.clone();
    }
    Some(json!({
        "kind": "NodeMetrics",
        "apiVersion": "metrics.k8s.io/v1beta1",
        "metadata": metadata,
        "timestamp": time.map_or_else(objects::now_rfc3339, rfc3339_seconds),
        "window": WINDOW,
        "usage": { "cpu": cpu_quantity(cpu), "memory": memory_quantity(memory) },
    }))
}

/// A time as metav1.Time writes it: RFC 3339 in UTC, whole seconds.
fn rfc3339_seconds(t: &str) -> String {
    t.parse::<jiff::Timestamp>()
        .map(|ts| ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_else(|_| objects::now_rfc3339())
}

/// Nanocores as a canonical decimal quantity (`250m`, `1`, `1500u`, `12n`), as metrics-server's
/// `NewScaledQuantity(n, -9)` serializes.
pub fn cpu_quantity(nano: u64) -> String {
    if nano == 0 {
        return "0".into();
    }
    for (div, suffix) in [(1_000_000_000, ""), (1_000_000, "m"), (1_000, "u")] {
        if nano.is_multiple_of(div) {
            return format!("{}{suffix}", nano / div);
        }
    }
    format!("{nano}n")
}

/// Bytes as a canonical binary quantity (`12Ki`, `3Mi`, or plain bytes when not a multiple of
/// 1024), as `NewQuantity(n, BinarySI)` serializes.
pub fn memory_quantity(bytes: u64) -> String {
    if bytes == 0 {
        return "0".into();
    }
    let mut n = bytes;
    let mut suffix = "";
    for next in ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"] {
        if !n.is_multiple_of(1024) {
            break;
        }
        n /= 1024;
        suffix = next;
    }
    format!("{n}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_are_canonical() {
        assert_eq!(cpu_quantity(0), "0");
        assert_eq!(cpu_quantity(250_000_000), "250m");
        assert_eq!(cpu_quantity(2_000_000_000), "2");
        assert_eq!(cpu_quantity(1_500_000), "1500u");
        assert_eq!(cpu_quantity(123_456), "123456n");
        assert_eq!(memory_quantity(0), "0");
        assert_eq!(memory_quantity(5 * 1024 * 1024), "5Mi");
        assert_eq!(memory_quantity(1536), "1536");
        assert_eq!(memory_quantity(3 * 1024), "3Ki");
        assert_eq!(memory_quantity(1000), "1000");
    }

    #[test]
    fn a_pod_needs_a_cpu_rate_for_every_container() {
        let pod = json!({"metadata": {"name": "p", "namespace": "ns", "uid": "u", "labels": {"app": "x"}}});
        let complete = json!({"containers": [
            {"name": "a", "cpu": {"time": "2026-01-02T03:04:05.678Z", "usageNanoCores": 250_000_000},
             "memory": {"workingSetBytes": 4 * 1024 * 1024}},
        ]});
        let m = pod_metrics_object(&pod, &complete).unwrap();
        assert_eq!(m["kind"], "PodMetrics");
        assert_eq!(m["metadata"]["labels"]["app"], "x");
        assert_eq!(m["timestamp"], "2026-01-02T03:04:05Z");
        assert_eq!(m["window"], "10s");
        assert_eq!(m["containers"][0]["usage"], json!({"cpu": "250m", "memory": "4Mi"}));
        let partial = json!({"containers": [
            {"name": "a", "cpu": {"usageNanoCores": 1}, "memory": {"workingSetBytes": 1}},
            {"name": "b", "cpu": {"usageCoreNanoSeconds": 5}, "memory": {"workingSetBytes": 1}},
        ]});
        assert!(pod_metrics_object(&pod, &partial).is_none());
        assert!(pod_metrics_object(&pod, &json!({"containers": []})).is_none());
    }

    #[test]
    fn a_node_needs_a_cpu_rate() {
        let node = json!({"metadata": {"name": "n1"}});
        let summary = json!({"node": {"cpu": {"usageNanoCores": 1_000_000_000}, "memory": {"workingSetBytes": 2048}}});
        let m = node_metrics_object(&node, &summary).unwrap();
        assert_eq!(m["usage"], json!({"cpu": "1", "memory": "2Ki"}));
        assert_eq!(m["metadata"]["name"], "n1");
        assert!(node_metrics_object(&node, &json!({"node": {"memory": {"workingSetBytes": 1}}})).is_none());
    }
}
