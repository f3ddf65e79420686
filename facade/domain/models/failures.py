"""What can go wrong with a model server, each with the ACP error a caller gets and the
reason a plan records. Messages name the actor, the base URL and the environment variable
of the key, never the key."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from cleveragents.acp.contract.errors import ACPError, ErrorCode

# reason (a plan's last_error code) -> (ACP code, refinement) for a caller of session.tell.
KINDS: Mapping[str, tuple[ErrorCode.ValueType, str]] = MappingProxyType(
    {
        "model_endpoint_refused": (ErrorCode.INVALID_PARAMS, "MODEL_ENDPOINT_REFUSED"),
        "model_key_missing": (ErrorCode.INVALID_STATE, "MODEL_KEY_MISSING"),
        "model_key_refused": (ErrorCode.INVALID_STATE, "MODEL_KEY_REFUSED"),
        "model_request_refused": (ErrorCode.INVALID_STATE, "MODEL_REQUEST_REFUSED"),
        "model_rate_limited": (ErrorCode.BUDGET_EXCEEDED, "MODEL_RATE_LIMITED"),
        "model_unavailable": (ErrorCode.INTERNAL_ERROR, "MODEL_UNAVAILABLE"),
        "model_stream_broken": (ErrorCode.INTERNAL_ERROR, "MODEL_STREAM_BROKEN"),
        "model_tool_errors": (ErrorCode.INVALID_STATE, "MODEL_TOOL_ERRORS"),
    }
)


class ModelError(Exception):
    """A model call that cannot go on; ``reason`` is one of ``KINDS``."""

    def __init__(self, reason: str, message: str, details: Mapping[str, object] | None = None) -> None:
        if reason not in KINDS:
            raise ValueError(f"unknown model failure {reason!r}")
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.details = dict(details or {})

    def to_acp(self) -> ACPError:
        code, refinement = KINDS[self.reason]
        return ACPError(code, self.message, {"reason": self.reason, **self.details}, refinement=refinement)


class ModelCancelledError(Exception):
    """The call was stopped by a cancel; whatever streamed before it was delivered."""
