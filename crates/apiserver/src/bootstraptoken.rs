//! Bootstrap token authentication, as upstream's
//! `plugin/pkg/auth/authenticator/token/bootstrap`: a bearer token `ID.SECRET` is the user
//! `system:bootstrap:ID` in `system:bootstrappers` (and the Secret's extra groups) while
//! `kube-system/bootstrap-token-ID` is a live Secret of type `bootstrap.kubernetes.io/token`
//! with that id and secret (compared in constant time), marked for authentication and not
//! expired. Anything else is no user (401); the reason is logged, never told the caller.

use serde_json::Value;
use skiff_api::bootstraptoken as bt;
use skiff_store::Store;
use subtle::ConstantTimeEq;

use crate::tls::Identity;

/// The answer for a token of the bootstrap form: `None` when the token has another form (other
/// authenticators may know it), `Some(None)` when it is refused, `Some(Some(user))` otherwise.
pub async fn authenticate(store: &dyn Store, token: &str, now: jiff::Timestamp) -> Option<Option<Identity>> {
    let (id, secret) = bt::parse_token(token)?;
    let Some(res) = skiff_api::registry::lookup("", "v1", "secrets") else {
        return Some(None);
    };
    let name = format!("{}{id}", bt::SECRET_PREFIX);
    let key = crate::objects::key(res, bt::NAMESPACE, &name);
    let obj: Value = match store.get(&key).await {
        Ok(Some(kv)) => match serde_json::from_slice(&kv.value) {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(secret = %name, error = %e, "a bootstrap token Secret does not decode");
                return Some(None);
            }
        },
        Ok(None) => {
            tracing::info!(secret = %name, "no Secret matches a bootstrap bearer token");
            return Some(None);
        }
        Err(e) => {
            tracing::warn!(secret = %name, error = %e, "reading a bootstrap token Secret");
            return Some(None);
        }
    };
    Some(check(&obj, id, secret, now))
}

/// The checks on the Secret, in upstream's order.
fn check(obj: &Value, id: &str, secret: &str, now: jiff::Timestamp) -> Option<Identity> {
    let name = obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
    let refuse = |why: &str| {
        tracing::info!(secret = %format!("{}/{name}", bt::NAMESPACE), "bootstrap token {why}");
        None
    };
    if obj.pointer("/metadata/deletionTimestamp").is_some_and(|v| !v.is_null()) {
        return refuse("is deleted and awaiting removal");
    }
    if obj.get("type").and_then(Value::as_str) != Some(bt::SECRET_TYPE) || obj.get("data").is_none() {
        return refuse(&format!("has invalid type, expected {}.", bt::SECRET_TYPE));
    }
    let stored = bt::secret_data(obj, bt::TOKEN_SECRET_KEY);
    if !bool::from(stored.as_bytes().ct_eq(secret.as_bytes())) {
        return refuse(&format!("has invalid value for key {}.", bt::TOKEN_SECRET_KEY));
    }
    if bt::secret_data(obj, bt::TOKEN_ID_KEY) != id {
        return refuse(&format!("has invalid value for key {}.", bt::TOKEN_ID_KEY));
    }
    if bt::has_expired(obj, now) {
        return refuse(&format!(
            "has expired (expiration {:?})",
            bt::secret_data(obj, bt::EXPIRATION_KEY)
        ));
    }
    if bt::secret_data(obj, bt::USAGE_AUTHENTICATION_KEY) != "true" {
        return refuse(&format!("not marked {}=true.", bt::USAGE_AUTHENTICATION_KEY));
    }
    let groups = match bt::groups(&bt::secret_data(obj, bt::EXTRA_GROUPS_KEY)) {
        Ok(g) => g,
        Err(e) => return refuse(&format!("has invalid value for key {}: {e}.", bt::EXTRA_GROUPS_KEY)),
    };
    Some(Identity {
        user: format!("{}{id}", bt::USER_PREFIX),
        groups,
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const ID: &str = "abcdef";
    const SECRET: &str = "0123456789abcdef";

    fn now() -> jiff::Timestamp {
        "2026-01-01T00:00:00Z".parse().unwrap()
    }

    #[test]
    fn a_valid_token_is_its_bootstrap_user() {
        let s = bt::secret(ID, SECRET, None, "", &["system:bootstrappers:workers".into()]);
        let id = check(&s, ID, SECRET, now()).expect("accepted");
        assert_eq!(id.user, "system:bootstrap:abcdef");
        assert_eq!(id.groups, ["system:bootstrappers", "system:bootstrappers:workers"]);
    }

    #[test]
    fn refusals() {
        let good = bt::secret(ID, SECRET, Some("2026-06-01T00:00:00Z".parse().unwrap()), "", &[]);
        assert!(check(&good, ID, SECRET, now()).is_some());
        assert!(check(&good, ID, "0123456789abcdee", now()).is_none(), "wrong secret");
        assert!(check(&good, "abcdeg", SECRET, now()).is_none(), "id mismatch");
        assert!(
            check(&good, ID, SECRET, "2026-06-01T00:00:00Z".parse().unwrap()).is_none(),
            "expired"
        );
        let mut other_type = good.clone();
        other_type["type"] = json!("Opaque");
        assert!(check(&other_type, ID, SECRET, now()).is_none());
        let mut deleting = good.clone();
        deleting["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        assert!(check(&deleting, ID, SECRET, now()).is_none());
        let mut unmarked = good.clone();
        unmarked["data"]
            .as_object_mut()
            .unwrap()
            .remove(bt::USAGE_AUTHENTICATION_KEY);
        assert!(check(&unmarked, ID, SECRET, now()).is_none());
        let bad_groups = bt::secret(ID, SECRET, None, "", &["system:masters".into()]);
        assert!(check(&bad_groups, ID, SECRET, now()).is_none());
    }

    #[tokio::test]
    async fn only_tokens_of_the_form_are_answered() {
        let store = skiff_store::MemoryStore::new();
        assert!(authenticate(&*store, "not-a-bootstrap-token", now()).await.is_none());
        assert_eq!(
            authenticate(&*store, "abcdef.0123456789abcdef", now()).await,
            Some(None)
        );
        let res = skiff_api::registry::lookup("", "v1", "secrets").unwrap();
        let key = crate::objects::key(res, "kube-system", "bootstrap-token-abcdef");
        let s = bt::secret(ID, SECRET, None, "", &[]);
        store.create(&key, serde_json::to_vec(&s).unwrap()).await.unwrap();
        let id = authenticate(&*store, "abcdef.0123456789abcdef", now())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(id.user, "system:bootstrap:abcdef");
    }
}
