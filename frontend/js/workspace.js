// The page of one root: the root conversation (main pane) with the state panel and the
// inbox, and the right-hand tabs (member sessions, the cooperation list). In maximized
// mode the tabs fill the page and the root becomes their first, non-closable tab. A
// workspace keeps its tabs, drafts and scroll positions while another root is shown.

import { SessionView } from "./conversation.js";
import { CooperationList } from "./cooperationList.js";
import { h } from "./dom.js";
import { Inbox } from "./inbox.js";
import { StatePanel } from "./statePanel.js";
import { TabStrip } from "./tabs.js";
import { TimelineView } from "./timeline.js";

const LIST_TAB = "cooperation-list";
const TIMELINE_TAB = "timeline";
const ROOT_TAB = "root";
// Below this width the tabs cover the conversation instead of sharing the page (layout.css).
const NARROW = window.matchMedia("(max-width: 1099px)");

export class Workspace {
  #tabs = new Map(); // key → {key, kind, view?, list?, panel}
  #order = [];
  #active = null;
  #maximized = false;
  #sideCollapsed = false;
  #releases = [];
  #activeOnPage = false;

  constructor({ ctx, rootId }) {
    this.ctx = ctx;
    this.rootId = rootId;
    this.tree = ctx.store.tree(rootId);

    this.rootView = new SessionView({ api: ctx.api, tree: this.tree, sessionId: rootId, isRoot: true,
      onOpen: (target) => this.openTarget(target), loadAgents: ctx.loadAgents });
    this.statePanel = new StatePanel({ api: ctx.api, tree: this.tree, onOpenList: () => this.openCooperationList(),
      onOpenTimeline: () => this.openTimeline() });
    this.inbox = new Inbox({ tree: this.tree, onOpenRequest: (request) => this.openRequest(request) });
    this.rootView.setInbox(this.inbox.el);

    this.title = h("h1", { class: "root-title", text: "…" });
    this.archiveButton = h("button", { class: "btn ghost small", type: "button", text: "Archive",
      title: "Archive this conversation (hidden from the list; nothing is deleted)",
      onClick: () => ctx.archive(rootId, this.title.textContent) });
    this.renameButton = h("button", { class: "btn ghost small", type: "button", text: "Rename",
      title: "Edit the title", onClick: () => this.#rename() });
    this.tabsButton = h("button", { class: "btn ghost small tabs-btn", type: "button", hidden: true,
      onClick: () => this.#showSide() });
    this.stateSlot = h("div", { class: "state-slot" }, this.statePanel.el);
    this.mainPane = h("section", { class: "main-pane", "aria-label": "Conversation" },
      h("header", { class: "main-head" }, ctx.menuButton(), this.title,
        h("div", { class: "head-tools" }, this.tabsButton, this.renameButton, this.archiveButton)),
      this.stateSlot, this.rootView.el);

    this.maximizeButton = h("button", { class: "icon-btn", type: "button", onClick: () => this.toggleMaximize() });
    this.backButton = h("button", { class: "icon-btn back-btn", type: "button", text: "‹",
      title: "Back to the conversation", "aria-label": "Back to the conversation",
      onClick: () => this.#collapseSide() });
    this.tabStrip = new TabStrip({ onSelect: (key) => this.select(key), onClose: (key) => this.closeTab(key),
      tools: [this.maximizeButton] });
    this.sideStateSlot = h("div", { class: "side-state-slot" });
    this.panels = h("div", { class: "tab-panels" });
    this.sidePane = h("section", { class: "side-pane", "aria-label": "Sessions in tabs", hidden: true },
      h("div", { class: "side-head" }, ctx.menuButton("side-menu"), this.backButton, this.tabStrip.el,
        this.sideStateSlot),
      this.panels);
    this.el = h("div", { class: "workspace", dataset: { rootId } }, this.mainPane, this.sidePane);

    this.#releases.push(
      this.tree.on("change", () => this.#renderChrome()),
      // The root's own state is what the session list shows: keep it fresh.
      this.tree.on("event", (event) => {
        if (event.session_id === rootId || event.kind?.startsWith("tree_")) ctx.rootsChanged();
      }),
      this.rootView.runtime.on("change", () => this.#renderChrome()),
    );
    this.#renderChrome();
  }

  // -- lifecycle ----------------------------------------------------------------------------------

  /** Shown on the page: observe the tree (one stream) and every open view. */
  activate() {
    this.#activeOnPage = true;
    this.rootView.resume();
    for (const tab of this.#tabs.values()) tab.view?.resume();
    this.rootView.show();
    this.#activeTab()?.view?.show();
    this.tree.refresh();
  }

  /** Parked (another root is shown): stop observing, keep drafts, tabs and scroll positions. */
  deactivate() {
    this.#activeOnPage = false;
    this.rootView.hide();
    for (const tab of this.#tabs.values()) tab.view?.hide();
    this.rootView.suspend();
    for (const tab of this.#tabs.values()) tab.view?.suspend();
  }

  destroy() {
    for (const tab of this.#tabs.values()) this.#dispose(tab);
    this.#tabs.clear();
    for (const release of this.#releases.splice(0)) release();
    this.rootView.destroy();
    this.statePanel.destroy();
    this.inbox.destroy();
    this.el.remove();
  }

  // -- navigation ---------------------------------------------------------------------------------

  /** Open a target of a link (tool row, origin): a member here, or another root's page. */
  async openTarget(target) {
    const { sessionId } = target;
    if (!sessionId) return;
    let treeId = target.treeId || (this.tree.member(sessionId) ? this.rootId : null);
    if (!treeId) {
      try {
        treeId = (await this.ctx.api.session(sessionId)).tree_id;
      } catch (error) {
        this.ctx.notify(`Cannot open that session: ${error.message}`, "error");
        return;
      }
    }
    if (String(treeId) === this.rootId) this.openSession(sessionId);
    else this.ctx.navigate(sessionId === treeId ? `#/s/${treeId}` : `#/s/${treeId}/m/${sessionId}`);
  }

  openRequest(request) {
    this.openSession(request.session_id, { requestId: request.id });
  }

  /** Open (or reuse) the tab of a member; the root itself is the main pane (or the root tab). */
  openSession(sessionId, { requestId = null } = {}) {
    let view;
    if (sessionId === this.rootId) {
      if (this.#maximized) this.select(ROOT_TAB);
      else this.#collapseSide();
      view = this.rootView;
    } else {
      let tab = this.#tabs.get(sessionId);
      if (!tab) {
        view = new SessionView({ api: this.ctx.api, tree: this.tree, sessionId, isRoot: false,
          onOpen: (target) => this.openTarget(target), loadAgents: this.ctx.loadAgents });
        if (!this.#activeOnPage) view.suspend();
        tab = this.#addTab({ key: sessionId, kind: "member", view, panel: view.el });
      }
      this.select(sessionId);
      view = tab.view;
    }
    if (requestId) view.focusRequest(requestId);
    return view;
  }

  openCooperationList() {
    if (!this.#tabs.has(LIST_TAB)) {
      const list = new CooperationList({ tree: this.tree, onOpenSession: (id) => this.openSession(id) });
      this.#addTab({ key: LIST_TAB, kind: "list", list, panel: list.el });
    }
    this.select(LIST_TAB);
  }

  openTimeline() {
    if (!this.#tabs.has(TIMELINE_TAB)) {
      const view = new TimelineView({ api: this.ctx.api, tree: this.tree,
        onOpenMember: (sessionId, point) => this.openSession(sessionId).revealAt(point) });
      if (!this.#activeOnPage) view.suspend();
      this.#addTab({ key: TIMELINE_TAB, kind: "timeline", view, panel: view.el });
    }
    this.select(TIMELINE_TAB);
  }

  select(key) {
    if (!this.#tabs.has(key)) return;
    const previous = this.#activeTab();
    if (previous && previous.key !== key) {
      previous.view?.hide();
      previous.panel.hidden = true;
    }
    this.#active = key;
    const tab = this.#tabs.get(key);
    tab.panel.hidden = false;
    tab.view?.show();
    this.#sideCollapsed = false;
    this.#renderChrome();
  }

  closeTab(key) {
    const tab = this.#tabs.get(key);
    if (!tab || key === ROOT_TAB) return;
    const index = this.#order.indexOf(key);
    this.#order.splice(index, 1);
    this.#tabs.delete(key);
    this.#dispose(tab);
    if (this.#active === key) {
      this.#active = null;
      const next = this.#order[Math.min(index, this.#order.length - 1)];
      if (next) this.select(next);
    }
    this.#renderChrome();
  }

  toggleMaximize() {
    this.rootView.hide(); // moving a scroller loses its position: hide() saves it, show() restores it
    this.#maximized = !this.#maximized;
    if (this.#maximized) {
      const panel = h("div", { class: "tab-panel root-panel", role: "tabpanel", "aria-labelledby": `tab-${ROOT_TAB}`,
        hidden: true }, this.rootView.el);
      this.#tabs.set(ROOT_TAB, { key: ROOT_TAB, kind: "root", view: this.rootView, panel });
      this.#order.unshift(ROOT_TAB);
      this.panels.prepend(panel);
      this.sideStateSlot.append(this.statePanel.el);
      this.select(this.#active ?? ROOT_TAB);
    } else {
      const rootTab = this.#tabs.get(ROOT_TAB);
      this.#tabs.delete(ROOT_TAB);
      this.#order = this.#order.filter((key) => key !== ROOT_TAB);
      this.mainPane.append(this.rootView.el);
      rootTab?.panel.remove();
      this.stateSlot.append(this.statePanel.el);
      if (this.#active === ROOT_TAB) {
        this.#active = null;
        if (this.#order.length) this.select(this.#order[0]);
      }
      this.rootView.show();
    }
    this.#renderChrome();
  }

  get maximized() {
    return this.#maximized;
  }

  // -- internals ----------------------------------------------------------------------------------

  #addTab(tab) {
    this.#tabs.set(tab.key, tab);
    this.#order.push(tab.key);
    const panel = tab.panel.classList.contains("tab-panel") ? tab.panel
      : h("div", { class: "tab-panel", role: "tabpanel", "aria-labelledby": `tab-${tab.key}` }, tab.panel);
    tab.panel = panel;
    panel.hidden = true;
    this.panels.append(panel);
    return tab;
  }

  #dispose(tab) {
    if (tab.kind === "root") return;
    tab.view?.destroy();
    tab.list?.destroy();
    tab.panel.remove();
  }

  #activeTab() {
    return this.#active ? this.#tabs.get(this.#active) : null;
  }

  /** Narrow screens: uncover the conversation (the tabs stay open). Wide screens show both. */
  #collapseSide() {
    if (this.#maximized || !NARROW.matches) return;
    this.#sideCollapsed = true;
    this.#renderChrome();
  }

  #showSide() {
    this.#sideCollapsed = false;
    this.#renderChrome();
  }

  /** Edit the title in place: Enter saves (PATCH /sessions/{id}), Escape or leaving cancels. */
  #rename() {
    const current = this.rootView.runtime.detail?.title ?? "";
    const input = h("input", { class: "title-input", value: current, "aria-label": "Title", maxlength: "500" });
    let done = false;
    const finish = async (save) => {
      if (done) return; // removing the focused input fires blur: finish only once
      done = true;
      input.replaceWith(this.title);
      const title = input.value.trim();
      if (!save || title === current) return;
      try {
        await this.ctx.api.rename(this.rootId, title);
        this.rootView.runtime.scheduleRefresh();
        this.ctx.rootsChanged();
      } catch (error) {
        this.ctx.notify(`Could not rename: ${error.message}`, "error");
      }
    };
    input.addEventListener("keydown", (event) => {
      if (event.key === "Enter") finish(true);
      else if (event.key === "Escape") finish(false);
    });
    input.addEventListener("blur", () => finish(false));
    this.title.replaceWith(input);
    input.focus();
    input.select();
  }

  #renderChrome() {
    const detail = this.rootView.runtime.detail;
    const title = detail?.title || "Untitled conversation";
    this.title.textContent = title;
    this.title.title = title;
    document.title = this.#activeOnPage ? `${title} · Canopy` : document.title;

    const requests = this.tree.requests;
    const tabs = this.#order.map((key) => {
      if (key === LIST_TAB) return { key, kind: "list", label: "Cooperation", closable: true };
      if (key === TIMELINE_TAB) return { key, kind: "timeline", label: "Timeline", closable: true };
      if (key === ROOT_TAB) {
        const root = this.tree.member(this.rootId);
        return { key, kind: "root", label: title, closable: false, activity: root?.activity ?? detail?.activity,
          badge: requests.filter((r) => r.session_id === this.rootId).length };
      }
      const member = this.tree.member(key);
      const view = this.#tabs.get(key).view;
      const detailOf = view?.runtime.detail;
      return { key, kind: "member", label: member?.name ?? detailOf?.name ?? "session", closable: true,
        title: `${member?.path ?? detailOf?.path ?? ""}${member?.title ? ` — ${member.title}` : ""}`,
        activity: member?.activity ?? detailOf?.activity, badge: requests.filter((r) => r.session_id === key).length };
    });
    this.tabStrip.render(tabs, this.#active);
    const waiting = requests.filter((r) => r.session_id !== this.rootId).length;
    this.tabsButton.hidden = !(this.#sideCollapsed && this.#order.length);
    this.tabsButton.textContent = `Tabs (${this.#order.length})${waiting ? " ⚑" : ""}`;
    const sideVisible = this.#maximized || (this.#order.length > 0 && !this.#sideCollapsed);
    this.sidePane.hidden = !sideVisible;
    this.el.classList.toggle("has-side", sideVisible);
    this.el.classList.toggle("maximized", this.#maximized);
    this.maximizeButton.textContent = this.#maximized ? "⤡" : "⤢";
    this.maximizeButton.title = this.#maximized ? "Restore the split view" : "Maximize the tabs";
    this.maximizeButton.setAttribute("aria-label", this.maximizeButton.title);
    this.maximizeButton.setAttribute("aria-pressed", String(this.#maximized));
    this.mainPane.hidden = this.#maximized;
  }
}
