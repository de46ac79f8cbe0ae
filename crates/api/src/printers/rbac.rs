//! rbac.authorization.k8s.io: RoleBinding and ClusterRoleBinding as upstream's
//! `printRoleBinding` and `printClusterRoleBinding`; Role and ClusterRole have no printer
//! upstream, so their tables are the API server's default (`rest.NewDefaultTableConvertor`):
//! the name and the creation time as an RFC 3339 date.

use jiff::Timestamp;
use serde_json::{Value, json};

use super::format::{age, array_at, name, str_at, timestamp};
use super::{AGE, AGE_DESC, Column, NAME};

/// The default table's second column.
pub(crate) const CREATED_AT: Column = Column::new("Created At", "date", AGE_DESC);

pub(crate) const ROLE_COLUMNS: &[Column] = &[NAME, CREATED_AT];

pub(crate) const ROLEBINDING_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "Role",
        "string",
        "RoleRef can reference a Role in the current namespace or a ClusterRole in the global namespace. If the RoleRef cannot be resolved, the Authorizer must return an error.",
    ),
    AGE,
    Column::wide("Users", "string", "Users in the roleBinding"),
    Column::wide("Groups", "string", "Groups in the roleBinding"),
    Column::wide("ServiceAccounts", "string", "ServiceAccounts in the roleBinding"),
];

pub(crate) const CLUSTERROLEBINDING_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "Role",
        "string",
        "RoleRef can only reference a ClusterRole in the global namespace. If the RoleRef cannot be resolved, the Authorizer must return an error.",
    ),
    AGE,
    Column::wide("Users", "string", "Users in the clusterRoleBinding"),
    Column::wide("Groups", "string", "Groups in the clusterRoleBinding"),
    Column::wide("ServiceAccounts", "string", "ServiceAccounts in the clusterRoleBinding"),
];

/// The default table's row: the name and `creationTimestamp` in UTC as RFC 3339 (Go's zero
/// time when there is none).
pub(crate) fn created_at(obj: &Value) -> Vec<Value> {
    let created = timestamp(obj.pointer("/metadata/creationTimestamp"))
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_else(|| "0001-01-01T00:00:00Z".to_string());
    vec![json!(name(obj)), json!(created)]
}

/// upstream's `printRoleBinding` / `printClusterRoleBinding`: `KIND/NAME` of the role, then
/// the subjects as `rbac.SubjectsStrings` sorts them, each list joined by ", ".
pub(crate) fn binding(obj: &Value, now: Timestamp) -> Vec<Value> {
    let role = format!("{}/{}", str_at(obj, "/roleRef/kind"), str_at(obj, "/roleRef/name"));
    let (mut users, mut groups, mut service_accounts) = (Vec::new(), Vec::new(), Vec::new());
    for s in array_at(obj, "/subjects") {
        let subject_name = str_at(s, "/name");
        match str_at(s, "/kind") {
            "ServiceAccount" => service_accounts.push(format!("{}/{subject_name}", str_at(s, "/namespace"))),
            "User" => users.push(subject_name.to_string()),
            "Group" => groups.push(subject_name.to_string()),
            _ => {}
        }
    }
    vec![
        json!(name(obj)),
        json!(role),
        json!(age(obj, now)),
        json!(users.join(", ")),
        json!(groups.join(", ")),
        json!(service_accounts.join(", ")),
    ]
}
