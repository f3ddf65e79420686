// Webhooks (ACP 1.3): the namespace's subscriptions with their health (webhook.list), and
// for one of them its delivery history (webhook.deliveries) with Test (webhook.test) and
// Enable/Disable (webhook.update at the revision read). Kept live by the shell's feed: a
// webhook.disabled event refreshes at once, other events (each may be delivered) a moment
// later. No secret is shown here: webhook.list/show/deliveries never carry one.

import { call } from "../api.js";
import { h, replace, errorText, when, shortEnum } from "../dom.js";

const RESULT = "WEBHOOK_DELIVERY_RESULT_";
// Deliveries follow their event by the deliverer's write; one refresh per burst of events.
const SETTLE_MS = 1000;

function filterText(filter) {
  const parts = [];
  if (filter && filter.plan_id) parts.push(`plan ${filter.plan_id}`);
  if (filter && filter.session_id) parts.push(`session ${filter.session_id}`);
  if (filter && (filter.event_type || []).length) parts.push(filter.event_type.join(", "));
  return parts.length ? parts.join(" · ") : "every event";
}

function stateOf(hook) {
  if (hook.enabled) return h("span", { class: "state succeeded" }, "enabled");
  const reason = (hook.health || {}).disabled_reason;
  return h("span", {},
    h("span", { class: "state failed" }, "disabled"),
    h("span", { class: "muted", data: { reason: "" } }, reason ? ` ${reason}` : " (by a caller)"));
}

function healthText(hook) {
  const health = hook.health || {};
  const last = [];
  if (health.last_success_time) last.push(`ok ${when(health.last_success_time)}`);
  if (health.last_failure_time) last.push(`failed ${when(health.last_failure_time)}`);
  return [
    last.length ? last.join(" · ") : "nothing delivered yet",
    ` · ${health.delivered || 0} delivered`,
    Number(health.consecutive_failures || 0) ? ` · ${health.consecutive_failures} failures in a row` : "",
    health.last_error ? ` · last error: ${health.last_error}` : "",
    health.next_attempt_time ? ` · next attempt ${when(health.next_attempt_time)}` : "",
    ` · cursor ${health.cursor || 0} · backlog ${health.backlog || 0}`,
  ].join("");
}

function deliveryRow(d) {
  const result = shortEnum(d.result, RESULT);
  return h("tr", { data: { number: d.number || 0, result } },
    h("td", { class: "mono" }, d.delivery_id),
    h("td", {}, d.event_type),
    h("td", {}, String(d.attempt || 0)),
    h("td", {}, h("span", { class: `state ${result === "succeeded" ? "succeeded" : "failed"}` }, result)),
    h("td", { class: "mono" }, String(d.response_code || "—")),
    h("td", {}, `${Math.round(Number(d.latency_ms || 0))} ms`),
    h("td", {}, when(d.time)),
    h("td", { class: "mono" }, [d.error, d.response_excerpt].filter(Boolean).join(" · ")));
}

export async function showWebhooks(view, [name] = []) {
  const problem = h("p", { class: "error", role: "alert", id: "webhook-problem" });
  const rows = h("tbody", {});
  const detail = h("div", { id: "webhook-detail" });
  let timer = null;
  // The last test's answer, kept across the refreshes that follow it.
  let tested = "";

  const act = async (work) => {
    problem.textContent = "";
    try {
      await work();
    } catch (err) {
      problem.textContent = errorText(err);
    }
    await refresh();
  };

  const showDetail = async (hook) => {
    const { deliveries } = await call("webhook.deliveries", { name: hook.name, page_size: 100 });
    const found = deliveries || [];
    replace(detail,
      h("h3", {}, `Deliveries of ${hook.name}`),
      h("div", { class: "actions" },
        h("button", { type: "button", id: "webhook-test", onclick: () => act(async () => {
          const { delivery } = await call("webhook.test", { name: hook.name });
          const d = delivery || {};
          tested = `test: ${shortEnum(d.result, RESULT)} ${d.response_code || ""} ${d.error || ""}`.trim();
        }) }, "Send a test"),
        h("button", { type: "button", id: "webhook-toggle", class: "primary", onclick: () => act(() => call("webhook.update", {
          name: hook.name, revision: hook.revision, enabled: !hook.enabled, update_mask: "enabled",
        })) }, hook.enabled ? "Disable" : "Enable"),
        h("span", { class: "muted", id: "webhook-test-result" }, tested)),
      found.length
        ? h("table", { id: "deliveries" },
          h("thead", {}, h("tr", {}, ["Id", "Event", "Attempt", "Result", "HTTP", "Latency", "Time", "Error / answer"].map((t) => h("th", {}, t)))),
          h("tbody", {}, found.map(deliveryRow)))
        : h("p", { class: "muted", id: "no-deliveries" }, "No delivery yet."));
  };

  const refresh = async () => {
    clearTimeout(timer);
    timer = null;
    try {
      const { webhooks } = await call("webhook.list", { page_size: 500 });
      const hooks = webhooks || [];
      replace(rows, hooks.map((hook) => h("tr", { data: { name: hook.name, enabled: hook.enabled ? "yes" : "no" }, class: hook.name === name ? "current" : "" },
        h("td", {}, h("a", { href: `#/webhooks/${encodeURIComponent(hook.name)}` }, hook.name)),
        h("td", { class: "mono" }, hook.url),
        h("td", {}, filterText(hook.filter)),
        h("td", { class: "webhook-state" }, stateOf(hook)),
        h("td", { class: "webhook-health" }, healthText(hook)))));
      const chosen = hooks.find((hook) => hook.name === name);
      if (chosen) await showDetail(chosen);
      else replace(detail, name ? h("p", { class: "error" }, `No webhook named ${name}.`) : h("p", { class: "muted" }, hooks.length ? "Choose a subscription to see its deliveries." : "No webhook subscription in this namespace (agents webhook add NAME URL)."));
    } catch (err) {
      problem.textContent = errorText(err);
    }
  };

  const onEvent = (event) => {
    if (event.detail.type === "webhook.disabled") refresh();
    else if (!timer) timer = setTimeout(refresh, SETTLE_MS);
  };
  window.addEventListener("acp:event", onEvent);
  replace(view, h("section", {}, h("h2", {}, "Webhooks"), problem,
    h("div", { class: "actions" }, h("button", { type: "button", id: "webhooks-refresh", onclick: () => refresh() }, "Refresh")),
    h("table", { id: "webhooks" },
      h("thead", {}, h("tr", {}, ["Name", "URL", "Filter", "State", "Health"].map((t) => h("th", {}, t)))), rows),
    detail));
  await refresh();
  return () => {
    clearTimeout(timer);
    window.removeEventListener("acp:event", onEvent);
  };
}
