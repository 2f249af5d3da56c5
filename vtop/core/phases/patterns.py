"""The vLLM log's line formats and message patterns: what a line says, not what it means for a start.

Pure, no state: :func:`parse_line` turns one line (ANSI allowed) into a :class:`LogEvent` (its
process tag, level, stamp and message); the ``_*_RE`` patterns name the phase lines, the facts
they report and the fatal errors (``ERROR_PATTERNS``, with the kinds the tracker decides on).
vLLM's formats drift between versions: every message pattern is used with ``re.search`` on the
message part, and the prefix parser accepts every format from 0.6 to 0.33 (tag or not,
``file.py:N]`` or ``[file.py:N]``, ANSI or not). Compiled at import: loaded only once a log is read
(:mod:`vtop.core.phases` defers it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from vtop.model.logtext import is_progress_frame, strip_ansi

# --------------------------------------------------------------------------- text helpers

# CSI sequences (colours, cursor moves tqdm uses for nested bars), two-byte
# escapes, and the caret form ``^[[0;36m`` found in copy-pasted docker output.
_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_LEVEL_NUM = {"DEBUG": 10, "INFO": 20, "WARNING": 30, "ERROR": 40, "CRITICAL": 50}

_TAG = r"\((?P<proc>[^()]+?) pid=(?P<pid>\d+)\)"
# vLLM's record prefix, "LEVEL MM-DD HH:MM:SS[.fff] [file.py:N]" ("file.py:N]" without the opening
# bracket up to 0.7), after an optional "(Process pid=N)" tag.
_RECORD_BODY = (
    r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<mon>\d\d)-(?P<day>\d\d) "
    r"(?P<hh>\d\d):(?P<mi>\d\d):(?P<ss>\d\d)(?:\.\d+)? "
    r"\[?(?P<src>[\w./-]+\.py):(?P<lineno>\d+)\](?: (?P<msg>.*))?$"
)
_RECORD_RE = re.compile(r"(?:" + _TAG + r"\s)?" + _RECORD_BODY)
# One pass for the usual shapes: [tag] record | [tag] uvicorn | tag + anything.
_LINE_RE = re.compile(
    r"(?:"
    + _TAG
    + r"(?:\s|$))?(?:"
    + _RECORD_BODY
    + r"|(?P<ulevel>DEBUG|INFO|WARNING|ERROR|CRITICAL):\s+(?P<umsg>.*)$|(?P<rest>.*)$)"
)
# Container runtimes: CRI ("2026-04-10T08:52:19.57Z stdout F "), `docker logs -t`,
# compose ("vllm-1  | ").
_CONTAINER_PREFIX_RE = re.compile(
    r"^(?:\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?\s+(?:(?:stdout|stderr)\s+[FP]\s+)?"
    r"|[\w.-]+\s+\|\s)"
)


@dataclass(slots=True)
class LogEvent:
    """One log line taken apart. ``text`` is the line without ANSI codes.

    A plain slotted dataclass, not a frozen one: one is built per line, and frozen
    dataclasses are several times slower to construct. Treat it as read-only.
    """

    text: str
    message: str
    kind: str  # "record" | "uvicorn" | "progress" | "raw" | "blank"
    level: str | None = None
    proc: str | None = None
    pid: int | None = None
    source: str | None = None
    source_line: int | None = None
    stamp: tuple[int, int, int, int, int] | None = None  # month, day, hour, minute, second
    #: the engine whose line format this is: "sglang" for SGLang's record (:data:`SGLANG_RECORD_RE`), else
    #: None (vLLM's formats, and lines of no engine's format)
    engine: str | None = None


def _from_record(text: str, m: re.Match[str]) -> LogEvent:
    proc, pid, level, mon, day, hh, mi, ss, src, lineno, msg = m.groups()[:11]
    return LogEvent(
        text,
        msg or "",
        "record",
        level,
        proc,
        int(pid) if pid else None,
        src,
        int(lineno),
        (int(mon), int(day), int(hh), int(mi), int(ss)),
    )


#: SGLang's log record (``configure_logger`` in 0.5.17's ``srt/utils/common.py``: the format
#: ``[%(asctime)s{ms}{prefix}] %(message)s`` with ``datefmt="%Y-%m-%d %H:%M:%S"``, the prefix the process's
#: ranks: ``" TP0"``, ``" DP1 TP0"``, ``" PP0 TP3 EP3"``, none in the HTTP server). No level in it. Uvicorn's
#: lines go through the same format: ``[2026-07-27 08:54:44] INFO:     127.0.0.1:58310 - "POST /generate ..."``.
SGLANG_RECORD_RE = re.compile(
    r"\[\d{4}-(?P<mon>\d\d)-(?P<day>\d\d) (?P<hh>\d\d):(?P<mi>\d\d):(?P<ss>\d\d)(?:[.,]\d+)?"
    r"(?: (?P<proc>[A-Z][A-Z_]*\d+(?: [A-Z][A-Z_]*\d+)*))?\] (?P<msg>.*)$"
)
_UVICORN_MSG_RE = re.compile(r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL):\s+(?P<msg>.*)$")


def _parse_sglang(text: str) -> LogEvent | None:
    m = SGLANG_RECORD_RE.match(text)
    if m is None:
        return None
    mon, day, hh, mi, ss, proc, msg = m.groups()
    stamp = (int(mon), int(day), int(hh), int(mi), int(ss))
    u = _UVICORN_MSG_RE.match(msg)
    if u:
        return LogEvent(text, u.group("msg"), "uvicorn", u.group("level"), proc, None, None, None, stamp, "sglang")
    return LogEvent(text, msg, "record", None, proc, None, None, None, stamp, "sglang")


def _parse_anchored(text: str) -> LogEvent | None:
    if text[:2] == "[2":  # SGLang's "[2026-..." (vLLM's lines never start so: "[W1130" and "[rank0]" do not)
        ev = _parse_sglang(text)
        if ev is not None:
            return ev
    m = _LINE_RE.match(text)
    if m is None:  # pragma: no cover - the last alternative matches anything
        return None
    if m.group("level"):
        return _from_record(text, m)
    proc, pid = m.group("proc", "pid")
    pid_n = int(pid) if pid else None
    ulevel = m.group("ulevel")
    if ulevel:
        return LogEvent(text, m.group("umsg"), "uvicorn", ulevel, proc, pid_n)
    if proc:
        rest = m.group("rest")
        kind = "blank" if not rest.strip() else ("progress" if is_progress_frame(rest) else "raw")
        return LogEvent(text, rest, kind, None, proc, pid_n)
    return None


def parse_line(line: str) -> LogEvent:
    """Take one physical log line apart (any vLLM version 0.6-0.33).

    Never raises. Lines that are not log records (tqdm frames, tracebacks, Python
    warnings, third-party prints) come back as ``raw`` or ``progress`` with the
    process tag, when there is one, still recognised.
    """
    text = strip_ansi(line).rstrip("\r\n")
    if not text.strip():
        return LogEvent(text, "", "blank")
    ev = _parse_anchored(text)
    if ev is not None:
        return ev
    c = _CONTAINER_PREFIX_RE.match(text)
    if c:
        ev = _parse_anchored(text[c.end() :])
        if ev is not None:
            return LogEvent(text, ev.message, ev.kind, ev.level, ev.proc, ev.pid, ev.source, ev.source_line, ev.stamp,
                            ev.engine)
    # VLLM_LOGGING_PREFIX or any other prefix: find the record further in.
    if " " in text and any(lv in text for lv in _LEVELS):
        m = _RECORD_RE.search(text)
        if m:
            return _from_record(text, m)
    return LogEvent(text, text, "progress" if is_progress_frame(text) else "raw")


# --------------------------------------------------------------------------- message patterns

ENGINE_INIT_RE = re.compile(
    r"Initializing (?:an LLM engine|a V0 LLM engine|a V1 LLM engine) \(v(?P<ver>[^)]+)\) with config: "
)
CFG_RES = {
    "model": re.compile(r"\bmodel='(?P<v>[^']*)'"),
    "tensor_parallel_size": re.compile(r"\btensor_parallel_size=(?P<v>\d+)"),
    "pipeline_parallel_size": re.compile(r"\bpipeline_parallel_size=(?P<v>\d+)"),
    "enforce_eager": re.compile(r"\benforce_eager=(?P<v>True|False)"),
    "max_model_len": re.compile(r"\bmax_seq_len=(?P<v>\d+)"),
}
ENGINE_WAIT_RE = re.compile(r"Waiting for init message from front-end\.")
ARCH_RE = re.compile(r"Resolved architecture: (?P<v>\w+)")
MAX_LEN_RE = re.compile(r"Using max model len (?P<v>\d+)")

WEIGHTS_START_RE = re.compile(
    r"Starting to load model (?P<model>.+?)\.\.\.|Loading model from scratch|Using model weights format \["
)
SHARDS_RE = re.compile(
    r"Loading (?:safetensors|pt|np_cache|\w+) checkpoint shards(?: \(eager\))?:\s+(?P<pct>\d+)% Completed"
    r" \| (?P<n>\d+)/(?P<tot>\d+) \["
)
WEIGHTS_TOOK_RE = re.compile(r"Loading weights took (?P<s>[\d.]+) seconds")
MODEL_LOADING_RE = re.compile(
    r"Loading model weights took (?P<gb>[\d.]+) GB"
    r"|Model loading took (?P<gib>[\d.]+) GiB(?: memory)? and (?P<s>[\d.]+) seconds"
)

#: The compile cache's hit or miss, by version (vllm/compilation/backends.py and decorators.py):
#:
#: ============  ==========================================================  ===================================
#: version       hit (the graphs come from the cache)                        miss (compiled afresh)
#: ============  ==========================================================  ===================================
#: 0.8-0.26      ``Directly load the compiled graph(s) for ... from the      ``Compiling a graph for ...``,
#:               cache``                                                     ``Cache the graph of ...``
#: 0.32 (AOT)    ``Directly load AOT compilation from path ...``             ``saved AOT compiled function to``
#: ============  ==========================================================  ===================================
#:
#: 0.32 on the CPU backend, cold: "[backbone] saved AOT compiled function to /tmp/vllmcpu/cache/torch_compile_cache/
#: torch_aot_compile/..." after "Warming up model for the compilation...".
COMPILE_MARK_RE = re.compile(
    r"Starting torch\.compile|for vLLM's torch\.compile|Dynamo bytecode transform time"
    r"|Compiling a graph for|Directly load the compiled graph|Cache the graph of"
    r"|Warming up model for the compilation|Directly load AOT compilation from|saved AOT compiled function to"
)
COMPILE_CACHED_RE = re.compile(r"Directly load the compiled graph|Directly load AOT compilation from")
COMPILE_FRESH_RE = re.compile(r"Compiling a graph for|saved AOT compiled function to")
COMPILE_END_RE = re.compile(
    r"torch\.compile (?:takes|took) (?P<s>[\d.]+) s in total"
    r"|torch\.compile and initial profiling/warmup run together took (?P<s2>[\d.]+) s in total"
)

PROFILING_TAKES_RE = re.compile(r"Memory profiling takes (?P<s>[\d.]+) seconds")
PROFILE_RUN_RE = re.compile(r"Initial profiling/warmup run took (?P<s>[\d.]+) s")
PROFILING_MARK_RE = re.compile(r"Profiling CUDA graph memory|CUDA graph memory profiling is enabled")
GRAPH_EST_RE = re.compile(r"Estimated CUDA graph memory: (?P<gib>[\d.]+) GiB total")
#: ``gpu_worker.py`` ``determine_available_memory`` (0.21+; vLLM 0.32.0's source), logged right after "Available KV
#: cache memory" where the CUDA graph estimate is above 0: "CUDA graph memory profiling is enabled (default since
#: v0.21.0). The current --gpu-memory-utilization=0.9000 is equivalent to ..." (the estimate was subtracted from
#: the KV cache) or, with VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0, "CUDA graph memory profiling is disabled
#: (...). ... increasing --gpu-memory-utilization from 0.9000 to 0.9100." (it was not); both name the utilization
GRAPH_PROFILING_RE = re.compile(
    r"CUDA graph memory profiling is (?P<on>enabled|disabled)"
    r"(?:.*?(?:The current --gpu-memory-utilization=|--gpu-memory-utilization from )(?P<util>[\d.]+))?"
)
#: ``gpu_worker.py`` ``determine_available_memory``: "Available KV cache memory: K GiB" (0.9+, per rank; the
#: profiling path only: an explicit --kv-cache-memory-bytes returns before it, the CPU worker never logs it). K is
#: ``format_gib`` of bytes that can be 0 or below (``round(b / 2**30, 2)``: "-1.5") when the weights and the
#: activations took the whole budget: then "No available memory for the cache blocks" follows. ``gib``: K at 0 or
#: above (the KV cache's size), ``neg``: K below 0
KV_AVAILABLE_RE = re.compile(r"Available KV cache memory: (?:(?P<gib>\d[\d.]*)|(?P<neg>-\d[\d.]*)) GiB")
#: the API server's "non-default args: {'model_tag': ..., 'gpu_memory_utilization': 0.5, ...}" (a dict's repr;
#: 0.32.0's ``vllm/entrypoints/serve/utils/api_utils.py``, ``api_utils.py`` in the 0.26.0 H200 log): the utilization
#: where it was given. A default one is not said there; vtop takes none from a table of defaults (0.92 in 0.32.0's
#: ``CacheConfig``, not the same in every version)
NONDEFAULT_ARGS_RE = re.compile(r"non-default args: \{")
#: what vtop reads of that dict: the utilization, and the step's token budget (--max-num-batched-tokens, what a
#: runtime OOM of prompt logprobs is bounded by)
NONDEFAULT_RES: dict[str, re.Pattern[str]] = {
    "gpu_memory_utilization": re.compile(r"'gpu_memory_utilization': (?P<v>[\d.]+)"),
    "max_num_batched_tokens": re.compile(r"'max_num_batched_tokens': (?P<v>\d+)"),
}
KV_CPU_SET_RE = re.compile(r"Explicitly set \(?(?P<gib>[\d.]+)(?:/[\d.]+)?\)? GiB for KV cache")

#: The GPU memory budget vLLM reports after profiling, by version (issue 40; vllm/v1/worker/gpu_worker.py):
#:
#: ==========  ===========================================================================================
#: version     line (one INFO record unless said)
#: ==========  ===========================================================================================
#: 0.7-0.9     "Memory profiling takes S seconds" then raw lines "the current vLLM instance can use
#:             total_gpu_memory (T GiB) x gpu_memory_utilization (U) = R GiB" and "model weights take W GiB;
#:             non_torch_memory takes N GiB; PyTorch activation peak memory takes A GiB; the rest of the
#:             memory reserved for KV Cache is K GiB." (as remembered of those versions' worker; not checked against a log here)
#: 0.26        "Free memory on device (F/T GiB) on startup. Desired GPU memory utilization is (U, R GiB).
#:             Actual usage is W GiB for weight, A GiB for peak activation, N GiB for non-torch memory, and
#:             G GiB for CUDAGraph memory. ... Current kv cache memory in use is K GiB." (recorded on an H200)
#: 0.32        the same, with "Actual usage is C GiB for consumed memory (weights + non-torch), A GiB for peak
#:             activation, and G GiB for CUDAGraph memory" (vllm 0.32.0's gpu_worker.py)
#: all V1      "Model loading took W GiB ..." (weights), "Available KV cache memory: K GiB", "Graph capturing
#:             finished in S secs, took G GiB" (the other rows' facts)
#: ==========  ===========================================================================================
BUDGET_DEVICE_RE = re.compile(
    r"Free memory on device (?:\S+ )?\((?P<free>[\d.]+)/(?P<total>[\d.]+) GiB\) on startup\. Desired GPU memory"
    r" utilization is \((?P<util>[\d.]+), (?P<req>[\d.]+) GiB\)\. Actual usage is"
    r"(?: (?P<w>[\d.]+) GiB for weight, (?P<a>[\d.]+) GiB for peak activation, (?P<n>[\d.]+) GiB for non-torch memory,"
    r"| (?P<c>[\d.]+) GiB for consumed memory \(weights \+ non-torch\), (?P<a2>[\d.]+) GiB for peak activation,)"
    r" and (?P<g>[\d.]+) GiB for CUDAGraph memory"
    r"(?:.*Current kv cache memory in use is (?P<kv>[\d.]+) GiB)?"
)
BUDGET_OLD_TOTAL_RE = re.compile(
    r"total_gpu_memory \((?P<total>[\d.]+) ?GiB\) x gpu_memory_utilization \((?P<util>[\d.]+)\) = (?P<req>[\d.]+) ?GiB"
)
BUDGET_OLD_PARTS_RE = re.compile(
    r"model weights take (?P<w>[\d.]+) ?GiB; non_torch_memory takes (?P<n>[\d.]+) ?GiB; PyTorch activation peak"
    r" memory takes (?P<a>[\d.]+) ?GiB; the rest of the memory reserved for KV Cache is (?P<kv>[\d.]+) ?GiB"
)

KV_BLOCKS_RE = re.compile(r"# (?:GPU|cuda|\w+) blocks: (?P<gpu>\d+)(?:, # CPU blocks: (?P<cpu>\d+))?")
KV_TOKENS_RE = re.compile(r"(?:(?P<dev>[A-Z]+)(?: \+ host)? )?KV cache size: (?P<tok>[\d,]+) tokens")
KV_CONC_RE = re.compile(r"Maximum concurrency for (?P<len>[\d,]+) tokens per request: (?P<x>[\d.]+)x")
NUM_BLOCKS_RE = re.compile(r"cache_config_info with initialization after num_gpu_blocks is: (?P<n>\d+)")

CAPTURE_START_RE = re.compile(r"Capturing (?:the model for CUDA graphs|cudagraphs for decoding)\.")
CAPTURE_BAR_RE = re.compile(
    r"Capturing CUDA graph(?:s| shapes)(?: \((?:(?P<kind>[^,()]+), )?(?P<mode>[A-Z_]+)\))?:"
    r"\s+(?P<pct>\d+)%\|[^|]*\| (?P<n>\d+)/(?P<tot>\d+)"
)
#: tqdm's elapsed time in a frame: "| 2/4 [00:05<00:05, 2.51s/it]" (h:mm:ss past an hour)
TQDM_ELAPSED_RE = re.compile(r"\| \d+/\d+ \[(?:(?P<h>\d+):)?(?P<m>\d+):(?P<s>\d+)<")
CAPTURE_END_RE = re.compile(r"Graph capturing finished in (?P<s>\d+) secs?(?:, took (?P<gib>[\d.]+) GiB)?")

WARMUP_MARK_RE = re.compile(r"Kernel JIT monitor activated")
INIT_ENGINE_RE = re.compile(
    r"init engine \(profile, create kv cache, warmup model\) took (?P<s>[\d.]+) s(?:econds)?"
    r"(?: \(compilation: (?P<c>[\d.]+) s[^)]*\))?"
)
API_MARK_RE = re.compile(
    r"Supported[_ ]tasks: \[|Available routes are|Started server process|Waiting for application startup"
)
SERVER_URL_RE = re.compile(r"Starting vLLM (?:API )?server(?: \d+)? on (?P<url>\S+)|Uvicorn running on (?P<u2>\S+)")
READY_RE = re.compile(r"Application startup complete\.")

# --------------------------------------------------------------------------- SGLang's startup lines
# Read in SGLang 0.5.17's source (file and function named on each); older releases' spellings where they
# differ (from the sglang repository's history and logs quoted in its issues). Not yet checked against a
# real SGLang log: tests/fixtures/sglang/ holds a start written by hand from these sources.
#: ``entrypoints/engine.py``: ``logger.info(f"{server_args=}")`` at launch: the whole config
SGL_SERVER_ARGS_RE = re.compile(r"server_args=ServerArgs\(")
#: the line an engine prints once per launch, by engine (its log's record format): a new one after a start
#: that got anywhere is a restart in the same log. vLLM's is its version banner (``BANNER_RES``); SGLang
#: 0.5.17 prints no version at launch, its first line is ``server_args=ServerArgs(...)``
#: (``entrypoints/engine.py`` ``_launch_subprocesses``).
LAUNCH_RES: dict[str, re.Pattern[str]] = {"sglang": SGL_SERVER_ARGS_RE}
SGL_CFG_RES = {
    "model": re.compile(r"\bmodel_path='(?P<v>[^']*)'"),
    "tensor_parallel_size": re.compile(r"\btp_size=(?P<v>\d+)"),
    "pipeline_parallel_size": re.compile(r"\bpp_size=(?P<v>\d+)"),
    "max_model_len": re.compile(r"\bcontext_length=(?P<v>\d+)"),
    "enforce_eager": re.compile(r"\bdisable_cuda_graph=(?P<v>True|False)"),
}
#: ``distributed/bootstrap.py``
SGL_DIST_RE = re.compile(r"Init torch distributed begin\.")
#: ``model_executor/model_runner.py`` ``load_model``: "Load weight begin. avail mem=78.97 GB", "Load weight end.
#: elapsed=1.23 s, type=LlamaForCausalLM, avail mem=78.88 GB, mem usage=0.09 GB." (before 0.5: "Load weight end.
#: type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=..., mem usage=... GB."). SGLang's "GB" is 2**30 bytes
#: (``get_available_gpu_memory`` divides by ``1 << 30``).
SGL_WEIGHTS_BEGIN_RE = re.compile(r"Load weight begin\. avail mem=(?P<avail>[\d.]+) GB")
SGL_WEIGHTS_END_RE = re.compile(
    r"Load weight end\.(?: elapsed=(?P<s>[\d.]+) s,)?.*?\bmem usage=(?P<gib>[\d.]+) GB"
)
#: ``mem_cache/memory_pool.py``: "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 383872, KV size: 19.36
#: GB" (MHA pools log "K size: .. GB, V size: .. GB"; before 0.5 no dtype), then
#: ``mem_cache/kv_cache_configurator.py``: "Memory pool end. avail mem=10.30 GB" (each TP rank)
SGL_KV_ALLOC_RE = re.compile(
    r"KV Cache is allocated\.(?: dtype: \S+,)? #tokens: (?P<tok>\d+),"
    r" (?:KV size: (?P<kv>[\d.]+) GB|K size: (?P<k>[\d.]+) GB, V size: (?P<v>[\d.]+) GB)"
)
SGL_POOL_END_RE = re.compile(r"Memory pool end\. avail mem=(?P<avail>[\d.]+) GB")
#: ``managers/scheduler.py``: "max_total_num_tokens=383872, chunked_prefill_size=8192, max_prefill_tokens=16384,
#: max_running_requests=2048, context_len=32768, available_gpu_mem=10.30 GB"
SGL_LIMITS_RE = re.compile(
    r"max_total_num_tokens=(?P<tok>\d+),.*?max_running_requests=(?P<mrr>\d+),.*?context_len=(?P<ctx>\d+)"
)
#: ``model_runner_components/cuda_graph_setup.py``: "Capture target decode CUDA graph begin. backend=..., bs=[1,
#: 2, 4, ...], avail mem=..." / "... end. elapsed=8.04 s, mem usage=0.80 GB, avail mem=10.30 GB." (0.5.17; the
#: target prefill graph too where enabled); before: "Capture cuda graph begin. This can take up to several
#: minutes. avail mem=..." / "Capture cuda graph end. Time elapsed: 8.04 s. mem usage=0.80 GB. avail mem=..."
SGL_CAPTURE_BEGIN_RE = re.compile(r"Capture (?:[\w ]+? )?(?:cuda|CUDA) graph begin\.")
#: the end of the capture: the decode graphs' (or the one capture's, before 0.5.17). 0.5.17 captures the target
#: prefill graphs first ("Capture target prefill CUDA graph end. elapsed=72.09 s": :data:`SGL_PREFILL_CAPTURE_END_RE`),
#: then the decode graphs: the first end is not the phase's (it read as warmup while the decode graphs were captured)
SGL_CAPTURE_END_RE = re.compile(
    r"Capture (?!target prefill )(?:[\w ]+? )?(?:cuda|CUDA) graph end\. "
    r"(?:Time elapsed: (?P<s>[\d.]+) s|elapsed=(?P<s2>[\d.]+) s)(?:.*?mem usage=(?P<gib>[\d.]+) GB)?"
)
SGL_PREFILL_CAPTURE_END_RE = re.compile(r"Capture target prefill (?:cuda|CUDA) graph end\.")
#: ``runner/decode_cuda_graph_runner.py``: tqdm "Capturing batches (bs=160 avail_mem=70.29 GB):  45%|####5 | 23/52
#: [00:03<00:04,  6.72it/s]" on TP rank 0; 0.5.17 first captures the target prefill graphs, one per token count:
#: "Capturing num tokens (num_tokens=8192 avail_mem=38.90 GB):   0%|          | 0/58" (72 s of a 77 s capture on an
#: H100 80GB with the tiny model, session 26: without it the longest part of the start showed no progress)
SGL_CAPTURE_BAR_RE = re.compile(
    r"Capturing (?P<what>batches|num tokens) \([^)]*\):\s+(?P<pct>\d+)%\|[^|]*\| (?P<n>\d+)/(?P<tot>\d+)"
)
#: ``entrypoints/http_server.py`` after its warmup request
SGL_READY_RE = re.compile(r"The server is fired up and ready to roll!")


SHM_WAIT_RE = re.compile(r"No available shared memory broadcast block found in \d+ seconds")
ACCESS_RE = re.compile(r'"(?:GET|POST|PUT|DELETE|HEAD|OPTIONS|PATCH) \S+ HTTP/[\d.]+" \d{3}')
SHUTDOWN_RE = re.compile(
    r"\[shutdown\] API server: shutdown triggered|^Shutting down$|Application shutdown complete\."
)  # all contain "hut" (the cheap pre-check)

EXC_LINE_RE = re.compile(
    r"^(?:[A-Za-z_][\w]*\.)*(?P<exc>[A-Z]\w*(?:Error|Exception|Exit|Interrupt)):?(?: (?P<text>.*))?$"
)
TRACEBACK_RE = re.compile(r"^Traceback \(most recent call last\):")
C10D_WARN_RE = re.compile(r"^\[(?:rank\d+\]:\[)?W\d{4} ")
C10D_ERR_RE = re.compile(r"^\[(?:rank\d+\]:\[)?E\d{4} ")
PYWARN_RE = re.compile(r"\b\w*Warning: ")

# (kind, pattern, priority). Specific causes (3) beat a bare exception (2), which
# beats the generic "the engine died" markers (1) when choosing the line to show.
ERROR_PATTERNS: tuple[tuple[str, re.Pattern[str], int], ...] = (
    (
        "cuda_oom",
        re.compile(
            r"OutOfMemoryError: CUDA out of memory\.(?: Tried to allocate (?P<amt>[\d.]+ [KMGT]?i?B))?"
            r"|CUDA error: out of memory"
        ),
        3,
    ),
    # vLLM; SGLang (0.5.17 model_executor/pool_configurator.py, older model_runner.py): "RuntimeError: Not enough
    # memory. Please try to increase --mem-fraction-static. Current value: mem_fraction_static=0.5"
    ("kv_no_memory", re.compile(r"No available memory for the cache blocks"
                                r"|Not enough memory\. Please try to increase --mem-fraction-static\."
                                r"(?: Current value: mem_fraction_static=(?P<frac>[\d.]+))?"), 3),
    # The CPU backend (0.32, cpu_worker.determine_available_memory): "ValueError: Available memory on node 0
    # (6.91/8.84 GiB) on kv cache allocation is less than requested memory for kv (64.0 GiB). Decrease
    # --kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE, or reduce CPU memory used by other processes."
    # 0.26 on an H200 beside a 100 GiB process: "ValueError: Free memory on device cuda:0 (38.77/139.8 GiB) on
    # startup is less than desired GPU memory utilization (0.5, 69.9 GiB). Decrease GPU memory utilization or
    # reduce GPU memory used by other processes."
    (
        "gpu_free_at_start",
        re.compile(
            r"Free memory on device (?:\S+ )?\((?P<free>[\d.]+)/(?P<total>[\d.]+) GiB\) on startup is less than"
            r" desired GPU memory utilization \((?P<util>[\d.]+), (?P<req>[\d.]+) GiB\)"
        ),
        3,
    ),
    (
        "kv_host_memory",
        re.compile(
            r"Available memory on node (?P<node>\d+) \((?P<avail>[\d.]+)/(?P<total>[\d.]+) GiB\) on kv cache"
            r" allocation is less than requested memory for kv \((?P<req>[\d.]+) GiB\)"
        ),
        3,
    ),
    (
        "max_model_len",
        re.compile(
            r"To serve at least one request with the models?'s max seq len \((?P<len>\d+)\), \((?P<need>[\d.]+) GiB"
            r" KV cache is needed, which is larger than the available KV cache memory \((?P<avail>[\d.]+) GiB\)\."
            r"(?: Based on the available memory, the estimated maximum model length is (?P<est>\d+)\.)?"
            r"|The model's max seq len \((?P<len0>\d+)\) is larger than the maximum number of tokens that can be"
            r" stored in KV cache \((?P<cap0>\d+)\)"
        ),
        3,
    ),
    ("module_not_found", re.compile(r"^(?:[\w.]+\.)?ModuleNotFoundError: No module named '(?P<mod>[^']+)'"), 3),
    (
        "model_len_too_long",
        re.compile(
            r"User-specified max_model_len \((?P<len>\d+)\) is greater than the derived max_model_len"
            r"(?: \(max_position_embeddings=(?P<pos>\d+)(?:\.0)?)?"
        ),
        3,
    ),
    # What happened, not the RuntimeError the engine raises after it: a specific cause.
    ("worker_died", re.compile(r"Worker proc (?P<who>\S+) died unexpectedly(?: \(exit code: (?P<code>-?\d+)\))?"), 3),
    (
        "engine_died",
        re.compile(
            r"Engine core proc(?:ess)? (?P<who>\S+) died unexpectedly"
            r"|EngineDeadError: EngineCore encountered an issue|AsyncLLM output_handler failed"
            # SGLang 0.5.17: managers/scheduler.py (the scheduler's last words), entrypoints/engine.py (the
            # launcher, when a child sends SIGQUIT)
            r"|Scheduler hit an exception|Received sigquit from a child process"
        ),
        1,
    ),
    (
        "engine_init_failed",
        re.compile(
            r"EngineCore failed to start\.|Engine core initialization failed\.|EngineCore hit an exception"
            r"|Engine process failed to start"
        ),
        1,
    ),
)
DEATH_KINDS = frozenset({"engine_died", "worker_died"})
CAUSE_WINDOW_S = 60.0
