"""Issue 39: where a vLLM server runs (container, pod, unit), its runtime's log, its PIDs and ports in
its own namespaces. Real captures from docker 20.10 (runc, cgroupfs driver) on the dev box where they
exist (tests/fixtures/containers/: the json-file log, cgroup, fib_trie, docker-proxy argv,
iptables-save); the CRI file is from tests/helpers/crilog.py (containerd's writer, redone)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FIXTURES
from tests.helpers.containers import server
from vtop.model.procs import VllmChild
from vtop.sources import containers as C
from vtop.sources.journal import JournalTailer, decode_entry, journal_command
from vtop.sources.logformats import CriDecoder, DockerJsonDecoder, parse_rfc3339
from vtop.sources.logtail import LogTailer, find_last_startup
from vtop.sources.urls import url_matches

FX = FIXTURES / "containers"
CID = "16abb4b3eea9e10104877cb8608c607e97d62a6f1a09e552f6879a35516fa79b"
POD_UID = "1c7e2d3a-5b6c-4d7e-8f90-123456789abc"


# --------------------------------------------------------------------------- cgroups


def test_cgroup_layouts() -> None:
    real = C.parse_cgroup((FX / "cgroup-docker-cgroupfs.txt").read_text())
    assert (real.kind, real.container_id) == ("docker", CID)
    cases = {
        f"0::/system.slice/docker-{'c' * 64}.scope": ("docker", "c" * 64, None, None),
        f"0::/machine.slice/libpod-{'d' * 64}.scope/container": ("podman", "d" * 64, None, None),
        f"4:memory:/kubepods/besteffort/pod{POD_UID}/{'b' * 64}": ("pod", "b" * 64, POD_UID, None),
        ("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + POD_UID.replace("-", "_")
         + f".slice/cri-containerd-{'a' * 64}.scope"): ("pod", "a" * 64, POD_UID, None),
        "0::/system.slice/vllm.service": ("unit", None, None, "vllm.service"),
        "9:name=systemd:/user.slice/user-1000.slice/user@1000.service/app.slice/vllm.service\n0::/":
            ("unit", None, None, "vllm.service"),
        "0::/user.slice/user-1000.slice/session-3.scope": (None, None, None, None),
        "0::/": (None, None, None, None),
    }
    for text, want in cases.items():
        cg = C.parse_cgroup(text)
        assert (cg.kind, cg.container_id, cg.pod_uid, cg.unit) == want, text
    assert C.parse_cgroup("0::/user.slice/user-1000.slice/user@1000.service/app.slice/vllm.service").user_unit


def test_nspid_fib_trie_proxy_and_dnat_from_real_captures() -> None:
    assert C.parse_nspid("Name:\tpython3\nNSpid:\t27650\t1\n") == [27650, 1]
    assert C.parse_fib_trie_local((FX / "fib_trie-docker.txt").read_text()) == ["172.17.0.2"]
    proxies = [C.parse_docker_proxy(line.split()) for line in (FX / "docker-proxy-argv.txt").read_text().splitlines()]
    assert [(p.published, p.to_ip, p.to_port) for p in proxies if p] == [
        ("127.0.0.1:18124", "172.17.0.2", 8000), ("127.0.0.1:18124", "172.17.0.2", 8000)]
    assert C.parse_docker_proxy(["/usr/bin/python3", "-host-port", "1"]) is None
    dnat = C.parse_dnat((FX / "iptables-save-nat.txt").read_text())
    assert [(f.host_port, f.to_ip, f.to_port) for f in dnat] == [(18124, "172.17.0.2", 8000)]


# --------------------------------------------------------------------------- the runtimes' log files


def test_docker_json_file_real_bytes() -> None:
    """The real json-file of a container: HTML-escaped JSON, a 20,000-byte line cut at 16 KiB into
    two records (the first without its newline), a tqdm redraw, invalid UTF-8 as U+FFFD."""
    t = LogTailer(FX / "docker-json-file.log", decoder=DockerJsonDecoder(), jump_to_last_startup=False)
    got = t.poll_timed()
    lines = [line for line, _ in got]
    assert lines[0].endswith('non-default args: <&> "quoted" é')
    assert lines[1] == "x" * 20000
    assert "Loading weights: 100%|##########| 2/2 [00:02<00:00]" in lines
    assert "partial without newline then its end" in lines
    assert "bad utf8 \ufffd\ufffd end" in lines
    assert got[0][1] == pytest.approx(parse_rfc3339("2026-12-04T20:38:55.519619197Z"))
    assert all(ts is not None for _, ts in got)


def test_cri_records_join_partials_and_keep_times() -> None:
    t = LogTailer(FX / "cri-0.log", decoder=CriDecoder(), jump_to_last_startup=False)
    got = t.poll_timed()
    lines = [line for line, _ in got]
    assert lines[1] == "x" * 20000  # P + F joined
    assert "partial without newline then its end" in lines  # \r\n stripped by the writer
    assert lines[-1] != "no newline at the end"  # a P record at the end waits for more
    assert got[0][1] == pytest.approx(parse_rfc3339("2026-12-04T20:39:20.556328344Z"))
    # Go's RFC3339Nano cuts trailing zeros: 8 digits still read to the nanosecond
    assert parse_rfc3339("2026-12-04T20:39:20.86245375Z") == pytest.approx(1796416760.86245375)
    assert parse_rfc3339("2026-12-04T21:39:20+01:00") == parse_rfc3339("2026-12-04T20:39:20Z")
    assert parse_rfc3339("not a time") is None


def test_a_record_not_of_the_format_is_passed_on() -> None:
    dec = CriDecoder()
    assert dec.feed(b"plain text line\n2026-12-04T20:39:20Z stdout F ok\n") == [
        (b"plain text line\n", None), (b"ok\n", parse_rfc3339("2026-12-04T20:39:20Z"))]
    assert dec.bad == 1


def _json_rec(text: str, t: str = "2026-12-04T20:00:00.5Z", stream: str = "stdout") -> str:
    return json.dumps({"log": text, "stream": stream, "time": t}) + "\n"


def test_json_file_rotation_is_followed(tmp_path: Path) -> None:
    """docker renames ID-json.log to .1 at max-size and begins a new one: the rest of the old one is
    read first, then the new one from its start; a line cut across the rotation is joined."""
    p = tmp_path / "c-json.log"
    p.write_text(_json_rec("one\n") + _json_rec("two\n"))
    t = LogTailer(p, decoder=DockerJsonDecoder(), jump_to_last_startup=False)
    assert t.poll() == ["one", "two"]
    with open(p, "a") as f:
        f.write(_json_rec("three\n"))
        f.write(_json_rec("fo"))  # docker cuts a long line: its first piece in the old file
    os.rename(p, tmp_path / "c-json.log.1")
    p.write_text(_json_rec("ur\n") + _json_rec("fi"))
    assert t.poll() == ["three", "four"]
    assert t.poll() == []
    with open(p, "a") as f:
        f.write(_json_rec("ve\n", "2026-12-04T20:00:09Z"))
    assert t.poll_timed() == [("five", parse_rfc3339("2026-12-04T20:00:09Z"))]
    assert t.state.restarts == 1


def test_startup_scan_finds_the_banner_inside_records(tmp_path: Path) -> None:
    banner = "(APIServer pid=1) INFO 12-04 20:40:01 [api_server.py:1797] vLLM API server version 0.11.0\n"
    old = "".join(_json_rec(f"old line {i}\n") for i in range(200))
    new = _json_rec(banner) + _json_rec("(APIServer pid=1) INFO 12-04 20:40:01 [utils.py:1] after\n")
    p = tmp_path / "c-json.log"
    p.write_text(_json_rec(banner.replace("0.11.0", "0.10.0")) + old + new)
    with open(p, "rb") as f:
        dec = DockerJsonDecoder()
        scan = find_last_startup(f.fileno(), unwrap=dec.unwrap)
        assert scan.found and scan.version == "0.11.0"
    t = LogTailer(p, decoder=DockerJsonDecoder())
    lines = t.poll()
    assert lines[0].endswith("version 0.11.0") and lines[-1].endswith("after")
    assert t.tail_lines((b"old line 199",), max_bytes=1 << 20) == []  # behind the forward read
    p2 = tmp_path / "d-json.log"
    p2.write_text(old + _json_rec("Avg prompt throughput: 1.0 tokens/s\n"))
    t2 = LogTailer(p2, decoder=DockerJsonDecoder(), tail_bytes=100)
    t2.poll()
    t3 = LogTailer(p2, decoder=DockerJsonDecoder())
    t3._open()  # positioned, nothing read yet
    assert t3.tail_lines((b"Avg prompt throughput",)) == ["Avg prompt throughput: 1.0 tokens/s"]


# --------------------------------------------------------------------------- journald


def test_journal_entries_decode() -> None:
    line = json.dumps({"MESSAGE": "hello", "__REALTIME_TIMESTAMP": "1796416760862453", "_PID": "7"}).encode()
    assert decode_entry(line) == (b"hello\n", 1796416760.862453)
    raw = json.dumps({"MESSAGE": [104, 255, 10], "__REALTIME_TIMESTAMP": "1"}).encode()
    assert decode_entry(raw) == (b"h\xff\n\n", 1e-6)
    assert decode_entry(b"not json") is None
    assert journal_command("_SYSTEMD_UNIT=vllm.service", 1796416760.9)[-3:] == [
        "--since", "@1796416760", "_SYSTEMD_UNIT=vllm.service"]


def test_journal_tailer_reads_a_child_without_waiting(tmp_path: Path) -> None:
    """A stand-in journalctl (the real one's output shape) that writes two entries, then waits: the
    lines come with their journal times; close() ends the child."""
    script = tmp_path / "jctl.py"
    script.write_text(
        "import json, sys, time\n"
        "for i, t in enumerate((1796416760000000, 1796416761500000)):\n"
        "    print(json.dumps({'MESSAGE': f'line {i}', '__REALTIME_TIMESTAMP': str(t)}), flush=True)\n"
        "time.sleep(60)\n")
    jt = JournalTailer("_SYSTEMD_UNIT=x.service", command=[sys.executable, str(script)])
    got: list[tuple[str, float | None]] = []
    import time

    deadline = time.monotonic() + 20
    while len(got) < 2 and time.monotonic() < deadline:
        got += jt.poll_timed()
        time.sleep(0.05)
    assert got == [("line 0", 1796416760.0), ("line 1", 1796416761.5)]
    assert jt.state.status == "following"
    proc = jt._proc
    jt.close()
    assert proc is not None and proc.poll() is not None


def test_journal_tailer_says_why_when_journalctl_is_missing() -> None:
    jt = JournalTailer("_PID=1", command=["no-such-journalctl-here"])
    assert jt.poll() == []
    assert jt.state.status == "error" and "not installed" in jt.state.message


# --------------------------------------------------------------------------- a server's placement


class _Rec:
    def __init__(self, argv: list[str]) -> None:
        self.cmdline = tuple(argv)


def _fake_proc(root: Path, pid: int | str, *, cgroup: str = "0::/\n", nspid: list[int] | None = None,
               pidns: str = "pid:[4026531836]", netns: str = "net:[4026531833]", fib: str = "") -> None:
    d = root / str(pid)
    (d / "ns").mkdir(parents=True)
    (d / "net").mkdir()
    (d / "cgroup").write_text(cgroup)
    (d / "status").write_text(f"Name:\tx\nNSpid:\t{chr(9).join(map(str, nspid or [pid]))}\n")
    (d / "net" / "fib_trie").write_text(fib)
    os.symlink(pidns, d / "ns" / "pid")
    os.symlink(netns, d / "ns" / "net")


def test_a_docker_server_is_placed_named_published_and_its_pids_mapped(tmp_path: Path) -> None:
    proc, droot = tmp_path / "proc", tmp_path / "docker"
    _fake_proc(proc, "self")
    cg = (FX / "cgroup-docker-cgroupfs.txt").read_text()
    fib = (FX / "fib_trie-docker.txt").read_text()
    _fake_proc(proc, 27650, cgroup=cg, nspid=[27650, 1], pidns="pid:[4026532200]", netns="net:[4026532203]", fib=fib)
    _fake_proc(proc, 27700, cgroup=cg, nspid=[27700, 245], pidns="pid:[4026532200]", netns="net:[4026532203]")
    cdir = droot / "containers" / CID
    cdir.mkdir(parents=True)
    (cdir / "config.v2.json").write_text(json.dumps({"Name": "/vllm-0", "LogPath": str(cdir / f"{CID}-json.log")}))
    (cdir / "hostconfig.json").write_text(json.dumps({"LogConfig": {"Type": "json-file", "Config": {}}}))
    eng = VllmChild(27700, 27650, "VLLM::EngineCore", "engine", None, (), 1.0, holds_gpu=True)
    records = [_Rec(line.split()) for line in (FX / "docker-proxy-argv.txt").read_text().splitlines()]
    records.append(_Rec(["/usr/bin/dockerd", "--data-root", str(droot)]))
    enr = C.Enricher(proc_root=str(proc), env={}, read_dnat=False)
    (sp,) = enr.enrich([server(27650, children=(eng,))], records)
    assert sp.placement == "container vllm-0" and sp.container_id == CID
    assert sp.ns_pid == 1 and sp.children[0].ns_pid == 245
    assert sp.host_pid(245) == 27700 and sp.host_pid(1) == 27650 and sp.host_pid(999) is None
    assert sp.own_netns and sp.url == "http://127.0.0.1:18124" and sp.inner_port == 8000
    assert url_matches("http://localhost:18124", sp) and not url_matches("http://localhost:8000", sp)
    assert sp.gpu_pids == (27700,)
    found = C.container_log(sp, enr.runtime_info(sp.container_id), proc_root=str(proc))
    assert found is not None and found.kind == "docker-json" and found.label == "docker json-file of vllm-0"


def test_without_a_published_port_the_container_address_is_used(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    _fake_proc(proc, "self")
    _fake_proc(proc, 50, cgroup=f"0::/docker/{CID}\n", netns="net:[4026532203]",
               fib=(FX / "fib_trie-docker.txt").read_text())
    (sp,) = C.Enricher(proc_root=str(proc), env={"VTOP_DOCKER_ROOT": str(tmp_path / "none")},
                       read_dnat=False).enrich([server(50)], [])
    assert sp.url == "http://172.17.0.2:8000" and sp.own_netns and sp.listen_port is None
    assert sp.placement == f"container {CID[:12]}"  # its files not found: its short ID
    found = C.container_log(sp, None, proc_root=str(proc))
    assert found is not None and found.kind is None and "docker logs -f" in found.message


def test_a_pod_finds_its_cri_log_and_a_unit_its_journal(tmp_path: Path) -> None:
    proc, logs = tmp_path / "proc", tmp_path / "log" / "pods"
    _fake_proc(proc, "self")
    _fake_proc(proc, 60, cgroup=f"4:memory:/kubepods/besteffort/pod{POD_UID}/{'b' * 64}\n")
    _fake_proc(proc, 70, cgroup="0::/system.slice/vllm.service\n")
    d = logs / f"default_vllm-7d9f_{POD_UID}" / "vllm"
    d.mkdir(parents=True)
    (d / "0.log").write_text("")
    (d / "1.log").write_text("")
    enr = C.Enricher(proc_root=str(proc), env={}, pod_log_root=str(logs), read_dnat=False)
    pod, unit = enr.enrich([server(60), server(70, 8001)], [])
    assert pod.placement == "pod default/vllm-7d9f" and unit.placement == "unit vllm.service"
    got = C.container_log(pod, enr.runtime_info(pod.container_id), proc_root=str(proc))
    assert got is not None and got.kind == "cri" and got.path == str(d / "1.log")
    assert got.label == "CRI log of pod default/vllm-7d9f (container vllm)"
    j = C.container_log(unit, None, proc_root=str(proc))
    assert j is not None and (j.kind, j.match) == ("journal", "_SYSTEMD_UNIT=vllm.service")


def test_vtop_in_a_container_ties_no_gpu_pid_to_its_own_processes(tmp_path: Path) -> None:
    """vtop in a PID namespace of its own (kubectl exec): NVML's host PIDs are not its /proc's, so no
    server process is said to hold a GPU, and every NVML PID is named as not mappable, never as the
    process that happens to have that number here."""
    from vtop.sources.procs import UNMAPPED, ProcNames

    proc = tmp_path / "proc"
    _fake_proc(proc, "self", pidns="pid:[4026532999]")
    _fake_proc(proc, 80, pidns="pid:[4026532999]")
    eng = VllmChild(81, 80, "VLLM::EngineCore", "engine", None, (), 1.0, holds_gpu=True)
    (sp,) = C.Enricher(proc_root=str(proc), env={}, read_dnat=False).enrich([server(80, children=(eng,))], [])
    assert sp.gpu_pids == () and not sp.children[0].holds_gpu
    assert ProcNames(foreign_pids=True).names([os.getpid(), 1]) == {os.getpid(): UNMAPPED, 1: UNMAPPED}
    assert ProcNames(foreign_pids=False).name(os.getpid()) != UNMAPPED
    assert C.in_host_pid_ns(str(proc)) is False


def test_monitor_feeds_a_namespace_read_to_its_server_and_says_a_denial_once() -> None:
    from vtop.clock import FakeClock
    from vtop.config import Config
    from vtop.monitor.monitor import Monitor
    from vtop.sources.sockets import Conn, ConnRead

    m = Monitor(Config(urls=("http://127.0.0.1:18124",), interval=1.0), clock=FakeClock(), find_logs=False)
    m.add_cli_urls()
    import dataclasses

    sp = dataclasses.replace(server(50), port=18124, url="http://127.0.0.1:18124", own_netns=True, listen_port=8000,
                             published=("127.0.0.1:18124",))
    m.apply_procs([sp])
    assert m.conn_ports() == frozenset() and m.conn_netns() == [("http://127.0.0.1:18124", 50, 8000)]
    ws = m.servers["http://127.0.0.1:18124"]
    c = Conn("172.17.0.2:8000", "172.17.0.1:40000", 0.1, 45.0, 1000, 300)
    m.apply_conns(ConnRead(1.0, 1.0, (c,), None, "http://127.0.0.1:18124"))
    assert ws.conns.last_mono == 1.0 and ws.conns.error is None
    m.apply_conns(ConnRead(2.0, 2.0, (), "denied", "http://127.0.0.1:18124"))
    m.apply_conns(ConnRead(3.0, 3.0, (), "denied", "http://127.0.0.1:18124"))
    assert ws.conns.error == "denied" and sum("denied" in n for n in m.notes) == 1


def test_logwatch_lines_arrive_when_their_writer_stamped_them() -> None:
    """A backlog read at once (an attach to a container's json-file) arrives at the runtime's stamps:
    the startup's phases get their real lengths, not zero."""
    from vtop.clock import FakeClock
    from vtop.monitor.logwatch import LogWatch

    class Src:
        state: Any = None

        def __init__(self, pairs: list[tuple[str, float | None]]) -> None:
            from vtop.sources.logtail import TailState

            self.pairs = pairs
            self.state = TailState("following", "x")

        def poll(self) -> list[str]:
            return [p for p, _ in self.poll_timed()]

        def poll_timed(self) -> list[tuple[str, float | None]]:
            out, self.pairs = self.pairs, []
            return out

        def close(self) -> None:
            pass

    clock = FakeClock()
    now = clock.time()
    w = LogWatch(Src([("a", now - 30.0), ("b", now - 10.0), ("c", None), ("d", now - 50.0)]), clock=clock)
    assert w._arrivals([now - 30.0, now - 10.0, None, now - 50.0], clock.monotonic(), now) == [
        (now - 30.0, clock.monotonic() - 30.0), (now - 10.0, clock.monotonic() - 10.0),
        (now, clock.monotonic()), (now, clock.monotonic())]


def test_a_placed_server_survives_a_recording() -> None:
    """What a recording keeps of a container's server (replays and the snapshot show the same)."""
    import dataclasses

    from vtop.sources.codec import process_from_json, process_to_json

    eng = VllmChild(27700, 27650, "VLLM::EngineCore", "engine", None, (), 1.0, holds_gpu=True, ns_pid=245)
    sp = dataclasses.replace(server(27650, children=(eng,)), placement="pod default/vllm-7d9f", container_id=CID,
                             ns_pid=1, own_netns=True, listen_port=8000, published=("127.0.0.1:18000",))
    back = process_from_json(json.loads(json.dumps(process_to_json(sp))))
    assert back == sp and back.host_pid(245) == 27700


def test_docker_proxy_closing_a_connection_is_the_containers_port_refusing() -> None:
    """Behind a published port docker-proxy accepts every connection and closes it, no byte sent, while
    nothing listens in the container (seen for real: the card said STALE, 'dropped the connection', for
    the whole start). With the server's process behind a published port, that is a start, not a stale
    server; a reset mid-answer stays stale, and without a published port nothing changes."""
    import dataclasses

    from vtop.clock import FakeClock
    from vtop.core.server import ServerTracker
    from vtop.sources.vllm import poll_from_error

    url = "http://127.0.0.1:18124"
    sp = dataclasses.replace(server(50), port=18124, url=url, own_netns=True, listen_port=8000,
                             published=("127.0.0.1:18124",), placement="container vllm-0")
    clock = FakeClock()

    def state(proc: Any, message: str | None = None) -> tuple[str, str]:
        tr = ServerTracker(url, clock=clock)
        tr.feed(poll_from_error(url, "reset", t=clock.time(), mono=clock.monotonic(), message=message),
                process=proc)
        v = tr.view()
        return v.state, v.message

    st, msg = state(sp)
    assert st == "starting" and "refuses connections until it is ready" in msg, msg
    assert state(dataclasses.replace(sp, published=()))[0] == "stale"
    assert state(sp, "127.0.0.1:18124 dropped the connection in the middle of /metrics (900 bytes received)")[0] == \
        "stale"


def test_attach_after_a_rotation_begins_at_the_start_in_the_rotated_file(tmp_path: Path) -> None:
    """Seen for real (a pod's CRI log rotated during the start, vtop attached after ready): the banner is in
    the rotated copy. The start is read from it, then the current file, as one stream."""
    banner = "(APIServer pid=1) INFO 12-04 20:40:01 [api_server.py:1797] vLLM API server version 0.11.0\n"
    p = tmp_path / "0.log"
    rec = "2026-12-04T20:40:0{}.5Z stdout {} {}\n"
    (tmp_path / "0.log.20261204-204003").write_text(
        rec.format(1, "F", banner.rstrip("\n")) + rec.format(2, "F", "(EngineCore pid=60) INFO a") + rec.format(3, "P", "cut "))
    (tmp_path / "0.log.20261204-203000").write_text(rec.format(0, "F", "an older start, not this one"))
    p.write_text(rec.format(4, "F", "in two") + rec.format(5, "F", "after the rotation"))
    t = LogTailer(p, decoder=CriDecoder())
    assert t.rotated_sibling() == str(tmp_path / "0.log.20261204-204003")
    got = t.poll() + t.poll()
    assert got == [banner.rstrip("\n"), "(EngineCore pid=60) INFO a", "cut in two", "after the rotation"], got
    assert t.scan is not None and t.scan.found
    plain = LogTailer(p, decoder=CriDecoder())
    os.rename(tmp_path / "0.log.20261204-204003", tmp_path / "0.log.20261204-204003.gz")
    assert plain.poll() == ["in two", "after the rotation"]  # no rotated copy to read: the file's own lines
