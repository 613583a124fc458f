// The console's CommonMark parser (src/console/assets/commonmark.js) against the CommonMark
// spec's own examples (npm `commonmark-spec`): each example's Markdown is parsed, the tree
// rendered to HTML the way the spec's reference renderer writes it, and compared with the
// spec's HTML. Prints one JSON object: for every section, the examples that passed and the
// numbers of those that did not.
//
// Usage: node spec.mjs <path to commonmark.js> <path to commonmark-spec's index.js>

import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";

const [parserPath, specPath] = process.argv.slice(2);
const { parse } = await import(pathToFileURL(parserPath).href);
const spec = createRequire(import.meta.url)(specPath);

const escape = (text) =>
  text.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");

function plainText(nodes) {
  return (nodes || []).map((n) => (n.literal !== undefined ? n.literal : n.type === "softbreak" || n.type === "hardbreak" ? "\n" : plainText(n.children))).join("");
}

class Html {
  constructor() {
    this.out = "";
  }
  cr() {
    if (this.out.length && !this.out.endsWith("\n")) this.out += "\n";
  }
  block(node, tight) {
    switch (node.type) {
      case "document":
        node.children.forEach((child) => this.block(child, false));
        break;
      case "paragraph":
        if (tight) this.inlines(node.children);
        else { this.cr(); this.out += "<p>"; this.inlines(node.children); this.out += "</p>"; this.cr(); }
        break;
      case "heading":
        this.cr(); this.out += `<h${node.level}>`; this.inlines(node.children); this.out += `</h${node.level}>`; this.cr();
        break;
      case "thematic_break":
        this.cr(); this.out += "<hr />"; this.cr();
        break;
      case "code_block": {
        const language = (node.info || "").split(/[ \t\n]+/)[0];
        this.cr();
        this.out += language ? `<pre><code class="language-${escape(language)}">` : "<pre><code>";
        this.out += escape(node.literal) + "</code></pre>";
        this.cr();
        break;
      }
      case "block_quote":
        this.cr(); this.out += "<blockquote>"; this.cr();
        node.children.forEach((child) => this.block(child, false));
        this.cr(); this.out += "</blockquote>"; this.cr();
        break;
      case "list": {
        const tag = node.ordered ? "ol" : "ul";
        const start = node.ordered && node.start !== 1 ? ` start="${node.start}"` : "";
        this.cr(); this.out += `<${tag}${start}>`; this.cr();
        node.children.forEach((item) => this.block(item, node.tight));
        this.cr(); this.out += `</${tag}>`; this.cr();
        break;
      }
      case "item":
        this.out += "<li>";
        node.children.forEach((child) => this.block(child, tight));
        this.out += "</li>";
        this.cr();
        break;
      default:
        throw new Error(`unknown block ${node.type}`);
    }
  }
  inlines(nodes) {
    for (const node of nodes || []) {
      switch (node.type) {
        case "text": this.out += escape(node.literal); break;
        case "softbreak": this.out += "\n"; break;
        case "hardbreak": this.out += "<br />\n"; break;
        case "code": this.out += `<code>${escape(node.literal)}</code>`; break;
        case "emph": this.out += "<em>"; this.inlines(node.children); this.out += "</em>"; break;
        case "strong": this.out += "<strong>"; this.inlines(node.children); this.out += "</strong>"; break;
        case "link": {
          const title = node.title ? ` title="${escape(node.title)}"` : "";
          this.out += `<a href="${escape(node.destination)}"${title}>`;
          this.inlines(node.children);
          this.out += "</a>";
          break;
        }
        case "image": {
          const title = node.title ? ` title="${escape(node.title)}"` : "";
          this.out += `<img src="${escape(node.destination)}" alt="${escape(plainText(node.children))}"${title} />`;
          break;
        }
        default:
          throw new Error(`unknown inline ${node.type}`);
      }
    }
  }
}

// Cases of the console's own: what a model wrote that an earlier renderer got wrong.
const ours = [
  {
    section: "Kestrel",
    number: 1,
    markdown: "window.__pwned=1 … window.__pwned=2\n",
    html: "<p>window.__pwned=1 … window.__pwned=2</p>\n",
  },
  { section: "Kestrel", number: 2, markdown: "snake_case_name and __init__\n", html: "<p>snake_case_name and <strong>init</strong></p>\n" },
  { section: "Kestrel", number: 3, markdown: "1. one\n2. two\n\n```rust\nfn main() {}\n```\n", html: "<ol>\n<li>one</li>\n<li>two</li>\n</ol>\n<pre><code class=\"language-rust\">fn main() {}\n</code></pre>\n" },
];

const sections = {};
for (const example of [...spec.tests, ...ours]) {
  const markdown = example.markdown.replace(/→/g, "\t");
  const expected = example.html.replace(/→/g, "\t");
  let html;
  try {
    const renderer = new Html();
    renderer.block(parse(markdown), false);
    html = renderer.out;
  } catch (error) {
    html = `error: ${error.message}`;
  }
  const section = (sections[example.section] ??= { passed: 0, failed: [] });
  if (html === expected) section.passed += 1;
  else section.failed.push(example.number);
}
console.log(JSON.stringify(sections));
