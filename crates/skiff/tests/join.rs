//! Joining nodes with a token (the kubelet's TLS bootstrap): the join token `skiff server`
//! writes, a second node that joins with it, its CertificateSigningRequest approved and issued,
//! its certificate renewed under a short `--cluster-signing-duration`; wrong and expired tokens
//! refused; a user's certificate issued by `kubectl certificate approve`.

#![cfg(test)]

mod common;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use common::node::{Node, remove_node_containers, wait_node_ready};
use common::{Cluster, eventually, tail};

/// A `skiff agent` joined with `--server --token`, stopped and its containers removed on drop.
struct Joined {
    child: Child,
    name: String,
    dir: tempfile::TempDir,
}

impl Joined {
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("agent.log")).unwrap_or_default()
    }
}

impl Drop for Joined {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        remove_node_containers(&self.name);
    }
}

fn agent_cmd(c: &Cluster, name: &str, dir: &Path, token: &str) -> Command {
    let mut cmd = Command::new(common::skiff_bin());
    cmd.arg("agent")
        .arg("--server")
        .arg(format!("https://127.0.0.1:{}", c.port));
    if !token.is_empty() {
        cmd.arg("--token").arg(token);
    }
    cmd.arg("--node-name")
        .arg(name)
        .arg("--data-dir")
        .arg(dir)
        // The server's own node serves the Services and DNS of this host.
        .args(["--disable-kube-proxy", "--disable-cluster-dns"])
        .arg("--eviction-hard")
        .arg(common::TEST_EVICTION_HARD)
        .env("SKIFF_LOG", "info")
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::null());
    cmd
}

fn join(c: &Cluster, tag: &str, token: &str) -> Joined {
    let name = format!("e2e-{tag}-{}", std::process::id());
    let dir = tempfile::tempdir().expect("agent data dir");
    let log = std::fs::File::create(dir.path().join("agent.log")).expect("agent log");
    let child = agent_cmd(c, &name, dir.path(), token)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start skiff agent");
    Joined { child, name, dir }
}

/// `skiff agent` with `token`, expected to stop at once.
fn join_refused(c: &Cluster, token: &str) -> Output {
    let dir = tempfile::tempdir().expect("agent data dir");
    let name = format!("e2e-refused-{}", std::process::id());
    let out = agent_cmd(c, &name, dir.path(), token)
        .output()
        .expect("run skiff agent");
    assert!(!out.status.success(), "the agent joined with {token}");
    assert!(
        c.get_opt(&["node", &name]).is_none(),
        "a refused agent registered its node"
    );
    out
}

fn server_token(c: &Cluster) -> String {
    std::fs::read_to_string(c.path().join("server").join("token"))
        .expect("DATA_DIR/server/token")
        .trim()
        .to_string()
}

fn skiff(c: &Cluster, args: &[&str]) -> Output {
    Command::new(common::skiff_bin())
        .args(args)
        .arg("--kubeconfig")
        .arg(&c.kubeconfig)
        .output()
        .expect("run skiff")
}

/// The CSR rows (NAME ... REQUESTOR ... CONDITION) of `kubectl get csr`.
fn csr_rows(c: &Cluster) -> Vec<Vec<String>> {
    common::table(&c.k(&["get", "csr"])).into_iter().skip(1).collect()
}

/// A node joins with the printed token and runs pods; its bootstrap request shows Approved,Issued
/// under the token's user; with certificates signed for two minutes it renews its own (a
/// `selfnodeclient` request) and stays Ready.
#[test]
fn a_node_joins_with_the_server_token_and_renews_its_certificate() {
    let n = Node::start("join-srv", &["--cluster-signing-duration", "2m"]);
    let c = &n.c;
    let token = server_token(c);
    assert!(token.starts_with("K10") && token.contains("::"), "{token}");
    let id = token
        .rsplit_once("::")
        .and_then(|(_, t)| t.split_once('.'))
        .map(|(id, _)| id.to_string());
    let id = id.expect("token id");

    let joined = join(c, "joined", &token);
    wait_node_ready(c, &joined.name, || joined.log());
    // The join said what it was doing and how long it took.
    let log = joined.log();
    for step in [
        format!("joining https://127.0.0.1:{} as node {}", c.port, joined.name),
        format!("joining https://127.0.0.1:{} as node {}: done in", c.port, joined.name),
        "waiting for its certificate: done in".to_string(),
    ] {
        assert!(log.contains(&step), "no {step:?} in:\n{}", tail(&log, 30));
    }
    let key = joined.dir.path().join("pki").join("kubelet-client-current.pem");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&key)
            .expect("the node's key and certificate")
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
    // Its proxy, DNS, pod network and provisioner read with tokens of their own service
    // accounts, bound to the joined Node (kept mode 0600).
    for account in ["skiff-node-network", "skiff-local-path-provisioner"] {
        let path = joined.dir.path().join("tokens").join(account);
        let token = eventually(Duration::from_secs(20), || std::fs::read_to_string(&path).ok())
            .unwrap_or_else(|| panic!("no token for {account}:\n{}", tail(&joined.log(), 30)));
        assert_eq!(
            std::fs::metadata(&path).expect("token").permissions().mode() & 0o777,
            0o600
        );
        let review = format!(
            "{{\"apiVersion\":\"authentication.k8s.io/v1\",\"kind\":\"TokenReview\",\"spec\":{{\"token\":\"{}\"}}}}",
            token.trim()
        );
        let out = c.stdin_kubectl(&["create", "-f", "-", "-o", "json"], &review);
        let review: serde_json::Value = serde_json::from_str(&out).expect("TokenReview json");
        let user = &review["status"]["user"];
        assert_eq!(
            user["username"],
            format!("system:serviceaccount:kube-system:{account}"),
            "{review}"
        );
        assert_eq!(
            user["extra"]["authentication.kubernetes.io/node-name"][0],
            joined.name.as_str()
        );
    }
    let bootstrap = csr_rows(c)
        .into_iter()
        .find(|r| r.get(3).map(String::as_str) == Some(&format!("system:bootstrap:{id}")))
        .expect("the bootstrap request");
    assert_eq!(bootstrap[2], "kubernetes.io/kube-apiserver-client-kubelet");
    assert_eq!(bootstrap[5], "Approved,Issued", "{bootstrap:?}");

    // A pod on the joined node runs, and its logs come through the API server from that node.
    c.apply(
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: on-joined\nspec:\n  nodeName: {}\n  containers:\n  - name: main\n    image: busybox:latest\n    imagePullPolicy: Never\n    command: [sh, -c, 'echo hello-from-joined; sleep 3600']\n",
            joined.name
        ),
        &[],
    );
    let running = eventually(Duration::from_secs(60), || {
        (c.k(&["get", "pod", "on-joined", "-o", "jsonpath={.status.phase}"]) == "Running").then_some(())
    });
    assert!(
        running.is_some(),
        "{}\n{}",
        c.k(&["describe", "pod", "on-joined"]),
        tail(&joined.log(), 30)
    );
    let logs = eventually(Duration::from_secs(20), || {
        let out = c.kubectl(&["logs", "on-joined"]);
        String::from_utf8_lossy(&out.stdout)
            .contains("hello-from-joined")
            .then_some(())
    });
    assert!(logs.is_some(), "logs: {}", c.k_err(&["logs", "on-joined"]));

    // Renewal: the node's own request, approved as selfnodeclient, issued; the node stays Ready.
    let node_user = format!("system:node:{}", joined.name);
    let renewed = eventually(Duration::from_secs(120), || {
        let issued = csr_rows(c)
            .into_iter()
            .any(|r| r.get(3) == Some(&node_user) && r.get(5).map(String::as_str) == Some("Approved,Issued"));
        (issued && joined.log().contains("node certificate renewed")).then_some(())
    });
    assert!(
        renewed.is_some(),
        "{}\n{}",
        c.k(&["get", "csr"]),
        tail(&joined.log(), 30)
    );
    let approval = c.k(&[
        "get",
        "csr",
        "-o",
        &format!("jsonpath={{.items[?(@.spec.username==\"{node_user}\")].status.conditions[0].message}}"),
    ]);
    assert!(approval.contains("self kubelet client certificate"), "{approval}");
    // Calls after the renewal use the new certificate: the heartbeat goes on.
    let lease = |c: &Cluster| {
        c.k(&[
            "get",
            "lease",
            "-n",
            "kube-node-lease",
            &joined.name,
            "-o",
            "jsonpath={.spec.renewTime}",
        ])
    };
    let before = lease(c);
    let beat = eventually(Duration::from_secs(30), || (lease(c) != before).then_some(()));
    assert!(
        beat.is_some(),
        "no heartbeat after the renewal:\n{}",
        tail(&joined.log(), 20)
    );
    wait_node_ready(c, &joined.name, || joined.log());
    assert_eq!(
        c.k(&["get", "pod", "on-joined", "-o", "jsonpath={.status.phase}"]),
        "Running"
    );
    let _ = c.kubectl(&[
        "delete",
        "pod",
        "on-joined",
        "--grace-period=0",
        "--force",
        "--wait=false",
    ]);
}

/// Tokens that do not authenticate stop the agent with the server's 401 and register nothing:
/// a wrong secret, an expired token, a token whose CA hash is not the server's.
#[test]
fn wrong_or_expired_tokens_are_refused() {
    let c = Cluster::start(&["--no-agent"]);
    let token = server_token(&c);
    let (pinned, bearer) = token.rsplit_once("::").expect("K10HASH::ID.SECRET");
    let (id, _) = bearer.split_once('.').expect("ID.SECRET");

    let wrong = format!("{pinned}::{id}.0000000000000000");
    let out = join_refused(&c, &wrong);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("refused the join token (401"), "{err}");

    let created = skiff(&c, &["token", "create", "--ttl", "4s", "--description", "short"]);
    assert!(created.status.success(), "{}", String::from_utf8_lossy(&created.stderr));
    let short = String::from_utf8_lossy(&created.stdout).trim().to_string();
    assert!(short.starts_with(pinned), "the created token pins the same CA: {short}");
    let list = String::from_utf8_lossy(&skiff(&c, &["token", "list"]).stdout).to_string();
    let short_id = short
        .rsplit_once("::")
        .and_then(|(_, t)| t.split_once('.'))
        .map(|(i, _)| i)
        .unwrap_or("");
    assert!(
        list.contains(short_id) && list.contains("short") && list.contains("<forever>"),
        "{list}"
    );
    // The expiry is written at whole seconds and the token cleaner removes it soon after: the
    // listing above needs the token still there, the join below needs it gone.
    std::thread::sleep(Duration::from_millis(5500));
    let out = join_refused(&c, &short);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("refused the join token (401"), "{err}");

    let other_ca = format!("K10{}::{bearer}", "0".repeat(64));
    let out = join_refused(&c, &other_ca);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is not the one the join token names"), "{err}");

    let out = join_refused(&c, bearer);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("K10"), "a token without the CA's hash: {err}");

    // The token cleaner removes the expired token's Secret.
    let gone = eventually(Duration::from_secs(20), || {
        c.get_opt(&["secret", "-n", "kube-system", &format!("bootstrap-token-{short_id}")])
            .is_none()
            .then_some(())
    });
    assert!(gone.is_some(), "the expired token's Secret is still there");
}

/// A user's request for `kubernetes.io/kube-apiserver-client`: pending until `kubectl
/// certificate approve`, then issued by the cluster CA, and the user authenticates with it.
/// `system:masters` is never issued; `kubectl certificate deny` denies.
#[test]
fn kubectl_certificate_approve_issues_a_client_certificate() {
    let c = Cluster::start(&["--no-agent"]);
    let dir = c.path().to_path_buf();
    let key = dir.join("alice.key");
    let csr_pem = |cn: &str, o: &str, file: &str| -> String {
        let out = Command::new("openssl")
            .args([
                "req",
                "-new",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
            ])
            .arg(dir.join(format!("{file}.key")))
            .args(["-subj", &format!("/CN={cn}/O={o}")])
            .output()
            .expect("openssl req");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(&out.stdout)
    };
    let manifest = |name: &str, request: &str| {
        format!(
            "apiVersion: certificates.k8s.io/v1\nkind: CertificateSigningRequest\nmetadata:\n  name: {name}\nspec:\n  request: {request}\n  signerName: kubernetes.io/kube-apiserver-client\n  expirationSeconds: 86400\n  usages: [client auth]\n"
        )
    };
    c.apply(&manifest("alice", &csr_pem("alice", "devs", "alice")), &[]);
    let row = csr_rows(&c)
        .into_iter()
        .find(|r| r[0] == "alice")
        .expect("alice's request");
    assert_eq!(row[3], "skiff-admin", "the requestor is the caller");
    assert_eq!(row[4], "24h");
    assert_eq!(row[5], "Pending");
    assert!(c.k(&["certificate", "approve", "alice"]).contains("approved"));
    let cert = eventually(Duration::from_secs(20), || {
        let b64 = c.k(&["get", "csr", "alice", "-o", "jsonpath={.status.certificate}"]);
        (!b64.is_empty()).then_some(b64)
    })
    .expect("alice's certificate issued");
    assert_eq!(
        csr_rows(&c)
            .into_iter()
            .find(|r| r[0] == "alice")
            .map(|r| r[5].clone())
            .as_deref(),
        Some("Approved,Issued")
    );
    use base64::Engine;
    let cert = base64::engine::general_purpose::STANDARD
        .decode(cert.trim())
        .expect("base64");
    std::fs::write(dir.join("alice.crt"), &cert).expect("write the certificate");
    let kc = dir.join("alice.kubeconfig");
    std::fs::write(
        &kc,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:{}\n    certificate-authority: {}\nusers:\n- name: alice\n  user:\n    client-certificate: {}\n    client-key: {}\ncontexts:\n- name: c\n  context: {{cluster: c, user: alice}}\ncurrent-context: c\n",
            c.port,
            dir.join("pki").join("ca.crt").display(),
            dir.join("alice.crt").display(),
            key.display()
        ),
    )
    .expect("write alice's kubeconfig");
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&kc)
        .args([
            "auth",
            "whoami",
            "-o",
            "jsonpath={.status.userInfo.username} {.status.userInfo.groups}",
        ])
        .env("HOME", c.home.path())
        .env_remove("KUBECONFIG")
        .output()
        .expect("kubectl auth whoami");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(text.starts_with("alice ") && text.contains("devs"), "{text}");

    // Deny.
    c.apply(&manifest("bob", &csr_pem("bob", "devs", "bob")), &[]);
    assert!(c.k(&["certificate", "deny", "bob"]).contains("denied"));
    assert_eq!(
        csr_rows(&c)
            .into_iter()
            .find(|r| r[0] == "bob")
            .map(|r| r[5].clone())
            .as_deref(),
        Some("Denied")
    );

    // CertificateSubjectRestriction.
    let err = c.stdin_kubectl_err(
        &["create", "-f", "-"],
        &manifest("mallory", &csr_pem("mallory", "system:masters", "mallory")),
    );
    assert!(
        err.contains("use of kubernetes.io/kube-apiserver-client signer with system:masters group is not allowed"),
        "{err}"
    );
}
