//! A small resource-quantity parser for the values the agent needs (cpu, memory, storage).

/// Parses a Kubernetes quantity ("100m", "1.5", "128Mi", "1G", "2e3") into thousandths of a unit.
pub fn parse_milli(s: &str) -> Option<i128> {
    let s = s.trim();
    if s.is_empty() {
        return None;
    }
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    let (mult_num, mult_den): (i128, i128) = match suffix {
        "" => (1, 1),
        "m" => (1, 1000),
        "k" => (1_000, 1),
        "M" => (1_000_000, 1),
        "G" => (1_000_000_000, 1),
        "T" => (1_000_000_000_000, 1),
        "P" => (1_000_000_000_000_000, 1),
        "E" => (1_000_000_000_000_000_000, 1),
        "Ki" => (1 << 10, 1),
        "Mi" => (1 << 20, 1),
        "Gi" => (1 << 30, 1),
        "Ti" => (1 << 40, 1),
        "Pi" => (1 << 50, 1),
        "Ei" => (1 << 60, 1),
        e if e.starts_with('e') || e.starts_with('E') => {
            let exp: u32 = e[1..].parse().ok()?;
            (10i128.checked_pow(exp)?, 1)
        }
        _ => return None,
    };
    let negative = num.starts_with('-');
    let digits = num.trim_start_matches(['+', '-']);
    let (int_part, frac_part) = digits.split_once('.').unwrap_or((digits, ""));
    if int_part.is_empty() && frac_part.is_empty() {
        return None;
    }
    let int: i128 = if int_part.is_empty() {
        0
    } else {
        int_part.parse().ok()?
    };
    // value * 1000 * mult, computed exactly with the fraction as a ratio; rounded up as upstream does.
    let frac_den = 10i128.checked_pow(frac_part.len() as u32)?;
    let frac: i128 = if frac_part.is_empty() {
        0
    } else {
        frac_part.parse().ok()?
    };
    let numerator = (int * frac_den + frac)
        .checked_mul(1000)?
        .checked_mul(mult_num)?;
    let denominator = frac_den * mult_den;
    let value = (numerator + denominator - 1) / denominator;
    Some(if negative { -value } else { value })
}

/// Whole units, rounded up.
pub fn parse_value(s: &str) -> Option<i128> {
    parse_milli(s).map(|m| (m + 999).div_euclid(1000))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cpu_and_memory() {
        assert_eq!(parse_milli("100m"), Some(100));
        assert_eq!(parse_milli("1.5"), Some(1500));
        assert_eq!(parse_milli("2"), Some(2000));
        assert_eq!(parse_value("128Mi"), Some(128 * 1024 * 1024));
        assert_eq!(parse_value("1G"), Some(1_000_000_000));
        assert_eq!(parse_value("1e3"), Some(1000));
        assert_eq!(parse_value("0.5Gi"), Some(512 * 1024 * 1024));
        assert_eq!(parse_value("1m"), Some(1));
        assert_eq!(parse_milli("abc"), None);
        assert_eq!(parse_milli("1Q"), None);
    }
}
