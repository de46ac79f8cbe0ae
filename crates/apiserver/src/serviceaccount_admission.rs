//! Upstream's ServiceAccount admission plugin. A pod being created runs as its namespace's
//! `default` service account unless it names another, which must exist; unless the pod or its
//! account opts out (`automountServiceAccountToken: false`), every container mounts the
//! account's credentials at `/var/run/secrets/kubernetes.io/serviceaccount` from a projected
//! `kube-api-access-XXXXX` volume (a bound token, the cluster CA, the namespace), which is what
//! in-cluster clients read; the account's image pull secrets become the pod's when it has none.
//! A mirror pod (a static manifest the kubelet mirrors, annotated `kubernetes.io/config.mirror`)
//! is not changed and may reference no service account, secrets or projected tokens, whoever
//! creates it: otherwise it would name objects, and through the Node authorizer's graph its
//! node would be granted them.

use std::time::Duration;

use serde_json::{Map, Value, json};
use skiff_api::StatusError;

use crate::handlers::Ctx;
use crate::node_authorizer::{self, Kind};
use crate::objects;

/// Where containers find their credentials (upstream's `DefaultAPITokenMountPath`).
pub const TOKEN_MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The prefix of the credentials volume's name (upstream's `ServiceAccountVolumeName`).
pub const VOLUME_PREFIX: &str = "kube-api-access-";
/// The lifetime the volume's token asks for (upstream's `WarnOnlyBoundTokenExpirationSeconds`).
pub const TOKEN_EXPIRATION_SECONDS: i64 = 3607;
/// The account a pod runs as when it names none.
pub const DEFAULT_ACCOUNT: &str = "default";

/// The annotation of a mirror pod.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Whether `pod` is a mirror pod.
pub fn is_mirror_pod(pod: &Value) -> bool {
    pod.pointer("/metadata/annotations")
        .and_then(|a| a.get(MIRROR_ANNOTATION))
        .is_some()
}

/// Whether any projected volume of `pod` has a source named `source`.
pub fn has_projection(pod: &Value, source: &str) -> bool {
    pod.pointer("/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v.pointer("/projected/sources").and_then(Value::as_array))
        .flatten()
        .any(|s| s.get(source).is_some_and(|v| !v.is_null()))
}

/// Upstream's `Validate` for a mirror pod's create: what it may not reference.
pub fn admit_mirror_pod(pod: &Value) -> Result<(), StatusError> {
    if !is_mirror_pod(pod) {
        return Ok(());
    }
    let refuse = |msg: &str| Err(forbidden(pod, msg));
    if pod
        .pointer("/spec/serviceAccountName")
        .and_then(Value::as_str)
        .is_some_and(|s| !s.is_empty())
    {
        return refuse("a mirror pod may not reference service accounts");
    }
    if !node_authorizer::references(pod, Kind::Secret).is_empty() {
        return refuse("a mirror pod may not reference secrets");
    }
    if has_projection(pod, "serviceAccountToken") {
        return refuse("a mirror pod may not use ServiceAccountToken volume projections");
    }
    Ok(())
}

/// The plugin on a create of `res`: pods only.
pub fn admit_mirror_pod_create(res: &skiff_api::Resource, obj: &Value) -> Result<(), StatusError> {
    if res.group.is_empty() && res.plural == "pods" {
        return admit_mirror_pod(obj);
    }
    Ok(())
}

/// Upstream's `Admit` on a pod create: the default account, the account's existence, the
/// credentials volume and the image pull secrets. Mirror pods are left to [`admit_mirror_pod`].
pub async fn mutate(ctx: &Ctx, pod: &mut Value) -> Result<(), StatusError> {
    let res = ctx.rr.resource;
    if !(res.group.is_empty() && res.plural == "pods" && ctx.rr.subresource.is_empty()) || is_mirror_pod(pod) {
        return Ok(());
    }
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else {
        return Ok(());
    };
    let name = match spec.get("serviceAccountName").and_then(Value::as_str) {
        Some(n) if !n.is_empty() => n.to_string(),
        _ => {
            spec.insert("serviceAccountName".into(), json!(DEFAULT_ACCOUNT));
            DEFAULT_ACCOUNT.to_string()
        }
    };
    let namespace = ctx.rr.namespace.clone();
    let account = match service_account(ctx, &namespace, &name).await? {
        Some(a) => a,
        None => {
            return Err(forbidden(
                pod,
                &format!("error looking up service account {namespace}/{name}: serviceaccount \"{name}\" not found"),
            ));
        }
    };
    if should_automount(&account, pod) {
        mount_token(pod, &random_suffix());
    }
    copy_image_pull_secrets(&account, pod);
    Ok(())
}

/// The account, from the watch cache or else the store; the `default` account is looked for a
/// few times over a second or two, as upstream does, since its controller makes it just after
/// its namespace.
async fn service_account(ctx: &Ctx, namespace: &str, name: &str) -> Result<Option<Value>, StatusError> {
    let res = skiff_api::registry::lookup("", "v1", "serviceaccounts")
        .ok_or_else(|| StatusError::internal("no serviceaccounts"))?;
    let key = objects::key(res, namespace, name);
    let store = &ctx.state.store;
    if let Some(kv) = store.get_cached(&key).await.map_err(|e| ctx.store_err(e))? {
        return Ok(objects::decode_kv(&kv));
    }
    let attempts = if name == DEFAULT_ACCOUNT { 10 } else { 1 };
    for attempt in 0..attempts {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(100 + rand::random::<u64>() % 100)).await;
        }
        if let Some(kv) = store.get(&key).await.map_err(|e| ctx.store_err(e))? {
            return Ok(objects::decode_kv(&kv));
        }
    }
    Ok(None)
}

/// The pod's `automountServiceAccountToken` wins, then the account's; true without either.
pub fn should_automount(account: &Value, pod: &Value) -> bool {
    pod.pointer("/spec/automountServiceAccountToken")
        .and_then(Value::as_bool)
        .or_else(|| account.get("automountServiceAccountToken").and_then(Value::as_bool))
        .unwrap_or(true)
}

/// Five characters of upstream's `utilrand.String` alphabet (no vowels, no look-alikes).
fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..5)
        .map(|_| ALPHABET[rand::random::<u32>() as usize % ALPHABET.len()] as char)
        .collect()
}

/// The credentials volume, as upstream's `TokenVolumeSource`: a bound token, the cluster CA from
/// `kube-root-ca.crt` and the namespace, files readable by all (0644).
pub fn credentials_volume(name: &str) -> Value {
    json!({
        "name": name,
        "projected": {
            "sources": [
                {"serviceAccountToken": {"expirationSeconds": TOKEN_EXPIRATION_SECONDS, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace",
                    "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
            ],
            "defaultMode": 420
        }
    })
}

/// Upstream's `mountServiceAccountToken`: every init and app container without a mount at
/// [`TOKEN_MOUNT_PATH`] mounts the credentials volume there, read-only; the volume (an existing
/// `kube-api-access-*` one, else a new one named with `suffix`) is added when one does.
pub fn mount_token(pod: &mut Value, suffix: &str) {
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    let existing = spec
        .get("volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v.get("name").and_then(Value::as_str))
        .find(|n| n.starts_with(VOLUME_PREFIX))
        .map(str::to_string);
    let volume_name = existing.clone().unwrap_or_else(|| format!("{VOLUME_PREFIX}{suffix}"));
    let mount = json!({"name": volume_name, "readOnly": true, "mountPath": TOKEN_MOUNT_PATH});
    let mut needs_volume = false;
    for list in ["initContainers", "containers"] {
        let Some(containers) = spec.get_mut(list).and_then(Value::as_array_mut) else {
            continue;
        };
        for c in containers.iter_mut().filter_map(Value::as_object_mut) {
            let mounted = c
                .get("volumeMounts")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .any(|m| m.get("mountPath").and_then(Value::as_str) == Some(TOKEN_MOUNT_PATH));
            if mounted {
                continue;
            }
            let mounts = c.entry("volumeMounts").or_insert_with(|| json!([]));
            if !mounts.is_array() {
                *mounts = json!([]);
            }
            if let Some(m) = mounts.as_array_mut() {
                m.push(mount.clone());
            }
            needs_volume = true;
        }
    }
    if existing.is_none() && needs_volume {
        let volumes = spec.entry("volumes").or_insert_with(|| json!([]));
        if !volumes.is_array() {
            *volumes = json!([]);
        }
        if let Some(v) = volumes.as_array_mut() {
            v.push(credentials_volume(&volume_name));
        }
    }
}

/// The account's `imagePullSecrets` become the pod's when the pod names none.
fn copy_image_pull_secrets(account: &Value, pod: &mut Value) {
    let Some(secrets) = account
        .get("imagePullSecrets")
        .and_then(Value::as_array)
        .filter(|s| !s.is_empty())
    else {
        return;
    };
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    if spec
        .get("imagePullSecrets")
        .and_then(Value::as_array)
        .is_some_and(|s| !s.is_empty())
    {
        return;
    }
    let copied: Vec<Value> = secrets
        .iter()
        .map(|s| {
            let mut m = Map::new();
            if let Some(n) = s.get("name") {
                m.insert("name".into(), n.clone());
            }
            Value::Object(m)
        })
        .collect();
    spec.insert("imagePullSecrets".into(), Value::Array(copied));
}

/// Upstream's `admission.NewForbidden` for a pod: `pods "NAME" is forbidden: MESSAGE`.
pub fn forbidden(pod: &Value, msg: &str) -> StatusError {
    StatusError::forbidden_resource("", "pods", crate::objects::name(pod), msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod_with(containers: Value) -> Value {
        json!({"metadata": {"name": "p"}, "spec": {"containers": containers}})
    }

    #[test]
    fn every_container_mounts_one_credentials_volume() {
        let mut pod =
            pod_with(json!([{"name": "a"}, {"name": "b", "volumeMounts": [{"name": "x", "mountPath": "/x"}]}]));
        pod["spec"]["initContainers"] = json!([{"name": "i"}]);
        mount_token(&mut pod, "abcde");
        let volumes = pod["spec"]["volumes"].as_array().expect("volumes");
        assert_eq!(volumes.len(), 1);
        assert_eq!(volumes[0], credentials_volume("kube-api-access-abcde"));
        assert_eq!(
            volumes[0]["projected"]["sources"][0]["serviceAccountToken"]["expirationSeconds"],
            3607
        );
        let mount = json!({"name": "kube-api-access-abcde", "readOnly": true, "mountPath": TOKEN_MOUNT_PATH});
        assert_eq!(pod["spec"]["containers"][0]["volumeMounts"], json!([mount]));
        assert_eq!(pod["spec"]["containers"][1]["volumeMounts"][1], mount);
        assert_eq!(pod["spec"]["initContainers"][0]["volumeMounts"], json!([mount]));
        // Admitted again (a pod recreated from its own output), nothing is added twice.
        let before = pod.clone();
        mount_token(&mut pod, "zzzzz");
        assert_eq!(pod, before);
    }

    #[test]
    fn a_mount_of_its_own_at_the_path_or_an_opt_out_keeps_the_volume_away() {
        let mut pod =
            pod_with(json!([{"name": "a", "volumeMounts": [{"name": "mine", "mountPath": TOKEN_MOUNT_PATH}]}]));
        mount_token(&mut pod, "abcde");
        assert!(pod["spec"].get("volumes").is_none(), "{pod}");

        let account = json!({"metadata": {"name": "default"}, "automountServiceAccountToken": false});
        let mut pod = pod_with(json!([{"name": "a"}]));
        assert!(!should_automount(&account, &pod));
        pod["spec"]["automountServiceAccountToken"] = json!(true);
        assert!(should_automount(&account, &pod), "the pod's choice wins");
        assert!(should_automount(&json!({}), &pod_with(json!([]))));
    }

    #[test]
    fn the_accounts_pull_secrets_become_the_pods_when_it_has_none() {
        let account = json!({"imagePullSecrets": [{"name": "reg"}]});
        let mut pod = pod_with(json!([{"name": "a"}]));
        copy_image_pull_secrets(&account, &mut pod);
        assert_eq!(pod["spec"]["imagePullSecrets"], json!([{"name": "reg"}]));
        let mut own = pod_with(json!([{"name": "a"}]));
        own["spec"]["imagePullSecrets"] = json!([{"name": "mine"}]);
        copy_image_pull_secrets(&account, &mut own);
        assert_eq!(own["spec"]["imagePullSecrets"], json!([{"name": "mine"}]));
        let suffix = random_suffix();
        assert_eq!(suffix.len(), 5);
        assert!(suffix.bytes().all(|b| b"bcdfghjklmnpqrstvwxz2456789".contains(&b)));
    }

    fn mirror(spec: Value) -> Value {
        let mut spec = spec;
        spec["containers"] = json!([{"name": "c", "image": "busybox"}]);
        json!({"metadata": {"name": "m", "annotations": {MIRROR_ANNOTATION: "x"}}, "spec": spec})
    }

    #[test]
    fn mirror_pods_reference_nothing() {
        assert!(admit_mirror_pod(&mirror(json!({}))).is_ok());
        let e = admit_mirror_pod(&mirror(json!({"serviceAccountName": "default"}))).unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (
                403,
                "pods \"m\" is forbidden: a mirror pod may not reference service accounts"
            )
        );
        for spec in [
            json!({"volumes": [{"name": "v", "secret": {"secretName": "s"}}]}),
            json!({"imagePullSecrets": [{"name": "s"}]}),
            json!({"volumes": [{"name": "v", "projected": {"sources": [{"secret": {"name": "s"}}]}}]}),
        ] {
            let e = admit_mirror_pod(&mirror(spec.clone())).unwrap_err();
            assert!(e.message.ends_with("a mirror pod may not reference secrets"), "{spec}");
        }
        let e = admit_mirror_pod(&mirror(
            json!({"volumes": [{"name": "v", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}]}),
        ))
        .unwrap_err();
        assert!(
            e.message
                .ends_with("a mirror pod may not use ServiceAccountToken volume projections")
        );
        // A pod that is no mirror is not this rule's.
        let mut plain = mirror(json!({"serviceAccountName": "default"}));
        plain["metadata"]["annotations"] = json!({});
        assert!(admit_mirror_pod(&plain).is_ok());
    }
}
