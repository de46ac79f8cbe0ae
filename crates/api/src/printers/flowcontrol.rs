//! flowcontrol.apiserver.k8s.io: FlowSchema and PriorityLevelConfiguration, as upstream's
//! `printFlowSchema` and `printPriorityLevelConfiguration`.

use jiff::Timestamp;
use serde_json::{Value, json};

use super::format::{age, array_at, name, str_at};
use super::{AGE, Column, NAME};

pub(crate) const FLOWSCHEMA_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "PriorityLevel",
        "string",
        "`name` is the name of the priority level configuration being referenced Required.",
    ),
    Column::new(
        "MatchingPrecedence",
        "string",
        "`matchingPrecedence` is used to choose among the FlowSchemas that match a given request. The chosen FlowSchema is among those with the numerically lowest (which we take to be logically highest) MatchingPrecedence.  Each MatchingPrecedence value must be ranged in [1,10000]. Note that if the precedence is not specified, it will be set to 1000 as default.",
    ),
    Column::new(
        "DistinguisherMethod",
        "string",
        "`distinguisherMethod` defines how to compute the flow distinguisher for requests that match this schema. `nil` specifies that the distinguisher is disabled and thus will always be the empty string.",
    ),
    AGE,
    Column::new(
        "MissingPL",
        "string",
        "references a broken or non-existent PriorityLevelConfiguration",
    ),
];

pub(crate) const PRIORITYLEVEL_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "Type",
        "string",
        "`type` indicates whether this priority level is subject to limitation on request execution.  A value of `\"Exempt\"` means that requests of this priority level are not subject to a limit (and thus are never queued) and do not detract from the capacity made available to other priority levels.  A value of `\"Limited\"` means that (a) requests of this priority level _are_ subject to limits and (b) some of the server's limited capacity is made available exclusively to this priority level. Required.",
    ),
    Column::new(
        "NominalConcurrencyShares",
        "string",
        "`nominalConcurrencyShares` (NCS) contributes to the computation of the NominalConcurrencyLimit (NominalCL) of this level. This is the number of execution seats available at this priority level. This is used both for requests dispatched from this priority level as well as requests dispatched from other priority levels borrowing seats from this level. The server's concurrency limit (ServerCL) is divided among the Limited priority levels in proportion to their NCS values:\n\nNominalCL(i)  = ceil( ServerCL * NCS(i) / sum_ncs ) sum_ncs = sum[priority level k] NCS(k)\n\nBigger numbers mean a larger nominal concurrency limit, at the expense of every other priority level.\n\nIf not specified, this field defaults to a value of 30.\n\nSetting this field to zero supports the construction of a \"jail\" for this priority level that is used to hold some request(s)",
    ),
    Column::new(
        "Queues",
        "string",
        "`queues` is the number of queues for this priority level. The queues exist independently at each apiserver. The value must be positive.  Setting it to 1 effectively precludes shufflesharding and thus makes the distinguisher method of associated flow schemas irrelevant.  This field has a default value of 64.",
    ),
    Column::new(
        "HandSize",
        "string",
        "`handSize` is a small positive number that configures the shuffle sharding of requests into queues.  When enqueuing a request at this priority level the request's flow identifier (a string pair) is hashed and the hash value is used to shuffle the list of queues and deal a hand of the size specified here.  The request is put into one of the shortest queues in that hand. `handSize` must be no larger than `queues`, and should be significantly smaller (so that a few heavy flows do not saturate most of the queues).  See the user-facing documentation for more extensive guidance on setting this field.  This field has a default value of 8.",
    ),
    Column::new(
        "QueueLengthLimit",
        "string",
        "`queueLengthLimit` is the maximum number of requests allowed to be waiting in a given queue of this priority level at a time; excess requests are rejected.  This value must be positive.  If not specified, it will be defaulted to 50.",
    ),
    AGE,
];

/// MISSINGPL is the `Dangling` condition's status, `?` before the server has set it.
pub(crate) fn flowschema(obj: &Value, now: Timestamp) -> Vec<Value> {
    let distinguisher = match str_at(obj, "/spec/distinguisherMethod/type") {
        "" => "<none>",
        t => t,
    };
    let missing = array_at(obj, "/status/conditions")
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some("Dangling"))
        .map_or("?", |c| str_at(c, "/status"));
    vec![
        json!(name(obj)),
        json!(str_at(obj, "/spec/priorityLevelConfiguration/name")),
        obj.pointer("/spec/matchingPrecedence").cloned().unwrap_or(json!(0)),
        json!(distinguisher),
        json!(age(obj, now)),
        json!(missing),
    ]
}

/// Limited levels show their shares and queuing; the rest `<none>`.
pub(crate) fn prioritylevelconfiguration(obj: &Value, now: Timestamp) -> Vec<Value> {
    let none = || json!("<none>");
    let limited = obj.pointer("/spec/limited").filter(|l| !l.is_null());
    let shares = limited.map_or_else(none, |l| l.get("nominalConcurrencyShares").cloned().unwrap_or(json!(0)));
    let queuing = limited
        .and_then(|l| l.pointer("/limitResponse/queuing"))
        .filter(|q| !q.is_null());
    let q = |key: &str| queuing.map_or_else(none, |q| q.get(key).cloned().unwrap_or(json!(0)));
    vec![
        json!(name(obj)),
        json!(str_at(obj, "/spec/type")),
        shares,
        q("queues"),
        q("handSize"),
        q("queueLengthLimit"),
        json!(age(obj, now)),
    ]
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use crate::printers::{column_definitions, row_cells};
    use crate::registry::lookup;

    fn names(plural: &str) -> Vec<String> {
        let r = lookup("flowcontrol.apiserver.k8s.io", "v1", plural).expect("served");
        column_definitions(r)
            .iter()
            .map(|c| c["name"].as_str().unwrap_or("").to_string())
            .collect()
    }

    fn cells(plural: &str, obj: &Value) -> Vec<Value> {
        let r = lookup("flowcontrol.apiserver.k8s.io", "v1", plural).expect("served");
        let now = "2024-05-01T12:00:00Z".parse().expect("time");
        row_cells(r, obj, now)
    }

    #[test]
    fn flow_schema_rows() {
        assert_eq!(
            names("flowschemas"),
            [
                "Name",
                "PriorityLevel",
                "MatchingPrecedence",
                "DistinguisherMethod",
                "Age",
                "MissingPL"
            ]
        );
        let fs = json!({"metadata": {"name": "catch-all", "creationTimestamp": "2024-05-01T11:00:00Z"},
            "spec": {"priorityLevelConfiguration": {"name": "catch-all"}, "matchingPrecedence": 10000,
                "distinguisherMethod": {"type": "ByUser"}},
            "status": {"conditions": [{"type": "Dangling", "status": "False"}]}});
        assert_eq!(
            cells("flowschemas", &fs),
            [
                json!("catch-all"),
                json!("catch-all"),
                json!(10000),
                json!("ByUser"),
                json!("60m"),
                json!("False")
            ]
        );
        let fresh = json!({"metadata": {"name": "exempt"}, "spec": {"priorityLevelConfiguration": {"name": "exempt"},
            "matchingPrecedence": 1}});
        let c = cells("flowschemas", &fresh);
        assert_eq!((c[3].clone(), c[5].clone()), (json!("<none>"), json!("?")));
    }

    #[test]
    fn priority_level_rows() {
        assert_eq!(
            names("prioritylevelconfigurations"),
            [
                "Name",
                "Type",
                "NominalConcurrencyShares",
                "Queues",
                "HandSize",
                "QueueLengthLimit",
                "Age"
            ]
        );
        let queued = json!({"metadata": {"name": "global-default"}, "spec": {"type": "Limited",
            "limited": {"nominalConcurrencyShares": 20, "lendablePercent": 50,
                "limitResponse": {"type": "Queue", "queuing": {"queues": 128, "handSize": 6, "queueLengthLimit": 50}}}}});
        assert_eq!(
            cells("prioritylevelconfigurations", &queued)[1..6],
            [json!("Limited"), json!(20), json!(128), json!(6), json!(50)]
        );
        let reject = json!({"metadata": {"name": "catch-all"}, "spec": {"type": "Limited",
            "limited": {"nominalConcurrencyShares": 5, "limitResponse": {"type": "Reject"}}}});
        assert_eq!(
            cells("prioritylevelconfigurations", &reject)[2..6],
            [json!(5), json!("<none>"), json!("<none>"), json!("<none>")]
        );
        let exempt = json!({"metadata": {"name": "exempt"}, "spec": {"type": "Exempt", "exempt": {}}});
        assert_eq!(
            cells("prioritylevelconfigurations", &exempt)[1..3],
            [json!("Exempt"), json!("<none>")]
        );
    }
}
