// Sessions: the list, a form to create one, and a chat: a message is sent as a background
// tell (one at a time), each turn's state shows on its message with a Cancel button while
// it is queued or running, and the replies appear as the session.message events arrive
// (and from session.turn once the turn ends, whichever comes first); a model
// orchestrator's text shows as it streams (session.text_delta), then gives way to the
// stored reply.

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

// A turn's state, as the chat shows it; a turn never goes back to an earlier one (answers
// and events may arrive in any order).
const TURN_ORDER = { queued: 0, running: 1, succeeded: 2, failed: 2, cancelled: 2, interrupted: 2 };
const turnState = (turn) => shortEnum(turn.state, "TURN_STATE_");

async function showChat(view, sessionId) {
  const problem = h("p", { class: "error", role: "alert" });
  const messages = h("ol", { class: "chat", id: "messages" });
  const shown = new Set();
  // The session's turns (ACP 1.3) by id, each painted on the user's message it answers.
  const turns = new Map();
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
  const itemOf = (messageId) => [...messages.children].find((li) => li.dataset.id === messageId);
  const cancelTurn = async (turnId, button) => {
    button.disabled = true;
    problem.textContent = "";
    try {
      note((await call("session.cancel_turn", { session_id: sessionId, turn_id: turnId })).turn);
    } catch (err) {
      problem.textContent = errorText(err);
      button.disabled = false;
    }
  };
  const paint = (turn) => {
    const item = itemOf(turn.message_id);
    if (!item) return;
    let badge = item.querySelector(".turn");
    if (!badge) {
      badge = h("div", { class: "turn" });
      item.append(badge);
    }
    const state = turnState(turn);
    badge.dataset.turn = turn.id;
    badge.dataset.state = state;
    const active = state === "queued" || state === "running";
    const why = !active && turn.error && turn.error.message ? turn.error.message : "";
    replace(badge, h("span", { class: `state ${state}` }, state), why ? h("span", { class: "muted why" }, why) : null,
      active ? h("button", { type: "button", class: "small cancel-turn", onclick: (e) => cancelTurn(turn.id, e.currentTarget) }, "Cancel") : null);
  };
  const note = (turn) => {
    if (!turn || !turn.id) return;
    const known = turns.get(turn.id);
    if (known && TURN_ORDER[turnState(known)] > TURN_ORDER[turnState(turn)]) return;
    turns.set(turn.id, turn);
    paint(turn);
  };
  const place = (item, index) => {
    const after = [...messages.children].find((li) => li.classList.contains("streaming") || Number(li.dataset.index) > index);
    messages.insertBefore(item, after || null);
  };
  const add = (message) => {
    if (!message || !message.id || shown.has(message.id)) return;
    shown.add(message.id);
    const role = shortEnum(message.role, "MESSAGE_ROLE_");
    if (role === "user") turnOpen = true;
    else settle();
    // A queued message shown from the tell's answer gives way to the stored one.
    itemOf(message.id)?.remove();
    const item = h("li", { class: `message ${role}${message.partial ? " partial" : ""}`, data: { id: message.id, index: message.index || 0 } },
      h("span", { class: "role" }, role),
      h("div", { class: "content" }, message.content || ""),
      message.plan_id ? h("a", { class: "plan-link", href: `#/plans/${encodeURIComponent(message.plan_id)}` }, `plan ${message.plan_id}`) : null);
    place(item, message.index || 0);
    const turn = turns.get(message.turn_id);
    if (turn) paint(turn);
  };
  // The user's message of a turn still queued: not in the history yet (it joins when the
  // turn starts), shown at the end meanwhile.
  const addQueued = (message) => {
    if (!message || !message.id || shown.has(message.id) || itemOf(message.id)) return;
    place(h("li", { class: "message user queued", data: { id: message.id, index: Number.MAX_SAFE_INTEGER } },
      h("span", { class: "role" }, "user"), h("div", { class: "content" }, message.content || "")), Number.MAX_SAFE_INTEGER);
  };
  const input = h("textarea", { name: "content", rows: 2, placeholder: "Message (Enter sends, Shift+Enter for a new line)", id: "message-input" });
  const send = h("button", { type: "submit", class: "primary", id: "send" }, "Send");
  const form = h("form", { class: "chat-form", id: "tell" }, input, send);
  // One send at a time: while a tell is on its way the button is disabled and Enter does
  // nothing, so a double press or a double click sends once.
  let sending = false;
  input.addEventListener("keydown", (event) => {
    if (event.key !== "Enter" || event.shiftKey || event.isComposing) return;
    event.preventDefault();
    if (!sending) form.requestSubmit();
  });
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const content = input.value;
    if (sending || !content.trim()) return;
    sending = true;
    send.disabled = true;
    form.setAttribute("aria-busy", "true");
    input.value = "";
    problem.textContent = "";
    turnOpen = true;
    try {
      // A background tell answers at once with the queued turn; its progress arrives as
      // events (turn started, deltas, messages, turn completed), from this tab or any other.
      const told = await call("session.tell", { session_id: sessionId, content, background: true });
      if (told.turn && turnState(told.turn) === "queued") addQueued(told.message);
      else add(told.message);
      note(told.turn);
    } catch (err) {
      problem.textContent = errorText(err);
      settle();
      input.value = content;
    } finally {
      sending = false;
      send.disabled = false;
      form.removeAttribute("aria-busy");
    }
  });
  // A finished turn's messages, read back (in case the feed was away when they came).
  const finished = async (turn) => {
    note(turn);
    // Its streamed text ends with it (a cancelled turn's is not kept).
    settle();
    try {
      const read = await call("session.turn", { session_id: sessionId, turn_id: turn.id });
      for (const message of read.messages || []) add(message);
      note(read.turn);
    } catch (err) {
      problem.textContent = errorText(err);
    }
  };
  const heading = h("h2", {}, "Session");
  replace(view, h("section", {}, h("a", { href: "#/sessions" }, "← Sessions"), heading, problem, messages, form));
  const onEvent = (event) => {
    const e = event.detail;
    if (e.session_id !== sessionId) return;
    if (e.type === "session.message") add(e.session_message.message);
    else if (e.type === "session.text_delta") grow(e.session_text_delta);
    else if (e.type === "session.turn_started") note(e.session_turn_started.turn);
    else if (e.type === "session.turn_completed") finished(e.session_turn_completed.turn);
  };
  window.addEventListener("acp:event", onEvent);
  try {
    const shownSession = await call("session.show", { session_id: sessionId });
    heading.textContent = shownSession.session.title || sessionId;
    for (const turn of shownSession.turns || []) turns.set(turn.id, turn);
    for (const message of shownSession.messages || []) add(message);
    for (const turn of shownSession.turns || []) note(turn);
  } catch (err) {
    problem.textContent = errorText(err);
  }
  input.focus();
  return () => window.removeEventListener("acp:event", onEvent);
}
