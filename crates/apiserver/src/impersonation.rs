//! Impersonation (`kubectl --as`, `--as-group`, `--as-uid`), as upstream's `WithImpersonation`
//! filter: each `Impersonate-*` header must be allowed by the `impersonate` verb on `users`,
//! `groups`, `serviceaccounts`, `uids` or `userextras/KEY`; the request then runs as the user
//! it names.

use std::collections::BTreeMap;

use http::HeaderMap;
use skiff_api::StatusError;
use skiff_rbac::Attributes;
use skiff_store::Store;

use crate::authz::{self, Authorizer};
use crate::serviceaccount;
use crate::tls::Identity;

const USER: &str = "impersonate-user";
const GROUP: &str = "impersonate-group";
const UID: &str = "impersonate-uid";
const EXTRA_PREFIX: &str = "impersonate-extra-";

/// The user a request runs as: `who` itself without impersonation headers, else the user they
/// name once `who` may impersonate every part of it.
pub async fn resolve(
    authz: &Authorizer,
    store: &dyn Store,
    who: Identity,
    headers: &HeaderMap,
) -> Result<Identity, StatusError> {
    let value = |h: &http::HeaderValue| h.to_str().map(str::to_string).unwrap_or_default();
    let user = headers.get(USER).map(value);
    let groups: Vec<String> = headers.get_all(GROUP).iter().map(value).collect();
    let uid = headers.get(UID).map(value);
    let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, v) in headers {
        if let Some(key) = name.as_str().strip_prefix(EXTRA_PREFIX) {
            // Keys are percent-encoded on the wire (upstream unescapes them).
            let key = percent_decode(key);
            extra.entry(key).or_default().push(value(v));
        }
    }
    let Some(user) = user else {
        if !groups.is_empty() || uid.is_some() || !extra.is_empty() {
            return Err(StatusError::bad_request(format!(
                "requested {} without impersonating a user",
                requested(&groups, &uid, &extra)
            )));
        }
        return Ok(who);
    };
    // What the caller must be allowed, in upstream's order: the user, its groups, extras, uid.
    let mut checks: Vec<Attributes> = Vec::new();
    let service_account = user
        .strip_prefix("system:serviceaccount:")
        .and_then(|rest| rest.split_once(':'));
    match service_account {
        Some((ns, name)) => {
            let mut a = Attributes::resource("impersonate", "", "serviceaccounts", ns, name);
            a.api_version = "v1".into();
            checks.push(a);
        }
        None => checks.push(Attributes::resource("impersonate", "", "users", "", &user)),
    }
    for g in &groups {
        checks.push(Attributes::resource("impersonate", "", "groups", "", g));
    }
    for (key, values) in &extra {
        for v in values {
            checks.push(
                Attributes::resource("impersonate", "authentication.k8s.io", "userextras", "", v).with_subresource(key),
            );
        }
    }
    if let Some(uid) = &uid {
        checks.push(Attributes::resource(
            "impersonate",
            "authentication.k8s.io",
            "uids",
            "",
            uid,
        ));
    }
    for a in &checks {
        authz.check(store, &who, a).await?;
    }
    let mut groups = groups;
    if groups.is_empty()
        && let Some((ns, _)) = service_account
    {
        groups = serviceaccount::groups(ns);
    }
    if user == authz::ANONYMOUS {
        if !groups.iter().any(|g| g == authz::UNAUTHENTICATED) {
            groups.push(authz::UNAUTHENTICATED.into());
        }
    } else if !groups.iter().any(|g| g == authz::AUTHENTICATED) {
        groups.push(authz::AUTHENTICATED.into());
    }
    tracing::debug!(by = %who.user, as_user = %user, "impersonating");
    Ok(Identity {
        user,
        uid: uid.unwrap_or_default(),
        groups,
        extra,
    })
}

fn requested(groups: &[String], uid: &Option<String>, extra: &BTreeMap<String, Vec<String>>) -> String {
    let mut parts: Vec<String> = groups.iter().map(|g| format!("{{Group  {g}}}")).collect();
    for (k, vs) in extra {
        for v in vs {
            parts.push(format!("{{UserExtra  {v}  {k}}}"));
        }
    }
    if let Some(uid) = uid {
        parts.push(format!("{{UID  {uid}}}"));
    }
    format!("[{}]", parts.join(" "))
}

fn percent_decode(s: &str) -> String {
    let hex = |b: u8| (b as char).to_digit(16);
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let (Some(hi), Some(lo)) = (
                bytes.get(i + 1).copied().and_then(hex),
                bytes.get(i + 2).copied().and_then(hex),
            )
        {
            out.push((hi * 16 + lo) as u8);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extra_keys_are_unescaped() {
        assert_eq!(percent_decode("example.com%2fteam"), "example.com/team");
        assert_eq!(percent_decode("plain"), "plain");
        assert_eq!(percent_decode("bad%zz"), "bad%zz");
    }

    #[tokio::test]
    async fn impersonation_needs_the_verb() {
        let authz = Authorizer::default();
        let store = skiff_store::MemoryStore::new();
        let mut headers = HeaderMap::new();
        headers.insert(USER, "jane".parse().unwrap());
        headers.append(GROUP, "devs".parse().unwrap());
        let bob = Identity::new("bob", &[authz::AUTHENTICATED]);
        let e = resolve(&authz, &*store, bob, &headers).await.unwrap_err();
        assert_eq!(
            e.message,
            "users \"jane\" is forbidden: User \"bob\" cannot impersonate resource \"users\" in API group \"\" at the cluster scope"
        );
        let root = Identity::new("root", &[authz::MASTERS]);
        let jane = resolve(&authz, &*store, root.clone(), &headers).await.unwrap();
        assert_eq!(jane.user, "jane");
        assert_eq!(jane.groups, vec!["devs", authz::AUTHENTICATED]);
        let mut sa = HeaderMap::new();
        sa.insert(USER, "system:serviceaccount:team:ci".parse().unwrap());
        let ci = resolve(&authz, &*store, root.clone(), &sa).await.unwrap();
        assert_eq!(
            ci.groups,
            vec![
                "system:serviceaccounts",
                "system:serviceaccounts:team",
                authz::AUTHENTICATED
            ]
        );
        let mut only_group = HeaderMap::new();
        only_group.insert(GROUP, "devs".parse().unwrap());
        let e = resolve(&authz, &*store, root, &only_group).await.unwrap_err();
        assert_eq!(e.code, 400);
        assert_eq!(e.message, "requested [{Group  devs}] without impersonating a user");
    }
}
