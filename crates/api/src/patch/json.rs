//! JSON patch (RFC 6902) with JSON pointers (RFC 6901).
//!
//! Behaves as the library upstream's API server uses: negative array indices count from
//! the end, a failed `test` of a missing path with a `null` value passes, and the error
//! messages have the same form ("testing value /spec/replicas failed: test failed").
//! A malformed patch document is a 400; an operation that does not apply is a 422.

use serde_json::Value;

use super::PatchError;
use super::typed::json_eq;

/// One operation of a JSON patch.
#[derive(Clone, Debug, PartialEq)]
pub enum Operation {
    Add { path: String, value: Value },
    Remove { path: String },
    Replace { path: String, value: Value },
    Move { from: String, path: String },
    Copy { from: String, path: String },
    Test { path: String, value: Value },
}

fn bad(msg: impl Into<String>) -> PatchError {
    PatchError::BadRequest(msg.into())
}

fn unprocessable(msg: impl Into<String>) -> PatchError {
    PatchError::Unprocessable(msg.into())
}

/// Parse a JSON patch document (an array of operations).
pub fn parse(patch: &Value) -> Result<Vec<Operation>, PatchError> {
    let Value::Array(ops) = patch else {
        return Err(bad(format!(
            "json: cannot unmarshal {} into Go value of type jsonpatch.Patch",
            super::typed::kind_name(patch)
        )));
    };
    ops.iter().map(parse_op).collect()
}

fn parse_op(op: &Value) -> Result<Operation, PatchError> {
    let Value::Object(m) = op else {
        return Err(bad(format!(
            "json: cannot unmarshal {} into Go value of type jsonpatch.Operation",
            super::typed::kind_name(op)
        )));
    };
    let string = |k: &str| -> Result<String, PatchError> {
        match m.get(k) {
            Some(Value::String(s)) => Ok(s.clone()),
            Some(_) => Err(bad(format!("operation {k} must be a string"))),
            None => Err(unprocessable(format!("operation missing {k} field"))),
        }
    };
    let kind = match m.get("op") {
        Some(Value::String(s)) => s.as_str(),
        Some(_) => return Err(bad("operation op must be a string")),
        None => return Err(unprocessable("operation missing op field")),
    };
    let value =
        || -> Result<Value, PatchError> { m.get("value").cloned().ok_or_else(|| unprocessable("missing value")) };
    Ok(match kind {
        "add" => Operation::Add {
            path: string("path")?,
            value: value()?,
        },
        "remove" => Operation::Remove { path: string("path")? },
        "replace" => Operation::Replace {
            path: string("path")?,
            value: value()?,
        },
        "move" => Operation::Move {
            from: string("from")?,
            path: string("path")?,
        },
        "copy" => Operation::Copy {
            from: string("from")?,
            path: string("path")?,
        },
        "test" => Operation::Test {
            path: string("path")?,
            // A test without a value tests for absence (or null).
            value: m.get("value").cloned().unwrap_or(Value::Null),
        },
        other => return Err(unprocessable(format!("Unexpected kind: {other}"))),
    })
}

/// Split a JSON pointer into unescaped reference tokens ("" is the whole document).
pub fn pointer_tokens(pointer: &str) -> Result<Vec<String>, PatchError> {
    if pointer.is_empty() {
        return Ok(Vec::new());
    }
    let Some(rest) = pointer.strip_prefix('/') else {
        return Err(unprocessable(format!(
            "JSON pointer must be empty or start with a \"/\": {pointer}"
        )));
    };
    rest.split('/').map(|t| unescape(t, pointer)).collect()
}

fn unescape(token: &str, pointer: &str) -> Result<String, PatchError> {
    let mut out = String::with_capacity(token.len());
    let mut chars = token.chars();
    while let Some(c) = chars.next() {
        if c == '~' {
            match chars.next() {
                Some('0') => out.push('~'),
                Some('1') => out.push('/'),
                _ => {
                    return Err(unprocessable(format!("invalid JSON pointer escape in {pointer}")));
                }
            }
        } else {
            out.push(c);
        }
    }
    Ok(out)
}

/// The index `token` names in an array of `len` elements (`allow_end`: `len` itself and `-`
/// are valid, as for `add`).
fn index(token: &str, len: usize, allow_end: bool) -> Result<usize, PatchError> {
    let invalid = || {
        unprocessable(format!(
            "Unable to access invalid index: {token}: invalid index referenced"
        ))
    };
    if token == "-" {
        return if allow_end { Ok(len) } else { Err(invalid()) };
    }
    let i: i64 = token.parse().map_err(|_| invalid())?;
    let i = if i < 0 { i + len as i64 } else { i };
    let max = if allow_end { len as i64 } else { len as i64 - 1 };
    if i < 0 || i > max {
        return Err(invalid());
    }
    Ok(i as usize)
}

fn get<'a>(doc: &'a Value, tokens: &[String]) -> Option<&'a Value> {
    let mut cur = doc;
    for t in tokens {
        cur = match cur {
            Value::Object(m) => m.get(t)?,
            Value::Array(a) => a.get(index(t, a.len(), false).ok()?)?,
            _ => return None,
        };
    }
    Some(cur)
}

fn get_mut<'a>(doc: &'a mut Value, tokens: &[String]) -> Option<&'a mut Value> {
    let mut cur = doc;
    for t in tokens {
        cur = match cur {
            Value::Object(m) => m.get_mut(t)?,
            Value::Array(a) => {
                let i = index(t, a.len(), false).ok()?;
                a.get_mut(i)?
            }
            _ => return None,
        };
    }
    Some(cur)
}

fn missing(op: &str, what: &str, path: &str) -> PatchError {
    unprocessable(format!(
        "{op} operation does not apply: doc is missing {what}: \"{path}\": missing value"
    ))
}

fn add(doc: &mut Value, path: &str, value: Value) -> Result<(), PatchError> {
    let tokens = pointer_tokens(path)?;
    let Some((last, parent)) = tokens.split_last() else {
        *doc = value;
        return Ok(());
    };
    match get_mut(doc, parent) {
        Some(Value::Object(m)) => {
            m.insert(last.clone(), value);
            Ok(())
        }
        Some(Value::Array(a)) => {
            let i = index(last, a.len(), true)?;
            a.insert(i, value);
            Ok(())
        }
        _ => Err(missing("add", "path", path)),
    }
}

fn remove(doc: &mut Value, path: &str) -> Result<Value, PatchError> {
    let tokens = pointer_tokens(path)?;
    let Some((last, parent)) = tokens.split_last() else {
        return Ok(std::mem::replace(doc, Value::Null));
    };
    match get_mut(doc, parent) {
        Some(Value::Object(m)) => m.shift_remove(last).ok_or_else(|| {
            unprocessable(format!(
                "error in remove for path: '{path}': Unable to remove nonexistent key: {last}: missing value"
            ))
        }),
        Some(Value::Array(a)) => {
            let i = index(last, a.len(), false)?;
            Ok(a.remove(i))
        }
        _ => Err(missing("remove", "path", path)),
    }
}

fn replace(doc: &mut Value, path: &str, value: Value) -> Result<(), PatchError> {
    let tokens = pointer_tokens(path)?;
    if tokens.is_empty() {
        *doc = value;
        return Ok(());
    }
    match get_mut(doc, &tokens) {
        Some(slot) => {
            *slot = value;
            Ok(())
        }
        None => Err(unprocessable(format!(
            "replace operation does not apply: doc is missing key: {path}: missing value"
        ))),
    }
}

/// Apply one operation to `doc` in place.
pub fn apply_operation(doc: &mut Value, op: &Operation) -> Result<(), PatchError> {
    match op {
        Operation::Add { path, value } => add(doc, path, value.clone()),
        Operation::Remove { path } => remove(doc, path).map(|_| ()),
        Operation::Replace { path, value } => replace(doc, path, value.clone()),
        Operation::Move { from, path } => {
            if from == path {
                return Ok(());
            }
            if path.starts_with(&format!("{from}/")) {
                return Err(unprocessable(format!(
                    "move operation does not apply: cannot move {from} into its own child {path}"
                )));
            }
            let tokens = pointer_tokens(from)?;
            if get(doc, &tokens).is_none() {
                return Err(missing("move", "from path", from));
            }
            let v = remove(doc, from)?;
            add(doc, path, v)
        }
        Operation::Copy { from, path } => {
            let tokens = pointer_tokens(from)?;
            let v = get(doc, &tokens)
                .cloned()
                .ok_or_else(|| missing("copy", "from path", from))?;
            add(doc, path, v)
        }
        Operation::Test { path, value } => {
            let tokens = pointer_tokens(path)?;
            match get(doc, &tokens) {
                None if value.is_null() => Ok(()),
                Some(v) if json_eq(v, value) => Ok(()),
                _ => Err(unprocessable(format!("testing value {path} failed: test failed"))),
            }
        }
    }
}

/// Apply a JSON patch document to `original`, returning the patched document. Nothing is
/// returned when any operation fails (the operations apply atomically).
pub fn json_patch(original: &Value, patch: &Value) -> Result<Value, PatchError> {
    let ops = parse(patch)?;
    let mut doc = original.clone();
    for op in &ops {
        apply_operation(&mut doc, op)?;
    }
    Ok(doc)
}

/// Escape a key for use as a JSON pointer token.
pub fn escape(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

/// A JSON pointer to a path of object keys.
pub fn pointer(keys: &[&str]) -> String {
    keys.iter().map(|k| format!("/{}", escape(k))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(doc: Value, patch: Value) -> Result<Value, PatchError> {
        json_patch(&doc, &patch)
    }

    #[test]
    fn rfc6902_appendix_examples() {
        // A.1 add an object member
        assert_eq!(
            run(
                json!({"foo": "bar"}),
                json!([{"op": "add", "path": "/baz", "value": "qux"}])
            )
            .expect("a1"),
            json!({"foo": "bar", "baz": "qux"})
        );
        // A.2 add an array element
        assert_eq!(
            run(
                json!({"foo": ["bar", "baz"]}),
                json!([{"op": "add", "path": "/foo/1", "value": "qux"}])
            )
            .expect("a2"),
            json!({"foo": ["bar", "qux", "baz"]})
        );
        // A.3 remove an object member
        assert_eq!(
            run(
                json!({"baz": "qux", "foo": "bar"}),
                json!([{"op": "remove", "path": "/baz"}])
            )
            .expect("a3"),
            json!({"foo": "bar"})
        );
        // A.4 remove an array element
        assert_eq!(
            run(
                json!({"foo": ["bar", "qux", "baz"]}),
                json!([{"op": "remove", "path": "/foo/1"}])
            )
            .expect("a4"),
            json!({"foo": ["bar", "baz"]})
        );
        // A.5 replace a value
        assert_eq!(
            run(
                json!({"baz": "qux", "foo": "bar"}),
                json!([{"op": "replace", "path": "/baz", "value": "boo"}])
            )
            .expect("a5"),
            json!({"baz": "boo", "foo": "bar"})
        );
        // A.6 move a value
        assert_eq!(
            run(
                json!({"foo": {"bar": "baz", "waldo": "fred"}, "qux": {"corge": "grault"}}),
                json!([{"op": "move", "from": "/foo/waldo", "path": "/qux/thud"}])
            )
            .expect("a6"),
            json!({"foo": {"bar": "baz"}, "qux": {"corge": "grault", "thud": "fred"}})
        );
        // A.7 move an array element
        assert_eq!(
            run(
                json!({"foo": ["all", "grass", "cows", "eat"]}),
                json!([{"op": "move", "from": "/foo/1", "path": "/foo/3"}])
            )
            .expect("a7"),
            json!({"foo": ["all", "cows", "eat", "grass"]})
        );
        // A.8 test success
        assert!(
            run(
                json!({"baz": "qux", "foo": ["a", 2, "c"]}),
                json!([{"op": "test", "path": "/baz", "value": "qux"}, {"op": "test", "path": "/foo/1", "value": 2}])
            )
            .is_ok()
        );
        // A.10 add a nested member object
        assert_eq!(
            run(
                json!({"foo": "bar"}),
                json!([{"op": "add", "path": "/child", "value": {"grandchild": {}}}])
            )
            .expect("a10"),
            json!({"foo": "bar", "child": {"grandchild": {}}})
        );
        // A.12 adding to a nonexistent target
        let err = run(
            json!({"foo": "bar"}),
            json!([{"op": "add", "path": "/baz/bat", "value": "qux"}]),
        )
        .expect_err("a12");
        assert_eq!(err.code(), 422);
        // A.14 ~ escape ordering
        assert!(
            run(
                json!({"/": 9, "~1": 10}),
                json!([{"op": "test", "path": "/~01", "value": 10}])
            )
            .is_ok()
        );
        // A.16 append with "-"
        assert_eq!(
            run(
                json!({"foo": ["bar"]}),
                json!([{"op": "add", "path": "/foo/-", "value": ["abc", "def"]}])
            )
            .expect("a16"),
            json!({"foo": ["bar", ["abc", "def"]]})
        );
    }

    #[test]
    fn test_failure_message_is_upstreams() {
        let err = run(
            json!({"spec": {"replicas": 2}}),
            json!([{"op": "test", "path": "/spec/replicas", "value": 3}]),
        )
        .expect_err("test fails");
        assert_eq!(
            err,
            PatchError::Unprocessable("testing value /spec/replicas failed: test failed".into())
        );
    }

    #[test]
    fn annotation_keys_with_slashes() {
        // kubectl rollout undo replaces annotations; keys with "/" are escaped.
        let doc = json!({"metadata": {"annotations": {"deployment.kubernetes.io/revision": "2"}}});
        let p = json!([
            {"op": "replace", "path": "/metadata/annotations/deployment.kubernetes.io~1revision", "value": "3"},
            {"op": "copy", "from": "/metadata/annotations", "path": "/metadata/labels"}
        ]);
        let out = run(doc, p).expect("patch");
        assert_eq!(out["metadata"]["annotations"]["deployment.kubernetes.io/revision"], "3");
        assert_eq!(out["metadata"]["labels"]["deployment.kubernetes.io/revision"], "3");
        assert_eq!(
            pointer(&["metadata", "annotations", "a/b~c"]),
            "/metadata/annotations/a~1b~0c"
        );
    }

    #[test]
    fn atomic_and_errors() {
        let doc = json!({"a": [1, 2, 3]});
        // The second op fails: nothing of the first is visible.
        assert!(
            run(
                doc.clone(),
                json!([{"op": "remove", "path": "/a/0"}, {"op": "remove", "path": "/b"}])
            )
            .is_err()
        );
        // Negative index counts from the end.
        assert_eq!(
            run(doc.clone(), json!([{"op": "remove", "path": "/a/-1"}])).expect("neg"),
            json!({"a": [1, 2]})
        );
        assert_eq!(
            run(doc.clone(), json!([{"op": "remove", "path": "/a/5"}]))
                .expect_err("oob")
                .code(),
            422
        );
        assert_eq!(
            run(doc.clone(), json!({"op": "add"})).expect_err("not array").code(),
            400
        );
        assert_eq!(
            run(doc.clone(), json!([{"op": "frob", "path": "/a"}]))
                .expect_err("op")
                .code(),
            422
        );
        assert_eq!(
            run(doc.clone(), json!([{"op": "replace", "path": "/z", "value": 1}]))
                .expect_err("replace")
                .code(),
            422
        );
        assert_eq!(
            run(doc.clone(), json!([{"op": "move", "from": "/a", "path": "/a/0"}]))
                .expect_err("child")
                .code(),
            422
        );
        // Replacing the whole document.
        assert_eq!(
            run(doc.clone(), json!([{"op": "replace", "path": "", "value": {"b": 1}}])).expect("root"),
            json!({"b": 1})
        );
        // Testing a missing value against null passes; numbers compare by value.
        assert!(run(doc.clone(), json!([{"op": "test", "path": "/missing", "value": null}])).is_ok());
        assert!(run(json!({"n": 1.0}), json!([{"op": "test", "path": "/n", "value": 1}])).is_ok());
    }
}
