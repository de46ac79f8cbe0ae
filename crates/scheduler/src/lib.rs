//! The scheduler: watches pods and nodes through the API, runs upstream's framework and
//! default plugins over an in-memory cache, and binds pods through `pods/binding`.
//!
//! Code map: `types` (precomputed pod/node state), `cache` (nodes + bound/assumed pods, and the
//! claims, volumes, classes and CSI nodes the volume plugins read), `assume_cache` (volumes
//! and claims assumed for pods being bound),
//! `queue` (active/backoff/unschedulable), `framework` (extension points, filtering with
//! percentageOfNodesToScore, scoring, FitError), `plugins/*` (one file per upstream plugin),
//! `scheduler` (the loop and the API I/O), `writer` (events, status), `explain`.
//!
//! Architecture invariant: the scheduler talks to the API only; it never reads the store.

pub mod assume_cache;
pub mod cache;
pub mod counts;
pub mod explain;
pub mod framework;
pub mod labels;
pub mod lean_pod;
pub mod metrics;
pub mod plugins;
mod quantity;
pub mod queue;
pub mod scheduler;
pub mod types;
pub mod writer;

pub use explain::{EXPLAIN_ANNOTATION, Explain, render_explain};
pub use scheduler::{SchedulerConfig, run, run_with_signal};
