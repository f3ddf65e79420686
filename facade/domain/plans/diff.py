"""Unified diffs of artifacts against the project's current files."""

from __future__ import annotations

import difflib

from cleveragents.acp.facade.domain.plans.staging import StagedArtifact
from cleveragents.acp.v1 import plan_pb2


def _lines(content: bytes | None) -> list[str] | None:
    """Text lines with their endings, or None for binary content."""
    if content is None:
        return []
    try:
        return content.decode("utf-8").splitlines(keepends=True)
    except UnicodeDecodeError:
        return None


def unified(path: str, old: bytes | None, new: bytes | None) -> str:
    """``git``-style: ``a/`` and ``b/`` prefixes, ``/dev/null`` for a created or deleted side."""
    before, after = _lines(old), _lines(new)
    source = f"a/{path}" if old is not None else "/dev/null"
    target = f"b/{path}" if new is not None else "/dev/null"
    if before is None or after is None:
        return f"Binary files {source} and {target} differ\n"
    out: list[str] = []
    for line in difflib.unified_diff(before, after, fromfile=source, tofile=target):
        out.append(line)
        if not line.endswith("\n"):
            out.append("\n\\ No newline at end of file\n")
    return "".join(out)


def file_diff(artifact: StagedArtifact) -> plan_pb2.FileDiff:
    return plan_pb2.FileDiff(
        path=artifact.path,
        op=artifact.op,
        unified_diff=unified(artifact.path, artifact.current, artifact.content),
        resource=artifact.resource,
    )
