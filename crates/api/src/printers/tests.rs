//! Rows compared with what `kubectl get` prints against an upstream cluster for the same objects.

use jiff::Timestamp;
use serde_json::{Value, json};

use super::*;
use crate::registry::{RESOURCES, lookup};

fn now() -> Timestamp {
    "2024-05-01T12:00:00Z".parse().unwrap()
}

fn res(group: &str, plural: &str) -> &'static Resource {
    lookup(group, "v1", plural).unwrap()
}

fn cells(group: &str, plural: &str, obj: &Value) -> Vec<Value> {
    let r = res(group, plural);
    let cells = row_cells(r, obj, now());
    assert_eq!(
        cells.len(),
        column_definitions(r).len(),
        "{plural}: one cell per column"
    );
    cells
}

fn names(group: &str, plural: &str) -> Vec<String> {
    column_definitions(res(group, plural))
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_string())
        .collect()
}

fn running_pod() -> Value {
    json!({
        "metadata": {"name": "web-7d4b9c-abcde", "namespace": "default",
                     "creationTimestamp": "2024-05-01T11:56:58Z", "labels": {"app": "web"}},
        "spec": {"nodeName": "node-1", "containers": [{"name": "a", "image": "nginx"}, {"name": "b", "image": "busybox"}]},
        "status": {
            "phase": "Running",
            "podIPs": [{"ip": "10.244.0.7"}],
            "conditions": [{"type": "Ready", "status": "False"}],
            "containerStatuses": [
                {"name": "a", "ready": true, "restartCount": 0, "state": {"running": {"startedAt": "2024-05-01T11:57:00Z"}}},
                {"name": "b", "ready": false, "restartCount": 5,
                 "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                 "lastState": {"terminated": {"exitCode": 1, "finishedAt": "2024-05-01T11:55:00Z"}}}
            ]
        }
    })
}

#[test]
fn every_resource_has_consistent_columns() {
    for r in RESOURCES {
        let defs = column_definitions(r);
        assert!(!defs.is_empty());
        assert!(defs.iter().any(|d| d["name"] == "Name"), "{}", r.plural);
        for d in &defs {
            for key in ["name", "type", "format", "description", "priority"] {
                assert!(d.get(key).is_some(), "{} column lacks {key}", r.plural);
            }
        }
        let cells = row_cells(r, &json!({"metadata": {"name": "x"}}), now());
        assert_eq!(cells.len(), defs.len(), "{}", r.plural);
    }
}

#[test]
fn pod_columns_and_crashloop() {
    assert_eq!(
        names("", "pods"),
        [
            "Name",
            "Ready",
            "Status",
            "Restarts",
            "Age",
            "IP",
            "Node",
            "Nominated Node",
            "Readiness Gates"
        ]
    );
    let c = cells("", "pods", &running_pod());
    assert_eq!(
        c,
        vec![
            json!("web-7d4b9c-abcde"),
            json!("1/2"),
            json!("CrashLoopBackOff"),
            json!("5 (5m ago)"),
            json!("3m2s"),
            json!("10.244.0.7"),
            json!("node-1"),
            json!("<none>"),
            json!("<none>")
        ]
    );
}

#[test]
fn pod_status_reasons() {
    let status_of = |pod: Value| cells("", "pods", &pod)[2].as_str().unwrap().to_string();
    let pending = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}]},
                         "status": {"phase": "Pending"}});
    assert_eq!(status_of(pending), "Pending");

    let pulling = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}]},
        "status": {"phase": "Pending", "containerStatuses": [
            {"name": "a", "state": {"waiting": {"reason": "ErrImagePull"}}}]}});
    assert_eq!(status_of(pulling), "ErrImagePull");

    let init = json!({"metadata": {"name": "p"},
        "spec": {"initContainers": [{"name": "i1"}, {"name": "i2"}], "containers": [{"name": "a"}]},
        "status": {"phase": "Pending",
            "initContainerStatuses": [
                {"name": "i1", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
                {"name": "i2", "state": {"running": {}}}],
            "containerStatuses": [{"name": "a", "state": {"waiting": {"reason": "PodInitializing"}}}]}});
    assert_eq!(status_of(init), "Init:1/2");

    let init_failed = json!({"metadata": {"name": "p"},
        "spec": {"initContainers": [{"name": "i1"}], "containers": [{"name": "a"}]},
        "status": {"phase": "Pending", "initContainerStatuses": [
            {"name": "i1", "restartCount": 3, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}});
    assert_eq!(status_of(init_failed), "Init:CrashLoopBackOff");

    let init_error = json!({"metadata": {"name": "p"},
        "spec": {"initContainers": [{"name": "i1"}], "containers": [{"name": "a"}]},
        "status": {"phase": "Pending", "initContainerStatuses": [
            {"name": "i1", "state": {"terminated": {"exitCode": 2}}}]}});
    assert_eq!(status_of(init_error), "Init:ExitCode:2");

    let initializing = json!({"metadata": {"name": "p"},
        "spec": {"initContainers": [{"name": "i1"}], "containers": [{"name": "a"}]},
        "status": {"phase": "Pending",
            "initContainerStatuses": [{"name": "i1", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}],
            "containerStatuses": [{"name": "a", "state": {"waiting": {"reason": "PodInitializing"}}}]}});
    assert_eq!(status_of(initializing), "PodInitializing");

    let completed = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}]},
        "status": {"phase": "Succeeded", "containerStatuses": [
            {"name": "a", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]}});
    assert_eq!(status_of(completed.clone()), "Completed");
    let r = row(res("", "pods"), &completed, now());
    assert_eq!(r["conditions"][0]["reason"], "Succeeded");

    let error = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}]},
        "status": {"phase": "Failed", "containerStatuses": [
            {"name": "a", "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}});
    assert_eq!(status_of(error), "Error");

    let signal = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}]},
        "status": {"phase": "Failed", "containerStatuses": [
            {"name": "a", "state": {"terminated": {"exitCode": 137, "signal": 9}}}]}});
    assert_eq!(status_of(signal), "Signal:9");

    let mut terminating = running_pod();
    terminating["metadata"]["deletionTimestamp"] = json!("2024-05-01T11:59:00Z");
    assert_eq!(status_of(terminating), "Terminating");

    let lost = json!({"metadata": {"name": "p", "deletionTimestamp": "2024-05-01T11:59:00Z"},
        "spec": {"containers": [{"name": "a"}]}, "status": {"phase": "Running", "reason": "NodeLost"}});
    assert_eq!(status_of(lost), "Unknown");

    let evicted = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}]},
        "status": {"phase": "Failed", "reason": "Evicted"}});
    assert_eq!(status_of(evicted), "Evicted");

    let gated = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}]},
        "status": {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]}});
    assert_eq!(status_of(gated), "SchedulingGated");

    // One container completed while another still runs: Running when the pod is Ready.
    let partial = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}, {"name": "b"}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [
                {"name": "a", "ready": true, "state": {"running": {}}},
                {"name": "b", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]}});
    assert_eq!(status_of(partial), "Running");
}

#[test]
fn pod_sidecars_count_as_containers() {
    let pod = json!({"metadata": {"name": "p"},
        "spec": {"initContainers": [{"name": "side", "restartPolicy": "Always"}], "containers": [{"name": "a"}],
                 "readinessGates": [{"conditionType": "x"}]},
        "status": {"phase": "Running",
            "conditions": [{"type": "Initialized", "status": "True"}, {"type": "x", "status": "True"}],
            "initContainerStatuses": [{"name": "side", "started": true, "ready": true, "restartCount": 2,
                "state": {"running": {}}}],
            "containerStatuses": [{"name": "a", "ready": true, "restartCount": 0, "state": {"running": {}}}]}});
    let c = cells("", "pods", &pod);
    assert_eq!(c[1], "2/2");
    assert_eq!(c[2], "Running");
    assert_eq!(c[3], "2");
    assert_eq!(c[8], "1/1");
}

#[test]
fn node_rows() {
    let node = json!({
        "metadata": {"name": "node-1", "creationTimestamp": "2024-04-29T09:00:00Z",
            "labels": {"node-role.kubernetes.io/control-plane": "", "node-role.kubernetes.io/worker": "",
                       "kubernetes.io/hostname": "node-1"}},
        "spec": {"unschedulable": true},
        "status": {
            "conditions": [{"type": "MemoryPressure", "status": "False"}, {"type": "Ready", "status": "True"}],
            "addresses": [{"type": "InternalIP", "address": "172.18.0.2"}, {"type": "Hostname", "address": "node-1"}],
            "nodeInfo": {"kubeletVersion": "v1.33.0", "osImage": "Debian GNU/Linux 12 (bookworm)",
                         "kernelVersion": "6.1.0", "containerRuntimeVersion": "docker://24.0.7"}
        }
    });
    assert_eq!(
        cells("", "nodes", &node),
        vec![
            json!("node-1"),
            json!("Ready,SchedulingDisabled"),
            json!("control-plane,worker"),
            json!("2d3h"),
            json!("v1.33.0"),
            json!("172.18.0.2"),
            json!("<none>"),
            json!("Debian GNU/Linux 12 (bookworm)"),
            json!("6.1.0"),
            json!("docker://24.0.7")
        ]
    );
    let not_ready =
        json!({"metadata": {"name": "n"}, "status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}});
    let c = cells("", "nodes", &not_ready);
    assert_eq!(c[1], "NotReady");
    assert_eq!(c[2], "<none>");
    assert_eq!(c[7], "<unknown>");
    let bare = json!({"metadata": {"name": "n"}});
    assert_eq!(cells("", "nodes", &bare)[1], "Unknown");
}

#[test]
fn deployment_and_replicaset_rows() {
    let deploy = json!({
        "metadata": {"name": "web", "creationTimestamp": "2024-05-01T11:00:00Z"},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"spec": {"containers": [{"name": "nginx", "image": "nginx:1.25"}, {"name": "log", "image": "busybox"}]}}},
        "status": {"readyReplicas": 2, "updatedReplicas": 3, "availableReplicas": 2}
    });
    assert_eq!(
        names("apps", "deployments"),
        [
            "Name",
            "Ready",
            "Up-to-date",
            "Available",
            "Age",
            "Containers",
            "Images",
            "Selector"
        ]
    );
    assert_eq!(
        cells("apps", "deployments", &deploy),
        vec![
            json!("web"),
            json!("2/3"),
            json!(3),
            json!(2),
            json!("60m"),
            json!("nginx,log"),
            json!("nginx:1.25,busybox"),
            json!("app=web")
        ]
    );
    let defs = column_definitions(res("apps", "deployments"));
    assert_eq!(defs[5]["priority"], 1);
    assert_eq!(defs[1]["priority"], 0);
    assert_eq!(defs[0]["format"], "name");

    let rs = json!({
        "metadata": {"name": "web-7d4b9c", "creationTimestamp": "2024-05-01T11:00:00Z"},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web", "pod-template-hash": "7d4b9c"}},
                 "template": {"spec": {"containers": [{"name": "nginx", "image": "nginx:1.25"}]}}},
        "status": {"replicas": 3, "readyReplicas": 1}
    });
    assert_eq!(
        cells("apps", "replicasets", &rs),
        vec![
            json!("web-7d4b9c"),
            json!(3),
            json!(3),
            json!(1),
            json!("60m"),
            json!("nginx"),
            json!("nginx:1.25"),
            json!("app=web,pod-template-hash=7d4b9c")
        ]
    );

    let rc = json!({
        "metadata": {"name": "web", "creationTimestamp": "2024-05-01T11:00:00Z"},
        "spec": {"replicas": 3, "selector": {"tier": "fe", "app": "web"},
                 "template": {"spec": {"containers": [{"name": "nginx", "image": "nginx:1.25"}]}}},
        "status": {"replicas": 2, "readyReplicas": 1}
    });
    assert_eq!(
        cells("", "replicationcontrollers", &rc),
        vec![
            json!("web"),
            json!(3),
            json!(2),
            json!(1),
            json!("60m"),
            json!("nginx"),
            json!("nginx:1.25"),
            json!("app=web,tier=fe")
        ]
    );
    let defs = column_definitions(res("", "replicationcontrollers"));
    let names: Vec<&str> = defs.iter().filter_map(|d| d["name"].as_str()).collect();
    assert_eq!(
        names,
        [
            "Name",
            "Desired",
            "Current",
            "Ready",
            "Age",
            "Containers",
            "Images",
            "Selector"
        ]
    );
    assert_eq!(defs[7]["priority"], 1);
}

#[test]
fn daemonset_statefulset_revision_rows() {
    let ds = json!({
        "metadata": {"name": "agent", "creationTimestamp": "2024-05-01T11:59:55Z"},
        "spec": {"selector": {"matchLabels": {"app": "agent"}},
                 "template": {"spec": {"containers": [{"name": "a", "image": "agent:1"}]}}},
        "status": {"desiredNumberScheduled": 3, "currentNumberScheduled": 3, "numberReady": 2,
                   "updatedNumberScheduled": 3, "numberAvailable": 2}
    });
    let c = cells("apps", "daemonsets", &ds);
    assert_eq!(
        c[..8],
        [
            json!("agent"),
            json!(3),
            json!(3),
            json!(2),
            json!(3),
            json!(2),
            json!("<none>"),
            json!("5s")
        ]
    );
    assert_eq!(c[10], "app=agent");

    let sts = json!({"metadata": {"name": "db"}, "spec": {"replicas": 3}, "status": {"readyReplicas": 1}});
    assert_eq!(cells("apps", "statefulsets", &sts)[1], "1/3");

    let cr = json!({"metadata": {"name": "agent-5d8f", "ownerReferences": [
        {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "controller": true, "uid": "u"}]},
        "revision": 2});
    assert_eq!(
        cells("apps", "controllerrevisions", &cr)[1..3],
        [json!("daemonset.apps/agent"), json!(2)]
    );
}

#[test]
fn job_and_cronjob_rows() {
    assert_eq!(
        names("batch", "jobs"),
        [
            "Name",
            "Status",
            "Completions",
            "Duration",
            "Age",
            "Containers",
            "Images",
            "Selector"
        ]
    );
    let job = json!({
        "metadata": {"name": "pi", "creationTimestamp": "2024-05-01T11:50:00Z"},
        "spec": {"completions": 1, "parallelism": 1,
                 "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": "abc"}},
                 "template": {"spec": {"containers": [{"name": "pi", "image": "perl"}]}}},
        "status": {"succeeded": 1, "startTime": "2024-05-01T11:50:00Z", "completionTime": "2024-05-01T11:50:12Z",
                   "conditions": [{"type": "Complete", "status": "True"}]}
    });
    let c = cells("batch", "jobs", &job);
    assert_eq!(
        c[..5],
        [json!("pi"), json!("Complete"), json!("1/1"), json!("12s"), json!("10m")]
    );
    assert_eq!(c[7], "batch.kubernetes.io/controller-uid=abc");

    let running = json!({"metadata": {"name": "j"}, "spec": {"parallelism": 3},
        "status": {"startTime": "2024-05-01T11:58:00Z"}});
    let c = cells("batch", "jobs", &running);
    assert_eq!(c[1..4], [json!("Running"), json!("0/1 of 3"), json!("2m")]);
    let failed = json!({"metadata": {"name": "j"}, "status": {"conditions": [
        {"type": "FailureTarget", "status": "True"}, {"type": "Failed", "status": "True"}]}});
    assert_eq!(cells("batch", "jobs", &failed)[1], "Failed");
    assert_eq!(cells("batch", "jobs", &json!({"metadata": {"name": "j"}}))[3], "");

    let cj = json!({
        "metadata": {"name": "hello", "creationTimestamp": "2024-05-01T10:00:00Z"},
        "spec": {"schedule": "*/1 * * * *", "suspend": false,
                 "jobTemplate": {"spec": {"template": {"spec": {"containers": [{"name": "hello", "image": "busybox"}]}}}}},
        "status": {"active": [{"name": "hello-1"}], "lastScheduleTime": "2024-05-01T11:59:00Z"}
    });
    assert_eq!(
        cells("batch", "cronjobs", &cj),
        vec![
            json!("hello"),
            json!("*/1 * * * *"),
            json!("<none>"),
            json!("False"),
            json!(1),
            json!("60s"),
            json!("120m"),
            json!("hello"),
            json!("busybox"),
            json!("<none>")
        ]
    );
}

#[test]
fn service_rows() {
    let svc = json!({
        "metadata": {"name": "web", "creationTimestamp": "2024-05-01T11:59:00Z"},
        "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.12", "clusterIPs": ["10.96.0.12"],
                 "ports": [{"port": 80, "protocol": "TCP"}, {"port": 443, "protocol": "TCP"}],
                 "selector": {"app": "web"}}
    });
    assert_eq!(
        cells("", "services", &svc),
        vec![
            json!("web"),
            json!("ClusterIP"),
            json!("10.96.0.12"),
            json!("<none>"),
            json!("80/TCP,443/TCP"),
            json!("60s"),
            json!("app=web")
        ]
    );
    let np = json!({"metadata": {"name": "np"}, "spec": {"type": "NodePort", "clusterIPs": ["10.96.0.13"],
        "ports": [{"port": 80, "nodePort": 30080, "protocol": "TCP"}]}});
    let c = cells("", "services", &np);
    assert_eq!(c[4], "80:30080/TCP");
    assert_eq!(c[6], "<none>");
    let lb = json!({"metadata": {"name": "lb"}, "spec": {"type": "LoadBalancer", "clusterIPs": ["10.96.0.14"]}});
    assert_eq!(cells("", "services", &lb)[3], "<pending>");
    let lb2 = json!({"metadata": {"name": "lb"}, "spec": {"type": "LoadBalancer"},
        "status": {"loadBalancer": {"ingress": [{"ip": "1.2.3.4"}]}}});
    let c = cells("", "services", &lb2);
    assert_eq!(c[2..5], [json!("<none>"), json!("1.2.3.4"), json!("<none>")]);
    let ext = json!({"metadata": {"name": "x"}, "spec": {"type": "ExternalName", "externalName": "example.com"}});
    assert_eq!(cells("", "services", &ext)[3], "example.com");
}

#[test]
fn event_rows_core_and_events_k8s_io() {
    assert_eq!(
        names("", "events"),
        [
            "Last Seen",
            "Type",
            "Reason",
            "Object",
            "Subobject",
            "Source",
            "Message",
            "First Seen",
            "Count",
            "Name"
        ]
    );
    let ev = json!({
        "metadata": {"name": "web.17c", "namespace": "default"},
        "involvedObject": {"kind": "Pod", "name": "web", "fieldPath": "spec.containers{nginx}"},
        "reason": "Pulled", "type": "Normal", "message": "Container image \"nginx\" already present on machine\n",
        "source": {"component": "kubelet", "host": "node-1"},
        "firstTimestamp": "2024-05-01T11:50:00Z", "lastTimestamp": "2024-05-01T11:59:30Z", "count": 4
    });
    assert_eq!(
        cells("", "events", &ev),
        vec![
            json!("30s"),
            json!("Normal"),
            json!("Pulled"),
            json!("pod/web"),
            json!("spec.containers{nginx}"),
            json!("kubelet, node-1"),
            json!("Container image \"nginx\" already present on machine"),
            json!("10m"),
            json!(4),
            json!("web.17c")
        ]
    );
    let new = json!({
        "metadata": {"name": "n.1"},
        "regarding": {"kind": "Node", "name": "node-1"},
        "reason": "Starting", "type": "Normal", "note": "Starting kubelet.",
        "reportingController": "kubelet", "reportingInstance": "node-1",
        "eventTime": "2024-05-01T11:59:58.123456Z" // 1.88s ago: truncated, as upstream
    });
    let c = row_cells(lookup("events.k8s.io", "v1", "events").unwrap(), &new, now());
    assert_eq!(
        c,
        vec![
            json!("1s"),
            json!("Normal"),
            json!("Starting"),
            json!("node/node-1"),
            json!(""),
            json!("kubelet, node-1"),
            json!("Starting kubelet."),
            json!("1s"),
            json!(1),
            json!("n.1")
        ]
    );
    let series = json!({"metadata": {"name": "s"}, "involvedObject": {"kind": "Pod"},
        "eventTime": "2024-05-01T11:00:00Z", "series": {"count": 7, "lastObservedTime": "2024-05-01T11:59:00Z"}});
    let c = cells("", "events", &series);
    assert_eq!(c[0], "60s");
    assert_eq!(c[3], "pod");
    assert_eq!(c[7], "60m");
    assert_eq!(c[8], 7);
}

#[test]
fn small_kinds() {
    let ns = json!({"metadata": {"name": "default", "creationTimestamp": "2024-04-01T12:00:00Z"}, "status": {"phase": "Active"}});
    assert_eq!(
        cells("", "namespaces", &ns),
        vec![json!("default"), json!("Active"), json!("30d")]
    );

    let secret = json!({"metadata": {"name": "s"}, "type": "Opaque", "data": {"a": "eA==", "b": "eQ=="}});
    assert_eq!(cells("", "secrets", &secret)[1..3], [json!("Opaque"), json!(2)]);

    let cm = json!({"metadata": {"name": "c"}, "data": {"a": "x"}, "binaryData": {"b": "eQ=="}});
    assert_eq!(cells("", "configmaps", &cm)[1], 2);

    let sa = json!({"metadata": {"name": "default"}});
    assert_eq!(cells("", "serviceaccounts", &sa)[1], 0);

    let ep = json!({"metadata": {"name": "web"}, "subsets": [{
        "addresses": [{"ip": "10.0.0.1"}, {"ip": "10.0.0.2"}, {"ip": "10.0.0.3"}, {"ip": "10.0.0.4"}],
        "ports": [{"port": 80}]}]});
    assert_eq!(
        cells("", "endpoints", &ep)[1],
        "10.0.0.1:80,10.0.0.2:80,10.0.0.3:80 + 1 more..."
    );
    assert_eq!(cells("", "endpoints", &json!({"metadata": {"name": "e"}}))[1], "<none>");

    let pv = json!({"metadata": {"name": "pv1"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany", "ReadWriteOnce"],
                 "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "manual",
                 "claimRef": {"namespace": "default", "name": "data"}},
        "status": {"phase": "Bound"}});
    let c = cells("", "persistentvolumes", &pv);
    assert_eq!(
        c[1..9],
        [
            json!("1Gi"),
            json!("RWO,RWX"),
            json!("Retain"),
            json!("Bound"),
            json!("default/data"),
            json!("manual"),
            json!("<unset>"),
            json!("")
        ]
    );
    assert_eq!(c[10], "<unset>");

    let pvc = json!({"metadata": {"name": "data"},
        "spec": {"volumeName": "pv1", "storageClassName": "manual", "volumeMode": "Filesystem"},
        "status": {"phase": "Bound", "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"]}});
    let c = cells("", "persistentvolumeclaims", &pvc);
    assert_eq!(
        c[1..7],
        [
            json!("Bound"),
            json!("pv1"),
            json!("1Gi"),
            json!("RWO"),
            json!("manual"),
            json!("<unset>")
        ]
    );
    assert_eq!(c[8], "Filesystem");
    let pending = json!({"metadata": {"name": "d"}, "spec": {}, "status": {"phase": "Pending"}});
    assert_eq!(
        cells("", "persistentvolumeclaims", &pending)[2..5],
        [json!(""), json!(""), json!("")]
    );
    // Being deleted (a protection finalizer holds it): Terminating, whatever the phase.
    let mut deleting = pvc.clone();
    deleting["metadata"]["deletionTimestamp"] = json!("2024-05-01T11:59:00Z");
    deleting["metadata"]["finalizers"] = json!(["kubernetes.io/pvc-protection"]);
    assert_eq!(
        cells("", "persistentvolumeclaims", &deleting)[1..3],
        [json!("Terminating"), json!("pv1")]
    );
    let mut deleting = pv.clone();
    deleting["metadata"]["deletionTimestamp"] = json!("2024-05-01T11:59:00Z");
    assert_eq!(cells("", "persistentvolumes", &deleting)[4], "Terminating");

    let lease = json!({"metadata": {"name": "node-1", "creationTimestamp": "2024-05-01T11:59:59Z"}, "spec": {"holderIdentity": "node-1"}});
    assert_eq!(
        cells("coordination.k8s.io", "leases", &lease),
        vec![json!("node-1"), json!("node-1"), json!("1s")]
    );

    let pdb = json!({"metadata": {"name": "web"}, "spec": {"minAvailable": 2}, "status": {"disruptionsAllowed": 1}});
    assert_eq!(
        cells("policy", "poddisruptionbudgets", &pdb)[1..4],
        [json!("2"), json!("N/A"), json!(1)]
    );
    let pdb2 = json!({"metadata": {"name": "web"}, "spec": {"maxUnavailable": "25%"}});
    assert_eq!(
        cells("policy", "poddisruptionbudgets", &pdb2)[1..3],
        [json!("N/A"), json!("25%")]
    );

    let pc = json!({"metadata": {"name": "system-node-critical"}, "value": 2000001000, "globalDefault": false,
                    "preemptionPolicy": "PreemptLowerPriority"});
    let c = cells("scheduling.k8s.io", "priorityclasses", &pc);
    assert_eq!(c[1..3], [json!(2000001000), json!(false)]);
    assert_eq!(c[4], "PreemptLowerPriority");
}

#[test]
fn default_columns_and_unknown_age() {
    let binding = lookup("", "v1", "bindings").unwrap();
    assert_eq!(column_definitions(binding).len(), 2);
    assert_eq!(
        row_cells(binding, &json!({"metadata": {"name": "b"}}), now()),
        vec![json!("b"), json!("<unknown>")]
    );
}

#[test]
fn whole_table() {
    let pods = res("", "pods");
    let pod = running_pod();
    let t = table(pods, &[&pod], now(), true, "42", Some("tok"));
    assert_eq!(t["kind"], "Table");
    assert_eq!(t["apiVersion"], "meta.k8s.io/v1");
    assert_eq!(t["metadata"]["resourceVersion"], "42");
    assert_eq!(t["metadata"]["continue"], "tok");
    assert_eq!(t["columnDefinitions"].as_array().unwrap().len(), 9);
    let row = &t["rows"][0];
    assert_eq!(row["cells"][0], "web-7d4b9c-abcde");
    assert_eq!(row["object"]["kind"], "PartialObjectMetadata");
    assert_eq!(row["object"]["apiVersion"], "meta.k8s.io/v1");
    assert_eq!(row["object"]["metadata"]["labels"]["app"], "web");
    assert_eq!(row["object"]["metadata"]["namespace"], "default");
    assert!(row.get("conditions").is_none());

    let t = table(pods, &[], now(), false, "", None);
    assert_eq!(t["columnDefinitions"], json!([]));
    assert_eq!(t["rows"], json!([]));
    assert_eq!(t["metadata"], json!({}));
}

/// Cases from upstream's `TestPrintPod` / `TestPrintPodWithRestartableInitContainer`:
/// (pod, READY, STATUS, RESTARTS).
#[test]
fn upstream_print_pod_cases() {
    let ago = |secs: i64| (now() - jiff::SignedDuration::from_secs(secs)).to_string();
    let unnamed = |n: usize| Value::Array(vec![json!({}); n]);
    let sidecars = json!([{"name": "r1", "restartPolicy": "Always"}, {"name": "r2", "restartPolicy": "Always"}]);
    let cases: Vec<(Value, &str, &str, String)> = vec![
        // The first container's reason wins (statuses are walked from the last).
        (
            json!({"spec": {"containers": unnamed(2)}, "status": {"phase": "podPhase", "containerStatuses": [
                {"restartCount": 3, "state": {"waiting": {"reason": "ContainerWaitingReason"}}},
                {"restartCount": 3, "state": {"terminated": {"reason": "ContainerTerminatedReason"}}}]}}),
            "0/2",
            "ContainerWaitingReason",
            "6".into(),
        ),
        // Ready without running is not enough.
        (
            json!({"spec": {"containers": unnamed(2)}, "status": {"phase": "podPhase", "containerStatuses": [
                {"ready": true, "restartCount": 3, "state": {"running": {}}},
                {"ready": true, "restartCount": 3}]}}),
            "1/2",
            "podPhase",
            "6".into(),
        ),
        // Completed plus running without the Ready condition.
        (
            json!({"spec": {"containers": unnamed(2)}, "status": {"phase": "Running", "containerStatuses": [
                {"ready": true, "restartCount": 3, "state": {"terminated": {"reason": "Completed", "exitCode": 0}}},
                {"ready": true, "restartCount": 3, "state": {"running": {}}}]}}),
            "1/2",
            "NotReady",
            "6".into(),
        ),
        // Two init containers, one completed with restarts, one restarting.
        (
            json!({"spec": {"initContainers": unnamed(2), "containers": unnamed(1)}, "status": {"phase": "podPhase",
                "initContainerStatuses": [
                    {"restartCount": 2, "state": {"terminated": {}}, "lastState": {"terminated": {"finishedAt": ago(120)}}},
                    {"restartCount": 3, "state": {"running": {}}, "lastState": {"terminated": {"finishedAt": ago(10)}}}],
                "containerStatuses": [{"state": {"waiting": {}}}]}}),
            "0/1",
            "Init:1/2",
            "5 (10s ago)".into(),
        ),
        // Initialized: init container restarts no longer count.
        (
            json!({"spec": {"initContainers": unnamed(1), "containers": unnamed(1)}, "status": {"phase": "Running",
                "initContainerStatuses": [
                    {"restartCount": 2, "state": {"terminated": {}}, "lastState": {"terminated": {"finishedAt": ago(120)}}}],
                "containerStatuses": [
                    {"restartCount": 4, "state": {"running": {}}, "lastState": {"terminated": {"finishedAt": ago(20)}}}]}}),
            "0/1",
            "Running",
            "4 (20s ago)".into(),
        ),
        // The latest restart of all containers.
        (
            json!({"spec": {"containers": unnamed(2)}, "status": {"phase": "Running", "containerStatuses": [
                {"ready": true, "restartCount": 6, "state": {"running": {}}, "lastState": {"terminated": {"finishedAt": ago(5 * 86400)}}},
                {"ready": true, "restartCount": 3, "state": {"running": {}}, "lastState": {"terminated": {"finishedAt": ago(20 * 86400)}}}]}}),
            "2/2",
            "Running",
            "9 (5d ago)".into(),
        ),
        // Pending and being deleted.
        (
            json!({"metadata": {"deletionTimestamp": ago(1)}, "spec": {"containers": unnamed(1)}, "status": {"phase": "Pending"}}),
            "0/1",
            "Terminating",
            "0".into(),
        ),
        // Succeeded and being deleted stays Completed.
        (
            json!({"metadata": {"deletionTimestamp": ago(1)}, "spec": {"containers": unnamed(1)}, "status": {"phase": "Succeeded",
                "containerStatuses": [{"state": {"terminated": {"reason": "Completed", "exitCode": 0}}}]}}),
            "0/1",
            "Completed",
            "0".into(),
        ),
        // Sidecars: the first running but not started.
        (
            json!({"spec": {"initContainers": sidecars, "containers": unnamed(1)}, "status": {"phase": "Pending",
                "initContainerStatuses": [
                    {"name": "r1", "restartCount": 3, "started": false, "state": {"running": {}},
                     "lastState": {"terminated": {"finishedAt": ago(10)}}},
                    {"name": "r2", "started": false, "state": {"waiting": {}}}],
                "containerStatuses": [{"state": {"waiting": {}}}],
                "conditions": [{"type": "Initialized", "status": "False"}]}}),
            "0/3",
            "Init:0/2",
            "3 (10s ago)".into(),
        ),
        // Sidecars started, the main container running.
        (
            json!({"spec": {"initContainers": sidecars, "containers": unnamed(1)}, "status": {"phase": "Running",
                "initContainerStatuses": [
                    {"name": "r1", "restartCount": 3, "started": true, "state": {"running": {}},
                     "lastState": {"terminated": {"finishedAt": ago(10)}}},
                    {"name": "r2", "started": true, "state": {"running": {}}}],
                "containerStatuses": [{"ready": true, "restartCount": 4, "state": {"running": {}},
                    "lastState": {"terminated": {"finishedAt": ago(20)}}}],
                "conditions": [{"type": "Initialized", "status": "True"}]}}),
            "1/3",
            "Running",
            "7 (10s ago)".into(),
        ),
        // Sidecars failed, the pod completed.
        (
            json!({"spec": {"initContainers": sidecars, "containers": unnamed(1)}, "status": {"phase": "Succeeded",
                "initContainerStatuses": [
                    {"name": "r1", "restartCount": 3, "started": false, "state": {"terminated": {"reason": "Error", "exitCode": 137}},
                     "lastState": {"terminated": {"finishedAt": ago(10)}}},
                    {"name": "r2", "started": false, "state": {"terminated": {"reason": "Error", "exitCode": 137}}}],
                "containerStatuses": [{"restartCount": 4, "state": {"terminated": {"reason": "Completed", "exitCode": 0}},
                    "lastState": {"terminated": {"finishedAt": ago(20)}}}],
                "conditions": [{"type": "Initialized", "status": "True"}]}}),
            "0/3",
            "Completed",
            "7 (10s ago)".into(),
        ),
        // Statuses for containers the spec does not have.
        (
            json!({"spec": {"initContainers": [{"name": "init1"}, {"name": "sidecar1", "restartPolicy": "Always"}],
                            "containers": [{"name": "container1"}]},
                   "status": {"phase": "Running",
                       "initContainerStatuses": [{"name": "initinvalid"}, {"name": "init1"}, {"name": "sidecar1"}],
                       "containerStatuses": [{"name": "containerinvalid"}, {"name": "container1"}]}}),
            "0/2",
            "Init:0/2",
            "0".into(),
        ),
    ];
    for (i, (pod, ready, status, restarts)) in cases.into_iter().enumerate() {
        let c = cells("", "pods", &pod);
        assert_eq!(
            (c[1].as_str().unwrap(), c[2].as_str().unwrap(), c[3].as_str().unwrap()),
            (ready, status, restarts.as_str()),
            "case {i}"
        );
    }
}

#[test]
fn endpointslices_ipaddresses_and_servicecidrs() {
    assert_eq!(
        names("discovery.k8s.io", "endpointslices"),
        ["Name", "AddressType", "Ports", "Endpoints", "Age"]
    );
    let slice = json!({"metadata": {"name": "web-abc12"}, "addressType": "IPv4",
        "ports": [{"name": "http", "port": 80}, {"name": "named"}, {}],
        "endpoints": [{"addresses": ["10.0.0.1"]}, {"addresses": ["10.0.0.2", "10.0.0.3"]}, {"addresses": ["10.0.0.4"]}]});
    let c = cells("discovery.k8s.io", "endpointslices", &slice);
    assert_eq!(c[1], "IPv4");
    assert_eq!(c[2], "80,named,*");
    assert_eq!(c[3], "10.0.0.1,10.0.0.2,10.0.0.3 + 1 more...");
    let empty = json!({"metadata": {"name": "e"}, "addressType": "IPv4", "endpoints": null});
    let c = cells("discovery.k8s.io", "endpointslices", &empty);
    assert_eq!((c[2].as_str(), c[3].as_str()), (Some("<unset>"), Some("<unset>")));

    assert_eq!(names("networking.k8s.io", "ipaddresses"), ["Name", "ParentRef"]);
    let ip = json!({"metadata": {"name": "10.96.0.1"},
        "spec": {"parentRef": {"group": "", "resource": "services", "namespace": "default", "name": "kubernetes"}}});
    assert_eq!(
        cells("networking.k8s.io", "ipaddresses", &ip)[1],
        "services/default/kubernetes"
    );
    assert_eq!(names("networking.k8s.io", "servicecidrs"), ["Name", "CIDRs", "Age"]);
    let cidr = json!({"metadata": {"name": "kubernetes"}, "spec": {"cidrs": ["10.96.0.0/12"]}});
    assert_eq!(cells("networking.k8s.io", "servicecidrs", &cidr)[1], "10.96.0.0/12");
}

#[test]
fn roles_print_as_the_default_table() {
    for plural in ["roles", "clusterroles"] {
        assert_eq!(names("rbac.authorization.k8s.io", plural), ["Name", "Created At"]);
        let defs = column_definitions(res("rbac.authorization.k8s.io", plural));
        assert_eq!(defs[0]["format"], "name");
        assert_eq!(defs[1]["type"], "date");
        assert_eq!(defs[1]["description"], AGE_DESC);
        assert_eq!(defs[1]["priority"], 0);
        let role = json!({"metadata": {"name": "pod-reader", "creationTimestamp": "2024-05-01T11:00:00Z"},
                          "rules": [{"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}]});
        assert_eq!(
            cells("rbac.authorization.k8s.io", plural, &role),
            vec![json!("pod-reader"), json!("2024-05-01T11:00:00Z")]
        );
        // Fractions and offsets are dropped to whole seconds in UTC; no time is Go's zero time.
        let odd = json!({"metadata": {"name": "x", "creationTimestamp": "2024-05-01T13:30:05.25+02:00"}});
        assert_eq!(
            cells("rbac.authorization.k8s.io", plural, &odd)[1],
            "2024-05-01T11:30:05Z"
        );
        let none = json!({"metadata": {"name": "x"}});
        assert_eq!(
            cells("rbac.authorization.k8s.io", plural, &none)[1],
            "0001-01-01T00:00:00Z"
        );
    }
}

#[test]
fn role_binding_rows() {
    for (plural, word) in [
        ("rolebindings", "roleBinding"),
        ("clusterrolebindings", "clusterRoleBinding"),
    ] {
        assert_eq!(
            names("rbac.authorization.k8s.io", plural),
            ["Name", "Role", "Age", "Users", "Groups", "ServiceAccounts"]
        );
        let defs = column_definitions(res("rbac.authorization.k8s.io", plural));
        let priorities: Vec<i64> = defs.iter().map(|d| d["priority"].as_i64().unwrap()).collect();
        assert_eq!(priorities, [0, 0, 0, 1, 1, 1]);
        assert_eq!(defs[3]["description"], format!("Users in the {word}"));
        assert_eq!(defs[4]["description"], format!("Groups in the {word}"));
        assert_eq!(defs[5]["description"], format!("ServiceAccounts in the {word}"));
        assert!(
            defs[1]["description"]
                .as_str()
                .unwrap()
                .ends_with("If the RoleRef cannot be resolved, the Authorizer must return an error.")
        );

        let b = json!({
            "metadata": {"name": "readers", "creationTimestamp": "2024-05-01T11:50:00Z"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
            "subjects": [
                {"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "alice"},
                {"kind": "ServiceAccount", "name": "bot", "namespace": "ci"},
                {"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": "devs"},
                {"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "bob"},
                {"kind": "ServiceAccount", "name": "default"},
                {"kind": "Robot", "name": "r2"}
            ]
        });
        assert_eq!(
            cells("rbac.authorization.k8s.io", plural, &b),
            vec![
                json!("readers"),
                json!("ClusterRole/view"),
                json!("10m"),
                json!("alice, bob"),
                json!("devs"),
                json!("ci/bot, /default"),
            ]
        );
        let bare = json!({"metadata": {"name": "b"}});
        assert_eq!(
            cells("rbac.authorization.k8s.io", plural, &bare),
            vec![
                json!("b"),
                json!("/"),
                json!("<unknown>"),
                json!(""),
                json!(""),
                json!("")
            ]
        );
    }
    assert!(
        column_definitions(res("rbac.authorization.k8s.io", "rolebindings"))[1]["description"]
            .as_str()
            .unwrap()
            .starts_with("RoleRef can reference a Role in the current namespace or a ClusterRole")
    );
    assert!(
        column_definitions(res("rbac.authorization.k8s.io", "clusterrolebindings"))[1]["description"]
            .as_str()
            .unwrap()
            .starts_with("RoleRef can only reference a ClusterRole in the global namespace.")
    );
}

#[test]
fn resource_quota_and_limit_range_rows() {
    let q = json!({"metadata": {"name": "q", "creationTimestamp": "2024-04-01T12:00:00Z"},
        "status": {"hard": {"pods": "2", "limits.memory": "1Gi", "requests.cpu": "1"},
                   "used": {"pods": "1", "requests.cpu": "500m"}}});
    let c = cells("", "resourcequotas", &q);
    assert_eq!(c[2], "pods: 1/2, requests.cpu: 500m/1");
    assert_eq!(c[3], "limits.memory: 0/1Gi");
    let lr = json!({"metadata": {"name": "lr", "creationTimestamp": "2024-04-01T12:00:00Z"}});
    assert_eq!(
        cells("", "limitranges", &lr),
        vec![json!("lr"), json!("2024-04-01T12:00:00Z")]
    );
}
