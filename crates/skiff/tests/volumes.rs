//! PersistentVolumes and PersistentVolumeClaims end to end with the real kubectl: the binder
//! controller alone (`--no-agent`), and a hostPath volume whose data outlives the pods that use it
//! on a real node (Docker, the local `busybox:latest` image). Containers and the host directory
//! are removed afterwards.

#![cfg(test)]

mod common;

use std::time::Duration;

use common::Cluster;
use common::node::Node;
use common::storage::{
    PV_HEADER, PVC_HEADER, claim, claim_phase, claim_ref, host_path_pv, on_node, pod_with_claim, read_only,
    volume_phase, wait_claim_phase, wait_file, wait_volume_phase,
};
use serde_json::Value;

#[test]
fn claims_wait_for_a_matching_volume_then_bind_and_release() {
    let c = Cluster::start(&["--no-agent"]);

    // No volume at all: Pending, with upstream's events for a class and for no class.
    c.apply(&claim("data", Some("manual"), "ReadWriteOnce", "500Mi"), &[]);
    c.apply(&claim("classless", Some(""), "ReadWriteOnce", "1Gi"), &[]);
    c.wait_event_containing(
        "PersistentVolumeClaim",
        "data",
        "ProvisioningFailed",
        "storageclass.storage.k8s.io \"manual\" not found",
    );
    c.wait_event_containing(
        "PersistentVolumeClaim",
        "classless",
        "FailedBinding",
        "no persistent volumes available for this claim and no storage class is set",
    );
    assert_eq!(claim_phase(&c, "data"), "Pending");
    assert_eq!(claim_phase(&c, "classless"), "Pending");

    // Volumes that do not satisfy the claim: too small, other class, other access mode.
    c.apply(
        &host_path_pv("small", "manual", "ReadWriteOnce", "100Mi", "/tmp/skiff-e2e-small"),
        &[],
    );
    c.apply(
        &host_path_pv("other-class", "fast", "ReadWriteOnce", "1Gi", "/tmp/skiff-e2e-other"),
        &[],
    );
    c.apply(
        &host_path_pv("rox", "manual", "ReadOnlyMany", "1Gi", "/tmp/skiff-e2e-rox"),
        &[],
    );
    wait_volume_phase(&c, "small", "Available");
    wait_volume_phase(&c, "other-class", "Available");
    wait_volume_phase(&c, "rox", "Available");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(claim_phase(&c, "data"), "Pending");

    // One that does.
    c.apply(
        &host_path_pv("fits", "manual", "ReadWriteOnce", "1Gi", "/tmp/skiff-e2e-fits"),
        &[],
    );
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
    let pv_ref = &pv["spec"]["claimRef"];
    assert_eq!(pv_ref["kind"], "PersistentVolumeClaim");
    assert_eq!(pv_ref["namespace"], "default");
    assert_eq!(pv_ref["name"], "data");
    assert_eq!(pv_ref["uid"], pvc["metadata"]["uid"]);
    assert_eq!(
        pv["metadata"]["annotations"]["pv.kubernetes.io/bound-by-controller"],
        "yes"
    );

    // Of two that would do, the smaller one is chosen.
    c.apply(
        &host_path_pv("big", "manual", "ReadWriteOnce", "5Gi", "/tmp/skiff-e2e-big"),
        &[],
    );
    c.apply(
        &host_path_pv("medium", "manual", "ReadWriteOnce", "2Gi", "/tmp/skiff-e2e-medium"),
        &[],
    );
    wait_volume_phase(&c, "big", "Available");
    wait_volume_phase(&c, "medium", "Available");
    c.apply(&claim("more", Some("manual"), "ReadWriteOnce", "1500Mi"), &[]);
    wait_claim_phase(&c, "more", "Bound");
    assert_eq!(
        c.k(&["get", "pvc", "more", "-o", "jsonpath={.spec.volumeName}"]),
        "medium"
    );
    assert_eq!(volume_phase(&c, "big"), "Available");

    // The printed columns.
    let out = c.k(&["get", "pvc", "data"]);
    let header: Vec<&str> = out.lines().next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(header, PVC_HEADER);
    let row: Vec<&str> = out.lines().nth(1).unwrap_or_default().split_whitespace().collect();
    assert_eq!(row[..7], ["data", "Bound", "fits", "1Gi", "RWO", "manual", "<unset>"]);
    let out = c.k(&["get", "pv", "fits"]);
    let header: Vec<&str> = out.lines().next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(header, PV_HEADER);
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
            "{}{}",
            host_path_pv(
                "for-reserved",
                "manual",
                "ReadWriteOnce",
                "10Gi",
                "/tmp/skiff-e2e-reserved"
            ),
            claim_ref("default", "reserved")
        ),
        &[],
    );
    wait_volume_phase(&c, "for-reserved", "Available");
    c.apply(&claim("reserved", Some("manual"), "ReadWriteOnce", "1Gi"), &[]);
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
        &format!(
            "{}  volumeName: small\n",
            claim("named", Some("manual"), "ReadWriteOnce", "1Gi")
        ),
        &[],
    );
    c.wait_event_containing(
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
    c.apply(&claim("data", Some("manual"), "ReadWriteOnce", "500Mi"), &[]);
    wait_claim_phase(&c, "data", "Bound");
    assert_eq!(c.k(&["get", "pvc", "data", "-o", "jsonpath={.spec.volumeName}"]), "big");
    assert_eq!(volume_phase(&c, "fits"), "Released");
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
        ),
        &[],
    );
    c.wait_event_containing(
        "Pod",
        "writer",
        "FailedScheduling",
        "0/1 nodes are available: persistentvolumeclaim \"task-pv-claim\" not found.",
    );
    // One put on the node directly (no scheduler) waits in the agent, saying why, and is retried.
    c.apply(
        &on_node(&pod_with_claim("pinned", "task-pv-claim", "sleep 3600"), &n.name),
        &[],
    );
    c.wait_event_containing(
        "Pod",
        "pinned",
        "FailedMount",
        "error processing PVC default/task-pv-claim: failed to fetch PVC from API server: \
         persistentvolumeclaims \"task-pv-claim\" not found",
    );
    let failed: Vec<String> = c
        .events("Pod", "pinned")
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
    c.apply(&claim("task-pv-claim", Some("manual"), "ReadWriteOnce", "500Mi"), &[]);
    c.wait_event_containing(
        "Pod",
        "pinned",
        "FailedMount",
        "error processing PVC default/task-pv-claim: PVC is not bound",
    );
    c.wait_event_containing(
        "Pod",
        "writer",
        "FailedScheduling",
        "0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims.",
    );
    assert_eq!(c.k(&["get", "pod", "writer", "-o", "jsonpath={.spec.nodeName}"]), "");

    // The volume: its directory does not exist yet and is created on first use.
    c.apply(
        &host_path_pv("task-pv-volume", "manual", "ReadWriteOnce", "1Gi", &data),
        &[],
    );
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
    wait_file(&data_dir.join("out.txt"), "written-by-writer\n");

    n.wait_running("pinned");
    c.k(&["delete", "pod", "pinned"]);

    // The pod goes, the data stays.
    c.k(&["delete", "pod", "writer"]);
    assert_eq!(
        std::fs::read_to_string(data_dir.join("out.txt")).expect("data kept"),
        "written-by-writer\n"
    );

    // A second pod reads it back, through a read-only mount.
    c.apply(
        &read_only(&pod_with_claim("reader", "task-pv-claim", "sleep 3600")),
        &[],
    );
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

#[test]
fn volumes_the_node_cannot_serve_wait_with_failed_mount() {
    let n = Node::start("nomount", &[]);
    let c = &n.c;
    let host = tempfile::tempdir().expect("host dir");
    let file = host.path().join("not-a-socket");
    std::fs::write(&file, b"").expect("a regular file");
    let socket = host.path().join("app.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).expect("a socket");
    let pod = |name: &str, volume: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  nodeName: {node}\n  containers:\n  - name: c\n    image: busybox:latest\n    command: [\"sleep\", \"3600\"]\n    volumeMounts:\n    - name: v\n      mountPath: /v\n  volumes:\n  - name: v\n{volume}",
            node = n.name
        )
    };
    // A kind of volume this node has no plugin for: never an empty directory in its place.
    c.apply(
        &pod("nfs", "    nfs:\n      server: 127.0.0.1\n      path: /exports\n"),
        &[],
    );
    c.wait_event_containing(
        "Pod",
        "nfs",
        "FailedMount",
        "Unable to attach or mount volumes: unmounted volumes=[v], unattached volumes=[], failed to process \
         volumes=[v]: failed to get Plugin from volumeSpec for volume \"v\" err=no volume plugin matched",
    );
    // hostPath types are checked as upstream's plugin checks them.
    c.apply(
        &pod(
            "wrong-type",
            &format!("    hostPath:\n      path: {}\n      type: Socket\n", file.display()),
        ),
        &[],
    );
    c.wait_event_containing(
        "Pod",
        "wrong-type",
        "FailedMount",
        &format!(
            "MountVolume.SetUp failed for volume \"v\" : hostPath type check failed: {} is not a socket file, it's a File",
            file.display()
        ),
    );
    c.apply(
        &pod(
            "missing",
            &format!(
                "    hostPath:\n      path: {}\n      type: CharDevice\n",
                host.path().join("nothing").display()
            ),
        ),
        &[],
    );
    c.wait_event_containing(
        "Pod",
        "missing",
        "FailedMount",
        &format!(
            "MountVolume.SetUp failed for volume \"v\" : hostPath {} doesn't exist",
            host.path().join("nothing").display()
        ),
    );
    for waiting in ["nfs", "wrong-type", "missing"] {
        assert_eq!(
            c.k(&["get", "pod", waiting, "-o", "jsonpath={.status.phase}"]),
            "Pending"
        );
        let reason = c.k(&[
            "get",
            "pod",
            waiting,
            "-o",
            "jsonpath={.status.containerStatuses[0].state.waiting.reason}",
        ]);
        assert!(
            reason.is_empty() || reason == "ContainerCreating",
            "{waiting}: {reason}"
        );
    }
    // The right types mount.
    c.apply(
        &pod(
            "socket",
            &format!("    hostPath:\n      path: {}\n      type: Socket\n", socket.display()),
        ),
        &[],
    );
    c.apply(
        &pod(
            "dev-null",
            "    hostPath:\n      path: /dev/null\n      type: CharDevice\n",
        ),
        &[],
    );
    n.wait_running("socket");
    n.wait_running("dev-null");
    c.k(&["delete", "pod", "--all", "--wait=false"]);
}
