// CommonMark (0.31) text to a tree of plain objects: no DOM and no HTML, so it runs in a page
// and in Node alike. The console builds its elements from the tree (markdown.js); the tests
// render it to HTML and compare it with the spec's own examples.
//
// What it follows: the block structure (block quotes, list items, lists and their tightness,
// lazy continuation lines, ATX and setext headings, thematic breaks, fenced and indented code
// blocks, paragraphs, link reference definitions) and the inlines (backslash escapes,
// numeric and common named character references, code spans, emphasis and strong emphasis by
// the delimiter-run algorithm, inline and reference links and images, autolinks, hard and
// soft line breaks). What it leaves out on purpose: raw HTML, which stays text, and the full
// table of named entities (a name it does not know stays as written).
//
// Nodes: { type, children } with type document, block_quote, list { ordered, start, tight },
// item, paragraph, heading { level }, thematic_break, code_block { info, literal }; and the
// inlines text { literal }, softbreak, hardbreak, code { literal }, emph, strong,
// link { destination, title }, image { destination, title }.

const TAB_STOP = 4;
const ESCAPABLE = "[!\"#$%&'()*+,./:;<=>?@[\\\\\\]^_`{|}~-]";
const reEscapable = new RegExp("^" + ESCAPABLE);
const reEntity = /^&(?:#[xX][0-9a-fA-F]{1,6}|#[0-9]{1,7}|[A-Za-z][A-Za-z0-9]{1,31});/;
const reEntityOrEscape = new RegExp("\\\\" + ESCAPABLE + "|&(?:#[xX][0-9a-fA-F]{1,6}|#[0-9]{1,7}|[A-Za-z][A-Za-z0-9]{1,31});", "g");
const reThematicBreak = /^(?:\*[ \t]*){3,}$|^(?:_[ \t]*){3,}$|^(?:-[ \t]*){3,}$/;
const reATXHeading = /^#{1,6}(?:[ \t]+|$)/;
const reCodeFence = /^`{3,}(?!.*`)|^~{3,}/;
const reClosingCodeFence = /^(?:`{3,}|~{3,})(?=[ \t]*$)/;
const reSetextHeading = /^(?:=+|-+)[ \t]*$/;
const reBulletMarker = /^[*+-]/;
const reOrderedMarker = /^(\d{1,9})([.)])/;
const reNonSpace = /[^ \t\f\v\r\n]/;
const reMaybeSpecial = /^[#`~*+_=<>0-9-]/;
const reLinkLabel = /^\[(?:[^\\\[\]]|\\.){0,999}\]/s;
const reLinkTitle = /^(?:"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|\((?:\\.|[^()\\])*\))/s;
const reLinkDestinationBraces = /^<(?:[^<>\n\\\x00]|\\.)*>/;
const reSpnl = /^ *(?:\n *)?/;
const reSpaceAtEndOfLine = /^ *(?:\n|$)/;
const reMain = /^[^\n`\[\]\\!<&*_]+/;
const reAutolink = /^<[A-Za-z][A-Za-z0-9.+-]{1,31}:[^<>\x00-\x20]*>/;
const reEmailAutolink = /^<([a-zA-Z0-9.!#$%&'*+\/=?^_`{|}~-]+@[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?)*)>/;
const reUnicodeWhitespace = /^[ \t\n\f\r\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000]/;
const rePunctuation = /^[\p{P}\p{S}]/u;

// The named references a model is likely to write; any other name stays as written.
const ENTITIES = {
  amp: "&", lt: "<", gt: ">", quot: "\"", apos: "'", nbsp: "\u00a0", copy: "\u00a9", reg: "\u00ae",
  trade: "\u2122", hellip: "\u2026", mdash: "\u2014", ndash: "\u2013", lsquo: "\u2018", rsquo: "\u2019",
  ldquo: "\u201c", rdquo: "\u201d", laquo: "\u00ab", raquo: "\u00bb", middot: "\u00b7", bull: "\u2022",
  deg: "\u00b0", plusmn: "\u00b1", times: "\u00d7", divide: "\u00f7", para: "\u00b6", sect: "\u00a7",
  euro: "\u20ac", pound: "\u00a3", yen: "\u00a5", cent: "\u00a2", larr: "\u2190", rarr: "\u2192",
  uarr: "\u2191", darr: "\u2193", harr: "\u2194", rArr: "\u21d2", lArr: "\u21d0", hArr: "\u21d4",
  le: "\u2264", ge: "\u2265", ne: "\u2260", infin: "\u221e", auml: "\u00e4", ouml: "\u00f6",
  uuml: "\u00fc", Auml: "\u00c4", Ouml: "\u00d6", Uuml: "\u00dc", szlig: "\u00df", eacute: "\u00e9",
  egrave: "\u00e8", aacute: "\u00e1", agrave: "\u00e0", ccedil: "\u00e7", ntilde: "\u00f1",
  frac12: "\u00bd", frac14: "\u00bc", frac34: "\u00be", AElig: "\u00c6", Dcaron: "\u010e",
  HilbertSpace: "\u210b", DifferentialD: "\u2146", ClockwiseContourIntegral: "\u2232",
  ngE: "\u2267\u0338",
};

/// The character a reference names, or null when it names none this table knows.
function decodeEntity(entity) {
  const body = entity.slice(1, -1);
  if (body[0] === "#") {
    const code = body[1] === "x" || body[1] === "X" ? parseInt(body.slice(2), 16) : parseInt(body.slice(1), 10);
    const valid = code > 0 && code <= 0x10ffff && !(code >= 0xd800 && code <= 0xdfff);
    return valid ? String.fromCodePoint(code) : "\ufffd";
  }
  return Object.prototype.hasOwnProperty.call(ENTITIES, body) ? ENTITIES[body] : null;
}

/// Backslash escapes and references resolved (in destinations, titles and info strings).
export function unescapeString(text) {
  return text.replace(reEntityOrEscape, (found) => {
    if (found[0] === "\\") return found[1];
    const decoded = decodeEntity(found);
    return decoded === null ? found : decoded;
  });
}

/// A destination percent-encoded as a browser would send it, existing escapes kept.
export function normalizeURI(uri) {
  return uri
    .split(/(%[0-9A-Fa-f]{2})/)
    .map((part, index) => {
      if (index % 2 === 1) return part;
      try {
        return encodeURI(part);
      } catch {
        return part.replace(/[\ud800-\udfff]/g, "\ufffd");
      }
    })
    .join("");
}

function normalizeReference(label) {
  return label.slice(1, -1).trim().replace(/[ \t\r\n]+/g, " ").toLowerCase().toUpperCase();
}

const isSpaceOrTab = (c) => c === " " || c === "\t";

// ---------------------------------------------------------------------------------------
// Nodes

class Node {
  constructor(type, startLine = 0) {
    this.type = type;
    this.parent = null;
    this.firstChild = null;
    this.lastChild = null;
    this.prev = null;
    this.next = null;
    this.open = true;
    this.startLine = startLine;
    this.endLine = startLine;
    this.content = "";
    this.lastLineBlank = false;
  }

  appendChild(child) {
    child.unlink();
    child.parent = this;
    if (this.lastChild) {
      this.lastChild.next = child;
      child.prev = this.lastChild;
      this.lastChild = child;
    } else {
      this.firstChild = child;
      this.lastChild = child;
    }
  }

  insertAfter(sibling) {
    sibling.unlink();
    sibling.next = this.next;
    if (sibling.next) sibling.next.prev = sibling;
    sibling.prev = this;
    this.next = sibling;
    sibling.parent = this.parent;
    if (!sibling.next && sibling.parent) sibling.parent.lastChild = sibling;
  }

  unlink() {
    if (this.prev) this.prev.next = this.next;
    else if (this.parent) this.parent.firstChild = this.next;
    if (this.next) this.next.prev = this.prev;
    else if (this.parent) this.parent.lastChild = this.prev;
    this.parent = null;
    this.next = null;
    this.prev = null;
  }
}

function text(literal) {
  const node = new Node("text");
  node.literal = literal;
  return node;
}

/// The tree as plain objects, for the caller.
function plain(node) {
  const out = { type: node.type };
  for (const key of ["level", "info", "literal", "destination", "title", "ordered", "start", "tight"]) {
    if (node[key] !== undefined) out[key] = node[key];
  }
  const children = [];
  for (let child = node.firstChild; child; child = child.next) children.push(plain(child));
  if (children.length || !("literal" in out)) out.children = children;
  return out;
}

// ---------------------------------------------------------------------------------------
// Blocks

const CONTAINERS = new Set(["document", "block_quote", "item"]);

function canContain(parent, child) {
  if (parent === "list") return child === "item";
  return CONTAINERS.has(parent) && child !== "item";
}

const acceptsLines = (type) => type === "paragraph" || type === "code_block";

/// Whether a block ends with a blank line before its next sibling.
function endsWithBlankLine(block) {
  return block.next !== null && block.endLine < block.next.startLine - 1;
}

class BlockParser {
  constructor() {
    this.doc = new Node("document", 1);
    this.tip = this.doc;
    this.oldtip = this.doc;
    this.refmap = Object.create(null);
    this.lineNumber = 0;
  }

  parse(input) {
    const lines = String(input ?? "").replace(/\0/g, "\ufffd").split(/\r\n|\r|\n/);
    if (lines.length && lines[lines.length - 1] === "") lines.pop();
    for (const line of lines) this.incorporateLine(line);
    while (this.tip) this.finalize(this.tip, lines.length);
    this.walkInlines(this.doc);
    return plain(this.doc);
  }

  // Where the next non-space character of the line is, and how far it is indented.
  findNextNonspace() {
    let i = this.offset;
    let cols = this.column;
    let c;
    while ((c = this.line.charAt(i)) !== "") {
      if (c === " ") {
        i += 1;
        cols += 1;
      } else if (c === "\t") {
        i += 1;
        cols += TAB_STOP - (cols % TAB_STOP);
      } else break;
    }
    this.blank = c === "";
    this.nextNonspace = i;
    this.nextNonspaceColumn = cols;
    this.indent = cols - this.column;
    this.indented = this.indent >= 4;
  }

  advanceNextNonspace() {
    this.offset = this.nextNonspace;
    this.column = this.nextNonspaceColumn;
    this.partiallyConsumedTab = false;
  }

  // Moves `count` characters on (or, with `columns`, `count` columns: a tab may be taken in
  // part, the rest of it left as spaces for the content).
  advanceOffset(count, columns) {
    let c;
    while (count > 0 && (c = this.line.charAt(this.offset)) !== "") {
      if (c === "\t") {
        const toTab = TAB_STOP - (this.column % TAB_STOP);
        if (columns) {
          this.partiallyConsumedTab = toTab > count;
          const advance = toTab > count ? count : toTab;
          this.column += advance;
          this.offset += this.partiallyConsumedTab ? 0 : 1;
          count -= advance;
        } else {
          this.partiallyConsumedTab = false;
          this.column += toTab;
          this.offset += 1;
          count -= 1;
        }
      } else {
        this.partiallyConsumedTab = false;
        this.offset += 1;
        this.column += 1;
        count -= 1;
      }
    }
  }

  addLine() {
    if (this.partiallyConsumedTab) {
      this.offset += 1;
      this.tip.content += " ".repeat(TAB_STOP - (this.column % TAB_STOP));
    }
    this.tip.content += this.line.slice(this.offset) + "\n";
  }

  addChild(type, offset) {
    while (!canContain(this.tip.type, type)) this.finalize(this.tip, this.lineNumber - 1);
    const child = new Node(type, this.lineNumber);
    child.offset = offset;
    this.tip.appendChild(child);
    this.tip = child;
    return child;
  }

  closeUnmatchedBlocks() {
    if (this.allClosed) return;
    while (this.oldtip !== this.lastMatchedContainer) {
      const parent = this.oldtip.parent;
      this.finalize(this.oldtip, this.lineNumber - 1);
      this.oldtip = parent;
    }
    this.allClosed = true;
  }

  // Whether an open block goes on with this line: 0 yes, 1 no, 2 yes and the line is done.
  continues(block) {
    switch (block.type) {
      case "document":
      case "list":
        return 0;
      case "block_quote":
        if (!this.indented && this.line.charAt(this.nextNonspace) === ">") {
          this.advanceNextNonspace();
          this.advanceOffset(1, false);
          if (isSpaceOrTab(this.line.charAt(this.offset))) this.advanceOffset(1, true);
          return 0;
        }
        return 1;
      case "item":
        if (this.blank) {
          if (block.firstChild === null) return 1;
          this.advanceNextNonspace();
        } else if (this.indent >= block.markerOffset + block.padding) {
          this.advanceOffset(block.markerOffset + block.padding, true);
        } else return 1;
        return 0;
      case "code_block":
        return this.continuesCode(block);
      case "paragraph":
        return this.blank ? 1 : 0;
      default:
        return 1;
    }
  }

  continuesCode(block) {
    if (block.fenced) {
      const rest = this.line.slice(this.nextNonspace);
      const closing = this.indent <= 3 && rest.charAt(0) === block.fenceChar ? rest.match(reClosingCodeFence) : null;
      if (closing && closing[0].length >= block.fenceLength) {
        this.lastLineLength = this.offset + this.indent + closing[0].length;
        this.finalize(block, this.lineNumber);
        return 2;
      }
      let skip = block.fenceOffset;
      while (skip > 0 && isSpaceOrTab(this.line.charAt(this.offset))) {
        this.advanceOffset(1, true);
        skip -= 1;
      }
      return 0;
    }
    if (this.indent >= 4) this.advanceOffset(4, true);
    else if (this.blank) this.advanceNextNonspace();
    else return 1;
    return 0;
  }

  // The block starts, in the spec's order: 0 none, 1 a container, 2 a leaf.
  startBlock(container) {
    const rest = this.line.slice(this.nextNonspace);
    const first = rest.charAt(0);
    if (!this.indented && first === ">") {
      this.advanceNextNonspace();
      this.advanceOffset(1, false);
      if (isSpaceOrTab(this.line.charAt(this.offset))) this.advanceOffset(1, true);
      this.closeUnmatchedBlocks();
      this.addChild("block_quote", this.nextNonspace);
      return 1;
    }
    let match;
    if (!this.indented && (match = rest.match(reATXHeading))) {
      this.advanceNextNonspace();
      this.advanceOffset(match[0].length, false);
      this.closeUnmatchedBlocks();
      const heading = this.addChild("heading", this.nextNonspace);
      heading.level = match[0].trim().length;
      heading.content = this.line.slice(this.offset).replace(/^[ \t]*#+[ \t]*$/, "").replace(/[ \t]+#+[ \t]*$/, "");
      this.advanceOffset(this.line.length - this.offset);
      return 2;
    }
    if (!this.indented && (match = rest.match(reCodeFence))) {
      this.closeUnmatchedBlocks();
      const code = this.addChild("code_block", this.nextNonspace);
      code.fenced = true;
      code.fenceLength = match[0].length;
      code.fenceChar = match[0][0];
      code.fenceOffset = this.indent;
      this.advanceNextNonspace();
      this.advanceOffset(match[0].length, false);
      return 2;
    }
    if (!this.indented && container.type === "paragraph" && (match = rest.match(reSetextHeading))) {
      if (this.setextHeading(container, match)) return 2;
    }
    if (!this.indented && reThematicBreak.test(rest)) {
      this.closeUnmatchedBlocks();
      this.addChild("thematic_break", this.nextNonspace);
      this.advanceOffset(this.line.length - this.offset);
      return 2;
    }
    if ((!this.indented || container.type === "list") && this.listItem(container)) return 1;
    if (this.indented && this.tip.type !== "paragraph" && !this.blank) {
      this.advanceOffset(4, true);
      this.closeUnmatchedBlocks();
      this.addChild("code_block", this.offset);
      return 2;
    }
    return 0;
  }

  // A setext heading made of the paragraph so far; false when only link reference
  // definitions were there (then the line may still be something else).
  setextHeading(container, match) {
    this.closeUnmatchedBlocks();
    // Link reference definitions at its start are definitions, not heading text.
    const content = this.takeReferences(container.content);
    container.content = content;
    if (content.length === 0) return false;
    const heading = new Node("heading", container.startLine);
    heading.level = match[0][0] === "=" ? 1 : 2;
    heading.content = content;
    container.insertAfter(heading);
    container.unlink();
    this.tip = heading;
    this.advanceOffset(this.line.length - this.offset);
    return true;
  }

  listItem(container) {
    const data = this.listMarker(container);
    if (!data) return false;
    this.closeUnmatchedBlocks();
    const same = this.tip.type === "list" && this.tip.bulletChar === data.bulletChar
      && this.tip.delimiter === data.delimiter && this.tip.ordered === data.ordered;
    if (!same) {
      const list = this.addChild("list", this.nextNonspace);
      Object.assign(list, { ordered: data.ordered, bulletChar: data.bulletChar, delimiter: data.delimiter, tight: true });
      if (data.ordered) list.start = data.start;
    }
    const item = this.addChild("item", this.nextNonspace);
    item.markerOffset = data.markerOffset;
    item.padding = data.padding;
    return true;
  }

  // The list marker at the start of the line, its data, and the line moved past it.
  listMarker(container) {
    if (this.indent >= 4) return null;
    const rest = this.line.slice(this.nextNonspace);
    const data = { ordered: false, bulletChar: null, delimiter: null, start: null, markerOffset: this.indent, padding: 0 };
    let match;
    if ((match = rest.match(reBulletMarker))) {
      data.bulletChar = match[0];
    } else if ((match = rest.match(reOrderedMarker)) && (container.type !== "paragraph" || match[1] === "1")) {
      data.ordered = true;
      data.start = parseInt(match[1], 10);
      data.delimiter = match[2];
    } else return null;
    const after = this.line.charAt(this.nextNonspace + match[0].length);
    if (!(after === "" || after === "\t" || after === " ")) return null;
    // An item that interrupts a paragraph may not start out blank.
    if (container.type === "paragraph" && !reNonSpace.test(this.line.slice(this.nextNonspace + match[0].length))) {
      return null;
    }
    this.advanceNextNonspace();
    this.advanceOffset(match[0].length, true);
    const spacesStartColumn = this.column;
    const spacesStartOffset = this.offset;
    let next;
    do {
      this.advanceOffset(1, true);
      next = this.line.charAt(this.offset);
    } while (this.column - spacesStartColumn < 5 && isSpaceOrTab(next));
    const blankItem = this.line.charAt(this.offset) === "";
    const spaces = this.column - spacesStartColumn;
    if (spaces >= 5 || spaces < 1 || blankItem) {
      data.padding = match[0].length + 1;
      this.column = spacesStartColumn;
      this.offset = spacesStartOffset;
      if (isSpaceOrTab(this.line.charAt(this.offset))) this.advanceOffset(1, true);
    } else {
      data.padding = match[0].length + spaces;
    }
    return data;
  }

  incorporateLine(line) {
    let container = this.doc;
    this.oldtip = this.tip;
    this.offset = 0;
    this.column = 0;
    this.blank = false;
    this.partiallyConsumedTab = false;
    this.lineNumber += 1;
    this.line = line;
    while (container.lastChild && container.lastChild.open) {
      container = container.lastChild;
      this.findNextNonspace();
      const outcome = this.continues(container);
      if (outcome === 2) return;
      if (outcome === 1) {
        container = container.parent;
        break;
      }
    }
    this.allClosed = container === this.oldtip;
    this.lastMatchedContainer = container;
    let matchedLeaf = container.type !== "paragraph" && acceptsLines(container.type);
    while (!matchedLeaf) {
      this.findNextNonspace();
      if (!this.indented && !reMaybeSpecial.test(this.line.slice(this.nextNonspace))) {
        this.advanceNextNonspace();
        break;
      }
      const started = this.startBlock(container);
      if (started === 0) {
        this.advanceNextNonspace();
        break;
      }
      container = this.tip;
      if (started === 2) matchedLeaf = true;
    }
    this.finishLine(container);
  }

  // What is left of the line goes into the container (or continues a paragraph lazily).
  finishLine(container) {
    if (!this.allClosed && !this.blank && this.tip.type === "paragraph") {
      this.addLine();
      return;
    }
    this.closeUnmatchedBlocks();
    const type = container.type;
    const lastLineBlank = this.blank && !(type === "block_quote" || (type === "code_block" && container.fenced)
      || (type === "item" && !container.firstChild && container.startLine === this.lineNumber));
    for (let block = container; block; block = block.parent) block.lastLineBlank = lastLineBlank;
    if (acceptsLines(type)) {
      this.addLine();
    } else if (this.offset < this.line.length && !this.blank) {
      this.addChild("paragraph", this.offset);
      this.advanceNextNonspace();
      this.addLine();
    }
  }

  finalize(block, lineNumber) {
    const above = block.parent;
    block.open = false;
    block.endLine = lineNumber;
    if (block.type === "paragraph") {
      block.content = this.takeReferences(block.content);
      if (!block.content.trim()) block.unlink();
    } else if (block.type === "code_block") {
      if (block.fenced) {
        const newline = block.content.indexOf("\n");
        block.info = unescapeString(block.content.slice(0, newline).trim());
        block.literal = block.content.slice(newline + 1);
      } else {
        // Blank lines at its end are not part of it.
        const lines = block.content.split("\n");
        while (lines.length > 1 && /^[ \t]*$/.test(lines[lines.length - 1])) lines.pop();
        block.literal = lines.join("\n") + "\n";
        block.endLine = block.startLine + lines.length - 1;
      }
    } else if (block.type === "item" || block.type === "list") {
      if (block.lastChild) block.endLine = Math.max(block.startLine, block.lastChild.endLine);
      else block.endLine = block.startLine;
      if (block.type === "list") block.tight = this.isTight(block);
    }
    this.tip = above;
  }

  // A list is loose when a blank line separates two of its items, or two blocks of an item.
  isTight(list) {
    for (let item = list.firstChild; item; item = item.next) {
      if (item.next && endsWithBlankLine(item)) return false;
      for (let sub = item.firstChild; sub; sub = sub.next) {
        if (sub.next && endsWithBlankLine(sub)) return false;
      }
    }
    return true;
  }

  // Link reference definitions at the start of `content` go into the map; the rest.
  takeReferences(content) {
    let rest = content;
    while (rest.charAt(0) === "[") {
      const taken = new InlineParser(this.refmap).parseReference(rest);
      if (!taken) break;
      rest = rest.slice(taken);
    }
    return rest;
  }

  walkInlines(node) {
    if (node.type === "paragraph" || node.type === "heading") {
      new InlineParser(this.refmap).parse(node);
      return;
    }
    for (let child = node.firstChild; child; child = child.next) this.walkInlines(child);
  }
}

// ---------------------------------------------------------------------------------------
// Inlines

class InlineParser {
  constructor(refmap) {
    this.refmap = refmap;
    this.subject = "";
    this.pos = 0;
    this.delimiters = null;
    this.brackets = null;
  }

  peek() {
    return this.pos < this.subject.length ? this.subject.charAt(this.pos) : "";
  }

  match(re) {
    const found = re.exec(this.subject.slice(this.pos));
    if (found === null) return null;
    this.pos += found.index + found[0].length;
    return found[0];
  }

  spnl() {
    this.match(reSpnl);
    return true;
  }

  parse(block) {
    this.subject = block.content.trim();
    this.pos = 0;
    this.delimiters = null;
    this.brackets = null;
    block.content = "";
    while (this.parseInline(block));
    this.processEmphasis(null);
    mergeText(block);
  }

  parseInline(block) {
    const c = this.peek();
    if (c === "") return false;
    let handled;
    switch (c) {
      case "\n": handled = this.parseNewline(block); break;
      case "\\": handled = this.parseBackslash(block); break;
      case "`": handled = this.parseBackticks(block); break;
      case "*":
      case "_": handled = this.handleDelim(c, block); break;
      case "[": handled = this.parseOpenBracket(block); break;
      case "!": handled = this.parseBang(block); break;
      case "]": handled = this.parseCloseBracket(block); break;
      case "<": handled = this.parseAutolink(block); break;
      case "&": handled = this.parseEntity(block); break;
      default: handled = this.parseString(block);
    }
    if (!handled) {
      this.pos += 1;
      block.appendChild(text(c));
    }
    return true;
  }

  parseString(block) {
    const found = this.match(reMain);
    if (found === null) return false;
    block.appendChild(text(found));
    return true;
  }

  parseNewline(block) {
    this.pos += 1;
    const last = block.lastChild;
    if (last && last.type === "text" && last.literal.endsWith(" ")) {
      const hard = last.literal.endsWith("  ");
      last.literal = last.literal.replace(/ +$/, "");
      block.appendChild(new Node(hard ? "hardbreak" : "softbreak"));
    } else {
      block.appendChild(new Node("softbreak"));
    }
    this.match(/^ */);
    return true;
  }

  parseBackslash(block) {
    this.pos += 1;
    const next = this.peek();
    if (next === "\n") {
      this.pos += 1;
      block.appendChild(new Node("hardbreak"));
    } else if (reEscapable.test(next)) {
      this.pos += 1;
      block.appendChild(text(next));
    } else {
      block.appendChild(text("\\"));
    }
    return true;
  }

  parseBackticks(block) {
    const ticks = this.match(/^`+/);
    const after = this.pos;
    const closing = /`+/g;
    closing.lastIndex = after;
    let found;
    while ((found = closing.exec(this.subject)) !== null) {
      if (found[0].length === ticks.length) {
        let literal = this.subject.slice(after, found.index).replace(/\n/g, " ");
        if (literal.length > 0 && reNonSpace.test(literal) && literal[0] === " " && literal[literal.length - 1] === " ") {
          literal = literal.slice(1, -1);
        }
        const code = new Node("code");
        code.literal = literal;
        block.appendChild(code);
        this.pos = found.index + found[0].length;
        return true;
      }
    }
    // No closing run of the same length: the backticks are text.
    block.appendChild(text(ticks));
    return true;
  }

  // The character before `pos` and the one after the run that ends at `end`, as strings.
  around(start, end) {
    const before = start === 0 ? "\n" : String.fromCodePoint(this.subject.codePointAt(lastCodePointStart(this.subject, start)));
    const after = end >= this.subject.length ? "\n" : String.fromCodePoint(this.subject.codePointAt(end));
    return { before, after };
  }

  handleDelim(c, block) {
    const start = this.pos;
    let count = 0;
    while (this.peek() === c) {
      count += 1;
      this.pos += 1;
    }
    const { before, after } = this.around(start, this.pos);
    const afterSpace = reUnicodeWhitespace.test(after);
    const afterPunct = rePunctuation.test(after);
    const beforeSpace = reUnicodeWhitespace.test(before);
    const beforePunct = rePunctuation.test(before);
    const left = !afterSpace && (!afterPunct || beforeSpace || beforePunct);
    const right = !beforeSpace && (!beforePunct || afterSpace || afterPunct);
    const canOpen = c === "_" ? left && (!right || beforePunct) : left;
    const canClose = c === "_" ? right && (!left || afterPunct) : right;
    const node = text(this.subject.slice(start, this.pos));
    block.appendChild(node);
    if (canOpen || canClose) {
      this.delimiters = { c, count, original: count, node, canOpen, canClose, previous: this.delimiters, next: null };
      if (this.delimiters.previous) this.delimiters.previous.next = this.delimiters;
    }
    return true;
  }

  removeDelimiter(delimiter) {
    if (delimiter.previous) delimiter.previous.next = delimiter.next;
    if (delimiter.next) delimiter.next.previous = delimiter.previous;
    else this.delimiters = delimiter.previous;
  }

  // Emphasis for the delimiters above `bottom`, by the spec's algorithm.
  processEmphasis(bottom) {
    const openersBottom = new Map();
    let closer = this.delimiters;
    while (closer !== null && closer.previous !== bottom) closer = closer.previous;
    while (closer !== null) {
      if (!closer.canClose) {
        closer = closer.next;
        continue;
      }
      const key = `${closer.c}${closer.canOpen ? 1 : 0}${closer.original % 3}`;
      const floor = openersBottom.has(key) ? openersBottom.get(key) : bottom;
      let opener = closer.previous;
      let found = false;
      while (opener !== null && opener !== bottom && opener !== floor) {
        const odd = (closer.canOpen || opener.canClose) && closer.original % 3 !== 0
          && (opener.original + closer.original) % 3 === 0;
        if (opener.c === closer.c && opener.canOpen && !odd) {
          found = true;
          break;
        }
        opener = opener.previous;
      }
      const old = closer;
      if (found) {
        closer = this.emphasize(opener, closer);
      } else {
        closer = closer.next;
        openersBottom.set(key, old.previous);
        if (!old.canOpen) this.removeDelimiter(old);
      }
    }
    while (this.delimiters !== null && this.delimiters !== bottom) this.removeDelimiter(this.delimiters);
  }

  // Wraps what is between a matched opener and closer; the closer to look at next.
  emphasize(opener, closer) {
    const use = closer.count >= 2 && opener.count >= 2 ? 2 : 1;
    const openNode = opener.node;
    const closeNode = closer.node;
    opener.count -= use;
    closer.count -= use;
    openNode.literal = openNode.literal.slice(0, openNode.literal.length - use);
    closeNode.literal = closeNode.literal.slice(0, closeNode.literal.length - use);
    const wrapper = new Node(use === 1 ? "emph" : "strong");
    let node = openNode.next;
    while (node && node !== closeNode) {
      const next = node.next;
      wrapper.appendChild(node);
      node = next;
    }
    openNode.insertAfter(wrapper);
    // Delimiters between the two are done with.
    let between = closer.previous;
    while (between !== null && between !== opener) {
      const previous = between.previous;
      this.removeDelimiter(between);
      between = previous;
    }
    if (opener.count === 0) {
      openNode.unlink();
      this.removeDelimiter(opener);
    }
    if (closer.count === 0) {
      closeNode.unlink();
      const next = closer.next;
      this.removeDelimiter(closer);
      return next;
    }
    return closer;
  }

  addBracket(node, index, image) {
    if (this.brackets !== null) this.brackets.bracketAfter = true;
    this.brackets = { node, previous: this.brackets, previousDelimiter: this.delimiters, index, image, active: true };
  }

  parseOpenBracket(block) {
    const start = this.pos;
    this.pos += 1;
    const node = text("[");
    block.appendChild(node);
    this.addBracket(node, start, false);
    return true;
  }

  parseBang(block) {
    const start = this.pos;
    this.pos += 1;
    if (this.peek() === "[") {
      this.pos += 1;
      const node = text("![");
      block.appendChild(node);
      this.addBracket(node, start + 1, true);
    } else {
      block.appendChild(text("!"));
    }
    return true;
  }

  parseCloseBracket(block) {
    this.pos += 1;
    const startpos = this.pos;
    const opener = this.brackets;
    if (opener === null) {
      block.appendChild(text("]"));
      return true;
    }
    if (!opener.active) {
      block.appendChild(text("]"));
      this.brackets = opener.previous;
      return true;
    }
    const target = this.linkTarget(opener, startpos);
    if (target === null) {
      this.brackets = opener.previous;
      this.pos = startpos;
      block.appendChild(text("]"));
      return true;
    }
    const link = new Node(opener.image ? "image" : "link");
    link.destination = target.destination;
    link.title = target.title || "";
    let node = opener.node.next;
    while (node) {
      const next = node.next;
      link.appendChild(node);
      node = next;
    }
    block.appendChild(link);
    this.processEmphasis(opener.previousDelimiter);
    this.brackets = opener.previous;
    opener.node.unlink();
    // No link inside a link: the openers of links before this one are spent.
    if (!opener.image) {
      for (let earlier = this.brackets; earlier !== null; earlier = earlier.previous) {
        if (!earlier.image) earlier.active = false;
      }
    }
    return true;
  }

  // An inline destination (and title) after `]`, or the reference its label names.
  linkTarget(opener, startpos) {
    if (this.peek() === "(") {
      this.pos += 1;
      this.spnl();
      const destination = this.parseLinkDestination();
      if (destination !== null) {
        this.spnl();
        let title = null;
        if (/[ \t\n]/.test(this.subject.charAt(this.pos - 1))) title = this.parseLinkTitle();
        this.spnl();
        if (this.peek() === ")") {
          this.pos += 1;
          return { destination, title };
        }
      }
      this.pos = startpos;
    }
    const beforeLabel = this.pos;
    const length = this.parseLinkLabel();
    let label = null;
    if (length > 2) label = this.subject.slice(beforeLabel, beforeLabel + length);
    else if (!opener.bracketAfter) label = this.subject.slice(opener.index, startpos);
    if (length === 0) this.pos = startpos;
    if (label === null) return null;
    const found = this.refmap[normalizeReference(label)];
    return found ? { destination: found.destination, title: found.title } : null;
  }

  parseLinkLabel() {
    const found = this.match(reLinkLabel);
    return found === null ? 0 : found.length;
  }

  parseLinkTitle() {
    const found = this.match(reLinkTitle);
    return found === null ? null : unescapeString(found.slice(1, -1));
  }

  parseLinkDestination() {
    const braced = this.match(reLinkDestinationBraces);
    if (braced !== null) return normalizeURI(unescapeString(braced.slice(1, -1)));
    if (this.peek() === "<") return null;
    const start = this.pos;
    let depth = 0;
    let c;
    while ((c = this.peek()) !== "") {
      if (c === "\\" && reEscapable.test(this.subject.charAt(this.pos + 1))) {
        this.pos += 2;
      } else if (c === "(") {
        this.pos += 1;
        depth += 1;
      } else if (c === ")") {
        if (depth < 1) break;
        this.pos += 1;
        depth -= 1;
      } else if (/[\x00-\x20\x7f]/.test(c)) {
        break;
      } else {
        this.pos += 1;
      }
    }
    if (this.pos === start && c !== ")") return null;
    if (depth !== 0) return null;
    return normalizeURI(unescapeString(this.subject.slice(start, this.pos)));
  }

  // A link reference definition at the start of `subject`: how many characters it took.
  parseReference(subject) {
    this.subject = subject;
    this.pos = 0;
    const length = this.parseLinkLabel();
    if (length === 0) return 0;
    const label = this.subject.slice(0, length);
    if (this.peek() !== ":") return 0;
    this.pos += 1;
    this.spnl();
    const destination = this.parseLinkDestination();
    if (destination === null) return 0;
    const beforeTitle = this.pos;
    this.spnl();
    let title = null;
    if (this.pos !== beforeTitle) title = this.parseLinkTitle();
    if (title === null) {
      title = "";
      this.pos = beforeTitle;
    }
    let atLineEnd = this.match(reSpaceAtEndOfLine) !== null;
    if (!atLineEnd && title !== "") {
      title = "";
      this.pos = beforeTitle;
      atLineEnd = this.match(reSpaceAtEndOfLine) !== null;
    }
    if (!atLineEnd) return 0;
    const key = normalizeReference(label);
    if (key === "") return 0;
    if (!(key in this.refmap)) this.refmap[key] = { destination, title };
    return this.pos;
  }

  parseAutolink(block) {
    let found = this.match(reEmailAutolink);
    let destination;
    if (found !== null) {
      destination = normalizeURI("mailto:" + found.slice(1, -1));
    } else if ((found = this.match(reAutolink)) !== null) {
      destination = normalizeURI(found.slice(1, -1));
    } else {
      return false;
    }
    const link = new Node("link");
    link.destination = destination;
    link.title = "";
    link.appendChild(text(found.slice(1, -1)));
    block.appendChild(link);
    return true;
  }

  parseEntity(block) {
    const found = this.match(reEntity);
    if (found === null) return false;
    const decoded = decodeEntity(found);
    block.appendChild(text(decoded === null ? found : decoded));
    return true;
  }
}

/// Where the code point that ends just before `index` starts (a surrogate pair is one).
function lastCodePointStart(text, index) {
  const low = text.charCodeAt(index - 1);
  if (index >= 2 && low >= 0xdc00 && low <= 0xdfff) {
    const high = text.charCodeAt(index - 2);
    if (high >= 0xd800 && high <= 0xdbff) return index - 2;
  }
  return index - 1;
}

/// Adjacent text nodes as one, all the way down.
function mergeText(block) {
  for (let node = block.firstChild; node; node = node.next) {
    while (node.type === "text" && node.next && node.next.type === "text") {
      node.literal += node.next.literal;
      node.next.unlink();
    }
    if (node.firstChild) mergeText(node);
  }
  // Emptied delimiter runs leave empty text behind.
  for (let node = block.firstChild; node;) {
    const next = node.next;
    if (node.type === "text" && node.literal === "") node.unlink();
    node = next;
  }
}

export function parse(markdown) {
  return new BlockParser().parse(markdown);
}
