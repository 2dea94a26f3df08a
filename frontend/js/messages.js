// Rendering of a conversation's display items (see cooperation.js) into DOM, with keyed
// reuse: an item whose content did not change keeps its element (and so its open/closed
// details, text selection and layout) across refreshes.

import { describeIntervention, describeRow, describeUserMessage } from "./cooperation.js";
import { h, visible } from "./dom.js";

const LONG_TEXT = 600; // characters after which a message starts collapsed

/** A link to a session target, or plain text when the target has no identity. */
export function targetLink(target, onOpen) {
  if (!target.sessionId) return h("span", { class: "member-name", text: target.label, title: target.path ?? "" });
  return h("button", {
    class: "member-link",
    type: "button",
    text: target.label,
    title: target.path ? `${target.path}${target.title && target.title !== target.label ? ` — ${target.title}` : ""}`
      : target.label,
    dataset: { sessionId: target.sessionId, treeId: target.treeId ?? "" },
    onClick: (event) => {
      event.preventDefault();
      event.stopPropagation();
      onOpen(target);
    },
  });
}

const SHOWN_TARGETS = 12; // a row naming more members shows "+N more" until expanded

function joinTargets(targets, onOpen) {
  const out = [];
  targets.forEach((target, index) => {
    if (index) out.push(index === targets.length - 1 ? " and " : ", ");
    out.push(targetLink(target, onOpen));
  });
  if (targets.length <= SHOWN_TARGETS) return out;
  // Keep the first links visible; the rest (and their separators) wait behind one button.
  const visible = out.slice(0, SHOWN_TARGETS * 2 - 1);
  const rest = h("span", { class: "more-targets", hidden: true }, out.slice(SHOWN_TARGETS * 2 - 1));
  const more = h("button", { class: "link-btn", type: "button", text: ` +${targets.length - SHOWN_TARGETS} more`,
    onClick: (event) => {
      event.preventDefault();
      rest.hidden = false;
      more.remove();
    } });
  return [...visible, rest, more];
}

/** A message's text; long inputs (task descriptions, scripts) start collapsed, replies never do. */
function textBlock(text, { collapsible = false } = {}) {
  const body = h("div", { class: "msg-text", text });
  if (!collapsible || (text.length <= LONG_TEXT && text.split("\n").length <= 12)) return body;
  body.classList.add("clamped");
  const toggle = h("button", { class: "link-btn more", type: "button", text: "Show more", "aria-expanded": "false",
    onClick: () => {
      const open = body.classList.toggle("clamped") === false;
      toggle.textContent = open ? "Show less" : "Show more";
      toggle.setAttribute("aria-expanded", String(open));
    } });
  return [body, toggle];
}

function renderUser(item, ctx) {
  const { text, source } = describeUserMessage(item.message, ctx.treeId);
  const head = source.sessionId
    ? targetLink({ label: source.label, sessionId: source.sessionId, treeId: source.treeId, path: source.path },
      ctx.onOpen)
    : h("span", { class: "msg-source-label", text: source.label });
  return h("article", { class: `msg user from-${source.kind}`, dataset: { messageId: item.message.id,
    originKind: source.kind } },
  h("header", { class: "msg-source" }, head), textBlock(text, { collapsible: true }));
}

function renderAssistant(item) {
  return h("article", { class: "msg assistant", dataset: { messageId: item.message.id } },
    textBlock(item.message.content));
}

const ICONS = { done: "✓", pending: "", failed: "!", interrupted: "–" };

function callDetails(row) {
  const blocks = [];
  for (const call of row.calls) {
    const result = call.result;
    if (call.error) {
      blocks.push(h("pre", { class: "coop-error", text: call.error }));
    } else if (row.name === "run_command" && result && typeof result === "object") {
      if (result.stdout) blocks.push(h("pre", { class: "coop-output", text: result.stdout }));
      if (result.stderr) blocks.push(h("pre", { class: "coop-output stderr", text: result.stderr }));
    }
    if (call.error || row.name !== "run_command") {
      const args = `${call.name}(${JSON.stringify(call.args, null, 2)})`;
      blocks.push(h("pre", { class: "coop-args", text: visible(args) }));
    }
  }
  return blocks;
}

function renderTools(item, ctx, description) {
  const { text, targets, detail, state, code } = description;
  const line = [
    h("span", { class: `coop-icon ${state}`, "aria-hidden": "true", text: ICONS[state] ?? "" }),
    h("span", { class: "coop-text", text }),
    code ? h("code", { class: "coop-code", text: visible(code) }) : null,  // what ran, as the approval showed it
    targets.length ? h("span", { class: "coop-targets" }, joinTargets(targets, ctx.onOpen)) : null,
    detail ? h("span", { class: "coop-detail", text: detail }) : null,
  ];
  const attrs = { class: `coop-row ${state}`, dataset: { tool: item.name, state, count: item.calls.length } };
  const expandable = state === "failed" || item.name === "run_command" || item.name === "ask_user";
  if (!expandable) return h("div", attrs, ...line);
  return h("details", attrs, h("summary", { class: "coop-summary" }, ...line),
    h("div", { class: "coop-details" }, callDetails(item)));
}

/** A human's direct action on this session or on a child of it (a user_intervention event). */
function renderIntervention(item, ctx) {
  const { intervention, self } = item;
  const { lead, tail, quote } = describeIntervention(intervention);
  const member = self ? "this session" : targetLink({ label: intervention.path,
    sessionId: intervention.member_session_id, treeId: ctx.treeId, path: intervention.path }, ctx.onOpen);
  return h("div", { class: `intervention${self ? " self" : ""}`, role: "note",
    dataset: { action: intervention.action, memberSessionId: intervention.member_session_id,
      cursor: intervention.cursor } },
  h("span", { class: "intervention-label", text: "Intervention" }),
  h("span", { class: "intervention-text" }, `${lead} `, member, tail),
  quote ? h("q", { class: "intervention-quote", text: quote }) : null);
}

function turnFooter(result) {
  if (!result || !["failed", "cancelled"].includes(result.status)) return null;
  const text = result.status === "failed" ? `Turn failed${result.error ? `: ${result.error}` : ""}` : "Turn cancelled";
  return h("div", { class: `turn-end ${result.status}`, dataset: { turnId: result.turn_id }, role: "note", text });
}

/**
 * Reconcile ``container``'s children with ``items``.
 * ctx: {resolve, treeId, onOpen, results: Map turn_id → Result}
 */
export function renderItems(container, items, ctx, cache) {
  const lastOfTurn = new Map();
  items.forEach((item, index) => {
    const turnId = item.message?.turn_id ?? item.turnId;
    if (turnId) lastOfTurn.set(turnId, index);
  });
  const next = [];
  const used = new Map();
  items.forEach((item, index) => {
    let signature;
    let build;
    if (item.kind === "tools") {
      const description = describeRow(item, ctx.resolve);
      signature = JSON.stringify([description, item.calls.map((c) => [c.state, c.resultText?.length ?? 0])]);
      build = () => renderTools(item, ctx, description);
    } else if (item.kind === "intervention") {
      signature = item.key;
      build = () => renderIntervention(item, ctx);
    } else {
      signature = item.key; // a message never changes: its id says it all
      build = () => (item.kind === "user" ? renderUser(item, ctx) : renderAssistant(item));
    }
    const turnId = item.message?.turn_id ?? item.turnId;
    const result = lastOfTurn.get(turnId) === index ? ctx.results.get(turnId) : null;
    if (result) signature += `|${result.status}|${result.error ?? ""}`;
    const cached = cache.get(item.key);
    let el;
    if (cached && cached.signature === signature) el = cached.el;
    else {
      const built = build();
      const footer = turnFooter(result);
      el = footer ? h("div", { class: "item-with-footer" }, built, footer) : built;
    }
    el.dataset.key = item.key;
    used.set(item.key, { el, signature });
    next.push(el);
  });
  cache.clear();
  for (const [key, value] of used) cache.set(key, value);
  // Move only what is out of place, so unchanged nodes are not detached.
  next.forEach((el, index) => {
    if (container.children[index] !== el) container.insertBefore(el, container.children[index] ?? null);
  });
  while (container.children.length > next.length) container.lastElementChild.remove();
}
