//! `componentstatuses` (core v1, deprecated since 1.19 and still served upstream): the health
//! of the control plane's parts as this API server sees them, made at each request and never
//! stored. Upstream probes the scheduler's and the controller manager's `/healthz` on its own
//! host and asks each etcd server; Skiff's scheduler and controllers run inside the server
//! process (each elected, when servers share a store), so a part is healthy here when this
//! server runs it, standing by for its Lease included (upstream's standby scheduler answers
//! `/healthz` too), and the store is asked as `/livez/etcd` asks it. Only `get` and `list`.

use std::collections::BTreeSet;

use axum::response::Response;
use http::{Method, StatusCode};
use parking_lot::RwLock;
use serde_json::{Value, json};
use skiff_api::StatusError;
use skiff_api::selector::{FieldSelector, LabelSelector};

use crate::handlers::Ctx;

/// Upstream's warning for the deprecated resource, sent with every answer.
pub const DEPRECATED: &str = "v1 ComponentStatus is deprecated in v1.19+";

/// The parts whose health is reported, in the order upstream registers them, with the
/// component each names and the flag that leaves it out.
const PARTS: &[(&str, &str, &str)] = &[
    ("controller-manager", "kube-controller-manager", "--no-controllers"),
    ("scheduler", "kube-scheduler", "--no-scheduler"),
];

/// The store's entry: upstream names one per etcd server; Skiff's store is one.
const STORE: &str = "etcd-0";

/// The control-plane parts this process runs (`controller-manager`, `scheduler`).
#[derive(Default)]
pub struct LocalComponents(RwLock<BTreeSet<&'static str>>);

impl LocalComponents {
    /// Record that this process runs `part` (one of [`PARTS`]' names).
    pub fn runs(&self, part: &str) {
        if let Some((name, _, _)) = PARTS.iter().find(|(n, _, _)| *n == part) {
            self.0.write().insert(name);
        }
    }

    fn has(&self, part: &str) -> bool {
        self.0.read().contains(part)
    }
}

pub async fn handle(ctx: &Ctx) -> Result<Response, StatusError> {
    let res = ctx.rr.resource;
    if ctx.method != Method::GET || ctx.rr.watch || !ctx.rr.subresource.is_empty() {
        return Err(StatusError::method_not_allowed(
            "the server does not allow this method on the requested resource",
        ));
    }
    ctx.warnings.add(DEPRECATED);
    let statuses = statuses(ctx).await;
    if !ctx.rr.name.is_empty() {
        let obj = statuses
            .into_iter()
            .find(|s| s["metadata"]["name"] == ctx.rr.name.as_str())
            // Upstream's Get answers a plain error, which the handler turns into a 500.
            .ok_or_else(|| StatusError::internal(format!("Component not found: {}", ctx.rr.name)))?;
        return Ok(crate::handlers::render_one(ctx, StatusCode::OK, &obj));
    }
    // Upstream filters by the selectors although nothing carries labels.
    let labels = match ctx.param("labelSelector").filter(|s| !s.trim().is_empty()) {
        Some(s) => LabelSelector::parse(s).map_err(|e| StatusError::bad_request(e.to_string()))?,
        None => LabelSelector::everything(),
    };
    let fields = match ctx.param("fieldSelector").filter(|s| !s.trim().is_empty()) {
        Some(s) => FieldSelector::parse(res, s).map_err(|e| StatusError::bad_request(e.to_string()))?,
        None => FieldSelector::everything(res),
    };
    let items: Vec<Value> = statuses
        .into_iter()
        .filter(|s| labels.matches_object(s) && fields.matches(s))
        .collect();
    Ok(crate::resourcemetrics::render_list(ctx, res, &items))
}

/// Every part's ComponentStatus, as upstream words them: `Healthy` `True` with the message
/// `ok`, or `False` with what went wrong as the message.
async fn statuses(ctx: &Ctx) -> Vec<Value> {
    let mut out: Vec<Value> = PARTS
        .iter()
        .map(|(name, component, flag)| match ctx.state.components.has(name) {
            true => status(name, Ok(())),
            false => status(
                name,
                Err(format!("{component} does not run in this server (started with {flag})")),
            ),
        })
        .collect();
    let store = ctx.state.store.health().await.map_err(|e| e.to_string());
    out.push(status(STORE, store));
    out
}

fn status(name: &str, health: Result<(), String>) -> Value {
    let (status, message) = match health {
        Ok(()) => ("True", "ok".to_string()),
        Err(e) => ("False", e),
    };
    json!({
        "kind": "ComponentStatus",
        "apiVersion": "v1",
        "metadata": {"name": name},
        "conditions": [{"type": "Healthy", "status": status, "message": message}],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_healthy_part_says_ok_and_a_failed_one_says_why() {
        let ok = status("scheduler", Ok(()));
        assert_eq!(
            ok["conditions"][0],
            json!({"type": "Healthy", "status": "True", "message": "ok"})
        );
        let down = status("etcd-0", Err("database is locked".into()));
        assert_eq!(down["conditions"][0]["status"], "False");
        assert_eq!(down["conditions"][0]["message"], "database is locked");
    }

    #[test]
    fn only_known_parts_are_recorded() {
        let c = LocalComponents::default();
        c.runs("scheduler");
        c.runs("kubelet");
        assert!(c.has("scheduler"));
        assert!(!c.has("kubelet"));
        assert!(!c.has("controller-manager"));
    }
}
