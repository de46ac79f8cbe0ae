//! Resource quantities as the scheduler reads them: milli-units for cpu and whole units
//! (rounded up, as upstream's `Quantity.Value()`) for everything else, through the API
//! crate's exact `Quantity`.

use skiff_api::quantity::Quantity;

/// Parses a quantity and returns its value in milli-units, rounded up.
pub(crate) fn parse_milli(s: &str) -> Option<i64> {
    Quantity::parse(s.trim()).ok().map(|q| q.milli_value())
}

/// Parses a quantity and returns its value in whole units, rounded up.
pub(crate) fn parse_value(s: &str) -> Option<i64> {
    Quantity::parse(s.trim()).ok().map(|q| q.value())
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
