//! `skiff audit security` on a live cluster: it names what a reviewer would flag (an anonymous
//! grant, a binding to `system:masters`, a user reading every Secret, namespaces without a Pod
//! Security level, a privileged pod), each with the kubectl command that fixes it; once those
//! commands are run, the findings are gone.

#![cfg(test)]

mod common;

use std::process::Command;

use common::{Cluster, skiff_bin};

fn audit(c: &Cluster) -> String {
    let out = Command::new(skiff_bin())
        .args(["audit", "security", "--kubeconfig"])
        .arg(&c.kubeconfig)
        .env("HOME", c.home.path())
        .output()
        .expect("skiff audit security");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).to_string()
}

#[test]
fn the_review_names_each_finding_with_its_fix() {
    let c = Cluster::start(&["--no-agent", "--no-scheduler"]);
    c.k(&["create", "namespace", "apps"]);
    c.k(&[
        "label",
        "namespace",
        "default",
        "pod-security.kubernetes.io/enforce=privileged",
    ]);
    c.k(&[
        "create",
        "clusterrolebinding",
        "anon-view",
        "--clusterrole=view",
        "--group=system:unauthenticated",
    ]);
    c.k(&[
        "create",
        "clusterrolebinding",
        "root-too",
        "--clusterrole=view",
        "--group=system:masters",
    ]);
    c.k(&[
        "create",
        "clusterrole",
        "secret-reader",
        "--verb=get,list",
        "--resource=secrets",
    ]);
    c.k(&[
        "create",
        "clusterrolebinding",
        "jane-secrets",
        "--clusterrole=secret-reader",
        "--user=jane",
    ]);
    c.apply(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: root, namespace: apps}\nspec:\n  hostPID: true\n  containers:\n  \
         - name: c\n    image: busybox:latest\n    securityContext: {privileged: true}\n",
        &[],
    );
    let report = audit(&c);
    for expected in [
        "[!!] Bindings that grant unauthenticated callers: 1",
        "ClusterRoleBinding anon-view -> ClusterRole view",
        "fix: kubectl delete clusterrolebinding anon-view",
        "ClusterRoleBinding root-too -> ClusterRole view",
        "ClusterRoleBinding jane-secrets -> ClusterRole secret-reader: User jane",
        "fix: kubectl delete clusterrolebinding jane-secrets",
        "[!!] Namespaces without a Pod Security enforce level: 1",
        "fix: kubectl label namespace apps pod-security.kubernetes.io/enforce=baseline",
        "apps/root: host namespaces (hostPID=true), privileged (container \"c\" must not set securityContext.privileged=true)",
    ] {
        assert!(report.contains(expected), "{expected:?} missing from:\n{report}");
    }
    // The default grants to unauthenticated callers (public info, cluster-info) are not findings.
    assert!(!report.contains("system:public-info-viewer"), "{report}");

    for fix in [
        vec!["delete", "clusterrolebinding", "anon-view"],
        vec!["delete", "clusterrolebinding", "root-too"],
        vec!["delete", "clusterrolebinding", "jane-secrets"],
        vec!["delete", "pod", "root", "-n", "apps", "--grace-period=0", "--force"],
    ] {
        c.k(&fix);
    }
    c.k(&[
        "label",
        "namespace",
        "apps",
        "pod-security.kubernetes.io/enforce=baseline",
    ]);
    let report = audit(&c);
    assert!(
        report.contains("[ok] Bindings that grant unauthenticated callers: none"),
        "{report}"
    );
    assert!(
        report.contains("[ok] Namespaces without a Pod Security enforce level: none"),
        "{report}"
    );
    assert!(report.ends_with("0 finding(s)\n"), "{report}");
}
