"""A real Prometheus (Debian's ``prometheus`` 2.42) for tests and benchmarks, and a DCGM
exporter replay.

:class:`Prometheus` writes a config that scrapes the given targets every ``scrape``
seconds (each target's ``instance`` label rewritten to a name of our choosing, as a fleet's
hosts are named), starts ``prometheus`` on a free loopback port with its TSDB in a
temporary folder, waits for ``/-/ready`` and stops it on exit.

:func:`dcgm_text` writes what NVIDIA's dcgm-exporter serves on ``:9400/metrics``: the
names and help texts of its default counters file (``etc/default-counters.csv``:
DCGM_FI_DEV_GPU_UTIL "GPU utilization (in %)", DCGM_FI_PROF_SM_ACTIVE "The ratio of cycles
an SM has at least 1 warp assigned", DCGM_FI_DEV_FB_USED / _FREE "Framebuffer memory
used / free (in MiB)", DCGM_FI_DEV_POWER_USAGE "Power draw (in W)", DCGM_FI_DEV_XID_ERRORS
"Value of the last XID error encountered"), every series labelled ``gpu``, ``UUID``,
``device``, ``modelName``, ``Hostname`` (and ``DCGM_FI_DRIVER_VERSION`` as 3.x exporters do).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
import zlib
from collections.abc import Sequence
from dataclasses import dataclass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Target:
    job: str
    address: str
    """host:port that Prometheus scrapes"""
    instance: str
    """the ``instance`` label it gets"""


class Prometheus:
    def __init__(self, targets: Sequence[Target], *, scrape: float = 1.0, storage: str | None = None,
                 extra_args: Sequence[str] = ()) -> None:
        self.targets = list(targets)
        self.scrape = scrape
        self.dir = tempfile.mkdtemp(prefix="vtop-prom-")
        self.storage = storage or os.path.join(self.dir, "data")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.extra_args = list(extra_args)
        self.proc: subprocess.Popen[bytes] | None = None

    def config(self) -> str:
        lines = ["global:", f"  scrape_interval: {self.scrape:g}s", f"  scrape_timeout: {min(self.scrape, 10):g}s",
                 "scrape_configs:"]
        jobs: dict[str, list[Target]] = {}
        for t in self.targets:
            jobs.setdefault(t.job, []).append(t)
        for job, ts in jobs.items():
            lines += [f"  - job_name: {job}", "    static_configs:"]
            for t in ts:
                lines += [f"      - targets: ['{t.address}']", f"        labels: {{vtop_instance: '{t.instance}'}}"]
            lines += ["    relabel_configs:", "      - source_labels: [vtop_instance]", "        target_label: instance",
                      "      - regex: vtop_instance", "        action: labeldrop"]
        return "\n".join(lines) + "\n"

    def __enter__(self) -> Prometheus:
        exe = shutil.which("prometheus")
        if exe is None:
            raise RuntimeError("prometheus is not installed (apt-get install prometheus)")
        cfg = os.path.join(self.dir, "prometheus.yml")
        with open(cfg, "w") as f:
            f.write(self.config())
        self.log = open(os.path.join(self.dir, "prometheus.log"), "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [exe, f"--config.file={cfg}", f"--storage.tsdb.path={self.storage}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1d",
             *self.extra_args], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited: {self.tail()}")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.2)
        self.__exit__()
        raise RuntimeError(f"prometheus not ready within 120 s: {self.tail()}")

    def tail(self) -> str:
        try:
            with open(os.path.join(self.dir, "prometheus.log"), "rb") as f:
                return f.read()[-2000:].decode("utf-8", "replace")
        except OSError:
            return ""

    def wait_for(self, promql: str, n: int = 1, timeout: float = 60.0) -> list[dict]:
        """Wait until ``promql`` returns at least ``n`` series; returns them."""
        import json
        from urllib.parse import urlencode

        deadline = time.monotonic() + timeout
        got: list[dict] = []
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/api/v1/query?{urlencode({'query': promql})}", timeout=5) as r:
                    got = json.loads(r.read())["data"]["result"]
                if len(got) >= n:
                    return got
            except OSError:
                pass
            time.sleep(0.3)
        raise TimeoutError(f"{promql!r}: {len(got)} series after {timeout} s, wanted {n}")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if getattr(self, "log", None):
            self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


_DCGM_HELP = (
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."),
    ("DCGM_FI_PROF_SM_ACTIVE", "The ratio of cycles an SM has at least 1 warp assigned (in %)."),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)."),
    ("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered."),
)


def dcgm_text(host: str, *, gpus: int = 8, util: Sequence[float] | float = 50.0, sm: float = 0.4,
              fb_used: float = 120_000.0, fb_total: float = 143_771.0, power: float = 420.0,
              xid: dict[int, int] | None = None, model: str = "NVIDIA H200") -> str:
    """One scrape of a dcgm-exporter on ``host`` with ``gpus`` GPUs."""
    utils = [float(util)] * gpus if isinstance(util, (int, float)) else [float(u) for u in util]
    xid = xid or {}
    out: list[str] = []
    for name, help_text in _DCGM_HELP:
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} gauge")
        for i in range(gpus):
            v = {"DCGM_FI_DEV_GPU_UTIL": utils[i], "DCGM_FI_PROF_SM_ACTIVE": sm, "DCGM_FI_DEV_FB_USED": fb_used,
                 "DCGM_FI_DEV_FB_FREE": fb_total - fb_used, "DCGM_FI_DEV_POWER_USAGE": power,
                 "DCGM_FI_DEV_XID_ERRORS": float(xid.get(i, 0))}[name]
            uuid = f"GPU-{zlib.crc32(host.encode()):08x}-0000-0000-0000-{i:012d}"
            out.append(f'{name}{{gpu="{i}",UUID="{uuid}",device="nvidia{i}",modelName="{model}",'
                       f'Hostname="{host}",DCGM_FI_DRIVER_VERSION="550.54.15"}} {v:g}')
    return "\n".join(out) + "\n"
