//! The gatekeeper: may this tool call run on this target, ask the user
//! first, or never run?
//!
//! Owns: the decision table (tool effects, level, target origin, host
//! permission, persisted site rules) as a pure function.
//!
//! Must not: do IO or remember anything (site rules and approvals are
//! durable records the engine passes in).

use serde::{Deserialize, Serialize};

use crate::model::SiteRule;
pub use crate::model::TargetElement;
use crate::tools::{Effects, Level, ToolDescriptor};

/// The page a tool call would act on, as the driver resolved it.
///
/// When the call acts inside a child frame (a ref like `f7:e12`), `url`,
/// `origin` and `host_permission` are the frame's: the gatekeeper judges the
/// origin actually acted on, and site rules apply to it; `page_url` then
/// names the tab's own page.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TargetInfo {
    pub tab_id: i64,
    pub url: String,
    /// `scheme://host[:port]`, or the scheme alone for opaque URLs.
    pub origin: String,
    #[serde(default)]
    pub title: String,
    /// Whether the extension's host permissions cover this page.
    pub host_permission: bool,
    /// Chrome's frame id when the call acts in a child frame (None: the
    /// tab's top document).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frame_id: Option<i64>,
    /// The tab's top-level URL when the call acts in a child frame.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_url: Option<String>,
    /// Chrome's id of the document (of the frame acted in) when the call
    /// was resolved: a write acts on that document only, not on another
    /// page of the same site the tab moved to while the user was asked
    /// (None: Chrome did not say; the origin is still checked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub document_id: Option<String>,
    /// The element a write through a ref (or by its visible text) would
    /// act on, as the page describes it when the call is resolved: what
    /// the approval card shows, and what the write must still find (None:
    /// the call names no element, or the page could not describe it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub element: Option<TargetElement>,
}

/// The gatekeeper's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    Ask,
    /// Never run; the text says why (the model sees it).
    Deny(String),
}

/// The origin of a URL (`https://a.example:8443`), or its scheme for URLs
/// without a host (`file://`, `about:`).
pub fn origin_of(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url
            .split(':')
            .next()
            .map(|s| format!("{s}:"))
            .unwrap_or_default();
    };
    format!(
        "{}://{}",
        scheme.to_ascii_lowercase(),
        authority_of(rest).to_ascii_lowercase()
    )
}

/// Whether an origin names a site, i.e. has a host: `file://` (every
/// local file) and `about:`/`data:` pages have none, so "allow on this
/// site" would allow them all; they are asked about every time.
pub fn is_site(origin: &str) -> bool {
    origin
        .split_once("://")
        .is_some_and(|(scheme, host)| !scheme.is_empty() && !host.is_empty())
}

/// The host and port of what follows a URL's `scheme://` (or of a URL
/// without a scheme), without credentials: they are not part of an origin.
pub fn authority_of(rest: &str) -> &str {
    let host = rest.split(['/', '?', '#']).next().unwrap_or("");
    host.rsplit('@').next().unwrap_or(host)
}

/// Why Chrome (or policy) forbids acting on a page, if it does.
pub fn restricted_reason(target: &TargetInfo) -> Option<String> {
    let o = target.origin.as_str();
    let browser_page = [
        "chrome:",
        "chrome://",
        "edge://",
        "about:",
        "devtools://",
        "view-source:",
        "chrome-extension://",
        "chrome-search://",
    ]
    .iter()
    .any(|p| o.starts_with(p) || target.url.starts_with(p));
    let store = o == "https://chromewebstore.google.com"
        || (o == "https://chrome.google.com" && target.url.contains("/webstore"));
    if browser_page || store {
        return Some(format!(
            "Chrome does not let extensions act on {} (browser pages and the Web Store are off limits). Ask the user to open a normal web page.",
            target.url
        ));
    }
    if !target.host_permission {
        return Some(format!(
            "The extension has no permission to access {}. The user can grant it in the extension's site access settings.",
            target.origin
        ));
    }
    None
}

/// The decision table.
///
/// | tool | target | rule | verdict |
/// |---|---|---|---|
/// | any page tool | restricted page or no host permission | – | deny |
/// | read (any level but mcp) | allowed page | – | allow |
/// | write | allowed page | site rule allows writes | allow |
/// | write | allowed page | none | ask |
/// | mcp | – | – | ask |
/// | read without a tab (tab list) | – | – | allow |
/// | write without a tab | – | – | ask |
pub fn verdict(
    tool: &ToolDescriptor,
    target: Option<&TargetInfo>,
    rule: Option<&SiteRule>,
) -> Verdict {
    if tool.level == Level::Mcp {
        return Verdict::Ask;
    }
    let write_verdict = |origin: Option<&str>| {
        let allowed = origin.is_some_and(|o| rule.is_some_and(|r| r.origin == o && r.allow_writes));
        if allowed {
            Verdict::Allow
        } else {
            Verdict::Ask
        }
    };
    match (tool.binding.targets_tab(), target) {
        (true, None) => Verdict::Deny("No page is available for this tool.".into()),
        (true, Some(target)) => {
            if let Some(reason) = restricted_reason(target) {
                return Verdict::Deny(reason);
            }
            match tool.effects {
                Effects::Read => Verdict::Allow,
                Effects::Write => write_verdict(Some(&target.origin)),
            }
        }
        // Browser-wide tools (the tab list) have no page to check.
        (false, _) => match tool.effects {
            Effects::Read => Verdict::Allow,
            Effects::Write => write_verdict(None),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::ToolRegistry;

    fn target(url: &str) -> TargetInfo {
        TargetInfo {
            tab_id: 1,
            url: url.into(),
            origin: origin_of(url),
            title: String::new(),
            host_permission: true,
            ..TargetInfo::default()
        }
    }

    fn rule(origin: &str, allow: bool) -> SiteRule {
        SiteRule {
            origin: origin.into(),
            allow_writes: allow,
            version: 1,
            created_at: 0,
        }
    }

    #[test]
    fn only_an_origin_with_a_host_is_a_site() {
        for url in [
            "https://shop.example/cart",
            "http://127.0.0.1:8080/",
            "https://a.b:8443",
        ] {
            assert!(is_site(&origin_of(url)), "{url}");
        }
        for url in [
            "file:///home/me/a.html",
            "file:///C:/x.html",
            "about:blank",
            "data:text/html,hi",
            "",
        ] {
            assert!(!is_site(&origin_of(url)), "{url}");
        }
    }

    #[test]
    fn a_page_described_element_is_checked_and_compared_as_the_user_sees_it() {
        let element = TargetElement::from_details(&serde_json::json!({
            "ref": "f3:e12", "role": "button", "name": "Archive", "state": "(disabled)"
        }))
        .unwrap();
        assert_eq!(element.summary(), "button \"Archive\" (f3:e12)");
        let recased = TargetElement {
            name: "ARCHIVE".into(),
            state: String::new(),
            ..element.clone()
        };
        assert!(element.same_as(&recased), "letter case and state aside");
        let accented = |name: &str| TargetElement {
            name: name.into(),
            ..element.clone()
        };
        assert!(
            !accented("Été").same_as(&accented("éTÉ")),
            "only ASCII letters fold (no Unicode case tables in the module): another name refuses"
        );
        for other in [
            TargetElement {
                reference: "e12".into(),
                ..element.clone()
            },
            TargetElement {
                role: "link".into(),
                ..element.clone()
            },
            TargetElement {
                name: "Delete account".into(),
                ..element.clone()
            },
        ] {
            assert!(!element.same_as(&other), "{other:?}");
        }
        for (details, why) in [
            (
                serde_json::json!({ "role": "button", "name": "x" }),
                "no ref",
            ),
            (
                serde_json::json!({ "ref": "e0", "role": "button", "name": "x" }),
                "is not a ref",
            ),
            (
                serde_json::json!({ "ref": "f:e1", "role": "button", "name": "x" }),
                "is not a ref",
            ),
            (
                serde_json::json!({ "ref": "e1", "role": "<b>", "name": "x" }),
                "is not a role",
            ),
            (
                serde_json::json!({ "ref": "e1", "role": "button" }),
                "no name",
            ),
            (
                serde_json::json!({ "ref": "e1", "role": "button", "name": "n".repeat(1001) }),
                "too long",
            ),
        ] {
            let error = TargetElement::from_details(&details).unwrap_err();
            assert!(error.contains(why), "{details}: {error}");
        }
        let long = TargetElement::from_details(&serde_json::json!({
            "ref": "e1", "role": "button", "name": "n".repeat(1000), "state": "s".repeat(500)
        }))
        .unwrap();
        assert_eq!(long.state.len(), 300);
        assert!(long.summary().ends_with("…\" (e1)"), "{}", long.summary());
    }

    #[test]
    fn origins() {
        assert_eq!(
            origin_of("https://Shop.Example:8443/a/b?q#x"),
            "https://shop.example:8443"
        );
        assert_eq!(origin_of("http://user:pw@h.example/"), "http://h.example");
        assert_eq!(origin_of("about:blank"), "about:");
        assert_eq!(origin_of("file:///tmp/x.html"), "file://");
    }

    #[test]
    fn gatekeeper_decision_table() {
        let r = ToolRegistry::page_tools();
        let read = r.get("read_page").unwrap();
        let click = r.get("click").unwrap();
        let shop = target("https://shop.example/cart");
        assert_eq!(verdict(read, Some(&shop), None), Verdict::Allow);
        assert_eq!(verdict(click, Some(&shop), None), Verdict::Ask);
        assert_eq!(
            verdict(
                click,
                Some(&shop),
                Some(&rule("https://shop.example", true))
            ),
            Verdict::Allow
        );
        assert_eq!(
            verdict(
                click,
                Some(&shop),
                Some(&rule("https://other.example", true))
            ),
            Verdict::Ask,
            "a rule for another site does not apply"
        );
        assert_eq!(
            verdict(
                click,
                Some(&shop),
                Some(&rule("https://shop.example", false))
            ),
            Verdict::Ask
        );
        for url in [
            "chrome://settings",
            "https://chromewebstore.google.com/detail/x",
            "chrome-extension://abc/x.html",
        ] {
            assert!(
                matches!(verdict(read, Some(&target(url)), None), Verdict::Deny(_)),
                "{url}"
            );
        }
        let mut no_access = shop.clone();
        no_access.host_permission = false;
        assert!(
            matches!(verdict(read, Some(&no_access), None), Verdict::Deny(m) if m.contains("no permission"))
        );
        assert!(matches!(verdict(read, None, None), Verdict::Deny(_)));
        let mut mcp = read.clone();
        mcp.level = Level::Mcp;
        assert_eq!(verdict(&mcp, Some(&shop), None), Verdict::Ask);
    }

    #[test]
    fn gatekeeper_judges_the_frame_origin() {
        let r = ToolRegistry::page_tools();
        let click = r.get("click").unwrap();
        let read = r.get("read_page").unwrap();
        // A click inside a payment frame of another site on the shop's page.
        let frame = TargetInfo {
            frame_id: Some(7),
            page_url: Some("https://shop.example/cart".into()),
            ..target("https://pay.example/card")
        };
        assert_eq!(
            verdict(
                click,
                Some(&frame),
                Some(&rule("https://shop.example", true))
            ),
            Verdict::Ask,
            "the shop's rule does not cover the payment frame"
        );
        assert_eq!(
            verdict(
                click,
                Some(&frame),
                Some(&rule("https://pay.example", true))
            ),
            Verdict::Allow
        );
        assert_eq!(verdict(read, Some(&frame), None), Verdict::Allow);
        let store_frame = TargetInfo {
            frame_id: Some(8),
            page_url: Some("https://shop.example/".into()),
            ..target("https://chromewebstore.google.com/detail/x")
        };
        assert!(matches!(
            verdict(read, Some(&store_frame), None),
            Verdict::Deny(_)
        ));
    }
}
