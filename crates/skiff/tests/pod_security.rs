//! Pod Security admission through the real kubectl, as upstream's is used: namespaces labelled
//! `pod-security.kubernetes.io/enforce|audit|warn`, pods refused or warned about in upstream's
//! words, workloads warned about, a stricter label warning about the pods already there, labels
//! that do not parse refused, the audit log annotated, and a cluster-wide default with
//! exemptions from `--admission-control-config-file`.

#![cfg(test)]

mod common;

use std::time::Duration;

use common::{Cluster, eventually};

const CONTROL_PLANE: &[&str] = &["--no-agent", "--no-scheduler"];

/// `kubectl apply -f -` of `yaml`: whether it succeeded, and what it printed to stderr (the
/// server's warnings).
fn apply_warned(c: &Cluster, yaml: &str) -> (bool, String) {
    use std::io::Write;
    let mut child = c
        .kubectl_cmd(&["apply", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(yaml.as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("kubectl");
    (out.status.success(), String::from_utf8_lossy(&out.stderr).to_string())
}

fn privileged_pod(name: &str, ns: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  containers:\n  \
         - name: c\n    image: busybox:latest\n    securityContext: {{privileged: true}}\n"
    )
}

const RESTRICTED_POD: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: tidy, namespace: locked}\nspec:\n  \
    securityContext: {runAsNonRoot: true, runAsUser: 1000, seccompProfile: {type: RuntimeDefault}}\n  containers:\n  \
    - name: c\n    image: busybox:latest\n    securityContext:\n      allowPrivilegeEscalation: false\n      \
    capabilities: {drop: [ALL]}\n";

#[test]
fn restricted_namespaces_refuse_what_upstream_refuses() {
    let c = Cluster::start(CONTROL_PLANE);
    c.k(&["create", "namespace", "locked"]);
    c.k(&[
        "label",
        "namespace",
        "locked",
        "pod-security.kubernetes.io/enforce=restricted",
    ]);
    let err = c.stdin_kubectl_err(&["apply", "-f", "-"], &privileged_pod("priv", "locked"));
    assert!(
        err.contains(
            "pods \"priv\" is forbidden: violates PodSecurity \"restricted:latest\": privileged (container \"c\" must \
             not set securityContext.privileged=true), allowPrivilegeEscalation != false (container \"c\" must set \
             securityContext.allowPrivilegeEscalation=false), unrestricted capabilities (container \"c\" must set \
             securityContext.capabilities.drop=[\"ALL\"]), runAsNonRoot != true (pod or container \"c\" must set \
             securityContext.runAsNonRoot=true), seccompProfile (pod or container \"c\" must set \
             securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\")"
        ),
        "{err}"
    );
    assert!(c.kubectl(&["get", "pod", "priv", "-n", "locked"]).status.code() != Some(0));
    // A pod that asks for nothing is welcome.
    let out = c.stdin_kubectl(&["apply", "-f", "-"], RESTRICTED_POD);
    assert!(out.contains("pod/tidy created"), "{out}");
    // A workload is warned about, not refused: the pods it makes are.
    let deployment = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: locked}\nspec:\n  \
        selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n    spec:\n      \
        hostNetwork: true\n      containers: [{name: web, image: busybox:latest}]\n";
    let (ok, stderr) = apply_warned(&c, deployment);
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("Warning: would violate PodSecurity \"restricted:latest\": host namespaces (hostNetwork=true)"),
        "{stderr}"
    );

    // A label that does not parse is refused.
    let err = c.k_err(&[
        "label",
        "namespace",
        "locked",
        "pod-security.kubernetes.io/enforce=strict",
        "--overwrite",
    ]);
    assert!(
        err.contains("metadata.labels[pod-security.kubernetes.io/enforce]: Invalid value: \"strict\": must be one of privileged, baseline, restricted"),
        "{err}"
    );
    let err = c.k_err(&[
        "label",
        "namespace",
        "locked",
        "pod-security.kubernetes.io/enforce-version=1.30",
    ]);
    assert!(
        err.contains("must be \\\"latest\\\" or \\\"v1.x\\\"") || err.contains("must be \"latest\" or \"v1.x\""),
        "{err}"
    );
}

#[test]
fn a_stricter_label_warns_about_the_pods_already_there_and_warn_and_audit_modes_report() {
    let c = Cluster::start(CONTROL_PLANE);
    c.k(&["create", "namespace", "open"]);
    c.stdin_kubectl(&["apply", "-f", "-"], &privileged_pod("priv-a", "open"));
    c.stdin_kubectl(&["apply", "-f", "-"], &privileged_pod("priv-b", "open"));
    let out = c.kubectl(&[
        "label",
        "namespace",
        "open",
        "pod-security.kubernetes.io/enforce=baseline",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "Warning: existing pods in namespace \"open\" violate the new PodSecurity enforce level \"baseline:latest\""
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("Warning: priv-a (and 1 other pod): privileged"),
        "{stderr}"
    );
    // The pods stay: the level holds for what comes next.
    assert_eq!(c.k(&["get", "pods", "-n", "open", "-o", "name"]).lines().count(), 2);

    // warn and audit: allowed, with a warning and an audit annotation.
    c.k(&["create", "namespace", "watched"]);
    c.k(&[
        "label",
        "namespace",
        "watched",
        "pod-security.kubernetes.io/warn=baseline",
        "pod-security.kubernetes.io/audit=restricted",
    ]);
    let pod = "apiVersion: v1\nkind: Pod\nmetadata: {name: netpod, namespace: watched}\nspec:\n  hostNetwork: true\n  \
        containers: [{name: c, image: busybox:latest}]\n";
    let (ok, stderr) = apply_warned(&c, pod);
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("Warning: would violate PodSecurity \"baseline:latest\": host namespaces (hostNetwork=true)"),
        "{stderr}"
    );
    let log_path = c.path().join("audit").join("audit.log");
    let event = eventually(Duration::from_secs(5), || {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        log.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|e| {
                e["objectRef"]["namespace"] == "watched"
                    && e["objectRef"]["resource"] == "pods"
                    && e["verb"] == "create"
                    && e["stage"] == "ResponseComplete"
            })
    })
    .expect("the pod's create is audited");
    // A create's objectRef names what was sent, as upstream's.
    assert_eq!(event["objectRef"]["name"], "netpod", "{event}");
    let violations = event["annotations"]["pod-security.kubernetes.io/audit-violations"]
        .as_str()
        .unwrap_or("");
    assert!(
        violations.starts_with("would violate PodSecurity \"restricted:latest\": host namespaces (hostNetwork=true)"),
        "{event}"
    );
    assert_eq!(
        event["annotations"]["pod-security.kubernetes.io/enforce-policy"], "privileged:latest",
        "{event}"
    );
}

#[test]
fn a_cluster_wide_default_with_exemptions() {
    let dir = tempfile::tempdir().expect("dir");
    let config = dir.path().join("admission.yaml");
    std::fs::write(
        &config,
        "apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n- name: PodSecurity\n  \
         configuration:\n    apiVersion: pod-security.admission.config.k8s.io/v1\n    kind: PodSecurityConfiguration\n    \
         defaults: {enforce: baseline, enforce-version: latest}\n    exemptions: {namespaces: [tools], usernames: [], runtimeClasses: []}\n",
    )
    .expect("write config");
    let path = config.to_string_lossy().to_string();
    let c = Cluster::start(&["--no-agent", "--no-scheduler", "--admission-control-config-file", &path]);
    let err = c.stdin_kubectl_err(&["apply", "-f", "-"], &privileged_pod("priv", "default"));
    assert!(
        err.contains("violates PodSecurity \"baseline:latest\": privileged (container \"c\" must not set securityContext.privileged=true)"),
        "{err}"
    );
    c.k(&["create", "namespace", "tools"]);
    let out = c.stdin_kubectl(&["apply", "-f", "-"], &privileged_pod("priv", "tools"));
    assert!(out.contains("pod/priv created"), "{out}");
    // A namespace may relax the default for itself.
    c.k(&["create", "namespace", "lab"]);
    c.k(&[
        "label",
        "namespace",
        "lab",
        "pod-security.kubernetes.io/enforce=privileged",
    ]);
    let out = c.stdin_kubectl(&["apply", "-f", "-"], &privileged_pod("priv", "lab"));
    assert!(out.contains("pod/priv created"), "{out}");
}
