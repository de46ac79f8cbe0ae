//! Printers for the core group: namespaces, nodes, pods, events, secrets, config maps,
//! services, endpoints, service accounts, persistent volumes and claims.

use std::collections::BTreeSet;

use jiff::Timestamp;
use serde_json::{Value, json};

use super::format::{
    access_modes, age, array_at, bool_at, format_labels, int_at, is_set, map_len, name, quantity, since, str_at,
    timestamp,
};
use super::{AGE, Column, NAME};
use crate::volume::class_of;

// --- namespaces ---------------------------------------------------------------------------

pub(crate) const NAMESPACE_COLUMNS: &[Column] = &[
    NAME,
    Column::new("Status", "string", "The status of the namespace"),
    AGE,
];

pub(crate) fn namespace(obj: &Value, now: Timestamp) -> Vec<Value> {
    vec![
        json!(name(obj)),
        json!(str_at(obj, "/status/phase")),
        json!(age(obj, now)),
    ]
}

// --- nodes ----------------------------------------------------------------------------------

pub(crate) const NODE_COLUMNS: &[Column] = &[
    NAME,
    Column::new("Status", "string", "The status of the node"),
    Column::new("Roles", "string", "The roles of the node"),
    AGE,
    Column::new("Version", "string", "Kubelet Version reported by the node."),
    Column::wide("Internal-IP", "string", "List of addresses reachable to the node."),
    Column::wide("External-IP", "string", "List of addresses reachable to the node."),
    Column::wide(
        "OS-Image",
        "string",
        "OS Image reported by the node from /etc/os-release (e.g. Debian GNU/Linux 7 (wheezy)).",
    ),
    Column::wide(
        "Kernel-Version",
        "string",
        "Kernel Version reported by the node from 'uname -r' (e.g. 3.16.0-0.bpo.4-amd64).",
    ),
    Column::wide(
        "Container-Runtime",
        "string",
        "ContainerRuntime Version reported by the node through runtime remote API (e.g. containerd://1.4.2).",
    ),
];

const NODE_ROLE_PREFIX: &str = "node-role.kubernetes.io/";
const NODE_LABEL_ROLE: &str = "kubernetes.io/role";

pub(crate) fn node(obj: &Value, now: Timestamp) -> Vec<Value> {
    let mut status: Vec<String> = Vec::new();
    // Only the Ready condition shows; the last one of that type wins, as upstream's map does.
    if let Some(ready) = array_at(obj, "/status/conditions")
        .iter()
        .rev()
        .find(|c| str_at(c, "/type") == "Ready")
    {
        if str_at(ready, "/status") == "True" {
            status.push("Ready".to_string());
        } else {
            status.push("NotReady".to_string());
        }
    }
    if status.is_empty() {
        status.push("Unknown".to_string());
    }
    if bool_at(obj, "/spec/unschedulable") {
        status.push("SchedulingDisabled".to_string());
    }

    let mut roles = BTreeSet::new();
    if let Some(labels) = obj.pointer("/metadata/labels").and_then(Value::as_object) {
        for (k, v) in labels {
            if let Some(role) = k.strip_prefix(NODE_ROLE_PREFIX) {
                if !role.is_empty() {
                    roles.insert(role.to_string());
                }
            } else if k == NODE_LABEL_ROLE
                && let Some(v) = v.as_str().filter(|v| !v.is_empty())
            {
                roles.insert(v.to_string());
            }
        }
    }
    let roles = if roles.is_empty() {
        "<none>".to_string()
    } else {
        roles.into_iter().collect::<Vec<_>>().join(",")
    };

    let address = |ty: &str| {
        array_at(obj, "/status/addresses")
            .iter()
            .find(|a| str_at(a, "/type") == ty)
            .map(|a| str_at(a, "/address").to_string())
            .unwrap_or_else(|| "<none>".to_string())
    };
    let info = |field: &str| {
        let v = str_at(obj, &format!("/status/nodeInfo/{field}"));
        if v.is_empty() {
            "<unknown>".to_string()
        } else {
            v.to_string()
        }
    };
    vec![
        json!(name(obj)),
        json!(status.join(",")),
        json!(roles),
        json!(age(obj, now)),
        json!(str_at(obj, "/status/nodeInfo/kubeletVersion")),
        json!(address("InternalIP")),
        json!(address("ExternalIP")),
        json!(info("osImage")),
        json!(info("kernelVersion")),
        json!(info("containerRuntimeVersion")),
    ]
}

// --- pods -----------------------------------------------------------------------------------

pub(crate) const POD_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "Ready",
        "string",
        "The aggregate readiness state of this pod for accepting traffic.",
    ),
    Column::new(
        "Status",
        "string",
        "The aggregate status of the containers in this pod.",
    ),
    Column::new(
        "Restarts",
        "string",
        "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted.",
    ),
    AGE,
    Column::wide(
        "IP",
        "string",
        "podIP address allocated to the pod. Routable at least within the cluster. Empty if not yet allocated.",
    ),
    Column::wide(
        "Node",
        "string",
        "NodeName indicates in which node this pod is scheduled. If empty, this pod is a candidate for scheduling by the scheduler defined in schedulerName.",
    ),
    Column::wide(
        "Nominated Node",
        "string",
        "nominatedNodeName is set only when this pod preempts other pods on the node, but it cannot be scheduled right away as preemption victims receive their graceful termination periods.",
    ),
    Column::wide(
        "Readiness Gates",
        "string",
        "If specified, all readiness gates will be evaluated for pod readiness. A pod is ready when all its containers are ready AND all conditions specified in the readiness gates have status equal to \"True\" More info: https://git.k8s.io/enhancements/keps/sig-network/580-pod-readiness-gates",
    ),
];

/// The reason a pod lost to an unreachable node carries.
const NODE_UNREACHABLE_POD_REASON: &str = "NodeLost";

fn is_restartable_init_container(spec_init: &[Value], name: &str) -> bool {
    spec_init
        .iter()
        .any(|c| str_at(c, "/name") == name && str_at(c, "/restartPolicy") == "Always")
}

fn has_condition_true(obj: &Value, ty: &str) -> bool {
    array_at(obj, "/status/conditions")
        .iter()
        .any(|c| str_at(c, "/type") == ty && str_at(c, "/status") == "True")
}

/// The first condition of this type decides (upstream's `isPodInitializedConditionTrue`).
fn first_condition_true(obj: &Value, ty: &str) -> bool {
    array_at(obj, "/status/conditions")
        .iter()
        .find(|c| str_at(c, "/type") == ty)
        .is_some_and(|c| str_at(c, "/status") == "True")
}

fn last_termination(status: &Value) -> Option<Option<Timestamp>> {
    status
        .pointer("/lastState/terminated")
        .filter(|t| !t.is_null())
        .map(|t| timestamp(t.get("finishedAt")))
}

fn later(current: Option<Timestamp>, candidate: Option<Timestamp>) -> Option<Timestamp> {
    match (current, candidate) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

fn terminated_reason(term: &Value, prefix: &str) -> String {
    let reason = str_at(term, "/reason");
    if !reason.is_empty() {
        return format!("{prefix}{reason}");
    }
    let signal = int_at(term, "/signal");
    if signal != 0 {
        format!("{prefix}Signal:{signal}")
    } else {
        format!("{prefix}ExitCode:{}", int_at(term, "/exitCode"))
    }
}

pub(crate) fn pod(obj: &Value, now: Timestamp) -> Vec<Value> {
    let spec_init = array_at(obj, "/spec/initContainers");
    let mut restarts: i64 = 0;
    let mut restartable_init_restarts: i64 = 0;
    let mut total_containers = array_at(obj, "/spec/containers").len();
    let mut ready_containers = 0usize;
    let mut last_restart: Option<Timestamp> = None;
    let mut last_restartable_init_restart: Option<Timestamp> = None;

    let phase = str_at(obj, "/status/phase");
    let mut reason = phase.to_string();
    let status_reason = str_at(obj, "/status/reason");
    if !status_reason.is_empty() {
        reason = status_reason.to_string();
    }
    for c in array_at(obj, "/status/conditions") {
        if str_at(c, "/type") == "PodScheduled" && str_at(c, "/reason") == "SchedulingGated" {
            reason = "SchedulingGated".to_string();
        }
    }

    total_containers += spec_init
        .iter()
        .filter(|c| str_at(c, "/restartPolicy") == "Always")
        .count();

    let mut initializing = false;
    for (i, container) in array_at(obj, "/status/initContainerStatuses").iter().enumerate() {
        let cname = str_at(container, "/name");
        let restartable = is_restartable_init_container(spec_init, cname);
        let count = int_at(container, "/restartCount");
        restarts += count;
        if let Some(finished) = last_termination(container) {
            last_restart = later(last_restart, finished);
        }
        if restartable {
            restartable_init_restarts += count;
            if let Some(finished) = last_termination(container) {
                last_restartable_init_restart = later(last_restartable_init_restart, finished);
            }
        }
        let terminated = container.pointer("/state/terminated").filter(|t| !t.is_null());
        let waiting_reason = str_at(container, "/state/waiting/reason");
        if terminated.is_some_and(|t| int_at(t, "/exitCode") == 0) {
            continue;
        }
        if restartable && bool_at(container, "/started") {
            if bool_at(container, "/ready") {
                ready_containers += 1;
            }
            continue;
        }
        if let Some(t) = terminated {
            reason = terminated_reason(t, "Init:");
        } else if !waiting_reason.is_empty() && waiting_reason != "PodInitializing" {
            reason = format!("Init:{waiting_reason}");
        } else {
            reason = format!("Init:{i}/{}", spec_init.len());
        }
        initializing = true;
        break;
    }

    if !initializing || first_condition_true(obj, "Initialized") {
        restarts = restartable_init_restarts;
        last_restart = last_restartable_init_restart;
        let mut has_running = false;
        for container in array_at(obj, "/status/containerStatuses").iter().rev() {
            restarts += int_at(container, "/restartCount");
            if let Some(finished) = last_termination(container) {
                last_restart = later(last_restart, finished);
            }
            let waiting_reason = str_at(container, "/state/waiting/reason");
            let terminated = container.pointer("/state/terminated").filter(|t| !t.is_null());
            if !waiting_reason.is_empty() {
                reason = waiting_reason.to_string();
            } else if let Some(t) = terminated {
                reason = terminated_reason(t, "");
            } else if bool_at(container, "/ready") && is_set(container, "/state/running") {
                has_running = true;
                ready_containers += 1;
            }
        }
        // A completed pod with a container still running reads as Running (or NotReady).
        if reason == "Completed" && has_running {
            reason = if has_condition_true(obj, "Ready") {
                "Running".to_string()
            } else {
                "NotReady".to_string()
            };
        }
    }

    let deleting = is_set(obj, "/metadata/deletionTimestamp");
    if deleting && status_reason == NODE_UNREACHABLE_POD_REASON {
        reason = "Unknown".to_string();
    } else if deleting && phase != "Succeeded" && phase != "Failed" {
        reason = "Terminating".to_string();
    }

    let restarts_cell = match last_restart {
        Some(t) if restarts != 0 => format!("{restarts} ({} ago)", since(Some(t), now)),
        _ => restarts.to_string(),
    };

    let or_none = |s: &str| {
        if s.is_empty() {
            "<none>".to_string()
        } else {
            s.to_string()
        }
    };
    let mut pod_ip = str_at(obj, "/status/podIPs/0/ip");
    if pod_ip.is_empty() {
        pod_ip = str_at(obj, "/status/podIP");
    }
    let gates = array_at(obj, "/spec/readinessGates");
    let readiness_gates = if gates.is_empty() {
        "<none>".to_string()
    } else {
        let conditions = array_at(obj, "/status/conditions");
        let true_count = gates
            .iter()
            .filter(|g| {
                let ty = str_at(g, "/conditionType");
                conditions
                    .iter()
                    .find(|c| str_at(c, "/type") == ty)
                    .is_some_and(|c| str_at(c, "/status") == "True")
            })
            .count();
        format!("{true_count}/{}", gates.len())
    };

    vec![
        json!(name(obj)),
        json!(format!("{ready_containers}/{total_containers}")),
        json!(reason),
        json!(restarts_cell),
        json!(age(obj, now)),
        json!(or_none(pod_ip)),
        json!(or_none(str_at(obj, "/spec/nodeName"))),
        json!(or_none(str_at(obj, "/status/nominatedNodeName"))),
        json!(readiness_gates),
    ]
}

/// Upstream marks rows of finished pods as `Completed` (kubectl can hide them).
pub(crate) fn pod_row_conditions(obj: &Value) -> Option<Value> {
    let (reason, message) = match str_at(obj, "/status/phase") {
        "Succeeded" => ("Succeeded", "The pod has completed successfully."),
        "Failed" => ("Failed", "The pod failed."),
        _ => return None,
    };
    Some(json!([{"type": "Completed", "status": "True", "reason": reason, "message": message}]))
}

// --- events ---------------------------------------------------------------------------------

pub(crate) const EVENT_COLUMNS: &[Column] = &[
    Column::new(
        "Last Seen",
        "string",
        "The time at which the most recent occurrence of this event was recorded.",
    ),
    Column::new(
        "Type",
        "string",
        "Type of this event (Normal, Warning), new types could be added in the future",
    ),
    Column::new(
        "Reason",
        "string",
        "This should be a short, machine understandable string that gives the reason for the transition into the object's current status.",
    ),
    Column::new("Object", "string", "The object that this event is about."),
    Column::wide(
        "Subobject",
        "string",
        "If referring to a piece of an object instead of an entire object, this string should contain a valid JSON/Go field access statement, such as desiredState.manifest.containers[2].",
    ),
    Column::wide(
        "Source",
        "string",
        "The component reporting this event. Should be a short machine understandable string.",
    ),
    Column::new(
        "Message",
        "string",
        "A human-readable description of the status of this operation.",
    ),
    Column::wide(
        "First Seen",
        "string",
        "The time at which the event was first recorded. (Time of server receipt is in TypeMeta.)",
    ),
    Column::wide("Count", "string", "The number of times this event has occurred."),
    Column {
        name: "Name",
        ty: "string",
        format: "name",
        description: super::NAME_DESC,
        priority: 1,
    },
];

/// Reads a core/v1 field, or its events.k8s.io/v1 counterpart.
fn event_field<'a>(obj: &'a Value, core: &str, new: &str) -> Option<&'a Value> {
    obj.pointer(core)
        .filter(|v| !v.is_null())
        .or_else(|| obj.pointer(new).filter(|v| !v.is_null()))
}

fn event_str<'a>(obj: &'a Value, core: &str, new: &str) -> &'a str {
    event_field(obj, core, new).and_then(Value::as_str).unwrap_or_default()
}

pub(crate) fn event(obj: &Value, now: Timestamp) -> Vec<Value> {
    let first_ts = timestamp(event_field(obj, "/firstTimestamp", "/deprecatedFirstTimestamp"));
    let first = match first_ts {
        Some(t) => since(Some(t), now),
        None => since(timestamp(obj.get("eventTime")), now),
    };
    let mut last = match timestamp(event_field(obj, "/lastTimestamp", "/deprecatedLastTimestamp")) {
        Some(t) => since(Some(t), now),
        None => first.clone(),
    };
    let mut count = event_field(obj, "/count", "/deprecatedCount")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    if let Some(series) = obj.get("series").filter(|s| !s.is_null()) {
        last = since(timestamp(series.get("lastObservedTime")), now);
        count = int_at(series, "/count");
    } else if count == 0 {
        count = 1;
    }

    let kind = event_str(obj, "/involvedObject/kind", "/regarding/kind").to_lowercase();
    let involved_name = event_str(obj, "/involvedObject/name", "/regarding/name");
    let target = if involved_name.is_empty() {
        kind
    } else {
        format!("{kind}/{involved_name}")
    };

    let component = {
        let c = event_str(obj, "/source/component", "/deprecatedSource/component");
        if c.is_empty() {
            str_at(obj, "/reportingController")
        } else {
            c
        }
    };
    let instance = {
        let h = event_str(obj, "/source/host", "/deprecatedSource/host");
        if h.is_empty() {
            str_at(obj, "/reportingInstance")
        } else {
            h
        }
    };
    let source = if instance.is_empty() {
        component.to_string()
    } else {
        format!("{component}, {instance}")
    };
    let message = event_str(obj, "/message", "/note").trim();

    vec![
        json!(last),
        json!(str_at(obj, "/type")),
        json!(str_at(obj, "/reason")),
        json!(target),
        json!(event_str(obj, "/involvedObject/fieldPath", "/regarding/fieldPath")),
        json!(source),
        json!(message),
        json!(first),
        json!(count),
        json!(name(obj)),
    ]
}

// --- secrets, config maps, service accounts -------------------------------------------------

pub(crate) const SECRET_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "Type",
        "string",
        "Used to facilitate programmatic handling of secret data. More info: https://kubernetes.io/docs/concepts/configuration/secret/#secret-types",
    ),
    Column::new(
        "Data",
        "string",
        "Data contains the secret data. Each key must consist of alphanumeric characters, '-', '_' or '.'. The serialized form of the secret data is a base64 encoded string, representing the arbitrary (possibly non-string) data value here. Described in https://tools.ietf.org/html/rfc4648#section-4",
    ),
    AGE,
];

pub(crate) fn secret(obj: &Value, now: Timestamp) -> Vec<Value> {
    vec![
        json!(name(obj)),
        json!(str_at(obj, "/type")),
        json!(map_len(obj, "/data")),
        json!(age(obj, now)),
    ]
}

pub(crate) const COMPONENTSTATUS_COLUMNS: &[Column] = &[
    NAME,
    Column::new("Status", "string", "Status of the component conditions"),
    Column::new("Message", "string", "Message of the component conditions"),
    Column::new("Error", "string", "Error of the component conditions"),
];

/// Upstream's `printComponentStatus`: the Healthy condition's status, message and error;
/// `Unknown` when there is none.
pub(crate) fn componentstatus(obj: &Value) -> Vec<Value> {
    let healthy = obj
        .pointer("/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Healthy"));
    let (status, message, error) = match healthy {
        Some(c) => (
            if c["status"] == "True" { "Healthy" } else { "Unhealthy" },
            c["message"].as_str().unwrap_or(""),
            c["error"].as_str().unwrap_or(""),
        ),
        None => ("Unknown", "", ""),
    };
    vec![json!(name(obj)), json!(status), json!(message), json!(error)]
}

pub(crate) const CONFIGMAP_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "Data",
        "string",
        "Data contains the configuration data. Each key must consist of alphanumeric characters, '-', '_' or '.'. Values with non-UTF-8 byte sequences must use the BinaryData field. The keys stored in Data must not overlap with the keys in the BinaryData field, this is enforced during validation process.",
    ),
    AGE,
];

pub(crate) fn configmap(obj: &Value, now: Timestamp) -> Vec<Value> {
    let data = map_len(obj, "/data") + map_len(obj, "/binaryData");
    vec![json!(name(obj)), json!(data), json!(age(obj, now))]
}

pub(crate) const SERVICEACCOUNT_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "Secrets",
        "string",
        "Secrets is a list of the secrets in the same namespace that pods running using this ServiceAccount are allowed to use.",
    ),
    AGE,
];

pub(crate) fn serviceaccount(obj: &Value, now: Timestamp) -> Vec<Value> {
    vec![
        json!(name(obj)),
        json!(array_at(obj, "/secrets").len()),
        json!(age(obj, now)),
    ]
}

// --- services and endpoints -----------------------------------------------------------------

pub(crate) const SERVICE_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "Type",
        "string",
        "type determines how the Service is exposed. Defaults to ClusterIP. Valid options are ExternalName, ClusterIP, NodePort, and LoadBalancer.",
    ),
    Column::new(
        "Cluster-IP",
        "string",
        "clusterIP is the IP address of the service and is usually assigned randomly.",
    ),
    Column::new(
        "External-IP",
        "string",
        "externalIPs is a list of IP addresses for which nodes in the cluster will also accept traffic for this service.",
    ),
    Column::new(
        "Port(s)",
        "string",
        "The list of ports that are exposed by this service.",
    ),
    AGE,
    Column::wide(
        "Selector",
        "string",
        "Route service traffic to pods with label keys and values matching this selector.",
    ),
];

/// Upstream's `loadBalancerStatusStringer` as the server calls it (wide, so never clipped).
pub(crate) fn load_balancer_ips(obj: &Value) -> String {
    let mut set = BTreeSet::new();
    for ing in array_at(obj, "/status/loadBalancer/ingress") {
        let ip = str_at(ing, "/ip");
        let host = str_at(ing, "/hostname");
        if !ip.is_empty() {
            set.insert(ip.to_string());
        } else if !host.is_empty() {
            set.insert(host.to_string());
        }
    }
    set.into_iter().collect::<Vec<_>>().join(",")
}

fn service_external_ip(obj: &Value, ty: &str) -> String {
    let external: Vec<&str> = array_at(obj, "/spec/externalIPs")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    match ty {
        "ClusterIP" | "NodePort" => {
            if external.is_empty() {
                "<none>".to_string()
            } else {
                external.join(",")
            }
        }
        "LoadBalancer" => {
            let lb = load_balancer_ips(obj);
            if !external.is_empty() {
                let mut all: Vec<&str> = if lb.is_empty() {
                    Vec::new()
                } else {
                    lb.split(',').collect()
                };
                all.extend(external);
                return all.join(",");
            }
            if lb.is_empty() { "<pending>".to_string() } else { lb }
        }
        "ExternalName" => str_at(obj, "/spec/externalName").to_string(),
        _ => "<unknown>".to_string(),
    }
}

fn service_ports(obj: &Value) -> String {
    let pieces: Vec<String> = array_at(obj, "/spec/ports")
        .iter()
        .map(|p| {
            let port = int_at(p, "/port");
            let protocol = match str_at(p, "/protocol") {
                "" => "TCP",
                other => other,
            };
            let node_port = int_at(p, "/nodePort");
            if node_port > 0 {
                format!("{port}:{node_port}/{protocol}")
            } else {
                format!("{port}/{protocol}")
            }
        })
        .collect();
    if pieces.is_empty() {
        "<none>".to_string()
    } else {
        pieces.join(",")
    }
}

pub(crate) fn service(obj: &Value, now: Timestamp) -> Vec<Value> {
    let ty = match str_at(obj, "/spec/type") {
        "" => "ClusterIP",
        other => other,
    };
    let mut cluster_ip = str_at(obj, "/spec/clusterIPs/0");
    if cluster_ip.is_empty() {
        cluster_ip = str_at(obj, "/spec/clusterIP");
    }
    if cluster_ip.is_empty() {
        cluster_ip = "<none>";
    }
    vec![
        json!(name(obj)),
        json!(ty),
        json!(cluster_ip),
        json!(service_external_ip(obj, ty)),
        json!(service_ports(obj)),
        json!(age(obj, now)),
        json!(format_labels(obj.pointer("/spec/selector"))),
    ]
}

pub(crate) const ENDPOINTS_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "Endpoints",
        "string",
        "The set of all endpoints is the union of all subsets. Addresses are placed into subsets according to the IPs they share. A single address with multiple ports, some of which are ready and some of which are not (because they come from different containers) will result in the address being displayed in different subsets for the different ports. No address will appear in both Addresses and NotReadyAddresses in the same subset. Sets of addresses and ports that comprise a service.",
    ),
    AGE,
];

fn join_host_port(host: &str, port: i64) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Upstream's `formatEndpoints` for all ports: at most three, then `+ N more...`.
fn format_endpoints(obj: &Value) -> String {
    let subsets = array_at(obj, "/subsets");
    if subsets.is_empty() {
        return "<none>".to_string();
    }
    const MAX: usize = 3;
    let mut list: Vec<String> = Vec::new();
    let mut more = false;
    let mut count = 0usize;
    for ss in subsets {
        let addresses = array_at(ss, "/addresses");
        let ports = array_at(ss, "/ports");
        if ports.is_empty() {
            count += addresses.len();
            for a in addresses {
                if list.len() == MAX {
                    more = true;
                    break;
                }
                list.push(str_at(a, "/ip").to_string());
            }
            continue;
        }
        for p in ports {
            count += addresses.len();
            for a in addresses {
                if list.len() == MAX {
                    more = true;
                    break;
                }
                list.push(join_host_port(str_at(a, "/ip"), int_at(p, "/port")));
            }
        }
    }
    let ret = list.join(",");
    if more {
        format!("{ret} + {} more...", count - MAX)
    } else {
        ret
    }
}

pub(crate) fn endpoints(obj: &Value, now: Timestamp) -> Vec<Value> {
    vec![json!(name(obj)), json!(format_endpoints(obj)), json!(age(obj, now))]
}

// --- persistent volumes and claims ----------------------------------------------------------

pub(crate) const PV_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "Capacity",
        "string",
        "capacity is the description of the persistent volume's resources and capacity. More info: https://kubernetes.io/docs/concepts/storage/persistent-volumes#capacity",
    ),
    Column::new(
        "Access Modes",
        "string",
        "accessModes contains all ways the volume can be mounted. More info: https://kubernetes.io/docs/concepts/storage/persistent-volumes#access-modes",
    ),
    Column::new(
        "Reclaim Policy",
        "string",
        "persistentVolumeReclaimPolicy defines what happens to a persistent volume when released from its claim. Valid options are Retain (default for manually created PersistentVolumes), Delete (default for dynamically provisioned PersistentVolumes), and Recycle (deprecated). Recycle must be supported by the volume plugin underlying this PersistentVolume. More info: https://kubernetes.io/docs/concepts/storage/persistent-volumes#reclaiming",
    ),
    Column::new(
        "Status",
        "string",
        "phase indicates if a volume is available, bound to a claim, or released by a claim. More info: https://kubernetes.io/docs/concepts/storage/persistent-volumes#phase",
    ),
    Column::new(
        "Claim",
        "string",
        "claimRef is part of a bi-directional binding between PersistentVolume and PersistentVolumeClaim. Expected to be non-nil when bound. claim.VolumeName is the authoritative bind between PV and PVC. More info: https://kubernetes.io/docs/concepts/storage/persistent-volumes#binding",
    ),
    Column::new("StorageClass", "string", "StorageClass of the pv"),
    Column::new("VolumeAttributesClass", "string", "VolumeAttributesClass of the pv"),
    Column::new(
        "Reason",
        "string",
        "reason is a brief CamelCase string that describes any failure and is meant for machine parsing and tidy display in the CLI.",
    ),
    AGE,
    Column::wide(
        "VolumeMode",
        "string",
        "volumeMode defines if a volume is intended to be used with a formatted filesystem or to remain in raw block state. Value of Filesystem is implied when not included in spec.",
    ),
];

fn unset_or(obj: &Value, pointer: &str) -> String {
    match obj.pointer(pointer).and_then(Value::as_str) {
        Some(v) => v.to_string(),
        None => "<unset>".to_string(),
    }
}

pub(crate) fn persistentvolume(obj: &Value, now: Timestamp) -> Vec<Value> {
    let claim = match obj.pointer("/spec/claimRef").filter(|c| !c.is_null()) {
        Some(c) => format!("{}/{}", str_at(c, "/namespace"), str_at(c, "/name")),
        None => String::new(),
    };
    let phase = if is_set(obj, "/metadata/deletionTimestamp") {
        "Terminating"
    } else {
        str_at(obj, "/status/phase")
    };
    vec![
        json!(name(obj)),
        json!(quantity(obj.pointer("/spec/capacity/storage"))),
        json!(access_modes(array_at(obj, "/spec/accessModes"))),
        json!(str_at(obj, "/spec/persistentVolumeReclaimPolicy")),
        json!(phase),
        json!(claim),
        json!(class_of(obj)),
        json!(unset_or(obj, "/spec/volumeAttributesClassName")),
        json!(str_at(obj, "/status/reason")),
        json!(age(obj, now)),
        json!(unset_or(obj, "/spec/volumeMode")),
    ]
}

pub(crate) const PVC_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "Status",
        "string",
        "phase represents the current phase of PersistentVolumeClaim.",
    ),
    Column::new(
        "Volume",
        "string",
        "volumeName is the binding reference to the PersistentVolume backing this claim.",
    ),
    Column::new(
        "Capacity",
        "string",
        "capacity represents the actual resources of the underlying volume.",
    ),
    Column::new(
        "Access Modes",
        "string",
        "accessModes contains the actual access modes the volume backing the PVC has. More info: https://kubernetes.io/docs/concepts/storage/persistent-volumes#access-modes-1",
    ),
    Column::new("StorageClass", "string", "StorageClass of the pvc"),
    Column::new("VolumeAttributesClass", "string", "VolumeAttributesClass of the pvc"),
    AGE,
    Column::wide(
        "VolumeMode",
        "string",
        "volumeMode defines what type of volume is required by the claim. Value of Filesystem is implied when not included in claim spec.",
    ),
];

pub(crate) fn persistentvolumeclaim(obj: &Value, now: Timestamp) -> Vec<Value> {
    let phase = if is_set(obj, "/metadata/deletionTimestamp") {
        "Terminating"
    } else {
        str_at(obj, "/status/phase")
    };
    let volume = str_at(obj, "/spec/volumeName");
    let (capacity, modes) = if volume.is_empty() {
        (String::new(), String::new())
    } else {
        (
            quantity(obj.pointer("/status/capacity/storage")),
            access_modes(array_at(obj, "/status/accessModes")),
        )
    };
    vec![
        json!(name(obj)),
        json!(phase),
        json!(volume),
        json!(capacity),
        json!(modes),
        json!(class_of(obj)),
        json!(unset_or(obj, "/spec/volumeAttributesClassName")),
        json!(age(obj, now)),
        json!(unset_or(obj, "/spec/volumeMode")),
    ]
}

// --- resource quotas and limit ranges ----------------------------------------------------------

pub(crate) const RESOURCEQUOTA_COLUMNS: &[Column] = &[
    NAME,
    AGE,
    Column::new(
        "Request",
        "string",
        "Request represents a minimum amount of cpu/memory that a container may consume.",
    ),
    Column::new(
        "Limit",
        "string",
        "Limits control the maximum amount of cpu/memory that a container may use independent of contention on the node.",
    ),
];

/// Upstream's `printResourceQuota`: `used/hard` of each resource in `status.hard`, sorted by
/// name, `limits.*` in the Limit column and every other one in Request.
pub(crate) fn resourcequota(obj: &Value, now: Timestamp) -> Vec<Value> {
    let hard = crate::quota::list_from(obj.pointer("/status/hard"));
    let used = crate::quota::list_from(obj.pointer("/status/used"));
    let mut request = Vec::new();
    let mut limit = Vec::new();
    for (r, h) in &hard {
        let u = used.get(r).copied().unwrap_or_default();
        let cell = format!("{r}: {u}/{h}");
        if r.split('.').count() > 1 && r.split('.').next() == Some("limits") {
            limit.push(cell);
        } else {
            request.push(cell);
        }
    }
    vec![
        json!(name(obj)),
        json!(age(obj, now)),
        json!(request.join(", ")),
        json!(limit.join(", ")),
    ]
}

pub(crate) const LIMITRANGE_COLUMNS: &[Column] = &[NAME, Column::new("Created At", "date", super::AGE_DESC)];

/// Upstream's `printLimitRange`: the creation time in RFC 3339, UTC.
pub(crate) fn limitrange(obj: &Value) -> Vec<Value> {
    let created = obj
        .pointer("/metadata/creationTimestamp")
        .and_then(Value::as_str)
        .and_then(|t| t.parse::<Timestamp>().ok())
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default();
    vec![json!(name(obj)), json!(created)]
}
