//! Bounded, seeded fuzzing for the parsers that read bytes from clients and peers.
//!
//! Every fuzz target is an ordinary unit test that calls [`run`] with a strategy (usually real
//! inputs mutated bytewise by [`mutated_bytes`] or structurally by [`mutated_json`]) and a check
//! that must hold for every input. The run is deterministic: the seed is fixed unless
//! `SKIFF_FUZZ_SEED` is set, and a failure prints the seed, the smallest failing input proptest
//! shrank it to, and how to rerun it. The number of cases is each target's default times
//! `SKIFF_FUZZ_SCALE` (default 1), so the ordinary test run stays short and a longer run is
//! `SKIFF_FUZZ_SCALE=100 SKIFF_FUZZ_SEED=random cargo nextest run fuzz_`.

use std::fmt;

pub mod seeds;

pub use proptest;
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestError, TestRunner};
use serde_json::{Map, Value};

/// The seed every target starts from when `SKIFF_FUZZ_SEED` is unset.
const DEFAULT_SEED: u64 = 0x5e1f_f00d;

/// Multiplier of every target's case count (`SKIFF_FUZZ_SCALE`, default 1).
pub fn scale() -> u32 {
    std::env::var("SKIFF_FUZZ_SCALE")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(1)
}

/// The run's seed: `SKIFF_FUZZ_SEED` (a number, or `random` for one drawn from the clock), else
/// a fixed one, so that the ordinary test run is reproducible.
pub fn seed() -> u64 {
    match std::env::var("SKIFF_FUZZ_SEED") {
        Ok(s) if s.trim() == "random" => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(DEFAULT_SEED),
        Ok(s) => s.trim().parse().unwrap_or(DEFAULT_SEED),
        Err(_) => DEFAULT_SEED,
    }
}

/// FNV-1a of the target's name: each target draws its own inputs from the run's seed.
fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Runs `check` on `default_cases * scale()` inputs drawn from `strategy`. A panic inside
/// `check` counts as a failure (proptest catches it), as does an `Err`. On failure this panics
/// with the seed, the shrunk input and the reason.
pub fn run<S>(name: &str, default_cases: u32, strategy: S, check: impl Fn(S::Value) -> Result<(), String>)
where
    S: Strategy,
    S::Value: fmt::Debug,
{
    let seed = seed();
    let config = Config {
        cases: default_cases.saturating_mul(scale()),
        failure_persistence: None,
        rng_seed: RngSeed::Fixed(seed ^ name_hash(name)),
        max_shrink_iters: 4096,
        // Rejections are a strategy bug here, not a property of the input.
        max_global_rejects: 16,
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    let result = runner.run(&strategy, |input| check(input).map_err(TestCaseError::fail));
    match result {
        Ok(()) => {}
        Err(TestError::Fail(reason, input)) => panic!(
            "fuzz target {name} failed with SKIFF_FUZZ_SEED={seed} (rerun: SKIFF_FUZZ_SEED={seed} cargo nextest run {name})\n\
             reason: {reason}\nsmallest failing input: {input:#?}"
        ),
        Err(TestError::Abort(reason)) => panic!("fuzz target {name} aborted with SKIFF_FUZZ_SEED={seed}: {reason}"),
    }
}

/// Bytes that print as an escaped string in failure reports (an exact input to paste into a
/// regression test).
#[derive(Clone, PartialEq, Eq)]
pub struct Input(pub Vec<u8>);

impl fmt::Debug for Input {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "b\"{}\"", self.0.escape_ascii())
    }
}

impl std::ops::Deref for Input {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

/// Tokens that break parsers of JSON, YAML and the Kubernetes text forms (quantities,
/// selectors, times); callers add their own.
pub const TOKENS: &[&[u8]] = &[
    b"{",
    b"}",
    b"[",
    b"]",
    b"\"",
    b":",
    b",",
    b"null",
    b"true",
    b"-",
    b"0",
    b"-1",
    b"1e999",
    b"-1e308",
    b"9223372036854775807",
    b"9223372036854775808",
    b"-9223372036854775809",
    b"18446744073709551616",
    b"1.5",
    b"0x10",
    b"\\u0000",
    b"\\ud800",
    b"\\",
    b"\x00",
    b"\xff",
    b"\xc3",
    b"\xe2\x82",
    b"\t",
    b"\n",
    b"\r\n",
    b" ",
    b"&a ",
    b"*a",
    b"!!binary ",
    b"!!str ",
    b"<<: ",
    b"---\n",
    b"...\n",
    b"- ",
    b"? ",
    b"|\n",
    b"'",
    b"#",
    b"%YAML 1.2\n",
    b"=",
    b"==",
    b"!=",
    b"!",
    b" in (",
    b" notin (",
    b")",
    b"(",
    b"/",
    b"%",
    b"Ki",
    b"Mi",
    b"Ei",
    b"e18",
    b"E",
    b"m",
    b"n",
    b"u",
    b"k",
    b"$patch",
    b"$retainKeys",
    b"$setElementOrder/",
    b"$deleteFromPrimitiveList/",
    b"Z",
    b"T",
    b"+",
    b".",
    b"a",
    b"A",
];

#[derive(Clone, Debug)]
enum ByteOp {
    Flip(Index, u8),
    Set(Index, u8),
    Insert(Index, Vec<u8>),
    Token(Index, Index),
    Remove(Index, usize),
    Duplicate(Index, usize),
    Truncate(Index),
    Splice(Index, Index, Index, usize),
}

fn byte_op() -> impl Strategy<Value = ByteOp> {
    prop_oneof![
        1 => (any::<Index>(), 0u8..8).prop_map(|(i, b)| ByteOp::Flip(i, b)),
        1 => (any::<Index>(), any::<u8>()).prop_map(|(i, b)| ByteOp::Set(i, b)),
        1 => (any::<Index>(), prop::collection::vec(any::<u8>(), 1..6)).prop_map(|(i, b)| ByteOp::Insert(i, b)),
        3 => (any::<Index>(), any::<Index>()).prop_map(|(i, t)| ByteOp::Token(i, t)),
        1 => (any::<Index>(), 1usize..16).prop_map(|(i, n)| ByteOp::Remove(i, n)),
        1 => (any::<Index>(), 1usize..32).prop_map(|(i, n)| ByteOp::Duplicate(i, n)),
        1 => (any::<Index>()).prop_map(ByteOp::Truncate),
        1 => (any::<Index>(), any::<Index>(), any::<Index>(), 1usize..64).prop_map(|(a, b, c, n)| ByteOp::Splice(a, b, c, n)),
    ]
}

fn apply_byte_op(buf: &mut Vec<u8>, op: &ByteOp, seeds: &[Vec<u8>], tokens: &[Vec<u8>]) {
    let len = buf.len();
    let at = |i: &Index| if len == 0 { 0 } else { i.index(len + 1) };
    match op {
        ByteOp::Flip(i, bit) if len > 0 => {
            let i = i.index(len);
            buf[i] ^= 1 << bit;
        }
        ByteOp::Set(i, b) if len > 0 => {
            let i = i.index(len);
            buf[i] = *b;
        }
        ByteOp::Insert(i, bytes) => {
            let i = at(i);
            buf.splice(i..i, bytes.iter().copied());
        }
        ByteOp::Token(i, t) if !tokens.is_empty() => {
            let i = at(i);
            let token = &tokens[t.index(tokens.len())];
            buf.splice(i..i, token.iter().copied());
        }
        ByteOp::Remove(i, n) if len > 0 => {
            let i = i.index(len);
            buf.drain(i..(i + n).min(len));
        }
        ByteOp::Duplicate(i, n) if len > 0 => {
            let i = i.index(len);
            let piece = buf[i..(i + n).min(len)].to_vec();
            buf.splice(i..i, piece);
        }
        ByteOp::Truncate(i) => {
            let i = at(i);
            buf.truncate(i);
        }
        ByteOp::Splice(i, s, from, n) if !seeds.is_empty() => {
            let other = &seeds[s.index(seeds.len())];
            if !other.is_empty() {
                let from = from.index(other.len());
                let piece = &other[from..(from + n).min(other.len())];
                let i = at(i);
                buf.splice(i..i, piece.iter().copied());
            }
        }
        _ => {}
    }
}

/// One of `seeds`, changed by up to `max_ops` byte edits (bit flips, inserted bytes and
/// tokens from [`TOKENS`] and `extra_tokens`, removals, duplications, truncation, pieces of other
/// seeds), or now and then plain random bytes.
pub fn mutated_bytes(seeds: Vec<Vec<u8>>, extra_tokens: &[&[u8]], max_ops: usize) -> impl Strategy<Value = Input> {
    let tokens: Vec<Vec<u8>> = TOKENS.iter().chain(extra_tokens.iter()).map(|t| t.to_vec()).collect();
    let n = seeds.len().max(1);
    let mutated = (any::<Index>(), prop::collection::vec(byte_op(), 0..=max_ops)).prop_map(move |(i, ops)| {
        let mut buf = seeds.get(i.index(n)).cloned().unwrap_or_default();
        for op in &ops {
            apply_byte_op(&mut buf, op, &seeds, &tokens);
        }
        Input(buf)
    });
    prop_oneof![
        12 => mutated,
        1 => prop::collection::vec(any::<u8>(), 0..48).prop_map(Input),
    ]
}

/// Byte edits drawn up front and applied later to bytes built inside the check (an encoding of a
/// structurally mutated object, say).
#[derive(Clone, Debug)]
pub struct ByteEdits(Vec<ByteOp>);

impl ByteEdits {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Applies the edits to `buf`; splices copy from `buf` itself.
    pub fn apply(&self, buf: &mut Vec<u8>) {
        let tokens: Vec<Vec<u8>> = TOKENS.iter().map(|t| t.to_vec()).collect();
        let own = vec![buf.clone()];
        for op in &self.0 {
            apply_byte_op(buf, op, &own, &tokens);
        }
    }
}

/// Up to `max_ops` byte edits (see [`mutated_bytes`]), none about half the time.
pub fn byte_edits(max_ops: usize) -> impl Strategy<Value = ByteEdits> {
    prop_oneof![
        1 => Just(ByteEdits(Vec::new())),
        1 => prop::collection::vec(byte_op(), 1..=max_ops.max(1)).prop_map(ByteEdits),
    ]
}

/// Like [`mutated_bytes`] for text inputs: the result is the mutated bytes read lossily as
/// UTF-8 (parsers of `&str` never see invalid UTF-8; their callers reject it first).
pub fn mutated_text(seeds: &[&str], extra_tokens: &[&[u8]], max_ops: usize) -> impl Strategy<Value = String> {
    let seeds = seeds.iter().map(|s| s.as_bytes().to_vec()).collect();
    mutated_bytes(seeds, extra_tokens, max_ops).prop_map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// Keys that reach the special cases of Kubernetes objects and patches.
pub const KEYS: &[&str] = &[
    "apiVersion",
    "kind",
    "metadata",
    "name",
    "namespace",
    "generateName",
    "labels",
    "annotations",
    "resourceVersion",
    "uid",
    "finalizers",
    "ownerReferences",
    "managedFields",
    "deletionTimestamp",
    "creationTimestamp",
    "generation",
    "spec",
    "status",
    "containers",
    "initContainers",
    "image",
    "env",
    "ports",
    "containerPort",
    "protocol",
    "volumes",
    "volumeMounts",
    "mountPath",
    "resources",
    "limits",
    "requests",
    "cpu",
    "memory",
    "replicas",
    "selector",
    "matchLabels",
    "matchExpressions",
    "key",
    "operator",
    "values",
    "template",
    "data",
    "stringData",
    "binaryData",
    "type",
    "taints",
    "effect",
    "nodeName",
    "schedule",
    "jobTemplate",
    "strategy",
    "rollingUpdate",
    "maxSurge",
    "maxUnavailable",
    "clusterIP",
    "clusterIPs",
    "targetPort",
    "port",
    "nodePort",
    "rules",
    "verbs",
    "apiGroups",
    "roleRef",
    "subjects",
    "op",
    "path",
    "value",
    "from",
    "$patch",
    "$retainKeys",
    "$setElementOrder/containers",
    "$setElementOrder/ports",
    "$deleteFromPrimitiveList/finalizers",
    "",
];

/// Values that exercise type confusion, bounds and escapes.
fn odd_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        Just(Value::from(u64::MAX)),
        any::<f64>().prop_map(|f| serde_json::Number::from_f64(f)
            .map(Value::Number)
            .unwrap_or(Value::Null)),
        Just(Value::from(-1)),
        Just(Value::from(0)),
        Just(Value::from(1.5)),
        "\\PC{0,12}".prop_map(Value::String),
        prop::sample::select(vec![
            "",
            "1",
            "-1",
            "0.5",
            "1e400",
            "100Mi",
            "1.5Gi",
            "-1Ki",
            "9999999999999999999Ei",
            "0.000000001m",
            "a=b",
            "!a",
            "a in (x)",
            "x,y",
            "replace",
            "delete",
            "merge",
            "retainKeys",
            "2024-13-45T99:99:99Z",
            "1970-01-01T00:00:00Z",
            "v1",
            "apps/v1",
            "/",
            "..",
            "a/b/c",
            "\u{0}",
            "\u{feff}",
            "%",
            "*/5 * * * *",
        ])
        .prop_map(|s| Value::String(s.to_string())),
        Just(Value::Object(Map::new())),
        Just(Value::Array(Vec::new())),
        Just(serde_json::json!([null])),
        Just(serde_json::json!({"$patch": "delete"})),
        Just(serde_json::json!({"$patch": "replace"})),
        Just(serde_json::json!([{"$patch": "delete"}])),
        Just(serde_json::json!([{"name": "a"}, {"name": "a"}])),
        Just(serde_json::json!([{}])),
        (1usize..64).prop_map(|depth| (0..depth).fold(Value::Null, |v, _| serde_json::json!({ "a": [v] }))),
    ]
}

#[derive(Clone, Debug)]
enum JsonOp {
    Replace(Vec<Index>, Value),
    Remove(Vec<Index>),
    Insert(Vec<Index>, String, Value),
    Duplicate(Vec<Index>),
    Graft(Vec<Index>, Vec<Index>),
}

fn json_op(keys: Vec<String>) -> impl Strategy<Value = JsonOp> {
    let path = || prop::collection::vec(any::<Index>(), 0..8);
    let key = prop_oneof![prop::sample::select(keys), "[a-zA-Z$/.]{0,8}"];
    prop_oneof![
        4 => (path(), odd_value()).prop_map(|(p, v)| JsonOp::Replace(p, v)),
        2 => path().prop_map(JsonOp::Remove),
        3 => (path(), key, odd_value()).prop_map(|(p, k, v)| JsonOp::Insert(p, k, v)),
        1 => path().prop_map(JsonOp::Duplicate),
        1 => (path(), path()).prop_map(|(a, b)| JsonOp::Graft(a, b)),
    ]
}

/// Follows `path` (each step picks a child of an object or array) as far as it goes.
fn walk<'a>(v: &'a mut Value, path: &[Index]) -> Option<&'a mut Value> {
    let Some((step, rest)) = path.split_first() else {
        return Some(v);
    };
    let len = match &*v {
        Value::Object(m) => m.len(),
        Value::Array(a) => a.len(),
        _ => 0,
    };
    if len == 0 {
        return Some(v);
    }
    let i = step.index(len);
    match v {
        Value::Object(m) => {
            let key = m.keys().nth(i).cloned()?;
            walk(m.get_mut(&key)?, rest)
        }
        Value::Array(a) => walk(a.get_mut(i)?, rest),
        _ => None,
    }
}

/// Removes the child the last step of `path` names (the parent is followed with the steps before).
fn remove_at(root: &mut Value, path: &[Index]) {
    let Some((last, parent)) = path.split_last() else {
        return;
    };
    match walk(root, parent) {
        Some(Value::Object(m)) if !m.is_empty() => {
            let i = last.index(m.len());
            if let Some(k) = m.keys().nth(i).cloned() {
                m.shift_remove(&k);
            }
        }
        Some(Value::Array(a)) if !a.is_empty() => {
            let i = last.index(a.len());
            a.remove(i);
        }
        _ => {}
    }
}

fn apply_json_op(root: &mut Value, op: JsonOp) {
    match op {
        JsonOp::Replace(p, v) => {
            if let Some(node) = walk(root, &p) {
                *node = v;
            }
        }
        JsonOp::Remove(p) => remove_at(root, &p),
        JsonOp::Insert(p, k, v) => match walk(root, &p) {
            Some(Value::Object(m)) => {
                m.insert(k, v);
            }
            Some(Value::Array(a)) => a.push(v),
            Some(other) => *other = v,
            None => {}
        },
        JsonOp::Duplicate(p) => {
            if let Some(Value::Array(a)) = walk(root, &p)
                && let Some(first) = a.first().cloned()
            {
                a.push(first);
            }
        }
        JsonOp::Graft(from, to) => {
            let piece = walk(root, &from).map(|v| v.clone());
            if let (Some(piece), Some(node)) = (piece, walk(root, &to)) {
                *node = piece;
            }
        }
    }
}

/// One of `seeds`, changed by up to `max_ops` structural edits: a node replaced by an odd value
/// (wrong type, extreme number, odd string, patch directive, deep nesting), removed, a key added,
/// an array element duplicated, a subtree copied elsewhere.
pub fn mutated_json(seeds: Vec<Value>, extra_keys: &[&str], max_ops: usize) -> impl Strategy<Value = Value> {
    let keys: Vec<String> = KEYS.iter().chain(extra_keys.iter()).map(|k| k.to_string()).collect();
    let n = seeds.len().max(1);
    (any::<Index>(), prop::collection::vec(json_op(keys), 0..=max_ops)).prop_map(move |(i, ops)| {
        let mut v = seeds.get(i.index(n)).cloned().unwrap_or(Value::Null);
        for op in ops {
            apply_json_op(&mut v, op);
        }
        v
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::ValueTree;

    #[test]
    fn mutations_are_deterministic_per_seed_and_vary() {
        let strategy = mutated_bytes(vec![b"{\"a\":1}".to_vec()], &[], 4);
        let draw = |seed: u64| {
            let mut runner = TestRunner::new(Config {
                rng_seed: RngSeed::Fixed(seed),
                ..Config::default()
            });
            (0..32)
                .map(|_| strategy.new_tree(&mut runner).map(|t| t.current().0).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(1), draw(1));
        assert_ne!(draw(1), draw(2));
        assert!(draw(1).iter().any(|b| b != b"{\"a\":1}"));
    }

    #[test]
    fn json_mutations_change_the_seed() {
        let seed = serde_json::json!({"metadata": {"name": "a", "labels": {"x": "y"}}, "spec": {"containers": [{"name": "c"}]}});
        let strategy = mutated_json(vec![seed.clone()], &[], 3);
        let mut runner = TestRunner::new(Config {
            rng_seed: RngSeed::Fixed(7),
            ..Config::default()
        });
        let changed = (0..64)
            .filter(|_| strategy.new_tree(&mut runner).unwrap().current() != seed)
            .count();
        assert!(changed > 32, "only {changed} of 64 changed");
    }

    #[test]
    fn a_failing_check_reports_the_seed_and_a_shrunk_input() {
        let result = std::panic::catch_unwind(|| {
            run("selftest", 64, mutated_bytes(vec![b"abcdef".to_vec()], &[], 4), |b| {
                if b.len() > 8 { Err("longer".into()) } else { Ok(()) }
            })
        });
        let msg = result.unwrap_err().downcast::<String>().unwrap();
        assert!(msg.contains("SKIFF_FUZZ_SEED="), "{msg}");
        assert!(msg.contains("longer"), "{msg}");
    }
}
