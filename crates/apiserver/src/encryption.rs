//! Encryption at rest of Secrets, as upstream's `EncryptionConfiguration`
//! (`staging/src/k8s.io/apiserver/pkg/server/options/encryptionconfig`) and k3s's
//! `secrets-encrypt`.
//!
//! - The configuration file is upstream's (`apiserver.config.k8s.io/v1`), with its validation
//!   errors, given with `--encryption-provider-config`; without it the server generates one under
//!   its data dir at first start ([`GENERATED_CONFIG`]) and keeps using it.
//! - Providers: `aesgcm` (AES-GCM, 16/24/32-byte keys, random 12-byte nonce, the storage key as
//!   additional authenticated data), `secretbox` (XSalsa20-Poly1305, 32-byte keys, random 24-byte
//!   nonce) and `identity`. A stored value is `k8s:enc:<provider>:v1:<key name>:` then the
//!   provider's output, byte for byte as upstream writes it, so a value written by one reads in the
//!   other. The first provider encrypts; every provider decrypts what carries its prefix, and
//!   `identity` what carries none.
//! - [`EncryptedStore`] wraps the [`Store`]: the values of keys under [`SECRETS_PREFIX`] are
//!   sealed on every write and opened on every read, so nothing else in the server knows. Other
//!   keys cost one prefix check.
//! - [`Encryption`] answers `skiff secrets-encrypt status|rotate-keys|reencrypt` through
//!   `/skiff/secrets-encrypt/...` on the API server (only the API server touches the store), for
//!   callers the authorizer chain allows that path (cluster-admin does). Re-encryption rewrites every Secret, then erases the
//!   store's history up to that point, so no old value (plaintext under `identity`, or under a
//!   retired key) stays in the database files.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use aes_gcm::aead::generic_array::GenericArray;
use aes_gcm::aead::generic_array::typenum::Unsigned;
use aes_gcm::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use aes_gcm::aes::Aes192;
use aes_gcm::{Aes128Gcm, Aes256Gcm, AesGcm};
use anyhow::Context;
use async_trait::async_trait;
use axum::response::Response;
use base64::Engine;
use crypto_secretbox::XSalsa20Poly1305;
use futures::StreamExt;
use futures::stream::BoxStream;
use http::{Method, StatusCode};
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use skiff_api::StatusError;
use skiff_store::{Event, KeyValue, ListOptions, ListResult, Op, Result, Revision, Store, StoreError};

use crate::ApiState;

/// The keys whose values are encrypted: Secrets (upstream's `secrets` resource).
pub const SECRETS_PREFIX: &str = "/registry/secrets/";

/// The configuration the server generates (mode 0600) when none is given.
pub const GENERATED_CONFIG: &str = "encryption-config.yaml";

const API_VERSION: &str = "apiserver.config.k8s.io/v1";
const KIND: &str = "EncryptionConfiguration";

/// Every encrypted value starts with this (upstream reserves it; `identity` refuses to read it).
const ENCRYPTED: &[u8] = b"k8s:enc:";
const AESGCM_PREFIX: &str = "k8s:enc:aesgcm:v1:";
const SECRETBOX_PREFIX: &str = "k8s:enc:secretbox:v1:";
/// Written by providers Skiff does not implement; recognised only to report them.
const OTHER_PREFIXES: &[(&str, &str)] = &[
    ("aescbc", "k8s:enc:aescbc:v1:"),
    ("kms", "k8s:enc:kms:v1:"),
    ("kms", "k8s:enc:kms:v2:"),
];

// ---------------------------------------------------------------------------------------------
// The configuration file.

/// Upstream's `EncryptionConfiguration` (apiserver.config.k8s.io/v1).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EncryptionConfiguration {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub resources: Vec<ResourceConfiguration>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct ResourceConfiguration {
    #[serde(default)]
    pub resources: Vec<String>,
    #[serde(default)]
    pub providers: Vec<ProviderConfiguration>,
}

/// One provider: exactly one of the fields is set.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct ProviderConfiguration {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aesgcm: Option<KeysConfiguration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aescbc: Option<KeysConfiguration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secretbox: Option<KeysConfiguration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<IdentityConfiguration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kms: Option<Value>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct KeysConfiguration {
    #[serde(default)]
    pub keys: Vec<KeyConfiguration>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct KeyConfiguration {
    #[serde(default)]
    pub name: String,
    /// The key, base64 (standard alphabet, padded).
    #[serde(default)]
    pub secret: String,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct IdentityConfiguration {}

/// Reads, decodes (strictly: unknown fields are errors) and validates the file, with upstream's
/// errors (`LoadEncryptionConfig`).
pub fn load_config(path: &Path) -> anyhow::Result<EncryptionConfiguration> {
    read_config(path).map_err(|e| anyhow::anyhow!("error while parsing file: {e}"))
}

fn read_config(path: &Path) -> std::result::Result<EncryptionConfiguration, String> {
    let quoted = format!("{:?}", path.display().to_string());
    let data = std::fs::read(path).map_err(|e| {
        format!("error while loading file: error reading encryption provider configuration file {quoted}: {e}")
    })?;
    if data.is_empty() {
        return Err(format!(
            "error while loading file: encryption provider configuration file {quoted} is empty"
        ));
    }
    let config = decode_config(&data)
        .map_err(|e| format!("error decoding encryption provider configuration file {quoted}: {e}"))?;
    aggregate(validate(&config))?;
    Ok(config)
}

/// Upstream's `utilerrors.NewAggregate(..).Error()`: one error alone, several in brackets.
fn aggregate(errors: Vec<String>) -> std::result::Result<(), String> {
    let mut seen: Vec<String> = Vec::new();
    for e in errors {
        if !seen.contains(&e) {
            seen.push(e);
        }
    }
    match seen.len() {
        0 => Ok(()),
        1 => Err(seen.remove(0)),
        _ => Err(format!("[{}]", seen.join(", "))),
    }
}

fn decode_config(data: &[u8]) -> std::result::Result<EncryptionConfiguration, String> {
    let text = std::str::from_utf8(data).map_err(|e| format!("error converting YAML to JSON: {e}"))?;
    let value: Value = serde_saphyr::from_str(text).map_err(|e| format!("error converting YAML to JSON: {e}"))?;
    let text_field = |name: &str| value.get(name).and_then(Value::as_str).unwrap_or("").to_string();
    let (kind, version) = (text_field("kind"), text_field("apiVersion"));
    if kind.is_empty() {
        return Err("Object 'Kind' is missing".into());
    }
    if version.is_empty() {
        return Err("Object 'apiVersion' is missing".into());
    }
    if kind != KIND || version != API_VERSION {
        return Err(format!("no kind {kind:?} is registered for version {version:?}"));
    }
    let unknown = unknown_fields(&value);
    if !unknown.is_empty() {
        let fields: Vec<String> = unknown.iter().map(|f| format!("unknown field {f:?}")).collect();
        return Err(format!("strict decoding error: {}", fields.join(", ")));
    }
    serde_json::from_value(value).map_err(|e| e.to_string())
}

/// The fields upstream's strict decoding would refuse, as paths (`resources[0].providers[1].foo`).
fn unknown_fields(config: &Value) -> Vec<String> {
    fn check(v: &Value, path: &str, known: &[&str], out: &mut Vec<String>) {
        if let Some(map) = v.as_object() {
            for k in map.keys().filter(|k| !known.contains(&k.as_str())) {
                out.push(if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                });
            }
        }
    }
    let items = |v: &Value, name: &str| v.get(name).and_then(Value::as_array).cloned().unwrap_or_default();
    let mut out = Vec::new();
    check(config, "", &["apiVersion", "kind", "resources"], &mut out);
    for (i, resource) in items(config, "resources").iter().enumerate() {
        let rp = format!("resources[{i}]");
        check(resource, &rp, &["resources", "providers"], &mut out);
        for (j, provider) in items(resource, "providers").iter().enumerate() {
            let pp = format!("{rp}.providers[{j}]");
            check(
                provider,
                &pp,
                &["aesgcm", "aescbc", "secretbox", "identity", "kms"],
                &mut out,
            );
            for name in ["aesgcm", "aescbc", "secretbox"] {
                if let Some(keys) = provider.get(name) {
                    let kp = format!("{pp}.{name}");
                    check(keys, &kp, &["keys"], &mut out);
                    for (k, key) in items(keys, "keys").iter().enumerate() {
                        check(key, &format!("{kp}.keys[{k}]"), &["name", "secret"], &mut out);
                    }
                }
            }
            if let Some(identity) = provider.get("identity") {
                check(identity, &format!("{pp}.identity"), &[], &mut out);
            }
            if let Some(kms) = provider.get("kms") {
                let known = ["apiVersion", "name", "cachesize", "endpoint", "timeout"];
                check(kms, &format!("{pp}.kms"), &known, &mut out);
            }
        }
    }
    out
}

fn required(field: &str, detail: &str) -> String {
    format!("{field}: Required value: {detail}")
}

fn invalid(field: &str, value: &str, detail: &str) -> String {
    format!("{field}: Invalid value: {value}: {detail}")
}

fn quoted(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

/// Upstream's `schema.ParseGroupResource`: `secrets` and `secrets.` are the core group's.
fn group_resource(s: &str) -> (&str, &str) {
    match s.split_once('.') {
        Some((resource, group)) => (group, resource),
        None => ("", s),
    }
}

/// Upstream's `ValidateEncryptionConfiguration` (KMS settings aside: Skiff refuses KMS anyway).
fn validate(c: &EncryptionConfiguration) -> Vec<String> {
    let mut errs = Vec::new();
    if c.resources.is_empty() {
        errs.push(required("resources", "at least one resources is required"));
        return errs;
    }
    for (i, conf) in c.resources.iter().enumerate() {
        let r = format!("resources[{i}].resources");
        let p = format!("resources[{i}].providers");
        if conf.resources.is_empty() {
            errs.push(required(&r, &format!("at least one {r} is required")));
        }
        validate_resource_overlap(&conf.resources, &r, &mut errs);
        validate_resource_names(&conf.resources, &r, &mut errs);
        if conf.providers.is_empty() {
            errs.push(required(&p, &format!("at least one {p} is required")));
        }
        for (j, provider) in conf.providers.iter().enumerate() {
            let path = format!("{p}[{j}]");
            let found = [
                provider.kms.is_some(),
                provider.aesgcm.is_some(),
                provider.aescbc.is_some(),
                provider.secretbox.is_some(),
                provider.identity.is_some(),
            ]
            .iter()
            .filter(|set| **set)
            .count();
            let value = serde_json::to_string(provider).unwrap_or_default();
            if found == 0 {
                errs.push(invalid(
                    &path,
                    &value,
                    "provider does not contain any of the expected providers: KMS, AESGCM, AESCBC, Secretbox, Identity",
                ));
            } else if found > 1 {
                errs.push(invalid(
                    &path,
                    &value,
                    "more than one provider specified in a single element, should split into different list elements",
                ));
            }
            if provider.kms.is_some() {
                continue;
            }
            let keys = [
                (&provider.aesgcm, "aesgcm", &[16, 24, 32][..]),
                (&provider.aescbc, "aescbc", &[16, 24, 32][..]),
                (&provider.secretbox, "secretbox", &[32][..]),
            ];
            if let Some((Some(config), name, sizes)) = keys.into_iter().find(|(c, _, _)| c.is_some()) {
                validate_keys(&config.keys, &format!("{path}.{name}.keys"), sizes, &mut errs);
            }
        }
    }
    errs
}

fn validate_resource_overlap(resources: &[String], field: &str, errs: &mut Vec<String>) {
    if resources.len() < 2 {
        return;
    }
    let parsed: Vec<(&str, &str)> = resources.iter().map(|r| group_resource(r)).collect();
    let (mut duplicate, mut overlap) = (false, false);
    for (i, r1) in parsed.iter().enumerate() {
        for (j, r2) in parsed.iter().enumerate() {
            if i == j {
                continue;
            }
            if r1 == r2 && !duplicate {
                duplicate = true;
                continue;
            }
            if overlap {
                continue;
            }
            if *r1 == ("*", "*") {
                overlap = true;
                continue;
            }
            if r1.0 != r2.0 {
                continue;
            }
            if r1.1 == "*" || r2.1 == "*" {
                overlap = true;
            }
        }
    }
    let value = serde_json::to_string(resources).unwrap_or_default();
    if duplicate {
        errs.push(invalid(
            field,
            &value,
            "the same resource cannot be specified multiple times",
        ));
    }
    if overlap {
        errs.push(invalid(
            field,
            &value,
            "using overlapping resources such as 'secrets' and '*.' in the same resource list is not allowed as they will be masked",
        ));
    }
}

fn validate_resource_names(resources: &[String], field: &str, errs: &mut Vec<String>) {
    for (j, res) in resources.iter().enumerate() {
        let path = format!("{field}[{j}]");
        let (group, resource) = group_resource(res);
        let detail = if res.to_lowercase() != *res {
            "resource name should not contain capital letters"
        } else if res == "*" {
            "use '*.' to encrypt all the resources from core API group or *.* to encrypt all resources"
        } else if matches!(
            res.as_str(),
            "apiserveripinfo" | "serviceipallocations" | "servicenodeportallocations"
        ) {
            "resources which do not have REST API/s cannot be encrypted"
        } else if group == "events.k8s.io" {
            "'*.events.k8s.io' objects are stored using the 'events' API group in etcd. Use 'events' instead in the config file"
        } else if group == "extensions" {
            "'extensions' group has been removed and cannot be used for encryption"
        } else if group == "*" && resource != "*" {
            "encrypting the same resource across groups is not supported"
        } else {
            continue;
        };
        errs.push(invalid(&path, &quoted(res), detail));
    }
}

fn validate_keys(keys: &[KeyConfiguration], field: &str, sizes: &[usize], errs: &mut Vec<String>) {
    if keys.is_empty() {
        errs.push(required(field, "at least one keys is required"));
        return;
    }
    for (i, key) in keys.iter().enumerate() {
        let path = format!("{field}[{i}]");
        if key.name.is_empty() {
            errs.push(required(&format!("{path}.name"), "name is a mandatory field for a key"));
        }
        let secret_path = format!("{path}.secret");
        if key.secret.is_empty() {
            errs.push(required(&secret_path, "secret is a mandatory field for a key"));
            continue;
        }
        let Ok(secret) = base64::engine::general_purpose::STANDARD.decode(&key.secret) else {
            errs.push(invalid(&secret_path, "\"REDACTED\"", "secrets must be base64 encoded"));
            continue;
        };
        if !sizes.contains(&secret.len()) {
            let expected: Vec<String> = sizes.iter().map(usize::to_string).collect();
            errs.push(invalid(
                &secret_path,
                "\"REDACTED\"",
                &format!(
                    "secret is not of the expected length, got {}, expected one of [{}]",
                    secret.len(),
                    expected.join(" ")
                ),
            ));
        }
    }
}

/// The transformer of a valid configuration; what Skiff does not implement is refused here
/// (upstream's "error while building transformers").
pub fn build_transformer(config: &EncryptionConfiguration) -> anyhow::Result<Transformer> {
    build(config).map_err(|e| anyhow::anyhow!("error while building transformers: {e}"))
}

fn build(config: &EncryptionConfiguration) -> std::result::Result<Transformer, String> {
    let mut providers = Vec::new();
    // Entries naming the same resource add their providers after the earlier ones, as upstream.
    for conf in &config.resources {
        for res in &conf.resources {
            if group_resource(res) != ("", "secrets") {
                return Err(format!(
                    "resource {res:?}: skiff encrypts only \"secrets\" at rest (list only secrets in resources)"
                ));
            }
        }
        for provider in &conf.providers {
            providers.push(build_provider(provider)?);
        }
    }
    Ok(Transformer { providers })
}

fn build_provider(p: &ProviderConfiguration) -> std::result::Result<Provider, String> {
    let decode = |key: &KeyConfiguration| {
        base64::engine::general_purpose::STANDARD
            .decode(&key.secret)
            .map_err(|e| format!("could not obtain secret for named key {}: {e}", key.name))
    };
    if p.kms.is_some() {
        return Err("the kms provider is not supported by skiff: use aesgcm, secretbox or identity".into());
    }
    if p.aescbc.is_some() {
        return Err(
            "the aescbc provider is not supported by skiff (upstream advises against it: CBC is open to padding oracle attacks): use secretbox, aesgcm or identity"
                .into(),
        );
    }
    if let Some(config) = &p.aesgcm {
        let mut keys = Vec::new();
        for key in &config.keys {
            let cipher = AesKey::new(&decode(key)?)
                .ok_or_else(|| format!("error while creating cipher for named key {}", key.name))?;
            keys.push(Keyed::new(AESGCM_PREFIX, &key.name, cipher));
        }
        return Ok(Provider::AesGcm(keys));
    }
    if let Some(config) = &p.secretbox {
        let mut keys = Vec::new();
        for key in &config.keys {
            let bytes = decode(key)?;
            let cipher = XSalsa20Poly1305::new_from_slice(&bytes)
                .map_err(|_| format!("expected key size 32 for secretbox provider, got {}", bytes.len()))?;
            keys.push(Keyed::new(SECRETBOX_PREFIX, &key.name, cipher));
        }
        return Ok(Provider::Secretbox(keys));
    }
    if p.identity.is_some() {
        return Ok(Provider::Identity);
    }
    Err("provider does not contain any of the expected providers: KMS, AESGCM, AESCBC, Secretbox, Identity".into())
}

/// The configuration Skiff generates: one fresh secretbox key, then identity so that Secrets
/// stored before encryption was on stay readable until they are re-encrypted.
fn generated_config(key_name: &str) -> EncryptionConfiguration {
    EncryptionConfiguration {
        api_version: API_VERSION.into(),
        kind: KIND.into(),
        resources: vec![ResourceConfiguration {
            resources: vec!["secrets".into()],
            providers: vec![
                ProviderConfiguration {
                    secretbox: Some(KeysConfiguration {
                        keys: vec![new_key(key_name)],
                    }),
                    ..Default::default()
                },
                ProviderConfiguration {
                    identity: Some(IdentityConfiguration {}),
                    ..Default::default()
                },
            ],
        }],
    }
}

/// A key of 32 random bytes (secretbox's size, AES-256's), from the operating system.
fn new_key(name: &str) -> KeyConfiguration {
    let key = XSalsa20Poly1305::generate_key(&mut OsRng);
    KeyConfiguration {
        name: name.into(),
        secret: base64::engine::general_purpose::STANDARD.encode(key),
    }
}

/// Puts a new key first in the configuration's writing provider (a new secretbox provider if
/// that is identity); the other keys stay, to decrypt. Returns the provider and the key's name.
fn add_key(config: &mut EncryptionConfiguration) -> anyhow::Result<(&'static str, String)> {
    let next = config
        .resources
        .iter()
        .flat_map(|r| &r.providers)
        .flat_map(|p| [&p.aesgcm, &p.aescbc, &p.secretbox])
        .flatten()
        .flat_map(|k| &k.keys)
        .filter_map(|k| k.name.strip_prefix("key-")?.parse::<u64>().ok())
        .max()
        .unwrap_or(0)
        + 1;
    let name = format!("key-{next}");
    let first = config
        .resources
        .first_mut()
        .context("the configuration lists no resources")?;
    let writer = first
        .providers
        .first_mut()
        .context("the configuration lists no providers")?;
    if let Some(keys) = &mut writer.secretbox {
        keys.keys.insert(0, new_key(&name));
        return Ok(("secretbox", name));
    }
    if let Some(keys) = &mut writer.aesgcm {
        keys.keys.insert(0, new_key(&name));
        return Ok(("aesgcm", name));
    }
    first.providers.insert(
        0,
        ProviderConfiguration {
            secretbox: Some(KeysConfiguration {
                keys: vec![new_key(&name)],
            }),
            ..Default::default()
        },
    );
    Ok(("secretbox", name))
}

/// The configuration as YAML (scalars as JSON strings, which YAML reads as they are).
fn render_config(config: &EncryptionConfiguration) -> String {
    let mut out = String::from(
        "# Generated by skiff: the first provider encrypts Secrets, every provider decrypts them.\n\
         # `skiff secrets-encrypt rotate-keys` puts a new key first. Keep this file private: it\n\
         # holds the keys, and Secrets written with a key are lost with it.\n",
    );
    // Only a valid configuration is rendered: its apiVersion and kind are these.
    let _ = writeln!(out, "apiVersion: {API_VERSION}\nkind: {KIND}");
    out.push_str("resources:\n");
    for conf in &config.resources {
        out.push_str("  - resources:\n");
        for res in &conf.resources {
            let _ = writeln!(out, "      - {}", quoted(res));
        }
        out.push_str("    providers:\n");
        for p in &conf.providers {
            let keyed = [
                ("aesgcm", &p.aesgcm),
                ("aescbc", &p.aescbc),
                ("secretbox", &p.secretbox),
            ];
            if let Some((name, Some(keys))) = keyed.into_iter().find(|(_, k)| k.is_some()) {
                let _ = writeln!(out, "      - {name}:\n          keys:");
                for key in &keys.keys {
                    let _ = writeln!(out, "            - name: {}", quoted(&key.name));
                    let _ = writeln!(out, "              secret: {}", quoted(&key.secret));
                }
            } else if p.identity.is_some() {
                out.push_str("      - identity: {}\n");
            } else if let Some(kms) = &p.kms {
                let _ = writeln!(out, "      - kms: {kms}");
            }
        }
    }
    out
}

/// Writes the configuration through a temporary file, mode 0600, and makes the rename durable:
/// no value may be encrypted with a key that a crash could lose.
fn write_config(path: &Path, config: &EncryptionConfiguration) -> anyhow::Result<()> {
    crate::pki::write_file(path, render_config(config).as_bytes(), 0o600)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .with_context(|| format!("syncing {}", dir.display()))?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Providers.

/// An AES-GCM cipher of any of upstream's key sizes.
enum AesKey {
    Aes128(Box<Aes128Gcm>),
    Aes192(Box<AesGcm<Aes192, aes_gcm::aead::consts::U12>>),
    Aes256(Box<Aes256Gcm>),
}

impl AesKey {
    fn new(key: &[u8]) -> Option<AesKey> {
        Some(match key.len() {
            16 => AesKey::Aes128(Box::new(Aes128Gcm::new_from_slice(key).ok()?)),
            24 => AesKey::Aes192(Box::new(AesGcm::new_from_slice(key).ok()?)),
            32 => AesKey::Aes256(Box::new(Aes256Gcm::new_from_slice(key).ok()?)),
            _ => return None,
        })
    }

    fn seal(&self, out: &mut Vec<u8>, plain: &[u8], aad: &[u8]) -> anyhow::Result<()> {
        match self {
            AesKey::Aes128(c) => seal(&**c, out, plain, aad),
            AesKey::Aes192(c) => seal(&**c, out, plain, aad),
            AesKey::Aes256(c) => seal(&**c, out, plain, aad),
        }
    }

    fn open(&self, data: &[u8], aad: &[u8]) -> std::result::Result<Vec<u8>, String> {
        let failed = "cipher: message authentication failed";
        match self {
            AesKey::Aes128(c) => open(&**c, data, aad, failed),
            AesKey::Aes192(c) => open(&**c, data, aad, failed),
            AesKey::Aes256(c) => open(&**c, data, aad, failed),
        }
    }
}

/// Appends a fresh random nonce and the AEAD's output (ciphertext and tag, in the order the
/// cipher writes them: after for AES-GCM, before for secretbox, as Go's libraries).
fn seal<C: Aead + AeadCore>(cipher: &C, out: &mut Vec<u8>, plain: &[u8], aad: &[u8]) -> anyhow::Result<()> {
    let nonce = C::generate_nonce(&mut OsRng);
    let sealed = cipher
        .encrypt(&nonce, Payload { msg: plain, aad })
        .map_err(|_| anyhow::anyhow!("encryption failed"))?;
    out.reserve(nonce.len() + sealed.len());
    out.extend_from_slice(&nonce);
    out.extend_from_slice(&sealed);
    Ok(())
}

fn open<C: Aead + AeadCore>(cipher: &C, data: &[u8], aad: &[u8], failed: &str) -> std::result::Result<Vec<u8>, String> {
    let nonce_len = C::NonceSize::USIZE;
    if data.len() < nonce_len + C::TagSize::USIZE {
        return Err("the stored data was shorter than the required size".into());
    }
    let (nonce, sealed) = data.split_at(nonce_len);
    cipher
        .decrypt(GenericArray::from_slice(nonce), Payload { msg: sealed, aad })
        .map_err(|_| failed.to_string())
}

/// A key with its name and the prefix of the values it writes.
struct Keyed<C> {
    name: String,
    /// `k8s:enc:<provider>:v1:<name>:`
    prefix: Vec<u8>,
    cipher: C,
}

impl<C> Keyed<C> {
    fn new(provider_prefix: &str, name: &str, cipher: C) -> Self {
        Keyed {
            name: name.to_string(),
            prefix: format!("{provider_prefix}{name}:").into_bytes(),
            cipher,
        }
    }
}

enum Provider {
    AesGcm(Vec<Keyed<AesKey>>),
    Secretbox(Vec<Keyed<XSalsa20Poly1305>>),
    Identity,
}

impl Provider {
    fn name(&self) -> &'static str {
        match self {
            Provider::AesGcm(_) => "aesgcm",
            Provider::Secretbox(_) => "secretbox",
            Provider::Identity => "identity",
        }
    }

    fn key_names(&self) -> Vec<&str> {
        match self {
            Provider::AesGcm(keys) => keys.iter().map(|k| k.name.as_str()).collect(),
            Provider::Secretbox(keys) => keys.iter().map(|k| k.name.as_str()).collect(),
            Provider::Identity => Vec::new(),
        }
    }
}

/// A provider and key as the status reports them (`None`: identity, no key).
pub type Slot = (String, Option<String>);

/// The providers of a configuration, in its order: the first encrypts, every one decrypts.
pub struct Transformer {
    providers: Vec<Provider>,
}

impl Transformer {
    /// A transformer that stores everything as it is (no configuration).
    pub fn identity() -> Transformer {
        Transformer {
            providers: vec![Provider::Identity],
        }
    }

    /// What new values are written with.
    pub fn writer(&self) -> Slot {
        match self.providers.first() {
            Some(p) => (p.name().to_string(), p.key_names().first().map(|k| k.to_string())),
            None => ("identity".to_string(), None),
        }
    }

    /// Every provider and key of the configuration, in its order.
    pub fn slots(&self) -> Vec<Slot> {
        let mut out = Vec::new();
        for p in &self.providers {
            match p {
                Provider::Identity => out.push((p.name().to_string(), None)),
                _ => out.extend(
                    p.key_names()
                        .into_iter()
                        .map(|k| (p.name().to_string(), Some(k.to_string()))),
                ),
            }
        }
        out.dedup();
        out
    }

    /// The stored form of `plain` at storage key `key` (the additional authenticated data of
    /// AES-GCM, as upstream's etcd3 store binds a value to its key).
    pub fn encrypt(&self, key: &str, plain: &[u8]) -> anyhow::Result<Vec<u8>> {
        match self.providers.first() {
            None | Some(Provider::Identity) => Ok(plain.to_vec()),
            Some(Provider::AesGcm(keys)) => {
                let k = keys.first().context("the aesgcm provider has no key")?;
                let mut out = k.prefix.clone();
                k.cipher.seal(&mut out, plain, key.as_bytes())?;
                Ok(out)
            }
            Some(Provider::Secretbox(keys)) => {
                let k = keys.first().context("the secretbox provider has no key")?;
                let mut out = k.prefix.clone();
                seal(&k.cipher, &mut out, plain, b"")?;
                Ok(out)
            }
        }
    }

    /// The value stored as `stored` at `key`: every provider whose prefix it carries is tried
    /// in order (identity takes what carries none), as upstream's prefix transformers.
    pub fn decrypt(&self, key: &str, stored: &[u8]) -> std::result::Result<Vec<u8>, String> {
        let mut errors = Vec::new();
        for provider in &self.providers {
            let attempt = match provider {
                Provider::Identity => {
                    // Encrypted data is not identity's to read; another provider may be.
                    if stored.starts_with(ENCRYPTED) {
                        continue;
                    }
                    return Ok(stored.to_vec());
                }
                Provider::AesGcm(keys) => {
                    if !stored.starts_with(AESGCM_PREFIX.as_bytes()) {
                        continue;
                    }
                    try_keys(keys, stored, "AES", |k, data| k.cipher.open(data, key.as_bytes()))
                }
                Provider::Secretbox(keys) => {
                    if !stored.starts_with(SECRETBOX_PREFIX.as_bytes()) {
                        continue;
                    }
                    try_keys(keys, stored, "Secretbox", |k, data| {
                        open(&k.cipher, data, b"", "secretbox: message authentication failed")
                    })
                }
            };
            match attempt {
                Ok(plain) => return Ok(plain),
                Err(e) => errors.push(e),
            }
        }
        aggregate(errors)?;
        Err("no matching prefix found".into())
    }

    /// The provider and key a stored value was written with (read off its prefix).
    pub fn classify(&self, stored: &[u8]) -> Slot {
        if !stored.starts_with(ENCRYPTED) {
            return ("identity".into(), None);
        }
        for (name, prefix) in [("aesgcm", AESGCM_PREFIX), ("secretbox", SECRETBOX_PREFIX)]
            .into_iter()
            .chain(OTHER_PREFIXES.iter().copied())
        {
            let Some(rest) = stored.strip_prefix(prefix.as_bytes()) else {
                continue;
            };
            let known = self
                .providers
                .iter()
                .filter(|p| p.name() == name)
                .flat_map(Provider::key_names);
            let mut known: Vec<&str> = known.collect();
            known.sort_by_key(|k| std::cmp::Reverse(k.len()));
            let key = known
                .into_iter()
                .find(|k| rest.starts_with(k.as_bytes()) && rest.get(k.len()) == Some(&b':'))
                .map(str::to_string)
                .unwrap_or_else(|| {
                    let end = rest.iter().position(|b| *b == b':').unwrap_or(rest.len().min(64));
                    String::from_utf8_lossy(&rest[..end]).into_owned()
                });
            return (name.into(), Some(key));
        }
        ("unknown".into(), None)
    }
}

/// Tries the keys whose `NAME:` prefix the value carries after its provider's prefix.
fn try_keys<C>(
    keys: &[Keyed<C>],
    stored: &[u8],
    what: &str,
    open: impl Fn(&Keyed<C>, &[u8]) -> std::result::Result<Vec<u8>, String>,
) -> std::result::Result<Vec<u8>, String> {
    let mut errors = Vec::new();
    for k in keys {
        if let Some(data) = stored.strip_prefix(&k.prefix[..]) {
            match open(k, data) {
                Ok(plain) => return Ok(plain),
                Err(e) => errors.push(e),
            }
        }
    }
    aggregate(errors)?;
    Err(format!("no matching key was found for the provided {what} transformer"))
}

// ---------------------------------------------------------------------------------------------
// The store wrapper.

type SharedTransformer = Arc<RwLock<Arc<Transformer>>>;

fn covers(key: &str) -> bool {
    key.starts_with(SECRETS_PREFIX)
}

/// Whether keys under `prefix` can be Secrets.
fn may_cover(prefix: &str) -> bool {
    prefix.starts_with(SECRETS_PREFIX) || SECRETS_PREFIX.starts_with(prefix)
}

fn backend(key: &str, what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(anyhow::anyhow!("{what} {key}: {e}"))
}

fn open_kv(t: &Transformer, kv: &mut KeyValue) -> Result<()> {
    if covers(&kv.key) {
        let plain = t
            .decrypt(&kv.key, &kv.value)
            .map_err(|e| backend(&kv.key, "decrypting", e))?;
        kv.value = Arc::from(plain);
    }
    Ok(())
}

fn open_event(t: &Transformer, mut event: Event) -> Result<Event> {
    match &mut event {
        Event::Put { kv, prev } => {
            open_kv(t, kv)?;
            if let Some(prev) = prev {
                open_kv(t, prev)?;
            }
        }
        Event::Delete { prev, .. } => open_kv(t, prev)?,
    }
    Ok(event)
}

/// A [`Store`] whose Secrets are encrypted in the store below it and plain above it.
pub struct EncryptedStore {
    inner: Arc<dyn Store>,
    transformer: SharedTransformer,
}

impl EncryptedStore {
    fn current(&self) -> Arc<Transformer> {
        self.transformer.read().clone()
    }

    fn seal(&self, t: &Transformer, key: &str, value: &[u8]) -> Result<Vec<u8>> {
        t.encrypt(key, value).map_err(|e| backend(key, "encrypting", e))
    }
}

/// What a create or update of a Secret hands back: the stored value's metadata, the caller's
/// plain value.
fn with_plain(kv: KeyValue, plain: Vec<u8>) -> KeyValue {
    KeyValue {
        value: Arc::from(plain),
        ..kv
    }
}

#[async_trait]
impl Store for EncryptedStore {
    async fn create(&self, key: &str, value: Vec<u8>) -> Result<KeyValue> {
        if !covers(key) {
            return self.inner.create(key, value).await;
        }
        let sealed = self.seal(&self.current(), key, &value)?;
        Ok(with_plain(self.inner.create(key, sealed).await?, value))
    }

    async fn update(&self, key: &str, value: Vec<u8>, expected: Revision) -> Result<KeyValue> {
        if !covers(key) {
            return self.inner.update(key, value, expected).await;
        }
        let sealed = self.seal(&self.current(), key, &value)?;
        Ok(with_plain(self.inner.update(key, sealed, expected).await?, value))
    }

    async fn delete(&self, key: &str, expected: Option<Revision>) -> Result<KeyValue> {
        let mut kv = self.inner.delete(key, expected).await?;
        if covers(key) {
            open_kv(&self.current(), &mut kv)?;
        }
        Ok(kv)
    }

    async fn txn(&self, ops: Vec<Op>) -> Result<Vec<KeyValue>> {
        if !ops.iter().any(|op| covers(op.key())) {
            return self.inner.txn(ops).await;
        }
        let t = self.current();
        let mut plain = Vec::with_capacity(ops.len());
        let mut sealed = Vec::with_capacity(ops.len());
        for op in ops {
            match op {
                Op::Create { key, value } if covers(&key) => {
                    let s = self.seal(&t, &key, &value)?;
                    plain.push(Some(value));
                    sealed.push(Op::Create { key, value: s });
                }
                Op::Update { key, value, expected } if covers(&key) => {
                    let s = self.seal(&t, &key, &value)?;
                    plain.push(Some(value));
                    sealed.push(Op::Update {
                        key,
                        value: s,
                        expected,
                    });
                }
                other => {
                    plain.push(None);
                    sealed.push(other);
                }
            }
        }
        // One value per op, in order.
        let mut kvs = self.inner.txn(sealed).await?;
        for (kv, plain) in kvs.iter_mut().zip(plain) {
            match plain {
                Some(value) => kv.value = Arc::from(value),
                None => open_kv(&t, kv)?,
            }
        }
        Ok(kvs)
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        let mut kv = self.inner.get(key).await?;
        if covers(key)
            && let Some(kv) = &mut kv
        {
            open_kv(&self.current(), kv)?;
        }
        Ok(kv)
    }

    async fn list(&self, prefix: &str, opts: ListOptions) -> Result<ListResult> {
        let mut listed = self.inner.list(prefix, opts).await?;
        if may_cover(prefix) {
            let t = self.current();
            for kv in &mut listed.items {
                open_kv(&t, kv)?;
            }
        }
        Ok(listed)
    }

    async fn get_cached(&self, key: &str) -> Result<Option<KeyValue>> {
        let mut kv = self.inner.get_cached(key).await?;
        if covers(key)
            && let Some(kv) = &mut kv
        {
            open_kv(&self.current(), kv)?;
        }
        Ok(kv)
    }

    async fn list_cached(&self, prefix: &str) -> Result<Vec<KeyValue>> {
        let mut items = self.inner.list_cached(prefix).await?;
        if may_cover(prefix) {
            let t = self.current();
            for kv in &mut items {
                open_kv(&t, kv)?;
            }
        }
        Ok(items)
    }

    async fn watch(&self, prefix: &str, after: Revision) -> Result<BoxStream<'static, Event>> {
        let stream = self.inner.watch(prefix, after).await?;
        if !may_cover(prefix) {
            return Ok(stream);
        }
        let shared = self.transformer.clone();
        // An event that cannot be decrypted ends the stream (upstream's watch ends with an
        // error): the client lists again, and that list reports the error.
        Ok(stream
            .scan((), move |_, event| {
                let t = shared.read().clone();
                let opened = match open_event(&t, event) {
                    Ok(event) => Some(event),
                    Err(e) => {
                        tracing::error!(error = %e, "ending a watch: an event cannot be decrypted");
                        None
                    }
                };
                futures::future::ready(opened)
            })
            .boxed())
    }

    async fn current_revision(&self) -> Result<Revision> {
        self.inner.current_revision().await
    }

    async fn health(&self) -> Result<()> {
        self.inner.health().await
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        self.inner.compact(revision).await
    }

    async fn compacted_revision(&self) -> Result<Revision> {
        self.inner.compacted_revision().await
    }

    async fn erase_history(&self, revision: Revision) -> Result<()> {
        self.inner.erase_history(revision).await
    }
}

// ---------------------------------------------------------------------------------------------
// Status, rotation, re-encryption.

/// Where the configuration comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// Generated by Skiff under the data dir; `rotate-keys` edits it.
    Generated(PathBuf),
    /// Given with `--encryption-provider-config`: the operator's, never edited.
    Given(PathBuf),
}

impl Source {
    pub fn path(&self) -> &Path {
        match self {
            Source::Generated(p) | Source::Given(p) => p,
        }
    }
}

/// A loaded configuration, before the store is wrapped.
pub struct Loaded {
    pub source: Source,
    pub transformer: Transformer,
    /// The configuration was generated by this start (none existed).
    pub generated_now: bool,
}

/// Loads the configuration given with `--encryption-provider-config`, or the one generated
/// under `data_dir`, generating it at first start. Errors are upstream's, for start-up.
pub fn load(data_dir: &Path, given: Option<&Path>) -> anyhow::Result<Loaded> {
    if let Some(path) = given {
        let transformer = build_transformer(&load_config(path)?)?;
        return Ok(Loaded {
            source: Source::Given(path.to_owned()),
            transformer,
            generated_now: false,
        });
    }
    let path = data_dir.join(GENERATED_CONFIG);
    let generated_now = match std::fs::symlink_metadata(&path) {
        Ok(_) => false,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    if generated_now {
        std::fs::create_dir_all(data_dir).with_context(|| format!("creating {}", data_dir.display()))?;
        write_config(&path, &generated_config("key-1"))
            .with_context(|| format!("writing the encryption configuration {}", path.display()))?;
    }
    let transformer = build_transformer(&load_config(&path)?)?;
    Ok(Loaded {
        source: Source::Generated(path),
        transformer,
        generated_now,
    })
}

/// How many Secrets are stored under one provider and key.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct KeyCount {
    pub provider: String,
    /// The key's name (none for identity).
    pub key: Option<String>,
    pub secrets: usize,
    /// New writes use it.
    pub active: bool,
}

/// `skiff secrets-encrypt status`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct StatusReport {
    pub config: String,
    /// Generated by Skiff (rotate-keys edits it), rather than given by the operator.
    pub generated: bool,
    pub active_provider: String,
    pub active_key: Option<String>,
    /// Every provider and key of the configuration, in its order.
    pub keys: Vec<KeyCount>,
    /// Secrets stored under a provider or key the configuration does not list: unreadable.
    pub unreadable: Vec<KeyCount>,
}

/// `skiff secrets-encrypt reencrypt`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ReencryptReport {
    pub provider: String,
    pub key: Option<String>,
    /// Secrets rewritten.
    pub secrets: usize,
    /// History up to this revision was erased from the store's files.
    pub erased_to: Revision,
}

/// `skiff secrets-encrypt rotate-keys`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct RotateReport {
    pub config: String,
    pub provider: String,
    pub key: String,
    pub reencrypt: ReencryptReport,
}

/// Refused: the configuration is the operator's.
#[derive(Debug, thiserror::Error)]
#[error(
    "the encryption configuration {0} was given with --encryption-provider-config, so skiff does not edit it: put a new key first in its provider's keys (keep the old ones after it, to decrypt), restart the server, then run `skiff secrets-encrypt reencrypt`"
)]
pub struct GivenConfig(String);

/// Secrets' encryption at rest on a running server.
pub struct Encryption {
    source: Source,
    inner: Arc<dyn Store>,
    transformer: SharedTransformer,
    /// One rotation or re-encryption at a time.
    busy: tokio::sync::Mutex<()>,
}

impl Encryption {
    /// Wraps `inner`: the returned store is the one the server uses.
    pub fn wrap(loaded: Loaded, inner: Arc<dyn Store>) -> (Arc<Encryption>, Arc<dyn Store>) {
        let transformer = Arc::new(RwLock::new(Arc::new(loaded.transformer)));
        let store = Arc::new(EncryptedStore {
            inner: inner.clone(),
            transformer: transformer.clone(),
        });
        let encryption = Arc::new(Encryption {
            source: loaded.source,
            inner,
            transformer,
            busy: tokio::sync::Mutex::new(()),
        });
        (encryption, store)
    }

    pub fn source(&self) -> &Source {
        &self.source
    }

    fn current(&self) -> Arc<Transformer> {
        self.transformer.read().clone()
    }

    /// The active provider and key, and the Secrets stored under each key.
    pub async fn status(&self) -> anyhow::Result<StatusReport> {
        let t = self.current();
        let listed = self.inner.list(SECRETS_PREFIX, ListOptions::default()).await?;
        let mut counts: BTreeMap<Slot, usize> = BTreeMap::new();
        for kv in &listed.items {
            *counts.entry(t.classify(&kv.value)).or_default() += 1;
        }
        let (active_provider, active_key) = t.writer();
        let keys = t
            .slots()
            .into_iter()
            .map(|slot| KeyCount {
                secrets: counts.remove(&slot).unwrap_or(0),
                active: slot.0 == active_provider && slot.1 == active_key,
                provider: slot.0,
                key: slot.1,
            })
            .collect();
        let unreadable = counts
            .into_iter()
            .map(|((provider, key), secrets)| KeyCount {
                provider,
                key,
                secrets,
                active: false,
            })
            .collect();
        Ok(StatusReport {
            config: self.source.path().display().to_string(),
            generated: matches!(self.source, Source::Generated(_)),
            active_provider,
            active_key,
            keys,
            unreadable,
        })
    }

    /// Rewrites every Secret with the first provider, then erases the store's history up to
    /// that point (old revisions, which hold the old values, and their copies on disk).
    pub async fn reencrypt(&self) -> anyhow::Result<ReencryptReport> {
        let _busy = self.busy.lock().await;
        self.reencrypt_locked().await
    }

    async fn reencrypt_locked(&self) -> anyhow::Result<ReencryptReport> {
        let listed = self.inner.list(SECRETS_PREFIX, ListOptions::default()).await?;
        // Many at once, so that the store commits them in a few transactions.
        let results: Vec<anyhow::Result<bool>> = futures::stream::iter(listed.items)
            .map(|kv| self.rewrite(kv))
            .buffer_unordered(32)
            .collect()
            .await;
        let mut secrets = 0;
        for result in results {
            secrets += usize::from(result?);
        }
        let erased_to = self.inner.current_revision().await?;
        self.inner
            .erase_history(erased_to)
            .await
            .context("erasing the store's history")?;
        let (provider, key) = self.current().writer();
        let key_name = key.as_deref().unwrap_or("-");
        tracing::info!(secrets, %provider, key = key_name, erased_to, "re-encrypted Secrets");
        Ok(ReencryptReport {
            provider,
            key,
            secrets,
            erased_to,
        })
    }

    /// Rewrites one Secret with the current transformer; false when it is gone.
    async fn rewrite(&self, mut kv: KeyValue) -> anyhow::Result<bool> {
        loop {
            let t = self.current();
            let plain = t
                .decrypt(&kv.key, &kv.value)
                .map_err(|e| anyhow::anyhow!("decrypting {}: {e}", kv.key))?;
            let sealed = t.encrypt(&kv.key, &plain)?;
            match self.inner.update(&kv.key, sealed, kv.mod_revision).await {
                Ok(_) => return Ok(true),
                Err(StoreError::NotFound(_)) => return Ok(false),
                // Written since it was listed: rewrite what is there now.
                Err(StoreError::Conflict { .. }) => match self.inner.get(&kv.key).await? {
                    Some(now) => kv = now,
                    None => return Ok(false),
                },
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// A new key first in the generated configuration (the old ones stay, to decrypt), in use
    /// at once, then every Secret re-encrypted with it.
    pub async fn rotate_keys(&self) -> anyhow::Result<RotateReport> {
        let path = match &self.source {
            Source::Generated(path) => path.clone(),
            Source::Given(path) => return Err(GivenConfig(path.display().to_string()).into()),
        };
        let _busy = self.busy.lock().await;
        let mut config = load_config(&path)?;
        let (provider, key) = add_key(&mut config)?;
        let transformer = build_transformer(&config)?;
        // On disk before any value is written with the key.
        write_config(&path, &config).with_context(|| format!("writing {}", path.display()))?;
        *self.transformer.write() = Arc::new(transformer);
        tracing::info!(provider, %key, config = %path.display(), "rotated the encryption key");
        let reencrypt = self.reencrypt_locked().await?;
        Ok(RotateReport {
            config: path.display().to_string(),
            provider: provider.to_string(),
            key,
            reencrypt,
        })
    }

    /// At start-up on a store other API servers share: a configuration generated just now
    /// while the store holds Secrets it cannot read means this server did not get the
    /// cluster's; it refuses to start rather than serve (and write) Secrets the others cannot read.
    pub async fn check_shared(&self, generated_now: bool, data_dir: &std::path::Path) -> anyhow::Result<()> {
        if !generated_now {
            return Ok(());
        }
        // Decrypted, not classified by key name: a generated key has the same name as the
        // cluster's (`key-1`) and other bytes.
        let t = self.current();
        let listed = self.inner.list(SECRETS_PREFIX, ListOptions::default()).await?;
        let unreadable = listed
            .items
            .iter()
            .filter(|kv| t.decrypt(&kv.key, &kv.value).is_err())
            .count();
        if unreadable > 0 {
            // Nothing was written with it: the next start generates it again, or finds the
            // one copied in its place.
            if let Source::Generated(path) = &self.source {
                let _ = std::fs::remove_file(path);
            }
            anyhow::bail!(
                "{unreadable} Secrets in the shared store are encrypted with keys the encryption configuration \
                 just generated ({}) does not hold: copy encryption-config.yaml (and pki/) from a running server \
                 into {} before starting this one",
                self.source.path().display(),
                data_dir.display()
            );
        }
        Ok(())
    }

    /// At start-up: warns of Secrets no provider can read; re-encrypts the Secrets of a data
    /// dir that had them before its configuration was generated (stored as they are).
    pub async fn start(&self, generated_now: bool) -> anyhow::Result<()> {
        let status = self.status().await?;
        tracing::info!(
            config = %status.config,
            provider = %status.active_provider,
            key = status.active_key.as_deref().unwrap_or("-"),
            "encryption at rest of Secrets"
        );
        for u in &status.unreadable {
            tracing::warn!(
                secrets = u.secrets,
                provider = %u.provider,
                key = u.key.as_deref().unwrap_or("-"),
                config = %status.config,
                "Secrets stored with a provider or key the encryption configuration does not list cannot be read"
            );
        }
        let plain = status
            .keys
            .iter()
            .find(|k| k.provider == "identity")
            .map_or(0, |k| k.secrets);
        if generated_now && plain > 0 {
            tracing::info!(
                secrets = plain,
                "encrypting the Secrets stored before encryption was on"
            );
            self.reencrypt().await?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// The API: `/skiff/secrets-encrypt/{status,rotate-keys,reencrypt}`.

/// Where the operations are served, under the API server.
pub const API_PATH: &str = "/skiff/secrets-encrypt/";

/// Serves one operation for a caller the authorizer chain allowed the path.
pub async fn serve(state: &ApiState, method: &Method, path: &str, op: &str) -> Response {
    use crate::body::{error_response, value_response};
    let expected = match op {
        "status" => Method::GET,
        "rotate-keys" | "reencrypt" => Method::POST,
        _ => {
            return error_response(&StatusError::new(
                404,
                "NotFound",
                "the server could not find the requested resource",
            ));
        }
    };
    if *method != expected {
        return error_response(&StatusError::method_not_allowed(format!(
            "{path} accepts only {expected}"
        )));
    }
    let Some(encryption) = &state.encryption else {
        return error_response(&StatusError::new(
            404,
            "NotFound",
            "encryption at rest is not configured on this server",
        ));
    };
    let result = match op {
        "status" => encryption.status().await.map(serde_json::to_value),
        "rotate-keys" => encryption.rotate_keys().await.map(serde_json::to_value),
        _ => encryption.reencrypt().await.map(serde_json::to_value),
    };
    match result {
        Ok(Ok(report)) => value_response(StatusCode::OK, &report),
        Ok(Err(e)) => error_response(&StatusError::internal(e.to_string())),
        Err(e) if e.is::<GivenConfig>() => error_response(&StatusError::new(409, "Conflict", e.to_string())),
        Err(e) => {
            tracing::warn!(error = format!("{e:#}"), op, "secrets-encrypt failed");
            error_response(&StatusError::internal(format!("{e:#}")))
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The command line (`skiff secrets-encrypt`): requests and what is printed.

/// An operation of `skiff secrets-encrypt`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Status,
    RotateKeys,
    Reencrypt,
}

/// Asks the server for `command` and renders its answer.
pub async fn request(client: kube::Client, command: Command) -> anyhow::Result<String> {
    Ok(match command {
        Command::Status => render_status(&call(&client, Method::GET, "status").await?),
        Command::RotateKeys => render_rotate(&call(&client, Method::POST, "rotate-keys").await?),
        Command::Reencrypt => render_reencrypt(&call(&client, Method::POST, "reencrypt").await?),
    })
}

async fn call<T: serde::de::DeserializeOwned>(client: &kube::Client, method: Method, op: &str) -> anyhow::Result<T> {
    let req = http::Request::builder()
        .method(method)
        .uri(format!("{API_PATH}{op}"))
        .body(Vec::new())
        .context("building the request")?;
    client.request::<T>(req).await.map_err(|e| match e {
        kube::Error::Api(status) => anyhow::anyhow!("{}", status.message),
        e => anyhow::Error::new(e).context(format!("calling {API_PATH}{op}")),
    })
}

fn key_label(provider: &str, key: &Option<String>) -> String {
    match key {
        Some(key) => format!("{provider} key {key}"),
        None => provider.to_string(),
    }
}

pub fn render_status(s: &StatusReport) -> String {
    let mut out = String::new();
    let encrypted = s.active_provider != "identity";
    let _ = writeln!(
        out,
        "Encryption at rest of Secrets: {}",
        if encrypted {
            "enabled"
        } else {
            "disabled (identity writes Secrets as they are)"
        }
    );
    let origin = if s.generated {
        "generated by skiff; rotate-keys replaces its active key"
    } else {
        "given with --encryption-provider-config"
    };
    let _ = writeln!(out, "Configuration: {} ({origin})", s.config);
    let _ = writeln!(out, "Active: {}", key_label(&s.active_provider, &s.active_key));
    let rows: Vec<[String; 4]> = s
        .keys
        .iter()
        .map(|k| (k, if k.active { "active" } else { "decrypt only" }))
        .chain(s.unreadable.iter().map(|k| (k, "not in the configuration: unreadable")))
        .map(|(k, note)| {
            [
                k.provider.clone(),
                k.key.clone().unwrap_or_else(|| "-".into()),
                k.secrets.to_string(),
                note.to_string(),
            ]
        })
        .collect();
    let header = ["PROVIDER", "KEY", "SECRETS", ""].map(String::from);
    let widths: Vec<usize> = (0..3)
        .map(|i| rows.iter().chain([&header]).map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    for row in [&header].into_iter().chain(&rows) {
        let line = format!(
            "{:w0$}  {:w1$}  {:>w2$}  {}",
            row[0],
            row[1],
            row[2],
            row[3],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2]
        );
        let _ = writeln!(out, "{}", line.trim_end());
    }
    out
}

pub fn render_reencrypt(r: &ReencryptReport) -> String {
    format!(
        "Re-encrypted {} Secrets with {}; store history up to revision {} erased from disk\n",
        r.secrets,
        key_label(&r.provider, &r.key),
        r.erased_to
    )
}

pub fn render_rotate(r: &RotateReport) -> String {
    format!(
        "New {} key {} first in {} (the previous keys stay, to decrypt)\n{}",
        r.provider,
        r.key,
        r.config,
        render_reencrypt(&r.reencrypt)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_store::MemoryStore;

    const KEY16: &str = "AAECAwQFBgcICQoLDA0ODw==";
    const KEY24: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYX";
    const KEY32: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
    const PLAIN: &[u8] = br#"{"kind":"Secret","data":{"password":"aHVudGVyMg=="}}"#;
    const AT: &str = "/registry/secrets/default/s";

    fn parse(yaml: &str) -> std::result::Result<EncryptionConfiguration, String> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, yaml).unwrap();
        load_config(&path).map_err(|e| e.to_string())
    }

    fn err(yaml: &str) -> String {
        parse(yaml).expect_err("the configuration is refused")
    }

    fn config(providers: &str) -> String {
        format!(
            "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n  - resources: [secrets]\n    providers:\n{providers}"
        )
    }

    fn transformer(providers: &str) -> Transformer {
        build_transformer(&parse(&config(providers)).unwrap()).unwrap()
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn parses_upstreams_format() {
        let c = parse(&config(&format!(
            "      - aesgcm:\n          keys:\n            - name: k1\n              secret: {KEY32}\n            - name: k2\n              secret: {KEY16}\n      - secretbox:\n          keys:\n            - name: sb\n              secret: {KEY32}\n      - identity: {{}}\n"
        )))
        .unwrap();
        assert_eq!(c.resources[0].resources, ["secrets"]);
        let p = &c.resources[0].providers;
        assert_eq!(p.len(), 3);
        assert_eq!(p[0].aesgcm.as_ref().unwrap().keys[1].name, "k2");
        assert_eq!(p[1].secretbox.as_ref().unwrap().keys[0].secret, KEY32);
        assert!(p[2].identity.is_some());
        let t = build_transformer(&c).unwrap();
        assert_eq!(t.writer(), ("aesgcm".into(), Some("k1".into())));
        let slots: Vec<Slot> = vec![
            ("aesgcm".into(), Some("k1".into())),
            ("aesgcm".into(), Some("k2".into())),
            ("secretbox".into(), Some("sb".into())),
            ("identity".into(), None),
        ];
        assert_eq!(t.slots(), slots);
    }

    #[test]
    fn file_and_decoding_errors_are_upstreams() {
        let e = load_config(Path::new("/nonexistent/enc.yaml")).unwrap_err().to_string();
        assert!(
            e.starts_with("error while parsing file: error while loading file: error reading encryption provider configuration file \"/nonexistent/enc.yaml\": "),
            "{e}"
        );
        let e = err("");
        assert!(
            e.starts_with(
                "error while parsing file: error while loading file: encryption provider configuration file \""
            ),
            "{e}"
        );
        assert!(e.ends_with("\" is empty"), "{e}");
        let decoding = "error while parsing file: error decoding encryption provider configuration file \"";
        for (yaml, detail) in [
            ("resources: [", "error converting YAML to JSON: "),
            (
                "apiVersion: apiserver.config.k8s.io/v1\nresources: []\n",
                "Object 'Kind' is missing",
            ),
            ("kind: EncryptionConfiguration\n", "Object 'apiVersion' is missing"),
            (
                "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfigurations\n",
                "no kind \"EncryptionConfigurations\" is registered for version \"apiserver.config.k8s.io/v1\"",
            ),
            (
                "apiVersion: apiserver.config.k8s.io/v1alpha1\nkind: EncryptionConfiguration\n",
                "no kind \"EncryptionConfiguration\" is registered for version \"apiserver.config.k8s.io/v1alpha1\"",
            ),
            (
                &config("      - identity: {}\n        aesgmc: {}\n"),
                "strict decoding error: unknown field \"resources[0].providers[0].aesgmc\"",
            ),
            (
                &config(&format!(
                    "      - secretbox:\n          keys:\n            - name: a\n              secret: {KEY32}\n              size: 32\n"
                )),
                "strict decoding error: unknown field \"resources[0].providers[0].secretbox.keys[0].size\"",
            ),
            (
                "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources: secrets\n",
                "invalid type",
            ),
        ] {
            let e = err(yaml);
            assert!(e.starts_with(decoding), "{e}");
            assert!(e.contains(&format!("\": {detail}")), "{yaml}: {e}");
        }
    }

    #[test]
    fn validation_errors_are_upstreams() {
        let p = "error while parsing file: ";
        let key = |provider: &str, name: &str, secret: &str| {
            config(&format!(
                "      - {provider}:\n          keys:\n            - name: {name:?}\n              secret: {secret:?}\n"
            ))
        };
        for (yaml, expected) in [
            (
                "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\n".to_string(),
                "resources: Required value: at least one resources is required".to_string(),
            ),
            (
                "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n  - resources: [secrets]\n".into(),
                "resources[0].providers: Required value: at least one resources[0].providers is required".into(),
            ),
            (
                "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n  - providers: [{identity: {}}]\n".into(),
                "resources[0].resources: Required value: at least one resources[0].resources is required".into(),
            ),
            (
                config("      - {}\n"),
                "resources[0].providers[0]: Invalid value: {}: provider does not contain any of the expected providers: KMS, AESGCM, AESCBC, Secretbox, Identity".into(),
            ),
            (
                config("      - identity: {}\n        aesgcm: {keys: []}\n"),
                "[resources[0].providers[0]: Invalid value: {\"aesgcm\":{\"keys\":[]},\"identity\":{}}: more than one provider specified in a single element, should split into different list elements, resources[0].providers[0].aesgcm.keys: Required value: at least one keys is required]".into(),
            ),
            (
                config("      - secretbox: {}\n"),
                "resources[0].providers[0].secretbox.keys: Required value: at least one keys is required".into(),
            ),
            (
                key("aesgcm", "", KEY32),
                "resources[0].providers[0].aesgcm.keys[0].name: Required value: name is a mandatory field for a key".into(),
            ),
            (
                key("aesgcm", "k", ""),
                "resources[0].providers[0].aesgcm.keys[0].secret: Required value: secret is a mandatory field for a key".into(),
            ),
            (
                key("aesgcm", "k", "not base64!"),
                "resources[0].providers[0].aesgcm.keys[0].secret: Invalid value: \"REDACTED\": secrets must be base64 encoded".into(),
            ),
            (
                key("aesgcm", "k", "AAECAwQFBgc="),
                "resources[0].providers[0].aesgcm.keys[0].secret: Invalid value: \"REDACTED\": secret is not of the expected length, got 8, expected one of [16 24 32]".into(),
            ),
            (
                key("secretbox", "k", KEY16),
                "resources[0].providers[0].secretbox.keys[0].secret: Invalid value: \"REDACTED\": secret is not of the expected length, got 16, expected one of [32]".into(),
            ),
        ] {
            assert_eq!(err(&yaml), format!("{p}{expected}"), "{yaml}");
        }
        let resources = |list: &str| {
            format!(
                "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n  - resources: {list}\n    providers: [{{identity: {{}}}}]\n"
            )
        };
        for (list, expected) in [
            (
                "[Secrets]",
                "resources[0].resources[0]: Invalid value: \"Secrets\": resource name should not contain capital letters",
            ),
            (
                "['*']",
                "resources[0].resources[0]: Invalid value: \"*\": use '*.' to encrypt all the resources from core API group or *.* to encrypt all resources",
            ),
            (
                "[serviceipallocations]",
                "resources[0].resources[0]: Invalid value: \"serviceipallocations\": resources which do not have REST API/s cannot be encrypted",
            ),
            (
                "[events.events.k8s.io]",
                "resources[0].resources[0]: Invalid value: \"events.events.k8s.io\": '*.events.k8s.io' objects are stored using the 'events' API group in etcd. Use 'events' instead in the config file",
            ),
            (
                "[deployments.extensions]",
                "resources[0].resources[0]: Invalid value: \"deployments.extensions\": 'extensions' group has been removed and cannot be used for encryption",
            ),
            (
                "['secrets.*']",
                "resources[0].resources[0]: Invalid value: \"secrets.*\": encrypting the same resource across groups is not supported",
            ),
            (
                "[secrets, secrets]",
                "resources[0].resources: Invalid value: [\"secrets\",\"secrets\"]: the same resource cannot be specified multiple times",
            ),
            (
                "[secrets, '*.']",
                "resources[0].resources: Invalid value: [\"secrets\",\"*.\"]: using overlapping resources such as 'secrets' and '*.' in the same resource list is not allowed as they will be masked",
            ),
        ] {
            assert_eq!(err(&resources(list)), format!("{p}{expected}"), "{list}");
        }
    }

    #[test]
    fn what_skiff_does_not_implement_is_refused_at_start() {
        let build = |yaml: &str| build_transformer(&parse(yaml).unwrap()).err().unwrap().to_string();
        let e = build(&config(&format!(
            "      - aescbc:\n          keys:\n            - name: k\n              secret: {KEY32}\n"
        )));
        assert!(
            e.starts_with("error while building transformers: the aescbc provider is not supported by skiff"),
            "{e}"
        );
        let e = build(&config(
            "      - kms:\n          apiVersion: v2\n          name: vault\n          endpoint: unix:///kms.sock\n",
        ));
        assert!(
            e.starts_with("error while building transformers: the kms provider is not supported by skiff"),
            "{e}"
        );
        let e = build(
            "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n  - resources: [secrets, configmaps]\n    providers: [{identity: {}}]\n",
        );
        assert_eq!(
            e,
            "error while building transformers: resource \"configmaps\": skiff encrypts only \"secrets\" at rest (list only secrets in resources)"
        );
        // "secrets." is the core group's secrets too.
        let c = parse("apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n  - resources: [secrets.]\n    providers: [{identity: {}}]\n").unwrap();
        assert!(build_transformer(&c).is_ok());
    }

    #[test]
    fn aesgcm_round_trip_and_prefix() {
        for secret in [KEY16, KEY24, KEY32] {
            let t = transformer(&format!(
                "      - aesgcm:\n          keys:\n            - name: k1\n              secret: {secret}\n"
            ));
            let stored = t.encrypt(AT, PLAIN).unwrap();
            let prefix = b"k8s:enc:aesgcm:v1:k1:";
            assert!(stored.starts_with(prefix));
            // Nonce (12), ciphertext, tag (16).
            assert_eq!(stored.len(), prefix.len() + 12 + PLAIN.len() + 16);
            assert!(!stored.windows(8).any(|w| w == b"password"));
            assert_eq!(t.decrypt(AT, &stored).unwrap(), PLAIN);
            // Random nonces: the same value never encrypts the same way twice.
            assert_ne!(t.encrypt(AT, PLAIN).unwrap(), stored);
            // The storage key is authenticated: a value moved to another key does not read.
            assert_eq!(
                t.decrypt("/registry/secrets/default/other", &stored).unwrap_err(),
                "cipher: message authentication failed"
            );
            let mut tampered = stored.clone();
            *tampered.last_mut().unwrap() ^= 1;
            assert!(t.decrypt(AT, &tampered).is_err());
        }
    }

    #[test]
    fn secretbox_round_trip_and_prefix() {
        let t = transformer(&format!(
            "      - secretbox:\n          keys:\n            - name: sb\n              secret: {KEY32}\n"
        ));
        let stored = t.encrypt(AT, PLAIN).unwrap();
        let prefix = b"k8s:enc:secretbox:v1:sb:";
        assert!(stored.starts_with(prefix));
        // Nonce (24), tag (16), ciphertext.
        assert_eq!(stored.len(), prefix.len() + 24 + 16 + PLAIN.len());
        assert_eq!(t.decrypt(AT, &stored).unwrap(), PLAIN);
        assert_ne!(t.encrypt(AT, PLAIN).unwrap(), stored);
        let mut short = prefix.to_vec();
        short.extend_from_slice(&[0; 30]);
        assert_eq!(
            t.decrypt(AT, &short).unwrap_err(),
            "the stored data was shorter than the required size"
        );
    }

    /// Values as upstream writes them (produced with OpenSSL's AES-GCM and libsodium's
    /// secretbox, nonces fixed) read back: the stored format is upstream's byte for byte.
    #[test]
    fn reads_values_in_upstreams_format() {
        let vectors = [
            (
                KEY16,
                "aesgcm",
                "a0a1a2a3a4a5a6a7a8a9aaabd1a453d210ed1130a82bd0633477c4427fcc4769f7761f955e3201fa31fef8c7e8c7670b2d8ba43b0abaa592d6966eed817631341e9151014529bc0f03486edc1da58b54",
            ),
            (
                KEY24,
                "aesgcm",
                "a0a1a2a3a4a5a6a7a8a9aaab4040d50b97373a49dc66daa29db8805bb8354f73e9536ce3e9ae5a8a05c1cf54f93ae696fa0715c2741c92e78d07d7285d0966ed4c2f61ffd6fd659bd9d5794c79dcff1e",
            ),
            (
                KEY32,
                "aesgcm",
                "a0a1a2a3a4a5a6a7a8a9aaab9d3a17442baf20854036e2b0751fb4fc5c8e3d71e6d66056e72c56e70cd8026ea01265c58d431b6b2af8439e7037e4c47a393b35ec7a310e0c1c8b2d56dd426c21f7bc30",
            ),
            (
                KEY32,
                "secretbox",
                "b0b1b2b3b4b5b6b7b8b9babbbcbdbebfc0c1c2c3c4c5c6c71a4d584be53cbb6124b2f2f4abd43c96627695fc10cc931dc811e6af4381aced8c72dc8a834f01651def020b69a070d75e037c5cac858b6e8724bcdf292d008198f042e0",
            ),
        ];
        for (secret, provider, body) in vectors {
            let t = transformer(&format!(
                "      - {provider}:\n          keys:\n            - name: key1\n              secret: {secret}\n"
            ));
            let mut stored = format!("k8s:enc:{provider}:v1:key1:").into_bytes();
            stored.extend(hex(body));
            assert_eq!(t.decrypt(AT, &stored).unwrap(), PLAIN, "{provider} {secret}");
        }
    }

    #[test]
    fn identity_and_prefix_selection() {
        let t = transformer("      - identity: {}\n");
        assert_eq!(t.encrypt(AT, PLAIN).unwrap(), PLAIN);
        assert_eq!(t.decrypt(AT, PLAIN).unwrap(), PLAIN);
        // identity does not read encrypted data, and nothing else here can.
        assert_eq!(
            t.decrypt(AT, b"k8s:enc:secretbox:v1:sb:xxxx").unwrap_err(),
            "no matching prefix found"
        );
        // Reading picks the provider by prefix, whatever the order; identity takes the rest.
        let sb = transformer(&format!(
            "      - secretbox:\n          keys:\n            - name: sb\n              secret: {KEY32}\n"
        ));
        let sealed = sb.encrypt(AT, PLAIN).unwrap();
        let both = transformer(&format!(
            "      - identity: {{}}\n      - secretbox:\n          keys:\n            - name: sb\n              secret: {KEY32}\n"
        ));
        assert_eq!(both.decrypt(AT, &sealed).unwrap(), PLAIN);
        assert_eq!(both.decrypt(AT, PLAIN).unwrap(), PLAIN);
        assert_eq!(both.encrypt(AT, PLAIN).unwrap(), PLAIN);
        // Without identity, plain data has no provider.
        assert_eq!(sb.decrypt(AT, PLAIN).unwrap_err(), "no matching prefix found");
        // A key the configuration does not list.
        let other = transformer(&format!(
            "      - secretbox:\n          keys:\n            - name: other\n              secret: {KEY32}\n"
        ));
        assert_eq!(
            other.decrypt(AT, &sealed).unwrap_err(),
            "no matching key was found for the provided Secretbox transformer"
        );
        assert_eq!(other.classify(&sealed), ("secretbox".into(), Some("sb".into())));
        assert_eq!(other.classify(PLAIN), ("identity".into(), None));
        assert_eq!(
            other.classify(b"k8s:enc:kms:v2:vault:..."),
            ("kms".into(), Some("vault".into()))
        );
    }

    #[test]
    fn rotation_keeps_old_keys_to_decrypt() {
        let dir = tempfile::tempdir().unwrap();
        let loaded = load(dir.path(), None).unwrap();
        assert!(loaded.generated_now);
        let path = dir.path().join(GENERATED_CONFIG);
        assert_eq!(loaded.source, Source::Generated(path.clone()));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let first = loaded.transformer;
        assert_eq!(first.writer(), ("secretbox".into(), Some("key-1".into())));
        // A data dir that does not exist yet (start_with_store before anything else wrote to it).
        assert!(load(&dir.path().join("not/yet"), None).unwrap().generated_now);
        let old = first.encrypt(AT, PLAIN).unwrap();

        let mut cfg = load_config(&path).unwrap();
        assert_eq!(add_key(&mut cfg).unwrap(), ("secretbox", "key-2".to_string()));
        write_config(&path, &cfg).unwrap();
        // The file reads back as it was written, and a second start keeps it.
        assert_eq!(load_config(&path).unwrap(), cfg);
        let again = load(dir.path(), None).unwrap();
        assert!(!again.generated_now);
        let rotated = again.transformer;
        assert_eq!(rotated.writer(), ("secretbox".into(), Some("key-2".into())));
        assert_eq!(rotated.decrypt(AT, &old).unwrap(), PLAIN);
        let new = rotated.encrypt(AT, PLAIN).unwrap();
        assert!(new.starts_with(b"k8s:enc:secretbox:v1:key-2:"));
        assert!(first.decrypt(AT, &new).is_err());
        let slots: Vec<Slot> = vec![
            ("secretbox".into(), Some("key-2".into())),
            ("secretbox".into(), Some("key-1".into())),
            ("identity".into(), None),
        ];
        assert_eq!(rotated.slots(), slots);

        // An identity-first configuration gets a secretbox provider in front.
        let mut plain = parse(&config("      - identity: {}\n")).unwrap();
        assert_eq!(add_key(&mut plain).unwrap(), ("secretbox", "key-1".to_string()));
        assert!(plain.resources[0].providers[0].secretbox.is_some());
        assert!(plain.resources[0].providers[1].identity.is_some());
        // An aesgcm-first one gets a 32-byte AES key.
        let mut aes = parse(&config(&format!(
            "      - aesgcm:\n          keys:\n            - name: key-7\n              secret: {KEY16}\n"
        )))
        .unwrap();
        assert_eq!(add_key(&mut aes).unwrap(), ("aesgcm", "key-8".to_string()));
        let t = build_transformer(&aes).unwrap();
        assert!(t.encrypt(AT, PLAIN).unwrap().starts_with(b"k8s:enc:aesgcm:v1:key-8:"));
    }

    #[test]
    fn a_given_configuration_is_used_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let given = dir.path().join("mine.yaml");
        std::fs::write(&given, config("      - identity: {}\n")).unwrap();
        let loaded = load(dir.path(), Some(&given)).unwrap();
        assert_eq!(loaded.source, Source::Given(given));
        assert!(!dir.path().join(GENERATED_CONFIG).exists());
        std::fs::write(dir.path().join("bad.yaml"), "").unwrap();
        assert!(load(dir.path(), Some(&dir.path().join("bad.yaml"))).is_err());
    }

    fn wrapped(providers: &str) -> (Arc<Encryption>, Arc<dyn Store>, Arc<dyn Store>) {
        let inner: Arc<dyn Store> = MemoryStore::new();
        let loaded = Loaded {
            source: Source::Given(PathBuf::from("/given.yaml")),
            transformer: transformer(providers),
            generated_now: false,
        };
        let (encryption, store) = Encryption::wrap(loaded, inner.clone());
        (encryption, store, inner)
    }

    fn secretbox(name: &str) -> String {
        format!("      - secretbox:\n          keys:\n            - name: {name}\n              secret: {KEY32}\n")
    }

    #[tokio::test]
    async fn the_store_sees_only_ciphertext_for_secrets() {
        let (_, store, inner) = wrapped(&secretbox("sb"));
        let mut watch = store.watch("/registry/", 0).await.unwrap();
        let kv = store.create(AT, PLAIN.to_vec()).await.unwrap();
        assert_eq!(&kv.value[..], PLAIN);
        let raw = inner.get(AT).await.unwrap().unwrap();
        assert!(raw.value.starts_with(b"k8s:enc:secretbox:v1:sb:"));
        // Other resources are stored as they are.
        let pod = b"{\"kind\":\"Pod\"}".to_vec();
        store.create("/registry/pods/default/p", pod.clone()).await.unwrap();
        assert_eq!(
            &inner.get("/registry/pods/default/p").await.unwrap().unwrap().value[..],
            &pod[..]
        );
        assert_eq!(&store.get(AT).await.unwrap().unwrap().value[..], PLAIN);
        let updated = store.update(AT, b"v2".to_vec(), kv.mod_revision).await.unwrap();
        assert_eq!(&updated.value[..], b"v2");
        let listed = store.list(SECRETS_PREFIX, ListOptions::default()).await.unwrap();
        assert_eq!(&listed.items[0].value[..], b"v2");
        let all = store.list("", ListOptions::default()).await.unwrap();
        assert_eq!(all.items.len(), 2);
        assert!(all.items.iter().all(|kv| !kv.value.starts_with(ENCRYPTED)));
        // Transactions: creates and updates sealed, what comes back plain.
        let other = "/registry/secrets/default/t";
        let kvs = store
            .txn(vec![
                Op::Create {
                    key: other.into(),
                    value: b"t1".to_vec(),
                },
                Op::Update {
                    key: AT.into(),
                    value: b"v3".to_vec(),
                    expected: updated.mod_revision,
                },
            ])
            .await
            .unwrap();
        assert_eq!((&kvs[0].value[..], &kvs[1].value[..]), (&b"t1"[..], &b"v3"[..]));
        assert!(inner.get(other).await.unwrap().unwrap().value.starts_with(ENCRYPTED));
        let kvs = store
            .txn(vec![Op::Delete {
                key: other.into(),
                expected: None,
            }])
            .await
            .unwrap();
        assert_eq!(&kvs[0].value[..], b"t1");
        let deleted = store.delete(AT, None).await.unwrap();
        assert_eq!(&deleted.value[..], b"v3");
        // Watchers see plain values, previous ones included.
        let mut seen = Vec::new();
        for _ in 0..7 {
            let event = tokio::time::timeout(std::time::Duration::from_secs(5), watch.next())
                .await
                .unwrap()
                .unwrap();
            seen.push(match event {
                Event::Put { kv, prev } => format!(
                    "put {} {} (was {:?})",
                    kv.key,
                    String::from_utf8_lossy(&kv.value),
                    prev.map(|p| String::from_utf8_lossy(&p.value).into_owned())
                ),
                Event::Delete { prev, .. } => format!("delete {} {}", prev.key, String::from_utf8_lossy(&prev.value)),
            });
        }
        let plain = String::from_utf8_lossy(PLAIN).into_owned();
        assert_eq!(
            seen,
            [
                format!("put {AT} {plain} (was None)"),
                "put /registry/pods/default/p {\"kind\":\"Pod\"} (was None)".to_string(),
                format!("put {AT} v2 (was Some({plain:?}))"),
                "put /registry/secrets/default/t t1 (was None)".into(),
                format!("put {AT} v3 (was Some(\"v2\"))"),
                "delete /registry/secrets/default/t t1".into(),
                format!("delete {AT} v3"),
            ]
        );
    }

    #[tokio::test]
    async fn reencrypt_moves_every_secret_to_the_first_provider() {
        // Secrets written while identity came first...
        let (_, store, inner) = wrapped("      - identity: {}\n");
        for i in 0..40 {
            store
                .create(&format!("/registry/secrets/ns/s{i}"), format!("v{i}").into_bytes())
                .await
                .unwrap();
        }
        // ...then secretbox first, identity still there to read them.
        let loaded = Loaded {
            source: Source::Given(PathBuf::from("/given.yaml")),
            transformer: transformer(&format!("{}      - identity: {{}}\n", secretbox("sb"))),
            generated_now: false,
        };
        let (encryption, store) = Encryption::wrap(loaded, inner.clone());
        let status = encryption.status().await.unwrap();
        assert_eq!(status.keys[0].secrets, 0);
        assert_eq!(
            (status.keys[1].provider.as_str(), status.keys[1].secrets),
            ("identity", 40)
        );
        let report = encryption.reencrypt().await.unwrap();
        assert_eq!(report.secrets, 40);
        assert_eq!(report.erased_to, 80);
        assert_eq!(inner.compacted_revision().await.unwrap(), 80);
        let status = encryption.status().await.unwrap();
        assert_eq!(
            status.keys,
            [
                KeyCount {
                    provider: "secretbox".into(),
                    key: Some("sb".into()),
                    secrets: 40,
                    active: true
                },
                KeyCount {
                    provider: "identity".into(),
                    key: None,
                    secrets: 0,
                    active: false
                }
            ]
        );
        assert_eq!(
            &store.get("/registry/secrets/ns/s7").await.unwrap().unwrap().value[..],
            b"v7"
        );
        // A given configuration is not edited.
        let e = encryption.rotate_keys().await.unwrap_err();
        assert!(e.is::<GivenConfig>());
        assert!(
            e.to_string().contains("was given with --encryption-provider-config"),
            "{e}"
        );
        let text = render_status(&status);
        assert!(text.contains("Active: secretbox key sb"), "{text}");
        assert!(text.contains("given with --encryption-provider-config"), "{text}");
    }

    #[tokio::test]
    async fn rotate_keys_writes_the_new_key_and_reencrypts() {
        let dir = tempfile::tempdir().unwrap();
        let inner: Arc<dyn Store> = MemoryStore::new();
        let (encryption, store) = Encryption::wrap(load(dir.path(), None).unwrap(), inner.clone());
        store.create(AT, PLAIN.to_vec()).await.unwrap();
        assert!(
            inner
                .get(AT)
                .await
                .unwrap()
                .unwrap()
                .value
                .starts_with(b"k8s:enc:secretbox:v1:key-1:")
        );
        let report = encryption.rotate_keys().await.unwrap();
        assert_eq!((report.provider.as_str(), report.key.as_str()), ("secretbox", "key-2"));
        assert_eq!(report.reencrypt.secrets, 1);
        assert!(
            inner
                .get(AT)
                .await
                .unwrap()
                .unwrap()
                .value
                .starts_with(b"k8s:enc:secretbox:v1:key-2:")
        );
        assert_eq!(&store.get(AT).await.unwrap().unwrap().value[..], PLAIN);
        // The next start reads the rotated file.
        let again = load(dir.path(), None).unwrap();
        assert_eq!(again.transformer.writer(), ("secretbox".into(), Some("key-2".into())));
        let status = encryption.status().await.unwrap();
        let counts: Vec<_> = status
            .keys
            .iter()
            .map(|k| (k.key.clone(), k.secrets, k.active))
            .collect();
        assert_eq!(
            counts,
            [
                (Some("key-2".into()), 1, true),
                (Some("key-1".into()), 0, false),
                (None, 0, false)
            ]
        );
        assert!(status.unreadable.is_empty());
    }

    #[tokio::test]
    async fn a_generated_configuration_encrypts_secrets_stored_before() {
        let dir = tempfile::tempdir().unwrap();
        let inner: Arc<dyn Store> = MemoryStore::new();
        inner.create(AT, PLAIN.to_vec()).await.unwrap();
        let loaded = load(dir.path(), None).unwrap();
        assert!(loaded.generated_now);
        let (encryption, _) = Encryption::wrap(loaded, inner.clone());
        encryption.start(true).await.unwrap();
        assert!(
            inner
                .get(AT)
                .await
                .unwrap()
                .unwrap()
                .value
                .starts_with(b"k8s:enc:secretbox:v1:key-1:")
        );
    }
}
