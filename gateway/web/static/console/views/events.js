// The live event panel: its own feed with the filters chosen here (bound to its stream
// ticket), resuming after a dropped connection with nothing lost or shown twice.

import { eventTypes } from "../api.js";
import { h, replace, when } from "../dom.js";
import { EventFeed } from "../stream.js";

const KEPT = 1000;

export async function showEvents(view) {
  const planId = h("input", { name: "plan_id", placeholder: "plan id" });
  const sessionId = h("input", { name: "session_id", placeholder: "session id" });
  const types = h("select", { name: "event_type", multiple: true, size: 4 },
    (await eventTypes()).map((type) => h("option", { value: type }, type)));
  const state = h("span", { class: "status", id: "feed-state" });
  const count = h("span", { class: "muted", id: "event-count" });
  const rows = h("tbody", { id: "event-rows" });
  let feed = null;
  let seen = 0;

  const start = () => {
    if (feed) feed.stop();
    replace(rows);
    seen = 0;
    const filters = {};
    if (planId.value.trim()) filters.plan_id = planId.value.trim();
    if (sessionId.value.trim()) filters.session_id = sessionId.value.trim();
    const chosen = [...types.selectedOptions].map((o) => o.value);
    if (chosen.length) filters.event_type = chosen;
    feed = new EventFeed(filters, {
      onEvent: (event) => {
        seen += 1;
        count.textContent = `${seen} events`;
        rows.prepend(h("tr", { data: { sequence: event.sequence, type: event.type } },
          h("td", { class: "mono seq" }, String(event.sequence)),
          h("td", {}, event.type),
          h("td", { class: "mono" }, event.plan_id || event.session_id || ""),
          h("td", {}, when(event.time)),
          h("td", { class: "payload" }, summary(event))));
        while (rows.children.length > KEPT) rows.lastElementChild.remove();
      },
      onState: (name, err) => {
        state.textContent = err ? `${name}: ${err.code || ""} ${err.message || ""}` : name;
        state.dataset.state = name;
      },
    });
    feed.start();
  };
  const form = h("form", { class: "inline filters", id: "event-filters" }, planId, sessionId, types,
    h("button", { type: "submit", class: "primary" }, "Watch"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    start();
  });
  replace(view, h("section", {}, h("h2", {}, "Events ", state, " ", count), form,
    h("table", { id: "events" }, h("thead", {}, h("tr", {}, ["Seq", "Type", "Plan / session", "Time", "Payload"].map((t) => h("th", {}, t)))), rows)));
  start();
  return () => feed && feed.stop();
}

function summary(event) {
  const field = Object.keys(event).find((key) => !["sequence", "type", "namespace", "plan_id", "session_id", "time"].includes(key));
  return field ? JSON.stringify(event[field]) : "";
}
