"""Unified diffs of artifacts against the project's current files."""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from collections.abc import Sequence

from cleveragents.acp.contract.errors import ACPError, ErrorCode
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


DIGEST_PREFIX = "sha256:"
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def digest(artifacts: Sequence[StagedArtifact]) -> str:
    """``sha256:<hex>`` over the staged artifacts a diff shows, in a canonical order (by
    resource, then path): each one's resource, path, operation and new content's sha256.
    The project's current files are not in it: what it binds is what apply would write."""
    hasher = hashlib.sha256()
    for artifact in sorted(artifacts, key=lambda a: (a.resource, a.path)):
        entry = [artifact.resource, artifact.path, plan_pb2.ArtifactOp.Name(artifact.op), artifact.sha256]
        hasher.update(json.dumps(entry, ensure_ascii=True, separators=(",", ":")).encode() + b"\n")
    return DIGEST_PREFIX + hasher.hexdigest()


def valid_digest(text: str) -> bool:
    return _DIGEST.fullmatch(text) is not None


def check_digest(plan_id: str, expected: str, artifacts: Sequence[StagedArtifact]) -> None:
    """Refuse an apply bound to a reviewed diff (``diff_digest``) when the staged artifacts it
    would write are no longer the ones that diff showed."""
    if not expected:
        return
    if not _DIGEST.fullmatch(expected):
        raise ACPError(
            ErrorCode.INVALID_PARAMS,
            f"diff_digest is the digest plan.diff answers (sha256:<64 hex digits>), not {expected[:80]!r}",
            {"field": "diff_digest"},
        )
    actual = digest(artifacts)
    if expected != actual:
        raise ACPError(
            ErrorCode.INVALID_STATE,
            f"plan {plan_id}'s staged artifacts changed since the diff reviewed ({expected}); "
            "nothing was applied: read plan.diff again",
            {"plan_id": plan_id, "expected": expected, "actual": actual},
            refinement="DIFF_CHANGED",
        )
