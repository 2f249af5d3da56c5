"""The fleet's PromQL: a handful of aggregated queries per refresh, whatever the fleet's size.

One row per vLLM or SGLang instance (``job``, ``instance``; its ``model_name``), data-parallel
``engine`` rows summed (counts, counters) or averaged (KV usage, as vLLM's own log
aggregator does) by the query itself. Each query puts several expressions into one
answer with ``or``, each tagged by ``label_replace`` with a ``vtop_m`` label saying what
it is, so a refresh is a handful of queries for 1,000 instances as for one (which of them each
refresh asks: :meth:`vtop.monitor.fleet.Fleet.refresh`):

* :func:`vllm_query` the gauges and the *cumulative* counters the rules need (running,
  waiting, KV usage, generation / prompt tokens, preemptions, finishes by reason) and the
  sample's own timestamp (staleness). Counters stay cumulative on purpose: the same
  :class:`~vtop.core.server.ServerTracker` windows that read a local scrape turn them into
  rates, and the same rules judge them (a runaway is "nothing finished for 2 min").
* :func:`rates_query` TTFT p50/p99 over the last minute, computed by Prometheus
  (``histogram_quantile`` over ``rate`` of the buckets: the buckets of 1,000 instances would be
  ~23,000 series). Generation tokens/s, preemptions/s and finishes by reason come from the
  trackers' windows over the counters, as on the box.
* :func:`up_query` ``up`` of every target of a job that has vLLM series: DOWN is ``up == 0``.
* :func:`gpu_query` the hosts' GPUs from NVIDIA's DCGM exporter, aggregated per host, and
  the GPUs whose last XID error is non-zero within 10 minutes.

vLLM's metric names across versions (from vLLM's own ``vllm/v1/metrics/loggers.py`` and
``vllm/engine/metrics.py``; 0.6 to 0.33): ``vllm:kv_cache_usage_perc`` (0.9.2+) else
``vllm:gpu_cache_usage_perc`` (<= 0.11; 0.9.2-0.10 export both: the ``or`` keeps the new
one), both 0..1; counters always end in ``_total`` on the wire; ``engine`` is the
data-parallel index (absent in V0 and 0.7); finish reasons are the ``finished_reason``
label of ``vllm:request_success_total``.

SGLang (``--enable-metrics``) serves its own names: each query asks for them beside vLLM's, the names
taken from the one table of them (:data:`vtop.sources.metrics_text.SGLANG_BESIDE_VLLM`: each SGLang
family and the vLLM family it is read as), so an instance of either engine is a row, and the answer's
``__name__`` says which engine it is (:data:`ENGINE_OF`). SGLang labels its scheduler's gauges with its
ranks (``tp_rank``, ``pp_rank``, ``dp_rank``...) and its tokenizer's counters with ``is_streaming``: the
same sums over the other labels read them, as the local scrape does (:mod:`vtop.sources.metrics_text`). Its
data-parallel groups are told apart by ``dp_rank`` as vLLM's engines by ``engine``. SGLang has no
finish-reason counter: its finished requests are ``sglang:num_requests_total`` (one a finished request, no
reason), which the table reads as vLLM's ``request_success_total``; its row's finishes are that count under
one key, :data:`~vtop.sources.metrics_text.FINISH_ANY_REASON`. Its token counters are one family
split by a label (:data:`vtop.sources.metrics_text.SGLANG_BY_LABEL`: ``realtime_tokens_total`` by ``mode``,
grown each scheduler step; the ``prompt_tokens_total`` / ``generation_tokens_total`` it also serves grow only
when a request finishes and are not read): a tagged sum per vLLM counter (:func:`_by_label_parts`).

DCGM names and labels: NVIDIA's dcgm-exporter, its default counters file
``etc/default-counters.csv`` (``DCGM_FI_DEV_GPU_UTIL`` gauge, GPU utilization in %;
``DCGM_FI_PROF_SM_ACTIVE`` gauge, the ratio 0..1 of cycles an SM has a warp resident;
``DCGM_FI_DEV_FB_USED`` / ``DCGM_FI_DEV_FB_FREE`` gauges, framebuffer memory in MiB;
``DCGM_FI_DEV_POWER_USAGE`` gauge, W; ``DCGM_FI_DEV_XID_ERRORS`` gauge, the value of the
last XID error, 0 for none), and the labels the exporter puts on every series: ``gpu``
(the index), ``UUID``, ``device`` (nvidia0), ``modelName`` (``NVIDIA H200``), ``Hostname``
(the node's host name), plus Prometheus' own ``instance`` / ``job`` of the exporter.
A host's GPUs are joined to a vLLM instance by host: the host part of the vLLM target's
``instance`` equals the exporter target's host or its ``Hostname`` label.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from vtop.sources.metrics_text import ENGINE_PREFIXES, FINISH_ANY_REASON, SGLANG_BESIDE_VLLM, SGLANG_BY_LABEL
from vtop.sources.prometheus import Series, Vector

__all__ = [
    "DCGM_METRICS",
    "GpuPoint",
    "FleetHost",
    "Instance",
    "gpu_detail_query",
    "GPU_PARTS",
    "gpu_query",
    "ts_query",
    "parse_ts",
    "host_of",
    "rates_query",
    "Rates",
    "parse_gpu_detail",
    "parse_gpus",
    "parse_gpu_part",
    "merge_gpu_parts",
    "parse_rates",
    "parse_up",
    "parse_vllm",
    "parse_vllm_range",
    "selector",
    "up_query",
    "vllm_query",
    "vllm_queries",
    "VLLM_NAMES",
    "NAMES",
    "ENGINE_OF",
    "FINISH_ENGINES",
    "GPU_NAMES",
    "vtop_query",
    "parse_vtop",
    "BoxView",
]

G = "job, instance, model_name"
J = "job, instance"
GH = "instance, Hostname"
TAG = "vtop_m"

DCGM_METRICS = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE",
                "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_XID_ERRORS")

# The optional vtop exporter (`vtop export` on a box, scraped by the same Prometheus):
# vtop_startup_phase{server,phase}=1, vtop_startup_phase_seconds{server},
# vtop_oldest_request_age_seconds{server}, vtop_alert{subject,rule,severity}=1, ``server`` /
# ``subject`` being the URL vtop watches there. They join to the instance on the exporter's host
# with the URL's port: what only the box knows (the startup phase from the log, its alerts),
# on the fleet's row.


def _tag(name: str, expr: str) -> str:
    return f'label_replace({expr}, "{TAG}", "{name}", "", "")'


def selector(job: str | None = None, instance: str | None = None) -> str:
    """A label matcher for one instance (the drill-in) or none (the whole fleet)."""
    parts = []
    if job:
        parts.append(f'job="{_esc(job)}"')
    if instance:
        parts.append(f'instance="{_esc(instance)}"')
    return "{" + ",".join(parts) + "}" if parts else ""


def _esc(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"')


def _names(names: Iterable[str], sel: str = "", prefix: str = "vllm:") -> str:
    """A selector of several metric names at once (``{__name__=~"vllm:(a|b)", ...sel}``)."""
    inner = sel[1:-1] if sel.startswith("{") and sel.endswith("}") else ""
    alt = "|".join(names)
    return "{" + f'__name__=~"{prefix}({alt})"' + (f",{inner}" if inner else "") + "}"


#: what each metric of the vLLM queries is, by the ``__name__`` its answer keeps
#: (``sum by (..., __name__)``: one aggregation over several metrics, no ``label_replace``)
VLLM_NAMES = {
    "vllm:num_requests_running": "running", "vllm:num_requests_waiting": "waiting",
    "vllm:generation_tokens_total": "gen", "vllm:prompt_tokens_total": "prompt",
    "vllm:num_preemptions_total": "preempt", "vllm:kv_cache_usage_perc": "kv", "vllm:gpu_cache_usage_perc": "kv",
    "vllm:request_success_total": "fin",
}


def _beside(vllm_name: str) -> tuple[str, ...]:
    """``vllm_name`` and every other engine's name read as it (the one table, ``SGLANG_BESIDE_VLLM``)."""
    return (vllm_name, *(n for n, v in SGLANG_BESIDE_VLLM.items() if v == vllm_name))


#: what each metric of the fleet's queries is, every engine's names (vLLM's and those the table reads as them)
NAMES: dict[str, str] = {n: what for v, what in VLLM_NAMES.items() for n in _beside(v)}
#: the engine of each of those names ("vllm", "sglang"), by its prefix
ENGINE_OF: dict[str, str] = {n: e for n in NAMES for p, e in ENGINE_PREFIXES.items() if n.startswith(p)}
#: the engines that count finished requests, by reason or not (a row of another engine has no finishes: a gap)
FINISH_ENGINES: frozenset[str] = frozenset(ENGINE_OF[n] for n, what in NAMES.items() if what == "fin")
#: the labels that tell an instance's data-parallel engines apart: vLLM's ``engine``, SGLang's ``dp_rank``
DP_LABELS = "engine, dp_rank"


def _any(vllm_names: Iterable[str], sel: str = "", suffix: str = "") -> str:
    """A selector of the given vLLM names and every other engine's read as them
    (``{__name__=~"vllm:a|sglang:b", ...sel}``; one name alone as ``name{sel}``)."""
    names = [n + suffix for v in vllm_names for n in _beside(v)]
    if len(names) == 1:
        return names[0] + sel
    inner = sel[1:-1] if sel.startswith("{") and sel.endswith("}") else ""
    return "{" + f'__name__=~"{"|".join(names)}"' + (f",{inner}" if inner else "") + "}"


_RUNNING = ("vllm:num_requests_running",)


def _by_label_parts(vllm_names: Iterable[str], sel: str = "") -> tuple[str, ...]:
    """The parts that read another engine's counter split by a label as the given vLLM counters
    (:data:`SGLANG_BY_LABEL`): per vLLM counter, the sum per (job, instance) of the label values read
    as it, tagged with what it is (``sum by (job, instance) (name{mode=~"a|b", ...sel})``: the sum keeps
    no ``__name__`` to say it)."""
    inner = sel[1:-1] if sel.startswith("{") and sel.endswith("}") else ""
    out = []
    for name, (label, values) in SGLANG_BY_LABEL.items():
        for vllm_name in vllm_names:
            vals = sorted(v for v, (_attr, beside) in values.items() if beside == vllm_name)
            if not vals or vllm_name not in VLLM_NAMES:
                continue
            m = f'{label}="{vals[0]}"' if len(vals) == 1 else f'{label}=~"{"|".join(vals)}"'
            out.append(_tag(VLLM_NAMES[vllm_name], f"sum by ({J}) ({name}{{{m}{',' + inner if inner else ''}}})"))
    return tuple(out)


def vllm_queries(sel: str = "", ts: bool = True) -> tuple[str, str]:
    """:func:`vllm_query` in two halves of about equal cost, asked at once: Prometheus evaluates
    each on its own core (1,000 instances, Debian's 2.42 on 2 cores: ~35 ms each, against 92 ms
    for the whole in one query, whose ``label_replace`` over every part cost a third of it).

    The gauges and token counters: one aggregation over several metrics, grouped by
    ``__name__`` too, so each answer says what it is without a tag; the rest (finishes by reason,
    the data-parallel engine count, the sample time). ``ts=False``: without the sample time, for a
    refresh that asks :func:`ts_query` at the same moment (1,000 instances: ~10 ms of Prometheus' CPU
    not spent twice)."""
    counters = ("vllm:num_requests_waiting", "vllm:generation_tokens_total", "vllm:prompt_tokens_total",
                "vllm:num_preemptions_total")
    return (
        " or ".join((
            f"sum by ({G}, __name__) ({_any(_RUNNING, sel)})",
            f"sum by ({J}, __name__) ({_any(counters, sel)})",
            # ``or`` matches label sets without the metric name: an untagged KV part would be taken
            # for the counters' (the same job, instance) and dropped
            _tag("kv", f"avg by ({J}, __name__) ({_any(('vllm:kv_cache_usage_perc', 'vllm:gpu_cache_usage_perc'), sel)})"),
            *_by_label_parts(counters, sel),
        )),
        " or ".join((
            # tagged: an engine's finish count without a reason (SGLang's num_requests_total) has the labels
            # (job, instance) alone, which ``or`` (matching without the metric name) takes for the counters'
            # in the whole query (the history's) and drops
            _tag("fin", f"sum by ({J}, __name__, finished_reason) ({_any(('vllm:request_success_total',), sel)}) > 0"),
            _tag("engines", f"count by ({J}) (group by ({J}, {DP_LABELS}) ({_any(_RUNNING, sel)})) > 1"),
            *((ts_query(sel),) if ts else ()),
        )),
    )


def vllm_query(sel: str = "") -> str:
    """Gauges, cumulative counters and the sample time of every vLLM instance (one query; a
    refresh asks its two halves at once, :func:`vllm_queries`).

    Kept small, since its answer is parsed every refresh (1,000 instances: ~10,000 series):
    ``model_name`` rides on one series only, finish reasons come back only where non-zero
    (``stop`` and ``length`` in practice; the rules read their sum and ``length``), and the
    engine count only where there are several (data parallel). vLLM 0.9.2-0.10 export both KV
    usage names: both come back, the same number."""
    return " or ".join(vllm_queries(sel))


def ts_query(sel: str = "") -> str:
    """The newest scrape time of every vLLM instance: :func:`vllm_query`'s ``ts`` part alone, cheap
    (1,000 instances: ~8 ms for Prometheus, ~90 kB). A refresh asks it first and asks the whole
    :func:`vllm_query` only when an instance has a scrape vtop has not read: Prometheus answers the
    same samples until the next scrape."""
    return _tag("ts", f"max by ({J}) (timestamp({_any(_RUNNING, sel)}))")


def rates_query(window: str = "1m", sel: str = "", parts: tuple[str, ...] = ("ttft_p50", "ttft_p99")) -> str:
    """TTFT p50 and p99 over ``window`` per instance, by ``histogram_quantile`` over ``rate`` of
    the buckets, computed by Prometheus (the buckets of 1,000 instances are ~23,000 series);
    an instance with no first token in the window gives no series (NaN is dropped). ``parts``: one
    quantile alone costs Prometheus half (1,000 instances: ~0.14 s each)."""
    b = f"sum by ({J}, le) (rate({_any(('vllm:time_to_first_token_seconds',), sel, '_bucket')}[{window}]))"
    qs = {"ttft_p50": "0.5", "ttft_p99": "0.99"}
    return " or ".join(_tag(p, f"histogram_quantile({qs[p]}, {b}) >= 0") for p in parts)


def up_query(lookback: str = "15m") -> str:
    """``up`` of every target of a job that had vLLM or SGLang series within ``lookback``."""
    return f"up and on(job) group by (job) (last_over_time({_any(_RUNNING)}[{lookback}]))"


GPU_PARTS = ("n", "util_sm", "mem_power", "xid")

#: what each DCGM metric of :func:`gpu_query` is, by the ``__name__`` its answer keeps
GPU_NAMES = {"DCGM_FI_DEV_GPU_UTIL": "util", "DCGM_FI_PROF_SM_ACTIVE": "sm", "DCGM_FI_DEV_FB_USED": "used",
             "DCGM_FI_DEV_FB_FREE": "free", "DCGM_FI_DEV_POWER_USAGE": "power"}


def gpu_query(sel: str = "", parts: tuple[str, ...] = GPU_PARTS) -> str:
    """Per host: GPU count, mean GPU-Util and SM activity, framebuffer used and free (summed: the
    host's memory in percent is worked out here) and power; and each GPU with a non-zero XID
    within 10 minutes (few: a healthy fleet returns none). Metrics read alike share one
    aggregation grouped by ``__name__``. ``parts``: some of these alone (1,000 hosts of 8 GPUs,
    Debian's Prometheus 2.42 on 2 cores: ``n`` 46 ms, ``util_sm`` 91, ``mem_power`` 119, ``xid``
    47; the three aggregations of the host's memory in percent were 200 ms with power and XID)."""
    exprs = {
        "n": _tag("n", f"count by ({GH}) (DCGM_FI_DEV_GPU_UTIL{sel})"),
        # tagged as well: ``or`` matches label sets without the metric name, and the two parts have
        # the same (instance, Hostname): joined untagged, the second would be dropped
        "util_sm": _tag("util_sm", f"avg by ({GH}, __name__) "
                                   f"({_names(('DCGM_FI_DEV_GPU_UTIL', 'DCGM_FI_PROF_SM_ACTIVE'), sel, '')})"),
        "mem_power": _tag("mem_power", f"sum by ({GH}, __name__) "
                                       f"({_names(('DCGM_FI_DEV_FB_USED', 'DCGM_FI_DEV_FB_FREE', 'DCGM_FI_DEV_POWER_USAGE'), sel, '')})"),
        "xid": _tag("xid", f"max by ({GH}, gpu) (max_over_time(DCGM_FI_DEV_XID_ERRORS{sel}[10m])) > 0"),
    }
    return " or ".join(exprs[p] for p in parts)


def vtop_query() -> str:
    """What ``vtop export`` says on each box (nothing when no box runs it: an empty answer)."""
    return " or ".join((
        _tag("phase", "vtop_startup_phase == 1"),
        _tag("phase_s", "vtop_startup_phase_seconds"),
        _tag("oldest", "vtop_oldest_request_age_seconds"),
        _tag("alert", "vtop_alert == 1"),
    ))


def gpu_detail_query(host: str) -> str:
    """Every GPU of one host, every DCGM field vtop shows (a range query for the drill-in)."""
    names = "|".join(DCGM_METRICS)
    h = re.escape(host).replace("\\", "\\\\").replace('"', '\\"')
    return (f'{{__name__=~"{names}", Hostname="{_esc(host)}"}} '
            f'or {{__name__=~"{names}", instance=~"{h}(:[0-9]+)?"}}')


# --------------------------------------------------------------------------- answers


def host_of(instance: str) -> str:
    """``gpu-7:8000`` -> ``gpu-7``; ``[::1]:8000`` -> ``::1``."""
    s = instance.strip()
    if s.startswith("["):
        return s[1:s.index("]")] if "]" in s else s
    return s.rsplit(":", 1)[0] if s.count(":") == 1 else s


@dataclass(slots=True)
class Instance:
    """What one refresh says about one vLLM or SGLang instance (None: no number)."""

    job: str
    instance: str
    model_name: str | None = None
    engine: str | None = None
    """Whose families it serves ("vllm", "sglang": :data:`ENGINE_OF` of its names)."""
    running: float | None = None
    waiting: float | None = None
    kv: float | None = None
    gen: float | None = None
    prompt: float | None = None
    preempt: float | None = None
    finished: dict[str, float] = field(default_factory=dict)
    engines: int | None = None
    ts: float | None = None
    """Prometheus' timestamp of the newest sample (its scrape)."""

    @property
    def key(self) -> str:
        return f"{self.job}/{self.instance}"


def _key(labels: dict[str, str]) -> tuple[str, str]:
    return labels.get("job", ""), labels.get("instance", "")


_SCALARS = ("running", "waiting", "kv", "gen", "prompt", "preempt")


def _put(inst: Instance, labels: dict[str, str], what: str, v: float | None) -> None:
    mn = labels.get("model_name")
    if mn and inst.model_name is None:
        inst.model_name = mn
    if inst.engine is None:
        inst.engine = ENGINE_OF.get(labels.get("__name__", ""))
    if what in _SCALARS:
        if v is None:
            return
        old = getattr(inst, what)
        # two model_name groups on one instance (a renamed model across a restart): add counts;
        # KV usage is one pool, the larger stands
        setattr(inst, what, v if old is None else (max(old, v) if what == "kv" else old + v))
    elif what == "fin":
        # vLLM's by finished_reason; an engine's count without a reason (SGLang's, read as it by the one
        # table) is every finish, under FINISH_ANY_REASON
        r = labels.get("finished_reason", FINISH_ANY_REASON)
        if v is not None:
            inst.finished[r] = inst.finished.get(r, 0.0) + v
    elif what == "engines":
        if v is not None:
            inst.engines = int(v) + (inst.engines or 0)
    elif what == "ts" and v is not None:
        inst.ts = v if inst.ts is None else max(inst.ts, v)


def parse_vllm(vec: Vector) -> dict[tuple[str, str], Instance]:
    """:func:`vllm_query`'s answer -> one :class:`Instance` per (job, instance)."""
    out: dict[tuple[str, str], Instance] = {}
    for labels, v in vec:
        what = NAMES.get(labels.get("__name__", "")) or labels.get(TAG)
        if what is None:
            continue
        k = _key(labels)
        inst = out.get(k)
        if inst is None:
            inst = out[k] = Instance(k[0], k[1])
        _put(inst, labels, what, v)
    return out


def parse_vllm_range(series: Iterable[Series]) -> dict[float, dict[tuple[str, str], Instance]]:
    """:func:`vllm_query`'s range answer -> per step time, the instances as :func:`parse_vllm` makes them."""
    steps: dict[float, dict[tuple[str, str], Instance]] = {}
    for s in series:
        what = NAMES.get(s.labels.get("__name__", "")) or s.labels.get(TAG)
        if what is None:
            continue
        k = _key(s.labels)
        for t, v in s.points:
            row = steps.get(t)
            if row is None:
                row = steps[t] = {}
            inst = row.get(k)
            if inst is None:
                inst = row[k] = Instance(k[0], k[1])
            _put(inst, s.labels, what, v)
    return dict(sorted(steps.items()))


@dataclass(slots=True)
class Rates:
    """:func:`rates_query`'s numbers for one instance."""

    ttft_p50: float | None = None
    ttft_p99: float | None = None


def parse_rates(vec: Vector) -> dict[tuple[str, str], Rates]:
    out: dict[tuple[str, str], Rates] = {}
    for labels, v in vec:
        what = labels.get(TAG)
        if what not in ("ttft_p50", "ttft_p99"):
            continue
        r = out.get(_key(labels))
        if r is None:
            r = out[_key(labels)] = Rates()
        setattr(r, what, v)
    return out


def parse_ts(vec: Vector) -> dict[tuple[str, str], float | None]:
    """:func:`ts_query`'s answer -> (job, instance) -> the newest scrape's time."""
    return {_key(labels): v for labels, v in vec if labels.get(TAG) == "ts"}


def parse_up(vec: Vector) -> dict[tuple[str, str], float | None]:
    return {_key(labels): v for labels, v in vec}


@dataclass(slots=True)
class FleetHost:
    """One host's GPUs, aggregated (DCGM exporter)."""

    host: str
    """``Hostname``, else the exporter target's host."""
    exporter: str
    n: int | None = None
    util: float | None = None
    sm: float | None = None
    """Mean SM activity in percent (DCGM gives a 0..1 ratio)."""
    mem_pct: float | None = None
    """Framebuffer used over used + free, all GPUs of the host."""
    power_w: float | None = None
    xid: dict[str, float] = field(default_factory=dict)
    """GPU index -> the last non-zero XID within 10 minutes."""

    def names(self) -> set[str]:
        return {self.host, host_of(self.exporter)}


def parse_gpus(vec: Vector) -> dict[str, FleetHost]:
    """:func:`gpu_query`'s answer -> one :class:`FleetHost` per host, keyed by every name it
    answers to (its ``Hostname`` and its exporter's host)."""
    return merge_gpu_parts([parse_gpu_part(vec)])


def parse_gpu_part(vec: Vector) -> dict[tuple[str, str], FleetHost]:
    """The answer of some of :data:`GPU_PARTS` -> per (exporter, host name), a :class:`FleetHost` with
    what that answer says (a refresh asks one part at a time: each is parsed once, as it comes)."""
    hosts: dict[tuple[str, str], FleetHost] = {}
    mem: dict[tuple[str, str], list[float | None]] = {}
    for labels, v in vec:
        what = GPU_NAMES.get(labels.get("__name__", "")) or labels.get(TAG)
        if what is None:
            continue
        exp = labels.get("instance", "")
        hn = labels.get("Hostname") or host_of(exp)
        h = hosts.get((exp, hn))
        if h is None:
            h = hosts[(exp, hn)] = FleetHost(hn, exp)
        if what == "xid":
            if v is not None:
                h.xid[labels.get("gpu", "?")] = v
        elif what == "n":
            h.n = None if v is None else int(v)
        elif what == "sm":
            h.sm = None if v is None else 100.0 * v
        elif what in ("used", "free"):
            mem.setdefault((exp, hn), [None, None])[what == "free"] = v
        elif what in ("util", "power"):
            setattr(h, {"power": "power_w"}.get(what, what), v)
    for k, (used, free) in mem.items():
        if used is not None and free is not None and used + free > 0:
            hosts[k].mem_pct = 100.0 * used / (used + free)
    return hosts


def merge_gpu_parts(parts: Iterable[dict[tuple[str, str], FleetHost]]) -> dict[str, FleetHost]:
    """:func:`parse_gpu_part`'s answers of different parts -> one :class:`FleetHost` per host (each
    field from the part that has it: :data:`GPU_PARTS` share none, and a host's framebuffer used
    and free come in one), keyed by every name it answers to."""
    hosts: dict[tuple[str, str], FleetHost] = {}
    for part in parts:
        for k, p in part.items():
            h = hosts.get(k)
            if h is None:
                hosts[k] = FleetHost(p.host, p.exporter, p.n, p.util, p.sm, p.mem_pct, p.power_w, dict(p.xid))
                continue
            if p.n is not None:
                h.n = p.n
            if p.util is not None:
                h.util = p.util
            if p.sm is not None:
                h.sm = p.sm
            if p.mem_pct is not None:
                h.mem_pct = p.mem_pct
            if p.power_w is not None:
                h.power_w = p.power_w
            if p.xid:
                h.xid.update(p.xid)
    out: dict[str, FleetHost] = {}
    for h in hosts.values():
        for name in h.names():
            out.setdefault(name, h)
    return out


@dataclass(slots=True)
class GpuPoint:
    """One GPU at one step of the drill-in's range query."""

    index: int
    name: str
    uuid: str | None
    util: float | None = None
    sm: float | None = None
    fb_used_mib: float | None = None
    fb_free_mib: float | None = None
    power_w: float | None = None
    xid: float | None = None


_DETAIL_FIELD = {"DCGM_FI_DEV_GPU_UTIL": "util", "DCGM_FI_PROF_SM_ACTIVE": "sm", "DCGM_FI_DEV_FB_USED": "fb_used_mib",
                 "DCGM_FI_DEV_FB_FREE": "fb_free_mib", "DCGM_FI_DEV_POWER_USAGE": "power_w",
                 "DCGM_FI_DEV_XID_ERRORS": "xid"}


def parse_gpu_detail(series: Iterable[Series]) -> dict[float, dict[int, GpuPoint]]:
    """:func:`gpu_detail_query`'s range answer -> per step time, per GPU index, its point."""
    steps: dict[float, dict[int, GpuPoint]] = {}
    for s in series:
        fld = _DETAIL_FIELD.get(s.labels.get("__name__", ""))
        try:
            idx = int(s.labels.get("gpu", ""))
        except ValueError:
            continue
        if fld is None:
            continue
        for t, v in s.points:
            row = steps.setdefault(t, {})
            p = row.get(idx)
            if p is None:
                p = row[idx] = GpuPoint(idx, s.labels.get("modelName") or "GPU", s.labels.get("UUID"))
            if fld == "sm" and v is not None:
                v = 100.0 * v
            setattr(p, fld, v)
    return dict(sorted(steps.items()))


@dataclass(slots=True)
class BoxView:
    """What vtop on the box exports about one of its servers."""

    phase: str | None = None
    phase_s: float | None = None
    oldest_s: float | None = None
    alerts: list[tuple[str, str]] = field(default_factory=list)
    """(rule, severity)"""


def _server_key(exporter_instance: str, url: str) -> tuple[str, str] | None:
    """(host, port) of a server URL as vtop on a box names it; a loopback host is the exporter's host."""
    from urllib.parse import urlsplit

    try:
        u = urlsplit(url if "://" in url else "http://" + url)
        port = u.port
    except ValueError:
        return None
    host = u.hostname or ""
    if host in ("127.0.0.1", "localhost", "::1", "0.0.0.0", ""):
        host = host_of(exporter_instance)
    return (host, str(port or 80))


def parse_vtop(vec: Vector) -> dict[tuple[str, str], BoxView]:
    """:func:`vtop_query`'s answer -> per (host, port) of a vLLM server, what vtop there says.
    An alert whose subject is not a server (``gpu0``) goes to every server of that host
    (key ``(host, "*")``)."""
    out: dict[tuple[str, str], BoxView] = {}
    for labels, v in vec:
        what = labels.get(TAG)
        exp = labels.get("instance", "")
        subject = labels.get("server") or labels.get("subject") or ""
        key = _server_key(exp, subject) if "://" in subject or ":" in subject else (host_of(exp), "*")
        if key is None or what is None:
            continue
        b = out.get(key)
        if b is None:
            b = out[key] = BoxView()
        if what == "phase":
            b.phase = labels.get("phase")
        elif what == "phase_s":
            b.phase_s = v
        elif what == "oldest":
            b.oldest_s = v
        elif what == "alert":
            b.alerts.append((labels.get("rule", "?"), labels.get("severity", "?")))
    return out


def port_of(instance: str) -> str:
    return instance.rsplit(":", 1)[1] if ":" in instance and not instance.endswith("]") else "80"
