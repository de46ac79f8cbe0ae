//! Pods reach the API from inside the cluster as upstream's do: the ServiceAccount admission
//! plugin mounts a `kube-api-access-*` volume (a bound token, the cluster CA, the namespace)
//! at `/var/run/secrets/kubernetes.io/serviceaccount`, and a client library's in-cluster
//! configuration (client-go's, in a kubectl image built here) lists pods through the
//! `kubernetes` Service. Real Docker.

#![cfg(test)]

mod common;

use std::process::Command;
use std::time::Duration;

use common::node::Node;
use common::{eventually, kubectl_bin, tail};

/// A local image with kubectl (a static Go binary: client-go and its in-cluster configuration)
/// on busybox, made with the engine alone (no registry, no builder).
fn kubectl_image() -> String {
    let tag = format!("skiff-e2e/kubectl:{}", std::process::id());
    let container = format!("skiff-e2e-kubectl-{}", std::process::id());
    let run = |args: &[&str]| {
        let out = Command::new("docker").args(args).output().expect("docker");
        assert!(
            out.status.success(),
            "docker {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    // The kubectl the tests drive (found on PATH when named without a directory; a symlink
    // followed to the binary itself).
    let kubectl = std::path::PathBuf::from(kubectl_bin());
    let kubectl = std::fs::canonicalize(if kubectl.components().count() > 1 {
        kubectl
    } else {
        std::env::var_os("PATH")
            .into_iter()
            .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
            .map(|d| d.join(&kubectl))
            .find(|p| p.is_file())
            .expect("kubectl on PATH")
    })
    .expect("kubectl's real path");
    run(&["create", "--name", &container, "busybox:latest", "true"]);
    run(&["cp", &kubectl.to_string_lossy(), &format!("{container}:/bin/kubectl")]);
    run(&["commit", &container, &tag]);
    run(&["rm", "-f", &container]);
    tag
}

struct Image(String);

impl Drop for Image {
    fn drop(&mut self) {
        let _ = Command::new("docker").args(["rmi", "-f", &self.0]).output();
    }
}

const RBAC: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: pod-reader
rules:
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: default-reads-pods
subjects:
- kind: ServiceAccount
  name: default
  namespace: default
roleRef:
  kind: Role
  name: pod-reader
  apiGroup: rbac.authorization.k8s.io
"#;

const JOB: &str = r#"
apiVersion: batch/v1
kind: Job
metadata:
  name: in-cluster
spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: c
        image: IMAGE
        imagePullPolicy: Never
        command: ["sh", "-c", "cat /var/run/secrets/kubernetes.io/serviceaccount/namespace; echo; kubectl get pods -o name"]
"#;

#[test]
fn a_job_using_in_cluster_configuration_lists_pods_through_the_api() {
    let image = Image(kubectl_image());
    let n = Node::start("incluster", &[]);
    let c = &n.c;
    if let Some(range) = &c.service_range {
        n.assert_range_stays_local(range);
    }
    c.apply(RBAC, &[]);
    c.apply(&JOB.replace("IMAGE", &image.0), &[]);
    let done = eventually(Duration::from_secs(90), || {
        let job = c.get_json(&["job", "in-cluster"]);
        let conditions = job["status"]["conditions"].as_array().cloned().unwrap_or_default();
        conditions
            .iter()
            .find(|cond| cond["status"] == "True" && (cond["type"] == "Complete" || cond["type"] == "Failed"))
            .map(|cond| cond["type"].as_str().unwrap_or_default().to_string())
    });
    let logs = c.kubectl(&["logs", "job/in-cluster"]);
    let logs = String::from_utf8_lossy(&logs.stdout).to_string();
    assert_eq!(
        done.as_deref(),
        Some("Complete"),
        "logs:\n{logs}\n{}\n{}",
        c.k(&["describe", "pods", "-l", "job-name=in-cluster"]),
        tail(&c.log(), 30)
    );
    let mut lines = logs.lines();
    assert_eq!(lines.next(), Some("default"), "{logs}");
    assert!(
        lines.any(|l| l.starts_with("pod/in-cluster-")),
        "the pod did not list itself: {logs}"
    );

    // What the plugin added, as upstream adds it.
    let pod = c.get_json(&["pods", "-l", "job-name=in-cluster"]);
    let pod = &pod["items"][0];
    assert_eq!(pod["spec"]["serviceAccountName"], "default");
    let volume = &pod["spec"]["volumes"][0];
    let name = volume["name"].as_str().unwrap_or_default();
    assert!(
        name.starts_with("kube-api-access-") && name.len() == "kube-api-access-".len() + 5,
        "{volume}"
    );
    assert_eq!(volume["projected"]["defaultMode"], 420);
    assert_eq!(
        pod["spec"]["containers"][0]["volumeMounts"][0],
        serde_json::json!({"name": name, "readOnly": true, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"})
    );
}

#[test]
fn a_pod_may_opt_out_and_an_unknown_account_is_refused() {
    let c = common::Cluster::start(&["--no-agent"]);
    c.apply(
        r#"
apiVersion: v1
kind: Pod
metadata:
  name: quiet
spec:
  automountServiceAccountToken: false
  containers:
  - name: c
    image: busybox:latest
"#,
        &[],
    );
    let pod = c.get_json(&["pod", "quiet"]);
    assert!(pod["spec"].get("volumes").is_none(), "{pod}");
    assert!(pod["spec"]["containers"][0].get("volumeMounts").is_none(), "{pod}");

    let err = c.stdin_kubectl_err(
        &["apply", "-f", "-"],
        r#"
apiVersion: v1
kind: Pod
metadata:
  name: ghost
spec:
  serviceAccountName: nobody
  containers:
  - name: c
    image: busybox:latest
"#,
    );
    assert!(
        err.contains(
            r#"pods "ghost" is forbidden: error looking up service account default/nobody: serviceaccount "nobody" not found"#
        ),
        "{err}"
    );

    // An account that opts out keeps its pods' volumes away, unless a pod opts back in.
    c.stdin_kubectl(
        &["apply", "-f", "-"],
        "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: robot\nautomountServiceAccountToken: false\nimagePullSecrets:\n- name: registry\n",
    );
    c.apply(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: robot\nspec:\n  serviceAccountName: robot\n  containers:\n  - name: c\n    image: busybox:latest\n",
        &[],
    );
    let pod = c.get_json(&["pod", "robot"]);
    assert!(pod["spec"].get("volumes").is_none(), "{pod}");
    assert_eq!(
        pod["spec"]["imagePullSecrets"],
        serde_json::json!([{"name": "registry"}])
    );
}
