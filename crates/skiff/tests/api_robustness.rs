//! Bad input never panics and changes nothing; acknowledged writes survive kill -9;
//! watches from kubectl, kube-rs and the Python client.

#![cfg(test)]

mod common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

use common::{Cluster, eventually};

const CONTROL_PLANE: &[&str] = &["--no-agent", "--no-scheduler"];

#[test]
fn bad_input_gets_status_errors_and_changes_nothing() {
    let c = Cluster::start(CONTROL_PLANE);
    let pods = "/api/v1/namespaces/default/pods";
    let (code, body) = c.admin_curl("POST", pods, "application/json", b"{\"kind\":\"Pod\",");
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("\"reason\":\"BadRequest\""), "{body}");
    let (code, _) = c.admin_curl("POST", pods, "application/yaml", b"kind: [unclosed");
    assert_eq!(code, 400);
    let (code, body) = c.admin_curl(
        "POST",
        pods,
        "application/vnd.kubernetes.protobuf",
        b"k8s\x00\x0a\xff\xff\xff",
    );
    assert_eq!(code, 400, "{body}");
    let (code, body) = c.admin_curl("POST", pods, "application/json", &vec![b' '; 4 * 1024 * 1024]);
    assert_eq!(code, 413, "{body}");
    let invalid = br#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"Bad_Name"},"spec":{"containers":[]}}"#;
    let (code, body) = c.admin_curl("POST", pods, "application/json", invalid);
    assert_eq!(code, 422, "{body}");
    assert!(
        body.contains("\"reason\":\"Invalid\"") && body.contains("causes"),
        "{body}"
    );
    let unknown = br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"u"},"bogus":1}"#;
    let (code, body) = c.admin_curl(
        "POST",
        "/api/v1/namespaces/default/configmaps?fieldValidation=Strict",
        "application/json",
        unknown,
    );
    assert_eq!(code, 400, "{body}");
    assert!(
        body.contains("strict decoding error: unknown field \\\"bogus\\\""),
        "{body}"
    );
    // Objects written alike skip checks they passed before; one that skipped the unknown-field
    // check (fieldValidation=Ignore) did not pass it, so the same shape is refused when strict.
    let bogus_configmap = |name: String, query: &str| {
        let body = format!(r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"{name}"}},"bogus":1}}"#);
        let path = format!("/api/v1/namespaces/default/configmaps?{query}");
        c.admin_curl("POST", &path, "application/json", body.as_bytes())
    };
    for i in 0..4 {
        let (code, body) = bogus_configmap(format!("i{i}"), "fieldValidation=Ignore&dryRun=All");
        assert_eq!(code, 201, "{body}");
        let (code, body) = bogus_configmap(format!("s{i}"), "fieldValidation=Strict");
        assert_eq!(code, 400, "{body}");
    }
    // A wrong-typed field is a 400/422, never a 500.
    let wrong = br#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"w"},"spec":{"containers":"nope"}}"#;
    let (code, body) = c.admin_curl("POST", pods, "application/json", wrong);
    assert!(code == 400 || code == 422, "{code} {body}");
    // Conflict on a stale resourceVersion.
    c.k(&["create", "configmap", "cc", "--from-literal=a=1"]);
    let stale =
        br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cc","resourceVersion":"1"},"data":{"a":"2"}}"#;
    let (code, body) = c.admin_curl(
        "PUT",
        "/api/v1/namespaces/default/configmaps/cc",
        "application/json",
        stale,
    );
    assert_eq!(code, 409, "{body}");
    assert!(body.contains("the object has been modified"), "{body}");
    // A create that names a resourceVersion is refused, as upstream.
    let with_rv = br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"rv","resourceVersion":"5"}}"#;
    let (code, body) = c.admin_curl(
        "POST",
        "/api/v1/namespaces/default/configmaps",
        "application/json",
        with_rv,
    );
    assert_eq!(code, 400, "{body}");
    assert!(
        body.contains("resourceVersion should not be set on objects to be created"),
        "{body}"
    );
    // Nothing of the above was stored.
    let out = c.k(&["get", "pods,configmaps", "-o", "name"]);
    // Besides the root CA publisher's ConfigMap, which every namespace has.
    let stored: Vec<&str> = out.lines().filter(|l| *l != "configmap/kube-root-ca.crt").collect();
    assert_eq!(stored, ["configmap/cc"], "{out}");
    assert_eq!(c.get_json(&["configmap", "cc"])["data"]["a"], "1");
}

#[test]
fn acknowledged_writes_survive_kill_9() {
    let mut c = Cluster::start(CONTROL_PLANE);
    let rv_before: i64 = c.get_json(&["namespace", "default"])["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("rv");
    // Writers create configmaps until the server dies; every acknowledged name is recorded.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..4 {
        let kubeconfig = c.kubeconfig.clone();
        let home = c.home.path().to_path_buf();
        let stop = stop.clone();
        writers.push(std::thread::spawn(move || {
            let mut acked = Vec::new();
            for i in 0..10_000 {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                let name = format!("w{w}-{i}");
                let out = std::process::Command::new("kubectl")
                    .arg("--kubeconfig")
                    .arg(&kubeconfig)
                    .args([
                        "create",
                        "configmap",
                        &name,
                        "--from-literal=k=v",
                        "--request-timeout=5s",
                    ])
                    .env("HOME", &home)
                    .output()
                    .expect("kubectl");
                if out.status.success() {
                    acked.push(name);
                } else {
                    break;
                }
            }
            acked
        }));
    }
    std::thread::sleep(Duration::from_secs(4));
    c.kill9();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let acked: Vec<String> = writers.into_iter().flat_map(|h| h.join().expect("writer")).collect();
    assert!(acked.len() > 5, "too few writes before the kill: {}", acked.len());
    c.restart();
    let out = c.k(&["get", "configmaps", "-o", "name"]);
    for name in &acked {
        assert!(
            out.contains(&format!("configmap/{name}\n")),
            "acknowledged {name} lost after kill -9"
        );
    }
    // resourceVersions keep increasing across the restart.
    c.k(&["create", "configmap", "after-restart", "--from-literal=a=b"]);
    let rv_after: i64 = c.get_json(&["configmap", "after-restart"])["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("rv");
    assert!(
        rv_after > rv_before + acked.len() as i64,
        "{rv_after} <= {rv_before} + {}",
        acked.len()
    );
}

#[test]
fn kubectl_get_watch_streams_changes() {
    let c = Cluster::start(CONTROL_PLANE);
    c.k(&["create", "configmap", "w1", "--from-literal=a=1"]);
    let mut child = c
        .kubectl_cmd(&["get", "configmaps", "-w"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl get -w");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let first = rx.recv_timeout(Duration::from_secs(10)).expect("header");
    assert!(first.starts_with("NAME") && first.contains("DATA"), "{first}");
    c.k(&["create", "configmap", "w2", "--from-literal=a=1"]);
    let seen = eventually(Duration::from_secs(10), || {
        rx.try_recv().ok().filter(|l| l.starts_with("w2"))
    });
    let _ = child.kill();
    let _ = child.wait();
    assert!(seen.is_some(), "get -w did not show w2");
}

#[test]
fn python_client_crud_and_watch() {
    if std::process::Command::new("python3")
        .args(["-c", "import kubernetes"])
        .status()
        .map(|s| !s.success())
        .unwrap_or(true)
    {
        panic!("the Python kubernetes client is required (pip install kubernetes)");
    }
    let c = Cluster::start(CONTROL_PLANE);
    let script = r#"
import sys, threading
from kubernetes import client, config, watch
config.load_kube_config(config_file=sys.argv[1])
v1 = client.CoreV1Api()
cm = client.V1ConfigMap(metadata=client.V1ObjectMeta(name="py"), data={"a": "1"})
created = v1.create_namespaced_config_map("default", cm)
got = v1.read_namespaced_config_map("py", "default")
assert got.data["a"] == "1"
got.data["a"] = "2"
v1.replace_namespaced_config_map("py", "default", got)
v1.patch_namespaced_config_map("py", "default", {"metadata": {"labels": {"x": "y"}}})
names = [i.metadata.name for i in v1.list_namespaced_config_map("default", label_selector="x=y").items]
assert names == ["py"], names
w = watch.Watch()
seen = []
def later():
    v1.create_namespaced_config_map("default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="py2")))
rv = v1.list_namespaced_config_map("default").metadata.resource_version
threading.Timer(0.5, later).start()
for ev in w.stream(v1.list_namespaced_config_map, "default", resource_version=rv, timeout_seconds=10):
    seen.append((ev["type"], ev["object"].metadata.name))
    if ev["object"].metadata.name == "py2":
        w.stop()
assert ("ADDED", "py2") in seen, seen
v1.delete_namespaced_config_map("py", "default")
try:
    v1.read_namespaced_config_map("py", "default")
    raise SystemExit("still there")
except client.exceptions.ApiException as e:
    assert e.status == 404, e.status
print("ok")
"#;
    c.python(script);
}
