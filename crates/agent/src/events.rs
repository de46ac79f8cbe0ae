//! The agent's events, recorded through the one recorder every component uses
//! (`skiff_record`: upstream's correlator folds repeats into counts, a bounded queue, never
//! waiting for the write): the kubelet's (source component `kubelet`, its node as source host
//! and reporting instance) and those of the node's volume provisioner (its own component).

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use skiff_record::Options;

pub use skiff_record::{EventRecorder as Recorder, NORMAL, WARNING};

/// Writes in flight at once: a burst of pod starts records several events per container.
const CONCURRENCY: usize = 8;

/// The kubelet's recorder for node `node`.
pub fn kubelet(client: kube::Client, node: &str) -> Recorder {
    Recorder::new(
        client,
        Options {
            host: Some(node.to_string()),
            reporting_instance: Some(node.to_string()),
            concurrency: CONCURRENCY,
            ..Options::component("kubelet")
        },
    )
}

/// A recorder whose events come from `component` (an external provisioner names itself), with
/// no source host, as client-go's recorder leaves it when its source has none.
pub fn component(client: kube::Client, component: &str) -> Recorder {
    Recorder::new(
        client,
        Options {
            reporting_instance: None,
            ..Options::component(component)
        },
    )
}

/// A pod's reference, or one of its containers' (`field_path` as [`container_field_path`]).
pub fn pod_reference(pod: &Pod, field_path: Option<String>) -> ObjectReference {
    ObjectReference {
        field_path,
        namespace: Some(pod.metadata.namespace.clone().unwrap_or_else(|| "default".into())),
        ..skiff_record::reference(pod)
    }
}

/// The field path of a container in a pod, as upstream's references carry it.
pub fn container_field_path(init: bool, name: &str) -> String {
    if init {
        format!("spec.initContainers{{{name}}}")
    } else {
        format!("spec.containers{{{name}}}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_references_name_the_container() {
        let mut pod = Pod::default();
        pod.metadata.name = Some("p".into());
        pod.metadata.uid = Some("u".into());
        let r = pod_reference(&pod, Some(container_field_path(true, "init")));
        assert_eq!(r.kind.as_deref(), Some("Pod"));
        assert_eq!(r.api_version.as_deref(), Some("v1"));
        assert_eq!(r.namespace.as_deref(), Some("default"));
        assert_eq!(r.uid.as_deref(), Some("u"));
        assert_eq!(r.field_path.as_deref(), Some("spec.initContainers{init}"));
    }
}
