"""An automation profile's approval policy (ACP 1.3): whether a step or an apply may run,
must wait for a person's answer, or is refused; and the digest that binds an answer to
exactly what will run.

Rules name a tool (`fs.write`), a kind (`fs.*`: every file tool; `command`: every command
tool), `apply`, or a command line (`command:<RE2 pattern>`, searched in the argv joined by
spaces). `deny` wins over `allow`, which wins over `ask`; a step whose price reaches
`cost_threshold` is asked about too. Patterns are checked when the profile is stored and run
with RE2 (linear in the command line).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.facade.domain.bounded import patterns
from cleveragents.acp.facade.domain.models.functions import BUILTIN as FILE_TOOLS
from cleveragents.acp.v1 import approval_pb2

APPLY = "apply"
COMMAND = "command"
COMMAND_PATTERN = "command:"
FILE_KIND = "fs.*"
FALLBACKS = ("reject", "allow")
APPROVER_ROLES = ("writer", "admin")
MAX_RULES = 100
MAX_RULE_CHARS = 1_000
MAX_EXPIRE_SECONDS = 30 * 24 * 3600
DIGEST_PREFIX = "sha256:"

RUN = "run"
ASK = "ask"
DENY = "deny"


@dataclass(frozen=True)
class Subject:
    """What would run: a step's tool (with its command line for a command tool) and price,
    or an apply."""

    tool: str
    command: tuple[str, ...] = ()
    price: float = 0.0
    is_command: bool = False

    @property
    def is_apply(self) -> bool:
        return self.tool == APPLY


@dataclass(frozen=True)
class Verdict:
    what: str
    # The rule that decided (`ask: fs.write`, `cost_threshold 5`), for the request and errors.
    rule: str = ""


def _invalid(field: str, message: str) -> ACPError:
    return ACPError(ErrorCode.INVALID_PARAMS, f"{field}: {message}", {"field": field})


def check(policy: approval_pb2.ApprovalPolicy, field: str = "spec.approval") -> None:
    """INVALID_PARAMS naming the field of anything that cannot be used (once, when stored)."""
    for name in ("ask", "allow", "deny"):
        rules: Sequence[str] = getattr(policy, name)
        if len(rules) > MAX_RULES:
            raise _invalid(f"{field}.{name}", f"at most {MAX_RULES} rules")
        for index, rule in enumerate(rules):
            where = f"{field}.{name}[{index}]"
            if not rule or len(rule) > MAX_RULE_CHARS:
                raise _invalid(where, f"must be 1 to {MAX_RULE_CHARS} characters")
            if rule.startswith(COMMAND_PATTERN):
                try:
                    patterns.compiled(rule[len(COMMAND_PATTERN) :], patterns.Dialect.RE2)
                except patterns.PatternError as exc:
                    raise _invalid(where, f"cannot be used: {exc}") from None
    if policy.cost_threshold < 0 or policy.cost_threshold != policy.cost_threshold:
        raise _invalid(f"{field}.cost_threshold", "must be a number >= 0")
    if not 0 <= policy.expire_seconds <= MAX_EXPIRE_SECONDS:
        raise _invalid(f"{field}.expire_seconds", f"must be between 0 and {MAX_EXPIRE_SECONDS}")
    if policy.fallback and policy.fallback not in FALLBACKS:
        raise _invalid(f"{field}.fallback", f"must be one of {', '.join(FALLBACKS)}")
    if policy.approver_role and policy.approver_role not in APPROVER_ROLES:
        raise _invalid(f"{field}.approver_role", f"must be one of {', '.join(APPROVER_ROLES)}")


def matches(rule: str, subject: Subject) -> bool:
    """Whether ``rule`` names what would run."""
    if subject.is_apply:
        return rule == APPLY
    if rule.startswith(COMMAND_PATTERN):
        if not subject.is_command:
            return False
        return patterns.search(rule[len(COMMAND_PATTERN) :], " ".join(subject.command), patterns.Dialect.RE2)
    if rule == subject.tool:
        return True
    if rule == FILE_KIND:
        return subject.tool in FILE_TOOLS
    return rule == COMMAND and subject.is_command


def _first(rules: Sequence[str], subject: Subject) -> str | None:
    return next((rule for rule in rules if matches(rule, subject)), None)


def decide(policy: approval_pb2.ApprovalPolicy, subject: Subject) -> Verdict:
    """Run, ask or deny; deny wins over allow, allow over ask."""
    denied = _first(policy.deny, subject)
    if denied is not None:
        return Verdict(DENY, f"deny: {denied}")
    if _first(policy.allow, subject) is not None:
        return Verdict(RUN)
    asked = _first(policy.ask, subject)
    if asked is not None:
        return Verdict(ASK, f"ask: {asked}")
    if policy.cost_threshold and not subject.is_apply and subject.price >= policy.cost_threshold:
        return Verdict(ASK, f"cost_threshold: {subject.price:g} >= {policy.cost_threshold:g}")
    return Verdict(RUN)


def scope(subject: Subject, rule: str) -> str:
    """What an ``allow_always``/``reject_always`` answer covers for the rest of the plan: the
    command pattern that asked, else the tool."""
    asked = rule.removeprefix("ask: ")
    if asked.startswith(COMMAND_PATTERN):
        return asked
    return subject.tool


def digest(fields: Mapping[str, Any]) -> str:
    """``sha256:<hex>`` over canonical JSON of what will run."""
    text = json.dumps(fields, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
    return DIGEST_PREFIX + hashlib.sha256(text.encode()).hexdigest()


def answerable_by(policy: approval_pb2.ApprovalPolicy) -> list[str]:
    return ["admin"] if policy.approver_role == "admin" else ["writer", "admin"]
