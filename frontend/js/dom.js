// Small DOM and timing helpers shared by every module.

/**
 * Build an element: h("button", {class: "btn", onClick: fn, text: "Go"}, child, ...).
 * Props: class, text, dataset, style (object), on<Event> handlers, value/checked (properties),
 * booleans (true → empty attribute, false/null → omitted), anything else as an attribute.
 */
export function h(tag, props = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(props ?? {})) {
    if (value == null || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "text") el.textContent = value;
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key === "style" && typeof value === "object") {
      for (const [name, v] of Object.entries(value)) {
        if (name.startsWith("--")) el.style.setProperty(name, v);
        else el.style[name] = v;
      }
    }
    else if (key === "value" || key === "checked") el[key] = value;
    else if (key.startsWith("on") && typeof value === "function") {
      el.addEventListener(key.slice(2).toLowerCase(), value);
    } else el.setAttribute(key, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

export function append(parent, children) {
  for (const child of children.flat(Infinity)) {
    if (child == null || child === false) continue;
    parent.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return parent;
}

/** Call ``fn`` once things have been quiet for ``wait`` ms, but at least every ``maxWait`` ms. */
export function debounce(fn, wait, maxWait = Infinity) {
  let timer = null;
  let first = 0;
  const run = () => {
    clearTimeout(timer);
    timer = null;
    first = 0;
    fn();
  };
  const debounced = () => {
    const now = Date.now();
    if (!first) first = now;
    clearTimeout(timer);
    const remaining = Math.min(wait, Math.max(0, first + maxWait - now));
    timer = setTimeout(run, remaining);
  };
  debounced.cancel = () => {
    clearTimeout(timer);
    timer = null;
    first = 0;
  };
  debounced.flush = () => {
    if (timer) run();
  };
  return debounced;
}

export const sleep = (ms, signal) =>
  new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => {
      clearTimeout(timer);
      resolve();
    }, { once: true });
  });

/** A tiny synchronous event emitter. ``on`` returns the function that unsubscribes. */
export class Emitter {
  #handlers = new Map();

  on(type, fn) {
    if (!this.#handlers.has(type)) this.#handlers.set(type, new Set());
    this.#handlers.get(type).add(fn);
    return () => this.#handlers.get(type)?.delete(fn);
  }

  emit(type, ...args) {
    for (const fn of [...(this.#handlers.get(type) ?? [])]) {
      try {
        fn(...args);
      } catch (error) {
        console.error(`listener of ${type} failed`, error);
      }
    }
  }
}

export function relativeTime(iso) {
  if (!iso) return "";
  const then = new Date(iso).getTime();
  if (Number.isNaN(then)) return "";
  const seconds = Math.round((Date.now() - then) / 1000);
  if (seconds < 45) return "just now";
  const minutes = Math.round(seconds / 60);
  if (minutes < 60) return `${minutes} min ago`;
  const hours = Math.round(minutes / 60);
  if (hours < 24) return `${hours} h ago`;
  const days = Math.round(hours / 24);
  if (days < 7) return `${days} d ago`;
  return new Date(iso).toLocaleDateString();
}

export function plural(n, one, many = `${one}s`) {
  return `${n} ${n === 1 ? one : many}`;
}

/** localStorage that never throws (private mode, quota, disabled storage). */
export const storage = {
  get(key, fallback = null) {
    try {
      const value = localStorage.getItem(key);
      return value === null ? fallback : value;
    } catch {
      return fallback;
    }
  },
  set(key, value) {
    try {
      if (value === null || value === undefined || value === "") localStorage.removeItem(key);
      else localStorage.setItem(key, value);
    } catch {
      /* storage full or disabled: drafts simply are not kept */
    }
  },
};

/** Is the scroll container scrolled to (near) its end? */
export function nearBottom(el, slack = 80) {
  return el.scrollHeight - el.scrollTop - el.clientHeight <= slack;
}

/** A random key for an Idempotency-Key header (crypto.randomUUID needs a secure context). */
export function newKey() {
  if (globalThis.crypto?.randomUUID) return crypto.randomUUID();
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return [...bytes].map((b) => b.toString(16).padStart(2, "0")).join("");
}

// Characters a human would not see, or would see reordered, in what they approve or see ran: every
// control (Cc) but newline and tab, every format character (Cf: bidi overrides and isolates, zero-width
// spaces and joiners, the BOM, the soft hyphen, tag characters U+E0000–U+E007F, interlinear
// annotations, musical format), the line and paragraph separators, and what Unicode says renders as
// nothing (default ignorable: the Hangul fillers, variation selectors U+FE00–U+FE0F and
// U+E0100–U+E01EF, named here too). A model that wrote "ls", 200 blank lines and "; curl … | sh",
// reversed a command's tail with U+202E or spelled it in invisible tags, must not get it approved
// as "ls". The `u` flag matches a whole code point, astral ones included, never half of a pair.
const HIDDEN =
  /(?![\n\t])[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\p{Default_Ignorable_Code_Point}\u115f\u1160\u3164\uffa0\ufe00-\ufe0f\u{e0100}-\u{e01ef}]/gu;

/** ``text`` with every hidden character shown as its code point, e.g. "⟨U+202E⟩", "⟨U+E0020⟩". */
export function visible(text) {
  return text.replace(HIDDEN, (c) => `⟨U+${c.codePointAt(0).toString(16).toUpperCase().padStart(4, "0")}⟩`);
}
