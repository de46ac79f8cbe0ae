//! The resource metrics API's types (`metrics.k8s.io/v1beta1`), as metrics-server defines them
//! (`k8s.io/metrics/pkg/apis/metrics/v1beta1`): only their schemas, which the OpenAPI documents
//! publish (the objects themselves are built as JSON by the API server).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use schemars::JsonSchema;

/// NodeMetrics sets resource usage metrics of a node.
#[derive(JsonSchema)]
#[schemars(rename = "io.k8s.metrics.pkg.apis.metrics.v1beta1.NodeMetrics")]
pub struct NodeMetrics {
    /// APIVersion defines the versioned schema of this representation of an object.
    #[schemars(rename = "apiVersion")]
    pub api_version: Option<String>,
    /// Kind is a string value representing the REST resource this object represents.
    pub kind: Option<String>,
    /// Standard object's metadata.
    pub metadata: Option<ObjectMeta>,
    /// The following fields define time interval from which metrics were collected from the
    /// interval [Timestamp-Window, Timestamp].
    pub timestamp: Time,
    pub window: String,
    /// The memory usage is the memory working set.
    pub usage: BTreeMap<String, Quantity>,
}

/// PodMetrics sets resource usage metrics of a pod.
#[derive(JsonSchema)]
#[schemars(rename = "io.k8s.metrics.pkg.apis.metrics.v1beta1.PodMetrics")]
pub struct PodMetrics {
    /// APIVersion defines the versioned schema of this representation of an object.
    #[schemars(rename = "apiVersion")]
    pub api_version: Option<String>,
    /// Kind is a string value representing the REST resource this object represents.
    pub kind: Option<String>,
    /// Standard object's metadata.
    pub metadata: Option<ObjectMeta>,
    /// The following fields define time interval from which metrics were collected from the
    /// interval [Timestamp-Window, Timestamp].
    pub timestamp: Time,
    pub window: String,
    /// Metrics for all containers are collected within the same time window.
    pub containers: Vec<ContainerMetrics>,
}

/// ContainerMetrics sets resource usage metrics of a container.
#[derive(JsonSchema)]
#[schemars(rename = "io.k8s.metrics.pkg.apis.metrics.v1beta1.ContainerMetrics")]
pub struct ContainerMetrics {
    /// Container name corresponding to the one from pod.spec.containers.
    pub name: String,
    /// The memory usage is the memory working set.
    pub usage: BTreeMap<String, Quantity>,
}
