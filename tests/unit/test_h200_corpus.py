"""The runtime-OOM scenario of tools/device/h200_corpus.py, without a GPU: the large-vocabulary copy of the model
that it serves (made here on a hand-built checkpoint, and loaded with the real safetensors where this box has it),
the serve script pointed at the copy, the engine's death as the recorder sees it, and what the trace's truth
says for each outcome (a runtime OOM, no OOM: a normal trace, a failed start)."""

from __future__ import annotations

import http.server
import json
import math
import os
import shutil
import struct
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tools.corpus import record as R
from tools.device import h200_corpus as H

HIDDEN, OLD, NEW = 8, 50, 200


def bf16(values: list[float]) -> bytes:
    return b"".join(struct.pack("<f", v)[2:] for v in values)


def from_bf16(data: bytes) -> list[float]:
    return [struct.unpack("<f", b"\0\0" + data[i:i + 2])[0] for i in range(0, len(data), 2)]


def read_st(path: Path) -> tuple[dict[str, Any], bytes]:
    """A safetensors file read with struct and json only (independent of the code under test)."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def tensor(header: dict[str, Any], buf: bytes, name: str) -> bytes:
    a, b = header[name]["data_offsets"]
    return buf[a:b]


@pytest.fixture
def model(tmp_path: Path) -> Path:
    """A checkpoint as make_tiny.py saves one: config, tokenizer files, one safetensors file whose tensors are
    stored out of name order (lm_head last, the norm between), with the metadata safetensors writes."""
    src = tmp_path / "tiny"
    src.mkdir()
    cfg = {"architectures": ["LlamaForCausalLM"], "vocab_size": OLD, "hidden_size": HIDDEN,
           "initializer_range": 0.02, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    (src / "config.json").write_text(json.dumps(cfg))
    (src / "tokenizer.json").write_text('{"model": {"vocab": {"a": 0}}}')
    (src / "tokenizer_config.json").write_text('{"model_max_length": 32768}')
    embed = bf16([(i % 7) / 10 for i in range(OLD * HIDDEN)])
    norm = bf16([1.0] * HIDDEN)
    head = bf16([-(i % 5) / 10 for i in range(OLD * HIDDEN)])
    parts = [("model.embed_tokens.weight", [OLD, HIDDEN], embed), ("model.norm.weight", [HIDDEN], norm),
             ("lm_head.weight", [OLD, HIDDEN], head)]
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    pos = 0
    for name, shape, data in parts:
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [pos, pos + len(data)]}
        pos += len(data)
    head_json = json.dumps(header).encode()
    with open(src / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(head_json)) + head_json + b"".join(d for _, _, d in parts))
    return src


def test_the_copy_has_the_large_vocabulary_and_keeps_everything_else(model: Path, tmp_path: Path) -> None:
    dst = tmp_path / "tiny-v200"
    made = H.resize_vocab(model, dst, NEW)
    assert made["vocab_from"] == OLD and made["vocab_to"] == NEW and made["reused"] is False
    assert made["tensors"] == {"model.embed_tokens.weight": [[OLD, HIDDEN], [NEW, HIDDEN]],
                               "lm_head.weight": [[OLD, HIDDEN], [NEW, HIDDEN]]}
    cfg_old, cfg_new = (json.loads((d / "config.json").read_text()) for d in (model, dst))
    assert cfg_new == {**cfg_old, "vocab_size": NEW}
    for name in ("tokenizer.json", "tokenizer_config.json"):  # the same tokenizer: ids >= OLD are never produced
        assert (dst / name).read_bytes() == (model / name).read_bytes()
    h0, b0 = read_st(model / "model.safetensors")
    h1, b1 = read_st(dst / "model.safetensors")
    assert h1["__metadata__"] == {"format": "pt"}
    assert h1["model.norm.weight"]["shape"] == [HIDDEN]
    assert tensor(h1, b1, "model.norm.weight") == tensor(h0, b0, "model.norm.weight")
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        assert h1[name]["shape"] == [NEW, HIDDEN] and h1[name]["dtype"] == "BF16"
        new = tensor(h1, b1, name)
        assert len(new) == NEW * HIDDEN * 2
        assert new[:OLD * HIDDEN * 2] == tensor(h0, b0, name)  # the old rows, byte for byte
        added = from_bf16(new[OLD * HIDDEN * 2:])
        assert all(math.isfinite(x) for x in added)
        std = math.sqrt(sum(x * x for x in added) / len(added))
        assert 0.015 < std < 0.025  # N(0, initializer_range)
        assert len({round(x, 6) for x in added}) > 100  # random, not a constant
    # the buffer is indexed whole and without holes, as safetensors requires
    spans = sorted(v["data_offsets"] for k, v in h1.items() if k != "__metadata__")
    assert spans[0][0] == 0 and spans[-1][1] == len(b1)
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
    assert (8 + len(json.dumps(h1, separators=(",", ":")).encode())) <= (dst / "model.safetensors").stat().st_size
    assert not dst.with_name(dst.name + ".part").exists()


def test_a_copy_made_before_is_kept_and_a_smaller_vocabulary_refused(model: Path, tmp_path: Path) -> None:
    dst = tmp_path / "tiny-v200"
    H.resize_vocab(model, dst, NEW)
    st = (dst / "model.safetensors").stat().st_mtime_ns
    again = H.resize_vocab(model, dst, NEW)
    assert again["reused"] is True and (dst / "model.safetensors").stat().st_mtime_ns == st
    other = H.resize_vocab(model, dst, NEW + 8)  # another size: made again
    assert other["reused"] is False and json.loads((dst / "config.json").read_text())["vocab_size"] == NEW + 8
    with pytest.raises(ValueError, match="larger than"):
        H.resize_vocab(model, tmp_path / "small", OLD - 1)


def test_the_gpu_size_arithmetic() -> None:
    """The numbers the scenario's docstring and README-corpus.md give for the tiny model on the GPU machine."""
    assert H.GPU_PARAMS["oom_vocab"] == 151936 and H.GPU_PARAMS["oom_prompt_tokens"] == 30000
    v, n, hidden = 151936, 30000 - 1, 512
    gib = 2**30
    assert round(n * v * 2 / gib, 2) == 8.49 and round(n * v * 4 / gib, 2) == 16.98
    assert round(n * v * 6 / gib, 1) == 25.5 and round(n * v * 10 / gib, 1) == 42.4
    assert round(1024 * v * 6 / 1e9, 1) == 0.9  # the V2 runner's chunk of 1,024 rows
    assert round(30000 * 8000 * 6 / 1e9, 1) == 1.4  # the 8,000-token vocabulary
    h100, h200 = 0.03 * 79.18, 0.03 * 139.8  # what 0.97 leaves (GiB), before the profiled peak
    assert round(h100, 1) == 2.4 and round(h200, 1) == 4.2
    peak = 4.0  # a generous profiled peak: the sampler's warm-up on 1,024 rows of 151,936
    assert n * v * 6 / gib > 3 * (h100 + peak) and n * v * 6 / gib > 3 * (h200 + peak)
    grown = 2 * (v - 8000) * hidden * 2  # the embedding and lm_head of the copy
    assert round(grown / 1e6) == 295


@pytest.mark.skipif(not Path("/tmp/vllmcpu/bin/python").exists() or not Path("/tmp/tinyllama/config.json").exists(),
                    reason="the real-tier box's vLLM CPU venv (safetensors, torch) and /tmp/tinyllama are not here")
def test_the_real_safetensors_loads_a_copy_of_a_real_checkpoint(tmp_path: Path) -> None:
    src = tmp_path / "tinyllama"
    shutil.copytree("/tmp/tinyllama", src)
    dst = tmp_path / "tinyllama-v9000"
    H.resize_vocab(src, dst, 9000)
    code = (
        "import sys, json, torch\nfrom safetensors import safe_open\n"
        "a = safe_open(sys.argv[1], 'pt'); b = safe_open(sys.argv[2], 'pt'); out = {}\n"
        "for k in a.keys():\n"
        "    x, y = a.get_tensor(k), b.get_tensor(k)\n"
        "    out[k] = [list(y.shape), str(y.dtype), torch.equal(x, y[:x.shape[0]]), bool(torch.isfinite(y.float()).all())]\n"
        "print(json.dumps(out))\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run(["/tmp/vllmcpu/bin/python", "-c", code, str(src / "model.safetensors"),
                        str(dst / "model.safetensors")], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    hidden = json.loads((src / "config.json").read_text())["hidden_size"]
    assert out["model.embed_tokens.weight"] == [[9000, hidden], "torch.bfloat16", True, True]
    assert out["lm_head.weight"] == [[9000, hidden], "torch.bfloat16", True, True]
    assert all(v[2] and v[3] for v in out.values())


def test_the_serve_script_serves_the_copy(tmp_path: Path) -> None:
    recipe = tmp_path / "serve.sh"  # the two places the shared recipe's serve.sh names its model
    recipe.write_text('[ -x /tmp/site/bin/vllm ] && [ -f /tmp/tiny/config.json ] || exit 2\n'
                      'CMD=(/tmp/site/bin/vllm serve /tmp/tiny --host 127.0.0.1 --port "$PORT"\n'
                      '     --max-model-len 32768 --gpu-memory-utilization 0.5 "$@")\n'
                      'echo /tmp/tinyllama /tmp/tiny.bak\n')
    out = Path(H.serve_script_for(Path("/tmp/tiny-v151936"), tmp_path, str(recipe), Path("/tmp/tiny")))
    text = out.read_text()
    assert "vllm serve /tmp/tiny-v151936 --host" in text and "[ -f /tmp/tiny-v151936/config.json ]" in text
    assert "echo /tmp/tinyllama /tmp/tiny.bak" in text  # other names that begin the same are left alone
    assert recipe.read_text().count("/tmp/tiny ") == 1  # the recipe itself untouched
    cpu = Path(H.__file__).with_name("cpu_serve.sh")  # the dry run's stand-in names its default model
    out2 = Path(H.serve_script_for(Path("/tmp/tinyllama-v32000"), tmp_path, str(cpu), Path("/tmp/tinyllama")))
    assert "${VTOP_VLLM_MODEL:-/tmp/tinyllama-v32000}" in out2.read_text()
    with pytest.raises(R.ServerFailed, match="does not name"):
        H.serve_script_for(Path("/x-v1"), tmp_path, str(recipe), Path("/opt/model"))


# --- the engine's death --------------------------------------------------------------------


class _Srv:
    def __init__(self, url: str, pid: int) -> None:
        self.url, self.pid = url, pid

    def is_running(self) -> bool:
        return H._alive(self.pid)


class _Ctx:
    def __init__(self, srv: _Srv, engines: list[int]) -> None:
        self.srv, self._engines = srv, engines
        self.events: list[dict[str, Any]] = []

    def engine(self, timeout: float = 10.0) -> list[int]:
        return self._engines

    def event(self, what: str, **kw: Any) -> dict[str, Any]:
        ev = {"t": time.time(), "what": what, **kw}
        self.events.append(ev)
        return ev


def _health_server(mode: str) -> tuple[http.server.HTTPServer, str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            if mode == "hang":
                time.sleep(3.0)  # longer than the watch's 2 s deadline: a busy API server
            self.send_response(503 if mode == "503" else 200)
            self.end_headers()

        def log_message(self, *a: Any) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


def test_death_is_the_engine_process_gone_not_a_busy_api(tmp_path: Path) -> None:
    http_srv, url = _health_server("hang")
    engine = subprocess.Popen(["sleep", "60"])
    try:
        ctx = _Ctx(_Srv(url, os.getpid()), [engine.pid])
        w = H.DeathWatch(ctx).start()  # type: ignore[arg-type]
        assert not w.dead.wait(4.5)  # /health not answering in time (twice) is not death
        engine.kill()
        assert w.dead.wait(30)
        w.stop()
        seen = [e for e in ctx.events if e["what"] == "engine_dead_seen"]
        assert len(seen) == 1 and seen[0]["how"] == "EngineCore gone" and seen[0]["pids"] == [engine.pid]
    finally:
        engine.kill()
        engine.wait()
        http_srv.shutdown()


def test_death_is_health_answering_not_200() -> None:
    http_srv, url = _health_server("503")
    engine = subprocess.Popen(["sleep", "60"])
    try:
        ctx = _Ctx(_Srv(url, os.getpid()), [engine.pid])
        w = H.DeathWatch(ctx).start()  # type: ignore[arg-type]
        assert w.dead.wait(30)
        w.stop()
        assert [e["how"] for e in ctx.events] == ["/health answered"] and ctx.events[0]["status"] == 503
    finally:
        engine.kill()
        engine.wait()
        http_srv.shutdown()


# --- the truth of each outcome ----------------------------------------------------------------


def _recorded(tmp_path: Path, events: list[tuple[str, float, dict[str, Any]]], log: bytes) -> dict[str, Any]:
    """The truth.json the recorder writes for the runtime-OOM scenario after ``events`` (what, t, fields)."""
    g = H.SCENARIOS["h200-runtime-oom-prompt-logprobs"]
    out = tmp_path / "trace"
    out.mkdir()
    ctx = H.GpuCtx(g.sc, out, 0.0, tmp_path / "work", H.GPU_PARAMS, 1.0)
    for what, t, kw in events:
        ctx.events.append({"t": t, "mono": t, "what": what, **kw})
    index = [{"t": 1000.0 + k, "size": 100 * k} for k in range(1, 400)]  # the log grew 100 B a second
    return H._truth(ctx, index, log, "0.26.0")


LAUNCH = ("launch", 1000.0, {"pid": 1, "flags": ["--gpu-memory-utilization", "0.97"], "model": "/tmp/tiny-v151936",
                             "env": {"VLLM_USE_V2_MODEL_RUNNER": "0"}})
READY = ("ready", 1090.0, {})
BURSTS = [("oom_burst", 1120.0, {"n": 2}), ("oom_burst_answered", 1122.0, {"n": 2}),
          ("oom_burst", 1137.0, {"n": 4})]


def test_truth_of_an_oom_the_burst_that_killed_it_and_the_death_seen(tmp_path: Path) -> None:
    log = b"x" * 13000 + b"\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 16.98 GiB.\n"
    dead = ("engine_dead_seen", 1138.5, {"how": "EngineCore gone"})
    t = _recorded(tmp_path, [LAUNCH, READY, *BURSTS, dead], log)
    assert t["class"] == "runtime_oom" and t["expect_rules"] == R.EXPECT["runtime_oom"]
    assert t["began"] == t["detectable_from"] == 1137.0  # the burst of 4, not the one of 2 answered before
    assert t["should_alert_by"] == 1148.5
    assert t["server"]["env"] == {"VLLM_USE_V2_MODEL_RUNNER": "0"} and t["server"]["model"] == "/tmp/tiny-v151936"


def test_truth_of_an_oom_line_without_a_death_dates_by_the_line(tmp_path: Path) -> None:
    log = b"x" * 13950 + b"\nCUDA out of memory. Tried to allocate 8.49 GiB\n"  # seen when the log reached 14,000 B
    t = _recorded(tmp_path, [LAUNCH, READY, *BURSTS], log)
    assert t["class"] == "runtime_oom" and t["began"] == 1137.0 and t["should_alert_by"] == 1150.0


def test_truth_without_an_oom_is_a_normal_trace(tmp_path: Path) -> None:
    t = _recorded(tmp_path, [LAUNCH, READY, *BURSTS], b"INFO all answered\n" * 100)
    assert t["class"] == "normal" and t["expect_rules"] == []
    assert t["began"] is None and t["should_alert_by"] is None


def test_truth_of_a_start_that_never_became_ready(tmp_path: Path) -> None:
    log = b"INFO starting\n" + b"(EngineCore pid=9) ERROR 12-05 10:17:00 [core.py:1] EngineCore failed to start.\n"
    t = _recorded(tmp_path, [LAUNCH], log)
    assert t["class"] == "startup_failure" and t["expected_phase"] == "failed"
    assert t["began"] is not None


def test_the_recorders_log_keeps_a_file_replaced_at_the_same_path(tmp_path) -> None:
    """serve.sh removes serve.log and starts a new one at each launch: the log the trace keeps is every file,
    one after another, and the index's size only grows (the three-start scenario kept only the last file,
    under an index that went back to 0)."""
    from tools.corpus.record import LogSegments

    log = tmp_path / "serve.log"
    segs = LogSegments()
    log.write_bytes(b"start 0 line 1\n")
    segs.follow(log)
    with open(log, "ab") as f:
        f.write(b"start 0 line 2\n")
    segs.follow(log)
    first = segs.size()
    log.unlink()
    log.write_bytes(b"start 1 line 1\n")
    segs.follow(log)
    assert segs.size() == first + len(b"start 1 line 1\n") and first == 30
    assert segs.data(10**6) == b"start 0 line 1\nstart 0 line 2\nstart 1 line 1\n"


def test_the_wide_copy_has_the_new_shapes_and_no_weights(model: Path, tmp_path: Path) -> None:
    """h200-neighbour-gpu-bound serves a 7B-shaped copy with --load-format dummy: its config has the new layer
    shapes and everything else of the source's; no weight file is copied (vLLM makes random ones at load)."""
    dst = tmp_path / "tiny-wide"
    made = H.wide_copy(model, dst, H.WIDE_CONFIG)
    cfg = json.loads((dst / "config.json").read_text())
    assert {k: cfg[k] for k in H.WIDE_CONFIG} == H.WIDE_CONFIG
    assert cfg["vocab_size"] == OLD and cfg["architectures"] == ["LlamaForCausalLM"]
    assert made["files"] == ["config.json", "tokenizer.json", "tokenizer_config.json"]
    assert not list(dst.glob("*.safetensors"))
    # 7.0e9 parameters: what a decode step reads whole (the reason the decode is bound by the GPU)
    h, i, n, kv = (H.WIDE_CONFIG[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                               "num_key_value_heads"))
    per_layer = 2 * h * h + 2 * h * kv * H.WIDE_CONFIG["head_dim"] + 3 * h * i
    assert 6.9e9 < n * per_layer < 7.1e9
