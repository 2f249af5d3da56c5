"""The kernel's view of a server's connections: the real netlink reader against real loopback
sockets, and :class:`vtop.core.requests.conns.ConnTracker`'s judgement of which answer has streamed
since when (injected clocks)."""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass

import pytest

from vtop.core.requests.conns import FLOWING_S, STALE_S, ConnTracker
from vtop.sources.sockets import Conn, ConnRead, conn_read_from_json, conn_read_to_json, read_conns


@pytest.fixture
def pair():
    """A listening socket, a client connected to it, and the server's side."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    cli = socket.create_connection(srv.getsockname())
    acc, _ = srv.accept()
    yield srv.getsockname()[1], cli, acc
    for s in (cli, acc, srv):
        s.close()


def test_the_real_kernel_says_when_the_request_came_and_what_was_sent(pair) -> None:
    port, cli, acc = pair
    cli.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n")
    assert acc.recv(1000)
    time.sleep(0.6)  # the request's age: the kernel counts it (no latency is asserted)
    acc.sendall(b"data: chunk\n\n" * 100)
    got = b""
    while len(got) < 1300:
        got += cli.recv(4096)
    time.sleep(0.05)
    read = read_conns({port})
    assert read.error is None
    assert len(read.conns) == 1, read  # the server's side only: the client's local port is another
    c = read.conns[0]
    assert c.port == port and c.local == f"127.0.0.1:{port}"
    assert c.remote == f"127.0.0.1:{cli.getsockname()[1]}"
    assert c.last_recv_s is not None and c.last_recv_s >= 0.6
    assert c.last_sent_s is not None and c.last_sent_s < c.last_recv_s
    assert c.bytes_received == len(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n")
    assert c.bytes_acked == 1300
    assert read_conns({port + 1 if port < 65535 else port - 1}).conns == ()
    assert read_conns(set()).conns == ()


def test_the_real_kernel_shows_a_request_with_no_answer_yet_as_pending(pair) -> None:
    """A non-streamed completion sends nothing until it ends: the server's side of its connection
    has the request and no byte sent since. Read from the real kernel, fed to the tracker: pending
    from the second read on; answered, it is not; a connection accepted with no request yet never is
    (fails on the old tracker, which knew only answers that stream)."""
    port, cli, acc = pair
    idle_cli = socket.create_connection(("127.0.0.1", port))  # accepted by the kernel, no request sent
    tr = ConnTracker()
    cli.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n")
    assert acc.recv(1000)
    reads = []
    for _ in range(2):
        time.sleep(0.3)
        read = read_conns({port})
        assert read.error is None
        reads.append(read)
        tr.feed(read.mono, read.conns)
    mine = [c for c in reads[-1].conns if c.remote == f"127.0.0.1:{cli.getsockname()[1]}"]
    assert len(mine) == 1 and mine[0].bytes_received and mine[0].last_sent_s is not None
    assert mine[0].last_recv_s is not None and mine[0].last_sent_s >= mine[0].last_recv_s
    got = tr.in_flight(reads[-1].mono)
    assert [(g.remote, g.pending) for g in got] == [(f"127.0.0.1:{cli.getsockname()[1]}", True)], got
    assert tr.streaming(reads[-1].mono) == [] and got[0].age_s >= 0.6
    # the answer, whole: not pending from the next read on (its bytes moved: counted as an answer
    # that ends within FLOWING_S, as a stream's end is)
    acc.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
    assert cli.recv(1000)
    for _ in range(2):
        time.sleep(0.05)
        read = read_conns({port})
        tr.feed(read.mono, read.conns)
    assert [g for g in tr.in_flight(read.mono) if g.pending] == []
    idle_cli.close()


def test_ipv6_connections_are_read_too() -> None:
    try:
        srv = socket.socket(socket.AF_INET6)
        srv.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback on this box")
    with srv:
        srv.listen()
        port = srv.getsockname()[1]
        with socket.create_connection(("::1", port)) as cli, srv.accept()[0] as acc:
            cli.sendall(b"GET / HTTP/1.1\r\n\r\n")
            acc.recv(100)
            read = read_conns({port})
    assert [c.local for c in read.conns] == [f"[::1]:{port}"]


def test_a_read_round_trips_through_json_and_bad_rows_are_skipped() -> None:
    c = Conn("127.0.0.1:8000", "127.0.0.1:40922", 0.1, 75.2, 123456, 812)
    read = ConnRead(1000.0, 50.0, (c,))
    back = conn_read_from_json(conn_read_to_json(read))
    assert back == read
    row = {"t": 1.0, "mono": 2.0, "conns": [{"local": "x"}, {"local": "a:b", "remote": "c:1"}, "junk",
                                            {"local": "127.0.0.1:8000", "remote": "c:1", "last_recv_s": -3}]}
    got = conn_read_from_json(row)
    assert len(got.conns) == 1 and got.conns[0].last_recv_s is None  # a negative counter is no reading
    with pytest.raises(KeyError):
        conn_read_from_json({"conns": []})


@dataclass
class C:
    local: str
    remote: str
    last_sent_s: float | None
    last_recv_s: float | None
    bytes_acked: int | None


def streaming_for(tr: ConnTracker, start: float, n: int, *, remote: str = "127.0.0.1:40922", req_age: float = 0.0,
                  step: float = 1.0, rate: int = 1000) -> float:
    """Feed ``n`` reads of one connection streaming since its request came ``req_age`` s before ``start``."""
    t = start
    for i in range(n):
        t = start + i * step
        tr.feed(t, [C("127.0.0.1:8000", remote, 0.05, req_age + i * step, 100 + rate * i)])
    return t


def test_an_answer_streaming_since_its_request_is_as_old_as_the_request() -> None:
    tr = ConnTracker()
    t = streaming_for(tr, 100.0, 1, req_age=70.0)
    assert tr.oldest(t) is None  # one read proves nothing is still moving
    t = streaming_for(tr, 100.0, 3, req_age=70.0)
    s = tr.oldest(t)
    assert s is not None and s.remote == "127.0.0.1:40922"
    assert s.since == pytest.approx(30.0) and s.age_s == pytest.approx(72.0)
    assert s.seen_s == pytest.approx(2.0) and s.bytes_sent == 2000 and s.others == 0


def test_short_requests_on_a_kept_alive_connection_never_grow_old() -> None:
    tr = ConnTracker()
    # a new request every 3 s on the same connection: its arrival moves on each time
    for i in range(30):
        tr.feed(100.0 + i, [C("127.0.0.1:8000", "127.0.0.1:48516", 0.2, float(i % 3) + 0.3, 100 * (i // 3))])
        s = tr.oldest(100.0 + i)
        assert s is None or s.age_s < 4.0


def test_a_finished_answer_and_an_idle_connection_do_not_count() -> None:
    tr = ConnTracker()
    t = streaming_for(tr, 100.0, 5, req_age=60.0)
    assert tr.oldest(t) is not None
    # the answer ended: no more bytes, last data sent grows; a moment after, it may still be flowing
    # (two reads close together can see one count), FLOWING_S after, it is over
    tr.feed(t + 1, [C("127.0.0.1:8000", "127.0.0.1:40922", 1.0, 65.0, 4100)])
    assert tr.oldest(t + 1) is not None
    tr.feed(t + FLOWING_S + 0.5, [C("127.0.0.1:8000", "127.0.0.1:40922", FLOWING_S + 0.5, 64.0 + FLOWING_S + 0.5, 4100)])
    assert tr.oldest(t + FLOWING_S + 0.5) is None
    # a request waiting for its answer (nothing sent since it came) is not a streaming answer: it is
    # in flight, pending
    tr2 = ConnTracker()
    for i in range(5):
        tr2.feed(100.0 + i, [C("127.0.0.1:8000", "127.0.0.1:5000", 80.0 + i, 70.0 + i, 10)])
    assert tr2.oldest(104.0, pending=False) is None and tr2.streaming(104.0) == []
    p = tr2.oldest(104.0)
    assert p is not None and p.pending and p.age_s == pytest.approx(74.0)


def test_without_byte_counters_recent_sends_stand_in() -> None:
    tr = ConnTracker()
    for i in range(3):
        tr.feed(100.0 + i, [C("127.0.0.1:8000", "10.0.0.7:5555", 0.1, 90.0 + i, None)])
    s = tr.oldest(102.0)
    assert s is not None and s.bytes_sent is None and s.age_s == pytest.approx(92.0)
    tr.feed(103.0, [C("127.0.0.1:8000", "10.0.0.7:5555", FLOWING_S + 1, 93.0, None)])
    assert tr.oldest(103.0) is None


def test_the_oldest_of_several_and_what_goes_stale_or_fails() -> None:
    tr = ConnTracker()
    for i in range(3):
        tr.feed(100.0 + i, [C("127.0.0.1:8000", "a:1", 0.1, 10.0 + i, 100 * i),
                            C("127.0.0.1:8000", "b:2", 0.1, 80.0 + i, 100 * i)])
    got = tr.streaming(102.0)
    assert [s.remote for s in got] == ["b:2", "a:1"] and got[0].others == 1
    assert tr.oldest(102.0 + STALE_S + 1) is None  # the reads stopped: nothing is known of now
    tr.feed(103.0, [], error="the kernel's socket table could not be read: denied")
    assert tr.oldest(103.0) is None and tr.error is not None and tr.last_mono is None


def test_the_monitor_gives_each_local_server_its_port_and_a_recording_keeps_the_reads(tmp_path) -> None:
    from vtop.config import Config
    from vtop.monitor import Monitor
    from vtop.sources.recording.record import Recorder, load

    f = tmp_path / "r.jsonl"
    rec = Recorder(f)
    m = Monitor(Config(urls=("http://127.0.0.1:8000", "http://10.1.2.3:8001")), recorder=rec)
    m.add_cli_urls()
    assert m.conn_ports() == frozenset({8000})  # a remote server's connections are not this kernel's
    reads = []
    for i in range(3):
        conns = (Conn("127.0.0.1:8000", "127.0.0.1:40922", 0.05, 70.0 + i, 1000 * (i + 1), 300),
                 Conn("10.9.9.9:8001", "10.0.0.1:5000", 0.05, 90.0 + i, 1000 * (i + 1), 300))
        reads.append(ConnRead(1000.0 + i, 100.0 + i, conns))
        m.apply_conns(reads[-1])
    local, remote = m.servers["http://127.0.0.1:8000"], m.servers["http://10.1.2.3:8001"]
    s = local.conns.oldest(102.0)
    assert s is not None and s.remote == "127.0.0.1:40922" and s.age_s == pytest.approx(72.0)
    assert remote.conns.last_mono is None and remote.conns.oldest(102.0) is None
    rec.close()
    _, events = load(f)
    assert [e.data for e in events if e.kind == "conns"] == reads
    # replayed, the same reads reach the same tracker
    m2 = Monitor(Config(urls=("http://127.0.0.1:8000",)), live=False)
    m2.add_cli_urls()
    for e in events:
        if e.kind == "conns":
            m2.apply_conns(e.data)
    s2 = m2.servers["http://127.0.0.1:8000"].conns.oldest(102.0)
    assert s2 is not None and s2.age_s == s.age_s


def test_a_recorder_writes_no_conns_line_while_there_are_none(tmp_path) -> None:
    from vtop.sources.recording.record import Recorder, read

    f = tmp_path / "r.jsonl"
    rec = Recorder(f)
    empty = ConnRead(1.0, 1.0, ())
    one = ConnRead(2.0, 2.0, (Conn("127.0.0.1:8000", "127.0.0.1:1", 0.1, 0.2, 10, 10),))
    for r in (empty, empty, one, empty, empty):
        rec.conns(r)
    rec.close()
    rows = [r for r in read(f) if r.get("kind") == "conns"]
    assert [len(r["conns"]) for r in rows] == [1, 0]  # the one, then once when they went


def test_the_kernel_side_port_filter_keeps_exactly_what_an_unfiltered_dump_keeps() -> None:
    """The filter (``INET_DIAG_REQ_BYTECODE``, vtop/sources/sockets.py ``port_filter``) is checked by the
    kernel's audit: a wrong jump is refused with EINVAL (read_conns would fall back to the full dump)."""
    import socket as so

    from vtop.sources.sockets import _dump

    servers, socks = [], []
    try:
        for n in (3, 1):
            srv = so.socket()
            srv.bind(("127.0.0.1", 0))
            srv.listen()
            servers.append(srv)
            for _ in range(n):
                c = so.create_connection(srv.getsockname())
                socks += [c, srv.accept()[0]]
        a, b = (s.getsockname()[1] for s in servers)
        deadline = time.monotonic() + 10
        for ports in ({a}, {b}, {a, b}, {b, 1, 5, a}, {a - 1, a + 1}):
            filtered = sorted(c.remote for c in _dump(so.AF_INET, frozenset(ports), deadline))
            full = sorted(c.remote for c in _dump(so.AF_INET, frozenset(ports), deadline, filtered=False))
            assert filtered == full, ports
        assert len(_dump(so.AF_INET, frozenset({a, b}), deadline)) == 4
    finally:
        for s in socks + servers:
            s.close()


def test_the_live_feed_reads_connections_only_while_a_local_server_has_a_request_running() -> None:
    from vtop.config import Config
    from vtop.monitor import Monitor
    from vtop.monitor.live import LiveFeed
    from vtop.sources.vllm import poll_from_body

    m = Monitor(Config(urls=("http://127.0.0.1:8000", "http://10.1.2.3:8001"), no_gpu=True), find_logs=False)
    feed = LiveFeed(m, gpu_source=None, discover=None)
    m.add_cli_urls()
    assert feed._busy_ports() == frozenset({8000})  # not polled yet: read (a doctor's window is short)

    def poll(running: int) -> None:
        text = f'vllm:num_requests_running{{model_name="m"}} {running}\nvllm:num_requests_waiting{{model_name="m"}} 0\n'
        m.apply_server("http://127.0.0.1:8000", poll_from_body("http://127.0.0.1:8000", text, t=1.0, mono=1.0))

    poll(0)
    assert feed._busy_ports() == frozenset()  # idle: no dump
    poll(2)
    assert feed._busy_ports() == frozenset({8000})
    # /metrics stops answering under load (a timeout: stale): the kernel's counters are the evidence left, read on
    from vtop.sources.vllm import poll_from_error

    m.apply_server("http://127.0.0.1:8000", poll_from_error("http://127.0.0.1:8000", "timeout", t=2.0, mono=2.0))
    assert feed._busy_ports() == frozenset({8000})
    # ... also where it never answered at all (vtop started while it was already too loaded to answer)
    m2 = Monitor(Config(urls=("http://127.0.0.1:8000",), no_gpu=True), find_logs=False)
    feed2 = LiveFeed(m2, gpu_source=None, discover=None)
    m2.add_cli_urls()
    m2.apply_server("http://127.0.0.1:8000", poll_from_error("http://127.0.0.1:8000", "timeout", t=2.0, mono=2.0))
    v = m2.servers["http://127.0.0.1:8000"].last_view
    assert v is not None and v.state == "stale" and v.metrics is None, v
    assert feed2._busy_ports() == frozenset({8000})
    # refused (nothing listens: down or starting): no dump
    m2.apply_server("http://127.0.0.1:8000", poll_from_error("http://127.0.0.1:8000", "refused", t=3.0, mono=3.0))
    assert m2.servers["http://127.0.0.1:8000"].last_view.state in ("down", "starting")
    assert feed2._busy_ports() == frozenset()


def test_reads_come_faster_while_a_long_answer_streams_so_a_hang_up_clears_at_once() -> None:
    from vtop.core.requests.conns import FAST_AFTER_S, FAST_READ_S, READ_EVERY_S

    tr = ConnTracker()
    assert tr.read_every() == READ_EVERY_S
    streaming_for(tr, 100.0, 3, req_age=5.0)
    assert tr.read_every() == READ_EVERY_S  # a short answer: the usual cadence
    tr2 = ConnTracker()
    t = streaming_for(tr2, 100.0, 3, req_age=FAST_AFTER_S)
    assert tr2.read_every() == FAST_READ_S
    tr2.feed(t + FAST_READ_S, [])  # hung up: gone from the next read, 2 s later
    assert tr2.oldest(t + FAST_READ_S) is None and tr2.read_every() == READ_EVERY_S


def test_a_replayed_runaway_alert_does_not_come_back_after_its_client_hung_up() -> None:
    """runaway-short-traffic-no-request-log: the client hangs up at +2 min while short requests go on.
    Read every 10 s, the last read's claim outlived the hang-up and the alert came back for a second."""
    from pathlib import Path

    from vtop.config import Config
    from vtop.monitor.player import open_recording

    trace = Path(__file__).resolve().parents[1] / "corpus" / "traces" / "runaway-short-traffic-no-request-log"
    player = open_recording(str(trace), config=Config())
    m = player.play_to_end()
    ups = []
    was = False
    for ch in m.alert_log:
        on = any(a.rule == "runaway" and a.severity in ("warning", "critical") for a in ch.alerts)
        if on and not was:
            ups.append(ch.mono)
        was = on
    assert len(ups) == 1, f"the runaway alert came {len(ups)} times"
    assert not was  # cleared by the end


def test_two_reads_a_moment_apart_keep_an_answer_streaming() -> None:
    """A read right after another sees the same byte count while the answer flows (a live doctor read
    twice within 0.1 s and lost the runaway for the rest of its window)."""
    tr = ConnTracker()
    t = streaming_for(tr, 100.0, 3, req_age=50.0)
    assert tr.oldest(t) is not None
    tr.feed(t + 0.1, [C("127.0.0.1:8000", "127.0.0.1:40922", 0.05, 52.1, 100 + 1000 * 2)])  # no new byte yet
    s = tr.oldest(t + 0.1)
    assert s is not None and s.age_s == pytest.approx(52.1)
    # ... but an answer whose bytes stopped for longer than FLOWING_S is no longer streaming
    tr.feed(t + FLOWING_S + 1, [C("127.0.0.1:8000", "127.0.0.1:40922", 0.05, 52.0 + FLOWING_S + 1, 100 + 1000 * 2)])
    assert tr.oldest(t + FLOWING_S + 1) is None


def test_the_conns_thread_learns_its_next_wait_before_it_resumes() -> None:
    """The PollLoop thread waits for its result to be applied and then for ``interval``: the interval a
    long answer asks for is set while applying, so the next read comes 2 s later (not 10 s, and not at once)."""
    from vtop.config import Config
    from vtop.core.requests.conns import FAST_READ_S, READ_EVERY_S
    from vtop.monitor import Monitor
    from vtop.monitor.live import LiveFeed
    from vtop.monitor.polling import PollLoop

    m = Monitor(Config(urls=("http://127.0.0.1:8000",), no_gpu=True), find_logs=False)
    feed = LiveFeed(m, gpu_source=None, discover=None)
    m.add_cli_urls()
    feed.conns_loop = PollLoop("conns", READ_EVERY_S, lambda: None, feed._on_conns, at_tick=True)
    for i in range(3):
        read = ConnRead(1000.0 + i, 100.0 + i, (Conn("127.0.0.1:8000", "127.0.0.1:40922", 0.05, 30.0 + i,
                                                     1000 * (i + 1), 300),))
        feed._on_conns(read, None)
    assert feed.conns_loop.interval == FAST_READ_S
    feed._on_conns(ConnRead(1003.0, 103.0, ()), None)  # hung up
    assert feed.conns_loop.interval == READ_EVERY_S


# ------------------------------------------------------------------ reads on a loaded box (issue 39)


def test_an_answer_the_kernel_has_given_is_read_however_late_the_thread_gets_to_it(pair) -> None:
    """The deadline bounds the wait for the kernel, not the reading thread's turn on the CPU: a read whose
    deadline passed before it looked (as under load, when the thread got the CPU seconds late) still takes
    the dump the kernel gave. The old reader judged the wall clock after each message and gave it up."""
    port, cli, acc = pair
    cli.sendall(b"GET / HTTP/1.1\r\n\r\n")
    assert acc.recv(100)
    read = read_conns({port}, timeout_s=0.0)
    assert read.error is None and [c.remote for c in read.conns] == [f"127.0.0.1:{cli.getsockname()[1]}"]


def test_a_read_given_up_keeps_what_was_known_and_a_denied_one_forgets() -> None:
    from vtop.model.requests import READ_GIVEN_UP

    tr = ConnTracker()
    for i in range(3):
        tr.feed(100.0 + i, [C("127.0.0.1:8000", "b:2", 0.1, 80.0 + i, 100 * i)])
    assert tr.oldest(102.0) is not None
    tr.feed(104.0, [], error=f"the kernel's socket dump {READ_GIVEN_UP}")
    got = tr.oldest(104.0)
    assert got is not None and got.remote == "b:2" and tr.error is not None and tr.last_mono == 102.0
    assert tr.reads == 3
    assert tr.oldest(102.0 + STALE_S + 1) is None  # what it knew goes stale as before
    # the next good read goes on with the same request (its age from when it came, not from this read)
    tr.feed(106.0, [C("127.0.0.1:8000", "b:2", 0.1, 86.0, 700)])
    again = tr.oldest(106.0)
    assert again is not None and again.age_s == pytest.approx(86.0) and tr.error is None
    tr.feed(107.0, [], error="the connections in the network namespace of pid 7 could not be read: denied")
    assert tr.oldest(107.0) is None and tr.last_mono is None


def test_a_request_that_looks_old_and_flowing_at_its_first_read_is_read_again_soon() -> None:
    from vtop.core.requests.conns import FAST_AFTER_S, FAST_READ_S, READ_EVERY_S

    tr = ConnTracker()
    # first sight: the request came FAST_AFTER_S + 5 s ago and a byte went out 0.2 s ago: one more read says
    tr.feed(100.0, [C("127.0.0.1:8000", "b:2", 0.2, FAST_AFTER_S + 5, 100)])
    assert tr.oldest(100.0) is None and tr.read_every() == FAST_READ_S
    # a young request, or an old connection idle since its answer: the usual pace
    young = ConnTracker()
    young.feed(100.0, [C("127.0.0.1:8000", "b:2", 0.2, 3.0, 100)])
    idle = ConnTracker()
    idle.feed(100.0, [C("127.0.0.1:8000", "b:2", FAST_AFTER_S + 1, FAST_AFTER_S + 2, 100)])
    assert young.read_every() == READ_EVERY_S and idle.read_every() == READ_EVERY_S


def _in_new_netns(pid: int, fn):
    """Run ``fn`` in a thread that entered ``pid``'s network namespace; its result."""
    import threading

    from vtop.sources.sockets import setns_net

    out: list = []

    def run() -> None:
        setns_net(f"/proc/{pid}/ns/net")
        out.append(fn())

    th = threading.Thread(target=run)
    th.start()
    th.join(10)
    return out[0]


def _loopback_up() -> bool:
    """Bring ``lo`` up in the calling thread's network namespace with the kernel's own ioctls
    (SIOCGIFFLAGS 0x8913 / SIOCSIFFLAGS 0x8914, IFF_UP 1), as ``ip link set lo up`` does: the CI box has
    no ip(8), and a new namespace's loopback starts down (connect: ENETUNREACH). False if it cannot."""
    import fcntl
    import struct

    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        req = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s.fileno(), 0x8913, req))[1]
        fcntl.ioctl(s.fileno(), 0x8914, struct.pack("16sH14x", b"lo", flags | 1))
        return True
    except OSError:
        return False
    finally:
        s.close()


def _can_setns() -> bool:
    import os

    return os.geteuid() == 0


@pytest.mark.skipif(not _can_setns(), reason="entering another network namespace needs root")
def test_a_socket_made_in_a_containers_namespace_is_kept_and_reads_there_and_is_let_go() -> None:
    """A process in a network namespace of its own (``unshare --net``, as a container without
    ``--network host``): its loopback connection is read there over one socket made once, not in vtop's
    namespace; the socket is closed once the process is no longer read."""
    import shutil
    import subprocess

    from vtop.sources.sockets import NetnsSockets, read_conns_in

    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) here")
    proc = subprocess.Popen(["unshare", "--net", "sleep", "60"])
    try:
        deadline = time.monotonic() + 10
        import os

        while os.readlink(f"/proc/{proc.pid}/ns/net") == os.readlink("/proc/self/ns/net") or \
                "sleep" not in open(f"/proc/{proc.pid}/cmdline").read():
            assert time.monotonic() < deadline, "unshare never entered its namespace"
            time.sleep(0.05)

        def listen_and_connect():
            if not _loopback_up():
                return None
            srv = socket.socket()
            srv.bind(("127.0.0.1", 0))
            srv.listen()
            cli = socket.create_connection(srv.getsockname())
            acc, _ = srv.accept()
            cli.sendall(b"GET / HTTP/1.1\r\n\r\n")
            acc.recv(100)
            return srv, cli, acc

        got = _in_new_netns(proc.pid, listen_and_connect)
        if got is None:
            pytest.skip("no loopback in a new namespace here")
        srv, cli, acc = got
        port = srv.getsockname()[1]
        try:
            socks = NetnsSockets()
            reads = [read_conns_in(proc.pid, {port}, url="http://x", sockets=socks) for _ in range(3)]
            assert all(r.error is None and r.url == "http://x" for r in reads), [r.error for r in reads]
            assert [c.local for c in reads[-1].conns] == [f"127.0.0.1:{port}"]
            assert socks.made == 1  # one socket for three reads: no thread a read
            assert not [c for c in read_conns({port}).conns if c.local == f"127.0.0.1:{port}"]  # not vtop's namespace
            socks.keep_only(set())
            assert socks.made == 1 and len(socks) == 0  # the socket let go
        finally:
            for s in (cli, acc, srv):
                s.close()
    finally:
        proc.kill()
        proc.wait()
