"""Option helpers shared by commands: an option may also come from an ``ACP_*`` variable.

``agents serve`` and ``agents gateway`` read theirs through ``gateway.settings`` (flags over
the environment over a config file, checked by one pydantic model).
"""

from __future__ import annotations

import os


def env(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return value if value not in (None, "") else default
