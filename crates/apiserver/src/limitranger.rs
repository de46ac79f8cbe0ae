//! Upstream's LimitRanger admission plugin (`plugin/pkg/admission/limitranger`): a pod created
//! in a namespace with LimitRanges gets the default requests and limits its containers lack
//! (mutating, before validation), then the pod and each container, and a claim created or
//! resized, are checked against the ranges' min, max and maxLimitRequestRatio (validating),
//! refused with upstream's 403. The rules are `skiff_api::limitranger`'s. A pod update is not
//! checked: its containers' resources do not change through it.

use serde_json::Value;
use skiff_api::StatusError;
use skiff_api::limitranger;

use crate::handlers::Ctx;
use crate::objects;

fn concerned(ctx: &Ctx) -> bool {
    let res = ctx.rr.resource;
    res.group.is_empty()
        && matches!(res.plural, "pods" | "persistentvolumeclaims")
        && ctx.rr.subresource.is_empty()
        && !ctx.rr.namespace.is_empty()
}

/// The namespace's LimitRanges.
async fn limit_ranges(ctx: &Ctx) -> Result<Vec<Value>, StatusError> {
    let Some(res) = skiff_api::registry::lookup("", "v1", "limitranges") else {
        return Ok(Vec::new());
    };
    // From the replica's memory, as upstream's plugin reads its informer's cache.
    let items = ctx
        .state
        .store
        .list_cached(&objects::prefix(res, &ctx.rr.namespace))
        .await
        .map_err(|e| ctx.store_err(e))?;
    Ok(items.iter().filter_map(objects::decode_kv).collect())
}

/// The mutating half: a created pod's containers get the defaults they lack.
pub async fn mutate(ctx: &Ctx, pod: &mut Value) -> Result<(), StatusError> {
    if !concerned(ctx) || ctx.rr.resource.plural != "pods" {
        return Ok(());
    }
    for lr in limit_ranges(ctx).await? {
        limitranger::default_pod(&lr, pod);
    }
    Ok(())
}

/// The validating half: a created pod, or a created or updated claim, within every range.
pub async fn validate(ctx: &Ctx, obj: &Value, old: Option<&Value>) -> Result<(), StatusError> {
    let res = ctx.rr.resource;
    if !concerned(ctx) || (res.plural == "pods" && old.is_some()) {
        return Ok(());
    }
    let mut errs = Vec::new();
    for lr in limit_ranges(ctx).await? {
        if res.plural == "pods" {
            errs.extend(limitranger::validate_pod(&lr, obj));
        } else {
            errs.extend(limitranger::validate_pvc(&lr, obj));
        }
    }
    match limitranger::aggregate(errs) {
        None => Ok(()),
        Some(e) => Err(StatusError::forbidden_resource(
            res.group,
            res.plural,
            objects::name(obj),
            &e,
        )),
    }
}
