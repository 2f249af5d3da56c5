"""Issue 40, a start against its own history: each phase's time kept per model, flags and vLLM version
(vtop/core/start_history.py), the file (vtop/sources/start_history.py: 0600, atomic, a bad file a line and
ignored), the compile cache's hit or miss from the log, and the stall threshold of a silent phase that
follows the history (vtop/core/rules/startup.py), on an injected clock. The log lines are real: the CPU
start of vLLM 0.32.0 (tests/fixtures/logs/vllm-0.32.0-cpu-startup.log) and the start of
tests/corpus/traces/startup-stall-compile up to the moment its Worker was stopped in torch.compile."""

from __future__ import annotations

import gzip
import json
import os
import stat
from pathlib import Path

import pytest

from tests.helpers import diag_fixtures as F
from vtop.core.phases import Phase, PhaseTracker
from vtop.core.rules import Alert, Thresholds
from vtop.core.start_history import (
    MAX_KEYS,
    MAX_PER_KEY,
    PastStart,
    StartHistory,
    StartKey,
    history_from,
    history_stall_s,
    key_of,
    past_of,
)
from vtop.sources.statefile import history_path, load_json, save_json


def load(path: Path) -> tuple[StartHistory, str | None]:
    """What the monitor does with the file: its JSON, then the history in it."""
    data, problem = load_json(path)
    h, bad = history_from(data, str(path))
    return h, problem or bad


def save(path: Path, h: StartHistory) -> str | None:
    return save_json(path, h.to_json())

ROOT = Path(__file__).resolve().parents[1]
CPU_LOG = ROOT / "fixtures" / "logs" / "vllm-0.32.0-cpu-startup.log"
TRACE = ROOT / "corpus" / "traces" / "startup-stall-compile"
SIGSTOP_LOG_BYTES = 9310  # its events.jsonl: log_size_at_sigstop
KEY = StartKey("/tmp/tinyllama", "0.32.0", 1, 1, False, 2048)


def _tracker(lines: list[str]) -> PhaseTracker:
    tr = PhaseTracker(year=2026)
    for i, ln in enumerate(lines):
        tr.feed(ln, 1000.0 + i * 0.01)
    return tr


def _cpu_start() -> list[str]:
    return [ln for ln in CPU_LOG.read_text().splitlines() if not ln.startswith("#")]


def _past(started: float, compile_s: float, cached: bool | None = None) -> PastStart:
    return PastStart(started, {Phase.PROCESS_START: 7.0, Phase.TORCH_COMPILE: compile_s, Phase.WEIGHTS: 1.0}, cached)


# --------------------------------------------------------------------------- the core


def test_a_real_ready_start_gives_its_phases_its_key_and_a_compile_cache_miss() -> None:
    snap = _tracker(_cpu_start()).snapshot()
    assert snap.state == "ready"
    got = past_of(snap)
    assert got is not None
    key, past = got
    assert key.model == "/tmp/tinyllama" and key.version == "0.32.0"
    # "Warming up model for the compilation..." 09:35:21 to "saved AOT compiled function" 09:35:38
    assert past.phases[Phase.TORCH_COMPILE] == pytest.approx(17.0, abs=1.0), past.phases
    assert Phase.READY not in past.phases and Phase.PROCESS_START in past.phases
    # the cold start compiled afresh: "saved AOT compiled function to ..."
    assert past.compile_cached is False and snap.facts.compile_cached is False


def test_a_start_loading_its_graphs_from_the_cache_is_a_hit() -> None:
    lines = _cpu_start()
    i = next(i for i, ln in enumerate(lines) if "saved AOT compiled function" in ln)
    # vllm/compilation/decorators.py (0.32): logger.info("%sDirectly load AOT compilation from path %s", ...)
    lines[i] = lines[i].split("[decorators.py")[0] + ("[decorators.py:320] [backbone] Directly load AOT compilation "
                                                      "from path /tmp/vllmcpu/cache/torch_compile_cache/x/model")
    assert _tracker(lines).snapshot().facts.compile_cached is True


def test_a_start_read_from_its_middle_or_not_ready_is_not_kept() -> None:
    lines = _cpu_start()
    assert past_of(_tracker(lines[:40]).snapshot()) is None  # still starting
    banner_gone = [ln for ln in lines if "version 0.32.0" not in ln]
    assert past_of(_tracker(banner_gone).snapshot()) is None  # no version: not seen from its banner


def test_usual_is_the_median_of_the_last_starts_and_a_start_read_twice_counts_once() -> None:
    h = StartHistory()
    assert h.usual(KEY) is None
    for i, s in enumerate((19.0, 21.0, 95.0)):
        assert h.add(KEY, _past(1000.0 + 100 * i, s, cached=i > 0))
    assert not h.add(KEY, _past(1000.3, 50.0))  # the same start (its log read again)
    u = h.usual(KEY)
    assert u is not None and u.starts == 3
    c = u.of(Phase.TORCH_COMPILE)
    assert c is not None and c.usual_s == 21.0 and c.longest_s == 95.0 and c.n == 3
    assert c.words() == "usually 21 s here (3 starts)"
    assert (u.compile_hits, u.compile_misses) == (2, 1)


def test_a_start_in_progress_matches_on_what_it_knows_and_other_flags_do_not() -> None:
    h = StartHistory()
    h.add(KEY, _past(1000.0, 20.0))
    h.add(StartKey("/tmp/tinyllama", "0.32.0", 2, 1, False, 2048), _past(2000.0, 80.0))
    # before the engine's config line: tp unknown, the most recently started key wins
    early = h.usual(StartKey("/tmp/tinyllama", "0.32.0"))
    assert early is not None and early.key.tp == 2
    tp1 = h.usual(StartKey("/tmp/tinyllama", "0.32.0", 1))
    assert tp1 is not None and tp1.of(Phase.TORCH_COMPILE).usual_s == 20.0  # type: ignore[union-attr]
    assert h.usual(StartKey("/tmp/tinyllama", "0.26.0", 1)) is None  # another vLLM version
    assert h.usual(StartKey("/tmp/tinyllama", "0.32.0", 1, 1, True)) is None  # eager
    assert h.usual(StartKey("/tmp/other")) is None


def test_the_history_is_bounded() -> None:
    h = StartHistory()
    for i in range(MAX_PER_KEY + 5):
        h.add(KEY, _past(1000.0 + 10 * i, float(i)))
    assert len(h.entries[KEY]) == MAX_PER_KEY and h.entries[KEY][0].started == 1000.0 + 50
    for j in range(MAX_KEYS + 3):
        h.add(StartKey(f"m{j}", "0.32.0"), _past(5000.0 + j, 1.0))
    assert len(h.entries) == MAX_KEYS
    assert KEY not in h.entries and StartKey("m0", "0.32.0") not in h.entries  # the oldest went first


def test_history_stall_threshold_follows_the_longest_of_the_last_starts() -> None:
    h = StartHistory()
    for i in range(3):
        h.add(KEY, _past(1000.0 + i, 20.0))
    u = h.usual(KEY)
    assert u is not None
    assert history_stall_s(u.of(Phase.TORCH_COMPILE), 5.0, 60.0) == 100.0
    assert history_stall_s(u.of(Phase.PROCESS_START), 5.0, 60.0) == 60.0  # 5 x 7 s, the floor
    assert history_stall_s(u.of(Phase.WEIGHTS), 5.0, 60.0) is None  # I/O, not judged by its time
    assert history_stall_s(u.of(Phase.CUDA_GRAPHS), 5.0, 60.0) is None  # no history of it


# --------------------------------------------------------------------------- the file


def test_saved_atomically_0600_and_read_back(tmp_path: Path) -> None:
    path = history_path({"XDG_STATE_HOME": str(tmp_path / "state")})
    assert path == tmp_path / "state" / "vtop" / "starts.json"
    assert history_path({"XDG_STATE_HOME": "relative", "HOME": "/home/u"}) == Path(
        "/home/u/.local/state/vtop/starts.json")
    h = StartHistory()
    h.add(KEY, _past(1000.0, 19.5, cached=True))
    assert save(path, h) is None
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["starts.json"]  # no temporary file left
    back, problem = load(path)
    assert problem is None and back.usual(KEY) == h.usual(KEY)
    assert back.entries[KEY][0].compile_cached is True


@pytest.mark.parametrize("content", [b"{not json", b'{"format": 99, "starts": []}', b'[1, 2]',
                                     b'{"format": 1, "starts": [{"key": {"model": "m"}, "runs": [{"started": 1, '
                                     b'"phases": {"torch_compile": "long"}}]}]}', b"\xff\xfe"])
def test_a_bad_file_is_a_clear_line_and_ignored(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "starts.json"
    path.write_bytes(content)
    h, problem = load(path)
    assert h.entries == {}
    assert problem is not None and str(path) in problem and "ignored" in problem and "Traceback" not in problem


def test_a_missing_file_is_no_problem_and_an_unwritable_place_is_a_line(tmp_path: Path) -> None:
    h, problem = load(tmp_path / "none" / "starts.json")
    assert h.entries == {} and problem is None
    blocker = tmp_path / "state"
    blocker.write_text("a file where the directory should be")  # fails for root too
    problem = save(blocker / "vtop" / "starts.json", h)
    assert problem is not None and "cannot write" in problem and str(blocker) in problem
    assert load(blocker / "vtop" / "starts.json")[1] is not None  # and reading it is a line too


def test_the_file_stays_small() -> None:
    h = StartHistory()
    phases = {p: 123.45 for p in Phase if p is not Phase.READY}
    for j in range(MAX_KEYS):
        for i in range(MAX_PER_KEY):
            h.add(StartKey(f"org/model-{j:02d}-with-a-long-name", "0.32.0", 8, 1, False, 131072),
                  PastStart(1.7e9 + j * 1000 + i, phases, True))
    assert len(json.dumps(h.to_json(), separators=(",", ":"))) < 100_000


# --------------------------------------------------------------------------- the stall threshold


def _stall(alerts: list[Alert]) -> Alert | None:
    return next((a for a in alerts if a.rule == "startup_stall"), None)


def _compile_hang(usual_compile_s: float | None) -> dict[int, Alert | None]:
    """The real CPU start stopped in torch.compile, no process visible to vtop (no CPU readings), ticked
    once a second for 200 s; the history holds three starts whose compile took ``usual_compile_s``."""
    raw = gzip.decompress((TRACE / "log.bin.gz").read_bytes())[:SIGSTOP_LOG_BYTES]
    ses = F.Session(url="http://127.0.0.1:8011", process=None, log=True)
    ses.lines((ses.now, ln) for ln in raw.decode().splitlines())
    assert ses.log is not None and ses.log.current is Phase.TORCH_COMPILE
    usual = None
    if usual_compile_s is not None:
        h = StartHistory()
        key = key_of(ses.log.snapshot())
        assert key is not None
        for i in range(3):
            h.add(key, _past(1000.0 + i, usual_compile_s))
        usual = h.usual(key)
    t0 = ses.now
    out: dict[int, Alert | None] = {}
    for i in range(1, 201):
        ses.to(t0 + i)
        ses.refused(t0 + i)
        out[i] = _stall(ses.tick(usual=usual))
    return out


def test_a_compile_hang_with_history_is_named_at_a_few_times_its_usual_time() -> None:
    got = _compile_hang(20.0)
    first = next((i for i, a in sorted(got.items()) if a is not None), None)
    # 5 x 20 s = 100 s of silence (ticks 1 s apart), long before the 10-minute ceiling
    assert first is not None and 100 <= first <= 102, first
    a = got[first]
    assert a is not None and a.title.startswith("Startup of :8011 stalled in torch.compile")
    ev = "\n".join(a.evidence)
    assert "history: torch.compile took 20s (median), 20s at the longest, in the last 3 starts" in ev, ev
    assert "/tmp/tinyllama v0.32.0" in ev and "past 5x that (1m 40s)" in ev, ev


def test_without_history_a_hidden_compile_hang_waits_for_the_ceiling() -> None:
    got = _compile_hang(None)
    assert not any(got.values())  # no process readings, no history: only the 10-minute ceiling


def test_a_slow_compile_history_raises_the_threshold() -> None:
    got = _compile_hang(35.0)  # 5 x 35 s = 175 s
    first = next((i for i, a in sorted(got.items()) if a is not None), None)
    assert first is not None and 175 <= first <= 177, first


def test_the_thresholds_are_tunable() -> None:
    assert Thresholds(startup_history_x=3.0).startup_history_x == 3.0


def test_a_start_kept_is_no_history_of_itself() -> None:
    h = StartHistory()
    h.add(KEY, _past(1000.0, 20.0))
    assert h.usual(KEY, this_start=1000.0) is None
    h.add(KEY, _past(2000.0, 30.0))
    u = h.usual(KEY, this_start=2000.0)
    assert u is not None and u.starts == 1 and u.of(Phase.TORCH_COMPILE).usual_s == 20.0  # type: ignore[union-attr]


# --------------------------------------------------------------------------- the faces


def _two_logs(tmp_path: Path) -> tuple[Path, Path]:
    """The real CPU start (ready), and the same start a day later cut in torch.compile (still starting)."""
    lines = _cpu_start()
    first = tmp_path / "first.log"
    first.write_text("\n".join(lines) + "\n")
    cut = next(i for i, ln in enumerate(lines) if "Warming up model for the compilation" in ln)
    second = tmp_path / "second.log"
    second.write_text("\n".join(ln.replace("11-30 09:", "12-01 09:") for ln in lines[: cut + 1]) + "\n")
    return first, second


def _once(log: Path, state: Path) -> dict:  # type: ignore[type-arg]
    import subprocess
    import sys

    env = {**os.environ, "XDG_STATE_HOME": str(state)}
    out = subprocess.run([sys.executable, "-m", "vtop", "--once", "--json", "--no-gpu", "--log", str(log),
                          "http://127.0.0.1:9"], capture_output=True, text=True, timeout=60, env=env)
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def test_once_json_keeps_a_ready_start_and_shows_it_beside_the_next(tmp_path: Path) -> None:
    first, second = _two_logs(tmp_path)
    state = tmp_path / "state"
    r1 = _once(first, state)["startup"]
    assert r1["state"] == "ready" and r1["history"] is None and r1["compile_cache"] == "miss"
    kept = state / "vtop" / "starts.json"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert _once(first, state)["startup"]["history"] is None  # read again: kept once, no history of itself
    r2 = _once(second, state)["startup"]
    assert r2["state"] == "starting" and r2["history"]["starts"] == 1
    assert r2["usually"]["torch_compile"] == "usually 18 s here (1 start)", r2["usually"]
    assert r2["history"]["phases"]["torch_compile"]["longest_s"] == 18.0


def test_a_corrupt_history_file_is_a_note_and_the_start_goes_on(tmp_path: Path) -> None:
    first, _ = _two_logs(tmp_path)
    state = tmp_path / "state"
    (state / "vtop").mkdir(parents=True)
    (state / "vtop" / "starts.json").write_text("{half a file")
    r = _once(first, state)
    assert any("starts.json: unreadable" in n and "ignored" in n for n in r["notes"]), r["notes"]
    assert r["startup"]["state"] == "ready"
    assert json.loads((state / "vtop" / "starts.json").read_text())["format"] == 1  # replaced by the start kept


def test_the_startup_panel_shows_the_usual_time_beside_each_phase(tmp_path: Path) -> None:
    from vtop.monitor.logwatch import LogWatch
    from vtop.sources.logtail import LogTailer
    from vtop.ui.widgets.startup_panel import StartupPanel

    first, second = _two_logs(tmp_path)
    snap = _tracker(_cpu_start()).snapshot()
    got = past_of(snap)
    assert got is not None
    h = StartHistory()
    h.add(*got)
    lw = LogWatch(LogTailer(second))
    view = lw.poll()
    usual = h.usual(key_of(view.snapshot), this_start=view.snapshot.started)
    panel = StartupPanel(gpu_activity=lambda t: (None, None), usual=lambda: usual)
    panel.view = view
    text = panel.build().plain
    row = next(ln for ln in text.splitlines() if "torch.compile" in ln)
    assert "· usually 18 s here (1 start)" in row, text
    assert "· usually 7.0 s here (1 start)" in next(ln for ln in text.splitlines() if "engine init" in ln)
    panel.usual = lambda: None
    assert "usually" not in panel.build().plain
