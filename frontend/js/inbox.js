// The tree's human inbox, above the root's message box: every pending approval and
// question of every member. One item opens its member tab focused on the request card;
// several open a list. A failed refresh keeps the last known items and offers a retry.
// It works from the tree's request summaries, whose long fields are cut to their first 500
// characters: a human reads and approves a request whole on its card, never here.

import { h, plural } from "./dom.js";
import { approvalAction } from "./requestCard.js";

/** "…" after a payload field the summary cut (its whole length is ``<field>_chars``). */
const cut = (payload, field) => (payload[`${field}_chars`] != null ? "…" : "");

function describe(request) {
  const payload = request.payload ?? {};
  if (request.kind !== "approval") {
    const whole = payload.question_chars;
    return `asks: ${payload.question ?? ""}${cut(payload, "question")}`
      + (whole != null ? ` (${whole} characters: read all of it on its card)` : "");
  }
  const action = approvalAction(payload);
  const field = payload.tool === "write_file" ? "content" : "command";
  const whole = payload[`${field}_chars`];
  // A cut subject's extent is its whole length; the card shows all of it.
  const extent = whole != null ? `${whole} characters: read all of it on its card` : action.extent;
  return `${action.verb}${action.path ? ` ${action.path}${cut(payload, "path")}` : ""}: `
    + `${action.subject}${cut(payload, field)}` + (extent ? ` (${extent})` : "");
}

export class Inbox {
  #expanded = false;

  constructor({ tree, onOpenRequest }) {
    this.tree = tree;
    this.onOpenRequest = onOpenRequest;
    this.summary = h("button", { class: "inbox-summary", type: "button", "aria-expanded": "false",
      onClick: () => this.#activate() });
    this.list = h("ul", { class: "inbox-list", hidden: true });
    this.error = h("p", { class: "inbox-error", hidden: true });
    this.el = h("section", { class: "inbox", "aria-label": "Requests waiting for you", hidden: true },
      this.summary, this.list, this.error);
    this.release = tree.on("change", () => this.render());
    this.render();
  }

  destroy() {
    this.release();
  }

  render() {
    const requests = this.tree.requests;
    const failed = Boolean(this.tree.error);
    this.el.hidden = requests.length === 0 && !failed;
    this.error.hidden = !failed;
    if (failed) {
      this.error.replaceChildren("Update failed; showing the last known requests. ",
        h("button", { class: "link-btn", type: "button", text: "Retry", onClick: () => this.tree.refresh() }));
    }
    if (!requests.length) {
      this.#expanded = false;
      this.summary.hidden = true;
      this.list.hidden = true;
      return;
    }
    this.summary.hidden = false;
    const approvals = requests.filter((r) => r.kind === "approval").length;
    const questions = requests.length - approvals;
    const parts = [approvals && plural(approvals, "approval"), questions && plural(questions, "question")]
      .filter(Boolean).join(" and ");
    const text = requests.length === 1
      ? `${requests[0].path ?? "A member"} ${describe(requests[0])}`
      : `${parts} waiting for you${this.tree.requestsMore ? " (the oldest 1,000 shown)" : ""}`;
    this.summary.replaceChildren(...[h("span", { class: "inbox-icon", "aria-hidden": "true", text: "⚑" }),
      h("span", { class: "inbox-text", text }),
      requests.length > 1
        ? h("span", { class: "inbox-count", text: `${requests.length}${this.tree.requestsMore ? "+" : ""}` }) : null,
    ].filter(Boolean));
    this.summary.dataset.count = String(requests.length);
    this.summary.setAttribute("aria-expanded", String(this.#expanded && requests.length > 1));
    this.list.hidden = !(this.#expanded && requests.length > 1);
    this.list.replaceChildren(...requests.map((request) => h("li", {},
      h("button", { class: "inbox-item", type: "button", dataset: { requestId: request.id, kind: request.kind },
        onClick: () => this.onOpenRequest(request) },
      h("span", { class: "badge attention",
        text: request.kind === "approval" ? "approval" : "question" }),
      h("span", { class: "inbox-path", text: request.path ?? "" }),
      h("span", { class: "inbox-desc", text: describe(request) })))));
  }

  #activate() {
    const requests = this.tree.requests;
    if (requests.length === 1) {
      this.onOpenRequest(requests[0]);
      return;
    }
    this.#expanded = !this.#expanded;
    this.render();
  }
}
