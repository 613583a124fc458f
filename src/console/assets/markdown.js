// Markdown to DOM, safely. The text is parsed by CommonMark's rules (commonmark.js) into a
// tree, and the tree becomes elements and text nodes: nothing is ever parsed as HTML, so a
// model's `<img onerror=…>` is shown as the characters it is (CommonMark's raw HTML stays
// text). Only http(s) links become links; any other destination (javascript:, data:, mailto:)
// leaves its text. An image is shown as a link to it with its description, never loaded.
// Headings start at h3, below the console's own.

import { h } from "./dom.js";
import { parse } from "./commonmark.js";

export function renderMarkdown(text) {
  const root = h("div", { class: "md" });
  for (const node of parse(String(text || "")).children) root.append(block(node, false));
  return root;
}

function block(node, tight) {
  switch (node.type) {
    case "paragraph":
      return tight ? inlines(node.children) : h("p", {}, inlines(node.children));
    case "heading":
      return h(`h${Math.min(node.level + 2, 6)}`, {}, inlines(node.children));
    case "thematic_break":
      return h("hr");
    case "code_block": {
      const language = (node.info || "").split(/[ \t\n]+/)[0];
      return h("pre", { class: "code" }, h("code", { dataset: { lang: language } }, node.literal.replace(/\n$/, "")));
    }
    case "block_quote":
      return h("blockquote", {}, node.children.map((child) => block(child, false)));
    case "list": {
      const attributes = node.ordered && node.start !== 1 ? { start: String(node.start) } : {};
      const items = node.children.map((item) => h("li", {}, item.children.map((child) => block(child, node.tight))));
      return h(node.ordered ? "ol" : "ul", attributes, items);
    }
    default:
      return document.createTextNode("");
  }
}

// Inline nodes as a list of DOM nodes (strings become text nodes).
function inlines(nodes) {
  const out = [];
  for (const node of nodes || []) {
    switch (node.type) {
      case "text": out.push(node.literal); break;
      case "softbreak": out.push("\n"); break;
      case "hardbreak": out.push(h("br")); break;
      case "code": out.push(h("code", {}, node.literal)); break;
      case "emph": out.push(h("em", {}, inlines(node.children))); break;
      case "strong": out.push(h("strong", {}, inlines(node.children))); break;
      case "link": out.push(...link(node.destination, node.title, inlines(node.children))); break;
      case "image": out.push(...link(node.destination, node.title, [`🖼 ${plain(node.children)}`])); break;
      default: break;
    }
  }
  return out;
}

function plain(nodes) {
  return (nodes || []).map((node) => (node.literal !== undefined ? node.literal : plain(node.children))).join("");
}

// A link for an http(s) destination; its content alone for any other.
function link(destination, title, content) {
  let parsed;
  try {
    parsed = new URL(destination, location.href);
  } catch {
    return content;
  }
  if (parsed.protocol !== "http:" && parsed.protocol !== "https:") return content;
  const attributes = { href: parsed.href, target: "_blank", rel: "noopener noreferrer" };
  if (title) attributes.title = title;
  return [h("a", attributes, content)];
}
