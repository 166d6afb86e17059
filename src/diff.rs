//! A compact line diff of two page outlines, for the UI only.
//!
//! Owns: which lines were added and removed between the previous and the
//! current `page_snapshot` of a page, bounded in size, as the JSON the side
//! panel renders in the tool card (`details.diff`).
//!
//! Must not: feed the model (it gets the full snapshot) or do IO.

use serde_json::{json, Value};

/// At most this many changed lines are listed (the counts stay exact).
pub const MAX_DIFF_LINES: usize = 40;
/// A listed line is cut after this many characters.
pub const MAX_DIFF_LINE_CHARS: usize = 160;
/// Above this many cells (old × new lines left after the common prefix and
/// suffix) the diff counts lines instead of aligning them.
const MAX_ALIGN_CELLS: usize = 250_000;

/// One changed line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change<'a> {
    Added(&'a str),
    Removed(&'a str),
}

/// The changes that turn `old` into `new`, in the order of the new text
/// (removed lines before the added lines that replace them). Lines are
/// compared exactly, trailing spaces ignored.
pub fn line_changes<'a>(old: &'a str, new: &'a str) -> Vec<Change<'a>> {
    let old: Vec<&str> = old.lines().map(str::trim_end).collect();
    let new: Vec<&str> = new.lines().map(str::trim_end).collect();
    let prefix = old.iter().zip(&new).take_while(|(a, b)| a == b).count();
    let suffix = old[prefix..]
        .iter()
        .rev()
        .zip(new[prefix..].iter().rev())
        .take_while(|(a, b)| a == b)
        .count();
    let a = &old[prefix..old.len() - suffix];
    let b = &new[prefix..new.len() - suffix];
    if a.len().saturating_mul(b.len()) > MAX_ALIGN_CELLS {
        return unaligned_changes(a, b);
    }
    // Longest common subsequence, filled from the end so the walk below
    // goes forward.
    let width = b.len() + 1;
    let mut lcs = vec![0u32; (a.len() + 1) * width];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i * width + j] = if a[i] == b[j] {
                lcs[(i + 1) * width + j + 1] + 1
            } else {
                lcs[(i + 1) * width + j].max(lcs[i * width + j + 1])
            };
        }
    }
    let (mut i, mut j) = (0, 0);
    let mut changes = Vec::new();
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            i += 1;
            j += 1;
        } else if j == b.len()
            || (i < a.len() && lcs[(i + 1) * width + j] >= lcs[i * width + j + 1])
        {
            changes.push(Change::Removed(a[i]));
            i += 1;
        } else {
            changes.push(Change::Added(b[j]));
            j += 1;
        }
    }
    changes
}

/// For very different long texts: lines missing from the other side, counted
/// with multiplicity, removed ones first.
fn unaligned_changes<'a>(a: &[&'a str], b: &[&'a str]) -> Vec<Change<'a>> {
    let mut counts: std::collections::HashMap<&str, i64> = std::collections::HashMap::new();
    for line in b {
        *counts.entry(line).or_default() += 1;
    }
    let mut changes = Vec::new();
    for line in a {
        let count = counts.entry(line).or_default();
        if *count > 0 {
            *count -= 1;
        } else {
            changes.push(Change::Removed(line));
        }
    }
    let mut counts: std::collections::HashMap<&str, i64> = std::collections::HashMap::new();
    for line in a {
        *counts.entry(line).or_default() += 1;
    }
    for line in b {
        let count = counts.entry(line).or_default();
        if *count > 0 {
            *count -= 1;
        } else {
            changes.push(Change::Added(line));
        }
    }
    changes
}

fn clip(line: &str) -> String {
    let line = line.trim();
    if line.chars().count() <= MAX_DIFF_LINE_CHARS {
        return line.to_string();
    }
    let mut cut: String = line.chars().take(MAX_DIFF_LINE_CHARS - 1).collect();
    cut.push('…');
    cut
}

/// `details.diff` of a snapshot against the previous one of the same page:
/// `{ previousNodeId, added, removed, changes: [{ kind, line }], truncated }`
/// with exact counts and at most [`MAX_DIFF_LINES`] listed lines (each at
/// most [`MAX_DIFF_LINE_CHARS`] characters, indentation dropped).
pub fn snapshot_diff(previous_node_id: &str, old: &str, new: &str) -> Value {
    let changes = line_changes(old, new);
    let added = changes
        .iter()
        .filter(|c| matches!(c, Change::Added(_)))
        .count();
    let listed: Vec<Value> = changes
        .iter()
        .take(MAX_DIFF_LINES)
        .map(|c| match c {
            Change::Added(line) => json!({ "kind": "added", "line": clip(line) }),
            Change::Removed(line) => json!({ "kind": "removed", "line": clip(line) }),
        })
        .collect();
    json!({
        "previousNodeId": previous_node_id,
        "added": added,
        "removed": changes.len() - added,
        "changes": listed,
        "truncated": changes.len() > MAX_DIFF_LINES,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn changed_lines_in_order() {
        let old =
            "Title: Shop\nmain\n  [e1] button \"Add\"\n  text \"Cart: 0\"\n  [e2] link \"Help\"";
        let new = "Title: Shop\nmain\n  [e1] button \"Add\"\n  text \"Cart: 1\"\n  [e3] button \"Checkout\"\n  [e2] link \"Help\"";
        assert_eq!(
            line_changes(old, new),
            vec![
                Change::Removed("  text \"Cart: 0\""),
                Change::Added("  text \"Cart: 1\""),
                Change::Added("  [e3] button \"Checkout\""),
            ]
        );
        assert_eq!(line_changes(old, old), vec![]);
        assert_eq!(
            line_changes("a\nb ", "a\nb"),
            vec![],
            "trailing spaces do not count"
        );
        assert_eq!(line_changes("", "a"), vec![Change::Added("a")]);
        assert_eq!(
            line_changes("a\nb\nc", "c"),
            vec![Change::Removed("a"), Change::Removed("b")]
        );
    }

    #[test]
    fn repeated_lines_are_aligned_not_confused() {
        let old = "x\ny\nx\ny";
        let new = "x\ny\nz\nx\ny";
        assert_eq!(line_changes(old, new), vec![Change::Added("z")]);
    }

    #[test]
    fn huge_different_texts_are_counted_without_alignment() {
        let old: String = (0..1000).map(|i| format!("old {i}\n")).collect();
        let new: String = (0..1000).map(|i| format!("new {i}\n")).collect();
        let changes = line_changes(&old, &new);
        assert_eq!(changes.len(), 2000);
        assert_eq!(changes[0], Change::Removed("old 0"));
        assert_eq!(changes[1000], Change::Added("new 0"));
    }

    #[test]
    fn the_ui_diff_is_bounded() {
        let old: String = (0..100).map(|i| format!("  line {i}\n")).collect();
        let new = format!("{}\n{}", "x".repeat(500), old.replace("  line 5\n", ""));
        let diff = snapshot_diff("n7", &old, &new);
        assert_eq!(diff["previousNodeId"], "n7");
        assert_eq!(diff["added"], 1);
        assert_eq!(diff["removed"], 1);
        assert_eq!(diff["truncated"], false);
        let changes = diff["changes"].as_array().unwrap();
        assert_eq!(changes[0]["kind"], "added");
        assert_eq!(
            changes[0]["line"].as_str().unwrap().chars().count(),
            MAX_DIFF_LINE_CHARS
        );
        assert_eq!(changes[1], json!({ "kind": "removed", "line": "line 5" }));

        let many: String = (0..100).map(|i| format!("new {i}\n")).collect();
        let diff = snapshot_diff("n7", &old, &many);
        assert_eq!(
            (diff["added"].as_u64(), diff["removed"].as_u64()),
            (Some(100), Some(100))
        );
        assert_eq!(diff["changes"].as_array().unwrap().len(), MAX_DIFF_LINES);
        assert_eq!(diff["truncated"], true);
    }
}
