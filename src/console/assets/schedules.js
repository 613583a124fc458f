// Scheduled runs (docs/schedules.md): the ones that send this session a message, with a form
// for a new one, and the tenant's others (those that make a new session each time); each can
// be run now, paused or resumed, and deleted.

import { h, clear, when, confirmDialog, toast } from "./dom.js";

export class SchedulesPanel {
  constructor(api, sessionId, container) {
    this.api = api;
    this.sessionId = sessionId;
    this.container = container;
  }

  async show() {
    let answer;
    try {
      answer = await this.api.get("/api/schedules");
    } catch (error) {
      clear(this.container).append(h("p", { class: "error pad" }, error.message));
      return;
    }
    const mine = answer.schedules.filter((s) => s.sessionId === this.sessionId);
    const others = answer.schedules.filter((s) => s.sessionId !== this.sessionId);
    clear(this.container).append(this.form(),
      h("h3", {}, "This session"), this.list(mine),
      h("h3", {}, "Every other schedule"), this.list(others));
  }

  form() {
    const zone = Intl.DateTimeFormat().resolvedOptions().timeZone || "UTC";
    const cron = h("input", { name: "cron", placeholder: "Cron: 0 9 * * 1-5", required: true, "aria-label": "Cron expression" });
    const timezone = h("input", { name: "timezone", value: zone, "aria-label": "Time zone" });
    const message = h("input", { name: "message", class: "grow", placeholder: "Message to send", required: true, "aria-label": "Message" });
    const catchUp = h("select", { name: "catchUp", "aria-label": "Fires missed while down" },
      h("option", { value: "none" }, "skip missed fires"), h("option", { value: "latest" }, "run the latest missed"));
    return h("form", { class: "row schedule-form", onsubmit: async (event) => {
      event.preventDefault();
      const body = { cron: cron.value.trim(), timezone: timezone.value.trim() || "UTC", sessionId: this.sessionId,
        message: message.value, catchUp: catchUp.value };
      try {
        await this.api.post("/api/schedules", body);
        await this.show();
      } catch (error) {
        toast(error.message, "error");
      }
    } }, cron, timezone, message, catchUp, h("button", { type: "submit", class: "primary" }, "Schedule"));
  }

  list(schedules) {
    const list = h("ul", { class: "schedules-list" });
    for (const schedule of schedules) {
      const target = schedule.sessionId ? "" : ` → a new session${schedule.session && schedule.session.title ? ` “${schedule.session.title}”` : ""}`;
      const next = schedule.paused ? "paused" : schedule.nextFireAt ? `next ${when(schedule.nextFireAt)}` : "no next fire";
      const action = (label, path) => h("button", { type: "button", class: "subtle", dataset: { action: path },
        onclick: () => this.act(schedule, path) }, label);
      list.append(h("li", { dataset: { id: schedule.id } },
        h("code", {}, schedule.cron), h("span", { class: "muted small" }, schedule.timezone),
        h("span", { class: "grow" }, `“${schedule.message.content}”${target}`),
        h("span", { class: "muted small next" }, next),
        action("Run now", "run"), schedule.paused ? action("Resume", "resume") : action("Pause", "pause"),
        h("button", { type: "button", class: "danger subtle", dataset: { action: "delete" }, onclick: () => this.remove(schedule) }, "Delete")));
    }
    if (!schedules.length) list.append(h("li", { class: "muted" }, "No schedules."));
    return list;
  }

  async act(schedule, path) {
    try {
      const answer = await this.api.post(`/api/schedules/${encodeURIComponent(schedule.id)}/${path}`);
      if (answer.fire) toast(answer.fire.outcome === "fired" ? "Sent." : `Skipped: ${answer.fire.reason}.`, answer.fire.outcome === "fired" ? "info" : "warn");
      await this.show();
    } catch (error) {
      toast(error.message, "error");
    }
  }

  async remove(schedule) {
    if (!(await confirmDialog(`Delete the schedule “${schedule.cron}”? It fires no more.`, "Delete"))) return;
    try {
      await this.api.remove(`/api/schedules/${encodeURIComponent(schedule.id)}`);
      await this.show();
    } catch (error) {
      toast(error.message, "error");
    }
  }
}
