"""py-spy: target picking from real-shaped process trees, a real dump of a child
process, the parser on the recorded vLLM dump, and every error path."""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from vtop.actions import pyspy
from vtop.actions.pyspy import dump, parse_dump, permission_hint, pick_targets, save_into
from vtop.sources.discovery import ProcRecord, discover

from .test_discovery import PS, records_from_ps

REAL_DUMP = Path("/work/shared/fixtures/vllm-0.32.0-cpu/pyspy-dump.txt")
PYSPY = Path(sys.executable).parent / "py-spy"


def rec(pid: int, ppid: int, cmd: str) -> ProcRecord:
    argv = tuple(cmd.split())
    return ProcRecord(pid, ppid, argv[0].rsplit("/", 1)[-1][:15], argv, 100.0 + pid)


def tp1_server():  # type: ignore[no-untyped-def]
    (s,) = discover([
        rec(982, 974, "/venv/bin/python3 /venv/bin/vllm serve /tmp/tiny --port 8000 --api-key sk-secret"),
        rec(1047, 982, "/venv/bin/python3 -B -c from multiprocessing.resource_tracker import main;main(45)"),
        rec(1048, 982, "VLLM::EngineCore"),
    ]).servers
    return s


def tp2_server():  # type: ignore[no-untyped-def]
    (s,) = discover([
        rec(100, 1, "/usr/bin/python3 /venv/bin/vllm serve meta-llama/Llama-3.1-70B -tp 2"),
        rec(110, 100, "VLLM::EngineCore"),
        rec(121, 110, "VLLM::Worker_TP1"),
        rec(120, 110, "VLLM::Worker_TP0"),
    ]).servers
    return s


def test_pick_tp1_engine_by_default() -> None:
    s = tp1_server()
    (t,) = pick_targets(s)
    assert (t.pid, t.role, t.label) == (1048, "engine", "VLLM::EngineCore")
    assert [x.pid for x in pick_targets(s, role="api_server")] == [982]
    assert pick_targets(s, role="workers") == []
    assert {x.pid for x in pick_targets(s, role="all")} == {982, 1048}  # no resource tracker
    assert pick_targets(s, role="bogus") == []


def test_pick_tp2_workers_by_rank() -> None:
    s = tp2_server()
    ts = pick_targets(s)
    assert [(t.pid, t.rank, t.label) for t in ts] == [(120, 0, "VLLM::Worker_TP0"), (121, 1, "VLLM::Worker_TP1")]
    assert [t.pid for t in pick_targets(s, role="engine")] == [110]
    assert pick_targets(s, role="api_server")[0].pid == 100


def test_pick_from_the_real_cpu_ps_capture() -> None:
    (s,) = discover(records_from_ps(PS.read_text())).servers
    assert [t.pid for t in pick_targets(s)] == [13171]  # TP=1: the EngineCore
    assert [t.pid for t in pick_targets(s, role="workers")] == [13284]


def test_pick_untitled_v0_falls_back_to_guessed_gpu_pids() -> None:
    (s,) = discover([
        rec(10, 1, "python -m vllm.entrypoints.openai.api_server --model m"),
        rec(11, 10, "python -m vllm.entrypoints.openai.api_server --model m"),
    ]).servers
    ts = pick_targets(s)
    assert ts and all(t.pid in s.gpu_pids or t.pid == 10 for t in ts)


def test_parse_recorded_vllm_dump() -> None:
    text = REAL_DUMP.read_text()
    first = text.split("rc=0")[0].split("\n", 1)[1]  # drop the "$ py-spy ..." line
    title, version, threads = parse_dump(first)
    assert title == "VLLM::EngineCore" and version and version.startswith("Python v3.11.7")
    assert [t.name for t in threads] == ["MainThread", "MultiprocWorkerMonitor", "Thread-1 (process_input_sockets)",
                                         "Thread-2 (process_output_sockets)", "signal-callback"]
    main = threads[0]
    assert main.tid == "13171" and main.status == "idle" and not main.active
    assert main.frames[0].text == "Condition.wait (threading.py:327)"
    assert main.frames[2].func == "EngineCoreProc._process_input_queue"
    assert main.frames[2].file == "vllm/v1/engine/core.py" and main.frames[2].line == 1588
    assert main.frames[-1].text == "<module> (<string>:1)"


def test_parse_active_gil_native_and_hex_tids() -> None:
    text = (
        "Process 7: python x.py\nPython v3.12.1 (/usr/bin/python3.12)\n\n"
        'Thread 0x7F00AB (active+gil): "MainThread"\n'
        "    cudaStreamSynchronize (libcudart.so.12)\n"
        "    forward (model.py:88)\n"
        "        Arguments:\n            self: <Model at 0x7f>\n"
        'Thread 12 (active)\n    run (w.py:3)\n'
    )
    title, _, (a, b) = parse_dump(text)
    assert title == "python x.py"
    assert a.tid == "0x7F00AB" and a.active and a.holds_gil
    assert a.frames[0].line is None and a.frames[0].text == "cudaStreamSynchronize (libcudart.so.12)"
    assert len(a.frames) == 2
    assert b.name == "" and b.active and not b.holds_gil


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    code = (
        "import time, threading\n"
        "def vtop_test_marker_function():\n"
        "    while True:\n"
        "        time.sleep(0.05)\n"
        "threading.Thread(target=lambda: time.sleep(60), name='side-thread', daemon=True).start()\n"
        "print('ready', flush=True)\n"
        "vtop_test_marker_function()\n"
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert p.stdout is not None and p.stdout.readline().strip() == b"ready"
    yield p
    p.kill()
    p.wait()


@pytest.mark.skipif(not PYSPY.exists(), reason="py-spy not installed in this venv")
async def test_real_dump_of_a_child(child: subprocess.Popen[bytes], tmp_path: Path) -> None:
    r = await dump(child.pid, pyspy=str(PYSPY), timeout_s=20)
    assert r.ok and r.kind == "ok", r.message
    names = {t.name for t in r.threads}
    assert {"MainThread", "side-thread"} <= names
    main = next(t for t in r.threads if t.name == "MainThread")
    assert any(f.func == "vtop_test_marker_function" and f.file == "<string>" for f in main.frames)
    assert "vtop_test_marker_function" in r.raw and r.python_version
    saved = r.save_into(tmp_path)
    assert saved.ok and saved.path is not None
    assert saved.path.name.startswith(f"pyspy-{child.pid}-") and saved.path.suffix == ".txt"
    assert stat.S_IMODE(saved.path.stat().st_mode) == 0o600
    assert "vtop_test_marker_function" in saved.path.read_text()
    again = save_into(r, tmp_path)  # same second: a new name, not an overwrite
    assert again.ok and again.path != saved.path


async def test_missing_binary() -> None:
    r = await dump(os.getpid(), pyspy="/nonexistent")
    assert not r.ok and r.kind == "not_installed" and "pip install py-spy" in r.message


async def test_dead_pid(tmp_path: Path) -> None:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    r = await dump(p.pid, pyspy=str(_fake(tmp_path, "echo should-not-run; exit 3")))
    assert not r.ok and r.kind == "gone" and str(p.pid) in r.message


def _fake(tmp_path: Path, body: str) -> Path:
    f = tmp_path / "py-spy"
    f.write_text("#!/bin/sh\n" + body + "\n")
    f.chmod(0o755)
    return f


async def test_timeout_kills_pyspy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Proves: a py-spy that never answers is ended by timeout_s, killed (SIGKILL) and reaped
    # before dump() returns; its process object is caught where dump() starts it, so nothing
    # waits "long enough" for it to write its pid or to die. 30 s is a hang guard only.
    fake = _fake(tmp_path, "exec sleep 3600")
    started: list[asyncio.subprocess.Process] = []
    real_exec = asyncio.create_subprocess_exec

    async def spy(*a, **k):  # type: ignore[no-untyped-def]
        started.append(await real_exec(*a, **k))
        return started[-1]

    monkeypatch.setattr(asyncio, "create_subprocess_exec", spy)
    try:
        r = await asyncio.wait_for(dump(os.getpid(), pyspy=str(fake), timeout_s=0.5), 30)
        assert not r.ok and r.kind == "timeout" and "0.5 s" in r.message
        (proc,) = started
        assert proc.returncode == -signal.SIGKILL  # killed, and waited for
        with pytest.raises(ProcessLookupError):
            os.kill(proc.pid, 0)  # reaped: no zombie left
    finally:
        for p in started:
            if p.returncode is None:
                p.kill()


async def test_permission_denied_message(tmp_path: Path) -> None:
    fake = _fake(tmp_path, "echo 'Error: Permission Denied: Try running again with elevated permissions by going "
                           "'\"'\"'sudo env \"PATH=$PATH\" !!'\"'\"'' >&2; exit 1")
    r = await dump(os.getpid(), pyspy=str(fake))
    assert not r.ok and r.kind == "permission", r.message
    assert "permission denied" in r.message and str(os.getpid()) in r.message
    assert any(w in r.message for w in ("sudo", "SYS_PTRACE", "root", "seccomp"))


def test_permission_hints() -> None:
    user = permission_hint(5, euid=1000, ptrace_scope=1, in_container=False)
    assert "sudo" in user and "ptrace_scope" in user and "echo 0" in user
    assert "only CAP_SYS_PTRACE" in permission_hint(5, euid=1000, ptrace_scope=2, in_container=False)
    assert "reboot" in permission_hint(5, euid=0, ptrace_scope=3, in_container=True)
    docker = permission_hint(5, euid=0, ptrace_scope=None, in_container=True)
    assert "--cap-add SYS_PTRACE" in docker
    assert "--cap-add SYS_PTRACE" in permission_hint(5, euid=1000, ptrace_scope=0, in_container=True)


async def test_other_failure_uses_the_error_line(tmp_path: Path) -> None:
    fake = _fake(tmp_path, "echo 'Error: Failed to find python version from target process' >&2; "
                           "echo 'Stack backtrace:' >&2; echo '   0: main' >&2; exit 1")
    r = await dump(os.getpid(), pyspy=str(fake))
    assert r.kind == "failed" and "Failed to find python version" in r.message and "exit 1" in r.message


async def test_empty_success_is_a_failure(tmp_path: Path) -> None:
    r = await dump(os.getpid(), pyspy=str(_fake(tmp_path, "exit 0")))
    assert r.kind == "failed" and not r.ok


def test_save_nothing_and_unwritable(tmp_path: Path) -> None:
    empty = pyspy.PySpyResult(False, "py-spy is not installed", 1, "not_installed")
    assert not save_into(empty, tmp_path).ok
    full = pyspy.PySpyResult(True, "ok", 1, "ok", raw="Thread 1 (idle)\n")
    res = save_into(full, tmp_path / "missing-dir")
    assert not res.ok and "cannot save" in res.message
