// The console's shell: sign-in, navigation by the URL fragment, and one live feed whose
// events every view may listen to (window "acp:event").

import { session } from "./api.js";
import { h, replace } from "./dom.js";
import { EventFeed } from "./stream.js";
import { showSignIn } from "./views/signin.js";
import { showSessions } from "./views/sessions.js";
import { showPlans } from "./views/plans.js";
import { showRegistries } from "./views/registries.js";
import { showEvents } from "./views/events.js";
import { showApprovals, watchInbox } from "./views/approvals.js";
import { showWebhooks } from "./views/webhooks.js";

const view = document.getElementById("view");
const nav = document.getElementById("nav");
const signOut = document.getElementById("sign-out");
const status = document.getElementById("status");
let feed = null;
let cleanup = null;
let inbox = null;

const routes = {
  sessions: showSessions,
  plans: showPlans,
  registries: showRegistries,
  events: showEvents,
  approvals: showApprovals,
  webhooks: showWebhooks,
};

function startFeed() {
  if (feed) return;
  feed = new EventFeed({}, {
    onEvent: (event) => window.dispatchEvent(new CustomEvent("acp:event", { detail: event })),
    onState: (state) => {
      status.textContent = state === "live" ? "live" : state;
      status.dataset.state = state;
    },
  });
  feed.start();
  inbox = watchInbox(document.getElementById("approval-count"));
}

function stopFeed() {
  if (feed) feed.stop();
  feed = null;
  if (inbox) inbox();
  inbox = null;
}

async function render() {
  if (cleanup) cleanup();
  cleanup = null;
  if (!session.token()) {
    stopFeed();
    nav.hidden = true;
    signOut.hidden = true;
    status.textContent = "";
    showSignIn(view, () => {
      location.hash = "#/sessions";
      render();
    });
    return;
  }
  nav.hidden = false;
  signOut.hidden = false;
  startFeed();
  const [name, ...rest] = location.hash.replace(/^#\/?/, "").split("/");
  const show = routes[name] || showSessions;
  for (const link of nav.querySelectorAll("a")) {
    link.classList.toggle("current", link.getAttribute("href") === `#/${name || "sessions"}`);
  }
  replace(view, h("p", { class: "muted" }, "Loading…"));
  cleanup = (await show(view, rest.map(decodeURIComponent))) || null;
}

signOut.addEventListener("click", () => {
  session.signOut();
  location.hash = "";
  render();
});
window.addEventListener("acp:auth-required", () => {
  // A token that stopped working (revoked, expired) signs the tab out; on the sign-in
  // form itself the form shows the refusal.
  if (!session.token() || nav.hidden) return;
  session.signOut();
  render();
});
window.addEventListener("hashchange", render);
render();
