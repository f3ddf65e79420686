"""Rollback: restore the checkpoint apply took, refusing when files changed since."""

from __future__ import annotations

import hashlib
import pathlib
from collections.abc import Sequence

from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.facade.domain.plans.records import CheckpointEntry


def changed_since(entries: Sequence[CheckpointEntry]) -> list[str]:
    """Paths whose current content is no longer what apply wrote."""
    changed: list[str] = []
    for entry in entries:
        target = pathlib.Path(entry.root) / entry.path
        current = target.read_bytes() if target.is_file() else None
        digest = hashlib.sha256(current).hexdigest() if current is not None else ""
        if (current is not None) != entry.post_exists or digest != entry.post_sha256:
            changed.append(entry.path)
    return changed


def check(plan_id: str, entries: Sequence[CheckpointEntry], *, force: bool) -> None:
    """INVALID_STATE listing the paths changed since apply, unless ``force``."""
    changed = changed_since(entries)
    if changed and not force:
        raise ACPError(
            ErrorCode.INVALID_STATE,
            f"{len(changed)} file(s) changed since apply: {', '.join(changed)}; "
            "rollback with force to restore them anyway",
            {"plan_id": plan_id, "paths": changed},
        )
