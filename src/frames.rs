//! Frame targeting for page tools: element refs that name their frame, and
//! one page outline assembled from the outlines of a tab's frames.
//!
//! Owns: the ref syntax (`e12` in the tab's top document, `f7:e12` in the
//! frame Chrome numbers 7), which frame a call's parameters address, and the
//! splicing of child-frame outlines under their `iframe` lines.
//!
//! Must not: do IO. The driver injects the content script into frames, talks
//! to them and asks Chrome which frame has which URL; this module only says
//! where things go.
//!
//! Why Chrome's own frame ids: they stay the same for the life of a frame, so
//! a ref keeps naming the same frame across a service-worker restart without
//! any remembered mapping, and a frame that is gone is detectable
//! (`webNavigation.getFrame` finds nothing).

use std::collections::BTreeMap;

use serde_json::Value;

/// Chrome's frame id of a tab's top document.
pub const TOP_FRAME: u32 = 0;
/// At most this many child frames are read for one `page_snapshot`; the
/// `iframe` lines of further frames say they are not shown.
pub const MAX_FRAMES: usize = 6;
/// Frames nested deeper than this (counting the top document's children as
/// depth 1) are not read.
pub const MAX_FRAME_DEPTH: usize = 3;

/// An element ref split into the frame it belongs to and the ref the
/// frame's content script knows (`e12`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElementRef {
    pub frame_id: u32,
    pub local: String,
}

impl ElementRef {
    /// The ref as the model sees it.
    pub fn display(&self) -> String {
        if self.frame_id == TOP_FRAME {
            self.local.clone()
        } else {
            format!("f{}:{}", self.frame_id, self.local)
        }
    }
}

fn positive_number(digits: &str) -> Option<u32> {
    let valid = !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && !digits.starts_with('0');
    valid.then(|| digits.parse().ok()).flatten()
}

/// Parse `e12` or `f7:e12` (surrounding spaces ignored); None for anything else.
pub fn parse_ref(text: &str) -> Option<ElementRef> {
    let text = text.trim();
    let (frame_id, local) = match text.strip_prefix('f') {
        Some(rest) => {
            let (frame, local) = rest.split_once(':')?;
            (positive_number(frame)?, local)
        }
        None => (TOP_FRAME, text),
    };
    positive_number(local.strip_prefix('e')?)?;
    Some(ElementRef {
        frame_id,
        local: local.to_string(),
    })
}

/// The frame a page tool call acts in: the frame of its `ref` parameter, or
/// the top document (no ref, or a malformed one, which the content script
/// then reports to the model).
pub fn frame_of_params(params: &Value) -> u32 {
    params
        .get("ref")
        .and_then(Value::as_str)
        .and_then(parse_ref)
        .map_or(TOP_FRAME, |r| r.frame_id)
}

/// The tool error when the frame a ref belongs to no longer exists (its
/// page navigated, or the iframe was removed).
pub fn frame_gone(frame_id: u32) -> String {
    format!(
        "The frame f{frame_id} is no longer on the page (it was removed or the page navigated), so its refs (f{frame_id}:e…) are stale; nothing was done. Call page_snapshot to get fresh refs."
    )
}

/// Where a child frame's `iframe` line is in its parent's outline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameSlot {
    pub frame_id: u32,
    /// Index of the `iframe` line in the parent's `page_snapshot` content.
    pub line: usize,
}

/// One frame's `page_snapshot` as its content script returned it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameOutline {
    pub frame_id: u32,
    pub url: String,
    /// `Title:` / `URL:` / `Scroll:` header, a blank line, the outline.
    pub content: String,
    /// Cross-origin child frames whose `iframe` line is in `content`.
    pub slots: Vec<FrameSlot>,
}

impl FrameOutline {
    /// Read the slots from a content script's `details.frames`
    /// (`[{ frameId, line }]`); malformed entries are ignored.
    pub fn slots_from_details(details: Option<&Value>) -> Vec<FrameSlot> {
        let Some(frames) = details
            .and_then(|d| d.get("frames"))
            .and_then(Value::as_array)
        else {
            return Vec::new();
        };
        frames
            .iter()
            .filter_map(|f| {
                Some(FrameSlot {
                    frame_id: u32::try_from(f.get("frameId")?.as_u64()?).ok()?,
                    line: usize::try_from(f.get("line")?.as_u64()?).ok()?,
                })
            })
            .filter(|s| s.frame_id != TOP_FRAME)
            .collect()
    }
}

/// What the driver got from a child frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChildFrame {
    /// Its outline, shown indented under its `iframe` line.
    Read(FrameOutline),
    /// Why it is not shown (cannot be injected, a browser page, too many frames).
    NotRead(String),
}

/// The top document's outline with every child frame's outline spliced in
/// under its `iframe` line (recursively, at most [`MAX_FRAME_DEPTH`] deep).
/// Child headers are dropped: the `iframe` line names the frame's URL.
pub fn assemble(top: &FrameOutline, children: &BTreeMap<u32, ChildFrame>) -> String {
    render(top, children, 0).join("\n")
}

fn render(
    outline: &FrameOutline,
    children: &BTreeMap<u32, ChildFrame>,
    depth: usize,
) -> Vec<String> {
    let lines: Vec<&str> = outline.content.split('\n').collect();
    let mut out = Vec::with_capacity(lines.len());
    for (index, line) in lines.iter().enumerate() {
        let slot = outline.slots.iter().find(|s| s.line == index);
        // Only a structural iframe line is a slot; a text line never is.
        let Some(slot) = slot.filter(|_| line.trim_start().starts_with("iframe")) else {
            out.push((*line).to_string());
            continue;
        };
        let indent = &line[..line.len() - line.trim_start().len()];
        match children.get(&slot.frame_id) {
            Some(ChildFrame::Read(child)) if depth < MAX_FRAME_DEPTH => {
                out.push(format!("{line} {}", child.url));
                let rendered = render(child, children, depth + 1);
                // The child's header ends at its first blank line.
                let body_start = rendered
                    .iter()
                    .position(|l| l.is_empty())
                    .map_or(0, |i| i + 1);
                for child_line in &rendered[body_start..] {
                    out.push(format!("{indent}  {child_line}"));
                }
            }
            Some(ChildFrame::NotRead(reason)) => out.push(format!("{line} (not shown: {reason})")),
            _ => out.push(format!("{line} (not shown: frames nested too deep)")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    #[test]
    fn refs_name_their_frame() {
        assert_eq!(
            parse_ref("e12"),
            Some(ElementRef {
                frame_id: 0,
                local: "e12".into()
            })
        );
        assert_eq!(
            parse_ref(" f7:e3 "),
            Some(ElementRef {
                frame_id: 7,
                local: "e3".into()
            })
        );
        assert_eq!(parse_ref("f7:e3").unwrap().display(), "f7:e3");
        assert_eq!(parse_ref("e3").unwrap().display(), "e3");
        for bad in [
            "", "e", "e0", "e01", "x3", "f:e3", "f0:e3", "f07:e3", "f7e3", "f7:", "f7:3", "12",
        ] {
            assert_eq!(parse_ref(bad), None, "{bad:?}");
        }
        assert_eq!(frame_of_params(&json!({ "ref": "f9:e1", "text": "x" })), 9);
        assert_eq!(frame_of_params(&json!({ "ref": "e1" })), TOP_FRAME);
        assert_eq!(frame_of_params(&json!({ "ref": "bogus" })), TOP_FRAME);
        assert_eq!(frame_of_params(&json!({ "direction": "down" })), TOP_FRAME);
        assert_eq!(frame_of_params(&json!({ "ref": 5 })), TOP_FRAME);
    }

    #[test]
    fn slots_come_from_details() {
        let details = json!({ "frames": [{ "frameId": 4, "line": 7 }, { "frameId": "x" }, { "frameId": 0, "line": 1 }, { "frameId": 5, "line": 9 }] });
        assert_eq!(
            FrameOutline::slots_from_details(Some(&details)),
            vec![
                FrameSlot {
                    frame_id: 4,
                    line: 7
                },
                FrameSlot {
                    frame_id: 5,
                    line: 9
                }
            ]
        );
        assert!(FrameOutline::slots_from_details(None).is_empty());
        assert!(FrameOutline::slots_from_details(Some(&json!({}))).is_empty());
    }

    fn outline(frame_id: u32, url: &str, body: &[&str], slots: &[(u32, usize)]) -> FrameOutline {
        let mut lines = vec![
            format!("Title: t{frame_id}"),
            format!("URL: {url}"),
            "Scroll: 0 of 10 px (viewport 10 px)".into(),
            String::new(),
        ];
        lines.extend(body.iter().map(|l| l.to_string()));
        FrameOutline {
            frame_id,
            url: url.into(),
            content: lines.join("\n"),
            slots: slots
                .iter()
                .map(|&(frame_id, line)| FrameSlot { frame_id, line })
                .collect(),
        }
    }

    #[test]
    fn child_outlines_are_spliced_under_their_iframe_lines() {
        let top = outline(
            0,
            "http://a.test/",
            &[
                "main",
                "  iframe \"Pay\" [frame f3]",
                "  [e1] button \"Top\"",
                "iframe [frame f4]",
                "iframe [frame f5]",
            ],
            &[(3, 5), (4, 7), (5, 8)],
        );
        let pay = outline(
            3,
            "http://b.test/pay",
            &[
                "h2 \"Card\"",
                "[f3:e1] button \"Pay\"",
                "iframe \"Inner\" [frame f6]",
            ],
            &[(6, 6)],
        );
        let inner = outline(6, "http://c.test/", &["[f6:e1] link \"Help\""], &[]);
        let children = BTreeMap::from([
            (3, ChildFrame::Read(pay)),
            (6, ChildFrame::Read(inner)),
            (4, ChildFrame::NotRead("more than 6 frames".into())),
        ]);
        assert_eq!(
            assemble(&top, &children),
            [
                "Title: t0",
                "URL: http://a.test/",
                "Scroll: 0 of 10 px (viewport 10 px)",
                "",
                "main",
                "  iframe \"Pay\" [frame f3] http://b.test/pay",
                "    h2 \"Card\"",
                "    [f3:e1] button \"Pay\"",
                "    iframe \"Inner\" [frame f6] http://c.test/",
                "      [f6:e1] link \"Help\"",
                "  [e1] button \"Top\"",
                "iframe [frame f4] (not shown: more than 6 frames)",
                "iframe [frame f5] (not shown: frames nested too deep)",
            ]
            .join("\n")
        );
    }

    #[test]
    fn a_slot_on_a_text_line_is_ignored() {
        // A page cannot make its own text look like a frame to splice into.
        let top = outline(
            0,
            "http://a.test/",
            &["text \"iframe [frame f3]\""],
            &[(3, 4)],
        );
        let child = outline(3, "http://b.test/", &["[f3:e1] button \"X\""], &[]);
        let children = BTreeMap::from([(3, ChildFrame::Read(child))]);
        assert_eq!(assemble(&top, &children), top.content);
    }

    #[test]
    fn nesting_stops_at_the_depth_limit() {
        // A chain of frames 1 → 2 → 3 → 4, each containing the next.
        let mut children = BTreeMap::new();
        for id in 1..=4u32 {
            children.insert(
                id,
                ChildFrame::Read(outline(
                    id,
                    &format!("http://f{id}.test/"),
                    &[&format!("iframe [frame f{}]", id + 1)],
                    &[(id + 1, 4)],
                )),
            );
        }
        let top = outline(0, "http://a.test/", &["iframe [frame f1]"], &[(1, 4)]);
        let text = assemble(&top, &children);
        assert!(text.contains("http://f3.test/"), "{text}");
        assert!(!text.contains("http://f4.test/"), "{text}");
        assert!(
            text.contains("iframe [frame f4] (not shown: frames nested too deep)"),
            "{text}"
        );
    }
}
