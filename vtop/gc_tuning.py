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
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 5000


def settle_gc() -> None:
    """Collect once, freeze the survivors, and let the young generation grow larger."""
    gc.collect()
    gc.freeze()
    gen0, gen1, gen2 = gc.get_threshold()
    if gen0:  # 0: collection is off (someone chose that); leave it so
        gc.set_threshold(max(gen0, YOUNG_THRESHOLD), gen1, gen2)
