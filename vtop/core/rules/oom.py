"""CUDA out of memory: ``oom_startup`` / ``oom_transient`` / ``oom_steady`` from an OOM seen (the
startup tracker's failure, or an OOM line in the log), and ``oom_risk`` before one.

Evidence: the line itself (``torch.OutOfMemoryError: CUDA out of memory. Tried to allocate X``,
``CUDA error: out of memory``), classified by when and around what it happened: during a start
(with the phase: weights, CUDA graphs, profiling) -> ``oom_startup``; at run time after a KV cache
full with preemptions -> ``oom_steady`` (KV pressure); after a GPU memory spike or long prompts in
the ``transient_window_s`` before -> ``oom_transient``; with memory reserved but unallocated at
least the request, or after ``fragmentation_uptime_s`` up -> ``oom_steady`` (fragmentation).
``oom_risk``: a GPU's memory at ``oom_risk_pct`` having climbed ``oom_risk_rise_pct`` steadily over
``oom_risk_window_s``. vLLM's own check at start (``Free memory on device cuda:0 (F/T GiB) on startup is
less than desired GPU memory utilization``) is no CUDA OOM: the startup failure rule names it, as in
tests/corpus/traces/h200-startup-failure-cuda-oom. Corpus traces with a CUDA OOM: none yet;
the real H200 logs in tests/fixtures/logs/vllm-0.26.0-h200-failure.log and the lines in
tests/helpers/diag_fixtures.py (copied from real torch messages) show them.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vtop.core.phases import Phase
from vtop.core.rates import histogram_delta
from vtop.core.rules.alert import Alert
from vtop.core.rules.context import Ctx, per_gpu
from vtop.core.rules.util import dur, flag, gib, hist_count_at_least, is_proc, num, plural, short_url
from vtop.model.fmt import to_float

if TYPE_CHECKING:
    from vtop.core.phases import Failure

_OOM_RE = re.compile(
    r"OutOfMemoryError: CUDA out of memory\.(?: Tried to allocate (?P<amt>[\d.]+ [KMGT]?i?B|\d+ bytes))?"
    r"|CUDA error: out of memory"
)
_OOM_GPU_RE = re.compile(
    r"GPU (?P<gpu>\d+) has a total capac(?:i)?ty of (?P<total>[\d.]+ [KMGT]?i?B) of which (?P<free>[\d.]+ [KMGT]?i?B|\d+ bytes) is free"
)
_OOM_OTHER_RE = re.compile(r"Process (?P<pid>\d+) has (?P<amt>[\d.]+ [KMGT]?i?B) memory in use")
_OOM_SELF_RE = re.compile(r"this process has (?P<amt>[\d.]+ [KMGT]?i?B) memory in use")
_OOM_FRAG_RE = re.compile(r"and (?P<amt>[\d.]+ [KMGT]?i?B|\d+ bytes) is reserved by PyTorch but unallocated")
_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}


def bytes_of(s: str | None) -> float | None:
    if not s:
        return None
    m = re.match(r"([\d.]+) ?(\w+)", s)
    if not m:
        return None
    unit = m.group(2)
    mult = 1 if unit == "bytes" else _UNITS.get(unit)
    return float(m.group(1)) * mult if mult else None


@dataclass(slots=True)
class OomEvent:
    key: tuple[str, float]
    line: str
    arrival: float
    phase: Phase | None
    startup: bool
    target: str | None
    from_failure: bool
    alert: Alert | None = None



def is_oom_failure(f: Failure) -> bool:
    # vLLM's own check "Free memory on device ... on startup is less than desired GPU memory utilization" is
    # no CUDA OOM: the tracker names it (gpu_free_at_start) and the startup-failure rule shows it.
    return f.kind == "cuda_oom"

class Oom:
    """The OOM rules: remembers each OOM seen (one per burst: a traceback repeats the line) until
    ``oom_hold_s`` has passed, or while the start it failed stays failed."""

    ids = ("oom_startup", "oom_transient", "oom_steady")

    def __init__(self) -> None:
        self.events: dict[tuple[str, float], OomEvent] = {}
        #: the arrival of the newest log line scanned
        self.log_seen: float | None = None

    def check(self, ctx: Ctx) -> list[Alert]:
        self._scan(ctx)
        return self._alerts(ctx)

    def _scan(self, ctx: Ctx) -> None:
        th = ctx.th
        snap = ctx.startup
        starting = snap is not None and snap.state == "starting"
        if snap is not None and snap.state == "failed" and snap.failure is not None and is_oom_failure(snap.failure):
            f = snap.failure
            key = ("failure", f.arrival)
            # The same OOM already seen as a log line (before the engine's death line came) is one event.
            dup = any(not e.from_failure and abs(e.arrival - f.arrival) <= 5.0 for e in self.events.values())
            if key not in self.events and not dup:
                self.events[key] = OomEvent(
                    key, f.line, f.arrival, f.phase, f.phase is not Phase.READY, ctx.log_target, True
                )
        log_lines = ctx.log_lines
        if log_lines:
            newest = self.log_seen
            fresh: list[Any] = []
            for ln in reversed(log_lines):
                arr = getattr(ln, "arrival", None)
                if arr is None or (self.log_seen is not None and arr <= self.log_seen):
                    break
                fresh.append(ln)
                newest = arr if newest is None else max(newest, arr)
            self.log_seen = newest
            # Lines read at attach carry the attach time as arrival: judge their age by the log's own clock.
            stamps = [t for t in (getattr(ln, "t", None) for ln in fresh) if isinstance(t, (int, float))]
            log_now = max(stamps) if stamps else None
            for ln in reversed(fresh):
                text = getattr(ln, "text", "") or ""
                if "out of memory" not in text or not _OOM_RE.search(text):
                    continue
                lt = getattr(ln, "t", None)
                if log_now is not None and isinstance(lt, (int, float)) and log_now - lt > th.oom_hold_s:
                    continue
                key = ("log", float(ln.arrival))
                # One event per burst: a traceback repeats the line (logger and raw stderr).
                if any(abs(e.arrival - ln.arrival) <= 5.0 for e in self.events.values()):
                    continue
                self.events[key] = OomEvent(
                    key, text, float(ln.arrival), snap.current if snap is not None else None, starting,
                    ctx.log_target, False,
                )
        # Forget old ones (a failed start stays while the tracker still says failed).
        failed_key = (
            ("failure", snap.failure.arrival) if snap is not None and snap.state == "failed" and snap.failure else None
        )
        for k in [k for k, e in self.events.items() if k != failed_key and ctx.now - e.arrival > th.oom_hold_s]:
            del self.events[k]
        if failed_key is None:
            for k in [k for k, e in self.events.items() if e.from_failure]:
                del self.events[k]

    def _alerts(self, ctx: Ctx) -> list[Alert]:
        out: dict[tuple[str, str | None], Alert] = {}
        for e in sorted(self.events.values(), key=lambda e: e.arrival):
            if e.alert is None:
                e.alert = _classify(e, ctx)
            out[e.alert.key] = e.alert  # the newest of a kind per target
        return list(out.values())


def _classify(e: OomEvent, ctx: Ctx) -> Alert:
    th = ctx.th
    url = e.target
    short = short_url(url)
    v = ctx.servers.get(url) if url else None
    st = ctx.mem.servers.get(url) if url else None
    proc = v.process if v is not None and is_proc(v.process) else None
    line = e.line.strip()
    m = _OOM_RE.search(line)
    amt = m.group("amt") if m and m.groupdict().get("amt") else None
    ev: list[str] = []
    detail = f"CUDA out of memory{f' (tried to allocate {amt})' if amt else ''}"
    gm = _OOM_GPU_RE.search(line)
    if gm:
        detail += f"; GPU {gm.group('gpu')} had {gm.group('free')} free of {gm.group('total')}"
    ev.append(detail)
    ev.append(f"line: {line[:300]}")
    fm = _OOM_FRAG_RE.search(line)
    frag = bytes_of(fm.group("amt")) if fm else None
    need = bytes_of(amt)
    torch_others = [(int(mm.group("pid")), mm.group("amt")) for mm in _OOM_OTHER_RE.finditer(line)]

    if e.startup:
        phase = e.phase
        where = f" during {phase.label}" if phase is not None else " at startup"
        ev[0] = ev[0] + where
        other_lines = ctx.other_procs_lines(url, e.arrival)
        ev += other_lines
        for pid, a in torch_others:
            ev.append(f"torch saw {ctx.name_pid(pid)} holding {a} on that GPU")
        util = to_float(flag(proc, "--gpu-memory-utilization")) if proc is not None else None
        mml = (getattr(proc, "max_model_len", None) if proc is not None else None) or (
            ctx.startup.facts.max_model_len if ctx.startup is not None else None
        )
        fix: list[str] = []
        if other_lines or torch_others:
            fix.append(
                "Another process holds memory on this GPU: stop it or move it, or lower --gpu-memory-utilization"
                + (f" (now {util:g})" if util else "")
                + " to what is free next to it."
            )
        if phase is Phase.WEIGHTS:
            fix.append(
                "The weights do not fit: use a quantized model or spread it with --tensor-parallel-size."
            )
        elif phase is Phase.CUDA_GRAPHS:
            fix.append(
                "CUDA graph capture ran out: --enforce-eager skips it, or lower --max-num-seqs (fewer graph sizes)."
            )
        fix.append(
            "Lower --max-model-len" + (f" (now {num(mml)})" if mml else "") + " or --max-num-batched-tokens so "
            "the profiling run and the KV cache need less, or lower --gpu-memory-utilization if the GPU is shared."
        )
        title = f"CUDA out of memory starting {short}{where}" + (f": tried to allocate {amt}" if amt else "")
        return Alert("oom_startup", "critical", title, tuple(ev), tuple(fix), url, e.arrival)

    # Runtime: look at the window before it.
    t1 = e.arrival
    t0 = t1 - th.transient_window_s
    mml = v.max_model_len if v is not None else None
    kv_full = False
    pre = 0.0
    long_prompts = 0.0
    edge = None
    if st is not None and st.samples:
        win = [s for s in st.samples if t0 <= s.t <= t1] or [st.at(t1)]  # type: ignore[list-item]
        kvs = [s.kv for s in win if s is not None and s.kv is not None]
        kv_full = bool(kvs) and max(kvs) >= th.kv_saturation_pct
        a, b = st.at(t1 - max(th.preempt_window_s, th.transient_window_s)), st.at(t1)
        if a is not None and b is not None and a.preempt is not None and b.preempt is not None:
            pre = b.preempt - a.preempt
        a2 = st.at(t0)
        if mml and a2 is not None and b is not None and a2.prompt_hist is not None and b.prompt_hist is not None:
            d = histogram_delta(a2.prompt_hist, b.prompt_hist)
            long_prompts, edge = hist_count_at_least(d, th.long_prompt_frac * mml)
        if kvs:
            ev.append(f"KV cache peaked at {max(kvs):.1f} % in the {dur(th.transient_window_s)} before")
    spike = None
    for idx in ctx.gpus_of(url) or sorted(ctx.mem.gpus):
        gs = ctx.mem.gpus.get(idx)
        if gs is None:
            continue
        before = [p.mem_pct for p in gs.between(t1 - 300.0, t0) if p.mem_pct is not None]
        peak_pts = [p.mem_pct for p in gs.between(t0, t1) if p.mem_pct is not None]
        tr = getattr(ctx.gpus, "tracks", {}).get(idx) if ctx.gpus is not None else None
        if tr is not None:
            cell = tr.series["mem"].buckets(t1, 1, th.transient_window_s)
            if cell and cell[0] is not None:
                peak_pts.append(cell[0])
        if before and peak_pts:
            base = statistics.median(before)
            peak = max(peak_pts)
            if peak - base >= th.mem_spike_pct:
                spike = (idx, base, peak)
                ev.append(f"gpu{idx} memory jumped from {base:.1f} % to {peak:.1f} % in the {dur(th.transient_window_s)} before")
    if long_prompts > 0:
        ev.append(
            f"{plural(long_prompts, 'request')} with prompts above {num(edge)} tokens (max_model_len {num(mml)}) "
            f"in the {dur(th.transient_window_s)} before"
        )
    uptime = None
    if proc is not None and v is not None and v.last_ok_t is not None and getattr(proc, "create_time", None):
        uptime = v.last_ok_t - proc.create_time
    elif st is not None and st.first_up_t is not None:
        uptime = t1 - st.first_up_t
    if kv_full and pre > 0:
        ev.append(f"{plural(pre, 'preemption')} in the minute before: the KV cache was full")
        seqs = getattr(proc, "max_num_seqs", None) if proc is not None else None
        fix = [
            "Lower --max-num-seqs" + (f" (now {seqs})" if seqs else "") + " so fewer sequences compete for memory.",
            "Lower --gpu-memory-utilization a little to leave activations headroom, or add GPUs with "
            "--tensor-parallel-size.",
        ]
        title = f"CUDA out of memory on {short} under KV pressure: KV cache full, {num(pre)} preemptions"
        return Alert("oom_steady", "critical", title, tuple(ev), tuple(fix), url, e.arrival)
    if spike is not None or long_prompts > 0:
        fix = [
            "Bound a step's work: --enable-chunked-prefill (always on in V1) with a lower --max-num-batched-tokens, "
            "e.g. 2048.",
            "Limit concurrency and prompt length upstream; a lower --max-model-len rejects oversized prompts.",
            "Leave more headroom: lower --gpu-memory-utilization a little.",
        ]
        what = "a memory spike" if spike is not None else "a long prompt"
        title = f"CUDA out of memory on {short} after {what}" + (f": tried to allocate {amt}" if amt else "")
        return Alert("oom_transient", "critical", title, tuple(ev), tuple(fix), url, e.arrival)
    fragmented = frag is not None and need is not None and frag >= need
    if fragmented or (uptime is not None and uptime >= th.fragmentation_uptime_s):
        if frag is not None:
            ev.append(f"{gib(frag)} reserved by PyTorch but unallocated: the free memory is in pieces")
        if uptime is not None:
            ev.append(f"server up for {dur(uptime)} with no spike, long prompt or full KV cache before it")
        fix = [
            "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in vLLM's environment to avoid fragmentation.",
            "Restart the server to get contiguous memory back; lower --gpu-memory-utilization a little for headroom.",
        ]
        title = f"CUDA out of memory on {short} from fragmentation" + (
            f" after {dur(uptime)} up" if uptime is not None else ""
        )
        return Alert("oom_steady", "critical", title, tuple(ev), tuple(fix), url, e.arrival)
    ev.append(f"no memory spike, long prompt or full KV cache seen in the {dur(th.transient_window_s)} before")
    fix = [
        "Bound a step's work with a lower --max-num-batched-tokens and limit concurrency upstream.",
        "Lower --gpu-memory-utilization a little for activation headroom; set "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.",
    ]
    title = f"CUDA out of memory on {short} while serving" + (f": tried to allocate {amt}" if amt else "")
    return Alert("oom_transient", "critical", title, tuple(ev), tuple(fix), url, e.arrival)


class OomRisk:
    """``oom_risk`` (see the module's docstring)."""

    ids = ("oom_risk",)

    def check(self, ctx: Ctx) -> list[Alert]:
        return per_gpu(ctx, oom_risk)


def oom_risk(ctx: Ctx, idx: int) -> Alert | None:
    th = ctx.th
    gs = ctx.mem.gpus[idx]
    p = gs.points[-1] if gs.points else None
    if p is None or p.mem_pct is None or p.mem_pct < th.oom_risk_pct or ctx.starting_on(idx):
        gs.risk_since = None
        return None
    t0 = p.t - th.oom_risk_window_s
    if not gs.times or gs.times[0] > t0 + 0.1 * th.oom_risk_window_s:
        return None  # not enough history yet
    pts = [q for q in gs.between(t0 - 1e-9, p.t) if q.mem_pct is not None]
    if len(pts) < 4:
        return None
    rise = p.mem_pct - pts[0].mem_pct  # type: ignore[operator]
    steps = [b.mem_pct - a.mem_pct for a, b in zip(pts, pts[1:])]  # type: ignore[operator]
    ups = sum(1 for d in steps if d > 0)
    downs = sum(1 for d in steps if d < 0)
    if rise < th.oom_risk_rise_pct or ups < 3 or downs > ups // 4:
        gs.risk_since = None
        return None
    if gs.risk_since is None:
        gs.risk_since = pts[0].t
    span = p.t - pts[0].t
    slope = rise / span if span > 0 else 0.0
    eta = (100.0 - p.mem_pct) / slope if slope > 0 else None
    ev = [
        f"gpu{idx} memory {p.mem_pct:.1f} % ({gib(p.mem_used)} of {gib(p.mem_total)}), up {rise:.1f} points in "
        f"{dur(span)}" + (f": full in about {dur(eta)} at this rate" if eta is not None else ""),
    ]
    before = {int(q.pid): q.used_bytes or 0 for q in (pts[0].procs or ())}
    grow = sorted(
        ((int(q.pid), (q.used_bytes or 0) - before.get(int(q.pid), 0)) for q in (p.procs or ())),
        key=lambda x: -x[1],
    )
    if grow and grow[0][1] > 0:
        ev.append(f"growing most: {ctx.name_pid(grow[0][0])}, +{gib(grow[0][1])} in {dur(span)}")
    fix = [
        "Find what grows (the process above) before it hits an out-of-memory error; for vLLM, set "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True and lower --gpu-memory-utilization.",
        "Keep other jobs off a GPU that vLLM serves from: vLLM sized its KV cache for the memory it saw at start.",
    ]
    title = f"gpu{idx} memory climbing towards full: {p.mem_pct:.1f} %, +{rise:.1f} points in {dur(span)}"
    return Alert("oom_risk", "warning", title, tuple(ev), tuple(fix), f"gpu{idx}", gs.risk_since)
