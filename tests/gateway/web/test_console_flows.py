"""The console's main flows in Chromium against a real server: a session's chat, the
README's quick tour driven from the UI (registries, plan, diff, apply, rollback), the
registry form's field errors, and what users or models wrote staying text."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import pathlib
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.facade.plans.model_world import KEY, KEY_ENV
from tests.fake_openai import FakeOpenAI, turn
from tests.gateway.web.conftest import Console, watch
from tests.server_process import Children, ServerProcess, Tokens, start_server

ROOT = pathlib.Path(__file__).resolve().parents[3]

HOSTILE = "<img src=x onerror=\"alert('img')\"><script>alert('script')</script>"


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    server = FakeOpenAI().start_in_thread()
    yield server
    server.stop_thread()


def confirm(page: Any, text: str = "") -> None:
    page.wait_for_selector("dialog#confirm[open]")
    if text:
        page.fill("#confirm-input", text)
    page.click("#confirm-ok")
    page.wait_for_selector("dialog#confirm:not([open])", state="attached")


def add_entry(page: Any, kind: str, name: str, spec: dict[str, Any]) -> None:
    page.goto(page.url.split("#")[0] + f"#/registries/{kind}")
    page.wait_for_selector(f"#kinds a.current:text-is('{kind}')")
    page.fill("#entry-form input[name=name]", name)
    page.fill("#entry-form textarea[name=spec]", json.dumps(spec))
    page.click("#entry-form button[type=submit]")
    page.wait_for_selector(f"#entries tr[data-name='{name}']")


def signed_in_with_a_project(console: Console, tmp_path: pathlib.Path) -> pathlib.Path:
    """Signed in, with project ``demo`` on resource ``site`` (the returned folder)."""
    site = tmp_path / "site"
    site.mkdir()
    console.sign_in()
    add_entry(console.page, "resource", "site", {"type": "directory", "path": str(site)})
    add_entry(console.page, "project", "demo", {"resources": ["site"]})
    return site


def test_a_session_chat_shows_the_reply(console: Console) -> None:
    page = console.page
    console.sign_in()
    page.fill("#new-session input[name=title]", "First session")
    page.click("#new-session button[type=submit]")
    page.wait_for_selector("#tell")
    page.fill("#message-input", "hello there")
    page.click("#tell button[type=submit]")
    page.wait_for_selector("#messages li.user:has-text('hello there')")
    reply = page.wait_for_selector("#messages li:not(.user) .content")
    assert reply.text_content()
    console.shot("session-chat")
    page.goto(console.url + "#/sessions")
    page.wait_for_selector("#sessions a:text-is('First session')")
    assert console.problems == []


def test_the_quick_tour_from_the_console(console: Console, tmp_path: pathlib.Path) -> None:
    site = signed_in_with_a_project(console, tmp_path)
    page = console.page
    steps = [
        {"id": "greet", "tool": "fs.write", "args": {"path": "hello.txt", "content": "Hello, {{name}}!\n"}}
    ]
    add_entry(page, "action", "hello", {"actor": "scripted", "steps": steps})
    console.shot("registries")

    page.goto(console.url + "#/plans")
    page.fill("#new-plan input[name=action]", "hello")
    page.fill("#new-plan input[name=project]", "demo")
    page.fill("#new-plan input[name=inputs]", '{"name": "World"}')
    page.click("#new-plan button[type=submit]")
    page.wait_for_selector("#plan-summary")
    page.click("#plan-actions button[data-verb=execute]")
    confirm(page)
    page.wait_for_selector("#plan-phase:text-is('execute')")
    page.wait_for_selector("#plan-state:text-is('succeeded')")
    page.wait_for_selector("#tree details.node")
    console.shot("plan-tree")
    page.click("button[data-tab=explain]")
    page.wait_for_selector("#explanation")
    page.click("button[data-tab=diff]")
    page.wait_for_selector(
        "#diff .file-diff.create[data-path='hello.txt'] .line.add:has-text('+Hello, World!')"
    )
    console.shot("plan-diff")
    assert not (site / "hello.txt").exists()

    page.click("#plan-actions button[data-verb=apply]")
    confirm(page)
    page.wait_for_selector("#plan-phase:text-is('apply')")
    page.wait_for_selector("#plan-state:text-is('succeeded')")
    assert (site / "hello.txt").read_text() == "Hello, World!\n"

    page.click("#plan-actions button[data-verb=rollback]")
    confirm(page)
    page.wait_for_selector("#plan-state:text-is('rolled_back')")
    assert not (site / "hello.txt").exists()

    page.goto(console.url + "#/plans")
    page.wait_for_selector("#plans tr[data-plan] .state:text-is('rolled_back')")
    console.shot("plans")
    assert console.problems == []


def test_registry_errors_show_at_their_field(console: Console) -> None:
    page = console.page
    console.sign_in()
    page.goto(console.url + "#/registries/action")
    page.fill("#entry-form input[name=name]", "broken")
    page.fill("#entry-form textarea[name=spec]", json.dumps({"actor": "nobody", "steps": []}))
    page.click("#entry-form button[type=submit]")
    error = page.wait_for_selector(".field-error[data-field=spec]:not(:empty)")
    assert (error.text_content() or "").startswith("spec")
    page.fill("#entry-form textarea[name=spec]", "{not json")
    page.click("#entry-form button[type=submit]")
    page.wait_for_selector(".field-error[data-field=spec]:has-text('not valid JSON')")
    page.fill("#entry-form input[name=name]", "bad name!")
    page.fill("#entry-form textarea[name=spec]", json.dumps({"actor": "scripted", "steps": []}))
    page.click("#entry-form button[type=submit]")
    page.wait_for_selector(".field-error[data-field=name]:not(:empty)")
    console.shot("registry-error")
    # An update at a stale revision is refused with the server's message.
    console.call("actor.add", {"name": "helper", "spec": {"provider": "scripted"}})
    page.goto(console.url + "#/registries/actor/helper")
    page.wait_for_selector("#entry-form h3:has-text('revision 1')")
    changed = {"name": "helper", "revision": 1, "description": "elsewhere", "spec": {"provider": "scripted"}}
    console.call("actor.update", changed)
    page.fill("#entry-form input[name=description]", "mine")
    page.click("#entry-form button[type=submit]")
    page.wait_for_selector("#entry-form .error:has-text('INVALID_STATE')")
    console.problems.clear()


def test_what_users_and_models_wrote_stays_text(console: Console, tmp_path: pathlib.Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    console.call("resource.add", {"name": "site", "spec": {"type": "directory", "path": str(site)}})
    console.call("project.add", {"name": "demo", "spec": {"resources": ["site"]}})
    step = {"id": "w", "tool": "fs.write", "args": {"path": "x.html", "content": HOSTILE + "\n"}}
    console.call(
        "action.add",
        {
            "name": HOSTILE[:0] + "hostile",
            "description": HOSTILE,
            "spec": {"actor": "scripted", "steps": [step]},
        },
    )
    plan = console.call("plan.use", {"action": "hostile", "project": "demo"})["plan"]["meta"]["id"]
    console.call("plan.execute", {"plan_id": plan, "wait": True})
    page = console.page
    console.sign_in()
    page.fill("#new-session input[name=title]", HOSTILE)
    page.click("#new-session button[type=submit]")
    page.wait_for_selector("#tell")
    page.fill("#message-input", HOSTILE)
    page.click("#tell button[type=submit]")
    user = page.wait_for_selector("#messages li.user .content")
    assert user.text_content() == HOSTILE
    page.goto(console.url + f"#/plans/{plan}")
    page.click("button[data-tab=artifacts]")
    content = page.wait_for_selector("#artifacts pre.content")
    assert content.text_content() == HOSTILE + "\n"
    page.click("button[data-tab=diff]")
    page.wait_for_selector("#diff .line.add")
    assert HOSTILE in (page.text_content("#diff") or "")
    page.goto(console.url + "#/registries/action")
    page.wait_for_selector("#entries td:text-is('" + HOSTILE.replace("'", "\\'") + "')")
    page.goto(console.url + "#/sessions")
    page.wait_for_selector("#sessions a")
    console.shot("hostile-text")
    assert page.evaluate("document.querySelectorAll('main img, main script').length") == 0
    assert page.evaluate("document.querySelectorAll('script').length") == 1
    assert console.problems == []


def _buttons(page: Any) -> dict[str, bool]:
    """Each plan action's button: whether it is enabled."""
    found = page.eval_on_selector_all(
        "#plan-actions button", "(buttons) => buttons.map((b) => [b.dataset.verb, !b.disabled])"
    )
    return dict(found)


def test_the_diff_dialog_and_actions_as_a_newcomer_met_them(console: Console, tmp_path: pathlib.Path) -> None:
    """Issue 29: consecutive changed lines were laid side by side (only the first showed),
    the confirmation without a question showed an empty text box, and every action was
    offered in every state, the server refusing most."""
    signed_in_with_a_project(console, tmp_path)
    page = console.page
    steps = [{"id": "w", "tool": "fs.write", "args": {"path": "three.txt", "content": "one\ntwo\nthree\n"}}]
    add_entry(page, "action", "three", {"actor": "scripted", "steps": steps})
    page.goto(console.url + "#/plans")
    page.fill("#new-plan input[name=action]", "three")
    page.fill("#new-plan input[name=project]", "demo")
    page.click("#new-plan button[type=submit]")
    page.wait_for_selector("#plan-state:text-is('pending')")
    page.wait_for_selector("#plan-actions button[data-verb=execute]:enabled")
    assert _buttons(page) == {"execute": True, "apply": False, "rollback": False, "cancel": True}

    page.click("#plan-actions button[data-verb=execute]")
    page.wait_for_selector("dialog#confirm[open]")
    assert not page.is_visible("#confirm-input")
    page.click("#confirm-ok")
    page.wait_for_selector("#plan-phase:text-is('execute')")
    page.wait_for_selector("#plan-state:text-is('succeeded')")
    page.wait_for_selector("#plan-actions button[data-verb=apply]:enabled")
    assert _buttons(page) == {"execute": False, "apply": True, "rollback": False, "cancel": False}

    page.click("button[data-tab=diff]")
    page.wait_for_selector("#diff .line.add:has-text('+three')")
    added = page.query_selector_all("#diff .line.add")
    assert [(line.text_content() or "").strip() for line in added] == ["+one", "+two", "+three"]
    boxes = [line.bounding_box() for line in added]
    assert all(line.is_visible() for line in added)
    # Stacked: the same left edge, each below the one before.
    assert len({box["x"] for box in boxes}) == 1, boxes
    assert boxes[0]["y"] < boxes[1]["y"] < boxes[2]["y"], boxes
    console.shot("plan-diff-lines")

    page.click("#plan-actions button[data-verb=apply]")
    confirm(page)
    page.wait_for_selector("#plan-phase:text-is('apply')")
    page.wait_for_selector("#plan-actions button[data-verb=rollback]:enabled")
    assert _buttons(page) == {"execute": False, "apply": False, "rollback": True, "cancel": False}
    assert console.problems == []


def test_a_cancel_asks_for_a_reason_in_a_visible_box(console: Console) -> None:
    page = console.page
    console.sign_in()
    # The box shows when a question asks for text (hidden otherwise: the test above).
    page.evaluate(
        "async () => { const { confirmAction } = await import('./console/dom.js');"
        " confirmAction('Stop?', 'Reason (optional)'); }"
    )
    page.wait_for_selector("dialog#confirm[open]")
    assert page.is_visible("#confirm-input")
    assert console.problems == []


def test_the_sessions_list_shows_project_and_orchestrator(console: Console, tmp_path: pathlib.Path) -> None:
    (tmp_path / "web").mkdir()
    console.call(
        "resource.add", {"name": "web", "spec": {"type": "directory", "path": str(tmp_path / "web")}}
    )
    console.call("project.add", {"name": "web", "spec": {"resources": ["web"]}})
    created = console.call("session.create", {"title": "Release", "project": "web"})["session"]
    page = console.page
    console.sign_in()
    row = f"#sessions tr[data-session='{created['meta']['id']}']"
    page.wait_for_selector(row)
    assert page.text_content(f"{row} td.project") == "web"
    assert page.text_content(f"{row} td.orchestrator") == created["orchestrator"]
    assert created["orchestrator"]
    headers = page.eval_on_selector_all("#sessions th", "(cells) => cells.map((c) => c.textContent)")
    assert headers == ["Title", "Id", "Project", "Orchestrator", "State", "Messages", "Created"]
    assert console.problems == []


def test_the_consoles_action_table_is_the_servers() -> None:
    """plans.js keeps the phase/state pairs each plan operation is accepted in, to offer
    only those; they must be the server's (facade/domain/plans/model.py ALLOWED)."""
    from cleveragents.acp.facade.domain.plans import model

    script = (ROOT / "gateway/web/static/console/views/plans.js").read_text()
    table = json.loads(script.split("const ALLOWED = ", 1)[1].split(";", 1)[0])
    expected = {
        verb: sorted(f"{model.phase_name(phase)}/{model.state_name(state)}" for phase, state in pairs)
        for verb, pairs in model.ALLOWED.items()
    }
    assert {verb: sorted(pairs) for verb, pairs in table.items()} == expected


@dataclasses.dataclass
class ModelChat:
    """A server whose session ``session_id`` has a model orchestrator on the fake server,
    and a signed-in page on its chat with the live feed up."""

    server: ServerProcess
    token: str
    session_id: str
    page: Any
    problems: list[str]

    def call(self, operation: str, params: dict[str, Any]) -> Any:
        answer = httpx.post(
            self.server.http + "/api/v1/acp",
            json={"operation": operation, "params": params},
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=30,
        ).json()
        assert answer["status"] == "ok", answer["error"]
        return answer["data"]


@contextlib.contextmanager
def model_chat(
    browser: Any, tmp_path: pathlib.Path, children: Children, fake: FakeOpenAI
) -> Iterator[ModelChat]:
    tokens = Tokens.create(tmp_path)
    flags = ["--model-endpoint", fake.base_url, "--model-key-env", KEY_ENV]
    server = children.server(
        start_server(tmp_path, *flags, tokens=tokens.path, env={**os.environ, KEY_ENV: KEY})
    )
    chat = ModelChat(server, tokens.tokens["alice"], "", None, [])
    model = {"provider": "openai", "model": "fake-model", "base_url": fake.base_url, "api_key_env": KEY_ENV}
    chat.call("actor.add", {"name": "chat", "spec": model})
    created = chat.call("session.create", {"title": "Streamed", "orchestrator": "chat"})
    chat.session_id = created["session"]["meta"]["id"]
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    chat.page = page = context.new_page()
    page.set_default_timeout(20_000)
    watch(page, chat.problems)
    try:
        page.goto(server.http + "/")
        page.fill("#token", chat.token)
        page.click("#sign-in button[type=submit]")
        page.wait_for_selector("#nav:not([hidden])")
        page.wait_for_selector("#status[data-state=live]")
        page.goto(server.http + f"/#/sessions/{chat.session_id}")
        page.wait_for_selector("#tell")
        yield chat
    finally:
        context.close()
    assert server.stop() == 0, server.stderr()


def test_a_model_reply_streams_into_the_chat(
    browser: Any, tmp_path: pathlib.Path, children: Children, fake: FakeOpenAI
) -> None:
    """docs/console.md promised replies token by token once model actors existed; they
    arrived whole. The model's answer is held halfway: the text sent so far shows, then the
    stored reply takes its place, once."""
    release = asyncio.Event()
    # Chunks: the role, "Hello ", "there ", (held) "friend", the finish, the usage.
    fake.then(dataclasses.replace(turn("Hello there friend", pieces=3), hold=release, hold_after=3))
    with model_chat(browser, tmp_path, children, fake) as chat:
        page = chat.page
        page.fill("#message-input", "hi")
        page.click("#tell button[type=submit]")
        page.wait_for_function(
            "() => document.querySelector('#messages li.streaming .content')?.textContent === 'Hello there '"
        )
        assert page.query_selector_all("#messages li.orchestrator:not(.streaming)") == []
        assert fake._loop is not None
        fake._loop.call_soon_threadsafe(release.set)
        page.wait_for_selector(
            "#messages li.orchestrator:not(.streaming) .content:text-is('Hello there friend')"
        )
        page.wait_for_selector("#messages li.streaming", state="detached")
        assert len(page.query_selector_all("#messages li.orchestrator")) == 1
        assert chat.problems == []


def test_a_turn_shows_its_state_cancels_and_sends_once(
    browser: Any, tmp_path: pathlib.Path, children: Children, fake: FakeOpenAI
) -> None:
    """Issue 33's console: each turn's state on its message, a Cancel button while it runs
    (session.cancel_turn closes the model's stream), and a double Enter sends once."""
    release = asyncio.Event()
    fake.then(
        dataclasses.replace(turn("Never finished", pieces=3), hold=release, hold_after=2), turn("Answer two.")
    )
    with model_chat(browser, tmp_path, children, fake) as chat:
        page = chat.page
        page.fill("#message-input", "Q1")
        page.press("#message-input", "Enter")
        page.press("#message-input", "Enter")
        running = page.wait_for_selector("#messages li.user .turn[data-state=running]")
        # Mid-answer: the model's first piece has streamed into the chat.
        page.wait_for_selector("#messages li.streaming .content:text-is('Never')")
        assert running.query_selector(".state").text_content() == "running"
        page.screenshot(path=str(tmp_path / "turn-running.png"), full_page=True)
        page.click("#messages li.user .turn[data-state=running] button.cancel-turn")
        page.wait_for_selector("#messages li.user .turn[data-state=cancelled]")
        assert page.query_selector_all("button.cancel-turn") == []
        # What it had streamed goes with it.
        page.wait_for_selector("#messages li.streaming", state="detached")
        shown = chat.call("session.show", {"session_id": chat.session_id})
        # One tell reached the server and one model request the fake; its stream was closed.
        assert [t["state"] for t in shown["turns"]] == ["TURN_STATE_CANCELLED"]
        assert [m["content"] for m in shown["messages"]] == ["Q1"]
        assert len(fake.requests) == 1
        for _ in range(500):
            if fake.dropped:
                break
            time.sleep(0.02)
        assert fake.dropped == 1

        # The next message runs and succeeds; its reply shows.
        page.fill("#message-input", "Q2")
        page.press("#message-input", "Enter")
        page.wait_for_selector("#messages li.orchestrator .content:text-is('Answer two.')")
        page.wait_for_selector("#messages li.user:has-text('Q2') .turn[data-state=succeeded]")
        states = [t.get_attribute("data-state") for t in page.query_selector_all("#messages .turn")]
        assert states == ["cancelled", "succeeded"]
        page.screenshot(path=str(tmp_path / "turn-states.png"), full_page=True)
        assert chat.problems == []
