//! Resource quantities as the agent reads them, through the API crate's `Quantity`.

use skiff_api::quantity::Quantity;

/// Parses a Kubernetes quantity ("100m", "1.5", "128Mi", "1G", "2e3") into thousandths of a unit,
/// rounded up as upstream's `MilliValue`.
pub fn parse_milli(s: &str) -> Option<i128> {
    Quantity::parse(s.trim()).ok().map(|q| i128::from(q.milli_value()))
}

/// Whole units, rounded up.
pub fn parse_value(s: &str) -> Option<i128> {
    Quantity::parse(s.trim()).ok().map(|q| i128::from(q.value()))
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
