//! Seed 000 section 2.4's automatic taints, end to end with the real kubectl: a simulated node
//! whose `skiff sim` process is killed stops renewing its Lease; after the grace period the node
//! lifecycle controller marks its conditions Unknown, taints it `node.kubernetes.io/unreachable`
//! (NoSchedule and NoExecute), and its pods, tolerating that for 2 s, are evicted and replaced by
//! their ReplicaSet on the nodes that remain; once the Node is deleted, the pod garbage collector
//! removes the pods left Terminating on it. Cordoning adds the `unschedulable` taint and
//! uncordoning removes it.

#![cfg(test)]

mod common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{Cluster, eventually, skiff_bin, tail};

struct Sim(Child);

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const APP: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: app
spec:
  replicas: 3
  selector:
    matchLabels: {app: app}
  template:
    metadata:
      labels: {app: app}
    spec:
      containers:
      - name: c
        image: busybox:latest
      tolerations:
      - {key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute, tolerationSeconds: 2}
      - {key: node.kubernetes.io/not-ready, operator: Exists, effect: NoExecute, tolerationSeconds: 2}
"#;

/// `skiff sim` with `nodes` nodes named `PREFIX0...` in `zone`.
fn sim(c: &Cluster, prefix: &str, nodes: usize, zone: &str) -> Sim {
    let child = Command::new(skiff_bin())
        .args(["sim", "--nodes", &nodes.to_string(), "--name-prefix", prefix])
        .args([
            "--labels",
            &format!("topology.kubernetes.io/zone={zone}"),
            "--kubeconfig",
        ])
        .arg(&c.kubeconfig)
        .env("HOME", c.home.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start skiff sim");
    Sim(child)
}

fn ready_status(c: &Cluster, node: &str) -> String {
    c.k(&[
        "get",
        "node",
        node,
        "-o",
        "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
    ])
}

fn running_pods_by_node(c: &Cluster) -> Vec<(String, String)> {
    let out = c.k(&[
        "get",
        "pods",
        "-l",
        "app=app",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName} {.status.phase} {.metadata.deletionTimestamp}{\"\\n\"}{end}",
    ]);
    out.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 3 && f[2] == "Running").then(|| (f[0].to_string(), f[1].to_string()))
        })
        .collect()
}

fn taints(c: &Cluster, node: &str) -> String {
    c.k(&[
        "get",
        "node",
        node,
        "-o",
        "jsonpath={range .spec.taints[*]}{.key}:{.effect} {end}",
    ])
}

#[test]
fn a_lost_node_is_tainted_and_its_pods_move() {
    let c = Cluster::start(&[
        "--no-agent",
        "--sim-nodes",
        "2",
        "--node-monitor-period",
        "1s",
        "--node-monitor-grace-period",
        "15s",
    ]);
    let sim = Command::new(skiff_bin())
        .args(["sim", "--nodes", "1", "--name-prefix", "doomed-", "--kubeconfig"])
        .arg(&c.kubeconfig)
        .env("HOME", c.home.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start skiff sim");
    let mut sim = Sim(sim);
    let ready = eventually(Duration::from_secs(30), || {
        (c.k(&["get", "nodes"]).matches(" Ready ").count() == 3).then_some(())
    });
    assert!(ready.is_some(), "{}", c.k(&["get", "nodes"]));

    // Cordoned nodes get the unschedulable taint: the pods all go to the doomed node.
    for node in ["sim-node-0", "sim-node-1"] {
        c.k(&["cordon", node]);
    }
    let cordoned = eventually(Duration::from_secs(10), || {
        taints(&c, "sim-node-0")
            .contains("node.kubernetes.io/unschedulable:NoSchedule")
            .then_some(())
    });
    assert!(cordoned.is_some(), "{}", taints(&c, "sim-node-0"));
    c.apply(APP, &[]);
    let placed = eventually(Duration::from_secs(30), || {
        let pods = running_pods_by_node(&c);
        (pods.len() == 3 && pods.iter().all(|(_, n)| n == "doomed-0")).then_some(pods)
    });
    assert!(placed.is_some(), "{}", c.k(&["get", "pods", "-o", "wide"]));
    for node in ["sim-node-0", "sim-node-1"] {
        c.k(&["uncordon", node]);
    }
    let uncordoned = eventually(Duration::from_secs(10), || {
        (!taints(&c, "sim-node-0").contains("unschedulable")).then_some(())
    });
    assert!(uncordoned.is_some(), "{}", taints(&c, "sim-node-0"));

    // The doomed node's process dies: no more heartbeats.
    let _ = sim.0.kill();
    let _ = sim.0.wait();
    let lost = eventually(Duration::from_secs(40), || {
        let status = c.k(&[
            "get",
            "node",
            "doomed-0",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}/{.status.conditions[?(@.type==\"Ready\")].reason}",
        ]);
        (status == "Unknown/NodeStatusUnknown").then_some(())
    });
    assert!(
        lost.is_some(),
        "{}\n{}",
        c.k(&["get", "node", "doomed-0", "-o", "yaml"]),
        tail(&c.log(), 30)
    );
    let message = c.k(&[
        "get",
        "node",
        "doomed-0",
        "-o",
        "jsonpath={.status.conditions[?(@.type==\"Ready\")].message}",
    ]);
    assert_eq!(message, "Kubelet stopped posting node status.");
    let tainted = eventually(Duration::from_secs(20), || {
        let t = taints(&c, "doomed-0");
        (t.contains("node.kubernetes.io/unreachable:NoSchedule")
            && t.contains("node.kubernetes.io/unreachable:NoExecute"))
        .then_some(t)
    });
    assert!(tainted.is_some(), "{}", taints(&c, "doomed-0"));
    assert!(
        c.k(&["get", "nodes"]).contains("doomed-0     NotReady"),
        "{}",
        c.k(&["get", "nodes"])
    );

    // Its pods are evicted after their 2 s and replaced on the two nodes left.
    let moved = eventually(Duration::from_secs(30), || {
        let pods = running_pods_by_node(&c);
        (pods.len() == 3 && pods.iter().all(|(_, n)| n.starts_with("sim-node-"))).then_some(pods)
    });
    assert!(moved.is_some(), "{}", c.k(&["get", "pods", "-o", "wide"]));
    let events = c.event_messages("reason=NodeNotReady");
    assert!(events.contains("Node doomed-0 status is now: NodeNotReady"), "{events}");
    let evicted = c.event_messages("reason=TaintManagerEviction");
    assert!(evicted.contains("Marking for deletion Pod default/app-"), "{evicted}");
    // The nodes that stayed are untouched.
    assert!(!taints(&c, "sim-node-0").contains("unreachable"));

    // The evicted pods wait Terminating for a node that will not confirm; deleting the Node lets
    // the pod garbage collector force-delete them (40 s after it notices, on its 20 s round).
    let stuck = c.k(&["get", "pods", "-o", "wide"]);
    assert!(stuck.contains("Terminating") && stuck.contains("doomed-0"), "{stuck}");
    c.k(&["delete", "node", "doomed-0"]);
    let collected = eventually(Duration::from_secs(100), || {
        (!c.k(&["get", "pods", "-o", "wide"]).contains("doomed-0")).then_some(())
    });
    assert!(collected.is_some(), "{}", c.k(&["get", "pods", "-o", "wide"]));
    assert_eq!(running_pods_by_node(&c).len(), 3);
}

/// A zone that loses most of its nodes at once is in a partial disruption: in a zone this small
/// (not over --large-cluster-size-threshold) no node of it is tainted NoExecute, so nothing is
/// evicted, while a zone that loses one node of two (Normal) has it tainted as usual.
#[test]
fn a_zone_mostly_down_is_not_emptied() {
    let c = Cluster::start(&[
        "--no-agent",
        "--node-monitor-period",
        "1s",
        "--node-monitor-grace-period",
        "15s",
    ]);
    let _z1_stays = sim(&c, "z1-stays-", 1, "z1");
    let mut z1_lost = sim(&c, "z1-lost-", 3, "z1");
    let _z2_stays = sim(&c, "z2-stays-", 1, "z2");
    let mut z2_lost = sim(&c, "z2-lost-", 1, "z2");
    let ready = eventually(Duration::from_secs(30), || {
        (c.k(&["get", "nodes"]).matches(" Ready ").count() == 6).then_some(())
    });
    assert!(ready.is_some(), "{}", c.k(&["get", "nodes"]));
    for lost in [&mut z1_lost, &mut z2_lost] {
        let _ = lost.0.kill();
        let _ = lost.0.wait();
    }
    let unknown = eventually(Duration::from_secs(40), || {
        ["z1-lost-0", "z1-lost-1", "z1-lost-2", "z2-lost-0"]
            .iter()
            .all(|n| ready_status(&c, n) == "Unknown")
            .then_some(())
    });
    assert!(unknown.is_some(), "{}\n{}", c.k(&["get", "nodes"]), tail(&c.log(), 30));
    let tainted = eventually(Duration::from_secs(20), || {
        taints(&c, "z2-lost-0")
            .contains("node.kubernetes.io/unreachable:NoExecute")
            .then_some(())
    });
    assert!(tainted.is_some(), "z2-lost-0: {}", taints(&c, "z2-lost-0"));
    // Some seconds more: z1's lost nodes only keep new pods away.
    std::thread::sleep(Duration::from_secs(5));
    for node in ["z1-lost-0", "z1-lost-1", "z1-lost-2"] {
        let t = taints(&c, node);
        assert!(t.contains("node.kubernetes.io/unreachable:NoSchedule"), "{node}: {t}");
        assert!(
            !t.contains("NoExecute"),
            "{node} was tainted NoExecute in a partial disruption: {t}"
        );
    }
    assert!(c.log().contains("zone state changed"), "{}", tail(&c.log(), 30));
}

/// A `skiff agent` process for node `name` with its data in `dir`, logging to `dir/agent.log`.
fn start_agent(c: &Cluster, name: &str, dir: &std::path::Path) -> Sim {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("agent.log"))
        .expect("agent log");
    let child = Command::new(skiff_bin())
        .args([
            "agent",
            "--node-name",
            name,
            "--eviction-hard",
            common::TEST_EVICTION_HARD,
            "--kubeconfig",
        ])
        .arg(common::node_kubeconfig(c, name))
        .arg("--data-dir")
        .arg(dir)
        .env("SKIFF_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start skiff agent");
    Sim(child)
}

/// Removes the node's containers when the test ends, however it ends.
struct Containers(String);

impl Drop for Containers {
    fn drop(&mut self) {
        common::node::remove_node_containers(&self.0);
    }
}

/// The real node agent killed and started again within its pods' toleration (the 300 s every pod
/// gets): the node goes Unknown and is tainted meanwhile, the taints go when it reports again, and
/// its pod is never evicted: the same pod and the same container run on. (A simulated node stays
/// up: were every node down, upstream's disruption mode would taint none.)
#[test]
fn a_node_agent_back_in_time_keeps_its_pods() {
    let c = Cluster::start(&[
        "--no-agent",
        "--sim-nodes",
        "1",
        "--node-monitor-period",
        "1s",
        "--node-monitor-grace-period",
        "15s",
    ]);
    let name = format!("e2e-back-{}", std::process::id());
    let _containers = Containers(name.clone());
    let dir = tempfile::tempdir().expect("agent data dir");
    let agent_log = || std::fs::read_to_string(dir.path().join("agent.log")).unwrap_or_default();
    let mut agent = start_agent(&c, &name, dir.path());
    common::node::wait_node_ready(&c, &name, agent_log);
    c.apply(
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: keeper\nspec:\n  nodeName: {name}\n  containers:\n  - name: main\n    image: busybox:latest\n    imagePullPolicy: Never\n    command: [sleep, '3600']\n"
        ),
        &[],
    );
    let state = || {
        c.k(&[
            "get",
            "pod",
            "keeper",
            "-o",
            "jsonpath={.metadata.uid} {.status.containerStatuses[0].containerID} {.status.phase} {.status.conditions[?(@.type==\"Ready\")].status} {.metadata.deletionTimestamp}",
        ])
        .trim()
        .to_string()
    };
    let before = eventually(Duration::from_secs(60), || {
        let s = state();
        s.ends_with(" Running True").then_some(s)
    })
    .unwrap_or_else(|| panic!("{}\n{}", c.k(&["describe", "pod", "keeper"]), tail(&agent_log(), 30)));

    let _ = agent.0.kill();
    let _ = agent.0.wait();
    let lost = eventually(Duration::from_secs(40), || {
        let t = taints(&c, &name);
        (ready_status(&c, &name) == "Unknown"
            && t.contains("node.kubernetes.io/unreachable:NoSchedule")
            && t.contains("node.kubernetes.io/unreachable:NoExecute"))
        .then_some(())
    });
    assert!(
        lost.is_some(),
        "{}\n{}",
        c.k(&["get", "node", &name, "-o", "yaml"]),
        tail(&c.log(), 30)
    );
    // Its pod is marked not Ready, and stays: it tolerates the taint for 300 s.
    let not_ready = eventually(Duration::from_secs(10), || {
        state().ends_with(" Running False").then_some(())
    });
    assert!(not_ready.is_some(), "{}", state());

    let _agent = start_agent(&c, &name, dir.path());
    let back = eventually(Duration::from_secs(40), || {
        (ready_status(&c, &name) == "True" && !taints(&c, &name).contains("unreachable")).then_some(())
    });
    assert!(
        back.is_some(),
        "{} / {}\n{}",
        ready_status(&c, &name),
        taints(&c, &name),
        tail(&agent_log(), 30)
    );
    let after = eventually(Duration::from_secs(30), || {
        let s = state();
        s.ends_with(" Running True").then_some(s)
    });
    assert_eq!(
        after.as_deref(),
        Some(before.as_str()),
        "the pod was not kept as it was: {}",
        state()
    );
    // Its eviction was scheduled for 300 s, and cancelled with the taint.
    let evictions = c.event_messages("reason=TaintManagerEviction");
    assert!(!evictions.contains("Marking for deletion"), "{evictions}");
    assert!(
        evictions.contains("Cancelling deletion of Pod default/keeper"),
        "{evictions}"
    );
}

/// The agent measures the host against its eviction thresholds: with one the host cannot meet
/// (`memory.available<1000Ti`), the node reports MemoryPressure, the node lifecycle controller
/// taints it `node.kubernetes.io/memory-pressure:NoSchedule`, and a new pod is not scheduled there.
#[test]
fn a_node_under_memory_pressure_says_so_and_takes_no_new_pods() {
    let n = common::node::Node::start("pressure", &["--eviction-hard", "memory.available<1000Ti"]);
    let c = &n.c;
    let pressure = eventually(Duration::from_secs(40), || {
        let status = c.k(&[
            "get",
            "node",
            &n.name,
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"MemoryPressure\")].status}/{.status.conditions[?(@.type==\"MemoryPressure\")].reason}",
        ]);
        (status == "True/KubeletHasInsufficientMemory").then_some(())
    });
    assert!(
        pressure.is_some(),
        "{}\n{}",
        c.k(&["describe", "node", &n.name]),
        tail(&c.log(), 30)
    );
    let disk = c.k(&[
        "get",
        "node",
        &n.name,
        "-o",
        "jsonpath={.status.conditions[?(@.type==\"DiskPressure\")].status}",
    ]);
    assert_eq!(disk, "False", "only the memory threshold was set");
    let tainted = eventually(Duration::from_secs(20), || {
        taints(c, &n.name)
            .contains("node.kubernetes.io/memory-pressure:NoSchedule")
            .then_some(())
    });
    assert!(tainted.is_some(), "{}", taints(c, &n.name));
    c.apply(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: newcomer\nspec:\n  containers:\n  - name: c\n    image: busybox:latest\n    imagePullPolicy: Never\n",
        &[],
    );
    let refused = eventually(Duration::from_secs(20), || {
        let events = c.event_messages("involvedObject.name=newcomer");
        events
            .contains("1 node(s) had untolerated taint {node.kubernetes.io/memory-pressure: }")
            .then_some(events)
    });
    assert!(refused.is_some(), "{}", c.k(&["describe", "pod", "newcomer"]));
}

/// A busybox pod bound to `node` running `script`, with `resources` (YAML under the container).
fn pinned_pod(node: &str, name: &str, script: &str, resources: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  nodeName: {node}\n  containers:\n  - name: c\n    image: busybox:latest\n    imagePullPolicy: Never\n    command: [sh, -c, '{script}']\n{resources}"
    )
}

/// Under memory pressure the agent evicts one pod per round in upstream's order: the BestEffort
/// pod (over its zero request) before the Burstable one within its request. An evicted pod ends
/// Failed, reason Evicted, with the kubelet's message, the DisruptionTarget condition and an event.
#[test]
fn memory_pressure_evicts_best_effort_pods_first() {
    let n = common::node::Node::start("evict", &["--eviction-hard", "memory.available<1000Ti"]);
    let c = &n.c;
    let pod = |name: &str, resources: &str| pinned_pod(&n.name, name, "sleep 3600", resources);
    let burstable = "    resources:\n      requests:\n        memory: 1Gi\n";
    c.apply(
        &format!("{}\n---\n{}", pod("besteffort", ""), pod("burstable", burstable)),
        &[],
    );
    let state = |name: &str| c.k(&["get", "pod", name, "-o", "jsonpath={.status.phase}/{.status.reason}"]);
    let first = eventually(Duration::from_secs(40), || {
        (state("besteffort") == "Failed/Evicted").then_some(())
    });
    assert!(
        first.is_some(),
        "{}\n{}",
        c.k(&["describe", "pod", "besteffort"]),
        tail(&c.log(), 30)
    );
    assert_ne!(state("burstable"), "Failed/Evicted", "the Burstable pod went first");
    let message = c.k(&["get", "pod", "besteffort", "-o", "jsonpath={.status.message}"]);
    assert!(
        message.starts_with("The node was low on resource: memory. Threshold quantity: ")
            && message.contains("Container c was using ")
            && message.contains("request is 0, has larger consumption of memory."),
        "{message}"
    );
    let condition = c.k(&[
        "get",
        "pod",
        "besteffort",
        "-o",
        "jsonpath={.status.conditions[?(@.type==\"DisruptionTarget\")].reason}",
    ]);
    assert_eq!(condition, "TerminationByKubelet");
    let events = c.k(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=besteffort,reason=Evicted",
        "-o",
        "name",
    ]);
    assert!(!events.trim().is_empty(), "no Evicted event");
    // The pressure stays: the next round takes the Burstable pod.
    let second = eventually(Duration::from_secs(40), || {
        (state("burstable") == "Failed/Evicted").then_some(())
    });
    assert!(second.is_some(), "{}", c.k(&["describe", "pod", "burstable"]));
}

/// Under disk pressure the pod using the most ephemeral storage (its writable layer here) goes
/// first, with the kubelet's message naming ephemeral-storage.
#[test]
fn disk_pressure_evicts_the_largest_writer_first() {
    let n = common::node::Node::start("diskevict", &["--eviction-hard", "nodefs.available<100%"]);
    let c = &n.c;
    let pod = |name: &str, script: &str| pinned_pod(&n.name, name, script, "");
    // The writer first, until it has written (or is already evicted), then the quiet one.
    c.apply(
        &pod(
            "writer",
            "dd if=/dev/zero of=/big bs=1M count=32 2>/dev/null; touch /done; sleep 3600",
        ),
        &[],
    );
    let written = eventually(Duration::from_secs(30), || {
        let out = c.kubectl(&["exec", "writer", "--", "ls", "/done"]);
        let phase = c.k(&["get", "pod", "writer", "-o", "jsonpath={.status.phase}"]);
        (out.status.success() || phase == "Failed").then_some(())
    });
    assert!(written.is_some(), "{}", c.k(&["describe", "pod", "writer"]));
    c.apply(&pod("quiet", "sleep 3600"), &[]);
    let state = |name: &str| c.k(&["get", "pod", name, "-o", "jsonpath={.status.phase}/{.status.reason}"]);
    let disk = eventually(Duration::from_secs(30), || {
        (c.k(&[
            "get",
            "node",
            &n.name,
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"DiskPressure\")].status}",
        ]) == "True")
            .then_some(())
    });
    assert!(disk.is_some(), "{}", c.k(&["describe", "node", &n.name]));
    let first = eventually(Duration::from_secs(60), || {
        let (w, q) = (state("writer"), state("quiet"));
        (w == "Failed/Evicted" || q == "Failed/Evicted").then_some((w, q))
    });
    let Some((writer, quiet)) = first else {
        panic!(
            "nothing evicted:\n{}\n{}",
            c.k(&["get", "pods", "-o", "wide"]),
            tail(&c.log(), 30)
        );
    };
    assert_eq!(writer, "Failed/Evicted", "the quiet pod went first ({quiet})");
    let message = c.k(&["get", "pod", "writer", "-o", "jsonpath={.status.message}"]);
    assert!(
        message.starts_with("The node was low on resource: ephemeral-storage."),
        "{message}"
    );
}
