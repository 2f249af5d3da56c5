"""Diagnosis rules: what is wrong with a vLLM box, why, and the exact fix. Pure: no I/O.

:class:`Diagnoser` is fed once per tick with what vtop already holds (the
server views, the GPU history, the startup tracker's snapshot and stall, the
in-flight requests read from the log) and answers a list of :class:`Alert`,
critical first. It keeps a little state across ticks: when ``running`` last
went from 0 to N, when a request last finished, when the token counters last
moved, how long the KV cache has been full, GPU streaks and memory samples.

Rules (``rule`` ids are stable):

``runaway``
    Requests running, generation tokens rising, and no request finished for
    ``runaway_s`` while ``waiting`` is zero or growing. The usual cause: a
    chat client that omits ``max_tokens`` (vLLM then allows
    ``max_model_len - prompt`` tokens). A busy GPU is *not* required: one
    decode stream on an H200 reads 10-23 % GPU-Util.
``engine_stall``
    ``running > 0`` while the token and finish counters stay flat for
    ``engine_stall_s`` and ``/metrics`` still answers (a frozen engine
    keeps ``/health`` at 200 and freezes the gauges).
``startup_stall`` / ``startup_failure`` / ``engine_died``
    From the startup tracker: a silent start, a failed start (with the
    tracker's fix), an engine that died after it was ready.
``oom_startup`` / ``oom_transient`` / ``oom_steady`` / ``oom_risk``
    A CUDA out-of-memory error (tracker failure or log line), classified by
    when and around what it happened; ``oom_risk`` warns before one when a
    GPU's memory climbs steadily towards full.
``kv_saturation``
    KV cache above ``kv_saturation_pct`` for a while with preemptions rising
    or the queue growing.
``sm_idle``
    GPU-Util high while GPM SM activity stays low (only where the GPU reports
    SM activity; never during a start, where that is expected).
``api_unresponsive``
    An API server that accepts connections and gives no complete ``/metrics`` answer within
    the scraper's deadline for a while (hung, late, or trickling): its event loop is blocked.
``spec_decode_low``
    Speculative decoding whose draft tokens are nearly all rejected for minutes: it costs
    throughput instead of adding it (only where the spec-decode counters are exported).
``queue_wedge``
    ``running`` 0 with requests waiting and the counters flat for ``queue_wedge_s``: the scheduler
    admits nothing (``engine_stall`` needs requests running).
``gpu_neighbour`` / ``gpu_slowdown``
    vLLM's tokens per running request fall while another process runs kernels on its GPU (NVML's
    per-process samples), or while a power or thermal slowdown is on.
``risky_flags``
    Launch flags that invite trouble: no generation cap with a long context,
    ``--mm-processor-cache-gb 0``, ``--max-num-seqs`` far above the KV cache's
    concurrency, ``--gpu-memory-utilization`` that leaves no room next to the
    other processes on the GPU.

What a rule is given is typed: the tick's :class:`~vtop.core.evidence.Evidence` (built by the
monitor) and the diagnoser's :class:`~vtop.core.rules.context.Memory`.

The package: :mod:`.alert` (Alert, Thresholds, the ids), :mod:`.context` (:class:`Memory`, the
:class:`Rule` protocol), :mod:`.state` (what is remembered between ticks), one
module per family (:mod:`.runaway`, :mod:`.stall`, :mod:`.queue`, :mod:`.api`, :mod:`.death`, :mod:`.kv`, :mod:`.oom`,
:mod:`.startup`, :mod:`.gpu`, :mod:`.flags`; each module's docstring names the evidence and the
corpus traces that show it) and :mod:`.diagnoser`, which runs them.
"""

from __future__ import annotations

from vtop.core.rules.alert import RULES, SEVERITIES, Alert, Pending, Thresholds
from vtop.core.rules.context import Evidence, Memory, Rule
from vtop.core.rules.diagnoser import Diagnoser, diagnose_once

__all__ = [
    "Pending",
    "RULES",
    "SEVERITIES",
    "Alert",
    "Diagnoser",
    "Evidence",
    "Memory",
    "Rule",
    "Thresholds",
    "diagnose_once",
]
