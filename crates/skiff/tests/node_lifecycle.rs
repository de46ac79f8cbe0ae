//! Seed 000 section 2.4's automatic taints, end to end with the real kubectl: a simulated node
//! whose `skiff sim` process is killed stops renewing its Lease; after the grace period the node
//! lifecycle controller marks its conditions Unknown, taints it `node.kubernetes.io/unreachable`
//! (NoSchedule and NoExecute), and its pods, tolerating that for 2 s, are evicted and replaced by
//! their ReplicaSet on the nodes that remain; once the Node is deleted, the pod garbage collector
//! removes the pods left Terminating on it. Cordoning adds the `unschedulable` taint and
//! uncordoning removes it.

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
    let events = c.k(&[
        "get",
        "events",
        "-A",
        "--field-selector",
        "reason=NodeNotReady",
        "-o",
        "custom-columns=MSG:.message",
    ]);
    assert!(events.contains("Node doomed-0 status is now: NodeNotReady"), "{events}");
    let evicted = c.k(&[
        "get",
        "events",
        "--field-selector",
        "reason=TaintManagerEviction",
        "-o",
        "custom-columns=MSG:.message",
    ]);
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
