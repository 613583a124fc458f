// Plugins in the console. Each active plugin with a `web` entry gets a slot in the sidebar;
// its stylesheet is linked and its entry module imported (both with ?v=<revision>, so a new
// revision is never served from the module cache), and the module's `mount` is called:
//
//   export function mount(root, kestrel) { …; return () => { /* optional cleanup */ }; }
//
// `root` is the plugin's own element. `kestrel` is { api, plugin, sessionId(), onSession(fn) }:
// `api` is the console's protocol client (api.get("/api/sessions"), api.post(…), api.stream(…)),
// `plugin` its PluginInfo, `sessionId()` the session on screen (or null), and `onSession(fn)`
// calls fn(id) whenever that changes. On `plugins.changed` from /api/plugins/events a plugin
// is unmounted (its cleanup called, its stylesheet removed) and loaded again at its new
// revision, with no page reload.

import { h } from "./dom.js";

export class Plugins {
  constructor(api, slots) {
    this.api = api;
    this.slots = slots;
    this.loaded = new Map(); // id → { cleanup, link, root, listeners }
    this.session = null;
    this.listeners = new Set();
  }

  start(infos) {
    for (const info of infos) this.load(info, info.web && info.web.revision);
    this.watch();
  }

  setSession(id) {
    this.session = id;
    for (const listener of this.listeners) {
      try { listener(id); } catch (error) { console.error(error); }
    }
  }

  watch() {
    const params = new URLSearchParams();
    if (this.api.token) params.set("token", this.api.token);
    const query = params.toString();
    const source = new EventSource(query ? `/api/plugins/events?${query}` : "/api/plugins/events");
    source.addEventListener("plugins.changed", async (message) => {
      let change;
      try { change = JSON.parse(message.data); } catch { return; }
      let infos;
      try { infos = (await this.api.get("/api/plugins")).plugins; } catch { return; }
      for (const { id, revision } of change.plugins) {
        const info = infos.find((p) => p.id === id);
        this.unload(id);
        if (info) this.load(info, revision);
      }
    });
  }

  async load(info, revision) {
    if (info.status !== "active" || !info.web || !info.web.entry) return;
    const version = revision ? `?v=${encodeURIComponent(revision)}` : `?v=${Date.now()}`;
    const root = h("section", { class: "plugin", dataset: { plugin: info.id }, "aria-label": info.name });
    this.slots.append(root);
    const entry = { root, cleanup: null, link: null };
    this.loaded.set(info.id, entry);
    if (info.web.stylesheet) {
      entry.link = h("link", { rel: "stylesheet", href: `${info.web.stylesheet}${version}`, dataset: { plugin: info.id } });
      document.head.append(entry.link);
    }
    try {
      const module = await import(`${info.web.entry}${version}`);
      const mount = module.mount || module.default;
      if (typeof mount !== "function") throw new Error("its entry module exports no mount function");
      const kestrel = {
        api: this.api,
        plugin: info,
        sessionId: () => this.session,
        onSession: (fn) => { this.listeners.add(fn); entry.listener = fn; },
      };
      const cleanup = await mount(root, kestrel);
      entry.cleanup = typeof cleanup === "function" ? cleanup : null;
    } catch (error) {
      root.append(h("p", { class: "error small" }, `Plugin ${info.name} failed to load: ${error.message}`));
    }
  }

  unload(id) {
    const entry = this.loaded.get(id);
    if (!entry) return;
    this.loaded.delete(id);
    if (entry.listener) this.listeners.delete(entry.listener);
    try { if (entry.cleanup) entry.cleanup(); } catch (error) { console.error(error); }
    if (entry.link) entry.link.remove();
    entry.root.remove();
  }
}
