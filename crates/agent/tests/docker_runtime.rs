//! The pod worker against the real Docker Engine, with an in-memory stand-in for the API server.
//! Every test uses its own node name; a guard removes every container and volume labelled with it,
//! even when the test fails.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use parking_lot::Mutex;
use skiff_agent::docker::{self, RunState};
use skiff_agent::events::Recorder;
use skiff_agent::worker::{self, Ctx};
use tokio::sync::{OnceCell, watch};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Default)]
struct FakeApi {
    objects: Mutex<HashMap<String, serde_json::Value>>,
    statuses: Mutex<Vec<(String, serde_json::Value)>>,
    events: Mutex<Vec<serde_json::Value>>,
    deletes: Mutex<Vec<String>>,
}

impl FakeApi {
    fn handle(&self, method: &http::Method, path: &str, body: &[u8]) -> (u16, serde_json::Value) {
        let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let json: serde_json::Value = serde_json::from_slice(body).unwrap_or(serde_json::Value::Null);
        let not_found = |what: &str| {
            (
                404,
                serde_json::json!({"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404,"message":format!("{what} not found")}),
            )
        };
        match (method.as_str(), parts.as_slice()) {
            ("GET", ["api", "v1", "namespaces", _, kind, name]) => match self.objects.lock().get(path) {
                Some(o) => (200, o.clone()),
                None => not_found(&format!("{kind} \"{name}\"")),
            },
            ("PATCH", ["api", "v1", "namespaces", ns, "pods", name, "status"]) => {
                let status = json.get("status").cloned().unwrap_or_default();
                self.statuses.lock().push((name.to_string(), status.clone()));
                (
                    200,
                    serde_json::json!({"apiVersion":"v1","kind":"Pod","metadata":{"name":name,"namespace":ns},"status":status}),
                )
            }
            ("POST", ["api", "v1", "namespaces", _, "events"]) => {
                self.events.lock().push(json.clone());
                (201, json)
            }
            ("PATCH", ["api", "v1", "namespaces", ns, "events", name]) => (
                200,
                serde_json::json!({"apiVersion":"v1","kind":"Event","metadata":{"name":name,"namespace":ns},"involvedObject":{}}),
            ),
            ("DELETE", ["api", "v1", "namespaces", ns, "pods", name]) => {
                self.deletes.lock().push(name.to_string());
                (
                    200,
                    serde_json::json!({"apiVersion":"v1","kind":"Pod","metadata":{"name":name,"namespace":ns}}),
                )
            }
            ("POST", ["api", "v1", "namespaces", _, "serviceaccounts", _, "token"]) => (
                201,
                serde_json::json!({"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","spec":{"audiences":[]},
                    "status":{"token":"fake-token","expirationTimestamp":"2030-01-01T00:00:00Z"}}),
            ),
            _ => not_found(path),
        }
    }
}

fn fake_client(api: Arc<FakeApi>) -> kube::Client {
    let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let api = api.clone();
        async move {
            let (parts, body) = req.into_parts();
            let bytes = body
                .collect()
                .await
                .map_err(|e| -> BoxError { Box::new(e) })?
                .to_bytes();
            let (code, json) = api.handle(&parts.method, parts.uri.path(), &bytes);
            let response = http::Response::builder()
                .status(code)
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(serde_json::to_vec(&json).unwrap_or_default())))
                .map_err(|e| -> BoxError { Box::new(e) })?;
            Ok::<_, BoxError>(response)
        }
    });
    kube::Client::new(service, "default")
}

static IMAGES: OnceCell<()> = OnceCell::const_new();

async fn ensure_images(docker: &bollard::Docker) {
    IMAGES
        .get_or_init(|| async {
            if docker::image_id(docker, "busybox:latest").await.unwrap().is_none()
                || docker::image_id(docker, skiff_agent::images::PAUSE_IMAGE)
                    .await
                    .unwrap()
                    .is_none()
            {
                skiff_agent::build_local_images(docker)
                    .await
                    .expect("building local images");
            }
        })
        .await;
}

/// Removes everything a test node created, also when the test panics.
struct Guard(String);

impl Drop for Guard {
    fn drop(&mut self) {
        let filter = format!("label={}={}", docker::LABEL_NODE, self.0);
        let out = std::process::Command::new("docker")
            .args(["ps", "-aq", "--filter", &filter])
            .output();
        if let Ok(out) = out {
            let ids: Vec<String> = String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .map(str::to_string)
                .collect();
            if !ids.is_empty() {
                let _ = std::process::Command::new("docker")
                    .args(["rm", "-f", "-v"])
                    .args(&ids)
                    .output();
            }
        }
        let out = std::process::Command::new("docker")
            .args(["volume", "ls", "-q", "--filter", &filter])
            .output();
        if let Ok(out) = out {
            let ids: Vec<String> = String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .map(str::to_string)
                .collect();
            if !ids.is_empty() {
                let _ = std::process::Command::new("docker")
                    .args(["volume", "rm", "-f"])
                    .args(&ids)
                    .output();
            }
        }
    }
}

struct Harness {
    api: Arc<FakeApi>,
    ctx: Arc<Ctx>,
    node: String,
    _dir: tempfile::TempDir,
    _guard: Guard,
}

fn unique(tag: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{tag}-{:x}", nanos & 0xffff_ffff_ffff)
}

impl Harness {
    async fn new(tag: &str) -> Self {
        let docker = docker::connect().await.expect("connecting to Docker");
        ensure_images(&docker).await;
        let node = unique(&format!("test-{tag}"));
        let api = Arc::new(FakeApi::default());
        let client = fake_client(api.clone());
        let dir = tempfile::tempdir().unwrap();
        let ctx = Arc::new(Ctx {
            client: client.clone(),
            docker,
            node: node.clone(),
            data_dir: dir.path().to_path_buf(),
            host_ip: "127.0.0.1".into(),
            recorder: Recorder::new(client, &node),
            allocatable_cpu_milli: 2000,
            allocatable_memory: 1 << 30,
            allocatable_storage: 1 << 34,
            images: Default::default(),
        });
        Harness {
            api,
            ctx,
            _guard: Guard(node.clone()),
            node,
            _dir: dir,
        }
    }

    fn pod(&self, name: &str, spec: serde_json::Value) -> Pod {
        let mut spec = spec;
        spec["nodeName"] = serde_json::json!(self.node);
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "uid": unique(name)},
            "spec": spec,
        }))
        .unwrap()
    }

    fn put(&self, path: &str, object: serde_json::Value) {
        self.api.objects.lock().insert(path.to_string(), object);
    }

    /// Runs a worker for the pod, woken by the engine's container events as the agent's workers are.
    fn spawn(&self, pod: &Pod) -> (watch::Sender<Option<Pod>>, tokio::task::JoinHandle<()>) {
        let (tx, rx) = watch::channel(Some(pod.clone()));
        let uid = pod.metadata.uid.clone().unwrap();
        let wake = Arc::new(tokio::sync::Notify::new());
        let (events_tx, mut events) = tokio::sync::mpsc::channel(64);
        let forwarder = tokio::spawn(skiff_agent::pods::container_events(self.ctx.clone(), events_tx));
        let notify = wake.clone();
        let own = uid.clone();
        let waker = tokio::spawn(async move {
            while let Some(event_uid) = events.recv().await {
                if event_uid == own {
                    notify.notify_one();
                }
            }
        });
        let worker = worker::run_with_wake(self.ctx.clone(), uid, rx, wake, false);
        let task = tokio::spawn(async move {
            worker.await;
            forwarder.abort();
            waker.abort();
        });
        (tx, task)
    }

    async fn wait_status(&self, name: &str, secs: u64, pred: impl Fn(&PodStatus) -> bool) -> PodStatus {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
        loop {
            let latest = self
                .api
                .statuses
                .lock()
                .iter()
                .rev()
                .find(|(n, _)| n == name)
                .map(|(_, s)| s.clone());
            if let Some(status) = latest {
                let status: PodStatus = serde_json::from_value(status).unwrap();
                if pred(&status) {
                    return status;
                }
                if tokio::time::Instant::now() > deadline {
                    panic!(
                        "timed out waiting for pod {name}; last status: {}",
                        serde_json::to_string_pretty(&status).unwrap()
                    );
                }
            } else if tokio::time::Instant::now() > deadline {
                panic!("timed out waiting for pod {name}: no status reported");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn exec(&self, pod: &str, container: &str, cmd: &[&str]) -> (i64, String) {
        let id = skiff_agent::server::find_container(&self.ctx.docker, &self.node, "default", pod, container, false)
            .await
            .unwrap()
            .expect("container exists");
        let cmd: Vec<String> = cmd.iter().map(|s| s.to_string()).collect();
        skiff_agent::probes::exec_output(&self.ctx.docker, &id, &cmd)
            .await
            .unwrap()
    }

    fn event_reasons(&self) -> Vec<(String, String)> {
        self.api
            .events
            .lock()
            .iter()
            .map(|e| {
                (
                    e["reason"].as_str().unwrap_or("").to_string(),
                    e["message"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect()
    }

    /// Ends a worker as a force deletion does and waits for its cleanup.
    async fn finish(&self, tx: watch::Sender<Option<Pod>>, task: tokio::task::JoinHandle<()>) {
        tx.send_replace(None);
        tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("worker ends")
            .unwrap();
    }
}

fn running(s: &PodStatus) -> bool {
    s.phase.as_deref() == Some("Running") && s.container_statuses.iter().flatten().all(|c| c.ready)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_share_the_sandbox_network() {
    let h = Harness::new("net").await;
    let pod = h.pod(
        "web",
        serde_json::json!({
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {"name": "server", "image": "busybox:latest", "imagePullPolicy": "IfNotPresent",
                 "command": ["sh", "-c", "mkdir -p /www && echo hello-from-server > /www/index.html && exec httpd -f -p 8080 -h /www"],
                 "readinessProbe": {"httpGet": {"path": "/index.html", "port": 8080}, "periodSeconds": 1}},
                {"name": "client", "image": "busybox:latest", "imagePullPolicy": "Never",
                 "command": ["sleep", "3600"]}
            ]
        }),
    );
    let (tx, task) = h.spawn(&pod);
    let status = h.wait_status("web", 60, running).await;
    assert!(
        status.pod_ip.as_deref().is_some_and(|ip| !ip.is_empty()),
        "pod IP reported"
    );
    assert_eq!(status.qos_class.as_deref(), Some("BestEffort"));
    let (code, out) = h
        .exec(
            "web",
            "client",
            &["wget", "-q", "-O-", "http://localhost:8080/index.html"],
        )
        .await;
    assert_eq!((code, out.trim()), (0, "hello-from-server"));
    let reasons: Vec<String> = h.event_reasons().into_iter().map(|(r, _)| r).collect();
    for r in ["Pulled", "Created", "Started"] {
        assert!(reasons.iter().any(|x| x == r), "missing {r} event in {reasons:?}");
    }
    let cs = status.container_statuses.unwrap();
    assert!(
        cs.iter()
            .all(|c| { c.container_id.as_deref().is_some_and(|id| id.starts_with("docker://")) })
    );
    h.finish(tx, task).await;
    let left = docker::list_node_containers(&h.ctx.docker, &h.node).await.unwrap();
    assert!(left.is_empty(), "containers removed after teardown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_pid_namespace_and_host_aliases() {
    let h = Harness::new("pid").await;
    let pod = h.pod(
        "shared",
        serde_json::json!({
            "shareProcessNamespace": true,
            "terminationGracePeriodSeconds": 1,
            "hostAliases": [{"ip": "10.1.2.3", "hostnames": ["foo.remote", "bar.remote"]}],
            "containers": [
                {"name": "a", "image": "busybox:latest", "command": ["sleep", "3601"]},
                {"name": "b", "image": "busybox:latest", "command": ["sleep", "3602"]}
            ]
        }),
    );
    let (tx, task) = h.spawn(&pod);
    let status = h.wait_status("shared", 60, running).await;
    let (_, ps) = h.exec("shared", "a", &["ps"]).await;
    assert!(ps.contains("sleep 3602"), "a sees b's process: {ps}");
    assert!(ps.contains("/pause"), "the sandbox's pause is visible: {ps}");
    let (_, hosts) = h.exec("shared", "b", &["cat", "/etc/hosts"]).await;
    assert!(hosts.starts_with("# Kubernetes-managed hosts file."), "{hosts}");
    assert!(hosts.contains("10.1.2.3\tfoo.remote\tbar.remote"), "{hosts}");
    let ip = status.pod_ip.unwrap();
    assert!(hosts.contains(&format!("{ip}\tshared")), "{hosts}");
    h.finish(tx, task).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_policies() {
    let h = Harness::new("restart").await;
    let spec = |policy: &str, script: &str| {
        serde_json::json!({
            "restartPolicy": policy,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": "busybox:latest", "command": ["sh", "-c", script]}]
        })
    };
    let never_ok = h.pod("never-ok", spec("Never", "echo done; exit 0"));
    let never_fail = h.pod("never-fail", spec("Never", "exit 3"));
    let crash = h.pod("crash", spec("OnFailure", "exit 1"));
    let (t1, w1) = h.spawn(&never_ok);
    let (t2, w2) = h.spawn(&never_fail);
    let (t3, w3) = h.spawn(&crash);

    let s = h
        .wait_status("never-ok", 60, |s| s.phase.as_deref() == Some("Succeeded"))
        .await;
    let c = &s.container_statuses.unwrap()[0];
    let t = c.state.as_ref().unwrap().terminated.as_ref().unwrap();
    assert_eq!(
        (t.exit_code, t.reason.as_deref(), c.restart_count),
        (0, Some("Completed"), 0)
    );

    let s = h
        .wait_status("never-fail", 60, |s| s.phase.as_deref() == Some("Failed"))
        .await;
    let t = s.container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap()
        .terminated
        .unwrap();
    assert_eq!((t.exit_code, t.reason.as_deref()), (3, Some("Error")));

    let s = h
        .wait_status("crash", 60, |s| {
            s.container_statuses.iter().flatten().any(|c| {
                c.state
                    .as_ref()
                    .and_then(|st| st.waiting.as_ref())
                    .and_then(|w| w.reason.as_deref())
                    == Some("CrashLoopBackOff")
            })
        })
        .await;
    let c = &s.container_statuses.unwrap()[0];
    assert!(c.restart_count >= 1);
    let waiting = c.state.as_ref().unwrap().waiting.as_ref().unwrap();
    assert!(
        waiting
            .message
            .as_deref()
            .unwrap()
            .starts_with("back-off 10s restarting failed container=c pod=crash_default(")
    );
    assert_eq!(c.last_state.as_ref().unwrap().terminated.as_ref().unwrap().exit_code, 1);
    assert_eq!(s.phase.as_deref(), Some("Running"));
    assert!(
        h.event_reasons()
            .iter()
            .any(|(r, m)| r == "BackOff"
                && m.starts_with("Back-off restarting failed container c in pod crash_default("))
    );
    h.finish(t1, w1).await;
    h.finish(t2, w2).await;
    h.finish(t3, w3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_liveness_probe_restarts_the_container() {
    let h = Harness::new("live").await;
    let pod = h.pod(
        "sick",
        serde_json::json!({
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "c", "image": "busybox:latest", "command": ["sleep", "3600"],
                "livenessProbe": {"exec": {"command": ["cat", "/tmp/healthy"]}, "periodSeconds": 1, "failureThreshold": 2}
            }]
        }),
    );
    let (tx, task) = h.spawn(&pod);
    let s = h
        .wait_status("sick", 60, |s| {
            s.container_statuses.iter().flatten().any(|c| c.restart_count >= 1)
        })
        .await;
    assert_eq!(s.container_statuses.unwrap()[0].restart_count, 1);
    let events = h.event_reasons();
    assert!(
        events
            .iter()
            .any(|(r, m)| r == "Unhealthy" && m.starts_with("Liveness probe failed: ")),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|(r, m)| r == "Killing" && m == "Container c failed liveness probe, will be restarted"),
        "{events:?}"
    );
    h.finish(tx, task).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secret_config_map_and_projected_volumes() {
    let h = Harness::new("vol").await;
    h.put(
        "/api/v1/namespaces/default/secrets/creds",
        serde_json::json!({"apiVersion":"v1","kind":"Secret","metadata":{"name":"creds"},"data":{"user":"YWRtaW4=","pass":"czNjcjN0"}}),
    );
    h.put(
        "/api/v1/namespaces/default/configmaps/settings",
        serde_json::json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"settings"},"data":{"mode":"fast","level":"3"}}),
    );
    let pod = h.pod(
        "vols",
        serde_json::json!({
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "c", "image": "busybox:latest", "command": ["sleep", "3600"],
                "env": [
                    {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "mode"}}},
                    {"name": "USER", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "user"}}},
                    {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "GREETING", "value": "hi $(USER)"}
                ],
                "volumeMounts": [
                    {"name": "secret", "mountPath": "/etc/secret"},
                    {"name": "config", "mountPath": "/etc/config", "readOnly": true},
                    {"name": "proj", "mountPath": "/etc/proj"},
                    {"name": "scratch", "mountPath": "/scratch", "subPath": "sub"},
                    {"name": "mem", "mountPath": "/mem"}
                ]
            }],
            "volumes": [
                {"name": "secret", "secret": {"secretName": "creds"}},
                {"name": "config", "configMap": {"name": "settings", "items": [{"key": "mode", "path": "conf/mode.txt"}]}},
                {"name": "proj", "projected": {"sources": [
                    {"secret": {"name": "creds", "items": [{"key": "pass", "path": "password"}]}},
                    {"configMap": {"name": "settings", "items": [{"key": "level", "path": "level"}]}},
                    {"downwardAPI": {"items": [{"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}]}},
                    {"serviceAccountToken": {"path": "token"}}
                ]}},
                {"name": "scratch", "emptyDir": {}},
                {"name": "mem", "emptyDir": {"medium": "Memory"}}
            ]
        }),
    );
    let (tx, task) = h.spawn(&pod);
    h.wait_status("vols", 60, running).await;
    let read = |path: &'static str| {
        let h = &h;
        async move { h.exec("vols", "c", &["cat", path]).await.1 }
    };
    assert_eq!(read("/etc/secret/user").await, "admin");
    assert_eq!(read("/etc/secret/pass").await, "s3cr3t");
    assert_eq!(read("/etc/config/conf/mode.txt").await, "fast");
    assert_eq!(read("/etc/proj/password").await, "s3cr3t");
    assert_eq!(read("/etc/proj/level").await, "3");
    assert_eq!(read("/etc/proj/name").await, "vols");
    assert_eq!(read("/etc/proj/token").await, "fake-token");
    let (code, _) = h.exec("vols", "c", &["touch", "/etc/config/x"]).await;
    assert_ne!(code, 0, "configMap volumes are read-only");
    let (_, env) = h.exec("vols", "c", &["env"]).await;
    for line in ["MODE=fast", "USER=admin", "POD=vols", "GREETING=hi admin"] {
        assert!(env.lines().any(|l| l == line), "missing {line} in {env}");
    }
    let (_, mounts) = h.exec("vols", "c", &["cat", "/proc/mounts"]).await;
    assert!(
        mounts.lines().any(|l| l.contains(" /mem ") && l.starts_with("tmpfs")),
        "{mounts}"
    );
    let (code, _) = h.exec("vols", "c", &["sh", "-c", "echo x > /scratch/f"]).await;
    assert_eq!(code, 0);
    let uid = pod.metadata.uid.clone().unwrap();
    let sub = h
        .ctx
        .data_dir
        .join("pods")
        .join(&uid)
        .join("volumes/kubernetes.io~empty-dir/scratch/sub/f");
    assert_eq!(std::fs::read_to_string(sub).unwrap(), "x\n");
    h.finish(tx, task).await;
    assert!(!h.ctx.data_dir.join("pods").join(&uid).exists(), "pod dir removed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_config_reports_create_container_config_error() {
    let h = Harness::new("cfgerr").await;
    let pod = h.pod(
        "cfg",
        serde_json::json!({
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": "busybox:latest", "command": ["sleep", "3600"],
                "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "nope", "key": "k"}}}]},
                {"name": "d", "image": "no-such-image:1.0", "imagePullPolicy": "Never"}]
        }),
    );
    let (tx, task) = h.spawn(&pod);
    let s = h
        .wait_status("cfg", 30, |s| {
            s.container_statuses
                .iter()
                .flatten()
                .filter(|c| c.state.as_ref().and_then(|st| st.waiting.as_ref()).is_some())
                .count()
                == 2
                && s.container_statuses.iter().flatten().all(|c| {
                    c.state
                        .as_ref()
                        .and_then(|st| st.waiting.as_ref())
                        .and_then(|w| w.reason.as_deref())
                        != Some("ContainerCreating")
                })
        })
        .await;
    let cs = s.container_statuses.unwrap();
    let waiting = |i: usize| cs[i].state.clone().unwrap().waiting.unwrap();
    assert_eq!(waiting(0).reason.as_deref(), Some("CreateContainerConfigError"));
    assert_eq!(waiting(0).message.as_deref(), Some("secret \"nope\" not found"));
    assert_eq!(waiting(1).reason.as_deref(), Some("ErrImageNeverPull"));
    assert_eq!(s.phase.as_deref(), Some("Pending"));
    h.finish(tx, task).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_adopts_running_containers() {
    let h = Harness::new("adopt").await;
    let pod = h.pod(
        "keep",
        serde_json::json!({
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": "busybox:latest", "command": ["sleep", "3600"]}]
        }),
    );
    let uid = pod.metadata.uid.clone().unwrap();
    let (tx, task) = h.spawn(&pod);
    h.wait_status("keep", 60, running).await;
    let before = docker::pod_runtime(&h.ctx.docker, &h.node, &uid).await.unwrap();
    // The agent dies: its worker stops without touching containers.
    task.abort();
    let _ = task.await;
    drop(tx);
    let still = docker::pod_runtime(&h.ctx.docker, &h.node, &uid).await.unwrap();
    assert!(still.containers.iter().all(|c| c.state == RunState::Running));
    assert!(still.running_sandbox().is_some());
    // A new agent adopts them: same containers, no restarts.
    h.api.statuses.lock().clear();
    let (tx, task) = h.spawn(&pod);
    let s = h.wait_status("keep", 30, running).await;
    assert_eq!(s.container_statuses.unwrap()[0].restart_count, 0);
    let after = docker::pod_runtime(&h.ctx.docker, &h.node, &uid).await.unwrap();
    let ids = |rt: &docker::PodRuntime| {
        let mut v: Vec<String> = rt
            .containers
            .iter()
            .chain(&rt.sandboxes)
            .map(|c| c.id.clone())
            .collect();
        v.sort();
        v
    };
    assert_eq!(ids(&before), ids(&after));
    h.finish(tx, task).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_deletion_stops_then_deletes_the_pod() {
    let h = Harness::new("del").await;
    let mut pod = h.pod(
        "bye",
        serde_json::json!({
            "terminationGracePeriodSeconds": 5,
            "containers": [{"name": "c", "image": "busybox:latest",
                "command": ["sh", "-c", "trap 'echo bye; exit 0' TERM; while true; do sleep 0.2; done"],
                "lifecycle": {"preStop": {"exec": {"command": ["sh", "-c", "echo stopping > /tmp/prestop"]}}}}]
        }),
    );
    let uid = pod.metadata.uid.clone().unwrap();
    let (tx, task) = h.spawn(&pod);
    h.wait_status("bye", 60, running).await;
    pod.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        jiff::Timestamp::now(),
    ));
    pod.metadata.deletion_grace_period_seconds = Some(5);
    let started = std::time::Instant::now();
    tx.send_replace(Some(pod));
    tokio::time::timeout(Duration::from_secs(60), task)
        .await
        .expect("worker ends")
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "SIGTERM ended the container before the grace period"
    );
    assert_eq!(h.api.deletes.lock().as_slice(), ["bye".to_string()]);
    assert!(
        docker::pod_runtime(&h.ctx.docker, &h.node, &uid)
            .await
            .unwrap()
            .containers
            .is_empty()
    );
    let events = h.event_reasons();
    assert!(
        events
            .iter()
            .any(|(r, m)| r == "Killing" && m == "Stopping container c"),
        "{events:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_containers_run_in_order_before_the_app() {
    let h = Harness::new("init").await;
    let pod = h.pod(
        "inits",
        serde_json::json!({
            "terminationGracePeriodSeconds": 1,
            "initContainers": [
                {"name": "first", "image": "busybox:latest", "command": ["sh", "-c", "echo one > /work/log"],
                 "volumeMounts": [{"name": "work", "mountPath": "/work"}]},
                {"name": "second", "image": "busybox:latest", "command": ["sh", "-c", "test -f /work/log && echo two >> /work/log"],
                 "volumeMounts": [{"name": "work", "mountPath": "/work"}]}
            ],
            "containers": [{"name": "app", "image": "busybox:latest", "command": ["sleep", "3600"],
                "volumeMounts": [{"name": "work", "mountPath": "/work"}]}],
            "volumes": [{"name": "work", "emptyDir": {}}]
        }),
    );
    let failing = h.pod(
        "init-fails",
        serde_json::json!({
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "initContainers": [{"name": "boom", "image": "busybox:latest", "command": ["sh", "-c", "exit 7"]}],
            "containers": [{"name": "app", "image": "busybox:latest", "command": ["sleep", "3600"]}]
        }),
    );
    let non_root = h.pod(
        "non-root",
        serde_json::json!({
            "terminationGracePeriodSeconds": 1,
            "securityContext": {"runAsNonRoot": true},
            "containers": [{"name": "app", "image": "busybox:latest", "command": ["sleep", "3600"]},
                           {"name": "uid", "image": "busybox:latest", "command": ["sleep", "3600"],
                            "securityContext": {"runAsUser": 1000, "runAsGroup": 1000}}]
        }),
    );
    let (t1, w1) = h.spawn(&pod);
    let (t2, w2) = h.spawn(&failing);
    let (t3, w3) = h.spawn(&non_root);
    let s = h.wait_status("inits", 60, running).await;
    let init = s
        .conditions
        .as_ref()
        .unwrap()
        .iter()
        .find(|c| c.type_ == "Initialized")
        .unwrap();
    assert_eq!(init.status, "True");
    for st in s.init_container_statuses.unwrap() {
        let t = st.state.unwrap().terminated.unwrap();
        assert_eq!(
            (t.exit_code, t.reason.as_deref()),
            (0, Some("Completed")),
            "{}",
            st.name
        );
    }
    assert_eq!(h.exec("inits", "app", &["cat", "/work/log"]).await.1, "one\ntwo\n");

    let s = h
        .wait_status("init-fails", 60, |s| s.phase.as_deref() == Some("Failed"))
        .await;
    let t = s.init_container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap()
        .terminated
        .unwrap();
    assert_eq!(t.exit_code, 7);
    let app = s.container_statuses.unwrap()[0].state.clone().unwrap().waiting.unwrap();
    assert_eq!(app.reason.as_deref(), Some("PodInitializing"));
    assert!(
        docker::list_node_containers(&h.ctx.docker, &h.node)
            .await
            .unwrap()
            .get(failing.metadata.uid.as_deref().unwrap())
            .is_some_and(|rt| rt.instances("app", false).is_empty())
    );

    let s = h
        .wait_status("non-root", 60, |s| {
            s.container_statuses
                .iter()
                .flatten()
                .any(|c| c.state.as_ref().is_some_and(|st| st.running.is_some()))
                && s.container_statuses.iter().flatten().any(|c| {
                    c.state
                        .as_ref()
                        .and_then(|st| st.waiting.as_ref())
                        .and_then(|w| w.reason.as_deref())
                        == Some("CreateContainerConfigError")
                })
        })
        .await;
    let cs = s.container_statuses.unwrap();
    let waiting = cs[0].state.clone().unwrap().waiting.unwrap();
    assert!(
        waiting
            .message
            .unwrap()
            .starts_with("container has runAsNonRoot and image will run as root")
    );
    assert_eq!(h.exec("non-root", "uid", &["id", "-u"]).await.1.trim(), "1000");
    h.finish(t1, w1).await;
    h.finish(t2, w2).await;
    h.finish(t3, w3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn active_deadline_fails_the_pod_and_stops_it() {
    let h = Harness::new("deadline").await;
    let mut pod = h.pod(
        "late",
        serde_json::json!({
            "activeDeadlineSeconds": 5,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": "busybox:latest", "command": ["sleep", "3600"]}]
        }),
    );
    pod.status = Some(serde_json::from_value(serde_json::json!({"startTime": "2020-01-01T00:00:00Z"})).unwrap());
    let (tx, task) = h.spawn(&pod);
    let s = h
        .wait_status("late", 60, |s| s.phase.as_deref() == Some("Failed"))
        .await;
    assert_eq!(s.reason.as_deref(), Some("DeadlineExceeded"));
    assert_eq!(
        s.message.as_deref(),
        Some("Pod was active on the node longer than the specified deadline")
    );
    let uid = pod.metadata.uid.clone().unwrap();
    let rt = docker::pod_runtime(&h.ctx.docker, &h.node, &uid).await.unwrap();
    assert!(
        rt.containers
            .iter()
            .chain(&rt.sandboxes)
            .all(|c| c.state != RunState::Running)
    );
    h.finish(tx, task).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resources_host_ports_and_host_network() {
    let h = Harness::new("res").await;
    let pod = h.pod(
        "limited",
        serde_json::json!({
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "c", "image": "busybox:latest",
                "command": ["sh", "-c", "mkdir -p /www && echo via-host-port > /www/index.html && exec httpd -f -p 80 -h /www"],
                "ports": [{"containerPort": 80, "hostPort": 38080}],
                "resources": {"limits": {"cpu": "500m", "memory": "64Mi"}, "requests": {"cpu": "250m", "memory": "64Mi"}}
            }]
        }),
    );
    let host = h.pod(
        "on-host",
        serde_json::json!({
            "hostNetwork": true,
            "terminationGracePeriodSeconds": 1,
            "hostAliases": [{"ip": "10.9.9.9", "hostnames": ["alias.test"]}],
            "containers": [{"name": "c", "image": "busybox:latest", "command": ["sleep", "3600"]}]
        }),
    );
    let (t1, w1) = h.spawn(&pod);
    let (t2, w2) = h.spawn(&host);
    let s = h.wait_status("limited", 60, running).await;
    assert_eq!(s.qos_class.as_deref(), Some("Burstable"));
    let id = skiff_agent::server::find_container(&h.ctx.docker, &h.node, "default", "limited", "c", false)
        .await
        .unwrap()
        .unwrap();
    let info = h
        .ctx
        .docker
        .inspect_container(&id, None::<bollard::query_parameters::InspectContainerOptions>)
        .await
        .unwrap();
    let hc = info.host_config.unwrap();
    assert_eq!(hc.memory, Some(64 * 1024 * 1024));
    assert_eq!(
        (hc.cpu_quota, hc.cpu_period, hc.cpu_shares),
        (Some(50_000), Some(100_000), Some(256))
    );
    // The host port is published by the sandbox.
    let mut body = String::new();
    for _ in 0..20 {
        if let Ok(mut stream) = tokio::net::TcpStream::connect("127.0.0.1:38080").await {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            stream.write_all(b"GET /index.html HTTP/1.0\r\n\r\n").await.unwrap();
            let _ = stream.read_to_string(&mut body).await;
            if body.contains("via-host-port") {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(body.contains("via-host-port"), "{body}");

    let s = h.wait_status("on-host", 60, running).await;
    assert_eq!(
        s.pod_ip.as_deref(),
        Some("127.0.0.1"),
        "host network pods report the host IP"
    );
    let (_, hosts) = h.exec("on-host", "c", &["cat", "/etc/hosts"]).await;
    assert!(
        hosts.ends_with("# Entries added by HostAliases.\n10.9.9.9\talias.test\n"),
        "{hosts}"
    );
    let (_, host_name) = h.exec("on-host", "c", &["hostname"]).await;
    let real = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_eq!(host_name.trim(), real.trim());
    h.finish(t1, w1).await;
    h.finish(t2, w2).await;
}

struct Pki {
    ca_pem: String,
    client_cert_pem: String,
    client_key_pem: String,
}

fn pki() -> Pki {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "test-ca");
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let client_key = KeyPair::generate().unwrap();
    let mut client_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    client_params
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver-kubelet-client");
    let client_cert = client_params.signed_by(&client_key, &issuer).unwrap();
    Pki {
        ca_pem: ca_cert.pem(),
        client_cert_pem: client_cert.pem(),
        client_key_pem: client_key.serialize_pem(),
    }
}

async fn agent_client(addr: std::net::SocketAddr, cert: Option<(&str, &str)>) -> kube::Client {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let user = match cert {
        Some((c, k)) => format!(
            "    client-certificate-data: {}\n    client-key-data: {}\n",
            b64(c),
            b64(k)
        ),
        None => "    username: nobody\n".to_string(),
    };
    let yaml = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: agent\n  cluster:\n    server: https://{addr}\n    insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n{user}contexts:\n- name: c\n  context:\n    cluster: agent\n    user: u\ncurrent-context: c\n"
    );
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&yaml).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(config).unwrap()
}

/// Reads frames until the server closes: (stdout, stderr, status).
async fn collect_frames(
    mut ws: impl futures::Stream<
        Item = Result<tokio_tungstenite::tungstenite::Message, tokio_tungstenite::tungstenite::Error>,
    > + Unpin,
) -> (String, String, String) {
    use futures::StreamExt;
    let (mut out, mut err, mut status) = (Vec::new(), Vec::new(), Vec::new());
    while let Some(Ok(msg)) = tokio::time::timeout(Duration::from_secs(20), ws.next()).await.unwrap() {
        if let tokio_tungstenite::tungstenite::Message::Binary(data) = msg
            && let Some((&channel, payload)) = data.split_first()
        {
            match channel {
                1 => out.extend_from_slice(payload),
                2 => err.extend_from_slice(payload),
                3 => status.extend_from_slice(payload),
                _ => {}
            }
        }
    }
    let s = |v: Vec<u8>| String::from_utf8_lossy(&v).into_owned();
    (s(out), s(err), s(status))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_endpoint_serves_logs_and_exec_to_ca_signed_clients() {
    use futures::{SinkExt, StreamExt};
    let _ = rustls::crypto::ring::default_provider().install_default();
    let h = Harness::new("stream").await;
    let pod = h.pod(
        "talk",
        serde_json::json!({
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": "busybox:latest",
                "command": ["sh", "-c", "echo line-one; echo line-two; exec sleep 3600"]},
                {"name": "ticker", "image": "busybox:latest",
                "command": ["sh", "-c", "while true; do echo tick; sleep 0.3; done"]},
                {"name": "web", "image": "busybox:latest",
                "command": ["sh", "-c", "mkdir -p /www && echo pf-ok > /www/index.html && exec httpd -f -p 8080 -h /www"]}]
        }),
    );
    let (tx, task) = h.spawn(&pod);
    h.wait_status("talk", 60, running).await;

    let pki = pki();
    let state = skiff_agent::server::ServerState {
        docker: h.ctx.docker.clone(),
        node: h.node.clone(),
    };
    let addr = skiff_agent::server::serve(
        "127.0.0.1:0".parse().unwrap(),
        &pki.ca_pem,
        vec!["127.0.0.1".into(), "localhost".into()],
        state,
    )
    .await
    .unwrap()
    .addr;
    let client = agent_client(addr, Some((&pki.client_cert_pem, &pki.client_key_pem))).await;

    let logs = client
        .request_text(
            http::Request::get("/containerLogs/default/talk/c")
                .body(Vec::new())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(logs, "line-one\nline-two\n");
    let tail = client
        .request_text(
            http::Request::get("/containerLogs/default/talk/c?tailLines=1")
                .body(Vec::new())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(tail, "line-two\n");
    let missing = client
        .request_text(
            http::Request::get("/containerLogs/default/talk/nope")
                .body(Vec::new())
                .unwrap(),
        )
        .await;
    assert!(missing.is_err());

    // exec: stdout, stderr and a non-zero exit code in the status channel.
    let uri = "/exec/default/talk/c?command=sh&command=-c&command=echo%20out%3B%20echo%20err%20%3E%262%3B%20exit%203&stdout=true&stderr=true";
    let conn = client
        .connect(http::Request::get(uri).body(Vec::new()).unwrap())
        .await
        .unwrap();
    assert!(conn.supports_stream_close(), "v5.channel.k8s.io negotiated");
    let (out, err, status) = collect_frames(conn.into_stream()).await;
    assert_eq!((out.as_str(), err.as_str()), ("out\n", "err\n"));
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["reason"], "NonZeroExitCode");
    assert_eq!(status["details"]["causes"][0]["message"], "3");

    // exec with stdin, closed through the v5 close frame.
    let uri = "/exec/default/talk/c?command=cat&stdin=true&stdout=true&stderr=true";
    let conn = client
        .connect(http::Request::get(uri).body(Vec::new()).unwrap())
        .await
        .unwrap();
    let (mut sink, stream) = conn.into_stream().split();
    use tokio_tungstenite::tungstenite::Message;
    sink.send(Message::Binary([&[0u8][..], b"hello stdin"].concat().into()))
        .await
        .unwrap();
    sink.send(Message::Binary(vec![255u8, 0].into())).await.unwrap();
    let (out, _, status) = collect_frames(stream).await;
    assert_eq!(out, "hello stdin");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&status).unwrap()["status"],
        "Success"
    );

    // exec with a terminal: output comes on stdout through the pty.
    let uri = "/exec/default/talk/c?command=tty&stdout=true&tty=true";
    let conn = client
        .connect(http::Request::get(uri).body(Vec::new()).unwrap())
        .await
        .unwrap();
    let (out, _, _) = collect_frames(conn.into_stream()).await;
    assert!(out.starts_with("/dev/pts/"), "tty output: {out:?}");

    // attach: the running process's output arrives on stdout.
    let conn = client
        .connect(
            http::Request::get("/attach/default/talk/ticker?stdout=true&stderr=true")
                .body(Vec::new())
                .unwrap(),
        )
        .await
        .unwrap();
    let mut stream = conn.into_stream();
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("tick") {
        match tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .unwrap()
        {
            Some(Ok(Message::Binary(frame))) if frame.first() == Some(&1) => seen.extend_from_slice(&frame[1..]),
            Some(Ok(_)) => {}
            other => panic!("attach ended early: {other:?}"),
        }
    }
    drop(stream);

    // Port forwarding: initial port frames on the data and error channels, then bytes both ways.
    let conn = client
        .connect(
            http::Request::get("/portForward/default/talk?ports=8080")
                .body(Vec::new())
                .unwrap(),
        )
        .await
        .unwrap();
    let (mut sink, mut stream) = conn.into_stream().split();
    for expected in [0u8, 1] {
        let Some(Ok(Message::Binary(frame))) = stream.next().await else {
            panic!("port frame")
        };
        assert_eq!(
            frame.as_ref(),
            [expected, 0x90, 0x1f],
            "port 8080 little-endian on channel {expected}"
        );
    }
    let request = b"GET /index.html HTTP/1.0\r\nHost: localhost\r\n\r\n";
    sink.send(Message::Binary([&[0u8][..], request].concat().into()))
        .await
        .unwrap();
    let mut received = Vec::new();
    while !String::from_utf8_lossy(&received).contains("pf-ok") {
        match tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .unwrap()
        {
            Some(Ok(Message::Binary(frame))) if frame.first() == Some(&0) => received.extend_from_slice(&frame[1..]),
            Some(Ok(_)) => {}
            other => panic!(
                "port-forward stream ended early: {other:?}; got {}",
                String::from_utf8_lossy(&received)
            ),
        }
    }
    assert!(
        String::from_utf8_lossy(&received).starts_with("HTTP/1.")
            && String::from_utf8_lossy(&received).contains(" 200 OK")
    );
    drop(sink);

    // Without a client certificate the TLS handshake is refused.
    let anonymous = agent_client(addr, None).await;
    let denied = anonymous
        .request_text(http::Request::get("/healthz").body(Vec::new()).unwrap())
        .await;
    assert!(denied.is_err(), "a client without a certificate is rejected");

    h.finish(tx, task).await;
}
