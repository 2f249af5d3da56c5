"""Issue 40, the GPU memory budget (vtop/core/membudget.py): vLLM's profiling lines (the table in
vtop/core/phases/patterns.py) with NVML's other processes, one answer for --once --json, the snapshot and the
startup panel; after a start that failed for memory, the --gpu-memory-utilization that fits beside what else
holds the GPU, the same number the startup-failure rule's fix says. Real lines: the H200 starts of vLLM 0.26.0
(tests/fixtures/logs/vllm-0.26.0-h200-startup.log, the demo recording, and the corpus trace
h200-startup-failure-cuda-oom with a 100 GiB process beside it); the 0.32 line is written from vLLM 0.32.0's
source (vllm/v1/worker/gpu_worker.py), the 0.7-0.9 lines as remembered of those versions (no log of them here).
Where the parts line is missing (a real KV cache failure comes before it), everything but the KV cache is vLLM's
budget less its 'Available KV cache memory': checked on the real H200 start, the failures around it hand-made in
the recorded trace (labelled so), and the real CPU traces startup-failure-kv-too-small/-too-large get no KV size."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.helpers.trace_files import first_alert
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
    # nor from an available KV cache: vLLM logged none, though the utilization is known (its 'non-default args')
    facts = p.monitor.log_view.snapshot.facts  # type: ignore[union-attr]
    assert facts.kv_available_gib is None and facts.gpu_memory_utilization == 0.5
    assert b.non_kv_gib is None and b.no_fit is None and b.to_json()["non_kv_gib"] is None


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
    every face."""
    budget = next(ln for ln in H200_LOG.read_text().splitlines() if "Actual usage is" in ln)
    budget = budget.replace("pid=1048", "pid=2064").replace("11-30 09:55:14", "12-02 05:23:52") + "\n"
    return _edited_trace(tmp / "h200-kv-no-memory-beside-hog", [budget], KV_NO_MEMORY)


KV_NO_MEMORY = ("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
                "initializing the engine.")


def _edited_trace(out: Path, after_runner: list[str], failure: str, util: str | None = None) -> Path:
    """h200-startup-failure-cuda-oom with its log edited: ``after_runner`` lines after 'Using V2 Model Runner',
    ``failure`` in place of the free-memory check's ValueError, and where ``util`` is given, that utilization in the
    API server's 'non-default args' line (0.5 recorded). The NVML samples and processes stay the recorded ones. The
    log index is moved with the bytes (each size at the same line boundary)."""
    import gzip
    import shutil

    shutil.copytree(OOM_TRACE, out)
    old = gzip.decompress((OOM_TRACE / "log.bin.gz").read_bytes()).decode()
    new_parts: list[str] = []
    bounds = [(0, 0)]  # (old offset, new offset) at each line end
    o = n = 0
    for ln in old.splitlines(keepends=True):
        got = ln
        if "ValueError: Free memory on device" in ln:
            got = ln[: ln.index("ValueError:")] + failure + "\n"
        if "Using V2 Model Runner" in ln:
            got = ln + "".join(after_runner)
        if util is not None and "non-default args" in ln:
            assert "'gpu_memory_utilization': 0.5}" in ln
            got = ln.replace("'gpu_memory_utilization': 0.5}", f"'gpu_memory_utilization': {util}}}")
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
    return first_alert(path, "startup_failure")


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


# --------------------------------------------------------------------------- everything but the KV cache from the
# "Available KV cache memory" vLLM logs before it sizes the KV cache (the parts line comes after: a real failure
# of the KV cache has none)

WORKER = "(EngineCore pid=2064) INFO 12-02 05:23:52 [gpu_worker.py:560] "


def _available_kv_trace(tmp: Path, avail: str, failure: str, util: str = "0.2") -> Path:
    """HAND-MADE lines in a real recording: h200-startup-failure-cuda-oom (real NVML: the 100.5 GiB process, the
    H200's 140.4 GiB total by NVML) with 'Available KV cache memory: <avail> GiB' written after 'Using V2 Model
    Runner' as vLLM 0.26.0 logs it (the real line of tests/fixtures/logs/vllm-0.26.0-h200-startup.log, another
    number), ``failure`` in place of the free-memory check's ValueError (written from vLLM 0.32.0's
    kv_cache_utils.py), and the 'non-default args' utilization set to ``util``: as a start of a model of about 28
    GiB at --gpu-memory-utilization 0.2 beside that process would fail. No recording has a real one: the only
    memory failure recorded on the H200 is this trace's, at the free-memory check before any profiling."""
    return _edited_trace(tmp / f"h200-available-kv-{avail}", [WORKER + f"Available KV cache memory: {avail} GiB\n"],
                         failure, util=util)


def _need_line(need: str, avail: str) -> str:
    return ("ValueError: To serve at least one request with the model's max seq len (32768), "
            f"({need} GiB KV cache is needed, which is larger than the available KV cache memory ({avail} GiB). "
            "Based on the available memory, the estimated maximum model length is 5461. Try increasing "
            "`gpu_memory_utilization` (which also controls CPU memory on the CPU backend) or decreasing "
            "`max_model_len` when initializing the engine.")


def test_the_available_kv_line_is_the_budget_less_all_else_on_the_real_h200_start() -> None:
    """The real 0.26.0 H200 start, read up to 'Available KV cache memory: 69.45 GiB' (where vLLM had sized the KV
    cache and a failure of it would come): the utilization from the API server's 'non-default args', K from the
    line. vLLM's budget (0.5 x 139.8 = 69.9 GiB) less K is 0.45 GiB, and the parts line logged later says weights
    0.04 + activation peak 0.18 + non-torch 0.22 = 0.44 GiB: the same to the logs' rounding, without the 0.19 GiB
    of CUDA graphs (the V2 runner of 0.26 subtracts no estimate and says none), so the budget keeps room for them."""
    from vtop.core.membudget import GRAPH_MARGIN_GIB, MARGIN, non_kv_of_available

    lines = H200_LOG.read_text().splitlines()
    cut = next(i for i, ln in enumerate(lines) if "Available KV cache memory" in ln) + 1
    f = _facts(lines[:cut])
    assert (f.kv_available_gib, f.gpu_memory_utilization, f.graph_memory_profiled) == (69.45, 0.5, None)
    assert f.weights_gib is None and f.activation_peak_gib is None and f.mem_total_gib is None  # no parts yet
    full = _facts(lines)
    non_kv = non_kv_of_available(0.5 * full.mem_total_gib, f.kv_available_gib)  # type: ignore[operator]
    logged = full.weights_gib + full.activation_peak_gib + full.non_torch_gib  # type: ignore[operator]
    assert abs(non_kv - logged) <= 0.015 and non_kv < logged + full.cuda_graph_gib - 0.1  # type: ignore[operator]

    b = _failed_budget_at(f, 139.8, ((1960, 100.5),))
    assert b.non_kv_gib == pytest.approx(0.45) and b.kv_available_gib == 69.45
    assert b.graph_margin_gib == GRAPH_MARGIN_GIB and "activation peak" not in dict(b.parts)
    room = 139.8 - 100.5 - MARGIN * 139.8 - 0.45 - GRAPH_MARGIN_GIB
    assert b.kv_bytes_fit is not None and room - 1 / 1024 < b.kv_bytes_fit / 2**30 <= room
    assert b.util_fit == util_that_fits(139.8, 100.5 + GRAPH_MARGIN_GIB) == 0.25
    assert b.fit_words() == f"fits: --gpu-memory-utilization 0.25 or --kv-cache-memory-bytes {int(room)}G"


def _failed_budget_at(facts, total, others, kind="kv_no_memory", detail=()):  # type: ignore[no-untyped-def]
    from vtop.core.membudget import _budget, _parts
    from vtop.core.phases.types import Failure

    return _budget(0, total, facts, _parts(facts), others, None, Failure(kind, "x", None, None, 0.0, detail))


def test_the_tracker_reads_a_negative_available_kv_and_whether_vllm_counted_the_cuda_graphs() -> None:
    """vLLM 0.32.0's gpu_worker.py (determine_available_memory): K is format_gib of bytes that may be below 0
    ('-1.25'), the smallest rank's is the one that failed; the CUDA graph profiling line says whether the graphs'
    estimate was subtracted and names the utilization. Lines written from that source (no log of them here)."""
    from dataclasses import replace

    from vtop.core.membudget import GRAPH_MARGIN_GIB, _graph_margin

    w0 = "(Worker_TP0 pid=7) INFO 12-02 05:23:52 [gpu_worker.py:760] "
    w1 = "(Worker_TP1 pid=8) INFO 12-02 05:23:52 [gpu_worker.py:760] "
    on = (w0 + "CUDA graph memory profiling is enabled (default since v0.21.0). The current "
          "--gpu-memory-utilization=0.9000 is equivalent to --gpu-memory-utilization=0.8876 without CUDA graph memory "
          "profiling. To maintain the same effective KV cache size as before, increase --gpu-memory-utilization to "
          "0.9124. To disable, set VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0.")
    f = _facts([w0 + "Available KV cache memory: 0.5 GiB", w1 + "Available KV cache memory: -1.25 GiB", on])
    assert f.kv_available_gib == -1.25 and f.kv_cache_gib == 0.5  # the KV cache's size is never below 0
    assert f.graph_memory_profiled is True and f.gpu_memory_utilization == 0.9 and _graph_margin(f) == 0.0
    off = (w0.replace("INFO", "WARNING") + "CUDA graph memory profiling is disabled "
           "(VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0). Without it, CUDA graph memory is not accounted for during "
           "KV cache allocation, which may require lowering --gpu-memory-utilization to avoid OOM. Consider "
           "re-enabling it (the default as of v0.21.0) and increasing --gpu-memory-utilization from 0.8500 to 0.8600.")
    g = _facts([w0 + "Estimated CUDA graph memory: 0.62 GiB total", w0 + "Available KV cache memory: 0.0 GiB", off])
    assert (g.graph_memory_profiled, g.gpu_memory_utilization, g.kv_available_gib) == (False, 0.85, 0.0)
    assert _graph_margin(g) == 0.62  # its own estimate, not subtracted
    assert _graph_margin(replace(g, graph_memory_profiled=None, graph_memory_estimate_gib=None)) == GRAPH_MARGIN_GIB
    assert _graph_margin(replace(g, graph_memory_profiled=None, enforce_eager=True)) == 0.0  # no graphs captured
    # counted: the KV cache that fits is the margin larger than where the graphs were not
    at_03 = replace(f, gpu_memory_utilization=0.3)
    counted = _failed_budget_at(at_03, 80.0, ((5, 20.0),))
    not_counted = _failed_budget_at(replace(at_03, graph_memory_profiled=None), 80.0, ((5, 20.0),))
    assert counted.non_kv_gib == not_counted.non_kv_gib == pytest.approx(0.3 * 80 + 1.25)
    assert counted.kv_bytes_fit - not_counted.kv_bytes_fit == pytest.approx(GRAPH_MARGIN_GIB * 2**30, abs=2**20)  # type: ignore[operator]


def test_a_kv_no_memory_failure_beside_the_hog_is_sized_from_the_available_kv_on_every_face(tmp_path: Path) -> None:
    """A start at --gpu-memory-utilization 0.2 beside the trace's 100.5 GiB process that logged 'Available KV cache
    memory: -0.5 GiB' and failed with 'No available memory for the cache blocks' (hand-made lines:
    :func:`_available_kv_trace`). No parts line: everything but the KV cache is the budget (0.2 of NVML's total)
    less K, and the fix quotes the KV cache and utilization that fit from it, with the CUDA graphs' margin (the 0.26
    V2 runner counted none). The alert, --once --json, doctor (text and JSON) and the panel say the same words."""
    import io

    from vtop.core.membudget import GRAPH_MARGIN_GIB, MARGIN
    from vtop.faces.headless import replay_doctor
    from vtop.ui.widgets.startup_panel import StartupPanel

    trace = _available_kv_trace(tmp_path, "-0.5", KV_NO_MEMORY)
    p, alert = _first_failure_alert(trace)
    assert alert is not None and "no GPU memory left for the KV cache" in alert.title
    b = p.monitor.memory_budget()[0]
    assert b.total_gib == pytest.approx(140.40, abs=0.01) and b.utilization == 0.2  # NVML's total, the flag
    assert b.others is not None and [pid for pid, _ in b.others] == [1960] and "activation peak" not in dict(b.parts)
    assert b.non_kv_gib == pytest.approx(0.2 * b.total_gib + 0.5) and b.graph_margin_gib == GRAPH_MARGIN_GIB
    room = b.total_gib - b.others_gib - MARGIN * b.total_gib - b.non_kv_gib - GRAPH_MARGIN_GIB  # type: ignore[operator]
    assert b.kv_bytes_fit is not None and room - 1 / 1024 < b.kv_bytes_fit / 2**30 <= room and int(room) == 7
    assert b.util_fit == util_that_fits(b.total_gib, b.others_gib + GRAPH_MARGIN_GIB) == 0.26  # type: ignore[operator]
    words = b.fit_words()
    assert words == "fits: --gpu-memory-utilization 0.26 or --kv-cache-memory-bytes 7G"
    fix = alert.fix[0]
    assert fix.endswith(f" Beside what else holds gpu0 now, {FIT_TAIL}{words}."), fix
    assert "all but the KV cache 28.58 GiB" in b.text() and words in b.text()
    js = p.monitor.startup_extras()["memory_budget"][0]
    assert js["non_kv_gib"] == 28.58 and js["kv_available_gib"] == -0.5 and js["kv_cache_memory_bytes_fit"] == b.kv_bytes_fit

    p.feed_until(p.end)
    panel = StartupPanel(gpu_activity=lambda t: (None, None), budget=p.monitor.memory_budget)
    panel.view = p.monitor.log_view  # type: ignore[assignment]
    shown = panel.build().plain
    assert f"fix:  {fix}" in shown and words in shown, shown
    for as_json in (True, False):
        buf = io.StringIO()
        replay_doctor(str(trace), Config(), as_json=as_json, out=buf)
        if as_json:
            rep = json.loads(buf.getvalue())["report"]
            assert next(a for a in rep["alerts"] if a["rule"] == "startup_failure")["fix"][0] == fix
            assert rep["startup"]["memory_budget"][0]["non_kv_gib"] == 28.58
        else:
            assert f"    fix: {fix}\n" in buf.getvalue(), buf.getvalue()


def test_no_fit_is_proposed_where_none_would_work(tmp_path: Path) -> None:
    """The max_model_len failure names the KV cache one request needs: beside the 100.5 GiB process at most about
    10 GiB fits (everything but the KV cache 26.1 GiB, from 'Available KV cache memory: 2.0 GiB'), so for 12 GiB
    nothing is proposed (the kind's own fix stands, the budget says why) and for 4 GiB the fit is quoted. A model
    whose own use fills what is free gets no fit either (hand-made lines: :func:`_available_kv_trace`)."""
    from vtop.core.rules.startup import failure_words

    p, alert = _first_failure_alert(_available_kv_trace(tmp_path, "2.0", _need_line("12.0", "2.0")))
    assert alert is not None and "cannot hold one request" in alert.title
    f = p.monitor.log_view.snapshot.failure  # type: ignore[union-attr]
    b = p.monitor.memory_budget()[0]
    assert alert.fix == (failure_words(f).fix,) and FIT_TAIL not in alert.fix[0]  # type: ignore[arg-type]
    assert b.kv_bytes_fit is None and b.util_fit is None and b.fit_words() is None
    assert b.no_fit is not None and "holds no request of the full length (12 GiB needed)" in b.no_fit
    assert b.no_fit in b.text() and b.to_json()["no_fit"] == b.no_fit

    p, alert = _first_failure_alert(_available_kv_trace(tmp_path, "2.00", _need_line("4.0", "2.0")))
    b = p.monitor.memory_budget()[0]
    assert alert is not None and b.kv_bytes_fit is not None and b.kv_bytes_fit >= 4 * 2**30 and b.no_fit is None
    # a range: from the utilization that holds one full-length request (0.2 + the 2 GiB it lacked of NVML's 140.4
    # GiB, rounded up) to what fits beside the 100.5 GiB process
    assert b.util_len == 0.22 and b.util_fit == 0.26 and b.to_json()["util_len"] == 0.22
    assert b.fit_words() == "fits: --gpu-memory-utilization 0.22 to 0.26 or --kv-cache-memory-bytes 10G"
    assert alert.fix[0].endswith(f"the memory budget says: {b.fit_words()}.")

    # a start whose own use leaves nothing beside the others (0.5 of the total asked, K below 0)
    p, alert = _first_failure_alert(_available_kv_trace(tmp_path, "-3.0", KV_NO_MEMORY, util="0.5"))
    b = p.monitor.memory_budget()[0]
    assert alert is not None and b.kv_bytes_fit is None and b.util_fit is None and FIT_TAIL not in alert.fix[0]
    assert b.no_fit is not None and b.no_fit.startswith("no KV cache fits beside the others")


@pytest.mark.parametrize("name", ["startup-failure-kv-too-small", "startup-failure-kv-too-large"])
def test_the_cpu_traces_get_no_kv_size_from_the_budget(name: str) -> None:
    """The real CPU vLLM 0.32.0 failures: the CPU worker (vllm/v1/worker/cpu_worker.py, determine_available_memory)
    never logs 'Available KV cache memory', and both starts gave the KV cache's size themselves (kv-too-small:
    --kv-cache-memory-bytes 4194304, 'Explicitly set (0.0/8.84) GiB for KV cache'; kv-too-large: 64 GiB asked of a
    node with 6.91 GiB available), which vLLM takes as it is, from no budget: there is nothing to undo. The fix is
    the kind's own, with no budget's words; the max_model_len line's 'available KV cache memory (0.0 GiB)' is not
    taken for K."""
    from vtop.core.rules.startup import failure_words

    p, alert = _first_failure_alert(ROOT / "corpus" / "traces" / name)
    assert alert is not None
    snap = p.monitor.log_view.snapshot  # type: ignore[union-attr]
    assert snap.failure is not None and snap.facts.kv_available_gib is None
    assert alert.fix == (failure_words(snap.failure).fix,) and FIT_TAIL not in alert.fix[0]
    for b in p.monitor.memory_budget():
        assert b.non_kv_gib is None and b.kv_bytes_fit is None and b.no_fit is None
    if name.endswith("small"):
        assert snap.failure.kind == "max_model_len" and snap.failure.get("avail") == "0.0"
        assert snap.facts.kv_cache_gib == 0.0 and snap.facts.gpu_memory_utilization is None


def test_the_utilization_that_holds_one_full_length_request() -> None:
    """util + (needed - available + 0.02 GiB) / total, rounded up to two decimals; None past the whole GPU."""
    from vtop.core.membudget import util_for_length

    assert util_for_length(0.2, 140.4, 4.0, 2.0) == 0.22  # 0.2144 up
    assert util_for_length(0.5, 100.0, 3.0, 1.0) == 0.53  # 0.5202 up: the 0.02 GiB of rounding counts
    assert util_for_length(0.0042, 139.8, 0.25, 0.12) == 0.01
    assert util_for_length(0.9, 80.0, 40.0, 30.0) is None  # 1.03: no utilization holds it on this GPU
    assert util_for_length(0.9, 0.0, 4.0, 2.0) is None


def test_a_quoted_line_is_cut_at_a_space_never_mid_number() -> None:
    """The real H100 failure line is 460 characters; cut at 300 it said "the estimated maximum model length is 1"
    (of 17488). Quoted lines are cut at a space, with an ellipsis."""
    from vtop.model.fmt import clip

    line = ("(EngineCore pid=946) ERROR 12-05 14:02:55 [core.py:1330] ValueError: To serve at least one request with "
            "the model's max seq len (32768), (0.25 GiB KV cache is needed, which is larger than the available KV "
            "cache memory (0.13 GiB). Based on the available memory, the estimated maximum model length is 17488. "
            "Try increasing `gpu_memory_utilization`")
    cut = clip(line)
    assert len(cut) <= 300 and cut.endswith("…") and line.startswith(cut[:-1])
    assert not cut.endswith("is 1…") and cut[:-1] == line[: len(cut) - 1] and line[len(cut) - 1] == " "
    assert clip("short") == "short"
