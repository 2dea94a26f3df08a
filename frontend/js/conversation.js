// One session's conversation view: its messages (with compact cooperation rows and a human's
// interventions on it or on its children, in time order), the text
// of each model call as it streams (a provisional bubble until its message is read), its
// pending request cards, the live Turn status, its queued inputs (each cancellable) and the
// message box (send, steer, cancel). Root and member views are the same component; each
// instance owns its draft and its scroll position, and keeps receiving updates while hidden
// (it only does not scroll).

import { activityBadge } from "./activity.js";
import { ApiError } from "./api.js";
import { Composer } from "./composer.js";
import { buildItems, collectReceipts, makeResolver, withInterventions } from "./cooperation.js";
import { h, nearBottom, plural, relativeTime } from "./dom.js";
import { renderItems } from "./messages.js";
import { RequestCard } from "./requestCard.js";
import { SchedulesPanel } from "./schedules.js";

/** Who queued an input, in a few words. */
function queuedBy(origin = {}) {
  if (origin.kind === "session") return `from ${origin.path ?? "a session"}`;
  return { human: "from you", api: "via the API", schedule: "scheduled" }[origin.kind] ?? "queued";
}

const TURN_STATUS_TEXT = {
  running: "Working…",
  queued: "Queued: waiting for a free slot…",
  waiting_cooperation: "Waiting for cooperation tasks to finish…",
  waiting_approval: "Waiting for your approval.",
  waiting_answer: "Waiting for your answer.",
  cancelling: "Stopping…",
};

/** The live texts drawn: each model call's with text, in order, one bubble each. */
const drawnLive = (live) => live.filter((l) => l.text);
const liveKey = (live) => `${live.turnId}:${live.step}`;

function liveBubble(live) {
  const text = h("div", { class: "msg-text" });
  const el = h("article", { class: "msg streaming", "aria-busy": "true", dataset: { turnId: live.turnId,
    step: String(live.step) }, title: "Streaming: replaced by the saved message when the model call ends" }, text);
  return { el, text, live: null, runId: null, length: 0, tail: null, tailLength: 0 };
}

// A streamed text is drawn in pieces: a piece past PIECE_CHARS is closed at its next line's end
// and laid out as a block of its own, which the browser then lays out again only if the bubble's
// width changes, so a frame costs about a piece, not the whole reply. The open piece gains a text
// node a frame, merged now and then so that the nodes stay few.
const PIECE_CHARS = 4096;
const MERGE_TEXT_NODES = 256;

/** Draw what the call streamed since the last frame: only the new text is added to the page (a
 *  bubble drawn whole each frame cost its whole length a frame, a long reply's square in all). A
 *  call whose Run was lost starts its text again, drawn whole once. Exported for the measure of
 *  bench/live_text.py. */
export function drawLive(bubble, live) {
  const grown = bubble.live === live && bubble.runId === live.runId && live.text.length >= bubble.length;
  if (!grown) {
    bubble.text.replaceChildren();
    bubble.tail = null;
    bubble.el.dataset.runId = live.runId;
  }
  addText(bubble, live.text.slice(grown ? bubble.length : 0));
  Object.assign(bubble, { live, runId: live.runId, length: live.text.length });
}

function addText(bubble, text) {
  while (text) {
    if (!bubble.tail) {
      bubble.tail = h("span", { class: "live-piece" });
      bubble.text.append(bubble.tail);
      bubble.tailLength = 0;
    }
    const lineEnd = text.indexOf("\n", Math.max(0, PIECE_CHARS - bubble.tailLength));
    const taken = lineEnd < 0 ? text : text.slice(0, lineEnd + 1);
    bubble.tail.append(taken);
    bubble.tailLength += taken.length;
    if (bubble.tail.childNodes.length > MERGE_TEXT_NODES) bubble.tail.normalize();
    if (lineEnd >= 0) {
      bubble.tail.classList.add("closed"); // a block: its trailing line break adds no empty line
      bubble.tail = null;
    }
    text = text.slice(taken.length);
  }
}

export class SessionView {
  #releases = [];
  #observing = [];
  #cache = new Map();
  #cards = new Map();
  #stick = true;
  #savedScroll = null;
  #visible = true;
  #measured = false; // laid out once, so positions are real (a detached view measures zero)
  #pendingFocus = null;
  #pendingReveal = null;
  #liveFrame = 0;
  #liveBubbles = new Map(); // liveKey → a liveBubble (what drawLive drew)
  #liveOrder = ""; // the drawn bubbles' keys, in order
  #pendingShown = "";

  /**
   * @param {{api, tree, sessionId: string, isRoot: boolean, onOpen: (target) => void,
   *          loadAgents: () => Promise<object[]>, showHeader?: boolean}} options
   */
  constructor({ api, tree, sessionId, isRoot, onOpen, loadAgents, showHeader = !isRoot }) {
    this.api = api;
    this.tree = tree;
    this.sessionId = sessionId;
    this.isRoot = isRoot;
    this.onOpen = onOpen;
    this.runtime = tree.session(sessionId);

    this.title = h("h2", { class: "view-title" });
    this.path = h("span", { class: "view-path" });
    this.activity = h("span", { class: "view-activity" });
    this.header = showHeader ? h("header", { class: "view-head" },
      h("div", { class: "view-heading" }, this.title, this.path), this.activity) : null;

    this.list = h("div", { class: "messages", role: "log", "aria-live": "off", "aria-label": "Messages" });
    this.loading = h("p", { class: "view-note", text: "Loading…" });
    this.liveList = h("div", { class: "live-list", hidden: true });
    this.turnStatus = h("div", { class: "turn-status", hidden: true });
    this.pendingList = h("ul", { class: "pending-inputs", "aria-label": "Queued inputs", hidden: true });
    this.schedules = new SchedulesPanel({ api, sessionId });
    this.scroller = h("div", { class: "view-scroll" }, this.loading, this.list, this.liveList, this.turnStatus,
      this.pendingList, this.schedules.el);
    this.scroller.addEventListener("scroll", () => {
      if (this.#visible) this.#stick = nearBottom(this.scroller);
    }, { passive: true });

    this.requestList = h("div", { class: "request-list", "aria-label": "Requests for you" });
    this.inboxSlot = h("div", { class: "inbox-slot" });
    this.composer = new Composer({
      draftKey: sessionId,
      placeholder: "Message…  (@ for agents)",
      loadAgents,
      onSend: (text, key) => this.#send(text, key),
      onSteer: (text, key) => this.#steer(text, key),
    });
    this.el = h("section", { class: `session-view ${isRoot ? "root-view" : "member-view"}`,
      dataset: { sessionId }, "aria-label": isRoot ? "Conversation" : "Member session" },
    this.header, this.scroller,
    h("div", { class: "view-bottom" }, this.requestList, this.inboxSlot, this.composer.el));

    this.#releases.push(
      this.runtime.on("change", () => this.render()),
      this.runtime.on("live", () => this.#scheduleLive()),
      tree.on("change", () => this.render()),
    );
    this.resume();
    this.render();
  }

  /** Observe the tree and the session (a hidden tab keeps observing; a parked workspace does not). */
  resume() {
    if (this.#observing.length) return;
    this.#observing = [this.tree.observe(), this.runtime.observe()];
  }

  suspend() {
    for (const release of this.#observing.splice(0)) release();
  }

  /** Put the tree inbox (root view) above the message box. */
  setInbox(el) {
    this.inboxSlot.replaceChildren(el);
  }

  get visible() {
    return this.#visible;
  }

  /** Shown (again): back at the end if the reader was following it, else where they left. */
  show() {
    const wasVisible = this.#visible;
    this.#visible = true;
    this.el.hidden = false;
    if (wasVisible && this.#measured) return;
    if (this.#stick) this.scroller.scrollTop = this.scroller.scrollHeight;
    else if (this.#savedScroll !== null) this.scroller.scrollTop = this.#savedScroll;
    this.#measured = this.scroller.clientHeight > 0;
    if (this.#pendingFocus) this.focusRequest(this.#pendingFocus);
  }

  /** Hidden (another tab shown, or about to be moved): keep the scroll position for show(). */
  hide() {
    if (!this.#visible) return;
    if (this.scroller.clientHeight > 0) { // not laid out: nothing to remember
      this.#savedScroll = this.scroller.scrollTop;
      this.#stick = nearBottom(this.scroller);
    }
    this.#visible = false;
    this.el.hidden = true;
  }

  destroy() {
    cancelAnimationFrame(this.#liveFrame);
    this.schedules.destroy();
    this.suspend();
    for (const release of this.#releases.splice(0)) release();
    this.el.remove();
  }

  /** Scroll to a request card and focus it; if it is not loaded yet, as soon as it is. */
  focusRequest(requestId) {
    const card = this.#cards.get(requestId);
    if (!card || !this.#visible) {
      this.#pendingFocus = requestId;
      return;
    }
    this.#pendingFocus = null;
    card.focus();
  }

  /**
   * Scroll to the conversation at a moment (the timeline's click): the first message of that Run,
   * else the first message written at or after ``at`` (ms since the epoch), briefly highlighted.
   * Before the messages are loaded, as soon as they are.
   */
  revealAt({ at, runId = null }) {
    const messages = this.runtime.messages;
    if (!this.runtime.loaded || !this.#visible) {
      this.#pendingReveal = { at, runId };
      return;
    }
    this.#pendingReveal = null;
    let from = runId ? messages.findIndex((m) => m.run_id === runId) : -1;
    if (from < 0) from = messages.findIndex((m) => Date.parse(m.created_at) >= at);
    if (from < 0) from = messages.length - 1;
    // Not every message has an element of its own (compact rows): the nearest one that has.
    const ordered = messages.slice(from).concat(messages.slice(0, from).reverse());
    const target = ordered.map((m) => this.list.querySelector(`[data-message-id="${m.id}"]`)).find(Boolean);
    if (!target) return;
    this.#stick = false;
    target.scrollIntoView({ block: "center" });
    for (const old of this.list.querySelectorAll(".revealed")) old.classList.remove("revealed");
    target.classList.add("revealed");
    setTimeout(() => target.classList.remove("revealed"), 2_500);
  }

  render() {
    const { detail, messages, error, loaded } = this.runtime;
    const member = this.tree.member(this.sessionId);
    const reported = member?.activity ?? detail?.activity ?? "idle";
    // Text streaming from the model means its Run holds a slot, whatever the last read said
    // (a Run starting to execute is not an event, so a read may still say queued).
    const activity = reported === "queued" && this.runtime.live.length ? "running" : reported;

    if (this.header) {
      const name = member?.path ?? detail?.path ?? "";
      this.title.textContent = detail?.title || member?.title || member?.name || detail?.name || "Session";
      this.title.title = this.title.textContent;
      this.path.textContent = name;
      this.activity.replaceChildren(activity === "idle" ? "" : activityBadge(activity));
    }

    this.loading.hidden = loaded && !error && messages.length > 0;
    if (error && !loaded) this.loading.textContent = `Could not load this session: ${error.message}`;
    else if (error) this.loading.textContent = `Update failed (${error.message}); showing the last known state.`;
    else if (loaded) this.loading.textContent = "No messages yet.";

    // Follow the end only if the reader is there now (the position itself, not the last scroll
    // event, which may not have been dispatched yet).
    const measurable = this.#visible && this.scroller.clientHeight > 0;
    const follow = measurable && this.#measured ? nearBottom(this.scroller) : this.#stick;
    const openTurnId = detail?.current_turn_id ?? null;
    const items = withInterventions(buildItems(messages, { openTurnId }), this.runtime.interventions, this.sessionId);
    const resolve = makeResolver({ members: this.tree.summary?.members ?? [], treeId: this.tree.treeId,
      receipts: collectReceipts(messages) });
    renderItems(this.list, items, { resolve, treeId: this.tree.treeId, onOpen: this.onOpen,
      results: this.runtime.results }, this.#cache);

    this.#renderLive();
    this.#renderTurnStatus(activity, openTurnId, detail);
    this.#renderPending();
    this.#renderRequests();
    this.composer.setCanSteer(Boolean(openTurnId) && ["running", "queued"].includes(activity));

    if (measurable) {
      if (follow) {
        this.scroller.scrollTop = this.scroller.scrollHeight;
        this.#stick = true;
      }
      this.#measured = true;
    }
    if (this.#pendingFocus && this.#visible) this.focusRequest(this.#pendingFocus);
    if (this.#pendingReveal && this.#visible && loaded) this.revealAt(this.#pendingReveal);
  }

  /** Deltas come fast: draw the streaming text at most once a frame. */
  #scheduleLive() {
    if (this.#liveFrame) return;
    this.#liveFrame = requestAnimationFrame(() => {
      this.#liveFrame = 0;
      if (drawnLive(this.runtime.live).map(liveKey).join("|") !== this.#liveOrder) {
        // A text begins, or one went with a read whose messages are not drawn yet: draw them with it
        // (and the Turn status, see render), so a call's text is never missing between the two.
        this.render();
        return;
      }
      const follow = this.#visible && this.scroller.clientHeight > 0 && nearBottom(this.scroller);
      this.#renderLive();
      if (follow) this.scroller.scrollTop = this.scroller.scrollHeight;
    });
  }

  /** One bubble per model call with text, in order; a bubble's element is kept while its call streams. */
  #renderLive() {
    const shown = drawnLive(this.runtime.live);
    const bubbles = new Map(shown.map((live) => {
      const bubble = this.#liveBubbles.get(liveKey(live)) ?? liveBubble(live);
      drawLive(bubble, live);
      return [liveKey(live), bubble];
    }));
    const order = [...bubbles.keys()].join("|");
    if (order !== this.#liveOrder) this.liveList.replaceChildren(...[...bubbles.values()].map((bubble) => bubble.el));
    this.#liveBubbles = bubbles;
    this.#liveOrder = order;
    this.liveList.hidden = !shown.length;
    if (shown.length) this.loading.hidden = true;
  }

  /** The queued inputs, oldest first, each with its own Cancel (POST /inputs/{id}/cancel). */
  #renderPending() {
    const pending = this.runtime.pending;
    const shown = pending.map((input) => `${input.input_id}:${relativeTime(input.created_at)}`).join("|");
    if (shown === this.#pendingShown) return;
    this.#pendingShown = shown;
    this.pendingList.hidden = pending.length === 0;
    this.pendingList.replaceChildren(...pending.map((input, index) => {
      const text = input.text.split("\n").find((line) => line.trim()) ?? "";
      return h("li", { class: "pending-input", dataset: { inputId: input.input_id } },
        h("span", { class: "pending-order", text: `${index + 1}.` }),
        h("span", { class: "pending-text", text, title: input.truncated ? `${input.text}…` : input.text }),
        h("span", { class: "pending-meta", text: `${queuedBy(input.origin)} · ${relativeTime(input.created_at)}` }),
        h("button", { class: "btn small ghost", type: "button", text: "Cancel", title: "Remove it from the queue",
          onClick: (event) => this.#cancelInput(event.currentTarget, input.input_id) }));
    }));
  }

  #renderTurnStatus(activity, openTurnId, detail) {
    const pending = detail?.pending_inputs ?? 0;
    const paused = detail?.queue_paused;
    const parts = [];
    if (openTurnId && TURN_STATUS_TEXT[activity]) {
      parts.push(h("span", { class: `turn-status-text ${activity}` },
        ["running", "queued", "cancelling"].includes(activity) ? h("span", { class: "spinner", "aria-hidden": "true" })
          : null,
        TURN_STATUS_TEXT[activity]));
      if (activity !== "cancelling") {
        parts.push(h("button", { class: "btn small ghost", type: "button", text: "Cancel turn",
          onClick: (event) => this.#cancelTurn(event.currentTarget, openTurnId) }));
      }
    }
    if (pending) {
      parts.push(h("span", { class: "queue-note", dataset: { pending } },
        `${plural(pending, "input")} queued${paused ? " (paused by Stop all)" : ""}`));
    }
    this.turnStatus.hidden = parts.length === 0;
    this.turnStatus.replaceChildren(...parts);
  }

  /** The session's own pending requests, whole (never the inbox's cut summaries): what a human approves. */
  #renderRequests() {
    const requests = this.runtime.requests.filter((r) => !this.tree.answered(r.id));
    const ids = new Set(requests.map((r) => r.id));
    for (const [id, card] of this.#cards) {
      if (!ids.has(id)) {
        card.el.remove();
        this.#cards.delete(id);
      }
    }
    for (const request of requests) {
      if (this.#cards.has(request.id)) continue;
      const card = new RequestCard({ api: this.api, request, onAnswered: (id) => {
        this.tree.markAnswered(id);
        this.runtime.scheduleRefresh();
      } });
      this.#cards.set(request.id, card);
      this.requestList.append(card.el);
    }
  }

  async #send(text, idempotencyKey) {
    try {
      const receipt = await this.api.submitInput(this.sessionId, text, { idempotencyKey });
      this.#stick = true;
      return receipt?.status === "queued" ? "Queued: it runs after the current work." : "";
    } catch (error) {
      if (error instanceof ApiError && error.status === 409) {
        throw new Error(`Not sent — ${error.message}`);
      }
      throw error;
    } finally {
      this.runtime.scheduleRefresh();
      this.tree.scheduleRefresh();
    }
  }

  async #steer(text, idempotencyKey) {
    try {
      await this.api.steer(this.sessionId, text, { idempotencyKey });
      return "Steer sent: the running turn reads it before its next model call.";
    } catch (error) {
      if (error instanceof ApiError && error.status === 409) {
        throw new Error("There is no running turn to steer any more; send it as a new message instead.");
      }
      throw error;
    } finally {
      this.runtime.scheduleRefresh();
    }
  }

  async #cancelInput(button, inputId) {
    button.disabled = true;
    try {
      await this.api.cancelInput(inputId);
      button.closest(".pending-input")?.remove();
    } catch (error) {
      const note = error instanceof ApiError && error.status === 409
        ? "That input has already started; cancel its turn instead." : `Could not cancel it: ${error.message}`;
      this.composer.showStatus(note, "error");
      button.disabled = false;
    } finally {
      this.runtime.scheduleRefresh();
      this.tree.scheduleRefresh();
    }
  }

  async #cancelTurn(button, turnId) {
    button.disabled = true;
    try {
      await this.api.cancelTurn(this.sessionId, turnId);
    } catch (error) {
      this.composer.showStatus(`Could not cancel the turn: ${error.message}`, "error");
      button.disabled = false;
    } finally {
      this.runtime.scheduleRefresh();
      this.tree.scheduleRefresh();
    }
  }
}
