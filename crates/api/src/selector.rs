//! Label and field selectors, with upstream's grammar, matching rules and error messages
//! (`k8s.io/apimachinery/pkg/labels` and `.../fields`, plus the per-kind field label
//! conversions of the API server).
//!
//! A selector that fails to parse gives a [`SelectorError`] whose text is upstream's, so the
//! API server can answer `400 BadRequest` with the same message kubectl users know.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use serde_json::{Map, Value};

use crate::registry::Resource;

/// A selector that could not be parsed or is not supported. The text is upstream's message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// A malformed label selector (query string or `LabelSelector` object).
    #[error("{0}")]
    Label(String),
    /// A malformed field selector, or a field the resource cannot be selected by.
    #[error("{0}")]
    Field(String),
}

// ---------------------------------------------------------------------------------------------
// Label selectors
// ---------------------------------------------------------------------------------------------

/// The operator of one label requirement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operator {
    In,
    NotIn,
    Equals,
    DoubleEquals,
    NotEquals,
    Exists,
    DoesNotExist,
    GreaterThan,
    LessThan,
}

/// One requirement of a label selector, e.g. `tier in (a,b)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    key: String,
    operator: Operator,
    values: Vec<String>,
}

impl Requirement {
    /// Builds a requirement, validating key and values as upstream's `labels.NewRequirement`.
    pub fn new(key: &str, operator: Operator, values: Vec<String>) -> Result<Self, SelectorError> {
        let mut errs: Vec<String> = Vec::new();
        if let Some(msg) = validate_label_key(key) {
            errs.push(field_invalid("key", &go_quote(key), &msg));
        }
        match operator {
            Operator::In | Operator::NotIn => {
                if values.is_empty() {
                    errs.push(field_invalid(
                        "values",
                        &go_string_slice(&values),
                        "for 'in', 'notin' operators, values set can't be empty",
                    ));
                }
            }
            Operator::Equals | Operator::DoubleEquals | Operator::NotEquals => {
                if values.len() != 1 {
                    errs.push(field_invalid(
                        "values",
                        &go_string_slice(&values),
                        "exact-match compatibility requires one single value",
                    ));
                }
            }
            Operator::Exists | Operator::DoesNotExist => {
                if !values.is_empty() {
                    errs.push(field_invalid(
                        "values",
                        &go_string_slice(&values),
                        "values set must be empty for exists and does not exist",
                    ));
                }
            }
            Operator::GreaterThan | Operator::LessThan => {
                if values.len() != 1 {
                    errs.push(field_invalid(
                        "values",
                        &go_string_slice(&values),
                        "for 'Gt', 'Lt' operators, exactly one value is required",
                    ));
                }
                for (i, v) in values.iter().enumerate() {
                    if v.parse::<i64>().is_err() {
                        errs.push(field_invalid(
                            &format!("values[{i}]"),
                            &go_quote(v),
                            "for 'Gt', 'Lt' operators, the value must be an integer",
                        ));
                    }
                }
            }
        }
        for (i, v) in values.iter().enumerate() {
            let msgs = is_valid_label_value(v);
            if !msgs.is_empty() {
                errs.push(field_invalid(
                    &format!("values[{i}][{key}]"),
                    &go_quote(v),
                    &msgs.join("; "),
                ));
            }
        }
        if errs.is_empty() {
            Ok(Requirement {
                key: key.to_string(),
                operator,
                values,
            })
        } else {
            Err(SelectorError::Label(aggregate(errs)))
        }
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn operator(&self) -> Operator {
        self.operator
    }

    pub fn values(&self) -> &[String] {
        &self.values
    }

    /// Whether the labels satisfy this requirement (upstream's `Requirement.Matches`).
    pub fn matches<L: LabelSource + ?Sized>(&self, labels: &L) -> bool {
        let value = labels.label(&self.key);
        match self.operator {
            Operator::In | Operator::Equals | Operator::DoubleEquals => {
                value.is_some_and(|v| self.values.iter().any(|x| x == v))
            }
            Operator::NotIn | Operator::NotEquals => match value {
                None => true,
                Some(v) => !self.values.iter().any(|x| x == v),
            },
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
            Operator::GreaterThan | Operator::LessThan => {
                let Some(have) = value.and_then(|v| v.parse::<i64>().ok()) else {
                    return false;
                };
                let Some(want) = self.values.first().and_then(|v| v.parse::<i64>().ok()) else {
                    return false;
                };
                if self.operator == Operator::GreaterThan {
                    have > want
                } else {
                    have < want
                }
            }
        }
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.operator == Operator::DoesNotExist {
            f.write_str("!")?;
        }
        f.write_str(&self.key)?;
        let op = match self.operator {
            Operator::Equals => "=",
            Operator::DoubleEquals => "==",
            Operator::NotEquals => "!=",
            Operator::In => " in ",
            Operator::NotIn => " notin ",
            Operator::GreaterThan => ">",
            Operator::LessThan => "<",
            Operator::Exists | Operator::DoesNotExist => return Ok(()),
        };
        f.write_str(op)?;
        let set = matches!(self.operator, Operator::In | Operator::NotIn);
        if set {
            f.write_str("(")?;
        }
        if self.values.len() == 1 {
            f.write_str(&self.values[0])?;
        } else {
            let mut sorted: Vec<&str> = self.values.iter().map(String::as_str).collect();
            sorted.sort_unstable();
            f.write_str(&sorted.join(","))?;
        }
        if set {
            f.write_str(")")?;
        }
        Ok(())
    }
}

/// Something labels can be read from.
pub trait LabelSource {
    fn label(&self, key: &str) -> Option<&str>;
}

impl LabelSource for Map<String, Value> {
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Value::as_str)
    }
}

impl LabelSource for BTreeMap<String, String> {
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key).map(String::as_str)
    }
}

impl<S: std::hash::BuildHasher> LabelSource for HashMap<String, String, S> {
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key).map(String::as_str)
    }
}

impl<T: LabelSource> LabelSource for Option<T> {
    /// Absent labels (`metadata.labels` unset) are no labels.
    fn label(&self, key: &str) -> Option<&str> {
        self.as_ref().and_then(|l| l.label(key))
    }
}

impl LabelSource for Value {
    /// A JSON object of labels; anything else has no labels.
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Value::as_str)
    }
}

/// A label selector: every requirement must hold. The empty selector selects everything;
/// [`LabelSelector::nothing`] (a null `LabelSelector` object) selects nothing.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
    nothing: bool,
}

impl LabelSelector {
    /// The selector that matches every object.
    pub fn everything() -> Self {
        Self::default()
    }

    /// The selector that matches no object (upstream's `labels.Nothing()`).
    pub fn nothing() -> Self {
        LabelSelector {
            requirements: Vec::new(),
            nothing: true,
        }
    }

    /// Parses the query-string form (`a=b,c!=d,e in (f,g),!h`), as upstream's `labels.Parse`.
    pub fn parse(selector: &str) -> Result<Self, SelectorError> {
        let mut parser = Parser::new(selector);
        let mut requirements = parser.parse().map_err(SelectorError::Label)?;
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(LabelSelector {
            requirements,
            nothing: false,
        })
    }

    /// Converts a `metav1.LabelSelector` object (`matchLabels` + `matchExpressions`), as
    /// upstream's `LabelSelectorAsSelector`: `null` selects nothing, `{}` selects everything.
    pub fn from_label_selector_json(selector: &Value) -> Result<Self, SelectorError> {
        let obj = match selector {
            Value::Null => return Ok(Self::nothing()),
            Value::Object(obj) => obj,
            other => {
                return Err(SelectorError::Label(format!("invalid label selector: {other}")));
            }
        };
        let mut requirements = Vec::new();
        if let Some(Value::Object(labels)) = obj.get("matchLabels") {
            for (k, v) in labels {
                let v = v.as_str().unwrap_or_default().to_string();
                requirements.push(Requirement::new(k, Operator::Equals, vec![v])?);
            }
        }
        if let Some(Value::Array(exprs)) = obj.get("matchExpressions") {
            for expr in exprs {
                let key = expr.get("key").and_then(Value::as_str).unwrap_or_default();
                let op_name = expr.get("operator").and_then(Value::as_str).unwrap_or_default();
                let op = match op_name {
                    "In" => Operator::In,
                    "NotIn" => Operator::NotIn,
                    "Exists" => Operator::Exists,
                    "DoesNotExist" => Operator::DoesNotExist,
                    other => {
                        return Err(SelectorError::Label(format!(
                            "{} is not a valid label selector operator",
                            go_quote(other)
                        )));
                    }
                };
                let values: Vec<String> = match expr.get("values") {
                    Some(Value::Array(vs)) => vs.iter().map(|v| v.as_str().unwrap_or_default().to_string()).collect(),
                    _ => Vec::new(),
                };
                requirements.push(Requirement::new(key, op, values)?);
            }
        }
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(LabelSelector {
            requirements,
            nothing: false,
        })
    }

    /// Converts a typed `LabelSelector` (as controllers hold it); `None` selects nothing.
    pub fn from_k8s(
        selector: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>,
    ) -> Result<Self, SelectorError> {
        let value = match selector {
            Some(s) => serde_json::to_value(s).map_err(|e| SelectorError::Label(e.to_string()))?,
            None => Value::Null,
        };
        Self::from_label_selector_json(&value)
    }

    /// The selector `k1=v1,k2=v2` for a plain label map (a Service's or ReplicationController's
    /// `spec.selector`). An empty map selects everything, as upstream's `SelectorFromSet`.
    pub fn from_map<L>(labels: L) -> Self
    where
        L: IntoIterator,
        L::Item: LabelPair,
    {
        let mut requirements: Vec<Requirement> = labels
            .into_iter()
            .map(|pair| {
                let (k, v) = pair.pair();
                Requirement {
                    key: k,
                    operator: Operator::Equals,
                    values: vec![v],
                }
            })
            .collect();
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        LabelSelector {
            requirements,
            nothing: false,
        }
    }

    /// Whether the labels satisfy every requirement.
    pub fn matches<L: LabelSource + ?Sized>(&self, labels: &L) -> bool {
        !self.nothing && self.requirements.iter().all(|r| r.matches(labels))
    }

    /// Whether the object's `metadata.labels` satisfy the selector.
    pub fn matches_object(&self, obj: &Value) -> bool {
        match obj.pointer("/metadata/labels") {
            Some(labels @ Value::Object(_)) => self.matches(labels),
            _ => self.matches(&Map::new()),
        }
    }

    /// True for the selector that matches everything (no requirements).
    pub fn is_empty(&self) -> bool {
        !self.nothing && self.requirements.is_empty()
    }

    /// True for the selector that matches nothing.
    pub fn is_nothing(&self) -> bool {
        self.nothing
    }

    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

/// A key/value pair usable by [`LabelSelector::from_map`].
pub trait LabelPair {
    fn pair(self) -> (String, String);
}

impl LabelPair for (&String, &String) {
    fn pair(self) -> (String, String) {
        (self.0.clone(), self.1.clone())
    }
}

impl LabelPair for (&str, &str) {
    fn pair(self) -> (String, String) {
        (self.0.to_string(), self.1.to_string())
    }
}

impl LabelPair for (&String, &Value) {
    fn pair(self) -> (String, String) {
        (self.0.clone(), self.1.as_str().unwrap_or_default().to_string())
    }
}

// --- lexer and parser, as upstream's labels/selector.go -------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token {
    Error,
    EndOfString,
    ClosedPar,
    Comma,
    DoesNotExist,
    DoubleEquals,
    Equals,
    GreaterThan,
    Identifier,
    In,
    LessThan,
    NotEquals,
    NotIn,
    OpenPar,
}

fn string_to_token(s: &str) -> Option<Token> {
    Some(match s {
        ")" => Token::ClosedPar,
        "," => Token::Comma,
        "!" => Token::DoesNotExist,
        "==" => Token::DoubleEquals,
        "=" => Token::Equals,
        ">" => Token::GreaterThan,
        "in" => Token::In,
        "<" => Token::LessThan,
        "!=" => Token::NotEquals,
        "notin" => Token::NotIn,
        "(" => Token::OpenPar,
        _ => return None,
    })
}

fn is_whitespace(ch: u8) -> bool {
    matches!(ch, b' ' | b'\t' | b'\r' | b'\n')
}

fn is_special_symbol(ch: u8) -> bool {
    matches!(ch, b'=' | b'!' | b'(' | b')' | b',' | b'>' | b'<')
}

struct Lexer<'a> {
    s: &'a [u8],
    pos: usize,
}

impl Lexer<'_> {
    /// The next byte, or 0 at the end (as upstream's lexer).
    fn read(&mut self) -> u8 {
        if self.pos < self.s.len() {
            let b = self.s[self.pos];
            self.pos += 1;
            b
        } else {
            0
        }
    }

    fn unread(&mut self) {
        self.pos = self.pos.saturating_sub(1);
    }

    fn lex(&mut self) -> (Token, String) {
        let mut ch = self.read();
        while is_whitespace(ch) {
            ch = self.read();
        }
        if ch == 0 {
            return (Token::EndOfString, String::new());
        }
        self.unread();
        if is_special_symbol(ch) {
            self.scan_special_symbol()
        } else {
            self.scan_id_or_keyword()
        }
    }

    fn scan_id_or_keyword(&mut self) -> (Token, String) {
        let mut buf = Vec::new();
        loop {
            let ch = self.read();
            if ch == 0 {
                break;
            }
            if is_special_symbol(ch) || is_whitespace(ch) {
                self.unread();
                break;
            }
            buf.push(ch);
        }
        let s = String::from_utf8_lossy(&buf).into_owned();
        match string_to_token(&s) {
            Some(tok) => (tok, s),
            None => (Token::Identifier, s),
        }
    }

    fn scan_special_symbol(&mut self) -> (Token, String) {
        let mut buf = Vec::new();
        let mut last: Option<(Token, String)> = None;
        loop {
            let ch = self.read();
            if ch == 0 {
                break;
            }
            if !is_special_symbol(ch) {
                self.unread();
                break;
            }
            buf.push(ch);
            let s = String::from_utf8_lossy(&buf).into_owned();
            if let Some(tok) = string_to_token(&s) {
                last = Some((tok, s));
            } else if last.is_some() {
                self.unread();
                break;
            }
        }
        match last {
            Some(item) => item,
            None => (
                Token::Error,
                format!("error expected: keyword found '{}'", String::from_utf8_lossy(&buf)),
            ),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Context {
    KeyAndOperator,
    Values,
}

struct Parser {
    items: Vec<(Token, String)>,
    position: usize,
}

impl Parser {
    fn new(selector: &str) -> Self {
        let mut lexer = Lexer {
            s: selector.as_bytes(),
            pos: 0,
        };
        let mut items = Vec::new();
        loop {
            let (tok, lit) = lexer.lex();
            items.push((tok, lit));
            if tok == Token::EndOfString {
                break;
            }
        }
        Parser { items, position: 0 }
    }

    fn item(&self, pos: usize, ctx: Context) -> (Token, String) {
        let idx = pos.min(self.items.len().saturating_sub(1));
        let (tok, lit) = self
            .items
            .get(idx)
            .cloned()
            .unwrap_or((Token::EndOfString, String::new()));
        let tok = if ctx == Context::Values && matches!(tok, Token::In | Token::NotIn) {
            Token::Identifier
        } else {
            tok
        };
        (tok, lit)
    }

    fn lookahead(&self, ctx: Context) -> (Token, String) {
        self.item(self.position, ctx)
    }

    fn consume(&mut self, ctx: Context) -> (Token, String) {
        let item = self.item(self.position, ctx);
        self.position += 1;
        item
    }

    fn parse(&mut self) -> Result<Vec<Requirement>, String> {
        let mut requirements = Vec::new();
        loop {
            let (tok, lit) = self.lookahead(Context::Values);
            match tok {
                Token::Identifier | Token::DoesNotExist => {
                    let r = self
                        .parse_requirement()
                        .map_err(|e| format!("unable to parse requirement: {e}"))?;
                    requirements.push(r);
                    let (t, l) = self.consume(Context::Values);
                    match t {
                        Token::EndOfString => return Ok(requirements),
                        Token::Comma => {
                            let (t2, l2) = self.lookahead(Context::Values);
                            if t2 != Token::Identifier && t2 != Token::DoesNotExist {
                                return Err(format!("found '{l2}', expected: identifier after ','"));
                            }
                        }
                        _ => return Err(format!("found '{l}', expected: ',' or 'end of string'")),
                    }
                }
                Token::EndOfString => return Ok(requirements),
                _ => {
                    return Err(format!("found '{lit}', expected: !, identifier, or 'end of string'"));
                }
            }
        }
    }

    fn parse_requirement(&mut self) -> Result<Requirement, String> {
        let (key, op) = self.parse_key_and_infer_operator()?;
        if let Some(op) = op {
            return Requirement::new(&key, op, Vec::new()).map_err(|e| e.to_string());
        }
        let op = self.parse_operator()?;
        let values = match op {
            Operator::In | Operator::NotIn => self.parse_values()?,
            _ => self.parse_exact_value()?,
        };
        Requirement::new(&key, op, values).map_err(|e| e.to_string())
    }

    /// The key, and `Exists` / `DoesNotExist` when the requirement is unary.
    fn parse_key_and_infer_operator(&mut self) -> Result<(String, Option<Operator>), String> {
        let mut op = None;
        let (mut tok, mut lit) = self.consume(Context::Values);
        if tok == Token::DoesNotExist {
            op = Some(Operator::DoesNotExist);
            (tok, lit) = self.consume(Context::Values);
        }
        if tok != Token::Identifier {
            return Err(format!("found '{lit}', expected: identifier"));
        }
        if let Some(msg) = validate_label_key(&lit) {
            return Err(field_invalid("<nil>", &go_quote(&lit), &msg));
        }
        let (next, _) = self.lookahead(Context::Values);
        if (next == Token::EndOfString || next == Token::Comma) && op.is_none() {
            op = Some(Operator::Exists);
        }
        Ok((lit, op))
    }

    fn parse_operator(&mut self) -> Result<Operator, String> {
        let (tok, lit) = self.consume(Context::KeyAndOperator);
        Ok(match tok {
            Token::In => Operator::In,
            Token::Equals => Operator::Equals,
            Token::DoubleEquals => Operator::DoubleEquals,
            Token::GreaterThan => Operator::GreaterThan,
            Token::LessThan => Operator::LessThan,
            Token::NotIn => Operator::NotIn,
            Token::NotEquals => Operator::NotEquals,
            _ => {
                return Err(format!("found '{lit}', expected: in, notin, =, ==, !=, gt, lt"));
            }
        })
    }

    fn parse_values(&mut self) -> Result<Vec<String>, String> {
        let (tok, lit) = self.consume(Context::Values);
        if tok != Token::OpenPar {
            return Err(format!("found '{lit}' expected: '('"));
        }
        let (tok, lit) = self.lookahead(Context::Values);
        match tok {
            Token::Identifier | Token::Comma => {
                let set = self.parse_identifiers_list()?;
                let (tok, _) = self.consume(Context::Values);
                if tok != Token::ClosedPar {
                    return Err(format!("found '{lit}', expected: ')'"));
                }
                Ok(set)
            }
            Token::ClosedPar => {
                self.consume(Context::Values);
                Ok(vec![String::new()])
            }
            _ => Err(format!("found '{lit}', expected: ',', ')' or identifier")),
        }
    }

    /// A sorted set of identifiers, as upstream's `sets.String.List()`.
    fn parse_identifiers_list(&mut self) -> Result<Vec<String>, String> {
        let mut set = std::collections::BTreeSet::new();
        loop {
            let (tok, lit) = self.consume(Context::Values);
            match tok {
                Token::Identifier => {
                    set.insert(lit);
                    let (tok2, lit2) = self.lookahead(Context::Values);
                    match tok2 {
                        Token::Comma => continue,
                        Token::ClosedPar => return Ok(set.into_iter().collect()),
                        _ => return Err(format!("found '{lit2}', expected: ',' or ')'")),
                    }
                }
                Token::Comma => {
                    if set.is_empty() {
                        set.insert(String::new());
                    }
                    let (tok2, _) = self.lookahead(Context::Values);
                    if tok2 == Token::ClosedPar {
                        set.insert(String::new());
                        return Ok(set.into_iter().collect());
                    }
                    if tok2 == Token::Comma {
                        self.consume(Context::Values);
                        set.insert(String::new());
                    }
                }
                _ => return Err(format!("found '{lit}', expected: ',', or identifier")),
            }
        }
    }

    fn parse_exact_value(&mut self) -> Result<Vec<String>, String> {
        let (tok, _) = self.lookahead(Context::Values);
        if tok == Token::EndOfString || tok == Token::Comma {
            return Ok(vec![String::new()]);
        }
        let (tok, lit) = self.consume(Context::Values);
        if tok == Token::Identifier {
            Ok(vec![lit])
        } else {
            Err(format!("found '{lit}', expected: identifier"))
        }
    }
}

// --- validation messages, as upstream's util/validation ------------------------------------

const QUALIFIED_NAME_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const QUALIFIED_NAME_ERR: &str =
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const LABEL_VALUE_FMT: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";
const LABEL_VALUE_ERR: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const DNS1123_SUBDOMAIN_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const DNS1123_SUBDOMAIN_ERR: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";

fn regex_error(msg: &str, fmt: &str, examples: &[&str]) -> String {
    let mut out = format!("{msg} (e.g. ");
    for (i, ex) in examples.iter().enumerate() {
        if i > 0 {
            out.push_str(" or ");
        }
        out.push_str(&format!("'{ex}', "));
    }
    out.push_str(&format!("regex used for validation is '{fmt}')"));
    out
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`
fn is_qualified_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    let (Some(first), Some(last)) = (b.first(), b.last()) else {
        return false;
    };
    first.is_ascii_alphanumeric()
        && last.is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.split('.').all(|label| {
            let b = label.as_bytes();
            match (b.first(), b.last()) {
                (Some(f), Some(l)) => {
                    (f.is_ascii_lowercase() || f.is_ascii_digit())
                        && (l.is_ascii_lowercase() || l.is_ascii_digit())
                        && b.iter()
                            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                }
                _ => false,
            }
        })
}

/// Upstream's `validation.IsQualifiedName`: the list of problems, empty when valid.
fn is_qualified_name(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = value.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".to_string());
            } else {
                if prefix.len() > 253 {
                    errs.push("prefix part must be no more than 253 characters".to_string());
                }
                if !is_dns1123_subdomain(prefix) {
                    errs.push(format!(
                        "prefix part {}",
                        regex_error(DNS1123_SUBDOMAIN_ERR, DNS1123_SUBDOMAIN_FMT, &["example.com"])
                    ));
                }
            }
            *name
        }
        _ => {
            errs.push(format!(
                "a qualified name {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                regex_error(
                    QUALIFIED_NAME_ERR,
                    QUALIFIED_NAME_FMT,
                    &["MyName", "my.name", "123-abc"]
                )
            ));
            return errs;
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".to_string());
    } else if name.len() > 63 {
        errs.push("name part must be no more than 63 characters".to_string());
    }
    if !is_qualified_name_part(name) {
        errs.push(format!(
            "name part {}",
            regex_error(
                QUALIFIED_NAME_ERR,
                QUALIFIED_NAME_FMT,
                &["MyName", "my.name", "123-abc"]
            )
        ));
    }
    errs
}

fn validate_label_key(key: &str) -> Option<String> {
    let errs = is_qualified_name(key);
    if errs.is_empty() { None } else { Some(errs.join("; ")) }
}

/// Upstream's `validation.IsValidLabelValue`.
fn is_valid_label_value(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > 63 {
        errs.push("must be no more than 63 characters".to_string());
    }
    if !value.is_empty() && !is_qualified_name_part(value) {
        errs.push(regex_error(
            LABEL_VALUE_ERR,
            LABEL_VALUE_FMT,
            &["MyValue", "my_value", "12345"],
        ));
    }
    errs
}

/// A `field.Invalid` error's text: `path: Invalid value: "v": detail`.
fn field_invalid(path: &str, quoted_value: &str, detail: &str) -> String {
    format!("{path}: Invalid value: {quoted_value}: {detail}")
}

/// Upstream's aggregate error text: one message alone, several as `[a, b]`.
fn aggregate(errs: Vec<String>) -> String {
    let mut seen: Vec<String> = Vec::new();
    for e in errs {
        if !seen.contains(&e) {
            seen.push(e);
        }
    }
    if seen.len() == 1 {
        seen.remove(0)
    } else {
        format!("[{}]", seen.join(", "))
    }
}

/// Go's `%q` for a string (close enough: escapes quotes, backslashes and control characters).
pub(crate) fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Go's `%#v` for a `[]string`.
fn go_string_slice(values: &[String]) -> String {
    let inner: Vec<String> = values.iter().map(|v| go_quote(v)).collect();
    format!("[]string{{{}}}", inner.join(", "))
}

// ---------------------------------------------------------------------------------------------
// Field selectors
// ---------------------------------------------------------------------------------------------

/// One `field=value` / `field!=value` term.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldTerm {
    /// The field label, as upstream names it for the resource (e.g. `spec.nodeName`).
    pub field: String,
    pub value: String,
    /// True for `!=`.
    pub not_equal: bool,
}

/// A field selector for one resource: every term must hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldSelector {
    resource: Resource,
    terms: Vec<FieldTerm>,
}

impl FieldSelector {
    /// The selector that matches every object of the resource.
    pub fn everything(res: &Resource) -> Self {
        FieldSelector {
            resource: *res,
            terms: Vec::new(),
        }
    }

    /// Parses `a=b,c!=d` (also `==`), with upstream's escaping (`\,`, `\=`, `\\`), and checks
    /// every field is one the resource can be selected by.
    pub fn parse(res: &Resource, selector: &str) -> Result<Self, SelectorError> {
        let mut parts = split_terms(selector);
        parts.sort();
        let mut terms = Vec::new();
        for part in parts {
            if part.is_empty() {
                continue;
            }
            let Some((lhs, op, rhs)) = split_term(part) else {
                return Err(SelectorError::Field(format!(
                    "invalid selector: '{selector}'; can't understand '{part}'"
                )));
            };
            let value = unescape_value(rhs)?;
            terms.push(FieldTerm {
                field: lhs.to_string(),
                value,
                not_equal: op == "!=",
            });
        }
        for term in &mut terms {
            term.field = convert_field_label(res, &term.field)?;
        }
        Ok(FieldSelector { resource: *res, terms })
    }

    /// Whether the object satisfies every term. A field the object lacks reads as "".
    pub fn matches(&self, obj: &Value) -> bool {
        self.terms.iter().all(|t| {
            let have = field_value(&self.resource, obj, &t.field);
            (have == t.value) != t.not_equal
        })
    }

    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    pub fn terms(&self) -> &[FieldTerm] {
        &self.terms
    }

    /// The value an `=` term requires for this field, if any (e.g. `metadata.name` lets a
    /// list become a get).
    pub fn requires_exact_match(&self, field: &str) -> Option<&str> {
        self.terms
            .iter()
            .find(|t| t.field == field && !t.not_equal)
            .map(|t| t.value.as_str())
    }
}

impl fmt::Display for FieldSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, t) in self.terms.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            let escaped = t.value.replace('\\', "\\\\").replace(',', "\\,").replace('=', "\\=");
            write!(f, "{}{}{}", t.field, if t.not_equal { "!=" } else { "=" }, escaped)?;
        }
        Ok(())
    }
}

/// Splits on unescaped commas.
fn split_terms(selector: &str) -> Vec<&str> {
    if selector.is_empty() {
        return Vec::new();
    }
    let mut terms = Vec::new();
    let mut start = 0;
    let mut in_slash = false;
    for (i, c) in selector.char_indices() {
        if in_slash {
            in_slash = false;
        } else if c == '\\' {
            in_slash = true;
        } else if c == ',' {
            terms.push(&selector[start..i]);
            start = i + 1;
        }
    }
    terms.push(&selector[start..]);
    terms
}

/// Splits at the first operator, trying `!=`, `==`, `=` at each position.
fn split_term(term: &str) -> Option<(&str, &'static str, &str)> {
    for (i, _) in term.char_indices() {
        let rest = &term[i..];
        for op in ["!=", "==", "="] {
            if rest.starts_with(op) {
                return Some((&term[..i], op, &term[i + op.len()..]));
            }
        }
    }
    None
}

fn unescape_value(s: &str) -> Result<String, SelectorError> {
    if !s.contains(['\\', ',', '=']) {
        return Ok(s.to_string());
    }
    let mut out = String::with_capacity(s.len());
    let mut in_slash = false;
    for c in s.chars() {
        if in_slash {
            match c {
                '\\' | ',' | '=' => out.push(c),
                _ => {
                    return Err(SelectorError::Field(format!(
                        "invalid field selector: invalid escape sequence: \\{c}"
                    )));
                }
            }
            in_slash = false;
            continue;
        }
        match c {
            '\\' => in_slash = true,
            ',' | '=' => {
                return Err(SelectorError::Field(format!(
                    "invalid field selector: unescaped character in value: {}",
                    c as u32
                )));
            }
            _ => out.push(c),
        }
    }
    if in_slash {
        return Err(SelectorError::Field(
            "invalid field selector: invalid escape sequence: \\".to_string(),
        ));
    }
    Ok(out)
}

/// The fields each kind can be selected by, with upstream's conversion of the label; the
/// error is upstream's for the kind.
fn convert_field_label(res: &Resource, label: &str) -> Result<String, SelectorError> {
    let unsupported = || SelectorError::Field(format!("field label not supported: {label}"));
    let allowed: &[&str] = match (res.group, res.kind) {
        ("", "Pod") => {
            if label == "spec.host" {
                return Ok("spec.nodeName".to_string());
            }
            &[
                "metadata.name",
                "metadata.namespace",
                "spec.nodeName",
                "spec.restartPolicy",
                "spec.schedulerName",
                "spec.serviceAccountName",
                "spec.hostNetwork",
                "status.phase",
                "status.podIP",
                "status.podIPs",
                "status.nominatedNodeName",
            ]
        }
        ("", "Node") => &["metadata.name", "spec.unschedulable"],
        ("", "ReplicationController") => &["metadata.name", "metadata.namespace", "status.replicas"],
        ("", "Event") => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
            "metadata.namespace",
            "metadata.name",
        ],
        ("events.k8s.io", "Event") => {
            return match label {
                "reason" | "type" | "source" | "metadata.namespace" | "metadata.name" => Ok(label.to_string()),
                "reportingController" => Ok("reportingComponent".to_string()),
                l => match l.strip_prefix("regarding.") {
                    Some(
                        sub @ ("kind" | "namespace" | "name" | "uid" | "apiVersion" | "resourceVersion" | "fieldPath"),
                    ) => Ok(format!("involvedObject.{sub}")),
                    _ => Err(unsupported()),
                },
            };
        }
        ("", "Namespace") => &["status.phase", "metadata.name"],
        ("", "Secret") => &["type", "metadata.namespace", "metadata.name"],
        ("", "Service") => &["metadata.namespace", "metadata.name", "spec.clusterIP", "spec.type"],
        ("apps", "ReplicaSet") => &["metadata.name", "metadata.namespace", "status.replicas"],
        ("batch", "Job") => &["metadata.name", "metadata.namespace", "status.successful"],
        _ => {
            return match label {
                "metadata.name" | "metadata.namespace" => Ok(label.to_string()),
                _ => Err(SelectorError::Field(format!(
                    "{} is not a known field selector: only \"metadata.name\", \"metadata.namespace\"",
                    go_quote(label)
                ))),
            };
        }
    };
    if allowed.contains(&label) {
        Ok(label.to_string())
    } else {
        Err(unsupported())
    }
}

fn str_at<'a>(obj: &'a Value, pointer: &str) -> &'a str {
    obj.pointer(pointer).and_then(Value::as_str).unwrap_or_default()
}

fn int_at(obj: &Value, pointer: &str) -> String {
    obj.pointer(pointer).and_then(Value::as_i64).unwrap_or(0).to_string()
}

/// The value of a (converted) field label on an object, as upstream's `*ToSelectableFields`.
/// Fields the kind does not expose read as "".
pub fn field_value(res: &Resource, obj: &Value, field: &str) -> String {
    match field {
        "metadata.name" => return str_at(obj, "/metadata/name").to_string(),
        "metadata.namespace" => {
            return if res.namespaced {
                str_at(obj, "/metadata/namespace").to_string()
            } else {
                String::new()
            };
        }
        _ => {}
    }
    match (res.kind, field) {
        ("Pod", "spec.nodeName") => str_at(obj, "/spec/nodeName").to_string(),
        ("Pod", "spec.restartPolicy") => str_at(obj, "/spec/restartPolicy").to_string(),
        ("Pod", "spec.schedulerName") => str_at(obj, "/spec/schedulerName").to_string(),
        ("Pod", "spec.serviceAccountName") => str_at(obj, "/spec/serviceAccountName").to_string(),
        ("Pod", "spec.hostNetwork") => obj
            .pointer("/spec/hostNetwork")
            .and_then(Value::as_bool)
            .unwrap_or(false)
            .to_string(),
        ("Pod", "status.phase") => str_at(obj, "/status/phase").to_string(),
        ("Pod", "status.podIP") => {
            let first = str_at(obj, "/status/podIPs/0/ip");
            if first.is_empty() {
                str_at(obj, "/status/podIP").to_string()
            } else {
                first.to_string()
            }
        }
        ("Pod", "status.nominatedNodeName") => str_at(obj, "/status/nominatedNodeName").to_string(),
        ("Node", "spec.unschedulable") => obj
            .pointer("/spec/unschedulable")
            .and_then(Value::as_bool)
            .unwrap_or(false)
            .to_string(),
        ("Namespace", "status.phase") => str_at(obj, "/status/phase").to_string(),
        ("Secret", "type") => str_at(obj, "/type").to_string(),
        ("Service", "spec.clusterIP") => str_at(obj, "/spec/clusterIP").to_string(),
        ("Service", "spec.type") => str_at(obj, "/spec/type").to_string(),
        ("ReplicaSet" | "ReplicationController", "status.replicas") => int_at(obj, "/status/replicas"),
        ("Job", "status.successful") => int_at(obj, "/status/succeeded"),
        ("Event", f) => event_field(obj, f),
        _ => String::new(),
    }
}

/// Event fields, read from either shape (core/v1 `involvedObject`, events.k8s.io `regarding`).
fn event_field(obj: &Value, field: &str) -> String {
    let either = |a: &str, b: &str| {
        let v = str_at(obj, a);
        if v.is_empty() {
            str_at(obj, b).to_string()
        } else {
            v.to_string()
        }
    };
    if let Some(sub) = field.strip_prefix("involvedObject.") {
        return either(&format!("/involvedObject/{sub}"), &format!("/regarding/{sub}"));
    }
    match field {
        "reason" => str_at(obj, "/reason").to_string(),
        "type" => str_at(obj, "/type").to_string(),
        "reportingComponent" => str_at(obj, "/reportingController").to_string(),
        "source" => {
            let component = either("/source/component", "/deprecatedSource/component");
            if component.is_empty() {
                str_at(obj, "/reportingController").to_string()
            } else {
                component
            }
        }
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::{RESOURCES, lookup};
    use serde_json::json;

    fn labels(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => panic!("labels must be an object"),
        }
    }

    #[test]
    fn parses_every_operator() {
        let s = LabelSelector::parse("x=a,y==b,z!=c,w in (b,a),v notin (d),u,!t,n>3,m<9").unwrap();
        assert_eq!(s.to_string(), "m<9,n>3,!t,u,v notin (d),w in (a,b),x=a,y==b,z!=c");
        let l = labels(json!({"x":"a","y":"b","z":"q","w":"b","v":"e","u":"","n":"4","m":"1"}));
        assert!(s.matches(&l));
        let mut l2 = l.clone();
        l2.insert("t".into(), json!("1"));
        assert!(!s.matches(&l2));
        let mut l3 = l.clone();
        l3.insert("n".into(), json!("3"));
        assert!(!s.matches(&l3));
    }

    #[test]
    fn matching_semantics() {
        let sel = |s: &str| LabelSelector::parse(s).unwrap();
        let l = labels(json!({"app":"web","tier":"front"}));
        assert!(sel("app=web").matches(&l));
        assert!(!sel("app=db").matches(&l));
        assert!(sel("env!=prod").matches(&l), "missing label satisfies !=");
        assert!(sel("env notin (prod)").matches(&l));
        assert!(!sel("env in (prod)").matches(&l));
        assert!(sel("app in (db, web)").matches(&l));
        assert!(sel("!env").matches(&l));
        assert!(!sel("!app").matches(&l));
        assert!(sel("tier").matches(&l));
        assert!(sel("").matches(&l));
        assert!(sel("").is_empty());
        assert!(sel("  app = web , tier=front ").matches(&l));
        // `in` and `notin` can be keys and values.
        let l = labels(json!({"in":"notin"}));
        assert!(sel("in=notin").matches(&l));
        // Empty value.
        let l = labels(json!({"a":""}));
        assert!(sel("a=").matches(&l));
        assert!(sel("a in (,x)").matches(&l));
        assert!(sel("a in ()").matches(&l));
    }

    #[test]
    fn upstream_error_messages() {
        let err = |s: &str| LabelSelector::parse(s).unwrap_err().to_string();
        assert_eq!(err("a=b c"), "found 'c', expected: ',' or 'end of string'");
        assert_eq!(err("a,"), "found '', expected: identifier after ','");
        assert_eq!(err("=a"), "found '=', expected: !, identifier, or 'end of string'");
        assert_eq!(
            err("a b"),
            "unable to parse requirement: found 'b', expected: in, notin, =, ==, !=, gt, lt"
        );
        assert_eq!(err("a in b"), "unable to parse requirement: found 'b' expected: '('");
        assert_eq!(
            err("a in (b c)"),
            "unable to parse requirement: found 'c', expected: ',' or ')'"
        );
        assert_eq!(
            err("a=("),
            "unable to parse requirement: found '(', expected: identifier"
        );
        assert_eq!(
            err("a=b$"),
            "unable to parse requirement: values[0][a]: Invalid value: \"b$\": a valid label must be an \
             empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end \
             with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for \
             validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
        );
        assert_eq!(
            err("-a=b"),
            "unable to parse requirement: <nil>: Invalid value: \"-a\": name part must consist of \
             alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric \
             character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is \
             '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
        );
        assert!(err("Example.com/x=y").contains("prefix part a lowercase RFC 1123 subdomain"));
        assert!(err("n>x").contains("for 'Gt', 'Lt' operators, the value must be an integer"));
        assert!(LabelSelector::parse("example.com/app=web,kubernetes.io/os").is_ok());
    }

    #[test]
    fn from_label_selector_objects() {
        let s = LabelSelector::from_label_selector_json(&json!({
            "matchLabels": {"app": "web"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["front", "back"]},
                {"key": "canary", "operator": "DoesNotExist"},
                {"key": "env", "operator": "NotIn", "values": ["prod"]},
                {"key": "zone", "operator": "Exists"}
            ]
        }))
        .unwrap();
        assert_eq!(
            s.to_string(),
            "app=web,!canary,env notin (prod),tier in (back,front),zone"
        );
        let obj = json!({"metadata":{"labels":{"app":"web","tier":"back","zone":"a"}}});
        assert!(s.matches_object(&obj));
        let obj = json!({"metadata":{"labels":{"app":"web","tier":"back"}}});
        assert!(!s.matches_object(&obj));

        let everything = LabelSelector::from_label_selector_json(&json!({})).unwrap();
        assert!(everything.is_empty());
        assert!(everything.matches_object(&json!({"metadata":{}})));
        let nothing = LabelSelector::from_label_selector_json(&Value::Null).unwrap();
        assert!(!nothing.is_empty());
        assert!(!nothing.matches(&Map::new()));

        let bad = LabelSelector::from_label_selector_json(&json!({
            "matchExpressions": [{"key": "a", "operator": "Foo"}]
        }));
        assert_eq!(
            bad.unwrap_err().to_string(),
            "\"Foo\" is not a valid label selector operator"
        );
        let bad = LabelSelector::from_label_selector_json(&json!({
            "matchExpressions": [{"key": "a", "operator": "In", "values": []}]
        }));
        assert_eq!(
            bad.unwrap_err().to_string(),
            "values: Invalid value: []string{}: for 'in', 'notin' operators, values set can't be empty"
        );

        let typed = k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
            match_labels: Some(BTreeMap::from([("app".to_string(), "web".to_string())])),
            match_expressions: None,
        };
        let s = LabelSelector::from_k8s(Some(&typed)).unwrap();
        assert_eq!(s.to_string(), "app=web");
        let present: Option<BTreeMap<String, String>> = Some(BTreeMap::from([("app".into(), "web".into())]));
        assert!(s.matches(&present));
        assert!(!s.matches(&None::<BTreeMap<String, String>>));
        assert!(LabelSelector::from_k8s(None).unwrap().is_nothing());

        let mut m = BTreeMap::new();
        m.insert("app".to_string(), "web".to_string());
        let s = LabelSelector::from_map(&m);
        assert_eq!(s.to_string(), "app=web");
        assert!(s.matches(&m));
    }

    fn res(group: &str, plural: &str) -> &'static Resource {
        lookup(group, "v1", plural).unwrap()
    }

    #[test]
    fn field_selectors_for_pods() {
        let pods = res("", "pods");
        let pod = json!({
            "metadata": {"name": "p1", "namespace": "default"},
            "spec": {"nodeName": "n1", "restartPolicy": "Always", "schedulerName": "default-scheduler"},
            "status": {"phase": "Running", "podIPs": [{"ip": "10.0.0.5"}]}
        });
        let m = |s: &str| FieldSelector::parse(pods, s).unwrap().matches(&pod);
        assert!(m("spec.nodeName=n1"));
        assert!(m("spec.nodeName==n1"));
        assert!(!m("spec.nodeName="));
        assert!(m("status.phase!=Succeeded,status.phase!=Failed"));
        assert!(m("metadata.name=p1,metadata.namespace=default"));
        assert!(!m("metadata.namespace!=default"));
        assert!(m("spec.hostNetwork=false"));
        assert!(m("status.podIP=10.0.0.5"));
        assert!(m("spec.host=n1"));
        assert!(m(""));
        let unscheduled = json!({"metadata": {"name": "p2"}, "spec": {}});
        assert!(
            FieldSelector::parse(pods, "spec.nodeName=")
                .unwrap()
                .matches(&unscheduled)
        );
        assert_eq!(
            FieldSelector::parse(pods, "spec.foo=bar").unwrap_err().to_string(),
            "field label not supported: spec.foo"
        );
        assert_eq!(
            FieldSelector::parse(pods, "spec.nodeName").unwrap_err().to_string(),
            "invalid selector: 'spec.nodeName'; can't understand 'spec.nodeName'"
        );
        let s = FieldSelector::parse(pods, "metadata.name=p1").unwrap();
        assert_eq!(s.requires_exact_match("metadata.name"), Some("p1"));
    }

    #[test]
    fn field_selectors_for_events_and_others() {
        let events = res("", "events");
        let ev = json!({
            "metadata": {"name": "e1", "namespace": "default"},
            "involvedObject": {"kind": "Pod", "name": "p1", "namespace": "default", "uid": "u-1"},
            "reason": "Scheduled", "type": "Normal", "source": {"component": "default-scheduler"}
        });
        let s = FieldSelector::parse(
            events,
            "involvedObject.name=p1,involvedObject.namespace=default,involvedObject.kind=Pod,involvedObject.uid=u-1",
        )
        .unwrap();
        assert!(s.matches(&ev));
        assert!(
            !FieldSelector::parse(events, "involvedObject.uid=u-2")
                .unwrap()
                .matches(&ev)
        );
        assert!(
            FieldSelector::parse(events, "source=default-scheduler,type=Normal")
                .unwrap()
                .matches(&ev)
        );

        let new_events = lookup("events.k8s.io", "v1", "events").unwrap();
        let ev2 = json!({"metadata": {"name": "e2"}, "regarding": {"kind": "Node", "name": "n1"},
                         "reportingController": "kubelet"});
        assert!(
            FieldSelector::parse(new_events, "regarding.name=n1,reportingController=kubelet")
                .unwrap()
                .matches(&ev2)
        );
        assert!(FieldSelector::parse(new_events, "involvedObject.name=n1").is_err());
        assert!(
            FieldSelector::parse(new_events, "source=kubelet")
                .unwrap()
                .matches(&ev2)
        );

        let secrets = res("", "secrets");
        let secret = json!({"metadata": {"name": "s"}, "type": "Opaque"});
        assert!(FieldSelector::parse(secrets, "type=Opaque").unwrap().matches(&secret));

        let nodes = res("", "nodes");
        let node = json!({"metadata": {"name": "n1"}, "spec": {"unschedulable": true}});
        assert!(
            FieldSelector::parse(nodes, "spec.unschedulable=true")
                .unwrap()
                .matches(&node)
        );
        assert!(FieldSelector::parse(nodes, "metadata.namespace=x").is_err());

        let cms = res("", "configmaps");
        assert_eq!(
            FieldSelector::parse(cms, "data.x=1").unwrap_err().to_string(),
            "\"data.x\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
        );
        let jobs = lookup("batch", "v1", "jobs").unwrap();
        let job = json!({"metadata": {"name": "j"}, "status": {"succeeded": 2}});
        assert!(FieldSelector::parse(jobs, "status.successful=2").unwrap().matches(&job));

        // Every resource accepts metadata.name.
        for r in RESOURCES {
            assert!(FieldSelector::parse(r, "metadata.name=x").is_ok(), "{}", r.plural);
        }
    }

    #[test]
    fn field_selector_escaping() {
        let cms = res("", "configmaps");
        let obj = json!({"metadata": {"name": "a,b=c"}});
        assert!(
            FieldSelector::parse(cms, r"metadata.name=a\,b\=c")
                .unwrap()
                .matches(&obj)
        );
        assert_eq!(
            FieldSelector::parse(cms, r"metadata.name=a\x").unwrap_err().to_string(),
            "invalid field selector: invalid escape sequence: \\x"
        );
        assert_eq!(
            FieldSelector::parse(cms, "metadata.name=a=b").unwrap_err().to_string(),
            "invalid field selector: unescaped character in value: 61"
        );
    }
}
