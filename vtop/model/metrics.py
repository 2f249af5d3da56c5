"""What one ``/metrics`` scrape says, as plain frozen dataclasses (parsed by
:mod:`vtop.sources.metrics_text`, read by the core's rates and trackers)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Histogram:
    """One Prometheus histogram as scraped: lifetime, cumulative.

    ``buckets`` are ``(upper_bound, cumulative_count)`` sorted by bound,
    ``+Inf`` last when present. Windowed quantiles come from *differences*
    of these between scrapes (:mod:`vtop.core.rates`), never from the
    lifetime counts, which after an hour say nothing about "now".
    """

    buckets: tuple[tuple[float, float], ...]
    sum: float | None
    count: float | None


@dataclass(frozen=True, slots=True)
class _Values:
    """Fields shared by one engine's row and the whole-server total."""

    model_name: str | None = None
    running: float | None = None
    waiting: float | None = None
    swapped: float | None = None
    #: KV-cache usage as a fraction 0..1 (multiply by 100 for a percentage).
    kv_cache_usage: float | None = None
    waiting_by_reason: Mapping[str, float] = field(default_factory=dict, hash=False)
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    preemptions_total: float | None = None
    prefix_cache_queries_total: float | None = None
    prefix_cache_hits_total: float | None = None
    #: ``vllm:request_success_total`` by ``finished_reason``; SGLang's finished requests, counted without a
    #: reason (``sglang:num_requests_total``), under the one key ``"total"`` (``metrics_text.FINISH_ANY_REASON``).
    request_success_total: Mapping[str, float] = field(default_factory=dict, hash=False)
    time_to_first_token_seconds: Histogram | None = None
    #: ``inter_token_latency_seconds`` (0.11+) or else ``time_per_output_token_seconds``.
    inter_token_latency_seconds: Histogram | None = None
    e2e_request_latency_seconds: Histogram | None = None
    request_params_max_tokens: Histogram | None = None
    request_prompt_tokens: Histogram | None = None
    request_generation_tokens: Histogram | None = None
    #: ``vllm:request_queue_time_seconds``: time from arrival to first scheduling (all versions).
    request_queue_time_seconds: Histogram | None = None
    #: Speculative decoding (only with ``--speculative-config``): drafts proposed, draft tokens
    #: proposed, draft tokens accepted (V1 0.8.5+; V0 had the last two, not the first).
    spec_drafts_total: float | None = None
    spec_draft_tokens_total: float | None = None
    spec_accepted_tokens_total: float | None = None
    #: ``vllm:spec_decode_num_accepted_tokens_per_pos_total`` by ``position`` ("0", "1", ...).
    spec_accepted_per_pos: Mapping[str, float] = field(default_factory=dict, hash=False)
    #: ``vllm:prompt_tokens_by_source_total`` by ``source`` (``local_compute``, ``local_cache_hit``,
    #: ``external_kv_transfer``; 0.20+).
    prompt_tokens_by_source: Mapping[str, float] = field(default_factory=dict, hash=False)
    #: ``vllm:engine_sleep_state`` by ``sleep_state`` (``awake``, ``weights_offloaded``, ``discard_all``;
    #: 1/0 each, 0.12+); summed over engines in the total (``awake`` = how many engines are awake).
    sleep_state: Mapping[str, float] = field(default_factory=dict, hash=False)
    #: KV offload (``--kv-offloading-size``, the OffloadingConnector): bytes stored to and loaded from
    #: the offload tier (``vllm:kv_offload_store_bytes_total`` / ``..._load_bytes_total``; from source only)
    kv_offload_store_bytes_total: float | None = None
    kv_offload_load_bytes_total: float | None = None


@dataclass(frozen=True, slots=True)
class EngineMetrics(_Values):
    """One data-parallel engine's row.

    ``engine`` is the ``engine`` label ("0".."N-1"), or ``None`` for V0 and
    0.7.x, which have no such label.
    """

    engine: str | None = None


@dataclass(frozen=True, slots=True)
class VllmMetrics(_Values):
    """A whole ``/metrics`` payload. The value fields are the server total:
    counts, counters and histograms summed over engines, KV usage averaged
    (as vLLM's own log aggregator does).
    """

    #: Any engine family (``vllm:``, ``sglang:``) seen. False with ``--disable-log-stats`` (V1
    #: then exports no ``vllm:*`` at all) or when this is not vLLM.
    is_vllm: bool = False
    #: whose families the payload holds: "vllm" (``vllm:``), "sglang" (``sglang:``, with
    #: ``--enable-metrics``), None when neither (the first seen where a payload had both)
    engine_kind: str | None = None
    engines: tuple[EngineMetrics, ...] = ()
    model_names: tuple[str, ...] = ()
    #: Human-readable, one per thing that could not be read.
    problems: tuple[str, ...] = ()
    #: Sample lines we wanted but could not read.
    skipped_lines: int = 0
    #: Which KV gauge was read ("vllm:kv_cache_usage_perc"/"vllm:gpu_cache_usage_perc").
    kv_cache_metric: str | None = None
    #: Which inter-token histogram was read.
    inter_token_metric: str | None = None
    #: Seconds between the scrape that read the histogram fields and this one: 0 when
    #: this payload had them; more when a scraper asked for the other samples only and
    #: carried the last histograms over (``vtop.sources.vllm``, ``HIST_EVERY_S``).
    histograms_age_s: float = 0.0
    #: ``http_requests_total`` (prometheus-fastapi-instrumentator, the API server's, no ``engine``)
    #: summed by ``status`` ("2xx", "4xx", "5xx"; or codes where a build does not group them).
    http_requests_by_status: Mapping[str, float] = field(default_factory=dict, hash=False)
    #: ``vllm:lora_requests_info`` (only with ``--enable-lora``): its newest series (the value is the
    #: time it was set): adapters running, waiting (names), and ``max_lora``. None: no such family.
    lora_running: tuple[str, ...] | None = None
    lora_waiting: tuple[str, ...] | None = None
    lora_max: int | None = None
    #: ``vllm:cache_config_info`` labels of the first engine (``block_size``, ``cache_dtype``,
    #: ``num_gpu_blocks``, ``gpu_memory_utilization``, ``enable_prefix_caching``, ...), ``engine`` left out.
    cache_config: tuple[tuple[str, str], ...] | None = None
