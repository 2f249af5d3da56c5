"""``gpu_neighbour`` and ``gpu_slowdown``: vLLM's tokens slow because of something beside it.

``gpu_neighbour``: a process that is not this server's runs kernels on one of its GPUs (NVML's
per-process samples, ``nvmlDeviceGetProcessUtilization``: its share of the SMs' time, at least
``neighbour_sm_pct`` on average for ``neighbour_s``) while the server's tokens per running request
fell by ``neighbour_drop_pct`` or more against the minute before that process started. GPU-Util
reads 100 % throughout (any kernel counts), so the card alone never says it: a training job, a
notebook or a benchmark on the serving GPU halves the decode rate and nothing else shows why.
Tokens *per running request* (generation tok/s over the mean ``running``) so that a drop of load is
not read as a slowdown.

``gpu_slowdown``: a clock-event reason that slows the GPU (a power cap, thermal or hardware slowdown,
a power brake: :data:`~vtop.model.gpu.SLOWDOWN_REASONS`) on for most of ``neighbour_s`` while the
tokens per running request fell as much against the minute before, when it was off.

Both need a rate before to compare with: a neighbour that was there before vtop started is named
only by the P table (share of the SMs per process), not by an alert. Corpus traces: none yet (the
proof needs the H200: vLLM under steady load while another process runs matmuls on the same GPU);
tests/unit/test_neighbour.py feeds synthetic polls and samples.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass

from vtop.core.rules.alert import Alert, Thresholds
from vtop.core.rules.context import Evidence, Memory
from vtop.core.rules.state import GpuState, ServerState
from vtop.core.rules.util import dur, short_url
from vtop.core.stats import fmean


@dataclass(frozen=True)
class Rate:
    """Tokens per running request over a window: generation tok/s over the mean ``running``."""

    per_req: float
    tok_s: float
    running: float
    #: the seconds it was measured over (the samples' span): every face says it with the rate
    span_s: float = 0.0


def per_request_rate(st: ServerState, a: float, b: float) -> Rate | None:
    """The server's decode rate per running request over ``[a, b]`` (None: too few samples, no
    request running all along, a counter missing)."""
    i, j = bisect_left(st.times, a), bisect_right(st.times, b)
    smp = st.samples[i:j]
    if len(smp) < 3 or smp[-1].t - smp[0].t < (b - a) / 2:
        return None
    g0, g1 = smp[0].gen, smp[-1].gen
    runs = [s.running for s in smp]
    if g0 is None or g1 is None or g1 < g0 or any(r is None or r <= 0 for r in runs):
        return None
    tok_s = (g1 - g0) / (smp[-1].t - smp[0].t)
    running = fmean([float(r) for r in runs if r is not None])
    return Rate(tok_s / running, tok_s, running, smp[-1].t - smp[0].t)


@dataclass(frozen=True)
class NeighbourFinding:
    rule: str
    gpu: int
    url: str
    since: float
    now: float
    before: Rate
    during: Rate
    #: gpu_neighbour: (pid, mean SM share %) of the other processes, biggest first
    others: tuple[tuple[int, float], ...] = ()
    #: gpu_slowdown: the reasons on now
    reasons: tuple[str, ...] = ()

    @property
    def drop_pct(self) -> float:
        return 100.0 * (1.0 - self.during.per_req / self.before.per_req)


def _streak_start(gs: GpuState, now: float, on: object) -> float | None:
    """The time of the first point of the run of points, up to now, for which ``on(point)`` holds
    (None: the last point does not)."""
    pts = gs.points
    since = None
    for k in range(len(pts) - 1, -1, -1):
        p = pts[k]
        if p.t > now:
            continue
        if not on(p):  # type: ignore[operator]
            break
        since = p.t
    return since


def neighbour_findings(ev: Evidence, mem: Memory, idx: int) -> list[NeighbourFinding]:
    th = mem.th
    gs = mem.gpus.get(idx)
    if gs is None or not gs.points or mem.starting_on(ev, idx):
        return []
    out = []
    for url in ev.gpu_owner.get(idx, []):
        st = mem.servers.get(url)
        if st is None:
            continue
        mine = set(st.gpu_pids) | {pid for pid, (u, _r) in ev.pid_owner.items() if u == url}
        since = _streak_start(gs, ev.now, lambda p, mine=mine: bool(_others(p, mine, th)))
        # a slowdown reason while another process runs kernels here is that process's doing (the real H100
        # matmul neighbour pushed the card to its power cap: one incident, the neighbour's alert)
        f = _neighbour(ev, th, gs, st, idx, url, mine, since) if since is not None else _slowdown(ev, th, gs, st, idx, url)
        if f is not None:
            out.append(f)
    return out


def _others(p: object, mine: set[int], th: Thresholds) -> list[tuple[int, float]]:
    procs = getattr(p, "procs", None) or ()
    return [(int(q.pid), q.sm_util) for q in procs
            if int(q.pid) not in mine and q.sm_util is not None and q.sm_util >= th.neighbour_sm_pct]


def _compare(st: ServerState, th: Thresholds, since: float, now: float) -> tuple[Rate, Rate] | None:
    """The rate per request in the minute before ``since`` and over the streak, when it fell enough."""
    if now - since < th.neighbour_s:
        return None
    # the minute before, or the part of it the server was busy (a neighbour that came 40 s after the load
    # began, as on the real H100 recording, has 40 s to compare with), at least ``neighbour_s``
    a = since - th.neighbour_baseline_s
    if st.busy_since is not None and st.busy_since > a:
        a = st.busy_since
    if since - a < th.neighbour_s:
        return None
    before = per_request_rate(st, a, since - 1e-6)  # up to the streak, not its first
    during = per_request_rate(st, max(since, now - 2 * th.neighbour_s), now)
    if before is None or during is None or before.per_req <= 0:
        return None
    if during.per_req > before.per_req * (1.0 - th.neighbour_drop_pct / 100.0):
        return None
    return before, during


def _neighbour(ev: Evidence, th: Thresholds, gs: GpuState, st: ServerState, idx: int, url: str,
               mine: set[int], since: float) -> NeighbourFinding | None:
    """Another process on the GPU since ``since`` (its streak) while the server's rate fell."""
    cmp = _compare(st, th, since, ev.now)
    if cmp is None:
        return None
    shares: dict[int, list[float]] = {}
    for p in gs.between(since - 1e-9, ev.now):
        for pid, v in _others(p, mine, th):
            shares.setdefault(pid, []).append(v)
    others = tuple(sorted(((pid, fmean(vs)) for pid, vs in shares.items()), key=lambda x: -x[1]))
    return NeighbourFinding("gpu_neighbour", idx, url, since, ev.now, cmp[0], cmp[1], others=others)


def _slowdown(ev: Evidence, th: Thresholds, gs: GpuState, st: ServerState, idx: int,
              url: str) -> NeighbourFinding | None:
    since = _streak_start(gs, ev.now, lambda p: p.slow == 1.0)
    if since is None:
        return None
    cmp = _compare(st, th, since, ev.now)
    if cmp is None:
        return None
    last = ev.gpus.tracks[idx].last if ev.gpus is not None and idx in ev.gpus.tracks else None
    from vtop.model.gpu import SLOWDOWN_REASONS

    reasons = tuple(r for r in (last.throttle or ()) if r in SLOWDOWN_REASONS) if last is not None else ()
    return NeighbourFinding("gpu_slowdown", idx, url, since, ev.now, cmp[0], cmp[1], reasons=reasons)


def _rate_line(f: NeighbourFinding, th: Thresholds) -> str:
    b, d = f.before, f.during
    return (f"{short_url(f.url)}: {d.per_req:.1f} tok/s per running request now ({d.tok_s:.0f} tok/s, "
            f"{d.running:.1f} running), {b.per_req:.1f} in the {dur(b.span_s)} before "
            f"({b.tok_s:.0f} tok/s, {b.running:.1f} running): {f.drop_pct:.0f} % slower")


def neighbour_alert(f: NeighbourFinding, ev: Evidence, mem: Memory) -> Alert:
    """The words of a finding (one wording per rule)."""
    th = mem.th
    span = dur(f.now - f.since)
    if f.rule == "gpu_neighbour":
        names = [f"{mem.name_pid(ev, pid)}{_who(ev, pid)} at {share:.0f} % of the SMs' time"
                 for pid, share in f.others]
        title = (f"gpu{f.gpu}: another process slows {short_url(f.url)}: "
                 f"{names[0] if names else 'a process'}; tokens per request {f.drop_pct:.0f} % down for {span}")
        ev_lines = [
            *(f"on gpu{f.gpu} beside {short_url(f.url)} for {span}: " + n for n in names),
            _rate_line(f, th),
            "GPU-Util counts the time any kernel runs, so it reads busy either way; the share per process is "
            "NVML's per-process sampling (P lists it)",
        ]
        fix = (
            "Move the other job to another GPU (CUDA_VISIBLE_DEVICES) or stop it while the server serves.",
            "If the GPU must be shared, partition it (MIG) or run the two under MPS with set shares.",
        )
        return Alert("gpu_neighbour", "warning", title, tuple(ev_lines), fix, f"gpu{f.gpu}", f.since)
    reasons = ", ".join(f.reasons) or "a slowdown reason"
    title = f"gpu{f.gpu} slowed ({reasons}): {short_url(f.url)} tokens per request {f.drop_pct:.0f} % down for {span}"
    ev_lines = [f"NVML clock-event reasons on gpu{f.gpu} for {span}: {reasons}", _rate_line(f, th)]
    fix = (
        "Thermal: check the fans, the airflow and the inlet temperature (nvidia-smi -q -d TEMPERATURE,PERFORMANCE).",
        "Power cap: compare nvidia-smi -q -d POWER's enforced limit with the board's default; a lowered cap "
        "(nvidia-smi -pl) slows every token.",
    )
    return Alert("gpu_slowdown", "warning", title, tuple(ev_lines), fix, f"gpu{f.gpu}", f.since)


def _who(ev: Evidence, pid: int) -> str:
    """`` (python3 · bob)``: the process's name (and user) as the GPU poll read it, if known."""
    n = ev.proc_names.get(pid)
    return f" ({n})" if n else ""


class Neighbour:
    """The gpu_neighbour and gpu_slowdown rules (see the module's docstring)."""

    ids = ("gpu_neighbour", "gpu_slowdown")

    def check(self, ev: Evidence, mem: Memory) -> list[Alert]:
        out = []
        for idx in sorted(mem.gpus):
            fs = neighbour_findings(ev, mem, idx)
            # one alert a GPU and rule (its target is the GPU): the server slowed most
            for rule in self.ids:
                mine = [f for f in fs if f.rule == rule]
                if mine:
                    out.append(neighbour_alert(max(mine, key=lambda f: f.drop_pct), ev, mem))
        return out
