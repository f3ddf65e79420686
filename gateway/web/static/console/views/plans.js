// Plans: the list with phase and state, a form to start one from an action, and one
// plan's page: status, actions (each confirmed first), the decision tree (collapsible,
// with corrections), the explanation, the artifacts (content as text) and the diff.

import { call } from "../api.js";
import { confirmAction, errorText, h, replace, shortEnum, when } from "../dom.js";

const PHASE = "PLAN_PHASE_";
const STATE = "PLAN_STATE_";

export async function showPlans(view, [planId]) {
  if (planId) return showPlan(view, planId);
  const problem = h("p", { class: "error", role: "alert" });
  const action = h("input", { name: "action", placeholder: "action", required: true });
  const project = h("input", { name: "project", placeholder: "project", required: true });
  const inputs = h("input", { name: "inputs", placeholder: 'inputs as JSON, e.g. {"name": "World"}' });
  const form = h("form", { class: "inline", id: "new-plan" }, action, project, inputs, h("button", { type: "submit", class: "primary" }, "Use action"));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    problem.textContent = "";
    try {
      const params = { action: action.value, project: project.value };
      if (inputs.value.trim()) params.inputs = JSON.parse(inputs.value);
      const used = await call("plan.use", params);
      location.hash = `#/plans/${encodeURIComponent(used.plan.meta.id)}`;
    } catch (err) {
      problem.textContent = errorText(err);
    }
  });
  const rows = h("tbody");
  replace(view, h("section", {}, h("h2", {}, "Plans"), form, problem, h("table", { id: "plans" },
    h("thead", {}, h("tr", {}, ["Id", "Action", "Project", "Phase", "State", "Updated"].map((t) => h("th", {}, t)))),
    rows)));
  try {
    const listed = await call("plan.list", { page_size: 100 });
    for (const p of listed.plans || []) {
      rows.append(h("tr", { data: { plan: p.meta.id } },
        h("td", { class: "mono" }, h("a", { href: `#/plans/${encodeURIComponent(p.meta.id)}` }, p.meta.id)),
        h("td", {}, p.action), h("td", {}, p.project),
        h("td", {}, shortEnum(p.phase, PHASE)),
        h("td", {}, h("span", { class: `state ${shortEnum(p.state, STATE)}` }, shortEnum(p.state, STATE))),
        h("td", {}, when(p.meta.update_time))));
    }
    if (!rows.children.length) rows.append(h("tr", {}, h("td", { colspan: 6, class: "muted" }, "No plans yet.")));
  } catch (err) {
    problem.textContent = errorText(err);
  }
  return null;
}

// The phase/state pairs in which the server accepts each operation: ALLOWED of
// facade/domain/plans/model.py (tests/gateway/web/test_console_flows.py holds them equal).
// A button the server would refuse is disabled.
const ALLOWED = {
  "execute": ["strategize/pending", "execute/pending"],
  "apply": ["execute/succeeded", "apply/failed"],
  "rollback": ["apply/succeeded"],
  "cancel": ["strategize/pending", "strategize/running", "execute/pending", "execute/running", "execute/awaiting_approval"],
  "correct": ["strategize/pending", "strategize/succeeded", "strategize/failed", "execute/pending", "execute/succeeded", "execute/failed", "execute/awaiting_approval"]
};

const ACTIONS = [
  { verb: "execute", label: "Execute", ask: "Run the plan's steps? Changes are staged, not written.", params: { wait: false } },
  { verb: "apply", label: "Apply", ask: "Write the staged changes into the project's files?" },
  { verb: "rollback", label: "Rollback", ask: "Restore the files as they were before apply?" },
  { verb: "cancel", label: "Cancel", ask: "Stop the plan?", input: "Reason (optional)", field: "reason" },
];

async function showPlan(view, planId) {
  const problem = h("p", { class: "error", role: "alert", id: "plan-problem" });
  const summary = h("dl", { class: "summary", id: "plan-summary" });
  const tabs = h("nav", { class: "tabs" });
  const panel = h("div", { class: "panel", id: "plan-panel" });
  const buttons = h("div", { class: "actions", id: "plan-actions" });
  let current = "tree";
  let where = "";
  const allowed = (verb) => ALLOWED[verb].includes(where);

  const refresh = async () => {
    try {
      const { plan } = await call("plan.status", { plan_id: planId });
      const state = shortEnum(plan.state, STATE);
      where = `${shortEnum(plan.phase, PHASE)}/${state}`;
      for (const button of buttons.children) button.disabled = !allowed(button.dataset.verb);
      replace(summary,
        h("dt", {}, "Action"), h("dd", {}, plan.action),
        h("dt", {}, "Project"), h("dd", {}, plan.project),
        h("dt", {}, "Phase"), h("dd", { id: "plan-phase" }, shortEnum(plan.phase, PHASE)),
        h("dt", {}, "State"), h("dd", {}, h("span", { class: `state ${state}`, id: "plan-state" }, state)),
        h("dt", {}, "Progress"), h("dd", {}, `${(plan.progress && plan.progress.done) || 0} / ${(plan.progress && plan.progress.total) || 0}`),
        plan.last_error && plan.last_error.code ? [h("dt", {}, "Last error"), h("dd", { class: "error" }, `${plan.last_error.code}: ${plan.last_error.message || ""}`)] : null);
    } catch (err) {
      problem.textContent = errorText(err);
    }
  };

  for (const action of ACTIONS) {
    buttons.append(h("button", {
      type: "button", data: { verb: action.verb },
      onclick: async () => {
        const answer = await confirmAction(`${action.label} plan ${planId}? ${action.ask}`, action.input);
        if (answer === null) return;
        problem.textContent = "";
        const params = { plan_id: planId, ...(action.params || {}) };
        if (action.field && answer) params[action.field] = answer;
        try {
          await call(`plan.${action.verb}`, params);
        } catch (err) {
          problem.textContent = errorText(err);
        }
        await refresh();
        await show(current);
      },
    }, action.label));
  }

  const views = {
    tree: () => treeView(planId, problem, allowed("correct"), async () => { await refresh(); await show("tree"); }),
    explain: async () => h("pre", { class: "text", id: "explanation" }, (await call("plan.explain", { plan_id: planId })).text || ""),
    artifacts: () => artifactsView(planId),
    diff: () => diffView(planId),
  };
  const show = async (name) => {
    current = name;
    for (const link of tabs.children) link.classList.toggle("current", link.dataset.tab === name);
    try {
      replace(panel, await views[name]());
    } catch (err) {
      replace(panel, h("p", { class: "error" }, errorText(err)));
    }
  };
  for (const name of Object.keys(views)) {
    tabs.append(h("button", { type: "button", class: "tab", data: { tab: name }, onclick: () => show(name) }, name[0].toUpperCase() + name.slice(1)));
  }
  replace(view, h("section", {},
    h("a", { href: "#/plans" }, "← Plans"),
    h("h2", {}, "Plan ", h("span", { class: "mono" }, planId)),
    summary, buttons, problem, tabs, panel));

  let pending = null;
  const onEvent = (event) => {
    if (event.detail.plan_id !== planId) return;
    clearTimeout(pending);
    pending = setTimeout(async () => {
      await refresh();
      await show(current);
    }, 150);
  };
  window.addEventListener("acp:event", onEvent);
  await refresh();
  await show("tree");
  return () => {
    clearTimeout(pending);
    window.removeEventListener("acp:event", onEvent);
  };
}

async function treeView(planId, problem, correctable, changed) {
  const tree = await call("plan.tree", { plan_id: planId });
  const nodes = tree.nodes || [];
  const steps = tree.steps || [];
  const children = new Map();
  for (const node of nodes) {
    const key = node.parent_id || "";
    if (!children.has(key)) children.set(key, []);
    children.get(key).push(node);
  }
  const stepsOf = (node) => steps.filter((s) => s.decision_id === node.id);
  const render = (node) => h("details", { open: !node.superseded, class: node.superseded ? "node superseded" : "node", data: { node: node.id } },
    h("summary", {}, h("span", { class: "question" }, node.question || node.id),
      node.choice ? [" → ", h("strong", {}, node.choice)] : null,
      node.superseded ? h("span", { class: "tag" }, "superseded") : null),
    node.rationale ? h("p", { class: "rationale" }, node.rationale) : null,
    node.correction ? h("p", { class: "correction" }, "Correction: ", node.correction) : null,
    (node.options || []).length ? h("ul", { class: "options" }, node.options.map((o) => h("li", {}, h("strong", {}, o.label), o.description ? ` — ${o.description}` : ""))) : null,
    stepsOf(node).length ? h("ol", { class: "steps" }, stepsOf(node).map(stepItem)) : null,
    node.superseded || !correctable ? null : h("button", { type: "button", class: "small", onclick: async () => {
      const text = await confirmAction(`Correct decision "${node.question || node.id}" and re-plan from it?`, "Correction");
      if (text === null) return;
      try {
        await call("plan.correct", { plan_id: planId, node_id: node.id, text });
      } catch (err) {
        problem.textContent = errorText(err);
      }
      await changed();
    } }, "Correct…"),
    (children.get(node.id) || []).map(render));
  const roots = nodes.filter((n) => !n.parent_id || !nodes.some((m) => m.id === n.parent_id));
  const loose = steps.filter((s) => !s.decision_id || !nodes.some((n) => n.id === s.decision_id));
  return h("div", { id: "tree" },
    roots.length ? roots.map(render) : h("p", { class: "muted" }, "No decisions yet."),
    loose.length ? h("ol", { class: "steps" }, loose.map(stepItem)) : null);
}

function stepItem(step) {
  const state = shortEnum(step.state, STATE);
  return h("li", { class: "step", data: { step: step.id } },
    h("span", { class: `state ${state}` }, state), " ",
    h("span", { class: "mono" }, step.tool), " ", step.description || step.id,
    step.error && step.error.code ? h("span", { class: "error" }, ` ${step.error.code}: ${step.error.message || ""}`) : null);
}

async function artifactsView(planId) {
  const { artifacts = [] } = await call("plan.artifacts", { plan_id: planId, include_content: true });
  if (!artifacts.length) return h("p", { class: "muted" }, "No artifacts.");
  return h("div", { id: "artifacts" }, artifacts.map((a) => h("details", { class: "artifact", open: artifacts.length <= 10, data: { path: a.path } },
    h("summary", {}, h("span", { class: `op ${shortEnum(a.op, "ARTIFACT_OP_")}` }, shortEnum(a.op, "ARTIFACT_OP_")), " ",
      h("span", { class: "mono" }, a.path), " ", h("span", { class: "muted" }, `${a.size || 0} bytes · step ${a.step_id} · ${String(a.sha256 || "").slice(0, 12)}`)),
    h("pre", { class: "text content" }, a.content || ""))));
}

async function diffView(planId) {
  const { files = [] } = await call("plan.diff", { plan_id: planId });
  if (!files.length) return h("p", { class: "muted" }, "No changes.");
  return h("div", { id: "diff" }, files.map((f) => {
    const op = shortEnum(f.op, "ARTIFACT_OP_");
    const lines = String(f.unified_diff || "").split("\n").map((line) => {
      const kind = line.startsWith("+++") || line.startsWith("---") ? "file" : line.startsWith("@@") ? "hunk" : line.startsWith("+") ? "add" : line.startsWith("-") ? "del" : "ctx";
      return [h("span", { class: `line ${kind}` }, line), "\n"];
    });
    return h("section", { class: `file-diff ${op}`, data: { path: f.path } },
      h("h3", {}, h("span", { class: `op ${op}` }, op), " ", h("span", { class: "mono" }, f.path)),
      h("pre", { class: "diff" }, lines));
  }));
}
