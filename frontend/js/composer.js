// The message box of a session view: send a new input, steer the running Turn, "@" for
// agents. Each box keeps its own draft (per session, in localStorage) across tab switches
// and reloads. A failed send keeps the text and says why.

import { AgentPicker } from "./agentPicker.js";
import { debounce, h, newKey, storage } from "./dom.js";

const STATUS_MS = 8_000;

export class Composer {
  #busy = false;
  #canSteer = false;
  #statusTimer = null;
  #attempt = null; // {action, text, key} of a failed submission: retrying it reuses its key

  /**
   * @param {{draftKey: string, placeholder?: string, loadAgents: () => Promise<object[]>,
   *          onSend: (text: string, idempotencyKey: string) => Promise<string|void>,
   *          onSteer?: (text: string, idempotencyKey: string) => Promise<string|void>,
   *          sendLabel?: string}} options
   */
  constructor({ draftKey, placeholder = "Message…", loadAgents, onSend, onSteer = null, sendLabel = "Send" }) {
    this.draftKey = draftKey;
    this.onSend = onSend;
    this.onSteer = onSteer;

    this.textarea = h("textarea", { class: "composer-input", rows: 1, placeholder, "aria-label": placeholder,
      spellcheck: "true" });
    this.textarea.value = storage.get(this.#storageKey, "");
    this.picker = new AgentPicker(this.textarea, loadAgents);
    this.sendButton = h("button", { class: "btn primary", type: "submit", text: sendLabel });
    this.steerButton = h("button", { class: "btn steer", type: "button", text: "Steer", hidden: true,
      title: "Correct the running turn (read at its next model call)", onClick: () => this.#submit("steer") });
    this.status = h("p", { class: "composer-status", role: "status", "aria-live": "polite" });
    this.el = h("form", { class: "composer", onSubmit: (event) => {
      event.preventDefault();
      this.#submit("send");
    } },
    h("div", { class: "composer-box" }, this.picker.el, this.textarea,
      h("div", { class: "composer-actions" }, this.steerButton, this.sendButton)),
    this.status);

    const saveDraft = debounce(() => storage.set(this.#storageKey, this.textarea.value), 250);
    this.textarea.addEventListener("input", () => {
      saveDraft();
      this.#autosize();
    });
    this.textarea.addEventListener("keydown", (event) => this.#onKey(event));
    requestAnimationFrame(() => this.#autosize());
  }

  get #storageKey() {
    return `canopy:draft:${this.draftKey}`;
  }

  get draft() {
    return this.textarea.value;
  }

  set draft(text) {
    this.textarea.value = text;
    storage.set(this.#storageKey, text);
    this.#autosize();
  }

  focus() {
    this.textarea.focus({ preventScroll: true });
  }

  /** Steer is offered while the session has a running Turn. */
  setCanSteer(canSteer) {
    this.#canSteer = Boolean(canSteer && this.onSteer);
    this.steerButton.hidden = !this.#canSteer;
  }

  /** A line under the box; information fades after a while, errors stay until the next action. */
  showStatus(text, kind = "info") {
    clearTimeout(this.#statusTimer);
    this.status.textContent = text ?? "";
    this.status.dataset.kind = kind;
    if (text && kind === "info") this.#statusTimer = setTimeout(() => this.showStatus(""), STATUS_MS);
  }

  #onKey(event) {
    if (this.picker.handleKey(event)) {
      event.preventDefault();
      return;
    }
    if (event.key !== "Enter" || event.shiftKey || event.isComposing) return;
    event.preventDefault();
    this.#submit((event.ctrlKey || event.metaKey) && this.#canSteer ? "steer" : "send");
  }

  #autosize() {
    this.textarea.style.height = "auto";
    this.textarea.style.height = `${Math.min(this.textarea.scrollHeight, 240)}px`;
  }

  async #submit(action) {
    const text = this.textarea.value.trim();
    if (!text || this.#busy) return;
    this.#busy = true;
    this.sendButton.disabled = true;
    this.steerButton.disabled = true;
    this.showStatus(action === "steer" ? "Steering…" : "Sending…");
    // The same text sent again after a failure keeps its Idempotency-Key: never sent twice.
    if (this.#attempt?.action !== action || this.#attempt.text !== text) {
      this.#attempt = { action, text, key: newKey() };
    }
    const { key } = this.#attempt;
    try {
      const note = await (action === "steer" ? this.onSteer(text, key) : this.onSend(text, key));
      this.#attempt = null;
      this.draft = "";
      this.showStatus(note ?? "");
    } catch (error) {
      this.showStatus(error?.message ?? String(error), "error");
    } finally {
      this.#busy = false;
      this.sendButton.disabled = false;
      this.steerButton.disabled = false;
    }
  }
}
