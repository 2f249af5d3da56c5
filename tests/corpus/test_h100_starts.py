"""Issue 40 on real GPU starts: three starts of one model recorded on a lent NVIDIA H100 80GB HBM3 with vLLM 0.26.0
(tests/corpus/traces/h100-starts-history-budget: start-0.log at --gpu-memory-utilization 0.5, start-1.log at 0.5
again, start-2.log at 0.8; events.jsonl; the trace's NVML samples and process table; tests/helpers/h100_starts.py).

Each log is read by the monitor behind the screen (its log watch, phase tracker, the start history kept in
$XDG_STATE_HOME/vtop/starts.json, the memory budget) with the process table, the server's poll and the NVML reading
the trace holds for the moment each start was kept, as a vtop started then would have. What each figure is checked
against is written beside it: a log line (quoted), events.jsonl, or NVML's samples. The logs' stamps are UTC (the
launch event's time, 10:11:37.748 UTC, comes 28 s before start-0's banner stamped 10:12:06; ready at 10:13:12.155
UTC after 'Application startup complete' following lines stamped 10:13:11)."""

from __future__ import annotations

import re
from datetime import datetime, timezone
from pathlib import Path

import pytest

from tests.helpers import h100_starts as H
from vtop.config import Config
from vtop.core.membudget import kv_bytes_that_fit, non_kv_of_parts
from vtop.core.phases import Phase
from vtop.monitor.player import open_recording
from vtop.ui.widgets.startup_panel import StartupPanel

GIB = H.GIB
MIB = float(1 << 20)

#: each phase and the log line that ends it (the next begins there); the first begins at the process's start (the
#: trace's process table: create_time), before vLLM's first line (28 s of imports log nothing). The API server's
#: end, 'Application startup complete.', is uvicorn's line without a stamp: the last stamp before it is
#: 'Starting vLLM server on'
PHASE_ENDS = (
    (Phase.PROCESS_START, "[core.py:116] Initializing a V1 LLM engine"),
    (Phase.ENGINE_INIT, "Loading model from scratch"),
    (Phase.WEIGHTS, "Model loading took"),
    (Phase.TORCH_COMPILE, "torch.compile took"),
    (Phase.MEMORY_PROFILING, "Available KV cache memory"),
    (Phase.KV_CACHE, "GPU KV cache size"),
    (Phase.CUDA_GRAPHS, "Graph capturing finished in"),
    (Phase.WARMUP, "init engine (profile, create kv cache, warmup model) took"),
    (Phase.API_SERVER, "Starting vLLM server on"),
)
STAMP = re.compile(r" (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d) ")


def _line(k: int, needle: str) -> str:
    return next(ln for ln in H.start_log(k).read_text().splitlines() if needle in ln)


def _stamp(k: int, needle: str) -> float:
    """The UTC time of the first line of start ``k``'s log holding ``needle`` (the year: the recording's)."""
    m = STAMP.search(_line(k, needle))
    assert m is not None
    year = datetime.fromtimestamp(H.event("start_begin", k)["t"], timezone.utc).year
    mo, d, h, mi, s = map(int, m.groups())
    return datetime(year, mo, d, h, mi, s, tzinfo=timezone.utc).timestamp()


def _logged_phases(k: int) -> dict[Phase, float]:
    """Start ``k``'s phase times as its log's stamps (and its process's start) give them: whole seconds."""
    began = H.procs_at(H.event("start_kept", k)["t"])[0].create_time
    out, prev = {}, began
    for phase, needle in PHASE_ENDS:
        t = _stamp(k, needle)
        out[phase] = t - prev
        prev = t
    return out


def _vllm_seconds(k: int, pattern: str) -> float:
    m = re.search(pattern, H.start_log(k).read_text())
    assert m is not None, pattern
    return float(m.group(1))


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This box's start history, empty: the monitor reads and writes $XDG_STATE_HOME/vtop/starts.json."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path / "state" / "vtop" / "starts.json"


def _follow(k: int):  # type: ignore[no-untyped-def]
    return H.follow(H.start_log(k), H.event("start_kept", k)["t"])


def _panel(m) -> str:  # type: ignore[no-untyped-def]
    """The startup panel as the screen builds it from this monitor (unfolded: a start that is ready folds)."""
    panel = StartupPanel(gpu_activity=lambda t: (None, None), usual=m.start_usual, budget=m.memory_budget)
    panel.view = m.log_view
    panel.unfolded = True
    return panel.build().plain


def _row(text: str, label: str) -> str:
    return next(ln for ln in text.splitlines() if ln.startswith(f" ✓ {label}"))


# --------------------------------------------------------------------------- the start history


def test_each_start_is_kept_with_the_phase_times_its_log_says(state: Path) -> None:
    for k in range(3):
        m = _follow(k)
        snap = m.log_view.snapshot
        assert snap.state == "ready" and snap.facts.version == "0.26.0"
        got = {v.phase: v.duration_s for v in snap.phases if v.phase is not Phase.READY}
        logged = _logged_phases(k)
        assert set(got) == set(logged), (k, got)
        for phase, s in logged.items():
            # the stamps are whole seconds; the process's start is to the hundredth (vLLM's 28 s of imports before
            # its banner are in the process start: the process table says when it began)
            assert got[phase] == pytest.approx(s, abs=0.06), (k, phase, got[phase], s)
        # vLLM's own figures: "Graph capturing finished in 1 secs" (start-0; 2 secs in the others) and "init engine
        # (profile, create kv cache, warmup model) took 28.42 s" (6.99 s, 6.87 s), torch.compile to the warmup's end
        assert got[Phase.CUDA_GRAPHS] == pytest.approx(_vllm_seconds(k, r"Graph capturing finished in (\d+) secs"),
                                                       abs=1.0)
        init = sum(got[p] for p in (Phase.TORCH_COMPILE, Phase.MEMORY_PROFILING, Phase.KV_CACHE, Phase.CUDA_GRAPHS,
                                    Phase.WARMUP))
        assert init == pytest.approx(_vllm_seconds(k, r"warmup model\) took ([\d.]+) s"), abs=1.0), (k, init)
        # the whole start against the recipe's clock: healthy_after_s (94.4, 69.3, 65.2 s) is from the launch to
        # /health's first 200, polled about once a second after 'Application startup complete'
        total = sum(got.values())
        healthy = H.event("ready", k)["healthy_after_s"]
        assert healthy - 2.0 <= total <= healthy + 0.2, (k, total, healthy)
        # the compile cache: "Directly load AOT compilation from path ..." in each log; the recipe saw the cache
        # directory before each launch (start_begin's compile_cache_present)
        assert snap.facts.compile_cached is True and H.event("start_begin", k)["compile_cache_present"] is True


def test_the_second_start_shows_the_first_as_usually(state: Path) -> None:
    m0 = _follow(0)
    assert m0.start_usual() is None  # the first start of this model on this box: no history
    assert state.stat().st_mode & 0o777 == 0o600
    m1 = _follow(1)
    u = m1.start_usual()
    assert u is not None and u.starts == 1 and (u.compile_hits, u.compile_misses) == (1, 0)
    logged0 = _logged_phases(0)
    for phase, s in logged0.items():
        pu = u.of(phase)
        assert pu is not None and pu.n == 1, phase
        assert pu.usual_s == pytest.approx(s, abs=0.06) and pu.longest_s == pu.usual_s, (phase, pu, s)
    text = _panel(m1)
    # start-0's times beside start-1's, from start-0.log's stamps: warmup 10:12:48 ('Graph capturing finished') to
    # 10:13:10 ('init engine ... took 28.42 s'); engine init 10:12:35 to 10:12:40 ('Loading model from scratch');
    # the process start from its create time (10:11:37.62 UTC) to 10:12:35, 57 s
    assert _row(text, "warmup").endswith("· usually 22 s here (1 start)"), text
    assert "· usually 5.0 s here (1 start)" in _row(text, "engine init"), text
    assert "· usually 57 s here (1 start)" in _row(text, "process start"), text
    assert "· usually 1.0 s here (1 start)" in _row(text, "CUDA graph capture"), text  # "finished in 1 secs"


def test_the_third_start_shows_the_first_two(state: Path) -> None:
    _follow(0)
    _follow(1)
    m2 = _follow(2)
    u = m2.start_usual()
    assert u is not None and u.starts == 2 and (u.compile_hits, u.compile_misses) == (2, 0)
    logged = [_logged_phases(0), _logged_phases(1)]
    for phase in logged[0]:
        pu = u.of(phase)
        a, b = logged[0][phase], logged[1][phase]
        assert pu is not None and pu.n == 2, phase
        # the median of two is their mean; the longest is what a silent phase's threshold is set from
        assert pu.usual_s == pytest.approx((a + b) / 2, abs=0.06) and pu.longest_s == pytest.approx(max(a, b), abs=0.06)
    text = _panel(m2)
    # warmup: 22 s in start-0 (a cold first warmup: 10:12:48 to 10:13:10), 2 s in start-1 (10:14:26 to 10:14:28)
    assert _row(text, "warmup").endswith("· usually 12 s here (2 starts)"), text
    # torch.compile: 3 s (10:12:41 'Model loading took' to 10:12:44 'torch.compile took 1.96 s in total') and 2 s
    assert "· usually 2.5 s here (2 starts)" in _row(text, "torch.compile"), text
    # start-2's own: "torch.compile took 1.81 s in total", "Directly load AOT compilation from path ..."
    assert "1.8 s · compile cache hit" in _row(text, "torch.compile"), text


def test_the_same_start_read_again_is_kept_once(state: Path) -> None:
    _follow(0)
    m = _follow(0)
    assert m.start_usual() is None  # no history of itself
    assert m.start_history is not None and sum(len(r) for r in m.start_history.entries.values()) == 1


# --------------------------------------------------------------------------- the memory budget

#: the figures of each start's own lines, quoted from its log
LOGGED = {
    0: {"free": 78.66, "total": 79.18, "util": 0.5, "requested": 39.59, "kv": 39.2, "tokens": 5_138_224,
        "concurrency": 156.81, "fit_requested": 41733749248, "fit_full": 83690093056},
    2: {"free": 78.66, "total": 79.18, "util": 0.8, "requested": 63.34, "kv": 62.96, "tokens": 8_251_648,
        "concurrency": 251.82, "fit_requested": 67238997300, "fit_full": None},
}
#: the parts line's usage, the same at both settings (the model and its activations did not change)
PARTS = {"weights": 0.04, "activation peak": 0.12, "non-torch": 0.22, "CUDA graphs": 0.19}


def _check_lines(k: int) -> None:
    """The figures of LOGGED are the log's own lines (so the test says where each comes from)."""
    x, text = LOGGED[k], H.start_log(k).read_text()
    assert (f"Free memory on device ({x['free']}/{x['total']} GiB) on startup. Desired GPU memory utilization is "
            f"({x['util']}, {x['requested']} GiB). Actual usage is {PARTS['weights']} GiB for weight, "
            f"{PARTS['activation peak']} GiB for peak activation, {PARTS['non-torch']} GiB for non-torch memory, and "
            f"{PARTS['CUDA graphs']} GiB for CUDAGraph memory.") in text
    assert f"Replace gpu_memory_utilization config with `--kv-cache-memory={x['fit_requested']}`" in text
    if x["fit_full"] is not None:
        assert f"`--kv-cache-memory={x['fit_full']}` (77.94 GiB) to fully utilize gpu memory" in text
    assert f"Current kv cache memory in use is {x['kv']} GiB." in text
    assert f"Available KV cache memory: {x['kv']} GiB" in text
    assert f"GPU KV cache size: {x['tokens']:,} tokens" in text
    assert f"Maximum concurrency for 32,768 tokens per request: {x['concurrency']}x" in text
    assert f"'gpu_memory_utilization': {x['util']}" in text  # the API server's non-default args


@pytest.mark.parametrize("k", [0, 2])
def test_the_budget_agrees_with_the_logs_lines_and_nvml(state: Path, k: int) -> None:
    _check_lines(k)
    x = LOGGED[k]
    m = _follow(k)
    budgets = m.memory_budget()
    assert len(budgets) == 1
    b = budgets[0]
    # the parts line: CUDA's total (not NVML's 79.65), the utilization and what it asks for, what was free at start
    assert b.gpu == 0 and b.total_gib == x["total"] and b.utilization == x["util"]
    assert b.requested_gib == x["requested"] == pytest.approx(x["util"] * x["total"], abs=0.005)
    assert b.free_at_start_gib == x["free"]
    # its usage, and the KV cache: "Available KV cache memory" = "Current kv cache memory in use"
    assert dict(b.parts) == {**PARTS, "KV cache": x["kv"]}
    # "GPU KV cache size: 5,138,224 tokens" (8,251,648 at 0.8): the tiny model's KV cache is 8 KiB a token (its
    # layers x 2 x KV heads x head size x 2 bytes), the same at both settings within the GiB's two decimals
    facts = m.log_view.snapshot.facts
    assert facts.kv_cache_tokens == x["tokens"]
    assert x["kv"] * GIB / x["tokens"] == pytest.approx(8192, rel=0.001)
    assert facts.kv_cache_tokens / 32768 == pytest.approx(x["concurrency"], abs=0.005)  # "Maximum concurrency"
    # NVML: the GPU's memory used when the start was kept (events.jsonl start_kept: 43,808,260,096 bytes at 0.5,
    # 69,318,017,024 at 0.8), and no process on the GPU but vLLM's EngineCore
    kept = H.event("start_kept", k)["mem_used"][0]
    assert b.used_now_gib == pytest.approx(kept / GIB, abs=1e-9)
    assert b.others == ()
    poll, names = H.nvml_at(H.event("start_kept", k)["t"])
    gpu = poll.gpus[0]
    assert [names[p.pid] for p in gpu.procs or ()] == ["VLLM::EngineCore"]
    # what NVML's used is made of: vLLM's parts + what was in use when vLLM measured the free memory at start (total
    # less free: 0.52 GiB, its CUDA context) + NVML's reading with no process on the GPU (503,316,480 bytes, the
    # driver's reserve: between start-0's stop and start-1's launch). Seven figures of two decimals and what the
    # engine allocated after its parts line: 0.04 GiB apart on both starts
    idle = H.nvml_idle().gpus[0].mem_used
    assert idle == 503_316_480
    assert b.vllm_gib is not None
    assert b.vllm_gib + (x["total"] - x["free"]) + idle / GIB == pytest.approx(kept / GIB, abs=0.1)
    # free: NVML's total less its used (15.09 GiB at 0.8; the total less the budget said 15.84: vLLM holds more than
    # its budget, the CUDA context and the graphs the V2 runner captures outside it)
    assert gpu.mem_total is not None
    nvml_free = (gpu.mem_total - kept) / GIB
    assert b.free_gib == pytest.approx(nvml_free, abs=0.01)
    assert f"free {nvml_free:.1f} GiB" in b.text()
    assert b.util_fit is None and b.fit_words() is None  # the start went well: no fit proposed
    # the screen's words: the panel's budget line is the budget's one text
    assert b.text() in _panel(m)


def test_the_kv_cache_that_fits_is_vllms_own_suggestion() -> None:
    """The fit arithmetic (everything but the KV cache from the parts, the KV cache that fits in a room) against the
    suggestion vLLM 0.26.0 logs with its parts line, which keeps a 150 MiB buffer: "Replace gpu_memory_utilization
    config with `--kv-cache-memory=41733749248` (38.87 GiB) to fit into requested memory, or
    `--kv-cache-memory=83690093056` (77.94 GiB) to fully utilize gpu memory" (start-0), 67238997300 at 0.8."""
    margin_gib = 150 * MIB / GIB
    for k in (0, 2):
        x = LOGGED[k]
        m = H.follow(H.start_log(k), H.event("start_kept", k)["t"], gpu=False)
        b = m.memory_budget()[0]
        non_kv = non_kv_of_parts(b.parts)
        assert non_kv == pytest.approx(sum(PARTS.values()))  # weights, activation peak, non-torch, CUDA graphs
        total = b.total_gib
        assert total is not None and b.requested_gib is not None and b.free_at_start_gib is not None
        # into the requested memory: the room is the budget (everything else held, as vLLM counts it)
        fit = kv_bytes_that_fit(total, total - b.requested_gib, non_kv, margin=margin_gib / total)
        # five figures of two decimals (up to 5 MiB each) and the whole MiB it is rounded down to
        assert fit is not None and abs(fit - x["fit_requested"]) <= 32 * MIB, (k, fit, x["fit_requested"])
        if x["fit_full"] is not None:
            full = kv_bytes_that_fit(total, total - b.free_at_start_gib, non_kv, margin=margin_gib / total)
            assert full is not None and abs(full - x["fit_full"]) <= 32 * MIB, (full, x["fit_full"])


def test_the_two_settings_differ_by_the_kv_cache_alone(state: Path) -> None:
    """NVML's used at 0.8 less at 0.5 (69,318,017,024 - 43,808,260,096 bytes = 23.76 GiB) is the KV cache's growth
    ('Available KV cache memory: 62.96 GiB' less 39.2) and the budget's ('Desired ... (0.8, 63.34 GiB)' less 39.59)."""
    b0, b2 = _follow(0).memory_budget()[0], _follow(2).memory_budget()[0]
    grown = (H.event("start_kept", 2)["mem_used"][0] - H.event("start_kept", 0)["mem_used"][0]) / GIB
    kv0, kv2 = dict(b0.parts)["KV cache"], dict(b2.parts)["KV cache"]
    assert kv2 - kv0 == pytest.approx(grown, abs=0.02)
    assert b2.requested_gib is not None and b0.requested_gib is not None
    assert b2.requested_gib - b0.requested_gib == pytest.approx(grown, abs=0.02)
    assert b2.used_now_gib is not None and b0.used_now_gib is not None
    assert b2.used_now_gib - b0.used_now_gib == pytest.approx(grown, abs=1e-9)


# --------------------------------------------------------------------------- a replay's history is the trace's own


def test_a_replay_judges_each_start_against_the_traces_earlier_starts_never_this_boxs(state: Path) -> None:
    """The trace replayed (the scoreboard, ``vtop replay``) on a box whose history holds another start of the same
    model (start-2, followed live and kept in $XDG_STATE_HOME): the replay keeps the trace's own starts in memory as
    they reach ready, as a vtop that watched them live would have. Its first start has no history (start-2 in this
    box's file would have been one: the file is not read), its second shows the first's phase times as "usually"
    (start-0.log's stamps), its third the first two; this box's file is left as it was."""
    _follow(2)
    before = state.read_bytes()
    p = open_recording(str(H.TRACE), config=Config())
    m = p.monitor
    seen: list[dict[Phase, float]] = []
    for k in range(3):
        p.feed_until(H.event("start_kept", k)["mono"])
        assert m.log_view is not None
        snap = m.log_view.snapshot
        assert snap.state == "ready", (k, snap.state)
        # the replay's own phase times (what its startup panel showed) are the log's, but for the API server's: the
        # replay's start is ready at /health's first 200 (polled once a second), after the log's last stamp
        got = {v.phase: v.duration_s or 0.0 for v in snap.phases if v.phase is not Phase.READY}
        logged = _logged_phases(k)
        assert set(got) == set(logged), k
        for phase, s in logged.items():
            if phase is Phase.API_SERVER:
                assert s - 0.06 <= got[phase] <= s + 1.1, (k, got[phase], s)
            else:
                assert got[phase] == pytest.approx(s, abs=0.06), (k, phase, got[phase], s)
        seen.append(got)
        u = m.start_usual()
        if k == 0:
            assert u is None and m.startup_extras()["history"] is None
            continue
        assert u is not None and u.starts == k and (u.compile_hits, u.compile_misses) == (k, 0)
        assert m.startup_extras()["history"]["starts"] == k
        for phase in seen[0]:
            ds = sorted(seen[j][phase] for j in range(k))
            pu = u.of(phase)
            assert pu is not None and pu.n == k, (k, phase)
            # one start: its own time; two: the median of two is their mean; the longest sets a silent phase's threshold
            assert pu.usual_s == pytest.approx(sum(ds) / k, abs=0.06), (k, phase, pu)
            assert pu.longest_s == pytest.approx(ds[-1], abs=0.06), (k, phase, pu)
        # the screen's words, as for a start followed live: the warmup usually 22 s (start-0: 10:12:48 to 10:13:10),
        # 12 s of start-0's and start-1's (2 s: 10:14:26 to 10:14:28)
        text = _panel(m)
        warmup = u.of(Phase.WARMUP)
        assert warmup is not None and _row(text, "warmup").endswith(f"· {warmup.words()}"), text
        assert f"here ({k} start{'s' if k > 1 else ''})" in warmup.words()
    p.feed_until(p.end)
    H.join("vtop-start-history")
    H.join("vtop-start-history-save")
    # every start kept once, in memory: the trace's three
    assert m.start_history is not None and sum(len(r) for r in m.start_history.entries.values()) == 3
    assert state.read_bytes() == before
    # a seek back (the replay screen's keys) forgets the starts after the new position: at start-1 again, start-0
    # alone is its history, as at the first pass
    p.seek(H.event("start_kept", 1)["mono"])
    u = m.start_usual()
    assert u is not None and u.starts == 1 and u.of(Phase.WARMUP) is not None
    assert u.of(Phase.WARMUP).usual_s == seen[0][Phase.WARMUP]  # type: ignore[union-attr]
    assert sum(len(r) for r in m.start_history.entries.values()) == 2


# --------------------------------------------------------------------------- the screen


@pytest.mark.parametrize("size", [(120, 40), (80, 24)])
async def test_the_screen_shows_the_third_start_with_its_history_and_budget(state: Path, tmp_path: Path,
                                                                             size: tuple[int, int]) -> None:
    """A vtop that followed start-2 from its launch, 0.9 s into its warmup (its parts line logged), with start-0 and
    start-1 kept by the same vtop: the warmup 'usually 12 s here (2 starts)' (22 s and 2 s in their logs), the budget at
    0.8 beside NVML. At 80x24 the whole timeline has no room: the panel's short form (the phases done as one line, the
    warmup, the budget), where the screen used to drop the panel of a start in progress altogether."""
    H.keep_first_two()
    log = tmp_path / "serve.log"
    app, clock = H.third_start_app(log)
    async with app.run_test(size=size) as pilot:
        await H.feed_third_start(app, clock, log)
        await pilot.pause()
        panel = app.w_startup
        assert panel.display, "the startup panel of a start in progress is not on the screen"
        text = panel.build().plain
        lines = text.splitlines()
        warmup = next(ln for ln in lines if ln.startswith(" ▶ warmup"))
        assert warmup.endswith("· usually 12 s here (2 starts)"), text
        budget = app.monitor.memory_budget()[0]
        assert budget.text() in text and "free 15.1 GiB" in budget.text() and "KV cache 62.96" in budget.text()
        assert panel.compact is (size == (80, 24))
        if panel.compact:
            # 51 + 3 + 2 + 2 + 2 + 0 + 2 s: the process start (from its create time) to 'Graph capturing finished'
            assert " ✓ process start … CUDA graph capture: 7 phases in 1 min 02 s" in lines, text
            assert not any(ln.startswith(" ✓ torch.compile") for ln in lines)
        else:
            assert "· usually 2.5 s here (2 starts)" in next(ln for ln in lines if ln.startswith(" ✓ torch.compile"))
        # every row of the panel is on the screen: none cut by the layout
        assert panel.size.height >= panel.rows(panel.content_region.width, compact=panel.compact)
