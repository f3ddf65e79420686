"""``ACPClient``, as clients import it; it lives in the contract runtime
(``contract/acp_client.py``) because the gateway's user routes call ACP with it too."""

from cleveragents.acp.contract.acp_client import ACPClient, Params, in_major, request_for, resolve

__all__ = ["ACPClient", "Params", "in_major", "request_for", "resolve"]
