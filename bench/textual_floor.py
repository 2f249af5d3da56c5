"""The floor under vtop: the smallest Textual app that draws a key line ("q Quit", what
bench/run.py waits for), started the same way.

    python bench/textual_floor.py            # draws once and waits (bench/run.py: the first frame)
    python bench/textual_floor.py --tick     # also redraws one line every second, as a live monitor does

Python's start, importing Textual and Textual's own start-up to a first frame are in every Textual
app's first frame; bench/run.py starts this and vtop in turn and reports both, so what vtop adds can
be told from what the box and the framework cost (they move together from box to box). ``--tick``
is the floor under a live Textual monitor's memory and CPU: bench/lean.py runs it beside vtop and
nvitop (``--floor``), so the share of vtop's peak RSS and CPU that any Textual dashboard pays (Python,
asyncio with the ssl module it imports, Textual, Rich) is measured, not guessed.
"""

import sys
import time

from textual.app import App, ComposeResult
from textual.widgets import Static


class Floor(App[None]):
    BINDINGS = [("q", "quit", "Quit")]

    def __init__(self, tick: bool) -> None:
        super().__init__()
        self.tick = tick

    def compose(self) -> ComposeResult:
        yield Static("textual floor", id="clock")
        yield Static("q Quit")

    def on_mount(self) -> None:
        if self.tick:
            self.set_interval(1.0, self._tick)

    def _tick(self) -> None:
        self.query_one("#clock", Static).update(f"textual floor {time.strftime('%H:%M:%S')}")


if __name__ == "__main__":
    Floor(tick="--tick" in sys.argv[1:]).run()
