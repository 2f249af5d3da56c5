"""``vtop export``: vtop's own signals as Prometheus metrics.

Fed from the real H200 recording (``vtop demo``'s: a vLLM 0.26.0 start through torch.compile and
CUDA graph capture, a burst, a runaway request without max_tokens) through the same monitor as the
screen; the exposition is checked by Debian's ``promtool check metrics``, the example rule file by
``promtool check rules`` and ``promtool test rules``; the command itself is run as a user runs it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from tests.helpers.metrics_server import MetricsServer, h200_payloads
from vtop.clock import FakeClock
from vtop.config import Config
from vtop.faces.demo import demo_path
from vtop.faces.exporter import PHASES, ExportState, MonitorCollector, families, parse_listen
from vtop.model.gpu import OK, GpuPoll, GpuSample
from vtop.monitor.monitor import Monitor
from vtop.monitor.player import open_recording

ROOT = Path(__file__).parents[2]
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed (Debian's prometheus package; .ci/run installs it)")
ENV = {**os.environ, "XDG_CONFIG_HOME": "/nonexistent"}


def samples(fams: list) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:  # type: ignore[type-arg]
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in fams for s in f.samples}


def one(fams: list, name: str, **labels: str) -> float | None:  # type: ignore[type-arg]
    got = [s.value for f in fams for s in f.samples
           if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(got) <= 1, (name, labels, got)
    return got[0] if got else None


@pytest.fixture(scope="module")
def demo():  # type: ignore[no-untyped-def]
    return open_recording(str(demo_path()), config=Config())


def exposition(monitor: Monitor, state: ExportState | None = None) -> str:
    reg = CollectorRegistry(auto_describe=False)
    col = MonitorCollector(monitor)
    if state is not None:
        col.state = state
    reg.register(col)
    return generate_latest(reg).decode()


def test_a_real_start_walks_its_phases_to_ready_with_progress_and_times() -> None:
    p = open_recording(str(demo_path()), config=Config())
    server = p.urls[0]
    seen: list[str] = []
    ratios: dict[str, list[float]] = {}
    secs_while_starting = []
    while p.pos < p.start + 120:
        p.feed_until(p.pos + 1.0)
        fams = families(p.monitor)
        on = [s.labels["phase"] for f in fams for s in f.samples
              if s.name == "vtop_startup_phase" and s.value == 1.0]
        assert len(on) <= 1
        if not on:
            continue
        cur = on[0]
        assert one(fams, "vtop_startup_phase", server=server, phase=cur) == 1.0
        if not seen or seen[-1] != cur:
            seen.append(cur)
        r = one(fams, "vtop_startup_progress_ratio", server=server)
        if r is not None:
            ratios.setdefault(cur, []).append(r)
        secs = one(fams, "vtop_startup_phase_seconds", server=server)
        if cur == "ready":
            assert secs is None and r is None  # nothing is in progress once ready
            total = one(fams, "vtop_startup_duration_seconds", server=server)
            assert total is not None and 60 < total < 120  # the demo's start: ready after 91 s
        else:
            assert secs is not None and secs >= 0
            secs_while_starting.append(secs)
            assert one(fams, "vtop_startup_duration_seconds", server=server) is None
    # in vLLM's order, ending ready, through the phases the H200 start went through
    order = [p for p in PHASES if p in seen]
    assert seen == order, seen
    assert seen[-1] == "ready" and {"torch_compile", "cuda_graphs"} <= set(seen), seen
    assert ratios.get("cuda_graphs") and all(0 <= x <= 1 for x in ratios["cuda_graphs"])
    assert any(0 < x < 1 for x in ratios["cuda_graphs"])  # caught mid-capture (32/51 on this recording)
    assert max(secs_while_starting) > 5


def test_the_runaway_is_an_alert_with_its_title_and_the_request_ages(demo) -> None:  # type: ignore[no-untyped-def]
    server = demo.urls[0]
    runaway_at = dict(demo.chapters)["runaway"]
    state = ExportState()
    demo.feed_until(runaway_at + 10)
    fams = families(demo.monitor, state)
    rules = {s.labels["rule"]: s.labels["severity"] for f in fams for s in f.samples
             if s.name == "vtop_alert" and s.value == 1.0}
    assert "runaway" in rules, rules
    key = {"subject": server, "rule": "runaway", "severity": rules["runaway"]}
    title = next(s.labels["title"] for f in fams for s in f.samples if s.name == "vtop_alert_info"
                 and all(s.labels[k] == v for k, v in key.items()))
    assert title.startswith("Runaway decode on :8000")
    ages = [(s.labels["source"], s.value) for f in fams for s in f.samples
            if s.name == "vtop_oldest_request_age_seconds" and s.labels["server"] == server]
    # one answer: the oldest request's lower bound, labelled by what proves it, as every face names it
    o = demo.monitor.requests_of(server).oldest
    assert o is not None and ages == [(o.evidence[0], o.age_min_s)] and ages[0][1] > 45, (ages, o)
    # the max_tokens vLLM filled in for a request sent without it (max_model_len 131,072 minus the prompt)
    assert one(fams, "vtop_request_allowance_tokens", server=server) == 130917
    # the title holds while the alert is on, though its numbers move on the screen
    demo.feed_until(demo.pos + 5)
    fams2 = families(demo.monitor, state)
    assert title in {s.labels.get("title") for f in fams2 for s in f.samples if s.name == "vtop_alert_info"}
    # the incident ends: the alert reads 0 (not a vanished series) and its title goes
    demo.feed_until(dict(demo.chapters)["end"] + 5)
    fams3 = families(demo.monitor, state)
    assert one(fams3, "vtop_alert", **key) == 0.0
    assert one(fams3, "vtop_alert_info", **key) is None
    assert not [s for f in fams3 for s in f.samples
                if s.name == "vtop_oldest_request_age_seconds" and s.labels["server"] == server]


def test_gpu_fields_in_base_units_and_gaps_stay_absent() -> None:
    clock = FakeClock()
    m = Monitor(Config(), clock=clock, live=False)
    full = GpuSample(0, "NVIDIA H200", uuid="GPU-a", util_gpu=17.0, util_mem=3.0, mem_used=2**30, mem_total=2**37,
                     power_w=130.5, power_limit_w=700.0, temp_c=43.0, sm_clock_mhz=1980.0, mem_clock_mhz=3201.0,
                     throttle=("sw-power-cap",), sm_active=0.1, sm_occupancy=0.05, dram_bw=4.0)
    gappy = GpuSample(1, "NVIDIA H200", uuid="GPU-b", util_gpu=None, mem_used=None, mem_total=2**37)
    lost = GpuSample(2, "NVIDIA H200", uuid="GPU-c", lost=True)
    m.apply_gpu(GpuPoll(t=clock.time(), mono=clock.monotonic(), status=OK, gpus=(full, gappy, lost)))
    fams = families(m)
    assert one(fams, "vtop_gpu_sm_active_ratio", gpu="0", uuid="GPU-a") == pytest.approx(0.001)
    assert one(fams, "vtop_gpu_utilization_ratio", gpu="0") == pytest.approx(0.17)
    assert one(fams, "vtop_gpu_memory_used_bytes", gpu="0") == 2**30
    assert one(fams, "vtop_gpu_sm_clock_hertz", gpu="0") == 1.98e9
    assert one(fams, "vtop_gpu_throttle", gpu="0", reason="sw-power-cap") == 1.0
    assert one(fams, "vtop_gpu_throttle", gpu="0", reason="hw-thermal") == 0.0
    # what NVML did not give is absent, never 0
    for name in ("vtop_gpu_utilization_ratio", "vtop_gpu_memory_used_bytes", "vtop_gpu_sm_active_ratio",
                 "vtop_gpu_temperature_celsius"):
        assert one(fams, name, gpu="1") is None, name
    assert one(fams, "vtop_gpu_throttle", gpu="1", reason="idle") is None
    assert one(fams, "vtop_gpu_memory_total_bytes", gpu="1") == 2**37
    assert one(fams, "vtop_gpu_lost", gpu="2") == 1.0 and one(fams, "vtop_gpu_temperature_celsius", gpu="2") is None
    # no server, no log: none of their samples, no zeros
    names = {s.name for f in fams for s in f.samples}
    assert not {n for n in names if n.startswith(("vtop_startup", "vtop_oldest", "vtop_request", "vtop_server"))}
    # NVML stops answering (a hung call): the old readings are not served as if current; their age is
    clock.advance(10.0)
    fams = families(m)
    assert {s.name for f in fams for s in f.samples if s.name.startswith("vtop_gpu")} == {
        "vtop_gpu_readings_age_seconds", "vtop_gpu_readings_stale_after_seconds"}
    assert one(fams, "vtop_gpu_readings_age_seconds") == 10.0


@needs_promtool
def test_the_exposition_passes_promtool_check_metrics(demo) -> None:  # type: ignore[no-untyped-def]
    state = ExportState()
    for at in (dict(demo.chapters)["runaway"] + 10, dict(demo.chapters)["end"] + 5):
        demo.feed_until(at)
        text = exposition(demo.monitor, state)
        assert "vtop_alert{" in text and "vtop_gpu_sm_active_ratio{" in text
        r = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), r.stdout + r.stderr
        parsed = {f.name for f in text_string_to_metric_families(text)}
        assert {"vtop_alert", "vtop_alert_info", "vtop_server_polls", "vtop_startup_phase"} <= parsed


@needs_promtool
def test_the_example_rules_check_and_page_on_a_critical_vtop_alert() -> None:
    rules = ROOT / "examples" / "vtop-alerts.yml"
    r = subprocess.run([PROMTOOL, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr
    assert 'vtop_alert{severity="critical"}' in rules.read_text()
    # promtool's rule unit tests: the page fires while vtop says critical, with vtop's title, and stops after
    r = subprocess.run([PROMTOOL, "test", "rules", "vtop-alerts.test.yml"], cwd=rules.parent, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


def test_listen_specs() -> None:
    assert parse_listen("127.0.0.1:9400") == ("127.0.0.1", 9400)
    assert parse_listen("[::1]:0") == ("::1", 0)
    assert parse_listen(":9400") == ("127.0.0.1", 9400)
    for bad in ("9400", "host:", "h:99999", "h:x"):
        with pytest.raises(ValueError, match="--listen"):
            parse_listen(bad)


def test_vtop_export_serves_a_live_server_and_gpus_and_stops_on_sigterm() -> None:
    with MetricsServer(h200_payloads(100, 30)) as srv:
        proc = subprocess.Popen([sys.executable, "-m", "vtop", "export", "--listen", "127.0.0.1:0", srv.url,
                                 "--simulate-gpus", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=ENV)
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()  # blocks until it serves (the test's timeout guards a hang)
            assert line.startswith("vtop export: serving http://127.0.0.1:"), line + (proc.stderr.read() if proc.stderr else "")
            url = line.split()[3]
            text = ""
            # waits for the first scrape of the server and the first NVML poll, however slow the box
            while 'state="up"} 1.0' not in text or "vtop_gpu_power_watts{" not in text:
                time.sleep(0.1)
                text = urllib.request.urlopen(url, timeout=30).read().decode()
                assert proc.poll() is None
            fams = list(text_string_to_metric_families(text))
            assert one(fams, "vtop_server_state", server=srv.url, state="up") == 1.0
            assert one(fams, "vtop_gpu_power_watts", gpu="1") is not None
            assert (one(fams, "vtop_server_polls_total", server=srv.url) or 0) >= 1
        finally:
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(timeout=60)
        assert rc == 0, proc.stderr.read() if proc.stderr else ""


def test_a_bad_listen_or_a_taken_port_is_one_line_and_exit_3() -> None:
    r = subprocess.run([sys.executable, "-m", "vtop", "export", "--listen", "nope", "--no-gpu"], capture_output=True,
                       text=True, timeout=60, env=ENV)
    assert r.returncode == 3 and "Traceback" not in r.stderr
    assert "vtop export: error: --listen: expected HOST:PORT" in r.stderr
    with MetricsServer(h200_payloads(0, 1)) as srv:  # a port that is taken
        port = srv.url.rsplit(":", 1)[1]
        r = subprocess.run([sys.executable, "-m", "vtop", "export", "--listen", f"127.0.0.1:{port}", "--no-gpu"],
                           capture_output=True, text=True, timeout=60, env=ENV)
    assert r.returncode == 3 and "Traceback" not in r.stderr, r.stderr
    assert f"cannot serve on 127.0.0.1:{port}: Address already in use" in r.stderr


def test_the_connection_age_is_exported_while_the_runaway_streams() -> None:
    """The H200 runaway with request logging off (tests/corpus/traces/h200-runaway-short-traffic-2): no
    ``source="log"`` age, but the answer streaming on its own connection gives ``source="connection"``."""
    import json

    from vtop.monitor.player import open_recording

    trace = Path(__file__).resolve().parents[1] / "corpus" / "traces" / "h200-runaway-short-traffic-2"
    ev = {}
    for line in (trace / "events.jsonl").read_text().splitlines():
        d = json.loads(line)
        ev.setdefault(d["what"], float(d["t"]))
    p = open_recording(str(trace), config=Config())
    off = next(e.t - e.mono for e in p.events if e.kind == "server")
    p.feed_until(ev["runaway_begin"] + 40 - off)
    fams = families(p.monitor)
    server = "http://127.0.0.1:8000"
    age = one(fams, "vtop_oldest_request_age_seconds", server=server, source="connection")
    assert age is not None and 38 <= age <= 42, age
    assert one(fams, "vtop_oldest_request_age_seconds", server=server, source="log") is None
    p.feed_until(ev["runaway_end"] + 8 - off)
    assert one(families(p.monitor), "vtop_oldest_request_age_seconds", server=server, source="connection") is None


def test_the_engine_is_an_info_series_per_server(demo) -> None:  # type: ignore[no-untyped-def]
    """vtop_server_info{server,engine}: the demo recording's server is vLLM (its command line and its vllm:
    families)."""
    demo.feed_until(demo.start + 30.0)
    fams = list(text_string_to_metric_families(exposition(demo.monitor)))
    url = next(iter(demo.monitor.servers))
    assert one(fams, "vtop_server_info", server=url, engine="vllm") == 1.0
    assert one(fams, "vtop_server_info", server=url, engine="sglang") is None


def test_vtop_export_says_sglang_for_a_server_serving_sglangs_families() -> None:
    """A stand-in serving the hand-made SGLang 0.5.17 payload (tests/fixtures/sglang/): no process on this box,
    so the engine comes from the /metrics families, as --once --json's."""
    payload = (ROOT / "tests" / "fixtures" / "sglang" / "metrics-0.5.17-handmade.txt").read_text()
    with MetricsServer([payload], model="tiny") as srv:
        proc = subprocess.Popen([sys.executable, "-m", "vtop", "export", "--listen", "127.0.0.1:0", srv.url,
                                 "--simulate-gpus", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=ENV)
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.startswith("vtop export: serving http://127.0.0.1:"), line
            url = line.split()[3]
            text = ""
            while "vtop_server_info{" not in text:  # the first scrape, however slow the box
                time.sleep(0.1)
                text = urllib.request.urlopen(url, timeout=30).read().decode()
                assert proc.poll() is None
            fams = list(text_string_to_metric_families(text))
            assert one(fams, "vtop_server_info", server=srv.url, engine="sglang") == 1.0
            assert one(fams, "vtop_server_info", server=srv.url, engine="vllm") is None
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
