"""Context configurations and their assembly: ``context.show/inspect/simulate/set``.

A configuration belongs to a session or a project and is a record of kind ``context``
named ``session:<id>`` or ``project:<name>`` in the owner's namespace. A session without
its own configuration uses its project's, and without that the default: every directory
resource of the project, all files, the server's token budget. Semantics in docs/context.md.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ulid import ULID

from cleveragents.acp.contract.call import CallContext
from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.facade.domain.beneath import Anchor
from cleveragents.acp.facade.domain.bounded import caller_work, globs
from cleveragents.acp.facade.domain.bounded.globs import matches_any
from cleveragents.acp.facade.domain.context import files
from cleveragents.acp.facade.domain.context.files import FileText, NotAnItemError, PathEscapeError
from cleveragents.acp.facade.domain.context.tokens import DEFAULT_COUNTER, TokenCounter
from cleveragents.acp.facade.domain.registries import Registries
from cleveragents.acp.facade.store.base import Record, Store, StoreConflictError
from cleveragents.acp.v1 import context_pb2, registry_pb2, session_pb2

CONTEXT_KIND = "context"
DEFAULT_TOKEN_BUDGET = 8000
DIRECTORY_DRIVER = "directory"

INCLUDED = context_pb2.ITEM_DISPOSITION_INCLUDED
TRUNCATED = context_pb2.ITEM_DISPOSITION_TRUNCATED
DROPPED = context_pb2.ITEM_DISPOSITION_DROPPED


def session_key(session_id: str) -> str:
    return f"session:{session_id}"


def project_key(project: str) -> str:
    return f"project:{project}"


def _invalid(field_path: str, message: str, **details: Any) -> ACPError:
    return ACPError(ErrorCode.INVALID_PARAMS, f"{field_path}: {message}", {"field": field_path, **details})


@dataclass(frozen=True)
class Scope:
    """What a request's context is about: a session (and its project) or a project."""

    namespace: str
    project: str
    session: session_pb2.Session | None = None

    @property
    def key(self) -> str:
        return session_key(self.session.meta.id) if self.session else project_key(self.project)


@dataclass
class _Candidate:
    id: str
    kind: str
    content: str | None
    reason: str = ""


@dataclass
class _Fill:
    """The budget as simulate spends it, in order."""

    budget: int
    counter: TokenCounter
    used: int = 0
    spent: bool = False
    items: list[context_pb2.SimulatedItem] = field(default_factory=list)

    def add(self, candidate: _Candidate) -> None:
        item = context_pb2.SimulatedItem(id=candidate.id, kind=candidate.kind)
        if candidate.content is None:
            item.disposition, item.reason = DROPPED, candidate.reason
            self.items.append(item)
            return
        full = self.counter.count(candidate.content)
        item.full_tokens = full
        left = self.budget - self.used
        if self.spent:
            item.disposition, item.reason = DROPPED, f"the token budget ({self.budget}) is spent"
        elif full <= left:
            item.disposition, item.tokens = INCLUDED, full
            item.reason = candidate.reason or "fits in the budget"
        else:
            self.spent = True
            tokens = self.counter.count(self.counter.truncate(candidate.content, left))
            if tokens > 0:
                item.disposition, item.tokens = TRUNCATED, tokens
                item.reason = f"only {tokens} of {full} tokens fit in the {left} left of the budget"
            else:
                item.disposition = DROPPED
                item.reason = f"needs {full} tokens; {left} left of the budget ({self.budget})"
        self.used += item.tokens
        self.items.append(item)


class ContextConfigs:
    """The stored configurations, by namespace and owner key."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def get(self, namespace: str, key: str) -> context_pb2.ContextConfig | None:
        record = self.store.get_by_name(CONTEXT_KIND, namespace, key)
        return context_pb2.ContextConfig.FromString(record.body) if record else None

    def put(self, namespace: str, key: str, config: context_pb2.ContextConfig) -> None:
        body = config.SerializeToString(deterministic=True)
        now = time.time()
        with self.store.transaction():
            existing = self.store.get_by_name(CONTEXT_KIND, namespace, key)
            if existing is not None:
                existing.body, existing.update_time = body, now
                existing.revision += 1
                self.store.update(existing)
                return
            record = Record(
                kind=CONTEXT_KIND,
                id=str(ULID()),
                namespace=namespace,
                name=key,
                body=body,
                create_time=now,
                update_time=now,
            )
            try:
                self.store.insert(record)
            except StoreConflictError:
                raise ACPError(
                    ErrorCode.INVALID_STATE, f"context {key} was set concurrently; retry"
                ) from None

    def delete(self, namespace: str, key: str) -> None:
        record = self.store.get_by_name(CONTEXT_KIND, namespace, key)
        if record is not None:
            self.store.delete(CONTEXT_KIND, record.id)


# Reads a session the caller may see (``sessions.records.load``), handed in by whoever
# builds the context: the sessions package builds on this one, so it is not imported here.
SessionLoader = Callable[[Store, CallContext, str], tuple[Record, session_pb2.Session]]


class Context:
    def __init__(
        self,
        store: Store,
        registries: Registries,
        load_session: SessionLoader,
        counter: TokenCounter = DEFAULT_COUNTER,
    ) -> None:
        self.store = store
        self.load_session = load_session
        self.registries = registries
        self.counter = counter
        self.configs = ContextConfigs(store)
        registries.add_referrer_source(self.referrers)

    def referrers(self, kind: str, namespace: str, name: str) -> list[str]:
        """Configurations naming a resource or skill (``context/session:<id>``) block its removal."""
        if kind not in ("resource", "skill"):
            return []
        found = []
        for record in self.store.iter_kind(CONTEXT_KIND, namespace):
            config = context_pb2.ContextConfig.FromString(record.body)
            named = [s.resource for s in config.sources] if kind == "resource" else list(config.skills)
            if name in named:
                found.append(f"context/{record.name}")
        return found

    # scope and configuration ----------------------------------------------------------

    def scope(self, ctx: CallContext, namespace: str, session_id: str, project: str) -> Scope:
        if session_id and project:
            raise _invalid("session_id", "give session_id or project, not both")
        if session_id:
            _, session = self.load_session(self.store, ctx, session_id)
            if namespace and namespace != session.meta.namespace:
                raise _invalid(
                    "namespace",
                    f"session {session_id} is in namespace {session.meta.namespace!r}, not {namespace!r}",
                )
            return Scope(session.meta.namespace, session.project, session)
        if not project:
            raise _invalid("session_id", "give session_id (a session's context) or project (a project's)")
        ns = ctx.namespace(namespace)
        self.registries.get("project", ns, project)
        return Scope(ns, project)

    def in_force(self, scope: Scope) -> tuple[context_pb2.ContextConfig, str]:
        """The configuration that applies to the scope and where it comes from."""
        if scope.session is not None:
            own = self.configs.get(scope.namespace, scope.key)
            if own is not None:
                return own, "session"
        if scope.project:
            inherited = self.configs.get(scope.namespace, project_key(scope.project))
            if inherited is not None:
                return inherited, "project"
        return self._default(scope), "default"

    def _default(self, scope: Scope) -> context_pb2.ContextConfig:
        config = context_pb2.ContextConfig()
        project = self.registries.find("project", scope.namespace, scope.project) if scope.project else None
        if isinstance(project, registry_pb2.Project):
            for name in project.spec.resources:
                resource = self.registries.find("resource", scope.namespace, name)
                if isinstance(resource, registry_pb2.Resource) and self.is_directory(
                    scope.namespace, resource
                ):
                    config.sources.add(resource=name)
        return config

    def _folder_problem(self, namespace: str, root: str) -> str | None:
        """Why a resource folder cannot be read: outside the server's resource roots
        (checked first, so nothing about such a folder is told), missing, not a folder."""
        if not self.registries.policy.allows_folder(namespace, root):
            return "the resource lies outside the server's resource roots"
        return files.folder_problem(root)

    def is_directory(self, namespace: str, resource: registry_pb2.Resource) -> bool:
        if resource.spec.type == DIRECTORY_DRIVER:
            return True
        resource_type = self.registries.find("resource_type", namespace, resource.spec.type)
        return isinstance(resource_type, registry_pb2.ResourceType) and (
            resource_type.spec.driver == DIRECTORY_DRIVER
        )

    def validate(self, namespace: str, config: context_pb2.ContextConfig, prefix: str = "config") -> None:
        """INVALID_PARAMS naming the first field that is wrong (``config.sources[1].globs[0]``)."""
        seen: set[str] = set()
        for i, source in enumerate(config.sources):
            where = f"{prefix}.sources[{i}]"
            if not source.resource:
                raise _invalid(f"{where}.resource", "name a resource")
            if source.resource in seen:
                raise _invalid(f"{where}.resource", f"resource {source.resource!r} is listed twice")
            seen.add(source.resource)
            resource = self.registries.find("resource", namespace, source.resource)
            if not isinstance(resource, registry_pb2.Resource):
                raise _invalid(
                    f"{where}.resource", f"no resource {source.resource!r} in namespace {namespace!r}"
                )
            if not self.is_directory(namespace, resource):
                raise _invalid(
                    f"{where}.resource",
                    f"resource {source.resource!r} is of type {resource.spec.type!r}, not a directory",
                )
            try:
                globs.check(source.globs)
            except globs.GlobError as exc:
                at = f"{where}.globs" if exc.index is None else f"{where}.globs[{exc.index}]"
                raise _invalid(at, f"a glob {exc}" if exc.index is not None else str(exc)) from None
            for j, glob in enumerate(source.globs):
                if not glob.strip():
                    raise _invalid(f"{where}.globs[{j}]", "a glob must not be empty")
                try:
                    files.check_relative(glob)
                except PathEscapeError as exc:
                    raise _invalid(
                        f"{where}.globs[{j}]", f"globs are relative to the folder: {exc}"
                    ) from None
        skills: set[str] = set()
        for i, skill in enumerate(config.skills):
            where = f"{prefix}.skills[{i}]"
            if not skill:
                raise _invalid(where, "name a skill")
            if skill in skills:
                raise _invalid(where, f"skill {skill!r} is listed twice")
            skills.add(skill)
            if self.registries.find("skill", namespace, skill) is None:
                raise _invalid(where, f"no skill {skill!r} in namespace {namespace!r}")
        if config.token_budget < 0:
            raise _invalid(f"{prefix}.token_budget", "must be 0 (the server default) or more")

    # operations -----------------------------------------------------------------------

    async def show(
        self, ctx: CallContext, req: context_pb2.GetContextRequest
    ) -> context_pb2.GetContextResponse:
        return await self.store.read(lambda _store: self._show(ctx, req))

    def _show(self, ctx: CallContext, req: context_pb2.GetContextRequest) -> context_pb2.GetContextResponse:
        scope = self.scope(ctx, req.namespace, req.session_id, req.project)
        config, origin = self.in_force(scope)
        return context_pb2.GetContextResponse(
            config=config, origin=origin, token_counter=self.counter.description
        )

    async def set(
        self, ctx: CallContext, req: context_pb2.SetContextRequest
    ) -> context_pb2.SetContextResponse:
        # Checked and stored in one transaction: what it names cannot go meanwhile.
        return await self.store.write(lambda _store: self._set(ctx, req))

    def _set(self, ctx: CallContext, req: context_pb2.SetContextRequest) -> context_pb2.SetContextResponse:
        scope = self.scope(ctx, req.namespace, req.session_id, req.project)
        self.validate(scope.namespace, req.config)
        self.configs.put(scope.namespace, scope.key, req.config)
        return context_pb2.SetContextResponse(config=req.config)

    async def inspect(
        self, ctx: CallContext, req: context_pb2.InspectContextRequest
    ) -> context_pb2.InspectContextResponse:
        found = await self.store.read(lambda _store: self._item(ctx, req))
        if isinstance(found, _FilePlace):
            item = await self._file_item(found)
        else:
            item = found
        item.tokens = self.counter.count(item.content)
        return context_pb2.InspectContextResponse(item=item)

    def _item(
        self, ctx: CallContext, req: context_pb2.InspectContextRequest
    ) -> context_pb2.ContextItem | _FilePlace:
        """The skill item, or where the file item is (read off the loop), from one snapshot."""
        scope = self.scope(ctx, req.namespace, req.session_id, req.project)
        config, origin = self.in_force(scope)
        kind, sep, rest = req.item_id.partition(":")
        if kind == "skill" and sep and rest:
            return self._skill_item(scope, config, origin, rest)
        if kind == "file" and sep and rest:
            return self._file_place(scope, config, origin, rest)
        raise _invalid("item_id", "an item id is file:<resource>/<path> or skill:<name>")

    def _not_an_item(self, item_id: str, scope: Scope, origin: str, why: str) -> ACPError:
        return ACPError(
            ErrorCode.NOT_FOUND,
            f"{item_id} is not an item of this context ({origin} configuration of {scope.key}): {why}",
            {"item_id": item_id, "origin": origin},
            refinement="CONTEXT_ITEM_NOT_FOUND",
        )

    def _skill_item(
        self, scope: Scope, config: context_pb2.ContextConfig, origin: str, name: str
    ) -> context_pb2.ContextItem:
        item_id = f"skill:{name}"
        if name not in config.skills:
            raise self._not_an_item(item_id, scope, origin, "the configuration does not list this skill")
        skill = self.registries.find("skill", scope.namespace, name)
        if not isinstance(skill, registry_pb2.Skill):
            raise self._not_an_item(item_id, scope, origin, "the skill is no longer registered")
        return context_pb2.ContextItem(
            id=item_id,
            kind="skill",
            source=f"skill {name!r} in namespace {scope.namespace!r}",
            content=skill.spec.instructions,
        )

    def _file_place(
        self, scope: Scope, config: context_pb2.ContextConfig, origin: str, rest: str
    ) -> _FilePlace:
        item_id = f"file:{rest}"
        resource_name, sep, relative = rest.partition("/")
        if not sep or not resource_name or not relative:
            raise _invalid("item_id", "a file item id is file:<resource>/<path>")
        try:
            files.check_relative(relative)
        except PathEscapeError as exc:
            raise _invalid("item_id", f"the path must stay inside the resource folder: {exc}") from None
        source = next((s for s in config.sources if s.resource == resource_name), None)
        if source is None:
            raise self._not_an_item(item_id, scope, origin, f"resource {resource_name!r} is not a source")
        if not matches_any(relative, list(source.globs)):
            raise self._not_an_item(item_id, scope, origin, "the path matches none of the source's globs")
        resource = self.registries.find("resource", scope.namespace, resource_name)
        if not isinstance(resource, registry_pb2.Resource) or not self.is_directory(
            scope.namespace, resource
        ):
            raise self._not_an_item(
                item_id, scope, origin, "the resource is no longer a registered directory"
            )
        root = resource.spec.path
        problem = self._folder_problem(scope.namespace, root)
        if problem is not None:
            raise self._not_an_item(item_id, scope, origin, problem)
        anchor = self.registries.policy.anchor(scope.namespace, root, resolve_local=True)
        if anchor is None:
            raise self._not_an_item(
                item_id, scope, origin, "the resource lies outside the server's resource roots"
            )
        try:
            files.locate(anchor, relative)
        except PathEscapeError as exc:
            raise _invalid("item_id", f"the path must stay inside the resource folder: {exc}") from None
        except NotAnItemError as exc:
            raise self._not_an_item(item_id, scope, origin, str(exc)) from None
        return _FilePlace(item_id, root, anchor, relative)

    @staticmethod
    async def _file_item(place: _FilePlace) -> context_pb2.ContextItem:
        text = await asyncio.to_thread(files.read_text, place.anchor, place.relative)
        if text.content is None:
            raise _invalid("item_id", f"{place.item_id} cannot be context: {text.reason}", reason=text.reason)
        return context_pb2.ContextItem(
            id=place.item_id,
            kind="file",
            source=f"{place.root.rstrip('/')}/{place.relative}",
            content=text.content,
        )

    async def simulate(
        self, ctx: CallContext, req: context_pb2.SimulateContextRequest
    ) -> context_pb2.SimulateContextResponse:
        fill, budget, rate, sources = await self.store.read(lambda _store: self._simulated(ctx, req))
        for found in sources:
            for candidate in await self._source_candidates(found):
                fill.add(candidate)
        response = context_pb2.SimulateContextResponse(
            items=fill.items, total_tokens=fill.used, token_budget=budget
        )
        if req.actor:
            response.cost_per_1k_tokens = rate
            response.estimated_cost = fill.used / 1000 * rate
        return response

    def _simulated(
        self, ctx: CallContext, req: context_pb2.SimulateContextRequest
    ) -> tuple[_Fill, int, float, list[_SourcePlace | list[_Candidate]]]:
        """What the registries give the simulation, from one snapshot: the filled prompt,
        actor and skills, the budget, the rate, and each source's folder (or why none)."""
        scope = self.scope(ctx, req.namespace, req.session_id, req.project)
        if req.token_budget < 0:
            raise _invalid("token_budget", "must be 0 (the configured budget) or more")
        config, _ = self.in_force(scope)
        budget = req.token_budget or config.token_budget or DEFAULT_TOKEN_BUDGET
        fill = _Fill(budget, self.counter)
        rate = 0.0
        given: set[str] = set()
        if req.actor:
            actor = self.registries.fetch(registry_pb2.Actor, scope.namespace, req.actor)
            rate = actor.spec.cost_per_1k_tokens
            self._actor_candidates(fill, scope.namespace, actor)
            given.update(actor.spec.skills)
        if req.prompt:
            fill.add(_Candidate("prompt", "prompt", req.prompt, "the prompt is placed first"))
        for name in config.skills:
            if name in given:
                continue
            skill = self.registries.find("skill", scope.namespace, name)
            if isinstance(skill, registry_pb2.Skill):
                fill.add(_Candidate(f"skill:{name}", "skill", skill.spec.instructions))
            else:
                fill.add(_Candidate(f"skill:{name}", "skill", None, "the skill is no longer registered"))
        return fill, budget, rate, [self._source_place(scope.namespace, source) for source in config.sources]

    def _actor_candidates(self, fill: _Fill, namespace: str, actor: registry_pb2.Actor) -> None:
        """What the actor itself is given before the context: its system prompt and skills."""
        if actor.spec.system_prompt:
            fill.add(
                _Candidate(
                    f"actor:{actor.name}",
                    "system",
                    actor.spec.system_prompt,
                    "the actor's system prompt comes first",
                )
            )
        for name in actor.spec.skills:
            skill = self.registries.find("skill", namespace, name)
            if isinstance(skill, registry_pb2.Skill):
                fill.add(
                    _Candidate(f"skill:{name}", "skill", skill.spec.instructions, "a skill of the actor")
                )
            else:
                fill.add(
                    _Candidate(f"skill:{name}", "skill", None, "the actor's skill is no longer registered")
                )

    def _source_place(
        self, namespace: str, source: context_pb2.ContextSource
    ) -> _SourcePlace | list[_Candidate]:
        """The source's folder, or the candidate saying why it has none."""
        resource_id = f"resource:{source.resource}"
        resource = self.registries.find("resource", namespace, source.resource)
        if not isinstance(resource, registry_pb2.Resource) or not self.is_directory(namespace, resource):
            return [_Candidate(resource_id, "resource", None, "no longer a registered directory resource")]
        problem = self._folder_problem(namespace, resource.spec.path)
        anchor = self.registries.policy.anchor(namespace, resource.spec.path, resolve_local=True)
        if problem is not None or anchor is None:
            return [
                _Candidate(resource_id, "resource", None, problem or "outside the server's resource roots")
            ]
        return _SourcePlace(namespace, source.resource, anchor, list(source.globs))

    @staticmethod
    async def _source_candidates(found: _SourcePlace | list[_Candidate]) -> list[_Candidate]:
        """The source's files as candidates, read (and globbed: the caller shapes the walk) on
        the caller-work pool."""
        if not isinstance(found, _SourcePlace):
            return found
        resource_id = f"resource:{found.resource}"
        work = caller_work.CALLER_WORK
        texts, matched = await work.run(found.namespace, _read_source, found.anchor, found.globs)
        candidates = [
            _Candidate(f"file:{found.resource}/{t.path}", "file", t.content, t.reason) for t in texts
        ]
        if matched > len(texts):
            candidates.append(
                _Candidate(
                    resource_id,
                    "resource",
                    None,
                    f"{matched} files match; only the first {len(texts)} in path order are considered",
                )
            )
        return candidates


@dataclass(frozen=True)
class _FilePlace:
    """A file item's place, checked against the registries; its text is read off the loop."""

    item_id: str
    root: str
    anchor: Anchor
    relative: str


@dataclass(frozen=True)
class _SourcePlace:
    """A context source's folder and globs, checked against the registries."""

    namespace: str
    resource: str
    anchor: Anchor
    globs: list[str]


def _read_source(anchor: Anchor, globs: list[str]) -> tuple[list[FileText], int]:
    paths, matched = files.matching_files(anchor, globs)
    return [files.read_text(anchor, path) for path in paths], matched
