//! The identities a node agent's parts act under. The node itself (`system:node:NAME`) reads
//! only what the Node authorizer relates to it: its own Node and Lease, the pods bound to it and
//! what they use, and its cluster DNS EndpointSlice. What needs a view of the whole cluster runs
//! under a service account of its own, as upstream runs kube-proxy, CoreDNS, flannel and
//! local-path-provisioner under theirs:
//! - the service proxy, cluster DNS and pod network read Services, EndpointSlices, Namespaces
//!   and Nodes as `kube-system/skiff-node-network`;
//! - the local-path provisioner reads claims, volumes and classes as
//!   `kube-system/skiff-local-path-provisioner` (its writes stay the node's, which
//!   NodeRestriction holds to its own volumes).
//!
//! An agent that calls the API server over the network asks, as its node, for each account's
//! token bound to its own Node (a TokenRequest NodeRestriction allows for these accounts and no
//! node other than the one bound): the token names the node, and stops working once the Node is
//! deleted. Tokens live an hour; each is written to `DATA_DIR/tokens/ACCOUNT` (mode 0600), which
//! its client reads again every minute, and replaced at 80% of its life, as the kubelet renews
//! projected service account tokens.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use kube::Api;
use kube::api::PostParams;
use skiff_rbac::skiff_policy::{LOCAL_PATH_PROVISIONER_SA, NODE_NETWORK_SA};

/// How long the tokens asked for live (the kubelet's projected token default).
const TOKEN_LIFETIME_SECONDS: i64 = 3600;
/// The namespace of the parts' service accounts.
const NAMESPACE: &str = "kube-system";

/// Where the parts' credentials come from.
pub enum Parts {
    /// Clients made by the caller, as for an agent in the API server's own process.
    Given {
        network: kube::Client,
        volumes: kube::Client,
    },
    /// Tokens the node asks for, used against the cluster of this configuration (whose own
    /// credentials are replaced by the token).
    Tokens(Box<kube::Config>),
}

/// The clients of the agent's parts.
#[derive(Clone)]
pub struct Clients {
    /// The service proxy, cluster DNS and pod network.
    pub network: kube::Client,
    /// The local-path provisioner's reads.
    pub volumes: kube::Client,
}

impl Parts {
    /// The parts' clients, once the node is registered as `node`; for [`Parts::Tokens`], the
    /// tokens are asked for with `node_client` (retried until the API server gives them) and
    /// renewed in tasks of their own for as long as the process runs.
    pub async fn clients(self, node_client: &kube::Client, node: &Node, data_dir: &Path) -> anyhow::Result<Clients> {
        match self {
            Parts::Given { network, volumes } => Ok(Clients { network, volumes }),
            Parts::Tokens(base) => {
                let dir = data_dir.join("tokens");
                std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
                let token_client = |account: &'static str| {
                    let token = TokenFile {
                        client: node_client.clone(),
                        account,
                        node: bound_reference(node),
                        path: dir.join(account),
                    };
                    let base = &base;
                    async move {
                        let renew_in = token.refresh_until_written().await;
                        let client = token.client(base)?;
                        tokio::spawn(token.renew(renew_in));
                        anyhow::Ok(client)
                    }
                };
                let network = token_client(NODE_NETWORK_SA).await?;
                let volumes = token_client(LOCAL_PATH_PROVISIONER_SA).await?;
                Ok(Clients { network, volumes })
            }
        }
    }
}

fn bound_reference(node: &Node) -> BoundObjectReference {
    BoundObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: node.metadata.name.clone(),
        uid: node.metadata.uid.clone(),
    }
}

/// One account's token, kept in a file.
struct TokenFile {
    client: kube::Client,
    account: &'static str,
    node: BoundObjectReference,
    path: PathBuf,
}

impl TokenFile {
    /// Asks for a token and writes it; returns when to ask again (80% of its life).
    async fn refresh(&self) -> anyhow::Result<Duration> {
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: Vec::new(),
                bound_object_ref: Some(self.node.clone()),
                expiration_seconds: Some(TOKEN_LIFETIME_SECONDS),
            },
            ..Default::default()
        };
        let issued = Api::<ServiceAccount>::namespaced(self.client.clone(), NAMESPACE)
            .create_token_request(self.account, &PostParams::default(), &request)
            .await
            .with_context(|| format!("asking for a token of {NAMESPACE}/{}", self.account))?;
        let status = issued.status.context("the TokenRequest has no status")?;
        crate::bootstrap::write_file(&self.path, status.token.as_bytes(), 0o600)?;
        let left = (status.expiration_timestamp.0.as_second() - jiff::Timestamp::now().as_second()).max(60);
        Ok(Duration::from_secs(u64::try_from(left * 4 / 5).unwrap_or(60)))
    }

    /// [`Self::refresh`] until it succeeds (the API server may not be up yet).
    async fn refresh_until_written(&self) -> Duration {
        let mut delay = Duration::from_millis(500);
        loop {
            match self.refresh().await {
                Ok(next) => return next,
                Err(e) => {
                    tracing::warn!(error = %format!("{e:#}"), account = self.account, "a token for the agent's part; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(10));
                }
            }
        }
    }

    /// A client of `base`'s cluster presenting this file's token, read again every minute.
    fn client(&self, base: &kube::Config) -> anyhow::Result<kube::Client> {
        let mut config = base.clone();
        config.auth_info = kube::config::AuthInfo {
            token_file: Some(self.path.to_string_lossy().into_owned()),
            ..Default::default()
        };
        kube::Client::try_from(config).with_context(|| format!("building the client of {}", self.account))
    }

    /// Renews the token for as long as the process runs.
    async fn renew(self, mut next: Duration) {
        loop {
            tokio::time::sleep(next).await;
            next = self.refresh_until_written().await;
            tracing::debug!(account = self.account, "renewed the token of the agent's part");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_bound_to_the_node_by_name_and_uid() {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1", "uid": "u-1"}
        }))
        .expect("a Node");
        let r = bound_reference(&node);
        assert_eq!(
            (
                r.api_version.as_deref(),
                r.kind.as_deref(),
                r.name.as_deref(),
                r.uid.as_deref()
            ),
            (Some("v1"), Some("Node"), Some("n1"), Some("u-1"))
        );
    }
}
