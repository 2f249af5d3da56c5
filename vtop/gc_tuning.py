"""Garbage-collector settings for a long-running monitor.

Textual makes reference cycles out of every line it draws anew: a ``Strip``
keeps the list of pieces ``divide()`` cut it into, and when no cut falls
inside it that list holds the strip itself. Those lines live about one
repaint (Textual caches them), so they outlive the young generations and only
a full collection frees them; a full collection walks every object the
process has (about 76,000 once vtop is up, mostly Textual's and the imported
modules'). Measured on the 2-core dev VM with 8 simulated GPUs and 2 servers
(``bench/run.py``'s scenario (c)): one full collection about every 30 s
taking ~90 ms; all told, the collector took 4 of the ~20 ms of CPU vtop spent
a second.

:func:`settle_gc` runs once start-up is over (modules imported, widgets
built, the first results shown): it collects what start-up left, then
``gc.freeze()`` moves every surviving object out of the collector's sight,
so later collections walk only what was made since (~7,000 objects). The
young generation's threshold goes from 700 to 5,000 allocations: a line
drawn at one repaint is garbage by the next collection instead of being
promoted, so the cycles die young and the full collections stay rare and
small. Measured the same way: the collector's share went from 4.2 to 0.5 ms
a second.

What it costs: a cycle made of start-up objects that becomes garbage later
is never freed (start-up builds the screen once and its objects live as long
as the app; the first frames' cached lines are such cycles, a few hundred kB
once: peak RSS on the GPU box stayed at 52 MB); up to 5,000 objects wait for the next collection instead
of 700 (about a second of vtop's allocations, a few hundred kB at most).

Before that, :func:`hold_until_settled` keeps the collector off from the
moment the dashboard is about to import Textual: importing it and vtop, then
building the first frames, makes ~65,000 objects, and collecting them as they
come (young generation every 700 allocations, with full collections among
them) freed ~30,000 import-time cycles at the price of 15-20 ms of the first
frame on the dev VM (imports of Textual and vtop: median ~272 ms with the
collector on, ~255 off; first frame in tmux, 10 alternating starts with 8
simulated GPUs: median 0.539 -> 0.513 s, peak RSS +0.9 MB). :func:`settle_gc`'s
collection then frees those cycles in one pass, a few seconds later.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 5000

_held = False


def hold_until_settled() -> None:
    """Turn the collector off until :func:`settle_gc` (only if it is on: a choice
    made before us stands)."""
    global _held
    if gc.isenabled():
        gc.disable()
        _held = True


def settle_gc() -> None:
    """Collect once, freeze the survivors, and let the young generation grow larger."""
    global _held
    gc.collect()
    gc.freeze()
    if _held:
        gc.enable()
        _held = False
    gen0, gen1, gen2 = gc.get_threshold()
    if gen0:  # 0: collection is off (someone chose that); leave it so
        gc.set_threshold(max(gen0, YOUNG_THRESHOLD), gen1, gen2)


def one_shot(window_s: float | None) -> None:
    """``vtop --once`` / ``doctor``: a process that reads, reports and exits.

    One round (no window: a second or so, bounded) runs with the collector off, as the
    dashboard's start-up does: the imports alone make tens of thousands of objects, and
    collecting them as they come is work for a process about to exit. A windowed one keeps
    it on (``--window`` may be minutes). Either way :func:`before_exit` comes at the end."""
    if window_s is None and gc.isenabled():
        gc.disable()


def before_exit() -> None:
    """The report is out and the process exits next: freeze what it holds, so that the
    interpreter's shutdown does not walk it all (its final collections took ~40 ms of CPU of
    a ~0.24 s one-shot on the dev VM, 8 runs each: 0.235-0.245 s -> 0.190-0.200 s)."""
    gc.freeze()
