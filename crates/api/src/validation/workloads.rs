//! Workloads: Deployment, ReplicaSet, DaemonSet, StatefulSet (upstream's
//! `pkg/apis/apps/validation`), Job and CronJob (`pkg/apis/batch/validation`).

use serde_json::Value;

use super::meta::validate_label_selector;
use super::pod::{validate_pod_template, validate_template_metadata};
use super::{
    Path, field, forbidden, go_int_or_string, go_label_selector, go_string_map, int_at, invalid, invalid_raw,
    invalid_str, nonnegative, not_supported, required, selector_is_empty, selector_matches, str_at,
};
use crate::defaults::{CONTROLLER_UID_LABEL, JOB_NAME_LABEL, LEGACY_CONTROLLER_UID_LABEL, LEGACY_JOB_NAME_LABEL};
use crate::status::{FieldError, FieldErrorKind};

const SELECTOR_MISMATCH: &str = "`selector` does not match template `labels`";

fn spec_of(obj: &Value) -> Option<&Value> {
    field(Some(obj), "spec")
}

fn template_labels(template: Option<&Value>) -> Option<&Value> {
    field(field(template, "metadata"), "labels")
}

/// Go's `%#v` of an optional pointer field that is set (the address cannot be reproduced).
fn go_ptr(ty: &str, v: Option<&Value>) -> String {
    match v {
        None => format!("(*{ty})(nil)"),
        Some(_) => format!("(*{ty})(0xc000000000)"),
    }
}

/// upstream: a selector that matches the template's labels. A missing selector selects
/// nothing (and so never matches); an empty one selects everything (and is not checked).
fn validate_template_matches(spec: Option<&Value>, tp: &Path, errs: &mut Vec<FieldError>) {
    let sel = field(spec, "selector");
    if sel.is_some() && selector_is_empty(sel) {
        return;
    }
    let template = field(spec, "template");
    if !selector_matches(sel, template_labels(template)) {
        errs.push(invalid_raw(
            &tp.child("metadata").child("labels"),
            go_string_map(template_labels(template)),
            SELECTOR_MISMATCH,
        ));
    }
}

/// Selector required, valid and non-empty (Deployment, ReplicaSet, StatefulSet).
fn validate_required_selector(spec: Option<&Value>, p: &Path, what: &str, errs: &mut Vec<FieldError>) {
    match field(spec, "selector") {
        None => errs.push(required(&p.child("selector"), "")),
        Some(s) => {
            validate_label_selector(Some(s), &p.child("selector"), errs);
            if selector_is_empty(Some(s)) {
                errs.push(invalid_raw(
                    &p.child("selector"),
                    go_label_selector(Some(s)),
                    &format!("empty selector is invalid for {what}"),
                ));
            }
        }
    }
}

/// Only `restartPolicy: Always` and no `activeDeadlineSeconds` in the template.
fn validate_always_restart(spec: Option<&Value>, tp: &Path, kind: &str, errs: &mut Vec<FieldError>) {
    let ts = field(field(spec, "template"), "spec");
    let rp = field(ts, "restartPolicy")
        .cloned()
        .unwrap_or(Value::String(String::new()));
    if rp.as_str() != Some("Always") {
        errs.push(not_supported(
            &tp.child("spec").child("restartPolicy"),
            &rp,
            &["Always"],
        ));
    }
    if field(ts, "activeDeadlineSeconds").is_some() {
        errs.push(forbidden(
            &tp.child("spec").child("activeDeadlineSeconds"),
            &format!("activeDeadlineSeconds in {kind} is not Supported"),
        ));
    }
}

/// upstream's `ValidatePodTemplateSpecForReplicaSet` (Deployments and ReplicaSets).
fn validate_template_for_replicaset(spec: Option<&Value>, p: &Path, errs: &mut Vec<FieldError>) {
    let tp = p.child("template");
    validate_template_matches(spec, &tp, errs);
    validate_pod_template(field(spec, "template"), &tp, errs);
    validate_always_restart(spec, &tp, "ReplicaSet", errs);
}

/// The selector may not change after creation (`ValidateImmutableField`).
fn validate_selector_immutable(new: Option<&Value>, old: Option<&Value>, errs: &mut Vec<FieldError>) {
    let (ns, os) = (field(new, "selector"), field(old, "selector"));
    if ns != os {
        let rendered = match ns {
            None => "null".to_string(),
            Some(_) => go_label_selector(ns),
        };
        errs.push(invalid_raw(
            &Path::new("spec").child("selector"),
            rendered,
            "field is immutable",
        ));
    }
}

/// upstream's `ValidatePositiveIntOrPercent`.
fn validate_int_or_percent(v: Option<&Value>, p: &Path, errs: &mut Vec<FieldError>) {
    match v {
        Some(Value::String(s)) if percent_value(s).is_none() => {
            errs.push(invalid_raw(
                p,
                go_int_or_string(v),
                &super::meta::regex_error(
                    "a valid percent string must be a numeric string followed by an ending '%'",
                    "[0-9]+%",
                    &["1%", "93%"],
                ),
            ));
        }
        Some(Value::Number(n)) if n.as_i64().is_none_or(|n| n < 0) => {
            errs.push(invalid(
                p,
                &Value::Number(n.clone()),
                "must be greater than or equal to 0",
            ));
        }
        _ => {}
    }
}

/// The number of a `[0-9]+%` string.
fn percent_value(s: &str) -> Option<u64> {
    let digits = s.strip_suffix('%')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(digits.parse::<u64>().unwrap_or(u64::MAX))
}

/// upstream's `getIntOrPercentValue` compared with zero.
fn int_or_percent_is_zero(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => true,
        Some(Value::Number(n)) => n.as_i64() == Some(0),
        Some(Value::String(s)) => percent_value(s).unwrap_or(0) == 0,
        _ => false,
    }
}

/// upstream's `IsNotMoreThan100Percent`.
fn not_more_than_100_percent(v: Option<&Value>, p: &Path, errs: &mut Vec<FieldError>) {
    if let Some(Value::String(s)) = v
        && percent_value(s).is_some_and(|n| n > 100)
    {
        errs.push(invalid_raw(p, go_int_or_string(v), "must not be greater than 100%"));
    }
}

/// upstream's `ValidateRollingUpdateDeployment`.
fn validate_rolling_update_deployment(ru: Option<&Value>, p: &Path, errs: &mut Vec<FieldError>) {
    let mu = field(ru, "maxUnavailable");
    let ms = field(ru, "maxSurge");
    validate_int_or_percent(mu, &p.child("maxUnavailable"), errs);
    validate_int_or_percent(ms, &p.child("maxSurge"), errs);
    if int_or_percent_is_zero(mu) && int_or_percent_is_zero(ms) {
        errs.push(invalid_raw(
            &p.child("maxUnavailable"),
            go_int_or_string(mu),
            "may not be 0 when `maxSurge` is 0",
        ));
    }
    not_more_than_100_percent(mu, &p.child("maxUnavailable"), errs);
}

/// upstream's `ValidateRollingUpdateDaemonSet`: exactly one of maxSurge and maxUnavailable.
fn validate_rolling_update_daemonset(ru: Option<&Value>, p: &Path, errs: &mut Vec<FieldError>) {
    let mu = field(ru, "maxUnavailable");
    let ms = field(ru, "maxSurge");
    validate_int_or_percent(mu, &p.child("maxUnavailable"), errs);
    validate_int_or_percent(ms, &p.child("maxSurge"), errs);
    not_more_than_100_percent(mu, &p.child("maxUnavailable"), errs);
    not_more_than_100_percent(ms, &p.child("maxSurge"), errs);
    let has_unavailable = !int_or_percent_is_zero(mu);
    let has_surge = !int_or_percent_is_zero(ms);
    if has_unavailable && has_surge {
        errs.push(invalid_raw(
            &p.child("maxSurge"),
            go_int_or_string(ms),
            "may not be set when maxUnavailable is non-zero",
        ));
    } else if !has_unavailable && !has_surge {
        errs.push(required(&p.child("maxUnavailable"), "cannot be 0 when maxSurge is 0"));
    }
}

pub(crate) fn validate_deployment(obj: &Value, old: Option<&Value>, errs: &mut Vec<FieldError>) {
    let spec = spec_of(obj);
    let p = Path::new("spec");
    nonnegative(spec, "replicas", &p, errs);
    validate_required_selector(spec, &p, "deployment", errs);
    validate_template_for_replicaset(spec, &p, errs);
    let strategy = field(spec, "strategy");
    let sp = p.child("strategy");
    match str_at(strategy, "type") {
        "Recreate" => {
            if field(strategy, "rollingUpdate").is_some() {
                errs.push(forbidden(
                    &sp.child("rollingUpdate"),
                    "may not be specified when strategy `type` is 'Recreate'",
                ));
            }
        }
        "RollingUpdate" => match field(strategy, "rollingUpdate") {
            None => errs.push(required(
                &sp.child("rollingUpdate"),
                "this should be defaulted and never be nil",
            )),
            Some(ru) => validate_rolling_update_deployment(Some(ru), &sp.child("rollingUpdate"), errs),
        },
        other => errs.push(FieldError {
            kind: FieldErrorKind::NotSupported {
                value: format!(
                    "apps.DeploymentStrategy{{Type:{other:?}, RollingUpdate:{}}}",
                    go_ptr("apps.RollingUpdateDeployment", field(strategy, "rollingUpdate"))
                ),
                supported: vec!["\"Recreate\"".into(), "\"RollingUpdate\"".into()],
            },
            field: sp.as_str().to_string(),
            detail: String::new(),
        }),
    }
    nonnegative(spec, "minReadySeconds", &p, errs);
    nonnegative(spec, "revisionHistoryLimit", &p, errs);
    if let Some(pds) = field(spec, "progressDeadlineSeconds") {
        nonnegative(spec, "progressDeadlineSeconds", &p, errs);
        let min_ready = int_at(spec, "minReadySeconds").unwrap_or(0);
        if pds.as_i64().is_some_and(|v| v <= min_ready) {
            errs.push(invalid(
                &p.child("progressDeadlineSeconds"),
                pds,
                "must be greater than minReadySeconds",
            ));
        }
    }
    if let Some(old) = old {
        validate_selector_immutable(spec, spec_of(old), errs);
    }
}

pub(crate) fn validate_replicaset(obj: &Value, old: Option<&Value>, errs: &mut Vec<FieldError>) {
    let spec = spec_of(obj);
    let p = Path::new("spec");
    nonnegative(spec, "replicas", &p, errs);
    nonnegative(spec, "minReadySeconds", &p, errs);
    validate_required_selector(spec, &p, "deployment", errs);
    validate_template_for_replicaset(spec, &p, errs);
    if let Some(old) = old {
        validate_selector_immutable(spec, spec_of(old), errs);
    }
}

/// core's `ValidateReplicationController` (and `...Update`): an equality-based selector that
/// may not be empty and matches the template's labels, which is required and restarts always.
/// Through `status`, `ValidateReplicationControllerStatus` instead.
pub(crate) fn validate_replication_controller(obj: &Value, subresource: &str, errs: &mut Vec<FieldError>) {
    if subresource == "status" {
        validate_replication_controller_status(field(Some(obj), "status"), errs);
        return;
    }
    let spec = spec_of(obj);
    let p = Path::new("spec");
    nonnegative(spec, "minReadySeconds", &p, errs);
    let selector = field(spec, "selector").and_then(Value::as_object);
    if selector.is_none_or(|s| s.is_empty()) {
        errs.push(required(&p.child("selector"), ""));
    }
    nonnegative(spec, "replicas", &p, errs);
    let tp = p.child("template");
    let Some(template) = field(spec, "template").filter(|t| !t.is_null()) else {
        errs.push(required(&tp, ""));
        return;
    };
    if let Some(sel) = selector.filter(|s| !s.is_empty()) {
        let labels = template_labels(Some(template));
        let matches = sel
            .iter()
            .all(|(k, v)| labels.and_then(|l| l.get(k)).and_then(Value::as_str) == v.as_str());
        if !matches {
            errs.push(invalid_raw(
                &tp.child("metadata").child("labels"),
                go_string_map(labels),
                SELECTOR_MISMATCH,
            ));
        }
    }
    validate_pod_template(Some(template), &tp, errs);
    validate_always_restart(spec, &tp, "ReplicationController", errs);
}

/// core's `ValidateReplicationControllerStatus`.
fn validate_replication_controller_status(status: Option<&Value>, errs: &mut Vec<FieldError>) {
    let p = Path::new("status");
    for key in [
        "replicas",
        "fullyLabeledReplicas",
        "readyReplicas",
        "availableReplicas",
        "observedGeneration",
    ] {
        nonnegative(status, key, &p, errs);
    }
    let n = |key: &str| field(status, key).and_then(Value::as_i64).unwrap_or(0);
    let replicas = n("replicas");
    for key in ["fullyLabeledReplicas", "readyReplicas", "availableReplicas"] {
        if n(key) > replicas {
            errs.push(invalid(
                &p.child(key),
                &Value::from(n(key)),
                "cannot be greater than status.replicas",
            ));
        }
    }
    if n("availableReplicas") > n("readyReplicas") {
        errs.push(invalid(
            &p.child("availableReplicas"),
            &Value::from(n("availableReplicas")),
            "cannot be greater than readyReplicas",
        ));
    }
}

pub(crate) fn validate_daemonset(obj: &Value, old: Option<&Value>, errs: &mut Vec<FieldError>) {
    let spec = spec_of(obj);
    let p = Path::new("spec");
    let sel = field(spec, "selector");
    validate_label_selector(sel, &p.child("selector"), errs);
    let template = field(spec, "template");
    validate_template_matches(spec, &p.child("template"), errs);
    if sel.is_some() && selector_is_empty(sel) {
        errs.push(invalid_raw(
            &p.child("selector"),
            go_label_selector(sel),
            "empty selector is invalid for daemonset",
        ));
    }
    let tp = p.child("template");
    validate_pod_template(template, &tp, errs);
    validate_always_restart(spec, &tp, "DaemonSet", errs);
    nonnegative(spec, "minReadySeconds", &p, errs);
    nonnegative(spec, "templateGeneration", &p, errs);
    let us = field(spec, "updateStrategy");
    let up = p.child("updateStrategy");
    match str_at(us, "type") {
        "OnDelete" => {}
        "RollingUpdate" => match field(us, "rollingUpdate") {
            None => errs.push(required(&up.child("rollingUpdate"), "")),
            Some(ru) => validate_rolling_update_daemonset(Some(ru), &up.child("rollingUpdate"), errs),
        },
        other => errs.push(FieldError {
            kind: FieldErrorKind::NotSupported {
                value: format!(
                    "apps.DaemonSetUpdateStrategy{{Type:{other:?}, RollingUpdate:{}}}",
                    go_ptr("apps.RollingUpdateDaemonSet", field(us, "rollingUpdate"))
                ),
                supported: vec!["\"RollingUpdate\"".into(), "\"OnDelete\"".into()],
            },
            field: up.as_str().to_string(),
            detail: String::new(),
        }),
    }
    nonnegative(spec, "revisionHistoryLimit", &p, errs);
    if let Some(old) = old {
        validate_selector_immutable(spec, spec_of(old), errs);
    }
}

pub(crate) fn validate_statefulset(obj: &Value, old: Option<&Value>, errs: &mut Vec<FieldError>) {
    let spec = spec_of(obj);
    let p = Path::new("spec");
    let pmp = field(spec, "podManagementPolicy")
        .cloned()
        .unwrap_or(Value::String(String::new()));
    match pmp.as_str().unwrap_or("?") {
        "OrderedReady" | "Parallel" => {}
        "" => errs.push(required(&p.child("podManagementPolicy"), "")),
        _ => errs.push(invalid(
            &p.child("podManagementPolicy"),
            &pmp,
            "must be 'OrderedReady' or 'Parallel'",
        )),
    }
    let us = field(spec, "updateStrategy");
    let up = p.child("updateStrategy");
    let ru = field(us, "rollingUpdate");
    let go_ru = || {
        format!(
            "apps.RollingUpdateStatefulSetStrategy{{Partition:{}, MaxUnavailable:{}}}",
            int_at(ru, "partition").unwrap_or(0),
            go_ptr("intstr.IntOrString", field(ru, "maxUnavailable"))
        )
    };
    match str_at(us, "type") {
        "" => errs.push(required(&up, "")),
        "OnDelete" => {
            if ru.is_some() {
                errs.push(invalid_raw(
                    &up.child("rollingUpdate"),
                    go_ru(),
                    "only allowed for updateStrategy 'RollingUpdate'",
                ));
            }
        }
        "RollingUpdate" => {
            if ru.is_some() {
                nonnegative(ru, "partition", &up.child("rollingUpdate"), errs);
            }
        }
        other => errs.push(invalid_raw(
            &up,
            format!(
                "apps.StatefulSetUpdateStrategy{{Type:{other:?}, RollingUpdate:{}}}",
                go_ptr("apps.RollingUpdateStatefulSetStrategy", ru)
            ),
            "must be 'RollingUpdate' or 'OnDelete'",
        )),
    }
    if let Some(policy) = field(spec, "persistentVolumeClaimRetentionPolicy") {
        let pp = p.child("persistentVolumeClaimRetentionPolicy");
        for key in ["whenDeleted", "whenScaled"] {
            let v = field(Some(policy), key)
                .cloned()
                .unwrap_or(Value::String(String::new()));
            if !matches!(v.as_str(), Some("Retain" | "Delete")) {
                errs.push(not_supported(&pp.child(key), &v, &["Retain", "Delete"]));
            }
        }
    }
    nonnegative(spec, "replicas", &p, errs);
    nonnegative(spec, "minReadySeconds", &p, errs);
    if let Some(ord) = field(spec, "ordinals") {
        nonnegative(Some(ord), "start", &p.child("ordinals"), errs);
    }
    validate_required_selector(spec, &p, "statefulset", errs);
    // Upstream checks only the template's labels and annotations here, not its pod spec.
    let tp = p.child("template");
    validate_template_matches(spec, &tp, errs);
    validate_template_metadata(field(spec, "template"), &tp, errs);
    validate_always_restart(spec, &tp, "StatefulSet", errs);
    if let Some(old) = old {
        let os = spec_of(old);
        let updatable = [
            "replicas",
            "ordinals",
            "template",
            "updateStrategy",
            "persistentVolumeClaimRetentionPolicy",
            "minReadySeconds",
        ];
        let strip = |s: Option<&Value>| {
            let mut m = s.and_then(Value::as_object).cloned().unwrap_or_default();
            for k in updatable {
                m.remove(k);
            }
            m.retain(|_, v| !v.is_null());
            m
        };
        if strip(spec) != strip(os) {
            errs.push(forbidden(
                &p,
                "updates to statefulset spec for fields other than 'replicas', 'ordinals', 'template', 'updateStrategy', 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden",
            ));
        }
    }
}

/// upstream's `validateJobSpec` (shared by Jobs and CronJob job templates).
fn validate_job_spec(spec: Option<&Value>, p: &Path, errs: &mut Vec<FieldError>) {
    for key in [
        "parallelism",
        "completions",
        "activeDeadlineSeconds",
        "backoffLimit",
        "ttlSecondsAfterFinished",
    ] {
        nonnegative(spec, key, p, errs);
    }
    if let Some(mode) = field(spec, "completionMode") {
        match mode.as_str().unwrap_or("?") {
            "NonIndexed" => {}
            "Indexed" => {
                if field(spec, "completions").is_none() {
                    errs.push(required(&p.child("completions"), "when completion mode is Indexed"));
                }
                if let Some(par) = field(spec, "parallelism")
                    && par.as_i64().is_some_and(|n| n > 100_000)
                {
                    errs.push(invalid(
                        &p.child("parallelism"),
                        par,
                        "must be less than or equal to 100000 when completion mode is Indexed",
                    ));
                }
            }
            _ => errs.push(not_supported(
                &p.child("completionMode"),
                mode,
                &["NonIndexed", "Indexed"],
            )),
        }
    }
    let tp = p.child("template");
    let template = field(spec, "template");
    validate_pod_template(template, &tp, errs);
    let rp = field(field(template, "spec"), "restartPolicy")
        .cloned()
        .unwrap_or(Value::String(String::new()));
    let rpp = tp.child("spec").child("restartPolicy");
    match rp.as_str().unwrap_or("?") {
        "OnFailure" | "Never" => {}
        "Always" | "" => errs.push(required(&rpp, "valid values: \"OnFailure\", \"Never\"")),
        _ => errs.push(not_supported(&rpp, &rp, &["OnFailure", "Never"])),
    }
}

/// upstream's `ValidateHasLabel`.
fn validate_has_label(labels: Option<&Value>, lp: &Path, key: &str, want: &str, errs: &mut Vec<FieldError>) {
    match labels.and_then(|l| l.get(key)) {
        None => errs.push(required(&lp.key(key), want)),
        Some(v) if v.as_str() != Some(want) => errs.push(invalid_raw(
            &lp.key(key),
            go_string_map(labels),
            &format!("must be '{want}'"),
        )),
        Some(_) => {}
    }
}

pub(crate) fn validate_job(obj: &Value, old: Option<&Value>, errs: &mut Vec<FieldError>) {
    let spec = spec_of(obj);
    let p = Path::new("spec");
    let meta = field(Some(obj), "metadata");
    let manual = field(spec, "manualSelector").and_then(Value::as_bool) == Some(true);
    let sel = field(spec, "selector");
    // upstream's `ValidateGeneratedSelector`.
    if !manual && sel.is_some() {
        let uid = str_at(meta, "uid");
        let name = str_at(meta, "name");
        if uid.is_empty() {
            errs.push(required(&Path::new("metadata").child("uid"), ""));
        }
        let labels = template_labels(field(spec, "template"));
        let lp = p.child("template").child("metadata").child("labels");
        validate_has_label(labels, &lp, LEGACY_CONTROLLER_UID_LABEL, uid, errs);
        validate_has_label(labels, &lp, LEGACY_JOB_NAME_LABEL, name, errs);
        validate_has_label(labels, &lp, CONTROLLER_UID_LABEL, uid, errs);
        validate_has_label(labels, &lp, JOB_NAME_LABEL, name, errs);
        let expected = serde_json::json!({ CONTROLLER_UID_LABEL: uid });
        if !selector_matches(sel, Some(&expected)) {
            errs.push(invalid_raw(
                &p.child("selector"),
                go_label_selector(sel),
                "`selector` not auto-generated",
            ));
        }
    }
    // upstream's `ValidateJobSpec`.
    validate_job_spec(spec, &p, errs);
    match sel {
        None => errs.push(required(&p.child("selector"), "")),
        Some(s) => validate_label_selector(Some(s), &p.child("selector"), errs),
    }
    validate_template_matches(spec, &p.child("template"), errs);
    if let Some(old) = old {
        let os = spec_of(old);
        let indexed = str_at(spec, "completionMode") == "Indexed";
        let (nc, oc) = (field(spec, "completions"), field(os, "completions"));
        if nc != oc && !(indexed && nc.is_some() && nc == field(spec, "parallelism")) {
            errs.push(invalid(
                &p.child("completions"),
                nc.unwrap_or(&Value::Null),
                "field is immutable",
            ));
        }
        validate_selector_immutable(spec, os, errs);
        let (nt, ot) = (field(spec, "template"), field(os, "template"));
        if nt != ot {
            let suspended = field(spec, "suspend").and_then(Value::as_bool) == Some(true);
            let only_scheduling = suspended && {
                let strip = |t: Option<&Value>| {
                    let mut t = t.cloned().unwrap_or(Value::Null);
                    if let Some(s) = t.get_mut("spec").and_then(Value::as_object_mut) {
                        for k in ["nodeSelector", "affinity", "tolerations", "schedulingGates"] {
                            s.remove(k);
                        }
                    }
                    if let Some(m) = t.get_mut("metadata").and_then(Value::as_object_mut) {
                        m.remove("labels");
                        m.remove("annotations");
                    }
                    t
                };
                strip(nt) == strip(ot)
            };
            if !only_scheduling {
                errs.push(invalid_raw(
                    &p.child("template"),
                    nt.map(|t| t.to_string()).unwrap_or_else(|| "null".into()),
                    "field is immutable",
                ));
            }
        }
        let (nm, om) = (field(spec, "completionMode"), field(os, "completionMode"));
        if nm != om {
            errs.push(invalid(
                &p.child("completionMode"),
                nm.unwrap_or(&Value::Null),
                "field is immutable",
            ));
        }
    }
}

pub(crate) fn validate_cronjob(obj: &Value, errs: &mut Vec<FieldError>) {
    let p = Path::new("spec");
    let spec = spec_of(obj);
    let schedule = str_at(spec, "schedule");
    if schedule.is_empty() {
        errs.push(required(&p.child("schedule"), ""));
    } else {
        if let Err(msg) = validate_cron_schedule(schedule) {
            errs.push(invalid_str(&p.child("schedule"), schedule, &msg));
        }
        if schedule.contains("TZ") {
            errs.push(invalid_str(
                &p.child("schedule"),
                schedule,
                "cannot use TZ or CRON_TZ in schedule, use timeZone field instead",
            ));
        }
    }
    nonnegative(spec, "startingDeadlineSeconds", &p, errs);
    let cp = field(spec, "concurrencyPolicy")
        .cloned()
        .unwrap_or(Value::String(String::new()));
    match cp.as_str().unwrap_or("?") {
        "Allow" | "Forbid" | "Replace" => {}
        "" => errs.push(required(&p.child("concurrencyPolicy"), "")),
        _ => errs.push(not_supported(
            &p.child("concurrencyPolicy"),
            &cp,
            &["Allow", "Forbid", "Replace"],
        )),
    }
    let jt = field(spec, "jobTemplate");
    let jp = p.child("jobTemplate");
    let js = field(jt, "spec");
    validate_job_spec(js, &jp.child("spec"), errs);
    if let Some(sel) = field(js, "selector")
        && field(js, "manualSelector").and_then(Value::as_bool) != Some(true)
    {
        errs.push(invalid_raw(
            &jp.child("spec").child("selector"),
            go_label_selector(Some(sel)),
            "`selector` will be auto-generated",
        ));
    }
    nonnegative(spec, "successfulJobsHistoryLimit", &p, errs);
    nonnegative(spec, "failedJobsHistoryLimit", &p, errs);
    let name = str_at(field(Some(obj), "metadata"), "name");
    if name.len() > 52 {
        errs.push(invalid_str(
            &Path::new("metadata").child("name"),
            name,
            "must be no more than 52 characters",
        ));
    }
}

/// upstream's `ValidatePodDisruptionBudgetSpec`.
pub(crate) fn validate_pdb(obj: &Value, errs: &mut Vec<FieldError>) {
    let spec = spec_of(obj);
    let p = Path::new("spec");
    let min = field(spec, "minAvailable");
    let max = field(spec, "maxUnavailable");
    if min.is_some() && max.is_some() {
        errs.push(invalid_raw(
            &p,
            format!(
                "policy.PodDisruptionBudgetSpec{{MinAvailable:{}, Selector:{}, MaxUnavailable:{}, UnhealthyPodEvictionPolicy:{}}}",
                go_ptr("intstr.IntOrString", min),
                go_ptr("v1.LabelSelector", field(spec, "selector")),
                go_ptr("intstr.IntOrString", max),
                go_ptr("policy.UnhealthyPodEvictionPolicyType", field(spec, "unhealthyPodEvictionPolicy")),
            ),
            "minAvailable and maxUnavailable cannot be both set",
        ));
    }
    for (key, v) in [("minAvailable", min), ("maxUnavailable", max)] {
        if v.is_some() {
            validate_int_or_percent(v, &p.child(key), errs);
            not_more_than_100_percent(v, &p.child(key), errs);
        }
    }
    validate_label_selector(field(spec, "selector"), &p.child("selector"), errs);
    if let Some(policy) = field(spec, "unhealthyPodEvictionPolicy")
        && !matches!(policy.as_str(), Some("AlwaysAllow" | "IfHealthyBudget"))
    {
        errs.push(not_supported(
            &p.child("unhealthyPodEvictionPolicy"),
            policy,
            &["AlwaysAllow", "IfHealthyBudget"],
        ));
    }
}

// ---- cron schedules -----------------------------------------------------------------------

struct Bounds {
    min: u32,
    max: u32,
    names: &'static [&'static str],
    /// The number the first name stands for.
    names_from: u32,
}

const MINUTES: Bounds = Bounds {
    min: 0,
    max: 59,
    names: &[],
    names_from: 0,
};
const HOURS: Bounds = Bounds {
    min: 0,
    max: 23,
    names: &[],
    names_from: 0,
};
const DOM: Bounds = Bounds {
    min: 1,
    max: 31,
    names: &[],
    names_from: 0,
};
const MONTHS: Bounds = Bounds {
    min: 1,
    max: 12,
    names: &[
        "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
    ],
    names_from: 1,
};
const DOW: Bounds = Bounds {
    min: 0,
    max: 6,
    names: &["sun", "mon", "tue", "wed", "thu", "fri", "sat"],
    names_from: 0,
};

/// Go's `strconv.Atoi` followed by the cron parser's non-negative check.
fn must_parse_int(expr: &str) -> Result<u32, String> {
    let n: i64 = expr
        .parse()
        .map_err(|_| format!("failed to parse int from {expr}: strconv.Atoi: parsing {expr:?}: invalid syntax"))?;
    if n < 0 {
        return Err(format!("negative number ({n}) not allowed: {expr}"));
    }
    u32::try_from(n)
        .map_err(|_| format!("failed to parse int from {expr}: strconv.Atoi: parsing {expr:?}: value out of range"))
}

fn parse_int_or_name(expr: &str, b: &Bounds) -> Result<u32, String> {
    let lower = expr.to_lowercase();
    if let Some(i) = b.names.iter().position(|n| *n == lower) {
        return Ok(b.names_from + i as u32);
    }
    must_parse_int(expr)
}

fn check_range(expr: &str, b: &Bounds) -> Result<(), String> {
    let range_and_step: Vec<&str> = expr.split('/').collect();
    let low_and_high: Vec<&str> = range_and_step[0].split('-').collect();
    let single = low_and_high.len() == 1;
    let (start, mut end) = if low_and_high[0] == "*" || low_and_high[0] == "?" {
        (b.min, b.max)
    } else {
        let start = parse_int_or_name(low_and_high[0], b)?;
        let end = match low_and_high.len() {
            1 => start,
            2 => parse_int_or_name(low_and_high[1], b)?,
            _ => return Err(format!("too many hyphens: {expr}")),
        };
        (start, end)
    };
    let step = match range_and_step.len() {
        1 => 1,
        2 => {
            let step = must_parse_int(range_and_step[1])?;
            if single {
                end = b.max;
            }
            step
        }
        _ => return Err(format!("too many slashes: {expr}")),
    };
    if start < b.min {
        return Err(format!(
            "beginning of range ({start}) below minimum ({}): {expr}",
            b.min
        ));
    }
    if end > b.max {
        return Err(format!("end of range ({end}) above maximum ({}): {expr}", b.max));
    }
    if start > end {
        return Err(format!(
            "beginning of range ({start}) beyond end of range ({end}): {expr}"
        ));
    }
    if step == 0 {
        return Err(format!("step of range should be a positive number: {expr}"));
    }
    Ok(())
}

/// Check a schedule as upstream's cron library (`ParseStandard`) parses it: five fields or a
/// descriptor such as `@hourly`; the error is the library's message.
pub fn validate_cron_schedule(schedule: &str) -> Result<(), String> {
    let mut spec = schedule.trim();
    if spec.is_empty() {
        return Err("empty spec string".to_string());
    }
    for prefix in ["TZ=", "CRON_TZ="] {
        if let Some(rest) = spec.strip_prefix(prefix) {
            let Some((_, after)) = rest.split_once(' ') else {
                return Err(format!("provided bad location {rest}: unknown time zone {rest}"));
            };
            spec = after.trim();
        }
    }
    if let Some(d) = spec.strip_prefix('@') {
        return match d {
            "yearly" | "annually" | "monthly" | "weekly" | "daily" | "midnight" | "hourly" => Ok(()),
            _ if d.starts_with("every ") => {
                let dur = d["every ".len()..].trim();
                if parse_go_duration(dur).is_some() {
                    Ok(())
                } else {
                    Err(format!(
                        "failed to parse duration {spec}: time: invalid duration {dur:?}"
                    ))
                }
            }
            _ => Err(format!("unrecognized descriptor: {spec}")),
        };
    }
    let fields: Vec<&str> = spec.split_whitespace().collect();
    if fields.len() != 5 {
        return Err(format!(
            "expected exactly 5 fields, found {}: [{}]",
            fields.len(),
            fields.join(" ")
        ));
    }
    for (f, b) in fields.iter().zip([MINUTES, HOURS, DOM, MONTHS, DOW]) {
        for part in f.split(',') {
            check_range(part, &b)?;
        }
    }
    Ok(())
}

/// A Go duration such as `1h30m`, `1.5h` or `90s` (Go's `time.ParseDuration`, unsigned, as `@every`
/// takes it), or None when it is not one.
pub fn parse_go_duration(s: &str) -> Option<std::time::Duration> {
    let mut rest = s;
    if rest.is_empty() {
        return None;
    }
    if rest == "0" {
        return Some(std::time::Duration::ZERO);
    }
    let mut nanos = 0f64;
    while !rest.is_empty() {
        let num_len = rest.bytes().take_while(|b| b.is_ascii_digit() || *b == b'.').count();
        if num_len == 0 {
            return None;
        }
        let number: f64 = rest[..num_len].parse().ok()?;
        rest = &rest[num_len..];
        let unit_len: usize = rest
            .chars()
            .take_while(|c| c.is_ascii_alphabetic() || *c == 'µ' || *c == 'μ')
            .map(char::len_utf8)
            .sum();
        let unit = match &rest[..unit_len] {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        nanos += number * unit;
        rest = &rest[unit_len..];
    }
    // Go's durations stop at about 290 years.
    (nanos <= i64::MAX as f64).then(|| std::time::Duration::from_nanos(nanos as u64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validation::test_util::{errors, errors_defaulted};
    use serde_json::json;

    fn deployment(sel: Value, labels: Value) -> Value {
        json!({"metadata": {"name": "web", "namespace": "default"},
               "spec": {"selector": sel, "template": {"metadata": {"labels": labels},
                        "spec": {"containers": [{"name": "web", "image": "nginx"}]}}}})
    }

    fn rc(spec: Value) -> Value {
        json!({"metadata": {"name": "web", "namespace": "default"}, "spec": spec})
    }

    #[test]
    fn replication_controller_rules() {
        let containers = json!([{"name": "web", "image": "nginx"}]);
        // The selector defaults from the template's labels.
        let ok = rc(json!({"template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": containers}}}));
        assert!(errors_defaulted("", "ReplicationController", &ok, None).is_empty());
        let bad = rc(json!({"replicas": -1, "selector": {"app": "web"},
            "template": {"metadata": {"labels": {"app": "db"}},
                         "spec": {"containers": containers, "restartPolicy": "Never", "activeDeadlineSeconds": 5}}}));
        assert_eq!(
            errors_defaulted("", "ReplicationController", &bad, None),
            vec![
                "spec.replicas: Invalid value: -1: must be greater than or equal to 0",
                "spec.template.metadata.labels: Invalid value: map[string]string{\"app\":\"db\"}: `selector` does not match template `labels`",
                "spec.template.spec.restartPolicy: Unsupported value: \"Never\": supported values: \"Always\"",
                "spec.template.spec.activeDeadlineSeconds: Forbidden: activeDeadlineSeconds in ReplicationController is not Supported",
            ]
        );
        assert_eq!(
            errors_defaulted("", "ReplicationController", &rc(json!({})), None),
            vec!["spec.selector: Required value", "spec.template: Required value"]
        );
    }

    #[test]
    fn replication_controller_status_rules() {
        let mut errs = Vec::new();
        let obj =
            json!({"status": {"replicas": 1, "readyReplicas": 2, "availableReplicas": 3, "observedGeneration": -1}});
        validate_replication_controller(&obj, "status", &mut errs);
        let got: Vec<String> = errs.iter().map(ToString::to_string).collect();
        assert_eq!(
            got,
            vec![
                "status.observedGeneration: Invalid value: -1: must be greater than or equal to 0",
                "status.readyReplicas: Invalid value: 2: cannot be greater than status.replicas",
                "status.availableReplicas: Invalid value: 3: cannot be greater than status.replicas",
                "status.availableReplicas: Invalid value: 3: cannot be greater than readyReplicas",
            ]
        );
    }

    #[test]
    fn deployment_selector_must_match() {
        let ok = deployment(json!({"matchLabels": {"app": "web"}}), json!({"app": "web"}));
        assert!(errors_defaulted("apps", "Deployment", &ok, None).is_empty());
        let bad = deployment(json!({"matchLabels": {"app": "web"}}), json!({"app": "db"}));
        assert_eq!(
            errors_defaulted("apps", "Deployment", &bad, None),
            vec![
                "spec.template.metadata.labels: Invalid value: map[string]string{\"app\":\"db\"}: `selector` does not match template `labels`"
            ]
        );
        let missing = json!({"metadata": {"name": "web", "namespace": "default"},
            "spec": {"template": {"spec": {"containers": [{"name": "web", "image": "nginx"}]}}}});
        assert_eq!(
            errors_defaulted("apps", "Deployment", &missing, None),
            vec![
                "spec.selector: Required value",
                "spec.template.metadata.labels: Invalid value: map[string]string(nil): `selector` does not match template `labels`",
            ]
        );
        let empty = deployment(json!({}), json!({"app": "web"}));
        assert_eq!(
            errors_defaulted("apps", "Deployment", &empty, None),
            vec![
                "spec.selector: Invalid value: v1.LabelSelector{MatchLabels:map[string]string(nil), MatchExpressions:[]v1.LabelSelectorRequirement(nil)}: empty selector is invalid for deployment"
            ]
        );
    }

    #[test]
    fn deployment_fields() {
        let mut d = deployment(json!({"matchLabels": {"app": "web"}}), json!({"app": "web"}));
        d["spec"]["replicas"] = json!(-1);
        d["spec"]["revisionHistoryLimit"] = json!(-2);
        d["spec"]["strategy"] =
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "120%", "maxSurge": "x"}});
        d["spec"]["template"]["spec"]["restartPolicy"] = json!("Never");
        let e = errors_defaulted("apps", "Deployment", &d, None);
        assert_eq!(
            e,
            vec![
                "spec.replicas: Invalid value: -1: must be greater than or equal to 0",
                "spec.template.spec.restartPolicy: Unsupported value: \"Never\": supported values: \"Always\"",
                "spec.strategy.rollingUpdate.maxSurge: Invalid value: intstr.IntOrString{Type:1, IntVal:0, StrVal:\"x\"}: a valid percent string must be a numeric string followed by an ending '%' (e.g. '1%',  or '93%', regex used for validation is '[0-9]+%')",
                "spec.strategy.rollingUpdate.maxUnavailable: Invalid value: intstr.IntOrString{Type:1, IntVal:0, StrVal:\"120%\"}: must not be greater than 100%",
                "spec.revisionHistoryLimit: Invalid value: -2: must be greater than or equal to 0",
            ]
        );
        let mut z = deployment(json!({"matchLabels": {"app": "web"}}), json!({"app": "web"}));
        z["spec"]["strategy"] =
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": "0%"}});
        assert_eq!(
            errors_defaulted("apps", "Deployment", &z, None),
            vec![
                "spec.strategy.rollingUpdate.maxUnavailable: Invalid value: intstr.IntOrString{Type:0, IntVal:0, StrVal:\"\"}: may not be 0 when `maxSurge` is 0"
            ]
        );
        let mut r = deployment(json!({"matchLabels": {"app": "web"}}), json!({"app": "web"}));
        r["spec"]["strategy"] = json!({"type": "Recreate", "rollingUpdate": {}});
        assert_eq!(
            errors_defaulted("apps", "Deployment", &r, None),
            vec!["spec.strategy.rollingUpdate: Forbidden: may not be specified when strategy `type` is 'Recreate'"]
        );
        let mut t = deployment(json!({"matchLabels": {"app": "web"}}), json!({"app": "web"}));
        t["spec"]["strategy"] = json!({"type": "Blue"});
        assert_eq!(
            errors_defaulted("apps", "Deployment", &t, None),
            vec![
                "spec.strategy: Unsupported value: apps.DeploymentStrategy{Type:\"Blue\", RollingUpdate:(*apps.RollingUpdateDeployment)(nil)}: supported values: \"Recreate\", \"RollingUpdate\""
            ]
        );
    }

    #[test]
    fn selectors_are_immutable() {
        // StatefulSets report any change outside the updatable fields as one Forbidden error
        // (see `daemonset_and_statefulset`).
        for (group, kind) in [("apps", "Deployment"), ("apps", "DaemonSet"), ("apps", "ReplicaSet")] {
            let old = deployment(json!({"matchLabels": {"app": "web"}}), json!({"app": "web", "v": "2"}));
            let new = deployment(
                json!({"matchLabels": {"app": "web", "v": "2"}}),
                json!({"app": "web", "v": "2"}),
            );
            let res = crate::registry::lookup_kind(group, kind).expect("kind");
            let (mut old, mut new) = (old, new);
            crate::defaults::apply_defaults(res, &mut old);
            crate::defaults::apply_defaults(res, &mut new);
            let e = errors(group, kind, &new, Some(&old));
            assert!(
                e.contains(&"spec.selector: Invalid value: v1.LabelSelector{MatchLabels:map[string]string{\"app\":\"web\", \"v\":\"2\"}, MatchExpressions:[]v1.LabelSelectorRequirement(nil)}: field is immutable".to_string()),
                "{kind}: {e:?}"
            );
        }
    }

    #[test]
    fn daemonset_and_statefulset() {
        let mut ds = deployment(json!({"matchLabels": {"app": "web"}}), json!({"app": "web"}));
        ds["spec"]["updateStrategy"] = json!({"type": "Sometimes"});
        assert_eq!(
            errors_defaulted("apps", "DaemonSet", &ds, None),
            vec![
                "spec.updateStrategy: Unsupported value: apps.DaemonSetUpdateStrategy{Type:\"Sometimes\", RollingUpdate:(*apps.RollingUpdateDaemonSet)(nil)}: supported values: \"RollingUpdate\", \"OnDelete\""
            ]
        );
        let ds = deployment(json!({"matchLabels": {"app": "web"}}), json!({"app": "x"}));
        assert_eq!(
            errors_defaulted("apps", "DaemonSet", &ds, None),
            vec![
                "spec.template.metadata.labels: Invalid value: map[string]string{\"app\":\"x\"}: `selector` does not match template `labels`"
            ]
        );
        let mut both = deployment(json!({"matchLabels": {"app": "web"}}), json!({"app": "web"}));
        both["spec"]["updateStrategy"] =
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": "10%"}});
        assert_eq!(
            errors_defaulted("apps", "DaemonSet", &both, None),
            vec![
                "spec.updateStrategy.rollingUpdate.maxSurge: Invalid value: intstr.IntOrString{Type:1, IntVal:0, StrVal:\"10%\"}: may not be set when maxUnavailable is non-zero"
            ]
        );
        let mut none = deployment(json!({"matchLabels": {"app": "web"}}), json!({"app": "web"}));
        none["spec"]["updateStrategy"] =
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 0}});
        assert_eq!(
            errors_defaulted("apps", "DaemonSet", &none, None),
            vec!["spec.updateStrategy.rollingUpdate.maxUnavailable: Required value: cannot be 0 when maxSurge is 0"]
        );
        let mut dotted = deployment(json!({"matchLabels": {"app": "web"}}), json!({"app": "web"}));
        dotted["metadata"]["name"] = json!("web.v1");
        let e = errors_defaulted("apps", "StatefulSet", &dotted, None);
        assert_eq!(e.len(), 1);
        assert!(e[0].starts_with("metadata.name: Invalid value: \"web.v1\": a lowercase RFC 1123 label"));
        let mut sts = deployment(json!({"matchLabels": {"app": "web"}}), json!({"app": "web"}));
        sts["spec"]["podManagementPolicy"] = json!("Random");
        assert_eq!(
            errors_defaulted("apps", "StatefulSet", &sts, None),
            vec!["spec.podManagementPolicy: Invalid value: \"Random\": must be 'OrderedReady' or 'Parallel'"]
        );
        let old = {
            let mut s = deployment(json!({"matchLabels": {"app": "web"}}), json!({"app": "web"}));
            s["spec"]["serviceName"] = json!("a");
            s
        };
        let mut new = old.clone();
        new["spec"]["serviceName"] = json!("b");
        new["spec"]["replicas"] = json!(5);
        let e = errors_defaulted("apps", "StatefulSet", &new, Some(&old));
        assert_eq!(
            e,
            vec![
                "spec: Forbidden: updates to statefulset spec for fields other than 'replicas', 'ordinals', 'template', 'updateStrategy', 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden"
            ]
        );
    }

    fn job(restart: &str) -> Value {
        json!({"metadata": {"name": "pi", "namespace": "default", "uid": "u1"},
               "spec": {"template": {"spec": {"restartPolicy": restart, "containers": [{"name": "pi", "image": "perl"}]}}}})
    }

    #[test]
    fn jobs() {
        assert!(errors_defaulted("batch", "Job", &job("Never"), None).is_empty());
        assert_eq!(
            errors_defaulted("batch", "Job", &job(""), None),
            vec!["spec.template.spec.restartPolicy: Required value: valid values: \"OnFailure\", \"Never\""]
        );
        let mut j = job("OnFailure");
        j["spec"]["backoffLimit"] = json!(-1);
        j["spec"]["completionMode"] = json!("Sometimes");
        assert_eq!(
            errors_defaulted("batch", "Job", &j, None),
            vec![
                "spec.backoffLimit: Invalid value: -1: must be greater than or equal to 0",
                "spec.completionMode: Unsupported value: \"Sometimes\": supported values: \"NonIndexed\", \"Indexed\"",
            ]
        );
        // Manual selectors must match the template.
        let mut m = job("Never");
        m["spec"]["manualSelector"] = json!(true);
        m["spec"]["selector"] = json!({"matchLabels": {"a": "b"}});
        assert_eq!(
            errors_defaulted("batch", "Job", &m, None),
            vec![
                "spec.template.metadata.labels: Invalid value: map[string]string(nil): `selector` does not match template `labels`"
            ]
        );
        // The template may not change once the job exists.
        let res = crate::registry::lookup_kind("batch", "Job").expect("job");
        let mut old = job("Never");
        crate::defaults::apply_defaults(res, &mut old);
        let mut new = old.clone();
        new["spec"]["template"]["spec"]["containers"][0]["image"] = json!("perl:2");
        let e = errors("batch", "Job", &new, Some(&old));
        assert_eq!(e.len(), 1);
        assert!(e[0].starts_with("spec.template: Invalid value: "));
        assert!(e[0].ends_with(": field is immutable"));
        let mut sel = old.clone();
        sel["spec"]["selector"] = json!({"matchLabels": {"batch.kubernetes.io/controller-uid": "other"}});
        let e = errors("batch", "Job", &sel, Some(&old));
        assert!(e.iter().any(|x| x.ends_with("`selector` not auto-generated")), "{e:?}");
        assert!(e.iter().any(|x| x.ends_with("field is immutable")), "{e:?}");
    }

    #[test]
    fn pod_disruption_budgets() {
        let pdb = |spec: Value| json!({"metadata": {"name": "b", "namespace": "d"}, "spec": spec});
        assert!(
            errors(
                "policy",
                "PodDisruptionBudget",
                &pdb(json!({"minAvailable": 1, "selector": {"matchLabels": {"a": "b"}}})),
                None
            )
            .is_empty()
        );
        assert_eq!(
            errors(
                "policy",
                "PodDisruptionBudget",
                &pdb(json!({"minAvailable": "150%", "maxUnavailable": -1})),
                None
            ),
            vec![
                "spec: Invalid value: policy.PodDisruptionBudgetSpec{MinAvailable:(*intstr.IntOrString)(0xc000000000), Selector:(*v1.LabelSelector)(nil), MaxUnavailable:(*intstr.IntOrString)(0xc000000000), UnhealthyPodEvictionPolicy:(*policy.UnhealthyPodEvictionPolicyType)(nil)}: minAvailable and maxUnavailable cannot be both set",
                "spec.minAvailable: Invalid value: intstr.IntOrString{Type:1, IntVal:0, StrVal:\"150%\"}: must not be greater than 100%",
                "spec.maxUnavailable: Invalid value: -1: must be greater than or equal to 0",
            ]
        );
    }

    #[test]
    fn cron_schedules() {
        assert_eq!(validate_cron_schedule("*/5 * * * *"), Ok(()));
        assert_eq!(validate_cron_schedule("0 9-17 * JAN-mar mon,FRI"), Ok(()));
        assert_eq!(validate_cron_schedule("@hourly"), Ok(()));
        assert_eq!(validate_cron_schedule("@every 1h30m"), Ok(()));
        assert!(validate_cron_schedule("@every 5\u{00a0}s").is_err());
        assert!(validate_cron_schedule("@every 5µs").is_ok());
        assert_eq!(validate_cron_schedule("5/15 0 1 1 0"), Ok(()));
        assert_eq!(
            validate_cron_schedule("* * * *"),
            Err("expected exactly 5 fields, found 4: [* * * *]".to_string())
        );
        assert_eq!(
            validate_cron_schedule("60 * * * *"),
            Err("end of range (60) above maximum (59): 60".to_string())
        );
        assert_eq!(
            validate_cron_schedule("* * 0 * *"),
            Err("beginning of range (0) below minimum (1): 0".to_string())
        );
        assert_eq!(
            validate_cron_schedule("* * * * 7"),
            Err("end of range (7) above maximum (6): 7".to_string())
        );
        assert_eq!(
            validate_cron_schedule("5-1 * * * *"),
            Err("beginning of range (5) beyond end of range (1): 5-1".to_string())
        );
        assert_eq!(
            validate_cron_schedule("x * * * *"),
            Err("failed to parse int from x: strconv.Atoi: parsing \"x\": invalid syntax".to_string())
        );
        assert_eq!(
            validate_cron_schedule("*/0 * * * *"),
            Err("step of range should be a positive number: */0".to_string())
        );
        assert_eq!(
            validate_cron_schedule("1-2-3 * * * *"),
            Err("too many hyphens: 1-2-3".to_string())
        );
        assert_eq!(
            validate_cron_schedule("@fortnightly"),
            Err("unrecognized descriptor: @fortnightly".to_string())
        );
    }

    #[test]
    fn cronjobs() {
        let cj = |schedule: &str, policy: &str| {
            json!({"metadata": {"name": "tick", "namespace": "default"},
                   "spec": {"schedule": schedule, "concurrencyPolicy": policy, "jobTemplate": {"spec": {"template": {"spec": {
                       "restartPolicy": "OnFailure", "containers": [{"name": "a", "image": "busybox"}]}}}}}})
        };
        assert!(errors_defaulted("batch", "CronJob", &cj("*/1 * * * *", "Forbid"), None).is_empty());
        assert_eq!(
            errors_defaulted("batch", "CronJob", &cj("* * *", "Sometimes"), None),
            vec![
                "spec.schedule: Invalid value: \"* * *\": expected exactly 5 fields, found 3: [* * *]",
                "spec.concurrencyPolicy: Unsupported value: \"Sometimes\": supported values: \"Allow\", \"Forbid\", \"Replace\"",
            ]
        );
        assert_eq!(
            errors_defaulted("batch", "CronJob", &cj("TZ=UTC * * * * *", "Allow"), None),
            vec![
                "spec.schedule: Invalid value: \"TZ=UTC * * * * *\": cannot use TZ or CRON_TZ in schedule, use timeZone field instead"
            ]
        );
        let mut long = cj("* * * * *", "Allow");
        long["metadata"]["name"] = json!("a".repeat(53));
        let e = errors_defaulted("batch", "CronJob", &long, None);
        assert_eq!(e.len(), 1);
        assert!(e[0].ends_with("must be no more than 52 characters"));
    }
}
