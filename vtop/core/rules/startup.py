"""``startup_stall`` and ``startup_failure``: a start that hangs, a start that failed.

``startup_stall`` -- evidence, per phase, from the tracker's :class:`~vtop.core.phases.Quiet`:

* a phase that prints progress (``Loading safetensors checkpoint shards: N/M``, ``Capturing CUDA
  graphs ... N/M``) has stalled when no step came for ``startup_progress_x`` times its longest step
  so far (tqdm's elapsed time and the frames' arrival say how long a step takes), and at least
  ``startup_progress_floor_s``;
* a silent phase (torch.compile, memory profiling, process start, or a bar not yet timed; not the
  weights, whose reads wait on I/O with the CPU still) has
  stalled when the log is silent for ``startup_still_s`` AND the server's processes are still: the
  CPU seconds (user + system, from the process scans) of the tree, or of the processes doing the
  work (the workers, else the engine cores), grew by less than ``startup_still_cpu_frac`` of a core
  over that window, AND, where GPU data exists, the GPU idled (mean GPU-Util below
  ``startup_still_gpu_util``). A busy silent compile (CPU moving) stays quiet. A doctor that
  attached during the silence (the log's stamps say it is that old) judges the CPU over what it
  watched, ``startup_still_min_span_s`` at least. Where no CPU reading exists (an old recording,
  a server whose processes vtop cannot see), none is invented: only the ceiling applies;
* the ceiling: the tracker's :class:`~vtop.core.phases.StallInfo`, the log silent for
  ``--stall-threshold`` (10 minutes), whatever else is seen; there the GPUs' SM activity during the
  silence (busy SMs make it "info": the phase may just be slow) and 'No available shared memory
  broadcast block' waits are evidence too.

Corpus trace: tests/corpus/traces/startup-stall-compile (the Worker SIGSTOPped in torch.compile for
150 s, the log silent); quiet on every normal-* trace and the H200 start in
vtop/data/demo-h200-vllm-0.26.0.jsonl.gz (graph capture progress frames).

``startup_failure`` -- evidence: the tracker's :class:`~vtop.core.phases.Failure` of a start that
never became ready (its telling line, its phase, the usual fix; for a KV cache or max_model_len
that does not fit, the other processes on the GPU). CUDA OOMs are the OOM rules'. Corpus traces:
tests/corpus/traces/startup-failure-bad-max-model-len, startup-failure-kv-too-large,
startup-failure-kv-too-small. Without the log (vLLM's output on a pipe, in a container, in a unit's
journal), a start that failed is told by its processes (:func:`failed_start`): a server process seen while
its port refused, then gone, the port never having answered; the alert says the cause is in the output.
Every start failure of the corpus played with ``--no-log`` (tests/corpus/test_nolog_corpus.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

from vtop.core.engines import flags_of
from vtop.core.phases.phase import Phase
from vtop.core.rules.alert import Alert
from vtop.core.rules.context import Evidence, Memory, per_server
from vtop.core.rules.download import download_in_flight, download_stall
from vtop.core.rules.oom import is_oom_failure
from vtop.core.rules.stillness import still_start
from vtop.core.rules.util import dur, engine_of, said_at, short_url
from vtop.core.stats import fmean
from vtop.model.fmt import clip

if TYPE_CHECKING:
    from vtop.core.membudget import MemoryBudget
    from vtop.core.phases.types import Failure, StallInfo, StartupSnapshot
    from vtop.core.rules.state import ServerState
    from vtop.core.server import ServerView


class StartupStall:
    """The startup-stall rule (see the module's docstring)."""

    ids = ("startup_stall",)

    def check(self, ctx: Evidence, mem: Memory) -> list[Alert]:
        if download_in_flight(ctx):  # bytes moving is no stall; bytes stopped: vtop/core/rules/download.py names it
            return download_stall(ctx, mem)
        a = startup_stall(ctx, mem)
        # a start vtop has no log of, judged by its processes (vtop/core/rules/stillness.py)
        return ([] if a is None else [a]) + per_server(ctx, mem, still_start)


class StartupFailure:
    """The startup-failure rule (see the module's docstring)."""

    ids = ("startup_failure",)

    def check(self, ctx: Evidence, mem: Memory) -> list[Alert]:
        # a start vtop has no log of: its processes went before its port ever answered
        gone = per_server(ctx, mem, failed_start)
        f = tracker_failure(ctx, mem)
        if f is None or f.phase is Phase.READY:
            return gone
        from vtop.core.membudget import MEMORY_FAILURES

        where = f" during {f.phase.label}" if f.phase is not None else ""
        # a start that failed for memory: the budget's fit (computed there, once per tick), quoted in the fix
        words = failure_words(f, ctx.memory_budget if f.kind in MEMORY_FAILURES else ())
        # The words may name the phase already ("ValueError during memory profiling").
        message = words.message.removesuffix(where) if where else words.message
        title = f"{flags_of(f.engine)['name']} on {short_url(ctx.log_target)} failed to start{where}: {message}"
        return [Alert("startup_failure", "critical", title, failure_evidence(ctx, mem, f, where), (words.fix,),
                      ctx.log_target, f.arrival)]


def failed_start(ev: Evidence, mem: Memory, url: str, v: ServerView, st: ServerState) -> Alert | None:
    """A start without a log that failed, told by its processes: vtop saw a server process while the port
    refused connections, then the process table held none, and the port had not answered since the start
    was seen (:meth:`~vtop.core.rules.state.ServerState.note_start`). On until the server answers: the next
    start of a crash loop is no proof that the failure is over. Without the log vtop cannot say why (a
    max_model_len that does not fit, memory, a missing package: the log's rule names each) nor tell a
    failure from a stop during the start; the alert says so and where the error is."""
    fs = st.failed_start
    if fs is None or fs.gone is None or (ev.startup is not None and ev.log_target == url):
        return None  # with the log, its tracker's failure is the rule's (and names the cause)
    proc = fs.proc
    fl = flags_of(proc.engine)
    ran = f" after running {dur(fs.ran_s)}" if fs.ran_s is not None else ""
    title = (f"{fl['name']} on {short_url(url)} exited while starting{ran}, before its port ever answered "
             "(no log: the error is in its output)")
    lines = [
        f"no log: {fl['name']} process {proc.pid} was seen starting {said_at(ev, fs.seen)} (port {proc.port} "
        f"refusing connections); {said_at(ev, fs.gone)} the process table held none of its processes, and the port "
        "had never answered",
        f"command line: {clip(proc.display_argv())}",
        "vtop cannot read its output (a pipe, a container, a unit's journal), so it cannot say why, nor tell a "
        "failure from a stop",
    ]
    if v.state == "starting":
        lines.append("a new start is running: this alert ends when the server answers")
    fix = (f"Read the start's error where its output goes: the terminal or file of `{fl['serve']}`, `docker logs "
           "<container>`, `journalctl -u <unit>`, `kubectl logs <pod> --previous`.",
           f"Give vtop the log (`{fl['serve']} ... 2>&1 | tee {fl['log_name']}`, then `--log {fl['log_name']}`): it "
           "names the failure and its fix (max-model-len, GPU memory, a missing package).")
    return Alert("startup_failure", "critical", title, tuple(lines), fix, url, fs.gone)


def tracker_failure(ctx: Evidence, mem: Memory) -> Failure | None:
    """The failure of the log's start, unless it is a CUDA OOM (the OOM rules name those)."""
    snap = ctx.startup
    if snap is None or snap.state != "failed" or snap.failure is None or is_oom_failure(snap.failure):
        return None
    return snap.failure


def failure_evidence(ctx: Evidence, mem: Memory, f: Failure, where: str) -> tuple[str, ...]:
    words = failure_words(f).message
    message = words.removesuffix(where) if where else words
    ev = [f"{message}{where}", f"telling line: {clip(f.line.strip())}"]
    if f.kind in ("kv_no_memory", "kv_host_memory", "gpu_free_at_start", "max_model_len"):
        ev += mem.other_procs_lines(ctx, ctx.log_target, f.arrival)
    return tuple(ev)


def _progress_stopped(ctx: Evidence, mem: Memory) -> list[str] | None:
    """Evidence lines when the current phase's progress bar stopped for several of its steps."""
    q, th = ctx.quiet, mem.th
    if q is None or not q.progressing or q.step_s is None:
        return None
    limit = max(th.startup_progress_floor_s, th.startup_progress_x * q.step_s)
    silent = q.silent_at(ctx.now)
    if silent < limit:
        return None
    return [
        f"progress stopped: no step for {dur(silent)}, while its longest step so far took {q.step_s:.1f} s "
        f"(stalled past {th.startup_progress_x:g}x that, {dur(th.startup_progress_floor_s)} at least)"
    ]


def _cpu_still(ctx: Evidence, mem: Memory, window_s: float) -> list[str] | None:
    """Evidence lines when the server's processes used (almost) no CPU over the last ``window_s``;
    None when they did, or when there is no reading to tell (never a guess)."""
    st = mem.servers.get(ctx.log_target) if ctx.log_target else None
    if st is None or not st.cpu_samples:
        return None
    b = st.cpu_samples[-1]
    a = st.cpu_at(b.t - window_s)
    watched = ""
    if a is None:
        # Attached during the silence (doctor --window 15): the processes over what vtop watched.
        first = st.cpu_samples[0]
        if b.t - first.t < mem.th.startup_still_min_span_s:
            return None
        a = first
        watched = " (all vtop watched)"
    # The newest scan must be recent: a stale one says nothing about now.
    if ctx.now - b.t > max(30.0, window_s):
        return None
    span = b.t - a.t
    allow = mem.th.startup_still_cpu_frac * span
    common = [p for p in b.cpu if p in a.cpu]
    if not common:
        return None
    used = {p: b.cpu[p] - a.cpu[p] for p in common}
    tree = sum(used.values())
    if tree < allow:
        return [f"the server's processes used {tree:.2f} s of CPU in {dur(span)}{watched} ({len(common)} "
                "processes, read from the process table): nothing runs"]
    still = [p for p in b.working if p in used and used[p] < allow]
    if not still:
        return None
    who = ", ".join(f"{b.names.get(p, 'process')} (pid {p}) {used[p]:.2f} s" for p in still)
    return [f"CPU time in {dur(span)}{watched}: {who}, while the tree used {tree:.1f} s: the process doing the "
            "start's work does not run (stopped, or blocked)"]


def _gpu_idle(ctx: Evidence, mem: Memory, window_s: float) -> tuple[bool, list[str]] | None:
    """(idle, evidence) of the server's GPUs over the last ``window_s``; None without GPU data."""
    idxs = mem.gpus_of(ctx, ctx.log_target) or sorted(mem.gpus)
    utils: list[float] = []
    for idx in idxs:
        utils += [p.util for p in mem.gpus[idx].between(ctx.now - window_s, ctx.now) if p.util is not None]
    if not utils:
        return None
    mean = fmean(utils)
    return mean < mem.th.startup_still_gpu_util, [f"GPU-Util {mean:.0f} % over the same {dur(window_s)}"]


def _went_still(ctx: Evidence, mem: Memory) -> list[str] | None:
    """Evidence lines when a silent phase's log, processes and GPUs all stopped moving."""
    q, th = ctx.quiet, mem.th
    if q is None or q.silent_at(ctx.now) < th.startup_still_s or (q.progressing and q.step_s is not None):
        return None
    if q.phase is Phase.WEIGHTS:
        # Reading weights waits on the disk or the network, not the CPU: a first shard of 5 GB at
        # 100 MB/s is 50 s of a still process. Only its progress (once timed) and the ceiling judge it.
        return None
    cpu = _cpu_still(ctx, mem, th.startup_still_s)
    if cpu is None:
        return None
    gpu = _gpu_idle(ctx, mem, th.startup_still_s)
    if gpu is not None and not gpu[0]:
        return None
    return cpu + (gpu[1] if gpu is not None else [])


def _past_history(ctx: Evidence, mem: Memory) -> list[str] | None:
    """Evidence lines when a silent phase of a start with history (this model, flags and vLLM version on this
    box) has been silent for ``startup_history_x`` times the longest it took in the last starts: a phase of
    20 s is suspect after 100 s, not only at the 10-minute ceiling, even where vtop sees no process."""
    q, th, usual = ctx.quiet, mem.th, ctx.usual
    if q is None or usual is None or (q.progressing and q.step_s is not None):
        return None
    from vtop.core.start_history import history_stall_s

    u = usual.of(q.phase)
    limit = history_stall_s(u, th.startup_history_x, th.startup_history_floor_s)
    silent = q.silent_at(ctx.now)
    if u is None or limit is None or silent < limit:
        return None
    return [f"history: {q.label} took {dur(u.usual_s)} (median), {dur(u.longest_s)} at the longest, in the last "
            f"{u.n} start{'' if u.n == 1 else 's'} of {usual.key.text()} on this box; silent {dur(silent)} now, past "
            f"{th.startup_history_x:g}x that ({dur(limit)})"]


def _stall_found(ctx: Evidence, mem: Memory) -> tuple[StallInfo, list[str], bool] | None:
    """(the stall, the evidence that judged it, whether the processes went still) for a start in progress:
    the ceiling (the tracker's :class:`StallInfo`), a progress bar that stopped, or a silent phase whose
    processes and GPUs went still; None when none holds."""
    snap = ctx.startup
    if not (snap is None or snap.state == "starting"):
        return None
    if ctx.stall is not None:
        return ctx.stall, [], False
    q = ctx.quiet
    if q is None:
        return None
    why = _progress_stopped(ctx, mem)
    if why:
        return q.as_stall(ctx.now), why, False
    why = _went_still(ctx, mem)
    if why:
        return q.as_stall(ctx.now), why, True
    why = _past_history(ctx, mem)
    if why:
        return q.as_stall(ctx.now), why, False
    return None


def _attach_line(ctx: Evidence, mem: Memory) -> list[str]:
    """A log read as a backlog (doctor, or the screen just attached): what dates the silence."""
    hist = ctx.history
    if hist is None or hist.backlog_lag_s <= 0 or hist.backlog_lag_from is None:
        return []
    what = ("the last line's time stamp" if hist.backlog_lag_from == "stamp" else
            "the log file's modification time (its last line, a progress frame, has no time stamp)")
    return [f"the log was read at attach: its last line was written {dur(hist.backlog_lag_s)} before vtop read it, "
            f"by {what}"]


def _log_lines(snap: StartupSnapshot | None, stall: StallInfo) -> list[str]:
    """What the log says of the stalled phase: its progress, its last line, the shm-broadcast waits."""
    ev: list[str] = []
    pv = snap.phase(stall.phase) if snap is not None and stall.phase is not None else None
    if pv is not None and pv.progress:
        ev.append("progress: " + ", ".join(f"{p.label} {p.n}/{p.total}" for p in pv.progress))
    if stall.last_line:
        from vtop.model.redact import redact_prompts

        ev.append(f"last line: {redact_prompts(stall.last_line).strip()[:200]}")
    if snap is not None and snap.facts.shm_broadcast_waits:
        ev.append(f"{snap.facts.shm_broadcast_waits} 'No available shared memory broadcast block' message(s): "
                  "a worker is not answering")
    return ev


def _gpus_during(ctx: Evidence, mem: Memory, since: float) -> tuple[list[str], bool]:
    """(evidence lines, the SMs were busy) of the server's GPUs during the silence."""
    ev: list[str] = []
    busy_sm: list[float] = []
    for idx in mem.gpus_of(ctx, ctx.log_target) or sorted(mem.gpus):
        gl = mem.gpu_line(idx, since, ctx.now)
        if gl:
            ev.append(gl + " during the silence")
            busy_sm += [p.sm for p in mem.gpus[idx].between(since, ctx.now) if p.sm is not None]
    working = bool(busy_sm) and fmean(busy_sm) >= 50.0
    if working:
        ev.append("the SMs are busy: the phase may just be slow (a big model's first torch.compile or profiling)")
    return ev, working


def _stall_fix(stall: StallInfo, still: bool, engine: str | None = None) -> tuple[str, ...]:
    fix = []
    if still:
        fix.append("Nothing runs: see whether a process is stopped or blocked (ps -o pid,stat,wchan,cmd: T is "
                   "stopped, D waits on I/O); kill -CONT a stopped one.")
    if stall.hint:
        fix.append(stall.hint[0].upper() + stall.hint[1:] + ".")
    fl = flags_of(engine)
    fix.append(f"Press d for a py-spy dump of {fl['engine_proc']} ({fl['tp_procs']} for TP>1) to see where it waits.")
    return tuple(fix)


def startup_stall(ctx: Evidence, mem: Memory) -> Alert | None:
    found = _stall_found(ctx, mem)
    if found is None:
        return None
    stall, why, still = found
    since = ctx.now - stall.silent_s
    ev = [f"no new log line and no progress for {dur(stall.silent_s)} in {stall.label}", *why, *_attach_line(ctx, mem)]
    if not why:
        ev.append("no process readings were used (vtop sees no process for this server, or none that old): "
                  "the silence alone, past the threshold")
    ev += _log_lines(ctx.startup, stall)
    u = ctx.usual.of(stall.phase) if ctx.usual is not None else None
    if u is not None and not any(w.startswith("history:") for w in why):
        ev.append(f"{stall.label} {u.words()}")
    gpu, working = _gpus_during(ctx, mem, since)
    ev += gpu
    tgt = ctx.log_target
    title = f"Startup of {short_url(tgt)} stalled in {stall.label}: no new log line for {dur(stall.silent_s)}"
    return Alert("startup_stall", "info" if working else "warning", title, tuple(ev),
                 _stall_fix(stall, still, engine_of(ctx, tgt)), tgt,
                 since)


# --------------------------------------------------------------------------- a failure's words and fix

_Get = Callable[[str], "str | None"]

PACKAGE_FOR_MODULE = {"flashinfer": "flashinfer-python", "vllm_flash_attn": "vllm-flash-attn", "cv2": "opencv-python"}


def _kv_fit(avail: str | None) -> str:
    """A KV cache size in whole GiB that fits in ``avail`` GiB with a little room (at least 1)."""
    try:
        return str(max(1, int(float(avail or "") * 0.8)))
    except ValueError:
        return "N"


def _util_fit(free: str | None, total: str | None) -> str:
    """A --gpu-memory-utilization that fits in what is free, two points under it (the memory budget's number,
    vtop/core/membudget.py)."""
    from vtop.core.membudget import util_that_fits

    try:
        t = float(total or "")
        return f"{util_that_fits(t, t - float(free or '')):.2f}"
    except (ValueError, ZeroDivisionError):
        return "what is free"


class FailureWords(NamedTuple):
    """What a failure is called and its usual fix."""

    message: str
    fix: str


def failure_words(f: Failure, budgets: Sequence[MemoryBudget] = ()) -> FailureWords:
    """The words of a failure the tracker decided on (its kind, the telling line's details, its phase):
    one place for them, the startup panel's, the startup-failure and engine-death rules'. ``budgets``: the
    start's memory budget (:attr:`vtop.core.evidence.Evidence.memory_budget`); where it has a KV cache size that
    fits (a start that failed for memory after profiling, an engine and version with the flag), the fix ends with
    the budget's own words for it (:meth:`~vtop.core.membudget.MemoryBudget.fit_words`), else it is unchanged.
    A CUDA OOM's words stay without it: the OOM rules name those, in their own fix."""
    msg, fix = _fix_text(f.kind, f.get, f.phase, f.engine)
    return FailureWords(msg, fix if is_oom_failure(f) else fix + _budget_fit(budgets))


def _budget_fit(budgets: Sequence[MemoryBudget]) -> str:
    """' Beside what else holds gpu0 now, the memory budget says at most: fits: ... or ... 35G.' ('' when the budget
    has no KV cache size that fits): the budget's words, read, never worked out again here."""
    from vtop.core.membudget import kv_fit

    b = kv_fit(budgets)
    words = b.fit_words() if b is not None else None
    if b is None or words is None:
        return ""
    gpu = "the GPU" if b.gpu is None else f"gpu{b.gpu}"
    n = sum(1 for x in budgets if x.kv_bytes_fit is not None)
    if n > 1:
        gpu += f" (the fullest of {n})"
    # a max_model_len failure's words are a range (from what holds one full-length request to what fits)
    says = "says" if b.util_len is not None and b.util_fit is not None and b.util_len < b.util_fit else "says at most"
    return f" Beside what else holds {gpu} now, the memory budget {says}: {words}."


def _cuda_oom(g: _Get, where: str, fl: Mapping[str, str]) -> tuple[str, str]:
    amt = g("amt")
    return (f"CUDA out of memory{where}" + (f" (tried to allocate {amt})" if amt else ""),
            f"Check no other process holds GPU memory (nvidia-smi). Then lower {fl['len']} or {fl['seqs']}, "
            f"use a smaller or quantized model, or spread it with {fl['tp']}; lower "
            f"{fl['mem']} if the GPU is shared. During CUDA graph capture, {fl['eager']} avoids it.")


def _kv_no_memory(g: _Get, where: str, fl: Mapping[str, str]) -> tuple[str, str]:
    now = g("frac")
    return ("no GPU memory left for the KV cache",
            f"The weights and activations left nothing for the KV cache: raise {fl['mem']}"
            + (f" (now {now})" if now else "") + ", free the "
            f"GPU of other processes, use a quantized model, or add GPUs with {fl['tp']}.")


def _kv_host_memory(g: _Get, where: str, fl: Mapping[str, str]) -> tuple[str, str]:
    req, avail, total, node = g("req"), g("avail"), g("total"), g("node")
    return (f"out of memory for the KV cache: {req} GiB asked, {avail} of {total} GiB available on NUMA node {node}",
            f"Size the KV cache to what the host has: on the CPU backend VLLM_CPU_KVCACHE_SPACE={_kv_fit(avail)} (GiB) "
            f"or less, or {fl['kv_bytes']} {_kv_fit(avail)}G; or free host memory that other processes hold. "
            f"A shorter {fl['len']} or a lower {fl['seqs']} lets a smaller cache serve. On a GPU the same "
            f"failure is sized with {fl['mem']}, {fl['len']}, {fl['seqs']} or {fl['kv_bytes']}.")


def _gpu_free_at_start(g: _Get, where: str, fl: Mapping[str, str]) -> tuple[str, str]:
    free, total, util, req = g("free"), g("total"), g("util"), g("req")
    return (f"not enough free GPU memory at start: {free} of {total} GiB free, {fl['mem']} {util} "
            f"asks for {req} GiB",
            "Another process holds GPU memory (nvidia-smi shows it): stop or move it, or lower "
            f"{fl['mem']} to {_util_fit(free, total)} or less (what is free beside it). A lower "
            f"{fl['len']} or {fl['seqs']}" + (f", or {fl['kv_bytes']}," if fl["kv_bytes"] else "")
            + f" makes {fl['name']} need less.")


def _max_model_len(g: _Get, where: str, fl: Mapping[str, str]) -> tuple[str, str]:
    est = g("est")
    length = g("len") or g("len0")
    target = f"{fl['len']} {est}" if est else f"a smaller {fl['len']}"
    return (f"the KV cache cannot hold one request of max_model_len {length}" if length else "max_model_len too large",
            f"Pass {target}, raise {fl['mem']}, or add GPUs with {fl['tp']} "
            "so one full-length request fits in the KV cache.")


def _module_not_found(g: _Get, where: str, fl: Mapping[str, str]) -> tuple[str, str]:
    mod = g("mod") or "?"
    top = mod.split(".")[0]
    if top == "flashinfer":
        fix = (f"{fl['name']} imports flashinfer but it is not installed: pip install flashinfer-python (built for "
               f"your torch/CUDA){fl['flashinfer_off']}.")
    else:
        pkg = PACKAGE_FOR_MODULE.get(top, top)
        fix = f"Install it in {fl['name']}'s environment (pip install {pkg}) or turn off the feature that imports it."
    return f"Python module '{mod}' is missing", fix


def _model_len_too_long(g: _Get, where: str, fl: Mapping[str, str]) -> tuple[str, str]:
    length, pos = g("len"), g("pos")
    return (f"{fl['len']} {length} is longer than the model allows" + (f" ({pos} positions)" if pos else ""),
            f"Pass {fl['len']} {pos or 'N'} or less (the model's max_position_embeddings), or set "
            "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 only for a model whose position encoding (RoPE scaling) really "
            "supports more: past it, outputs go wrong.")


def _worker_died(g: _Get, where: str, fl: Mapping[str, str]) -> tuple[str, str]:
    code = g("code")
    who = g("who") or ""
    if code == "-9":
        return (f"worker {who} was killed (signal 9), most likely by the kernel's OOM killer".replace("  ", " "),
                "Confirm it was the OOM killer: dmesg -T | grep -i -e 'killed process' -e 'out of memory' (or "
                f"journalctl -k). Then give it less to hold: lower {fl['seqs']} or {fl['len']}, or size the KV "
                f"cache ({fl['kv_bytes'] or fl['mem']}; on the CPU backend VLLM_CPU_KVCACHE_SPACE), or free host "
                "memory.")
    return (f"worker {who} died".replace("  ", " ") + (f" (exit code {code})" if code else ""),
            "The worker's traceback is just above this line (filter the log to errors).")


def _engine_died(g: _Get, where: str, fl: Mapping[str, str]) -> tuple[str, str]:
    return ("the engine process died",
            "Look for the engine's traceback or an OOM kill (dmesg | grep -i 'killed process') just before this "
            "line; the API server exits afterwards, and its exit code says nothing.")


def _engine_init_failed(g: _Get, where: str, fl: Mapping[str, str]) -> tuple[str, str]:
    return (f"engine failed to start{where}",
            "The root cause is the first error or traceback before this line (filter the log to errors).")


def _exception(g: _Get, where: str, fl: Mapping[str, str]) -> tuple[str, str]:
    return (f"{g('exc') or 'exception'}{where}",
            "The process raised this during startup and exited; the traceback above shows where.")


#: a failure's kind (the tracker's decision) -> its words
#: each fix names the flags of the failing engine (:data:`vtop.core.engines.ENGINE_FLAGS`)
_WORDS: dict[str, Callable[[_Get, str, Mapping[str, str]], tuple[str, str]]] = {
    "cuda_oom": _cuda_oom, "kv_no_memory": _kv_no_memory, "kv_host_memory": _kv_host_memory,
    "gpu_free_at_start": _gpu_free_at_start, "max_model_len": _max_model_len, "module_not_found": _module_not_found,
    "model_len_too_long": _model_len_too_long, "worker_died": _worker_died, "engine_died": _engine_died,
    "engine_init_failed": _engine_init_failed,
}


def _fix_text(kind: str, g: _Get, phase: Phase | None, engine: str | None = None) -> tuple[str, str]:
    """(short message, usual fix) for a failure kind; ``g`` reads the telling line's details by name; the
    flags named are ``engine``'s."""
    where = f" during {phase.label}" if phase and phase is not Phase.READY else ""
    return _WORDS.get(kind, _exception)(g, where, flags_of(engine))
