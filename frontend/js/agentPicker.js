// The "@" picker: typing "@" in a message box lists the agents the user may run
// (GET /agents), searchable by name, description or id; choosing one inserts "@agent:<id>".

import { h, visible } from "./dom.js";

/**
 * An agent in one line: its id and, when shared, whose it is, before its name. Another user of the
 * app names a shared agent as they like ("Deploy helper (deploy-helper)" and a hundred blanks that
 * push what follows out of sight), so what tells it apart comes first.
 */
export function agentLabel(agent) {
  const id = agent.agent_id ?? agent.id;
  return `${id}${agent.shared ? `, shared by ${agent.owner_user_id}` : ""}: ${visible(agent.name)}`;
}

const TOKEN = /(?:^|\s)@([^\s@]*)$/;
const MAX_SHOWN = 8;

export function filterAgents(agents, query) {
  const needle = query.replace(/^agent:/i, "").toLowerCase();
  if (!needle) return agents;
  return agents.filter((a) => [a.agent_id ?? a.id, a.name, a.description]
    .some((field) => String(field ?? "").toLowerCase().includes(needle)));
}

export class AgentPicker {
  #agents = [];
  #shown = [];
  #active = 0;
  #token = null; // {start, end, query}
  #loaded = 0;

  constructor(textarea, loadAgents) {
    this.textarea = textarea;
    this.loadAgents = loadAgents;
    this.el = h("div", { class: "agent-picker", role: "listbox", "aria-label": "Agents", hidden: true });
    this.el.addEventListener("mousedown", (event) => event.preventDefault()); // keep the caret in the box
    textarea.addEventListener("input", () => this.update());
    textarea.addEventListener("click", () => this.update());
    textarea.addEventListener("blur", () => this.close());
  }

  get open() {
    return !this.el.hidden;
  }

  /** Keyboard handling while open; returns true when the key was used by the picker. */
  handleKey(event) {
    if (!this.open) return false;
    if (event.key === "ArrowDown" || event.key === "ArrowUp") {
      const step = event.key === "ArrowDown" ? 1 : -1;
      this.#active = (this.#active + step + this.#shown.length) % Math.max(this.#shown.length, 1);
      this.#render();
      return true;
    }
    if ((event.key === "Enter" || event.key === "Tab") && this.#shown.length) {
      this.choose(this.#shown[this.#active]);
      return true;
    }
    if (event.key === "Escape") {
      this.close();
      return true;
    }
    return false;
  }

  async update() {
    const { value, selectionStart, selectionEnd } = this.textarea;
    if (selectionStart !== selectionEnd) return this.close();
    const match = value.slice(0, selectionStart).match(TOKEN);
    if (!match) return this.close();
    this.#token = { start: selectionStart - match[1].length - 1, end: selectionStart, query: match[1] };
    if (Date.now() - this.#loaded > 30_000) {
      this.#loaded = Date.now();
      try {
        this.#agents = await this.loadAgents();
      } catch {
        this.#agents = [];
      }
    }
    if (!this.#token) return undefined;
    this.#shown = filterAgents(this.#agents, this.#token.query).slice(0, MAX_SHOWN);
    this.#active = Math.min(this.#active, Math.max(this.#shown.length - 1, 0));
    this.el.hidden = false;
    this.#render();
    return undefined;
  }

  choose(agent) {
    if (!agent || !this.#token) return;
    const id = agent.agent_id ?? agent.id;
    const { value } = this.textarea;
    const insert = `@agent:${id} `;
    this.textarea.value = value.slice(0, this.#token.start) + insert + value.slice(this.#token.end);
    const caret = this.#token.start + insert.length;
    this.textarea.setSelectionRange(caret, caret);
    this.close();
    this.textarea.dispatchEvent(new Event("input", { bubbles: true }));
    this.textarea.focus();
  }

  close() {
    this.#token = null;
    this.#active = 0;
    this.el.hidden = true;
  }

  #render() {
    if (!this.#shown.length) {
      this.el.replaceChildren(h("div", { class: "agent-empty", text: this.#agents.length
        ? "No agent matches." : "No agents you may run yet." }));
      return;
    }
    this.el.replaceChildren(
      h("div", { class: "agent-group", text: "Agents" }),
      ...this.#shown.map((agent, index) => h("div", {
        class: `agent-option${index === this.#active ? " active" : ""}`,
        role: "option",
        "aria-selected": index === this.#active ? "true" : "false",
        dataset: { agentId: agent.agent_id ?? agent.id },
        onClick: () => this.choose(agent),
      },
      h("span", { class: "agent-name", text: visible(agent.name) }),
      h("span", { class: "agent-id", text: agent.agent_id ?? agent.id }),
      agent.shared ? h("span", { class: "agent-owner", text: `shared by ${agent.owner_user_id}` }) : null,
      agent.description ? h("span", { class: "agent-desc", text: agent.description }) : null)),
    );
  }
}
