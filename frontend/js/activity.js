// How a session's activity is shown everywhere (session list, tabs, cooperation list):
// running and queued are a spinner without words; each kind of waiting has its own label;
// waits for a human are prominent, a wait for cooperation is neutral. A tree's counts are
// the same chips in the state panel and in the session list.

import { h } from "./dom.js";

export const ACTIVITY_LABELS = {
  idle: "idle",
  queued: "queued",
  running: "running",
  waiting_cooperation: "waiting for tasks",
  waiting_approval: "needs approval",
  waiting_answer: "needs an answer",
  cancelling: "stopping",
};

export const BUSY = new Set(["running", "queued", "cancelling"]);
export const WAITING = new Set(["waiting_cooperation", "waiting_approval", "waiting_answer"]);
export const HUMAN_WAIT = new Set(["waiting_approval", "waiting_answer"]);

/** The compact indicator: a spinner, a label, or nothing (idle). */
export function activityIndicator(activity) {
  if (!activity || activity === "idle") return null;
  if (BUSY.has(activity)) {
    return h("span", { class: `spinner${activity === "cancelling" ? " stopping" : ""}`, role: "img",
      "aria-label": ACTIVITY_LABELS[activity], title: ACTIVITY_LABELS[activity], dataset: { activity } });
  }
  return activityBadge(activity);
}

const GLYPHS = { waiting_cooperation: "…", waiting_approval: "!", waiting_answer: "?" };

/** The smallest form, for tabs: a spinner, or a one-glyph mark whose title names the wait. */
export function activityMark(activity) {
  if (!activity || activity === "idle") return null;
  if (!WAITING.has(activity)) return activityIndicator(activity);
  return h("span", { class: `mark ${HUMAN_WAIT.has(activity) ? "attention" : "neutral"}`, role: "img",
    "aria-label": ACTIVITY_LABELS[activity], title: ACTIVITY_LABELS[activity], dataset: { activity },
    text: GLYPHS[activity] });
}

/** A labelled badge, for places that always name the state (cooperation list, headers). */
export function activityBadge(activity) {
  const kind = HUMAN_WAIT.has(activity) ? "attention" : activity === "waiting_cooperation" ? "neutral"
    : BUSY.has(activity) ? "busy" : "idle";
  return h("span", { class: `badge ${kind}`, dataset: { activity }, text: ACTIVITY_LABELS[activity] ?? activity });
}

export function turnStatusBadge(status) {
  if (!status) return h("span", { class: "badge idle", text: "no turn" });
  const kind = status === "failed" ? "danger" : status === "cancelled" ? "muted" : status === "completed" ? "ok"
    : "busy";
  return h("span", { class: `badge ${kind}`, dataset: { turnStatus: status }, text: status });
}

/**
 * A tree's counts as chips: {running, queued, waiting, needsYou (of the waiting), stopping, failed}.
 * Waiting is marked for attention as soon as one member waits for a human.
 */
export function attentionChips(counts) {
  const chips = [];
  const chip = (kind, n, label) => {
    if (n) chips.push(h("span", { class: `chip ${kind}`, dataset: { kind, count: n }, text: `${n} ${label}` }));
  };
  chip("running", counts.running, "running");
  chip("queued", counts.queued, "queued");
  chip(counts.needsYou ? "attention" : "waiting", counts.waiting, "waiting");
  chip("stopping", counts.stopping, "stopping");
  chip("failed", counts.failed, "failed");
  return chips;
}
