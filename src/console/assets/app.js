// The console's shell: the token prompt, the session list (live from /api/events), creating a
// session, and the session view for the session in the address (#/s/<id>).

import { Api, ApiError } from "./api.js";
import { h, clear, when, toast } from "./dom.js";
import { SessionView } from "./session.js";
import { Plugins } from "./plugins.js";

const api = new Api();
const app = document.getElementById("app");
const state = { bootstrap: null, sessions: [], nextCursor: null, view: null, stream: null, plugins: null };

// The sidebar loads sessions a page at a time, most recently updated first.
const PAGE = 100;

async function start() {
  try {
    state.bootstrap = await api.get("/api/bootstrap");
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) return askToken(api.token ? "That token was refused." : "");
    clear(app).append(h("p", { class: "boot error" }, `Kestrel is not reachable: ${error.message}`));
    return;
  }
  layout();
  // The list is fetched once the stream is live (and again after each reconnection), so a
  // session made between the fetch and the stream's start is never missed.
  state.stream = api.stream("/api/events", {
    onEnvelope: (envelope) => onEvent(envelope.event),
    onOpen: refreshSessions,
  });
  state.plugins = new Plugins(api, document.getElementById("plugin-slots"));
  state.plugins.start(state.bootstrap.plugins || []);
  window.addEventListener("hashchange", route);
  route();
}

function askToken(problem) {
  const input = h("input", { type: "password", name: "token", placeholder: "Token", autocomplete: "current-password", required: true });
  const form = h("form", { class: "login", onsubmit: (event) => {
    event.preventDefault();
    api.setToken(input.value.trim());
    start();
  } },
  h("h1", {}, "Kestrel"),
  h("p", {}, "This server needs a token."),
  problem ? h("p", { class: "error" }, problem) : null,
  input,
  h("button", { type: "submit", class: "primary" }, "Sign in"));
  clear(app).append(form);
  input.focus();
}

function layout() {
  const sidebar = h("aside", { class: "sidebar" },
    h("header", { class: "brand" },
      h("span", { class: "logo", "aria-hidden": "true" }),
      h("strong", {}, state.bootstrap.name || "Kestrel"),
      h("span", { class: "muted small" }, `v${state.bootstrap.version} · protocol ${state.bootstrap.protocol}`)),
    sandboxNotice(state.bootstrap.sandbox),
    h("button", { type: "button", class: "primary wide", id: "new-session", onclick: newSessionDialog }, "New session"),
    h("nav", { id: "session-list", "aria-label": "Sessions" }),
    h("div", { id: "plugin-slots", class: "plugin-slots" }),
    api.token ? h("button", { type: "button", class: "link small", onclick: () => { api.setToken(""); location.reload(); } }, "Sign out") : null);
  const main = h("main", { id: "main" });
  clear(app).append(h("div", { class: "shell" }, sidebar, main));
}

// Commands that run unsandboxed are said, never silent (docs/sandbox.md): a warning when the
// server could not give the sandbox it was asked for, a note when its operator turned it off.
function sandboxNotice(sandbox) {
  if (!sandbox || sandbox.mode !== "off") return null;
  const fellBack = sandbox.requested !== "off";
  const why = fellBack ? (sandbox.reason || "bubblewrap cannot run on this host") : "the server's config turns the sandbox off";
  return h("p", { class: `notice small ${fellBack ? "warn" : "info"}`, id: "sandbox-notice", role: "status" },
    `Commands run unsandboxed: ${why}.`);
}

async function refreshSessions() {
  try {
    const page = await api.get(`/api/sessions?limit=${PAGE}`);
    state.sessions = page.sessions || [];
    state.nextCursor = page.nextCursor || null;
  } catch (error) {
    toast(error.message, "error");
  }
  renderSessions();
}

// The next page of the walk; a session an event already brought in is not listed twice.
async function loadMoreSessions() {
  if (!state.nextCursor) return;
  try {
    const page = await api.get(`/api/sessions?limit=${PAGE}&cursor=${encodeURIComponent(state.nextCursor)}`);
    const known = new Set(state.sessions.map((s) => s.id));
    state.sessions.push(...(page.sessions || []).filter((s) => !known.has(s.id)));
    state.nextCursor = page.nextCursor || null;
  } catch (error) {
    // An expired walk starts again from the top.
    if (error.code === "invalid_cursor") return refreshSessions();
    toast(error.message, "error");
  }
  renderSessions();
}

function onEvent(event) {
  if (event.type === "session.updated") {
    const at = state.sessions.findIndex((s) => s.id === event.sessionId);
    if (at >= 0) state.sessions[at] = event.session;
    else state.sessions.push(event.session);
    state.sessions.sort((a, b) => (a.updatedAt < b.updatedAt ? 1 : -1));
    renderSessions();
  } else if (event.type === "session.deleted") {
    state.sessions = state.sessions.filter((s) => s.id !== event.sessionId);
    renderSessions();
    if (currentId() === event.sessionId) location.hash = "";
  }
}

function renderSessions() {
  const list = document.getElementById("session-list");
  if (!list) return;
  clear(list);
  if (!state.sessions.length) list.append(h("p", { class: "muted small pad" }, "No sessions yet."));
  for (const session of state.sessions) {
    list.append(h("a", {
      href: `#/s/${session.id}`,
      class: `session-link${currentId() === session.id ? " current" : ""}`,
      dataset: { id: session.id },
    },
    h("span", { class: "title" }, session.title || "Untitled"),
    h("span", { class: "meta" },
      h("span", { class: `badge ${session.status}` }, session.status),
      h("span", { class: "muted" }, `${session.messageCount} msgs · ${when(session.updatedAt)}`))));
  }
  if (state.nextCursor) {
    list.append(h("button", { type: "button", class: "link small pad", id: "more-sessions", onclick: loadMoreSessions }, "Load more"));
  }
}

function currentId() {
  const match = location.hash.match(/^#\/s\/([\w-]+)/);
  return match ? match[1] : null;
}

function route() {
  if (state.view) state.view.close();
  state.view = null;
  renderSessions();
  const main = document.getElementById("main");
  const id = currentId();
  if (!id) {
    clear(main).append(h("section", { class: "welcome" },
      h("h2", {}, "Welcome"),
      h("p", {}, "Pick a session on the left, or start a new one."),
      h("p", { class: "muted" }, "With the built-in model builtin/echo, a line like /tool list_directory {\"path\":\".\"} calls a tool.")));
    return;
  }
  state.view = new SessionView(api, main, id, state.bootstrap, {
    onGone: () => { location.hash = ""; },
    plugins: state.plugins,
  });
  state.view.open();
}

function newSessionDialog() {
  const models = state.bootstrap.models || [];
  const model = h("select", { name: "model" }, models.map((m) => h("option", { value: m.id }, m.label ? `${m.label} (${m.id})` : m.id)));
  const title = h("input", { name: "title", placeholder: "Title (optional)", maxlength: "200" });
  const prompt = h("textarea", { name: "systemPrompt", rows: "3", placeholder: "System prompt (optional)" });
  const workspace = h("input", { name: "workspace", placeholder: "Workspace: an absolute path (optional)" });
  const problem = h("p", { class: "error", hidden: true });
  const close = () => overlay.remove();
  const form = h("form", { class: "dialog", onsubmit: async (event) => {
    event.preventDefault();
    const body = { model: model.value };
    if (title.value.trim()) body.title = title.value.trim();
    if (prompt.value.trim()) body.systemPrompt = prompt.value;
    if (workspace.value.trim()) body.workspace = workspace.value.trim();
    try {
      const created = await api.post("/api/sessions", body);
      close();
      location.hash = `#/s/${created.session.id}`;
    } catch (error) {
      problem.hidden = false;
      problem.textContent = error.message;
    }
  } },
  h("h2", {}, "New session"),
  h("label", {}, "Model", model),
  title, prompt, workspace, problem,
  h("div", { class: "row end" },
    h("button", { type: "button", onclick: close }, "Cancel"),
    h("button", { type: "submit", class: "primary" }, "Create")));
  const overlay = h("div", { class: "overlay", onkeydown: (e) => { if (e.key === "Escape") close(); } }, form);
  document.body.append(overlay);
  title.focus();
}

start();
