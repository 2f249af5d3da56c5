"""A model's download from the Hugging Face Hub while vLLM starts: bytes, rate, ETA, a stall.

The first start of a model fetches its weights with no line in vLLM's log (vllm#21191,
llm-d#484, vllm#17676: a "hang" that was a 10-40 minute download). vtop watches the Hub's
cache of the server process (:mod:`vtop.sources.hfcache` reads it: one stat per file) and
this module turns its scans into one answer:

* ``done``: the bytes of the repo's weight files already in the cache (the complete ones,
  through the snapshot's links) plus the ``blobs/*.incomplete`` files growing;
* ``total``: the shards' size from the repo's ``model.safetensors.index.json`` (its
  ``metadata.total_size``, the tensors' bytes; each shard adds a small header, so ``done``
  may pass it by a few KB: the total shown is never below ``done``), else unknown;
* the rate over the last :data:`RATE_WINDOW_S` seconds of vtop's own clock (when the scans
  arrived, whatever the files' times say), and the ETA from it;
* ``quiet_s``: how long an ``.incomplete`` file has been there without a byte more (the
  download-stall rule, :mod:`vtop.core.rules.download`, judges it).

Pure logic: scans in, a :class:`DownloadProgress` out; the clock is the scans' ``mono``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from vtop.model.download import CacheScan

__all__ = ["RATE_WINDOW_S", "CacheScan", "DownloadProgress", "DownloadTracker"]

#: the rate is the bytes gained over this many seconds (or over what was seen, when less)
RATE_WINDOW_S = 10.0


@dataclass(frozen=True)
class DownloadProgress:
    """What vtop says of a download now (one answer for the panel, ``--once --json`` and the rule)."""

    repo: str
    cache_dir: str
    cache_from: str
    done: int
    total: int | None
    #: bytes per second over ``rate_window_s`` (None: one scan only)
    rate_bps: float | None
    rate_window_s: float | None
    eta_s: float | None
    #: files in flight (``*.incomplete``)
    active: int
    #: seconds with files in flight and no byte gained (0 while bytes come)
    quiet_s: float
    #: the download looks finished (nothing in flight, and the index's bytes are all there or no index)
    finished: bool
    cut: bool

    def text(self) -> str:
        """``downloading 7.1 of 16.1 GB, 48 MB/s, about 3 min left`` (decimal units, as the Hub's)."""
        verb = "downloaded" if self.finished else "downloading"
        if self.total is not None:
            head = f"{verb} {_gb(self.done, self.total)} of {_size(self.total)}"
        else:
            head = f"{verb} {_size(self.done)} (total unknown: no index in the cache)"
        if self.finished:
            return f"{head} of {self.repo}"
        bits = [head]
        if self.rate_bps is not None:
            bits.append(f"{_size(self.rate_bps)}/s over {self.rate_window_s:.0f} s")
        if self.eta_s is not None:
            bits.append(f"about {_eta(self.eta_s)} left")
        if self.quiet_s >= 5:
            bits.append(f"no byte for {self.quiet_s:.0f} s")
        return ", ".join(bits)

    def to_json(self) -> dict[str, Any]:
        return {
            "repo": self.repo, "cache_dir": self.cache_dir, "cache_from": self.cache_from,
            "done_bytes": self.done, "total_bytes": self.total,
            "rate_bytes_per_s": None if self.rate_bps is None else round(self.rate_bps, 1),
            "rate_window_s": None if self.rate_window_s is None else round(self.rate_window_s, 1),
            "eta_s": None if self.eta_s is None else round(self.eta_s, 1),
            "files_in_flight": self.active, "quiet_s": round(self.quiet_s, 1),
            "finished": self.finished, "partial_scan": self.cut, "text": self.text(),
        }


def _size(n: float) -> str:
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= div:
            v = n / div
            return f"{v:.1f} {unit}" if v < 100 else f"{v:.0f} {unit}"
    return f"{n:.0f} B"


def _gb(done: int, total: int) -> str:
    """``done`` in the unit of ``total``, without its unit ("7.1" of "16.1 GB")."""
    for div in (1e9, 1e6, 1e3):
        if total >= div:
            v = done / div
            return f"{v:.1f}" if v < 100 else f"{v:.0f}"
    return str(done)


def _eta(s: float) -> str:
    if s < 60:
        return f"{max(1, round(s))} s"
    if s < 3600:
        return f"{round(s / 60)} min"
    return f"{s / 3600:.1f} h"


class DownloadTracker:
    """The scans of one repo over time (a new repo, or a new start, begins afresh)."""

    def __init__(self, window_s: float = RATE_WINDOW_S) -> None:
        self.window_s = window_s
        self.repo: str | None = None
        self._samples: deque[tuple[float, int]] = deque()
        self._last: CacheScan | None = None
        #: vtop's time of the last scan that saw a byte more (or the first scan with files in flight)
        self._grew_at: float | None = None
        self._prev_incomplete: dict[str, int] = {}

    @property
    def last_scan(self) -> CacheScan | None:
        return self._last

    def reset(self) -> None:
        self.__init__(self.window_s)  # type: ignore[misc]

    def add(self, scan: CacheScan) -> None:
        if scan.repo != self.repo:
            self.reset()
            self.repo = scan.repo
        if scan.error is not None and not scan.repo_seen:
            self._last = scan
            return
        done = scan.done
        prev = self._samples[-1][1] if self._samples else None
        grew = prev is None or done > prev or any(
            scan.incomplete.get(k, 0) > v for k, v in self._prev_incomplete.items())
        new_file = any(k not in self._prev_incomplete for k in scan.incomplete)
        if grew or new_file or not scan.incomplete:
            self._grew_at = scan.mono
        self._prev_incomplete = dict(scan.incomplete)
        self._samples.append((scan.mono, done))
        while len(self._samples) > 2 and self._samples[1][0] <= scan.mono - self.window_s:
            self._samples.popleft()
        self._last = scan

    def progress(self, now: float | None = None) -> DownloadProgress | None:
        """None until a scan saw the repo in the cache."""
        s = self._last
        if s is None or not s.repo_seen or not self._samples:
            return None
        now = s.mono if now is None else max(now, s.mono)
        t1, b1 = self._samples[-1]
        rate = span = None
        old = [x for x in self._samples if x[0] >= t1 - self.window_s - 1e-9]
        if len(old) >= 2 and t1 > old[0][0]:
            span = t1 - old[0][0]
            rate = max(0.0, (b1 - old[0][1]) / span)
        total = None if s.index_total is None else max(s.index_total, b1)
        finished = not s.incomplete and b1 > 0 and (s.index_files is None or s.complete_files >= s.index_files)
        eta = None
        if total is not None and rate and not finished:
            eta = max(0.0, total - b1) / rate
        quiet = now - self._grew_at if s.incomplete and self._grew_at is not None else 0.0
        return DownloadProgress(s.repo, s.cache_dir, s.cache_from, b1, total, rate, span, eta,
                                len(s.incomplete), quiet, finished, s.cut)
