//! The API server: HTTPS, authentication, discovery, OpenAPI, CRUD/watch handlers,
//! admission and subresources over a [`skiff_store::Store`].
//!
//! Architecture invariant: this crate is the only one that touches the store. Every other
//! component reaches the data through the HTTP API (in-process through [`client`]).

pub mod allocator;
pub mod apf_controller;
pub mod audit;
pub mod audit_request;
pub mod authz;
pub mod autoregister;
pub mod available_controller;
pub mod body;
pub mod bootstrap;
pub mod bootstraptoken;
pub mod certificates;
pub mod coalesce;
pub mod componentstatus;
pub mod conversion;
pub mod customresourcedefinitions;
pub mod defaultingressclass;
pub mod discovery;
pub mod encryption;
pub mod escalation;
pub mod filters;
pub mod flowcontrol_ensurer;
pub mod handlers;
pub mod impersonation;
pub mod join;
pub mod kubernetesservice;
pub mod limitranger;
pub mod metrics;
pub mod node_authorizer;
pub mod noderestriction;
pub mod objects;
pub mod openapi;
pub mod openapi_v2;
pub mod persistentvolumeclaimresize;
pub mod pki;
pub mod podsecurity;
pub mod protobuf;
pub mod proxy;
pub mod raw;
pub mod read;
pub mod reconcilers;
pub mod request;
pub mod resourcemetrics;
pub mod resourcequota;
pub mod resync;
pub mod reviews;
pub mod runtimeclass;
pub mod server;
pub mod serviceaccount;
pub mod serviceaccount_admission;
pub mod serving;
pub mod storageobjectinuseprotection;
pub mod subresources;
pub mod tls;
pub mod token_request;
pub mod validatingadmissionpolicy;
pub mod watch;
pub mod webhook;
pub mod write;

#[cfg(test)]
mod fuzz_tests;

pub use server::{
    ApiState, EtcdConfig, InProcessService, Running, ServerOptions, client, client_as, controller_client,
    controller_service, identities, service_as, start, start_with_store,
};
