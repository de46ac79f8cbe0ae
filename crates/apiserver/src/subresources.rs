//! Subresources: status (and a CertificateSigningRequest's approval), a pod's ephemeralcontainers, scale, binding, eviction, namespace finalize, a service account's
//! token (`token_request`); node-agent streams (log, exec, attach, portforward) are proxied
//! in `proxy`.

use axum::response::Response;
use bytes::Bytes;
use http::{Method, StatusCode};
use serde_json::{Value, json};
use skiff_api::StatusError;

use crate::body;
use crate::handlers::{Ctx, render_one};
use crate::objects::{self, metadata_mut};
use crate::raw::RawObject;
use crate::write::{self, UpdateScope, Written};

pub async fn handle(ctx: Ctx, bytes: Bytes) -> Result<Response, StatusError> {
    let res = ctx.rr.resource;
    let sub = ctx.rr.subresource.clone();
    if !res.has_subresource(&sub) {
        return Err(StatusError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        ));
    }
    match (sub.as_str(), ctx.method.clone()) {
        ("status" | "approval", Method::GET) => crate::read::get(&ctx).await,
        ("status" | "approval", Method::PUT) => {
            let obj = body::decode(&ctx.headers, &bytes)?;
            let (w, warnings) = write::update_object(&ctx, obj, UpdateScope::Status).await?;
            let mut r = render_one(&ctx, StatusCode::OK, w.object());
            body::add_warnings(&mut r, &warnings);
            Ok(r)
        }
        ("status" | "approval", Method::PATCH) => {
            let (w, code) = write::patch_object(&ctx, bytes, UpdateScope::Status).await?;
            Ok(render_one(&ctx, code, w.object()))
        }
        ("ephemeralcontainers", Method::GET) => crate::read::get(&ctx).await,
        ("ephemeralcontainers", Method::PUT) => {
            let obj = body::decode(&ctx.headers, &bytes)?;
            let (w, warnings) = write::update_object(&ctx, obj, UpdateScope::EphemeralContainers).await?;
            let mut r = render_one(&ctx, StatusCode::OK, w.object());
            body::add_warnings(&mut r, &warnings);
            Ok(r)
        }
        ("ephemeralcontainers", Method::PATCH) => {
            let (w, code) = write::patch_object(&ctx, bytes, UpdateScope::EphemeralContainers).await?;
            Ok(render_one(&ctx, code, w.object()))
        }
        ("scale", Method::GET) => {
            let (obj, _) = ctx.current().await?;
            Ok(body::value_response(StatusCode::OK, &scale_for(ctx.rr.resource, &obj)))
        }
        ("scale", Method::PUT | Method::PATCH) => scale_write(&ctx, bytes).await,
        ("binding", Method::POST) => create_binding(&ctx, bytes, Some(ctx.rr.name.clone())).await,
        ("eviction", Method::POST) => evict(&ctx, bytes).await,
        ("token", Method::POST) => crate::token_request::create(&ctx, bytes).await,
        ("finalize", Method::PUT) => {
            let obj = body::decode(&ctx.headers, &bytes)?;
            finalize_namespace(&ctx, obj).await
        }
        _ => Err(StatusError::method_not_allowed(
            "the server does not allow this method on the requested resource",
        )),
    }
}

/// A JSONPath of `subresources.scale` (`.spec.replicas`) as a JSON pointer.
fn pointer_of(path: &str) -> String {
    path.replace('.', "/")
}

/// The autoscaling/v1 Scale of an object of `res`: a custom resource's from the paths its
/// definition names (`specReplicasPath`, `statusReplicasPath`, `labelSelectorPath`).
pub fn scale_for(res: &skiff_api::Resource, obj: &Value) -> Value {
    let Some(scale) =
        skiff_api::apiextensions::definition(res).and_then(|d| d.version(res.version).and_then(|v| v.scale.clone()))
    else {
        let mut out = scale_of(obj);
        if res.group.is_empty() && res.kind == "ReplicationController" {
            // A plain label map (upstream's `labels.SelectorFromSet(rc.Spec.Selector)`).
            out["status"]["selector"] = json!(set_selector_string(obj.pointer("/spec/selector")));
        }
        return out;
    };
    let mut out = scale_of(obj);
    out["spec"]["replicas"] = json!(
        obj.pointer(&pointer_of(&scale.spec_replicas_path))
            .and_then(Value::as_i64)
            .unwrap_or(0)
    );
    out["status"]["replicas"] = json!(
        obj.pointer(&pointer_of(&scale.status_replicas_path))
            .and_then(Value::as_i64)
            .unwrap_or(0)
    );
    let selector = scale
        .label_selector_path
        .as_deref()
        .and_then(|p| obj.pointer(&pointer_of(p)))
        .and_then(Value::as_str)
        .unwrap_or("");
    match out["status"].as_object_mut() {
        Some(st) if selector.is_empty() => {
            st.remove("selector");
        }
        Some(st) => {
            st.insert("selector".into(), json!(selector));
        }
        None => {}
    }
    out
}

/// Set `replicas` at a custom resource's `specReplicasPath` (or `spec.replicas`), making the
/// objects on the way.
fn set_replicas(res: &skiff_api::Resource, obj: &mut Value, replicas: i64) {
    let path = skiff_api::apiextensions::definition(res)
        .and_then(|d| d.version(res.version).and_then(|v| v.scale.clone()))
        .map_or_else(|| ".spec.replicas".to_string(), |s| s.spec_replicas_path);
    let segs: Vec<&str> = path.trim_start_matches('.').split('.').collect();
    let Some((last, parents)) = segs.split_last() else {
        return;
    };
    let mut cur = obj;
    for p in parents {
        let Some(m) = cur.as_object_mut() else { return };
        cur = m.entry(p.to_string()).or_insert_with(|| json!({}));
    }
    if let Some(m) = cur.as_object_mut() {
        m.insert((*last).to_string(), json!(replicas));
    }
}

/// The autoscaling/v1 Scale of a workload.
pub fn scale_of(obj: &Value) -> Value {
    let md = objects::metadata(obj).cloned().unwrap_or_default();
    let selector = obj.pointer("/spec/selector").map(selector_string).unwrap_or_default();
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": md.get("name"),
            "namespace": md.get("namespace"),
            "uid": md.get("uid"),
            "resourceVersion": md.get("resourceVersion"),
            "creationTimestamp": md.get("creationTimestamp"),
        },
        "spec": {"replicas": obj.pointer("/spec/replicas").and_then(Value::as_i64).unwrap_or(0)},
        "status": {
            "replicas": obj.pointer("/status/replicas").and_then(Value::as_i64).unwrap_or(0),
            "selector": selector,
        },
    })
}

/// A label map in selector form (`app=web,tier=fe`, sorted by key).
fn set_selector_string(sel: Option<&Value>) -> String {
    let mut parts: Vec<String> = sel
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                .collect()
        })
        .unwrap_or_default();
    parts.sort();
    parts.join(",")
}

/// A LabelSelector in its string form (`app=web,tier in (a,b)`).
fn selector_string(sel: &Value) -> String {
    let mut parts: Vec<String> = Vec::new();
    if let Some(m) = sel.get("matchLabels").and_then(Value::as_object) {
        for (k, v) in m {
            parts.push(format!("{k}={}", v.as_str().unwrap_or("")));
        }
    }
    if let Some(exprs) = sel.get("matchExpressions").and_then(Value::as_array) {
        for e in exprs {
            let key = e.get("key").and_then(Value::as_str).unwrap_or("");
            let values: Vec<&str> = e
                .get("values")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            match e.get("operator").and_then(Value::as_str).unwrap_or("") {
                "In" => parts.push(format!("{key} in ({})", values.join(","))),
                "NotIn" => parts.push(format!("{key} notin ({})", values.join(","))),
                "Exists" => parts.push(key.to_string()),
                "DoesNotExist" => parts.push(format!("!{key}")),
                _ => {}
            }
        }
    }
    parts.sort();
    parts.join(",")
}

async fn scale_write(ctx: &Ctx, bytes: Bytes) -> Result<Response, StatusError> {
    for _ in 0..8 {
        let (obj, rev) = ctx.current().await?;
        let current_scale = scale_for(ctx.rr.resource, &obj);
        let desired = if ctx.method == Method::PUT {
            body::decode(&ctx.headers, &bytes)?
        } else {
            let (ptype, doc) = crate::write::patch_document(ctx, &bytes)?;
            match ptype {
                skiff_api::patch::PatchType::Json => {
                    skiff_api::patch::json::json_patch(&current_scale, &doc).map_err(|e| e.to_status())?
                }
                _ => skiff_api::patch::merge::merge_patch(&current_scale, &doc).map_err(|e| e.to_status())?,
            }
        };
        let rv = desired
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or("");
        if !rv.is_empty() && rv != rev.to_string() {
            return Err(StatusError::modified(
                ctx.rr.resource.group,
                ctx.rr.resource.plural,
                &ctx.rr.name,
            ));
        }
        let Some(replicas) = desired.pointer("/spec/replicas").and_then(Value::as_i64) else {
            return Err(StatusError::bad_request("spec.replicas is required"));
        };
        if replicas < 0 {
            let errs = [skiff_api::FieldError::invalid(
                "spec.replicas",
                &json!(replicas),
                "must be greater than or equal to 0",
            )];
            return Err(StatusError::invalid("autoscaling", "Scale", &ctx.rr.name, &errs));
        }
        let mut new = obj.clone();
        set_replicas(ctx.rr.resource, &mut new, replicas);
        match write::finish_update(ctx, &obj, new, rev, UpdateScope::Main, "Update").await {
            Ok(w) => {
                return Ok(body::value_response(
                    StatusCode::OK,
                    &scale_for(ctx.rr.resource, w.object()),
                ));
            }
            // Re-read and apply again; a stale resourceVersion in the request fails the check above.
            Err(e) if e.reason == "Conflict" => continue,
            Err(e) => return Err(e),
        }
    }
    Err(StatusError::modified(
        ctx.rr.resource.group,
        ctx.rr.resource.plural,
        &ctx.rr.name,
    ))
}

/// POST pods/NAME/binding (or bindings): set spec.nodeName once and mark the pod scheduled.
pub async fn create_binding(ctx: &Ctx, bytes: Bytes, pod_name: Option<String>) -> Result<Response, StatusError> {
    let binding = body::decode(&ctx.headers, &bytes)?;
    let name = pod_name.unwrap_or_else(|| objects::name(&binding).to_string());
    let target = binding
        .pointer("/target/name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if target.is_empty() {
        let errs = [skiff_api::FieldError::required("target.name", "")];
        return Err(StatusError::invalid("", "Binding", &name, &errs));
    }
    crate::webhook::admit_subresource(
        ctx,
        crate::webhook::Operation::Create,
        &binding,
        crate::webhook::Gvk {
            group: "",
            version: "v1",
            kind: "Binding",
        },
    )
    .await?;
    let pods = skiff_api::registry::lookup("", "v1", "pods").ok_or_else(|| StatusError::internal("no pods"))?;
    let mut rr = ctx.rr.clone();
    rr.resource = pods;
    rr.name = name.clone();
    rr.subresource = String::new();
    let pctx = ctx.for_object(rr);
    // The binder names the pod it scheduled by uid (and may by resourceVersion): a pod
    // deleted and created again under the same name is not bound by mistake.
    let want_uid = objects::uid(&binding).to_string();
    let want_rv = objects::resource_version(&binding).to_string();
    // The binding's annotations land on the pod, as upstream's setPodNodeAndMetadata does.
    let extra_annotations = objects::metadata(&binding)
        .and_then(|m| m.get("annotations"))
        .and_then(Value::as_object)
        .filter(|a| !a.is_empty());
    for _ in 0..8 {
        // The stored pod is edited member by member: its containers, managedFields and the rest
        // are copied as text, never decoded.
        let kv = pctx.stored().await?;
        let rev = kv.mod_revision;
        let stored_invalid = || StatusError::internal("stored object is not valid JSON");
        let mut pod = RawObject::parse(&kv.value).map_err(|_| stored_invalid())?;
        let mut md = pod.object("metadata").unwrap_or_default();
        let uid = md.get_str("uid").unwrap_or_default();
        if !want_uid.is_empty() && want_uid != uid {
            return Err(StatusError::conflict(
                "",
                "pods",
                &name,
                &format!("Precondition failed: UID in precondition: {want_uid}, UID in object meta: {uid}"),
            ));
        }
        if !want_rv.is_empty() && want_rv != rev.to_string() {
            return Err(StatusError::conflict(
                "",
                "pods",
                &name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {want_rv}, ResourceVersion in object meta: {rev}"
                ),
            ));
        }
        if md.has("deletionTimestamp") {
            return Err(StatusError::conflict(
                "",
                "pods/binding",
                &name,
                &format!("pod {name} is being deleted, cannot be assigned to a host"),
            ));
        }
        if let Some(mut spec) = pod.object("spec") {
            if let Some(n) = spec.get_str("nodeName").filter(|n| !n.is_empty()) {
                return Err(StatusError::conflict(
                    "",
                    "pods/binding",
                    &name,
                    &format!("pod {name} is already assigned to node \"{n}\""),
                ));
            }
            spec.insert("nodeName", &target).map_err(|_| stored_invalid())?;
            pod.insert("spec", &spec).map_err(|_| stored_invalid())?;
        }
        if let Some(extra) = extra_annotations {
            let mut annotations = md
                .value("annotations")
                .filter(Value::is_object)
                .unwrap_or_else(|| json!({}));
            if let Some(a) = annotations.as_object_mut() {
                for (k, v) in extra {
                    if v.is_string() {
                        a.insert(k.clone(), v.clone());
                    }
                }
            }
            md.insert("annotations", &annotations).map_err(|_| stored_invalid())?;
            pod.insert("metadata", &md).map_err(|_| stored_invalid())?;
        }
        // PodScheduled=True; a nomination is only an expectation: the bound pod no longer has one
        // (as the API server does since Kubernetes 1.34, KEP-5278).
        let mut holder = serde_json::Map::new();
        if let Some(status) = pod.value("status") {
            holder.insert("status".into(), status);
        }
        let mut holder = Value::Object(holder);
        set_condition(&mut holder, "PodScheduled", "True", None, None);
        if let Some(status) = holder.get_mut("status") {
            if let Some(st) = status.as_object_mut() {
                st.shift_remove("nominatedNodeName");
            }
            pod.insert("status", status).map_err(|_| stored_invalid())?;
        }
        // Write spec and status together, as upstream's binding does.
        let bytes_new = pod.to_vec().map_err(|_| stored_invalid())?;
        match pctx.state.store.update(&pctx.key(), bytes_new, rev).await {
            Ok(_) => {
                let status =
                    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201});
                return Ok(body::value_response(StatusCode::CREATED, &status));
            }
            Err(skiff_store::StoreError::Conflict { .. }) => continue,
            Err(e) => return Err(pctx.store_err(e)),
        }
    }
    Err(StatusError::modified("", "pods", &name))
}

/// Set a condition in status.conditions (lastTransitionTime changes only with the status).
pub fn set_condition(obj: &mut Value, kind: &str, status: &str, reason: Option<&str>, message: Option<&str>) {
    let Some(m) = obj.as_object_mut() else { return };
    let st = m.entry("status").or_insert_with(|| json!({}));
    let Some(st) = st.as_object_mut() else { return };
    let conds = st.entry("conditions").or_insert_with(|| json!([]));
    let Some(conds) = conds.as_array_mut() else { return };
    let now = objects::now_rfc3339();
    let mut c = json!({"type": kind, "status": status, "lastProbeTime": null, "lastTransitionTime": now});
    if let Some(r) = reason {
        c["reason"] = json!(r);
    }
    if let Some(msg) = message {
        c["message"] = json!(msg);
    }
    match conds
        .iter_mut()
        .find(|x| x.get("type").and_then(Value::as_str) == Some(kind))
    {
        Some(existing) => {
            if existing.get("status").and_then(Value::as_str) == Some(status)
                && let Some(t) = existing.get("lastTransitionTime")
            {
                c["lastTransitionTime"] = t.clone();
            }
            *existing = c;
        }
        None => conds.push(c),
    }
}

/// The 429 an eviction gets while a budget forbids it. Upstream sends no Retry-After here:
/// with one, client-go would retry inside each eviction call (ten times over) before
/// `kubectl drain` saw the error and applied its own retry and timeout.
fn budget_violation(cause: String) -> StatusError {
    let mut e = StatusError::too_many_requests("Cannot evict pod as it would violate the pod's disruption budget.");
    e.details.causes = vec![skiff_api::status::Cause {
        reason: "DisruptionBudget".into(),
        message: cause,
        field: String::new(),
    }];
    e
}

/// Upstream's canIgnorePDB: terminal, pending and terminating pods are not protected.
fn can_ignore_budget(pod: &Value) -> bool {
    matches!(
        pod.pointer("/status/phase").and_then(Value::as_str),
        Some("Succeeded" | "Failed" | "Pending")
    ) || objects::deletion_timestamp(pod).is_some()
}

/// Upstream's checkAndDecrement: the budget's status with one disruption used up by `pod`,
/// or the error that refuses the eviction.
fn decrement_budget(pdb: &Value, pod: &str) -> Result<Value, StatusError> {
    let int = |p: &str| pdb.pointer(p).and_then(Value::as_i64).unwrap_or(0);
    let name = objects::name(pdb);
    let generation = objects::metadata(pdb)
        .and_then(|m| m.get("generation"))
        .and_then(Value::as_i64)
        .unwrap_or(0);
    if int("/status/observedGeneration") < generation {
        return Err(budget_violation(format!(
            "The disruption budget {name} is still being processed by the server."
        )));
    }
    let allowed = int("/status/disruptionsAllowed");
    if allowed < 0 {
        let mut e = StatusError::forbidden(format!(
            "poddisruptionbudget.policy \"{name}\" is forbidden: pdb disruptions allowed is negative"
        ));
        e.details.kind = Some("poddisruptionbudget".into());
        e.details.name = Some(name.to_string());
        return Err(e);
    }
    if allowed == 0 {
        return Err(budget_violation(format!(
            "The disruption budget {name} needs {} healthy pods and has {} currently",
            int("/status/desiredHealthy"),
            int("/status/currentHealthy")
        )));
    }
    let mut new = pdb.clone();
    if let Some(st) = new.get_mut("status").and_then(Value::as_object_mut) {
        st.insert("disruptionsAllowed".into(), json!(allowed - 1));
        let disrupted = st.entry("disruptedPods").or_insert_with(|| json!({}));
        if !disrupted.is_object() {
            *disrupted = json!({});
        }
        disrupted[pod] = json!(objects::now_rfc3339());
    }
    if allowed == 1 {
        insufficient_pods(&mut new);
    }
    Ok(new)
}

/// Upstream's UpdateDisruptionAllowedCondition once no disruption is left (a metav1.Condition,
/// whose transition time stays while its status does).
fn insufficient_pods(pdb: &mut Value) {
    let observed = pdb
        .pointer("/status/observedGeneration")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    let Some(st) = pdb.get_mut("status").and_then(Value::as_object_mut) else {
        return;
    };
    let conds = st.entry("conditions").or_insert_with(|| json!([]));
    if !conds.is_array() {
        *conds = json!([]);
    }
    let Some(conds) = conds.as_array_mut() else { return };
    let mut c = json!({
        "type": "DisruptionAllowed",
        "status": "False",
        "reason": "InsufficientPods",
        "message": "",
        "observedGeneration": observed,
        "lastTransitionTime": objects::now_rfc3339(),
    });
    match conds
        .iter_mut()
        .find(|x| x.get("type").and_then(Value::as_str) == Some("DisruptionAllowed"))
    {
        Some(existing) => {
            if existing.get("status").and_then(Value::as_str) == Some("False")
                && let Some(t) = existing.get("lastTransitionTime")
            {
                c["lastTransitionTime"] = t.clone();
            }
            *existing = c;
        }
        None => conds.push(c),
    }
}

/// POST pods/NAME/eviction: delete the pod unless a PodDisruptionBudget forbids it (429);
/// an allowed eviction uses up one of the budget's disruptions.
async fn evict(ctx: &Ctx, bytes: Bytes) -> Result<Response, StatusError> {
    let eviction = body::decode(&ctx.headers, &bytes)?;
    crate::webhook::admit_subresource(
        ctx,
        crate::webhook::Operation::Create,
        &eviction,
        crate::webhook::Gvk {
            group: "policy",
            version: "v1",
            kind: "Eviction",
        },
    )
    .await?;
    let pdbs = skiff_api::registry::lookup("policy", "v1", "poddisruptionbudgets")
        .ok_or_else(|| StatusError::internal("no poddisruptionbudgets"))?;
    let mut checked = false;
    for _ in 0..8 {
        let (pod, _) = ctx.current().await?;
        crate::noderestriction::admit_eviction(ctx, &pod)?;
        if can_ignore_budget(&pod) {
            checked = true;
            break;
        }
        let pod_labels = objects::labels(&pod).cloned().unwrap_or_default();
        let page = ctx
            .state
            .store
            .list(&objects::prefix(pdbs, &ctx.rr.namespace), Default::default())
            .await
            .map_err(|e| ctx.store_err(e))?;
        let mut matching = Vec::new();
        for kv in &page.items {
            let Some(pdb) = objects::decode_kv(kv) else { continue };
            let Some(sel) = pdb.pointer("/spec/selector") else {
                continue;
            };
            let Ok(matcher) = skiff_api::selector::LabelSelector::from_label_selector_json(sel) else {
                continue;
            };
            if matcher.is_empty() || !matcher.matches(&pod_labels) {
                continue;
            }
            matching.push((kv, pdb));
        }
        let Some((kv, pdb)) = matching.first() else {
            checked = true;
            break;
        };
        if matching.len() > 1 {
            return Err(StatusError::internal(
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            ));
        }
        let updated = decrement_budget(pdb, &ctx.rr.name)?;
        let dry = ctx.dry_run() || write::dry_run_values(eviction.pointer("/deleteOptions/dryRun")).unwrap_or(false);
        if dry {
            checked = true;
            break;
        }
        let key = objects::key(pdbs, &ctx.rr.namespace, objects::name(pdb));
        match ctx
            .state
            .store
            .update(&key, objects::encode_for_store(&updated), kv.mod_revision)
            .await
        {
            Ok(_) => {
                checked = true;
                break;
            }
            Err(skiff_store::StoreError::Conflict { .. }) => continue,
            Err(e) => return Err(ctx.store_err(e)),
        }
    }
    if !checked {
        return Err(StatusError::modified("policy", "poddisruptionbudgets", &ctx.rr.name));
    }
    let mut opts = write::DeleteOpts::default();
    if let Some(d) = eviction.get("deleteOptions") {
        opts.grace = d.get("gracePeriodSeconds").and_then(Value::as_i64);
        opts.uid = d
            .pointer("/preconditions/uid")
            .and_then(Value::as_str)
            .map(str::to_string);
        opts.resource_version = d
            .pointer("/preconditions/resourceVersion")
            .and_then(Value::as_str)
            .map(str::to_string);
        opts.dry_run = write::dry_run_values(d.get("dryRun"))?;
    }
    let mut rr = ctx.rr.clone();
    rr.subresource = String::new();
    let mut params = crate::handlers::Params::new();
    if let Some(d) = ctx.param("dryRun") {
        params.insert("dryRun".into(), d.to_string());
    }
    let pctx = Ctx {
        state: ctx.state.clone(),
        rr,
        params,
        headers: ctx.headers.clone(),
        method: Method::DELETE,
        user: ctx.user.clone(),
        warnings: ctx.warnings.clone(),
        audit_annotations: ctx.audit_annotations.clone(),
    };
    write::delete_object(&pctx, &opts).await?;
    let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201});
    Ok(body::value_response(StatusCode::CREATED, &status))
}

/// PUT namespaces/NAME/finalize: set spec.finalizers; the namespace goes once nothing holds it.
async fn finalize_namespace(ctx: &Ctx, obj: Value) -> Result<Response, StatusError> {
    let (old, rev) = ctx.current().await?;
    let mut new = old.clone();
    let fins = obj.pointer("/spec/finalizers").cloned().unwrap_or_else(|| json!([]));
    if let Some(m) = new.as_object_mut() {
        let spec = m.entry("spec").or_insert_with(|| json!({}));
        if let Some(s) = spec.as_object_mut() {
            s.insert("finalizers".into(), fins);
        }
    }
    let empty = new
        .pointer("/spec/finalizers")
        .and_then(Value::as_array)
        .is_none_or(|a| a.is_empty());
    if empty && objects::deletion_timestamp(&new).is_some() && objects::finalizers(&new).is_empty() {
        ctx.state
            .store
            .delete(&ctx.key(), Some(rev))
            .await
            .map_err(|e| ctx.store_err(e))?;
        return Ok(body::value_response(StatusCode::OK, &new));
    }
    let bytes = objects::encode_for_store(&new);
    let kv = ctx
        .state
        .store
        .update(&ctx.key(), bytes, rev)
        .await
        .map_err(|e| ctx.store_err(e))?;
    objects::set_resource_version(&mut new, kv.mod_revision);
    let _ = metadata_mut(&mut new);
    Ok(body::value_response(StatusCode::OK, &new))
}

impl Written {
    pub fn into_object(self) -> Value {
        match self {
            Written::Updated(v) | Written::Deleted(v) => v,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pdb(allowed: i64, observed: i64) -> Value {
        json!({
            "metadata": {"name": "pdb", "generation": 1},
            "status": {"disruptionsAllowed": allowed, "observedGeneration": observed, "desiredHealthy": 2, "currentHealthy": 2}
        })
    }

    #[test]
    fn a_replication_controller_scale_has_its_label_map_as_selector() {
        let rc = json!({"metadata": {"name": "web"}, "spec": {"replicas": 3, "selector": {"tier": "fe", "app": "web"}},
                        "status": {"replicas": 2}});
        let res = skiff_api::registry::lookup("", "v1", "replicationcontrollers").expect("served");
        let scale = scale_for(res, &rc);
        assert_eq!(scale["spec"]["replicas"], 3);
        assert_eq!(scale["status"]["replicas"], 2);
        assert_eq!(scale["status"]["selector"], "app=web,tier=fe");
    }

    #[test]
    fn an_eviction_uses_up_one_disruption() {
        let new = decrement_budget(&pdb(2, 1), "p").expect("allowed");
        assert_eq!(new["status"]["disruptionsAllowed"], 1);
        assert!(new["status"]["disruptedPods"]["p"].is_string());
        assert!(new["status"].get("conditions").is_none());
        let last = decrement_budget(&new, "q").expect("allowed");
        assert_eq!(last["status"]["disruptionsAllowed"], 0);
        assert_eq!(last["status"]["conditions"][0]["type"], "DisruptionAllowed");
        assert_eq!(last["status"]["conditions"][0]["status"], "False");
        assert_eq!(last["status"]["conditions"][0]["reason"], "InsufficientPods");
        let e = decrement_budget(&last, "r").unwrap_err();
        assert_eq!(e.code, 429);
        assert_eq!(
            e.message,
            "Cannot evict pod as it would violate the pod's disruption budget."
        );
        assert_eq!(
            e.details.causes[0].message,
            "The disruption budget pdb needs 2 healthy pods and has 2 currently"
        );
        assert_eq!(e.details.retry_after_seconds, None, "no Retry-After, as upstream");
    }

    #[test]
    fn unprocessed_or_negative_budgets_refuse() {
        let e = decrement_budget(&pdb(1, 0), "p").unwrap_err();
        assert_eq!(e.code, 429);
        assert_eq!(
            e.details.causes[0].message,
            "The disruption budget pdb is still being processed by the server."
        );
        assert_eq!(decrement_budget(&pdb(-1, 1), "p").unwrap_err().code, 403);
    }

    #[test]
    fn pending_terminal_and_terminating_pods_ignore_budgets() {
        for phase in ["Pending", "Succeeded", "Failed"] {
            assert!(can_ignore_budget(&json!({"status": {"phase": phase}})), "{phase}");
        }
        assert!(!can_ignore_budget(&json!({"status": {"phase": "Running"}})));
        assert!(can_ignore_budget(
            &json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}, "status": {"phase": "Running"}})
        ));
    }
}
