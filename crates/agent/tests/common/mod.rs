//! What the agent's tests against an in-process API server share.

use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use kube::Api;

/// The in-process API server runs no controllers: the `default` ServiceAccount, which the
/// ServiceAccount admission plugin requires of every pod, and the `kube-root-ca.crt` ConfigMap
/// its credentials volume projects, made as the service account controller and the root CA
/// publisher would make them.
pub async fn as_the_controllers_would(client: &kube::Client, server_dir: &std::path::Path) {
    let ca = std::fs::read_to_string(server_dir.join("pki").join("ca.crt")).expect("the cluster CA");
    let sa: ServiceAccount = serde_json::from_value(serde_json::json!({"metadata": {"name": "default"}})).unwrap();
    Api::<ServiceAccount>::namespaced(client.clone(), "default")
        .create(&Default::default(), &sa)
        .await
        .expect("the default service account");
    let cm: ConfigMap =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "kube-root-ca.crt"}, "data": {"ca.crt": ca}}))
            .unwrap();
    Api::<ConfigMap>::namespaced(client.clone(), "default")
        .create(&Default::default(), &cm)
        .await
        .expect("the root CA ConfigMap");
}
