"""The floor under vtop: the smallest Textual app that draws a key line ("q Quit", what
bench/run.py waits for), started the same way.

    python bench/textual_floor.py            # draws once and waits (bench/run.py: the first frame)
    python bench/textual_floor.py --tick     # also redraws one line every second, as a live monitor does
    python bench/textual_floor.py --tick --nvml   # ... with GPU 0's utilization and memory read from NVML

Python's start, importing Textual and Textual's own start-up to a first frame are in every Textual
app's first frame; bench/run.py starts this and vtop in turn and reports both, so what vtop adds can
be told from what the box and the framework cost (they move together from box to box). ``--tick``
is the floor under a live Textual monitor's memory and CPU: bench/lean.py runs it beside vtop and
nvitop (``--floor``), so the share of vtop's peak RSS and CPU that any Textual dashboard pays (Python,
asyncio with the ssl module it imports, Textual, Rich) is measured, not guessed.
``--nvml`` is the floor under a Textual GPU monitor: the same app reading GPU 0's utilization and
memory through pynvml at every tick (the least any GPU monitor reads), so the memory NVML's library
takes in a process is measured beside nvitop, which loads the same library.
"""

import sys
import time

from textual.app import App, ComposeResult
from textual.widgets import Static


class Floor(App[None]):
    BINDINGS = [("q", "quit", "Quit")]

    def __init__(self, tick: bool, nvml: bool = False) -> None:
        super().__init__()
        self.tick = tick
        self.nvml = nvml
        self.handle = None

    def compose(self) -> ComposeResult:
        yield Static("textual floor", id="clock")
        yield Static("q Quit")

    def on_mount(self) -> None:
        if self.nvml:
            import pynvml

            pynvml.nvmlInit()
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        if self.tick:
            self.set_interval(1.0, self._tick)

    def _tick(self) -> None:
        gpu = ""
        if self.handle is not None:
            import pynvml

            util = pynvml.nvmlDeviceGetUtilizationRates(self.handle)
            mem = pynvml.nvmlDeviceGetMemoryInfo(self.handle)
            gpu = f" GPU {util.gpu}% {mem.used >> 20} MiB"
        self.query_one("#clock", Static).update(f"textual floor {time.strftime('%H:%M:%S')}{gpu}")


if __name__ == "__main__":
    Floor(tick="--tick" in sys.argv[1:], nvml="--nvml" in sys.argv[1:]).run()
