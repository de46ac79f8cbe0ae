//! The node agent: registers a Node, runs the pods bound to it and reports their status.
//! `sim` runs simulated nodes (as kwok does) for scheduling tests and benchmarks.

pub mod sim;
