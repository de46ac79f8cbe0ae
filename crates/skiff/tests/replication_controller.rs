//! core/v1 ReplicationControllers end to end with `skiff server --no-agent --sim-nodes 2` and
//! the real kubectl: defaulting and validation, the table, scale, self-healing, describe,
//! cascading deletion and orphaning, adoption.

#![cfg(test)]

mod common;

use std::time::Duration;

use common::{Cluster, eventually, table};
use serde_json::Value;

const RC: &str = r#"
apiVersion: v1
kind: ReplicationController
metadata:
  name: web
spec:
  replicas: 3
  template:
    metadata:
      labels:
        app: web
    spec:
      containers:
      - name: nginx
        image: nginx:1.25
"#;

fn cluster() -> Cluster {
    let c = Cluster::start(&["--no-agent", "--sim-nodes", "2"]);
    let ready = eventually(Duration::from_secs(30), || {
        let out = c.k(&["get", "nodes"]);
        (out.matches(" Ready ").count() == 2).then_some(())
    });
    assert!(ready.is_some(), "nodes not Ready: {}", c.k(&["get", "nodes"]));
    c
}

fn items(v: &Value) -> Vec<Value> {
    v["items"].as_array().cloned().unwrap_or_default()
}

/// The pods of `selector` not being deleted.
fn live_pods(c: &Cluster, selector: &str) -> Vec<Value> {
    items(&c.get_json(&["pods", "-l", selector]))
        .into_iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .collect()
}

/// Waits for exactly `n` live pods of `selector`, all Running, and for the controller's status
/// to say so.
fn wait_replicas(c: &Cluster, rc: &str, selector: &str, n: usize) -> Vec<Value> {
    eventually(Duration::from_secs(40), || {
        let pods = live_pods(c, selector);
        let running = pods.iter().all(|p| p["status"]["phase"] == "Running");
        let status = c.get_json(&["rc", rc])["status"].clone();
        let ready = status["readyReplicas"].as_u64().unwrap_or(0) as usize;
        (pods.len() == n && running && status["replicas"] == n && ready == n).then_some(pods)
    })
    .unwrap_or_else(|| {
        panic!(
            "expected {n} running pods of rc/{rc}:\n{}\n{}\nserver log:\n{}",
            c.k(&["get", "pods", "-o", "wide"]),
            c.k(&["get", "rc", rc, "-o", "yaml"]),
            common::tail(&c.log(), 30)
        )
    })
}

#[test]
fn replication_controller_scales_heals_and_describes() {
    let c = cluster();
    c.apply(RC, &[]);

    // Defaulting: the selector and the object's labels from the template's labels.
    let rc = c.get_json(&["rc", "web"]);
    assert_eq!(rc["spec"]["selector"], serde_json::json!({"app": "web"}));
    assert_eq!(rc["metadata"]["labels"], serde_json::json!({"app": "web"}));
    assert_eq!(rc["metadata"]["generation"], 1);

    let pods = wait_replicas(&c, "web", "app=web", 3);
    let uid = rc["metadata"]["uid"].as_str().expect("uid").to_string();
    for p in &pods {
        let owners = p["metadata"]["ownerReferences"].as_array().cloned().unwrap_or_default();
        assert_eq!(owners.len(), 1, "{p}");
        assert_eq!(owners[0]["apiVersion"], "v1");
        assert_eq!(owners[0]["kind"], "ReplicationController");
        assert_eq!(owners[0]["name"], "web");
        assert_eq!(owners[0]["uid"], uid.as_str());
        assert_eq!(owners[0]["controller"], true);
        assert!(p["metadata"]["name"].as_str().unwrap_or_default().starts_with("web-"));
    }
    let status = c.get_json(&["rc", "web"])["status"].clone();
    assert_eq!(status["fullyLabeledReplicas"], 3);
    assert_eq!(status["availableReplicas"], 3);
    assert_eq!(status["observedGeneration"], 1);

    // A disruption budget counts the controller's scale.
    c.apply(
        "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata:\n  name: web\nspec:\n  maxUnavailable: 1\n  selector:\n    matchLabels: {app: web}\n",
        &[],
    );
    let budget = eventually(Duration::from_secs(20), || {
        let st = c.get_json(&["pdb", "web"])["status"].clone();
        (st["expectedPods"] == 3 && st["disruptionsAllowed"] == 1).then_some(())
    });
    assert!(budget.is_some(), "{}", c.k(&["get", "pdb", "web", "-o", "yaml"]));

    // The short name, the table and its wide columns, the `all` category.
    let t = table(&c.k(&["get", "rc", "-o", "wide"]));
    assert_eq!(
        t[0],
        [
            "NAME",
            "DESIRED",
            "CURRENT",
            "READY",
            "AGE",
            "CONTAINERS",
            "IMAGES",
            "SELECTOR"
        ]
    );
    assert_eq!(t[1][..4], ["web", "3", "3", "3"]);
    assert_eq!(t[1][5..], ["nginx", "nginx:1.25", "app=web"]);
    let all = c.k(&["get", "all"]);
    assert!(all.contains("replicationcontroller/web"), "{all}");
    assert!(c.k(&["api-resources"]).lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.first() == Some(&"replicationcontrollers") && f.get(1) == Some(&"rc") && f.get(2) == Some(&"v1")
    }));

    // Scale up and down through the scale subresource.
    let out = c.k(&["scale", "rc", "web", "--replicas=5"]);
    assert!(out.contains("replicationcontroller/web scaled"), "{out}");
    wait_replicas(&c, "web", "app=web", 5);
    let scale = serde_json::from_str::<Value>(&c.k(&[
        "get",
        "--raw",
        "/api/v1/namespaces/default/replicationcontrollers/web/scale",
    ]))
    .expect("json");
    assert_eq!(scale["kind"], "Scale");
    assert_eq!(scale["spec"]["replicas"], 5);
    assert_eq!(scale["status"]["selector"], "app=web");
    c.k(&["scale", "rc", "web", "--replicas=1"]);
    let pods = wait_replicas(&c, "web", "app=web", 1);
    assert_eq!(c.get_json(&["rc", "web"])["metadata"]["generation"], 3);

    // A deleted pod is replaced.
    let victim = pods[0]["metadata"]["name"].as_str().expect("name").to_string();
    c.k(&["delete", "pod", &victim, "--wait=false"]);
    let back = wait_replicas(&c, "web", "app=web", 1);
    assert_ne!(back[0]["metadata"]["name"], victim.as_str());

    // kubectl describe reads the controller, its pods and its events.
    let d = c.k(&["describe", "rc", "web"]);
    for want in [
        "Name:         web",
        "Selector:     app=web",
        "Replicas:     1 current / 1 desired",
        "Pods Status:  1 Running / 0 Waiting / 0 Succeeded / 0 Failed",
        "SuccessfulCreate",
        "SuccessfulDelete",
        "replication-controller",
    ] {
        assert!(d.contains(want), "describe lacks {want:?}:\n{d}");
    }

    // Validation as upstream's.
    let bad = RC.replace("  replicas: 3\n", "  replicas: 3\n  selector:\n    app: db\n");
    let err = c.stdin_kubectl_err(&["create", "-f", "-"], &bad.replace("name: web", "name: bad"));
    assert!(
        err.contains(
            "ReplicationController \"bad\" is invalid: spec.template.metadata.labels: Invalid value: map[string]string{\"app\":\"web\"}: `selector` does not match template `labels`"
        ),
        "{err}"
    );
    let neg = RC
        .replace("replicas: 3", "replicas: -1")
        .replace("name: web", "name: neg");
    let err = c.stdin_kubectl_err(&["create", "-f", "-"], &neg);
    assert!(
        err.contains("spec.replicas: Invalid value: -1: must be greater than or equal to 0"),
        "{err}"
    );
}

#[test]
fn replication_controller_deletion_cascades_or_orphans() {
    let c = cluster();
    c.apply(RC, &[]);
    wait_replicas(&c, "web", "app=web", 3);

    // Background cascading deletion: the garbage collector deletes the pods.
    c.k(&["delete", "rc", "web"]);
    let gone = eventually(Duration::from_secs(40), || {
        live_pods(&c, "app=web").is_empty().then_some(())
    });
    assert!(gone.is_some(), "pods left: {}", c.k(&["get", "pods"]));

    // Orphaning: the pods stay, without their owner reference.
    c.apply(RC, &[]);
    let pods = wait_replicas(&c, "web", "app=web", 3);
    let out = c.k(&["delete", "rc", "web", "--cascade=orphan"]);
    assert!(out.contains("replicationcontroller \"web\" deleted"), "{out}");
    let orphaned = eventually(Duration::from_secs(30), || {
        let now = live_pods(&c, "app=web");
        (now.len() == 3 && now.iter().all(|p| p["metadata"]["ownerReferences"].is_null())).then_some(now)
    })
    .unwrap_or_else(|| panic!("pods not orphaned: {}", c.k(&["get", "pods", "-o", "yaml"])));
    let mut before: Vec<&str> = pods.iter().filter_map(|p| p["metadata"]["name"].as_str()).collect();
    let mut after: Vec<&str> = orphaned.iter().filter_map(|p| p["metadata"]["name"].as_str()).collect();
    before.sort_unstable();
    after.sort_unstable();
    assert_eq!(before, after);

    // A new controller with the same selector adopts the orphans instead of making pods.
    c.apply(
        &RC.replace("name: web", "name: again")
            .replace("replicas: 3", "replicas: 2"),
        &[],
    );
    let adopted = wait_replicas(&c, "again", "app=web", 2);
    let uid = c.get_json(&["rc", "again"])["metadata"]["uid"].clone();
    for p in &adopted {
        assert_eq!(p["metadata"]["ownerReferences"][0]["uid"], uid);
        assert!(
            after.contains(&p["metadata"]["name"].as_str().unwrap_or_default()),
            "{p}"
        );
    }
}

/// The Python client's own calls, as its tests make them: ReplicationControllers through
/// CoreV1Api (scale included) and autoscaling/v1 HorizontalPodAutoscalers through
/// AutoscalingV1Api.
#[test]
fn python_client_replication_controllers_and_v1_autoscalers() {
    let c = cluster();
    let script = r#"
import sys, time
from kubernetes import client, config
config.load_kube_config(config_file=sys.argv[1])
v1 = client.CoreV1Api()
template = client.V1PodTemplateSpec(
    metadata=client.V1ObjectMeta(labels={"app": "py"}),
    spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="nginx")]))
rc = client.V1ReplicationController(
    metadata=client.V1ObjectMeta(name="py"),
    spec=client.V1ReplicationControllerSpec(replicas=2, template=template))
v1.create_namespaced_replication_controller("default", rc)
got = v1.read_namespaced_replication_controller("py", "default")
assert got.spec.selector == {"app": "py"}, got.spec.selector
deadline = time.time() + 40
while time.time() < deadline:
    st = v1.read_namespaced_replication_controller_status("py", "default").status
    if st.replicas == 2 and st.ready_replicas == 2:
        break
    time.sleep(0.5)
else:
    raise SystemExit("not ready: %s" % st)
scale = v1.read_namespaced_replication_controller_scale("py", "default")
assert scale.spec.replicas == 2 and scale.status.selector == "app=py", scale
v1.patch_namespaced_replication_controller_scale("py", "default", {"spec": {"replicas": 1}})
while time.time() < deadline:
    if len(v1.list_namespaced_pod("default", label_selector="app=py").items) == 1:
        break
    time.sleep(0.5)
else:
    raise SystemExit("not scaled down")
names = [i.metadata.name for i in v1.list_namespaced_replication_controller("default").items]
assert names == ["py"], names
v1.delete_namespaced_replication_controller("py", "default")

hpa = client.AutoscalingV1Api()
body = client.V1HorizontalPodAutoscaler(
    metadata=client.V1ObjectMeta(name="py"),
    spec=client.V1HorizontalPodAutoscalerSpec(
        scale_target_ref=client.V1CrossVersionObjectReference(api_version="v1", kind="ReplicationController", name="py"),
        min_replicas=1, max_replicas=3, target_cpu_utilization_percentage=70))
hpa.create_namespaced_horizontal_pod_autoscaler("default", body)
got = hpa.read_namespaced_horizontal_pod_autoscaler("py", "default")
assert got.spec.target_cpu_utilization_percentage == 70, got.spec
got.spec.max_replicas = 5
hpa.replace_namespaced_horizontal_pod_autoscaler("py", "default", got)
v2 = client.AutoscalingV2Api().read_namespaced_horizontal_pod_autoscaler("py", "default")
assert v2.spec.max_replicas == 5, v2.spec
assert v2.spec.metrics[0].resource.target.average_utilization == 70, v2.spec.metrics
hpa.delete_namespaced_horizontal_pod_autoscaler("py", "default")
print("ok")
"#;
    c.python(script);
}
