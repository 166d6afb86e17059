// Page-tool content script (docs/protocol.md §2).
//
// Injected on demand by the engine with chrome.scripting.executeScript, maybe
// several times into the same page: it installs once per page (guarded by a
// global symbol in the extension's isolated world) and everything lives inside
// one function so a second injection redeclares nothing.
//
// It answers `tool.execute` messages on ports named "page" with zero or more
// `tool.progress` and exactly one `tool.result`. It never carries a client op,
// never throws out of a listener, and holds no secrets.
(() => {
  "use strict";

  const INSTALLED = Symbol.for("sw-agent.content-script.installed");
  if (globalThis[INSTALLED]) return;
  globalThis[INSTALLED] = true;

  const MAX_TEXT_CHARS = 8000;
  const MAX_NAME_CHARS = 80;
  const MAX_VALUE_CHARS = 80;
  const MAX_INTERACTIVE = 400;

  /** A failure the model can act on: reported as `ok:false` with this message. */
  class ToolError extends Error {}

  // ---------------------------------------------------------------- refs ---
  // A ref names one element for the life of this document: the same element
  // always gets the same ref, and a ref number is never given to another one.
  const refByElement = new WeakMap();
  const elementByRef = new Map();
  let nextRefNumber = 1;

  function refFor(element) {
    let ref = refByElement.get(element);
    if (ref === undefined) {
      ref = `e${nextRefNumber++}`;
      refByElement.set(element, ref);
      elementByRef.set(ref, new WeakRef(element));
    }
    return ref;
  }

  function forgetCollectedRefs() {
    for (const [ref, weak] of elementByRef) {
      if (weak.deref() === undefined) elementByRef.delete(ref);
    }
  }

  // ------------------------------------------------------------ DOM walk ---
  const SKIPPED_TAGS = new Set([
    "SCRIPT", "STYLE", "NOSCRIPT", "TEMPLATE", "HEAD", "META", "LINK", "IFRAME",
    "OBJECT", "EMBED", "CANVAS", "SVG",
  ]);
  // Form controls whose text is their value: listed with the interactive
  // elements (with their current value), not repeated as page text.
  const VALUE_TAGS = new Set(["SELECT", "TEXTAREA", "DATALIST", "OPTION"]);
  const INTERACTIVE_ROLES = new Set([
    "button", "link", "checkbox", "radio", "switch", "tab", "menuitem",
    "menuitemcheckbox", "menuitemradio", "option", "combobox", "textbox",
    "searchbox", "slider", "spinbutton", "treeitem",
  ]);
  const NAME_FROM_CONTENT_ROLES = new Set([
    "button", "link", "checkbox", "radio", "switch", "tab", "menuitem",
    "menuitemcheckbox", "menuitemradio", "option", "treeitem", "clickable",
  ]);
  const TEXT_INPUT_TYPES = new Set([
    "text", "email", "tel", "url", "password", "date", "datetime-local",
    "month", "week", "time", "color",
  ]);

  const collapse = (text) => (text || "").replace(/\s+/g, " ").trim();
  const clip = (text, max) => (text.length > max ? `${text.slice(0, max - 1)}…` : text);
  const quote = (text) => JSON.stringify(text);

  /** Children in the flat tree: open shadow roots and slot assignments included. */
  function flatChildren(node) {
    if (node.nodeType === Node.ELEMENT_NODE) {
      if (node.shadowRoot) return node.shadowRoot.childNodes;
      if (node.tagName === "SLOT") {
        const assigned = node.assignedNodes({ flatten: true });
        if (assigned.length > 0) return assigned;
      }
      if (node.tagName === "DETAILS" && !node.open) {
        // A closed <details> renders only its summary.
        return Array.from(node.children).filter((child) => child.tagName === "SUMMARY").slice(0, 1);
      }
    }
    return node.childNodes;
  }

  function isAriaHidden(element) {
    return element.getAttribute("aria-hidden") === "true";
  }

  function isInteractive(element, role) {
    const tag = element.tagName;
    if (tag === "A" || tag === "BUTTON" || tag === "TEXTAREA" || tag === "SELECT" || tag === "SUMMARY") return true;
    if (tag === "INPUT") return element.type !== "hidden";
    // Custom checkboxes: the real input is transparent and its label is what
    // the user clicks, so the label stands in for it.
    if (tag === "LABEL") return hiddenToggleOf(element) !== null;
    if (INTERACTIVE_ROLES.has(role) && element.hasAttribute("role")) return true;
    if (element.hasAttribute("onclick")) return true;
    // Only the root of an editable region, not every paragraph inside it.
    if (element.isContentEditable) return !element.parentElement || !element.parentElement.isContentEditable;
    return false;
  }

  /** The invisible checkbox/radio a visible label stands in for, or null. */
  function hiddenToggleOf(label) {
    const control = label.control;
    if (!control || control.tagName !== "INPUT" || (control.type !== "checkbox" && control.type !== "radio")) return null;
    return isVisible(control) ? null : control;
  }

  function hasBox(element) {
    const rect = element.getBoundingClientRect();
    return rect.width > 0 && rect.height > 0;
  }

  /** Visible to a sighted user: rendered, not transparent, with a box. */
  function isVisible(element) {
    if (!element.isConnected) return false;
    for (let node = element; node; node = node.parentElement || (node.getRootNode() instanceof ShadowRoot ? node.getRootNode().host : null)) {
      if (node.nodeType === Node.ELEMENT_NODE && isAriaHidden(node)) return false;
    }
    if (typeof element.checkVisibility === "function") {
      if (!element.checkVisibility({ opacityProperty: true, visibilityProperty: true, checkOpacity: true, checkVisibilityCSS: true })) return false;
    } else {
      const style = getComputedStyle(element);
      if (style.display === "none" || style.visibility !== "visible" || Number(style.opacity) === 0) return false;
    }
    return hasBox(element);
  }

  /**
   * One pass over the rendered flat tree: visible text (until the budget is
   * spent) and visible interactive elements (all of them).
   */
  function scanPage({ wantText }) {
    const parts = [];
    let textLength = 0;
    let truncated = false;
    const interactive = [];

    function pushText(text) {
      if (!wantText || truncated) return;
      if (textLength + text.length > MAX_TEXT_CHARS) {
        parts.push(text.slice(0, MAX_TEXT_CHARS - textLength));
        textLength = MAX_TEXT_CHARS;
        truncated = true;
        return;
      }
      parts.push(text);
      textLength += text.length;
    }

    function walk(node, visibleText) {
      if (node.nodeType === Node.TEXT_NODE) {
        if (visibleText) {
          const text = node.data.replace(/\s+/g, " ");
          if (text !== "") pushText(text);
        }
        return;
      }
      if (node.nodeType !== Node.ELEMENT_NODE) return;
      const element = node;
      const tag = element.tagName.toUpperCase();
      if (SKIPPED_TAGS.has(tag) || isAriaHidden(element) || element.hasAttribute("inert")) return;
      const style = getComputedStyle(element);
      if (style.display === "none" || Number(style.opacity) === 0) return;
      const ownVisible = style.visibility === "visible";
      const role = roleOf(element);

      if (ownVisible && isInteractive(element, role) && hasBox(element)) interactive.push(element);

      // Rows and blocks start new lines; table cells stay on their row.
      const display = style.display;
      const cell = display === "table-cell";
      const block = !cell && !display.startsWith("inline") && display !== "contents";
      // Boxes like buttons are separated from neighbouring text on screen.
      const spaced = display.startsWith("inline-") || display === "inline-block";
      if (block) pushText("\n");
      if (cell) pushText(" | ");
      if (spaced) pushText(" ");
      if (display === "list-item") pushText("• ");
      if (tag === "BR") pushText("\n");
      if (tag === "IMG" && ownVisible) {
        const alt = collapse(element.getAttribute("alt"));
        if (alt) pushText(` [image: ${alt}] `);
      }
      if (style.contentVisibility !== "hidden" && !VALUE_TAGS.has(tag)) {
        for (const child of flatChildren(element)) walk(child, ownVisible);
      }
      if (block) pushText("\n");
      if (spaced) pushText(" ");
    }

    if (document.body) walk(document.body, true);

    const text = parts
      .join("")
      .split("\n")
      .map((line) => line.replace(/ {2,}/g, " ").trim())
      .filter((line) => line !== "")
      .join("\n")
      .trim();
    return { text, truncated, interactive };
  }

  // ------------------------------------------------- roles, names, state ---
  function roleOf(element) {
    const explicit = (element.getAttribute("role") || "").trim().split(/\s+/)[0].toLowerCase();
    if (explicit) return explicit;
    const tag = element.tagName.toUpperCase();
    switch (tag) {
      case "LABEL": return element.control ? roleOf(element.control) : "clickable";
      case "A": return "link";
      case "BUTTON": return "button";
      case "SUMMARY": return "button";
      case "TEXTAREA": return "textbox";
      case "SELECT": return element.multiple || element.size > 1 ? "listbox" : "combobox";
      case "INPUT": {
        const type = element.type;
        if (type === "button" || type === "submit" || type === "reset" || type === "image") return "button";
        if (type === "checkbox" || type === "radio") return type;
        if (type === "number") return "spinbutton";
        if (type === "range") return "slider";
        if (type === "search") return "searchbox";
        if (type === "file") return "file";
        return "textbox";
      }
      default:
        return element.isContentEditable ? "textbox" : "clickable";
    }
  }

  /** Text of a subtree as a screen reader would read it (used for names). */
  function subtreeText(root) {
    const parts = [];
    (function collect(node) {
      if (node.nodeType === Node.TEXT_NODE) { parts.push(node.data); return; }
      if (node.nodeType !== Node.ELEMENT_NODE) return;
      if (isAriaHidden(node)) return;
      if (node !== root) {
        const label = node.getAttribute("aria-label");
        if (label && label.trim()) { parts.push(` ${label} `); return; }
      }
      const tag = node.tagName.toUpperCase();
      if (tag === "SVG") {
        // An icon-only button is often named by its <svg><title>.
        const title = Array.from(node.children).find((child) => child.tagName.toLowerCase() === "title");
        if (title) parts.push(` ${title.textContent} `);
        return;
      }
      if (SKIPPED_TAGS.has(tag)) return;
      if (node.tagName === "IMG") { parts.push(` ${node.getAttribute("alt") || ""} `); return; }
      if (node.tagName === "INPUT" || node.tagName === "TEXTAREA" || node.tagName === "SELECT") return;
      for (const child of flatChildren(node)) collect(child);
    })(root);
    return collapse(parts.join(""));
  }

  function textOfIds(element, ids) {
    const root = element.getRootNode();
    return collapse(ids.split(/\s+/)
      .map((id) => (root.getElementById ? root.getElementById(id) : document.getElementById(id)))
      .filter(Boolean)
      .map((labelElement) => labelElement.textContent)
      .join(" "));
  }

  function accessibleName(element, role) {
    const tag = element.tagName.toUpperCase();
    const candidates = [
      () => (element.getAttribute("aria-labelledby") ? textOfIds(element, element.getAttribute("aria-labelledby")) : ""),
      () => element.getAttribute("aria-label"),
      () => (element.labels ? Array.from(element.labels).map((label) => subtreeText(label)).join(" ") : ""),
      () => (tag === "IMG" || (tag === "INPUT" && element.type === "image") ? element.getAttribute("alt") : ""),
      () => (tag === "INPUT" && (element.type === "button" || element.type === "submit" || element.type === "reset")
        ? element.value || (element.type === "submit" ? "Submit" : element.type === "reset" ? "Reset" : "")
        : ""),
      () => (NAME_FROM_CONTENT_ROLES.has(role) || ["BUTTON", "A", "SUMMARY", "LABEL"].includes(tag) ? subtreeText(element) : ""),
      () => element.getAttribute("title"),
      () => element.getAttribute("placeholder"),
      () => element.getAttribute("aria-placeholder"),
    ];
    for (const candidate of candidates) {
      const name = collapse(candidate());
      if (name) return clip(name, MAX_NAME_CHARS);
    }
    return "";
  }

  function isDisabled(element) {
    if (element.tagName === "LABEL" && element.control) return isDisabled(element.control);
    if (element.getAttribute("aria-disabled") === "true") return true;
    try {
      return element.matches(":disabled");
    } catch {
      return false;
    }
  }

  /** ` value="…" checked (disabled)` and similar, each part only when relevant. */
  function stateOf(element, role) {
    if (element.tagName === "LABEL" && element.control) return stateOf(element.control, role);
    const parts = [];
    const tag = element.tagName.toUpperCase();
    if (tag === "INPUT" && (element.type === "checkbox" || element.type === "radio")) {
      if (element.indeterminate) parts.push("mixed");
      else if (element.checked) parts.push("checked");
    } else if (["checkbox", "radio", "switch", "menuitemcheckbox", "menuitemradio"].includes(role)) {
      const checked = element.getAttribute("aria-checked");
      if (checked === "true") parts.push("checked");
      else if (checked === "mixed") parts.push("mixed");
    } else if (tag === "INPUT" && element.type === "password") {
      if (element.value) parts.push("value=(hidden)");
    } else if (tag === "INPUT" && element.type === "file") {
      if (element.files && element.files.length) parts.push(`value=${quote(clip(Array.from(element.files, (f) => f.name).join(", "), MAX_VALUE_CHARS))}`);
    } else if (tag === "INPUT" && (TEXT_INPUT_TYPES.has(element.type) || ["number", "range", "search"].includes(element.type))) {
      if (element.value !== "") parts.push(`value=${quote(clip(element.value, MAX_VALUE_CHARS))}`);
    } else if (tag === "TEXTAREA") {
      if (element.value !== "") parts.push(`value=${quote(clip(collapse(element.value), MAX_VALUE_CHARS))}`);
    } else if (tag === "SELECT") {
      const selected = Array.from(element.selectedOptions, (option) => collapse(option.label || option.text));
      if (selected.length) parts.push(`value=${quote(clip(selected.join(", "), MAX_VALUE_CHARS))}`);
    } else if (element.isContentEditable) {
      const value = collapse(element.innerText);
      if (value) parts.push(`value=${quote(clip(value, MAX_VALUE_CHARS))}`);
    }
    if (role === "tab" && element.getAttribute("aria-selected") === "true") parts.push("selected");
    if (tag === "SUMMARY" && element.parentElement && element.parentElement.tagName === "DETAILS") {
      parts.push(element.parentElement.open ? "expanded" : "collapsed");
    } else if (element.hasAttribute("aria-expanded")) {
      parts.push(element.getAttribute("aria-expanded") === "true" ? "expanded" : "collapsed");
    }
    if (isDisabled(element)) parts.push("(disabled)");
    return parts.length ? ` ${parts.join(" ")}` : "";
  }

  function describe(element) {
    const role = roleOf(element);
    return { ref: refFor(element), role, name: accessibleName(element, role) };
  }

  function rectOf(element) {
    const rect = element.getBoundingClientRect();
    const round = (n) => Math.round(n * 10) / 10;
    return { x: round(rect.x), y: round(rect.y), width: round(rect.width), height: round(rect.height) };
  }

  // --------------------------------------------------------------- tools ---
  function readPage(params) {
    if (params !== undefined && params !== null && (typeof params !== "object" || Array.isArray(params))) {
      throw new ToolError("read_page takes no parameters; call it with {}.");
    }
    forgetCollectedRefs();
    const { text, truncated, interactive } = scanPage({ wantText: true });
    const lines = [`Title: ${document.title || "(untitled)"}`, `URL: ${location.href}`, "", text || "(no visible text)"];
    if (truncated) {
      lines.push(`[Text truncated at ${MAX_TEXT_CHARS} characters; the rest of the page is not shown.]`);
    }
    lines.push("", "Interactive elements:");
    const listed = interactive.slice(0, MAX_INTERACTIVE);
    for (const element of listed) {
      const { ref, role, name } = describe(element);
      lines.push(`[${ref}] ${role} ${quote(name)}${stateOf(element, role)}`);
    }
    if (listed.length === 0) lines.push("(none)");
    if (interactive.length > listed.length) {
      lines.push(`[${interactive.length - listed.length} more interactive elements not listed; use click { text } to reach them.]`);
    }
    return {
      ok: true,
      content: lines.join("\n"),
      details: {
        title: document.title,
        url: location.href,
        textTruncated: truncated,
        interactiveCount: interactive.length,
      },
    };
  }

  function resolveByRef(ref) {
    if (!/^e[1-9]\d*$/.test(ref)) {
      throw new ToolError(`"${ref}" is not a ref; refs look like "e12". Call read_page to get refs.`);
    }
    const element = elementByRef.has(ref) ? elementByRef.get(ref).deref() : undefined;
    if (!element || !element.isConnected) {
      if (elementByRef.has(ref) || Number(ref.slice(1)) < nextRefNumber) {
        throw new ToolError(`Element ${ref} is no longer on the page; call read_page to get fresh refs.`);
      }
      throw new ToolError(`Unknown ref ${ref}; call read_page to get the current refs.`);
    }
    if (!isVisible(element)) {
      throw new ToolError(`Element ${ref} is not visible on the page; call read_page to get fresh refs.`);
    }
    return element;
  }

  function resolveByText(wanted) {
    const target = collapse(wanted).toLowerCase();
    const { interactive } = scanPage({ wantText: false });
    const scored = [];
    for (const element of interactive) {
      const role = roleOf(element);
      const name = accessibleName(element, role).toLowerCase();
      const text = collapse(element.innerText || element.textContent).toLowerCase();
      let score = 0;
      if (name === target) score = 4;
      else if (text === target) score = 3;
      else if (name.includes(target)) score = 2;
      else if (text.includes(target)) score = 1;
      if (score > 0) scored.push({ element, score });
    }
    if (scored.length === 0) {
      throw new ToolError(`No visible interactive element matches the text ${quote(wanted)}; call read_page to see the elements you can click.`);
    }
    const best = Math.max(...scored.map((entry) => entry.score));
    const matches = scored.filter((entry) => entry.score === best);
    return { element: matches[0].element, alternatives: matches.length - 1 };
  }

  function isFocusable(element) {
    return element.tabIndex >= 0 || element.isContentEditable || element.matches("a[href], button, input, select, textarea, summary");
  }

  function click(params) {
    if (params === null || typeof params !== "object" || Array.isArray(params)) {
      throw new ToolError('click needs an object: { "ref": "e12" } (from read_page) or { "text": "visible text" }.');
    }
    const { ref, text } = params;
    const hasRef = typeof ref === "string" && ref.trim() !== "";
    const hasText = typeof text === "string" && text.trim() !== "";
    if (!hasRef && !hasText) {
      throw new ToolError('click needs "ref" (like "e12", from read_page) or "text" (the visible text of the element).');
    }
    let element;
    let alternatives = 0;
    if (hasRef) {
      element = resolveByRef(ref.trim());
    } else {
      ({ element, alternatives } = resolveByText(text));
    }
    const { ref: elementRef, role, name } = describe(element);
    if (isDisabled(element)) {
      throw new ToolError(`Element ${elementRef} (${role} ${quote(name)}) is disabled and cannot be clicked.`);
    }
    element.scrollIntoView({ block: "center", inline: "center", behavior: "instant" });
    if (isFocusable(element) && typeof element.focus === "function") element.focus({ preventScroll: true });
    const rect = rectOf(element);
    element.click();
    let content = `Clicked ${role} ${quote(name)} (${elementRef}).`;
    if (alternatives > 0) {
      content += ` ${alternatives} other element${alternatives === 1 ? "" : "s"} matched equally well; the first in page order was clicked.`;
    }
    return { ok: true, content, details: { ref: elementRef, name, role, rect } };
  }

  /**
   * name → tool. A tool gets (params, context) and returns (or resolves to)
   * `{ ok, content, details? }`; it throws ToolError for failures the model
   * should read. `context.progress(text)` sends a `tool.progress`.
   */
  const TOOLS = {
    read_page: readPage,
    click,
  };

  // ------------------------------------------------------------ protocol ---
  function safePost(port, message) {
    try {
      port.postMessage(message);
    } catch {
      // The port closed (engine restarted or page navigating): nobody to tell.
    }
  }

  async function execute(port, message) {
    const callId = message.callId;
    const name = message.name;
    const finish = (result) => {
      const reply = { type: "tool.result", callId, ok: result.ok === true, content: String(result.content ?? "") };
      if (result.details && typeof result.details === "object") reply.details = result.details;
      safePost(port, reply);
    };
    if (typeof name !== "string" || !Object.prototype.hasOwnProperty.call(TOOLS, name)) {
      finish({ ok: false, content: `Unknown page tool: ${String(name)}` });
      return;
    }
    const context = { progress: (text) => safePost(port, { type: "tool.progress", callId, text: String(text) }) };
    try {
      const params = message.params === undefined ? {} : message.params;
      finish(await TOOLS[name](params, context));
    } catch (err) {
      const text = err instanceof ToolError ? err.message : `${name} failed: ${err && err.message ? err.message : String(err)}`;
      finish({ ok: false, content: text });
    }
  }

  chrome.runtime.onConnect.addListener((port) => {
    if (port.name !== "page") return;
    port.onMessage.addListener((message) => {
      try {
        if (message && message.type === "tool.execute") execute(port, message);
      } catch (err) {
        console.error("[sw-agent] page tool listener", err);
      }
    });
  });
})();
