//! Fuzz targets for the parsers a client's bytes reach in this crate: selectors, quantities,
//! patches of every type, apply bodies and managed fields, defaulting and validation of
//! arbitrary objects, cron schedules and durations, bootstrap and join tokens, CSR PEM. Each runs
//! a bounded number of seeded cases (see `skiff-fuzz`); the invariant is no panic, plus
//! round-trip properties where the parser has a printer.

use crate::patch::{self, PatchType};
use crate::quantity::Quantity;
use crate::selector::{FieldSelector, LabelSelector};
use base64::Engine;
use serde_json::{Value, json};
use skiff_fuzz::proptest::prelude::*;
use skiff_fuzz::{mutated_bytes, mutated_json, mutated_text, run, seeds};

fn resource(plural: &str) -> &'static crate::Resource {
    let (group, version) = match plural {
        "deployments" => ("apps", "v1"),
        "cronjobs" => ("batch", "v1"),
        "roles" => ("rbac.authorization.k8s.io", "v1"),
        _ => ("", "v1"),
    };
    crate::registry::lookup(group, version, plural).expect("resource")
}

fn definition(plural: &str) -> &'static str {
    let r = resource(plural);
    crate::schema::definition_for(r.group, r.version, r.kind).expect("definition")
}

#[test]
fn fuzz_label_selector() {
    run(
        "fuzz_label_selector",
        2000,
        mutated_text(seeds::LABEL_SELECTORS, &[b"in", b"notin", b"example.com/"], 6),
        |s| {
            let labels = json!({"metadata": {"labels": {"app": "web", "tier": "fe", "a": ""}}});
            if let Ok(sel) = LabelSelector::parse(&s) {
                sel.matches_object(&labels);
                // What the server prints back (in list metadata, in errors) parses to the same selector.
                let printed = sel.to_string();
                let again = LabelSelector::parse(&printed).map_err(|e| format!("{printed:?} does not parse: {e}"))?;
                if again.to_string() != printed {
                    return Err(format!("{printed:?} reprints as {:?}", again.to_string()));
                }
            }
            let _ = LabelSelector::from_label_selector_json(
                &json!({"matchLabels": {"a": s.clone()}, "matchExpressions": [{"key": s, "operator": "In", "values": ["x"]}]}),
            );
            Ok(())
        },
    );
}

#[test]
fn fuzz_label_selector_json() {
    let seeds = vec![
        json!({"matchLabels": {"app": "web"}}),
        json!({"matchExpressions": [{"key": "a", "operator": "In", "values": ["x", "y"]}, {"key": "b", "operator": "DoesNotExist"}]}),
        json!({"matchLabels": {"a": "b"}, "matchExpressions": [{"key": "c", "operator": "Exists"}]}),
    ];
    run(
        "fuzz_label_selector_json",
        1000,
        mutated_json(seeds, &["In", "NotIn", "Exists", "DoesNotExist", "Gt"], 4),
        |v| {
            if let Ok(sel) = LabelSelector::from_label_selector_json(&v) {
                sel.matches_object(&json!({"metadata": {"labels": {"a": "x"}}}));
                let _ = sel.to_string();
            }
            Ok(())
        },
    );
}

#[test]
fn fuzz_field_selector() {
    let resources = ["pods", "nodes", "secrets", "services", "events", "configmaps"];
    let strategy = (
        prop::sample::select(resources.to_vec()),
        mutated_text(seeds::FIELD_SELECTORS, &[b"\\", b"metadata.", b"spec."], 6),
    );
    run("fuzz_field_selector", 2000, strategy, |(plural, s)| {
        let res = if plural == "events" {
            crate::registry::lookup("", "v1", "events").expect("events")
        } else {
            resource(plural)
        };
        if let Ok(sel) = FieldSelector::parse(res, &s) {
            sel.matches(&json!({"metadata": {"name": "p", "namespace": "default"}, "spec": {"nodeName": 5}}));
            let _ = sel.requires_exact_match("metadata.name");
            let printed = sel.to_string();
            FieldSelector::parse(res, &printed).map_err(|e| format!("{printed:?} does not parse: {e}"))?;
        }
        Ok(())
    });
}

#[test]
fn fuzz_quantity() {
    run(
        "fuzz_quantity",
        3000,
        mutated_text(seeds::QUANTITIES, &[b"Ki", b"Pi", b"e-9", b"000000000000"], 5),
        |s| {
            let Ok(q) = Quantity::parse(&s) else { return Ok(()) };
            let canonical = q.canonical();
            let again = Quantity::parse(&canonical)
                .map_err(|e| format!("canonical {canonical:?} of {s:?} does not parse: {e}"))?;
            if again.canonical() != canonical {
                return Err(format!("{s:?} -> {canonical:?} -> {:?}", again.canonical()));
            }
            let _ = (
                q.value(),
                q.milli_value(),
                q.as_f64(),
                q.checked_add(&again),
                q.checked_sub(&again),
                q.to_string(),
            );
            let _ = Quantity::from_json(&json!(q.as_f64()));
            Ok(())
        },
    );
}

#[test]
fn fuzz_cron_schedule_and_durations() {
    let schedules = [
        "*/5 * * * *",
        "0 0 * * 0",
        "@hourly",
        "@every 1h30m",
        "TZ=UTC 0 12 1-15/2 JAN-MAR MON-FRI",
        "59 23 31 12 7",
        "1,2,3 * * * *",
    ];
    run(
        "fuzz_cron_schedule_and_durations",
        2000,
        mutated_text(&schedules, &[b"-", b"/", b"*", b"?", b"L", b"W"], 5),
        |s| {
            let _ = crate::validation::validate_cron_schedule(&s);
            let _ = crate::validation::parse_go_duration(&s);
            Ok(())
        },
    );
}

#[test]
fn fuzz_bootstrap_and_join_tokens() {
    let seeds = [
        "abcdef.0123456789abcdef",
        "K10e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855::abcdef.0123456789abcdef",
        "system:bootstrappers:worker,system:bootstrappers:extra",
    ];
    run(
        "fuzz_bootstrap_and_join_tokens",
        1500,
        mutated_text(&seeds, &[b"::", b"K10"], 4),
        |s| {
            let _ = crate::bootstraptoken::parse_token(&s);
            if let Ok(t) = crate::bootstraptoken::JoinToken::parse(&s) {
                let printed = t.to_string();
                crate::bootstraptoken::JoinToken::parse(&printed).map_err(|e| format!("{printed:?}: {e}"))?;
            }
            let _ = crate::bootstraptoken::groups(&s);
            let _ = crate::bootstraptoken::validate_group_name(&s);
            Ok(())
        },
    );
}

const CSR: &str = "-----BEGIN CERTIFICATE REQUEST-----
MIIBETCBuAIBADAwMRUwEwYDVQQKDAxzeXN0ZW06bm9kZXMxFzAVBgNVBAMMDnN5
c3RlbTpub2RlOm4xMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEmDyapSaqGvbW
nheiQ+4REZ0vSHSJ9R952m6U8QBW9+4D9H4z1fir2leOZvUrxqWcjpdER1LKNs68
UqXfeolbgKAmMCQGCSqGSIb3DQEJDjEXMBUwEwYDVR0RBAwwCoICbjGHBAoAAAEw
CgYIKoZIzj0EAwIDSAAwRQIgGKp8VFBmJM/FybBpXGmR8R1K7bNhW4tn/IpY1YMh
3NICIQCU/lUX09diVFceB+PyVhqUUnn7BaQOC24HW669D6sOaQ==
-----END CERTIFICATE REQUEST-----
";

#[test]
fn csr_seed_is_valid() {
    let csr = crate::certificates::parse_csr(CSR.as_bytes()).expect("seed parses");
    assert_eq!(csr.common_name, "system:node:n1");
}

#[test]
fn fuzz_csr_pem() {
    let b64 = &base64::engine::general_purpose::STANDARD;
    let body: String = CSR.lines().filter(|l| !l.starts_with("-----")).collect();
    let der = b64.decode(body).expect("der");
    // Mutate the DER inside a well-formed PEM (so the ASN.1 parser sees it), or the PEM text.
    let strategy = prop_oneof![
        3 => mutated_bytes(vec![der], &[b"\x30\x82", b"\x30\x80", b"\x06\x03\x55\x1d\x11", b"\xff\xff\xff\xff"], 4)
            .prop_map(move |d| format!("-----BEGIN CERTIFICATE REQUEST-----\n{}\n-----END CERTIFICATE REQUEST-----\n", b64.encode(&*d)).into_bytes()),
        1 => mutated_bytes(vec![CSR.as_bytes().to_vec()], &[b"-----", b"\n"], 4).prop_map(|b| b.0),
    ];
    run("fuzz_csr_pem", 1500, strategy, |pem| {
        if let Ok(csr) = crate::certificates::parse_csr(&pem) {
            let usages = ["client auth", "digital signature"]
                .iter()
                .map(|s| s.to_string())
                .collect();
            let _ = crate::certificates::validate_kubelet_client_csr(&csr, &usages);
        }
        let obj = json!({"spec": {"request": b64.encode(&pem)}});
        let _ = crate::certificates::request_pem(&obj);
        Ok(())
    });
}

/// A kind's object and patch, both mutated structurally.
fn object_and_patch() -> impl Strategy<Value = (&'static str, Value, &'static str, Value)> {
    let objects = seeds::objects();
    let patches = seeds::patches();
    (0..objects.len(), 0..patches.len()).prop_flat_map(move |(o, p)| {
        let (plural, _, obj) = objects[o].clone();
        let (ct, pv) = patches[p].clone();
        (
            Just(plural),
            mutated_json(vec![obj], &[], 2),
            Just(ct),
            mutated_json(vec![pv], &[], 4),
        )
    })
}

#[test]
fn fuzz_patches() {
    run("fuzz_patches", 1500, object_and_patch(), |(plural, obj, ct, p)| {
        let def = definition(plural);
        let ty = PatchType::from_content_type(ct).expect("patch type");
        for ty in [ty, PatchType::Merge, PatchType::Strategic, PatchType::Json] {
            if let Err(e) = patch::patch(ty, &obj, &p, def) {
                let status = e.to_status();
                if !(400..500).contains(&status.code) {
                    return Err(format!("{ty:?} patch error {} is not a 4xx", status.code));
                }
            }
        }
        Ok(())
    });
}

#[test]
fn fuzz_json_pointer() {
    let seeds = [
        "/metadata/labels/a~1b",
        "/spec/containers/0/image",
        "/spec/containers/-",
        "",
        "/",
        "/a~0b/~01",
    ];
    run(
        "fuzz_json_pointer",
        1500,
        mutated_text(&seeds, &[b"~", b"~2", b"-", b"00", b"99999999999999999999"], 4),
        |s| {
            let _ = patch::json::pointer_tokens(&s);
            let doc = json!({"metadata": {"labels": {"a/b": "1"}}, "spec": {"containers": [{"image": "x"}]}});
            for op in ["add", "remove", "replace", "test", "move", "copy"] {
                let _ = patch::json_patch(&doc, &json!([{"op": op, "path": s, "from": s, "value": 1}]));
            }
            Ok(())
        },
    );
}

/// Server-side apply: a mutated body applied over a mutated live object whose managedFields a
/// client may have written (an update may set them), as two managers.
#[test]
fn fuzz_server_side_apply() {
    let objects = seeds::objects();
    let strategy = (0..objects.len()).prop_flat_map(move |i| {
        let (plural, _, obj) = objects[i].clone();
        (
            Just(plural),
            mutated_json(vec![obj.clone()], &[], 3),
            mutated_json(
                vec![obj],
                &["fieldsV1", "f:metadata", "f:spec", "k:{\"name\":\"c\"}", "v:\"a\"", "."],
                3,
            ),
            any::<bool>(),
        )
    });
    run(
        "fuzz_server_side_apply",
        400,
        strategy,
        |(plural, applied, live_seed, force)| {
            let def = definition(plural);
            let now = "2024-01-01T00:00:00Z";
            // A live object as an earlier apply by another manager left it, then changed.
            let live = match patch::apply(None, &live_seed, "other", false, def, now) {
                Ok(mut live) => {
                    if let Some(mf) = live.pointer_mut("/metadata/managedFields/0/fieldsV1")
                        && applied.get("spec").is_some()
                    {
                        // Fold part of the body into the recorded fields: they are client-writable.
                        *mf = json!({"f:spec": applied.get("spec").cloned().unwrap_or(Value::Null)});
                    }
                    Some(live)
                }
                Err(_) => None,
            };
            match patch::apply(live.as_ref(), &applied, "kubectl", force, def, now) {
                Ok(out) => {
                    let _ = patch::update_managed_fields(live.as_ref(), &out, "kubectl", "", def, now);
                }
                Err(e) => {
                    let status = patch::PatchError::from(e).to_status();
                    if !(400..500).contains(&status.code) {
                        return Err(format!("apply error {} is not a 4xx", status.code));
                    }
                }
            }
            Ok(())
        },
    );
}

#[test]
fn fuzz_apply_body_yaml() {
    let objects = seeds::objects();
    let yaml: Vec<Vec<u8>> = objects
        .iter()
        .map(|(_, _, o)| serde_saphyr::to_string(o).expect("yaml").into_bytes())
        .chain(objects.iter().map(|(_, _, o)| serde_json::to_vec(o).expect("json")))
        .collect();
    run(
        "fuzz_apply_body_yaml",
        1000,
        mutated_bytes(yaml, &[b"\n  ", b"\n- ", b": ", b"&x ", b"*x", b"<<: *x\n"], 5),
        |b| {
            let _ = patch::decode_apply_body(&b);
            Ok(())
        },
    );
}

/// Defaulting and validation of any object a client may send (after decoding), on create and
/// on update against the seed.
#[test]
fn fuzz_defaults_and_validation() {
    let objects = seeds::objects();
    let strategy = (0..objects.len()).prop_flat_map(move |i| {
        let (plural, _, obj) = objects[i].clone();
        (Just(plural), Just(obj.clone()), mutated_json(vec![obj], &[], 4))
    });
    run(
        "fuzz_defaults_and_validation",
        1500,
        strategy,
        |(plural, old, mut obj)| {
            let res = resource(plural);
            crate::defaults::apply_defaults(res, &mut obj);
            let _ = crate::validation::validate(res, &obj, None);
            let _ = crate::validation::validate(res, &obj, Some(&old));
            let _ = crate::validation::validate_write(res, "status", &old, Some(&obj));
            let _ = crate::schema::unknown_fields(definition(plural), &obj);
            let _ = crate::printers::row(res, &obj, jiff::Timestamp::UNIX_EPOCH);
            Ok(())
        },
    );
}
