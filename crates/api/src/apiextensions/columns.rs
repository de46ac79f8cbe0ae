//! `additionalPrinterColumns`: the columns `kubectl get` shows for a custom kind, each cell
//! found by a simple JSONPath (`.spec.replicas`, `.status.conditions[0].type`,
//! `.status.conditions[?(@.type=="Ready")].status`), as upstream's table convertor.

use jiff::Timestamp;
use serde_json::{Value, json};

use super::schema::Schema;

/// One printer column.
#[derive(Clone, Debug, PartialEq)]
pub struct PrinterColumn {
    pub name: String,
    pub ty: String,
    pub format: String,
    pub description: String,
    pub priority: i64,
    pub json_path: String,
}

/// The columns of a version (`additionalPrinterColumns`, defaulted to Age when absent). A
/// column without a description takes the description of the schema field it shows.
pub fn from_version(v: &Value, schema: Option<&Schema>) -> Vec<PrinterColumn> {
    let cols: Vec<PrinterColumn> = v
        .get("additionalPrinterColumns")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|c| {
                    let s = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or("").to_string();
                    let json_path = s("jsonPath");
                    let mut description = s("description");
                    if description.is_empty()
                        && let Some(sc) = schema.and_then(|sc| schema_at(sc, &json_path))
                    {
                        description = sc.description.clone();
                    }
                    PrinterColumn {
                        name: s("name"),
                        ty: s("type"),
                        format: s("format"),
                        description,
                        priority: c.get("priority").and_then(Value::as_i64).unwrap_or(0),
                        json_path,
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    if cols.is_empty() {
        return vec![PrinterColumn {
            name: "Age".into(),
            ty: "date".into(),
            format: String::new(),
            description: String::new(),
            priority: 0,
            json_path: ".metadata.creationTimestamp".into(),
        }];
    }
    cols
}

fn schema_at<'a>(schema: &'a Schema, path: &str) -> Option<&'a Schema> {
    let mut s = schema;
    for seg in path.trim_start_matches('.').split('.') {
        if seg.contains('[') {
            return None;
        }
        s = s.properties.get(seg)?;
    }
    Some(s)
}

enum Step {
    Key(String),
    Index(usize),
    /// `[?(@.KEY=="VALUE")]`
    Filter(String, String),
}

fn parse(path: &str) -> Option<Vec<Step>> {
    let p = path.trim();
    let p = p.strip_prefix('{').and_then(|x| x.strip_suffix('}')).unwrap_or(p);
    let p = p.strip_prefix('$').unwrap_or(p);
    let mut steps = Vec::new();
    let mut rest = p;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            steps.push(Step::Key(r[..end].to_string()));
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix('[') {
            let end = r.find(']')?;
            let inner = &r[..end];
            if let Some(f) = inner.strip_prefix("?(@.").and_then(|f| f.strip_suffix(')')) {
                let (k, v) = f.split_once("==")?;
                steps.push(Step::Filter(
                    k.trim().to_string(),
                    v.trim().trim_matches('"').trim_matches('\'').to_string(),
                ));
            } else if let Ok(i) = inner.parse::<usize>() {
                steps.push(Step::Index(i));
            } else {
                steps.push(Step::Key(inner.trim_matches('\'').trim_matches('"').to_string()));
            }
            rest = &r[end + 1..];
        } else {
            return None;
        }
    }
    Some(steps)
}

/// The first value `path` finds in `obj`.
pub fn find<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    let mut cur = obj;
    for step in parse(path)? {
        cur = match step {
            Step::Key(k) => cur.get(&k)?,
            Step::Index(i) => cur.get(i)?,
            Step::Filter(k, v) => cur.as_array()?.iter().find(|e| match e.get(&k) {
                Some(Value::String(s)) => *s == v,
                Some(other) => other.to_string().as_str() == v.as_str(),
                None => false,
            })?,
        };
    }
    Some(cur)
}

/// The cell of `col` for `obj`, as upstream's `cellForJSONValue`: a missing value is null,
/// dates are ages, strings print as kubectl's JSONPath prints them.
pub fn cell(col: &PrinterColumn, obj: &Value, now: Timestamp) -> Value {
    let Some(v) = find(obj, &col.json_path) else {
        return Value::Null;
    };
    match col.ty.as_str() {
        "string" => match v {
            Value::String(s) => json!(s),
            Value::Null => Value::Null,
            other => json!(other.to_string()),
        },
        "integer" => match v {
            Value::Number(n) => n
                .as_i64()
                .map(|i| json!(i))
                .or_else(|| n.as_f64().map(|f| json!(f as i64)))
                .unwrap_or(Value::Null),
            _ => Value::Null,
        },
        "number" => match v {
            Value::Number(_) => v.clone(),
            _ => Value::Null,
        },
        "boolean" => match v {
            Value::Bool(_) => v.clone(),
            _ => Value::Null,
        },
        "date" => match v.as_str().and_then(|s| s.parse::<Timestamp>().ok()) {
            Some(t) => json!(crate::printers::human_duration(now.duration_since(t).as_nanos())),
            None => Value::Null,
        },
        _ => Value::Null,
    }
}

/// The column's definition in a Table.
pub fn definition(col: &PrinterColumn) -> Value {
    json!({
        "name": col.name,
        "type": col.ty,
        "format": col.format,
        "description": col.description,
        "priority": col.priority,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simple_json_paths() {
        let o = json!({"spec": {"replicas": 3}, "status": {"conditions": [{"type": "A", "status": "False"}, {"type": "Ready", "status": "True"}]}});
        assert_eq!(find(&o, ".spec.replicas"), Some(&json!(3)));
        assert_eq!(find(&o, ".status.conditions[0].type"), Some(&json!("A")));
        assert_eq!(
            find(&o, ".status.conditions[?(@.type==\"Ready\")].status"),
            Some(&json!("True"))
        );
        assert_eq!(find(&o, ".spec.nope"), None);
        let col = PrinterColumn {
            name: "Replicas".into(),
            ty: "integer".into(),
            format: String::new(),
            description: String::new(),
            priority: 0,
            json_path: ".spec.replicas".into(),
        };
        assert_eq!(cell(&col, &o, Timestamp::now()), json!(3));
    }
}
