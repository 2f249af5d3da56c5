"""``gpu_neighbour``: a server's token rate fell while another process holds its GPU, or while the GPU throttles.

Evidence: the server's generation rate (its token counter) over the last ``neighbour_window_s`` against the
``neighbour_base_s`` before it, with requests running in both and at least ``neighbour_load_frac`` as many now
(less load is no slowdown): fallen by ``neighbour_drop_frac`` or more, while on a GPU the server's processes are
on (a) a process that is no vLLM server's holds memory (NVML's process list: its PID and GiB, and whether it came
during the drop), or (b) NVML's clocks-event reasons say the GPU slows down (thermal, power brake, power cap,
hardware slowdown) and did not all along (a power cap held under steady load did not cause a later drop). GPU-Util says nothing here: a GPU time-sliced between two processes reads 100 % throughout.
NVML's per-process utilization samples (``nvmlDeviceGetProcessUtilization``) are not read yet, so the other
process's share of the SMs is not said. Corpus traces: none; its proof needs the H200 (vLLM under steady streaming
load while another process runs large matmuls on the same GPU for a minute): tests/unit/test_neighbour.py feeds
synthetic polls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from vtop.core.rules.alert import Alert
from vtop.core.rules.context import Evidence, Memory, per_server
from vtop.core.rules.util import dur, gib, short_url

if TYPE_CHECKING:
    from vtop.core.rules.state import Sample, ServerState
    from vtop.core.server import ServerView

#: NVML's clocks-event reasons that slow the GPU down (vtop/model/gpu.py's names); idle, app clocks, sync boost
#: and display clocks do not
SLOWDOWN = ("hw-thermal", "sw-thermal", "hw-power-brake", "hw-slowdown", "sw-power-cap")


class Neighbour:
    """The gpu_neighbour rule (see the module's docstring)."""

    ids = ("gpu_neighbour",)

    def __init__(self) -> None:
        #: per GPU, the last tick its clocks-event reasons had no slowdown in them: a GPU that throttles all along
        #: (a power cap under steady load) did not cause a drop that came later
        self.clean_at: dict[int, float] = {}

    def check(self, ctx: Evidence, mem: Memory) -> list[Alert]:
        for idx, tr in (ctx.gpus.tracks.items() if ctx.gpus is not None else ()):
            if tr.last is not None and not any(r in SLOWDOWN for r in (tr.last.throttle or ())):
                self.clean_at[idx] = ctx.now

        def one(ctx: Evidence, mem: Memory, url: str, v: ServerView, st: ServerState) -> Alert | None:
            f = neighbour_finding(ctx, mem, url, st, self.clean_at)
            return neighbour_alert(f, ctx, mem) if f is not None else None

        return per_server(ctx, mem, one)


@dataclass(frozen=True)
class NeighbourFinding:
    """A server slowed down on a shared or throttling GPU: the rates, and who or what is on its GPUs."""

    url: str
    since: float
    base_tps: float
    now_tps: float
    base_running: float
    now_running: float
    #: (gpu, pid, bytes, came during the drop)
    others: tuple[tuple[int, int, float, bool], ...]
    #: (gpu, reasons)
    throttle: tuple[tuple[int, tuple[str, ...]], ...]

    @property
    def drop(self) -> float:
        return 1.0 - self.now_tps / self.base_tps


def _rate(a: Sample | None, b: Sample | None) -> float | None:
    if a is None or b is None or a.gen is None or b.gen is None or b.t <= a.t:
        return None
    return (b.gen - a.gen) / (b.t - a.t)


def _running(st: ServerState, a: float, b: float) -> float | None:
    xs = [s.running for s in st.samples if a <= s.t <= b and s.running is not None]
    return sum(xs) / len(xs) if xs else None


def neighbour_finding(ctx: Evidence, mem: Memory, url: str, st: ServerState,
                      clean_at: dict[int, float] | None = None) -> NeighbourFinding | None:
    th = mem.th
    last = st.last
    if last is None or (ctx.startup is not None and ctx.startup.state == "starting" and url == ctx.log_target):
        return None
    t1 = last.t
    t_mid, t0 = t1 - th.neighbour_window_s, t1 - th.neighbour_window_s - th.neighbour_base_s
    a0, a1 = st.at(t0), st.at(t_mid)
    if a0 is None or a1 is None or a0.t > t0 + 0.25 * th.neighbour_base_s or t1 - a1.t < 0.66 * th.neighbour_window_s:
        return None  # not enough history yet
    base, now = _rate(a0, a1), _rate(a1, last)
    r_base, r_now = _running(st, a0.t, a1.t), _running(st, a1.t, t1)
    if base is None or now is None or r_base is None or r_now is None or base <= 0 or r_base <= 0:
        return None
    if r_now < th.neighbour_load_frac * r_base or 1.0 - now / base < th.neighbour_drop_frac:
        return None
    known = set(ctx.pid_owner) | set(st.gpu_pids)
    for other in mem.servers.values():
        known |= other.gpu_pids
    others: list[tuple[int, int, float, bool]] = []
    throttle: list[tuple[int, tuple[str, ...]]] = []
    for idx in mem.gpus_of(ctx, url):
        gs = mem.gpus.get(idx)
        p, p0 = (gs.at(t1), gs.at(a0.t)) if gs is not None else (None, None)
        if p is not None and p.procs:
            before = {int(q.pid) for q in (p0.procs or ())} if p0 is not None else set()
            others += [(idx, int(q.pid), float(q.used_bytes or 0), int(q.pid) not in before)
                       for q in p.procs if int(q.pid) not in known and q.used_bytes]
        tr = ctx.gpus.tracks.get(idx) if ctx.gpus is not None else None
        reasons = tuple(r for r in (tr.last.throttle or ()) if r in SLOWDOWN) if tr is not None and tr.last else ()
        if reasons and (clean_at or {}).get(idx, float("-inf")) >= a0.t:  # it began since the base window
            throttle.append((idx, reasons))
    if not others and not throttle:
        return None
    return NeighbourFinding(url, a1.t, base, now, r_base, r_now, tuple(others), tuple(throttle))


def neighbour_alert(f: NeighbourFinding, ctx: Evidence, mem: Memory) -> Alert:
    th = mem.th
    short = short_url(f.url)
    ev = [f"generation {f.now_tps:,.0f} tok/s over the last {dur(th.neighbour_window_s)}, {f.base_tps:,.0f} tok/s in "
          f"the {dur(th.neighbour_base_s)} before: down {f.drop:.0%}",
          f"requests running: {f.now_running:.1f} on average now, {f.base_running:.1f} before (the load did not fall)"]
    fix: list[str] = []
    if f.others:
        for idx, pid, used, new in f.others:
            ev.append(f"gpu{idx}: {mem.name_pid(ctx, pid, gib(used))}, no vLLM server's process, "
                      + ("came during the drop" if new else "was there before it"))
        fix.append("Another process shares this GPU: kernels of two processes take turns (time-slicing), so each "
                   "runs slower while GPU-Util reads 100 %. Move it to another GPU (CUDA_VISIBLE_DEVICES), stop it, or "
                   "partition the GPU (MIG) if both must stay.")
    for idx, reasons in f.throttle:
        ev.append(f"gpu{idx} slows its clocks: {', '.join(reasons)} (NVML's clocks-event reasons)")
    if f.throttle:
        fix.append("The GPU is throttling: check its temperature and power (nvidia-smi -q -d PERFORMANCE,TEMPERATURE,"
                   "POWER), the cooling and the power limit (nvidia-smi -pl).")
    ev.append("the other process's share of the SMs is not read (NVML's per-process utilization)")
    who = (f"{mem.name_pid(ctx, f.others[0][1])} runs on gpu{f.others[0][0]}" if f.others else
           f"gpu{f.throttle[0][0]} throttles ({f.throttle[0][1][0]})")
    title = (f"vLLM on {short} slowed {f.drop:.0%} ({f.base_tps:,.0f} -> {f.now_tps:,.0f} tok/s) while {who}")
    return Alert("gpu_neighbour", "warning", title, tuple(ev), tuple(fix), f.url, f.since)
