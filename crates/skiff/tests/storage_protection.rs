//! Storage object in-use protection and claim lifecycle end to end, with the real kubectl and a
//! real node (Docker, the local `busybox:latest` image): a claim a running pod uses and a volume
//! bound to a claim stay `Terminating` until nothing uses them; StatefulSets' claims follow
//! `persistentVolumeClaimRetentionPolicy` through scale-down, scale-up, foreground and background
//! deletion; a namespace whose claim a pod uses deletes fully. Volumes are hostPath volumes in
//! temporary directories; claims name their class (or none) so no default class is involved.
//! Containers and directories are removed afterwards.

mod common;

use std::path::Path;
use std::time::Duration;

use common::node::Node;
use common::{Cluster, eventually, tail};
use serde_json::Value;

const PVC_FINALIZER: &str = "kubernetes.io/pvc-protection";
const PV_FINALIZER: &str = "kubernetes.io/pv-protection";

fn host_path_pv(name: &str, class: &str, dir: &Path, claim_ref: Option<(&str, &str)>) -> String {
    let claim_ref = claim_ref
        .map(|(ns, claim)| format!("  claimRef:\n    namespace: {ns}\n    name: {claim}\n"))
        .unwrap_or_default();
    format!(
        r#"
apiVersion: v1
kind: PersistentVolume
metadata:
  name: {name}
spec:
  storageClassName: "{class}"
  capacity:
    storage: 1Gi
  accessModes:
  - ReadWriteOnce
  persistentVolumeReclaimPolicy: Retain
  hostPath:
    path: "{}"
{claim_ref}"#,
        dir.join(name).display()
    )
}

fn claim(name: &str, class: &str) -> String {
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
      storage: 1Gi
"#
    )
}

fn pod_with_claim(name: &str, claim: &str) -> String {
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
    command: ["sh", "-c", "sleep 3600"]
    volumeMounts:
    - name: store
      mountPath: /data
  volumes:
  - name: store
    persistentVolumeClaim:
      claimName: {claim}
"#
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
  volumeClaimTemplates:
  - metadata:
      name: data
    spec:
      storageClassName: ""
      accessModes: ["ReadWriteOnce"]
      resources:
        requests:
          storage: 1Gi
"#
    )
}

/// `kubectl get KIND NAME -o json`, or None once it is gone.
fn get(c: &Cluster, args: &[&str]) -> Option<Value> {
    let out = c.kubectl(&[&["get"], args, &["-o", "json"]].concat());
    if out.status.success() {
        return serde_json::from_slice(&out.stdout).ok();
    }
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("NotFound"), "kubectl get {args:?}: {err}");
    None
}

fn wait_gone(c: &Cluster, args: &[&str], timeout: Duration) {
    let gone = eventually(timeout, || get(c, args).is_none().then_some(()));
    assert!(
        gone.is_some(),
        "{args:?} still there:\n{}\n{}",
        c.k(&[&["get"], args, &["-o", "yaml"]].concat()),
        tail(&c.log(), 40)
    );
}

fn wait_for(c: &Cluster, what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let ok = eventually(timeout, || f().then_some(()));
    assert!(
        ok.is_some(),
        "{what}:\n{}\n{}",
        c.k(&["get", "pods,pvc,pv", "-o", "wide"]),
        tail(&c.log(), 40)
    );
}

fn finalizers(v: &Value) -> Vec<String> {
    v["metadata"]["finalizers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f.as_str().map(str::to_string))
        .collect()
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

fn phase(v: &Option<Value>) -> String {
    v.as_ref()
        .and_then(|v| v["status"]["phase"].as_str())
        .unwrap_or_default()
        .to_string()
}

fn first_row(out: &str) -> Vec<String> {
    out.lines()
        .nth(1)
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

fn header(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

#[test]
fn a_claim_in_use_and_a_bound_volume_wait_for_their_users() {
    let n = Node::start("protect", &[]);
    let c = &n.c;
    let host = tempfile::tempdir().expect("host dir");

    c.apply(&host_path_pv("protected-vol", "manual", host.path(), None), &[]);
    c.apply(&claim("data", "manual"), &[]);
    wait_for(c, "claim not Bound", Duration::from_secs(30), || {
        phase(&get(c, &["pvc", "data"])) == "Bound"
    });
    // Both carry the finalizer the admission plugin adds.
    let pvc = get(c, &["pvc", "data"]).expect("claim");
    assert_eq!(finalizers(&pvc), [PVC_FINALIZER]);
    let pv = get(c, &["pv", "protected-vol"]).expect("volume");
    assert_eq!(finalizers(&pv), [PV_FINALIZER]);

    c.apply(&pod_with_claim("user", "data"), &[]);
    n.wait_running("user");

    // Deleting the claim a running pod uses only marks it.
    let out = c.k(&["delete", "pvc", "data", "--wait=false"]);
    assert_eq!(out.trim(), "persistentvolumeclaim \"data\" deleted");
    std::thread::sleep(Duration::from_secs(3));
    let pvc = get(c, &["pvc", "data"]).expect("claim kept while its pod runs");
    assert!(pvc["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(finalizers(&pvc), [PVC_FINALIZER]);
    let row = first_row(&c.k(&["get", "pvc", "data"]));
    assert_eq!(
        row[..6],
        ["data", "Terminating", "protected-vol", "1Gi", "RWO", "manual"]
    );

    // A volume bound to a claim is kept too, while the claim is there.
    c.k(&["delete", "pv", "protected-vol", "--wait=false"]);
    std::thread::sleep(Duration::from_secs(2));
    let pv = get(c, &["pv", "protected-vol"]).expect("volume kept while bound");
    assert_eq!(finalizers(&pv), [PV_FINALIZER]);
    assert_eq!(phase(&Some(pv)), "Bound");

    // Both tables as upstream prints them.
    let out = c.k(&["get", "pv,pvc"]);
    let mut tables = out.split("\n\n");
    let pv_table = tables.next().unwrap_or_default();
    let pvc_table = tables.next().unwrap_or_default();
    assert_eq!(
        header(pv_table.lines().next().unwrap_or_default()),
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
        ],
        "{out}"
    );
    assert_eq!(
        first_row(pv_table)[..8],
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
    assert_eq!(
        header(pvc_table.lines().next().unwrap_or_default()),
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
        ],
        "{out}"
    );
    assert_eq!(first_row(pvc_table)[1], "Terminating", "{out}");
    let wide = c.k(&["get", "pvc", "-o", "wide"]);
    assert_eq!(
        header(wide.lines().next().unwrap_or_default()).last(),
        Some(&"VOLUMEMODE"),
        "{wide}"
    );

    // The pod goes: then the claim, then the volume (released by the binder, no longer Bound).
    c.k(&["delete", "pod", "user"]);
    wait_gone(c, &["pvc", "data"], Duration::from_secs(30));
    wait_gone(c, &["pv", "protected-vol"], Duration::from_secs(30));
}

#[test]
fn statefulset_claims_go_with_the_set_when_deleted_delete() {
    let n = Node::start("sts-del", &[]);
    let c = &n.c;
    let host = tempfile::tempdir().expect("host dir");
    for i in 0..3 {
        c.apply(&host_path_pv(&format!("vol-{i}"), "", host.path(), None), &[]);
    }

    // Retain (the default): the claims belong to nobody.
    c.apply(&stateful_set("web", 2, "Retain", "Retain"), &[]);
    wait_for(c, "web not rolled out", Duration::from_secs(90), || {
        let sts = get(c, &["sts", "web"]);
        sts.is_some_and(|s| s["status"]["readyReplicas"] == 2)
    });
    for claim in ["data-web-0", "data-web-1"] {
        let pvc = get(c, &["pvc", claim]).expect("claim");
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
        ["data-web-0", "data-web-1"]
            .iter()
            .all(|claim| get(c, &["pvc", claim]).is_some_and(|p| owners(&p) == ["StatefulSet/web"]))
    });

    // whenScaled Retain: scaling down keeps the claim, still the set's.
    c.k(&["scale", "sts", "web", "--replicas=1"]);
    wait_gone(c, &["pod", "web-1"], Duration::from_secs(30));
    let pvc = get(c, &["pvc", "data-web-1"]).expect("claim kept on scale-down");
    assert_eq!(owners(&pvc), ["StatefulSet/web"]);

    // Foreground deletion: the set goes last, after its pods and claims.
    c.k(&["delete", "sts", "web", "--cascade=foreground", "--timeout=120s"]);
    assert!(get(c, &["sts", "web"]).is_none());
    assert!(get(c, &["pod", "web-0"]).is_none());
    wait_gone(c, &["pvc", "data-web-0"], Duration::from_secs(10));
    wait_gone(c, &["pvc", "data-web-1"], Duration::from_secs(10));
    // Their volumes (whichever two the claims were bound to) are released.
    wait_for(c, "volumes not released", Duration::from_secs(30), || {
        ["vol-0", "vol-1", "vol-2"]
            .iter()
            .filter(|v| phase(&get(c, &["pv", v])) == "Released")
            .count()
            == 2
    });

    // Background deletion (kubectl's default): the garbage collector removes the claims once the
    // pods that use them are gone.
    c.apply(&stateful_set("api", 1, "Delete", "Retain"), &[]);
    n.wait_running("api-0");
    let pvc = get(c, &["pvc", "data-api-0"]).expect("claim");
    assert_eq!(owners(&pvc), ["StatefulSet/api"]);
    c.k(&["delete", "sts", "api"]);
    wait_gone(c, &["pod", "api-0"], Duration::from_secs(30));
    wait_gone(c, &["pvc", "data-api-0"], Duration::from_secs(30));
}

#[test]
fn statefulset_claims_go_with_condemned_pods_when_scaled_delete() {
    let n = Node::start("sts-scale", &[]);
    let c = &n.c;
    let host = tempfile::tempdir().expect("host dir");
    for i in 0..4 {
        c.apply(&host_path_pv(&format!("vol-{i}"), "", host.path(), None), &[]);
    }

    c.apply(&stateful_set("db", 2, "Retain", "Delete"), &[]);
    wait_for(c, "db not rolled out", Duration::from_secs(90), || {
        get(c, &["sts", "db"]).is_some_and(|s| s["status"]["readyReplicas"] == 2)
    });
    let first = get(c, &["pvc", "data-db-1"]).expect("claim");
    // In range, with whenDeleted Retain: nobody owns them.
    assert!(owners(&first).is_empty(), "{first}");

    // Scaling down: the condemned pod's claim becomes the pod's, and goes with it.
    c.k(&["scale", "sts", "db", "--replicas=1"]);
    wait_gone(c, &["pod", "db-1"], Duration::from_secs(30));
    wait_gone(c, &["pvc", "data-db-1"], Duration::from_secs(30));
    let kept = get(c, &["pvc", "data-db-0"]).expect("the remaining pod's claim");
    assert!(owners(&kept).is_empty());

    // Scaling back up creates a fresh claim for the ordinal.
    c.k(&["scale", "sts", "db", "--replicas=2"]);
    n.wait_running("db-1");
    let fresh = get(c, &["pvc", "data-db-1"]).expect("a new claim");
    assert_ne!(fresh["metadata"]["uid"], first["metadata"]["uid"]);
    assert_eq!(phase(&Some(fresh)), "Bound");

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
    assert!(get(c, &["pod", "db-1"]).is_none());
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
    wait_gone(c, &["pod", "db-0"], Duration::from_secs(30));
    wait_gone(c, &["pod", "db-1"], Duration::from_secs(30));
    for claim in ["data-db-0", "data-db-1"] {
        let pvc = get(c, &["pvc", claim]).expect("claim kept");
        assert!(owners(&pvc).is_empty());
        assert_eq!(phase(&Some(pvc)), "Bound");
    }
}

#[test]
fn a_namespace_with_a_claim_in_use_deletes_fully() {
    let n = Node::start("ns-claim", &[]);
    let c = &n.c;
    let host = tempfile::tempdir().expect("host dir");
    c.k(&["create", "namespace", "shop"]);
    c.apply(
        &host_path_pv("shop-vol", "manual", host.path(), Some(("shop", "data"))),
        &[],
    );
    c.apply(&claim("data", "manual"), &["-n", "shop"]);
    c.apply(&pod_with_claim("user", "data"), &["-n", "shop"]);
    wait_for(c, "pod not Running", Duration::from_secs(60), || {
        get(c, &["pod", "user", "-n", "shop"]).is_some_and(|p| p["status"]["phase"] == "Running")
    });

    c.k(&["delete", "namespace", "shop", "--timeout=120s"]);
    assert!(get(c, &["namespace", "shop"]).is_none());
    wait_for(c, "volume not released", Duration::from_secs(30), || {
        phase(&get(c, &["pv", "shop-vol"])) == "Released"
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
    let pvc = get(&c, &["pvc", "late"]).expect("claim");
    assert!(pvc["spec"]["storageClassName"].is_null(), "{pvc}");

    // A default class and a volume of it appear: the binder gives the claim the class, then binds.
    let host = tempfile::tempdir().expect("host dir");
    c.apply(
        "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata:\n  name: later\n  annotations:\n    storageclass.kubernetes.io/is-default-class: \"true\"\nprovisioner: example.com/none\n",
        &[],
    );
    c.apply(&host_path_pv("later-vol", "later", host.path(), None), &[]);
    wait_for(
        &c,
        "claim not given the default class and bound",
        Duration::from_secs(40),
        || {
            let pvc = get(&c, &["pvc", "late"]);
            pvc.as_ref().is_some_and(|p| p["spec"]["storageClassName"] == "later") && phase(&pvc) == "Bound"
        },
    );
    assert_eq!(
        get(&c, &["pvc", "late"]).expect("claim")["spec"]["volumeName"],
        "later-vol"
    );
}
