"""The diagnosis rules (issue #6), rule by rule, on real recordings where one has the fault and on
realistic synthetic traces (built from real payloads) where none does; and silence on normal traces."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from functools import cache

from tests.helpers import diag_fixtures as F
from vtop.core.gpu_history import GpuHistory
from vtop.core.phases import Phase, PhaseTracker
from vtop.core.rules import RULES, Alert, Diagnoser, Evidence, Thresholds, diagnose_once
from vtop.sources.metrics_text import Histogram

URL = F.URL
OTHER_PID = 4242


# --------------------------------------------------------------------------- cached real replays


@cache
def run_default() -> tuple[F.Tick, ...]:
    return tuple(F.replay_h200())


@cache
def run_30() -> tuple[F.Tick, ...]:
    return tuple(F.replay_h200(Thresholds(runaway_s=30)))


@cache
def run_30_named() -> tuple[F.Tick, ...]:
    return tuple(F.replay_h200(Thresholds(runaway_s=30), requests=F.runaway_requests, request_logging=True))


def rate_in(title: str) -> float:
    m = re.search(r"([\d,]+) tok/s", title)
    assert m, title
    return float(m.group(1).replace(",", ""))


def rules(alerts: list[Alert] | tuple[Alert, ...]) -> set[str]:
    return {a.rule for a in alerts}


def loud(alerts: list[Alert] | tuple[Alert, ...]) -> list[Alert]:
    return [a for a in alerts if a.severity != "info"]


# --------------------------------------------------------------------------- the result type


def test_alert_to_json_and_rule_ids() -> None:
    a = Alert("runaway", "warning", "t", ("e1", "e2"), ("f",), URL, 12.5)
    d = a.to_json()
    assert d == {"rule": "runaway", "severity": "warning", "title": "t", "evidence": ["e1", "e2"], "fix": ["f"],
                 "target": URL, "since": 12.5}
    assert json.loads(json.dumps(d)) == d
    assert a.key == ("runaway", URL)
    assert {"runaway", "engine_stall", "startup_stall", "startup_failure", "oom_startup", "oom_transient",
            "oom_steady", "kv_saturation", "sm_idle", "risky_flags"} <= set(RULES)


def test_core_module_imports_neither_textual_nor_sources() -> None:
    code = ("import sys, vtop.core.rules\n"
            "print(','.join(sorted(m for m in sys.modules if m.startswith(('textual', 'vtop.sources', 'httpx')))))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == ""


# --------------------------------------------------------------------------- rule 1: runaway, on the real H200 run


def test_real_h200_runaway_fires_with_its_numbers() -> None:
    ticks = run_30()
    end = F.at(ticks, 196.1)
    a = end.rule("runaway")
    assert a is not None and a.severity == "warning" and a.target == URL
    assert a.title.startswith("Runaway decode on :8000: 1 request running 1m 1")
    assert 440 <= rate_in(a.title) <= 480  # the log's own stats line says 462.9 tokens/s
    ev = "\n".join(a.evidence)
    assert "max_model_len 32,768" in ev
    assert "running went 0 -> 1" in ev and "0 of those finished" in ev
    assert "up to 1m 1" in ev  # 32,768 tokens at ~460 tok/s: the 71 s it really took
    assert "gpu0: GPU-Util" in ev and "supporting only" in ev
    # it began when the request started (+126 s), not at the burst's last finish (+116 s)
    assert 125.0 <= a.since - F.R.BASE <= 127.0
    fixes = "\n".join(a.fix)
    assert "--override-generation-config '{\"max_new_tokens\": 4096}'" in fixes
    assert "no --max-tokens serve flag" in fixes
    assert "--enable-log-requests" in fixes  # the run had no request logging


def test_real_h200_runaway_not_during_startup_or_burst() -> None:
    ticks = run_30()
    burst = [t for t in ticks if 104 <= t.rel <= 117]
    assert max(t.view.metrics.running for t in burst) == 1024  # the data really has the burst
    assert max(t.view.metrics.waiting for t in burst) >= 476
    assert any(t.view.state == "starting" for t in ticks)
    for t in ticks:
        if t.rel < 155.0:
            assert t.rule("runaway") is None, (t.rel, t.alerts)
    firing = [t.rel for t in ticks if t.rule("runaway")]
    assert firing and 155.0 <= firing[0] <= 158.0  # 30 s after the runaway's first scrape
    assert max(firing) < 197.5  # the request finished (length) at +197 s


def test_real_h200_default_thresholds_name_only_the_runaway() -> None:
    """The real H200 run at default settings: start, burst of 1,500 with 708 waiting, then a
    chat request without max_tokens that ran 71 s to the 32,768-token limit. Only that is loud,
    named from its age (45 s) while it ran, never during the start or the burst."""
    ticks = run_default()
    assert len(ticks) > 200
    for t in ticks:
        assert {a.rule for a in loud(t.alerts)} <= {"runaway"}, (t.rel, t.alerts)
    firing = [t.rel for t in ticks if loud(t.alerts)]
    assert firing and 165.0 <= firing[0] <= 175.0 and max(firing) < 197.5, firing
    # Only the (really risky) launch flags: 32k context with no generation cap.
    infos = {a.rule for t in ticks for a in t.alerts}
    assert infos == {"risky_flags", "runaway"}
    assert "no generation cap with max_model_len 32,768" in F.at(ticks, 120).rule("risky_flags").title
    # the startup tracker saw the whole start and called it ready
    assert any(t.view.state == "starting" for t in ticks) and F.at(ticks, 120).view.state == "up"


def test_real_h200_runaway_names_the_request() -> None:
    a = F.at(run_30_named(), 190.1).rule("runaway")
    assert a is not None
    first = a.evidence[0]
    assert F.RUNAWAY_ID in first and "no max_tokens" in first and "32,628" in first and "at most 1m 0" in first
    assert not any("--enable-log-requests" in f for f in a.fix)


def test_real_live_run_runaway_clears_when_the_client_aborts() -> None:
    out = F.replay_live_run(Thresholds(runaway_s=30))
    firing = [rel for rel, alerts, _ in out if "runaway" in rules(alerts)]
    assert firing, "the 40 s runaway of the live run should trip a 30 s threshold"
    last = max(firing)
    after = [(rel, v.metrics.running) for rel, alerts, v in out if rel > last and v.metrics is not None]
    assert after and after[0][1] == 0  # it stopped because running fell to 0 (abort, no 'length')
    assert all("runaway" not in rules(a) for rel, a, _ in out if rel > last)
    assert all(loud(a) == [] for _, a, _ in F.replay_live_run())  # 40 s < the default 120 s


def test_runaway_evidence_from_max_tokens_histogram_after_a_previous_runaway() -> None:
    # The real run up to the first runaway's end (its max_tokens 32,628 lands in the >20,000 bucket),
    # then a second chat client without max_tokens starts, decoding like the first did.
    ses = F.Session(Thresholds(runaway_s=30), process=F.h200_process())
    F.replay_h200(Thresholds(runaway_s=30), until=201.2, session=ses)
    last = ses.server_tracker.view().metrics
    assert last.running == 0 and last.request_success_total["length"] == 1701
    mono = ses.now
    gen, prompt = last.generation_tokens_total, last.prompt_tokens_total
    alerts: list[Alert] = []
    for i in range(1, 41):
        m = F.grow(last, running=1.0, generation_tokens_total=gen + 460.0 * i, prompt_tokens_total=prompt + 140,
                   kv_cache_usage=0.00005 * i)
        ses.metrics(m, mono=mono + i)
        alerts = ses.tick()
    a = next(x for x in alerts if x.rule == "runaway")
    line = next(e for e in a.evidence if "max_tokens above" in e)
    assert line.startswith("1 request finished") and "above 20,000" in line and "max_model_len 32,768" in line
    assert "1,701 finished with reason 'length'" in line or "finished with reason 'length'" in line
    assert 455 <= rate_in(a.title) <= 465


def test_runaway_is_critical_when_the_queue_builds_behind_it() -> None:
    # The real CPU payload with 2 running and 6 waiting: the two never finish, tokens flow, the queue grows.
    base = F.fixture_metrics("cpu-0.32.0-metrics-load-waiting.txt")
    assert base.running == 2 and base.waiting == 6
    ses = F.Session(process=F.cpu_process(), url="http://127.0.0.1:8011")
    g0 = base.generation_tokens_total
    alerts: list[Alert] = []
    seen_at = None
    for i in range(0, 135):
        m = F.grow(base, generation_tokens_total=g0 + 38.0 * i, waiting=6.0 + i // 20)
        ses.metrics(m, mono=F.R.BASE + i, max_model_len=2048, version="0.32.0")
        alerts = ses.tick()
        if seen_at is None and "runaway" in rules(alerts):
            seen_at = i
    assert seen_at is not None and 45 <= seen_at <= 47  # its age from /metrics: 45 s (then the quiet rule at 120 s)
    a = next(x for x in alerts if x.rule == "runaway")
    assert a.severity == "critical" and a.title.startswith("Runaway decode on :8011: 2 requests")
    assert "waiting 12" in a.evidence[0] or "waiting 12" in " ".join(a.evidence)
    assert 30 <= rate_in(a.title) <= 45
    assert "max_model_len 2,048" in " ".join(a.evidence)


# --------------------------------------------------------------------------- rule 2: engine stall


def frozen_cpu(seconds: int, name: str = "cpu-0.32.0-metrics-load.txt") -> list[tuple[int, list[Alert]]]:
    """The same real payload scraped every second: the engine is frozen (gauges and counters flat)."""
    m = F.fixture_metrics(name)
    ses = F.Session(process=F.cpu_process(), url="http://127.0.0.1:8011")
    out = []
    for i in range(seconds):
        ses.metrics(m, mono=F.R.BASE + i, max_model_len=2048, version="0.32.0")
        out.append((i, ses.tick()))
    return out


def test_engine_stall_on_a_frozen_real_cpu_payload() -> None:
    out = frozen_cpu(40)
    assert F.fixture_metrics("cpu-0.32.0-metrics-load.txt").running == 8
    assert all("engine_stall" not in rules(a) for i, a in out if i < 20)
    i, alerts = out[-1]
    a = next(x for x in alerts if x.rule == "engine_stall")
    assert a.severity == "critical" and alerts[0] is a  # critical sorts first
    assert a.title == "Engine stalled on :8011: 8 running, no token for 39s"
    ev = "\n".join(a.evidence)
    assert "generation tokens stuck at 2,289" in ev and "/health 200" in ev
    assert any("press d for a py-spy dump of the enginecore" in f.lower() for f in a.fix)
    assert "runaway" not in rules(alerts)  # tokens are flat: not a runaway


def test_idle_real_server_stays_quiet() -> None:
    out = frozen_cpu(200, "cpu-0.32.0-metrics-idle.txt")
    assert F.fixture_metrics("cpu-0.32.0-metrics-idle.txt").running == 0
    assert all(a == [] for _, a in out)


def test_busy_healthy_server_stays_quiet() -> None:
    base = F.fixture_metrics("cpu-0.32.0-metrics-load.txt")
    ses = F.Session(Thresholds(runaway_s=30), process=F.cpu_process(), url="http://127.0.0.1:8011")
    done = dict(base.request_success_total)
    for i in range(300):
        done["length"] = done.get("length", 0.0) + (1.0 if i % 2 else 0.0)
        m = F.grow(base, running=8.0 - (i % 2), generation_tokens_total=base.generation_tokens_total + 60.0 * i,
                   prompt_tokens_total=base.prompt_tokens_total + 30.0 * i, request_success_total=dict(done))
        ses.metrics(m, mono=F.R.BASE + i, max_model_len=2048, version="0.32.0")
        assert ses.tick() == [], i


# --------------------------------------------------------------------------- rule 3: startup stall / failure


def test_real_startup_failure_log() -> None:
    tr = PhaseTracker(year=2026)
    for i, ln in enumerate(F.log_lines(F.LOGS / "vllm-0.26.0-h200-failure.log")):
        tr.feed(ln, 100.0 + i * 0.01)
    snap = tr.snapshot()
    assert snap.state == "failed"
    alerts = diagnose_once(F.evidence(102.0, startup=snap, log_target=URL))
    (a,) = alerts
    assert a.rule == "startup_failure" and a.severity == "critical" and a.target == URL
    assert "failed to start" in a.title and "flashinfer" in a.title
    assert "ModuleNotFoundError: No module named 'flashinfer'" in " ".join(a.evidence)
    assert "pip install flashinfer-python" in a.fix[0]
    assert a.since == snap.failure.arrival


def _stalled_start(sm: float | None, util: float) -> list[Alert]:
    lines = F.h200_log_until("Capturing CUDA graphs (PIECEWISE)")
    ses = F.Session(process=F.h200_process(), log=True)
    ses.lines(lines)
    t0 = lines[-1][0]
    for i in range(0, 700, 5):
        ses.gpu(F.gpu_poll(t0 + i, F.h200_sample(util, sm, 70.7, [(F.ENGINE_PID, 70.0)])))
        if i % 10 == 0:
            ses.refused(t0 + i)
    alerts = ses.tick()
    assert ses.log.snapshot().current is Phase.CUDA_GRAPHS
    return alerts


def test_startup_stall_in_cuda_graph_capture() -> None:
    alerts = _stalled_start(sm=0.0, util=0.0)
    (a,) = [x for x in alerts if x.rule == "startup_stall"]
    assert a.severity == "warning"
    assert a.title.startswith("Startup of :8000 stalled in CUDA graph capture: no new log line for 11m")
    ev = "\n".join(a.evidence)
    assert "PIECEWISE" in ev and "gpu0: GPU-Util 0 %" in ev
    assert any("--enforce-eager" in f for f in a.fix) and any("py-spy" in f for f in a.fix)
    assert "sm_idle" not in rules(alerts)


def test_startup_stall_with_busy_sms_is_only_info() -> None:
    alerts = _stalled_start(sm=88.0, util=100.0)
    (a,) = [x for x in alerts if x.rule == "startup_stall"]
    assert a.severity == "info" and "SMs are busy" in " ".join(a.evidence)
    assert "sm_idle" not in rules(alerts)


def test_slow_startup_at_full_gpu_stays_quiet() -> None:
    # 5 minutes of a start at GPU-Util 100 % with few SMs busy (profiling, graph capture): normal.
    lines = F.h200_log_until("Initial profiling/warmup run took")
    ses = F.Session(Thresholds(sm_idle_s=60), process=F.h200_process(), log=True)
    ses.lines(lines)
    t0 = lines[-1][0]
    for i in range(300):
        ses.gpu(F.gpu_poll(t0 + i, F.h200_sample(100.0, 4.0, 70.7, [(F.ENGINE_PID, 70.0)])))
        ses.refused(t0 + i)
        assert rules(ses.tick()) <= {"risky_flags"}, i
    assert ses.server_tracker.view().state == "starting"
    assert ses.log.snapshot().state == "starting"


# --------------------------------------------------------------------------- rule 4: CUDA OOM


def test_oom_at_startup_names_the_other_process() -> None:
    lines = F.h200_log_until("Initial profiling/warmup run took")
    ses = F.Session(process=F.h200_process(), log=True)
    ses.lines(lines)
    t0 = lines[-1][0]
    for i in range(5):
        ses.gpu(F.gpu_poll(t0 + i, F.h200_sample(3.0, 1.0, 128.5, [(OTHER_PID, 60.0), (F.ENGINE_PID, 68.0)])))
        ses.refused(t0 + i)
    ses.lines(F.engine_oom_lines(t0 + 5, F.torch_oom("8.00 GiB", "3.12 GiB", [(OTHER_PID, "60.00 GiB")],
                                                     "76.58 GiB", "74.10 GiB", "0.91 GiB"), at_start=True))
    snap = ses.log.snapshot()
    assert snap.state == "failed" and snap.failure.kind == "cuda_oom"
    alerts = ses.tick()
    assert rules(alerts) == {"oom_startup", "risky_flags"}  # no duplicate startup_failure
    a = alerts[0]
    assert a.rule == "oom_startup" and a.severity == "critical"
    assert a.title == "CUDA out of memory starting :8000 during memory profiling: tried to allocate 8.00 GiB"
    ev = "\n".join(a.evidence)
    assert "gpu0: other processes hold 60.0 GiB" in ev and f"pid {OTHER_PID} (60.0 GiB)" in ev
    assert f"EngineCore of :8000 (pid {F.ENGINE_PID})" not in ev.split("other processes")[1]
    fixes = "\n".join(a.fix)
    assert "lower --gpu-memory-utilization (now 0.5)" in fixes and "--max-model-len (now 32,768)" in fixes


def test_oom_at_startup_from_vllm_free_memory_check() -> None:
    lines = F.h200_log_until("Using V2 Model Runner")
    ses = F.Session(process=F.h200_process(["--gpu-memory-utilization", "0.92"]), log=True)
    ses.lines(lines)
    t0 = lines[-1][0]
    ses.gpu(F.gpu_poll(t0, F.h200_sample(0.0, 0.0, 61.2, [(OTHER_PID, 60.0), (F.ENGINE_PID, 0.6)])))
    ses.refused(t0)
    s = F.stamp_of(t0 + 1)
    e = f"(EngineCore pid={F.ENGINE_PID}) ERROR {s} [core.py:1330] "
    ses.lines([(t0 + 1, e + "EngineCore failed to start."),
               (t0 + 1, e + "Traceback (most recent call last):"),
               (t0 + 1, e + "ValueError: Free memory on device (79.12/139.72 GiB) on startup is less than desired GPU "
                "memory utilization (0.92, 128.54 GiB). Decrease GPU memory utilization or reduce GPU memory used by "
                "other processes.")])
    alerts = ses.tick()
    # vLLM's own check, not a CUDA OOM: a startup failure named as a memory failure (issue 24 item 6;
    # the real H200 trace h200-startup-failure-cuda-oom expects startup_failure)
    a = next(x for x in alerts if x.rule == "startup_failure")
    assert "not enough free GPU memory at start: 79.12 of 139.72 GiB free" in a.title
    assert "--gpu-memory-utilization 0.92 asks for 128.54 GiB" in a.title
    assert "lower --gpu-memory-utilization to 0.55 or less" in " ".join(a.fix)
    assert any(f"pid {OTHER_PID}" in e and "60.0 GiB" in e for e in a.evidence), a.evidence
    assert "oom_startup" not in rules(alerts)


def _serving_session(thresholds: Thresholds = Thresholds(), process=None) -> tuple[F.Session, float]:
    """The real H200 start's log up to ready, then a server answering."""
    lines = F.h200_log_until("Application startup complete.")
    ses = F.Session(thresholds, process=process or F.h200_process(), log=True)
    ses.lines(lines)
    return ses, lines[-1][0]


def _serve(ses: F.Session, t0: float, seconds: int, *, kv: float = 0.01, pre_ps: float = 0.0, wait0: float = 0.0,
           wait_ps: float = 0.0, mem=lambda i: 76.6, prompt_hist=None) -> None:
    base = F.fixture_metrics("h200-0.26.0-metrics-burst-running1024.txt")
    done = dict(base.request_success_total)
    for i in range(seconds):
        done["length"] = base.request_success_total["length"] + 3.0 * i
        m = F.grow(base, running=900.0, waiting=wait0 + wait_ps * i, kv_cache_usage=kv,
                   generation_tokens_total=base.generation_tokens_total + 9000.0 * i,
                   prompt_tokens_total=base.prompt_tokens_total + 800.0 * i,
                   preemptions_total=pre_ps * i, request_success_total=dict(done),
                   **({"request_prompt_tokens": prompt_hist(i)} if prompt_hist else {}))
        ses.gpu(F.gpu_poll(t0 + i, F.h200_sample(11.0, 8.4, mem(i), [(F.ENGINE_PID, mem(i) - 0.6)])))
        ses.metrics(m, mono=t0 + i, max_model_len=32768)
        ses.tick()


def test_oom_transient_after_a_memory_spike() -> None:
    ses, t0 = _serving_session()
    _serve(ses, t0 + 1, 120, mem=lambda i: 71.4 if i < 110 else 71.4 + 2.5 * (i - 109))
    assert loud(ses.tick()) == []
    t1 = ses.now + 0.5
    ses.to(t1)
    ses.lines(F.engine_oom_lines(t1, F.torch_oom(), at_start=False))
    assert ses.log.snapshot().failure.kind == "cuda_oom" and ses.log.snapshot().failure.phase is Phase.READY
    alerts = ses.tick()
    a = next(x for x in alerts if x.rule.startswith("oom_"))
    assert a.rule == "oom_transient" and a.severity == "critical"
    assert a.title == "CUDA out of memory on :8000 after a memory spike: tried to allocate 2.00 GiB"
    assert "gpu0 memory jumped from 50.9 % to 68.7 %" in " ".join(a.evidence)
    assert any("--max-num-batched-tokens" in f for f in a.fix)
    assert "engine_died" not in rules(alerts)


def test_oom_transient_after_a_long_prompt() -> None:
    base = F.fixture_metrics("h200-0.26.0-metrics-burst-running1024.txt").request_prompt_tokens

    def hist(i: int) -> Histogram:
        extra = 1.0 if i >= 115 else 0.0  # one 18,000-token prompt finished 5 s before the OOM
        return Histogram(tuple((le, c + (extra if le >= 20000 else 0.0)) for le, c in base.buckets),
                         (base.sum or 0) + 18000 * extra, (base.count or 0) + extra)

    ses, t0 = _serving_session()
    _serve(ses, t0 + 1, 120, prompt_hist=hist)
    ses.to(ses.now + 0.5)
    ses.lines(F.engine_oom_lines(ses.now, F.torch_oom("4.50 GiB"), at_start=False))
    a = next(x for x in ses.tick() if x.rule.startswith("oom_"))
    assert a.rule == "oom_transient" and "after a long prompt" in a.title
    assert "1 request with prompts above 10,000 tokens (max_model_len 32,768)" in " ".join(a.evidence)


def test_oom_steady_under_kv_pressure_from_a_log_line() -> None:
    th = Thresholds()
    ses, t0 = _serving_session(th)
    _serve(ses, t0 + 1, 90, kv=0.992, pre_ps=2.0, wait0=300.0, wait_ps=3.0, mem=lambda i: 76.6)
    alerts = ses.tick()
    kv = next(x for x in alerts if x.rule == "kv_saturation")
    assert kv.severity == "critical"  # 2 preemptions/s with the queue growing: a storm
    # An OOM line the engine survived (no death line): only the log shows it.
    line = f"(EngineCore pid={F.ENGINE_PID}) ERROR {F.stamp_of(ses.now)} [core.py:1010] " + F.torch_oom("512.00 MiB")
    ses.lines([(ses.now + 0.1, line)])
    ses.to(ses.now + 0.2)
    assert ses.log.snapshot().state == "ready"
    alerts = ses.tick()
    # critical first, the older condition (the full KV cache) before the OOM, the info last
    assert [x.rule for x in alerts] == ["kv_saturation", "oom_steady", "risky_flags"]
    a = alerts[1]
    assert a.rule == "oom_steady" and a.title.startswith("CUDA out of memory on :8000 under KV pressure")
    assert any("--max-num-seqs" in f for f in a.fix)
    ev = " ".join(a.evidence)
    assert "KV cache peaked at 99.2 %" in ev and "120 preemptions in the minute before" in ev
    # it stays for oom_hold_s, then goes
    ses.to(ses.now + th.oom_hold_s + 1)
    assert not any(x.rule.startswith("oom_") for x in ses.tick())


def test_oom_steady_from_fragmentation_after_long_uptime() -> None:
    proc = F.h200_process(create_time=F.R.LAUNCH_T - 8 * 3600)
    ses, t0 = _serving_session(process=proc)
    _serve(ses, t0 + 1, 60, kv=0.4, mem=lambda i: 76.6)
    ses.to(ses.now + 0.5)
    ses.lines(F.engine_oom_lines(ses.now, F.torch_oom("2.00 GiB", "0.84 GiB", (), "138.86 GiB", "131.20 GiB",
                                                      "3.50 GiB"), at_start=False))
    a = next(x for x in ses.tick() if x.rule.startswith("oom_"))
    assert a.rule == "oom_steady" and "fragmentation after 8h 0" in a.title
    assert "3.5 GiB reserved by PyTorch but unallocated" in " ".join(a.evidence)
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in a.fix[0]


def test_pre_oom_warning_when_memory_climbs() -> None:
    ses = F.Session(process=F.h200_process())
    t0 = F.R.BASE
    alerts: list[Alert] = []
    first = None
    for i in range(0, 361, 5):
        other = 58.0 + 0.02 * i  # a co-tenant growing 1.2 GiB a minute next to vLLM's 70 GiB
        ses.gpu(F.gpu_poll(t0 + i, F.h200_sample(40.0, 30.0, 70.7 + other, [(F.ENGINE_PID, 70.0), (OTHER_PID, other)])))
        alerts = ses.tick()
        if first is None and "oom_risk" in rules(alerts):
            first = i
    assert first == 270  # >= 95 % from 240 s, but 5 minutes of history are needed to call it a climb
    a = next(x for x in alerts if x.rule == "oom_risk")
    assert a.severity == "warning" and a.target == "gpu0"
    assert a.title == "gpu0 memory climbing towards full: 96.8 %, +4.3 points in 5m 00s"
    ev = " ".join(a.evidence)
    assert f"growing most: pid {OTHER_PID}" in ev and "full in about" in ev


def test_no_pre_oom_warning_at_a_steady_high_level() -> None:
    ses = F.Session(process=F.h200_process())
    for i in range(0, 600, 5):  # vLLM at --gpu-memory-utilization 0.95: high and flat is normal
        ses.gpu(F.gpu_poll(F.R.BASE + i, F.h200_sample(40.0, 30.0, 132.9, [(F.ENGINE_PID, 132.3)])))
        assert "oom_risk" not in rules(ses.tick())


# --------------------------------------------------------------------------- rule 5: KV saturation


def test_kv_saturation_warning_needs_time_and_pressure() -> None:
    ses, t0 = _serving_session()
    firsts = {}
    base = F.fixture_metrics("h200-0.26.0-metrics-burst-running1024.txt")
    for i in range(40):
        m = F.grow(base, kv_cache_usage=0.97, preemptions_total=float(i // 4), waiting=476.0,
                   generation_tokens_total=base.generation_tokens_total + 9000.0 * i)
        ses.metrics(m, mono=t0 + 1 + i, max_model_len=32768)
        for a in ses.tick():
            firsts.setdefault(a.rule, i)
    assert 15 <= firsts["kv_saturation"] <= 17
    a = next(x for x in ses.tick() if x.rule == "kv_saturation")
    assert a.severity == "warning"  # 0.25 preemptions/s, queue flat
    assert a.title.startswith("KV cache full on :8000: 97 % for ") and "preemption storm" in a.title
    assert any("Lower --max-num-seqs" in f for f in a.fix)


def test_kv_high_without_preemptions_or_queue_is_quiet() -> None:
    ses, t0 = _serving_session()
    base = F.fixture_metrics("h200-0.26.0-metrics-burst-running1024.txt")
    for i in range(60):
        m = F.grow(base, kv_cache_usage=0.97, preemptions_total=0.0, waiting=max(0.0, 476.0 - 10 * i),
                   generation_tokens_total=base.generation_tokens_total + 9000.0 * i)
        ses.metrics(m, mono=t0 + 1 + i, max_model_len=32768)
        assert "kv_saturation" not in rules(ses.tick())


# --------------------------------------------------------------------------- rule 6: GPU busy, SMs idle


def _gpu_only(polls, th: Thresholds) -> list[list[Alert]]:
    d = Diagnoser(th)
    h = GpuHistory(window_s=300.0)
    out = []
    for p in polls:
        h.add(p)
        out.append(d.update(Evidence(p.mono, gpus=h)))
    return out


def test_real_matmul_and_tiny_kernel_recording_has_no_sm_idle() -> None:
    polls = F.matmul_tiny_polls()
    utils = [p.gpus[0].util_gpu for p in polls]
    assert max(utils) >= 98.0  # the matmul loop
    # even with a 5 s streak: matmul has busy SMs (95 %), the tiny loop only ~20 % GPU-Util
    assert all(a == [] for a in _gpu_only(polls, Thresholds(sm_idle_s=5.0)))
    # the same data trips a 15 % util threshold on the tiny loop (SM 0.1 %): the rule sees it
    tripped = [a for a in _gpu_only(polls, Thresholds(sm_idle_s=5.0, sm_idle_util=15.0)) if a]
    assert tripped and tripped[0][0].rule == "sm_idle"
    assert re.search(r"SM activity 0\.\d %", tripped[0][0].title)


def test_sm_idle_fires_after_its_duration_and_names_the_engine() -> None:
    ses, t0 = _serving_session()
    base = F.fixture_metrics("h200-0.26.0-metrics-runaway.txt")
    first = None
    for i in range(135):
        ses.gpu(F.gpu_poll(t0 + i, F.h200_sample(100.0, 3.0, 76.6, [(F.ENGINE_PID, 76.0)])))
        ses.metrics(F.grow(base, generation_tokens_total=base.generation_tokens_total + 30.0 * i), mono=t0 + i,
                    max_model_len=32768)
        if "sm_idle" in rules(ses.tick()) and first is None:
            first = i
    assert first is not None and 119 <= first <= 121
    a = next(x for x in ses.tick() if x.rule == "sm_idle")
    assert a.severity == "warning" and a.target == "gpu0"
    assert a.title.startswith("gpu0 busy but SMs idle: GPU-Util 100 %, SM activity 3.0 % for 2m")
    assert f"EngineCore of :8000 (pid {F.ENGINE_PID}, 76.0 GiB)" in " ".join(a.evidence)
    assert any("NCCL" in f for f in a.fix)


def test_sm_idle_needs_gpm() -> None:
    polls = [F.gpu_poll(F.R.BASE + i, F.h200_sample(100.0, None, 76.6)) for i in range(200)]
    assert all(a == [] for a in _gpu_only(polls, Thresholds()))


# --------------------------------------------------------------------------- rule 7: risky launch flags


def _flags_alert(proc, *, facts_log: bool = False, gpu=None) -> Alert | None:
    ses = F.Session(process=proc, log=facts_log)
    if facts_log:
        ses.lines(F.h200_log_until("Maximum concurrency for"))
    if gpu is not None:
        ses.gpu(gpu)
    ses.metrics(F.fixture_metrics("h200-0.26.0-metrics-idle.txt"), mono=F.R.BASE, max_model_len=32768)
    return next((a for a in ses.tick() if a.rule == "risky_flags"), None)


def test_risky_flags_real_cpu_server_has_none() -> None:
    ses = F.Session(process=F.cpu_process(), url="http://127.0.0.1:8011")
    ses.metrics(F.fixture_metrics("cpu-0.32.0-metrics-idle.txt"), mono=F.R.BASE, max_model_len=2048, version="0.32.0")
    assert ses.tick() == []


def test_risky_flags_no_cap_and_the_cap_that_fixes_it() -> None:
    a = _flags_alert(F.h200_process())
    assert a is not None and a.severity == "info"
    assert "--override-generation-config '{\"max_new_tokens\": 4096}'" in a.fix[0]
    capped = F.h200_process(["--override-generation-config", '{"max_new_tokens": 2048}'])
    assert _flags_alert(capped) is None


def test_risky_flags_mm_cache_off() -> None:
    a = _flags_alert(F.h200_process(["--mm-processor-cache-gb", "0",
                                     "--override-generation-config", '{"max_new_tokens": 2048}']))
    assert a is not None and a.severity == "info" and "--mm-processor-cache-gb 0" in a.title


def test_risky_flags_max_num_seqs_far_above_logged_concurrency() -> None:
    cap = ["--override-generation-config", '{"max_new_tokens": 2048}']
    a = _flags_alert(F.h200_process(["--max-num-seqs", "4096", *cap]), facts_log=True)
    assert a is not None and "--max-num-seqs 4096 is 15x" in a.title
    assert "holds 277.82 requests of 32,768 tokens (9,103,456 tokens: 2,223 per sequence" in a.evidence[0]
    assert _flags_alert(F.h200_process(["--max-num-seqs", "1024", *cap]), facts_log=True) is None


def test_risky_flags_gpu_memory_utilization_without_room() -> None:
    cap = ["--override-generation-config", '{"max_new_tokens": 2048}']
    gpu = F.gpu_poll(F.R.BASE, F.h200_sample(10.0, 5.0, 150.0, [(F.ENGINE_PID, 128.4), (OTHER_PID, 20.0)]))
    proc = F.h200_process(["--gpu-memory-utilization", "0.92", *cap])  # the last value wins, as in argparse
    a = _flags_alert(proc, gpu=gpu)
    assert a is not None and a.severity == "warning"
    ev = a.evidence[0]
    assert f"other processes hold 20.0 GiB (pid {OTHER_PID} (20.0 GiB))" in ev and "asks for 129.2 GiB of 140.4 GiB" in ev
    assert "Lower --gpu-memory-utilization to 0.83" in a.fix[0]
    ok = F.h200_process(cap)  # 0.5 x 140.4 + 20 fits
    assert _flags_alert(ok, gpu=gpu) is None


# --------------------------------------------------------------------------- across rules


def test_nothing_fed_nothing_said() -> None:
    d = Diagnoser()
    assert d.update(Evidence(1.0)) == [] and d.alerts == []
    assert d.update(Evidence(2.0, {}, GpuHistory(window_s=60.0))) == []


def test_restart_resets_the_server_state() -> None:
    # The real runaway, then the process restarts (counters back to the idle payload's zeros).
    ses = F.Session(Thresholds(runaway_s=30), process=F.h200_process())
    ticks = F.replay_h200(Thresholds(runaway_s=30), until=190.2, session=ses)
    assert "runaway" in rules(ticks[-1].alerts)
    idle = F.fixture_metrics("h200-0.26.0-metrics-idle.txt")
    for _ in range(1, 60):
        ses.metrics(F.grow(idle, running=1.0), mono=ses.now + 1)
        alerts = ses.tick()
        assert "runaway" not in rules(alerts)
    # one request running but no tokens since the restart: that is a stall now
    assert "engine_stall" in rules(alerts)


def test_diagnose_once_needs_no_history_for_flags_and_fires_no_timed_rule() -> None:
    ses = F.Session(process=F.h200_process())
    ses.metrics(F.fixture_metrics("h200-0.26.0-metrics-runaway.txt"), mono=F.R.BASE, max_model_len=32768)
    out = diagnose_once(Evidence(ses.now, {URL: ses.server_tracker.view()}))
    assert rules(out) == {"risky_flags"}
