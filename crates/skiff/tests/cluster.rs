//! `skiff cluster`: three real nodes on this machine, each a network namespace with its own
//! engine and agent, the control plane on the first. One cluster serves every step (creating
//! one costs seconds, the steps share them): nodes and their addresses, a DaemonSet on every
//! node, pods spread over them, logs and exec on the third node, the pod network (pod to pod
//! across nodes, a Service and a StatefulSet's pod by name from every node), cordon / drain /
//! uncordon, a
//! node lost and its pods replaced, the node back and its stale pods cleaned up, and `delete`
//! leaving nothing behind.

#![cfg(test)]

mod common;

use std::time::Duration;

use common::multinode::MultiNode;
use common::{RANGES_STAY_LOCAL, TEST_EVICTION_HARD, eventually};

const DAEMONSET: &str = r#"
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: every-node}
spec:
  selector: {matchLabels: {app: every-node}}
  template:
    metadata: {labels: {app: every-node}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: c
        image: busybox:latest
        imagePullPolicy: Never
        command: ["sleep", "3600"]
"#;

/// Three replicas, at most one more on any node than on another; nodes that are cordoned or
/// tainted do not count (`nodeTaintsPolicy: Honor`).
const SPREAD: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: spread}
spec:
  replicas: 3
  selector: {matchLabels: {app: spread}}
  template:
    metadata: {labels: {app: spread}}
    spec:
      terminationGracePeriodSeconds: 1
      topologySpreadConstraints:
      - maxSkew: 1
        topologyKey: kubernetes.io/hostname
        whenUnsatisfiable: DoNotSchedule
        nodeTaintsPolicy: Honor
        labelSelector: {matchLabels: {app: spread}}
      containers:
      - name: c
        image: busybox:latest
        imagePullPolicy: Never
        command: ["sh", "-c", "echo started on $(hostname); exec httpd -f -p 8080 -h /etc"]
---
apiVersion: v1
kind: Service
metadata: {name: spread}
spec:
  selector: {app: spread}
  ports: [{port: 80, targetPort: 8080}]
"#;

/// A StatefulSet behind its headless Service, so its pod has the name `web-0.nginx`.
const WEB: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: nginx}
spec:
  clusterIP: None
  selector: {app: web}
  ports: [{port: 8080}]
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: web}
spec:
  serviceName: nginx
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 1
      nodeSelector: {kubernetes.io/hostname: e2e-control-plane}
      containers:
      - name: c
        image: busybox:latest
        imagePullPolicy: Never
        command: ["httpd", "-f", "-p", "8080", "-h", "/etc"]
"#;

/// A web server whose only endpoint is itself, on the third node.
const HAIRPIN: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: hairpin, labels: {app: hairpin}}
spec:
  nodeName: e2e-worker2
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: busybox:latest
    imagePullPolicy: Never
    command: ["httpd", "-f", "-p", "8080", "-h", "/etc"]
---
apiVersion: v1
kind: Service
metadata: {name: hairpin}
spec:
  selector: {app: hairpin}
  ports: [{port: 80, targetPort: 8080}]
"#;

/// `NAME NODE PHASE DELETING` of the pods labelled `app=APP`.
fn pods(m: &MultiNode, app: &str) -> Vec<(String, String, String, bool)> {
    let out = m.k(&[
        "get",
        "pods",
        "-l",
        &format!("app={app}"),
        "-o",
        "jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName} {.status.phase} {.metadata.deletionTimestamp}{\"\\n\"}{end}",
    ]);
    out.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            Some((
                w.next()?.to_string(),
                w.next().unwrap_or("").to_string(),
                w.next().unwrap_or("").to_string(),
                w.next().is_some(),
            ))
        })
        .collect()
}

/// Waits until `want` holds of the pods of `app`; the failure shows them.
fn wait_pods(m: &MultiNode, app: &str, what: &str, want: impl Fn(&[(String, String, String, bool)]) -> bool) {
    let ok = eventually(Duration::from_secs(90), || want(&pods(m, app)).then_some(()));
    assert!(
        ok.is_some(),
        "{what}:\n{}\n{}",
        m.k(&["get", "pods", "-o", "wide"]),
        m.k(&["get", "nodes", "-o", "wide"])
    );
}

fn node_field(m: &MultiNode, node: &str, path: &str) -> String {
    m.k(&["get", "node", node, "-o", &format!("jsonpath={{{path}}}")])
}

fn ready_status(m: &MultiNode, node: &str) -> String {
    node_field(m, node, ".status.conditions[?(@.type==\"Ready\")].status")
}

#[test]
fn three_nodes_on_one_machine() {
    let m = MultiNode::create(
        3,
        &[
            "--node-monitor-period=1s",
            "--node-monitor-grace-period=15s",
            "--default-not-ready-toleration-seconds=5",
            "--default-unreachable-toleration-seconds=5",
        ],
        &[&format!("--eviction-hard={TEST_EVICTION_HARD}")],
    );
    eprintln!("skiff cluster create --nodes 3: {:.1} s", m.created_in.as_secs_f64());
    // Each long step said what it was doing and how long it took.
    for step in [
        "cluster e2e: saving busybox:latest",
        "cluster e2e: starting 3 Docker engines, one per node, and loading the images into them: done in",
        "cluster e2e: starting the control plane on e2e-control-plane: done in",
        "cluster e2e: waiting for 3 nodes to be Ready: done in",
    ] {
        assert!(m.create_log.contains(step), "no {step:?} in:\n{}", m.create_log);
    }
    let nodes = m.nodes();
    let [cp, worker, worker2] = [&nodes[0], &nodes[1], &nodes[2]];
    assert_eq!(
        nodes,
        ["e2e-control-plane", "e2e-worker", "e2e-worker2"],
        "nodes are named as kind names them"
    );

    // Every node Ready, on an address of the cluster's network of its own, under its own name.
    for (i, node) in nodes.iter().enumerate() {
        assert_eq!(ready_status(&m, node), "True", "{node}");
        let ip = node_field(&m, node, ".status.addresses[?(@.type==\"InternalIP\")].address");
        assert_eq!(ip, format!("172.29.{}.{}", m.index(), i + 1), "{node}'s InternalIP");
        let hostname = node_field(&m, node, ".status.addresses[?(@.type==\"Hostname\")].address");
        assert_eq!(&hostname, node, "{node}'s hostname");
        // Its engine is its own: it knows the node's name as its host's.
        let engine = m.docker(i + 1, &["info", "--format", "{{.Name}}"]);
        assert_eq!(engine.trim(), node, "node {node}'s engine");
    }
    // The workers joined with the server's token, as upstream's TLS bootstrap: each asked for
    // its node certificate, approved and issued, as its bootstrap token's user.
    let csrs = m.k(&[
        "get",
        "csr",
        "-o",
        "jsonpath={range .items[*]}{.spec.username} {.spec.signerName} {.status.conditions[0].type} {.status.certificate}{\"\\n\"}{end}",
    ]);
    let joined: Vec<&str> = csrs
        .lines()
        .filter(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w.len() == 4
                && w[0].starts_with("system:bootstrap:")
                && w[1] == "kubernetes.io/kube-apiserver-client-kubelet"
                && w[2] == "Approved"
                && !w[3].is_empty()
        })
        .collect();
    assert_eq!(joined.len(), 2, "{csrs}");
    // A wrong token, or an expired one, joins nothing: the agent says why and exits, and no
    // Node appears.
    let server = format!("https://172.29.{}.1:6443", m.index());
    let token_file = m
        .home
        .path()
        .join(".skiff/clusters/e2e/nodes/e2e-control-plane/skiff/server/token");
    let token = std::fs::read_to_string(&token_file).expect("the join token");
    let (pinned, bearer) = token.trim().rsplit_once("::").expect("K10HASH::ID.SECRET");
    let (id, _) = bearer.split_once('.').expect("ID.SECRET");
    let created = m.skiff(&[
        "token",
        "create",
        "--ttl",
        "1s",
        "--kubeconfig",
        &m.kubeconfig.display().to_string(),
    ]);
    assert!(created.status.success(), "{}", String::from_utf8_lossy(&created.stderr));
    let expired = String::from_utf8_lossy(&created.stdout).trim().to_string();
    std::thread::sleep(Duration::from_millis(1500));
    for refused in [format!("{pinned}::{id}.0000000000000000"), expired] {
        let data = tempfile::tempdir().expect("agent data dir");
        let out = std::process::Command::new(common::skiff_bin())
            .args([
                "agent",
                "--server",
                &server,
                "--node-name",
                "e2e-intruder",
                "--data-dir",
            ])
            .arg(data.path())
            .env("SKIFF_TOKEN", &refused)
            .env("RUST_BACKTRACE", "0")
            .output()
            .expect("skiff agent");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("refused the join token (401"),
            "{refused}: {err}"
        );
    }
    assert!(
        m.kubectl(&["get", "node", "e2e-intruder"])
            .stderr
            .starts_with(b"Error from server (NotFound)"),
        "a refused agent registered its node"
    );
    let listed = m.list();
    assert!(listed.contains("e2e") && listed.contains("3/3"), "{listed}");

    // A DaemonSet runs a pod on every node.
    m.apply(DAEMONSET);
    wait_pods(&m, "every-node", "a Running DaemonSet pod on each node", |p| {
        let mut on: Vec<&str> = p.iter().filter(|x| x.2 == "Running").map(|x| x.1.as_str()).collect();
        on.sort();
        on == [cp.as_str(), worker.as_str(), worker2.as_str()]
    });

    // Pods spread over the nodes, one each.
    m.apply(SPREAD);
    wait_pods(&m, "spread", "one Running spread pod on each node", |p| {
        let mut on: Vec<&str> = p.iter().filter(|x| x.2 == "Running").map(|x| x.1.as_str()).collect();
        on.sort();
        on == [cp.as_str(), worker.as_str(), worker2.as_str()]
    });

    // Logs and exec reach the third node's agent through the API server.
    let on_worker2 = pods(&m, "spread")
        .into_iter()
        .find(|p| &p.1 == worker2)
        .map(|p| p.0)
        .expect("a spread pod on the third node");
    let logs = eventually(Duration::from_secs(20), || {
        let l = m.k(&["logs", &on_worker2]);
        l.contains("started on").then_some(l)
    });
    assert_eq!(
        logs.as_deref().map(str::trim),
        Some(format!("started on {on_worker2}").as_str())
    );
    let exec = m.k(&[
        "exec",
        &on_worker2,
        "--",
        "sh",
        "-c",
        "echo $((6 * 7)) from $(hostname)",
    ]);
    assert_eq!(exec.trim(), format!("42 from {on_worker2}"));

    // A pod reaches itself through its own Service: the node's agent put the pod's port of the
    // node's bridge in hairpin mode, which it finds in the node's own /sys.
    m.apply(HAIRPIN);
    wait_pods(&m, "hairpin", "the hairpin pod Running on the third node", |p| {
        p.iter().any(|x| &x.1 == worker2 && x.2 == "Running")
    });
    let netns = format!("skiff{}-3", m.index());
    let stays = std::process::Command::new("ip")
        .args(["netns", "exec", &netns, RANGES_STAY_LOCAL, "10.96.0.0/12"])
        .output()
        .expect("ranges-stay-local.sh");
    assert!(stays.status.success(), "{stays:?}");
    let answered = eventually(Duration::from_secs(30), || {
        let out = m.kubectl(&[
            "exec",
            "hairpin",
            "--",
            "wget",
            "-q",
            "-O-",
            "http://hairpin.default.svc.cluster.local/hostname",
        ]);
        String::from_utf8_lossy(&out.stdout).contains("hairpin").then_some(())
    });
    assert!(
        answered.is_some(),
        "no answer through the pod's own Service\n{}",
        m.log(worker2)
    );

    // The pod network: every node has a podCIDR of its own and its pods' addresses are in it; no
    // address of the range leaves any node, nor the host.
    let mut cidrs = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        let cidr = node_field(&m, node, ".spec.podCIDR");
        assert!(
            cidr.starts_with("10.244.") && cidr.ends_with(".0/24"),
            "{node}: {cidr:?}"
        );
        cidrs.push(cidr);
        // Other nodes' podCIDRs go through them (host-gw, on the cluster's own network); an
        // address no node owns goes nowhere.
        let route = std::process::Command::new("ip")
            .args(["netns", "exec", &format!("skiff{}-{}", m.index(), i + 1)])
            .args(["ip", "route", "get", "10.244.255.254"])
            .output()
            .expect("ip route get");
        let route = String::from_utf8_lossy(&route.stdout).to_string() + &String::from_utf8_lossy(&route.stderr);
        assert!(
            route.contains("unreachable") || route.contains("No route to host"),
            "{node}: {route}"
        );
    }
    cidrs.sort();
    cidrs.dedup();
    assert_eq!(cidrs.len(), 3, "podCIDRs are not distinct: {cidrs:?}");
    // The host's check is of the pod range only: the service range is routed by an agent's proxy,
    // and none runs on the host here.
    let host = std::process::Command::new(RANGES_STAY_LOCAL)
        .arg("10.244.0.0/16")
        .output()
        .expect("ranges-stay-local.sh");
    assert!(host.status.success(), "the host: {host:?}");
    let pod_ip = |name: &str| m.k(&["get", "pod", name, "-o", "jsonpath={.status.podIP}"]);
    let clients: Vec<(String, String)> = pods(&m, "every-node").into_iter().map(|p| (p.0, p.1)).collect();
    assert_eq!(clients.len(), 3);
    for (client, node) in &clients {
        let cidr = node_field(&m, node, ".spec.podCIDR");
        let ip = pod_ip(client);
        assert!(
            ip.starts_with(cidr.trim_end_matches("0/24")),
            "{client} on {node} has {ip}, outside {cidr}"
        );
    }
    // Pod to pod by address, from every node to the third node's pod.
    let target = pod_ip("hairpin");
    let fetch = |client: &str, url: &str| {
        let out = m.kubectl(&["exec", client, "--", "timeout", "5", "wget", "-q", "-O-", url]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    for (client, node) in &clients {
        let got = eventually(Duration::from_secs(30), || {
            (fetch(client, &format!("http://{target}:8080/hostname")) == "hairpin").then_some(())
        });
        assert!(
            got.is_some(),
            "{client} on {node} did not reach {target}\n{}",
            m.log(node)
        );
    }
    // A Service whose replicas are on the three nodes, by name from every node (each node's own
    // DNS): every replica answers every node.
    let replicas: std::collections::BTreeSet<String> = pods(&m, "spread").into_iter().map(|p| p.0).collect();
    for (client, node) in &clients {
        let mut seen = std::collections::BTreeSet::new();
        let all = eventually(Duration::from_secs(60), || {
            let name = fetch(client, "http://spread.default.svc.cluster.local/hostname");
            if !name.is_empty() {
                seen.insert(name);
            }
            (seen == replicas).then_some(())
        });
        assert!(all.is_some(), "{client} on {node} reached {seen:?} of {replicas:?}");
    }
    // A StatefulSet's pod by its stable name, from the other nodes.
    m.apply(WEB);
    wait_pods(&m, "web", "web-0 Running", |p| {
        p.iter().any(|x| x.0 == "web-0" && x.2 == "Running")
    });
    for (client, node) in clients.iter().filter(|c| &c.1 != cp) {
        let got = eventually(Duration::from_secs(30), || {
            (fetch(client, "http://web-0.nginx.default.svc.cluster.local:8080/hostname") == "web-0").then_some(())
        });
        assert!(got.is_some(), "{client} on {node} did not reach web-0.nginx");
    }

    // Cordon, drain, uncordon: the worker's spread pod moves to the others, its DaemonSet pod
    // stays; once uncordoned it takes pods again.
    let drained = m.k(&[
        "drain",
        worker,
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        "--timeout=90s",
    ]);
    assert!(drained.contains("drained"), "{drained}");
    assert_eq!(node_field(&m, worker, ".spec.unschedulable"), "true");
    wait_pods(&m, "spread", "the drained worker's spread pod Running elsewhere", |p| {
        let live: Vec<_> = p.iter().filter(|x| !x.3).collect();
        live.len() == 3 && live.iter().all(|x| x.2 == "Running" && &x.1 != worker)
    });
    assert!(
        pods(&m, "every-node").iter().any(|p| &p.1 == worker),
        "drain leaves DaemonSet pods"
    );
    m.k(&["uncordon", worker]);
    assert_eq!(node_field(&m, worker, ".spec.unschedulable"), "");
    // The spread moves back as pods are replaced: delete one on the crowded node.
    let crowded = pods(&m, "spread")
        .into_iter()
        .filter(|p| !p.3)
        .fold(
            std::collections::BTreeMap::<String, Vec<String>>::new(),
            |mut acc, p| {
                acc.entry(p.1).or_default().push(p.0);
                acc
            },
        )
        .into_values()
        .find(|v| v.len() > 1)
        .expect("a node with two spread pods");
    m.k(&["delete", "pod", &crowded[0], "--wait=false"]);
    wait_pods(&m, "spread", "a spread pod back on the uncordoned worker", |p| {
        p.iter().any(|x| !x.3 && &x.1 == worker && x.2 == "Running")
    });

    // The third node loses power: NotReady, then tainted unreachable; its spread pod is evicted
    // after the 5 s the pods tolerate that (the server's default, shortened) and replaced on a
    // live node. Its DaemonSet pod, which tolerates it, is force-deleted meanwhile.
    let lost = pods(&m, "spread")
        .into_iter()
        .find(|p| !p.3 && &p.1 == worker2)
        .map(|p| p.0)
        .expect("a spread pod on the third node");
    let lost_uid = m.k(&["get", "pod", &lost, "-o", "jsonpath={.metadata.uid}"]);
    let tolerated = m.k(&[
        "get",
        "pod",
        &lost,
        "-o",
        "jsonpath={.spec.tolerations[?(@.key==\"node.kubernetes.io/unreachable\")].tolerationSeconds}",
    ]);
    assert_eq!(tolerated, "5", "the server's --default-unreachable-toleration-seconds");
    let ds_on_worker2 = pods(&m, "every-node")
        .into_iter()
        .find(|p| &p.1 == worker2)
        .map(|p| p.0)
        .expect("a DaemonSet pod on the third node");
    let ds_uid = m.k(&["get", "pod", &ds_on_worker2, "-o", "jsonpath={.metadata.uid}"]);
    m.cluster(&["node", "stop", worker2]);
    assert!(m.list().contains("2/3"));
    let unknown = eventually(Duration::from_secs(60), || {
        (ready_status(&m, worker2) == "Unknown").then_some(())
    });
    assert!(unknown.is_some(), "{}", m.k(&["describe", "node", worker2]));
    let tainted = eventually(Duration::from_secs(30), || {
        node_field(&m, worker2, ".spec.taints[*].key")
            .contains("node.kubernetes.io/unreachable")
            .then_some(())
    });
    assert!(tainted.is_some(), "{}", m.k(&["describe", "node", worker2]));
    wait_pods(
        &m,
        "spread",
        "the lost node's pod evicted and replaced on a live node",
        |p| {
            let live: Vec<_> = p.iter().filter(|x| !x.3).collect();
            p.iter().any(|x| x.0 == lost && x.3)
                && live.len() == 3
                && live.iter().all(|x| x.2 == "Running" && &x.1 != worker2)
        },
    );
    m.k(&["delete", "pod", &ds_on_worker2, "--force", "--grace-period=0"]);

    // Back: Ready again, the evicted pod's deletion finished by its agent, the force-deleted
    // pod's containers removed, and a new DaemonSet pod running there.
    m.cluster(&["node", "start", worker2]);
    assert_eq!(ready_status(&m, worker2), "True");
    let gone = eventually(Duration::from_secs(60), || {
        m.kubectl(&["get", "pod", &lost])
            .stderr
            .starts_with(b"Error from server (NotFound)")
            .then_some(())
    });
    assert!(
        gone.is_some(),
        "{}\n{}",
        m.k(&["get", "pods", "-o", "wide"]),
        m.log(worker2)
    );
    for uid in [&lost_uid, &ds_uid] {
        let stale = eventually(Duration::from_secs(30), || {
            let left = m.docker(
                3,
                &["ps", "-aq", "--filter", &format!("label=io.kubernetes.pod.uid={uid}")],
            );
            left.trim().is_empty().then_some(())
        });
        assert!(
            stale.is_some(),
            "containers of pod {uid} left on the node:\n{}",
            m.docker(3, &["ps", "-a"])
        );
    }
    wait_pods(&m, "every-node", "a new DaemonSet pod Running on the node back", |p| {
        p.iter()
            .any(|x| &x.1 == worker2 && x.2 == "Running" && x.0 != ds_on_worker2)
    });
    assert!(
        eventually(Duration::from_secs(30), || {
            (!node_field(&m, worker2, ".spec.taints[*].key").contains("unreachable")).then_some(())
        })
        .is_some(),
        "the unreachable taint stays on a Ready node"
    );

    // Delete leaves nothing: no process, namespace, interface, route, mount, cgroup or file.
    let deleted = m.cluster(&["delete"]);
    assert!(deleted.contains("deleted"), "{deleted}");
    let left = m.leftovers();
    assert!(left.is_empty(), "left behind: {left:#?}");
    // Again: nothing to do.
    let again = m.cluster(&["delete"]);
    assert!(again.contains("no cluster"), "{again}");
}

#[test]
fn cluster_commands_refuse_what_they_cannot_do() {
    let home = tempfile::tempdir().expect("home");
    let skiff = |args: &[&str]| {
        std::process::Command::new(common::skiff_bin())
            .args(args)
            .env("HOME", home.path())
            .output()
            .expect("skiff")
    };
    let err = |args: &[&str]| {
        let out = skiff(args);
        assert!(!out.status.success(), "{args:?} succeeded");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert!(err(&["cluster", "create", "--name", "Bad_Name"]).contains("invalid cluster name"));
    assert!(err(&["cluster", "create", "--nodes", "0"]).contains("1 to 100 nodes"));
    assert!(err(&["cluster", "node", "stop", "x-worker", "--name", "x"]).contains("no cluster \"x\""));
    // A creation that fails half-way (here: an image the host's engine does not have) removes
    // what it made.
    let failed = err(&["cluster", "create", "--name", "half", "--image", "no-such-image:1"]);
    assert!(failed.contains("saving the local images"), "{failed}");
    // Nothing was made by any of them.
    let made = std::fs::read_dir(home.path().join(".skiff/clusters")).map_or(0, |d| d.count());
    assert_eq!(made, 0, "a refused command left a cluster directory");
    let listed = skiff(&["cluster", "list"]);
    assert_eq!(String::from_utf8_lossy(&listed.stdout).trim(), "No clusters found.");
    let deleted = skiff(&["cluster", "delete", "--name", "absent"]);
    assert!(deleted.status.success());
    assert!(String::from_utf8_lossy(&deleted.stdout).contains("no cluster absent"));
}
