"""LogTailer / StreamTailer / LineSplitter / find_log_for_pid, on real files, pipes and a fake /proc."""

from __future__ import annotations

import os
import random
import subprocess
import threading
from pathlib import Path

import pytest

from vtop.core.phases import PhaseTracker, StartupSnapshot
from vtop.sources.logtail import (
    LineSplitter,
    LogTailer,
    StreamTailer,
    find_last_startup,
    find_log_for_pid,
    open_log,
)

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
H200 = LOGS / "vllm-0.26.0-h200-startup.log"
BANNER_06 = b"INFO 11-07 17:49:14 api_server.py:528] vLLM API server version 0.6.3.post1\n"
STATS = (
    b"(APIServer pid=982) INFO 11-30 09:56:44 [loggers.py:310] Engine 000: Avg prompt throughput: 0.0 tokens/s, "
    b"Avg generation throughput: 490.2 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.1%, "
    b"Prefix cache hit rate: 0.0%\n"
    b'(APIServer pid=982) INFO:     127.0.0.1:42234 - "GET /metrics HTTP/1.1" 200 OK\n'
)
FRAME50 = b"\rLoading safetensors checkpoint shards:  50% Completed | 2/4 [00:01<00:01,  1.62s/it]"
FRAME100 = b"\rLoading safetensors checkpoint shards: 100% Completed | 4/4 [00:03<00:00,  1.62s/it]"


def split_all(data: bytes) -> list[str]:
    sp = LineSplitter()
    return sp.feed(data) + sp.flush()


def summary(snap: StartupSnapshot) -> tuple[object, ...]:
    return (
        snap.state,
        snap.sequence,
        tuple((v.phase, v.start, v.end, v.progress, tuple((r.name, r.end) for r in v.ranks)) for v in snap.phases),
        snap.facts,
        snap.failure.line if snap.failure else None,
        snap.restarts,
    )


def drain(t: LogTailer, limit: int = 1000) -> list[str]:
    out: list[str] = []
    for _ in range(limit):
        got = t.poll()
        out.extend(got)
        if not got and t.state.behind == 0:
            break
    return out


# --------------------------------------------------------------------------- LineSplitter


def test_newlines_crlf_and_lone_cr_frames() -> None:
    sp = LineSplitter()
    assert sp.feed(b"a\r\nb\n\n") == ["a", "b"]
    assert sp.feed(b"c\r") == ["c"]
    assert sp.feed(b"\nd\n") == ["d"]  # "\r" + "\n" across reads is one line end, no empty line
    frames = b"(EngineCore pid=1) " + FRAME50 + FRAME100 + b"\n"
    assert sp.feed(frames) == [
        "(EngineCore pid=1) ",
        FRAME50[1:].decode(),
        FRAME100[1:].decode(),
    ]


def test_partial_line_is_held_until_complete() -> None:
    sp = LineSplitter()
    assert sp.feed(b"INFO 11-30 09:54:35 [a.py:1] part") == []
    assert sp.pending > 0
    assert sp.feed(b"ial line\nnext") == ["INFO 11-30 09:54:35 [a.py:1] partial line"]
    assert sp.flush() == ["next"]
    assert sp.pending == 0


def test_partial_progress_frame_is_emitted_live_and_not_twice() -> None:
    sp = LineSplitter()
    assert sp.feed(b"(EngineCore pid=1) " + FRAME50) == ["(EngineCore pid=1) ", FRAME50[1:].decode()]
    assert sp.feed(b" ") == []  # padding after a live frame: nothing new
    assert sp.feed(FRAME100) == [FRAME100[1:].decode()]
    assert sp.feed(b"\n") == []
    # The bar's last frame, then the record glued to it arrives in a later read.
    assert sp.feed(b"\rCapturing CUDA graphs (FULL): 100%|##########| 51/51 [00:00<00:00, 96.45it/s]") == [
        "Capturing CUDA graphs (FULL): 100%|##########| 51/51 [00:00<00:00, 96.45it/s]"
    ]
    assert sp.feed(b"(EngineCore pid=1) INFO 11-30 09:55:14 [m.py:1] Graph capturing finished in 1 secs\n") == [
        "(EngineCore pid=1) INFO 11-30 09:55:14 [m.py:1] Graph capturing finished in 1 secs"
    ]


def test_frame_glued_to_the_next_record_in_one_read() -> None:
    data = (
        b"\rCapturing CUDA graphs:  97%|#########7| 65/67 [00:15<00:00,  4.58it/s]"
        b"\x1b[1;36m(Worker_TP2_EP2 pid=2709392)\x1b[0;0m INFO 09-29 10:00:00 [gpu_model_runner.py:1] next record\n"
    )
    assert split_all(data) == [
        "Capturing CUDA graphs:  97%|#########7| 65/67 [00:15<00:00,  4.58it/s]",
        "(Worker_TP2_EP2 pid=2709392) INFO 09-29 10:00:00 [gpu_model_runner.py:1] next record",
    ]


def test_ansi_codes_are_stripped_even_when_split_across_reads() -> None:
    sp = LineSplitter()
    assert sp.feed(b"\x1b[1;3") == []
    assert sp.feed(b"6m(APIServer pid=31)\x1b[0;0m INFO 10-21 09:10:40 [a.py:1] hi\n") == [
        "(APIServer pid=31) INFO 10-21 09:10:40 [a.py:1] hi"
    ]


def test_invalid_utf8_is_replaced_and_split_characters_survive() -> None:
    assert split_all(b"ok \xff\xfe bad\n") == ["ok \ufffd\ufffd bad"]
    block = "█".encode()
    sp = LineSplitter()
    assert sp.feed(b"logo " + block[:1]) == []
    assert sp.feed(block[1:] + b" version 0.26.0\n") == ["logo █ version 0.26.0"]


def test_very_long_lines_are_cut() -> None:
    sp = LineSplitter(max_line=100)
    assert sp.feed(b"x" * 250 + b"\nnext\n") == ["x" * 100 + " …", "next"]
    assert sp.feed(b"y" * 150) == ["y" * 100 + " …"]  # held partial over the cap: cut now
    assert sp.feed(b"y" * 1000) == []  # the rest of that line is dropped
    assert sp.feed(b"y\nz\n") == ["z"]


# --------------------------------------------------------------------------- LogTailer


def test_absent_then_created_is_read_from_its_start(tmp_path: Path) -> None:
    path = tmp_path / "later.log"
    t = LogTailer(path)
    assert t.poll() == []
    assert t.state.status == "waiting" and "later.log" in t.state.message
    path.write_bytes(b"noise before the banner\n" + BANNER_06 + b"INFO 11-07 17:49:20 a.py:1] more\n")
    assert t.poll() == [
        "noise before the banner",
        BANNER_06.decode().strip(),
        "INFO 11-07 17:49:20 a.py:1] more",
    ]
    assert t.state.status == "following" and t.state.message == ""
    assert t.poll() == []


def test_growing_file_with_partial_lines(tmp_path: Path) -> None:
    path = tmp_path / "vllm.log"
    path.write_bytes(b"")
    t = LogTailer(path)
    assert t.poll() == []
    with open(path, "ab", buffering=0) as w:
        w.write(b"line1\npart")
        assert t.poll() == ["line1"]
        w.write(b"ial\r\n")
        assert t.poll() == ["partial"]
        w.write(b"(EngineCore pid=1) " + FRAME50)
        assert t.poll() == ["(EngineCore pid=1) ", FRAME50[1:].decode()]
        w.write(FRAME100 + b"\n")
        assert t.poll() == [FRAME100[1:].decode()]
    assert t.state.offset == path.stat().st_size


def test_attach_jumps_to_the_last_startup_or_reads_all(tmp_path: Path) -> None:
    path = tmp_path / "vllm.log"
    path.write_bytes(BANNER_06 + STATS * 3 + BANNER_06.replace(b"17:49:14", b"18:00:00") + b"after\n")
    t = LogTailer(path)
    lines = t.poll()
    assert lines[0].startswith("INFO 11-07 18:00:00") and lines[-1] == "after" and len(lines) == 2
    assert t.scan is not None and t.scan.found and t.scan.version == "0.6.3.post1"
    assert t.state.startup_found is True
    t2 = LogTailer(path, jump_to_last_startup=False)
    assert len(t2.poll()) == 9


def test_truncation_restarts_at_zero(tmp_path: Path) -> None:
    path = tmp_path / "vllm.log"
    path.write_bytes(b"one\ntwo\nthree\n")
    t = LogTailer(path, jump_to_last_startup=False)
    assert t.poll() == ["one", "two", "three"]
    path.write_bytes(b"new\n")  # `>` on restart: shorter than our offset
    assert t.poll() == ["new"]
    assert t.state.restarts == 1 and "truncated" in t.state.message


def test_truncated_and_rewritten_past_the_old_offset_is_noticed(tmp_path: Path) -> None:
    path = tmp_path / "vllm.log"
    path.write_bytes(b"old line 1\nold line 2\n")
    t = LogTailer(path, jump_to_last_startup=False)
    assert len(t.poll()) == 2
    with open(path, "r+b") as f:  # copytruncate, then the new server wrote more than before
        f.truncate(0)
        f.write(b"fresh start number one\nfresh start number two\n")
    assert t.poll() == ["fresh start number one", "fresh start number two"]
    assert t.state.restarts == 1


def test_rotation_finishes_the_old_file_then_reads_the_new(tmp_path: Path) -> None:
    path = tmp_path / "vllm.log"
    path.write_bytes(b"a\n")
    t = LogTailer(path)
    assert t.poll() == ["a"]
    with open(path, "ab") as f:
        f.write(b"last of old\nold partial")
    os.rename(path, tmp_path / "vllm.log.1")
    path.write_bytes(b"new 1\nnew 2\n")
    assert t.poll() == ["last of old", "old partial", "new 1", "new 2"]
    assert t.state.restarts == 1 and "replaced" in t.state.message
    with open(path, "ab") as f:
        f.write(b"new 3\n")
    assert t.poll() == ["new 3"]


def test_removed_file_is_still_read_through_the_open_handle(tmp_path: Path) -> None:
    path = tmp_path / "vllm.log"
    path.write_bytes(b"x\n")
    with open(path, "ab", buffering=0) as writer:
        t = LogTailer(path)
        assert t.poll() == ["x"]
        os.unlink(path)
        writer.write(b"still writing\n")
        assert t.poll() == ["still writing"]
        assert t.state.status == "following" and "removed" in t.state.message
        path.write_bytes(b"recreated\n")
        assert t.poll() == ["recreated"]


def test_directory_and_fifo_are_errors(tmp_path: Path) -> None:
    t = LogTailer(tmp_path)
    assert t.poll() == [] and t.state.status == "error" and "directory" in t.state.message
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader, so that opening it cannot block
    try:
        t2 = LogTailer(fifo)
        assert t2.poll() == [] and t2.state.status == "error" and "--log -" in t2.state.message
    finally:
        os.close(fd)


def test_each_poll_reads_a_bounded_amount(tmp_path: Path) -> None:
    path = tmp_path / "vllm.log"
    path.write_bytes(STATS * 40_000)  # ~11 MB, no banner
    t = LogTailer(path, jump_to_last_startup=False, max_read=1 << 20)
    first = t.poll()
    assert 0 < sum(len(x) + 1 for x in first) <= (1 << 20)
    assert t.state.behind > 9_000_000
    rest = drain(t)
    assert len(first) + len(rest) == 80_000


def test_backward_scan_on_a_50_mb_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Proves the scan is bounded by what it reads (every os.pread counted), not by a time:
    # a few MiB of a 50 MB file, however slow the box.
    path = tmp_path / "big.log"
    pad = STATS * (1024 * 1024 // len(STATS))
    h200 = H200.read_bytes()
    with open(path, "wb") as f:
        f.writelines([pad] * 20)
        f.write(BANNER_06)  # an older start, deep inside
        f.writelines([pad] * 28)
        f.write(h200)
        f.write(pad)
    size = path.stat().st_size
    assert size > 50_000_000
    read: list[int] = []
    real_pread = os.pread

    def counted(fd: int, n: int, offset: int) -> bytes:
        data = real_pread(fd, n, offset)
        read.append(len(data))
        return data

    monkeypatch.setattr(os, "pread", counted)
    t = LogTailer(path)
    lines = drain(t)
    monkeypatch.undo()
    scan = t.scan
    assert scan is not None and scan.found and scan.version == "0.26.0"
    assert scan.offset == size - len(pad) - len(h200)  # the logo's first line, not the version line
    assert scan.scanned <= 8 * 1024 * 1024  # two 4 MiB windows at most, not 50 MB
    assert lines[0] == "(APIServer pid=982) INFO 11-30 09:54:35 [api_utils.py:345] "
    # the scan's windows, then the last startup onwards, and a little around them: not 50 MB
    assert read and sum(read) <= 8 * 1024 * 1024 + (size - scan.offset) + 1024 * 1024, sum(read)
    tr = PhaseTracker(year=2026)
    tr.feed_lines(lines, 0.0)
    assert tr.snapshot().facts.kv_cache_tokens == 9_103_456


def test_scan_is_capped_and_falls_back_to_a_line_start_near_the_end(tmp_path: Path) -> None:
    path = tmp_path / "old.log"
    with open(path, "wb") as f:
        f.write(BANNER_06)
        f.write(STATS * 20_000)
    fd = os.open(path, os.O_RDONLY)
    try:
        scan = find_last_startup(fd, max_scan=1 << 20, tail_bytes=64 * 1024)
    finally:
        os.close(fd)
    size = path.stat().st_size
    assert not scan.found and scan.scanned == 1 << 20
    assert size - 64 * 1024 <= scan.offset < size - 60 * 1024
    t = LogTailer(path, max_scan=1 << 20, tail_bytes=64 * 1024)
    first = t.poll()
    assert first[0].startswith("(APIServer pid=982)")  # whole lines only
    assert t.state.startup_found is False


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_h200_log_in_random_chunks_on_a_growing_file(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    data = H200.read_bytes()
    direct = PhaseTracker(year=2026)
    direct.feed_lines(split_all(data), 0.0)

    path = tmp_path / "vllm.log"
    path.write_bytes(b"")
    t = LogTailer(path)
    tracked = PhaseTracker(year=2026)
    pos = 0
    with open(path, "ab", buffering=0) as w:
        while pos < len(data):
            n = rng.choice([1, 7, 64, 333, 1500, 4096, 20_000])
            w.write(data[pos : pos + n])
            pos += n
            if rng.random() < 0.7:
                tracked.feed_lines(t.poll(), 0.0)
    tracked.feed_lines(t.poll(), 0.0)
    assert summary(tracked.snapshot()) == summary(direct.snapshot())
    graphs = tracked.snapshot().phases[6]
    assert [(p.label, p.n) for p in graphs.progress] == [("PIECEWISE", 51), ("FULL", 51)]


# --------------------------------------------------------------------------- StreamTailer (stdin mode)


def test_stream_tailer_on_a_pipe_never_blocks() -> None:
    r, w = os.pipe()
    try:
        s = StreamTailer(r)
        # Proves a poll of an empty pipe returns: nothing is written until it has, so a
        # blocking read could only end at the guard (a hang guard, then unblocked by a write).
        got: list[list[str]] = []
        th = threading.Thread(target=lambda: got.append(s.poll()), daemon=True)
        th.start()
        th.join(30)
        if th.is_alive():
            os.write(w, b"unblock\n")
            th.join(30)
            raise AssertionError("StreamTailer.poll() blocked on an empty pipe")
        assert got == [[]]
        os.write(w, b"a\r\nb")
        assert s.poll() == ["a"]
        os.write(w, FRAME50)
        assert s.poll() == ["b", FRAME50[1:].decode()]
        os.write(w, b"\n\x1b[0;36m(APIServer pid=1)\x1b[0;0m INFO 11-30 09:55:33 [a.py:1] ok\ntail")
        assert s.poll() == ["(APIServer pid=1) INFO 11-30 09:55:33 [a.py:1] ok"]
        assert s.state.status == "following" and s.state.source == "-"
        os.close(w)
        w = -1
        assert s.poll() == ["tail"]
        assert s.state.status == "ended"
        assert s.poll() == []
    finally:
        if w >= 0:
            os.close(w)
        os.close(r)


def test_stream_tailer_bounds_each_poll() -> None:
    r, w = os.pipe()
    try:
        s = StreamTailer(r, max_read=1024, read_chunk=256)
        os.write(w, b"0123456789abcdef\n" * 2000)  # 34 KB, fits the pipe buffer
        first = s.poll()
        assert 50 <= len(first) <= 61
        total = len(first)
        for _ in range(100):
            total += len(s.poll())
        assert total == 2000
    finally:
        os.close(w)
        os.close(r)


def test_open_log_dispatch(tmp_path: Path) -> None:
    assert isinstance(open_log(str(tmp_path / "x.log")), LogTailer)
    assert isinstance(open_log("-"), StreamTailer)


# --------------------------------------------------------------------------- finding a pid's log


def _fake_proc(tmp_path: Path, pid: int, fd1: str | None, fd2: str | None) -> str:
    root = tmp_path / "proc"
    fddir = root / str(pid) / "fd"
    fddir.mkdir(parents=True)
    for name, target in (("1", fd1), ("2", fd2)):
        if target is not None:
            os.symlink(target, fddir / name)
    return str(root)


def test_pid_log_regular_file(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text("x\n")
    loc = find_log_for_pid(42, proc_root=_fake_proc(tmp_path, 42, str(log), str(log)))
    assert (loc.path, loc.stream, loc.message) == (str(log), "stdout", "")


@pytest.mark.parametrize(
    ("target", "words"),
    [
        ("pipe:[4242]", ["pipe", "--log -", "docker logs -f", "--log vllm.log"]),
        ("socket:[99]", ["socket", "journalctl", "--log -"]),
        ("/dev/pts/3", ["terminal", "tee vllm.log", "--log vllm.log"]),
        ("/dev/null", ["discards", "--log vllm.log"]),
    ],
)
def test_pid_log_not_a_file_says_why_and_what_to_do(tmp_path: Path, target: str, words: list[str]) -> None:
    loc = find_log_for_pid(7, proc_root=_fake_proc(tmp_path, 7, target, target))
    assert loc.path is None and loc.target == target
    for word in words:
        assert word in loc.message


def test_pid_log_stderr_file_deleted_file_and_missing_pid(tmp_path: Path) -> None:
    log = tmp_path / "err.log"
    log.write_text("x\n")
    loc = find_log_for_pid(8, proc_root=_fake_proc(tmp_path, 8, "pipe:[1]", str(log)))
    assert loc.path == str(log) and loc.stream == "stderr" and "stderr" in loc.message
    root = str(tmp_path / "proc")
    os.makedirs(f"{root}/9/fd")
    os.symlink("/var/log/vllm.log (deleted)", f"{root}/9/fd/1")
    loc = find_log_for_pid(9, proc_root=root)
    assert loc.path == f"{root}/9/fd/1" and "deleted" in loc.message
    loc = find_log_for_pid(123456, proc_root=root)
    assert loc.path is None and "no process" in loc.message


def test_pid_log_of_a_real_process(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    with open(log, "wb") as out:
        child = subprocess.Popen(["sleep", "30"], stdout=out, stderr=subprocess.STDOUT)
    try:
        loc = find_log_for_pid(child.pid)
        assert loc.path == str(log) and loc.stream == "stdout"
    finally:
        child.kill()
        child.wait()


def test_a_record_quoting_a_bar_is_not_flushed_as_a_frame() -> None:
    sp = LineSplitter()
    assert sp.feed(b"INFO 11-30 09:55:00 [m.py:1] was 50%| 1/2 [00:01<00:01, 1.0it/s]") == []
    assert sp.feed(b" and more\n") == ["INFO 11-30 09:55:00 [m.py:1] was 50%| 1/2 [00:01<00:01, 1.0it/s] and more"]


def test_record_glued_after_a_bar_is_not_cut_when_it_looks_like_a_bar() -> None:
    """Found by hypothesis: a record glued to a bar's last frame, itself ending in
    "n/m [a<b]" while half-written, was emitted early and cut in two."""
    from vtop.sources.logtail import LineSplitter

    rec = "(EngineCore pid=7) INFO 11-30 09:55:00 [m.py:0] 0000/0 [<]0000"
    data = (b"\rBar 0:   0%|          | 0/10 [00:00<00:00, 9.0it/s]"
            b"\rBar 0: 100%|##########| 10/10 [00:00<00:00, 9.10it/s]" + rec.encode() + b"\n")
    for cut in range(1, len(data)):
        sp = LineSplitter()
        lines = [x.rstrip() for x in sp.feed(data[:cut]) + sp.feed(data[cut:]) + sp.flush()]
        assert rec in lines, cut
        assert "Bar 0: 100%|##########| 10/10 [00:00<00:00, 9.10it/s]" in lines, cut


def test_the_state_says_when_the_file_was_last_written_once_caught_up(tmp_path: Path) -> None:
    p = tmp_path / "v.log"
    p.write_bytes(b"INFO 12-02 05:19:52 [x.py:1] Skipping CuTeDSL warmup\n"
                  b"\rCapturing CUDA graphs (PIECEWISE):  10%|#    | 5/51 [00:00<00:00, 48.73it/s]\n")
    os.utime(p, (1_800_000_000.0, 1_800_000_000.0))
    t = LogTailer(p, max_read=64)  # a read budget smaller than the file: catching up first
    t.poll()
    assert t.state.mtime is None  # bytes left to read: the modification time is not the last line's
    while t.state.behind:
        t.poll()
    t.poll()
    assert t.state.mtime == 1_800_000_000.0
    t.close()
    r, w = os.pipe()
    s = StreamTailer(r, name="-")
    os.write(w, b"a line\n")
    s.poll()
    assert s.state.mtime is None  # a pipe has no modification time to speak of
    os.close(w)
    s.close()
