"""What the startup tracker reports: phases, their progress, the snapshot.

Kept apart from the log's patterns and the tracker (:mod:`vtop.core.phases.patterns`, some sixty
regular expressions compiled at import; :mod:`vtop.core.phases.tracker`) so the dashboard can draw
its first frame, and the panels can name phases, without paying for the parser until a log is
actually read. :mod:`vtop.core.phases` gives all three, the parser only when it is asked for.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields

from vtop.core.phases.phase import Phase

_LEVEL_NUM = {"DEBUG": 10, "INFO": 20, "WARNING": 30, "ERROR": 40, "CRITICAL": 50}

#: uvicorn's access line of an endpoint monitors poll (vLLM's and SGLang's API servers both write them):
#: ``INFO:     127.0.0.1:50844 - "GET /metrics HTTP/1.1" 200 OK``.
_PROBE = re.compile(r'"GET /(?:metrics|health|version|v1/models|ping)/?(?:\?[^ "]*)? HTTP/[\d.]+" 200')

_ORDER = list(Phase)
_INDEX = {p: i for i, p in enumerate(_ORDER)}

_STALL_HINTS = {
    Phase.PROCESS_START: "no line since the start: Python imports and the EngineCore spawn take 20-60 s; "
    "far longer usually means a hung import or a slow filesystem (py-spy dump shows where)",
    Phase.ENGINE_INIT: "engine init waits on the workers: often NCCL/distributed init blocked by a busy or "
    "missing GPU (check nvidia-smi, NCCL_DEBUG=INFO)",
    Phase.WEIGHTS: "weights load this slowly from a slow disk, a network filesystem or a download; check I/O",
    Phase.TORCH_COMPILE: "a first torch.compile of a big model takes minutes (cached starts are fast); "
    "--enforce-eager skips it",
    Phase.MEMORY_PROFILING: "the profiling run is stuck; py-spy dump of the EngineCore/worker shows where",
    Phase.KV_CACHE: "KV cache allocation is stuck; check GPU memory and the EngineCore process",
    Phase.CUDA_GRAPHS: "CUDA graph capture can hang (vllm issues #15935, #23378); --enforce-eager skips it",
    Phase.WARMUP: "warmup after graph capture is silent for ~20 s normally; longer means a hang",
    Phase.API_SERVER: "the engine is up but the HTTP server has not started; check the API server process",
}
#: the hints that differ where the log is SGLang's (by the engine fact its record format sets); the others
#: hold for both. SGLang's processes: the launcher, ``sglang::scheduler`` (one per GPU rank), ``sglang::detokenizer``.
_STALL_HINTS_BY_ENGINE: dict[str, dict[Phase, str]] = {
    "sglang": {
        Phase.PROCESS_START: "no line since the start: imports and the scheduler's spawn take 20-60 s; far longer "
        "usually means a hung import or a slow filesystem (py-spy dump shows where)",
        Phase.ENGINE_INIT: "the scheduler waits on torch distributed init: often NCCL blocked by a busy or missing "
        "GPU (check nvidia-smi, NCCL_DEBUG=INFO)",
        Phase.MEMORY_PROFILING: "the memory pool sizing is stuck; py-spy dump of sglang::scheduler shows where",
        Phase.KV_CACHE: "KV pool allocation is stuck; check GPU memory and the sglang::scheduler process",
        Phase.CUDA_GRAPHS: "CUDA graph capture can hang; --disable-cuda-graph skips it, a lower --cuda-graph-max-bs "
        "captures fewer",
        Phase.WARMUP: "the first kernels are compiled (JIT) on first use; a long silence here is that or a hang "
        "(py-spy dump of sglang::scheduler)",
        Phase.API_SERVER: "the HTTP server is up and sends itself a warmup request; no 'fired up' line means the "
        "scheduler does not answer it",
    },
}


def stall_hint(phase: Phase | None, engine: str | None = None) -> str:
    """What usually stalls ``phase``, in the words of the engine whose log it is (None: vLLM's)."""
    if phase is None:
        return ""
    own = _STALL_HINTS_BY_ENGINE.get(engine or "", {})
    return own.get(phase) or _STALL_HINTS.get(phase, "")


@dataclass(frozen=True)
class Progress:
    """A progress bar's latest frame (weights shards, CUDA graphs of one kind)."""

    label: str
    n: int
    total: int

    @property
    def fraction(self) -> float:
        return self.n / self.total if self.total else 0.0


@dataclass(frozen=True)
class RankTiming:
    """When one tensor-parallel rank (one process) finished a phase."""

    name: str  # process tag, e.g. "Worker_TP1"; "main" for untagged lines
    key: str  # pid, or "main"
    end: float
    duration_s: float | None


@dataclass(frozen=True)
class PhaseView:
    """One phase of the current start, with times on the log's clock (seconds)."""

    phase: Phase
    start: float | None
    end: float | None
    start_arrival: float | None
    progress: tuple[Progress, ...] = ()
    ranks: tuple[RankTiming, ...] = ()

    @property
    def label(self) -> str:
        return self.phase.label

    @property
    def done(self) -> bool:
        return self.end is not None

    @property
    def duration_s(self) -> float | None:
        if self.start is None or self.end is None:
            return None
        return max(0.0, self.end - self.start)

    @property
    def slowest_rank(self) -> RankTiming | None:
        return max(self.ranks, key=lambda r: r.end) if self.ranks else None

    def progress_for(self, label: str) -> Progress | None:
        return next((p for p in self.progress if p.label == label), None)


@dataclass(frozen=True)
class Failure:
    """Why a start (or a running engine) died: its kind and the telling line. What it is called and its
    usual fix are the startup rules' words (:func:`vtop.core.rules.startup.failure_words`)."""

    kind: str  # cuda_oom, kv_no_memory, kv_host_memory, gpu_free_at_start, max_model_len, module_not_found, exception,
    #            engine_init_failed, engine_died, worker_died, model_len_too_long
    line: str
    phase: Phase | None
    at: float | None
    arrival: float
    detail: tuple[tuple[str, str], ...] = ()
    """What the telling line says, by name (``amt``, ``req``, ``avail``, ``mod``, ``code``...)."""
    #: the engine whose log it is ("sglang" where the log's format said so; None: vLLM's or not known): the
    #: fix's flags are that engine's (:data:`vtop.core.engines.ENGINE_FLAGS`)
    engine: str | None = None

    def get(self, name: str) -> str | None:
        return next((v for k, v in self.detail if k == name), None)


@dataclass(frozen=True)
class StallInfo:
    """A start that has printed nothing and made no progress for too long."""

    phase: Phase | None
    silent_s: float
    last_line: str
    hint: str

    @property
    def label(self) -> str:
        return self.phase.label if self.phase else "start"


@dataclass(frozen=True)
class Quiet:
    """A start in progress at one moment, whatever the stall threshold: how long its log has been
    silent, and whether the current phase prints progress (and how fast it went)."""

    phase: Phase | None
    #: seconds since the last line or progress step, as of ``mono`` (arrival clock)
    silent_s: float
    last_line: str
    hint: str
    #: the current phase shows a progress bar that is not complete (shards N/M, graphs N/M)
    progressing: bool
    #: the longest step of that phase's bars so far (None: no step seen yet)
    step_s: float | None
    #: the monotonic time this was read (a log view is read when the log is polled, not every tick)
    mono: float = 0.0

    @property
    def label(self) -> str:
        return self.phase.label if self.phase else "start"

    def silent_at(self, now: float) -> float:
        """Seconds of silence at monotonic ``now`` (no line can have come since it was read, or it
        would have been read again)."""
        return self.silent_s + max(0.0, now - self.mono)

    def as_stall(self, now: float) -> StallInfo:
        return StallInfo(self.phase, self.silent_at(now), self.last_line, self.hint)


@dataclass(frozen=True)
class StartupFacts:
    """Numbers the log reports during a start. ``None`` means not (yet) reported."""

    version: str | None = None
    #: the engine whose log this is, by its line format: "sglang", else None (vLLM's)
    engine: str | None = None
    model: str | None = None
    architecture: str | None = None
    engine_version: str | None = None
    tensor_parallel_size: int | None = None
    pipeline_parallel_size: int | None = None
    enforce_eager: bool | None = None
    max_model_len: int | None = None
    weights_load_s: float | None = None
    model_memory_gib: float | None = None
    model_load_s: float | None = None
    compile_s: float | None = None
    compile_cached: bool | None = None
    profile_run_s: float | None = None
    profiling_s: float | None = None
    kv_cache_gib: float | None = None
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    max_concurrency_len: int | None = None
    gpu_blocks: int | None = None
    cpu_blocks: int | None = None
    graph_capture_s: float | None = None
    graph_memory_gib: float | None = None
    graph_memory_estimate_gib: float | None = None
    #: "CUDA graph memory profiling is enabled" (True: vLLM subtracted its CUDA graph estimate from the KV cache)
    #: or "... is disabled" (False: it did not); None: neither logged (no estimate above 0, or a version before it)
    graph_memory_profiled: bool | None = None
    #: "Available KV cache memory: K GiB" (GiB; the smallest over ranks; 0 or below where nothing was left)
    kv_available_gib: float | None = None
    init_engine_s: float | None = None
    #: the memory budget vLLM logs after profiling (GiB; per GPU, the largest over ranks)
    mem_total_gib: float | None = None
    mem_free_at_start_gib: float | None = None
    gpu_memory_utilization: float | None = None
    #: --max-num-batched-tokens where the API server's non-default args give it
    max_num_batched_tokens: int | None = None
    mem_requested_gib: float | None = None
    weights_gib: float | None = None
    activation_peak_gib: float | None = None
    non_torch_gib: float | None = None
    consumed_gib: float | None = None
    cuda_graph_gib: float | None = None
    init_compilation_s: float | None = None
    url: str | None = None
    shm_broadcast_waits: int = 0


_FACT_NAMES = frozenset(f.name for f in fields(StartupFacts))


@dataclass(frozen=True)
class StartupSnapshot:
    """Everything the tracker knows about the current start, frozen."""

    state: str  # "idle" | "starting" | "ready" | "failed" | "stopped"
    phases: tuple[PhaseView, ...]
    current: Phase | None
    facts: StartupFacts
    failure: Failure | None
    started: float | None
    ready_at: float | None
    ready_source: str | None  # "log" | "health" | "inferred"
    restarts: int
    world_size: int | None

    def phase(self, phase: Phase) -> PhaseView | None:
        return next((v for v in self.phases if v.phase is phase), None)

    @property
    def sequence(self) -> tuple[Phase, ...]:
        return tuple(v.phase for v in self.phases)

    @property
    def total_s(self) -> float | None:
        """Start (launch when known, else the first line) to ready."""
        if self.started is None or self.ready_at is None:
            return None
        return self.ready_at - self.started

    @property
    def died_after_ready_s(self) -> float | None:
        """A start that was ready and whose engine then died: how long after ready it died (the
        start itself did not fail: it stays "ready in ..."; the death is its own fact). None otherwise."""
        f = self.failure
        if self.state != "failed" or f is None or f.phase is not Phase.READY or self.ready_at is None:
            return None
        return max(0.0, f.at - self.ready_at) if f.at is not None else 0.0


@dataclass(slots=True)
class LogLine:
    """A line kept for the log pane (plain and slotted: one per line; treat as read-only)."""

    arrival: float
    t: float | None
    level: str | None
    text: str
    proc: str | None
    progress: str | None = None  # bar name for tqdm frames (consecutive frames collapse)
    probe: bool = field(init=False)
    """An access line of a monitoring endpoint (``"GET /metrics HTTP/1.1" 200``: vtop's own scrapes,
    health checks): the log pane hides them unless asked. Decided once, when the line is read (the pane
    counted them over its whole ring of lines at every tick)."""

    def __post_init__(self) -> None:
        self.probe = "GET /" in self.text and _PROBE.search(self.text) is not None

    def at_least(self, level: str) -> bool:
        return _LEVEL_NUM.get(self.level or "INFO", 20) >= _LEVEL_NUM.get(level, 20)


