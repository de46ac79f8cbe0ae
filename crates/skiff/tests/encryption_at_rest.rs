//! Encryption at rest of Secrets with the real kubectl: on by default (a generated secretbox
//! key), `skiff secrets-encrypt status|rotate-keys|reencrypt`, upstream's
//! `--encryption-provider-config`, and no plaintext left in the database files afterwards.

#![cfg(test)]

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};

use base64::Engine;
use common::{Cluster, free_port, skiff_bin};

/// Only the API server: nothing else writes.
const CONTROL_PLANE: &[&str] = &["--no-agent", "--no-scheduler", "--no-controllers"];

/// A value found nowhere else on this machine.
fn unique(what: &str) -> String {
    format!("skiff-e2e-{what}-{:016x}", rand::random::<u64>())
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// Which of the database files hold `needle` (as it is, or base64 as Secret data holds it).
fn files_holding(dir: &Path, needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for file in ["state.db", "state.db-wal", "state.db-shm"] {
        let Ok(bytes) = std::fs::read(dir.join(file)) else {
            continue;
        };
        for form in [needle.to_string(), b64(needle)] {
            if contains(&bytes, &form) {
                found.push(format!("{file}: {form}"));
            }
        }
    }
    found
}

fn assert_no_plaintext(c: &Cluster, values: &[&str]) {
    for value in values {
        let found = files_holding(c.path(), value);
        assert!(found.is_empty(), "plaintext on disk: {found:?}");
    }
}

/// The latest stored value of `key`, read with SQLite next to the running server.
fn stored(c: &Cluster, key: &str) -> Vec<u8> {
    let conn = rusqlite::Connection::open(c.path().join("state.db")).expect("open the database");
    conn.busy_timeout(std::time::Duration::from_secs(10))
        .expect("busy timeout");
    conn.query_row(
        "SELECT value FROM kv WHERE name = ?1 AND deleted = 0 ORDER BY id DESC LIMIT 1",
        [key],
        |r| r.get(0),
    )
    .expect("the key's row")
}

fn assert_stored_with(c: &Cluster, key: &str, prefix: &str) {
    let value = stored(c, key);
    assert!(
        value.starts_with(prefix.as_bytes()),
        "{key} is stored as {:?}",
        String::from_utf8_lossy(&value[..value.len().min(60)])
    );
}

fn secrets_encrypt(c: &Cluster, op: &str) -> Output {
    Command::new(skiff_bin())
        .args(["secrets-encrypt", op, "--kubeconfig"])
        .arg(&c.kubeconfig)
        .env("HOME", c.home.path())
        .stdin(Stdio::null())
        .output()
        .expect("run skiff secrets-encrypt")
}

/// `skiff secrets-encrypt OP`, which must succeed; returns what it printed.
fn se(c: &Cluster, op: &str) -> String {
    let out = secrets_encrypt(c, op);
    assert!(
        out.status.success(),
        "secrets-encrypt {op}: {}\nserver log tail:\n{}",
        String::from_utf8_lossy(&out.stderr),
        common::tail(&c.log(), 30)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The status line of one provider and key: (secrets, note).
fn status_row(status: &str, provider: &str, key: &str) -> (usize, String) {
    let line = status
        .lines()
        .find(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            cols.len() >= 3 && cols[0] == provider && cols[1] == key
        })
        .unwrap_or_else(|| panic!("no {provider} {key} row in:\n{status}"));
    let cols: Vec<&str> = line.split_whitespace().collect();
    (cols[2].parse().expect("a count"), cols[3..].join(" "))
}

fn password(c: &Cluster, name: &str) -> String {
    let data = c.k(&["get", "secret", name, "-o", "jsonpath={.data.password}"]);
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .expect("base64 data");
    String::from_utf8(bytes).expect("utf-8")
}

fn create_secret(c: &Cluster, name: &str, value: &str) {
    c.k(&[
        "create",
        "secret",
        "generic",
        name,
        &format!("--from-literal=password={value}"),
    ]);
}

#[test]
fn secrets_are_encrypted_by_default_and_keys_rotate() {
    let mut c = Cluster::start(CONTROL_PLANE);
    let value = unique("default");
    create_secret(&c, "s", &value);
    assert_eq!(password(&c, "s"), value);
    assert_no_plaintext(&c, &[&value]);
    assert_stored_with(&c, "/registry/secrets/default/s", "k8s:enc:secretbox:v1:key-1:");
    // The generated configuration, private to its owner.
    let config = c.path().join("encryption-config.yaml");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&config)
            .expect("generated config")
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(text.contains("kind: EncryptionConfiguration\n"), "{text}");

    // The key outlives a restart.
    c.restart();
    assert_eq!(password(&c, "s"), value);

    let status = se(&c, "status");
    assert!(status.contains("Encryption at rest of Secrets: enabled"), "{status}");
    assert!(status.contains("Active: secretbox key key-1"), "{status}");
    // The test's Secret and the server's join token (`kube-system/bootstrap-token-ID`).
    assert_eq!(status_row(&status, "secretbox", "key-1"), (2, "active".into()));
    assert_eq!(status_row(&status, "identity", "-"), (0, "decrypt only".into()));

    let rotated = se(&c, "rotate-keys");
    assert!(rotated.contains("New secretbox key key-2"), "{rotated}");
    assert!(
        rotated.contains("Re-encrypted 2 Secrets with secretbox key key-2"),
        "{rotated}"
    );
    assert_eq!(password(&c, "s"), value);
    assert_stored_with(&c, "/registry/secrets/default/s", "k8s:enc:secretbox:v1:key-2:");
    assert_no_plaintext(&c, &[&value]);
    let status = se(&c, "status");
    assert!(status.contains("Active: secretbox key key-2"), "{status}");
    assert_eq!(status_row(&status, "secretbox", "key-2"), (2, "active".into()));
    assert_eq!(status_row(&status, "secretbox", "key-1"), (0, "decrypt only".into()));

    // Secrets written after the rotation use the new key, and all read after a restart.
    let later = unique("later");
    create_secret(&c, "later", &later);
    assert_stored_with(&c, "/registry/secrets/default/later", "k8s:enc:secretbox:v1:key-2:");
    c.restart();
    assert_eq!(password(&c, "s"), value);
    assert_eq!(password(&c, "later"), later);
    assert_no_plaintext(&c, &[&value, &later]);

    // Only cluster administrators: a service account's token is refused.
    c.k(&["create", "serviceaccount", "bot"]);
    let token = c.k(&["create", "token", "bot"]).trim().to_string();
    let ca = c.path().join("pki").join("ca.crt");
    let out = Command::new("kubectl")
        .args(["--kubeconfig", "/dev/null", "--server"])
        .arg(format!("https://127.0.0.1:{}", c.port))
        .arg("--certificate-authority")
        .arg(&ca)
        .args(["--token", &token, "get", "--raw", "/skiff/secrets-encrypt/status"])
        .env("HOME", c.home.path())
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        .output()
        .expect("kubectl");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a service account read the status");
    assert!(
        stderr.contains(
            "forbidden: User \"system:serviceaccount:default:bot\" cannot get path \"/skiff/secrets-encrypt/status\""
        ),
        "{stderr}"
    );
}

fn config_file(providers: &str) -> String {
    format!(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n  - resources:\n      - secrets\n    providers:\n{providers}"
    )
}

fn aesgcm(name: &str, secret: &str) -> String {
    format!("      - aesgcm:\n          keys:\n            - name: {name}\n              secret: {secret}\n")
}

#[test]
fn moving_from_identity_to_aesgcm_leaves_no_plaintext() {
    let config_dir = tempfile::tempdir().expect("config dir");
    let config = config_dir.path().join("encryption.yaml");
    let key = b64("0123456789abcdef0123456789abcdef");
    std::fs::write(
        &config,
        config_file(&format!("      - identity: {{}}\n{}", aesgcm("k1", &key))),
    )
    .unwrap();
    let config_arg = config.to_str().unwrap();
    let mut c = Cluster::start(&[CONTROL_PLANE, &["--encryption-provider-config", config_arg]].concat());
    assert!(
        !c.path().join("encryption-config.yaml").exists(),
        "nothing is generated when a configuration is given"
    );

    // Written as they are: a Secret, one with a history of values, one deleted.
    let (kept, first, second, last, gone) = (
        unique("kept"),
        unique("first"),
        unique("second"),
        unique("last"),
        unique("gone"),
    );
    create_secret(&c, "kept", &kept);
    create_secret(&c, "changing", &first);
    for next in [&second, &last] {
        let patch = format!("{{\"data\":{{\"password\":\"{}\"}}}}", b64(next));
        c.k(&["patch", "secret", "changing", "-p", &patch]);
    }
    create_secret(&c, "gone", &gone);
    c.k(&["delete", "secret", "gone"]);
    let all = [&kept, &first, &second, &last, &gone].map(String::as_str);
    for value in all {
        assert!(
            !files_holding(c.path(), value).is_empty(),
            "{value} is on disk in plaintext at first"
        );
    }
    let status = se(&c, "status");
    assert!(status.contains("Encryption at rest of Secrets: disabled"), "{status}");
    assert!(status.contains("given with --encryption-provider-config"), "{status}");
    // The test's Secrets and the server's join token.
    assert_eq!(status_row(&status, "identity", "-"), (3, "active".into()));

    // The operator's file is theirs: rotate-keys does not edit it.
    let out = secrets_encrypt(&c, "rotate-keys");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("was given with --encryption-provider-config, so skiff does not edit it"),
        "{stderr}"
    );

    // aesgcm first, identity after it to read what is stored as it is; then re-encrypt.
    std::fs::write(
        &config,
        config_file(&format!("{}      - identity: {{}}\n", aesgcm("k1", &key))),
    )
    .unwrap();
    c.restart();
    assert_eq!(password(&c, "changing"), last);
    let out = se(&c, "reencrypt");
    assert!(out.contains("Re-encrypted 3 Secrets with aesgcm key k1"), "{out}");
    assert_no_plaintext(&c, &all);
    for name in ["kept", "changing"] {
        assert_stored_with(
            &c,
            &format!("/registry/secrets/default/{name}"),
            "k8s:enc:aesgcm:v1:k1:",
        );
    }
    assert_eq!(password(&c, "kept"), kept);
    assert_eq!(password(&c, "changing"), last);
    let status = se(&c, "status");
    assert_eq!(status_row(&status, "aesgcm", "k1"), (3, "active".into()));
    assert_eq!(status_row(&status, "identity", "-"), (0, "decrypt only".into()));

    // Without identity the old plaintext could not be read; nothing is plaintext any more, so
    // the server reads everything with aesgcm alone.
    std::fs::write(&config, config_file(&aesgcm("k1", &key))).unwrap();
    c.restart();
    assert_eq!(password(&c, "kept"), kept);
    assert_no_plaintext(&c, &all);
}

#[test]
fn an_invalid_configuration_stops_the_start_with_upstreams_error() {
    let dir = tempfile::tempdir().expect("data dir");
    let config = dir.path().join("encryption.yaml");
    std::fs::write(&config, config_file(&aesgcm("k1", &b64("too short")))).unwrap();
    let out = Command::new(skiff_bin())
        .arg("server")
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args([
            "--port",
            &free_port().to_string(),
            "--no-agent",
            "--encryption-provider-config",
        ])
        .arg(&config)
        .env("HOME", dir.path())
        .stdin(Stdio::null())
        .output()
        .expect("run skiff server");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the server started: {stderr}");
    assert!(
        stderr.contains(
            "error while parsing file: resources[0].providers[0].aesgcm.keys[0].secret: Invalid value: \"REDACTED\": secret is not of the expected length, got 9, expected one of [16 24 32]"
        ),
        "{stderr}"
    );
}
