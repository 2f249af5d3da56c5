"""What the diagnoser remembers between ticks: per server, the /metrics samples and the streaks
read from them (busy since, last finish, last progress, KV high since); per GPU, the polled points
and the sm_idle / oom_risk streaks. The rules read these; only the :class:`~vtop.core.rules.Diagnoser`
feeds them."""

from __future__ import annotations

import math
from array import array
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from vtop.core.requests.metrics_bound import MaxTokensLedger, OldestInFlight
from vtop.core.requests.occupancy import OccupancyBound
from vtop.core.server import sleep_level
from vtop.model.gpu import GpuProcess
from vtop.model.metrics import Histogram, VllmMetrics
from vtop.model.procs import ServerProcess

__all__ = ["KEEP_STEP_S", "CpuSample", "GpuPoint", "GpuState", "Sample", "SeenStart", "ServerState", "keep_recent", "sample_of"]


class SeenStart:
    """A start followed by its process (no log needed): the process, when vtop first and last saw it
    starting (monotonic), how long it had run by then (from its create_time), when it was found gone."""

    __slots__ = ("gone", "last_seen", "proc", "ran_s", "seen")

    def __init__(self, proc: ServerProcess, seen: float) -> None:
        self.proc = proc
        self.seen = seen
        self.last_seen = seen
        self.ran_s: float | None = None
        self.gone: float | None = None


@dataclass(slots=True)
class Sample:
    t: float
    running: float | None
    waiting: float | None
    kv: float | None  # percent
    gen: float | None
    prompt: float | None
    preempt: float | None
    done: float | None
    length: float | None
    max_tokens: Histogram | None
    prompt_hist: Histogram | None
    #: when the two histograms were read (earlier than ``t`` when carried over)
    hist_t: float
    e2e: Histogram | None = None
    #: the generated tokens of the requests that finished (``request_generation_tokens``), read with ``e2e``
    gen_hist: Histogram | None = None
    #: the engine was put to sleep (``engine_sleep_state``): quiet on purpose, so its quiet time is
    #: no stall time (the stall clock starts again at ``/wake_up``)
    sleeping: bool = False
    #: seconds the generation counter stood still between the samples kept up to this one, from the
    #: first (set by :meth:`ServerState.add`): any stretch's still time is a difference of two
    flat_cum: float = 0.0


def sample_of(t: float, m: VllmMetrics) -> Sample:
    succ = m.request_success_total
    kv = m.kv_cache_usage
    return Sample(
        t=t,
        running=m.running,
        waiting=m.waiting,
        kv=None if kv is None or not math.isfinite(kv) else 100.0 * kv,
        gen=m.generation_tokens_total,
        prompt=m.prompt_tokens_total,
        preempt=m.preemptions_total,
        done=float(sum(succ.values())) if succ else None,
        length=succ.get("length") if succ else None,
        max_tokens=m.request_params_max_tokens,
        prompt_hist=m.request_prompt_tokens,
        hist_t=t - (m.histograms_age_s or 0.0),
        e2e=m.e2e_request_latency_seconds,
        gen_hist=m.request_generation_tokens,
        sleeping=bool(sleep_level(m)),
    )


#: The history keeps about one item a second, however fast the polls come: the newest item
#: replaces the one before it while that one is less than this after its predecessor.
KEEP_STEP_S = 0.9


def keep_recent(times: list[float], items: list[Any], t: float, item: Any, keep_s: float,
                step_s: float = KEEP_STEP_S) -> None:
    """Append ``item`` at ``t``; drop what is older than ``keep_s``, in batches (cheap per call).

    The newest item is always last; the ones before it are at least ``step_s`` apart: while
    the newest is less than ``step_s`` after the one before it, a new item takes its place.
    Polls a second apart (``--interval`` 1, the default, with up to 0.1 s of jitter) are all
    kept, as before; faster polls keep about one a second. At ``--interval 0.25`` the 15
    minutes held 3600 items a server and a GPU, about 15 MB with 8 GPUs and 4 servers that
    filled for 15 minutes (the soak's growing memory, issue #25 item 5)."""
    if len(times) >= 2 and times[-1] - times[-2] < step_s:
        times[-1] = t
        items[-1] = item
        return
    times.append(t)
    items.append(item)
    cut = bisect_right(times, t - keep_s)
    if cut > 16 and cut > len(times) // 16:  # what is past keep_s stays at most ~1/16 of the lists
        del times[:cut]
        del items[:cut]


def went_back(old: float | None, new: float | None) -> bool:
    return old is not None and new is not None and new < old


@dataclass(frozen=True, slots=True)
class CpuSample:
    """The CPU seconds of a server's processes at one process scan."""

    t: float
    #: pid -> user + system CPU seconds
    cpu: dict[int, float]
    #: the processes that do a start's work: the workers, else the engine cores, else the server
    working: tuple[int, ...]
    #: pid -> its title ("VLLM::Worker") or role, for evidence lines
    names: dict[int, str]
    #: pid -> the state letter of /proc/PID/stat (T: stopped by a signal), where read
    states: dict[int, str] = field(default_factory=dict)


class ServerState:
    """What the diagnoser remembers about one server between ticks."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.samples: list[Sample] = []
        self.first_t: float | None = None
        self.last_finish_t: float | None = None
        self.last_progress_t: float | None = None
        #: first sample of the current stretch with running > 0
        self.busy_since: float | None = None
        #: the stretch was seen starting from running == 0 (else vtop came in while busy)
        self.busy_known = False
        #: the last sample with running == 0 before the stretch
        self.idle_before: float | None = None
        self.busy_n0 = 0.0
        self.busy_done0 = 0.0
        self.busy_drops = 0.0
        self.kv_high_since: float | None = None
        #: first sample of the current stretch with running == 0 and requests waiting
        self.queue_since: float | None = None
        self.first_up_t: float | None = None
        self.gpu_idx: set[int] = set()
        self.gpu_pids: set[int] = set()
        #: the server's process as last seen: what a rule says of a server that died with its fault (the real
        #: H100 OOM of prompt logprobs reached vtop's log reader in the same second as the process's exit)
        self.last_proc: ServerProcess | None = None
        #: how old the oldest in-flight request is at least (vtop/core/requests/metrics_bound.py)
        self.oldest = OldestInFlight()
        #: ... and from the time requests spent running against what the finished ones took (a closed loop)
        self.occupancy = OccupancyBound()
        #: the finishes by their max_tokens bucket (what proves a logged request still runs)
        self.max_tokens_ledger = MaxTokensLedger()
        #: CPU seconds of the server's processes, one sample per process scan seen
        self.cpu_times: list[float] = []
        self.cpu_samples: list[CpuSample] = []
        self.cpu_seen: object = None
        #: a start seen in the process table (a vLLM process while the port refused), until the server answers
        self.start: SeenStart | None = None
        #: the last such start whose processes were gone before the port ever answered: what a start that
        #: failed looks like with no log (kept through the next starts until one answers: a crash loop)
        self.failed_start: SeenStart | None = None
        #: the engine found dead by /health: (when first seen, the status it answered), until the server answers
        #: again (a new start); what an engine death is with no log
        self.engine_dead: tuple[float, int | None] | None = None

    def note_start(self, now: float, wall: float | None, state: str, process: Any, last_ok: float | None,
                   last_ok_wall: float | None = None, health: int | None = None) -> None:
        """Follow a start by its process, once a tick: seen starting (a process, the port refusing), then
        answering (it started), or gone with the port never answered since it was seen (it failed). A
        process made before the port's last answer is the one that answered (shutting down, or its port
        closed): no start. And the engine found dead by /health (``health``: its status), until it answers."""
        if state in ("up", "restarted"):
            self.start = self.failed_start = self.engine_dead = None
        elif state == "engine dead":
            if self.engine_dead is None:
                self.engine_dead = (now, health)
        elif state == "starting" and isinstance(process, ServerProcess) and not (
                last_ok_wall is not None and process.create_time and process.create_time <= last_ok_wall):
            st = self.start
            if st is None or st.proc.key != process.key:
                st = self.start = SeenStart(process, now)
            st.last_seen = now
            if wall is not None and process.create_time:
                st.ran_s = max(0.0, wall - process.create_time)
        elif state == "down" and process is None and self.start is not None:
            # the process table was read and holds no process of this server
            st, self.start = self.start, None
            if last_ok is None or last_ok < st.seen:
                st.gone = now
                self.failed_start = st

    def note_cpu(self, t: float, proc: ServerProcess, keep_s: float) -> None:
        """Take the CPU seconds of a server's process scan, once per scan (the same object on the
        next tick is the same scan)."""
        if proc is self.cpu_seen:
            return
        self.cpu_seen = proc
        cpu = proc.cpu_by_pid()
        if not cpu:
            return  # no reading (an old recording, a process vtop may not read): no sample, never a zero
        kids = proc.children
        working = tuple(c.pid for c in kids if c.role == "worker") or tuple(c.pid for c in kids if c.role == "engine")
        roles = {int(c.pid): str(c.title or c.role) for c in kids}
        roles[int(proc.pid)] = "API server"
        keep_recent(self.cpu_times, self.cpu_samples, t,
                    CpuSample(t, cpu, working or (int(proc.pid),), roles, proc.state_by_pid()), keep_s)

    def cpu_at(self, t: float) -> CpuSample | None:
        """The newest CPU sample at or before ``t`` (None: none that old)."""
        i = bisect_right(self.cpu_times, t)
        return self.cpu_samples[i - 1] if i else None

    @property
    def last(self) -> Sample | None:
        return self.samples[-1] if self.samples else None

    def at(self, t: float) -> Sample | None:
        """The newest sample at or before ``t`` (else the oldest one)."""
        if not self.samples:
            return None
        i = bisect_right(self.times, t)
        return self.samples[max(0, i - 1)]

    def add(self, s: Sample, kv_thr: float, keep_s: float) -> None:
        p = self.last
        if p is not None and (went_back(p.gen, s.gen) or went_back(p.prompt, s.prompt) or went_back(p.done, s.done)):
            # A restart: nothing before it is comparable.
            gpu_idx, gpu_pids = self.gpu_idx, self.gpu_pids
            self.__init__()  # type: ignore[misc]
            self.gpu_idx, self.gpu_pids = gpu_idx, gpu_pids
            p = None
        if self.first_t is None:
            self.first_t = s.t
        self._note_moves(p, s)
        self._note_busy(p, s)
        self.oldest.add(s.t, s.running, s.e2e, s.hist_t, s.done, s.preempt, s.length)
        self.occupancy.add(s.t, s.running, s.e2e, s.hist_t, s.done, s.preempt, s.waiting, s.gen, s.gen_hist)
        if s.max_tokens is not None:
            self.max_tokens_ledger.add(s.hist_t, s.max_tokens)
        if s.kv is not None:
            if s.kv < kv_thr:
                self.kv_high_since = None
            elif self.kv_high_since is None:
                self.kv_high_since = s.t
        keep_recent(self.times, self.samples, s.t, s, keep_s)
        if len(self.samples) >= 2:  # its predecessor in the list (keep_recent may have replaced the last)
            q = self.samples[-2]
            still = q.gen is not None and s.gen is not None and s.gen <= q.gen
            s.flat_cum = q.flat_cum + (s.t - q.t if still else 0.0)

    def flat_s(self, since: float, now: float) -> float:
        """Seconds of ``[since, now]`` the generation counter stood still between two kept samples
        (a frozen engine: its requests grow old without decoding). Two bisections: a pass over the
        samples since ``since`` (up to 15 minutes of them) every tick grew the soak's CPU with the
        age of a stall."""
        times, samples = self.times, self.samples
        j = max(0, bisect_right(times, since) - 1)
        k = bisect_right(times, now) - 1
        if k <= j:
            return 0.0
        out = samples[k].flat_cum - samples[j].flat_cum
        first = samples[j + 1].flat_cum - samples[j].flat_cum
        if first > 0.0:  # the first stretch counts from ``since``, not from the sample before it
            out -= min(first, max(0.0, since - times[j]))
        return out

    def _note_moves(self, p: Sample | None, s: Sample) -> None:
        """When a request last finished, when the counters last moved."""
        if p is None:
            self.last_finish_t = self.last_finish_t or s.t
            self.last_progress_t = self.last_progress_t or s.t
            return
        finished = (s.done is not None and p.done is not None and s.done > p.done) or (
            s.running is not None and p.running is not None and s.running < p.running
        )
        if finished:
            self.last_finish_t = s.t
        moved = any(
            a is not None and b is not None and b > a
            for a, b in ((p.gen, s.gen), (p.prompt, s.prompt), (p.done, s.done))
        )
        if moved or s.sleeping:
            self.last_progress_t = s.t

    def _note_busy(self, p: Sample | None, s: Sample) -> None:
        """The current stretch with requests running: since when, from what, and how many left it."""
        if s.running is None:
            return
        if s.running <= 0:
            self.busy_since = None
            if not s.waiting:
                self.queue_since = None
            elif self.queue_since is None:
                self.queue_since = s.t
            return
        self.queue_since = None
        if self.busy_since is None:
            self.busy_since = s.t
            self.busy_known = p is not None and p.running == 0
            self.idle_before = p.t if self.busy_known and p is not None else None
            self.busy_n0 = s.running
            self.busy_done0 = s.done or 0.0
            self.busy_drops = 0.0
        elif p is not None and p.running is not None and s.running < p.running:
            self.busy_drops += p.running - s.running


@dataclass(slots=True)
class GpuPoint:
    t: float
    util: float | None
    sm: float | None
    mem_pct: float | None
    mem_used: float | None
    mem_total: float | None
    procs: tuple[GpuProcess, ...] | None
    #: 1.0 while a clock-event reason that slows the GPU (:data:`SLOWDOWN_REASONS`) is on, 0.0 while
    #: none is, None when NVML gives no reasons
    slow: float | None = None


_GPU_COLS = ("util", "sm", "mem_pct", "mem_used", "mem_total", "slow")


class GpuState:
    """Per GPU: the polled points (about one a second, :data:`KEEP_STEP_S`, for ``history_s``)
    and the streaks read from them.

    The points are kept as columns (``array('d')``, a ``None`` as NaN) and made into
    :class:`GpuPoint` objects when a rule reads them (``points``, :meth:`at`,
    :meth:`between`): 15 minutes of 8 GPUs as objects were 7200 of them with 6 floats and a
    process tuple each, about 3 MB that filled for 15 minutes (bench/soak.py, issue #25).
    A point whose processes equal the point before's shares that tuple."""

    def __init__(self) -> None:
        self.times: array[float] = array("d")
        self._cols: tuple[array[float], ...] = tuple(array("d") for _ in _GPU_COLS)
        self._procs: list[tuple[GpuProcess, ...] | None] = []
        self.idle_since: float | None = None
        self.idle_util: list[float] = []
        self.idle_sm: list[float] = []
        self.idle_last_t: float | None = None
        self.risk_since: float | None = None
        #: the last point at which a start was in progress on this GPU (None: none seen): a start's own
        #: climb (weights, profiling, the KV cache it takes whole) is no climb towards an OOM
        self.start_seen_t: float | None = None

    def _point(self, i: int) -> GpuPoint:
        util, sm, mem_pct, mem_used, mem_total, slow = (c[i] for c in self._cols)
        return GpuPoint(self.times[i], _opt(util), _opt(sm), _opt(mem_pct), _opt(mem_used), _opt(mem_total),
                        self._procs[i], _opt(slow))

    @property
    def points(self) -> _GpuPoints:
        """The points, oldest first (a read-only sequence)."""
        return _GpuPoints(self)

    def at(self, t: float) -> GpuPoint | None:
        if not self.times:
            return None
        i = bisect_right(self.times, t)
        return self._point(max(0, i - 1))

    def between(self, a: float, b: float) -> list[GpuPoint]:
        i = bisect_right(self.times, a)
        j = bisect_right(self.times, b)
        return [self._point(k) for k in range(i, j)]

    def add(self, p: GpuPoint, keep_s: float) -> None:
        """As :func:`keep_recent`: about one point a second, ``keep_s`` of them."""
        procs = p.procs
        if procs is not None and self._procs and procs == self._procs[-1]:
            procs = self._procs[-1]  # unchanged: one tuple for the run of points
        row = (p.util, p.sm, p.mem_pct, p.mem_used, p.mem_total, p.slow)
        times = self.times
        if len(times) >= 2 and times[-1] - times[-2] < KEEP_STEP_S:
            times[-1] = p.t
            for c, v in zip(self._cols, row):
                c[-1] = _nan(v)
            self._procs[-1] = procs
            return
        times.append(p.t)
        for c, v in zip(self._cols, row):
            c.append(_nan(v))
        self._procs.append(procs)
        cut = bisect_right(times, p.t - keep_s)
        if cut > 16 and cut > len(times) // 16:  # dropped in batches, as keep_recent does
            del times[:cut]
            for c in self._cols:
                del c[:cut]
            del self._procs[:cut]


def _nan(v: float | None) -> float:
    return math.nan if v is None else float(v)


def _opt(v: float) -> float | None:
    return None if v != v else v


class _GpuPoints(Sequence[GpuPoint]):
    """:attr:`GpuState.points`: each point made when it is read."""

    __slots__ = ("_gs",)

    def __init__(self, gs: GpuState) -> None:
        self._gs = gs

    def __len__(self) -> int:
        return len(self._gs.times)

    @overload
    def __getitem__(self, i: int) -> GpuPoint: ...
    @overload
    def __getitem__(self, i: slice) -> list[GpuPoint]: ...
    def __getitem__(self, i: int | slice) -> GpuPoint | list[GpuPoint]:
        n = len(self._gs.times)
        if isinstance(i, slice):
            return [self._gs._point(k) for k in range(*i.indices(n))]
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("GpuState point index out of range")
        return self._gs._point(i)
