//! A small parser for Kubernetes resource quantities ("100m", "1.5Gi", "2e3").
//!
//! The scheduler only needs integer values: milli-units for cpu and whole units
//! (rounded up, as upstream's `Quantity.Value()`) for everything else.

/// Parses a quantity and returns its value in milli-units, rounded up.
pub(crate) fn parse_milli(s: &str) -> Option<i64> {
    scaled(s, 1000)
}

/// Parses a quantity and returns its value in whole units, rounded up.
pub(crate) fn parse_value(s: &str) -> Option<i64> {
    scaled(s, 1)
}

fn scaled(s: &str, scale: i128) -> Option<i64> {
    let s = s.trim();
    if s.is_empty() {
        return None;
    }
    let (negative, body) = match s.as_bytes()[0] {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let num_end = body
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(body.len());
    let (number, suffix) = body.split_at(num_end);
    if number.is_empty() || number == "." {
        return None;
    }
    let (int_part, frac_part) = match number.split_once('.') {
        Some((i, f)) => (i, f),
        None => (number, ""),
    };
    if frac_part.contains('.') || frac_part.len() > 18 || int_part.len() > 30 {
        return None;
    }
    let digits = format!("{int_part}{frac_part}");
    let mut mantissa: i128 = digits.parse().ok()?;
    // value = mantissa * 10^(-frac_len) * multiplier
    let mut num: i128 = scale;
    let mut den: i128 = 10i128.checked_pow(u32::try_from(frac_part.len()).ok()?)?;
    match suffix {
        "" => {}
        "Ki" => num *= 1 << 10,
        "Mi" => num *= 1 << 20,
        "Gi" => num *= 1 << 30,
        "Ti" => num *= 1 << 40,
        "Pi" => num *= 1 << 50,
        "Ei" => num *= 1 << 60,
        "n" => den *= 1_000_000_000,
        "u" => den *= 1_000_000,
        "m" => den *= 1_000,
        "k" => num *= 1_000,
        "M" => num *= 1_000_000,
        "G" => num *= 1_000_000_000,
        "T" => num *= 1_000_000_000_000,
        "P" => num *= 1_000_000_000_000_000,
        "E" => num *= 1_000_000_000_000_000_000,
        other => {
            let exp = other.strip_prefix(['e', 'E'])?;
            let exp: i32 = exp.parse().ok()?;
            if exp.unsigned_abs() > 30 {
                return None;
            }
            if exp >= 0 {
                num = num.checked_mul(10i128.pow(exp.unsigned_abs()))?;
            } else {
                den = den.checked_mul(10i128.pow(exp.unsigned_abs()))?;
            }
        }
    }
    mantissa = mantissa.checked_mul(num)?;
    // Round up (away from zero for positives), as upstream's Value()/MilliValue() do.
    let mut v = mantissa / den;
    if mantissa % den != 0 {
        v += 1;
    }
    if negative {
        v = -v;
    }
    i64::try_from(v).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cpu() {
        assert_eq!(parse_milli("100m"), Some(100));
        assert_eq!(parse_milli("1"), Some(1000));
        assert_eq!(parse_milli("1.5"), Some(1500));
        assert_eq!(parse_milli("0.0001"), Some(1));
        assert_eq!(parse_milli("2e3"), Some(2_000_000));
        assert_eq!(parse_milli("-1"), Some(-1000));
    }

    #[test]
    fn parses_memory() {
        assert_eq!(parse_value("16Gi"), Some(16 * 1024 * 1024 * 1024));
        assert_eq!(parse_value("500Mi"), Some(500 * 1024 * 1024));
        assert_eq!(parse_value("1k"), Some(1000));
        assert_eq!(parse_value("1.5Ki"), Some(1536));
        assert_eq!(parse_value("100m"), Some(1));
        assert_eq!(parse_value("110"), Some(110));
    }

    #[test]
    fn rejects_garbage() {
        assert_eq!(parse_value(""), None);
        assert_eq!(parse_value("abc"), None);
        assert_eq!(parse_value("1Xi"), None);
        assert_eq!(parse_value("1.2.3"), None);
    }
}
