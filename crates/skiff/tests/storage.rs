//! Storage out of the box, as a user meets it: seed 003's StatefulSet with a claim template on
//! `skiff server` and its real Docker node. Its claims get the default `local-path` class, the
//! scheduler picks the node, the node's provisioner makes a directory and a volume for each claim,
//! and the data written by `web-0` is there again for the next `web-0`: after the pod is deleted,
//! after a scale to 0 and back, and after the server restarts. With `whenDeleted: Delete`,
//! deleting the set removes its claims, their volumes and their directories.

#![cfg(test)]

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::node::Node;
use common::seeds::statefulset_web_on_busybox;
use common::storage::{claim_phase, claim_template, wait_for};

/// Seed 003's StatefulSet behind its headless Service, with a claim template (no class: the
/// default one) mounted at /data, serving it with busybox's httpd.
fn web() -> String {
    let mount = "        volumeMounts:\n        - name: www\n          mountPath: /data\n";
    statefulset_web_on_busybox("exec httpd -f -p 80 -h /data") + mount + &claim_template("www", None)
}

fn pod_uid(n: &Node, pod: &str) -> String {
    n.c.kubectl(&["get", "pod", pod, "-o", "jsonpath={.metadata.uid}"])
        .stdout
        .iter()
        .map(|b| *b as char)
        .collect()
}

fn exec(n: &Node, pod: &str, script: &str) -> String {
    n.c.k(&["exec", pod, "--", "sh", "-c", script]).trim().to_string()
}

/// The directory the local-path provisioner made for a claim (its volume's hostPath).
fn volume_dir(n: &Node, claim: &str) -> PathBuf {
    let volume = n.c.k(&["get", "pvc", claim, "-o", "jsonpath={.spec.volumeName}"]);
    PathBuf::from(n.c.k(&["get", "pv", &volume, "-o", "jsonpath={.spec.hostPath.path}"]))
}

fn wait_pods_running(n: &Node, pods: &[&str]) {
    for p in pods {
        n.wait_running(p);
    }
}

#[test]
fn statefulset_claims_keep_their_data_through_deletes_scaling_and_restarts() {
    let mut n = Node::start("storage", &[]);
    // The default class, as `kubectl get storageclass` shows it.
    let classes = n.c.k(&["get", "storageclass"]);
    assert!(classes.contains("local-path (default)"), "{classes}");
    assert!(classes.contains("WaitForFirstConsumer"), "{classes}");

    n.c.apply(&web(), &[]);
    wait_pods_running(&n, &["web-0", "web-1"]);
    for claim in ["www-web-0", "www-web-1"] {
        let line = n.c.k(&["get", "pvc", claim, "--no-headers"]);
        assert!(
            line.contains("Bound") && line.contains("local-path") && line.contains("1Gi"),
            "{line}"
        );
        let selected = n.c.k(&[
            "get",
            "pvc",
            claim,
            "-o",
            "jsonpath={.metadata.annotations.volume\\.kubernetes\\.io/selected-node}",
        ]);
        assert_eq!(selected, n.name, "{claim} provisioned for the scheduler's node");
        assert!(volume_dir(&n, claim).is_dir(), "{claim}'s directory exists");
    }
    let dir0 = volume_dir(&n, "www-web-0");
    let dir1 = volume_dir(&n, "www-web-1");
    assert_ne!(dir0, dir1);

    // web-0 writes; the file is in its claim's directory on the node.
    let first_uid = pod_uid(&n, "web-0");
    exec(&n, "web-0", "echo written-by-$(hostname)-first > /data/state");
    assert_eq!(
        std::fs::read_to_string(dir0.join("state")).unwrap_or_default().trim(),
        "written-by-web-0-first"
    );

    // A new web-0 finds the same data.
    n.c.k(&["delete", "pod", "web-0", "--wait=false"]);
    wait_for(&n.c, "web-0 recreated", Duration::from_secs(90), || {
        let uid = pod_uid(&n, "web-0");
        !uid.is_empty() && uid != first_uid
    });
    n.wait_running("web-0");
    assert_eq!(exec(&n, "web-0", "cat /data/state"), "written-by-web-0-first");
    assert_eq!(volume_dir(&n, "www-web-0"), dir0, "the same volume");

    // Scaled to 0 the claims stay bound; scaled back the pods find their data.
    n.c.k(&["scale", "statefulset", "web", "--replicas=0"]);
    wait_for(&n.c, "pods gone after scale to 0", Duration::from_secs(90), || {
        n.c.k(&["get", "pods", "-l", "app=nginx", "-o", "name"])
            .trim()
            .is_empty()
    });
    for claim in ["www-web-0", "www-web-1"] {
        assert_eq!(claim_phase(&n.c, claim), "Bound", "{claim} kept while scaled to 0");
    }
    n.c.k(&["scale", "statefulset", "web", "--replicas=2"]);
    wait_pods_running(&n, &["web-0", "web-1"]);
    assert_eq!(exec(&n, "web-0", "cat /data/state"), "written-by-web-0-first");
    exec(&n, "web-1", "echo one > /data/state");

    // A restart of the server keeps every binding.
    let volumes_before = n.c.k(&["get", "pvc", "-o", "jsonpath={.items[*].spec.volumeName}"]);
    n.c.restart();
    let volumes_after = n.c.k(&["get", "pvc", "-o", "jsonpath={.items[*].spec.volumeName}"]);
    assert_eq!(volumes_before, volumes_after);
    let phases = n.c.k(&["get", "pv", "-o", "jsonpath={.items[*].status.phase}"]);
    assert_eq!(phases, "Bound Bound", "{phases}");
    n.c.k(&["delete", "pod", "web-1", "--wait=false"]);
    wait_pods_running(&n, &["web-0", "web-1"]);
    wait_for(
        &n.c,
        "web-1 reads its data after the restart",
        Duration::from_secs(60),
        || {
            n.c.kubectl(&["exec", "web-1", "--", "cat", "/data/state"])
                .stdout
                .starts_with(b"one")
        },
    );

    // whenDeleted: Delete — deleting the set removes claims, volumes and directories.
    n.c.k(&[
        "patch",
        "statefulset",
        "web",
        "--type=merge",
        "-p",
        r#"{"spec":{"persistentVolumeClaimRetentionPolicy":{"whenDeleted":"Delete"}}}"#,
    ]);
    // The controller hands the claims to the set first (upstream's claim owner update).
    wait_for(&n.c, "claims owned by the set", Duration::from_secs(60), || {
        ["www-web-0", "www-web-1"].iter().all(|claim| {
            n.c.k(&[
                "get",
                "pvc",
                claim,
                "-o",
                "jsonpath={.metadata.ownerReferences[*].kind}",
            ])
            .contains("StatefulSet")
        })
    });
    n.c.k(&["delete", "statefulset", "web"]);
    wait_for(&n.c, "claims and volumes removed", Duration::from_secs(120), || {
        n.c.k(&["get", "pvc,pv", "-o", "name"]).trim().is_empty()
    });
    wait_for(&n.c, "directories removed", Duration::from_secs(30), || {
        !Path::new(&dir0).exists() && !Path::new(&dir1).exists()
    });
}
