"""Issue #29's families on real recorded payloads (tests/fixtures/vllm/signals/, the vLLM 0.32.0 CPU
build) and, for the names of other versions, on lines written from vLLM's source (each says so):
parse, window, rules (spec_decode_low; a sleeping engine is no stall), XID events named in a stall."""

from __future__ import annotations

import dataclasses
import json
import lzma
from pathlib import Path

import pytest

from tests.helpers import diag_fixtures as F
from vtop.clock import FakeClock
from vtop.core.rules import Alert, Thresholds
from vtop.core.server import ServerTracker, sleep_level
from vtop.model.gpu import XID_MEANINGS, xid_text
from vtop.sources.codec import metrics_from_json, metrics_to_json
from vtop.sources.fake_nvml import FakeGpu, FakeNvml
from vtop.sources.metrics_text import parse_vllm_metrics
from vtop.sources.nvml import NvmlSource
from vtop.sources.vllm import poll_from_body

SIG = Path(__file__).resolve().parent.parent / "fixtures" / "vllm" / "signals"
VLLM = SIG.parent


def payload(scenario: str, which: str) -> str:
    return (SIG / scenario / f"metrics-{which}.txt").read_text()


def metrics(scenario: str, which: str):  # type: ignore[no-untyped-def]
    m = parse_vllm_metrics(payload(scenario, which))
    assert m.is_vllm and not m.problems, m.problems
    assert metrics_from_json(json.loads(json.dumps(metrics_to_json(m)))) == m  # recordings keep every field
    return m


def timeline(scenario: str) -> list[dict]:  # type: ignore[type-arg]
    with lzma.open(SIG / scenario / "metrics-timeline.jsonl.xz", "rt") as f:
        return [json.loads(x) for x in f]


# --------------------------------------------------------------------------- parsing, family by family


def test_spec_decode_counters_from_the_real_ngram_run() -> None:
    m = metrics("spec-prefix", "after")
    assert (m.spec_drafts_total, m.spec_draft_tokens_total, m.spec_accepted_tokens_total) == (3216, 9312, 8724)
    assert m.spec_accepted_per_pos == {"0": 3048, "1": 2892, "2": 2784}
    idle = metrics("spec-prefix", "idle")  # the family is there from the start, at zero: present, not absent
    assert idle.spec_draft_tokens_total == 0 and idle.spec_drafts_total == 0
    # vLLM's own log line of that run says the same: 8724 accepted of 9312, per position 0.948, 0.899, 0.866
    log = (SIG / "spec-prefix" / "log-lines.txt").read_text()
    assert "Accepted: 8724 tokens, Drafted: 9312 tokens" in log
    assert [round(v / m.spec_drafts_total, 3) for v in m.spec_accepted_per_pos.values()] == [0.948, 0.899, 0.866]
    for other in (metrics("lora", "load"), F.fixture_metrics("cpu-0.32.0-metrics-load.txt")):
        assert other.spec_draft_tokens_total is None and other.spec_accepted_per_pos == {}  # absent, not zero


def test_spec_decode_v0_names_without_num_drafts() -> None:
    """V0 (<= 0.8; written from the reference, never served here): the token counters share V1's names,
    no ``num_drafts`` and no positions; the lifetime acceptance-rate gauge is not read."""
    text = (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{model_name="m"} 1.0\n'
        'vllm:spec_decode_draft_acceptance_rate{model_name="m"} 0.5\n'
        'vllm:spec_decode_num_draft_tokens_total{model_name="m"} 400.0\n'
        'vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 100.0\n'
        'vllm:spec_decode_num_emitted_tokens_total{model_name="m"} 150.0\n'
    )
    m = parse_vllm_metrics(text)
    assert (m.spec_drafts_total, m.spec_draft_tokens_total, m.spec_accepted_tokens_total) == (None, 400, 100)
    clock = FakeClock()
    tr = ServerTracker("http://h:1", clock=clock)
    for i in range(3):
        mm = dataclasses.replace(m, spec_draft_tokens_total=400.0 + 100 * i, spec_accepted_tokens_total=100.0 + 10 * i)
        tr.feed(poll_from_body("http://h:1", b"x", t=clock.time(), mono=clock.monotonic(), latency_s=0.01, metrics=mm))
        clock.advance(1)
    sp = tr.view().spec
    assert sp is not None and sp.acceptance == pytest.approx(0.1) and sp.mean_len is None and sp.per_pos == ()


def test_prefix_cache_counters_across_names() -> None:
    m = metrics("spec-prefix", "after")
    assert (m.prefix_cache_queries_total, m.prefix_cache_hits_total) == (13356, 12032)
    assert m.prompt_tokens_by_source == {"local_compute": 1324, "local_cache_hit": 12032, "external_kv_transfer": 0}
    # 0.9.2-0.10 serve both pairs (the same numbers): the new one is read, not the two summed
    both_text = (VLLM / "written" / "v1-0.9.2-metrics.txt").read_text()
    assert "vllm:gpu_prefix_cache_queries_total" in both_text
    both = parse_vllm_metrics(both_text)
    assert (both.prefix_cache_queries_total, both.prefix_cache_hits_total) == (40000, 12000)
    newer = parse_vllm_metrics(both_text.replace('vllm:prefix_cache_hits_total{engine="0",model_name="Qwen/Qwen2.5-7B'
                                                 '-Instruct"} 12000.0', 'vllm:prefix_cache_hits_total{engine="0",'
                                                 'model_name="Qwen/Qwen2.5-7B-Instruct"} 13000.0'))
    assert newer.prefix_cache_hits_total == 13000
    old = parse_vllm_metrics(  # 0.7.3-0.10's names only (reference §1; not served here)
        '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="0",model_name="m"} 0.0\n'
        'vllm:gpu_prefix_cache_queries_total{engine="0",model_name="m"} 40000.0\n'
        'vllm:gpu_prefix_cache_hits_total{engine="0",model_name="m"} 12000.0\n')
    assert (old.prefix_cache_queries_total, old.prefix_cache_hits_total) == (40000, 12000)
    assert old.prompt_tokens_by_source == {}  # 0.20+ only: absent


def test_cache_config_info_labels() -> None:
    for m, blocks, bs, util in ((metrics("spec-prefix", "idle"), "4096", "128", "0.92"),
                                (F.fixture_metrics("h200-0.26.0-metrics-idle.txt"), None, "16", "0.5")):
        cc = dict(m.cache_config or ())
        assert cc["block_size"] == bs and cc["gpu_memory_utilization"] == util and "engine" not in cc
        if blocks:
            assert cc["num_gpu_blocks"] == blocks and cc["enable_prefix_caching"] == "True"
    assert parse_vllm_metrics((VLLM / "written" / "v1-0.9.2-metrics.txt").read_text()).cache_config is None


def test_lora_requests_info_newest_series_wins() -> None:
    load, after = metrics("lora", "load"), metrics("lora", "after")
    assert (load.lora_running, load.lora_waiting, load.lora_max) == (("tiny-lora",), ("tiny-lora",), 2)
    assert (after.lora_running, after.lora_waiting, after.lora_max) == ((), (), 2)  # none now: not absent
    assert metrics("spec-prefix", "load").lora_running is None  # no --enable-lora: absent
    two = parse_vllm_metrics(
        '# TYPE vllm:lora_requests_info gauge\n'
        'vllm:lora_requests_info{max_lora="4",running_lora_adapters="a,b",waiting_lora_adapters="c"} 20.0\n'
        'vllm:lora_requests_info{max_lora="4",running_lora_adapters="a",waiting_lora_adapters=""} 10.0\n'
        'vllm:num_requests_running{engine="0",model_name="m"} 2.0\n')
    assert (two.lora_running, two.lora_waiting, two.lora_max) == (("a", "b"), ("c",), 4)


def test_engine_sleep_state_recorded_awake_and_sleeping_levels_from_source() -> None:
    m = metrics("lora", "after")
    assert m.sleep_state == {"awake": 1, "weights_offloaded": 0, "discard_all": 0} and sleep_level(m) == 0
    text = payload("lora", "after")
    # Sleeping values as vLLM's source writes them (record_sleep_state): the CPU build refuses sleep mode.
    assert "Sleep mode is not supported on current platform" in (SIG / "sleep" / "log-lines.txt").read_text()
    awake = 'sleep_state="awake"} 1.0'
    assert awake in text
    lvl1 = text.replace(awake, 'sleep_state="awake"} 0.0').replace(
        'sleep_state="weights_offloaded"} 0.0', 'sleep_state="weights_offloaded"} 1.0')
    lvl2 = text.replace(awake, 'sleep_state="awake"} 0.0').replace(
        'sleep_state="discard_all"} 0.0', 'sleep_state="discard_all"} 1.0')
    assert sleep_level(parse_vllm_metrics(lvl1)) == 1 and sleep_level(parse_vllm_metrics(lvl2)) == 2
    assert sleep_level(parse_vllm_metrics((VLLM / "written" / "v0-0.6-metrics.txt").read_text())) is None


def test_http_requests_by_status_and_queue_time() -> None:
    m = metrics("spec-prefix", "after")
    assert m.http_requests_by_status == {"2xx": 49}  # 48 completions + 1 /v1/models, summed over handlers
    assert len(m.engines) == 1  # no engine row made of the API server's family
    assert m.request_queue_time_seconds is not None and m.request_queue_time_seconds.count == 48
    only_http = parse_vllm_metrics('http_requests_total{handler="/x",method="GET",status="5xx"} 3.0\n')
    assert not only_http.is_vllm  # a FastAPI app's family alone is not vLLM


# --------------------------------------------------------------------------- the window (ServerTracker)


def feed_timeline(scenario: str) -> ServerTracker:
    rows = timeline(scenario)
    t0 = rows[0]["t"]
    clock = FakeClock(start=1000.0)
    tr = ServerTracker("http://127.0.0.1:8000", clock=clock, window_s=60.0)
    for r in rows:
        clock.advance(r["t"] - t0 + 1000.0 - clock.monotonic())
        m = parse_vllm_metrics(r["text"])
        tr.feed(poll_from_body(tr.url, r["text"].encode(), t=r["t"], mono=clock.monotonic(), latency_s=0.01,
                               metrics=m))
    return tr


def test_window_over_the_real_spec_and_prefix_timeline() -> None:
    v = feed_timeline("spec-prefix")
    first, last = (parse_vllm_metrics(r["text"]) for r in (timeline("spec-prefix")[0], timeline("spec-prefix")[-1]))
    sp = v.view().spec
    assert sp is not None and sp.draft_tokens == last.spec_draft_tokens_total - first.spec_draft_tokens_total  # type: ignore[operator]
    assert 0.9 < sp.acceptance < 0.98  # type: ignore[operator]
    assert 3.5 < sp.mean_len < 3.9 and len(sp.per_pos) == 3 and sp.per_pos[0] > sp.per_pos[2]  # type: ignore[operator]
    view = v.view()
    assert view.prefix_hit_rate is not None and view.prefix_hit_rate > 0.8
    assert view.prompt_by_source is not None and view.prompt_by_source["local_cache_hit"] > 0
    assert view.queue.p50 is not None and view.queue.p99 is not None and view.queue.count
    assert view.http_ps is not None and view.http_ps > 0 and view.http_5xx_ps == 0
    assert view.sleep_level == 0
    low = feed_timeline("spec-random").view().spec
    assert low is not None and low.acceptance is not None and low.acceptance < 0.02 and low.draft_tokens > 1000  # type: ignore[operator]
    plain = feed_timeline("lora").view()
    assert plain.spec is None and plain.http_5xx_ps == 0


# --------------------------------------------------------------------------- rules


def spec_session(scenario: str, seconds: int, sleep: bool = False) -> list[list[Alert]]:
    """The recorded server's counters growing at the rates its load had, every second for ``seconds``."""
    a, b = metrics(scenario, "idle"), metrics(scenario, "after")
    assert b.spec_draft_tokens_total and b.spec_drafts_total is not None and b.spec_accepted_tokens_total is not None
    per_s = 1 / 20  # ~20 s of load recorded: the counters' growth per second of it
    ses = F.Session(process=F.cpu_process(), url="http://127.0.0.1:8011")
    out = []
    for i in range(seconds):
        m = F.grow(a, running=4.0, generation_tokens_total=100.0 * i, prompt_tokens_total=50.0 * i,
                   request_success_total={"length": float(i // 2)},
                   spec_drafts_total=b.spec_drafts_total * per_s * i,
                   spec_draft_tokens_total=b.spec_draft_tokens_total * per_s * i,
                   spec_accepted_tokens_total=b.spec_accepted_tokens_total * per_s * i,
                   sleep_state={"awake": 0.0, "weights_offloaded": 1.0, "discard_all": 0.0} if sleep else a.sleep_state,
                   engines=tuple(dataclasses.replace(e, sleep_state={"awake": 0.0, "weights_offloaded": 1.0})
                                 if sleep else e for e in a.engines))
        ses.metrics(m, mono=F.R.BASE + i, max_model_len=2048, version="0.32.0")
        out.append(ses.tick())
    return out


def test_spec_decode_low_fires_after_minutes_of_near_zero_acceptance() -> None:
    th = Thresholds()
    out = spec_session("spec-random", int(th.spec_low_s) + 30)
    assert not any(a.rule == "spec_decode_low" for a in out[int(th.spec_low_s) - 5])
    (alert,) = [a for a in out[-1] if a.rule == "spec_decode_low"]
    assert alert.severity == "warning" and alert.title.startswith("Speculative decoding on :8011 is not paying: 0.0 %")
    ev = "\n".join(alert.evidence)
    assert "draft tokens proposed" in ev and "mean acceptance length 1.00" in ev
    assert any("--speculative-config" in f for f in alert.fix)


def test_spec_decode_low_quiet_when_drafts_pay_or_the_engine_sleeps() -> None:
    assert not any(a.rule == "spec_decode_low" for al in spec_session("spec-prefix", 240) for a in al)
    assert not any(a.rule == "spec_decode_low" for al in spec_session("spec-random", 240, sleep=True) for a in al)


def frozen(seconds: int, *, sleeping: bool, xid_at: float | None = None, xid: int = 79,
           moving_s: int = 0) -> list[list[Alert]]:
    """A real payload (running 8) whose counters move for ``moving_s`` seconds, then freeze; GPU 0
    polled through vtop's NVML source with a fake event source, which raises XID ``xid`` at second ``xid_at``."""
    m = F.fixture_metrics("cpu-0.32.0-metrics-load.txt")
    if sleeping:
        m = F.grow(m, sleep_state={"awake": 0.0, "weights_offloaded": 1.0, "discard_all": 0.0},
                   engines=tuple(dataclasses.replace(e, sleep_state={"awake": 0.0, "weights_offloaded": 1.0,
                                                                     "discard_all": 0.0}) for e in m.engines))
    ses = F.Session(process=F.cpu_process(), url="http://127.0.0.1:8011")
    fake = FakeNvml([FakeGpu()], clock=ses.clock.monotonic)
    src = NvmlSource(fake, clock=ses.clock)
    out = []
    for i in range(seconds):
        k = min(i, moving_s)
        mi = F.grow(m, generation_tokens_total=m.generation_tokens_total + 50.0 * k,  # type: ignore[operator]
                    prompt_tokens_total=m.prompt_tokens_total + 20.0 * k) if moving_s else m  # type: ignore[operator]
        ses.metrics(mi, mono=F.R.BASE + i, max_model_len=2048, version="0.32.0")
        if xid_at is not None and i == xid_at:
            fake.inject_xid(0, xid)
        ses.gpu(src.poll())
        out.append(ses.tick())
    return out


def test_a_sleeping_engine_is_not_a_stalled_one() -> None:
    assert any(a.rule == "engine_stall" for a in frozen(40, sleeping=False)[-1])
    assert not any(a.rule == "engine_stall" for al in frozen(40, sleeping=True) for a in al)


def test_engine_stall_names_the_xid_on_its_gpu_with_its_meaning() -> None:
    out = frozen(40, sleeping=False, xid_at=10)
    (a,) = [x for x in out[-1] if x.rule == "engine_stall"]
    assert a.title == "Engine stalled on :8011: 8 running, no token for 39s; XID 79 on gpu0"
    line = next(e for e in a.evidence if "XID" in e)
    assert line.startswith("gpu0: XID 79 (GPU has fallen off the bus") and line.endswith("(NVML XID event)")
    assert "XID" in a.fix[0] and "dmesg" in a.fix[0]
    # an XID more than a minute before the stall began is not "the same minute"
    early = frozen(130, sleeping=False, xid_at=1, xid=48, moving_s=90)
    (b,) = [x for x in early[-1] if x.rule == "engine_stall"]
    assert "XID" not in b.title and not any("XID" in e for e in b.evidence)


def test_xid_table_covers_the_common_numbers() -> None:
    for n in (13, 31, 43, 45, 48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120):
        assert n in XID_MEANINGS and xid_text(n).startswith(f"XID {n} (")
    assert xid_text(7) == "XID 7 (see NVIDIA's XID catalogue)"


def test_engine_death_names_the_xid_on_its_gpu_in_the_same_minute() -> None:
    """An engine that dies 20 s after an XID 79 on its box: the death alert says so, with the meaning;
    the same death with the XID 5 minutes earlier does not."""

    def died(xid_before_s: float) -> Alert:
        ses = F.Session(url="http://127.0.0.1:8011", log=True, start=F.R.BASE - 400)
        fake = FakeNvml([FakeGpu()], clock=ses.clock.monotonic)
        src = NvmlSource(fake, clock=ses.clock)
        t0 = F.R.BASE
        ses.lines([(t0 - 399, "(APIServer pid=1) INFO 05-01 10:00:00 [api_server.py:1] vLLM API server version 0.32.0"),
                   (t0 - 398, "(APIServer pid=1) INFO:     Application startup complete.")])
        ses.gpu(src.poll())
        ses.to(t0 - xid_before_s)
        fake.inject_xid(0, 79)
        ses.gpu(src.poll())
        ses.to(t0)
        ses.lines([(t0, "(APIServer pid=1) ERROR 05-01 10:09:00 [utils.py:1] Engine core process EngineCore_DP0 "
                        "died unexpectedly.")])
        ses.gpu(src.poll())
        (a,) = [x for x in ses.tick() if x.rule == "engine_died"]
        return a

    a = died(20.0)
    assert a.title.endswith("; XID 79 on gpu0"), a.title
    assert any(e.startswith("gpu0: XID 79 (GPU has fallen off the bus") for e in a.evidence)
    assert "nvidia-smi -q" in a.fix[0]
    b = died(300.0)
    assert "XID" not in b.title and not any("XID" in e for e in b.evidence)


def test_kv_offload_bytes_from_source_names() -> None:
    """The CPU build refuses KV offload (recorded: tests/fixtures/vllm/signals/kv-offload); the counters'
    names are vLLM 0.32's (offloading/metrics.py), written here: store/load bytes, summed over labels."""
    from vtop.ui.widgets.server_panel import signal_lines

    log = (SIG / "kv-offload" / "log-lines.txt").read_text()
    assert "CPU Offloading is currently only supported on CUDA-alike and XPU GPUs" in log

    def text(store: float, load: float) -> str:
        return ("# TYPE vllm:num_requests_running gauge\n"
                'vllm:num_requests_running{engine="0",model_name="m"} 1.0\n'
                f'vllm:kv_offload_store_bytes_total{{engine="0",model_name="m"}} {store}\n'
                f'vllm:kv_offload_load_bytes_total{{engine="0",model_name="m"}} {load}\n')

    m = parse_vllm_metrics(text(1e9, 5e8))
    assert (m.kv_offload_store_bytes_total, m.kv_offload_load_bytes_total) == (1e9, 5e8)
    assert metrics("spec-prefix", "after").kv_offload_store_bytes_total is None  # off: absent
    clock = FakeClock()
    tr = ServerTracker("http://h:1", clock=clock)
    for i in range(11):
        mm = parse_vllm_metrics(text(1e9 + 2e8 * i, 5e8 + 1e7 * i))
        tr.feed(poll_from_body("http://h:1", b"x", t=clock.time(), mono=clock.monotonic(), latency_s=0.01, metrics=mm))
        clock.advance(1)
    v = tr.view()
    assert v.offload_store_bps == pytest.approx(2e8) and v.offload_load_bps == pytest.approx(1e7)
    rows = ["".join(r[0] for r in row) for row in signal_lines(v, 100, True)]
    assert "KV offload: store 200.0 MB/s · load 10.0 MB/s" in rows
    assert feed_timeline("lora").view().offload_store_bps is None
