// The tree's state panel: member count and what needs attention (running / queued /
// waiting / failed), Stop all while anything is unfinished or an unpaused queue has input,
// Continue when a stopped tree has pending input (or was stopped by its budget). Below: the
// tree's usage (tokens in and out, model calls, cost; the trees it spawned counted apart), its
// budget used so far, why it stopped, and a form to change the budget (and continue). The summary
// opens the cooperation list, Timeline the tree's timeline. The panel docks above the
// conversation or floats over it (a phone's short screen keeps the conversation's full height);
// the choice is remembered.

import { attentionChips } from "./activity.js";
import { h, plural, storage } from "./dom.js";
import { OPEN_TURN } from "./store.js";
import { LIMITS, budgetMeters, describeReached, describeUsage, formatCount, stopReasonText } from "./usage.js";

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
    // Continue: the tree was stopped and some member still has input waiting, or its budget stopped it
    // (once the budget has room again: the server refuses while it is used up).
    continuable: Boolean(summary?.stopped) && !summary?.budget_reached && (members.some((m) => m.pending_inputs > 0)
      || summary?.stop_reason === "budget_exceeded"),
    stopped: Boolean(summary?.stopped),
    budgetStopped: Boolean(summary?.stopped) && summary?.stop_reason === "budget_exceeded",
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
    this.budgetButton = h("button", { class: "btn ghost small budget-btn", type: "button", text: "Budget",
      "aria-expanded": "false", title: "Limit this tree's tokens, cost, model calls and wall time",
      onClick: () => this.#toggleBudgetForm() });
    this.usageLine = h("span", { class: "usage-text" });
    this.meters = h("span", { class: "budget-meters" });
    this.spawnedLine = h("span", { class: "usage-spawned", hidden: true });
    this.usageRow = h("div", { class: "state-usage", hidden: true }, this.usageLine, this.spawnedLine, this.meters);
    this.stopReason = h("p", { class: "state-stop-reason", role: "status", hidden: true });
    this.budgetInputs = Object.fromEntries(LIMITS.map((l) => [l.key, h("input", { type: "number", name: l.key,
      min: "0", step: l.step, inputmode: "decimal", placeholder: "no limit", "aria-label": `Maximum ${l.label}` })]));
    this.saveButton = h("button", { class: "btn small", type: "submit", text: "Save" });
    this.saveContinueButton = h("button", { class: "btn primary small", type: "button", text: "Save and resume",
      title: "Save the budget, then continue the tree", hidden: true,
      onClick: () => this.#saveBudget({ thenContinue: true }) });
    this.budgetForm = h("form", { class: "budget-form", hidden: true, "aria-label": "Tree budget",
      onSubmit: (event) => {
        event.preventDefault();
        this.#saveBudget({ thenContinue: false });
      } },
    h("div", { class: "budget-fields" }, LIMITS.map((l) => h("label", { class: "budget-field" },
      h("span", { text: `Max ${l.label}` }), this.budgetInputs[l.key]))),
    h("div", { class: "budget-actions" }, this.saveButton, this.saveContinueButton,
      h("button", { class: "btn ghost small", type: "button", text: "Close", onClick: () => this.#toggleBudgetForm(false) })));
    this.dockButton = h("button", { class: "icon-btn dock-toggle", type: "button",
      onClick: () => this.setFloating(!this.floating) });
    this.note = h("p", { class: "state-note", role: "status", "aria-live": "polite", hidden: true });
    this.el = h("section", { class: "state-panel", "aria-label": "Cooperation state" },
      h("div", { class: "state-row" }, this.summaryButton,
        h("div", { class: "state-actions" }, this.stopButton, this.continueButton, this.budgetButton,
          this.timelineButton, this.dockButton)),
      this.usageRow, this.stopReason, this.budgetForm, this.note);
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
    if (s.stopped) {
      chips.push(h("span", { class: "chip stopped", dataset: { kind: "stopped" },
        text: s.budgetStopped ? "stopped: budget" : "stopped" }));
    }
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
    this.#renderUsage(s);
  }

  /** The usage line, the budget meters and why the tree stopped. */
  #renderUsage(s) {
    const summary = this.tree.summary;
    const usage = summary?.usage;
    this.usageRow.hidden = !usage;
    if (!usage) return;
    this.usageLine.textContent = describeUsage(usage);
    Object.assign(this.usageRow.dataset, { tokens: usage.tokens, promptTokens: usage.prompt_tokens,
      completionTokens: usage.completion_tokens, modelCalls: usage.model_calls, costUsd: usage.cost_usd });
    const spawned = summary.spawned_usage;
    this.spawnedLine.hidden = !spawned?.trees;
    this.spawnedLine.textContent = spawned?.trees
      ? `spawned trees (${spawned.trees}): ${formatCount(spawned.tokens)} tokens · ${formatCount(spawned.model_calls)} calls`
      : "";
    this.meters.replaceChildren(...budgetMeters(summary).map((m) => {
      const uncounted = m.uncounted ? ` + ${formatCount(m.uncounted)} with no price` : "";
      return h("span", {
        class: `budget-meter${m.reached ? " reached" : ""}`, dataset: { limit: m.limit, max: m.max, used: m.used },
        title: `Budget: ${m.format(m.used)}${uncounted} of ${m.format(m.max)} ${m.label}`,
        style: { "--used": m.uncounted ? "100%" : `${Math.min(100, (100 * m.used) / m.max).toFixed(1)}%` },
        text: `${m.format(m.used)}${uncounted} / ${m.format(m.max)} ${m.label === "USD" ? "" : m.label}`.trim() });
    }));
    const reason = stopReasonText(summary);
    this.stopReason.hidden = !reason;
    this.stopReason.textContent = reason;
    this.stopReason.dataset.reason = s.stopped ? summary.stop_reason ?? "user" : "";
    this.budgetButton.textContent = s.budgetStopped ? "Raise budget" : "Budget";
    this.budgetButton.classList.toggle("primary", s.budgetStopped);
    this.budgetButton.classList.toggle("ghost", !s.budgetStopped);
    this.saveContinueButton.hidden = !s.stopped;
    if (summary.budget_reached && !s.stopped) {
      this.stopReason.hidden = false;
      this.stopReason.textContent = `The budget is used up (${describeReached(summary.budget_reached)}): `
        + "no further model call starts.";
    }
  }

  #toggleBudgetForm(open = this.budgetForm.hidden) {
    this.budgetForm.hidden = !open;
    this.budgetButton.setAttribute("aria-expanded", String(open));
    if (!open) return;
    const budget = this.tree.summary?.budget ?? {};
    for (const limit of LIMITS) this.budgetInputs[limit.key].value = budget[limit.key] ?? "";
    this.budgetInputs.max_tokens.focus();
  }

  /** PATCH every limit from the form (an empty field removes the limit), then maybe continue. */
  async #saveBudget({ thenContinue }) {
    const changes = {};
    for (const limit of LIMITS) {
      const raw = this.budgetInputs[limit.key].value.trim();
      changes[limit.key] = raw === "" ? null : Number(raw);
    }
    const buttons = [this.saveButton, this.saveContinueButton];
    for (const button of buttons) button.disabled = true;
    try {
      await this.api.updateBudget(this.tree.treeId, changes);
      if (thenContinue) await this.api.continueTree(this.tree.treeId);
      this.#toggleBudgetForm(false);
      this.showNote(thenContinue ? "Budget saved; continuing: paused queues run again." : "Budget saved.");
    } catch (error) {
      this.showNote(`${thenContinue ? "Could not save and continue" : "Could not save the budget"}: ${error.message}`,
        "error");
    } finally {
      for (const button of buttons) button.disabled = false;
      this.tree.scheduleRefresh();
      this.tree.refreshSessions();
    }
  }

  #stop() {
    return this.#act(this.stopButton, () => this.api.stopTree(this.tree.treeId),
      "Stopping every turn; queued inputs are kept and paused.", (error) => `Could not stop: ${error.message}`);
  }

  #continue() {
    return this.#act(this.continueButton, () => this.api.continueTree(this.tree.treeId),
      "Continuing: paused queues run again (cancelled turns stay cancelled).", (error) => (error.status === 409
        ? `Not yet: ${error.message}`
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
