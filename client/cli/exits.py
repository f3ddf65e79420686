"""The CLI's own exit statuses (each ACP error code has its own, from ``contract.errors``).

A module of their own so that ``agents --help`` can name them without importing ``calls``
(the client and the whole catalog).
"""

from __future__ import annotations

EXIT_PLAN_FAILED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 12
# `plan execute --wait` ended with the plan waiting for an approval (its question on stderr).
EXIT_AWAITING_APPROVAL = 13
EXIT_INTERRUPTED = 130
