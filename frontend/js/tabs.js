// The right-hand tab strip: one tab per open member session (and the cooperation list),
// each with its activity and a badge of pending requests. Purely presentational: the
// workspace owns which tabs exist and which one is active.

import { activityMark } from "./activity.js";
import { h } from "./dom.js";

export class TabStrip {
  /**
   * @param {{onSelect: (key) => void, onClose: (key) => void, tools?: Node[]}} options
   */
  constructor({ onSelect, onClose, tools = [] }) {
    this.onSelect = onSelect;
    this.onClose = onClose;
    this.list = h("div", { class: "tab-list", role: "tablist", "aria-label": "Open sessions" });
    this.list.addEventListener("keydown", (event) => this.#onKey(event));
    this.el = h("div", { class: "tab-strip" }, this.list, h("div", { class: "tab-tools" }, ...tools));
  }

  /**
   * @param {{key, label, title?, closable, activity?, badge?, kind}[]} tabs
   * @param {string|null} activeKey
   */
  render(tabs, activeKey) {
    const focused = this.list.contains(document.activeElement) ? document.activeElement.dataset.key : null;
    this.list.replaceChildren(...tabs.map((tab) => {
      const active = tab.key === activeKey;
      const select = h("button", {
        class: "tab-select",
        type: "button",
        role: "tab",
        id: `tab-${tab.key}`,
        "aria-selected": String(active),
        tabindex: active ? "0" : "-1",
        title: tab.title ?? tab.label,
        dataset: { key: tab.key },
        onClick: () => this.onSelect(tab.key),
      },
      activityMark(tab.activity),
      h("span", { class: "tab-label", text: tab.label }),
      tab.badge ? h("span", { class: "tab-badge", title: `${tab.badge} pending request(s)`, text: String(tab.badge) })
        : null);
      const close = tab.closable ? h("button", { class: "tab-close", type: "button", "aria-label": `Close ${tab.label}`,
        title: "Close tab", text: "×", onClick: (event) => {
          event.stopPropagation();
          this.onClose(tab.key);
        } }) : null;
      return h("div", { class: `tab${active ? " active" : ""} ${tab.kind ?? ""}`, dataset: { key: tab.key } },
        select, close);
    }));
    if (focused) this.list.querySelector(`.tab-select[data-key="${CSS.escape(focused)}"]`)?.focus();
    this.#reveal(this.list.querySelector(".tab.active"));
  }

  /** Scroll the strip (only the strip) so that the active tab is visible. */
  #reveal(tab) {
    if (!tab) return;
    const left = tab.offsetLeft;
    const right = left + tab.offsetWidth;
    if (left < this.list.scrollLeft) this.list.scrollLeft = left;
    else if (right > this.list.scrollLeft + this.list.clientWidth) this.list.scrollLeft = right - this.list.clientWidth;
  }

  #onKey(event) {
    if (!["ArrowLeft", "ArrowRight", "Home", "End"].includes(event.key)) return;
    const buttons = [...this.list.querySelectorAll(".tab-select")];
    const index = buttons.indexOf(document.activeElement);
    if (index < 0) return;
    const next = event.key === "Home" ? 0 : event.key === "End" ? buttons.length - 1
      : (index + (event.key === "ArrowRight" ? 1 : -1) + buttons.length) % buttons.length;
    event.preventDefault();
    buttons[next].focus();
    this.onSelect(buttons[next].dataset.key);
  }
}
