"""What the operator allows, fixed when the server starts and never set by API callers:
the folders directory resources may live in (resource roots), whether the server
runs processes (command tools and command validations), and how, and where model actors
may send requests with which key variables (``models.egress``).

Local mode (no authenticator) trusts its user: no root applies unless one is configured,
and commands run. ``agents serve`` builds a server policy from its settings: with no root
configured it refuses every directory resource, and it runs no process unless the
operator passed ``--allow-commands``, and no model endpoint or key variable it did not list.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.facade.domain.access.webhook_egress import WebhookEgress
from cleveragents.acp.facade.domain.beneath import Anchor, anchor_below
from cleveragents.acp.facade.domain.models.egress import ModelEgress

NAMESPACE_PLACEHOLDER = "{namespace}"
# Namespaces whose roots are kept resolved; past it the cache starts again.
_CACHED_NAMESPACES = 4096
HOW_TO_CONFIGURE_ROOTS = (
    "the operator sets them with `agents serve --resource-root DIR` (repeatable; "
    "resource_roots in the config file; {namespace} in DIR names a per-namespace folder)"
)
HOW_TO_ALLOW_COMMANDS = (
    "the operator enables them with `agents serve --allow-commands` (allow_commands in the config file)"
)


@dataclass(frozen=True)
class ProcessLimits:
    """Resource limits of every process the server runs (``setrlimit`` in the child)."""

    cpu_seconds: int = 600
    memory_bytes: int = 4 * 1024**3
    file_bytes: int = 1024**3
    processes: int = 512


@dataclass(frozen=True)
class CommandUser:
    """The unprivileged account processes run as when the server runs as root."""

    name: str
    uid: int
    gid: int


def check_root_template(root: str) -> str:
    """A configured root: absolute, with ``{namespace}`` as its only placeholder."""
    if not os.path.isabs(root):
        raise ValueError(f"resource root {root!r} is not an absolute path")
    rest = root.replace(NAMESPACE_PLACEHOLDER, "")
    if "{" in rest or "}" in rest:
        raise ValueError(f"resource root {root!r}: the only placeholder is {NAMESPACE_PLACEHOLDER}")
    return root


def _namespace_folder(namespace: str) -> bool:
    """Whether a namespace can stand for one folder name (never climbs or nests)."""
    return (
        bool(namespace) and namespace not in (".", "..") and "/" not in namespace and "\x00" not in namespace
    )


@dataclass
class Policy:
    resource_roots: tuple[str, ...] = ()
    # Server mode: with no root configured, no directory resource is allowed.
    roots_required: bool = False
    allow_commands: bool = True
    command_user: CommandUser | None = None
    limits: ProcessLimits = field(default_factory=ProcessLimits)
    models: ModelEgress = field(default_factory=ModelEgress)
    # Where webhooks may send (https only, global addresses only, unless the operator says).
    webhooks: WebhookEgress = field(default_factory=WebhookEgress)
    _resolved: dict[str, tuple[str, ...]] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.resource_roots = tuple(check_root_template(root) for root in self.resource_roots)

    @classmethod
    def local(cls, environ: Mapping[str, str] | None = None) -> Policy:
        """Local mode: roots from ``$ACP_RESOURCE_ROOTS`` (``os.pathsep`` separated) when
        set, else none apply; commands run unless ``$ACP_ALLOW_COMMANDS`` is false; model
        endpoints and key variables from ``$ACP_MODEL_ENDPOINTS`` and ``$ACP_MODEL_KEY_ENVS``
        (comma separated) when set, else any."""
        environ = os.environ if environ is None else environ
        roots = tuple(r for r in environ.get("ACP_RESOURCE_ROOTS", "").split(os.pathsep) if r)
        allow = environ.get("ACP_ALLOW_COMMANDS", "").strip().lower() not in ("0", "false", "no", "off")
        models = ModelEgress.configured(
            _listed(environ.get("ACP_MODEL_ENDPOINTS", "")),
            _listed(environ.get("ACP_MODEL_KEY_ENVS", "")),
            required=False,
        )
        return cls(
            resource_roots=roots,
            allow_commands=allow,
            models=models,
            webhooks=WebhookEgress.from_env(environ),
        )

    @classmethod
    def server(
        cls,
        roots: Sequence[str] = (),
        *,
        allow_commands: bool = False,
        command_user: CommandUser | None = None,
        model_endpoints: Sequence[str] = (),
        model_key_envs: Sequence[str] = (),
        webhook_allow_http: bool = False,
        webhook_allow_networks: Sequence[str] = (),
    ) -> Policy:
        """Nothing the operator did not list: no directory resource outside ``roots``, no
        process without ``allow_commands``, no model endpoint or key variable not listed, no
        plain-http webhook or one to a non-global address outside the listed networks."""
        return cls(
            resource_roots=tuple(roots),
            roots_required=True,
            allow_commands=allow_commands,
            command_user=command_user,
            models=ModelEgress.configured(model_endpoints, model_key_envs, required=True),
            webhooks=WebhookEgress.configured(
                allow_http=webhook_allow_http, allow_networks=webhook_allow_networks
            ),
        )

    @property
    def restricted(self) -> bool:
        return bool(self.resource_roots) or self.roots_required

    def _expanded(self, namespace: str) -> list[str]:
        """The namespace's roots as configured ({namespace} filled in), not resolved."""
        expanded = []
        for root in self.resource_roots:
            if NAMESPACE_PLACEHOLDER in root:
                if not _namespace_folder(namespace):
                    continue
                root = root.replace(NAMESPACE_PLACEHOLDER, namespace)
            expanded.append(root)
        return expanded

    def roots(self, namespace: str) -> tuple[str, ...]:
        """The namespace's roots, resolved once (symlinks of the operator's own paths)."""
        found = self._resolved.get(namespace)
        if found is None:
            resolved = [os.path.realpath(root) for root in self._expanded(namespace)]
            if len(self._resolved) >= _CACHED_NAMESPACES:
                self._resolved.clear()
            found = self._resolved[namespace] = tuple(resolved)
        return found

    def anchor(self, namespace: str, folder: str, *, resolve_local: bool = False) -> Anchor | None:
        """Where every file operation opens the resource ``folder`` from: the root it lies
        in (resolved; the folder matched against the root as configured or as resolved),
        with the path below it walked without following a symlink; None when it lies in
        none of the namespace's roots. With no root applying (local mode without roots) the
        folder itself (``resolve_local``: resolved first, for a folder as registered; a
        checkpoint's folder was recorded resolved): its user is the only one."""
        if not self.restricted:
            return Anchor(os.path.realpath(folder) if resolve_local else os.path.normpath(folder))
        pairs = [(root, root) for root in self.roots(namespace)]
        pairs += [(root, os.path.realpath(root)) for root in self._expanded(namespace)]
        for candidate in (folder, os.path.realpath(folder)):
            for named, base in pairs:
                found = anchor_below(named, candidate)
                if found is not None:
                    return Anchor(base, found.below)
        return None

    def inside_roots(self, namespace: str, real: str) -> bool:
        return any(
            real == root or real.startswith(root.rstrip(os.sep) + os.sep) for root in self.roots(namespace)
        )

    def allows_folder(self, namespace: str, path: str) -> bool:
        """Whether ``path`` (symlinks resolved) lies inside one of the namespace's roots;
        always true when no root applies (local mode without roots)."""
        if not self.restricted:
            return True
        return self.inside_roots(namespace, os.path.realpath(path))

    def check_folder(self, namespace: str, path: str, field_: str) -> None:
        """INVALID_PARAMS unless ``path`` is an existing folder inside the namespace's
        roots; outside them the answer is the same whether the path exists or not."""
        if not self.restricted:
            if not os.path.isdir(path):
                raise _invalid(field_, f"{path} is not an existing directory")
            return
        if not self.roots(namespace):
            raise _invalid(
                field_,
                "this server has no resource roots for directory resources"
                + (f" in namespace {namespace!r}" if self.resource_roots else "")
                + f"; {HOW_TO_CONFIGURE_ROOTS}",
            )
        real = os.path.realpath(path)
        if not self.inside_roots(namespace, real):
            raise _invalid(
                field_,
                "must be a folder inside the server's resource roots for this namespace: "
                + ", ".join(self.roots(namespace)),
            )
        if not os.path.isdir(real):
            raise _invalid(field_, f"{path} is not an existing directory")

    def check_model_actor(self, base_url: str, api_key_env: str) -> None:
        """INVALID_PARAMS naming ``spec.base_url`` or ``spec.api_key_env`` when the operator's
        allow-lists do not cover them (``models.egress``)."""
        verdict = self.models.verdict(base_url, api_key_env)
        if verdict.field is not None:
            raise _invalid(verdict.field, verdict.problem)

    def check_commands(self) -> None:
        """INVALID_STATE when the operator has not enabled processes."""
        if not self.allow_commands:
            raise ACPError(
                ErrorCode.INVALID_STATE,
                f"this server runs no commands; {HOW_TO_ALLOW_COMMANDS}",
                {"refinement": "COMMANDS_DISABLED"},
            )


def _listed(value: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in value.split(",") if item.strip())


def _invalid(field_: str, message: str) -> ACPError:
    return ACPError(ErrorCode.INVALID_PARAMS, f"{field_}: {message}", {"field": field_})
