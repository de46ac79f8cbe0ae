//! Ingress, IngressClass and NetworkPolicy, as upstream's `pkg/apis/networking/validation`
//! (`ValidateIngressCreate`, `ValidateIngressUpdate`, `ValidateIngressStatusUpdate`,
//! `ValidateIngressClass`, `ValidateIngressClassUpdate`, `ValidateNetworkPolicy`,
//! `ValidateNetworkPolicyUpdate`), as 1.33 runs them with its default feature gates.

use std::net::IpAddr;

use serde_json::Value;

use super::meta::{
    is_dns1123_subdomain, name_is_dns_label, name_is_dns_subdomain, name_is_dns1035_label, regex_error,
    validate_label_selector,
};
use super::pod::port_name_errors;
use super::{
    Path, arr_at, field, forbidden, invalid, invalid_raw, invalid_str, name_is_path_segment, not_supported, required,
    str_at,
};
use crate::status::FieldError;

const ANNOTATION_INGRESS_CLASS: &str = "kubernetes.io/ingress.class";
const MAX_LEN_INGRESS_CLASS_CONTROLLER: usize = 250;
const PATH_TYPES: &[&str] = &["Exact", "ImplementationSpecific", "Prefix"];
const INVALID_PATH_SEQUENCES: &[&str] = &["//", "/./", "/../", "%2f", "%2F"];
const INVALID_PATH_SUFFIXES: &[&str] = &["/..", "/."];
const PARAMETER_SCOPES: &[&str] = &["Cluster", "Namespace"];
const PORT_RANGE_MSG: &str = "must be between 1 and 65535, inclusive";
const CIDR_MSG: &str = "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)";
const IP_MSG: &str = "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)";

const WILDCARD_DNS1123_SUBDOMAIN_FMT: &str = "\\*\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const WILDCARD_DNS1123_SUBDOMAIN_ERR: &str = "a wildcard DNS-1123 subdomain must start with '*.', followed by a valid DNS subdomain, which must consist of lower case alphanumeric characters, '-' or '.' and end with an alphanumeric character";
const HTTP_PATH_FMT: &str = "[A-Za-z0-9/\\-._~%!$&'()*+,;=:]+";

/// upstream's `IsWildcardDNS1123Subdomain`.
pub(crate) fn is_wildcard_dns1123_subdomain(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 253 {
        errs.push(super::meta::max_len_error(253));
    }
    let ok = s
        .strip_prefix("*.")
        .is_some_and(|rest| !rest.is_empty() && is_dns1123_subdomain_shape(rest));
    if !ok {
        errs.push(regex_error(
            WILDCARD_DNS1123_SUBDOMAIN_ERR,
            WILDCARD_DNS1123_SUBDOMAIN_FMT,
            &["*.example.com"],
        ));
    }
    errs
}

/// Whether `s` matches the DNS-1123 subdomain pattern (its length aside).
fn is_dns1123_subdomain_shape(s: &str) -> bool {
    is_dns1123_subdomain(s)
        .iter()
        .all(|m| m.starts_with("must be no more than"))
}

/// upstream's `IsDomainPrefixedPath`.
fn validate_domain_prefixed_path(p: &Path, s: &str, errs: &mut Vec<FieldError>) {
    if s.is_empty() {
        errs.push(required(p, ""));
        return;
    }
    let Some((host, path)) = s.split_once('/').filter(|(h, p)| !h.is_empty() && !p.is_empty()) else {
        errs.push(invalid_str(
            p,
            s,
            "must be a domain-prefixed path (such as \"acme.io/foo\")",
        ));
        return;
    };
    for m in is_dns1123_subdomain(host) {
        errs.push(invalid_str(p, host, &m));
    }
    let path_ok = path
        .bytes()
        .all(|c| c.is_ascii_alphanumeric() || b"/-._~%!$&'()*+,;=:".contains(&c));
    if !path_ok {
        errs.push(invalid_str(p, path, &regex_error("Invalid path", HTTP_PATH_FMT, &[])));
    }
}

/// A string as an IP address (upstream's `ParseIPSloppy` also takes IPv4 with leading zeros).
fn parse_ip(s: &str) -> Option<IpAddr> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(ip);
    }
    let parts: Vec<&str> = s.split('.').collect();
    if parts.len() != 4 {
        return None;
    }
    let mut octets = [0u8; 4];
    for (o, p) in octets.iter_mut().zip(&parts) {
        if p.is_empty() || p.len() > 3 || !p.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        *o = p.parse().ok()?;
    }
    Some(IpAddr::from(octets))
}

/// A CIDR as upstream's `ParseCIDRSloppy`: the network's address (host bits cleared) as a
/// 128-bit number, its prefix length and whether it is IPv4.
fn parse_cidr(s: &str) -> Option<(u128, u8, bool)> {
    let (addr, prefix) = s.split_once('/')?;
    if prefix.is_empty() || !prefix.bytes().all(|c| c.is_ascii_digit()) || prefix.len() > 3 {
        return None;
    }
    let prefix: u8 = prefix.parse().ok()?;
    let (bits, width, v4) = match parse_ip(addr)? {
        IpAddr::V4(a) => (u128::from(u32::from(a)), 32u8, true),
        IpAddr::V6(a) => (u128::from(a), 128u8, false),
    };
    if prefix > width {
        return None;
    }
    let host_bits = u32::from(width - prefix);
    let mask = if host_bits >= 128 { 0 } else { !0u128 << host_bits };
    Some((bits & mask, prefix, v4))
}

/// Whether the network `outer` holds the address of `inner`.
fn cidr_contains(outer: (u128, u8, bool), inner: (u128, u8, bool)) -> bool {
    if outer.2 != inner.2 {
        return false;
    }
    let width: u32 = if outer.2 { 32 } else { 128 };
    let host_bits = width - u32::from(outer.1);
    let mask = if host_bits >= 128 { 0 } else { !0u128 << host_bits };
    inner.0 & mask == outer.0
}

// ---- Ingress ----------------------------------------------------------------------------------

/// Upstream's relaxations for objects stored before a rule tightened.
#[derive(Default, Clone, Copy)]
struct IngressOptions {
    allow_invalid_secret_name: bool,
    allow_invalid_wildcard_host_rule: bool,
}

/// `ValidateIngressCreate` (without `old`) or `ValidateIngressUpdate`, or for the `status`
/// subresource `ValidateIngressStatusUpdate`. Metadata is checked by the caller.
pub(crate) fn validate_ingress(obj: &Value, old: Option<&Value>, subresource: &str, errs: &mut Vec<FieldError>) {
    if subresource == "status" {
        validate_ingress_load_balancer_status(obj, old, errs);
        return;
    }
    let opts = match old {
        None => IngressOptions::default(),
        Some(old) => IngressOptions {
            allow_invalid_secret_name: arr_at(field(Some(old), "spec"), "tls")
                .iter()
                .any(|t| !tls_secret_name_errors(str_at(Some(t), "secretName")).is_empty()),
            allow_invalid_wildcard_host_rule: arr_at(field(Some(old), "spec"), "rules").iter().any(|r| {
                let mut e = Vec::new();
                validate_ingress_rule_value(r, &Path::new(""), IngressOptions::default(), &mut e);
                str_at(Some(r), "host").contains('*') && !e.is_empty()
            }),
        },
    };
    validate_ingress_spec(field(Some(obj), "spec"), &Path::new("spec"), opts, errs);
    if old.is_none()
        && let Some(annotation) = obj
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(ANNOTATION_INGRESS_CLASS))
            .and_then(Value::as_str)
        && let Some(class) = obj.pointer("/spec/ingressClassName").and_then(Value::as_str)
        && annotation != class
    {
        errs.push(invalid_str(
            &Path::new("annotations").child(ANNOTATION_INGRESS_CLASS),
            annotation,
            "must match `ingressClassName` when both are specified",
        ));
    }
}

fn tls_secret_name_errors(name: &str) -> Vec<String> {
    if name.is_empty() {
        return Vec::new();
    }
    name_is_dns_subdomain(name, false)
}

/// upstream's `ValidateIngressSpec`.
fn validate_ingress_spec(spec: Option<&Value>, p: &Path, opts: IngressOptions, errs: &mut Vec<FieldError>) {
    let rules = arr_at(spec, "rules");
    let default_backend = field(spec, "defaultBackend");
    if rules.is_empty() && default_backend.is_none() {
        let rendered = match field(spec, "rules") {
            Some(Value::Array(_)) => "[]networking.IngressRule{}",
            _ => "[]networking.IngressRule(nil)",
        };
        errs.push(invalid_raw(
            p,
            rendered.to_string(),
            "either `defaultBackend` or `rules` must be specified",
        ));
    }
    if let Some(b) = default_backend {
        validate_ingress_backend(b, &p.child("defaultBackend"), errs);
    }
    let rp = p.child("rules");
    for (i, rule) in rules.iter().enumerate() {
        let ip = rp.index(i);
        let host = str_at(Some(rule), "host");
        let mut wildcard = false;
        if !host.is_empty() {
            if parse_ip(host).is_some() {
                errs.push(invalid_str(
                    &ip.child("host"),
                    host,
                    "must be a DNS name, not an IP address",
                ));
            }
            if host.contains('*') {
                for m in is_wildcard_dns1123_subdomain(host) {
                    errs.push(invalid_str(&ip.child("host"), host, &m));
                }
                wildcard = true;
            } else {
                for m in is_dns1123_subdomain(host) {
                    errs.push(invalid_str(&ip.child("host"), host, &m));
                }
            }
        }
        if !wildcard || !opts.allow_invalid_wildcard_host_rule {
            validate_ingress_rule_value(rule, &ip, opts, errs);
        }
    }
    let tp = p.child("tls");
    for (i, tls) in arr_at(spec, "tls").iter().enumerate() {
        let hp = tp.index(i).child("hosts");
        for (j, host) in arr_at(Some(tls), "hosts").iter().enumerate() {
            let host = host.as_str().unwrap_or("");
            let msgs = if host.contains('*') {
                is_wildcard_dns1123_subdomain(host)
            } else {
                is_dns1123_subdomain(host)
            };
            for m in msgs {
                errs.push(invalid_str(&hp.index(j), host, &m));
            }
        }
        if !opts.allow_invalid_secret_name {
            let name = str_at(Some(tls), "secretName");
            for m in tls_secret_name_errors(name) {
                errs.push(invalid_str(&tp.index(i).child("secretName"), name, &m));
            }
        }
    }
    if let Some(class) = field(spec, "ingressClassName").and_then(Value::as_str) {
        for m in name_is_dns_subdomain(class, false) {
            errs.push(invalid_str(&p.child("ingressClassName"), class, &m));
        }
    }
}

/// upstream's `validateIngressRuleValue` and `validateHTTPIngressRuleValue`.
fn validate_ingress_rule_value(rule: &Value, p: &Path, _opts: IngressOptions, errs: &mut Vec<FieldError>) {
    let Some(http) = field(Some(rule), "http") else {
        return;
    };
    let hp = p.child("http");
    let paths = arr_at(Some(http), "paths");
    if paths.is_empty() {
        errs.push(required(&hp.child("paths"), ""));
    }
    for (i, path) in paths.iter().enumerate() {
        validate_http_ingress_path(path, &hp.child("paths").index(i), errs);
    }
}

/// upstream's `validateHTTPIngressPath`.
fn validate_http_ingress_path(path: &Value, p: &Path, errs: &mut Vec<FieldError>) {
    let Some(path_type) = field(Some(path), "pathType") else {
        errs.push(required(&p.child("pathType"), "pathType must be specified"));
        return;
    };
    let value = str_at(Some(path), "path");
    let pp = p.child("path");
    match path_type.as_str().unwrap_or("") {
        "Exact" | "Prefix" => {
            if !value.starts_with('/') {
                errs.push(invalid_str(&pp, value, "must be an absolute path"));
            }
            if !value.is_empty() {
                for seq in INVALID_PATH_SEQUENCES {
                    if value.contains(seq) {
                        errs.push(invalid_str(&pp, value, &format!("must not contain '{seq}'")));
                    }
                }
                for suffix in INVALID_PATH_SUFFIXES {
                    if value.ends_with(suffix) {
                        errs.push(invalid_str(&pp, value, &format!("cannot end with '{suffix}'")));
                    }
                }
            }
        }
        "ImplementationSpecific" => {
            if !value.is_empty() && !value.starts_with('/') {
                errs.push(invalid_str(&pp, value, "must be an absolute path"));
            }
        }
        _ => errs.push(not_supported(&p.child("pathType"), path_type, PATH_TYPES)),
    }
    validate_ingress_backend(
        field(Some(path), "backend").unwrap_or(&Value::Null),
        &p.child("backend"),
        errs,
    );
}

/// upstream's `validateIngressBackend`: a service (name and a port name or number) or a
/// resource, not both.
fn validate_ingress_backend(backend: &Value, p: &Path, errs: &mut Vec<FieldError>) {
    let service = field(Some(backend), "service");
    let resource = field(Some(backend), "resource");
    let empty = Value::String(String::new());
    match (service, resource) {
        (Some(_), Some(_)) => errs.push(invalid(p, &empty, "cannot set both resource and service backends")),
        (None, Some(r)) => validate_typed_local_object_reference(r, &p.child("resource"), errs),
        (Some(s), None) => {
            let name = str_at(Some(s), "name");
            let np = p.child("service").child("name");
            if name.is_empty() {
                errs.push(required(&np, ""));
            } else {
                for m in name_is_dns1035_label(name, false) {
                    errs.push(invalid_str(&np, name, &m));
                }
            }
            let port = field(Some(s), "port");
            let port_name = str_at(port, "name");
            let port_number = field(port, "number").and_then(Value::as_i64).unwrap_or(0);
            let pp = p.child("service").child("port");
            if !port_name.is_empty() && port_number != 0 {
                errs.push(invalid(p, &empty, "cannot set both port name & port number"));
            } else if !port_name.is_empty() {
                for m in port_name_errors(port_name) {
                    errs.push(invalid_str(&pp.child("name"), port_name, &m));
                }
            } else if port_number != 0 {
                if !(1..=65535).contains(&port_number) {
                    errs.push(invalid(&pp.child("number"), &Value::from(port_number), PORT_RANGE_MSG));
                }
            } else {
                errs.push(required(p, "port name or number is required"));
            }
        }
        (None, None) => errs.push(invalid(p, &empty, "resource or service backend is required")),
    }
}

/// upstream's `validateIngressTypedLocalObjectReference`.
fn validate_typed_local_object_reference(r: &Value, p: &Path, errs: &mut Vec<FieldError>) {
    if let Some(group) = field(Some(r), "apiGroup").and_then(Value::as_str) {
        for m in is_dns1123_subdomain(group) {
            errs.push(invalid_str(&p.child("apiGroup"), group, &m));
        }
    }
    for key in ["kind", "name"] {
        let v = str_at(Some(r), key);
        if v.is_empty() {
            errs.push(required(&p.child(key), ""));
        } else {
            for m in name_is_path_segment(v, false) {
                errs.push(invalid_str(&p.child(key), v, &m));
            }
        }
    }
}

/// upstream's `ValidateIngressLoadBalancerStatus`: addresses are IPs (those already stored
/// are kept as they are), hostnames DNS names.
fn validate_ingress_load_balancer_status(obj: &Value, old: Option<&Value>, errs: &mut Vec<FieldError>) {
    let old_ips: Vec<&str> = old
        .and_then(|o| o.pointer("/status/loadBalancer/ingress"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|i| str_at(Some(i), "ip"))
                .filter(|s| !s.is_empty())
                .collect()
        })
        .unwrap_or_default();
    let p = Path::new("status").child("loadBalancer").child("ingress");
    let ingress = obj
        .pointer("/status/loadBalancer/ingress")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    for (i, ing) in ingress.iter().enumerate() {
        let ip = str_at(Some(ing), "ip");
        if !ip.is_empty() && !old_ips.contains(&ip) && parse_ip(ip).is_none() {
            errs.push(invalid_str(&p.index(i).child("ip"), ip, IP_MSG));
        }
        let host = str_at(Some(ing), "hostname");
        if !host.is_empty() {
            for m in is_dns1123_subdomain(host) {
                errs.push(invalid_str(&p.index(i).child("hostname"), host, &m));
            }
            if parse_ip(host).is_some() {
                errs.push(invalid_str(
                    &p.index(i).child("hostname"),
                    host,
                    "must be a DNS name, not an IP address",
                ));
            }
        }
    }
}

// ---- IngressClass -----------------------------------------------------------------------------

/// `ValidateIngressClass`, and on update `ValidateIngressClassUpdate`'s immutable controller.
pub(crate) fn validate_ingress_class(obj: &Value, old: Option<&Value>, errs: &mut Vec<FieldError>) {
    let spec = field(Some(obj), "spec");
    let p = Path::new("spec");
    if let Some(old) = old {
        let (now, before) = (
            str_at(spec, "controller"),
            str_at(field(Some(old), "spec"), "controller"),
        );
        if now != before {
            errs.push(invalid_str(&p.child("controller"), now, "field is immutable"));
        }
    }
    let controller = str_at(spec, "controller");
    let cp = p.child("controller");
    if controller.is_empty() {
        errs.push(required(&cp, ""));
    } else {
        if controller.len() > MAX_LEN_INGRESS_CLASS_CONTROLLER {
            errs.push(FieldError::too_long(cp.as_str(), MAX_LEN_INGRESS_CLASS_CONTROLLER));
        }
        validate_domain_prefixed_path(&cp, controller, errs);
    }
    if let Some(params) = field(spec, "parameters") {
        validate_parameters_reference(params, &p.child("parameters"), errs);
    }
}

/// upstream's `validateIngressClassParametersReference`.
fn validate_parameters_reference(params: &Value, p: &Path, errs: &mut Vec<FieldError>) {
    validate_typed_local_object_reference(params, p, errs);
    let Some(scope) = field(Some(params), "scope") else {
        errs.push(required(&p.child("scope"), ""));
        return;
    };
    let namespace = field(Some(params), "namespace");
    match scope.as_str().unwrap_or("") {
        "Namespace" => match namespace.and_then(Value::as_str) {
            None => errs.push(required(
                &p.child("namespace"),
                "`parameters.scope` is set to 'Namespace'",
            )),
            Some(ns) => {
                for m in name_is_dns_label(ns, false) {
                    errs.push(invalid_str(&p.child("namespace"), ns, &m));
                }
            }
        },
        "Cluster" => {
            if namespace.is_some() {
                errs.push(forbidden(
                    &p.child("namespace"),
                    "`parameters.scope` is set to 'Cluster'",
                ));
            }
        }
        _ => errs.push(not_supported(&p.child("scope"), scope, PARAMETER_SCOPES)),
    }
}

// ---- NetworkPolicy ----------------------------------------------------------------------------

/// `ValidateNetworkPolicy`, or `ValidateNetworkPolicyUpdate` with `old`: CIDRs the stored
/// policy already holds are not checked again.
pub(crate) fn validate_network_policy(obj: &Value, old: Option<&Value>, errs: &mut Vec<FieldError>) {
    let mut existing: Vec<&str> = Vec::new();
    if let Some(old) = old {
        let spec = field(Some(old), "spec");
        for (rules, peers) in [("ingress", "from"), ("egress", "to")] {
            for rule in arr_at(spec, rules) {
                for peer in arr_at(Some(rule), peers) {
                    if let Some(b) = field(Some(peer), "ipBlock") {
                        existing.push(str_at(Some(b), "cidr"));
                        existing.extend(arr_at(Some(b), "except").iter().filter_map(Value::as_str));
                    }
                }
            }
        }
    }
    let spec = field(Some(obj), "spec");
    let p = Path::new("spec");
    validate_label_selector(field(spec, "podSelector"), &p.child("podSelector"), errs);
    for (rules, peers) in [("ingress", "from"), ("egress", "to")] {
        for (i, rule) in arr_at(spec, rules).iter().enumerate() {
            let rp = p.child(rules).index(i);
            for (j, port) in arr_at(Some(rule), "ports").iter().enumerate() {
                validate_network_policy_port(port, &rp.child("ports").index(j), errs);
            }
            for (j, peer) in arr_at(Some(rule), peers).iter().enumerate() {
                validate_network_policy_peer(peer, &rp.child(peers).index(j), &existing, errs);
            }
        }
    }
    let types = arr_at(spec, "policyTypes");
    let tp = p.child("policyTypes");
    if types.len() > 2 {
        let rendered = format!(
            "[]networking.PolicyType{{{}}}",
            types
                .iter()
                .map(|t| format!("{:?}", t.as_str().unwrap_or("")))
                .collect::<Vec<_>>()
                .join(", ")
        );
        errs.push(invalid_raw(&tp, rendered, "may not specify more than two policyTypes"));
        return;
    }
    for (i, t) in types.iter().enumerate() {
        if !matches!(t.as_str(), Some("Ingress" | "Egress")) {
            errs.push(not_supported(&tp.index(i), t, &["Ingress", "Egress"]));
        }
    }
}

/// upstream's `ValidateNetworkPolicyPort`.
fn validate_network_policy_port(port: &Value, p: &Path, errs: &mut Vec<FieldError>) {
    if let Some(proto) = field(Some(port), "protocol")
        && !matches!(proto.as_str(), Some("TCP" | "UDP" | "SCTP"))
    {
        errs.push(not_supported(&p.child("protocol"), proto, &["TCP", "UDP", "SCTP"]));
    }
    let end_port = field(Some(port), "endPort");
    match field(Some(port), "port") {
        Some(Value::Number(n)) => {
            let n = n.as_i64().unwrap_or(0);
            if !(1..=65535).contains(&n) {
                errs.push(invalid(&p.child("port"), &Value::from(n), PORT_RANGE_MSG));
            }
            if let Some(end) = end_port {
                let e = end.as_i64().unwrap_or(0);
                if e < n {
                    errs.push(invalid(
                        &p.child("endPort"),
                        end,
                        "must be greater than or equal to `port`",
                    ));
                }
                if !(1..=65535).contains(&e) {
                    errs.push(invalid(&p.child("endPort"), end, PORT_RANGE_MSG));
                }
            }
        }
        Some(Value::String(s)) => {
            if let Some(end) = end_port {
                errs.push(invalid(
                    &p.child("endPort"),
                    end,
                    "may not be specified when `port` is non-numeric",
                ));
            }
            for m in port_name_errors(s) {
                errs.push(invalid_str(&p.child("port"), s, &m));
            }
        }
        _ => {
            if let Some(end) = end_port {
                errs.push(invalid(
                    &p.child("endPort"),
                    end,
                    "may not be specified when `port` is not specified",
                ));
            }
        }
    }
}

/// upstream's `ValidateNetworkPolicyPeer`: one kind of peer, an ipBlock alone.
fn validate_network_policy_peer(peer: &Value, p: &Path, existing: &[&str], errs: &mut Vec<FieldError>) {
    let mut n = 0;
    for key in ["podSelector", "namespaceSelector"] {
        if let Some(sel) = field(Some(peer), key) {
            n += 1;
            validate_label_selector(Some(sel), &p.child(key), errs);
        }
    }
    let ip_block = field(Some(peer), "ipBlock");
    if let Some(b) = ip_block {
        n += 1;
        validate_ip_block(b, &p.child("ipBlock"), existing, errs);
    }
    if n == 0 {
        errs.push(required(p, "must specify a peer"));
    } else if n > 1 && ip_block.is_some() {
        errs.push(forbidden(p, "may not specify both ipBlock and another peer"));
    }
}

/// upstream's `ValidateIPBlock`: a CIDR, and exceptions strictly inside it.
fn validate_ip_block(b: &Value, p: &Path, existing: &[&str], errs: &mut Vec<FieldError>) {
    let cidr = str_at(Some(b), "cidr");
    if cidr.is_empty() {
        errs.push(required(&p.child("cidr"), ""));
        return;
    }
    let parsed = parse_cidr(cidr);
    if parsed.is_none() && !existing.contains(&cidr) {
        errs.push(invalid_str(&p.child("cidr"), cidr, CIDR_MSG));
    }
    let Some(outer) = parsed else {
        return;
    };
    for (i, except) in arr_at(Some(b), "except").iter().enumerate() {
        let except = except.as_str().unwrap_or("");
        let ep = p.child("except").index(i);
        let Some(inner) = parse_cidr(except) else {
            if !existing.contains(&except) {
                errs.push(invalid_str(&ep, except, CIDR_MSG));
            }
            continue;
        };
        if !cidr_contains(outer, inner) || outer.1 >= inner.1 {
            errs.push(invalid_str(&ep, except, "must be a strict subset of `cidr`"));
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::registry::lookup_kind;

    fn errors(kind: &str, obj: serde_json::Value, old: Option<serde_json::Value>, sub: &str) -> Vec<String> {
        let res = lookup_kind("networking.k8s.io", kind).expect("served");
        let mut obj = obj;
        crate::defaults::apply_defaults(res, &mut obj);
        super::super::validate_write(res, sub, &obj, old.as_ref())
            .iter()
            .map(|e| format!("{}: {}", e.field, e.body()))
            .collect()
    }

    fn ingress(spec: serde_json::Value) -> serde_json::Value {
        json!({"metadata": {"name": "i", "namespace": "default"}, "spec": spec})
    }

    fn svc(name: &str, port: serde_json::Value) -> serde_json::Value {
        json!({"service": {"name": name, "port": port}})
    }

    #[test]
    fn a_valid_ingress_passes() {
        let i = ingress(json!({
            "ingressClassName": "nginx",
            "rules": [{"host": "foo.com", "http": {"paths": [
                {"path": "/bar", "pathType": "Exact", "backend": svc("svc1", json!({"number": 8080}))},
                {"path": "/", "pathType": "Prefix", "backend": svc("svc2", json!({"name": "http"}))}
            ]}}, {"host": "*.example.com", "http": {"paths": [
                {"pathType": "ImplementationSpecific", "backend": {"resource": {"apiGroup": "k8s.example.com", "kind": "StorageBucket", "name": "static"}}}
            ]}}],
            "tls": [{"hosts": ["foo.com", "*.example.com"], "secretName": "my-cert"}]
        }));
        assert_eq!(errors("Ingress", i, None, ""), Vec::<String>::new());
    }

    #[test]
    fn ingress_rules_or_default_backend_are_required() {
        assert_eq!(
            errors("Ingress", ingress(json!({})), None, ""),
            [
                "spec: Invalid value: []networking.IngressRule(nil): either `defaultBackend` or `rules` must be specified"
            ]
        );
    }

    #[test]
    fn ingress_hosts_are_dns_names_or_wildcards() {
        let i = ingress(json!({"rules": [{"host": "1.2.3.4"}, {"host": "*.*.foo.com"}, {"host": "Foo.com"}]}));
        assert_eq!(
            errors("Ingress", i, None, ""),
            [
                "spec.rules[0].host: Invalid value: \"1.2.3.4\": must be a DNS name, not an IP address",
                "spec.rules[1].host: Invalid value: \"*.*.foo.com\": a wildcard DNS-1123 subdomain must start with '*.', followed by a valid DNS subdomain, which must consist of lower case alphanumeric characters, '-' or '.' and end with an alphanumeric character (e.g. '*.example.com', regex used for validation is '\\*\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
                "spec.rules[2].host: Invalid value: \"Foo.com\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
            ]
        );
    }

    #[test]
    fn ingress_paths_follow_their_type() {
        let b = svc("s", json!({"number": 80}));
        let i = ingress(json!({"rules": [{"http": {"paths": [
            {"path": "foo", "pathType": "Exact", "backend": b},
            {"path": "/a//b/..", "pathType": "Prefix", "backend": b},
            {"path": "/x", "backend": b},
            {"path": "/x", "pathType": "Regex", "backend": b},
            {"path": "rel", "pathType": "ImplementationSpecific", "backend": b},
        ]}}, {"http": {"paths": []}}]}));
        assert_eq!(
            errors("Ingress", i, None, ""),
            [
                "spec.rules[0].http.paths[0].path: Invalid value: \"foo\": must be an absolute path",
                "spec.rules[0].http.paths[1].path: Invalid value: \"/a//b/..\": must not contain '//'",
                "spec.rules[0].http.paths[1].path: Invalid value: \"/a//b/..\": cannot end with '/..'",
                "spec.rules[0].http.paths[2].pathType: Required value: pathType must be specified",
                "spec.rules[0].http.paths[3].pathType: Unsupported value: \"Regex\": supported values: \"Exact\", \"ImplementationSpecific\", \"Prefix\"",
                "spec.rules[0].http.paths[4].path: Invalid value: \"rel\": must be an absolute path",
                "spec.rules[1].http.paths: Required value",
            ]
        );
    }

    #[test]
    fn ingress_backends_name_a_service_and_port_or_a_resource() {
        let path = |backend: serde_json::Value| json!({"path": "/", "pathType": "Prefix", "backend": backend});
        let i = ingress(json!({"rules": [{"http": {"paths": [
            path(json!({"service": {"name": "s", "port": {"number": 80}}, "resource": {"kind": "K", "name": "n"}})),
            path(json!({})),
            path(svc("1svc", json!({"number": 70000}))),
            path(svc("s", json!({"name": "http", "number": 80}))),
            path(svc("s", json!({}))),
            path(json!({"service": {"port": {"name": "Http"}}})),
        ]}}]}));
        assert_eq!(
            errors("Ingress", i, None, ""),
            [
                "spec.rules[0].http.paths[0].backend: Invalid value: \"\": cannot set both resource and service backends",
                "spec.rules[0].http.paths[1].backend: Invalid value: \"\": resource or service backend is required",
                "spec.rules[0].http.paths[2].backend.service.name: Invalid value: \"1svc\": a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')",
                "spec.rules[0].http.paths[2].backend.service.port.number: Invalid value: 70000: must be between 1 and 65535, inclusive",
                "spec.rules[0].http.paths[3].backend: Invalid value: \"\": cannot set both port name & port number",
                "spec.rules[0].http.paths[4].backend: Required value: port name or number is required",
                "spec.rules[0].http.paths[5].backend.service.name: Required value",
                "spec.rules[0].http.paths[5].backend.service.port.name: Invalid value: \"Http\": must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)",
            ]
        );
    }

    #[test]
    fn ingress_tls_and_class() {
        let mut i = ingress(json!({
            "defaultBackend": svc("s", json!({"number": 80})),
            "tls": [{"hosts": ["*"], "secretName": "Bad_Name"}],
            "ingressClassName": "a"
        }));
        i["metadata"]["annotations"] = json!({"kubernetes.io/ingress.class": "b"});
        let errs = errors("Ingress", i.clone(), None, "");
        assert_eq!(errs.len(), 3, "{errs:?}");
        assert!(errs[0].starts_with("spec.tls[0].hosts[0]: Invalid value: \"*\": a wildcard DNS-1123 subdomain"));
        assert!(
            errs[1].starts_with("spec.tls[0].secretName: Invalid value: \"Bad_Name\": a lowercase RFC 1123 subdomain")
        );
        assert_eq!(
            errs[2],
            "annotations.kubernetes.io/ingress.class: Invalid value: \"b\": must match `ingressClassName` when both are specified"
        );
        // An update keeps a secret name stored before the rule, and no longer compares the
        // annotation.
        let errs = errors("Ingress", i.clone(), Some(i), "");
        assert_eq!(errs.len(), 1, "{errs:?}");
    }

    #[test]
    fn ingress_status_addresses() {
        let old = ingress(json!({"defaultBackend": svc("s", json!({"number": 80}))}));
        let mut new = old.clone();
        new["status"] =
            json!({"loadBalancer": {"ingress": [{"ip": "10.0.0.300"}, {"hostname": "1.2.3.4"}, {"ip": "10.0.0.1"}]}});
        assert_eq!(
            errors("Ingress", new, Some(old), "status"),
            [
                "status.loadBalancer.ingress[0].ip: Invalid value: \"10.0.0.300\": must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)",
                "status.loadBalancer.ingress[1].hostname: Invalid value: \"1.2.3.4\": must be a DNS name, not an IP address",
            ]
        );
    }

    fn class(spec: serde_json::Value) -> serde_json::Value {
        json!({"metadata": {"name": "nginx"}, "spec": spec})
    }

    #[test]
    fn ingress_class_controller_and_parameters() {
        assert_eq!(
            errors("IngressClass", class(json!({})), None, ""),
            ["spec.controller: Required value"]
        );
        assert_eq!(
            errors("IngressClass", class(json!({"controller": "nginx"})), None, ""),
            ["spec.controller: Invalid value: \"nginx\": must be a domain-prefixed path (such as \"acme.io/foo\")"]
        );
        assert_eq!(
            errors("IngressClass", class(json!({"controller": "a.io/b c"})), None, ""),
            [
                "spec.controller: Invalid value: \"b c\": Invalid path (regex used for validation is '[A-Za-z0-9/\\-._~%!$&'()*+,;=:]+')"
            ]
        );
        let long = format!("a.io/{}", "x".repeat(250));
        assert_eq!(
            errors("IngressClass", class(json!({"controller": long})), None, ""),
            ["spec.controller: Too long: may not be more than 250 bytes"]
        );
        assert_eq!(
            errors(
                "IngressClass",
                class(json!({"controller": "a.io/b", "parameters": {"kind": "K", "name": "n", "scope": "Namespace"}})),
                None,
                ""
            ),
            ["spec.parameters.namespace: Required value: `parameters.scope` is set to 'Namespace'"]
        );
        assert_eq!(
            errors(
                "IngressClass",
                class(json!({"controller": "a.io/b", "parameters": {"name": "n", "namespace": "x"}})),
                None,
                ""
            ),
            [
                "spec.parameters.kind: Required value",
                "spec.parameters.namespace: Forbidden: `parameters.scope` is set to 'Cluster'"
            ]
        );
        assert_eq!(
            errors(
                "IngressClass",
                class(json!({"controller": "a.io/c"})),
                Some(class(json!({"controller": "a.io/b"}))),
                ""
            ),
            ["spec.controller: Invalid value: \"a.io/c\": field is immutable"]
        );
    }

    fn policy(spec: serde_json::Value) -> serde_json::Value {
        json!({"metadata": {"name": "p", "namespace": "default"}, "spec": spec})
    }

    #[test]
    fn network_policy_ports() {
        let p = policy(json!({"podSelector": {}, "ingress": [{"ports": [
            {"protocol": "ICMP", "port": 80},
            {"port": 0},
            {"port": 100, "endPort": 90},
            {"port": "http", "endPort": 90},
            {"endPort": 90},
        ]}]}));
        assert_eq!(
            errors("NetworkPolicy", p, None, ""),
            [
                "spec.ingress[0].ports[0].protocol: Unsupported value: \"ICMP\": supported values: \"TCP\", \"UDP\", \"SCTP\"",
                "spec.ingress[0].ports[1].port: Invalid value: 0: must be between 1 and 65535, inclusive",
                "spec.ingress[0].ports[2].endPort: Invalid value: 90: must be greater than or equal to `port`",
                "spec.ingress[0].ports[3].endPort: Invalid value: 90: may not be specified when `port` is non-numeric",
                "spec.ingress[0].ports[4].endPort: Invalid value: 90: may not be specified when `port` is not specified",
            ]
        );
    }

    #[test]
    fn network_policy_peers_and_ip_blocks() {
        let p = policy(json!({"podSelector": {}, "egress": [{"to": [
            {},
            {"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}},
            {"ipBlock": {"cidr": "10.0.0.0/33"}},
            {"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.0.1.0/24", "10.1.0.0/24", "10.0.0.0/16", "bad"]}},
            {"ipBlock": {}},
        ]}], "policyTypes": ["Egress", "Sideways"]}));
        assert_eq!(
            errors("NetworkPolicy", p, None, ""),
            [
                "spec.egress[0].to[0]: Required value: must specify a peer",
                "spec.egress[0].to[1]: Forbidden: may not specify both ipBlock and another peer",
                "spec.egress[0].to[2].ipBlock.cidr: Invalid value: \"10.0.0.0/33\": must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)",
                "spec.egress[0].to[3].ipBlock.except[1]: Invalid value: \"10.1.0.0/24\": must be a strict subset of `cidr`",
                "spec.egress[0].to[3].ipBlock.except[2]: Invalid value: \"10.0.0.0/16\": must be a strict subset of `cidr`",
                "spec.egress[0].to[3].ipBlock.except[3]: Invalid value: \"bad\": must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)",
                "spec.egress[0].to[4].ipBlock.cidr: Required value",
                "spec.policyTypes[1]: Unsupported value: \"Sideways\": supported values: \"Ingress\", \"Egress\"",
            ]
        );
        let p = policy(json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress", "Ingress"]}));
        assert_eq!(
            errors("NetworkPolicy", p, None, ""),
            [
                "spec.policyTypes: Invalid value: []networking.PolicyType{\"Ingress\", \"Egress\", \"Ingress\"}: may not specify more than two policyTypes"
            ]
        );
    }

    #[test]
    fn network_policy_keeps_stored_cidrs_on_update() {
        let p = policy(json!({"podSelector": {}, "ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/40"}}]}]}));
        assert_eq!(errors("NetworkPolicy", p.clone(), None, "").len(), 1);
        assert_eq!(errors("NetworkPolicy", p.clone(), Some(p), ""), Vec::<String>::new());
    }

    #[test]
    fn network_policy_selectors_are_label_selectors() {
        let p = policy(json!({"podSelector": {"matchLabels": {"a": "b c"}}}));
        let errs = errors("NetworkPolicy", p, None, "");
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(
            errs[0].starts_with("spec.podSelector.matchLabels: Invalid value: \"b c\""),
            "{errs:?}"
        );
    }
}
