//! The Endpoints controller (upstream's `pkg/controller/endpoint`): the legacy `v1` Endpoints of
//! every Service with a selector, for the clients that still read them. Ready pods are
//! `addresses`, others `notReadyAddresses` (all are addresses with `publishNotReadyAddresses`),
//! terminating pods are left out, and addresses with the same resolved ports share a subset,
//! repacked as upstream's `RepackSubsets` does. Written only when it changes.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{EndpointAddress, EndpointPort, EndpointSubset, Endpoints, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{DeleteParams, PostParams};

use crate::controller_utils::{self as cu, WorkQueue};
use crate::endpointutil::{self, Caches};

/// The label upstream's controller puts on the Endpoints it manages.
pub const LABEL_MANAGED_BY: &str = "endpoints.kubernetes.io/managed-by";
pub const CONTROLLER_NAME: &str = "endpoint-controller";

pub async fn run(client: kube::Client, informers: crate::informers::SharedInformerFactory) -> anyhow::Result<()> {
    let queue = WorkQueue::new();
    let caches = endpointutil::watch(&client, &queue, &informers);
    queue.run("endpoints", |key| sync(&client, &caches, key)).await
}

async fn sync(client: &kube::Client, caches: &Caches, key: String) -> anyhow::Result<Option<Duration>> {
    let (ns, name) = cu::split_key(&key);
    let api: Api<Endpoints> = Api::namespaced(client.clone(), ns);
    let svc = caches
        .services
        .state()
        .into_iter()
        .find(|s| s.metadata.namespace.as_deref() == Some(ns) && s.metadata.name.as_deref() == Some(name));
    let current = api.get_opt(name).await?;
    let Some(svc) = svc else {
        // The Service is gone: so are its Endpoints, if this controller made them.
        if current.as_ref().is_some_and(managed) {
            cu::delete_ignoring_missing(&api, name, &DeleteParams::default()).await?;
        }
        return Ok(None);
    };
    if endpointutil::selector(&svc).is_none() {
        // Selectorless Services' Endpoints are their owners' to write.
        return Ok(None);
    }
    let subsets = subsets(&svc, caches);
    let mut labels = endpointutil::service_labels(&svc);
    labels.insert(LABEL_MANAGED_BY.into(), CONTROLLER_NAME.into());
    match current {
        Some(mut ep) => {
            let same_labels = ep.metadata.labels.as_ref() == Some(&labels);
            if ep.subsets.as_deref().unwrap_or_default() == subsets.as_slice() && same_labels {
                return Ok(None);
            }
            ep.subsets = (!subsets.is_empty()).then_some(subsets);
            ep.metadata.labels = Some(labels);
            match api.replace(name, &PostParams::default(), &ep).await {
                Ok(_) => Ok(None),
                Err(e) if cu::is_conflict(&e) || cu::is_not_found(&e) => Ok(Some(Duration::from_millis(50))),
                Err(e) => Err(e.into()),
            }
        }
        None => {
            let ep = Endpoints {
                metadata: ObjectMeta {
                    name: Some(name.to_string()),
                    namespace: Some(ns.to_string()),
                    labels: Some(labels),
                    ..Default::default()
                },
                subsets: (!subsets.is_empty()).then_some(subsets),
            };
            match api.create(&PostParams::default(), &ep).await {
                Ok(_) => Ok(None),
                Err(e) if cu::is_namespace_terminating(&e) => Ok(None),
                Err(e) if cu::is_already_exists(&e) => Ok(Some(Duration::from_millis(50))),
                Err(e) => Err(e.into()),
            }
        }
    }
}

fn managed(ep: &Endpoints) -> bool {
    ep.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_MANAGED_BY))
        .is_some_and(|v| v == CONTROLLER_NAME)
}

/// The subsets of the Service's Endpoints: one per set of resolved ports, addresses sorted.
fn subsets(svc: &Service, caches: &Caches) -> Vec<EndpointSubset> {
    let publish = svc
        .spec
        .as_ref()
        .and_then(|s| s.publish_not_ready_addresses)
        .unwrap_or(false);
    type Ports = Vec<(String, i32, String)>;
    let mut groups: BTreeMap<Ports, (Vec<EndpointAddress>, Vec<EndpointAddress>)> = BTreeMap::new();
    for pod in endpointutil::selected_pods(caches, svc) {
        if !endpointutil::should_pod_be_in_endpoints(&pod, false) {
            continue;
        }
        let mut ports: Ports = svc
            .spec
            .as_ref()
            .and_then(|s| s.ports.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|sp| {
                endpointutil::find_port(&pod, sp).map(|port| {
                    (
                        sp.name.clone().unwrap_or_default(),
                        port,
                        sp.protocol.clone().unwrap_or_else(|| "TCP".into()),
                    )
                })
            })
            .collect();
        ports.sort();
        let address = EndpointAddress {
            ip: pod.status.as_ref().and_then(|s| s.pod_ip.clone()).unwrap_or_default(),
            hostname: endpointutil::endpoint_hostname(&pod, svc),
            node_name: endpointutil::node_name(&pod),
            target_ref: Some(endpointutil::pod_reference(&pod)),
        };
        let entry = groups.entry(ports).or_default();
        if publish || cu::is_pod_ready(&pod) {
            entry.0.push(address);
        } else {
            entry.1.push(address);
        }
    }
    groups
        .into_iter()
        .map(|(ports, (mut ready, mut not_ready))| {
            ready.sort_by(|a, b| a.ip.cmp(&b.ip));
            not_ready.sort_by(|a, b| a.ip.cmp(&b.ip));
            EndpointSubset {
                addresses: (!ready.is_empty()).then_some(ready),
                not_ready_addresses: (!not_ready.is_empty()).then_some(not_ready),
                ports: (!ports.is_empty()).then(|| {
                    ports
                        .into_iter()
                        .map(|(name, port, protocol)| EndpointPort {
                            name: (!name.is_empty()).then_some(name),
                            port,
                            protocol: Some(protocol),
                            app_protocol: None,
                        })
                        .collect()
                }),
            }
        })
        .collect()
}
