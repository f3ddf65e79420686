// DOM from data: every string becomes a text node or an attribute value, never markup.
// (The page's Content-Security-Policy requires Trusted Types, so an HTML sink would throw.)

export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") {
      el.addEventListener(key.slice(2), value);
    } else if (key === "class") {
      el.className = value;
    } else if (key === "data") {
      for (const [name, item] of Object.entries(value)) el.dataset[name] = String(item);
    } else if (key === "value" || key === "checked" || key === "open") {
      el[key] = value;
    } else {
      el.setAttribute(key, value === true ? "" : String(value));
    }
  }
  append(el, children);
  return el;
}

export function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function replace(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

export function shortEnum(value, prefix) {
  return String(value || "").replace(prefix, "").toLowerCase();
}

export function when(timestamp) {
  if (!timestamp) return "";
  const date = new Date(timestamp);
  return Number.isNaN(date.getTime()) ? String(timestamp) : date.toLocaleString();
}

export function errorText(err) {
  if (err && err.code) return `${err.code}: ${err.message}`;
  return String(err && err.message ? err.message : err);
}

// A modal confirmation; resolves to the text typed (or "" when no input is asked) or null.
export function confirmAction(text, input) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent = text;
  const label = document.getElementById("confirm-input-label");
  const field = document.getElementById("confirm-input");
  label.hidden = !input;
  document.getElementById("confirm-input-name").textContent = input || "";
  field.value = "";
  return new Promise((resolve) => {
    dialog.addEventListener(
      "close",
      () => resolve(dialog.returnValue === "ok" ? field.value : null),
      { once: true },
    );
    dialog.returnValue = "";
    dialog.showModal();
  });
}
