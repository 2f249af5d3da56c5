"""The GPU memory budget of a vLLM start (issue 40): where the memory went, per GPU.

Pure logic: :func:`memory_budget` reads what vLLM's profiling lines said (the tracker's facts: weights,
non-torch memory, the activation peak, CUDA graphs, the KV cache, against ``--gpu-memory-utilization`` of
the GPU's total; the lines of each version are in :mod:`vtop.core.phases.patterns`' table) and what NVML
says of the GPU now (its total, and the other processes that hold memory on it, by PID). One answer for
every face: ``--once --json``, the snapshot and the startup panel show :meth:`MemoryBudget.to_json` /
:meth:`MemoryBudget.text`.

After a start that failed for memory, :attr:`MemoryBudget.util_fit` is the ``--gpu-memory-utilization``
that fits beside what else holds the GPU (two points under what is free), from NVML's other processes
or, without them, the free memory vLLM saw at start. Where the log gave the parts (the weights and the
activation peak at least: a start that failed after profiling) and the engine's version has an absolute KV
cache size (vLLM's ``--kv-cache-memory-bytes``, from 0.11: :func:`vtop.core.engines.kv_bytes_flag`),
:attr:`MemoryBudget.kv_bytes_fit` is the KV cache that fits in the same room: what is free beside the others,
less the same margin (two points of the total), less the weights, non-torch memory, activation peak and CUDA
graphs; said whole (``30G``: vLLM's parser takes binary suffixes on whole numbers only).

Where the parts line is missing -- the usual case for a real failure: vLLM 0.26 and 0.32 log it at the end of
``compile_or_warm_up_model``, after the KV cache is sized, so "No available memory for the cache blocks" and the
max_model_len check (``kv_cache_utils.py``) raise before it -- but vLLM logged "Available KV cache memory: K GiB"
and the utilization is known (the API server's "non-default args", or the CUDA graph profiling line), everything
but the KV cache is vLLM's own subtraction undone: requested - K (:func:`non_kv_of_available`), and the KV cache and
the utilization that fit follow from it as from the parts. Nothing is taken from a table of defaults: without the
line or the utilization (or the GPU's total) there is no KV size.

The fit is said once, in :meth:`MemoryBudget.fit_words` ("fits: --gpu-memory-utilization 0.26 or
--kv-cache-memory-bytes 35G", each flag the engine's, from :mod:`vtop.core.engines`): the budget's line ends with
it, and the startup-failure rule's fix quotes it where a KV cache size fits (:func:`kv_fit`: the fullest of the
start's GPUs), so the alert, ``--once --json``, doctor and the startup panel say the same words.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from vtop.core.engines import flags_of, kv_bytes_flag

if TYPE_CHECKING:
    from vtop.core.evidence import Evidence
    from vtop.core.phases.types import Failure, StartupFacts

__all__ = ["GRAPH_MARGIN_GIB", "MARGIN", "MEMORY_FAILURES", "MemoryBudget", "kv_bytes_that_fit", "kv_bytes_words",
           "kv_fit", "memory_budget", "non_kv_of_available", "non_kv_of_parts", "util_for_length",
           "util_that_fits"]

GIB = float(1 << 30)
#: the startup failures that are about memory (the tracker's kinds)
MEMORY_FAILURES = frozenset({"gpu_free_at_start", "kv_no_memory", "max_model_len", "cuda_oom"})
#: the parts of vLLM's own budget, in the order of the bar: (fact, words)
PARTS = (("weights_gib", "weights"), ("consumed_gib", "weights + non-torch"), ("non_torch_gib", "non-torch"),
         ("activation_peak_gib", "activation peak"), ("cuda_graph_gib", "CUDA graphs"), ("kv_cache_gib", "KV cache"))
#: the share of the GPU's total a fit keeps free (two points): vLLM's profiling slightly underestimates (its own
#: suggestion keeps 150 MiB), the driver holds a part NVML's total counts, other processes grow
MARGIN = 0.02
#: the room kept for CUDA graphs where vLLM sized the KV cache without them and logged no estimate of its own
#: (vLLM before 0.21; the V2 model runner of 0.26, whose ``profile_cudagraph_memory`` returns 0): graphs are
#: captured after the KV cache is allocated, out of what the utilization leaves. The graph pools in the logs here:
#: 0.19 GiB (the H200's tiny model, vLLM 0.26.0), 0.95 GiB (the reference's example line of a larger model)
GRAPH_MARGIN_GIB = 1.0


@dataclass(frozen=True)
class MemoryBudget:
    """One GPU's memory, in GiB; None: not said (a part vLLM's version does not log, no NVML)."""

    gpu: int | None
    total_gib: float | None
    #: ``--gpu-memory-utilization`` and the GiB it asks for (its share of the total)
    utilization: float | None
    requested_gib: float | None
    #: vLLM's parts as it logged them: (words, GiB), in :data:`PARTS`' order
    parts: tuple[tuple[str, float], ...]
    #: the other processes on this GPU: (pid, GiB); None: NVML gives none, or vtop cannot tell this server's
    others: tuple[tuple[int, float], ...] | None
    #: what vLLM saw free on the GPU at start (its log), and what NVML says is used now
    free_at_start_gib: float | None = None
    used_now_gib: float | None = None
    #: a start that failed for memory: the ``--gpu-memory-utilization`` that fits beside the others
    util_fit: float | None = None
    #: the same start: the absolute KV cache size (bytes) that fits, and the engine's flag for it (None: the
    #: parts were not logged, no room is left for a KV cache, or the engine or its version has no such flag)
    kv_bytes_fit: int | None = None
    kv_bytes_flag: str | None = None
    #: the engine of the start (its flags' words: :func:`vtop.core.engines.flags_of`); None: vLLM's
    engine: str | None = None
    #: everything but the KV cache as vLLM counted it where the parts line is missing: its budget less its
    #: "Available KV cache memory" (:func:`non_kv_of_available`), that K, and the room kept for the CUDA graphs it
    #: did not count (0.0: counted, or none captured); None: not worked out that way
    non_kv_gib: float | None = None
    kv_available_gib: float | None = None
    graph_margin_gib: float | None = None
    #: a start that failed for memory where no fit is proposed because none would work: why, in words (vLLM's own
    #: use leaves no room for a KV cache beside the others, or the KV cache that fits holds no full-length request)
    no_fit: str | None = None
    #: what NVML says is free on the GPU now: its total less its used (None: no NVML reading)
    free_now_gib: float | None = None
    #: a start that failed because its KV cache could not hold one request of max_model_len: the
    #: ``--gpu-memory-utilization`` from which it would (:func:`util_for_length`); None: not that failure, a part
    #: of the arithmetic not known, or more than the whole GPU
    util_len: float | None = None

    @property
    def mem_flag(self) -> str:
        """The engine's flag for the memory fraction (vLLM's ``--gpu-memory-utilization``)."""
        return flags_of(self.engine)["mem"]

    def fit_words(self) -> str | None:
        """After a start that failed for memory, what fits beside the others, in the engine's flags:
        'fits: --gpu-memory-utilization 0.26 or --kv-cache-memory-bytes 35G' (the KV cache size only where the
        parts were logged and the engine's version has the flag); None when nothing is proposed."""
        if self.util_fit is None:
            return None
        kv = (f" or {self.kv_bytes_flag} {kv_bytes_words(self.kv_bytes_fit)}"
              if self.kv_bytes_fit is not None and self.kv_bytes_flag else "")
        low = f"{self.util_len:.2f} to " if self.util_len is not None and self.util_len < self.util_fit else ""
        return f"fits: {self.mem_flag} {low}{self.util_fit:.2f}{kv}"

    @property
    def bar_parts(self) -> tuple[tuple[str, float], ...]:
        """The parts the bar stacks: vLLM's as logged, or where everything but the KV cache came from the
        available KV cache, that sum and the KV cache (the weights alone would be counted twice)."""
        if self.non_kv_gib is None or self.kv_available_gib is None:
            return self.parts
        kv = (("KV cache", self.kv_available_gib),) if self.kv_available_gib > 0 else ()
        return (("all but the KV cache", self.non_kv_gib), *kv)

    @property
    def vllm_gib(self) -> float | None:
        return sum(g for _, g in self.parts) if self.parts else None

    @property
    def others_gib(self) -> float | None:
        return sum(g for _, g in self.others) if self.others is not None else None

    @property
    def free_gib(self) -> float | None:
        """What neither vLLM nor the others hold: the total less vLLM's budget and the others, or what NVML says is
        free now where that is less. vLLM holds more than its budget once its KV cache is allocated: its CUDA context
        (what was in use when it measured the free memory at start) and the CUDA graphs the V2 model runner of 0.26
        captures outside it. On the H100 at --gpu-memory-utilization 0.8 (vLLM 0.26.0,
        tests/corpus/traces/h100-starts-history-budget): the total less the budget left 15.84 GiB, NVML 15.09."""
        if self.total_gib is None or self.others_gib is None:
            return None
        taken = self.requested_gib if self.requested_gib is not None else self.vllm_gib
        if taken is None:
            return None
        left = max(0.0, self.total_gib - taken - self.others_gib)
        return left if self.free_now_gib is None else max(0.0, min(left, self.free_now_gib))

    def text(self) -> str:
        """One line: 'gpu0 139.8 GiB: vLLM's budget 69.9 GiB (--gpu-memory-utilization 0.5): weights 0.04 ...'."""
        head = f"gpu{self.gpu}" if self.gpu is not None else "GPU"
        if self.total_gib is not None:
            head += f" {self.total_gib:.1f} GiB"
        bits = []
        if self.requested_gib is not None:
            u = f" ({self.mem_flag} {self.utilization:g})" if self.utilization is not None else ""
            bits.append(f"vLLM's budget {self.requested_gib:.1f} GiB{u}")
        if self.parts:
            bits.append(" · ".join(f"{w} {g:.2f}" for w, g in self.parts) + " GiB")
        if self.non_kv_gib is not None and self.kv_available_gib is not None:
            graphs = ("; CUDA graphs not counted there, " + f"{self.graph_margin_gib:.2f} GiB kept for them"
                      if self.graph_margin_gib else "")
            bits.append(f"all but the KV cache {self.non_kv_gib:.2f} GiB (the budget less vLLM's available KV "
                        f"cache {self.kv_available_gib:g} GiB{graphs})")
        if self.others is not None:
            bits.append(f"other processes {self.others_gib:.1f} GiB" + (
                " (" + ", ".join(f"pid {p} {g:.1f}" for p, g in self.others[:3]) + ")" if self.others else ""))
        if self.free_gib is not None:
            bits.append(f"free {self.free_gib:.1f} GiB")
        fit = self.fit_words()
        if fit is not None:
            bits.append(fit)
        elif self.no_fit is not None:
            bits.append(self.no_fit)
        return head + ": " + "; ".join(bits) if bits else head + ": no budget logged yet"

    def to_json(self) -> dict[str, Any]:
        r = _r
        return {"gpu": self.gpu, "total_gib": r(self.total_gib), "gpu_memory_utilization": self.utilization,
                "requested_gib": r(self.requested_gib), "parts_gib": {w: r(g) for w, g in self.parts},
                "vllm_gib": r(self.vllm_gib), "others": None if self.others is None else
                [{"pid": p, "gib": r(g)} for p, g in self.others], "others_gib": r(self.others_gib),
                "free_gib": r(self.free_gib), "free_at_start_gib": r(self.free_at_start_gib),
                "used_now_gib": r(self.used_now_gib), "free_now_gib": r(self.free_now_gib), "util_fit": self.util_fit,
                "kv_cache_memory_bytes_fit": self.kv_bytes_fit if self.kv_bytes_flag else None,
                "non_kv_gib": r(self.non_kv_gib), "kv_available_gib": self.kv_available_gib,
                "graph_margin_gib": r(self.graph_margin_gib), "no_fit": self.no_fit, "util_len": self.util_len,
                "text": self.text()}


def kv_fit(budgets: Sequence[MemoryBudget]) -> MemoryBudget | None:
    """The budget whose words the startup-failure rule's fix quotes: of the start's GPUs with a KV cache size that
    fits (and the engine's flag for it), the one where the least fits (the fullest GPU: what fits there fits on
    each, as ``--kv-cache-memory-bytes`` is per GPU); None when none has one (the fix stays without it)."""
    fits = [b for b in budgets if b.kv_bytes_fit is not None and b.kv_bytes_flag and b.util_fit is not None]
    return min(fits, key=lambda b: (b.kv_bytes_fit or 0, b.util_fit or 0.0)) if fits else None


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


def util_that_fits(total_gib: float, held_gib: float, margin: float = MARGIN) -> float:
    """The ``--gpu-memory-utilization`` that fits beside ``held_gib`` held by others: ``margin`` under what is
    free (two decimals), 0.05 at least. The startup-failure rule's fix says the same number."""
    frac = (total_gib - held_gib) / total_gib - margin if total_gib > 0 else 0.0
    return max(0.05, round(frac, 2))


def util_for_length(util: float, total_gib: float, need_gib: float, avail_gib: float) -> float | None:
    """The ``--gpu-memory-utilization`` from which one request of max_model_len fits, after vLLM's "To serve at
    least one request with the model's max seq len (L), (N GiB KV cache is needed, which is larger than the
    available KV cache memory (A GiB)": vLLM sized the KV cache as its budget (``util`` x the total) less all else,
    so A grows by the total for each whole 1.0 of the utilization; what it lacked (N - A, and 0.02 GiB for the
    logs' rounding) over the total, added to ``util``, rounded up to two decimals as the flag is written. None
    above 1.0 (no utilization holds it on this GPU) or without a total."""
    if total_gib <= 0:
        return None
    u = math.ceil(round((util + (need_gib - avail_gib + 0.02) / total_gib) * 100, 6)) / 100
    return u if u <= 1.0 else None


def kv_bytes_that_fit(total_gib: float, held_gib: float, non_kv_gib: float, margin: float = MARGIN) -> int | None:
    """The KV cache (bytes) that fits beside ``held_gib`` held by others: what is free less :func:`util_that_fits`'
    margin (``margin`` of the total), less everything of vLLM's but the KV cache (``non_kv_gib``: the parts'
    :func:`non_kv_of_parts`, or :func:`non_kv_of_available`), rounded down to whole MiB; None when nothing is left."""
    room = total_gib - held_gib - margin * total_gib - non_kv_gib
    return int(room * 1024) * (1 << 20) if room * 1024 >= 1 else None


def non_kv_of_parts(parts: tuple[tuple[str, float], ...]) -> float | None:
    """Every logged part of the budget but the KV cache (weights, non-torch memory, the activation peak, CUDA
    graphs); None without the weights and the activation peak (the parts line was not logged)."""
    got = dict(parts)
    if "activation peak" not in got or not ({"weights", "weights + non-torch"} & set(got)):
        return None
    return sum(g for w, g in parts if w != "KV cache")


def non_kv_of_available(requested_gib: float, available_gib: float) -> float:
    """Everything but the KV cache as vLLM counted it when it sized the KV cache: its budget less the "Available KV
    cache memory" it logged, its own subtraction undone. vLLM 0.32.0's ``vllm/v1/worker/gpu_worker.py``,
    ``Worker.determine_available_memory``::

        self.available_kv_cache_memory_bytes = (
            self.requested_memory                       # request_memory(): ceil(total_memory * utilization)
            - profile_result.non_kv_cache_memory        # mem_utils.memory_profiling(): total_consumed (weights,
                                                        # non-torch, from free memory) + transient_peak_headroom
            - cudagraph_memory_estimate_applied)        # the CUDA graph estimate, 0 with
                                                        # VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0 or no estimate
        logger.info_once("Available KV cache memory: %s GiB", format_gib(...))

    then ``vllm/v1/core/kv_cache_utils.py`` ``_check_enough_kv_cache_memory`` raises "No available memory for the
    cache blocks" (K <= 0) or "To serve at least one request with the model's max seq len (L), (G GiB KV cache is
    needed, which is larger than the available KV cache memory (K' GiB)" (K' is K less one block in 0.32.0's
    ``check_enough_kv_cache_memory``), before the parts line. vLLM 0.26.0 (the V2 model runner, recorded on an
    H200: tests/fixtures/logs/vllm-0.26.0-h200-startup.log): "Available KV cache memory: 69.45 GiB" of a 69.9 GiB
    budget, 0.45 GiB = weights 0.04 + activation peak 0.18 + non-torch 0.22 (its parts line, logged later), the
    0.19 GiB of CUDA graphs not in it: that runner's ``profile_cudagraph_memory`` returns 0. Where the CUDA graph
    estimate was subtracted vLLM says so ("CUDA graph memory profiling is enabled", 0.21+:
    :attr:`~vtop.core.phases.types.StartupFacts.graph_memory_profiled`); elsewhere :func:`_graph_margin` keeps room.

    ``requested_gib`` is the utilization times the total vtop knows (NVML's where vLLM's own is not logged: larger
    than CUDA's by the driver's part, so this comes out a little larger, never smaller, than vLLM's); K is said to
    two decimals."""
    return requested_gib - available_gib


def _graph_margin(f: StartupFacts) -> float:
    """The GiB of CUDA graphs vLLM did not subtract before sizing the KV cache: 0 where it did ("CUDA graph memory
    profiling is enabled") or captures none (``enforce_eager=True`` in its config); its own estimate where it logged
    one but did not subtract it (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0); else :data:`GRAPH_MARGIN_GIB`."""
    if f.graph_memory_profiled or f.enforce_eager:
        return 0.0
    if f.graph_memory_estimate_gib is not None and f.graph_memory_profiled is False:
        return f.graph_memory_estimate_gib
    return GRAPH_MARGIN_GIB


def kv_bytes_words(n: int | None) -> str:
    """``--kv-cache-memory-bytes``' words for ``n`` bytes, rounded down: whole GiB (``30G``) from 1 GiB, else
    whole MiB (``512M``); vLLM's ``human_readable_int`` reads an upper-case suffix as binary, whole numbers only."""
    if n is None:
        return "?"
    return f"{n >> 30}G" if n >= 1 << 30 else f"{n >> 20}M"


def _parts(f: StartupFacts) -> tuple[tuple[str, float], ...]:
    vals = {name: getattr(f, name) for name, _ in PARTS}
    if vals["weights_gib"] is None and vals["consumed_gib"] is None:
        vals["weights_gib"] = f.model_memory_gib  # "Model loading took W GiB"
    if vals["cuda_graph_gib"] is None:
        vals["cuda_graph_gib"] = f.graph_memory_gib  # "Graph capturing finished in S secs, took G GiB"
    if vals["consumed_gib"] is not None:
        vals["weights_gib"] = vals["non_torch_gib"] = None  # the sum is said, not its halves: no double count
    return tuple((words, vals[name]) for name, words in PARTS if vals[name] is not None)


def memory_budget(ev: Evidence) -> list[MemoryBudget]:
    """The followed start's budget, one per GPU its server is on (from the last GPU samples); one without a
    GPU index when NVML gives nothing (the log's numbers alone); [] when neither says anything."""
    snap = ev.startup
    f = snap.facts if snap is not None else None
    parts = _parts(f) if f is not None else ()
    url = ev.log_target
    failed_for_memory = snap.failure if (snap is not None and snap.state == "failed" and snap.failure is not None
                                         and snap.failure.kind in MEMORY_FAILURES
                                         and snap.died_after_ready_s is None) else None
    proc = ev.process_of(url)
    mine: set[int] | None = {int(p) for p in proc.gpu_pids} if proc is not None else None
    if mine is None and failed_for_memory is not None:
        # the start failed and its processes are gone: what holds the GPU is no vLLM process vtop knows
        mine = set(ev.pid_owner)
    idxs = [i for i, owners in ev.gpu_owner.items() if url in owners] if url is not None else []
    tracks = ev.gpus.tracks if ev.gpus is not None else {}
    if not idxs and len(tracks) == 1:
        idxs = list(tracks)  # one GPU: the start's, whoever is seen on it
    out = []
    for idx in sorted(idxs):
        s = tracks[idx].last if idx in tracks else None
        if s is None or s.lost:
            continue
        # vLLM's total (CUDA's, what --gpu-memory-utilization is a share of) over NVML's (with the driver's part)
        total = f.mem_total_gib if f is not None and f.mem_total_gib else (s.mem_total / GIB if s.mem_total else None)
        others = None
        if mine is not None and s.procs is not None:
            others = tuple(sorted(((int(p.pid), (p.used_bytes or 0) / GIB) for p in s.procs
                                   if int(p.pid) not in mine and p.used_bytes), key=lambda x: -x[1]))
        free_now = (s.mem_total - s.mem_used) / GIB if s.mem_total and s.mem_used is not None else None
        out.append(replace(_budget(idx, total, f, parts, others, s.mem_used / GIB if s.mem_used is not None else None,
                                   failed_for_memory), free_now_gib=free_now))
    if not out and f is not None and (parts or f.mem_total_gib is not None or failed_for_memory is not None):
        out.append(_budget(None, f.mem_total_gib, f, parts, None, None, failed_for_memory))
    return out


def _num(s: str | None, default: float | None) -> float | None:
    try:
        return float(s) if s else default
    except ValueError:
        return default


def _budget(idx: int | None, total: float | None, f: StartupFacts | None, parts: tuple[tuple[str, float], ...],
            others: tuple[tuple[int, float], ...] | None, used: float | None,
            failure: Failure | None) -> MemoryBudget:
    failed = failure is not None
    util = f.gpu_memory_utilization if f is not None else None
    req = f.mem_requested_gib if f is not None else None
    if req is None and util is not None and total is not None:
        req = util * total
    free0 = f.mem_free_at_start_gib if f is not None else None
    if failure is not None and failure.kind == "gpu_free_at_start":
        # "Free memory on device cuda:0 (38.77/139.8 GiB) on startup is less than desired GPU memory
        # utilization (0.5, 69.9 GiB)": the failure line says it all
        free0 = _num(failure.get("free"), free0)
        total = _num(failure.get("total"), total)  # CUDA's total, as vLLM measured it
        util = _num(failure.get("util"), util)
        req = _num(failure.get("req"), req)
    fit = kv = no_fit = None
    held = sum(g for _, g in others) if others is not None else (total - free0 if total and free0 is not None
                                                                  else None)
    # everything but the KV cache: the parts vLLM logged, else its budget less the KV cache it said was available
    non_kv, avail, graphs = non_kv_of_parts(parts), None, 0.0
    if non_kv is None and f is not None and f.kv_available_gib is not None and req is not None:
        avail = f.kv_available_gib
        non_kv, graphs = non_kv_of_available(req, avail), _graph_margin(f)
    if failed and total and held is not None:
        if non_kv is None:
            fit = util_that_fits(total, held)  # the parts are not known: the utilization alone
        else:
            kv = kv_bytes_that_fit(total, held + graphs, non_kv)
            need = _num(failure.get("need"), None) if failure is not None and failure.kind == "max_model_len" else None
            if kv is None:
                kept = f" + CUDA graphs {graphs:.2f}" if graphs else ""
                no_fit = (f"no KV cache fits beside the others: {total - held:.2f} GiB free, vLLM's own "
                          f"{non_kv:.2f}{kept} GiB + the margin {MARGIN * total:.2f} GiB")
            elif need is not None and kv < need * GIB:
                no_fit = (f"the KV cache that fits beside the others ({kv / GIB:.2f} GiB) holds no request of the "
                          f"full length ({need:g} GiB needed)")
                kv = None
            else:
                fit = util_that_fits(total, held + graphs)
    flag = kv_bytes_flag(f.engine, f.version) if f is not None else None
    util_len = None
    if failure is not None and failure.kind == "max_model_len" and util is not None and total:
        need, short = _num(failure.get("need"), None), _num(failure.get("avail"), None)
        if need is not None and short is not None and short < need:
            util_len = util_for_length(util, total, need, short)
    return MemoryBudget(idx, total, util, req, parts, others, free0, used, fit, kv, flag if kv is not None else None,
                        f.engine if f is not None else None, non_kv if avail is not None else None, avail,
                        graphs if avail is not None else None, no_fit, util_len=util_len)
