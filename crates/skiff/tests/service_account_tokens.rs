//! Service account tokens through the real kubectl: `kubectl create token` asks the TokenRequest
//! subresource, and the token it prints authenticates to the API server as the service account
//! for as long as the account (and the pod it is bound to) exists. On a real node (Docker, the
//! local `busybox:latest` image) a projected token is such a token, and a pod whose token cannot
//! be had does not start.

#![cfg(test)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as BASE64URL;
use common::node::Node;
use common::{Cluster, eventually};

const CONTROL_PLANE: &[&str] = &["--no-agent", "--no-scheduler"];

const UNAUTHORIZED: &str = "You must be logged in to the server (Unauthorized)";

/// A kubeconfig for the cluster that carries no credentials of its own (kubectl is given
/// `--token`). The admin's `kubectl get pods` fills kubectl's discovery cache first: a refused
/// token is then reported for the request itself ("Unauthorized"), not for discovery, which
/// kubectl words "the server has asked for the client to provide credentials".
fn anonymous_kubeconfig(c: &Cluster) -> PathBuf {
    c.k(&["get", "pods"]);
    let path = c.path().join("anonymous.kubeconfig");
    let server = format!("https://127.0.0.1:{}", c.port);
    let ca = c.path().join("pki").join("ca.crt");
    let ca = ca.to_str().expect("utf-8 path");
    for args in [
        vec![
            "config",
            "set-cluster",
            "skiff",
            "--server",
            server.as_str(),
            "--certificate-authority",
            ca,
            "--embed-certs",
        ],
        vec![
            "config",
            "set-context",
            "skiff",
            "--cluster",
            "skiff",
            "--user",
            "nobody",
        ],
        vec!["config", "use-context", "skiff"],
    ] {
        let out = kubectl_with(c, &path, &args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    path
}

fn kubectl_with(c: &Cluster, kubeconfig: &Path, args: &[&str]) -> Output {
    Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .env("HOME", c.home.path())
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        .output()
        .expect("run kubectl")
}

/// Asserts that kubectl failed with its error for a 401.
fn assert_unauthorized(out: &Output) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "kubectl succeeded: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(stderr.contains(UNAUTHORIZED), "{stderr}");
}

/// `kubectl get pods` with `--token=TOKEN` and no other credentials.
fn get_pods_with(c: &Cluster, kubeconfig: &Path, token: &str) -> Output {
    kubectl_with(c, kubeconfig, &["--token", token, "get", "pods"])
}

fn claims(token: &str) -> serde_json::Value {
    let payload = token.split('.').nth(1).expect("a JWT has three parts");
    serde_json::from_slice(&BASE64URL.decode(payload).expect("base64url payload")).expect("JSON claims")
}

/// The same token with one character of its signature changed.
fn tampered(token: &str) -> String {
    let (signed, signature) = token.rsplit_once('.').expect("a JWT");
    let mut sig: Vec<char> = signature.chars().collect();
    sig[10] = if sig[10] == 'A' { 'B' } else { 'A' };
    format!("{signed}.{}", sig.into_iter().collect::<String>())
}

/// The uid of `NS/default` once the ServiceAccounts controller has created it.
fn default_account_uid(c: &Cluster, ns: &str) -> Option<String> {
    let out = c.kubectl(&[
        "get",
        "serviceaccount",
        "default",
        "-n",
        ns,
        "-o",
        "jsonpath={.metadata.uid}",
    ]);
    let uid = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !uid.is_empty()).then_some(uid)
}

#[test]
fn every_namespace_has_a_default_service_account() {
    let c = Cluster::start(CONTROL_PLANE);
    let wait = Duration::from_secs(10);
    assert!(eventually(wait, || default_account_uid(&c, "default")).is_some());
    c.k(&["create", "namespace", "team"]);
    let first = eventually(wait, || default_account_uid(&c, "team")).expect("team/default is created");
    // Deleted, it is created again (a new object).
    c.k(&["delete", "serviceaccount", "default", "-n", "team"]);
    let second = eventually(wait, || default_account_uid(&c, "team").filter(|u| *u != first))
        .expect("team/default is created again");
    // kubectl create token finds it.
    let token = c.k(&["create", "token", "default", "-n", "team"]).trim().to_string();
    let claims = claims(&token);
    assert_eq!(claims["sub"], "system:serviceaccount:team:default");
    assert_eq!(claims["kubernetes.io"]["serviceaccount"]["uid"], second.as_str());
    // A namespace being deleted does not get it back: the namespace goes, with its account.
    c.k(&["delete", "namespace", "team"]);
    assert!(
        eventually(Duration::from_secs(30), || {
            let out = c.kubectl(&["get", "namespace", "team"]);
            (!out.status.success()).then_some(())
        })
        .is_some(),
        "namespace team is gone"
    );
}

/// `kube-root-ca.crt` in `ns`, once the root CA publisher has written it.
fn root_ca_config_map(c: &Cluster, ns: &str) -> Option<serde_json::Value> {
    let out = c.kubectl(&["get", "configmap", "kube-root-ca.crt", "-n", ns, "-o", "json"]);
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).expect("JSON"))
}

#[test]
fn every_namespace_has_the_cluster_ca_in_kube_root_ca_crt() {
    let c = Cluster::start(CONTROL_PLANE);
    let ca = std::fs::read_to_string(c.path().join("pki").join("ca.crt")).expect("the cluster CA");
    let wait = Duration::from_secs(10);
    let holds_ca =
        |ns: &str| root_ca_config_map(&c, ns).filter(|cm| cm["data"]["ca.crt"].as_str() == Some(ca.as_str()));
    assert!(eventually(wait, || holds_ca("default")).is_some());
    c.k(&["create", "namespace", "team"]);
    let cm = eventually(wait, || holds_ca("team")).expect("team/kube-root-ca.crt holds the CA");
    assert_eq!(cm["data"].as_object().map(|d| d.len()), Some(1), "{cm}");
    assert!(
        cm["metadata"]["annotations"]["kubernetes.io/description"]
            .as_str()
            .is_some_and(|d| d.starts_with("Contains a CA bundle")),
        "{cm}"
    );
    // Changed, it is put back; deleted, it is written again.
    c.k(&[
        "patch",
        "configmap",
        "kube-root-ca.crt",
        "-n",
        "team",
        "-p",
        r#"{"data":{"ca.crt":"x"}}"#,
    ]);
    assert!(
        eventually(wait, || holds_ca("team")).is_some(),
        "the bundle is put back"
    );
    let uid = cm["metadata"]["uid"].clone();
    c.k(&["delete", "configmap", "kube-root-ca.crt", "-n", "team"]);
    assert!(
        eventually(wait, || holds_ca("team").filter(|cm| cm["metadata"]["uid"] != uid)).is_some(),
        "the ConfigMap is written again"
    );
}

#[test]
fn create_token_authenticates_as_the_service_account() {
    let mut c = Cluster::start(CONTROL_PLANE);
    c.k(&["create", "serviceaccount", "bot"]);
    let token = c.k(&["create", "token", "bot"]).trim().to_string();
    assert_eq!(token.split('.').count(), 3, "a compact JWT: {token}");

    let sa = c.get_json(&["serviceaccount", "bot"]);
    let claims = claims(&token);
    assert_eq!(claims["iss"], "https://kubernetes.default.svc.cluster.local");
    assert_eq!(claims["sub"], "system:serviceaccount:default:bot");
    assert_eq!(
        claims["aud"],
        serde_json::json!(["https://kubernetes.default.svc.cluster.local"])
    );
    assert_eq!(claims["kubernetes.io"]["namespace"], "default");
    assert_eq!(claims["kubernetes.io"]["serviceaccount"]["name"], "bot");
    assert_eq!(claims["kubernetes.io"]["serviceaccount"]["uid"], sa["metadata"]["uid"]);
    let (iat, exp) = (claims["iat"].as_i64().unwrap(), claims["exp"].as_i64().unwrap());
    assert_eq!(exp - iat, 3600, "an hour unless asked otherwise");

    let kubeconfig = anonymous_kubeconfig(&c);
    // The token authenticates: the request is the service account's, which may do what RBAC
    // grants it, nothing yet (403, not 401).
    let out = get_pods_with(&c, &kubeconfig, &token);
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("pods is forbidden: User \"system:serviceaccount:default:bot\" cannot list resource \"pods\""),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    c.k(&[
        "create",
        "rolebinding",
        "bot-edit",
        "--clusterrole=edit",
        "--serviceaccount=default:bot",
    ]);
    let out = get_pods_with(&c, &kubeconfig, &token);
    assert!(
        out.status.success(),
        "the token authenticates: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("No resources found in default namespace."));
    let out = kubectl_with(&c, &kubeconfig, &["--token", &token, "create", "configmap", "from-bot"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    // A token whose signature does not verify is refused as upstream refuses it.
    let out = get_pods_with(&c, &kubeconfig, &tampered(&token));
    assert_unauthorized(&out);

    // The signing key outlives a restart: the token still works.
    c.restart();
    let out = get_pods_with(&c, &kubeconfig, &token);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    // A token dies with its service account, and does not come back with a namesake.
    c.k(&["delete", "serviceaccount", "bot"]);
    c.k(&["create", "serviceaccount", "bot"]);
    let out = get_pods_with(&c, &kubeconfig, &token);
    assert_unauthorized(&out);
}

#[test]
fn create_token_refusals() {
    let c = Cluster::start(CONTROL_PLANE);
    c.k(&["create", "serviceaccount", "bot"]);

    let err = c.k_err(&["create", "token", "bot", "--duration=1m"]);
    assert!(
        err.contains(
            "error: failed to create token: TokenRequest.authentication.k8s.io \"\" is invalid: \
             spec.expirationSeconds: Invalid value: 60: may not specify a duration less than 10 minutes"
        ),
        "{err}"
    );
    let err = c.k_err(&["create", "token", "ghost"]);
    assert!(
        err.contains("error: failed to create token: serviceaccounts \"ghost\" not found"),
        "{err}"
    );

    // Longer lifetimes and other audiences are granted as asked.
    let token = c.k(&["create", "token", "bot", "--duration=2h", "--audience=vault"]);
    let claims = claims(token.trim());
    assert_eq!(claims["aud"], serde_json::json!(["vault"]));
    assert_eq!(claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap(), 7200);
    // ... but a token for another audience is no credential for the API server.
    let kubeconfig = anonymous_kubeconfig(&c);
    let out = get_pods_with(&c, &kubeconfig, token.trim());
    assert_unauthorized(&out);
}

#[test]
fn tokens_bound_to_a_pod() {
    let c = Cluster::start(CONTROL_PLANE);
    c.k(&["create", "serviceaccount", "bot"]);
    c.k(&["create", "serviceaccount", "other"]);
    c.apply(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  serviceAccountName: bot\n  containers:\n  - name: c\n    image: busybox\n",
        &[],
    );
    let pod_uid = c.get_json(&["pod", "p"])["metadata"]["uid"]
        .as_str()
        .expect("pod uid")
        .to_string();

    let token = c.k(&[
        "create",
        "token",
        "bot",
        "--bound-object-kind",
        "Pod",
        "--bound-object-name",
        "p",
    ]);
    let token = token.trim();
    let claims = claims(token);
    assert_eq!(claims["kubernetes.io"]["pod"]["name"], "p");
    assert_eq!(claims["kubernetes.io"]["pod"]["uid"], pod_uid.as_str());

    let err = c.k_err(&[
        "create",
        "token",
        "other",
        "--bound-object-kind",
        "Pod",
        "--bound-object-name",
        "p",
    ]);
    assert!(
        err.contains(
            "cannot bind token for serviceaccount \"other\" to pod running with different serviceaccount name."
        ),
        "{err}"
    );
    let err = c.k_err(&[
        "create",
        "token",
        "bot",
        "--bound-object-kind",
        "Pod",
        "--bound-object-name",
        "p",
        "--bound-object-uid",
        "not-the-uid",
    ]);
    assert!(
        err.contains(
            "Operation cannot be fulfilled on Pod \"p\": the UID in the bound object reference (not-the-uid) does \
             not match the UID in record. The object might have been deleted and then recreated"
        ),
        "{err}"
    );

    let kubeconfig = anonymous_kubeconfig(&c);
    c.k(&[
        "create",
        "rolebinding",
        "bot-view",
        "--clusterrole=view",
        "--serviceaccount=default:bot",
    ]);
    let out = get_pods_with(&c, &kubeconfig, token);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Once the pod is gone, so is the token's validity.
    c.k(&["delete", "pod", "p", "--grace-period=0", "--force"]);
    let out = get_pods_with(&c, &kubeconfig, token);
    assert_unauthorized(&out);
}

fn pod_with_projected_token(name: &str, service_account: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  serviceAccountName: {service_account}
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: busybox:latest
    imagePullPolicy: IfNotPresent
    command: ["sleep", "3600"]
    volumeMounts:
    - name: api-token
      mountPath: /var/run/secrets/tokens
  volumes:
  - name: api-token
    projected:
      sources:
      - serviceAccountToken:
          path: token
"#
    )
}

#[test]
fn projected_tokens_on_a_node() {
    let n = Node::start("satoken", &[]);
    let c = &n.c;
    c.k(&["create", "serviceaccount", "bot"]);

    // The projected token is the API server's, bound to the pod, and a credential.
    c.apply(&pod_with_projected_token("holder", "bot"), &[]);
    n.wait_running("holder");
    let token = c.k(&["exec", "holder", "--", "cat", "/var/run/secrets/tokens/token"]);
    let claims = claims(&token);
    assert_eq!(claims["sub"], "system:serviceaccount:default:bot");
    assert_eq!(claims["kubernetes.io"]["pod"]["name"], "holder");
    assert_eq!(
        claims["kubernetes.io"]["pod"]["uid"],
        n.field("holder", ".metadata.uid").as_str()
    );
    assert_eq!(claims["kubernetes.io"]["node"]["name"], n.name.as_str());
    let kubeconfig = anonymous_kubeconfig(c);
    c.k(&[
        "create",
        "rolebinding",
        "bot-view",
        "--clusterrole=view",
        "--serviceaccount=default:bot",
    ]);
    let out = get_pods_with(c, &kubeconfig, &token);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    // Without its service account the pod is refused by the ServiceAccount admission plugin,
    // as upstream's; once the account exists the pod is admitted and starts.
    let err = c.stdin_kubectl_err(&["apply", "-f", "-"], &pod_with_projected_token("orphan", "ghost"));
    assert!(
        err.contains(
            r#"pods "orphan" is forbidden: error looking up service account default/ghost: serviceaccount "ghost" not found"#
        ),
        "{err}"
    );
    c.k(&["create", "serviceaccount", "ghost"]);
    c.apply(&pod_with_projected_token("orphan", "ghost"), &[]);
    n.wait_running("orphan");
}

/// A TokenReview judges a token for the audiences it names, not only the API server's, and
/// echoes those the token is for, as upstream: what a webhook or a vault checks a token with.
#[test]
fn a_token_review_for_an_audience_of_its_own_accepts_tokens_for_it() {
    let c = Cluster::start(CONTROL_PLANE);
    c.k(&["create", "serviceaccount", "bot"]);
    let token = c.k(&["create", "token", "bot", "--audience", "api"]).trim().to_string();
    let review = |audiences: &str, token: &str| -> serde_json::Value {
        let body = format!(
            r#"{{"apiVersion":"authentication.k8s.io/v1","kind":"TokenReview","spec":{{"token":"{token}","audiences":{audiences}}}}}"#
        );
        serde_json::from_str(&c.stdin_kubectl(&["create", "-f", "-", "-o", "json"], &body)).expect("json")
    };
    let ok = review(r#"["api"]"#, &token);
    assert_eq!(ok["status"]["authenticated"], true, "{ok}");
    assert_eq!(ok["status"]["audiences"], serde_json::json!(["api"]), "{ok}");
    assert_eq!(ok["status"]["user"]["username"], "system:serviceaccount:default:bot");

    let other = review(r#"["vault"]"#, &token);
    assert_eq!(other["status"]["authenticated"], false, "{other}");
    assert_eq!(
        other["status"]["error"],
        r#"token audiences ["api"] is invalid for the target audiences ["vault"]"#
    );
    // Without audiences the API server's own are meant, which this token is not for.
    let none = review("[]", &token);
    assert_eq!(none["status"]["authenticated"], false, "{none}");

    // A token for the API server reviewed for its audience.
    let api_token = c.k(&["create", "token", "bot"]).trim().to_string();
    let own = review(r#"["https://kubernetes.default.svc.cluster.local"]"#, &api_token);
    assert_eq!(own["status"]["authenticated"], true, "{own}");
    assert_eq!(
        own["status"]["audiences"],
        serde_json::json!(["https://kubernetes.default.svc.cluster.local"])
    );
}
