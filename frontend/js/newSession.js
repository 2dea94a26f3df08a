// The New session page: a task (with "@" agent mentions), an optional agent to run it as,
// → POST /sessions {input, agent_id?, project_id?} → the new root's page.

import { agentLabel } from "./agentPicker.js";
import { Composer } from "./composer.js";
import { h } from "./dom.js";

export class NewSessionPage {
  constructor({ ctx }) {
    this.ctx = ctx;
    this.agentSelect = h("select", { class: "agent-select", "aria-label": "Agent" },
      h("option", { value: "", text: "Default assistant" }));
    this.composer = new Composer({
      draftKey: "new-session",
      placeholder: "Describe the task…  (@ for agents)",
      loadAgents: ctx.loadAgents,
      sendLabel: "Start",
      onSend: (text, key) => this.#create(text, key),
    });
    this.el = h("section", { class: "new-page", "aria-label": "New session" },
      h("header", { class: "main-head" }, ctx.menuButton(), h("h1", { class: "root-title", text: "New session" })),
      h("div", { class: "new-body" },
        h("p", { class: "lead", text: "What should Canopy work on? The task becomes the first input of a new "
          + "conversation; it may create member sessions to cooperate on it." }),
        h("label", { class: "field" }, h("span", { text: "Run as" }), this.agentSelect),
        this.composer.el));
  }

  async activate() {
    this.composer.focus();
    try {
      const agents = await this.ctx.loadAgents();
      const current = this.agentSelect.value;
      this.agentSelect.replaceChildren(h("option", { value: "", text: "Default assistant" }),
        ...agents.map((a) => h("option", { value: a.agent_id ?? a.id, text: agentLabel(a) })));
      this.agentSelect.value = current;
    } catch {
      /* the default assistant still works */
    }
  }

  deactivate() {}

  async #create(text, idempotencyKey) {
    const body = { input: text };
    if (this.agentSelect.value) body.agent_id = this.agentSelect.value;
    if (this.ctx.projectId()) body.project_id = this.ctx.projectId();
    const created = await this.ctx.api.createRoot(body, { idempotencyKey });
    const sessionId = created?.session?.session_id ?? created?.session_id;
    this.ctx.rootsChanged();
    this.ctx.navigate(`#/s/${sessionId}`);
    return "";
  }
}
