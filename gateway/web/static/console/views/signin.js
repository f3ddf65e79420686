import { call, session } from "../api.js";
import { errorText, h, replace } from "../dom.js";

export function showSignIn(view, done) {
  const token = h("input", { type: "password", id: "token", name: "token", autocomplete: "off", required: true });
  const problem = h("p", { class: "error", role: "alert" });
  const form = h(
    "form",
    { class: "card narrow", id: "sign-in" },
    h("h2", {}, "Sign in"),
    h("p", { class: "muted" }, "Paste an ACP token (agents serve printed one; agents token create makes more). It is kept in this tab only."),
    h("label", {}, "Token", token),
    problem,
    h("button", { type: "submit", class: "primary" }, "Sign in"),
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    problem.textContent = "";
    session.signIn(token.value.trim());
    try {
      await call("session.list", { page_size: 1 });
    } catch (err) {
      session.signOut();
      problem.textContent = errorText(err);
      return;
    }
    done();
  });
  replace(view, form);
  token.focus();
}
