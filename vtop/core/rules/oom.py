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
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from vtop.core.engines import ENGINE_FLAGS, flags_of
from vtop.core.phases.phase import Phase
from vtop.core.rates import histogram_delta
from vtop.core.rules.alert import Alert, Thresholds
from vtop.core.rules.context import Evidence, Memory, per_gpu
from vtop.core.rules.util import dur, flag, gib, hist_count_at_least, num, plural, short_url
from vtop.core.stats import median
from vtop.model.fmt import clip, to_float

if TYPE_CHECKING:
    from vtop.core.phases.types import Failure, LogLine
    from vtop.core.rules.state import ServerState
    from vtop.model.procs import ServerProcess

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
#: a prompt-logprobs stage: the runner's frame in the OOM's traceback (vllm/v1/worker/gpu_model_runner.py), or a
#: request that asked for them (--enable-log-requests: "Received request ...: params: SamplingParams(...,
#: prompt_logprobs=5, ...)"; None is not asking)
_PROMPT_LP_FRAME_RE = re.compile(r"_get_prompt_logprobs_dict|in _get_prompt_logprobs|prompt_logprobs_dict = ")
_PROMPT_LP_REQ_RE = re.compile(r"Received request .*prompt_logprobs=(?P<n>-?\d+)")
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

    def check(self, ctx: Evidence, mem: Memory) -> list[Alert]:
        self._scan_failure(ctx)
        self._scan_lines(ctx, mem.th)
        self._forget(ctx, mem.th)
        return self._alerts(ctx, mem)

    def _scan_failure(self, ctx: Evidence) -> None:
        """The tracker's failure of a start, when it is a CUDA OOM."""
        snap = ctx.startup
        if snap is None or snap.state != "failed" or snap.failure is None or not is_oom_failure(snap.failure):
            return
        f = snap.failure
        key = ("failure", f.arrival)
        # The same OOM already seen as a log line (before the engine's death line came) is one event.
        dup = any(not e.from_failure and abs(e.arrival - f.arrival) <= 5.0 for e in self.events.values())
        if key not in self.events and not dup:
            self.events[key] = OomEvent(key, f.line, f.arrival, f.phase, f.phase is not Phase.READY, ctx.log_target,
                                        True)

    def _fresh_lines(self, ctx: Evidence) -> list[LogLine]:
        """The log lines that arrived since the last look, oldest first."""
        fresh: list[LogLine] = []
        for ln in reversed(ctx.log_lines):
            if self.log_seen is not None and ln.arrival <= self.log_seen:
                break
            fresh.append(ln)
        if fresh:
            self.log_seen = max(ln.arrival for ln in fresh) if self.log_seen is None else \
                max(self.log_seen, *(ln.arrival for ln in fresh))
        fresh.reverse()
        return fresh

    def _scan_lines(self, ctx: Evidence, th: Thresholds) -> None:
        """OOM lines among the lines that arrived since the last look."""
        fresh = self._fresh_lines(ctx)
        # Lines read at attach carry the attach time as arrival: judge their age by the log's own clock.
        stamps = [ln.t for ln in fresh if ln.t is not None]
        log_now = max(stamps) if stamps else None
        snap = ctx.startup
        for ln in fresh:
            if "out of memory" not in ln.text or not _OOM_RE.search(ln.text):
                continue
            if log_now is not None and ln.t is not None and log_now - ln.t > th.oom_hold_s:
                continue
            # One event per burst: a traceback repeats the line (logger and raw stderr).
            if any(abs(e.arrival - ln.arrival) <= 5.0 for e in self.events.values()):
                continue
            key = ("log", float(ln.arrival))
            self.events[key] = OomEvent(key, ln.text, float(ln.arrival), snap.current if snap is not None else None,
                                        snap is not None and snap.state == "starting", ctx.log_target, False)

    def _forget(self, ctx: Evidence, th: Thresholds) -> None:
        """Forget old ones (a failed start stays while the tracker still says failed)."""
        snap = ctx.startup
        failed = snap is not None and snap.state == "failed" and snap.failure is not None
        failed_key = ("failure", snap.failure.arrival) if failed and snap is not None and snap.failure else None
        for k in [k for k, e in self.events.items() if k != failed_key and ctx.now - e.arrival > th.oom_hold_s]:
            del self.events[k]
        if failed_key is None:
            for k in [k for k, e in self.events.items() if e.from_failure]:
                del self.events[k]

    def _alerts(self, ctx: Evidence, mem: Memory) -> list[Alert]:
        out: dict[tuple[str, str | None], Alert] = {}
        for e in sorted(self.events.values(), key=lambda e: e.arrival):
            if e.alert is None:
                e.alert = oom_alert(oom_finding(e, ctx, mem), mem.th)
            out[e.alert.key] = e.alert  # the newest of a kind per target
        return list(out.values())


# ------------------------------------------------------------------ deciding: what the OOM was

#: the classes of an OOM: its rule id, and what the title says it came after
OOM_CLASSES: dict[str, str] = {
    "startup": "oom_startup",  # during a start
    "kv_pressure": "oom_steady",  # the KV cache full with preemptions before it
    "spike": "oom_transient",  # a GPU memory spike before it
    "long_prompt": "oom_transient",  # long prompts before it
    "prompt_logprobs": "oom_transient",  # computing prompt logprobs (its traceback, or requests asking for them)
    "fragmentation": "oom_steady",  # memory reserved but unallocated, or up for hours with no trigger
    "serving": "oom_transient",  # none of these seen
}


@dataclass(frozen=True)
class OomFinding:
    """One CUDA OOM: what it was (``cls``, one of :data:`OOM_CLASSES`) and the numbers that say so."""

    cls: str
    target: str | None
    since: float
    #: the OOM line, stripped
    line: str
    #: what torch tried to allocate (``20.00 GiB``), and the GPU's free and total as torch saw them
    amount: str | None = None
    gpu_free: tuple[str, str, str] | None = None
    #: a start: the phase it failed in, the other processes on the GPU (evidence lines) and those
    #: torch named (pid name, amount)
    phase: Phase | None = None
    other_procs: tuple[str, ...] = ()
    torch_others: tuple[tuple[str, str], ...] = ()
    gpu_mem_util: float | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    #: at run time, over ``transient_window_s`` before it: the KV peak, preemptions (over a minute),
    #: prompts of at least ``long_prompt_edge`` tokens, GPU memory spikes ``(gpu, base %, peak %)``
    kv_peak: float | None = None
    preemptions: float = 0.0
    long_prompts: float = 0.0
    long_prompt_edge: float | None = None
    spikes: tuple[tuple[int, float, float], ...] = ()
    #: bytes reserved by PyTorch but unallocated, and the server's uptime
    fragmented_bytes: float | None = None
    uptime_s: float | None = None
    #: the prompt-logprobs stage: the runner's frame in the traceback; requests that asked for them in the
    #: window before, and the most any asked (-1: the whole vocabulary)
    prompt_logprobs_frame: bool = False
    prompt_logprobs_requests: int = 0
    prompt_logprobs_max: int | None = None
    #: the server's step budget (vLLM's --max-num-batched-tokens on its command line; None: not given there)
    step_tokens: str | None = None
    #: the engine of the server or log (one of :data:`vtop.core.engines.ENGINES`; None: not known, read as the
    #: first): the fixes name its flags (:data:`vtop.core.engines.ENGINE_FLAGS`)
    engine: str | None = None

    @property
    def rule(self) -> str:
        return OOM_CLASSES[self.cls]


def oom_finding(e: OomEvent, ctx: Evidence, mem: Memory) -> OomFinding:
    """Decide what an OOM was: during a start, or at run time after what."""
    line = e.line.strip()
    m = _OOM_RE.search(line)
    gm = _OOM_GPU_RE.search(line)
    proc = ctx.process_of(e.target)
    engine = proc.engine if proc is not None else (ctx.startup.facts.engine if ctx.startup is not None else None)
    base = OomFinding(
        "serving", e.target, e.arrival, line,
        amount=m.group("amt") if m and m.groupdict().get("amt") else None,
        gpu_free=(gm.group("gpu"), gm.group("free"), gm.group("total")) if gm else None,
        engine=engine,
    )
    if e.startup:
        return _startup_finding(base, e, ctx, mem)
    return _runtime_finding(base, ctx, mem)


def _startup_finding(f: OomFinding, e: OomEvent, ctx: Evidence, mem: Memory) -> OomFinding:
    proc = ctx.process_of(f.target)
    torch_others = tuple((mem.name_pid(ctx, int(mm.group("pid"))), mm.group("amt"))
                         for mm in _OOM_OTHER_RE.finditer(f.line))
    mml = proc.max_model_len if proc is not None else None
    if mml is None and ctx.startup is not None:
        mml = ctx.startup.facts.max_model_len
    return replace(
        f, cls="startup", phase=e.phase, other_procs=tuple(mem.other_procs_lines(ctx, f.target, e.arrival)),
        torch_others=torch_others, max_model_len=mml,
        gpu_mem_util=to_float(flag(proc, flags_of(f.engine)["mem"])) if proc is not None else None,
    )


def _runtime_finding(f: OomFinding, ctx: Evidence, mem: Memory) -> OomFinding:
    th = mem.th
    url = f.target
    v = ctx.servers.get(url) if url else None
    st = mem.servers.get(url) if url else None
    proc = ctx.process_of(url) or (st.last_proc if st is not None else None)
    mml = v.max_model_len if v is not None else None
    t1 = f.since
    kv_peak, pre, long_prompts, edge = _server_before(st, t1, mml, th)
    fm = _OOM_FRAG_RE.search(f.line)
    uptime = None
    if proc is not None and v is not None and v.last_ok_t is not None and proc.create_time:
        uptime = v.last_ok_t - proc.create_time
    elif st is not None and st.first_up_t is not None:
        uptime = t1 - st.first_up_t
    frame, n_req, most = _prompt_logprobs(ctx, f.line, t1, th)
    f = replace(
        f, prompt_logprobs_frame=frame, prompt_logprobs_requests=n_req, prompt_logprobs_max=most,
        max_model_len=mml, max_num_seqs=proc.max_num_seqs if proc is not None else None, kv_peak=kv_peak,
        step_tokens=_step_tokens(ctx, proc, f),
        preemptions=pre, long_prompts=long_prompts, long_prompt_edge=edge,
        spikes=tuple(_mem_spikes(ctx, mem, url, t1)), fragmented_bytes=bytes_of(fm.group("amt")) if fm else None,
        uptime_s=uptime,
    )
    return replace(f, cls=_runtime_class(f, th))


def _step_tokens(ctx: Evidence, proc: ServerProcess | None, f: OomFinding) -> str | None:
    """The server's step budget: its command line's flag, else (no process: a doctor reading the log of a server
    gone) the API server's non-default args in its log."""
    got = flag(proc, flags_of(f.engine)["chunk"]) if proc is not None else None
    if got:
        return got
    facts = ctx.startup.facts if ctx.startup is not None and (f.target is None or ctx.log_target == f.target) else None
    n = facts.max_num_batched_tokens if facts is not None and facts.engine is None else None
    return str(n) if n is not None else None


def _prompt_logprobs(ctx: Evidence, line: str, arrival: float, th: Thresholds) -> tuple[bool, int, int | None]:
    """(the OOM's traceback passes through the prompt-logprobs code, how many requests asked for prompt logprobs
    in ``transient_window_s`` before it, the most one asked). Judged on the log's own times where the lines have
    them: a log read at attach (doctor) gives every line the same arrival."""
    lines = ctx.log_lines
    at = next((ln for ln in reversed(lines) if ln.text.strip() == line or line in ln.text), None)
    if at is not None and at.t is not None:
        t1 = at.t
        win = [ln for ln in lines if ln.t is not None and t1 - th.transient_window_s <= ln.t <= t1 + 5.0]
    else:
        win = [ln for ln in lines if arrival - th.transient_window_s <= ln.arrival <= arrival + 5.0]
    frame = any("prompt_logprobs" in ln.text and _PROMPT_LP_FRAME_RE.search(ln.text) for ln in win)
    asks = [int(m.group("n")) for ln in win if "prompt_logprobs=" in ln.text
            for m in (_PROMPT_LP_REQ_RE.search(ln.text),) if m is not None]
    most = None if not asks else (-1 if -1 in asks else max(asks))
    return frame, len(asks), most


def _runtime_class(f: OomFinding, th: Thresholds) -> str:
    if f.prompt_logprobs_frame or (f.prompt_logprobs_requests and f.long_prompts > 0):
        return "prompt_logprobs"
    if f.kv_peak is not None and f.kv_peak >= th.kv_saturation_pct and f.preemptions > 0:
        return "kv_pressure"
    if f.spikes:
        return "spike"
    if f.long_prompts > 0:
        return "long_prompt"
    need = bytes_of(f.amount)
    fragmented = f.fragmented_bytes is not None and need is not None and f.fragmented_bytes >= need
    if fragmented or (f.uptime_s is not None and f.uptime_s >= th.fragmentation_uptime_s):
        return "fragmentation"
    return "serving"


def _server_before(st: ServerState | None, t1: float, mml: int | None,
                   th: Thresholds) -> tuple[float | None, float, float, float | None]:
    """(KV peak, preemptions, long prompts, their edge) in the window before ``t1``."""
    if st is None or not st.samples:
        return None, 0.0, 0.0, None
    t0 = t1 - th.transient_window_s
    win = [s for s in st.samples if t0 <= s.t <= t1] or [s for s in (st.at(t1),) if s is not None]
    kvs = [s.kv for s in win if s.kv is not None]
    pre = 0.0
    a, b = st.at(t1 - max(th.preempt_window_s, th.transient_window_s)), st.at(t1)
    if a is not None and b is not None and a.preempt is not None and b.preempt is not None:
        pre = b.preempt - a.preempt
    long_prompts, edge = 0.0, None
    a2 = st.at(t0)
    if mml and a2 is not None and b is not None and a2.prompt_hist is not None and b.prompt_hist is not None:
        long_prompts, edge = hist_count_at_least(histogram_delta(a2.prompt_hist, b.prompt_hist),
                                                 th.long_prompt_frac * mml)
    return (max(kvs) if kvs else None), pre, long_prompts, edge


def _mem_spikes(ctx: Evidence, mem: Memory, url: str | None, t1: float) -> list[tuple[int, float, float]]:
    """The GPUs whose memory jumped ``mem_spike_pct`` points in the window before ``t1``."""
    th = mem.th
    t0 = t1 - th.transient_window_s
    # The baseline is the memory while the server served: before it was up its KV cache was not yet
    # allocated, and a server that filled 97 % of the card at start (the real H100 OOM of prompt logprobs
    # 30 s after ready) did not "jump" to it. Seen up for less than the window: no baseline, no spike.
    st = mem.servers.get(url) if url else None
    up = st.first_up_t if st is not None and st.first_up_t is not None else None
    b0 = t1 - 300.0 if up is None else max(t1 - 300.0, up)
    out = []
    for idx in mem.gpus_of(ctx, url) or sorted(mem.gpus):
        gs = mem.gpus.get(idx)
        if gs is None:
            continue
        before = [p.mem_pct for p in gs.between(b0, t0) if p.mem_pct is not None]
        peak_pts = [p.mem_pct for p in gs.between(t0, t1) if p.mem_pct is not None]
        tr = ctx.gpus.tracks.get(idx) if ctx.gpus is not None else None
        if tr is not None:
            cell = tr.series["mem"].buckets(t1, 1, th.transient_window_s)
            if cell and cell[0] is not None:
                peak_pts.append(cell[0])
        if before and peak_pts:
            base, peak = median(before), max(peak_pts)
            if peak - base >= th.mem_spike_pct:
                out.append((idx, base, peak))
    return out


# ------------------------------------------------------------------ wording: the alert of a finding

#: the fixes by class; ``{mem}``, ``{len}``, ``{chunk}``... are the engine's flags (vtop.core.engines)
_FIX_RUNTIME: dict[str, tuple[str, ...]] = {
    "spike": (
        "Bound a step's work: {chunk_how}.",
        "Limit concurrency and prompt length upstream; a lower {len} rejects oversized prompts.",
        "Leave more headroom: lower {mem} a little.",
    ),
    "fragmentation": (
        "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in {name}'s environment to avoid fragmentation.",
        "Restart the server to get contiguous memory back; lower {mem} a little for headroom.",
    ),
    "serving": (
        "Bound a step's work with a lower {chunk} and limit concurrency upstream.",
        "Lower {mem} a little for activation headroom; set "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.",
    ),
}
_FIX_RUNTIME["long_prompt"] = _FIX_RUNTIME["spike"]
#: the prompt-logprobs stage, from vLLM 0.26.0's source: the V1 model runner (_get_prompt_logprobs_dict) takes the
#: logits of every prompt token a step prefills at once, bf16, then their log_softmax in fp32 (tokens x vocabulary
#: x 6 bytes: 25.5 GiB for a 30,000-token prompt at a 151,936-token vocabulary, the real H100 OOM's "Tried to
#: allocate 8.49 GiB" being its bf16 third); the V2 runner (compute_prompt_logprobs_with_chunking) 1,024 rows at a
#: time. --max-logprobs only refuses a request asking for more than it: prompt_logprobs=0 takes the same memory.
_FIX_RUNTIME["prompt_logprobs"] = (
    "Bound a step's work: a lower {chunk} (chunked prefill) splits a long prompt into smaller steps, and its "
    "prompt logprobs with it: they take the step's prompt tokens x the vocabulary x 6 bytes at once (bf16 "
    "logits, then fp32 log-probabilities){step_now}; a lower {len} rejects the longest prompts.",
    "Or drop prompt_logprobs from the clients that send it: --max-logprobs only refuses a request that asks "
    "for more than it, and prompt_logprobs=0 takes the same memory.",
    "{logprobs_runner}",
    "Leave more headroom: lower {mem} a little.",
)


def oom_alert(f: OomFinding, th: Thresholds) -> Alert:
    """The words of an OOM finding: its title, evidence lines and fixes (one place for the family)."""
    tried = f": tried to allocate {f.amount}" if f.amount else ""
    detail = f"CUDA out of memory{f' (tried to allocate {f.amount})' if f.amount else ''}"
    if f.gpu_free is not None:
        detail += f"; GPU {f.gpu_free[0]} had {f.gpu_free[1]} free of {f.gpu_free[2]}"
    short = short_url(f.target)
    if f.cls == "startup":
        where = f" during {f.phase.label}" if f.phase is not None else " at startup"
        ev = [detail + where, f"line: {clip(f.line)}", *f.other_procs,
              *(f"torch saw {name} holding {a} on that GPU" for name, a in f.torch_others)]
        title = f"CUDA out of memory starting {short}{where}{tried}"
        return Alert(f.rule, "critical", title, tuple(ev), _startup_fix(f), f.target, f.since)
    win = dur(th.transient_window_s)
    title, more, fix = _runtime_words(f, win, tried, short)
    ev = [detail, f"line: {clip(f.line)}", *_before_lines(f, win), *more]
    return Alert(f.rule, "critical", title, tuple(ev), fix, f.target, f.since)


def _before_lines(f: OomFinding, win: str) -> list[str]:
    """What the window before a runtime OOM held: the KV cache's peak, memory spikes, long prompts."""
    ev = []
    if f.kv_peak is not None:
        ev.append(f"KV cache peaked at {f.kv_peak:.1f} % in the {win} before")
    ev += [f"gpu{idx} memory jumped from {base:.1f} % to {peak:.1f} % in the {win} before"
           for idx, base, peak in f.spikes]
    if f.long_prompts > 0:
        ev.append(f"{plural(f.long_prompts, 'request')} with prompts above {num(f.long_prompt_edge)} tokens "
                  f"({flags_of(f.engine)['len_word']} {num(f.max_model_len)}) in the {win} before")
    return ev


def _runtime_words(f: OomFinding, win: str, tried: str, short: str) -> tuple[str, list[str], tuple[str, ...]]:
    """A runtime OOM's title, its stage's own evidence lines and its fix, by the stage it came in."""
    fl = flags_of(f.engine)
    words = {**fl, "step_now": f"; this server runs with {fl['chunk']} {f.step_tokens}" if f.step_tokens else ""}
    fix = tuple(x for x in (t.format_map(words) for t in _FIX_RUNTIME.get(f.cls, ())) if x)  # "": not the engine's
    if f.cls == "kv_pressure":
        fix = (
            f"Lower {fl['seqs']}" + (f" (now {f.max_num_seqs})" if f.max_num_seqs else "")
            + " so fewer sequences compete for memory.",
            f"Lower {fl['mem']} a little to leave activations headroom, or add GPUs with "
            f"{fl['tp']}.",
        )
        return (f"CUDA out of memory on {short} under KV pressure: KV cache full, {num(f.preemptions)} preemptions",
                [f"{plural(f.preemptions, 'preemption')} in the minute before: the KV cache was full"], fix)
    if f.cls == "prompt_logprobs":
        return f"CUDA out of memory on {short} computing prompt logprobs{tried}", _logprobs_lines(f, win), fix
    if f.cls in ("spike", "long_prompt"):
        cause = "a memory spike" if f.cls == "spike" else "a long prompt"
        return f"CUDA out of memory on {short} after {cause}{tried}", [], fix
    if f.cls == "fragmentation":
        title = f"CUDA out of memory on {short} from fragmentation" + (
            f" after {dur(f.uptime_s)} up" if f.uptime_s is not None else "")
        return title, _fragmentation_lines(f), fix
    return (f"CUDA out of memory on {short} while serving{tried}",
            [f"no memory spike, long prompt or full KV cache seen in the {win} before"], fix)


def _logprobs_lines(f: OomFinding, win: str) -> list[str]:
    ev = []
    if f.prompt_logprobs_frame:
        ev.append("the engine ran out while computing prompt logprobs (its traceback passes through "
                  "_get_prompt_logprobs_dict)")
    if f.prompt_logprobs_requests:
        most = "the whole vocabulary (-1)" if f.prompt_logprobs_max == -1 else str(f.prompt_logprobs_max)
        ev.append(f"{plural(f.prompt_logprobs_requests, 'request')} asked for prompt_logprobs in the {win} "
                  f"before (up to {most})")
    return ev


def _fragmentation_lines(f: OomFinding) -> list[str]:
    ev = []
    if f.fragmented_bytes is not None:
        ev.append(f"{gib(f.fragmented_bytes)} reserved by PyTorch but unallocated: the free memory is in pieces")
    if f.uptime_s is not None:
        ev.append(f"server up for {dur(f.uptime_s)} with no spike, long prompt or full KV cache before it")
    return ev


def _startup_fix(f: OomFinding) -> tuple[str, ...]:
    fl = flags_of(f.engine)
    fix: list[str] = []
    if f.other_procs or f.torch_others:
        fix.append(
            f"Another process holds memory on this GPU: stop it or move it, or lower {fl['mem']}"
            + (f" (now {f.gpu_mem_util:g})" if f.gpu_mem_util else "") + " to what is free next to it."
        )
    if f.phase is Phase.WEIGHTS:
        fix.append(f"The weights do not fit: use a quantized model or spread it with {fl['tp']}.")
    elif f.phase is Phase.CUDA_GRAPHS:
        fix.append(f"CUDA graph capture ran out: {fl['eager']} skips it, or lower {fl['graph_bs']}.")
    fix.append(
        f"Lower {fl['len']}" + (f" (now {num(f.max_model_len)})" if f.max_model_len else "")
        + f" or {fl['chunk']} so the profiling run and the KV cache need less, or lower "
        f"{fl['mem']} if the GPU is shared."
    )
    return tuple(fix)


class OomRisk:
    """``oom_risk`` (see the module's docstring)."""

    ids = ("oom_risk",)

    def check(self, ctx: Evidence, mem: Memory) -> list[Alert]:
        return per_gpu(ctx, mem, oom_risk)


def oom_risk(ctx: Evidence, mem: Memory, idx: int) -> Alert | None:
    th = mem.th
    gs = mem.gpus[idx]
    p = gs.points[-1] if gs.points else None
    if p is not None and mem.starting_on(ctx, idx):
        gs.start_seen_t = p.t
        gs.risk_since = None
        return None
    if p is None or p.mem_pct is None or p.mem_pct < th.oom_risk_pct:
        gs.risk_since = None
        return None
    t0 = p.t - th.oom_risk_window_s
    if not gs.times or gs.times[0] > t0 + 0.1 * th.oom_risk_window_s:
        return None  # not enough history yet
    if gs.start_seen_t is not None and gs.start_seen_t > t0:
        # the climb is measured from the end of the last start seen, never across it: vLLM takes its KV
        # cache whole at the end of a start (0.6 % to 97.4 % of an H100 in 84 s at
        # --gpu-memory-utilization 0.97, recorded), which is no leak; and over at least half the window
        t0 = gs.start_seen_t
        if p.t - t0 < 0.5 * th.oom_risk_window_s:
            return None
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
        ev.append(f"growing most: {mem.name_pid(ctx, grow[0][0])}, +{gib(grow[0][1])} in {dur(span)}")
    fix = [
        "Find what grows (the process above) before it hits an out-of-memory error; for an LLM server, set "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True and lower its memory fraction ("
        + ", ".join(f"{fl['name']}: {fl['mem']}" for fl in ENGINE_FLAGS.values()) + ").",
        "Keep other jobs off a GPU that an LLM server serves from: it sized its KV cache for the memory it saw at "
        "start.",
    ]
    title = f"gpu{idx} memory climbing towards full: {p.mem_pct:.1f} %, +{rise:.1f} points in {dur(span)}"
    return Alert("oom_risk", "warning", title, tuple(ev), tuple(fix), f"gpu{idx}", gs.risk_since)
