//! The pod network: the node IPAM controller's podCIDRs and the node agent's bridge, routes and
//! safety route, with `skiff server`, real Docker and the real kubectl.
//!
//! Before any traffic goes to a pod address, `ranges-stay-local.sh` must say that no address of
//! the cluster CIDR leaves this machine. Traffic goes only to pods on this machine's Docker.

#![cfg(test)]

mod common;

use std::process::Command;
use std::time::Duration;

use common::node::{CLIENT, Node};
use common::{Cluster, eventually, tail};

const CLUSTER_CIDR: &str = "10.244.0.0/16";

const SERVER: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: server
  labels: {app: server}
spec:
  terminationGracePeriodSeconds: 0
  containers:
  - name: httpd
    image: busybox:latest
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "mkdir -p /www && hostname > /www/index.html && exec httpd -f -p 8080 -h /www"]
    ports:
    - {name: http, containerPort: 8080}
"#;

/// Whether `ip` is in 10.244.0.0/24.
fn in_first_pod_cidr(ip: &str) -> bool {
    ip.parse::<std::net::Ipv4Addr>()
        .is_ok_and(|a| a.octets()[..3] == [10, 244, 0] && a.octets()[3] > 1)
}

#[test]
fn pods_get_addresses_of_their_nodes_pod_cidr_and_reach_each_other() {
    let n = Node::start("podnet", &[]);
    let pod_cidr = n.c.k(&[
        "get",
        "node",
        &n.name,
        "-o",
        "jsonpath={.spec.podCIDR} {.spec.podCIDRs}",
    ]);
    assert_eq!(pod_cidr, "10.244.0.0/24 [\"10.244.0.0/24\"]");

    // The whole cluster CIDR stays here: an address no node owns has no gateway.
    n.assert_range_stays_local(CLUSTER_CIDR);
    let route = Command::new("ip")
        .args(["route", "get", "10.244.200.9"])
        .output()
        .expect("ip route get");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&route.stdout),
        String::from_utf8_lossy(&route.stderr)
    );
    assert!(!text.contains(" via "), "{text}");
    let routes = Command::new("ip")
        .args(["-4", "route", "show", "proto", "83"])
        .output()
        .expect("ip route show");
    assert!(
        String::from_utf8_lossy(&routes.stdout).contains("unreachable 10.244.0.0/16"),
        "{routes:?}"
    );

    n.c.apply(SERVER, &[]);
    n.c.apply(CLIENT, &[]);
    n.c.k(&["expose", "pod", "server", "--port", "80", "--target-port", "http"]);
    n.wait_running("server");
    n.wait_running("client");
    let server_ip = n.field("server", ".status.podIP");
    let server_ips = n.field("server", ".status.podIPs[*].ip");
    assert!(in_first_pod_cidr(&server_ip), "{server_ip}");
    assert_eq!(server_ips, server_ip);
    let client_ip = n.field("client", ".status.podIP");
    assert!(in_first_pod_cidr(&client_ip), "{client_ip}");

    // The sandboxes sit on the Docker network of the podCIDR, with Docker's masquerade off.
    let network = Command::new("docker")
        .args([
            "network",
            "inspect",
            "skiff-10.244.0.0-24",
            "--format",
            "{{(index .IPAM.Config 0).Subnet}} {{index .Options \"com.docker.network.bridge.enable_ip_masquerade\"}}",
        ])
        .output()
        .expect("docker network inspect");
    assert_eq!(String::from_utf8_lossy(&network.stdout).trim(), "10.244.0.0/24 false");

    // Pod to pod, by address.
    let (body, ok) = n.sh("client", &format!("timeout 10 wget -qO- http://{server_ip}:8080/"));
    assert!(ok && body.trim() == "server", "{body}");
    // Pod to Service, by name (cluster DNS on the bridge's gateway, then the proxy).
    let ok = eventually(Duration::from_secs(20), || {
        let (body, ok) = n.sh("client", "timeout 10 wget -qO- http://server/");
        (ok && body.trim() == "server").then_some(())
    });
    assert!(
        ok.is_some(),
        "{:?}",
        n.sh("client", "timeout 10 wget -qO- http://server/")
    );
    let cluster_ip = n.c.k(&["get", "svc", "server", "-o", "jsonpath={.spec.clusterIP}"]);
    let (answer, ok) = n.sh("client", "nslookup server.default.svc.cluster.local");
    assert!(ok && answer.contains(&cluster_ip), "{answer}");
    let dns =
        n.c.get_json(&["endpointslices", "-n", "kube-system", &format!("kube-dns-{}", n.name)]);
    assert_eq!(dns["endpoints"][0]["addresses"][0], "10.244.0.1", "{dns}");

    // An address of the node's podCIDR that no pod has is refused, not sent anywhere else.
    let (out, ok) = n.sh("client", "timeout 5 wget -qO- http://10.244.3.3:8080/");
    assert!(!ok, "{out}");
}

const NODE: &str = "apiVersion: v1\nkind: Node\nmetadata:\n  name: NAME\n";

fn create_node(c: &Cluster, name: &str) {
    c.stdin_kubectl(&["create", "-f", "-"], &NODE.replace("NAME", name));
}

fn pod_cidr(c: &Cluster, name: &str) -> String {
    c.k(&["get", "node", name, "-o", "jsonpath={.spec.podCIDR}"])
}

fn wait_pod_cidr(c: &Cluster, name: &str) -> String {
    eventually(Duration::from_secs(20), || {
        Some(pod_cidr(c, name)).filter(|p| !p.is_empty())
    })
    .unwrap_or_else(|| panic!("{name} got no podCIDR\n{}", tail(&c.log(), 30)))
}

#[test]
fn node_pod_cidrs_are_allocated_once_and_released_with_their_node() {
    let c = Cluster::start(&[
        "--no-agent",
        "--cluster-cidr",
        "10.244.0.0/23",
        "--node-cidr-mask-size",
        "24",
    ]);
    create_node(&c, "n1");
    create_node(&c, "n2");
    let first = wait_pod_cidr(&c, "n1");
    let second = wait_pod_cidr(&c, "n2");
    let mut both = [first.clone(), second.clone()];
    both.sort();
    assert_eq!(both, ["10.244.0.0/24", "10.244.1.0/24"]);

    // A podCIDR is set once.
    let out = c.k_err(&[
        "patch",
        "node",
        "n1",
        "-p",
        r#"{"spec":{"podCIDRs":["10.244.9.0/24"]}}"#,
    ]);
    assert!(
        out.contains(r#"spec.podCIDRs: Forbidden: node updates may not change podCIDR except from "" to valid"#),
        "{out}"
    );

    // The range is exhausted: the third node is told once, and waits.
    create_node(&c, "n3");
    c.wait_event(
        "Node",
        "n3",
        "CIDRNotAvailable",
        "Node n3 status is now: CIDRNotAvailable",
    );
    // Its updates do not make the controller try (and tell) again.
    c.k(&["label", "node", "n3", "touched=yes"]);
    std::thread::sleep(Duration::from_secs(2));
    let told = c.get_json(&[
        "events",
        "--field-selector",
        "involvedObject.name=n3,reason=CIDRNotAvailable",
    ]);
    let counts: Vec<i64> = told["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| e["count"].as_i64().unwrap_or(1))
        .collect();
    assert_eq!(counts, [1], "{told}");
    assert_eq!(pod_cidr(&c, "n3"), "");

    // n1 goes: its subnet is n3's.
    c.k(&["delete", "node", "n1"]);
    assert_eq!(wait_pod_cidr(&c, "n3"), first);

    // A restarted controller counts what the nodes hold: a new node gets nothing taken.
    let mut c = c;
    c.restart();
    create_node(&c, "n4");
    c.wait_event(
        "Node",
        "n4",
        "CIDRNotAvailable",
        "Node n4 status is now: CIDRNotAvailable",
    );
    c.k(&["delete", "node", "n2"]);
    assert_eq!(wait_pod_cidr(&c, "n4"), second);
}

#[test]
fn without_node_ipam_nodes_have_no_pod_cidr() {
    let c = Cluster::start(&["--no-agent", "--allocate-node-cidrs=false"]);
    create_node(&c, "plain");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(pod_cidr(&c, "plain"), "");
}
