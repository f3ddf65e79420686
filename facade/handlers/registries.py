"""The registry operations of every kind: ``<kind>.list|show|add|update|remove``.

One implementation per verb serves all kinds (the domain's ``RegistryVerbs`` reads the
kind from the request's type); each operation it serves is marked on it by name and RPC.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import message

from cleveragents.acp.contract.call import CallContext
from cleveragents.acp.facade.domain.registries.resolve import ProjectResolver
from cleveragents.acp.facade.domain.registries.verbs import RegistryVerbs
from cleveragents.acp.facade.handlers.table import handles
from cleveragents.acp.v1 import workspace_pb2


class RegistryHandlers:
    def __init__(self, verbs: RegistryVerbs) -> None:
        self._verbs = verbs
        self._resolver = ProjectResolver(verbs.registries)

    @handles("project.resolve")
    async def ResolveProject(
        self, request: workspace_pb2.ResolveProjectRequest, ctx: CallContext
    ) -> workspace_pb2.ResolveProjectResponse:
        return await self._resolver.resolve(ctx, request)

    @handles("actor.list", rpc="ListActors")
    @handles("skill.list", rpc="ListSkills")
    @handles("tool.list", rpc="ListTools")
    @handles("validation.list", rpc="ListValidations")
    @handles("resource.list", rpc="ListResources")
    @handles("resource_type.list", rpc="ListResourceTypes")
    @handles("project.list", rpc="ListProjects")
    @handles("action.list", rpc="ListActions")
    @handles("automation_profile.list", rpc="ListAutomationProfiles")
    @handles("invariant.list", rpc="ListInvariants")
    async def list(self, request: Any, ctx: CallContext) -> message.Message:
        return await self._verbs.list(ctx, request)

    @handles("actor.show", rpc="GetActor")
    @handles("skill.show", rpc="GetSkill")
    @handles("tool.show", rpc="GetTool")
    @handles("validation.show", rpc="GetValidation")
    @handles("resource.show", rpc="GetResource")
    @handles("resource_type.show", rpc="GetResourceType")
    @handles("project.show", rpc="GetProject")
    @handles("action.show", rpc="GetAction")
    @handles("automation_profile.show", rpc="GetAutomationProfile")
    @handles("invariant.show", rpc="GetInvariant")
    async def show(self, request: Any, ctx: CallContext) -> message.Message:
        return await self._verbs.show(ctx, request)

    @handles("actor.add", rpc="AddActor")
    @handles("skill.add", rpc="AddSkill")
    @handles("tool.add", rpc="AddTool")
    @handles("validation.add", rpc="AddValidation")
    @handles("resource.add", rpc="AddResource")
    @handles("resource_type.add", rpc="AddResourceType")
    @handles("project.add", rpc="AddProject")
    @handles("action.add", rpc="AddAction")
    @handles("automation_profile.add", rpc="AddAutomationProfile")
    @handles("invariant.add", rpc="AddInvariant")
    async def add(self, request: Any, ctx: CallContext) -> message.Message:
        return await self._verbs.add(ctx, request)

    @handles("actor.update", rpc="UpdateActor")
    @handles("skill.update", rpc="UpdateSkill")
    @handles("tool.update", rpc="UpdateTool")
    @handles("validation.update", rpc="UpdateValidation")
    @handles("resource.update", rpc="UpdateResource")
    @handles("resource_type.update", rpc="UpdateResourceType")
    @handles("project.update", rpc="UpdateProject")
    @handles("action.update", rpc="UpdateAction")
    @handles("automation_profile.update", rpc="UpdateAutomationProfile")
    @handles("invariant.update", rpc="UpdateInvariant")
    async def update(self, request: Any, ctx: CallContext) -> message.Message:
        return await self._verbs.update(ctx, request)

    @handles("actor.remove", rpc="RemoveActor")
    @handles("skill.remove", rpc="RemoveSkill")
    @handles("tool.remove", rpc="RemoveTool")
    @handles("validation.remove", rpc="RemoveValidation")
    @handles("resource.remove", rpc="RemoveResource")
    @handles("resource_type.remove", rpc="RemoveResourceType")
    @handles("project.remove", rpc="RemoveProject")
    @handles("action.remove", rpc="RemoveAction")
    @handles("automation_profile.remove", rpc="RemoveAutomationProfile")
    @handles("invariant.remove", rpc="RemoveInvariant")
    async def remove(self, request: Any, ctx: CallContext) -> message.Message:
        return await self._verbs.remove(ctx, request)
