//! The scheduler's volume plugins end to end, with the real kubectl and a real node (Docker, the
//! local `busybox:latest` image): a pod waits, with upstream's FailedScheduling message, while its
//! claim cannot be bound and runs once a volume appears; a WaitForFirstConsumer claim is bound by
//! the scheduler to a `local` volume of the node it picks; a ReadWriteOncePod claim serves one pod
//! at a time. Containers and host directories are removed afterwards.

#![cfg(test)]

mod common;

use std::time::Duration;

use common::node::Node;
use common::storage::{claim_phase, claim_ref, host_path_pv, pod_with_claim, wait_claim_phase, wait_file};
use common::{Cluster, eventually, tail};

/// The messages of the pod's FailedScheduling events.
fn failed_scheduling(c: &Cluster, pod: &str) -> Vec<String> {
    c.events("Pod", pod)
        .into_iter()
        .filter(|(_, r, _)| r == "FailedScheduling")
        .map(|(_, _, m)| m)
        .collect()
}

/// Waits for a FailedScheduling event with exactly `message`, and for `kubectl describe` to
/// show it; the pod is still Pending and not bound.
fn wait_failed_scheduling(c: &Cluster, pod: &str, message: &str) {
    let ok = eventually(Duration::from_secs(30), || {
        failed_scheduling(c, pod).iter().any(|m| m == message).then_some(())
    });
    assert!(
        ok.is_some(),
        "no FailedScheduling {message:?} for {pod}: {:?}\n{}",
        failed_scheduling(c, pod),
        tail(&c.log(), 30)
    );
    let describe = c.k(&["describe", "pod", pod]);
    assert!(describe.contains(message), "{describe}");
    assert_eq!(c.k(&["get", "pod", pod, "-o", "jsonpath={.status.phase}"]), "Pending");
    assert_eq!(c.k(&["get", "pod", pod, "-o", "jsonpath={.spec.nodeName}"]), "");
    let cond = c.k(&[
        "get",
        "pod",
        pod,
        "-o",
        "jsonpath={.status.conditions[?(@.type==\"PodScheduled\")].reason}",
    ]);
    assert_eq!(cond, "Unschedulable");
}

/// A claim of 100Mi.
fn claim(name: &str, class: &str, mode: &str) -> String {
    common::storage::claim(name, Some(class), mode, "100Mi")
}

/// A `local` volume that only node `node` can use.
fn local_pv(name: &str, class: &str, path: &str, node: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: PersistentVolume
metadata:
  name: {name}
spec:
  storageClassName: {class}
  capacity:
    storage: 1Gi
  accessModes: [ReadWriteOnce]
  local:
    path: "{path}"
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions:
        - key: kubernetes.io/hostname
          operator: In
          values: [{node}]
"#
    )
}

#[test]
fn pods_wait_for_their_claims_to_bind_then_run() {
    let n = Node::start("vs-imm", &[]);
    let c = &n.c;
    let host = tempfile::tempdir().expect("host dir");

    // A claim that does not exist.
    c.apply(&pod_with_claim("orphan", "missing", "sleep 3600"), &[]);
    wait_failed_scheduling(
        c,
        "orphan",
        "0/1 nodes are available: persistentvolumeclaim \"missing\" not found. preemption: 0/1 nodes are \
         available: 1 Preemption is not helpful for scheduling.",
    );

    // A claim of a class that binds immediately (no StorageClass object: the PV binder binds it)
    // with no volume for it.
    c.apply(&claim("data", "manual", "ReadWriteOnce"), &[]);
    c.apply(
        &pod_with_claim("writer", "data", "echo written > /data/out.txt && sleep 3600"),
        &[],
    );
    let unbound = "0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims. preemption: 0/1 \
                   nodes are available: 1 Preemption is not helpful for scheduling.";
    wait_failed_scheduling(c, "writer", unbound);
    // Creating the missing claim moves the orphan on to the next reason (its class has no
    // volume, so it stays unbound).
    c.apply(&claim("missing", "other", "ReadWriteOnce"), &[]);
    wait_failed_scheduling(c, "orphan", unbound);

    // A volume appears: the binder binds the claim, the scheduler places the pod with it.
    let dir = host.path().join("data");
    c.apply(
        &host_path_pv("data-pv", "manual", "ReadWriteOnce", "1Gi", &dir.display().to_string()),
        &[],
    );
    n.wait_running("writer");
    assert_eq!(n.field("writer", ".spec.nodeName"), n.name);
    assert_eq!(claim_phase(c, "data"), "Bound");
    wait_file(&dir.join("out.txt"), "written\n");
    let scheduled = c.event_messages("involvedObject.name=writer,reason=Scheduled");
    assert!(
        scheduled.contains(&format!("Successfully assigned default/writer to {}", n.name)),
        "{scheduled}"
    );

    // The orphan's claim stays unbound (the volume is taken): it is still waiting.
    assert_eq!(c.k(&["get", "pod", "orphan", "-o", "jsonpath={.spec.nodeName}"]), "");
}

#[test]
fn wait_for_first_consumer_claims_bind_to_a_local_volume_of_the_node() {
    let n = Node::start("vs-wffc", &[]);
    let c = &n.c;
    let host = tempfile::tempdir().expect("host dir");
    let local = host.path().join("local-1");
    std::fs::create_dir_all(&local).expect("local volume dir");
    c.apply(
        r#"
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: local-storage
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
"#,
        &[],
    );
    // One volume on this node, one on a node that does not exist.
    c.apply(
        &local_pv("local-here", "local-storage", &local.display().to_string(), &n.name),
        &[],
    );
    c.apply(
        &local_pv("local-elsewhere", "local-storage", "/nonexistent", "no-such-node"),
        &[],
    );
    c.apply(&claim("wdata", "local-storage", "ReadWriteOnce"), &[]);
    // The binder leaves it to the first consumer.
    let waiting = eventually(Duration::from_secs(30), || {
        c.event_messages("involvedObject.name=wdata,reason=WaitForFirstConsumer")
            .contains("waiting for first consumer to be created before binding")
            .then_some(())
    });
    assert!(waiting.is_some(), "{}", c.k(&["describe", "pvc", "wdata"]));
    assert_eq!(claim_phase(c, "wdata"), "Pending");

    c.apply(
        &pod_with_claim("consumer", "wdata", "echo local > /data/out.txt && sleep 3600"),
        &[],
    );
    n.wait_running("consumer");
    assert_eq!(
        c.k(&["get", "pvc", "wdata", "-o", "jsonpath={.spec.volumeName}"]),
        "local-here"
    );
    assert_eq!(claim_phase(c, "wdata"), "Bound");
    let pv = c.get_json(&["pv", "local-here"]);
    assert_eq!(pv["spec"]["claimRef"]["name"], "wdata");
    assert_eq!(
        pv["spec"]["claimRef"]["uid"],
        c.get_json(&["pvc", "wdata"])["metadata"]["uid"]
    );
    assert_eq!(
        pv["metadata"]["annotations"]["pv.kubernetes.io/bound-by-controller"],
        "yes"
    );
    assert_eq!(pv["status"]["phase"], "Bound");
    wait_file(&local.join("out.txt"), "local\n");
    assert_eq!(c.k(&["exec", "consumer", "--", "cat", "/data/out.txt"]), "local\n");
    // The volume on the other node was left alone.
    assert!(c.get_json(&["pv", "local-elsewhere"])["spec"]["claimRef"].is_null());

    // A second claim: only the other node's volume is left, so no node fits.
    c.apply(&claim("more", "local-storage", "ReadWriteOnce"), &[]);
    c.apply(
        &pod_with_claim("second", "more", "echo second > /data/out.txt && sleep 3600"),
        &[],
    );
    wait_failed_scheduling(
        c,
        "second",
        "0/1 nodes are available: 1 node(s) didn't find available persistent volumes to bind. preemption: 0/1 \
         nodes are available: 1 Preemption is not helpful for scheduling.",
    );
    // A new volume on this node lets it run.
    let local2 = host.path().join("local-2");
    std::fs::create_dir_all(&local2).expect("second local volume dir");
    c.apply(
        &local_pv("local-here-2", "local-storage", &local2.display().to_string(), &n.name),
        &[],
    );
    n.wait_running("second");
    assert_eq!(
        c.k(&["get", "pvc", "more", "-o", "jsonpath={.spec.volumeName}"]),
        "local-here-2"
    );
    wait_file(&local2.join("out.txt"), "second\n");

    // A bound claim whose volume belongs to another node.
    c.apply(
        &(local_pv("far-pv", "", "/nonexistent", "no-such-node") + &claim_ref("default", "far")),
        &[],
    );
    c.apply(&claim("far", "", "ReadWriteOnce"), &[]);
    wait_claim_phase(c, "far", "Bound");
    c.apply(&pod_with_claim("stranded", "far", "sleep 3600"), &[]);
    wait_failed_scheduling(
        c,
        "stranded",
        "0/1 nodes are available: 1 node(s) had volume node affinity conflict. preemption: 0/1 nodes are \
         available: 1 Preemption is not helpful for scheduling.",
    );
}

#[test]
fn a_read_write_once_pod_claim_serves_one_pod() {
    let n = Node::start("vs-rwop", &[]);
    let c = &n.c;
    let host = tempfile::tempdir().expect("host dir");
    let dir = host.path().join("single");
    c.apply(
        &host_path_pv(
            "single-pv",
            "manual",
            "ReadWriteOncePod",
            "1Gi",
            &dir.display().to_string(),
        ),
        &[],
    );
    c.apply(&claim("single", "manual", "ReadWriteOncePod"), &[]);
    wait_claim_phase(c, "single", "Bound");

    c.apply(
        &pod_with_claim("first", "single", "echo first > /data/who && sleep 3600"),
        &[],
    );
    n.wait_running("first");
    c.apply(
        &pod_with_claim("second", "single", "echo second > /data/who && sleep 3600"),
        &[],
    );
    wait_failed_scheduling(
        c,
        "second",
        "0/1 nodes are available: 1 node has pod using PersistentVolumeClaim with the same name and \
         ReadWriteOncePod access mode. preemption: 0/1 nodes are available: 1 No preemption victims found for \
         incoming pod.",
    );
    wait_file(&dir.join("who"), "first\n");

    // The first pod goes: the second gets the claim.
    c.k(&["delete", "pod", "first"]);
    n.wait_running("second");
    wait_file(&dir.join("who"), "second\n");
}
