//! Storage object in-use protection and claim lifecycle end to end, with the real kubectl and a
//! real node (Docker, the local `busybox:latest` image): a claim a running pod uses and a volume
//! bound to a claim stay `Terminating` until nothing uses them; StatefulSets' claims follow
//! `persistentVolumeClaimRetentionPolicy` through scale-down, scale-up, foreground and background
//! deletion; a namespace whose claim a pod uses deletes fully. Volumes are hostPath volumes in
//! temporary directories; claims name their class (or none) so no default class is involved.
//! Containers and directories are removed afterwards.

#![cfg(test)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::node::Node;
use common::storage::{
    PV_HEADER, PVC_HEADER, claim, claim_ref, claim_template, host_path_pv, pod_with_claim, volume_phase,
    wait_claim_phase, wait_for,
};
use common::{Cluster, finalizers, table};
use serde_json::Value;

const PVC_FINALIZER: &str = "kubernetes.io/pvc-protection";
const PV_FINALIZER: &str = "kubernetes.io/pv-protection";

/// A 1Gi ReadWriteOnce hostPath volume at `dir/NAME`.
fn volume_in(dir: &Path, name: &str, class: &str) -> String {
    host_path_pv(
        name,
        class,
        "ReadWriteOnce",
        "1Gi",
        &dir.join(name).display().to_string(),
    )
}

/// A StatefulSet of busybox pods, each with a class-less claim `data-<name>-<ordinal>`.
fn stateful_set(name: &str, replicas: u32, when_deleted: &str, when_scaled: &str) -> String {
    format!(
        r#"
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: {name}
spec:
  serviceName: {name}
  replicas: {replicas}
  selector:
    matchLabels:
      app: {name}
  persistentVolumeClaimRetentionPolicy:
    whenDeleted: {when_deleted}
    whenScaled: {when_scaled}
  template:
    metadata:
      labels:
        app: {name}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: main
        image: busybox:latest
        imagePullPolicy: IfNotPresent
        command: ["sh", "-c", "sleep 3600"]
        volumeMounts:
        - name: data
          mountPath: /data
{}"#,
        claim_template("data", Some(""))
    )
}

/// Waits for the set's pods to be ready.
fn wait_rolled_out(c: &Cluster, set: &str, replicas: u32) {
    wait_for(c, &format!("{set} not rolled out"), Duration::from_secs(90), || {
        c.get_opt(&["sts", set])
            .is_some_and(|s| s["status"]["readyReplicas"] == replicas)
    });
}

/// The claim's owners as `Kind/name`.
fn owners(v: &Value) -> Vec<String> {
    v["metadata"]["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            assert_eq!(r["controller"], true, "{r}");
            assert_eq!(r["blockOwnerDeletion"], true, "{r}");
            format!(
                "{}/{}",
                r["kind"].as_str().unwrap_or_default(),
                r["name"].as_str().unwrap_or_default()
            )
        })
        .collect()
}

#[test]
fn a_claim_in_use_and_a_bound_volume_wait_for_their_users() {
    let n = Node::start("protect", &[]);
    let c = &n.c;
    let host = tempfile::tempdir().expect("host dir");

    c.apply(&volume_in(host.path(), "protected-vol", "manual"), &[]);
    c.apply(&claim("data", Some("manual"), "ReadWriteOnce", "1Gi"), &[]);
    wait_claim_phase(c, "data", "Bound");
    // Both carry the finalizer the admission plugin adds.
    let pvc = c.get_opt(&["pvc", "data"]).expect("claim");
    assert_eq!(finalizers(&pvc), [PVC_FINALIZER]);
    let pv = c.get_opt(&["pv", "protected-vol"]).expect("volume");
    assert_eq!(finalizers(&pv), [PV_FINALIZER]);

    c.apply(&pod_with_claim("user", "data", "sleep 3600"), &[]);
    n.wait_running("user");

    // Deleting the claim a running pod uses only marks it.
    let out = c.k(&["delete", "pvc", "data", "--wait=false"]);
    assert_eq!(out.trim(), "persistentvolumeclaim \"data\" deleted");
    std::thread::sleep(Duration::from_secs(3));
    let pvc = c.get_opt(&["pvc", "data"]).expect("claim kept while its pod runs");
    assert!(pvc["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(finalizers(&pvc), [PVC_FINALIZER]);
    let rows = table(&c.k(&["get", "pvc", "data"]));
    assert_eq!(
        rows[1][..6],
        ["data", "Terminating", "protected-vol", "1Gi", "RWO", "manual"]
    );

    // A volume bound to a claim is kept too, while the claim is there.
    c.k(&["delete", "pv", "protected-vol", "--wait=false"]);
    std::thread::sleep(Duration::from_secs(2));
    let pv = c.get_opt(&["pv", "protected-vol"]).expect("volume kept while bound");
    assert_eq!(finalizers(&pv), [PV_FINALIZER]);
    assert_eq!(pv["status"]["phase"], "Bound");

    // Both tables as upstream prints them.
    let out = c.k(&["get", "pv,pvc"]);
    let mut tables = out.split("\n\n");
    let pv_table = tables.next().unwrap_or_default();
    let pvc_table = tables.next().unwrap_or_default();
    assert_eq!(table(pv_table)[0], PV_HEADER, "{out}");
    assert_eq!(
        table(pv_table)[1][..8],
        [
            "persistentvolume/protected-vol",
            "1Gi",
            "RWO",
            "Retain",
            "Terminating",
            "default/data",
            "manual",
            "<unset>"
        ],
        "{out}"
    );
    assert_eq!(table(pvc_table)[0], PVC_HEADER, "{out}");
    assert_eq!(table(pvc_table)[1][1], "Terminating", "{out}");
    let wide = c.k(&["get", "pvc", "-o", "wide"]);
    assert_eq!(table(&wide)[0].last().map(String::as_str), Some("VOLUMEMODE"), "{wide}");

    // The pod goes: then the claim, then the volume (released by the binder, no longer Bound).
    c.k(&["delete", "pod", "user"]);
    c.wait_gone(&["pvc", "data"], Duration::from_secs(30));
    c.wait_gone(&["pv", "protected-vol"], Duration::from_secs(30));
}

/// A node and `count` class-less volumes `vol-N` in a temporary directory (removed when it is
/// dropped).
fn node_with_volumes(tag: &str, count: usize) -> (Node, tempfile::TempDir) {
    let n = Node::start(tag, &[]);
    let host = tempfile::tempdir().expect("host dir");
    for i in 0..count {
        n.c.apply(&volume_in(host.path(), &format!("vol-{i}"), ""), &[]);
    }
    (n, host)
}

#[test]
fn statefulset_claims_go_with_the_set_when_deleted_delete() {
    let (n, _host) = node_with_volumes("sts-del", 3);
    let c = &n.c;

    // Retain (the default): the claims belong to nobody.
    c.apply(&stateful_set("web", 2, "Retain", "Retain"), &[]);
    wait_rolled_out(c, "web", 2);
    for claim in ["data-web-0", "data-web-1"] {
        let pvc = c.get_opt(&["pvc", claim]).expect("claim");
        assert!(owners(&pvc).is_empty(), "{pvc}");
        assert_eq!(finalizers(&pvc), [PVC_FINALIZER]);
    }

    // whenDeleted Delete on the existing set: its claims become the set's.
    c.k(&[
        "patch",
        "sts",
        "web",
        "--type=merge",
        "-p",
        r#"{"spec":{"persistentVolumeClaimRetentionPolicy":{"whenDeleted":"Delete"}}}"#,
    ]);
    wait_for(c, "claims not owned by the set", Duration::from_secs(30), || {
        ["data-web-0", "data-web-1"].iter().all(|claim| {
            c.get_opt(&["pvc", claim])
                .is_some_and(|p| owners(&p) == ["StatefulSet/web"])
        })
    });

    // whenScaled Retain: scaling down keeps the claim, still the set's.
    c.k(&["scale", "sts", "web", "--replicas=1"]);
    c.wait_gone(&["pod", "web-1"], Duration::from_secs(30));
    let pvc = c.get_opt(&["pvc", "data-web-1"]).expect("claim kept on scale-down");
    assert_eq!(owners(&pvc), ["StatefulSet/web"]);

    // Foreground deletion: the set goes last, after its pods and claims.
    c.k(&["delete", "sts", "web", "--cascade=foreground", "--timeout=120s"]);
    assert!(c.get_opt(&["sts", "web"]).is_none());
    assert!(c.get_opt(&["pod", "web-0"]).is_none());
    c.wait_gone(&["pvc", "data-web-0"], Duration::from_secs(10));
    c.wait_gone(&["pvc", "data-web-1"], Duration::from_secs(10));
    // Their volumes (whichever two the claims were bound to) are released.
    wait_for(c, "volumes not released", Duration::from_secs(30), || {
        ["vol-0", "vol-1", "vol-2"]
            .iter()
            .filter(|v| volume_phase(c, v) == "Released")
            .count()
            == 2
    });

    // Background deletion (kubectl's default): the garbage collector removes the claims once the
    // pods that use them are gone.
    c.apply(&stateful_set("api", 1, "Delete", "Retain"), &[]);
    n.wait_running("api-0");
    let pvc = c.get_opt(&["pvc", "data-api-0"]).expect("claim");
    assert_eq!(owners(&pvc), ["StatefulSet/api"]);
    c.k(&["delete", "sts", "api"]);
    c.wait_gone(&["pod", "api-0"], Duration::from_secs(30));
    c.wait_gone(&["pvc", "data-api-0"], Duration::from_secs(30));
}

#[test]
fn statefulset_claims_go_with_condemned_pods_when_scaled_delete() {
    let (n, _host) = node_with_volumes("sts-scale", 4);
    let c = &n.c;

    c.apply(&stateful_set("db", 2, "Retain", "Delete"), &[]);
    wait_rolled_out(c, "db", 2);
    let first = c.get_opt(&["pvc", "data-db-1"]).expect("claim");
    // In range, with whenDeleted Retain: nobody owns them.
    assert!(owners(&first).is_empty(), "{first}");

    // Scaling down: the condemned pod's claim becomes the pod's, and goes with it.
    c.k(&["scale", "sts", "db", "--replicas=1"]);
    c.wait_gone(&["pod", "db-1"], Duration::from_secs(30));
    c.wait_gone(&["pvc", "data-db-1"], Duration::from_secs(30));
    let kept = c.get_opt(&["pvc", "data-db-0"]).expect("the remaining pod's claim");
    assert!(owners(&kept).is_empty());

    // Scaling back up creates a fresh claim for the ordinal.
    c.k(&["scale", "sts", "db", "--replicas=2"]);
    n.wait_running("db-1");
    let fresh = c.get_opt(&["pvc", "data-db-1"]).expect("a new claim");
    assert_ne!(fresh["metadata"]["uid"], first["metadata"]["uid"]);
    assert_eq!(fresh["status"]["phase"], "Bound");

    // A pod is not created while its claim is being deleted (held here by a finalizer of the
    // user's), and is once the claim is gone and made again.
    c.k(&[
        "patch",
        "pvc",
        "data-db-1",
        "--type=merge",
        "-p",
        r#"{"metadata":{"finalizers":["kubernetes.io/pvc-protection","example.com/hold"]}}"#,
    ]);
    c.k(&["delete", "pvc", "data-db-1", "--wait=false"]);
    c.k(&["delete", "pod", "db-1"]);
    let msg = "create Pod db-1 in StatefulSet db failed error: pvc data-db-1 is being deleted";
    wait_for(c, "no FailedCreate event", Duration::from_secs(30), || {
        c.event_messages("involvedObject.kind=StatefulSet,involvedObject.name=db,reason=FailedCreate")
            .lines()
            .any(|l| l == msg)
    });
    assert!(c.get_opt(&["pod", "db-1"]).is_none());
    c.k(&[
        "patch",
        "pvc",
        "data-db-1",
        "--type=merge",
        "-p",
        r#"{"metadata":{"finalizers":null}}"#,
    ]);
    n.wait_running("db-1");

    // whenDeleted Retain: deleting the set leaves its claims, owned by nobody.
    c.k(&["delete", "sts", "db"]);
    c.wait_gone(&["pod", "db-0"], Duration::from_secs(30));
    c.wait_gone(&["pod", "db-1"], Duration::from_secs(30));
    for claim in ["data-db-0", "data-db-1"] {
        let pvc = c.get_opt(&["pvc", claim]).expect("claim kept");
        assert!(owners(&pvc).is_empty());
        assert_eq!(pvc["status"]["phase"], "Bound");
    }
}

#[test]
fn a_namespace_with_a_claim_in_use_deletes_fully() {
    let n = Node::start("ns-claim", &[]);
    let c = &n.c;
    let host = tempfile::tempdir().expect("host dir");
    c.k(&["create", "namespace", "shop"]);
    c.apply(
        &(volume_in(host.path(), "shop-vol", "manual") + &claim_ref("shop", "data")),
        &[],
    );
    c.apply(&claim("data", Some("manual"), "ReadWriteOnce", "1Gi"), &["-n", "shop"]);
    c.apply(&pod_with_claim("user", "data", "sleep 3600"), &["-n", "shop"]);
    wait_for(c, "pod not Running", Duration::from_secs(60), || {
        c.get_opt(&["pod", "user", "-n", "shop"])
            .is_some_and(|p| p["status"]["phase"] == "Running")
    });

    c.k(&["delete", "namespace", "shop", "--timeout=120s"]);
    assert!(c.get_opt(&["namespace", "shop"]).is_none());
    wait_for(c, "volume not released", Duration::from_secs(30), || {
        volume_phase(c, "shop-vol") == "Released"
    });
}

#[test]
fn a_claim_without_a_class_gets_the_default_class_that_appears_later() {
    let c = Cluster::start(&["--no-agent"]);
    // No class is the default when the claim is created (whatever classes the cluster has).
    let classes = c.k(&["get", "storageclass", "-o", "name"]);
    for class in classes.lines().filter(|l| !l.is_empty()) {
        c.k(&[
            "annotate",
            "--overwrite",
            class,
            "storageclass.kubernetes.io/is-default-class=false",
        ]);
    }
    c.apply(
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: late\nspec:\n  accessModes: [ReadWriteOnce]\n  resources:\n    requests:\n      storage: 1Gi\n",
        &[],
    );
    let pvc = c.get_opt(&["pvc", "late"]).expect("claim");
    assert!(pvc["spec"]["storageClassName"].is_null(), "{pvc}");

    // A default class and a volume of it appear: the binder gives the claim the class, then binds.
    let host = tempfile::tempdir().expect("host dir");
    c.apply(
        "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata:\n  name: later\n  annotations:\n    storageclass.kubernetes.io/is-default-class: \"true\"\nprovisioner: example.com/none\n",
        &[],
    );
    c.apply(&volume_in(host.path(), "later-vol", "later"), &[]);
    wait_for(
        &c,
        "claim not given the default class and bound",
        Duration::from_secs(40),
        || {
            let pvc = c.get_opt(&["pvc", "late"]);
            pvc.is_some_and(|p| p["spec"]["storageClassName"] == "later" && p["status"]["phase"] == "Bound")
        },
    );
    assert_eq!(
        c.get_opt(&["pvc", "late"]).expect("claim")["spec"]["volumeName"],
        "later-vol"
    );
}
