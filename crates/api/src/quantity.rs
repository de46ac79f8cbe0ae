//! Resource quantities (`100m`, `1.5`, `2Gi`, `500M`, `1e3`) as upstream's `resource.Quantity`:
//! exact integer arithmetic at nano precision, ordering by value, and the canonical string form
//! that `Quantity.String()` prints (`1000m` prints as `1`, `1536Mi` stays `1536Mi`).

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

/// The regular expression upstream cites when a quantity does not parse.
pub const QUANTITY_REGEX: &str = "^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$";

const NANOS_PER_UNIT: i128 = 1_000_000_000;

/// Why a string is not a quantity; the messages are upstream's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("quantities must match the regular expression '{QUANTITY_REGEX}'")]
    FormatWrong,
    #[error("unable to parse numeric part of quantity")]
    Numeric,
    #[error("unable to parse quantity's suffix")]
    Suffix,
}

/// How a quantity was written, which decides how it prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    /// `1e3`, `5e-3`.
    DecimalExponent,
    /// `1Ki`, `2Gi`.
    BinarySI,
    /// `100m`, `5`, `1k`, `500M`.
    DecimalSI,
}

/// A resource quantity, held exactly in units of 10^-9.
#[derive(Clone, Copy, Debug)]
pub struct Quantity {
    nanos: i128,
    format: Format,
}

impl Default for Quantity {
    fn default() -> Self {
        Quantity {
            nanos: 0,
            format: Format::DecimalSI,
        }
    }
}

impl PartialEq for Quantity {
    fn eq(&self, other: &Self) -> bool {
        self.nanos == other.nanos
    }
}

impl Eq for Quantity {}

impl Hash for Quantity {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.nanos.hash(state);
    }
}

impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Quantity {
    fn cmp(&self, other: &Self) -> Ordering {
        self.nanos.cmp(&other.nanos)
    }
}

/// `(base, exponent, format)` for a suffix, as upstream's suffixer interprets it.
fn interpret_suffix(suffix: &str) -> Option<(u32, i32, Format)> {
    let dec = |e| Some((10, e, Format::DecimalSI));
    let bin = |e| Some((2, e, Format::BinarySI));
    match suffix {
        "" => dec(0),
        "n" => dec(-9),
        "u" => dec(-6),
        "m" => dec(-3),
        "k" => dec(3),
        "M" => dec(6),
        "G" => dec(9),
        "T" => dec(12),
        "P" => dec(15),
        "E" => dec(18),
        "Ki" => bin(10),
        "Mi" => bin(20),
        "Gi" => bin(30),
        "Ti" => bin(40),
        "Pi" => bin(50),
        "Ei" => bin(60),
        _ => {
            let rest = suffix.strip_prefix(['e', 'E'])?;
            let (neg, digits) = match rest.as_bytes().first() {
                Some(b'-') => (true, &rest[1..]),
                Some(b'+') => (false, &rest[1..]),
                _ => (false, rest),
            };
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let e: i32 = digits.parse().ok()?;
            Some((10, if neg { -e } else { e }, Format::DecimalExponent))
        }
    }
}

/// Split `[+-]digits[.digits]suffix` as upstream's `parseQuantityString` does.
fn split(s: &str) -> Result<(bool, &str, &str, &str), QuantityError> {
    let b = s.as_bytes();
    let mut pos = 0;
    let mut positive = true;
    match b.first() {
        Some(b'-') => {
            positive = false;
            pos = 1;
        }
        Some(b'+') => pos = 1,
        _ => {}
    }
    let num_start = pos;
    while pos < b.len() && b[pos].is_ascii_digit() {
        pos += 1;
    }
    let num = &s[num_start..pos];
    let mut denom = "";
    if pos < b.len() && b[pos] == b'.' {
        pos += 1;
        let d_start = pos;
        while pos < b.len() && b[pos].is_ascii_digit() {
            pos += 1;
        }
        denom = &s[d_start..pos];
    }
    if num.is_empty() && denom.is_empty() {
        return Err(QuantityError::FormatWrong);
    }
    let suffix_start = pos;
    while pos < b.len() && b"eEinumkKMGTP".contains(&b[pos]) {
        pos += 1;
    }
    if pos < b.len() && (b[pos] == b'-' || b[pos] == b'+') {
        pos += 1;
    }
    while pos < b.len() && b[pos].is_ascii_digit() {
        pos += 1;
    }
    if pos != b.len() {
        return Err(QuantityError::FormatWrong);
    }
    Ok((positive, num, denom, &s[suffix_start..]))
}

fn pow10(e: u32) -> Option<i128> {
    10i128.checked_pow(e)
}

impl Quantity {
    /// Parse a quantity as upstream's `resource.ParseQuantity` does: values finer than 1n are
    /// rounded up to 1n, binary quantities are capped at 2^63-1.
    pub fn parse(s: &str) -> Result<Quantity, QuantityError> {
        if s.is_empty() {
            return Err(QuantityError::FormatWrong);
        }
        let (positive, num, denom, suffix) = split(s)?;
        let (base, exponent, mut format) = interpret_suffix(suffix).ok_or(QuantityError::Suffix)?;

        // The digits as one integer, leading zeros ignored.
        let mut mantissa: i128 = 0;
        for d in num.bytes().chain(denom.bytes()) {
            mantissa = mantissa
                .checked_mul(10)
                .and_then(|m| m.checked_add(i128::from(d - b'0')))
                .ok_or(QuantityError::Numeric)?;
        }
        let denom_len = i32::try_from(denom.len()).map_err(|_| QuantityError::Numeric)?;

        // nanos = mantissa * 10^(dec_exp) * 2^(bin_exp), rounded up away from zero.
        let (dec_exp, bin_exp) = if base == 10 {
            (exponent - denom_len + 9, 0)
        } else {
            (9 - denom_len, exponent)
        };
        let mut value = mantissa;
        if bin_exp > 0 {
            let m = 1i128.checked_shl(bin_exp as u32).ok_or(QuantityError::Numeric)?;
            value = value.checked_mul(m).ok_or(QuantityError::Numeric)?;
        }
        let nanos = if dec_exp >= 0 {
            let p = pow10(dec_exp as u32).ok_or(QuantityError::Numeric)?;
            value.checked_mul(p).ok_or(QuantityError::Numeric)?
        } else {
            match pow10(dec_exp.unsigned_abs()) {
                Some(p) => {
                    let q = value / p;
                    if value % p != 0 { q + 1 } else { q }
                }
                // Smaller than any representable amount: rounds up to the minimum.
                None => i128::from(value != 0),
            }
        };
        let mut nanos = nanos;
        if format == Format::BinarySI {
            let max = i128::from(i64::MAX) * NANOS_PER_UNIT;
            if nanos > max {
                nanos = max;
            }
            if nanos > 0 && nanos < NANOS_PER_UNIT {
                format = Format::DecimalSI;
            }
        }
        // Keep the value in a range where sums and canonical forms cannot overflow.
        if nanos > i128::MAX / 1000 {
            return Err(QuantityError::Numeric);
        }
        if !positive {
            nanos = -nanos;
        }
        Ok(Quantity { nanos, format })
    }

    /// A quantity from a JSON value: a string, or a number (`cpu: 1` in YAML arrives as a number).
    pub fn from_json(v: &Value) -> Result<Quantity, QuantityError> {
        match v {
            Value::String(s) => Quantity::parse(s),
            Value::Number(n) => Quantity::parse(&n.to_string()),
            _ => Err(QuantityError::FormatWrong),
        }
    }

    /// `value` whole units in the given format.
    pub fn new(value: i64, format: Format) -> Quantity {
        Quantity {
            nanos: i128::from(value) * NANOS_PER_UNIT,
            format,
        }
    }

    /// `milli` thousandths of a unit, printed in decimal SI.
    pub fn from_milli(milli: i64) -> Quantity {
        Quantity {
            nanos: i128::from(milli) * 1_000_000,
            format: Format::DecimalSI,
        }
    }

    pub fn format(&self) -> Format {
        self.format
    }

    pub fn is_zero(&self) -> bool {
        self.nanos == 0
    }

    pub fn is_negative(&self) -> bool {
        self.nanos < 0
    }

    /// The exact amount in units of 10^-9.
    pub fn nano_value(&self) -> i128 {
        self.nanos
    }

    /// The amount in thousandths, rounded away from zero (upstream's `MilliValue`), saturating
    /// at i64 bounds.
    pub fn milli_value(&self) -> i64 {
        saturate(div_away_from_zero(self.nanos, 1_000_000))
    }

    /// The amount in whole units, rounded away from zero (upstream's `Value`), saturating at
    /// i64 bounds.
    pub fn value(&self) -> i64 {
        saturate(div_away_from_zero(self.nanos, NANOS_PER_UNIT))
    }

    /// An approximation for scoring; never use it for comparisons.
    pub fn as_f64(&self) -> f64 {
        self.nanos as f64 / NANOS_PER_UNIT as f64
    }

    /// The sum; the format is this quantity's, or the other's when this one is zero.
    pub fn checked_add(&self, other: &Quantity) -> Option<Quantity> {
        let format = if self.is_zero() { other.format } else { self.format };
        Some(Quantity {
            nanos: self.nanos.checked_add(other.nanos)?,
            format,
        })
    }

    pub fn checked_sub(&self, other: &Quantity) -> Option<Quantity> {
        let format = if self.is_zero() { other.format } else { self.format };
        Some(Quantity {
            nanos: self.nanos.checked_sub(other.nanos)?,
            format,
        })
    }

    /// The canonical form, as upstream's `Quantity.String()`.
    pub fn canonical(&self) -> String {
        if self.nanos == 0 {
            return "0".to_string();
        }
        let mut format = self.format;
        if format == Format::BinarySI {
            let small = self.nanos > -1024 * NANOS_PER_UNIT && self.nanos < 1024 * NANOS_PER_UNIT;
            if small || self.nanos % NANOS_PER_UNIT != 0 {
                format = Format::DecimalSI;
            }
        }
        match format {
            Format::BinarySI => {
                let mut units = self.nanos / NANOS_PER_UNIT;
                let mut exp = 0usize;
                while units % 1024 == 0 && exp < 6 {
                    units /= 1024;
                    exp += 1;
                }
                const SUFFIXES: [&str; 7] = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
                format!("{units}{}", SUFFIXES[exp])
            }
            Format::DecimalSI | Format::DecimalExponent => {
                let mut mantissa = self.nanos;
                let mut exp: i32 = -9;
                while mantissa % 10 == 0 {
                    mantissa /= 10;
                    exp += 1;
                }
                match exp.rem_euclid(3) {
                    1 => {
                        mantissa *= 10;
                        exp -= 1;
                    }
                    2 => {
                        mantissa *= 100;
                        exp -= 2;
                    }
                    _ => {}
                }
                if format == Format::DecimalExponent {
                    if exp == 0 {
                        return mantissa.to_string();
                    }
                    return format!("{mantissa}e{exp}");
                }
                while exp > 18 {
                    mantissa *= 1000;
                    exp -= 3;
                }
                let suffix = match exp {
                    -9 => "n",
                    -6 => "u",
                    -3 => "m",
                    3 => "k",
                    6 => "M",
                    9 => "G",
                    12 => "T",
                    15 => "P",
                    18 => "E",
                    _ => "",
                };
                format!("{mantissa}{suffix}")
            }
        }
    }
}

/// Division rounding away from zero, as upstream's scaled values round.
fn div_away_from_zero(n: i128, d: i128) -> i128 {
    let q = n / d;
    match (n % d).signum() {
        1 => q + 1,
        -1 => q - 1,
        _ => q,
    }
}

fn saturate(v: i128) -> i64 {
    i64::try_from(v).unwrap_or(if v < 0 { i64::MIN } else { i64::MAX })
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.canonical())
    }
}

impl std::str::FromStr for Quantity {
    type Err = QuantityError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Quantity::parse(s)
    }
}

impl std::ops::Add for Quantity {
    type Output = Quantity;
    /// Saturating sum.
    fn add(self, rhs: Quantity) -> Quantity {
        self.checked_add(&rhs).unwrap_or(Quantity {
            nanos: if rhs.nanos < 0 { i128::MIN } else { i128::MAX },
            format: self.format,
        })
    }
}

impl std::ops::AddAssign for Quantity {
    fn add_assign(&mut self, rhs: Quantity) {
        *self = *self + rhs;
    }
}

impl std::ops::Sub for Quantity {
    type Output = Quantity;
    /// Saturating difference.
    fn sub(self, rhs: Quantity) -> Quantity {
        self.checked_sub(&rhs).unwrap_or(Quantity {
            nanos: if rhs.nanos > 0 { i128::MIN } else { i128::MAX },
            format: self.format,
        })
    }
}

impl std::ops::SubAssign for Quantity {
    fn sub_assign(&mut self, rhs: Quantity) {
        *self = *self - rhs;
    }
}

impl std::iter::Sum for Quantity {
    fn sum<I: Iterator<Item = Quantity>>(iter: I) -> Quantity {
        iter.fold(Quantity::default(), |a, b| a + b)
    }
}

impl Serialize for Quantity {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.canonical())
    }
}

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        Quantity::from_json(&v).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        Quantity::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn canonical_forms_match_upstream() {
        let cases = [
            ("0", "0"),
            ("0m", "0"),
            ("100m", "100m"),
            ("1000m", "1"),
            ("1500m", "1500m"),
            ("1", "1"),
            ("1.5", "1500m"),
            ("0.1", "100m"),
            ("2Gi", "2Gi"),
            ("1024Mi", "1Gi"),
            ("1536Mi", "1536Mi"),
            ("1.5Gi", "1536Mi"),
            ("1.5Ki", "1536"),
            ("500Mi", "500Mi"),
            ("512", "512"),
            ("0.5Ki", "512"),
            ("500M", "500M"),
            ("1000k", "1M"),
            ("1e3", "1e3"),
            ("1.5e3", "1500"),
            ("1e-3", "1e-3"),
            ("1E", "1E"),
            ("128974848", "128974848"),
            ("129e6", "129e6"),
            ("123Mi", "123Mi"),
            ("-1", "-1"),
            ("-100m", "-100m"),
            ("+5", "5"),
            ("1n", "1n"),
            ("1u", "1u"),
            ("0.5n", "1n"),
            ("1k", "1k"),
            ("10", "10"),
            ("100", "100"),
            ("1000", "1k"),
            (".5", "500m"),
            ("5.", "5"),
            ("007", "7"),
        ];
        for (input, want) in cases {
            assert_eq!(q(input).to_string(), want, "canonical of {input}");
        }
    }

    #[test]
    fn values_round_up() {
        assert_eq!(q("100m").milli_value(), 100);
        assert_eq!(q("100m").value(), 1);
        assert_eq!(q("1.5").value(), 2);
        assert_eq!(q("2Gi").value(), 2 * 1024 * 1024 * 1024);
        assert_eq!(q("2Gi").milli_value(), 2 * 1024 * 1024 * 1024 * 1000);
        assert_eq!(q("1u").milli_value(), 1);
        assert_eq!(q("-1500m").value(), -2);
        assert_eq!(q("-1n").milli_value(), -1);
        assert_eq!(q("1e3").value(), 1000);
        assert_eq!(q("500M").value(), 500_000_000);
        assert_eq!(q("8Ei").value(), i64::MAX);
    }

    #[test]
    fn ordering_and_equality_by_value() {
        assert_eq!(q("1"), q("1000m"));
        assert_eq!(q("1Ki"), q("1024"));
        assert!(q("2") > q("1"));
        assert!(q("999m") < q("1"));
        assert!(q("1Gi") > q("1G"));
        assert!(q("-1") < q("0"));
        assert_eq!(q("1").cmp(&q("1e0")), Ordering::Equal);
    }

    #[test]
    fn arithmetic() {
        assert_eq!((q("100m") + q("900m")).to_string(), "1");
        assert_eq!((q("1Gi") + q("1Gi")).to_string(), "2Gi");
        assert_eq!((q("1") - q("250m")).to_string(), "750m");
        let total: Quantity = ["100m", "200m", "1"].iter().map(|s| q(s)).sum();
        assert_eq!(total.milli_value(), 1300);
        assert_eq!((Quantity::default() + q("1Mi")).to_string(), "1Mi");
        let mut a = q("1");
        a += q("1");
        a -= q("500m");
        assert_eq!(a.milli_value(), 1500);
    }

    #[test]
    fn errors() {
        assert_eq!(Quantity::parse(""), Err(QuantityError::FormatWrong));
        assert_eq!(Quantity::parse("abc"), Err(QuantityError::FormatWrong));
        assert_eq!(Quantity::parse("1 "), Err(QuantityError::FormatWrong));
        assert_eq!(Quantity::parse("1.2.3"), Err(QuantityError::FormatWrong));
        assert_eq!(Quantity::parse("1Kb"), Err(QuantityError::FormatWrong));
        assert_eq!(Quantity::parse("1K"), Err(QuantityError::Suffix));
        assert_eq!(Quantity::parse("1mi"), Err(QuantityError::Suffix));
        assert_eq!(Quantity::parse("1e"), Err(QuantityError::Suffix));
        assert_eq!(Quantity::parse("."), Err(QuantityError::FormatWrong));
        assert!(Quantity::parse("99999999999999999999999999999999999999999999").is_err());
        assert!(Quantity::parse("1e99999").is_err());
        assert_eq!(
            Quantity::parse("0.0000000000000000000000000000000000000000001").map(|x| x.nano_value()),
            Ok(1)
        );
        assert_eq!(
            QuantityError::FormatWrong.to_string(),
            "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
        );
    }

    #[test]
    fn json_round_trip() {
        assert_eq!(
            Quantity::from_json(&serde_json::json!(1)).map(|x| x.to_string()),
            Ok("1".to_string())
        );
        assert_eq!(
            Quantity::from_json(&serde_json::json!(0.5)).map(|x| x.to_string()),
            Ok("500m".to_string())
        );
        assert!(Quantity::from_json(&serde_json::json!(true)).is_err());
        let v: Quantity = serde_json::from_str("\"250m\"").expect("deserialize");
        assert_eq!(serde_json::to_string(&v).expect("serialize"), "\"250m\"");
    }
}
