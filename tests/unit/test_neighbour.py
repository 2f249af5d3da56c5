"""Issue 40, the GPU beside vLLM (vtop/core/rules/neighbour.py), its logic on synthetic polls and an injected
clock: the H200 server's real /metrics payload with its token counter moved, NVML samples with another process
on the GPU or clocks-event reasons. Its proof needs the H200 (vLLM under steady streaming load while another
process runs large matmuls on the same GPU): no such recording exists yet."""

from __future__ import annotations

import dataclasses

from tests.helpers import diag_fixtures as F
from vtop.core.rules import Alert

OTHER = 4242


def _run(*, rate: float = 9000.0, slow: float = 0.5, running: float = 8.0, running_after: float = 8.0,
         other_from: int | None = 150, other_gib: float = 20.0, throttle: tuple[str, ...] | None = None,
         throttle_from: int = 150, seconds: int = 190) -> dict[int, Alert | None]:
    """A serving H200 for ``seconds``: ``rate`` tokens/s for 150 s, then ``rate * slow``; a stranger process
    on gpu0 from ``other_from`` s on (None: never); ``throttle`` reasons on the GPU from ``throttle_from`` s on."""
    ses = F.Session(process=F.h200_process())
    base = F.fixture_metrics("h200-0.26.0-metrics-burst-running1024.txt")
    gen = base.generation_tokens_total
    out: dict[int, Alert | None] = {}
    t0 = ses.now + 1
    for i in range(seconds):
        after = i >= 150
        gen += rate * (slow if after else 1.0)
        procs = [(F.ENGINE_PID, 70.0)] + ([(OTHER, other_gib)] if other_from is not None and i >= other_from else [])
        s = F.h200_sample(100.0, 60.0, sum(g for _, g in procs), procs)
        if throttle is not None and i >= throttle_from:
            s = dataclasses.replace(s, throttle=throttle)
        ses.gpu(F.gpu_poll(t0 + i, s))
        ses.metrics(F.grow(base, running=running_after if after else running, waiting=0.0, kv_cache_usage=0.3,
                           generation_tokens_total=gen), mono=t0 + i, max_model_len=32768)
        out[i] = next((a for a in ses.tick() if a.rule == "gpu_neighbour"), None)
    return out


def _first(got: dict[int, Alert | None]) -> int | None:
    return next((i for i, a in sorted(got.items()) if a is not None), None)


def test_a_stranger_on_the_gpu_while_the_rate_halves_is_named() -> None:
    got = _run()
    first = _first(got)
    assert first is not None and 155 <= first <= 175, first  # the 30 s window fills with the slow rate
    a = got[first]
    assert a is not None and a.severity == "warning"
    assert f"pid {OTHER}" in a.title and "runs on gpu0" in a.title and "slowed" in a.title, a.title
    ev = "\n".join(a.evidence)
    assert "no vLLM server's process, came during the drop" in ev and "20.0 GiB" in ev, ev
    assert "share of the SMs is not read" in ev
    assert any("CUDA_VISIBLE_DEVICES" in f for f in a.fix)


def test_a_stranger_without_a_slowdown_is_quiet() -> None:
    assert _first(_run(slow=1.0)) is None
    assert _first(_run(slow=0.8)) is None  # down 20 %: under the 30 % line


def test_a_slowdown_with_less_load_is_no_neighbour() -> None:
    assert _first(_run(running_after=4.0)) is None  # half the requests: half the tokens, nothing slowed


def test_a_slowdown_with_the_gpu_alone_and_cool_is_quiet() -> None:
    assert _first(_run(other_from=None)) is None  # another cause (the rules of the engine say it), not a neighbour


def test_a_throttling_gpu_during_the_drop_is_named() -> None:
    got = _run(other_from=None, throttle=("sw-power-cap", "hw-thermal"))
    first = _first(got)
    assert first is not None
    a = got[first]
    assert a is not None and "gpu0 throttles (sw-power-cap)" in a.title, a.title
    assert "gpu0 slows its clocks: sw-power-cap, hw-thermal" in "\n".join(a.evidence)
    assert any("nvidia-smi -q -d PERFORMANCE" in f for f in a.fix)
    assert _first(_run(other_from=None, throttle=("idle", "app-clocks"))) is None  # no slowdown reason


def test_a_gpu_throttling_all_along_did_not_cause_a_later_drop() -> None:
    got = _run(other_from=None, throttle=("sw-power-cap",), throttle_from=0)
    assert _first(got) is None
