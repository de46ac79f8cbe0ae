//! The control plane driven by the real kubectl: discovery, apply, get in every form,
//! label, taint, cordon, create, scale, delete, explain.

#![cfg(test)]

mod common;

use std::time::Duration;

use common::storage::{STORAGECLASS_HEADER, claim};
use common::{Cluster, eventually};

const CONTROL_PLANE: &[&str] = &["--no-agent", "--no-scheduler"];

#[test]
fn version_discovery_and_api_resources() {
    let c = Cluster::start(CONTROL_PLANE);
    let v = c.k(&["version", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_str(&v).expect("version json");
    assert_eq!(v["serverVersion"]["major"], "1");
    assert_eq!(v["serverVersion"]["minor"], "33");
    let res = c.k(&["api-resources"]);
    for line in [
        "pods",
        "po",
        "deployments",
        "deploy",
        "daemonsets",
        "ds",
        "cronjobs",
        "cj",
        "leases",
        "priorityclasses",
        "poddisruptionbudgets",
    ] {
        assert!(res.contains(line), "api-resources lacks {line}:\n{res}");
    }
    let ns = c.k(&["get", "namespaces"]);
    for n in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        assert!(ns.contains(n), "{ns}");
    }
    assert!(ns.contains("Active"));
}

#[test]
fn anonymous_requests_are_forbidden_and_bad_credentials_get_401() {
    let c = Cluster::start(CONTROL_PLANE);
    let curl = |path: &str, extra: &[&str]| {
        let out = std::process::Command::new("curl")
            .args(["-sk", "-w", "\n%{http_code}"])
            .args(extra)
            .arg(format!("https://127.0.0.1:{}{path}", c.port))
            .output()
            .expect("curl");
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    // Without credentials a request is system:anonymous, which RBAC allows only health,
    // version and nothing else (upstream's default `--anonymous-auth`).
    let anonymous = curl("/api/v1/namespaces/default/pods", &[]);
    assert!(anonymous.ends_with("\n403"), "{anonymous}");
    assert!(
        anonymous.contains(
            r#"pods is forbidden: User \"system:anonymous\" cannot list resource \"pods\" in API group \"\" in the namespace \"default\""#
        ),
        "{anonymous}"
    );
    assert_eq!(curl("/readyz", &[]), "ok\n200");
    // A token that authenticates nobody is 401, not anonymous.
    let bad = curl(
        "/api/v1/namespaces/default/pods",
        &["-H", "Authorization: Bearer nonsense"],
    );
    assert!(bad.ends_with("\n401"), "{bad}");
}

const DEPLOY: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  labels:
    app: web
spec:
  replicas: 2
  selector:
    matchLabels:
      app: web
  template:
    metadata:
      labels:
        app: web
    spec:
      containers:
      - name: nginx
        image: nginx:1.15
        ports:
        - containerPort: 80
"#;

#[test]
fn apply_create_update_unchanged_and_server_side() {
    let c = Cluster::start(CONTROL_PLANE);
    let out = c.apply(DEPLOY, &[]);
    assert!(out.contains("deployment.apps/web created"), "{out}");
    let out = c.apply(DEPLOY, &[]);
    assert!(out.contains("deployment.apps/web unchanged"), "{out}");
    let edited = DEPLOY
        .replace("nginx:1.15", "nginx:1.16")
        .replace("replicas: 2", "replicas: 3");
    let out = c.apply(&edited, &[]);
    assert!(out.contains("deployment.apps/web configured"), "{out}");
    let d = c.get_json(&["deployment", "web"]);
    assert_eq!(d["spec"]["template"]["spec"]["containers"][0]["image"], "nginx:1.16");
    assert_eq!(d["spec"]["replicas"], 3);
    assert_eq!(d["metadata"]["generation"], 2);
    // Defaults kubectl relies on.
    assert_eq!(d["spec"]["strategy"]["type"], "RollingUpdate");
    assert_eq!(d["spec"]["revisionHistoryLimit"], 10);
    assert_eq!(
        d["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"],
        "IfNotPresent"
    );

    // Server-side apply creates and then updates, with managedFields.
    let cm = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ssa\ndata:\n  a: \"1\"\n";
    let out = c.apply(cm, &["--server-side"]);
    assert!(out.contains("configmap/ssa serverside-applied"), "{out}");
    let out = c.apply(&cm.replace("\"1\"", "\"2\""), &["--server-side"]);
    assert!(out.contains("serverside-applied"), "{out}");
    let got = c.get_json(&["configmap", "ssa", "--show-managed-fields"]);
    assert_eq!(got["data"]["a"], "2");
    let managers: Vec<&str> = got["metadata"]["managedFields"]
        .as_array()
        .expect("managedFields")
        .iter()
        .filter_map(|m| m["manager"].as_str())
        .collect();
    assert!(managers.contains(&"kubectl"), "{managers:?}");
}

#[test]
fn get_in_every_form() {
    // No controllers: the Deployment stays without pods, so the pod listings are exact.
    let c = Cluster::start(&["--no-agent", "--no-scheduler", "--no-controllers"]);
    c.apply(DEPLOY, &[]);
    c.apply(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p1\n  labels:\n    tier: front\nspec:\n  containers:\n  - name: c\n    image: busybox:latest\n",
        &[],
    );
    let out = c.k(&["get", "pods"]);
    assert!(out.starts_with("NAME"), "{out}");
    assert!(
        out.contains("READY") && out.contains("STATUS") && out.contains("RESTARTS"),
        "{out}"
    );
    assert!(
        out.contains("p1") && out.contains("0/1") && out.contains("Pending"),
        "{out}"
    );
    let wide = c.k(&["get", "pods", "-o", "wide"]);
    assert!(
        wide.contains("NOMINATED NODE") && wide.contains("READINESS GATES"),
        "{wide}"
    );
    let labels = c.k(&["get", "pods", "--show-labels"]);
    assert!(labels.contains("tier=front"), "{labels}");
    let col = c.k(&["get", "pods", "-L", "tier"]);
    assert!(col.contains("TIER") && col.contains("front"), "{col}");
    let all = c.k(&["get", "pods", "-A"]);
    assert!(all.contains("NAMESPACE") && all.contains("default"), "{all}");
    // The Deployment's pods are there too once its controller has run: select p1 by label.
    let name = c.k(&["get", "pods", "-l", "tier", "-o", "name"]);
    assert_eq!(name.trim(), "pod/p1");
    let yaml = c.k(&["get", "pod", "p1", "-o", "yaml"]);
    assert!(
        yaml.contains("restartPolicy: Always") && yaml.contains("qosClass: BestEffort"),
        "{yaml}"
    );
    let deploy = c.k(&["get", "deploy"]);
    assert!(deploy.contains("UP-TO-DATE") && deploy.contains("web"), "{deploy}");
    let sel = c.k(&["get", "pods", "-l", "tier=front", "-o", "name"]);
    assert_eq!(sel.trim(), "pod/p1");
    let none = c.k(&["get", "pods", "-l", "tier!=front", "-o", "name"]);
    assert_eq!(none.trim(), "");
    let fsel = c.k(&["get", "pods", "--field-selector", "metadata.name=p1", "-o", "name"]);
    assert_eq!(fsel.trim(), "pod/p1");
    let bad = c.k_err(&["get", "pods", "--field-selector", "spec.foo=bar"]);
    assert!(
        bad.contains("BadRequest") || bad.contains("field label not supported"),
        "{bad}"
    );
    // Every resource kind can be listed.
    for r in [
        "namespaces",
        "nodes",
        "pods",
        "events",
        "secrets",
        "configmaps",
        "services",
        "endpoints",
        "serviceaccounts",
        "persistentvolumes",
        "persistentvolumeclaims",
        "deployments",
        "replicasets",
        "statefulsets",
        "daemonsets",
        "controllerrevisions",
        "jobs",
        "cronjobs",
        "leases",
        "poddisruptionbudgets",
        "priorityclasses",
        "events.events.k8s.io",
    ] {
        let out = c.kubectl(&["get", r, "-A"]);
        assert!(
            out.status.success(),
            "get {r}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn pagination_with_limit_and_continue() {
    let c = Cluster::start(CONTROL_PLANE);
    for i in 0..7 {
        c.k(&["create", "configmap", &format!("cm{i}"), "--from-literal=k=v"]);
    }
    let out = c.k(&["get", "configmaps", "--chunk-size=2", "-o", "name"]);
    let names: Vec<&str> = out.lines().filter(|l| l.starts_with("configmap/cm")).collect();
    assert_eq!(names.len(), 7, "{out}");
}

#[test]
fn label_taint_cordon() {
    let c = Cluster::start(CONTROL_PLANE);
    c.apply("apiVersion: v1\nkind: Node\nmetadata:\n  name: n1\n", &[]);
    c.k(&["label", "nodes", "n1", "disktype=ssd"]);
    assert!(c.k(&["get", "nodes", "n1", "--show-labels"]).contains("disktype=ssd"));
    let err = c.k_err(&["label", "nodes", "n1", "disktype=hdd"]);
    assert!(err.contains("already has a value"), "{err}");
    c.k(&["label", "nodes", "n1", "disktype=hdd", "--overwrite"]);
    assert_eq!(c.get_json(&["node", "n1"])["metadata"]["labels"]["disktype"], "hdd");
    c.k(&["label", "nodes", "n1", "disktype-"]);
    assert!(
        c.get_json(&["node", "n1"])["metadata"]["labels"]
            .get("disktype")
            .is_none()
    );

    c.k(&["taint", "node", "n1", "key=value:NoSchedule"]);
    let n = c.get_json(&["node", "n1"]);
    assert_eq!(n["spec"]["taints"][0]["key"], "key");
    assert_eq!(n["spec"]["taints"][0]["effect"], "NoSchedule");
    c.k(&["taint", "node", "n1", "other=x:PreferNoSchedule"]);
    c.k(&["taint", "node", "n1", "key:NoSchedule-"]);
    let n = c.get_json(&["node", "n1"]);
    let taints = n["spec"]["taints"].as_array().expect("taints");
    assert_eq!(taints.len(), 1, "{taints:?}");
    assert_eq!(taints[0]["key"], "other");
    let bad = c.k_err(&["taint", "node", "n1", "k=v:Sometimes"]);
    assert!(bad.contains("Sometimes") || bad.contains("effect"), "{bad}");

    c.k(&["cordon", "n1"]);
    assert_eq!(c.get_json(&["node", "n1"])["spec"]["unschedulable"], true);
    let out = c.k(&["get", "nodes"]);
    assert!(out.contains("SchedulingDisabled"), "{out}");
    c.k(&["uncordon", "n1"]);
    assert!(c.get_json(&["node", "n1"])["spec"].get("unschedulable").is_none());
}

#[test]
fn create_secret_configmap_namespace_scale() {
    let c = Cluster::start(CONTROL_PLANE);
    let f = c.path().join("username.txt");
    std::fs::write(&f, "admin").expect("write");
    c.k(&[
        "create",
        "secret",
        "generic",
        "user",
        &format!("--from-file={}", f.display()),
    ]);
    c.k(&[
        "create",
        "secret",
        "generic",
        "pass",
        "--from-literal=password=c1oudc0w!",
    ]);
    let s = c.get_json(&["secret", "user"]);
    assert_eq!(s["data"]["username.txt"], "YWRtaW4=");
    assert_eq!(s["type"], "Opaque");
    let out = c.k(&["get", "secrets"]);
    assert!(
        out.contains("user") && out.contains("Opaque") && out.contains("DATA"),
        "{out}"
    );
    c.k(&["create", "configmap", "conf", "--from-literal=a=b"]);
    assert_eq!(c.get_json(&["configmap", "conf"])["data"]["a"], "b");
    c.k(&["create", "namespace", "team"]);
    assert!(c.k(&["get", "ns", "team"]).contains("Active"));
    c.k(&["create", "deployment", "d1", "--image=busybox:latest", "-n", "team"]);
    c.k(&["scale", "deployment", "d1", "--replicas=4", "-n", "team"]);
    assert_eq!(c.get_json(&["deployment", "d1", "-n", "team"])["spec"]["replicas"], 4);
    let already = c.k_err(&["create", "namespace", "team"]);
    assert!(
        already.contains("AlreadyExists") && already.contains("namespaces \"team\" already exists"),
        "{already}"
    );
    let missing = c.k_err(&["get", "pod", "nope"]);
    assert!(
        missing.contains("NotFound") && missing.contains("pods \"nope\" not found"),
        "{missing}"
    );
    let no_ns = c.k_err(&["create", "configmap", "x", "--from-literal=a=b", "-n", "ghost"]);
    assert!(no_ns.contains("namespaces \"ghost\" not found"), "{no_ns}");
}

#[test]
fn delete_cascades_and_namespace_deletion() {
    let c = Cluster::start(&["--no-agent", "--no-scheduler"]);
    let owner = c.apply("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: owner\n", &[]);
    assert!(owner.contains("created"));
    let uid = c.get_json(&["configmap", "owner"])["metadata"]["uid"]
        .as_str()
        .expect("uid")
        .to_string();
    let dep = |name: &str, uid: &str| {
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  ownerReferences:\n  - apiVersion: v1\n    kind: ConfigMap\n    name: owner\n    uid: {uid}\n"
        )
    };
    c.apply(&dep("child-a", &uid), &[]);
    // Orphan: the child stays, without its ownerReference.
    c.k(&["delete", "configmap", "owner", "--cascade=orphan"]);
    let orphaned = eventually(Duration::from_secs(10), || {
        let v = c.get_json(&["configmap", "child-a"]);
        v["metadata"].get("ownerReferences").is_none().then_some(())
    });
    assert!(orphaned.is_some(), "child-a kept its ownerReference");
    assert!(c.kubectl(&["get", "configmap", "owner"]).status.code() != Some(0));

    // Background: the child goes after the owner.
    c.apply("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: owner\n", &[]);
    let uid = c.get_json(&["configmap", "owner"])["metadata"]["uid"]
        .as_str()
        .expect("uid")
        .to_string();
    c.apply(&dep("child-b", &uid), &[]);
    c.k(&["delete", "configmap", "owner"]);
    let gone = eventually(Duration::from_secs(10), || {
        (!c.kubectl(&["get", "configmap", "child-b"]).status.success()).then_some(())
    });
    assert!(gone.is_some(), "child-b survived its owner");

    // Foreground: delete --wait returns once owner and child are gone.
    c.apply("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: owner\n", &[]);
    let uid = c.get_json(&["configmap", "owner"])["metadata"]["uid"]
        .as_str()
        .expect("uid")
        .to_string();
    let dep3 = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: child-c\n  ownerReferences:\n  - apiVersion: v1\n    kind: ConfigMap\n    name: owner\n    uid: {uid}\n    blockOwnerDeletion: true\n"
    );
    c.apply(&dep3, &[]);
    c.k(&[
        "delete",
        "configmap",
        "owner",
        "--cascade=foreground",
        "--wait=true",
        "--timeout=30s",
    ]);
    assert!(!c.kubectl(&["get", "configmap", "child-c"]).status.success());

    // Deleting a namespace deletes what is in it.
    c.k(&["create", "namespace", "gone"]);
    c.k(&["create", "configmap", "x", "--from-literal=a=b", "-n", "gone"]);
    c.k(&["delete", "namespace", "gone", "--wait=true", "--timeout=60s"]);
    assert!(!c.kubectl(&["get", "namespace", "gone"]).status.success());
}

#[test]
fn garbage_collector_never_collects_for_an_owner_it_cannot_judge() {
    let c = Cluster::start(&["--no-agent", "--no-scheduler"]);
    c.k(&["create", "namespace", "a"]);
    c.k(&["create", "namespace", "b"]);
    c.k(&["create", "configmap", "owner", "-n", "a"]);
    let uid = c.get_json(&["configmap", "owner", "-n", "a"])["metadata"]["uid"]
        .as_str()
        .expect("uid")
        .to_string();
    let owned = |kind: &str, name: &str, ns: &str, api_version: &str, owner_kind: &str, uid: &str| {
        let ns = if ns.is_empty() {
            String::new()
        } else {
            format!("  namespace: {ns}\n")
        };
        format!(
            "apiVersion: {}\nkind: {kind}\nmetadata:\n  name: {name}\n{ns}  ownerReferences:\n  - apiVersion: {api_version}\n    kind: {owner_kind}\n    name: owner\n    uid: {uid}\n",
            if kind == "ClusterRole" {
                "rbac.authorization.k8s.io/v1"
            } else {
                "v1"
            }
        )
    };
    // An owner of a kind this server does not serve (a custom kind not installed yet) is not
    // taken as gone ...
    c.apply(
        &owned("ConfigMap", "widget-child", "a", "example.com/v1", "Widget", &uid),
        &[],
    );
    // ... a cluster-scoped dependent of a namespaced owner is reported and left ...
    c.apply(&owned("ClusterRole", "cm-child", "", "v1", "ConfigMap", &uid), &[]);
    // ... while an owner's uid in another namespace is absent for the dependent, which goes,
    // reported too; and a plainly dangling reference goes, which shows the collector at work.
    c.apply(&owned("ConfigMap", "cross-child", "b", "v1", "ConfigMap", &uid), &[]);
    c.apply(
        &owned("ConfigMap", "dangling-child", "a", "v1", "ConfigMap", "no-such-uid"),
        &[],
    );
    let collected = eventually(Duration::from_secs(20), || {
        let gone = |ns: &str, name: &str| !c.kubectl(&["get", "configmap", name, "-n", ns]).status.success();
        (gone("a", "dangling-child") && gone("b", "cross-child")).then_some(())
    });
    assert!(collected.is_some(), "dangling dependents were not collected");
    let reported = eventually(Duration::from_secs(20), || {
        let events = c.get_json(&["events", "-A", "--field-selector", "reason=OwnerRefInvalidNamespace"]);
        let items = events["items"].as_array().cloned().unwrap_or_default();
        let about = |name: &str| {
            items
                .iter()
                .find(|e| e["involvedObject"]["name"] == name && e["type"] == "Warning")
                .cloned()
        };
        Some((about("cm-child")?, about("cross-child")?))
    });
    let (cluster_scoped, cross) = reported.expect("OwnerRefInvalidNamespace events");
    assert_eq!(
        cluster_scoped["message"],
        format!("ownerRef [v1/ConfigMap, namespace: , name: owner, uid: {uid}] does not exist in namespace \"\"")
    );
    assert_eq!(cluster_scoped["involvedObject"]["kind"], "ClusterRole");
    assert_eq!(
        cross["message"],
        format!("ownerRef [v1/ConfigMap, namespace: b, name: owner, uid: {uid}] does not exist in namespace \"b\"")
    );
    // Still there well after the collector judged the others.
    std::thread::sleep(Duration::from_secs(3));
    c.k(&["get", "configmap", "widget-child", "-n", "a"]);
    c.k(&["get", "clusterrole", "cm-child"]);
}

#[test]
fn explain_and_validation_errors() {
    let c = Cluster::start(CONTROL_PLANE);
    let out = c.k(&["explain", "pod.spec.containers.resources"]);
    assert!(out.contains("limits") && out.contains("requests"), "{out}");
    let bad = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: bad\nspec:\n  containers:\n  - name: c\n    image: busybox\n    resources:\n      requests:\n        cpu: \"2\"\n      limits:\n        cpu: \"1\"\n";
    let out = c
        .kubectl_cmd(&["apply", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut ch| {
            use std::io::Write;
            ch.stdin.take().expect("stdin").write_all(bad.as_bytes())?;
            ch.wait_with_output()
        })
        .expect("kubectl");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains(
            "spec.containers[0].resources.requests: Invalid value: \"2\": must be less than or equal to cpu limit of 1"
        ),
        "{err}"
    );
    // Unknown fields are rejected under kubectl's strict validation.
    let unknown = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: u\nfoo: bar\n";
    let out = c
        .kubectl_cmd(&["apply", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut ch| {
            use std::io::Write;
            ch.stdin.take().expect("stdin").write_all(unknown.as_bytes())?;
            ch.wait_with_output()
        })
        .expect("kubectl");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "unknown field accepted");
    assert!(err.contains("unknown field \"foo\""), "{err}");
}

/// `/openapi/v2`: kubectl falls back to it for a kind the v3 documents do not know, so an object
/// of a removed version reads upstream's `no matches for kind` (not a validation failure), and
/// `explain --output plaintext-openapiv2` reads its definitions.
#[test]
fn removed_versions_and_openapi_v2() {
    let c = Cluster::start(CONTROL_PLANE);
    let old = "apiVersion: extensions/v1beta1\nkind: Ingress\nmetadata:\n  name: old\nspec:\n  backend:\n    serviceName: x\n    servicePort: 80\n";
    for verb in ["apply", "create"] {
        let err = c.stdin_kubectl_err(&[verb, "-f", "-"], old);
        assert!(
            err.contains(r#"no matches for kind "Ingress" in version "extensions/v1beta1""#),
            "{verb}: {err}"
        );
    }
    let out = c.k(&["explain", "deployment.spec.replicas", "--output", "plaintext-openapiv2"]);
    assert!(
        out.contains("replicas <integer>") && out.contains("Number of desired pods"),
        "{out}"
    );
    let doc: serde_json::Value = serde_json::from_str(&c.k(&["get", "--raw", "/openapi/v2"])).expect("json");
    assert_eq!(doc["swagger"], "2.0");
    assert_eq!(
        doc["definitions"]["io.k8s.api.apps.v1.Deployment"]["properties"]["spec"]["$ref"],
        "#/definitions/io.k8s.api.apps.v1.DeploymentSpec"
    );
    assert!(doc["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments"]["post"]["parameters"][0]["in"] == "body");
}

const STORAGE_CLASS: &str = r#"
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: local
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
"#;

/// `kubectl apply -f -` that must fail; returns stderr.
fn apply_err(c: &Cluster, yaml: &str) -> String {
    c.stdin_kubectl_err(&["apply", "-f", "-"], yaml)
}

#[test]
fn storage_classes_apply_get_validate_and_stay_immutable() {
    let c = Cluster::start(&["--no-agent"]);
    let out = c.apply(STORAGE_CLASS, &[]);
    assert!(out.contains("storageclass.storage.k8s.io/local created"), "{out}");
    let sc = c.get_json(&["storageclass", "local"]);
    assert_eq!(sc["reclaimPolicy"], "Delete", "defaulted: {sc}");
    assert_eq!(sc["volumeBindingMode"], "WaitForFirstConsumer");

    let table = c.k(&["get", "sc"]);
    let mut lines = table.lines();
    let header: Vec<&str> = lines.next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(header, STORAGECLASS_HEADER, "{table}");
    let row: Vec<&str> = lines.next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(
        row[..5],
        [
            "local",
            "kubernetes.io/no-provisioner",
            "Delete",
            "WaitForFirstConsumer",
            "false"
        ],
        "{table}"
    );

    c.k(&[
        "annotate",
        "storageclass",
        "local",
        "storageclass.kubernetes.io/is-default-class=true",
    ]);
    let table = c.k(&["get", "storageclasses"]);
    assert!(table.contains("local (default)"), "{table}");

    // The PV binder finds the class through the API: a claim of it waits for its first consumer.
    c.apply(&claim("data", Some("local"), "ReadWriteOnce", "1Gi"), &[]);
    let waited = eventually(Duration::from_secs(30), || {
        let events = c.k(&["get", "events", "-o", "json"]);
        events
            .contains("waiting for first consumer to be created before binding")
            .then_some(())
    });
    assert!(
        waited.is_some(),
        "no WaitForFirstConsumer event:\n{}",
        c.k(&["get", "events"])
    );
    let events = c.k(&["get", "events"]);
    assert!(!events.contains("not found"), "{events}");

    // DefaultStorageClass admission: a claim naming no class gets the default one; an
    // explicit "" stays without a class.
    c.apply(&claim("plain", None, "ReadWriteOnce", "1Gi"), &[]);
    let class = c.k(&["get", "pvc", "plain", "-o", "jsonpath={.spec.storageClassName}"]);
    assert_eq!(class.trim(), "local");
    c.apply(&claim("classless", Some(""), "ReadWriteOnce", "1Gi"), &[]);
    let class = c.k(&["get", "pvc", "classless", "-o", "jsonpath={.spec.storageClassName}"]);
    assert_eq!(class.trim(), "");

    // Invalid classes are rejected with upstream's messages.
    let err = apply_err(
        &c,
        "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata:\n  name: bad\nprovisioner: \"not valid!\"\nreclaimPolicy: Recycle\n",
    );
    assert!(err.contains("The StorageClass \"bad\" is invalid"), "{err}");
    assert!(err.contains("provisioner: Invalid value: \"not valid!\""), "{err}");
    assert!(
        err.contains("reclaimPolicy: Unsupported value: \"Recycle\": supported values: \"Delete\", \"Retain\""),
        "{err}"
    );
    assert!(!c.kubectl(&["get", "sc", "bad"]).status.success());

    // provisioner, parameters, reclaimPolicy and volumeBindingMode are fixed at creation.
    let err = apply_err(
        &c,
        &STORAGE_CLASS.replace("kubernetes.io/no-provisioner", "example.com/other"),
    );
    assert!(
        err.contains("provisioner: Forbidden: updates to provisioner are forbidden."),
        "{err}"
    );
    let err = apply_err(&c, &STORAGE_CLASS.replace("WaitForFirstConsumer", "Immediate"));
    assert!(
        err.contains("volumeBindingMode: Invalid value: \"Immediate\": field is immutable"),
        "{err}"
    );
    let sc = c.get_json(&["storageclass", "local"]);
    assert_eq!(sc["provisioner"], "kubernetes.io/no-provisioner");
    assert_eq!(sc["volumeBindingMode"], "WaitForFirstConsumer");
    // Mutable fields still change.
    c.apply(&format!("{STORAGE_CLASS}allowVolumeExpansion: true\n"), &[]);
    assert_eq!(c.get_json(&["sc", "local"])["allowVolumeExpansion"], true);
}

#[test]
fn pod_templates_are_validated_defaulted_and_printed() {
    let c = Cluster::start(CONTROL_PLANE);
    let template = r#"
apiVersion: v1
kind: PodTemplate
metadata:
  name: web
template:
  metadata:
    labels: {app: web}
  spec:
    containers:
    - name: nginx
      image: nginx:1.27
"#;
    c.apply(template, &[]);
    let table = c.k(&["get", "podtemplates"]);
    let rows = common::table(&table);
    assert_eq!(rows[0], ["NAME", "CONTAINERS", "IMAGES", "POD", "LABELS"], "{table}");
    assert_eq!(rows[1], ["web", "nginx", "nginx:1.27", "app=web"], "{table}");
    // The template's pod spec is defaulted as a pod's is.
    let stored = c.get_json(&["podtemplate", "web"]);
    assert_eq!(stored["template"]["spec"]["restartPolicy"], "Always", "{stored}");
    assert_eq!(
        stored["template"]["spec"]["containers"][0]["imagePullPolicy"],
        "IfNotPresent"
    );
    let bad = r#"
apiVersion: v1
kind: PodTemplate
metadata:
  name: bad
template:
  spec:
    containers:
    - name: nginx
"#;
    let err = c.stdin_kubectl_err(&["apply", "-f", "-"], bad);
    assert!(
        err.contains("template.spec.containers[0].image: Required value"),
        "{err}"
    );
}
