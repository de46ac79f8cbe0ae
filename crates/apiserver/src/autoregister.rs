//! The server's own APIServices, kept as upstream's kube-aggregator autoregister controller
//! (`pkg/controllers/autoregister`) and kube-apiserver's CRD registration controller
//! (`pkg/controlplane/controller/crdregistration`) keep them:
//!
//! - one local APIService (`vVERSION.GROUP`, `v1.` for the core group, no `service`) per
//!   built-in group version served, with upstream's `groupPriorityMinimum` and
//!   `versionPriority`, labelled `kube-aggregator.kubernetes.io/automanaged: onstart`: created or
//!   put back at start, then left to the user until the next start;
//! - one per group version a CustomResourceDefinition serves (priorities 1000 and 100),
//!   labelled `automanaged: "true"`: created when a definition starts serving it, its spec kept,
//!   and deleted when no definition serves it any more.
//!
//! APIServices without the label are the user's and are never touched. Their `Available`
//! condition is the availability controller's (`available_controller.rs`).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use skiff_api::Resource;
use skiff_api::apiextensions::Definition;
use skiff_store::{ListOptions, Store, StoreError};

use crate::customresourcedefinitions;
use crate::objects;
use crate::server::ApiState;

/// The label that marks an APIService as the server's, and how it is kept.
pub const AUTOMANAGED_LABEL: &str = "kube-aggregator.kubernetes.io/automanaged";
/// Synced once, at start.
const MANAGE_ON_START: &str = "onstart";
/// Synced continuously.
const MANAGE_CONTINUOUSLY: &str = "true";

/// The APIService resource.
pub fn resource() -> anyhow::Result<&'static Resource> {
    skiff_api::registry::lookup("apiregistration.k8s.io", "v1", "apiservices")
        .ok_or_else(|| anyhow::anyhow!("the apiservices resource is not registered"))
}

fn api_service(group: &str, version: &str, group_priority: i64, version_priority: i64, manage: &str) -> Value {
    let mut s = json!({
        "kind": "APIService",
        "apiVersion": "apiregistration.k8s.io/v1",
        "metadata": {
            "name": format!("{version}.{group}"),
            "labels": {AUTOMANAGED_LABEL: manage},
        },
        "spec": {
            "group": group,
            "version": version,
            "groupPriorityMinimum": group_priority,
            "versionPriority": version_priority,
        },
    });
    // The core group's is empty, and upstream leaves an empty group out.
    if group.is_empty()
        && let Some(spec) = s.get_mut("spec").and_then(Value::as_object_mut)
    {
        spec.remove("group");
    }
    s
}

/// The APIServices the server wants, by name: the built-in group versions upstream lists a
/// priority for (synced on start), then the group versions the definitions serve (synced
/// continuously; a built-in name wins).
pub fn desired(crds: &[Value]) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    for (group, version) in skiff_api::registry::builtin_group_versions() {
        if let Some((gp, vp)) = skiff_api::registry::api_version_priority(group, version) {
            let s = api_service(group, version, gp, vp, MANAGE_ON_START);
            out.insert(objects::name(&s).to_string(), s);
        }
    }
    for crd in crds {
        let def = Definition::from_object(crd);
        if def.group.is_empty() {
            continue;
        }
        for v in def.versions.iter().filter(|v| v.served) {
            // CRDs have a relatively low priority; their versions sort kube-like in the group.
            let s = api_service(&def.group, &v.name, 1000, 100, MANAGE_CONTINUOUSLY);
            out.entry(objects::name(&s).to_string()).or_insert(s);
        }
    }
    out
}

fn automanaged(obj: Option<&Value>) -> &str {
    obj.and_then(|o| o.pointer("/metadata/labels"))
        .and_then(|l| l.get(AUTOMANAGED_LABEL))
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// What to do with one APIService.
#[derive(Debug, PartialEq)]
pub enum Action {
    Nothing,
    Create(Value),
    /// The stored object with the desired spec.
    Update(Value),
    Delete,
}

/// Upstream's `checkAPIService` table: `desired` is what the server wants under this name,
/// `current` what is stored; `synced` whether this name was synced before; `at_start` whether
/// it was stored when the server started.
pub fn decide(desired: Option<&Value>, current: Option<&Value>, synced: bool, at_start: bool) -> Action {
    match (desired, current) {
        (None, None) => Action::Nothing,
        // Sync on start only once.
        (Some(d), _) if automanaged(Some(d)) == MANAGE_ON_START && synced => Action::Nothing,
        (Some(d), None) => Action::Create(d.clone()),
        (_, Some(c)) if !matches!(automanaged(Some(c)), MANAGE_ON_START | MANAGE_CONTINUOUSLY) => Action::Nothing,
        // Stored as on-start but added after the start, or synced already.
        (_, Some(c)) if automanaged(Some(c)) == MANAGE_ON_START && (!at_start || synced) => Action::Nothing,
        (None, Some(_)) => Action::Delete,
        (Some(d), Some(c)) => {
            if c.get("spec") == d.get("spec") {
                return Action::Nothing;
            }
            let mut updated = c.clone();
            if let Some(m) = updated.as_object_mut() {
                m.insert("spec".into(), d.get("spec").cloned().unwrap_or(Value::Null));
            }
            Action::Update(updated)
        }
    }
}

/// The controller's memory between passes.
#[derive(Default)]
pub struct AutoRegister {
    synced: HashSet<String>,
    at_start: Option<HashSet<String>>,
}

impl AutoRegister {
    /// One pass over every wanted and every stored APIService.
    pub async fn sync(&mut self, store: &dyn Store) -> anyhow::Result<()> {
        let res = resource()?;
        let crds: Vec<Value> = store
            .list(customresourcedefinitions::PREFIX, ListOptions::default())
            .await?
            .items
            .iter()
            .filter_map(objects::decode_kv)
            .collect();
        let wanted = desired(&crds);
        let stored = store.list(&objects::prefix(res, ""), ListOptions::default()).await?;
        let mut current: BTreeMap<String, (Value, i64)> = BTreeMap::new();
        for kv in &stored.items {
            if let Some(v) = objects::decode_kv(kv) {
                current.insert(objects::name(&v).to_string(), (v, kv.mod_revision));
            }
        }
        let at_start = self
            .at_start
            .get_or_insert_with(|| current.keys().cloned().collect())
            .clone();
        let names: Vec<String> = wanted.keys().chain(current.keys()).cloned().collect();
        for name in names {
            let cur = current.get(&name);
            let action = decide(
                wanted.get(&name),
                cur.map(|(v, _)| v),
                self.synced.contains(&name),
                at_start.contains(&name),
            );
            let key = objects::key(res, "", &name);
            let done = match action {
                Action::Nothing => Ok(()),
                Action::Create(mut obj) => {
                    tracing::info!(name, "registering an APIService");
                    if let Some(md) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
                        md.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
                        md.insert("creationTimestamp".into(), json!(objects::now_rfc3339()));
                    }
                    match store.create(&key, objects::encode_for_store(&obj)).await {
                        Ok(_) | Err(StoreError::AlreadyExists(_)) => Ok(()),
                        Err(e) => Err(e),
                    }
                }
                Action::Update(obj) => {
                    let rev = cur.map(|(_, r)| *r).unwrap_or_default();
                    match store.update(&key, objects::encode_for_store(&obj), rev).await {
                        Ok(_) | Err(StoreError::NotFound(_)) => Ok(()),
                        Err(e) => Err(e),
                    }
                }
                Action::Delete => {
                    tracing::info!(name, "removing an APIService no longer served");
                    let rev = cur.map(|(_, r)| *r);
                    match store.delete(&key, rev).await {
                        Ok(_) | Err(StoreError::NotFound(_)) => Ok(()),
                        Err(e) => Err(e),
                    }
                }
            };
            match done {
                Ok(()) => {
                    self.synced.insert(name);
                }
                // Retried on the next pass.
                Err(e) => tracing::debug!(name, error = %e, "syncing an APIService failed"),
            }
        }
        Ok(())
    }
}

/// Registers the server's APIServices once, before the server answers.
pub async fn start(state: &ApiState) -> anyhow::Result<AutoRegister> {
    let mut reg = AutoRegister::default();
    reg.sync(&*state.store).await?;
    Ok(reg)
}

/// Keep them registered: after each change to a definition or an APIService, and every 30
/// seconds.
pub fn spawn(state: Arc<ApiState>, mut reg: AutoRegister) {
    tokio::spawn(async move {
        let store = state.store.clone();
        let Ok(res) = resource() else { return };
        let prefixes = [customresourcedefinitions::PREFIX.to_string(), objects::prefix(res, "")];
        let mut triggers = crate::resync::Triggers::new(
            store.clone(),
            prefixes.to_vec(),
            Duration::from_secs(30),
            "APIService registration",
        );
        loop {
            triggers.next().await;
            if let Err(e) = reg.sync(&*store).await {
                tracing::warn!(error = %e, "registering APIServices failed");
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn labelled(manage: &str, spec: Value) -> Value {
        json!({"metadata": {"name": "v1.x", "labels": {AUTOMANAGED_LABEL: manage}}, "spec": spec})
    }

    #[test]
    fn built_in_group_versions_with_upstream_priorities() {
        let d = desired(&[]);
        let core = &d["v1."];
        assert_eq!(
            core["spec"],
            json!({"version": "v1", "groupPriorityMinimum": 18000, "versionPriority": 1})
        );
        assert_eq!(core["metadata"]["labels"][AUTOMANAGED_LABEL], "onstart");
        assert_eq!(d["v1.apps"]["spec"]["groupPriorityMinimum"], 17800);
        assert_eq!(d["v2.autoscaling"]["spec"]["versionPriority"], 30);
        assert_eq!(d["v1.apiextensions.k8s.io"]["spec"]["groupPriorityMinimum"], 16700);
        // The aggregator's own group gets no APIService, as upstream's list has none for it.
        assert!(!d.contains_key("v1.apiregistration.k8s.io"));
        assert!(d.keys().all(|k| k.starts_with('v')));
    }

    #[test]
    fn definitions_register_their_served_versions() {
        let crd = json!({"metadata": {"name": "widgets.example.com"}, "spec": {"group": "example.com",
            "names": {"plural": "widgets", "kind": "Widget"}, "scope": "Namespaced",
            "versions": [{"name": "v1", "served": true, "storage": true},
                         {"name": "v1alpha1", "served": false, "storage": false}]}});
        let d = desired(&[crd]);
        let w = &d["v1.example.com"];
        assert_eq!(w["spec"]["groupPriorityMinimum"], 1000);
        assert_eq!(w["spec"]["versionPriority"], 100);
        assert_eq!(w["metadata"]["labels"][AUTOMANAGED_LABEL], "true");
        assert!(!d.contains_key("v1alpha1.example.com"));
    }

    #[test]
    fn upstream_check_table() {
        let spec = json!({"group": "x", "version": "v1", "groupPriorityMinimum": 1, "versionPriority": 1});
        let other = json!({"group": "x", "version": "v1", "groupPriorityMinimum": 2, "versionPriority": 1});
        let on_start = labelled("onstart", spec.clone());
        let always = labelled("true", spec.clone());
        let users = json!({"metadata": {"name": "v1.x"}, "spec": other.clone()});
        // 2A, 2B, 2C
        assert_eq!(decide(None, None, false, false), Action::Nothing);
        assert_eq!(
            decide(Some(&on_start), None, false, false),
            Action::Create(on_start.clone())
        );
        assert_eq!(decide(Some(&on_start), None, true, false), Action::Nothing);
        assert_eq!(decide(Some(&always), None, true, false), Action::Create(always.clone()));
        // 3: the user's own
        assert_eq!(decide(Some(&always), Some(&users), false, true), Action::Nothing);
        assert_eq!(decide(None, Some(&users), false, true), Action::Nothing);
        // 4: on-start, added after the start
        assert_eq!(decide(None, Some(&on_start), false, false), Action::Nothing);
        // 5: on-start, present at start: deleted or updated once
        assert_eq!(decide(None, Some(&on_start), false, true), Action::Delete);
        assert_eq!(decide(None, Some(&on_start), true, true), Action::Nothing);
        let stale = labelled("onstart", other.clone());
        match decide(Some(&on_start), Some(&stale), false, true) {
            Action::Update(u) => assert_eq!(u["spec"], spec),
            a => panic!("{a:?}"),
        }
        // 6: continuously synced
        assert_eq!(decide(None, Some(&always), true, false), Action::Delete);
        let stale = labelled("true", other);
        assert!(matches!(
            decide(Some(&always), Some(&stale), true, false),
            Action::Update(_)
        ));
        assert_eq!(decide(Some(&always), Some(&always), true, false), Action::Nothing);
    }
}
