"""The engines vtop watches, as tables: what each calls the knobs a fix names.

The rules say what to change in the engine's own words (its flags): they look the words up here by the
engine of the server or log (``ServerProcess.engine``, ``StartupFacts.engine``, ``Failure.engine``), so no
rule module names an engine. vLLM's flags are its CLI's (``vllm serve --help``); SGLang's were read in
SGLang 0.5.17's ``python/sglang/srt/server_args.py`` (``--mem-fraction-static``: the fraction of the GPU's
memory for weights and the KV pool, what is left is for activations and CUDA graphs, so an OOM while serving
asks for a lower one and "Not enough memory" at start for a higher one, as vLLM's
``--gpu-memory-utilization``; ``--max-running-requests``; ``--context-length``; ``--chunked-prefill-size``;
``--tp-size``; ``--disable-cuda-graph``; ``--cuda-graph-max-bs``, the largest batch captured;
``--kv-cache-dtype`` with ``fp8_e4m3`` among its choices; ``--log-requests``, "Log the inputs and outputs of all
requests"). SGLang has no flag for a few roles: no server-side cap on generated tokens (its
``--preferred-sampling-params`` are only returned in ``/get_model_info``), no absolute KV cache size in bytes (its
``--max-total-tokens`` counts tokens), no multimodal processor cache flag: there the role's words are ``""`` and a
fix leaves that advice out.

vLLM's ``--kv-cache-memory-bytes`` (``kv_bytes``): an absolute KV cache size per GPU that bypasses
``--gpu-memory-utilization``, since vLLM 0.11 (``kv_bytes_since``); its parser is ``human_readable_int`` (vLLM's
``vllm/utils/argparse_utils.py``): ``12G`` is 12 GiB (upper-case suffixes are binary, lower-case decimal).
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["ENGINE_FLAGS", "ENGINES", "flags_of", "kv_bytes_flag"]

#: role -> the engine's words. ``mem``: the memory fraction it takes; ``seqs``: the cap on requests in a
#: batch; ``len``: the longest request (``len_word``: what the engine calls that length); ``chunk``: a step's prefill budget (``chunk_how``: how to lower it);
#: ``tp``: tensor parallelism; ``eager``: no CUDA graphs; ``graph_bs``: fewer CUDA graph sizes; ``name``;
#: ``kv_fp8``: an fp8 KV cache; ``log_requests``: log each request (``log_requests_since``: the first version
#: that needs the flag, vLLM's 0.10: before it requests were logged by default); ``gen_cap``: a server-side cap on generated
#: tokens (``{n}``: the cap); ``gen_cap_flag``: the flag that carries it; ``kv_bytes``: an absolute KV cache size
#: (``kv_bytes_since``: the first version with it); ``mm_cache``: the multimodal processor cache's size;
#: ``gen_config``: where generation defaults come from (vLLM's ``auto``/``vllm``/a folder); ``engine_proc``: the
#: process that schedules and steps the engine (what ``d`` dumps first), ``engine_pid`` its pid as a fix's
#: placeholder, ``tp_procs``: the other processes of a TP>1 engine; ``stall_log``: a log line that tells a stuck
#: worker (vLLM's shared-memory broadcast warning); ``serve``: the command that starts a server, ``log_name``
#: the file a fix tees its output to; ``probe_flag``: what keeps uvicorn's access lines of vtop's polls out of the
#: engine's log (vLLM's ``--disable-access-log-for-endpoints``, comma-separated, in newer releases; SGLang
#: 0.5.17's ``--uvicorn-access-log-exclude-prefixes``, paths as separate words, "Defaults to empty");
#: ``preempt_metric``, ``preempt_why``: the counter of requests pushed back for want of KV space, and why it moves;
#: ``logprobs_runner``: a runner that computes prompt logprobs in pieces; ``wedge_seen``: where a wedged queue was
#: seen and what fixed it; ``flashinfer_off``: how to run without flashinfer; ``mem_default``: the memory fraction
#: when its flag is not given (``mem_default_before`` before the version ``mem_default_since``); ``queue_grep``:
#: the /metrics gauges of running and waiting requests, as a grep pattern; ``dead_health``: what a ``/health`` 5xx
#: says of the engine (vLLM: its engine is dead, EngineDeadError; SGLang answers 503 while it warms up or is busy,
#: four of its five real traces: no proof of anything). ``""``: the engine has none (the fix leaves the line out).
#: ``""``: the engine has no such flag.
ENGINE_FLAGS: Mapping[str, Mapping[str, str]] = {
    "vllm": {
        "name": "vLLM", "mem": "--gpu-memory-utilization", "seqs": "--max-num-seqs", "len": "--max-model-len", "len_word": "max_model_len",
        "chunk": "--max-num-batched-tokens",
        "chunk_how": "--enable-chunked-prefill (always on in V1) with a lower --max-num-batched-tokens, e.g. 2048",
        "tp": "--tensor-parallel-size", "eager": "--enforce-eager",
        "graph_bs": "--max-num-seqs (fewer graph sizes)",
        "kv_fp8": "--kv-cache-dtype fp8", "log_requests": "--enable-log-requests", "log_requests_since": "0.10",
        "gen_cap": "--override-generation-config '{\"max_new_tokens\": {n}}'",
        "gen_cap_flag": "--override-generation-config", "kv_bytes": "--kv-cache-memory-bytes",
        "kv_bytes_since": "0.11", "mm_cache": "--mm-processor-cache-gb", "gen_config": "--generation-config",
        "gen_config_plain": "auto vllm",
        "queue_grep": "'num_requests_(running|waiting)'`: where the scheduler loops and why the queue waits "
                      "(waiting_by_reason)",  # the values of --generation-config that read no folder of defaults
        "engine_proc": "the EngineCore", "engine_pid": "<EngineCore pid>", "tp_procs": "the workers",
        "stall_log": "No available shared memory broadcast block found in 60 seconds", "serve": "vllm serve", "log_name": "vllm.log",
        "probe_flag": "--disable-access-log-for-endpoints /metrics,/health,/version,/v1/models",
        "preempt_metric": "vllm:num_preemptions", "preempt_why": "vLLM preempts a request only when the KV cache has no block for it",
        "logprobs_runner": "vLLM's V2 model runner (VLLM_USE_V2_MODEL_RUNNER=1; 0.26's default but for MoE and hybrid "
                           "models) computes them 1,024 prompt tokens at a time.",
        "wedge_seen": "Check the scheduler's setup: a KV-offloading or KV-transfer connector (--kv-transfer-config, "
                      "--kv-offloading-size), --scheduling-policy priority and a --max-num-seqs that deferred requests "
                      "fill are where this was seen (vllm#53868, vllm#39863, vllm#45414); upgrade vLLM if your "
                      "version predates their fixes.",
        "flashinfer_off": ", or set VLLM_USE_FLASHINFER_SAMPLER=0 so the sampler does not need it",
        # the memory fraction when the flag is not given: 0.92 from vLLM 0.20 (``mem_default_since``), 0.9 before
        "mem_default": "0.92", "mem_default_before": "0.9", "mem_default_since": "0.20",
        "dead_health": "vLLM's answer when its engine is dead (EngineDeadError)",
    },
    "sglang": {
        "name": "SGLang", "mem": "--mem-fraction-static", "seqs": "--max-running-requests", "len": "--context-length", "len_word": "context_length",
        "chunk": "--chunked-prefill-size", "chunk_how": "a lower --chunked-prefill-size, e.g. 2048",
        "tp": "--tp-size", "eager": "--disable-cuda-graph",
        "graph_bs": "--cuda-graph-max-bs (fewer, smaller graphs)",
        "kv_fp8": "--kv-cache-dtype fp8_e4m3", "log_requests": "--log-requests", "log_requests_since": "",
        "gen_cap": "", "gen_cap_flag": "", "kv_bytes": "", "kv_bytes_since": "", "mm_cache": "",
        "gen_config": "", "gen_config_plain": "",
        "queue_grep": "'num_(running|queue)_reqs'`: where the scheduler loops and what waits",
        # SGLang's scheduler process is titled ``sglang::scheduler`` (``sglang::scheduler_TP1`` ... per rank)
        "engine_proc": "the scheduler (sglang::scheduler)", "engine_pid": "<scheduler pid>",
        "tp_procs": "every TP rank's scheduler", "stall_log": "", "serve": "python -m sglang.launch_server",
        "log_name": "sglang.log",
        "probe_flag": "--uvicorn-access-log-exclude-prefixes /metrics /health /version /v1/models",
        # SGLang's preemption: a request retracted from decode when the KV pool runs out (its metrics_text row)
        "preempt_metric": "sglang:num_retracted_requests_total",
        "preempt_why": "SGLang retracts a request from decode only when its KV pool runs out",
        "logprobs_runner": "",
        # the wedge as SGLang's users reported it (the scheduler stuck with the queue full, /health 200)
        "wedge_seen": "SGLang's scheduler was seen wedged with the queue full while /health said 200 "
                      "(sgl-project/sglang#24140, #33858): upgrade SGLang if your version predates their fixes.",
        "flashinfer_off": "",
        # SGLang works its --mem-fraction-static out from the GPU's size and the model when it is not given
        "mem_default": "", "mem_default_before": "", "mem_default_since": "", "dead_health": "",
    },
}
#: the engines known, in the order vtop tries them
ENGINES: tuple[str, ...] = tuple(ENGINE_FLAGS)


def flags_of(engine: str | None) -> Mapping[str, str]:
    """The words of ``engine`` ("vllm", "sglang"); vLLM's for None or an engine not in the table."""
    return ENGINE_FLAGS.get(engine or "vllm", ENGINE_FLAGS["vllm"])


def kv_bytes_flag(engine: str | None, version: str | None) -> str | None:
    """The engine's flag for an absolute KV cache size where its version has it (vLLM from 0.11); None for an
    engine without one, or a version before it. An unknown version is taken to have it (a current vLLM)."""
    fl = flags_of(engine)
    if not fl["kv_bytes"]:
        return None
    since, ver = _ver(fl["kv_bytes_since"]), _ver(version)
    return None if since is not None and ver is not None and ver < since else fl["kv_bytes"]


def _ver(v: str | None) -> tuple[int, int] | None:
    parts = (v or "").lstrip("v").split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (ValueError, IndexError):
        return None
