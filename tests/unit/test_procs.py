"""Names for the PIDs NVML reports (vtop.sources.procs), against real processes."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest

from vtop.sources import procs
from vtop.sources.procs import GONE, HIDDEN, ProcNames, proc_start


def _agrees_with_psutil(pid: int) -> bool:
    """psutil's create_time is boot time + start ticks / CLK_TCK (boot time in whole seconds)."""
    ticks = proc_start(pid)
    assert isinstance(ticks, int)
    return abs(psutil.boot_time() + ticks / os.sysconf("SC_CLK_TCK") - psutil.Process(pid).create_time()) < 1.0


def test_start_time_is_the_kernels_and_names_one_process() -> None:
    assert _agrees_with_psutil(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert _agrees_with_psutil(child.pid)
    finally:
        child.kill()
        child.wait()
    assert proc_start(child.pid) is None  # reaped: /proc/PID is gone


def test_a_command_name_with_spaces_and_parens_does_not_shift_the_fields(tmp_path) -> None:
    exe = tmp_path / "odd) name (x"
    exe.symlink_to(sys.executable)
    child = subprocess.Popen([str(exe), "-c", "import time; time.sleep(30)"])
    try:
        assert ") name (" in open(f"/proc/{child.pid}/stat").read()
        assert _agrees_with_psutil(child.pid)
    finally:
        child.kill()
        child.wait()


def test_names_come_from_the_process_and_are_looked_up_once(monkeypatch) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        names = ProcNames()
        first = names.name(child.pid)
        p = psutil.Process(child.pid)
        assert first == f"{p.name()} · {p.username()}"  # a stranger on a GPU: its name and whose it is
        calls = []
        real = psutil.Process
        monkeypatch.setattr(psutil, "Process", lambda pid: calls.append(pid) or real(pid))
        assert names.names([child.pid, child.pid]) == {child.pid: first}
        assert calls == []  # the cache answered: same pid, same start time
    finally:
        child.kill()
        child.wait()
    assert names.name(child.pid) in (GONE, HIDDEN)


def test_a_reused_pid_gets_its_new_name(monkeypatch) -> None:
    names = ProcNames()
    pid = os.getpid()
    names._cache[pid] = (-1, "an older process")  # the same pid, started at another time
    p = psutil.Process(pid)
    assert names.name(pid) == f"{p.name()} · {p.username()}" != "an older process"


@pytest.mark.parametrize("container", [True, False])
def test_a_pid_we_cannot_see_says_why(monkeypatch, container: bool) -> None:
    monkeypatch.setattr(procs, "_CONTAINER", container)
    pid = 2**22 + 12345  # above pid_max's largest value: no such process here
    assert ProcNames().name(pid) == (HIDDEN if container else GONE)


def test_parse_stat_reads_past_a_comm_with_spaces_and_parens_and_refuses_what_is_not_stat() -> None:
    from vtop.sources.procs import parse_stat

    tail = b" S 77 " + b" ".join(b"0" for _ in range(17)) + b" 4242 rest of the fields\n"  # start ticks is field 22
    assert parse_stat(b"123 (odd) name (x) " + tail[1:]) == ("odd) name (x", 77, 4242)
    assert parse_stat(b"123 python3" + tail) is None  # no parentheses
    assert parse_stat(b"123 (short) S 1 2") is None  # too few fields
    assert parse_stat(b"123 (x) S notanumber" + tail[6:]) is None
