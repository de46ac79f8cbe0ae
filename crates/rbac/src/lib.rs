//! Role-based access control without I/O: policy rules and how they match a request, the
//! authorizer over a snapshot of Roles and bindings, and upstream's bootstrap policy.

pub mod authorizer;
pub mod bootstrap;
pub mod rule;
pub mod skiff_policy;
pub mod why;

pub use authorizer::{Decision, Objects, Policy, Subject};
pub use rule::{Attributes, PolicyRule};
