"""Plans keep to their namespace on every operation when tokens are in force."""

from __future__ import annotations

import pathlib

import pytest

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.facade.auth import TokenAuthenticator, create_token
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.v1 import plan_pb2
from tests.facade.plans.helpers import add_action, add_project, write_tree

UNKNOWN_PLAN = "01KC0000000000000000000000"


async def test_another_namespace_is_forbidden(tmp_path: pathlib.Path) -> None:
    tokens = tmp_path / "tokens.toml"
    admin = create_token(tokens, "admin", None)
    team = create_token(tokens, "team", ["team"])
    facade = open_facade(tmp_path / "acp.db", authenticator=TokenAuthenticator(tokens))
    root = ACPClient(LocalTransport(facade), token=admin)
    member = ACPClient(LocalTransport(facade), token=team)
    try:
        folder = tmp_path / "repo"
        write_tree(folder)
        for namespace in ("default", "team"):
            await add_project(root, folder, namespace=namespace)
            await add_action(root, namespace=namespace, steps=[])
        used = await root.call("plan.use", action="act", project="proj")
        assert isinstance(used, plan_pb2.UsePlanResponse)
        plan_id = used.plan.meta.id
        assert used.plan.meta.namespace == "default"
        for operation in (
            "plan.status",
            "plan.tree",
            "plan.diff",
            "plan.execute",
            "plan.cancel",
            "plan.apply",
        ):
            # Issue 31, finding 9: as an unknown id answers, naming no namespace.
            with pytest.raises(ACPError) as info:
                await member.call(operation, plan_id=plan_id)
            with pytest.raises(ACPError) as unknown:
                await member.call(operation, plan_id=UNKNOWN_PLAN)
            assert info.value.code == "NOT_FOUND", operation
            assert info.value.details == {**unknown.value.details, "plan_id": plan_id}, operation
            assert info.value.message == unknown.value.message.replace(UNKNOWN_PLAN, plan_id), operation
            assert "default" not in info.value.message
        with pytest.raises(ACPError) as info:
            await member.call("plan.use", action="act", project="proj")
        assert info.value.code == "AUTH_FORBIDDEN"
        own = await member.call("plan.use", namespace="team", action="act", project="proj")
        assert isinstance(own, plan_pb2.UsePlanResponse)
        listed = await member.call("plan.list")
        assert isinstance(listed, plan_pb2.ListPlansResponse)
        assert [p.meta.id for p in listed.plans] == [own.plan.meta.id]
        everything = await root.call("plan.list")
        assert isinstance(everything, plan_pb2.ListPlansResponse)
        assert {p.meta.id for p in everything.plans} == {plan_id, own.plan.meta.id}
        with pytest.raises(ACPError) as info:
            await member.call("plan.list", namespace="default")
        assert info.value.code == "AUTH_FORBIDDEN"
    finally:
        await facade.close()
