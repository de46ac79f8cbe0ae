//! `skiff token create|list|delete`: bootstrap token Secrets, as `kubeadm token`, printed as
//! join tokens (`K10<sha256 of the CA>::<id>.<secret>`, the CA as `kube-public/cluster-info`
//! publishes it).

use anyhow::Context;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use skiff_api::bootstraptoken::{self as bt, JoinToken};

use crate::TokenCommand;

pub async fn run(client: kube::Client, command: TokenCommand) -> anyhow::Result<()> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), bt::NAMESPACE);
    match command {
        TokenCommand::Create {
            ttl,
            description,
            groups,
        } => {
            let expires = if ttl.trim() == "0" {
                None
            } else {
                let d = crate::parse_duration(&ttl).map_err(|e| anyhow::anyhow!("--ttl: {e}"))?;
                let span = jiff::SignedDuration::try_from(d).context("--ttl is too long")?;
                Some(jiff::Timestamp::now().checked_add(span).context("--ttl is too long")?)
            };
            for g in &groups {
                bt::validate_group_name(g).map_err(|e| anyhow::anyhow!("--groups: {e}"))?;
            }
            let ca_hash = cluster_ca_hash(&client).await?;
            let (id, secret) = bt::generate();
            let obj = bt::secret(&id, &secret, expires, &description, &groups);
            let s: Secret = serde_json::from_value(obj).context("building the token Secret")?;
            secrets
                .create(&PostParams::default(), &s)
                .await
                .context("creating the bootstrap token Secret")?;
            println!("{}", JoinToken { ca_hash, id, secret });
            Ok(())
        }
        TokenCommand::List => {
            let list = secrets.list(&ListParams::default()).await.context("listing Secrets")?;
            let now = jiff::Timestamp::now();
            let mut rows = vec![[
                "TOKEN".to_string(),
                "TTL".into(),
                "EXPIRES".into(),
                "USAGES".into(),
                "DESCRIPTION".into(),
                "EXTRA GROUPS".into(),
            ]];
            for s in list
                .items
                .iter()
                .filter(|s| s.type_.as_deref() == Some(bt::SECRET_TYPE))
            {
                let v = serde_json::to_value(s).context("encoding a Secret")?;
                let data = |k| bt::secret_data(&v, k);
                let (ttl, expires) = match bt::expiration(&v) {
                    Some(t) => (
                        skiff_api::printers::human_duration(i128::from((t - now).get_seconds()) * 1_000_000_000),
                        data(bt::EXPIRATION_KEY),
                    ),
                    None => ("<forever>".to_string(), "<never>".to_string()),
                };
                let usages: Vec<&str> = [
                    (bt::USAGE_AUTHENTICATION_KEY, "authentication"),
                    (bt::USAGE_SIGNING_KEY, "signing"),
                ]
                .into_iter()
                .filter(|(k, _)| data(k) == "true")
                .map(|(_, u)| u)
                .collect();
                let description = data(bt::DESCRIPTION_KEY);
                let groups = data(bt::EXTRA_GROUPS_KEY);
                rows.push([
                    format!("{}.{}", data(bt::TOKEN_ID_KEY), data(bt::TOKEN_SECRET_KEY)),
                    ttl,
                    expires,
                    usages.join(","),
                    if description.is_empty() {
                        "<none>".into()
                    } else {
                        description
                    },
                    if groups.is_empty() { "<none>".into() } else { groups },
                ]);
            }
            print!("{}", table(&rows));
            Ok(())
        }
        TokenCommand::Delete { tokens } => {
            anyhow::ensure!(!tokens.is_empty(), "name at least one token (its id or id.secret)");
            for t in tokens {
                let id = t.split_once('.').map_or(t.as_str(), |(id, _)| id);
                anyhow::ensure!(
                    bt::parse_token(&format!("{id}.0000000000000000")).is_some(),
                    "{t:?} is not a token id ([a-z0-9]{{6}})"
                );
                secrets
                    .delete(&format!("{}{id}", bt::SECRET_PREFIX), &DeleteParams::default())
                    .await
                    .with_context(|| format!("deleting bootstrap token {id}"))?;
                println!("bootstrap token {id:?} deleted");
            }
            Ok(())
        }
    }
}

/// The hash joining nodes check: of the CA as cluster-info carries it.
async fn cluster_ca_hash(client: &kube::Client) -> anyhow::Result<String> {
    let cm = Api::<ConfigMap>::namespaced(client.clone(), bt::CLUSTER_INFO_NAMESPACE)
        .get(bt::CLUSTER_INFO_NAME)
        .await
        .context("reading kube-public/cluster-info")?;
    let ca = skiff_agent::bootstrap::cluster_info_ca(&cm)?;
    Ok(bt::ca_hash(&ca))
}

/// Columns padded as kubectl's tabwriter pads them (three spaces apart).
fn table(rows: &[[String; 6]]) -> String {
    let mut widths = [0usize; 6];
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (i, c) in r.iter().enumerate() {
            if i + 1 == r.len() {
                line.push_str(c);
            } else {
                line.push_str(&format!("{c:<w$}   ", w = widths[i]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}
