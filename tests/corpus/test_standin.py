"""tests/corpus/standin.py: the recorded process tree mirrored by stand-in processes that vtop's
own process scan takes for the server, stopped where the recorded CPU time stood still.

Waits on events (a pid file, a process state), never on how long something took."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from tests.corpus.serve_trace import TraceTimeline
from tests.corpus.standin import STILL_RATE, ProcMirror
from vtop.sources.discovery import discover_servers

TRACE = Path(__file__).resolve().parent / "traces" / "startup-stall-engine-init"

T = TypeVar("T")

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _until(what: Callable[[], T], timeout: float = 60.0) -> T:
    """Poll ``what()`` until it is truthy (a hang guard only: the test fails if it never is)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = what()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError("never happened")


def test_the_recorded_tree_is_mirrored_and_stopped_where_it_stood_still(tmp_path: Path) -> None:
    tl = TraceTimeline(TRACE)
    url = str(tl.truth["server"]["url"])
    log = tmp_path / "vllm.log"
    log.write_bytes(b"")
    m = ProcMirror(TRACE, tl.origin_mono, url.rsplit(":", 1)[1], 45999, log)
    assert m.available
    sab = tl.should_alert_by
    assert sab is not None
    still = sab - 17.0  # the EngineCore SIGSTOPped in engine init, the API server waiting
    tree = m.timeline.tree_at(still)
    engine = next(pid for pid, p in tree.items() if "VLLM::EngineCore" in " ".join(p["cmdline"]))
    assert m.timeline.rate(engine, still) == 0.0
    try:
        def up() -> dict[int, int] | None:
            m.apply(still)
            got = m.pids()
            return got if len(got) == len(tree) else None

        pids = _until(up)
        root = pids[next(pid for pid, p in tree.items() if "serve" in p["cmdline"])]
        assert os.readlink(f"/proc/{root}/fd/1") == str(log)  # it writes the log, as vLLM's API server
        # vtop's own scan: a vLLM server on the played port, its EngineCore below it
        servers = [s for s in discover_servers() if s.port == 45999]
        assert len(servers) == 1 and servers[0].pid == root
        roles = {c.pid: c.role for c in servers[0].children}
        assert roles.get(pids[engine]) == "engine", roles
        _until(lambda: _state(pids[engine]) == "T")  # stopped, as recorded
        # later the EngineCore runs again (SIGCONT in the recording): so does its stand-in
        moving = next(o for o in m.timeline.offs if o > still and (m.timeline.rate(engine, o) or 0) >= STILL_RATE)
        m.apply(moving)
        _until(lambda: _state(pids[engine]) in ("R", "S"))
    finally:
        m.stop()
    for pid in pids.values():
        _until(lambda pid=pid: _state(pid) in (None, "Z"))
    assert not m.dir.exists()


def test_recorded_states_are_mirrored_and_without_a_log_the_server_writes_to_a_pipe(tmp_path: Path) -> None:
    """A trace whose rows carry the processes' ``state`` (issue 49): a still process recorded sleeping
    (S) sleeps, it is not stopped; one recorded in T is. With no log for vtop the stand-in API server's
    stdout is a pipe, as vLLM's under a supervisor (fails on the old mirror: every still process was
    stopped, and the server always wrote the log file)."""
    import gzip
    import json
    import shutil

    trace = tmp_path / "trace"
    shutil.copytree(TRACE, trace)
    tl = TraceTimeline(TRACE)
    sab = tl.should_alert_by
    assert sab is not None
    still = sab - 17.0
    probe = ProcMirror(TRACE, tl.origin_mono, str(tl.truth["server"]["url"]).rsplit(":", 1)[1], 45998, None)
    tree = probe.timeline.tree_at(still)
    probe.stop()
    engine = next(pid for pid, p in tree.items() if "VLLM::EngineCore" in " ".join(p["cmdline"]))
    rows = [json.loads(x) for x in gzip.open(TRACE / "procs.jsonl.gz", "rt") if x.strip()]
    for r in rows:  # the API server sleeps, the EngineCore is stopped
        for p in r.get("procs") or ():
            p["state"] = "T" if p["pid"] == engine else "S"
    with gzip.open(trace / "procs.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    url = str(tl.truth["server"]["url"])
    m = ProcMirror(trace, tl.origin_mono, url.rsplit(":", 1)[1], 45998, None)
    try:
        def up() -> dict[int, int] | None:
            m.apply(still)
            got = m.pids()
            return got if len(got) == len(tree) else None

        pids = _until(up)
        root_rec = next(pid for pid, p in tree.items() if "serve" in p["cmdline"])
        assert m.timeline.rate(root_rec, still) is not None and m.timeline.rate(root_rec, still) < STILL_RATE
        root = pids[root_rec]
        assert os.readlink(f"/proc/{root}/fd/1").startswith("pipe:")
        _until(lambda: _state(pids[engine]) == "T")
        for _ in range(5):  # the still API server, recorded sleeping, is never stopped
            m.apply(still)
            assert _state(root) in ("R", "S"), _state(root)
            time.sleep(0.1)
    finally:
        m.stop()
