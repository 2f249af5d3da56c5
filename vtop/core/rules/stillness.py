"""What the processes say when the log says nothing: a server's tree that is still, read from the
process scans' CPU seconds and NVML's per-process GPU memory (issue 49).

Two readers:

* :func:`tree_cpu`: how much CPU each process of a server's tree used over a stretch (what vtop
  watched of it), for the evidence lines of the engine stall (a stopped EngineCore adds no CPU
  time) and for a start;
* :func:`stopped_since`: since when every process of the tree has been stopped (state ``T`` in
  ``/proc/PID/stat``: a SIGSTOP, a debugger): still for good until a SIGCONT, so a start whose
  whole tree, or whose working processes (the workers, else the engine cores), vtop has watched
  stopped for ``stopped_min_span_s`` (two scans 5 s apart) is named at once;
* :func:`still_start`: a start vtop has no log of (vLLM's stdout on a pipe, a log it was not told
  of): the port refuses, a vLLM process exists, and the tree has added no CPU time (less than
  ``startup_still_cpu_frac`` of a core) and no GPU memory (NVML per process, where known) for
  ``startup_still_s``: a stalled start, named with that evidence ("no log: the processes have been
  still for 1 min 10 s"). A start whose CPU or GPU memory moves stays quiet until the ceiling
  (``startup_ceiling_s``, ``--stall-threshold``: starting that long from the process's start).
  Still for less than the threshold: a :class:`~vtop.core.rules.alert.Pending` finding, so a short
  ``doctor`` window says it instead of "no alerts".

With a log of the server, the log's phase tracker judges the start (vtop/core/rules/startup.py,
which reads the same CPU seconds); this module speaks only where there is none.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vtop.core.engines import flags_of
from vtop.core.rules.alert import Alert, Pending
from vtop.core.rules.util import dur, gib, short_url

if TYPE_CHECKING:
    from vtop.core.rules.context import Evidence, Memory
    from vtop.core.rules.state import CpuSample, ServerState
    from vtop.core.server import ServerView

__all__ = ["STOPPED", "CpuUse", "gpu_memory_moved", "still_since", "still_start", "stopped_since", "tree_cpu"]

#: a process scan's CPU seconds have two decimals: growth below this is no growth
CPU_RESOLUTION_S = 0.02
#: NVML per-process memory that changed by less than this did not move (weights and the KV cache
#: arrive in steps of hundreds of MiB; the CUDA context of a process is ~500 MiB)
GPU_MEM_STEP_BYTES = 16 * 2**20


@dataclass(frozen=True)
class CpuUse:
    """The CPU seconds a server's processes used between two process scans."""

    span_s: float
    #: pid -> CPU seconds used over the span (the processes seen at both scans)
    used: dict[int, float]
    names: dict[int, str]
    working: tuple[int, ...]

    @property
    def tree(self) -> float:
        return sum(self.used.values())


def tree_cpu(st: ServerState, a_t: float, b_t: float | None = None) -> CpuUse | None:
    """The CPU each process used from the scan at or before ``a_t`` (else the first scan vtop has)
    to the scan at or before ``b_t`` (else the newest); None without two scans."""
    if not st.cpu_samples:
        return None
    b = st.cpu_at(b_t) if b_t is not None else st.cpu_samples[-1]
    a = st.cpu_at(a_t) or st.cpu_samples[0]
    if b is None or b.t <= a.t:
        return None
    common = [p for p in b.cpu if p in a.cpu]
    if not common:
        return None
    return CpuUse(b.t - a.t, {p: b.cpu[p] - a.cpu[p] for p in common}, b.names, b.working)


def _still_between(a: CpuSample, b: CpuSample, frac: float) -> bool:
    common = [p for p in b.cpu if p in a.cpu]
    if not common or len(common) < len(b.cpu):
        return False  # a process came (or one vtop had not read): the tree changed, it moves
    used = sum(b.cpu[p] - a.cpu[p] for p in common)
    return used <= max(CPU_RESOLUTION_S, frac * (b.t - a.t))


def still_since(st: ServerState, frac: float) -> float | None:
    """Since when the server's tree has added (almost) no CPU time: the earliest scan from which
    to the newest the tree used at most ``frac`` of a core (and no process came or went); None
    when the last two scans already moved, or there are not two."""
    s = st.cpu_samples
    if len(s) < 2:
        return None
    b = s[-1]
    since = None
    for a in reversed(s[:-1]):
        if not _still_between(a, b, frac):
            break
        since = a.t
    return since


STOPPED = ("T", "t")


def stopped_since(st: ServerState, pids: Callable[[CpuSample], Iterable[int]] | None = None,
                  *, any_of: bool = False) -> float | None:
    """Since when the server's processes have been stopped (state ``T``, a SIGSTOP or a debugger;
    ``t``, a tracer) at every scan: every process of the tree (``pids`` None), or those ``pids``
    picks from each scan (every one of them; ``any_of``: at least one). None when the newest scan
    says otherwise, or no state was read."""
    since = None
    for s in reversed(st.cpu_samples):
        want = list(s.cpu) if pids is None else [p for p in pids(s) if p in s.cpu]
        if not want or any(p not in s.states for p in want):
            break
        hit = [s.states[p] in STOPPED for p in want]
        if not (any(hit) if any_of else all(hit)):
            break
        since = s.t
    return since


def _server_pids(ev: Evidence, mem: Memory, url: str) -> set[int]:
    """The pids of ``url``'s processes: those seen on a GPU and those discovery found."""
    st = mem.servers.get(url)
    proc = ev.process_of(url)
    pids = set(st.gpu_pids) if st is not None else set()
    if proc is not None:
        pids |= {int(c.pid) for c in proc.children} | {int(proc.pid)}
    return pids


def _gpu_mem_span(mem: Memory, pids: set[int], a: float, b: float) -> tuple[bool, dict[tuple[int, int], int],
                                                                            dict[tuple[int, int], int]]:
    """Over ``(a, b]``: whether any GPU point had per-process readings, and each (GPU, pid)'s first and
    last memory among ``pids``."""
    first: dict[tuple[int, int], int] = {}
    last: dict[tuple[int, int], int] = {}
    seen_any = False
    for idx, gs in mem.gpus.items():
        for p in gs.between(a, b):
            if p.procs is None:
                continue
            seen_any = True
            for gp in p.procs:
                if int(gp.pid) in pids and gp.used_bytes is not None:
                    first.setdefault((idx, int(gp.pid)), int(gp.used_bytes))
                    last[(idx, int(gp.pid))] = int(gp.used_bytes)
    return seen_any, first, last


def gpu_memory_moved(ev: Evidence, mem: Memory, url: str, a: float, b: float) -> tuple[bool, list[str]] | None:
    """Whether NVML's per-process memory of ``url``'s processes moved over ``(a, b]`` (a process
    came to a GPU, or its memory changed by a step), with evidence lines; None without per-process
    readings of its processes (no NVML, no GPU process yet, a container that hides the pids)."""
    pids = _server_pids(ev, mem, url)
    if not pids:
        return None
    seen_any, first, last = _gpu_mem_span(mem, pids, a, b)
    if not seen_any:
        return None
    if not last:
        return False, ["no process of the server holds GPU memory (NVML per process)"]
    moved = [k for k in last if abs(last[k] - first[k]) >= GPU_MEM_STEP_BYTES]
    total = sum(last.values())
    if moved:
        return True, [f"GPU memory of its processes moved to {gib(float(total))} (NVML per process)"]
    return False, [f"GPU memory of its processes unchanged at {gib(float(total))} (NVML per process)"]


def _has_log_of(ev: Evidence, url: str) -> bool:
    """vtop follows a log of this server's start (then the log's tracker judges it)."""
    return ev.startup is not None and ev.log_target == url


def still_start(ev: Evidence, mem: Memory, url: str, v: ServerView, st: ServerState) -> Alert | None:
    """A start without a log, judged by its processes (see the module's docstring); adds a
    :class:`Pending` finding to ``mem`` while the tree is still for less than the threshold."""
    if v.state != "starting" or _has_log_of(ev, url):
        return None
    proc = ev.process_of(url)
    if proc is None:
        return None
    th = mem.th
    now = ev.now
    # create_time is on the wall clock: the tick's wall time says how old the process is
    age = max(0.0, ev.wall - proc.create_time) if ev.wall is not None and proc.create_time else None
    if not st.cpu_samples or now - st.cpu_samples[-1].t > 30.0:
        return _ceiling(ev, mem, url, proc, age)
    # A process stopped by a signal is still for good (until a SIGCONT): the whole tree, or the ones doing
    # the start's work (the workers, else the engine cores), watched stopped for stopped_min_span_s
    # name the stall without waiting for the still threshold, whatever the rest of the tree does.
    stopped = stopped_since(st) or stopped_since(st, lambda s: s.working)
    stopped_s = now - stopped if stopped is not None else None
    named_stopped = stopped_s is not None and stopped_s >= th.stopped_min_span_s
    since = still_since(st, th.startup_still_cpu_frac)
    gpu = gpu_memory_moved(ev, mem, url, since, now) if since is not None else None
    if not named_stopped and (since is None or (gpu is not None and gpu[0])):
        return _ceiling(ev, mem, url, proc, age)
    ev_lines = _still_lines(st, now, since, stopped_s, gpu, v, proc.pid, age)
    held = now - since if since is not None else 0.0
    if held < th.startup_still_s and not named_stopped:
        assert since is not None
        mem.pending.append(Pending(
            "startup_stall", url, since, th.startup_still_s,
            "a start without a log whose processes add no CPU time" + (" and no GPU memory" if gpu else ""),
            "a stalled start", tuple(ev_lines), st.cpu_samples[0].t))
        return None
    if held >= th.startup_still_s:
        title = f"Startup of {short_url(url)} stalled: no log: the processes have been still for {dur(held)}"
        began = since
    else:
        assert stopped is not None and stopped_s is not None
        title = (f"Startup of {short_url(url)} stalled: no log: its processes have been stopped (state T) for "
                 f"{dur(stopped_s)}")
        began = stopped
    fl = flags_of(proc.engine)
    fix = ("Nothing runs: see whether a process is stopped or blocked (ps -o pid,stat,wchan,cmd: T is stopped, D "
           "waits on I/O); kill -CONT a stopped one.",
           f"Press d for a py-spy dump of {fl['engine_proc']} ({fl['tp_procs']} for TP>1) to see where it waits.",
           f"Give vtop the server's log (`{fl['serve']} ... 2>&1 | tee {fl['log_name']}`, then `--log {fl['log_name']}`): "
           "it names the phase the start stopped in.")
    return Alert("startup_stall", "warning", title, tuple(ev_lines), fix, url, began)


def _still_lines(st: ServerState, now: float, since: float | None, stopped_s: float | None,
                 gpu: tuple[bool, list[str]] | None, v: ServerView, pid: int, age: float | None) -> list[str]:
    """The evidence of a still or stopped start without a log: the tree's CPU time, the stopped processes,
    NVML's per-process memory, the refused port and the process's age."""
    ev_lines: list[str] = []
    if since is not None:
        use = tree_cpu(st, since)
        n = len(use.used) if use is not None else len(st.cpu_samples[-1].cpu)
        used = use.tree if use is not None else 0.0
        ev_lines.append(f"no log: the processes have been still for {dur(now - since)}: {n} processes of the "
                        f"server used {used:.2f} s of CPU in that time (read from the process table)")
    if stopped_s is not None:
        last = st.cpu_samples[-1]
        who = [p for p, x in last.states.items() if x in STOPPED]
        what = (f"every process of the server ({len(last.cpu)})" if len(who) >= len(last.cpu) else
                ", ".join(f"{last.names.get(p, 'process')} (pid {p})" for p in sorted(who)))
        ev_lines.append(f"{'no log: ' if since is None else ''}{what}: stopped (state T in the process table: a "
                        f"SIGSTOP, or a debugger), seen so for {dur(stopped_s)}")
    if gpu is not None:
        ev_lines += gpu[1]
    port = v.url.rsplit(":", 1)[-1].rstrip("/")
    ev_lines.append(f"port {port} refuses connections: the server is not ready")
    if age is not None:
        ev_lines.append(f"{flags_of(getattr(st.last_proc, 'engine', None))['name']} process {pid} started "
                        f"{dur(age)} ago")
    return ev_lines


def _ceiling(ev: Evidence, mem: Memory, url: str, proc: object, age: float | None) -> Alert | None:
    """A start without a log that has gone on for the ceiling, busy or not: said as info."""
    if age is None or age < mem.th.startup_ceiling_s:
        return None
    pid = getattr(proc, "pid", "?")
    name = flags_of(getattr(proc, "engine", None))["name"]
    title = f"Startup of {short_url(url)} slow: {name} process {pid} has been starting for {dur(age)} (no log)"
    ev_lines = (f"the port refuses connections {dur(age)} after the process started, past the "
                f"{dur(mem.th.startup_ceiling_s)} ceiling (--stall-threshold)",
                "its processes still use CPU or GPU memory: it may just be slow")
    return Alert("startup_stall", "info", title, ev_lines,
                 ("Give vtop the server's log (`--log PATH`): it names the phase the start is in.",),
                 url, ev.now - age)
