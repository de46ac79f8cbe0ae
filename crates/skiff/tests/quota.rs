//! ResourceQuota and LimitRange with the real kubectl, on a control plane without nodes (quota
//! and limits are decided at admission; pods need not run): creates refused with upstream's
//! messages once a quota is used up, usage shown by `kubectl get/describe quota` and given back
//! when a pod goes, concurrent creates never passing a count quota, and a LimitRange's defaults
//! and minimum applied to pods.

#![cfg(test)]

mod common;

use std::time::Duration;

use common::{Cluster, eventually, table};

const CONTROL_PLANE: &[&str] = &["--no-agent", "--no-scheduler"];

fn pod(name: &str, cpu: &str, memory: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  containers:
  - name: app
    image: busybox:latest
    resources:
      requests: {{cpu: {cpu}}}
      limits: {{memory: {memory}}}
"#
    )
}

/// The quota's `status.used`, once the controller has written it.
fn used(c: &Cluster, ns: &str, name: &str, resource: &str) -> Option<String> {
    let q = c.get_json(&["quota", name, "-n", ns]);
    q.pointer(&format!("/status/used/{}", resource.replace('/', "~1")))
        .and_then(|v| v.as_str())
        .map(str::to_string)
}

fn wait_used(c: &Cluster, ns: &str, name: &str, resource: &str, want: &str) {
    let got = eventually(Duration::from_secs(20), || {
        (used(c, ns, name, resource).as_deref() == Some(want)).then_some(())
    });
    assert!(
        got.is_some(),
        "{resource} of quota {name} never became {want}: {:?}",
        c.get_json(&["quota", name, "-n", ns])["status"]
    );
}

/// `kubectl describe quota`'s `Resource Used Hard` lines.
fn described(c: &Cluster, name: &str) -> Vec<Vec<String>> {
    let out = c.k(&["describe", "quota", name]);
    out.lines()
        .skip_while(|l| !l.starts_with("Resource"))
        .skip(2)
        .map(|l| l.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        .filter(|cells| !cells.is_empty())
        .collect()
}

#[test]
fn a_quota_refuses_pods_beyond_it_and_gives_back_what_a_deleted_pod_used() {
    let c = Cluster::start(CONTROL_PLANE);
    assert!(c.k(&["explain", "resourcequota.spec"]).contains("hard"));
    c.k(&["create", "quota", "q", "--hard=pods=2,requests.cpu=1,limits.memory=1Gi"]);
    wait_used(&c, "default", "q", "pods", "0");

    let rows = table(&c.k(&["get", "quota"]));
    assert_eq!(rows[0], ["NAME", "AGE", "REQUEST", "LIMIT"]);
    assert_eq!(rows[1][0], "q");
    assert_eq!(
        rows[1][2..],
        ["pods:", "0/2,", "requests.cpu:", "0/1", "limits.memory:", "0/1Gi"]
    );

    // A pod that names neither resource the quota limits.
    let bare = r#"
apiVersion: v1
kind: Pod
metadata:
  name: bare
spec:
  containers:
  - name: app
    image: busybox:latest
"#;
    let err = c.stdin_kubectl_err(&["create", "-f", "-"], bare);
    assert!(
        err.contains(
            r#"Error from server (Forbidden): error when creating "STDIN": pods "bare" is forbidden: failed quota: q: must specify limits.memory for: app; must specify requests.cpu for: app"#
        ),
        "{err}"
    );

    c.stdin_kubectl(&["create", "-f", "-"], &pod("a", "400m", "512Mi"));
    let err = c.stdin_kubectl_err(&["create", "-f", "-"], &pod("b", "400m", "600Mi"));
    assert!(
        err.contains(
            r#"pods "b" is forbidden: exceeded quota: q, requested: limits.memory=600Mi, used: limits.memory=512Mi, limited: limits.memory=1Gi"#
        ),
        "{err}"
    );
    c.stdin_kubectl(&["create", "-f", "-"], &pod("b", "400m", "256Mi"));
    let refused = c
        .kubectl_cmd(&["create", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            if let Some(mut stdin) = child.stdin.take() {
                stdin.write_all(pod("c", "100m", "100Mi").as_bytes())?;
            }
            child.wait_with_output()
        })
        .expect("kubectl");
    assert_eq!(refused.status.code(), Some(1));
    let err = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(
        err.trim(),
        r#"Error from server (Forbidden): error when creating "STDIN": pods "c" is forbidden: exceeded quota: q, requested: pods=1, used: pods=2, limited: pods=2"#
    );

    // Charged at admission: the quota already says what the two pods use.
    assert_eq!(
        described(&c, "q"),
        [
            ["limits.memory", "768Mi", "1Gi"],
            ["pods", "2", "2"],
            ["requests.cpu", "800m", "1"],
        ]
    );

    // A deleted pod's usage is given back by the controller.
    c.k(&["delete", "pod", "a", "--wait=true"]);
    wait_used(&c, "default", "q", "pods", "1");
    assert_eq!(
        described(&c, "q"),
        [
            ["limits.memory", "256Mi", "1Gi"],
            ["pods", "1", "2"],
            ["requests.cpu", "400m", "1"],
        ]
    );
    c.stdin_kubectl(&["create", "-f", "-"], &pod("c", "100m", "100Mi"));
}

#[test]
fn concurrent_creates_never_pass_a_count_quota() {
    let c = Cluster::start(CONTROL_PLANE);
    c.k(&["create", "namespace", "burst"]);
    c.k(&[
        "create",
        "quota",
        "objects",
        "-n",
        "burst",
        "--hard=secrets=5,count/deployments.apps=1",
    ]);
    wait_used(&c, "burst", "objects", "secrets", "0");

    let results: Vec<std::process::Output> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..16)
            .map(|i| {
                let c = &c;
                s.spawn(move || {
                    c.kubectl(&[
                        "create",
                        "secret",
                        "generic",
                        &format!("s{i}"),
                        "-n",
                        "burst",
                        "--from-literal=k=v",
                    ])
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("kubectl thread")).collect()
    });
    let created = results.iter().filter(|o| o.status.success()).count();
    assert_eq!(created, 5, "exactly the quota's worth of creates pass");
    for o in results.iter().filter(|o| !o.status.success()) {
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains(
                "is forbidden: exceeded quota: objects, requested: secrets=1, used: secrets=5, limited: secrets=5"
            ),
            "{err}"
        );
    }
    let secrets = c.get_json(&["secrets", "-n", "burst"]);
    assert_eq!(secrets["items"].as_array().map(Vec::len), Some(5));
    assert_eq!(used(&c, "burst", "objects", "secrets").as_deref(), Some("5"));

    // Any resource is counted as count/<resource>.<group>.
    c.k(&["create", "deployment", "one", "-n", "burst", "--image=busybox:latest"]);
    let err = c.k_err(&["create", "deployment", "two", "-n", "burst", "--image=busybox:latest"]);
    assert!(
        err.contains(
            r#"deployments.apps "two" is forbidden: exceeded quota: objects, requested: count/deployments.apps=1, used: count/deployments.apps=1, limited: count/deployments.apps=1"#
        ),
        "{err}"
    );
}

#[test]
fn a_limit_range_defaults_pods_and_refuses_requests_below_its_minimum() {
    let c = Cluster::start(CONTROL_PLANE);
    let lr = r#"
apiVersion: v1
kind: LimitRange
metadata:
  name: cpu-mem
spec:
  limits:
  - type: Container
    default: {cpu: 500m, memory: 256Mi}
    defaultRequest: {cpu: 200m}
    min: {cpu: 100m}
    max: {cpu: "1"}
"#;
    c.apply(lr, &[]);
    let rows = table(&c.k(&["get", "limits"]));
    assert_eq!(rows[0], ["NAME", "CREATED", "AT"]);
    assert_eq!(rows[1][0], "cpu-mem");
    assert!(rows[1][1].ends_with('Z'), "{rows:?}");
    // Defaulted as upstream: the default request of memory is its default limit.
    let stored = c.get_json(&["limitrange", "cpu-mem"]);
    assert_eq!(stored["spec"]["limits"][0]["defaultRequest"]["memory"], "256Mi");

    let bare = r#"
apiVersion: v1
kind: Pod
metadata:
  name: bare
spec:
  containers:
  - name: app
    image: busybox:latest
"#;
    c.stdin_kubectl(&["create", "-f", "-"], bare);
    let p = c.get_json(&["pod", "bare"]);
    let res = &p["spec"]["containers"][0]["resources"];
    assert_eq!(res["requests"]["cpu"], "200m", "{p}");
    assert_eq!(res["requests"]["memory"], "256Mi", "{p}");
    assert_eq!(res["limits"]["cpu"], "500m", "{p}");
    assert_eq!(res["limits"]["memory"], "256Mi", "{p}");
    assert_eq!(
        p["metadata"]["annotations"]["kubernetes.io/limit-ranger"],
        "LimitRanger plugin set: cpu, memory request for container app; cpu, memory limit for container app"
    );
    assert_eq!(p["status"]["qosClass"], "Burstable", "{p}");

    let err = c.stdin_kubectl_err(&["create", "-f", "-"], &pod("small", "50m", "64Mi"));
    assert!(
        err.contains(
            r#"Error from server (Forbidden): error when creating "STDIN": pods "small" is forbidden: minimum cpu usage per Container is 100m, but request is 50m"#
        ),
        "{err}"
    );
    // The default limit (500m) is below the request: validation refuses it first, as upstream.
    let err = c.stdin_kubectl_err(&["create", "-f", "-"], &pod("big", "2", "64Mi"));
    assert!(
        err.contains("spec.containers[0].resources.requests: Invalid value: \"2\": must be less than or equal to cpu limit of 500m"),
        "{err}"
    );
    let big = pod("big", "2", "64Mi").replace("limits: {memory: 64Mi}", "limits: {cpu: 2, memory: 64Mi}");
    let err = c.stdin_kubectl_err(&["create", "-f", "-"], &big);
    assert!(
        err.contains(r#"pods "big" is forbidden: maximum cpu usage per Container is 1, but limit is 2"#),
        "{err}"
    );

    // Validation as upstream's.
    let bad = r#"
apiVersion: v1
kind: LimitRange
metadata:
  name: bad
spec:
  limits:
  - type: Container
    min: {cpu: "2"}
    max: {cpu: "1"}
"#;
    let err = c.stdin_kubectl_err(&["apply", "-f", "-"], bad);
    assert!(
        err.contains(r#"spec.limits[0].min[cpu]: Invalid value: "2": min value 2 is greater than max value 1"#),
        "{err}"
    );
    let described = c.k(&["describe", "limitrange", "cpu-mem"]);
    assert!(
        described
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["Container", "cpu", "100m", "1", "200m", "500m", "-"]),
        "{described}"
    );
}
