//! Navigation of the served schemas for strategic merge patch and server-side apply:
//! which properties are structs, maps, lists or scalars, and how each list merges.

use std::cell::RefCell;
use std::collections::HashMap;

use serde_json::Value;

use crate::schema;

/// A position in the schemas: the schema of a value and, when it is a named definition,
/// that definition's name.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Ty {
    schema: Option<&'static Value>,
    name: Option<&'static str>,
}

type DeclaredFields = HashMap<(usize, usize), HashMap<Box<str>, (Ty, FieldMeta)>>;

thread_local! {
    /// [`Ty::field`] answers for declared properties, by (schema address, definition name
    /// address) and field name.
    static DECLARED: RefCell<DeclaredFields> = RefCell::new(HashMap::new());
}

/// What a schema describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// An object with declared properties.
    Struct,
    /// An object with arbitrary keys (`additionalProperties`).
    Map,
    List,
    Scalar,
    /// No schema (or an object with neither properties nor additionalProperties).
    Unknown,
}

/// The list metadata of a property, read from the schema extensions.
#[derive(Clone, Debug, Default)]
pub(crate) struct FieldMeta {
    pub strategy: Option<&'static str>,
    pub merge_key: Option<&'static str>,
    pub list_type: Option<&'static str>,
    pub list_map_keys: Vec<&'static str>,
    /// `+mapType=atomic` (server-side apply owns the map as a whole).
    pub atomic_map: bool,
}

impl FieldMeta {
    fn from_schema(prop: &'static Value) -> FieldMeta {
        let s = |k: &str| prop.get(k).and_then(Value::as_str);
        FieldMeta {
            strategy: s("x-kubernetes-patch-strategy"),
            merge_key: s("x-kubernetes-patch-merge-key"),
            list_type: s("x-kubernetes-list-type"),
            list_map_keys: prop
                .get("x-kubernetes-list-map-keys")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default(),
            atomic_map: s("x-kubernetes-map-type") == Some("atomic"),
        }
    }

    /// Whether the patch strategy includes `s` ("merge", "retainKeys", "replace").
    pub fn has_strategy(&self, s: &str) -> bool {
        self.strategy.is_some_and(|st| st.split(',').any(|x| x.trim() == s))
    }
}

/// How server-side apply treats a list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ListKind {
    Atomic,
    Set,
    Map(Vec<&'static str>),
}

impl FieldMeta {
    /// The list's relationship for server-side apply, as upstream derives it from the
    /// OpenAPI extensions (list type first, then the patch strategy).
    pub fn list_kind(&self) -> ListKind {
        match self.list_type {
            Some("atomic") => ListKind::Atomic,
            Some("set") => ListKind::Set,
            Some("map") => {
                if !self.list_map_keys.is_empty() {
                    ListKind::Map(self.list_map_keys.clone())
                } else if let Some(k) = self.merge_key {
                    ListKind::Map(vec![k])
                } else {
                    ListKind::Atomic
                }
            }
            _ if self.has_strategy("merge") => match self.merge_key {
                Some(k) => ListKind::Map(vec![k]),
                None => ListKind::Set,
            },
            _ => ListKind::Atomic,
        }
    }
}

impl Ty {
    /// The root type of a definition ("io.k8s.api.core.v1.Pod"); unknown names give a type
    /// without schema (every list replaces, every object merges).
    pub fn root(definition: &str) -> Ty {
        match schema::lookup_definition(definition) {
            Some((name, def)) => Ty {
                schema: Some(def),
                name: Some(name),
            },
            None => Ty::default(),
        }
    }

    /// A type described by an inline schema (no definition name).
    #[cfg(test)]
    pub fn inline(s: &'static Value) -> Ty {
        Ty {
            schema: Some(s),
            name: None,
        }
    }

    fn of(s: &'static Value) -> Ty {
        match schema::resolve(s) {
            Some((name, def)) => Ty {
                schema: Some(def),
                name: Some(name),
            },
            None => Ty {
                schema: Some(s),
                name: None,
            },
        }
    }

    /// The definition name, when this is a named definition.
    pub fn name(&self) -> Option<&'static str> {
        self.name
    }

    pub fn kind(&self) -> Kind {
        let Some(s) = self.schema else {
            return Kind::Unknown;
        };
        if s.get("properties").is_some() {
            return Kind::Struct;
        }
        if s.get("additionalProperties").is_some_and(Value::is_object) {
            return Kind::Map;
        }
        match s.get("type").and_then(Value::as_str) {
            Some("array") => Kind::List,
            Some("object") => Kind::Unknown,
            _ => Kind::Scalar,
        }
    }

    /// Whether server-side apply treats this struct as a single value.
    pub fn atomic_struct(&self) -> bool {
        self.name.is_some_and(super::meta::is_atomic_struct)
            || self
                .schema
                .and_then(|s| s.get("x-kubernetes-map-type"))
                .and_then(Value::as_str)
                == Some("atomic")
    }

    /// Whether `name` is a declared property (not a map entry).
    pub fn declares(&self, name: &str) -> bool {
        self.schema
            .and_then(|s| s.get("properties"))
            .is_some_and(|p| p.get(name).is_some())
    }

    /// The type and list metadata of field (or map entry) `name`.
    pub fn field(&self, name: &str) -> (Ty, FieldMeta) {
        let Some(s) = self.schema else {
            return (Ty::default(), FieldMeta::default());
        };
        // Declared properties are looked up once per thread: the schemas are static, so the
        // answer depends only on (schema, definition, field). Map keys and unknown fields
        // are user data and are never remembered.
        let key = (
            std::ptr::from_ref(s) as usize,
            self.name.map_or(0, |n| n.as_ptr() as usize),
        );
        if let Some(hit) = DECLARED.with_borrow(|m| m.get(&key).and_then(|f| f.get(name)).cloned()) {
            return hit;
        }
        if let Some(prop) = s.get("properties").and_then(|p| p.get(name)) {
            let mut meta = FieldMeta::from_schema(prop);
            if self.name.is_some_and(|parent| super::meta::is_atomic_map(parent, name)) {
                meta.atomic_map = true;
            }
            let out = (Ty::of(prop), meta);
            DECLARED.with_borrow_mut(|m| m.entry(key).or_default().insert(name.into(), out.clone()));
            return out;
        }
        if let Some(ap) = s.get("additionalProperties").filter(|v| v.is_object()) {
            return (Ty::of(ap), FieldMeta::default());
        }
        (Ty::default(), FieldMeta::default())
    }

    /// The element type of a list.
    pub fn items(&self) -> Ty {
        match self.schema.and_then(|s| s.get("items")) {
            Some(items) => Ty::of(items),
            None => Ty::default(),
        }
    }
}

/// JSON equality with numbers compared by value (1 == 1.0).
pub(crate) fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x == y || (x.as_f64().is_some() && x.as_f64() == y.as_f64()),
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(a, b)| json_eq(a, b)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| json_eq(v, w)))
        }
        _ => a == b,
    }
}

/// The name of a JSON value's kind, for messages.
pub(crate) fn kind_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn navigates_pod() {
        let pod = Ty::root("io.k8s.api.core.v1.Pod");
        assert_eq!(pod.kind(), Kind::Struct);
        let (spec, _) = pod.field("spec");
        assert_eq!(spec.name(), Some("io.k8s.api.core.v1.PodSpec"));
        let (containers, meta) = spec.field("containers");
        assert_eq!(containers.kind(), Kind::List);
        assert_eq!(meta.merge_key, Some("name"));
        assert_eq!(meta.list_kind(), ListKind::Map(vec!["name"]));
        let c = containers.items();
        assert_eq!(c.name(), Some("io.k8s.api.core.v1.Container"));
        let (ports, pm) = c.field("ports");
        assert_eq!(ports.kind(), Kind::List);
        assert_eq!(pm.list_kind(), ListKind::Map(vec!["containerPort", "protocol"]));
        let (meta_ty, _) = pod.field("metadata");
        let (labels, _) = meta_ty.field("labels");
        assert_eq!(labels.kind(), Kind::Map);
        let (value, _) = labels.field("app");
        assert_eq!(value.kind(), Kind::Scalar);
        let (tol, tm) = spec.field("tolerations");
        assert_eq!(tol.kind(), Kind::List);
        assert_eq!(tm.list_kind(), ListKind::Atomic);
        let (ns, nm) = spec.field("nodeSelector");
        assert_eq!(ns.kind(), Kind::Map);
        assert!(nm.atomic_map);
    }

    #[test]
    fn int_or_string_and_quantity_are_scalars() {
        let (strategy, m) = Ty::root("io.k8s.api.apps.v1.DeploymentSpec").field("strategy");
        assert!(m.has_strategy("retainKeys"));
        let (ru, _) = strategy.field("rollingUpdate");
        let (surge, _) = ru.field("maxSurge");
        assert_eq!(surge.kind(), Kind::Scalar);
        let (limits, _) = Ty::root("io.k8s.api.core.v1.ResourceRequirements").field("limits");
        assert_eq!(limits.kind(), Kind::Map);
        assert_eq!(limits.field("cpu").0.kind(), Kind::Scalar);
    }
}
