"""Rollback: restore the checkpoint apply took, refusing when files changed since."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.facade.domain.plans import fsat
from cleveragents.acp.facade.domain.plans.apply import Anchors
from cleveragents.acp.facade.domain.plans.records import CheckpointEntry


def changed_since(entries: Sequence[CheckpointEntry], anchors: Anchors) -> list[str]:
    """Paths whose current content is no longer what apply wrote (one whose folder cannot
    be reached from the operator's root, through no symlink, reads as gone)."""
    changed: list[str] = []
    for entry in entries:
        anchor = anchors.get(entry.root)
        try:
            if anchor is None:
                raise FileNotFoundError(entry.root)
            with fsat.open_root(anchor) as root_fd:
                current = fsat.read(root_fd, entry.path).content
        except OSError as exc:
            if not isinstance(exc, FileNotFoundError) and not fsat.crosses_link(exc):
                raise
            current = None
        digest = hashlib.sha256(current).hexdigest() if current is not None else ""
        if (current is not None) != entry.post_exists or digest != entry.post_sha256:
            changed.append(entry.path)
    return changed


def check(plan_id: str, entries: Sequence[CheckpointEntry], anchors: Anchors, *, force: bool) -> None:
    """INVALID_STATE listing the paths changed since apply, unless ``force``."""
    changed = changed_since(entries, anchors)
    if changed and not force:
        raise ACPError(
            ErrorCode.INVALID_STATE,
            f"{len(changed)} file(s) changed since apply: {', '.join(changed)}; "
            "rollback with force to restore them anyway",
            {"plan_id": plan_id, "paths": changed},
        )
