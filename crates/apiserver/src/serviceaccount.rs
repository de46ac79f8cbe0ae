//! Service account tokens, as upstream's `pkg/serviceaccount`: the claims of a token
//! ([`claims`]), JWTs signed with the cluster's ES256 key ([`TokenSigner`], the key is
//! `DIR/pki/sa.key`), and the authenticator that accepts them ([`TokenSigner::authenticate`]):
//! signature, issuer, audience and lifetime, then the service account (and the pod, secret or
//! node the token is bound to) must still exist with the uid the token names.
//!
//! The authenticated user is `system:serviceaccount:NAMESPACE:NAME`, in the groups
//! `system:serviceaccounts`, `system:serviceaccounts:NAMESPACE` and `system:authenticated`.

use anyhow::Context;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as BASE64URL;
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, KeyPair as _};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::Digest;
use skiff_store::Store;

use crate::objects;
use crate::tls::Identity;

/// The issuer (`iss`) of the tokens: kubeadm's `--service-account-issuer`.
pub const DEFAULT_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

/// The projected token lifetime the kubelet asks for by default; such pod-bound tokens live a
/// year and carry `warnafter` instead (`--service-account-extend-token-expiration`, on by default).
pub const WARN_ONLY_BOUND_TOKEN_EXPIRATION_SECONDS: i64 = 60 * 60 + 7;
/// The lifetime of those extended tokens.
pub const EXPIRATION_EXTENSION_SECONDS: i64 = 24 * 365 * 60 * 60;

/// The clock skew the time claims are checked with (go-jose's `DefaultLeeway`).
const LEEWAY_SECONDS: i64 = 60;

/// The JWS algorithm of the signing key.
const ALGORITHM: &str = "ES256";

/// The user name of a service account (upstream's `MakeUsername`).
pub fn user_name(namespace: &str, name: &str) -> String {
    format!("system:serviceaccount:{namespace}:{name}")
}

/// The groups of a service account's user, with `system:authenticated`.
pub fn groups(namespace: &str) -> Vec<String> {
    vec![
        "system:serviceaccounts".to_string(),
        format!("system:serviceaccounts:{namespace}"),
        "system:authenticated".to_string(),
    ]
}

/// The payload of a token: the registered claims, then `kubernetes.io`. Fields are in the
/// order upstream's tokens have them (alphabetical).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    #[serde(default, deserialize_with = "audience", skip_serializing_if = "Vec::is_empty")]
    pub aud: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exp: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iat: Option<i64>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub iss: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub jti: String,
    #[serde(rename = "kubernetes.io", default)]
    pub kubernetes: KubernetesClaims,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbf: Option<i64>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sub: String,
}

/// The private claim `kubernetes.io`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KubernetesClaims {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<ObjectRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<ObjectRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<ObjectRef>,
    #[serde(default)]
    pub serviceaccount: ObjectRef,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warnafter: Option<i64>,
}

/// A name and uid in the claims.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectRef {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
}

impl ObjectRef {
    /// The name and uid of a stored object.
    pub fn of(obj: &Value) -> ObjectRef {
        ObjectRef {
            name: objects::name(obj).to_string(),
            uid: objects::uid(obj).to_string(),
        }
    }
}

/// `aud` is a string or an array of strings (RFC 7519).
fn audience<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match Option::<OneOrMany>::deserialize(d)? {
        None => Vec::new(),
        Some(OneOrMany::One(a)) => vec![a],
        Some(OneOrMany::Many(a)) => a,
    })
}

/// What a token is bound to besides its service account.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Bound {
    #[default]
    Nothing,
    /// A pod, and the node it runs on when known (the node's uid may be missing).
    Pod {
        pod: ObjectRef,
        node: Option<ObjectRef>,
    },
    Secret(ObjectRef),
    Node(ObjectRef),
}

/// The claims of a token for `service_account` (upstream's `Claims`): valid from `now` for
/// `expiration_seconds`, `warn_after` seconds (when not 0) marking it stale early.
pub fn claims(
    service_account: &Value,
    bound: Bound,
    expiration_seconds: i64,
    warn_after: i64,
    audiences: Vec<String>,
    now: i64,
) -> Claims {
    let namespace = objects::namespace(service_account).to_string();
    let mut kubernetes = KubernetesClaims {
        serviceaccount: ObjectRef::of(service_account),
        ..Default::default()
    };
    match bound {
        Bound::Nothing => {}
        Bound::Pod { pod, node } => {
            kubernetes.pod = Some(pod);
            kubernetes.node = node;
        }
        Bound::Secret(secret) => kubernetes.secret = Some(secret),
        Bound::Node(node) => kubernetes.node = Some(node),
    }
    if warn_after != 0 {
        kubernetes.warnafter = Some(now.saturating_add(warn_after));
    }
    Claims {
        aud: audiences,
        exp: Some(now.saturating_add(expiration_seconds)),
        iat: Some(now),
        iss: String::new(),
        jti: uuid::Uuid::new_v4().to_string(),
        nbf: Some(now),
        sub: user_name(&namespace, objects::name(service_account)),
        kubernetes: KubernetesClaims {
            namespace,
            ..kubernetes
        },
    }
}

/// Why a bearer token was not accepted. Every one of them is a 401 to the client; only
/// [`TokenError::NotOurs`] is not worth a log line (the token was meant for someone else).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    /// Not a compact JWT whose issuer is this server's.
    #[error("not a service account token of this issuer")]
    NotOurs,
    #[error("malformed token: {0}")]
    Malformed(String),
    #[error("invalid signature, no keys found")]
    UnknownKey,
    #[error("invalid signature")]
    Signature,
    #[error("token audiences {} is invalid for the target audiences {}", go_quoted(.token), go_quoted(.target))]
    Audience { token: Vec<String>, target: Vec<String> },
    #[error("service account token has expired")]
    Expired,
    #[error("service account token is not valid yet")]
    NotValidYet,
    #[error("service account token is issued in the future")]
    IssuedInTheFuture,
    /// The service account or the bound object is gone, or is another one now.
    #[error("{0}")]
    Invalidated(String),
}

/// A string list as Go's `%q` prints it: `["a" "b"]`.
fn go_quoted(list: &[String]) -> String {
    let items: Vec<String> = list.iter().map(|s| format!("{s:?}")).collect();
    format!("[{}]", items.join(" "))
}

#[derive(Serialize, Deserialize)]
struct Header {
    alg: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    kid: String,
}

/// Signs tokens with the cluster's service account key and authenticates them.
pub struct TokenSigner {
    key: EcdsaKeyPair,
    rng: SystemRandom,
    key_id: String,
    issuer: String,
    api_audiences: Vec<String>,
}

impl std::fmt::Debug for TokenSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key stays out of logs.
        f.debug_struct("TokenSigner")
            .field("key_id", &self.key_id)
            .field("issuer", &self.issuer)
            .field("api_audiences", &self.api_audiences)
            .finish_non_exhaustive()
    }
}

impl TokenSigner {
    /// A signer for an ECDSA P-256 key in PKCS#8 PEM. The API server's audiences are the
    /// issuer alone, as upstream's `--api-audiences` default to `--service-account-issuer`.
    pub fn from_pem(key_pem: &str, issuer: &str) -> anyhow::Result<TokenSigner> {
        let pair = rcgen::KeyPair::from_pem(key_pem).context("parsing the service account key")?;
        anyhow::ensure!(
            pair.algorithm() == &rcgen::PKCS_ECDSA_P256_SHA256,
            "the service account key must be an ECDSA P-256 key"
        );
        let rng = SystemRandom::new();
        let key = EcdsaKeyPair::from_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, pair.serialized_der(), &rng)
            .map_err(|e| anyhow::anyhow!("loading the service account key: {e}"))?;
        // Upstream's key id: the unpadded base64url SHA-256 of the PKIX public key.
        let key_id = BASE64URL.encode(sha2::Sha256::digest(rcgen::PublicKeyData::subject_public_key_info(
            &pair,
        )));
        Ok(TokenSigner {
            key,
            rng,
            key_id,
            issuer: issuer.to_string(),
            api_audiences: vec![issuer.to_string()],
        })
    }

    /// The audiences a token must have one of to authenticate to this server, and the
    /// audiences of a TokenRequest that names none.
    pub fn api_audiences(&self) -> &[String] {
        &self.api_audiences
    }

    /// A compact JWS of `claims`, with this server's issuer.
    pub fn sign(&self, claims: &Claims) -> anyhow::Result<String> {
        let claims = Claims {
            iss: self.issuer.clone(),
            ..claims.clone()
        };
        let header = Header {
            alg: ALGORITHM.to_string(),
            kid: self.key_id.clone(),
        };
        let mut token = BASE64URL.encode(serde_json::to_vec(&header).context("encoding the token header")?);
        token.push('.');
        token.push_str(&BASE64URL.encode(serde_json::to_vec(&claims).context("encoding the token claims")?));
        let signature = self
            .key
            .sign(&self.rng, token.as_bytes())
            .map_err(|e| anyhow::anyhow!("signing the token: {e}"))?;
        token.push('.');
        token.push_str(&BASE64URL.encode(signature.as_ref()));
        Ok(token)
    }

    /// The claims of `token` if this server signed it, for one of its audiences, and it is
    /// valid at `now` (seconds since the epoch). The objects it names are not looked at.
    pub fn verify(&self, token: &str, now: i64) -> Result<Claims, TokenError> {
        self.verify_for(token, now, &self.api_audiences)
    }

    /// [`TokenSigner::verify`] for the audiences `targets` instead of the server's own (a
    /// TokenReview's `spec.audiences`).
    pub fn verify_for(&self, token: &str, now: i64, targets: &[String]) -> Result<Claims, TokenError> {
        // As upstream: anything but a compact JWT of our issuer is not ours to judge.
        if token.trim_start().starts_with('{') {
            return Err(TokenError::NotOurs);
        }
        let parts: Vec<&str> = token.split('.').collect();
        let [header_b64, payload_b64, signature_b64] = parts.as_slice() else {
            return Err(TokenError::NotOurs);
        };
        let payload = BASE64URL.decode(payload_b64).map_err(|_| TokenError::NotOurs)?;
        #[derive(Deserialize)]
        struct Issuer {
            #[serde(default)]
            iss: String,
        }
        let unverified: Issuer = serde_json::from_slice(&payload).map_err(|_| TokenError::NotOurs)?;
        if unverified.iss != self.issuer {
            return Err(TokenError::NotOurs);
        }

        let header = BASE64URL
            .decode(header_b64)
            .map_err(|e| TokenError::Malformed(format!("header: {e}")))?;
        let header: Header =
            serde_json::from_slice(&header).map_err(|e| TokenError::Malformed(format!("header: {e}")))?;
        if !header.kid.is_empty() && header.kid != self.key_id {
            return Err(TokenError::UnknownKey);
        }
        if header.alg != ALGORITHM {
            return Err(TokenError::Signature);
        }
        let signature = BASE64URL.decode(signature_b64).map_err(|_| TokenError::Signature)?;
        let signed = &token[..header_b64.len() + 1 + payload_b64.len()];
        signature::UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, self.key.public_key().as_ref())
            .verify(signed.as_bytes(), &signature)
            .map_err(|_| TokenError::Signature)?;

        let claims: Claims =
            serde_json::from_slice(&payload).map_err(|e| TokenError::Malformed(format!("claims: {e}")))?;
        // Tokens without an audience are legacy tokens, meant for the API server.
        let token_audiences = if claims.aud.is_empty() {
            self.api_audiences.clone()
        } else {
            claims.aud.clone()
        };
        if !token_audiences.iter().any(|a| targets.contains(a)) {
            return Err(TokenError::Audience {
                token: token_audiences,
                target: targets.to_vec(),
            });
        }
        if claims.nbf.is_some_and(|nbf| now.saturating_add(LEEWAY_SECONDS) < nbf) {
            return Err(TokenError::NotValidYet);
        }
        if claims.exp.is_some_and(|exp| now.saturating_sub(LEEWAY_SECONDS) > exp) {
            return Err(TokenError::Expired);
        }
        if claims.iat.is_some_and(|iat| now.saturating_add(LEEWAY_SECONDS) < iat) {
            return Err(TokenError::IssuedInTheFuture);
        }
        Ok(claims)
    }

    /// The user of a bearer token this server issued (upstream's JWT authenticator and its
    /// validator): the token must verify, and the service account, and the pod, secret or node
    /// it is bound to, must still exist with the same uid and not have been deleted before
    /// `now` less the leeway.
    pub async fn authenticate(&self, store: &dyn Store, token: &str, now: i64) -> Result<Identity, TokenError> {
        self.authenticate_for(store, token, now, &self.api_audiences)
            .await
            .map(|(id, _)| id)
    }

    /// [`TokenSigner::authenticate`] for the audiences `targets`; with the user, the audiences
    /// of `targets` the token is for (upstream's `Response.Audiences`).
    pub async fn authenticate_for(
        &self,
        store: &dyn Store,
        token: &str,
        now: i64,
        targets: &[String],
    ) -> Result<(Identity, Vec<String>), TokenError> {
        let claims = self.verify_for(token, now, targets)?;
        let audiences: Vec<String> = if claims.aud.is_empty() {
            self.api_audiences
                .iter()
                .filter(|a| targets.contains(a))
                .cloned()
                .collect()
        } else {
            claims.aud.iter().filter(|a| targets.contains(a)).cloned().collect()
        };
        let k = &claims.kubernetes;
        let namespace = k.namespace.as_str();
        let sa_name = k.serviceaccount.name.as_str();
        let deleted_before = now - LEEWAY_SECONDS;

        let sa = lookup(store, "serviceaccounts", namespace, sa_name)
            .await?
            .ok_or_else(|| TokenError::Invalidated(format!("serviceaccounts \"{sa_name}\" not found")))?;
        if objects::uid(&sa) != k.serviceaccount.uid {
            return Err(TokenError::Invalidated(format!(
                "service account UID ({}) does not match claim ({})",
                objects::uid(&sa),
                k.serviceaccount.uid
            )));
        }
        if deleted(&sa, deleted_before) {
            return Err(TokenError::Invalidated(format!(
                "service account {namespace}/{sa_name} has been deleted"
            )));
        }
        if let Some(secret) = &k.secret {
            check_bound(store, "secrets", "secret", namespace, secret, deleted_before).await?;
        }
        if let Some(pod) = &k.pod {
            check_bound(store, "pods", "pod", namespace, pod, deleted_before).await?;
        } else if let Some(node) = &k.node {
            // A pod-bound token only records its node; a node-bound one needs the node.
            check_bound(store, "nodes", "node", "", node, deleted_before).await?;
        }
        // Upstream's extra attributes of a service account user.
        let mut extra = std::collections::BTreeMap::new();
        let mut put = |k: &str, v: &str| {
            if !v.is_empty() {
                extra.insert(format!("authentication.kubernetes.io/{k}"), vec![v.to_string()]);
            }
        };
        if let Some(pod) = &k.pod {
            put("pod-name", &pod.name);
            put("pod-uid", &pod.uid);
        }
        if let Some(node) = &k.node {
            put("node-name", &node.name);
            put("node-uid", &node.uid);
        }
        if !claims.jti.is_empty() {
            put("credential-id", &format!("JTI={}", claims.jti));
        }
        Ok((
            Identity {
                user: user_name(namespace, sa_name),
                uid: k.serviceaccount.uid.clone(),
                groups: groups(namespace),
                extra,
            },
            audiences,
        ))
    }
}

/// A token's bound object (`what` in upstream's messages) must still exist with the uid in its
/// claims and not have been deleted before `deleted_before`.
async fn check_bound(
    store: &dyn Store,
    plural: &str,
    what: &str,
    namespace: &str,
    claim: &ObjectRef,
    deleted_before: i64,
) -> Result<(), TokenError> {
    let invalidated = || TokenError::Invalidated("service account token has been invalidated".into());
    let obj = lookup(store, plural, namespace, &claim.name)
        .await?
        .ok_or_else(invalidated)?;
    if objects::uid(&obj) != claim.uid {
        return Err(TokenError::Invalidated(format!(
            "{what} UID ({}) does not match service account {what} ref claim ({})",
            objects::uid(&obj),
            claim.uid
        )));
    }
    if deleted(&obj, deleted_before) {
        return Err(invalidated());
    }
    Ok(())
}

/// The stored core/v1 object `plural` `namespace/name`, if there is one.
async fn lookup(store: &dyn Store, plural: &str, namespace: &str, name: &str) -> Result<Option<Value>, TokenError> {
    let resource = skiff_api::registry::lookup("", "v1", plural)
        .ok_or_else(|| TokenError::Invalidated(format!("no resource {plural}")))?;
    let kv = store
        .get(&objects::key(resource, namespace, name))
        .await
        .map_err(|e| TokenError::Invalidated(format!("reading {plural} \"{name}\": {e}")))?;
    Ok(kv.as_ref().and_then(objects::decode_kv))
}

/// Whether `obj` was marked for deletion before `before` (seconds since the epoch).
fn deleted(obj: &Value, before: i64) -> bool {
    objects::deletion_timestamp(obj)
        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
        .is_some_and(|t| t.as_second() < before)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NOW: i64 = 1_800_000_000;

    fn signer() -> TokenSigner {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        TokenSigner::from_pem(&key.serialize_pem(), DEFAULT_ISSUER).unwrap()
    }

    fn service_account() -> Value {
        json!({"metadata": {"name": "bot", "namespace": "ns1", "uid": "sa-uid"}})
    }

    fn token_claims(audiences: &[&str], expiration: i64) -> Claims {
        claims(
            &service_account(),
            Bound::Nothing,
            expiration,
            0,
            audiences.iter().map(|a| a.to_string()).collect(),
            NOW,
        )
    }

    fn decode_part(token: &str, index: usize) -> Value {
        let part = token.split('.').nth(index).unwrap();
        serde_json::from_slice(&BASE64URL.decode(part).unwrap()).unwrap()
    }

    #[test]
    fn signs_and_verifies() {
        let s = signer();
        let token = s.sign(&token_claims(&[DEFAULT_ISSUER], 3600)).unwrap();
        let header = decode_part(&token, 0);
        assert_eq!(header["alg"], "ES256");
        assert_eq!(header["kid"], s.key_id.as_str());
        assert_eq!(s.key_id.len(), 43, "unpadded base64url of 32 bytes");

        let payload = decode_part(&token, 1);
        let keys: Vec<&str> = payload.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys, ["aud", "exp", "iat", "iss", "jti", "kubernetes.io", "nbf", "sub"]);
        assert_eq!(payload["iss"], DEFAULT_ISSUER);
        assert_eq!(payload["sub"], "system:serviceaccount:ns1:bot");
        assert_eq!(payload["aud"], json!([DEFAULT_ISSUER]));
        assert_eq!(payload["exp"], NOW + 3600);
        assert_eq!(payload["iat"], NOW);
        assert_eq!(payload["nbf"], NOW);
        assert_eq!(
            payload["kubernetes.io"],
            json!({"namespace": "ns1", "serviceaccount": {"name": "bot", "uid": "sa-uid"}})
        );

        let claims = s.verify(&token, NOW + 10).unwrap();
        assert_eq!(claims.sub, "system:serviceaccount:ns1:bot");
        assert_eq!(claims.iss, DEFAULT_ISSUER);
        assert_eq!(claims.kubernetes.serviceaccount.uid, "sa-uid");
    }

    #[test]
    fn pod_bound_claims() {
        let pod = json!({"metadata": {"name": "p", "uid": "pod-uid"}});
        let c = claims(
            &service_account(),
            Bound::Pod {
                pod: ObjectRef::of(&pod),
                node: Some(ObjectRef {
                    name: "n1".into(),
                    uid: String::new(),
                }),
            },
            WARN_ONLY_BOUND_TOKEN_EXPIRATION_SECONDS,
            3607,
            vec!["a".into()],
            NOW,
        );
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(
            v["kubernetes.io"],
            json!({
                "namespace": "ns1",
                "node": {"name": "n1"},
                "pod": {"name": "p", "uid": "pod-uid"},
                "serviceaccount": {"name": "bot", "uid": "sa-uid"},
                "warnafter": NOW + 3607,
            })
        );
    }

    #[test]
    fn expired_and_early_tokens() {
        let s = signer();
        let token = s.sign(&token_claims(&[], 600)).unwrap();
        // A minute of leeway either way.
        assert!(s.verify(&token, NOW + 600 + 60).is_ok());
        assert_eq!(s.verify(&token, NOW + 600 + 61), Err(TokenError::Expired));
        assert!(s.verify(&token, NOW - 60).is_ok());
        assert_eq!(s.verify(&token, NOW - 61), Err(TokenError::NotValidYet));
        let mut c = token_claims(&[], 600);
        c.nbf = None;
        let token = s.sign(&c).unwrap();
        assert_eq!(s.verify(&token, NOW - 61), Err(TokenError::IssuedInTheFuture));
    }

    #[test]
    fn audiences() {
        let s = signer();
        // No audience: a legacy token, for the API server.
        assert!(s.verify(&s.sign(&token_claims(&[], 3600)).unwrap(), NOW).is_ok());
        assert!(
            s.verify(&s.sign(&token_claims(&["vault", DEFAULT_ISSUER], 3600)).unwrap(), NOW)
                .is_ok()
        );
        let e = s
            .verify(&s.sign(&token_claims(&["vault", "other"], 3600)).unwrap(), NOW)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "token audiences [\"vault\" \"other\"] is invalid for the target audiences \
             [\"https://kubernetes.default.svc.cluster.local\"]"
        );
        // `aud` as a single string is accepted too.
        let c: Claims = serde_json::from_value(json!({"aud": "x", "sub": "s"})).unwrap();
        assert_eq!(c.aud, vec!["x"]);
    }

    #[test]
    fn tampered_and_foreign_tokens() {
        let s = signer();
        let token = s.sign(&token_claims(&[], 3600)).unwrap();
        let parts: Vec<&str> = token.split('.').collect();

        // Claims changed after signing: another service account.
        let mut payload = decode_part(&token, 1);
        payload["kubernetes.io"]["serviceaccount"]["name"] = json!("admin");
        let forged = format!(
            "{}.{}.{}",
            parts[0],
            BASE64URL.encode(serde_json::to_vec(&payload).unwrap()),
            parts[2]
        );
        assert_eq!(s.verify(&forged, NOW), Err(TokenError::Signature));

        // A flipped signature byte, a truncated or non-base64 signature.
        let mut sig = BASE64URL.decode(parts[2]).unwrap();
        sig[10] ^= 1;
        let flipped = format!("{}.{}.{}", parts[0], parts[1], BASE64URL.encode(&sig));
        assert_eq!(s.verify(&flipped, NOW), Err(TokenError::Signature));
        assert_eq!(
            s.verify(&format!("{}.{}.", parts[0], parts[1]), NOW),
            Err(TokenError::Signature)
        );
        assert_eq!(
            s.verify(&format!("{}.{}.!!", parts[0], parts[1]), NOW),
            Err(TokenError::Signature)
        );

        // The same claims signed by another server's key.
        let other = signer();
        assert_eq!(
            s.verify(&other.sign(&token_claims(&[], 3600)).unwrap(), NOW),
            Err(TokenError::UnknownKey)
        );
        // Another algorithm in the header.
        let none = BASE64URL.encode(br#"{"alg":"none"}"#);
        assert_eq!(
            s.verify(&format!("{none}.{}.{}", parts[1], parts[2]), NOW),
            Err(TokenError::Signature)
        );

        // Not JWTs of this issuer at all.
        for t in ["", "abc", "a.b", "a.b.c.d", "{\"a\":1}", "x.!!.y", "static-token-0123"] {
            assert_eq!(s.verify(t, NOW), Err(TokenError::NotOurs), "{t}");
        }
        let foreign = TokenSigner::from_pem(
            &rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
                .unwrap()
                .serialize_pem(),
            "https://issuer.example",
        )
        .unwrap();
        assert_eq!(
            s.verify(&foreign.sign(&token_claims(&[], 3600)).unwrap(), NOW),
            Err(TokenError::NotOurs)
        );
    }

    #[test]
    fn keys_other_than_p256_are_refused() {
        let rsa_like = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap();
        assert!(TokenSigner::from_pem(&rsa_like.serialize_pem(), DEFAULT_ISSUER).is_err());
        assert!(TokenSigner::from_pem("not a key", DEFAULT_ISSUER).is_err());
    }

    async fn put(store: &dyn Store, plural: &str, obj: Value) {
        let res = skiff_api::registry::lookup("", "v1", plural).unwrap();
        let key = objects::key(res, objects::namespace(&obj), objects::name(&obj));
        match store.get(&key).await.unwrap() {
            Some(kv) => {
                store
                    .update(&key, objects::encode_for_store(&obj), kv.mod_revision)
                    .await
                    .unwrap();
            }
            None => {
                store.create(&key, objects::encode_for_store(&obj)).await.unwrap();
            }
        }
    }

    #[tokio::test]
    async fn authenticates_while_the_objects_exist() {
        let store = skiff_store::memory::MemoryStore::new();
        let store: &dyn Store = &*store;
        let s = signer();
        put(store, "serviceaccounts", service_account()).await;
        let pod = json!({"metadata": {"name": "p", "namespace": "ns1", "uid": "pod-uid"}});
        put(store, "pods", pod.clone()).await;

        let plain = s.sign(&token_claims(&[], 3600)).unwrap();
        let id = s.authenticate(store, &plain, NOW).await.unwrap();
        assert_eq!(id.user, "system:serviceaccount:ns1:bot");
        assert_eq!(
            id.groups,
            [
                "system:serviceaccounts",
                "system:serviceaccounts:ns1",
                "system:authenticated"
            ]
        );

        let bound = claims(
            &service_account(),
            Bound::Pod {
                pod: ObjectRef::of(&pod),
                node: None,
            },
            3600,
            0,
            Vec::new(),
            NOW,
        );
        let bound = s.sign(&bound).unwrap();
        assert!(s.authenticate(store, &bound, NOW).await.is_ok());

        // The pod is recreated under the same name: the token was for the old one.
        put(
            store,
            "pods",
            json!({"metadata": {"name": "p", "namespace": "ns1", "uid": "pod-uid-2"}}),
        )
        .await;
        assert_eq!(
            s.authenticate(store, &bound, NOW).await.unwrap_err().to_string(),
            "pod UID (pod-uid-2) does not match service account pod ref claim (pod-uid)"
        );
        assert!(s.authenticate(store, &plain, NOW).await.is_ok());

        // A service account being deleted for longer than the leeway.
        put(
            store,
            "serviceaccounts",
            json!({"metadata": {"name": "bot", "namespace": "ns1", "uid": "sa-uid",
                "deletionTimestamp": "2020-01-01T00:00:00Z"}}),
        )
        .await;
        assert_eq!(
            s.authenticate(store, &plain, NOW).await.unwrap_err().to_string(),
            "service account ns1/bot has been deleted"
        );

        // Recreated service account: another uid.
        put(
            store,
            "serviceaccounts",
            json!({"metadata": {"name": "bot", "namespace": "ns1", "uid": "sa-uid-2"}}),
        )
        .await;
        assert_eq!(
            s.authenticate(store, &plain, NOW).await.unwrap_err().to_string(),
            "service account UID (sa-uid-2) does not match claim (sa-uid)"
        );

        // No service account at all.
        let other = claims(
            &json!({"metadata": {"name": "ghost", "namespace": "ns1", "uid": "u"}}),
            Bound::Nothing,
            3600,
            0,
            Vec::new(),
            NOW,
        );
        assert_eq!(
            s.authenticate(store, &s.sign(&other).unwrap(), NOW)
                .await
                .unwrap_err()
                .to_string(),
            "serviceaccounts \"ghost\" not found"
        );
    }
}
