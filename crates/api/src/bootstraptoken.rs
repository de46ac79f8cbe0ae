//! Bootstrap tokens, as upstream's `k8s.io/cluster-bootstrap` (`token/api`, `token/util`,
//! `secret`): the `kube-system/bootstrap-token-ID` Secret, the `ID.SECRET` bearer token and
//! its user, and Skiff's join token.
//!
//! A join token is `K10<SHA256>::<ID>.<SECRET>`, as k3s writes its tokens: `SHA256` is the hex
//! SHA-256 of the cluster CA's PEM exactly as the `kube-public/cluster-info` ConfigMap's
//! kubeconfig carries it (`certificate-authority-data`, decoded). A joining node reads that
//! ConfigMap anonymously without verifying TLS, checks the hash, and from then on verifies the
//! API server with that CA; the `ID.SECRET` part authenticates it as a bootstrap token.

use std::collections::BTreeSet;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Value, json};

/// Bootstrap token Secrets are named this, then the token id.
pub const SECRET_PREFIX: &str = "bootstrap-token-";
/// Their type.
pub const SECRET_TYPE: &str = "bootstrap.kubernetes.io/token";
/// They live here.
pub const NAMESPACE: &str = "kube-system";
pub const TOKEN_ID_KEY: &str = "token-id";
pub const TOKEN_SECRET_KEY: &str = "token-secret";
pub const EXPIRATION_KEY: &str = "expiration";
pub const DESCRIPTION_KEY: &str = "description";
pub const EXTRA_GROUPS_KEY: &str = "auth-extra-groups";
pub const USAGE_AUTHENTICATION_KEY: &str = "usage-bootstrap-authentication";
pub const USAGE_SIGNING_KEY: &str = "usage-bootstrap-signing";
/// A token's user is this, then its id.
pub const USER_PREFIX: &str = "system:bootstrap:";
/// Every token's group.
pub const DEFAULT_GROUP: &str = "system:bootstrappers";
/// The join token's prefix (k3s's token version).
pub const JOIN_TOKEN_PREFIX: &str = "K10";

/// The ConfigMap a joining node reads anonymously (kubeadm's).
pub const CLUSTER_INFO_NAMESPACE: &str = "kube-public";
pub const CLUSTER_INFO_NAME: &str = "cluster-info";
pub const CLUSTER_INFO_KUBECONFIG_KEY: &str = "kubeconfig";

const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";

fn is_token_chars(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// upstream's `ParseToken`: `[a-z0-9]{6}.[a-z0-9]{16}` into (id, secret).
pub fn parse_token(token: &str) -> Option<(&str, &str)> {
    let (id, secret) = token.split_once('.')?;
    (is_token_chars(id, 6) && is_token_chars(secret, 16)).then_some((id, secret))
}

/// A new random (id, secret).
pub fn generate() -> (String, String) {
    let mut out = String::with_capacity(22);
    while out.len() < 22 {
        for b in uuid::Uuid::new_v4().into_bytes() {
            // 252 = 7 * 36: no value is likelier than another.
            if b < 252 && out.len() < 22 {
                out.push(char::from(ALPHABET[usize::from(b % 36)]));
            }
        }
    }
    let (id, secret) = out.split_at(6);
    (id.to_string(), secret.to_string())
}

/// upstream's `ValidateBootstrapGroupName`.
pub fn validate_group_name(name: &str) -> Result<(), String> {
    let rest = name.strip_prefix("system:bootstrappers:");
    let ok = rest.is_some_and(|r| {
        !r.is_empty()
            && r.len() <= 256
            && r.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b':' || b == b'-')
            && r.bytes()
                .last()
                .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    });
    if ok {
        Ok(())
    } else {
        Err(format!(
            "bootstrap group {name:?} is invalid (must match ^system:bootstrappers:[a-z0-9:-]{{0,255}}[a-z0-9]$)"
        ))
    }
}

/// upstream's `GetGroups`: `system:bootstrappers` and the extra groups, sorted and unique.
pub fn groups(extra: &str) -> Result<Vec<String>, String> {
    let mut set: BTreeSet<String> = BTreeSet::from([DEFAULT_GROUP.to_string()]);
    if !extra.is_empty() {
        for g in extra.split(',') {
            validate_group_name(g)?;
            set.insert(g.to_string());
        }
    }
    Ok(set.into_iter().collect())
}

/// A string value of a Secret's `data` (base64 in JSON); empty when missing or not base64.
pub fn secret_data(secret: &Value, key: &str) -> String {
    secret
        .get("data")
        .and_then(|d| d.get(key))
        .and_then(Value::as_str)
        .and_then(|b| BASE64.decode(b).ok())
        .and_then(|b| String::from_utf8(b).ok())
        .unwrap_or_default()
}

/// upstream's `HasExpired`: an expiration that does not parse counts as expired.
pub fn has_expired(secret: &Value, now: jiff::Timestamp) -> bool {
    let exp = secret_data(secret, EXPIRATION_KEY);
    if exp.is_empty() {
        return false;
    }
    match exp.parse::<jiff::Timestamp>() {
        Ok(t) => now >= t,
        Err(_) => true,
    }
}

/// When a token Secret expires (`None`: never, or an unparsable time).
pub fn expiration(secret: &Value) -> Option<jiff::Timestamp> {
    secret_data(secret, EXPIRATION_KEY).parse().ok()
}

/// The Secret of a new token, as `kubeadm token create` writes it: usable for authentication
/// and signing, expiring at `expires` (never when `None`).
pub fn secret(
    id: &str,
    secret: &str,
    expires: Option<jiff::Timestamp>,
    description: &str,
    extra_groups: &[String],
) -> Value {
    let mut data = serde_json::Map::new();
    let mut put = |k: &str, v: &str| {
        data.insert(k.to_string(), json!(BASE64.encode(v)));
    };
    put(TOKEN_ID_KEY, id);
    put(TOKEN_SECRET_KEY, secret);
    put(USAGE_AUTHENTICATION_KEY, "true");
    put(USAGE_SIGNING_KEY, "true");
    if let Some(t) = expires {
        put(EXPIRATION_KEY, &t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string());
    }
    if !description.is_empty() {
        put(DESCRIPTION_KEY, description);
    }
    if !extra_groups.is_empty() {
        put(EXTRA_GROUPS_KEY, &extra_groups.join(","));
    }
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": format!("{SECRET_PREFIX}{id}"), "namespace": NAMESPACE},
        "type": SECRET_TYPE,
        "data": data,
    })
}

/// The hex SHA-256 a join token carries for this CA PEM.
pub fn ca_hash(ca_pem: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(ca_pem))
}

/// A join token: the CA's hash and the bootstrap token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinToken {
    pub ca_hash: String,
    pub id: String,
    pub secret: String,
}

impl JoinToken {
    /// `K10<hash>::<id>.<secret>`; a bare `<id>.<secret>` (no CA pinning) is refused, so a node
    /// never trusts a server it cannot verify.
    pub fn parse(text: &str) -> Result<JoinToken, String> {
        let text = text.trim();
        let rest = text.strip_prefix(JOIN_TOKEN_PREFIX).ok_or_else(|| {
            format!("a join token starts with {JOIN_TOKEN_PREFIX} followed by the CA's SHA-256 (as `skiff server` prints it)")
        })?;
        let (hash, token) = rest
            .split_once("::")
            .ok_or_else(|| "a join token is K10<sha256 of the CA>::<id>.<secret>".to_string())?;
        if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err("the join token's CA hash is not a hex SHA-256".into());
        }
        let (id, secret) = parse_token(token)
            .ok_or_else(|| "the join token's bootstrap token is not [a-z0-9]{6}.[a-z0-9]{16}".to_string())?;
        Ok(JoinToken {
            ca_hash: hash.to_ascii_lowercase(),
            id: id.to_string(),
            secret: secret.to_string(),
        })
    }

    /// The bearer token `<id>.<secret>`.
    pub fn bearer(&self) -> String {
        format!("{}.{}", self.id, self.secret)
    }
}

impl std::fmt::Display for JoinToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{JOIN_TOKEN_PREFIX}{}::{}.{}", self.ca_hash, self.id, self.secret)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_parse_as_upstream() {
        assert_eq!(
            parse_token("abcdef.0123456789abcdef"),
            Some(("abcdef", "0123456789abcdef"))
        );
        for bad in [
            "abcdef0123456789abcdef",
            "ABCDEF.0123456789abcdef",
            "abcde.0123456789abcdef",
            "abcdef.0123456789abcde",
            "abcdef.0123456789abcdef0",
            "abcdef.0123456789abcde_",
            "",
        ] {
            assert_eq!(parse_token(bad), None, "{bad}");
        }
        for _ in 0..50 {
            let (id, secret) = generate();
            let t = format!("{id}.{secret}");
            assert!(parse_token(&t).is_some(), "{t}");
        }
    }

    #[test]
    fn join_tokens() {
        let hash = ca_hash(b"pem");
        let text = format!("K10{hash}::abcdef.0123456789abcdef");
        let t = JoinToken::parse(&text).unwrap();
        assert_eq!(t.bearer(), "abcdef.0123456789abcdef");
        assert_eq!(t.to_string(), text);
        assert!(JoinToken::parse("abcdef.0123456789abcdef").is_err());
        assert!(JoinToken::parse(&format!("K10{hash}abcdef.0123456789abcdef")).is_err());
        assert!(JoinToken::parse("K10abc::abcdef.0123456789abcdef").is_err());
        assert!(JoinToken::parse(&format!("K10{hash}::abcdef.short")).is_err());
    }

    #[test]
    fn groups_and_expiry() {
        assert_eq!(groups("").unwrap(), ["system:bootstrappers"]);
        assert_eq!(
            groups("system:bootstrappers:kubeadm:default-node-token").unwrap(),
            [
                "system:bootstrappers",
                "system:bootstrappers:kubeadm:default-node-token"
            ]
        );
        assert!(groups("system:masters").is_err());
        assert!(groups("system:bootstrappers:").is_err());
        let now: jiff::Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let s = secret("abcdef", "0123456789abcdef", Some(now), "d", &[]);
        assert_eq!(secret_data(&s, TOKEN_ID_KEY), "abcdef");
        assert_eq!(secret_data(&s, EXPIRATION_KEY), "2026-01-01T00:00:00Z");
        assert!(has_expired(&s, now));
        assert!(!has_expired(&s, "2025-12-31T23:59:59Z".parse().unwrap()));
        let never = secret("abcdef", "0123456789abcdef", None, "", &[]);
        assert!(!has_expired(&never, now));
        let mut garbled = never.clone();
        garbled["data"][EXPIRATION_KEY] = json!(BASE64.encode("tomorrow"));
        assert!(has_expired(&garbled, now));
    }
}
