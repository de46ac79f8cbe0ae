//! What a person or a log collector reads of a server: stderr without colour codes when it is
//! not a terminal, JSON lines with `--log-format json`, and one line on stdout once the cluster
//! is usable.

#![cfg(test)]

mod common;

use std::io::BufRead;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::Cluster;

#[test]
fn logs_are_plain_text_when_redirected_and_json_when_asked() {
    let text = Cluster::start(&["--no-agent", "--no-scheduler"]);
    let log = text.log();
    assert!(log.contains(" INFO "), "{log}");
    assert!(!log.contains('\u{1b}'), "colour codes in a redirected log:\n{log}");
    drop(text);

    let json = Cluster::start(&["--no-agent", "--no-scheduler", "--log-format", "json"]);
    let log = json.log();
    let mut lines = 0;
    for line in log.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
        assert!(v["timestamp"].is_string() && v["level"].is_string(), "{line}");
        assert!(v["fields"]["message"].is_string(), "{line}");
        lines += 1;
    }
    assert!(lines > 3, "{log}");
    assert!(log.contains("\"message\":\"opened sqlite store\""), "{log}");
}

#[test]
fn the_server_says_in_one_line_where_to_go_once_ready() {
    let dir = tempfile::tempdir().expect("data dir");
    let home = tempfile::tempdir().expect("home");
    let port = common::free_port();
    let mut child = Command::new(common::skiff_bin())
        .args(["server", "--no-agent", "--no-scheduler", "--port", &port.to_string()])
        .arg("--data-dir")
        .arg(dir.path())
        .args(["--service-cluster-ip-range", &common::own_service_range(port)])
        .env("HOME", home.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("skiff server");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    let ready = loop {
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(line) if line.starts_with("skiff: ready in ") => break Some(line),
            Ok(line) => seen.push(line),
            Err(_) => break None,
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    let ready = ready.unwrap_or_else(|| panic!("no ready line; stdout:\n{}", seen.join("\n")));
    let kubeconfig = dir.path().join("kubeconfig");
    assert!(
        ready.contains(&format!("export KUBECONFIG={}", kubeconfig.display())),
        "{ready}"
    );
    assert!(ready.contains("; no local node; "), "{ready}");
    assert!(
        ready.contains("join other nodes with: skiff agent --server https://") && ready.contains(" --token K10"),
        "{ready}"
    );
}
