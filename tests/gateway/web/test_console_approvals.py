"""The console's approvals inbox (ACP 1.3): a plan whose write needs an answer shows up live
(the count beside the navigation link, the request with its arguments), and Allow resumes
the plan, which then finishes."""

from __future__ import annotations

import pathlib

from tests.gateway.web.conftest import Console


def test_the_inbox_shows_a_request_live_and_allow_resumes(console: Console, tmp_path: pathlib.Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    console.call("resource.add", {"name": "site", "spec": {"type": "directory", "path": str(site)}})
    console.call("project.add", {"name": "demo", "spec": {"resources": ["site"]}})
    console.call("automation_profile.add", {"name": "gated", "spec": {"approval": {"ask": ["fs.write"]}}})
    steps = [{"id": "greet", "tool": "fs.write", "args": {"path": "hello.txt", "content": "Hello!\n"}}]
    spec = {"actor": "scripted", "steps": steps, "automation_profile": "gated"}
    console.call("action.add", {"name": "hello", "spec": spec})
    page = console.page
    console.sign_in()
    page.goto(console.url + "#/approvals")
    page.wait_for_selector("#no-approvals")
    # The request arrives while the inbox is open: the feed brings it, no reload.
    plan_id = console.call("plan.use", {"action": "hello", "project": "demo"})["plan"]["meta"]["id"]
    console.call("plan.execute", {"plan_id": plan_id, "wait": True})
    card = page.wait_for_selector("#approvals article.approval")
    assert "Step greet: fs.write" in (card.text_content() or "")
    assert "hello.txt" in (card.text_content() or "")
    page.wait_for_selector("#approval-count:text-is('1')")
    console.shot("approvals-inbox")
    page.click("#approvals button[data-answer=allow_once]")
    page.click("#confirm-ok")
    page.wait_for_selector("#no-approvals")
    page.wait_for_selector("#approval-count", state="hidden")
    page.goto(console.url + f"#/plans/{plan_id}")
    page.wait_for_selector("#plan-state:text-is('succeeded')")
    approvals = console.call("approval.list", {"plan_id": plan_id})["approvals"]
    assert [(a["state"], a["answered_by"]) for a in approvals] == [("APPROVAL_STATE_ALLOWED", "alice")]
    assert console.problems == []
