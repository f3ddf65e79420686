"""The console and the API docs page in Chromium: sign-in, the strict CSP holding with
no violation, and Swagger UI rendering the descriptor-derived document from package assets."""

from __future__ import annotations

from tests.gateway.web.conftest import Console


def test_sign_in_keeps_the_token_in_the_tab_and_signs_out(console: Console) -> None:
    page = console.page
    page.goto(console.url)
    page.fill("#token", "acp_not-a-token")
    page.click("#sign-in button[type=submit]")
    page.wait_for_selector("#sign-in .error:has-text('AUTH_REQUIRED')")
    assert page.evaluate("sessionStorage.getItem('acp.token')") is None
    assert console.problems == [
        "console error: Failed to load resource: the server responded with a status of 401 (Unauthorized)"
    ]
    console.problems.clear()

    console.sign_in()
    page.wait_for_selector("#sessions")
    assert page.evaluate("sessionStorage.getItem('acp.token')") == console.token()
    assert page.evaluate("localStorage.length") == 0
    page.wait_for_selector("#status[data-state=live]")
    console.shot("sessions-empty")
    page.click("#sign-out")
    page.wait_for_selector("#sign-in")
    assert page.evaluate("sessionStorage.getItem('acp.token')") is None
    assert console.problems == []


def test_the_page_refuses_inline_script_and_html_sinks(console: Console) -> None:
    page = console.page
    page.goto(console.url)
    csp = page.evaluate("fetch('/').then(r => r.headers.get('content-security-policy'))")
    assert "script-src 'self'" in csp
    assert "require-trusted-types-for 'script'" in csp
    assert "unsafe-inline" not in csp
    refused = page.evaluate(
        "() => { try { document.body.innerHTML = '<b>x</b>'; return false } catch (e) { return e.name } }"
    )
    assert refused == "TypeError"
    console.problems.clear()


def test_swagger_ui_renders_the_gateway_document_without_a_cdn(console: Console) -> None:
    page = console.page
    outside: list[str] = []
    page.on(
        "request",
        lambda request: None if request.url.startswith(console.server.http) else outside.append(request.url),
    )
    page.goto(console.server.http + "/api/v1/docs")
    page.wait_for_selector(".swagger-ui .info .title:has-text('CleverAgents ACP')")
    page.wait_for_selector(".opblock-summary-path:has-text('/api/v1/events/ticket')")
    console.shot("api-docs")
    assert outside == []
    assert console.problems == []
