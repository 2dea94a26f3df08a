// The tree's state panel: member count and what needs attention (running / queued /
// waiting / failed), Stop all while anything is unfinished or an unpaused queue has input,
// Continue when a stopped tree has pending input. The summary opens the cooperation list,
// Timeline the tree's timeline. The panel docks above the conversation or floats over it
// (a phone's short screen keeps the conversation's full height); the choice is remembered.

import { attentionChips } from "./activity.js";
import { h, plural, storage } from "./dom.js";
import { OPEN_TURN } from "./store.js";

const PLACEMENT_KEY = "canopy:state-panel";

/** Counts and the actions a tree summary allows. */
export function summarize(summary) {
  const members = summary?.members ?? [];
  const count = (pred) => members.filter(pred).length;
  return {
    members: members.length,
    running: count((m) => m.activity === "running"),
    queued: count((m) => m.activity === "queued"),
    waiting: count((m) => m.activity?.startsWith("waiting_")),
    needsYou: count((m) => m.activity === "waiting_approval" || m.activity === "waiting_answer"),
    stopping: count((m) => m.activity === "cancelling"),
    failed: count((m) => m.turn_status === "failed"),
    // Stop all: any unfinished Turn, or a queue that would still start work.
    stoppable: members.some((m) => OPEN_TURN.has(m.turn_status) || (m.pending_inputs > 0 && !m.queue_paused)),
    // Continue: the tree was stopped and some member still has input waiting.
    continuable: Boolean(summary?.stopped) && members.some((m) => m.pending_inputs > 0),
    stopped: Boolean(summary?.stopped),
    slotsInUse: summary?.slots_in_use ?? 0,
    slotLimit: summary?.slot_limit ?? 0,
  };
}

export class StatePanel {
  constructor({ api, tree, onOpenList, onOpenTimeline }) {
    this.api = api;
    this.tree = tree;
    this.count = h("strong", { class: "state-count" });
    this.chips = h("span", { class: "state-chips" });
    this.summaryButton = h("button", { class: "state-summary", type: "button", onClick: onOpenList,
      title: "Open the cooperation list" }, this.count, this.chips);
    this.stopButton = h("button", { class: "btn danger small", type: "button", text: "Stop all", hidden: true,
      title: "Cancel every unfinished turn in this tree and pause its queues",
      onClick: () => this.#stop() });
    this.continueButton = h("button", { class: "btn primary small", type: "button", text: "Continue", hidden: true,
      title: "Resume the paused queues of this tree", onClick: () => this.#continue() });
    this.timelineButton = h("button", { class: "btn ghost small timeline-btn", type: "button", text: "Timeline",
      title: "Where the time went: every member's runs, queues and waits", onClick: onOpenTimeline });
    this.dockButton = h("button", { class: "icon-btn dock-toggle", type: "button",
      onClick: () => this.setFloating(!this.floating) });
    this.note = h("p", { class: "state-note", role: "status", "aria-live": "polite", hidden: true });
    this.el = h("section", { class: "state-panel", "aria-label": "Cooperation state" },
      h("div", { class: "state-row" }, this.summaryButton,
        h("div", { class: "state-actions" }, this.stopButton, this.continueButton, this.timelineButton,
          this.dockButton)),
      this.note);
    this.setFloating(storage.get(PLACEMENT_KEY) === "float", { save: false });
    this.release = tree.on("change", () => this.render());
    this.render();
  }

  destroy() {
    this.release();
  }

  /** Float over the conversation, or dock above it (kept in localStorage for every tree). */
  setFloating(floating, { save = true } = {}) {
    this.floating = floating;
    if (save) storage.set(PLACEMENT_KEY, floating ? "float" : "dock");
    this.el.classList.toggle("floating", floating);
    const label = floating ? "Dock the state panel above the conversation" : "Float the state panel over the conversation";
    this.dockButton.textContent = floating ? "⇲" : "⇱";
    this.dockButton.title = label;
    this.dockButton.setAttribute("aria-label", label);
    this.dockButton.setAttribute("aria-pressed", String(floating));
  }

  showNote(text, kind = "info") {
    clearTimeout(this.noteTimer);
    this.note.textContent = text ?? "";
    this.note.dataset.kind = kind;
    this.note.hidden = !text;
    if (text && kind === "info") this.noteTimer = setTimeout(() => this.showNote(""), 8_000);
  }

  render() {
    const s = summarize(this.tree.summary);
    this.count.textContent = this.tree.summary ? plural(s.members, "member") : "…";
    this.count.dataset.members = String(s.members);
    const chips = attentionChips(s);
    if (s.stopped) chips.push(h("span", { class: "chip stopped", dataset: { kind: "stopped" }, text: "stopped" }));
    if (!chips.length && this.tree.summary) chips.push(h("span", { class: "chip idle", text: "all idle" }));
    if (s.slotLimit) {
      chips.push(h("span", { class: "chip slots", title: "execution slots in use",
        text: `slots ${s.slotsInUse}/${s.slotLimit}` }));
    }
    if (this.tree.error) {
      chips.push(h("span", { class: "chip failed", title: this.tree.error.message, text: "update failed" }));
    }
    this.chips.replaceChildren(...chips);
    this.stopButton.hidden = !s.stoppable;
    this.continueButton.hidden = !s.continuable;
  }

  #stop() {
    return this.#act(this.stopButton, () => this.api.stopTree(this.tree.treeId),
      "Stopping every turn; queued inputs are kept and paused.", (error) => `Could not stop: ${error.message}`);
  }

  #continue() {
    return this.#act(this.continueButton, () => this.api.continueTree(this.tree.treeId),
      "Continuing: paused queues run again (cancelled turns stay cancelled).", (error) => (error.status === 409
        ? `Not yet: some turns are still ending. Continue once every turn has stopped. (${error.message})`
        : `Could not continue: ${error.message}`));
  }

  /** One tree action from its button: the outcome in the note, then the whole tree re-read. */
  async #act(button, action, done, failed) {
    button.disabled = true;
    try {
      await action();
      this.showNote(done);
    } catch (error) {
      this.showNote(failed(error), "error");
    } finally {
      button.disabled = false;
      this.tree.scheduleRefresh();
      this.tree.refreshSessions();
    }
  }
}
