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
//
// Tools (parameters as declared in src/tools.rs): page_snapshot, read_page,
// click, type, select, scroll, wait_for. All of them share one registry of
// element refs ("e12"), so a ref from page_snapshot works with click and the
// other way round.
//
// Frames: the engine injects this script into each frame it talks to and
// says which frame it is (`frameId` of `tool.execute`, Chrome's frame id). In
// a child frame every ref carries the frame ("f7:e12"), so refs are unique
// in the tab and the engine routes a ref to the frame that owns it. Same-origin
// iframes are walked from their parent; an iframe of another origin is one
// line `iframe "…" (other site: …)` whose position and src page_snapshot
// reports in `details.frames`, and the engine splices that frame's own
// outline in (it knows the tab's frames; a content script cannot tell which
// Chrome frame an iframe element is). Every failure the model can fix (stale ref, hidden or
// disabled element, wrong kind of element, timeout) is an `ok:false` result
// whose text says what to do next.
//
// Whatever the page, a result stays small and arrives: page-supplied strings
// are clipped, the walks stop MAX_DEPTH elements deep and say so, a result's
// text is cut at MAX_RESULT_CHARS, and a result the Port refuses is replaced
// by an `ok:false` one that says so.
(() => {
  "use strict";

  const INSTALLED = Symbol.for("sw-agent.content-script.installed");
  if (globalThis[INSTALLED]) return;
  globalThis[INSTALLED] = true;

  const MAX_TEXT_CHARS = 8000;
  const MAX_NAME_CHARS = 80;
  const MAX_VALUE_CHARS = 80;
  const MAX_INTERACTIVE = 400;
  const MAX_SNAPSHOT_CHARS = 12000;
  // A child frame's outline is spliced into its parent's: a smaller share.
  const MAX_FRAME_SNAPSHOT_CHARS = 3000;
  const MAX_BLOCK_CHARS = 200;
  const MAX_HEADING_CHARS = 150;
  const MAX_OPTIONS_LISTED = 12;
  const MAX_OPTIONS_IN_ERROR = 40;
  const WAIT_DEFAULT_MS = 5000;
  const WAIT_MAX_MS = 30000;
  const WAIT_POLL_MS = 250;
  // Page-supplied strings that are not names (the title, option labels and
  // values, validation messages) are clipped to this; URLs to the next.
  const MAX_LABEL_CHARS = 300;
  const MAX_URL_CHARS = 2000;
  // A role attribute counts only when its first token looks like a role.
  const ROLE_TOKEN = /^[a-z][a-z-]{0,31}$/;
  // Whatever the page, a result's text is cut here and its details are
  // dropped above the next limit: far above any normal result (a snapshot is
  // at most 12000 characters), far below what a Port carries (64 MiB).
  const MAX_RESULT_CHARS = 60000;
  const MAX_DETAILS_CHARS = 100000;
  // The walks stop this many elements below their start: Blink's HTML parser
  // never nests deeper, only scripts do (and a walk must not overflow the stack).
  const MAX_DEPTH = 512;
  // A name (subtreeText) reads at most this many nodes and characters, so a
  // control wrapped around a huge subtree costs no more than a small one.
  const MAX_NAME_NODES = 2000;
  const MAX_NAME_TEXT = 1000;
  // Other-origin frames whose position page_snapshot reports (the engine reads a few).
  const MAX_FRAMES_REPORTED = 32;
  const DEEP_CUT_NOTE = `… content nested more than ${MAX_DEPTH} elements deep is not shown.`;

  /** A failure the model can act on: reported as `ok:false` with this message. */
  class ToolError extends Error {}

  // ---------------------------------------------------------------- refs ---
  // A ref names one element for the life of this document: the same element
  // always gets the same ref, and a ref number is never given to another one.
  // The maps hold the frame-local ref ("e12"); the model sees it with this
  // frame's prefix ("f7:e12" in frame 7, none in the tab's top document).
  const refByElement = new WeakMap();
  const elementByRef = new Map();
  let nextRefNumber = 1;
  /** Chrome's id of this frame, as the engine said (0: the top document). */
  let ownFrameId = 0;
  const framePrefix = () => (ownFrameId > 0 ? `f${ownFrameId}:` : "");
  const REF_PATTERN = /^(?:f([1-9]\d*):)?(e[1-9]\d*)$/;

  function refFor(element) {
    let ref = refByElement.get(element);
    if (ref === undefined) {
      ref = `e${nextRefNumber++}`;
      refByElement.set(element, ref);
      elementByRef.set(ref, new WeakRef(element));
    }
    return framePrefix() + ref;
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
  /** A page-supplied string, whitespace collapsed, at most `max` characters (cut before collapsing, so a huge one costs little). */
  const pageString = (text, max) => clip(collapse(String(text ?? "").slice(0, max * 4)), max);

  // ------------------------------------------------------ DOM clobbering ---
  // A form's named controls shadow its properties (`<input name="elements">`
  // makes form.elements that input) and a document's named images and forms
  // shadow the document's (`<img name="title">`), in every world. What this
  // script needs of forms and documents is read through the prototypes.
  const formProperty = (form, property) => Object.getOwnPropertyDescriptor(HTMLFormElement.prototype, property).get.call(form);
  /** The controls of a form, as an array. */
  const formControls = (form) => Array.from(formProperty(form, "elements"));
  const formCheckValidity = (form) => HTMLFormElement.prototype.checkValidity.call(form);
  const formRequestSubmit = (form, button) => HTMLFormElement.prototype.requestSubmit.call(form, button || undefined);
  const documentTitle = () => Object.getOwnPropertyDescriptor(Document.prototype, "title").get.call(document);
  const onEvent = (target, type, listener) => EventTarget.prototype.addEventListener.call(target, type, listener, true);
  const offEvent = (target, type, listener) => EventTarget.prototype.removeEventListener.call(target, type, listener, true);
  // The tree links loops follow, likewise: a shadowed parent could send a loop in a circle.
  const getterOf = (proto, property) => Object.getOwnPropertyDescriptor(proto, property).get;
  const NODE_TYPE = getterOf(Node.prototype, "nodeType");
  const PARENT_NODE = getterOf(Node.prototype, "parentNode");
  const PARENT_ELEMENT = getterOf(Node.prototype, "parentElement");
  const FIRST_CHILD = getterOf(Node.prototype, "firstChild");
  const NEXT_SIBLING = getterOf(Node.prototype, "nextSibling");
  const ELEMENT_ASSIGNED_SLOT = getterOf(Element.prototype, "assignedSlot");
  const TEXT_ASSIGNED_SLOT = getterOf(Text.prototype, "assignedSlot");
  const OPEN_SHADOW_ROOT = getterOf(Element.prototype, "shadowRoot");
  const SHADOW_ROOT_MODE = getterOf(ShadowRoot.prototype, "mode");
  const LOCAL_NAME = getterOf(Element.prototype, "localName");
  const NAMESPACE_URI = getterOf(Element.prototype, "namespaceURI");
  const nodeTypeOf = (node) => NODE_TYPE.call(node);
  /** The page's title and URL as results show them: clipped. */
  const pageTitle = () => pageString(documentTitle(), MAX_LABEL_CHARS);
  const pageUrl = () => clip(location.href, MAX_URL_CHARS);

  // -------------------------------------------------------- shadow roots ---
  // The tools see into shadow roots, open and closed. A closed root (mode
  // "closed", common in design systems and checkout widgets) is invisible to
  // the page's DOM APIs: `host.shadowRoot` is null. Chrome gives extensions
  // chrome.dom.openOrClosedShadowRoot(element) (Chrome 88+, in content
  // scripts, no permission), so every walk or lookup that goes down into a
  // shadow root asks shadowRootOf, never `.shadowRoot`. Decisions:
  // - Feature-detected once, at install: without chrome.dom (another
  //   browser, or the tests' stub) only open roots are seen, as before.
  // - The API is asked only about elements that can host a shadow root
  //   (those attachShadow accepts: custom elements and SHADOW_HOST_TAGS):
  //   Chrome throws for anything that is not an HTMLElement, and a walk
  //   should not cross into the extension bindings for every <li> or
  //   <input>. An open root is read first, without it. The element's names
  //   are read through the prototype (a form's controls can shadow them).
  // - A call that throws (an element the API refuses) counts as no closed
  //   root: the tools then see what they saw before.
  // - Going up needs no API: a shadow root's `host` is readable whatever its
  //   mode (flatParent). Only `assignedSlot` answers for open roots alone,
  //   so the slot of a node in a closed host is found by hand (assignedSlotOf).
  // - Inside a shadow root, ids are looked up in that root
  //   (`getRootNode()` returns the root whatever its mode: textOfIds,
  //   elementsOfIds) and events that are not composed (`submit`) end at the
  //   root, so pressEnter listens there too.
  // - Searches that cannot start from an element (the open modal dialog, a
  //   combobox's list box found by role, the page's scrolling area) look in
  //   every shadow root through shadowRootsUnder. That walks the whole page,
  //   so each of them walks only when something cheaper did not answer: the
  //   document's own tree and a hit test (openModal), the combobox's own
  //   root (popupListbox), the page scrolling itself (mainScroller).
  // - A hit test (elementFromPoint) sees the host of an element in a shadow
  //   root, open or closed, and must descend through
  //   shadowRootOf(host).elementFromPoint (deepElementFromPoint). Only the
  //   modal dialog is found that way; no check here calls a control covered
  //   from a hit test.
  // - A read asks the same questions many times over: page_snapshot and
  //   read_page ask chrome.dom about every <div> and <span> they walk, then
  //   again about each one's ancestors for every visibility check, and each
  //   visibility check looked for the open modal dialog again (a hit test, or
  //   a walk of every root). So a read of the page runs in whileReading,
  //   which keeps each answer (an element's shadow root, a closed root's
  //   slots, a document's open modal dialog) until it returns. Only code
  //   that cannot change the page runs there: no event is fired and no page
  //   code runs between a question and its answer's use, so an answer is
  //   never stale. A write (a click, a key, a focus) and anything after an
  //   `await` runs outside it and asks again (scripts/bench-content-snapshot.mjs
  //   measures it; BENCHMARKS item 53).
  const HTML_NAMESPACE = "http://www.w3.org/1999/xhtml";
  const SHADOW_HOST_TAGS = new Set([
    "article", "aside", "blockquote", "body", "div", "footer", "h1", "h2", "h3", "h4", "h5", "h6",
    "header", "main", "nav", "p", "section", "span",
  ]);
  const openOrClosedShadowRoot = (() => {
    try {
      const dom = typeof chrome === "object" && chrome ? chrome.dom : null;
      return dom && typeof dom.openOrClosedShadowRoot === "function" ? dom.openOrClosedShadowRoot.bind(dom) : null;
    } catch {
      return null;
    }
  })();

  /**
   * What a read already found out, while one runs (whileReading), else
   * null: element → its shadow root or null (as chrome.dom answered),
   * closed root → Map of node → the slot it is assigned to, document → its
   * open modal dialog or null.
   */
  let readMemo = null;

  /**
   * Runs `read` (synchronous, and it must not change the page: no event, no
   * focus, no click, nothing that runs page code) with the answers of
   * shadowRootOf, assignedSlotOf and openModal kept until it returns. Inside
   * another read it just runs `read`.
   */
  function whileReading(read) {
    if (readMemo) return read();
    readMemo = { shadowRoots: new WeakMap(), slots: new WeakMap(), modals: new WeakMap() };
    try {
      return read();
    } finally {
      readMemo = null;
    }
  }

  /** The shadow root `element` hosts, open or closed (closed ones through chrome.dom), or null. */
  function shadowRootOf(element) {
    const open = OPEN_SHADOW_ROOT.call(element);
    if (open || !openOrClosedShadowRoot) return open || null;
    const name = LOCAL_NAME.call(element);
    if (NAMESPACE_URI.call(element) !== HTML_NAMESPACE || !(SHADOW_HOST_TAGS.has(name) || name.includes("-"))) return null;
    if (readMemo) {
      const known = readMemo.shadowRoots.get(element);
      if (known !== undefined) return known;
    }
    let root = null;
    try {
      root = openOrClosedShadowRoot(element) || null;
    } catch {
      root = null;
    }
    if (readMemo) readMemo.shadowRoots.set(element, root);
    return root;
  }

  /**
   * The slot a node (element or text) is assigned to, or null. `assignedSlot`
   * is null for a slot in a closed root, so for a child of a host with a
   * closed root the slot is looked for among that root's slots.
   */
  function assignedSlotOf(node, type) {
    const slot = type === Node.ELEMENT_NODE ? ELEMENT_ASSIGNED_SLOT.call(node) : type === Node.TEXT_NODE ? TEXT_ASSIGNED_SLOT.call(node) : null;
    if (slot || (type !== Node.ELEMENT_NODE && type !== Node.TEXT_NODE)) return slot;
    const host = PARENT_ELEMENT.call(node);
    const root = host ? shadowRootOf(host) : null;
    // An open root already answered through assignedSlot.
    if (!root || SHADOW_ROOT_MODE.call(root) === "open") return null;
    const slotsOf = () => DocumentFragment.prototype.querySelectorAll.call(root, "slot");
    if (!readMemo) {
      for (const candidate of slotsOf()) {
        if (HTMLSlotElement.prototype.assignedNodes.call(candidate).includes(node)) return candidate;
      }
      return null;
    }
    // While reading, the root's slots are listed once: node → the first slot (in tree order) it is assigned to.
    let slotOf = readMemo.slots.get(root);
    if (!slotOf) {
      slotOf = new Map();
      for (const candidate of slotsOf()) {
        for (const assigned of HTMLSlotElement.prototype.assignedNodes.call(candidate)) {
          if (!slotOf.has(assigned)) slotOf.set(assigned, candidate);
        }
      }
      readMemo.slots.set(root, slotOf);
    }
    return slotOf.get(node) || null;
  }

  /** Children in the flat tree: shadow roots (open and closed) and slot assignments included. */
  function flatChildren(node) {
    if (node.nodeType === Node.ELEMENT_NODE) {
      const shadow = shadowRootOf(node);
      if (shadow) return shadow.childNodes;
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

  /** `querySelectorAll` of a document, shadow root or element, through the prototype (a document's named images can shadow its methods). */
  function queryAllIn(scope, selector) {
    const type = nodeTypeOf(scope);
    if (type === Node.DOCUMENT_NODE) return Document.prototype.querySelectorAll.call(scope, selector);
    if (type === Node.DOCUMENT_FRAGMENT_NODE) return DocumentFragment.prototype.querySelectorAll.call(scope, selector);
    return Element.prototype.querySelectorAll.call(scope, selector);
  }

  /**
   * Every shadow root below `start` (a document or an element; the start's
   * own included), open and closed, nested ones too: those of the start's
   * tree first, in document order, then the ones inside them. Lazy, so a
   * search stops walking once it has found what it looks for. Costs one
   * shadowRootOf per element of the page: only for searches the cheaper ways
   * did not answer.
   */
  function* shadowRootsUnder(start) {
    const scopes = [start];
    if (nodeTypeOf(start) === Node.ELEMENT_NODE) {
      const own = shadowRootOf(start);
      if (own) {
        yield own;
        scopes.push(own);
      }
    }
    // A queue, not recursion: roots can nest as deep as scripts make them.
    for (let next = 0; next < scopes.length; next++) {
      for (const element of queryAllIn(scopes[next], "*")) {
        const root = shadowRootOf(element);
        if (!root) continue;
        yield root;
        scopes.push(root);
      }
    }
  }

  /**
   * The element at a viewport point of `doc`, followed down through shadow
   * roots, open and closed (the document and each root answer with the host
   * of what lies inside), or null.
   */
  function deepElementFromPoint(doc, x, y) {
    let hit = Document.prototype.elementFromPoint.call(doc, x, y);
    for (let depth = 0; hit && depth < MAX_DEPTH; depth++) {
      const root = shadowRootOf(hit);
      const inner = root ? ShadowRoot.prototype.elementFromPoint.call(root, x, y) : null;
      // A root answers with its host when the point is on the host's own box.
      if (!inner || inner === hit) break;
      hit = inner;
    }
    return hit;
  }

  /** Computed style in the element's own window (elements of same-origin iframes too). */
  function styleOf(element) {
    const view = (element.ownerDocument && element.ownerDocument.defaultView) || window;
    return view.getComputedStyle(element);
  }

  /** Parent in the flat tree: the slot of a slotted node, the shadow host for a shadow root's top elements. */
  function flatParent(node) {
    const slot = assignedSlotOf(node, nodeTypeOf(node));
    if (slot) return slot;
    const parent = PARENT_ELEMENT.call(node);
    if (parent) return parent;
    const root = Node.prototype.getRootNode.call(node);
    // nodeType 11 with a host: a shadow root (checked without instanceof, which fails across frames).
    return root && root.nodeType === 11 && root.host ? root.host : null;
  }

  /** The <iframe> element holding a same-origin frame's element, or null. */
  function frameOf(element) {
    try {
      const view = element.ownerDocument && element.ownerDocument.defaultView;
      return view && view !== window ? view.frameElement : null;
    } catch {
      return null;
    }
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

  /**
   * The invisible checkbox/radio a visible label stands in for, or null.
   * An open modal dialog covering both does not make the control invisible:
   * behind a dialog the control is still the element, not its label.
   */
  function hiddenToggleOf(label) {
    const control = label.control;
    if (!control || control.tagName !== "INPUT" || (control.type !== "checkbox" && control.type !== "radio")) return null;
    return visibilityProblem(control, { behindModal: true }) === null ? null : control;
  }

  function hasBox(element) {
    const rect = element.getBoundingClientRect();
    return rect.width > 0 && rect.height > 0;
  }

  /**
   * Why a sighted user cannot see (or reach) the element, or null when it is
   * visible: rendered, not transparent, with a box, not aria-hidden or inert,
   * not behind an open modal dialog (unless `behindModal` allows it), and
   * (inside a same-origin iframe) in a visible frame.
   */
  function visibilityProblem(element, { behindModal = false } = {}) {
    if (!element || !element.isConnected) return "no longer on the page";
    for (let node = element; node; node = flatParent(node)) {
      if (node.nodeType !== Node.ELEMENT_NODE) continue;
      if (isAriaHidden(node)) return "hidden from users (aria-hidden)";
      if (node.hasAttribute("inert")) return "inert (covered by a dialog or overlay)";
    }
    if (!behindModal) {
      const modal = openModal(element.ownerDocument);
      if (modal && !flatContains(modal, element)) return "covered by an open modal dialog (close or answer the dialog first)";
    }
    if (typeof element.checkVisibility === "function") {
      if (!element.checkVisibility({ opacityProperty: true, visibilityProperty: true, checkOpacity: true, checkVisibilityCSS: true })) {
        return "hidden (not displayed, invisible or transparent)";
      }
    } else {
      const style = styleOf(element);
      if (style.display === "none" || style.visibility !== "visible" || Number(style.opacity) === 0) {
        return "hidden (not displayed, invisible or transparent)";
      }
    }
    if (!hasBox(element)) return "hidden (it has no size on screen)";
    const frame = frameOf(element);
    if (frame) {
      const problem = visibilityProblem(frame);
      if (problem) return `in a frame that is ${problem}`;
    }
    return null;
  }

  /**
   * The open modal <dialog> of a document (everything else is inert), or
   * null; one inside a shadow root, open or closed, too. Of several open (a
   * dialog that opened another), the topmost: the ones below it are inert
   * too. Called for every visibility check, so it avoids walking the page:
   * - First a hit test: while a modal dialog is open every other element is
   *   inert (the page's own full-screen overlay too, whatever its z-index,
   *   a popover opened after the dialog, and the modal dialogs below it),
   *   and hit tests pass through inert elements. So a hit in a modal dialog
   *   is in the topmost one (by default its ::backdrop covers the viewport,
   *   and a hit on it is a hit on the dialog). The point is the middle of
   *   the body's part of the viewport (where nothing else is, the body
   *   itself is hit), else of the viewport.
   * - Else `dialog:modal` in the document's own tree answers (through the
   *   prototype: an <img name="querySelector"> must not hide the dialog);
   *   of several, the topmost (topmostModal).
   * - `:modal` does not match across shadow roots and nothing lists the top
   *   layer: a hit in no modal dialog, on anything but the <html> element,
   *   proves that none is open. Only when the hit proves nothing (nothing
   *   but <html> or nothing was hit: an empty spot, or a ::backdrop the page
   *   made transparent to the pointer with the dialog elsewhere) are the
   *   shadow roots searched, with `dialog:modal` in each.
   * While reading (whileReading), each document's answer is found once.
   */
  function openModal(doc) {
    if (!doc) return null;
    if (!readMemo) return findOpenModal(doc);
    if (readMemo.modals.has(doc)) return readMemo.modals.get(doc);
    const modal = findOpenModal(doc);
    readMemo.modals.set(doc, modal);
    return modal;
  }

  /** The nearest open modal <dialog> at or above `node` in the flat tree, or null. */
  function modalAround(node) {
    for (let current = node; current; current = flatParent(current)) {
      if (nodeTypeOf(current) === Node.ELEMENT_NODE && LOCAL_NAME.call(current) === "dialog" && Element.prototype.matches.call(current, ":modal")) return current;
    }
    return null;
  }

  /** openModal without the memo. */
  function findOpenModal(doc) {
    let inTree;
    try {
      inTree = Document.prototype.querySelectorAll.call(doc, "dialog:modal");
    } catch {
      return null; // no :modal support
    }
    const view = doc.defaultView;
    if (!view) return inTree.length > 0 ? inTree[inTree.length - 1] : null;
    let x = view.innerWidth / 2;
    let y = view.innerHeight / 2;
    const body = doc.body;
    if (body) {
      const rect = body.getBoundingClientRect();
      const left = Math.max(rect.left, 0);
      const right = Math.min(rect.right, view.innerWidth);
      const top = Math.max(rect.top, 0);
      const bottom = Math.min(rect.bottom, view.innerHeight);
      if (right - left >= 1 && bottom - top >= 1) {
        x = (left + right) / 2;
        y = (top + bottom) / 2;
      }
    }
    const hit = deepElementFromPoint(doc, x, y);
    const around = modalAround(hit);
    if (around) return around;
    if (inTree.length > 0) return topmostModal(doc, Array.from(inTree));
    if (hit && hit !== doc.documentElement) return null;
    for (const root of shadowRootsUnder(doc)) {
      const modal = DocumentFragment.prototype.querySelector.call(root, "dialog:modal");
      if (modal) return modal;
    }
    return null;
  }

  /**
   * The topmost of a document's open modal dialogs (in tree order): the
   * one a hit test at its own middle lands in (the ones below are inert,
   * and under the topmost one's ::backdrop), else the last.
   */
  function topmostModal(doc, dialogs) {
    if (dialogs.length === 1) return dialogs[0];
    const view = doc.defaultView;
    const clamp = (value, max) => Math.min(Math.max(value, 0), Math.max(max - 1, 0));
    for (let index = dialogs.length - 1; index >= 0; index -= 1) {
      const rect = dialogs[index].getBoundingClientRect();
      const hit = deepElementFromPoint(doc, clamp(rect.left + rect.width / 2, view.innerWidth), clamp(rect.top + rect.height / 2, view.innerHeight));
      if (hit && flatContains(dialogs[index], hit)) return dialogs[index];
    }
    return dialogs[dialogs.length - 1];
  }

  /** `ancestor` contains `node` in the flat tree (across shadow roots). */
  function flatContains(ancestor, node) {
    for (let current = node; current; current = flatParent(current)) {
      if (current === ancestor) return true;
    }
    return false;
  }

  /** Visible to a sighted user: rendered, not transparent, with a box. */
  function isVisible(element) {
    return visibilityProblem(element) === null;
  }

  /**
   * One pass over the rendered flat tree: visible text (until the budget is
   * spent) and visible interactive elements (all of them) down to MAX_DEPTH
   * elements below `root` (`deepCut` says whether anything lies deeper),
   * leaving out the subtree of `skip` (read_page reads an open modal dialog
   * on its own).
   */
  function scanPage({ wantText, root = document.body, maxText = MAX_TEXT_CHARS, skip = null }) {
    const parts = [];
    let textLength = 0;
    let truncated = false;
    let deepCut = false;
    const interactive = [];

    function pushText(text) {
      if (!wantText || truncated) return;
      if (textLength + text.length > maxText) {
        parts.push(text.slice(0, maxText - textLength));
        textLength = maxText;
        truncated = true;
        return;
      }
      parts.push(text);
      textLength += text.length;
    }

    function walk(node, visibleText, depth) {
      if (node.nodeType === Node.TEXT_NODE) {
        if (visibleText && wantText && !truncated) {
          // A huge text node is read only as far as the budget can use.
          const limit = Math.min(node.data.length, (maxText - textLength) * 4 + 4096);
          const text = node.data.slice(0, limit).replace(/\s+/g, " ");
          if (text !== "") pushText(text);
          if (limit < node.data.length) truncated = true;
        }
        return;
      }
      if (node.nodeType !== Node.ELEMENT_NODE) return;
      if (depth > MAX_DEPTH) {
        deepCut = true;
        return;
      }
      const element = node;
      if (element === skip) return;
      const tag = element.tagName.toUpperCase();
      if (SKIPPED_TAGS.has(tag) || isAriaHidden(element) || element.hasAttribute("inert")) return;
      const style = styleOf(element);
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
        for (const child of flatChildren(element)) walk(child, ownVisible, depth + 1);
      }
      if (block) pushText("\n");
      if (spaced) pushText(" ");
    }

    if (root) walk(root, true, 0);

    const text = parts
      .join("")
      .split("\n")
      .map((line) => line.replace(/ {2,}/g, " ").trim())
      .filter((line) => line !== "")
      .join("\n")
      .trim();
    return { text, truncated, interactive, deepCut };
  }

  // ------------------------------------------------- roles, names, state ---
  /**
   * The first token of the role attribute when it looks like a role (a short
   * ASCII word, ROLE_TOKEN), else "" (the element's own role then applies).
   */
  function explicitRole(element) {
    const attribute = element.getAttribute("role");
    if (!attribute) return "";
    const token = attribute.slice(0, 100).trim().split(/\s+/)[0].toLowerCase();
    return ROLE_TOKEN.test(token) ? token : "";
  }

  function roleOf(element) {
    const explicit = explicitRole(element);
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

  /**
   * Text of a subtree as a screen reader would read it (used for names).
   * Iterative, and it reads at most MAX_NAME_NODES nodes and MAX_NAME_TEXT
   * characters: a name is clipped far shorter anyway.
   */
  function subtreeText(root) {
    const parts = [];
    let length = 0;
    const add = (text) => {
      const piece = text.slice(0, MAX_NAME_TEXT).replace(/\s+/g, " ");
      parts.push(piece);
      length += piece.length;
    };
    const stack = [root];
    let taken = 1;
    while (stack.length > 0 && length < MAX_NAME_TEXT) {
      const node = stack.pop();
      if (node.nodeType === Node.TEXT_NODE) { add(node.data); continue; }
      if (node.nodeType !== Node.ELEMENT_NODE) continue;
      if (isAriaHidden(node)) continue;
      if (node !== root) {
        const label = node.getAttribute("aria-label");
        if (label && label.trim()) { add(` ${label} `); continue; }
      }
      const tag = node.tagName.toUpperCase();
      if (tag === "SVG") {
        // An icon-only button is often named by its <svg><title>.
        const title = Array.from(node.children).find((child) => child.tagName.toLowerCase() === "title");
        if (title) add(` ${title.textContent} `);
        continue;
      }
      if (SKIPPED_TAGS.has(tag)) continue;
      if (node.tagName === "IMG") { add(` ${node.getAttribute("alt") || ""} `); continue; }
      if (node.tagName === "INPUT" || node.tagName === "TEXTAREA" || node.tagName === "SELECT") continue;
      // Children in reverse onto the stack, so they come off in document
      // order; only as many as the node budget has left.
      const children = flatChildren(node);
      const count = Math.min(children.length, MAX_NAME_NODES - taken);
      taken += count;
      for (let index = count - 1; index >= 0; index -= 1) stack.push(children[index]);
    }
    return collapse(parts.join(""));
  }

  /** `node.textContent`, reading at most MAX_NAME_NODES nodes and MAX_NAME_TEXT characters. */
  function boundedTextContent(root) {
    let text = "";
    let visited = 0;
    let node = root;
    while (node && visited < MAX_NAME_NODES && text.length < MAX_NAME_TEXT) {
      visited += 1;
      const type = nodeTypeOf(node);
      if (type === Node.TEXT_NODE || type === Node.CDATA_SECTION_NODE) text += node.data.slice(0, MAX_NAME_TEXT);
      const child = FIRST_CHILD.call(node);
      if (child) {
        node = child;
        continue;
      }
      while (node && node !== root && !NEXT_SIBLING.call(node)) node = PARENT_NODE.call(node);
      node = node && node !== root ? NEXT_SIBLING.call(node) : null;
    }
    return text;
  }

  function textOfIds(element, ids) {
    const root = element.getRootNode();
    return collapse(ids.split(/\s+/)
      .map((id) => (root.getElementById ? root.getElementById(id) : document.getElementById(id)))
      .filter(Boolean)
      .map(boundedTextContent)
      .join(" "));
  }

  /** The element's accessible name as results show it: clipped to MAX_NAME_CHARS. */
  function accessibleName(element, role) {
    return clip(fullAccessibleName(element, role), MAX_NAME_CHARS);
  }

  /** The element's accessible name, whitespace collapsed, at most MAX_NAME_TEXT characters (not clipped for display). */
  function fullAccessibleName(element, role) {
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
      if (name) return name.slice(0, MAX_NAME_TEXT);
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
      const selected = Array.from(element.selectedOptions).slice(0, MAX_OPTIONS_LISTED).map(optionLabelOf);
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

  /**
   * ref, role and (clipped) name of an element a result is about to show
   * the model: what it shows is remembered as what a write through that
   * ref must still find (rememberShown).
   */
  function describe(element) {
    const role = roleOf(element);
    const fullName = fullAccessibleName(element, role);
    if (!describingForEngine) rememberShown(element, role, fullName);
    return { ref: refFor(element), role, name: clip(fullName, MAX_NAME_CHARS) };
  }

  // ------------------------------------------------------ shared helpers ---
  const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;

  /** `params` must be a plain object (an absent one counts as {}). */
  function objectParams(params, tool, usage) {
    if (params === undefined || params === null) return {};
    if (typeof params !== "object" || Array.isArray(params)) {
      throw new ToolError(`${tool} needs an object of parameters: ${usage}`);
    }
    return params;
  }

  function optionalString(params, key, tool) {
    const value = params[key];
    if (value === undefined || value === null) return null;
    if (typeof value !== "string") throw new ToolError(`${tool}: "${key}" must be a string.`);
    return value;
  }

  /** The element a ref names, visible or not; throws for unknown and stale refs. */
  function lookupRef(ref) {
    const match = typeof ref === "string" ? REF_PATTERN.exec(ref.trim()) : null;
    if (!match) {
      throw new ToolError(`${quote(String(ref))} is not a ref; refs look like "e12" (or "f3:e12" inside a frame). Call page_snapshot (or read_page) to get refs.`);
    }
    ref = ref.trim();
    const frame = match[1] === undefined ? 0 : Number(match[1]);
    // An unprefixed ref in a child frame is accepted: the engine routed it here.
    if (frame !== 0 && frame !== ownFrameId) {
      throw new ToolError(`Element ${ref} belongs to another frame (f${frame}) than this one; call page_snapshot to get fresh refs.`);
    }
    const local = match[2];
    const element = elementByRef.has(local) ? elementByRef.get(local).deref() : undefined;
    if (!element || !element.isConnected) {
      if (elementByRef.has(local) || Number(local.slice(1)) < nextRefNumber) {
        throw new ToolError(`Element ${ref} is no longer on the page (the page changed); call page_snapshot (or read_page) to get fresh refs.`);
      }
      throw new ToolError(`Unknown ref ${ref}; call page_snapshot (or read_page) to get the current refs.`);
    }
    return element;
  }

  // ------------------------------------------- what a page read showed ---
  // Between the page read the model (and the user, on the approval card:
  // www/panel.js describeRef) saw and the write that acts on one of its refs,
  // the page can relabel the element behind the ref ("Delete draft" becomes
  // "Delete account"). So page_snapshot and read_page remember the role and
  // name each listed ref's line showed, and every write through a ref (click,
  // type, select) recomputes them and refuses when they changed. Decisions:
  // - The role must be the same, and the name the same with whitespace
  //   collapsed (names always are) and letter case ignored: "Sign In" for
  //   "Sign in" is the same control re-rendered, not another one.
  // - The name is compared in full (up to MAX_NAME_TEXT characters), not as
  //   the line showed it (clipped to MAX_NAME_CHARS): a change past the cut
  //   still makes it another element, and the refusal says the two differ
  //   only after the shown part.
  // - The newest read that lists a ref, or result that names it with its
  //   role and name (a click's "Clicked button "Next" (e7)", an error's list
  //   of candidates), sets what is expected of it. The refusal below is the
  //   one message that names an element and sets nothing.
  // - A ref nothing showed in this document is refused: refs restart at e1
  //   in every document, and page_snapshot numbers elements it cuts from a
  //   long outline, so a ref the model did not see here names an element
  //   it knows nothing about (e5 of another page, or one past the cut).
  // - An approved write also carries the element the approval card showed
  //   the user (the engine asks describe_target when it resolves the call);
  //   it acts only on that element (refuseUnapproved).
  // - A refusal keeps what the read showed: acting again through the ref
  //   keeps failing until a new read shows the element as it is now.
  // - Read-only tools (scroll, wait_for) do not check.
  /** True while describe_target runs: what it finds is shown to no model. */
  let describingForEngine = false;

  /** element → { role, name } as the newest page read listing it showed it (name unclipped). */
  const shownByElement = new WeakMap();

  function rememberShown(element, role, fullName) {
    shownByElement.set(element, { role, name: fullName });
  }

  /** Throws when the element's role or name differs from what the newest read listing `ref` showed. */
  function refuseChanged(element, ref, what) {
    const shown = shownByElement.get(element);
    if (!shown) {
      throw new ToolError(
        `Element ${ref} was not listed by any page read of this page, so nothing was ${what}. ` +
          "Refs are numbered per page (and page_snapshot numbers the elements it leaves out): call page_snapshot (or read_page) and act on a ref it lists.",
      );
    }
    const role = roleOf(element);
    const name = fullAccessibleName(element, role);
    if (role === shown.role && name.toLowerCase() === shown.name.toLowerCase()) return;
    const before = `${shown.role} ${quote(clip(shown.name, MAX_NAME_CHARS))}`;
    const now = `${role} ${quote(clip(name, MAX_NAME_CHARS))}`;
    const past = before.toLowerCase() === now.toLowerCase() ? ` (the names differ after their first ${MAX_NAME_CHARS - 1} characters)` : "";
    throw new ToolError(
      `Element ${ref} changed since the page was read: it was ${before} and is now ${now}${past}, so nothing was ${what}. ` +
        "Call read_page (or page_snapshot) to see the page as it is now, and act on what it shows.",
    );
  }

  /**
   * Throws unless `element` is the one the user approved (`expected`:
   * { ref, role, name } from the engine; null for a call nobody described):
   * the same ref, the same role and the same full name, letter case aside.
   */
  function refuseUnapproved(element, expected, what) {
    if (!expected) return;
    const ref = refFor(element);
    const role = roleOf(element);
    const name = fullAccessibleName(element, role);
    if (ref === expected.ref && role === expected.role && name.toLowerCase() === expected.name.toLowerCase()) return;
    const approved = `${expected.role} ${quote(clip(expected.name, MAX_NAME_CHARS))} (${expected.ref})`;
    const now = `${role} ${quote(clip(name, MAX_NAME_CHARS))} (${ref})`;
    throw new ToolError(
      `The element this action was approved on, ${approved}, is not what the page has there now (${now}), so nothing was ${what}. ` +
        "Call page_snapshot to see the page as it is now, and act again only if it still makes sense.",
    );
  }

  /**
   * The engine's `expect` of a tool.execute message: { ref, role, name }
   * strings, or null when it has none (absent or null). Only the engine
   * writes it, but one that is there and is not that fails closed: the call
   * is refused, nothing done, rather than run as if nobody had approved it.
   */
  function expectedElement(message) {
    const expect = message.expect;
    if (expect === undefined || expect === null) return null;
    if (typeof expect === "object") {
      const { ref, role, name } = expect;
      if (typeof ref === "string" && typeof role === "string" && typeof name === "string") return { ref, role, name };
    }
    throw new ToolError(
      "The approval of this action could not be read, so nothing was done. " +
        "Ask for the action again; if it fails the same way, tell the user.",
    );
  }

  /**
   * The visible element a ref names; throws a model-readable error
   * otherwise. For a write (`what`: "clicked", "typed into", …) also when
   * the element is no longer what the newest page read showed (refuseChanged).
   */
  function resolveByRef(ref, what = null) {
    const element = lookupRef(ref);
    if (what) refuseChanged(element, ref.trim(), what);
    const problem = visibilityProblem(element);
    if (problem) {
      const { role, name } = describe(element);
      throw new ToolError(
        `Element ${ref.trim()} (${role} ${quote(name)}) is not visible on the page: it is ${problem}. ` +
          "It may appear after scrolling, opening a menu or waiting (wait_for); call page_snapshot (or read_page) to see what is visible now.",
      );
    }
    return element;
  }

  function isInert(element) {
    for (let node = element; node; node = flatParent(node)) {
      if (node.nodeType === Node.ELEMENT_NODE && node.hasAttribute("inert")) return true;
    }
    return false;
  }

  function refuseDisabled(element, ref, what) {
    if (isDisabled(element) || isInert(element)) {
      const { role, name } = describe(element);
      throw new ToolError(
        `Element ${ref} (${role} ${quote(name)}) is disabled, so it cannot be ${what} now. ` +
          "Something else on the page may have to happen first; call page_snapshot to check its state.",
      );
    }
  }

  /** Page-relative rect of the element, with same-origin frame offsets added. */
  function rectOf(element) {
    const rect = element.getBoundingClientRect();
    let x = rect.x;
    let y = rect.y;
    for (let frame = frameOf(element); frame; frame = frameOf(frame)) {
      const frameRect = frame.getBoundingClientRect();
      x += frameRect.x + frame.clientLeft;
      y += frameRect.y + frame.clientTop;
    }
    const round = (n) => Math.round(n * 10) / 10;
    return { x: round(x), y: round(y), width: round(rect.width), height: round(rect.height) };
  }

  /** The focused element, looking into shadow roots (open and closed) and same-origin frames. */
  function deepActiveElement() {
    let active = document.activeElement;
    for (;;) {
      // A document's (or root's) activeElement is the host of a focused control in a shadow root.
      const shadow = active ? shadowRootOf(active) : null;
      if (shadow && shadow.activeElement) {
        active = shadow.activeElement;
      } else if (active && active.tagName === "IFRAME") {
        let inner = null;
        try {
          inner = active.contentDocument && active.contentDocument.activeElement;
        } catch {
          inner = null;
        }
        if (!inner || inner === active.contentDocument.body) return active;
        active = inner;
      } else {
        return active;
      }
    }
  }

  function scrollIntoViewInstant(element) {
    element.scrollIntoView({ block: "center", inline: "nearest", behavior: "instant" });
  }

  /** The setter of `property` on the element's prototype chain (not an instance override). */
  function nativeSetter(element, property) {
    for (let proto = Object.getPrototypeOf(element); proto; proto = Object.getPrototypeOf(proto)) {
      const descriptor = Object.getOwnPropertyDescriptor(proto, property);
      if (descriptor && typeof descriptor.set === "function") return descriptor.set;
    }
    return null;
  }

  function setNativeProperty(element, property, value) {
    const setter = nativeSetter(element, property);
    if (setter) setter.call(element, value);
    else element[property] = value;
  }

  function fire(element, type, init = {}) {
    const options = { bubbles: true, cancelable: true, composed: true, ...init };
    let event;
    if (type === "input" || type === "beforeinput") {
      event = new InputEvent(type, options);
    } else if (type.startsWith("key")) {
      event = new KeyboardEvent(type, options);
    } else if (type.startsWith("pointer")) {
      event = new PointerEvent(type, options);
    } else if (type.startsWith("mouse") || type === "click") {
      event = new MouseEvent(type, options);
    } else {
      event = new Event(type, options);
    }
    return element.dispatchEvent(event);
  }

  /** A real-looking mouse press on the element (many widgets listen to mousedown, not click). */
  function press(element) {
    const rect = element.getBoundingClientRect();
    const at = {
      clientX: rect.left + rect.width / 2,
      clientY: rect.top + rect.height / 2,
      button: 0,
      view: (element.ownerDocument && element.ownerDocument.defaultView) || window,
    };
    fire(element, "pointerdown", { ...at, pointerType: "mouse", isPrimary: true, buttons: 1 });
    fire(element, "mousedown", { ...at, buttons: 1 });
    fire(element, "pointerup", { ...at, pointerType: "mouse", isPrimary: true });
    fire(element, "mouseup", at);
    element.click();
  }

  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

  /** Polls `check` (every frame-ish) until it returns a value or `ms` passed. */
  async function pollFor(check, ms) {
    const deadline = Date.now() + ms;
    for (;;) {
      const value = check();
      if (value) return value;
      if (Date.now() >= deadline) return null;
      await sleep(50);
    }
  }

  // ------------------------------------------------------- page_snapshot ---
  const LANDMARK_ROLES = new Set([
    "banner", "navigation", "main", "complementary", "contentinfo", "region", "form", "search",
    "dialog", "alertdialog", "group", "radiogroup", "list", "menu", "tablist", "toolbar",
  ]);
  const SECTIONING = "article, aside, main, nav, section, [role=article], [role=complementary], [role=main], [role=navigation], [role=region]";

  function headingLevel(element, tag, role) {
    const match = /^H([1-6])$/.exec(tag);
    if (role === "heading") {
      const level = Number(element.getAttribute("aria-level"));
      if (Number.isInteger(level) && level >= 1) return level;
      return match ? Number(match[1]) : 2;
    }
    if (match && !element.hasAttribute("role")) return Number(match[1]);
    return 0;
  }

  /** The structural role of a container worth showing (landmark, list, group), or null. */
  function containerRole(element, tag) {
    const explicit = explicitRole(element);
    if (explicit) return LANDMARK_ROLES.has(explicit) ? explicit : null;
    switch (tag) {
      case "MAIN": return "main";
      case "NAV": return "navigation";
      case "ASIDE": return "complementary";
      case "FORM": return "form";
      case "SEARCH": return "search";
      case "DIALOG": return "dialog";
      case "UL":
      case "OL":
      case "MENU":
        return "list";
      case "HEADER":
        return element.parentElement && element.parentElement.closest(SECTIONING) ? null : "banner";
      case "FOOTER":
        return element.parentElement && element.parentElement.closest(SECTIONING) ? null : "contentinfo";
      case "SECTION":
        return element.hasAttribute("aria-label") || element.hasAttribute("aria-labelledby") ? "region" : null;
      case "FIELDSET":
        return "group";
      default:
        return null;
    }
  }

  function containerName(element, tag) {
    const candidates = [
      () => (element.getAttribute("aria-labelledby") ? textOfIds(element, element.getAttribute("aria-labelledby")) : ""),
      () => element.getAttribute("aria-label"),
      () => {
        if (tag !== "FIELDSET") return "";
        const legend = Array.from(element.children).find((child) => child.tagName === "LEGEND");
        return legend ? subtreeText(legend) : "";
      },
      () => element.getAttribute("title"),
    ];
    for (const candidate of candidates) {
      const name = collapse(candidate());
      if (name) return clip(name, MAX_NAME_CHARS);
    }
    return "";
  }

  /** State words for the outline: value, checked, selected, expanded, disabled, required, … */
  function snapshotState(element, role) {
    const control = element.tagName === "LABEL" && element.control ? element.control : element;
    const tag = control.tagName.toUpperCase();
    const parts = [];
    const type = tag === "INPUT" ? control.type : "";
    if (tag === "INPUT" && (role === "textbox" || role === "searchbox" || role === "combobox" || role === "spinbutton") &&
        !["text", "search"].includes(type)) {
      parts.push(`type=${type}`);
    }
    if (tag === "INPUT" && (type === "checkbox" || type === "radio")) {
      parts.push(control.indeterminate ? "mixed" : control.checked ? "checked" : "unchecked");
    } else if (["checkbox", "radio", "switch", "menuitemcheckbox", "menuitemradio"].includes(role)) {
      const checked = control.getAttribute("aria-checked");
      parts.push(checked === "true" ? "checked" : checked === "mixed" ? "mixed" : "unchecked");
    } else if (tag === "INPUT" && type === "password") {
      if (control.value) parts.push("value=(hidden)");
    } else if (tag === "INPUT" && type === "file") {
      if (control.files && control.files.length) parts.push(`value=${quote(clip(Array.from(control.files, (f) => f.name).join(", "), MAX_VALUE_CHARS))}`);
    } else if (tag === "INPUT" || tag === "TEXTAREA") {
      if (control.value !== "") parts.push(`value=${quote(clip(collapse(control.value), MAX_VALUE_CHARS))}`);
    } else if (tag === "SELECT") {
      const selected = Array.from(control.selectedOptions).slice(0, MAX_OPTIONS_LISTED).map(optionLabelOf);
      if (selected.length) parts.push(`value=${quote(clip(selected.join(", "), MAX_VALUE_CHARS))}`);
      const options = Array.from(control.options);
      const listed = options.slice(0, MAX_OPTIONS_LISTED).map((option) => quote(pageString(option.label || option.text, 40)));
      if (options.length > listed.length) listed.push(`… ${options.length - listed.length} more`);
      if (listed.length) parts.push(`options: ${listed.join(", ")}`);
    } else if (control.isContentEditable) {
      const value = collapse(control.innerText);
      if (value) parts.push(`value=${quote(clip(value, MAX_VALUE_CHARS))}`);
    } else if (["combobox", "textbox", "searchbox", "spinbutton", "slider"].includes(role)) {
      const value = control.getAttribute("aria-valuetext") || control.getAttribute("aria-valuenow");
      if (value) parts.push(`value=${quote(clip(collapse(value), MAX_VALUE_CHARS))}`);
    }
    if (control.getAttribute("aria-selected") === "true") parts.push("selected");
    if (control.getAttribute("aria-pressed") === "true") parts.push("pressed");
    if (tag === "SUMMARY" && control.parentElement && control.parentElement.tagName === "DETAILS") {
      parts.push(control.parentElement.open ? "expanded" : "collapsed");
    } else if (control.hasAttribute("aria-expanded")) {
      parts.push(control.getAttribute("aria-expanded") === "true" ? "expanded" : "collapsed");
    }
    if (isDisabled(control)) parts.push("disabled");
    if (control.required || control.getAttribute("aria-required") === "true") parts.push("required");
    if (((tag === "INPUT" || tag === "TEXTAREA") && control.readOnly) || control.getAttribute("aria-readonly") === "true") parts.push("readonly");
    if (control.getAttribute("aria-invalid") === "true") parts.push("invalid");
    if (control === deepActiveElement()) parts.push("focused");
    return parts.length ? ` ${parts.join(" ")}` : "";
  }

  /**
   * The outline as a tree: containers `{ label, element, children }` and
   * leaves `{ line, element, interactive }`, in document order, down to
   * MAX_DEPTH elements below the start (the root's `deepCut`: something lies deeper).
   */
  function buildOutline() {
    const root = { label: null, element: null, children: [], deepCut: false };
    // `plain`: the block has text of its own, not only the text of its links
    // (a block that is just a link is the link's line alone).
    // `length` and `hasText`: of the buffer, which holds no more than its line can show.
    const newBlock = (container, element) => ({ container, element, buffer: [], length: 0, hasText: false, pending: [], plain: false });

    /** Adds text to the block, whitespace collapsed, until the block has more than its line shows. */
    function append(block, text) {
      if (block.length > MAX_BLOCK_CHARS * 2) return;
      const piece = text.slice(0, MAX_BLOCK_CHARS * 8).replace(/\s+/g, " ");
      if (piece === "" || (piece === " " && block.buffer.length > 0 && block.buffer[block.buffer.length - 1].endsWith(" "))) return;
      block.buffer.push(piece);
      block.length += piece.length;
      if (/\S/.test(piece)) block.hasText = true;
    }

    /** Emits the block's text (one line), then the elements found inside it. */
    function flush(block) {
      const text = collapse(block.buffer.join(""));
      if (text && block.plain) block.container.children.push({ line: `text ${quote(clip(text, MAX_BLOCK_CHARS))}`, element: block.element });
      for (const item of block.pending) block.container.children.push(item);
      block.buffer = [];
      block.length = 0;
      block.hasText = false;
      block.pending = [];
      block.plain = false;
    }

    function add(block, item) {
      // Inside a sentence, the element follows the sentence it sits in.
      if (block.hasText) block.pending.push(item);
      else block.container.children.push(item);
    }

    function walkChildren(element, block, ctx, depth) {
      if (VALUE_TAGS.has(element.tagName.toUpperCase())) return;
      for (const child of flatChildren(element)) walk(child, block, ctx, depth + 1);
    }

    function walk(node, block, ctx, depth) {
      if (node.nodeType === Node.TEXT_NODE) {
        if (ctx.visible && !ctx.suppress) {
          const text = node.data.slice(0, MAX_BLOCK_CHARS * 8);
          append(block, text);
          if (!ctx.inLink && /\S/.test(text)) block.plain = true;
        }
        return;
      }
      if (node.nodeType !== Node.ELEMENT_NODE) return;
      if (depth > MAX_DEPTH) {
        root.deepCut = true;
        return;
      }
      const element = node;
      const tag = element.tagName.toUpperCase();
      if (tag === "IFRAME" || tag === "FRAME") {
        walkFrame(element, block, ctx, depth);
        return;
      }
      if (SKIPPED_TAGS.has(tag) || isAriaHidden(element) || element.hasAttribute("inert")) return;
      const style = styleOf(element);
      if (style.display === "none" || Number(style.opacity) === 0) return;
      const visible = style.visibility === "visible";
      const display = style.display;
      // Table cells stay on their row's line, separated like read_page does.
      const cell = display === "table-cell";
      const isBlock = !cell && !display.startsWith("inline") && display !== "contents";
      const hidesChildren = style.contentVisibility === "hidden";
      const role = roleOf(element);
      const inner = { visible, suppress: ctx.suppress, inLink: ctx.inLink };

      const level = headingLevel(element, tag, role);
      if (level) {
        flush(block);
        const text = subtreeText(element);
        if (visible && text && hasBox(element)) {
          block.container.children.push({ line: `h${level} ${quote(clip(text, MAX_HEADING_CHARS))}`, element });
        }
        const headingBlock = newBlock(block.container, element);
        if (!hidesChildren) walkChildren(element, headingBlock, { visible, suppress: true }, depth);
        flush(headingBlock);
        return;
      }

      if (visible && isInteractive(element, role) && hasBox(element)) {
        const ref = refFor(element);
        const fullName = fullAccessibleName(element, role);
        const name = clip(fullName, MAX_NAME_CHARS);
        const shown = { role, fullName };
        add(block, { line: `[${ref}] ${role} ${quote(name)}${snapshotState(element, role)}`, element, interactive: true, shown });
        // Nested controls are listed too; the text is the element's name already,
        // except for a link inside a sentence, which stays part of the sentence.
        const inlineLink = role === "link" && display === "inline";
        if (!hidesChildren && !element.isContentEditable) walkChildren(element, block, { visible, suppress: ctx.suppress || !inlineLink, inLink: true }, depth);
        return;
      }

      const container = containerRole(element, tag);
      if (container) {
        flush(block);
        const name = containerName(element, tag);
        const node = { label: `${container}${name ? ` ${quote(name)}` : ""}`, element, children: [] };
        block.container.children.push(node);
        const innerBlock = newBlock(node, element);
        if (!hidesChildren) walkChildren(element, innerBlock, inner, depth);
        flush(innerBlock);
        return;
      }

      // A label's text is the name of its control, a legend's the name of its
      // group: not repeated as text.
      if (tag === "LABEL" && element.control) inner.suppress = true;
      if (tag === "LEGEND" && element.parentElement && element.parentElement.tagName === "FIELDSET") inner.suppress = true;

      if (isBlock) {
        flush(block);
        const innerBlock = newBlock(block.container, element);
        if (!hidesChildren) walkChildren(element, innerBlock, inner, depth);
        flush(innerBlock);
        return;
      }
      if (tag === "BR") append(block, " ");
      if (cell && block.hasText) append(block, " | ");
      if (tag === "IMG" && visible && !inner.suppress) {
        const alt = collapse(element.getAttribute("alt"));
        if (alt) {
          append(block, ` [image: ${alt}] `);
          if (!ctx.inLink) block.plain = true;
        }
      }
      if (display === "inline-block" || display.startsWith("inline-")) append(block, " ");
      if (!hidesChildren) walkChildren(element, block, inner, depth);
      if (display === "inline-block" || display.startsWith("inline-")) append(block, " ");
    }

    function walkFrame(frame, block, ctx, depth) {
      if (isAriaHidden(frame) || !isVisible(frame)) return;
      flush(block);
      const name = collapse(frame.getAttribute("title") || frame.getAttribute("name") || frame.getAttribute("aria-label") || "");
      let doc = null;
      try {
        doc = frame.contentDocument;
      } catch {
        doc = null;
      }
      const label = `iframe${name ? ` ${quote(clip(name, MAX_NAME_CHARS))}` : ""}`;
      if (!doc || !doc.body) {
        // Another origin: the engine reads that frame itself and splices it in here.
        block.container.children.push({ line: `${label} (other site: its content is not shown)`, element: frame, frameSrc: frame.src || "" });
        return;
      }
      const node = { label, element: frame, children: [] };
      block.container.children.push(node);
      const innerBlock = newBlock(node, frame);
      walk(doc.body, innerBlock, { visible: true, suppress: ctx.suppress }, depth + 1);
      flush(innerBlock);
    }

    // With a modal dialog open, only the dialog can be used.
    const start = openModal(document) || document.body;
    if (start) {
      const block = newBlock(root, start);
      walk(start, block, { visible: true, suppress: false }, 0);
      flush(block);
    }
    return root;
  }

  /** Flat list of outline entries `{ depth, text, element, interactive, container, parent, frameSrc?, shown? }`, empty containers dropped. */
  function flattenOutline(root) {
    const entries = [];
    const hasContent = (node) => (node.children ? node.children.some(hasContent) : true);
    (function visit(node, depth, parent) {
      for (const child of node.children) {
        if (child.children) {
          if (!hasContent(child)) continue;
          const index = entries.length;
          entries.push({ depth, text: child.label, element: child.element, interactive: false, container: true, parent });
          visit(child, depth + 1, index);
        } else {
          entries.push({ depth, text: child.line, element: child.element, interactive: child.interactive === true, container: false, parent, frameSrc: child.frameSrc, shown: child.shown });
        }
      }
    })(root, 0, -1);
    return entries;
  }

  function pageSnapshot(params) {
    objectParams(params, "page_snapshot", "call it with {}.");
    forgetCollectedRefs();
    const outline = buildOutline();
    const entries = flattenOutline(outline);
    const scroller = document.scrollingElement || document.documentElement;
    const scrollY = Math.round(window.scrollY);
    const scrollHeight = Math.round(scroller ? scroller.scrollHeight : 0);
    const viewport = Math.round(window.innerHeight);
    const title = pageTitle();
    const url = pageUrl();
    const header = [
      `Title: ${title || "(untitled)"}`,
      `URL: ${url}`,
      `Scroll: ${scrollY} of ${scrollHeight} px (viewport ${viewport} px)`,
    ];
    if (openModal(document)) header.push("A modal dialog is open: only the dialog is shown, the rest of the page cannot be used until it is closed.");
    header.push("");
    const lineOf = (entry) => `${"  ".repeat(entry.depth)}${entry.text}`;
    const interactiveCount = entries.filter((entry) => entry.interactive).length;
    let included;
    const total = entries.reduce((sum, entry) => sum + lineOf(entry).length + 1, 0);
    const limit = ownFrameId > 0 ? MAX_FRAME_SNAPSHOT_CHARS : MAX_SNAPSHOT_CHARS;
    // A long (clipped) title and URL may take from the outline, never all of it.
    const budget = Math.max(limit - header.join("\n").length - 400, Math.floor(limit / 2));
    if (total <= budget) {
      included = entries.map(() => true);
    } else {
      // Too large: show the part around the viewport, with its containers.
      included = entries.map(() => false);
      let used = 0;
      const take = (index) => {
        if (included[index]) return true;
        const needed = [];
        for (let i = index; i >= 0 && !included[i]; i = entries[i].parent) needed.push(i);
        const cost = needed.reduce((sum, i) => sum + lineOf(entries[i]).length + 1, 0);
        if (used + cost > budget) return false;
        used += cost;
        for (const i of needed) included[i] = true;
        return true;
      };
      let start = entries.findIndex((entry) => {
        if (entry.container || !entry.element || !entry.element.isConnected) return false;
        return rectOf(entry.element).y + entry.element.getBoundingClientRect().height >= 0;
      });
      if (start < 0) start = entries.length - 1;
      let next = start;
      while (next < entries.length && take(next)) next += 1;
      for (let previous = start - 1; previous >= 0 && next >= entries.length; previous -= 1) {
        if (!take(previous)) break;
      }
    }
    const lines = [...header];
    const omittedAbove = { elements: 0, interactive: 0 };
    const omittedBelow = { elements: 0, interactive: 0 };
    const firstIncluded = included.indexOf(true);
    // Where the iframe lines of other-origin frames are, for the engine to splice their outlines in.
    const frames = [];
    entries.forEach((entry, index) => {
      if (included[index]) {
        // Only lines the model sees set what a ref's element is expected to be.
        if (entry.shown) rememberShown(entry.element, entry.shown.role, entry.shown.fullName);
        if (entry.frameSrc !== undefined && frames.length < MAX_FRAMES_REPORTED) frames.push({ line: lines.length, src: clip(entry.frameSrc, MAX_URL_CHARS) });
        lines.push(lineOf(entry));
        return;
      }
      if (entry.container) return;
      const bucket = index < firstIncluded ? omittedAbove : omittedBelow;
      bucket.elements += 1;
      if (entry.interactive) bucket.interactive += 1;
    });
    if (entries.length === 0) lines.push("(the page shows nothing)");
    const note = (count, where, how) =>
      `… ${plural(count.elements, "more element")} omitted ${where} (${count.interactive} interactive); ${how} or use wait_for/read_page.`;
    if (omittedAbove.elements > 0) {
      lines.splice(header.length, 0, note(omittedAbove, "above", "scroll up"));
      for (const frame of frames) frame.line += 1;
    }
    if (omittedBelow.elements > 0) lines.push(note(omittedBelow, "below", "scroll down"));
    if (outline.deepCut) lines.push(DEEP_CUT_NOTE);
    return {
      ok: true,
      content: lines.join("\n"),
      details: {
        title,
        url,
        scrollY,
        scrollHeight,
        viewportHeight: viewport,
        interactiveCount,
        omitted: omittedAbove.elements + omittedBelow.elements,
        ...(outline.deepCut ? { deepContentCut: true } : {}),
        ...(frames.length ? { frames } : {}),
      },
    };
  }

  // ------------------------------------------------------------ read_page ---
  // With a modal dialog open (openModal), read_page still gives the page's
  // text, as a sighted user still sees it behind the dialog's backdrop, but:
  // - a header line says a modal dialog is open (page_snapshot says the same);
  // - the dialog's text comes first, under `Dialog "name":`, and takes the
  //   text budget first; the rest of the page follows under
  //   `Behind the dialog:`, the dialog's text left out there;
  // - only the dialog's elements are listed (and get refs): the ones behind
  //   it are only counted, in the words a click on one of them is refused
  //   with (visibilityProblem), as they cannot be used until it is closed.
  const ELEMENTS_HEADER = "Interactive elements:";
  const BEHIND_DIALOG_HEADER = "Behind the dialog:";
  const MODAL_READ_NOTE =
    "A modal dialog is open: its text comes first and only its elements are listed; " +
    "the page behind it is shown as text only and cannot be used until the dialog is closed.";
  // Page text never reads like the lines this tool writes itself: a line of
  // text that starts like an element line (`[`, a token without spaces, `]`:
  // "[e1] button …", but also a footnote "[1] …") or that is one of its
  // section headers (the element list's, the dialog's, `Behind the
  // dialog:`) or its modal note gets a backslash in front ("\[e1] button
  // …"). Other lines are shown as they are.
  const LOOKS_LIKE_ELEMENT_LINE = /^\[[^\]\s]*\]/;
  const LOOKS_LIKE_DIALOG_HEADER = /^Dialog(?: ".*")?:$/;
  const escapePageLine = (line) =>
    LOOKS_LIKE_ELEMENT_LINE.test(line) || LOOKS_LIKE_DIALOG_HEADER.test(line) || line === ELEMENTS_HEADER ||
    line === BEHIND_DIALOG_HEADER || line.startsWith("A modal dialog is open:")
      ? `\\${line}`
      : line;
  const pageLines = (text) => text.split("\n").map(escapePageLine);

  function readPage(params) {
    if (params !== undefined && params !== null && (typeof params !== "object" || Array.isArray(params))) {
      throw new ToolError("read_page takes no parameters; call it with {}.");
    }
    forgetCollectedRefs();
    const modal = openModal(document);
    const title = pageTitle();
    const url = pageUrl();
    const lines = [`Title: ${title || "(untitled)"}`, `URL: ${url}`];
    let truncated;
    let deepCut;
    let interactive;
    let covered = 0;
    if (!modal) {
      const page = scanPage({ wantText: true });
      ({ truncated, deepCut, interactive } = page);
      lines.push("");
      if (page.text) lines.push(...pageLines(page.text));
      else lines.push("(no visible text)");
    } else {
      const dialog = scanPage({ wantText: true, root: modal });
      // The page behind gets what the dialog left of the text budget; its
      // elements are walked only to be counted.
      const left = MAX_TEXT_CHARS - dialog.text.length;
      const behind = scanPage({ wantText: !dialog.truncated && left > 0, maxText: Math.max(left, 0), skip: modal });
      ({ interactive } = dialog);
      truncated = dialog.truncated || behind.truncated;
      deepCut = dialog.deepCut || behind.deepCut;
      covered = behind.interactive.length;
      const name = containerName(modal, "DIALOG");
      lines.push(MODAL_READ_NOTE, "", `Dialog${name ? ` ${quote(name)}` : ""}:`);
      lines.push(...(dialog.text ? pageLines(dialog.text) : ["(no visible text)"]));
      if (!dialog.truncated) {
        lines.push("", BEHIND_DIALOG_HEADER);
        lines.push(...(behind.text ? pageLines(behind.text) : [left > 0 ? "(no visible text)" : "(not shown: the dialog's text took the whole text budget)"]));
      }
    }
    if (truncated) {
      lines.push(`[Text truncated at ${MAX_TEXT_CHARS} characters; the rest of the page is not shown.]`);
    }
    if (deepCut) lines.push(`[Content nested more than ${MAX_DEPTH} elements deep is not shown.]`);
    lines.push("", ELEMENTS_HEADER);
    const listed = interactive.slice(0, MAX_INTERACTIVE);
    for (const element of listed) {
      const role = roleOf(element);
      const fullName = fullAccessibleName(element, role);
      rememberShown(element, role, fullName);
      const ref = refFor(element);
      const name = clip(fullName, MAX_NAME_CHARS);
      lines.push(`[${ref}] ${role} ${quote(name)}${stateOf(element, role)}`);
    }
    if (listed.length === 0) lines.push("(none)");
    if (interactive.length > listed.length) {
      lines.push(`[${interactive.length - listed.length} more interactive elements not listed; use click { text } to reach them.]`);
    }
    if (covered > 0) {
      lines.push(
        `[${plural(covered, "interactive element")} behind the dialog ${covered === 1 ? "is" : "are"} not listed: ` +
          `covered by the open modal dialog (close or answer the dialog first).]`,
      );
    }
    return {
      ok: true,
      content: lines.join("\n"),
      details: {
        title,
        url,
        textTruncated: truncated,
        interactiveCount: interactive.length,
        ...(modal ? { modalDialog: true, coveredInteractiveCount: covered } : {}),
        ...(deepCut ? { deepContentCut: true } : {}),
      },
    };
  }

  // ---------------------------------------------------------------- click ---
  const MAX_CANDIDATES_LISTED = 10;

  /**
   * The element `click { text }` names. A click is a write, so the text must
   * be the element's accessible name, or else its visible text, exactly (case
   * and spacing aside), and the element must pass the checks a ref passes
   * (visible, not covered by a modal dialog). A partial match is never
   * clicked: the error lists the partial matches with their refs instead.
   */
  function resolveByText(wanted) {
    return whileReading(() => findByText(wanted));
  }

  /** resolveByText's search (while reading). */
  function findByText(wanted) {
    const target = collapse(wanted).toLowerCase();
    const shown = quote(clip(collapse(wanted), MAX_NAME_CHARS));
    const { interactive } = scanPage({ wantText: false });
    const byName = [];
    const byText = [];
    const partial = [];
    for (const element of interactive) {
      const name = accessibleName(element, roleOf(element)).toLowerCase();
      if (name === target) {
        byName.push(element);
        continue;
      }
      const text = collapse(element.innerText || element.textContent).toLowerCase();
      if (text === target) byText.push(element);
      else if (name.includes(target) || text.includes(target)) partial.push(element);
    }
    const usable = (elements) => elements.filter((element) => visibilityProblem(element) === null);
    for (const exact of [usable(byName), usable(byText)]) {
      if (exact.length > 0) return { element: exact[0], alternatives: exact.length - 1 };
    }
    const blocked = byName[0] || byText[0];
    if (blocked) {
      const { ref, role, name } = describe(blocked);
      throw new ToolError(
        `${capitalize(role)} ${quote(name)} (${ref}) has the text ${shown} but cannot be clicked: it is ${visibilityProblem(blocked)}. ` +
          "Call page_snapshot (or read_page) to see what can be clicked now.",
      );
    }
    const near = usable(partial);
    if (near.length > 0) {
      const listed = near.slice(0, MAX_CANDIDATES_LISTED).map((element) => {
        const { ref, role, name } = describe(element);
        return `${role} ${quote(name)} (${ref})`;
      });
      if (near.length > listed.length) listed.push(`… ${near.length - listed.length} more`);
      throw new ToolError(
        `No element is named exactly ${shown}, so nothing was clicked. Elements whose name or text contains it: ${listed.join(", ")}. ` +
          "Click one of them by its ref, or call page_snapshot (or read_page) to see the elements you can click.",
      );
    }
    throw new ToolError(`No visible interactive element matches the text ${shown}; call page_snapshot (or read_page) to see the elements you can click.`);
  }

  function isFocusable(element) {
    return element.tabIndex >= 0 || element.isContentEditable || element.matches("a[href], button, input, select, textarea, summary");
  }

  function click(params, context = {}) {
    if (params === null || typeof params !== "object" || Array.isArray(params)) {
      throw new ToolError('click needs an object: { "ref": "e12" } (from page_snapshot or read_page) or { "text": "visible text" }.');
    }
    const { ref, text } = params;
    const hasRef = typeof ref === "string" && ref.trim() !== "";
    const hasText = typeof text === "string" && text.trim() !== "";
    if (!hasRef && !hasText) {
      throw new ToolError('click needs "ref" (like "e12", from page_snapshot or read_page) or "text" (the visible text of the element).');
    }
    let element;
    let alternatives = 0;
    if (hasRef) {
      element = resolveByRef(ref.trim(), "clicked");
    } else {
      ({ element, alternatives } = resolveByText(text));
    }
    refuseUnapproved(element, context.expect, "clicked");
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

  // ----------------------------------------------------------------- type ---
  const TYPEABLE_INPUT_TYPES = new Set([
    "text", "search", "email", "tel", "url", "password", "number", "date", "datetime-local", "month",
    "week", "time", "color", "range",
  ]);

  /** The element text goes into (`kind` "value" or "editable"), or a ToolError saying why not. */
  function editableTarget(element, ref) {
    let target = element;
    if (target.tagName === "LABEL" && target.control) target = target.control;
    const { role, name } = describe(element);
    const what = `Element ${ref} (${role} ${quote(name)})`;
    const tag = target.tagName.toUpperCase();
    if (tag === "INPUT") {
      const type = target.type;
      if (type === "checkbox" || type === "radio") throw new ToolError(`${what} is a ${type}; use click to check or uncheck it instead of type.`);
      if (["button", "submit", "reset", "image"].includes(type)) throw new ToolError(`${what} is a button; use click instead of type.`);
      if (type === "file") throw new ToolError(`${what} is a file picker; text cannot be typed into it (uploading files is not supported).`);
      if (!TYPEABLE_INPUT_TYPES.has(type)) throw new ToolError(`${what} is an input of type ${type} that does not take typed text.`);
      return { target, kind: "value" };
    }
    if (tag === "TEXTAREA") return { target, kind: "value" };
    if (tag === "SELECT") throw new ToolError(`${what} is a drop-down list; use select with the option's label instead of type.`);
    if (target.isContentEditable) {
      let host = target;
      while (host.parentElement && host.parentElement.isContentEditable) host = host.parentElement;
      return { target: host, kind: "editable" };
    }
    throw new ToolError(
      `${what} is not editable (not an input, textarea or contenteditable element), so nothing was typed. ` +
        "Call page_snapshot and use the ref of a textbox, searchbox or combobox.",
    );
  }

  /** The button implicit submission would use: the form's first submit button. */
  function defaultButton(form) {
    for (const control of formControls(form)) {
      const tag = control.tagName;
      if ((tag === "BUTTON" && control.type === "submit") || (tag === "INPUT" && (control.type === "submit" || control.type === "image"))) {
        return control;
      }
    }
    return null;
  }

  /**
   * Enter on the target: keydown/keypress/keyup; for an input in a form, the
   * form's implicit submission (requestSubmit) unless the page handled Enter.
   * The form and the document are used through their prototypes (see DOM
   * clobbering above). Returns a sentence for the result.
   */
  function pressEnter(target, kind) {
    const doc = target.ownerDocument;
    // `submit` is not composed: a form's in a shadow root (open or closed) ends at that root.
    const root = Node.prototype.getRootNode.call(target);
    const watched = root === doc ? [doc] : [doc, root];
    let submitted = false;
    const onSubmit = () => {
      submitted = true;
    };
    for (const where of watched) onEvent(where, "submit", onSubmit);
    try {
      const key = { key: "Enter", code: "Enter", keyCode: 13, which: 13, view: doc.defaultView };
      const down = fire(target, "keydown", key);
      let pressed = true;
      if (down) pressed = fire(target, "keypress", { ...key, charCode: 13 });
      fire(target, "keyup", key);
      if (submitted) return { text: "pressed Enter: the form was submitted", submitted: true };
      if (!down || !pressed) return { text: "pressed Enter (the page handled the key)", submitted: false };
      const form = kind === "value" && target.tagName === "INPUT" ? target.form : null;
      if (!form || !target.isConnected) {
        return { text: kind === "value" && target.tagName === "INPUT" ? "pressed Enter (the field is not in a form, so nothing was submitted by the browser)" : "pressed Enter", submitted: false };
      }
      const button = defaultButton(form);
      if (button && isDisabled(button)) {
        return { text: `pressed Enter, but the form was not submitted: its submit button ${quote(accessibleName(button, "button"))} is disabled`, submitted: false };
      }
      if (!formProperty(form, "noValidate") && !formCheckValidity(form)) {
        const invalid = formControls(form).find((control) => control.willValidate && !control.validity.valid);
        const label = invalid ? `${describe(invalid).ref} ${quote(accessibleName(invalid, roleOf(invalid)))}` : "a field";
        const why = invalid ? `: ${pageString(invalid.validationMessage, MAX_LABEL_CHARS)}` : "";
        // Lets the page show its own validation messages, as a real Enter would.
        formRequestSubmit(form, button);
        return { text: `pressed Enter, but the form was not submitted: ${label} is invalid${why}`, submitted: false };
      }
      formRequestSubmit(form, button);
      return { text: submitted ? "pressed Enter: the form was submitted" : "pressed Enter (the form's submission was cancelled by the page)", submitted };
    } finally {
      for (const where of watched) offEvent(where, "submit", onSubmit);
    }
  }

  // Input types whose value the browser sanitizes: a value such a field
  // rejects is replaced (by "", or for color and range by a default or a
  // clamped value), and the old value is gone.
  const SANITIZED_INPUT_TYPES = new Set(["number", "range", "date", "datetime-local", "month", "week", "time", "color"]);
  const VALUE_EXAMPLES = {
    number: "such as 42",
    date: "such as 2024-05-31",
    time: "such as 13:45",
    month: "such as 2024-05",
    week: "such as 2024-W22",
    "datetime-local": "such as 2024-05-31T13:45",
    color: "such as #ff8800",
  };

  /**
   * What `field` (an input of a SANITIZED_INPUT_TYPES type) would hold if
   * `text` were typed, or null when it takes `text`. Tried on a detached
   * <input> of the same type, min, max and step, so a value the field rejects
   * never touches the page's field. A color's letter case and the normal form
   * of a date and time ("2024-05-31 13:45" → "2024-05-31T13:45") count as taken.
   */
  function rejectedValue(field, text) {
    const probe = Document.prototype.createElement.call(document, "input");
    probe.type = field.type;
    for (const attribute of ["min", "max", "step"]) {
      const value = field.getAttribute(attribute);
      if (value !== null) probe.setAttribute(attribute, value);
    }
    probe.value = text;
    const kept = probe.value;
    if (kept === text) return null;
    if (field.type === "color" && kept === text.toLowerCase()) return null;
    if (field.type === "datetime-local" && kept !== "") return null;
    return kept;
  }

  function typeText(params, context = {}) {
    params = objectParams(params, "type", '{ "ref": "e12", "text": "…", "submit": false }.');
    const ref = optionalString(params, "ref", "type");
    if (!ref || !ref.trim()) throw new ToolError('type needs "ref" (like "e12", from page_snapshot) and "text".');
    if (typeof params.text !== "string") throw new ToolError('type needs "text": the text to type, as a string.');
    if (params.submit !== undefined && params.submit !== null && typeof params.submit !== "boolean") {
      throw new ToolError('type: "submit" must be true or false.');
    }
    const text = params.text;
    const element = resolveByRef(ref.trim(), "typed");
    refuseUnapproved(element, context.expect, "typed");
    const { target, kind } = editableTarget(element, ref.trim());
    refuseDisabled(target, ref.trim(), "typed into");
    const { ref: elementRef, role, name } = describe(element);
    const readOnly = (kind === "value" && target.readOnly) || target.getAttribute("aria-readonly") === "true";
    if (readOnly) {
      throw new ToolError(`Element ${elementRef} (${role} ${quote(name)}) is read-only; its text cannot be changed. Call page_snapshot to find an editable field.`);
    }
    const secret = kind === "value" && target.tagName === "INPUT" && target.type === "password";
    const sanitizing = kind === "value" && target.tagName === "INPUT" && SANITIZED_INPUT_TYPES.has(target.type);
    if (sanitizing && rejectedValue(target, text) !== null) {
      const type = target.type;
      const hint = type === "range"
        ? `between ${pageString(target.min, 40) || "0"} and ${pageString(target.max, 40) || "100"}`
        : VALUE_EXAMPLES[type];
      const old = target.value;
      throw new ToolError(
        `Element ${elementRef} (${role} ${quote(name)}) is a ${type} field and did not accept ${quote(clip(text, 200))}; ` +
          `type a valid ${type} value ${hint}. Nothing was typed: the field still ${old ? `holds ${quote(clip(old, MAX_VALUE_CHARS))}` : "is empty"}.`,
      );
    }

    scrollIntoViewInstant(target);
    if (typeof target.focus === "function") target.focus({ preventScroll: true });
    if (kind === "value") {
      setNativeProperty(target, "value", text);
      try {
        if (typeof target.setSelectionRange === "function") target.setSelectionRange(text.length, text.length);
      } catch {
        // email, number, … have no selection API
      }
      fire(target, "input", { cancelable: false, inputType: "insertText", data: text });
      fire(target, "change", { cancelable: false });
    } else {
      target.textContent = text;
      try {
        const selection = target.ownerDocument.getSelection();
        const range = target.ownerDocument.createRange();
        range.selectNodeContents(target);
        range.collapse(false);
        selection.removeAllRanges();
        selection.addRange(range);
      } catch {
        // no selection in this document
      }
      fire(target, "input", { cancelable: false, inputType: "insertText", data: text });
    }
    const rect = rectOf(target);
    const actual = kind === "value" ? target.value : target.textContent;
    const shown = secret ? `${plural(text.length, "character")}` : quote(clip(text, 200));
    let content = `Typed ${shown} into ${role} ${quote(name)} (${elementRef})`;
    if (!secret && actual !== text) {
      const why = sanitizing ? "the field keeps the value in this form, or the page changed it" : "the page changed or limited the text";
      content += `; the field now shows ${quote(clip(actual, 200))} (${why})`;
    } else if (secret && actual.length !== text.length) {
      content += `; the field now holds ${plural(actual.length, "character")} (the page limited the text)`;
    }
    const details = { ref: elementRef, name, role, rect, length: text.length };
    if (secret) details.secret = true;
    if (params.submit === true) {
      const enter = pressEnter(target, kind);
      content += ` and ${enter.text}`;
      details.submitted = enter.submitted;
    }
    return { ok: true, content: `${content}.`, details };
  }

  // --------------------------------------------------------------- select ---
  /** An option's label as results show it (clipped: the page chooses its length). */
  const optionLabelOf = (option) => pageString(option.label || option.text, MAX_LABEL_CHARS);
  const optionValueOf = (candidate) => clip(candidate.value, MAX_LABEL_CHARS);

  /** Exact, then case-insensitive, then contains (label or value). */
  function matchOption(candidates, wanted) {
    const exact = collapse(wanted);
    const lower = exact.toLowerCase();
    const tiers = [
      (c) => c.label === exact || c.value === wanted || c.value === exact,
      (c) => c.label.toLowerCase() === lower || c.value.toLowerCase() === lower,
      (c) => lower !== "" && (c.label.toLowerCase().includes(lower) || c.value.toLowerCase().includes(lower)),
    ];
    for (const [index, tier] of tiers.entries()) {
      const matches = candidates.filter(tier);
      if (matches.length === 0) continue;
      const enabled = matches.filter((c) => !c.disabled);
      if (enabled.length === 0) return { disabled: matches[0] };
      return { match: enabled[0], others: enabled.length - 1, how: ["exact", "case-insensitive", "partial"][index] };
    }
    return {};
  }

  function optionList(candidates) {
    const listed = candidates.slice(0, MAX_OPTIONS_IN_ERROR).map((c) => `${quote(c.label || optionValueOf(c))}${c.disabled ? " (disabled)" : ""}`);
    if (candidates.length > listed.length) listed.push(`… ${candidates.length - listed.length} more`);
    return listed.length ? listed.join(", ") : "(none)";
  }

  function noMatch(elementRef, role, name, wanted, result, candidates) {
    if (result.disabled) {
      return new ToolError(`The option ${quote(result.disabled.label)} of ${role} ${quote(name)} (${elementRef}) is disabled and cannot be chosen. Options: ${optionList(candidates)}.`);
    }
    return new ToolError(`No option matches ${quote(wanted)} in ${role} ${quote(name)} (${elementRef}). Options: ${optionList(candidates)}. Call select again with one of them.`);
  }

  /** Ids in an attribute (aria-controls, aria-owns) resolved in the element's tree. */
  function elementsOfIds(element, attribute) {
    const ids = (element.getAttribute(attribute) || "").trim();
    if (!ids) return [];
    const root = element.getRootNode();
    return ids.split(/\s+/).map((id) => (root.getElementById ? root.getElementById(id) : document.getElementById(id))).filter(Boolean);
  }

  /**
   * The visible list box of a combobox, or null: the one its aria-controls
   * or aria-owns names (the element named, or one inside it, in its shadow
   * roots too: ids do not reach into a component, so a page names the
   * host), else one inside it (in its own shadow root too), else the only
   * visible one in the combobox's root (a component keeps its popup next to
   * its field), else the only visible one on the page, in the document or
   * any shadow root (a popup portal). A combobox that names its list box is
   * given no other: while the named one is hidden its popup is closed.
   * Several visible ones are not guessed between. The page-wide search
   * walks the shadow roots, and runs only once the nearer ones found nothing.
   */
  function popupListbox(combobox) {
    return whileReading(() => findPopupListbox(combobox));
  }

  /** `element` if it is a list box, else the first one inside it (light tree first, then its shadow roots), or null. */
  function listboxIn(element) {
    if (element.getAttribute("role") === "listbox") return element;
    const light = Element.prototype.querySelector.call(element, "[role=listbox]");
    if (light) return light;
    for (const shadow of shadowRootsUnder(element)) {
      const inside = DocumentFragment.prototype.querySelector.call(shadow, "[role=listbox]");
      if (inside) return inside;
    }
    return null;
  }

  /** popupListbox's search (while reading). */
  function findPopupListbox(combobox) {
    let named = false;
    for (const attribute of ["aria-controls", "aria-owns"]) {
      for (const candidate of elementsOfIds(combobox, attribute)) {
        const listbox = listboxIn(candidate);
        if (!listbox) continue;
        if (isVisible(listbox)) return listbox;
        named = true;
      }
    }
    if (named) return null;
    const own = shadowRootOf(combobox);
    for (const scope of own ? [combobox, own] : [combobox]) {
      const inside = queryAllIn(scope, "[role=listbox]")[0];
      if (inside && isVisible(inside)) return inside;
    }
    const root = Node.prototype.getRootNode.call(combobox);
    const visibleIn = (scope) => Array.from(queryAllIn(scope, "[role=listbox]")).filter(isVisible);
    const doc = combobox.ownerDocument;
    let visible = root === doc ? [] : visibleIn(root);
    if (visible.length === 0) {
      visible = visibleIn(doc);
      for (const shadow of shadowRootsUnder(doc)) {
        if (visible.length > 1) break;
        visible.push(...visibleIn(shadow));
      }
    }
    return visible.length === 1 ? visible[0] : null;
  }

  /**
   * The options (role=option) of a list box, in order: those its aria-owns
   * names (in its own tree) or holds, then the ones inside it in the flat
   * tree: in its own shadow root (a custom element with role=listbox),
   * slotted into it (a list box in a component's root showing the page's
   * options), in shadow roots nested inside, open and closed. What a shadow
   * root does not render (a host's children no slot takes) is not an option
   * one can choose. Options do not nest: the walk does not look inside one.
   */
  function optionsOf(listbox) {
    const options = [];
    const seen = new Set();
    // A stack of [node, depth], pushed in reverse so they come off in order.
    const stack = [];
    const pushChildren = (node, depth) => {
      if (depth > MAX_DEPTH) return;
      const children = flatChildren(node);
      for (let index = children.length - 1; index >= 0; index -= 1) stack.push([children[index], depth]);
    };
    pushChildren(listbox, 1);
    const owned = elementsOfIds(listbox, "aria-owns");
    for (let index = owned.length - 1; index >= 0; index -= 1) stack.push([owned[index], 1]);
    while (stack.length > 0) {
      const [node, depth] = stack.pop();
      if (nodeTypeOf(node) !== Node.ELEMENT_NODE) continue;
      if (explicitRole(node) === "option") {
        if (!seen.has(node)) {
          seen.add(node);
          options.push(node);
        }
        continue;
      }
      pushChildren(node, depth + 1);
    }
    return options;
  }

  async function selectAria(element, role, wanted) {
    const { ref: elementRef, name } = describe(element);
    let listbox = role === "listbox" ? element : popupListbox(element);
    let opened = false;
    if (!listbox) {
      scrollIntoViewInstant(element);
      press(element);
      opened = true;
      listbox = await pollFor(() => popupListbox(element), 1500);
      if (!listbox) {
        throw new ToolError(
          `Clicked ${role} ${quote(name)} (${elementRef}) to open it, but no list of options appeared. ` +
            "Call page_snapshot to see its options, then click the one you want.",
        );
      }
    }
    const nodes = whileReading(() => optionsOf(listbox));
    const candidates = nodes.map((option) => ({
      element: option,
      label: accessibleName(option, "option") || pageString(boundedTextContent(option), MAX_LABEL_CHARS),
      value: option.getAttribute("data-value") || option.getAttribute("value") || "",
      disabled: option.getAttribute("aria-disabled") === "true",
    }));
    const result = matchOption(candidates, wanted);
    if (!result.match) throw noMatch(elementRef, role, name, wanted, result, candidates);
    const option = result.match.element;
    if (!option.isConnected) throw new ToolError(`The options of ${role} ${quote(name)} (${elementRef}) changed while choosing; call page_snapshot and try again.`);
    scrollIntoViewInstant(option);
    press(option);
    let content = `Chose ${quote(result.match.label)} in ${role} ${quote(name)} (${elementRef})${opened ? " (opened it first)" : ""}.`;
    if (result.others > 0) content += ` ${plural(result.others, "other option")} also matched ${quote(wanted)}; the first was chosen.`;
    return {
      ok: true,
      content,
      details: { ref: elementRef, name, role, rect: rectOf(element), option: { label: result.match.label, value: optionValueOf(result.match) } },
    };
  }

  async function selectOption(params, context = {}) {
    params = objectParams(params, "select", '{ "ref": "e12", "option": "label or value" }.');
    const ref = optionalString(params, "ref", "select");
    if (!ref || !ref.trim()) throw new ToolError('select needs "ref" (like "e12", from page_snapshot) and "option".');
    let wanted = params.option;
    if (typeof wanted === "number") wanted = String(wanted);
    if (typeof wanted !== "string") throw new ToolError('select needs "option": the visible label or the value of the option, as a string.');
    const element = resolveByRef(ref.trim(), "chosen");
    refuseUnapproved(element, context.expect, "chosen");
    const select = element.tagName === "LABEL" && element.control ? element.control : element;
    refuseDisabled(select, ref.trim(), "changed");
    const { ref: elementRef, role, name } = describe(element);
    if (select.tagName !== "SELECT") {
      const ariaRole = roleOf(select);
      if (ariaRole === "listbox" || ariaRole === "combobox") return selectAria(select, ariaRole, wanted);
      throw new ToolError(
        `Element ${elementRef} (${role} ${quote(name)}) is not a drop-down list or list box; ` +
          "use type for text fields and click for buttons, checkboxes and custom menus.",
      );
    }
    const candidates = Array.from(select.options, (option) => ({
      element: option,
      label: optionLabelOf(option),
      value: option.value,
      disabled: option.disabled || (option.parentElement && option.parentElement.tagName === "OPTGROUP" && option.parentElement.disabled),
    }));
    const result = matchOption(candidates, wanted);
    if (!result.match) throw noMatch(elementRef, role, name, wanted, result, candidates);
    const option = result.match.element;
    scrollIntoViewInstant(select);
    if (typeof select.focus === "function") select.focus({ preventScroll: true });
    const already = option.selected && (!select.multiple || select.selectedOptions.length === 1);
    if (!already) {
      if (select.multiple) setNativeProperty(option, "selected", true);
      else setNativeProperty(select, "selectedIndex", option.index);
      fire(select, "input", { cancelable: false });
      fire(select, "change", { cancelable: false });
    }
    // At most MAX_OPTIONS_IN_ERROR of the chosen options are named.
    const selectedOptions = Array.from(select.selectedOptions);
    const selectedNow = selectedOptions.slice(0, MAX_OPTIONS_IN_ERROR).map(optionLabelOf);
    const selectedNames = selectedNow.map(quote);
    if (selectedOptions.length > selectedNow.length) selectedNames.push(`… ${selectedOptions.length - selectedNow.length} more`);
    let content = already
      ? `${quote(result.match.label)} was already chosen in ${role} ${quote(name)} (${elementRef}); nothing changed.`
      : `Chose ${quote(result.match.label)} in ${role} ${quote(name)} (${elementRef}).`;
    if (result.others > 0) content += ` ${plural(result.others, "other option")} also matched ${quote(wanted)}; the first was chosen.`;
    if (select.multiple) content += ` Selected now: ${selectedNames.join(", ") || "(none)"}.`;
    if (!already && !option.selected) content += " Note: the page changed the selection back right away; call page_snapshot to check.";
    return {
      ok: true,
      content,
      details: { ref: elementRef, name, role, rect: rectOf(select), option: { label: result.match.label, value: optionValueOf(result.match) }, selected: selectedNow },
    };
  }

  // --------------------------------------------------------------- scroll ---
  const DIRECTIONS = new Set(["up", "down", "top", "bottom"]);

  function canScroll(element) {
    if (element.scrollHeight <= element.clientHeight + 1) return false;
    const overflow = styleOf(element).overflowY;
    return overflow === "auto" || overflow === "scroll" || overflow === "overlay";
  }

  /** The element itself or its nearest ancestor that scrolls vertically, or null (the page). */
  function scrollContainerOf(element) {
    for (let node = element; node; node = flatParent(node)) {
      if (node.nodeType !== Node.ELEMENT_NODE) continue;
      if (node === node.ownerDocument.documentElement || node === node.ownerDocument.body) return null;
      if (canScroll(node)) return node;
    }
    return null;
  }

  /**
   * The page scrolls (window), or, for app-like pages whose body is fixed,
   * their largest scrolling area: in the document or in any shadow root
   * (an app shell component often holds the whole page). The shadow roots
   * are walked only for a page that does not scroll itself.
   */
  function mainScroller() {
    const page = document.scrollingElement || document.documentElement;
    if (page.scrollHeight > window.innerHeight + 1) return null;
    const body = document.body;
    if (!body) return null;
    let best = null;
    let bestArea = 0;
    for (const scope of [body, ...shadowRootsUnder(body)]) {
      for (const element of queryAllIn(scope, "*")) {
        if (element.scrollHeight <= element.clientHeight + 1 || !canScroll(element) || !isVisible(element)) continue;
        const rect = element.getBoundingClientRect();
        const area = rect.width * rect.height;
        if (area > bestArea) {
          best = element;
          bestArea = area;
        }
      }
    }
    return best;
  }

  function position(container) {
    if (!container) {
      const page = document.scrollingElement || document.documentElement;
      return { y: Math.round(window.scrollY), height: Math.round(page.scrollHeight), viewport: Math.round(window.innerHeight) };
    }
    return { y: Math.round(container.scrollTop), height: Math.round(container.scrollHeight), viewport: Math.round(container.clientHeight) };
  }

  function scrollBy(container, direction) {
    const { viewport, height } = position(container);
    const top = direction === "top" ? 0 : direction === "bottom" ? height : undefined;
    const delta = direction === "down" ? viewport : -viewport;
    const target = container || window;
    if (top !== undefined) target.scrollTo({ top, behavior: "instant" });
    else target.scrollBy({ top: delta, behavior: "instant" });
  }

  function edgeOf(where) {
    if (where.height <= where.viewport + 1) return "fits";
    if (where.y <= 0) return "top";
    if (where.y + where.viewport >= where.height - 1) return "bottom";
    return null;
  }

  function describePosition(where) {
    const edge = edgeOf(where);
    return `now at ${where.y} of ${where.height} px (viewport ${where.viewport} px)${edge === "top" || edge === "bottom" ? `, at the ${edge}` : ""}`;
  }

  /** "Did not scroll down: already at the bottom (4487 of 5287 px, viewport 800 px)." */
  function notScrolled(what, direction, where) {
    const edge = edgeOf(where);
    const reason = edge === "fits" ? "everything fits in view" : edge ? `already at the ${edge}` : "it did not move";
    return `Did not scroll ${what ? `${what} ` : ""}${direction}: ${reason} (${where.y} of ${where.height} px, viewport ${where.viewport} px).`;
  }

  function scroll(params) {
    params = objectParams(params, "scroll", '{ "direction": "down" } or { "ref": "e12" }.');
    const ref = optionalString(params, "ref", "scroll");
    const direction = optionalString(params, "direction", "scroll");
    if (direction !== null && !DIRECTIONS.has(direction)) {
      throw new ToolError(`scroll: "direction" must be one of up, down, top, bottom (got ${quote(direction)}).`);
    }
    if (ref && ref.trim()) {
      const element = resolveByRef(ref.trim());
      const { ref: elementRef, role, name } = describe(element);
      if (!direction) {
        scrollIntoViewInstant(element);
        const where = position(scrollContainerOf(flatParent(element) || element));
        const page = position(null);
        return {
          ok: true,
          content: `Scrolled ${role} ${quote(name)} (${elementRef}) into view; the page is ${describePosition(page)}.`,
          details: { ref: elementRef, name, role, rect: rectOf(element), scrollY: page.y, scrollHeight: page.height, viewportHeight: page.viewport, container: where },
        };
      }
      const container = scrollContainerOf(element);
      const before = position(container);
      scrollBy(container, direction);
      const after = position(container);
      const what = container ? `the scrolling area ${container === element ? `${role} ${quote(name)} (${elementRef})` : `around ${role} ${quote(name)} (${elementRef})`}` : "the page";
      const moved = after.y !== before.y;
      return {
        ok: true,
        content: moved ? `Scrolled ${what} ${direction}: ${describePosition(after)}.` : notScrolled(what, direction, after),
        details: { ref: elementRef, name, role, rect: rectOf(element), direction, scrollY: after.y, scrollHeight: after.height, viewportHeight: after.viewport, moved },
      };
    }
    const chosen = direction || "down";
    const container = whileReading(mainScroller);
    const before = position(container);
    scrollBy(container, chosen);
    const after = position(container);
    const moved = after.y !== before.y;
    const subject = container ? "the page's main scrolling area" : "";
    const content = moved
      ? `Scrolled ${subject ? `${subject} ` : ""}${chosen}: ${describePosition(after)}.`
      : notScrolled(subject, chosen, after);
    return {
      ok: true,
      content,
      details: { direction: chosen, scrollY: after.y, scrollHeight: after.height, viewportHeight: after.viewport, moved },
    };
  }

  // ------------------------------------------------------------- wait_for ---
  /** Active waits, finished early when the page goes away. */
  const activeWaits = new Set();
  window.addEventListener("pagehide", () => {
    for (const stop of [...activeWaits]) stop();
  });

  /** Visible text under `root` (flat tree), whitespace collapsed, lower case. */
  function visibleTextOf(root) {
    return collapse(scanPage({ wantText: true, root, maxText: Number.POSITIVE_INFINITY }).text).toLowerCase();
  }

  /** The deepest element under `root` whose rendered text contains `needle` (lower case). */
  function elementWithText(root, needle) {
    let current = root;
    for (;;) {
      let next = null;
      for (const child of flatChildren(current)) {
        if (child.nodeType !== Node.ELEMENT_NODE || SKIPPED_TAGS.has(child.tagName.toUpperCase())) continue;
        if (collapse(child.innerText || "").toLowerCase().includes(needle) && isVisible(child)) {
          next = child;
          break;
        }
      }
      if (!next) return current;
      current = next;
    }
  }

  function waitFor(params, context) {
    params = objectParams(params, "wait_for", '{ "text": "Saved" } or { "ref": "e12" }, optionally "timeout_ms".');
    const text = optionalString(params, "text", "wait_for");
    const ref = optionalString(params, "ref", "wait_for");
    const wantsText = text !== null && collapse(text) !== "";
    const wantsRef = ref !== null && ref.trim() !== "";
    if (!wantsText && !wantsRef) {
      throw new ToolError('wait_for needs "text" (words to wait for) or "ref" (an element to wait for), or both.');
    }
    let timeout = WAIT_DEFAULT_MS;
    if (params.timeout_ms !== undefined && params.timeout_ms !== null) {
      const asked = Number(params.timeout_ms);
      if (!Number.isFinite(asked)) throw new ToolError('wait_for: "timeout_ms" must be a number of milliseconds.');
      timeout = Math.min(Math.max(Math.round(asked), 0), WAIT_MAX_MS);
    }
    const needle = wantsText ? collapse(text).toLowerCase() : "";
    const element = wantsRef ? lookupRef(ref) : null;
    const label = element ? describe(element) : null;
    const subject = [
      wantsText ? `the text ${quote(clip(collapse(text), 80))}` : null,
      element ? `${wantsText ? "in " : ""}${label.role} ${quote(label.name)} (${label.ref})` : null,
    ].filter(Boolean).join(" ");
    const started = Date.now();

    /** { ok, content, details } when done, null while still waiting. */
    const check = () => whileReading(checkNow);

    function checkNow() {
      if (element && !element.isConnected) {
        throw new ToolError(`Element ${label.ref} (${label.role} ${quote(label.name)}) was removed from the page while waiting; call page_snapshot to get fresh refs.`);
      }
      if (element && !isVisible(element)) return null;
      if (wantsText && !visibleTextOf(element || document.body).includes(needle)) return null;
      const found = element || elementWithText(document.body, needle);
      const waited = Date.now() - started;
      const seconds = (waited / 1000).toFixed(1);
      const verb = wantsText ? "appeared" : "is visible";
      return {
        ok: true,
        content: waited < 50 ? `${capitalize(subject)} ${wantsText ? "is" : "is"} already visible.` : `${capitalize(subject)} ${verb} after ${seconds} s.`,
        details: {
          waitedMs: waited,
          ...(element ? { ref: label.ref, name: label.name, role: label.role } : {}),
          ...(found && found.nodeType === Node.ELEMENT_NODE ? { rect: rectOf(found) } : {}),
        },
      };
    }

    const immediate = check();
    if (immediate) return immediate;

    return new Promise((resolve, reject) => {
      let done = false;
      let scheduled = null;
      const observers = [];
      const finish = (outcome, error) => {
        if (done) return;
        done = true;
        clearTimeout(timer);
        clearTimeout(scheduled);
        clearInterval(poll);
        clearInterval(ticker);
        for (const observer of observers) observer.disconnect();
        activeWaits.delete(onLeave);
        if (error) reject(error);
        else resolve(outcome);
      };
      const run = () => {
        scheduled = null;
        if (done) return;
        try {
          const outcome = check();
          if (outcome) finish(outcome);
        } catch (error) {
          finish(null, error);
        }
      };
      // Mutations come in bursts (and some pages animate constantly): check at most every 100 ms.
      const schedule = () => {
        if (scheduled === null && !done) scheduled = setTimeout(run, 100);
      };
      for (const doc of [document, element && element.ownerDocument].filter((d, i, all) => d && all.indexOf(d) === i)) {
        const observer = new MutationObserver(schedule);
        observer.observe(doc.documentElement || doc, { subtree: true, childList: true, characterData: true, attributes: true });
        observers.push(observer);
      }
      // Polling catches what observers miss (shadow roots, CSS animations, layout).
      const poll = setInterval(run, WAIT_POLL_MS);
      const ticker = setInterval(() => {
        const seconds = Math.round((Date.now() - started) / 1000);
        context.progress(`waiting… ${seconds} s (for ${subject})`);
      }, 1000);
      const timer = setTimeout(() => {
        run();
        if (done) return;
        const seconds = Math.round(timeout / 100) / 10;
        const state = element && element.isConnected ? ` (it is ${visibilityProblem(element) || "visible, but the text is not in it"})` : "";
        finish({
          ok: false,
          content:
            `Timed out after ${seconds} s: ${subject} ${wantsText ? "did not appear" : "did not become visible"}${state}. ` +
            `Call page_snapshot to see what the page shows now, or wait again with a longer timeout_ms (at most ${WAIT_MAX_MS}).`,
          details: { waitedMs: Date.now() - started, timedOut: true, ...(element ? { ref: label.ref, name: label.name, role: label.role } : {}) },
        });
      }, timeout);
      const onLeave = () =>
        finish({
          ok: false,
          content: `The page navigated away (or was closed) while waiting for ${subject}; nothing was found. Call page_snapshot to look at the page that is open now.`,
          details: { waitedMs: Date.now() - started, navigated: true },
        });
      activeWaits.add(onLeave);
    });
  }

  const capitalize = (text) => (text ? text[0].toUpperCase() + text.slice(1) : text);

  /**
   * name → tool. A tool gets (params, context) and returns (or resolves to)
   * `{ ok, content, details? }`; it throws ToolError for failures the model
   * should read. `context.progress(text)` sends a `tool.progress`.
   */
  const TOOLS = {
    page_snapshot: (params) => whileReading(() => pageSnapshot(params)),
    read_page: (params) => whileReading(() => readPage(params)),
    click,
    type: typeText,
    select: selectOption,
    scroll,
    wait_for: waitFor,
  };

  /**
   * The engine's own calls, never offered to the model. `describe_target`:
   * the element a write's `ref` or visible `text` names, as the page has it
   * now ({ ref, role, name (full), state }), for the approval card and the
   * write's `expect`. It shows the model nothing, so it remembers nothing
   * as shown (an unknown or stale ref fails as the write would).
   */
  const INTERNAL = {
    describe_target(params) {
      params = objectParams(params, "describe_target", '{ "ref": "e12" } or { "text": "…" }.');
      let element;
      describingForEngine = true;
      try {
        if (typeof params.ref === "string" && params.ref.trim() !== "") {
          element = lookupRef(params.ref);
        } else if (typeof params.text === "string" && params.text.trim() !== "") {
          element = resolveByText(params.text).element;
        } else {
          throw new ToolError("describe_target needs a ref or a text.");
        }
      } finally {
        describingForEngine = false;
      }
      const role = roleOf(element);
      return {
        ok: true,
        content: "",
        details: { ref: refFor(element), role, name: fullAccessibleName(element, role), state: snapshotState(element, role).trim() },
      };
    },
  };

  // ------------------------------------------------------------ protocol ---
  /** Posts on the port: `posted` false, with `why`, when it throws (a closed port, or a message it cannot carry). */
  function safePost(port, message) {
    try {
      port.postMessage(message);
      return { posted: true, why: "" };
    } catch (err) {
      return { posted: false, why: err && err.message ? String(err.message) : String(err) };
    }
  }

  /**
   * The `tool.result` of a tool's `{ ok, content, details? }`, bounded
   * whatever the page: the content cut at MAX_RESULT_CHARS (with a note), the
   * details dropped when their JSON is longer than MAX_DETAILS_CHARS or is
   * not JSON at all.
   */
  function resultMessage(callId, result) {
    let content = String(result.content ?? "");
    if (content.length > MAX_RESULT_CHARS) {
      content = `${content.slice(0, MAX_RESULT_CHARS)}\n[Result cut at ${MAX_RESULT_CHARS} characters.]`;
    }
    const reply = { type: "tool.result", callId, ok: result.ok === true, content };
    if (result.details && typeof result.details === "object") {
      let json = null;
      try {
        json = JSON.stringify(result.details);
      } catch {
        json = null;
      }
      if (typeof json === "string" && json.length <= MAX_DETAILS_CHARS) reply.details = result.details;
    }
    return reply;
  }

  async function execute(port, message) {
    const callId = message.callId;
    const name = message.name;
    // A content script lives in one frame, so its id never changes once known.
    if (Number.isInteger(message.frameId) && message.frameId >= 0) ownFrameId = message.frameId;
    const finish = (result) => {
      const sent = safePost(port, resultMessage(callId, result));
      if (sent.posted) return;
      // Say so rather than leave the engine waiting for its timeout. On a
      // closed port this fails too, and there is nobody to tell.
      safePost(port, {
        type: "tool.result",
        callId,
        ok: false,
        content: `${clip(String(name), 100)}: the result could not be sent to the extension (${clip(sent.why, 200)}). If it was an action, it may have happened: look at the page (page_snapshot) before doing it again.`,
      });
    };
    const known = (table) => typeof name === "string" && Object.prototype.hasOwnProperty.call(table, name);
    if (!known(TOOLS) && !known(INTERNAL)) {
      finish({ ok: false, content: `Unknown page tool: ${clip(String(name), 100)}. Page tools: ${Object.keys(TOOLS).join(", ")}.` });
      return;
    }
    try {
      // Before anything is done: a malformed approval refuses the call.
      const context = {
        progress: (text) => safePost(port, { type: "tool.progress", callId, text: clip(String(text), 1000) }),
        expect: expectedElement(message),
      };
      const params = message.params === undefined ? {} : message.params;
      const tool = Object.prototype.hasOwnProperty.call(TOOLS, name) ? TOOLS[name] : INTERNAL[name];
      finish(await tool(params, context));
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
