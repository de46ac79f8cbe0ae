//! An object's skeleton: what checks that walk an object against its schema read of it.
//!
//! Objects created alike (a ReplicaSet's pods, a scheduler's events) differ in names, times and
//! other scalar values that those checks never look at: the type check, strict field
//! validation and the fields a creator owns depend only on the keys, the kind of each value
//! (integers told from fractions), and, inside lists, the values themselves (a list's items
//! become keys and set members). Checks remember their answers under the skeleton.

use serde_json::Value;

/// Appends `v`'s skeleton to `out`. Lengths come before keys, strings and containers, so two
/// objects have the same skeleton only if the parts above are equal.
pub fn write(v: &Value, out: &mut Vec<u8>) {
    walk(v, false, out);
}

/// A cache key: each of `parts` (a definition name, a group, version and kind) ended by a NUL,
/// then `v`'s skeleton.
pub fn key(parts: &[&str], v: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(1024);
    for part in parts {
        out.extend_from_slice(part.as_bytes());
        out.push(0);
    }
    write(v, &mut out);
    out
}

fn len(n: usize, out: &mut Vec<u8>) {
    out.extend_from_slice(&(n as u64).to_le_bytes());
}

fn walk(v: &Value, in_list: bool, out: &mut Vec<u8>) {
    match v {
        Value::Null => out.push(b'n'),
        Value::Bool(b) => {
            out.push(b'b');
            if in_list {
                out.push(u8::from(*b));
            }
        }
        Value::Number(n) => {
            let whole = n.is_i64() || n.is_u64();
            let integral = n.as_f64().is_some_and(|f| f.fract() == 0.0 && f.abs() < 9.0e15);
            out.push(match (whole, integral) {
                (true, _) => b'i',
                (false, true) => b'g',
                (false, false) => b'f',
            });
            if in_list {
                let text = n.to_string();
                len(text.len(), out);
                out.extend_from_slice(text.as_bytes());
            }
        }
        Value::String(s) => {
            out.push(b's');
            if in_list {
                len(s.len(), out);
                out.extend_from_slice(s.as_bytes());
            }
        }
        Value::Array(items) => {
            out.push(b'[');
            len(items.len(), out);
            for item in items {
                walk(item, true, out);
            }
        }
        Value::Object(m) => {
            out.push(b'{');
            len(m.len(), out);
            for (k, item) in m {
                len(k.len(), out);
                out.extend_from_slice(k.as_bytes());
                walk(item, in_list, out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn of(v: Value) -> Vec<u8> {
        let mut out = Vec::new();
        write(&v, &mut out);
        out
    }

    #[test]
    fn scalars_count_by_kind_outside_lists_and_by_value_inside() {
        assert_eq!(of(json!({"name": "a", "n": 1})), of(json!({"name": "b", "n": 2})));
        assert_ne!(of(json!({"x": "1"})), of(json!({"x": 1})));
        assert_ne!(of(json!({"x": 1})), of(json!({"x": 1.5})));
        assert_ne!(of(json!({"x": 1.0})), of(json!({"x": 1.5})));
        assert_ne!(of(json!({"l": ["a"]})), of(json!({"l": ["b"]})));
        assert_ne!(of(json!({"l": [{"port": 80}]})), of(json!({"l": [{"port": 81}]})));
    }

    #[test]
    fn lengths_keep_apart_what_concatenates_alike() {
        assert_ne!(of(json!({"ab": {"c": null}})), of(json!({"a": {"bc": null}})));
        assert_ne!(of(json!({"l": ["ab", "c"]})), of(json!({"l": ["a", "bc"]})));
        assert_ne!(of(json!({"a": {}, "b": null})), of(json!({"a": {"b": null}})));
    }
}
