//! RBAC escalation prevention, as upstream's policy-based role and binding storage: a user may
//! write a Role or ClusterRole only with rules they hold themselves (or with the `escalate`
//! verb on it), and bind a role only when they hold its rules (or have the `bind` verb on it).
//! Members of `system:masters` are exempt.

use serde_json::{Value, json};
use skiff_api::{Resource, StatusError};
use skiff_rbac::{Attributes, Decision, why};

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
    let plural = if kind == "Role" { "roles" } else { "clusterroles" };
    let key = crate::objects::key(
        crate::authz::rbac_resource(plural).map_err(|e| e.to_string())?,
        namespace,
        name,
    );
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
    let uncovered: Vec<skiff_rbac::PolicyRule> = uncovered
        .into_iter()
        .filter_map(|r| serde_json::from_value(r).ok())
        .collect();
    let mut lines: Vec<String> = why::compact(&uncovered).iter().map(why::describe_rule).collect();
    lines.sort();
    lines.dedup();
    let mut msg = format!(
        "user {:?} (groups={}) is attempting to grant RBAC permissions not currently held:\n{}",
        ctx.user.user,
        why::go_quoted(&ctx.user.groups),
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
