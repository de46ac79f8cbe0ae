//! The benchmarks `skiff bench` runs against a live cluster, kept out of the production crates:
//! they drive the components only through their public APIs.
//!
//! - `scheduling`: upstream's scheduler_perf shapes (`skiff bench scheduling`): a scheduler of its
//!   own, the workload's nodes and pods, throughput as scheduler_perf samples it.
//! - `startup`: pod startup latency (`skiff bench startup`), and the same work done directly in Docker.

pub mod scheduling;
pub mod startup;

pub use scheduling::{BenchConfig, BenchResult, bench};
pub use startup::{StartupBench, StartupReport, bench_startup};
