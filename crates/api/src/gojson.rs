//! JSON syntax errors in the words of Go's `encoding/json` scanner, which upstream's decoders
//! run before anything else: `invalid character 'a' looking for beginning of value`,
//! `unexpected end of JSON input`. Clients print these texts as the API server gives them.

use std::borrow::Cow;

/// Go's syntax error for `data`, or `None` when `data` is one valid JSON value.
pub fn syntax_error(data: &[u8]) -> Option<String> {
    let mut s = Scanner { data, pos: 0 };
    match s.document() {
        Ok(()) => None,
        Err(Stop::Eof) => Some("unexpected end of JSON input".into()),
        Err(Stop::Invalid(c, context)) => Some(format!("invalid character {} {context}", quote_char(c))),
    }
}

enum Stop {
    Eof,
    Invalid(u8, Cow<'static, str>),
}

/// A stop at the unexpected byte `c`, with what the scanner was doing.
fn invalid(c: u8, context: impl Into<Cow<'static, str>>) -> Stop {
    Stop::Invalid(c, context.into())
}

/// Go's scanner refuses deeper nesting.
const MAX_DEPTH: usize = 10_000;

struct Scanner<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Scanner<'_> {
    fn peek(&self) -> Result<u8, Stop> {
        self.data.get(self.pos).copied().ok_or(Stop::Eof)
    }

    fn next(&mut self) -> Result<u8, Stop> {
        let c = self.peek()?;
        self.pos += 1;
        Ok(c)
    }

    fn skip_space(&mut self) {
        while matches!(self.data.get(self.pos), Some(b' ' | b'\t' | b'\r' | b'\n')) {
            self.pos += 1;
        }
    }

    /// Go's scanner is a state machine with a stack of open containers, not a recursion:
    /// so is this one, so no nesting depth reaches the thread's stack.
    fn document(&mut self) -> Result<(), Stop> {
        let mut open: Vec<u8> = Vec::new();
        'value: loop {
            // The beginning of a value.
            self.skip_space();
            match self.next()? {
                b'{' => {
                    self.skip_space();
                    if self.peek()? != b'}' {
                        open.push(b'{');
                        if open.len() > MAX_DEPTH {
                            return Err(invalid(b'{', "exceeded max depth"));
                        }
                        self.object_key()?;
                        continue 'value;
                    }
                    self.pos += 1;
                }
                b'[' => {
                    self.skip_space();
                    if self.peek()? != b']' {
                        open.push(b'[');
                        if open.len() > MAX_DEPTH {
                            return Err(invalid(b'[', "exceeded max depth"));
                        }
                        continue 'value;
                    }
                    self.pos += 1;
                }
                b'"' => self.string()?,
                b'-' => self.number(true)?,
                b'0'..=b'9' => {
                    self.pos -= 1;
                    self.number(false)?;
                }
                b't' => self.literal(b"rue", "in literal true (expecting ")?,
                b'f' => self.literal(b"alse", "in literal false (expecting ")?,
                b'n' => self.literal(b"ull", "in literal null (expecting ")?,
                c => return Err(invalid(c, "looking for beginning of value")),
            }
            // The end of a value: close what it ends, or go on to the next.
            loop {
                self.skip_space();
                let Some(&container) = open.last() else {
                    return match self.data.get(self.pos) {
                        None => Ok(()),
                        Some(&c) => Err(invalid(c, "after top-level value")),
                    };
                };
                match (container, self.next()?) {
                    (b'{', b',') => {
                        self.object_key()?;
                        continue 'value;
                    }
                    (b'[', b',') => continue 'value,
                    (b'{', b'}') | (b'[', b']') => {
                        open.pop();
                    }
                    (b'{', c) => return Err(invalid(c, "after object key:value pair")),
                    (_, c) => return Err(invalid(c, "after array element")),
                }
            }
        }
    }

    /// An object's key and its colon.
    fn object_key(&mut self) -> Result<(), Stop> {
        self.skip_space();
        match self.next()? {
            b'"' => self.string()?,
            c => return Err(invalid(c, "looking for beginning of object key string")),
        }
        self.skip_space();
        match self.next()? {
            b':' => Ok(()),
            c => Err(invalid(c, "after object key")),
        }
    }

    fn literal(&mut self, rest: &[u8], context: &'static str) -> Result<(), Stop> {
        for &want in rest {
            let c = self.next()?;
            if c != want {
                return Err(invalid(c, expecting(context, want)));
            }
        }
        Ok(())
    }

    fn string(&mut self) -> Result<(), Stop> {
        loop {
            match self.next()? {
                b'"' => return Ok(()),
                b'\\' => match self.next()? {
                    b'b' | b'f' | b'n' | b'r' | b't' | b'\\' | b'/' | b'"' => {}
                    b'u' => {
                        for _ in 0..4 {
                            let c = self.next()?;
                            if !c.is_ascii_hexdigit() {
                                return Err(invalid(c, "in \\u hexadecimal character escape"));
                            }
                        }
                    }
                    c => return Err(invalid(c, "in string escape code")),
                },
                c if c < 0x20 => return Err(invalid(c, "in string literal")),
                _ => {}
            }
        }
    }

    /// A number; a character that cannot follow one is left for the caller to judge.
    fn number(&mut self, negative: bool) -> Result<(), Stop> {
        let first = self.next()?;
        match first {
            b'0' => {}
            b'1'..=b'9' => self.digits(),
            c if negative => return Err(invalid(c, "in numeric literal")),
            c => return Err(invalid(c, "looking for beginning of value")),
        }
        if self.data.get(self.pos) == Some(&b'.') {
            self.pos += 1;
            let c = self.next()?;
            if !c.is_ascii_digit() {
                return Err(invalid(c, "after decimal point in numeric literal"));
            }
            self.digits();
        }
        if matches!(self.data.get(self.pos), Some(b'e' | b'E')) {
            self.pos += 1;
            let mut c = self.next()?;
            if c == b'+' || c == b'-' {
                c = self.next()?;
            }
            if !c.is_ascii_digit() {
                return Err(invalid(c, "in exponent of numeric literal"));
            }
            self.digits();
        }
        Ok(())
    }

    fn digits(&mut self) {
        while self.data.get(self.pos).is_some_and(u8::is_ascii_digit) {
            self.pos += 1;
        }
    }
}

/// "in literal true (expecting 'r')".
fn expecting(context: &str, want: u8) -> String {
    format!("{context}{})", quote_char(want))
}

/// Go's `quoteChar`: `'x'`, `'\''`, `'"'`, or the byte escaped as `strconv.Quote` does.
fn quote_char(c: u8) -> String {
    match c {
        b'\'' => r"'\''".into(),
        b'"' => "'\"'".into(),
        b'\n' => r"'\n'".into(),
        b'\r' => r"'\r'".into(),
        b'\t' => r"'\t'".into(),
        0x07 => r"'\a'".into(),
        0x08 => r"'\b'".into(),
        0x0c => r"'\f'".into(),
        0x0b => r"'\v'".into(),
        c if c.is_ascii_graphic() || c == b' ' => format!("'{}'", c as char),
        c if c < 0x80 => format!("'\\x{c:02x}'"),
        // A byte of a multi-byte UTF-8 character: Go quotes the replacement rune.
        _ => "'\u{fffd}'".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_in_gos_words() {
        let cases: &[(&str, Option<&str>)] = &[
            (r#"{"a": [1, 2.5e-3, true, null, "x\u00e9"]}"#, None),
            (
                "apiVersion: v1\n",
                Some("invalid character 'a' looking for beginning of value"),
            ),
            ("", Some("unexpected end of JSON input")),
            (r#"{"a": 1"#, Some("unexpected end of JSON input")),
            (r#"{"a" 1}"#, Some("invalid character '1' after object key")),
            (
                r#"{"a": 1 "b": 2}"#,
                Some("invalid character '\"' after object key:value pair"),
            ),
            (
                r#"{a: 1}"#,
                Some("invalid character 'a' looking for beginning of object key string"),
            ),
            ("[1 2]", Some("invalid character '2' after array element")),
            ("[1,]", Some("invalid character ']' looking for beginning of value")),
            ("{\"a\": \"x\ny\"}", Some(r"invalid character '\n' in string literal")),
            (r#"{"a": "\q"}"#, Some("invalid character 'q' in string escape code")),
            (
                r#"{"a": "\u12g4"}"#,
                Some(r"invalid character 'g' in \u hexadecimal character escape"),
            ),
            ("-x", Some("invalid character 'x' in numeric literal")),
            (
                "1.x",
                Some("invalid character 'x' after decimal point in numeric literal"),
            ),
            ("1ex", Some("invalid character 'x' in exponent of numeric literal")),
            ("01", Some("invalid character '1' after top-level value")),
            ("{} {}", Some("invalid character '{' after top-level value")),
            ("trux", Some("invalid character 'x' in literal true (expecting 'e')")),
            ("nul", Some("unexpected end of JSON input")),
            ("'a'", Some(r"invalid character '\'' looking for beginning of value")),
            ("[[[{}]]]", None),
        ];
        for (input, want) in cases {
            assert_eq!(syntax_error(input.as_bytes()).as_deref(), *want, "{input:?}");
        }
        let deep = "[".repeat(3_000_000);
        assert_eq!(
            syntax_error(deep.as_bytes()).as_deref(),
            Some("invalid character '[' exceeded max depth")
        );
    }
}
