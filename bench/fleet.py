"""vtop's fleet view over 1,000 vLLM and SGLang instances with 8 GPUs each, from a real Prometheus.

    python bench/fleet.py [--instances 1000] [--sglang 500] [--gpus 8] [--seconds 60] [--json OUT]

1. Generates the series such a fleet exports, with vLLM 0.32's names and shapes (per
   instance, ``engine="0"``: running, waiting, ``kv_cache_usage_perc``, the generation /
   prompt / preemption counters, ``request_success_total`` by its five ``finished_reason``
   values, the TTFT histogram with vLLM's 22 bounds + ``+Inf``, ``up``), SGLang 0.5.17's for
   ``--sglang`` of the instances, every other one (job ``sglang``, port 30000; read in its
   ``srt/observability/metrics_collector.py``: the scheduler's series labelled ``engine_type``,
   ``model_name``, ``tp_rank``, ``pp_rank``, ``moe_ep_rank``, only TP rank 0's by default:
   ``num_running_reqs``, ``num_queue_reqs``, ``token_usage``, ``num_retracted_requests_total``,
   ``realtime_tokens_total`` by its three ``mode`` values; the tokenizer's by ``is_streaming``:
   ``prompt_tokens_total`` / ``generation_tokens_total``, which the fleet does not read, and the TTFT
   histogram with SGLang's 18 default bounds + ``+Inf``), and dcgm-exporter's
   (per GPU: GPU_UTIL, PROF_SM_ACTIVE, FB_USED, FB_FREE, POWER_USAGE, XID_ERRORS with the
   ``gpu``/``UUID``/``device``/``modelName``/``Hostname`` labels), one sample every
   ``STEP_S`` seconds from 6 minutes ago to 12 minutes ahead (no scrapes run: the instant
   queries of the next minutes need samples within Prometheus' 5-minute lookback), as
   OpenMetrics text;
2. backfills it with ``promtool tsdb create-blocks-from openmetrics`` (Debian's 2.42) and
   starts ``prometheus`` on loopback over those blocks;
3. measures, in this process, the fleet's refresh (:meth:`vtop.monitor.fleet.Fleet.refresh`:
   the queries, the parse, the trackers and the rules over every instance): queries per
   refresh, bytes, wall time (median and max of ``--refreshes``), and the history's backfill
   (``query_range`` + feeding every step through the rules); each query alone, and each of those
   that name the engines' metrics again with vLLM's names only (the SGLang names taken out of the
   table for the moment: what the name-regex selectors and SGLang's parts cost Prometheus), asked in
   turn on the same Prometheus;
4. starts ``vtop --prometheus URL`` in tmux at 160x50 as a user would and measures the first
   frame (the status line drawn) and the first frame with the fleet's rows, then its CPU
   over ``--seconds`` at the default 5 s refresh and its RSS (VmRSS, VmHWM).

Targets (issue 27): refresh <= 250 ms, CPU <= 2 % of a core at 5 s, first frame <= 1.5 s,
RSS <= 120 MB. Numbers go in the README's fleet section.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import Tmux, cpu_seconds, descendants, vm_kb, vtop_cmd
from tests.helpers.prom_harness import Prometheus

STEP_S = 30
TTFT_LE = ("0.001", "0.005", "0.01", "0.02", "0.04", "0.06", "0.08", "0.1", "0.25", "0.5", "0.75", "1.0", "2.5",
           "5.0", "7.5", "10.0", "20.0", "40.0", "80.0", "160.0", "640.0", "2560.0", "+Inf")
#: SGLang 0.5.17's default TTFT bounds (``bucket_time_to_first_token`` in its metrics_collector.py) + ``+Inf``
SGL_TTFT_LE = ("0.1", "0.2", "0.4", "0.6", "0.8", "1.0", "2.0", "4.0", "6.0", "8.0", "10.0", "20.0", "40.0", "60.0",
               "80.0", "100.0", "200.0", "400.0", "+Inf")
#: series an instance of each engine exports, GPUs aside
SERIES = {"vllm": 6 + 5 + len(TTFT_LE) + 1, "sglang": 4 + 3 + 2 * 2 + 2 * len(SGL_TTFT_LE) + 1}
REASONS = ("stop", "length", "abort", "error", "repetition")
DCGM = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_XID_ERRORS")


def engines_of(n: int, sglang: int) -> list[str]:
    """Each instance's engine: ``sglang`` of the ``n`` spread evenly (every other one for half)."""
    return ["sglang" if (i * sglang) % n < sglang else "vllm" for i in range(n)]


def generate(path: Path, n: int, gpus: int, t0: int, t1: int, sglang: int = 0) -> int:
    """Write the OpenMetrics text; returns the number of samples."""
    rnd = random.Random(27)
    times = list(range(t0, t1 + 1, STEP_S))
    samples = 0
    eng = engines_of(n, sglang)
    vl = [i for i in range(n) if eng[i] == "vllm"]
    sg = [i for i in range(n) if eng[i] == "sglang"]
    inst = [f"h{i:04d}:{30000 if eng[i] == 'sglang' else 8000}" for i in range(n)]
    model = [("meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen3-32B", "mistralai/Mistral-Small-24B")[i % 3]
             for i in range(n)]
    rate = [rnd.uniform(200, 3000) for _ in range(n)]
    with open(path, "w", buffering=1 << 20) as f:
        w = f.write

        def family(name: str) -> None:
            w(f"# TYPE {name} gauge\n")

        def lab(i: int) -> str:
            return f'engine="0",instance="{inst[i]}",job="vllm",model_name="{model[i]}"'

        for name, fn in (
            ("vllm:num_requests_running", lambda i, k: float(rnd.randint(0, 64))),
            ("vllm:num_requests_waiting", lambda i, k: float(rnd.choice((0, 0, 0, 3, 12)))),
            ("vllm:kv_cache_usage_perc", lambda i, k: round(rnd.uniform(0.05, 0.9), 4)),
            ("vllm:generation_tokens_total", lambda i, k: round(rate[i] * STEP_S * k)),
            ("vllm:prompt_tokens_total", lambda i, k: round(rate[i] * 3 * STEP_S * k)),
            ("vllm:num_preemptions_total", lambda i, k: float(k // 7)),
        ):
            family(name)
            for i in vl:
                lb = lab(i)
                for k, t in enumerate(times):
                    w(f"{name}{{{lb}}} {fn(i, k)} {t}\n")
                    samples += 1
        family("vllm:request_success_total")
        for i in vl:
            lb = lab(i)
            for r, share in zip(REASONS, (0.8, 0.17, 0.03, 0.0, 0.0)):
                for k, t in enumerate(times):
                    w(f'vllm:request_success_total{{{lb},finished_reason="{r}"}} {round(rate[i] / 300 * STEP_S * k * share)} {t}\n')
                    samples += 1
        family("vllm:time_to_first_token_seconds_bucket")
        for i in vl:
            lb = lab(i)
            per = rate[i] / 300 * STEP_S
            for j, le in enumerate(TTFT_LE):
                frac = min(1.0, (j + 1) / 12)
                for k, t in enumerate(times):
                    w(f'vllm:time_to_first_token_seconds_bucket{{{lb},le="{le}"}} {round(per * k * frac)} {t}\n')
                    samples += 1
        samples += _sglang(w, family, sg, inst, model, rate, times, rnd)
        family("up")
        for i in range(n):
            for t in times:
                w(f'up{{instance="{inst[i]}",job="{eng[i]}"}} 1 {t}\n')
                samples += 1
        for name in DCGM:
            family(name)
            for i in range(n):
                host = inst[i].split(":")[0]
                for g in range(gpus):
                    lb = (f'DCGM_FI_DRIVER_VERSION="550.54.15",Hostname="{host}",UUID="GPU-{i:08x}-{g:04x}",device="nvidia{g}",'
                          f'gpu="{g}",instance="{host}:9400",job="dcgm",modelName="NVIDIA H200"')
                    for t in times:
                        v = {"DCGM_FI_DEV_GPU_UTIL": rnd.randint(0, 100), "DCGM_FI_PROF_SM_ACTIVE": round(rnd.random(), 3),
                             "DCGM_FI_DEV_FB_USED": 126000, "DCGM_FI_DEV_FB_FREE": 17771,
                             "DCGM_FI_DEV_POWER_USAGE": rnd.randint(90, 700),
                             "DCGM_FI_DEV_XID_ERRORS": 79 if (i == 7 and g == 3) else 0}[name]
                        w(f"{name}{{{lb}}} {v} {t}\n")
                        samples += 1
        w("# EOF\n")
    return samples


def _sglang(w: Callable[[str], object], family: Callable[[str], None], sg: list[int], inst: list[str],
            model: list[str], rate: list[float], times: list[int], rnd: random.Random) -> int:
    """SGLang's series of the instances ``sg`` (see the module's docstring); returns the number of samples."""
    samples = 0

    def sched(i: int) -> str:
        return (f'engine_type="unified",instance="{inst[i]}",job="sglang",model_name="{model[i]}",moe_ep_rank="0",'
                f'pp_rank="0",tp_rank="0"')

    def tok(i: int, streaming: str) -> str:
        return f'engine_type="unified",instance="{inst[i]}",is_streaming="{streaming}",job="sglang",model_name="{model[i]}"'

    for name, fn in (
        ("sglang:num_running_reqs", lambda i, k: float(rnd.randint(0, 64))),
        ("sglang:num_queue_reqs", lambda i, k: float(rnd.choice((0, 0, 0, 3, 12)))),
        ("sglang:token_usage", lambda i, k: round(rnd.uniform(0.05, 0.9), 2)),
        ("sglang:num_retracted_requests_total", lambda i, k: float(k // 7)),
    ):
        family(name)
        for i in sg:
            lb = sched(i)
            for k, t in enumerate(times):
                w(f"{name}{{{lb}}} {fn(i, k)} {t}\n")
                samples += 1
    # grown each scheduler step: decode tokens, prompt tokens computed and taken from the cache
    family("sglang:realtime_tokens_total")
    for i in sg:
        lb = sched(i)
        for mode, per in (("decode", 1.0), ("prefill_compute", 2.4), ("prefill_cache", 0.6)):
            for k, t in enumerate(times):
                w(f'sglang:realtime_tokens_total{{{lb},mode="{mode}"}} {round(rate[i] * per * STEP_S * k)} {t}\n')
                samples += 1
    # grown when a request finishes (not read by the fleet: realtime_tokens_total is)
    for name, per in (("sglang:prompt_tokens_total", 3.0), ("sglang:generation_tokens_total", 1.0)):
        family(name)
        for i in sg:
            for streaming, share in (("false", 0.3), ("true", 0.7)):
                lb = tok(i, streaming)
                for k, t in enumerate(times):
                    w(f"{name}{{{lb}}} {round(rate[i] * per * STEP_S * max(0, k - 1) * share)} {t}\n")
                    samples += 1
    family("sglang:time_to_first_token_seconds_bucket")
    for i in sg:
        per = rate[i] / 300 * STEP_S
        for streaming, share in (("false", 0.3), ("true", 0.7)):
            lb = tok(i, streaming)
            for j, le in enumerate(SGL_TTFT_LE):
                frac = min(1.0, (j + 1) / 10)
                for k, t in enumerate(times):
                    w(f'sglang:time_to_first_token_seconds_bucket{{{lb},le="{le}"}} {round(per * k * frac * share)} {t}\n')
                    samples += 1
    return samples


async def in_process(url: str, refreshes: int, grid0: float) -> dict[str, object]:
    from vtop.config import Config
    from vtop.monitor.fleet import Fleet
    from vtop.sources.prometheus import PromClient

    fleet = Fleet(Config(), PromClient(url, timeout_s=30.0), freeze_gc=True)  # as the screen makes it
    t = time.perf_counter()
    await fleet.refresh()
    first = time.perf_counter() - t
    q0, b0 = fleet.client.queries, fleet.client.bytes
    t = time.perf_counter()
    await fleet.backfill()
    backfill = time.perf_counter() - t
    bq, bb = fleet.client.queries - q0, fleet.client.bytes - b0
    walls, qs, bs = [], [], []
    asked0 = fleet.vllm_asked
    cpu0 = time.process_time()
    for _ in range(refreshes):
        q0, b0 = fleet.client.queries, fleet.client.bytes
        t = time.perf_counter()
        await fleet.refresh()
        walls.append(time.perf_counter() - t)
        qs.append(fleet.client.queries - q0)
        bs.append(fleet.client.bytes - b0)
    cpu = (time.process_time() - cpu0) / refreshes
    asked = fleet.vllm_asked - asked0
    # the same at a new scrape of every instance (the whole vLLM query, each instance fed to its tracker
    # and judged): the generated samples are every STEP_S on one grid, so wait for the next one, 3 times.
    # At a 15 s scrape interval one refresh in three is like this, at 30 s one in six; a fleet whose
    # scrapes are spread over the interval asks the vLLM query every refresh and feeds a share of it.
    # The wait runs the event loop, as the screen's does between refreshes: the slower part a refresh
    # sends at its end is read and decoded meanwhile, and collected by the next (a blocking sleep left
    # its answer in the socket, read and decoded inside the next, timed, refresh: +40-60 ms there).
    fed_walls, fed_cpu_all = [], []
    for _ in range(5):
        await asyncio.sleep(STEP_S - (time.time() - grid0) % STEP_S + 0.5)
        asked0 = fleet.vllm_asked
        c = time.process_time()
        t = time.perf_counter()
        await fleet.refresh()
        fed_walls.append(time.perf_counter() - t)
        fed_cpu_all.append(time.process_time() - c)
        assert fleet.vllm_asked == asked0 + 1, "no new scrape seen"
    fed_cpu = statistics.median(fed_cpu_all)
    assert fleet.error is None, fleet.error
    # each query alone (Prometheus' evaluation + the transfer + json.loads), and vtop's own share
    from vtop.sources import fleet as q

    def queries() -> dict[str, str]:
        return {"vllm": q.vllm_query(), "vllm_half_1": q.vllm_queries()[0], "vllm_half_2": q.vllm_queries()[1],
                "ts": q.ts_query(), "ttft": q.rates_query(), "up": q.up_query(), "gpu": q.gpu_query(),
                **{f"slow_{k}_{'+'.join(p)}": fleet._slow_query(k, p) for k, p in fleet.SLOW_PARTS}}

    both = queries()
    # the same queries with vLLM's names only: the SGLang names out of the one table for the moment
    table = q.SGLANG_BESIDE_VLLM, q.SGLANG_BY_LABEL
    q.SGLANG_BESIDE_VLLM, q.SGLANG_BY_LABEL = {}, {}
    try:
        vllm_only = {k: v for k, v in queries().items() if v != both[k]}
    finally:
        q.SGLANG_BESIDE_VLLM, q.SGLANG_BY_LABEL = table
    assert vllm_only and all("sglang:" not in v for v in vllm_only.values())
    timings: dict[tuple[str, str], list[float]] = {}
    for _ in range(5):  # in turn, so that a busy moment of the box falls on both
        for kind, qs_ in (("both", both), ("vllm_only", vllm_only)):
            for name, promql in qs_.items():
                t = time.perf_counter()
                await fleet.client.query(promql, at=time.time())
                timings.setdefault((kind, name), []).append(time.perf_counter() - t)
    alone = {n: round(statistics.median(timings["both", n]), 3) for n in both}
    alone_vllm = {n: round(statistics.median(timings["vllm_only", n]), 3) for n in vllm_only}
    engines = Counter(r.engine or "none" for r in fleet.rows.values())
    sgl_rows = [r for r in fleet.rows.values() if r.engine == "sglang"]
    out = {
        "instances_seen": len(fleet.rows),
        "instances_by_engine": dict(engines),
        # what the SGLang rows show: their numbers read from its names (None would be a gap)
        "sglang_rows_with_running_kv_gen_ttft": sum(
            1 for r in sgl_rows if None not in (r.running, r.kv_pct, r.gen_tps, r.ttft_p50)),
        "alerts": len(fleet.alerts),
        "alert_rules": dict(Counter(a.rule for a in fleet.alerts)),
        "alerts_said": [f"{a.rule}: {a.title}" for a in fleet.alerts][:10],
        "first_refresh_s": round(first, 3),
        "backfill_s": round(backfill, 3),
        "backfill_queries": bq,
        "backfill_mb": round(bb / 1e6, 1),
        "backfill_note": fleet.backfill_note,
        "queries_per_refresh": max(qs),
        "refresh_mb": round(statistics.median(bs) / 1e6, 2),
        "refresh_s_median": round(statistics.median(walls), 3),
        "refresh_s_max": round(max(walls), 3),
        "refresh_s_all": [round(w, 3) for w in walls],
        "refresh_cpu_s": round(cpu, 3),
        "refreshes_that_asked_the_vllm_query": asked,
        "refresh_queries_all": qs,
        "refresh_all_new_scrapes_s_median": round(statistics.median(fed_walls), 3),
        "refresh_all_new_scrapes_cpu_s": round(fed_cpu, 3),
        "refresh_all_new_scrapes_s_all": [round(w, 3) for w in fed_walls],
        "query_alone_s": alone,
        "query_alone_vllm_names_only_s": alone_vllm,
        "refresh_cpu_pct_at_5s": round(100 * cpu / 5.0, 1),
        # a 30 s scrape read every 5 s: one refresh in six has every instance's new scrape
        "refresh_cpu_pct_at_5s_scrape_30s": round(100 * (5 * cpu + fed_cpu) / 6 / 5.0, 2),
        "refresh_cpu_pct_at_5s_scrape_15s": round(100 * (2 * cpu + fed_cpu) / 3 / 5.0, 2),
        # vLLM's example Prometheus config scrapes every 5 s: every refresh has every instance new
        "refresh_cpu_pct_at_5s_scrape_5s": round(100 * fed_cpu / 5.0, 2),
    }
    await fleet.aclose()
    return out


def in_tmux(url: str, seconds: float) -> dict[str, object]:
    tmux = Tmux(width=160, height=50)
    try:
        pid, t0 = tmux.new("fleet", [*vtop_cmd(), "--prometheus", url])
        frame, _ = tmux.wait_for("fleet", lambda s: "vtop fleet" in s, timeout=30, since=t0)
        rows, screen = tmux.wait_for("fleet", lambda s: "h0" in s and "instances" in s, timeout=60, since=t0)
        hist, screen = tmux.wait_for("fleet", lambda s: "reading history" not in s and "h0" in s, timeout=120,
                                     since=t0)
        procs = [pid, *descendants(pid)]
        vpid = max(procs, key=lambda p: vm_kb(p, "VmRSS") if os.path.exists(f"/proc/{p}") else 0)
        time.sleep(5)
        c0 = sum(cpu_seconds(vpid))
        w0 = time.monotonic()
        time.sleep(seconds)
        c1 = sum(cpu_seconds(vpid))
        w1 = time.monotonic()
        out: dict[str, object] = {
            "first_frame_s": None if frame is None else round(frame, 2),
            "first_rows_s": None if rows is None else round(rows, 2),
            "history_done_s": None if hist is None else round(hist, 2),
            "cpu_pct_of_a_core": round(100 * (c1 - c0) / (w1 - w0), 2),
            "cpu_window_s": round(w1 - w0, 1),
            "rss_mb": round(vm_kb(vpid, "VmRSS") / 1024, 1),
            "hwm_mb": round(vm_kb(vpid, "VmHWM") / 1024, 1),
            "screen_top": screen.splitlines()[:3],
        }
        return out
    finally:
        tmux.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--instances", type=int, default=1000)
    ap.add_argument("--sglang", type=int, default=None,
                    help="how many of the instances serve SGLang's names (default: half)")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--refreshes", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=60.0, help="CPU window of the screen")
    ap.add_argument("--json", help="write the figures here too")
    ap.add_argument("--no-tmux", action="store_true")
    ap.add_argument("--no-in-process", action="store_true", help="the screen's figures only")
    a = ap.parse_args()
    sglang = a.instances // 2 if a.sglang is None else max(0, min(a.sglang, a.instances))
    for exe in ("promtool", "prometheus"):
        if shutil.which(exe) is None:
            sys.exit(f"bench/fleet.py: needs {exe} (apt-get install prometheus)")
    work = Path(tempfile.mkdtemp(prefix="vtop-fleet-bench-"))
    try:
        now = int(time.time())
        om = work / "fleet.om"
        t = time.perf_counter()
        samples = generate(om, a.instances, a.gpus, now - 360, now + 720, sglang)
        gen_s = time.perf_counter() - t
        print(f"generated {samples:,} samples ({om.stat().st_size / 1e6:.0f} MB) in {gen_s:.0f} s", flush=True)
        data = work / "data"
        t = time.perf_counter()
        subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(om), str(data)], check=True,
                       stdout=subprocess.DEVNULL)
        print(f"promtool backfill: {time.perf_counter() - t:.0f} s", flush=True)
        om.unlink()
        with Prometheus([], storage=str(data)) as p:
            p.wait_for("up", a.instances, timeout=120)
            res: dict[str, object] = {
                "instances": a.instances, "sglang_instances": sglang, "gpus_per_instance": a.gpus, "samples": samples,
                "series_per_instance": {e: n + 6 * a.gpus for e, n in SERIES.items()},
                "host_cpus": os.cpu_count(), "load_avg_at_start": os.getloadavg()[0]}
            if not a.no_in_process:
                res["in_process"] = asyncio.run(in_process(p.url, a.refreshes, now - 360))
                print(json.dumps(res["in_process"], indent=1), flush=True)
            if not a.no_tmux:
                res["screen"] = in_tmux(p.url, a.seconds)
                print(json.dumps(res["screen"], indent=1), flush=True)
        if a.json:
            Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
