//! `/metrics` as an operator scrapes it: Debian's `prometheus` on loopback scrapes `skiff server`
//! over HTTPS every second with the token of a service account bound to `system:monitoring`,
//! and the rates of the requests kubectl made, and the pods the scheduler placed, come back
//! through Prometheus' own HTTP API.

#![cfg(test)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{Cluster, eventually, free_port, try_http_get};

/// Prometheus on a free loopback port, killed and its directory removed on drop.
struct Prometheus {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(target: &str, token_file: &Path, ca_file: &Path) -> Prometheus {
        let dir = tempfile::tempdir().expect("prometheus dir");
        let port = free_port();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n\
             - job_name: apiserver\n  scheme: https\n  metrics_path: /metrics\n\
             \x20 authorization:\n    credentials_file: {}\n\
             \x20 tls_config:\n    ca_file: {}\n    server_name: localhost\n\
             \x20 static_configs:\n  - targets: ['{target}']\n",
            token_file.display(),
            ca_file.display(),
        );
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config).expect("prometheus config");
        let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("log");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start prometheus (Debian's `prometheus` package)");
        Prometheus { child, port, dir }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// `/api/v1/query?query=Q`: the values of its vector result.
    fn query(&self, q: &str) -> Option<Vec<f64>> {
        let encoded: String = q
            .bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
                _ => format!("%{b:02X}"),
            })
            .collect();
        // Prometheus may still be starting: a refused connection is "no answer yet".
        let response = try_http_get(self.port, &format!("/api/v1/query?query={encoded}")).ok()?;
        let body = response.split_once("\r\n\r\n")?.1;
        let v: serde_json::Value = serde_json::from_str(body).ok()?;
        if v["status"] != "success" {
            return None;
        }
        Some(
            v["data"]["result"]
                .as_array()?
                .iter()
                .filter_map(|r| r["value"][1].as_str()?.parse().ok())
                .collect(),
        )
    }

    /// The target's health as Prometheus last saw it.
    fn target_health(&self) -> String {
        let response = try_http_get(self.port, "/api/v1/targets").unwrap_or_else(|e| e.to_string());
        let body = response.split_once("\r\n\r\n").map(|b| b.1).unwrap_or("");
        let v: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
        format!(
            "{} {}",
            v["data"]["activeTargets"][0]["health"], v["data"]["activeTargets"][0]["lastError"]
        )
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A token of service account `default/prometheus`, bound to upstream's `system:monitoring`.
fn monitoring_token(c: &Cluster) -> PathBuf {
    c.k(&["create", "serviceaccount", "prometheus", "-n", "default"]);
    c.k(&[
        "create",
        "clusterrolebinding",
        "prometheus-monitoring",
        "--clusterrole=system:monitoring",
        "--serviceaccount=default:prometheus",
    ]);
    let token = c.k(&["create", "token", "prometheus", "-n", "default", "--duration=1h"]);
    let path = c.home.path().join("prometheus-token");
    std::fs::write(&path, token.trim()).expect("token file");
    path
}

#[test]
fn prometheus_scrapes_the_api_server_and_queries_rates_back() {
    let c = Cluster::start(&["--no-agent", "--sim-nodes", "2"]);
    // Anonymous is refused, as upstream.
    assert_eq!(http_status_anonymous(c.port), "403");

    let token = monitoring_token(&c);
    let ca = c.path().join("pki").join("ca.crt");
    let prom = Prometheus::start(&format!("127.0.0.1:{}", c.port), &token, &ca);

    // A first create, until Prometheus has its series: a rate needs the counter to grow
    // between two of its samples.
    c.k(&["create", "configmap", "m0", "--from-literal=k=v"]);
    let creates = "apiserver_request_total{resource=\"configmaps\",verb=\"POST\",code=\"201\"}";
    let seen = eventually(Duration::from_secs(60), || prom.query(creates)?.first().copied());
    assert!(
        seen.is_some(),
        "Prometheus never scraped the server; target: {}",
        prom.target_health()
    );
    // Traffic: ConfigMaps created, read and listed, and a Deployment of 3 pods to schedule.
    for i in 1..6 {
        c.k(&["create", "configmap", &format!("m{i}"), "--from-literal=k=v"]);
        c.k(&["get", "configmap", &format!("m{i}")]);
    }
    c.k(&["get", "configmaps"]);
    c.k(&["create", "deployment", "web", "--image=busybox", "--replicas=3"]);
    let bound = eventually(Duration::from_secs(60), || {
        let pods = c.get_json(&["pods", "-A"]);
        let bound = pods["items"]
            .as_array()?
            .iter()
            .filter(|p| p["spec"]["nodeName"].as_str().is_some_and(|n| !n.is_empty()))
            .count();
        (bound >= 3).then_some(bound)
    })
    .expect("the Deployment's 3 pods were not scheduled");

    let rate = eventually(Duration::from_secs(60), || {
        let v =
            prom.query("sum(rate(apiserver_request_total{resource=\"configmaps\",verb=\"POST\",code=\"201\"}[30s]))")?;
        v.first().copied().filter(|r| *r > 0.0)
    });
    assert!(
        rate.is_some(),
        "no rate of ConfigMap creates in Prometheus; target: {}; log:\n{}",
        prom.target_health(),
        common::tail(&prom.log(), 20)
    );
    let gets = eventually(Duration::from_secs(30), || {
        let v = prom.query("sum(increase(apiserver_request_total{resource=\"configmaps\",verb=\"GET\"}[1m]))")?;
        v.first().copied().filter(|r| *r > 0.0)
    });
    assert!(gets.is_some(), "no increase of ConfigMap gets");

    // Every pod bound was a scheduled attempt, and nothing else was.
    let scheduled = eventually(Duration::from_secs(30), || {
        let v = prom.query("sum(scheduler_schedule_attempts_total{result=\"scheduled\"})")?;
        v.first().copied().filter(|n| *n as usize == bound)
    });
    assert_eq!(
        scheduled,
        Some(bound as f64),
        "scheduled attempts: {:?}",
        prom.query("scheduler_schedule_attempts_total")
    );

    // The store's latency, the work queues and the process are there too.
    for q in [
        "etcd_request_duration_seconds_count{operation=\"create\",type=\"configmaps\"}",
        "workqueue_adds_total{name=\"deployment\"}",
        "process_resident_memory_bytes",
        "apiserver_storage_objects{resource=\"namespaces\"}",
    ] {
        let v = eventually(Duration::from_secs(30), || {
            prom.query(q)?.first().copied().filter(|n| *n > 0.0)
        });
        assert!(v.is_some(), "{q} missing from Prometheus");
    }
}

/// `GET /metrics` without credentials: the status code.
fn http_status_anonymous(port: u16) -> String {
    let out = Command::new("curl")
        .args([
            "-sk",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            &format!("https://127.0.0.1:{port}/metrics"),
        ])
        .output()
        .expect("curl");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}
