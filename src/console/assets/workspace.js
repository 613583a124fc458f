// The session's workspace, read-only: a directory at a time, and a file with line numbers (an
// image shown, a binary described).

import { encodeId } from "./api.js";
import { h, clear, bytes, when } from "./dom.js";

export class WorkspaceBrowser {
  constructor(api, base, container) {
    this.api = api;
    this.base = base;
    this.container = container;
  }

  async show(path) {
    let listing;
    try {
      listing = await this.api.get(`${this.base}/files?path=${encodeId(path)}`);
    } catch (error) {
      clear(this.container).append(h("p", { class: "error pad" }, error.message));
      return;
    }
    const list = h("ul", { class: "tree" });
    if (listing.path !== ".") {
      const parent = listing.path.includes("/") ? listing.path.slice(0, listing.path.lastIndexOf("/")) : ".";
      list.append(h("li", {}, h("button", { type: "button", class: "link dir", onclick: () => this.show(parent) }, "..")));
    }
    for (const entry of listing.entries) {
      const open = entry.type === "directory" ? () => this.show(entry.path) : () => this.file(entry.path);
      list.append(h("li", {},
        h("button", { type: "button", class: `link ${entry.type === "directory" ? "dir" : "file"}`, dataset: { path: entry.path }, onclick: open },
          entry.type === "directory" ? `${entry.name}/` : entry.name),
        h("span", { class: "muted small" }, entry.type === "file" ? ` ${bytes(entry.size)} · ${when(entry.modifiedAt)}` : "")));
    }
    if (!listing.entries.length) list.append(h("li", { class: "muted" }, "(empty)"));
    this.viewer = h("div", { class: "viewer" });
    clear(this.container).append(
      h("div", { class: "files-layout" },
        h("div", { class: "files-list" },
          h("div", { class: "row" }, h("strong", { class: "path" }, listing.path),
            h("button", { type: "button", class: "subtle small", onclick: () => this.show(listing.path) }, "Refresh")),
          list,
          listing.truncated ? h("p", { class: "muted small" }, "Only the first 500 entries are shown.") : null),
        this.viewer));
  }

  async file(path) {
    let file;
    try {
      file = await this.api.get(`${this.base}/file?path=${encodeId(path)}`);
    } catch (error) {
      clear(this.viewer).append(h("p", { class: "error" }, error.message));
      return;
    }
    const header = h("div", { class: "row" }, h("strong", {}, file.path),
      h("span", { class: "muted small" }, ` ${file.mimeType} · ${bytes(file.size)}${file.truncated ? " · truncated" : ""}`));
    clear(this.viewer).append(header);
    if (file.encoding === "utf8" && !file.binary) {
      const lines = file.content.split("\n");
      if (lines.length > 1 && lines[lines.length - 1] === "") lines.pop();
      const table = h("table", { class: "numbered" });
      lines.forEach((line, index) => table.append(h("tr", {}, h("td", { class: "ln" }, String(index + 1)), h("td", { class: "text" }, line))));
      this.viewer.append(h("div", { class: "code-view" }, table));
    } else if (file.mimeType.startsWith("image/") && file.encoding === "base64") {
      this.viewer.append(h("img", { class: "preview", alt: file.name, src: `data:${file.mimeType};base64,${file.content}` }));
    } else {
      this.viewer.append(h("p", { class: "muted" }, `A binary file (${file.mimeType}, ${bytes(file.size)}): not shown.`));
    }
  }
}
