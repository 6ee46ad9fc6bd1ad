//! Small shared helpers for what the terminal shows.

use comfy_table::{ContentArrangement, Table, presets::UTF8_FULL_CONDENSED};

/// A table in the house style: condensed borders, fitted to [`width`].
pub fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED).set_content_arrangement(ContentArrangement::Dynamic).set_header(header.to_vec());
    if let Some(width) = width() {
        t.set_width(width);
    }
    t
}

/// The width tables are fitted to: `COLUMNS` when it holds a width, else
/// the terminal's when stdout is one, else none: output to a file or a pipe
/// keeps whole rows, for grep.
pub fn width() -> Option<u16> {
    width_from(std::env::var("COLUMNS").ok().as_deref(), || Table::new().width())
}

fn width_from(columns: Option<&str>, terminal: impl FnOnce() -> Option<u16>) -> Option<u16> {
    columns.and_then(|c| c.trim().parse::<u16>().ok()).filter(|&w| w > 0).or_else(terminal)
}

/// "45s", "1m45s", "12m", "1h05m".
pub use ironclaim_core::sensitivity::format_duration as duration;

/// "1 pod", "0 pods", "2 pods": a count and its noun in agreement.
pub use ironclaim_sim::report::count;

#[cfg(test)]
mod tests {
    use super::width_from;

    #[test]
    fn columns_sets_the_width_and_else_the_terminal_does() {
        assert_eq!(width_from(Some("100"), || Some(80)), Some(100));
        assert_eq!(width_from(Some(" 72 "), || None), Some(72));
        assert_eq!(width_from(Some("wide"), || Some(80)), Some(80));
        assert_eq!(width_from(Some("0"), || None), None);
        assert_eq!(width_from(None, || None), None);
    }
}
