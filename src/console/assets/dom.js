// Building DOM without HTML strings: every text goes in as a text node, so nothing a model or
// a file says can become markup.

// h("div", { class: "x", onclick: fn }, "text", child, [more]) → an element.
export function h(tag, attrs, ...children) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") {
      element.addEventListener(name.slice(2), value);
    } else if (name === "class") {
      element.className = value;
    } else if (name === "value" || name === "checked" || name === "disabled") {
      element[name] = value;
    } else if (name === "dataset") {
      Object.assign(element.dataset, value);
    } else if (name in element && typeof value !== "string") {
      element[name] = value;
    } else {
      element.setAttribute(name, value === true ? "" : String(value));
    }
  }
  append(element, children);
  return element;
}

export function append(element, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return element;
}

export function clear(element) {
  while (element.firstChild) element.firstChild.remove();
  return element;
}

export function when(iso) {
  if (!iso) return "";
  const date = new Date(iso);
  const today = new Date();
  return date.toDateString() === today.toDateString()
    ? date.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" })
    : date.toLocaleDateString([], { month: "short", day: "numeric" });
}

export function bytes(size) {
  if (size === undefined || size === null) return "";
  if (size < 1024) return `${size} B`;
  if (size < 1024 * 1024) return `${(size / 1024).toFixed(1)} KB`;
  return `${(size / 1024 / 1024).toFixed(1)} MB`;
}

// A small modal asking for confirmation; resolves true or false.
export function confirmDialog(message, action = "Delete") {
  return new Promise((resolve) => {
    const done = (answer) => {
      overlay.remove();
      resolve(answer);
    };
    const overlay = h("div", { class: "overlay", onclick: (e) => { if (e.target === overlay) done(false); } },
      h("div", { class: "dialog", role: "dialog", "aria-modal": "true" },
        h("p", {}, message),
        h("div", { class: "row end" },
          h("button", { type: "button", onclick: () => done(false) }, "Cancel"),
          h("button", { type: "button", class: "danger", onclick: () => done(true) }, action))));
    overlay.addEventListener("keydown", (e) => { if (e.key === "Escape") done(false); });
    document.body.append(overlay);
    overlay.querySelector("button.danger").focus();
  });
}

export function toast(message, kind = "info") {
  let box = document.querySelector(".toasts");
  if (!box) {
    box = h("div", { class: "toasts", role: "status", "aria-live": "polite" });
    document.body.append(box);
  }
  const item = h("div", { class: `toast ${kind}` }, message);
  box.append(item);
  setTimeout(() => item.remove(), 6000);
}
