// Shared run state. One TreeRuntime per tree holds the tree summary, the tree's pending
// human requests (summaries: the inbox) and the tree's single SSE stream; one SessionRuntime per
// session holds its detail, messages, queued inputs, its own pending requests (whole: its cards),
// ended-Turn results and the live text of its model calls. Every view that shows a tree or
// a session observes the same runtime, so two views never mean two streams or two copies of
// state. Events only say "something changed": the runtimes re-read the durable state (debounced);
// the tree's requests only after an event that may change them (REQUEST_EVENTS). Text deltas are
// the one thing shown as they come: they are not durable, and the committed message replaces them.
// A runtime is kept while something observes it: the store forgets a tree, and a tree a session, that
// nothing observes any more (a parked view keeps its own and hands it back when it observes again).
// A message is read once, as it is added (messages never change): renders parse nothing.

import { readMessage } from "./cooperation.js";
import { Emitter, debounce } from "./dom.js";
import { EventStream } from "./sse.js";

export const TERMINAL_TURN = new Set(["completed", "failed", "cancelled"]);
export const OPEN_TURN = new Set(["running", "waiting", "cancelling"]);

const REFRESH_WAIT_MS = 150;
const REFRESH_MAX_WAIT_MS = 600;
const POLL_OFFLINE_MS = 4_000; // while the stream is down, poll
const POLL_ONLINE_MS = 30_000; // a slow safety net while it is up
const MESSAGE_PAGE = 1000;
// The events after which the tree's pending requests may differ (persistence/events.py's kinds): a
// request asked, answered, or cancelled with its Turn (a cancel, or a stop of the tree); a Turn's
// end; the tree continued or archived. Any other event (a model message, a delta) leaves them.
export const REQUEST_EVENTS = new Set(["waiting_approval", "waiting_answer", "request_answered", "turn_completed",
  "turn_failed", "turn_cancelled", "tree_stopped", "tree_continued", "tree_archived"]);
// A session whose Turn waits for a human has a pending request (at most one).
const WAITING_FOR_HUMAN = new Set(["waiting_approval", "waiting_answer"]);

function once(fn) {
  let done = false;
  return () => {
    if (done) return;
    done = true;
    fn();
  };
}

export class SessionRuntime extends Emitter {
  #observers = 0;
  #seq = 0;
  #onObserved;

  /** ``onObserved(observed)``: called as the first observer comes and as the last one goes. */
  constructor(tree, sessionId, { onObserved = () => {} } = {}) {
    super();
    this.#onObserved = onObserved;
    this.tree = tree;
    this.api = tree.api;
    this.sessionId = sessionId;
    this.detail = null;
    this.messages = [];
    /** A human's interventions on this session and on its children, oldest first (append-only). */
    this.interventions = [];
    /** turn_id → Result, for Turns that have ended (they never change again). */
    this.results = new Map();
    /** The inputs waiting in this session's queue (read while detail.pending_inputs > 0). */
    this.pending = [];
    /** This session's pending requests, whole (read while it waits for a human): its cards. */
    this.requests = [];
    /**
     * The streaming texts of model calls, each shown until its message is: {turnId, step (the call's
     * place in its Turn), runId, text, since (the read it began after)}, a Turn's in step order.
     */
    this.live = [];
    this.error = null;
    this.loaded = false;
    this.scheduleRefresh = debounce(() => this.refresh(), REFRESH_WAIT_MS, REFRESH_MAX_WAIT_MS);
  }

  get observed() {
    return this.#observers > 0;
  }

  observe() {
    this.#observers += 1;
    if (this.#observers === 1) {
      this.#onObserved(true);
      this.refresh();
    }
    return once(() => {
      this.#observers -= 1;
      if (this.#observers === 0) this.#onObserved(false);
    });
  }

  async refresh() {
    const seq = ++this.#seq;
    try {
      const known = this.messages;
      const knownInterventions = this.interventions;
      const lastCursor = knownInterventions.at(-1)?.cursor ?? 0;
      const [detail, fresh, interventions] = await Promise.all([
        this.api.session(this.sessionId),
        this.#messagesAfter(known.at(-1)?.id ?? 0),
        this.api.interventions(this.sessionId, { after: lastCursor }),
      ]);
      if (seq !== this.#seq) return; // a newer read owns the state
      this.detail = detail;
      const last = known.at(-1)?.id ?? 0;
      this.messages = fresh.length ? known.concat(fresh.filter((m) => m.id > last).map(readMessage)) : known;
      this.interventions = interventions.length
        ? knownInterventions.concat(interventions.filter((i) => i.cursor > lastCursor)) : knownInterventions;
      this.#settleLive(seq); // now: a view may draw the new messages before this read ends
      const [pending, requests] = await Promise.all([
        detail.pending_inputs > 0 ? this.api.inputs(this.sessionId, { status: "pending" }) : [],
        WAITING_FOR_HUMAN.has(detail.activity) ? this.api.sessionRequests(this.sessionId) : [],
        this.#loadEndedResults(this.messages, detail),
      ]);
      if (seq !== this.#seq) return;
      this.pending = pending;
      this.requests = requests.filter((r) => (r.status ?? "pending") === "pending");
      this.error = null;
      this.loaded = true;
    } catch (error) {
      if (seq !== this.#seq) return;
      this.error = error;
    }
    this.emit("change", this);
  }

  /**
   * A text delta of one of this session's model calls (from the tree's stream). Its call is named by
   * its Turn and step, not by the order of the stream: the next call's text may come before the
   * event of the last call's message, and the read of that message later still.
   */
  addDelta(delta) {
    if (!this.observed || typeof delta.delta !== "string" || !Number.isInteger(delta.step)) return;
    let live = this.live.find((l) => l.turnId === delta.turn_id && l.step === delta.step);
    if (!live) {
      if (this.#saved(delta.turn_id, delta.step)) return; // a late delta of a message already shown
      live = { turnId: delta.turn_id, step: delta.step, runId: delta.run_id, text: "", since: this.#seq };
      const after = this.live.findIndex((l) => l.turnId === live.turnId && l.step > live.step);
      this.live.splice(after < 0 ? this.live.length : after, 0, live);
    } else if (live.runId !== delta.run_id) {
      // The Run that made this call was lost midway: the next one makes the call again, whole.
      Object.assign(live, { runId: delta.run_id, text: "" });
    }
    live.text += delta.delta;
    this.emit("live", this);
  }

  /** Whether the history read holds the message of a Turn's model call ``step`` (its step+1-th reply). */
  #saved(turnId, step) {
    let replies = 0;
    for (const m of this.messages) if (m.turn_id === turnId && m.role === "assistant") replies += 1;
    return replies > step;
  }

  /** Drop each live text once its message is in the history, or when its Turn ended without one. */
  #settleLive(seq) {
    // Only a read that began after the text did can tell that its Turn is over.
    const ended = (live) => seq > live.since && this.detail?.current_turn_id !== live.turnId;
    this.live = this.live.filter((live) => !this.#saved(live.turnId, live.step) && !ended(live));
  }

  /** Every message after ``after`` (the history is append-only), page by page. */
  async #messagesAfter(after) {
    const all = [];
    for (;;) {
      const { messages, more } = await this.api.messages(this.sessionId, { after, limit: MESSAGE_PAGE });
      all.push(...messages);
      // A full page goes on too: a proxy may drop the Link header that says more follow.
      if (!(more || messages.length === MESSAGE_PAGE) || !messages.length) return all;
      after = messages.at(-1).id;
    }
  }

  async #loadEndedResults(messages, detail) {
    const turnIds = [...new Set(messages.map((m) => m.turn_id).filter(Boolean))];
    const wanted = turnIds.filter((t) => t !== detail?.current_turn_id && !this.results.has(t)).slice(-20);
    await Promise.all(wanted.map(async (turnId) => {
      try {
        const result = await this.api.turnResult(turnId);
        if (result?.terminal) this.results.set(turnId, result);
      } catch {
        /* a missing result only hides a turn footer */
      }
    }));
  }
}

export class TreeRuntime extends Emitter {
  #observers = 0;
  #seq = 0;
  #stream = null;
  #poll = null;
  #sessions = new Map();
  #answered = new Set();
  #opened = false; // has this stream been open since it started?
  #runs = 0; // counts starts and stops, so a start that finishes late knows it was superseded
  #reading = Promise.resolve();
  #requestSeq = 0;
  #requestsDue = true; // the next read re-reads the requests too
  #summaryError = null;
  #requestsError = null;
  #onObserved;

  /** ``onObserved(observed)``: called as the first observer comes and as the last one goes. */
  constructor(api, treeId, { onObserved = () => {} } = {}) {
    super();
    this.#onObserved = onObserved;
    this.api = api;
    this.treeId = treeId;
    this.summary = null;
    /** The inbox: summaries of the tree's pending requests (long fields cut), oldest first. */
    this.requests = [];
    this.requestsMore = false; // more than the first page (1,000) are pending
    this.connection = "closed";
    this.cursor = "";
    // Events re-read the summary, and the requests only when one may have changed them.
    this.scheduleRefresh = debounce(() => this.refresh({ requests: false }), REFRESH_WAIT_MS, REFRESH_MAX_WAIT_MS);
  }

  /** The last read's failure, of the summary or of the requests (their last known state stays). */
  get error() {
    return this.#summaryError ?? this.#requestsError;
  }

  get observed() {
    return this.#observers > 0;
  }

  /** Watch the tree: the first observer opens the stream, the last one closes it. */
  observe() {
    this.#observers += 1;
    if (this.#observers === 1) {
      this.#onObserved(true);
      this.#start();
    }
    return once(() => {
      this.#observers -= 1;
      if (this.#observers === 0) {
        this.#stop();
        this.#onObserved(false);
      }
    });
  }

  /** A session's runtime: the one observed, else a new one (held once observed, see keep()). */
  session(sessionId) {
    const runtime = this.#sessions.get(sessionId) ?? new SessionRuntime(this, sessionId, {
      onObserved: (observed) => keep(this.#sessions, sessionId, runtime, observed) });
    return runtime;
  }

  member(sessionId) {
    return this.summary?.members?.find((m) => m.session_id === sessionId) ?? null;
  }

  /** Whether this page answered the request (it is shown nowhere from then on). */
  answered(requestId) {
    return this.#answered.has(requestId);
  }

  /** A request answered here disappears at once; the next read confirms it. */
  markAnswered(requestId) {
    this.#answered.add(requestId);
    this.requests = this.requests.filter((r) => r.id !== requestId);
    this.emit("change", this);
    this.#requestsDue = true;
    this.scheduleRefresh();
  }

  /**
   * Re-read the summary, and the requests unless ``requests`` is false and nothing since their last
   * read may have changed them (the newest read of each wins).
   */
  refresh({ requests = true } = {}) {
    this.#reading = this.#read(++this.#seq, requests || this.#requestsDue);
    return this.#reading;
  }

  /** Resolves once the newest read has landed (a read started meanwhile is waited for too). */
  async #settled() {
    let reading;
    do {
      reading = this.#reading;
      await reading;
    } while (reading !== this.#reading);
  }

  async #read(seq, withRequests) {
    const requestSeq = withRequests ? ++this.#requestSeq : -1;
    if (withRequests) this.#requestsDue = false;
    const [summary, page] = await Promise.allSettled([
      this.api.tree(this.treeId),
      withRequests ? this.api.treeRequests(this.treeId) : null,
    ]);
    // The last known summary and requests stay on screen when a read fails.
    let changed = false;
    if (seq === this.#seq) {
      if (summary.status === "fulfilled") this.summary = summary.value;
      this.#summaryError = summary.status === "rejected" ? summary.reason : null;
      changed = true;
    }
    if (withRequests && page.status === "rejected") this.#requestsDue = true; // read them again next time
    if (requestSeq === this.#requestSeq) {
      if (page.status === "fulfilled") {
        this.requests = page.value.requests.filter((r) => (r.status ?? "pending") === "pending"
          && !this.#answered.has(r.id));
        this.requestsMore = page.value.more;
      }
      this.#requestsError = page.status === "rejected" ? page.reason : null;
      changed = true;
    }
    if (changed) this.emit("change", this);
  }

  /** Drop the stream and resume it from the last cursor (what a network drop does). */
  reconnect() {
    this.#stream?.reconnect();
  }

  refreshSessions() {
    for (const runtime of this.#sessions.values()) if (runtime.observed) runtime.scheduleRefresh();
  }

  /** Read the summary, then stream what commits after it (its event_cursor): no history replay. */
  async #start() {
    const run = ++this.#runs;
    this.#opened = false;
    this.#schedulePoll();
    this.refresh();
    await this.#settled();
    if (run !== this.#runs || !this.observed) return; // stopped (or restarted) meanwhile
    this.cursor = "";
    this.#stream = new EventStream({
      url: this.api.treeEventsUrl(this.treeId, this.summary?.event_cursor ?? "latest"),
      headers: () => this.api.authHeaders(),
      onEvent: (event) => this.#onEvent(event),
      onStatus: (status) => this.#onStatus(status),
    });
    this.#stream.start();
  }

  #stop() {
    this.#runs += 1;
    this.#stream?.stop();
    this.#stream = null;
    clearTimeout(this.#poll);
    this.#poll = null;
    this.connection = "closed";
  }

  #schedulePoll() {
    clearTimeout(this.#poll);
    // An ended stream is an archived tree, all of it read: nothing in it changes any more.
    if (!this.observed || this.connection === "ended") return;
    const every = this.connection === "open" ? POLL_ONLINE_MS : POLL_OFFLINE_MS;
    this.#poll = setTimeout(() => {
      // While the stream is up, its events say when the requests change; while it is down, read them.
      this.refresh({ requests: this.connection !== "open" });
      this.refreshSessions();
      this.#schedulePoll();
    }, every);
  }

  #onStatus(status) {
    const wasOpen = this.connection === "open";
    this.connection = status;
    if (status === "unauthorized") this.api.onUnauthorized?.();
    if (status === "open" && !wasOpen) {
      // Whatever happened while we were not listening is in the durable state: re-read it. On
      // the first open the summary is exact up to the stream's start; the sessions' first reads
      // may have come before it, so they read once more.
      if (this.#opened) {
        this.#requestsDue = true;
        this.scheduleRefresh();
      }
      this.refreshSessions();
      this.#opened = true;
    }
    this.#schedulePoll();
    this.emit("connection", status);
  }

  #onEvent(raw) {
    let event;
    try {
      event = JSON.parse(raw.data);
    } catch {
      return; // not one of ours (e.g. a keep-alive with data)
    }
    if (raw.type === "delta") {
      this.#sessions.get(event.session_id)?.addDelta(event);
      return; // live text only: no cursor, nothing to re-read
    }
    this.cursor = raw.id || String(event.cursor ?? this.cursor);
    this.emit("event", event);
    if (REQUEST_EVENTS.has(event.kind)) this.#requestsDue = true;
    this.scheduleRefresh();
    if (event.kind?.startsWith("tree_")) this.refreshSessions();
    else if (event.session_id) {
      // An intervention's event goes to the member's parent; the member's own view shows it too.
      const concerned = [event.session_id, event.kind === "user_intervention" ? event.payload?.member_session_id : null];
      for (const sessionId of concerned) {
        const runtime = sessionId ? this.#sessions.get(sessionId) : null;
        if (runtime?.observed) runtime.scheduleRefresh();
      }
    }
  }
}

/**
 * Hold ``runtime`` under ``key`` while it is observed, so that every view of it shares it; forget it
 * when nothing observes it any more (it is freed with the last view that holds it), and hold it again
 * when a view holding it observes it again (unless another one is held meanwhile: each keeps working).
 */
function keep(map, key, runtime, observed) {
  if (observed && !map.has(key)) map.set(key, runtime);
  else if (!observed && map.get(key) === runtime) map.delete(key);
}

/** Tree runtimes by tree id, shared by the whole page: the observed ones (see keep()). */
export class Store {
  #trees = new Map();

  constructor(api) {
    this.api = api;
  }

  /** A tree's runtime: the one observed, else a new one (held once observed, see keep()). */
  tree(treeId) {
    const runtime = this.#trees.get(treeId) ?? new TreeRuntime(this.api, treeId, {
      onObserved: (observed) => keep(this.#trees, treeId, runtime, observed) });
    return runtime;
  }
}
