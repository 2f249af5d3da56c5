"""Discovery from a real ``ps`` capture and from command lines written from
the reference (§5): launch forms, flags, titles, GPU holders, orphans."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import psutil
import pytest

from vtop.sources import discovery as d
from vtop.sources.discovery import ProcRecord, discover, discover_servers, parse_human_int

PS = Path(__file__).parent.parent / "fixtures" / "procs" / "vllm-0.32.0-cpu-ps.txt"


def records_from_ps(text: str, create_time: float = 1_796_030_000.0) -> list[ProcRecord]:
    """The first table of ``ps -eo pid,ppid,comm,args`` (args split on spaces)."""
    out: list[ProcRecord] = []
    for line in text.splitlines():
        if not line.strip():
            if out:
                break
            continue
        m = re.match(r"\s*(\d+)\s+(\d+)\s+(\S+)\s+(.*)$", line)
        if m:
            pid, ppid, comm, args = m.groups()
            out.append(ProcRecord(int(pid), int(ppid), comm, tuple(args.split()), create_time + int(pid) / 1000))
    return out


def rec(pid: int, ppid: int, cmd: str, name: str | None = None, ct: float = 100.0) -> ProcRecord:
    argv = tuple(cmd.split())
    return ProcRecord(pid, ppid, name or (argv[0].rsplit("/", 1)[-1][:15] if argv else ""), argv, ct)


def test_real_cpu_ps_capture() -> None:
    recs = records_from_ps(PS.read_text())
    assert len(recs) == 4
    servers = discover_servers(recs)
    assert len(servers) == 1
    s = servers[0]
    assert s.pid == 12772 and s.form == "serve"
    assert s.url == "http://127.0.0.1:8011" and s.port == 8011 and s.bind_host == "127.0.0.1"
    assert s.model == "/tmp/tinyllama" and s.served_name == "/tmp/tinyllama"
    assert s.max_model_len == 2048
    assert s.tensor_parallel_size is None and s.tp == 1
    roles = {c.pid: c.role for c in s.children}
    assert roles == {13170: "helper", 13171: "engine", 13284: "worker"}
    # 0.32's CPU build runs a plain VLLM::Worker below the engine: it holds the device.
    assert s.gpu_pids == (13284,) and not s.gpu_pids_guessed
    assert s.key == (12772, s.create_time)
    assert discover(recs).orphans == ()


def test_h200_tp1_engine_holds_gpu() -> None:
    # From the H200 run's events.jsonl: `children` and `ps` after ready (title padded by setproctitle).
    recs = [
        rec(982, 974, "/opt/torch/.venv/bin/python3 /tmp/site/bin/vllm serve /tmp/tiny --host 127.0.0.1 --port 8000 "
            "--max-model-len 32768 --gpu-memory-utilization 0.5", name="vllm"),
        rec(1047, 982, "/opt/torch/.venv/bin/python3 -B -c from multiprocessing.resource_tracker import main;main(45)"),
        ProcRecord(1048, 982, "VLLM::EngineCor", ("VLLM::EngineCore" + " " * 120,), 200.0),
    ]
    (s,) = discover_servers(recs)
    assert s.gpu_pids == (1048,)
    assert s.gpu_memory_utilization == 0.5 and s.max_model_len == 32768
    eng = [c for c in s.children if c.role == "engine"]
    assert eng[0].title == "VLLM::EngineCore" and eng[0].holds_gpu


def test_tp2_workers_hold_gpu() -> None:
    recs = [
        rec(100, 1, "/usr/bin/python3 /venv/bin/vllm serve meta-llama/Llama-3.1-70B -tp 2 --max-num-seqs 128 "
            "--served-model-name llama70 llama --max-model-len 32k"),
        rec(110, 100, "VLLM::EngineCore"),
        rec(120, 110, "VLLM::Worker_TP0"),
        rec(121, 110, "VLLM::Worker_TP1"),
    ]
    (s,) = discover_servers(recs)
    assert s.url == "http://127.0.0.1:8000"
    assert s.bind_host is None
    assert s.tensor_parallel_size == 2 and s.max_num_seqs == 128
    assert s.served_model_names == ("llama70", "llama") and s.served_name == "llama70"
    assert s.model == "meta-llama/Llama-3.1-70B"
    assert s.max_model_len == 32000
    assert s.gpu_pids == (120, 121)
    ranks = {c.pid: c.rank for c in s.children if c.role == "worker"}
    assert ranks == {120: 0, 121: 1}
    assert [c.depth for c in s.children] == [1, 2, 2]


def test_dp2_engines_each_with_workers() -> None:
    recs = [
        rec(200, 1, "vllm serve Qwen/Qwen3-8B --data-parallel-size 2 --tensor-parallel-size=2 --port=9000 --host 0.0.0.0"),
        rec(201, 200, "VLLM::DPCoordinator"),
        rec(210, 200, "VLLM::EngineCore_DP0"),
        rec(211, 200, "VLLM::EngineCore_DP1"),
        rec(220, 210, "VLLM::Worker_DP0_TP0"),
        rec(221, 210, "VLLM::Worker_DP0_TP1"),
        rec(222, 211, "VLLM::Worker_DP1_TP0"),
        rec(223, 211, "VLLM::Worker_DP1_TP1"),
    ]
    (s,) = discover_servers(recs)
    assert s.url == "http://127.0.0.1:9000" and s.bind_host == "0.0.0.0"
    assert s.data_parallel_size == 2 and s.tensor_parallel_size == 2 and s.dp == 2
    assert s.engine_pids() == (210, 211)
    assert s.gpu_pids == (220, 221, 222, 223)
    by = {c.pid: c for c in s.children}
    assert by[201].role == "coordinator"
    assert by[211].rank == 1 and dict(by[222].ranks) == {"dp": 1, "tp": 0}


def test_api_server_module_form_and_ipv6() -> None:
    recs = [
        rec(300, 1, "/usr/bin/python3.11 -u -m vllm.entrypoints.openai.api_server --model /models/mistral "
            "--port 8123 --host :: --api-key sk-secret-123 --gpu-memory-utilization=0.85"),
        rec(301, 300, "VLLM::EngineCore"),
    ]
    (s,) = discover_servers(recs)
    assert s.form == "api_server"
    assert s.model == "/models/mistral" and s.port == 8123 and s.url == "http://127.0.0.1:8123"
    assert s.gpu_memory_utilization == 0.85
    assert s.api_key == "sk-secret-123"
    assert "sk-secret-123" not in repr(s)
    assert "sk-secret-123" not in s.display_argv() and "--api-key ***" in s.display_argv()
    from vtop.sources.discovery import flag_of

    assert flag_of(s, "--api-key") == "sk-secret-123"
    (s6,) = discover_servers([rec(1, 0, "vllm serve m --host ::1 --port 7000")])
    assert s6.url == "http://[::1]:7000"


def test_non_vllm_processes_are_ignored() -> None:
    recs = [
        rec(400, 1, "python3 train.py --port 8000 --model vllm"),
        rec(401, 1, "python3 -c print('vllm serve x')"),
        rec(402, 1, "/bin/sh -c vllm serve m --port 8000"),  # a shell wrapper: its child is the server
        rec(403, 402, "/venv/bin/python3 /venv/bin/vllm serve m --port 8000"),
        rec(404, 1, "timeout 600 vllm serve other --port 8001"),  # wrapper
        rec(405, 404, "vllm serve other --port 8001"),
        rec(406, 1, "vllm bench serve --port 8000"),  # a client, not a server
        rec(407, 1, "celery::Worker"),
        rec(408, 1, "python3 -m vllm.entrypoints.cli.main chat --url http://x"),
    ]
    servers = discover_servers(recs)
    assert [s.pid for s in servers] == [403, 405]
    assert discover(recs).orphans == ()


def test_forked_v0_children_are_not_second_servers() -> None:
    cmd = "/usr/bin/python3 /venv/bin/vllm serve m --tensor-parallel-size 2"
    recs = [rec(500, 1, cmd), rec(501, 500, cmd), rec(502, 501, cmd),
            rec(503, 500, "/usr/bin/python3 -c from multiprocessing.resource_tracker import main;main(9)")]
    (s,) = discover_servers(recs)
    assert s.pid == 500
    assert s.gpu_pids_guessed and set(s.gpu_pids) == {501, 502}


def test_orphan_titles_and_truncated_comm() -> None:
    recs = [
        ProcRecord(600, 1, "VLLM::EngineCor", (), 5.0),  # cmdline unreadable: comm only
        ProcRecord(601, 600, "VLLM::Worker_TP", (), 5.0),
    ]
    disc = discover(recs)
    assert disc.servers == ()
    assert [(o.pid, o.role) for o in disc.orphans] == [(600, "engine"), (601, "worker")]


def test_restart_is_a_new_create_time() -> None:
    a = discover_servers([rec(700, 1, "vllm serve m", ct=10.0)])[0]
    b = discover_servers([rec(700, 1, "vllm serve m", ct=99.0)])[0]
    assert a.key != b.key


def test_odd_records_do_not_raise() -> None:
    class P:
        pid, ppid, name, cmdline, create_time = 800, 1, "vllm", ["vllm", "serve", "x", "--port", "notanint"], None

    recs = [P(), {"pid": 801, "ppid": 800, "name": "VLLM::EngineCor", "cmdline": None}, {"pid": "bad"}, object()]
    (s,) = discover_servers(recs)
    assert s.port == 8000 and s.engine_pids() == (801,)
    assert discover_servers([rec(900, 1, "vllm serve")])[0].model is None
    assert discover_servers([rec(901, 1, "vllm serve --enforce-eager --model m2")])[0].model == "m2"


@pytest.mark.parametrize(
    ("s", "n"), [("2048", 2048), ("32k", 32000), ("32K", 32768), ("25.6k", 25600), ("1M", 1048576), ("-1", None),
                 ("auto", None), (None, None)]
)
def test_parse_human_int(s: str | None, n: int | None) -> None:
    assert parse_human_int(s) == n


def test_live_scan_tolerates_vanishing_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    class Gone:
        @property
        def info(self) -> dict[str, object]:
            raise psutil.NoSuchProcess(1)

    class Ok:
        info = {"pid": 5, "ppid": 1, "name": "vllm", "cmdline": ["vllm", "serve", "m"], "create_time": 1.0}

    monkeypatch.setattr(psutil, "process_iter", lambda *a, **k: iter([Gone(), Ok()]))
    assert [s.pid for s in d.discover(d._read_psutil()).servers] == [5]
    # and the real table: no crash, whatever runs here
    monkeypatch.undo()
    assert isinstance(d.discover_servers(), list)
    from vtop.sources.urls import FALLBACK_URL

    assert FALLBACK_URL == "http://localhost:8000"  # vLLM's default port


def test_proc_reader_agrees_with_psutil() -> None:
    """The direct /proc reader (used on Linux because it is ~5x cheaper) sees what psutil sees, less the
    kernel threads (children of kthreadd, PID 2, on this box: it runs in no PID namespace of its own)."""
    import os

    fast = {r.pid: r for r in d._read_proc_linux()}
    me = fast[os.getpid()]
    p = psutil.Process()
    assert me.ppid == p.ppid() and abs(me.create_time - p.create_time()) < 1.0
    assert me.cmdline == tuple(p.cmdline()) and me.name == p.name()
    # CPU seconds (user + system, from the same stat read) agree with psutil's, read just after
    ct = p.cpu_times()
    assert me.cpu is not None and me.cpu <= ct.user + ct.system + 0.02
    assert ct.user + ct.system - me.cpu < 1.0
    everything = {r.pid: r for r in d._read_psutil()}
    kernel = {pid for pid, r in everything.items() if pid == 2 or r.ppid == 2}
    assert kernel and not kernel & set(fast), "the kernel threads are left out"
    slow = {pid: r for pid, r in everything.items() if pid not in kernel}
    assert slow[os.getpid()].cpu is not None
    again = {r.pid: r for r in d._read_proc_linux()}
    both = set(fast) & set(slow)
    assert len(both) >= 0.9 * len(slow)
    # Other tests start and exec processes meanwhile: compare those that did not change
    # between the two direct reads (a process that exec'd in between is someone else now).
    # (CPU time moves between reads: it is not part of the identity.)
    from dataclasses import replace

    stable = [pid for pid in both if pid in again and replace(again[pid], cpu=None) == replace(fast[pid], cpu=None)]
    assert len(stable) >= 0.8 * len(both)
    for pid in stable:
        if fast[pid].cmdline:  # read for interpreters and vLLM titles only
            assert fast[pid].cmdline == slow[pid].cmdline
        assert fast[pid].ppid == slow[pid].ppid
    assert [s.pid for s in d.discover(fast.values()).servers] == [s.pid for s in d.discover(slow.values()).servers]


def test_a_kernel_thread_is_told_by_its_flag_not_by_its_parent() -> None:
    """PF_KTHREAD (0x00200000) in field 9 of /proc/PID/stat: a kworker is one; a process whose parent is
    PID 2 is not (inside a PID namespace PID 2 is an ordinary process, a container's vLLM)."""
    from vtop.sources.procs import stat_is_kernel_thread

    kworker = b"123 (kworker/0:1-events) I 2 0 0 0 -1 69238880 0 0 0 0 0 0 0 0 20 0 1 0 9 0 0"
    engine = b"57 (VLLM::EngineCor) S 2 2 1 0 -1 4194560 9 0 0 0 12 3 0 0 20 0 40 0 310 0 0"
    assert stat_is_kernel_thread(kworker)
    assert not stat_is_kernel_thread(engine)
    assert not stat_is_kernel_thread(b"garbage") and not stat_is_kernel_thread(b"1 (x) S 0 1")
    with open("/proc/2/stat", "rb") as f:  # kthreadd itself, on this box
        assert stat_is_kernel_thread(f.read())
    with open("/proc/self/stat", "rb") as f:
        assert not stat_is_kernel_thread(f.read())


def test_a_scan_reads_no_kernel_thread_again_until_its_list_is_old(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel threads a scan found are not read again by the next ones (most of a box's process table;
    2.0 -> 0.7 ms a scan on the dev VM), until the list is ``_KTHREADS_FOR_S`` old: then each is read again,
    so a process that got a kernel thread's PID is found at most that late."""
    import builtins
    import time

    monkeypatch.setattr(d, "_KTHREADS", frozenset())
    monkeypatch.setattr(d, "_KTHREADS_SINCE", 0.0)
    first = {r.pid for r in d._read_proc_linux()}
    kernel = set(d._KTHREADS)
    assert kernel and not {int(p) for p in kernel} & first, "kernel threads are listed, and get no record"
    opened: list[str] = []
    real_open = builtins.open

    def spy(path: Any, *a: Any, **k: Any) -> Any:
        opened.append(str(path))
        return real_open(path, *a, **k)

    def stats_read() -> set[str]:
        return {p.split("/")[2] for p in opened if p.startswith("/proc/") and p.endswith("/stat")}

    monkeypatch.setattr(builtins, "open", spy)
    again = {r.pid for r in d._read_proc_linux()}
    assert not stats_read() & kernel, "a kernel thread's stat was read again"
    assert os.getpid() in again and str(os.getpid()) in stats_read()
    assert set(d._KTHREADS) <= kernel | stats_read()
    opened.clear()
    monkeypatch.setattr(d, "_KTHREADS_SINCE", time.monotonic() - d._KTHREADS_FOR_S - 1.0)
    d._read_proc_linux()
    alive = kernel & set(os.listdir("/proc"))
    assert alive and alive <= stats_read(), "an old list is read afresh"
