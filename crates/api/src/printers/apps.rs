//! Printers for workloads and the smaller groups: deployments, replica sets, replication
//! controllers, stateful sets,
//! daemon sets, controller revisions, jobs, cron jobs, leases, pod disruption budgets and
//! priority classes.

use jiff::Timestamp;
use serde_json::{Value, json};

use super::format::{
    age, array_at, container_cells, format_label_selector, format_labels, human_duration, int_at, int_or_string,
    is_set, name, since, str_at, timestamp,
};
use super::{AGE, CONTAINERS_DESC, Column, IMAGES_DESC, NAME};

const CONTAINERS: Column = Column::wide("Containers", "string", CONTAINERS_DESC);
const IMAGES: Column = Column::wide("Images", "string", IMAGES_DESC);

/// `spec.replicas`, which defaulting sets to 1 when absent.
fn desired_replicas(obj: &Value) -> i64 {
    obj.pointer("/spec/replicas").and_then(Value::as_i64).unwrap_or(1)
}

// --- deployments ----------------------------------------------------------------------------

pub(crate) const DEPLOYMENT_COLUMNS: &[Column] = &[
    NAME,
    Column::new("Ready", "string", "Number of the pod with ready state"),
    Column::new(
        "Up-to-date",
        "string",
        "Total number of non-terminated pods targeted by this deployment that have the desired template spec.",
    ),
    Column::new(
        "Available",
        "string",
        "Total number of available pods (ready for at least minReadySeconds) targeted by this deployment.",
    ),
    AGE,
    CONTAINERS,
    IMAGES,
    Column::wide(
        "Selector",
        "string",
        "Label selector for pods. Existing ReplicaSets whose pods are selected by this will be the ones affected by this deployment.",
    ),
];

pub(crate) fn deployment(obj: &Value, now: Timestamp) -> Vec<Value> {
    let (containers, images) = container_cells(obj.pointer("/spec/template/spec"));
    vec![
        json!(name(obj)),
        json!(format!(
            "{}/{}",
            int_at(obj, "/status/readyReplicas"),
            desired_replicas(obj)
        )),
        json!(int_at(obj, "/status/updatedReplicas")),
        json!(int_at(obj, "/status/availableReplicas")),
        json!(age(obj, now)),
        json!(containers),
        json!(images),
        json!(super::format::selector_string(obj.pointer("/spec/selector"))),
    ]
}

// --- replica sets ---------------------------------------------------------------------------

pub(crate) const REPLICASET_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "Desired",
        "integer",
        "Replicas is the number of desired replicas. This is a pointer to distinguish between explicit zero and unspecified. Defaults to 1. More info: https://kubernetes.io/docs/concepts/workloads/controllers/replicationcontroller/#what-is-a-replicationcontroller",
    ),
    Column::new(
        "Current",
        "integer",
        "Replicas is the most recently observed number of replicas. More info: https://kubernetes.io/docs/concepts/workloads/controllers/replicationcontroller/#what-is-a-replicationcontroller",
    ),
    Column::new("Ready", "integer", "The number of ready replicas for this replica set."),
    AGE,
    CONTAINERS,
    IMAGES,
    Column::wide(
        "Selector",
        "string",
        "Selector is a label query over pods that should match the replica count. Label keys and values that must match in order to be controlled by this replica set. It must match the pod template's labels. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors",
    ),
];

pub(crate) fn replicaset(obj: &Value, now: Timestamp) -> Vec<Value> {
    let (containers, images) = container_cells(obj.pointer("/spec/template/spec"));
    vec![
        json!(name(obj)),
        json!(desired_replicas(obj)),
        json!(int_at(obj, "/status/replicas")),
        json!(int_at(obj, "/status/readyReplicas")),
        json!(age(obj, now)),
        json!(containers),
        json!(images),
        json!(format_label_selector(obj.pointer("/spec/selector"))),
    ]
}

// --- replication controllers --------------------------------------------------------------

pub(crate) const REPLICATIONCONTROLLER_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "Desired",
        "integer",
        "Replicas is the number of desired replicas. This is a pointer to distinguish between explicit zero and unspecified. Defaults to 1. More info: https://kubernetes.io/docs/concepts/workloads/controllers/replicationcontroller#what-is-a-replicationcontroller",
    ),
    Column::new(
        "Current",
        "integer",
        "Replicas is the most recently observed number of replicas. More info: https://kubernetes.io/docs/concepts/workloads/controllers/replicationcontroller#what-is-a-replicationcontroller",
    ),
    Column::new(
        "Ready",
        "integer",
        "The number of ready replicas for this replication controller.",
    ),
    AGE,
    CONTAINERS,
    IMAGES,
    Column::wide(
        "Selector",
        "string",
        "Selector is a label query over pods that should match the Replicas count. If Selector is empty, it is defaulted to the labels present on the Pod template. Label keys and values that must match in order to be controlled by this replication controller, if empty defaulted to labels on Pod template. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors",
    ),
];

/// Upstream's `printReplicationController`: the selector is a plain label map.
pub(crate) fn replicationcontroller(obj: &Value, now: Timestamp) -> Vec<Value> {
    let (containers, images) = container_cells(obj.pointer("/spec/template/spec"));
    vec![
        json!(name(obj)),
        json!(desired_replicas(obj)),
        json!(int_at(obj, "/status/replicas")),
        json!(int_at(obj, "/status/readyReplicas")),
        json!(age(obj, now)),
        json!(containers),
        json!(images),
        json!(format_labels(obj.pointer("/spec/selector"))),
    ]
}

// --- stateful sets --------------------------------------------------------------------------

pub(crate) const STATEFULSET_COLUMNS: &[Column] = &[
    NAME,
    Column::new("Ready", "string", "Number of the pod with ready state"),
    AGE,
    CONTAINERS,
    IMAGES,
];

pub(crate) fn statefulset(obj: &Value, now: Timestamp) -> Vec<Value> {
    let (containers, images) = container_cells(obj.pointer("/spec/template/spec"));
    vec![
        json!(name(obj)),
        json!(format!(
            "{}/{}",
            int_at(obj, "/status/readyReplicas"),
            desired_replicas(obj)
        )),
        json!(age(obj, now)),
        json!(containers),
        json!(images),
    ]
}

// --- daemon sets ----------------------------------------------------------------------------

pub(crate) const DAEMONSET_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "Desired",
        "integer",
        "The total number of nodes that should be running the daemon pod (including nodes correctly running the daemon pod). More info: https://kubernetes.io/docs/concepts/workloads/controllers/daemonset/",
    ),
    Column::new(
        "Current",
        "integer",
        "The number of nodes that are running at least 1 daemon pod and are supposed to run the daemon pod. More info: https://kubernetes.io/docs/concepts/workloads/controllers/daemonset/",
    ),
    Column::new(
        "Ready",
        "integer",
        "numberReady is the number of nodes that should be running the daemon pod and have one or more of the daemon pod running with a Ready Condition.",
    ),
    Column::new(
        "Up-to-date",
        "integer",
        "The total number of nodes that are running updated daemon pod",
    ),
    Column::new(
        "Available",
        "integer",
        "The number of nodes that should be running the daemon pod and have one or more of the daemon pod running and available (ready for at least spec.minReadySeconds)",
    ),
    Column::new(
        "Node Selector",
        "string",
        "NodeSelector is a selector which must be true for the pod to fit on a node. Selector which must match a node's labels for the pod to be scheduled on that node. More info: https://kubernetes.io/docs/concepts/configuration/assign-pod-node/",
    ),
    AGE,
    CONTAINERS,
    IMAGES,
    Column::wide(
        "Selector",
        "string",
        "A label query over pods that are managed by the daemon set. Must match in order to be controlled. It must match the pod template's labels. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors",
    ),
];

pub(crate) fn daemonset(obj: &Value, now: Timestamp) -> Vec<Value> {
    let (containers, images) = container_cells(obj.pointer("/spec/template/spec"));
    vec![
        json!(name(obj)),
        json!(int_at(obj, "/status/desiredNumberScheduled")),
        json!(int_at(obj, "/status/currentNumberScheduled")),
        json!(int_at(obj, "/status/numberReady")),
        json!(int_at(obj, "/status/updatedNumberScheduled")),
        json!(int_at(obj, "/status/numberAvailable")),
        json!(format_labels(obj.pointer("/spec/template/spec/nodeSelector"))),
        json!(age(obj, now)),
        json!(containers),
        json!(images),
        json!(format_label_selector(obj.pointer("/spec/selector"))),
    ]
}

// --- controller revisions -------------------------------------------------------------------

pub(crate) const CONTROLLERREVISION_COLUMNS: &[Column] = &[
    NAME,
    Column::new("Controller", "string", "Controller of the object"),
    Column::new(
        "Revision",
        "string",
        "Revision indicates the revision of the state represented by Data.",
    ),
    AGE,
];

pub(crate) fn controllerrevision(obj: &Value, now: Timestamp) -> Vec<Value> {
    let controller = array_at(obj, "/metadata/ownerReferences")
        .iter()
        .find(|r| r.get("controller").and_then(Value::as_bool) == Some(true))
        .map(|r| {
            let kind = str_at(r, "/kind");
            let owner = str_at(r, "/name");
            // The group of "apps/v1" is "apps"; of "v1" it is empty.
            let api_version = str_at(r, "/apiVersion");
            let group = api_version.rsplit_once('/').map(|(g, _)| g).unwrap_or_default();
            let group_kind = if group.is_empty() {
                kind.to_string()
            } else {
                format!("{kind}.{group}")
            };
            if group_kind.is_empty() {
                owner.to_string()
            } else {
                format!("{}/{owner}", group_kind.to_lowercase())
            }
        })
        .unwrap_or_else(|| "<none>".to_string());
    vec![
        json!(name(obj)),
        json!(controller),
        json!(int_at(obj, "/revision")),
        json!(age(obj, now)),
    ]
}

// --- jobs -----------------------------------------------------------------------------------

pub(crate) const JOB_COLUMNS: &[Column] = &[
    NAME,
    Column::new("Status", "string", "Status of the job."),
    Column::new(
        "Completions",
        "string",
        "The number of pods which reached phase Succeeded. The value increases monotonically for a given spec. However, it may decrease in reaction to scale down of elastic indexed jobs.",
    ),
    Column::new("Duration", "string", "Time required to complete the job."),
    AGE,
    CONTAINERS,
    IMAGES,
    Column::wide(
        "Selector",
        "string",
        "A label query over pods that should match the pod count. Normally, the system sets this field for you. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors",
    ),
];

/// Upstream's `hasJobCondition`: the first condition of the type decides.
fn has_job_condition(obj: &Value, ty: &str) -> bool {
    array_at(obj, "/status/conditions")
        .iter()
        .find(|c| str_at(c, "/type") == ty)
        .is_some_and(|c| str_at(c, "/status") == "True")
}

pub(crate) fn job(obj: &Value, now: Timestamp) -> Vec<Value> {
    let succeeded = int_at(obj, "/status/succeeded");
    let completions = match obj.pointer("/spec/completions").and_then(Value::as_i64) {
        Some(c) => format!("{succeeded}/{c}"),
        None => {
            let parallelism = int_at(obj, "/spec/parallelism");
            if parallelism > 1 {
                format!("{succeeded}/1 of {parallelism}")
            } else {
                format!("{succeeded}/1")
            }
        }
    };
    let start = timestamp(obj.pointer("/status/startTime"));
    let completion = timestamp(obj.pointer("/status/completionTime"));
    let duration = match (start, completion) {
        (None, _) => String::new(),
        (Some(s), None) => human_duration(now.as_nanosecond() - s.as_nanosecond()),
        (Some(s), Some(c)) => human_duration(c.as_nanosecond() - s.as_nanosecond()),
    };
    let status = if has_job_condition(obj, "Complete") {
        "Complete"
    } else if has_job_condition(obj, "Failed") {
        "Failed"
    } else if is_set(obj, "/metadata/deletionTimestamp") {
        "Terminating"
    } else if has_job_condition(obj, "Suspended") {
        "Suspended"
    } else if has_job_condition(obj, "FailureTarget") {
        "FailureTarget"
    } else {
        "Running"
    };
    let (containers, images) = container_cells(obj.pointer("/spec/template/spec"));
    vec![
        json!(name(obj)),
        json!(status),
        json!(completions),
        json!(duration),
        json!(age(obj, now)),
        json!(containers),
        json!(images),
        json!(format_label_selector(obj.pointer("/spec/selector"))),
    ]
}

// --- cron jobs ------------------------------------------------------------------------------

pub(crate) const CRONJOB_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "Schedule",
        "string",
        "The schedule in Cron format, see https://en.wikipedia.org/wiki/Cron.",
    ),
    Column::new(
        "Timezone",
        "string",
        "The time zone name for the given schedule, see https://en.wikipedia.org/wiki/List_of_tz_database_time_zones. If not specified, this will default to the time zone of the kube-controller-manager process.",
    ),
    Column::new(
        "Suspend",
        "boolean",
        "This flag tells the controller to suspend subsequent executions, it does not apply to already started executions.  Defaults to false.",
    ),
    Column::new("Active", "integer", "A list of pointers to currently running jobs."),
    Column::new(
        "Last Schedule",
        "string",
        "Information when was the last time the job was successfully scheduled.",
    ),
    AGE,
    CONTAINERS,
    IMAGES,
    Column::wide(
        "Selector",
        "string",
        "A label query over pods that should match the pod count. Normally, the system sets this field for you. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors",
    ),
];

pub(crate) fn cronjob(obj: &Value, now: Timestamp) -> Vec<Value> {
    let last_schedule = match timestamp(obj.pointer("/status/lastScheduleTime")) {
        Some(t) => since(Some(t), now),
        None => "<none>".to_string(),
    };
    let time_zone = obj
        .pointer("/spec/timeZone")
        .and_then(Value::as_str)
        .unwrap_or("<none>");
    let suspend = match obj.pointer("/spec/suspend").and_then(Value::as_bool) {
        Some(true) => "True",
        Some(false) => "False",
        None => "<unset>",
    };
    let (containers, images) = container_cells(obj.pointer("/spec/jobTemplate/spec/template/spec"));
    vec![
        json!(name(obj)),
        json!(str_at(obj, "/spec/schedule")),
        json!(time_zone),
        json!(suspend),
        json!(array_at(obj, "/status/active").len()),
        json!(last_schedule),
        json!(age(obj, now)),
        json!(containers),
        json!(images),
        json!(format_label_selector(obj.pointer("/spec/jobTemplate/spec/selector"))),
    ]
}

// --- leases, pod disruption budgets, priority classes ---------------------------------------

pub(crate) const LEASE_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "Holder",
        "string",
        "holderIdentity contains the identity of the holder of a current lease. If Coordinated Leader Election is used, the holder identity must be equal to the elected LeaseCandidate.metadata.name field.",
    ),
    AGE,
];

pub(crate) fn lease(obj: &Value, now: Timestamp) -> Vec<Value> {
    vec![
        json!(name(obj)),
        json!(str_at(obj, "/spec/holderIdentity")),
        json!(age(obj, now)),
    ]
}

pub(crate) const PDB_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "Min Available",
        "string",
        "The minimum number of pods that must be available.",
    ),
    Column::new(
        "Max Unavailable",
        "string",
        "The maximum number of pods that may be unavailable.",
    ),
    Column::new(
        "Allowed Disruptions",
        "integer",
        "Calculated number of pods that may be disrupted at this time.",
    ),
    AGE,
];

pub(crate) fn poddisruptionbudget(obj: &Value, now: Timestamp) -> Vec<Value> {
    let field = |pointer: &str| {
        obj.pointer(pointer)
            .filter(|v| !v.is_null())
            .map(int_or_string)
            .unwrap_or_else(|| "N/A".to_string())
    };
    vec![
        json!(name(obj)),
        json!(field("/spec/minAvailable")),
        json!(field("/spec/maxUnavailable")),
        json!(int_at(obj, "/status/disruptionsAllowed")),
        json!(age(obj, now)),
    ]
}

pub(crate) const PRIORITYCLASS_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "Value",
        "integer",
        "value represents the integer value of this priority class. This is the actual priority that pods receive when they have the name of this class in their pod spec.",
    ),
    Column::new(
        "Global-Default",
        "boolean",
        "globalDefault specifies whether this PriorityClass should be considered as the default priority for pods that do not have any priority class. Only one PriorityClass can be marked as `globalDefault`. However, if more than one PriorityClasses exists with their `globalDefault` field set to true, the smallest value of such global default PriorityClasses will be used as the default priority.",
    ),
    AGE,
    Column::new(
        "PreemptionPolicy",
        "string",
        "preemptionPolicy is the Policy for preempting pods with lower priority. One of Never, PreemptLowerPriority. Defaults to PreemptLowerPriority if unset.",
    ),
];

pub(crate) fn priorityclass(obj: &Value, now: Timestamp) -> Vec<Value> {
    vec![
        json!(name(obj)),
        json!(int_at(obj, "/value")),
        json!(obj.get("globalDefault").and_then(Value::as_bool).unwrap_or(false)),
        json!(age(obj, now)),
        json!(str_at(obj, "/preemptionPolicy")),
    ]
}

// --- pod templates ----------------------------------------------------------------------------

pub(crate) const PODTEMPLATE_COLUMNS: &[Column] = &[
    NAME,
    Column::new("Containers", "string", CONTAINERS_DESC),
    Column::new("Images", "string", IMAGES_DESC),
    Column::new("Pod Labels", "string", "The labels for the pod template."),
];

pub(crate) fn podtemplate(obj: &Value) -> Vec<Value> {
    let (containers, images) = container_cells(obj.pointer("/template/spec"));
    vec![
        json!(name(obj)),
        json!(containers),
        json!(images),
        json!(format_labels(obj.pointer("/template/metadata/labels"))),
    ]
}

// --- webhook configurations -------------------------------------------------------------------

pub(crate) const WEBHOOK_CONFIGURATION_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "Webhooks",
        "integer",
        "Webhooks indicates the number of webhooks contained in this configuration.",
    ),
    AGE,
];

/// Validating and MutatingWebhookConfigurations alike: the number of webhooks.
pub(crate) const VALIDATING_ADMISSION_POLICY_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "Validations",
        "integer",
        "Validations indicates the number of validation rules defined in this configuration",
    ),
    Column::new(
        "ParamKind",
        "string",
        "ParamKind specifies the kind of resources used to parameterize this policy",
    ),
    AGE,
];

pub(crate) fn validating_admission_policy(obj: &Value, now: Timestamp) -> Vec<Value> {
    let n = obj
        .pointer("/spec/validations")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    let param_kind = match obj.pointer("/spec/paramKind") {
        Some(pk) if pk.is_object() => format!(
            "{}/{}",
            pk.get("apiVersion").and_then(Value::as_str).unwrap_or(""),
            pk.get("kind").and_then(Value::as_str).unwrap_or("")
        ),
        _ => "<unset>".to_string(),
    };
    vec![json!(name(obj)), json!(n), json!(param_kind), json!(age(obj, now))]
}

pub(crate) const VALIDATING_ADMISSION_POLICY_BINDING_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "PolicyName",
        "string",
        "PolicyName indicates the policy definition which the policy binding binded to",
    ),
    Column::new(
        "ParamRef",
        "string",
        "ParamRef indicates the param resource which sets the configration param",
    ),
    AGE,
];

pub(crate) fn validating_admission_policy_binding(obj: &Value, now: Timestamp) -> Vec<Value> {
    let policy = obj.pointer("/spec/policyName").and_then(Value::as_str).unwrap_or("");
    let param = match obj.pointer("/spec/paramRef").filter(|p| p.is_object()) {
        None => "<unset>".to_string(),
        Some(pr) => {
            let n = pr.get("name").and_then(Value::as_str).unwrap_or("");
            let ns = pr.get("namespace").and_then(Value::as_str).unwrap_or("");
            if !n.is_empty() {
                if ns.is_empty() {
                    format!("*/{n}")
                } else {
                    format!("{ns}/{n}")
                }
            } else {
                match pr.get("selector") {
                    Some(sel) => crate::selector::LabelSelector::from_label_selector_json(sel)
                        .map(|s| s.to_string())
                        .unwrap_or_default(),
                    None => "<unset>".to_string(),
                }
            }
        }
    };
    vec![json!(name(obj)), json!(policy), json!(param), json!(age(obj, now))]
}

pub(crate) fn webhook_configuration(obj: &Value, now: Timestamp) -> Vec<Value> {
    let n = obj.get("webhooks").and_then(Value::as_array).map_or(0, Vec::len);
    vec![json!(name(obj)), json!(n), json!(age(obj, now))]
}
