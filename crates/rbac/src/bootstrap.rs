//! The default roles and bindings every cluster starts with, as upstream's `bootstrappolicy`.
