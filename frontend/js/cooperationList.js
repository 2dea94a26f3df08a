// The cooperation list tab: the whole hierarchy of the tree (no pagination), indented by
// depth, with name, title, activity and current Turn status. Rows are keyed by session, so
// a refresh only touches rows whose state changed and the list keeps its scroll position.

import { activityBadge, turnStatusBadge } from "./activity.js";
import { h, plural } from "./dom.js";
import { summarize } from "./statePanel.js";

/** Members in depth-first order (parents before their children, siblings by name). */
export function hierarchy(members) {
  const children = new Map();
  for (const m of members) {
    const key = m.parent_id ?? null;
    if (!children.has(key)) children.set(key, []);
    children.get(key).push(m);
  }
  for (const list of children.values()) list.sort((a, b) => a.name.localeCompare(b.name));
  const ids = new Set(members.map((m) => m.session_id));
  const ordered = [];
  const visit = (m) => {
    ordered.push(m);
    for (const child of children.get(m.session_id) ?? []) visit(child);
  };
  // Roots of the walk: the tree root, and anyone whose parent is unknown (never dropped).
  for (const m of members) if (!m.parent_id || !ids.has(m.parent_id)) visit(m);
  return ordered;
}

export class CooperationList {
  #rows = new Map();

  constructor({ tree, onOpenSession }) {
    this.tree = tree;
    this.onOpenSession = onOpenSession;
    this.head = h("p", { class: "coop-list-head" });
    this.listEl = h("ol", { class: "coop-tree", role: "tree", "aria-label": "Cooperation members" });
    this.scroller = h("div", { class: "coop-list-scroll" }, this.listEl);
    this.el = h("section", { class: "coop-list", "aria-label": "Cooperation list" }, this.head, this.scroller);
    this.release = tree.on("change", () => this.render());
    this.render();
  }

  destroy() {
    this.release();
  }

  render() {
    const members = this.tree.summary?.members ?? [];
    const s = summarize(this.tree.summary);
    this.head.textContent = this.tree.summary
      ? `${plural(s.members, "member")} · ${s.running} running · ${s.queued} queued · ${s.waiting} waiting · `
        + `${s.failed} failed`
      : "Loading…";
    const ordered = hierarchy(members);
    const seen = new Set();
    ordered.forEach((member, index) => {
      seen.add(member.session_id);
      const signature = [member.name, member.title, member.depth, member.activity, member.turn_status,
        member.pending_inputs, member.queue_paused].join("|");
      let row = this.#rows.get(member.session_id);
      if (!row || row.signature !== signature) {
        const el = this.#row(member);
        if (row) row.el.replaceWith(el);
        row = { el, signature };
        this.#rows.set(member.session_id, row);
      }
      if (this.listEl.children[index] !== row.el) this.listEl.insertBefore(row.el, this.listEl.children[index] ?? null);
    });
    for (const [id, row] of this.#rows) {
      if (!seen.has(id)) {
        row.el.remove();
        this.#rows.delete(id);
      }
    }
  }

  #row(member) {
    const queued = member.pending_inputs > 0
      ? h("span", { class: "badge muted", text: `${member.pending_inputs} queued${member.queue_paused ? ", paused" : ""}` })
      : null;
    return h("li", { class: "coop-node", role: "treeitem", "aria-level": String(member.depth + 1),
      dataset: { sessionId: member.session_id, depth: member.depth, activity: member.activity },
      style: { "--depth": String(member.depth) } },
    h("button", { class: "coop-node-btn", type: "button", title: `${member.path}\n${member.title ?? ""}`,
      onClick: () => this.onOpenSession(member.session_id) },
    h("span", { class: "node-name", text: member.depth === 0 ? "/root" : member.name }),
    h("span", { class: "node-title", text: member.title ?? "" }),
    h("span", { class: "node-state" }, member.activity !== "idle" ? activityBadge(member.activity) : null,
      member.turn_status ? turnStatusBadge(member.turn_status) : null, queued)));
  }
}
