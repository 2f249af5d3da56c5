"""How long does reading one vLLM /metrics payload take?

    python bench/parse_metrics.py [--runs 200]

vtop scrapes once a second on boxes that may have 2 cores busy serving a
model, so parsing must stay far below a frame: the target is < 3 ms a
payload. Rows, for each real payload in tests/fixtures/vllm/:

  library, whole payload    prometheus_client's text_string_to_metric_families
                            on the raw text: what a naive reader would do
  library, vllm lines only  the same on the sample lines vtop reads
                            (comments and other families filtered first)
  vtop, no cache            parse_vllm_metrics(use_cache=False)
  vtop, cold cache          parse_vllm_metrics after clear_line_cache()
                            (the first scrape of a server)
  vtop, warm cache          parse_vllm_metrics, steady state

and a replay of the recorded H200 timeline (every scrape differs in its
values), which is what a live dashboard does.
"""

from __future__ import annotations

import argparse
import json
import lzma
import platform
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from vtop.sources import metrics_text as prom  # noqa: E402
from vtop.sources.metrics_text import clear_line_cache, parse_vllm_metrics  # noqa: E402

FIX = ROOT / "tests" / "fixtures" / "vllm"
PAYLOADS = [
    "cpu-0.32.0-metrics-idle.txt",
    "cpu-0.32.0-metrics-load.txt",
    "cpu-0.32.0-metrics-load-waiting.txt",
    "h200-0.26.0-metrics-idle.txt",
    "h200-0.26.0-metrics-burst-running1024.txt",
]
TARGET_MS = 3.0


def timings(fn: Callable[[], object], runs: int, setup: Callable[[], None] | None = None) -> list[float]:
    out = []
    for _ in range(runs):
        if setup:
            setup()
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def _library(text: str) -> object:
    return list(text_string_to_metric_families(text))


def p95(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=20)[-1] if len(xs) >= 20 else max(xs)


def vllm_lines_only(text: str) -> str:
    keep = []
    for line in text.split("\n"):
        s = line.strip()
        if s.startswith("vllm:") and prom._NAME_RE.match(s).group() in prom._WANTED:  # type: ignore[union-attr]
            keep.append(s)
    return "\n".join(keep) + "\n"


def timeline_scrapes() -> list[str]:
    scrapes = []
    with lzma.open(FIX / "h200-0.26.0-metrics-timeline.jsonl.xz", "rt") as f:
        for line in f:
            row = json.loads(line)
            if "text" in row:
                scrapes.append(row["text"])
    return scrapes


def summary(runs: int = 200) -> dict[str, object]:
    """vtop's parse times, for bench/run.py: per payload the warm and cold median,
    the worst of each, and the timeline replay (every scrape once, in order)."""
    per: dict[str, dict[str, float]] = {}
    for name in PAYLOADS:
        text = (FIX / name).read_text()
        cold = timings(partial(parse_vllm_metrics, text), runs, setup=clear_line_cache)
        parse_vllm_metrics(text)
        warm = timings(partial(parse_vllm_metrics, text), runs)
        per[name] = {"kb": len(text) / 1024, "warm_median_ms": statistics.median(warm), "warm_p95_ms": p95(warm),
                     "cold_median_ms": statistics.median(cold), "cold_p95_ms": p95(cold)}
    clear_line_cache()
    replay = []
    for text in timeline_scrapes():
        t0 = time.perf_counter()
        parse_vllm_metrics(text)
        replay.append((time.perf_counter() - t0) * 1000)
    return {
        "runs": runs,
        "payloads": per,
        "worst_warm_median_ms": max(v["warm_median_ms"] for v in per.values()),
        "worst_cold_median_ms": max(v["cold_median_ms"] for v in per.values()),
        "replay_scrapes": len(replay),
        "replay_median_ms": statistics.median(replay),
        "replay_p95_ms": p95(replay),
        "replay_first_ms": replay[0],
        "target_ms": TARGET_MS,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=200)
    args = ap.parse_args()
    runs = args.runs

    print(f"python {platform.python_version()} on {platform.machine()}, runs={runs}, target < {TARGET_MS} ms")
    header = f"{'payload':42} {'KB':>5} {'method':26} {'median ms':>9} {'p95 ms':>8}"
    print(header)
    print("-" * len(header))
    worst_warm = 0.0
    for name in PAYLOADS:
        text = (FIX / name).read_text()
        filtered = vllm_lines_only(text)
        rows: list[tuple[str, list[float]]] = [
            ("library, whole payload", timings(partial(_library, text), runs)),
            ("library, vllm lines only", timings(partial(_library, filtered), runs)),
            ("vtop, no cache", timings(partial(parse_vllm_metrics, text, use_cache=False), runs)),
            ("vtop, cold cache", timings(partial(parse_vllm_metrics, text), runs, setup=clear_line_cache)),
        ]
        parse_vllm_metrics(text)
        warm = timings(partial(parse_vllm_metrics, text), runs)
        rows.append(("vtop, warm cache", warm))
        worst_warm = max(worst_warm, statistics.median(warm))
        for i, (method, xs) in enumerate(rows):
            label = name if i == 0 else ""
            kb = f"{len(text) / 1024:.0f}" if i == 0 else ""
            print(f"{label:42} {kb:>5} {method:26} {statistics.median(xs):9.2f} {p95(xs):8.2f}")

    # Replay: each scrape once, in order, as a live dashboard sees them.
    scrapes = timeline_scrapes()
    clear_line_cache()
    replay = []
    for text in scrapes:
        t0 = time.perf_counter()
        parse_vllm_metrics(text)
        replay.append((time.perf_counter() - t0) * 1000)
    print(
        f"{'h200 timeline replay, ' + str(len(scrapes)) + ' scrapes':42} {'~50':>5} {'vtop (first one cold)':26} "
        f"{statistics.median(replay):9.2f} {p95(replay):8.2f}   first {replay[0]:.2f} ms, max {max(replay):.2f} ms"
    )
    verdict = "OK" if worst_warm < TARGET_MS else "OVER TARGET"
    print(f"\nsteady state (warm) worst median: {worst_warm:.2f} ms -> {verdict} (target {TARGET_MS} ms)")


if __name__ == "__main__":
    main()
