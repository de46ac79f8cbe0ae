//! Authorization through the real kubectl: upstream's 403 texts, `kubectl auth can-i` and
//! `whoami`, RBAC grants holding as soon as they are written, aggregation, escalation
//! prevention, impersonation, the Node authorizer and NodeRestriction (nodes are impersonated:
//! `--as system:node:n1 --as-group system:nodes`), the bootstrap policy reconciled at start,
//! and kubeconfigs issued by `skiff kubeconfig`.

#![cfg(test)]

mod common;

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Duration;

use common::{Cluster, eventually, skiff_bin};

const CONTROL_PLANE: &[&str] = &["--no-agent", "--no-scheduler"];
const N1: &[&str] = &["--as", "system:node:n1", "--as-group", "system:nodes"];

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).to_string()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).to_string()
}

/// `kubectl auth can-i ARGS`: its answer and exit code.
fn can_i(c: &Cluster, args: &[&str]) -> (String, i32) {
    let out = c.kubectl(&[&["auth", "can-i"], args].concat());
    (stdout(&out).trim().to_string(), out.status.code().unwrap_or(-1))
}

fn kubectl_as(c: &Cluster, kubeconfig: &PathBuf, args: &[&str]) -> Output {
    Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .env("HOME", c.home.path())
        .env_remove("KUBECONFIG")
        .output()
        .expect("run kubectl")
}

#[test]
fn refusals_in_upstream_words_and_grants_without_lag() {
    let c = Cluster::start(CONTROL_PLANE);
    let err = c.k_err(&["get", "pods", "--as", "jane"]);
    assert!(
        err.contains(
            "Error from server (Forbidden): pods is forbidden: User \"jane\" cannot list resource \"pods\" in API group \"\" in the namespace \"default\""
        ),
        "{err}"
    );
    let err = c.k_err(&["get", "nodes", "--as", "jane"]);
    assert!(
        err.contains(
            "nodes is forbidden: User \"jane\" cannot list resource \"nodes\" in API group \"\" at the cluster scope"
        ),
        "{err}"
    );
    let err = c.k_err(&["get", "deployment", "web", "--as", "jane"]);
    assert!(
        err.contains("deployments.apps \"web\" is forbidden: User \"jane\" cannot get resource \"deployments\" in API group \"apps\" in the namespace \"default\""),
        "{err}"
    );
    // Non-resource paths: discovery and health for everyone, the rest refused.
    assert_eq!(c.k(&["get", "--raw", "/healthz", "--as", "jane"]), "ok");
    let err = c.k_err(&["get", "--raw", "/metrics", "--as", "jane"]);
    assert!(
        err.contains("forbidden: User \"jane\" cannot get path \"/metrics\""),
        "{err}"
    );
    let verbose = c.k(&["get", "--raw", "/readyz?verbose"]);
    assert!(
        verbose.contains("[+]poststarthook/rbac/bootstrap-roles ok"),
        "{verbose}"
    );
    assert!(verbose.ends_with("readyz check passed\n"), "{verbose}");

    assert_eq!(can_i(&c, &["list", "pods", "--as", "jane"]), ("no".into(), 1));
    // The grant holds as soon as kubectl hears it was written.
    c.k(&[
        "create",
        "rolebinding",
        "jane-view",
        "--clusterrole=view",
        "--user=jane",
    ]);
    assert_eq!(can_i(&c, &["list", "pods", "--as", "jane"]), ("yes".into(), 0));
    c.k(&["get", "pods", "--as", "jane"]);
    assert_eq!(
        can_i(&c, &["get", "pods", "--subresource=log", "--as", "jane"]),
        ("yes".into(), 0)
    );
    assert_eq!(
        can_i(&c, &["create", "pods", "--subresource=exec", "--as", "jane"]),
        ("no".into(), 1)
    );
    assert_eq!(
        can_i(&c, &["list", "pods", "-n", "kube-system", "--as", "jane"]),
        ("no".into(), 1)
    );
    let list = c.k(&["auth", "can-i", "--list", "--as", "jane"]);
    assert!(
        list.lines()
            .any(|l| l.starts_with("pods ") && l.contains("[get list watch]")),
        "{list}"
    );
    // And is gone as soon as its deletion is acknowledged.
    c.k(&["delete", "rolebinding", "jane-view"]);
    assert_eq!(can_i(&c, &["list", "pods", "--as", "jane"]), ("no".into(), 1));

    // A binding's role cannot change.
    c.k(&[
        "create",
        "rolebinding",
        "jane-view",
        "--clusterrole=view",
        "--user=jane",
    ]);
    let err = c.k_err(&[
        "patch",
        "rolebinding",
        "jane-view",
        "--type=merge",
        "-p",
        r#"{"roleRef":{"name":"edit"}}"#,
    ]);
    assert!(err.contains("cannot change roleRef"), "{err}");
}

#[test]
fn whoami_and_the_administrators() {
    let c = Cluster::start(CONTROL_PLANE);
    let me = c.k(&["auth", "whoami"]);
    assert!(
        me.contains("skiff-admin") && me.contains("[skiff:cluster-admins system:authenticated]"),
        "{me}"
    );
    // The admin is bound to cluster-admin, not trusted blindly.
    assert!(
        c.k(&["get", "clusterrolebinding", "skiff:cluster-admins", "-o", "wide"])
            .contains("ClusterRole/cluster-admin")
    );
    let jane = c.k(&["auth", "whoami", "--as", "jane", "--as-group", "devs"]);
    assert!(
        jane.contains("jane") && jane.contains("[devs system:authenticated]"),
        "{jane}"
    );
    let bot = c.k(&["auth", "whoami", "--as", "system:serviceaccount:default:bot"]);
    assert!(
        bot.contains("[system:serviceaccounts system:serviceaccounts:default system:authenticated]"),
        "{bot}"
    );
    // The break-glass kubeconfig: system:masters, readable by its owner only.
    let super_admin = c.path().join("super-admin.kubeconfig");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&super_admin)
        .expect("super-admin.kubeconfig")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let out = kubectl_as(&c, &super_admin, &["auth", "whoami"]);
    assert!(
        stdout(&out).contains("[system:masters system:authenticated]"),
        "{}",
        stderr(&out)
    );

    // A user issued by `skiff kubeconfig` is whatever RBAC says, impersonating nobody.
    let jane = common::issued_kubeconfig(&c, &["user", "jane", "--group", "devs"], "jane.kubeconfig");
    let out = kubectl_as(&c, &jane, &["get", "pods"]);
    assert!(
        stderr(&out).contains("User \"jane\" cannot list resource \"pods\""),
        "{}",
        stderr(&out)
    );
    c.k(&[
        "create",
        "clusterrolebinding",
        "devs-view",
        "--clusterrole=view",
        "--group=devs",
    ]);
    let out = kubectl_as(&c, &jane, &["get", "pods", "-A"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = kubectl_as(&c, &jane, &["get", "pods", "--as", "bob"]);
    assert!(
        stderr(&out).contains("users \"bob\" is forbidden: User \"jane\" cannot impersonate resource \"users\" in API group \"\" at the cluster scope"),
        "{}",
        stderr(&out)
    );
    c.k(&[
        "create",
        "clusterrole",
        "impersonate-bob",
        "--verb=impersonate",
        "--resource=users",
        "--resource-name=bob",
    ]);
    c.k(&[
        "create",
        "clusterrolebinding",
        "jane-as-bob",
        "--clusterrole=impersonate-bob",
        "--user=jane",
    ]);
    let out = kubectl_as(&c, &jane, &["auth", "whoami", "--as", "bob"]);
    assert!(stdout(&out).contains("bob"), "{}", stderr(&out));
    // The command refuses to mint what only the server holds.
    let out = Command::new(skiff_bin())
        .args(["kubeconfig", "user", "root", "--group", "system:masters", "--data-dir"])
        .arg(c.path())
        .output()
        .expect("skiff kubeconfig");
    assert!(!out.status.success());
    assert!(stderr(&out).contains("super-admin.kubeconfig"), "{}", stderr(&out));
}

#[test]
fn aggregation_extends_view_within_seconds() {
    let c = Cluster::start(CONTROL_PLANE);
    c.k(&[
        "create",
        "rolebinding",
        "jane-view",
        "--clusterrole=view",
        "--user=jane",
    ]);
    // view leaves Secrets out; a role labelled for it brings them in.
    assert_eq!(can_i(&c, &["get", "secrets", "--as", "jane"]), ("no".into(), 1));
    c.apply(
        r#"apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: secret-reader
  labels:
    rbac.authorization.k8s.io/aggregate-to-view: "true"
rules:
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get"]
"#,
        &[],
    );
    let granted = eventually(Duration::from_secs(10), || {
        (can_i(&c, &["get", "secrets", "--as", "jane"]) == ("yes".into(), 0)).then_some(())
    });
    assert!(granted.is_some(), "view collected the secret-reader rule");
    let view = c.get_json(&["clusterrole", "view"]);
    let rules = view["rules"].as_array().expect("rules");
    assert!(
        rules
            .iter()
            .any(|r| r["resources"] == serde_json::json!(["secrets"]) && r["verbs"] == serde_json::json!(["get"])),
        "{view}"
    );
    // Unlabelled, it is dropped again.
    c.k(&[
        "label",
        "clusterrole",
        "secret-reader",
        "rbac.authorization.k8s.io/aggregate-to-view-",
    ]);
    let revoked = eventually(Duration::from_secs(10), || {
        (can_i(&c, &["get", "secrets", "--as", "jane"]) == ("no".into(), 1)).then_some(())
    });
    assert!(revoked.is_some(), "view dropped the rule");
}

#[test]
fn escalation_is_refused_unless_bind_or_escalate_is_granted() {
    let c = Cluster::start(CONTROL_PLANE);
    c.k(&[
        "create",
        "role",
        "rbac-writer",
        "--verb=create,get,update",
        "--resource=roles,rolebindings",
    ]);
    c.k(&[
        "create",
        "rolebinding",
        "jane-rbac",
        "--role=rbac-writer",
        "--user=jane",
    ]);
    // A role with rules jane does not hold.
    let err = c.k_err(&[
        "create",
        "role",
        "pod-killer",
        "--verb=delete",
        "--resource=pods",
        "--as",
        "jane",
    ]);
    assert!(
        err.contains("roles.rbac.authorization.k8s.io \"pod-killer\" is forbidden: user \"jane\" (groups=[\"system:authenticated\"]) is attempting to grant RBAC permissions not currently held:"),
        "{err}"
    );
    assert!(
        err.contains("{APIGroups:[\"\"], Resources:[\"pods\"], Verbs:[\"delete\"]}"),
        "{err}"
    );
    // A role with rules jane holds is fine.
    c.k(&[
        "create",
        "role",
        "rbac-reader",
        "--verb=get",
        "--resource=roles",
        "--as",
        "jane",
    ]);
    // Binding a role jane does not hold.
    let err = c.k_err(&[
        "create",
        "rolebinding",
        "bob-edit",
        "--clusterrole=edit",
        "--user=bob",
        "--as",
        "jane",
    ]);
    assert!(
        err.contains("is attempting to grant RBAC permissions not currently held"),
        "{err}"
    );
    // `bind` on that role allows it; `escalate` allows any rules.
    c.k(&[
        "create",
        "role",
        "bind-edit",
        "--verb=bind",
        "--resource=clusterroles",
        "--resource-name=edit",
    ]);
    c.k(&[
        "create",
        "rolebinding",
        "jane-bind-edit",
        "--role=bind-edit",
        "--user=jane",
    ]);
    c.k(&[
        "create",
        "rolebinding",
        "bob-edit",
        "--clusterrole=edit",
        "--user=bob",
        "--as",
        "jane",
    ]);
    c.k(&["create", "role", "escalator", "--verb=escalate", "--resource=roles"]);
    c.k(&[
        "create",
        "rolebinding",
        "jane-escalate",
        "--role=escalator",
        "--user=jane",
    ]);
    c.k(&[
        "create",
        "role",
        "pod-killer",
        "--verb=delete",
        "--resource=pods",
        "--as",
        "jane",
    ]);
}

#[test]
fn nodes_read_only_what_their_pods_use() {
    let c = Cluster::start(CONTROL_PLANE);
    c.k(&["create", "secret", "generic", "theirs", "--from-literal=p=1"]);
    c.k(&["create", "secret", "generic", "mine", "--from-literal=p=2"]);
    c.apply(
        r#"apiVersion: v1
kind: Pod
metadata: {name: on-n1}
spec:
  nodeName: n1
  containers:
  - name: c
    image: busybox:latest
    env: [{name: P, valueFrom: {secretKeyRef: {name: mine, key: p}}}]
"#,
        &[],
    );
    let n1 = |args: &[&str]| c.kubectl(&[args, N1].concat());
    assert!(n1(&["get", "secret", "mine"]).status.success());
    let out = n1(&["get", "secret", "theirs"]);
    assert!(
        stderr(&out).contains("secrets \"theirs\" is forbidden: User \"system:node:n1\" cannot get resource \"secrets\" in API group \"\" in the namespace \"default\": no relationship found between node 'n1' and this object"),
        "{}",
        stderr(&out)
    );
    assert!(n1(&["get", "pod", "on-n1"]).status.success());
    let out = n1(&["get", "pods"]);
    assert!(
        stderr(&out).contains("can only list/watch pods with spec.nodeName field selector"),
        "{}",
        stderr(&out)
    );
    assert!(
        n1(&["get", "pods", "--field-selector", "spec.nodeName=n1"])
            .status
            .success()
    );
    let out = n1(&["get", "secrets"]);
    assert!(!out.status.success());

    // NodeRestriction: its own Node only, never its taints.
    for node in ["n1", "n2"] {
        c.apply(
            &format!("apiVersion: v1\nkind: Node\nmetadata: {{name: {node}}}\n"),
            &[],
        );
    }
    assert!(n1(&["label", "node", "n1", "example.com/tier=a"]).status.success());
    // (A create: kubectl reads before it patches, which the Node authorizer refuses for n2.)
    let out = c.stdin_kubectl_err(
        &[&["create", "-f", "-"], N1].concat(),
        "apiVersion: v1\nkind: Node\nmetadata: {name: n3}\n",
    );
    assert!(
        out.contains("node \"n1\" is not allowed to modify node \"n3\""),
        "{out}"
    );
    let out = n1(&["label", "node", "n1", "node-restriction.kubernetes.io/pool=x"]);
    assert!(
        stderr(&out).contains("is not allowed to modify labels: node-restriction.kubernetes.io/pool"),
        "{}",
        stderr(&out)
    );
    let out = n1(&["taint", "node", "n1", "k=v:NoSchedule"]);
    assert!(
        stderr(&out).contains("node \"n1\" is not allowed to modify taints"),
        "{}",
        stderr(&out)
    );
    let out = n1(&["get", "node", "n2"]);
    assert!(
        stderr(&out).contains("node 'n1' cannot read 'n2', only its own Node object"),
        "{}",
        stderr(&out)
    );
    // It creates mirror pods only.
    let out = c.stdin_kubectl_err(
        &[&["create", "-f", "-"], N1].concat(),
        "apiVersion: v1\nkind: Pod\nmetadata: {name: sneaky}\nspec:\n  nodeName: n1\n  containers: [{name: c, image: busybox:latest}]\n",
    );
    assert!(out.contains("node \"n1\" can only create mirror pods"), "{out}");
}

#[test]
fn bootstrap_policy_comes_back_at_start_unless_opted_out() {
    let mut c = Cluster::start(CONTROL_PLANE);
    c.k(&[
        "create",
        "rolebinding",
        "jane-view",
        "--clusterrole=view",
        "--user=jane",
    ]);
    c.k(&["delete", "clusterrolebinding", "system:discovery"]);
    c.k(&[
        "annotate",
        "clusterrole",
        "system:heapster",
        "rbac.authorization.kubernetes.io/autoupdate=false",
        "--overwrite",
    ]);
    c.k(&[
        "patch",
        "clusterrole",
        "system:heapster",
        "--type=json",
        "-p",
        r#"[{"op":"replace","path":"/rules","value":[]}]"#,
    ]);
    c.restart();
    c.k(&["get", "clusterrolebinding", "system:discovery"]);
    let heapster = c.get_json(&["clusterrole", "system:heapster"]);
    assert_eq!(heapster["rules"], serde_json::json!([]), "{heapster}");
    // Grants written before the restart hold after it.
    assert_eq!(can_i(&c, &["list", "pods", "--as", "jane"]), ("yes".into(), 0));
    // The default roles exist with their aggregation.
    let roles = c.k(&["get", "clusterroles", "-o", "name"]);
    for r in [
        "cluster-admin",
        "admin",
        "edit",
        "view",
        "system:node",
        "system:kube-scheduler",
        "system:controller:deployment-controller",
    ] {
        assert!(
            roles.contains(&format!("clusterrole.rbac.authorization.k8s.io/{r}\n")),
            "{r}: {roles}"
        );
    }
}

#[test]
fn refused_requests_are_audited_and_secret_values_never_are() {
    let c = Cluster::start(CONTROL_PLANE);
    c.k(&[
        "create",
        "secret",
        "generic",
        "s",
        "--from-literal=password=AUDIT-NEVER-SEES-THIS",
    ]);
    c.k_err(&["get", "secrets", "--as", "jane"]);
    // Every response names its audit event.
    let out = Command::new("curl")
        .args(["-sk", "-D", "-", "-o", "/dev/null"])
        .arg(format!("https://127.0.0.1:{}/version", c.port))
        .output()
        .expect("curl");
    let headers = stdout(&out).to_ascii_lowercase();
    assert!(headers.lines().any(|l| l.starts_with("audit-id: ")), "{headers}");

    let log_path = c.path().join("audit").join("audit.log");
    let refused = eventually(Duration::from_secs(5), || {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        log.lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("one JSON event a line"))
            .find(|e| e["impersonatedUser"]["username"] == "jane" && e["responseStatus"]["code"] == 403)
    })
    .expect("the refused request is in the audit log");
    assert_eq!(refused["apiVersion"], "audit.k8s.io/v1");
    assert_eq!(refused["kind"], "Event");
    assert_eq!(refused["stage"], "ResponseComplete");
    assert_eq!(refused["verb"], "list");
    assert_eq!(refused["user"]["username"], "skiff-admin");
    assert_eq!(refused["objectRef"]["resource"], "secrets");
    assert_eq!(refused["responseStatus"]["reason"], "Forbidden");
    assert_eq!(refused["annotations"]["authorization.k8s.io/decision"], "forbid");
    let log = std::fs::read_to_string(&log_path).expect("audit log");
    assert!(log.contains("\"resource\":\"secrets\""), "the create is logged");
    assert!(
        !log.contains("AUDIT-NEVER-SEES-THIS"),
        "no secret value in the audit log"
    );
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode("AUDIT-NEVER-SEES-THIS");
    assert!(!log.contains(&b64));
}

/// `skiff auth why` as the test cluster's admin.
fn why(c: &Cluster, args: &[&str]) -> String {
    let out = Command::new(skiff_bin())
        .args(["auth", "why", "--kubeconfig"])
        .arg(&c.kubeconfig)
        .args(args)
        .output()
        .expect("skiff auth why");
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out)
}

#[test]
fn auth_why_names_the_rule_or_the_smallest_grant() {
    let c = Cluster::start(CONTROL_PLANE);
    // The aggregated roles are filled by their controller just after start; until `edit` has its
    // rules, `admin` is the smallest role that allows the request.
    let aggregated = eventually(Duration::from_secs(10), || {
        let rules = c.k(&["get", "clusterrole", "edit", "-o", "jsonpath={.rules[*].verbs}"]);
        rules.contains("delete").then_some(())
    });
    assert!(aggregated.is_some(), "edit was never aggregated");
    let no = why(&c, &["--as", "jane", "delete", "pods", "-n", "default"]);
    assert!(no.starts_with("no: User \"jane\" delete pods"), "{no}");
    let commands: Vec<&str> = no
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("kubectl create role"))
        .take(2)
        .collect();
    assert_eq!(
        commands,
        vec![
            "kubectl create role jane-delete-pods --verb=delete --resource=pods -n default",
            "kubectl create rolebinding jane-delete-pods --role=jane-delete-pods --user=jane -n default",
        ],
        "{no}"
    );
    assert!(no.contains("--clusterrole=edit --user=jane -n default"), "{no}");
    // The suggested commands do what they say, and nothing more.
    for cmd in &commands {
        let args: Vec<&str> = cmd.split_whitespace().skip(1).collect();
        c.k(&args);
    }
    let yes = why(&c, &["--as", "jane", "delete", "pods", "-n", "default"]);
    assert!(
        yes.contains(
            "allowed by RoleBinding \"jane-delete-pods/default\" of Role \"jane-delete-pods\" to User \"jane\""
        ),
        "{yes}"
    );
    assert!(
        yes.contains("through the rule {APIGroups:[\"\"], Resources:[\"pods\"], Verbs:[\"delete\"]}"),
        "{yes}"
    );
    assert_eq!(can_i(&c, &["create", "pods", "--as", "jane"]), ("no".into(), 1));
}

#[test]
fn exec_needs_create_whatever_the_transport() {
    let c = Cluster::start(CONTROL_PLANE);
    c.apply(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: box}\nspec:\n  containers: [{name: c, image: busybox:latest}]\n",
        &[],
    );
    c.k(&["create", "role", "peek", "--verb=get", "--resource=pods,pods/exec"]);
    c.k(&["create", "rolebinding", "jane-peek", "--role=peek", "--user=jane"]);
    let err = c.k_err(&["exec", "box", "--as", "jane", "--", "true"]);
    assert!(
        err.contains("pods \"box\" is forbidden: User \"jane\" cannot create resource \"pods/exec\" in API group \"\" in the namespace \"default\""),
        "{err}"
    );
}

#[test]
fn an_empty_audit_log_path_turns_auditing_off() {
    let c = Cluster::start(&["--no-agent", "--no-scheduler", "--audit-log-path="]);
    c.k(&["get", "pods"]);
    assert!(!c.path().join("audit").exists());
}
