//! A cluster with a real node agent under a name of its own, for the Docker tests: waits for
//! the node to be Ready, and removes that node's containers when dropped.

use std::process::Command;
use std::time::Duration;

use super::{Cluster, RANGES_STAY_LOCAL, eventually, tail};

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

    /// Runs `script` with `sh -c` in `pod`; its output and whether it succeeded.
    pub fn sh(&self, pod: &str, script: &str) -> (String, bool) {
        let out = self.c.kubectl(&["exec", pod, "--", "sh", "-c", script]);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (text, out.status.success())
    }

    /// Asserts that no address of `range` would leave this machine, waiting (30 s at most) for
    /// the agent to route it locally first.
    pub fn assert_range_stays_local(&self, range: &str) {
        let local = eventually(Duration::from_secs(30), || {
            let status = Command::new(RANGES_STAY_LOCAL).arg(range).status();
            status.is_ok_and(|s| s.success()).then_some(())
        });
        let out = Command::new(RANGES_STAY_LOCAL).arg(range).output();
        assert!(
            local.is_some(),
            "{range} is not routed locally: {out:?}\n{}",
            tail(&self.c.log(), 30)
        );
    }
}

/// A busybox pod that only sleeps, to run commands from.
pub const CLIENT: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: client
spec:
  terminationGracePeriodSeconds: 0
  containers:
  - name: c
    image: busybox:latest
    imagePullPolicy: IfNotPresent
    command: ["sleep", "3600"]
"#;

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
