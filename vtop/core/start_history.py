"""A start against its own history (issue 40): how long each phase of this model's earlier starts took.

Pure logic, no I/O (the file is :mod:`vtop.sources.start_history`'s). A start that reached ready gives
a :class:`PastStart` (each finished phase's duration, the compile cache's hit or miss, when it began);
the starts are kept per :class:`StartKey` (the model, the vLLM version and the flags that change how
long a start takes: tensor and pipeline parallel sizes, eager mode, max_model_len), the last
:data:`MAX_PER_KEY` of each, :data:`MAX_KEYS` keys at most (the least recently started go first): a few
KB. :meth:`StartHistory.usual` says what this start's phases usually take here: the median of the last
:data:`USUAL_OF` starts, and the longest of them (what a stall threshold is set from:
:func:`history_stall_s`).

A start in progress is matched before all its facts are known (the parallel sizes come with the
engine's config line, after the banner): the facts it has must agree, the ones it lacks match anything,
and the most recently started key wins.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vtop.core.phases.phase import Phase

if TYPE_CHECKING:
    from vtop.core.phases.types import StartupSnapshot

__all__ = [
    "FORMAT",
    "MAX_KEYS",
    "MAX_PER_KEY",
    "USUAL_OF",
    "PastStart",
    "PhaseUsual",
    "StartHistory",
    "StartKey",
    "StartUsual",
    "history_from",
    "history_stall_s",
    "key_of",
    "past_of",
]

#: the file's format number (a file of another format is ignored, with a line saying so)
FORMAT = 1
#: starts kept per key, and keys kept: 32 x 8 starts of ~10 phases is under 40 KB of JSON
MAX_PER_KEY = 8
MAX_KEYS = 32
#: the last this many starts make "usually"
USUAL_OF = 5
#: phases whose duration says nothing of a hang: loading weights waits on the disk or a download
#: (a first start downloads, the next reads the page cache), ready is no phase of its own
_NOT_JUDGED = frozenset({Phase.WEIGHTS, Phase.READY})


@dataclass(frozen=True)
class StartKey:
    """What makes two starts comparable. ``None``: not known (yet)."""

    model: str
    version: str | None = None
    tp: int | None = None
    pp: int | None = None
    eager: bool | None = None
    max_model_len: int | None = None

    def text(self) -> str:
        """One string for the file (and for people)."""
        bits = [self.model, f"v{self.version or '?'}", f"tp={self.tp or '?'}", f"pp={self.pp or '?'}",
                f"eager={'?' if self.eager is None else self.eager}", f"max_model_len={self.max_model_len or '?'}"]
        return " ".join(bits)

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "version": self.version, "tp": self.tp, "pp": self.pp, "eager": self.eager,
                "max_model_len": self.max_model_len}

    @classmethod
    def from_json(cls, d: Any) -> StartKey:
        if not isinstance(d, dict) or not isinstance(d.get("model"), str):
            raise ValueError("a key without a model")
        return cls(d["model"], _opt(d, "version", str), _opt(d, "tp", int), _opt(d, "pp", int),
                   _opt(d, "eager", bool), _opt(d, "max_model_len", int))

    def covers(self, query: StartKey) -> bool:
        """This (complete) key agrees with every fact ``query`` knows."""
        if self.model != query.model:
            return False
        pairs = ((self.version, query.version), (self.tp, query.tp), (self.pp, query.pp),
                 (self.eager, query.eager), (self.max_model_len, query.max_model_len))
        return all(q is None or k == q for k, q in pairs)


def _opt(d: Mapping[str, Any], name: str, kind: type) -> Any:
    v = d.get(name)
    if v is None:
        return None
    if kind is int and isinstance(v, bool) or not isinstance(v, kind):
        raise ValueError(f"{name} is not {kind.__name__}")
    return v


@dataclass(frozen=True)
class PastStart:
    """One start that reached ready: when it began (epoch seconds on the log's clock: what tells the
    same start read twice apart) and each finished phase's duration."""

    started: float
    phases: Mapping[Phase, float]
    compile_cached: bool | None = None

    def to_json(self) -> dict[str, Any]:
        return {"started": round(self.started, 3), "phases": {p.value: round(s, 2) for p, s in self.phases.items()},
                "compile_cached": self.compile_cached}

    @classmethod
    def from_json(cls, d: Any) -> PastStart:
        if not isinstance(d, dict) or not isinstance(d.get("started"), (int, float)):
            raise ValueError("a start without its time")
        raw = d.get("phases")
        if not isinstance(raw, dict):
            raise ValueError("a start without phases")
        phases: dict[Phase, float] = {}
        for name, s in raw.items():
            try:
                p = Phase(name)
            except ValueError:
                continue  # a phase of a later vtop: skipped, not an error
            if not isinstance(s, (int, float)) or isinstance(s, bool) or s < 0:
                raise ValueError(f"phase {name}: {s!r} is no duration")
            phases[p] = float(s)
        cached = d.get("compile_cached")
        return cls(float(d["started"]), phases, cached if isinstance(cached, bool) else None)


@dataclass(frozen=True)
class PhaseUsual:
    """What one phase usually takes here: the median and the longest of the last starts."""

    phase: Phase
    usual_s: float
    longest_s: float
    n: int

    def words(self) -> str:
        """'usually 19 s here (3 starts)': the one wording of every face."""
        return f"usually {_dur(self.usual_s)} here ({self.n} start{'' if self.n == 1 else 's'})"

    def to_json(self) -> dict[str, Any]:
        return {"usual_s": round(self.usual_s, 2), "longest_s": round(self.longest_s, 2), "starts": self.n}


@dataclass(frozen=True)
class StartUsual:
    """This start's history: the key it matched, how many starts, each phase's usual time, and how often
    the compile cache hit."""

    key: StartKey
    starts: int
    phases: Mapping[Phase, PhaseUsual]
    compile_hits: int = 0
    compile_misses: int = 0

    def of(self, phase: Phase | None) -> PhaseUsual | None:
        return self.phases.get(phase) if phase is not None else None

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key.to_json(), "starts": self.starts,
                "phases": {p.value: u.to_json() for p, u in self.phases.items()},
                "compile_cache_hits": self.compile_hits, "compile_cache_misses": self.compile_misses}


@dataclass
class StartHistory:
    """Starts per key, oldest first; ``version`` counts the changes (a cache key for the monitor)."""

    entries: dict[StartKey, list[PastStart]] = field(default_factory=dict)
    version: int = 0

    def add(self, key: StartKey, past: PastStart) -> bool:
        """Keep ``past`` under ``key``; False when that start is kept already (the same log read again)."""
        runs = self.entries.setdefault(key, [])
        if any(abs(r.started - past.started) < 1.0 for r in runs):
            return False
        runs.append(past)
        runs.sort(key=lambda r: r.started)
        del runs[:-MAX_PER_KEY]
        if len(self.entries) > MAX_KEYS:
            by_age = sorted(self.entries, key=lambda k: self.entries[k][-1].started if self.entries[k] else 0.0)
            for k in by_age[: len(self.entries) - MAX_KEYS]:
                del self.entries[k]
        self.version += 1
        return True

    def match(self, query: StartKey) -> StartKey | None:
        """The key this start is one of: every fact it knows agrees; the most recently started wins."""
        if query in self.entries:
            return query
        found = [k for k in self.entries if self.entries[k] and k.covers(query)]
        return max(found, key=lambda k: self.entries[k][-1].started) if found else None

    def usual(self, query: StartKey | None, *, this_start: float | None = None) -> StartUsual | None:
        """What this start's phases usually take here, from the starts before it (None: no start of it
        kept). ``this_start``: when this start began; once ready it is kept too, and is no history of itself."""
        key = self.match(query) if query is not None else None
        if key is None:
            return None
        runs = [r for r in self.entries[key] if this_start is None or abs(r.started - this_start) >= 1.0][-USUAL_OF:]
        if not runs:
            return None
        phases: dict[Phase, PhaseUsual] = {}
        for p in Phase:
            ds = [r.phases[p] for r in runs if p in r.phases]
            if ds:
                phases[p] = PhaseUsual(p, _median(ds), max(ds), len(ds))
        hits = sum(1 for r in runs if r.compile_cached is True)
        misses = sum(1 for r in runs if r.compile_cached is False)
        return StartUsual(key, len(runs), phases, hits, misses)

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT,
                "starts": [{"key": k.to_json(), "runs": [r.to_json() for r in runs]}
                           for k, runs in self.entries.items()]}

    @classmethod
    def from_json(cls, d: Any) -> StartHistory:
        """The history a file holds; ValueError with what is wrong (the caller says it and starts empty)."""
        if not isinstance(d, dict):
            raise ValueError("not a JSON object")
        if d.get("format") != FORMAT:
            raise ValueError(f"format {d.get('format')!r}, this vtop reads format {FORMAT}")
        rows = d.get("starts")
        if not isinstance(rows, list):
            raise ValueError("no list of starts")
        h = cls()
        for row in rows[-MAX_KEYS:]:
            if not isinstance(row, dict) or not isinstance(row.get("runs"), list):
                raise ValueError("a row without runs")
            key = StartKey.from_json(row.get("key"))
            h.entries[key] = sorted((PastStart.from_json(r) for r in row["runs"]),
                                    key=lambda r: r.started)[-MAX_PER_KEY:]
        return h


def history_from(data: Any, where: str) -> tuple[StartHistory, str | None]:
    """The history a file's JSON holds (None: no file yet), or an empty one and the line that says why the
    file is ignored (``where``: its path)."""
    if data is None:
        return StartHistory(), None
    try:
        return StartHistory.from_json(data), None
    except ValueError as e:
        return StartHistory(), f"start history {where}: unreadable ({str(e)[:120]}); ignored, the next write replaces it"


def key_of(snap: StartupSnapshot) -> StartKey | None:
    """The key of a start from what its log said (None: the model is not known yet)."""
    f = snap.facts
    if not f.model:
        return None
    return StartKey(f.model, f.version, f.tensor_parallel_size, f.pipeline_parallel_size, f.enforce_eager,
                    f.max_model_len)


def past_of(snap: StartupSnapshot) -> tuple[StartKey, PastStart] | None:
    """A start worth keeping: ready, seen from its banner (a log read from the middle of a start gives its
    first phase too short), its version and model known; else None."""
    if snap.state != "ready" or snap.started is None or not snap.facts.version:
        return None
    key = key_of(snap)
    if key is None:
        return None
    phases: dict[Phase, float] = {
        v.phase: v.duration_s for v in snap.phases if v.duration_s is not None and v.phase is not Phase.READY}
    if not phases:
        return None
    return key, PastStart(snap.started, phases, snap.facts.compile_cached)


def history_stall_s(u: PhaseUsual | None, x: float, floor_s: float) -> float | None:
    """The silence after which a phase with history is suspect: ``x`` times the longest it took in the
    last starts, ``floor_s`` at least; None for a phase without history or one not judged by its time."""
    if u is None or u.phase in _NOT_JUDGED:
        return None
    return max(floor_s, x * u.longest_s)


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def _dur(s: float) -> str:
    if s < 10:
        return f"{s:.1f} s"
    if s < 60:
        return f"{s:.0f} s"
    m, sec = divmod(int(round(s)), 60)
    return f"{m} min {sec:02d} s" if m < 60 else f"{m // 60} h {m % 60:02d} min"
