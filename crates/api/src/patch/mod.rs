//! Patches: JSON patch (RFC 6902), merge patch (RFC 7386), strategic merge patch and
//! server-side apply.

pub mod meta;
