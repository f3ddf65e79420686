"""How the CLI shows responses to people."""

from __future__ import annotations

import io

from cleveragents.acp.client.cli import render


def test_text_with_line_breaks_renders_as_written() -> None:
    """The tour's ``content: "Hello, {{name}}!\\n"`` shows as a literal block, not as a
    quoted scalar folded over lines (issue 18, item 7)."""
    out = io.StringIO()
    render._yaml({"args": {"content": "Hello, {{name}}!\n", "path": "hello.txt"}}, out)
    assert out.getvalue() == "args:\n  content: |\n    Hello, {{name}}!\n  path: hello.txt\n"
