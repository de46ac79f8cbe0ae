//! APIServices (`apiregistration.k8s.io/v1`) driven by the real kubectl: the server's own local
//! APIServices (one per group version served, CustomResourceDefinitions' included), the
//! availability conditions of user APIServices, and upstream's validation messages.

#![cfg(test)]

mod common;

use std::time::Duration;

use common::{Cluster, eventually, table, tail};

const CONTROL_PLANE: &[&str] = &["--no-agent"];

/// The `kubectl get apiservices` line of `name`, once it shows `wanted` (30 s at most).
fn wait_line(c: &Cluster, name: &str, wanted: impl Fn(&str) -> bool) -> String {
    let found = eventually(Duration::from_secs(30), || {
        let out = c.k(&["get", "apiservices"]);
        out.lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .filter(|l| wanted(l))
            .map(str::to_string)
    });
    found.unwrap_or_else(|| {
        panic!(
            "no matching line for {name}:\n{}\n{}",
            c.k(&["get", "apiservices"]),
            tail(&c.log(), 30)
        )
    })
}

#[test]
fn the_servers_group_versions_are_local_api_services() {
    let c = Cluster::start(CONTROL_PLANE);

    let res = c.k(&["api-resources", "--api-group=apiregistration.k8s.io"]);
    assert_eq!(
        table(&res).get(1).cloned().unwrap_or_default(),
        ["apiservices", "apiregistration.k8s.io/v1", "false", "APIService"],
        "{res}"
    );

    let out = c.k(&["get", "apiservices"]);
    let rows = table(&out);
    assert_eq!(rows[0], ["NAME", "SERVICE", "AVAILABLE", "AGE"], "{out}");
    let names: Vec<&str> = rows[1..].iter().map(|r| r[0].as_str()).collect();
    for want in [
        "v1.",
        "v1.apps",
        "v1.batch",
        "v2.autoscaling",
        "v1.apiextensions.k8s.io",
        "v1.rbac.authorization.k8s.io",
        "v1.networking.k8s.io",
    ] {
        assert!(names.contains(&want), "{want} missing:\n{out}");
    }
    for r in &rows[1..] {
        assert_eq!(r[1..3], ["Local", "True"], "{out}");
    }
    // Listed by name, as upstream's storage lists them.
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted);

    let apps = c.get_json(&["apiservice", "v1.apps"]);
    assert_eq!(apps["spec"]["groupPriorityMinimum"], 17800);
    assert_eq!(apps["spec"]["versionPriority"], 15);
    assert!(apps["spec"].get("service").is_none_or(|s| s.is_null()), "{apps}");
    assert_eq!(
        apps["metadata"]["labels"]["kube-aggregator.kubernetes.io/automanaged"],
        "onstart"
    );
    let cond = &apps["status"]["conditions"][0];
    assert_eq!(cond["type"], "Available");
    assert_eq!(cond["status"], "True");
    assert_eq!(cond["reason"], "Local");
    assert_eq!(cond["message"], "Local APIServices are always available");
    let core = c.get_json(&["apiservice", "v1."]);
    assert_eq!(core["spec"]["groupPriorityMinimum"], 18000);
    assert_eq!(core["spec"]["group"], serde_json::Value::Null);

    // A definition's group version comes and goes with it.
    c.apply(
        r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  names: {plural: widgets, singular: widget, kind: Widget}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
"#,
        &[],
    );
    let line = wait_line(&c, "v1.example.com", |_| true);
    assert_eq!(table(&line)[0][1..3], ["Local", "True"], "{line}");
    let w = c.get_json(&["apiservice", "v1.example.com"]);
    assert_eq!(w["spec"]["groupPriorityMinimum"], 1000);
    assert_eq!(w["spec"]["versionPriority"], 100);
    assert_eq!(
        w["metadata"]["labels"]["kube-aggregator.kubernetes.io/automanaged"],
        "true"
    );
    c.k(&["delete", "crd", "widgets.example.com"]);
    c.wait_gone(&["apiservice", "v1.example.com"], Duration::from_secs(30));

    // A built-in one deleted comes back at the next start (it is synced on start).
    c.k(&["delete", "apiservice", "v1.batch"]);
    assert!(c.get_opt(&["apiservice", "v1.batch"]).is_none());
    let mut c = c;
    c.restart();
    wait_line(&c, "v1.batch", |l| l.contains("Local") && l.contains("True"));
}

#[test]
fn user_api_services_report_their_availability() {
    let c = Cluster::start(CONTROL_PLANE);

    c.apply(
        r#"
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata:
  name: v1beta1.metrics.example.com
spec:
  group: metrics.example.com
  version: v1beta1
  groupPriorityMinimum: 100
  versionPriority: 100
  insecureSkipTLSVerify: true
  service:
    namespace: default
    name: example-metrics
"#,
        &[],
    );
    let line = wait_line(&c, "v1beta1.metrics.example.com", |l| l.contains("False"));
    assert!(
        line.contains("default/example-metrics") && line.contains("False (ServiceNotFound)"),
        "{line}"
    );
    let s = c.get_json(&["apiservice", "v1beta1.metrics.example.com"]);
    assert_eq!(s["spec"]["service"]["port"], 443, "defaulted: {s}");
    assert_eq!(
        s["status"]["conditions"][0]["message"],
        "service/example-metrics in \"default\" is not present"
    );
    // Not the server's: left alone.
    assert!(s["metadata"].get("labels").is_none(), "{s}");

    // The Service exists but listens elsewhere, then on the port with no endpoints.
    c.apply(
        r#"
apiVersion: v1
kind: Service
metadata:
  name: example-metrics
spec:
  ports:
  - name: https
    port: 8443
"#,
        &[],
    );
    wait_line(&c, "v1beta1.metrics.example.com", |l| {
        l.contains("False (ServicePortError)")
    });
    c.apply(
        r#"
apiVersion: v1
kind: Service
metadata:
  name: example-metrics
spec:
  ports:
  - name: https
    port: 443
---
apiVersion: v1
kind: Endpoints
metadata:
  name: example-metrics
subsets: []
"#,
        &[],
    );
    wait_line(&c, "v1beta1.metrics.example.com", |l| {
        l.contains("False (MissingEndpoints)")
    });
    let s = c.get_json(&["apiservice", "v1beta1.metrics.example.com"]);
    assert_eq!(
        s["status"]["conditions"][0]["message"],
        "endpoints for service/example-metrics in \"default\" have no addresses with port name \"https\""
    );

    // Ready endpoints, but nothing answers the discovery check there.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    c.apply(
        &format!(
            r#"
apiVersion: v1
kind: Endpoints
metadata:
  name: example-metrics
subsets:
- addresses: [{{ip: 127.0.0.1}}]
  ports: [{{name: https, port: {closed}}}]
"#
        ),
        &[],
    );
    wait_line(&c, "v1beta1.metrics.example.com", |l| {
        l.contains("False (FailedDiscoveryCheck)")
    });
    let s = c.get_json(&["apiservice", "v1beta1.metrics.example.com"]);
    let url = format!("https://127.0.0.1:{closed}/apis/metrics.example.com/v1beta1");
    assert_eq!(
        s["status"]["conditions"][0]["message"],
        format!(
            "failing or missing response from {url}: Get {url:?}: dial tcp 127.0.0.1:{closed}: connect: connection refused"
        )
    );

    c.k(&["delete", "apiservice", "v1beta1.metrics.example.com"]);
    c.wait_gone(&["apiservice", "v1beta1.metrics.example.com"], Duration::from_secs(10));
}

#[test]
fn api_service_validation_in_upstream_words() {
    let c = Cluster::start(CONTROL_PLANE);
    let err = c.stdin_kubectl_err(
        &["apply", "-f", "-"],
        r#"
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata:
  name: metrics
spec:
  group: metrics.example.com
  version: v1beta1
  groupPriorityMinimum: 0
  versionPriority: 100
"#,
    );
    assert!(
        err.contains(
            "The APIService \"metrics\" is invalid: \n* metadata.name: Invalid value: \"metrics\": must be `spec.version+\".\"+spec.group`: \"v1beta1.metrics.example.com\"\n* spec.groupPriorityMinimum: Invalid value: 0: must be positive and less than 20000"
        ),
        "{err}"
    );
    let err = c.stdin_kubectl_err(
        &["apply", "-f", "-"],
        r#"
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata:
  name: v1.local.example.com
spec:
  group: local.example.com
  version: v1
  groupPriorityMinimum: 100
  versionPriority: 100
  insecureSkipTLSVerify: true
"#,
    );
    assert!(
        err.contains(
            "The APIService \"v1.local.example.com\" is invalid: spec.insecureSkipTLSVerify: Invalid value: true: local APIServices may not have insecureSkipTLSVerify"
        ),
        "{err}"
    );
    let err = c.stdin_kubectl_err(
        &["apply", "-f", "-"],
        r#"
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata:
  name: v2.
spec:
  version: v2
  groupPriorityMinimum: 100
  versionPriority: 100
"#,
    );
    assert!(
        err.contains("spec.group: Required value: only v1 may have an empty group and it better be legacy kube"),
        "{err}"
    );
}

#[test]
fn flow_control_configuration_is_bootstrapped_and_kept() {
    let c = Cluster::start(CONTROL_PLANE);

    let res = c.k(&["api-resources", "--api-group=flowcontrol.apiserver.k8s.io"]);
    let rows = table(&res);
    assert_eq!(
        rows[1..],
        [
            ["flowschemas", "flowcontrol.apiserver.k8s.io/v1", "false", "FlowSchema"],
            [
                "prioritylevelconfigurations",
                "flowcontrol.apiserver.k8s.io/v1",
                "false",
                "PriorityLevelConfiguration"
            ],
        ],
        "{res}"
    );

    // Every schema finds its level: MISSINGPL is False everywhere once the server has looked.
    let out = eventually(Duration::from_secs(30), || {
        let out = c.k(&["get", "flowschemas"]);
        table(&out)[1..]
            .iter()
            .all(|r| r.last().map(String::as_str) == Some("False"))
            .then_some(out)
    })
    .unwrap_or_else(|| panic!("{}", c.k(&["get", "flowschemas"])));
    let rows = table(&out);
    assert_eq!(
        rows[0],
        [
            "NAME",
            "PRIORITYLEVEL",
            "MATCHINGPRECEDENCE",
            "DISTINGUISHERMETHOD",
            "AGE",
            "MISSINGPL"
        ],
        "{out}"
    );
    let row = |name: &str| rows.iter().find(|r| r[0] == name).cloned().unwrap_or_default();
    assert_eq!(row("exempt")[..4], ["exempt", "exempt", "1", "<none>"], "{out}");
    assert_eq!(row("probes")[..4], ["probes", "exempt", "2", "<none>"], "{out}");
    assert_eq!(
        row("catch-all")[..4],
        ["catch-all", "catch-all", "10000", "ByUser"],
        "{out}"
    );
    assert_eq!(
        row("kube-system-service-accounts")[..4],
        ["kube-system-service-accounts", "workload-high", "900", "ByNamespace"],
        "{out}"
    );
    for name in [
        "system-leader-election",
        "endpoint-controller",
        "workload-leader-election",
        "system-node-high",
        "system-nodes",
        "kube-controller-manager",
        "kube-scheduler",
        "service-accounts",
        "global-default",
    ] {
        assert!(!row(name).is_empty(), "{name} missing:\n{out}");
    }
    assert_eq!(rows.len(), 14, "{out}");

    let out = c.k(&["get", "prioritylevelconfigurations"]);
    let rows = table(&out);
    assert_eq!(
        rows[0],
        [
            "NAME",
            "TYPE",
            "NOMINALCONCURRENCYSHARES",
            "QUEUES",
            "HANDSIZE",
            "QUEUELENGTHLIMIT",
            "AGE"
        ],
        "{out}"
    );
    let row = |name: &str| rows.iter().find(|r| r[0] == name).cloned().unwrap_or_default();
    assert_eq!(
        row("exempt")[..6],
        ["exempt", "Exempt", "<none>", "<none>", "<none>", "<none>"],
        "{out}"
    );
    assert_eq!(
        row("catch-all")[..6],
        ["catch-all", "Limited", "5", "<none>", "<none>", "<none>"],
        "{out}"
    );
    assert_eq!(
        row("global-default")[..6],
        ["global-default", "Limited", "20", "128", "6", "50"],
        "{out}"
    );
    assert_eq!(
        row("leader-election")[..6],
        ["leader-election", "Limited", "10", "16", "4", "50"],
        "{out}"
    );
    assert_eq!(rows.len(), 9, "{out}");
    let fs = c.get_json(&["flowschema", "global-default"]);
    assert_eq!(
        fs["metadata"]["annotations"]["apf.kubernetes.io/autoupdate-spec"],
        "true"
    );
    assert_eq!(fs["status"]["conditions"][0]["type"], "Dangling");
    assert_eq!(fs["status"]["conditions"][0]["reason"], "Found");

    // A deleted mandatory schema comes back; its spec cannot be changed.
    let before = c.get_json(&["flowschema", "catch-all"]);
    c.k(&["delete", "flowschema", "catch-all"]);
    let back = eventually(Duration::from_secs(30), || {
        c.get_opt(&["flowschema", "catch-all"])
            .filter(|fs| fs["metadata"]["uid"] != before["metadata"]["uid"])
    })
    .unwrap_or_else(|| panic!("catch-all did not come back:\n{}", tail(&c.log(), 30)));
    assert_eq!(back["spec"], before["spec"]);
    let err = c.k_err(&[
        "patch",
        "flowschema",
        "catch-all",
        "--type=merge",
        "-p",
        r#"{"spec":{"matchingPrecedence":9000}}"#,
    ]);
    assert!(err.contains("spec of 'catch-all' must equal the fixed value"), "{err}");

    // A suggested level changed with autoupdate off is left as it is.
    c.k(&[
        "annotate",
        "--overwrite",
        "prioritylevelconfiguration",
        "workload-low",
        "apf.kubernetes.io/autoupdate-spec=false",
    ]);
    c.k(&[
        "patch",
        "prioritylevelconfiguration",
        "workload-low",
        "--type=merge",
        "-p",
        r#"{"spec":{"limited":{"nominalConcurrencyShares":7}}}"#,
    ]);
    std::thread::sleep(Duration::from_secs(2));
    let pl = c.get_json(&["prioritylevelconfiguration", "workload-low"]);
    assert_eq!(pl["spec"]["limited"]["nominalConcurrencyShares"], 7);

    // A schema naming a level that does not exist is Dangling.
    c.apply(
        r#"
apiVersion: flowcontrol.apiserver.k8s.io/v1
kind: FlowSchema
metadata:
  name: batch-jobs
spec:
  priorityLevelConfiguration:
    name: batch
  rules:
  - subjects:
    - kind: ServiceAccount
      serviceAccount: {namespace: default, name: runner}
    resourceRules:
    - verbs: ["*"]
      apiGroups: ["batch"]
      resources: ["jobs"]
      namespaces: ["*"]
"#,
        &[],
    );
    let line = eventually(Duration::from_secs(30), || {
        let out = c.k(&["get", "flowschema", "batch-jobs"]);
        out.lines().nth(1).filter(|l| l.ends_with("True")).map(str::to_string)
    })
    .unwrap_or_else(|| panic!("{}", c.k(&["get", "flowschema", "batch-jobs", "-o", "yaml"])));
    assert_eq!(
        table(&line)[0][..4],
        ["batch-jobs", "batch", "1000", "<none>"],
        "{line}"
    );

    let err = c.stdin_kubectl_err(
        &["apply", "-f", "-"],
        r#"
apiVersion: flowcontrol.apiserver.k8s.io/v1
kind: PriorityLevelConfiguration
metadata:
  name: batch
spec:
  type: Limited
  limited:
    limitResponse:
      type: Queue
      queuing: {queues: 4, handSize: 5}
"#,
    );
    assert!(
        err.contains(
            "The PriorityLevelConfiguration \"batch\" is invalid: spec.limited.limitResponse.queuing.handSize: Invalid value: 5: should not be greater than queues (4)"
        ),
        "{err}"
    );
}
