//! Storage objects for the storage tests: claims, hostPath volumes and busybox pods using a claim
//! as YAML, and the claims' and volumes' phases.

use std::path::Path;
use std::time::Duration;

use super::{Cluster, eventually, tail};

/// The columns of `kubectl get storageclass`, `kubectl get pv` and `kubectl get pvc`, split at
/// white space.
pub const STORAGECLASS_HEADER: [&str; 6] = [
    "NAME",
    "PROVISIONER",
    "RECLAIMPOLICY",
    "VOLUMEBINDINGMODE",
    "ALLOWVOLUMEEXPANSION",
    "AGE",
];
pub const PV_HEADER: [&str; 12] = [
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
    "AGE",
];
pub const PVC_HEADER: [&str; 9] = [
    "NAME",
    "STATUS",
    "VOLUME",
    "CAPACITY",
    "ACCESS",
    "MODES",
    "STORAGECLASS",
    "VOLUMEATTRIBUTESCLASS",
    "AGE",
];

/// A claim of `size` with access mode `mode`; `class` sets `storageClassName` (`Some("")` asks
/// for no class; `None` leaves it to the default class).
pub fn claim(name: &str, class: Option<&str>, mode: &str, size: &str) -> String {
    let class = class
        .map(|c| format!("  storageClassName: \"{c}\"\n"))
        .unwrap_or_default();
    format!(
        r#"
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: {name}
spec:
{class}  accessModes: [{mode}]
  resources:
    requests:
      storage: {size}
"#
    )
}

/// A hostPath volume at `path` of class `class` ("" for none), `size` and access mode `mode`.
pub fn host_path_pv(name: &str, class: &str, mode: &str, size: &str, path: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: PersistentVolume
metadata:
  name: {name}
spec:
  storageClassName: "{class}"
  capacity:
    storage: {size}
  accessModes: [{mode}]
  hostPath:
    path: "{path}"
"#
    )
}

/// A StatefulSet's `volumeClaimTemplates` with one ReadWriteOnce claim `name` of 1Gi (`class` as
/// in [`claim`]), to append to a StatefulSet's YAML whose spec ends with its template.
pub fn claim_template(name: &str, class: Option<&str>) -> String {
    let class = class
        .map(|c| format!("      storageClassName: \"{c}\"\n"))
        .unwrap_or_default();
    format!(
        r#"  volumeClaimTemplates:
  - metadata:
      name: {name}
    spec:
{class}      accessModes: ["ReadWriteOnce"]
      resources:
        requests:
          storage: 1Gi
"#
    )
}

/// The `claimRef` that pre-binds a volume to claim `namespace/name`, to append to a volume's YAML.
pub fn claim_ref(namespace: &str, name: &str) -> String {
    format!("  claimRef:\n    namespace: {namespace}\n    name: {name}\n")
}

/// A busybox pod running `sh -c COMMAND` with claim `claim` mounted at /data.
pub fn pod_with_claim(name: &str, claim: &str, command: &str) -> String {
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
"#
    )
}

/// `pod` (from [`pod_with_claim`]) put on node `node` directly, as the scheduler would bind it.
pub fn on_node(pod: &str, node: &str) -> String {
    assert!(pod.contains("\nspec:\n"), "{pod}");
    pod.replacen("\nspec:\n", &format!("\nspec:\n  nodeName: {node}\n"), 1)
}

/// `pod` (from [`pod_with_claim`], which ends with the claim's source) with its claim mounted
/// read-only.
pub fn read_only(pod: &str) -> String {
    assert!(
        pod.lines().last().is_some_and(|l| l.starts_with("      claimName: ")),
        "{pod}"
    );
    format!("{pod}      readOnly: true\n")
}

/// The phase of `kind` (`pvc` or `pv`) `name`.
fn phase(c: &Cluster, kind: &str, name: &str) -> String {
    c.k(&["get", kind, name, "-o", "jsonpath={.status.phase}"])
}

pub fn claim_phase(c: &Cluster, name: &str) -> String {
    phase(c, "pvc", name)
}

pub fn volume_phase(c: &Cluster, name: &str) -> String {
    phase(c, "pv", name)
}

/// Waits (30 s at most) for `kind` (`pvc` or `pv`) `name` to be in phase `want`.
fn wait_phase(c: &Cluster, kind: &str, name: &str, want: &str) {
    let ok = eventually(Duration::from_secs(30), || (phase(c, kind, name) == want).then_some(()));
    assert!(
        ok.is_some(),
        "{kind} {name} not {want}:\n{}\n{}",
        c.k(&["describe", kind, name]),
        tail(&c.log(), 30)
    );
}

/// Waits (30 s at most) for the claim to be in `phase`.
pub fn wait_claim_phase(c: &Cluster, name: &str, phase: &str) {
    wait_phase(c, "pvc", name, phase);
}

/// Waits (30 s at most) for the volume to be in `phase`.
pub fn wait_volume_phase(c: &Cluster, name: &str, phase: &str) {
    wait_phase(c, "pv", name, phase);
}

/// Waits (30 s at most) for the file on the host to hold `want`.
pub fn wait_file(path: &Path, want: &str) {
    let got = eventually(Duration::from_secs(30), || {
        std::fs::read_to_string(path).ok().filter(|s| s == want)
    });
    assert!(
        got.is_some(),
        "{} holds {:?}, not {want:?}",
        path.display(),
        std::fs::read_to_string(path)
    );
}

/// Waits for `f` to hold; on a timeout fails with `what`, the pods, claims and volumes, the
/// events and the server's log.
pub fn wait_for(c: &Cluster, what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let ok = eventually(timeout, || f().then_some(()));
    assert!(
        ok.is_some(),
        "{what}:\n{}\n{}\n{}",
        c.k(&["get", "pods,pvc,pv", "-o", "wide"]),
        c.k(&["get", "events", "-A"]),
        tail(&c.log(), 40)
    );
}
