"""What one ``/metrics`` scrape says, as plain frozen dataclasses (parsed by
:mod:`vtop.sources.prom`, read by the core's rates and trackers)."""

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
    #: ``vllm:request_success_total`` by ``finished_reason``.
    request_success_total: Mapping[str, float] = field(default_factory=dict, hash=False)
    time_to_first_token_seconds: Histogram | None = None
    #: ``inter_token_latency_seconds`` (0.11+) or else ``time_per_output_token_seconds``.
    inter_token_latency_seconds: Histogram | None = None
    e2e_request_latency_seconds: Histogram | None = None
    request_params_max_tokens: Histogram | None = None
    request_prompt_tokens: Histogram | None = None
    request_generation_tokens: Histogram | None = None


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

    #: Any ``vllm:`` family seen. False with ``--disable-log-stats`` (V1
    #: then exports no ``vllm:*`` at all) or when this is not vLLM.
    is_vllm: bool = False
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
