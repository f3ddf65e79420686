"""The CLI's own exit statuses (each ACP error code has its own, from ``contract.errors``).

A module of their own so that ``agents --help`` can name them without importing ``calls``
(the client and the whole catalog).
"""

from __future__ import annotations

EXIT_PLAN_FAILED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 12
EXIT_INTERRUPTED = 130
