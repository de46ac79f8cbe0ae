//! Ingress, IngressClass and NetworkPolicy (`networking.k8s.io/v1`) driven by the real kubectl:
//! kubectl's generators, upstream's columns, validation and the DefaultIngressClass admission.

#![cfg(test)]

mod common;

use common::{Cluster, table};

const CONTROL_PLANE: &[&str] = &["--no-agent", "--no-scheduler"];

#[test]
fn ingresses_classes_and_network_policies() {
    let c = Cluster::start(CONTROL_PLANE);

    let res = c.k(&["api-resources", "--api-group=networking.k8s.io"]);
    let rows = table(&res);
    let row = |name: &str| rows.iter().find(|r| r[0] == name).cloned().unwrap_or_default();
    assert_eq!(
        row("ingresses"),
        ["ingresses", "ing", "networking.k8s.io/v1", "true", "Ingress"],
        "{res}"
    );
    assert_eq!(
        row("ingressclasses"),
        ["ingressclasses", "networking.k8s.io/v1", "false", "IngressClass"],
        "{res}"
    );
    assert_eq!(
        row("networkpolicies"),
        [
            "networkpolicies",
            "netpol",
            "networking.k8s.io/v1",
            "true",
            "NetworkPolicy"
        ],
        "{res}"
    );
    let explained = c.k(&["explain", "ingress.spec.rules"]);
    assert!(
        explained.contains("KIND:") && explained.contains("Ingress"),
        "{explained}"
    );
    assert!(
        explained.contains("host\t<string>") || explained.contains("host"),
        "{explained}"
    );

    // Without a default class the Ingress keeps none.
    c.k(&[
        "create",
        "ingress",
        "simple",
        "--rule=foo.com/bar=svc1:8080,tls=my-cert",
    ]);
    let got = c.k(&["get", "ingress", "simple"]);
    let rows = table(&got);
    assert_eq!(rows[0], ["NAME", "CLASS", "HOSTS", "ADDRESS", "PORTS", "AGE"], "{got}");
    assert_eq!(rows[1][..5], ["simple", "<none>", "foo.com", "80,", "443"], "{got}");
    let simple = c.get_json(&["ingress", "simple"]);
    assert_eq!(simple["spec"]["rules"][0]["http"]["paths"][0]["pathType"], "Exact");
    assert_eq!(simple["spec"]["tls"][0]["secretName"], "my-cert");
    assert_eq!(simple["metadata"]["generation"], 1);

    // The default class is given to Ingresses created without one.
    c.apply(
        r#"
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata:
  name: nginx
  annotations:
    ingressclass.kubernetes.io/is-default-class: "true"
spec:
  controller: k8s.io/ingress-nginx
  parameters:
    apiGroup: k8s.example.com
    kind: IngressParameters
    name: external-lb
"#,
        &[],
    );
    let classes = c.k(&["get", "ingressclass"]);
    let rows = table(&classes);
    assert_eq!(rows[0], ["NAME", "CONTROLLER", "PARAMETERS", "AGE"], "{classes}");
    assert_eq!(
        rows[1][..3],
        [
            "nginx",
            "k8s.io/ingress-nginx",
            "IngressParameters.k8s.example.com/external-lb"
        ],
        "{classes}"
    );
    let class = c.get_json(&["ingressclass", "nginx"]);
    assert_eq!(class["spec"]["parameters"]["scope"], "Cluster", "defaulted");

    c.k(&["create", "ingress", "defaulted", "--rule=bar.com/=svc2:http"]);
    let got = c.k(&["get", "ing", "defaulted", "--no-headers"]);
    let rows = table(&got);
    assert_eq!(rows[0][..4], ["defaulted", "nginx", "bar.com", "80"], "{got}");
    // The annotation names a class too: no default is added.
    let out = c.kubectl(&[
        "create",
        "ingress",
        "annotated",
        "--rule=baz.com/=svc3:80",
        "--annotation=kubernetes.io/ingress.class=other",
    ]);
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "Warning: annotation \"kubernetes.io/ingress.class\" is deprecated, please use 'spec.ingressClassName' instead"
        ),
        "{stderr}"
    );
    let annotated = c.get_json(&["ingress", "annotated"]);
    assert!(annotated["spec"].get("ingressClassName").is_none(), "{annotated}");

    // Two defaults refuse the Ingress, as upstream does.
    c.apply(
        r#"
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata:
  name: second
  annotations:
    ingressclass.kubernetes.io/is-default-class: "true"
spec:
  controller: example.com/lb
"#,
        &[],
    );
    let err = c.k_err(&["create", "ingress", "twice", "--rule=a.com/=s:80"]);
    assert!(
        err.contains("ingresses.networking.k8s.io \"twice\" is forbidden: Internal error occurred: 2 default IngressClasses were found, only 1 allowed"),
        "{err}"
    );

    // An invalid Ingress is refused with upstream's message.
    let bad = r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: bad
spec:
  ingressClassName: nginx
  rules:
  - host: 10.0.0.1
    http:
      paths:
      - path: relative
        pathType: Prefix
        backend:
          service: {name: web, port: {number: 80}}
"#;
    let err = c.stdin_kubectl_err(&["apply", "-f", "-"], bad);
    assert!(
        err.contains("The Ingress \"bad\" is invalid: ")
            && err.contains("spec.rules[0].host: Invalid value: \"10.0.0.1\": must be a DNS name, not an IP address")
            && err.contains("spec.rules[0].http.paths[0].path: Invalid value: \"relative\": must be an absolute path"),
        "{err}"
    );
    let err = c.stdin_kubectl_err(
        &["apply", "-f", "-"],
        "apiVersion: networking.k8s.io/v1\nkind: IngressClass\nmetadata: {name: nocontroller}\nspec:\n  controller: nginx\n",
    );
    assert!(
        err.contains(
            "spec.controller: Invalid value: \"nginx\": must be a domain-prefixed path (such as \"acme.io/foo\")"
        ),
        "{err}"
    );

    // NetworkPolicy: defaulted, listed, described.
    c.apply(
        r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: db
spec:
  podSelector:
    matchLabels: {role: db}
  ingress:
  - from:
    - ipBlock:
        cidr: 172.17.0.0/16
        except: [172.17.1.0/24]
    - podSelector:
        matchLabels: {role: frontend}
    ports:
    - port: 6379
  egress:
  - to:
    - ipBlock: {cidr: 10.0.0.0/24}
    ports:
    - protocol: UDP
      port: 53
"#,
        &[],
    );
    let np = c.get_json(&["networkpolicy", "db"]);
    assert_eq!(np["spec"]["policyTypes"], serde_json::json!(["Ingress", "Egress"]));
    assert_eq!(np["spec"]["ingress"][0]["ports"][0]["protocol"], "TCP");
    let got = c.k(&["get", "netpol"]);
    let rows = table(&got);
    assert_eq!(rows[0], ["NAME", "POD-SELECTOR", "AGE"], "{got}");
    assert_eq!(rows[1][..2], ["db", "role=db"], "{got}");
    let described = c.k(&["describe", "networkpolicy", "db"]);
    for part in [
        "Name:         db",
        "PodSelector:     role=db",
        "IPBlock:",
        "CIDR: 172.17.0.0/16",
        "Except: 172.17.1.0/24",
        "Policy Types: Ingress, Egress",
    ] {
        assert!(described.contains(part), "describe lacks {part:?}:\n{described}");
    }
    let bad = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: bad
spec:
  podSelector: {}
  ingress:
  - from:
    - ipBlock: {cidr: 10.0.0.0/16, except: [10.1.0.0/24]}
"#;
    let err = c.stdin_kubectl_err(&["apply", "-f", "-"], bad);
    assert!(
        err.contains("spec.ingress[0].from[0].ipBlock.except[0]: Invalid value: \"10.1.0.0/24\": must be a strict subset of `cidr`"),
        "{err}"
    );
}

#[test]
fn runtime_classes_and_csi_drivers() {
    let c = Cluster::start(CONTROL_PLANE);

    let res = c.k(&["api-resources"]);
    let rows = table(&res);
    let row = |name: &str| rows.iter().find(|r| r[0] == name).cloned().unwrap_or_default();
    assert_eq!(
        row("runtimeclasses"),
        ["runtimeclasses", "node.k8s.io/v1", "false", "RuntimeClass"],
        "{res}"
    );
    assert_eq!(
        row("csidrivers"),
        ["csidrivers", "storage.k8s.io/v1", "false", "CSIDriver"],
        "{res}"
    );
    assert_eq!(
        row("volumeattachments"),
        ["volumeattachments", "storage.k8s.io/v1", "false", "VolumeAttachment"],
        "{res}"
    );
    assert_eq!(
        row("csistoragecapacities"),
        [
            "csistoragecapacities",
            "storage.k8s.io/v1",
            "true",
            "CSIStorageCapacity"
        ],
        "{res}"
    );

    // A pod naming a missing RuntimeClass is refused.
    let pod = |name: &str, class: &str, extra: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  runtimeClassName: {class}\n{extra}  containers:\n  - {{name: c, image: busybox:latest}}\n"
        )
    };
    let err = c.stdin_kubectl_err(&["create", "-f", "-"], &pod("nope", "missing", ""));
    assert!(
        err.contains("Error from server (Forbidden): error when creating \"STDIN\": pods \"nope\" is forbidden: pod rejected: RuntimeClass \"missing\" not found"),
        "{err}"
    );

    c.apply(
        r#"
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata:
  name: sandboxed
handler: runsc
overhead:
  podFixed: {cpu: 250m, memory: 120Mi}
scheduling:
  nodeSelector: {runtime: gvisor}
  tolerations:
  - {key: runtime, operator: Equal, value: gvisor, effect: NoSchedule}
"#,
        &[],
    );
    let got = c.k(&["get", "runtimeclass"]);
    let rows = table(&got);
    assert_eq!(rows[0], ["NAME", "HANDLER", "AGE"], "{got}");
    assert_eq!(rows[1][..2], ["sandboxed", "runsc"], "{got}");

    c.stdin_kubectl(
        &["create", "-f", "-"],
        &pod("sandboxed", "sandboxed", "  nodeSelector: {disk: ssd}\n"),
    );
    let p = c.get_json(&["pod", "sandboxed"]);
    assert_eq!(
        p["spec"]["overhead"],
        serde_json::json!({"cpu": "250m", "memory": "120Mi"})
    );
    assert_eq!(
        p["spec"]["nodeSelector"],
        serde_json::json!({"disk": "ssd", "runtime": "gvisor"})
    );
    let tolerations = p["spec"]["tolerations"].to_string();
    assert!(tolerations.contains("\"value\":\"gvisor\""), "{tolerations}");

    let err = c.stdin_kubectl_err(
        &["create", "-f", "-"],
        &pod("conflict", "sandboxed", "  nodeSelector: {runtime: runc}\n"),
    );
    assert!(
        err.contains("pods \"conflict\" is forbidden: conflict: runtimeClass.scheduling.nodeSelector[runtime] = gvisor; pod.spec.nodeSelector[runtime] = runc"),
        "{err}"
    );
    let err = c.stdin_kubectl_err(
        &["create", "-f", "-"],
        &pod("overhead", "sandboxed", "  overhead: {cpu: '1'}\n"),
    );
    assert!(
        err.contains(
            "pods \"overhead\" is forbidden: pod rejected: Pod's Overhead doesn't match RuntimeClass's defined Overhead"
        ),
        "{err}"
    );
    let err = c.stdin_kubectl_err(
        &["apply", "-f", "-"],
        "apiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata: {name: bad}\nhandler: Run_C\n",
    );
    assert!(
        err.contains("The RuntimeClass \"bad\" is invalid: handler: Invalid value: \"Run_C\""),
        "{err}"
    );

    // CSIDriver: defaults read back, upstream's columns.
    c.apply(
        "apiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata: {name: hostpath.csi.k8s.io}\nspec:\n  podInfoOnMount: true\n",
        &[],
    );
    let d = c.get_json(&["csidriver", "hostpath.csi.k8s.io"]);
    assert_eq!(
        d["spec"],
        serde_json::json!({
            "attachRequired": true,
            "podInfoOnMount": true,
            "requiresRepublish": false,
            "storageCapacity": false,
            "seLinuxMount": false,
            "fsGroupPolicy": "ReadWriteOnceWithFSType",
            "volumeLifecycleModes": ["Persistent"]
        })
    );
    let got = c.k(&["get", "csidrivers"]);
    let rows = table(&got);
    assert_eq!(
        rows[0],
        [
            "NAME",
            "ATTACHREQUIRED",
            "PODINFOONMOUNT",
            "STORAGECAPACITY",
            "TOKENREQUESTS",
            "REQUIRESREPUBLISH",
            "MODES",
            "AGE"
        ],
        "{got}"
    );
    assert_eq!(
        rows[1][..7],
        [
            "hostpath.csi.k8s.io",
            "true",
            "true",
            "false",
            "<unset>",
            "false",
            "Persistent"
        ],
        "{got}"
    );
    let err = c.k_err(&[
        "patch",
        "csidriver",
        "hostpath.csi.k8s.io",
        "--type=merge",
        "-p",
        r#"{"spec":{"attachRequired":false}}"#,
    ]);
    assert!(
        err.contains("spec.attachedRequired: Invalid value: false: field is immutable"),
        "{err}"
    );

    // VolumeAttachment and CSIStorageCapacity.
    c.apply(
        r#"
apiVersion: storage.k8s.io/v1
kind: VolumeAttachment
metadata: {name: csi-123}
spec:
  attacher: hostpath.csi.k8s.io
  nodeName: node-1
  source: {persistentVolumeName: pv-1}
---
apiVersion: storage.k8s.io/v1
kind: CSIStorageCapacity
metadata: {name: cap-1}
storageClassName: standard
capacity: 1024Mi
"#,
        &[],
    );
    let got = c.k(&["get", "volumeattachments"]);
    let rows = table(&got);
    assert_eq!(rows[0], ["NAME", "ATTACHER", "PV", "NODE", "ATTACHED", "AGE"], "{got}");
    assert_eq!(
        rows[1][..5],
        ["csi-123", "hostpath.csi.k8s.io", "pv-1", "node-1", "false"],
        "{got}"
    );
    let got = c.k(&["get", "csistoragecapacities"]);
    let rows = table(&got);
    assert_eq!(rows[0], ["NAME", "STORAGECLASSNAME", "CAPACITY"], "{got}");
    assert_eq!(rows[1], ["cap-1", "standard", "1Gi"], "{got}");
    let err = c.stdin_kubectl_err(
        &["apply", "-f", "-"],
        "apiVersion: storage.k8s.io/v1\nkind: VolumeAttachment\nmetadata: {name: bad}\nspec:\n  attacher: a.io\n  nodeName: node-2\n  source: {}\n",
    );
    assert!(
        err.contains(
            "spec.source: Required value: must specify exactly one of inlineVolumeSpec and persistentVolumeName"
        ),
        "{err}"
    );
}

/// On a real node: a RuntimeClass whose handler Docker knows runs the pod on that runtime; one
/// whose handler it does not know fails the sandbox with upstream's event.
#[test]
fn the_node_runs_pods_on_their_runtime_class_handler() {
    let n = common::node::Node::start("runtimeclass", &[]);
    n.c.apply(
        r#"
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata: {name: runc}
handler: runc
---
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata: {name: kata}
handler: kata
"#,
        &[],
    );
    let pod = |name: &str, class: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  runtimeClassName: {class}\n  terminationGracePeriodSeconds: 0\n  containers:\n  - name: c\n    image: busybox:latest\n    imagePullPolicy: IfNotPresent\n    command: [sleep, '3600']\n"
        )
    };
    n.c.apply(&pod("on-runc", "runc"), &[]);
    n.wait_running("on-runc");
    n.c.apply(&pod("on-kata", "kata"), &[]);
    n.c.wait_event_containing(
        "Pod",
        "on-kata",
        "FailedCreatePodSandBox",
        "Failed to create pod sandbox: rpc error: code = Unknown desc = failed to get sandbox runtime: no runtime for \"kata\" is configured",
    );
    assert_eq!(n.field("on-kata", ".status.phase"), "Pending");
}
