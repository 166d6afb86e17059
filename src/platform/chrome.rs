//! Bindings to the chrome.* APIs the engine uses, and small typed wrappers.
//! Every wrapper returns `Result<_, JsError>`; nothing here decides anything.

use js_sys::{Array, Object, Promise, Reflect};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;

use super::error::{js_to_error, JsError};

#[wasm_bindgen]
extern "C" {
    #[wasm_bindgen(js_namespace = ["chrome", "runtime"], js_name = id, thread_local_v2)]
    static RUNTIME_ID: JsValue;

    #[wasm_bindgen(catch, js_namespace = ["chrome", "storage", "local"], js_name = get)]
    fn storage_local_get(keys: &JsValue) -> Result<Promise, JsValue>;

    #[wasm_bindgen(catch, js_namespace = ["chrome", "storage", "local"], js_name = set)]
    fn storage_local_set(items: &JsValue) -> Result<Promise, JsValue>;

    #[wasm_bindgen(catch, js_namespace = ["chrome", "storage", "local"], js_name = remove)]
    fn storage_local_remove(keys: &JsValue) -> Result<Promise, JsValue>;

    #[wasm_bindgen(catch, js_namespace = ["chrome", "identity"], js_name = launchWebAuthFlow)]
    fn identity_launch_web_auth_flow(details: &JsValue) -> Result<Promise, JsValue>;

    #[wasm_bindgen(catch, js_namespace = ["chrome", "identity"], js_name = getRedirectURL)]
    fn identity_get_redirect_url(path: &str) -> Result<JsValue, JsValue>;

    #[wasm_bindgen(catch, js_namespace = ["chrome", "alarms"], js_name = create)]
    fn alarms_create(name: &str, info: &JsValue) -> Result<Promise, JsValue>;

    #[wasm_bindgen(catch, js_namespace = ["chrome", "alarms"], js_name = clear)]
    fn alarms_clear(name: &str) -> Result<Promise, JsValue>;

    #[wasm_bindgen(catch, js_namespace = ["chrome", "runtime"], js_name = getPlatformInfo)]
    fn runtime_get_platform_info() -> Result<Promise, JsValue>;

    #[wasm_bindgen(catch, js_namespace = ["chrome", "scripting"], js_name = executeScript)]
    fn scripting_execute_script(injection: &JsValue) -> Result<Promise, JsValue>;

    #[wasm_bindgen(catch, js_namespace = ["chrome", "tabs"], js_name = query)]
    fn tabs_query(query: &JsValue) -> Result<Promise, JsValue>;

    #[wasm_bindgen(catch, js_namespace = ["chrome", "tabs"], js_name = update)]
    fn tabs_update(tab_id: i32, props: &JsValue) -> Result<Promise, JsValue>;

    #[wasm_bindgen(catch, js_namespace = ["chrome", "tabs"], js_name = captureVisibleTab)]
    fn tabs_capture_visible_tab(window_id: i32, options: &JsValue) -> Result<Promise, JsValue>;

    #[wasm_bindgen(catch, js_namespace = ["chrome", "tabs"], js_name = goBack)]
    fn tabs_go_back(tab_id: i32) -> Result<Promise, JsValue>;

    #[wasm_bindgen(catch, js_namespace = ["chrome", "windows"], js_name = update)]
    fn windows_update(window_id: i32, props: &JsValue) -> Result<Promise, JsValue>;

    #[wasm_bindgen(catch, js_namespace = ["chrome", "tabs"], js_name = get)]
    fn tabs_get(tab_id: i32) -> Result<Promise, JsValue>;

    #[wasm_bindgen(catch, js_namespace = ["chrome", "tabs"], js_name = connect)]
    fn tabs_connect(tab_id: i32, info: &JsValue) -> Result<JsValue, JsValue>;

    #[wasm_bindgen(catch, js_namespace = ["chrome", "webNavigation"], js_name = getFrame)]
    fn web_navigation_get_frame(details: &JsValue) -> Result<Promise, JsValue>;

    #[wasm_bindgen(catch, js_namespace = ["chrome", "webNavigation"], js_name = getAllFrames)]
    fn web_navigation_get_all_frames(details: &JsValue) -> Result<Promise, JsValue>;

    #[wasm_bindgen(catch, js_namespace = ["chrome", "sidePanel"], js_name = setPanelBehavior)]
    fn side_panel_set_behavior(behavior: &JsValue) -> Result<Promise, JsValue>;
}

/// `chrome-extension://<id>`: the origin of this extension's own pages.
pub fn own_origin() -> String {
    let id = RUNTIME_ID.with(|v| v.as_string()).unwrap_or_default();
    if id.is_empty() {
        String::new()
    } else {
        format!("chrome-extension://{id}")
    }
}

fn object(pairs: &[(&str, JsValue)]) -> JsValue {
    let o = Object::new();
    for (k, v) in pairs {
        let _ = Reflect::set(&o, &JsValue::from_str(k), v);
    }
    o.into()
}

pub fn get(value: &JsValue, key: &str) -> JsValue {
    Reflect::get(value, &JsValue::from_str(key)).unwrap_or(JsValue::UNDEFINED)
}

async fn await_promise(p: Result<Promise, JsValue>) -> Result<JsValue, JsError> {
    let p = p.map_err(js_to_error)?;
    JsFuture::from(p).await.map_err(js_to_error)
}

/// The stored `settings` object (or undefined).
pub async fn load_settings() -> Result<JsValue, JsError> {
    let all = await_promise(storage_local_get(&JsValue::from_str("settings"))).await?;
    Ok(get(&all, "settings"))
}

/// What a start reads of `chrome.storage.local`: the `settings` and the
/// `mcpUserServers` the side panel stored and the `mcpCatalog` the last
/// worker kept (an object with those keys; each may be missing).
pub async fn load_start_storage() -> Result<JsValue, JsError> {
    let keys = Array::of3(
        &JsValue::from_str("settings"),
        &JsValue::from_str("mcpCatalog"),
        &JsValue::from_str("mcpUserServers"),
    );
    await_promise(storage_local_get(&keys)).await
}

/// Store `value` (JSON data) under `key` in `chrome.storage.local`.
pub async fn store_local(key: &str, value: &serde_json::Value) -> Result<(), JsError> {
    let value = super::boundary::to_js(value).map_err(|message| JsError {
        name: "TypeError".into(),
        message,
    })?;
    await_promise(storage_local_set(&object(&[(key, value)]))).await?;
    Ok(())
}

/// The JSON value kept under `key` in `chrome.storage.local` (null when
/// there is none).
pub async fn load_local(key: &str) -> Result<serde_json::Value, JsError> {
    let all = await_promise(storage_local_get(&JsValue::from_str(key))).await?;
    Ok(super::boundary::from_js_value(get(&all, key)))
}

/// The JSON values kept under each of `keys` in `chrome.storage.local`,
/// in one read (null where there is none).
pub async fn load_locals(keys: &[String]) -> Result<Vec<serde_json::Value>, JsError> {
    let list: Array = keys.iter().map(|k| JsValue::from_str(k)).collect();
    let all = await_promise(storage_local_get(&list)).await?;
    Ok(keys
        .iter()
        .map(|key| super::boundary::from_js_value(get(&all, key)))
        .collect())
}

/// Every key of `chrome.storage.local`.
pub async fn local_keys() -> Result<Vec<String>, JsError> {
    let all = await_promise(storage_local_get(&JsValue::NULL)).await?;
    Ok(Object::keys(all.unchecked_ref::<Object>())
        .iter()
        .filter_map(|k| k.as_string())
        .collect())
}

pub async fn remove_local(key: &str) -> Result<(), JsError> {
    await_promise(storage_local_remove(&JsValue::from_str(key)))
        .await
        .map(|_| ())
}

/// The address a sign-in window comes back to (`chrome.identity`): the
/// extension's own `https://<id>.chromiumapp.org/<path>`.
pub fn redirect_url(path: &str) -> Result<String, JsError> {
    identity_get_redirect_url(path)
        .map_err(js_to_error)?
        .as_string()
        .ok_or_else(|| JsError {
            name: "TypeError".into(),
            message: "chrome.identity.getRedirectURL gave no address".into(),
        })
}

/// Open a sign-in window at `url` and wait until it comes back to the
/// extension's redirect address (its whole URL) or the user closes it.
pub async fn launch_web_auth_flow(url: &str) -> Result<String, JsError> {
    let details = object(&[
        ("url", JsValue::from_str(url)),
        ("interactive", JsValue::TRUE),
    ]);
    let answer = await_promise(identity_launch_web_auth_flow(&details)).await?;
    answer.as_string().ok_or_else(|| JsError {
        name: "Error".into(),
        message: "the sign-in window came back without an address".into(),
    })
}

pub async fn set_alarm(name: &str, period_minutes: f64) -> Result<(), JsError> {
    let info = object(&[("periodInMinutes", JsValue::from_f64(period_minutes))]);
    await_promise(alarms_create(name, &info)).await.map(|_| ())
}

pub async fn clear_alarm(name: &str) -> Result<(), JsError> {
    await_promise(alarms_clear(name)).await.map(|_| ())
}

/// A cheap extension-API call whose only purpose is to count as activity:
/// Chrome resets a worker's idle timer on every extension-API call.
pub async fn keepalive() -> Result<(), JsError> {
    await_promise(runtime_get_platform_info()).await.map(|_| ())
}

pub async fn open_panel_on_action_click() -> Result<(), JsError> {
    let behavior = object(&[("openPanelOnActionClick", JsValue::TRUE)]);
    await_promise(side_panel_set_behavior(&behavior))
        .await
        .map(|_| ())
}

/// A tab as far as tool targeting cares.
#[derive(Debug, Clone, PartialEq)]
pub struct TabInfo {
    pub id: i32,
    pub url: String,
    pub title: String,
    pub active: bool,
    pub last_accessed: f64,
    pub window_id: i32,
    /// `loading` or `complete`.
    pub status: String,
}

impl TabInfo {
    fn from_js(t: &JsValue) -> Option<TabInfo> {
        Some(TabInfo {
            id: get(t, "id").as_f64()? as i32,
            url: get(t, "url").as_string().unwrap_or_default(),
            title: get(t, "title").as_string().unwrap_or_default(),
            active: get(t, "active").as_bool().unwrap_or(false),
            last_accessed: get(t, "lastAccessed").as_f64().unwrap_or(0.0),
            window_id: get(t, "windowId").as_f64().unwrap_or(-1.0) as i32,
            status: get(t, "status").as_string().unwrap_or_default(),
        })
    }

    /// The tool target this tab is.
    pub fn into_target(self) -> crate::gatekeeper::TargetInfo {
        crate::gatekeeper::TargetInfo {
            tab_id: i64::from(self.id),
            origin: crate::gatekeeper::origin_of(&self.url),
            host_permission: host_permission(&self.url),
            url: self.url,
            title: self.title,
            ..Default::default()
        }
    }
}

/// Whether the extension's host permissions cover a URL: every http(s)
/// page (`<all_urls>`); file pages need the user's "Allow access to file
/// URLs", which the injection itself then checks.
pub fn host_permission(url: &str) -> bool {
    url.starts_with("http://") || url.starts_with("https://") || url.starts_with("file://")
}

/// One frame of a tab as `webNavigation.getFrame` reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct FrameInfo {
    pub url: String,
    /// -1 for the top document.
    pub parent_frame_id: i64,
    /// Chrome's id of the document the frame shows (a new one for every
    /// page load, the same across same-document navigations); None when
    /// Chrome does not say.
    pub document_id: Option<String>,
}

/// A frame of a tab by Chrome's frame id; None when it does not exist (any more).
pub async fn get_frame(tab_id: i32, frame_id: u32) -> Result<Option<FrameInfo>, JsError> {
    let details = object(&[
        ("tabId", JsValue::from(tab_id)),
        ("frameId", JsValue::from(frame_id)),
    ]);
    let frame = await_promise(web_navigation_get_frame(&details)).await?;
    if frame.is_null() || frame.is_undefined() {
        return Ok(None);
    }
    Ok(Some(FrameInfo {
        url: get(&frame, "url").as_string().unwrap_or_default(),
        parent_frame_id: get(&frame, "parentFrameId").as_f64().unwrap_or(-1.0) as i64,
        document_id: get(&frame, "documentId")
            .as_string()
            .filter(|id| !id.is_empty()),
    }))
}

/// One tab by id.
pub async fn get_tab(tab_id: i32) -> Result<TabInfo, JsError> {
    let tab = await_promise(tabs_get(tab_id)).await?;
    TabInfo::from_js(&tab).ok_or_else(|| JsError {
        name: "TypeError".into(),
        message: "tabs.get returned no tab".into(),
    })
}

/// All tabs, or only the active tab of the last focused window.
pub async fn query_tabs(active_in_last_focused: bool) -> Result<Vec<TabInfo>, JsError> {
    let query = if active_in_last_focused {
        object(&[
            ("active", JsValue::TRUE),
            ("lastFocusedWindow", JsValue::TRUE),
        ])
    } else {
        Object::new().into()
    };
    let tabs = await_promise(tabs_query(&query)).await?;
    Ok(Array::from(&tabs)
        .iter()
        .filter_map(|t| TabInfo::from_js(&t))
        .collect())
}

/// Every frame of a tab (the top document included).
pub async fn get_all_frames(tab_id: i32) -> Result<Vec<crate::frames::KnownFrame>, JsError> {
    let details = object(&[("tabId", JsValue::from(tab_id))]);
    let frames = await_promise(web_navigation_get_all_frames(&details)).await?;
    if frames.is_null() || frames.is_undefined() {
        return Ok(Vec::new());
    }
    Ok(Array::from(&frames)
        .iter()
        .filter_map(|f| {
            Some(crate::frames::KnownFrame {
                frame_id: get(&f, "frameId").as_f64()? as u32,
                parent_frame_id: get(&f, "parentFrameId").as_f64().unwrap_or(-1.0) as i64,
                url: get(&f, "url").as_string().unwrap_or_default(),
            })
        })
        .collect())
}

/// Inject the page-tool content script into one frame of a tab (0: the top
/// document); idempotent on the page side.
pub async fn inject_content_script(
    tab_id: i32,
    frame_id: u32,
    document: Option<&str>,
) -> Result<(), JsError> {
    // A document id names the frame too (Chrome takes one or the other).
    let target = match document {
        Some(id) => object(&[
            ("tabId", JsValue::from(tab_id)),
            ("documentIds", Array::of1(&JsValue::from_str(id)).into()),
        ]),
        None => object(&[
            ("tabId", JsValue::from(tab_id)),
            ("frameIds", Array::of1(&JsValue::from(frame_id)).into()),
        ]),
    };
    let injection = object(&[
        ("target", target),
        (
            "files",
            Array::of1(&JsValue::from_str("content/content.js")).into(),
        ),
    ]);
    await_promise(scripting_execute_script(&injection))
        .await
        .map(|_| ())
}

/// Open a Port to the content script of one frame of a tab. Always with a
/// frame id: without one Chrome connects every frame's script at once.
/// With a document id, only that document's script (another document the
/// frame loaded meanwhile gets nothing; the Port closes unanswered).
pub fn connect_frame(
    tab_id: i32,
    frame_id: u32,
    document: Option<&str>,
    name: &str,
) -> Result<JsValue, JsError> {
    let mut fields = vec![
        ("name", JsValue::from_str(name)),
        ("frameId", JsValue::from(frame_id)),
    ];
    if let Some(id) = document {
        fields.push(("documentId", JsValue::from_str(id)));
    }
    let info = object(&fields);
    tabs_connect(tab_id, &info).map_err(js_to_error)
}

/// Load `url` in a tab.
pub async fn navigate_tab(tab_id: i32, url: &str) -> Result<(), JsError> {
    let props = object(&[("url", JsValue::from_str(url))]);
    await_promise(tabs_update(tab_id, &props)).await.map(|_| ())
}

/// Go back in a tab's history.
pub async fn go_back(tab_id: i32) -> Result<(), JsError> {
    await_promise(tabs_go_back(tab_id)).await.map(|_| ())
}

/// Make a tab active and focus its window.
pub async fn activate_tab(tab: &TabInfo) -> Result<(), JsError> {
    await_promise(tabs_update(tab.id, &object(&[("active", JsValue::TRUE)]))).await?;
    await_promise(windows_update(
        tab.window_id,
        &object(&[("focused", JsValue::TRUE)]),
    ))
    .await
    .map(|_| ())
}

/// A JPEG data URL of what the window's active tab shows.
pub async fn capture_visible(window_id: i32) -> Result<String, JsError> {
    let options = object(&[
        ("format", JsValue::from_str("jpeg")),
        ("quality", JsValue::from(70)),
    ]);
    let url = await_promise(tabs_capture_visible_tab(window_id, &options)).await?;
    url.as_string().ok_or_else(|| JsError {
        name: "TypeError".into(),
        message: "captureVisibleTab returned no image".into(),
    })
}
