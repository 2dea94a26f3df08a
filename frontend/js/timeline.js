// The timeline tab: where a tree's time went. One lane per member (indented by depth), with
// its queued-for-slot intervals, Runs, waits (an arrow to each session waited on) and pending
// human requests on the main row, and its model calls and tool calls on two thin rows below;
// the tree's Stop all / Continue moments are vertical lines. Data: GET /trees/{id}/timeline,
// read whole once (page by page), then only what changed since the last read (`since` = its
// as_of) each time the tree's event stream says something happened.
//
// Drawn on one canvas, and only what is on screen: lanes outside the viewport are skipped and
// bars outside the time range are culled, so 500 lanes x 10,000 bars cost a few hundred draw
// calls per frame and the DOM holds a handful of elements. The text alternative (a table of
// lanes) is built only when it is opened. Wheel scrolls the lanes; Ctrl/⌘ + wheel zooms at
// the pointer; Shift + wheel and drag pan; arrow keys and +/- work when the canvas has focus.

import { debounce, h, plural } from "./dom.js";

const LANE_H = 26;
const AXIS_H = 24;
const PAGE = 5000;
const MIN_SPAN_MS = 20; // the deepest zoom: 20 ms across the whole width
const LIVE_TICK_MS = 250; // open bars grow to "now" at this pace while anything is open
const MAIN_KINDS = new Set(["queued", "run", "wait", "approval", "question"]);
const KIND_LABEL = { run: "Run (holds a slot)", queued: "Queued for a slot", wait: "Waiting", approval: "Approval pending",
  question: "Question pending", model_call: "Model call", tool_call: "Tool call" };
const FRAME_SAMPLES = 600;

/** Timeline views by tree id: a handle for the browser tests (window.canopy.timelines). */
export const timelines = new Map();

const ms = (iso) => (iso ? Date.parse(iso) : null);

export function formatDuration(value) {
  if (value == null || Number.isNaN(value)) return "—";
  if (value < 1) return `${value.toFixed(2)} ms`;
  if (value < 1000) return `${Math.round(value)} ms`;
  if (value < 60_000) return `${(value / 1000).toFixed(value < 10_000 ? 2 : 1)} s`;
  const minutes = Math.floor(value / 60_000);
  return `${minutes} min ${Math.round((value % 60_000) / 1000)} s`;
}

/** A tick's label: its offset from the tree's first moment, with as many decimals as the step needs. */
function tickLabel(offset, step) {
  if (offset < 1000 && step < 1000) return `${Math.round(offset)} ms`;
  const decimals = step >= 1000 ? (step % 1000 ? 1 : 0) : step >= 100 ? 1 : step >= 10 ? 2 : 3;
  return `${(offset / 1000).toFixed(decimals)} s`;
}

/** A readable tick step (1, 2, 5 × 10^n ms) that puts ticks about ``target`` px apart. */
function tickStep(msPerPx, target = 90) {
  const raw = msPerPx * target;
  const power = 10 ** Math.floor(Math.log10(raw));
  for (const factor of [1, 2, 5, 10]) if (factor * power >= raw) return factor * power;
  return 10 * power;
}

function themeColors(el) {
  const style = getComputedStyle(el);
  const v = (name) => style.getPropertyValue(name).trim();
  return {
    bg: v("--surface"), band: v("--surface-2"), border: v("--border"), fg: v("--fg"), muted: v("--fg-muted"),
    faint: v("--fg-faint"), run: v("--accent"), runSoft: v("--accent-soft"), queued: v("--attention-soft"),
    queuedEdge: v("--attention-border"), wait: v("--info-soft"), waitEdge: v("--info"), human: v("--attention"),
    model: v("--info"), tool: v("--fg-muted"), danger: v("--danger"), font: v("--font") || "sans-serif",
  };
}

export class TimelineView {
  #releases = [];
  #observing = null;
  #frame = 0;
  #tick = 0;
  #loading = null;
  #again = false;
  #auto = true; // follow the whole tree (Fit) until the user zooms or pans
  #drag = null;
  #visible = false;
  #colors = null;

  constructor({ api, tree, onOpenMember }) {
    this.api = api;
    this.tree = tree;
    this.onOpenMember = onOpenMember;
    this.members = [];
    this.laneOf = new Map(); // session_id → lane index
    this.items = new Map(); // `${kind}:${id}` → interval
    this.lanes = []; // per lane: {main: [], model: [], tool: []}, each by start
    this.instants = new Map();
    this.asOf = null;
    this.loaded = false;
    this.error = null;
    this.view = { t0: 0, t1: 1, top: 0 }; // the time range across the plot, the first lane's scroll offset
    this.drawn = []; // what the last frame drew: hit tests and the tests read it
    this.stats = { draws: 0, drawMs: [] };

    const button = (text, label, onClick, extra = {}) => h("button", { class: "btn ghost small", type: "button",
      text, title: label, "aria-label": label, onClick, ...extra });
    this.zoomIn = button("+", "Zoom in", () => this.zoom(0.5));
    this.zoomOut = button("−", "Zoom out", () => this.zoom(2));
    this.fitButton = button("Fit", "Fit the whole tree", () => this.fit(true));
    this.panLeft = button("‹", "Pan earlier", () => this.pan(-0.25));
    this.panRight = button("›", "Pan later", () => this.pan(0.25));
    this.traceButton = button("Trace", "Download the trace for Perfetto (Chrome trace JSON)", () => this.#download());
    this.status = h("span", { class: "timeline-status", role: "status", "aria-live": "polite" });
    this.toolbar = h("div", { class: "timeline-toolbar", role: "toolbar", "aria-label": "Timeline controls" },
      this.zoomIn, this.zoomOut, this.fitButton, this.panLeft, this.panRight, this.traceButton, this.status);

    this.canvas = h("canvas", { class: "timeline-canvas", tabindex: "0", role: "img",
      "aria-label": "Timeline of the tree's members. Use the table below for the same figures as text.",
      dataset: { bars: "0", lanes: "0", live: "false" } });
    this.card = h("div", { class: "timeline-card", role: "tooltip", hidden: true });
    this.plot = h("div", { class: "timeline-plot" }, this.canvas, this.card);
    this.tableHost = h("div", { class: "timeline-table-host" });
    this.details = h("details", { class: "timeline-text" },
      h("summary", { text: "Lanes as a table (text alternative)" }), this.tableHost);
    this.details.addEventListener("toggle", () => this.#renderTable());
    this.el = h("section", { class: "timeline-view", "aria-label": "Timeline", dataset: { treeId: tree.treeId } },
      this.toolbar, this.plot, this.details);

    this.scheduleLoad = debounce(() => this.load(), 250, 1000);
    this.#releases.push(tree.on("event", () => this.scheduleLoad()));
    this.#listen();
    this.resize = new ResizeObserver(() => this.draw());
    this.resize.observe(this.plot);
    this.themeWatch = new MutationObserver(() => {
      this.#colors = null;
      this.draw();
    });
    this.themeWatch.observe(document.documentElement, { attributes: true, attributeFilter: ["data-theme"] });
    timelines.set(tree.treeId, this);
    this.load();
  }

  /** Shown: follow the tree's stream (one per tree, shared with every other view of it). */
  show() {
    this.#visible = true;
    this.#observing ??= this.tree.observe();
    this.draw();
  }

  hide() {
    this.#visible = false;
  }

  resume() {
    this.#observing ??= this.tree.observe();
  }

  suspend() {
    this.#observing?.();
    this.#observing = null;
  }

  destroy() {
    this.suspend();
    for (const release of this.#releases.splice(0)) release();
    cancelAnimationFrame(this.#frame);
    clearTimeout(this.#tick);
    this.resize.disconnect();
    this.themeWatch.disconnect();
    if (timelines.get(this.tree.treeId) === this) timelines.delete(this.tree.treeId);
    this.el.remove();
  }

  // -- data ---------------------------------------------------------------------------------------

  /** Read what changed since the last read (everything the first time); reads never overlap. */
  async load() {
    if (this.#loading) {
      this.#again = true;
      return this.#loading;
    }
    this.#loading = this.#read().finally(() => {
      this.#loading = null;
      if (this.#again) {
        this.#again = false;
        this.load();
      }
    });
    return this.#loading;
  }

  async #read() {
    try {
      let since = this.asOf;
      let asOf = null;
      do {
        const page = await this.api.timeline(this.tree.treeId, { since, limit: PAGE });
        asOf ??= page.as_of;
        this.#setMembers(page.members);
        for (const item of page.intervals) {
          this.items.set(`${item.kind}:${item.id}`, { ...item, t0: ms(item.start), t1: ms(item.end) });
        }
        for (const instant of page.instants) this.instants.set(instant.id, { ...instant, t: ms(instant.at) });
        since = page.next_cursor;
      } while (since);
      this.asOf = asOf;
      this.error = null;
      this.loaded = true;
    } catch (error) {
      this.error = error;
    }
    this.#index();
    if (this.#auto) this.fit(false);
    this.#renderStatus();
    if (this.details.open) this.#renderTable();
    this.draw();
  }

  #setMembers(members) {
    if (members.length === this.members.length) return;
    this.members = members;
    this.laneOf = new Map(members.map((m, index) => [m.session_id, index]));
  }

  /** Per lane and row, intervals by start: a frame walks only the lanes it shows. */
  #index() {
    this.lanes = this.members.map(() => ({ main: [], model: [], tool: [] }));
    this.open = 0;
    this.extent = { t0: Infinity, t1: -Infinity };
    for (const item of this.items.values()) {
      const lane = this.lanes[this.laneOf.get(item.session_id)];
      if (!lane) continue;
      const row = MAIN_KINDS.has(item.kind) ? lane.main : item.kind === "model_call" ? lane.model : lane.tool;
      row.push(item);
      if (item.t1 == null) this.open += 1;
      this.extent.t0 = Math.min(this.extent.t0, item.t0);
      this.extent.t1 = Math.max(this.extent.t1, item.t1 ?? item.t0);
    }
    // Within the main row: queued under run under wait under the request that parks it.
    const order = { queued: 0, run: 1, wait: 2, approval: 3, question: 3 };
    for (const lane of this.lanes) {
      lane.main.sort((a, b) => a.t0 - b.t0 || order[a.kind] - order[b.kind]);
      lane.model.sort((a, b) => a.t0 - b.t0);
      lane.tool.sort((a, b) => a.t0 - b.t0);
    }
    this.canvas.dataset.lanes = String(this.members.length);
    this.canvas.dataset.live = String(this.open > 0);
    clearTimeout(this.#tick);
    if (this.open > 0) this.#tick = setTimeout(() => this.#grow(), LIVE_TICK_MS);
  }

  /** While anything is open its bar grows to the present. */
  #grow() {
    if (this.#auto) this.fit(false);
    this.draw();
    if (this.open > 0) this.#tick = setTimeout(() => this.#grow(), LIVE_TICK_MS);
  }

  /** Where open bars end: the present (server and browser clocks are assumed to agree). */
  #now() {
    return Date.now();
  }

  // -- navigation ---------------------------------------------------------------------------------

  fit(draw = true) {
    if (draw) this.#auto = true;
    if (!Number.isFinite(this.extent?.t0)) return;
    const end = this.open > 0 ? Math.max(this.extent.t1, this.#now()) : this.extent.t1;
    const span = Math.max(end - this.extent.t0, MIN_SPAN_MS);
    this.view.t0 = this.extent.t0 - span * 0.02;
    this.view.t1 = end + span * 0.02;
    if (draw) this.draw();
  }

  /** Zoom by ``factor`` (<1 in) around ``at`` (a time; default the middle). */
  zoom(factor, at = null) {
    this.#auto = false;
    const { t0, t1 } = this.view;
    const pivot = at ?? (t0 + t1) / 2;
    const span = Math.max((t1 - t0) * factor, MIN_SPAN_MS);
    const share = (pivot - t0) / (t1 - t0);
    this.view.t0 = pivot - span * share;
    this.view.t1 = this.view.t0 + span;
    this.draw();
  }

  /** Pan by a share of the visible span (negative: earlier). */
  pan(share) {
    this.#auto = false;
    const shift = (this.view.t1 - this.view.t0) * share;
    this.view.t0 += shift;
    this.view.t1 += shift;
    this.draw();
  }

  scrollLanes(dy) {
    const height = this.plot.clientHeight - AXIS_H;
    const max = Math.max(0, this.members.length * LANE_H - height);
    this.view.top = Math.min(max, Math.max(0, this.view.top + dy));
    this.draw();
  }

  #gutter() {
    return Math.round(Math.min(220, Math.max(92, this.plot.clientWidth * 0.22)));
  }

  #xOf(t, gutter, width) {
    return gutter + ((t - this.view.t0) / (this.view.t1 - this.view.t0)) * (width - gutter);
  }

  #tOf(x, gutter, width) {
    return this.view.t0 + ((x - gutter) / (width - gutter)) * (this.view.t1 - this.view.t0);
  }

  #listen() {
    const canvas = this.canvas;
    canvas.addEventListener("wheel", (event) => {
      event.preventDefault();
      const rect = canvas.getBoundingClientRect();
      if (event.ctrlKey || event.metaKey) {
        this.zoom(Math.exp(event.deltaY * 0.002), this.#tOf(event.clientX - rect.left, this.#gutter(), rect.width));
      } else if (event.shiftKey || Math.abs(event.deltaX) > Math.abs(event.deltaY)) {
        this.pan((event.deltaX || event.deltaY) / Math.max(rect.width, 1));
      } else {
        this.scrollLanes(event.deltaY);
      }
    }, { passive: false });
    canvas.addEventListener("pointerdown", (event) => {
      this.#drag = { x: event.clientX, y: event.clientY, moved: false, view: { ...this.view } };
      canvas.setPointerCapture(event.pointerId);
    });
    canvas.addEventListener("pointermove", (event) => {
      const drag = this.#drag;
      if (drag) {
        const dx = event.clientX - drag.x;
        const dy = event.clientY - drag.y;
        if (Math.abs(dx) + Math.abs(dy) > 3) drag.moved = true;
        if (drag.moved) {
          this.#auto = false;
          const rect = canvas.getBoundingClientRect();
          const perPx = (drag.view.t1 - drag.view.t0) / Math.max(rect.width - this.#gutter(), 1);
          this.view.t0 = drag.view.t0 - dx * perPx;
          this.view.t1 = drag.view.t1 - dx * perPx;
          this.view.top = drag.view.top;
          this.scrollLanes(-dy);
          this.card.hidden = true;
          return;
        }
      }
      this.#hover(event);
    });
    canvas.addEventListener("pointerup", (event) => {
      const drag = this.#drag;
      this.#drag = null;
      if (drag && !drag.moved) this.#click(event);
    });
    canvas.addEventListener("pointerleave", () => {
      this.card.hidden = true;
    });
    canvas.addEventListener("keydown", (event) => {
      const actions = { ArrowLeft: () => this.pan(-0.1), ArrowRight: () => this.pan(0.1),
        ArrowUp: () => this.scrollLanes(-LANE_H), ArrowDown: () => this.scrollLanes(LANE_H),
        "+": () => this.zoom(0.5), "=": () => this.zoom(0.5), "-": () => this.zoom(2), 0: () => this.fit(true) };
      if (!actions[event.key]) return;
      event.preventDefault();
      actions[event.key]();
    });
  }

  /** The bar under a point of the canvas (topmost first), else the lane and time there. */
  hit(x, y) {
    for (let i = this.drawn.length - 1; i >= 0; i -= 1) {
      const bar = this.drawn[i];
      if (x >= bar.x - 1 && x <= bar.x + Math.max(bar.w, 2) + 1 && y >= bar.y && y <= bar.y + bar.h) return { bar };
    }
    const lane = Math.floor((y - AXIS_H + this.view.top) / LANE_H);
    const member = y > AXIS_H ? this.members[lane] : null;
    return member ? { member, t: this.#tOf(x, this.#gutter(), this.canvas.clientWidth) } : null;
  }

  #hover(event) {
    const rect = this.canvas.getBoundingClientRect();
    const x = event.clientX - rect.left;
    const y = event.clientY - rect.top;
    const found = this.hit(x, y);
    if (!found?.bar) {
      this.card.hidden = true;
      this.canvas.style.cursor = found?.member ? "pointer" : "default";
      return;
    }
    this.canvas.style.cursor = "pointer";
    const item = found.bar.item;
    const end = item.t1 ?? this.#now();
    const rows = [
      ["member", item.path],
      ["start", new Date(item.t0).toLocaleTimeString([], { hour12: false }) + `.${String(item.t0 % 1000).padStart(3, "0")}`],
      ["duration", `${formatDuration(end - item.t0)}${item.t1 == null ? " (open)" : ""}`],
      item.status ? ["status", item.status] : null,
      item.name && item.kind !== "run" && item.kind !== "queued" ? ["what", item.name] : null,
      item.kind === "run" || item.kind === "queued" ? ["run kind", item.name] : null,
      item.prompt_tokens || item.completion_tokens
        ? ["tokens", `${item.prompt_tokens} in / ${item.completion_tokens} out`] : null,
      item.cost_usd ? ["cost", `$${item.cost_usd.toFixed(6)}`]
        : item.cost_usd === null ? ["cost", "no price (litellm does not know the model)"] : null,
      item.waits_on?.length ? ["waits on", item.waits_on.map((id) => this.#pathOf(id)).join(", ")] : null,
      item.error ? ["error", item.error] : null,
      item.run_id ? ["run", item.run_id] : null,
      item.turn_id ? ["turn", item.turn_id] : null,
      item.wait_id ? ["wait", item.wait_id] : null,
      item.request_id ? ["request", item.request_id] : null,
      item.kind === "model_call" || item.kind === "tool_call" ? ["id", item.id] : null,
    ].filter(Boolean);
    this.card.replaceChildren(h("strong", { class: "timeline-card-title", text: KIND_LABEL[item.kind] }),
      h("dl", {}, ...rows.flatMap(([k, v]) => [h("dt", { text: k }), h("dd", { text: String(v) })])));
    this.card.dataset.kind = item.kind;
    this.card.hidden = false;
    const width = this.card.offsetWidth;
    const height = this.card.offsetHeight;
    const left = Math.min(Math.max(4, x + 14), Math.max(4, rect.width - width - 4));
    const top = y + 16 + height > rect.height ? Math.max(4, y - height - 10) : y + 16;
    this.card.style.left = `${left}px`;
    this.card.style.top = `${top}px`;
  }

  #click(event) {
    const rect = this.canvas.getBoundingClientRect();
    const found = this.hit(event.clientX - rect.left, event.clientY - rect.top);
    if (!found) return;
    if (found.bar) {
      const item = found.bar.item;
      this.onOpenMember(item.session_id, { at: item.t0, runId: item.run_id });
    } else {
      this.onOpenMember(found.member.session_id, { at: found.t, runId: null });
    }
  }

  #pathOf(sessionId) {
    return this.members[this.laneOf.get(sessionId)]?.path ?? sessionId;
  }

  // -- drawing ------------------------------------------------------------------------------------

  /** Draw on the next animation frame (many changes in one frame draw once). */
  draw() {
    if (this.#frame) return;
    this.#frame = requestAnimationFrame(() => {
      this.#frame = 0;
      this.#paint();
    });
  }

  #paint() {
    const width = this.plot.clientWidth;
    const height = this.plot.clientHeight;
    if (!width || !height) return;
    const began = performance.now();
    const ratio = window.devicePixelRatio || 1;
    if (this.canvas.width !== Math.round(width * ratio) || this.canvas.height !== Math.round(height * ratio)) {
      this.canvas.width = Math.round(width * ratio);
      this.canvas.height = Math.round(height * ratio);
      this.canvas.style.width = `${width}px`;
      this.canvas.style.height = `${height}px`;
    }
    this.#colors ??= themeColors(this.el);
    const c = this.#colors;
    const g = this.canvas.getContext("2d");
    g.setTransform(ratio, 0, 0, ratio, 0, 0);
    g.fillStyle = c.bg;
    g.fillRect(0, 0, width, height);
    const gutter = this.#gutter();
    const now = this.#now();
    const { t0, t1 } = this.view;
    const x = (t) => this.#xOf(t, gutter, width);
    const drawn = [];
    const first = Math.max(0, Math.floor(this.view.top / LANE_H));
    const last = Math.min(this.members.length - 1, Math.floor((this.view.top + height - AXIS_H) / LANE_H));
    const laneY = (lane) => AXIS_H + lane * LANE_H - this.view.top;

    // Lanes: alternating bands and labels (indented by depth).
    g.font = `12px ${c.font}`;
    g.textBaseline = "middle";
    for (let lane = first; lane <= last; lane += 1) {
      const y = laneY(lane);
      if (lane % 2) {
        g.fillStyle = c.band;
        g.fillRect(0, y, width, LANE_H);
      }
      const member = this.members[lane];
      g.fillStyle = c.fg;
      const indent = Math.min(member.depth, 6) * 10;
      const label = member.depth === 0 ? "/root" : member.name;
      g.save();
      g.beginPath();
      g.rect(0, y, gutter - 6, LANE_H);
      g.clip();
      g.fillText(label, 6 + indent, y + LANE_H / 2);
      g.restore();
    }

    // Bars, clipped to the plot (right of the gutter, below the axis).
    g.save();
    g.beginPath();
    g.rect(gutter, AXIS_H, width - gutter, height - AXIS_H);
    g.clip();
    const arrows = [];
    for (let lane = first; lane <= last; lane += 1) {
      const rows = this.lanes[lane];
      if (!rows) continue;
      const y = laneY(lane);
      for (const item of rows.main) {
        const end = item.t1 ?? now;
        if (end < t0 || item.t0 > t1) continue;
        const bx = x(item.t0);
        const bw = Math.max(x(end) - bx, 1);
        const human = item.kind === "approval" || item.kind === "question";
        const by = human ? y + 6 : y + 3;
        const bh = human ? 6 : 12;
        this.#bar(g, item, bx, by, bw, bh, c);
        drawn.push({ item, x: bx, y: by, w: bw, h: bh, lane });
        if (item.kind === "wait" && item.waits_on?.length) arrows.push({ item, bx, by: y + 9 });
      }
      for (const [row, offset, color] of [[rows.model, 17, c.model], [rows.tool, 21, c.tool]]) {
        for (const item of row) {
          const end = item.t1 ?? now;
          if (end < t0 || item.t0 > t1) continue;
          const bx = x(item.t0);
          const bw = Math.max(x(end) - bx, 1);
          g.fillStyle = item.status === "error" ? c.danger : color;
          g.fillRect(bx, y + offset, bw, 3);
          drawn.push({ item, x: bx, y: y + offset - 1, w: bw, h: 5, lane });
        }
      }
    }
    // A wait's arrows: from its start down (or up) to each lane it waits on.
    g.strokeStyle = c.waitEdge;
    g.fillStyle = c.waitEdge;
    g.lineWidth = 1;
    for (const { item, bx, by } of arrows) {
      for (const target of item.waits_on) {
        const lane = this.laneOf.get(target);
        if (lane === undefined) continue;
        const ty = laneY(lane) + (lane > this.laneOf.get(item.session_id) ? 3 : 15);
        const ax = bx + 4;
        g.beginPath();
        g.moveTo(ax, by);
        g.lineTo(ax, ty);
        g.stroke();
        const dir = ty > by ? -1 : 1;
        g.beginPath();
        g.moveTo(ax, ty);
        g.lineTo(ax - 3, ty + dir * 5);
        g.lineTo(ax + 3, ty + dir * 5);
        g.closePath();
        g.fill();
      }
    }
    // Stop all / Continue: vertical lines across every lane.
    g.setLineDash([4, 3]);
    for (const instant of this.instants.values()) {
      if (instant.t < t0 || instant.t > t1) continue;
      const ix = Math.round(x(instant.t)) + 0.5;
      g.strokeStyle = instant.kind === "stop" ? c.danger : c.run;
      g.beginPath();
      g.moveTo(ix, AXIS_H);
      g.lineTo(ix, height);
      g.stroke();
      drawn.push({ item: { kind: instant.kind, id: instant.id, session_id: instant.session_id, path: "/root",
        t0: instant.t, t1: instant.t }, x: ix - 2, y: AXIS_H, w: 4, h: height - AXIS_H, lane: -1, instant: true });
    }
    g.setLineDash([]);
    g.restore();

    this.#axis(g, gutter, width, c);
    g.strokeStyle = c.border;
    g.beginPath();
    g.moveTo(gutter - 0.5, 0);
    g.lineTo(gutter - 0.5, height);
    g.stroke();
    if (!this.members.length) {
      g.fillStyle = c.muted;
      g.fillText(this.error ? `Could not load the timeline: ${this.error.message}` : "Loading…", 12, AXIS_H + 16);
    }

    this.drawn = drawn.filter((bar) => !bar.instant).concat(drawn.filter((bar) => bar.instant));
    this.canvas.dataset.bars = String(drawn.length);
    const took = performance.now() - began;
    this.stats.draws += 1;
    this.stats.drawMs.push(took);
    if (this.stats.drawMs.length > FRAME_SAMPLES) this.stats.drawMs.shift();
  }

  #bar(g, item, bx, by, bw, bh, c) {
    if (item.kind === "run") {
      g.fillStyle = item.status === "failed" || item.error ? c.danger : c.run;
      g.fillRect(bx, by, bw, bh);
    } else if (item.kind === "queued") {
      g.fillStyle = c.queued;
      g.fillRect(bx, by, bw, bh);
      g.strokeStyle = c.queuedEdge;
      g.strokeRect(bx + 0.5, by + 0.5, Math.max(bw - 1, 0.5), bh - 1);
    } else if (item.kind === "wait") {
      g.fillStyle = c.wait;
      g.fillRect(bx, by, bw, bh);
      g.strokeStyle = c.waitEdge;
      g.strokeRect(bx + 0.5, by + 0.5, Math.max(bw - 1, 0.5), bh - 1);
    } else {
      g.fillStyle = c.human;
      g.fillRect(bx, by, bw, bh);
    }
  }

  /** The time axis: ticks at readable steps, labelled from the tree's first moment. */
  #axis(g, gutter, width, c) {
    g.fillStyle = c.bg;
    g.fillRect(0, 0, width, AXIS_H);
    g.strokeStyle = c.border;
    g.beginPath();
    g.moveTo(0, AXIS_H - 0.5);
    g.lineTo(width, AXIS_H - 0.5);
    g.stroke();
    const { t0, t1 } = this.view;
    const origin = Number.isFinite(this.extent?.t0) ? this.extent.t0 : t0;
    const step = tickStep((t1 - t0) / Math.max(width - gutter, 1));
    g.fillStyle = c.muted;
    g.font = `11px ${c.font}`;
    g.textBaseline = "middle";
    for (let t = origin + Math.ceil((t0 - origin) / step) * step; t <= t1; t += step) {
      const tx = Math.round(this.#xOf(t, gutter, width)) + 0.5;
      if (tx < gutter) continue;
      g.beginPath();
      g.moveTo(tx, AXIS_H - 6);
      g.lineTo(tx, AXIS_H);
      g.stroke();
      g.fillText(tickLabel(t - origin, step), tx + 3, AXIS_H / 2);
    }
    g.fillText(plural(this.members.length, "member"), 6, AXIS_H / 2);
  }

  #renderStatus() {
    const runs = [...this.items.values()].filter((item) => item.kind === "run").length;
    const live = this.open > 0 ? " · live" : "";
    this.status.textContent = this.error ? `Update failed: ${this.error.message}`
      : this.loaded ? `${plural(runs, "run")}${live}` : "Loading…";
  }

  // -- text alternative ----------------------------------------------------------------------------

  /** Per lane: Runs, time running, time queued, waits, model and tool calls, tokens, cost. */
  summaryRows() {
    const now = this.#now();
    return this.members.map((member, lane) => {
      const rows = this.lanes[lane] ?? { main: [], model: [], tool: [] };
      const total = (kind) => rows.main.filter((i) => i.kind === kind)
        .reduce((sum, i) => sum + ((i.t1 ?? now) - i.t0), 0);
      const runs = rows.main.filter((i) => i.kind === "run");
      return {
        path: member.path,
        runs: runs.length,
        running: total("run"),
        queued: total("queued"),
        waits: rows.main.filter((i) => i.kind === "wait").length,
        waiting: total("wait"),
        modelCalls: rows.model.length,
        toolCalls: rows.tool.length,
        tokens: runs.reduce((sum, r) => sum + r.prompt_tokens + r.completion_tokens, 0),
        cost: runs.reduce((sum, r) => sum + r.cost_usd, 0),
      };
    });
  }

  #renderTable() {
    if (!this.details.open) {
      this.tableHost.replaceChildren();
      return;
    }
    const head = ["Member", "Runs", "Running", "Queued", "Waits", "Waiting", "Model calls", "Tool calls", "Tokens",
      "Cost (USD)"];
    const body = this.summaryRows().map((row) => h("tr", {},
      h("th", { scope: "row", text: row.path }), h("td", { text: String(row.runs) }),
      h("td", { text: formatDuration(row.running) }), h("td", { text: formatDuration(row.queued) }),
      h("td", { text: String(row.waits) }), h("td", { text: formatDuration(row.waiting) }),
      h("td", { text: String(row.modelCalls) }), h("td", { text: String(row.toolCalls) }),
      h("td", { text: String(row.tokens) }), h("td", { text: row.cost.toFixed(6) })));
    this.tableHost.replaceChildren(h("table", { class: "timeline-table" },
      h("caption", { text: "Time per member (durations summed over the tree's life)" }),
      h("thead", {}, h("tr", {}, ...head.map((text) => h("th", { scope: "col", text })))),
      h("tbody", {}, ...body)));
  }

  async #download() {
    try {
      const trace = await this.api.trace(this.tree.treeId);
      const url = URL.createObjectURL(new Blob([JSON.stringify(trace)], { type: "application/json" }));
      const link = h("a", { href: url, download: `canopy-trace-${this.tree.treeId}.json` });
      document.body.append(link);
      link.click();
      link.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10_000);
    } catch (error) {
      this.status.textContent = `Could not download the trace: ${error.message}`;
    }
  }

  /** What the last frame drew and the time range, as plain data (for the browser tests). */
  model() {
    const plain = ({ item, x, y, w, h: height, lane }) => ({ kind: item.kind, id: item.id, sessionId: item.session_id,
      path: item.path, start: item.t0, end: item.t1, x, y, w, h: height, lane, waitsOn: item.waits_on ?? [] });
    return {
      lanes: this.members.map((m, lane) => ({ sessionId: m.session_id, path: m.path, depth: m.depth, lane })),
      bars: this.drawn.map(plain),
      view: { ...this.view },
      items: this.items.size,
      open: this.open,
      loaded: this.loaded,
      asOf: this.asOf,
      stats: { draws: this.stats.draws, drawMs: [...this.stats.drawMs] },
    };
  }
}
