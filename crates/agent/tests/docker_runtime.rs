//! The pod worker against the real Docker Engine and the project's own API server, started
//! in-process for each test (no controllers or scheduler: pods are created with `spec.nodeName` set).
//! Every test uses its own node name; a guard removes every container and volume labelled with it,
//! even when the test fails.

#![cfg(test)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Pod, PodStatus, Secret};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use parking_lot::Mutex;
use skiff_agent::docker::{self, RunState};
use skiff_agent::events;
use skiff_agent::worker::{self, Ctx};
use tokio::sync::{OnceCell, oneshot, watch};

static IMAGES: OnceCell<()> = OnceCell::const_new();

/// The cluster identity the test nodes' containers are labelled with (each test's node has a name
/// of its own, so one identity serves them all).
const TEST_CLUSTER: &str = "docker-runtime-tests";

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

/// What the watch on pods delivered, in order.
#[derive(Default)]
struct History {
    /// Every status seen on ADDED or MODIFIED: (pod name, resourceVersion, status).
    statuses: Vec<(String, u64, PodStatus)>,
    /// Statuses at or below this resourceVersion were cleared (`Harness::clear_statuses`).
    cleared: u64,
    /// The pods seen DELETED.
    deleted: Vec<String>,
}

fn revision(pod: &Pod) -> u64 {
    pod.metadata
        .resource_version
        .as_deref()
        .and_then(|rv| rv.parse().ok())
        .expect("a resourceVersion is the store's revision")
}

/// Watches pods and records every status and deletion into `history`; `ready` fires once the
/// initial list is done, so every later change is seen.
async fn record(pods: Api<Pod>, history: Arc<Mutex<History>>, ready: oneshot::Sender<()>) {
    let mut ready = Some(ready);
    let mut stream = std::pin::pin!(watcher(pods, watcher::Config::default()).default_backoff());
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => {
                let name = pod.metadata.name.clone().unwrap_or_default();
                let rv = revision(&pod);
                history.lock().statuses.push((name, rv, pod.status.unwrap_or_default()));
            }
            Ok(watcher::Event::Delete(pod)) => {
                history.lock().deleted.push(pod.metadata.name.unwrap_or_default());
            }
            Ok(watcher::Event::InitDone) => {
                if let Some(ready) = ready.take() {
                    let _ = ready.send(());
                }
            }
            Ok(watcher::Event::Init) => {}
            Err(e) => eprintln!("watching pods: {e}"),
        }
    }
}

/// Aborts the task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

struct Harness {
    ctx: Arc<Ctx>,
    client: kube::Client,
    node: String,
    history: Arc<Mutex<History>>,
    _recorder: AbortOnDrop,
    _server: skiff_apiserver::Running,
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
        let guard = Guard(node.clone());
        let dir = tempfile::tempdir().unwrap();

        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut opts = skiff_apiserver::ServerOptions::new(dir.path().join("server"), 0);
        opts.bind = "127.0.0.1".parse().unwrap();
        let server = skiff_apiserver::start(opts).await.unwrap();
        let client = skiff_apiserver::client(server.state.clone());
        common::as_the_controllers_would(&client, &dir.path().join("server")).await;

        let history = Arc::new(Mutex::new(History::default()));
        let (ready_tx, ready) = oneshot::channel();
        let recorder = AbortOnDrop(tokio::spawn(record(
            Api::namespaced(client.clone(), "default"),
            history.clone(),
            ready_tx,
        )));
        tokio::time::timeout(Duration::from_secs(30), ready)
            .await
            .expect("the watch on pods starts")
            .expect("the watch on pods starts");

        let data_dir = dir.path().join("agent");
        std::fs::create_dir_all(&data_dir).unwrap();
        let ctx = Arc::new(Ctx {
            client: client.clone(),
            docker,
            node: node.clone(),
            cluster: TEST_CLUSTER.into(),
            data_dir,
            host_ip: "127.0.0.1".into(),
            recorder: events::kubelet(client.clone(), &node),
            allocatable_cpu_milli: 2000,
            allocatable_memory: 1 << 30,
            allocatable_storage: 1 << 34,
            images: Default::default(),
            dns: skiff_agent::resolv_conf::NodeDns {
                cluster_dns: vec!["10.96.0.10".parse().unwrap()],
                cluster_domain: "cluster.local".into(),
                host_resolv_conf: "nameserver 192.0.2.53\nsearch corp.example\n".into(),
            },
            hairpin_bridge: None,
            pod_network: "bridge".into(),
            evicted: Default::default(),
        });
        Harness {
            ctx,
            client,
            node,
            history,
            _recorder: recorder,
            _server: server,
            _dir: dir,
            _guard: guard,
        }
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), "default")
    }

    /// Creates the pod, bound to the test node, and returns it as the server stored it.
    async fn pod(&self, name: &str, spec: serde_json::Value) -> Pod {
        let mut spec = spec;
        spec["nodeName"] = serde_json::json!(self.node);
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": spec,
        }))
        .unwrap();
        self.pods()
            .create(&PostParams::default(), &pod)
            .await
            .unwrap_or_else(|e| panic!("creating pod {name}: {e}"))
    }

    /// Creates an object (a Secret, a ConfigMap, ...) in the `default` namespace.
    async fn put<K>(&self, object: serde_json::Value) -> K
    where
        K: kube::Resource<Scope = NamespaceResourceScope, DynamicType = ()>
            + Clone
            + std::fmt::Debug
            + serde::Serialize
            + serde::de::DeserializeOwned,
    {
        let object: K = serde_json::from_value(object).unwrap();
        Api::<K>::namespaced(self.client.clone(), "default")
            .create(&PostParams::default(), &object)
            .await
            .unwrap_or_else(|e| panic!("creating {object:?}: {e}"))
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

    /// Forgets the statuses seen so far: every status written until now, also one whose watch
    /// event has not arrived yet (its resourceVersion is at most the current one).
    async fn clear_statuses(&self) {
        let list = self.pods().list_metadata(&ListParams::default()).await.unwrap();
        let now: u64 = list
            .metadata
            .resource_version
            .as_deref()
            .and_then(|rv| rv.parse().ok())
            .expect("a list's resourceVersion is the store's revision");
        let mut history = self.history.lock();
        history.cleared = now;
        history.statuses.retain(|(_, rv, _)| *rv > now);
    }

    async fn wait_status(&self, name: &str, secs: u64, pred: impl Fn(&PodStatus) -> bool) -> PodStatus {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
        loop {
            let latest = {
                let history = self.history.lock();
                history
                    .statuses
                    .iter()
                    .rev()
                    .find(|(n, rv, _)| n == name && *rv > history.cleared)
                    .map(|(_, _, s)| s.clone())
            };
            if let Some(status) = latest {
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
        let id =
            skiff_agent::server::find_container(&self.ctx.docker, self.ctx.owner(), "default", pod, container, false)
                .await
                .unwrap()
                .expect("container exists");
        let cmd: Vec<String> = cmd.iter().map(|s| s.to_string()).collect();
        skiff_agent::probes::exec_output(&self.ctx.docker, &id, &cmd)
            .await
            .unwrap()
    }

    /// The (reason, message) of every Event in the namespace, as listed from the API.
    async fn event_reasons(&self) -> Vec<(String, String)> {
        Api::<Event>::namespaced(self.client.clone(), "default")
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
            .collect()
    }

    /// The events once `pred` holds of them, or as they are after 10 seconds: the recorder writes
    /// events in the background, so one may land after the status a test waited for.
    async fn events_until(&self, pred: impl Fn(&[(String, String)]) -> bool) -> Vec<(String, String)> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let events = self.event_reasons().await;
            if pred(&events) || tokio::time::Instant::now() > deadline {
                return events;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The pods the watch saw deleted, once `name` is among them (or after 10 seconds).
    async fn deleted_after(&self, name: &str) -> Vec<String> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let deleted = self.history.lock().deleted.clone();
            if deleted.iter().any(|d| d == name) || tokio::time::Instant::now() > deadline {
                return deleted;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
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
    ).await;
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
    let reasons: Vec<String> = h
        .events_until(|e| {
            ["Pulled", "Created", "Started"]
                .iter()
                .all(|r| e.iter().any(|(x, _)| x == r))
        })
        .await
        .into_iter()
        .map(|(r, _)| r)
        .collect();
    for r in ["Pulled", "Created", "Started"] {
        assert!(reasons.iter().any(|x| x == r), "missing {r} event in {reasons:?}");
    }
    let cs = status.container_statuses.unwrap();
    assert!(
        cs.iter()
            .all(|c| { c.container_id.as_deref().is_some_and(|id| id.starts_with("docker://")) })
    );
    h.finish(tx, task).await;
    let left = docker::list_node_containers(&h.ctx.docker, h.ctx.owner())
        .await
        .unwrap();
    assert!(left.is_empty(), "containers removed after teardown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_pid_namespace_and_host_aliases() {
    let h = Harness::new("pid").await;
    let pod = h
        .pod(
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
        )
        .await;
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
    let never_ok = h.pod("never-ok", spec("Never", "echo done; exit 0")).await;
    let never_fail = h.pod("never-fail", spec("Never", "exit 3")).await;
    let crash = h.pod("crash", spec("OnFailure", "exit 1")).await;
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
    let backoff = |(r, m): &(String, String)| {
        r == "BackOff" && m.starts_with("Back-off restarting failed container c in pod crash_default(")
    };
    assert!(h.events_until(|e| e.iter().any(backoff)).await.iter().any(backoff));
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
    ).await;
    let (tx, task) = h.spawn(&pod);
    let s = h
        .wait_status("sick", 60, |s| {
            s.container_statuses.iter().flatten().any(|c| c.restart_count >= 1)
        })
        .await;
    assert_eq!(s.container_statuses.unwrap()[0].restart_count, 1);
    let unhealthy = |(r, m): &(String, String)| r == "Unhealthy" && m.starts_with("Liveness probe failed: ");
    let killing =
        |(r, m): &(String, String)| r == "Killing" && m == "Container c failed liveness probe, will be restarted";
    let events = h
        .events_until(|e| e.iter().any(unhealthy) && e.iter().any(killing))
        .await;
    assert!(events.iter().any(unhealthy), "{events:?}");
    assert!(events.iter().any(killing), "{events:?}");
    h.finish(tx, task).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secret_config_map_and_projected_volumes() {
    let h = Harness::new("vol").await;
    h.put::<Secret>(serde_json::json!({"apiVersion":"v1","kind":"Secret","metadata":{"name":"creds"},"data":{"user":"YWRtaW4=","pass":"czNjcjN0"}}),
    ).await;
    h.put::<ConfigMap>(serde_json::json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"settings"},"data":{"mode":"fast","level":"3"}}),
    ).await;
    // The projected serviceAccountToken is requested from the `default` ServiceAccount's
    // TokenRequest: the harness made the account, as its controller would.
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
    ).await;
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
    // The token is minted by the server's TokenRequest, so its value is not known here.
    let token = read("/etc/proj/token").await;
    assert!(
        !token.is_empty(),
        "the projected token is the one the API server issued"
    );
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

/// CVE-2017-1002101: a symlink planted in a volume must not lead a subPath mount out of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subpath_symlinks_never_lead_out_of_the_volume() {
    let h = Harness::new("subpath").await;
    let outside = format!("/tmp/{}", unique("skiff-escape"));
    let plant = "ln -s / /vol/x && ln -s /tmp /vol/t && mkdir /vol/ok && echo fine > /vol/ok/f && ln -s ok /vol/inside";
    let pod = h
        .pod(
            "escape",
            serde_json::json!({
                "terminationGracePeriodSeconds": 1,
                "initContainers": [{"name": "plant", "image": "busybox:latest", "command": ["sh", "-c", plant],
                    "volumeMounts": [{"name": "vol", "mountPath": "/vol"}]}],
                "containers": [
                    {"name": "root", "image": "busybox:latest", "command": ["sleep", "3600"],
                     "volumeMounts": [{"name": "vol", "mountPath": "/host", "subPath": "x"}]},
                    {"name": "create", "image": "busybox:latest", "command": ["sleep", "3600"],
                     "volumeMounts": [{"name": "vol", "mountPath": "/host", "subPath": format!("t/{}", &outside[5..])}]},
                    {"name": "fine", "image": "busybox:latest", "command": ["sleep", "3600"],
                     "volumeMounts": [{"name": "vol", "mountPath": "/data", "subPath": "inside"}]}
                ],
                "volumes": [{"name": "vol", "emptyDir": {}}]
            }),
        )
        .await;
    let (tx, task) = h.spawn(&pod);
    let waiting = |s: &PodStatus, name: &str| {
        s.container_statuses
            .iter()
            .flatten()
            .find(|c| c.name == name)
            .and_then(|c| c.state.as_ref()?.waiting.as_ref())
            .filter(|w| w.reason.as_deref() == Some("CreateContainerConfigError"))
            .and_then(|w| w.message.clone())
    };
    let s = h
        .wait_status("escape", 60, |s| {
            waiting(s, "root").is_some()
                && waiting(s, "create").is_some()
                && s.container_statuses
                    .iter()
                    .flatten()
                    .any(|c| c.name == "fine" && c.ready)
        })
        .await;
    assert_eq!(
        waiting(&s, "root").as_deref(),
        Some("failed to prepare subPath for volumeMount \"vol\" of container \"root\"")
    );
    assert_eq!(
        waiting(&s, "create").as_deref(),
        Some("failed to create subPath directory for volumeMount \"vol\" of container \"create\"")
    );
    assert!(
        !std::path::Path::new(&outside).exists(),
        "nothing is created outside the volume"
    );
    // A symlink that stays inside the volume is followed, as upstream does.
    assert_eq!(h.exec("escape", "fine", &["cat", "/data/f"]).await.1, "fine\n");
    let (code, _) = h.exec("escape", "fine", &["ls", "/data/etc/hostname"]).await;
    assert_ne!(code, 0, "the host's / is not reachable through the subPath");
    let failed = |(r, m): &(String, String)| {
        r == "Failed" && m == "Error: failed to prepare subPath for volumeMount \"vol\" of container \"root\""
    };
    let events = h.events_until(|e| e.iter().any(failed)).await;
    assert!(events.iter().any(failed), "{events:?}");

    let uid = pod.metadata.uid.clone().unwrap();
    let pod_dir = h.ctx.data_dir.join("pods").join(&uid).canonicalize().unwrap();
    let mounted_under = |dir: &std::path::Path| {
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter(|l| {
                l.split(' ')
                    .nth(4)
                    .is_some_and(|p| std::path::Path::new(p).starts_with(dir))
            })
            .count()
    };
    assert_eq!(
        mounted_under(&pod_dir),
        1,
        "the subPath of `fine` is bind-mounted under the pod's directory"
    );
    h.finish(tx, task).await;
    assert_eq!(mounted_under(&pod_dir), 0, "subPath mounts are unmounted with the pod");
    assert!(!pod_dir.exists(), "pod dir removed");
}

/// Each pod's /etc/resolv.conf by the kubelet's dnsPolicy rules.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolv_conf_follows_the_dns_policy() {
    let h = Harness::new("dns").await;
    let sleep = serde_json::json!([{"name": "c", "image": "busybox:latest", "command": ["sleep", "3600"]}]);
    let cases = [
        (
            "cluster-first",
            serde_json::json!({"terminationGracePeriodSeconds": 1, "containers": sleep}),
            "search default.svc.cluster.local svc.cluster.local cluster.local corp.example\nnameserver 10.96.0.10\noptions ndots:5\n",
        ),
        (
            "default",
            serde_json::json!({"terminationGracePeriodSeconds": 1, "dnsPolicy": "Default", "containers": sleep}),
            "search corp.example\nnameserver 192.0.2.53\n",
        ),
        (
            "none",
            serde_json::json!({"terminationGracePeriodSeconds": 1, "dnsPolicy": "None", "containers": sleep,
            "dnsConfig": {"nameservers": ["192.0.2.1"], "searches": ["a.example"], "options": [{"name": "ndots", "value": "2"}]}}),
            "search a.example\nnameserver 192.0.2.1\noptions ndots:2\n",
        ),
    ];
    let mut workers = Vec::new();
    for (name, spec, _) in &cases {
        let pod = h.pod(name, spec.clone()).await;
        workers.push(h.spawn(&pod));
    }
    for (name, _, want) in &cases {
        h.wait_status(name, 60, running).await;
        assert_eq!(h.exec(name, "c", &["cat", "/etc/resolv.conf"]).await.1, *want, "{name}");
    }
    for (tx, task) in workers {
        h.finish(tx, task).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_config_reports_create_container_config_error() {
    let h = Harness::new("cfgerr").await;
    let pod = h
        .pod(
            "cfg",
            serde_json::json!({
                "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "c", "image": "busybox:latest", "command": ["sleep", "3600"],
                    "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "nope", "key": "k"}}}]},
                    {"name": "d", "image": "no-such-image:1.0", "imagePullPolicy": "Never"}]
            }),
        )
        .await;
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
    let pod = h
        .pod(
            "keep",
            serde_json::json!({
                "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "c", "image": "busybox:latest", "command": ["sleep", "3600"]}]
            }),
        )
        .await;
    let uid = pod.metadata.uid.clone().unwrap();
    let (tx, task) = h.spawn(&pod);
    h.wait_status("keep", 60, running).await;
    let before = docker::pod_runtime(&h.ctx.docker, h.ctx.owner(), &uid).await.unwrap();
    // The agent dies: its worker stops without touching containers.
    task.abort();
    let _ = task.await;
    drop(tx);
    let still = docker::pod_runtime(&h.ctx.docker, h.ctx.owner(), &uid).await.unwrap();
    assert!(still.containers.iter().all(|c| c.state == RunState::Running));
    assert!(still.running_sandbox().is_some());
    // A new agent adopts them: same containers, no restarts.
    h.clear_statuses().await;
    // The new worker is given the pod as created (no status), so it stamps a new startTime; the
    // server writes (and the watch shows) only a status that changed, and times have a resolution of
    // one second: a second after the old worker's last write, the new worker's first report is a change.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (tx, task) = h.spawn(&pod);
    let s = h.wait_status("keep", 30, running).await;
    assert_eq!(s.container_statuses.unwrap()[0].restart_count, 0);
    let after = docker::pod_runtime(&h.ctx.docker, h.ctx.owner(), &uid).await.unwrap();
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

/// A container an older agent made carries no cluster label: a pod of this cluster still finds it by
/// its uid (and keeps it across the upgrade), while the orphan sweep's listing never sees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_without_a_cluster_label_belong_to_their_pod_and_are_never_orphans() {
    let docker = docker::connect().await.expect("connecting to Docker");
    ensure_images(&docker).await;
    let node = unique("test-legacy");
    let _guard = Guard(node.clone());
    let uid = format!("{}-uid", unique("legacy"));
    let labels = [
        docker::label(docker::LABEL_NODE, &node),
        docker::label(docker::LABEL_POD_UID, &uid),
        docker::label(docker::LABEL_TYPE, "container"),
        docker::label(docker::LABEL_CONTAINER_NAME, "c"),
    ];
    let mut cmd = std::process::Command::new("docker");
    cmd.arg("create");
    for l in &labels {
        cmd.args(["--label", l]);
    }
    let out = cmd
        .args(["busybox:latest", "sleep", "1"])
        .output()
        .expect("docker create");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let owner = docker::Owner {
        node: &node,
        cluster: TEST_CLUSTER,
    };
    let rt = docker::pod_runtime(&docker, owner, &uid).await.unwrap();
    let found: Vec<&str> = rt.containers.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(found, [id.as_str()], "the pod finds its unlabelled container by uid");
    let listed = docker::list_node_containers(&docker, owner).await.unwrap();
    assert!(!listed.contains_key(&uid), "the orphan sweep never sees it");
    let unowned = docker::unowned_node_containers(&docker, &node).await.unwrap();
    assert_eq!(unowned, [id]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_deletion_stops_then_deletes_the_pod() {
    let h = Harness::new("del").await;
    let pod = h
        .pod(
            "bye",
            serde_json::json!({
                "terminationGracePeriodSeconds": 5,
                "containers": [{"name": "c", "image": "busybox:latest",
                    "command": ["sh", "-c", "trap 'echo bye; exit 0' TERM; while true; do sleep 0.2; done"],
                    "lifecycle": {"preStop": {"exec": {"command": ["sh", "-c", "echo stopping > /tmp/prestop"]}}}}]
            }),
        )
        .await;
    let uid = pod.metadata.uid.clone().unwrap();
    let (tx, task) = h.spawn(&pod);
    h.wait_status("bye", 60, running).await;
    // A user deletes the pod: the server marks it for deletion with the grace period of its spec and
    // keeps it until the node confirms.
    let pods = h.pods();
    let deleting = pods
        .delete("bye", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .expect("a running pod on a node is deleted gracefully: the server returns it, marked");
    assert!(deleting.metadata.deletion_timestamp.is_some());
    assert_eq!(deleting.metadata.deletion_grace_period_seconds, Some(5));
    let started = std::time::Instant::now();
    tx.send_replace(Some(deleting));
    tokio::time::timeout(Duration::from_secs(60), task)
        .await
        .expect("worker ends")
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "SIGTERM ended the container before the grace period"
    );
    // The worker's confirmation removed the pod from the API, and it is the only pod deleted.
    match pods.get("bye").await {
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        other => panic!("pod bye is gone after its graceful deletion, got {other:?}"),
    }
    assert_eq!(h.deleted_after("bye").await, ["bye".to_string()]);
    assert!(
        docker::pod_runtime(&h.ctx.docker, h.ctx.owner(), &uid)
            .await
            .unwrap()
            .containers
            .is_empty()
    );
    let killing = |(r, m): &(String, String)| r == "Killing" && m == "Stopping container c";
    let events = h.events_until(|e| e.iter().any(killing)).await;
    assert!(events.iter().any(killing), "{events:?}");
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
    ).await;
    let failing = h
        .pod(
            "init-fails",
            serde_json::json!({
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 1,
                "initContainers": [{"name": "boom", "image": "busybox:latest", "command": ["sh", "-c", "exit 7"]}],
                "containers": [{"name": "app", "image": "busybox:latest", "command": ["sleep", "3600"]}]
            }),
        )
        .await;
    let non_root = h
        .pod(
            "non-root",
            serde_json::json!({
                "terminationGracePeriodSeconds": 1,
                "securityContext": {"runAsNonRoot": true},
                "containers": [{"name": "app", "image": "busybox:latest", "command": ["sleep", "3600"]},
                               {"name": "uid", "image": "busybox:latest", "command": ["sleep", "3600"],
                                "securityContext": {"runAsUser": 1000, "runAsGroup": 1000}}]
            }),
        )
        .await;
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
        docker::list_node_containers(&h.ctx.docker, h.ctx.owner())
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
    h.pod(
        "late",
        serde_json::json!({
            "activeDeadlineSeconds": 5,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": "busybox:latest", "command": ["sleep", "3600"]}]
        }),
    )
    .await;
    // The pod has been active for years: its start time, set through the status subresource.
    let patch = serde_json::json!({"status": {"startTime": "2020-01-01T00:00:00Z"}});
    let pod = h
        .pods()
        .patch_status("late", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
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
    let rt = docker::pod_runtime(&h.ctx.docker, h.ctx.owner(), &uid).await.unwrap();
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
    ).await;
    let host = h
        .pod(
            "on-host",
            serde_json::json!({
                "hostNetwork": true,
                "terminationGracePeriodSeconds": 1,
                "hostAliases": [{"ip": "10.9.9.9", "hostnames": ["alias.test"]}],
                "containers": [{"name": "c", "image": "busybox:latest", "command": ["sleep", "3600"]}]
            }),
        )
        .await;
    let (t1, w1) = h.spawn(&pod);
    let (t2, w2) = h.spawn(&host);
    let s = h.wait_status("limited", 60, running).await;
    assert_eq!(s.qos_class.as_deref(), Some("Burstable"));
    let id = skiff_agent::server::find_container(&h.ctx.docker, h.ctx.owner(), "default", "limited", "c", false)
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
    user_cert_pem: String,
    user_key_pem: String,
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
    let user_key = KeyPair::generate().unwrap();
    let mut user_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    user_params.distinguished_name.push(DnType::CommonName, "jane");
    let user_cert = user_params.signed_by(&user_key, &issuer).unwrap();
    Pki {
        ca_pem: ca_cert.pem(),
        client_cert_pem: client_cert.pem(),
        client_key_pem: client_key.serialize_pem(),
        user_cert_pem: user_cert.pem(),
        user_key_pem: user_key.serialize_pem(),
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
    use futures::SinkExt;
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
    ).await;
    let (tx, task) = h.spawn(&pod);
    h.wait_status("talk", 60, running).await;

    let pki = pki();
    let state = skiff_agent::server::ServerState {
        docker: h.ctx.docker.clone(),
        node: h.node.clone(),
        cluster: h.ctx.cluster.clone(),
        // Callers are authorized by the harness's API server (its RBAC binds the API server's
        // kubelet client certificate, and nothing binds jane).
        client: Some(h.ctx.client.clone()),
        stats: skiff_agent::stats::Sampler::default(),
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

    // Without a certificate or a token: 401, as upstream's kubelet answers.
    let anonymous = agent_client(addr, None).await;
    let denied = anonymous
        .request_text(http::Request::get("/healthz").body(Vec::new()).unwrap())
        .await
        .expect_err("a caller without credentials is refused");
    assert!(denied.to_string().contains("Unauthorized"), "{denied}");
    // A token the API server does not vouch for is no credential either.
    let forged = anonymous
        .request_text(
            http::Request::get("/healthz")
                .header("Authorization", "Bearer not-a-token")
                .body(Vec::new())
                .unwrap(),
        )
        .await
        .expect_err("a forged token is refused");
    assert!(forged.to_string().contains("Unauthorized"), "{forged}");

    // A certificate the same CA signed for a user RBAC grants nothing on the node is refused:
    // the agent is no way around the API server's authorization.
    let user = agent_client(addr, Some((&pki.user_cert_pem, &pki.user_key_pem))).await;
    let refused = user
        .request_text(
            http::Request::get("/containerLogs/default/talk/c")
                .body(Vec::new())
                .unwrap(),
        )
        .await
        .expect_err("a user certificate is refused");
    assert!(
        refused
            .to_string()
            .contains("Forbidden (user=jane, verb=get, resource=nodes, subresource=proxy)"),
        "{refused}"
    );

    h.finish(tx, task).await;
}

/// The waiting reason and message of container `name` in `s`, when it waits.
fn waiting_of(s: &k8s_openapi::api::core::v1::PodStatus, name: &str) -> Option<(String, String)> {
    let w = s
        .container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == name)?
        .state
        .as_ref()?
        .waiting
        .as_ref()?;
    Some((
        w.reason.clone().unwrap_or_default(),
        w.message.clone().unwrap_or_default(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_contexts_are_applied_or_refused_never_ignored() {
    let h = Harness::new("secctx").await;
    let profiles = skiff_agent::worker::seccomp_root(&h.ctx.data_dir).join("test");
    std::fs::create_dir_all(&profiles).unwrap();
    std::fs::write(
        profiles.join("no-mkdir.json"),
        r#"{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[{"names":["mkdir","mkdirat"],"action":"SCMP_ACT_ERRNO"}]}"#,
    )
    .unwrap();
    let pod = h
        .pod(
            "hardened",
            serde_json::json!({
                "terminationGracePeriodSeconds": 1,
                "containers": [
                    {"name": "ro", "image": "busybox:latest", "command": ["sleep", "3600"],
                     "securityContext": {"readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false,
                        "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]},
                        "seccompProfile": {"type": "Unconfined"}}},
                    {"name": "local", "image": "busybox:latest", "command": ["sleep", "3600"],
                     "securityContext": {"seccompProfile": {"type": "Localhost", "localhostProfile": "test/no-mkdir.json"}}},
                    {"name": "default", "image": "busybox:latest", "command": ["sleep", "3600"],
                     "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}}},
                ]
            }),
        )
        .await;
    let refused = h
        .pod(
            "unsupported",
            serde_json::json!({
                "terminationGracePeriodSeconds": 1,
                "containers": [
                    {"name": "missing", "image": "busybox:latest", "command": ["sleep", "3600"],
                     "securityContext": {"seccompProfile": {"type": "Localhost", "localhostProfile": "test/absent.json"}}},
                ]
            }),
        )
        .await;
    let (t1, w1) = h.spawn(&pod);
    let (t2, w2) = h.spawn(&refused);
    h.wait_status("hardened", 60, running).await;
    let inspect = |name: &'static str| {
        let h = &h;
        async move {
            let id =
                skiff_agent::server::find_container(&h.ctx.docker, h.ctx.owner(), "default", "hardened", name, false)
                    .await
                    .unwrap()
                    .unwrap();
            h.ctx
                .docker
                .inspect_container(&id, None::<bollard::query_parameters::InspectContainerOptions>)
                .await
                .unwrap()
                .host_config
                .unwrap()
        }
    };
    let hc = inspect("ro").await;
    assert_eq!(hc.readonly_rootfs, Some(true));
    let opts = hc.security_opt.unwrap_or_default();
    assert!(opts.contains(&"no-new-privileges".to_string()), "{opts:?}");
    assert!(opts.contains(&"seccomp=unconfined".to_string()), "{opts:?}");
    assert_eq!(hc.cap_drop, Some(vec!["ALL".to_string()]));
    // In force, not only configured: the root is read-only, no filter is on the process, and
    // the local profile refuses what it names.
    let (ok, out) = h.exec("hardened", "ro", &["touch", "/x"]).await;
    assert!(ok != 0 || out.contains("Read-only"), "{out}");
    let status = h.exec("hardened", "ro", &["cat", "/proc/self/status"]).await.1;
    assert!(status.contains("Seccomp:\t0"), "{status}");
    let status = h.exec("hardened", "default", &["cat", "/proc/self/status"]).await.1;
    assert!(status.contains("Seccomp:\t2"), "{status}");
    let (code, out) = h.exec("hardened", "local", &["mkdir", "/tmp/made"]).await;
    assert_ne!(code, 0, "{out}");

    let s = h
        .wait_status("unsupported", 60, |s| {
            waiting_of(s, "missing").is_some_and(|(r, _)| r == "CreateContainerConfigError")
        })
        .await;
    let (_, message) = waiting_of(&s, "missing").unwrap();
    assert!(message.starts_with("failed to load seccomp profile"), "{message}");
    h.finish(t1, w1).await;
    h.finish(t2, w2).await;
}
