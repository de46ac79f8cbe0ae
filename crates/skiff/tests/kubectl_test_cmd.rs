//! kubectl's own command tests (upstream's `test/cmd`) for what clients rely on, reproduced
//! case by case against Skiff: `diff.sh` (client- and server-side diff), `get.sh`'s `--sort-by`,
//! `core.sh`'s patch of a map with a string, `create.sh`'s raw create of the wrong kind, and
//! `apps.sh`'s rollout history of StatefulSets and rollbacks of Deployments. The test script runs
//! this file again with kubectl 1.33 and 1.37.

#![cfg(test)]

mod common;

use std::time::Duration;

use common::{Cluster, eventually};

/// The API server and the controllers: objects are judged, nothing runs.
const CONTROL_PLANE: &[&str] = &["--no-agent", "--no-scheduler"];

fn write(c: &Cluster, name: &str, text: &str) -> String {
    let path = c.path().join(name);
    std::fs::write(&path, text).expect("manifest");
    path.display().to_string()
}

/// stdout and stderr together, and the exit code.
fn run(c: &Cluster, args: &[&str]) -> (Option<i32>, String) {
    let out = c.kubectl(args);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

/// `hack/testdata/pod.yaml` and its changed image.
fn test_pod(image: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: test-pod\n  labels:\n    name: test-pod-label\nspec:\n  containers:\n  - name: kubernetes-pause\n    image: {image}\n"
    )
}

fn resource_version(c: &Cluster, file: &str) -> String {
    c.k(&["get", "-f", file, "-o", "go-template={{ .metadata.resourceVersion }}"])
}

/// `run_kubectl_diff_tests`, but for its pruning part.
#[test]
fn diff_sh() {
    let c = Cluster::start(CONTROL_PLANE);
    let pod = write(&c, "pod.yaml", &test_pod("registry.k8s.io/pause:3.10"));
    let changed = write(&c, "pod-changed.yaml", &test_pod("registry.k8s.io/pause:3.4"));
    let invalid = write(
        &c,
        "invalid-pod.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: invalid_pod\nspec:\n  containers:\n  - name: kubernetes-pause\n    image: registry.k8s.io/pause:3.10\n",
    );
    let absent = || !c.k(&["get", "pods", "-o", "name"]).contains("test-pod");

    for server_side in [false, true] {
        let side = if server_side {
            "--server-side"
        } else {
            "--server-side=false"
        };
        // It works when the live object does not exist, and only dry-runs.
        let (code, out) = run(&c, &["diff", side, "-f", &pod]);
        assert_eq!(code, Some(1), "{side}: {out}");
        assert!(out.contains("test-pod"), "{side}: {out}");
        assert!(absent(), "{side}: the diff created the pod");

        c.k(&["apply", side, "-f", &pod]);
        let initial = resource_version(&c, &pod);
        // Diffing right after the apply shows nothing.
        let (code, out) = run(&c, &["diff", side, "-f", &pod]);
        assert_eq!(code, Some(0), "{side}: {out}");
        assert_eq!(resource_version(&c, &pod), initial, "{side}");
        // A change shows, with exit code 1, and is not persisted, either way of diffing.
        for how in ["--server-side=false", "--server-side"] {
            let (code, out) = run(&c, &["diff", how, "-f", &changed]);
            assert_eq!(code, Some(1), "{side} then {how}: {out}");
            assert!(out.contains("registry.k8s.io/pause:3.4"), "{side} then {how}: {out}");
            assert_eq!(resource_version(&c, &pod), initial, "{side} then {how}");
        }
        // An error is an exit code above 1.
        let (code, out) = run(&c, &["diff", side, "-f", &invalid]);
        assert!(code.is_some_and(|n| n > 1), "{side}: {code:?} {out}");
        c.k(&["delete", "-f", &pod]);
        let gone = eventually(Duration::from_secs(30), || absent().then_some(()));
        assert!(gone.is_some(), "{side}: test-pod stays");
    }
}

/// `run_kubectl_sort_by_tests`.
#[test]
fn get_sh_sort_by() {
    let c = Cluster::start(CONTROL_PLANE);
    // No pod: sorting does not fail.
    c.k(&["get", "pods", "--sort-by={metadata.name}"]);
    c.k(&["get", "pods", "--sort-by={metadata.creationTimestamp}"]);
    // `hack/testdata/sorted-pods`: names, labels and container names sort three ways.
    for (pod, label, container) in [
        ("sorted-pod1", "sorted-pod3-label", "kubernetes-pause2"),
        ("sorted-pod2", "sorted-pod2-label", "kubernetes-pause1"),
        ("sorted-pod3", "sorted-pod1-label", "kubernetes-pause3"),
    ] {
        let file = write(
            &c,
            &format!("{pod}.yaml"),
            &format!(
                "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {pod}\n  labels:\n    name: {label}\nspec:\n  containers:\n  - name: {container}\n    image: registry.k8s.io/pause:3.10\n"
            ),
        );
        c.k(&["create", "-f", &file]);
        // Creation timestamps have seconds: keep them apart.
        std::thread::sleep(Duration::from_millis(1100));
    }
    let order = |args: &[&str]| -> Vec<String> {
        let (code, out) = run(&c, args);
        assert_eq!(code, Some(0), "{out}");
        out.lines()
            .filter_map(|l| l.split_whitespace().next())
            .filter(|w| w.starts_with("sorted-pod"))
            .map(str::to_string)
            .collect()
    };
    let by = |field: &str| order(&["get", "pods", &format!("--sort-by={field}")]);
    assert_eq!(by("{metadata.name}"), ["sorted-pod1", "sorted-pod2", "sorted-pod3"]);
    assert_eq!(
        by("{metadata.labels.name}"),
        ["sorted-pod3", "sorted-pod2", "sorted-pod1"]
    );
    assert_eq!(
        by("{spec.containers[0].name}"),
        ["sorted-pod2", "sorted-pod1", "sorted-pod3"]
    );
    assert_eq!(
        by("{metadata.creationTimestamp}"),
        ["sorted-pod1", "sorted-pod2", "sorted-pod3"]
    );
    // The fallback without server-side printing asks for no Table.
    let (code, out) = run(
        &c,
        &[
            "get",
            "pods",
            "--sort-by={spec.containers[0].name}",
            "--server-print=false",
            "--v=8",
        ],
    );
    assert_eq!(code, Some(0), "{out}");
    let names: Vec<&str> = out
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| w.starts_with("sorted-pod"))
        .collect();
    assert_eq!(names, ["sorted-pod2", "sorted-pod1", "sorted-pod3"], "{out}");
    assert!(!out.contains("as=Table"), "{out}");
}

/// `run_pod_tests`' patch of the labels map with a string, and `run_create_tests`' raw post of
/// a pod to the namespaces.
#[test]
fn core_sh_and_create_sh_errors() {
    let c = Cluster::start(CONTROL_PLANE);
    // test/fixtures/doc-yaml/admin/limitrange/valid-pod.yaml
    let valid_pod = write(
        &c,
        "valid-pod.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: valid-pod\n  labels:\n    name: valid-pod\nspec:\n  containers:\n  - name: kubernetes-serve-hostname\n    image: registry.k8s.io/serve_hostname\n    resources:\n      limits:\n        cpu: \"1\"\n        memory: 512Mi\n",
    );
    c.k(&["create", "-f", &valid_pod]);
    let (code, out) = run(
        &c,
        &[
            "patch",
            "pod",
            "valid-pod",
            "-p",
            r#"{"metadata":{"labels":"invalid"}}"#,
        ],
    );
    assert_ne!(code, Some(0), "{out}");
    assert!(out.contains("cannot restore map from string"), "{out}");
    let (code, out) = run(
        &c,
        &["create", "--raw", "/api/v1/namespaces", "-f", &valid_pod, "--v=8"],
    );
    assert_ne!(code, Some(0), "{out}");
    assert!(
        out.contains("the object provided is unrecognized (must be of type Namespace)"),
        "{out}"
    );
    let (_, out) = run(
        &c,
        &["create", "--raw", "/api/v1/namespaces", "-f", &valid_pod, "--edit"],
    );
    assert!(out.contains("raw and --edit are mutually exclusive"), "{out}");
}

fn statefulset(image: &str) -> String {
    format!(
        "apiVersion: apps/v1\nkind: StatefulSet\nmetadata:\n  name: nginx\nspec:\n  selector:\n    matchLabels:\n      app: nginx-statefulset\n  replicas: 0\n  serviceName: nginx\n  updateStrategy:\n    type: RollingUpdate\n  template:\n    metadata:\n      labels:\n        app: nginx-statefulset\n    spec:\n      terminationGracePeriodSeconds: 5\n      containers:\n      - name: nginx\n        image: {image}\n        ports:\n        - containerPort: 80\n          name: web\n"
    )
}

/// `run_statefulset_history_tests`: `--record` puts the command line in the change cause, the
/// revisions carry it, and `rollout history` prints it.
#[test]
fn apps_sh_statefulset_history() {
    let c = Cluster::start(CONTROL_PLANE);
    let file = write(
        &c,
        "rollingupdate-statefulset.yaml",
        &statefulset("registry.k8s.io/nginx-slim:0.7"),
    );
    c.k(&["apply", "-f", &file, "--record"]);
    let annotations = eventually(Duration::from_secs(30), || {
        let out = c.k(&[
            "get",
            "controllerrevisions",
            "-o",
            "jsonpath={.items[*].metadata.annotations}",
        ]);
        out.contains("rollingupdate-statefulset.yaml --record").then_some(out)
    });
    assert!(
        annotations.is_some(),
        "{}",
        c.k(&["get", "controllerrevisions", "-o", "yaml"])
    );
    let history = c.k(&["rollout", "history", "statefulset"]);
    assert!(history.contains("statefulset.apps/nginx"), "{history}");
    assert!(history.contains("rollingupdate-statefulset.yaml --record"), "{history}");

    let file2 = write(
        &c,
        "rollingupdate-statefulset-rv2.yaml",
        &statefulset("registry.k8s.io/nginx-slim:0.8"),
    );
    c.k(&["apply", "-f", &file2, "--record"]);
    let two = eventually(Duration::from_secs(30), || {
        let out = c.k(&["rollout", "history", "statefulset/nginx"]);
        out.contains("rollingupdate-statefulset-rv2.yaml --record")
            .then_some(out)
    })
    .unwrap_or_else(|| c.k(&["rollout", "history", "statefulset/nginx"]));
    assert!(two.contains("rollingupdate-statefulset.yaml --record"), "{two}");
    assert!(two.contains("rollingupdate-statefulset-rv2.yaml --record"), "{two}");
    let first = c.k(&["rollout", "history", "statefulset/nginx", "--revision=1"]);
    assert!(first.contains("registry.k8s.io/nginx-slim:0.7"), "{first}");
}

fn deployment(image: &str) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: nginx\n  labels:\n    name: nginx-undo\nspec:\n  replicas: 3\n  selector:\n    matchLabels:\n      name: nginx-undo\n  template:\n    metadata:\n      labels:\n        name: nginx-undo\n    spec:\n      containers:\n      - name: nginx\n        image: {image}\n        ports:\n        - containerPort: 80\n"
    )
}

/// `run_deployment_tests`' rollbacks: back to a revision and to the last one, a missing revision
/// refused, and the ReplicaSet brought back keeps the revisions it had.
#[test]
fn apps_sh_deployment_rollbacks() {
    let c = Cluster::start(CONTROL_PLANE);
    let images = || {
        c.k(&[
            "get",
            "deployment",
            "nginx",
            "-o",
            "jsonpath={.spec.template.spec.containers[0].image}",
        ])
    };
    let revision_of = |image: &str| {
        eventually(Duration::from_secs(30), || {
            let out = c.k(&[
                "get",
                "rs",
                "-l",
                "name=nginx-undo",
                "-o",
                "jsonpath={range .items[*]}{.spec.template.spec.containers[0].image} {.metadata.annotations.deployment\\.kubernetes\\.io/revision} {.metadata.annotations.deployment\\.kubernetes\\.io/revision-history}{\"\\n\"}{end}",
            ]);
            out.lines()
                .find(|l| l.starts_with(&format!("{image} ")))
                .map(|l| l.split_whitespace().skip(1).map(str::to_string).collect::<Vec<_>>())
        })
        .unwrap_or_default()
    };
    let wait_revision = |image: &str, want: &[&str]| {
        let got = eventually(Duration::from_secs(30), || {
            let got = revision_of(image);
            (got == want).then_some(got)
        });
        assert!(
            got.is_some(),
            "{image}: {:?} not {want:?}\n{}\n{}",
            revision_of(image),
            c.k(&["get", "rs", "-o", "yaml"]),
            c.k(&["describe", "deployment", "nginx"])
        );
    };
    c.apply(&deployment("registry.k8s.io/nginx:test-cmd"), &[]);
    wait_revision("registry.k8s.io/nginx:test-cmd", &["1"]);
    c.apply(&deployment("registry.k8s.io/nginx:1.7.9"), &[]);
    wait_revision("registry.k8s.io/nginx:1.7.9", &["2"]);
    // A dry run changes nothing.
    let dry = c.k(&[
        "rollout",
        "undo",
        "deployment",
        "nginx",
        "--to-revision=1",
        "--dry-run=server",
    ]);
    assert!(dry.contains("rolled back"), "{dry}");
    assert_eq!(images(), "registry.k8s.io/nginx:1.7.9");
    c.k(&["rollout", "undo", "deployment", "nginx", "--to-revision=1"]);
    assert_eq!(images(), "registry.k8s.io/nginx:test-cmd");
    wait_revision("registry.k8s.io/nginx:test-cmd", &["3", "1"]);
    let (code, out) = run(&c, &["rollout", "undo", "deployment", "nginx", "--to-revision=1000000"]);
    assert_ne!(code, Some(0), "{out}");
    assert!(
        out.contains("unable to find specified revision 1000000 in history"),
        "{out}"
    );
    assert_eq!(images(), "registry.k8s.io/nginx:test-cmd");
    c.k(&["rollout", "undo", "deployment", "nginx"]);
    assert_eq!(images(), "registry.k8s.io/nginx:1.7.9");
    wait_revision("registry.k8s.io/nginx:1.7.9", &["4", "2"]);
    c.k(&["rollout", "undo", "deployment", "nginx"]);
    wait_revision("registry.k8s.io/nginx:test-cmd", &["5", "1,3"]);
}
