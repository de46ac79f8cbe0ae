//! Core objects other than pods: Service, Node, Secret, ConfigMap, PersistentVolumeClaim and
//! PriorityClass, as upstream's `pkg/apis/core/validation` and `pkg/apis/scheduling/validation`.

use std::collections::HashSet;

use serde_json::Value;

use super::meta::{is_dns1123_label, is_dns1123_subdomain, is_valid_label_value, validate_label_name, validate_labels};
use super::pod::{validate_port_num_or_name, validate_taint_effect};
use super::{
    Path, arr_at, diff_paths, duplicate, field, forbidden, int_at, invalid, invalid_str, not_supported, required,
    semantic_eq, str_at,
};
use crate::quantity::Quantity;
use crate::status::{FieldError, FieldErrorKind};
use crate::volume::ANN_BETA_STORAGE_CLASS;

/// upstream's `ValidateService` (the parts users hit), in its order.
pub(crate) fn validate_service(obj: &Value, old: Option<&Value>, errs: &mut Vec<FieldError>) {
    let spec = field(Some(obj), "spec");
    let p = Path::new("spec");
    let ty_v = field(spec, "type").cloned().unwrap_or(Value::String(String::new()));
    let ty = ty_v.as_str().unwrap_or("?");
    let headless = str_at(spec, "clusterIP") == "None";
    let ports = arr_at(spec, "ports");
    if ports.is_empty() && !headless && ty != "ExternalName" {
        errs.push(required(&p.child("ports"), ""));
    }
    if ty == "ExternalName" {
        if !arr_at(spec, "clusterIPs").is_empty() {
            errs.push(forbidden(
                &p.child("clusterIPs"),
                "may not be set for ExternalName services",
            ));
        }
        let name = str_at(spec, "externalName");
        let cname = name.strip_suffix('.').unwrap_or(name);
        if cname.is_empty() {
            errs.push(required(&p.child("externalName"), ""));
        } else {
            for m in is_dns1123_subdomain(cname) {
                errs.push(invalid_str(&p.child("externalName"), cname, &m));
            }
        }
    }
    let require_name = ports.len() > 1;
    let mut names = HashSet::new();
    for (i, port) in ports.iter().enumerate() {
        let pp = p.child("ports").index(i);
        let name = str_at(Some(port), "name");
        if require_name && name.is_empty() {
            errs.push(required(&pp.child("name"), ""));
        } else if !name.is_empty() {
            for m in is_dns1123_label(name) {
                errs.push(invalid_str(&pp.child("name"), name, &m));
            }
            if !names.insert(name.to_string()) {
                errs.push(FieldError::duplicate(
                    pp.child("name").as_str(),
                    &Value::String(name.into()),
                ));
            }
        }
        let pv = field(Some(port), "port").cloned().unwrap_or(Value::from(0));
        if !pv.as_i64().is_some_and(|n| (1..=65535).contains(&n)) {
            errs.push(invalid(
                &pp.child("port"),
                &pv,
                "must be between 1 and 65535, inclusive",
            ));
        }
        let proto = field(Some(port), "protocol")
            .cloned()
            .unwrap_or(Value::String(String::new()));
        match proto.as_str().unwrap_or("?") {
            "TCP" | "UDP" | "SCTP" => {}
            "" => errs.push(required(&pp.child("protocol"), "")),
            _ => errs.push(not_supported(&pp.child("protocol"), &proto, &["SCTP", "TCP", "UDP"])),
        }
        validate_port_num_or_name(field(Some(port), "targetPort"), &pp.child("targetPort"), errs);
    }
    if field(spec, "selector").is_some() {
        validate_labels(field(spec, "selector"), &p.child("selector"), errs);
    }
    let aff = field(spec, "sessionAffinity")
        .cloned()
        .unwrap_or(Value::String(String::new()));
    match aff.as_str().unwrap_or("?") {
        "None" | "ClientIP" => {}
        "" => errs.push(required(&p.child("sessionAffinity"), "")),
        _ => errs.push(not_supported(&p.child("sessionAffinity"), &aff, &["ClientIP", "None"])),
    }
    match ty {
        "ClusterIP" | "ExternalName" | "LoadBalancer" | "NodePort" => {}
        "" => errs.push(required(&p.child("type"), "")),
        _ => errs.push(not_supported(
            &p.child("type"),
            &ty_v,
            &["ClusterIP", "ExternalName", "LoadBalancer", "NodePort"],
        )),
    }
    for (i, port) in ports.iter().enumerate() {
        let pp = p.child("ports").index(i);
        let Some(np) = field(Some(port), "nodePort").filter(|n| n.as_i64() != Some(0)) else {
            continue;
        };
        if ty == "ClusterIP" {
            errs.push(forbidden(
                &pp.child("nodePort"),
                "may not be used when `type` is 'ClusterIP'",
            ));
        } else if !np.as_i64().is_some_and(|n| (1..=65535).contains(&n)) {
            errs.push(invalid(
                &pp.child("nodePort"),
                np,
                "must be between 1 and 65535, inclusive",
            ));
        }
    }
    // Duplicate (protocol, port) pairs.
    let mut seen = HashSet::new();
    for (i, port) in ports.iter().enumerate() {
        let proto = str_at(Some(port), "protocol").to_string();
        let num = int_at(Some(port), "port").unwrap_or(0);
        if !seen.insert((proto.clone(), num)) {
            errs.push(FieldError {
                kind: FieldErrorKind::Duplicate(format!(
                    "core.ServicePort{{Name:\"\", Protocol:{proto:?}, AppProtocol:(*string)(nil), Port:{num}, TargetPort:intstr.IntOrString{{Type:0, IntVal:0, StrVal:\"\"}}, NodePort:0}}"
                )),
                field: p.child("ports").index(i).as_str().to_string(),
                detail: String::new(),
            });
        }
    }
    if let Some(old) = old {
        let os = field(Some(old), "spec");
        let old_ip = str_at(os, "clusterIP");
        let new_ip = str_at(spec, "clusterIP");
        let external = str_at(os, "type") == "ExternalName" || ty == "ExternalName";
        if !old_ip.is_empty() && !external && !new_ip.is_empty() && new_ip != old_ip {
            errs.push(invalid_str(
                &p.child("clusterIPs").index(0),
                new_ip,
                "may not change once set",
            ));
        }
    }
}

/// Go's `%#v` of a `core.Taint` (duplicates are reported with it).
fn go_taint(t: &Value) -> String {
    format!(
        "core.Taint{{Key:{:?}, Value:{:?}, Effect:{:?}, TimeAdded:(*v1.Time)(nil)}}",
        str_at(Some(t), "key"),
        str_at(Some(t), "value"),
        str_at(Some(t), "effect"),
    )
}

/// Whether `s` is a CIDR of either family (upstream's `ParseCIDRSloppy` accepts host bits).
fn is_cidr(s: &str) -> Option<bool> {
    let (addr, prefix) = s.split_once('/')?;
    let prefix: u8 = prefix.parse().ok().filter(|_| !prefix.starts_with('+'))?;
    match addr.parse::<std::net::IpAddr>().ok()? {
        std::net::IpAddr::V4(_) => (prefix <= 32).then_some(true),
        std::net::IpAddr::V6(_) => (prefix <= 128).then_some(false),
    }
}

/// `spec.podCIDRs` as upstream's `ValidateNode`, and on update `ValidateNodeUpdate`'s rule that a
/// podCIDR is set once, from empty.
fn validate_pod_cidrs(spec: Option<&Value>, old: Option<&Value>, errs: &mut Vec<FieldError>) {
    let p = Path::new("spec").child("podCIDRs");
    let cidrs: Vec<&str> = arr_at(spec, "podCIDRs").iter().filter_map(Value::as_str).collect();
    let mut families = Vec::new();
    for (i, value) in cidrs.iter().enumerate() {
        match is_cidr(value) {
            Some(v4) => families.push(v4),
            None => errs.push(invalid_str(
                &p.index(i),
                value,
                "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)",
            )),
        }
    }
    if cidrs.len() > 1 {
        let dual = families.len() == 2 && families[0] != families[1];
        if !dual || cidrs.len() > 2 {
            let rendered = format!(
                "[{}]",
                cidrs.iter().map(|c| format!("{c:?}")).collect::<Vec<_>>().join(",")
            );
            errs.push(FieldError {
                kind: FieldErrorKind::Invalid(rendered),
                field: p.as_str().to_string(),
                detail: "may specify no more than one CIDR for each IP family".to_string(),
            });
        }
        let mut seen = HashSet::new();
        for (i, value) in cidrs.iter().enumerate() {
            if !seen.insert(*value) {
                errs.push(FieldError {
                    kind: FieldErrorKind::Duplicate(format!("{value:?}")),
                    field: p.index(i).as_str().to_string(),
                    detail: String::new(),
                });
            }
        }
    }
    let Some(old) = old else { return };
    let before: Vec<&str> = arr_at(field(Some(old), "spec"), "podCIDRs")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    if before.is_empty() {
        return;
    }
    let message = "node updates may not change podCIDR except from \"\" to valid";
    if before.len() != cidrs.len() {
        errs.push(forbidden(&p, message));
    } else {
        for (a, b) in before.iter().zip(&cidrs) {
            if a != b {
                errs.push(forbidden(&p, message));
            }
        }
    }
}

pub(crate) fn validate_node(obj: &Value, old: Option<&Value>, errs: &mut Vec<FieldError>) {
    let spec = field(Some(obj), "spec");
    validate_pod_cidrs(spec, old, errs);
    let p = Path::new("spec").child("taints");
    let mut seen: HashSet<(String, String)> = HashSet::new();
    for (i, t) in arr_at(spec, "taints").iter().enumerate() {
        let tp = p.index(i);
        let key = str_at(Some(t), "key");
        validate_label_name(key, &tp.child("key"), errs);
        let value = str_at(Some(t), "value");
        let msgs = is_valid_label_value(value);
        if !msgs.is_empty() {
            errs.push(invalid_str(&tp.child("value"), value, &msgs.join(";")));
        }
        validate_taint_effect(field(Some(t), "effect"), false, &tp.child("effect"), errs);
        let effect = str_at(Some(t), "effect");
        if !seen.insert((effect.to_string(), key.to_string())) {
            errs.push(FieldError {
                kind: FieldErrorKind::Duplicate(go_taint(t)),
                field: tp.as_str().to_string(),
                detail: "taints must be unique by key and effect pair".to_string(),
            });
        }
    }
}

/// upstream's `IsConfigMapKey`.
fn config_key_errors(key: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if key.len() > 253 {
        errs.push("must be no more than 253 characters".to_string());
    }
    if key.is_empty()
        || !key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        errs.push(super::meta::regex_error(
            "a valid config key must consist of alphanumeric characters, '-', '_' or '.'",
            "[-._a-zA-Z0-9]+",
            &["key.name", "KEY_NAME", "key-name"],
        ));
    }
    if key == "." {
        errs.push("must not be '.'".to_string());
    } else if key == ".." {
        errs.push("must not be '..'".to_string());
    } else if key.starts_with("..") {
        errs.push("must not start with '..'".to_string());
    }
    errs
}

fn validate_keys(map: Option<&Value>, p: &Path, errs: &mut Vec<FieldError>) {
    if let Some(m) = map.and_then(Value::as_object) {
        for k in m.keys() {
            for msg in config_key_errors(k) {
                errs.push(invalid_str(&p.key(k), k, &msg));
            }
        }
    }
}

/// Data may not change once an object is marked `immutable`.
fn validate_immutable_data(obj: &Value, old: Option<&Value>, keys: &[&str], errs: &mut Vec<FieldError>) {
    let Some(old) = old else { return };
    if field(Some(old), "immutable").and_then(Value::as_bool) != Some(true) {
        return;
    }
    if field(Some(obj), "immutable").and_then(Value::as_bool) != Some(true) {
        errs.push(forbidden(
            &Path::new("immutable"),
            "field is immutable when `immutable` is set",
        ));
    }
    for k in keys {
        if field(Some(obj), k) != field(Some(old), k) {
            errs.push(forbidden(&Path::new(k), "field is immutable when `immutable` is set"));
        }
    }
}

pub(crate) fn validate_secret(obj: &Value, old: Option<&Value>, errs: &mut Vec<FieldError>) {
    validate_keys(field(Some(obj), "data"), &Path::new("data"), errs);
    let ty = str_at(Some(obj), "type");
    let data = field(Some(obj), "data");
    let has = |k: &str| data.and_then(|d| d.get(k)).is_some();
    match ty {
        "kubernetes.io/service-account-token" => {
            let ann = field(field(Some(obj), "metadata"), "annotations");
            if ann.and_then(|a| a.get("kubernetes.io/service-account.name")).is_none() {
                errs.push(required(
                    &Path::new("metadata")
                        .child("annotations")
                        .key("kubernetes.io/service-account.name"),
                    "",
                ));
            }
        }
        "kubernetes.io/dockercfg" if !has(".dockercfg") => {
            errs.push(required(&Path::new("data").key(".dockercfg"), ""));
        }
        "kubernetes.io/dockerconfigjson" if !has(".dockerconfigjson") => {
            errs.push(required(&Path::new("data").key(".dockerconfigjson"), ""));
        }
        "kubernetes.io/basic-auth" if !has("username") && !has("password") => {
            errs.push(required(&Path::new("data").key("username"), ""));
            errs.push(required(&Path::new("data").key("password"), ""));
        }
        "kubernetes.io/ssh-auth" if !has("ssh-privatekey") => {
            errs.push(required(&Path::new("data").key("ssh-privatekey"), ""));
        }
        "kubernetes.io/tls" => {
            for k in ["tls.key", "tls.crt"] {
                if !has(k) {
                    errs.push(required(&Path::new("data").key(k), ""));
                }
            }
        }
        _ => {}
    }
    if let Some(old) = old {
        let old_ty = str_at(Some(old), "type");
        if !old_ty.is_empty() && old_ty != ty {
            errs.push(invalid_str(&Path::new("type"), ty, "field is immutable"));
        }
    }
    validate_immutable_data(obj, old, &["data"], errs);
}

pub(crate) fn validate_configmap(obj: &Value, old: Option<&Value>, errs: &mut Vec<FieldError>) {
    let data = field(Some(obj), "data");
    let binary = field(Some(obj), "binaryData");
    validate_keys(data, &Path::new("data"), errs);
    validate_keys(binary, &Path::new("binaryData"), errs);
    if let (Some(d), Some(b)) = (data.and_then(Value::as_object), binary.and_then(Value::as_object)) {
        for k in b.keys() {
            if d.contains_key(k) {
                errs.push(invalid_str(
                    &Path::new("data").key(k),
                    k,
                    "duplicate of key present in binaryData",
                ));
            }
        }
    }
    validate_immutable_data(obj, old, &["data", "binaryData"], errs);
}

pub(crate) fn validate_pvc(obj: &Value, old: Option<&Value>, errs: &mut Vec<FieldError>) {
    validate_pvc_spec(obj, errs);
    if let Some(old) = old {
        validate_pvc_update(obj, old, errs);
    }
}

fn validate_pvc_spec(obj: &Value, errs: &mut Vec<FieldError>) {
    let spec = field(Some(obj), "spec");
    let p = Path::new("spec");
    let modes = arr_at(spec, "accessModes");
    if modes.is_empty() {
        errs.push(required(&p.child("accessModes"), "at least 1 access mode is required"));
    }
    for m in modes {
        if !matches!(
            m.as_str(),
            Some("ReadWriteOnce" | "ReadOnlyMany" | "ReadWriteMany" | "ReadWriteOncePod")
        ) {
            errs.push(not_supported(
                &p.child("accessModes"),
                m,
                &["ReadOnlyMany", "ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod"],
            ));
        }
    }
    let storage = field(field(field(spec, "resources"), "requests"), "storage");
    let sp = p.child("resources").key("storage");
    match storage {
        None => errs.push(required(&sp, "")),
        Some(v) => match Quantity::from_json(v) {
            Err(e) => errs.push(invalid(&sp, v, &e.to_string())),
            Ok(q) if q.is_negative() => {
                errs.push(invalid_str(&sp, &q.to_string(), "must be greater than or equal to 0"))
            }
            Ok(q) if q.is_zero() => errs.push(invalid_str(&sp, &q.to_string(), "must be greater than zero")),
            Ok(_) => {}
        },
    }
    if let Some(vm) = field(spec, "volumeMode")
        && !matches!(vm.as_str(), Some("Block" | "Filesystem"))
    {
        errs.push(not_supported(&p.child("volumeMode"), vm, &["Block", "Filesystem"]));
    }
}

/// A claim's storage quantity at `pointer`; missing or unparsable is zero, as a Go map's missing
/// key is.
fn storage_at(obj: &Value, pointer: &str) -> Quantity {
    obj.pointer(pointer)
        .and_then(|v| Quantity::from_json(v).ok())
        .unwrap_or_default()
}

/// Upstream's `ValidatePersistentVolumeClaimUpdate` (RecoverVolumeExpansionFailure on, the
/// VolumeAttributesClass feature off, as 1.33 ships them): the spec stays as created except the
/// volume name (set once), a class given to a claim that had none, and the storage request of a
/// bound claim, which may not go down to its capacity.
fn validate_pvc_update(obj: &Value, old: &Value, errs: &mut Vec<FieldError>) {
    let new_spec = obj.get("spec").cloned().unwrap_or(Value::Null);
    let old_spec = old.get("spec").cloned().unwrap_or(Value::Null);
    let mut new_clone = new_spec.clone();
    let mut old_clone = old_spec.clone();
    let set = |v: &mut Value, key: &str, to: Option<&Value>| {
        if let Some(m) = v.as_object_mut() {
            match to.filter(|t| !t.is_null()) {
                Some(t) => m.insert(key.to_string(), t.clone()),
                None => m.remove(key),
            };
        }
    };
    // The PV binder names the volume once.
    if str_at(Some(&old_spec), "volumeName").is_empty() {
        set(&mut old_clone, "volumeName", new_spec.get("volumeName"));
    }
    let annotation = |v: &Value| -> Option<String> {
        v.pointer("/metadata/annotations")
            .and_then(|a| a.get(ANN_BETA_STORAGE_CLASS))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let (old_ann, new_ann) = (annotation(old), annotation(obj));
    let class = |spec: &Value| spec.get("storageClassName").filter(|v| !v.is_null()).cloned();
    let (old_sc, new_sc) = (class(&old_spec), class(&new_spec));
    let new_sc_str = new_sc.as_ref().and_then(Value::as_str);
    let from_annotation = old_ann.is_some()
        && old_sc.is_none()
        && new_sc_str.is_some_and(|n| Some(n) == old_ann.as_deref())
        && (new_ann.is_none() || new_ann == old_ann);
    if from_annotation {
        set(&mut new_clone, "storageClassName", None);
    } else {
        let (n, o) = (new_ann.clone().unwrap_or_default(), old_ann.clone().unwrap_or_default());
        if n != o {
            errs.push(invalid_str(
                &Path::new("metadata").child("annotations").child(ANN_BETA_STORAGE_CLASS),
                &n,
                "field is immutable",
            ));
        }
        let from_nil = new_sc.is_some() && old_sc.is_none() && (old_ann.is_none() || new_sc_str == old_ann.as_deref());
        if from_nil {
            set(&mut new_clone, "storageClassName", old_sc.as_ref());
        }
    }
    let bound = obj.pointer("/status/phase").and_then(Value::as_str) == Some("Bound");
    if bound && let Some(requests) = new_clone.pointer_mut("/resources/requests") {
        set(requests, "storage", old_spec.pointer("/resources/requests/storage"));
    }
    set(
        &mut new_clone,
        "volumeAttributesClassName",
        old_clone.get("volumeAttributesClassName"),
    );
    let old_size = storage_at(old, "/spec/resources/requests/storage");
    let new_size = storage_at(obj, "/spec/resources/requests/storage");
    let status_size = storage_at(old, "/status/capacity/storage");
    if !semantic_eq(&new_clone, &old_clone) {
        let mut diff = Vec::new();
        diff_paths("spec", &old_clone, &new_clone, &mut diff);
        errs.push(forbidden(
            &Path::new("spec"),
            &format!(
                "spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims\n{}",
                diff.join("\n")
            ),
        ));
    }
    // Below the previous request only down to what was asked before a failed expansion.
    if new_size < old_size && new_size <= status_size {
        errs.push(forbidden(
            &Path::new("spec").child("resources").child("requests").child("storage"),
            "field can not be less than status.capacity",
        ));
    }
    let mode = |spec: &Value| spec.get("volumeMode").filter(|v| !v.is_null()).cloned();
    if mode(&new_spec) != mode(&old_spec) {
        let shown = mode(&new_spec).unwrap_or(Value::String("null".into()));
        errs.push(invalid(&Path::new("volumeMode"), &shown, "field is immutable"));
    }
    if !semantic_eq(
        new_spec.get("volumeAttributesClassName").unwrap_or(&Value::Null),
        old_spec.get("volumeAttributesClassName").unwrap_or(&Value::Null),
    ) {
        errs.push(forbidden(
            &Path::new("spec").child("volumeAttributesClassName"),
            "update is forbidden when the VolumeAttributesClass feature gate is disabled",
        ));
    }
}

/// The largest priority a user-defined class may have (`HighestUserDefinablePriority`).
const HIGHEST_USER_PRIORITY: i64 = 1_000_000_000;

pub(crate) fn validate_priority_class(obj: &Value, old: Option<&Value>, errs: &mut Vec<FieldError>) {
    let name = str_at(field(Some(obj), "metadata"), "name");
    let system = name.starts_with("system-");
    if system {
        if name != "system-node-critical" && name != "system-cluster-critical" {
            errs.push(forbidden(
                &Path::new("metadata").child("name"),
                "priority class names with 'system-' prefix are reserved for system use only",
            ));
        }
    } else if field(Some(obj), "value")
        .and_then(Value::as_i64)
        .is_some_and(|v| v > HIGHEST_USER_PRIORITY)
    {
        errs.push(forbidden(
            &Path::new("value"),
            &format!("maximum allowed value of a user defined priority is {HIGHEST_USER_PRIORITY}"),
        ));
    }
    if let Some(pp) = field(Some(obj), "preemptionPolicy")
        && !matches!(pp.as_str(), Some("PreemptLowerPriority" | "Never"))
    {
        errs.push(not_supported(
            &Path::new("preemptionPolicy"),
            pp,
            &["PreemptLowerPriority", "Never"],
        ));
    }
    if let Some(old) = old {
        let (nv, ov) = (field(Some(obj), "value"), field(Some(old), "value"));
        if nv != ov {
            errs.push(forbidden(&Path::new("value"), "may not be changed in an update."));
        }
        let (np, op) = (
            field(Some(obj), "preemptionPolicy"),
            field(Some(old), "preemptionPolicy"),
        );
        if np != op {
            errs.push(invalid(
                &Path::new("preemptionPolicy"),
                np.unwrap_or(&Value::Null),
                "field is immutable",
            ));
        }
    }
}

// ---- resource quotas and limit ranges ----------------------------------------------------------

const STANDARD_QUOTA_RESOURCES: &[&str] = &[
    "cpu",
    "memory",
    "ephemeral-storage",
    "requests.cpu",
    "requests.memory",
    "requests.storage",
    "requests.ephemeral-storage",
    "limits.cpu",
    "limits.memory",
    "limits.ephemeral-storage",
    "pods",
    "services",
    "replicationcontrollers",
    "resourcequotas",
    "secrets",
    "persistentvolumeclaims",
    "configmaps",
    "services.nodeports",
    "services.loadbalancers",
];
const INTEGER_RESOURCES: &[&str] = &[
    "pods",
    "services",
    "replicationcontrollers",
    "resourcequotas",
    "secrets",
    "configmaps",
    "persistentvolumeclaims",
    "services.nodeports",
    "services.loadbalancers",
];
const QUOTA_SCOPES: &[&str] = &[
    "Terminating",
    "NotTerminating",
    "BestEffort",
    "NotBestEffort",
    "PriorityClass",
    "CrossNamespacePodAffinity",
    "VolumeAttributesClass",
];
/// The resources a scope may limit (upstream's `podObjectCountQuotaResources` and
/// `podComputeQuotaResources`; BestEffort quotas only count pods).
const SCOPED_POD_COUNT: &[&str] = &["pods"];
const SCOPED_POD_COMPUTE: &[&str] = &[
    "cpu",
    "memory",
    "limits.cpu",
    "limits.memory",
    "requests.cpu",
    "requests.memory",
];

/// upstream's `ValidateResourceQuotaResourceName` and `ValidateResourceQuantityValue` for one
/// entry of `spec.hard` or `status.hard`/`status.used`.
fn validate_quota_entry(k: &str, v: &Value, p: &Path, errs: &mut Vec<FieldError>) {
    let ep = p.key(k);
    if !k.contains('/')
        && !STANDARD_QUOTA_RESOURCES.contains(&k)
        && !k.starts_with("hugepages-")
        && !k.starts_with("requests.hugepages-")
    {
        errs.push(invalid_str(&ep, k, "must be a standard resource for quota"));
        return;
    }
    let Ok(q) = Quantity::from_json(v) else { return };
    if q.is_negative() {
        errs.push(invalid_str(&ep, &q.to_string(), "must be greater than or equal to 0"));
    }
    if INTEGER_RESOURCES.contains(&k) && q.milli_value() % 1000 != 0 {
        errs.push(invalid_str(&ep, &q.to_string(), "must be an integer"));
    }
}

/// upstream's `ValidateResourceQuota` (and `ValidateResourceQuotaUpdate`: scopes are immutable).
pub(crate) fn validate_resource_quota(obj: &Value, old: Option<&Value>, errs: &mut Vec<FieldError>) {
    let spec = field(Some(obj), "spec");
    let sp = Path::new("spec");
    let hard = field(spec, "hard").and_then(Value::as_object);
    for (k, v) in hard.into_iter().flatten() {
        validate_quota_entry(k, v, &sp.child("hard"), errs);
    }
    let status = field(Some(obj), "status");
    for f in ["hard", "used"] {
        for (k, v) in field(status, f).and_then(Value::as_object).into_iter().flatten() {
            validate_quota_entry(k, v, &Path::new("status").child(f), errs);
        }
    }
    let scopes: Vec<&str> = arr_at(spec, "scopes").iter().filter_map(Value::as_str).collect();
    let mut all: Vec<&str> = scopes.clone();
    for e in arr_at(field(spec, "scopeSelector"), "matchExpressions") {
        all.push(str_at(Some(e), "scopeName"));
    }
    for s in &scopes {
        if !QUOTA_SCOPES.contains(s) {
            errs.push(invalid_str(&sp.child("scopes"), s, "unsupported scope"));
        }
    }
    for (i, e) in arr_at(field(spec, "scopeSelector"), "matchExpressions")
        .iter()
        .enumerate()
    {
        let ep = sp.child("scopeSelector").child("matchExpressions").index(i);
        let name = str_at(Some(e), "scopeName");
        if !QUOTA_SCOPES.contains(&name) {
            errs.push(invalid_str(&ep.child("scopeName"), name, "unsupported scope"));
        }
        let op = str_at(Some(e), "operator");
        let values = arr_at(Some(e), "values");
        match op {
            "In" | "NotIn" if values.is_empty() => errs.push(required(
                &ep.child("values"),
                "must be at least one value when `operator` is 'In' or 'NotIn' for scope selector",
            )),
            "Exists" | "DoesNotExist" if !values.is_empty() => errs.push(invalid(
                &ep.child("values"),
                &Value::Array(values.to_vec()),
                "must be no value when `operator` is 'Exist' or 'DoesNotExist' for scope selector",
            )),
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            _ => errs.push(not_supported(
                &ep.child("operator"),
                &Value::String(op.to_string()),
                &["DoesNotExist", "Exists", "In", "NotIn"],
            )),
        }
    }
    // upstream's `validateScopedResourceSelectorRequirement` and `ValidateResourceQuotaSpec`:
    // scopes that contradict each other, and resources a scope cannot limit.
    let has = |s: &str| all.contains(&s);
    if (has("Terminating") && has("NotTerminating")) || (has("BestEffort") && has("NotBestEffort")) {
        errs.push(invalid_str(
            &sp.child("scopes"),
            &format!("[{}]", all.join(" ")),
            "conflicting scopes",
        ));
    }
    if !all.is_empty() {
        for k in hard.into_iter().flat_map(|h| h.keys()) {
            let allowed = all.iter().all(|s| match *s {
                "BestEffort" => SCOPED_POD_COUNT.contains(&k.as_str()),
                "Terminating" | "NotTerminating" | "NotBestEffort" | "PriorityClass" => {
                    SCOPED_POD_COUNT.contains(&k.as_str()) || SCOPED_POD_COMPUTE.contains(&k.as_str())
                }
                "CrossNamespacePodAffinity" => SCOPED_POD_COUNT.contains(&k.as_str()),
                _ => true,
            });
            if !allowed {
                errs.push(invalid_str(
                    &sp.child("hard").key(k),
                    k,
                    "unsupported scope applied to resource",
                ));
            }
        }
    }
    if let Some(old) = old
        && !semantic_eq(
            field(field(Some(obj), "spec"), "scopes").unwrap_or(&Value::Null),
            field(field(Some(old), "spec"), "scopes").unwrap_or(&Value::Null),
        )
    {
        errs.push(invalid(
            &sp.child("scopes"),
            field(spec, "scopes").unwrap_or(&Value::Null),
            "field is immutable",
        ));
    }
}

/// upstream's `ValidateLimitRange`.
pub(crate) fn validate_limit_range(obj: &Value, errs: &mut Vec<FieldError>) {
    let lp = Path::new("spec").child("limits");
    let mut seen = HashSet::new();
    for (i, item) in arr_at(field(Some(obj), "spec"), "limits").iter().enumerate() {
        let ip = lp.index(i);
        let ty = str_at(Some(item), "type");
        if !seen.insert(ty.to_string()) {
            errs.push(duplicate(&ip.child("type"), &Value::String(ty.to_string())));
        }
        let list = |f: &str| crate::quota::list_from(item.get(f));
        let (min, max, default, request, ratio) = (
            list("min"),
            list("max"),
            list("default"),
            list("defaultRequest"),
            list("maxLimitRequestRatio"),
        );
        for (f, l) in [
            ("max", &max),
            ("min", &min),
            ("default", &default),
            ("defaultRequest", &request),
            ("maxLimitRequestRatio", &ratio),
        ] {
            for (k, q) in l {
                if q.is_negative() {
                    errs.push(invalid_str(
                        &ip.child(f).key(k),
                        &q.to_string(),
                        "must be greater than or equal to 0",
                    ));
                }
            }
        }
        if ty == "Pod" {
            if !default.is_empty() {
                errs.push(forbidden(
                    &ip.child("default"),
                    "may not be specified when `type` is 'Pod'",
                ));
            }
            if !request.is_empty() {
                errs.push(forbidden(
                    &ip.child("defaultRequest"),
                    "may not be specified when `type` is 'Pod'",
                ));
            }
        }
        if ty == "PersistentVolumeClaim" && !min.contains_key("storage") && !max.contains_key("storage") {
            errs.push(required(
                &ip.child("limits"),
                "either minimum or maximum storage value is required, but neither was provided",
            ));
        }
        let keys: std::collections::BTreeSet<&String> = min
            .keys()
            .chain(max.keys())
            .chain(default.keys())
            .chain(request.keys())
            .chain(ratio.keys())
            .collect();
        for k in keys {
            let (mn, mx, d, r, rt) = (min.get(k), max.get(k), default.get(k), request.get(k), ratio.get(k));
            let mut bad =
                |f: &str, q: &Quantity, why: String| errs.push(invalid_str(&ip.child(f).key(k), &q.to_string(), &why));
            if let (Some(mn), Some(mx)) = (mn, mx)
                && mn > mx
            {
                bad("min", mn, format!("min value {mn} is greater than max value {mx}"));
            }
            if let (Some(r), Some(mn)) = (r, mn)
                && mn > r
            {
                bad(
                    "defaultRequest",
                    r,
                    format!("min value {mn} is greater than default request value {r}"),
                );
            }
            if let (Some(r), Some(mx)) = (r, mx)
                && r > mx
            {
                bad(
                    "defaultRequest",
                    r,
                    format!("default request value {r} is greater than max value {mx}"),
                );
            }
            if let (Some(r), Some(d)) = (r, d)
                && r > d
            {
                bad(
                    "defaultRequest",
                    r,
                    format!("default request value {r} is greater than default limit value {d}"),
                );
            }
            if let (Some(d), Some(mn)) = (d, mn)
                && mn > d
            {
                bad(
                    "default",
                    d,
                    format!("min value {mn} is greater than default value {d}"),
                );
            }
            if let (Some(d), Some(mx)) = (d, mx)
                && d > mx
            {
                bad(
                    "default",
                    d,
                    format!("default value {d} is greater than max value {mx}"),
                );
            }
            if let Some(rt) = rt {
                if *rt < Quantity::new(1, crate::quantity::Format::DecimalSI) {
                    bad("maxLimitRequestRatio", rt, format!("ratio {rt} is less than 1"));
                }
                if let (Some(mn), Some(mx)) = (mn, mx)
                    && !mn.is_zero()
                {
                    #[allow(clippy::cast_precision_loss)]
                    let limit = mx.milli_value() as f64 / mn.milli_value() as f64;
                    #[allow(clippy::cast_precision_loss)]
                    let value = rt.milli_value() as f64 / 1000.0;
                    if value > limit {
                        bad(
                            "maxLimitRequestRatio",
                            rt,
                            format!("ratio {rt} is greater than max/min = {limit:.6}"),
                        );
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::validation::test_util::{errors, errors_defaulted};
    use serde_json::{Value, json};

    fn svc(spec: Value) -> Value {
        json!({"metadata": {"name": "web", "namespace": "default"}, "spec": spec})
    }

    #[test]
    fn services() {
        assert!(
            errors_defaulted(
                "",
                "Service",
                &svc(json!({"selector": {"app": "web"}, "ports": [{"port": 80}]})),
                None
            )
            .is_empty()
        );
        assert_eq!(
            errors_defaulted("", "Service", &svc(json!({})), None),
            vec!["spec.ports: Required value"]
        );
        let e = errors_defaulted(
            "",
            "Service",
            &svc(
                json!({"type": "Magic", "ports": [{"port": 0, "name": "a"}, {"port": 81, "protocol": "ICMP", "targetPort": "Bad_Name"}, {"port": 82, "name": "a"}]}),
            ),
            None,
        );
        assert_eq!(
            e,
            vec![
                "spec.ports[0].port: Invalid value: 0: must be between 1 and 65535, inclusive",
                "spec.ports[0].targetPort: Invalid value: 0: must be between 1 and 65535, inclusive",
                "spec.ports[1].name: Required value",
                "spec.ports[1].protocol: Unsupported value: \"ICMP\": supported values: \"SCTP\", \"TCP\", \"UDP\"",
                "spec.ports[1].targetPort: Invalid value: \"Bad_Name\": must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)",
                "spec.ports[2].name: Duplicate value: \"a\"",
                "spec.type: Unsupported value: \"Magic\": supported values: \"ClusterIP\", \"ExternalName\", \"LoadBalancer\", \"NodePort\"",
            ]
        );
        let e = errors_defaulted(
            "",
            "Service",
            &svc(json!({"ports": [{"port": 80, "name": "a"}, {"port": 80, "name": "b"}]})),
            None,
        );
        assert_eq!(
            e,
            vec![
                "spec.ports[1]: Duplicate value: core.ServicePort{Name:\"\", Protocol:\"TCP\", AppProtocol:(*string)(nil), Port:80, TargetPort:intstr.IntOrString{Type:0, IntVal:0, StrVal:\"\"}, NodePort:0}"
            ]
        );
        let e = errors_defaulted(
            "",
            "Service",
            &svc(json!({"ports": [{"port": 80, "nodePort": 30000}]})),
            None,
        );
        assert_eq!(
            e,
            vec!["spec.ports[0].nodePort: Forbidden: may not be used when `type` is 'ClusterIP'"]
        );
        let e = errors_defaulted("", "Service", &svc(json!({"type": "ExternalName"})), None);
        assert_eq!(e, vec!["spec.externalName: Required value"]);
        let old = svc(json!({"clusterIP": "10.0.0.1", "ports": [{"port": 80}]}));
        let new = svc(json!({"clusterIP": "10.0.0.2", "ports": [{"port": 80}]}));
        assert_eq!(
            errors_defaulted("", "Service", &new, Some(&old)),
            vec!["spec.clusterIPs[0]: Invalid value: \"10.0.0.2\": may not change once set"]
        );
    }

    #[test]
    fn node_taints() {
        let node = json!({"metadata": {"name": "n1"}, "spec": {"taints": [
            {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"},
            {"key": "dedicated", "value": "other", "effect": "NoSchedule"},
            {"key": "bad key", "effect": "Sometimes"},
            {"key": "k", "value": "-x"},
            {"key": "dedicated", "value": "gpu", "effect": "NoExecute"}
        ]}});
        let e = errors("", "Node", &node, None);
        assert_eq!(
            e[0],
            "spec.taints[1]: Duplicate value: core.Taint{Key:\"dedicated\", Value:\"other\", Effect:\"NoSchedule\", TimeAdded:(*v1.Time)(nil)}: taints must be unique by key and effect pair"
        );
        assert!(e[1].starts_with("spec.taints[2].key: Invalid value: \"bad key\": name part must consist of"));
        assert_eq!(
            e[2],
            "spec.taints[2].effect: Unsupported value: \"Sometimes\": supported values: \"NoSchedule\", \"PreferNoSchedule\", \"NoExecute\""
        );
        assert!(e[3].starts_with("spec.taints[3].value: Invalid value: \"-x\": a valid label must be"));
        assert_eq!(e[4], "spec.taints[3].effect: Required value");
        assert_eq!(e.len(), 5);
    }

    #[test]
    fn a_node_pod_cidr_is_valid_and_set_once() {
        let with = |cidrs: Value| json!({"metadata": {"name": "n"}, "spec": {"podCIDRs": cidrs}});
        assert!(errors("", "Node", &with(json!(["10.244.0.0/24"])), None).is_empty());
        assert!(errors("", "Node", &with(json!(["10.244.0.0/24", "fd00::/64"])), None).is_empty());
        let e = errors("", "Node", &with(json!(["10.244.0.0/33"])), None);
        assert_eq!(
            e,
            [
                "spec.podCIDRs[0]: Invalid value: \"10.244.0.0/33\": must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)"
            ]
        );
        let e = errors("", "Node", &with(json!(["10.244.0.0/24", "10.244.0.0/24"])), None);
        assert_eq!(
            e,
            [
                "spec.podCIDRs: Invalid value: [\"10.244.0.0/24\",\"10.244.0.0/24\"]: may specify no more than one CIDR for each IP family",
                "spec.podCIDRs[1]: Duplicate value: \"10.244.0.0/24\""
            ]
        );
        // Set from empty: allowed; changed or removed once set: forbidden.
        let none = json!({"metadata": {"name": "n"}, "spec": {}});
        let set = with(json!(["10.244.0.0/24"]));
        assert!(errors("", "Node", &set, Some(&none)).is_empty());
        assert!(errors("", "Node", &set, Some(&set)).is_empty());
        let forbidden = ["spec.podCIDRs: Forbidden: node updates may not change podCIDR except from \"\" to valid"];
        assert_eq!(
            errors("", "Node", &with(json!(["10.244.1.0/24"])), Some(&set)),
            forbidden
        );
        assert_eq!(errors("", "Node", &none, Some(&set)), forbidden);
        // podCIDR alone is podCIDRs' first element, as upstream's conversion makes it.
        let single = json!({"metadata": {"name": "n"}, "spec": {"podCIDR": "10.244.1.0/24"}});
        assert_eq!(errors_defaulted("", "Node", &single, Some(&set)), forbidden);
    }

    #[test]
    fn secrets_and_configmaps() {
        let e = errors(
            "",
            "Secret",
            &json!({"metadata": {"name": "s", "namespace": "d"}, "type": "Opaque", "data": {"bad key": "eA=="}}),
            None,
        );
        assert_eq!(
            e,
            vec![
                "data[bad key]: Invalid value: \"bad key\": a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')"
            ]
        );
        let e = errors(
            "",
            "Secret",
            &json!({"metadata": {"name": "s", "namespace": "d"}, "type": "kubernetes.io/tls", "data": {"tls.crt": ""}}),
            None,
        );
        assert_eq!(e, vec!["data[tls.key]: Required value"]);
        let old = json!({"metadata": {"name": "s", "namespace": "d"}, "type": "Opaque", "immutable": true, "data": {"a": "eA=="}});
        let mut new = old.clone();
        new["data"]["a"] = json!("eQ==");
        new["type"] = json!("other");
        assert_eq!(
            errors("", "Secret", &new, Some(&old)),
            vec![
                "type: Invalid value: \"other\": field is immutable",
                "data: Forbidden: field is immutable when `immutable` is set",
            ]
        );
        let e = errors(
            "",
            "ConfigMap",
            &json!({"metadata": {"name": "c", "namespace": "d"}, "data": {"k": "v"}, "binaryData": {"k": "eA=="}}),
            None,
        );
        assert_eq!(
            e,
            vec!["data[k]: Invalid value: \"k\": duplicate of key present in binaryData"]
        );
    }

    #[test]
    fn pvc_updates_keep_the_spec_but_let_bound_claims_grow() {
        let pvc = |size: &str, phase: &str, capacity: &str| {
            json!({
                "metadata": {"name": "c", "namespace": "d", "resourceVersion": "1"},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "local-path",
                         "resources": {"requests": {"storage": size}}},
                "status": {"phase": phase, "capacity": {"storage": capacity}},
            })
        };
        let e = |new: &Value, old: &Value| errors_defaulted("", "PersistentVolumeClaim", new, Some(old));
        let bound = pvc("1Gi", "Bound", "1Gi");
        // Growing a bound claim, and asking the same in other words, are fine.
        assert!(e(&pvc("2Gi", "Bound", "1Gi"), &bound).is_empty());
        assert!(e(&pvc("1024Mi", "Bound", "1Gi"), &bound).is_empty());
        // Shrinking to the capacity or below is not.
        assert_eq!(
            e(&pvc("500Mi", "Bound", "1Gi"), &bound),
            vec!["spec.resources.requests.storage: Forbidden: field can not be less than status.capacity"]
        );
        // Back down after a failed expansion, to above the capacity, is.
        assert!(e(&pvc("1500Mi", "Bound", "1Gi"), &pvc("2Gi", "Bound", "1Gi")).is_empty());
        // An unbound claim's request is part of its fixed spec.
        let pending = pvc("1Gi", "Pending", "0");
        let errs = e(&pvc("2Gi", "Pending", "0"), &pending);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(
            errs[0].starts_with(
                "spec: Forbidden: spec is immutable after creation except resources.requests and \
                 volumeAttributesClassName for bound claims\n"
            ),
            "{errs:?}"
        );
        assert!(errs[0].contains("spec.resources.requests.storage"), "{errs:?}");
        // The volume name is set once; the class only where there was none.
        let mut named = pending.clone();
        named["spec"]["volumeName"] = json!("pv1");
        assert!(e(&named, &pending).is_empty());
        let mut renamed = named.clone();
        renamed["spec"]["volumeName"] = json!("pv2");
        assert_eq!(e(&renamed, &named).len(), 1);
        let mut classless = pending.clone();
        classless["spec"].as_object_mut().unwrap().remove("storageClassName");
        assert!(e(&pending, &classless).is_empty());
        let mut other_class = pending.clone();
        other_class["spec"]["storageClassName"] = json!("fast");
        assert_eq!(e(&other_class, &pending).len(), 1);
        // The volume mode and the beta class annotation are immutable.
        let mut block = bound.clone();
        block["spec"]["volumeMode"] = json!("Block");
        let errs = e(&block, &bound);
        assert_eq!(
            errs.last().map(String::as_str),
            Some("volumeMode: Invalid value: \"Block\": field is immutable")
        );
        let mut annotated = bound.clone();
        annotated["metadata"]["annotations"] = json!({"volume.beta.kubernetes.io/storage-class": "fast"});
        assert_eq!(
            e(&annotated, &bound),
            vec![
                "metadata.annotations.volume.beta.kubernetes.io/storage-class: Invalid value: \"fast\": field is immutable"
            ]
        );
    }

    #[test]
    fn pvcs_and_priority_classes() {
        let e = errors_defaulted(
            "",
            "PersistentVolumeClaim",
            &json!({"metadata": {"name": "c", "namespace": "d"}, "spec": {}}),
            None,
        );
        assert_eq!(
            e,
            vec![
                "spec.accessModes: Required value: at least 1 access mode is required",
                "spec.resources[storage]: Required value",
            ]
        );
        let ok = json!({"metadata": {"name": "c", "namespace": "d"}, "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}});
        assert!(errors_defaulted("", "PersistentVolumeClaim", &ok, None).is_empty());
        let e = errors_defaulted(
            "scheduling.k8s.io",
            "PriorityClass",
            &json!({"metadata": {"name": "high"}, "value": 2_000_000_000}),
            None,
        );
        assert_eq!(
            e,
            vec!["value: Forbidden: maximum allowed value of a user defined priority is 1000000000"]
        );
    }
}
