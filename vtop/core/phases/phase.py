"""The startup phases themselves: :class:`Phase`, in the order vLLM goes through them, and their labels.

Apart from :mod:`vtop.core.phases.types` (the tracker's snapshot and its dataclasses, re-exported from there
and from :mod:`vtop.core.phases`): the monitor and the rules name phases on every start, while the snapshot's
types are needed only where a log is read (a ``vtop --once`` without a log does not load them: issue 43).
"""

from __future__ import annotations

from enum import Enum

__all__ = ["Phase"]


class Phase(Enum):
    """Startup phases, in the order vLLM goes through them."""

    PROCESS_START = "process_start"
    ENGINE_INIT = "engine_init"
    WEIGHTS = "weights"
    TORCH_COMPILE = "torch_compile"
    MEMORY_PROFILING = "memory_profiling"
    KV_CACHE = "kv_cache"
    CUDA_GRAPHS = "cuda_graphs"
    WARMUP = "warmup"
    API_SERVER = "api_server"
    READY = "ready"

    @property
    def label(self) -> str:
        return _LABELS[self]


_LABELS = {
    Phase.PROCESS_START: "process start",
    Phase.ENGINE_INIT: "engine init",
    Phase.WEIGHTS: "loading weights",
    Phase.TORCH_COMPILE: "torch.compile",
    Phase.MEMORY_PROFILING: "memory profiling",
    Phase.KV_CACHE: "KV cache sizing",
    Phase.CUDA_GRAPHS: "CUDA graph capture",
    Phase.WARMUP: "warmup",
    Phase.API_SERVER: "API server starting",
    Phase.READY: "ready",
}
