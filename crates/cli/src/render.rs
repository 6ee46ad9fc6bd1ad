//! Small shared helpers for what the terminal shows.

use comfy_table::{ContentArrangement, Table, presets::UTF8_FULL_CONDENSED};

/// A table in the house style: condensed borders, wrapped to the terminal.
pub fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED).set_content_arrangement(ContentArrangement::Dynamic).set_header(header.to_vec());
    t
}

/// "45s", "1m45s", "12m", "1h05m".
pub use ironclaim_core::sensitivity::format_duration as duration;

/// "1 pod", "0 pods", "2 pods": a count and its noun in agreement.
pub use ironclaim_sim::report::count;
