//! Seed 000 section 2.3's NoExecute taint, end to end on `skiff server --sim-nodes 1` with the real
//! kubectl: `kubectl taint node N key=value:NoExecute` evicts the node's pods that do not tolerate
//! it at once, those that tolerate it for `tolerationSeconds` when that time has passed, never those
//! that tolerate it for good, and removing the taint in time cancels a scheduled eviction.

#![cfg(test)]

mod common;

use std::time::{Duration, Instant};

use common::{Cluster, eventually};

fn pod(name: &str, toleration: Option<&str>) -> String {
    let tolerations = match toleration {
        Some(extra) => format!(
            "  tolerations:\n  - key: \"key\"\n    operator: \"Equal\"\n    value: \"value\"\n    effect: \"NoExecute\"\n{extra}"
        ),
        None => String::new(),
    };
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  containers:\n  - name: c\n    image: busybox:latest\n{tolerations}"
    )
}

fn exists(c: &Cluster, name: &str) -> bool {
    c.kubectl(&["get", "pod", name]).status.success()
}

fn wait_running(c: &Cluster, names: &[&str]) {
    let running = eventually(Duration::from_secs(30), || {
        names
            .iter()
            .all(|n| c.k(&["get", "pod", n, "-o", "jsonpath={.status.phase}"]) == "Running")
            .then_some(())
    });
    assert!(running.is_some(), "{}", c.k(&["get", "pods", "-o", "wide"]));
}

fn events(c: &Cluster) -> String {
    c.event_messages("reason=TaintManagerEviction")
}

#[test]
fn no_execute_taints_evict_as_tolerations_say() {
    let c = Cluster::start(&["--no-agent", "--sim-nodes", "1"]);
    let node = eventually(Duration::from_secs(30), || {
        let n = c.k(&["get", "nodes", "-o", "jsonpath={.items[0].metadata.name}"]);
        (!n.is_empty()).then_some(n)
    })
    .expect("a node");
    c.apply(&pod("untolerated", None), &[]);
    c.apply(&pod("for-five-seconds", Some("    tolerationSeconds: 5\n")), &[]);
    c.apply(&pod("forever", Some("")), &[]);
    wait_running(&c, &["untolerated", "for-five-seconds", "forever"]);

    let tainted = Instant::now();
    c.k(&["taint", "node", &node, "key=value:NoExecute"]);
    let gone = eventually(Duration::from_secs(10), || (!exists(&c, "untolerated")).then_some(()));
    assert!(gone.is_some(), "the untolerated pod stays");
    assert!(
        tainted.elapsed() < Duration::from_secs(4),
        "evicted after {:?}",
        tainted.elapsed()
    );
    assert!(exists(&c, "for-five-seconds"), "evicted before its tolerationSeconds");
    let gone = eventually(Duration::from_secs(20), || {
        (!exists(&c, "for-five-seconds")).then_some(())
    });
    assert!(gone.is_some(), "the pod tolerating for 5 s stays");
    let after = tainted.elapsed();
    assert!(
        after >= Duration::from_secs(5) && after < Duration::from_secs(12),
        "evicted after {after:?}"
    );
    assert!(exists(&c, "forever"), "a pod tolerating the taint for good was evicted");
    let text = events(&c);
    assert!(text.contains("Marking for deletion Pod default/untolerated"), "{text}");
    assert!(
        text.contains("Marking for deletion Pod default/for-five-seconds"),
        "{text}"
    );

    // A second taint a pod does not tolerate: out at once, whatever it tolerates of the first
    // (`forever` goes too).
    c.k(&["taint", "node", &node, "key=value:NoExecute-"]);
    c.apply(&pod("two-taints", Some("    tolerationSeconds: 60\n")), &[]);
    wait_running(&c, &["two-taints"]);
    c.k(&["taint", "node", &node, "key=value:NoExecute"]);
    c.k(&["taint", "node", &node, "other=x:NoExecute"]);
    let gone = eventually(Duration::from_secs(10), || (!exists(&c, "two-taints")).then_some(()));
    assert!(
        gone.is_some(),
        "a pod on a node with a taint it does not tolerate stays"
    );
    c.k(&["taint", "node", &node, "other=x:NoExecute-"]);
    c.k(&["taint", "node", &node, "key=value:NoExecute-"]);

    // The taint goes in time: the scheduled eviction is cancelled.

    c.apply(&pod("kept", Some("    tolerationSeconds: 4\n")), &[]);
    wait_running(&c, &["kept"]);
    c.k(&["taint", "node", &node, "key=value:NoExecute"]);
    std::thread::sleep(Duration::from_secs(1));
    c.k(&["taint", "node", &node, "key=value:NoExecute-"]);
    std::thread::sleep(Duration::from_secs(6));
    assert!(exists(&c, "kept"), "the eviction was not cancelled with the taint");
    let text = events(&c);
    assert!(text.contains("Cancelling deletion of Pod default/kept"), "{text}");
}
