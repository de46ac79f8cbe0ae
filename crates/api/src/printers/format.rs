//! Small formatting helpers shared by the printers, each the port of an upstream helper.

use jiff::Timestamp;
use serde_json::Value;

use crate::quantity::Quantity;
use crate::selector::LabelSelector;

const NANOS_PER_SECOND: i128 = 1_000_000_000;

/// Upstream's `duration.HumanDuration`: `5s`, `3m2s`, `15m`, `5h3m`, `2d3h`, `400d`, `3y20d`.
/// Up to two seconds in the future still reads as `0s`; further is `<invalid>`.
pub fn human_duration(nanos: i128) -> String {
    let seconds = nanos / NANOS_PER_SECOND;
    if seconds < -1 {
        return "<invalid>".to_string();
    } else if seconds < 0 {
        return "0s".to_string();
    } else if seconds < 60 * 2 {
        return format!("{seconds}s");
    }
    let minutes = nanos / (60 * NANOS_PER_SECOND);
    if minutes < 10 {
        let s = seconds % 60;
        if s == 0 {
            return format!("{minutes}m");
        }
        return format!("{minutes}m{s}s");
    } else if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = nanos / (3600 * NANOS_PER_SECOND);
    if hours < 8 {
        let m = minutes % 60;
        if m == 0 {
            return format!("{hours}h");
        }
        return format!("{hours}h{m}m");
    } else if hours < 48 {
        return format!("{hours}h");
    } else if hours < 24 * 8 {
        let h = hours % 24;
        if h == 0 {
            return format!("{}d", hours / 24);
        }
        return format!("{}d{}h", hours / 24, h);
    } else if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    } else if hours < 24 * 365 * 8 {
        let dy = (hours / 24) % 365;
        if dy == 0 {
            return format!("{}y", hours / 24 / 365);
        }
        return format!("{}y{}d", hours / 24 / 365, dy);
    }
    format!("{}y", hours / 24 / 365)
}

/// A timestamp field (RFC 3339, with or without fractional seconds).
pub(crate) fn timestamp(v: Option<&Value>) -> Option<Timestamp> {
    v.and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .and_then(|s| s.parse::<Timestamp>().ok())
}

/// Upstream's `translateTimestampSince`: `<unknown>` for a missing time.
pub(crate) fn since(t: Option<Timestamp>, now: Timestamp) -> String {
    match t {
        Some(t) => human_duration(now.as_nanosecond() - t.as_nanosecond()),
        None => "<unknown>".to_string(),
    }
}

/// The AGE cell of an object.
pub(crate) fn age(obj: &Value, now: Timestamp) -> String {
    since(timestamp(obj.pointer("/metadata/creationTimestamp")), now)
}

pub(crate) fn name(obj: &Value) -> &str {
    str_at(obj, "/metadata/name")
}

pub(crate) fn str_at<'a>(obj: &'a Value, pointer: &str) -> &'a str {
    obj.pointer(pointer).and_then(Value::as_str).unwrap_or_default()
}

pub(crate) fn int_at(obj: &Value, pointer: &str) -> i64 {
    obj.pointer(pointer).and_then(Value::as_i64).unwrap_or(0)
}

pub(crate) fn bool_at(obj: &Value, pointer: &str) -> bool {
    obj.pointer(pointer).and_then(Value::as_bool).unwrap_or(false)
}

pub(crate) fn array_at<'a>(obj: &'a Value, pointer: &str) -> &'a [Value] {
    obj.pointer(pointer)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

/// The number of entries of a map field.
pub(crate) fn map_len(obj: &Value, pointer: &str) -> usize {
    obj.pointer(pointer).and_then(Value::as_object).map_or(0, |m| m.len())
}

pub(crate) fn is_set(obj: &Value, pointer: &str) -> bool {
    obj.pointer(pointer).is_some_and(|v| !v.is_null())
}

/// Upstream's `labels.FormatLabels`: `a=b,c=d` sorted by key, `<none>` when empty.
pub(crate) fn format_labels(labels: Option<&Value>) -> String {
    let Some(map) = labels.and_then(Value::as_object) else {
        return "<none>".to_string();
    };
    let mut pairs: Vec<(&String, &str)> = map.iter().map(|(k, v)| (k, v.as_str().unwrap_or_default())).collect();
    pairs.sort();
    let out: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
    if out.is_empty() {
        "<none>".to_string()
    } else {
        out.join(",")
    }
}

/// Upstream's `metav1.FormatLabelSelector`: the selector string, `<none>` when it selects
/// everything or nothing, `<error>` when invalid.
pub(crate) fn format_label_selector(selector: Option<&Value>) -> String {
    match LabelSelector::from_label_selector_json(selector.unwrap_or(&Value::Null)) {
        Ok(s) => {
            let text = s.to_string();
            if text.is_empty() { "<none>".to_string() } else { text }
        }
        Err(_) => "<error>".to_string(),
    }
}

/// A label selector's string as the deployment printer shows it: "" for none, `<invalid>`
/// when it does not parse.
pub(crate) fn selector_string(selector: Option<&Value>) -> String {
    match LabelSelector::from_label_selector_json(selector.unwrap_or(&Value::Null)) {
        Ok(s) => s.to_string(),
        Err(_) => "<invalid>".to_string(),
    }
}

/// Upstream's `layoutContainerCells`: names and images, comma-separated.
pub(crate) fn container_cells(pod_spec: Option<&Value>) -> (String, String) {
    let containers = pod_spec
        .and_then(|s| s.get("containers"))
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let names: Vec<&str> = containers.iter().map(|c| str_at(c, "/name")).collect();
    let images: Vec<&str> = containers.iter().map(|c| str_at(c, "/image")).collect();
    (names.join(","), images.join(","))
}

/// A quantity field in canonical form; a missing one is upstream's zero quantity, `0`.
pub(crate) fn quantity(v: Option<&Value>) -> String {
    match v.filter(|v| !v.is_null()) {
        None => "0".to_string(),
        Some(v) => match Quantity::from_json(v) {
            Ok(q) => q.canonical(),
            Err(_) => v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string()),
        },
    }
}

/// Upstream's `helper.GetAccessModesAsString`: `RWO,ROX,RWX,RWOP` in that order.
pub(crate) fn access_modes(modes: &[Value]) -> String {
    let has = |m: &str| modes.iter().any(|v| v.as_str() == Some(m));
    let mut out = Vec::new();
    for (mode, short) in [
        ("ReadWriteOnce", "RWO"),
        ("ReadOnlyMany", "ROX"),
        ("ReadWriteMany", "RWX"),
        ("ReadWriteOncePod", "RWOP"),
    ] {
        if has(mode) {
            out.push(short);
        }
    }
    out.join(",")
}

/// An int-or-string field as upstream's `IntOrString.String()`.
pub(crate) fn int_or_string(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i128 = NANOS_PER_SECOND;

    #[test]
    fn human_durations_as_upstream() {
        let cases: &[(i128, &str)] = &[
            (-3 * S, "<invalid>"),
            (-S - S / 2, "0s"),
            (0, "0s"),
            (5 * S, "5s"),
            (119 * S, "119s"),
            (120 * S, "2m"),
            (182 * S, "3m2s"),
            (9 * 60 * S + 59 * S, "9m59s"),
            (10 * 60 * S + 30 * S, "10m"),
            (179 * 60 * S, "179m"),
            (3 * 3600 * S, "3h"),
            (5 * 3600 * S + 3 * 60 * S, "5h3m"),
            (8 * 3600 * S, "8h"),
            (47 * 3600 * S, "47h"),
            (51 * 3600 * S, "2d3h"),
            (72 * 3600 * S, "3d"),
            (8 * 24 * 3600 * S, "8d"),
            (400 * 24 * 3600 * S, "400d"),
            ((2 * 365 + 20) * 24 * 3600 * S, "2y20d"),
            (3 * 365 * 24 * 3600 * S, "3y"),
            (10 * 365 * 24 * 3600 * S, "10y"),
        ];
        for (d, want) in cases {
            assert_eq!(human_duration(*d), *want, "{d}");
        }
    }

    #[test]
    fn labels_and_selectors() {
        let v = serde_json::json!({"b": "2", "a": "1"});
        assert_eq!(format_labels(Some(&v)), "a=1,b=2");
        assert_eq!(format_labels(None), "<none>");
        let sel = serde_json::json!({"matchLabels": {"app": "web"}});
        assert_eq!(format_label_selector(Some(&sel)), "app=web");
        assert_eq!(format_label_selector(None), "<none>");
        assert_eq!(format_label_selector(Some(&serde_json::json!({}))), "<none>");
        assert_eq!(selector_string(None), "");
    }
}
