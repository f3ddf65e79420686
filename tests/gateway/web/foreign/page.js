// A page on another origin following an ACP session's events, as docs/console.md shows:
// a ticket from events.ticket (fetch, with the token), then EventSource with ?ticket=.
// When the connection drops it takes a fresh ticket and resumes after the last id seen.
window.seen = [];
window.failures = [];

async function ticket(acp, token, sessionId) {
  const response = await fetch(`${acp}/api/v1/acp`, {
    method: "POST",
    headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json" },
    body: JSON.stringify({ operation: "events.ticket", params: { session_id: sessionId } }),
  });
  return (await response.json()).data.ticket;
}

window.follow = async function follow(acp, token, sessionId) {
  let last = 0;
  const open = async () => {
    let fresh;
    try {
      fresh = await ticket(acp, token, sessionId);
    } catch (err) {
      window.failures.push(String(err));
      setTimeout(open, 500);
      return;
    }
    const url = new URL(`${acp}/api/v1/events/stream`);
    url.searchParams.set("ticket", fresh);
    url.searchParams.set("session_id", sessionId);
    if (last) url.searchParams.set("after_sequence", String(last));
    const source = new EventSource(url);
    window.source = source;
    source.addEventListener("open", () => { document.getElementById("state").textContent = "open"; });
    source.addEventListener("session.message", (frame) => {
      const sequence = Number(frame.lastEventId);
      if (sequence <= last) return;
      last = sequence;
      window.seen.push(sequence);
      const item = document.createElement("li");
      item.textContent = JSON.parse(frame.data).session_message.message.content;
      document.getElementById("events").append(item);
    });
    source.addEventListener("error", () => {
      source.close();
      document.getElementById("state").textContent = "reconnecting";
      setTimeout(open, 250);
    });
  };
  await open();
};
