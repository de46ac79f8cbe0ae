//! Server-side apply and field ownership (`metadata.managedFields`), with the semantics of
//! upstream's structured-merge-diff:
//!
//! - an apply merges the applied configuration into the live object: structs and maps
//!   field by field, list-maps item by item on their keys, sets by value, everything else
//!   (atomic lists, scalars, atomic structs) is replaced;
//! - the applier then owns exactly the fields of its configuration;
//! - fields the applier owned before and no longer applies are removed from the object,
//!   unless another manager owns them (or something under them);
//! - changing a field another manager owns is a conflict, unless `force`, in which case the
//!   other manager loses it;
//! - ordinary writes ([`update_managed_fields`]) record an `Update` manager owning what it
//!   changed, taking those fields from every other manager.
//!
//! Field sets use upstream's `FieldsV1` encoding: `f:NAME` for fields and map keys,
//! `k:{"KEY":VALUE}` for list-map items, `v:VALUE` for set items, `.` for a node that is
//! itself owned when it also has owned children.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde_json::{Map, Value, json};

use super::typed::{FieldMeta, Kind, ListKind, Ty, json_eq};

/// One field another manager owns, as upstream reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    /// The other manager's name ("kubectl-client-side-apply").
    pub manager: String,
    /// "Apply" or "Update".
    pub operation: String,
    /// The API version the other manager wrote with.
    pub api_version: String,
    /// The subresource the other manager wrote through ("" for the main resource).
    pub subresource: String,
    /// The field, as upstream prints paths (".spec.replicas",
    /// `.spec.template.spec.containers[name="nginx"].image`).
    pub field: String,
}

impl Conflict {
    /// The manager as upstream prints it: `"kubectl"` for an applier,
    /// `"kubectl-client-side-apply" using apps/v1` for an updater.
    pub fn manager_display(&self) -> String {
        let mut s = quote(&self.manager);
        if !self.subresource.is_empty() {
            s.push_str(&format!(" with subresource {}", quote(&self.subresource)));
        }
        if self.operation == "Update" {
            s.push_str(&format!(" using {}", self.api_version));
        }
        s
    }

    /// The message of this conflict's `FieldManagerConflict` cause.
    pub fn cause_message(&self) -> String {
        format!("conflict with {}", self.manager_display())
    }
}

fn quote(s: &str) -> String {
    Value::String(s.to_string()).to_string()
}

/// Upstream's 409 message: `Apply failed with 1 conflict: conflict with "m" using v1: .spec.replicas`.
pub fn conflict_message(conflicts: &[Conflict]) -> String {
    if let [c] = conflicts {
        return format!("Apply failed with 1 conflict: {}: {}", c.cause_message(), c.field);
    }
    let mut by_manager: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for c in conflicts {
        by_manager.entry(c.manager_display()).or_default().push(&c.field);
    }
    let mut lines = Vec::new();
    for (manager, fields) in by_manager {
        lines.push(format!("conflicts with {manager}:"));
        lines.extend(fields.iter().map(|f| format!("- {f}")));
    }
    format!("Apply failed with {} conflicts: {}", conflicts.len(), lines.join("\n"))
}

/// Why an apply (or an update of managed fields) failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    /// Fields owned by other managers would change (409 Conflict with
    /// `FieldManagerConflict` causes, see [`super::PatchError::to_status`]).
    #[error("{}", conflict_message(.0))]
    Conflict(Vec<Conflict>),
    /// The applied configuration is malformed (400).
    #[error("{0}")]
    BadRequest(String),
    /// The applied configuration does not fit the schema, e.g. a list-map item without
    /// its key (422).
    #[error("{0}")]
    Invalid(String),
}

// ---------------------------------------------------------------------------------------
// Field sets

/// A set of field paths in upstream's `FieldsV1` shape.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSet {
    member: bool,
    children: BTreeMap<String, FieldSet>,
}

impl FieldSet {
    /// Add a path (a list of `f:`/`k:`/`v:` elements).
    pub fn insert(&mut self, path: &[String]) {
        match path.split_first() {
            None => self.member = true,
            // The key is copied only when the child is new: every field of an object walks this
            // path once per level on each write.
            Some((first, rest)) => match self.children.get_mut(first) {
                Some(child) => child.insert(rest),
                None => self.children.entry(first.clone()).or_default().insert(rest),
            },
        }
    }

    /// Whether `path` is in the set.
    pub fn contains(&self, path: &[String]) -> bool {
        match path.split_first() {
            None => self.member,
            Some((first, rest)) => self.children.get(first).is_some_and(|c| c.contains(rest)),
        }
    }

    pub fn is_empty(&self) -> bool {
        !self.member && self.children.values().all(FieldSet::is_empty)
    }

    pub fn union_with(&mut self, other: &FieldSet) {
        self.member |= other.member;
        for (k, c) in &other.children {
            match self.children.get_mut(k) {
                Some(mine) => mine.union_with(c),
                None => {
                    self.children.insert(k.clone(), c.clone());
                }
            }
        }
    }

    pub fn difference(&self, other: &FieldSet) -> FieldSet {
        let mut out = FieldSet {
            member: self.member && !other.member,
            children: BTreeMap::new(),
        };
        for (k, c) in &self.children {
            let d = match other.children.get(k) {
                Some(oc) => c.difference(oc),
                None => c.clone(),
            };
            if !d.is_empty() {
                out.children.insert(k.clone(), d);
            }
        }
        out
    }

    pub fn intersection(&self, other: &FieldSet) -> FieldSet {
        let mut out = FieldSet {
            member: self.member && other.member,
            children: BTreeMap::new(),
        };
        for (k, c) in &self.children {
            if let Some(oc) = other.children.get(k) {
                let i = c.intersection(oc);
                if !i.is_empty() {
                    out.children.insert(k.clone(), i);
                }
            }
        }
        out
    }

    /// Every path in the set, in order.
    pub fn paths(&self) -> Vec<Vec<String>> {
        let mut out = Vec::new();
        self.collect(&mut Vec::new(), &mut out);
        out
    }

    fn collect(&self, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
        if self.member {
            out.push(prefix.clone());
        }
        for (k, c) in &self.children {
            prefix.push(k.clone());
            c.collect(prefix, out);
            prefix.pop();
        }
    }

    /// Remove the subtree at `path`.
    fn remove_subtree(&mut self, path: &[String]) {
        match path.split_first() {
            None => *self = FieldSet::default(),
            Some((first, rest)) => {
                if rest.is_empty() {
                    self.children.remove(first);
                } else if let Some(c) = self.children.get_mut(first) {
                    c.remove_subtree(rest);
                    if c.is_empty() {
                        self.children.remove(first);
                    }
                }
            }
        }
    }

    /// Keep only the subtree at `path`.
    fn only_subtree(&self, first: &str) -> FieldSet {
        let mut out = FieldSet::default();
        if let Some(c) = self.children.get(first) {
            out.children.insert(first.to_string(), c.clone());
        }
        out
    }

    /// The `fieldsV1` JSON of this set.
    pub fn to_fields_v1(&self) -> Value {
        let mut m = Map::new();
        if self.member && !self.children.is_empty() {
            m.insert(".".to_string(), json!({}));
        }
        for (k, c) in &self.children {
            if c.is_empty() {
                continue;
            }
            m.insert(k.clone(), c.to_fields_v1());
        }
        Value::Object(m)
    }

    /// As [`FieldSet::to_fields_v1`], taking the set apart instead of copying its keys.
    pub fn into_fields_v1(self) -> Value {
        let mut m = Map::with_capacity(self.children.len() + 1);
        if self.member && !self.children.is_empty() {
            m.insert(".".to_string(), json!({}));
        }
        for (k, c) in self.children {
            if c.is_empty() {
                continue;
            }
            m.insert(k, c.into_fields_v1());
        }
        Value::Object(m)
    }

    /// Parse a `fieldsV1` JSON object.
    pub fn from_fields_v1(v: &Value) -> Result<FieldSet, String> {
        let mut set = FieldSet::from_node(v)?;
        set.member = false;
        Ok(set)
    }

    fn from_node(v: &Value) -> Result<FieldSet, String> {
        let Value::Object(m) = v else {
            return Err(format!("expected an object in fieldsV1, got {v}"));
        };
        let mut set = FieldSet {
            member: m.is_empty(),
            children: BTreeMap::new(),
        };
        for (k, c) in m {
            if k == "." {
                set.member = true;
            } else {
                if !(k.starts_with("f:") || k.starts_with("k:") || k.starts_with("v:") || k.starts_with("i:")) {
                    return Err(format!("unexpected path element {k:?} in fieldsV1"));
                }
                set.children.insert(k.clone(), FieldSet::from_node(c)?);
            }
        }
        Ok(set)
    }
}

/// A path as upstream prints it: `.spec.containers[name="c"].image`.
pub fn path_string(path: &[String]) -> String {
    let mut out = String::new();
    for pe in path {
        if let Some(f) = pe.strip_prefix("f:") {
            out.push('.');
            out.push_str(f);
        } else if let Some(k) = pe.strip_prefix("k:") {
            let parts: Vec<String> = match serde_json::from_str::<Map<String, Value>>(k) {
                Ok(m) => m.iter().map(|(n, v)| format!("{n}={v}")).collect(),
                Err(_) => vec![k.to_string()],
            };
            out.push_str(&format!("[{}]", parts.join(",")));
        } else if let Some(v) = pe.strip_prefix("v:") {
            out.push_str(&format!("[={v}]"));
        } else if let Some(i) = pe.strip_prefix("i:") {
            out.push_str(&format!("[{i}]"));
        } else {
            out.push_str(pe);
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// Walking objects along the schema

#[derive(Clone, Debug, PartialEq, Eq)]
enum Shape {
    Leaf,
    Object,
    Set,
    Assoc(Vec<&'static str>),
}

fn shape(v: &Value, ty: Ty, meta: &FieldMeta) -> Shape {
    match v {
        Value::Object(_) => {
            if ty.atomic_struct() || meta.atomic_map || matches!(ty.kind(), Kind::Scalar | Kind::List) {
                Shape::Leaf
            } else {
                Shape::Object
            }
        }
        Value::Array(_) => {
            if ty.kind() != Kind::List {
                return Shape::Leaf;
            }
            match meta.list_kind() {
                ListKind::Atomic => Shape::Leaf,
                ListKind::Set => Shape::Set,
                ListKind::Map(keys) => Shape::Assoc(keys),
            }
        }
        _ => Shape::Leaf,
    }
}

fn is_empty_container(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => true,
        Some(Value::Object(m)) => m.is_empty(),
        Some(Value::Array(a)) => a.is_empty(),
        _ => false,
    }
}

/// The `k:` element of a list-map item; `None` when a key is missing and has no default.
fn key_element(item: &Value, keys: &[&str]) -> Option<String> {
    let mut names: Vec<&str> = keys.to_vec();
    names.sort_unstable();
    let mut m = Map::new();
    for k in names {
        let v = match item.get(k) {
            Some(v) if !v.is_null() => v.clone(),
            _ => Value::String(super::meta::key_default(k)?.to_string()),
        };
        m.insert(k.to_string(), v);
    }
    Some(format!("k:{}", Value::Object(m)))
}

fn value_element(v: &Value) -> String {
    format!("v:{v}")
}

fn missing_key(item: &Value, keys: &[&str]) -> ApplyError {
    let k = keys
        .iter()
        .find(|k| item.get(**k).is_none_or(Value::is_null) && super::meta::key_default(k).is_none())
        .copied()
        .unwrap_or("");
    ApplyError::Invalid(format!(
        "associative list with keys has an element that omits key field {} (and doesn't have default value)",
        quote(k)
    ))
}

/// The fields an applied configuration sets (upstream's `ToFieldSet`).
fn to_field_set(
    v: &Value,
    ty: Ty,
    meta: &FieldMeta,
    path: &mut Vec<String>,
    out: &mut FieldSet,
) -> Result<(), ApplyError> {
    match (shape(v, ty, meta), v) {
        (Shape::Object, Value::Object(m)) => {
            for (k, cv) in m {
                let (cty, cmeta) = ty.field(k);
                path.push(format!("f:{k}"));
                to_field_set(cv, cty, &cmeta, path, out)?;
                if cv.is_null() || cv.as_object().is_some_and(Map::is_empty) || !ty.declares(k) {
                    out.insert(path);
                }
                path.pop();
            }
        }
        (Shape::Set, Value::Array(items)) => {
            for item in items {
                path.push(value_element(item));
                out.insert(path);
                path.pop();
            }
        }
        (Shape::Assoc(keys), Value::Array(items)) => {
            let item_ty = ty.items();
            for item in items {
                let pe = key_element(item, &keys).ok_or_else(|| missing_key(item, &keys))?;
                path.push(pe);
                to_field_set(item, item_ty, &FieldMeta::default(), path, out)?;
                out.insert(path);
                path.pop();
            }
        }
        _ => {
            if !path.is_empty() {
                out.insert(path);
            }
        }
    }
    Ok(())
}

/// Items of a list keyed by their path element (items without a usable key get a unique
/// element that matches nothing).
fn keyed<'a>(items: &'a [Value], shape: &Shape, side: &str) -> Vec<(String, &'a Value)> {
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let pe = match shape {
                Shape::Assoc(keys) => key_element(item, keys).unwrap_or_else(|| format!("i:{side}{i}")),
                _ => value_element(item),
            };
            (pe, item)
        })
        .collect()
}

/// Merge an applied value into a live value (upstream's `Merge`).
fn merge(l: &Value, r: &Value, ty: Ty, meta: &FieldMeta) -> Value {
    let rs = shape(r, ty, meta);
    if rs == Shape::Leaf || shape(l, ty, meta) != rs {
        return r.clone();
    }
    match (l, r) {
        (Value::Object(lm), Value::Object(rm)) => {
            let mut out = lm.clone();
            for (k, rv) in rm {
                let (cty, cmeta) = ty.field(k);
                let merged = match lm.get(k) {
                    Some(lv) => merge(lv, rv, cty, &cmeta),
                    None => rv.clone(),
                };
                out.insert(k.clone(), merged);
            }
            Value::Object(out)
        }
        (Value::Array(la), Value::Array(ra)) => {
            let item_ty = ty.items();
            Value::Array(merge_list_items(
                &keyed(la, &rs, "l"),
                &keyed(ra, &rs, "r"),
                |lv, rv| match lv {
                    Some(lv) => merge(lv, rv, item_ty, &FieldMeta::default()),
                    None => rv.clone(),
                },
            ))
        }
        _ => r.clone(),
    }
}

/// Upstream's list merge order: live-only items keep their place, applied items come in
/// the applied order.
fn merge_list_items(
    lhs: &[(String, &Value)],
    rhs: &[(String, &Value)],
    merge_item: impl Fn(Option<&Value>, &Value) -> Value,
) -> Vec<Value> {
    let observed_l: HashMap<&str, &Value> = lhs.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    let observed_r: HashSet<&str> = rhs.iter().map(|(k, _)| k.as_str()).collect();
    let mut shared = rhs
        .iter()
        .map(|(k, _)| k.as_str())
        .filter(|k| observed_l.contains_key(k));
    let mut next_shared = shared.next();
    let mut merged_r: HashSet<&str> = HashSet::new();
    let mut out = Vec::with_capacity(lhs.len() + rhs.len());
    let (mut li, mut ri) = (0, 0);
    while li < lhs.len() || ri < rhs.len() {
        if li < lhs.len() && ri < rhs.len() {
            let pe = lhs[li].0.as_str();
            if pe == rhs[ri].0 {
                merged_r.insert(pe);
                out.push(merge_item(observed_l.get(pe).copied(), rhs[ri].1));
                li += 1;
                ri += 1;
                next_shared = shared.next();
                continue;
            }
            if observed_r.contains(pe) && next_shared.is_some_and(|n| n != pe) {
                li += 1;
                continue;
            }
        }
        if li < lhs.len() {
            let pe = lhs[li].0.as_str();
            if !observed_r.contains(pe) {
                out.push(lhs[li].1.clone());
                li += 1;
                continue;
            } else if merged_r.contains(pe) {
                li += 1;
                continue;
            }
        }
        if ri < rhs.len() {
            let pe = rhs[ri].0.as_str();
            merged_r.insert(pe);
            out.push(merge_item(observed_l.get(pe).copied(), rhs[ri].1));
            ri += 1;
            if next_shared == Some(pe) {
                next_shared = shared.next();
            }
        }
    }
    out
}

/// What changed between two versions of an object (upstream's `Compare`).
#[derive(Debug, Default)]
struct Comparison {
    added: FieldSet,
    modified: FieldSet,
    removed: FieldSet,
}

/// `zero`: on create, whether this node would be present in the zero value of the type
/// (structs reached through struct fields from the root), so it does not count as added.
fn compare(
    l: Option<&Value>,
    r: Option<&Value>,
    ty: Ty,
    meta: &FieldMeta,
    path: &mut Vec<String>,
    cmp: &mut Comparison,
    zero: bool,
) {
    if l.is_none() && r.is_none() {
        return;
    }
    let ls = l.map(|v| shape(v, ty, meta));
    let rs = r.map(|v| shape(v, ty, meta));
    let sh = match (&ls, &rs) {
        (Some(a), Some(b)) if a != b => Shape::Leaf,
        (Some(a), _) => a.clone(),
        (None, Some(b)) => b.clone(),
        (None, None) => return,
    };
    let both_empty = is_empty_container(l) && is_empty_container(r);
    if sh == Shape::Leaf || both_empty {
        if path.is_empty() {
            return;
        }
        match (l, r) {
            (None, Some(_)) => cmp.added.insert(path),
            (Some(_), None) => cmp.removed.insert(path),
            (Some(a), Some(b)) if !json_eq(a, b) => cmp.modified.insert(path),
            _ => {}
        }
        return;
    }
    match sh {
        Shape::Object => {
            let empty = Map::new();
            let lm = l.and_then(Value::as_object).unwrap_or(&empty);
            let rm = r.and_then(Value::as_object).unwrap_or(&empty);
            let keys = lm.keys().chain(rm.keys().filter(|k| !lm.contains_key(*k)));
            for k in keys {
                // Bookkeeping is not part of the object's fields (filter_set drops it too).
                if k == "managedFields" && path.len() == 1 && path[0] == "f:metadata" {
                    continue;
                }
                let (cty, cmeta) = ty.field(k);
                // Go's zero value holds the non-pointer structs, and `containers` (a list
                // without omitempty) as null.
                let child_zero = zero
                    && ty.declares(k)
                    && (cty.kind() == Kind::Struct || (k == "containers" && cty.kind() == Kind::List));
                path.push(format!("f:{k}"));
                compare(lm.get(k), rm.get(k), cty, &cmeta, path, cmp, child_zero);
                path.pop();
            }
        }
        Shape::Set | Shape::Assoc(_) => {
            let empty = Vec::new();
            let la = l.and_then(Value::as_array).unwrap_or(&empty);
            let ra = r.and_then(Value::as_array).unwrap_or(&empty);
            let lk = keyed(la, &sh, "l");
            let rk = keyed(ra, &sh, "r");
            let item_ty = ty.items();
            let rmap: HashMap<&str, &Value> = rk.iter().map(|(k, v)| (k.as_str(), *v)).collect();
            let lmap: HashMap<&str, &Value> = lk.iter().map(|(k, v)| (k.as_str(), *v)).collect();
            for (k, lv) in &lk {
                path.push(k.clone());
                if sh == Shape::Set {
                    if !rmap.contains_key(k.as_str()) {
                        cmp.removed.insert(path);
                    }
                } else {
                    compare(
                        Some(lv),
                        rmap.get(k.as_str()).copied(),
                        item_ty,
                        &FieldMeta::default(),
                        path,
                        cmp,
                        false,
                    );
                }
                path.pop();
            }
            for (k, rv) in &rk {
                if lmap.contains_key(k.as_str()) {
                    continue;
                }
                path.push(k.clone());
                if sh == Shape::Set {
                    cmp.added.insert(path);
                } else {
                    compare(None, Some(rv), item_ty, &FieldMeta::default(), path, cmp, false);
                }
                path.pop();
            }
        }
        Shape::Leaf => {}
    }
    if path.is_empty() {
        return;
    }
    if l.is_none() && !zero {
        cmp.added.insert(path);
    } else if r.is_none() {
        cmp.removed.insert(path);
    }
}

/// What [`compare`] records as added for a value that has no old counterpart, built in place at
/// `out` (the set node of the value's path). `zero`, as in `compare`; `root_metadata`: the value is
/// the object's `metadata` (whose managedFields are not fields); `root`: the value is the object.
fn fill_added(r: &Value, ty: Ty, meta: &FieldMeta, zero: bool, root_metadata: bool, root: bool, out: &mut FieldSet) {
    let sh = shape(r, ty, meta);
    if sh == Shape::Leaf || is_empty_container(Some(r)) {
        if !root {
            out.member = true;
        }
        return;
    }
    let add_child = |out: &mut FieldSet, key: String, child: FieldSet| {
        if child.is_empty() {
            return;
        }
        match out.children.get_mut(&key) {
            Some(existing) => existing.union_with(&child),
            None => {
                out.children.insert(key, child);
            }
        }
    };
    match &sh {
        Shape::Object => {
            if let Value::Object(m) = r {
                for (k, v) in m {
                    if root_metadata && k == "managedFields" {
                        continue;
                    }
                    let (cty, cmeta) = ty.field(k);
                    let child_zero = zero
                        && ty.declares(k)
                        && (cty.kind() == Kind::Struct || (k == "containers" && cty.kind() == Kind::List));
                    let mut child = FieldSet::default();
                    fill_added(v, cty, &cmeta, child_zero, root && k == "metadata", false, &mut child);
                    let mut key = String::with_capacity(k.len() + 2);
                    key.push_str("f:");
                    key.push_str(k);
                    add_child(out, key, child);
                }
            }
        }
        Shape::Set | Shape::Assoc(_) => {
            let items = r.as_array().map(Vec::as_slice).unwrap_or_default();
            let item_ty = ty.items();
            for (pe, item) in keyed(items, &sh, "r") {
                let mut child = FieldSet::default();
                if sh == Shape::Set {
                    child.member = true;
                } else {
                    fill_added(item, item_ty, &FieldMeta::default(), false, false, false, &mut child);
                }
                add_child(out, pe, child);
            }
        }
        Shape::Leaf => {}
    }
    if !root && !zero {
        out.member = true;
    }
}

/// A set under construction by [`created_fields_v1`]: whether the node is a member, and its
/// non-empty children already in `fieldsV1` form, in the set's order.
struct V1Node {
    member: bool,
    children: Vec<(String, Value)>,
}

impl V1Node {
    fn is_empty(&self) -> bool {
        !self.member && self.children.is_empty()
    }

    fn into_value(self) -> Value {
        // Most nodes are leaves, `{}`: an empty map allocates nothing.
        if self.children.is_empty() {
            return Value::Object(Map::new());
        }
        let mut m = Map::with_capacity(self.children.len() + 1);
        if self.member && !self.children.is_empty() {
            m.insert(".".to_string(), Value::Object(Map::new()));
        }
        m.extend(self.children);
        Value::Object(m)
    }
}

/// Top-level fields no create records: the endpoint resets `status`, and upstream strips
/// `apiVersion` and `kind` from every set (as [`filter_set`] does for the main resource).
const UNOWNED_TOP: [&str; 3] = ["apiVersion", "kind", "status"];
/// Metadata no manager owns: upstream strips these from every set.
const UNOWNED_METADATA: [&str; 9] = [
    "name",
    "namespace",
    "creationTimestamp",
    "selfLink",
    "uid",
    "clusterName",
    "generation",
    "managedFields",
    "resourceVersion",
];

/// The `fieldsV1` a create records for its writer: the same set as [`fill_added`] then
/// [`filter_set`] for the main resource, encoded as [`FieldSet::into_fields_v1`] would, but
/// built straight into JSON instead of through a [`FieldSet`]. Every create pays for this, so it
/// matters. `None` when a list repeats an item key: the general path merges those.
fn created_fields_v1(obj: &Value, definition: &str, ty: Ty) -> Option<Value> {
    // Objects created alike (a ReplicaSet's pods, a scheduler's events) own the same fields:
    // the answer is remembered per thread under the object's skeleton, which holds everything
    // `created_node` reads of it.
    let key = crate::skeleton::key(&[definition], obj);
    if let Some(hit) = CREATED_FIELDS.with_borrow(|m| m.get(key.as_slice()).cloned()) {
        return hit;
    }
    let fields = created_node(obj, ty, &FieldMeta::default(), true, Level::Root).map(V1Node::into_value);
    CREATED_FIELDS.with_borrow_mut(|m| {
        if m.len() >= CREATED_FIELDS_KEPT {
            m.clear();
        }
        m.insert(key, fields.clone());
    });
    fields
}

/// Distinct object shapes whose created fields a thread remembers.
const CREATED_FIELDS_KEPT: usize = 64;

thread_local! {
    /// [`created_fields_v1`] answers, by definition name and skeleton.
    static CREATED_FIELDS: std::cell::RefCell<HashMap<Vec<u8>, Option<Value>>> =
        std::cell::RefCell::new(HashMap::new());
}

#[derive(Clone, Copy, PartialEq)]
enum Level {
    Root,
    RootMetadata,
    Inner,
}

fn created_node(r: &Value, ty: Ty, meta: &FieldMeta, zero: bool, level: Level) -> Option<V1Node> {
    let root = level == Level::Root;
    let sh = shape(r, ty, meta);
    if sh == Shape::Leaf || is_empty_container(Some(r)) {
        return Some(V1Node {
            member: !root,
            children: Vec::new(),
        });
    }
    let mut children = Vec::new();
    match &sh {
        Shape::Object => {
            if let Value::Object(m) = r {
                children.reserve(m.len());
                for (k, v) in m {
                    let unowned = match level {
                        Level::Root => UNOWNED_TOP.contains(&k.as_str()),
                        Level::RootMetadata => UNOWNED_METADATA.contains(&k.as_str()),
                        Level::Inner => false,
                    };
                    if unowned {
                        continue;
                    }
                    let (cty, cmeta) = ty.field(k);
                    let child_zero = zero
                        && ty.declares(k)
                        && (cty.kind() == Kind::Struct || (k == "containers" && cty.kind() == Kind::List));
                    let child_level = if root && k == "metadata" {
                        Level::RootMetadata
                    } else {
                        Level::Inner
                    };
                    let child = created_node(v, cty, &cmeta, child_zero, child_level)?;
                    if !child.is_empty() {
                        let mut key = String::with_capacity(k.len() + 2);
                        key.push_str("f:");
                        key.push_str(k);
                        children.push((key, child.into_value()));
                    }
                }
            }
        }
        Shape::Set | Shape::Assoc(_) => {
            let items = r.as_array().map(Vec::as_slice).unwrap_or_default();
            let item_ty = ty.items();
            for (pe, item) in keyed(items, &sh, "r") {
                let child = if sh == Shape::Set {
                    V1Node {
                        member: true,
                        children: Vec::new(),
                    }
                } else {
                    created_node(item, item_ty, &FieldMeta::default(), false, Level::Inner)?
                };
                if !child.is_empty() {
                    children.push((pe, child.into_value()));
                }
            }
        }
        Shape::Leaf => {}
    }
    children.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    if children.windows(2).any(|w| w[0].0 == w[1].0) {
        return None;
    }
    Some(V1Node {
        member: !root && !zero,
        children,
    })
}

/// Remove the value at `path` from `v` (no-op when absent).
fn remove_path(v: &mut Value, path: &[String]) {
    let Some((first, rest)) = path.split_first() else {
        return;
    };
    match v {
        Value::Object(m) => {
            let Some(name) = first.strip_prefix("f:") else {
                return;
            };
            if rest.is_empty() {
                m.shift_remove(name);
            } else if let Some(child) = m.get_mut(name) {
                remove_path(child, rest);
            }
        }
        Value::Array(items) => {
            let pos = if let Some(k) = first.strip_prefix("k:") {
                let Ok(key) = serde_json::from_str::<Map<String, Value>>(k) else {
                    return;
                };
                let names: Vec<&str> = key.keys().map(String::as_str).collect();
                items
                    .iter()
                    .position(|item| key_element(item, &names).as_deref() == Some(first.as_str()))
            } else if let Some(val) = first.strip_prefix("v:") {
                let Ok(val) = serde_json::from_str::<Value>(val) else {
                    return;
                };
                items.iter().position(|item| json_eq(item, &val))
            } else {
                None
            };
            let Some(pos) = pos else { return };
            if rest.is_empty() {
                items.remove(pos);
            } else {
                remove_path(&mut items[pos], rest);
            }
        }
        _ => {}
    }
}

/// Remove what `last` owned and nothing in `keep` owns (at or under it).
fn prune(merged: &mut Value, last: &FieldSet, keep: Option<&FieldSet>, path: &mut Vec<String>) {
    for (pe, lchild) in &last.children {
        path.push(pe.clone());
        match keep.and_then(|k| k.children.get(pe)).filter(|k| !k.is_empty()) {
            None => remove_path(merged, path),
            Some(kchild) => prune(merged, lchild, Some(kchild), path),
        }
        path.pop();
    }
}

// ---------------------------------------------------------------------------------------
// managedFields

#[derive(Clone, Debug)]
struct Entry {
    manager: String,
    operation: String,
    api_version: String,
    time: Option<String>,
    subresource: String,
    set: FieldSet,
}

impl Entry {
    fn same_identity(&self, manager: &str, operation: &str, api_version: &str, subresource: &str) -> bool {
        self.manager == manager
            && self.operation == operation
            && self.subresource == subresource
            && (operation == "Apply" || self.api_version == api_version)
    }

    fn into_json(self) -> Value {
        let fields = self.set.into_fields_v1();
        entry_json(
            self.manager,
            self.operation,
            self.api_version,
            self.time,
            self.subresource,
            fields,
        )
    }
}

/// One managedFields entry as upstream encodes it.
fn entry_json(
    manager: String,
    operation: String,
    api_version: String,
    time: Option<String>,
    subresource: String,
    fields_v1: Value,
) -> Value {
    let mut m = Map::new();
    m.insert("manager".into(), Value::String(manager));
    m.insert("operation".into(), Value::String(operation));
    m.insert("apiVersion".into(), Value::String(api_version));
    if let Some(t) = time {
        m.insert("time".into(), Value::String(t));
    }
    m.insert("fieldsType".into(), Value::String("FieldsV1".into()));
    m.insert("fieldsV1".into(), fields_v1);
    if !subresource.is_empty() {
        m.insert("subresource".into(), Value::String(subresource));
    }
    Value::Object(m)
}

fn managed_fields_of(obj: &Value) -> Option<&Value> {
    obj.get("metadata")?.get("managedFields").filter(|v| !v.is_null())
}

fn decode(managed: Option<&Value>) -> Result<Vec<Entry>, String> {
    let Some(list) = managed else {
        return Ok(Vec::new());
    };
    let Some(list) = list.as_array() else {
        return Err("metadata.managedFields must be a list".to_string());
    };
    let mut out = Vec::with_capacity(list.len());
    for e in list {
        let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        if e.get("fieldsType")
            .and_then(Value::as_str)
            .is_some_and(|t| t != "FieldsV1")
        {
            return Err(format!("unsupported fieldsType {}", s("fieldsType")));
        }
        let set = match e.get("fieldsV1") {
            Some(v) => FieldSet::from_fields_v1(v)?,
            None => FieldSet::default(),
        };
        out.push(Entry {
            manager: s("manager"),
            operation: s("operation"),
            api_version: s("apiVersion"),
            time: e.get("time").and_then(Value::as_str).map(str::to_string),
            subresource: s("subresource"),
            set,
        });
    }
    Ok(out)
}

/// Upstream's order: operation, time, manager, apiVersion, subresource.
fn encode(mut entries: Vec<Entry>) -> Value {
    entries.retain(|e| !e.set.is_empty());
    entries.sort_by(|a, b| {
        (
            &a.operation,
            a.time.as_deref().unwrap_or(""),
            &a.manager,
            &a.api_version,
            &a.subresource,
        )
            .cmp(&(
                &b.operation,
                b.time.as_deref().unwrap_or(""),
                &b.manager,
                &b.api_version,
                &b.subresource,
            ))
    });
    Value::Array(entries.into_iter().map(Entry::into_json).collect())
}

/// Upstream keeps at most this many `Update` entries; older ones merge into
/// "ancient-changes" (one per API version).
const MAX_UPDATE_MANAGERS: usize = 10;
const ANCIENT_CHANGES: &str = "ancient-changes";

fn cap_update_managers(entries: Vec<Entry>) -> Vec<Entry> {
    let (updaters, mut out): (Vec<Entry>, Vec<Entry>) = entries
        .into_iter()
        .filter(|e| !e.set.is_empty())
        .partition(|e| e.operation == "Update");
    let mut len = updaters.len();
    if len <= MAX_UPDATE_MANAGERS {
        out.extend(updaters);
        return out;
    }
    let mut slots: Vec<Option<Entry>> = updaters.into_iter().map(Some).collect();
    slots.sort_by(|a, b| {
        let key = |e: &Option<Entry>| {
            e.as_ref()
                .map(|e| (e.time.clone().unwrap_or_default(), e.manager.clone()))
        };
        key(a).cmp(&key(b))
    });
    let mut first: HashMap<String, usize> = HashMap::new();
    for i in 0..slots.len() {
        if len <= MAX_UPDATE_MANAGERS {
            break;
        }
        let Some(version) = slots[i].as_ref().map(|e| e.api_version.clone()) else {
            continue;
        };
        let Some(&fi) = first.get(&version) else {
            first.insert(version, i);
            continue;
        };
        let bucket = slots.iter().position(|s| {
            s.as_ref()
                .is_some_and(|s| s.manager == ANCIENT_CHANGES && s.api_version == version && s.subresource.is_empty())
        });
        let bi = match bucket {
            Some(b) => b,
            None => {
                if let Some(f) = slots[fi].as_mut() {
                    f.manager = ANCIENT_CHANGES.to_string();
                    f.subresource.clear();
                }
                fi
            }
        };
        if bi == i {
            continue;
        }
        let Some(e) = slots[i].take() else { continue };
        if let Some(b) = slots[bi].as_mut() {
            b.set.union_with(&e.set);
            b.time = e.time;
        }
        len -= 1;
    }
    out.extend(slots.into_iter().flatten());
    out
}

fn set_managed_fields(obj: &mut Value, entries: Vec<Entry>) {
    put_managed_fields(obj, encode(cap_update_managers(entries)));
}

/// Store an encoded managedFields list in `obj`; an empty list removes the field.
fn put_managed_fields(obj: &mut Value, encoded: Value) {
    let Value::Object(m) = obj else { return };
    let meta = m.entry("metadata").or_insert_with(|| json!({}));
    if let Value::Object(meta) = meta {
        if encoded.as_array().is_some_and(Vec::is_empty) {
            meta.shift_remove("managedFields");
        } else {
            meta.insert("managedFields".into(), encoded);
        }
    }
}

fn without_managed_fields(obj: &Value) -> Value {
    let mut o = obj.clone();
    if let Some(Value::Object(meta)) = o.get_mut("metadata") {
        meta.shift_remove("managedFields");
    }
    o
}

/// Drop the fields no manager owns (upstream's stripped metadata) and the fields the
/// endpoint resets (status on the main resource, everything but status on `/status`).
fn filter_set(mut set: FieldSet, subresource: &str) -> FieldSet {
    for top in ["f:apiVersion", "f:kind"] {
        set.remove_subtree(&[top.to_string()]);
    }
    for f in UNOWNED_METADATA {
        set.remove_subtree(&["f:metadata".to_string(), format!("f:{f}")]);
    }
    match subresource {
        "status" => set.only_subtree("f:status"),
        _ => {
            set.remove_subtree(&["f:status".to_string()]);
            set
        }
    }
}

fn api_version_of(obj: &Value) -> String {
    obj.get("apiVersion").and_then(Value::as_str).unwrap_or("").to_string()
}

fn object_set(obj: &Value, ty: Ty) -> Result<FieldSet, ApplyError> {
    let mut set = FieldSet::default();
    to_field_set(obj, ty, &FieldMeta::default(), &mut Vec::new(), &mut set)?;
    Ok(set)
}

fn comparison(old: Option<&Value>, new: &Value, ty: Ty) -> Comparison {
    let mut cmp = Comparison::default();
    if old.is_none() {
        // Every create lands here: its fields are all added, so the set is built node by node
        // instead of inserting each path from the root.
        fill_added(new, ty, &FieldMeta::default(), true, false, true, &mut cmp.added);
        return cmp;
    }
    compare(
        old,
        Some(new),
        ty,
        &FieldMeta::default(),
        &mut Vec::new(),
        &mut cmp,
        old.is_none(),
    );
    cmp
}

/// Server-side apply of `applied` (the request body, already decoded from YAML) by
/// `manager`, onto `live` (None: the object does not exist yet). Returns the new object
/// with `metadata.managedFields` updated; defaulting and validation are the caller's.
/// `definition` names the object's schema, `now` is the RFC 3339 time recorded.
pub fn apply(
    live: Option<&Value>,
    applied: &Value,
    manager: &str,
    force: bool,
    definition: &str,
    now: &str,
) -> Result<Value, ApplyError> {
    if !applied.is_object() {
        return Err(ApplyError::BadRequest(
            "the applied configuration must be an object".into(),
        ));
    }
    if managed_fields_of(applied).is_some() {
        return Err(ApplyError::BadRequest("metadata.managedFields must be nil".into()));
    }
    if manager.is_empty() {
        return Err(ApplyError::BadRequest(
            "PATCH requests with apply content type must have a fieldManager".into(),
        ));
    }
    let ty = Ty::root(definition);
    let mut entries = decode(live.and_then(managed_fields_of)).unwrap_or_default();
    let live_clean = live.map(without_managed_fields);
    let api_version = match api_version_of(applied) {
        v if !v.is_empty() => v,
        _ => live.map(api_version_of).unwrap_or_default(),
    };
    // An object nobody manages yet (written before fields were tracked): as upstream, its
    // fields belong to "before-first-apply", so the first apply sees conflicts.
    if let Some(l) = &live_clean
        && entries.is_empty()
    {
        let cmp = comparison(None, l, ty);
        let mut owned = cmp.added;
        owned.union_with(&cmp.modified);
        let owned = filter_set(owned, "");
        if !owned.is_empty() {
            entries.push(Entry {
                manager: "before-first-apply".to_string(),
                operation: "Update".to_string(),
                api_version: api_version_of(l),
                time: None,
                subresource: String::new(),
                set: owned,
            });
        }
    }

    let mut merged = match &live_clean {
        Some(l) => merge(l, applied, ty, &FieldMeta::default()),
        None => applied.clone(),
    };
    let new_set = filter_set(object_set(applied, ty)?, "");

    let me = entries
        .iter()
        .position(|e| e.same_identity(manager, "Apply", &api_version, ""));
    if let Some(last) = me.map(|i| entries[i].set.clone()) {
        let mut keep = new_set.clone();
        for (i, e) in entries.iter().enumerate() {
            if Some(i) != me {
                keep.union_with(&e.set);
            }
        }
        prune(&mut merged, &last, Some(&keep), &mut Vec::new());
    }

    let cmp = comparison(live_clean.as_ref(), &merged, ty);
    let mut changed = cmp.added.clone();
    changed.union_with(&cmp.modified);

    let mut conflicts = Vec::new();
    let mut conflict_set = FieldSet::default();
    for (i, e) in entries.iter().enumerate() {
        if Some(i) == me {
            continue;
        }
        let clash = e.set.intersection(&changed);
        for p in clash.paths() {
            conflicts.push((
                p.clone(),
                Conflict {
                    manager: e.manager.clone(),
                    operation: e.operation.clone(),
                    api_version: e.api_version.clone(),
                    subresource: e.subresource.clone(),
                    field: path_string(&p),
                },
            ));
            conflict_set.insert(&p);
        }
    }
    if !force && !conflicts.is_empty() {
        // Moving from client-side to server-side apply (manager "kubectl"): fields whose
        // live value is still what the last client-side apply set do not conflict.
        let allowed = if manager == KUBECTL {
            live_clean.as_ref().and_then(|l| allowed_from_last_applied(l, ty))
        } else {
            None
        };
        let remaining: Vec<Conflict> = conflicts
            .iter()
            .filter(|(p, _)| !allowed.as_ref().is_some_and(|a| a.contains(p)))
            .map(|(_, c)| c.clone())
            .collect();
        if !remaining.is_empty() {
            return Err(ApplyError::Conflict(remaining));
        }
    }
    for (i, e) in entries.iter_mut().enumerate() {
        if Some(i) != me {
            e.set = e.set.difference(&conflict_set);
        }
    }
    for (i, e) in entries.iter_mut().enumerate() {
        if Some(i) != me {
            e.set = e.set.difference(&cmp.removed);
        }
    }
    // As upstream, an apply that changes nothing keeps the applier's timestamp, so the
    // object (managed fields included) stays equal and the write can be skipped.
    let unchanged = live_clean.as_ref() == Some(&merged);
    let time = match me {
        Some(i) if unchanged && entries[i].set == new_set => entries[i].time.clone(),
        _ => Some(now.to_string()),
    };
    let entry = Entry {
        manager: manager.to_string(),
        operation: "Apply".to_string(),
        api_version,
        time,
        subresource: String::new(),
        set: new_set,
    };
    match me {
        Some(i) => entries[i] = entry,
        None => entries.push(entry),
    }
    if manager == KUBECTL && live_clean.as_ref().is_some_and(|l| last_applied(l).is_some()) {
        set_last_applied(&mut merged, applied);
    }
    set_managed_fields(&mut merged, entries);
    Ok(merged)
}

/// Decode an `application/apply-patch+yaml` request body (JSON bodies are YAML too).
pub fn decode_apply_body(body: &[u8]) -> Result<Value, ApplyError> {
    let v: Value =
        serde_saphyr::from_slice(body).map_err(|e| ApplyError::BadRequest(format!("error decoding YAML: {e}")))?;
    if !v.is_object() {
        return Err(ApplyError::BadRequest(
            "error decoding YAML: the applied configuration must be an object".into(),
        ));
    }
    Ok(v)
}

/// kubectl's field manager for `apply --server-side`.
const KUBECTL: &str = "kubectl";
/// The annotation client-side apply keeps the last applied configuration in.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

fn last_applied(obj: &Value) -> Option<&str> {
    obj.get("metadata")?
        .get("annotations")?
        .get(LAST_APPLIED)?
        .as_str()
        .filter(|s| !s.is_empty())
}

/// Upstream's `allowedConflictsFromLastApplied`: the fields of the last client-side applied
/// configuration whose live value is unchanged.
fn allowed_from_last_applied(live: &Value, ty: Ty) -> Option<FieldSet> {
    let last: Value = serde_json::from_str(last_applied(live)?).ok()?;
    let set = object_set(&last, ty).ok()?;
    let cmp = comparison(Some(&last), live, ty);
    Some(
        set.difference(&cmp.modified)
            .difference(&cmp.added)
            .difference(&cmp.removed),
    )
}

/// Keep the client-side apply annotation in step with a server-side apply by kubectl, as
/// upstream does, so a later client-side apply computes its patch from this configuration.
fn set_last_applied(obj: &mut Value, applied: &Value) {
    let mut config = applied.clone();
    if let Some(Value::Object(a)) = config.get_mut("metadata").and_then(|m| m.get_mut("annotations")) {
        a.shift_remove(LAST_APPLIED);
        if a.is_empty()
            && let Some(Value::Object(m)) = config.get_mut("metadata")
        {
            m.shift_remove("annotations");
        }
    }
    let Ok(text) = serde_json::to_string(&config) else {
        return;
    };
    if let Some(Value::Object(a)) = obj.get_mut("metadata").and_then(|m| m.get_mut("annotations")) {
        a.insert(LAST_APPLIED.to_string(), Value::String(format!("{text}\n")));
    }
}

/// Record an ordinary write (create, update, any non-apply patch) by `manager` in
/// `new`'s `metadata.managedFields`, as upstream does for every write: the manager's
/// `Update` entry (one per manager and API version) gains the fields this write added or
/// changed, which every other manager loses; fields it removed leave every manager.
/// `old` is the stored object (None on create); managed fields the client sent in `new`
/// replace the stored ones unless empty. `subresource` is "" or e.g. "status".
pub fn update_managed_fields(
    old: Option<&Value>,
    new: &Value,
    manager: &str,
    subresource: &str,
    definition: &str,
    now: &str,
) -> Result<Value, ApplyError> {
    let mut out = new.clone();
    record_update(old, &mut out, manager, subresource, definition, now);
    Ok(out)
}

/// [`update_managed_fields`] in place: `new` (the object about to be stored) gets the
/// managedFields of an `Update` by `manager`, without copying either object.
pub fn record_update(
    old: Option<&Value>,
    new: &mut Value,
    manager: &str,
    subresource: &str,
    definition: &str,
    now: &str,
) {
    let ty = Ty::root(definition);
    let sent = new
        .get_mut("metadata")
        .and_then(Value::as_object_mut)
        .and_then(|m| m.shift_remove("managedFields"))
        .filter(|v| !v.is_null());
    let from_new = if subresource.is_empty() {
        decode(sent.as_ref()).ok().filter(|e| !e.is_empty())
    } else {
        None
    };
    let mut entries = match from_new {
        Some(e) => e,
        None => decode(old.and_then(managed_fields_of)).unwrap_or_default(),
    };
    // As upstream: an existing object nobody manages stays untracked until the first apply.
    if old.is_some() && entries.is_empty() {
        return;
    }
    let api_version = match api_version_of(new) {
        v if !v.is_empty() => v,
        _ => old.map(api_version_of).unwrap_or_default(),
    };
    // A create that brings no managedFields of its own: the writer owns every field it set.
    if old.is_none()
        && entries.is_empty()
        && subresource.is_empty()
        && let Some(fields) = created_fields_v1(new, definition, ty)
    {
        let mut list = Vec::with_capacity(1);
        if fields.as_object().is_some_and(|m| !m.is_empty()) {
            let manager = if manager.is_empty() { "unknown" } else { manager };
            list.push(entry_json(
                manager.to_string(),
                "Update".to_string(),
                api_version,
                Some(now.to_string()),
                String::new(),
                fields,
            ));
        }
        put_managed_fields(new, Value::Array(list));
        return;
    }
    // `compare` skips metadata.managedFields, so `old` needs no copy without them.
    let Comparison {
        mut added,
        modified,
        removed,
    } = comparison(old, new, ty);
    added.union_with(&modified);
    let changed = filter_set(added, subresource);
    for e in entries.iter_mut() {
        e.set = e.set.difference(&changed).difference(&removed);
    }
    if !changed.is_empty() {
        let manager = if manager.is_empty() { "unknown" } else { manager };
        match entries
            .iter_mut()
            .find(|e| e.same_identity(manager, "Update", &api_version, subresource))
        {
            Some(e) => {
                e.set.union_with(&changed);
                e.time = Some(now.to_string());
            }
            None => entries.push(Entry {
                manager: manager.to_string(),
                operation: "Update".to_string(),
                api_version,
                time: Some(now.to_string()),
                subresource: subresource.to_string(),
                set: changed,
            }),
        }
    }
    set_managed_fields(new, entries);
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEPLOYMENT: &str = "io.k8s.api.apps.v1.Deployment";
    const T0: &str = "2025-01-01T00:00:00Z";
    const T1: &str = "2025-01-01T00:01:00Z";

    fn config(replicas: i64, image: &str) -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"}},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "nginx", "image": image, "ports": [{"containerPort": 80}]}]}
                }
            }
        })
    }

    /// A create's field set is built in place; it must equal what the general comparison
    /// records for an object with no old version, on objects of every shape.
    #[test]
    fn create_field_sets_match_the_general_comparison() {
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "default", "labels": {"app": "x", "tier": ""},
                         "annotations": {}, "finalizers": ["a/b", "c/d"], "managedFields": [{"manager": "m"}],
                         "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "o", "uid": "u1"}]},
            "spec": {
                "containers": [
                    {"name": "a", "image": "busybox", "command": ["sleep", "1"], "env": [{"name": "E", "value": "v"}],
                     "ports": [{"containerPort": 80}, {"containerPort": 53, "protocol": "UDP"}],
                     "resources": {"requests": {"cpu": "100m"}, "limits": {}}},
                    {"name": "b", "image": "busybox", "volumeMounts": [{"name": "v", "mountPath": "/v"}]}
                ],
                "initContainers": [],
                "volumes": [{"name": "v", "emptyDir": {}}, {"name": "w", "projected": {"sources": [{"secret": {"name": "s"}}]}}],
                "tolerations": [{"key": "k", "operator": "Exists"}],
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [{"key": "z", "operator": "In", "values": ["a", "b"]}]}]}}},
                "nodeSelector": {"disk": "ssd"},
                "securityContext": {},
                "hostAliases": [{"ip": "1.2.3.4", "hostnames": ["a"]}],
                "priority": 0,
                "enableServiceLinks": null
            },
            "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False"}]}
        });
        let service = json!({
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
            "spec": {"selector": {"app": "x"}, "ports": [{"port": 80, "targetPort": 8080}, {"port": 443, "protocol": "TCP"}],
                     "clusterIPs": ["10.0.0.1"]}
        });
        let node = json!({
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": "n", "labels": {"a": "b"}},
            "spec": {"taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}], "unschedulable": true},
            "status": {"capacity": {"cpu": "4"}, "addresses": [{"type": "Hostname", "address": "n"}]}
        });
        let bare =
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"managedFields": []}, "data": {"a": "1"}});
        let cases = [
            ("io.k8s.api.core.v1.Pod", pod),
            (DEPLOYMENT, config(3, "nginx")),
            ("io.k8s.api.core.v1.Service", service),
            ("io.k8s.api.core.v1.Node", node),
            ("io.k8s.api.core.v1.ConfigMap", bare),
            ("", json!({"kind": "Unknown", "spec": {"a": [1, 2], "b": {"c": null}}})),
        ];
        for (def, obj) in cases {
            let ty = Ty::root(def);
            let mut reference = Comparison::default();
            compare(
                None,
                Some(&obj),
                ty,
                &FieldMeta::default(),
                &mut Vec::new(),
                &mut reference,
                true,
            );
            let fast = comparison(None, &obj, ty);
            assert!(!fast.added.is_empty(), "{def}");
            assert_eq!(fast.added, reference.added, "{def}");
            assert!(fast.modified.is_empty() && fast.removed.is_empty(), "{def}");
        }
    }

    fn entry<'a>(obj: &'a Value, manager: &str) -> Option<&'a Value> {
        obj["metadata"]["managedFields"]
            .as_array()?
            .iter()
            .find(|e| e["manager"] == manager)
    }

    #[test]
    fn create_records_apply_manager() {
        let out = apply(None, &config(1, "nginx:1"), "kubectl", false, DEPLOYMENT, T0).expect("create");
        assert_eq!(out["spec"]["replicas"], 1);
        let e = entry(&out, "kubectl").expect("entry");
        assert_eq!(e["operation"], "Apply");
        assert_eq!(e["apiVersion"], "apps/v1");
        assert_eq!(e["time"], T0);
        assert_eq!(e["fieldsType"], "FieldsV1");
        assert_eq!(
            e["fieldsV1"],
            json!({
                "f:metadata": {"f:labels": {"f:app": {}}},
                "f:spec": {
                    "f:replicas": {},
                    "f:selector": {},
                    "f:template": {
                        "f:metadata": {"f:labels": {"f:app": {}}},
                        "f:spec": {"f:containers": {"k:{\"name\":\"nginx\"}": {
                            ".": {},
                            "f:image": {},
                            "f:name": {},
                            "f:ports": {"k:{\"containerPort\":80,\"protocol\":\"TCP\"}": {".": {}, "f:containerPort": {}}}
                        }}}
                    }
                }
            })
        );
    }

    #[test]
    fn reapply_updates_and_removes_dropped_fields() {
        let live = apply(None, &config(1, "nginx:1"), "kubectl", false, DEPLOYMENT, T0).expect("create");
        let mut cfg = config(1, "nginx:2");
        cfg["metadata"]["labels"] = json!({"app": "web", "tier": "front"});
        let out = apply(Some(&live), &cfg, "kubectl", false, DEPLOYMENT, T1).expect("update");
        assert_eq!(out["spec"]["template"]["spec"]["containers"][0]["image"], "nginx:2");
        assert_eq!(out["metadata"]["labels"]["tier"], "front");
        assert_eq!(entry(&out, "kubectl").expect("entry")["time"], T1);
        // Drop the tier label and the ports: both leave the object.
        let out2 = apply(
            Some(&out),
            &{
                let mut c = config(1, "nginx:2");
                c["spec"]["template"]["spec"]["containers"][0]
                    .as_object_mut()
                    .expect("c")
                    .remove("ports");
                c
            },
            "kubectl",
            false,
            DEPLOYMENT,
            T1,
        )
        .expect("drop");
        assert_eq!(out2["metadata"]["labels"], json!({"app": "web"}));
        assert!(out2["spec"]["template"]["spec"]["containers"][0].get("ports").is_none());
        let fields = &entry(&out2, "kubectl").expect("entry")["fieldsV1"];
        assert!(!fields.to_string().contains("tier"));
    }

    #[test]
    fn fields_set_by_others_are_kept() {
        let live = apply(None, &config(1, "nginx:1"), "kubectl", false, DEPLOYMENT, T0).expect("create");
        // A controller adds an annotation through an ordinary update.
        let mut updated = live.clone();
        updated["metadata"]["annotations"] = json!({"deployment.kubernetes.io/revision": "1"});
        updated["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = json!("IfNotPresent");
        let live = update_managed_fields(Some(&live), &updated, "kube-controller-manager", "", DEPLOYMENT, T0)
            .expect("update");
        assert!(entry(&live, "kube-controller-manager").is_some());
        let out = apply(Some(&live), &config(1, "nginx:3"), "kubectl", false, DEPLOYMENT, T1).expect("apply");
        assert_eq!(out["metadata"]["annotations"]["deployment.kubernetes.io/revision"], "1");
        assert_eq!(
            out["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"],
            "IfNotPresent"
        );
        assert_eq!(out["spec"]["template"]["spec"]["containers"][0]["image"], "nginx:3");
    }

    #[test]
    fn conflict_with_client_side_apply_and_force() {
        // Created by kubectl apply (client side): an Update manager owns everything.
        let created = update_managed_fields(
            None,
            &config(1, "nginx:1"),
            "kubectl-client-side-apply",
            "",
            DEPLOYMENT,
            T0,
        )
        .expect("create");
        let e = entry(&created, "kubectl-client-side-apply").expect("entry");
        assert_eq!(e["operation"], "Update");
        assert_eq!(e["fieldsV1"]["f:spec"]["f:replicas"], json!({}));
        assert_eq!(e["fieldsV1"]["f:metadata"]["f:labels"]["."], json!({}));

        let err = apply(Some(&created), &config(3, "nginx:1"), "kubectl", false, DEPLOYMENT, T1).expect_err("conflict");
        let ApplyError::Conflict(conflicts) = &err else {
            panic!("{err:?}")
        };
        assert_eq!(conflicts.len(), 1);
        assert_eq!(conflicts[0].field, ".spec.replicas");
        assert_eq!(
            conflicts[0].cause_message(),
            "conflict with \"kubectl-client-side-apply\" using apps/v1"
        );
        assert_eq!(
            err.to_string(),
            "Apply failed with 1 conflict: conflict with \"kubectl-client-side-apply\" using apps/v1: .spec.replicas"
        );
        let status = crate::patch::PatchError::from(err).to_status();
        assert_eq!(status.code, 409);
        assert_eq!(status.details.causes[0].reason, "FieldManagerConflict");
        assert_eq!(status.details.causes[0].field, ".spec.replicas");

        // Same values: no conflict, shared ownership.
        let shared =
            apply(Some(&created), &config(1, "nginx:1"), "kubectl", false, DEPLOYMENT, T1).expect("same values");
        assert!(
            entry(&shared, "kubectl-client-side-apply").expect("csa")["fieldsV1"]["f:spec"]
                .get("f:replicas")
                .is_some()
        );

        // Force: ownership of replicas moves.
        let forced = apply(Some(&created), &config(3, "nginx:1"), "kubectl", true, DEPLOYMENT, T1).expect("force");
        assert_eq!(forced["spec"]["replicas"], 3);
        let csa = entry(&forced, "kubectl-client-side-apply").expect("csa");
        assert!(csa["fieldsV1"]["f:spec"].get("f:replicas").is_none());
        assert!(csa["fieldsV1"]["f:spec"].get("f:template").is_some());
        assert!(
            entry(&forced, "kubectl").expect("kubectl")["fieldsV1"]["f:spec"]
                .get("f:replicas")
                .is_some()
        );
    }

    #[test]
    fn conflict_between_appliers_lists_each_field() {
        let live = apply(None, &config(1, "nginx:1"), "alice", false, DEPLOYMENT, T0).expect("create");
        let err = apply(Some(&live), &config(2, "nginx:2"), "bob", false, DEPLOYMENT, T1).expect_err("conflict");
        let ApplyError::Conflict(conflicts) = &err else {
            panic!("{err:?}")
        };
        let fields: Vec<&str> = conflicts.iter().map(|c| c.field.as_str()).collect();
        assert_eq!(
            fields,
            [".spec.replicas", ".spec.template.spec.containers[name=\"nginx\"].image"]
        );
        assert_eq!(
            err.to_string(),
            "Apply failed with 2 conflicts: conflicts with \"alice\":\n- .spec.replicas\n- .spec.template.spec.containers[name=\"nginx\"].image"
        );
    }

    #[test]
    fn dropped_field_owned_by_another_manager_stays() {
        let live = apply(None, &config(1, "nginx:1"), "alice", false, DEPLOYMENT, T0).expect("create");
        let live = apply(Some(&live), &config(1, "nginx:1"), "bob", false, DEPLOYMENT, T0).expect("bob shares");
        let mut cfg = config(1, "nginx:1");
        cfg["spec"].as_object_mut().expect("spec").remove("replicas");
        let out = apply(Some(&live), &cfg, "alice", false, DEPLOYMENT, T1).expect("alice drops replicas");
        assert_eq!(out["spec"]["replicas"], 1);
        // Once bob drops it as well, it goes.
        let out = apply(Some(&out), &cfg, "bob", false, DEPLOYMENT, T1).expect("bob drops replicas");
        assert!(out["spec"].get("replicas").is_none());
    }

    #[test]
    fn update_takes_fields_from_appliers() {
        let live = apply(None, &config(1, "nginx:1"), "kubectl", false, DEPLOYMENT, T0).expect("create");
        // kubectl scale: an update that changes replicas.
        let mut scaled = live.clone();
        scaled["spec"]["replicas"] = json!(5);
        let scaled = update_managed_fields(Some(&live), &scaled, "kubectl", "", DEPLOYMENT, T1).expect("scale");
        let applier = scaled["metadata"]["managedFields"]
            .as_array()
            .expect("list")
            .iter()
            .find(|e| e["operation"] == "Apply")
            .expect("apply entry");
        assert!(applier["fieldsV1"]["f:spec"].get("f:replicas").is_none());
        let updater = scaled["metadata"]["managedFields"]
            .as_array()
            .expect("list")
            .iter()
            .find(|e| e["operation"] == "Update")
            .expect("update entry");
        assert_eq!(updater["fieldsV1"], json!({"f:spec": {"f:replicas": {}}}));
        // Entries are sorted: Apply before Update.
        assert_eq!(scaled["metadata"]["managedFields"][0]["operation"], "Apply");
        // Re-applying without replicas keeps 5 (the applier no longer owns it).
        let mut cfg = config(1, "nginx:1");
        cfg["spec"].as_object_mut().expect("spec").remove("replicas");
        let out = apply(Some(&scaled), &cfg, "kubectl", false, DEPLOYMENT, T1).expect("apply");
        assert_eq!(out["spec"]["replicas"], 5);
    }

    #[test]
    fn status_updates_are_recorded_separately() {
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}});
        let created = update_managed_fields(None, &pod, "kubectl", "", "io.k8s.api.core.v1.Pod", T0).expect("create");
        let mut with_status = created.clone();
        with_status["status"] = json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]});
        let out = update_managed_fields(
            Some(&created),
            &with_status,
            "skiff-agent",
            "status",
            "io.k8s.api.core.v1.Pod",
            T1,
        )
        .expect("status");
        let e = entry(&out, "skiff-agent").expect("agent");
        assert_eq!(e["subresource"], "status");
        assert_eq!(
            e["fieldsV1"],
            json!({"f:status": {".": {}, "f:conditions": {".": {}, "k:{\"type\":\"Ready\"}": {".": {}, "f:status": {}, "f:type": {}}}, "f:phase": {}}})
        );
        assert!(entry(&out, "kubectl").is_some());
    }

    #[test]
    fn untracked_objects_belong_to_before_first_apply() {
        let mut live = config(1, "nginx:1");
        live["metadata"]["uid"] = json!("u1");
        // Updates of an untracked object record nothing.
        let mut updated = live.clone();
        updated["spec"]["replicas"] = json!(2);
        let updated = update_managed_fields(Some(&live), &updated, "m", "", DEPLOYMENT, T0).expect("update");
        assert!(updated["metadata"].get("managedFields").is_none());
        // The first apply conflicts with the untracked fields it changes.
        let err = apply(Some(&updated), &config(3, "nginx:1"), "kubectl", false, DEPLOYMENT, T1).expect_err("conflict");
        assert_eq!(
            err.to_string(),
            "Apply failed with 1 conflict: conflict with \"before-first-apply\" using apps/v1: .spec.replicas"
        );
        let out = apply(Some(&updated), &config(2, "nginx:1"), "kubectl", false, DEPLOYMENT, T1).expect("same values");
        assert!(entry(&out, "before-first-apply").is_some());
        assert!(entry(&out, "kubectl").is_some());
    }

    #[test]
    fn kubectl_moves_from_client_side_apply_without_conflicts() {
        // Created by `kubectl apply` (client side): last-applied annotation, CSA manager.
        let mut csa = config(1, "nginx:1");
        let last = serde_json::to_string(&csa).expect("json");
        csa["metadata"]["annotations"] = json!({ LAST_APPLIED: format!("{last}\n") });
        let created =
            update_managed_fields(None, &csa, "kubectl-client-side-apply", "", DEPLOYMENT, T0).expect("create");
        // `kubectl apply --server-side` with a new replica count: replicas is still what
        // the client-side apply set, so kubectl takes it over.
        let out = apply(Some(&created), &config(3, "nginx:1"), "kubectl", false, DEPLOYMENT, T1).expect("migration");
        assert_eq!(out["spec"]["replicas"], 3);
        let annotation = out["metadata"]["annotations"][LAST_APPLIED]
            .as_str()
            .expect("annotation");
        let synced: Value = serde_json::from_str(annotation).expect("json");
        assert_eq!(synced["spec"]["replicas"], 3);
        // Another manager gets no such pass.
        let err = apply(Some(&created), &config(3, "nginx:1"), "other", false, DEPLOYMENT, T1).expect_err("conflict");
        assert!(matches!(err, ApplyError::Conflict(_)));
        // Nor does kubectl once the live value moved away from the last applied one.
        let mut scaled = created.clone();
        scaled["spec"]["replicas"] = json!(5);
        let scaled = update_managed_fields(Some(&created), &scaled, "kubectl-client-side-apply", "", DEPLOYMENT, T1)
            .expect("scale");
        let err = apply(Some(&scaled), &config(3, "nginx:1"), "kubectl", false, DEPLOYMENT, T1).expect_err("conflict");
        assert_eq!(
            err.to_string(),
            "Apply failed with 1 conflict: conflict with \"kubectl-client-side-apply\" using apps/v1: .spec.replicas"
        );
    }

    #[test]
    fn decodes_yaml_bodies() {
        let body = b"apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\nspec:\n  replicas: 2\n  paused: false\n  template:\n    spec:\n      containers:\n      - name: c\n        image: \"nginx:1\"\n        args: [\"a\", \"b\"]\n";
        let v = decode_apply_body(body).expect("yaml");
        assert_eq!(v["spec"]["replicas"], 2);
        assert_eq!(v["spec"]["paused"], false);
        assert_eq!(
            v["spec"]["template"]["spec"]["containers"][0]["args"],
            json!(["a", "b"])
        );
        let v = decode_apply_body(br#"{"kind": "Pod", "metadata": {"name": "p"}}"#).expect("json");
        assert_eq!(v["kind"], "Pod");
        assert!(matches!(
            decode_apply_body(b"- a\n- b\n"),
            Err(ApplyError::BadRequest(_))
        ));
        assert!(matches!(decode_apply_body(b"a: [\n"), Err(ApplyError::BadRequest(_))));
    }

    #[test]
    fn noop_apply_keeps_the_object_equal() {
        let live = apply(None, &config(1, "nginx:1"), "kubectl", false, DEPLOYMENT, T0).expect("create");
        let again = apply(Some(&live), &config(1, "nginx:1"), "kubectl", false, DEPLOYMENT, T1).expect("again");
        assert_eq!(again, live);
    }

    #[test]
    fn update_managers_are_capped() {
        let mut obj = update_managed_fields(None, &config(1, "x"), "creator", "", DEPLOYMENT, "2025-01-01T00:00:00Z")
            .expect("create");
        for i in 0..12 {
            let mut next = obj.clone();
            next["metadata"]["labels"][format!("l{i}")] = json!("v");
            let t = format!("2025-01-01T00:{:02}:00Z", i + 1);
            obj = update_managed_fields(Some(&obj), &next, &format!("m{i:02}"), "", DEPLOYMENT, &t).expect("update");
        }
        let entries = obj["metadata"]["managedFields"].as_array().expect("list");
        assert_eq!(entries.len(), MAX_UPDATE_MANAGERS);
        let ancient = entry(&obj, ANCIENT_CHANGES).expect("bucket");
        // The oldest entry became the bucket and took in the next three (m00 to m02).
        let labels = &ancient["fieldsV1"]["f:metadata"]["f:labels"];
        assert!(
            labels.get("f:l0").is_some() && labels.get("f:l2").is_some(),
            "{ancient}"
        );
        assert!(entry(&obj, "creator").is_none());
        assert!(entry(&obj, "m11").is_some());
    }

    #[test]
    fn create_by_update_matches_upstreams_shape() {
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "nginx", "labels": {"run": "nginx"}},
            "spec": {
                "containers": [{"name": "nginx", "image": "nginx", "resources": {}}],
                "volumes": [{"name": "v", "emptyDir": {}}],
                "securityContext": {},
                "restartPolicy": "Always"
            }
        });
        let out = update_managed_fields(None, &pod, "kubectl-run", "", "io.k8s.api.core.v1.Pod", T0).expect("create");
        assert_eq!(
            entry(&out, "kubectl-run").expect("entry")["fieldsV1"],
            json!({
                "f:metadata": {"f:labels": {".": {}, "f:run": {}}},
                "f:spec": {
                    "f:containers": {"k:{\"name\":\"nginx\"}": {".": {}, "f:image": {}, "f:name": {}, "f:resources": {}}},
                    "f:restartPolicy": {},
                    "f:securityContext": {},
                    "f:volumes": {".": {}, "k:{\"name\":\"v\"}": {".": {}, "f:emptyDir": {}, "f:name": {}}}
                }
            })
        );
    }

    #[test]
    fn rejects_bad_configurations() {
        let mut cfg = config(1, "x");
        cfg["metadata"]["managedFields"] = json!([]);
        assert!(matches!(
            apply(None, &cfg, "m", false, DEPLOYMENT, T0),
            Err(ApplyError::BadRequest(_))
        ));
        let mut cfg = config(1, "x");
        cfg["spec"]["template"]["spec"]["containers"] = json!([{"image": "no-name"}]);
        let err = apply(None, &cfg, "m", false, DEPLOYMENT, T0).expect_err("missing key");
        assert!(matches!(err, ApplyError::Invalid(_)), "{err:?}");
        assert!(err.to_string().contains("\"name\""), "{err}");
    }

    #[test]
    fn fields_v1_round_trip() {
        let v = json!({"f:metadata": {"f:labels": {".": {}, "f:a": {}}}, "f:spec": {"f:x": {"k:{\"name\":\"c\"}": {".": {}, "f:name": {}}}, "f:y": {"v:\"a\"": {}}}});
        let set = FieldSet::from_fields_v1(&v).expect("parse");
        assert_eq!(set.to_fields_v1(), v);
        assert_eq!(set.clone().into_fields_v1(), v);
        let paths: Vec<String> = set.paths().iter().map(|p| path_string(p)).collect();
        assert_eq!(
            paths,
            [
                ".metadata.labels",
                ".metadata.labels.a",
                ".spec.x[name=\"c\"]",
                ".spec.x[name=\"c\"].name",
                ".spec.y[=\"a\"]"
            ]
        );
    }

    #[test]
    fn list_merge_order_keeps_live_only_items() {
        let live = json!({"spec": {"template": {"spec": {"containers": [{"name": "a", "image": "1"}, {"name": "x", "image": "live"}, {"name": "b", "image": "1"}]}}}});
        let cfg = json!({"spec": {"template": {"spec": {"containers": [{"name": "b", "image": "2"}, {"name": "a", "image": "2"}, {"name": "c", "image": "2"}]}}}});
        let out = merge(&live, &cfg, Ty::root(DEPLOYMENT), &FieldMeta::default());
        let names: Vec<&str> = out["spec"]["template"]["spec"]["containers"]
            .as_array()
            .expect("list")
            .iter()
            .filter_map(|c| c["name"].as_str())
            .collect();
        assert_eq!(names, ["x", "b", "a", "c"]);
        assert_eq!(out["spec"]["template"]["spec"]["containers"][2]["image"], "2");
    }
}

#[cfg(test)]
mod created_fields_tests {
    use super::*;

    /// The set a create records, through the general path.
    fn general(obj: &Value, definition: &str) -> Value {
        let ty = Ty::root(definition);
        let mut cmp = comparison(None, obj, ty);
        cmp.added.union_with(&cmp.modified);
        filter_set(cmp.added, "").into_fields_v1()
    }

    #[test]
    fn the_direct_create_set_is_the_general_one() {
        let cases = [
            (
                "io.k8s.api.core.v1.Pod",
                json!({
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": "p", "namespace": "default", "uid": "u", "generation": 1,
                        "creationTimestamp": "2025-01-01T00:00:00Z",
                        "labels": {"app": "web", "tier": "x"}, "annotations": {"a": "b"},
                        "finalizers": ["f1", "f2"],
                        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "1"}]},
                    "spec": {
                        "containers": [
                            {"name": "c", "image": "i", "ports": [{"containerPort": 80, "protocol": "TCP"}, {"containerPort": 53}],
                             "env": [{"name": "A", "value": "1"}, {"name": "B", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}],
                             "resources": {"requests": {"cpu": "100m"}, "limits": {}},
                             "command": ["sh", "-c"], "volumeMounts": [{"name": "v", "mountPath": "/v"}]},
                            {"name": "d", "image": "j"}
                        ],
                        "initContainers": [{"name": "init", "image": "k"}],
                        "volumes": [{"name": "v", "projected": {"sources": [{"configMap": {"name": "cm"}}]}}],
                        "tolerations": [{"key": "k", "operator": "Exists"}],
                        "nodeSelector": {"disk": "ssd"},
                        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [{"matchExpressions": [{"key": "a", "operator": "In", "values": ["1"]}]}]}}},
                        "securityContext": {}, "restartPolicy": "Always"
                    },
                    "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False"}]}
                }),
            ),
            (
                "io.k8s.api.apps.v1.Deployment",
                json!({
                    "apiVersion": "apps/v1", "kind": "Deployment",
                    "metadata": {"name": "web", "labels": {"app": "web"}},
                    "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%"}},
                        "template": {"metadata": {"labels": {"app": "web"}, "name": "ignored-only-at-the-top"},
                            "spec": {"containers": [{"name": "nginx", "image": "nginx:1.25"}]}}}
                }),
            ),
            (
                "io.k8s.api.core.v1.Service",
                json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
                    "spec": {"ports": [{"port": 80, "protocol": "TCP", "targetPort": 8080}, {"port": 53, "protocol": "UDP"}],
                        "selector": {"app": "web"}, "clusterIPs": ["10.0.0.1"]}}),
            ),
            (
                "io.k8s.api.core.v1.ConfigMap",
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"k": "v", "e": ""}}),
            ),
            // Only fields nobody owns: no entry at all.
            (
                "io.k8s.api.core.v1.Namespace",
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "n", "uid": "u"}}),
            ),
            // A type without a schema.
            (
                "",
                json!({"apiVersion": "x.io/v1", "kind": "Thing", "metadata": {"name": "t"},
                    "spec": {"list": [1, 2], "obj": {"a": {"b": null}}, "empty": {}}}),
            ),
        ];
        for (definition, obj) in cases {
            let direct = created_fields_v1(&obj, definition, Ty::root(definition)).expect("no repeated keys");
            assert_eq!(
                serde_json::to_string(&direct).unwrap(),
                serde_json::to_string(&general(&obj, definition)).unwrap(),
                "{definition}"
            );
        }
    }

    #[test]
    fn created_fields_are_remembered_only_for_objects_alike() {
        let def = "io.k8s.api.core.v1.Pod";
        let pod = |name: &str, container: &str, port: u16, image: &str| {
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": "web"}},
                "spec": {"containers": [{"name": container, "image": image,
                    "ports": [{"containerPort": port, "protocol": "TCP"}]}]}})
        };
        let fields = |obj: &Value| serde_json::to_string(&created_fields_v1(obj, def, Ty::root(def))).unwrap();
        let first = fields(&pod("a", "web", 80, "nginx"));
        // Another name and image (values outside keys): the same fields, from the cache.
        assert_eq!(fields(&pod("b", "web", 80, "httpd")), first);
        // Values that become keys differ: so do the fields, as computed afresh.
        for other in [pod("a", "app", 80, "nginx"), pod("a", "web", 8080, "nginx")] {
            let cached = fields(&other);
            assert_ne!(cached, first);
            assert_eq!(
                cached,
                serde_json::to_string(
                    &created_node(&other, Ty::root(def), &FieldMeta::default(), true, Level::Root)
                        .map(V1Node::into_value)
                )
                .unwrap()
            );
        }
        // A field more is another skeleton.
        let mut labelled = pod("a", "web", 80, "nginx");
        labelled["metadata"]["labels"]["tier"] = json!("front");
        assert!(fields(&labelled).contains("f:tier"));
    }

    #[test]
    fn repeated_list_keys_take_the_general_path() {
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "image": "a"}, {"name": "c", "image": "b"}]}});
        assert!(created_fields_v1(&pod, "io.k8s.api.core.v1.Pod", Ty::root("io.k8s.api.core.v1.Pod")).is_none());
        let mut created = pod.clone();
        record_update(
            None,
            &mut created,
            "m",
            "",
            "io.k8s.api.core.v1.Pod",
            "2025-01-01T00:00:00Z",
        );
        let fields = &created["metadata"]["managedFields"][0]["fieldsV1"];
        assert_eq!(
            fields["f:spec"]["f:containers"]["k:{\"name\":\"c\"}"]["f:image"],
            json!({})
        );
    }

    #[test]
    fn a_create_records_one_entry_for_its_writer() {
        let mut cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"k": "v"}});
        record_update(
            None,
            &mut cm,
            "",
            "",
            "io.k8s.api.core.v1.ConfigMap",
            "2025-01-01T00:00:00Z",
        );
        assert_eq!(
            cm["metadata"]["managedFields"],
            json!([{"manager": "unknown", "operation": "Update", "apiVersion": "v1",
                "time": "2025-01-01T00:00:00Z", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:data": {".": {}, "f:k": {}}}}])
        );
        let mut ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "n"}});
        record_update(
            None,
            &mut ns,
            "kubectl",
            "",
            "io.k8s.api.core.v1.Namespace",
            "2025-01-01T00:00:00Z",
        );
        assert!(ns["metadata"].get("managedFields").is_none());
    }
}
