"""The registries, read only: a kind, its entries, one entry's spec and labels."""

from __future__ import annotations

import json
from typing import ClassVar

from google.protobuf import json_format
from rich.syntax import Syntax
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import DataTable, OptionList, Static

from cleveragents.acp.client.tui.page import Page
from cleveragents.acp.contract import catalog

# The registry kinds, as the catalog has them: the groups with an ``add`` verb.
KINDS = tuple(dict.fromkeys(op.group for op in catalog.OPERATIONS.values() if op.name.endswith(".add")))
PAGE = 500


class RegistriesScreen(Page):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "copy", "Copy name"),
        Binding("ctrl+r", "reload", "Reload"),
    ]
    DEFAULT_CSS = """
    #kinds { width: 26; height: 1fr; }
    #entries { width: 1fr; height: 1fr; }
    #entry { height: 1fr; border: round $primary-darken-2; }
    """

    def __init__(self) -> None:
        super().__init__()
        self.kind = KINDS[0]

    def body(self) -> ComposeResult:
        with Horizontal():
            yield OptionList(*KINDS, id="kinds")
            table: DataTable[str] = DataTable(id="entries", cursor_type="row")
            table.add_columns("namespace", "name", "labels")
            yield table
        with VerticalScroll(id="entry"):
            yield Static("choose a kind, then an entry", id="spec")

    def on_mount(self) -> None:
        self.query_one(OptionList).focus()
        self.load()

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        self.kind = KINDS[event.option_index]
        self.load()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.query_one(DataTable).focus()

    @work(exclusive=True, group="load")
    async def load(self) -> None:
        kind = self.kind
        answer = await self.acp.call(f"{kind}.list", page_size=PAGE)
        table = self.query_one(DataTable)
        table.clear()
        if answer is None:
            return
        entries = getattr(answer, answer.DESCRIPTOR.fields[0].name)
        for entry in entries:
            labels = ",".join(f"{k}={v}" for k, v in sorted(entry.labels.items()))
            namespace = entry.meta.namespace
            table.add_row(namespace, entry.name, labels or "-", key=f"{namespace}/{entry.name}")
        self.query_one("#spec", Static).update(f"{len(entries)} {kind} entries · enter shows one")

    def selected(self) -> str:
        table = self.query_one(DataTable)
        if not table.row_count:
            return ""
        return table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value or ""

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key.value:
            self.show_entry(event.row_key.value)

    @work(exclusive=True, group="entry")
    async def show_entry(self, key: str) -> None:
        namespace, name = key.split("/", 1)
        answer = await self.acp.call(f"{self.kind}.show", name=name, namespace=namespace)
        if answer is None:
            return
        data = json_format.MessageToDict(answer, preserving_proto_field_name=True)
        for entry in data.values():
            # Times and ids change from run to run; the spec and labels are what is browsed.
            if isinstance(entry, dict):
                entry.pop("meta", None)
        text = json.dumps(data, indent=2, sort_keys=True)
        self.query_one("#spec", Static).update(Syntax(text, "json", theme="ansi_dark", word_wrap=True))

    def action_copy(self) -> None:
        self.acp.copy_id(self.selected(), "entry")

    def action_reload(self) -> None:
        self.load()
