"""The stop action's parts (issue 41): the netlink messages of SOCK_DESTROY (built and parsed against
the kernel ABI's layout), the capability check, the target of a request, the verdict from what vLLM
shows after the close; and the close itself on a real loopback connection (needs CAP_NET_ADMIN)."""

from __future__ import annotations

import errno
import socket
import struct
import time
from pathlib import Path

import pytest

from vtop.actions import sockdestroy as sd
from vtop.actions.stop import (
    CloseResult,
    Observation,
    StopTarget,
    cap_eff,
    close_connection,
    missing_privilege,
    target_for,
    tokens_words,
    verdict,
)
from vtop.model.requests import CONNECTION, LOG, METRICS_BOUND, InFlightRequest

URL = "http://127.0.0.1:8000"
V4 = socket.inet_aton("127.0.0.1") + bytes(12)
MAPPED = bytes(10) + b"\xff\xff" + socket.inet_aton("10.0.0.7")


def _msg(family: int, state: int, sport: int, dport: int, src: bytes, dst: bytes, cookie: tuple[int, int],
         seq: int = 1) -> bytes:
    """One inet_diag_msg record as the kernel sends it (a nlmsghdr, the message, an attribute)."""
    body = struct.pack("=BBBB", family, state, 0, 0) + struct.pack("!HH16s16s", sport, dport, src, dst)
    body += struct.pack("=III", 0, *cookie) + struct.pack("=IIIII", 0, 0, 0, 0, 4242)
    body += struct.pack("=HH", 8, 99) + b"abcd"  # an attribute: skipped
    return struct.pack("=IHHII", 16 + len(body), sd.SOCK_DIAG_BY_FAMILY, 2, seq, 0) + body


def _done(seq: int = 1) -> bytes:
    return struct.pack("=IHHII", 20, sd.NLMSG_DONE, 2, seq, 0) + b"\0\0\0\0"


def _err(code: int, seq: int) -> bytes:
    return struct.pack("=IHHII", 36, sd.NLMSG_ERROR, 0, seq, 0) + struct.pack("=i", code) + bytes(16)


def test_destroy_request_names_exactly_one_socket_with_its_cookie_and_asks_for_an_ack() -> None:
    sid = sd.SockId(socket.AF_INET, 8000, 51234, V4, V4, 3, (77, 1))
    raw = sd.destroy_request(sid, 9)
    mlen, mtype, flags, seq, pid = struct.unpack_from("=IHHII", raw)
    assert (mlen, mtype, flags, seq, pid) == (len(raw), 21, 0x1 | 0x4, 9, 0)
    assert len(raw) == 16 + 8 + 48  # nlmsghdr + inet_diag_req_v2 (with its sockid)
    fam, proto, ext, pad, states = struct.unpack_from("=BBBBI", raw, 16)
    assert (fam, proto, ext, pad, states) == (socket.AF_INET, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF)
    sport, dport, src, dst = struct.unpack_from("!HH16s16s", raw, 24)
    assert (sport, dport, src, dst) == (8000, 51234, V4, V4)
    assert struct.unpack_from("=III", raw, 24 + 36) == (3, 77, 1)


def test_dump_request_asks_for_established_sockets_of_one_port_with_the_port_filter() -> None:
    from vtop.sources.sockets import port_filter

    raw = sd.dump_request(socket.AF_INET6, 8000, 5)
    mlen, mtype, flags, seq, _ = struct.unpack_from("=IHHII", raw)
    assert (mlen, mtype, flags & 0x300, seq) == (len(raw), 20, 0x300, 5)
    assert struct.unpack_from("=BBBBI", raw, 16) == (socket.AF_INET6, socket.IPPROTO_TCP, 0, 0, 1 << 1)
    bc = port_filter(frozenset({8000}))
    rlen, rtype = struct.unpack_from("=HH", raw, 16 + 56)
    assert (rlen, rtype) == (4 + len(bc), 1) and raw.endswith(bc)


def test_parse_dump_keeps_established_sockets_and_names_a_mapped_peer_as_ipv4() -> None:
    data = (_msg(socket.AF_INET, 1, 8000, 40000, V4, V4, (5, 0))
            + _msg(socket.AF_INET, 7, 8000, 40001, V4, V4, (6, 0))  # TCP_CLOSE: not one
            + _msg(socket.AF_INET6, 1, 8000, 40002, MAPPED, MAPPED, (7, 0)))
    b = sd.parse_dump(data)
    assert not b.done and b.error == 0
    assert [(s.remote, s.cookie) for s in b.socks] == [("127.0.0.1:40000", (5, 0)), ("10.0.0.7:40002", (7, 0))]
    assert b.socks[0].local == "127.0.0.1:8000"
    v6 = sd.SockId(socket.AF_INET6, 8000, 1, bytes(15) + b"\1", bytes(15) + b"\1", 0, (0, 0))
    assert v6.remote == "[::1]:1"
    end = sd.parse_dump(_msg(socket.AF_INET, 1, 8000, 40000, V4, V4, (5, 0)) + _done())
    assert end.done and len(end.socks) == 1
    bad = sd.parse_dump(_err(-errno.EINVAL, 1))
    assert bad.done and bad.error == errno.EINVAL
    assert sd.parse_dump(b"\x05\0\0\0").socks == ()  # a short datagram: nothing, no error


def test_parse_ack_reads_the_errno_of_its_own_request_only() -> None:
    assert sd.parse_ack(_err(0, 9), 9) == 0
    assert sd.parse_ack(_err(-errno.EPERM, 9), 9) == errno.EPERM
    assert sd.parse_ack(_err(-errno.ENOENT, 8) + _err(0, 9), 9) == 0
    assert sd.parse_ack(_err(0, 8), 9) is None and sd.parse_ack(b"", 9) is None


def _status(tmp_path: Path, caps: int) -> str:
    p = tmp_path / "status"
    p.write_text(f"Name:\tvtop\nCapInh:\t0000000000000000\nCapEff:\t{caps:016x}\n")
    return str(p)


def test_missing_privilege_reads_capeff_net_admin_and_in_a_container_sys_admin(tmp_path: Path) -> None:
    full = (1 << 41) - 1
    assert cap_eff("CapEff:\t000001fffeffefff\n") == 0x1FFFEFFEFFF
    assert missing_privilege(netns=True, status_path=_status(tmp_path, full)) is None
    why = missing_privilege(netns=False, status_path=_status(tmp_path, full & ~(1 << 12)))
    assert why is not None and "CAP_NET_ADMIN" in why and "nothing was closed" in why
    assert missing_privilege(netns=False, status_path=_status(tmp_path, full & ~(1 << 21))) is None
    why = missing_privilege(netns=True, status_path=_status(tmp_path, full & ~(1 << 21)))
    assert why is not None and "CAP_SYS_ADMIN" in why and "CAP_NET_ADMIN" not in why
    why = missing_privilege(netns=False, status_path=str(tmp_path / "nope"))
    assert why is not None and "nothing was closed" in why


def test_without_the_capability_the_close_is_not_tried_and_the_connection_stays(tmp_path: Path) -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]
    with srv, socket.create_connection(("127.0.0.1", port)) as c:
        conn, _ = srv.accept()
        with conn:
            client = "{}:{}".format(*c.getsockname())
            r = InFlightRequest(URL, (CONNECTION,), 60.0, 60.0, client=client)
            t = StopTarget(r, URL, port, client)
            res = close_connection(t, status_path=_status(tmp_path, 0))
            assert res.refused and not res.closed and "CAP_NET_ADMIN" in res.message
            c.sendall(b"x")  # the connection is still there, both ways
            assert conn.recv(1) == b"x"


@pytest.mark.skipif(missing_privilege(netns=False) is not None, reason="no CAP_NET_ADMIN here")
def test_close_connection_closes_the_one_connection_and_not_its_neighbour() -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]
    with srv, socket.create_connection(("127.0.0.1", port)) as c1, socket.create_connection(("127.0.0.1", port)) as c2:
        a1, _ = srv.accept()
        a2, _ = srv.accept()
        with a1, a2:
            by_port = {a.getpeername()[1]: a for a in (a1, a2)}
            s1 = by_port[c1.getsockname()[1]]
            s2 = by_port[c2.getsockname()[1]]
            client = "{}:{}".format(*c1.getsockname())
            r = InFlightRequest(URL, (CONNECTION,), 60.0, 60.0, client=client)
            res = close_connection(StopTarget(r, URL, port, client))
            assert res.closed and res.gone is True, res.message
            for sock in (s1, c1, s2):
                sock.settimeout(5)  # a connection left open fails the test, never hangs it
            with pytest.raises(ConnectionAbortedError):
                s1.recv(1)
            with pytest.raises(ConnectionResetError):
                c1.recv(1)
            c2.sendall(b"y")  # the neighbour goes on
            assert s2.recv(1) == b"y"
            again = close_connection(StopTarget(r, URL, port, client))
            assert not again.closed and again.gone is True and "ended before" in again.message
            assert sd.find(port, client, time.monotonic() + 2) is None


class _Proc:
    pid = 4242
    own_netns = True
    inner_port = 8000


def test_target_for_names_the_connection_and_says_why_not_without_one() -> None:
    r = InFlightRequest(URL, (CONNECTION, LOG), 60.0, 60.0, client="172.17.0.1:5000", request_id="chatcmpl-1")
    t = target_for("http://127.0.0.1:18000", _Proc(), r, local=True)
    assert isinstance(t, StopTarget) and (t.port, t.netns_pid, t.client) == (8000, 4242, "172.17.0.1:5000")
    assert "network namespace (pid 4242)" in t.where
    t = target_for(URL, None, r, local=True)
    assert isinstance(t, StopTarget) and (t.port, t.netns_pid) == (8000, None)
    assert "another box" in str(target_for("http://gpu7:8000", None, r, local=False))
    no_conn = InFlightRequest(URL, (METRICS_BOUND,), 90.0, None)
    assert "no connection" in str(target_for(URL, None, no_conn, local=True))


def test_tokens_so_far_are_said_from_the_request_not_made_up() -> None:
    r = InFlightRequest(URL, (CONNECTION,), 60.0, 60.0, client="a:1", answer_bytes=2048)
    assert "2,048 bytes" in tokens_words(r) and "not known per request" in tokens_words(r)
    pending = InFlightRequest(URL, (CONNECTION,), 60.0, 60.0, client="a:1", answer_pending=True)
    assert "no byte of its answer" in tokens_words(pending)


OK = CloseResult(True, "closed the connection from a:1 to port 8000", gone=True)


def test_verdict_stopped_only_when_vllm_shows_the_abort() -> None:
    before = Observation(0.0, 2.0, 5.0, waiting=1.0, finished=10.0)
    assert verdict(OK, before, Observation(1.0, 2.0, 5.0, waiting=1.0, finished=10.0))[:2] == (False, False)  # not yet
    # running + waiting down by one with no finish counted: it left unfinished (vLLM 0.32 counts no abort)
    final, ok, line = verdict(OK, before, Observation(1.5, 1.0, 5.0, waiting=1.0, finished=10.0))
    assert final and ok and "running + waiting 3 -> 2 since the confirmation with 0 finished: 1 left unfinished" in line, line
    # running down by one, and one finish counted: another request ended; the runaway may go on
    assert verdict(OK, before, Observation(2.0, 1.0, 5.0, waiting=1.0, finished=11.0))[:2] == (False, False)
    # a waiting request taken in (running up, waiting down) while one finished: nothing left unfinished
    assert verdict(OK, before, Observation(2.0, 2.0, 5.0, waiting=0.0, finished=11.0))[:2] == (False, False)
    final, ok, line = verdict(OK, before, Observation(16.0, 2.0, 5.0, waiting=1.0, finished=10.0))
    assert final and not ok and line.startswith("did not work") and "nothing left unfinished" in line
    # requests came and went: an arrival hides a departure, so the gauges cannot tell either way
    final, ok, line = verdict(OK, before, Observation(16.0, 2.0, 5.0, waiting=1.0, finished=11.0))
    assert final and not ok and line.startswith("not confirmed") and "came and went" in line
    # short requests arriving since hide it over the whole span, not between two polls
    prev = Observation(2.5, 3.0, 5.0, waiting=0.0, finished=12.0)
    final, ok, line = verdict(OK, before, Observation(3.0, 2.0, 5.0, waiting=0.0, finished=12.0), prev)
    assert final and ok and "3 -> 2 since the poll before with 0 finished: 1 left unfinished" in line, line
    assert verdict(OK, before, Observation(3.0, 2.0, 5.0, waiting=0.0, finished=13.0), prev)[:2] == (False, False)
    # nothing in flight any more (it was, at the confirmation): it is gone whatever came and went
    final, ok, line = verdict(OK, before, Observation(4.0, 0.0, 5.0, waiting=0.0, finished=15.0), prev)
    assert final and ok and "nothing in flight any more: running + waiting 3 -> 0" in line, line
    # the abort counter (a vLLM that counts aborts of clients that hung up)
    final, ok, line = verdict(OK, before, Observation(1.0, 1.0, 6.0, waiting=1.0, finished=11.0))
    assert final and ok and "abort counter 5 -> 6" in line
    # no finish counter exported: running dropping is the evidence
    assert verdict(OK, Observation(0.0, 2.0, None), Observation(1.0, 1.0, None))[:2] == (True, True)
    # the log's abort line
    assert verdict(OK, before, Observation(1.0, 2.0, 5.0, abort_logged=True, waiting=1.0, finished=10.0))[:2] == \
        (True, True)


def test_verdict_says_why_a_close_did_not_work() -> None:
    refused = CloseResult(False, "vtop lacks CAP_NET_ADMIN (...): nothing was closed", refused=True)
    final, ok, line = verdict(refused, Observation(0.0, 1.0, 0.0), Observation(0.1, 1.0, 0.0))
    assert final and not ok and line == "did not work: vtop lacks CAP_NET_ADMIN (...): nothing was closed"
    still = CloseResult(True, "closed the connection from a:1 to port 8000", gone=False)
    assert "still lists it" in verdict(still, Observation(0.0, 1.0, 0.0), Observation(0.1, 1.0, 1.0))[2]


@pytest.mark.skipif(missing_privilege(netns=False) is not None, reason="no CAP_NET_ADMIN here")
def test_the_close_bounds_its_waits_for_the_kernel_not_the_threads_turn() -> None:
    """A deadline already past when the close looks (as when its thread got the CPU late on a loaded box)
    still closes: the kernel answers at once, and only a wait for an answer that does not come is given
    up. The close ran in a thread joined with the deadline before, and gave up closes the kernel had
    answered (the container test, twice in four full runs)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]
    with srv, socket.create_connection(("127.0.0.1", port)) as c1:
        a1, _ = srv.accept()
        with a1:
            client = "{}:{}".format(*c1.getsockname())
            r = InFlightRequest(URL, (CONNECTION,), 60.0, 60.0, client=client)
            res = close_connection(StopTarget(r, URL, port, client), timeout_s=0.0)
            assert res.closed and res.gone is True, res.message
            a1.settimeout(5)
            with pytest.raises(ConnectionAbortedError):
                a1.recv(1)


@pytest.mark.skipif(missing_privilege(netns=True) is not None, reason="needs CAP_NET_ADMIN and CAP_SYS_ADMIN")
def test_the_close_in_a_containers_namespace_enters_it_from_its_own_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server in a network namespace of its own: the close's thread (start_close's) enters the namespace
    itself. It had a second thread make the namespace's socket, joined for 3 s on the wall clock, which a
    starved box's CPU does not grant (issue 39: vtop's threads got 0.00-0.06 of a core beside the docker
    container's vLLM), and the close gave up with nothing closed. Here that second thread never answers (its
    maker raises the join's TimeoutError) and the namespace is this process's own: the close still closes."""
    import os
    import threading

    import vtop.actions.stop as stop_mod
    import vtop.sources.sockets as sockets_mod

    entered: list[tuple[str, str]] = []
    real_setns = sockets_mod.setns_net

    def setns(path: str) -> None:
        entered.append((path, threading.current_thread().name))
        real_setns(path)

    def starved(path: str, *, timeout_s: float = 3.0) -> socket.socket:
        raise TimeoutError(f"entering the network namespace {path} took more than {timeout_s:g} s")

    monkeypatch.setattr(sockets_mod, "setns_net", setns)
    monkeypatch.setattr(sockets_mod, "netns_socket", starved)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]
    with srv, socket.create_connection(("127.0.0.1", port)) as c1:
        a1, _ = srv.accept()
        with a1:
            client = "{}:{}".format(*c1.getsockname())
            r = InFlightRequest(URL, (CONNECTION,), 60.0, 60.0, client=client)
            res = stop_mod.start_close(StopTarget(r, URL, port, client, netns_pid=os.getpid())).result(timeout=30)
            assert res.closed and res.gone is True, res.message
            assert entered == [(f"/proc/{os.getpid()}/ns/net", "stop-request-runner")]
            a1.settimeout(5)
            with pytest.raises(ConnectionAbortedError):
                a1.recv(1)


def test_a_close_the_face_gave_up_on_ends_quietly(monkeypatch: pytest.MonkeyPatch) -> None:
    """The face waits a bounded time and cancels the future; the close that answers after must not raise in its
    thread (a traceback on stderr: seen as InvalidStateError when the face had given up)."""
    import threading

    import vtop.actions.stop as stop_mod

    gate = threading.Event()
    errors: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda a: errors.append(a.exc_value))

    def slow(t: object, **kw: object) -> CloseResult:
        gate.wait(5)
        return CloseResult(True, "closed", gone=True)

    monkeypatch.setattr(stop_mod, "close_connection", slow)
    r = InFlightRequest(URL, (CONNECTION,), 60.0, 60.0, client="127.0.0.1:5000")
    fut = stop_mod.start_close(StopTarget(r, URL, 8000, "127.0.0.1:5000"))
    assert fut.cancel() and fut.cancelled()
    gate.set()
    for th in threading.enumerate():
        if th.name == "stop-request-runner":
            th.join(5)
    assert errors == []
