"""Issue 39: two real vLLM 0.26.0 servers on ONE GPU, recorded by vtop itself on a lent NVIDIA H100 80GB HBM3
(session 25, ``VTOP_TWO_BUDGET_S=360 bash tools/device/h200_two_servers.sh``: the script runs on either card;
tests/fixtures/h100-two-servers/README.md says what was run). vtop's recording is replayed through the monitor
every face reads (and, for what the screen shows, through the app as tools/make_screenshots.py does), and what
it showed is checked against the driver's own timeline (``events.jsonl``: launches, health, the engines' pids,
load, the runaway on :8000, :8001's EngineCore SIGSTOPped with 4 requests sent to it, SIGCONT, the stops) and
against ``nvidia-smi.txt`` taken on the machine while both were up. Nothing here is a hard-coded result: every
pid, port, time and memory is read from those files."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FIXTURES
from vtop.config import Config
from vtop.core.rules import Thresholds

FIX = FIXTURES / "h100-two-servers"
REC = FIX / "rec.jsonl.gz"
A, B = "http://127.0.0.1:8000", "http://127.0.0.1:8001"
MIB = 2**20


def _events() -> list[dict[str, Any]]:
    return [json.loads(x) for x in (FIX / "events.jsonl").read_text().splitlines() if x.strip()]


def ev(name: str, port: int | None = None) -> dict[str, Any]:
    """The driver's first event ``name`` (on ``port``)."""
    return next(e for e in _events() if e["ev"] == name and (port is None or e.get("port") == port))


def smi_mib() -> dict[int, int]:
    """pid -> MiB of the GPU processes nvidia-smi listed on the machine while both servers were up."""
    return {int(m.group(1)): int(m.group(2)) for m in
            re.finditer(r"^\|\s+0\s+N/A\s+N/A\s+(\d+)\s+C\s+\S+\s+(\d+)MiB", (FIX / "nvidia-smi.txt").read_text(), re.M)}


def engines() -> dict[str, int]:
    """url -> the EngineCore pid the driver found under each API server."""
    pids = ev("engines")["pids"]
    return {A: int(pids["8000"]), B: int(pids["8001"])}


def secs(text: str) -> float:
    """``46s`` / ``1m 05s`` as seconds."""
    m = re.fullmatch(r"(?:(\d+)m\s*)?(\d+)s", text.strip())
    assert m, text
    return 60.0 * int(m.group(1) or 0) + int(m.group(2))


@pytest.fixture(scope="module")
def played() -> dict[str, Any]:
    """The whole recording, a poll round at a time: what the monitor held at each (wall time, alerts with
    their identity, GPU 0's processes with their owners, each server's state, process and GPUs)."""
    from vtop.monitor.player import open_recording

    player = open_recording(str(REC), config=Config())
    m = player.monitor
    ticks: list[dict[str, Any]] = []
    scans: list[float] = []  # wall times of the recorded process scans
    while not player.ended:
        player.step()
        poll = m.gpu_history.last_poll
        g0 = next((g for g in poll.gpus if g.index == 0), None) if poll is not None else None
        ticks.append({
            "t": m.clock.time(),
            "alerts": [(a.rule, a.target, a.severity, a.since, a.title, a.evidence) for a in m.alerts],
            "gpu0": {int(p.pid): (m.gpu_owner.get(p.pid), p.used_bytes) for p in (g0.procs or ())} if g0 else {},
            "servers": {url: (ws.last_view.state if ws.last_view else None,
                              ws.process.pid if ws.process else None,
                              ws.process.port if ws.process else None,
                              set(ws.process.gpu_pids) if ws.process else set(),
                              m.server_gpus(url)) for url, ws in m.servers.items()},
        })
    from vtop.sources.recording.record import load

    scans = [e.t for e in load(REC)[1] if e.kind == "procs"]
    return {"ticks": ticks, "monitor": m, "scans": scans}


def up(played: dict[str, Any], rule: str, target: str) -> list[dict[str, Any]]:
    """The ticks at which ``rule``'s alert on ``target`` was up, each with that alert."""
    out = []
    for tk in played["ticks"]:
        a = next((a for a in tk["alerts"] if a[0] == rule and a[1] == target), None)
        if a is not None:
            out.append({**tk, "a": a})
    return out


# --------------------------------------------------------------------------- the recording itself


def test_the_recording_is_the_h100_run_the_driver_timed() -> None:
    from vtop.sources.recording.record import load

    header, events = load(REC)
    assert header.get("mode") == "once"  # vtop --once --window ... --record, started before the first launch
    names = {g.name for e in events if e.kind == "gpu" for g in e.data.gpus}
    assert names == {"NVIDIA H100 80GB HBM3"}, names
    assert "NVIDIA H100 80GB HBM3" in (FIX / "nvidia-smi.txt").read_text()
    assert set(smi_mib()) == set(engines().values())  # nvidia-smi saw the two EngineCores the driver named
    assert events[0].t < ev("vllm_launch", 8000)["t"] and events[-1].t > ev("vllm_stopped", 8001)["t"]


# --------------------------------------------------------------------------- both servers, apart, on GPU 0


def test_the_gpu_card_lists_both_engine_cores_apart_with_their_own_memory(played: dict[str, Any]) -> None:
    """From both ready to the SIGSTOP, GPU 0 holds exactly the two EngineCores the driver named, each owned
    by its own server, each with the memory nvidia-smi gave it (within 1 %), and each server card's GPU
    memory is its own engine's, not the GPU's."""
    eng, smi = engines(), smi_mib()
    a, b = ev("health_ready", 8001)["t"] + 5.0, ev("sigstop", 8001)["t"]
    both = [tk for tk in played["ticks"] if a <= tk["t"] <= b]
    assert len(both) > 30, len(both)
    for tk in both:
        owners = {pid: o for pid, (o, _) in tk["gpu0"].items()}
        assert owners == {eng[A]: "EngineCore of :8000", eng[B]: "EngineCore of :8001"}, (tk["t"], owners)
        for url in (A, B):
            held = tk["gpu0"][eng[url]][1]
            assert held is not None and abs(held / MIB - smi[eng[url]]) <= 0.01 * smi[eng[url]], (url, held)
            assert tk["servers"][url][4] == [(0, held)], (url, tk["servers"][url])
    total = played["monitor"].gpu_history.tracks[0].last.mem_total
    for url in (A, B):  # --gpu-memory-utilization 0.4 each: a bit over 0.4 of the GPU with the CUDA context
        assert 0.38 * total < smi[eng[url]] * MIB < 0.45 * total


def test_each_server_is_its_own_process_on_its_own_port(played: dict[str, Any]) -> None:
    eng = engines()
    tk = next(tk for tk in played["ticks"] if tk["t"] > ev("health_ready", 8001)["t"] + 5.0)
    for url, port in ((A, 8000), (B, 8001)):
        state, pid, p, gpu_pids, _ = tk["servers"][url]
        assert (state, pid, p) == ("up", ev("vllm_launch", port)["pid"], port), (url, tk["servers"][url])
        assert gpu_pids == {eng[url]}, (url, gpu_pids)


# --------------------------------------------------------------------------- the incidents, told apart


def test_the_runaway_is_named_on_8000_only_in_time(played: dict[str, Any]) -> None:
    """Named once the request is known 45 s old (runaway_age_s, from the kernel's counters: request logging
    is off), never before the runaway began (the load of 2,584 requests is no runaway), never on :8001."""
    on_a = up(played, "runaway", A)
    assert on_a, "no runaway alert on :8000"
    begin = ev("runaway_begin", 8000)["t"]
    after = on_a[0]["t"] - begin
    th = Thresholds()
    assert th.runaway_age_s <= after <= th.runaway_age_s + 10.0, after  # one connections read (10 s) at most
    assert not up(played, "runaway", B)


def test_the_stall_is_named_on_8001_only_naming_its_engine(played: dict[str, Any]) -> None:
    """:8001's EngineCore SIGSTOPped with 4 requests sent to it: its /metrics said 0 running throughout (the
    gauges froze with the engine), so only the process table tells: named at the second process scan that
    saw it stopped (the recording's scans came 30 s apart then), before the SIGCONT, naming the pid the
    driver stopped. Before issue 39's fix vtop named nothing on this recording."""
    on_b = up(played, "engine_stall", B)
    assert on_b, "no engine_stall alert on :8001"
    stop, cont = ev("sigstop", 8001), ev("sigcont", 8001)
    scans = [t for t in played["scans"] if t > stop["t"]]
    assert scans[1] <= on_b[0]["t"] <= scans[1] + 1.5 and on_b[0]["t"] < cont["t"], (on_b[0]["t"], scans[:2])
    assert f"(pid {stop['pid']}) stopped (state T)" in on_b[0]["a"][4], on_b[0]["a"][4]
    assert on_b[0]["a"][2] == "critical"
    assert not up(played, "engine_stall", A)


def test_no_other_alarm_on_either_server(played: dict[str, Any]) -> None:
    seen = {(a[0], a[1]) for tk in played["ticks"] for a in tk["alerts"] if a[2] != "info"}
    assert seen == {("runaway", A), ("engine_stall", B)}, seen


def test_each_alert_keeps_its_identity_while_it_lasts(played: dict[str, Any]) -> None:
    """One stretch each, with one start and one severity, however its title's numbers move."""
    ticks = [tk["t"] for tk in played["ticks"]]
    for rule, target, sev in (("runaway", A, "warning"), ("engine_stall", B, "critical")):
        on = up(played, rule, target)
        i0, i1 = ticks.index(on[0]["t"]), ticks.index(on[-1]["t"])
        assert len(on) == i1 - i0 + 1, (rule, "not one stretch")
        assert len({x["a"][3] for x in on}) == 1, (rule, "its start moved")
        assert {x["a"][2] for x in on} == {sev}, rule
        assert len({x["a"][4] for x in on}) > 1  # the titles did move (the age, the rate): the identity held


def test_they_clear_after_and_nothing_runs_once_both_stopped(played: dict[str, Any]) -> None:
    run, stall = up(played, "runaway", A), up(played, "engine_stall", B)
    end, cont = ev("runaway_end", 8000)["t"], ev("sigcont", 8001)["t"]
    nxt = next(tk["t"] for tk in played["ticks"] if tk["t"] > run[-1]["t"])
    assert end <= nxt <= end + 5.0, (end, nxt)
    first_scan = next(t for t in played["scans"] if t > cont)
    nxt = next(tk["t"] for tk in played["ticks"] if tk["t"] > stall[-1]["t"])
    assert cont <= nxt <= first_scan + 1.5, (cont, nxt, first_scan)
    last = played["ticks"][-1]
    assert last["t"] > ev("vllm_stopped", 8001)["t"] + 5.0
    assert not last["alerts"] and not last["gpu0"]
    assert {url: s[:2] for url, s in last["servers"].items()} == {A: ("down", None), B: ("down", None)}


# --------------------------------------------------------------------------- no number says another wrong


def test_the_stall_does_not_read_the_other_servers_gpu_work_as_its_own(played: dict[str, Any]) -> None:
    """GPU 0 ran :8000's runaway while :8001's engine was stopped: its GPU-Util is :8000's. The stall's
    evidence says the GPU is shared, gives the stopped engine's own share of the SMs (NVML per process),
    and reads nothing from the GPU's busyness (no "launches no GPU work", no NCCL)."""
    evidence = "\n".join(up(played, "engine_stall", B)[0]["a"][5])
    assert "shared with :8000" in evidence and "own share of the SMs 0 %" in evidence, evidence
    assert "NCCL" not in evidence and "launches no GPU work" not in evidence, evidence


def test_no_runaway_line_bounds_the_request_below_its_known_age(played: dict[str, Any]) -> None:
    """The runaway shared :8000 with short requests: 1,039 tok/s was the server's rate, not the request's.
    Read as the request's, it said "up to 32s" of a request known 46 s old."""
    for x in up(played, "runaway", A):
        age = secs(re.search(r"running at least ((?:\d+m )?\d+s)", x["a"][4]).group(1))  # type: ignore[union-attr]
        for line in x["a"][5]:
            m = re.search(r"that is up to ((?:\d+m )?\d+s)", line)
            assert m is None or secs(m.group(1)) >= age, (x["a"][4], line)


def test_the_start_of_8000_lasts_what_the_driver_timed(played: dict[str, Any]) -> None:
    """vtop found :8000's log itself: the start counts from the process's launch (the recording lost that mark;
    its first log line came 22 s after the launch and the replay said "ready in 1 min 03 s")."""
    snap = played["monitor"].log_view.snapshot
    assert snap.total_s is not None and abs(snap.total_s - ev("health_ready", 8000)["after_s"]) <= 2.0, snap.total_s


# --------------------------------------------------------------------------- the screen


def _both_alerts(app: Any) -> bool:
    rules = {(a.rule, a.target) for a in app.monitor.alerts}
    return {("runaway", A), ("engine_stall", B)} <= rules


def _load(app: Any) -> bool:
    ws = app.monitor.servers.get(A)
    v = ws.last_view if ws is not None else None
    return v is not None and v.metrics is not None and (v.metrics.running or 0) >= 16


async def _screen(tmp_path: Path, until: Any, size: tuple[int, int]) -> list[str]:
    from tests.helpers.screen_text import svg_lines
    from tools.make_screenshots import replay_until

    assert await replay_until(REC, "s.svg", size, until, out=tmp_path)
    return svg_lines((tmp_path / "s.svg").read_text())


async def test_the_80x24_screen_tells_each_server_its_gpu_and_its_incident(tmp_path: Path) -> None:
    """What an on-call engineer sees at 80x24 while both are named: the GPU's line names the card (not
    "H100 8"), each server card its pid and what it holds on gpu0, the stall its stopped engine's pid."""
    lines = await _screen(tmp_path, _both_alerts, (80, 24))
    text = "\n".join(lines)
    eng, smi = engines(), smi_mib()
    assert any(ln.startswith("0 H100   util") for ln in lines), text
    for url, port in ((A, 8000), (B, 8001)):
        gib = f"{smi[eng[url]] * MIB / 2**30:.1f} GiB"
        assert f"vLLM {url} · UP · pid {ev('vllm_launch', port)['pid']} · gpu0 {gib}" in text, (url, gib, text)
    assert f"Engine stalled on :8001: VLLM::EngineCore (pid {eng[B]}) stopped" in text, text
    assert "Runaway decode on :8000" in text and "Runaway decode on :8001" not in text


async def test_the_gpu_card_names_both_engine_cores_during_the_load(tmp_path: Path) -> None:
    lines = await _screen(tmp_path, _load, (120, 40))
    eng, smi = engines(), smi_mib()
    sub = next((ln for ln in lines if "EngineCore of" in ln), "")  # the GPU card's bottom border
    for url, port in ((A, 8000), (B, 8001)):
        assert f"EngineCore of :{port} {eng[url]} {smi[eng[url]] * MIB / 2**30:.1f} GiB" in sub, "\n".join(lines)
    assert sub.count("EngineCore of") == 2, sub
