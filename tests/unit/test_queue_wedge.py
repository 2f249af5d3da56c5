"""``queue_wedge`` (vtop/core/rules/queue.py): running 0, requests waiting, nothing scheduled for
``queue_wedge_s`` -> a wedged queue, with its fix; quiet while a queue drains, while the engine
sleeps, and on every normal trace of the corpus.

The wedge itself could not be caused on the real vLLM CPU server (0.32.0): its scheduler admits a
waiting request as soon as the running ones leave blocks free, and the reported wedges need a
KV-offloading / KV-transfer connector or priority scheduling on a GPU build (vllm#53868: TP=2 on
two RTX 3090s with SimpleCPUOffloadConnector; vllm#45414: TP=4). So the numbers here are a real
CPU payload (cpu-0.32.0-metrics-load-waiting.txt) with running set to 0 and the counters held,
fed on an injected clock, the state those reports show (/metrics: running 0, waiting 3, no
throughput, /health 200).
"""

from __future__ import annotations

import dataclasses

from tests.helpers import diag_fixtures as F
from vtop.core.rules import Thresholds
from vtop.core.rules.alert import RULES

URL = "http://127.0.0.1:8011"


def _session() -> F.Session:
    return F.Session(process=F.cpu_process(), url=URL)


def _feed(ses: F.Session, t0: float, seconds: int, *, running: float, waiting: float, moving: bool,
          by_reason: dict[str, float] | None = None, sleep: bool = False) -> list[list[str]]:
    base = F.fixture_metrics("cpu-0.32.0-metrics-load-waiting.txt")
    asleep = {"awake": 0.0, "weights_offloaded": 1.0, "discard_all": 0.0}  # as vLLM writes POST /sleep?level=1
    if sleep:
        base = F.grow(base, engines=tuple(dataclasses.replace(e, sleep_state=asleep) for e in base.engines))
    out = []
    for i in range(seconds):
        m = F.grow(base, running=running, waiting=waiting, waiting_by_reason=by_reason or {},
                   generation_tokens_total=base.generation_tokens_total + (50.0 * i if moving else 0.0),
                   prompt_tokens_total=base.prompt_tokens_total + (20.0 * i if moving else 0.0),
                   sleep_state=asleep if sleep else base.sleep_state)
        ses.metrics(m, mono=t0 + i)
        out.append([f"{a.severity}:{a.rule}" for a in ses.tick()])
    return out


def test_a_queue_that_waits_with_nothing_running_is_named_after_30_s() -> None:
    ses = _session()
    th = Thresholds()
    t0 = ses.now + 1
    _feed(ses, t0, 20, running=2.0, waiting=0.0, moving=True)  # serving
    t1 = t0 + 20
    seen = _feed(ses, t1, 45, running=0.0, waiting=3.0, moving=False, by_reason={"capacity": 1.0, "deferred": 2.0})
    first = next(i for i, s in enumerate(seen) if "critical:queue_wedge" in s)
    assert th.queue_wedge_s <= first <= th.queue_wedge_s + 1, first
    (a,) = [a for a in ses.tick() if a.rule == "queue_wedge"]
    assert a.title.startswith("Queue wedged on :8011: 3 waiting, nothing running for 4")
    assert "(1 capacity, 2 deferred)" in a.evidence[0]
    assert a.since is not None and abs(a.since - t1) <= 1.0
    assert any("py-spy dump" in f and "Collect first" in f for f in a.fix)
    assert any(f.startswith("Restart the server") for f in a.fix)
    assert "engine_stall" not in {x.rule for x in ses.tick()}  # that rule needs requests running
    assert "queue_wedge" in RULES


def test_a_queue_that_drains_or_an_engine_that_schedules_is_no_wedge() -> None:
    ses = _session()
    t0 = ses.now + 1
    # a burst: the queue waits with requests running, then drains
    seen = _feed(ses, t0, 40, running=4.0, waiting=12.0, moving=True)
    seen += _feed(ses, t0 + 40, 40, running=0.0, waiting=0.0, moving=False)
    # requests waiting, nothing running, but the counters move (prompts taken between scrapes)
    seen += _feed(ses, t0 + 80, 60, running=0.0, waiting=2.0, moving=True)
    assert not any("queue_wedge" in r for s in seen for r in s), seen


def test_an_engine_put_to_sleep_is_no_wedge() -> None:
    ses = _session()
    t0 = ses.now + 1
    seen = _feed(ses, t0, 60, running=0.0, waiting=2.0, moving=False, sleep=True)
    assert not any("queue_wedge" in r for s in seen for r in s)


def test_the_wedge_clears_when_the_queue_moves() -> None:
    ses = _session()
    t0 = ses.now + 1
    seen = _feed(ses, t0, 40, running=0.0, waiting=3.0, moving=False)
    assert "critical:queue_wedge" in seen[-1]
    after = _feed(ses, t0 + 40, 2, running=3.0, waiting=0.0, moving=True)
    assert not any("queue_wedge" in r for r in after[-1])
