// One session: its header (rename, delete, status, Cancel / Resume), the conversation with a
// composer, the workspace browser and the checkpoints. The stream opens before the detail is
// fetched, so nothing published in between is lost; the transcript ignores what it already
// has, so replays and refetches are harmless.

import { encodeId } from "./api.js";
import { h, clear, confirmDialog, toast } from "./dom.js";
import { Transcript } from "./transcript.js";
import { WorkspaceBrowser } from "./workspace.js";
import { CheckpointsPanel } from "./checkpoints.js";
import { RulesPanel } from "./rules.js";
import { SchedulesPanel } from "./schedules.js";

const MAX_IMAGES = 6;

export class SessionView {
  constructor(api, container, id, bootstrap, { onGone, plugins }) {
    this.api = api;
    this.container = container;
    this.id = id;
    this.bootstrap = bootstrap;
    this.onGone = onGone;
    this.plugins = plugins;
    this.base = `/api/sessions/${encodeId(id)}`;
    this.summary = null;
    this.images = [];
    this.transcript = new Transcript(api, id, {
      onRewind: (message) => this.rewind(message),
      onFork: (message) => this.fork(message),
    });
    this.keydown = (event) => {
      if (event.key === "Escape" && this.summary && this.summary.status === "running" && !document.querySelector(".overlay")) this.cancel();
    };
  }

  async open() {
    this.layout();
    document.addEventListener("keydown", this.keydown);
    // The stream opens first, replaying the session's logged events from its start, so
    // nothing published before or while the detail is fetched is missed: a pending approval
    // and a run in progress are only in events. The transcript ignores what it already has.
    this.pending = [];
    this.stream = this.openStream(0);
    let detail;
    try {
      detail = (await this.api.get(this.base)).session;
    } catch (error) {
      this.stream.close();
      clear(this.container).append(h("section", { class: "welcome" }, h("p", { class: "error" }, error.message)));
      return;
    }
    this.show(detail);
    for (const envelope of this.pending) this.apply(envelope);
    this.pending = null;
    if (this.plugins) this.plugins.setSession(this.id);
  }

  // `from`: replay after that seq first (0: the whole stream), else live only.
  openStream(from) {
    return this.api.stream(`${this.base}/events`, {
      from,
      onEnvelope: (envelope) => (this.pending ? this.pending.push(envelope) : this.apply(envelope)),
      onReconnect: () => this.refetch(),
      onState: (state) => this.connection.classList.toggle("down", state !== "live"),
    });
  }

  close() {
    document.removeEventListener("keydown", this.keydown);
    if (this.stream) this.stream.close();
    if (this.plugins) this.plugins.setSession(null);
  }

  async refetch() {
    try {
      const detail = (await this.api.get(this.base)).session;
      this.show(detail);
    } catch (error) {
      if (error.status === 404) this.onGone();
    }
  }

  layout() {
    this.title = h("h1", { class: "session-title", title: "Click to rename", tabindex: "0",
      onclick: () => this.rename(), onkeydown: (e) => { if (e.key === "Enter") this.rename(); } });
    this.badge = h("span", { class: "badge" });
    this.facts = h("span", { class: "muted small facts" });
    this.connection = h("span", { class: "connection", title: "Live" });
    this.cancelButton = h("button", { type: "button", class: "cancel", hidden: true, onclick: () => this.cancel() }, "Cancel");
    this.resumeButton = h("button", { type: "button", class: "resume", hidden: true, onclick: () => this.resume() }, "Resume");
    const remove = h("button", { type: "button", class: "danger subtle", onclick: () => this.remove() }, "Delete");
    const header = h("header", { class: "session-header" },
      h("div", { class: "title-row" }, this.title, this.badge, this.connection),
      h("div", { class: "title-row" }, this.facts, h("span", { class: "spacer" }), this.resumeButton, this.cancelButton, remove));
    this.panels = {
      chat: h("div", { class: "panel chat" }),
      files: h("div", { class: "panel files", hidden: true }),
      checkpoints: h("div", { class: "panel checkpoints", hidden: true }),
      rules: h("div", { class: "panel rules", hidden: true }),
      schedules: h("div", { class: "panel schedules", hidden: true }),
    };
    const tabs = h("div", { class: "tabs", role: "tablist" },
      ["chat", "files", "checkpoints", "rules", "schedules"].map((name) => h("button", { type: "button", role: "tab", class: name === "chat" ? "tab current" : "tab",
        dataset: { tab: name }, onclick: (e) => this.tab(name, e.currentTarget) }, name[0].toUpperCase() + name.slice(1))));
    const scroller = h("div", { class: "scroller" }, this.transcript.element);
    this.panels.chat.append(scroller, this.composer());
    clear(this.container).append(h("section", { class: "session" }, header, tabs, ...Object.values(this.panels)));
  }

  tab(name, button) {
    for (const [key, panel] of Object.entries(this.panels)) panel.hidden = key !== name;
    for (const tab of this.container.querySelectorAll(".tab")) tab.classList.toggle("current", tab === button);
    if (name === "files") {
      this.files = this.files || new WorkspaceBrowser(this.api, this.base, this.panels.files);
      this.files.show(".");
    }
    if (name === "checkpoints") {
      this.checkpoints = this.checkpoints || new CheckpointsPanel(this.api, this.base, this.panels.checkpoints);
      this.checkpoints.show();
    }
    if (name === "rules") {
      this.rules = this.rules || new RulesPanel(this.api, this.base, this.panels.rules);
      this.rules.show();
    }
    if (name === "schedules") {
      this.schedules = this.schedules || new SchedulesPanel(this.api, this.id, this.panels.schedules);
      this.schedules.show();
    }
  }

  composer() {
    this.input = h("textarea", { class: "input", rows: "2", placeholder: "Message — Enter sends, Shift+Enter for a new line, Esc cancels a run",
      "aria-label": "Message", onkeydown: (event) => {
        if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
          event.preventDefault();
          this.send();
        }
      } });
    this.attached = h("div", { class: "attached" });
    const picker = h("input", { type: "file", accept: "image/png,image/jpeg,image/webp,image/gif", multiple: true, hidden: true,
      onchange: (event) => this.attach(event.target) });
    this.sendButton = h("button", { type: "submit", class: "primary send" }, "Send");
    return h("form", { class: "composer", onsubmit: (event) => { event.preventDefault(); this.send(); } },
      this.attached,
      h("div", { class: "row" },
        this.input,
        h("div", { class: "composer-buttons" },
          h("button", { type: "button", class: "subtle", title: "Attach images", onclick: () => picker.click() }, "Image"),
          this.sendButton)),
      picker);
  }

  async attach(picker) {
    for (const file of [...picker.files].slice(0, MAX_IMAGES - this.images.length)) {
      const data = await new Promise((resolve) => {
        const reader = new FileReader();
        reader.onload = () => resolve(String(reader.result));
        reader.readAsDataURL(file);
      });
      // The server strips the data: prefix itself.
      this.images.push({ mimeType: file.type, data, name: file.name.slice(0, 120) });
    }
    picker.value = "";
    this.showAttached();
  }

  showAttached() {
    clear(this.attached);
    this.images.forEach((image, index) => this.attached.append(h("span", { class: "chip" }, image.name,
      h("button", { type: "button", class: "link", "aria-label": `Remove ${image.name}`, onclick: () => { this.images.splice(index, 1); this.showAttached(); } }, "×"))));
  }

  async send() {
    const content = this.input.value;
    if (!content.trim() && !this.images.length) return;
    const body = { content };
    if (this.images.length) body.images = this.images;
    this.sendButton.disabled = true;
    try {
      await this.api.post(`${this.base}/messages`, body);
      this.input.value = "";
      this.images = [];
      this.showAttached();
    } catch (error) {
      toast(error.code === "session_busy" ? "A run is still going: wait for it, or cancel it." : error.message, "error");
    } finally {
      this.sendButton.disabled = false;
    }
  }

  async cancel() {
    try {
      await this.api.post(`${this.base}/cancel`);
    } catch (error) {
      toast(error.message, "error");
    }
  }

  async resume() {
    try {
      await this.api.post(`${this.base}/resume`);
    } catch (error) {
      toast(error.message, "error");
    }
  }

  async rename() {
    const input = h("input", { class: "rename", value: this.summary.title, maxlength: "200", "aria-label": "Title" });
    const save = async () => {
      const title = input.value.trim();
      input.replaceWith(this.title);
      if (!title || title === this.summary.title) return;
      try {
        this.show((await this.api.patch(this.base, { title })).session);
      } catch (error) {
        toast(error.message, "error");
      }
    };
    input.addEventListener("keydown", (e) => {
      if (e.key === "Enter") save();
      if (e.key === "Escape") input.replaceWith(this.title);
    });
    input.addEventListener("blur", save, { once: true });
    this.title.replaceWith(input);
    input.focus();
    input.select();
  }

  async remove() {
    if (!(await confirmDialog(`Delete “${this.summary.title}” and its transcript? This cannot be undone.`))) return;
    try {
      await this.api.remove(this.base);
      this.onGone();
    } catch (error) {
      toast(error.message, "error");
    }
  }

  async rewind(message) {
    const restore = h("input", { type: "checkbox", checked: true });
    const chosen = await confirmWith("Drop this message and everything after it?",
      h("label", { class: "check" }, restore, "Also put the workspace's files back as they were"), "Rewind", "danger");
    if (!chosen) return;
    try {
      const answer = await this.api.post(`${this.base}/rewind`, { messageId: message.id, restoreFiles: restore.checked });
      this.transcript.load(answer.messages);
      toast(answer.restored ? `Rewound; files restored (safety checkpoint ${answer.safety.id}).` : "Rewound.");
      if (answer.warning) toast(answer.warning, "warn");
      this.input.value = message.content;
    } catch (error) {
      toast(error.message, "error");
    }
  }

  // A new session with the conversation up to `message`, in this workspace or a copy of its
  // files as they were then; the console moves to it.
  async fork(message) {
    const copy = h("input", { type: "checkbox" });
    const chosen = await confirmWith("Start a new session with the conversation up to this message?",
      h("label", { class: "check" }, copy, "Work in a copy of the files as they were then"), "Fork", "primary");
    if (!chosen) return;
    try {
      const body = { messageId: message.id, workspace: copy.checked ? "copy" : "share" };
      const answer = await this.api.post(`${this.base}/fork`, body);
      toast(copy.checked ? `Forked into ${answer.session.workspace}.` : "Forked.");
      if (answer.warning) toast(answer.warning, "warn");
      location.hash = `#/s/${answer.session.id}`;
    } catch (error) {
      toast(error.message, "error");
    }
  }

  // The summary (header, buttons) and the stored history.
  show(detail) {
    this.shownAt = detail.updatedAt;
    this.summarize(detail);
    this.transcript.load(detail.messages || []);
  }

  summarize(summary) {
    this.summary = summary;
    this.title.textContent = summary.title || "Untitled";
    this.badge.className = `badge ${summary.status}`;
    this.badge.textContent = summary.status;
    this.facts.textContent = `${summary.model} · ${summary.workspace}`;
    this.cancelButton.hidden = summary.status !== "running";
    this.resumeButton.hidden = !["interrupted", "error"].includes(summary.status);
    this.sendButton.disabled = false;
  }

  apply(envelope) {
    const event = envelope.event;
    const t = this.transcript;
    // The ends of runs and notices from before the detail was read are history it shows.
    const old = this.shownAt && envelope.at && envelope.at <= this.shownAt;
    if (old && ["run.finished", "run.failed", "notice"].includes(event.type)) return undefined;
    switch (event.type) {
      case "session.updated": return this.summarize({ ...this.summary, ...event.session });
      case "message.started": return t.started(event.message);
      case "message.delta": return t.delta(event.messageId, event.channel, event.delta);
      case "message.completed": return t.completed(event.message);
      case "tool.started": return t.toolStarted(event.call, event.permission);
      case "tool.finished": return t.toolFinished(event.result);
      case "approval.requested": return t.approvalRequested(event.approval);
      case "approval.resolved": return t.approvalResolved(event.approvalId, event.approved, event.arguments);
      case "run.finished": return t.runFinished(event);
      case "run.failed": return t.runFailed(event);
      case "session.rewound": return t.load(event.messages);
      case "context.compacted": return this.refetch();
      case "notice": return t.notice(event);
      case "session.deleted": return this.onGone();
      default: return undefined;
    }
  }
}

// A dialog asking `question`, with `option` (a checkbox's label) under it: whether `action`
// was chosen.
function confirmWith(question, option, action, actionClass) {
  return new Promise((resolve) => {
    const done = (answer) => { overlay.remove(); resolve(answer); };
    const overlay = h("div", { class: "overlay" }, h("div", { class: "dialog" },
      h("p", {}, question),
      option,
      h("div", { class: "row end" },
        h("button", { type: "button", onclick: () => done(false) }, "Cancel"),
        h("button", { type: "button", class: actionClass, onclick: () => done(true) }, action))));
    document.body.append(overlay);
  });
}
