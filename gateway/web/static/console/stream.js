// A live event feed over EventSource, authenticated by single-use stream tickets.
//
// EventSource cannot send an Authorization header, so each connection carries a ticket
// from events.ticket, bound to the feed's filters and good for one connection. When the
// connection drops, the browser's own retry would present the used ticket again and be
// refused, so the feed closes the source, asks for a fresh ticket, and reconnects with
// after_sequence = the last sequence it delivered. Events at or below that sequence are
// dropped, so nothing is shown twice; the server's backlog fills what was missed.

import { call, eventTypes, url } from "./api.js";

const RETRY_MS = [250, 500, 1000, 2000, 3000];

export class EventFeed {
  // filters: {plan_id, session_id, namespace, event_type: [...]}
  constructor(filters, { onEvent, onState, after = 0 } = {}) {
    this.filters = filters || {};
    this.onEvent = onEvent || (() => {});
    this.onState = onState || (() => {});
    this.last = after;
    this.source = null;
    this.stopped = false;
    this.failures = 0;
    this.timer = null;
  }

  async start() {
    try {
      this.types = await eventTypes();
    } catch {
      this.retry(() => this.start());
      return;
    }
    await this.connect();
  }

  stop() {
    this.stopped = true;
    clearTimeout(this.timer);
    if (this.source) this.source.close();
    this.source = null;
    this.onState("stopped");
  }

  async connect() {
    if (this.stopped) return;
    this.onState("connecting");
    let ticket;
    try {
      ticket = (await call("events.ticket", this.filters)).ticket;
    } catch (err) {
      if (err.code === "AUTH_REQUIRED" || err.code === "AUTH_FORBIDDEN" || err.code === "INVALID_PARAMS") {
        this.onState("refused", err);
        return;
      }
      this.retry();
      return;
    }
    if (this.stopped) return;
    const target = url("api/v1/events/stream");
    target.searchParams.set("ticket", ticket);
    for (const key of ["plan_id", "session_id", "namespace"]) {
      if (this.filters[key]) target.searchParams.set(key, this.filters[key]);
    }
    for (const type of this.filters.event_type || []) target.searchParams.append("event_type", type);
    if (this.last) target.searchParams.set("after_sequence", String(this.last));
    const source = new EventSource(target);
    this.source = source;
    source.addEventListener("open", () => {
      this.failures = 0;
      this.onState("live");
    });
    for (const type of this.types) source.addEventListener(type, (frame) => this.deliver(frame));
    source.addEventListener("error", (frame) => {
      // An `event: error` frame from the server (a subscriber too slow, the server
      // shutting down) or a dropped connection: either way, resume with a new ticket.
      if (source !== this.source) return;
      source.close();
      this.source = null;
      if (frame.data) this.onState("error", JSON.parse(frame.data).error);
      this.retry();
    });
  }

  deliver(frame) {
    const sequence = Number(frame.lastEventId);
    if (!(sequence > this.last)) return;
    this.last = sequence;
    this.onEvent(JSON.parse(frame.data));
  }

  retry(next = () => this.connect()) {
    if (this.stopped) return;
    const delay = RETRY_MS[Math.min(this.failures, RETRY_MS.length - 1)];
    this.failures += 1;
    this.onState("reconnecting");
    clearTimeout(this.timer);
    this.timer = setTimeout(next, delay);
  }
}
