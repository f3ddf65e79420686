"""How the CLI shows responses to people."""

from __future__ import annotations

import io

from cleveragents.acp.client.cli import render
from cleveragents.acp.v1 import common_pb2, events_pb2, session_pb2


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
    assert render.progress_line(plan).endswith("plan.text_delta".ljust(render.TYPE_WIDTH) + '  m turn 2: " "')


def test_turn_and_update_rows_show_what_happened() -> None:
    """``events watch`` rows of the ACP 1.3 events name the turn and its state (and why a
    turn failed), or the fields a ``session.update`` changed, not an empty DETAIL column."""
    started = events_pb2.Event(
        sequence=9,
        type="session.turn_started",
        session_turn_started=events_pb2.SessionTurn(
            turn=session_pb2.Turn(id="T" * 26, state=session_pb2.TURN_STATE_RUNNING)
        ),
    )
    assert render.progress_line(started).endswith(
        "session.turn_started".ljust(render.TYPE_WIDTH) + f"  turn {'T' * 26} running"
    )
    failed = events_pb2.Event(
        sequence=10,
        type="session.turn_completed",
        session_turn_completed=events_pb2.SessionTurn(
            turn=session_pb2.Turn(
                id="T" * 26,
                state=session_pb2.TURN_STATE_FAILED,
                error=common_pb2.ErrorInfo(message="model down"),
            )
        ),
    )
    assert render.event_line(failed).endswith(f"turn {'T' * 26} failed: model down")
    updated = events_pb2.Event(
        sequence=11,
        type="session.updated",
        session_updated=events_pb2.SessionUpdated(fields=["title", "labels"]),
    )
    assert render.event_line(updated).endswith("  title, labels")
    # The type column fits the longest type, so the rows stay aligned.
    assert len("session.turn_completed") <= render.TYPE_WIDTH
