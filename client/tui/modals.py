"""Dialogs: the key map (``?``), a confirmation (``y``/``n``) and one line of text."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import Input, Label, Static

DIALOG_CSS = """
ModalScreen { align: center middle; }
ModalScreen > Vertical { width: 76; max-width: 100%; height: auto; max-height: 100%;
    border: round $accent; background: $surface; padding: 0 1; }
"""


def key_rows(screen: Screen[Any]) -> list[tuple[str, str]]:
    """(keys, what they do) for every key of ``screen`` and of the app."""
    rows: list[tuple[str, str]] = []
    seen: set[str] = set()
    for source in (screen, screen.app):
        # A screen's keys are its own and its base classes' (Textual merges them so); Textual's
        # own (tab, ctrl+q) are not repeated here.
        classes = [
            cls
            for cls in type(source).__mro__
            if "BINDINGS" in vars(cls) and cls.__module__.startswith(__package__)
        ]
        for binding in [b for cls in classes for b in vars(cls)["BINDINGS"]]:
            if isinstance(binding, Binding) and binding.description and binding.key not in seen:
                seen.add(binding.key)
                keys = [dataclasses.replace(binding, key=key.strip()) for key in binding.key.split(",")]
                rows.append((" ".join(screen.app.get_key_display(key) for key in keys), binding.description))
    return rows


class KeysScreen(ModalScreen[None]):
    """Every key of the screen below and of the app (``?``, ``escape`` closes)."""

    DEFAULT_CSS = DIALOG_CSS
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,question_mark,q", "dismiss", "Close"),
    ]

    def __init__(self, rows: list[tuple[str, str]]) -> None:
        super().__init__()
        self.rows = rows

    def compose(self) -> ComposeResult:
        lines = [f"{key:>12}  {text}" for key, text in self.rows]
        with Vertical():
            yield Label("Keys (escape closes)")
            yield Static("\n".join(lines), id="keys")

    def action_dismiss(self) -> None:  # type: ignore[override]
        self.dismiss(None)


class Confirm(ModalScreen[bool]):
    """``y`` confirms, ``n`` or ``escape`` does not."""

    DEFAULT_CSS = DIALOG_CSS
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "Yes"),
        Binding("n,escape", "answer(False)", "No"),
    ]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self.question, id="question")
            yield Label("y: yes   n: no")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class Ask(ModalScreen[str | None]):
    """One line of text: ``enter`` gives it, ``escape`` gives up."""

    DEFAULT_CSS = DIALOG_CSS
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "give_up", "Cancel")]

    def __init__(self, question: str, value: str = "") -> None:
        super().__init__()
        self.question = question
        self.value = value

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self.question)
            yield Input(value=self.value, id="answer")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)

    def action_give_up(self) -> None:
        self.dismiss(None)
