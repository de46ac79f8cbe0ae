//! Seed 003's Pod examples on a real node: `skiff server` with its node agent, real Docker,
//! the real kubectl (logs, exec, attach through the API server's proxy). Needs the local
//! `busybox:latest` image (`skiff images build`). Every container is removed afterwards.

#![cfg(test)]

mod common;

use std::process::Command;
use std::time::Duration;

use common::node::{Node, remove_node_containers, wait_node_ready};
use common::{Cluster, PortForward, eventually, http_get};

#[test]
fn containers_share_network_processes_and_hosts() {
    let n = Node::start("share", &["--no-controllers"]);
    let pod = r#"
apiVersion: v1
kind: Pod
metadata:
  name: shared
spec:
  shareProcessNamespace: true
  hostAliases:
  - ip: "10.1.2.3"
    hostnames:
    - "foo.remote"
    - "bar.remote"
  containers:
  - name: web
    image: busybox:latest
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "mkdir -p /www && echo hello-from-web > /www/index.html && httpd -f -p 8080 -h /www"]
  - name: shell
    image: busybox:latest
    imagePullPolicy: IfNotPresent
    command: ["sleep", "3600"]
"#;
    n.c.apply(pod, &[]);
    n.wait_running("shared");
    let got = eventually(Duration::from_secs(20), || {
        let out = n.c.kubectl(&[
            "exec",
            "shared",
            "-c",
            "shell",
            "--",
            "wget",
            "-qO-",
            "http://localhost:8080/",
        ]);
        String::from_utf8_lossy(&out.stdout)
            .contains("hello-from-web")
            .then_some(())
    });
    assert!(got.is_some(), "containers of a pod do not share localhost");
    let ps = n.c.k(&["exec", "shared", "-c", "shell", "--", "ps"]);
    assert!(ps.contains("httpd"), "shareProcessNamespace: {ps}");
    let hosts = n.c.k(&["exec", "shared", "-c", "shell", "--", "cat", "/etc/hosts"]);
    assert!(hosts.contains("10.1.2.3") && hosts.contains("foo.remote"), "{hosts}");
    assert!(!n.field("shared", ".status.podIP").is_empty());
}

#[test]
fn projected_secret_volume_and_post_start() {
    let n = Node::start("proj", &["--no-controllers"]);
    let dir = tempfile::tempdir().expect("dir");
    std::fs::write(dir.path().join("username.txt"), "admin").expect("write");
    std::fs::write(dir.path().join("password.txt"), "c1oudc0w!").expect("write");
    n.c.k(&[
        "create",
        "secret",
        "generic",
        "user",
        &format!("--from-file={}", dir.path().join("username.txt").display()),
    ]);
    n.c.k(&[
        "create",
        "secret",
        "generic",
        "pass",
        &format!("--from-file={}", dir.path().join("password.txt").display()),
    ]);
    let pod = r#"
apiVersion: v1
kind: Pod
metadata:
  name: test-projected-volume
spec:
  containers:
  - name: test-secret-volume
    image: busybox
    imagePullPolicy: IfNotPresent
    args:
    - sleep
    - "86400"
    lifecycle:
      postStart:
        exec:
          command: ["/bin/sh", "-c", "echo Hello from the postStart handler > /tmp/message"]
    volumeMounts:
    - name: mysql-cred
      mountPath: "/projected-volume"
      readOnly: true
  volumes:
  - name: mysql-cred
    projected:
      sources:
      - secret:
          name: user
      - secret:
          name: pass
"#;
    n.c.apply(pod, &[]);
    n.wait_running("test-projected-volume");
    let user = n.c.k(&[
        "exec",
        "test-projected-volume",
        "--",
        "cat",
        "/projected-volume/username.txt",
    ]);
    assert_eq!(user, "admin");
    let pass = n.c.k(&[
        "exec",
        "test-projected-volume",
        "--",
        "cat",
        "/projected-volume/password.txt",
    ]);
    assert_eq!(pass, "c1oudc0w!");
    let msg = n.c.k(&["exec", "test-projected-volume", "--", "cat", "/tmp/message"]);
    assert_eq!(msg.trim(), "Hello from the postStart handler");
}

#[test]
fn logs_exec_exit_codes_and_restart_policies() {
    let n = Node::start("run", &["--no-controllers"]);
    n.c.apply(
        r#"
apiVersion: v1
kind: Pod
metadata:
  name: talker
spec:
  containers:
  - name: c
    image: busybox:latest
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "echo line-one; echo line-two; sleep 3600"]
"#,
        &[],
    );
    n.wait_running("talker");
    let logs = eventually(Duration::from_secs(10), || {
        let out = n.c.k(&["logs", "talker"]);
        out.contains("line-two").then_some(out)
    })
    .expect("logs");
    assert_eq!(logs, "line-one\nline-two\n");
    assert_eq!(n.c.k(&["logs", "talker", "--tail=1"]), "line-two\n");
    let out = n.c.kubectl(&["exec", "talker", "--", "sh", "-c", "echo out; exit 3"]);
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "out\n");
    let out =
        n.c.stdin_kubectl(&["exec", "-i", "talker", "--", "cat"], "through stdin\n");
    assert_eq!(out, "through stdin\n");

    // restartPolicy Never: the pod fails and stays failed.
    n.c.apply(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: once\nspec:\n  restartPolicy: Never\n  containers:\n  - name: c\n    image: busybox:latest\n    imagePullPolicy: IfNotPresent\n    command: [\"sh\", \"-c\", \"exit 1\"]\n",
        &[],
    );
    let failed = eventually(Duration::from_secs(60), || {
        (n.field("once", ".status.phase") == "Failed").then_some(())
    });
    assert!(failed.is_some(), "{}", n.c.k(&["describe", "pod", "once"]));
    assert_eq!(
        n.field("once", ".status.containerStatuses[0].state.terminated.exitCode"),
        "1"
    );
    assert!(n.c.k(&["get", "pod", "once"]).contains("Error"));

    // OnFailure: a failing container is restarted; a succeeding one completes.
    n.c.apply(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: retry\nspec:\n  restartPolicy: OnFailure\n  containers:\n  - name: c\n    image: busybox:latest\n    imagePullPolicy: IfNotPresent\n    command: [\"sh\", \"-c\", \"exit 2\"]\n",
        &[],
    );
    let restarted = eventually(Duration::from_secs(60), || {
        let rc: u32 = n
            .field("retry", ".status.containerStatuses[0].restartCount")
            .parse()
            .unwrap_or(0);
        (rc >= 1).then_some(())
    });
    assert!(restarted.is_some(), "{}", n.c.k(&["describe", "pod", "retry"]));
    n.c.apply(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: done\nspec:\n  restartPolicy: OnFailure\n  containers:\n  - name: c\n    image: busybox:latest\n    imagePullPolicy: IfNotPresent\n    command: [\"true\"]\n",
        &[],
    );
    let done = eventually(Duration::from_secs(60), || {
        (n.field("done", ".status.phase") == "Succeeded").then_some(())
    });
    assert!(done.is_some());
    assert!(n.c.k(&["get", "pod", "done"]).contains("Completed"));
}

#[test]
fn failing_liveness_probe_restarts_the_container() {
    let n = Node::start("probe", &["--no-controllers"]);
    n.c.apply(
        r#"
apiVersion: v1
kind: Pod
metadata:
  name: sick
spec:
  containers:
  - name: c
    image: busybox:latest
    imagePullPolicy: IfNotPresent
    command: ["sleep", "3600"]
    livenessProbe:
      exec:
        command: ["cat", "/tmp/healthy"]
      periodSeconds: 1
      failureThreshold: 1
"#,
        &[],
    );
    let restarted = eventually(Duration::from_secs(60), || {
        let rc: u32 = n
            .field("sick", ".status.containerStatuses[0].restartCount")
            .parse()
            .unwrap_or(0);
        (rc >= 1).then_some(())
    });
    assert!(restarted.is_some(), "{}", n.c.k(&["describe", "pod", "sick"]));
    let describe = n.c.k(&["describe", "pod", "sick"]);
    assert!(
        describe.contains("Unhealthy") && describe.contains("Liveness probe failed"),
        "{describe}"
    );
}

#[test]
fn containers_survive_kill_9_and_are_adopted_and_cleaned_up() {
    let mut n = Node::start("adopt", &["--no-controllers"]);
    n.c.apply(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: steady\nspec:\n  containers:\n  - name: c\n    image: busybox:latest\n    imagePullPolicy: IfNotPresent\n    command: [\"sleep\", \"3600\"]\n",
        &[],
    );
    n.wait_running("steady");
    let id = n.field("steady", ".status.containerStatuses[0].containerID");
    assert!(id.starts_with("docker://"), "{id}");
    n.c.kill9();
    let running = Command::new("docker")
        .args([
            "inspect",
            "-f",
            "{{.State.Running}}",
            id.trim_start_matches("docker://"),
        ])
        .output()
        .expect("docker inspect");
    assert_eq!(
        String::from_utf8_lossy(&running.stdout).trim(),
        "true",
        "kill -9 of the server stopped the container"
    );
    n.c.restart();
    n.wait_running("steady");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        n.field("steady", ".status.containerStatuses[0].containerID"),
        id,
        "the container was replaced"
    );
    assert_eq!(n.field("steady", ".status.containerStatuses[0].restartCount"), "0");

    n.c.k(&["delete", "pod", "steady", "--grace-period=1"]);
    let gone = eventually(Duration::from_secs(30), || {
        let out = Command::new("docker")
            .args(["ps", "-aq", "--filter", &format!("label=io.skiff.node={}", n.name)])
            .output()
            .ok()?;
        String::from_utf8_lossy(&out.stdout).trim().is_empty().then_some(())
    });
    assert!(gone.is_some(), "deleting the pod left containers behind");
}

#[test]
fn port_forward_through_spdy_over_websocket() {
    let n = Node::start("pf", &["--no-controllers"]);
    n.c.apply(
        r#"
apiVersion: v1
kind: Pod
metadata:
  name: web
spec:
  containers:
  - name: httpd
    image: busybox:latest
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "mkdir -p /site && echo forwarded-through-skiff > /site/hello.txt && httpd -f -p 8080 -h /site"]
"#,
        &[],
    );
    n.wait_running("web");
    let (web, closed) = (common::free_port(), common::free_port());
    let mut pf = PortForward::start(&n.c, &["pod/web", &format!("{web}:8080"), &format!("{closed}:9999")]);
    let ready = eventually(Duration::from_secs(30), || {
        let out = pf.stdout();
        (out.contains(&format!("Forwarding from 127.0.0.1:{web} -> 8080"))
            && out.contains(&format!("Forwarding from 127.0.0.1:{closed} -> 9999")))
        .then_some(())
    });
    assert!(
        ready.is_some(),
        "kubectl port-forward did not start:\nstdout: {}\nstderr: {}\n{}",
        pf.stdout(),
        pf.stderr(),
        common::tail(&n.c.log(), 30)
    );

    // Two connections, each its own pair of SPDY streams in the one tunneled session. httpd may not
    // serve at the very first moment the pod is Running: retry the first request briefly.
    let first = eventually(Duration::from_secs(20), || {
        let r = http_get(web, "/hello.txt");
        r.contains("forwarded-through-skiff").then_some(r)
    });
    let Some(first) = first else {
        panic!(
            "no response through the forwarded port:\nstdout: {}\nstderr: {}\n{}",
            pf.stdout(),
            pf.stderr(),
            common::tail(&n.c.log(), 30)
        );
    };
    assert!(first.starts_with("HTTP/1.") && first.contains(" 200 "), "{first}");
    let second = http_get(web, "/hello.txt");
    assert!(
        second.contains("forwarded-through-skiff"),
        "second connection: {second:?}"
    );
    let missing = http_get(web, "/nothing-here");
    assert!(missing.contains(" 404 "), "{missing}");
    assert!(pf.stdout().contains(&format!("Handling connection for {web}")));

    // Nothing listens on 9999 in the pod: the connection ends without data and kubectl reports the
    // agent's error as it does a kubelet's. Since kubernetes#103526 kubectl then closes the whole
    // session and exits ("lost connection to pod") rather than go on with a broken forwarder.
    let refused = http_get(closed, "/");
    assert_eq!(refused, "", "a connection to a closed port carried data");
    let exited = eventually(Duration::from_secs(20), || {
        let err = pf.stderr();
        (err.contains(&format!("an error occurred forwarding {closed} -> 9999"))
            && err.contains("error forwarding port 9999 to pod")
            && err.contains("dial tcp")
            && err.contains("connect: connection refused")
            && !pf.running())
        .then_some(err)
    });
    let Some(exited) = exited else {
        panic!(
            "kubectl did not report the refused connection:\nstdout: {}\nstderr: {}",
            pf.stdout(),
            pf.stderr()
        );
    };
    assert!(exited.contains("lost connection to pod"), "{exited}");
    drop(pf);

    // The agent and the pod go on serving: a new port-forward works.
    let again = common::free_port();
    let pf = PortForward::start(&n.c, &["pod/web", &format!("{again}:8080")]);
    let ready = eventually(Duration::from_secs(30), || {
        pf.stdout()
            .contains(&format!("Forwarding from 127.0.0.1:{again} -> 8080"))
            .then_some(())
    });
    assert!(ready.is_some(), "{}\n{}", pf.stdout(), pf.stderr());
    let after = http_get(again, "/hello.txt");
    assert!(
        after.contains("forwarded-through-skiff"),
        "after the refused connection: {after:?}\nstderr: {}",
        pf.stderr()
    );
}

/// A `skiff agent` process of its own, joined to a cluster through its kubeconfig; killed
/// and its containers removed when dropped.
struct StandaloneAgent {
    child: std::process::Child,
    name: String,
    _dir: tempfile::TempDir,
}

impl Drop for StandaloneAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        remove_node_containers(&self.name);
    }
}

/// `skiff agent --kubeconfig` joins from outside the server process and serves logs and
/// exec through the API server, trusting the cluster CA found in the kubeconfig.
#[test]
fn standalone_agent_joins_and_serves_streams() {
    let c = Cluster::start(&["--no-agent", "--no-controllers"]);
    let name = format!("e2e-standalone-{}", std::process::id());
    let dir = tempfile::tempdir().expect("agent data dir");
    let log = std::fs::File::create(dir.path().join("agent.log")).expect("agent log");
    let child = Command::new(common::skiff_bin())
        .arg("agent")
        .arg("--kubeconfig")
        .arg(common::node_kubeconfig(&c, &name))
        .arg("--node-name")
        .arg(&name)
        .arg("--data-dir")
        .arg(dir.path())
        .arg("--eviction-hard")
        .arg(common::TEST_EVICTION_HARD)
        .env("SKIFF_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start skiff agent");
    let agent = StandaloneAgent {
        child,
        name: name.clone(),
        _dir: dir,
    };
    let agent_log = || std::fs::read_to_string(agent._dir.path().join("agent.log")).unwrap_or_default();
    wait_node_ready(&c, &name, agent_log);
    let port = c.k(&[
        "get",
        "node",
        &name,
        "-o",
        "jsonpath={.status.daemonEndpoints.kubeletEndpoint.Port}",
    ]);
    assert_ne!(port.trim(), "0", "the agent publishes its endpoint");
    assert!(!agent_log().contains("no cluster CA configured"), "{}", agent_log());

    c.apply(
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: solo\nspec:\n  nodeName: {name}\n  containers:\n  - name: main\n    image: busybox:latest\n    imagePullPolicy: Never\n    command: [sh, -c, 'echo hello-from-solo; sleep 3600']\n"
        ),
        &[],
    );
    let running = eventually(Duration::from_secs(60), || {
        let out = c.kubectl(&["get", "pod", "solo", "-o", "jsonpath={.status.phase}"]);
        (String::from_utf8_lossy(&out.stdout) == "Running").then_some(())
    });
    assert!(
        running.is_some(),
        "{}\n{}",
        c.k(&["describe", "pod", "solo"]),
        common::tail(&agent_log(), 30)
    );
    let logs = eventually(Duration::from_secs(20), || {
        let out = c.kubectl(&["logs", "solo"]);
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        text.contains("hello-from-solo").then_some(text)
    });
    assert!(logs.is_some(), "logs: {}", c.k_err(&["logs", "solo"]));
    assert_eq!(c.k(&["exec", "solo", "--", "echo", "exec-ok"]).trim(), "exec-ok");
    let _ = c.kubectl(&["delete", "pod", "solo", "--grace-period=0", "--force", "--wait=false"]);
    drop(agent);
}

/// A pod whose container says which cluster it runs in.
fn twin_pod(who: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: Pod
metadata:
  name: twin
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: busybox:latest
    imagePullPolicy: IfNotPresent
    command: ["sleep", "3600"]
    env:
    - name: WHO
      value: {who}
"#
    )
}

#[test]
fn two_clusters_with_one_node_name_keep_to_their_own_containers() {
    // Both servers' nodes have the same name (Node::start names them after the test process), as two
    // clusters on one host named after the host would.
    let mut a = Node::start("twins", &["--no-controllers"]);
    a.c.apply(&twin_pod("a"), &[]);
    a.wait_running("twin");
    // An agent removes the containers of pods its API does not have once its first list of pods is
    // done (at start and after every re-list): B's start is a sweep that must spare A's pod...
    let b = Node::start("twins", &["--no-controllers"]);
    assert_eq!(a.name, b.name);
    b.c.apply(&twin_pod("b"), &[]);
    b.wait_running("twin");
    let id_a = a.field("twin", ".status.containerStatuses[0].containerID");
    let id_b = b.field("twin", ".status.containerStatuses[0].containerID");
    // ...and A's restart one that must spare B's.
    a.c.restart();
    wait_node_ready(&a.c, &a.name, || a.c.log());
    a.wait_running("twin");
    // Both sweeps run right after their agent's first list; give them time to finish.
    std::thread::sleep(Duration::from_secs(5));

    for (n, id) in [(&a, &id_a), (&b, &id_b)] {
        assert_eq!(n.field("twin", ".status.phase"), "Running");
        assert_eq!(
            &n.field("twin", ".status.containerStatuses[0].containerID"),
            id,
            "the container was replaced:\n{}",
            common::tail(&n.c.log(), 30)
        );
        assert_eq!(n.field("twin", ".status.containerStatuses[0].restartCount"), "0");
    }

    // Docker still runs both containers, each labelled with its own cluster's identity (the uid of
    // its kube-system namespace).
    let out = Command::new("docker")
        .args([
            "ps",
            "--no-trunc",
            "--filter",
            &format!("label=io.skiff.node={}", a.name),
            "--filter",
            "label=io.kubernetes.docker.type=container",
            "--format",
            "{{.ID}} {{.Label \"io.skiff.cluster\"}}",
        ])
        .output()
        .expect("docker ps");
    let ps = String::from_utf8_lossy(&out.stdout).to_string();
    for (n, id) in [(&a, &id_a), (&b, &id_b)] {
        let cluster =
            n.c.k(&["get", "namespace", "kube-system", "-o", "jsonpath={.metadata.uid}"]);
        assert!(!cluster.is_empty());
        let line = format!("{} {cluster}", id.trim_start_matches("docker://"));
        assert!(ps.lines().any(|l| l == line), "no running container `{line}` in:\n{ps}");
    }
    assert_ne!(
        a.c.k(&["get", "namespace", "kube-system", "-o", "jsonpath={.metadata.uid}"]),
        b.c.k(&["get", "namespace", "kube-system", "-o", "jsonpath={.metadata.uid}"])
    );

    // The agents' streams find their own cluster's pod of that name.
    assert_eq!(a.c.k(&["exec", "twin", "--", "sh", "-c", "echo $WHO"]).trim(), "a");
    assert_eq!(b.c.k(&["exec", "twin", "--", "sh", "-c", "echo $WHO"]).trim(), "b");
}

/// `kubectl debug` adds ephemeral containers through `pods/ephemeralcontainers`: the agent runs
/// them in the pod's network and in the target container's process namespace, reports them in
/// `status.ephemeralContainerStatuses`, and logs, exec and attach reach them. Existing ones can be
/// neither removed nor changed, and ports are refused, as upstream.
#[test]
fn kubectl_debug_runs_ephemeral_containers_in_the_target() {
    let n = Node::start("debug", &["--no-controllers"]);
    n.c.apply(
        r#"
apiVersion: v1
kind: Pod
metadata:
  name: target
spec:
  containers:
  - name: app
    image: busybox:latest
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "mkdir -p /www && echo from-app > /www/index.html && httpd -f -p 8080 -h /www"]
"#,
        &[],
    );
    n.wait_running("target");
    let out = n.c.k(&[
        "debug",
        "target",
        "--image=busybox:latest",
        "--image-pull-policy=IfNotPresent",
        "--target=app",
        "--container=dbg",
        "--",
        "sh",
        "-c",
        "ps; wget -qO- http://localhost:8080/; sleep 3600",
    ]);
    assert!(!out.contains("disabled"), "{out}");
    let running = eventually(Duration::from_secs(60), || {
        (!n.field(
            "target",
            ".status.ephemeralContainerStatuses[0].state.running.startedAt",
        )
        .is_empty())
        .then_some(())
    });
    assert!(running.is_some(), "{}", n.c.k(&["describe", "pod", "target"]));
    assert_eq!(n.field("target", ".status.ephemeralContainerStatuses[0].name"), "dbg");
    // The target's processes are visible, and its port answers on localhost.
    let logs = eventually(Duration::from_secs(20), || {
        let out = n.c.k(&["logs", "target", "-c", "dbg"]);
        out.contains("from-app").then_some(out)
    })
    .expect("debug container logs");
    assert!(logs.contains("httpd -f -p 8080"), "{logs}");
    // It is the target's process namespace (its PID 1 is the target's process), and exec
    // reaches the debug container.
    let ps = n.c.k(&["exec", "target", "-c", "dbg", "--", "ps"]);
    let first = ps.lines().nth(1).unwrap_or_default().to_string();
    assert!(first.trim_start().starts_with("1 ") && first.contains("httpd"), "{ps}");
    assert!(ps.contains("sleep 3600"), "{ps}");

    // Interactive: stdin reaches the debug container through attach.
    let out = n.c.stdin_kubectl(
        &[
            "debug",
            "-i",
            "target",
            "--image=busybox:latest",
            "--image-pull-policy=IfNotPresent",
            "--target=app",
            "--container=dbg2",
            "--",
            "sh",
        ],
        "echo through-$((40+2)); ps\nexit\n",
    );
    assert!(out.contains("through-42"), "{out}");
    let dbg2 = eventually(Duration::from_secs(30), || {
        let code = n.field(
            "target",
            ".status.ephemeralContainerStatuses[?(@.name==\"dbg2\")].state.terminated.exitCode",
        );
        (!code.is_empty()).then_some(code)
    });
    assert_eq!(
        dbg2.as_deref(),
        Some("0"),
        "{}",
        n.c.k(&["get", "pod", "target", "-o", "yaml"])
    );
    assert_eq!(n.field("target", ".status.phase"), "Running");

    // Upstream's rules: no removal, no change, no ports; none on create.
    let err = n.c.k_err(&[
        "patch",
        "pod",
        "target",
        "--subresource=ephemeralcontainers",
        "--type=json",
        "-p",
        r#"[{"op":"remove","path":"/spec/ephemeralContainers/0"}]"#,
    ]);
    assert!(
        err.contains("existing ephemeral containers \"dbg\" may not be removed"),
        "{err}"
    );
    let err = n.c.k_err(&[
        "patch",
        "pod",
        "target",
        "--subresource=ephemeralcontainers",
        "--type=json",
        "-p",
        r#"[{"op":"replace","path":"/spec/ephemeralContainers/0/image","value":"other"}]"#,
    ]);
    assert!(
        err.contains("existing ephemeral containers \"dbg\" may not be changed"),
        "{err}"
    );
    let err = n.c.k_err(&[
        "patch",
        "pod",
        "target",
        "--subresource=ephemeralcontainers",
        "--type=strategic",
        "-p",
        r#"{"spec":{"ephemeralContainers":[{"name":"bad","image":"busybox","ports":[{"containerPort":80}]}]}}"#,
    ]);
    assert!(
        err.contains("].ports: Forbidden: cannot be set for an Ephemeral Container"),
        "{err}"
    );
    // Only the ephemeral containers change through the subresource.
    n.c.k(&[
        "patch",
        "pod",
        "target",
        "--subresource=ephemeralcontainers",
        "--type=merge",
        "-p",
        r#"{"metadata":{"labels":{"sneaky":"yes"}},"spec":{"activeDeadlineSeconds":5}}"#,
    ]);
    assert_eq!(n.field("target", ".metadata.labels.sneaky"), "");
    assert_eq!(n.field("target", ".spec.activeDeadlineSeconds"), "");
    let err = n.c.stdin_kubectl_err(
        &["create", "-f", "-"],
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: born\nspec:\n  containers:\n  - name: c\n    image: busybox\n  ephemeralContainers:\n  - name: e\n    image: busybox\n",
    );
    assert!(
        err.contains("spec.ephemeralContainers: Forbidden: cannot be set on create"),
        "{err}"
    );
}

/// `nodes/NAME/proxy/...` reaches the node agent's endpoint, as upstream's node proxy reaches
/// the kubelet, authorized on `nodes/proxy`.
#[test]
fn node_proxy_reaches_the_agent() {
    let n = Node::start("nodeproxy", &["--no-controllers"]);
    let base = format!("/api/v1/nodes/{}/proxy", n.name);
    assert_eq!(n.c.k(&["get", "--raw", &format!("{base}/healthz")]), "ok");
    n.c.apply(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: talker\nspec:\n  containers:\n  - name: c\n    image: busybox:latest\n    imagePullPolicy: IfNotPresent\n    command: [\"sh\", \"-c\", \"echo via-node-proxy; sleep 3600\"]\n",
        &[],
    );
    n.wait_running("talker");
    let logs = eventually(Duration::from_secs(20), || {
        let out = n.c.kubectl(&[
            "get",
            "--raw",
            &format!("{base}/containerLogs/default/talker/c?tailLines=5"),
        ]);
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        text.contains("via-node-proxy").then_some(text)
    });
    assert_eq!(logs.as_deref(), Some("via-node-proxy\n"));
    let pods: serde_json::Value =
        serde_json::from_str(&n.c.k(&["get", "--raw", &format!("{base}/pods")])).expect("a PodList");
    assert_eq!(pods["kind"], "PodList");
    let names: Vec<&str> = pods["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str())
        .collect();
    assert!(names.contains(&"talker"), "{names:?}");
    // The agent's own answers pass through, errors included.
    let err =
        n.c.k_err(&["get", "--raw", &format!("{base}/containerLogs/default/talker/nope")]);
    assert!(err.contains("NotFound") || err.contains("not found"), "{err}");
    // Authorized on nodes/proxy.
    let err = n.c.k_err(&["get", "--raw", &format!("{base}/healthz"), "--as=jane"]);
    assert!(
        err.contains(&format!(
            "nodes \"{}\" is forbidden: User \"jane\" cannot get resource \"nodes/proxy\" in API group \"\" at the cluster scope",
            n.name
        )),
        "{err}"
    );
}

/// With `shareProcessNamespace`, the sandbox's pause process is PID 1 of the pod and inherits
/// its orphans: it reaps them when they exit, as upstream's pause does, so no zombies pile up.
#[test]
fn pause_reaps_orphans_in_a_shared_process_namespace() {
    let n = Node::start("reap", &["--no-controllers"]);
    n.c.apply(
        r#"
apiVersion: v1
kind: Pod
metadata:
  name: orphans
spec:
  shareProcessNamespace: true
  containers:
  - name: c
    image: busybox:latest
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "for i in 1 2 3; do (sleep 1 &); done; exec sleep 3600"]
"#,
        &[],
    );
    n.wait_running("orphans");
    // The orphans' parent, once their subshells exit, is PID 1: pause.
    let zombies = "sleep 4; grep -l '^State:.*Z' /proc/[0-9]*/status 2>/dev/null | wc -l";
    let (out, ok) = n.sh("orphans", zombies);
    assert!(ok, "{out}");
    let (init, _) = n.sh("orphans", "cat /proc/1/cmdline");
    assert!(init.contains("/pause"), "{init}");
    assert_eq!(
        out.trim(),
        "0",
        "zombies under pause: {}",
        n.sh("orphans", "ps -o pid,ppid,stat,comm").0
    );
}
