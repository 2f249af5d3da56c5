"""Properties: parse_vllm_metrics never raises, says when it skipped something,
and its line cache never changes an answer. Plus the rate helpers' invariants.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vtop.core.rates import CounterWindow, HistogramWindow, histogram_quantile
from vtop.sources import metrics_text as prom
from vtop.sources.metrics_text import Histogram, VllmMetrics, parse_vllm_metrics

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "vllm"
REAL = (FIX / "cpu-0.32.0-metrics-load.txt").read_text()
REAL_LINES = REAL.split("\n")
# the lines parse_vllm_metrics reads (for targeted mutations)
WANTED_IDX = [i for i, line in enumerate(REAL_LINES) if line.split("{")[0].split(" ")[0] in prom._WANTED]
assert len(WANTED_IDX) > 100

# VTOP_HYPOTHESIS_EXAMPLES=5000 for a long local run.
EXAMPLES = int(os.environ.get("VTOP_HYPOTHESIS_EXAMPLES", "60"))
FAST = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def check(m: VllmMetrics) -> None:
    """Invariants of every snapshot, whatever the input."""
    assert isinstance(m, VllmMetrics)
    assert not any(p.startswith("internal error") for p in m.problems), m.problems
    if m.skipped_lines:
        assert m.problems
    for v in (m.running, m.waiting, m.swapped, m.prompt_tokens_total, m.generation_tokens_total):
        assert v is None or (math.isfinite(v) and v >= 0)
    assert m.kv_cache_usage is None or 0 <= m.kv_cache_usage <= 1 + 1e-9
    hash(m)  # frozen and hashable (dict fields are left out of the hash)


def both(text: str | bytes) -> VllmMetrics:
    """Parse with the warm cache and without: the answers must be identical."""
    cached = parse_vllm_metrics(text)
    reference = parse_vllm_metrics(text, use_cache=False)
    assert cached == reference
    check(cached)
    return cached


@FAST
@given(st.text())
def test_random_text(text: str) -> None:
    both(text)


@FAST
@given(st.binary(max_size=4096))
def test_random_bytes(raw: bytes) -> None:
    both(raw)
    check(parse_vllm_metrics(raw.decode("latin-1")))


_line_alphabet = st.sampled_from(list('vlm:_{}="\\, \t#+-.eE0123456789aInfN\x00\r'))
vllm_ish_line = st.builds(
    lambda name, body: name + body,
    st.sampled_from(
        ["vllm:num_requests_running", "vllm:time_to_first_token_seconds_bucket", "vllm:kv_cache_usage_perc",
         'vllm:time_to_first_token_seconds_bucket{engine="0",le="']
    ),
    st.text(_line_alphabet, max_size=60),
)


@FAST
@given(st.lists(vllm_ish_line, max_size=30))
def test_vllm_looking_garbage(lines: list[str]) -> None:
    both("\n".join(lines) + "\n")


# --- mutations of a real payload -------------------------------------------------------

mutation = st.one_of(
    st.tuples(st.just("delete"), st.integers(0, len(REAL_LINES) - 1)),
    st.tuples(st.just("duplicate"), st.integers(0, len(REAL_LINES) - 1)),
    st.tuples(st.just("swap_chars"), st.integers(0, len(REAL) - 2)),
    st.tuples(st.just("replace_char"), st.integers(0, len(REAL) - 1), st.characters()),
    st.tuples(st.just("insert"), st.integers(0, len(REAL)), st.text(max_size=20)),
    st.tuples(st.just("corrupt_wanted"), st.sampled_from(WANTED_IDX), st.integers(0, 200), st.characters()),
)


def apply(text: str, op: tuple) -> str:  # type: ignore[type-arg]
    kind = op[0]
    if kind in ("delete", "duplicate", "corrupt_wanted"):
        lines = text.split("\n")
        i = op[1] % len(lines)
        if kind == "delete":
            del lines[i]
        elif kind == "duplicate":
            lines.insert(i, lines[i])
        else:
            line = lines[i]
            j = op[2] % (len(line) + 1)
            lines[i] = line[:j] + op[3] + line[j + 1 :]
        return "\n".join(lines)
    i = min(op[1], max(len(text) - 1, 0))
    if kind == "swap_chars":
        if len(text) < 2:
            return text
        i = min(i, len(text) - 2)
        return text[:i] + text[i + 1] + text[i] + text[i + 2 :]
    if kind == "replace_char":
        return text[:i] + op[2] + text[i + 1 :]
    return text[: op[1]] + op[2] + text[op[1] :]


@FAST
@given(st.lists(mutation, min_size=1, max_size=6), st.one_of(st.none(), st.integers(0, len(REAL))))
def test_mutated_real_payload(ops: list[tuple], truncate_at: int | None) -> None:  # type: ignore[type-arg]
    text = REAL
    for op in ops:
        text = apply(text, op)
    if truncate_at is not None:
        text = text[:truncate_at]
    m = both(text)
    if truncate_at is None and m.is_vllm:
        # most of the payload survives a handful of mutations
        assert m.engines


@FAST
@given(st.sampled_from(WANTED_IDX), st.sampled_from(['{', '"', "}", "=", "\\", " x", ",,"]))
def test_a_broken_wanted_line_is_reported(i: int, junk: str) -> None:
    lines = list(REAL_LINES)
    line = lines[i]
    cut = line.index("{") + 1
    lines[i] = line[:cut] + junk + line[cut:]
    text = "\n".join(lines)
    from prometheus_client.parser import text_string_to_metric_families

    try:
        list(text_string_to_metric_families(lines[i]))
        library_ok = True
    except Exception:
        library_ok = False
    m = both(text)
    if not library_ok:
        assert m.skipped_lines >= 1
        assert any(f"line {i + 1}:" in p for p in m.problems)
    # the other metrics are still there
    assert m.generation_tokens_total == 2289.0 or REAL_LINES[i].startswith("vllm:generation_tokens_total")


def cold(text: str | bytes) -> VllmMetrics:
    """Parse with an empty line cache (the first scrape of a server) and without
    the cache at all: the answers must be identical."""
    prom.clear_line_cache()
    first = parse_vllm_metrics(text)
    # repr, not ==: a NaN bucket count is unequal to itself, and repr also sees dict order
    assert repr(first) == repr(parse_vllm_metrics(text, use_cache=False))
    check(first)
    return first


BUCKET_IDX = [i for i in WANTED_IDX if "_bucket{" in REAL_LINES[i]]

# Edits aimed at what the cold path's bucket shortcut (prom._line_template) trusts:
# the le value, the quotes and braces around it, a second le, a le-looking text in
# another label's value, escapes, and the value token.
bucket_edit = st.one_of(
    st.tuples(st.just("le"), st.sampled_from(BUCKET_IDX), st.sampled_from(
        ["1_0", "NaN", "nan", "+Inf", "-Inf", "abc", "", "1e400", "-0", " 1", "1 ", "0x10", "١", "1,2", "1}", "5.0e-3"])),
    st.tuples(st.just("text"), st.sampled_from(BUCKET_IDX), st.sampled_from([
        (',le="', ',le="2",le="'), (',le="', ',model_name="x,le="'), ("{", '{a="\\\\",'), ("{", '{a="\\"",'),
        ("{", '{le="7",'), ("}", ',le="9"}'), ("}", ' }'), ("} ", "}  "), ("} ", "} 1 "), ("} ", "}\t"),
        ('model_name="', 'model_name="{'), ('model_name="', 'model_name="le=\\"3\\",'), ("}", '}}'),
        ('engine="0"', 'engine="1"'), ('engine="0"', 'engine = "0"'), ('le="', 'le= "'), ('le="', 'LE="'),
    ])),
    st.tuples(st.just("value"), st.sampled_from(BUCKET_IDX), st.sampled_from(
        ["1_0", "x", "1e999", "-1", "NaN", "5 1700000000000", "12345678901234567890123", "+3", "3}"])),
    st.tuples(st.just("move"), st.sampled_from(BUCKET_IDX), st.integers(0, len(REAL_LINES) - 1)),
)


BLOCK_IDX = [i for i in WANTED_IDX if "{" in REAL_LINES[i]]
NAMES = sorted(prom._WANTED)

# Edits aimed at what the shortcut trusts for any line that shares a label block:
# the name in front of the block, the block's text (a __name__, a brace or a
# duplicate label inside it, spacing), and the value after it.
block_edit = st.one_of(
    st.tuples(st.just("name"), st.sampled_from(BLOCK_IDX), st.one_of(
        st.sampled_from(NAMES), st.sampled_from(["vllm:not_read", "vllm:num_requests_running ", "", "9bad", "a b"]))),
    st.tuples(st.just("text"), st.sampled_from(BLOCK_IDX), st.sampled_from([
        ("{", '{__name__="x",'), ("{", "{,"), ("}", ",}"), ("}", ',,}'), ("{", '{engine="0",'), ("}", ' }'),
        ('model_name="', 'model_name="}'), ('model_name="', 'model_name="{'), ('engine="0"', 'engine="0}"'),
        ('engine="0"', 'engine=0'), ("} ", "}  "), ("} ", "} 1 "), ('engine="0"', 'engine="1"'), ("{", "{ "),
    ])),
    st.tuples(st.just("value"), st.sampled_from(BLOCK_IDX), st.sampled_from(
        ["1_0", "x", "1e999", "-1", "NaN", "5 1700000000000", "12345678901234567890123", "+3", "3}", "} 3"])),
    st.tuples(st.just("move"), st.sampled_from(BLOCK_IDX), st.integers(0, len(REAL_LINES) - 1)),
)


def apply_edit(lines: list[str], op: tuple) -> None:  # type: ignore[type-arg]
    kind, i = op[0], op[1]
    line = lines[i]
    if kind == "le":
        a = line.find('le="') + 4
        lines[i] = line[:a] + op[2] + line[line.find('"', a):]
    elif kind == "name":
        if "{" in line:  # (a move may have put another line here)
            lines[i] = op[2] + line[line.index("{") :]
    elif kind == "text":
        lines[i] = line.replace(op[2][0], op[2][1], 1)
    elif kind == "value":
        lines[i] = line.rpartition(" ")[0] + " " + op[2]
    else:
        lines.insert(op[2], lines.pop(i))


@FAST
@given(st.lists(st.one_of(bucket_edit, block_edit), min_size=1, max_size=8))
def test_cold_parse_of_edited_buckets_and_label_blocks_matches_the_library(ops: list[tuple]) -> None:  # type: ignore[type-arg]
    lines = list(REAL_LINES)
    for op in ops:
        apply_edit(lines, op)
    cold("\n".join(lines))


@FAST
@given(st.lists(mutation, min_size=1, max_size=6))
def test_cold_parse_of_a_mutated_payload_matches_the_library(ops: list[tuple]) -> None:  # type: ignore[type-arg]
    text = REAL
    for op in ops:
        text = apply(text, op)
    cold(text)


@FAST
@given(st.lists(vllm_ish_line, max_size=30))
def test_cold_parse_of_vllm_looking_garbage(lines: list[str]) -> None:
    cold("\n".join(lines) + "\n")


def test_huge_payload_is_bounded() -> None:
    line = 'vllm:num_requests_running{engine="0",model_name="' + "a\\\"" * 300 + '"} 1\n'
    m = parse_vllm_metrics(line * 20000)  # ~12 MB of lines that must go to the library
    check(m)
    assert any("characters of new lines" in p for p in m.problems)


# --- rates ---------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0.01, 5.0), st.one_of(st.none(), st.floats(0, 1e9))), max_size=60),
    st.floats(1.0, 120.0),
)
def test_counter_rate_is_never_negative(steps: list[tuple[float, float | None]], window: float) -> None:
    w = CounterWindow(window)
    t = 0.0
    for dt, v in steps:
        t += dt
        w.add(t, v)
        r = w.rate()
        assert r.rate is None or r.rate >= 0
        assert r.delta is None or r.delta >= 0


counts = st.lists(st.floats(0, 1e6, allow_nan=False), min_size=2, max_size=12)


@settings(max_examples=200, deadline=None)
@given(counts, st.floats(0, 1))
def test_quantile_stays_within_the_finite_bounds(raw: list[float], q: float) -> None:
    bounds = [0.01 * (i + 1) for i in range(len(raw) - 1)] + [math.inf]
    cum = []
    acc = 0.0
    for c in raw:
        acc += c
        cum.append(acc)
    v = histogram_quantile(q, tuple(zip(bounds, cum)))
    if cum[-1] == 0:
        assert v is None
    else:
        assert v is not None and 0 <= v <= bounds[-2] + 1e-12


@settings(max_examples=100, deadline=None)
@given(st.lists(counts, min_size=1, max_size=8))
def test_histogram_window_never_negative_counts(snaps: list[list[float]]) -> None:
    w = HistogramWindow(30.0)
    n = len(snaps[0])
    bounds = [0.1 * (i + 1) for i in range(n - 1)] + [math.inf]
    for t, raw in enumerate(snaps):
        raw = (raw + [0.0] * n)[:n]
        cum = [sum(raw[: i + 1]) for i in range(n)]
        w.add(float(t), Histogram(tuple(zip(bounds, cum)), None, cum[-1]))
        d = w.delta()
        if d is not None:
            assert all(c >= 0 for _, c in d.buckets)
        q = w.quantiles()
        assert q.p50 is None or q.p50 >= 0


def _library_view(text: str) -> dict[str, float]:
    """The oracle: prometheus_client on the whole, unfiltered payload."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:generation_tokens_total",
                          "vllm:e2e_request_latency_seconds_count"):
                out[s.name] = out.get(s.name, 0.0) + s.value
    return out


# Edits that keep the payload valid Prometheus text but put lines where a
# line filter could go wrong: indentation, CRLF, look-alike names, extra comments.
valid_edit = st.one_of(
    st.tuples(st.just("indent"), st.integers(0, 10_000), st.sampled_from([" ", "   "])),
    st.tuples(st.just("crlf"), st.integers(0, 10_000)),
    st.tuples(st.just("decoy"), st.integers(0, 10_000), st.sampled_from([
        "vllm:num_requests_runningX{engine=\"0\"} 55", "xvllm:num_requests_running 66",
        "vllm:num_requests_waiting_total 77", "# HELP vllm:num_requests_running decoy", "#vllm:num_requests_running 88",
        "vllm:generation_tokens 99"])),
)


@FAST
@given(st.lists(valid_edit, max_size=8), st.booleans())
def test_line_finding_agrees_with_the_library_on_the_whole_payload(edits: list[tuple], warm: bool) -> None:  # type: ignore[type-arg]
    lines = list(REAL_LINES)
    key = [i for i, ln in enumerate(lines) if ln.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting",
                                                             "vllm:generation_tokens_total"))]
    for e in edits:
        # indentation and CRLF go to the lines the answer depends on, decoys anywhere
        i = key[e[1] % len(key)] if e[0] != "decoy" else e[1] % len(lines)
        if e[0] == "indent" and lines[i].strip():
            lines[i] = e[2] + lines[i]
        elif e[0] == "crlf" and lines[i].strip():
            lines[i] = lines[i] + "\r"
        elif e[0] == "decoy":
            lines.insert(i, e[2])
            key = [k + (k >= i) for k in key]
    text = "\n".join(lines)
    if not warm:
        prom.clear_line_cache()
    m = parse_vllm_metrics(text)
    want = _library_view(text)
    assert m.running == want["vllm:num_requests_running"]
    assert m.waiting == want["vllm:num_requests_waiting"]
    assert m.generation_tokens_total == want["vllm:generation_tokens_total"]
    assert m.e2e_request_latency_seconds is not None
    assert m.e2e_request_latency_seconds.count == want["vllm:e2e_request_latency_seconds_count"]
