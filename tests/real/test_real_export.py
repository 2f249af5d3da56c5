"""``vtop export`` against the real vLLM CPU server, scraped by a real Prometheus (Debian's package).

One server start serves the whole test: ``vtop export`` runs from the launch (``--log`` on the new
log), a Prometheus on loopback scrapes it every second (a generated config, the example rule file
loaded), and

* a query of ``vtop_startup_phase`` over the start walks the phases in vLLM's order to ``ready``;
* a SIGSTOP of the EngineCore while requests run turns ``vtop_alert{rule="engine_stall"}`` to 1 (and
  the example rule ``VtopCritical`` fires in that Prometheus); after SIGCONT it reads 0 again;
* ``promtool check metrics`` is clean on the exposition, during the stall and after.

Nothing is timed: each step waits for what it checks, with a generous hang guard.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from vtop.faces.exporter import PHASES

pytestmark = pytest.mark.real

ROOT = Path(__file__).parents[2]
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def until(what: str, cond: Callable[[], Any], timeout: float, every: float = 0.5) -> Any:
    """Wait for ``cond()`` to be truthy (a hang guard, not a time bound)."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout:.0f} s")
        time.sleep(every)


class Prometheus:
    """A real Prometheus on loopback scraping ``targets`` every second, with ``rule_file`` loaded."""

    def __init__(self, tmp: Path, targets: list[str], rule_file: Path) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        rules = tmp / "vtop-alerts.yml"
        shutil.copy(rule_file, rules)
        cfg = tmp / "prometheus.yml"
        cfg.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            f"rule_files:\n  - {rules}\n"
            "scrape_configs:\n  - job_name: vtop\n    static_configs:\n"
            f"      - targets: [{', '.join(repr(t) for t in targets)}]\n")
        self.log = open(tmp / "prometheus.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [str(PROMETHEUS), f"--config.file={cfg}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}"], stdout=self.log, stderr=subprocess.STDOUT)

    def api(self, path: str, **params: Any) -> Any:
        try:
            r = httpx.get(self.url + path, params=params, timeout=10)
        except httpx.HTTPError:
            return None
        if r.status_code != 200:
            return None
        return r.json()["data"]

    def query(self, q: str) -> list[dict[str, Any]]:
        d = self.api("/api/v1/query", query=q)
        return d["result"] if d else []

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture
def prometheus_for() -> Iterator[Callable[..., Prometheus]]:
    if PROMETHEUS is None or PROMTOOL is None:
        pytest.skip("Debian's prometheus package is not installed (.ci/run installs it)")
    made: list[Prometheus] = []

    def make(*args: Any) -> Prometheus:
        p = Prometheus(*args)
        made.append(p)
        return p

    yield make
    for p in made:
        p.stop()


def check_metrics(text: str) -> None:
    r = subprocess.run([str(PROMTOOL), "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), r.stdout + r.stderr


def running(srv: Any) -> float:
    text = srv.get("/metrics").text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "vllm:num_requests_running")


def test_export_scraped_by_prometheus_walks_a_real_start_and_a_real_stall(  # type: ignore[no-untyped-def]
        real_vllm_fresh_start, prometheus_for, tmp_path: Path) -> None:
    srv = real_vllm_fresh_start
    launched = time.time()
    port = _free_port()
    exp_url = f"http://127.0.0.1:{port}/metrics"
    exp_log = open(tmp_path / "export.log", "w")  # noqa: SIM115 - closed below
    exporter = subprocess.Popen(
        [sys.executable, "-m", "vtop", "export", "--listen", f"127.0.0.1:{port}", srv.url, "--log",
         str(srv.log_path), "--no-gpu", "--interval", "0.5"],
        stdout=exp_log, stderr=subprocess.STDOUT, env={**os.environ, "XDG_CONFIG_HOME": "/nonexistent"})
    try:
        prom = prometheus_for(tmp_path, [f"127.0.0.1:{port}"], ROOT / "examples" / "vtop-alerts.yml")
        healthy_after = srv.wait_health()
        until("Prometheus scraping the exporter's ready",
              lambda: prom.query('vtop_startup_phase{phase="ready"} == 1'), 120)
        # the phases the start went through, as Prometheus stored them (1 s scrapes)
        d = prom.api("/api/v1/query_range", query="vtop_startup_phase == 1", start=launched - 5,
                     end=time.time() + 2, step="1s")  # past the ready sample the instant query saw
        first = sorted((min(float(t) for t, _ in r["values"]), r["metric"]["phase"]) for r in d["result"])
        walk = [ph for _, ph in first]
        print(f"healthy after {healthy_after:.1f} s; phases as Prometheus saw them: "
              + ", ".join(f"{ph} +{t - launched:.1f}s" for t, ph in first))
        assert walk == [p for p in PHASES if p in walk], walk  # in vLLM's order
        assert walk[-1] == "ready" and len(walk) >= 4, walk
        assert "failed" not in walk
        secs = prom.query("max_over_time(vtop_startup_phase_seconds[10m])")
        assert secs and float(secs[0]["value"][1]) > 0
        assert prom.query("vtop_startup_duration_seconds")

        # a real stall: requests running, the EngineCore stopped
        fut = srv.start_load(n=4, concurrency=4, max_tokens=1500)
        try:
            until("requests running", lambda: running(srv) >= 1, 60, every=0.2)
            srv.sigstop_engine()
            try:
                got = until("vtop_alert{rule=\"engine_stall\"} == 1 in Prometheus",
                            lambda: prom.query('vtop_alert{rule="engine_stall"} == 1'), 120)
                assert got[0]["metric"]["severity"] == "critical"
                assert prom.query('vtop_alert_info{rule="engine_stall"}')[0]["metric"]["title"].startswith(
                    "Engine stall")
                # the example rule file pages on it
                until("VtopCritical firing", lambda: prom.query(
                    'ALERTS{alertname="VtopCritical",alertstate="firing",rule="engine_stall"}'), 30)
                check_metrics(httpx.get(exp_url, timeout=10).text)
            finally:
                srv.sigcont_engine()
            until("vtop_alert{rule=\"engine_stall\"} back to 0 in Prometheus",
                  lambda: prom.query('vtop_alert{rule="engine_stall"} == 0'), 120)
            text = httpx.get(exp_url, timeout=10).text
            check_metrics(text)
            after = {(s.name, s.labels.get("rule"), s.labels.get("subject")): s.value
                     for f in text_string_to_metric_families(text) for s in f.samples}
            assert after[("vtop_alert", "engine_stall", srv.url)] == 0.0  # 0 after, not a vanished series
            assert ("vtop_alert_info", "engine_stall", srv.url) not in after
        finally:
            srv.sigcont_engine()
            fut.result(timeout=300)
    finally:
        exporter.send_signal(signal.SIGTERM)
        try:
            rc = exporter.wait(timeout=60)
        finally:
            exp_log.close()
        print((tmp_path / "export.log").read_text()[-2000:])
    assert rc == 0
