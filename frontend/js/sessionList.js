// The left column: the root sessions (newest first) with an activity indicator each, the
// counts of what needs a look in its tree and, separately, an unread marker; the New session
// button; archive. Member sessions never
// appear here. The list is re-read every few seconds and after changes.

import { BUSY, WAITING, activityIndicator, attentionChips } from "./activity.js";
import { debounce, h, relativeTime, storage } from "./dom.js";
import { TERMINAL_TURN } from "./store.js";
import { themeToggle } from "./theme.js";

const POLL_MS = 5_000;
const PAGE = 50;
const SEEN_KEY = "canopy:seen";
const UNREAD_KEY = "canopy:unread";

/**
 * Unread = a root's Turn ended while the user was not looking at it. Uses the latest Turn's
 * id and status when the list carries them, else the busy → idle transition it observes.
 */
export class UnreadTracker {
  constructor() {
    this.seen = JSON.parse(storage.get(SEEN_KEY, "null") ?? "null");
    this.firstRun = this.seen === null;
    this.seen ??= {};
    this.unread = new Set(JSON.parse(storage.get(UNREAD_KEY, "[]")));
    this.wasBusy = new Map();
  }

  update(roots, viewingId) {
    for (const root of roots) {
      const id = root.session_id;
      const busy = Boolean(root.current_turn_id) || (root.activity && root.activity !== "idle");
      const marker = root.turn_id && TERMINAL_TURN.has(root.turn_status) ? String(root.turn_id) : null;
      if (id === viewingId) {
        this.unread.delete(id);
        this.seen[id] = marker;
      } else if (!(id in this.seen)) {
        this.seen[id] = this.firstRun ? marker : null;
        if (!this.firstRun && marker) this.unread.add(id);
      } else if (marker && this.seen[id] !== marker) {
        this.unread.add(id);
      } else if (!("turn_status" in root) && this.wasBusy.get(id) && !busy) {
        this.unread.add(id);
      }
      this.wasBusy.set(id, busy);
    }
    this.firstRun = false;
    storage.set(SEEN_KEY, JSON.stringify(this.seen));
    storage.set(UNREAD_KEY, JSON.stringify([...this.unread]));
  }

  isUnread(id) {
    return this.unread.has(id);
  }
}

/**
 * What needs a look in a root's whole tree (GET /sessions carries the counts). The root's own
 * state is already its spinner or label: a tree without members shows only a failure.
 */
function treeAttention(attention) {
  if (!attention) return null;
  const needsYou = attention.waiting_approval + attention.waiting_answer;
  const counts = { running: attention.running, queued: attention.queued, stopping: attention.cancelling,
    waiting: attention.waiting_cooperation + needsYou, needsYou, failed: attention.failed };
  const chips = attention.members > 1 ? attentionChips(counts) : attentionChips({ failed: counts.failed });
  return chips.length ? h("span", { class: "root-attention", title: `${attention.members} members` }, chips) : null;
}

export class SessionList {
  #roots = [];
  #rows = new Map();
  #active = null;
  #timer = null;
  #pages = 1;
  #projectId = storage.get("canopy:project");

  constructor({ ctx }) {
    this.ctx = ctx;
    this.unread = new UnreadTracker();
    this.projectSelect = h("select", { class: "project-select", "aria-label": "Project", onChange: () => {
      this.#projectId = this.projectSelect.value || null;
      storage.set("canopy:project", this.#projectId);
      this.refresh();
    } });
    this.projectRow = h("label", { class: "project-row", hidden: true }, h("span", { text: "Project" }),
      this.projectSelect);
    this.list = h("ul", { class: "root-list" });
    this.empty = h("p", { class: "sidebar-note", text: "No conversations yet.", hidden: true });
    this.more = h("button", { class: "link-btn load-more", type: "button", text: "Show older", hidden: true,
      onClick: () => {
        this.#pages += 1;
        this.refresh();
      } });
    this.status = h("p", { class: "sidebar-note error", role: "status", hidden: true });
    this.identity = h("span", { class: "sidebar-identity", hidden: true });
    this.el = h("div", { class: "sidebar-inner" },
      h("div", { class: "sidebar-head" },
        h("a", { class: "brand", href: "#/" }, h("span", { class: "brand-mark", "aria-hidden": "true" }), "Canopy"),
        h("a", { class: "btn primary small new-session", href: "#/new", text: "New session" })),
      this.projectRow,
      h("nav", { class: "root-nav", "aria-label": "Conversations" }, this.list, this.empty, this.more),
      this.status,
      h("footer", { class: "sidebar-foot" }, themeToggle(), this.identity,
        h("button", { class: "link-btn", type: "button", text: "Change API key", onClick: () => ctx.relogin() })));
    document.addEventListener("visibilitychange", () => {
      if (document.visibilityState === "visible") this.refresh();
    });
  }

  /** Whose API key this is: its user and app (GET /me). */
  showIdentity({ user_id: user, app_id: app }) {
    this.identity.textContent = `${user} · ${app}`;
    this.identity.title = `Signed in as user ${user} of app ${app} (this API key's)`;
    this.identity.hidden = false;
  }

  /** Re-read soon (after a change in an open tree), coalescing bursts. */
  scheduleRefresh = debounce(() => this.refresh(), 400, 1500);

  get projectId() {
    return this.#projectId;
  }

  start() {
    this.#loadProjects();
    this.refresh();
  }

  setActive(rootId) {
    this.#active = rootId;
    this.#render();
  }

  remove(rootId) {
    this.#roots = this.#roots.filter((r) => r.session_id !== rootId);
    this.#render();
  }

  async refresh() {
    clearTimeout(this.#timer);
    try {
      const roots = [];
      // Each page after the last root of the one before: a root made or archived meanwhile shifts
      // no page (by offset, one could be listed twice or missed).
      for (let page = 0; page < this.#pages; page++) {
        const before = roots.length ? roots[roots.length - 1].session_id : undefined;
        const batch = await this.ctx.api.roots({ projectId: this.#projectId, before, limit: PAGE });
        roots.push(...batch);
        if (batch.length < PAGE) break;
      }
      this.#roots = roots;
      this.status.hidden = true;
    } catch (error) {
      this.status.textContent = `Could not load the conversations: ${error.message}`;
      this.status.hidden = false;
    }
    this.#render();
    this.#timer = setTimeout(() => this.refresh(), POLL_MS);
  }

  async #loadProjects() {
    try {
      const projects = await this.ctx.api.projects();
      if (projects.length < 2 && !this.#projectId) return;
      this.projectSelect.replaceChildren(h("option", { value: "", text: "All projects" }),
        ...projects.map((p) => h("option", { value: p.project_id ?? p.id, text: p.name })));
      this.projectSelect.value = this.#projectId ?? "";
      this.projectRow.hidden = false;
    } catch {
      /* no project selector: the list shows every root of the scope */
    }
  }

  #render() {
    const viewing = document.visibilityState === "visible" ? this.#active : null;
    this.unread.update(this.#roots, viewing);
    this.empty.hidden = this.#roots.length > 0;
    this.more.hidden = this.#roots.length < this.#pages * PAGE;
    const seen = new Set();
    this.#roots.forEach((root, index) => {
      const id = root.session_id;
      seen.add(id);
      const active = id === this.#active;
      const unread = this.unread.isUnread(id);
      const title = root.title || "Untitled conversation";
      const signature = [title, root.activity, active, unread, relativeTime(root.created_at),
        JSON.stringify(root.attention ?? null)].join("|");
      let row = this.#rows.get(id);
      if (!row || row.signature !== signature) {
        const el = this.#item(root, title, active, unread);
        if (row) row.el.replaceWith(el);
        row = { el, signature };
        this.#rows.set(id, row);
      }
      if (this.list.children[index] !== row.el) this.list.insertBefore(row.el, this.list.children[index] ?? null);
    });
    for (const [id, row] of this.#rows) {
      if (!seen.has(id)) {
        row.el.remove();
        this.#rows.delete(id);
      }
    }
  }

  #item(root, title, active, unread) {
    const id = root.session_id;
    const activity = root.activity ?? "idle";
    // Running / queued: a spinner next to the title; waits: a label under it; never words for "busy".
    const spinner = BUSY.has(activity) ? activityIndicator(activity) : null;
    const label = WAITING.has(activity) ? activityIndicator(activity) : null;
    return h("li", { class: `root-item${active ? " active" : ""}${unread ? " unread" : ""}`,
      dataset: { sessionId: id, activity } },
    h("a", { class: "root-link", href: `#/s/${id}`, "aria-current": active ? "page" : false, title },
      h("span", { class: "root-line" }, h("span", { class: "root-title", text: title }), spinner),
      h("span", { class: "root-meta" }, h("span", { class: "root-time", text: relativeTime(root.created_at) }),
        label),
      treeAttention(root.attention)),
    unread ? h("span", { class: "unread-dot", role: "img", "aria-label": "new reply", title: "New reply" }) : null,
    h("button", { class: "icon-btn archive-btn", type: "button", title: "Archive", "aria-label": `Archive ${title}`,
      text: "⌫", onClick: () => this.ctx.archive(id, title) }));
  }
}
