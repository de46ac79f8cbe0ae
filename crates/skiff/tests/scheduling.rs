//! Seed 000's scheduling rules end to end: `skiff server --sim-nodes 3` and the real kubectl.

#![cfg(test)]

mod common;

use std::time::Duration;

use common::{Cluster, eventually};

fn cluster() -> (Cluster, Vec<String>) {
    let c = Cluster::start(&["--no-agent", "--sim-nodes", "3"]);
    let names = eventually(Duration::from_secs(20), || {
        let out = c.k(&["get", "nodes", "-o", "name"]);
        let names: Vec<String> = out
            .lines()
            .filter_map(|l| l.strip_prefix("node/"))
            .map(str::to_string)
            .collect();
        (names.len() == 3).then_some(names)
    })
    .expect("three simulated nodes");
    let ready = eventually(Duration::from_secs(20), || {
        let out = c.k(&["get", "nodes"]);
        (out.matches(" Ready ").count() == 3).then_some(())
    });
    assert!(ready.is_some(), "nodes not Ready: {}", c.k(&["get", "nodes"]));
    (c, names)
}

fn pod_field(c: &Cluster, name: &str, path: &str) -> String {
    c.k(&["get", "pod", name, "-o", &format!("jsonpath={{{path}}}")])
}

fn wait_phase(c: &Cluster, name: &str, phase: &str, secs: u64) -> bool {
    eventually(Duration::from_secs(secs), || {
        (pod_field(c, name, ".status.phase") == phase).then_some(())
    })
    .is_some()
}

/// The FailedScheduling message of a pod, once there is one.
fn failed_scheduling(c: &Cluster, name: &str) -> String {
    eventually(Duration::from_secs(10), || {
        let out = c.k(&[
            "get",
            "events",
            "--field-selector",
            &format!("involvedObject.name={name},reason=FailedScheduling"),
            "-o",
            "jsonpath={.items[*].message}",
        ]);
        (!out.is_empty()).then_some(out)
    })
    .unwrap_or_else(|| {
        panic!(
            "no FailedScheduling event for {name}: {}",
            c.k(&["describe", "pod", name])
        )
    })
}

const NODE_SELECTOR_POD: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: pod-example
spec:
  nodeSelector:
    disktype: ssd
  containers:
  - name: nginx
    image: nginx:1.15
"#;

#[test]
fn node_selector_pending_then_scheduled_after_label() {
    let (c, nodes) = cluster();
    c.apply(NODE_SELECTOR_POD, &[]);
    let msg = failed_scheduling(&c, "pod-example");
    assert!(
        msg.contains("0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."),
        "{msg}"
    );
    assert_eq!(pod_field(&c, "pod-example", ".status.phase"), "Pending");
    let describe = c.k(&["describe", "pod", "pod-example"]);
    assert!(describe.contains("FailedScheduling"), "{describe}");
    assert!(
        describe.contains("PodScheduled") && describe.contains("False"),
        "{describe}"
    );

    c.k(&["label", "nodes", &nodes[1], "disktype=ssd"]);
    assert!(wait_phase(&c, "pod-example", "Running", 10), "not Running after label");
    assert_eq!(pod_field(&c, "pod-example", ".spec.nodeName"), nodes[1]);
    let wide = c.k(&["get", "pod", "pod-example", "-o", "wide"]);
    assert!(wide.contains("Running") && wide.contains(&nodes[1]), "{wide}");
    let describe = c.k(&["describe", "pod", "pod-example"]);
    assert!(
        describe.contains(&format!("Successfully assigned default/pod-example to {}", nodes[1])),
        "{describe}"
    );
}

const AFFINITY_POD: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: with-node-affinity
spec:
  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms:
        - matchExpressions:
          - key: gpu
            operator: In
            values:
            - nvidia-tesla
      preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 1
        preference:
          matchExpressions:
          - key: group
            operator: In
            values:
            - ai
  containers:
  - name: web
    image: nginx
"#;

#[test]
fn required_and_preferred_node_affinity() {
    let (c, nodes) = cluster();
    c.apply(AFFINITY_POD, &[]);
    let msg = failed_scheduling(&c, "with-node-affinity");
    assert!(
        msg.contains("3 node(s) didn't match Pod's node affinity/selector"),
        "{msg}"
    );
    c.k(&["label", "nodes", &nodes[2], "group=ai"]);
    c.k(&["label", "nodes", &nodes[0], "gpu=nvidia-tesla"]);
    c.k(&["label", "nodes", &nodes[2], "gpu=nvidia-tesla"]);
    assert!(wait_phase(&c, "with-node-affinity", "Running", 10));
    let first = pod_field(&c, "with-node-affinity", ".spec.nodeName");
    assert!(first == nodes[0] || first == nodes[2], "{first}");
    // With both nodes eligible, the preferred term decides.
    c.apply(
        &AFFINITY_POD.replace("name: with-node-affinity", "name: preferring"),
        &[],
    );
    assert!(wait_phase(&c, "preferring", "Running", 10));
    assert_eq!(pod_field(&c, "preferring", ".spec.nodeName"), nodes[2]);
}

#[test]
fn taints_and_tolerations() {
    let (c, nodes) = cluster();
    for n in &nodes {
        c.k(&["taint", "node", n, "key=value:NoSchedule"]);
    }
    c.apply(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: intolerant\nspec:\n  containers:\n  - name: c\n    image: busybox:latest\n",
        &[],
    );
    let msg = failed_scheduling(&c, "intolerant");
    assert!(
        msg.contains("0/3 nodes are available: 3 node(s) had untolerated taint {key: value}."),
        "{msg}"
    );
    let tolerant = r#"
apiVersion: v1
kind: Pod
metadata:
  name: pod-taints
spec:
  containers:
  - name: pod-taints
    image: busybox:latest
  tolerations:
  - key: "key"
    operator: "Equal"
    value: "value"
    effect: "NoSchedule"
"#;
    c.apply(tolerant, &[]);
    assert!(wait_phase(&c, "pod-taints", "Running", 10));
    // Removing a taint lets the waiting pod through.
    c.k(&["taint", "node", &nodes[0], "key:NoSchedule-"]);
    assert!(wait_phase(&c, "intolerant", "Running", 10));
    assert_eq!(pod_field(&c, "intolerant", ".spec.nodeName"), nodes[0]);
}

#[test]
fn insufficient_cpu() {
    let (c, _) = cluster();
    let pod = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: big\nspec:\n  containers:\n  - name: c\n    image: busybox:latest\n    resources:\n      requests:\n        cpu: \"100\"\n";
    c.apply(pod, &[]);
    let msg = failed_scheduling(&c, "big");
    assert!(msg.contains("0/3 nodes are available: 3 Insufficient cpu."), "{msg}");
    assert_eq!(pod_field(&c, "big", ".status.phase"), "Pending");
}

#[test]
fn node_name_bypasses_the_scheduler_and_cordon_is_respected() {
    let (c, nodes) = cluster();
    let pinned = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: pinned\n  labels:\n    app: nginx\nspec:\n  nodeName: {}\n  containers:\n  - name: nginx\n    image: nginx:1.15\n",
        nodes[2]
    );
    c.apply(&pinned, &[]);
    assert!(wait_phase(&c, "pinned", "Running", 10));
    let events = c.k(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=pinned,reason=Scheduled",
        "-o",
        "name",
    ]);
    assert!(
        events.trim().is_empty(),
        "the scheduler handled a pod with nodeName: {events}"
    );

    c.k(&["cordon", &nodes[0]]);
    c.k(&["cordon", &nodes[1]]);
    for i in 0..3 {
        c.apply(
            &format!("apiVersion: v1\nkind: Pod\nmetadata:\n  name: c{i}\nspec:\n  containers:\n  - name: c\n    image: busybox:latest\n"),
            &[],
        );
    }
    for i in 0..3 {
        let name = format!("c{i}");
        assert!(wait_phase(&c, &name, "Running", 10));
        assert_eq!(pod_field(&c, &name, ".spec.nodeName"), nodes[2]);
    }
    c.k(&["cordon", &nodes[2]]);
    c.apply(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: nowhere\nspec:\n  containers:\n  - name: c\n    image: busybox:latest\n",
        &[],
    );
    let msg = failed_scheduling(&c, "nowhere");
    assert!(msg.contains("3 node(s) were unschedulable"), "{msg}");
    c.k(&["uncordon", &nodes[1]]);
    assert!(wait_phase(&c, "nowhere", "Running", 10));
}

#[test]
fn other_scheduler_names_are_left_alone() {
    let (c, _) = cluster();
    c.apply(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: mine\nspec:\n  schedulerName: my-scheduler\n  containers:\n  - name: c\n    image: busybox:latest\n",
        &[],
    );
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(pod_field(&c, "mine", ".status.phase"), "Pending");
    assert_eq!(pod_field(&c, "mine", ".spec.nodeName"), "");
    let events = c.k(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=mine",
        "-o",
        "name",
    ]);
    assert!(events.trim().is_empty(), "{events}");
}

#[test]
fn preemption_by_priority() {
    let (c, nodes) = cluster();
    // One schedulable node with 4 CPUs, filled by low-priority pods.
    c.k(&["cordon", &nodes[0]]);
    c.k(&["cordon", &nodes[1]]);
    c.apply(
        "apiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\nmetadata:\n  name: high\nvalue: 1000\n",
        &[],
    );
    for i in 0..2 {
        c.apply(
            &format!("apiVersion: v1\nkind: Pod\nmetadata:\n  name: low{i}\nspec:\n  containers:\n  - name: c\n    image: busybox:latest\n    resources:\n      requests:\n        cpu: \"2\"\n"),
            &[],
        );
        assert!(wait_phase(&c, &format!("low{i}"), "Running", 10));
    }
    c.apply(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: urgent\nspec:\n  priorityClassName: high\n  containers:\n  - name: c\n    image: busybox:latest\n    resources:\n      requests:\n        cpu: \"2\"\n",
        &[],
    );
    assert!(
        wait_phase(&c, "urgent", "Running", 30),
        "{}",
        c.k(&["describe", "pod", "urgent"])
    );
    assert_eq!(pod_field(&c, "urgent", ".spec.nodeName"), nodes[2]);
    assert_eq!(pod_field(&c, "urgent", ".spec.priority"), "1000");
    // The nomination the preemption made is cleared by the binding.
    assert_eq!(pod_field(&c, "urgent", ".status.nominatedNodeName"), "");
    let remaining = c.k(&["get", "pods", "-o", "name"]);
    let lows = remaining.lines().filter(|l| l.starts_with("pod/low")).count();
    assert_eq!(lows, 1, "exactly one victim expected:\n{remaining}");
}

#[test]
fn explain_shows_every_node_verdict() {
    let (c, nodes) = cluster();
    c.k(&["taint", "node", &nodes[0], "dedicated=gpu:NoSchedule"]);
    c.apply(NODE_SELECTOR_POD, &[]);
    failed_scheduling(&c, "pod-example");
    let out = std::process::Command::new(common::skiff_bin())
        .args(["explain", "pod", "pod-example", "--kubeconfig"])
        .arg(&c.kubeconfig)
        .output()
        .expect("skiff explain");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for n in &nodes {
        assert!(text.contains(n.as_str()), "{text}");
    }
    assert!(text.contains("NodeAffinity"), "{text}");
}

/// Kills a child process when dropped, so a failing test leaves nothing running.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn standalone_scheduler_binds_through_a_remote_api_server() {
    // No scheduler in the server: `skiff scheduler --kubeconfig` (HTTP/2 over TLS) does the work.
    let c = Cluster::start(&["--no-agent", "--no-scheduler", "--sim-nodes", "2"]);
    let log = std::fs::File::create(c.dir.path().join("scheduler.log")).expect("log file");
    let _scheduler = KillOnDrop(
        std::process::Command::new(common::skiff_bin())
            .arg("scheduler")
            .arg("--kubeconfig")
            .arg(&c.kubeconfig)
            .env("SKIFF_LOG", "info")
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start skiff scheduler"),
    );
    c.apply(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: remote\nspec:\n  containers:\n  - name: c\n    image: busybox:latest\n    resources:\n      requests:\n        cpu: 100m\n",
        &[],
    );
    assert!(
        wait_phase(&c, "remote", "Running", 30),
        "{}\n{}",
        c.k(&["describe", "pod", "remote"]),
        std::fs::read_to_string(c.dir.path().join("scheduler.log")).unwrap_or_default()
    );
    let node = pod_field(&c, "remote", ".spec.nodeName");
    assert!(node.starts_with("sim-node-"), "{node}");
    let scheduled = c.k(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=remote,reason=Scheduled",
        "-o",
        "jsonpath={.items[*].message}",
    ]);
    assert_eq!(scheduled, format!("Successfully assigned default/remote to {node}"));
}

#[test]
fn scheduling_benchmark_reports_every_pod_bound() {
    let home = tempfile::tempdir().expect("home");
    let out = std::process::Command::new(common::skiff_bin())
        .args([
            "bench",
            "scheduling",
            "--nodes",
            "20",
            "--pods",
            "60",
            "--workload",
            "taints",
            "--json",
        ])
        .env("HOME", home.path())
        .env("SKIFF_LOG", "warn")
        .output()
        .expect("run skiff bench scheduling");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    assert_eq!(r["workload"], "taints");
    assert_eq!(r["nodes"], 20);
    assert_eq!(r["pods"], 60);
    // scheduler_perf's 1,000 initial pods at 5,000 nodes, in proportion to 20 nodes.
    assert_eq!(r["init_pods"], 4);
    assert!(r["overall_pods_per_second"].as_f64().is_some_and(|v| v > 0.0), "{r}");
    assert!(r["pods_per_second"].as_f64().is_some_and(|v| v > 0.0), "{r}");
    let (p50, p99) = (
        r["p50_ms"].as_f64().unwrap_or(-1.0),
        r["p99_ms"].as_f64().unwrap_or(-1.0),
    );
    assert!(p50 > 0.0 && p99 >= p50, "{r}");
    // The events already written of the 60 Scheduled ones the run records.
    assert!(r["scheduled_events"].as_u64().is_some_and(|n| n <= 60), "{r}");
}

/// Every scheduler_perf shape at a small size, each run against a server of its own (four at a
/// time): each names upstream's threshold beside its figure, reads every pod back and passes the
/// placement check of its workload.
#[test]
fn scheduling_benchmark_checks_every_workload() {
    let workloads = std::sync::Mutex::new(vec![
        ("basic", 60),
        ("node-affinity", 60),
        ("taints", 60),
        ("topology-spread", 60),
        ("preferred-topology-spread", 60),
        ("default-topology-spread", 60),
        ("node-inclusion-policy", 60),
        // One pod per node, the 6 initial ones included.
        ("pod-anti-affinity", 24),
        ("pod-affinity", 60),
        ("preferred-pod-affinity", 60),
        ("preferred-pod-anti-affinity", 60),
        ("mixed", 60),
        ("pod-affinity-ns-selector", 60),
        // One pod per node, the 20 initial ones included.
        ("pod-anti-affinity-ns-selector", 10),
        ("preferred-pod-affinity-ns-selector", 60),
        ("preferred-pod-anti-affinity-ns-selector", 60),
        // One high-priority pod per node.
        ("preemption", 30),
        ("secrets", 60),
        ("in-tree-pvs", 60),
        ("csi-pvs", 60),
    ]);
    let home = tempfile::tempdir().expect("home");
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                while let Some((w, pods)) = workloads.lock().expect("queue").pop() {
                    check_workload(w, pods, home.path());
                }
            });
        }
    });
}

fn check_workload(w: &str, pods: usize, home: &std::path::Path) {
    let out = std::process::Command::new(common::skiff_bin())
        .args(["bench", "scheduling", "--nodes", "30", "--pods", &pods.to_string()])
        .args(["--workload", w, "--json"])
        .env("HOME", home)
        .env("SKIFF_LOG", "warn")
        .output()
        .expect("run skiff bench scheduling");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{w}: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    assert_eq!(r["workload"], w);
    assert_eq!(r["pods"], pods, "{r}");
    assert!(r["upstream"].as_str().is_some_and(|u| !u.is_empty()), "{r}");
    let published = !matches!(w, "taints" | "preemption");
    assert_eq!(r["upstream_threshold"].as_f64().is_some(), published, "{r}");
    assert_eq!(r["ratio"].as_f64().is_some(), published, "{r}");
    assert!(r["pods_per_second"].as_f64().is_some_and(|v| v > 0.0), "{r}");
    assert_eq!(r["check"]["passed"], true, "{r}");
    assert_eq!(r["check"]["measured_bound"], pods, "{r}");
    let rules = r["check"]["rules"].as_array().cloned().unwrap_or_default();
    let expect = match w {
        "node-affinity" => Some("node-affinity"),
        "taints" => Some("taints"),
        "topology-spread" | "node-inclusion-policy" => Some("topology-spread"),
        "pod-affinity" | "pod-affinity-ns-selector" | "mixed" => Some("pod-affinity"),
        "pod-anti-affinity" | "pod-anti-affinity-ns-selector" => Some("pod-anti-affinity"),
        _ => None,
    };
    if let Some(rule) = expect {
        assert!(rules.iter().any(|v| v == rule), "{w}: {r}");
    }
    if w == "preemption" {
        // 120 initial pods (4 a node); each measured pod preempted three.
        assert_eq!(r["init_pods"], 120, "{r}");
        assert_eq!(r["check"]["init_pods_gone"], 90, "{r}");
    }
}
