// Checkpoints: the list (or why they are off), taking one, and restoring one, which first
// takes a safety checkpoint that can itself be restored.

import { h, clear, when, bytes, confirmDialog, toast } from "./dom.js";

export class CheckpointsPanel {
  constructor(api, base, container) {
    this.api = api;
    this.base = base;
    this.container = container;
  }

  async show() {
    let answer;
    try {
      answer = await this.api.get(`${this.base}/checkpoints`);
    } catch (error) {
      clear(this.container).append(h("p", { class: "error pad" }, error.message));
      return;
    }
    const label = h("input", { placeholder: "Label (optional)", maxlength: "200", "aria-label": "Checkpoint label" });
    const take = h("form", { class: "row", onsubmit: async (event) => {
      event.preventDefault();
      try {
        await this.api.post(`${this.base}/checkpoints`, label.value.trim() ? { label: label.value.trim() } : {});
        this.show();
      } catch (error) {
        toast(error.message, "error");
      }
    } }, label, h("button", { type: "submit", class: "primary" }, "Take a checkpoint"));
    const list = h("ul", { class: "checkpoints-list" });
    for (const checkpoint of [...answer.checkpoints].reverse()) {
      list.append(h("li", { dataset: { id: checkpoint.id } },
        h("span", { class: `badge ${checkpoint.kind}` }, checkpoint.kind),
        h("span", { class: "grow" }, checkpoint.label || checkpoint.id),
        h("span", { class: "muted small" }, `${checkpoint.fileCount} files · ${bytes(checkpoint.totalBytes)} · ${when(checkpoint.createdAt)}`),
        h("button", { type: "button", class: "subtle", onclick: () => this.restore(checkpoint) }, "Restore")));
    }
    if (!answer.checkpoints.length) list.append(h("li", { class: "muted" }, "No checkpoints yet."));
    this.status = h("div", { class: "restore-status" });
    clear(this.container).append(
      answer.enabled ? take : h("p", { class: "notice warn" }, `Checkpoints are off: ${answer.reason || "no reason given"}`),
      this.status, list);
  }

  async restore(checkpoint) {
    if (!(await confirmDialog(`Put the workspace back as it was at “${checkpoint.label || checkpoint.id}”? A safety checkpoint of the current files is taken first.`, "Restore"))) return;
    try {
      const answer = await this.api.post(`${this.base}/checkpoints/${checkpoint.id}/restore`);
      await this.show();
      clear(this.status).append(h("p", { class: "notice info" },
        `Restored ${answer.restored.label || answer.restored.id}. The files from before are in the safety checkpoint ${answer.safety.id}.`,
        answer.warning ? ` ${answer.warning}` : ""));
    } catch (error) {
      toast(error.message, "error");
    }
  }
}
