//! RBAC escalation prevention, as upstream's policy-based role and binding storage: a user may
//! write a Role or ClusterRole only with rules they hold themselves (or with the `escalate`
//! verb on it), and bind a role only when they hold its rules (or have the `bind` verb on it).
//! Members of `system:masters` are exempt.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use skiff_api::{Resource, StatusError};
use skiff_rbac::{Attributes, Decision};

use crate::authz;
use crate::handlers::Ctx;

/// Checks a write of `obj` (replacing `old` on update) to an RBAC resource.
pub async fn admit(ctx: &Ctx, obj: &Value, old: Option<&Value>) -> Result<(), StatusError> {
    let res = ctx.rr.resource;
    if !authz::is_rbac(res.group, res.plural) || ctx.user.groups.iter().any(|g| g == authz::MASTERS) {
        return Ok(());
    }
    let name = crate::objects::name(obj);
    let namespace = ctx.rr.namespace.as_str();
    // Changes to what the garbage collector needs (owners, finalizers) are always allowed.
    if old.is_some_and(|o| only_gc_fields_changed(o, obj)) {
        return Ok(());
    }
    match res.plural {
        "roles" | "clusterroles" => {
            let escalate = Attributes::resource("escalate", res.group, res.plural, namespace, name);
            if allowed(ctx, &escalate).await {
                return Ok(());
            }
            no_escalation(ctx, res, name, namespace, &rules_of(obj))?;
            let aggregated = |o: Option<&Value>| o.and_then(|o| o.get("aggregationRule")).is_some_and(|a| !a.is_null());
            if res.plural == "clusterroles" && (aggregated(Some(obj)) || aggregated(old)) {
                // An aggregated role may gather anything: it takes every permission.
                let everything = [
                    json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}),
                    json!({"verbs": ["*"], "nonResourceURLs": ["*"]}),
                ];
                if missing(ctx, namespace, &everything).is_some() {
                    return Err(forbidden(
                        res,
                        name,
                        "must have cluster-admin privileges to use the aggregationRule",
                    ));
                }
            }
            Ok(())
        }
        _ => {
            let role_ref = obj.get("roleRef").cloned().unwrap_or(Value::Null);
            let kind = role_ref.get("kind").and_then(Value::as_str).unwrap_or("");
            let role_name = role_ref.get("name").and_then(Value::as_str).unwrap_or("");
            let plural = if kind == "Role" { "roles" } else { "clusterroles" };
            let bind = Attributes::resource("bind", authz::RBAC_GROUP, plural, namespace, role_name);
            if allowed(ctx, &bind).await {
                return Ok(());
            }
            let rules = referenced_rules(ctx, kind, role_name, namespace)
                .await
                .map_err(|e| forbidden(res, name, &e))?;
            no_escalation(ctx, res, name, namespace, &rules)
        }
    }
}

/// Upstream's `IsOnlyMutatingGCFields`: the objects differ at most in their owner references
/// and finalizers (and what the server maintains: resourceVersion, managedFields).
fn only_gc_fields_changed(old: &Value, new: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(md) = v.get_mut("metadata").and_then(Value::as_object_mut) {
            for k in ["ownerReferences", "finalizers", "resourceVersion", "managedFields"] {
                md.remove(k);
            }
        }
        v
    };
    strip(old) == strip(new)
}

async fn allowed(ctx: &Ctx, a: &Attributes) -> bool {
    ctx.state.authz.authorize(&*ctx.state.store, &ctx.user, a).await.0 == Decision::Allow
}

fn rules_of(obj: &Value) -> Vec<Value> {
    obj.get("rules").and_then(Value::as_array).cloned().unwrap_or_default()
}

/// The rules of the role a binding refers to, or upstream's error when it does not exist.
async fn referenced_rules(ctx: &Ctx, kind: &str, name: &str, namespace: &str) -> Result<Vec<Value>, String> {
    let key = match kind {
        "Role" => format!("/registry/roles.rbac.authorization.k8s.io/{namespace}/{name}"),
        _ => format!("/registry/clusterroles.rbac.authorization.k8s.io/{name}"),
    };
    let singular = if kind == "Role" { "role" } else { "clusterrole" };
    let kv = ctx
        .state
        .store
        .get(&key)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("{singular}.rbac.authorization.k8s.io \"{name}\" not found"))?;
    let role: Value = serde_json::from_slice(&kv.value).map_err(|e| e.to_string())?;
    Ok(rules_of(&role))
}

/// The requested rules the user's own rules (in `namespace`, and cluster-wide) do not cover.
fn missing(ctx: &Ctx, namespace: &str, requested: &[Value]) -> Option<(Vec<Value>, Vec<String>)> {
    let (own, errors) = ctx.state.authz.policy().rules_for(&ctx.user, namespace);
    let own: Vec<Value> = own.iter().filter_map(|r| serde_json::to_value(r).ok()).collect();
    let (covered, uncovered) = skiff_rbac::bootstrap::covers(&own, requested);
    (!covered).then_some((uncovered, errors))
}

fn no_escalation(ctx: &Ctx, res: &Resource, name: &str, namespace: &str, rules: &[Value]) -> Result<(), StatusError> {
    let Some((uncovered, errors)) = missing(ctx, namespace, rules) else {
        return Ok(());
    };
    let mut lines: Vec<String> = compact(&uncovered).iter().map(compact_string).collect();
    lines.sort();
    lines.dedup();
    let mut msg = format!(
        "user {:?} (groups={}) is attempting to grant RBAC permissions not currently held:\n{}",
        ctx.user.user,
        go_quoted(&ctx.user.groups),
        lines.join("\n")
    );
    if !errors.is_empty() {
        msg.push_str(&format!("; resolution errors: [{}]", errors.join(" ")));
    }
    Err(forbidden(res, name, &msg))
}

fn forbidden(res: &Resource, name: &str, err: &str) -> StatusError {
    StatusError::forbidden_resource(res.group, res.plural, name, err)
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .unwrap_or_default()
}

/// Go's `%q` of a string slice: `["a" "b"]`.
fn go_quoted(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| format!("{s:?}")).collect();
    format!("[{}]", quoted.join(" "))
}

/// Upstream's `CompactRules`: simple rules (one group, one resource, no names) that differ only
/// in their verbs are merged.
fn compact(rules: &[Value]) -> Vec<Value> {
    let mut merged: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    let mut order: Vec<(String, String)> = Vec::new();
    let mut out = Vec::new();
    for r in rules {
        let groups = strings(r.get("apiGroups"));
        let resources = strings(r.get("resources"));
        let simple = groups.len() == 1
            && resources.len() == 1
            && strings(r.get("resourceNames")).is_empty()
            && strings(r.get("nonResourceURLs")).is_empty();
        if !simple {
            out.push(r.clone());
            continue;
        }
        let key = (groups[0].clone(), resources[0].clone());
        let verbs = merged.entry(key.clone()).or_insert_with(|| {
            order.push(key.clone());
            Vec::new()
        });
        for v in strings(r.get("verbs")) {
            if !verbs.contains(&v) {
                verbs.push(v);
            }
        }
    }
    for key in order {
        let verbs = merged.remove(&key).unwrap_or_default();
        out.push(json!({"verbs": verbs, "apiGroups": [key.0], "resources": [key.1]}));
    }
    out
}

/// Upstream's `CompactString`: `{APIGroups:["apps"], Resources:["deployments"], Verbs:["get"]}`.
fn compact_string(r: &Value) -> String {
    let mut parts = Vec::new();
    for (field, label) in [
        ("apiGroups", "APIGroups"),
        ("resources", "Resources"),
        ("nonResourceURLs", "NonResourceURLs"),
        ("resourceNames", "ResourceNames"),
        ("verbs", "Verbs"),
    ] {
        let items = strings(r.get(field));
        if !items.is_empty() {
            parts.push(format!("{label}:{}", go_quoted(&items)));
        }
    }
    format!("{{{}}}", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_as_upstream() {
        let rules = vec![
            json!({"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}),
            json!({"verbs": ["list"], "apiGroups": [""], "resources": ["pods"]}),
            json!({"verbs": ["get"], "nonResourceURLs": ["/metrics"]}),
        ];
        let lines: Vec<String> = compact(&rules).iter().map(compact_string).collect();
        assert_eq!(
            lines,
            vec![
                "{NonResourceURLs:[\"/metrics\"], Verbs:[\"get\"]}",
                "{APIGroups:[\"\"], Resources:[\"pods\"], Verbs:[\"get\" \"list\"]}",
            ]
        );
    }
}
