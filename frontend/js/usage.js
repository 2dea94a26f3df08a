// Pure logic (no DOM): a tree's usage and budget in words. The figures come from the tree summary
// (GET /trees/{id}: usage, spawned_usage, budget, budget_reached, stop_reason, stop_detail).

/** The budget's limits: their key, what they count, and how a value is written. */
export const LIMITS = [
  { key: "max_tokens", limit: "tokens", label: "tokens", step: "1", format: (v) => Math.round(v).toLocaleString("en") },
  { key: "max_cost_usd", limit: "cost_usd", label: "USD", step: "any", format: (v) => `$${Number(v).toFixed(4)}` },
  { key: "max_model_calls", limit: "model_calls", label: "model calls", step: "1",
    format: (v) => Math.round(v).toLocaleString("en") },
  { key: "max_seconds", limit: "seconds", label: "seconds", step: "any", format: (v) => `${Number(v).toFixed(0)} s` },
];

const BY_LIMIT = Object.fromEntries(LIMITS.map((l) => [l.limit, l]));

export const formatCount = (n) => Math.round(n ?? 0).toLocaleString("en");

/** "12,345 tokens (10,000 in · 2,345 out) · 42 model calls · $0.0012" */
export function describeUsage(usage) {
  if (!usage) return "";
  return `${formatCount(usage.tokens)} tokens (${formatCount(usage.prompt_tokens)} in · `
    + `${formatCount(usage.completion_tokens)} out) · ${formatCount(usage.model_calls)} model calls · `
    + `$${Number(usage.cost_usd ?? 0).toFixed(4)}`
    + (usage.unpriced_calls
      ? ` (+ ${formatCount(usage.unpriced_calls)} call${usage.unpriced_calls === 1 ? "" : "s"} with no price)` : "");
}

/**
 * What the tree's own budget has used, limit by limit: [{key, limit, label, max, used, uncounted,
 * reached}] for the limits that are set (uncounted: the calls with no price a cost limit cannot count). The budget covers the tree and the trees spawned from it.
 */
export function budgetMeters(summary, now = Date.now()) {
  const budget = summary?.budget ?? {};
  const own = summary?.usage ?? {};
  const spawned = summary?.spawned_usage ?? {};
  const started = own.first_run_at ? Date.parse(own.first_run_at) : null;
  const used = {
    tokens: (own.tokens ?? 0) + (spawned.tokens ?? 0),
    cost_usd: (own.cost_usd ?? 0) + (spawned.cost_usd ?? 0),
    model_calls: (own.model_calls ?? 0) + (spawned.model_calls ?? 0),
    seconds: started === null ? 0 : Math.max(0, (now - started) / 1000),
  };
  // A cost limit cannot count a call with no price: it allows none, so one such call reaches it.
  const unpriced = (own.unpriced_calls ?? 0) + (spawned.unpriced_calls ?? 0);
  return LIMITS.filter((l) => budget[l.key] != null).map((l) => {
    const uncounted = l.limit === "cost_usd" ? unpriced : 0;
    return { ...l, max: budget[l.key], used: used[l.limit], uncounted,
             reached: used[l.limit] >= budget[l.key] || uncounted > 0 };
  });
}

/** "tokens 51,234 of 50,000" */
export function describeReached(reached) {
  if (reached?.limit === "unpriced_calls") {
    const calls = formatCount(reached.used);
    return `its cost cannot be counted: ${calls} model call${calls === "1" ? "" : "s"} to a model with no price`;
  }
  const limit = BY_LIMIT[reached?.limit];
  if (!limit) return "";
  return `${limit.label} ${limit.format(reached.used)} of ${limit.format(reached.max)}`;
}

/** Why a stopped tree stopped, in a sentence (empty while it runs). */
export function stopReasonText(summary) {
  if (!summary?.stopped) return "";
  if (summary.stop_reason === "budget_exceeded") {
    const detail = summary.stop_detail ? ` (${describeReached(summary.stop_detail)})` : "";
    const own = !summary.stop_detail || summary.stop_detail.budget_tree_id === summary.tree_id;
    const unpriced = summary.stop_detail?.limit === "unpriced_calls";  // a cost limit cannot count them
    const fix = own ? (unpriced ? "Remove its cost limit" : "Raise it")
      : (unpriced ? "Remove that tree's cost limit" : "Raise that tree's budget");
    return `Stopped: ${own ? "the budget" : "the budget of the tree that spawned it"} is used up${detail}. `
      + `${fix}, then continue.`;
  }
  return "Stopped by Stop all.";
}
