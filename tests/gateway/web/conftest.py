"""A real ``agents serve`` and Debian's Chromium for the console tests."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests import browser as chromium
from tests import needs
from tests.server_process import Children, ServerProcess, Tokens, start_server


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    reason = chromium.missing()
    if reason is not None:
        needs.unavailable(f"browser tests: {reason}")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=str(chromium.CHROMIUM), args=chromium.CHROMIUM_ARGS, headless=True
        )
        yield launched
        launched.close()


@dataclass
class Console:
    """One server and a browser page signed out, with what the scenarios need (a server a
    scenario starts goes to ``children``: killed with its group however the test ends)."""

    server: ServerProcess
    children: Children
    tokens: Tokens
    directory: pathlib.Path
    page: Any
    shots: pathlib.Path
    problems: list[str]

    @property
    def url(self) -> str:
        return self.server.http + "/"

    def token(self, name: str = "alice") -> str:
        return self.tokens.tokens[name]

    def call(self, operation: str, params: dict[str, Any] | None = None, token: str | None = None) -> Any:
        answer = httpx.post(
            self.server.http + "/api/v1/acp",
            json={"operation": operation, "params": params or {}},
            headers={"Authorization": f"Bearer {token or self.token()}"},
            timeout=30,
        ).json()
        assert answer["status"] == "ok", answer["error"]
        return answer["data"]

    def sign_in(self, name: str = "alice") -> None:
        self.page.goto(self.url)
        self.page.fill("#token", self.token(name))
        self.page.click("#sign-in button[type=submit]")
        self.page.wait_for_selector("#nav:not([hidden])")

    def shot(self, name: str) -> pathlib.Path:
        path = self.shots / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path


def watch(page: Any, problems: list[str]) -> None:
    """Collect what must never happen on a page: script errors, console errors (CSP
    violations among them) and dialogs (an alert() would be an injected script)."""
    page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    page.on(
        "console",
        lambda message: (
            problems.append(f"console {message.type}: {message.text}") if message.type == "error" else None
        ),
    )

    def on_dialog(dialog: Any) -> None:
        problems.append(f"dialog: {dialog.message}")
        dialog.dismiss()

    page.on("dialog", on_dialog)


@pytest.fixture
def server_options() -> tuple[tuple[str, ...], dict[str, str]]:
    """The console server's extra ``agents serve`` options and environment; a test module
    overrides it (the webhooks view lets webhooks reach its loopback receiver)."""
    return (), {}


@pytest.fixture
def console(
    browser: Any,
    tmp_path: pathlib.Path,
    children: Children,
    server_options: tuple[tuple[str, ...], dict[str, str]],
) -> Iterator[Console]:
    """Its server belongs to ``children``; the teardown checks that it stops cleanly."""
    tokens = Tokens.create(tmp_path)
    extra, env = server_options
    server = children.server(start_server(tmp_path, *extra, tokens=tokens.path, env=env))
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    page = context.new_page()
    page.set_default_timeout(20_000)
    problems: list[str] = []
    watch(page, problems)
    shots = tmp_path / "screenshots"
    shots.mkdir()
    made = Console(server, children, tokens, tmp_path, page, shots, problems)
    try:
        yield made
    finally:
        context.close()
    assert made.server.stop() == 0, made.server.stderr()
