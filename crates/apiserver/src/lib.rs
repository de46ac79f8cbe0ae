//! The API server: HTTPS, authentication, discovery, OpenAPI, CRUD/watch handlers,
//! admission and subresources over a [`skiff_store::Store`].

pub mod discovery;
pub mod openapi;
pub mod pki;
pub mod protobuf;
