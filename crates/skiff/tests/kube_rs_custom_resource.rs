//! kube-rs's `CustomResource` derive against Skiff: the definition kube-rs generates (its
//! structural schema from schemars, a status and a scale subresource, a printer column) is
//! created and becomes Established, then objects of the kind are created, seen by kube-rs's
//! runtime watcher, patched (merge and server-side apply), their status and scale written through
//! the subresources, and deleted.

#![cfg(test)]

mod common;

use std::time::Duration;

use common::Cluster;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::runtime::watcher;
use kube::{CustomResource, CustomResourceExt, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

const CONTROL_PLANE: &[&str] = &["--no-agent", "--no-scheduler"];

#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "example.com",
    version = "v1",
    kind = "Gizmo",
    namespaced,
    status = "GizmoStatus",
    scale(spec_replicas_path = ".spec.replicas", status_replicas_path = ".status.replicas"),
    printcolumn(name = "Flavor", type_ = "string", json_path = ".spec.flavor")
)]
pub struct GizmoSpec {
    flavor: String,
    replicas: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    note: Option<String>,
    #[serde(default)]
    tags: Vec<String>,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct GizmoStatus {
    replicas: i32,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_rs_derived_custom_resource_end_to_end() {
    let c = tokio::task::spawn_blocking(|| Cluster::start(CONTROL_PLANE))
        .await
        .expect("cluster");
    let client = c.kube_client().await;

    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &Gizmo::crd())
        .await
        .expect("create the derived definition");
    tokio::time::timeout(
        Duration::from_secs(30),
        await_condition(crds.clone(), "gizmos.example.com", conditions::is_crd_established()),
    )
    .await
    .expect("Established within 30 s")
    .expect("await condition");

    let gizmos: Api<Gizmo> = Api::namespaced(client.clone(), "default");
    let mut events = watcher(gizmos.clone(), watcher::Config::default()).boxed();
    // The watcher's initial (empty) list.
    loop {
        match tokio::time::timeout(Duration::from_secs(10), events.try_next()).await {
            Ok(Ok(Some(watcher::Event::InitDone))) => break,
            Ok(Ok(Some(_))) => {}
            other => panic!("watcher did not list: {other:?}"),
        }
    }

    let mut g = Gizmo::new(
        "g1",
        GizmoSpec {
            flavor: "mint".into(),
            replicas: 1,
            note: None,
            tags: vec!["a".into()],
        },
    );
    g.metadata.labels = Some([("team".to_string(), "x".to_string())].into());
    let created = gizmos.create(&PostParams::default(), &g).await.expect("create");
    assert_eq!(created.spec, g.spec);
    assert!(created.uid().is_some());

    let seen = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(ev) = events.try_next().await.expect("watch") {
            if let watcher::Event::Apply(o) = ev
                && o.name_any() == "g1"
            {
                return o;
            }
        }
        panic!("watch ended");
    })
    .await
    .expect("the watcher saw the create");
    assert_eq!(seen.spec.flavor, "mint");

    let patched = gizmos
        .patch(
            "g1",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"note": "hi"}})),
        )
        .await
        .expect("merge patch");
    assert_eq!(patched.spec.note.as_deref(), Some("hi"));

    let applied = gizmos
        .patch(
            "g1",
            &PatchParams::apply("gizmo-controller").force(),
            &Patch::Apply(serde_json::json!({
                "apiVersion": "example.com/v1",
                "kind": "Gizmo",
                "spec": {"flavor": "lemon", "replicas": 2}
            })),
        )
        .await
        .expect("server-side apply");
    assert_eq!((applied.spec.flavor.as_str(), applied.spec.replicas), ("lemon", 2));
    assert!(
        applied
            .managed_fields()
            .iter()
            .any(|m| m.manager.as_deref() == Some("gizmo-controller") && m.operation.as_deref() == Some("Apply")),
        "{:?}",
        applied.managed_fields()
    );

    let with_status = gizmos
        .patch_status(
            "g1",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"replicas": 2}})),
        )
        .await
        .expect("status patch");
    assert_eq!(with_status.status, Some(GizmoStatus { replicas: 2 }));
    assert_eq!(with_status.spec.flavor, "lemon");

    let scale = gizmos
        .patch_scale(
            "g1",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"replicas": 5}})),
        )
        .await
        .expect("scale patch");
    assert_eq!(scale.spec.and_then(|s| s.replicas), Some(5));
    assert_eq!(gizmos.get("g1").await.expect("get").spec.replicas, 5);

    // The schema kube-rs generated is enforced: replicas is an integer.
    let bad = gizmos
        .patch(
            "g1",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"replicas": "many"}})),
        )
        .await
        .expect_err("a string replicas passed the schema");
    match bad {
        kube::Error::Api(s) => assert_eq!(s.code, 422, "{s:?}"),
        other => panic!("unexpected error {other:?}"),
    }

    gizmos.delete("g1", &DeleteParams::default()).await.expect("delete");
    let gone = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(ev) = events.try_next().await.expect("watch") {
            if let watcher::Event::Delete(o) = ev
                && o.name_any() == "g1"
            {
                return;
            }
        }
    })
    .await;
    assert!(gone.is_ok(), "the watcher did not see the delete");
    assert!(gizmos.get_opt("g1").await.expect("get").is_none());
    drop(events);
    tokio::task::spawn_blocking(move || drop(c)).await.expect("cleanup");
}
