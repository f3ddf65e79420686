// The approvals inbox (ACP 1.3): pending approval requests of the namespaces the token may
// read, each with exactly what would happen (the tool and its arguments, the command line,
// or the diff an apply would write) and Allow / Reject; kept live by the shell's feed
// (approval.* events), as is the count beside the navigation link (watchInbox).

import { call } from "../api.js";
import { h, replace, errorText, when, confirmAction } from "../dom.js";

const PENDING = "APPROVAL_STATE_PENDING";
const APPROVAL_EVENTS = ["approval.requested", "approval.decided", "approval.expired"];

async function pending() {
  const { approvals } = await call("approval.list", { state: PENDING, page_size: 500 });
  return approvals || [];
}

// The header's count of pending requests, refreshed on every approval event; returns its stop.
export function watchInbox(badge) {
  const refresh = async () => {
    try {
      const count = (await pending()).length;
      badge.textContent = count ? String(count) : "";
      badge.hidden = !count;
    } catch {
      badge.hidden = true;
    }
  };
  const onEvent = (event) => {
    if (APPROVAL_EVENTS.includes(event.detail.type)) refresh();
  };
  window.addEventListener("acp:event", onEvent);
  refresh();
  return () => window.removeEventListener("acp:event", onEvent);
}

function what(approval) {
  if (approval.kind === "apply") {
    return h("pre", { class: "diff" }, approval.diff || "(no changes)");
  }
  const lines = [`${approval.tool} ${JSON.stringify(approval.args || {})}`];
  if ((approval.command || []).length) lines.push(`$ ${approval.command.join(" ")}`);
  return h("pre", { class: "text" }, lines.join("\n"));
}

export async function showApprovals(view) {
  const problem = h("p", { class: "error", role: "alert", id: "approval-problem" });
  const list = h("div", { id: "approvals" });

  const answer = async (approval, how) => {
    const reason = await confirmAction(`${how.replace("_", " ")}: ${approval.kind} of plan ${approval.plan_id}?`, "Reason (optional)");
    if (reason === null) return;
    problem.textContent = "";
    try {
      await call("approval.answer", {
        approval_id: approval.id,
        answer: `APPROVAL_ANSWER_${how.toUpperCase()}`,
        digest: approval.digest,
        ...(reason ? { reason } : {}),
      });
    } catch (err) {
      problem.textContent = errorText(err);
    }
    await refresh();
  };

  const refresh = async () => {
    try {
      const found = await pending();
      replace(list, found.length ? found.map((approval) => h("article", { class: "approval", data: { approval: approval.id } },
        h("h3", {}, approval.kind === "apply" ? "Apply the staged changes" : `Step ${approval.step_id}: ${approval.tool}`),
        h("p", { class: "muted" },
          "plan ", h("a", { href: `#/plans/${encodeURIComponent(approval.plan_id)}`, class: "mono" }, approval.plan_id),
          ` · ${approval.rule} · asked ${when(approval.create_time)}`,
          approval.expire_time ? ` · expires ${when(approval.expire_time)} (then ${approval.fallback})` : ""),
        what(approval),
        h("div", { class: "actions" },
          ["allow_once", "allow_always", "reject_once", "reject_always"].map((how) => h("button", {
            type: "button", class: how === "allow_once" ? "primary" : "", data: { answer: how },
            onclick: () => answer(approval, how),
          }, how.replace("_", " ")))))) : h("p", { class: "muted", id: "no-approvals" }, "Nothing waits for an answer."));
    } catch (err) {
      problem.textContent = errorText(err);
    }
  };
  const onEvent = (event) => {
    if (APPROVAL_EVENTS.includes(event.detail.type)) refresh();
  };
  window.addEventListener("acp:event", onEvent);
  replace(view, h("section", {}, h("h2", {}, "Approvals"), problem, list));
  await refresh();
  return () => window.removeEventListener("acp:event", onEvent);
}
