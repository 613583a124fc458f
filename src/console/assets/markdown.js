// Markdown to DOM, safely: the renderer builds elements and text nodes only, never HTML from
// the text, so a model's `<img onerror=…>` is shown as the characters it is. Covers what
// models write: paragraphs, headings, fenced code, lists, quotes, rules, inline code, bold,
// italics and http(s) links.

import { h } from "./dom.js";

export function renderMarkdown(text) {
  const root = h("div", { class: "md" });
  const lines = String(text || "").replace(/\r\n?/g, "\n").split("\n");
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    const fence = line.match(/^\s*(```+|~~~+)\s*([\w+-]*)\s*$/);
    if (fence) {
      const body = [];
      i += 1;
      while (i < lines.length && !lines[i].trim().startsWith(fence[1])) body.push(lines[i++]);
      i += 1;
      root.append(h("pre", { class: "code" }, h("code", { dataset: { lang: fence[2] || "" } }, body.join("\n"))));
      continue;
    }
    if (!line.trim()) { i += 1; continue; }
    const heading = line.match(/^(#{1,6})\s+(.*)$/);
    if (heading) {
      root.append(h(`h${Math.min(heading[1].length + 2, 6)}`, {}, inline(heading[2])));
      i += 1;
      continue;
    }
    if (/^\s*([-*_])(\s*\1){2,}\s*$/.test(line)) { root.append(h("hr")); i += 1; continue; }
    if (/^\s*>/.test(line)) {
      const quoted = [];
      while (i < lines.length && /^\s*>/.test(lines[i])) quoted.push(lines[i++].replace(/^\s*>\s?/, ""));
      root.append(h("blockquote", {}, renderMarkdown(quoted.join("\n"))));
      continue;
    }
    const bullet = /^\s*[-*+]\s+/;
    const numbered = /^\s*\d+[.)]\s+/;
    if (bullet.test(line) || numbered.test(line)) {
      const marker = bullet.test(line) ? bullet : numbered;
      const list = h(marker === bullet ? "ul" : "ol");
      while (i < lines.length && marker.test(lines[i])) {
        list.append(h("li", {}, inline(lines[i].replace(marker, ""))));
        i += 1;
      }
      root.append(list);
      continue;
    }
    const paragraph = [];
    while (i < lines.length && lines[i].trim() && !/^\s*(```|~~~|#{1,6}\s|>|[-*+]\s|\d+[.)]\s)/.test(lines[i])) {
      paragraph.push(lines[i++]);
    }
    if (!paragraph.length) paragraph.push(lines[i++]);
    const p = h("p");
    paragraph.forEach((part, index) => {
      if (index) p.append(h("br"));
      p.append(...inline(part));
    });
    root.append(p);
  }
  return root;
}

const INLINE = /(`+)([\s\S]*?[^`])\1(?!`)|\*\*([^*]+?)\*\*|__([^_]+?)__|\*([^*\s][^*]*?)\*|_([^_\s][^_]*?)_|\[([^\]]+)\]\(([^)\s]+)\)/g;

// Inline markup as a list of nodes.
export function inline(text) {
  const nodes = [];
  let last = 0;
  for (const match of String(text).matchAll(INLINE)) {
    if (match.index > last) nodes.push(text.slice(last, match.index));
    const [whole, , code, bold, bold2, em, em2, label, url] = match;
    if (code !== undefined) nodes.push(h("code", {}, code));
    else if (bold !== undefined || bold2 !== undefined) nodes.push(h("strong", {}, inline(bold ?? bold2)));
    else if (em !== undefined || em2 !== undefined) nodes.push(h("em", {}, inline(em ?? em2)));
    else if (label !== undefined) nodes.push(link(label, url, whole));
    last = match.index + whole.length;
  }
  if (last < text.length) nodes.push(text.slice(last));
  return nodes;
}

// Only http(s) links become links; anything else (javascript:, data:) stays text.
function link(label, url, whole) {
  let parsed;
  try {
    parsed = new URL(url, location.href);
  } catch {
    return whole;
  }
  if (parsed.protocol !== "http:" && parsed.protocol !== "https:") return whole;
  return h("a", { href: parsed.href, target: "_blank", rel: "noopener noreferrer" }, inline(label));
}
