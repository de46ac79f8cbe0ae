//! Seed 003's workload objects end to end: Deployment / ReplicaSet rollouts, DaemonSet,
//! StatefulSet, Job and CronJob with `skiff server --no-agent --sim-nodes 3` and the real kubectl.

#![cfg(test)]

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{Cluster, eventually};
use serde_json::Value;

fn cluster() -> Cluster {
    let c = Cluster::start(&["--no-agent", "--sim-nodes", "3"]);
    let ready = eventually(Duration::from_secs(30), || {
        let out = c.k(&["get", "nodes"]);
        (out.matches(" Ready ").count() == 3).then_some(())
    });
    assert!(ready.is_some(), "nodes not Ready: {}", c.k(&["get", "nodes"]));
    c
}

fn items(v: &Value) -> Vec<Value> {
    v["items"].as_array().cloned().unwrap_or_default()
}

fn name_of(v: &Value) -> String {
    v["metadata"]["name"].as_str().unwrap_or_default().to_string()
}

/// Running pods matching a label selector in a namespace.
fn running_pods(c: &Cluster, ns: &str, selector: &str) -> Vec<Value> {
    let pods = c.get_json(&["pods", "-n", ns, "-l", selector]);
    items(&pods)
        .into_iter()
        .filter(|p| p["status"]["phase"] == "Running" && p["metadata"]["deletionTimestamp"].is_null())
        .collect()
}

fn wait_running(c: &Cluster, ns: &str, selector: &str, n: usize) -> Vec<Value> {
    eventually(Duration::from_secs(40), || {
        let pods = running_pods(c, ns, selector);
        let all = items(&c.get_json(&["pods", "-n", ns, "-l", selector]));
        (pods.len() == n && all.len() == n).then_some(pods)
    })
    .unwrap_or_else(|| {
        panic!(
            "expected {n} running pods for {selector}:\n{}\nserver log:\n{}",
            c.k(&["get", "pods", "-n", ns, "-o", "wide"]),
            common::tail(&c.log(), 30)
        )
    })
}

fn event_messages(c: &Cluster, ns: &str, kind: &str, name: &str) -> Vec<String> {
    let ev = c.get_json(&[
        "events",
        "-n",
        ns,
        "--field-selector",
        &format!("involvedObject.kind={kind},involvedObject.name={name}"),
    ]);
    items(&ev)
        .iter()
        .map(|e| e["message"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[test]
fn deployment_scale_rollout_history_undo_and_self_healing() {
    let c = cluster();
    c.k(&["create", "deployment", "web", "--image=nginx:1.19", "--replicas=3"]);
    let pods = wait_running(&c, "default", "app=web", 3);
    c.k(&["rollout", "status", "deployment/web", "--timeout=60s"]);

    // The ReplicaSet: <deploy>-<hash>, the hash label, the revision, the owner.
    let rss = items(&c.get_json(&["rs", "-l", "app=web"]));
    assert_eq!(rss.len(), 1);
    let rs = &rss[0];
    let hash = rs["metadata"]["labels"]["pod-template-hash"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(name_of(rs), format!("web-{hash}"));
    assert_eq!(rs["metadata"]["annotations"]["deployment.kubernetes.io/revision"], "1");
    assert_eq!(
        rs["metadata"]["annotations"]["deployment.kubernetes.io/desired-replicas"],
        "3"
    );
    assert_eq!(
        rs["metadata"]["annotations"]["deployment.kubernetes.io/max-replicas"],
        "4"
    );
    assert_eq!(rs["metadata"]["ownerReferences"][0]["kind"], "Deployment");
    assert_eq!(rs["metadata"]["ownerReferences"][0]["controller"], true);
    for p in &pods {
        assert!(name_of(p).starts_with(&format!("web-{hash}-")));
        let owner = &p["metadata"]["ownerReferences"][0];
        assert_eq!(owner["kind"], "ReplicaSet");
        assert_eq!(owner["blockOwnerDeletion"], true);
    }
    let d = c.get_json(&["deployment", "web"]);
    assert_eq!(d["status"]["availableReplicas"], 3);
    assert_eq!(d["status"]["updatedReplicas"], 3);
    let conds = d["status"]["conditions"].as_array().unwrap();
    assert!(
        conds
            .iter()
            .any(|x| x["type"] == "Available" && x["reason"] == "MinimumReplicasAvailable")
    );
    assert!(
        conds
            .iter()
            .any(|x| x["type"] == "Progressing" && x["reason"] == "NewReplicaSetAvailable")
    );
    let msgs = event_messages(&c, "default", "Deployment", "web");
    let rs_name = format!("web-{hash}");
    assert!(
        msgs.contains(&format!("Scaled up replica set {rs_name} from 0 to 3")),
        "events: {msgs:?}"
    );
    let rs_msgs = event_messages(&c, "default", "ReplicaSet", &rs_name);
    assert!(
        rs_msgs.iter().any(|m| m.starts_with("Created pod: web-")),
        "{rs_msgs:?}"
    );

    // Scale.
    c.k(&["scale", "deployment", "web", "--replicas=4"]);
    wait_running(&c, "default", "app=web", 4);

    // A pod deleted by hand is replaced.
    let victim = name_of(&running_pods(&c, "default", "app=web")[0]);
    c.k(&["delete", "pod", &victim, "--wait=false"]);
    let replaced = eventually(Duration::from_secs(30), || {
        let pods = running_pods(&c, "default", "app=web");
        (pods.len() == 4 && pods.iter().all(|p| name_of(p) != victim)).then_some(())
    });
    assert!(replaced.is_some(), "{}", c.k(&["get", "pods"]));

    // Image change: a new ReplicaSet and a finished rollout.
    c.k(&["set", "image", "deployment/web", "nginx=nginx:1.20"]);
    c.k(&["rollout", "status", "deployment/web", "--timeout=90s"]);
    let rss = items(&c.get_json(&["rs", "-l", "app=web"]));
    assert_eq!(rss.len(), 2);
    let new_rs = rss.iter().find(|r| name_of(r) != rs_name).unwrap();
    assert_eq!(new_rs["spec"]["replicas"], 4);
    assert_eq!(
        new_rs["metadata"]["annotations"]["deployment.kubernetes.io/revision"],
        "2"
    );
    let old = rss.iter().find(|r| name_of(r) == rs_name).unwrap();
    assert_eq!(old["spec"]["replicas"], 0);
    let pods = wait_running(&c, "default", "app=web", 4);
    assert!(pods.iter().all(|p| p["spec"]["containers"][0]["image"] == "nginx:1.20"));

    let history = c.k(&["rollout", "history", "deployment/web"]);
    let revisions: Vec<&str> = history
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| w.chars().all(|ch| ch.is_ascii_digit()))
        .collect();
    assert_eq!(revisions, ["1", "2"], "{history}");

    // Undo goes back to the first template, as revision 3.
    c.k(&["rollout", "undo", "deployment/web"]);
    c.k(&["rollout", "status", "deployment/web", "--timeout=90s"]);
    let rs = c.get_json(&["rs", &rs_name]);
    assert_eq!(rs["spec"]["replicas"], 4);
    assert_eq!(rs["metadata"]["annotations"]["deployment.kubernetes.io/revision"], "3");
    // The revision it had before is kept, as upstream's SetNewReplicaSetAnnotations keeps it.
    assert_eq!(
        rs["metadata"]["annotations"]["deployment.kubernetes.io/revision-history"],
        "1"
    );
    let pods = wait_running(&c, "default", "app=web", 4);
    assert!(pods.iter().all(|p| p["spec"]["containers"][0]["image"] == "nginx:1.19"));
    let d = c.get_json(&["deployment", "web"]);
    assert_eq!(d["metadata"]["annotations"]["deployment.kubernetes.io/revision"], "3");
}

#[test]
fn deployment_recreate_pause_and_restart() {
    let c = cluster();
    c.apply(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: api
spec:
  replicas: 2
  revisionHistoryLimit: 1
  strategy:
    type: Recreate
  selector:
    matchLabels:
      app: api
  template:
    metadata:
      labels:
        app: api
    spec:
      containers:
      - name: api
        image: busybox:1
"#,
        &[],
    );
    wait_running(&c, "default", "app=api", 2);
    c.k(&["rollout", "status", "deployment/api", "--timeout=60s"]);

    // Paused: template changes wait.
    c.k(&["rollout", "pause", "deployment/api"]);
    c.k(&["set", "image", "deployment/api", "api=busybox:2"]);
    let paused = eventually(Duration::from_secs(10), || {
        let d = c.get_json(&["deployment", "api"]);
        let conds = d["status"]["conditions"].as_array().cloned().unwrap_or_default();
        conds
            .iter()
            .any(|x| x["type"] == "Progressing" && x["reason"] == "DeploymentPaused")
            .then_some(())
    });
    assert!(paused.is_some());
    assert_eq!(items(&c.get_json(&["rs", "-l", "app=api"])).len(), 1);

    c.k(&["rollout", "resume", "deployment/api"]);
    c.k(&["rollout", "status", "deployment/api", "--timeout=90s"]);
    let pods = wait_running(&c, "default", "app=api", 2);
    assert!(pods.iter().all(|p| p["spec"]["containers"][0]["image"] == "busybox:2"));

    // Restart is a new revision too; with revisionHistoryLimit 1 one old ReplicaSet stays.
    c.k(&["rollout", "restart", "deployment/api"]);
    c.k(&["rollout", "status", "deployment/api", "--timeout=90s"]);
    let cleaned = eventually(Duration::from_secs(20), || {
        (items(&c.get_json(&["rs", "-l", "app=api"])).len() == 2).then_some(())
    });
    assert!(cleaned.is_some(), "{}", c.k(&["get", "rs"]));
    let pods = wait_running(&c, "default", "app=api", 2);
    assert!(
        pods.iter()
            .all(|p| !p["metadata"]["annotations"]["kubectl.kubernetes.io/restartedAt"].is_null())
    );

    // Pods that cannot be scheduled: the rollout passes its progress deadline.
    c.apply(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: stuck
spec:
  replicas: 1
  progressDeadlineSeconds: 2
  selector:
    matchLabels:
      app: stuck
  template:
    metadata:
      labels:
        app: stuck
    spec:
      nodeSelector:
        no-such-label: "true"
      containers:
      - name: c
        image: busybox
"#,
        &[],
    );
    let err = c.k_err(&["rollout", "status", "deployment/stuck", "--timeout=30s"]);
    assert!(err.contains("exceeded its progress deadline"), "{err}");
    let d = c.get_json(&["deployment", "stuck"]);
    let conds = d["status"]["conditions"].as_array().unwrap();
    assert!(
        conds
            .iter()
            .any(|x| x["type"] == "Progressing" && x["status"] == "False" && x["reason"] == "ProgressDeadlineExceeded"),
        "{conds:?}"
    );
    assert!(
        conds
            .iter()
            .any(|x| x["type"] == "Available" && x["reason"] == "MinimumReplicasUnavailable")
    );
}

#[test]
fn daemonset_on_every_node_with_rollout_and_history() {
    let c = cluster();
    c.apply(common::seeds::DAEMONSET_FLUENTD, &[]);
    let pods = wait_running(&c, "kube-system", "name=fluentd-elasticsearch", 3);
    let nodes: BTreeSet<String> = pods
        .iter()
        .map(|p| p["spec"]["nodeName"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(nodes.len(), 3, "one pod per node");
    for p in &pods {
        let term = &p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            [0]["matchFields"][0];
        assert_eq!(term["key"], "metadata.name");
        assert_eq!(term["values"][0], p["spec"]["nodeName"]);
        let tolerations = p["spec"]["tolerations"].as_array().unwrap();
        for key in ["node.kubernetes.io/not-ready", "node.kubernetes.io/unschedulable"] {
            assert!(tolerations.iter().any(|t| t["key"] == key), "{key} missing");
        }
        assert!(!p["metadata"]["labels"]["controller-revision-hash"].is_null());
    }
    c.k(&[
        "rollout",
        "status",
        "ds/fluentd-elasticsearch",
        "-n",
        "kube-system",
        "--timeout=60s",
    ]);
    let ready = eventually(Duration::from_secs(20), || {
        let ds = c.get_json(&["ds", "fluentd-elasticsearch", "-n", "kube-system"]);
        let s = &ds["status"];
        (s["desiredNumberScheduled"] == 3
            && s["currentNumberScheduled"] == 3
            && s["numberReady"] == 3
            && s["updatedNumberScheduled"] == 3
            && s["numberAvailable"] == 3)
            .then_some(())
    });
    assert!(ready.is_some(), "{}", c.k(&["get", "ds", "-n", "kube-system"]));
    let table = c.k(&["get", "ds", "-n", "kube-system"]);
    assert!(
        table.contains("fluentd-elasticsearch   3         3         3"),
        "{table}"
    );

    // Rolling update, history and undo.
    c.k(&[
        "set",
        "image",
        "ds/fluentd-elasticsearch",
        "-n",
        "kube-system",
        "fluentd-elasticsearch=fluentd:2",
    ]);
    c.k(&[
        "rollout",
        "status",
        "ds/fluentd-elasticsearch",
        "-n",
        "kube-system",
        "--timeout=90s",
    ]);
    let pods = wait_running(&c, "kube-system", "name=fluentd-elasticsearch", 3);
    assert!(pods.iter().all(|p| p["spec"]["containers"][0]["image"] == "fluentd:2"));
    let history = c.k(&["rollout", "history", "ds/fluentd-elasticsearch", "-n", "kube-system"]);
    assert!(history.contains("1 ") && history.contains("2 "), "{history}");
    c.k(&["rollout", "undo", "ds/fluentd-elasticsearch", "-n", "kube-system"]);
    c.k(&[
        "rollout",
        "status",
        "ds/fluentd-elasticsearch",
        "-n",
        "kube-system",
        "--timeout=90s",
    ]);
    let back = eventually(Duration::from_secs(30), || {
        let pods = running_pods(&c, "kube-system", "name=fluentd-elasticsearch");
        (pods.len() == 3
            && pods
                .iter()
                .all(|p| p["spec"]["containers"][0]["image"] == "k8s.gcr.io/fluentd-elasticsearch:1.20"))
        .then_some(())
    });
    assert!(back.is_some());

    // A node selector narrows the nodes.
    c.k(&["label", "node", "sim-node-1", "disktype=ssd"]);
    c.apply(
        r#"
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: ssd-only
spec:
  selector:
    matchLabels:
      app: ssd-only
  template:
    metadata:
      labels:
        app: ssd-only
    spec:
      nodeSelector:
        disktype: ssd
      containers:
      - name: c
        image: busybox
"#,
        &[],
    );
    let pods = wait_running(&c, "default", "app=ssd-only", 1);
    assert_eq!(pods[0]["spec"]["nodeName"], "sim-node-1");
    let ds = c.get_json(&["ds", "ssd-only"]);
    assert_eq!(ds["status"]["desiredNumberScheduled"], 1);

    // A new node gets a daemon pod (pinned to it; no simulated node runs it).
    c.apply(
        r#"
apiVersion: v1
kind: Node
metadata:
  name: extra-node
  labels:
    kubernetes.io/hostname: extra-node
"#,
        &[],
    );
    let pinned = eventually(Duration::from_secs(30), || {
        let ds = c.get_json(&["ds", "fluentd-elasticsearch", "-n", "kube-system"]);
        let pods = items(&c.get_json(&["pods", "-n", "kube-system", "-l", "name=fluentd-elasticsearch"]));
        let on_extra = pods.iter().any(|p| {
            p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
                [0]["matchFields"][0]["values"][0]
                == "extra-node"
        });
        (ds["status"]["desiredNumberScheduled"] == 4 && on_extra).then_some(())
    });
    assert!(
        pinned.is_some(),
        "{}",
        c.k(&["get", "ds,pods", "-n", "kube-system", "-o", "wide"])
    );
}

#[test]
fn daemonset_surge_rollout() {
    let c = cluster();
    c.apply(
        r#"
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: agent
spec:
  updateStrategy:
    type: RollingUpdate
    rollingUpdate:
      maxSurge: 1
      maxUnavailable: 0
  selector:
    matchLabels:
      app: agent
  template:
    metadata:
      labels:
        app: agent
    spec:
      containers:
      - name: agent
        image: agent:1
"#,
        &[],
    );
    wait_running(&c, "default", "app=agent", 3);
    c.k(&["rollout", "status", "ds/agent", "--timeout=60s"]);
    c.k(&["set", "image", "ds/agent", "agent=agent:2"]);
    c.k(&["rollout", "status", "ds/agent", "--timeout=90s"]);
    let done = eventually(Duration::from_secs(30), || {
        let pods = items(&c.get_json(&["pods", "-l", "app=agent"]));
        (pods.len() == 3 && pods.iter().all(|p| p["spec"]["containers"][0]["image"] == "agent:2")).then_some(())
    });
    assert!(done.is_some(), "{}", c.k(&["get", "pods", "-o", "wide"]));
    let ds = c.get_json(&["ds", "agent"]);
    assert_eq!(ds["status"]["updatedNumberScheduled"], 3);
    assert_eq!(ds["status"]["numberAvailable"], 3);
}

#[test]
fn statefulset_pods_in_order_with_claims() {
    let c = cluster();
    // The claims bind before their pods are scheduled: a volume each, of no class as the claims.
    for i in 0..2 {
        c.apply(
            &common::storage::host_path_pv(
                &format!("www-{i}"),
                "",
                "ReadWriteOnce",
                "1Gi",
                &format!("/tmp/skiff-e2e-www-{i}"),
            ),
            &[],
        );
    }
    // Seed 003's StatefulSet with a claim template of no class.
    c.apply(
        &format!(
            "{}{}",
            common::seeds::STATEFULSET_WEB,
            common::storage::claim_template("www", Some(""))
        ),
        &[],
    );
    let pods = wait_running(&c, "default", "app=nginx", 2);
    let mut names: Vec<String> = pods.iter().map(name_of).collect();
    names.sort();
    assert_eq!(names, ["web-0", "web-1"]);
    c.k(&["rollout", "status", "sts/web", "--timeout=60s"]);
    for p in &pods {
        let n = name_of(p);
        assert_eq!(p["spec"]["hostname"], n.as_str());
        assert_eq!(p["spec"]["subdomain"], "nginx");
        assert_eq!(
            p["metadata"]["labels"]["statefulset.kubernetes.io/pod-name"],
            n.as_str()
        );
        let idx = n.trim_start_matches("web-");
        assert_eq!(p["metadata"]["labels"]["apps.kubernetes.io/pod-index"], idx);
        assert_eq!(
            p["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"],
            format!("www-{n}")
        );
    }
    let claims: Vec<String> = items(&c.get_json(&["pvc"])).iter().map(name_of).collect();
    assert!(claims.contains(&"www-web-0".to_string()) && claims.contains(&"www-web-1".to_string()));
    // web-0 was created (and Ready) before web-1.
    let msgs = event_messages(&c, "default", "StatefulSet", "web");
    let p0 = msgs
        .iter()
        .position(|m| m == "create Pod web-0 in StatefulSet web successful");
    let p1 = msgs
        .iter()
        .position(|m| m == "create Pod web-1 in StatefulSet web successful");
    assert!(p0.is_some() && p1.is_some() && p0 < p1, "{msgs:?}");
    let ready0 = pods
        .iter()
        .find(|p| name_of(p) == "web-0")
        .and_then(|p| p["status"]["conditions"].as_array().cloned())
        .and_then(|cs| cs.into_iter().find(|x| x["type"] == "Ready"))
        .and_then(|x| x["lastTransitionTime"].as_str().map(str::to_string))
        .unwrap();
    let created1 = pods
        .iter()
        .find(|p| name_of(p) == "web-1")
        .and_then(|p| p["metadata"]["creationTimestamp"].as_str().map(str::to_string))
        .unwrap();
    assert!(
        ready0 <= created1,
        "web-1 ({created1}) created before web-0 was ready ({ready0})"
    );

    // Status and revisions.
    let sts = c.get_json(&["sts", "web"]);
    assert_eq!(sts["status"]["replicas"], 2);
    assert_eq!(sts["status"]["readyReplicas"], 2);
    assert_eq!(sts["status"]["currentRevision"], sts["status"]["updateRevision"]);

    // Rolling update, then scale down in reverse order. The set's change cause is copied to its
    // new revision, as upstream's newRevision copies every annotation, and history prints it.
    c.k(&["annotate", "sts/web", "kubernetes.io/change-cause=nginx 1.20"]);
    c.k(&["set", "image", "sts/web", "nginx=nginx:1.20"]);
    c.k(&["rollout", "status", "sts/web", "--timeout=90s"]);
    let history = c.k(&["rollout", "history", "sts/web"]);
    let rows: Vec<Vec<&str>> = history.lines().map(|l| l.split_whitespace().collect()).collect();
    assert!(rows.contains(&vec!["1", "<none>"]), "{history}");
    assert!(rows.contains(&vec!["2", "nginx", "1.20"]), "{history}");
    let pods = wait_running(&c, "default", "app=nginx", 2);
    assert!(pods.iter().all(|p| p["spec"]["containers"][0]["image"] == "nginx:1.20"));
    c.k(&["scale", "sts", "web", "--replicas=1"]);
    let pods = wait_running(&c, "default", "app=nginx", 1);
    assert_eq!(name_of(&pods[0]), "web-0");
    // The default retention policy keeps the claims of removed pods.
    let claims: Vec<String> = items(&c.get_json(&["pvc"])).iter().map(name_of).collect();
    assert!(claims.contains(&"www-web-1".to_string()), "{claims:?}");
}

#[test]
fn job_completes_and_fails_past_backoff() {
    let c = cluster();
    c.apply(
        r#"
apiVersion: batch/v1
kind: Job
metadata:
  name: pi
spec:
  template:
    spec:
      containers:
      - name: pi
        image: resouer/ubuntu-bc
        command: ["sh", "-c", "echo 'scale=10000; 4*a(1)' | bc -l "]
      restartPolicy: Never
  backoffLimit: 4
"#,
        &[],
    );
    let pods = wait_running(&c, "default", "job-name=pi", 1);
    let pod = name_of(&pods[0]);
    assert!(pod.starts_with("pi-"));
    let job = c.get_json(&["job", "pi"]);
    assert_eq!(job["status"]["active"], 1);
    assert!(!job["status"]["startTime"].is_null());
    c.k(&[
        "patch",
        "pod",
        &pod,
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"phase":"Succeeded"}}"#,
    ]);
    c.k(&["wait", "--for=condition=complete", "job/pi", "--timeout=30s"]);
    let job = c.get_json(&["job", "pi"]);
    assert_eq!(job["status"]["succeeded"], 1);
    assert!(job["status"]["active"].is_null());
    assert!(!job["status"]["completionTime"].is_null());
    let conds = job["status"]["conditions"].as_array().unwrap();
    assert!(
        conds
            .iter()
            .any(|x| x["type"] == "SuccessCriteriaMet" && x["status"] == "True")
    );
    assert!(conds.iter().any(|x| x["type"] == "Complete" && x["status"] == "True"));
    let table = c.k(&["get", "job", "pi"]);
    assert!(table.contains("1/1"), "{table}");

    // backoffLimit 1: the second failure fails the Job.
    c.apply(
        r#"
apiVersion: batch/v1
kind: Job
metadata:
  name: flaky
spec:
  backoffLimit: 1
  template:
    spec:
      containers:
      - name: c
        image: busybox
      restartPolicy: Never
"#,
        &[],
    );
    let mut failed: Vec<String> = Vec::new();
    for _ in 0..2 {
        let pod = eventually(Duration::from_secs(30), || {
            running_pods(&c, "default", "job-name=flaky")
                .into_iter()
                .map(|p| name_of(&p))
                .find(|n| !failed.contains(n))
        })
        .expect("a running flaky pod");
        c.k(&[
            "patch",
            "pod",
            &pod,
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"phase":"Failed"}}"#,
        ]);
        failed.push(pod);
    }
    c.k(&["wait", "--for=condition=failed", "job/flaky", "--timeout=30s"]);
    let job = c.get_json(&["job", "flaky"]);
    let conds = job["status"]["conditions"].as_array().unwrap();
    assert!(
        conds
            .iter()
            .any(|x| x["type"] == "Failed" && x["reason"] == "BackoffLimitExceeded")
    );
    assert_eq!(job["status"]["failed"], 2);

    // Indexed: one pod per index, parallelism at a time.
    c.apply(
        r#"
apiVersion: batch/v1
kind: Job
metadata:
  name: indexed
spec:
  completions: 3
  parallelism: 2
  completionMode: Indexed
  template:
    spec:
      containers:
      - name: c
        image: busybox
      restartPolicy: Never
"#,
        &[],
    );
    let mut done: BTreeSet<String> = BTreeSet::new();
    for round in [2usize, 1] {
        let pods = eventually(Duration::from_secs(30), || {
            let pods: Vec<Value> = running_pods(&c, "default", "job-name=indexed")
                .into_iter()
                .filter(|p| !done.contains(&name_of(p)))
                .collect();
            (pods.len() == round).then_some(pods)
        })
        .unwrap_or_else(|| panic!("{}", c.k(&["get", "pods", "--show-labels"])));
        for p in pods {
            let idx = p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]
                .as_str()
                .unwrap()
                .to_string();
            assert_eq!(p["spec"]["hostname"], format!("indexed-{idx}"));
            let n = name_of(&p);
            c.k(&[
                "patch",
                "pod",
                &n,
                "--subresource=status",
                "--type=merge",
                "-p",
                r#"{"status":{"phase":"Succeeded"}}"#,
            ]);
            done.insert(n);
        }
    }
    c.k(&["wait", "--for=condition=complete", "job/indexed", "--timeout=30s"]);
    let job = c.get_json(&["job", "indexed"]);
    assert_eq!(job["status"]["completedIndexes"], "0-2");
    assert_eq!(job["status"]["succeeded"], 3);
}

#[test]
fn cronjob_creates_jobs_on_schedule() {
    let c = cluster();
    c.apply(
        r#"
apiVersion: batch/v1
kind: CronJob
metadata:
  name: hello
spec:
  schedule: "*/1 * * * *"
  jobTemplate:
    spec:
      template:
        spec:
          containers:
          - name: hello
            image: busybox
            args:
            - /bin/sh
            - -c
            - date; echo Hello from the Kubernetes cluster
          restartPolicy: OnFailure
"#,
        &[],
    );
    // Client side: a Job from the CronJob's template.
    c.k(&["create", "job", "manual", "--from=cronjob/hello"]);
    wait_running(&c, "default", "job-name=manual", 1);

    let job = eventually(Duration::from_secs(75), || {
        items(&c.get_json(&["jobs"]))
            .into_iter()
            .find(|j| name_of(j).starts_with("hello-"))
    })
    .unwrap_or_else(|| panic!("no scheduled job: {}", c.k(&["get", "cronjobs,jobs"])));
    let name = name_of(&job);
    let minutes: i64 = name.trim_start_matches("hello-").parse().expect("minutes since epoch");
    let stamp = job["metadata"]["annotations"]["batch.kubernetes.io/cronjob-scheduled-timestamp"]
        .as_str()
        .unwrap()
        .to_string();
    let scheduled: jiff::Timestamp = stamp.parse().expect("an RFC 3339 time");
    assert_eq!(scheduled.as_second(), minutes * 60);
    assert_eq!(job["metadata"]["ownerReferences"][0]["kind"], "CronJob");
    let cj = eventually(Duration::from_secs(10), || {
        let cj = c.get_json(&["cronjob", "hello"]);
        (!cj["status"]["lastScheduleTime"].is_null()).then_some(cj)
    })
    .expect("lastScheduleTime");
    let last: jiff::Timestamp = cj["status"]["lastScheduleTime"].as_str().unwrap().parse().unwrap();
    // A later minute may already have passed.
    assert!(last >= scheduled, "{last} < {scheduled}");
    let active = cj["status"]["active"].as_array().cloned().unwrap_or_default();
    assert!(active.iter().any(|a| a["name"] == name.as_str()), "{cj}");

    // The Job finishing shows as lastSuccessfulTime and leaves the active list.
    let pod = name_of(&wait_running(&c, "default", &format!("job-name={name}"), 1)[0]);
    c.k(&[
        "patch",
        "pod",
        &pod,
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"phase":"Succeeded"}}"#,
    ]);
    let done = eventually(Duration::from_secs(20), || {
        let cj = c.get_json(&["cronjob", "hello"]);
        let active = cj["status"]["active"].as_array().cloned().unwrap_or_default();
        (!cj["status"]["lastSuccessfulTime"].is_null() && !active.iter().any(|a| a["name"] == name.as_str()))
            .then_some(())
    });
    assert!(done.is_some(), "{}", c.k(&["get", "cronjob", "hello", "-o", "yaml"]));
}

/// A StatefulSet's pod that failed or ran to completion is deleted and made again, with
/// upstream's events: RecreatingFailedPod (a warning) and RecreatingTerminatedPod.
#[test]
fn statefulset_recreates_failed_and_terminated_pods() {
    let c = cluster();
    c.apply(
        r#"
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: keep
spec:
  serviceName: keep
  replicas: 2
  selector:
    matchLabels: {app: keep}
  template:
    metadata:
      labels: {app: keep}
    spec:
      containers:
      - name: keep
        image: busybox:latest
"#,
        &[],
    );
    wait_running(&c, "default", "app=keep", 2);
    for (pod, phase) in [("keep-0", "Failed"), ("keep-1", "Succeeded")] {
        let uid = c.k(&["get", "pod", pod, "-o", "jsonpath={.metadata.uid}"]);
        c.k(&[
            "patch",
            "pod",
            pod,
            "--subresource=status",
            "--type=merge",
            "-p",
            &format!(r#"{{"status":{{"phase":"{phase}"}}}}"#),
        ]);
        let again = eventually(Duration::from_secs(60), || {
            let now = c.k(&["get", "pod", pod, "-o", "jsonpath={.metadata.uid}"]);
            (!now.is_empty() && now != uid).then_some(())
        });
        assert!(
            again.is_some(),
            "{pod} was not made again: {}",
            c.k(&["get", "pods", "-o", "wide"])
        );
    }
    let msgs = event_messages(&c, "default", "StatefulSet", "keep");
    assert!(
        msgs.contains(&"StatefulSet default/keep is recreating failed Pod keep-0".to_string()),
        "{msgs:?}"
    );
    assert!(
        msgs.contains(&"StatefulSet default/keep is recreating terminated Pod keep-1".to_string()),
        "{msgs:?}"
    );
    assert!(
        msgs.contains(&"delete Pod keep-0 in StatefulSet keep successful".to_string()),
        "{msgs:?}"
    );
    let reasons = c.k(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=keep",
        "-o",
        "jsonpath={range .items[*]}{.type}/{.reason} {end}",
    ]);
    assert!(reasons.contains("Warning/RecreatingFailedPod"), "{reasons}");
    assert!(reasons.contains("Normal/RecreatingTerminatedPod"), "{reasons}");
}
