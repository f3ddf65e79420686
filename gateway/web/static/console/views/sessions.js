// Sessions: the list, a form to create one, and a chat whose replies appear as the
// session.message events arrive (and from session.tell's answer, whichever comes first);
// a model orchestrator's text shows as it streams (session.text_delta), then gives way to
// the stored reply.

import { call } from "../api.js";
import { errorText, h, replace, shortEnum, when } from "../dom.js";

export async function showSessions(view, [sessionId]) {
  if (sessionId) return showChat(view, sessionId);
  const problem = h("p", { class: "error", role: "alert" });
  const title = h("input", { name: "title", placeholder: "Title" });
  const form = h("form", { class: "inline", id: "new-session" }, title, h("button", { type: "submit", class: "primary" }, "New session"));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      const created = await call("session.create", { title: title.value });
      location.hash = `#/sessions/${encodeURIComponent(created.session.meta.id)}`;
    } catch (err) {
      problem.textContent = errorText(err);
    }
  });
  const rows = h("tbody");
  replace(view, h("section", {}, h("h2", {}, "Sessions"), form, problem, h("table", { id: "sessions" },
    h("thead", {}, h("tr", {}, ["Title", "Id", "Project", "Orchestrator", "State", "Messages", "Created"].map((t) => h("th", {}, t)))),
    rows)));
  try {
    const listed = await call("session.list", { page_size: 100 });
    for (const s of listed.sessions || []) {
      const link = h("a", { href: `#/sessions/${encodeURIComponent(s.meta.id)}` }, s.title || "(untitled)");
      rows.append(h("tr", { data: { session: s.meta.id } }, h("td", {}, link), h("td", { class: "mono" }, s.meta.id),
        h("td", { class: "project" }, s.project || ""), h("td", { class: "orchestrator" }, s.orchestrator || ""),
        h("td", {}, shortEnum(s.state, "SESSION_STATE_")), h("td", {}, String(s.message_count || 0)),
        h("td", {}, when(s.meta.create_time))));
    }
    if (!rows.children.length) rows.append(h("tr", {}, h("td", { colspan: 7, class: "muted" }, "No sessions yet.")));
  } catch (err) {
    problem.textContent = errorText(err);
  }
  return null;
}

async function showChat(view, sessionId) {
  const problem = h("p", { class: "error", role: "alert" });
  const messages = h("ol", { class: "chat", id: "messages" });
  const shown = new Set();
  // The text streaming now, one item per model turn; shown only while a turn is under way
  // (from a message sent until the orchestrator's reply is stored), so a late piece of a
  // finished turn never reappears after its reply.
  const streaming = new Map();
  let turnOpen = false;
  const settle = () => {
    for (const item of streaming.values()) item.remove();
    streaming.clear();
    turnOpen = false;
  };
  const grow = (delta) => {
    if (!turnOpen || !delta) return;
    let item = streaming.get(delta.turn || 0);
    if (!item) {
      item = h("li", { class: "message orchestrator streaming", data: { turn: delta.turn || 0 } },
        h("span", { class: "role" }, "orchestrator"), h("div", { class: "content" }));
      streaming.set(delta.turn || 0, item);
      messages.append(item);
    }
    item.querySelector(".content").append(delta.text || "");
  };
  const add = (message) => {
    if (!message || !message.id || shown.has(message.id)) return;
    shown.add(message.id);
    const role = shortEnum(message.role, "MESSAGE_ROLE_");
    if (role === "user") turnOpen = true;
    else settle();
    const item = h("li", { class: `message ${role}`, data: { id: message.id, index: message.index || 0 } },
      h("span", { class: "role" }, role),
      h("div", { class: "content" }, message.content || ""),
      message.plan_id ? h("a", { class: "plan-link", href: `#/plans/${encodeURIComponent(message.plan_id)}` }, `plan ${message.plan_id}`) : null);
    const after = [...messages.children].find((li) => li.classList.contains("streaming") || Number(li.dataset.index) > (message.index || 0));
    messages.insertBefore(item, after || null);
  };
  const input = h("textarea", { name: "content", rows: 2, placeholder: "Message", id: "message-input" });
  const form = h("form", { class: "chat-form", id: "tell" }, input, h("button", { type: "submit", class: "primary" }, "Send"));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const content = input.value;
    if (!content.trim()) return;
    input.value = "";
    problem.textContent = "";
    turnOpen = true;
    try {
      const told = await call("session.tell", { session_id: sessionId, content });
      add(told.message);
      for (const reply of told.replies || []) add(reply);
    } catch (err) {
      problem.textContent = errorText(err);
      settle();
      input.value = content;
    }
  });
  const heading = h("h2", {}, "Session");
  replace(view, h("section", {}, h("a", { href: "#/sessions" }, "← Sessions"), heading, problem, messages, form));
  const onEvent = (event) => {
    const e = event.detail;
    if (e.session_id !== sessionId) return;
    if (e.type === "session.message") add(e.session_message.message);
    else if (e.type === "session.text_delta") grow(e.session_text_delta);
  };
  window.addEventListener("acp:event", onEvent);
  try {
    const shownSession = await call("session.show", { session_id: sessionId });
    heading.textContent = shownSession.session.title || sessionId;
    for (const message of shownSession.messages || []) add(message);
  } catch (err) {
    problem.textContent = errorText(err);
  }
  input.focus();
  return () => window.removeEventListener("acp:event", onEvent);
}
