"""What a plan runs with, read from the registries of its namespace: its action (a
snapshot taken at ``plan.use``), project and directory resources, actor and skills,
automation profile, tools, validations and invariants."""

from __future__ import annotations

import pathlib
from dataclasses import dataclass

from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.facade.domain.plans.paths import ResourceRoot
from cleveragents.acp.facade.domain.registries import BUILTIN_TOOLS, Registries
from cleveragents.acp.v1 import registry_pb2, specs_pb2

DIRECTORY_DRIVER = "directory"
SCRIPTED = "scripted"
# Actors that can run a plan: the built-in scripted one and OpenAI-compatible models.
PLAN_PROVIDERS = frozenset({SCRIPTED, "openai"})


@dataclass(frozen=True)
class PlanSetup:
    namespace: str
    action: registry_pb2.Action
    project: registry_pb2.Project
    resources: dict[str, ResourceRoot]
    actor: registry_pb2.Actor
    # (name, instructions) of the actor's skills, then the action's.
    skills: list[tuple[str, str]]
    profile_name: str
    profile: specs_pb2.AutomationProfileSpec


def resources_of(
    registries: Registries, namespace: str, project: registry_pb2.Project
) -> dict[str, ResourceRoot]:
    roots: dict[str, ResourceRoot] = {}
    for name in project.spec.resources:
        resource = registries.fetch(registry_pb2.Resource, namespace, name)
        kind = registries.fetch(registry_pb2.ResourceType, namespace, resource.spec.type)
        if kind.spec.driver != DIRECTORY_DRIVER:
            raise ACPError(
                ErrorCode.INVALID_PARAMS,
                f"resource {name!r} is of type {resource.spec.type!r} (driver {kind.spec.driver!r}); "
                f"plans work on {DIRECTORY_DRIVER!r} resources",
                {"field": "project", "resource": name},
            )
        folder = pathlib.Path(resource.spec.path)
        if not folder.is_absolute():
            raise ACPError(
                ErrorCode.INVALID_PARAMS,
                f"resource {name!r} has a relative path {resource.spec.path!r}",
                {"field": "project", "resource": name},
            )
        anchor = registries.policy.anchor(namespace, resource.spec.path, resolve_local=True)
        if anchor is None or not registries.policy.allows_folder(namespace, resource.spec.path):
            raise ACPError(
                ErrorCode.INVALID_PARAMS,
                f"resource {name!r} lies outside the server's resource roots for namespace {namespace!r}",
                {"field": "project", "resource": name},
            )
        roots[name] = ResourceRoot(name, folder, resource.spec.read_only, anchor)
    if not roots:
        raise ACPError(
            ErrorCode.INVALID_PARAMS,
            f"project {project.name!r} has no resources",
            {"field": "project", "project": project.name},
        )
    return roots


def check_egress(registries: Registries, actor: registry_pb2.Actor) -> None:
    """INVALID_PARAMS at ``plan.use`` when the operator's model allow-lists do not cover a
    model actor (one registered before they were narrowed); the model client checks again
    before every request."""
    if actor.spec.provider != "openai":
        return
    verdict = registries.policy.models.verdict(actor.spec.base_url, actor.spec.api_key_env)
    if verdict.field is not None:
        raise ACPError(
            ErrorCode.INVALID_PARAMS,
            f"actor {actor.name!r} cannot be used on this server: {verdict.field}: {verdict.problem}",
            {"field": "action", "actor": actor.name, "refused": verdict.field},
            refinement="MODEL_ENDPOINT_REFUSED",
        )


def resolve(
    registries: Registries, namespace: str, action: registry_pb2.Action, project: str, profile_name: str
) -> PlanSetup:
    project_entry = registries.fetch(registry_pb2.Project, namespace, project)
    actor = registries.fetch(registry_pb2.Actor, namespace, action.spec.actor or SCRIPTED)
    if actor.spec.provider not in PLAN_PROVIDERS:
        raise ACPError(
            ErrorCode.INVALID_PARAMS,
            f"actor {actor.name!r} has provider {actor.spec.provider!r}; plans run with the "
            f"providers {', '.join(sorted(PLAN_PROVIDERS))}",
            {"field": "action", "actor": actor.name, "provider": actor.spec.provider},
        )
    skills: list[tuple[str, str]] = []
    for name in [*actor.spec.skills, *action.spec.skills]:
        if all(name != known for known, _ in skills):
            skill = registries.fetch(registry_pb2.Skill, namespace, name)
            skills.append((name, skill.spec.instructions))
    profile = _profile(registries, namespace, profile_name)
    if profile_name != action.spec.automation_profile:
        profile = narrowed(profile, _profile(registries, namespace, action.spec.automation_profile))
    return PlanSetup(
        namespace=namespace,
        action=action,
        project=project_entry,
        resources=resources_of(registries, namespace, project_entry),
        actor=actor,
        skills=skills,
        profile_name=profile_name,
        profile=profile,
    )


def _profile(registries: Registries, namespace: str, name: str) -> specs_pb2.AutomationProfileSpec:
    profile = specs_pb2.AutomationProfileSpec()
    if name:
        profile.CopyFrom(registries.fetch(registry_pb2.AutomationProfile, namespace, name).spec)
    return profile


def narrowed(
    chosen: specs_pb2.AutomationProfileSpec, registered: specs_pb2.AutomationProfileSpec
) -> specs_pb2.AutomationProfileSpec:
    """A profile picked at ``plan.use`` over the action's own: it runs only the commands
    (tools and command validations) the action's registered profile allows too, so a
    caller cannot widen what an action may run."""
    tools = [t for t in chosen.allowed_tools if t in BUILTIN_TOOLS or t in registered.allowed_tools]
    del chosen.allowed_tools[:]
    chosen.allowed_tools.extend(tools)
    checks = [v for v in chosen.allowed_validations if v in registered.allowed_validations]
    del chosen.allowed_validations[:]
    chosen.allowed_validations.extend(checks)
    return chosen


def tool_spec(registries: Registries, namespace: str, tool: str) -> specs_pb2.ToolSpec | None:
    """None for a built-in tool; the registered command tool's spec otherwise."""
    if tool in BUILTIN_TOOLS:
        return None
    return registries.fetch(registry_pb2.Tool, namespace, tool).spec


def tool_allowed(profile: specs_pb2.AutomationProfileSpec, tool: str) -> bool:
    """The built-in file tools only stage artifacts, so they always run; a command tool
    runs only when the automation profile lists it."""
    return tool in BUILTIN_TOOLS or tool in profile.allowed_tools


def validations(
    registries: Registries, namespace: str, action: registry_pb2.Action
) -> list[tuple[str, specs_pb2.ValidationSpec]]:
    return [
        (name, registries.fetch(registry_pb2.Validation, namespace, name).spec)
        for name in action.spec.validations
    ]


def invariants(
    registries: Registries, namespace: str, action: registry_pb2.Action
) -> list[tuple[str, specs_pb2.InvariantSpec]]:
    return [
        (name, registries.fetch(registry_pb2.Invariant, namespace, name).spec)
        for name in action.spec.invariants
    ]
