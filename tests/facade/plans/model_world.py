"""A project, a model actor on the fake OpenAI server, and an action using it."""

from __future__ import annotations

import pathlib
from collections.abc import Mapping
from typing import Any

from cleveragents.acp.client.acp_client import ACPClient
from tests.facade.plans.helpers import add_project, write_tree

KEY_ENV = "ACP_TEST_MODEL_KEY"
KEY = "sk-live-7f3a9c0d1e2b4a6f8e0d2c4b6a8f0e1d"
ACTOR = "writer"


async def model_world(
    client: ACPClient,
    folder: pathlib.Path,
    base_url: str,
    *,
    profile: Mapping[str, Any] | None = None,
    cost_per_1k_tokens: float = 1.0,
    prompt: str = "Rename {{word}} everywhere.",
    namespace: str = "",
) -> None:
    write_tree(folder)
    await add_project(client, folder, namespace=namespace)
    await client.call(
        "skill.add", namespace=namespace, name="careful", spec={"instructions": "Read before you write."}
    )
    await client.call(
        "actor.add",
        namespace=namespace,
        name=ACTOR,
        spec={
            "provider": "openai",
            "model": "fake-model",
            "base_url": base_url,
            "api_key_env": KEY_ENV,
            "system_prompt": "You edit the files of a project.",
            "skills": ["careful"],
            "cost_per_1k_tokens": cost_per_1k_tokens,
        },
    )
    profile_name = ""
    if profile is not None:
        profile_name = "models"
        await client.call(
            "automation_profile.add", namespace=namespace, name=profile_name, spec=dict(profile)
        )
    await client.call(
        "action.add",
        namespace=namespace,
        name="act",
        spec={"actor": ACTOR, "prompt_template": prompt, "automation_profile": profile_name},
    )
