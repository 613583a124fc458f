// A session's conversation as it is stored and as it streams: messages by id (so a replayed
// event or a refetched detail never shows anything twice), deltas accumulated until
// message.completed replaces them, tool calls as cards that get their result and their
// approval in place, and each run's ending.

import { h, clear } from "./dom.js";
import { renderMarkdown } from "./markdown.js";

export class Transcript {
  constructor(api, sessionId, { onRewind, onFork }) {
    this.api = api;
    this.sessionId = sessionId;
    this.onRewind = onRewind;
    this.onFork = onFork;
    this.element = h("div", { class: "transcript", role: "log", "aria-live": "polite" });
    this.messages = new Map(); // id → { element, completed }
    this.cards = new Map(); // call id → ToolCard
    this.streaming = new Map(); // message id → { text, reasoning, element }
  }

  // The stored history, replacing whatever is shown.
  load(messages) {
    clear(this.element);
    this.messages.clear();
    this.cards.clear();
    this.streaming.clear();
    for (const message of messages) if (!message.hidden) this.completed(message);
  }

  started(message) {
    if (this.messages.has(message.id) || message.role !== "assistant") return;
    const body = h("div", { class: "content streaming" });
    const reasoning = h("details", { class: "reasoning", hidden: true }, h("summary", {}, "Reasoning"), h("div", { class: "reasoning-text" }));
    const element = h("article", { class: "message assistant", dataset: { id: message.id } }, reasoning, body);
    this.messages.set(message.id, { element, completed: false });
    this.streaming.set(message.id, { text: "", reasoning: "", body, reasoningBox: reasoning });
    this.add(element);
  }

  delta(messageId, channel, delta) {
    if (!this.messages.has(messageId)) this.started({ id: messageId, role: "assistant" });
    const entry = this.messages.get(messageId);
    const live = this.streaming.get(messageId);
    if (!live || entry.completed) return;
    if (channel === "reasoning") {
      live.reasoning += delta;
      live.reasoningBox.hidden = false;
      live.reasoningBox.querySelector(".reasoning-text").textContent = live.reasoning;
    } else {
      live.text += delta;
      live.body.textContent = live.text;
    }
    this.follow();
  }

  // message.completed: authoritative, replaces what was accumulated.
  completed(message) {
    if (message.hidden) return;
    if (message.role === "tool") return this.toolMessage(message);
    const previous = this.messages.get(message.id);
    const element = this.render(message);
    this.streaming.delete(message.id);
    this.messages.set(message.id, { element, completed: true });
    if (previous) previous.element.replaceWith(element);
    else this.add(element);
  }

  render(message) {
    const element = h("article", { class: `message ${message.role}`, dataset: { id: message.id } });
    if (message.role === "user") {
      element.append(h("div", { class: "who" }, "You",
        h("button", { type: "button", class: "link small rewind", title: "Drop this message and everything after it",
          onclick: () => this.onRewind(message) }, "Rewind to here")));
    }
    const fork = h("button", { type: "button", class: "link small fork", title: "A new session with the conversation up to here",
      onclick: () => this.onFork(message) }, "Fork from here");
    if (message.role === "assistant") element.append(h("div", { class: "who" }, "Agent", fork));
    else if (message.role === "user") element.querySelector(".who").append(fork);
    if (message.reasoning) {
      element.append(h("details", { class: "reasoning" }, h("summary", {}, "Reasoning"), h("div", { class: "reasoning-text" }, message.reasoning)));
    }
    if (message.content) element.append(h("div", { class: "content" }, renderMarkdown(message.content)));
    for (const image of message.images || []) {
      element.append(h("img", { class: "attachment", alt: image.name || "image", src: `data:${image.mimeType};base64,${image.data}` }));
    }
    for (const call of message.toolCalls || []) {
      const card = this.card(call);
      element.append(card.element);
    }
    return element;
  }

  card(call) {
    let card = this.cards.get(call.id);
    if (!card) {
      card = new ToolCard(call, this);
      this.cards.set(call.id, card);
    }
    return card;
  }

  // tool.started: the card exists already when the assistant message completed first.
  toolStarted(call, permission) {
    const known = this.cards.has(call.id);
    const card = this.card(call);
    card.decided(permission);
    card.running();
    if (!known) this.add(card.element);
  }

  toolFinished(result) {
    const card = this.cards.get(result.callId) || this.card({ id: result.callId, name: result.name, arguments: {} });
    if (!card.element.isConnected) this.add(card.element);
    card.result(result);
  }

  toolMessage(message) {
    if (!message.toolCallId) return;
    const card = this.cards.get(message.toolCallId);
    const meta = message.meta || {};
    if (card) card.decided(meta.permission, meta.editedArguments);
    if (card && card.done) return;
    this.toolFinished({ callId: message.toolCallId, name: message.toolName || "tool", ok: null, content: message.content });
  }

  approvalRequested(approval) {
    const card = this.card({ id: approval.callId, name: approval.toolName, arguments: approval.arguments });
    if (!card.element.isConnected) this.add(card.element);
    card.ask(approval);
    this.follow();
  }

  approvalResolved(approvalId, approved, edited) {
    for (const card of this.cards.values()) card.resolved(approvalId, approved, edited);
  }

  runFinished(event) {
    const usage = event.usage;
    const endings = { completed: "Done", cancelled: "Cancelled", budget_exceeded: "Stopped: the budget is spent" };
    const parts = [endings[event.status] || "Stopped at the step limit"];
    if (usage) parts.push(`${usage.inputTokens} in · ${usage.outputTokens} out tokens`);
    this.add(h("div", { class: `run-end ${event.status}`, dataset: { run: event.runId } }, parts.join(" — ")));
  }

  runFailed(event) {
    this.add(h("div", { class: "run-end failed", role: "alert", dataset: { run: event.runId } }, `The run failed: ${event.error}`));
  }

  notice(event) {
    this.add(h("div", { class: `notice ${event.level}` }, event.message));
  }

  add(element) {
    this.element.append(element);
    this.follow();
  }

  // Keeps the newest in view while the reader is at the bottom.
  follow() {
    const scroller = this.element.parentElement;
    if (!scroller) return;
    if (scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight < 160) scroller.scrollTop = scroller.scrollHeight;
  }
}

// A tool call: its arguments (a diff for edit_file, the command for run_command), its result,
// and an approval to give while it waits for one.
class ToolCard {
  constructor(call, transcript) {
    this.call = call;
    this.transcript = transcript;
    this.done = false;
    this.status = h("span", { class: "tool-status" }, "");
    this.rule = h("div", { class: "tool-rule muted small", hidden: true });
    this.edited = h("div", { class: "tool-edited", hidden: true });
    this.approvalBox = h("div", { class: "approval", hidden: true });
    this.output = h("div", { class: "tool-output", hidden: true });
    this.element = h("section", { class: "tool", dataset: { call: call.id, tool: call.name } },
      h("header", {}, h("span", { class: "tool-name" }, call.name), this.status),
      argumentsView(call),
      this.rule,
      this.edited,
      this.approvalBox,
      this.output);
  }

  running() {
    if (!this.done) this.status.textContent = "running…";
  }

  // Which rule decided the call (or the tool's own permission), and a person's edit.
  decided(permission, editedArguments) {
    if (permission) {
      const verbs = { allow: "Allowed", ask: "Asked", deny: "Denied" };
      const by = permission.rule ? ruleText(permission.rule) : "the tool's own permission";
      clear(this.rule).append(`${verbs[permission.outcome] || permission.outcome} by ${by}`);
      this.rule.hidden = false;
      this.element.dataset.outcome = permission.outcome;
    }
    if (editedArguments) this.showEdit(editedArguments);
  }

  showEdit(args) {
    clear(this.edited).append(h("div", { class: "muted small" }, "Ran with arguments edited by a person:"),
      argumentsView({ name: this.call.name, arguments: args }));
    this.edited.hidden = false;
  }

  result(result) {
    this.done = true;
    this.status.textContent = result.ok === false ? "failed" : result.ok === true ? "done" : "";
    this.element.classList.toggle("failed", result.ok === false);
    clear(this.output).hidden = false;
    const text = result.error && !result.content ? result.error : result.content || "";
    this.output.append(h("pre", { class: "output" }, text));
  }

  ask(approval) {
    this.approvalId = approval.id;
    this.status.textContent = "waiting for approval";
    const note = h("input", { class: "note", placeholder: "Note (optional)", "aria-label": "Note" });
    const editor = h("textarea", { class: "edit-arguments", rows: "4", hidden: true, "aria-label": "Edited arguments (JSON)" });
    editor.value = JSON.stringify(approval.arguments || {}, null, 2);
    const decide = async (approved, remember) => {
      for (const button of this.approvalBox.querySelectorAll("button")) button.disabled = true;
      const body = { approved };
      if (note.value.trim()) body.note = note.value.trim();
      if (remember) body.remember = remember;
      if (approved && !editor.hidden) {
        try {
          body.arguments = JSON.parse(editor.value);
        } catch (error) {
          for (const button of this.approvalBox.querySelectorAll("button")) button.disabled = false;
          this.approvalBox.append(h("p", { class: "error" }, `The arguments are not JSON: ${error.message}`));
          return;
        }
      }
      try {
        await this.transcript.api.post(`/api/sessions/${this.transcript.sessionId}/approvals/${approval.id}`, body);
        this.resolved(approval.id, approved, body.arguments);
      } catch (error) {
        for (const button of this.approvalBox.querySelectorAll("button")) button.disabled = false;
        this.approvalBox.append(h("p", { class: "error" }, error.message));
      }
    };
    clear(this.approvalBox).hidden = false;
    const why = approval.rule ? `, as ${ruleText(approval.rule)} says` : "";
    if (approval.withheld) {
      // Paths the call's walk withheld: approving runs it again with exactly these; such an
      // approval is neither remembered nor edited.
      this.approvalBox.append(
        h("p", {}, `${approval.toolName} withheld ${approval.withheld.length} path(s)${why}. Approve to run it again with them:`),
        h("ul", { class: "withheld" }, ...approval.withheld.map((path) => h("li", {}, h("code", {}, path)))),
        note,
        h("div", { class: "row" },
          h("button", { type: "button", class: "primary approve", onclick: () => decide(true) }, "Allow these paths"),
          h("button", { type: "button", class: "danger deny", onclick: () => decide(false) }, "Keep them withheld")));
      return;
    }
    this.approvalBox.append(
      h("p", {}, `${approval.toolName} needs your approval${why}.`),
      note,
      editor,
      h("div", { class: "row" },
        h("button", { type: "button", class: "primary approve", onclick: () => decide(true) }, "Approve"),
        h("button", { type: "button", class: "remember", title: "Approve, and approve this same call again in this session without asking",
          onclick: () => decide(true, "session") }, "Allow for this session"),
        h("button", { type: "button", class: "subtle edit", onclick: () => { editor.hidden = !editor.hidden; } }, "Edit arguments"),
        h("button", { type: "button", class: "danger deny", onclick: () => decide(false) }, "Deny")));
  }

  resolved(approvalId, approved, edited) {
    if (this.approvalId !== approvalId) return;
    this.approvalId = null;
    const text = approved ? (edited ? "Approved with edited arguments" : "Approved") : "Denied";
    clear(this.approvalBox).append(h("p", { class: approved ? "approved" : "denied" }, text));
    if (edited) this.showEdit(edited);
    if (!this.done) this.status.textContent = approved ? "running…" : "denied";
  }
}

// A rule, for people: `deny rm * (server rule)`.
export function ruleText(rule) {
  const pattern = rule.match ? ` ${rule.match}` : "";
  const whose = rule.source === "remembered" ? "remembered" : rule.scope;
  return `rule “${rule.outcome} ${rule.tool}${pattern}” (${whose})`;
}

function argumentsView(call) {
  const args = call.arguments || {};
  if (call.name === "edit_file" && typeof args.oldString === "string" && typeof args.newString === "string") {
    const diff = h("pre", { class: "diff" });
    diff.append(h("div", { class: "file" }, args.path || ""));
    for (const line of args.oldString.split("\n")) diff.append(h("div", { class: "del" }, `- ${line}`));
    for (const line of args.newString.split("\n")) diff.append(h("div", { class: "add" }, `+ ${line}`));
    return diff;
  }
  if (call.name === "run_command" && typeof args.command === "string") {
    return h("pre", { class: "command" }, `$ ${args.command}`);
  }
  if (call.name === "write_file" && typeof args.content === "string") {
    return h("div", {}, h("div", { class: "file" }, args.path || ""), h("pre", { class: "args" }, args.content));
  }
  return h("pre", { class: "args" }, JSON.stringify(args, null, 2));
}
