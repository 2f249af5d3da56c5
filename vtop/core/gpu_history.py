"""Per-GPU histories of the charted fields, fed with :class:`GpuPoll` results."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from vtop.core.history import Series, capacity_for
from vtop.model.gpu import GpuPoll, GpuSample, XidEvent

FIELDS = ("util", "sm", "mem", "bw", "power")
#: XID events kept (the newest): the rules look back a minute or two
XIDS_KEPT = 64


def chart_values(g: GpuSample) -> dict[str, float | None]:
    """What each sparkline shows. ``bw`` is GPM DRAM bandwidth where the GPU has GPM,
    else NVML's memory-controller busy share (the same idea, coarser)."""
    if g.lost:
        return {k: None for k in FIELDS}
    return {
        "util": g.util_gpu,
        "sm": g.sm_active,
        "mem": g.mem_pct,
        "bw": g.dram_bw if g.dram_bw is not None else g.util_mem,
        "power": g.power_pct,
    }


@dataclass
class GpuTrack:
    index: int
    series: dict[str, Series]
    last: GpuSample | None = None
    gpm_seen: bool = False
    peak_mem_pct: float | None = None


@dataclass
class GpuHistory:
    window_s: float
    tracks: dict[int, GpuTrack] = field(default_factory=dict)
    last_poll: GpuPoll | None = None
    #: the XID events of the last polls, oldest first (each poll's, as it drained them)
    xids: deque[XidEvent] = field(default_factory=lambda: deque(maxlen=XIDS_KEPT))
    #: the poll interval: each chart's ring is sized for its window at this rate when the
    #: GPU is first seen (vtop/core/history.py), so its memory does not grow after that
    interval_s: float = 1.0

    def _capacity(self) -> int:
        return capacity_for(self.window_s * 2, self.interval_s)

    def add(self, poll: GpuPoll) -> None:
        self.last_poll = poll
        if poll.xids:
            self.xids.extend(poll.xids)
        for g in poll.gpus:
            tr = self.tracks.get(g.index)
            if tr is None:
                # Keep points for twice the window: resizing wider must not empty the charts.
                cap = self._capacity()
                tr = GpuTrack(g.index, {k: Series(self.window_s * 2, capacity=cap) for k in FIELDS})
                self.tracks[g.index] = tr
            tr.last = g
            for k, v in chart_values(g).items():
                tr.series[k].append(poll.mono, v)
            if g.sm_active is not None:
                tr.gpm_seen = True
            mp = g.mem_pct
            if mp is not None and (tr.peak_mem_pct is None or mp > tr.peak_mem_pct):
                tr.peak_mem_pct = mp

    def set_window(self, window_s: float) -> None:
        self.window_s = window_s
        cap = self._capacity()
        for tr in self.tracks.values():
            for s in tr.series.values():
                s.window_s = window_s * 2
                s.reserve(cap)
