"""Snapshot bundles: layout, permissions, a big log streamed intact, prompt redaction in
vLLM's request-log formats (reference §8), secret scrubbing, env rules, one at a time."""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vtop.actions.snapshot import (
    LogRedactor,
    SnapshotRunner,
    filter_environ,
    is_secret_env,
    latest_bundle,
    make_bundle,
    redact_request_line,
)
from vtop.sources.discovery import ProcRecord, ServerProcess, discover

API_KEY = "sk-vtop-unit-9fQ2xLm4PzT7"
HF = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"
NOW = 1_796_031_001.0  # fixed: folder names are predictable

STAMP = "INFO 05-30 12:00:01 [logger.py:40]"


def server_for(pid: int, child_pid: int | None = None, key: str = API_KEY) -> ServerProcess:
    recs = [ProcRecord(pid, 1, "vllm", ("/venv/bin/python3", "/venv/bin/vllm", "serve", "/tmp/tiny", "--port",
                                         "8011", "--api-key", key), 100.0)]
    if child_pid is not None:
        recs.append(ProcRecord(child_pid, pid, "VLLM::EngineCor", ("VLLM::EngineCore",), 101.0))
    (s,) = discover(recs).servers
    return s


def bundle(tmp_path: Path, **kw: Any):  # type: ignore[no-untyped-def]
    args: dict[str, Any] = dict(
        log_path=None, servers=[], metrics_texts={}, history_json={"gpu": [1, 2]}, phases_json={"ready": True},
        alerts=[], screen_svg="<svg/>", now=NOW,
    )
    args.update(kw)
    return make_bundle(tmp_path / "out", **args)


def all_bytes(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(folder.iterdir()))


@pytest.fixture
def sleeper() -> Iterator[tuple[int, int]]:
    """A fake API server and engine: real processes with a real environment to read."""
    env = {
        "PATH": os.environ.get("PATH", ""), "CUDA_VISIBLE_DEVICES": "GPU-5f7c2b1e-aaaa-bbbb-cccc-0123456789ab,1",
        "VLLM_API_KEY": API_KEY, "HF_TOKEN": HF, "HF_HOME": "/data/hf", "VLLM_LOGGING_LEVEL": "DEBUG",
        "NCCL_DEBUG": "INFO", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "UNRELATED": "x",
        "VLLM_SOME_URL": "https://user:hunter2pass@example.com/x",
    }
    a = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    b = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    # Popen returns once the child is forked; until it has exec'd, /proc shows the parent's
    # command line and environment. Wait for the exec (flaky under load otherwise).
    import time

    deadline = time.monotonic() + 30
    for p in (a, b):
        while time.monotonic() < deadline:
            try:
                if b"VLLM_API_KEY=" in open(f"/proc/{p.pid}/environ", "rb").read():
                    break
            except OSError:
                pass
            time.sleep(0.01)
    yield a.pid, b.pid
    for p in (a, b):
        p.kill()
        p.wait()


def test_layout_and_permissions(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text(f"{STAMP} hello\n")
    r = bundle(tmp_path, log_path=str(log), metrics_texts={"http://127.0.0.1:8011": b"vllm:num_requests_running 0\n",
                                                          "http://127.0.0.1:8012": None},
               alerts=[{"level": "warn", "text": "KV 95%"}])
    assert r.ok and r.path is not None, r.problems
    assert r.path.name == "vtop-snapshot-" + __import__("datetime").datetime.fromtimestamp(NOW).strftime(
        "%Y%m%d-%H%M%S")
    assert stat.S_IMODE(r.path.stat().st_mode) == 0o700
    names = set(r.files)
    assert names == {"README.txt", "processes.json", "history.json", "phases.json", "alerts.json", "screen.svg",
                     "vllm.log", "metrics-127.0.0.1-8011.txt"}
    for p in r.path.iterdir():
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
    assert json.loads((r.path / "alerts.json").read_text()) == [{"level": "warn", "text": "KV 95%"}]
    assert (r.path / "metrics-127.0.0.1-8011.txt").read_bytes() == b"vllm:num_requests_running 0\n"
    readme = (r.path / "README.txt").read_text()
    assert "vllm.log" in readme and "8012" in readme and "not available" in readme and "prompts   redacted" in readme
    # a second bundle in the same second gets -2
    r2 = bundle(tmp_path)
    assert r2.path is not None and r2.path.name == r.path.name + "-2"
    assert latest_bundle(tmp_path / "out") in (r.path, r2.path)


def test_big_log_streamed_intact_with_progress(tmp_path: Path) -> None:
    line = f"{STAMP} Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 12.3 tokens/s\n"
    block = (line * 1000).encode()
    log = tmp_path / "big.log"
    with open(log, "wb") as f:
        while f.tell() < 50 << 20:
            f.write(block)
        f.write(b"last line without newline")
    size = log.stat().st_size
    calls: list[tuple[int, int]] = []
    r = bundle(tmp_path, log_path=str(log), progress=lambda d, t: calls.append((d, t)), secrets=[API_KEY])
    assert r.ok, r.problems
    copied = r.path / "vllm.log"  # type: ignore[operator]
    assert hashlib.sha256(copied.read_bytes()).digest() == hashlib.sha256(log.read_bytes()).digest()
    assert r.log_bytes == size
    assert len(calls) >= 50 and calls[0] == (0, size) and calls[-1] == (size, size)
    assert all(t == size for _, t in calls) and [d for d, _ in calls] == sorted(d for d, _ in calls)


REQUEST_LINES = [
    # <=0.11: INFO, prompt and token ids inline
    f"{STAMP} Received request cmpl-1: prompt: 'My SSN is 123-45-6789, it\\'s \"secret\"', params: SamplingParams(n=1, "
    "temperature=0.0, max_tokens=16), prompt_token_ids: [1, 1619, 29871, 3403], prompt_embeds shape: None, "
    "lora_request: None.",
    f"(APIServer pid=31) {STAMP} Received request chatcmpl-2: prompt: \"<|user|>\\nMy SSN is 123-45-6789</s>\", "
    "params: SamplingParams(max_tokens=2030), prompt_token_ids: None, lora_request: None, prompt_adapter_request: None.",
    # 0.15+: DEBUG details and JSON body
    "(APIServer pid=31) DEBUG 05-30 12:00:01 [request_logger.py:55] Request cmpl-3 details: prompt: 'My SSN is "
    "123-45-6789', prompt_token_ids: [1, 1619, 3403], prompt_embeds shape: None.",
    "(APIServer pid=31) DEBUG 05-30 12:00:01 [request_logger.py:74] Request cmpl-3 JSON body: {\"model\":\"m\","
    "\"prompt\":\"My SSN is 123-45-6789\",\"max_tokens\":16}",
    # --enable-log-outputs
    f"(APIServer pid=31) {STAMP} Generated response cmpl-3 (streaming complete): output: 'My SSN is 123-45-6789 "
    "again', finish_reason: length",
    "(APIServer pid=31) DEBUG 05-30 12:00:01 [request_logger.py:101] Generated response cmpl-3 details: "
    "output_token_ids: [1619, 3403]",
]


@pytest.mark.parametrize("line", REQUEST_LINES)
def test_prompt_redaction_per_format(line: str) -> None:
    out = redact_request_line(line)
    assert "123-45-6789" not in out and "1619" not in out
    assert "[redacted]" in out
    # the request id and the params (max_tokens!) stay: they are what a debugger needs
    m = re.search(r"(?:cmpl|chatcmpl)-\d", line)
    assert m and m.group(0) in out
    if "max_tokens=" in line and "JSON body" not in line:
        assert re.search(r"max_tokens=\d+", out)


def test_redaction_in_bundle_and_off_switch(tmp_path: Path) -> None:
    log = tmp_path / "req.log"
    plain = f"{STAMP} Added request cmpl-1.\n"
    log.write_text(plain + "\n".join(REQUEST_LINES) + "\n" + plain)
    r = bundle(tmp_path, log_path=str(log))
    text = (r.path / "vllm.log").read_text()  # type: ignore[operator]
    assert "123-45-6789" not in text and text.count("[redacted]") >= len(REQUEST_LINES)
    assert text.startswith(plain) and text.endswith(plain) and r.redacted_lines >= len(REQUEST_LINES)
    r2 = bundle(tmp_path, log_path=str(log), redact_prompts=False)
    assert (r2.path / "vllm.log").read_text() == log.read_text()  # type: ignore[operator]
    assert "NOT redacted" in (r2.path / "README.txt").read_text()  # type: ignore[operator]


def test_redactor_chunk_boundaries_and_overlong_lines() -> None:
    data = ("\n".join(REQUEST_LINES) + f"\nkey {API_KEY} end\n").encode() * 3
    for size in (1, 7, 64, 1000):
        red = LogRedactor([API_KEY], redact_prompts=True, max_line=256)
        out = b"".join(red.feed(data[i:i + size]) for i in range(0, len(data), size)) + red.finish()
        assert b"123-45-6789" not in out and API_KEY.encode() not in out, size
        assert out.count(b"key *** end") == 3
    # a huge prompt without a newline for a long time is dropped, not buffered forever
    red = LogRedactor([], redact_prompts=True, max_line=1024)
    out = red.feed(b"Received request x: prompt: '" + b"A" * 5000) + red.feed(b"A" * 5000 + b"'\nnext\n") + red.finish()
    assert b"AAAA" not in out and out.endswith(b"next\n") and b"over-long" in out
    # a long plain line keeps every byte, secrets scrubbed across the cuts
    long = b"x" * 3000 + API_KEY.encode() + b"y" * 3000 + b"\n"
    red = LogRedactor([API_KEY], redact_prompts=True, max_line=100)
    out = b"".join(red.feed(long[i:i + 50]) for i in range(0, len(long), 50)) + red.finish()
    assert out == b"x" * 3000 + b"***" + b"y" * 3000 + b"\n"


def test_secrets_never_in_any_file(tmp_path: Path, sleeper: tuple[int, int]) -> None:
    api, eng = sleeper
    srv = server_for(api, eng)
    other = "tok-Passed-In-0000-XYZ"
    log = tmp_path / "vllm.log"
    log.write_text(f"{STAMP} args: Namespace(api_key='{API_KEY}', hf_token='{HF}')\n"
                   f"{STAMP} Authorization: Bearer {other}\n")
    r = make_bundle(
        tmp_path / "out", log_path=str(log), servers=[srv],
        metrics_texts={srv.url: f'x{{key="{API_KEY}"}} 1\n'.encode()},
        history_json={"note": other, "k": API_KEY}, phases_json=None, alerts=[f"leaked {API_KEY}"],
        screen_svg=f"<svg>{API_KEY} {HF}</svg>", secrets=[other], now=NOW,
    )
    assert r.ok, r.problems
    blob = all_bytes(r.path)  # type: ignore[arg-type]
    for s in (API_KEY, HF, other, "hunter2pass"):
        assert s.encode() not in blob, s
    procs = json.loads((r.path / "processes.json").read_text())["servers"]  # type: ignore[operator]
    (p,) = procs
    assert p["pid"] == api and "--api-key ***" in p["cmdline"]
    env = p["env"]
    assert env["VLLM_API_KEY"] == "***" and env["HF_TOKEN"] == "***" and env["VLLM_SOME_URL"] == "***"
    assert env["CUDA_VISIBLE_DEVICES"].startswith("GPU-5f7c2b1e") and env["HF_HOME"] == "/data/hf"
    assert env["NCCL_DEBUG"] == "INFO" and env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert "UNRELATED" not in env and "PATH" not in env
    (c,) = p["children"]
    assert c["pid"] == eng and c["role"] == "engine" and c["env"]["VLLM_LOGGING_LEVEL"] == "DEBUG"
    assert "python" in c["cmdline"]


def test_env_rules() -> None:
    assert is_secret_env("VLLM_API_KEY", "x") and is_secret_env("HF_TOKEN", "") and is_secret_env("MY_PASSWORD", "a")
    assert is_secret_env("VLLM_X", "Bearer abc.def") and is_secret_env("HF_X", "hf_abcdefghijklmnop")
    assert is_secret_env("VLLM_X", "sk-abcdefghijkl1234") and is_secret_env("VLLM_X", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig")
    assert is_secret_env("VLLM_X", "Zx81kQ2mP0aLw9rT3yU7iO4pS6dF8gH1")  # opaque mixed-case token
    for name, value in [("CUDA_VISIBLE_DEVICES", "GPU-5f7c2b1e-aaaa-bbbb-cccc-0123456789ab"),
                        ("VLLM_ATTENTION_BACKEND", "FLASH_ATTN"), ("HF_HOME", "/root/.cache/huggingface"),
                        ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"), ("NCCL_SOCKET_IFNAME", "eth0")]:
        assert not is_secret_env(name, value), name
    kept, secrets = filter_environ({"HF_TOKEN": HF, "VLLM_PORT": "8000", "HOME": "/root", "NCCL_P2P_DISABLE": "1"})
    assert kept == {"HF_TOKEN": "***", "VLLM_PORT": "8000", "NCCL_P2P_DISABLE": "1"} and secrets == [HF]


def test_second_start_refused_while_running(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_bytes(b"x\n" * (3 << 20))
    gate, entered = threading.Event(), threading.Event()

    def slow(done: int, total: int) -> None:
        entered.set()
        gate.wait(10)

    runner = SnapshotRunner()
    assert not runner.running
    fut = runner.start(tmp_path / "out", log_path=str(log), servers=[], metrics_texts={}, history_json={},
                       phases_json=None, alerts=[], screen_svg=None, progress=slow)
    assert entered.wait(10) and runner.running
    second = runner.start(tmp_path / "out", log_path=None, servers=[], metrics_texts={}, history_json={},
                          phases_json=None, alerts=[], screen_svg=None)
    res2 = second.result(1)
    assert res2.refused and not res2.ok and "already" in res2.message
    blocking = runner.run(tmp_path / "out", log_path=None, servers=[], metrics_texts={}, history_json={},
                          phases_json=None, alerts=[], screen_svg=None)
    assert blocking.refused
    gate.set()
    res = fut.result(20)
    assert res.path is not None and not runner.running and runner.last_path == res.path
    assert runner.run(tmp_path / "out", log_path=None, servers=[], metrics_texts={}, history_json={},
                      phases_json=None, alerts=[], screen_svg=None).path is not None


def test_cancel_removes_the_folder(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_bytes(b"y\n" * (4 << 20))
    cancel = threading.Event()

    def prog(done: int, total: int) -> None:
        if done > 0:
            cancel.set()

    r = bundle(tmp_path, log_path=str(log), progress=prog, cancel=cancel)
    assert r.cancelled and not r.ok and r.path is None
    assert list((tmp_path / "out").iterdir()) == []


@pytest.mark.parametrize("kind", ["missing", "directory"])
def test_bad_log_still_writes_the_rest(tmp_path: Path, kind: str) -> None:
    path = tmp_path / ("nope.log" if kind == "missing" else "adir")
    if kind == "directory":
        path.mkdir()
    r = bundle(tmp_path, log_path=str(path), metrics_texts={"http://h:1": b"m 1\n"})
    assert not r.ok and r.partial and r.path is not None
    assert any("not copied" in p and str(path) in p for p in r.problems)
    assert "log" in r.message and "not copied" in r.message
    assert {"README.txt", "processes.json", "history.json", "metrics-h-1.txt"} <= set(r.files)
    assert "vllm.log" not in r.files
    assert "not copied" in (r.path / "README.txt").read_text()


def test_unreadable_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "vllm.log"
    log.write_text("secret stuff\n")
    import builtins

    real_open = builtins.open

    def deny(file: Any, *a: Any, **k: Any) -> Any:
        if str(file) == str(log):
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *a, **k)

    monkeypatch.setattr(builtins, "open", deny)
    r = bundle(tmp_path, log_path=str(log))
    assert not r.ok and r.path is not None and any("permission denied" in p for p in r.problems)
    assert "history.json" in r.files and "vllm.log" not in r.files


def test_no_log_known_and_unwritable_dest(tmp_path: Path) -> None:
    r = bundle(tmp_path, log_path=None, screen_svg=None)
    assert r.ok and "no log known" in (r.path / "README.txt").read_text()  # type: ignore[operator]
    blocker = tmp_path / "file"
    blocker.write_text("")
    bad = make_bundle(blocker / "sub", log_path=None, servers=[], metrics_texts={}, history_json={},
                      phases_json=None, alerts=[], screen_svg=None)
    assert not bad.ok and bad.path is None and "cannot create" in bad.message


def test_env_of_a_gone_process(tmp_path: Path) -> None:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    r = bundle(tmp_path, servers=[server_for(p.pid)])
    (entry,) = json.loads((r.path / "processes.json").read_text())["servers"]  # type: ignore[operator]
    assert entry["env"] is None and entry["env_error"] == "process gone"


def test_the_bundle_begins_with_what_the_log_says_happened_before_vtop(tmp_path: Path) -> None:
    """Issue #45: the timeline of the log (vtop.core.timeline) at the top of README.txt, its JSON beside."""
    lines = ["what the log says happened (vtop started reading it 2m 00s ago): 2 starts read",
             "  5m 10s ago  start: process start 20s, torch.compile 29s [12-02 01:00:00]",
             "  2m 00s ago  -- vtop started reading the log --", "warnings 3, errors 0", "last stats line 4s ago: ..."]
    r = bundle(tmp_path, timeline=lines, timeline_json={"starts": 2})
    assert r.ok, r.problems
    readme = (r.path / "README.txt").read_text().splitlines()
    at = readme.index(lines[0])
    assert at < readme.index("servers:") and readme[at + 1] == "  " + lines[1]
    assert json.loads((r.path / "timeline.json").read_text()) == {"starts": 2}
    assert oct((r.path / "timeline.json").stat().st_mode & 0o777) == "0o600"
    # no timeline (no log): none in the README, no file
    r2 = bundle(tmp_path / "b")
    assert "what the log says happened" not in (r2.path / "README.txt").read_text()
    assert not (r2.path / "timeline.json").exists()
