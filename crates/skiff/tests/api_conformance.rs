//! API conformance, end to end: describe with events and leases, `get -w` tables, every patch
//! type from kubectl, replace, delete --all and deletecollection, generateName, finalizers,
//! graceful pod deletion, eviction with a PodDisruptionBudget, binding, watch parameters,
//! the seed's YAML examples as written, and the kube-rs client.

#![cfg(test)]

mod common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

use common::{Cluster, eventually};
use serde_json::{Value, json};

const CONTROL_PLANE: &[&str] = &["--no-agent", "--no-scheduler"];

fn json_of(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

/// `kubectl create -f -` with this manifest; returns stdout.
fn create(c: &Cluster, yaml: &str) -> String {
    c.stdin_kubectl(&["create", "-f", "-"], yaml)
}

fn exists(c: &Cluster, args: &[&str]) -> bool {
    c.kubectl(&[&["get"], args].concat()).status.success()
}

const NODE: &str = r#"
apiVersion: v1
kind: Node
metadata:
  name: n1
  labels:
    kubernetes.io/hostname: n1
status:
  capacity: {cpu: "4", memory: 8Gi, pods: "110"}
  allocatable: {cpu: "4", memory: 8Gi, pods: "110"}
  conditions:
  - type: Ready
    status: "True"
    reason: KubeletReady
    message: kubelet is posting ready status
    lastHeartbeatTime: "2026-01-01T00:00:00Z"
    lastTransitionTime: "2026-01-01T00:00:00Z"
  addresses:
  - type: InternalIP
    address: 10.0.0.1
  nodeInfo:
    kubeletVersion: v1.33.0
    osImage: Debian
    kernelVersion: "6.1"
    containerRuntimeVersion: docker://24.0.0
    architecture: amd64
    operatingSystem: linux
    bootID: ""
    machineID: ""
    systemUUID: ""
    kubeProxyVersion: ""
"#;

fn pod_yaml(name: &str, labels: &str, node: Option<&str>) -> String {
    let node = node.map(|n| format!("  nodeName: {n}\n")).unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  labels: {labels}\nspec:\n{node}  containers:\n  - name: c\n    image: busybox:latest\n"
    )
}

fn uid_of(c: &Cluster, args: &[&str]) -> String {
    c.get_json(args)["metadata"]["uid"].as_str().expect("uid").to_string()
}

fn event_yaml(name: &str, kind: &str, api_version: &str, obj: &str, uid: &str, ns: &str, msg: &str) -> String {
    // Node events name no namespace in their involvedObject (the event itself lives in default).
    let involved_ns = if kind == "Node" { "" } else { ns };
    format!(
        r#"apiVersion: v1
kind: Event
metadata:
  name: {name}
  namespace: {ns}
involvedObject:
  apiVersion: {api_version}
  kind: {kind}
  name: {obj}
  namespace: "{involved_ns}"
  uid: {uid}
reason: Testing
message: {msg}
type: Normal
count: 1
firstTimestamp: "2026-01-01T00:00:00Z"
lastTimestamp: "2026-01-01T00:00:00Z"
source:
  component: conformance
"#
    )
}

#[test]
fn describe_pod_node_and_deployment_with_events_and_lease() {
    let c = Cluster::start(CONTROL_PLANE);
    c.apply(NODE, &[]);
    // The status in a create is the system's: set it through the status subresource.
    let status = serde_json::to_string(&json!({"status": node_status()})).expect("json");
    c.k(&[
        "patch",
        "node",
        "n1",
        "--subresource=status",
        "--type=merge",
        "-p",
        &status,
    ]);
    c.apply(
        "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: n1\n  namespace: kube-node-lease\nspec:\n  holderIdentity: n1\n  leaseDurationSeconds: 40\n  renewTime: \"2026-01-01T00:00:00.000000Z\"\n",
        &[],
    );
    c.apply(&pod_yaml("p1", "{app: demo}", Some("n1")), &[]);
    let pod_uid = uid_of(&c, &["pod", "p1"]);
    create(
        &c,
        &event_yaml("p1.ev", "Pod", "v1", "p1", &pod_uid, "default", "pod-event-message"),
    );
    let node_uid = uid_of(&c, &["node", "n1"]);
    create(
        &c,
        &event_yaml("n1.ev", "Node", "v1", "n1", &node_uid, "default", "node-event-message"),
    );
    // The kubelet's node events carry the node's name as uid; describe finds both kinds.
    create(
        &c,
        &event_yaml("n1.kubelet", "Node", "v1", "n1", "n1", "default", "kubelet-node-event"),
    );
    c.k(&["create", "deployment", "web", "--image=busybox:latest", "--replicas=2"]);
    let d_uid = uid_of(&c, &["deployment", "web"]);
    create(
        &c,
        &event_yaml(
            "web.ev",
            "Deployment",
            "apps/v1",
            "web",
            &d_uid,
            "default",
            "deploy-event-message",
        ),
    );

    let pod = c.k(&["describe", "pod", "p1"]);
    for want in [
        "Name:",
        "p1",
        "Node:",
        "n1",
        "app=demo",
        "Containers:",
        "busybox:latest",
        "QoS Class:",
        "BestEffort",
        "Events:",
        "Testing",
        "pod-event-message",
    ] {
        assert!(pod.contains(want), "describe pod lacks {want:?}:\n{pod}");
    }
    let node = c.k(&["describe", "node", "n1"]);
    for want in [
        "Name:",
        "n1",
        "Lease:",
        "HolderIdentity:",
        "RenewTime:",
        "Conditions:",
        "KubeletReady",
        "InternalIP:",
        "10.0.0.1",
        "Capacity:",
        "Non-terminated Pods:",
        "p1",
        "Allocated resources:",
        "Events:",
        "node-event-message",
        "kubelet-node-event",
    ] {
        assert!(node.contains(want), "describe node lacks {want:?}:\n{node}");
    }
    let deploy = c.k(&["describe", "deployment", "web"]);
    for want in [
        "Name:",
        "web",
        "Replicas:",
        "2 desired",
        "StrategyType:",
        "RollingUpdate",
        "Pod Template:",
        "Events:",
        "deploy-event-message",
    ] {
        assert!(deploy.contains(want), "describe deployment lacks {want:?}:\n{deploy}");
    }
}

/// The node status the describe test sets.
fn node_status() -> Value {
    json!({
        "capacity": {"cpu": "4", "memory": "8Gi", "pods": "110"},
        "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
        "conditions": [{
            "type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "kubelet is posting ready status",
            "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"
        }],
        "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
        "nodeInfo": {
            "kubeletVersion": "v1.33.0", "osImage": "Debian", "kernelVersion": "6.1",
            "containerRuntimeVersion": "docker://24.0.0", "architecture": "amd64",
            "operatingSystem": "linux", "bootID": "", "machineID": "", "systemUUID": "",
            "kubeProxyVersion": ""
        }
    })
}

#[test]
fn get_watch_pods_prints_table_rows_after_an_update() {
    let c = Cluster::start(CONTROL_PLANE);
    c.apply(&pod_yaml("w1", "{app: w}", None), &[]);
    let mut child = c
        .kubectl_cmd(&["get", "pods", "-w", "--output-watch-events"])
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
    let header = rx.recv_timeout(Duration::from_secs(10)).expect("header");
    assert!(
        header.starts_with("EVENT") && header.contains("READY") && header.contains("STATUS"),
        "{header}"
    );
    let first = rx.recv_timeout(Duration::from_secs(10)).expect("first row");
    assert!(
        first.starts_with("ADDED") && first.contains("w1") && first.contains("Pending"),
        "{first}"
    );
    // A status change shows as a MODIFIED row with the new cells.
    c.k(&[
        "patch",
        "pod",
        "w1",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"phase":"Running","containerStatuses":[{"name":"c","ready":true,"restartCount":2,"image":"busybox:latest","imageID":"","state":{"running":{"startedAt":"2026-01-01T00:00:00Z"}}}]}}"#,
    ]);
    let modified = eventually(Duration::from_secs(10), || {
        rx.try_recv().ok().filter(|l| l.starts_with("MODIFIED"))
    });
    c.k(&["delete", "pod", "w1", "--wait=false"]);
    let deleted = eventually(Duration::from_secs(10), || {
        rx.try_recv().ok().filter(|l| l.starts_with("DELETED"))
    });
    let _ = child.kill();
    let _ = child.wait();
    let modified = modified.expect("no MODIFIED row");
    assert!(
        modified.contains("w1") && modified.contains("1/1") && modified.contains("Running") && modified.contains('2'),
        "{modified}"
    );
    assert!(deleted.expect("no DELETED row").contains("w1"));
}

const TWO_CONTAINERS: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: pt
spec:
  replicas: 1
  selector:
    matchLabels: {app: pt}
  template:
    metadata:
      labels: {app: pt}
    spec:
      containers:
      - name: a
        image: busybox:1
        env:
        - {name: E1, value: "1"}
        - {name: E2, value: "2"}
      - name: b
        image: busybox:2
"#;

fn container_names(d: &Value) -> Vec<String> {
    d["spec"]["template"]["spec"]["containers"]
        .as_array()
        .expect("containers")
        .iter()
        .map(|c| c["name"].as_str().unwrap_or("").to_string())
        .collect()
}

#[test]
fn kubectl_patch_json_merge_and_strategic() {
    let c = Cluster::start(CONTROL_PLANE);
    create(&c, TWO_CONTAINERS);

    // JSON patch, with a passing and a failing `test`.
    c.k(&[
        "patch",
        "deployment",
        "pt",
        "--type=json",
        "-p",
        r#"[{"op":"test","path":"/spec/replicas","value":1},{"op":"replace","path":"/spec/replicas","value":3},{"op":"add","path":"/metadata/labels","value":{"j":"1"}}]"#,
    ]);
    let d = c.get_json(&["deployment", "pt"]);
    assert_eq!(d["spec"]["replicas"], 3);
    assert_eq!(d["metadata"]["labels"]["j"], "1");
    let err = c.k_err(&[
        "patch",
        "deployment",
        "pt",
        "--type=json",
        "-p",
        r#"[{"op":"test","path":"/spec/replicas","value":7},{"op":"replace","path":"/spec/replicas","value":9}]"#,
    ]);
    assert!(err.contains("test") || err.contains("Invalid"), "{err}");
    assert_eq!(c.get_json(&["deployment", "pt"])["spec"]["replicas"], 3);
    let err = c.k_err(&[
        "patch",
        "deployment",
        "pt",
        "--type=json",
        "-p",
        r#"[{"op":"remove","path":"/spec/nope/x"}]"#,
    ]);
    assert!(!err.contains("panic"), "{err}");

    // Merge patch: maps merge, null deletes, lists are replaced whole.
    c.k(&[
        "patch",
        "deployment",
        "pt",
        "--type=merge",
        "-p",
        r#"{"metadata":{"labels":{"j":null,"m":"2"}},"spec":{"template":{"spec":{"containers":[{"name":"a","image":"busybox:3"},{"name":"b","image":"busybox:2"}]}}}}"#,
    ]);
    let d = c.get_json(&["deployment", "pt"]);
    assert!(d["metadata"]["labels"].get("j").is_none(), "{}", d["metadata"]);
    assert_eq!(d["metadata"]["labels"]["m"], "2");
    assert_eq!(container_names(&d), ["a", "b"]);
    assert!(
        d["spec"]["template"]["spec"]["containers"][0].get("env").is_none(),
        "merge patch keeps no env of the replaced list"
    );
    assert_eq!(d["metadata"]["generation"], 3);

    // Strategic merge (kubectl's default): containers merge by name.
    c.k(&[
        "patch",
        "deployment",
        "pt",
        "-p",
        r#"{"spec":{"template":{"spec":{"containers":[{"name":"b","env":[{"name":"Z","value":"z"}]}]}}}}"#,
    ]);
    let d = c.get_json(&["deployment", "pt"]);
    assert_eq!(container_names(&d), ["a", "b"]);
    assert_eq!(d["spec"]["template"]["spec"]["containers"][0]["image"], "busybox:3");
    assert_eq!(d["spec"]["template"]["spec"]["containers"][1]["env"][0]["name"], "Z");

    // `$patch: delete` removes one container by its merge key.
    c.k(&[
        "patch",
        "deployment",
        "pt",
        "--type=strategic",
        "-p",
        r#"{"spec":{"template":{"spec":{"containers":[{"name":"b","$patch":"delete"}]}}}}"#,
    ]);
    assert_eq!(container_names(&c.get_json(&["deployment", "pt"])), ["a"]);

    // `$setElementOrder` orders the merged list.
    c.k(&[
        "patch",
        "deployment",
        "pt",
        "--type=strategic",
        "-p",
        r#"{"spec":{"template":{"spec":{"$setElementOrder/containers":[{"name":"c"},{"name":"a"}],"containers":[{"name":"c","image":"busybox:4"}]}}}}"#,
    ]);
    let d = c.get_json(&["deployment", "pt"]);
    assert_eq!(container_names(&d), ["c", "a"]);
    assert_eq!(d["spec"]["template"]["spec"]["containers"][0]["image"], "busybox:4");
    assert_eq!(
        d["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"], "IfNotPresent",
        "defaults apply to patched objects"
    );

    // `$patch: replace` on a map, `$retainKeys` on the strategy.
    c.k(&[
        "patch",
        "deployment",
        "pt",
        "--type=strategic",
        "-p",
        r#"{"spec":{"strategy":{"$retainKeys":["type"],"type":"Recreate"}}}"#,
    ]);
    let d = c.get_json(&["deployment", "pt"]);
    assert_eq!(d["spec"]["strategy"]["type"], "Recreate");
    assert!(
        d["spec"]["strategy"].get("rollingUpdate").is_none(),
        "{}",
        d["spec"]["strategy"]
    );

    // A patch that makes the object invalid is refused and changes nothing.
    let err = c.k_err(&[
        "patch",
        "deployment",
        "pt",
        "--type=merge",
        "-p",
        r#"{"spec":{"replicas":-1}}"#,
    ]);
    assert!(err.contains("Invalid") && err.contains("spec.replicas"), "{err}");
    let err = c.k_err(&["patch", "deployment", "pt", "--type=merge", "-p", "{not json"]);
    assert!(!err.is_empty());
    let err = c.k_err(&["patch", "deployment", "nope", "-p", "{}"]);
    assert!(
        err.contains("NotFound") && err.contains("deployments.apps \"nope\" not found"),
        "{err}"
    );
    assert_eq!(c.get_json(&["deployment", "pt"])["spec"]["replicas"], 3);
}

/// Patches without a resourceVersion never fail on a concurrent write: the server re-applies
/// them to the fresh object (a patch that names a stale resourceVersion does fail).
#[test]
fn concurrent_patches_all_apply() {
    let c = Cluster::start(CONTROL_PLANE);
    c.k(&["create", "configmap", "busy", "--from-literal=seed=0"]);
    c.k(&["create", "deployment", "busy", "--image=busybox:latest"]);
    let workers: Vec<_> = (0..6)
        .map(|w| {
            let kubeconfig = c.kubeconfig.clone();
            let home = c.home.path().to_path_buf();
            std::thread::spawn(move || {
                let mut failures = Vec::new();
                for i in 0..4 {
                    let (kind, patch_type, patch) = match (w + i) % 3 {
                        0 => ("configmap", "merge", format!(r#"{{"data":{{"k{w}-{i}":"v"}}}}"#)),
                        1 => (
                            "configmap",
                            "json",
                            format!(r#"[{{"op":"add","path":"/data/j{w}-{i}","value":"v"}}]"#),
                        ),
                        _ => (
                            "deployment",
                            "strategic",
                            format!(r#"{{"metadata":{{"labels":{{"l{w}-{i}":"v"}}}}}}"#),
                        ),
                    };
                    let out = std::process::Command::new("kubectl")
                        .arg("--kubeconfig")
                        .arg(&kubeconfig)
                        .args(["patch", kind, "busy", "--type", patch_type, "-p", &patch])
                        .env("HOME", &home)
                        .output()
                        .expect("kubectl");
                    if !out.status.success() {
                        failures.push(String::from_utf8_lossy(&out.stderr).to_string());
                    }
                }
                failures
            })
        })
        .collect();
    let failures: Vec<String> = workers.into_iter().flat_map(|h| h.join().expect("worker")).collect();
    assert!(failures.is_empty(), "{failures:?}");
    let cm = c.get_json(&["configmap", "busy"]);
    let keys = cm["data"].as_object().map(|m| m.len()).unwrap_or(0);
    let labels = c.get_json(&["deployment", "busy"])["metadata"]["labels"]
        .as_object()
        .map(|m| m.len())
        .unwrap_or(0);
    // 24 patches: 16 on the ConfigMap (plus its seed key), 8 on the Deployment (plus app=busy).
    assert_eq!(keys + labels, 24 + 2, "{cm}");
    // The status subresource of a Deployment its controller is writing takes patches too.
    c.k(&["scale", "deployment", "busy", "--replicas=3"]);
    c.k(&[
        "patch",
        "deployment",
        "busy",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"observedGeneration":99}}"#,
    ]);
    // A stale resourceVersion in the patch is a conflict.
    let err = c.k_err(&[
        "patch",
        "configmap",
        "busy",
        "--type=merge",
        "-p",
        r#"{"metadata":{"resourceVersion":"1"},"data":{"stale":"x"}}"#,
    ]);
    assert!(err.contains("the object has been modified"), "{err}");
}

/// A field of the wrong JSON type is refused with upstream's decoding error by every write
/// verb, and nothing changes (it used to be stored, and then no typed client could list).
#[test]
fn wrong_json_types_are_refused_and_change_nothing() {
    let c = Cluster::start(CONTROL_PLANE);
    c.k(&["create", "deployment", "typed", "--image=busybox:latest"]);
    let deployments = "/apis/apps/v1/namespaces/default/deployments";
    let body = br#"{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"bad"},"spec":{"replicas":"x","selector":{"matchLabels":{"a":"b"}},"template":{"metadata":{"labels":{"a":"b"}},"spec":{"containers":[{"name":"c","image":"i"}]}}}}"#;
    let (code, out) = c.admin_curl("POST", deployments, "application/json", body);
    assert_eq!(code, 400, "{out}");
    assert_eq!(
        json_of(&out)["message"],
        "Deployment in version \"v1\" cannot be handled as a Deployment: json: cannot unmarshal string into Go struct field DeploymentSpec.spec.replicas of type int32"
    );
    assert!(!exists(&c, &["deployment", "bad"]));
    for (patch_type, patch) in [
        ("merge", r#"{"spec":{"replicas":"x"}}"#),
        (
            "strategic",
            r#"{"spec":{"template":{"spec":{"containers":[{"name":"busybox","image":5}]}}}}"#,
        ),
        (
            "json",
            r#"[{"op":"replace","path":"/metadata/labels","value":{"a":1}}]"#,
        ),
    ] {
        let err = c.k_err(&["patch", "deployment", "typed", "--type", patch_type, "-p", patch]);
        // A strategic merge patch's result goes through upstream's unstructured converter.
        let words = if patch_type == "strategic" {
            "cannot convert int64 to string"
        } else {
            "json: cannot unmarshal"
        };
        assert!(err.contains(words), "{patch_type}: {err}");
    }
    let err = c.k_err(&[
        "patch",
        "deployment",
        "typed",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"replicas":true}}"#,
    ]);
    assert!(err.contains("json: cannot unmarshal bool"), "{err}");
    let d = c.get_json(&["deployment", "typed"]);
    assert_eq!(d["spec"]["replicas"], 1);
    assert_eq!(d["metadata"]["generation"], 1);
    let mut replaced = d.clone();
    replaced["spec"]["paused"] = json!("yes");
    let (code, out) = c.admin_curl(
        "PUT",
        "/apis/apps/v1/namespaces/default/deployments/typed",
        "application/json",
        replaced.to_string().as_bytes(),
    );
    assert_eq!(code, 400, "{out}");
    assert!(out.contains("of type bool"), "{out}");
    // Quantities take numbers, IntOrString both forms: these are not type errors.
    c.k(&[
        "patch",
        "deployment",
        "typed",
        "--type=strategic",
        "-p",
        r#"{"spec":{"strategy":{"rollingUpdate":{"maxSurge":2,"maxUnavailable":"50%"}},"template":{"spec":{"containers":[{"name":"busybox","resources":{"limits":{"cpu":1,"memory":1073741824}}}]}}}}"#,
    ]);
    // Typed clients can still list everything.
    let out = c.k(&["get", "deployments", "-o", "name"]);
    assert_eq!(out.trim(), "deployment.apps/typed");
}

#[test]
fn kubectl_replace_and_replace_force() {
    let c = Cluster::start(CONTROL_PLANE);
    c.k(&["create", "configmap", "r", "--from-literal=a=1"]);
    let uid = uid_of(&c, &["configmap", "r"]);
    let out = c.stdin_kubectl(
        &["replace", "-f", "-"],
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: r\ndata:\n  b: \"2\"\n",
    );
    assert!(out.contains("configmap/r replaced"), "{out}");
    let cm = c.get_json(&["configmap", "r"]);
    assert_eq!(cm["data"], json!({"b": "2"}));
    assert_eq!(cm["metadata"]["uid"], uid.as_str());
    // The uid cannot change.
    let err = c.k_err(&[
        "patch",
        "configmap",
        "r",
        "--type=merge",
        "-p",
        r#"{"metadata":{"uid":"zzz"}}"#,
    ]);
    assert!(
        err.contains("ConfigMap \"r\" is invalid: metadata.uid: Invalid value: \"zzz\": field is immutable"),
        "{err}"
    );
    // A stale resourceVersion in the replacement is a conflict.
    let err = c.stdin_kubectl_err(
        &["replace", "-f", "-"],
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: r\n  resourceVersion: \"1\"\ndata:\n  c: \"3\"\n",
    );
    assert!(
        err.contains("Conflict") && err.contains("the object has been modified"),
        "{err}"
    );
    // Replacing what does not exist is a 404.
    let err = c.stdin_kubectl_err(
        &["replace", "-f", "-"],
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ghost\ndata:\n  c: \"3\"\n",
    );
    assert!(err.contains("configmaps \"ghost\" not found"), "{err}");
    // --force deletes and creates again: a new uid.
    let out = c.stdin_kubectl(
        &["replace", "--force", "-f", "-"],
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: r\ndata:\n  d: \"4\"\n",
    );
    assert!(out.contains("replaced"), "{out}");
    let cm = c.get_json(&["configmap", "r"]);
    assert_eq!(cm["data"], json!({"d": "4"}));
    assert_ne!(cm["metadata"]["uid"], uid.as_str());
}

#[test]
fn delete_all_and_deletecollection_with_a_label_selector() {
    let c = Cluster::start(CONTROL_PLANE);
    c.k(&["create", "namespace", "dc"]);
    for (name, tier) in [("a1", "x"), ("a2", "x"), ("b1", "y")] {
        c.k(&["create", "configmap", name, "--from-literal=k=v", "-n", "dc"]);
        c.k(&["label", "configmap", name, &format!("tier={tier}"), "-n", "dc"]);
    }
    // DELETE on the collection with a selector removes only the matching objects.
    let out = c.k(&[
        "delete",
        "--raw",
        "/api/v1/namespaces/dc/configmaps?labelSelector=tier%3Dx",
    ]);
    let list = json_of(&out);
    assert_eq!(list["kind"], "ConfigMapList", "{out}");
    assert_eq!(list["items"].as_array().map(Vec::len), Some(2), "{out}");
    let left = c.k(&["get", "configmaps", "-n", "dc", "-l", "tier", "-o", "name"]);
    assert_eq!(left.trim(), "configmap/b1");
    // A bad selector is a 400 and deletes nothing.
    let (code, body) = c.admin_curl(
        "DELETE",
        "/api/v1/namespaces/dc/configmaps?labelSelector=a%20in%20(",
        "application/json",
        b"",
    );
    assert_eq!(code, 400, "{body}");
    assert!(exists(&c, &["configmap", "b1", "-n", "dc"]));
    // DELETE on a cluster-wide collection of a namespaced kind is refused.
    let (code, _) = c.admin_curl("DELETE", "/api/v1/configmaps", "application/json", b"");
    assert!(code == 405 || code == 404, "{code}");
    // --dry-run=server (dryRun in the DeleteOptions body) deletes nothing, one by one or all.
    let out = c.k(&["delete", "configmap", "b1", "-n", "dc", "--dry-run=server"]);
    assert!(out.contains("(server dry run)"), "{out}");
    c.k(&["delete", "configmaps", "--all", "-n", "dc", "--dry-run=server"]);
    let out = c.k(&["delete", "--raw", "/api/v1/namespaces/dc/configmaps?dryRun=All"]);
    assert!(out.contains("b1"), "{out}");
    assert!(exists(&c, &["configmap", "b1", "-n", "dc"]));
    assert!(
        c.get_json(&["configmap", "b1", "-n", "dc"])["metadata"]
            .get("deletionTimestamp")
            .is_none()
    );
    // kubectl delete --all.
    c.k(&["create", "configmap", "b2", "--from-literal=k=v", "-n", "dc"]);
    let out = c.k(&["delete", "configmaps", "--all", "-n", "dc"]);
    assert!(
        out.contains("configmap \"b1\" deleted") && out.contains("configmap \"b2\" deleted"),
        "{out}"
    );
    let left = c.k(&["get", "configmaps", "-n", "dc", "-o", "name"]);
    assert!(!left.contains("configmap/b"), "{left}");
    // The system namespaces may not be deleted (NamespaceLifecycle).
    for ns in ["default", "kube-system", "kube-public"] {
        let err = c.k_err(&["delete", "namespace", ns, "--wait=false"]);
        assert!(
            err.contains(&format!(
                "namespaces \"{ns}\" is forbidden: this namespace may not be deleted"
            )),
            "{err}"
        );
        assert!(
            c.get_json(&["namespace", ns])["metadata"]
                .get("deletionTimestamp")
                .is_none()
        );
    }
    // Other namespaces are untouched.
    c.k(&["create", "configmap", "keep", "--from-literal=k=v"]);
    c.k(&["delete", "configmaps", "--all", "-n", "dc"]);
    assert!(exists(&c, &["configmap", "keep"]));
}

#[test]
fn generate_name_gives_unique_names_within_limits() {
    let c = Cluster::start(CONTROL_PLANE);
    let yaml = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  generateName: gen-\ndata:\n  a: b\n";
    let first = create(&c, yaml);
    let second = create(&c, yaml);
    let name_of = |out: &str| -> String {
        out.trim()
            .strip_prefix("configmap/")
            .and_then(|s| s.strip_suffix(" created"))
            .unwrap_or_else(|| panic!("{out}"))
            .to_string()
    };
    let (a, b) = (name_of(&first), name_of(&second));
    assert!(a.starts_with("gen-") && a.len() == 9, "{a}");
    assert!(b.starts_with("gen-") && b.len() == 9, "{b}");
    assert_ne!(a, b);
    assert_eq!(c.get_json(&["configmap", &a])["metadata"]["generateName"], "gen-");
    // A long prefix is cut so the name fits in 63 characters, as upstream does (services are DNS labels).
    let prefix = format!("{}-", "s".repeat(61));
    let svc =
        format!("apiVersion: v1\nkind: Service\nmetadata:\n  generateName: {prefix}\nspec:\n  ports:\n  - port: 80\n");
    let out = create(&c, &svc);
    let name = out
        .trim()
        .strip_prefix("service/")
        .and_then(|s| s.strip_suffix(" created"))
        .unwrap_or_else(|| panic!("{out}"))
        .to_string();
    assert_eq!(name.len(), 63, "{name}");
    assert!(name.starts_with(&"s".repeat(58)), "{name}");
    // Neither name nor generateName: 422 with upstream's message.
    let err = c.stdin_kubectl_err(
        &["create", "-f", "-"],
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  labels: {a: b}\n",
    );
    assert!(err.contains("name or generateName is required"), "{err}");
}

#[test]
fn finalizers_hold_a_delete_until_removed() {
    let c = Cluster::start(CONTROL_PLANE);
    c.apply(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: held\n  finalizers:\n  - example.com/hold\ndata:\n  a: b\n",
        &[],
    );
    c.k(&["delete", "configmap", "held", "--wait=false"]);
    let cm = c.get_json(&["configmap", "held"]);
    assert!(cm["metadata"]["deletionTimestamp"].is_string(), "{}", cm["metadata"]);
    assert_eq!(cm["metadata"]["deletionGracePeriodSeconds"], 0);
    // A second delete changes nothing and still succeeds.
    c.k(&["delete", "configmap", "held", "--wait=false"]);
    // No new finalizers once deletion has started.
    let err = c.k_err(&[
        "patch",
        "configmap",
        "held",
        "--type=merge",
        "-p",
        r#"{"metadata":{"finalizers":["example.com/hold","example.com/more"]}}"#,
    ]);
    assert!(
        err.contains("no new finalizers can be added if the object is being deleted"),
        "{err}"
    );
    // Other changes are still allowed while it waits.
    c.k(&["label", "configmap", "held", "still=here"]);
    assert!(exists(&c, &["configmap", "held"]));
    // Removing the last finalizer completes the deletion.
    c.k(&[
        "patch",
        "configmap",
        "held",
        "--type=json",
        "-p",
        r#"[{"op":"remove","path":"/metadata/finalizers"}]"#,
    ]);
    assert!(!exists(&c, &["configmap", "held"]));
}

#[test]
fn graceful_pod_deletion() {
    let c = Cluster::start(CONTROL_PLANE);
    c.apply(NODE, &[]);
    c.apply(&pod_yaml("bound", "{app: g}", Some("n1")), &[]);
    c.apply(&pod_yaml("unbound", "{app: g}", None), &[]);
    // An unbound pod goes at once.
    c.k(&["delete", "pod", "unbound", "--wait=false"]);
    assert!(!exists(&c, &["pod", "unbound"]));
    // A server-side dry run marks nothing.
    c.k(&["delete", "pod", "bound", "--dry-run=server"]);
    assert!(
        c.get_json(&["pod", "bound"])["metadata"]
            .get("deletionTimestamp")
            .is_none()
    );
    // A pod on a node keeps its deletionTimestamp until the node confirms.
    c.k(&["delete", "pod", "bound", "--wait=false"]);
    let p = c.get_json(&["pod", "bound"]);
    assert!(p["metadata"]["deletionTimestamp"].is_string(), "{}", p["metadata"]);
    assert_eq!(p["metadata"]["deletionGracePeriodSeconds"], 30);
    let out = c.k(&["get", "pod", "bound"]);
    assert!(out.contains("Terminating"), "{out}");
    // The node's status updates and other writes meanwhile do not finish the deletion.
    c.k(&[
        "patch",
        "pod",
        "bound",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"phase":"Running"}}"#,
    ]);
    assert!(
        exists(&c, &["pod", "bound"]),
        "a status update removed a terminating pod"
    );
    c.k(&["label", "pod", "bound", "seen=yes"]);
    assert!(
        exists(&c, &["pod", "bound"]),
        "a label change removed a terminating pod"
    );
    // A shorter grace period shortens the wait; a longer one does not extend it.
    c.k(&["delete", "pod", "bound", "--wait=false", "--grace-period=10"]);
    assert_eq!(
        c.get_json(&["pod", "bound"])["metadata"]["deletionGracePeriodSeconds"],
        10
    );
    c.k(&["delete", "pod", "bound", "--wait=false", "--grace-period=60"]);
    assert_eq!(
        c.get_json(&["pod", "bound"])["metadata"]["deletionGracePeriodSeconds"],
        10
    );
    // --force --grace-period=0 is the confirmation.
    c.k(&["delete", "pod", "bound", "--grace-period=0", "--force"]);
    assert!(!exists(&c, &["pod", "bound"]));

    // A bound pod held by a finalizer: the confirmation ends its grace period, and removing
    // the finalizer then deletes it.
    c.apply(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: held\n  finalizers: [example.com/hold]\nspec:\n  nodeName: n1\n  containers:\n  - name: c\n    image: busybox:latest\n",
        &[],
    );
    c.k(&["delete", "pod", "held", "--wait=false"]);
    assert_eq!(
        c.get_json(&["pod", "held"])["metadata"]["deletionGracePeriodSeconds"],
        30
    );
    c.k(&["delete", "pod", "held", "--grace-period=0", "--force", "--wait=false"]);
    assert_eq!(
        c.get_json(&["pod", "held"])["metadata"]["deletionGracePeriodSeconds"],
        0
    );
    c.k(&[
        "patch",
        "pod",
        "held",
        "--type=json",
        "-p",
        r#"[{"op":"remove","path":"/metadata/finalizers"}]"#,
    ]);
    assert!(!exists(&c, &["pod", "held"]), "the pod outlived its last finalizer");
}

/// The eviction subresource against budget statuses written by hand: without the controllers,
/// so the disruption controller does not recount them (tests/disruption.rs drives the two
/// together).
#[test]
fn eviction_respects_pod_disruption_budgets() {
    let c = Cluster::start(&[CONTROL_PLANE, &["--no-controllers"]].concat());
    c.apply(NODE, &[]);
    c.apply(&pod_yaml("guarded", "{app: guarded}", Some("n1")), &[]);
    c.k(&[
        "patch",
        "pod",
        "guarded",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"phase":"Running"}}"#,
    ]);
    c.apply(
        "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata:\n  name: pdb\nspec:\n  minAvailable: 1\n  selector:\n    matchLabels:\n      app: guarded\n",
        &[],
    );
    c.k(&[
        "patch",
        "pdb",
        "pdb",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"disruptionsAllowed":0,"currentHealthy":1,"desiredHealthy":1,"expectedPods":1,"observedGeneration":1}}"#,
    ]);
    assert_eq!(c.get_json(&["pdb", "pdb"])["status"]["disruptionsAllowed"], 0);
    let eviction =
        br#"{"apiVersion":"policy/v1","kind":"Eviction","metadata":{"name":"guarded","namespace":"default"}}"#;
    let path = "/api/v1/namespaces/default/pods/guarded/eviction";
    let (code, body) = c.admin_curl("POST", path, "application/json", eviction);
    assert_eq!(code, 429, "{body}");
    let st = json_of(&body);
    assert_eq!(st["reason"], "TooManyRequests");
    assert_eq!(
        st["message"],
        "Cannot evict pod as it would violate the pod's disruption budget."
    );
    assert_eq!(st["details"]["causes"][0]["reason"], "DisruptionBudget");
    assert_eq!(
        st["details"]["causes"][0]["message"],
        "The disruption budget pdb needs 1 healthy pods and has 1 currently"
    );
    // kubectl drain retries and gives up at its timeout, naming the budget (promptly: no
    // Retry-After makes client-go retry inside each eviction call).
    let started = std::time::Instant::now();
    let out = c.kubectl(&["drain", "n1", "--force", "--ignore-daemonsets", "--timeout=3s"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("Cannot evict pod as it would violate the pod's disruption budget"),
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "drain --timeout=3s took {:?}",
        started.elapsed()
    );
    assert!(
        c.get_json(&["pod", "guarded"])["metadata"]
            .get("deletionTimestamp")
            .is_none()
    );
    assert_eq!(
        c.get_json(&["node", "n1"])["spec"]["unschedulable"],
        true,
        "drain cordons first"
    );

    // With one disruption allowed the eviction goes through and uses it up.
    c.k(&[
        "patch",
        "pdb",
        "pdb",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"disruptionsAllowed":1,"currentHealthy":2,"desiredHealthy":1,"expectedPods":2}}"#,
    ]);
    c.apply(&pod_yaml("guarded2", "{app: guarded}", Some("n1")), &[]);
    c.k(&[
        "patch",
        "pod",
        "guarded2",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"phase":"Running"}}"#,
    ]);
    let (code, body) = c.admin_curl("POST", path, "application/json", eviction);
    assert_eq!(code, 201, "{body}");
    assert_eq!(json_of(&body)["status"], "Success");
    let pod = c.get_json(&["pod", "guarded"]);
    assert!(
        pod["metadata"]["deletionTimestamp"].is_string(),
        "bound pods are deleted gracefully"
    );
    let pdb = c.get_json(&["pdb", "pdb"]);
    assert_eq!(pdb["status"]["disruptionsAllowed"], 0, "{}", pdb["status"]);
    assert!(
        pdb["status"]["disruptedPods"]["guarded"].is_string(),
        "{}",
        pdb["status"]
    );
    let eviction2 =
        br#"{"apiVersion":"policy/v1","kind":"Eviction","metadata":{"name":"guarded2","namespace":"default"}}"#;
    let (code, body) = c.admin_curl(
        "POST",
        "/api/v1/namespaces/default/pods/guarded2/eviction",
        "application/json",
        eviction2,
    );
    assert_eq!(code, 429, "the budget was used up: {body}");

    // Pending pods are not protected by budgets (upstream's canIgnorePDB).
    c.apply(&pod_yaml("pending", "{app: guarded}", None), &[]);
    let (code, body) = c.admin_curl(
        "POST",
        "/api/v1/namespaces/default/pods/pending/eviction",
        "application/json",
        br#"{"apiVersion":"policy/v1","kind":"Eviction","metadata":{"name":"pending"}}"#,
    );
    assert_eq!(code, 201, "{body}");
    assert!(!exists(&c, &["pod", "pending"]));
    // Evicting a missing pod is a 404.
    let (code, body) = c.admin_curl(
        "POST",
        "/api/v1/namespaces/default/pods/ghost/eviction",
        "application/json",
        br#"{"apiVersion":"policy/v1","kind":"Eviction","metadata":{"name":"ghost"}}"#,
    );
    assert_eq!(code, 404, "{body}");
}

#[test]
fn binding_twice_is_a_conflict() {
    let c = Cluster::start(CONTROL_PLANE);
    c.apply(&pod_yaml("b", "{app: b}", None), &[]);
    let binding =
        br#"{"apiVersion":"v1","kind":"Binding","metadata":{"name":"b"},"target":{"kind":"Node","name":"n1"}}"#;
    let path = "/api/v1/namespaces/default/pods/b/binding";
    let (code, body) = c.admin_curl("POST", path, "application/json", binding);
    assert_eq!(code, 201, "{body}");
    let p = c.get_json(&["pod", "b"]);
    assert_eq!(p["spec"]["nodeName"], "n1");
    let scheduled = p["status"]["conditions"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["type"] == "PodScheduled"))
        .cloned()
        .expect("PodScheduled");
    assert_eq!(scheduled["status"], "True");
    let other = br#"{"apiVersion":"v1","kind":"Binding","metadata":{"name":"b"},"target":{"kind":"Node","name":"n2"}}"#;
    let (code, body) = c.admin_curl("POST", path, "application/json", other);
    assert_eq!(code, 409, "{body}");
    let st = json_of(&body);
    assert_eq!(st["reason"], "Conflict");
    assert_eq!(
        st["message"],
        "Operation cannot be fulfilled on pods/binding \"b\": pod b is already assigned to node \"n1\""
    );
    assert_eq!(c.get_json(&["pod", "b"])["spec"]["nodeName"], "n1");
    // The binder's uid precondition: a pod created again under the same name is not bound.
    c.apply(&pod_yaml("again", "{app: b}", None), &[]);
    let stale = br#"{"apiVersion":"v1","kind":"Binding","metadata":{"name":"again","uid":"00000000-0000-0000-0000-000000000000"},"target":{"kind":"Node","name":"n1"}}"#;
    let (code, body) = c.admin_curl(
        "POST",
        "/api/v1/namespaces/default/pods/again/binding",
        "application/json",
        stale,
    );
    assert_eq!(code, 409, "{body}");
    assert!(
        json_of(&body)["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("Operation cannot be fulfilled on pods \"again\": Precondition failed: UID in precondition: 00000000-0000-0000-0000-000000000000, UID in object meta: ")),
        "{body}"
    );
    assert!(c.get_json(&["pod", "again"])["spec"].get("nodeName").is_none());
    let uid = uid_of(&c, &["pod", "again"]);
    let fresh = format!(
        r#"{{"apiVersion":"v1","kind":"Binding","metadata":{{"name":"again","uid":"{uid}","annotations":{{"example.com/why":"fits"}}}},"target":{{"kind":"Node","name":"n1"}}}}"#
    );
    let (code, body) = c.admin_curl(
        "POST",
        "/api/v1/namespaces/default/pods/again/binding",
        "application/json",
        fresh.as_bytes(),
    );
    assert_eq!(code, 201, "{body}");
    // The binding's annotations land on the pod.
    let p = c.get_json(&["pod", "again"]);
    assert_eq!(p["spec"]["nodeName"], "n1");
    assert_eq!(p["metadata"]["annotations"]["example.com/why"], "fits");
    // A binding without a target is invalid; to a missing pod, not found.
    let (code, body) = c.admin_curl(
        "POST",
        path,
        "application/json",
        br#"{"apiVersion":"v1","kind":"Binding","metadata":{"name":"b"}}"#,
    );
    assert_eq!(code, 422, "{body}");
    let (code, body) = c.admin_curl(
        "POST",
        "/api/v1/namespaces/default/pods/ghost/binding",
        "application/json",
        binding,
    );
    assert_eq!(code, 404, "{body}");
}

/// The lines of a watch stream that closes by itself (timeoutSeconds).
/// The watch's events, without those of the `kube-root-ca.crt` ConfigMap the root CA publisher
/// keeps in every namespace.
fn watch_lines(c: &Cluster, path: &str) -> Vec<Value> {
    let out = c.k(&["get", "--raw", path]);
    out.lines()
        .filter(|l| !l.trim().is_empty())
        .map(json_of)
        .filter(|e| e["object"]["metadata"]["name"] != "kube-root-ca.crt")
        .collect()
}

#[test]
fn watch_resource_versions_and_streaming_lists() {
    let c = Cluster::start(CONTROL_PLANE);
    c.k(&["create", "namespace", "wt"]);
    c.k(&["create", "configmap", "one", "--from-literal=a=1", "-n", "wt"]);
    c.k(&["label", "configmap", "one", "x=y", "-n", "wt"]);
    c.k(&["create", "configmap", "two", "--from-literal=a=1", "-n", "wt"]);
    c.k(&["delete", "configmap", "two", "-n", "wt"]);
    let base = "/api/v1/namespaces/wt/configmaps?watch=1&timeoutSeconds=1";

    // resourceVersion=1: every change since then is replayed, in order.
    let evs = watch_lines(&c, &format!("{base}&resourceVersion=1"));
    let kinds: Vec<(String, String)> = evs
        .iter()
        .map(|e| {
            (
                e["type"].as_str().unwrap_or("").to_string(),
                e["object"]["metadata"]["name"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    let want = [
        ("ADDED", "one"),
        ("MODIFIED", "one"),
        ("ADDED", "two"),
        ("DELETED", "two"),
    ];
    let want: Vec<(String, String)> = want.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
    assert_eq!(kinds, want, "{evs:?}");

    // resourceVersion=0 / unset: the current state as ADDED, nothing else.
    let evs = watch_lines(&c, &format!("{base}&resourceVersion=0"));
    assert_eq!(evs.len(), 1, "{evs:?}");
    assert_eq!(evs[0]["type"], "ADDED");
    assert_eq!(evs[0]["object"]["metadata"]["labels"]["x"], "y");

    // From the list's resourceVersion: nothing old.
    let rv = json_of(&c.k(&["get", "--raw", "/api/v1/namespaces/wt/configmaps"]))["metadata"]["resourceVersion"]
        .as_str()
        .expect("rv")
        .to_string();
    let evs = watch_lines(&c, &format!("{base}&resourceVersion={rv}"));
    assert!(evs.is_empty(), "{evs:?}");

    // A malformed resourceVersion is a 400, a continue token that is garbage too.
    let (code, body) = c.admin_curl(
        "GET",
        "/api/v1/namespaces/wt/configmaps?watch=1&resourceVersion=abc",
        "application/json",
        b"",
    );
    assert_eq!(code, 400, "{body}");
    let (code, body) = c.admin_curl(
        "GET",
        "/api/v1/namespaces/wt/configmaps?limit=1&continue=zzz",
        "application/json",
        b"",
    );
    assert_eq!(code, 400, "{body}");

    // Streaming list: initial ADDED events, then a BOOKMARK marking their end.
    let evs = watch_lines(
        &c,
        &format!("{base}&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan"),
    );
    assert_eq!(evs.len(), 2, "{evs:?}");
    assert_eq!(evs[0]["type"], "ADDED");
    assert_eq!(evs[1]["type"], "BOOKMARK");
    assert_eq!(
        evs[1]["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    assert_eq!(evs[1]["object"]["kind"], "ConfigMap");
    let bookmark_rv: i64 = evs[1]["object"]["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("bookmark rv");
    assert!(bookmark_rv >= rv.parse::<i64>().expect("rv"));
    // sendInitialEvents=false with no resourceVersion: only what happens from now on.
    let evs = watch_lines(
        &c,
        &format!("{base}&sendInitialEvents=false&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan"),
    );
    assert!(evs.is_empty(), "{evs:?}");
    // sendInitialEvents needs resourceVersionMatch=NotOlderThan, as upstream validates.
    let (code, body) = c.admin_curl(
        "GET",
        "/api/v1/namespaces/wt/configmaps?watch=1&sendInitialEvents=true&allowWatchBookmarks=true",
        "application/json",
        b"",
    );
    assert_eq!(code, 422, "{body}");
    assert!(
        body.contains("sendInitialEvents requires setting resourceVersionMatch to NotOlderThan"),
        "{body}"
    );
    // ...and is not a list option.
    let (code, body) = c.admin_curl(
        "GET",
        "/api/v1/namespaces/wt/configmaps?sendInitialEvents=true",
        "application/json",
        b"",
    );
    assert_eq!(code, 422, "{body}");
    assert!(body.contains("sendInitialEvents is forbidden for list"), "{body}");
}

// The seed's YAML examples, as written (typos included).
const SEED_PROJECTED_POD: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: test-projected-volume 
spec:
  containers:
  - name: test-secret-volume
    image: busybox
    args:
    - sleep
    - "86400"
    volumeMounts:
    - name: mysql-cred
      mountPath: "/projected-volume"
      readOnly: true
  volumes:
  - name: mysql-cred
    projected:
      sources:
      - secret:
          name: user
      - secret:
          name: pass
"#;

const SEED_SECRET: &str = r#"apiVersion: v1
kind: Secret
metadata:
  name: mysecret
type: Opaque
data:
  user: YWRtaW4=
  pass: MWYyZDFlMmU2N2Rm
"#;

const SEED_EXTENSIONS_DEPLOYMENT: &str = r#"apiVersion: extensions/v1beta1   
kind: Deployment                 
metadata:
  name: string         # Deployment名称
spec:
  replicas: 3            # 目标副本数量
  revisonHistoryLimit: 0 # 控制历史版本个数，0的话就没办法再进行回滚操作
  strategy:
    rollingUpdate:       # 滚动更新
      maxSurge: 1        # 滚动升级时最大同时升级1个pod
      maxUnavailable: 1  # 滚动升级时最大允许不可用的pod个数
  template:         
    metadata:
      labels:
        app: string      # 模板名称
    sepc:                # 定义容器模板，该模板可以包含多个容器
      containers:                               
        - name: string                                 
          image: string 
          ports:
            - name: http
              containerPort: 8080  # 对service暴露端口
"#;

const SEED_REPLICASET: &str = r#"apiVersion: apps/v1
kind: ReplicaSet
metadata:
  name: nginx-set
  labels:
    app: nginx
spec:
  replicas: 3
  selector:
    matchLabels:
      app: nginx
  template:
    metadata:
      labels:
        app: nginx
    spec:
      containers:
      - name: nginx
        image: nginx:1.7.9
"#;

const SEED_JOB: &str = r#"apiVersion: batch/v1
kind: Job
metadata:
  name: pi
spec:
  template:
    spec:
      containers:
      - name: pi
        image: resouer/ubuntu-bc 
        command: ["sh", "-c", "echo 'scale=10000; 4*a(1)' | bc -l "]
      restartPolicy: Never
  backoffLimit: 4
"#;

#[test]
fn seed_examples_as_written() {
    let c = Cluster::start(CONTROL_PLANE);
    for (yaml, want) in [
        (SEED_SECRET, "secret/mysecret created"),
        (SEED_PROJECTED_POD, "pod/test-projected-volume created"),
        (SEED_REPLICASET, "replicaset.apps/nginx-set created"),
        (common::seeds::STATEFULSET_WEB, "statefulset.apps/web created"),
        (
            common::seeds::DAEMONSET_FLUENTD,
            "daemonset.apps/fluentd-elasticsearch created",
        ),
        (SEED_JOB, "job.batch/pi created"),
    ] {
        let out = c.apply(yaml, &[]);
        assert!(out.contains(want), "{out}");
        // Applying again changes nothing. A pod's patch still orders its volumes and mounts
        // (`$setElementOrder`), which the ServiceAccount admission plugin's credentials volume
        // follows, so kubectl says "configured" as against upstream; the pod stays as it was.
        let kind_name = want.split_whitespace().next().unwrap_or_default().to_string();
        if kind_name.starts_with("pod/") {
            let before = c.get_json(&[&kind_name]);
            let out = c.apply(yaml, &[]);
            assert!(out.contains("configured") || out.contains("unchanged"), "{out}");
            let after = c.get_json(&[&kind_name]);
            assert_eq!(
                before["metadata"]["resourceVersion"],
                after["metadata"]["resourceVersion"]
            );
        } else {
            let out = c.apply(yaml, &[]);
            assert!(out.contains("unchanged"), "{out}");
        }
    }
    let s = c.get_json(&["secret", "mysecret"]);
    assert_eq!(s["data"]["pass"], "MWYyZDFlMmU2N2Rm");
    let rs = c.get_json(&["rs", "nginx-set"]);
    assert_eq!(
        rs["spec"]["template"]["spec"]["containers"][0]["terminationMessagePath"],
        "/dev/termination-log"
    );
    let sts = c.get_json(&["sts", "web"]);
    assert_eq!(sts["spec"]["podManagementPolicy"], "OrderedReady");
    assert_eq!(sts["spec"]["updateStrategy"]["type"], "RollingUpdate");
    let ds = c.get_json(&["ds", "fluentd-elasticsearch", "-n", "kube-system"]);
    assert_eq!(ds["spec"]["updateStrategy"]["type"], "RollingUpdate");
    assert_eq!(
        ds["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"],
        "100m"
    );
    let job = c.get_json(&["job", "pi"]);
    assert_eq!(job["spec"]["backoffLimit"], 4);
    assert_eq!(job["spec"]["completions"], 1);
    assert!(
        job["spec"]["selector"]["matchLabels"]["batch.kubernetes.io/controller-uid"].is_string(),
        "{}",
        job["spec"]
    );
    // Removed API versions are refused and nothing is created. Upstream, kubectl's validation
    // skips kinds it has no schema for and the mapping fails: "no matches for kind". Here the
    // validation step already fails (this server has no /openapi/v2 and no CRD list), so only
    // --validate=false shows the mapping error.
    for (yaml, kind, version) in [
        (SEED_EXTENSIONS_DEPLOYMENT, "Deployment", "extensions/v1beta1"),
        (common::seeds::CRONJOB_V1BETA1, "CronJob", "batch/v1beta1"),
    ] {
        let err = c.stdin_kubectl_err(&["apply", "-f", "-"], yaml);
        assert!(
            err.contains(&format!("no matches for kind \"{kind}\" in version \"{version}\""))
                || err.contains("error validating data"),
            "{err}"
        );
        let err = c.stdin_kubectl_err(&["apply", "--validate=false", "-f", "-"], yaml);
        assert!(
            err.contains(&format!("no matches for kind \"{kind}\" in version \"{version}\"")),
            "{err}"
        );
    }
    assert!(!exists(&c, &["deployment", "string"]));
    assert!(!exists(&c, &["cronjob", "hello"]));
    // The removed group versions are not served at all.
    for path in [
        "/apis/extensions/v1beta1/namespaces/default/deployments",
        "/apis/batch/v1beta1/namespaces/default/cronjobs",
    ] {
        let (code, body) = c.admin_curl("GET", path, "application/json", b"");
        assert_eq!(code, 404, "{path}: {body}");
    }
    // Moved to apps/v1 as written, the typos (revisonHistoryLimit, sepc) are unknown fields
    // and kubectl's strict validation names them.
    let moved = SEED_EXTENSIONS_DEPLOYMENT.replace("extensions/v1beta1", "apps/v1");
    let err = c.stdin_kubectl_err(&["apply", "-f", "-"], &moved);
    assert!(
        err.contains("unknown field \"spec.revisonHistoryLimit\"")
            && err.contains("unknown field \"spec.template.sepc\""),
        "{err}"
    );
    // With validation off the typos are dropped, and the missing selector is then invalid.
    let err = c.stdin_kubectl_err(&["apply", "--validate=false", "-f", "-"], &moved);
    assert!(err.contains("Invalid") && err.contains("spec.selector"), "{err}");
    // batch/v1 CronJob, as the example means today.
    let cj = common::seeds::CRONJOB_V1BETA1.replace("batch/v1beta1", "batch/v1");
    let out = c.apply(&cj, &[]);
    assert!(out.contains("cronjob.batch/hello created"), "{out}");
    let got = c.k(&["get", "cronjobs"]);
    assert!(got.contains("*/1 * * * *"), "{got}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_rs_client_crud_watch_patch_and_subresources() {
    use futures::{StreamExt, TryStreamExt};
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};

    let c = tokio::task::spawn_blocking(|| Cluster::start(CONTROL_PLANE))
        .await
        .expect("cluster");
    let client = c.kube_client().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");

    // Watch from the current list's resourceVersion.
    let rv = cms
        .list(&ListParams::default())
        .await
        .expect("list")
        .metadata
        .resource_version
        .expect("rv");
    let mut events = cms
        .watch(&WatchParams::default().timeout(20), &rv)
        .await
        .expect("watch")
        .boxed();

    // CRUD.
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "rs", "labels": {"lang": "rust"}},
        "data": {"a": "1"}
    }))
    .expect("cm");
    let created = cms.create(&PostParams::default(), &cm).await.expect("create");
    assert!(created.metadata.uid.is_some());
    let mut got = cms.get("rs").await.expect("get");
    got.data.get_or_insert_default().insert("a".into(), "2".into());
    let replaced = cms.replace("rs", &PostParams::default(), &got).await.expect("replace");
    assert_eq!(
        replaced.data.as_ref().and_then(|d| d.get("a")).map(String::as_str),
        Some("2")
    );
    let err = cms
        .replace("rs", &PostParams::default(), &got)
        .await
        .expect_err("stale replace");
    match err {
        kube::Error::Api(s) => assert_eq!(s.code, 409),
        other => panic!("{other:?}"),
    }
    let other: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "other"}})).expect("cm");
    cms.create(&PostParams::default(), &other).await.expect("create other");
    let listed = cms
        .list(&ListParams::default().labels("lang=rust"))
        .await
        .expect("list by label");
    let names: Vec<String> = listed.items.iter().filter_map(|c| c.metadata.name.clone()).collect();
    assert_eq!(names, ["rs"]);
    let missing = cms.get("nope").await.expect_err("missing");
    match missing {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 404);
            assert_eq!(s.reason, "NotFound");
        }
        other => panic!("{other:?}"),
    }

    // Patches: apply with a field manager (and its conflict), strategic, JSON.
    let ssa = PatchParams::apply("conformance-test");
    let applied = cms
        .patch(
            "rs",
            &ssa,
            &Patch::Apply(
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "rs"}, "data": {"b": "x"}}),
            ),
        )
        .await
        .expect("apply");
    let managers: Vec<String> = applied
        .metadata
        .managed_fields
        .unwrap_or_default()
        .iter()
        .filter_map(|m| m.manager.clone())
        .collect();
    assert!(managers.iter().any(|m| m == "conformance-test"), "{managers:?}");
    let conflict = cms
        .patch(
            "rs",
            &PatchParams::apply("someone-else"),
            &Patch::Apply(
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "rs"}, "data": {"b": "y"}}),
            ),
        )
        .await
        .expect_err("conflict");
    match conflict {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 409);
            assert_eq!(s.reason, "Conflict");
        }
        other => panic!("{other:?}"),
    }
    let forced = cms
        .patch(
            "rs",
            &PatchParams::apply("someone-else").force(),
            &Patch::Apply(
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "rs"}, "data": {"b": "y"}}),
            ),
        )
        .await
        .expect("forced apply");
    assert_eq!(
        forced.data.as_ref().and_then(|d| d.get("b")).map(String::as_str),
        Some("y")
    );
    let strategic = cms
        .patch(
            "rs",
            &PatchParams::default(),
            &Patch::Strategic(json!({"metadata": {"labels": {"s": "1"}}})),
        )
        .await
        .expect("strategic");
    assert_eq!(
        strategic
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("s"))
            .map(String::as_str),
        Some("1")
    );
    let jp: json_patch::Patch =
        serde_json::from_value(json!([{"op": "replace", "path": "/data/a", "value": "3"}])).expect("json patch");
    let patched = cms
        .patch("rs", &PatchParams::default(), &Patch::<()>::Json(jp))
        .await
        .expect("json patch");
    assert_eq!(
        patched.data.as_ref().and_then(|d| d.get("a")).map(String::as_str),
        Some("3")
    );
    cms.delete("rs", &DeleteParams::default()).await.expect("delete");

    // The watch saw it all.
    let mut seen: Vec<String> = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while !seen.iter().any(|s| s == "DELETED rs") {
        let next = tokio::time::timeout_at(deadline, events.try_next())
            .await
            .expect("watch events in time")
            .expect("watch stream");
        let Some(ev) = next else { break };
        match ev {
            WatchEvent::Added(o) => seen.push(format!("ADDED {}", o.metadata.name.unwrap_or_default())),
            WatchEvent::Modified(o) => seen.push(format!("MODIFIED {}", o.metadata.name.unwrap_or_default())),
            WatchEvent::Deleted(o) => seen.push(format!("DELETED {}", o.metadata.name.unwrap_or_default())),
            WatchEvent::Bookmark(_) => {}
            WatchEvent::Error(e) => panic!("watch error {e:?}"),
        }
    }
    for want in ["ADDED rs", "MODIFIED rs", "ADDED other", "DELETED rs"] {
        assert!(seen.iter().any(|s| s == want), "{want} not in {seen:?}");
    }

    // The runtime watcher with streaming lists (sendInitialEvents + bookmarks).
    let stream = kube::runtime::watcher(cms.clone(), kube::runtime::watcher::Config::default().streaming_lists());
    let mut stream = stream.boxed();
    let mut init_names = Vec::new();
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(10), stream.try_next())
            .await
            .expect("streaming list in time")
            .expect("watcher")
            .expect("event");
        match ev {
            kube::runtime::watcher::Event::Init => {}
            kube::runtime::watcher::Event::InitApply(o) => {
                // The root CA publisher's ConfigMap is in every namespace.
                let name = o.metadata.name.unwrap_or_default();
                if name != "kube-root-ca.crt" {
                    init_names.push(name);
                }
            }
            kube::runtime::watcher::Event::InitDone => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(init_names, ["other"]);

    // /status and /scale of a Deployment.
    let deploys: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "kd"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "kd"}},
            "template": {"metadata": {"labels": {"app": "kd"}}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
        }
    }))
    .expect("deployment");
    deploys
        .create(&PostParams::default(), &d)
        .await
        .expect("create deployment");
    let scale = deploys.get_scale("kd").await.expect("get scale");
    assert_eq!(scale.spec.and_then(|s| s.replicas), Some(1));
    assert_eq!(scale.status.map(|s| s.selector), Some(Some("app=kd".to_string())));
    let scaled = deploys
        .patch_scale(
            "kd",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 5}})),
        )
        .await
        .expect("patch scale");
    assert_eq!(scaled.spec.and_then(|s| s.replicas), Some(5));
    assert_eq!(
        deploys.get("kd").await.expect("get").spec.and_then(|s| s.replicas),
        Some(5)
    );
    // /status of a Pod (no node agent runs here, so nothing else writes it).
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), "default");
    let p: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": {"name": "kp"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &p).await.expect("create pod");
    let st = pods
        .patch_status(
            "kp",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running", "podIP": "10.1.2.3"}})),
        )
        .await
        .expect("patch status");
    assert_eq!(st.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Running"));
    let got = pods.get_status("kp").await.expect("get status");
    assert_eq!(got.status.and_then(|s| s.pod_ip), Some("10.1.2.3".to_string()));
    // Status changes through the main resource are ignored; spec changes through /status too.
    let ignored = pods
        .patch(
            "kp",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Failed"}})),
        )
        .await
        .expect("patch main");
    assert_eq!(ignored.status.and_then(|s| s.phase), Some("Running".to_string()));
    let ignored = pods
        .patch_status(
            "kp",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"activeDeadlineSeconds": 5}})),
        )
        .await
        .expect("patch status spec");
    assert_eq!(ignored.spec.and_then(|s| s.active_deadline_seconds), None);
    drop(c);
}

#[test]
fn a_terminating_namespace_takes_no_new_content() {
    let c = Cluster::start(CONTROL_PLANE);
    c.apply(NODE, &[]);
    c.k(&["create", "namespace", "leaving"]);
    // A pod on a node waits for the node to confirm its deletion, so the namespace stays
    // Terminating while the namespace controller waits for it.
    c.apply(&pod_yaml("stays", "{app: t}", Some("n1")), &["-n", "leaving"]);
    c.k(&["delete", "namespace", "leaving", "--wait=false"]);
    let ns = c.get_json(&["namespace", "leaving"]);
    assert!(ns["metadata"]["deletionTimestamp"].is_string(), "{}", ns["metadata"]);
    let err = c.k_err(&["create", "configmap", "late", "-n", "leaving"]);
    assert!(
        err.contains(
            "configmaps \"late\" is forbidden: unable to create new content in namespace leaving because it is being terminated"
        ),
        "{err}"
    );
    // The Status names upstream's NamespaceTerminating cause, which controllers branch on.
    let (code, body) = c.admin_curl(
        "POST",
        "/api/v1/namespaces/leaving/configmaps",
        "application/json",
        br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"late"}}"#,
    );
    assert_eq!(code, 403, "{body}");
    let status = json_of(&body);
    assert_eq!(
        status["details"]["causes"][0]["reason"], "NamespaceTerminating",
        "{body}"
    );
    assert_eq!(status["details"]["causes"][0]["field"], "metadata.namespace", "{body}");
    // Other namespaces are not affected.
    c.k(&["create", "configmap", "fine"]);
}

/// A delete that removes the object answers as upstream's registries do: a `Status` with the
/// name, group, resource and uid of what went, but for the resources whose registry returns
/// the deleted object (pods among them).
#[test]
fn deletes_answer_a_status_unless_the_registry_returns_the_object() {
    let c = Cluster::start(CONTROL_PLANE);
    c.k(&["create", "configmap", "gone", "--from-literal=a=b"]);
    let uid = c.k(&["get", "configmap", "gone", "-o", "jsonpath={.metadata.uid}"]);
    let answer: serde_json::Value =
        serde_json::from_str(&c.k(&["delete", "--raw", "/api/v1/namespaces/default/configmaps/gone"])).expect("json");
    assert_eq!(
        answer,
        serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
            "details": {"name": "gone", "group": "", "kind": "configmaps", "uid": uid}})
    );
    c.apply(&pod_yaml("doomed", "{app: doomed}", None), &[]);
    let answer: serde_json::Value =
        serde_json::from_str(&c.k(&["delete", "--raw", "/api/v1/namespaces/default/pods/doomed"])).expect("json");
    assert_eq!(answer["kind"], "Pod", "{answer}");
    assert_eq!(answer["metadata"]["name"], "doomed");
}

/// A Secret's `stringData` is merged over `data` on every write, an update's too, and is never
/// kept, as upstream's conversion does.
#[test]
fn string_data_is_merged_over_data_on_create_and_update() {
    let c = Cluster::start(CONTROL_PLANE);
    c.apply(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: s\ndata:\n  k1: djE=\n  k2: \"\"\nstringData:\n  k3: v3\n",
        &[],
    );
    let s = c.get_json(&["secret", "s"]);
    assert_eq!(
        s["data"],
        serde_json::json!({"k1": "djE=", "k2": "", "k3": "djM="}),
        "{s}"
    );
    assert!(s.get("stringData").is_none(), "{s}");
    c.k(&["patch", "secret", "s", "-p", r#"{"stringData":{"k2":"v2"}}"#]);
    let s = c.get_json(&["secret", "s"]);
    assert_eq!(s["data"]["k2"], "djI=", "{s}");
    assert!(s.get("stringData").is_none(), "{s}");
}

/// `kubectl get --sort-by` sorts the Table's rows by their objects, which it asks for whole
/// (`includeObject=Object`), as upstream's `TableOptions` give them.
#[test]
fn sort_by_sorts_table_rows_by_their_whole_objects() {
    let c = Cluster::start(CONTROL_PLANE);
    for (pod, container) in [("first", "zz"), ("second", "aa"), ("third", "mm")] {
        c.apply(
            &format!(
                "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {pod}\nspec:\n  containers:\n  - name: {container}\n    image: busybox:latest\n"
            ),
            &[],
        );
    }
    let out = c.k(&["get", "pods", "--sort-by={.spec.containers[0].name}", "--no-headers"]);
    let names: Vec<&str> = out.lines().filter_map(|l| l.split_whitespace().next()).collect();
    assert_eq!(names, ["second", "third", "first"], "{out}");
}

/// `kubectl get componentstatuses` reports the parts this server runs as upstream's probes
/// would: the controllers and the store healthy, the scheduler left out by `--no-scheduler`
/// unhealthy with the reason; only get and list, with the deprecation warning.
#[test]
fn component_statuses_report_the_parts_this_server_runs() {
    let c = Cluster::start(CONTROL_PLANE);
    let out = c.kubectl(&["get", "componentstatuses"]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("Warning: v1 ComponentStatus is deprecated in v1.19+"),
        "{stderr}"
    );
    let rows: Vec<Vec<&str>> = stdout.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(rows[0], ["NAME", "STATUS", "MESSAGE", "ERROR"], "{stdout}");
    assert_eq!(rows[1], ["controller-manager", "Healthy", "ok"], "{stdout}");
    assert_eq!(rows[2][..2], ["scheduler", "Unhealthy"], "{stdout}");
    assert!(
        stdout.contains("kube-scheduler does not run in this server (started with --no-scheduler)"),
        "{stdout}"
    );
    assert_eq!(rows[3], ["etcd-0", "Healthy", "ok"], "{stdout}");
    assert_eq!(rows.len(), 4, "{stdout}");

    let one = c.get_json(&["cs", "etcd-0"]);
    assert_eq!(
        one["conditions"],
        json!([{"type": "Healthy", "status": "True", "message": "ok"}]),
        "{one}"
    );
    let picked = c.k(&["get", "cs", "--field-selector", "metadata.name=scheduler", "-o", "name"]);
    assert_eq!(picked.trim(), "componentstatus/scheduler");
    let err = c.k_err(&["get", "cs", "kubelet"]);
    assert!(
        err.contains("Internal error occurred: Component not found: kubelet"),
        "{err}"
    );
    let err = c.stdin_kubectl_err(
        &["create", "-f", "-"],
        "apiVersion: v1\nkind: ComponentStatus\nmetadata:\n  name: mine\nconditions: []\n",
    );
    assert!(err.contains("MethodNotAllowed"), "{err}");
    let resources = c.k(&["api-resources", "--api-group=", "-o", "wide"]);
    let row = resources
        .lines()
        .find(|l| l.starts_with("componentstatuses"))
        .expect("listed");
    assert!(row.contains(" cs ") && row.contains(" get,list "), "{row}");
}

/// Every JSON answer, a `Status` error's included, is written as upstream's encoder writes it:
/// compact and ended by one newline for programs; indented with no final newline when `pretty`
/// asks for it or the client is curl, Wget or a browser (upstream's `isPrettyPrint`).
#[test]
fn json_answers_are_encoded_as_upstreams_encoder_writes_them() {
    let c = Cluster::start(CONTROL_PLANE);
    c.k(&["create", "configmap", "present", "--from-literal=a=b"]);
    let token = c.admin_token();
    let fetch = |method: &str, path: &str, agent: &str| {
        let out = std::process::Command::new("curl")
            .args([
                "-sk",
                "-X",
                method,
                "-A",
                agent,
                "-w",
                "%{http_code}",
                "--max-time",
                "20",
                "-H",
            ])
            .arg(format!("Authorization: Bearer {token}"))
            .arg(format!("https://127.0.0.1:{}{path}", c.port))
            .output()
            .expect("curl");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let (body, code) = text.split_at(text.len() - 3);
        (code.parse::<u16>().unwrap_or(0), body.to_string())
    };
    let cases = [
        ("GET", "/api/v1/namespaces/default/configmaps/absent", 404),
        ("GET", "/api/v1/namespaces/default/configmaps/present", 200),
        ("GET", "/api/v1/namespaces/default/configmaps", 200),
        ("GET", "/apis/apps/v1", 200),
    ];
    for (method, path, code) in cases {
        let (got, body) = fetch(method, path, "skiff-test/1.0");
        assert_eq!(got, code, "{method} {path}: {body}");
        assert!(
            body.ends_with("}\n") && !body.contains("\n "),
            "{method} {path}: {body:?}"
        );
        let compact = json_of(&body);
        let (got, body) = fetch(method, path, "curl/8.0");
        assert_eq!(got, code, "{method} {path}: {body}");
        assert!(
            body.ends_with('}') && body.contains("\n  \""),
            "{method} {path}: {body:?}"
        );
        assert_eq!(json_of(&body), compact);
        let (_, body) = fetch(method, &format!("{path}?pretty=false"), "curl/8.0");
        assert!(
            body.ends_with("}\n") && !body.contains("\n "),
            "{method} {path}: {body:?}"
        );
        let (_, body) = fetch(method, &format!("{path}?pretty=true"), "skiff-test/1.0");
        assert!(
            body.ends_with('}') && body.contains("\n  \""),
            "{method} {path}: {body:?}"
        );
    }
    let (got, body) = fetch(
        "DELETE",
        "/api/v1/namespaces/default/configmaps/present",
        "skiff-test/1.0",
    );
    assert_eq!(got, 200, "{body}");
    assert!(body.ends_with("}\n"), "{body:?}");
}

/// The texts upstream's decoders give for a body of the wrong shape: a strategic merge patch
/// that gives a map a string (the unstructured converter's words, with the patch as Go prints
/// it), and a body that is no JSON sent to create a Namespace (the decoder's words, with the
/// start of the body in hex).
#[test]
fn malformed_bodies_are_refused_in_upstreams_words() {
    let c = Cluster::start(CONTROL_PLANE);
    c.apply(&pod_yaml("valid-pod", "{app: valid}", None), &[]);
    let err = c.k_err(&[
        "patch",
        "pod",
        "valid-pod",
        "-p",
        r#"{"metadata":{"labels":"invalid"}}"#,
    ]);
    assert_eq!(
        err.trim(),
        r#"The request is invalid: patch: Invalid value: "map[metadata:map[labels:invalid]]": cannot restore map from string"#
    );
    let err = c.k_err(&[
        "patch",
        "pod",
        "valid-pod",
        "-p",
        r#"{"spec":{"containers":[{"name":"c","image":5,"ports":[{"containerPort":1.5}]}]}}"#,
    ]);
    assert!(
        err.contains(r#"Invalid value: "map[spec:map[containers:[map[image:5 name:c ports:[map[containerPort:1.5]]]]]]": cannot convert int64 to string"#),
        "{err}"
    );
    let pod_file = c.path().join("pod.yaml");
    std::fs::write(&pod_file, pod_yaml("raw", "{app: raw}", None)).expect("pod file");
    let err = c.k_err(&[
        "create",
        "--raw",
        "/api/v1/namespaces",
        "-f",
        &pod_file.display().to_string(),
    ]);
    assert!(
        err.contains("the object provided is unrecognized (must be of type Namespace): couldn't get version/kind; json parse error: invalid character 'a' looking for beginning of value (61706956657273696f6e3a2076310a6b696e643a20506f640a6d65746164 ...)"),
        "{err}"
    );
}

/// `kubectl diff` right after `kubectl apply` shows nothing, server-side too: a dry-run update
/// answers the object with the resourceVersion it was read at, as upstream's dry-run storage
/// does; a real change still shows.
#[test]
fn diff_after_apply_shows_nothing_until_something_changes() {
    let c = Cluster::start(CONTROL_PLANE);
    let file = c.path().join("deploy.yaml");
    let manifest = |replicas: u32| {
        format!(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: differ\nspec:\n  replicas: {replicas}\n  selector:\n    matchLabels: {{app: differ}}\n  template:\n    metadata:\n      labels: {{app: differ}}\n    spec:\n      containers:\n      - name: c\n        image: busybox:latest\n"
        )
    };
    let path = file.display().to_string();
    for server_side in [true, false] {
        std::fs::write(&file, manifest(2)).expect("manifest");
        let side = if server_side {
            "--server-side"
        } else {
            "--server-side=false"
        };
        c.k(&["apply", side, "-f", &path]);
        let out = c.kubectl(&["diff", side, "-f", &path]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{side}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert!(
            out.stdout.is_empty(),
            "{side}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        std::fs::write(&file, manifest(3)).expect("manifest");
        let out = c.kubectl(&["diff", side, "-f", &path]);
        let shown = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{side}: {shown}");
        assert!(
            shown.contains("-  replicas: 2") && shown.contains("+  replicas: 3"),
            "{side}: {shown}"
        );
        c.k(&["delete", "deployment", "differ"]);
    }
}
