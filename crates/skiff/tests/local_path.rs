//! The default `local-path` StorageClass and the node agent's provisioner end to end, with the real
//! kubectl: the class as `kubectl get storageclass` shows it (and none with
//! `--disable-local-storage`), claims without a class getting it, provisioning once a node is
//! selected (the scheduler's step, done here with `kubectl annotate`), a pod on the real node
//! (Docker, the local `busybox:latest`) writing into the volume's directory, expansion, refusals,
//! a server restart, and deletion with Delete and Retain. Containers and directories are removed
//! afterwards.

#![cfg(test)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use common::node::{Node, wait_node_ready};
use common::storage::{
    self, STORAGECLASS_HEADER, claim_phase, host_path_pv, on_node, pod_with_claim, wait_claim_phase, wait_file,
    wait_for,
};
use common::{Cluster, eventually, finalizers, table};

const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";

/// A ReadWriteOnce claim of `size` (the default class unless `class` is given).
fn claim(name: &str, class: Option<&str>, size: &str) -> String {
    storage::claim(name, class, "ReadWriteOnce", size)
}

#[test]
fn the_default_class_is_listed_given_to_claims_kept_and_can_be_disabled() {
    let mut c = Cluster::start(&["--no-agent"]);
    let rows = table(&c.k(&["get", "storageclass"]));
    assert_eq!(rows[0], STORAGECLASS_HEADER);
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(
        rows[1][..6],
        [
            "local-path",
            "(default)",
            "skiff.dev/local-path",
            "Delete",
            "WaitForFirstConsumer",
            "true"
        ]
    );

    // A claim that names no class gets the default one, and waits for its first consumer.
    c.apply(&claim("plain", None, "1Gi"), &[]);
    assert_eq!(
        c.k(&["get", "pvc", "plain", "-o", "jsonpath={.spec.storageClassName}"]),
        "local-path"
    );
    c.wait_event(
        "PersistentVolumeClaim",
        "plain",
        "WaitForFirstConsumer",
        "waiting for first consumer to be created before binding",
    );
    assert_eq!(claim_phase(&c, "plain"), "Pending");

    // A claim bound to a volume an administrator made cannot grow: only dynamically provisioned
    // claims of classes that allow it do (upstream's PersistentVolumeClaimResize).
    let host = tempfile::tempdir().expect("host dir");
    c.apply(
        &host_path_pv(
            "manual-pv",
            "",
            "ReadWriteOnce",
            "1Gi",
            &host.path().join("manual").display().to_string(),
        ),
        &[],
    );
    c.apply(&claim("manual", Some(""), "1Gi"), &[]);
    wait_claim_phase(&c, "manual", "Bound");
    let err = c.k_err(&[
        "patch",
        "pvc",
        "manual",
        "-p",
        r#"{"spec":{"resources":{"requests":{"storage":"2Gi"}}}}"#,
    ]);
    assert!(
        err.contains(
            "Error from server (Forbidden): persistentvolumeclaims \"manual\" is forbidden: only dynamically \
             provisioned pvc can be resized and the storageclass that provisions the pvc must support resize"
        ),
        "{err}"
    );

    // An administrator's changes to the class outlive a restart; a deleted class comes back.
    c.k(&["label", "storageclass", "local-path", "team=storage"]);
    c.k(&[
        "patch",
        "storageclass",
        "local-path",
        "-p",
        r#"{"allowVolumeExpansion":false}"#,
    ]);
    c.restart();
    let sc = c.get_json(&["storageclass", "local-path"]);
    assert_eq!(sc["metadata"]["labels"]["team"], "storage", "{sc}");
    assert_eq!(sc["allowVolumeExpansion"], false, "{sc}");
    assert_eq!(
        sc["metadata"]["annotations"]["storageclass.kubernetes.io/is-default-class"],
        "true"
    );
    assert_eq!(claim_phase(&c, "manual"), "Bound");
    c.k(&["delete", "storageclass", "local-path"]);
    c.restart();
    let sc = c.get_json(&["storageclass", "local-path"]);
    assert_eq!(sc["allowVolumeExpansion"], true, "{sc}");
    drop(c);

    // Without local storage there is no class, and a claim without one keeps none.
    let c = Cluster::start(&["--no-agent", "--disable-local-storage"]);
    let out = c.kubectl(&["get", "storageclass"]);
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("No resources found"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    c.apply(&claim("plain", None, "1Gi"), &[]);
    assert_eq!(
        c.k(&["get", "pvc", "plain", "-o", "jsonpath={.spec.storageClassName}"]),
        ""
    );
}

/// A pod on `node` (named there directly, as the scheduler would bind it) writing into the claim.
fn writer_pod(node: &str) -> String {
    on_node(
        &pod_with_claim("writer", "data", "echo written-by-writer > /data/out.txt && sleep 3600"),
        node,
    )
}

/// What the scheduler's VolumeBinding does for a WaitForFirstConsumer claim: name the node.
fn select_node(c: &Cluster, claim: &str, node: &str) {
    c.k(&["annotate", "pvc", claim, &format!("{SELECTED_NODE}={node}")]);
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).expect("metadata").permissions().mode() & 0o7777
}

#[test]
fn volumes_are_provisioned_used_grown_kept_and_deleted() {
    let storage = tempfile::tempdir().expect("storage dir");
    let root = storage.path().join("volumes");
    let root_arg = root.display().to_string();
    let mut n = Node::start("localpath", &["--default-storage-path", &root_arg]);
    let node = n.name.clone();

    // A claim of the default class and a pod using it: the pod waits, as the kubelet makes it
    // wait, while the claim is not bound.
    n.c.apply(&claim("data", None, "1Gi"), &[]);
    n.c.apply(&writer_pod(&node), &[]);
    let waiting = eventually(Duration::from_secs(30), || {
        n.c.events("Pod", "writer")
            .into_iter()
            .find(|(_, r, _)| r == "FailedMount")
    });
    let (kind, _, msg) = waiting.expect("no FailedMount event for the writer");
    assert_eq!(kind, "Warning");
    assert_eq!(
        msg,
        "Unable to attach or mount volumes: unmounted volumes=[store], unattached volumes=[], failed to process \
         volumes=[store]: error processing PVC default/data: PVC is not bound"
    );
    let rows = table(&n.c.k(&["get", "pod", "writer"]));
    assert_eq!(rows[1][2], "ContainerCreating", "{rows:?}");

    // The node is selected: this node's agent makes the directory and the volume, which the PV
    // binder binds to the claim.
    select_node(&n.c, "data", &node);
    wait_claim_phase(&n.c, "data", "Bound");
    let pvc = n.c.get_json(&["pvc", "data"]);
    let uid = pvc["metadata"]["uid"].as_str().expect("uid").to_string();
    let pv_name = format!("pvc-{uid}");
    assert_eq!(pvc["spec"]["volumeName"], pv_name.as_str());
    assert_eq!(
        pvc["metadata"]["annotations"]["volume.kubernetes.io/storage-provisioner"],
        "skiff.dev/local-path"
    );
    let dir = root
        .canonicalize()
        .expect("storage path")
        .join(format!("{pv_name}_default_data"));
    assert!(dir.is_dir(), "{} missing", dir.display());
    assert_eq!(mode(&dir), 0o777);

    let pv = n.c.get_json(&["pv", &pv_name]);
    assert_eq!(
        pv["metadata"]["annotations"]["pv.kubernetes.io/provisioned-by"],
        "skiff.dev/local-path"
    );
    let finalizers = finalizers(&pv);
    assert!(
        finalizers
            .iter()
            .any(|f| f == "external-provisioner.volume.kubernetes.io/finalizer"),
        "{finalizers:?}"
    );
    let spec = &pv["spec"];
    assert_eq!(spec["hostPath"]["path"], dir.display().to_string());
    assert_eq!(spec["hostPath"]["type"], "DirectoryOrCreate");
    assert_eq!(
        spec["nodeAffinity"]["required"]["nodeSelectorTerms"],
        serde_json::json!([{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}])
    );
    assert_eq!(spec["capacity"]["storage"], "1Gi");
    assert_eq!(spec["accessModes"], serde_json::json!(["ReadWriteOnce"]));
    assert_eq!(spec["volumeMode"], "Filesystem");
    assert_eq!(spec["persistentVolumeReclaimPolicy"], "Delete");
    assert_eq!(spec["storageClassName"], "local-path");
    assert_eq!(spec["claimRef"]["kind"], "PersistentVolumeClaim");
    assert_eq!(spec["claimRef"]["namespace"], "default");
    assert_eq!(spec["claimRef"]["name"], "data");
    assert_eq!(spec["claimRef"]["uid"], uid.as_str());
    let rows = table(&n.c.k(&["get", "pv", &pv_name]));
    assert_eq!(
        rows[1][..7],
        [
            pv_name.as_str(),
            "1Gi",
            "RWO",
            "Delete",
            "Bound",
            "default/data",
            "local-path"
        ]
    );
    n.c.wait_event(
        "PersistentVolumeClaim",
        "data",
        "Provisioning",
        "External provisioner is provisioning volume for claim \"default/data\"",
    );
    n.c.wait_event(
        "PersistentVolumeClaim",
        "data",
        "ProvisioningSucceeded",
        &format!("Successfully provisioned volume {pv_name}"),
    );
    n.c.wait_event(
        "PersistentVolumeClaim",
        "data",
        "ExternalProvisioning",
        "Waiting for a volume to be created either by the external provisioner 'skiff.dev/local-path' or manually by \
         the system administrator. If volume creation is delayed, please verify that the provisioner is running and \
         correctly registered.",
    );
    let sources: Vec<String> = n.c.get_json(&[
        "events",
        "--field-selector",
        "involvedObject.kind=PersistentVolumeClaim,involvedObject.name=data",
    ])["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["reason"] == "ProvisioningSucceeded")
        .map(|e| e["source"]["component"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(sources, [format!("skiff.dev/local-path_{node}")]);

    // The pod starts and what it writes lands in the volume's directory.
    n.wait_running("writer");
    wait_file(&dir.join("out.txt"), "written-by-writer\n");

    // Growing the claim: the volume and then the claim's capacity follow.
    n.c.k(&[
        "patch",
        "pvc",
        "data",
        "-p",
        r#"{"spec":{"resources":{"requests":{"storage":"2Gi"}}}}"#,
    ]);
    wait_for(&n.c, "the claim did not grow", Duration::from_secs(30), || {
        table(&n.c.k(&["get", "pvc", "data"]))
            .get(1)
            .is_some_and(|r| r[..4] == ["data", "Bound", pv_name.as_str(), "2Gi"])
    });
    assert_eq!(
        n.c.k(&["get", "pv", &pv_name, "-o", "jsonpath={.spec.capacity.storage}"]),
        "2Gi"
    );
    let status = n.c.get_json(&["pvc", "data"])["status"].clone();
    assert_eq!(status["allocatedResources"]["storage"], "2Gi", "{status}");
    assert!(status["allocatedResourceStatuses"].is_null(), "{status}");
    assert!(status["conditions"].is_null(), "{status}");
    n.c.wait_event(
        "PersistentVolumeClaim",
        "data",
        "Resizing",
        &format!("External resizer is resizing volume {pv_name}"),
    );
    n.c.wait_event(
        "PersistentVolumeClaim",
        "data",
        "VolumeResizeSuccessful",
        "Resize volume succeeded",
    );
    // Shrinking is refused.
    let err = n.c.k_err(&[
        "patch",
        "pvc",
        "data",
        "-p",
        r#"{"spec":{"resources":{"requests":{"storage":"1Gi"}}}}"#,
    ]);
    assert!(
        err.contains(
            "The PersistentVolumeClaim \"data\" is invalid: spec.resources.requests.storage: Forbidden: field can not \
             be less than status.capacity"
        ),
        "{err}"
    );

    // What local-path does not provision: block volumes and modes other nodes would share.
    n.c.apply(&(claim("raw", None, "1Gi") + "  volumeMode: Block\n"), &[]);
    n.c.apply(&storage::claim("shared", None, "ReadWriteMany", "1Gi"), &[]);
    select_node(&n.c, "raw", &node);
    select_node(&n.c, "shared", &node);
    n.c.wait_event(
        "PersistentVolumeClaim",
        "raw",
        "ProvisioningFailed",
        "skiff.dev/local-path does not support block volume provisioning",
    );
    n.c.wait_event(
        "PersistentVolumeClaim",
        "shared",
        "ProvisioningFailed",
        "NodePath only supports ReadWriteOnce and ReadWriteOncePod (1.22+) access modes",
    );
    assert_eq!(claim_phase(&n.c, "raw"), "Pending");
    assert_eq!(claim_phase(&n.c, "shared"), "Pending");

    // A restart keeps the binding, the volume, its data and the running pod.
    n.c.restart();
    wait_node_ready(&n.c, &node, || n.c.log());
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(claim_phase(&n.c, "data"), "Bound");
    assert_eq!(
        n.c.k(&["get", "pvc", "data", "-o", "jsonpath={.spec.volumeName}"]),
        pv_name
    );
    let volumes: Vec<String> = n.c.get_json(&["pv"])["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    assert_eq!(volumes, std::slice::from_ref(&pv_name));
    assert_eq!(
        std::fs::read_to_string(dir.join("out.txt")).expect("data kept"),
        "written-by-writer\n"
    );
    n.wait_running("writer");

    // A class that retains: its volume and directory outlive the claim; the provisioner's
    // finalizer is not kept on a volume it will not delete.
    n.c.apply(
        "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata:\n  name: keep\nprovisioner: skiff.dev/local-path\n\
         reclaimPolicy: Retain\nvolumeBindingMode: WaitForFirstConsumer\n",
        &[],
    );
    n.c.apply(&claim("kept", Some("keep"), "100Mi"), &[]);
    select_node(&n.c, "kept", &node);
    wait_claim_phase(&n.c, "kept", "Bound");
    let kept_pv = n.c.k(&["get", "pvc", "kept", "-o", "jsonpath={.spec.volumeName}"]);
    let kept_dir = n.c.k(&["get", "pv", &kept_pv, "-o", "jsonpath={.spec.hostPath.path}"]);
    std::fs::write(Path::new(&kept_dir).join("keep.txt"), "kept").expect("write into the volume");
    n.c.k(&["delete", "pvc", "kept"]);
    wait_for(
        &n.c,
        "the retained volume is not Released",
        Duration::from_secs(30),
        || n.c.k(&["get", "pv", &kept_pv, "-o", "jsonpath={.status.phase}"]) == "Released",
    );
    wait_for(
        &n.c,
        "the finalizer stayed on a retained volume",
        Duration::from_secs(30),
        || {
            !n.c.k(&["get", "pv", &kept_pv, "-o", "jsonpath={.metadata.finalizers}"])
                .contains("external-provisioner.volume.kubernetes.io/finalizer")
        },
    );
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        std::fs::read_to_string(Path::new(&kept_dir).join("keep.txt")).expect("retained data"),
        "kept"
    );
    assert_eq!(
        n.c.k(&["get", "pv", &kept_pv, "-o", "jsonpath={.status.phase}"]),
        "Released"
    );

    // Delete: the pod first (its claim is in use), then the claim; the volume and its
    // directory go.
    n.c.k(&["delete", "pod", "writer"]);
    n.c.k(&["delete", "pvc", "data"]);
    n.c.wait_gone(&["pv", &pv_name], Duration::from_secs(30));
    assert!(!dir.exists(), "{} kept", dir.display());
    assert!(Path::new(&kept_dir).exists());
    drop(n);
}
