//! The root CA certificate publisher (upstream's
//! `pkg/controller/certificates/rootcacertpublisher`): every namespace that is not being deleted
//! has the ConfigMap `kube-root-ca.crt` holding the cluster's CA (`ca.crt`), with which pods
//! verify the API server. Changed or deleted, it is written again.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::PostParams;

use crate::controller_utils::{is_already_exists, is_namespace_terminating, run_per_namespace};

/// The ConfigMap's name, as upstream's.
pub const ROOT_CA_CONFIG_MAP: &str = "kube-root-ca.crt";
/// Its key holding the PEM bundle.
pub const CA_KEY: &str = "ca.crt";
const DESCRIPTION_ANNOTATION: &str = "kubernetes.io/description";
const DESCRIPTION: &str = "Contains a CA bundle that can be used to verify the kube-apiserver when using internal \
     endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across \
     distributions of Kubernetes clusters.";

/// Publishes `root_ca` (PEM) in every namespace.
pub async fn run(client: kube::Client, root_ca: String) -> anyhow::Result<()> {
    let c = client.clone();
    let ca: Arc<str> = root_ca.into();
    run_per_namespace::<ConfigMap, _, _>(client, "root-ca-cert-publisher", ROOT_CA_CONFIG_MAP, true, move |ns| {
        sync(c.clone(), ns, ca.clone())
    })
    .await
}

/// What the ConfigMap holds: the bundle under `ca.crt`.
fn desired_data(ca: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(CA_KEY.to_string(), ca.to_string())])
}

/// Whether `cm` holds exactly the bundle and carries the description.
fn up_to_date(cm: &ConfigMap, ca: &str) -> bool {
    let described = cm
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(DESCRIPTION_ANNOTATION))
        .is_some_and(|d| !d.is_empty());
    described && cm.data.as_ref() == Some(&desired_data(ca))
}

/// Creates the namespace's ConfigMap, or puts back its data and description.
async fn sync(client: kube::Client, namespace: String, ca: Arc<str>) -> anyhow::Result<()> {
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    match api.get_opt(ROOT_CA_CONFIG_MAP).await? {
        Some(cm) if up_to_date(&cm, &ca) => Ok(()),
        Some(mut cm) => {
            cm.data = Some(desired_data(&ca));
            cm.metadata
                .annotations
                .get_or_insert_with(BTreeMap::new)
                .insert(DESCRIPTION_ANNOTATION.to_string(), DESCRIPTION.to_string());
            // A conflict is an error: the sync is retried with the newer object.
            api.replace(ROOT_CA_CONFIG_MAP, &PostParams::default(), &cm).await?;
            Ok(())
        }
        None => {
            let cm = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(ROOT_CA_CONFIG_MAP.to_string()),
                    annotations: Some(BTreeMap::from([(
                        DESCRIPTION_ANNOTATION.to_string(),
                        DESCRIPTION.to_string(),
                    )])),
                    ..Default::default()
                },
                data: Some(desired_data(&ca)),
                ..Default::default()
            };
            match api.create(&PostParams::default(), &cm).await {
                Ok(_) => Ok(()),
                Err(e) if is_already_exists(&e) || is_namespace_terminating(&e) => Ok(()),
                Err(e) => Err(e.into()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn up_to_date_needs_the_exact_bundle_and_the_description() {
        let ca = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        let mut cm = ConfigMap {
            data: Some(desired_data(ca)),
            ..Default::default()
        };
        assert!(!up_to_date(&cm, ca), "no description");
        cm.metadata.annotations = Some(BTreeMap::from([(
            DESCRIPTION_ANNOTATION.to_string(),
            DESCRIPTION.to_string(),
        )]));
        assert!(up_to_date(&cm, ca));
        cm.data
            .get_or_insert_with(BTreeMap::new)
            .insert("extra".into(), "x".into());
        assert!(!up_to_date(&cm, ca), "an extra key");
        cm.data = Some(desired_data("other"));
        assert!(!up_to_date(&cm, ca), "another bundle");
    }
}
