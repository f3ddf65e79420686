"""How the CLI shows responses to people."""

from __future__ import annotations

import io

from cleveragents.acp.client.cli import render
from cleveragents.acp.v1 import events_pb2


def test_text_with_line_breaks_renders_as_written() -> None:
    """The tour's ``content: "Hello, {{name}}!\\n"`` shows as a literal block, not as a
    quoted scalar folded over lines (issue 18, item 7)."""
    out = io.StringIO()
    render._yaml({"args": {"content": "Hello, {{name}}!\n", "path": "hello.txt"}}, out)
    assert out.getvalue() == "args:\n  content: |\n    Hello, {{name}}!\n  path: hello.txt\n"


def test_a_text_delta_row_shows_its_text() -> None:
    """``events watch`` showed ``session.text_delta`` rows with an empty DETAIL column."""
    event = events_pb2.Event(
        sequence=7,
        type="session.text_delta",
        session_id="S" * 26,
        session_text_delta=events_pb2.TextDelta(actor="model", turn=1, index=0, text="Hello,\nworld"),
    )
    assert render.event_line(event).endswith('model turn 1: "Hello,\\nworld"')
    plan = events_pb2.Event(
        sequence=8, type="plan.text_delta", plan_text_delta=events_pb2.TextDelta(actor="m", turn=2, text=" ")
    )
    assert render.progress_line(plan).endswith('plan.text_delta       m turn 2: " "')
