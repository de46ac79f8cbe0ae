//! The scheduler: watches pods and nodes through the API, runs upstream's framework and
//! default plugins over an in-memory cache, and binds pods through `pods/binding`.

pub mod cache;
pub mod framework;
pub mod labels;
pub mod plugins;
mod quantity;
pub mod types;
