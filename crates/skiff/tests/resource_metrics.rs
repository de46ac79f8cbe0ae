//! The resource metrics API on a real node: `kubectl top pods` and `kubectl top nodes` read
//! `metrics.k8s.io` from `skiff server` with its node agent sampling Docker's stats, no
//! metrics-server installed. Needs the local `busybox:latest` image (`skiff images build`).

#![cfg(test)]

mod common;

use std::time::Duration;

use common::eventually;
use common::node::Node;

/// Parses `kubectl top`'s CPU column (`250m`, `1`) into millicores.
fn millicores(cell: &str) -> Option<u64> {
    match cell.strip_suffix('m') {
        Some(m) => m.parse().ok(),
        None => cell.parse::<u64>().ok().map(|c| c * 1000),
    }
}

/// Parses `kubectl top`'s memory column (`12Mi`) into MiB.
fn mebibytes(cell: &str) -> Option<u64> {
    cell.strip_suffix("Mi")?.parse().ok()
}

#[test]
fn kubectl_top_shows_what_pods_and_nodes_use() {
    let n = Node::start("top", &["--no-controllers"]);
    // One container spins a core; the other holds 40 MiB in a file under /dev/shm, which counts
    // toward its working set (shared memory is never inactive file cache).
    let pod = r#"
apiVersion: v1
kind: Pod
metadata:
  name: busy
  labels:
    app: busy
spec:
  containers:
  - name: spin
    image: busybox:latest
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "while :; do :; done"]
  - name: hold
    image: busybox:latest
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "dd if=/dev/zero of=/dev/shm/fill bs=1M count=40 && sleep 3600"]
---
apiVersion: v1
kind: Pod
metadata:
  name: idle
spec:
  containers:
  - name: sleep
    image: busybox:latest
    imagePullPolicy: IfNotPresent
    command: ["sleep", "3600"]
"#;
    n.c.apply(pod, &[]);
    n.wait_running("busy");
    n.wait_running("idle");
    let running = std::time::Instant::now();

    // The group is discovered as metrics-server's, with only get and list.
    let resources = n.c.k(&["api-resources", "--api-group=metrics.k8s.io", "-o", "wide"]);
    assert!(
        resources.contains("PodMetrics") && resources.contains("NodeMetrics"),
        "{resources}"
    );
    assert!(resources.contains("get,list"), "{resources}");

    // A rate needs two samples: a new container is read every second until it has one, so
    // both pods show within a few seconds of running, not after the 10 s sampling period.
    let top = eventually(Duration::from_secs(60), || {
        let out = n.c.kubectl(&["top", "pods", "--containers", "--no-headers"]);
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        (out.status.success() && text.contains("busy") && text.contains("idle")).then_some(text)
    })
    .expect("kubectl top pods never showed both pods");
    let waited = running.elapsed();
    assert!(
        waited < Duration::from_secs(8),
        "metrics {waited:?} after the pods ran: the newcomers' samples are not being taken"
    );
    let rows: Vec<Vec<&str>> = top.lines().map(|l| l.split_whitespace().collect()).collect();
    let row = |pod: &str, container: &str| {
        rows.iter()
            .find(|r| r.first() == Some(&pod) && r.get(1) == Some(&container))
            .unwrap_or_else(|| panic!("no row for {pod}/{container} in:\n{top}"))
    };
    let spin = millicores(row("busy", "spin")[2]).expect("cpu cell");
    assert!(
        spin >= 100,
        "a spinning container uses a good part of a core, top says {spin}m:\n{top}"
    );
    let sleep = millicores(row("idle", "sleep")[2]).expect("cpu cell");
    assert!(
        sleep <= 50,
        "a sleeping container uses no CPU, top says {sleep}m:\n{top}"
    );
    let hold = mebibytes(row("busy", "hold")[3]).expect("memory cell");
    assert!(
        (38..200).contains(&hold),
        "40 MiB of shared memory held, top says {hold}Mi:\n{top}"
    );

    // Label selectors and a single pod, as metrics-server serves them.
    let selected = n.c.k(&["top", "pods", "-l", "app=busy", "--no-headers"]);
    assert!(selected.contains("busy") && !selected.contains("idle"), "{selected}");
    let one: serde_json::Value = serde_json::from_str(&n.c.k(&[
        "get",
        "--raw",
        "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods/busy",
    ]))
    .expect("a PodMetrics");
    assert_eq!(one["kind"], "PodMetrics");
    assert_eq!(one["metadata"]["labels"]["app"], "busy");
    assert_eq!(one["window"], "10s");
    assert_eq!(one["containers"].as_array().map(Vec::len), Some(2));
    let missing = n.c.k_err(&[
        "get",
        "--raw",
        "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods/nope",
    ]);
    assert!(
        missing.contains("NotFound") || missing.contains("not found"),
        "{missing}"
    );
    // Only get and list: a watch and a write are refused.
    let watch =
        n.c.k_err(&["get", "--raw", "/apis/metrics.k8s.io/v1beta1/pods?watch=true"]);
    assert!(watch.contains("MethodNotAllowed") || watch.contains("405"), "{watch}");

    // The node: a busy core shows in the machine's CPU.
    let nodes = eventually(Duration::from_secs(30), || {
        let out = n.c.kubectl(&["top", "nodes", "--no-headers"]);
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        (out.status.success() && !text.trim().is_empty()).then_some(text)
    })
    .expect("kubectl top nodes never answered");
    let cells: Vec<&str> = nodes.split_whitespace().collect();
    let cpu = millicores(cells[1]).expect("node cpu");
    assert!(
        cpu >= 300,
        "the node runs a spinning container, top says {cpu}m:\n{nodes}"
    );
    assert!(cells[3].ends_with("Mi"), "{nodes}");

    n.c.k(&["delete", "pod", "busy", "idle", "--grace-period=0", "--force"]);
}
