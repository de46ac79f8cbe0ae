//! Pods and pod specs, as upstream's `ValidatePodCreate`, `ValidatePodSpec` and
//! `ValidatePodUpdate` for the rules users hit.

use std::collections::HashSet;

use serde_json::Value;

use super::meta::{is_dns1123_label, is_dns1123_subdomain, is_valid_label_value, validate_label_name, validate_labels};
use super::{
    Path, arr_at, diff_paths, duplicate, field, forbidden, int_at, invalid, invalid_raw, invalid_str, nonnegative,
    not_supported, required, semantic_eq, str_at,
};
use crate::defaults::VOLUME_SOURCES;
use crate::quantity::Quantity;
use crate::status::FieldError;

const UPDATABLE_POD_SPEC_FIELDS: &[&str] = &[
    "`spec.containers[*].image`",
    "`spec.initContainers[*].image`",
    "`spec.activeDeadlineSeconds`",
    "`spec.tolerations` (only additions to existing tolerations)",
    "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)",
];

pub(crate) fn validate_pod(obj: &Value, old: Option<&Value>, errs: &mut Vec<FieldError>) {
    let spec = field(Some(obj), "spec");
    let sp = Path::new("spec");
    match old {
        Some(old) => validate_pod_update(spec, field(Some(old), "spec"), errs),
        // upstream's ValidatePodCreate: ephemeral containers come only through their subresource.
        None if !arr_at(spec, "ephemeralContainers").is_empty() => {
            errs.push(forbidden(&sp.child("ephemeralContainers"), "cannot be set on create"));
        }
        None => {}
    }
    validate_pod_spec(spec, &sp, errs);
}

/// upstream's `ValidatePodEphemeralContainersUpdate` (the `ephemeralcontainers` subresource):
/// the pod spec as a whole, then existing ephemeral containers neither removed nor changed.
pub(crate) fn validate_pod_ephemeral_containers_update(obj: &Value, old: &Value, errs: &mut Vec<FieldError>) {
    let annotations = field(field(Some(old), "metadata"), "annotations");
    if field(annotations, "kubernetes.io/config.mirror").is_some() {
        errs.clear();
        errs.push(forbidden(
            &Path::new(""),
            "static pods do not support ephemeral containers",
        ));
        return;
    }
    let spec = field(Some(obj), "spec");
    validate_pod_spec(spec, &Path::new("spec"), errs);
    let sp = Path::new("spec").child("ephemeralContainers");
    let new_list = arr_at(spec, "ephemeralContainers");
    for o in arr_at(field(Some(old), "spec"), "ephemeralContainers") {
        let name = str_at(Some(o), "name");
        match new_list.iter().find(|n| str_at(Some(n), "name") == name) {
            None => errs.push(forbidden(
                &sp,
                &format!("existing ephemeral containers \"{name}\" may not be removed\n"),
            )),
            Some(n) if !semantic_eq(n, o) => {
                let mut diff = Vec::new();
                diff_paths("", o, n, &mut diff);
                errs.push(forbidden(
                    &sp,
                    &format!(
                        "existing ephemeral containers \"{name}\" may not be changed\n{}",
                        diff.join("\n")
                    ),
                ));
            }
            Some(_) => {}
        }
    }
}

/// The fields an ephemeral container may set (upstream's `allowedEphemeralContainerFields`);
/// the rest (ports, probes, lifecycle, resources, ...) are for the pod's own containers.
const ALLOWED_EPHEMERAL_FIELDS: &[&str] = &[
    "name",
    "image",
    "command",
    "args",
    "workingDir",
    "env",
    "envFrom",
    "volumeMounts",
    "volumeDevices",
    "terminationMessagePath",
    "terminationMessagePolicy",
    "imagePullPolicy",
    "securityContext",
    "stdin",
    "stdinOnce",
    "tty",
    "targetContainerName",
];

/// upstream's `validateEphemeralContainers`.
fn validate_ephemeral_containers(
    spec: Option<&Value>,
    p: &Path,
    volumes: &HashSet<String>,
    errs: &mut Vec<FieldError>,
) {
    let others: HashSet<&str> = arr_at(spec, "containers")
        .iter()
        .chain(arr_at(spec, "initContainers"))
        .map(|c| str_at(Some(c), "name"))
        .collect();
    let mut names: HashSet<String> = others.iter().map(|n| n.to_string()).collect();
    for (i, c) in arr_at(spec, "ephemeralContainers").iter().enumerate() {
        let ep = p.index(i);
        // Names are checked against every container of the pod by validate_container.
        validate_container_common(c, &ep, volumes, &mut names, errs);
        let target = str_at(Some(c), "targetContainerName");
        if !target.is_empty() && !others.contains(target) {
            errs.push(FieldError::not_found(
                ep.child("targetContainerName").as_str(),
                &Value::String(target.to_string()),
            ));
        }
        if let Some(m) = c.as_object() {
            for (k, v) in m {
                if !ALLOWED_EPHEMERAL_FIELDS.contains(&k.as_str()) && !is_zero(v) {
                    errs.push(forbidden(&ep.child(k), "cannot be set for an Ephemeral Container"));
                }
            }
        }
        for (j, m) in arr_at(Some(c), "volumeMounts").iter().enumerate() {
            for key in ["subPath", "subPathExpr"] {
                if !str_at(Some(m), key).is_empty() {
                    errs.push(forbidden(
                        &ep.child("volumeMounts").index(j).child(key),
                        "cannot be set for an Ephemeral Container",
                    ));
                }
            }
        }
    }
}

/// Go's zero value test of upstream's allow-list check (absent, null, empty).
fn is_zero(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Number(n) => n.as_f64() == Some(0.0),
        // A struct is zero when every field is (kubectl sends `resources: {}`).
        Value::Object(m) => m.values().all(is_zero),
    }
}

/// upstream's `ValidatePodTemplateSpec`: template labels and annotations, then the pod spec.
pub(crate) fn validate_pod_template(template: Option<&Value>, p: &Path, errs: &mut Vec<FieldError>) {
    validate_template_metadata(template, p, errs);
    validate_pod_spec(field(template, "spec"), &p.child("spec"), errs);
    if !arr_at(field(template, "spec"), "ephemeralContainers").is_empty() {
        errs.push(forbidden(
            &p.child("spec").child("ephemeralContainers"),
            "ephemeral containers not allowed in pod template",
        ));
    }
}

/// A template's labels and annotations; upstream reports them at `<template>.labels`, as its
/// metadata is embedded.
pub(crate) fn validate_template_metadata(template: Option<&Value>, p: &Path, errs: &mut Vec<FieldError>) {
    let meta = field(template, "metadata");
    validate_labels(field(meta, "labels"), &p.child("labels"), errs);
    if let Some(m) = field(meta, "annotations").and_then(Value::as_object) {
        for k in m.keys() {
            for msg in super::meta::is_qualified_name(&k.to_lowercase()) {
                errs.push(invalid_str(&p.child("annotations"), k, &msg));
            }
        }
    }
}

/// upstream's `ValidatePodSpec`.
pub(crate) fn validate_pod_spec(spec: Option<&Value>, p: &Path, errs: &mut Vec<FieldError>) {
    let volumes = validate_volumes(spec, &p.child("volumes"), errs);
    let mut names = HashSet::new();
    let containers = arr_at(spec, "containers");
    if containers.is_empty() {
        errs.push(required(&p.child("containers"), ""));
    }
    for (i, c) in containers.iter().enumerate() {
        let cp = p.child("containers").index(i);
        validate_container(c, &cp, &volumes, &mut names, false, errs);
    }
    for (i, c) in arr_at(spec, "initContainers").iter().enumerate() {
        let cp = p.child("initContainers").index(i);
        validate_container(c, &cp, &volumes, &mut names, true, errs);
    }
    validate_ephemeral_containers(spec, &p.child("ephemeralContainers"), &volumes, errs);
    validate_restart_policy(spec, &p.child("restartPolicy"), errs);
    if let Some(v) = field(spec, "dnsPolicy") {
        match v.as_str().unwrap_or("") {
            "ClusterFirstWithHostNet" | "ClusterFirst" | "Default" | "None" => {}
            "" => errs.push(required(&p.child("dnsPolicy"), "")),
            _ => errs.push(not_supported(
                &p.child("dnsPolicy"),
                v,
                &["ClusterFirstWithHostNet", "ClusterFirst", "Default", "None"],
            )),
        }
    }
    validate_labels(field(spec, "nodeSelector"), &p.child("nodeSelector"), errs);
    if let Some(aff) = field(spec, "affinity") {
        validate_affinity(aff, &p.child("affinity"), errs);
    }
    validate_topology_spread(
        arr_at(spec, "topologySpreadConstraints"),
        &p.child("topologySpreadConstraints"),
        errs,
    );
    for key in ["serviceAccountName", "nodeName"] {
        let v = str_at(spec, key);
        if !v.is_empty() {
            for m in is_dns1123_subdomain(v) {
                errs.push(invalid_str(&p.child(key), v, &m));
            }
        }
    }
    if let Some(ads) = field(spec, "activeDeadlineSeconds") {
        let n = ads.as_i64().unwrap_or(0);
        if !(1..=i64::from(i32::MAX)).contains(&n) {
            errs.push(invalid(
                &p.child("activeDeadlineSeconds"),
                ads,
                "must be between 1 and 2147483647, inclusive",
            ));
        }
    }
    for key in ["hostname", "subdomain"] {
        let v = str_at(spec, key);
        if !v.is_empty() {
            for m in is_dns1123_label(v) {
                errs.push(invalid_str(&p.child(key), v, &m));
            }
        }
    }
    validate_tolerations(arr_at(spec, "tolerations"), &p.child("tolerations"), errs);
    let pcn = str_at(spec, "priorityClassName");
    if !pcn.is_empty() {
        for m in is_dns1123_subdomain(pcn) {
            errs.push(invalid_str(&p.child("priorityClassName"), pcn, &m));
        }
    }
    if let Some(v) = field(spec, "preemptionPolicy") {
        let s = v.as_str().unwrap_or("");
        if s != "PreemptLowerPriority" && s != "Never" {
            errs.push(not_supported(
                &p.child("preemptionPolicy"),
                v,
                &["PreemptLowerPriority", "Never"],
            ));
        }
    }
}

/// upstream's `validateTopologySpreadConstraints`.
fn validate_topology_spread(list: &[Value], p: &Path, errs: &mut Vec<FieldError>) {
    for (i, c) in list.iter().enumerate() {
        let cp = p.index(i);
        let skew = field(Some(c), "maxSkew").cloned().unwrap_or(Value::from(0));
        if skew.as_i64().is_none_or(|n| n <= 0) {
            errs.push(invalid(&cp.child("maxSkew"), &skew, "must be greater than zero"));
        }
        let key = str_at(Some(c), "topologyKey");
        if key.is_empty() {
            errs.push(required(&cp.child("topologyKey"), "can not be empty"));
        }
        let action_v = field(Some(c), "whenUnsatisfiable")
            .cloned()
            .unwrap_or(Value::String(String::new()));
        let action = action_v.as_str().unwrap_or("?");
        if action != "DoNotSchedule" && action != "ScheduleAnyway" {
            errs.push(not_supported(
                &cp.child("whenUnsatisfiable"),
                &action_v,
                &["DoNotSchedule", "ScheduleAnyway"],
            ));
        }
        let repeated = list[i + 1..]
            .iter()
            .any(|o| str_at(Some(o), "topologyKey") == key && str_at(Some(o), "whenUnsatisfiable") == action);
        if repeated {
            errs.push(duplicate(
                &cp.child("{topologyKey, whenUnsatisfiable}"),
                &Value::String(format!("{{{key}, {action}}}")),
            ));
        }
        if let Some(md) = field(Some(c), "minDomains") {
            if md.as_i64().is_none_or(|n| n <= 0) {
                errs.push(invalid(&cp.child("minDomains"), md, "must be greater than zero"));
            }
            if action != "DoNotSchedule" {
                errs.push(invalid(
                    &cp.child("minDomains"),
                    md,
                    &format!("can only use minDomains if whenUnsatisfiable=DoNotSchedule, not {action}"),
                ));
            }
        }
        for key in ["nodeAffinityPolicy", "nodeTaintsPolicy"] {
            if let Some(v) = field(Some(c), key)
                && !matches!(v.as_str(), Some("Honor" | "Ignore"))
            {
                errs.push(not_supported(&cp.child(key), v, &["Honor", "Ignore"]));
            }
        }
        super::meta::validate_label_selector(field(Some(c), "labelSelector"), &cp.child("labelSelector"), errs);
    }
}

fn validate_restart_policy(spec: Option<&Value>, p: &Path, errs: &mut Vec<FieldError>) {
    let v = field(spec, "restartPolicy")
        .cloned()
        .unwrap_or(Value::String(String::new()));
    match v.as_str().unwrap_or("") {
        "Always" | "OnFailure" | "Never" => {}
        "" => errs.push(required(p, "")),
        _ => errs.push(not_supported(p, &v, &["Always", "OnFailure", "Never"])),
    }
}

/// Volumes: names unique DNS labels, exactly one source each. Returns the volume names.
fn validate_volumes(spec: Option<&Value>, p: &Path, errs: &mut Vec<FieldError>) -> HashSet<String> {
    let mut names = HashSet::new();
    for (i, v) in arr_at(spec, "volumes").iter().enumerate() {
        let vp = p.index(i);
        let name = str_at(Some(v), "name");
        if name.is_empty() {
            errs.push(required(&vp.child("name"), ""));
        } else {
            for m in is_dns1123_label(name) {
                errs.push(invalid_str(&vp.child("name"), name, &m));
            }
            if !names.insert(name.to_string()) {
                errs.push(duplicate(&vp.child("name"), &Value::String(name.to_string())));
            }
        }
        let mut count = 0;
        for src in VOLUME_SOURCES {
            if field(Some(v), src).is_some() {
                if count > 0 {
                    errs.push(forbidden(&vp.child(src), "may not specify more than 1 volume type"));
                } else {
                    validate_volume_source(src, field(Some(v), src), &vp.child(src), errs);
                }
                count += 1;
            }
        }
        if count == 0 {
            errs.push(required(&vp, "must specify a volume type"));
        }
    }
    names
}

fn validate_mode(src: Option<&Value>, key: &str, p: &Path, errs: &mut Vec<FieldError>) {
    if let Some(m) = field(src, key)
        && !m.as_i64().is_some_and(|n| (0..=0o777).contains(&n))
    {
        errs.push(invalid(
            &p.child(key),
            m,
            "must be a number between 0 and 0777 (octal), both inclusive",
        ));
    }
}

fn validate_volume_source(kind: &str, src: Option<&Value>, p: &Path, errs: &mut Vec<FieldError>) {
    match kind {
        "secret" => {
            if str_at(src, "secretName").is_empty() {
                errs.push(required(&p.child("secretName"), ""));
            }
            validate_mode(src, "defaultMode", p, errs);
        }
        "configMap" => {
            if str_at(src, "name").is_empty() {
                errs.push(required(&p.child("name"), ""));
            }
            validate_mode(src, "defaultMode", p, errs);
        }
        "persistentVolumeClaim" if str_at(src, "claimName").is_empty() => {
            errs.push(required(&p.child("claimName"), ""));
        }
        "hostPath" => {
            if str_at(src, "path").is_empty() {
                errs.push(required(&p.child("path"), ""));
            }
            if let Some(t) = field(src, "type") {
                let supported = [
                    "",
                    "DirectoryOrCreate",
                    "Directory",
                    "FileOrCreate",
                    "File",
                    "Socket",
                    "CharDevice",
                    "BlockDevice",
                ];
                if !supported.contains(&t.as_str().unwrap_or("?")) {
                    errs.push(not_supported(&p.child("type"), t, &supported));
                }
            }
        }
        "emptyDir" => {
            if let Some(m) = field(src, "medium") {
                let s = m.as_str().unwrap_or("?");
                if !(s.is_empty() || s == "Memory" || s.starts_with("HugePages")) {
                    errs.push(not_supported(&p.child("medium"), m, &["", "Memory", "HugePages"]));
                }
            }
        }
        _ => {}
    }
}

/// Whether a resource name is native (no domain, or a `kubernetes.io/` one).
fn is_native_resource(name: &str) -> bool {
    !name.contains('/') || name.contains("kubernetes.io/")
}

fn is_hugepages(name: &str) -> bool {
    name.starts_with("hugepages-")
}

/// upstream's `IsOvercommitAllowed`: native and not hugepages.
fn overcommit_allowed(name: &str) -> bool {
    is_native_resource(name) && !is_hugepages(name)
}

fn validate_container_resource_name(name: &str, p: &Path, errs: &mut Vec<FieldError>) {
    let msgs = super::meta::is_qualified_name(name);
    if !msgs.is_empty() {
        for m in msgs {
            errs.push(invalid_str(p, name, &m));
        }
        return;
    }
    if is_native_resource(name) && !matches!(name, "cpu" | "memory" | "ephemeral-storage") && !is_hugepages(name) {
        errs.push(invalid_str(p, name, "must be a standard resource for containers"));
    }
}

/// Parse and check one quantity of a resource list; `None` when it is not a quantity.
fn resource_quantity(name: &str, v: &Value, p: &Path, errs: &mut Vec<FieldError>) -> Option<Quantity> {
    match Quantity::from_json(v) {
        Err(e) => {
            errs.push(invalid(p, v, &e.to_string()));
            None
        }
        Ok(q) => {
            if q.is_negative() {
                errs.push(invalid_str(p, &q.to_string(), "must be greater than or equal to 0"));
            }
            if !is_native_resource(name) && q.milli_value() % 1000 != 0 {
                errs.push(invalid_str(p, &q.to_string(), "must be an integer"));
            }
            Some(q)
        }
    }
}

/// upstream's `ValidateResourceRequirements` for a container.
pub(crate) fn validate_resources(res: Option<&Value>, p: &Path, errs: &mut Vec<FieldError>) {
    let lim_path = p.child("limits");
    let req_path = p.child("requests");
    let mut limits: Vec<(String, Quantity)> = Vec::new();
    if let Some(m) = field(res, "limits").and_then(Value::as_object) {
        for (name, v) in m {
            let kp = lim_path.key(name);
            validate_container_resource_name(name, &kp, errs);
            if let Some(q) = resource_quantity(name, v, &kp, errs) {
                limits.push((name.clone(), q));
            }
        }
    }
    if let Some(m) = field(res, "requests").and_then(Value::as_object) {
        for (name, v) in m {
            let kp = req_path.key(name);
            validate_container_resource_name(name, &kp, errs);
            let Some(q) = resource_quantity(name, v, &kp, errs) else {
                continue;
            };
            match limits.iter().find(|(n, _)| n == name) {
                Some((_, lim)) => {
                    if q != *lim && !overcommit_allowed(name) {
                        errs.push(invalid_str(
                            &req_path,
                            &q.to_string(),
                            &format!("must be equal to {name} limit of {lim}"),
                        ));
                    } else if q > *lim {
                        errs.push(invalid_str(
                            &req_path,
                            &q.to_string(),
                            &format!("must be less than or equal to {name} limit of {lim}"),
                        ));
                    }
                }
                None => {
                    if !overcommit_allowed(name) {
                        errs.push(required(
                            &lim_path,
                            "Limit must be set for non overcommitable resources",
                        ));
                    }
                }
            }
        }
    }
}

/// upstream's `IsValidPortNum`.
fn valid_port_num(n: i64) -> bool {
    (1..=65535).contains(&n)
}

const PORT_RANGE_MSG: &str = "must be between 1 and 65535, inclusive";

/// upstream's `IsValidPortName` (IANA service names).
pub(crate) fn port_name_errors(name: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if name.len() > 15 {
        errs.push("must be no more than 15 characters".to_string());
    }
    if !name
        .bytes()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
    {
        errs.push("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)".to_string());
    }
    if !name.bytes().any(|c| c.is_ascii_lowercase()) {
        errs.push("must contain at least one letter (a-z)".to_string());
    }
    if name.contains("--") {
        errs.push("must not contain consecutive hyphens".to_string());
    }
    if name.starts_with('-') || name.ends_with('-') {
        errs.push("must not begin or end with a hyphen".to_string());
    }
    errs
}

/// A port given as a number or a name (`validatePortNumOrName`).
pub(crate) fn validate_port_num_or_name(v: Option<&Value>, p: &Path, errs: &mut Vec<FieldError>) {
    match v {
        Some(Value::Number(n)) => {
            if !n.as_i64().is_some_and(valid_port_num) {
                errs.push(invalid(p, &Value::Number(n.clone()), PORT_RANGE_MSG));
            }
        }
        Some(Value::String(s)) => {
            for m in port_name_errors(s) {
                errs.push(invalid_str(p, s, &m));
            }
        }
        Some(other) => errs.push(invalid(p, other, "must be an integer or a string")),
        None => errs.push(required(p, "")),
    }
}

fn validate_protocol(port: &Value, p: &Path, errs: &mut Vec<FieldError>) {
    match field(Some(port), "protocol") {
        None => errs.push(required(&p.child("protocol"), "")),
        Some(v) => {
            let s = v.as_str().unwrap_or("");
            if s.is_empty() {
                errs.push(required(&p.child("protocol"), ""));
            } else if !matches!(s, "TCP" | "UDP" | "SCTP") {
                errs.push(not_supported(&p.child("protocol"), v, &["SCTP", "TCP", "UDP"]));
            }
        }
    }
}

fn validate_container_ports(ports: &[Value], p: &Path, errs: &mut Vec<FieldError>) {
    let mut names = HashSet::new();
    for (i, port) in ports.iter().enumerate() {
        let pp = p.index(i);
        let name = str_at(Some(port), "name");
        if !name.is_empty() {
            for m in port_name_errors(name) {
                errs.push(invalid_str(&pp.child("name"), name, &m));
            }
            if !names.insert(name.to_string()) {
                errs.push(duplicate(&pp.child("name"), &Value::String(name.to_string())));
            }
        }
        match field(Some(port), "containerPort") {
            None => errs.push(required(&pp.child("containerPort"), "")),
            Some(v) => {
                if v.as_i64() == Some(0) {
                    errs.push(required(&pp.child("containerPort"), ""));
                } else if !v.as_i64().is_some_and(valid_port_num) {
                    errs.push(invalid(&pp.child("containerPort"), v, PORT_RANGE_MSG));
                }
            }
        }
        if let Some(v) = field(Some(port), "hostPort")
            && v.as_i64() != Some(0)
            && !v.as_i64().is_some_and(valid_port_num)
        {
            errs.push(invalid(&pp.child("hostPort"), v, PORT_RANGE_MSG));
        }
        validate_protocol(port, &pp, errs);
    }
}

const HANDLERS: &[&str] = &["exec", "httpGet", "tcpSocket", "grpc", "sleep"];

fn validate_handler(h: &Value, p: &Path, errs: &mut Vec<FieldError>) {
    let mut count = 0;
    for kind in HANDLERS {
        let Some(v) = field(Some(h), kind) else {
            continue;
        };
        if count > 0 {
            errs.push(forbidden(&p.child(kind), "may not specify more than 1 handler type"));
            count += 1;
            continue;
        }
        count += 1;
        let hp = p.child(kind);
        match *kind {
            "exec" if arr_at(Some(v), "command").is_empty() => {
                errs.push(required(&hp.child("command"), ""));
            }
            "httpGet" => {
                validate_port_num_or_name(field(Some(v), "port"), &hp.child("port"), errs);
                if let Some(s) = field(Some(v), "scheme") {
                    let sv = s.as_str().unwrap_or("");
                    if sv != "HTTP" && sv != "HTTPS" {
                        errs.push(not_supported(&hp.child("scheme"), s, &["HTTP", "HTTPS"]));
                    }
                }
            }
            "tcpSocket" => validate_port_num_or_name(field(Some(v), "port"), &hp.child("port"), errs),
            "grpc" => match field(Some(v), "port") {
                Some(port) if port.as_i64().is_some_and(valid_port_num) => {}
                Some(port) => errs.push(invalid(&hp.child("port"), port, PORT_RANGE_MSG)),
                None => errs.push(required(&hp.child("port"), "")),
            },
            _ => {}
        }
    }
    if count == 0 {
        errs.push(required(p, "must specify a handler type"));
    }
}

fn validate_probe(probe: &Value, p: &Path, liveness_or_startup: bool, errs: &mut Vec<FieldError>) {
    validate_handler(probe, p, errs);
    for key in [
        "initialDelaySeconds",
        "timeoutSeconds",
        "periodSeconds",
        "successThreshold",
        "failureThreshold",
    ] {
        nonnegative(Some(probe), key, p, errs);
    }
    if let Some(g) = field(Some(probe), "terminationGracePeriodSeconds")
        && g.as_i64().is_none_or(|g| g <= 0)
    {
        errs.push(invalid(
            &p.child("terminationGracePeriodSeconds"),
            g,
            "must be greater than 0",
        ));
    }
    if liveness_or_startup
        && let Some(st) = field(Some(probe), "successThreshold")
        && st.as_i64() != Some(1)
    {
        errs.push(invalid(&p.child("successThreshold"), st, "must be 1"));
    }
}

/// upstream's `validateContainerCommon`, then the per-list rules of `validateContainers` /
/// `validateInitContainers` (duplicate names, lifecycle, probes, restartPolicy), in its order.
fn validate_container(
    c: &Value,
    p: &Path,
    volumes: &HashSet<String>,
    names: &mut HashSet<String>,
    init: bool,
    errs: &mut Vec<FieldError>,
) {
    validate_container_common(c, p, volumes, names, errs);
    validate_container_kind(c, p, init, errs);
}

/// The rules every kind of container follows (upstream's `validateContainerCommon`), and a name
/// unique among all of the pod's containers.
fn validate_container_common(
    c: &Value,
    p: &Path,
    volumes: &HashSet<String>,
    names: &mut HashSet<String>,
    errs: &mut Vec<FieldError>,
) {
    let name = str_at(Some(c), "name");
    if name.is_empty() {
        errs.push(required(&p.child("name"), ""));
    } else {
        for m in is_dns1123_label(name) {
            errs.push(invalid_str(&p.child("name"), name, &m));
        }
    }
    let image = str_at(Some(c), "image");
    if image.is_empty() {
        errs.push(required(&p.child("image"), ""));
    }
    if let Some(v) = field(Some(c), "terminationMessagePolicy") {
        match v.as_str().unwrap_or("") {
            "File" | "FallbackToLogsOnError" => {}
            "" => errs.push(required(&p.child("terminationMessagePolicy"), "")),
            _ => errs.push(not_supported(
                &p.child("terminationMessagePolicy"),
                v,
                &["File", "FallbackToLogsOnError"],
            )),
        }
    }
    validate_container_ports(arr_at(Some(c), "ports"), &p.child("ports"), errs);
    for (i, e) in arr_at(Some(c), "env").iter().enumerate() {
        let ep = p.child("env").index(i);
        let n = str_at(Some(e), "name");
        if n.is_empty() {
            errs.push(required(&ep.child("name"), ""));
        } else if !n.bytes().all(|b| (b' '..=b'~').contains(&b) && b != b'=') {
            errs.push(invalid_str(
                &ep.child("name"),
                n,
                "a valid environment variable name must consist only of printable ASCII characters other than '='",
            ));
        }
        if field(Some(e), "valueFrom").is_some() && !str_at(Some(e), "value").is_empty() {
            errs.push(invalid_str(
                &ep.child("valueFrom"),
                "",
                "may not be specified when `value` is not empty",
            ));
        }
    }
    let mut mount_paths = HashSet::new();
    for (i, m) in arr_at(Some(c), "volumeMounts").iter().enumerate() {
        let mp = p.child("volumeMounts").index(i);
        let vn = str_at(Some(m), "name");
        if vn.is_empty() {
            errs.push(required(&mp.child("name"), ""));
        } else if !volumes.contains(vn) {
            errs.push(FieldError::not_found(
                mp.child("name").as_str(),
                &Value::String(vn.to_string()),
            ));
        }
        let path = str_at(Some(m), "mountPath");
        if path.is_empty() {
            errs.push(required(&mp.child("mountPath"), ""));
        } else if !mount_paths.insert(path.to_string()) {
            errs.push(invalid_str(&mp.child("mountPath"), path, "must be unique"));
        }
        // Upstream names these fields on the list, not on the item.
        let list = p.child("volumeMounts");
        let sub = str_at(Some(m), "subPath");
        if !sub.is_empty() {
            local_descending_path(sub, &list.child("subPath"), errs);
        }
        let expr = str_at(Some(m), "subPathExpr");
        if !expr.is_empty() {
            if !sub.is_empty() {
                errs.push(invalid_str(
                    &mp.child("subPathExpr"),
                    expr,
                    "subPathExpr and subPath are mutually exclusive",
                ));
            }
            local_descending_path(expr, &list.child("subPathExpr"), errs);
        }
    }
    if let Some(v) = field(Some(c), "imagePullPolicy") {
        match v.as_str().unwrap_or("") {
            "Always" | "IfNotPresent" | "Never" => {}
            "" => errs.push(required(&p.child("imagePullPolicy"), "")),
            _ => errs.push(not_supported(
                &p.child("imagePullPolicy"),
                v,
                &["Always", "IfNotPresent", "Never"],
            )),
        }
    }
    validate_resources(field(Some(c), "resources"), &p.child("resources"), errs);

    if !name.is_empty() && !names.insert(name.to_string()) {
        errs.push(duplicate(&p.child("name"), &Value::String(name.to_string())));
    }
}

/// The rules of regular and init containers (lifecycle, probes, restartPolicy).
fn validate_container_kind(c: &Value, p: &Path, init: bool, errs: &mut Vec<FieldError>) {
    let sidecar = init && str_at(Some(c), "restartPolicy") == "Always";
    if init
        && let Some(rp) = field(Some(c), "restartPolicy")
        && !sidecar
    {
        errs.push(not_supported(&p.child("restartPolicy"), rp, &["Always"]));
    }
    for key in ["lifecycle", "livenessProbe", "readinessProbe", "startupProbe"] {
        let Some(v) = field(Some(c), key) else {
            continue;
        };
        let kp = p.child(key);
        if init && !sidecar {
            errs.push(forbidden(
                &kp,
                "may not be set for init containers without restartPolicy=Always",
            ));
            continue;
        }
        match key {
            "lifecycle" => {
                for hook in ["postStart", "preStop"] {
                    if let Some(h) = field(Some(v), hook) {
                        validate_handler(h, &kp.child(hook), errs);
                    }
                }
            }
            "readinessProbe" => {
                validate_probe(v, &kp, false, errs);
                if field(Some(v), "terminationGracePeriodSeconds").is_some() {
                    errs.push(invalid(
                        &kp.child("terminationGracePeriodSeconds"),
                        field(Some(v), "terminationGracePeriodSeconds").unwrap_or(&Value::Null),
                        "must not be set for readinessProbes",
                    ));
                }
            }
            _ => validate_probe(v, &kp, true, errs),
        }
    }
    if !init && let Some(_rp) = field(Some(c), "restartPolicy") {
        errs.push(forbidden(
            &p.child("restartPolicy"),
            "may not be set for non-init containers",
        ));
    }
}

/// upstream's `validateTaintEffect`.
pub(crate) fn validate_taint_effect(v: Option<&Value>, allow_empty: bool, p: &Path, errs: &mut Vec<FieldError>) {
    let value = v.cloned().unwrap_or(Value::String(String::new()));
    let s = value.as_str().unwrap_or("?");
    if s.is_empty() {
        if !allow_empty {
            errs.push(required(p, ""));
        }
        return;
    }
    if !matches!(s, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
        errs.push(not_supported(
            p,
            &value,
            &["NoSchedule", "PreferNoSchedule", "NoExecute"],
        ));
    }
}

/// Go's `%#v` of a `core.Toleration`.
fn go_toleration(t: &Value) -> String {
    let secs = match int_at(Some(t), "tolerationSeconds") {
        Some(_) => "(*int64)(0xc000000000)".to_string(),
        None => "(*int64)(nil)".to_string(),
    };
    format!(
        "core.Toleration{{Key:{:?}, Operator:{:?}, Value:{:?}, Effect:{:?}, TolerationSeconds:{secs}}}",
        str_at(Some(t), "key"),
        str_at(Some(t), "operator"),
        str_at(Some(t), "value"),
        str_at(Some(t), "effect"),
    )
}

/// upstream's `ValidateTolerations`.
pub(crate) fn validate_tolerations(list: &[Value], p: &Path, errs: &mut Vec<FieldError>) {
    for (i, t) in list.iter().enumerate() {
        let tp = p.index(i);
        let key = str_at(Some(t), "key");
        if !key.is_empty() {
            validate_label_name(key, &tp.child("key"), errs);
        }
        let op_v = field(Some(t), "operator")
            .cloned()
            .unwrap_or(Value::String(String::new()));
        let op = op_v.as_str().unwrap_or("?");
        if key.is_empty() && op != "Exists" {
            errs.push(invalid(
                &tp.child("operator"),
                &op_v,
                "operator must be Exists when `key` is empty, which means \"match all values and all keys\"",
            ));
        }
        let effect = str_at(Some(t), "effect");
        if field(Some(t), "tolerationSeconds").is_some() && effect != "NoExecute" {
            errs.push(invalid_str(
                &tp.child("effect"),
                effect,
                "effect must be 'NoExecute' when `tolerationSeconds` is set",
            ));
        }
        let value = str_at(Some(t), "value");
        match op {
            "Equal" | "" => {
                let msgs = is_valid_label_value(value);
                if !msgs.is_empty() {
                    errs.push(invalid_str(&tp.child("operator"), value, &msgs.join(";")));
                }
            }
            "Exists" => {
                if !value.is_empty() {
                    errs.push(invalid_raw(
                        &tp.child("operator"),
                        go_toleration(t),
                        "value must be empty when `operator` is 'Exists'",
                    ));
                }
            }
            _ => errs.push(not_supported(&tp.child("operator"), &op_v, &["Equal", "Exists"])),
        }
        if field(Some(t), "effect").is_some() {
            validate_taint_effect(field(Some(t), "effect"), true, &tp.child("effect"), errs);
        }
    }
}

fn validate_node_selector_term(term: &Value, p: &Path, errs: &mut Vec<FieldError>) {
    for (i, rq) in arr_at(Some(term), "matchExpressions").iter().enumerate() {
        let rp = p.child("matchExpressions").index(i);
        let values = arr_at(Some(rq), "values");
        let op = field(Some(rq), "operator")
            .cloned()
            .unwrap_or(Value::String(String::new()));
        match op.as_str().unwrap_or("") {
            "In" | "NotIn" => {
                if values.is_empty() {
                    errs.push(required(
                        &rp.child("values"),
                        "must be specified when `operator` is 'In' or 'NotIn'",
                    ));
                }
            }
            "Exists" | "DoesNotExist" => {
                if !values.is_empty() {
                    errs.push(forbidden(
                        &rp.child("values"),
                        "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
                    ));
                }
            }
            "Gt" | "Lt" => {
                if values.len() != 1 {
                    errs.push(required(
                        &rp.child("values"),
                        "must be specified single value when `operator` is 'Lt' or 'Gt'",
                    ));
                }
            }
            _ => errs.push(invalid(&rp.child("operator"), &op, "not a valid selector operator")),
        }
        validate_label_name(str_at(Some(rq), "key"), &rp.child("key"), errs);
    }
    for (i, rq) in arr_at(Some(term), "matchFields").iter().enumerate() {
        let rp = p.child("matchFields").index(i);
        let values = arr_at(Some(rq), "values");
        let op = field(Some(rq), "operator")
            .cloned()
            .unwrap_or(Value::String(String::new()));
        match op.as_str().unwrap_or("") {
            "In" | "NotIn" => {
                if values.len() != 1 {
                    errs.push(required(
                        &rp.child("values"),
                        "must be only one value when `operator` is 'In' or 'NotIn' for node field selector",
                    ));
                }
            }
            _ => errs.push(invalid(&rp.child("operator"), &op, "not a valid selector operator")),
        }
        let key = str_at(Some(rq), "key");
        if key != "metadata.name" {
            errs.push(invalid_str(&rp.child("key"), key, "not a valid field selector key"));
        } else {
            for (vi, v) in values.iter().enumerate() {
                for m in is_dns1123_subdomain(v.as_str().unwrap_or("")) {
                    errs.push(invalid(&rp.child("values").index(vi), v, &m));
                }
            }
        }
    }
}

fn validate_weight(t: &Value, p: &Path, errs: &mut Vec<FieldError>) {
    let w = field(Some(t), "weight").cloned().unwrap_or(Value::from(0));
    if !w.as_i64().is_some_and(|n| (1..=100).contains(&n)) {
        errs.push(invalid(&p.child("weight"), &w, "must be in the range 1-100"));
    }
}

fn validate_pod_affinity_term(t: &Value, p: &Path, errs: &mut Vec<FieldError>) {
    super::meta::validate_label_selector(field(Some(t), "labelSelector"), &p.child("labelSelector"), errs);
    super::meta::validate_label_selector(field(Some(t), "namespaceSelector"), &p.child("namespaceSelector"), errs);
    for (i, ns) in arr_at(Some(t), "namespaces").iter().enumerate() {
        let s = ns.as_str().unwrap_or("");
        for m in is_dns1123_label(s) {
            errs.push(invalid_str(&p.child("namespaces").index(i), s, &m));
        }
    }
    let tk = str_at(Some(t), "topologyKey");
    if tk.is_empty() {
        errs.push(required(&p.child("topologyKey"), "can not be empty"));
    } else {
        validate_label_name(tk, &p.child("topologyKey"), errs);
    }
}

fn validate_affinity(aff: &Value, p: &Path, errs: &mut Vec<FieldError>) {
    if let Some(na) = field(Some(aff), "nodeAffinity") {
        let np = p.child("nodeAffinity");
        if let Some(req) = field(Some(na), "requiredDuringSchedulingIgnoredDuringExecution") {
            let rp = np.child("requiredDuringSchedulingIgnoredDuringExecution");
            let terms = arr_at(Some(req), "nodeSelectorTerms");
            if terms.is_empty() {
                errs.push(required(
                    &rp.child("nodeSelectorTerms"),
                    "must have at least one node selector term",
                ));
            }
            for (i, t) in terms.iter().enumerate() {
                validate_node_selector_term(t, &rp.child("nodeSelectorTerms").index(i), errs);
            }
        }
        let pp = np.child("preferredDuringSchedulingIgnoredDuringExecution");
        for (i, t) in arr_at(Some(na), "preferredDuringSchedulingIgnoredDuringExecution")
            .iter()
            .enumerate()
        {
            validate_weight(t, &pp.index(i), errs);
            if let Some(pref) = field(Some(t), "preference") {
                validate_node_selector_term(pref, &pp.index(i).child("preference"), errs);
            }
        }
    }
    for kind in ["podAffinity", "podAntiAffinity"] {
        let Some(pa) = field(Some(aff), kind) else {
            continue;
        };
        let kp = p.child(kind);
        let rk = "requiredDuringSchedulingIgnoredDuringExecution";
        for (i, t) in arr_at(Some(pa), rk).iter().enumerate() {
            validate_pod_affinity_term(t, &kp.child(rk).index(i), errs);
        }
        let pk = "preferredDuringSchedulingIgnoredDuringExecution";
        for (i, t) in arr_at(Some(pa), pk).iter().enumerate() {
            let tp = kp.child(pk).index(i);
            validate_weight(t, &tp, errs);
            validate_pod_affinity_term(
                field(Some(t), "podAffinityTerm").unwrap_or(&Value::Null),
                &tp.child("podAffinityTerm"),
                errs,
            );
        }
    }
}

// ---- updates --------------------------------------------------------------------------------

fn toleration_sans_seconds(t: &Value) -> Vec<(&'static str, String)> {
    ["key", "operator", "value", "effect"]
        .into_iter()
        .map(|k| (k, str_at(Some(t), k).to_string()))
        .collect()
}

/// upstream's `ValidatePodUpdate`: only images, activeDeadlineSeconds, added tolerations and
/// a negative grace period raised to 1 may change.
fn validate_pod_update(new: Option<&Value>, old: Option<&Value>, errs: &mut Vec<FieldError>) {
    let sp = Path::new("spec");
    let (Some(new), Some(old)) = (new, old) else {
        return;
    };
    if arr_at(Some(new), "containers").len() != arr_at(Some(old), "containers").len() {
        errs.push(forbidden(
            &sp.child("containers"),
            "pod updates may not add or remove containers",
        ));
        return;
    }
    if let Some(ads) = field(Some(new), "activeDeadlineSeconds") {
        let n = ads.as_i64().unwrap_or(-1);
        if !(0..=i64::from(i32::MAX)).contains(&n) {
            errs.push(invalid(
                &sp.child("activeDeadlineSeconds"),
                ads,
                "must be between 0 and 2147483647, inclusive",
            ));
            return;
        }
        if let Some(o) = int_at(Some(old), "activeDeadlineSeconds")
            && o < n
        {
            errs.push(invalid(
                &sp.child("activeDeadlineSeconds"),
                ads,
                "must be less than or equal to previous value",
            ));
            return;
        }
    } else if field(Some(old), "activeDeadlineSeconds").is_some() {
        errs.push(invalid(
            &sp.child("activeDeadlineSeconds"),
            &Value::Null,
            "must not update from a positive integer to nil value",
        ));
    }
    let old_tol = arr_at(Some(old), "tolerations");
    let new_tol = arr_at(Some(new), "tolerations");
    for o in old_tol {
        let want = toleration_sans_seconds(o);
        if !new_tol.iter().any(|n| toleration_sans_seconds(n) == want) {
            errs.push(forbidden(
                &sp.child("tolerations"),
                "existing toleration can not be modified except its tolerationSeconds",
            ));
            break;
        }
    }

    // Munge the updatable fields to the old values and compare the rest.
    let mut munged = new.clone();
    if let Some(m) = munged.as_object_mut() {
        for key in ["containers", "initContainers"] {
            if let (Some(nc), Some(oc)) = (
                m.get_mut(key).and_then(Value::as_array_mut),
                old.get(key).and_then(Value::as_array),
            ) && nc.len() == oc.len()
            {
                for (n, o) in nc.iter_mut().zip(oc) {
                    if let (Some(n), Some(img)) = (n.as_object_mut(), o.get("image")) {
                        n.insert("image".into(), img.clone());
                    }
                }
            }
        }
        for key in ["activeDeadlineSeconds", "tolerations"] {
            match old.get(key) {
                Some(v) => m.insert(key.into(), v.clone()),
                None => m.remove(key),
            };
        }
        let old_grace = int_at(Some(old), "terminationGracePeriodSeconds");
        if old_grace.is_some_and(|g| g < 0)
            && int_at(Some(new), "terminationGracePeriodSeconds") == Some(1)
            && let Some(g) = old.get("terminationGracePeriodSeconds")
        {
            m.insert("terminationGracePeriodSeconds".into(), g.clone());
        }
        // Scheduling gates may only be removed.
        let old_gates = arr_at(Some(old), "schedulingGates");
        let new_gates = arr_at(Some(new), "schedulingGates");
        if new_gates.iter().all(|g| old_gates.contains(g)) {
            match old.get("schedulingGates") {
                Some(v) => m.insert("schedulingGates".into(), v.clone()),
                None => m.remove("schedulingGates"),
            };
        }
    }
    if !semantic_eq(&munged, old) {
        let mut diff = Vec::new();
        diff_paths("spec", old, &munged, &mut diff);
        errs.push(forbidden(
            &sp,
            &format!(
                "pod updates may not change fields other than {}\n{}",
                UPDATABLE_POD_SPEC_FIELDS.join(","),
                diff.join("\n")
            ),
        ));
    }
}

/// Upstream's `validateLocalDescendingPath`: a relative path that never steps up.
fn local_descending_path(path: &str, p: &Path, errs: &mut Vec<FieldError>) {
    if path.starts_with('/') {
        errs.push(invalid_str(p, path, "must be a relative path"));
    }
    if path.split('/').any(|c| c == "..") {
        errs.push(invalid_str(p, path, "must not contain '..'"));
    }
}

#[cfg(test)]
mod tests {
    use crate::validation::test_util::{errors, errors_defaulted};
    use serde_json::{Value, json};

    fn pod(spec: Value) -> Value {
        json!({"metadata": {"name": "p", "namespace": "default"}, "spec": spec})
    }

    fn pod_errors(spec: Value) -> Vec<String> {
        errors_defaulted("", "Pod", &pod(spec), None)
    }

    #[test]
    fn valid_pod_passes() {
        let e = pod_errors(json!({"containers": [{"name": "web", "image": "nginx",
            "ports": [{"containerPort": 80, "name": "http"}],
            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": 1, "memory": "128Mi"}},
            "livenessProbe": {"httpGet": {"port": "http"}},
            "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
            "volumes": [{"name": "data", "emptyDir": {}}],
            "nodeSelector": {"disk": "ssd"},
            "tolerations": [{"key": "k", "operator": "Equal", "value": "v", "effect": "NoSchedule"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}, {"key": "cores", "operator": "Gt", "values": ["2"]}]}]}}}}));
        assert!(e.is_empty(), "{e:?}");
    }

    /// upstream's ValidatePodEphemeralContainersUpdate: allowed fields only (an empty struct is
    /// unset), unique names, an existing target, existing ones kept as they are.
    #[test]
    fn ephemeral_containers_follow_upstreams_rules() {
        let res = crate::registry::lookup_kind("", "Pod").unwrap();
        let base = json!({"containers": [{"name": "app", "image": "x"}]});
        let with = |eph: Value| {
            let mut p = pod(base.clone());
            p["spec"]["ephemeralContainers"] = eph;
            p
        };
        let check = |new: &Value, old: &Value| -> Vec<String> {
            let mut new = new.clone();
            crate::defaults::apply_defaults(res, &mut new);
            crate::validation::validate_write(res, "ephemeralcontainers", &new, Some(old))
                .iter()
                .map(|e| e.to_string())
                .collect()
        };
        let old = pod(base.clone());
        let dbg = json!({"name": "dbg", "image": "busybox", "targetContainerName": "app", "resources": {},
            "stdin": true, "tty": true, "terminationMessagePolicy": "File"});
        let e = check(&with(json!([dbg.clone()])), &old);
        assert!(e.is_empty(), "{e:?}");
        let bad = with(json!([{"name": "app", "image": "b", "targetContainerName": "nope",
            "ports": [{"containerPort": 80}], "readinessProbe": {"exec": {"command": ["true"]}}}]));
        assert_eq!(
            check(&bad, &old),
            vec![
                "spec.ephemeralContainers[0].name: Duplicate value: \"app\"",
                "spec.ephemeralContainers[0].targetContainerName: Not found: \"nope\"",
                "spec.ephemeralContainers[0].ports: Forbidden: cannot be set for an Ephemeral Container",
                "spec.ephemeralContainers[0].readinessProbe: Forbidden: cannot be set for an Ephemeral Container",
            ]
        );
        let old = with(json!([dbg.clone()]));
        let e = check(&pod(base.clone()), &old);
        assert_eq!(
            e,
            vec!["spec.ephemeralContainers: Forbidden: existing ephemeral containers \"dbg\" may not be removed\n"]
        );
        let mut changed = dbg.clone();
        changed["image"] = json!("other");
        let e = check(&with(json!([changed])), &old);
        assert!(
            e[0].starts_with(
                "spec.ephemeralContainers: Forbidden: existing ephemeral containers \"dbg\" may not be changed"
            ),
            "{e:?}"
        );
        assert_eq!(
            pod_errors(
                json!({"containers": [{"name": "app", "image": "x"}], "ephemeralContainers": [{"name": "e", "image": "x"}]})
            ),
            vec!["spec.ephemeralContainers: Forbidden: cannot be set on create"]
        );
    }

    #[test]
    fn containers_required_named_and_imaged() {
        assert_eq!(pod_errors(json!({})), vec!["spec.containers: Required value"]);
        let e = pod_errors(
            json!({"containers": [{"name": "a", "image": "x"}, {"name": "a"}, {"name": "B_", "image": "x"}]}),
        );
        assert_eq!(e[0], "spec.containers[1].image: Required value");
        assert_eq!(e[1], "spec.containers[1].name: Duplicate value: \"a\"");
        assert!(e[2].starts_with("spec.containers[2].name: Invalid value: \"B_\": a lowercase RFC 1123 label"));
        assert_eq!(e.len(), 3);
        let e = pod_errors(json!({"containers": [{"image": "x"}]}));
        assert_eq!(e, vec!["spec.containers[0].name: Required value"]);
    }

    #[test]
    fn requests_above_limits() {
        let e = pod_errors(json!({"containers": [{"name": "a", "image": "x",
            "resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}}]}));
        assert_eq!(
            e,
            vec![
                "spec.containers[0].resources.requests: Invalid value: \"2\": must be less than or equal to cpu limit of 1"
            ]
        );
        let e = pod_errors(json!({"containers": [{"name": "a", "image": "x",
            "resources": {"requests": {"memory": "2000Mi"}, "limits": {"memory": "1Gi"}}}]}));
        assert_eq!(
            e,
            vec![
                "spec.containers[0].resources.requests: Invalid value: \"2000Mi\": must be less than or equal to memory limit of 1Gi"
            ]
        );
        let e = pod_errors(json!({"containers": [{"name": "a", "image": "x",
            "resources": {"requests": {"cpu": "-1", "foo": "1", "example.com/gpu": "1"}}}]}));
        assert_eq!(
            e,
            vec![
                "spec.containers[0].resources.requests[cpu]: Invalid value: \"-1\": must be greater than or equal to 0",
                "spec.containers[0].resources.requests[foo]: Invalid value: \"foo\": must be a standard resource for containers",
                "spec.containers[0].resources.limits: Required value: Limit must be set for non overcommitable resources",
            ]
        );
        let e = pod_errors(json!({"containers": [{"name": "a", "image": "x",
            "resources": {"limits": {"cpu": "lots"}}}]}));
        // Defaulting copied the bad limit into requests; both are reported.
        assert_eq!(e.len(), 2);
        assert!(
            e[0].starts_with(
                "spec.containers[0].resources.limits[cpu]: Invalid value: \"lots\": quantities must match"
            )
        );
        assert!(
            e[1].starts_with(
                "spec.containers[0].resources.requests[cpu]: Invalid value: \"lots\": quantities must match"
            )
        );
    }

    #[test]
    fn unsupported_policies() {
        let e = pod_errors(json!({"restartPolicy": "Sometimes", "dnsPolicy": "Weird",
            "containers": [{"name": "a", "image": "x", "imagePullPolicy": "Maybe"}]}));
        assert_eq!(
            e,
            vec![
                "spec.containers[0].imagePullPolicy: Unsupported value: \"Maybe\": supported values: \"Always\", \"IfNotPresent\", \"Never\"",
                "spec.restartPolicy: Unsupported value: \"Sometimes\": supported values: \"Always\", \"OnFailure\", \"Never\"",
                "spec.dnsPolicy: Unsupported value: \"Weird\": supported values: \"ClusterFirstWithHostNet\", \"ClusterFirst\", \"Default\", \"None\"",
            ]
        );
    }

    #[test]
    fn ports() {
        let e = pod_errors(json!({"containers": [{"name": "a", "image": "x", "ports": [
            {"containerPort": 70000}, {"containerPort": 0}, {"containerPort": 80, "hostPort": -1, "protocol": "HTTP"},
            {"containerPort": 81, "name": "Bad--"}]}]}));
        assert_eq!(
            e[0],
            "spec.containers[0].ports[0].containerPort: Invalid value: 70000: must be between 1 and 65535, inclusive"
        );
        assert_eq!(e[1], "spec.containers[0].ports[1].containerPort: Required value");
        assert_eq!(
            e[2],
            "spec.containers[0].ports[2].hostPort: Invalid value: -1: must be between 1 and 65535, inclusive"
        );
        assert_eq!(
            e[3],
            "spec.containers[0].ports[2].protocol: Unsupported value: \"HTTP\": supported values: \"SCTP\", \"TCP\", \"UDP\""
        );
        assert_eq!(
            e[4],
            "spec.containers[0].ports[3].name: Invalid value: \"Bad--\": must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)"
        );
        assert_eq!(
            e[5],
            "spec.containers[0].ports[3].name: Invalid value: \"Bad--\": must not contain consecutive hyphens"
        );
        assert_eq!(
            e[6],
            "spec.containers[0].ports[3].name: Invalid value: \"Bad--\": must not begin or end with a hyphen"
        );
        assert_eq!(e.len(), 7);
    }

    #[test]
    fn node_selector_and_affinity() {
        let e = pod_errors(json!({"containers": [{"name": "a", "image": "x"}],
            "nodeSelector": {"bad key!": "v"},
            "affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "a", "operator": "In"},
                    {"key": "b", "operator": "Exists", "values": ["x"]},
                    {"key": "c", "operator": "Gt", "values": ["1", "2"]},
                    {"key": "d", "operator": "Like", "values": ["x"]}
                ], "matchFields": [{"key": "spec.nodeName", "operator": "In", "values": ["n"]}]}]},
                "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 0, "preference": {}}]}}}));
        let p = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]";
        assert!(e[0].starts_with("spec.nodeSelector: Invalid value: \"bad key!\": name part must consist of"));
        assert_eq!(
            e[1],
            format!(
                "{p}.matchExpressions[0].values: Required value: must be specified when `operator` is 'In' or 'NotIn'"
            )
        );
        assert_eq!(
            e[2],
            format!(
                "{p}.matchExpressions[1].values: Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'"
            )
        );
        assert_eq!(
            e[3],
            format!(
                "{p}.matchExpressions[2].values: Required value: must be specified single value when `operator` is 'Lt' or 'Gt'"
            )
        );
        assert_eq!(
            e[4],
            format!("{p}.matchExpressions[3].operator: Invalid value: \"Like\": not a valid selector operator")
        );
        assert_eq!(
            e[5],
            format!("{p}.matchFields[0].key: Invalid value: \"spec.nodeName\": not a valid field selector key")
        );
        assert_eq!(
            e[6],
            "spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight: Invalid value: 0: must be in the range 1-100"
        );
        assert_eq!(e.len(), 7);
        let e = pod_errors(json!({"containers": [{"name": "a", "image": "x"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}},
                         "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"labelSelector": {"matchLabels": {"a": "b"}}}]}}}));
        assert_eq!(
            e,
            vec![
                "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms: Required value: must have at least one node selector term",
                "spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].topologyKey: Required value: can not be empty",
            ]
        );
    }

    #[test]
    fn topology_spread_constraints() {
        let e = pod_errors(
            json!({"containers": [{"name": "a", "image": "x"}], "topologySpreadConstraints": [
                {"maxSkew": 0, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"},
                {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule", "minDomains": 2},
                {"maxSkew": 1, "whenUnsatisfiable": "Maybe"}
            ]}),
        );
        assert_eq!(
            e,
            vec![
                "spec.topologySpreadConstraints[0].maxSkew: Invalid value: 0: must be greater than zero",
                "spec.topologySpreadConstraints[0].{topologyKey, whenUnsatisfiable}: Duplicate value: \"{zone, DoNotSchedule}\"",
                "spec.topologySpreadConstraints[2].topologyKey: Required value: can not be empty",
                "spec.topologySpreadConstraints[2].whenUnsatisfiable: Unsupported value: \"Maybe\": supported values: \"DoNotSchedule\", \"ScheduleAnyway\"",
            ]
        );
    }

    #[test]
    fn tolerations() {
        let e = pod_errors(json!({"containers": [{"name": "a", "image": "x"}], "tolerations": [
            {"key": "k", "operator": "Exists", "value": "v", "effect": "NoSchedule"},
            {"operator": "Equal", "value": "v"},
            {"key": "k", "operator": "Equal", "value": "v", "effect": "NoSchedule", "tolerationSeconds": 5},
            {"key": "k", "operator": "Maybe", "effect": "Sometimes"}
        ]}));
        assert_eq!(
            e,
            vec![
                "spec.tolerations[0].operator: Invalid value: core.Toleration{Key:\"k\", Operator:\"Exists\", Value:\"v\", Effect:\"NoSchedule\", TolerationSeconds:(*int64)(nil)}: value must be empty when `operator` is 'Exists'",
                "spec.tolerations[1].operator: Invalid value: \"Equal\": operator must be Exists when `key` is empty, which means \"match all values and all keys\"",
                "spec.tolerations[2].effect: Invalid value: \"NoSchedule\": effect must be 'NoExecute' when `tolerationSeconds` is set",
                "spec.tolerations[3].operator: Unsupported value: \"Maybe\": supported values: \"Equal\", \"Exists\"",
                "spec.tolerations[3].effect: Unsupported value: \"Sometimes\": supported values: \"NoSchedule\", \"PreferNoSchedule\", \"NoExecute\"",
            ]
        );
    }

    #[test]
    fn volumes_and_mounts() {
        let e = pod_errors(json!({"containers": [{"name": "a", "image": "x",
            "volumeMounts": [{"name": "missing", "mountPath": "/a"}, {"name": "v1", "mountPath": "/a"}, {"name": "v1"}]}],
            "volumes": [{"name": "v1", "emptyDir": {}, "hostPath": {"path": "/x"}}, {"name": "v1", "secret": {}},
                        {"name": "v3", "configMap": {"name": "c", "defaultMode": 1000}}, {"name": "v4", "hostPath": {"path": "/x", "type": "Dir"}}]}));
        assert_eq!(
            e,
            vec![
                "spec.volumes[0].hostPath: Forbidden: may not specify more than 1 volume type",
                "spec.volumes[1].name: Duplicate value: \"v1\"",
                "spec.volumes[1].secret.secretName: Required value",
                "spec.volumes[2].configMap.defaultMode: Invalid value: 1000: must be a number between 0 and 0777 (octal), both inclusive",
                "spec.volumes[3].hostPath.type: Unsupported value: \"Dir\": supported values: \"\", \"DirectoryOrCreate\", \"Directory\", \"FileOrCreate\", \"File\", \"Socket\", \"CharDevice\", \"BlockDevice\"",
                "spec.containers[0].volumeMounts[0].name: Not found: \"missing\"",
                "spec.containers[0].volumeMounts[1].mountPath: Invalid value: \"/a\": must be unique",
                "spec.containers[0].volumeMounts[2].mountPath: Required value",
            ]
        );
        // Without defaulting, a volume without a source is reported.
        let e = errors(
            "",
            "Pod",
            &pod(
                json!({"restartPolicy": "Always", "containers": [{"name": "a", "image": "x"}], "volumes": [{"name": "v"}]}),
            ),
            None,
        );
        assert_eq!(e, vec!["spec.volumes[0]: Required value: must specify a volume type"]);
        let e = pod_errors(json!({"containers": [{"name": "a", "image": "x", "volumeMounts": [
            {"name": "v", "mountPath": "/a", "subPath": "/etc"},
            {"name": "v", "mountPath": "/b", "subPath": "x/../../y"},
            {"name": "v", "mountPath": "/c", "subPath": "ok", "subPathExpr": "$(POD)/.."},
            {"name": "v", "mountPath": "/d", "subPath": "a/..b/c.."}]}],
            "volumes": [{"name": "v", "emptyDir": {}}]}));
        assert_eq!(
            e,
            vec![
                "spec.containers[0].volumeMounts.subPath: Invalid value: \"/etc\": must be a relative path",
                "spec.containers[0].volumeMounts.subPath: Invalid value: \"x/../../y\": must not contain '..'",
                "spec.containers[0].volumeMounts[2].subPathExpr: Invalid value: \"$(POD)/..\": subPathExpr and subPath are mutually exclusive",
                "spec.containers[0].volumeMounts.subPathExpr: Invalid value: \"$(POD)/..\": must not contain '..'",
            ]
        );
    }

    #[test]
    fn probes() {
        let e = pod_errors(json!({"containers": [{"name": "a", "image": "x",
            "livenessProbe": {"successThreshold": 2, "exec": {"command": ["true"]}},
            "readinessProbe": {"periodSeconds": -1},
            "startupProbe": {"tcpSocket": {"port": 0}, "httpGet": {"port": 80}}}]}));
        assert_eq!(
            e,
            vec![
                "spec.containers[0].livenessProbe.successThreshold: Invalid value: 2: must be 1",
                "spec.containers[0].readinessProbe: Required value: must specify a handler type",
                "spec.containers[0].readinessProbe.periodSeconds: Invalid value: -1: must be greater than or equal to 0",
                "spec.containers[0].startupProbe.tcpSocket: Forbidden: may not specify more than 1 handler type",
            ]
        );
        let e = pod_errors(json!({"containers": [{"name": "a", "image": "x",
            "livenessProbe": {"tcpSocket": {"port": 0}}}]}));
        assert_eq!(
            e,
            vec![
                "spec.containers[0].livenessProbe.tcpSocket.port: Invalid value: 0: must be between 1 and 65535, inclusive"
            ]
        );
    }

    fn stored_pod() -> Value {
        let mut p = pod(json!({"containers": [{"name": "a", "image": "x:1"}], "nodeName": "n1",
            "tolerations": [{"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 10}]}));
        let res = crate::registry::lookup_kind("", "Pod").expect("pod");
        crate::defaults::apply_defaults(res, &mut p);
        p
    }

    #[test]
    fn pod_update_rules() {
        let old = stored_pod();
        let mut new = old.clone();
        new["spec"]["containers"][0]["image"] = json!("x:2");
        new["spec"]["activeDeadlineSeconds"] = json!(30);
        new["spec"]["tolerations"][0]["tolerationSeconds"] = json!(20);
        new["spec"]["tolerations"]
            .as_array_mut()
            .expect("tolerations")
            .push(json!({"key": "extra", "operator": "Exists"}));
        new["metadata"]["labels"] = json!({"a": "b"});
        let e = errors("", "Pod", &new, Some(&old));
        assert!(e.is_empty(), "{e:?}");

        let mut changed = old.clone();
        changed["spec"]["nodeName"] = json!("n2");
        let e = errors("", "Pod", &changed, Some(&old));
        assert_eq!(e.len(), 1);
        assert!(e[0].starts_with(
            "spec: Forbidden: pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)\n"
        ));
        assert!(e[0].contains("spec.nodeName"));

        let mut removed = old.clone();
        removed["spec"]["tolerations"] = json!([]);
        let e = errors("", "Pod", &removed, Some(&old));
        assert_eq!(
            e,
            vec!["spec.tolerations: Forbidden: existing toleration can not be modified except its tolerationSeconds"]
        );

        let mut more = old.clone();
        more["spec"]["containers"]
            .as_array_mut()
            .expect("c")
            .push(json!({"name": "b", "image": "y"}));
        let e = errors("", "Pod", &more, Some(&old));
        assert_eq!(
            e[0],
            "spec.containers: Forbidden: pod updates may not add or remove containers"
        );

        let mut with_deadline = old.clone();
        with_deadline["spec"]["activeDeadlineSeconds"] = json!(30);
        let mut longer = with_deadline.clone();
        longer["spec"]["activeDeadlineSeconds"] = json!(60);
        let e = errors("", "Pod", &longer, Some(&with_deadline));
        assert_eq!(
            e,
            vec!["spec.activeDeadlineSeconds: Invalid value: 60: must be less than or equal to previous value"]
        );
        // A stored pod that predates a default is compared with its defaults applied.
        let mut bare = pod(json!({"containers": [{"name": "a", "image": "x:1"}]}));
        bare["spec"]["nodeName"] = json!("n1");
        let res = crate::registry::lookup_kind("", "Pod").expect("pod");
        let mut relabelled = bare.clone();
        relabelled["metadata"]["labels"] = json!({"a": "b"});
        crate::defaults::apply_defaults(res, &mut relabelled);
        assert!(errors("", "Pod", &relabelled, Some(&bare)).is_empty());
        // Quantities that are equal by value are not a change.
        let mut q_old = old.clone();
        q_old["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": "1"}});
        let mut q_new = old.clone();
        q_new["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": "1000m"}});
        assert!(errors("", "Pod", &q_new, Some(&q_old)).is_empty());
    }
}
