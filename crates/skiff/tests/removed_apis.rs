//! The seed documents' manifests as they are written: `extensions/v1beta1` Deployments without a
//! selector and `batch/v1beta1` CronJobs, served with `skiff server --serve-removed-apis` and
//! refused, as upstream refuses them, without it. Driven by the real kubectl.

#![cfg(test)]

mod common;

use std::time::Duration;

use common::{Cluster, eventually};
use serde_json::Value;

/// Seed 003's Deployment, its placeholders filled in and its two misspelt fields
/// (`revisonHistoryLimit`, `sepc`) spelt as the API spells them; still without a selector,
/// which `extensions/v1beta1` takes from the pod template.
const SEED_DEPLOYMENT: &str = r#"apiVersion: extensions/v1beta1
kind: Deployment
metadata:
  name: nginx-deployment
spec:
  replicas: 3
  revisionHistoryLimit: 0
  strategy:
    rollingUpdate:
      maxSurge: 1
      maxUnavailable: 1
  template:
    metadata:
      labels:
        app: nginx
    spec:
      containers:
        - name: nginx
          image: busybox:latest
          ports:
            - name: http
              containerPort: 8080
"#;

const DEPLOYMENT_WARNING: &str =
    "Warning: extensions/v1beta1 Deployment is deprecated in v1.8+, unavailable in v1.16+; use apps/v1 Deployment";

/// Runs kubectl with `input` on stdin; returns (stdout, stderr, success).
fn kubectl_stdin(c: &Cluster, args: &[&str], input: &str) -> (String, String, bool) {
    let out = c.kubectl_with_stdin(args, input);
    (
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
        out.status.success(),
    )
}

fn apply(c: &Cluster, yaml: &str) -> (String, String) {
    let (stdout, stderr, ok) = kubectl_stdin(c, &["apply", "-f", "-"], yaml);
    assert!(
        ok,
        "apply failed:\nstdout: {stdout}\nstderr: {stderr}\n{}",
        common::tail(&c.log(), 30)
    );
    (stdout, stderr)
}

fn ready_replicas(c: &Cluster, name: &str) -> i64 {
    c.get_json(&["deployment.apps", name])["status"]["readyReplicas"]
        .as_i64()
        .unwrap_or(0)
}

#[test]
fn without_the_flag_the_removed_versions_are_refused_as_upstream_refuses_them() {
    let c = Cluster::start(&["--no-agent"]);
    let (_, stderr, ok) = kubectl_stdin(&c, &["apply", "-f", "-"], SEED_DEPLOYMENT);
    assert!(!ok);
    assert!(
        stderr.contains(r#"no matches for kind "Deployment" in version "extensions/v1beta1""#),
        "{stderr}"
    );
    let versions = c.k(&["api-versions"]);
    for gv in ["extensions/v1beta1", "apps/v1beta1", "apps/v1beta2", "batch/v1beta1"] {
        assert!(!versions.lines().any(|l| l == gv), "{gv} served: {versions}");
    }
    let out = c.kubectl(&[
        "get",
        "--raw",
        "/apis/extensions/v1beta1/namespaces/default/deployments",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("NotFound"), "{out:?}");
}

#[test]
fn the_seeds_extensions_deployment_and_batch_v1beta1_cronjob_work_as_written() {
    let c = Cluster::start(&["--no-agent", "--sim-nodes", "2", "--serve-removed-apis"]);
    let versions = c.k(&["api-versions"]);
    for gv in ["extensions/v1beta1", "apps/v1beta1", "apps/v1beta2", "batch/v1beta1"] {
        assert!(versions.lines().any(|l| l == gv), "{gv} not served: {versions}");
    }
    // The current versions stay preferred: the removed ones never answer a plain `get`.
    let apps: Value = serde_json::from_str(&c.k(&["get", "--raw", "/apis/apps"])).expect("json");
    assert_eq!(apps["preferredVersion"]["version"], "v1");

    // The Deployment without a selector: created with upstream's warning, its selector and
    // labels taken from the template, extensions/v1beta1's defaults applied.
    let (stdout, stderr) = apply(&c, SEED_DEPLOYMENT);
    assert!(
        stdout.contains("deployment.extensions/nginx-deployment created"),
        "{stdout}"
    );
    assert!(stderr.contains(DEPLOYMENT_WARNING), "{stderr}");
    let stored = c.get_json(&["deployment.apps", "nginx-deployment"]);
    assert_eq!(stored["apiVersion"], "apps/v1");
    assert_eq!(stored["spec"]["selector"]["matchLabels"]["app"], "nginx");
    assert_eq!(stored["metadata"]["labels"]["app"], "nginx");
    assert_eq!(stored["spec"]["revisionHistoryLimit"], 0);
    assert_eq!(stored["spec"]["progressDeadlineSeconds"], 2_147_483_647);
    assert_eq!(stored["spec"]["strategy"]["rollingUpdate"]["maxSurge"], 1);
    let ready = eventually(Duration::from_secs(60), || {
        (ready_replicas(&c, "nginx-deployment") == 3).then_some(())
    });
    assert!(
        ready.is_some(),
        "not rolled out: {}",
        c.k(&["get", "deploy,rs,pods", "-o", "wide"])
    );

    // Read back in the old version: one object, a list and a watch, each with the warning.
    let old = c.kubectl(&[
        "get",
        "deployments.v1beta1.extensions",
        "nginx-deployment",
        "-o",
        "json",
    ]);
    assert!(old.status.success(), "{old:?}");
    assert!(String::from_utf8_lossy(&old.stderr).contains(DEPLOYMENT_WARNING));
    let old: Value = serde_json::from_slice(&old.stdout).expect("json");
    assert_eq!(old["apiVersion"], "extensions/v1beta1");
    assert_eq!(old["status"]["readyReplicas"], 3);
    let watched = c.k(&[
        "get",
        "--raw",
        "/apis/extensions/v1beta1/namespaces/default/deployments?watch=1&timeoutSeconds=1",
    ]);
    let event: Value = serde_json::from_str(watched.lines().next().expect("an event")).expect("json");
    assert_eq!(event["object"]["apiVersion"], "extensions/v1beta1", "{watched}");
    // The current version answers without the warning.
    let current = c.kubectl(&["get", "deployments", "nginx-deployment"]);
    assert!(current.status.success());
    assert!(!String::from_utf8_lossy(&current.stderr).contains("Warning"));

    // Applied again with one change: kubectl's patch goes through the old version too.
    let scaled = SEED_DEPLOYMENT.replace("replicas: 3", "replicas: 4");
    let (stdout, _) = apply(&c, &scaled);
    assert!(
        stdout.contains("deployment.extensions/nginx-deployment configured"),
        "{stdout}"
    );
    let ready = eventually(Duration::from_secs(60), || {
        (ready_replicas(&c, "nginx-deployment") == 4).then_some(())
    });
    assert!(ready.is_some(), "not scaled: {}", c.k(&["get", "deploy,rs,pods"]));

    // The other removed versions keep their own defaults; apps/v1beta2 already required a
    // selector, as apps/v1 does.
    apply(
        &c,
        r#"apiVersion: apps/v1beta1
kind: StatefulSet
metadata:
  name: old-web
spec:
  serviceName: old-web
  replicas: 1
  template:
    metadata:
      labels:
        app: old-web
    spec:
      containers:
      - name: c
        image: busybox:latest
"#,
    );
    let sts = c.get_json(&["statefulset.apps", "old-web"]);
    assert_eq!(sts["spec"]["updateStrategy"]["type"], "OnDelete");
    assert_eq!(sts["spec"]["selector"]["matchLabels"]["app"], "old-web");
    let (_, stderr, ok) = kubectl_stdin(
        &c,
        &["apply", "-f", "-"],
        r#"apiVersion: apps/v1beta2
kind: Deployment
metadata:
  name: no-selector
spec:
  template:
    metadata:
      labels:
        app: x
    spec:
      containers:
      - name: c
        image: busybox:latest
"#,
    );
    assert!(!ok);
    assert!(stderr.contains("spec.selector: Required value"), "{stderr}");

    // The seed's CronJob, as written: created with its warning, and it starts Jobs.
    let (stdout, stderr) = apply(&c, common::seeds::CRONJOB_V1BETA1);
    assert!(stdout.contains("cronjob.batch/hello created"), "{stdout}");
    assert!(
        stderr.contains(
            "Warning: batch/v1beta1 CronJob is deprecated in v1.21+, unavailable in v1.25+; use batch/v1 CronJob"
        ),
        "{stderr}"
    );
    let job = eventually(Duration::from_secs(90), || {
        let jobs = c.get_json(&["jobs"]);
        jobs["items"].as_array().and_then(|items| {
            items
                .iter()
                .find(|j| j["metadata"]["ownerReferences"][0]["name"] == "hello")
                .cloned()
        })
    });
    assert!(
        job.is_some(),
        "no job from the CronJob: {}",
        c.k(&["get", "cronjobs,jobs"])
    );
    let old = c.get_json(&["cronjobs.v1beta1.batch", "hello"]);
    assert_eq!(old["apiVersion"], "batch/v1beta1");
    assert_eq!(old["spec"]["schedule"], "*/1 * * * *");
}

/// The removed versions are authorized as upstream authorizes them, under their own group: a
/// user with no role reads and writes nothing through them, a `view` user reads but does not
/// write, and a doubled slash finds no way around either.
#[test]
fn the_removed_versions_are_authorized_as_their_own_group() {
    let c = Cluster::start(&["--no-agent", "--serve-removed-apis"]);
    apply(&c, SEED_DEPLOYMENT);
    let nobody = common::issued_kubeconfig(&c, &["user", "nobody"], "nobody.kubeconfig");
    let viewer = common::issued_kubeconfig(&c, &["user", "viewer"], "viewer.kubeconfig");
    c.k(&[
        "create",
        "rolebinding",
        "viewer-view",
        "--clusterrole=view",
        "--user=viewer",
    ]);
    let as_user = |kubeconfig: &std::path::Path, args: &[&str]| {
        std::process::Command::new(common::kubectl_bin())
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args)
            .env_remove("KUBECONFIG")
            .output()
            .expect("kubectl")
    };
    for path in [
        "/apis/extensions/v1beta1/namespaces/default/deployments",
        "/apis/extensions/v1beta1/namespaces/default/deployments/nginx-deployment",
        "/apis/extensions/v1beta1//namespaces/default/deployments",
        "/apis/batch/v1beta1/cronjobs",
    ] {
        let out = as_user(&nobody, &["get", "--raw", path]);
        assert!(!out.status.success(), "{path} answered a user with no role");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("Forbidden") || err.contains("NotFound"), "{path}: {err}");
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("nginx-deployment"),
            "{path}"
        );
    }
    let err = String::from_utf8_lossy(
        &as_user(&nobody, &["get", "deployments.v1beta1.extensions", "nginx-deployment"]).stderr,
    )
    .to_string();
    assert!(
        err.contains(r#"User "nobody" cannot get resource "deployments" in API group "extensions""#),
        "{err}"
    );
    let read = as_user(
        &viewer,
        &[
            "get",
            "deployments.v1beta1.extensions",
            "nginx-deployment",
            "-o",
            "name",
        ],
    );
    assert!(read.status.success(), "{}", String::from_utf8_lossy(&read.stderr));
    let write = as_user(
        &viewer,
        &[
            "scale",
            "deployments.v1beta1.extensions",
            "nginx-deployment",
            "--replicas=9",
        ],
    );
    assert!(!write.status.success());
    let patch = as_user(
        &viewer,
        &[
            "patch",
            "deployments.v1beta1.extensions",
            "nginx-deployment",
            "-p",
            r#"{"spec":{"replicas":9}}"#,
        ],
    );
    let err = String::from_utf8_lossy(&patch.stderr);
    assert!(
        err.contains(r#"User "viewer" cannot patch resource "deployments" in API group "extensions""#),
        "{err}"
    );
    assert_eq!(
        c.get_json(&["deployment.apps", "nginx-deployment"])["spec"]["replicas"],
        3
    );
}
