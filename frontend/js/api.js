// The HTTP client: every call goes to /api/v1 with the user's API key as a bearer token.

const AGENTS_PAGE = 100; // GET /agents's largest page

export class ApiError extends Error {
  constructor(status, detail) {
    super(detail || `HTTP ${status}`);
    this.name = "ApiError";
    this.status = status;
    this.detail = detail;
  }
}

/** FastAPI errors are {"detail": "..."} or, for validation errors, {"detail": [{loc, msg}, ...]}. */
export function formatDetail(detail) {
  if (detail == null) return "";
  if (typeof detail === "string") return detail;
  if (Array.isArray(detail)) {
    return detail
      .map((item) => {
        if (typeof item === "string") return item;
        const where = Array.isArray(item.loc) ? item.loc.filter((p) => p !== "body").join(".") : "";
        return where ? `${where}: ${item.msg}` : item.msg ?? JSON.stringify(item);
      })
      .join("; ");
  }
  return JSON.stringify(detail);
}

/** Lists may come bare or wrapped ({"sessions": [...]}, {"items": [...]}): accept both. */
export function listOf(body, key) {
  if (Array.isArray(body)) return body;
  if (body && Array.isArray(body[key])) return body[key];
  if (body && Array.isArray(body.items)) return body.items;
  if (body && Array.isArray(body.data)) return body.data;
  return [];
}

const q = (params) => {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== "") search.set(key, String(value));
  }
  const text = search.toString();
  return text ? `?${text}` : "";
};

const id = (value) => encodeURIComponent(value);

export class Api {
  /**
   * @param {{base?: string, getKey: () => string | null, onUnauthorized?: () => void}} options
   */
  constructor({ base = "/api/v1", getKey, onUnauthorized }) {
    this.base = base.replace(/\/$/, "");
    this.getKey = getKey;
    this.onUnauthorized = onUnauthorized;
  }

  authHeaders() {
    const key = this.getKey();
    return key ? { Authorization: `Bearer ${key}` } : {};
  }

  url(path) {
    return this.base + path;
  }

  /**
   * One call. ``idempotencyKey``: sent as Idempotency-Key, so that retrying the same write
   * (after a network error or a 5xx) can never do it twice.
   */
  async request(method, path, body, { signal, keyOverride, idempotencyKey, withHeaders } = {}) {
    const headers = keyOverride ? { Authorization: `Bearer ${keyOverride}` } : this.authHeaders();
    if (body !== undefined) headers["Content-Type"] = "application/json";
    if (idempotencyKey) headers["Idempotency-Key"] = idempotencyKey;
    let response;
    try {
      response = await fetch(this.url(path), {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        signal,
        cache: "no-store",
      });
    } catch (error) {
      if (error.name === "AbortError") throw error;
      throw new ApiError(0, "the server could not be reached");
    }
    if (response.status === 401 && !keyOverride) this.onUnauthorized?.();
    const type = response.headers.get("content-type") ?? "";
    const payload = response.status === 204 ? null : type.includes("json") ? await response.json().catch(() => null)
      : await response.text();
    if (!response.ok) {
      const detail = payload && typeof payload === "object" ? formatDetail(payload.detail) : "";
      throw new ApiError(response.status, detail || `${response.status} ${response.statusText}`.trim());
    }
    return withHeaders ? { payload, headers: response.headers } : payload;
  }

  get = (path, options) => this.request("GET", path, undefined, options);
  post = (path, body = {}, options) => this.request("POST", path, body, options);
  patch = (path, body, options) => this.request("PATCH", path, body, options);

  // -- directory ---------------------------------------------------------------------------------
  /** The scope (user, app) of ``key``, or of the saved key; rejects for a key not accepted. */
  me = (key) => this.request("GET", "/me", undefined, key ? { keyOverride: key } : {});
  checkKey = (key) => this.me(key);
  projects = async () => listOf(await this.get("/projects"), "projects");
  // Every agent the user may run, a page at a time (the API pages its list), each page after the
  // last agent read: agents made or deleted meanwhile shift no page.
  agents = async () => {
    const all = [];
    for (;;) {
      const last = all.at(-1);
      const after = last ? { after: last.id, after_owner: last.owner_user_id } : {};
      const page = listOf(await this.get(`/agents${q({ ...after, limit: AGENTS_PAGE })}`), "agents");
      all.push(...page);
      if (page.length < AGENTS_PAGE) return all;
    }
  };

  // -- sessions ----------------------------------------------------------------------------------
  // A page of roots, newest first, after the root ``before`` (the last of the previous page).
  roots = async ({ projectId, before, limit = 50 } = {}) =>
    listOf(await this.get(`/sessions${q({ scope: projectId ? "project" : "all", project_id: projectId, before, limit })}`),
      "sessions");
  createRoot = (body, options) => this.post("/sessions", body, options);
  session = (sessionId, options) => this.get(`/sessions/${id(sessionId)}`, options);
  rename = (sessionId, title) => this.patch(`/sessions/${id(sessionId)}`, { title });
  /**
   * One page of the messages with an id above ``after`` (the history is append-only, so readers fetch
   * only what is new), and whether another follows: a page ends at ``limit`` messages or 4 MiB of text.
   */
  messages = async (sessionId, { after = 0, limit = 1000 } = {}) => {
    const path = `/sessions/${id(sessionId)}/messages${q({ after: after || undefined, limit })}`;
    const { payload, headers } = await this.request("GET", path, undefined, { withHeaders: true });
    return { messages: listOf(payload, "messages"), more: /rel="next"/.test(headers.get("Link") ?? "") };
  };
  submitInput = (sessionId, text, options) => this.post(`/sessions/${id(sessionId)}/inputs`, { text }, options);
  /** A session's inputs in queue order; ``status: "pending"`` for the ones still waiting to run. */
  inputs = async (sessionId, { status } = {}, options) =>
    listOf(await this.get(`/sessions/${id(sessionId)}/inputs${q({ status })}`, options), "inputs");
  cancelInput = (inputId) => this.post(`/inputs/${id(inputId)}/cancel`);
  /** A human's interventions on this session (as a member) and on its children, after a cursor. */
  interventions = async (sessionId, { after = 0 } = {}, options) =>
    listOf(await this.get(`/sessions/${id(sessionId)}/interventions${q({ after: after || undefined })}`, options),
      "interventions");
  steer = (sessionId, text, options) => this.post(`/sessions/${id(sessionId)}/steer`, { text }, options);
  /** The session's pending requests, whole (a session has at most one): what a card shows and a human approves. */
  sessionRequests = async (sessionId, options) =>
    listOf(await this.get(`/sessions/${id(sessionId)}/requests`, options), "requests");
  cancelTurn = (sessionId, turnId) => this.post(`/sessions/${id(sessionId)}/turns/${id(turnId)}/cancel`);
  archive = (sessionId) => this.post(`/sessions/${id(sessionId)}/archive`);
  /** A session's schedules: each due time submits its text once. */
  schedules = async (sessionId, options) => listOf(await this.get(`/sessions/${id(sessionId)}/schedules`, options),
    "schedules");
  createSchedule = (sessionId, body, options) => this.post(`/sessions/${id(sessionId)}/schedules`, body, options);
  deleteSchedule = (sessionId, scheduleId) =>
    this.request("DELETE", `/sessions/${id(sessionId)}/schedules/${id(scheduleId)}`);
  /** Compact the session's history at its next model call. */
  compact = (sessionId) => this.post(`/sessions/${id(sessionId)}/compact`);
  turnResult = (turnId, options) => this.get(`/turns/${id(turnId)}/result`, options);

  // -- trees -------------------------------------------------------------------------------------
  tree = (treeId, options) => this.get(`/trees/${id(treeId)}`, options);
  /**
   * The tree's inbox: its pending requests (the oldest 1,000), each a summary whose long payload
   * fields are cut to 500 characters (``truncated``; ``<field>_chars``: the whole length), and whether
   * more follow. Never approve from a summary: a session's own requests are whole.
   */
  treeRequests = async (treeId, options) => {
    const path = `/trees/${id(treeId)}/requests`;
    const { payload, headers } = await this.request("GET", path, undefined, { ...options, withHeaders: true });
    return { requests: listOf(payload, "requests"), more: /rel="next"/.test(headers.get("Link") ?? "") };
  };
  stopTree = (treeId) => this.post(`/trees/${id(treeId)}/stop`);
  continueTree = (treeId) => this.post(`/trees/${id(treeId)}/continue`);
  /** Change some limits of the tree's budget: {max_tokens, max_cost_usd, max_seconds, max_model_calls}; null removes one. */
  updateBudget = (treeId, changes) => this.patch(`/trees/${id(treeId)}/budget`, changes);
  /** One page of the tree's timeline; ``since``: a previous read's as_of, or a page's next_cursor. */
  timeline = (treeId, { since, limit } = {}, options) => this.get(`/trees/${id(treeId)}/timeline${q({ since, limit })}`,
    options);
  /** The whole timeline as Chrome trace-event JSON (for Perfetto). */
  trace = (treeId, options) => this.get(`/trees/${id(treeId)}/trace`, options);
  answerRequest = (requestId, body, options) => this.post(`/requests/${id(requestId)}/answer`, body, options);
  /**
   * The tree's event stream after ``after`` (a cursor, e.g. a summary's event_cursor, or "latest"):
   * durable events, and live model text deltas (``event: delta``).
   */
  treeEventsUrl = (treeId, after) => this.url(`/trees/${id(treeId)}/events${q({ after })}`);
}
