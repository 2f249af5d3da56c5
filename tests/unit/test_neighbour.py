"""gpu_neighbour and gpu_slowdown (vtop/core/rules/neighbour.py), and the per-process SM share they
read (NVML's nvmlDeviceGetProcessUtilization through vtop/sources/nvml.py).

The rules are fed a real H200 start (its log up to ready, its /metrics payload) and then synthetic
seconds of serving on an injected clock: vLLM's tokens per running request before and after another
process starts running kernels on the same GPU. The proof on a real GPU (vLLM under load beside a
matmul loop) needs the H200 and is not here.
"""

from __future__ import annotations

import dataclasses

import pynvml

from tests.helpers import diag_fixtures as F
from vtop.clock import FakeClock
from vtop.core.rules import Alert, Thresholds
from vtop.model.gpu import GpuProcess, GpuSample
from vtop.sources.fake_nvml import FakeGpu, FakeNvml
from vtop.sources.nvml import NvmlSource

STRANGER = 5555
GIB = 2**30


def _sample(sm_other: float | None, throttle: tuple[str, ...] = ()) -> GpuSample:
    procs = [GpuProcess(F.ENGINE_PID, int(70 * GIB), 100.0 if sm_other is None else 100.0 - sm_other)]
    if sm_other is not None:
        procs.append(GpuProcess(STRANGER, 8 * GIB, sm_other))
    base = F.h200_sample(100.0, 60.0, 78.0)
    return dataclasses.replace(base, procs=tuple(procs), throttle=throttle)


class Serving:
    """The real H200 start to ready, then one tick a second of a server under steady decode."""

    def __init__(self, thresholds: Thresholds = Thresholds()) -> None:
        lines = F.h200_log_until("Application startup complete.")
        self.ses = F.Session(thresholds, process=F.h200_process(), log=True)
        self.ses.lines(lines)
        self.t = lines[-1][0] + 1
        self.base = F.fixture_metrics("h200-0.26.0-metrics-burst-running1024.txt")
        self.gen = self.base.generation_tokens_total
        self.alerts: list[list[Alert]] = []

    def second(self, *, tok_s: float, running: float = 64.0, sm_other: float | None = None,
               throttle: tuple[str, ...] = ()) -> list[Alert]:
        self.gen += tok_s
        self.ses.gpu(F.gpu_poll(self.t, _sample(sm_other, throttle)))
        m = F.grow(self.base, running=running, waiting=0.0, kv_cache_usage=0.3, generation_tokens_total=self.gen)
        self.ses.metrics(m, mono=self.t, max_model_len=32768)
        a = self.ses.tick(proc_names={STRANGER: "python3 · bob"})
        self.alerts.append(a)
        self.t += 1
        return a

    def run(self, seconds: int, **kw: float | tuple[str, ...] | None) -> list[Alert]:
        a: list[Alert] = []
        for _ in range(seconds):
            a = self.second(**kw)  # type: ignore[arg-type]
        return a


def of(alerts: list[Alert], rule: str) -> Alert | None:
    return next((a for a in alerts if a.rule == rule), None)


def test_a_process_beside_vllm_that_halves_its_tokens_is_named_with_its_share() -> None:
    s = Serving()
    assert of(s.run(90, tok_s=3200.0), "gpu_neighbour") is None
    # the stranger starts: 55 % of the SMs' time, vLLM's rate halves at the same load
    for i in range(19):
        assert of(s.second(tok_s=1600.0, sm_other=55.0), "gpu_neighbour") is None, i
    a = of(s.run(3, tok_s=1600.0, sm_other=55.0), "gpu_neighbour")
    assert a is not None and a.severity == "warning" and a.target == "gpu0"
    assert f"pid {STRANGER} (python3 · bob) at 55 % of the SMs' time" in a.title
    assert "50 % down" in a.title
    ev = "\n".join(a.evidence)
    assert "25.0 tok/s per running request now" in ev and "50.0 in the 59s before" in ev  # the samples' own span
    assert any("CUDA_VISIBLE_DEVICES" in f for f in a.fix)
    # it keeps its identity while it lasts, and clears once the stranger is gone and the rate is back
    since = a.since
    b = of(s.run(30, tok_s=1600.0, sm_other=55.0), "gpu_neighbour")
    assert b is not None and b.since == since and b.key == a.key
    gone = s.run(60, tok_s=3200.0, sm_other=None)
    assert of(gone, "gpu_neighbour") is None


def test_a_neighbour_that_costs_vllm_nothing_is_not_an_alert() -> None:
    s = Serving()
    s.run(90, tok_s=3200.0)
    assert all(of(a, "gpu_neighbour") is None for a in [s.run(60, tok_s=3100.0, sm_other=40.0)])
    assert not any(of(a, "gpu_neighbour") for a in s.alerts)


def test_fewer_tokens_because_fewer_requests_is_no_slowdown() -> None:
    # the load halves (running 64 -> 32) as the stranger starts: tokens per request unchanged
    s = Serving()
    s.run(90, tok_s=3200.0, running=64.0)
    s.run(60, tok_s=1600.0, running=32.0, sm_other=50.0)
    assert not any(of(a, "gpu_neighbour") for a in s.alerts)


def test_a_small_share_below_the_threshold_is_not_a_neighbour() -> None:
    s = Serving()
    s.run(90, tok_s=3200.0)
    s.run(60, tok_s=1600.0, sm_other=5.0)  # a monitoring agent's tiny kernels
    assert not any(of(a, "gpu_neighbour") for a in s.alerts)


def test_a_thermal_slowdown_with_a_drop_is_named_and_idle_clocks_are_not() -> None:
    s = Serving()
    s.run(90, tok_s=3200.0)
    s.run(40, tok_s=3200.0, throttle=("idle", "app-clocks"))  # not a slowdown: nothing
    assert not any(of(a, "gpu_slowdown") for a in s.alerts)
    a = of(s.run(25, tok_s=2000.0, throttle=("sw-thermal", "hw-slowdown")), "gpu_slowdown")
    assert a is not None and a.severity == "warning"
    assert a.title.startswith("gpu0 slowed (sw-thermal, hw-slowdown): :8000 tokens per request 38 % down"), a.title
    assert any("TEMPERATURE" in f for f in a.fix)


def test_a_neighbour_that_comes_40s_into_the_load_is_named_against_those_40s() -> None:
    """The real H100 recording (tests/corpus/traces/h100-neighbour-gpu-bound): the matmuls began 44 s after
    the streams did. The minute before held idle seconds, so it was no rate before; the busy part is."""
    s = Serving()
    s.run(60, tok_s=0.0, running=0.0)  # ready and idle
    s.run(40, tok_s=3200.0)  # the load begins
    a = of(s.run(22, tok_s=1600.0, sm_other=55.0), "gpu_neighbour")
    assert a is not None and "50 % down" in a.title, [x.rule for x in s.alerts[-1]]
    assert "50.0 in the 39s before" in "\n".join(a.evidence)


def test_a_load_that_began_under_20s_before_the_neighbour_has_no_rate_to_compare() -> None:
    s = Serving()
    s.run(60, tok_s=0.0, running=0.0)
    s.run(15, tok_s=3200.0)
    s.run(40, tok_s=1600.0, sm_other=55.0)
    assert not any(of(a, "gpu_neighbour") for a in s.alerts)


def test_a_power_cap_while_a_neighbour_runs_is_the_neighbours_alert_alone() -> None:
    """The real H100 matmul neighbour pushed the card to its power cap: one incident, one alert."""
    s = Serving()
    s.run(90, tok_s=3200.0)
    # the cap shows a second or two before the neighbour's share does (NVML's per-process samples lag)
    s.run(2, tok_s=1600.0, throttle=("sw-power-cap",))
    s.run(25, tok_s=1600.0, sm_other=55.0, throttle=("sw-power-cap",))
    assert not any(of(a, "gpu_slowdown") for a in s.alerts)
    assert of(s.alerts[-1], "gpu_neighbour") is not None
    s.run(25, tok_s=1600.0, throttle=("sw-power-cap",))  # the neighbour gone, the cap still on: the slowdown's
    assert of(s.alerts[-1], "gpu_slowdown") is not None


def test_a_neighbour_there_before_vtop_started_is_not_alerted_without_a_rate_before() -> None:
    s = Serving()
    s.run(120, tok_s=1600.0, sm_other=55.0)
    assert not any(of(a, "gpu_neighbour") for a in s.alerts)


# --------------------------------------------------------------------------- the source


def _src(overrides: dict[str, object]) -> NvmlSource:
    clock = FakeClock()
    fake = FakeNvml([FakeGpu(overrides=overrides)], clock=clock.monotonic)  # type: ignore[arg-type]
    return NvmlSource(fake, clock=clock)


def test_each_process_gets_its_sm_share_and_a_process_without_a_sample_gets_zero() -> None:
    from types import SimpleNamespace

    procs = [SimpleNamespace(pid=4000, usedGpuMemory=70 * GIB), SimpleNamespace(pid=STRANGER, usedGpuMemory=GIB),
             SimpleNamespace(pid=6000, usedGpuMemory=GIB)]
    p = _src({"procs": procs, "proc_util": {4000: 62, STRANGER: 31, 6000: 4294967295}}).poll()
    got = {q.pid: q.sm_util for q in p.gpus[0].procs or ()}
    # 6000's sample is the driver's invalid mark (UINT_MAX): no share read, so 0.0 as "no sample"
    assert got == {4000: 62.0, STRANGER: 31.0, 6000: 0.0}


def test_no_sample_at_all_is_zero_for_everyone_and_an_unsupported_call_is_none_and_said_once() -> None:
    p = _src({"proc_util": {}}).poll()  # NVML_ERROR_NOT_FOUND: no kernel ran since the last read
    assert [q.sm_util for q in p.gpus[0].procs or ()] == [0.0]
    s = _src({"proc_util": pynvml.NVMLError_NotSupported(pynvml.NVML_ERROR_NOT_SUPPORTED)})
    p1, p2 = s.poll(), s.poll()
    assert [q.sm_util for q in p1.gpus[0].procs or ()] == [None]
    assert [q.sm_util for q in p2.gpus[0].procs or ()] == [None]
    notes = p1.notes + p2.notes
    assert sum("per-process utilization" in n for n in notes) == 1, notes


def test_the_share_travels_in_recordings_and_old_recordings_read_as_unknown() -> None:
    g = _sample(30.0)
    back = GpuSample.from_json(g.to_json())
    assert back.procs == g.procs and back.procs is not None and back.procs[1].sm_util == 30.0
    old = g.to_json()
    old["procs"] = [[q[0], q[1]] for q in old["procs"]]  # as recorded before the share existed
    assert [q.sm_util for q in GpuSample.from_json(old).procs or ()] == [None, None]
