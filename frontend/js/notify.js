// Short notices (archived, could not archive, …) in a polite live region.

import { h } from "./dom.js";

let region = null;

function ensureRegion() {
  if (!region) {
    region = h("div", { class: "toasts", role: "status", "aria-live": "polite" });
    document.body.append(region);
  }
  return region;
}

export function notify(text, kind = "info", { timeout = kind === "error" ? 12_000 : 5_000 } = {}) {
  const close = h("button", { class: "toast-close", type: "button", "aria-label": "Dismiss", text: "×",
    onClick: () => toast.remove() });
  const toast = h("div", { class: `toast ${kind}`, dataset: { kind } }, h("p", { text }), close);
  ensureRegion().append(toast);
  setTimeout(() => toast.remove(), timeout);
  return toast;
}
