"""vtop.sources.metrics_text on real vLLM payloads and on payloads written from the reference.

Every number asserted on a real payload was read out of the fixture file by
hand (grep), not computed by the code under test.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from vtop.sources import metrics_text as prom
from vtop.sources.metrics_text import Histogram, VllmMetrics, clear_line_cache, parse_vllm_metrics

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "vllm"


def load(name: str) -> str:
    return (FIX / name).read_text()


def parse(name: str) -> VllmMetrics:
    return parse_vllm_metrics(load(name))


REAL = [
    "cpu-0.32.0-metrics-idle.txt",
    "cpu-0.32.0-metrics-load.txt",
    "cpu-0.32.0-metrics-load-waiting.txt",
    "h200-0.26.0-metrics-idle.txt",
    "h200-0.26.0-metrics-burst-waiting708.txt",
    "h200-0.26.0-metrics-burst-running1024.txt",
    "h200-0.26.0-metrics-runaway.txt",
]
WRITTEN = [
    "written/v0-0.6-metrics.txt",
    "written/v1-0.9.2-metrics.txt",
    "written/v1-0.33-dp2-metrics.txt",
]


# --- real payloads ------------------------------------------------------------


@pytest.mark.parametrize("name", REAL + WRITTEN)
def test_every_fixture_parses_cleanly_with_and_without_cache(name: str) -> None:
    clear_line_cache()
    cold = parse(name)
    warm = parse(name)
    reference = parse_vllm_metrics(load(name), use_cache=False)
    assert cold.is_vllm
    assert cold.problems == ()
    assert cold.skipped_lines == 0
    assert cold == warm == reference


def test_cpu_idle_is_zero_not_none() -> None:
    m = parse("cpu-0.32.0-metrics-idle.txt")
    assert m.model_name == "/tmp/tinyllama"
    assert m.running == 0.0 and m.waiting == 0.0 and m.kv_cache_usage == 0.0
    assert m.prompt_tokens_total == 0.0 and m.generation_tokens_total == 0.0
    assert m.request_success_total == dict.fromkeys(("stop", "length", "abort", "error", "repetition"), 0.0)
    assert m.waiting_by_reason == {"capacity": 0.0, "deferred": 0.0}
    # V1 pre-creates every series: the histograms exist, with zero counts.
    assert m.time_to_first_token_seconds is not None
    assert m.time_to_first_token_seconds.count == 0.0
    assert m.swapped is None  # V0 only


def test_cpu_load() -> None:
    m = parse("cpu-0.32.0-metrics-load.txt")
    assert (m.running, m.waiting) == (8.0, 0.0)
    assert m.kv_cache_usage == pytest.approx(0.0019536019536019467)
    assert m.prompt_tokens_total == 169.0
    assert m.generation_tokens_total == 2289.0
    assert m.preemptions_total == 0.0
    assert m.request_success_total["length"] == 6.0
    assert m.request_success_total["stop"] == 0.0
    ttft = m.time_to_first_token_seconds
    assert ttft is not None
    assert ttft.count == 14.0 and ttft.sum == pytest.approx(0.22837281227111816)
    assert ttft.buckets[0] == (0.001, 0.0)
    assert ttft.buckets[1] == (0.005, 1.0)
    assert ttft.buckets[-1] == (math.inf, 14.0)
    assert len(ttft.buckets) == 23
    itl = m.inter_token_latency_seconds
    assert itl is not None and itl.count == 2275.0 and itl.sum == pytest.approx(5.363052791000143)
    assert m.inter_token_metric == "vllm:inter_token_latency_seconds"
    e2e = m.e2e_request_latency_seconds
    assert e2e is not None and e2e.count == 6.0
    assert m.kv_cache_metric == "vllm:kv_cache_usage_perc"
    assert len(m.engines) == 1 and m.engines[0].engine == "0"


def test_cpu_load_waiting() -> None:
    m = parse("cpu-0.32.0-metrics-load-waiting.txt")
    assert (m.running, m.waiting) == (2.0, 6.0)
    assert m.waiting_by_reason == {"capacity": 6.0, "deferred": 0.0}
    assert m.kv_cache_usage == pytest.approx(0.0004884004884004867)
    assert (m.prompt_tokens_total, m.generation_tokens_total) == (25.0, 3.0)
    assert m.time_to_first_token_seconds is not None and m.time_to_first_token_seconds.count == 2.0
    assert m.e2e_request_latency_seconds is not None and m.e2e_request_latency_seconds.count == 0.0


def test_h200_idle() -> None:
    m = parse("h200-0.26.0-metrics-idle.txt")
    assert m.model_name == "/tmp/tiny"
    assert (m.running, m.waiting, m.kv_cache_usage) == (0.0, 0.0, 0.0)
    assert m.generation_tokens_total == 0.0
    assert m.request_params_max_tokens is not None and m.request_params_max_tokens.count == 0.0


def test_h200_burst_peak_waiting() -> None:
    """The 1500-request burst, one second before running hit max_num_seqs."""
    m = parse("h200-0.26.0-metrics-burst-waiting708.txt")
    assert (m.running, m.waiting) == (792.0, 708.0)
    assert m.waiting_by_reason == {"capacity": 708.0, "deferred": 0.0}
    assert m.kv_cache_usage == pytest.approx(0.05645689980930291)
    assert m.prompt_tokens_total == 708932.0
    assert m.generation_tokens_total == 75602.0
    assert m.time_to_first_token_seconds is not None
    assert m.time_to_first_token_seconds.count == 978.0
    assert m.time_to_first_token_seconds.sum == pytest.approx(1075.4803211688995)


def test_h200_burst_running_capped_at_1024() -> None:
    m = parse("h200-0.26.0-metrics-burst-running1024.txt")
    assert (m.running, m.waiting) == (1024.0, 476.0)
    assert m.kv_cache_usage == pytest.approx(0.07540006854551684)
    assert (m.prompt_tokens_total, m.generation_tokens_total) == (864301.0, 98773.0)
    assert m.request_success_total["length"] == 200.0  # load A; the burst has not finished yet


def test_h200_runaway() -> None:
    m = parse("h200-0.26.0-metrics-runaway.txt")
    assert (m.running, m.waiting) == (1.0, 0.0)
    assert m.prompt_tokens_total == 1158012.0  # written "1.158012e+06" on the wire
    assert m.generation_tokens_total == 354003.0
    # The runaway has not finished: it is in no per-request histogram yet.
    assert m.request_params_max_tokens is not None and m.request_params_max_tokens.count == 1700.0
    assert m.request_success_total["length"] == 1700.0


# --- written payloads -------------------------------------------------------------


def test_v0_payload() -> None:
    m = parse("written/v0-0.6-metrics.txt")
    assert m.is_vllm and m.problems == ()
    assert len(m.engines) == 1 and m.engines[0].engine is None  # no engine label in V0
    assert m.model_name == "meta-llama/Llama-3.1-8B-Instruct"
    assert (m.running, m.waiting, m.swapped) == (3.0, 2.0, 1.0)
    assert m.kv_cache_usage == 0.4375
    assert m.kv_cache_metric == "vllm:gpu_cache_usage_perc"
    assert m.waiting_by_reason == {}  # 0.20+ only
    assert (m.prompt_tokens_total, m.generation_tokens_total, m.preemptions_total) == (10240.0, 2048.0, 4.0)
    assert m.request_success_total == {"stop": 7.0, "length": 3.0}  # V0 creates reasons lazily
    assert m.inter_token_metric == "vllm:time_per_output_token_seconds"
    itl = m.inter_token_latency_seconds
    assert itl is not None and itl.count == 2036.0 and itl.buckets[1] == (0.025, 1900.0)
    assert m.time_to_first_token_seconds is not None and m.time_to_first_token_seconds.count == 12.0
    assert m.request_params_max_tokens is not None and m.request_params_max_tokens.buckets[-1] == (math.inf, 10.0)
    assert m.prefix_cache_queries_total is None


def test_v1_0_9_2_payload_with_both_kv_names() -> None:
    m = parse("written/v1-0.9.2-metrics.txt")
    assert m.problems == ()
    assert (m.running, m.waiting) == (12.0, 5.0)
    assert m.kv_cache_usage == 0.3125
    assert m.kv_cache_metric == "vllm:kv_cache_usage_perc"
    assert m.swapped is None
    assert m.request_success_total == {"stop": 30.0, "length": 8.0, "abort": 2.0}
    assert (m.prefix_cache_queries_total, m.prefix_cache_hits_total) == (40000.0, 12000.0)
    assert m.inter_token_metric == "vllm:time_per_output_token_seconds"
    assert m.inter_token_latency_seconds is not None and m.inter_token_latency_seconds.count == 8960.0


def test_dp2_rows_and_sum() -> None:
    m = parse("written/v1-0.33-dp2-metrics.txt")
    assert m.problems == ()
    assert [e.engine for e in m.engines] == ["0", "1"]
    e0, e1 = m.engines
    assert (e0.running, e0.waiting, e0.kv_cache_usage) == (40.0, 3.0, 0.5)
    assert (e1.running, e1.waiting, e1.kv_cache_usage) == (38.0, 0.0, 0.25)
    assert e0.waiting_by_reason == {"capacity": 2.0, "deferred": 1.0}
    assert e1.request_success_total == {"stop": 95.0, "length": 22.0, "abort": 0.0, "error": 1.0, "repetition": 1.0}
    # the totals written in the fixture's header
    assert (m.running, m.waiting) == (78.0, 3.0)
    assert m.kv_cache_usage == pytest.approx(0.375)  # mean, as vLLM's log aggregator does
    assert (m.prompt_tokens_total, m.generation_tokens_total, m.preemptions_total) == (190000.0, 49000.0, 2.0)
    assert m.request_success_total == {"stop": 195.0, "length": 42.0, "abort": 1.0, "error": 1.0, "repetition": 1.0}
    assert m.waiting_by_reason == {"capacity": 2.0, "deferred": 1.0}
    ttft = m.time_to_first_token_seconds
    assert ttft is not None and ttft.count == 240.0 and ttft.sum == pytest.approx(26.75)
    assert dict(ttft.buckets)[0.1] == 80.0 + 90.0
    assert e0.time_to_first_token_seconds is not None and e0.time_to_first_token_seconds.count == 121.0
    assert m.model_names == ("meta-llama/Llama-3.3-70B-Instruct",)


# --- versions and names -------------------------------------------------------------

HEAD = 'vllm:num_requests_running{engine="0",model_name="m"} 1.0\n'


def test_kv_new_name_preferred_over_old() -> None:
    text = (
        HEAD
        + 'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.9\n'
        + 'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.4\n'
    )
    m = parse_vllm_metrics(text)
    assert m.kv_cache_usage == 0.4 and m.kv_cache_metric == "vllm:kv_cache_usage_perc"


def test_inter_token_new_name_preferred() -> None:
    lines = [HEAD.strip()]
    for fam, n in (("vllm:time_per_output_token_seconds", 5), ("vllm:inter_token_latency_seconds", 7)):
        lines.append(f'{fam}_bucket{{engine="0",le="0.1",model_name="m"}} {n}')
        lines.append(f'{fam}_bucket{{engine="0",le="+Inf",model_name="m"}} {n}')
        lines.append(f'{fam}_count{{engine="0",model_name="m"}} {n}')
    m = parse_vllm_metrics("\n".join(lines) + "\n")
    assert m.inter_token_latency_seconds == Histogram(((0.1, 7.0), (math.inf, 7.0)), None, 7.0)
    assert m.inter_token_metric == "vllm:inter_token_latency_seconds"


def test_kv_percentage_instead_of_fraction_is_rejected() -> None:
    m = parse_vllm_metrics(HEAD + 'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 43.0\n')
    assert m.kv_cache_usage is None
    assert any("above 1" in p for p in m.problems)


def test_disable_log_stats_payload_is_not_vllm() -> None:
    text = "".join(
        line + "\n" for line in load("cpu-0.32.0-metrics-load.txt").splitlines() if "vllm:" not in line
    )
    m = parse_vllm_metrics(text)
    assert not m.is_vllm
    assert m.running is None and m.kv_cache_usage is None and m.engines == ()
    assert any("no vllm: metrics" in p for p in m.problems)


def test_html_is_reported() -> None:
    m = parse_vllm_metrics("<!DOCTYPE html><html><body>502 Bad Gateway</body></html>")
    assert not m.is_vllm and m.running is None
    assert any("HTML" in p for p in m.problems)


@pytest.mark.parametrize("payload", ["", "   \n\n", b"", None, 42, b"\xff\xfe\x00garbage"])
def test_odd_payloads(payload: object) -> None:
    m = parse_vllm_metrics(payload)  # type: ignore[arg-type]
    assert not m.is_vllm and m.running is None and m.problems


def test_bytes_payload_equals_text() -> None:
    text = load("cpu-0.32.0-metrics-load.txt")
    assert parse_vllm_metrics(text.encode()) == parse_vllm_metrics(text)


def test_missing_is_none_not_zero() -> None:
    m = parse_vllm_metrics(HEAD)
    assert m.running == 1.0
    assert m.waiting is None and m.kv_cache_usage is None and m.generation_tokens_total is None
    assert m.time_to_first_token_seconds is None and m.request_success_total == {}
    assert "vllm:num_requests_waiting missing" in m.problems


# --- damaged payloads ------------------------------------------------------------------


def _replace_line(text: str, startswith: str, new: str) -> str:
    out = []
    for line in text.split("\n"):
        out.append(new if line.startswith(startswith) else line)
    return "\n".join(out)


def test_bad_line_is_skipped_and_the_rest_salvaged() -> None:
    text = load("cpu-0.32.0-metrics-load.txt")
    bad = _replace_line(text, "vllm:num_requests_waiting{", 'vllm:num_requests_waiting{engine="0",model_name="/tmp/t 3')
    assert bad != text
    for use_cache in (True, False):
        m = parse_vllm_metrics(bad, use_cache=use_cache)
        assert m.waiting is None
        assert m.skipped_lines == 1
        assert any("unreadable" in p and "num_requests_waiting" in p for p in m.problems)
        # everything after the bad line still read
        assert m.running == 8.0 and m.generation_tokens_total == 2289.0
        assert m.time_to_first_token_seconds is not None and m.time_to_first_token_seconds.count == 14.0


def test_library_alone_gives_up_at_the_first_bad_line() -> None:
    """Why the salvage loop exists."""
    from prometheus_client.parser import text_string_to_metric_families

    bad = 'vllm:num_requests_running{engine="0"} 1\nvllm:num_requests_waiting{engine="0 2\nvllm:x 3\n'
    with pytest.raises(ValueError):
        list(text_string_to_metric_families(bad))
    m = parse_vllm_metrics(bad)
    assert m.running == 1.0 and m.skipped_lines == 1


def test_truncated_payload_drops_the_cut_line() -> None:
    text = load("h200-0.26.0-metrics-runaway.txt")
    line = 'vllm:generation_tokens_total{engine="0",model_name="/tmp/tiny"} 354'
    cut = text.index(line) + len(line)
    m = parse_vllm_metrics(text[:cut])
    # "354" of "354003.0" would look like a counter reset: not read at all.
    assert m.generation_tokens_total is None
    assert m.running == 1.0 and m.prompt_tokens_total == 1158012.0
    assert any("cut off" in p for p in m.problems)
    assert m.time_to_first_token_seconds is None  # comes after the cut


def test_duplicate_line_is_reported() -> None:
    m = parse_vllm_metrics(HEAD + HEAD.replace("1.0", "2.0"))
    assert m.running == 2.0
    assert any("duplicate" in p for p in m.problems)


def test_histogram_without_inf_bucket_is_reported() -> None:
    text = HEAD + (
        'vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 1\n'
        'vllm:time_to_first_token_seconds_bucket{engine="0",le="1.0",model_name="m"} 2\n'
    )
    m = parse_vllm_metrics(text)
    assert m.time_to_first_token_seconds == Histogram(((0.1, 1.0), (1.0, 2.0)), None, None)
    assert any("+Inf" in p for p in m.problems)


def test_negative_and_nan_values_are_unusable() -> None:
    m = parse_vllm_metrics(
        'vllm:num_requests_running{engine="0"} -1\nvllm:num_requests_waiting{engine="0"} NaN\n'
    )
    assert m.running is None and m.waiting is None
    assert sum("unusable" in p for p in m.problems) == 2


def test_over_long_line_is_skipped_not_parsed() -> None:
    long = 'vllm:num_requests_running{engine="0",model_name="' + "x" * 5000 + '"} 1\n'
    m = parse_vllm_metrics(long + 'vllm:num_requests_waiting{engine="0"} 4\n')
    assert m.running is None and m.waiting == 4.0
    assert m.skipped_lines == 1 and any("too long" in p for p in m.problems)


def test_problem_list_is_bounded() -> None:
    text = "".join(f'vllm:num_requests_running{{engine="{i}" {i}\n' for i in range(500))
    m = parse_vllm_metrics(text)
    assert m.skipped_lines == 500
    assert len(m.problems) <= prom.MAX_PROBLEMS + 2
    assert m.problems[-1].startswith("... and")


def test_cache_is_bounded_and_survives_overflow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prom, "_CACHE_MAX_ENTRIES", 10)
    clear_line_cache()
    text = load("written/v1-0.33-dp2-metrics.txt")
    first = parse_vllm_metrics(text)
    assert len(prom._LINE_CACHE) <= 10
    assert parse_vllm_metrics(text) == first == parse_vllm_metrics(text, use_cache=False)
    clear_line_cache()


def test_sources_never_import_textual() -> None:
    code = "import sys, vtop.sources.metrics_text, vtop.core.rates; sys.exit('textual' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_warm_lines_filed_at_once_keep_the_problem_order() -> None:
    """A warm parse files cache hits as it meets them, but only while nothing earlier
    is waiting (a line too long to read, a line for the library): the problems must
    come out in line order, as without the cache."""
    clear_line_cache()
    ok = 'vllm:num_requests_running{engine="0",model_name="m"} 1.0\n'
    parse_vllm_metrics(ok)  # warm
    too_long = 'vllm:num_requests_waiting{engine="0",model_name="m",x="' + "y" * prom.MAX_LINE_CHARS + '"} 1.0\n'
    text = too_long + ok + ok.replace("1.0", "2.0")  # the duplicate comes after the long line
    cached = parse_vllm_metrics(text)
    reference = parse_vllm_metrics(text, use_cache=False)
    assert cached == reference
    long_at = next(i for i, p in enumerate(cached.problems) if "too long" in p)
    dup_at = next(i for i, p in enumerate(cached.problems) if "duplicate" in p)
    assert long_at < dup_at
    assert cached.running == 2.0


# --- the cold path's template shortcut -------------------------------------------------------

BUCKET = 'vllm:e2e_request_latency_seconds_bucket{engine="0",le="2.5",model_name="m"} 7.0'
BNAME = "vllm:e2e_request_latency_seconds_bucket"
GAUGE = 'vllm:num_requests_running{engine="0",model_name="m"} 3.0'


def tpl(line: str, name: str = BNAME, bucket: bool = True):  # type: ignore[no-untyped-def]
    return prom._line_template(line, name, bucket)


def test_line_template_splits_a_plain_vllm_bucket_line() -> None:
    got = tpl(BUCKET)
    assert got is not None
    head, tok, le, tkey = got
    assert (head, tok, le) == (BUCKET[:-4], "7.0", "2.5")
    # lines that differ only in le share a template, whatever the histogram; another engine does not
    assert tpl(BUCKET.replace('le="2.5"', 'le="+Inf"'))[3] == tkey  # type: ignore[index]
    other = BUCKET.replace("e2e_request_latency", "request_queue_time")
    assert tpl(other, other.split("{")[0])[3] == tkey  # type: ignore[index]
    assert tpl(BUCKET.replace('engine="0"', 'engine="1"'))[3] != tkey  # type: ignore[index]


def test_line_template_of_other_lines_is_their_label_block() -> None:
    got = tpl(GAUGE, "vllm:num_requests_running", False)
    assert got == (GAUGE[:-4], "3.0", None, '{engine="0",model_name="m"}')
    count = 'vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"} 9'
    assert tpl(count, count.split("{")[0], False)[3] == got[3]  # type: ignore[index]
    # a bucket's le is part of the block when the line is not read as a bucket
    assert tpl(BUCKET, BNAME, False)[3] == '{engine="0",le="2.5",model_name="m"}'  # type: ignore[index]


@pytest.mark.parametrize(
    "line",
    [
        BUCKET.replace('model_name="m"', 'model_name="a\\"b"'),  # an escape anywhere
        BUCKET.replace('engine="0"', 'engine="x,le="'),  # the first le=" is inside a value
        BUCKET.replace('engine="0"', 'engine="x,le="9"'),  # ... and a plain token follows it
        BUCKET.replace('le="2.5"', 'xle="2.5"'),  # not a term start
        BUCKET.replace('le="2.5"', 'le="2 5"'),  # not a plain token
        BUCKET.replace('le="2.5"', 'le=""'),
        BUCKET.replace(" 7.0", "\t7.0"),
        BUCKET.replace("} 7.0", "}7.0"),  # no space before the value
        BUCKET.replace('le="2.5",model_name="m"}', 'le="2.5}'),  # no closing quote
        'vllm:e2e_request_latency_seconds_bucket{engine="0",model_name="m"} 7.0',  # no le
        BUCKET.replace("{", " {"),  # the block does not start right after the name
    ],
)
def test_line_template_leaves_anything_less_plain_to_the_library(line: str) -> None:
    assert tpl(line) is None


@pytest.mark.parametrize(
    "line",
    [
        GAUGE.replace('model_name="m"', 'model_name="a\\"b"'),
        GAUGE.replace(" 3.0", "\t3.0"),
        GAUGE.replace("} 3.0", "}3.0"),
        GAUGE.replace("{", " {"),
        'vllm:num_requests_running 3.0',  # no block
    ],
)
def test_line_template_of_other_lines_leaves_anything_less_plain_to_the_library(line: str) -> None:
    assert tpl(line, "vllm:num_requests_running", False) is None


def test_a_cold_parse_sends_one_line_per_label_block_to_the_library(monkeypatch: pytest.MonkeyPatch) -> None:
    """The point of the shortcut: the first scrape of a vLLM 0.26 server reads one
    line per label block through prometheus_client (~10) instead of ~140, with the
    same answer."""
    sent: list[str] = []
    real = prom._library_samples

    def counting(lines: list[str]):  # type: ignore[no-untyped-def]
        sent.extend(lines)
        return real(lines)

    def block(line: str) -> str:  # the labels, a bucket's le value blanked
        b = line[line.index("{") : line.rindex("}") + 1]
        return re.sub(r'le="[^"]*"', 'le=""', b) if "_bucket{" in line else b

    monkeypatch.setattr(prom, "_library_samples", counting)
    text = load("h200-0.26.0-metrics-idle.txt")
    clear_line_cache()
    cold = parse_vllm_metrics(text)
    wanted = [ln for ln in text.split("\n") if ln.split("{")[0] in prom._WANTED]
    blocks = {block(ln) for ln in wanted}
    assert len(wanted) > 130 and 3 <= len(blocks) < 20
    assert sorted(block(ln) for ln in sent) == sorted(blocks)  # one line each
    sent.clear()
    reference = parse_vllm_metrics(text, use_cache=False)
    assert len(sent) == len(wanted)
    assert cold == reference
    assert cold.e2e_request_latency_seconds is not None and len(cold.e2e_request_latency_seconds.buckets) > 10


def test_a_bucket_whose_template_line_is_broken_is_read_by_the_library_itself() -> None:
    """When the first line of a template is unreadable, the lines that would have
    borrowed its answer are parsed one by one (and the bad line is reported)."""
    good = [BUCKET.replace('le="2.5"', f'le="{b}"').replace("7.0", str(c)) for b, c in (("1.0", 3.0), ("+Inf", 9.0))]
    bad = BUCKET.replace("7.0", "7.0.0")  # same template, a value the library refuses
    text = "\n".join([bad, *good, 'vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"} 9.0']) + "\n"
    clear_line_cache()
    m = parse_vllm_metrics(text)
    assert m == parse_vllm_metrics(text, use_cache=False)
    assert m.skipped_lines == 1 and "line 1:" in m.problems[0]
    assert m.e2e_request_latency_seconds is not None
    assert m.e2e_request_latency_seconds.buckets == ((1.0, 3.0), (math.inf, 9.0))
