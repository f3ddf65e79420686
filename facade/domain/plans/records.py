"""How a plan is stored: one record (the ``Plan`` proto, its state and filters indexed)
and ordered item collections for what it accumulates (tree, steps, staged changes,
validations, prompt, corrections, checkpoint).

A new strategy rewrites its collections (steps, nodes) whole inside a store transaction;
a running step then replaces only its own row. Staged file contents live in ``changes``, one row per file a
step changed, so a correction can drop the rows of the steps it discards.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar

from google.protobuf import message

from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.facade.domain import revisions
from cleveragents.acp.facade.domain.plans import model
from cleveragents.acp.facade.store.base import ListQuery, Record, StaleRevisionError, Store
from cleveragents.acp.v1 import events_pb2, plan_pb2, registry_pb2

KIND = "plan"
M = TypeVar("M", bound=message.Message)

# Item collections, owned by the plan id.
NODES = "plan.nodes"
STEPS = "plan.steps"
CHANGES = "plan.changes"
VALIDATIONS = "plan.validations"
PROMPT = "plan.prompt"
CORRECTIONS = "plan.corrections"
CHECKPOINT = "plan.checkpoint"
ACTION = "plan.action"
# A model actor's conversation after its first messages: one JSON entry per message.
CONVERSATION = "plan.conversation"

# The ``journal`` attribute: where apply and rollback are in writing the project.
JOURNAL_APPLYING = "applying"
JOURNAL_APPLIED = "applied"
JOURNAL_ABORTED = "aborted"
JOURNAL_ROLLING_BACK = "rolling_back"
JOURNAL_ROLLED_BACK = "rolled_back"
_WRITING = (JOURNAL_APPLYING, JOURNAL_ROLLING_BACK)


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def _unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


@dataclass(frozen=True)
class Change:
    """One file a step changed in the staging area; ``content`` None deletes it."""

    step_id: str
    resource: str
    path: str
    content: bytes | None

    def encode(self) -> bytes:
        return json.dumps(
            {
                "step": self.step_id,
                "resource": self.resource,
                "path": self.path,
                "content": _b64(self.content),
            }
        ).encode()

    @staticmethod
    def decode(body: bytes) -> Change:
        data = json.loads(body)
        return Change(data["step"], data["resource"], data["path"], _unb64(data["content"]))


@dataclass
class CheckpointEntry:
    """One file apply wrote: its pre-image (to restore) and post-image digest (to see
    whether it changed since)."""

    resource: str
    root: str
    path: str
    existed: bool
    mode: int | None
    pre: bytes | None
    post_exists: bool
    post_sha256: str
    # Folders apply created for this file, outermost first; rollback removes them.
    created_dirs: list[str] = field(default_factory=list)

    def encode(self) -> bytes:
        data: dict[str, Any] = dict(self.__dict__)
        data["pre"] = _b64(self.pre)
        return json.dumps(data).encode()

    @staticmethod
    def decode(body: bytes) -> CheckpointEntry:
        data = json.loads(body)
        data["pre"] = _unb64(data["pre"])
        return CheckpointEntry(**data)


@dataclass
class Expected:
    """A caller's expected revision of one plan (``if_revision``), for the first save of
    that plan the call makes: the plan operation's own write, where it is compared and set."""

    plan_id: str
    revision: int
    used: bool = False


# Set for the length of one plan operation (``expecting``); tasks it starts share the object,
# so once the first save used it, no later save (a run's own) is held to it.
_EXPECTED: ContextVar[Expected | None] = ContextVar("plan_expected_revision", default=None)


@contextmanager
def expecting(plan_id: str, revision: int | None) -> Iterator[Expected | None]:
    """Hold the first save of ``plan_id`` in this call to ``revision`` (None: no check)."""
    if revision is None:
        yield None
        return
    guard = Expected(plan_id, revision)
    token = _EXPECTED.set(guard)
    try:
        yield guard
    finally:
        _EXPECTED.reset(token)


def unsettled(record: Record) -> bool:
    """Running, or stopped midway through writing its project."""
    return record.state == model.state_name(model.RUNNING) or record.attrs.get("journal") in _WRITING


def from_record(record: Record) -> plan_pb2.Plan:
    """The plan a record holds, at the record's revision (the store's is the truth)."""
    plan = plan_pb2.Plan.FromString(record.body)
    plan.revision = record.revision
    return plan


def not_found(plan_id: str) -> ACPError:
    return ACPError(
        ErrorCode.NOT_FOUND,
        f"no plan with id {plan_id!r}",
        {"plan_id": plan_id},
        refinement="PLAN_NOT_FOUND",
    )


class PlanRecords:
    """Every write for a plan runs ``fence(plan_id)`` inside its transaction first (the
    engine's lease check, leases.PlanLeases.fence), so whichever way a write is made it
    commits only while its writer may write for that plan."""

    def __init__(self, store: Store, fence: Callable[[str], None] | None = None) -> None:
        self.store = store
        self._fence = fence

    @contextmanager
    def fenced(self, plan_id: str) -> Iterator[None]:
        """A transaction (joining the caller's) whose writes the plan's lease guards."""
        with self.store.transaction():
            if self._fence is not None:
                self._fence(plan_id)
            yield

    # the plan ---------------------------------------------------------------------------

    def record(self, plan_id: str) -> Record:
        record = self.store.get(KIND, plan_id)
        if record is None:
            raise not_found(plan_id)
        return record

    def load(self, plan_id: str) -> plan_pb2.Plan:
        return from_record(self.record(plan_id))

    def journal(self, plan_id: str) -> str:
        return self.record(plan_id).attrs.get("journal", "")

    def _record_of(self, plan: plan_pb2.Plan, journal: str, revision: int = 1) -> Record:
        plan.revision = revision
        return Record(
            kind=KIND,
            id=plan.meta.id,
            namespace=plan.meta.namespace,
            body=plan.SerializeToString(),
            revision=revision,
            state=model.state_name(plan.state),
            attrs={
                "action": plan.action,
                "project": plan.project,
                "session_id": plan.session_id,
                "phase": model.phase_name(plan.phase),
                "journal": journal,
            },
            create_time=plan.meta.create_time.ToNanoseconds() / 1e9,
            update_time=time.time(),
        )

    def insert(self, plan: plan_pb2.Plan) -> None:
        self.store.insert(self._record_of(plan, ""))

    def save(self, plan: plan_pb2.Plan, *, journal: str | None = None, fence: bool = True) -> None:
        """Write the plan at the next revision, compare-and-set on the revision read here
        (every change moves it); the call's expected revision (``expecting``) is held to
        the first save of its plan. ``fence`` False: a write that is not the lease holder's
        (``touch`` of a plan another process runs)."""
        plan_id = plan.meta.id
        plan.meta.update_time.GetCurrentTime()
        with self.fenced(plan_id) if fence else self.store.transaction():
            current = self.record(plan_id)
            guard = _EXPECTED.get()
            guarded = guard is not None and guard.plan_id == plan_id and not guard.used
            if guard is not None and guarded:
                if guard.revision != current.revision:
                    raise revisions.mismatch("plan", plan_id, guard.revision, current.revision)
                guard.used = True
            kept = current.attrs.get("journal", "") if journal is None else journal
            try:
                self.store.update(
                    self._record_of(plan, kept, current.revision + 1), expected_revision=current.revision
                )
            except StaleRevisionError as exc:
                if guard is not None and guarded:
                    raise revisions.mismatch("plan", plan_id, guard.revision, exc.current) from None
                raise ACPError(
                    ErrorCode.INVALID_STATE,
                    f"plan {plan_id} changed meanwhile; read it again",
                    {"plan_id": plan_id},
                ) from None

    def touch(self, plan_id: str, *, fence: bool = True) -> None:
        """Move the plan's revision (a change made elsewhere, such as a cancel request left
        for its run): the save that holds the call's expected revision."""
        self.save(self.load(plan_id), fence=fence)

    def query(self, query: ListQuery) -> list[plan_pb2.Plan]:
        return [from_record(r) for r in self.store.query(query)]

    def in_flight(self) -> list[Record]:
        """Plans running or half-written: each is some process's business while it holds
        the plan's lease, and settled by whoever takes the lease over (engine.py)."""
        return [r for r in self.store.iter_kind(KIND) if unsettled(r)]

    # collections ------------------------------------------------------------------------

    def _rewrite(self, collection: str, plan_id: str, bodies: Sequence[bytes]) -> None:
        with self.fenced(plan_id):
            self.store.delete_items(collection, plan_id)
            if bodies:
                self.store.append_items(collection, plan_id, bodies)

    def _messages(self, collection: str, plan_id: str, cls: type[M]) -> list[M]:
        return [cls.FromString(body) for _, body in self.store.list_items(collection, plan_id)]

    def _objects(self, collection: str, plan_id: str, decode: Callable[[bytes], Any]) -> list[Any]:
        return [decode(body) for _, body in self.store.list_items(collection, plan_id)]

    def nodes(self, plan_id: str) -> list[plan_pb2.DecisionNode]:
        return self._messages(NODES, plan_id, plan_pb2.DecisionNode)

    def save_nodes(self, plan_id: str, nodes: Sequence[plan_pb2.DecisionNode]) -> None:
        self._rewrite(NODES, plan_id, [n.SerializeToString() for n in nodes])

    def put_nodes(self, plan_id: str, nodes: Mapping[int, plan_pb2.DecisionNode]) -> None:
        """Nodes at their places in the tree's list (new ones appended): only their rows."""
        if nodes:
            with self.fenced(plan_id):
                self.store.put_items(NODES, plan_id, {i: n.SerializeToString() for i, n in nodes.items()})

    def steps(self, plan_id: str) -> list[plan_pb2.PlanStep]:
        return self._messages(STEPS, plan_id, plan_pb2.PlanStep)

    def save_steps(self, plan_id: str, steps: Sequence[plan_pb2.PlanStep]) -> None:
        self._rewrite(STEPS, plan_id, [s.SerializeToString() for s in steps])

    def save_step(self, plan_id: str, index: int, step: plan_pb2.PlanStep) -> None:
        """One step's new state, at its place in the list: O(1) whatever the plan's length
        (a 10,000-step plan used to rewrite every step row at each step)."""
        with self.fenced(plan_id):
            self.store.put_items(STEPS, plan_id, {index: step.SerializeToString()})

    def put_steps(self, plan_id: str, steps: Mapping[int, plan_pb2.PlanStep]) -> None:
        """Steps at their places in the list (new ones appended): only their rows."""
        if steps:
            with self.fenced(plan_id):
                self.store.put_items(STEPS, plan_id, {i: s.SerializeToString() for i, s in steps.items()})

    def changes(self, plan_id: str) -> list[Change]:
        return self._objects(CHANGES, plan_id, Change.decode)

    def add_changes(self, plan_id: str, changes: Sequence[Change]) -> None:
        if changes:
            with self.fenced(plan_id):
                self.store.append_items(CHANGES, plan_id, [c.encode() for c in changes])

    def save_changes(self, plan_id: str, changes: Sequence[Change]) -> None:
        self._rewrite(CHANGES, plan_id, [c.encode() for c in changes])

    def validations(self, plan_id: str) -> list[events_pb2.ValidationCompleted]:
        return self._messages(VALIDATIONS, plan_id, events_pb2.ValidationCompleted)

    def save_validations(self, plan_id: str, results: Sequence[events_pb2.ValidationCompleted]) -> None:
        self._rewrite(VALIDATIONS, plan_id, [r.SerializeToString() for r in results])

    def prompt(self, plan_id: str) -> plan_pb2.GetPlanPromptResponse | None:
        found = self._messages(PROMPT, plan_id, plan_pb2.GetPlanPromptResponse)
        return found[-1] if found else None

    def save_prompt(self, plan_id: str, prompt: plan_pb2.GetPlanPromptResponse) -> None:
        self._rewrite(PROMPT, plan_id, [prompt.SerializeToString()])

    def corrections(self, plan_id: str) -> list[plan_pb2.CorrectPlanRequest]:
        return self._messages(CORRECTIONS, plan_id, plan_pb2.CorrectPlanRequest)

    def add_correction(self, plan_id: str, correction: plan_pb2.CorrectPlanRequest) -> None:
        with self.fenced(plan_id):
            self.store.append_items(CORRECTIONS, plan_id, [correction.SerializeToString()])

    def checkpoint(self, plan_id: str) -> list[CheckpointEntry]:
        return self._objects(CHECKPOINT, plan_id, CheckpointEntry.decode)

    def save_checkpoint(self, plan_id: str, entries: Sequence[CheckpointEntry]) -> None:
        self._rewrite(CHECKPOINT, plan_id, [e.encode() for e in entries])

    def action(self, plan_id: str) -> registry_pb2.Action:
        found = self._messages(ACTION, plan_id, registry_pb2.Action)
        if not found:
            raise ACPError(ErrorCode.INTERNAL_ERROR, f"plan {plan_id} has no action snapshot")
        return found[0]

    def save_action(self, plan_id: str, action: registry_pb2.Action) -> None:
        self._rewrite(ACTION, plan_id, [action.SerializeToString()])

    def conversation(self, plan_id: str) -> list[dict[str, Any]]:
        return self._objects(CONVERSATION, plan_id, json.loads)

    def add_conversation(self, plan_id: str, entries: Sequence[dict[str, Any]]) -> None:
        if entries:
            with self.fenced(plan_id):
                self.store.append_items(CONVERSATION, plan_id, [json.dumps(e).encode() for e in entries])

    def save_conversation(self, plan_id: str, entries: Sequence[dict[str, Any]]) -> None:
        self._rewrite(CONVERSATION, plan_id, [json.dumps(e).encode() for e in entries])
