//! The replication controller (upstream's `pkg/controller/replication`): the ReplicaSet
//! controller run over ReplicationControllers, each read as a ReplicaSet (its equality-based
//! selector as `matchLabels`) and its status written back in core/v1's form, as upstream's
//! `conversion.go` does. Pods it makes are owned by `v1` `ReplicationController`s.

use std::borrow::Cow;

use k8s_openapi::api::apps::v1::{ReplicaSet, ReplicaSetCondition, ReplicaSetSpec, ReplicaSetStatus};
use k8s_openapi::api::core::v1::{ReplicationController, ReplicationControllerCondition, ReplicationControllerStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::informers::SharedInformerFactory;
use crate::replicaset::{self, ReplicaSetLike};

pub const COMPONENT: &str = "replication-controller";

impl ReplicaSetLike for ReplicationController {
    const API_VERSION: &'static str = "v1";
    const KIND: &'static str = "ReplicationController";
    const QUEUE: &'static str = "replicationmanager";

    fn as_replica_set(&self) -> Cow<'_, ReplicaSet> {
        Cow::Owned(to_replica_set(self))
    }

    fn with_status(&self, status: ReplicaSetStatus) -> Self {
        let mut out = self.clone();
        out.status = Some(status_from_replica_set(status));
        out
    }
}

/// Upstream's `convertRCtoRS`: the same metadata, the selector map as `matchLabels`.
fn to_replica_set(rc: &ReplicationController) -> ReplicaSet {
    let spec = rc.spec.as_ref().map(|s| ReplicaSetSpec {
        replicas: s.replicas,
        min_ready_seconds: s.min_ready_seconds,
        selector: LabelSelector {
            match_labels: s.selector.clone(),
            match_expressions: None,
        },
        template: s.template.clone(),
    });
    let status = rc.status.as_ref().map(|s| ReplicaSetStatus {
        replicas: s.replicas,
        fully_labeled_replicas: s.fully_labeled_replicas,
        ready_replicas: s.ready_replicas,
        available_replicas: s.available_replicas,
        observed_generation: s.observed_generation,
        terminating_replicas: None,
        conditions: s.conditions.as_ref().map(|cs| {
            cs.iter()
                .map(|c| ReplicaSetCondition {
                    type_: c.type_.clone(),
                    status: c.status.clone(),
                    reason: c.reason.clone(),
                    message: c.message.clone(),
                    last_transition_time: c.last_transition_time.clone(),
                })
                .collect()
        }),
    });
    ReplicaSet {
        metadata: rc.metadata.clone(),
        spec,
        status,
    }
}

/// Upstream's `convertRStoRC` for the status the controller computed.
fn status_from_replica_set(s: ReplicaSetStatus) -> ReplicationControllerStatus {
    ReplicationControllerStatus {
        replicas: s.replicas,
        fully_labeled_replicas: s.fully_labeled_replicas,
        ready_replicas: s.ready_replicas,
        available_replicas: s.available_replicas,
        observed_generation: s.observed_generation,
        conditions: s.conditions.map(|cs| {
            cs.into_iter()
                .map(|c| ReplicationControllerCondition {
                    type_: c.type_,
                    status: c.status,
                    reason: c.reason,
                    message: c.message,
                    last_transition_time: c.last_transition_time,
                })
                .collect()
        }),
    }
}

pub async fn run(client: kube::Client, informers: SharedInformerFactory) -> anyhow::Result<()> {
    replicaset::run_for::<ReplicationController>(client, informers, COMPONENT).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodTemplateSpec, ReplicationControllerSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    #[test]
    fn a_replication_controller_reads_as_a_replica_set_and_back() {
        let rc = ReplicationController {
            metadata: ObjectMeta {
                name: Some("web".into()),
                generation: Some(2),
                ..Default::default()
            },
            spec: Some(ReplicationControllerSpec {
                replicas: Some(3),
                min_ready_seconds: Some(5),
                selector: Some([("app".to_string(), "web".to_string())].into()),
                template: Some(PodTemplateSpec::default()),
            }),
            status: Some(ReplicationControllerStatus {
                replicas: 1,
                conditions: Some(vec![ReplicationControllerCondition {
                    type_: "ReplicaFailure".into(),
                    status: "True".into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        };
        let rs = rc.as_replica_set();
        let spec = rs.spec.as_ref().expect("spec");
        assert_eq!(spec.replicas, Some(3));
        assert_eq!(spec.min_ready_seconds, Some(5));
        assert_eq!(
            spec.selector.match_labels,
            rc.spec.as_ref().and_then(|s| s.selector.clone())
        );
        assert!(spec.selector.match_expressions.is_none());
        assert_eq!(rs.metadata.name.as_deref(), Some("web"));
        assert_eq!(rs.status.as_ref().map(|s| s.replicas), Some(1));

        let back = rc.with_status(ReplicaSetStatus {
            replicas: 3,
            fully_labeled_replicas: Some(3),
            ready_replicas: Some(2),
            available_replicas: Some(1),
            observed_generation: Some(2),
            conditions: None,
            terminating_replicas: None,
        });
        let st = back.status.expect("status");
        assert_eq!(
            (
                st.replicas,
                st.fully_labeled_replicas,
                st.ready_replicas,
                st.available_replicas
            ),
            (3, Some(3), Some(2), Some(1))
        );
        assert_eq!(st.observed_generation, Some(2));
        assert!(st.conditions.is_none());
        assert_eq!(back.spec, rc.spec, "only the status is written");
    }
}
