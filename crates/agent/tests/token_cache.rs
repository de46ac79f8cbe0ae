//! The pod worker's service account tokens against the project's own API server, started
//! in-process (no Docker needed): a token is requested once and held until it is due for
//! renewal, per service account, audience and lifetime.

#![cfg(test)]

use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::Api;
use kube::api::PostParams;
use skiff_agent::volumes::{TokenCache, TokenError};

struct Server {
    client: kube::Client,
    _server: skiff_apiserver::Running,
    _dir: tempfile::TempDir,
}

async fn server() -> Server {
    let dir = tempfile::tempdir().expect("temp dir");
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut opts = skiff_apiserver::ServerOptions::new(dir.path().join("server"), 0);
    opts.bind = "127.0.0.1".parse().expect("loopback address");
    let server = skiff_apiserver::start(opts).await.expect("API server starts");
    let client = skiff_apiserver::client(server.state.clone());
    Server {
        client,
        _server: server,
        _dir: dir,
    }
}

async fn create<K>(client: &kube::Client, object: serde_json::Value) -> K
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::Serialize
        + serde::de::DeserializeOwned,
{
    let obj: K = serde_json::from_value(object).expect("a valid object");
    Api::<K>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &obj)
        .await
        .expect("created")
}

#[tokio::test]
async fn tokens_are_held_until_due_for_renewal() {
    let s = server().await;
    let _: ServiceAccount = create(&s.client, serde_json::json!({"metadata": {"name": "builder"}})).await;
    let pod: Pod = create(
        &s.client,
        serde_json::json!({
            "metadata": {"name": "app"},
            "spec": {"serviceAccountName": "builder", "containers": [{"name": "c", "image": "busybox"}]},
        }),
    )
    .await;

    let mut tokens = TokenCache::new(s.client.clone());
    let first = tokens.get(&pod, None, None).await.expect("a token");
    assert_eq!(first.split('.').count(), 3, "a JWT: {first}");
    // Every TokenRequest issues a new token (its own jti): the same one again is the held one.
    let again = tokens.get(&pod, None, None).await.expect("a token");
    assert_eq!(again, first);
    let fresh = TokenCache::new(s.client.clone())
        .get(&pod, None, None)
        .await
        .expect("a token");
    assert_ne!(fresh, first);
    // Another audience or lifetime is another token.
    let vault = tokens.get(&pod, Some("vault".into()), None).await.expect("a token");
    assert_ne!(vault, first);
    let longer = tokens.get(&pod, None, Some(7200)).await.expect("a token");
    assert_ne!(longer, first);
    assert_eq!(tokens.get(&pod, None, None).await.expect("a token"), first);

    // A refused request with nothing held is the API's refusal, in its words.
    match tokens.get(&pod, None, Some(60)).await {
        Err(TokenError::Api(status)) => {
            assert_eq!(status.code, 422);
            assert!(
                status
                    .message
                    .contains("may not specify a duration less than 10 minutes"),
                "{}",
                status.message
            );
        }
        other => panic!("expected the API's refusal, got {:?}", other.map(|_| ())),
    }
}
