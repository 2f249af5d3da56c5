"""Read a vLLM ``/metrics`` payload (the Prometheus text exposition format) into a plain, frozen snapshot.
(:mod:`vtop.sources.prometheus` is the other one: a client of a Prometheus server's query API.)

Why this module looks the way it does:

* **The parsing is prometheus_client's**, not ours
  (:func:`prometheus_client.parser.text_string_to_metric_families`). We only
  decide *which lines* it sees and *what the samples mean*.
* **It never raises.** A monitor points at servers that are starting, dying,
  behind a proxy that answers HTML, or cut off mid-payload. Whatever comes in,
  a :class:`VllmMetrics` comes out, with ``problems`` saying what could not
  be read. Missing data is ``None``, never ``0``: "no number" and "zero
  requests" must look different on the dashboard.
* **It salvages.** The library's generator dies at the first bad line, which
  would throw away the rest of the payload. So sample lines are fed to it in
  one batch and, when it raises, the bad line is reported and parsing
  resumes on the next line.
* **It is fast enough to run every second on a 2-core box.** The library
  walks every label string character by character in Python: 12-25 ms for
  a whole 50-60 KB vLLM payload, 3.5-7 ms even for only the ~130 sample
  lines we read (``bench/parse_metrics.py``). So:

  1. Comment lines are dropped and only the sample names we read are kept
     (a cheap ``startswith`` plus a dict lookup). HELP/TYPE carry nothing we
     need: the vLLM names are known and the ``_bucket/_sum/_count/_total``
     suffixes are on the wire. This also keeps the
     library's quadratic comment splitting (``_split_quoted``) away from
     hostile input.
  2. A line cache: the text left of the value (``name{labels}``) is the same
     scrape after scrape, so the library's answer for it (name, labels) is
     remembered and only the value token is converted, with the library's
     own value rules. A line is cached only after the library parsed it and
     the cached answer would have given the same result (no timestamp, same
     value); ``tests/unit/test_metrics_text_properties.py`` checks that cached and
     uncached parses agree on random and mutated payloads. Results are
     applied in line order either way. Steady state: 0.5-0.9 ms a payload.
  3. The first scrape of a server (cold cache) sends one line per label
     block to the library, not all ~140: vLLM repeats one block on most
     lines, and its bucket lines differ only in their ``le``; the others
     take that line's labels with their own name, ``le`` and value
     (:func:`_line_template` says when this is exactly what the library
     would return). 9 lines instead of ~140 on vLLM 0.26/0.32: 9-11 ms ->
     1.9 ms on a 2-core VM (one bucket line per histogram, ~33 lines, 2.6).
  4. Limits: lines over ``MAX_LINE_CHARS`` and cache-miss text beyond
     ``MAX_LIBRARY_CHARS_PER_PARSE`` are skipped and reported, so hostile
     input costs at most about a second instead of the library's quadratic
     corners (long runs of backslashes and escaped quotes).

Metric names, vLLM 0.6 to 0.33 (the tables below, ``_GAUGES`` to ``_HISTOGRAMS``, say which spelling is
read where two exist):
``kv_cache_usage_perc`` is preferred over ``gpu_cache_usage_perc`` (both are
0..1 fractions; 0.9.2-0.10 expose both), ``inter_token_latency_seconds``
over ``time_per_output_token_seconds``, counters always end in ``_total`` on
the wire, ``engine`` is the data-parallel index (absent in V0 and 0.7), and
``num_requests_swapped`` only exists in V0.

The families of issue #29, what vtop reads and where the names come from. "Recorded 0.32": seen on the
real vLLM 0.32.0 CPU build (tests/fixtures/vllm/signals/, tools/record_signals.py);
"recorded 0.26": seen on a real vLLM 0.26.0 CUDA build on an H200 (tests/fixtures/vllm/signals/h200-0.26.0/,
2026-12-02: n-gram spec decode + prefix caching, ``--enable-sleep-mode`` at levels 1 and 2,
``--kv-offloading-size 8``); "source": read in vLLM 0.32's source (``vllm/v1/metrics/loggers.py``,
``vllm/v1/spec_decode/metrics.py``) and, for other versions, in the vLLM sources of that version.

* Speculative decoding, V1 0.8.5+ (recorded 0.32 and 0.26, n-gram method):
  ``vllm:spec_decode_num_drafts_total``, ``..._num_draft_tokens_total``, ``..._num_accepted_tokens_total``,
  ``..._num_accepted_tokens_per_pos_total{position="0".."k-1"}``, per engine, at 0 from the start. vLLM's own
  log line (``SpecDecoding metrics: Mean acceptance length: 3.71, ... Per-position acceptance rate: 0.948,
  0.899, 0.866, Avg Draft acceptance rate: 93.7%``) defines: acceptance = accepted / draft tokens; mean
  acceptance length = 1 + accepted / drafts (the bonus token counted); per position = accepted at i / drafts.
  On the H200 (0.26.0): 175386 of 181011 draft tokens accepted, 62901 drafts (log: mean length 3.79).
  V0 (<=0.8, source/reference only): the same ``num_accepted_tokens_total`` and ``num_draft_tokens_total``
  counters (no ``num_drafts``: no mean length, no positions) beside the ``spec_decode_draft_acceptance_rate``
  and ``spec_decode_efficiency`` gauges, which vtop does not read (lifetime ratios, not "now").
* Prefix cache: ``vllm:prefix_cache_queries_total`` / ``..._hits_total`` (tokens, 0.9.2+, recorded 0.32 and
  0.26), else ``vllm:gpu_prefix_cache_queries_total`` / ``..._hits_total`` (0.7.3-0.10; reference only); the
  V0 ``gpu_prefix_cache_hit_rate`` gauge is not read. ``vllm:prompt_tokens_by_source_total{source}`` (0.20+,
  recorded 0.32 and 0.26: ``local_compute``, ``local_cache_hit``, ``external_kv_transfer``).
* ``vllm:cache_config_info`` (all versions, recorded): a gauge of 1 whose labels are the cache config
  (``block_size``, ``cache_dtype``, ``num_gpu_blocks``, ``gpu_memory_utilization``, ``enable_prefix_caching``,
  ``kv_offloading_backend``, ``kv_offloading_size`` ("8.0" with ``--kv-offloading-size 8`` on 0.26)...;
  +``engine`` in V1): kept as label pairs of the first engine.
* ``vllm:lora_requests_info{max_lora,running_lora_adapters,waiting_lora_adapters}`` (0.8+, only with
  ``--enable-lora``, recorded 0.32): no ``engine`` label; one series per label combination ever set, its
  value the Unix time it was last set, so the newest series is the current one; adapters comma-separated.
* ``vllm:engine_sleep_state{sleep_state="awake"|"weights_offloaded"|"discard_all"}`` (0.12+; recorded
  sleeping on 0.26.0: after ``POST /sleep?level=1`` awake 0, weights_offloaded 1 = level 1; after
  ``?level=2`` awake 0, discard_all 1 = level 2; awake 1 after ``/wake_up``; its HELP says the same. The
  0.32 CPU build refuses sleep mode: "Sleep mode is not supported on current platform"). A request sent
  to a sleeping engine waits, unanswered, until ``/wake_up`` and counts nowhere in the engine's families
  (recorded: a completion sent at level 1 got nothing in 20 s, prompt tokens stayed 0).
* ``vllm:request_queue_time_seconds`` histogram (all versions, recorded).
* ``http_requests_total{handler,method,status}`` (prometheus-fastapi-instrumentator in the API server,
  recorded: ``status`` grouped as "2xx"/"4xx"/"5xx"; /metrics, /health and a few more handlers are
  excluded by vLLM): summed over handlers by status. No ``engine`` label: a server-level family, it makes
  no engine row, and on its own it does not make a payload vLLM's.
* KV offload (``--kv-offloading-size``; recorded 0.26.0 on the H200; the CPU build refuses it, "CPU
  Offloading is currently only supported on CUDA-alike and XPU GPUs", tests/fixtures/vllm/signals/kv-offload/).
  The OffloadingConnector with ``CPUOffloadingSpec`` (log: ``Creating v1 connector with name:
  OffloadingConnector``) serves, on 0.26.0, both ``vllm:kv_offload_store_bytes_total`` /
  ``..._load_bytes_total`` (a series only from the first transfer that way) and the older
  ``vllm:kv_offload_total_bytes_total{transfer_type="GPU_to_CPU"|"CPU_to_GPU"}`` (at 0 from the start;
  equal to store/load: 21364736 bytes stored, none loaded). vLLM 0.32's source
  (``distributed/kv_transfer/kv_connector/v1/offloading/metrics.py``) keeps the older one as deprecated.
  vtop reads store/load where they have a series, else the older counter of that direction (any extra
  labels summed). Not read: ``..._total_time`` and the ``_time`` counters, the ``kv_offload_size`` /
  store/load size and lookup-delay histograms, ``vllm:kv_offload_cpu_cache_*_usage_perc`` (0.0 throughout
  the recording), ``..._cpu_allocation_size``, ``..._allocation_failure``, ``vllm:simple_kv_offload_*`` and
  the NIXL / Mooncake connector families.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from vtop.model.metrics import EngineMetrics, Histogram, VllmMetrics

__all__ = [
    "FINISH_ANY_REASON",
    "FINISH_REASONS",
    "HISTOGRAM_FAMILIES",
    "HISTOGRAM_SAMPLE_NAMES",
    "HIST_ATTRS",
    "SGLANG_BESIDE_VLLM",
    "ENGINE_PREFIXES",
    "SLOW_SAMPLE_NAMES",
    "WANTED_SAMPLE_NAMES",
    "EngineMetrics",
    "Histogram",
    "VllmMetrics",
    "clear_line_cache",
    "parse_vllm_metrics",
]

#: Finish reasons vLLM pre-creates in V1 (``error`` since 0.15, ``repetition``
#: since 0.20). Others are kept too if a server reports them.
FINISH_REASONS: tuple[str, ...] = ("stop", "length", "abort", "error", "repetition")
#: The key of ``request_success_total`` under which an engine that counts its finished requests without a
#: reason (SGLang's ``sglang:num_requests_total``) files them: every finish, whatever its reason. The sum
#: over the map's keys is every finish for either engine; no vLLM reason is ever this key.
FINISH_ANY_REASON = "total"

# Guards against input that would make the library slow (see module doc).
MAX_PAYLOAD_CHARS = 16 * 1024 * 1024
MAX_LINE_CHARS = 2048
MAX_LIBRARY_CHARS_PER_PARSE = 512 * 1024
MAX_PROBLEMS = 40
_CACHE_MAX_ENTRIES = 16384

# --- what we read ---------------------------------------------------------

# --- SGLang's names beside vLLM's ----------------------------------------------
#
# SGLang (``--enable-metrics``) serves its own families under ``sglang:``; the ones that say what a vLLM
# family says are read into the same fields. Read in SGLang 0.5.17's source
# (``python/sglang/srt/observability/metrics_collector.py``; in 0.4.x-0.5.x ``srt/metrics/collector.py``):
# not yet checked against a real SGLang server's payload. What differs:
#
# * Labels: no ``engine`` label. The scheduler's families carry ``model_name``, ``engine_type``,
#   ``tp_rank``, ``pp_rank``, ``moe_ep_rank`` (+ ``dp_rank`` with data parallelism, ``priority`` with
#   priority scheduling); the tokenizer's (the counters and latency histograms) ``model_name`` and
#   ``is_streaming``. So a SGLang payload is one row (engine None): counts, counters and histograms
#   are summed over the other labels (by default only attention-TP rank 0 of each DP group reports, so
#   the sum over ``dp_rank`` is the server's; ``--enable-metrics-for-all-schedulers`` makes every TP rank
#   report the same batch, which this sum would count once per rank).
# * ``sglang:token_usage`` is the used fraction of the KV pool (0..1; since 0.5.x the largest of the
#   full / SWA / Mamba pools), one gauge per scheduler: averaged over series, never summed.
# * ``sglang:num_retracted_requests_total`` (requests pushed back from decode when the KV pool runs out)
#   is SGLang's preemption; older releases have only the ``sglang:num_retracted_reqs`` gauge (not read).
# * Inter-token latency: ``sglang:inter_token_latency_seconds`` (0.5.x), else the older
#   ``sglang:time_per_output_token_seconds`` (0.3-0.4; some releases serve both).
# * Token counters: ``sglang:prompt_tokens_total`` and ``sglang:generation_tokens_total`` grow only when a
#   request *finishes* (``observe_one_finished_request``, called by the tokenizer manager): not vLLM's
#   per-step counters. Read as them, every request longer than the stall window looked like an engine that
#   made no token (a false engine stall), and "tokens rising" failed under a long request. SGLang's per-step
#   counter is ``sglang:realtime_tokens_total{mode=...}`` (0.5.17: grown each decode step by the batch size,
#   each prefill by its new and cached tokens: ``metrics_reporter.py`` ``report_decode_stats`` /
#   ``report_prefill_stats``): ``decode`` is read as the generation counter, ``prefill_compute`` +
#   ``prefill_cache`` as the prompt counter (vLLM's counts cached prompt tokens too). A release without it
#   (0.5.6 and older) has no per-step counter: the token counters are a gap there, never the finish-time ones.
# * Finished requests: SGLang counts no finish reason (no ``request_success_total``), but its tokenizer counts
#   every finished request in ``sglang:num_requests_total`` (0.5.17: ``TokenizerMetricsCollector.
#   observe_one_finished_request`` in ``srt/observability/metrics_collector.py`` does
#   ``self.num_requests_total.labels(**stream_labels).inc(1)``, labelled ``is_streaming`` too; the tokenizer
#   manager's ``collect_metrics`` calls it once a request, when ``state.finished``, as it grows the e2e
#   histogram; the same function grows it, labelled without ``is_streaming``, in the older
#   ``srt/metrics/collector.py``, read in sgl-project/sglang at commit 00ae9c15, a 0.5.x with
#   ``realtime_tokens_total``). Summed over its labels, it is read as vLLM's
#   ``request_success_total`` with one key, :data:`FINISH_ANY_REASON`: the rules' finished count (a busy
#   server whose requests finish is no runaway), the windows' finishes, the fleet's. Its series exists only
#   from the first finish (prometheus_client makes a labelled series at its first ``.labels()``): none before.
#   ``sglang:num_aborted_requests_total`` (``abort_request``: a client's abort as it is sent to the
#   scheduler) is not read.
# * 0.3.x labelled its families ``name=`` instead of ``model_name=``: read, without a model name.
# * Not read: ``sglang:gen_throughput`` and ``sglang:cache_hit_rate`` (SGLang's own moving figures: vtop
#   computes rates from the counters over its window), ``sglang:num_used_tokens``, the PD-disaggregation,
#   grammar, LoRA-pool, HiCache and speculative gauges.
#
# SGLang name -> (vtop attribute, the vLLM family it stands beside).
_SGLANG_GAUGES: dict[str, tuple[str, str]] = {
    "sglang:num_running_reqs": ("running", "vllm:num_requests_running"),
    "sglang:num_queue_reqs": ("waiting", "vllm:num_requests_waiting"),
    "sglang:token_usage": ("kv_mean", "vllm:kv_cache_usage_perc"),
}
_SGLANG_COUNTERS: dict[str, tuple[str, str]] = {
    "sglang:num_retracted_requests_total": ("preemptions_total", "vllm:num_preemptions_total"),
    # every finished request, no reason: request_success_total[FINISH_ANY_REASON] (see above)
    "sglang:num_requests_total": ("finished_any_reason", "vllm:request_success_total"),
}
#: SGLang counters split by a label, each value read as a vLLM counter (summed over the other labels):
#: name -> (label, {label value: (vtop attribute, the vLLM family it stands beside)})
SGLANG_BY_LABEL: dict[str, tuple[str, dict[str, tuple[str, str]]]] = {
    "sglang:realtime_tokens_total": ("mode", {
        "decode": ("generation_tokens_total", "vllm:generation_tokens_total"),
        "prefill_compute": ("prompt_tokens_total", "vllm:prompt_tokens_total"),
        "prefill_cache": ("prompt_tokens_total", "vllm:prompt_tokens_total"),
    }),
}
_SGLANG_HISTOGRAMS: dict[str, tuple[str, str]] = {
    "sglang:time_to_first_token_seconds": ("time_to_first_token_seconds", "vllm:time_to_first_token_seconds"),
    "sglang:inter_token_latency_seconds": ("itl_new", "vllm:inter_token_latency_seconds"),
    "sglang:time_per_output_token_seconds": ("itl_old", "vllm:time_per_output_token_seconds"),
    "sglang:e2e_request_latency_seconds": ("e2e_request_latency_seconds", "vllm:e2e_request_latency_seconds"),
    "sglang:queue_time_seconds": ("request_queue_time_seconds", "vllm:request_queue_time_seconds"),
    "sglang:prompt_tokens_histogram": ("request_prompt_tokens", "vllm:request_prompt_tokens"),
    "sglang:generation_tokens_histogram": ("request_generation_tokens", "vllm:request_generation_tokens"),
}
#: The name table (SGLang family -> the vLLM family it is read as), for docs and tests.
SGLANG_BESIDE_VLLM: dict[str, str] = {
    name: vllm for t in (_SGLANG_GAUGES, _SGLANG_COUNTERS, _SGLANG_HISTOGRAMS) for name, (_a, vllm) in t.items()
}
#: the engines by the prefix of their families
ENGINE_PREFIXES: dict[str, str] = {"vllm:": "vllm", "sglang:": "sglang"}


# Plain gauges: sample name -> attribute.
_GAUGES: dict[str, str] = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:num_requests_swapped": "swapped",  # V0 only (0.6-0.8.5)
    "vllm:kv_cache_usage_perc": "kv_new",  # 0.9.2+
    "vllm:gpu_cache_usage_perc": "kv_old",  # <=0.11
    **{name: attr for name, (attr, _vllm) in _SGLANG_GAUGES.items()},
}
# Plain counters (the ``_total`` suffix is always on the wire).
_COUNTERS: dict[str, str] = {
    "vllm:prompt_tokens_total": "prompt_tokens_total",
    "vllm:generation_tokens_total": "generation_tokens_total",
    "vllm:num_preemptions_total": "preemptions_total",
    "vllm:prefix_cache_queries_total": "pc_queries_new",  # 0.9.2+
    "vllm:prefix_cache_hits_total": "pc_hits_new",
    "vllm:gpu_prefix_cache_queries_total": "pc_queries_old",  # 0.7.3-0.10
    "vllm:gpu_prefix_cache_hits_total": "pc_hits_old",
    "vllm:spec_decode_num_drafts_total": "spec_drafts_total",  # V1 0.8.5+
    "vllm:spec_decode_num_draft_tokens_total": "spec_draft_tokens_total",  # V0 and V1
    "vllm:spec_decode_num_accepted_tokens_total": "spec_accepted_tokens_total",  # V0 and V1
    "vllm:kv_offload_store_bytes_total": "kv_offload_store_bytes_total",  # recorded 0.26.0 (H200); 0.32 source
    "vllm:kv_offload_load_bytes_total": "kv_offload_load_bytes_total",
    **{name: attr for name, (attr, _vllm) in _SGLANG_COUNTERS.items()},
}
# Gauges/counters split by one label: sample name -> (attribute, label).
_LABELLED: dict[str, tuple[str, str]] = {
    "vllm:num_requests_waiting_by_reason": ("waiting_by_reason", "reason"),  # 0.20+
    "vllm:request_success_total": ("request_success_total", "finished_reason"),
    "vllm:spec_decode_num_accepted_tokens_per_pos_total": ("spec_accepted_per_pos", "position"),  # 0.8.5+
    "vllm:prompt_tokens_by_source_total": ("prompt_tokens_by_source", "source"),  # 0.20+
    "vllm:engine_sleep_state": ("sleep_state", "sleep_state"),  # 0.12+
    # the older spelling of the offload bytes, by direction (recorded 0.26.0; deprecated in 0.32)
    "vllm:kv_offload_total_bytes_total": ("kv_offload_by_type", "transfer_type"),
}
# Server-level (no ``engine`` label), summed by one label over the other labels.
_SERVER_LABELLED: dict[str, tuple[str, str]] = {
    "http_requests_total": ("http_requests_by_status", "status"),
}
# Info gauges: every label but ``engine`` kept as pairs.
_INFOS: dict[str, str] = {
    "vllm:cache_config_info": "cache_config",
    "vllm:lora_requests_info": "lora",
}
# Histograms: family name -> attribute.
_HISTOGRAMS: dict[str, str] = {
    "vllm:time_to_first_token_seconds": "time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds": "itl_new",  # 0.11+
    "vllm:time_per_output_token_seconds": "itl_old",  # <=0.12
    "vllm:e2e_request_latency_seconds": "e2e_request_latency_seconds",
    "vllm:request_params_max_tokens": "request_params_max_tokens",
    "vllm:request_prompt_tokens": "request_prompt_tokens",
    "vllm:request_generation_tokens": "request_generation_tokens",
    "vllm:request_queue_time_seconds": "request_queue_time_seconds",
    **{name: attr for name, (attr, _vllm) in _SGLANG_HISTOGRAMS.items()},
}
_HIST_SUFFIXES = ("_bucket", "_sum", "_count")

# sample name -> (kind, attribute, extra): one dict lookup per line.
_WANTED: dict[str, tuple[str, str, str]] = {}
for _n, _a in _GAUGES.items():
    _WANTED[_n] = ("gauge", _a, "")
for _n, _a in _COUNTERS.items():
    _WANTED[_n] = ("counter", _a, "")
for _n in SGLANG_BY_LABEL:
    _WANTED[_n] = ("counter_by", "", _n)
for _n, (_a, _l) in _LABELLED.items():
    _WANTED[_n] = ("labelled", _a, _l)
for _n, (_a, _l) in _SERVER_LABELLED.items():
    _WANTED[_n] = ("server", _a, _l)
for _n, _a in _INFOS.items():
    _WANTED[_n] = ("info", _a, "")
for _n, _a in _HISTOGRAMS.items():
    for _s in _HIST_SUFFIXES:
        _WANTED[_n + _s] = ("hist" + _s, _a, _n)

_NAME_RE = re.compile(r"[^{\s]*")


# --- the line cache ---------------------------------------------------------

class _Rec:
    """Everything a sample line says except its value, decoded once.

    The line cache maps ``name{labels}`` to one of these, so a warm parse
    only converts the value token and files it.
    """

    __slots__ = ("key", "name", "kind", "attr", "engine", "model", "sub", "bad", "series")

    def __init__(self, name: str, labels: Mapping[str, str]) -> None:
        kind, attr, extra = _WANTED[name]
        items = tuple(sorted(labels.items()))
        #: the series identity (a str: its hash is cached).
        self.key = name + repr(items)
        self.name = name
        self.kind = kind
        self.attr = attr
        self.engine: str | None = labels.get("engine")
        self.model: str | None = labels.get("model_name")
        #: reason / finished_reason label, bucket bound, or histogram family.
        self.sub: Any = extra
        #: why the sample cannot be used, or "".
        self.bad = ""
        #: a histogram sample's series without its ``le`` (SGLang splits one family by ``is_streaming``:
        #: the series are summed, a bucket bound at a time)
        self.series = repr(tuple(kv for kv in items if kv[0] != "le")) if kind.startswith("hist") else ""
        if kind == "counter_by":  # a counter read as one attribute or another by a label's value
            label, attrs = SGLANG_BY_LABEL[extra]
            got = attrs.get(labels.get(label, ""))
            self.kind, self.attr, self.sub = ("counter", got[0], "") if got is not None else ("ignored", "", "")
        elif kind == "labelled" or kind == "server":
            self.sub = labels.get(extra)
            if self.sub is None:
                self.bad = f"{name}: sample without the {extra!r} label"
        elif kind == "info":
            self.sub = tuple((k, v) for k, v in items if k != "engine")
        elif kind == "hist_bucket":
            le = labels.get("le")
            try:
                bound = float(le) if le is not None else math.nan
            except ValueError:
                bound = math.nan
            if math.isnan(bound):
                self.bad = f"{name}: bucket with bad le={le!r}"
            self.sub = (extra, bound)


#: Every sample name this module reads (all versions' spellings): the names a
#: scrape can ask prometheus_client to restrict its answer to (``name[]``).
WANTED_SAMPLE_NAMES: tuple[str, ...] = tuple(sorted(_WANTED))
#: The histogram families (``vllm:time_to_first_token_seconds``...), and their sample
#: names (``_bucket``, ``_sum``, ``_count``): ~85 % of the lines a scrape reads.
HISTOGRAM_FAMILIES: tuple[str, ...] = tuple(sorted(_HISTOGRAMS))
HISTOGRAM_SAMPLE_NAMES: tuple[str, ...] = tuple(n for n in WANTED_SAMPLE_NAMES if _WANTED[n][0].startswith("hist"))
#: What a scraper may read only with the histograms (every few seconds): those, and the static
#: ``vllm:cache_config_info`` (one ~900-character line that never changes while a server runs).
SLOW_SAMPLE_NAMES: tuple[str, ...] = (*HISTOGRAM_SAMPLE_NAMES, "vllm:cache_config_info")


# "name{labels}" (the line left of the value) -> _Rec, or None for a line
# whose name we do not read.
_LINE_CACHE: dict[str, _Rec | None] = {}
_MISS: Any = object()


def clear_line_cache() -> None:
    """Forget cached lines (for benchmarks of the cold path, and tests)."""
    _LINE_CACHE.clear()
    _BUCKETS.clear()


# Histogram buckets, interned: a ``(bound, count)`` pair or a whole bucket tuple equal to one
# made before is that one. What is read is kept: the diagnoser holds its samples' histograms
# for 15 minutes, and one read of the three it keeps was ~5.6 KB of new tuples and floats
# (15, 15 and 22 buckets), a read every 5 s per server; 5 s apart, 88 % of the pairs of the
# replayed H200 timeline are unchanged, and an idle server's histograms do not change at all.
# Bounded like the line cache: emptied when full (what was made stays valid, unshared).
_BUCKETS: dict[Any, Any] = {}
_BUCKETS_MAX_ENTRIES = 8192


def _interned_buckets(pairs: Iterable[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    d = _BUCKETS
    if len(d) >= _BUCKETS_MAX_ENTRIES:
        d.clear()
    buckets = tuple([d.setdefault(p, p) for p in pairs])
    return d.setdefault(buckets, buckets)


def _value(tok: str) -> float:
    """A value token, by the library's rules (``parser._parse_value``:
    ``int`` then ``float``, no ``_``, no surrounding whitespace). ``float``
    alone gives the same number: both roundings are correct, and every
    token ``int`` accepts ``float`` accepts too.
    """
    if "_" in tok or tok != tok.strip():
        raise ValueError(tok)
    return float(tok)


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


# --- parsing ----------------------------------------------------------------


class _Problems:
    def __init__(self) -> None:
        self.items: list[str] = []
        self.dropped = 0

    def add(self, msg: str) -> None:
        if len(self.items) < MAX_PROBLEMS:
            self.items.append(msg)
        else:
            self.dropped += 1

    def result(self) -> tuple[str, ...]:
        if self.dropped:
            return (*self.items, f"... and {self.dropped} more problems")
        return tuple(self.items)


def _short(s: str, n: int = 80) -> str:
    s = s.replace("\x00", "\\0")
    return repr(s if len(s) <= n else s[:n] + "...")


def _library_samples(lines: list[str]) -> Iterator[tuple[int, Any, Exception | None]]:
    """Feed sample lines (no comments) to the library, resuming after a bad one.

    Without HELP/TYPE lines the library yields one untyped family per
    line, in order, so the i-th sample belongs to the i-th line. When the
    generator raises, line ``i`` is the bad one: report it, restart on
    ``i + 1``.
    """
    # Imported here, not at the top: the package pulls in its HTTP exposition
    # code (http.server, wsgiref...), 30-60 ms that the first frame need not wait for.
    from prometheus_client.parser import text_string_to_metric_families

    start = 0
    n = len(lines)
    while start < n:
        i = start
        try:
            for fam in text_string_to_metric_families("\n".join(lines[start:])):
                for s in fam.samples:
                    yield i, s, None
                i += 1
            return
        except Exception as exc:  # noqa: BLE001 - the library raises ValueError, IndexError, ...
            if i >= n:  # cannot happen, but never loop forever
                return
            yield i, None, exc
            start = i + 1


_LE_VALUE = re.compile(r"[0-9A-Za-z.+\-]+")


def _line_template(line: str, name: str, bucket: bool) -> tuple[str, str, str | None, object] | None:
    """Split a simple wanted line into (head, value token, le, template key).

    On a cold parse the library reads one line per template; the other lines
    of that template take its labels (with their own ``le``) and their own
    name and value. The template is the label block, ``{...}``: vLLM repeats
    one block on most of its lines (``{engine="0",model_name="m"}`` on every
    gauge, counter, ``_sum`` and ``_count``), and its bucket lines differ only
    in their ``le`` (for a bucket the key is the block around the ``le`` value;
    vLLM 0.26: ~140 lines read, ~10 templates).

    That this is exactly the library's answer (prometheus_client.parser's
    ``_parse_sample``): ``name`` is a wanted name, so it holds no quote, brace
    or space and the label block starts right after it; the block is found and
    parsed by its own text alone (the first unquoted ``}`` after ``{``); and
    the template line's own answer had no timestamp and the value we read
    (checked in _run_library), so its block ends at the last ``}`` and the
    text after it is just the value, which ``_value`` reads by the library's
    rules. No backslash or tab anywhere, so no escape can differ. For a
    bucket: the first ``le="`` starts a term (after ``{`` or ``,``) outside
    quotes, so its value runs to the next quote, and that value is a plain
    number-like token: the library's scan goes through it the same way
    whatever its characters, so two such lines part only in the ``le`` it
    reports (and the template line's answer must carry its own ``le``,
    checked in _run_library). Any other line returns None and goes to the
    library itself. ``tests/unit/test_metrics_text_properties.py`` holds the cold
    parse to the uncached answer on edited and mutated payloads.
    """
    if "\\" in line or "\t" in line:
        return None
    head, sep, tok = line.rpartition(" ")
    n = len(name)
    if not sep or head[-1:] != "}" or head[n : n + 1] != "{":
        return None
    block = head[n:]
    if not bucket:
        return head, tok, None, block
    at = block.find('le="')
    if at < 1 or block[at - 1] not in "{," or block.count('"', 0, at) % 2:
        return None
    end = block.find('"', at + 4)
    le = block[at + 4 : end]
    if end < 0 or not _LE_VALUE.fullmatch(le):
        return None
    return head, tok, le, (block[: at + 4], block[end:])


def _run_library(
    lines: list[str],
    linenos: list[int],
    events: list[tuple[int, _Rec | None, Any]],
    cache: dict[str, _Rec | None] | None,
    tkeys: dict[int, tuple[object, str | None, str]] | None = None,
    templates: dict[object, Mapping[str, str]] | None = None,
) -> int:
    """Send ``lines`` to the library; append what each says to ``events``.

    Caches lines whose answer the cache would reproduce, and records the
    template of the lines in ``tkeys`` that parsed cleanly. Returns how many
    lines were unreadable.
    """
    skipped = 0
    for i, sample, exc in _library_samples(lines):
        line = lines[i]
        if exc is not None:
            skipped += 1
            msg = f"line {linenos[i]}: unreadable {_short(line)} ({type(exc).__name__}: {_short(str(exc), 60)})"
            events.append((linenos[i], None, msg))
            continue
        if sample.name not in _WANTED:
            continue
        rec = _Rec(sample.name, sample.labels)
        value = float(sample.value)
        events.append((linenos[i], rec, value))
        if cache is not None and sample.timestamp is None and "\t" not in line:
            head, sep, tok = line.rpartition(" ")
            try:
                ok = bool(sep) and _same(_value(tok), value)
            except (ValueError, OverflowError):
                ok = False
            if ok:
                if len(cache) >= _CACHE_MAX_ENTRIES:
                    cache.clear()
                cache[head] = rec
                if tkeys is not None and templates is not None and i in tkeys:
                    tkey, le, name = tkeys[i]
                    # the shortcut's premises, checked on the library's answer
                    if sample.name == name and (le is None or sample.labels.get("le") == le):
                        templates[tkey] = sample.labels
    return skipped


class _Collector:
    """Per-engine raw values, filled sample by sample."""

    def __init__(self, problems: _Problems) -> None:
        self.problems = problems
        # engine -> attribute -> series key -> value (several series of one
        # attribute, e.g. an unexpected extra label, are summed later)
        self.plain: dict[str | None, dict[str, dict[str, float]]] = {}
        # engine -> attribute -> label value -> value
        self.labelled: dict[str | None, dict[str, dict[str, float]]] = {}
        # engine -> family -> {"le": {bound: count}, "sum": x, "count": y}
        self.hists: dict[str | None, dict[str, dict[str, Any]]] = {}
        self.models: dict[str | None, str] = {}
        #: the engines whose families were filed ("vllm", "sglang"), in the order first seen
        self.kinds: list[str] = []
        self.model_names: list[str] = []
        self.seen: set[str] = set()
        self.duplicates = 0
        #: a ``vllm:`` sample was filed (a server-level family alone does not make a payload vLLM's)
        self.vllm = False
        # server-level families: attribute -> label value -> series key -> value
        self.server: dict[str, dict[str, dict[str, float]]] = {}
        # info gauges: attribute -> [(engine, label pairs, value)]
        self.infos: dict[str, list[tuple[str | None, tuple[tuple[str, str], ...], float]]] = {}

    def add(self, rec: _Rec, value: float) -> None:
        # Called for every line we read (~140 a payload, most of them histogram
        # buckets), so: one set operation to spot a duplicate, and no default dicts
        # built for setdefault() to throw away; the rare kinds in their own methods.
        seen = self.seen
        n = len(seen)
        seen.add(rec.key)
        if len(seen) == n:
            self._duplicate(rec)
        if rec.bad:
            self.problems.add(rec.bad)
            return
        kind = rec.kind
        if kind == "server" or kind == "info":
            self._add_server_level(rec, value)
            return
        if kind == "ignored":  # a split counter's value vtop does not read
            return
        self.vllm = True
        if not self.kinds or rec.name[:4] != self.kinds[0][:4]:
            self._kind(rec.name)
        engine = rec.engine
        if rec.model is not None and engine not in self.models:
            self._model(engine, rec.model)
        if kind == "hist_bucket":
            family, bound = rec.sub
            le = self._hist(engine, family)["le"]
            per = le.get(bound)
            if per is None:
                per = le[bound] = {}
            per[rec.series] = value
        elif kind == "gauge" or kind == "counter" or kind == "labelled":
            if not (0.0 <= value < math.inf):  # also False for NaN
                self.problems.add(f"{rec.key}: unusable value {value!r}")
            elif kind == "labelled":
                self.labelled.setdefault(engine, {}).setdefault(rec.attr, {})[rec.sub] = value
            else:
                self.plain.setdefault(engine, {}).setdefault(rec.attr, {})[rec.key] = value
        else:
            self._hist(engine, rec.sub)["sum" if kind == "hist_sum" else "count"][rec.series] = value

    def _kind(self, name: str) -> None:
        for prefix, kind in ENGINE_PREFIXES.items():
            if name.startswith(prefix) and kind not in self.kinds:
                self.kinds.append(kind)

    def _duplicate(self, rec: _Rec) -> None:
        self.duplicates += 1
        if self.duplicates <= 3:
            self.problems.add(f"duplicate series {rec.key}: kept the last value")

    def _add_server_level(self, rec: _Rec, value: float) -> None:
        """A server-level family (no engine) or an info gauge."""
        if not (0.0 <= value < math.inf):
            self.problems.add(f"{rec.key}: unusable value {value!r}")
        elif rec.kind == "server":
            self.server.setdefault(rec.attr, {}).setdefault(rec.sub, {})[rec.key] = value
        else:
            self.infos.setdefault(rec.attr, []).append((rec.engine, rec.sub, value))
        if rec.name.startswith(_ENGINE_FAMILY_PREFIXES):
            self.vllm = True
            self._kind(rec.name)

    def _model(self, engine: str | None, model: str) -> None:
        self.models[engine] = model
        if model not in self.model_names:
            self.model_names.append(model)

    def _hist(self, engine: str | None, family: str) -> dict[str, Any]:
        fams = self.hists.get(engine)
        if fams is None:
            fams = self.hists[engine] = {}
        h = fams.get(family)
        if h is None:
            h = fams[family] = {"le": {}, "sum": {}, "count": {}}
        return h


def _build_histogram(family: str, engine: str | None, raw: dict[str, Any], problems: _Problems) -> Histogram:
    buckets = _interned_buckets(sorted((b, math.fsum(per.values())) for b, per in raw["le"].items()))
    where = f"{family}{{engine={engine!r}}}"
    raw = {"sum": math.fsum(raw["sum"].values()) if raw["sum"] else None,
           "count": math.fsum(raw["count"].values()) if raw["count"] else None}
    if buckets:
        counts = [c for _, c in buckets]
        if any(b < a for a, b in zip(counts, counts[1:])):
            problems.add(f"{where}: bucket counts go down (not cumulative)")
        if buckets[-1][0] != math.inf:
            problems.add(f"{where}: no +Inf bucket")
        elif raw.get("count") is not None and not _same(raw["count"], buckets[-1][1]):
            problems.add(f"{where}: _count {raw['count']} differs from +Inf bucket {buckets[-1][1]}")
    return Histogram(buckets=buckets, sum=raw.get("sum"), count=raw.get("count"))


def _finishes(by_reason: Mapping[str, float], any_reason: float | None) -> dict[str, float]:
    """The finished requests by reason (vLLM's), with an engine's reason-less count (SGLang's) under
    :data:`FINISH_ANY_REASON`."""
    out = dict(by_reason)
    if any_reason is not None:
        out[FINISH_ANY_REASON] = any_reason
    return out


def _engine_row(engine: str | None, col: _Collector, problems: _Problems) -> EngineMetrics:
    plain = {attr: math.fsum(series.values()) for attr, series in col.plain.get(engine, {}).items()}
    lab = col.labelled.get(engine, {})
    hists = {
        fam: _build_histogram(fam, engine, raw, problems) for fam, raw in col.hists.get(engine, {}).items()
    }

    def hist(attr: str) -> Histogram | None:
        for fam, a in _HISTOGRAMS.items():
            if a == attr and fam in hists:
                return hists[fam]
        return None

    kv = plain.get("kv_new", plain.get("kv_old"))
    if kv is None and "kv_mean" in plain:  # SGLang's token_usage: one fraction per scheduler, averaged
        series = col.plain[engine]["kv_mean"]
        kv = math.fsum(series.values()) / len(series)
    if kv is not None and kv > 1.0 + 1e-9:
        problems.add(f"KV-cache usage {kv!r} on engine {engine!r} is above 1 (expected a fraction)")
        kv = None
    use_new_pc = "pc_queries_new" in plain
    off = lab.get("kv_offload_by_type", {})
    return EngineMetrics(
        engine=engine,
        model_name=col.models.get(engine),
        running=plain.get("running"),
        waiting=plain.get("waiting"),
        swapped=plain.get("swapped"),
        kv_cache_usage=kv,
        waiting_by_reason=dict(lab.get("waiting_by_reason", {})),
        prompt_tokens_total=plain.get("prompt_tokens_total"),
        generation_tokens_total=plain.get("generation_tokens_total"),
        preemptions_total=plain.get("preemptions_total"),
        prefix_cache_queries_total=plain.get("pc_queries_new" if use_new_pc else "pc_queries_old"),
        prefix_cache_hits_total=plain.get("pc_hits_new" if use_new_pc else "pc_hits_old"),
        request_success_total=_finishes(lab.get("request_success_total", {}), plain.get("finished_any_reason")),
        time_to_first_token_seconds=hist("time_to_first_token_seconds"),
        inter_token_latency_seconds=hist("itl_new") or hist("itl_old"),
        e2e_request_latency_seconds=hist("e2e_request_latency_seconds"),
        request_params_max_tokens=hist("request_params_max_tokens"),
        request_prompt_tokens=hist("request_prompt_tokens"),
        request_generation_tokens=hist("request_generation_tokens"),
        request_queue_time_seconds=hist("request_queue_time_seconds"),
        spec_drafts_total=plain.get("spec_drafts_total"),
        spec_draft_tokens_total=plain.get("spec_draft_tokens_total"),
        spec_accepted_tokens_total=plain.get("spec_accepted_tokens_total"),
        spec_accepted_per_pos=dict(lab.get("spec_accepted_per_pos", {})),
        prompt_tokens_by_source=dict(lab.get("prompt_tokens_by_source", {})),
        sleep_state=dict(lab.get("sleep_state", {})),
        kv_offload_store_bytes_total=_offload(plain, off, "kv_offload_store_bytes_total", "GPU_to_CPU"),
        kv_offload_load_bytes_total=_offload(plain, off, "kv_offload_load_bytes_total", "CPU_to_GPU"),
    )


def _offload(plain: Mapping[str, float], by_type: Mapping[str, float], attr: str, direction: str) -> float | None:
    """Offload bytes one way: the store/load counter where it has a series, else the older
    ``kv_offload_total_bytes_total{transfer_type}`` of that direction. vLLM 0.26.0 serves both,
    equal (21364736 stored in tests/fixtures/vllm/signals/h200-0.26.0/kv-offload), and gives the
    store/load counter a series only at the first transfer: the older one is 0 before it."""
    v = plain.get(attr)
    return v if v is not None else by_type.get(direction)


def _lora(infos: list[tuple[str | None, tuple[tuple[str, str], ...], float]] | None) -> dict[str, Any]:
    """The newest ``lora_requests_info`` series (its value is when it was set): adapters and max_lora."""
    if not infos:
        return {}
    _, pairs, _ = max(infos, key=lambda x: x[2])
    d = dict(pairs)

    def names(k: str) -> tuple[str, ...]:
        return tuple(n.strip() for n in d.get(k, "").split(",") if n.strip())

    try:
        mx: int | None = int(d["max_lora"])
    except (KeyError, ValueError):
        mx = None
    return {"lora_running": names("running_lora_adapters"), "lora_waiting": names("waiting_lora_adapters"),
            "lora_max": mx}


def _cache_config(infos: list[tuple[str | None, tuple[tuple[str, str], ...], float]] | None) -> Any:
    if not infos:
        return None
    return min(infos, key=lambda x: _engine_sort_key(x[0]))[1]


def _first(e: tuple[int, Any, Any]) -> int:
    return e[0]


def _sum(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return math.fsum(present) if present else None


def _sum_maps(maps: Iterable[Mapping[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for m in maps:
        for k, v in m.items():
            out[k] = out.get(k, 0.0) + v
    return out


def _sum_hists(name: str, hs: list[Histogram | None], problems: _Problems) -> Histogram | None:
    present = [h for h in hs if h is not None]
    if not present:
        return None
    if len(present) == 1:
        return present[0]
    bounds = [b for b, _ in present[0].buckets]
    if any([b for b, _ in h.buckets] != bounds for h in present[1:]):
        problems.add(f"{name}: engines have different buckets, no total")
        return None
    buckets = _interned_buckets((b, math.fsum(h.buckets[i][1] for h in present)) for i, b in enumerate(bounds))
    sums = [h.sum for h in present]
    counts = [h.count for h in present]
    return Histogram(
        buckets=buckets,
        sum=None if None in sums else math.fsum(s for s in sums if s is not None),
        count=None if None in counts else math.fsum(c for c in counts if c is not None),
    )


def _engine_sort_key(e: str | None) -> tuple[int, int, str]:
    if e is None:
        return (0, 0, "")
    if e.isascii() and e.isdigit() and len(e) < 18:
        return (1, int(e), e)
    return (2, 0, e)


HIST_ATTRS = (
    "time_to_first_token_seconds",
    "inter_token_latency_seconds",
    "e2e_request_latency_seconds",
    "request_params_max_tokens",
    "request_prompt_tokens",
    "request_generation_tokens",
    "request_queue_time_seconds",
)


def _coerce_text(payload: object, problems: _Problems) -> str | None:
    if isinstance(payload, str):
        return payload
    if isinstance(payload, (bytes, bytearray, memoryview)):
        raw = bytes(payload)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            problems.add("payload is not valid UTF-8: undecodable bytes replaced")
            return raw.decode("utf-8", errors="replace")
    problems.add(f"payload is not text ({type(payload).__name__})")
    return None


def parse_vllm_metrics(payload: str | bytes, *, use_cache: bool = True) -> VllmMetrics:
    """Parse a ``/metrics`` payload (text or bytes). Never raises.

    ``use_cache=False`` sends every wanted line through the library (the
    reference behaviour the cache is tested against).
    """
    problems = _Problems()
    try:
        return _parse(payload, problems, use_cache)
    except Exception as exc:  # noqa: BLE001 - a bug of ours must not take the dashboard down
        problems.add(f"internal error while parsing: {type(exc).__name__}: {exc}")
        return VllmMetrics(problems=problems.result())


def _parse(payload: object, problems: _Problems, use_cache: bool) -> VllmMetrics:
    """The pipeline: the text (:func:`_payload_lines`), each line read or set aside (:class:`_Scan`),
    the library's answers for the lines set aside, everything filed in line order (:class:`_Collector`),
    then one row per engine and the totals over engines (:func:`_metrics`)."""
    got = _payload_lines(payload, problems)
    if got is None:
        return VllmMetrics(problems=problems.result())
    text, lines = got
    scan = _Scan(problems, use_cache)
    scan.skipped = _cut_off_last_line(lines, problems)
    scan.read(lines)
    scan.ask_library()
    scan.file()
    col = scan.col
    rows = tuple(_engine_row(e, col, problems) for e in sorted(
        set(col.plain) | set(col.labelled) | set(col.hists), key=_engine_sort_key))
    if not scan.is_vllm:
        problems.add(_not_vllm(text, scan.saw_sample_shape))
    else:
        _missing_core(rows, problems, col.kinds[0] if col.kinds else None)
    return _metrics(rows, col, scan, problems)


def _payload_lines(payload: object, problems: _Problems) -> tuple[str, list[str]] | None:
    """The payload's text and its lines (split on ``"\\n"`` only, as the library does: io.StringIO),
    or None when there is nothing to read; a payload over ``MAX_PAYLOAD_CHARS`` is cut at a line's end."""
    text = _coerce_text(payload, problems)
    if text is None:
        return None
    if not text.strip():
        problems.add("empty payload")
        return None
    if len(text) > MAX_PAYLOAD_CHARS:
        cut = text.rfind("\n", 0, MAX_PAYLOAD_CHARS)
        text = text[: cut + 1 if cut >= 0 else MAX_PAYLOAD_CHARS]
        problems.add(f"payload larger than {MAX_PAYLOAD_CHARS} characters: the rest was ignored")
    return text, text.split("\n")


def _cut_off_last_line(lines: list[str], problems: _Problems) -> int:
    """prometheus_client always ends with a newline. A last line without one is a cut-off payload;
    its value may be cut too ("3398" of "339800.0"), which would read as a counter reset: drop it.
    Returns 1 when it was a line we read (a skipped line), else 0."""
    if not (lines and lines[-1].strip()):
        return 0
    last = lines[-1].strip()
    lines[-1] = ""
    if _NAME_RE.match(last).group() in _WANTED:  # type: ignore[union-attr]
        problems.add(f"payload cut off: ignored the unterminated last line {_short(last)}")
        return 1
    return 0


#: the prefixes of an engine's own families (a server-level family alone does not make a payload an engine's)
_ENGINE_FAMILY_PREFIXES = tuple(ENGINE_PREFIXES)
#: a comment line that says the payload is an engine's (vLLM's or SGLang's)
_VLLM_COMMENTS = tuple(f"# {w} {p}" for p in _ENGINE_FAMILY_PREFIXES for w in ("TYPE", "HELP"))
#: the sample lines that may hold a name we read
_READ_PREFIXES = (*_ENGINE_FAMILY_PREFIXES, "http_requests_total")
#: the line cache when it is not used (``use_cache=False``): every line misses
_NO_CACHE: dict[str, _Rec | None] = {}


class _Scan:
    """One parse's lines: each one filed at once (a line cache hit), skipped (a comment, a name we
    do not read), or set aside for the library; then the library's answers, and everything filed
    in line order.

    Cache hits and library results are applied in line order, so that the cache can never change
    which of two duplicate lines wins, or the problems' order: ``events`` holds (line number,
    record or None, value or problem text) from the first line set aside on."""

    def __init__(self, problems: _Problems, use_cache: bool) -> None:
        self.problems = problems
        self.use_cache = use_cache
        self.cache = _LINE_CACHE if use_cache else _NO_CACHE
        self.col = _Collector(problems)
        self.is_vllm = False
        self.saw_sample_shape = False
        self.skipped = 0
        self.events: list[tuple[int, _Rec | None, Any]] = []
        # the lines for the library, and their line numbers
        self.misses: list[str] = []
        self.miss_lineno: list[int] = []
        self.lib_budget_hit = False
        # A line with the label block of an earlier miss (a bucket: bar its le value) waits for that
        # line's library answer (see _line_template): misses index -> (template, le, name) of the first
        # line of each template, and the later lines as (lineno, line, name, head, tok, le, template).
        self.miss_tkey: dict[int, tuple[object, str | None, str]] = {}
        self.miss_tkey_seen: set[object] = set()
        self.derived: list[tuple[int, str, str, str, str, str | None, object]] = []

    def read(self, lines: list[str]) -> None:
        """Every line once. A cache hit is filed here and now: this loop is the whole of a warm parse
        (~140 sample lines), so it does the least it can for one (the value as ``_value`` reads it,
        inlined); the other lines that may hold a name we read are set aside, in order, for
        :meth:`_sort_aside`."""
        cache, events, add = self.cache, self.events, self.col.add
        aside: list[tuple[int, str]] = []
        is_vllm = False
        for lineno, raw in enumerate(lines, 1):
            line = raw.strip()
            if not line or line[0] == "#":
                is_vllm = is_vllm or line.startswith(_VLLM_COMMENTS)
                continue
            head, _, tok = line.rpartition(" ")
            rec = cache.get(head, _MISS) if "\t" not in line else _MISS
            if rec is None:  # a name we do not read
                continue
            if rec is not _MISS and "_" not in tok and tok == tok.strip():
                try:
                    v = float(tok)
                except ValueError:
                    pass  # let the library say what is wrong
                else:
                    if aside:  # an earlier line may wait to be filed: this one waits too, in line order
                        events.append((lineno, rec, v))
                    else:
                        add(rec, v)
                    continue
            if line.startswith(_READ_PREFIXES):
                aside.append((lineno, line))
        self.is_vllm = is_vllm
        if aside:
            self._sort_aside(aside)

    def _sort_aside(self, aside: list[tuple[int, str]]) -> None:
        """The lines the cache did not answer: each one for the library, or waiting for an earlier
        line's labels (:func:`_line_template`), or skipped (a name we do not read; over a limit: said)."""
        use_cache, cache, events = self.use_cache, self.cache, self.events
        misses, miss_lineno = self.misses, self.miss_lineno
        seen, first_of, derived = self.miss_tkey_seen, self.miss_tkey, self.derived
        chars = 0
        for lineno, line in aside:
            name = _NAME_RE.match(line).group()  # type: ignore[union-attr]
            if name not in _WANTED:  # cached as a name we do not read (bounded: emptied when full)
                head, sep, _ = line.rpartition(" ")
                if use_cache and sep and "\t" not in line:
                    if len(cache) >= _CACHE_MAX_ENTRIES:
                        cache.clear()
                    cache[head] = None
                continue
            self.saw_sample_shape = True
            if len(line) > MAX_LINE_CHARS:
                self.skipped += 1
                events.append((lineno, None, f"line {lineno}: {len(line)} characters, too long to parse: {_short(line)}"))
                continue
            if chars + len(line) > MAX_LIBRARY_CHARS_PER_PARSE:
                self.skipped += 1
                self.lib_budget_hit = True
                continue
            chars += len(line) + 1
            split = _line_template(line, name, _WANTED[name][0] == "hist_bucket") if use_cache else None
            if split is not None:
                head, tok, le, tkey = split
                if tkey in seen:
                    derived.append((lineno, line, name, head, tok, le, tkey))
                    continue
                seen.add(tkey)
                first_of[len(misses)] = (tkey, le, name)
            misses.append(line)
            miss_lineno.append(lineno)

    def ask_library(self) -> None:
        """The library reads the lines set aside; the lines that wait for a template take its labels."""
        if self.lib_budget_hit:
            self.problems.add(f"more than {MAX_LIBRARY_CHARS_PER_PARSE} characters of new lines: the rest was skipped")
        if not self.misses:
            return
        templates: dict[object, Mapping[str, str]] = {}
        self.skipped += _run_library(self.misses, self.miss_lineno, self.events,
                                     self.cache if self.use_cache else None, self.miss_tkey, templates)
        again, again_lineno = self._from_templates(templates)
        if again:
            self.skipped += _run_library(again, again_lineno, self.events, self.cache, None, None)

    def _from_templates(self, templates: Mapping[object, Mapping[str, str]]) -> tuple[list[str], list[int]]:
        """The lines that waited, read with their template's labels (and cached); those whose template
        line did not parse (or whose value is bad) are returned, for the library to say why."""
        again: list[str] = []
        again_lineno: list[int] = []
        events, cache = self.events, self.cache
        for lineno, line, name, head, tok, le, tkey in self.derived:
            tpl = templates.get(tkey)
            try:
                value = _value(tok) if tpl is not None else None
            except (ValueError, OverflowError):
                value = None
            if tpl is None or value is None:
                again.append(line)
                again_lineno.append(lineno)
                continue
            rec = _Rec(name, tpl if le is None else {**tpl, "le": le})
            events.append((lineno, rec, value))
            if len(cache) >= _CACHE_MAX_ENTRIES:
                cache.clear()
            cache[head] = rec
        return again, again_lineno

    def file(self) -> None:
        """What waited, filed in line order: samples into the collector, problems said."""
        col = self.col
        saw = self.saw_sample_shape or bool(col.seen)
        self.events.sort(key=_first)
        for _, rec, what in self.events:
            if rec is None:
                self.problems.add(what)
            else:
                col.add(rec, what)
                saw = True
        self.saw_sample_shape = saw
        self.is_vllm = self.is_vllm or col.vllm


def _not_vllm(text: str, saw_sample_shape: bool) -> str:
    """Why a payload without vLLM's families is not read, in one line."""
    low = text.lstrip()[:200].lower()
    if low.startswith("<") or "<html" in low:
        return "payload looks like HTML, not Prometheus text"
    if not saw_sample_shape and "# TYPE " not in text:
        return "payload does not look like Prometheus text"
    return ("no vllm: metrics (V1 with --disable-log-stats exports none)"
            "; no sglang: metrics either (SGLang serves them only with --enable-metrics)")


#: the families every server of an engine serves: said missing when no engine row has them, partial when
#: some lack them
_CORE: dict[str, tuple[tuple[str, str], ...]] = {
    "vllm": (
        ("vllm:num_requests_running", "running"),
        ("vllm:num_requests_waiting", "waiting"),
        ("vllm:kv_cache_usage_perc / vllm:gpu_cache_usage_perc", "kv_cache_usage"),
        ("vllm:prompt_tokens_total", "prompt_tokens_total"),
        ("vllm:generation_tokens_total", "generation_tokens_total"),
    ),
    "sglang": (
        ("sglang:num_running_reqs", "running"),
        ("sglang:num_queue_reqs", "waiting"),
        ("sglang:token_usage", "kv_cache_usage"),
        # the tokenizer's counters: a series only from the first request that finished (prometheus_client
        # makes a labelled family's series at its first .labels() call)
    ),
}


def _missing_core(rows: tuple[EngineMetrics, ...], problems: _Problems, kind: str | None = None) -> None:
    if not rows:
        return
    for what, attr in _CORE.get(kind or "vllm", _CORE["vllm"]):
        vals = [getattr(r, attr) for r in rows]
        if all(v is None for v in vals):
            problems.add(f"{what} missing")
        elif any(v is None for v in vals):
            problems.add(f"{what} missing on some engines: total is partial")


#: the totals over engines: summed numbers (None when no engine has one), and summed maps by label
_SUMMED = ("running", "waiting", "swapped", "prompt_tokens_total", "generation_tokens_total", "preemptions_total",
           "prefix_cache_queries_total", "prefix_cache_hits_total", "spec_drafts_total", "spec_draft_tokens_total",
           "spec_accepted_tokens_total", "kv_offload_store_bytes_total", "kv_offload_load_bytes_total")
_SUMMED_MAPS = ("waiting_by_reason", "request_success_total", "spec_accepted_per_pos", "prompt_tokens_by_source",
                "sleep_state")


def _spelling(maps: Iterable[Mapping[str, Any]], new: str, new_name: str, old: str, old_name: str) -> str | None:
    """Which spelling of a renamed family the payload used (the newer one when any engine has it)."""
    maps = list(maps)
    if any(new in m for m in maps):
        return new_name
    return old_name if any(old in m for m in maps) else None


def _metrics(rows: tuple[EngineMetrics, ...], col: _Collector, scan: _Scan, problems: _Problems) -> VllmMetrics:
    """The payload's snapshot: the engines' rows and their totals."""
    kv_vals = [r.kv_cache_usage for r in rows if r.kv_cache_usage is not None]
    # Any: the keys are HIST_ATTRS, known only at run time, so mypy cannot match them to VllmMetrics' fields
    hists: dict[str, Any] = {
        attr: _sum_hists(attr, [getattr(r, attr) for r in rows], problems) if len(rows) > 1 else
        (getattr(rows[0], attr) if rows else None)
        for attr in HIST_ATTRS
    }
    totals: dict[str, Any] = {attr: _sum(getattr(r, attr) for r in rows) for attr in _SUMMED}
    totals.update({attr: _sum_maps(getattr(r, attr) for r in rows) for attr in _SUMMED_MAPS})
    return VllmMetrics(
        is_vllm=scan.is_vllm,
        engine_kind=col.kinds[0] if col.kinds else None,
        engines=rows,
        model_name=col.model_names[0] if col.model_names else None,
        model_names=tuple(col.model_names),
        kv_cache_usage=math.fsum(kv_vals) / len(kv_vals) if kv_vals else None,
        http_requests_by_status={k: math.fsum(v.values()) for k, v in col.server.get("http_requests_by_status",
                                                                                   {}).items()},
        cache_config=_cache_config(col.infos.get("cache_config")),
        **_lora(col.infos.get("lora")),
        problems=problems.result(),
        skipped_lines=scan.skipped,
        kv_cache_metric=_spelling(col.plain.values(), "kv_new", "vllm:kv_cache_usage_perc",
                                  "kv_old", "vllm:gpu_cache_usage_perc")
        or _spelling(col.plain.values(), "kv_mean", "sglang:token_usage", "", ""),
        inter_token_metric=_spelling(col.hists.values(), "vllm:inter_token_latency_seconds",
                                     "vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds",
                                     "vllm:time_per_output_token_seconds")
        or _spelling(col.hists.values(), "sglang:inter_token_latency_seconds", "sglang:inter_token_latency_seconds",
                     "sglang:time_per_output_token_seconds", "sglang:time_per_output_token_seconds"),
        **totals,
        **hists,
    )
