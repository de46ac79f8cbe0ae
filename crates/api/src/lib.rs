//! API machinery shared by every Skiff component: the resource registry, Status errors,
//! selectors, quantities, patches, server-side printing, defaulting and validation, and the
//! PersistentVolume matching rules the PV binder and the scheduler share.
//! No I/O lives here.

pub mod apiextensions;
pub mod bootstraptoken;
pub mod cel;
pub mod certificates;
pub mod cidr;
pub mod conversion;
pub mod defaults;
pub mod flowcontrol;
pub mod go_emitted;
pub mod gojson;
pub mod limitranger;
pub mod nodeaffinity;
pub mod patch;
pub mod podsecurity;
pub mod printers;
pub mod quantity;
pub mod quota;
pub mod registry;
pub mod resourcemetrics;
pub mod schema;
pub mod selector;
pub mod skeleton;
pub mod status;
pub mod validation;
pub mod volume;
pub mod written;

#[cfg(test)]
mod fuzz_tests;

pub use registry::Resource;
pub use status::{FieldError, StatusError};
