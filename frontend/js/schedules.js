// A session's schedules (POST/GET/DELETE /sessions/{id}/schedules): each due time submits the
// schedule's text to the session once. Shown folded under the conversation; read when opened,
// after a change, and every half minute while open (schedules change rarely).

import { h, plural } from "./dom.js";

const REFRESH_MS = 30_000;

function rule(schedule) {
  return schedule.cron ? `cron ${schedule.cron} (UTC)` : `every ${schedule.every_seconds} s`;
}

export class SchedulesPanel {
  #timer = 0;

  constructor({ api, sessionId }) {
    this.api = api;
    this.sessionId = sessionId;
    this.summary = h("summary", { class: "schedules-summary", text: "Schedules" });
    this.list = h("ul", { class: "schedule-list", "aria-label": "Schedules" });
    this.error = h("p", { class: "schedules-error", role: "alert", hidden: true });
    this.every = h("input", { class: "schedule-every", type: "number", min: "1", step: "1", value: "3600",
      "aria-label": "Every how many seconds" });
    this.cron = h("input", { class: "schedule-cron", type: "text", placeholder: "or cron, e.g. 0 9 * * 1-5",
      "aria-label": "Cron expression (UTC)" });
    this.text = h("input", { class: "schedule-text", type: "text", placeholder: "Input to submit…",
      "aria-label": "Input to submit" });
    this.form = h("form", { class: "schedule-form", onSubmit: (event) => {
      event.preventDefault();
      this.#add();
    } }, h("label", { text: "Every" }), this.every, h("span", { text: "s" }), this.cron, this.text,
    h("button", { class: "btn small", type: "submit", text: "Add" }));
    this.el = h("details", { class: "schedules", onToggle: () => this.#toggled() },
      this.summary, this.list, this.error, this.form);
    this.refresh();
  }

  #toggled() {
    clearInterval(this.#timer);
    if (!this.el.open) return;
    this.refresh();
    this.#timer = setInterval(() => this.refresh(), REFRESH_MS);
  }

  async refresh() {
    try {
      this.#show(await this.api.schedules(this.sessionId));
      this.error.hidden = true;
    } catch (failure) {
      this.#fail(failure);
    }
  }

  #show(schedules) {
    this.summary.textContent = schedules.length ? `Schedules · ${plural(schedules.length, "active one", "active")}`
      : "Schedules";
    this.list.replaceChildren(...schedules.map((schedule) => h("li", { class: "schedule",
      dataset: { scheduleId: schedule.schedule_id } },
    h("span", { class: "schedule-rule", text: rule(schedule) }),
    h("span", { class: "schedule-text", text: schedule.text, title: schedule.text }),
    h("span", { class: "schedule-next", text: `next ${new Date(schedule.next_due_at).toLocaleString()}` }),
    h("button", { class: "link-btn", type: "button", text: "Delete", "aria-label": `Delete schedule ${rule(schedule)}`,
      onClick: () => this.#delete(schedule.schedule_id) }))));
  }

  async #add() {
    const text = this.text.value.trim();
    if (!text) return;
    const cron = this.cron.value.trim();
    const body = cron ? { cron, text } : { every_seconds: Number(this.every.value), text };
    try {
      await this.api.createSchedule(this.sessionId, body);
      this.text.value = "";
      this.cron.value = "";
      await this.refresh();
    } catch (failure) {
      this.#fail(failure);
    }
  }

  async #delete(scheduleId) {
    try {
      await this.api.deleteSchedule(this.sessionId, scheduleId);
      await this.refresh();
    } catch (failure) {
      this.#fail(failure);
    }
  }

  #fail(failure) {
    this.error.textContent = `Schedules: ${failure?.message ?? failure}`;
    this.error.hidden = false;
  }

  destroy() {
    clearInterval(this.#timer);
  }
}
