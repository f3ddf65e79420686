"""A valid spec of every registry kind, shared by the registry tests and the contract suite."""

from __future__ import annotations

import pathlib
from typing import Any


def registry_spec(kind: str, root: pathlib.Path) -> dict[str, Any]:
    """A valid spec of each kind, naming only built-ins and the ``base`` resource."""
    specs: dict[str, dict[str, Any]] = {
        "action": {"actor": "scripted", "steps": [{"id": "s", "tool": "fs.read", "args": {"path": "x"}}]},
        "actor": {"provider": "scripted", "system_prompt": "be brief"},
        "automation_profile": {"auto_execute": False, "allowed_tools": ["fs.read"], "cost_budget": 2.5},
        "invariant": {"max_files_changed": {"limit": 5}},
        "project": {"resources": ["base"]},
        "resource": {"type": "directory", "path": str(root)},
        "resource_type": {"driver": "directory"},
        "skill": {"instructions": "Prefer small diffs."},
        "tool": {"argv": ["echo", "{{message}}"], "timeout_seconds": 5},
        "validation": {"paths": ["**/*.py"], "regex": {"pattern": "TODO", "must_match": False}},
    }
    return specs[kind]
