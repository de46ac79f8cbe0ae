//! Server-side printing: the `meta.k8s.io/v1` `Table` that `kubectl get` renders.
//!
//! Columns and cells follow upstream's `pkg/printers/internalversion/printers.go`. As upstream's
//! API server does, every cell is filled, wide (`priority: 1`) ones too: kubectl hides those
//! unless `-o wide`. Each row carries the object's metadata as a `PartialObjectMetadata`, which
//! kubectl needs for `--show-labels`, `-L` and `-A`.

mod apiregistration;
mod apps;
mod autoscaling;
mod certificates;
mod core;
mod csi;
mod flowcontrol;
mod format;
mod networking;
mod node;
mod rbac;
mod storage;

use jiff::Timestamp;
use serde_json::{Map, Value, json};

use crate::registry::Resource;

pub use format::human_duration;

/// One column of a table (upstream's `TableColumnDefinition`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Column {
    pub name: &'static str,
    pub ty: &'static str,
    pub format: &'static str,
    pub description: &'static str,
    pub priority: i32,
}

impl Column {
    pub(crate) const fn new(name: &'static str, ty: &'static str, description: &'static str) -> Self {
        Column {
            name,
            ty,
            format: "",
            description,
            priority: 0,
        }
    }

    pub(crate) const fn wide(name: &'static str, ty: &'static str, description: &'static str) -> Self {
        Column {
            name,
            ty,
            format: "",
            description,
            priority: 1,
        }
    }

    fn to_json(self) -> Value {
        json!({
            "name": self.name,
            "type": self.ty,
            "format": self.format,
            "description": self.description,
            "priority": self.priority,
        })
    }
}

pub(crate) const NAME_DESC: &str = "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names";
pub(crate) const AGE_DESC: &str = "CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null for lists. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata";
pub(crate) const CONTAINERS_DESC: &str = "Names of each container in the template.";
pub(crate) const IMAGES_DESC: &str = "Images referenced by each container in the template.";

/// The Name column (format `name`).
pub(crate) const NAME: Column = Column {
    name: "Name",
    ty: "string",
    format: "name",
    description: NAME_DESC,
    priority: 0,
};
/// The Age column.
pub(crate) const AGE: Column = Column::new("Age", "string", AGE_DESC);

/// What a resource prints as: its columns and the cells of one object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Printer {
    Namespace,
    Node,
    Pod,
    Event,
    Secret,
    ConfigMap,
    Service,
    Endpoints,
    ComponentStatus,
    ServiceAccount,
    PersistentVolume,
    PersistentVolumeClaim,
    Deployment,
    ReplicaSet,
    ReplicationController,
    StatefulSet,
    DaemonSet,
    ControllerRevision,
    Job,
    CronJob,
    Lease,
    PodDisruptionBudget,
    HorizontalPodAutoscaler,
    PodTemplate,
    WebhookConfiguration,
    ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding,
    ResourceQuota,
    LimitRange,
    PriorityClass,
    StorageClass,
    CSINode,
    CertificateSigningRequest,
    EndpointSlice,
    IPAddress,
    ServiceCIDR,
    Ingress,
    IngressClass,
    NetworkPolicy,
    RuntimeClass,
    APIService,
    FlowSchema,
    PriorityLevelConfiguration,
    CSIDriver,
    VolumeAttachment,
    CSIStorageCapacity,
    RoleBinding,
    ClusterRoleBinding,
    /// Upstream's default table (`rest.NewDefaultTableConvertor`): Role, ClusterRole,
    /// CustomResourceDefinition.
    CreatedAt,
    Default,
}

fn printer_for(res: &Resource) -> Printer {
    match (res.group, res.kind) {
        ("", "Namespace") => Printer::Namespace,
        ("", "Node") => Printer::Node,
        ("", "Pod") => Printer::Pod,
        ("", "Event") | ("events.k8s.io", "Event") => Printer::Event,
        ("", "Secret") => Printer::Secret,
        ("", "ConfigMap") => Printer::ConfigMap,
        ("", "Service") => Printer::Service,
        ("", "Endpoints") => Printer::Endpoints,
        ("", "ComponentStatus") => Printer::ComponentStatus,
        ("", "ServiceAccount") => Printer::ServiceAccount,
        ("", "PersistentVolume") => Printer::PersistentVolume,
        ("", "PersistentVolumeClaim") => Printer::PersistentVolumeClaim,
        ("apps", "Deployment") => Printer::Deployment,
        ("apps", "ReplicaSet") => Printer::ReplicaSet,
        ("", "ReplicationController") => Printer::ReplicationController,
        ("apps", "StatefulSet") => Printer::StatefulSet,
        ("apps", "DaemonSet") => Printer::DaemonSet,
        ("apps", "ControllerRevision") => Printer::ControllerRevision,
        ("batch", "Job") => Printer::Job,
        ("batch", "CronJob") => Printer::CronJob,
        ("coordination.k8s.io", "Lease") => Printer::Lease,
        ("policy", "PodDisruptionBudget") => Printer::PodDisruptionBudget,
        ("", "PodTemplate") => Printer::PodTemplate,
        ("admissionregistration.k8s.io", "ValidatingWebhookConfiguration" | "MutatingWebhookConfiguration") => {
            Printer::WebhookConfiguration
        }
        ("admissionregistration.k8s.io", "ValidatingAdmissionPolicy") => Printer::ValidatingAdmissionPolicy,
        ("admissionregistration.k8s.io", "ValidatingAdmissionPolicyBinding") => {
            Printer::ValidatingAdmissionPolicyBinding
        }
        ("", "ResourceQuota") => Printer::ResourceQuota,
        ("", "LimitRange") => Printer::LimitRange,
        ("autoscaling", "HorizontalPodAutoscaler") => Printer::HorizontalPodAutoscaler,
        ("scheduling.k8s.io", "PriorityClass") => Printer::PriorityClass,
        ("storage.k8s.io", "StorageClass") => Printer::StorageClass,
        ("storage.k8s.io", "CSINode") => Printer::CSINode,
        ("certificates.k8s.io", "CertificateSigningRequest") => Printer::CertificateSigningRequest,
        ("discovery.k8s.io", "EndpointSlice") => Printer::EndpointSlice,
        ("networking.k8s.io", "IPAddress") => Printer::IPAddress,
        ("networking.k8s.io", "ServiceCIDR") => Printer::ServiceCIDR,
        ("networking.k8s.io", "Ingress") => Printer::Ingress,
        ("networking.k8s.io", "IngressClass") => Printer::IngressClass,
        ("networking.k8s.io", "NetworkPolicy") => Printer::NetworkPolicy,
        ("node.k8s.io", "RuntimeClass") => Printer::RuntimeClass,
        ("apiregistration.k8s.io", "APIService") => Printer::APIService,
        ("flowcontrol.apiserver.k8s.io", "FlowSchema") => Printer::FlowSchema,
        ("flowcontrol.apiserver.k8s.io", "PriorityLevelConfiguration") => Printer::PriorityLevelConfiguration,
        ("storage.k8s.io", "CSIDriver") => Printer::CSIDriver,
        ("storage.k8s.io", "VolumeAttachment") => Printer::VolumeAttachment,
        ("storage.k8s.io", "CSIStorageCapacity") => Printer::CSIStorageCapacity,
        ("rbac.authorization.k8s.io", "RoleBinding") => Printer::RoleBinding,
        ("rbac.authorization.k8s.io", "ClusterRoleBinding") => Printer::ClusterRoleBinding,
        ("rbac.authorization.k8s.io", "Role" | "ClusterRole") => Printer::CreatedAt,
        ("apiextensions.k8s.io", "CustomResourceDefinition") => Printer::CreatedAt,
        _ => Printer::Default,
    }
}

fn columns(printer: Printer) -> &'static [Column] {
    match printer {
        Printer::Namespace => core::NAMESPACE_COLUMNS,
        Printer::Node => core::NODE_COLUMNS,
        Printer::Pod => core::POD_COLUMNS,
        Printer::Event => core::EVENT_COLUMNS,
        Printer::Secret => core::SECRET_COLUMNS,
        Printer::ConfigMap => core::CONFIGMAP_COLUMNS,
        Printer::Service => core::SERVICE_COLUMNS,
        Printer::Endpoints => core::ENDPOINTS_COLUMNS,
        Printer::ComponentStatus => core::COMPONENTSTATUS_COLUMNS,
        Printer::ServiceAccount => core::SERVICEACCOUNT_COLUMNS,
        Printer::PersistentVolume => core::PV_COLUMNS,
        Printer::PersistentVolumeClaim => core::PVC_COLUMNS,
        Printer::Deployment => apps::DEPLOYMENT_COLUMNS,
        Printer::ReplicaSet => apps::REPLICASET_COLUMNS,
        Printer::ReplicationController => apps::REPLICATIONCONTROLLER_COLUMNS,
        Printer::StatefulSet => apps::STATEFULSET_COLUMNS,
        Printer::DaemonSet => apps::DAEMONSET_COLUMNS,
        Printer::ControllerRevision => apps::CONTROLLERREVISION_COLUMNS,
        Printer::Job => apps::JOB_COLUMNS,
        Printer::CronJob => apps::CRONJOB_COLUMNS,
        Printer::Lease => apps::LEASE_COLUMNS,
        Printer::PodDisruptionBudget => apps::PDB_COLUMNS,
        Printer::PodTemplate => apps::PODTEMPLATE_COLUMNS,
        Printer::WebhookConfiguration => apps::WEBHOOK_CONFIGURATION_COLUMNS,
        Printer::ValidatingAdmissionPolicy => apps::VALIDATING_ADMISSION_POLICY_COLUMNS,
        Printer::ValidatingAdmissionPolicyBinding => apps::VALIDATING_ADMISSION_POLICY_BINDING_COLUMNS,
        Printer::ResourceQuota => core::RESOURCEQUOTA_COLUMNS,
        Printer::LimitRange => core::LIMITRANGE_COLUMNS,
        Printer::HorizontalPodAutoscaler => autoscaling::HPA_COLUMNS,
        Printer::PriorityClass => apps::PRIORITYCLASS_COLUMNS,
        Printer::StorageClass => storage::STORAGECLASS_COLUMNS,
        Printer::CSINode => storage::CSINODE_COLUMNS,
        Printer::CertificateSigningRequest => certificates::CSR_COLUMNS,
        Printer::EndpointSlice => networking::ENDPOINTSLICE_COLUMNS,
        Printer::IPAddress => networking::IPADDRESS_COLUMNS,
        Printer::ServiceCIDR => networking::SERVICECIDR_COLUMNS,
        Printer::Ingress => networking::INGRESS_COLUMNS,
        Printer::IngressClass => networking::INGRESSCLASS_COLUMNS,
        Printer::NetworkPolicy => networking::NETWORKPOLICY_COLUMNS,
        Printer::RuntimeClass => node::RUNTIMECLASS_COLUMNS,
        Printer::APIService => apiregistration::APISERVICE_COLUMNS,
        Printer::FlowSchema => flowcontrol::FLOWSCHEMA_COLUMNS,
        Printer::PriorityLevelConfiguration => flowcontrol::PRIORITYLEVEL_COLUMNS,
        Printer::CSIDriver => csi::CSIDRIVER_COLUMNS,
        Printer::VolumeAttachment => csi::VOLUMEATTACHMENT_COLUMNS,
        Printer::CSIStorageCapacity => csi::CSISTORAGECAPACITY_COLUMNS,
        Printer::RoleBinding => rbac::ROLEBINDING_COLUMNS,
        Printer::ClusterRoleBinding => rbac::CLUSTERROLEBINDING_COLUMNS,
        Printer::CreatedAt => rbac::ROLE_COLUMNS,
        Printer::Default => DEFAULT_COLUMNS,
    }
}

const DEFAULT_COLUMNS: &[Column] = &[NAME, AGE];

/// A custom resource's printer columns (after the Name column), as its definition lists them.
fn custom_columns(res: &Resource) -> Option<Vec<crate::apiextensions::PrinterColumn>> {
    let def = crate::apiextensions::definition(res)?;
    def.version(res.version).map(|v| v.columns.clone())
}

/// The column definitions of the resource's table, as JSON objects
/// `{name, type, format, description, priority}`.
pub fn column_definitions(res: &Resource) -> Vec<Value> {
    if let Some(cols) = custom_columns(res) {
        let mut out = vec![NAME.to_json()];
        out.extend(cols.iter().map(crate::apiextensions::columns::definition));
        return out;
    }
    columns(printer_for(res)).iter().map(|c| c.to_json()).collect()
}

/// The cells of one object's row, one per column definition (wide ones included).
pub fn row_cells(res: &Resource, obj: &Value, now: Timestamp) -> Vec<Value> {
    if let Some(cols) = custom_columns(res) {
        let mut out = vec![json!(format::name(obj))];
        out.extend(cols.iter().map(|c| crate::apiextensions::columns::cell(c, obj, now)));
        return out;
    }
    match printer_for(res) {
        Printer::Namespace => core::namespace(obj, now),
        Printer::Node => core::node(obj, now),
        Printer::Pod => core::pod(obj, now),
        Printer::Event => core::event(obj, now),
        Printer::Secret => core::secret(obj, now),
        Printer::ConfigMap => core::configmap(obj, now),
        Printer::Service => core::service(obj, now),
        Printer::Endpoints => core::endpoints(obj, now),
        Printer::ComponentStatus => core::componentstatus(obj),
        Printer::ServiceAccount => core::serviceaccount(obj, now),
        Printer::PersistentVolume => core::persistentvolume(obj, now),
        Printer::PersistentVolumeClaim => core::persistentvolumeclaim(obj, now),
        Printer::Deployment => apps::deployment(obj, now),
        Printer::ReplicaSet => apps::replicaset(obj, now),
        Printer::ReplicationController => apps::replicationcontroller(obj, now),
        Printer::StatefulSet => apps::statefulset(obj, now),
        Printer::DaemonSet => apps::daemonset(obj, now),
        Printer::ControllerRevision => apps::controllerrevision(obj, now),
        Printer::Job => apps::job(obj, now),
        Printer::CronJob => apps::cronjob(obj, now),
        Printer::Lease => apps::lease(obj, now),
        Printer::PodDisruptionBudget => apps::poddisruptionbudget(obj, now),
        Printer::PodTemplate => apps::podtemplate(obj),
        Printer::WebhookConfiguration => apps::webhook_configuration(obj, now),
        Printer::ValidatingAdmissionPolicy => apps::validating_admission_policy(obj, now),
        Printer::ValidatingAdmissionPolicyBinding => apps::validating_admission_policy_binding(obj, now),
        Printer::ResourceQuota => core::resourcequota(obj, now),
        Printer::LimitRange => core::limitrange(obj),
        Printer::HorizontalPodAutoscaler => autoscaling::horizontalpodautoscaler(obj, now),
        Printer::PriorityClass => apps::priorityclass(obj, now),
        Printer::StorageClass => storage::storageclass(obj, now),
        Printer::CSINode => storage::csinode(obj, now),
        Printer::CertificateSigningRequest => certificates::csr(obj, now),
        Printer::EndpointSlice => networking::endpointslice(obj, now),
        Printer::IPAddress => networking::ipaddress(obj, now),
        Printer::ServiceCIDR => networking::servicecidr(obj, now),
        Printer::Ingress => networking::ingress(obj, now),
        Printer::IngressClass => networking::ingressclass(obj, now),
        Printer::NetworkPolicy => networking::networkpolicy(obj, now),
        Printer::RuntimeClass => node::runtimeclass(obj, now),
        Printer::APIService => apiregistration::apiservice(obj, now),
        Printer::FlowSchema => flowcontrol::flowschema(obj, now),
        Printer::PriorityLevelConfiguration => flowcontrol::prioritylevelconfiguration(obj, now),
        Printer::CSIDriver => csi::csidriver(obj, now),
        Printer::VolumeAttachment => csi::volumeattachment(obj, now),
        Printer::CSIStorageCapacity => csi::csistoragecapacity(obj),
        Printer::RoleBinding | Printer::ClusterRoleBinding => rbac::binding(obj, now),
        Printer::CreatedAt => rbac::created_at(obj),
        Printer::Default => vec![json!(format::name(obj)), json!(format::age(obj, now))],
    }
}

/// The object's metadata as a `meta.k8s.io/v1` `PartialObjectMetadata`.
pub fn partial_object_metadata(obj: &Value) -> Value {
    let metadata = obj
        .get("metadata")
        .cloned()
        .unwrap_or_else(|| Value::Object(Map::new()));
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata,
    })
}

/// One `TableRow`: cells, the row conditions upstream sets (completed pods), and the object's
/// metadata.
pub fn row(res: &Resource, obj: &Value, now: Timestamp) -> Value {
    let mut row = Map::new();
    row.insert("cells".into(), Value::Array(row_cells(res, obj, now)));
    if printer_for(res) == Printer::Pod
        && let Some(conditions) = core::pod_row_conditions(obj)
    {
        row.insert("conditions".into(), conditions);
    }
    row.insert("object".into(), partial_object_metadata(obj));
    Value::Object(row)
}

/// The whole `meta.k8s.io/v1` `Table` for these objects. Without `include_column_defs` (the
/// events of a watch after the first) the column definitions are left empty, as upstream does
/// with `noHeaders`. Empty `resource_version` / `continue_token` are omitted.
pub fn table(
    res: &Resource,
    objs: &[&Value],
    now: Timestamp,
    include_column_defs: bool,
    resource_version: &str,
    continue_token: Option<&str>,
) -> Value {
    let mut metadata = Map::new();
    if !resource_version.is_empty() {
        metadata.insert("resourceVersion".into(), json!(resource_version));
    }
    if let Some(c) = continue_token.filter(|c| !c.is_empty()) {
        metadata.insert("continue".into(), json!(c));
    }
    let column_defs = if include_column_defs {
        column_definitions(res)
    } else {
        Vec::new()
    };
    let rows: Vec<Value> = objs.iter().map(|o| row(res, o, now)).collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata,
        "columnDefinitions": column_defs,
        "rows": rows,
    })
}

#[cfg(test)]
mod tests;
