//! The bootstrap RBAC policy, reconciled at every start as upstream's
//! `poststarthook/rbac/bootstrap-roles`: missing roles and bindings are created, missing rules,
//! subjects, labels and annotations are added back, bindings whose roleRef changed are created
//! again, and objects annotated `rbac.authorization.kubernetes.io/autoupdate: "false"` are left
//! as they are. Nothing a user added is removed.

use serde_json::{Value, json};
use skiff_rbac::bootstrap::{self as policy, Reconcile};
use skiff_store::StoreError;

use crate::ApiState;
use crate::objects;

/// Reconciles every bootstrap role and binding, then loads the authorizer's snapshot.
pub async fn reconcile(state: &ApiState) -> anyhow::Result<()> {
    let roles = policy::cluster_roles()
        .into_iter()
        .chain(skiff_rbac::skiff_policy::cluster_roles())
        .map(|r| ("clusterroles", r))
        .chain(policy::roles().into_iter().map(|r| ("roles", r)))
        .chain(skiff_rbac::skiff_policy::roles().into_iter().map(|r| ("roles", r)));
    for (plural, expected) in roles {
        reconcile_one(state, plural, &expected, policy::reconcile_role).await?;
    }
    let bindings = policy::cluster_role_bindings()
        .into_iter()
        .chain(skiff_rbac::skiff_policy::cluster_role_bindings())
        .map(|b| ("clusterrolebindings", b))
        .chain(policy::role_bindings().into_iter().map(|b| ("rolebindings", b)))
        .chain(
            skiff_rbac::skiff_policy::role_bindings()
                .into_iter()
                .map(|b| ("rolebindings", b)),
        );
    for (plural, expected) in bindings {
        reconcile_one(state, plural, &expected, policy::reconcile_binding).await?;
    }
    state.authz.refresh(&*state.store).await
}

async fn reconcile_one(
    state: &ApiState,
    plural: &str,
    expected: &Value,
    decide: fn(Option<&Value>, &Value) -> Reconcile,
) -> anyhow::Result<()> {
    let res = crate::authz::rbac_resource(plural)?;
    let key = objects::key(res, objects::namespace(expected), objects::name(expected));
    let current = state.store.get(&key).await?;
    let existing = current.as_ref().and_then(objects::decode_kv);
    match decide(existing.as_ref(), expected) {
        Reconcile::Unchanged => Ok(()),
        Reconcile::Create(obj) => create(state, &key, obj).await,
        Reconcile::Update(obj) => {
            let rev = current.map(|kv| kv.mod_revision).unwrap_or_default();
            tracing::info!(key, "updating a bootstrap RBAC object");
            match state.store.update(&key, objects::encode_for_store(&obj), rev).await {
                // Changed meanwhile by a client: its version stands until the next start.
                Ok(_) | Err(StoreError::Conflict { .. }) | Err(StoreError::NotFound(_)) => Ok(()),
                Err(e) => Err(e.into()),
            }
        }
        Reconcile::Recreate(obj) => {
            tracing::info!(key, "recreating a bootstrap RBAC binding whose roleRef changed");
            let rev = current.map(|kv| kv.mod_revision);
            match state.store.delete(&key, rev).await {
                Ok(_) | Err(StoreError::NotFound(_)) => {}
                Err(e) => return Err(e.into()),
            }
            create(state, &key, obj).await
        }
    }
}

async fn create(state: &ApiState, key: &str, mut obj: Value) -> anyhow::Result<()> {
    if let Some(md) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        md.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
        md.insert("creationTimestamp".into(), json!(objects::now_rfc3339()));
    }
    match state.store.create(key, objects::encode_for_store(&obj)).await {
        Ok(_) | Err(StoreError::AlreadyExists(_)) => Ok(()),
        Err(e) => Err(e.into()),
    }
}
