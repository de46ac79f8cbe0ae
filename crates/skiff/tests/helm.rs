//! helm 3 and helm 4, the real binaries, against a Skiff cluster of simulated nodes: a chart made
//! by `helm create` is installed, upgraded, rolled back and uninstalled with `--wait` (helm reads
//! the Deployment's rollout status), and a chart that ships a CustomResourceDefinition in `crds/`
//! and an instance of it in `templates/` is installed by helm 3, refused an invalid upgrade with
//! the schema's message, rolled back, then installed again by helm 4, which applies the definition
//! that already exists with server-side apply.

#![cfg(test)]

mod common;

use std::path::Path;

use common::{Cluster, client_tool};

const CONTROL_PLANE: &[&str] = &["--no-agent", "--sim-nodes", "2"];

fn deployment_replicas(c: &Cluster, name: &str) -> (i64, i64) {
    let d = c.get_json(&["deployment", name]);
    (
        d["spec"]["replicas"].as_i64().unwrap_or(-1),
        d["status"]["readyReplicas"].as_i64().unwrap_or(0),
    )
}

/// `helm create`'s chart through a release's whole life with one helm.
fn release_life(c: &Cluster, helm: &Path, release: &str) {
    let chart = c.dir.path().join(format!("chart-{release}"));
    let chart = chart.to_str().expect("utf-8 path");
    c.client_ok(helm, &["create", chart]);
    let deployment = format!("{release}-chart-{release}");

    c.client_ok(helm, &["install", release, chart, "--wait", "--timeout", "120s"]);
    assert_eq!(deployment_replicas(c, &deployment), (1, 1));

    c.client_ok(
        helm,
        &[
            "upgrade",
            release,
            chart,
            "--set",
            "replicaCount=3",
            "--wait",
            "--timeout",
            "120s",
        ],
    );
    assert_eq!(deployment_replicas(c, &deployment), (3, 3));

    c.client_ok(helm, &["rollback", release, "1", "--wait", "--timeout", "120s"]);
    assert_eq!(deployment_replicas(c, &deployment), (1, 1));

    let history = c.client_ok(helm, &["history", release, "-o", "json"]);
    let history: serde_json::Value = serde_json::from_str(&history).expect("history json");
    let statuses: Vec<&str> = history
        .as_array()
        .expect("history list")
        .iter()
        .filter_map(|r| r["status"].as_str())
        .collect();
    assert_eq!(statuses, ["superseded", "superseded", "deployed"], "{history}");

    c.client_ok(helm, &["uninstall", release, "--wait", "--timeout", "120s"]);
    c.wait_gone(&["deployment", &deployment], std::time::Duration::from_secs(30));
    c.wait_gone(&["service", &deployment], std::time::Duration::from_secs(30));
    let (_, stderr, ok) = c.client(helm, &["status", release]);
    assert!(!ok && stderr.contains("not found"), "{stderr}");
}

#[test]
fn helm_3_and_4_install_upgrade_roll_back_and_uninstall_a_chart() {
    let c = Cluster::start(CONTROL_PLANE);
    release_life(&c, &client_tool("helm3"), "three");
    release_life(&c, &client_tool("helm4"), "four");
}

const CRD_CHART: &[(&str, &str)] = &[
    ("Chart.yaml", "apiVersion: v2\nname: gadgets\nversion: 0.1.0\n"),
    ("values.yaml", "size: 3\n"),
    (
        "crds/gadgets.yaml",
        r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: gadgets.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {plural: gadgets, singular: gadget, kind: Gadget}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size: {type: integer, maximum: 10}
"#,
    ),
    (
        "templates/gadget.yaml",
        "apiVersion: example.com/v1\nkind: Gadget\nmetadata:\n  name: {{ .Release.Name }}-gadget\nspec:\n  size: {{ .Values.size }}\n",
    ),
];

fn gadget_size(c: &Cluster, name: &str) -> i64 {
    c.get_json(&["gadget", name])["spec"]["size"].as_i64().unwrap_or(-1)
}

#[test]
fn a_chart_with_a_custom_resource_definition_and_an_instance() {
    let c = Cluster::start(CONTROL_PLANE);
    let chart = c.dir.path().join("gadgets");
    for (file, text) in CRD_CHART {
        let path = chart.join(file);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("chart dir");
        std::fs::write(path, text).expect("chart file");
    }
    let chart = chart.to_str().expect("utf-8 path");

    let helm3 = client_tool("helm3");
    c.client_ok(&helm3, &["install", "g3", chart]);
    assert_eq!(gadget_size(&c, "g3-gadget"), 3);
    c.client_ok(&helm3, &["upgrade", "g3", chart, "--set", "size=5"]);
    assert_eq!(gadget_size(&c, "g3-gadget"), 5);
    let (_, stderr, ok) = c.client(&helm3, &["upgrade", "g3", chart, "--set", "size=50"]);
    assert!(!ok, "an upgrade past the schema's maximum passed");
    assert!(
        stderr.contains(
            r#"Gadget.example.com "g3-gadget" is invalid: spec.size: Invalid value: 50: spec.size in body should be less than or equal to 10"#
        ),
        "{stderr}"
    );
    assert_eq!(gadget_size(&c, "g3-gadget"), 5);
    c.client_ok(&helm3, &["rollback", "g3", "1"]);
    assert_eq!(gadget_size(&c, "g3-gadget"), 3);

    // helm 4 applies the definition helm 3 created (server-side apply as the manager `helm`,
    // beside helm 3's update entry of the same name): the stored definition is what was written,
    // so nothing conflicts.
    let helm4 = client_tool("helm4");
    c.client_ok(&helm4, &["install", "g4", chart, "--set", "size=7"]);
    assert_eq!(gadget_size(&c, "g4-gadget"), 7);

    c.client_ok(&helm3, &["uninstall", "g3"]);
    c.client_ok(&helm4, &["uninstall", "g4"]);
    c.wait_gone(&["gadget", "g3-gadget"], std::time::Duration::from_secs(30));
    c.wait_gone(&["gadget", "g4-gadget"], std::time::Duration::from_secs(30));
    // helm never deletes what `crds/` installed.
    c.k(&["get", "crd", "gadgets.example.com"]);
}
