"""Record a real Prometheus' answers to the fleet's queries: ``python -m tools.record_fleet_fixture``.

A real Prometheus (Debian's 2.42, :mod:`tests.helpers.prom_harness`) scrapes, every 2 seconds:

* ``gpu-a:8000`` a replay of the real H200 vLLM 0.26.0 /metrics from the moment a chat request
  without ``max_tokens`` runs alone (tests/fixtures/vllm/h200-0.26.0-metrics-timeline.jsonl.xz,
  payloads 40-110: 1 running, tokens rising, nothing finishing; scraped every 2 s, so the 70 real
  seconds stand for 140: past the runaway rule's default 2 minutes);
* ``gpu-b:8000`` the real CPU vLLM 0.32.0 /metrics under load, frozen (8 running, no token moves:
  a stalled engine);
* ``gpu-c:8000`` nothing (a port that refuses: ``up == 0``);
* ``gpu-e:8000`` nothing either, but ``vtop export`` on gpu-e (``gpu-e:9464``, a replay of its
  text) says the server there is starting, in CUDA graph capture for 42 s;
* ``gpu-d:8000`` the real CPU vLLM 0.32.0 /metrics, idle;
* ``gpu-f:30000`` an SGLang server under a steady load: SGLang 0.5.17's ``sglang:`` families, from the
  HAND-MADE payload ``tests/fixtures/sglang/metrics-0.5.17-handmade.txt`` (written from SGLang's source, not
  recorded: no real SGLang has run beside vtop yet), moved on at each scrape by :func:`sglang_busy` (requests
  finishing at 2 a second with 150 prompt and 450 generated tokens each, counted in ``num_requests_total``
  as they finish, the scheduler's per-step
  ``realtime_tokens_total`` growing as they are made, three first tokens a scrape, running and queued moving
  as a busy server's do);
* ``gpu-g:30000`` the same hand-made SGLang payload, frozen (3 running, 7 queued, nothing moving: a stalled
  scheduler);
* ``gpu-a:9400``, ``gpu-b:9400``, ``gpu-d:9400`` dcgm-exporter replays (:func:`dcgm_text`),
  gpu-d's GPU 5 with XID 79.

Prometheus scrapes the SGLang targets with the vLLM ones in the one ``vllm`` job (a fleet's job is often
"the inference servers"). When the runaway's replay reaches payload 108 the answers of every query the fleet sends (the four of a refresh, the two
of its history, the drill-in's GPU range) are saved with the time they were asked at, to
``tests/fixtures/prometheus/fleet-4.json``. The fast tier replays them (:mod:`tests.helpers.prom_replay`).
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlencode

from tests.helpers.metrics_server import MetricsServer, h200_payloads
from tests.helpers.prom_harness import Prometheus, Target, dcgm_text, free_port
from vtop.sources import fleet as q

OUT = Path(__file__).parent.parent / "tests" / "fixtures" / "prometheus" / "fleet-4.json"
HISTORY_S = 300.0
#: what `vtop export` serves on a box whose vLLM is starting (the names another helper's exporter uses)
VTOP_EXPORT_GPU_E = """# TYPE vtop_startup_phase gauge
vtop_startup_phase{server="http://127.0.0.1:8000",phase="CUDA graph capture"} 1
# TYPE vtop_startup_phase_seconds gauge
vtop_startup_phase_seconds{server="http://127.0.0.1:8000"} 42
# TYPE vtop_alert gauge
vtop_alert{subject="http://127.0.0.1:8000",rule="startup_stall",severity="warning"} 1
"""
STEP_S = 5.0
SGLANG = Path(__file__).parent.parent / "tests" / "fixtures" / "sglang" / "metrics-0.5.17-handmade.txt"


def sglang_busy(base: str, n: int) -> list[str]:
    """``n`` scrapes of the hand-made SGLang payload ``base`` under a steady load: SGLang counts prompt and
    generated tokens, and the request in ``num_requests_total``, when a request finishes
    (``observe_one_finished_request``); at 2 s a scrape, 4 requests of 150 + 450 tokens finish a scrape; its
    scheduler counts the tokens as they are made (``realtime_tokens_total`` by ``mode``: 1800 decoded, 500 prompt
    tokens computed and 100 from the prefix cache a scrape); 3 first tokens a scrape, 2 of them within 0.1 s;
    running and queued move."""
    running, queued = (3, 2, 4, 3, 1, 3), (7, 5, 6, 4, 7, 6)
    adds = {  # sample (name and the labels that tell it) -> what one scrape adds
        ('sglang:prompt_tokens_total', 'is_streaming="false"'): 600.0,
        ('sglang:generation_tokens_total', 'is_streaming="false"'): 1800.0,
        ('sglang:num_requests_total', 'is_streaming="false"'): 4.0,
        ('sglang:realtime_tokens_total', 'mode="decode"'): 1800.0,
        ('sglang:realtime_tokens_total', 'mode="prefill_compute"'): 500.0,
        ('sglang:realtime_tokens_total', 'mode="prefill_cache"'): 100.0,
        ('sglang:time_to_first_token_seconds_bucket', 'is_streaming="false",le="0.1"'): 2.0,
        ('sglang:time_to_first_token_seconds_bucket', 'is_streaming="false",le="1.0"'): 3.0,
        ('sglang:time_to_first_token_seconds_bucket', 'is_streaming="false",le="+Inf"'): 3.0,
        ('sglang:time_to_first_token_seconds_count', 'is_streaming="false"'): 3.0,
        ('sglang:time_to_first_token_seconds_sum', 'is_streaming="false"'): 0.5,
    }
    out = []
    for i in range(n):
        lines = []
        for line in base.splitlines():
            name, _, rest = line.partition("{")
            if name == "sglang:num_running_reqs":
                line = line.rsplit(" ", 1)[0] + f" {running[i % len(running)]}.0"
            elif name == "sglang:num_queue_reqs":
                line = line.rsplit(" ", 1)[0] + f" {queued[i % len(queued)]}.0"
            else:
                for (n_, tell), d in adds.items():
                    if name == n_ and tell in rest:
                        head, v = line.rsplit(" ", 1)
                        line = f"{head} {float(v) + d * i}"
            lines.append(line)
        out.append("\n".join(lines) + "\n")
    return out


def queries(end: float) -> dict[str, tuple[str, dict[str, str]]]:
    start = f"{end - HISTORY_S:.3f}"
    rng = {"start": start, "end": f"{end:.3f}", "step": f"{STEP_S:g}"}
    at = {"time": f"{end:.3f}"}
    return {
        "vllm": ("query", {"query": q.vllm_query(), **at}),
        "rates": ("query", {"query": q.rates_query(), **at}),
        "up": ("query", {"query": q.up_query(), **at}),
        "gpu": ("query", {"query": q.gpu_query(), **at}),
        "vtop": ("query", {"query": q.vtop_query(), **at}),
        "vllm_range": ("query_range", {"query": q.vllm_query(), **rng}),
        "up_range": ("query_range", {"query": q.up_query(), **rng}),
        **{f"gpu_detail_{h}": ("query_range", {"query": q.gpu_detail_query(h), **rng})
           for h in ("gpu-a", "gpu-b", "gpu-c", "gpu-d", "gpu-e", "gpu-f", "gpu-g")},
    }


def main() -> None:
    fx = Path(__file__).parent.parent / "tests" / "fixtures" / "vllm"
    cpu_load = (fx / "cpu-0.32.0-metrics-load.txt").read_text()
    cpu_idle = (fx / "cpu-0.32.0-metrics-idle.txt").read_text()
    with MetricsServer(h200_payloads(40, 71), model="Qwen/Qwen3-8B") as a, MetricsServer([cpu_load]) as b, \
            MetricsServer([cpu_idle]) as d, \
            MetricsServer([dcgm_text("gpu-a", util=[23, 0, 0, 0, 0, 0, 0, 0], sm=0.02, fb_used=126_000)]) as da, \
            MetricsServer([dcgm_text("gpu-b", gpus=1, util=0, sm=0.0, fb_used=20_000, model="NVIDIA L4",
                                     fb_total=23_034, power=31)]) as db, \
            MetricsServer([dcgm_text("gpu-d", util=61, sm=0.45, xid={5: 79})]) as dd, \
            MetricsServer([VTOP_EXPORT_GPU_E]) as vc, \
            MetricsServer(sglang_busy(SGLANG.read_text(), 400), model="tiny") as f, \
            MetricsServer([SGLANG.read_text()], model="tiny") as g:
        ts = [Target("vllm", f"127.0.0.1:{a.port}", "gpu-a:8000"),
              Target("vllm", f"127.0.0.1:{b.port}", "gpu-b:8000"),
              Target("vllm", f"127.0.0.1:{free_port()}", "gpu-c:8000"),
              Target("vllm", f"127.0.0.1:{d.port}", "gpu-d:8000"),
              Target("dcgm", f"127.0.0.1:{da.port}", "gpu-a:9400"),
              Target("dcgm", f"127.0.0.1:{db.port}", "gpu-b:9400"),
              Target("dcgm", f"127.0.0.1:{dd.port}", "gpu-d:9400"),
              Target("vllm", f"127.0.0.1:{free_port()}", "gpu-e:8000"),
              Target("vtop", f"127.0.0.1:{vc.port}", "gpu-e:9464"),
              Target("vllm", f"127.0.0.1:{f.port}", "gpu-f:30000"),
              Target("vllm", f"127.0.0.1:{g.port}", "gpu-g:30000")]
        with Prometheus(ts, scrape=2.0) as p:
            p.wait_for("vllm:num_requests_running", 3)
            print(f"Prometheus {p.url} scraping; waiting for the runaway's replay to reach payload 108")
            while a.i < 68:
                time.sleep(0.5)
            end = round(time.time(), 3)
            out: dict[str, object] = {"recorded_at": end, "prometheus": "Debian prometheus 2.42.0",
                                      "history_s": HISTORY_S, "step_s": STEP_S, "answers": {}}
            for name, (ep, params) in queries(end).items():
                with urllib.request.urlopen(f"{p.url}/api/v1/{ep}?{urlencode(params)}", timeout=10) as r:
                    body = json.loads(r.read())
                out["answers"][name] = {"endpoint": ep, "query": params["query"], "answer": body}  # type: ignore[index]
                print(name, len(body["data"]["result"]), "series")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(out, separators=(",", ":")) + "\n")
    print("wrote", OUT, OUT.stat().st_size, "bytes")


if __name__ == "__main__":
    main()
