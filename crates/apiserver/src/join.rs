//! What a node needs to join with a token, made at every start (as `kubeadm init` and k3s's
//! server do):
//! - `kube-public/cluster-info`: a kubeconfig with the server's URL and the cluster CA, which
//!   anyone may read (the bootstrap policy binds `system:anonymous` to it);
//! - the server's join token, `DATA_DIR/server/token` (mode 0600, k3s's path): a bootstrap token
//!   without expiration whose Secret `kube-system/bootstrap-token-ID` is created again when
//!   missing, written as `K10<sha256 of the CA>::<id>.<secret>`
//!   (`skiff_api::bootstraptoken::JoinToken`).

use std::path::Path;

use anyhow::Context;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Value, json};
use skiff_api::bootstraptoken::{self as bt, JoinToken};
use skiff_store::StoreError;

use crate::ApiState;
use crate::objects;

/// The path of the server's join token under the data dir.
pub fn token_path(data_dir: &Path) -> std::path::PathBuf {
    data_dir.join("server").join("token")
}

/// The kubeconfig cluster-info carries: the cluster only, no user.
pub fn cluster_info_kubeconfig(server_url: &str, ca_pem: &str) -> String {
    let server = serde_json::to_string(server_url).unwrap_or_else(|_| format!("{server_url:?}"));
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: \"\"
  cluster:
    certificate-authority-data: {}
    server: {server}
contexts: []
current-context: \"\"
preferences: {{}}
users: []
",
        BASE64.encode(ca_pem)
    )
}

/// The CA and server URL of a cluster-info ConfigMap's kubeconfig.
fn cluster_info_parts(obj: &Value) -> Option<(Vec<u8>, String)> {
    let text = obj.pointer("/data/kubeconfig").and_then(Value::as_str)?;
    let kc: Value = serde_saphyr::from_str(text).ok()?;
    let cluster = kc.pointer("/clusters/0/cluster")?;
    let ca = BASE64
        .decode(cluster.get("certificate-authority-data")?.as_str()?)
        .ok()?;
    let server = cluster.get("server")?.as_str()?.to_string();
    Some((ca, server))
}

/// The CA this cluster already published, if any: `kube-public/cluster-info`'s.
async fn published_ca(state: &ApiState) -> anyhow::Result<Option<Vec<u8>>> {
    let res = skiff_api::registry::lookup("", "v1", "configmaps").context("configmaps")?;
    let key = objects::key(res, bt::CLUSTER_INFO_NAMESPACE, bt::CLUSTER_INFO_NAME);
    let Some(kv) = state.store.get(&key).await? else {
        return Ok(None);
    };
    Ok(objects::decode_kv(&kv)
        .as_ref()
        .and_then(cluster_info_parts)
        .map(|(ca, _)| ca))
}

/// On a store other API servers share: refuses to start when this server's CA is not the one
/// the cluster already published, rather than issue certificates nobody else trusts (and
/// overwrite what the other replicas serve).
pub async fn check_cluster_ca(state: &ApiState, data_dir: &Path) -> anyhow::Result<()> {
    let Some(published) = published_ca(state).await.context("reading kube-public/cluster-info")? else {
        return Ok(());
    };
    let ours = state.pki.ca_cert_pem.as_bytes();
    if published == ours {
        return Ok(());
    }
    anyhow::bail!(
        "this server's CA {} (sha256:{}) is not the cluster's (sha256:{}, published in \
         kube-public/cluster-info by the API servers sharing this store): copy DATA_DIR/pki/ and \
         encryption-config.yaml from a running server into {} before starting this one",
        data_dir.join("pki").join("ca.crt").display(),
        bt::ca_hash(ours),
        bt::ca_hash(&published),
        data_dir.display()
    )
}

/// Creates or corrects `kube-public/cluster-info`. On a shared store (`shared`) the server URL
/// already published is kept when the CA is the same: the replicas do not overwrite each
/// other's (the first one's, or an administrator's load balancer address).
pub async fn ensure_cluster_info(state: &ApiState, server_url: &str, shared: bool) -> anyhow::Result<()> {
    let res = skiff_api::registry::lookup("", "v1", "configmaps").context("configmaps")?;
    let key = objects::key(res, bt::CLUSTER_INFO_NAMESPACE, bt::CLUSTER_INFO_NAME);
    let mut kubeconfig = cluster_info_kubeconfig(server_url, &state.pki.ca_cert_pem);
    let current = state.store.get(&key).await?;
    if let Some(kv) = &current {
        let obj = objects::decode_kv(kv).unwrap_or(Value::Null);
        if shared
            && let Some((ca, server)) = cluster_info_parts(&obj)
            && ca == state.pki.ca_cert_pem.as_bytes()
        {
            kubeconfig = cluster_info_kubeconfig(&server, &state.pki.ca_cert_pem);
        }
        if obj.pointer("/data/kubeconfig").and_then(Value::as_str) == Some(kubeconfig.as_str()) {
            return Ok(());
        }
        let mut obj = obj;
        obj["data"] = json!({(bt::CLUSTER_INFO_KUBECONFIG_KEY): kubeconfig});
        return match state
            .store
            .update(&key, objects::encode_for_store(&obj), kv.mod_revision)
            .await
        {
            Ok(_) | Err(StoreError::Conflict { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        };
    }
    let obj = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": bt::CLUSTER_INFO_NAME,
            "namespace": bt::CLUSTER_INFO_NAMESPACE,
            "uid": uuid::Uuid::new_v4().to_string(),
            "creationTimestamp": objects::now_rfc3339(),
        },
        "data": {(bt::CLUSTER_INFO_KUBECONFIG_KEY): kubeconfig},
    });
    match state.store.create(&key, objects::encode_for_store(&obj)).await {
        Ok(_) | Err(StoreError::AlreadyExists(_)) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The description of the server's join token Secret.
const SERVER_TOKEN_DESCRIPTION: &str = "The server's join token (skiff server).";

/// The server join token another API server sharing the store made, if any: the oldest
/// unexpired bootstrap token Secret with the server token's description.
async fn shared_server_token(state: &ApiState) -> anyhow::Result<Option<(String, String)>> {
    let res = skiff_api::registry::lookup("", "v1", "secrets").context("secrets")?;
    let prefix = objects::key(res, bt::NAMESPACE, bt::SECRET_PREFIX);
    let listed = state.store.list(&prefix, Default::default()).await?;
    let mut found: Vec<(String, String, String)> = listed
        .items
        .iter()
        .filter_map(objects::decode_kv)
        .filter(|s| {
            bt::secret_data(s, bt::DESCRIPTION_KEY) == SERVER_TOKEN_DESCRIPTION
                && !bt::has_expired(s, jiff::Timestamp::now())
        })
        .map(|s| {
            let created = s
                .pointer("/metadata/creationTimestamp")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            (
                created,
                bt::secret_data(&s, bt::TOKEN_ID_KEY),
                bt::secret_data(&s, bt::TOKEN_SECRET_KEY),
            )
        })
        .filter(|(_, id, secret)| !id.is_empty() && !secret.is_empty())
        .collect();
    found.sort();
    Ok(found.into_iter().next().map(|(_, id, secret)| (id, secret)))
}

/// Reads (or makes, at first start) the server's join token, pins it to the current CA and
/// makes sure its Secret exists. On a shared store (`shared`) a server without a token of its
/// own takes the one another API server made, so every replica prints the same join token.
pub async fn ensure_join_token(state: &ApiState, data_dir: &Path, shared: bool) -> anyhow::Result<JoinToken> {
    let path = token_path(data_dir);
    let hash = bt::ca_hash(state.pki.ca_cert_pem.as_bytes());
    let existing = match std::fs::read_to_string(&path) {
        Ok(text) => Some(JoinToken::parse(&text).map_err(|e| anyhow::anyhow!("parsing {}: {e}", path.display()))?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let adopted = match (&existing, shared) {
        (None, true) => shared_server_token(state)
            .await
            .context("looking for the cluster's server join token")?,
        _ => None,
    };
    let token = match (existing, adopted) {
        (Some(t), _) => JoinToken { ca_hash: hash, ..t },
        (None, Some((id, secret))) => JoinToken {
            ca_hash: hash,
            id,
            secret,
        },
        (None, None) => {
            let (id, secret) = bt::generate();
            JoinToken {
                ca_hash: hash,
                id,
                secret,
            }
        }
    };
    let text = format!("{token}\n");
    if std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        crate::pki::write_file(&path, text.as_bytes(), 0o600)?;
        tracing::info!(path = %path.display(), "wrote the join token");
    }
    let res = skiff_api::registry::lookup("", "v1", "secrets").context("secrets")?;
    let name = format!("{}{}", bt::SECRET_PREFIX, token.id);
    let key = objects::key(res, bt::NAMESPACE, &name);
    if state.store.get(&key).await?.is_none() {
        let mut secret = bt::secret(&token.id, &token.secret, None, SERVER_TOKEN_DESCRIPTION, &[]);
        if let Some(md) = secret.get_mut("metadata").and_then(Value::as_object_mut) {
            md.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
            md.insert("creationTimestamp".into(), json!(objects::now_rfc3339()));
        }
        match state.store.create(&key, objects::encode_for_store(&secret)).await {
            Ok(_) | Err(StoreError::AlreadyExists(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_join_token_is_kept_and_its_secret_authenticates() {
        let dir = tempfile::tempdir().unwrap();
        let (state, _) = ApiState::for_tests(dir.path());
        let first = ensure_join_token(&state, dir.path(), false).await.unwrap();
        assert_eq!(first.ca_hash, bt::ca_hash(state.pki.ca_cert_pem.as_bytes()));
        let again = ensure_join_token(&state, dir.path(), false).await.unwrap();
        assert_eq!(first, again);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(token_path(dir.path())).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let id = crate::bootstraptoken::authenticate(&*state.store, &first.bearer(), jiff::Timestamp::now())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(id.user, format!("system:bootstrap:{}", first.id));
        ensure_cluster_info(&state, "https://10.0.0.1:6443", false)
            .await
            .unwrap();
        let res = skiff_api::registry::lookup("", "v1", "configmaps").unwrap();
        let kv = state
            .store
            .get(&objects::key(res, "kube-public", "cluster-info"))
            .await
            .unwrap()
            .unwrap();
        let cm = objects::decode_kv(&kv).unwrap();
        let text = cm["data"]["kubeconfig"].as_str().unwrap();
        let kc: Value = serde_saphyr::from_str(text).unwrap();
        assert_eq!(kc["clusters"][0]["cluster"]["server"], "https://10.0.0.1:6443");
        let ca = BASE64
            .decode(
                kc["clusters"][0]["cluster"]["certificate-authority-data"]
                    .as_str()
                    .unwrap(),
            )
            .unwrap();
        assert_eq!(bt::ca_hash(&ca), first.ca_hash);
    }
}
