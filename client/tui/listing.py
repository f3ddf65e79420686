"""A list screen: a filter, a table read page by page from a ``*.list`` operation, and the keys
every list has (open, filter, copy the id, read again). The sessions and plans screens are two."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.timer import Timer
from textual.widgets import DataTable, Input, Static

from cleveragents.acp.client.tui.page import Page

# Items read at most (pages of ``PAGE``); the filter works on these.
MAX_ITEMS = 5000
PAGE = 500
# Events come in bursts (a tell is four, a plan's run dozens): one reload for a burst.
RELOAD_SECONDS = 0.3


class Listing(Page):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "open", "Open", show=False),
        Binding("slash", "filter", "Filter"),
        Binding("escape", "table", "To the list", show=False),
        Binding("y", "copy", "Copy id"),
        Binding("ctrl+r", "reload", "Reload"),
    ]
    OPERATION: ClassVar[str]
    WHAT: ClassVar[str]  # "sessions"
    COLUMNS: ClassVar[tuple[str, ...]]
    PLACEHOLDER: ClassVar[str] = "/ filter: any text"
    HINT: ClassVar[str] = "enter opens · / filters · y copies the id"

    def __init__(self) -> None:
        super().__init__()
        self.items: list[Any] = []
        self._reload_timer: Timer | None = None

    def cells(self, item: Any) -> Sequence[str]:
        raise NotImplementedError

    def key(self, item: Any) -> str:
        return str(item.meta.id)

    def open(self, key: str) -> None:
        raise NotImplementedError

    def filters(self) -> dict[str, Any]:
        """Fields of the list call beside the page (the inbox asks for pending requests)."""
        return {}

    def matches(self, words: list[str], cells: Sequence[str]) -> bool:
        return all(any(word in cell.lower() for cell in cells) for word in words)

    def body(self) -> ComposeResult:
        yield Input(placeholder=self.PLACEHOLDER, id="filter")
        table: DataTable[str] = DataTable(id="rows", cursor_type="row", zebra_stripes=True)
        table.add_columns(*self.COLUMNS)
        yield table
        yield Static(f"loading {self.WHAT}…", id="status", classes="status")

    def on_mount(self) -> None:
        self.query_one(DataTable).focus()
        self.load()

    @work(exclusive=True, group="load")
    async def load(self) -> None:
        found: list[Any] = []
        token = ""
        while len(found) < MAX_ITEMS:
            page = await self.acp.call(self.OPERATION, page_size=PAGE, page_token=token, **self.filters())
            if page is None:
                self.query_one("#status", Static).update(
                    f"could not list the {self.WHAT} (see the message above)"
                )
                return
            found += getattr(page, page.DESCRIPTOR.fields[0].name)
            token = page.next_page_token  # type: ignore[attr-defined]
            if not token:
                break
        self.items = found
        self.show_rows()

    def show_rows(self) -> None:
        words = self.query_one("#filter", Input).value.strip().lower().split()
        table = self.query_one(DataTable)
        selected = self.selected()
        table.clear()
        for item in self.items:
            cells = self.cells(item)
            if self.matches(words, cells):
                table.add_row(*cells, key=self.key(item))
        if selected and selected in table.rows:
            table.move_cursor(row=table.get_row_index(selected))
        self.query_one("#status", Static).update(
            f"{table.row_count} of {len(self.items)} {self.WHAT} · {self.HINT}"
        )

    def selected(self) -> str:
        table = self.query_one(DataTable)
        if not table.row_count:
            return ""
        return table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value or ""

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "filter":
            self.show_rows()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "filter":
            self.query_one(DataTable).focus()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value:
            self.open(event.row_key.value)

    def action_open(self) -> None:
        if self.selected():
            self.open(self.selected())

    def action_filter(self) -> None:
        self.query_one("#filter", Input).focus()

    def action_table(self) -> None:
        self.query_one(DataTable).focus()

    def action_copy(self) -> None:
        self.acp.copy_id(self.selected(), self.WHAT.removesuffix("s") + " id")

    def action_reload(self) -> None:
        self.load()

    def reload_soon(self) -> None:
        if self._reload_timer is None:
            self._reload_timer = self.set_timer(RELOAD_SECONDS, self._reload_now)

    def _reload_now(self) -> None:
        self._reload_timer = None
        self.load()

    def reconnected(self) -> None:
        self.load()
