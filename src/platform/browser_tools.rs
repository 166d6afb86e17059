//! Tools the driver runs with the tabs API instead of a content script:
//! navigation, screenshots and the tab list.

use gloo_timers::future::TimeoutFuture;
use serde_json::{json, Value};
use wasm_bindgen::prelude::*;

use super::chrome::{self, TabInfo};
use super::image::Bitmap;
use crate::engine::ToolOutcome;
use crate::gatekeeper::TargetInfo;
use crate::model::{
    ImageData, MAX_RESULT_IMAGE_CHARS, MAX_THUMBNAIL_CHARS, SCREENSHOT_MAX_SIDE, THUMBNAIL_MAX_SIDE,
};

/// How long navigation may take before the tool reports what it has.
const LOAD_TIMEOUT_MS: u32 = 20_000;
/// How long a navigation that seems not to have left the old page gets to
/// start after all (before it counts as having stayed).
const STAYED_RECHECK_MS: u32 = 500;

#[wasm_bindgen]
extern "C" {
    /// The URL parser (`new URL(text)`), to compare URLs as Chrome writes them.
    #[wasm_bindgen(js_name = URL)]
    type ParsedUrl;

    #[wasm_bindgen(constructor, catch, js_class = "URL")]
    fn parse(url: &str) -> Result<ParsedUrl, JsValue>;

    #[wasm_bindgen(method, getter)]
    fn href(this: &ParsedUrl) -> String;
}

/// Chrome's id of the document the tab's top frame shows, or None when
/// Chrome does not say.
async fn top_document_id(tab_id: i32) -> Option<String> {
    chrome::get_frame(tab_id, 0).await.ok()??.document_id
}

/// `url` as the URL parser writes it (`https://a.example` →
/// `https://a.example/`); unchanged when it does not parse.
fn normalized(url: &str) -> String {
    ParsedUrl::parse(url).map_or_else(|_| url.to_string(), |u| u.href())
}

/// The tab before a navigation: its URL, title and top document.
struct Departure {
    url: String,
    title: String,
    document: Option<String>,
}

impl Departure {
    async fn of(tab_id: i32) -> Departure {
        let tab = chrome::get_tab(tab_id).await.ok();
        Departure {
            url: tab.as_ref().map(|t| t.url.clone()).unwrap_or_default(),
            title: tab.map(|t| t.title).unwrap_or_default(),
            document: top_document_id(tab_id).await,
        }
    }

    /// Whether the tab still shows the page it showed before: the same
    /// document at the same URL (a same-document navigation, to a
    /// `#fragment` or by the History API, changes the URL). Without
    /// document ids, the same URL when another one was requested.
    fn stayed(&self, requested: &str, tab: &TabInfo, document: Option<&str>) -> bool {
        if tab.url != self.url {
            return false;
        }
        match (self.document.as_deref(), document) {
            // Asking for the URL it is on, with a #fragment, only scrolls.
            (Some(before), Some(after)) => {
                before == after && !(requested.contains('#') && normalized(requested) == tab.url)
            }
            _ => normalized(requested) != normalized(&self.url),
        }
    }

    /// Whether a move back in history left the tab where it was: the same
    /// document at the same URL (a same-document entry changes the URL;
    /// an entry of another document, from the back/forward cache or not,
    /// is another document). Without document ids, the same URL.
    fn went_nowhere(&self, tab: &TabInfo, document: Option<&str>) -> bool {
        tab.url == self.url
            && match (self.document.as_deref(), document) {
                (Some(before), Some(after)) => before == after,
                _ => true,
            }
    }

    /// `"title" url` of the page left (or not).
    fn named(&self) -> String {
        format!("\"{}\" {}", self.title, self.url)
    }
}

/// The tab once the navigation begun from `before` has loaded (or
/// `LOAD_TIMEOUT_MS` passed), given `STAYED_RECHECK_MS` more when it seems
/// not to have left (`stayed`): the navigation may not have started yet.
/// The tab, whether it loaded, and its top document.
async fn arrival(
    tab_id: i32,
    stayed: &dyn Fn(&TabInfo, Option<&str>) -> bool,
) -> Result<(TabInfo, bool, Option<String>), String> {
    let (mut tab, mut complete) = wait_loaded(tab_id).await?;
    let mut document = top_document_id(tab_id).await;
    if complete && stayed(&tab, document.as_deref()) {
        TimeoutFuture::new(STAYED_RECHECK_MS).await;
        (tab, complete) = wait_loaded(tab_id).await?;
        document = top_document_id(tab_id).await;
    }
    Ok((tab, complete, document))
}

/// `navigate`: load `url` in the tab and say where the tab really is then.
/// A response without a page (204 No Content), a download, or a navigation
/// the page's "Leave site?" prompt cancelled leaves the tab on the old page:
/// that is an error, so the model does not act on the old page as if it
/// were the new one. A redirect is fine and says where it ended.
async fn navigate(tab_id: i32, url: &str) -> Result<ToolOutcome, String> {
    let before = Departure::of(tab_id).await;
    chrome::navigate_tab(tab_id, url)
        .await
        .map_err(|e| format!("Could not open {url}: {e}"))?;
    let (tab, complete, document) =
        arrival(tab_id, &|tab, document| before.stayed(url, tab, document)).await?;
    if before.stayed(url, &tab, document.as_deref()) {
        let old = before.named();
        return Err(if complete {
            format!(
                "The tab stayed on {old}: opening {url} did not show a new page (the server may have \
                 answered without one, e.g. 204 No Content, the URL may have started a download, or the \
                 page cancelled leaving or is still asking \"Leave site?\"). Call page_snapshot to see \
                 what it shows now."
            )
        } else {
            format!(
                "The tab still shows {old} after {} s: {url} has not loaded (the server may be slow, or a \
                 \"Leave site?\" prompt may be waiting for the user). Call page_snapshot before acting on the page.",
                LOAD_TIMEOUT_MS / 1000
            )
        });
    }
    if normalized(url) == normalized(&tab.url) {
        return loaded(tab, complete, "Loaded");
    }
    let note = if complete {
        ""
    } else {
        " (still loading after 20 s)"
    };
    ok(
        format!(
            "Loaded: \"{}\" {} (redirected from {url}){note}. Call page_snapshot to see it.",
            tab.title, tab.url
        ),
        json!({ "url": tab.url, "title": tab.title, "requested": url }),
    )
}

fn ok(content: String, details: Value) -> Result<ToolOutcome, String> {
    Ok(ToolOutcome {
        ok: true,
        content,
        details: Some(details),
        images: Vec::new(),
    })
}

/// Wait until the tab finished loading (or the timeout passed).
async fn wait_loaded(tab_id: i32) -> Result<(TabInfo, bool), String> {
    // Give the navigation a moment to start before polling for completion.
    TimeoutFuture::new(100).await;
    let mut waited = 100;
    loop {
        let tab = chrome::get_tab(tab_id)
            .await
            .map_err(|e| format!("The tab was closed during navigation ({e})."))?;
        if tab.status == "complete" || waited >= LOAD_TIMEOUT_MS {
            return Ok((tab.clone(), tab.status == "complete"));
        }
        TimeoutFuture::new(200).await;
        waited += 200;
    }
}

fn loaded(tab: TabInfo, complete: bool, what: &str) -> Result<ToolOutcome, String> {
    let note = if complete {
        ""
    } else {
        " (still loading after 20 s)"
    };
    ok(
        format!(
            "{what}: \"{}\" {}{note}. Call page_snapshot to see it.",
            tab.title, tab.url
        ),
        json!({ "url": tab.url, "title": tab.title }),
    )
}

/// `go_back`: the previous page of the tab's history, and where the tab
/// really is then. A move the page's "Leave site?" prompt cancelled (or an
/// earlier entry that showed no page) leaves the tab where it was: an
/// error, as for `navigate`, so the model does not take the old page for
/// the earlier one.
async fn go_back(tab_id: i32) -> Result<ToolOutcome, String> {
    let before = Departure::of(tab_id).await;
    chrome::go_back(tab_id)
        .await
        .map_err(|e| format!("Could not go back: {e} (maybe there is no earlier page)."))?;
    let (tab, complete, document) =
        arrival(tab_id, &|tab, document| before.went_nowhere(tab, document)).await?;
    if before.went_nowhere(&tab, document.as_deref()) {
        let old = before.named();
        return Err(if complete {
            format!(
                "The tab stayed on {old}: going back did not leave it (the page may have cancelled \
                 leaving or be still asking \"Leave site?\", the earlier page may not have loaded, or the \
                 page changed its view in place). Call page_snapshot to see what it shows now."
            )
        } else {
            format!(
                "The tab still shows {old} after {} s: the earlier page has not loaded (a \"Leave \
                 site?\" prompt may be waiting for the user). Call page_snapshot before acting on the page.",
                LOAD_TIMEOUT_MS / 1000
            )
        });
    }
    loaded(tab, complete, "Went back to")
}

/// `navigate` and `go_back` on the approved tab.
pub async fn tab_tool(
    name: &str,
    params: &Value,
    target: &TargetInfo,
) -> Result<ToolOutcome, String> {
    let tab_id = target.tab_id as i32;
    match name {
        "navigate" => {
            let url = params
                .get("url")
                .and_then(Value::as_str)
                .unwrap_or("")
                .trim();
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(format!(
                    "navigate needs an absolute http(s) URL; got {url:?}."
                ));
            }
            navigate(tab_id, url).await
        }
        "go_back" => go_back(tab_id).await,
        "screenshot" => screenshot(tab_id).await,
        other => Err(format!("Unknown tab tool {other}.")),
    }
}

/// `screenshot`: what the tab shows, as a JPEG for the model (at most
/// `SCREENSHOT_MAX_SIDE` px on its longer side and `MAX_RESULT_IMAGE_CHARS`
/// of base64, recompressed until it fits), and a thumbnail data URL for the
/// side panel in `details.thumbnail` (at most `THUMBNAIL_MAX_SIDE` px and
/// `MAX_THUMBNAIL_CHARS`; left out when larger or when encoding failed).
async fn screenshot(tab_id: i32) -> Result<ToolOutcome, String> {
    let tab = chrome::get_tab(tab_id)
        .await
        .map_err(|e| format!("The tab is gone ({e})."))?;
    if !tab.active {
        return Err("The tab is not the visible one in its window; call switch_tab first.".into());
    }
    let captured = chrome::capture_visible(tab.window_id)
        .await
        .map_err(|e| format!("Could not capture the tab: {e}"))?;
    let unreadable =
        |e: super::error::JsError| format!("The browser returned an unreadable image ({e}).");
    let bitmap = Bitmap::decode(&captured).await.map_err(unreadable)?;
    let (width, height) = (bitmap.width(), bitmap.height());
    let mut image =
        ImageData::from_data_url(&captured).ok_or("The browser returned an unreadable image.")?;
    let (mut sent_width, mut sent_height) = (width, height);
    let fits = |image: &ImageData, w: u32, h: u32| {
        image.data.len() <= MAX_RESULT_IMAGE_CHARS && w.max(h) <= SCREENSHOT_MAX_SIDE
    };
    // Smaller and smaller until it fits (a normal viewport fits at once).
    for (side, quality) in [
        (SCREENSHOT_MAX_SIDE, 0.7),
        (SCREENSHOT_MAX_SIDE, 0.5),
        (960, 0.5),
        (640, 0.4),
    ] {
        if fits(&image, sent_width, sent_height) {
            break;
        }
        (image, sent_width, sent_height) = bitmap.jpeg(side, quality).await.map_err(unreadable)?;
    }
    if !fits(&image, sent_width, sent_height) {
        return Err("The screenshot stayed too large even after scaling it down; use page_snapshot instead.".into());
    }
    let mut details = json!({
        "url": tab.url,
        "title": tab.title,
        "width": sent_width,
        "height": sent_height,
        "bytes": image.data.len() * 3 / 4,
    });
    match bitmap.jpeg(THUMBNAIL_MAX_SIDE, 0.6).await {
        Ok((thumbnail, w, h)) if thumbnail.data_url().len() <= MAX_THUMBNAIL_CHARS => {
            details["thumbnail"] = json!(thumbnail.data_url());
            details["thumbnailWidth"] = json!(w);
            details["thumbnailHeight"] = json!(h);
        }
        Ok(_) => details["thumbnailError"] = json!("too large"),
        Err(e) => details["thumbnailError"] = json!(e.to_string()),
    }
    let note = if (sent_width, sent_height) == (width, height) {
        String::new()
    } else {
        format!(", scaled down from {width}×{height}")
    };
    Ok(ToolOutcome {
        ok: true,
        content: format!(
            "Screenshot of \"{}\" {} ({sent_width}×{sent_height} JPEG, {} KB{note}).",
            tab.title,
            tab.url,
            image.data.len() * 3 / 4 / 1024
        ),
        details: Some(details),
        images: vec![image],
    })
}

/// `list_tabs` and `switch_tab`.
pub async fn browser_tool(name: &str, params: &Value) -> Result<ToolOutcome, String> {
    let tabs = chrome::query_tabs(false)
        .await
        .map_err(|e| format!("Could not list tabs: {e}"))?;
    let own = chrome::own_origin();
    let visible: Vec<&TabInfo> = tabs
        .iter()
        .filter(|t| own.is_empty() || !t.url.starts_with(&own))
        .collect();
    match name {
        "list_tabs" => {
            let lines: Vec<String> = visible
                .iter()
                .map(|t| {
                    let active = if t.active { " (active)" } else { "" };
                    format!("[{}]{active} \"{}\" {}", t.id, t.title, t.url)
                })
                .collect();
            let details: Vec<Value> = visible
                .iter()
                .map(|t| json!({ "id": t.id, "title": t.title, "url": t.url, "active": t.active }))
                .collect();
            ok(
                format!("{} open tabs:\n{}", lines.len(), lines.join("\n")),
                json!({ "tabs": details }),
            )
        }
        "switch_tab" => {
            let id = params.get("tab_id").and_then(Value::as_i64).unwrap_or(-1);
            let tab = visible
                .iter()
                .find(|t| i64::from(t.id) == id)
                .ok_or_else(|| {
                    format!("There is no tab {id}; call list_tabs for the current ids.")
                })?;
            chrome::activate_tab(tab)
                .await
                .map_err(|e| format!("Could not switch to tab {id}: {e}"))?;
            ok(
                format!("Switched to tab {id}: \"{}\" {}.", tab.title, tab.url),
                json!({ "id": id, "url": tab.url }),
            )
        }
        other => Err(format!("Unknown browser tool {other}.")),
    }
}
