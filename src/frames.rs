//! Frame targeting for page tools: element refs that name their frame, and
//! one page outline assembled from the outlines of a tab's frames.
//!
//! Owns: the ref syntax (`e12` in the tab's top document, `f7:e12` in the
//! frame Chrome numbers 7), which frame a call's parameters address, which
//! of a tab's frames belongs to which `iframe` line of its parent's outline,
//! and the splicing of child-frame outlines under those lines.
//!
//! Must not: do IO. The driver injects the content script into frames, talks
//! to them and asks Chrome which frame has which URL; this module only says
//! where things go.
//!
//! Why Chrome's own frame ids: they stay the same for the life of a frame, so
//! a ref keeps naming the same frame across a service-worker restart without
//! any remembered mapping, and a frame that is gone is detectable
//! (`webNavigation.getFrame` finds nothing).

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

/// How a content script ends the line of an iframe it cannot look into.
pub const OTHER_SITE_SUFFIX: &str = " (other site: its content is not shown)";

/// An iframe line of another origin in a frame's outline, as its content
/// script reported it (`details.frames: [{ line, src }]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placeholder {
    /// Index of the `iframe` line in the `page_snapshot` content.
    pub line: usize,
    /// The iframe element's `src` (absolute; the frame may have navigated since).
    pub src: String,
}

impl Placeholder {
    /// Read the placeholders from a content script's `details.frames`;
    /// malformed entries are ignored.
    pub fn from_details(details: Option<&Value>) -> Vec<Placeholder> {
        let Some(frames) = details
            .and_then(|d| d.get("frames"))
            .and_then(Value::as_array)
        else {
            return Vec::new();
        };
        frames
            .iter()
            .filter_map(|f| {
                Some(Placeholder {
                    line: usize::try_from(f.get("line")?.as_u64()?).ok()?,
                    src: f
                        .get("src")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string(),
                })
            })
            .collect()
    }
}

/// A frame of the tab as Chrome lists it (`webNavigation.getAllFrames`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownFrame {
    pub frame_id: u32,
    /// -1 for the top document.
    pub parent_frame_id: i64,
    pub url: String,
}

/// Which frame each placeholder line of frame `parent`'s outline shows.
///
/// Candidates are the frames whose outline `parent`'s content script could
/// not walk itself: its children, and the children of same-origin (or
/// `about:`) frames it walked inline, at any depth. A content script cannot
/// tell which Chrome frame an iframe element is, so frames are matched by
/// URL: the same URL as the element's `src` first, then the same origin,
/// then the remaining frames of another origin than `parent` in frame-id
/// (creation) order. Frames left over (hidden iframes, which the outline
/// skips) are not shown; a placeholder left over keeps its line as it is.
pub fn match_frames(
    placeholders: &[Placeholder],
    parent: u32,
    frames: &[KnownFrame],
) -> Vec<FrameSlot> {
    let origin = crate::gatekeeper::origin_of;
    let by_id: std::collections::HashMap<u32, &KnownFrame> =
        frames.iter().map(|f| (f.frame_id, f)).collect();
    let parent_origin = by_id.get(&parent).map(|f| origin(&f.url));
    let same_origin = |f: &KnownFrame| parent_origin.as_deref() == Some(origin(&f.url).as_str());
    let walked_inline = |f: &KnownFrame| f.url.starts_with("about:") || same_origin(f);
    // Whether the way up from `f` reaches `parent` through inline frames only.
    let belongs = |f: &KnownFrame| {
        let mut up = f.parent_frame_id;
        for _ in 0..32 {
            if up == i64::from(parent) {
                return true;
            }
            let Some(above) = u32::try_from(up).ok().and_then(|id| by_id.get(&id)) else {
                return false;
            };
            if !walked_inline(above) {
                return false;
            }
            up = above.parent_frame_id;
        }
        false
    };
    let mut children: Vec<&KnownFrame> = frames
        .iter()
        .filter(|f| f.frame_id != parent && !f.url.starts_with("about:") && belongs(f))
        .collect();
    crate::sorting::sort_by_key(&mut children, |f| f.frame_id);
    let mut taken = vec![false; children.len()];
    let mut slots: Vec<Option<u32>> = vec![None; placeholders.len()];
    // Pass 0: the same URL; pass 1: the same origin; pass 2: any frame of
    // another origin left.
    let rule = |pass: u8, p: &Placeholder, f: &KnownFrame| match pass {
        0 => f.url == p.src,
        1 => !p.src.is_empty() && origin(&f.url) == origin(&p.src),
        _ => !same_origin(f),
    };
    for pass in 0..3 {
        for (placeholder, slot) in placeholders.iter().zip(slots.iter_mut()) {
            if slot.is_some() {
                continue;
            }
            if let Some(i) =
                (0..children.len()).find(|&i| !taken[i] && rule(pass, placeholder, children[i]))
            {
                taken[i] = true;
                *slot = Some(children[i].frame_id);
            }
        }
    }
    placeholders
        .iter()
        .zip(slots)
        .filter_map(|(p, slot)| {
            slot.map(|frame_id| FrameSlot {
                frame_id,
                line: p.line,
            })
        })
        .collect()
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
    /// Child frames whose `iframe` line is in `content` (see [`match_frames`]).
    pub slots: Vec<FrameSlot>,
}

/// What the driver got from a child frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChildFrame {
    /// Its outline, shown indented under its `iframe` line.
    Read(FrameOutline),
    /// Why it is not shown (cannot be injected, a browser page, too many frames).
    NotRead(String),
}

/// What the driver got from each child frame of one snapshot, by frame id
/// (a few frames at most, [`MAX_FRAMES`]).
pub type ChildFrames = crate::vecmap::VecMap<u32, ChildFrame>;

/// The top document's outline with every child frame's outline spliced in
/// under its `iframe` line (recursively, at most [`MAX_FRAME_DEPTH`] deep).
/// The line becomes `iframe "…" [frame f7] <url>` (the frame's refs are
/// `f7:e…`); child headers are dropped.
pub fn assemble(top: &FrameOutline, children: &ChildFrames) -> String {
    render(top, children, 0).join("\n")
}

fn render(outline: &FrameOutline, children: &ChildFrames, depth: usize) -> Vec<String> {
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
        let named = format!(
            "{} [frame f{}]",
            line.strip_suffix(OTHER_SITE_SUFFIX).unwrap_or(line),
            slot.frame_id
        );
        match children.get(&slot.frame_id) {
            Some(ChildFrame::Read(child)) if depth < MAX_FRAME_DEPTH => {
                out.push(format!("{named} {}", child.url));
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
            Some(ChildFrame::NotRead(reason)) => out.push(format!("{named} (not shown: {reason})")),
            _ => out.push(format!("{named} (not shown: frames nested too deep)")),
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
    fn placeholders_come_from_details() {
        let details = json!({ "frames": [{ "line": 7, "src": "http://b.test/x" }, { "src": "x" }, { "line": 9 }] });
        assert_eq!(
            Placeholder::from_details(Some(&details)),
            vec![
                Placeholder {
                    line: 7,
                    src: "http://b.test/x".into()
                },
                Placeholder {
                    line: 9,
                    src: String::new()
                }
            ]
        );
        assert!(Placeholder::from_details(None).is_empty());
        assert!(Placeholder::from_details(Some(&json!({}))).is_empty());
    }

    #[test]
    fn frames_are_matched_to_iframe_lines_by_url_then_origin_then_order() {
        let frame = |frame_id, parent_frame_id, url: &str| KnownFrame {
            frame_id,
            parent_frame_id,
            url: url.into(),
        };
        let frames = [
            frame(0, -1, "http://a.test/"),
            frame(3, 0, "http://ads.test/banner"),
            frame(4, 0, "http://pay.test/card?step=2"),
            frame(5, 0, "http://help.test/chat"),
            frame(6, 4, "http://pay.test/3ds"),
            frame(7, 0, "http://other.test/"),
        ];
        let placeholder = |line, src: &str| Placeholder {
            line,
            src: src.into(),
        };
        let frames = [
            frames.as_slice(),
            &[
                // A srcdoc frame the top walks inline, holding a frame of another site.
                frame(8, 0, "about:srcdoc"),
                frame(9, 8, "http://deep.test/"),
                // A frame inside a frame of another origin: not the top's.
                frame(10, 7, "http://deeper.test/"),
                // A same-origin frame the top walked inline.
                frame(11, 0, "http://a.test/inner"),
            ],
        ]
        .concat();
        let placeholders = [
            // Navigated inside since: same origin as its src.
            placeholder(10, "http://pay.test/card"),
            placeholder(11, "http://help.test/chat"),
            // src changed by script, frame elsewhere: the first one left.
            placeholder(12, "about:blank"),
            placeholder(13, "http://deep.test/"),
            placeholder(14, "http://deeper.test/"),
        ];
        assert_eq!(
            match_frames(&placeholders, 0, &frames),
            vec![
                FrameSlot {
                    frame_id: 4,
                    line: 10
                },
                FrameSlot {
                    frame_id: 5,
                    line: 11
                },
                FrameSlot {
                    frame_id: 3,
                    line: 12
                },
                FrameSlot {
                    frame_id: 9,
                    line: 13
                },
                // Not frame 10 (inside frame 7, another site): the frame left over.
                FrameSlot {
                    frame_id: 7,
                    line: 14
                },
            ]
        );
        // The nested frame belongs to frame 4's outline only.
        assert_eq!(
            match_frames(&[placeholder(2, "http://pay.test/3ds")], 4, &frames),
            vec![FrameSlot {
                frame_id: 6,
                line: 2
            }]
        );
        // More iframe lines than frames: the extra line stays as it is.
        assert_eq!(match_frames(&placeholders, 6, &frames), vec![]);
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
                "  iframe \"Pay\" (other site: its content is not shown)",
                "  [e1] button \"Top\"",
                "iframe (other site: its content is not shown)",
                "iframe",
            ],
            &[(3, 5), (4, 7), (5, 8)],
        );
        let pay = outline(
            3,
            "http://b.test/pay",
            &[
                "h2 \"Card\"",
                "[f3:e1] button \"Pay\"",
                "iframe \"Inner\" (other site: its content is not shown)",
            ],
            &[(6, 6)],
        );
        let inner = outline(6, "http://c.test/", &["[f6:e1] link \"Help\""], &[]);
        let children = ChildFrames::from_iter([
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
    fn child_frames_keep_one_entry_per_frame_the_latest() {
        let mut children = ChildFrames::new();
        assert!(!children.contains_key(&3));
        children.insert(3, ChildFrame::NotRead("first".into()));
        children.insert(5, ChildFrame::NotRead("other".into()));
        children.insert(3, ChildFrame::NotRead("second".into()));
        assert_eq!(
            children.get(&3),
            Some(&ChildFrame::NotRead("second".into()))
        );
        assert_eq!(children.get(&5), Some(&ChildFrame::NotRead("other".into())));
        assert_eq!(children.get(&4), None);
        assert_eq!(
            children,
            ChildFrames::from_iter([
                (3, ChildFrame::NotRead("x".into())),
                (5, ChildFrame::NotRead("other".into())),
                (3, ChildFrame::NotRead("second".into())),
            ])
        );
    }

    #[test]
    fn a_slot_on_a_text_line_is_ignored() {
        // A page cannot make its own text look like a frame to splice into.
        let top = outline(
            0,
            "http://a.test/",
            &["text \"iframe (other site: its content is not shown)\""],
            &[(3, 4)],
        );
        let child = outline(3, "http://b.test/", &["[f3:e1] button \"X\""], &[]);
        let children = ChildFrames::from_iter([(3, ChildFrame::Read(child))]);
        assert_eq!(assemble(&top, &children), top.content);
    }

    #[test]
    fn nesting_stops_at_the_depth_limit() {
        // A chain of frames 1 → 2 → 3 → 4, each containing the next.
        let mut children = ChildFrames::new();
        for id in 1..=4u32 {
            children.insert(
                id,
                ChildFrame::Read(outline(
                    id,
                    &format!("http://f{id}.test/"),
                    &["iframe"],
                    &[(id + 1, 4)],
                )),
            );
        }
        let top = outline(0, "http://a.test/", &["iframe"], &[(1, 4)]);
        let text = assemble(&top, &children);
        assert!(text.contains("http://f3.test/"), "{text}");
        assert!(!text.contains("http://f4.test/"), "{text}");
        assert!(
            text.contains("iframe [frame f4] (not shown: frames nested too deep)"),
            "{text}"
        );
    }
}
