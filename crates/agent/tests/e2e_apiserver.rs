//! The agent against the project's own API server (in-process client) and the real Docker Engine:
//! node registration, lease, a pod bound to the node runs and reports status, graceful deletion.

#![cfg(test)]

mod common;

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use skiff_agent::docker;

/// Removes every container and volume of the test node, also when the test panics.
struct Guard(String);

impl Drop for Guard {
    fn drop(&mut self) {
        let filter = format!("label={}={}", docker::LABEL_NODE, self.0);
        for (list, rm) in [
            (vec!["ps", "-aq", "--filter", &filter], vec!["rm", "-f", "-v"]),
            (
                vec!["volume", "ls", "-q", "--filter", &filter],
                vec!["volume", "rm", "-f"],
            ),
        ] {
            if let Ok(out) = std::process::Command::new("docker").args(&list).output() {
                let ids: Vec<String> = String::from_utf8_lossy(&out.stdout)
                    .split_whitespace()
                    .map(str::to_string)
                    .collect();
                if !ids.is_empty() {
                    let _ = std::process::Command::new("docker").args(&rm).args(&ids).output();
                }
            }
        }
    }
}

async fn eventually<T, F, Fut>(secs: u64, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_registers_runs_a_pod_and_deletes_it_gracefully() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let node = format!(
        "e2e-{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
            & 0xffff_ffff
    );
    let _guard = Guard(node.clone());
    let dir = tempfile::tempdir().unwrap();
    let mut opts = skiff_apiserver::ServerOptions::new(dir.path().join("server"), 0);
    opts.bind = "127.0.0.1".parse().unwrap();
    let running = skiff_apiserver::start(opts).await.unwrap();
    let client = skiff_apiserver::client(running.state.clone());
    common::as_the_controllers_would(&client, &dir.path().join("server")).await;

    // The agent labels its containers with the cluster's identity, the kube-system namespace's uid.
    let cluster = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .get("kube-system")
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    let owner = docker::Owner {
        node: &node,
        cluster: &cluster,
    };
    let d = docker::connect().await.unwrap();
    if docker::image_id(&d, "busybox:latest").await.unwrap().is_none() {
        skiff_agent::build_local_images(&d).await.unwrap();
    }

    let mut cfg = skiff_agent::AgentConfig::new(node.clone(), dir.path().join("agent"));
    cfg.listen = "127.0.0.1:0".parse().unwrap();
    cfg.node_ip = Some("127.0.0.1".parse().unwrap());
    cfg.cluster_ca_pem = Some(running.state.pki.ca_cert_pem.clone());
    // This server has the default service range: its proxy would take the host's `skiff` table,
    // which a cluster of the machine's own may use. The Services end-to-end tests cover both.
    cfg.services = skiff_agent::service_network::ServiceNetworkConfig {
        proxy: false,
        dns: false,
    };
    // No disk thresholds: how full the shared host disk is must not evict the test's pod.
    cfg.eviction_hard = skiff_agent::eviction::parse_thresholds("memory.available<100Mi").expect("a threshold");
    // No node IPAM runs here: pods go on Docker's default network at once.
    cfg.pod_cidr_wait = std::time::Duration::ZERO;
    let parts = skiff_agent::parts::Parts::Given {
        network: client.clone(),
        volumes: client.clone(),
    };
    let agent = tokio::spawn(skiff_agent::run(client.clone(), parts, cfg));

    let nodes: Api<Node> = Api::all(client.clone());
    let n = eventually(30, "node Ready", || async {
        let n = nodes.get_opt(&node).await.ok()??;
        let ready = n
            .status
            .as_ref()?
            .conditions
            .as_ref()?
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        ready.then_some(n)
    })
    .await;
    let labels = n.metadata.labels.clone().unwrap();
    assert_eq!(labels["kubernetes.io/hostname"], node);
    assert_eq!(labels["kubernetes.io/os"], "linux");
    let status = n.status.unwrap();
    assert_eq!(status.capacity.as_ref().unwrap()["pods"].0, "110");
    assert!(status.daemon_endpoints.unwrap().kubelet_endpoint.unwrap().port > 0);
    assert!(
        status
            .node_info
            .unwrap()
            .container_runtime_version
            .starts_with("docker://")
    );
    assert!(
        status
            .addresses
            .unwrap()
            .iter()
            .any(|a| a.type_ == "InternalIP" && a.address == "127.0.0.1")
    );
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let lease = eventually(30, "node lease", || async { leases.get_opt(&node).await.ok()? }).await;
    assert_eq!(lease.spec.unwrap().holder_identity.as_deref(), Some(node.as_str()));

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("{node}-pod")},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 2,
            "containers": [{"name": "c", "image": "busybox:latest", "command": ["sleep", "3600"]}]
        }
    }))
    .unwrap();
    let name = pod.metadata.name.clone().unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let p = eventually(60, "pod Ready", || async {
        let p = pods.get(&name).await.ok()?;
        let s = p.status.as_ref()?;
        let ready = s
            .conditions
            .as_ref()?
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        (s.phase.as_deref() == Some("Running") && ready).then_some(p)
    })
    .await;
    let s = p.status.unwrap();
    assert!(s.pod_ip.is_some_and(|ip| !ip.is_empty()));
    assert_eq!(s.host_ip.as_deref(), Some("127.0.0.1"));
    let cs = &s.container_statuses.unwrap()[0];
    assert!(cs.ready && cs.state.as_ref().unwrap().running.is_some());

    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let list = eventually(10, "Started event", || async {
        let l = events
            .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
            .await
            .ok()?;
        l.items
            .iter()
            .any(|e| e.reason.as_deref() == Some("Started"))
            .then_some(l)
    })
    .await;
    assert!(
        list.items
            .iter()
            .all(|e| e.source.as_ref().and_then(|s| s.component.as_deref()) == Some("kubelet"))
    );

    pods.delete(&name, &DeleteParams::default()).await.unwrap();
    eventually(60, "pod gone", || async {
        match pods.get_opt(&name).await {
            Ok(None) => Some(()),
            _ => None,
        }
    })
    .await;
    let uid = p.metadata.uid.unwrap();
    eventually(30, "containers removed", || async {
        docker::pod_runtime(&d, owner, &uid)
            .await
            .ok()?
            .containers
            .is_empty()
            .then_some(())
    })
    .await;

    // Pod startup latency through the whole path (API, watch, agent, Docker).
    let report = skiff_bench::bench_startup(
        client.clone(),
        skiff_bench::StartupBench {
            pods: std::env::var("BENCH_PODS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(5),
            node_name: Some(node.clone()),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    eprintln!("startup: {report:?}");
    assert!(report.pods >= 5);
    assert!(report.p50_ms <= report.p99_ms && report.p99_ms <= report.max_ms);
    eventually(60, "benchmark pods gone", || async {
        let left = docker::list_node_containers(&d, owner).await.ok()?;
        left.is_empty().then_some(())
    })
    .await;
    agent.abort();
}
