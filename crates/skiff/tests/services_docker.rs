//! Services with real traffic: `skiff server` with its node agent on real Docker, driven by the
//! real kubectl. A user's first afternoon (`kubectl create deployment`, `kubectl expose`, then
//! `wget http://web` from another pod) and what follows from it: cluster DNS names, load spread
//! over the ready pods, readiness, hairpin, ClientIP affinity, NodePort on 127.0.0.1, ServiceLB,
//! seed 003's StatefulSet behind its headless Service, port-forward to a Service, a restart, and a
//! Service without endpoints refused at once.
//!
//! The cluster gets a service range of its own (the harness's `own_service_range`), and before any
//! traffic goes to it `ranges-stay-local.sh` must say that no address of it leaves this machine.
//! Traffic goes only to ClusterIPs, to pod addresses on Docker's bridge and to this machine's own
//! addresses.

#![cfg(test)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::{Duration, Instant};

use common::node::{CLIENT, Node};
use common::seeds::statefulset_web_on_busybox;
use common::{PortForward, eventually, http_get, tail};

const WEB: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 3
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: httpd
        image: busybox:latest
        imagePullPolicy: IfNotPresent
        command: ["sh", "-c", "mkdir -p /www && hostname > /www/index.html && echo ok > /www/healthz && exec httpd -f -p 8080 -h /www"]
        ports:
        - {name: http, containerPort: 8080}
        readinessProbe:
          httpGet: {path: /healthz, port: http}
          periodSeconds: 1
          failureThreshold: 1
"#;

/// `wget -qO- URL` in `pod`, bounded by busybox's `timeout` (its wget crashes given `-T`).
fn fetch(n: &Node, pod: &str, url: &str) -> (String, bool) {
    let (out, ok) = n.sh(pod, &format!("timeout 10 wget -qO- {url}"));
    (out.trim().to_string(), ok)
}

/// How many of `count` requests from `pod` to `url` each pod (by hostname) answered.
fn spread(n: &Node, pod: &str, url: &str, count: usize) -> BTreeMap<String, usize> {
    let script = format!("for i in $(seq {count}); do timeout 10 wget -qO- {url} || echo FAILED; done");
    let (out, ok) = n.sh(pod, &script);
    assert!(ok, "{script}: {out}");
    let mut hits = BTreeMap::new();
    for line in out.lines().map(str::trim).filter(|l| !l.is_empty()) {
        *hits.entry(line.to_string()).or_insert(0) += 1;
    }
    hits
}

fn pods(n: &Node, selector: &str) -> BTreeSet<String> {
    n.c.k(&[
        "get",
        "pods",
        "-l",
        selector,
        "-o",
        "jsonpath={.items[*].metadata.name}",
    ])
    .split_whitespace()
    .map(str::to_string)
    .collect()
}

/// Waits until `selector`'s pods are `count` and all Ready.
fn wait_ready_pods(n: &Node, selector: &str, count: usize) -> BTreeSet<String> {
    let ready = eventually(Duration::from_secs(90), || {
        let out = n.c.k(&[
            "get",
            "pods",
            "-l",
            selector,
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}{end}",
        ]);
        let lines: Vec<&str> = out.lines().filter(|l| !l.trim().is_empty()).collect();
        (lines.len() == count && lines.iter().all(|l| l.ends_with(" True"))).then(|| pods(n, selector))
    });
    ready.unwrap_or_else(|| {
        panic!(
            "{selector}: not {count} Ready pods:\n{}\n{}",
            n.c.k(&["get", "pods", "-o", "wide"]),
            tail(&n.c.log(), 40)
        )
    })
}

/// The ready addresses of a Service's EndpointSlices.
fn ready_endpoints(n: &Node, service: &str) -> BTreeSet<String> {
    let slices =
        n.c.get_json(&["endpointslices", "-l", &format!("kubernetes.io/service-name={service}")]);
    let mut ips = BTreeSet::new();
    for slice in slices["items"].as_array().into_iter().flatten() {
        for e in slice["endpoints"].as_array().into_iter().flatten() {
            if e["conditions"]["ready"].as_bool() == Some(true) {
                ips.insert(e["addresses"][0].as_str().unwrap_or_default().to_string());
            }
        }
    }
    ips
}

/// Whether `ip` is an address of this machine (traffic to it never leaves).
fn is_local_address(ip: &str) -> bool {
    let out = Command::new("ip").args(["route", "get", ip]).output();
    out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).starts_with("local "))
}

/// The body `curl` got from `url` on this machine, trimmed (empty when it got none).
fn curl(url: &str) -> String {
    let out = Command::new("curl").args(["-s", "--max-time", "5", url]).output();
    out.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn cluster_ip(n: &Node, service: &str) -> String {
    n.c.k(&["get", "svc", service, "-o", "jsonpath={.spec.clusterIP}"])
}

#[test]
fn services_carry_traffic_by_name_to_ready_pods() {
    let mut n = Node::start("svc", &[]);
    n.assert_range_stays_local(n.c.service_range.as_deref().expect("the cluster's own service range"));
    n.c.apply(WEB, &[]);
    n.c.apply(CLIENT, &[]);
    n.c.k(&["expose", "deployment", "web", "--port", "80", "--target-port", "http"]);
    let web = wait_ready_pods(&n, "app=web", 3);
    n.wait_running("client");
    let ip = cluster_ip(&n, "web");
    let range = n.c.service_range.clone().unwrap_or_default();
    assert!(ip.starts_with(range.trim_end_matches("0/24")), "{ip} not in {range}");

    // The client's resolv.conf points at the cluster DNS (dnsPolicy ClusterFirst).
    let dns_ip = n.c.k(&[
        "get",
        "svc",
        "-n",
        "kube-system",
        "kube-dns",
        "-o",
        "jsonpath={.spec.clusterIP}",
    ]);
    let (resolv, _) = n.sh("client", "cat /etc/resolv.conf");
    assert!(resolv.contains(&format!("nameserver {dns_ip}")), "{resolv}");
    assert!(
        resolv.contains("search default.svc.cluster.local svc.cluster.local cluster.local"),
        "{resolv}"
    );
    assert!(resolv.contains("options ndots:5"), "{resolv}");
    // kube-dns is answered by this node's agent.
    let dns_endpoints = n.c.k(&[
        "get",
        "endpointslices",
        "-n",
        "kube-system",
        "-l",
        "kubernetes.io/service-name=kube-dns",
    ]);
    assert!(
        dns_endpoints.contains(&format!("kube-dns-{}", n.name)),
        "{dns_endpoints}"
    );

    // Every name of the Service answers, from a pod.
    n.assert_range_stays_local(n.c.service_range.as_deref().expect("the cluster's own service range"));
    for url in [
        "http://web",
        "http://web.default",
        "http://web.default.svc.cluster.local",
        &format!("http://{ip}"),
    ] {
        let answered = eventually(Duration::from_secs(20), || {
            let (out, ok) = fetch(&n, "client", url);
            (ok && web.contains(&out)).then_some(out)
        });
        assert!(
            answered.is_some(),
            "{url} did not answer: {:?}\n{}",
            fetch(&n, "client", url),
            tail(&n.c.log(), 30)
        );
    }
    let (lookup, ok) = n.sh("client", "nslookup web.default.svc.cluster.local");
    assert!(ok && lookup.contains(&format!("Address: {ip}")), "{lookup}");

    // 60 requests reach all three replicas.
    let hits = spread(&n, "client", "http://web", 60);
    assert_eq!(hits.keys().cloned().collect::<BTreeSet<_>>(), web, "{hits:?}");

    // A pod that fails its readiness probe stops receiving traffic within seconds.
    let sick = web.iter().next().cloned().unwrap_or_default();
    let sick_ip = n.field(&sick, ".status.podIP");
    let (out, ok) = n.sh(&sick, "rm /www/healthz");
    assert!(ok, "{out}");
    let out_of_slice = eventually(Duration::from_secs(15), || {
        let ready = ready_endpoints(&n, "web");
        (ready.len() == 2 && !ready.contains(&sick_ip)).then_some(())
    });
    assert!(
        out_of_slice.is_some(),
        "{sick} still a ready endpoint: {:?}",
        ready_endpoints(&n, "web")
    );
    let gone = eventually(Duration::from_secs(10), || {
        let hits = spread(&n, "client", "http://web", 30);
        (!hits.contains_key(&sick) && hits.len() == 2).then_some(hits)
    });
    assert!(
        gone.is_some(),
        "{sick} still answers: {:?}",
        spread(&n, "client", "http://web", 30)
    );
    n.sh(&sick, "echo ok > /www/healthz");
    let back = eventually(Duration::from_secs(15), || {
        (ready_endpoints(&n, "web").len() == 3).then_some(())
    });
    assert!(back.is_some(), "{sick} not ready again");

    // Hairpin: a pod reaches itself through its own Service.
    // (once the proxy has put the pod back, a moment after its slice says it is ready).
    let hairpin = eventually(Duration::from_secs(10), || {
        let hits = spread(&n, &sick, "http://web", 30);
        (hits.contains_key(&sick) && hits.len() == 3).then_some(hits)
    });
    let hairpin = hairpin.unwrap_or_else(|| spread(&n, &sick, "http://web", 30));
    assert!(hairpin.contains_key(&sick), "{sick} never reached itself: {hairpin:?}");
    assert!(!hairpin.contains_key("FAILED"), "{hairpin:?}");

    // ClientIP affinity: one client, one pod.
    n.c.k(&[
        "expose",
        "deployment",
        "web",
        "--name",
        "sticky",
        "--port",
        "80",
        "--target-port",
        "http",
        "--session-affinity",
        "ClientIP",
    ]);
    let answered = eventually(Duration::from_secs(20), || {
        fetch(&n, "client", "http://sticky").1.then_some(())
    });
    assert!(answered.is_some(), "sticky did not answer");
    let sticky = spread(&n, "client", "http://sticky", 20);
    assert_eq!(sticky.len(), 1, "ClientIP affinity spread the requests: {sticky:?}");

    // NodePort, from this machine on 127.0.0.1.
    n.c.k(&[
        "expose",
        "deployment",
        "web",
        "--name",
        "web-np",
        "--type",
        "NodePort",
        "--port",
        "80",
        "--target-port",
        "http",
    ]);
    let node_port: u16 =
        n.c.k(&["get", "svc", "web-np", "-o", "jsonpath={.spec.ports[0].nodePort}"])
            .parse()
            .expect("a nodePort");
    let via_node_port = eventually(Duration::from_secs(20), || {
        let body = curl(&format!("http://127.0.0.1:{node_port}/"));
        web.contains(&body).then_some(body)
    });
    assert!(via_node_port.is_some(), "127.0.0.1:{node_port} did not answer");

    // A LoadBalancer gets this node's address as its ingress (ServiceLB), and answers there.
    n.c.k(&[
        "expose",
        "deployment",
        "web",
        "--name",
        "web-lb",
        "--type",
        "LoadBalancer",
        "--port",
        "8081",
        "--target-port",
        "http",
    ]);
    let node_ip = n.c.k(&[
        "get",
        "node",
        &n.name,
        "-o",
        "jsonpath={.status.addresses[?(@.type==\"InternalIP\")].address}",
    ]);
    let ingress = eventually(Duration::from_secs(20), || {
        let ip = n.c.k(&[
            "get",
            "svc",
            "web-lb",
            "-o",
            "jsonpath={.status.loadBalancer.ingress[*].ip}",
        ]);
        (ip == node_ip).then_some(ip)
    });
    assert!(ingress.is_some(), "web-lb: {}", n.c.k(&["get", "svc", "web-lb"]));
    assert!(n.c.k(&["get", "svc", "web-lb"]).contains(&node_ip));
    assert!(is_local_address(&node_ip), "{node_ip} is not this machine's");
    let via_lb = eventually(Duration::from_secs(20), || {
        let body = curl(&format!("http://{node_ip}:8081/"));
        web.contains(&body).then_some(body)
    });
    assert!(via_lb.is_some(), "{node_ip}:8081 did not answer");

    // kubectl port-forward svc/web: to a pod of the Service.
    let local = common::free_port();
    let pf = PortForward::start(&n.c, &["svc/web", &format!("{local}:80")]);
    let forwarded = eventually(Duration::from_secs(30), || {
        if !pf.stdout().contains("Forwarding from") {
            return None;
        }
        let r = http_get(local, "/");
        web.iter().any(|p| r.contains(p.as_str())).then_some(r)
    });
    assert!(
        forwarded.is_some(),
        "port-forward svc/web: {} {}",
        pf.stdout(),
        pf.stderr()
    );
    drop(pf);

    // Seed 003: web-0.nginx is web-0, through the headless Service.
    n.c.apply(
        &statefulset_web_on_busybox("mkdir -p /www && hostname > /www/index.html && exec httpd -f -p 80 -h /www"),
        &[],
    );
    wait_ready_pods(&n, "app=nginx", 2);
    let mut seed_ips = Vec::new();
    for pod in ["web-0", "web-1"] {
        let pod_ip = n.field(pod, ".status.podIP");
        seed_ips.push(pod_ip.clone());
        let name = format!("{pod}.nginx.default.svc.cluster.local");
        let resolved = eventually(Duration::from_secs(20), || {
            let (out, ok) = n.sh("client", &format!("nslookup {name}"));
            (ok && out.contains(&format!("Address: {pod_ip}"))).then_some(())
        });
        assert!(
            resolved.is_some(),
            "{name}: {:?}",
            n.sh("client", &format!("nslookup {name}"))
        );
        let (out, ok) = fetch(&n, "client", &format!("http://{pod}.nginx"));
        assert!(ok && out == pod, "http://{pod}.nginx: {out}");
    }
    // The headless Service's name is its ready pods' addresses.
    let (out, ok) = n.sh("client", "nslookup nginx.default.svc.cluster.local");
    assert!(
        ok && seed_ips.iter().all(|ip| out.contains(&format!("Address: {ip}"))),
        "{out}"
    );
    let (out, ok) = n.sh("client", "nslookup no-such-service.default.svc.cluster.local");
    assert!(!ok || out.contains("NXDOMAIN"), "{out}");

    // A restart of the server keeps every address and the traffic flowing.
    let before: Vec<String> = ["web", "sticky", "web-np", "web-lb"]
        .iter()
        .map(|s| cluster_ip(&n, s))
        .collect();
    n.c.restart();
    let after: Vec<String> = ["web", "sticky", "web-np", "web-lb"]
        .iter()
        .map(|s| cluster_ip(&n, s))
        .collect();
    assert_eq!(before, after);
    assert_eq!(
        n.c.k(&["get", "svc", "web-np", "-o", "jsonpath={.spec.ports[0].nodePort}"]),
        node_port.to_string()
    );
    n.assert_range_stays_local(n.c.service_range.as_deref().expect("the cluster's own service range"));
    let flowing = eventually(Duration::from_secs(30), || {
        let (out, ok) = fetch(&n, "client", "http://web");
        (ok && web.contains(&out)).then_some(())
    });
    assert!(
        flowing.is_some(),
        "no traffic after the restart\n{}",
        tail(&n.c.log(), 30)
    );

    // No endpoints: refused at once, not a timeout.
    n.c.k(&["scale", "deployment", "web", "--replicas", "0"]);
    let emptied = eventually(Duration::from_secs(30), || pods(&n, "app=web").is_empty().then_some(()));
    assert!(emptied.is_some(), "web pods remain: {:?}", pods(&n, "app=web"));
    let refused = eventually(Duration::from_secs(15), || {
        let start = Instant::now();
        let (out, ok) = fetch(&n, "client", "http://web");
        (!ok && out.contains("Connection refused")).then(|| start.elapsed())
    });
    let Some(elapsed) = refused else {
        panic!("web with no endpoints: {:?}", fetch(&n, "client", "http://web"));
    };
    assert!(elapsed < Duration::from_secs(5), "refusal took {elapsed:?}");
}
