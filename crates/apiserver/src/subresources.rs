//! Subresources: status, scale, binding, eviction, namespace finalize; node-agent streams
//! (log, exec, attach, portforward) are proxied in `proxy`.

use axum::response::Response;
use bytes::Bytes;
use http::{Method, StatusCode};
use serde_json::{Value, json};
use skiff_api::StatusError;

use crate::body;
use crate::handlers::{Ctx, render_one};
use crate::objects::{self, metadata_mut};
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
        ("status", Method::GET) => crate::read::get(&ctx).await,
        ("status", Method::PUT) => {
            let obj = body::decode(&ctx.headers, &bytes)?;
            let (w, warnings) = write::update_object(&ctx, obj, UpdateScope::Status).await?;
            let mut r = render_one(&ctx, StatusCode::OK, w.object());
            body::add_warnings(&mut r, &warnings);
            Ok(r)
        }
        ("status", Method::PATCH) => {
            let (w, code) = write::patch_object(&ctx, bytes, UpdateScope::Status).await?;
            Ok(render_one(&ctx, code, w.object()))
        }
        ("scale", Method::GET) => {
            let (obj, _) = ctx.current().await?;
            Ok(body::value_response(StatusCode::OK, &scale_of(&obj)))
        }
        ("scale", Method::PUT | Method::PATCH) => scale_write(&ctx, bytes).await,
        ("binding", Method::POST) => create_binding(&ctx, bytes, Some(ctx.rr.name.clone())).await,
        ("eviction", Method::POST) => evict(&ctx, bytes).await,
        ("finalize", Method::PUT) => {
            let obj = body::decode(&ctx.headers, &bytes)?;
            finalize_namespace(&ctx, obj).await
        }
        _ => Err(StatusError::method_not_allowed(
            "the server does not allow this method on the requested resource",
        )),
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
        let current_scale = scale_of(&obj);
        let desired = if ctx.method == Method::PUT {
            body::decode(&ctx.headers, &bytes)?
        } else {
            let ct = ctx
                .headers
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            let doc: Value = serde_json::from_slice(&bytes)
                .map_err(|e| StatusError::bad_request(format!("error decoding patch: {e}")))?;
            match skiff_api::patch::PatchType::from_content_type(ct) {
                Some(skiff_api::patch::PatchType::Json) => {
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
        if let Some(spec) = new.get_mut("spec").and_then(Value::as_object_mut) {
            spec.insert("replicas".into(), json!(replicas));
        }
        match write::finish_update(ctx, &obj, new, rev, UpdateScope::Main, "Update").await {
            Ok(w) => return Ok(body::value_response(StatusCode::OK, &scale_of(w.object()))),
            Err(e) if e.reason == "Conflict" && rv.is_empty() => continue,
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
    let pods = skiff_api::registry::lookup("", "v1", "pods").ok_or_else(|| StatusError::internal("no pods"))?;
    let mut rr = ctx.rr.clone();
    rr.resource = pods;
    rr.name = name.clone();
    rr.subresource = String::new();
    let pctx = Ctx {
        state: ctx.state.clone(),
        rr,
        params: ctx.params.clone(),
        headers: ctx.headers.clone(),
        method: ctx.method.clone(),
    };
    for _ in 0..8 {
        let (pod, rev) = pctx.current().await?;
        if objects::deletion_timestamp(&pod).is_some() {
            return Err(StatusError::conflict(
                "",
                "pods",
                &name,
                &format!("pod {name} is being deleted, cannot be assigned to a host"),
            ));
        }
        if let Some(n) = pod
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
        {
            return Err(StatusError::conflict(
                "",
                "pods",
                &name,
                &format!("pod {name} is already assigned to node \"{n}\""),
            ));
        }
        let mut new = pod.clone();
        if let Some(spec) = new.get_mut("spec").and_then(Value::as_object_mut) {
            spec.insert("nodeName".into(), json!(target));
        }
        set_condition(&mut new, "PodScheduled", "True", None, None);
        // Write spec and status together, as upstream's binding does.
        let bytes_new = objects::encode_for_store(&new);
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

/// POST pods/NAME/eviction: delete the pod unless a PodDisruptionBudget forbids it (429).
async fn evict(ctx: &Ctx, bytes: Bytes) -> Result<Response, StatusError> {
    let eviction = body::decode(&ctx.headers, &bytes)?;
    let (pod, _) = ctx.current().await?;
    let pod_labels = objects::labels(&pod).cloned().unwrap_or_default();
    let pdbs = skiff_api::registry::lookup("policy", "v1", "poddisruptionbudgets")
        .ok_or_else(|| StatusError::internal("no poddisruptionbudgets"))?;
    let page = ctx
        .state
        .store
        .list(&objects::prefix(pdbs, &ctx.rr.namespace), Default::default())
        .await
        .map_err(|e| ctx.store_err(e))?;
    let terminal = matches!(
        pod.pointer("/status/phase").and_then(Value::as_str),
        Some("Succeeded" | "Failed")
    );
    if !terminal && objects::deletion_timestamp(&pod).is_none() {
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
            let allowed = pdb
                .pointer("/status/disruptionsAllowed")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            if allowed <= 0 {
                let mut e =
                    StatusError::too_many_requests("Cannot evict pod as it would violate the pod's disruption budget.");
                e.causes = vec![skiff_api::status::Cause {
                    reason: "DisruptionBudget".into(),
                    message: format!(
                        "The disruption budget {} needs {} healthy pods and has {} currently",
                        objects::name(&pdb),
                        pdb.pointer("/status/desiredHealthy")
                            .and_then(Value::as_i64)
                            .unwrap_or(0),
                        pdb.pointer("/status/currentHealthy")
                            .and_then(Value::as_i64)
                            .unwrap_or(0)
                    ),
                    field: String::new(),
                }];
                e.retry_after_seconds = Some(10);
                return Err(e);
            }
        }
    }
    let mut opts = write::DeleteOpts::default();
    if let Some(d) = eviction.get("deleteOptions") {
        opts.grace = d.get("gracePeriodSeconds").and_then(Value::as_i64);
        opts.uid = d
            .pointer("/preconditions/uid")
            .and_then(Value::as_str)
            .map(str::to_string);
    }
    let mut rr = ctx.rr.clone();
    rr.subresource = String::new();
    let pctx = Ctx {
        state: ctx.state.clone(),
        rr,
        params: Default::default(),
        headers: ctx.headers.clone(),
        method: Method::DELETE,
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
