//! Services end to end with the real kubectl on `skiff server --no-agent --sim-nodes 2`: ClusterIP
//! and NodePort allocation with upstream's refusals, the cluster's own Services, EndpointSlices
//! and Endpoints that follow the pods, and allocations kept across a kill -9.

#![cfg(test)]

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{Cluster, eventually};
use serde_json::Value;

fn cluster() -> Cluster {
    // The default range, whose addresses the test names; no node agent, so no proxy on this host.
    let c = Cluster::start(&[
        "--no-agent",
        "--sim-nodes",
        "2",
        "--service-cluster-ip-range",
        "10.96.0.0/12",
    ]);
    let ready = eventually(Duration::from_secs(30), || {
        (c.k(&["get", "nodes"]).matches(" Ready ").count() == 2).then_some(())
    });
    assert!(ready.is_some(), "nodes not Ready: {}", c.k(&["get", "nodes"]));
    c
}

fn items(v: &Value) -> Vec<Value> {
    v["items"].as_array().cloned().unwrap_or_default()
}

/// The addresses of the Service's EndpointSlices with the given ready condition, and their ports.
fn slice_addresses(c: &Cluster, svc: &str, ready: bool) -> (BTreeSet<String>, BTreeSet<i64>) {
    let slices = c.get_json(&["endpointslices", "-l", &format!("kubernetes.io/service-name={svc}")]);
    let mut ips = BTreeSet::new();
    let mut ports = BTreeSet::new();
    for s in items(&slices) {
        for p in s["ports"].as_array().into_iter().flatten() {
            ports.insert(p["port"].as_i64().unwrap_or(0));
        }
        for e in s["endpoints"].as_array().into_iter().flatten() {
            if e["conditions"]["ready"].as_bool() == Some(ready) {
                ips.insert(e["addresses"][0].as_str().unwrap_or_default().to_string());
            }
        }
    }
    (ips, ports)
}

fn pod_ips(c: &Cluster, selector: &str) -> BTreeSet<String> {
    items(&c.get_json(&["pods", "-l", selector]))
        .iter()
        .filter_map(|p| p["status"]["podIP"].as_str().map(str::to_string))
        .filter(|ip| !ip.is_empty())
        .collect()
}

#[test]
fn services_get_addresses_and_endpoints_that_follow_their_pods() {
    let mut c = cluster();
    // The cluster's own Services, as upstream's API server and kubeadm's DNS addon make them.
    let svcs = c.k(&["get", "svc", "-A"]);
    assert!(
        svcs.contains("kubernetes   ClusterIP   10.96.0.1    <none>        443/TCP"),
        "{svcs}"
    );
    assert!(
        svcs.contains("kube-dns     ClusterIP   10.96.0.10   <none>        53/UDP,53/TCP"),
        "{svcs}"
    );
    let ep = c.get_json(&["endpoints", "kubernetes"]);
    assert_eq!(ep["subsets"][0]["ports"][0]["port"].as_i64(), Some(i64::from(c.port)));
    let ips = c.k(&["get", "ipaddresses"]);
    assert!(ips.contains("10.96.0.1    services/default/kubernetes"), "{ips}");
    assert!(c.k(&["get", "servicecidrs"]).contains("10.96.0.0/12"));

    c.k(&[
        "create",
        "deployment",
        "web",
        "--image=busybox:latest",
        "--replicas=3",
        "--port=8080",
        "--",
        "sleep",
        "3600",
    ]);
    c.k(&[
        "expose",
        "deployment",
        "web",
        "--port",
        "80",
        "--target-port",
        "8080",
        "--type",
        "NodePort",
    ]);
    let svc = c.get_json(&["svc", "web"]);
    let ip = svc["spec"]["clusterIP"].as_str().unwrap_or_default().to_string();
    assert!(ip.starts_with("10.") && ip != "10.96.0.1", "{svc}");
    assert_eq!(svc["spec"]["clusterIPs"][0].as_str(), Some(ip.as_str()));
    let node_port = svc["spec"]["ports"][0]["nodePort"].as_i64().unwrap_or(0);
    assert!((30000..=32767).contains(&node_port), "{svc}");
    assert_eq!(svc["status"]["loadBalancer"], serde_json::json!({}));
    assert!(c.k(&["get", "ipaddress", &ip]).contains("services/default/web"));
    // The create's own answer carries upstream's empty status too (clients read it there).
    let created: Value =
        serde_json::from_str(&c.k(&["create", "service", "clusterip", "bare", "--tcp=80", "-o", "json"]))
            .expect("json");
    assert_eq!(created["status"], serde_json::json!({"loadBalancer": {}}), "{created}");

    // The slices list every running pod, on the target port.
    let want = eventually(Duration::from_secs(40), || {
        let pods = pod_ips(&c, "app=web");
        let (ready, ports) = slice_addresses(&c, "web", true);
        (pods.len() == 3 && ready == pods && ports == BTreeSet::from([8080])).then_some(pods)
    })
    .unwrap_or_else(|| panic!("slices: {}", c.k(&["get", "endpointslices", "-o", "yaml"])));
    let endpoints = c.get_json(&["endpoints", "web"]);
    let legacy: BTreeSet<String> = endpoints["subsets"][0]["addresses"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a["ip"].as_str().map(str::to_string))
        .collect();
    assert_eq!(legacy, want, "{endpoints}");
    let table = c.k(&["get", "endpointslices", "-l", "kubernetes.io/service-name=web"]);
    assert!(table.contains("IPv4") && table.contains("8080"), "{table}");
    let explain = |svc: &str| {
        let out = std::process::Command::new(common::skiff_bin())
            .args(["explain", "service", svc, "--kubeconfig"])
            .arg(&c.kubeconfig)
            .output()
            .expect("skiff explain");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let text = explain("web");
    assert!(
        text.contains("selects 3 pod(s): 3 ready, 0 not ready, 0 without an address"),
        "{text}"
    );
    // And what cluster DNS answers for it.
    assert!(
        text.contains(&format!(
            "    web.default.svc.cluster.local A:\n      web.default.svc.cluster.local. A {ip}\n"
        )),
        "{text}"
    );
    // A Service whose selector nearly matches says which label is off.
    c.k(&["create", "service", "clusterip", "typo", "--tcp=80"]);
    c.k(&["set", "selector", "svc", "typo", "app=webb"]);
    let text = explain("typo");
    assert!(text.contains("lacks app=webb (the pod has app=web)"), "{text}");

    // Scaled to one, then to none: the slices follow, down to the placeholder.
    c.k(&["scale", "deployment", "web", "--replicas=1"]);
    let one = eventually(Duration::from_secs(40), || {
        let (ready, _) = slice_addresses(&c, "web", true);
        (ready.len() == 1).then_some(ready)
    });
    assert!(one.is_some(), "{}", c.k(&["get", "endpointslices", "-o", "yaml"]));
    c.k(&["scale", "deployment", "web", "--replicas=0"]);
    let empty = eventually(Duration::from_secs(40), || {
        let slices = items(&c.get_json(&["endpointslices", "-l", "kubernetes.io/service-name=web"]));
        (slices.len() == 1 && slices[0]["endpoints"].as_array().is_none_or(|e| e.is_empty())).then_some(())
    });
    assert!(empty.is_some(), "{}", c.k(&["get", "endpointslices", "-o", "yaml"]));

    // Refusals in upstream's words.
    let err = c.k_err(&[
        "create",
        "service",
        "clusterip",
        "dup",
        "--tcp=80",
        &format!("--clusterip={ip}"),
    ]);
    assert!(
        err.contains(&format!(
            "spec.clusterIPs: Invalid value: []string{{\"{ip}\"}}: failed to allocate IP {ip}: provided IP is already allocated"
        )),
        "{err}"
    );
    let err = c.k_err(&[
        "create",
        "service",
        "clusterip",
        "far",
        "--tcp=80",
        "--clusterip=192.168.0.1",
    ]);
    assert!(err.contains("The range of valid IPs is 10.96.0.0/12"), "{err}");
    let err = c.k_err(&[
        "create",
        "service",
        "nodeport",
        "np",
        "--tcp=80",
        &format!("--node-port={node_port}"),
    ]);
    assert!(
        err.contains(&format!(
            "spec.ports[0].nodePort: Invalid value: {node_port}: provided port is already allocated"
        )),
        "{err}"
    );
    let err = c.k_err(&["create", "service", "nodeport", "np", "--tcp=80", "--node-port=80"]);
    assert!(err.contains("The range of valid ports is 30000-32767"), "{err}");
    // A refused create leaves nothing allocated.
    assert!(!c.k(&["get", "ipaddresses"]).contains("services/default/dup"));

    // Headless never allocates; an ExternalName change releases the address.
    c.k(&[
        "create",
        "service",
        "clusterip",
        "nginx",
        "--clusterip=None",
        "--tcp=80",
    ]);
    assert_eq!(
        c.get_json(&["svc", "nginx"])["spec"]["clusterIPs"],
        serde_json::json!(["None"])
    );
    c.k(&["create", "service", "clusterip", "moving", "--tcp=80"]);
    let moving_ip = c.get_json(&["svc", "moving"])["spec"]["clusterIP"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    c.k(&[
        "patch",
        "svc",
        "moving",
        "--type=merge",
        "-p",
        r#"{"spec":{"type":"ExternalName","externalName":"example.test","clusterIP":"","clusterIPs":null,"ports":null}}"#,
    ]);
    assert!(
        !c.k(&["get", "ipaddresses"]).contains(&moving_ip),
        "the address was released"
    );

    // kill -9 and restart: every address and port is kept, and still held.
    c.restart();
    let svc = c.get_json(&["svc", "web"]);
    assert_eq!(svc["spec"]["clusterIP"].as_str(), Some(ip.as_str()));
    assert_eq!(svc["spec"]["ports"][0]["nodePort"].as_i64(), Some(node_port));
    let err = c.k_err(&[
        "create",
        "service",
        "clusterip",
        "dup",
        "--tcp=80",
        &format!("--clusterip={ip}"),
    ]);
    assert!(err.contains("provided IP is already allocated"), "{err}");

    // Deleting the Service releases its address and port for the next one.
    c.k(&["delete", "svc", "web"]);
    assert!(!c.k(&["get", "ipaddresses"]).contains("services/default/web"));
    c.k(&[
        "create",
        "service",
        "nodeport",
        "again",
        "--tcp=80",
        &format!("--node-port={node_port}"),
    ]);
    c.k(&[
        "create",
        "service",
        "clusterip",
        "reuse",
        "--tcp=80",
        &format!("--clusterip={ip}"),
    ]);
    let gone = eventually(Duration::from_secs(20), || {
        items(&c.get_json(&["endpointslices", "-l", "kubernetes.io/service-name=web"]))
            .is_empty()
            .then_some(())
    });
    assert!(gone.is_some(), "the deleted Service's slices go");
}
