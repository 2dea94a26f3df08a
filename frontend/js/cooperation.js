// Pure logic (no DOM): turn a session's stored messages into display items, collapse
// consecutive cooperation tool calls into compact rows, describe each row and each message
// origin. Target identity comes from tool results (session_id, path) and from the Input
// receipts the history already holds (input_id → session), never from guesses: a target we
// cannot resolve is shown by name, without a link.

import { plural } from "./dom.js";

export const COOPERATION_TOOLS = new Set([
  "create_session", "submit_input", "send_message", "cancel_turn", "wait_inputs", "wait_sessions",
  "get_result", "list_sessions", "list_agents",
]);

export function parseJson(text) {
  if (typeof text !== "string") return text ?? null;
  try {
    return JSON.parse(text);
  } catch {
    return null;
  }
}

/** A stored tool call is {id, name, arguments: {...}}; accept the OpenAI shape too. */
export function normalizeCall(call) {
  const name = call.name ?? call.function?.name ?? "tool";
  let args = call.arguments ?? call.function?.arguments ?? {};
  if (typeof args === "string") args = parseJson(args) ?? { raw: args };
  return { id: call.id ?? "", name, args: args ?? {} };
}

/**
 * Ready a fetched message to be shown, once (a message never changes): a tool result's content
 * parsed (``parsed``), an assistant message's tool calls normalized (``calls``). The store does it
 * as it adds messages, so a render parses nothing; a message that skipped it is read here each time.
 */
export function readMessage(m) {
  if (m.role === "tool") m.parsed = parseJson(m.content);
  else if (m.role === "assistant") m.calls = (m.tool_calls ?? []).map(normalizeCall);
  return m;
}

const parsedOf = (m) => ("parsed" in m ? m.parsed : parseJson(m.content));
const callsOf = (m) => m.calls ?? (m.tool_calls ?? []).map(normalizeCall);

/**
 * Display items, in order:
 *   {kind: "user", key, message}
 *   {kind: "assistant", key, message}        an assistant message's text
 *   {kind: "tools", key, name, turnId, calls} one row: one call, or several consecutive
 *                                             successful calls of the same cooperation tool
 * Each call: {id, name, args, turnId, result, resultText, error, state}, with state
 * "done" | "failed" | "pending" (its Turn is still open) | "interrupted" (its Turn ended first).
 */
export function buildItems(messages, { openTurnId = null } = {}) {
  const resultByCall = new Map();
  for (const m of messages) if (m.role === "tool") resultByCall.set(`${m.turn_id}:${m.tool_call_id}`, m);
  const answered = new Set();
  const items = [];
  let group = null;

  for (const m of messages) {
    if (m.role === "tool") continue;
    if (m.role !== "assistant") {
      group = null;
      items.push({ kind: "user", key: `m${m.id}`, message: m });
      continue;
    }
    if (m.content && m.content.trim()) {
      group = null;
      items.push({ kind: "assistant", key: `m${m.id}`, message: m });
    }
    for (const call of callsOf(m)) {
      const resultKey = `${m.turn_id}:${call.id}`;
      const stored = resultByCall.get(resultKey);
      if (stored) answered.add(resultKey);
      const result = stored ? parsedOf(stored) : undefined;
      const error = result && typeof result === "object" && !Array.isArray(result) && "error" in result
        ? String(result.error) : null;
      const state = stored ? (error ? "failed" : "done") : m.turn_id && m.turn_id === openTurnId ? "pending"
        : "interrupted";
      const entry = { ...call, turnId: m.turn_id, result, resultText: stored?.content ?? null, error, state };
      const mergeable = COOPERATION_TOOLS.has(call.name) && !error;
      if (group && mergeable && group.name === call.name && group.turnId === m.turn_id) {
        group.calls.push(entry);
        continue;
      }
      const row = { kind: "tools", key: `c${m.id}:${call.id}`, name: call.name, turnId: m.turn_id, calls: [entry],
        at: m.created_at };
      items.push(row);
      group = mergeable ? row : null;
    }
  }
  // Results whose call we never saw (should not happen) are still shown, not dropped.
  for (const m of messages) {
    if (m.role === "tool" && !answered.has(`${m.turn_id}:${m.tool_call_id}`)) {
      const result = parsedOf(m);
      items.push({
        kind: "tools", key: `m${m.id}`, name: "tool", turnId: m.turn_id,
        calls: [{ id: m.tool_call_id, name: "tool", args: {}, turnId: m.turn_id, result, resultText: m.content,
          error: result?.error ?? null, state: result?.error ? "failed" : "done" }],
      });
    }
  }
  return items;
}

/** A new root is named "root" in its own tree: show it by the name its creator gave it. */
function rootModeTarget(call, result) {
  return call?.name === "create_session" && call.args?.mode === "root"
    ? { ...result, name: call.args.name ?? result.name, path: null } : result;
}

/** input_id → {session_id, name, path, tree_id}, from every receipt in the history. */
export function collectReceipts(messages) {
  const calls = new Map();
  for (const m of messages) {
    for (const call of m.role === "assistant" ? callsOf(m) : []) {
      calls.set(`${m.turn_id}:${call.id}`, call);
    }
  }
  const receipts = new Map();
  for (const m of messages) {
    if (m.role !== "tool") continue;
    let result = parsedOf(m);
    if (!result || typeof result !== "object") continue;
    result = rootModeTarget(calls.get(`${m.turn_id}:${m.tool_call_id}`), result);
    if (result.input_id && result.session_id) receipts.set(String(result.input_id), result);
    for (const r of Array.isArray(result.results) ? result.results : []) {
      if (r?.input_id && r?.session_id && !receipts.has(String(r.input_id))) receipts.set(String(r.input_id), r);
    }
  }
  return receipts;
}

/**
 * A resolver of session targets for one conversation:
 *   members: the tree summary's members; treeId: the tree shown.
 * A target is {label, sessionId?, treeId?, path?}; without sessionId it is not a link.
 */
export function makeResolver({ members = [], treeId = null, receipts = new Map() }) {
  const byId = new Map(members.map((m) => [m.session_id, m]));
  const byPath = new Map(members.map((m) => [m.path, m]));
  // The root by its depth: a child may be named "root" (/root/root), and must not read as the root.
  const fromMember = (m) => ({ label: m.depth === 0 ? "/root" : m.name, sessionId: m.session_id, treeId,
    path: m.path, title: m.title });
  const lastSegment = (path) => (path ? String(path).split("/").pop() : "");

  const bySession = (sessionId, hint = {}) => {
    const member = byId.get(String(sessionId));
    if (member) return fromMember(member);
    const label = hint.name || lastSegment(hint.path) || String(sessionId).slice(0, 8);
    return { label, sessionId: String(sessionId), treeId: hint.tree_id ? String(hint.tree_id) : null,
      path: hint.path ?? null };
  };

  return {
    bySession,
    /** A tool argument target: a session_id, or a path in this tree. */
    byTarget(target) {
      if (!target) return { label: "?" };
      const text = String(target);
      const member = byPath.get(text) ?? byId.get(text);
      if (member) return fromMember(member);
      if (/^[0-9a-f-]{36}$/i.test(text)) return bySession(text);
      return { label: lastSegment(text) || text, path: text };
    },
    byInput(inputId) {
      const receipt = receipts.get(String(inputId));
      return receipt ? bySession(receipt.session_id, receipt) : { label: `task ${String(inputId).slice(0, 8)}` };
    },
  };
}

function uniqueTargets(targets) {
  const seen = new Set();
  return targets.filter((t) => {
    const key = t.sessionId ?? `label:${t.label}`;
    if (seen.has(key)) return false;
    seen.add(key);
    return true;
  });
}

const allDone = (calls) => calls.every((c) => c.state === "done");
const anyPending = (calls) => calls.some((c) => c.state === "pending");

/**
 * What a row says: {text, targets, detail, state}. ``text`` precedes the targets
 * ("created 3 sessions:" a, b, c); ``detail`` is an optional suffix ("(timed out)").
 */
export function describeRow(row, resolve) {
  const { calls } = row;
  const n = calls.length;
  const pending = anyPending(calls);
  const state = calls.some((c) => c.state === "failed") ? "failed" : pending ? "pending"
    : allDone(calls) ? "done" : "interrupted";
  const first = calls[0];
  const base = { targets: [], detail: "", state };

  if (state === "failed" && n === 1) {
    return { ...base, ...describeFailure(first, resolve) };
  }

  switch (row.name) {
    case "create_session": {
      const roots = calls.some((c) => (c.args.mode ?? "child") === "root");
      const what = roots ? plural(n, "root session") : plural(n, "session");
      const targets = calls.map((c) => (c.result?.session_id
        ? resolve.bySession(c.result.session_id, rootModeTarget(c, c.result)) : { label: c.args.name ?? "?" }));
      return { ...base, text: `${pending ? "creating" : "created"} ${what}:`, targets };
    }
    case "submit_input": {
      const targets = uniqueTargets(calls.map((c) => (c.result?.session_id ? resolve.bySession(c.result.session_id)
        : resolve.byTarget(c.args.target))));
      const queued = calls.filter((c) => c.result?.status === "queued").length;
      return { ...base, text: `${pending ? "giving work to" : "gave work to"}`, targets,
        detail: queued ? `(${queued} queued)` : "" };
    }
    case "send_message": {
      const targets = uniqueTargets(calls.map((c) => (c.result?.session_id ? resolve.bySession(c.result.session_id)
        : resolve.byTarget(c.args.target))));
      return { ...base, text: n === 1 ? "sent a message to" : `sent ${n} messages to`, targets };
    }
    case "cancel_turn": {
      const targets = uniqueTargets(calls.map((c) => resolve.byTarget(c.result?.session_id ?? c.args.target)));
      return { ...base, text: n === 1 ? "cancelled a turn of" : `cancelled ${n} turns of`, targets };
    }
    case "wait_inputs": {
      const ids = [...new Set(calls.flatMap((c) => (Array.isArray(c.args.input_ids) ? c.args.input_ids : [])))];
      const targets = uniqueTargets(ids.map((inputId) => resolve.byInput(inputId)));
      const timedOut = calls.some((c) => c.result?.timed_out);
      const tasks = plural(ids.length, "task");
      const text = state === "pending" ? `waiting for ${tasks}:` : state === "interrupted"
        ? `stopped waiting for ${tasks}:` : `waited for ${tasks}:`;
      return { ...base, text, targets, detail: timedOut ? "(timed out)" : "" };
    }
    case "wait_sessions": {
      const targets = uniqueTargets(calls.flatMap((c) => (Array.isArray(c.args.targets) ? c.args.targets : [])
        .map((t) => resolve.byTarget(t))));
      const updates = calls.reduce((sum, c) => sum + (Array.isArray(c.result?.updates) ? c.result.updates.length : 0),
        0);
      const timedOut = calls.some((c) => c.result?.timed_out);
      const text = state === "pending" ? "waiting for updates from" : state === "interrupted"
        ? "stopped waiting for updates from" : timedOut && !updates ? "no update from"
          : `got ${plural(updates, "update")} from`;
      return { ...base, text, targets, detail: timedOut ? "(timed out)" : "" };
    }
    case "get_result": {
      const targets = uniqueTargets(calls.map((c) => (c.result?.session_id ? resolve.bySession(c.result.session_id)
        : c.args.input_id ? resolve.byInput(c.args.input_id) : { label: "a turn" })));
      return { ...base, text: n === 1 ? "read the result of" : `read ${n} results of`, targets };
    }
    case "list_sessions": {
      // A receipt without a scope label is shown as a history query (legacy receipts).
      const project = calls.every((c) => (c.args.scope ?? c.result?.scope ?? "project") === "project"
        && c.result?.scope !== "all");
      const count = calls.reduce((sum, c) => sum + (Array.isArray(c.result?.sessions) ? c.result.sessions.length : 0),
        0);
      return { ...base, text: project ? "viewed this project's sessions" : "viewed the session history",
        detail: state === "done" ? `(${count})` : "" };
    }
    case "list_agents": {
      const count = calls.reduce((sum, c) => sum + (Array.isArray(c.result?.agents) ? c.result.agents.length : 0), 0);
      return { ...base, text: "listed agents", detail: state === "done" ? `(${count})` : "" };
    }
    case "ask_user": {
      const answer = first.result?.answer;
      return { ...base, text: `asked: ${first.args.question ?? ""}`,
        detail: answer !== undefined ? `— answered: ${answer}` : state === "pending" ? "— waiting for an answer" : "" };
    }
    case "run_command": {
      const exit = first.result?.exit_code;
      const denied = first.result?.error;
      return { ...base, text: state === "pending" ? "running" : "ran", code: String(first.args.command ?? ""),
        detail: denied ? "" : exit !== undefined ? `(exit ${exit})` : "" };
    }
    case "read_file":
      return { ...base, text: "read", code: String(first.args.path ?? "") };
    case "write_file":
      return { ...base, text: "wrote", code: String(first.args.path ?? "") };
    default:
      return { ...base, text: n === 1 ? `called ${row.name}` : `called ${row.name} ${n} times` };
  }
}

function describeFailure(call, resolve) {
  const what = {
    create_session: `could not create ${call.args.name ?? "a session"}`,
    submit_input: "could not give work to",
    send_message: "could not send a message to",
    cancel_turn: "could not cancel a turn of",
    wait_inputs: "could not wait for tasks",
    wait_sessions: "could not wait for updates",
    get_result: "could not read a result",
    list_sessions: "could not list sessions",
    list_agents: "could not list agents",
    run_command: "could not run",
    read_file: "could not read",
    write_file: "could not write",
  }[call.name] ?? `${call.name} failed`;
  const targeted = ["submit_input", "send_message", "cancel_turn"].includes(call.name) && call.args.target;
  return {
    text: what,
    targets: targeted ? [resolve.byTarget(call.args.target)] : [],
    code: ["run_command", "read_file", "write_file"].includes(call.name)
      ? String(call.args.command ?? call.args.path ?? "") : undefined,
  };
}

const STEER = /^<canopy:steer>\n?([\s\S]*?)\n?<\/canopy:steer>$/;
const MESSAGE = /^<canopy:message [^>\n]*>\n?([\s\S]*?)\n?<\/canopy:message>$/;

/** Text Canopy escaped so that it cannot pass for its wrappers (persistence/messages.py), as written. */
function unescapeWrappers(text) {
  return text.replaceAll("&lt;/canopy:", "</canopy:").replaceAll("&lt;canopy:", "<canopy:");
}

/**
 * Who a user message comes from and its text. The source is the message's origin, recorded by
 * the server; a text that looks like one of Canopy's wrappers proves nothing and is shown as is.
 */
export function describeUserMessage(message, treeId) {
  const origin = message.origin ?? {};
  const text = message.content ?? "";
  const kind = origin.kind ?? "human";
  if (kind === "steer") {
    return { text: unescapeWrappers(text.match(STEER)?.[1] ?? text), source: { kind: "steer", label: "steer" } };
  }
  if (kind === "message") {
    const from = origin.path ?? "";
    return { text: unescapeWrappers(text.match(MESSAGE)?.[1] ?? text), source: { kind: "message",
      label: `message from ${from || "a session"}`, sessionId: origin.session_id || null,
      treeId: origin.tree_id ?? null, path: from } };
  }
  if (kind === "compaction") {
    // A summary is made at a model boundary of a Turn, so it follows that Turn's input (and, made
    // mid-Turn, its calls), which it does not summarise: it stands for everything before the input.
    // ``covered`` counts the model's history, an earlier summary as one.
    const summary = text.match(/^<canopy:summary>\n?([\s\S]*?)\n?<\/canopy:summary>$/)?.[1] ?? text;
    return { text: unescapeWrappers(summary), source: { kind: "compaction",
      label: "compacted here: everything before this turn's input is summarised for the model "
        + `(${plural(origin.covered ?? 0, "message")} of its history)` } };
  }
  if (kind === "session") {
    const otherTree = origin.tree_id && treeId && String(origin.tree_id) !== String(treeId);
    const where = origin.path ?? "a session";
    return { text, source: { kind: "session", label: otherTree ? `from ${where} of another conversation`
      : `from ${where}`, sessionId: origin.session_id ?? null, treeId: origin.tree_id ?? null, path: origin.path } };
  }
  if (kind === "human") return { text, source: { kind: "human", label: "You" } };
  if (kind === "schedule") return { text, source: { kind, label: "scheduled" } };
  if (kind === "api") return { text, source: { kind, label: "via the API" } };
  return { text, source: { kind, label: String(kind) } };
}

/**
 * A human's interventions (GET /sessions/{id}/interventions, oldest first) as display items
 * {kind: "intervention", key, intervention, self}, placed among ``items`` by time. ``self``: the
 * intervention was on this session (else on one of its children).
 */
export function withInterventions(items, interventions, sessionId) {
  if (!interventions?.length) return items;
  const timeOf = (item) => Date.parse(item.message?.created_at ?? item.at ?? "") || 0;
  const pending = interventions.map((intervention) => ({ kind: "intervention", key: `i${intervention.cursor}`,
    intervention, self: intervention.member_session_id === sessionId, at: intervention.created_at }));
  const out = [];
  for (const item of items) {
    while (pending.length && timeOf(pending[0]) < timeOf(item)) out.push(pending.shift());
    out.push(item);
  }
  return out.concat(pending);
}

/**
 * An intervention in words: the member (a link, or "this session") goes between ``lead`` and
 * ``tail`` ("You gave" /root/a " an input"); ``quote``: what the human said, if anything.
 */
export function describeIntervention(intervention) {
  const payload = intervention.payload ?? {};
  const quote = payload.text ? `${payload.text}${payload.truncated ? "…" : ""}` : "";
  switch (intervention.action) {
    case "steer":
      return { lead: "You steered", tail: "", quote };
    case "input":
      return { lead: "You gave", tail: " an input", quote };
    case "answer":
      if (payload.kind === "approval") {
        return { lead: `You ${payload.text === "approve" ? "approved" : "denied"} a command of`, tail: "", quote: "" };
      }
      return { lead: "You answered", tail: "'s question", quote };
    case "cancel":
      return { lead: "You cancelled a turn of", tail: "", quote: "" };
    default:
      return { lead: "You acted on", tail: ` (${intervention.action})`, quote };
  }
}
