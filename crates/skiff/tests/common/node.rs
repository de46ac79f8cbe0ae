//! A cluster with a real node agent under a name of its own, for the Docker tests: waits for
//! the node to be Ready, and removes that node's containers when dropped.

use std::process::Command;
use std::time::Duration;

use super::{Cluster, eventually, tail};

pub struct Node {
    pub c: Cluster,
    pub name: String,
}

impl Node {
    /// `skiff server --node-name e2e-TAG-PID` plus `extra` flags, its node Ready.
    pub fn start(tag: &str, extra: &[&str]) -> Node {
        let name = format!("e2e-{tag}-{}", std::process::id());
        let c = Cluster::start(&[extra, &["--node-name", &name]].concat());
        let n = Node { c, name };
        wait_node_ready(&n.c, &n.name, || n.c.log());
        n
    }

    pub fn wait_running(&self, pod: &str) {
        let ok = eventually(Duration::from_secs(60), || {
            let out = self.c.kubectl(&["get", "pod", pod, "-o", "jsonpath={.status.phase}"]);
            (String::from_utf8_lossy(&out.stdout) == "Running").then_some(())
        });
        assert!(
            ok.is_some(),
            "{pod} not Running:\n{}\n{}",
            self.c.k(&["describe", "pod", pod]),
            tail(&self.c.log(), 30)
        );
    }

    pub fn field(&self, pod: &str, path: &str) -> String {
        self.c.k(&["get", "pod", pod, "-o", &format!("jsonpath={{{path}}}")])
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // The server first: a running agent would start the pods its controllers put back.
        self.c.kill9();
        remove_node_containers(&self.name);
    }
}

/// Waits (60 s at most) for node `name` to report Ready; `log` gives the agent's log for the
/// failure message.
pub fn wait_node_ready(c: &Cluster, name: &str, log: impl Fn() -> String) {
    let ready = eventually(Duration::from_secs(60), || {
        let out = c.kubectl(&[
            "get",
            "node",
            name,
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
        ]);
        (String::from_utf8_lossy(&out.stdout) == "True").then_some(())
    });
    assert!(ready.is_some(), "node {name} not Ready:\n{}", tail(&log(), 30));
}

/// Removes every container the agent of node `name` made (the agent never stops them itself).
pub fn remove_node_containers(name: &str) {
    let out = Command::new("docker")
        .args(["ps", "-aq", "--filter", &format!("label=io.skiff.node={name}")])
        .output();
    if let Ok(out) = out {
        let ids: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect();
        if !ids.is_empty() {
            let _ = Command::new("docker").arg("rm").arg("-f").args(&ids).output();
        }
    }
}
