//! Streams served by node agents (log, exec, attach, portforward), proxied as upstream
//! proxies to the kubelet.

use axum::response::Response;
use skiff_api::StatusError;

use crate::handlers::Ctx;

pub async fn handle(ctx: &Ctx) -> Result<Response, StatusError> {
    let (pod, _) = ctx.current().await?;
    let node = pod.pointer("/spec/nodeName").and_then(|v| v.as_str()).unwrap_or("");
    if node.is_empty() {
        return Err(StatusError::bad_request(format!(
            "pod {} does not have a host assigned",
            ctx.rr.name
        )));
    }
    Err(StatusError::new(
        503,
        "ServiceUnavailable",
        format!("node {node} serves no {} endpoint", ctx.rr.subresource),
    ))
}
