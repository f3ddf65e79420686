"""The place kept for the approvals inbox.

The approval operations (what waits for a person, allow and reject with the diff or command
shown) are being added to the contract on another branch; until they are in the catalog this
screen says so and shows nothing else: no approval is invented here. When they land, this
module lists them (its count in the header of every screen) and answers them."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.widgets import Static

from cleveragents.acp.client.tui.page import Page
from cleveragents.acp.contract import catalog

GROUP = "approval"


def available() -> bool:
    """Whether the served contract has the approval operations yet."""
    return any(op.group == GROUP for op in catalog.OPERATIONS.values())


class ApprovalsScreen(Page):
    def body(self) -> ComposeResult:
        if available():
            text = "Approval operations are in the contract, but this client does not show them yet."
        else:
            text = (
                "Approvals inbox\n\n"
                "Not available yet: the approval operations (allow or reject what a plan waits "
                "for, with its diff or command) are not part of this ACP contract. This screen "
                "will list them when they are."
            )
        yield Static(text, id="approvals", classes="status")
