//! The Common Expression Language as the Kubernetes API uses it (CustomResourceDefinitions'
//! `x-kubernetes-validations`, ValidatingAdmissionPolicies, webhooks' `matchConditions`).
//!
//! Expressions are parsed once and kept in a cache keyed by their text; they run against JSON
//! values bound to the variables the caller declares (`self`, `object`, `request`, ...).
//! Besides CEL's standard library (`size`, `has`, `all`/`exists`/`exists_one`/`map`/`filter`,
//! `matches`, `startsWith`/`endsWith`/`contains`, `int`/`uint`/`double`/`string`/`bool`
//! conversions, durations and timestamps), the extension libraries Kubernetes enables are there:
//! strings (`lowerAscii`, `upperAscii`, `trim`, `replace`, `split`, `join`, `substring`,
//! `indexOf`, `format`, ...), lists (`slice`, `flatten`, `sortBy`, ...), math and base64, and
//! Kubernetes' own list and regex functions that cost little: `isSorted`, `sum`, `min`,
//! `max`, `find` and `findAll`.
//!
//! There is no static type checker: a compile error is a syntax error or a reference to a
//! variable that is not declared (both in cel-go's wording). Errors at run time read as
//! cel-go's (`no such key: x`, `no such overload`, `division by zero`, ...).
//!
//! Cost: upstream estimates each expression's cost and bounds it at run time. Here an
//! expression's cost is bounded before it runs: its size times the largest collection (list,
//! map or string) among its inputs raised to the depth of nested comprehensions over them.
//! An expression whose bound exceeds upstream's per-call limit ([`PER_CALL_LIMIT`]) is not
//! evaluated and fails with upstream's `operation cancelled: actual cost limit exceeded`.
//! Expressions deeper than [`MAX_COMPREHENSION_DEPTH`] nested comprehensions are refused when
//! compiled.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use ::cel::extractors::{Arguments, This};
use ::cel::objects::{Key, Map};
use serde_json::Value as Json;

/// Upstream's per-expression runtime cost limit (`PerCallLimit`).
pub const PER_CALL_LIMIT: u64 = 1_000_000;

/// The most comprehensions (`all`, `exists`, `map`, ...) nested in one another.
pub const MAX_COMPREHENSION_DEPTH: usize = 3;

/// The most expressions kept compiled; the cache starts over past it.
const CACHE_LIMIT: usize = 4096;

/// Type names and library namespaces an expression may name besides its variables.
const BUILTIN_IDENTS: &[&str] = &[
    "int",
    "uint",
    "double",
    "string",
    "bytes",
    "bool",
    "list",
    "map",
    "type",
    "null_type",
    "dyn",
    "duration",
    "timestamp",
    "math",
    "lists",
    "strings",
    "base64",
    "optional",
];

/// A compiled expression.
pub struct Program {
    source: String,
    program: ::cel::Program,
    /// The declared variables the expression refers to.
    uses: BTreeSet<String>,
    /// Expression nodes, and the deepest nesting of comprehensions (for the cost bound).
    nodes: u64,
    depth: usize,
}

impl std::fmt::Debug for Program {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Program").field("source", &self.source).finish()
    }
}

/// Why an expression did not compile: cel-go's `ERROR: <input>:L:C: ...` lines.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CompileError(pub String);

/// Why an evaluation failed, in cel-go's words.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EvalError {
    /// The arguments of an operator or function had types it does not take.
    #[error("no such overload")]
    NoSuchOverload,
    /// The cost bound was exceeded; nothing was evaluated.
    #[error("operation cancelled: actual cost limit exceeded")]
    CostLimit,
    /// Anything else (`no such key: x`, `division by zero`, ...).
    #[error("{0}")]
    Other(String),
}

type Cache = HashMap<(String, Vec<String>), Arc<Program>>;
static CACHE: Mutex<Option<Cache>> = Mutex::new(None);

/// Compile `source` for an environment declaring `vars`; cached by the text and the
/// variables.
pub fn compile(source: &str, vars: &[&str]) -> Result<Arc<Program>, CompileError> {
    let key = (
        source.to_string(),
        vars.iter().map(|v| v.to_string()).collect::<Vec<_>>(),
    );
    {
        let cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = cache.as_ref().and_then(|c| c.get(&key)) {
            return Ok(p.clone());
        }
    }
    let program = Arc::new(compile_uncached(source, vars)?);
    let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    let c = cache.get_or_insert_with(HashMap::new);
    if c.len() >= CACHE_LIMIT {
        c.clear();
    }
    c.insert(key, program.clone());
    Ok(program)
}

fn compile_uncached(source: &str, vars: &[&str]) -> Result<Program, CompileError> {
    if source.trim().is_empty() {
        return Err(CompileError(
            "ERROR: <input>:1:1: Syntax error: mismatched input '<EOF>' expecting {'[', '{', '(', '.', '-', '!', 'true', 'false', 'null', NUM_FLOAT, NUM_INT, NUM_UINT, STRING, BYTES, IDENTIFIER}".into(),
        ));
    }
    // cel-go indents the source snippet under each error by one space.
    let program = ENV
        .compile(source)
        .map_err(|e| CompileError(e.to_string().replace("\n| ", "\n | ")))?;
    let mut walk = Walk {
        vars,
        bound: Vec::new(),
        uses: BTreeSet::new(),
        undeclared: Vec::new(),
        nodes: 0,
        depth: 0,
        max_depth: 0,
    };
    walk.expr(program.expression());
    if let Some((id, name)) = walk.undeclared.first() {
        let (line, col) = position(&program, *id);
        return Err(CompileError(format!(
            "ERROR: <input>:{line}:{col}: undeclared reference to '{name}' (in container '')"
        )));
    }
    if walk.max_depth > MAX_COMPREHENSION_DEPTH {
        return Err(CompileError(format!(
            "ERROR: <input>:1:1: expression nests {} comprehensions, more than the {MAX_COMPREHENSION_DEPTH} allowed",
            walk.max_depth
        )));
    }
    Ok(Program {
        source: source.to_string(),
        program,
        uses: walk.uses,
        nodes: walk.nodes,
        depth: walk.max_depth,
    })
}

/// Line and column (1-based) of a node, as cel-go's messages give them.
fn position(program: &::cel::Program, id: u64) -> (usize, usize) {
    let Some((start, _)) = program.source_info().offset_for(id) else {
        return (1, 1);
    };
    let src = &program.source_info().source;
    let start = start as usize;
    let mut line = 1;
    let mut col = 1;
    for (i, c) in src.chars().enumerate() {
        if i >= start {
            break;
        }
        if c == '\n' {
            line += 1;
            col = 1;
        } else {
            col += 1;
        }
    }
    (line, col)
}

/// A walk over an expression: its free identifiers, size and comprehension depth.
struct Walk<'a> {
    vars: &'a [&'a str],
    bound: Vec<String>,
    uses: BTreeSet<String>,
    undeclared: Vec<(u64, String)>,
    nodes: u64,
    depth: usize,
    max_depth: usize,
}

impl Walk<'_> {
    fn expr(&mut self, e: &::cel::IdedExpr) {
        use ::cel::common::ast::{EntryExpr, Expr};
        self.nodes += 1;
        match &e.expr {
            Expr::Ident(name) => {
                if name.starts_with('@') || self.bound.iter().any(|b| b == name) {
                    return;
                }
                if self.vars.contains(&name.as_str()) {
                    self.uses.insert(name.clone());
                } else if !BUILTIN_IDENTS.contains(&name.as_str()) {
                    self.undeclared.push((e.id, name.clone()));
                }
            }
            Expr::Call(call) => {
                if let Some(t) = &call.target {
                    self.expr(t);
                }
                for a in &call.args {
                    self.expr(a);
                }
            }
            Expr::Comprehension(c) => {
                self.expr(&c.iter_range);
                self.expr(&c.accu_init);
                let mut names = vec![c.iter_var.clone(), c.accu_var.clone()];
                if let Some(v2) = &c.iter_var2 {
                    names.push(v2.clone());
                }
                let n = names.len();
                self.bound.extend(names);
                self.depth += 1;
                self.max_depth = self.max_depth.max(self.depth);
                self.expr(&c.loop_cond);
                self.expr(&c.loop_step);
                self.depth -= 1;
                self.expr(&c.result);
                self.bound.truncate(self.bound.len() - n);
            }
            Expr::List(l) => {
                for x in &l.elements {
                    self.expr(x);
                }
            }
            Expr::Map(m) => {
                for entry in &m.entries {
                    match &entry.expr {
                        EntryExpr::StructField(f) => self.expr(&f.value),
                        EntryExpr::MapEntry(me) => {
                            self.expr(&me.key);
                            self.expr(&me.value);
                        }
                    }
                }
            }
            Expr::Struct(s) => {
                for entry in &s.entries {
                    if let EntryExpr::StructField(f) = &entry.expr {
                        self.expr(&f.value);
                    }
                }
            }
            Expr::Select(s) => self.expr(&s.operand),
            Expr::Literal(_) | Expr::Unspecified => {}
        }
    }
}

impl Program {
    /// The expression's text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether the expression refers to the variable `name`.
    pub fn uses(&self, name: &str) -> bool {
        self.uses.contains(name)
    }

    /// Evaluate with `vars` bound (a variable declared but not given is `null`).
    pub fn eval(&self, vars: &[(&str, &Json)]) -> Result<::cel::Value, EvalError> {
        self.eval_with(vars, &[])
    }

    /// As [`eval`](Self::eval), with values already in CEL's form bound as well.
    pub fn eval_with(
        &self,
        vars: &[(&str, &Json)],
        cel_vars: &[(&str, &::cel::Value)],
    ) -> Result<::cel::Value, EvalError> {
        if self.depth > 0 {
            let widest = vars
                .iter()
                .filter(|(n, _)| self.uses.contains(*n))
                .map(|(_, v)| widest(v))
                .chain(cel_vars.iter().map(|(_, v)| widest_cel(v)))
                .max()
                .unwrap_or(0)
                .max(1);
            let mut bound = self.nodes;
            for _ in 0..self.depth {
                bound = bound.saturating_mul(widest);
            }
            if bound > PER_CALL_LIMIT {
                return Err(EvalError::CostLimit);
            }
        }
        ROOT.with(|root| {
            let mut ctx = root.new_inner_scope();
            for (name, v) in vars {
                if self.uses.contains(*name) {
                    ctx.add_variable_from_value(*name, to_cel(v));
                }
            }
            for (name, v) in cel_vars {
                if self.uses.contains(*name) {
                    ctx.add_variable_from_value(*name, (*v).clone());
                }
            }
            self.program.execute(&ctx).map_err(convert_error)
        })
    }

    /// Evaluate to a boolean (rules, conditions, validations).
    pub fn eval_bool(&self, vars: &[(&str, &Json)]) -> Result<bool, EvalError> {
        self.eval_bool_with(vars, &[])
    }

    pub fn eval_bool_with(
        &self,
        vars: &[(&str, &Json)],
        cel_vars: &[(&str, &::cel::Value)],
    ) -> Result<bool, EvalError> {
        match self.eval_with(vars, cel_vars)? {
            ::cel::Value::Bool(b) => Ok(b),
            _ => Err(EvalError::NoSuchOverload),
        }
    }
}

/// The largest collection inside a value: the longest list, map or string.
fn widest(v: &Json) -> u64 {
    match v {
        Json::Array(a) => a.iter().map(widest).max().unwrap_or(0).max(a.len() as u64),
        Json::Object(m) => m.values().map(widest).max().unwrap_or(0).max(m.len() as u64),
        Json::String(s) => s.len() as u64,
        _ => 0,
    }
}

fn widest_cel(v: &::cel::Value) -> u64 {
    match v {
        ::cel::Value::List(l) => l.iter().map(widest_cel).max().unwrap_or(0).max(l.len() as u64),
        ::cel::Value::Map(m) => m
            .map
            .values()
            .map(widest_cel)
            .max()
            .unwrap_or(0)
            .max(m.map.len() as u64),
        ::cel::Value::String(s) => s.len() as u64,
        _ => 0,
    }
}

/// A JSON value as CEL sees it: integers are `int` (or `uint` past `int`'s range), other
/// numbers `double`, objects maps with string keys.
pub fn to_cel(v: &Json) -> ::cel::Value {
    match v {
        Json::Null => ::cel::Value::Null,
        Json::Bool(b) => ::cel::Value::Bool(*b),
        Json::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => ::cel::Value::Int(i),
            (None, Some(u)) => ::cel::Value::UInt(u),
            _ => ::cel::Value::Float(n.as_f64().unwrap_or(0.0)),
        },
        Json::String(s) => ::cel::Value::String(Arc::new(s.clone())),
        Json::Array(a) => ::cel::Value::List(Arc::new(a.iter().map(to_cel).collect())),
        Json::Object(m) => {
            let map: HashMap<Key, ::cel::Value> = m
                .iter()
                .map(|(k, v)| (Key::String(Arc::new(k.clone())), to_cel(v)))
                .collect();
            ::cel::Value::Map(Map { map: Arc::new(map) })
        }
    }
}

/// A CEL value as JSON (`null` for what JSON cannot hold).
pub fn to_json(v: &::cel::Value) -> Json {
    match v {
        ::cel::Value::Null => Json::Null,
        ::cel::Value::Bool(b) => Json::Bool(*b),
        ::cel::Value::Int(i) => Json::from(*i),
        ::cel::Value::UInt(u) => Json::from(*u),
        ::cel::Value::Float(f) => serde_json::Number::from_f64(*f).map_or(Json::Null, Json::Number),
        ::cel::Value::String(s) => Json::String(s.to_string()),
        ::cel::Value::List(l) => Json::Array(l.iter().map(to_json).collect()),
        ::cel::Value::Map(m) => Json::Object(
            m.map
                .iter()
                .map(|(k, v)| {
                    let k = match k {
                        Key::String(s) => s.to_string(),
                        Key::Int(i) => i.to_string(),
                        Key::Uint(u) => u.to_string(),
                        Key::Bool(b) => b.to_string(),
                    };
                    (k, to_json(v))
                })
                .collect(),
        ),
        ::cel::Value::Duration(d) => Json::String(format!("{}s", d.num_milliseconds() as f64 / 1000.0)),
        ::cel::Value::Timestamp(t) => Json::String(t.to_rfc3339()),
        _ => Json::Null,
    }
}

/// An execution error in cel-go's words.
fn convert_error(e: ::cel::ExecutionError) -> EvalError {
    use ::cel::ExecutionError as E;
    match e {
        E::NoSuchKey(k) => EvalError::Other(format!("no such key: {k}")),
        E::NoSuchOverload(_)
        | E::UnexpectedType { .. }
        | E::ValuesNotComparable(..)
        | E::UnsupportedBinaryOperator(..)
        | E::UnsupportedTargetType { .. }
        | E::NotSupportedAsMethod { .. }
        | E::InvalidArgumentCount { .. }
        | E::MissingArgumentOrTarget => EvalError::NoSuchOverload,
        E::DivisionByZero(_) => EvalError::Other("division by zero".into()),
        E::RemainderByZero(_) => EvalError::Other("modulus by zero".into()),
        E::Overflow(..) => EvalError::Other("integer overflow".into()),
        E::IndexOutOfBounds(i) => EvalError::Other(format!("index out of bounds: {}", to_json(&i))),
        E::UndeclaredReference(n) => EvalError::Other(format!("no such attribute(s): {n}")),
        E::FunctionError { message, .. } => EvalError::Other(message),
        E::DuplicateKey(k) => EvalError::Other(format!("repeated key: {}", to_json(&k))),
        other => EvalError::Other(other.to_string()),
    }
}

/// The environment: the standard library and the extensions Kubernetes enables.
static ENV: std::sync::LazyLock<Arc<::cel::Env>> = std::sync::LazyLock::new(|| {
    let mut env = ::cel::Env::stdlib();
    for (name, ext) in [
        (
            "strings",
            ::cel::extensions::strings as fn(&mut ::cel::Env) -> Result<(), ::cel::DeclarationError>,
        ),
        ("lists", ::cel::extensions::lists),
        ("math", ::cel::extensions::math),
        ("encoders", ::cel::extensions::encoders),
    ] {
        if let Err(e) = env.add_extension(ext) {
            registration_failed(name, &e.to_string());
        }
    }
    Arc::new(env)
});

/// Extensions are fixed at build time: one that fails to register is a programming error,
/// logged rather than taking the server down.
fn registration_failed(name: &str, e: &str) {
    tracing::error!(
        function = name,
        error = e,
        "a CEL library function could not be registered"
    );
}

thread_local! {
    /// The root context: the environment and Kubernetes' functions. Each evaluation binds
    /// its variables in a scope of its own under it.
    static ROOT: ::cel::Context<'static, 'static> = root_context();
}

fn root_context() -> ::cel::Context<'static, 'static> {
    let mut ctx = ::cel::Context::with_env(ENV.clone());
    let adds: [(&str, Result<(), ::cel::DeclarationError>); 6] = [
        ("isSorted", ctx.add_function("isSorted", is_sorted)),
        ("sum", ctx.add_function("sum", sum)),
        ("min", ctx.add_function("min", min)),
        ("max", ctx.add_function("max", max)),
        ("find", ctx.add_function("find", find)),
        ("findAll", ctx.add_function("findAll", find_all)),
    ];
    for (name, r) in adds {
        if let Err(e) = r {
            registration_failed(name, &e.to_string());
        }
    }
    ctx
}

fn compare(a: &::cel::Value, b: &::cel::Value) -> Result<std::cmp::Ordering, ::cel::ExecutionError> {
    a.partial_cmp(b)
        .ok_or_else(|| ::cel::ExecutionError::no_such_overload("_<_", vec![]))
}

/// Kubernetes' `<list>.isSorted()`.
fn is_sorted(This(list): This<Arc<Vec<::cel::Value>>>) -> Result<bool, ::cel::ExecutionError> {
    for w in list.windows(2) {
        if compare(&w[0], &w[1])? == std::cmp::Ordering::Greater {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Kubernetes' `<list>.sum()`: 0 for an empty list.
fn sum(This(list): This<Arc<Vec<::cel::Value>>>) -> Result<::cel::Value, ::cel::ExecutionError> {
    let mut acc = ::cel::Value::Int(0);
    for (i, v) in list.iter().enumerate() {
        acc = match (&acc, v) {
            (_, x) if i == 0 => x.clone(),
            (::cel::Value::Int(a), ::cel::Value::Int(b)) => {
                ::cel::Value::Int(a.checked_add(*b).ok_or_else(|| {
                    ::cel::ExecutionError::Overflow("+", ::cel::Value::Int(*a), ::cel::Value::Int(*b))
                })?)
            }
            (::cel::Value::UInt(a), ::cel::Value::UInt(b)) => {
                ::cel::Value::UInt(a.checked_add(*b).ok_or_else(|| {
                    ::cel::ExecutionError::Overflow("+", ::cel::Value::UInt(*a), ::cel::Value::UInt(*b))
                })?)
            }
            (::cel::Value::Float(a), ::cel::Value::Float(b)) => ::cel::Value::Float(a + b),
            _ => return Err(::cel::ExecutionError::no_such_overload("sum", vec![])),
        };
    }
    Ok(acc)
}

fn extreme(list: &[::cel::Value], want: std::cmp::Ordering, name: &str) -> Result<::cel::Value, ::cel::ExecutionError> {
    let Some(first) = list.first() else {
        return Err(::cel::ExecutionError::function_error(
            name,
            format!("{name} called on empty list"),
        ));
    };
    let mut best = first;
    for v in &list[1..] {
        if compare(v, best)? == want {
            best = v;
        }
    }
    Ok(best.clone())
}

/// Kubernetes' `<list>.min()`.
fn min(This(list): This<Arc<Vec<::cel::Value>>>) -> Result<::cel::Value, ::cel::ExecutionError> {
    extreme(&list, std::cmp::Ordering::Less, "min")
}

/// Kubernetes' `<list>.max()`.
fn max(This(list): This<Arc<Vec<::cel::Value>>>) -> Result<::cel::Value, ::cel::ExecutionError> {
    extreme(&list, std::cmp::Ordering::Greater, "max")
}

fn regex_of(re: &str, name: &str) -> Result<regex::Regex, ::cel::ExecutionError> {
    regex::Regex::new(re).map_err(|e| ::cel::ExecutionError::function_error(name, e.to_string()))
}

/// Kubernetes' `<string>.find(regex)`: the first match, or "".
fn find(This(s): This<Arc<String>>, Arguments(args): Arguments) -> Result<::cel::Value, ::cel::ExecutionError> {
    let Some(::cel::Value::String(re)) = args.first() else {
        return Err(::cel::ExecutionError::no_such_overload("find", vec![]));
    };
    let re = regex_of(re, "find")?;
    Ok(::cel::Value::String(Arc::new(
        re.find(&s).map(|m| m.as_str().to_string()).unwrap_or_default(),
    )))
}

/// Kubernetes' `<string>.findAll(regex[, limit])`.
fn find_all(This(s): This<Arc<String>>, Arguments(args): Arguments) -> Result<::cel::Value, ::cel::ExecutionError> {
    let (re, limit) = match args.as_slice() {
        [::cel::Value::String(re)] => (re, -1),
        [::cel::Value::String(re), ::cel::Value::Int(n)] => (re, *n),
        _ => return Err(::cel::ExecutionError::no_such_overload("findAll", vec![])),
    };
    let re = regex_of(re, "findAll")?;
    let found = re
        .find_iter(&s)
        .take(if limit < 0 { usize::MAX } else { limit as usize })
        .map(|m| ::cel::Value::String(Arc::new(m.as_str().to_string())))
        .collect();
    Ok(::cel::Value::List(Arc::new(found)))
}

/// A CEL value as upstream shows a `messageExpression`'s result: strings as they are.
pub fn display(v: &::cel::Value) -> String {
    match v {
        ::cel::Value::String(s) => s.to_string(),
        other => to_json(other).to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn eval(src: &str, vars: &[(&str, &Json)]) -> Result<Json, EvalError> {
        let names: Vec<&str> = vars.iter().map(|(n, _)| *n).collect();
        let p = compile(src, &names).expect("compiles");
        p.eval(vars).map(|v| to_json(&v))
    }

    #[test]
    fn rules_see_json_values() {
        let obj = json!({"replicas": 3, "name": "Web-1", "items": [1, 2, 3], "labels": {"a": "b"}});
        let vars = [("self", &obj)];
        for (src, want) in [
            ("self.replicas <= 5", json!(true)),
            ("size(self.items) == 3", json!(true)),
            ("has(self.labels) && !has(self.missing)", json!(true)),
            ("self.items.all(x, x > 0) && self.items.exists(x, x == 2)", json!(true)),
            ("self.items.map(x, x * 2)", json!([2, 4, 6])),
            ("self.items.filter(x, x > 1)", json!([2, 3])),
            ("self.name.matches('^[A-Za-z]+-[0-9]$')", json!(true)),
            (
                "self.name.startsWith('Web') && self.name.endsWith('1') && self.name.contains('-')",
                json!(true),
            ),
            ("self.name.lowerAscii() + self.name.upperAscii()", json!("web-1WEB-1")),
            ("int('7') + int(2.5)", json!(9)),
            ("string(self.replicas) + 'x'", json!("3x")),
            ("double(self.replicas) / 2.0", json!(1.5)),
            ("self.items.isSorted() && self.items.sum() == 6", json!(true)),
            ("self.items.min() == 1 && self.items.max() == 3", json!(true)),
            ("'abc123def456'.find('[0-9]+')", json!("123")),
            ("'abc123def456'.findAll('[0-9]+')", json!(["123", "456"])),
            ("self.labels['a'] == 'b' && 'a' in self.labels", json!(true)),
            ("self.items.exists_one(x, x == 3)", json!(true)),
        ] {
            assert_eq!(eval(src, &vars), Ok(want), "{src}");
        }
    }

    #[test]
    fn errors_read_as_cel_go_writes_them() {
        let obj = json!({"a": 1});
        let vars = [("self", &obj)];
        assert_eq!(
            eval("self.b == 1", &vars),
            Err(EvalError::Other("no such key: b".into()))
        );
        assert_eq!(
            eval("self.a / 0 == 1", &vars),
            Err(EvalError::Other("division by zero".into()))
        );
        assert_eq!(eval("self.a + 'x'", &vars), Err(EvalError::NoSuchOverload));
        let err = compile("self.a <<= 5", &["self"]).expect_err("syntax");
        assert!(err.0.starts_with("ERROR: <input>:1:"), "{}", err.0);
        let err = compile("foo.a == 1", &["self"]).expect_err("undeclared");
        assert_eq!(
            err.0,
            "ERROR: <input>:1:1: undeclared reference to 'foo' (in container '')"
        );
        assert!(compile("self.all(x, x > 0)", &["self"]).is_ok());
        assert!(compile("type(self) == string", &["self"]).is_ok());
    }

    #[test]
    fn programs_are_cached_by_text() {
        let a = compile("self > 1", &["self"]).expect("compiles");
        let b = compile("self > 1", &["self"]).expect("compiles");
        assert!(Arc::ptr_eq(&a, &b));
        assert!(a.uses("self") && !a.uses("oldSelf"));
    }

    #[test]
    fn cost_is_bounded_before_evaluation() {
        let big: Vec<u32> = (0..2000).collect();
        let obj = json!(big);
        let vars = [("self", &obj)];
        assert_eq!(eval("self.all(x, x >= 0)", &vars), Ok(json!(true)));
        assert_eq!(
            eval("self.all(x, self.all(y, x + y >= 0))", &vars),
            Err(EvalError::CostLimit)
        );
        assert!(compile("[1].all(a, [1].all(b, [1].all(c, [1].all(d, true))))", &[]).is_err());
    }
}
