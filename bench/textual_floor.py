"""The floor under vtop's first frame: the smallest Textual app that draws a
key line ("q Quit", what bench/run.py waits for), started the same way.

    python bench/textual_floor.py

Python's start, importing Textual and Textual's own start-up to a first frame
are in every Textual app's first frame; bench/run.py starts this and vtop in
turn and reports both, so what vtop adds can be told from what the box and the
framework cost (they move together from box to box).
"""

from textual.app import App, ComposeResult
from textual.widgets import Static


class Floor(App[None]):
    BINDINGS = [("q", "quit", "Quit")]

    def compose(self) -> ComposeResult:
        yield Static("textual floor")
        yield Static("q Quit")


if __name__ == "__main__":
    Floor().run()
