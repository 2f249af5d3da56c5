"""The engines vtop watches, as tables: what each calls the knobs a fix names.

The rules say what to change in the engine's own words (its flags): they look the words up here by the
engine of the server or log (``ServerProcess.engine``, ``StartupFacts.engine``, ``Failure.engine``), so no
rule module names an engine. vLLM's flags are its CLI's (``vllm serve --help``); SGLang's were read in
SGLang 0.5.17's ``python/sglang/srt/server_args.py`` (``--mem-fraction-static``: the fraction of the GPU's
memory for weights and the KV pool, what is left is for activations and CUDA graphs, so an OOM while serving
asks for a lower one and "Not enough memory" at start for a higher one, as vLLM's
``--gpu-memory-utilization``; ``--max-running-requests``; ``--context-length``; ``--chunked-prefill-size``;
``--tp-size``; ``--disable-cuda-graph``; ``--cuda-graph-max-bs``, the largest batch captured).
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["ENGINE_FLAGS", "ENGINES", "flags_of"]

#: role -> the engine's words. ``mem``: the memory fraction it takes; ``seqs``: the cap on requests in a
#: batch; ``len``: the longest request; ``chunk``: a step's prefill budget (``chunk_how``: how to lower it);
#: ``tp``: tensor parallelism; ``eager``: no CUDA graphs; ``graph_bs``: fewer CUDA graph sizes; ``name``.
ENGINE_FLAGS: Mapping[str, Mapping[str, str]] = {
    "vllm": {
        "name": "vLLM", "mem": "--gpu-memory-utilization", "seqs": "--max-num-seqs", "len": "--max-model-len",
        "chunk": "--max-num-batched-tokens",
        "chunk_how": "--enable-chunked-prefill (always on in V1) with a lower --max-num-batched-tokens, e.g. 2048",
        "tp": "--tensor-parallel-size", "eager": "--enforce-eager",
        "graph_bs": "--max-num-seqs (fewer graph sizes)",
    },
    "sglang": {
        "name": "SGLang", "mem": "--mem-fraction-static", "seqs": "--max-running-requests", "len": "--context-length",
        "chunk": "--chunked-prefill-size", "chunk_how": "a lower --chunked-prefill-size, e.g. 2048",
        "tp": "--tp-size", "eager": "--disable-cuda-graph",
        "graph_bs": "--cuda-graph-max-bs (fewer, smaller graphs)",
    },
}
#: the engines known, in the order vtop tries them
ENGINES: tuple[str, ...] = tuple(ENGINE_FLAGS)


def flags_of(engine: str | None) -> Mapping[str, str]:
    """The words of ``engine`` ("vllm", "sglang"); vLLM's for None or an engine not in the table."""
    return ENGINE_FLAGS.get(engine or "vllm", ENGINE_FLAGS["vllm"])
