//! PersistentVolumes and PersistentVolumeClaims end to end with the real kubectl: the binder
//! controller alone (`--no-agent`), and a hostPath volume whose data outlives the pods that use it
//! on a real node (Docker, the local `busybox:latest` image). Containers and the host directory
//! are removed afterwards.

mod common;

use std::time::Duration;

use common::node::Node;
use common::{Cluster, eventually};
use serde_json::Value;

fn claim_phase(c: &Cluster, name: &str) -> String {
    c.k(&["get", "pvc", name, "-o", "jsonpath={.status.phase}"])
}

fn volume_phase(c: &Cluster, name: &str) -> String {
    c.k(&["get", "pv", name, "-o", "jsonpath={.status.phase}"])
}

fn wait_claim_phase(c: &Cluster, name: &str, phase: &str) {
    let ok = eventually(Duration::from_secs(30), || {
        (claim_phase(c, name) == phase).then_some(())
    });
    assert!(
        ok.is_some(),
        "pvc {name} not {phase}:\n{}\n{}",
        c.k(&["describe", "pvc", name]),
        common::tail(&c.log(), 30)
    );
}

fn wait_volume_phase(c: &Cluster, name: &str, phase: &str) {
    let ok = eventually(Duration::from_secs(30), || {
        (volume_phase(c, name) == phase).then_some(())
    });
    assert!(
        ok.is_some(),
        "pv {name} not {phase}:\n{}\n{}",
        c.k(&["describe", "pv", name]),
        common::tail(&c.log(), 30)
    );
}

/// `(type, reason, message)` of the events about an object.
fn events(c: &Cluster, kind: &str, name: &str) -> Vec<(String, String, String)> {
    let ev = c.get_json(&[
        "events",
        "-A",
        "--field-selector",
        &format!("involvedObject.kind={kind},involvedObject.name={name}"),
    ]);
    ev["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            let s = |k: &str| e[k].as_str().unwrap_or_default().to_string();
            (s("type"), s("reason"), s("message"))
        })
        .collect()
}

fn wait_event(c: &Cluster, kind: &str, name: &str, reason: &str, message: &str) {
    let ok = eventually(Duration::from_secs(30), || {
        events(c, kind, name)
            .iter()
            .any(|(_, r, m)| r == reason && m.contains(message))
            .then_some(())
    });
    assert!(
        ok.is_some(),
        "no {reason} event {message:?} for {kind} {name}: {:?}",
        events(c, kind, name)
    );
}

fn host_path_pv(name: &str, path: &str, size: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: PersistentVolume
metadata:
  name: {name}
  labels:
    type: local
spec:
  storageClassName: manual
  capacity:
    storage: {size}
  accessModes:
  - ReadWriteOnce
  hostPath:
    path: "{path}"
"#
    )
}

fn claim(name: &str, class: &str, size: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: {name}
spec:
  storageClassName: "{class}"
  accessModes:
  - ReadWriteOnce
  resources:
    requests:
      storage: {size}
"#
    )
}

#[test]
fn claims_wait_for_a_matching_volume_then_bind_and_release() {
    let c = Cluster::start(&["--no-agent"]);

    // No volume at all: Pending, with upstream's events for a class and for no class.
    c.apply(&claim("data", "manual", "500Mi"), &[]);
    c.apply(&claim("classless", "", "1Gi"), &[]);
    wait_event(
        &c,
        "PersistentVolumeClaim",
        "data",
        "ProvisioningFailed",
        "storageclass.storage.k8s.io \"manual\" not found",
    );
    wait_event(
        &c,
        "PersistentVolumeClaim",
        "classless",
        "FailedBinding",
        "no persistent volumes available for this claim and no storage class is set",
    );
    assert_eq!(claim_phase(&c, "data"), "Pending");
    assert_eq!(claim_phase(&c, "classless"), "Pending");

    // Volumes that do not satisfy the claim: too small, other class, other access mode.
    c.apply(&host_path_pv("small", "/tmp/skiff-e2e-small", "100Mi"), &[]);
    c.apply(
        &host_path_pv("other-class", "/tmp/skiff-e2e-other", "1Gi").replace("manual", "fast"),
        &[],
    );
    c.apply(
        &host_path_pv("rox", "/tmp/skiff-e2e-rox", "1Gi").replace("ReadWriteOnce", "ReadOnlyMany"),
        &[],
    );
    wait_volume_phase(&c, "small", "Available");
    wait_volume_phase(&c, "other-class", "Available");
    wait_volume_phase(&c, "rox", "Available");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(claim_phase(&c, "data"), "Pending");

    // One that does.
    c.apply(&host_path_pv("fits", "/tmp/skiff-e2e-fits", "1Gi"), &[]);
    wait_claim_phase(&c, "data", "Bound");
    let pvc = c.get_json(&["pvc", "data"]);
    assert_eq!(pvc["spec"]["volumeName"], "fits");
    assert_eq!(pvc["status"]["capacity"]["storage"], "1Gi");
    assert_eq!(pvc["status"]["accessModes"], serde_json::json!(["ReadWriteOnce"]));
    assert_eq!(pvc["metadata"]["annotations"]["pv.kubernetes.io/bind-completed"], "yes");
    assert_eq!(
        pvc["metadata"]["annotations"]["pv.kubernetes.io/bound-by-controller"],
        "yes"
    );
    wait_volume_phase(&c, "fits", "Bound");
    let pv = c.get_json(&["pv", "fits"]);
    let claim_ref = &pv["spec"]["claimRef"];
    assert_eq!(claim_ref["kind"], "PersistentVolumeClaim");
    assert_eq!(claim_ref["namespace"], "default");
    assert_eq!(claim_ref["name"], "data");
    assert_eq!(claim_ref["uid"], pvc["metadata"]["uid"]);
    assert_eq!(
        pv["metadata"]["annotations"]["pv.kubernetes.io/bound-by-controller"],
        "yes"
    );

    // Of two that would do, the smaller one is chosen.
    c.apply(&host_path_pv("big", "/tmp/skiff-e2e-big", "5Gi"), &[]);
    c.apply(&host_path_pv("medium", "/tmp/skiff-e2e-medium", "2Gi"), &[]);
    wait_volume_phase(&c, "big", "Available");
    wait_volume_phase(&c, "medium", "Available");
    c.apply(&claim("more", "manual", "1500Mi"), &[]);
    wait_claim_phase(&c, "more", "Bound");
    assert_eq!(
        c.k(&["get", "pvc", "more", "-o", "jsonpath={.spec.volumeName}"]),
        "medium"
    );
    assert_eq!(volume_phase(&c, "big"), "Available");

    // The printed columns.
    let out = c.k(&["get", "pvc", "data"]);
    let header: Vec<&str> = out.lines().next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME",
            "STATUS",
            "VOLUME",
            "CAPACITY",
            "ACCESS",
            "MODES",
            "STORAGECLASS",
            "VOLUMEATTRIBUTESCLASS",
            "AGE"
        ]
    );
    let row: Vec<&str> = out.lines().nth(1).unwrap_or_default().split_whitespace().collect();
    assert_eq!(row[..7], ["data", "Bound", "fits", "1Gi", "RWO", "manual", "<unset>"]);
    let out = c.k(&["get", "pv", "fits"]);
    let header: Vec<&str> = out.lines().next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME",
            "CAPACITY",
            "ACCESS",
            "MODES",
            "RECLAIM",
            "POLICY",
            "STATUS",
            "CLAIM",
            "STORAGECLASS",
            "VOLUMEATTRIBUTESCLASS",
            "REASON",
            "AGE"
        ]
    );
    let row: Vec<&str> = out.lines().nth(1).unwrap_or_default().split_whitespace().collect();
    assert_eq!(
        row[..8],
        [
            "fits",
            "1Gi",
            "RWO",
            "Retain",
            "Bound",
            "default/data",
            "manual",
            "<unset>"
        ]
    );

    // A volume pre-bound to a claim by the user goes to that claim only, and keeps no
    // bound-by-controller mark.
    c.apply(
        &format!(
            "{}  claimRef:\n    namespace: default\n    name: reserved\n",
            host_path_pv("for-reserved", "/tmp/skiff-e2e-reserved", "10Gi")
        ),
        &[],
    );
    wait_volume_phase(&c, "for-reserved", "Available");
    c.apply(&claim("reserved", "manual", "1Gi"), &[]);
    wait_claim_phase(&c, "reserved", "Bound");
    assert_eq!(
        c.k(&["get", "pvc", "reserved", "-o", "jsonpath={.spec.volumeName}"]),
        "for-reserved"
    );
    let pv = c.get_json(&["pv", "for-reserved"]);
    assert!(pv["metadata"]["annotations"]["pv.kubernetes.io/bound-by-controller"].is_null());
    assert_eq!(
        pv["spec"]["claimRef"]["uid"],
        c.get_json(&["pvc", "reserved"])["metadata"]["uid"]
    );

    // A claim naming a volume that is too small waits, with upstream's warning.
    c.apply(
        &format!("{}  volumeName: small\n", claim("named", "manual", "1Gi")),
        &[],
    );
    wait_event(
        &c,
        "PersistentVolumeClaim",
        "named",
        "VolumeMismatch",
        "Cannot bind to requested volume \"small\": requested PV is too small",
    );
    assert_eq!(claim_phase(&c, "named"), "Pending");

    // Deleting the claim releases its volume (Retain keeps it and its claimRef).
    c.k(&["delete", "pvc", "data"]);
    wait_volume_phase(&c, "fits", "Released");
    let pv = c.get_json(&["pv", "fits"]);
    assert_eq!(pv["spec"]["claimRef"]["name"], "data");
    // A new claim of the same name does not get the released volume back.
    c.apply(&claim("data", "manual", "500Mi"), &[]);
    wait_claim_phase(&c, "data", "Bound");
    assert_eq!(c.k(&["get", "pvc", "data", "-o", "jsonpath={.spec.volumeName}"]), "big");
    assert_eq!(volume_phase(&c, "fits"), "Released");
}

fn pod_with_claim(name: &str, claim: &str, command: &str, read_only: bool) -> String {
    format!(
        r#"
apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: busybox:latest
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "{command}"]
    volumeMounts:
    - name: store
      mountPath: /data
  volumes:
  - name: store
    persistentVolumeClaim:
      claimName: {claim}
      readOnly: {read_only}
"#
    )
}

#[test]
fn host_path_volume_keeps_data_across_pods() {
    let n = Node::start("pv", &[]);
    let c = &n.c;
    let host = tempfile::tempdir().expect("host dir");
    let data_dir = host.path().join("pv-data");
    let data = data_dir.display().to_string();

    // A pod whose claim does not exist yet is not scheduled, and says why.
    c.apply(
        &pod_with_claim(
            "writer",
            "task-pv-claim",
            "echo written-by-writer > /data/out.txt && sleep 3600",
            false,
        ),
        &[],
    );
    wait_event(
        c,
        "Pod",
        "writer",
        "FailedScheduling",
        "0/1 nodes are available: persistentvolumeclaim \"task-pv-claim\" not found.",
    );
    // One put on the node directly (no scheduler) waits in the agent, saying why, and is retried.
    c.apply(
        &pod_with_claim("pinned", "task-pv-claim", "sleep 3600", false)
            .replace("spec:\n", &format!("spec:\n  nodeName: {}\n", n.name)),
        &[],
    );
    wait_event(
        c,
        "Pod",
        "pinned",
        "FailedMount",
        "error processing PVC default/task-pv-claim: failed to fetch PVC from API server: \
         persistentvolumeclaims \"task-pv-claim\" not found",
    );
    let failed: Vec<String> = events(c, "Pod", "pinned")
        .into_iter()
        .filter(|(_, r, _)| r == "FailedMount")
        .map(|(t, _, m)| format!("{t} {m}"))
        .collect();
    assert!(
        failed.iter().all(|m| m.starts_with(
            "Warning Unable to attach or mount volumes: unmounted volumes=[store], unattached volumes=[], \
             failed to process volumes=[store]: error processing PVC default/task-pv-claim: "
        )),
        "{failed:?}"
    );
    c.apply(&claim("task-pv-claim", "manual", "500Mi"), &[]);
    wait_event(
        c,
        "Pod",
        "pinned",
        "FailedMount",
        "error processing PVC default/task-pv-claim: PVC is not bound",
    );
    wait_event(
        c,
        "Pod",
        "writer",
        "FailedScheduling",
        "0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims.",
    );
    assert_eq!(c.k(&["get", "pod", "writer", "-o", "jsonpath={.spec.nodeName}"]), "");

    // The volume: its directory does not exist yet and is created on first use.
    c.apply(&host_path_pv("task-pv-volume", &data, "1Gi"), &[]);
    wait_claim_phase(c, "task-pv-claim", "Bound");
    let out = c.k(&["get", "pvc", "task-pv-claim"]);
    assert!(
        out.lines().nth(1).is_some_and(|l| {
            let row: Vec<&str> = l.split_whitespace().collect();
            row[..6] == ["task-pv-claim", "Bound", "task-pv-volume", "1Gi", "RWO", "manual"]
        }),
        "{out}"
    );
    n.wait_running("writer");
    let written = eventually(Duration::from_secs(30), || {
        std::fs::read_to_string(data_dir.join("out.txt"))
            .ok()
            .filter(|s| !s.is_empty())
    });
    assert_eq!(written.as_deref(), Some("written-by-writer\n"));

    n.wait_running("pinned");
    c.k(&["delete", "pod", "pinned"]);

    // The pod goes, the data stays.
    c.k(&["delete", "pod", "writer"]);
    assert_eq!(
        std::fs::read_to_string(data_dir.join("out.txt")).expect("data kept"),
        "written-by-writer\n"
    );

    // A second pod reads it back, through a read-only mount.
    c.apply(&pod_with_claim("reader", "task-pv-claim", "sleep 3600", true), &[]);
    n.wait_running("reader");
    assert_eq!(
        c.k(&["exec", "reader", "--", "cat", "/data/out.txt"]),
        "written-by-writer\n"
    );
    let touch = c.kubectl(&["exec", "reader", "--", "touch", "/data/new"]);
    assert!(!touch.status.success(), "the claim's readOnly mount is writable");
    assert!(
        String::from_utf8_lossy(&touch.stderr).contains("Read-only file system"),
        "{}",
        String::from_utf8_lossy(&touch.stderr)
    );
    c.k(&["delete", "pod", "reader"]);

    // Deleting the claim releases the volume; the data is still on the host.
    c.k(&["delete", "pvc", "task-pv-claim"]);
    wait_volume_phase(c, "task-pv-volume", "Released");
    let pv: Value = c.get_json(&["pv", "task-pv-volume"]);
    assert_eq!(pv["spec"]["persistentVolumeReclaimPolicy"], "Retain");
    assert_eq!(
        std::fs::read_to_string(data_dir.join("out.txt")).expect("data kept"),
        "written-by-writer\n"
    );
}
