"""``PlanCreator``: ``plan.use``, a plan made from an action against a project.

The action's inputs are checked against its schema (defaults filled in) on the caller-work
pool, the plan's setup (actor, profile, resources, tools) is resolved and checked, and the
plan is recorded pending Strategize with ``plan.created``; an automation profile that
executes by itself starts it at once.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from ulid import ULID

from cleveragents.acp.contract.call import CallContext
from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.facade.domain.access import roles
from cleveragents.acp.facade.domain.bounded import caller_work
from cleveragents.acp.facade.domain.plans import actor, model, setup
from cleveragents.acp.facade.domain.plans.recording import PlanRecorder, now
from cleveragents.acp.facade.domain.plans.running import PlanRunner
from cleveragents.acp.v1 import common_pb2, events_pb2, plan_pb2, registry_pb2, session_pb2

SESSION_KIND = "session"


def inputs_of(schema: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """The inputs with the schema's top-level defaults filled in, or INVALID_PARAMS."""
    inputs = dict(given)
    for name, prop in (schema.get("properties") or {}).items():
        if isinstance(prop, dict) and "default" in prop and name not in inputs:
            inputs[name] = prop["default"]
    if not schema:
        return inputs
    # Imported when a schema is checked (jsonschema: see plans.validations).
    from cleveragents.acp.facade.domain.bounded import json_schemas

    try:
        validator_class = json_schemas.check(schema)
    except json_schemas.SchemaError as exc:
        raise ACPError(
            ErrorCode.INVALID_PARAMS,
            f"the action's inputs_schema is not valid: {exc.message}",
            {"field": "action"},
        ) from None
    problems = json_schemas.errors(validator_class, schema, inputs)
    if problems:
        raise ACPError(
            ErrorCode.INVALID_PARAMS,
            f"inputs do not match the action's schema: {'; '.join(problems)}",
            {"field": "inputs", "errors": problems},
        )
    return inputs


class PlanCreator:
    def __init__(self, recorder: PlanRecorder, runner: PlanRunner) -> None:
        self.recorder = recorder
        self.registries = recorder.registries
        self.runner = runner

    async def use(self, ctx: CallContext, request: plan_pb2.UsePlanRequest) -> plan_pb2.Plan:
        namespace = ctx.namespace(request.namespace)
        if request.automation_profile:
            await self.recorder.read(
                lambda: self._check_profile_override(
                    ctx, namespace, request.action, request.automation_profile
                )
            )
        return await self.create(
            namespace=namespace,
            action=request.action,
            project=request.project,
            inputs=json_format.MessageToDict(request.inputs),
            session_id=request.session_id,
            automation_profile=request.automation_profile,
        )

    def _check_profile_override(self, ctx: CallContext, namespace: str, action: str, profile: str) -> None:
        """A profile named on plan.use allows no command the action's own profile does not,
        unless an admin asks (roles.check_profile_override)."""
        action_entry = self.registries.fetch(registry_pb2.Action, namespace, action)
        chosen = self.registries.fetch(registry_pb2.AutomationProfile, namespace, profile).spec
        own = None
        if action_entry.spec.automation_profile:
            own = self.registries.fetch(
                registry_pb2.AutomationProfile, namespace, action_entry.spec.automation_profile
            ).spec
        roles.check_profile_override(ctx, chosen, own, profile)

    async def create(
        self,
        *,
        namespace: str,
        action: str,
        project: str,
        inputs: dict[str, Any],
        session_id: str = "",
        automation_profile: str = "",
    ) -> plan_pb2.Plan:
        """The plan, recorded (and started when its profile executes by itself); the
        caller has authorized ``namespace``."""
        recorder = self.recorder

        def resolve() -> tuple[registry_pb2.Action, str, setup.PlanSetup]:
            action_entry = self.registries.fetch(registry_pb2.Action, namespace, action)
            # A plan's profile: the one the call names, else its session's override
            # (session.update's automation_profile), else the action's own.
            session_profile = ""
            if session_id:
                session = recorder.store.get(SESSION_KIND, session_id)
                if session is None or session.namespace != namespace:
                    raise ACPError(
                        ErrorCode.NOT_FOUND,
                        f"no session {session_id!r} in namespace {namespace!r}",
                        {"session_id": session_id},
                        refinement="SESSION_NOT_FOUND",
                    )
                session_profile = session_pb2.Session.FromString(session.body).automation_profile
            profile_name = automation_profile or session_profile or action_entry.spec.automation_profile
            plan_setup = setup.resolve(self.registries, namespace, action_entry, project, profile_name)
            setup.check_egress(self.registries, plan_setup.actor)
            return action_entry, profile_name, plan_setup

        action_entry, profile_name, plan_setup = await recorder.read(resolve)
        # On the caller-work pool: bounded, shared fairly between namespaces, and stopped if
        # the caller leaves (RE2 matches without the GIL: a long input holds no other call).
        schema = actor.as_dict(action_entry.spec.inputs_schema)
        values = await caller_work.CALLER_WORK.run(namespace, inputs_of, schema, inputs)
        steps = actor.declared_steps(action_entry.spec, values)
        await recorder.read(
            lambda: [setup.tool_spec(self.registries, namespace, step.tool) for step in steps]
        )
        # A model chooses its own steps: the declared ones are the scripted actor's.
        planned = 0 if recorder.model_of(plan_setup) is not None else len(steps)
        # The template only: the prompt's context lists the project's files, a walk of the
        # folder that must not run on the loop (it is built when the plan strategizes).
        actor.task(plan_setup, values)
        stamp = now()
        plan = plan_pb2.Plan(
            meta=common_pb2.EntityMeta(
                id=str(ULID()), namespace=namespace, create_time=stamp, update_time=stamp
            ),
            action=action,
            project=project,
            session_id=session_id,
            inputs=actor.struct(values),
            phase=model.STRATEGIZE,
            state=model.PENDING,
            progress=plan_pb2.Progress(done=0, total=planned),
            cost=plan_pb2.Cost(spent=0, budget=plan_setup.profile.cost_budget),
            automation_profile=profile_name,
        )

        def record() -> None:
            recorder.records.insert(plan)
            recorder.records.save_action(plan.meta.id, action_entry)
            recorder.publish(plan, plan_created=events_pb2.PlanCreated(action=action, project=project))

        await recorder.write(record)
        if plan_setup.profile.auto_execute:
            await self.runner.start(plan)
        return plan
