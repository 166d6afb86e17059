//! What tool results carry for the UI only (`details`): the snapshot diff,
//! and the bound on images a result keeps.

use std::cell::RefCell;
use std::rc::Rc;

use serde_json::{json, Value};
use sw_agent::engine::ToolOutcome;
use sw_agent::model::{ImageData, NodeBody, ToolStatus, MAX_RESULT_IMAGE_CHARS};
use sw_agent::provider::{ChatMessage, ProviderRequest};
use sw_agent::sim::{Reply, Sim};

use super::support::*;

/// Calls page_snapshot `times` times, one call per response, then answers.
fn snapshot_policy(times: usize) -> sw_agent::sim::Policy {
    Box::new(move |request: &ProviderRequest| {
        let results = tool_results_so_far(request);
        if results < times {
            Reply::call(&format!("snap{results}"), "page_snapshot", "{}")
        } else {
            Reply::text("Looked.")
        }
    })
}

/// page_snapshot results in order: (url, content), from a shared script.
fn scripted_snapshots(pages: Vec<(&'static str, &'static str)>) -> sw_agent::sim::ToolFn {
    let pages = Rc::new(RefCell::new(pages.into_iter()));
    Box::new(move |name: &str, _params: &Value| {
        assert_eq!(name, "page_snapshot");
        let (url, content) = pages.borrow_mut().next().expect("a scripted snapshot");
        ToolOutcome {
            ok: true,
            content: content.to_string(),
            details: Some(json!({ "url": url, "interactiveCount": 1 })),
            images: vec![],
        }
    })
}

fn snapshot_results(sim: &Sim) -> Vec<(String, String, Option<Value>)> {
    paths(sim)[0]
        .iter()
        .filter_map(|n| match &n.body {
            NodeBody::ToolResult {
                name,
                content,
                details,
                ..
            } if name == "page_snapshot" => Some((n.id.clone(), content.clone(), details.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn a_second_snapshot_of_the_same_page_carries_a_diff_for_the_ui_and_the_full_text_for_the_model() {
    let first = "Title: Shop\n\nmain\n  [e1] button \"Add\"\n  text \"Cart: 0\"";
    let second = "Title: Shop\n\nmain\n  [e1] button \"Add\"\n  text \"Cart: 1\"\n  [e2] button \"Checkout\"";
    let other = "Title: Help\n\nmain\n  text \"Ask us\"";
    let mut sim = Sim::new(
        120,
        snapshot_policy(4),
        scripted_snapshots(vec![
            ("https://shop.example/", first),
            ("https://shop.example/", second),
            ("https://shop.example/help", other),
            ("https://shop.example/help", other),
        ]),
    );
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "Add to cart and look"));
    sim.run(10_000);
    let results = snapshot_results(&sim);
    assert_eq!(results.len(), 4);
    assert_eq!(
        results[0].2.as_ref().unwrap().get("diff"),
        None,
        "nothing to compare with"
    );
    assert_eq!(
        results[1].2.as_ref().unwrap()["diff"],
        json!({
            "previousNodeId": results[0].0,
            "added": 2,
            "removed": 1,
            "changes": [
                { "kind": "removed", "line": "text \"Cart: 0\"" },
                { "kind": "added", "line": "text \"Cart: 1\"" },
                { "kind": "added", "line": "[e2] button \"Checkout\"" },
            ],
            "truncated": false,
        })
    );
    assert_eq!(
        results[2].2.as_ref().unwrap().get("diff"),
        None,
        "another page is a new page, not a change"
    );
    let unchanged = &results[3].2.as_ref().unwrap()["diff"];
    assert_eq!(
        (unchanged["added"].as_u64(), unchanged["removed"].as_u64()),
        (Some(0), Some(0))
    );
    assert_eq!(unchanged["previousNodeId"], json!(results[2].0));

    // The model got the whole second snapshot, not the diff.
    let sent: Vec<&str> = sim
        .requests
        .last()
        .unwrap()
        .messages
        .iter()
        .filter_map(|m| match m {
            ChatMessage::ToolResult { content, .. } => Some(&**content),
            _ => None,
        })
        .collect();
    assert!(sent[1].contains(second), "{}", sent[1]);
    assert!(!sent.iter().any(|c| c.contains("previousNodeId")));
    check_invariants(&sim, &[]).unwrap();
}

fn screenshot_tool(image_chars: usize) -> sw_agent::sim::ToolFn {
    Box::new(move |name: &str, _params: &Value| {
        assert_eq!(name, "screenshot");
        ToolOutcome {
            ok: true,
            content: "Screenshot of \"Shop\".".into(),
            details: Some(json!({ "thumbnail": "data:image/jpeg;base64,AAAA" })),
            images: vec![ImageData {
                media_type: "image/jpeg".into(),
                data: "A".repeat(image_chars),
            }],
        }
    })
}

fn screenshot_run(seed: u64, image_chars: usize) -> (Sim, String, Vec<ImageData>) {
    let policy: sw_agent::sim::Policy =
        Box::new(|request: &ProviderRequest| match request.messages.last() {
            Some(ChatMessage::ToolResult { .. }) => Reply::text("Seen."),
            _ => Reply::call("shot", "screenshot", "{}"),
        });
    let mut sim = Sim::new(seed, policy, screenshot_tool(image_chars));
    sim.profile.vision = true;
    sim.crash();
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "Look at it"));
    sim.run(10_000);
    let (content, images) = paths(&sim)[0]
        .iter()
        .find_map(|n| match &n.body {
            NodeBody::ToolResult {
                name,
                status: ToolStatus::Ok,
                content,
                images,
                ..
            } if name == "screenshot" => Some((content.clone(), images.clone())),
            _ => None,
        })
        .expect("a screenshot result");
    (sim, content, images)
}

#[test]
fn a_screenshot_within_the_bound_is_kept_and_a_larger_one_is_dropped_with_a_note() {
    let (sim, content, images) = screenshot_run(121, MAX_RESULT_IMAGE_CHARS);
    assert_eq!(images.len(), 1);
    assert!(!content.contains("dropped"), "{content}");
    check_invariants(&sim, &[]).unwrap();

    let (sim, content, images) = screenshot_run(122, MAX_RESULT_IMAGE_CHARS + 1);
    assert!(images.is_empty(), "the node keeps no oversized image");
    assert!(
        content.contains("was larger than the 400 KB a result may keep and was dropped"),
        "{content}"
    );
    let record = sim
        .store
        .nodes
        .values()
        .find(|n| matches!(&n.body, NodeBody::ToolResult { name, .. } if name == "screenshot"))
        .unwrap();
    let stored = serde_json::to_string(record).unwrap();
    assert!(
        stored.len() < 10_000,
        "the durable node stays small: {} bytes",
        stored.len()
    );
}

/// page_snapshot results with these details, in order.
/// The text of the newest notice on the thread's path.
fn last_notice(sim: &Sim) -> String {
    paths(sim)[0]
        .iter()
        .rev()
        .find_map(|n| match &n.body {
            NodeBody::Notice { text, .. } => Some(text.clone()),
            _ => None,
        })
        .expect("a notice")
}

#[test]
fn a_switch_to_a_model_without_vision_says_the_screenshots_are_left_out() {
    let (mut sim, _, images) = screenshot_run(122, 1000);
    assert_eq!(images.len(), 1);
    let conn = sim.connect();
    let thread = sim.store.threads.keys().next().unwrap().clone();
    let mut profile = sim.profile.clone();
    profile.model = "text-only".into();
    profile.vision = false;
    sim.engine.handle_settings(profile.clone());
    sim.send(conn, submit("s2", Some(&thread), "And now?"));
    sim.run(10_000);
    let notice = last_notice(&sim);
    assert!(
        notice.contains("to text-only") && notice.contains("no vision"),
        "{notice}"
    );
    // Back to a model with vision: nothing is left out, nothing is said.
    profile.model = "sees-all".into();
    profile.vision = true;
    sim.engine.handle_settings(profile);
    sim.send(conn, submit("s3", Some(&thread), "And again?"));
    sim.run(10_000);
    let notice = last_notice(&sim);
    assert!(
        notice.contains("to sees-all") && !notice.contains("vision"),
        "{notice}"
    );
}

fn snapshots_with(details: Vec<Option<Value>>) -> sw_agent::sim::ToolFn {
    let details = Rc::new(RefCell::new(details.into_iter()));
    Box::new(move |_: &str, _: &Value| ToolOutcome {
        ok: true,
        content: "Outline: [e1] button \"Subscribe\"".into(),
        details: details.borrow_mut().next().expect("scripted"),
        images: vec![],
    })
}

#[test]
fn details_without_a_page_address_are_kept_and_null_ones_are_no_details() {
    // An embedder's tool may say nothing of the page it read (no `url`: no
    // diff, but its details stay) or answer `null` (read back from the
    // store as no details, so it is none in memory too).
    let mut sim = Sim::new(
        141,
        snapshot_policy(2),
        snapshots_with(vec![Some(json!({ "rows": 3 })), Some(Value::Null)]),
    );
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "Look twice"));
    sim.run(10_000);
    let results = snapshot_results(&sim);
    assert_eq!(results[0].2, Some(json!({ "rows": 3 })));
    assert_eq!(results[1].2, None);
    // The snapshot a panel gets now is the one it gets after a restart.
    let tid = sim.store.threads.keys().next().unwrap().clone();
    let snapshot_of = |sim: &mut Sim| {
        let conn = sim.connect();
        sim.send(conn, initialize("i", Some(&tid)));
        sim.run(10_000);
        sim.events_for(conn)
            .iter()
            .find_map(|e| match e {
                sw_agent::protocol::Event::Initialized { snapshot } => {
                    Some(serde_json::to_string(&snapshot.thread).unwrap())
                }
                _ => None,
            })
            .expect("initialized")
    };
    let before = snapshot_of(&mut sim);
    sim.crash();
    assert_eq!(snapshot_of(&mut sim), before);
}

/// The side panel shows an extension tool's details as data, and a
/// built-in tool's only as thumbnails and diffs: it tells them apart by a
/// list of the built-in names (www/panel.js `BUILT_IN_TOOL_NAMES`), which
/// must be the registry's.
#[test]
fn the_panel_knows_every_built_in_tool_by_name() {
    let panel = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/www/panel.js"))
        .expect("www/panel.js");
    let start = panel
        .find("const BUILT_IN_TOOL_NAMES = new Set([")
        .expect("the list in panel.js");
    let list = &panel[start..];
    let list = &list[list.find('[').unwrap() + 1..list.find("])").unwrap()];
    let mut listed: Vec<String> = list
        .split(',')
        .map(|name| name.trim().trim_matches('"').to_string())
        .filter(|name| !name.is_empty())
        .collect();
    let mut built_in: Vec<String> = sw_agent::tools::ToolRegistry::page_tools()
        .descriptors()
        .iter()
        .map(|d| d.name.clone())
        .collect();
    sw_agent::sorting::sort(&mut listed);
    sw_agent::sorting::sort(&mut built_in);
    assert_eq!(listed, built_in);
}
