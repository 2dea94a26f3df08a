// A human request card: approve / deny a command, or answer a question
// (POST /requests/{id}/answer). A failed submission (e.g. a 503) keeps the chosen decision
// or the typed answer, leaves the card usable and offers a retry.

import { h, newKey, visible } from "./dom.js";

/** How long ``text`` is, when it is more than one line or 200 characters (code points); else "". */
function extentOf(text) {
  const lines = text.split("\n").length;
  const characters = [...text].length;
  return lines > 1 || characters > 200
    ? `${lines} line${lines === 1 ? "" : "s"}, ${characters} characters: read all of it` : "";
}

/**
 * What an approval asks for, hidden characters shown: a command to run (``subject``) and how long it
 * may run, or a file to write (``path``) with its whole content (``subject``); ``extent``: how long
 * the subject is, when it is more than one short line. A write requested before requests held the
 * content has only a preview of it: ``extent`` says so.
 */
export function approvalAction(payload) {
  if (payload.tool === "write_file") {
    const path = visible(String(payload.path ?? ""));
    if (typeof payload.content !== "string") {
      const preview = String(payload.preview ?? "");
      return { verb: "wants to write", path, subject: visible(preview),
        extent: `only the first ${[...preview].length} characters of ${payload.bytes ?? "?"} bytes are shown: `
          + "deny it unless that is all of it" };
    }
    const content = payload.content;
    return { verb: "wants to write", path, subject: visible(content),
      extent: content ? extentOf(content) : "an empty file" };
  }
  const command = String(payload.command ?? "");
  const limit = Number.isInteger(payload.timeout_seconds) ? ` for up to ${payload.timeout_seconds} s` : "";
  return { verb: `wants to run${limit}`, path: "", subject: visible(command), extent: extentOf(command) };
}

export class RequestCard {
  #choice = null;
  #busy = false;
  #keys = new Map(); // one Idempotency-Key per choice, so a retry can never answer twice

  constructor({ api, request, onAnswered }) {
    this.api = api;
    this.request = request;
    this.onAnswered = onAnswered;
    const isApproval = request.kind === "approval";
    const payload = request.payload ?? {};

    this.error = h("p", { class: "request-error", role: "alert", hidden: true });
    this.retryButton = h("button", { class: "btn small", type: "button", text: "Retry", hidden: true,
      onClick: () => this.#submit(this.#choice) });

    if (isApproval) {
      this.approveButton = h("button", { class: "btn primary", type: "button", text: "Approve",
        "aria-pressed": "false", onClick: () => this.#submit({ decision: "approve" }) });
      this.denyButton = h("button", { class: "btn danger", type: "button", text: "Deny", "aria-pressed": "false",
        onClick: () => this.#submit({ decision: "deny" }) });
      this.buttons = [this.approveButton, this.denyButton];
      const action = approvalAction(payload);
      this.body = h("div", { class: "request-body" },
        action.path
          ? h("p", {}, `${action.verb} `, h("code", { class: "request-file", text: action.path }), ":")
          : h("p", { text: `${action.verb}:` }),
        h("pre", { class: "request-command" }, h("code", { text: action.subject })),
        h("p", { class: "request-extent", text: action.extent, hidden: !action.extent }));
    } else {
      this.answer = h("textarea", { class: "request-answer", rows: 2, "aria-label": "Your answer",
        placeholder: "Your answer…" });
      this.answer.addEventListener("keydown", (event) => {
        if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
          event.preventDefault();
          this.answerButton.click();
        }
      });
      this.answerButton = h("button", { class: "btn primary", type: "button", text: "Answer",
        onClick: () => {
          const text = this.answer.value.trim();
          if (text) this.#submit({ answer: text });
          else this.answer.focus();
        } });
      this.buttons = [this.answerButton];
      this.body = h("div", { class: "request-body" },
        h("p", { class: "request-question", text: String(payload.question ?? "") }), this.answer);
    }

    this.el = h("article", {
      class: `request-card ${isApproval ? "approval" : "question"}`,
      id: `request-${request.id}`,
      tabindex: "-1",
      dataset: { requestId: request.id, kind: request.kind },
      "aria-label": isApproval ? "Approval needed" : "Question for you",
    },
    h("header", { class: "request-head" },
      h("span", { class: "request-kind", text: isApproval ? "Approval needed" : "Question" }),
      h("span", { class: "request-path", text: request.path ?? "" })),
    this.body,
    h("div", { class: "request-actions" }, ...this.buttons, this.retryButton),
    this.error);
  }

  /** Bring the card into view and focus it (from the inbox). */
  focus() {
    this.el.scrollIntoView({ block: "center" });
    (this.answer ?? this.el).focus({ preventScroll: true });
    this.el.classList.remove("flash");
    void this.el.offsetWidth; // restart the highlight animation
    this.el.classList.add("flash");
  }

  async #submit(choice) {
    if (!choice || this.#busy) return;
    this.#busy = true;
    this.#choice = choice;
    this.#showChoice();
    for (const button of this.buttons) button.disabled = true;
    this.retryButton.hidden = true;
    this.error.hidden = true;
    this.el.setAttribute("aria-busy", "true");
    try {
      const which = JSON.stringify(choice);
      if (!this.#keys.has(which)) this.#keys.set(which, newKey());
      await this.api.answerRequest(this.request.id, choice, { idempotencyKey: this.#keys.get(which) });
      this.el.classList.add("answered");
      this.onAnswered(this.request.id);
    } catch (error) {
      if (error?.status === 409) {
        // Already answered or ended elsewhere: the next read removes the card.
        this.error.textContent = `This request is no longer pending: ${error.message}`;
        this.error.hidden = false;
        this.onAnswered(this.request.id);
      } else {
        const what = choice.decision ? `your ${choice.decision === "approve" ? "approval" : "denial"}`
          : "your answer";
        this.error.textContent = `Could not send ${what}: ${error?.message ?? error}. It is kept; retry when ready.`;
        this.error.hidden = false;
        this.retryButton.hidden = false;
      }
    } finally {
      this.#busy = false;
      for (const button of this.buttons) button.disabled = false;
      this.el.removeAttribute("aria-busy");
    }
  }

  #showChoice() {
    if (this.approveButton) {
      this.approveButton.setAttribute("aria-pressed", String(this.#choice?.decision === "approve"));
      this.denyButton.setAttribute("aria-pressed", String(this.#choice?.decision === "deny"));
    }
  }
}
