// Registries: browse each kind, show an entry, add and update with the server's
// validation errors shown beside the field they name (details.field).

import { call, registryKinds } from "../api.js";
import { errorText, h, replace, when } from "../dom.js";

export async function showRegistries(view, [kind, name]) {
  const kinds = await registryKinds();
  kind = kinds.includes(kind) ? kind : kinds[0];
  const picker = h("nav", { class: "tabs", id: "kinds" }, kinds.map((k) =>
    h("a", { href: `#/registries/${k}`, class: k === kind ? "tab current" : "tab" }, k)));
  const problem = h("p", { class: "error", role: "alert" });
  const rows = h("tbody");
  const editor = h("div", { id: "editor" });
  replace(view, h("section", {}, h("h2", {}, "Registries"), picker, problem,
    h("div", { class: "split" },
      h("table", { id: "entries" }, h("thead", {}, h("tr", {}, ["Name", "Namespace", "Revision", "Description", "Updated"].map((t) => h("th", {}, t)))), rows),
      editor)));
  try {
    const listed = await call(`${kind}.list`, { page_size: 500 });
    const entries = Object.values(listed).find(Array.isArray) || [];
    for (const entry of entries) {
      rows.append(h("tr", { data: { name: entry.name } },
        h("td", {}, h("a", { href: `#/registries/${kind}/${encodeURIComponent(entry.name)}` }, entry.name)),
        h("td", {}, (entry.meta && entry.meta.namespace) || ""),
        h("td", {}, String(entry.revision || "")),
        h("td", {}, entry.description || ""),
        h("td", {}, when(entry.meta && entry.meta.update_time))));
    }
  } catch (err) {
    problem.textContent = errorText(err);
  }
  let entry = null;
  if (name) {
    try {
      const shown = await call(`${kind}.show`, { name });
      entry = Object.values(shown).find((v) => v && typeof v === "object") || null;
    } catch (err) {
      problem.textContent = errorText(err);
    }
  }
  replace(editor, entryForm(kind, entry));
  return null;
}

function entryForm(kind, entry) {
  const fields = {
    name: h("input", { name: "name", value: entry ? entry.name : "", readonly: Boolean(entry), required: true }),
    description: h("input", { name: "description", value: entry ? entry.description || "" : "" }),
    labels: h("textarea", { name: "labels", rows: 2, placeholder: "key=value, one per line",
      value: entry ? Object.entries(entry.labels || {}).map(([k, v]) => `${k}=${v}`).join("\n") : "" }),
    spec: h("textarea", { name: "spec", rows: 12, class: "mono", value: entry ? JSON.stringify(entry.spec || {}, null, 2) : "{}" }),
  };
  const problems = Object.fromEntries(Object.keys(fields).map((key) => [key, h("p", { class: "field-error", data: { field: key } })]));
  const general = h("p", { class: "error", role: "alert" });
  const done = h("p", { class: "ok", role: "status" });
  const labelled = (key, title) => h("label", {}, title, fields[key], problems[key]);
  const form = h("form", { class: "card", id: "entry-form" },
    h("h3", {}, entry ? `Update ${kind} ${entry.name} (revision ${entry.revision})` : `Add a ${kind}`),
    labelled("name", "Name"), labelled("description", "Description"), labelled("labels", "Labels"), labelled("spec", "Spec (JSON)"),
    general, done,
    h("button", { type: "submit", class: "primary" }, entry ? "Update" : "Add"));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    for (const p of Object.values(problems)) p.textContent = "";
    general.textContent = "";
    done.textContent = "";
    let spec;
    try {
      spec = JSON.parse(fields.spec.value || "{}");
    } catch (err) {
      problems.spec.textContent = `spec: not valid JSON (${err.message})`;
      return;
    }
    const labels = {};
    for (const line of fields.labels.value.split("\n")) {
      if (!line.trim()) continue;
      const at = line.indexOf("=");
      labels[line.slice(0, at < 0 ? line.length : at).trim()] = at < 0 ? "" : line.slice(at + 1).trim();
    }
    const params = { name: fields.name.value, description: fields.description.value, labels, spec };
    if (entry) {
      params.revision = entry.revision;
      params.namespace = entry.meta.namespace;
    }
    try {
      const answer = await call(`${kind}.${entry ? "update" : "add"}`, params);
      const saved = Object.values(answer).find((v) => v && typeof v === "object");
      done.textContent = `Saved ${saved.name} at revision ${saved.revision}.`;
      location.hash = `#/registries/${kind}/${encodeURIComponent(saved.name)}`;
    } catch (err) {
      const path = String((err.details && err.details.field) || "");
      const top = path.split(/[.[]/)[0];
      if (problems[top]) problems[top].textContent = `${path}: ${err.message}`;
      else general.textContent = errorText(err);
    }
  });
  return form;
}
