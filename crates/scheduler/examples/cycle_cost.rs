//! Schedules pods through the default plugins over an in-memory cache and prints the CPU
//! time a scheduling cycle (plus assuming the pod) costs for the first and the last thousand
//! pods: a cycle's cost should not grow with the pods already placed.
//!
//! `cargo run --profile dist -p skiff-scheduler --example cycle_cost -- WORKLOAD NODES PODS [INIT]`
//! with WORKLOAD one of basic, topology-spread, pod-anti-affinity, pod-affinity; INIT plain
//! pods are placed first.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::json;
use skiff_scheduler::cache::Cache;
use skiff_scheduler::framework::Framework;
use skiff_scheduler::types::PodInfo;

const ZONE: &str = "topology.kubernetes.io/zone";

fn thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

fn node(i: usize) -> anyhow::Result<Node> {
    let name = format!("node-{i}");
    let res = json!({"cpu": "4", "memory": "32Gi", "pods": "110"});
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name, ZONE: format!("moon-{}", i % 3 + 1)}},
        "spec": {},
        "status": {"capacity": res, "allocatable": res},
    }))?)
}

fn pod(i: usize, workload: &str) -> anyhow::Result<Pod> {
    let mut p = json!({
        "metadata": {"name": format!("pod-{i}"), "namespace": "default", "uid": format!("uid-{i}"),
                     "labels": {"app": "cost"}},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "100m", "memory": "500Mi"}}}]},
    });
    match workload {
        "basic" => {}
        "topology-spread" => {
            p["metadata"]["labels"]["color"] = json!("blue");
            p["spec"]["topologySpreadConstraints"] = json!([{
                "maxSkew": 5, "topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"color": "blue"}}}]);
        }
        "pod-anti-affinity" => {
            p["metadata"]["labels"]["color"] = json!("green");
            p["spec"]["affinity"] = json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
                "labelSelector": {"matchLabels": {"color": "green"}},
                "topologyKey": "kubernetes.io/hostname"}]}});
        }
        "pod-affinity" => {
            p["metadata"]["labels"]["color"] = json!("red");
            p["spec"]["affinity"] = json!({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
                "labelSelector": {"matchLabels": {"color": "red"}},
                "topologyKey": ZONE}]}});
        }
        other => anyhow::bail!("unknown workload {other}"),
    }
    Ok(serde_json::from_value(p)?)
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let workload = args.first().map(String::as_str).unwrap_or("topology-spread");
    let num = |i: usize, d: usize| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let (nodes, pods, init) = (num(1, 5000), num(2, 20_000), num(3, 0));
    let mut cache = Cache::new();
    for i in 0..nodes {
        cache.upsert_node(Arc::new(node(i)?));
    }
    let mut fw = Framework::with_default_plugins(0);
    let mut costs = Vec::with_capacity(pods);
    for i in 0..init + pods {
        let w = if i < init { "basic" } else { workload };
        let info = Arc::new(PodInfo::new(pod(i, w)?));
        let start = thread_cpu_seconds();
        let res = fw
            .schedule(&info, &cache)
            .map_err(|f| anyhow::anyhow!("{}", f.0.message()))?;
        let name = cache.node_name(res.0.node).to_string();
        cache.assume_pod(info, &name);
        if i >= init {
            costs.push(thread_cpu_seconds() - start);
        }
    }
    let window = 1000.min(costs.len());
    let mean_us = |s: &[f64]| s.iter().sum::<f64>() / s.len().max(1) as f64 * 1e6;
    let first = mean_us(&costs[..window]);
    let last = mean_us(&costs[costs.len() - window..]);
    println!(
        "{workload}: {nodes} nodes, {init} initial pods, {pods} pods: first {window}: {first:.1} us/pod, last {window}: {last:.1} us/pod (last/first {:.2})",
        last / first
    );
    Ok(())
}
