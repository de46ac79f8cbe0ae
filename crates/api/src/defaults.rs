//! Defaulting of objects on create and update, as upstream's `SetDefaults_*` functions
//! (core/v1, apps/v1, batch/v1, scheduling/v1, storage/v1, rbac/v1) plus the parts of
//! upstream's admission and create strategies that users see on every object: the default
//! service account, priority, the `DefaultTolerationSeconds` tolerations, a Job's generated
//! selector, a Namespace's finalizer and a Pod's QoS class.
//!
//! Objects are JSON; defaulting never fails: a field of an unexpected type is left alone for
//! validation to report, and unknown fields are kept.

use std::sync::atomic::{AtomicI64, Ordering};

use serde_json::{Map, Value, json};

use crate::quantity::Quantity;
use crate::registry::Resource;

/// Fill in the defaults upstream fills for an object of this resource.
pub fn apply_defaults(res: &Resource, obj: &mut Value) {
    if !obj.is_object() {
        return;
    }
    match (res.group, res.kind) {
        ("", "Pod") => default_pod(obj),
        ("", "Service") => default_service(obj),
        ("", "Secret") => {
            if let Some(m) = obj.as_object_mut() {
                default_str(m, "type", "Opaque");
                merge_string_data(m);
            }
        }
        ("", "Namespace") => default_namespace(obj),
        ("", "Node") => default_node(obj),
        ("", "PersistentVolume") => default_persistent_volume(obj),
        ("", "PersistentVolumeClaim") => default_pvc(obj),
        ("", "Endpoints") => default_endpoints(obj),
        ("apps", "Deployment") => default_deployment(obj),
        ("apps", "ReplicaSet") => default_replicaset(obj),
        ("", "ReplicationController") => default_replication_controller(obj),
        ("apps", "StatefulSet") => default_statefulset(obj),
        ("apps", "DaemonSet") => default_daemonset(obj),
        ("batch", "Job") => default_job(obj),
        ("batch", "CronJob") => default_cronjob(obj),
        ("autoscaling", "HorizontalPodAutoscaler") => default_horizontal_pod_autoscaler(obj),
        ("", "LimitRange") => default_limit_range(obj),
        ("", "PodTemplate") => {
            if let Some(t) = obj.as_object_mut().and_then(|m| child(m, "template")) {
                default_template(t);
            }
        }
        ("scheduling.k8s.io", "PriorityClass") => {
            if let Some(m) = obj.as_object_mut() {
                default_str(m, "preemptionPolicy", "PreemptLowerPriority");
            }
        }
        ("rbac.authorization.k8s.io", "RoleBinding" | "ClusterRoleBinding") => default_role_binding(obj),
        ("admissionregistration.k8s.io", "ValidatingWebhookConfiguration") => default_webhooks(obj, false),
        ("admissionregistration.k8s.io", "ValidatingAdmissionPolicy") => default_admission_policy(obj, true),
        ("admissionregistration.k8s.io", "ValidatingAdmissionPolicyBinding") => default_admission_policy(obj, false),
        ("admissionregistration.k8s.io", "MutatingWebhookConfiguration") => default_webhooks(obj, true),
        ("certificates.k8s.io", "CertificateSigningRequest") => {
            // certificates/v1's `SetDefaults_CertificateSigningRequestCondition`.
            if let Some(cs) = obj.pointer_mut("/status/conditions").and_then(Value::as_array_mut) {
                for c in cs.iter_mut().filter_map(Value::as_object_mut) {
                    if c.get("status").and_then(Value::as_str).unwrap_or("").is_empty() {
                        c.insert("status".into(), json!("True"));
                    }
                }
            }
        }
        ("apiregistration.k8s.io", "APIService") => {
            // apiregistration/v1's `SetDefaults_ServiceReference`.
            if let Some(svc) = obj.pointer_mut("/spec/service").and_then(Value::as_object_mut) {
                default_val(svc, "port", json!(443));
            }
        }
        ("flowcontrol.apiserver.k8s.io", "FlowSchema") => {
            // flowcontrol/v1's `SetDefaults_FlowSchemaSpec`.
            if let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) {
                let unset = spec.get("matchingPrecedence").and_then(Value::as_i64).unwrap_or(0) == 0;
                if unset {
                    spec.insert("matchingPrecedence".into(), json!(1000));
                }
            }
        }
        ("flowcontrol.apiserver.k8s.io", "PriorityLevelConfiguration") => default_priority_level(obj),
        ("networking.k8s.io", "NetworkPolicy") => default_network_policy(obj),
        ("networking.k8s.io", "IngressClass") => {
            // upstream's networking/v1 `SetDefaults_IngressClass`.
            if let Some(p) = obj.pointer_mut("/spec/parameters").and_then(Value::as_object_mut) {
                default_val(p, "scope", json!("Cluster"));
            }
        }
        ("storage.k8s.io", "CSIDriver") => default_csi_driver(obj),
        ("storage.k8s.io", "StorageClass") => {
            // upstream's storage/v1 `SetDefaults_StorageClass`: only nil pointers are defaulted,
            // so an explicit "" stays for validation to judge.
            if let Some(m) = obj.as_object_mut() {
                default_val(m, "reclaimPolicy", json!("Delete"));
                default_val(m, "volumeBindingMode", json!("Immediate"));
            }
        }
        _ => {}
    }
}

// ---- helpers on JSON maps -------------------------------------------------------------------

/// The object at `key`, created when missing or null; `None` when it holds another type.
fn child<'a>(m: &'a mut Map<String, Value>, key: &str) -> Option<&'a mut Map<String, Value>> {
    let e = m.entry(key.to_string()).or_insert(Value::Null);
    if e.is_null() {
        *e = Value::Object(Map::new());
    }
    e.as_object_mut()
}

/// The object at `key` only when it already exists.
fn existing<'a>(m: &'a mut Map<String, Value>, key: &str) -> Option<&'a mut Map<String, Value>> {
    m.get_mut(key).and_then(Value::as_object_mut)
}

/// The array at `key`, when it exists.
fn array<'a>(m: &'a mut Map<String, Value>, key: &str) -> Option<&'a mut Vec<Value>> {
    m.get_mut(key).and_then(Value::as_array_mut)
}

fn is_unset(m: &Map<String, Value>, key: &str) -> bool {
    matches!(m.get(key), None | Some(Value::Null))
}

/// Set `key` when it is missing or null.
fn default_val(m: &mut Map<String, Value>, key: &str, v: Value) {
    if is_unset(m, key) {
        m.insert(key.to_string(), v);
    }
}

/// A Secret's write-only `stringData`, as upstream's conversion takes it on every create and
/// update: each value, base64-encoded, replaces the same key of `data`; `stringData` itself is
/// never stored or shown.
fn merge_string_data(m: &mut Map<String, Value>) {
    use base64::Engine;
    let Some(string_data) = m.remove("stringData") else {
        return;
    };
    let Value::Object(entries) = string_data else {
        return;
    };
    if entries.is_empty() {
        return;
    }
    let data = m.entry("data").or_insert_with(|| Value::Object(Map::new()));
    if !data.is_object() {
        *data = Value::Object(Map::new());
    }
    if let Some(data) = data.as_object_mut() {
        for (k, v) in entries {
            if let Some(text) = v.as_str() {
                let encoded = base64::engine::general_purpose::STANDARD.encode(text.as_bytes());
                data.insert(k, Value::String(encoded));
            }
        }
    }
}

/// Set a string enum when it is missing, null or empty (Go's zero value).
fn default_str(m: &mut Map<String, Value>, key: &str, v: &str) {
    let unset = match m.get(key) {
        None | Some(Value::Null) => true,
        Some(Value::String(s)) => s.is_empty(),
        _ => false,
    };
    if unset {
        m.insert(key.to_string(), Value::String(v.to_string()));
    }
}

fn str_of<'a>(m: &'a Map<String, Value>, key: &str) -> &'a str {
    m.get(key).and_then(Value::as_str).unwrap_or("")
}

fn for_each_object(items: Option<&mut Vec<Value>>, mut f: impl FnMut(&mut Map<String, Value>)) {
    if let Some(items) = items {
        for item in items.iter_mut() {
            if let Some(m) = item.as_object_mut() {
                f(m);
            }
        }
    }
}

// ---- pods -----------------------------------------------------------------------------------

fn default_pod(obj: &mut Value) {
    // A mirror pod keeps the spec of its static manifest: upstream's ServiceAccount admission
    // gives it no service account (and refuses one it names).
    let mirror = obj
        .pointer("/metadata/annotations/kubernetes.io~1config.mirror")
        .is_some();
    let Some(root) = obj.as_object_mut() else {
        return;
    };
    if let Some(spec) = child(root, "spec") {
        // Pod-only (not templates): requests default to limits, service links, host ports.
        for key in ["containers", "initContainers"] {
            for_each_object(array(spec, key), default_requests_from_limits);
        }
        default_val(spec, "enableServiceLinks", json!(true));
        if spec.get("hostNetwork").and_then(Value::as_bool) == Some(true) {
            for key in ["containers", "initContainers"] {
                for_each_object(array(spec, key), |c| {
                    for_each_object(array(c, "ports"), |p| {
                        if p.get("hostPort").and_then(Value::as_i64).unwrap_or(0) == 0
                            && let Some(cp) = p.get("containerPort").cloned()
                        {
                            p.insert("hostPort".into(), cp);
                        }
                    })
                });
            }
        }
        default_pod_spec(spec);
        // Admission: ServiceAccount, Priority, DefaultTolerationSeconds.
        if !mirror {
            default_str(spec, "serviceAccountName", "default");
        }
        mirror_service_account(spec);
        if is_unset(spec, "priority") {
            match str_of(spec, "priorityClassName") {
                "" => {
                    spec.insert("priority".into(), json!(0));
                }
                "system-node-critical" => {
                    spec.insert("priority".into(), json!(2_000_001_000));
                }
                "system-cluster-critical" => {
                    spec.insert("priority".into(), json!(2_000_000_000));
                }
                _ => {}
            }
        }
        default_str(spec, "preemptionPolicy", "PreemptLowerPriority");
        default_tolerations(spec);
    }
    let qos = root.get("spec").map(pod_qos_class).unwrap_or("BestEffort");
    if let Some(status) = child(root, "status") {
        default_str(status, "phase", "Pending");
        default_str(status, "qosClass", qos);
    }
}

/// The v1 conversion: `serviceAccountName` wins, the deprecated `serviceAccount` fills it when
/// it is empty, and the deprecated field always mirrors the result.
fn mirror_service_account(spec: &mut Map<String, Value>) {
    if str_of(spec, "serviceAccountName").is_empty() {
        let legacy = str_of(spec, "serviceAccount").to_string();
        if !legacy.is_empty() {
            spec.insert("serviceAccountName".into(), Value::String(legacy));
        }
    }
    let name = str_of(spec, "serviceAccountName").to_string();
    if !name.is_empty() {
        spec.insert("serviceAccount".into(), Value::String(name));
    }
}

/// What `SetDefaults_PodSpec` and the defaulters of its members do; applies to pod templates too.
fn default_pod_spec(spec: &mut Map<String, Value>) {
    mirror_service_account(spec);
    default_str(spec, "dnsPolicy", "ClusterFirst");
    default_str(spec, "restartPolicy", "Always");
    default_val(spec, "securityContext", json!({}));
    default_val(spec, "terminationGracePeriodSeconds", json!(30));
    default_str(spec, "schedulerName", "default-scheduler");
    for key in ["containers", "initContainers", "ephemeralContainers"] {
        for_each_object(array(spec, key), default_container);
    }
    for_each_object(array(spec, "volumes"), default_volume);
}

/// A pod template (`spec.template` of workloads): the pod spec defaults, not the pod-only ones.
fn default_template(template: &mut Map<String, Value>) {
    if let Some(spec) = child(template, "spec") {
        default_pod_spec(spec);
    }
}

fn default_requests_from_limits(c: &mut Map<String, Value>) {
    let Some(resources) = existing(c, "resources") else {
        return;
    };
    let Some(limits) = resources.get("limits").and_then(Value::as_object).cloned() else {
        return;
    };
    if limits.is_empty() {
        return;
    }
    let Some(requests) = child(resources, "requests") else {
        return;
    };
    for (name, q) in limits {
        requests.entry(name).or_insert(q);
    }
}

/// `IfNotPresent` unless the image's tag is `latest` (or absent, which means latest).
pub fn default_image_pull_policy(image: &str) -> &'static str {
    if image_tag(image) == "latest" {
        "Always"
    } else {
        "IfNotPresent"
    }
}

/// The tag of an image reference as upstream's `parsers.ParseImageName` reports it:
/// `latest` when neither tag nor digest is given, empty when only a digest is.
fn image_tag(image: &str) -> &str {
    let (name, digest) = match image.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (image, None),
    };
    let last = name.rsplit('/').next().unwrap_or(name);
    match last.rsplit_once(':') {
        Some((_, tag)) if !tag.is_empty() => tag,
        _ if digest.is_some() => "",
        _ => "latest",
    }
}

fn default_container(c: &mut Map<String, Value>) {
    let image = str_of(c, "image").to_string();
    default_str(c, "imagePullPolicy", default_image_pull_policy(&image));
    default_str(c, "terminationMessagePath", "/dev/termination-log");
    default_str(c, "terminationMessagePolicy", "File");
    // A struct, not a pointer, in upstream's Go type: its JSON always has it, `{}` when empty.
    default_val(c, "resources", json!({}));
    for_each_object(array(c, "ports"), |p| default_str(p, "protocol", "TCP"));
    for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
        if let Some(p) = existing(c, probe) {
            default_val(p, "timeoutSeconds", json!(1));
            default_val(p, "periodSeconds", json!(10));
            default_val(p, "successThreshold", json!(1));
            default_val(p, "failureThreshold", json!(3));
            default_handler(p);
        }
    }
    if let Some(lc) = existing(c, "lifecycle") {
        for hook in ["postStart", "preStop"] {
            if let Some(h) = existing(lc, hook) {
                default_handler(h);
            }
        }
    }
    for_each_object(array(c, "env"), |e| {
        if let Some(vf) = existing(e, "valueFrom")
            && let Some(fr) = existing(vf, "fieldRef")
        {
            default_str(fr, "apiVersion", "v1");
        }
    });
}

fn default_handler(h: &mut Map<String, Value>) {
    if let Some(get) = existing(h, "httpGet") {
        default_str(get, "path", "/");
        default_str(get, "scheme", "HTTP");
    }
}

/// The volume sources a `Volume` may name, in the order upstream validates them; a volume
/// naming none becomes an `emptyDir`.
pub const VOLUME_SOURCES: &[&str] = &[
    "emptyDir",
    "hostPath",
    "gitRepo",
    "gcePersistentDisk",
    "awsElasticBlockStore",
    "secret",
    "nfs",
    "iscsi",
    "glusterfs",
    "flocker",
    "persistentVolumeClaim",
    "rbd",
    "quobyte",
    "cephfs",
    "cinder",
    "downwardAPI",
    "fc",
    "flexVolume",
    "azureFile",
    "vsphereVolume",
    "photonPersistentDisk",
    "portworxVolume",
    "azureDisk",
    "storageos",
    "projected",
    "scaleIO",
    "configMap",
    "csi",
    "ephemeral",
    "image",
];

fn default_volume(v: &mut Map<String, Value>) {
    if !VOLUME_SOURCES.iter().any(|s| !is_unset(v, s)) {
        v.insert("emptyDir".into(), json!({}));
    }
    for src in ["secret", "configMap", "downwardAPI", "projected"] {
        if let Some(s) = existing(v, src) {
            default_val(s, "defaultMode", json!(420));
            if src == "downwardAPI" {
                for_each_object(array(s, "items"), |i| {
                    if let Some(fr) = existing(i, "fieldRef") {
                        default_str(fr, "apiVersion", "v1");
                    }
                });
            }
        }
    }
    if let Some(hp) = existing(v, "hostPath") {
        default_val(hp, "type", json!(""));
    }
    if let Some(eph) = existing(v, "ephemeral")
        && let Some(t) = existing(eph, "volumeClaimTemplate")
        && let Some(spec) = existing(t, "spec")
    {
        default_str(spec, "volumeMode", "Filesystem");
    }
}

/// The `DefaultTolerationSeconds` admission plugin's settings, process-wide as upstream's
/// `--default-not-ready-toleration-seconds` and `--default-unreachable-toleration-seconds` flags.
static NOT_READY_TOLERATION_SECONDS: AtomicI64 = AtomicI64::new(300);
static UNREACHABLE_TOLERATION_SECONDS: AtomicI64 = AtomicI64::new(300);

/// Sets how long pods tolerate a not-ready and an unreachable node unless they say otherwise
/// (300 s each until set).
pub fn set_default_toleration_seconds(not_ready: i64, unreachable: i64) {
    NOT_READY_TOLERATION_SECONDS.store(not_ready, Ordering::Relaxed);
    UNREACHABLE_TOLERATION_SECONDS.store(unreachable, Ordering::Relaxed);
}

/// The `DefaultTolerationSeconds` admission plugin: tolerate not-ready and unreachable nodes
/// for 300 s (or as set) unless the pod already tolerates them.
fn default_tolerations(spec: &mut Map<String, Value>) {
    let mut not_ready = false;
    let mut unreachable = false;
    if let Some(list) = spec.get("tolerations").and_then(Value::as_array) {
        for t in list {
            let key = t.get("key").and_then(Value::as_str).unwrap_or("");
            let effect = t.get("effect").and_then(Value::as_str).unwrap_or("");
            let effect_ok = effect.is_empty() || effect == "NoExecute";
            if effect_ok && (key.is_empty() || key == "node.kubernetes.io/not-ready") {
                not_ready = true;
            }
            if effect_ok && (key.is_empty() || key == "node.kubernetes.io/unreachable") {
                unreachable = true;
            }
        }
    }
    if not_ready && unreachable {
        return;
    }
    let entry = spec.entry("tolerations").or_insert(Value::Null);
    if entry.is_null() {
        *entry = Value::Array(Vec::new());
    }
    let Some(list) = entry.as_array_mut() else {
        return;
    };
    for (done, key, seconds) in [
        (not_ready, "node.kubernetes.io/not-ready", &NOT_READY_TOLERATION_SECONDS),
        (
            unreachable,
            "node.kubernetes.io/unreachable",
            &UNREACHABLE_TOLERATION_SECONDS,
        ),
    ] {
        if !done {
            list.push(json!({
                "key": key,
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": seconds.load(Ordering::Relaxed)
            }));
        }
    }
}

fn quantity_at(v: Option<&Value>) -> Option<Quantity> {
    v.and_then(|q| Quantity::from_json(q).ok())
}

/// The QoS class of a pod spec, as upstream's `qos.ComputePodQOS` (cpu and memory only).
pub fn pod_qos_class(spec: &Value) -> &'static str {
    let mut requests: Vec<(String, Quantity)> = Vec::new();
    let mut limits: Vec<(String, Quantity)> = Vec::new();
    let mut guaranteed = true;
    let zero = Quantity::default();
    let add = |acc: &mut Vec<(String, Quantity)>, name: &str, q: Quantity| {
        if let Some(e) = acc.iter_mut().find(|(n, _)| n == name) {
            e.1 += q;
        } else {
            acc.push((name.to_string(), q));
        }
    };
    for key in ["containers", "initContainers"] {
        let Some(list) = spec.get(key).and_then(Value::as_array) else {
            continue;
        };
        for c in list {
            let res = c.get("resources");
            if let Some(reqs) = res.and_then(|r| r.get("requests")).and_then(Value::as_object) {
                for (name, q) in reqs {
                    if name != "cpu" && name != "memory" {
                        continue;
                    }
                    if let Some(q) = quantity_at(Some(q))
                        && q > zero
                    {
                        add(&mut requests, name, q);
                    }
                }
            }
            let mut found = (false, false);
            if let Some(lims) = res.and_then(|r| r.get("limits")).and_then(Value::as_object) {
                for (name, q) in lims {
                    if name != "cpu" && name != "memory" {
                        continue;
                    }
                    if let Some(q) = quantity_at(Some(q))
                        && q > zero
                    {
                        if name == "cpu" {
                            found.0 = true;
                        } else {
                            found.1 = true;
                        }
                        add(&mut limits, name, q);
                    }
                }
            }
            if !(found.0 && found.1) {
                guaranteed = false;
            }
        }
    }
    if requests.is_empty() && limits.is_empty() {
        return "BestEffort";
    }
    if guaranteed {
        for (name, req) in &requests {
            match limits.iter().find(|(n, _)| n == name) {
                Some((_, lim)) if lim == req => {}
                _ => {
                    guaranteed = false;
                    break;
                }
            }
        }
    }
    if guaranteed && requests.len() == limits.len() {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

// ---- core objects ---------------------------------------------------------------------------

fn default_service(obj: &mut Value) {
    let Some(root) = obj.as_object_mut() else {
        return;
    };
    let Some(spec) = child(root, "spec") else {
        return;
    };
    default_str(spec, "type", "ClusterIP");
    default_str(spec, "sessionAffinity", "None");
    match str_of(spec, "sessionAffinity") {
        "None" => {
            spec.remove("sessionAffinityConfig");
        }
        "ClientIP" => {
            let has_timeout = spec
                .get("sessionAffinityConfig")
                .and_then(|c| c.get("clientIP"))
                .and_then(|c| c.get("timeoutSeconds"))
                .is_some_and(|t| !t.is_null());
            if !has_timeout {
                spec.insert(
                    "sessionAffinityConfig".into(),
                    json!({"clientIP": {"timeoutSeconds": 10800}}),
                );
            }
        }
        _ => {}
    }
    for_each_object(array(spec, "ports"), |p| {
        default_str(p, "protocol", "TCP");
        let unset = match p.get("targetPort") {
            None | Some(Value::Null) => true,
            Some(Value::String(s)) => s.is_empty(),
            Some(Value::Number(n)) => n.as_i64() == Some(0),
            _ => false,
        };
        if unset && let Some(port) = p.get("port").cloned() {
            p.insert("targetPort".into(), port);
        }
    });
    let ty = str_of(spec, "type").to_string();
    let has_external_ips = spec
        .get("externalIPs")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty());
    let externally_accessible = ty == "LoadBalancer" || ty == "NodePort" || (ty == "ClusterIP" && has_external_ips);
    if externally_accessible {
        default_str(spec, "externalTrafficPolicy", "Cluster");
    }
    if matches!(ty.as_str(), "ClusterIP" | "NodePort" | "LoadBalancer") {
        default_str(spec, "internalTrafficPolicy", "Cluster");
        // The registry's family defaults on a single-stack IPv4 cluster; headless services
        // without a selector require every configured family.
        let headless = str_of(spec, "clusterIP") == "None";
        let has_selector = spec
            .get("selector")
            .and_then(Value::as_object)
            .is_some_and(|m| !m.is_empty());
        let policy = if headless && !has_selector {
            "RequireDualStack"
        } else {
            "SingleStack"
        };
        default_str(spec, "ipFamilyPolicy", policy);
        default_val(spec, "ipFamilies", json!(["IPv4"]));
    }
    if ty == "LoadBalancer" {
        default_val(spec, "allocateLoadBalancerNodePorts", json!(true));
    }
}

fn default_namespace(obj: &mut Value) {
    let Some(root) = obj.as_object_mut() else {
        return;
    };
    let name = root
        .get("metadata")
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .map(str::to_string);
    if let Some(name) = name
        && !name.is_empty()
        && let Some(meta) = child(root, "metadata")
        && let Some(labels) = child(meta, "labels")
    {
        labels.insert("kubernetes.io/metadata.name".into(), Value::String(name));
    }
    // Upstream adds the finalizer when the namespace is created; a namespace being deleted
    // whose finalizer was removed must not get it back.
    let deleting = root
        .get("metadata")
        .and_then(|m| m.get("deletionTimestamp"))
        .is_some_and(|t| !t.is_null());
    if let Some(spec) = child(root, "spec")
        && !deleting
    {
        default_val(spec, "finalizers", json!(["kubernetes"]));
    }
    if let Some(status) = child(root, "status") {
        default_str(status, "phase", "Active");
    }
}

fn default_node(obj: &mut Value) {
    let Some(root) = obj.as_object_mut() else {
        return;
    };
    // Upstream's v1 conversion: `podCIDRs` is the truth, `podCIDR` its first element, and a
    // client that sends only `podCIDR` gets it as `podCIDRs`.
    if let Some(spec) = existing(root, "spec") {
        let first = spec
            .get("podCIDRs")
            .and_then(Value::as_array)
            .and_then(|l| l.first())
            .cloned();
        match first {
            Some(first) => {
                spec.insert("podCIDR".into(), first);
            }
            None => {
                if let Some(cidr) = spec
                    .get("podCIDR")
                    .filter(|c| c.as_str().is_some_and(|c| !c.is_empty()))
                    .cloned()
                {
                    spec.insert("podCIDRs".into(), Value::Array(vec![cidr]));
                }
            }
        }
    }
    let Some(status) = existing(root, "status") else {
        return;
    };
    if is_unset(status, "allocatable")
        && let Some(cap) = status.get("capacity").filter(|c| c.is_object()).cloned()
    {
        status.insert("allocatable".into(), cap);
    }
}

fn default_persistent_volume(obj: &mut Value) {
    let Some(root) = obj.as_object_mut() else {
        return;
    };
    if let Some(spec) = child(root, "spec") {
        default_str(spec, "persistentVolumeReclaimPolicy", "Retain");
        default_str(spec, "volumeMode", "Filesystem");
    }
    if let Some(status) = child(root, "status") {
        default_str(status, "phase", "Pending");
    }
}

fn default_pvc_spec(spec: &mut Map<String, Value>) {
    default_str(spec, "volumeMode", "Filesystem");
}

fn default_pvc(obj: &mut Value) {
    let Some(root) = obj.as_object_mut() else {
        return;
    };
    if let Some(spec) = child(root, "spec") {
        default_pvc_spec(spec);
    }
    if let Some(status) = child(root, "status") {
        default_str(status, "phase", "Pending");
    }
}

fn default_endpoints(obj: &mut Value) {
    let Some(root) = obj.as_object_mut() else {
        return;
    };
    for_each_object(array(root, "subsets"), |s| {
        for_each_object(array(s, "ports"), |p| default_str(p, "protocol", "TCP"));
    });
}

// ---- workloads ------------------------------------------------------------------------------

fn default_deployment(obj: &mut Value) {
    let Some(root) = obj.as_object_mut() else {
        return;
    };
    let Some(spec) = child(root, "spec") else {
        return;
    };
    default_val(spec, "replicas", json!(1));
    if let Some(strategy) = child(spec, "strategy") {
        default_str(strategy, "type", "RollingUpdate");
        if str_of(strategy, "type") == "RollingUpdate"
            && let Some(ru) = child(strategy, "rollingUpdate")
        {
            default_val(ru, "maxUnavailable", json!("25%"));
            default_val(ru, "maxSurge", json!("25%"));
        }
    }
    default_val(spec, "revisionHistoryLimit", json!(10));
    default_val(spec, "progressDeadlineSeconds", json!(600));
    if let Some(t) = child(spec, "template") {
        default_template(t);
    }
}

fn default_replicaset(obj: &mut Value) {
    let Some(root) = obj.as_object_mut() else {
        return;
    };
    let Some(spec) = child(root, "spec") else {
        return;
    };
    default_val(spec, "replicas", json!(1));
    if let Some(t) = child(spec, "template") {
        default_template(t);
    }
}

/// core/v1's `SetDefaults_ReplicationController`: an empty selector and empty object labels
/// are the template's labels, and one replica.
fn default_replication_controller(obj: &mut Value) {
    let Some(root) = obj.as_object_mut() else {
        return;
    };
    let template_labels = root
        .get("spec")
        .and_then(|s| s.get("template"))
        .and_then(|t| t.get("metadata"))
        .and_then(|m| m.get("labels"))
        .filter(|l| l.is_object())
        .cloned();
    let is_empty = |v: Option<&Value>| v.and_then(Value::as_object).is_none_or(Map::is_empty);
    if let Some(labels) = template_labels {
        if let Some(spec) = child(root, "spec")
            && is_empty(spec.get("selector"))
        {
            spec.insert("selector".into(), labels.clone());
        }
        if let Some(md) = child(root, "metadata")
            && is_empty(md.get("labels"))
        {
            md.insert("labels".into(), labels);
        }
    }
    let Some(spec) = child(root, "spec") else {
        return;
    };
    default_val(spec, "replicas", json!(1));
    if let Some(t) = existing(spec, "template") {
        default_template(t);
    }
}

fn default_statefulset(obj: &mut Value) {
    let Some(root) = obj.as_object_mut() else {
        return;
    };
    let Some(spec) = child(root, "spec") else {
        return;
    };
    default_str(spec, "podManagementPolicy", "OrderedReady");
    if let Some(us) = child(spec, "updateStrategy") {
        // Upstream creates `rollingUpdate` only when it also chose the type.
        if str_of(us, "type").is_empty() {
            us.insert("type".into(), json!("RollingUpdate"));
            default_val(us, "rollingUpdate", json!({}));
        }
        if str_of(us, "type") == "RollingUpdate"
            && let Some(ru) = existing(us, "rollingUpdate")
        {
            default_val(ru, "partition", json!(0));
        }
    }
    if let Some(p) = child(spec, "persistentVolumeClaimRetentionPolicy") {
        default_str(p, "whenDeleted", "Retain");
        default_str(p, "whenScaled", "Retain");
    }
    default_val(spec, "replicas", json!(1));
    default_val(spec, "revisionHistoryLimit", json!(10));
    if let Some(t) = child(spec, "template") {
        default_template(t);
    }
    for_each_object(array(spec, "volumeClaimTemplates"), |pvc| {
        if let Some(s) = child(pvc, "spec") {
            default_pvc_spec(s);
        }
        if let Some(status) = child(pvc, "status") {
            default_str(status, "phase", "Pending");
        }
    });
}

fn default_daemonset(obj: &mut Value) {
    let Some(root) = obj.as_object_mut() else {
        return;
    };
    let Some(spec) = child(root, "spec") else {
        return;
    };
    if let Some(us) = child(spec, "updateStrategy") {
        default_str(us, "type", "RollingUpdate");
        if str_of(us, "type") == "RollingUpdate"
            && let Some(ru) = child(us, "rollingUpdate")
        {
            default_val(ru, "maxUnavailable", json!(1));
            default_val(ru, "maxSurge", json!(0));
        }
    }
    default_val(spec, "revisionHistoryLimit", json!(10));
    if let Some(t) = child(spec, "template") {
        default_template(t);
    }
}

/// Label keys a Job's generated selector uses.
pub const JOB_NAME_LABEL: &str = "batch.kubernetes.io/job-name";
pub const LEGACY_JOB_NAME_LABEL: &str = "job-name";
pub const CONTROLLER_UID_LABEL: &str = "batch.kubernetes.io/controller-uid";
pub const LEGACY_CONTROLLER_UID_LABEL: &str = "controller-uid";

fn default_job_spec_fields(spec: &mut Map<String, Value>) {
    if is_unset(spec, "completions") && is_unset(spec, "parallelism") {
        spec.insert("completions".into(), json!(1));
        spec.insert("parallelism".into(), json!(1));
    }
    default_val(spec, "parallelism", json!(1));
    if is_unset(spec, "backoffLimit") {
        let limit = if is_unset(spec, "backoffLimitPerIndex") {
            6
        } else {
            i64::from(i32::MAX)
        };
        spec.insert("backoffLimit".into(), json!(limit));
    }
    default_str(spec, "completionMode", "NonIndexed");
    default_val(spec, "suspend", json!(false));
    let has_failure_policy = !is_unset(spec, "podFailurePolicy");
    if let Some(pfp) = existing(spec, "podFailurePolicy") {
        for_each_object(array(pfp, "rules"), |r| {
            for_each_object(array(r, "onPodConditions"), |c| default_str(c, "status", "True"));
        });
    }
    default_str(
        spec,
        "podReplacementPolicy",
        if has_failure_policy {
            "Failed"
        } else {
            "TerminatingOrFailed"
        },
    );
}

fn default_job(obj: &mut Value) {
    let Some(root) = obj.as_object_mut() else {
        return;
    };
    let meta = root.get("metadata");
    let name = meta
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let uid = meta
        .and_then(|m| m.get("uid"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let Some(spec) = child(root, "spec") else {
        return;
    };
    default_job_spec_fields(spec);
    let manual = spec.get("manualSelector").and_then(Value::as_bool) == Some(true);
    if !manual && !uid.is_empty() {
        generate_job_selector(spec, &name, &uid);
    }
    if let Some(t) = child(spec, "template") {
        default_template(t);
    }
    // A Job without labels takes its template's labels.
    let template_labels = spec
        .get("template")
        .and_then(|t| t.get("metadata"))
        .and_then(|m| m.get("labels"))
        .filter(|l| l.is_object())
        .cloned();
    if let Some(labels) = template_labels
        && let Some(meta) = child(root, "metadata")
    {
        let empty = match meta.get("labels") {
            None | Some(Value::Null) => true,
            Some(Value::Object(m)) => m.is_empty(),
            _ => false,
        };
        if empty {
            meta.insert("labels".into(), labels);
        }
    }
}

/// Upstream's `generateSelector`: label the template with the job's name and uid and select
/// the uid label.
fn generate_job_selector(spec: &mut Map<String, Value>, name: &str, uid: &str) {
    if let Some(t) = child(spec, "template")
        && let Some(m) = child(t, "metadata")
        && let Some(labels) = child(m, "labels")
    {
        for key in [LEGACY_JOB_NAME_LABEL, JOB_NAME_LABEL] {
            labels
                .entry(key.to_string())
                .or_insert_with(|| Value::String(name.to_string()));
        }
        for key in [LEGACY_CONTROLLER_UID_LABEL, CONTROLLER_UID_LABEL] {
            labels
                .entry(key.to_string())
                .or_insert_with(|| Value::String(uid.to_string()));
        }
    }
    if let Some(sel) = child(spec, "selector")
        && let Some(ml) = child(sel, "matchLabels")
    {
        ml.entry(CONTROLLER_UID_LABEL.to_string())
            .or_insert_with(|| Value::String(uid.to_string()));
    }
}

/// autoscaling/v2's `SetDefaults_HorizontalPodAutoscaler`: one replica at least, CPU at 80% of
/// the requests when no metric is named, and a behavior given in part completed with the
/// defaults of its direction (`GenerateHPAScaleUpRules` / `GenerateHPAScaleDownRules`).
fn default_horizontal_pod_autoscaler(obj: &mut Value) {
    let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    if spec.get("minReplicas").is_none_or(Value::is_null) {
        spec.insert("minReplicas".into(), json!(1));
    }
    if spec
        .get("metrics")
        .is_none_or(|m| m.as_array().is_none_or(|a| a.is_empty()))
    {
        spec.insert(
            "metrics".into(),
            json!([{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}]),
        );
    }
    let Some(behavior) = spec.get_mut("behavior").and_then(Value::as_object_mut) else {
        return;
    };
    let up_policies = json!([
        {"type": "Pods", "value": 4, "periodSeconds": 15},
        {"type": "Percent", "value": 100, "periodSeconds": 15},
    ]);
    let down_policies = json!([{"type": "Percent", "value": 100, "periodSeconds": 15}]);
    for (key, window, policies) in [("scaleUp", 0, up_policies), ("scaleDown", 300, down_policies)] {
        let rules = behavior.entry(key).or_insert_with(|| json!({}));
        let Some(rules) = rules.as_object_mut() else { continue };
        if rules.get("stabilizationWindowSeconds").is_none_or(Value::is_null) {
            rules.insert("stabilizationWindowSeconds".into(), json!(window));
        }
        if rules.get("selectPolicy").is_none_or(Value::is_null) {
            rules.insert("selectPolicy".into(), json!("Max"));
        }
        if rules.get("policies").is_none_or(Value::is_null) {
            rules.insert("policies".into(), policies);
        }
    }
}

fn default_cronjob(obj: &mut Value) {
    let Some(root) = obj.as_object_mut() else {
        return;
    };
    let Some(spec) = child(root, "spec") else {
        return;
    };
    default_str(spec, "concurrencyPolicy", "Allow");
    default_val(spec, "suspend", json!(false));
    default_val(spec, "successfulJobsHistoryLimit", json!(3));
    default_val(spec, "failedJobsHistoryLimit", json!(1));
    if let Some(jt) = child(spec, "jobTemplate")
        && let Some(js) = child(jt, "spec")
        && let Some(t) = child(js, "template")
    {
        default_template(t);
    }
}

// ---- rbac.authorization.k8s.io ----------------------------------------------------------------

/// The API group of roles and bindings.
const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

/// upstream's rbac/v1 `SetDefaults_RoleBinding` / `SetDefaults_ClusterRoleBinding`: the role
/// reference's group; and `SetDefaults_Subject` on every subject: users and groups are of the
/// RBAC group, service accounts of the core group ("", which JSON leaves out).
fn default_role_binding(obj: &mut Value) {
    let Some(root) = obj.as_object_mut() else {
        return;
    };
    // roleRef is a struct, not a pointer, upstream: a binding always has one to default.
    if let Some(role_ref) = child(root, "roleRef") {
        default_str(role_ref, "apiGroup", RBAC_GROUP);
    }
    for_each_object(array(root, "subjects"), |subject| {
        if matches!(str_of(subject, "kind"), "User" | "Group") {
            default_str(subject, "apiGroup", RBAC_GROUP);
        }
    });
}

/// admissionregistration/v1's `SetDefaults_ValidatingWebhook` and `SetDefaults_MutatingWebhook`
/// (the latter adds `reinvocationPolicy`), with `SetDefaults_Rule` (scope `*`) and
/// `SetDefaults_ServiceReference` (port 443) inside them. Pointers in upstream: only a missing
/// or null field is defaulted.
fn default_webhooks(obj: &mut Value, mutating: bool) {
    let Some(hooks) = obj.as_object_mut().and_then(|m| array(m, "webhooks")) else {
        return;
    };
    for h in hooks.iter_mut().filter_map(Value::as_object_mut) {
        default_val(h, "failurePolicy", json!("Fail"));
        default_val(h, "matchPolicy", json!("Equivalent"));
        default_val(h, "namespaceSelector", json!({}));
        default_val(h, "objectSelector", json!({}));
        default_val(h, "timeoutSeconds", json!(10));
        if mutating {
            default_val(h, "reinvocationPolicy", json!("Never"));
        }
        if let Some(rules) = array(h, "rules") {
            for r in rules.iter_mut().filter_map(Value::as_object_mut) {
                default_val(r, "scope", json!("*"));
            }
        }
        if let Some(svc) = existing(h, "clientConfig").and_then(|c| existing(c, "service")) {
            default_val(svc, "port", json!(443));
        }
    }
}

/// upstream's `SetDefaults_ValidatingAdmissionPolicySpec` (failurePolicy Fail) and
/// `SetDefaults_MatchResources` for a policy's `matchConstraints` or a binding's
/// `matchResources`.
fn default_admission_policy(obj: &mut Value, policy: bool) {
    let Some(spec) = obj.as_object_mut().and_then(|m| existing(m, "spec")) else {
        return;
    };
    if policy {
        default_val(spec, "failurePolicy", json!("Fail"));
    }
    let key = if policy { "matchConstraints" } else { "matchResources" };
    let Some(mr) = existing(spec, key) else { return };
    default_val(mr, "matchPolicy", json!("Equivalent"));
    default_val(mr, "namespaceSelector", json!({}));
    default_val(mr, "objectSelector", json!({}));
    for rules in ["resourceRules", "excludeResourceRules"] {
        if let Some(rs) = array(mr, rules) {
            for r in rs.iter_mut().filter_map(Value::as_object_mut) {
                default_val(r, "scope", json!("*"));
            }
        }
    }
}

/// upstream's `SetDefaults_LimitRangeItem`: a Container item's default limit is its max, its
/// default request the default limit, or else the min.
fn default_limit_range(obj: &mut Value) {
    let Some(items) = obj.pointer_mut("/spec/limits").and_then(Value::as_array_mut) else {
        return;
    };
    for item in items.iter_mut().filter_map(Value::as_object_mut) {
        if item.get("type").and_then(Value::as_str) != Some("Container") {
            continue;
        }
        let list =
            |item: &Map<String, Value>, f: &str| item.get(f).and_then(Value::as_object).cloned().unwrap_or_default();
        let max = list(item, "max");
        let min = list(item, "min");
        let mut default = list(item, "default");
        for (k, v) in &max {
            default.entry(k.clone()).or_insert_with(|| v.clone());
        }
        let mut request = list(item, "defaultRequest");
        for (k, v) in default.iter().chain(min.iter()) {
            request.entry(k.clone()).or_insert_with(|| v.clone());
        }
        if !default.is_empty() {
            item.insert("default".into(), Value::Object(default));
        }
        if !request.is_empty() {
            item.insert("defaultRequest".into(), Value::Object(request));
        }
    }
}

// ---- networking and storage drivers ----------------------------------------------------------

/// upstream's networking/v1 `SetDefaults_NetworkPolicy` and `SetDefaults_NetworkPolicyPort`:
/// ports are TCP unless given, and a policy naming no types is an Ingress policy (and an
/// Egress one when it has egress rules).
fn default_network_policy(obj: &mut Value) {
    let Some(spec) = obj.as_object_mut().and_then(|m| child(m, "spec")) else {
        return;
    };
    for rules in ["ingress", "egress"] {
        for_each_object(array(spec, rules), |rule| {
            for_each_object(array(rule, "ports"), |port| default_val(port, "protocol", json!("TCP")));
        });
    }
    let has_types = spec
        .get("policyTypes")
        .and_then(Value::as_array)
        .is_some_and(|t| !t.is_empty());
    if !has_types {
        let has_egress = spec
            .get("egress")
            .and_then(Value::as_array)
            .is_some_and(|e| !e.is_empty());
        let types = if has_egress {
            json!(["Ingress", "Egress"])
        } else {
            json!(["Ingress"])
        };
        spec.insert("policyTypes".into(), types);
    }
}

/// upstream's storage/v1 `SetDefaults_CSIDriver` with 1.33's default feature gates
/// (`CSIInlineVolume` and `SELinuxMountReadWriteOncePod` on).
/// flowcontrol/v1's `SetDefaults_PriorityLevelConfiguration`,
/// `SetDefaults_LimitedPriorityLevelConfiguration` and `SetDefaults_QueuingConfiguration`.
fn default_priority_level(obj: &mut Value) {
    let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    if spec.get("type").and_then(Value::as_str) == Some("Exempt")
        && let Some(exempt) = child(spec, "exempt")
    {
        default_val(exempt, "nominalConcurrencyShares", json!(0));
        default_val(exempt, "lendablePercent", json!(0));
    }
    let Some(limited) = existing(spec, "limited") else {
        return;
    };
    default_val(limited, "nominalConcurrencyShares", json!(30));
    default_val(limited, "lendablePercent", json!(0));
    let queuing = limited
        .get_mut("limitResponse")
        .and_then(Value::as_object_mut)
        .and_then(|lr| existing(lr, "queuing"));
    if let Some(q) = queuing {
        for (key, value) in [("handSize", 8), ("queues", 64), ("queueLengthLimit", 50)] {
            if q.get(key).and_then(Value::as_i64).unwrap_or(0) == 0 {
                q.insert(key.into(), json!(value));
            }
        }
    }
}

fn default_csi_driver(obj: &mut Value) {
    let Some(spec) = obj.as_object_mut().and_then(|m| child(m, "spec")) else {
        return;
    };
    default_val(spec, "attachRequired", json!(true));
    default_val(spec, "podInfoOnMount", json!(false));
    default_val(spec, "storageCapacity", json!(false));
    default_val(spec, "fsGroupPolicy", json!("ReadWriteOnceWithFSType"));
    let no_modes = spec
        .get("volumeLifecycleModes")
        .and_then(Value::as_array)
        .is_none_or(Vec::is_empty);
    if no_modes {
        spec.insert("volumeLifecycleModes".into(), json!(["Persistent"]));
    }
    default_val(spec, "requiresRepublish", json!(false));
    default_val(spec, "seLinuxMount", json!(false));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::lookup_kind;

    #[test]
    fn string_data_is_merged_over_data_and_never_kept() {
        let s = defaulted(
            "",
            "Secret",
            json!({"metadata": {"name": "s"}, "data": {"k1": "djE=", "k2": ""}, "stringData": {"k2": "v2", "k3": "v3"}}),
        );
        assert_eq!(s["data"], json!({"k1": "djE=", "k2": "djI=", "k3": "djM="}));
        assert!(s.get("stringData").is_none(), "{s}");
        assert_eq!(s["type"], "Opaque");
        let only = defaulted(
            "",
            "Secret",
            json!({"metadata": {"name": "s"}, "stringData": {"a": "b"}}),
        );
        assert_eq!(only["data"], json!({"a": "Yg=="}));
    }

    #[test]
    fn role_binding_defaults() {
        for kind in ["RoleBinding", "ClusterRoleBinding"] {
            let b = defaulted(
                RBAC_GROUP,
                kind,
                json!({
                    "metadata": {"name": "b"},
                    "roleRef": {"kind": "ClusterRole", "name": "view"},
                    "subjects": [
                        {"kind": "User", "name": "alice"},
                        {"kind": "Group", "name": "devs", "apiGroup": ""},
                        {"kind": "ServiceAccount", "name": "bot", "namespace": "ci"},
                        {"kind": "User", "name": "bob", "apiGroup": "example.com"},
                        {"kind": "Robot", "name": "r2"}
                    ]
                }),
            );
            assert_eq!(b["roleRef"]["apiGroup"], RBAC_GROUP, "{kind}");
            assert_eq!(b["subjects"][0]["apiGroup"], RBAC_GROUP);
            assert_eq!(b["subjects"][1]["apiGroup"], RBAC_GROUP);
            assert!(
                b["subjects"][2].get("apiGroup").is_none(),
                "service accounts stay in \"\""
            );
            assert_eq!(b["subjects"][3]["apiGroup"], "example.com", "a set group stays");
            assert!(b["subjects"][4].get("apiGroup").is_none(), "unknown kinds are left");
        }
        // A binding without a role reference gets one holding the group, as Go's zero struct.
        let b = defaulted(RBAC_GROUP, "RoleBinding", json!({"metadata": {"name": "b"}}));
        assert_eq!(b["roleRef"], json!({"apiGroup": RBAC_GROUP}));
        let b = defaulted(
            RBAC_GROUP,
            "ClusterRoleBinding",
            json!({"roleRef": {"apiGroup": "other.io", "kind": "ClusterRole", "name": "x"}}),
        );
        assert_eq!(b["roleRef"]["apiGroup"], "other.io");
        // Roles have no defaults.
        let r = json!({"metadata": {"name": "r"}, "rules": [{"verbs": ["get"]}]});
        assert_eq!(defaulted(RBAC_GROUP, "Role", r.clone()), r);
    }

    fn defaulted(group: &str, kind: &str, mut v: Value) -> Value {
        let res = lookup_kind(group, kind).expect("resource");
        apply_defaults(res, &mut v);
        v
    }

    #[test]
    fn pod_defaults() {
        let p = defaulted(
            "",
            "Pod",
            json!({
                "metadata": {"name": "p"},
                "spec": {"containers": [
                    {"name": "a", "image": "nginx", "ports": [{"containerPort": 80}],
                     "readinessProbe": {"httpGet": {"port": 80}}, "x-unknown": 1},
                    {"name": "b", "image": "nginx:1.25"},
                    {"name": "c", "image": "reg:5000/app"},
                    {"name": "d", "image": "nginx@sha256:abc"},
                    {"name": "e", "image": "nginx:latest", "imagePullPolicy": "Never"}
                ],
                "volumes": [{"name": "s", "secret": {"secretName": "x"}}, {"name": "e"},
                            {"name": "h", "hostPath": {"path": "/tmp"}}, {"name": "c", "configMap": {"name": "c"}}]}
            }),
        );
        let s = &p["spec"];
        assert_eq!(s["restartPolicy"], "Always");
        assert_eq!(s["dnsPolicy"], "ClusterFirst");
        assert_eq!(s["schedulerName"], "default-scheduler");
        assert_eq!(s["terminationGracePeriodSeconds"], 30);
        assert_eq!(s["securityContext"], json!({}));
        assert_eq!(s["enableServiceLinks"], true);
        assert_eq!(s["serviceAccountName"], "default");
        let mut mirror = json!({"metadata": {"annotations": {"kubernetes.io/config.mirror": "x"}},
            "spec": {"containers": [{"name": "c", "image": "i"}]}});
        default_pod(&mut mirror);
        assert!(mirror["spec"].get("serviceAccountName").is_none(), "{mirror}");
        assert_eq!(s["serviceAccount"], "default");
        let legacy = defaulted(
            "",
            "Pod",
            json!({"spec": {"serviceAccount": "builder", "containers": []}}),
        );
        assert_eq!(legacy["spec"]["serviceAccountName"], "builder");
        assert_eq!(legacy["spec"]["serviceAccount"], "builder");
        let both = defaulted(
            "",
            "Pod",
            json!({"spec": {"serviceAccount": "old", "serviceAccountName": "new"}}),
        );
        assert_eq!(both["spec"]["serviceAccount"], "new");
        assert_eq!(s["priority"], 0);
        assert_eq!(s["preemptionPolicy"], "PreemptLowerPriority");
        let c = &s["containers"];
        assert_eq!(c[0]["imagePullPolicy"], "Always");
        assert_eq!(c[1]["imagePullPolicy"], "IfNotPresent");
        assert_eq!(c[2]["imagePullPolicy"], "Always");
        assert_eq!(c[3]["imagePullPolicy"], "IfNotPresent");
        assert_eq!(c[4]["imagePullPolicy"], "Never");
        assert_eq!(c[0]["terminationMessagePath"], "/dev/termination-log");
        assert_eq!(c[0]["resources"], json!({}));
        assert_eq!(c[0]["terminationMessagePolicy"], "File");
        assert_eq!(c[0]["ports"][0]["protocol"], "TCP");
        assert_eq!(c[0]["x-unknown"], 1);
        let rp = &c[0]["readinessProbe"];
        assert_eq!(
            (
                &rp["timeoutSeconds"],
                &rp["periodSeconds"],
                &rp["successThreshold"],
                &rp["failureThreshold"]
            ),
            (&json!(1), &json!(10), &json!(1), &json!(3))
        );
        assert_eq!(rp["httpGet"]["path"], "/");
        assert_eq!(rp["httpGet"]["scheme"], "HTTP");
        let v = &s["volumes"];
        assert_eq!(v[0]["secret"]["defaultMode"], 420);
        assert_eq!(v[1]["emptyDir"], json!({}));
        assert_eq!(v[2]["hostPath"]["type"], "");
        assert_eq!(v[3]["configMap"]["defaultMode"], 420);
        assert_eq!(
            s["tolerations"],
            json!([
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
            ])
        );
        assert_eq!(p["status"]["qosClass"], "BestEffort");
        assert_eq!(p["status"]["phase"], "Pending");
    }

    #[test]
    fn pod_defaults_are_idempotent_and_keep_user_values() {
        let once = defaulted(
            "",
            "Pod",
            json!({"spec": {"restartPolicy": "Never", "containers": [{"name": "a", "image": "x"}],
                "tolerations": [{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 5}]}}),
        );
        assert_eq!(once["spec"]["restartPolicy"], "Never");
        let tol = once["spec"]["tolerations"].as_array().expect("tolerations");
        assert_eq!(tol.len(), 2);
        assert_eq!(tol[0]["tolerationSeconds"], 5);
        assert_eq!(tol[1]["key"], "node.kubernetes.io/not-ready");
        let twice = defaulted("", "Pod", once.clone());
        assert_eq!(once, twice);
    }

    #[test]
    fn requests_default_to_limits_and_qos() {
        let p = defaulted(
            "",
            "Pod",
            json!({"spec": {"containers": [{"name": "a", "image": "x",
                "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]}}),
        );
        assert_eq!(
            p["spec"]["containers"][0]["resources"]["requests"],
            json!({"cpu": "1", "memory": "1Gi"})
        );
        assert_eq!(p["status"]["qosClass"], "Guaranteed");

        let qos = |spec: Value| pod_qos_class(&spec);
        assert_eq!(
            qos(json!({"containers": [{"resources": {"requests": {"cpu": "100m"}}}]})),
            "Burstable"
        );
        assert_eq!(
            qos(
                json!({"containers": [{"resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1000m", "memory": "1024Mi"}}}]})
            ),
            "Guaranteed"
        );
        assert_eq!(
            qos(
                json!({"containers": [{"resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}}]})
            ),
            "Burstable"
        );
        // A second container without limits breaks Guaranteed.
        assert_eq!(
            qos(json!({"containers": [
                {"resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}},
                {"resources": {}}
            ]})),
            "Burstable"
        );
        // Zero requests and non-compute resources do not count.
        assert_eq!(
            qos(json!({"containers": [{"resources": {"requests": {"cpu": "0", "ephemeral-storage": "1Gi"}}}]})),
            "BestEffort"
        );
    }

    #[test]
    fn host_network_ports() {
        let p = defaulted(
            "",
            "Pod",
            json!({"spec": {"hostNetwork": true, "containers": [{"name": "a", "image": "x", "ports": [{"containerPort": 8080}]}]}}),
        );
        assert_eq!(p["spec"]["containers"][0]["ports"][0]["hostPort"], 8080);
    }

    #[test]
    fn deployment_defaults() {
        let d = defaulted(
            "apps",
            "Deployment",
            json!({"spec": {"template": {"spec": {"containers": [{"name": "a", "image": "x:1"}]}}}}),
        );
        let s = &d["spec"];
        assert_eq!(s["replicas"], 1);
        assert_eq!(
            s["strategy"],
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}})
        );
        assert_eq!(s["revisionHistoryLimit"], 10);
        assert_eq!(s["progressDeadlineSeconds"], 600);
        let ps = &s["template"]["spec"];
        assert_eq!(ps["restartPolicy"], "Always");
        assert_eq!(ps["containers"][0]["imagePullPolicy"], "IfNotPresent");
        // Pod-only defaults stay off templates.
        assert!(ps.get("tolerations").is_none());
        assert!(ps.get("enableServiceLinks").is_none());
        assert!(ps.get("serviceAccountName").is_none());

        let r = defaulted(
            "apps",
            "Deployment",
            json!({"spec": {"strategy": {"type": "Recreate"}}}),
        );
        assert_eq!(r["spec"]["strategy"], json!({"type": "Recreate"}));
    }

    #[test]
    fn replication_controller_selector_and_labels_from_template() {
        let rc = defaulted(
            "",
            "ReplicationController",
            json!({"metadata": {"name": "web"},
                   "spec": {"template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}}),
        );
        assert_eq!(rc["spec"]["selector"], json!({"app": "web"}));
        assert_eq!(rc["metadata"]["labels"], json!({"app": "web"}));
        assert_eq!(rc["spec"]["replicas"], 1);
        assert_eq!(rc["spec"]["template"]["spec"]["restartPolicy"], "Always");
        // A selector and labels of its own are kept; zero replicas stay zero.
        let rc = defaulted(
            "",
            "ReplicationController",
            json!({"metadata": {"name": "web", "labels": {"team": "a"}},
                   "spec": {"replicas": 0, "selector": {"app": "web"},
                            "template": {"metadata": {"labels": {"app": "web", "v": "2"}}}}}),
        );
        assert_eq!(rc["spec"]["selector"], json!({"app": "web"}));
        assert_eq!(rc["metadata"]["labels"], json!({"team": "a"}));
        assert_eq!(rc["spec"]["replicas"], 0);
    }

    #[test]
    fn statefulset_daemonset_replicaset_defaults() {
        let s = defaulted(
            "apps",
            "StatefulSet",
            json!({"spec": {"volumeClaimTemplates": [{"spec": {}}]}}),
        );
        let sp = &s["spec"];
        assert_eq!(sp["replicas"], 1);
        assert_eq!(sp["podManagementPolicy"], "OrderedReady");
        assert_eq!(
            sp["updateStrategy"],
            json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 0}})
        );
        assert_eq!(sp["revisionHistoryLimit"], 10);
        assert_eq!(
            sp["persistentVolumeClaimRetentionPolicy"],
            json!({"whenDeleted": "Retain", "whenScaled": "Retain"})
        );
        assert_eq!(sp["volumeClaimTemplates"][0]["spec"]["volumeMode"], "Filesystem");

        let d = defaulted("apps", "DaemonSet", json!({"spec": {}}));
        assert_eq!(
            d["spec"]["updateStrategy"],
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}})
        );
        assert_eq!(d["spec"]["revisionHistoryLimit"], 10);
        let od = defaulted(
            "apps",
            "DaemonSet",
            json!({"spec": {"updateStrategy": {"type": "OnDelete"}}}),
        );
        assert_eq!(od["spec"]["updateStrategy"], json!({"type": "OnDelete"}));

        let r = defaulted("apps", "ReplicaSet", json!({"spec": {}}));
        assert_eq!(r["spec"]["replicas"], 1);
    }

    #[test]
    fn job_defaults_and_selector() {
        let j = defaulted(
            "batch",
            "Job",
            json!({"metadata": {"name": "pi", "uid": "u-1"},
                   "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "a", "image": "x"}]}}}}),
        );
        let s = &j["spec"];
        assert_eq!((&s["completions"], &s["parallelism"]), (&json!(1), &json!(1)));
        assert_eq!(s["backoffLimit"], 6);
        assert_eq!(s["completionMode"], "NonIndexed");
        assert_eq!(s["suspend"], false);
        assert_eq!(s["podReplacementPolicy"], "TerminatingOrFailed");
        assert_eq!(
            s["selector"],
            json!({"matchLabels": {"batch.kubernetes.io/controller-uid": "u-1"}})
        );
        let labels = &s["template"]["metadata"]["labels"];
        assert_eq!(labels["job-name"], "pi");
        assert_eq!(labels["batch.kubernetes.io/job-name"], "pi");
        assert_eq!(labels["controller-uid"], "u-1");
        assert_eq!(labels["batch.kubernetes.io/controller-uid"], "u-1");
        assert_eq!(&j["metadata"]["labels"], labels);

        let p = defaulted("batch", "Job", json!({"spec": {"parallelism": 3}}));
        assert!(p["spec"].get("completions").is_none());
        assert_eq!(p["spec"]["parallelism"], 3);

        let m = defaulted(
            "batch",
            "Job",
            json!({"metadata": {"name": "m", "uid": "u"},
                   "spec": {"manualSelector": true, "selector": {"matchLabels": {"a": "b"}}, "podFailurePolicy": {"rules": []}}}),
        );
        assert_eq!(m["spec"]["selector"], json!({"matchLabels": {"a": "b"}}));
        assert_eq!(m["spec"]["podReplacementPolicy"], "Failed");
    }

    #[test]
    fn cronjob_defaults() {
        let c = defaulted("batch", "CronJob", json!({"spec": {"schedule": "* * * * *"}}));
        let s = &c["spec"];
        assert_eq!(s["concurrencyPolicy"], "Allow");
        assert_eq!(s["suspend"], false);
        assert_eq!(s["successfulJobsHistoryLimit"], 3);
        assert_eq!(s["failedJobsHistoryLimit"], 1);
        assert_eq!(s["jobTemplate"]["spec"]["template"]["spec"]["restartPolicy"], "Always");
        assert!(s["jobTemplate"]["spec"].get("backoffLimit").is_none());
    }

    #[test]
    fn core_object_defaults() {
        let svc = defaulted(
            "",
            "Service",
            json!({"spec": {"ports": [{"port": 80}, {"port": 81, "targetPort": "http"}]}}),
        );
        let s = &svc["spec"];
        assert_eq!(s["type"], "ClusterIP");
        assert_eq!(s["sessionAffinity"], "None");
        assert_eq!(s["internalTrafficPolicy"], "Cluster");
        assert_eq!(s["ports"][0], json!({"port": 80, "protocol": "TCP", "targetPort": 80}));
        assert_eq!(s["ports"][1]["targetPort"], "http");
        assert!(s.get("externalTrafficPolicy").is_none());
        let np = defaulted("", "Service", json!({"spec": {"type": "NodePort"}}));
        assert_eq!(np["spec"]["externalTrafficPolicy"], "Cluster");

        let sec = defaulted("", "Secret", json!({"data": {}}));
        assert_eq!(sec["type"], "Opaque");

        let ns = defaulted("", "Namespace", json!({"metadata": {"name": "dev"}}));
        assert_eq!(ns["spec"]["finalizers"], json!(["kubernetes"]));
        assert_eq!(ns["status"]["phase"], "Active");
        assert_eq!(ns["metadata"]["labels"]["kubernetes.io/metadata.name"], "dev");
        let finalized = defaulted(
            "",
            "Namespace",
            json!({"metadata": {"name": "dev", "deletionTimestamp": "2026-01-01T00:00:00Z"}, "spec": {}, "status": {"phase": "Terminating"}}),
        );
        assert!(finalized["spec"].get("finalizers").is_none());
        assert_eq!(finalized["status"]["phase"], "Terminating");

        let node = defaulted("", "Node", json!({"status": {"capacity": {"cpu": "4"}}}));
        assert_eq!(node["status"]["allocatable"], json!({"cpu": "4"}));

        let pv = defaulted("", "PersistentVolume", json!({"spec": {}}));
        assert_eq!(pv["spec"]["persistentVolumeReclaimPolicy"], "Retain");
        let pvc = defaulted("", "PersistentVolumeClaim", json!({"spec": {}}));
        assert_eq!(pvc["spec"]["volumeMode"], "Filesystem");

        let pc = defaulted("scheduling.k8s.io", "PriorityClass", json!({"value": 5}));
        assert_eq!(pc["preemptionPolicy"], "PreemptLowerPriority");

        let sc = defaulted("storage.k8s.io", "StorageClass", json!({"provisioner": "p"}));
        assert_eq!(sc["reclaimPolicy"], "Delete");
        assert_eq!(sc["volumeBindingMode"], "Immediate");
        let sc = defaulted(
            "storage.k8s.io",
            "StorageClass",
            json!({"provisioner": "p", "reclaimPolicy": "Retain", "volumeBindingMode": "WaitForFirstConsumer"}),
        );
        assert_eq!(sc["reclaimPolicy"], "Retain");
        assert_eq!(sc["volumeBindingMode"], "WaitForFirstConsumer");
        let sc = defaulted(
            "storage.k8s.io",
            "StorageClass",
            json!({"reclaimPolicy": null, "volumeBindingMode": ""}),
        );
        assert_eq!(sc["reclaimPolicy"], "Delete");
        assert_eq!(
            sc["volumeBindingMode"], "",
            "only a missing mode is defaulted, as upstream's nil pointer"
        );
    }

    #[test]
    fn odd_shapes_never_panic() {
        for r in crate::registry::RESOURCES {
            for v in [
                json!(null),
                json!("x"),
                json!({"spec": "x"}),
                json!({"spec": {"containers": "x", "template": 5, "strategy": [], "ports": {}}}),
                json!({"spec": {"containers": [1, null, {"resources": {"limits": "x"}}], "tolerations": "x"}}),
                json!({"metadata": 4, "status": 1, "spec": {"template": {"spec": {"volumes": [{"secret": 1}]}}}}),
            ] {
                let mut v = v;
                apply_defaults(r, &mut v);
            }
        }
    }

    #[test]
    fn network_policy_defaults() {
        let p = defaulted(
            "networking.k8s.io",
            "NetworkPolicy",
            json!({"spec": {"podSelector": {}, "ingress": [{"ports": [{"port": 80}, {"port": 53, "protocol": "UDP"}]}]}}),
        );
        assert_eq!(p["spec"]["policyTypes"], json!(["Ingress"]));
        assert_eq!(p["spec"]["ingress"][0]["ports"][0]["protocol"], "TCP");
        assert_eq!(p["spec"]["ingress"][0]["ports"][1]["protocol"], "UDP");
        let p = defaulted(
            "networking.k8s.io",
            "NetworkPolicy",
            json!({"spec": {"podSelector": {}, "egress": [{"ports": [{"port": 443}]}]}}),
        );
        assert_eq!(p["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
        assert_eq!(p["spec"]["egress"][0]["ports"][0]["protocol"], "TCP");
        // Types given are kept.
        let p = defaulted(
            "networking.k8s.io",
            "NetworkPolicy",
            json!({"spec": {"podSelector": {}, "egress": [{}], "policyTypes": ["Egress"]}}),
        );
        assert_eq!(p["spec"]["policyTypes"], json!(["Egress"]));
    }

    #[test]
    fn ingress_class_parameters_default_to_cluster_scope() {
        let c = defaulted(
            "networking.k8s.io",
            "IngressClass",
            json!({"spec": {"controller": "a.io/b", "parameters": {"kind": "K", "name": "n"}}}),
        );
        assert_eq!(c["spec"]["parameters"]["scope"], "Cluster");
        let c = defaulted(
            "networking.k8s.io",
            "IngressClass",
            json!({"spec": {"controller": "a.io/b"}}),
        );
        assert!(c["spec"].get("parameters").is_none());
    }

    #[test]
    fn api_service_port_defaults_to_443() {
        let s = defaulted(
            "apiregistration.k8s.io",
            "APIService",
            json!({"spec": {"service": {"namespace": "ns", "name": "api"}}}),
        );
        assert_eq!(s["spec"]["service"]["port"], 443);
        let s = defaulted("apiregistration.k8s.io", "APIService", json!({"spec": {"group": "g"}}));
        assert!(s["spec"].get("service").is_none());
    }

    #[test]
    fn flow_control_defaults() {
        let fs = defaulted(
            "flowcontrol.apiserver.k8s.io",
            "FlowSchema",
            json!({"spec": {"priorityLevelConfiguration": {"name": "p"}}}),
        );
        assert_eq!(fs["spec"]["matchingPrecedence"], 1000);
        let pl = defaulted(
            "flowcontrol.apiserver.k8s.io",
            "PriorityLevelConfiguration",
            json!({"spec": {"type": "Limited", "limited": {"limitResponse": {"type": "Queue", "queuing": {"queues": 16}}}}}),
        );
        assert_eq!(
            pl["spec"]["limited"],
            json!({"nominalConcurrencyShares": 30, "lendablePercent": 0,
                "limitResponse": {"type": "Queue", "queuing": {"queues": 16, "handSize": 8, "queueLengthLimit": 50}}})
        );
        let exempt = defaulted(
            "flowcontrol.apiserver.k8s.io",
            "PriorityLevelConfiguration",
            json!({"spec": {"type": "Exempt"}}),
        );
        assert_eq!(
            exempt["spec"]["exempt"],
            json!({"nominalConcurrencyShares": 0, "lendablePercent": 0})
        );
    }

    #[test]
    fn csi_driver_defaults() {
        let d = defaulted("storage.k8s.io", "CSIDriver", json!({"metadata": {"name": "d"}}));
        assert_eq!(
            d["spec"],
            json!({"attachRequired": true, "podInfoOnMount": false, "storageCapacity": false,
                "fsGroupPolicy": "ReadWriteOnceWithFSType", "volumeLifecycleModes": ["Persistent"],
                "requiresRepublish": false, "seLinuxMount": false})
        );
        let d = defaulted(
            "storage.k8s.io",
            "CSIDriver",
            json!({"spec": {"attachRequired": false, "volumeLifecycleModes": ["Ephemeral"], "fsGroupPolicy": "File"}}),
        );
        assert_eq!(d["spec"]["attachRequired"], false);
        assert_eq!(d["spec"]["volumeLifecycleModes"], json!(["Ephemeral"]));
        assert_eq!(d["spec"]["fsGroupPolicy"], "File");
    }
}
