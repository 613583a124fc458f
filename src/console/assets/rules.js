// Permission rules (docs/permissions.md): this session's own and its tenant's, each with the
// rule that says it, and a way to revoke the ones added through the API or remembered from an
// approval (the config file's are changed there).

import { h, clear, when, confirmDialog, toast } from "./dom.js";
import { ruleText } from "./transcript.js";

export class RulesPanel {
  constructor(api, base, container) {
    this.api = api;
    this.base = base;
    this.container = container;
  }

  async show() {
    let session, tenant;
    try {
      [session, tenant] = await Promise.all([this.api.get(`${this.base}/rules`), this.api.get("/api/rules")]);
    } catch (error) {
      clear(this.container).append(h("p", { class: "error pad" }, error.message));
      return;
    }
    clear(this.container).append(
      h("h3", {}, "This session"), this.list(session.rules, `${this.base}/rules`),
      h("h3", {}, "Every session"), this.list(tenant.rules, "/api/rules"));
  }

  list(rules, base) {
    const list = h("ul", { class: "rules-list" });
    for (const rule of rules) {
      const revoke = rule.source === "config" ? null
        : h("button", { type: "button", class: "subtle revoke", onclick: () => this.revoke(rule, base) }, "Revoke");
      list.append(h("li", { dataset: { id: rule.id, source: rule.source } },
        h("span", { class: `badge ${rule.outcome}` }, rule.outcome),
        h("span", { class: "grow" }, ruleText(rule)),
        h("span", { class: "muted small" }, [rule.createdBy, when(rule.createdAt)].filter(Boolean).join(" · ")),
        revoke));
    }
    if (!rules.length) list.append(h("li", { class: "muted" }, "No rules."));
    return list;
  }

  async revoke(rule, base) {
    if (!(await confirmDialog(`Revoke ${ruleText(rule)}? Calls it decided will be decided by the other rules again.`, "Revoke"))) return;
    try {
      await this.api.remove(`${base}/${encodeURIComponent(rule.id)}`);
      await this.show();
    } catch (error) {
      toast(error.message, "error");
    }
  }
}
