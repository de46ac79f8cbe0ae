//! Odd request paths as an attacker sends them, over the server's real HTTPS, as users bound
//! only to `view` and with no role at all: an empty namespace segment (`namespaces//secrets`),
//! doubled and trailing slashes, percent-encoded slashes, `..`, the `/watch/` prefix with a
//! write. Every request is sent byte for byte (`curl --path-as-is`), with the user's own client
//! certificate from `skiff kubeconfig user`. Nothing may answer with a Secret, and the answers
//! are upstream's: the 403 of the scope the path really names, or 400/404/405.

#![cfg(test)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine;
use common::Cluster;

const CONTROL_PLANE: &[&str] = &["--no-agent", "--no-scheduler"];

/// A user's client credentials in files, for curl.
struct Creds {
    server: String,
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

fn creds(c: &Cluster, user: &str) -> Creds {
    let kubeconfig = common::issued_kubeconfig(c, &["user", user], &format!("{user}.kubeconfig"));
    creds_from(c, &kubeconfig, user)
}

fn creds_from(c: &Cluster, kubeconfig: &Path, user: &str) -> Creds {
    let field = |jsonpath: &str| {
        let out = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["config", "view", "--raw", "-o", &format!("jsonpath={jsonpath}")])
            .env("HOME", c.home.path())
            .output()
            .expect("kubectl config view");
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let write = |name: &str, b64: String| -> PathBuf {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .expect("base64 in kubeconfig");
        let path = c.path().join(format!("{user}-{name}"));
        std::fs::write(&path, bytes).expect("write credential");
        path
    };
    Creds {
        server: field("{.clusters[0].cluster.server}"),
        ca: write("ca.crt", field("{.clusters[0].cluster.certificate-authority-data}")),
        cert: write("client.crt", field("{.users[0].user.client-certificate-data}")),
        key: write("client.key", field("{.users[0].user.client-key-data}")),
    }
}

/// `METHOD PATH` sent as it is: the status code and the body.
fn send(creds: &Creds, method: &str, path: &str) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-sS", "--path-as-is", "-X", method, "-o", "-", "-w", "\n%{http_code}"])
        .arg("--cacert")
        .arg(&creds.ca)
        .arg("--cert")
        .arg(&creds.cert)
        .arg("--key")
        .arg(&creds.key)
        .args(["-H", "Content-Type: application/json"])
        .args(if matches!(method, "POST" | "PUT" | "PATCH") {
            vec!["--data", "{}"]
        } else {
            vec![]
        })
        .arg(format!("{}{path}", creds.server))
        .output()
        .expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

#[test]
fn odd_paths_never_reach_a_secret() {
    let c = Cluster::start(CONTROL_PLANE);
    c.k(&["create", "namespace", "a"]);
    c.k(&[
        "create",
        "secret",
        "generic",
        "hidden",
        "-n",
        "a",
        "--from-literal=password=s3cr3t-value",
    ]);
    c.k(&[
        "create",
        "clusterrolebinding",
        "jane-view",
        "--clusterrole=view",
        "--user=jane",
    ]);
    let jane = creds(&c, "jane");
    let nobody = creds(&c, "nobody");
    assert!(jane.cert.exists() && nobody.key.exists());

    // The request of the report: an empty namespace is the cluster scope, where `view` grants
    // no Secret.
    let (code, body) = send(&jane, "GET", "/api/v1/namespaces//secrets");
    assert_eq!(code, 403, "{body}");
    assert!(
        body.contains(
            "secrets is forbidden: User \\\"jane\\\" cannot list resource \\\"secrets\\\" in API group \\\"\\\" at the cluster scope"
        ),
        "{body}"
    );
    // The same through the real kubectl.
    let out = c.kubectl(&["get", "--raw", "/api/v1/namespaces//secrets", "--as", "jane"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Forbidden") || err.contains("forbidden"), "{err}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("hidden"));

    // What `view` may do still works, read through odd but equivalent paths.
    for path in [
        "/api/v1/namespaces/a/configmaps",
        "/api/v1/namespaces/a/configmaps/",
        "//api/v1/namespaces/a/configmaps",
        "/api/v1/namespaces/a%2Fconfigmaps",
    ] {
        let (code, body) = send(&jane, "GET", path);
        assert_eq!(code, 200, "{path}: {body}");
        assert!(body.contains("ConfigMapList"), "{path}: {body}");
    }

    // Every odd path to a Secret: no 2xx, no Secret's name or value, as either user.
    let odd = [
        ("GET", "/api/v1/namespaces//secrets"),
        ("GET", "/api/v1/namespaces//secrets/"),
        ("GET", "/api/v1/namespaces//secrets/hidden"),
        ("GET", "//api/v1/namespaces//secrets"),
        ("GET", "/api/v1//namespaces/a/secrets"),
        ("GET", "/api/v1/namespaces/a//secrets"),
        ("GET", "/api/v1/namespaces/a/secrets/"),
        ("GET", "/api/v1/namespaces/a/secrets/hidden/"),
        ("GET", "/api/v1/namespaces%2F%2Fsecrets"),
        ("GET", "/api/v1/namespaces/a%2Fsecrets"),
        ("GET", "/api/v1/namespaces/a%2fsecrets%2fhidden"),
        ("GET", "/api/v1/namespaces/a/configmaps/../secrets/hidden"),
        ("GET", "/api/v1/namespaces/a/configmaps/%2E%2E/secrets"),
        ("GET", "/api/v1/namespaces/a/pods/../../a/secrets"),
        ("GET", "/api/v1/namespaces/../secrets"),
        ("GET", "/api/v1/namespaces/secrets"),
        ("GET", "/api/v1/secrets"),
        ("GET", "/api/v1/secrets/hidden"),
        ("GET", "/api/v1/watch/namespaces//secrets"),
        ("GET", "/api/v1/watch/namespaces/a/secrets?timeoutSeconds=1"),
        ("GET", "/api/v1/namespaces/a/secrets?watch=true&timeoutSeconds=1"),
        (
            "GET",
            "/api/v1/namespaces/a/secrets?fieldSelector=metadata.name%3Dhidden",
        ),
        ("GET", "/api/v1/namespaces/a/configmaps/x?watch=true"),
        ("GET", "/apis//v1/secrets"),
        ("GET", "/apis//v1/namespaces/a/secrets"),
        ("GET", "/api/v1/namespaces/a/nodes/../secrets"),
        ("GET", "/api/v1/namespaces/a/secrets/hidden/status"),
        ("POST", "/api/v1/watch/namespaces/a/secrets"),
        ("PUT", "/api/v1/namespaces//secrets/hidden"),
        ("PATCH", "/api/v1/namespaces//secrets/hidden"),
        ("DELETE", "/api/v1/namespaces//secrets/hidden"),
        ("DELETE", "/api/v1/namespaces//secrets"),
        ("POST", "/api/v1/namespaces//secrets"),
        ("GET", "/api/v1/proxy/namespaces/a/secrets"),
        ("GET", "/api/v1/%zz/secrets"),
    ];
    for (who, creds) in [("jane", &jane), ("nobody", &nobody)] {
        for (method, path) in odd {
            let (code, body) = send(creds, method, path);
            assert!(!(200..300).contains(&code), "{who} {method} {path}: {code} {body}");
            assert!(
                // Whitespace removed: curl's answers are indented.
                !body.contains("czNjcjN0")
                    && !body
                        .split_whitespace()
                        .collect::<String>()
                        .contains("\"kind\":\"Secret"),
                "{who} {method} {path}: {code} {body}"
            );
            assert!(
                matches!(code, 400 | 403 | 404 | 405),
                "{who} {method} {path}: {code} {body}"
            );
        }
    }

    // An administrator's odd paths name what they say, and nothing else.
    let admin = c.k(&["get", "--raw", "/api/v1/namespaces//secrets"]);
    assert!(admin.contains("\"hidden\""), "{admin}");
    let out = c.kubectl(&["get", "--raw", "/api/v1/namespaces//secrets/hidden"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Namespace parameter required"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = c.kubectl(&["get", "--raw", "/api/v1/namespaces/a/secrets/.."]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("may not be '..'"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A write sent to a `/watch/` path is refused (405), not served as a create.
    let admin = creds_from(&c, &c.path().join("kubeconfig"), "admin");
    let (code, body) = send(&admin, "POST", "/api/v1/watch/namespaces/a/configmaps");
    assert_eq!(code, 405, "{body}");
    let (code, body) = send(&admin, "DELETE", "/api/v1/namespaces//secrets");
    assert_eq!(code, 405, "{body}");
    let out = c.k(&["get", "secrets", "-n", "a", "-o", "name"]);
    assert_eq!(out.trim(), "secret/hidden");
}
