// Calls to the gateway: the canonical envelope at api/v1/acp with the bearer token kept
// in sessionStorage (so it ends with the tab). URLs are relative: the console works
// wherever the gateway is mounted.

const TOKEN_KEY = "acp.token";

export class ACPError extends Error {
  constructor(code, message, details) {
    super(message);
    this.code = code;
    this.details = details || {};
  }
}

export const session = {
  token: () => sessionStorage.getItem(TOKEN_KEY),
  signIn: (token) => sessionStorage.setItem(TOKEN_KEY, token),
  signOut: () => sessionStorage.removeItem(TOKEN_KEY),
};

export function url(path) {
  return new URL(path, document.baseURI);
}

export async function call(operation, params = {}) {
  let response;
  try {
    response = await fetch(url("api/v1/acp"), {
      method: "POST",
      cache: "no-store",
      headers: {
        "Content-Type": "application/json",
        Authorization: `Bearer ${session.token() || ""}`,
      },
      body: JSON.stringify({ operation, params }),
    });
  } catch (err) {
    throw new ACPError("UNAVAILABLE", `the server cannot be reached (${err.message})`, {});
  }
  let body;
  try {
    body = await response.json();
  } catch {
    throw new ACPError("INTERNAL_ERROR", `HTTP ${response.status}: not an ACP answer`, {});
  }
  if (body.status !== "ok") {
    const error = body.error || {};
    const err = new ACPError(error.code, error.message, error.details);
    if (err.code === "AUTH_REQUIRED") window.dispatchEvent(new CustomEvent("acp:auth-required"));
    throw err;
  }
  return body.data || {};
}

// The OpenAPI document, read once: the console derives registry kinds and event types
// from it instead of keeping its own lists.
let contract;
export async function openapi() {
  if (!contract) {
    contract = fetch(url("api/v1/openapi.json"), { cache: "no-store" })
      .then((r) => r.json())
      .catch((err) => {
        contract = undefined;
        throw err;
      });
  }
  return contract;
}

export async function eventTypes() {
  const doc = await openapi();
  const event = doc.components.schemas["cleveragents.acp.v1.Event"];
  return Object.entries(event.properties)
    .filter(([, schema]) => String(schema.description || "").includes("`payload`"))
    .map(([field]) => field.replace("_", "."));
}

export async function registryKinds() {
  const doc = await openapi();
  const verbs = {};
  for (const item of Object.values(doc.paths)) {
    for (const op of Object.values(item)) {
      const [group, verb] = String(op.operationId || "").split(".");
      if (verb) (verbs[group] ||= new Set()).add(verb);
    }
  }
  const needed = ["list", "show", "add", "update", "remove"];
  return Object.keys(verbs)
    .filter((group) => needed.every((verb) => verbs[group].has(verb)))
    .sort();
}
