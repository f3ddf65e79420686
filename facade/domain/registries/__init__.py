"""The registries of actors, skills, tools, validations, resources, resource types,
projects, actions, automation profiles and invariants."""

from cleveragents.acp.facade.domain.registries.builtins import BUILTIN_TOOLS, BUILTINS
from cleveragents.acp.facade.domain.registries.kinds import KINDS, Kind, kind_of
from cleveragents.acp.facade.domain.registries.registry import Registries, check_name

__all__ = ["BUILTINS", "BUILTIN_TOOLS", "KINDS", "Kind", "Registries", "check_name", "kind_of"]
