//! CustomResourceDefinitions driven by the real kubectl: a definition is applied and becomes
//! Established, its kind is served (short name, category, printer columns, explain, scale,
//! status, watch, selectors, server-side apply), objects are pruned, defaulted and validated
//! with upstream's messages, they take part in garbage collection and namespace deletion, the
//! server serves them again after a restart, and deleting the definition deletes them.

#![cfg(test)]

mod common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::Duration;

use common::{Cluster, eventually, table};

const CONTROL_PLANE: &[&str] = &["--no-agent", "--no-scheduler"];

const CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  scope: Namespaced
  names:
    plural: widgets
    singular: widget
    kind: Widget
    shortNames: [wd]
    categories: [gadgets]
  versions:
  - name: v1
    served: true
    storage: true
    subresources:
      status: {}
      scale:
        specReplicasPath: .spec.replicas
        statusReplicasPath: .status.replicas
    additionalPrinterColumns:
    - name: Replicas
      type: integer
      jsonPath: .spec.replicas
    - name: Color
      type: string
      jsonPath: .spec.color
    - name: Age
      type: date
      jsonPath: .metadata.creationTimestamp
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [color]
            properties:
              color:
                type: string
                description: The colour the widget is painted.
                enum: [red, green]
              replicas:
                type: integer
                minimum: 0
                default: 1
              size:
                type: string
                maxLength: 5
              extra:
                type: object
                x-kubernetes-preserve-unknown-fields: true
              port:
                x-kubernetes-int-or-string: true
              ports:
                type: array
                x-kubernetes-list-type: map
                x-kubernetes-list-map-keys: [name]
                items:
                  type: object
                  required: [name]
                  properties:
                    name: {type: string}
                    number: {type: integer}
          status:
            type: object
            properties:
              replicas:
                type: integer
"#;

fn widget(name: &str, body: &str) -> String {
    format!("apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: {name}\n{body}")
}

fn install(c: &Cluster) {
    c.apply(CRD, &[]);
    c.k(&[
        "wait",
        "--for",
        "condition=Established",
        "crd/widgets.example.com",
        "--timeout=30s",
    ]);
}

#[test]
fn custom_resources_end_to_end() {
    let mut c = Cluster::start(CONTROL_PLANE);
    install(&c);
    let crd = c.get_json(&["crd", "widgets.example.com"]);
    let conds = crd["status"]["conditions"].as_array().cloned().unwrap_or_default();
    for ty in ["NamesAccepted", "Established"] {
        assert!(
            conds.iter().any(|x| x["type"] == ty && x["status"] == "True"),
            "{ty}: {conds:?}"
        );
    }
    assert_eq!(crd["status"]["acceptedNames"]["kind"], "Widget");
    assert_eq!(crd["status"]["storedVersions"], serde_json::json!(["v1"]));
    assert!(
        common::finalizers(&crd).contains(&"customresourcecleanup.apiextensions.k8s.io".to_string()),
        "{crd}"
    );

    // Defaults, pruning (with validation off, the unknown field goes silently), preserved fields.
    c.apply(
        &widget(
            "w1",
            "  labels: {app: shop}\nspec:\n  color: red\n  junk: 1\n  port: http\n  extra: {any: {thing: 1}}\n",
        ),
        &["--validate=false"],
    );
    let w1 = c.get_json(&["widget", "w1"]);
    assert_eq!(w1["spec"]["replicas"], 1, "{w1}");
    assert!(w1["spec"].get("junk").is_none(), "{w1}");
    assert_eq!(w1["spec"]["extra"]["any"]["thing"], 1);
    assert_eq!(w1["spec"]["port"], "http");
    assert_eq!(w1["metadata"]["generation"], 1);

    // Strict field validation (kubectl's default) refuses the unknown field.
    let err = c.stdin_kubectl_err(&["apply", "-f", "-"], &widget("w2", "spec:\n  color: red\n  junk: 1\n"));
    assert!(err.contains("unknown field \"spec.junk\""), "{err}");

    // Schema validation with upstream's messages.
    let err = c.stdin_kubectl_err(
        &["apply", "-f", "-"],
        &widget("bad", "spec:\n  color: blue\n  replicas: -1\n  size: toolong\n"),
    );
    for want in [
        "The Widget \"bad\" is invalid",
        "spec.color: Unsupported value: \"blue\": supported values: \"red\", \"green\"",
        "spec.replicas: Invalid value: -1: spec.replicas in body should be greater than or equal to 0",
        "spec.size: Too long: may not be more than 5 bytes",
    ] {
        assert!(err.contains(want), "{want}:\n{err}");
    }
    let err = c.stdin_kubectl_err(&["apply", "-f", "-"], &widget("bad", "spec:\n  replicas: 2\n"));
    assert!(err.contains("spec.color: Required value"), "{err}");
    let err = c.stdin_kubectl_err(
        &["apply", "-f", "-"],
        &widget("bad", "spec:\n  color: red\n  port: true\n"),
    );
    assert!(
        err.contains(
            "spec.port: Invalid value: \"boolean\": spec.port in body must be of type integer,string: \"boolean\""
        ),
        "{err}"
    );

    // A second client-side apply updates (JSON merge patch: custom kinds take no strategic merge).
    c.apply(&widget("w1", "  labels: {app: shop}\nspec:\n  color: green\n"), &[]);
    let w1 = c.get_json(&["widget", "w1"]);
    assert_eq!(w1["spec"]["color"], "green");
    assert_eq!(w1["metadata"]["generation"], 2);
    // Server-side apply.
    c.stdin_kubectl(
        &["apply", "--server-side", "-f", "-"],
        &widget("w3", "spec:\n  color: red\n  replicas: 4\n"),
    );
    let w3: serde_json::Value =
        serde_json::from_str(&c.k(&["get", "widget", "w3", "-o", "json", "--show-managed-fields"])).expect("json");
    assert_eq!(w3["spec"]["replicas"], 4);
    assert!(
        w3["metadata"]["managedFields"]
            .as_array()
            .is_some_and(|m| m.iter().any(|f| f["operation"] == "Apply")),
        "{w3}"
    );

    // Server-side apply merges a `x-kubernetes-list-type: map` list by its keys: two managers
    // each own their entry.
    for (manager, port, number) in [("first", "a", 1), ("second", "b", 2)] {
        c.stdin_kubectl(
            &["apply", "--server-side", "--field-manager", manager, "-f", "-"],
            &widget(
                "w4",
                &format!("spec:\n  color: red\n  ports:\n  - name: {port}\n    number: {number}\n"),
            ),
        );
    }
    let w4 = c.get_json(&["widget", "w4"]);
    assert_eq!(
        w4["spec"]["ports"],
        serde_json::json!([{"name": "a", "number": 1}, {"name": "b", "number": 2}]),
        "{w4}"
    );
    // Custom kinds take no strategic merge patch, as upstream's.
    let err = c.k_err(&[
        "patch",
        "widget",
        "w4",
        "--type=strategic",
        "-p",
        r#"{"spec":{"color":"green"}}"#,
    ]);
    assert!(
        err.contains("the body of the request was in an unknown format"),
        "{err}"
    );

    // Printer columns, short name and category.
    let rows = table(&c.k(&["get", "widgets"]));
    assert_eq!(rows[0], ["NAME", "REPLICAS", "COLOR", "AGE"]);
    assert!(rows.iter().any(|r| r[..3] == ["w1", "1", "green"]), "{rows:?}");
    assert!(rows.iter().any(|r| r[..3] == ["w3", "4", "red"]), "{rows:?}");
    assert!(c.k(&["get", "wd", "-o", "name"]).contains("widget.example.com/w1"));
    assert!(c.k(&["get", "gadgets", "-o", "name"]).contains("widget.example.com/w3"));
    let res = c.k(&["api-resources", "--api-group", "example.com"]);
    assert!(
        res.contains("widgets") && res.contains("wd") && res.contains("Widget"),
        "{res}"
    );

    // Selectors.
    assert_eq!(
        c.k(&["get", "widgets", "-l", "app=shop", "-o", "name"]).trim(),
        "widget.example.com/w1"
    );
    assert_eq!(
        c.k(&["get", "widgets", "--field-selector", "metadata.name=w3", "-o", "name"])
            .trim(),
        "widget.example.com/w3"
    );

    // explain reads the published OpenAPI schema.
    let explain = c.k(&["explain", "widget.spec.color"]);
    assert!(explain.contains("The colour the widget is painted."), "{explain}");

    // Scale and the status subresource.
    c.k(&["scale", "widget/w1", "--replicas=3"]);
    assert_eq!(c.get_json(&["widget", "w1"])["spec"]["replicas"], 3);
    c.k(&[
        "patch",
        "widget",
        "w1",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"replicas":3}}"#,
    ]);
    let scale = c.k(&[
        "get",
        "--raw",
        "/apis/example.com/v1/namespaces/default/widgets/w1/scale",
    ]);
    let scale: serde_json::Value = serde_json::from_str(&scale).expect("scale");
    assert_eq!(
        (scale["spec"]["replicas"].as_i64(), scale["status"]["replicas"].as_i64()),
        (Some(3), Some(3))
    );
    // The main resource ignores status.
    c.k(&[
        "patch",
        "widget",
        "w1",
        "--type=merge",
        "-p",
        r#"{"status":{"replicas":9}}"#,
    ]);
    assert_eq!(c.get_json(&["widget", "w1"])["status"]["replicas"], 3);

    // A watch sees changes.
    let mut watch = c
        .kubectl_cmd(&[
            "get",
            "widgets",
            "--watch",
            "-o",
            "custom-columns=NAME:.metadata.name,COLOR:.spec.color",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl watch");
    let (tx, rx) = mpsc::channel();
    let stdout = watch.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    std::thread::sleep(Duration::from_millis(500));
    c.k(&[
        "patch",
        "widget",
        "w3",
        "--type=merge",
        "-p",
        r#"{"spec":{"color":"green"}}"#,
    ]);
    let seen = eventually(Duration::from_secs(10), || {
        rx.try_iter()
            .find(|l| l.split_whitespace().collect::<Vec<_>>() == ["w3", "green"])
    });
    let _ = watch.kill();
    let _ = watch.wait();
    assert!(seen.is_some(), "the watch did not see w3 turn green");

    // Garbage collection: a dependent of a widget goes with it.
    let uid = w3["metadata"]["uid"].as_str().expect("uid").to_string();
    c.apply(
        &format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: dep\n  ownerReferences:\n  - apiVersion: example.com/v1\n    kind: Widget\n    name: w3\n    uid: {uid}\n"
        ),
        &[],
    );
    c.k(&["delete", "widget", "w3"]);
    c.wait_gone(&["configmap", "dep"], Duration::from_secs(30));

    // Namespace deletion removes the namespace's custom objects.
    c.k(&["create", "namespace", "team"]);
    c.stdin_kubectl(
        &["apply", "-n", "team", "-f", "-"],
        &widget("t1", "spec:\n  color: red\n"),
    );
    c.k(&["delete", "namespace", "team", "--timeout=60s"]);
    c.wait_gone(&["namespace", "team"], Duration::from_secs(60));
    let left = c.k(&["get", "widgets", "-A", "-o", "name"]);
    assert!(!left.contains("t1"), "{left}");

    // A restarted server serves the kind again.
    c.restart();
    let rows = table(&c.k(&["get", "wd"]));
    assert!(
        rows.iter().any(|r| r.first().map(String::as_str) == Some("w1")),
        "{rows:?}"
    );

    // Deleting the definition deletes its objects and stops serving the kind.
    c.k(&["delete", "crd", "widgets.example.com", "--timeout=60s"]);
    c.wait_gone(&["crd", "widgets.example.com"], Duration::from_secs(60));
    let raw = c.kubectl(&["get", "--raw", "/apis/example.com/v1/namespaces/default/widgets"]);
    assert!(!raw.status.success());
    // Created again, it starts empty.
    install(&c);
    assert_eq!(c.k(&["get", "widgets", "-A", "-o", "name"]).trim(), "");
}

const TWO_VERSIONS: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: things.example.com
spec:
  group: example.com
  scope: Cluster
  names: {plural: things, kind: Thing}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
  - name: v2
    served: true
    storage: false
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
"#;

#[test]
fn served_versions_share_one_stored_object() {
    let c = Cluster::start(CONTROL_PLANE);
    c.apply(TWO_VERSIONS, &[]);
    c.k(&[
        "wait",
        "--for",
        "condition=Established",
        "crd/things.example.com",
        "--timeout=30s",
    ]);
    c.apply(
        "apiVersion: example.com/v2\nkind: Thing\nmetadata:\n  name: t\nspec: {a: 1}\n",
        &[],
    );
    for v in ["v1", "v2"] {
        let raw = c.k(&["get", "--raw", &format!("/apis/example.com/{v}/things/t")]);
        let obj: serde_json::Value = serde_json::from_str(&raw).expect("json");
        assert_eq!(obj["apiVersion"], format!("example.com/{v}"), "{obj}");
        assert_eq!(obj["spec"]["a"], 1);
        let list = c.k(&["get", "--raw", &format!("/apis/example.com/{v}/things")]);
        let list: serde_json::Value = serde_json::from_str(&list).expect("json");
        assert_eq!(list["items"][0]["apiVersion"], format!("example.com/{v}"), "{list}");
    }
    // An update through v1 keeps one object, now served by both versions.
    c.k(&[
        "patch",
        "things.v1.example.com",
        "t",
        "--type=merge",
        "-p",
        r#"{"spec":{"a":2}}"#,
    ]);
    let raw = c.k(&["get", "--raw", "/apis/example.com/v2/things/t"]);
    let obj: serde_json::Value = serde_json::from_str(&raw).expect("json");
    assert_eq!(
        (obj["apiVersion"].as_str(), obj["spec"]["a"].as_i64()),
        (Some("example.com/v2"), Some(2))
    );
    let crd = c.get_json(&["crd", "things.example.com"]);
    assert_eq!(crd["status"]["storedVersions"], serde_json::json!(["v1"]));
}

#[test]
fn invalid_and_conflicting_definitions() {
    let c = Cluster::start(CONTROL_PLANE);
    let bad = CRD
        .replace("name: widgets.example.com", "name: wrong.example.com")
        .replace(
            "            type: object\n            required: [color]",
            "            required: [color]",
        );
    let err = c.stdin_kubectl_err(&["apply", "-f", "-"], &bad);
    for want in [
        "metadata.name: Invalid value: \"wrong.example.com\": must be spec.names.plural+\".\"+spec.group",
        "spec.validation.openAPIV3Schema.properties[spec].type: Required value: must not be empty for specified object fields",
    ] {
        assert!(err.contains(want), "{want}:\n{err}");
    }
    install(&c);
    // Another definition claiming the short name is not accepted and not served.
    let other = CRD
        .replace("widgets", "gizmos")
        .replace("singular: widget", "singular: gizmo")
        .replace("kind: Widget", "kind: Gizmo");
    c.apply(&other, &[]);
    let cond = eventually(Duration::from_secs(10), || {
        let crd = c.get_json(&["crd", "gizmos.example.com"]);
        crd["status"]["conditions"]
            .as_array()
            .and_then(|a| a.iter().find(|x| x["type"] == "NamesAccepted").cloned())
    })
    .expect("NamesAccepted");
    assert_eq!(cond["status"], "False");
    assert_eq!(cond["reason"], "ShortNamesConflict");
    assert_eq!(cond["message"], "\"wd\" is already in use");
    // A definition may not claim a built-in group's resource.
    let apps = CRD
        .replace("widgets.example.com", "deployments.apps")
        .replace("group: example.com", "group: apps")
        .replace("plural: widgets", "plural: deployments");
    let err = c.stdin_kubectl_err(&["apply", "-f", "-"], &apps);
    assert!(err.contains("spec.group"), "{err}");
}

#[test]
fn custom_objects_on_etcd_under_upstreams_keys() {
    let etcd = skiff_testkit::EtcdCluster::start(1);
    let endpoints = etcd.endpoints_arg();
    let mut c = Cluster::start(&[
        "--no-agent",
        "--no-scheduler",
        "--etcd-servers",
        &endpoints,
        "--etcd-prefix",
        "/skiff-crd",
    ]);
    install(&c);
    c.apply(&widget("w1", "spec:\n  color: red\n"), &[]);
    let keys = etcd.etcdctl(&["get", "--prefix", "--keys-only", "/skiff-crd/"]);
    let keys: Vec<&str> = keys.lines().filter(|l| !l.is_empty()).collect();
    for want in [
        "/skiff-crd/apiextensions.k8s.io/customresourcedefinitions/widgets.example.com",
        "/skiff-crd/example.com/widgets/default/w1",
    ] {
        assert!(keys.contains(&want), "{want}: {keys:?}");
    }
    // A restarted server reads the definition back from etcd and serves the kind.
    c.restart();
    assert_eq!(c.k(&["get", "wd", "w1", "-o", "jsonpath={.spec.replicas}"]), "1");
}

/// The Python client's CustomObjectsApi on the Widget kind: create (defaulted and pruned as the
/// schema says), get, list by label, a watch that sees a later create, merge patch, the status
/// subresource, the scale subresource, an invalid object refused with 422, delete and 404.
#[test]
fn python_client_custom_objects() {
    let c = Cluster::start(CONTROL_PLANE);
    install(&c);
    let script = r#"
import sys, threading
from kubernetes import client, config, watch
config.load_kube_config(config_file=sys.argv[1])
api = client.CustomObjectsApi()
G, V, P, NS = "example.com", "v1", "widgets", "default"
body = {"apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": "py", "labels": {"team": "a"}},
        "spec": {"color": "red", "unknown": 1}}
created = api.create_namespaced_custom_object(G, V, NS, P, body)
assert created["spec"]["replicas"] == 1, created["spec"]
assert "unknown" not in created["spec"], created["spec"]
got = api.get_namespaced_custom_object(G, V, NS, P, "py")
assert got["metadata"]["uid"] == created["metadata"]["uid"]
names = [o["metadata"]["name"] for o in api.list_namespaced_custom_object(G, V, NS, P, label_selector="team=a")["items"]]
assert names == ["py"], names
rv = api.list_namespaced_custom_object(G, V, NS, P)["metadata"]["resourceVersion"]
def later():
    api.create_namespaced_custom_object(G, V, NS, P, {"apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": "py2"}, "spec": {"color": "green"}})
threading.Timer(0.5, later).start()
seen = []
w = watch.Watch()
for ev in w.stream(api.list_namespaced_custom_object, G, V, NS, P, resource_version=rv, timeout_seconds=10):
    seen.append((ev["type"], ev["object"]["metadata"]["name"]))
    if ev["object"]["metadata"]["name"] == "py2":
        w.stop()
assert ("ADDED", "py2") in seen, seen
patched = api.patch_namespaced_custom_object(G, V, NS, P, "py", {"spec": {"color": "green"}})
assert patched["spec"]["color"] == "green", patched["spec"]
st = api.patch_namespaced_custom_object_status(G, V, NS, P, "py", {"status": {"replicas": 4}})
assert st["status"]["replicas"] == 4, st
assert api.get_namespaced_custom_object(G, V, NS, P, "py")["spec"]["color"] == "green"
scale = api.patch_namespaced_custom_object_scale(G, V, NS, P, "py", {"spec": {"replicas": 3}})
assert scale["spec"]["replicas"] == 3, scale
assert api.get_namespaced_custom_object(G, V, NS, P, "py")["spec"]["replicas"] == 3
try:
    api.create_namespaced_custom_object(G, V, NS, P, {"apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": "bad"}, "spec": {"color": "blue"}})
    raise SystemExit("an invalid widget was created")
except client.exceptions.ApiException as e:
    assert e.status == 422, e.status
    import json
    msg = json.loads(e.body)["message"]
    assert 'spec.color: Unsupported value: "blue": supported values: "red", "green"' in msg, msg
api.delete_namespaced_custom_object(G, V, NS, P, "py")
try:
    api.get_namespaced_custom_object(G, V, NS, P, "py")
    raise SystemExit("still there")
except client.exceptions.ApiException as e:
    assert e.status == 404, e.status
print("ok")
"#;
    c.python(script);
}
