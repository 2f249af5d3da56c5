"""Issue 40, the GPU memory budget (vtop/core/membudget.py): vLLM's profiling lines (the table in
vtop/core/phases/patterns.py) with NVML's other processes, one answer for --once --json, the snapshot and the
startup panel; after a start that failed for memory, the --gpu-memory-utilization that fits beside what else
holds the GPU, the same number the startup-failure rule's fix says. Real lines: the H200 starts of vLLM 0.26.0
(tests/fixtures/logs/vllm-0.26.0-h200-startup.log, the demo recording, and the corpus trace
h200-startup-failure-cuda-oom with a 100 GiB process beside it); the 0.32 line is written from vLLM 0.32.0's
source (vllm/v1/worker/gpu_worker.py), the 0.7-0.9 lines as remembered of those versions (no log of them here)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from vtop.config import Config
from vtop.core.membudget import util_that_fits
from vtop.core.phases import PhaseTracker
from vtop.faces.demo import demo_path
from vtop.monitor.player import open_recording

ROOT = Path(__file__).resolve().parents[1]
H200_LOG = ROOT / "fixtures" / "logs" / "vllm-0.26.0-h200-startup.log"
OOM_TRACE = ROOT / "corpus" / "traces" / "h200-startup-failure-cuda-oom"
P = "(EngineCore pid=1048) INFO 11-30 09:55:14 [gpu_worker.py:857] "


def _facts(lines: list[str]):  # type: ignore[no-untyped-def]
    tr = PhaseTracker(year=2026)
    for i, ln in enumerate(lines):
        tr.feed(ln, 1000.0 + i * 0.01)
    return tr.snapshot().facts


def test_the_real_026_h200_line_gives_every_part() -> None:
    f = _facts(H200_LOG.read_text().splitlines())
    assert (f.mem_free_at_start_gib, f.mem_total_gib, f.gpu_memory_utilization, f.mem_requested_gib) == (
        139.29, 139.8, 0.5, 69.9)
    assert (f.weights_gib, f.activation_peak_gib, f.non_torch_gib, f.cuda_graph_gib) == (0.04, 0.18, 0.22, 0.19)
    assert f.kv_cache_gib == 69.45 and f.consumed_gib is None


def test_the_032_line_says_weights_and_non_torch_as_one_sum() -> None:
    line = (P + "Free memory on device (79.1/79.6 GiB) on startup. Desired GPU memory utilization is (0.9, 71.6 GiB)."
            " Actual usage is 15.2 GiB for consumed memory (weights + non-torch), 4.1 GiB for peak activation, and "
            "0.8 GiB for CUDAGraph memory. Replace gpu_memory_utilization config with `--kv-cache-memory=1` (1 GiB) "
            "to fit into requested memory, or `--kv-cache-memory=2` (2 GiB) to fully utilize gpu memory. Current kv "
            "cache memory in use is 51.3 GiB.")
    f = _facts([line])
    assert (f.consumed_gib, f.activation_peak_gib, f.cuda_graph_gib, f.kv_cache_gib) == (15.2, 4.1, 0.8, 51.3)
    assert f.weights_gib is None and f.non_torch_gib is None and f.gpu_memory_utilization == 0.9


def test_the_old_multi_line_budget_is_read_too() -> None:
    f = _facts(["INFO 02-10 10:00:00 [worker.py:267] Memory profiling takes 5.21 seconds",
                "the current vLLM instance can use total_gpu_memory (79.15GiB) x gpu_memory_utilization (0.90) = 71.24GiB",
                "model weights take 14.99GiB; non_torch_memory takes 0.18GiB; PyTorch activation peak memory takes "
                "1.24GiB; the rest of the memory reserved for KV Cache is 54.83GiB."])
    assert (f.mem_total_gib, f.gpu_memory_utilization, f.mem_requested_gib) == (79.15, 0.9, 71.24)
    assert (f.weights_gib, f.non_torch_gib, f.activation_peak_gib, f.kv_cache_gib) == (14.99, 0.18, 1.24, 54.83)


def test_the_budget_of_a_real_h200_start_in_json_and_on_the_panel() -> None:
    from rich.text import Text

    from vtop.ui.widgets.startup_panel import budget_bar

    p = open_recording(str(demo_path()), config=Config())
    t = p.start
    while t < p.end and not (p.monitor.log_view is not None and p.monitor.log_view.snapshot.state == "ready"):
        t += 2.0
        p.feed_until(t)
    m = p.monitor
    budgets = m.memory_budget()
    assert len(budgets) == 1
    b = budgets[0]
    assert b.gpu == 0 and b.total_gib == 139.8 and b.utilization == 0.5 and b.requested_gib == 69.9
    parts = dict(b.parts)
    assert parts["KV cache"] == pytest.approx(69.44, abs=0.02) and parts["activation peak"] == 0.18
    assert b.others == () and b.util_fit is None  # vLLM alone on the GPU, and the start went well
    js = m.startup_extras()["memory_budget"][0]
    assert js["text"] == b.text() and js["parts_gib"]["CUDA graphs"] == 0.19 and js["others_gib"] == 0.0
    out = Text()
    budget_bar(out, b)
    line = out.plain
    assert line.startswith("\n  mem █") and b.text() in line and "|" in line  # the mark at 0.5 of the total


def test_after_a_start_that_failed_for_memory_the_utilization_that_fits_is_the_rules_number() -> None:
    p = open_recording(str(OOM_TRACE), config=Config())
    t = p.start
    alert = None
    while t < p.end and alert is None:
        t += 1.0
        p.feed_until(t)
        alert = next((a for a in p.monitor.alerts if a.rule == "startup_failure"), None)
    assert alert is not None
    b = p.monitor.memory_budget()[0]
    # the 100 GiB process beside it, by NVML; the budget vLLM asked for; what fits beside it
    assert b.others is not None and [pid for pid, _ in b.others] == [1960] and b.others_gib == pytest.approx(100.5, abs=0.1)
    assert b.total_gib == 139.8 and b.requested_gib == 69.9 and b.free_at_start_gib == 38.77
    assert b.util_fit == 0.26
    assert f"--gpu-memory-utilization to {b.util_fit:.2f} or less" in alert.fix[0], alert.fix
    assert "fits: --gpu-memory-utilization 0.26" in b.text()


def test_util_that_fits() -> None:
    assert util_that_fits(139.8, 139.8 - 38.77) == 0.26  # 0.277 free, two points under
    assert util_that_fits(80.0, 0.0) == 0.98
    assert util_that_fits(80.0, 80.0) == 0.05  # nothing free: the floor, never 0 or less


# --------------------------------------------------------------------------- the --kv-cache-memory-bytes that fits


def _failed_budget(facts, others):  # type: ignore[no-untyped-def]
    """The budget of a start that failed for memory (kv_no_memory, after profiling) with these facts and
    these other processes on the GPU."""
    from vtop.core.membudget import _budget, _parts
    from vtop.core.phases.types import Failure

    fail = Failure("kv_no_memory", "x", None, None, 0.0)
    return _budget(0, facts.mem_total_gib, facts, _parts(facts), others, None, fail)


def test_the_kv_cache_bytes_that_fit_beside_the_hog_from_the_real_parts() -> None:
    """The real H200 start's parts (vLLM 0.26.0, /tmp/tiny: weights 0.04, activation peak 0.18, non-torch 0.22,
    CUDA graphs 0.19 GiB) beside the corpus trace's 100.5 GiB process: the KV cache that fits is what is free
    less the utilization fix's margin (two points of the total) less those parts, and the words are whole GiB."""
    from vtop.core.membudget import kv_bytes_words

    f = _facts(H200_LOG.read_text().splitlines())
    assert f.version == "0.26.0"
    b = _failed_budget(f, ((1960, 100.5),))
    assert b.util_fit == 0.26 and b.kv_bytes_fit is not None and b.kv_bytes_flag == "--kv-cache-memory-bytes"
    gib = b.kv_bytes_fit / 2**30
    non_kv = 0.04 + 0.18 + 0.22 + 0.19
    free = 139.8 - 100.5
    # it fits with the margin, and leaves no more than a MiB of the room unused
    assert gib + non_kv + 0.02 * 139.8 <= free < gib + non_kv + 0.02 * 139.8 + 1 / 1024
    words = kv_bytes_words(b.kv_bytes_fit)
    assert words == f"{int(gib)}G" and int(words[:-1]) * 2**30 <= b.kv_bytes_fit
    assert f"fits: --gpu-memory-utilization 0.26 or --kv-cache-memory-bytes {words}" in b.text()
    assert b.to_json()["kv_cache_memory_bytes_fit"] == b.kv_bytes_fit


def test_no_kv_cache_bytes_for_a_version_or_engine_without_the_flag_or_without_the_parts() -> None:
    from dataclasses import replace

    from vtop.core.membudget import kv_bytes_words

    f = _facts(H200_LOG.read_text().splitlines())
    for other in (replace(f, version="0.10.2"), replace(f, engine="sglang")):
        b = _failed_budget(other, ((1960, 100.5),))
        assert b.util_fit == 0.26 and b.kv_bytes_flag is None and "--kv-cache-memory-bytes" not in b.text()
        assert b.to_json()["kv_cache_memory_bytes_fit"] is None
    # a hog that leaves less than the parts and the margin: no KV cache fits, none is proposed
    assert _failed_budget(f, ((1960, 139.0),)).kv_bytes_fit is None
    assert kv_bytes_words(512 * 2**20) == "512M" and kv_bytes_words(3 * 2**30 + 5) == "3G"


def test_the_recorded_oom_start_failed_before_profiling_so_no_kv_bytes_are_guessed() -> None:
    """h200-startup-failure-cuda-oom: vLLM 0.26.0 raised at its free-memory check, before loading weights or
    profiling: the log has no parts, so the budget proposes the utilization alone, no KV cache size."""
    p = open_recording(str(OOM_TRACE), config=Config())
    p.feed_until(p.end)
    b = p.monitor.memory_budget()[0]
    assert b.util_fit == 0.26 and not dict(b.parts).get("activation peak")
    assert b.kv_bytes_fit is None and "--kv-cache-memory-bytes" not in b.text()


# --------------------------------------------------------------------------- the startup-failure rule quotes the fit

FIT_TAIL = "the memory budget says at most: "


def _kv_failure_trace(tmp: Path) -> Path:
    """The recorded H200 start beside the 100.5 GiB process (h200-startup-failure-cuda-oom: its NVML samples, its
    processes, its log), with its log changed in two places: the real 0.26.0 H200 start's budget line (weights 0.04,
    activation peak 0.18, non-torch 0.22, CUDA graphs 0.19 GiB; tests/fixtures/logs/vllm-0.26.0-h200-startup.log)
    after 'Using V2 Model Runner', and vLLM's 'No available memory for the cache blocks' ValueError in place of the
    free-memory check's. Not a real sequence: vLLM 0.26/0.32 log the budget line at the end of warm-up, after the KV
    cache is sized (vllm/v1/worker/gpu_worker.py, compile_or_warm_up_model), so a real failure of this kind comes
    before it. What it tests is the wiring: a budget with the parts beside a neighbour, through the monitor and
    every face. The log index is moved with the bytes (each size at the same line boundary)."""
    import gzip
    import shutil

    out = tmp / "h200-kv-no-memory-beside-hog"
    shutil.copytree(OOM_TRACE, out)
    budget = next(ln for ln in H200_LOG.read_text().splitlines() if "Actual usage is" in ln)
    budget = budget.replace("pid=1048", "pid=2064").replace("11-30 09:55:14", "12-02 05:23:52") + "\n"
    kv = "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when " \
         "initializing the engine."
    old = gzip.decompress((OOM_TRACE / "log.bin.gz").read_bytes()).decode()
    new_parts: list[str] = []
    bounds = [(0, 0)]  # (old offset, new offset) at each line end
    o = n = 0
    for ln in old.splitlines(keepends=True):
        got = ln
        if "ValueError: Free memory on device" in ln:
            got = ln[: ln.index("ValueError:")] + kv + "\n"
        if "Using V2 Model Runner" in ln:
            got = ln + budget
        new_parts.append(got)
        o, n = o + len(ln.encode()), n + len(got.encode())
        bounds.append((o, n))
    (out / "log.bin.gz").write_bytes(gzip.compress("".join(new_parts).encode()))
    rows = [json.loads(r) for r in gzip.decompress((OOM_TRACE / "log-index.jsonl.gz").read_bytes()).splitlines()]
    for r in rows:
        bo, bn = max(b for b in bounds if b[0] <= r["size"])
        assert bo == r["size"], r  # every recorded size is at a line's end
        r["size"] = bn
    (out / "log-index.jsonl.gz").write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    return out


def _first_failure_alert(path: Path):  # type: ignore[no-untyped-def]
    p = open_recording(str(path), config=Config())
    t, alert = p.start, None
    while t < p.end and alert is None:
        t += 1.0
        p.feed_until(t)
        alert = next((a for a in p.monitor.alerts if a.rule == "startup_failure"), None)
    return p, alert


def test_the_startup_failure_fix_quotes_the_budgets_kv_size_on_every_face(tmp_path: Path) -> None:
    """The 35G case through the rule: the real H200 start's parts beside the trace's 100.5 GiB process. The rule's
    fix ends with the budget's own words (MemoryBudget.fit_words: one answer), and the alert on the screen, --once
    --json and doctor (vtop replay --doctor, text and JSON) and the startup panel all say them."""
    import io

    from vtop.faces.headless import replay_doctor
    from vtop.ui.widgets.startup_panel import StartupPanel

    trace = _kv_failure_trace(tmp_path)
    p, alert = _first_failure_alert(trace)
    assert alert is not None and "no GPU memory left for the KV cache" in alert.title
    b = p.monitor.memory_budget()[0]
    assert b.others is not None and [pid for pid, _ in b.others] == [1960]
    # what fits: the free room less the margin less the parts, whole GiB down (35 with these numbers)
    room = b.total_gib - b.others_gib - 0.02 * b.total_gib - (0.04 + 0.18 + 0.22 + 0.19)  # type: ignore[operator]
    words = b.fit_words()
    assert words == f"fits: --gpu-memory-utilization {b.util_fit:.2f} or --kv-cache-memory-bytes {int(room)}G"
    assert int(room) == 35 and b.util_fit == 0.26
    fix = alert.fix[0]
    assert fix.endswith(f" Beside what else holds gpu0 now, {FIT_TAIL}{words}."), fix
    assert fix.startswith("The weights and activations left nothing for the KV cache")  # the kind's own fix first
    assert words in b.text()  # the budget's line: the same words

    p.feed_until(p.end)
    panel = StartupPanel(gpu_activity=lambda t: (None, None), budget=p.monitor.memory_budget)
    panel.view = p.monitor.log_view  # type: ignore[assignment]
    shown = panel.build().plain
    assert f"fix:  {fix}" in shown, shown

    for as_json in (True, False):
        buf = io.StringIO()
        replay_doctor(str(trace), Config(), as_json=as_json, out=buf)
        if as_json:
            rep = json.loads(buf.getvalue())["report"]
            got = next(a for a in rep["alerts"] if a["rule"] == "startup_failure")
            assert got["fix"][0] == fix
            assert words in rep["startup"]["memory_budget"][0]["text"]
            assert rep["startup"]["memory_budget"][0]["kv_cache_memory_bytes_fit"] == b.kv_bytes_fit
        else:
            assert f"    fix: {fix}\n" in buf.getvalue(), buf.getvalue()


def test_the_recorded_trace_keeps_its_fix_without_a_kv_size() -> None:
    """h200-startup-failure-cuda-oom failed at the free-memory check, before profiling: no parts, no KV size, so the
    rule's fix is the failure kind's own words (the utilization from the failure line), nothing of the budget."""
    from vtop.core.rules.startup import failure_words

    p, alert = _first_failure_alert(OOM_TRACE)
    assert alert is not None
    f = p.monitor.log_view.snapshot.failure  # type: ignore[union-attr]
    assert f is not None and f.kind == "gpu_free_at_start"
    assert alert.fix == (failure_words(f).fix,)
    # the kind's fix names the flag among the ways to need less, never a size for it
    assert FIT_TAIL not in alert.fix[0] and not re.search(r"--kv-cache-memory-bytes \d", alert.fix[0])
    assert "--gpu-memory-utilization to 0.26 or less" in alert.fix[0]


def test_the_fix_quotes_the_fullest_gpu_and_none_without_a_kv_size() -> None:
    """Two GPUs beside different neighbours: --kv-cache-memory-bytes is per GPU, so the fix quotes the fullest GPU's
    budget (what fits there fits on each); a version without the flag, or an SGLang start, keeps the fix as it was."""
    from dataclasses import replace

    from vtop.core.membudget import kv_fit
    from vtop.core.phases.types import Failure
    from vtop.core.rules.startup import failure_words

    f = _facts(H200_LOG.read_text().splitlines())
    roomy, full = _failed_budget(f, ((7, 20.0),)), replace(_failed_budget(f, ((9, 100.5),)), gpu=1)
    assert kv_fit([roomy, full]) is full and kv_fit([full, roomy]) is full
    fail = Failure("kv_no_memory", "x", None, None, 0.0)
    plain = failure_words(fail).fix
    fix = failure_words(fail, [roomy, full]).fix
    assert fix == plain + f" Beside what else holds gpu1 (the fullest of 2) now, {FIT_TAIL}{full.fit_words()}."
    for other in (replace(f, version="0.10.2"), replace(f, engine="sglang")):
        b = _failed_budget(other, ((1960, 100.5),))
        assert kv_fit([b]) is None and failure_words(fail, [b]).fix == plain
    # an SGLang budget's fit says SGLang's flag for the memory fraction (the engines' table)
    assert _failed_budget(replace(f, engine="sglang"), ((1960, 100.5),)).fit_words() == "fits: --mem-fraction-static 0.26"
