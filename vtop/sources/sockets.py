"""The TCP connections a local vLLM server holds, with the kernel's per-socket counters.

Why: with request logging off (vLLM's default) and short requests coming and going, nothing in
``/metrics`` or the log's stats lines can prove that *one* request has run for a minute (issue 24's
``h200-runaway-short-traffic``). The kernel can. An HTTP/1.1 connection carries one request at a
time, so on the server's side of a connection:

* ``last_recv`` (``tcpi_last_data_recv``: ms since data last *arrived*) is the age of the request
  it carries: a client sends its request, then only ACKs while the answer streams;
* ``last_sent`` (``tcpi_last_data_sent``) and ``bytes_acked`` say whether the answer is still
  flowing (a streamed completion sends a chunk per token or so).

A connection whose request arrived 75 s ago and whose answer is still streaming is a request that
has run 75 s, whatever other connections do. uvicorn closes an idle kept-alive connection after
5 s, and a new request on it resets ``last_recv``.

How: one ``SOCK_DIAG_BY_FAMILY`` dump over a ``NETLINK_SOCK_DIAG`` socket per address family
(what ``ss -ti`` asks), established sockets only, the ``INET_DIAG_INFO`` attribute (``struct
tcp_info``) read at its fixed offsets. Both are kernel ABI (linux/inet_diag.h, linux/tcp.h):
fields are only ever appended, so the offsets below hold on every kernel since 4.1 (which added
``bytes_acked``/``bytes_received``; an older kernel's shorter ``tcp_info`` reads them as None).
psutil has no per-socket counters, ``ss``'s text is no API and is missing from many container
images, and pyroute2 (which has ``DiagSocket``) is a large dependency for one request: so this is
a hundred lines on the stdlib's ``socket``. No privilege is needed for sockets of this network
namespace. A server in another namespace (a container without ``--network host``) is read in its
namespace (:func:`read_conns_in`, as root); without the privilege it shows no connections and says
why: then there is no such evidence, never a wrong one.

Only the server's listening port is kept; nothing here reads what the connections carry.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import socket
import struct
import time
from dataclasses import dataclass

from vtop.model.requests import READ_GIVEN_UP

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST = 0x1
NLM_F_DUMP = 0x300
NLMSG_ERROR = 2
NLMSG_DONE = 3
TCP_ESTABLISHED = 1
INET_DIAG_INFO = 2  # attribute type of struct tcp_info
INET_DIAG_REQ_BYTECODE = 1  # a request's attribute: the filter
#: struct inet_diag_bc_op: code, yes, no (linux/inet_diag.h); the codes used
_BC_OP = struct.Struct("=BBH")
_BC_JMP, _BC_S_GE, _BC_S_LE = 1, 2, 3
#: struct nlmsghdr: len, type, flags, seq, pid
NLH = struct.Struct("=IHHII")
#: struct inet_diag_req_v2: family, protocol, ext, pad, states; then struct inet_diag_sockid:
#: sport, dport (big endian), src[4], dst[4] (big endian words), if, cookie[2]
REQ = struct.Struct("=BBBBI")
SOCKID = struct.Struct("!HH16s16s")
SOCKID_REST = struct.Struct("=III")
#: struct inet_diag_msg: family, state, timer, retrans, the sockid (48 bytes), expires, rqueue,
#: wqueue, uid, inode
MSG_HEAD = struct.Struct("=BBBB")
MSG_SIZE = 4 + 48 + 20
RTA = struct.Struct("=HH")
#: struct tcp_info offsets (linux/tcp.h): 8 one-byte fields, then u32 tcpi_rto at 8 ... so
#: tcpi_last_data_sent at 44, tcpi_last_data_recv at 52; u64 tcpi_bytes_acked at 120 and
#: tcpi_bytes_received at 128 (kernel 4.1+)
_OFF_LAST_SENT = 44
_OFF_LAST_RECV = 52
_OFF_BYTES_ACKED = 120
_OFF_BYTES_RECEIVED = 128
_U32 = struct.Struct("=I")
_PORT = struct.Struct("!H")
_U64 = struct.Struct("=Q")
#: the most a dump may take before it is given up (a netlink dump of a few thousand sockets
#: takes milliseconds)
TIMEOUT_S = 2.0
#: the dumps' sequence numbers (each dump its own: a kept socket may hold a given-up dump's tail)
_SEQS = itertools.count(os.getpid() & 0xFFFF)


@dataclass(frozen=True)
class Conn:
    """The server's side of one established connection to a watched port."""

    local: str
    """``addr:port`` of the server's side (its port is the watched one)."""
    remote: str
    """``addr:port`` of the client (a proxy's, when one is in front)."""
    last_sent_s: float | None
    """Seconds since the server last sent data on it (None: the kernel did not say)."""
    last_recv_s: float | None
    """Seconds since data last arrived on it: the age of the request it carries."""
    bytes_acked: int | None
    bytes_received: int | None

    @property
    def port(self) -> int:
        return int(self.local.rsplit(":", 1)[1])

    def to_json(self) -> dict[str, object]:
        return {"local": self.local, "remote": self.remote, "last_sent_s": self.last_sent_s,
                "last_recv_s": self.last_recv_s, "bytes_acked": self.bytes_acked,
                "bytes_received": self.bytes_received}

    @classmethod
    def from_json(cls, d: dict[str, object]) -> Conn | None:
        """A recorded connection; None when the row is not one (a damaged trace)."""
        local, remote = d.get("local"), d.get("remote")
        if not isinstance(local, str) or not isinstance(remote, str) or ":" not in local:
            return None

        def num(k: str) -> float | None:
            v = d.get(k)
            return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 else None

        def count(k: str) -> int | None:
            v = num(k)
            return int(v) if v is not None else None

        try:
            int(local.rsplit(":", 1)[1])
        except ValueError:
            return None
        return cls(local, remote, num("last_sent_s"), num("last_recv_s"), count("bytes_acked"),
                   count("bytes_received"))


@dataclass(frozen=True)
class ConnRead:
    """One read: every connection to the ports asked for, when and how it went."""

    t: float
    mono: float
    conns: tuple[Conn, ...]
    error: str | None = None
    """Why nothing could be read (no netlink here, denied...); the connections are then empty."""
    url: str | None = None
    """The server these are of, when read in its own network namespace (a container): its connections
    there are to the port it listens on inside, not to its URL's (a published) port. None: vtop's
    namespace, where each server takes those of its URL's port."""


def conn_read_to_json(read: ConnRead) -> dict[str, object]:
    """A read as a record's (and a trace's ``conns.jsonl``) row."""
    d: dict[str, object] = {"t": read.t, "mono": read.mono, "conns": [c.to_json() for c in read.conns]}
    if read.error is not None:
        d["error"] = read.error
    if read.url is not None:
        d["url"] = read.url
    return d


def conn_read_from_json(d: dict[str, object]) -> ConnRead:
    """A recorded read (rows that are not connections are skipped); raises KeyError /
    ValueError / TypeError when the row has no time."""
    raw = d.get("conns")
    conns = tuple(c for c in (Conn.from_json(x) for x in (raw if isinstance(raw, list) else ()) if isinstance(x, dict))
                  if c is not None)
    err, url = d.get("error"), d.get("url")
    return ConnRead(float(d["t"]), float(d["mono"]), conns, str(err) if err is not None else None,  # type: ignore[arg-type]
                    str(url) if url is not None else None)


def _addr(family: int, raw: bytes, port: int) -> str:
    import ipaddress  # in the reading thread, at its first read: not on the way to the first frame

    if family == socket.AF_INET:
        return f"{ipaddress.IPv4Address(raw[:4])}:{port}"
    a = ipaddress.IPv6Address(raw)
    m = a.ipv4_mapped
    return f"{m}:{port}" if m is not None else f"[{a}]:{port}"


def _parse(family: int, body: bytes, ports: frozenset[int]) -> Conn | None:
    if len(body) < MSG_SIZE:
        return None
    _fam, state, _timer, _retrans = MSG_HEAD.unpack_from(body, 0)
    sport, dport, src, dst = SOCKID.unpack_from(body, 4)
    if state != TCP_ESTABLISHED or sport not in ports:
        return None
    info: bytes | None = None
    off = MSG_SIZE
    while off + RTA.size <= len(body):
        rlen, rtype = RTA.unpack_from(body, off)
        if rlen < RTA.size:
            break
        if rtype == INET_DIAG_INFO:
            info = body[off + RTA.size: off + rlen]
        off += (rlen + 3) & ~3

    def u32(o: int) -> int | None:
        return _U32.unpack_from(info, o)[0] if info is not None and len(info) >= o + 4 else None

    def u64(o: int) -> int | None:
        return _U64.unpack_from(info, o)[0] if info is not None and len(info) >= o + 8 else None

    sent, recv = u32(_OFF_LAST_SENT), u32(_OFF_LAST_RECV)
    return Conn(_addr(family, src, sport), _addr(family, dst, dport),
                None if sent is None else sent / 1000.0, None if recv is None else recv / 1000.0,
                u64(_OFF_BYTES_ACKED), u64(_OFF_BYTES_RECEIVED))


def port_filter(ports: frozenset[int]) -> bytes:
    """The kernel-side filter "local port is one of ``ports``" (``INET_DIAG_REQ_BYTECODE``, as ``ss``
    compiles ``sport = :P or sport = :Q``): without it the kernel fills a ``tcp_info`` for every
    socket of the box (1,000 connections cost vtop 3.4 ms a read; filtered, a few hundred us).

    Per port a block ``S_GE P; S_LE P`` (8 bytes each: the 4-byte op, then one whose ``no`` holds
    the port), whose failing test jumps to its end + 4 (reject, or the next block's start after a
    4-byte ``JMP``); blocks are joined by ``JMP yes=4 no=<rest>+4``, so a match runs to the end
    (accept). Every jump target lies on the chain of ``yes`` jumps, as the kernel's audit
    (``inet_diag_bc_audit``) requires."""
    code = b""
    for port in sorted(ports, reverse=True):
        blk = (_BC_OP.pack(_BC_S_GE, 8, 20) + _BC_OP.pack(0, 0, port)
               + _BC_OP.pack(_BC_S_LE, 8, 12) + _BC_OP.pack(0, 0, port))
        code = blk if not code else blk + _BC_OP.pack(_BC_JMP, 4, len(code) + 4) + code
    return code


def _dump(family: int, ports: frozenset[int], deadline: float, filtered: bool = True,
          sock: socket.socket | None = None) -> list[Conn]:
    """One family's dump, on ``sock`` (a socket made in another network namespace, kept by the caller)
    or on a socket of its own; ``deadline`` bounds each wait for the kernel (:func:`recv_within`)."""
    with contextlib.nullcontext(sock) if sock is not None else \
            socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as s:
        return _dump_on(s, family, ports, deadline, filtered)


def recv_within(s: socket.socket, deadline: float, what: str) -> bytes:
    """The kernel's next netlink message on ``s``. The wait for it is bounded by ``deadline`` (TimeoutError(``what``)
    past it); a message that has come is read however late the thread gets to it: under load a thread may get
    the CPU (and the GIL) seconds late, and a deadline judged on the wall clock after each message gave up
    answers the kernel had given (the reads and closes in a container, issue 39)."""
    s.settimeout(max(0.05, deadline - time.monotonic()))
    try:
        return s.recv(1 << 16)
    except TimeoutError:
        raise TimeoutError(what) from None


def _dump_on(s: socket.socket, family: int, ports: frozenset[int], deadline: float, filtered: bool) -> list[Conn]:
    out: list[Conn] = []
    req = REQ.pack(family, socket.IPPROTO_TCP, 1 << (INET_DIAG_INFO - 1), 0, 1 << TCP_ESTABLISHED)
    req += SOCKID.pack(0, 0, bytes(16), bytes(16)) + SOCKID_REST.pack(0, 0, 0)
    if filtered:
        bc = port_filter(ports)
        req += RTA.pack(RTA.size + len(bc), INET_DIAG_REQ_BYTECODE) + bc
    seq = next(_SEQS) & 0x7FFFFFFF
    s.send(NLH.pack(NLH.size + len(req), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + req)
    while True:
        data = recv_within(s, deadline, f"the kernel's socket dump {READ_GIVEN_UP}")
        off = 0
        while off + NLH.size <= len(data):
            mlen, mtype, _flags, mseq, _pid = NLH.unpack_from(data, off)
            if mlen < NLH.size:
                return out
            if mseq != seq:  # left over from a dump given up on this (kept) socket: not this one's
                off += (mlen + 3) & ~3
                continue
            if mtype == NLMSG_DONE:
                return out
            if mtype == NLMSG_ERROR:
                err = struct.unpack_from("=i", data, off + NLH.size)[0] if mlen >= NLH.size + 4 else 0
                if err == 0:
                    return out
                raise OSError(-err, os.strerror(-err))
            # the local port first, without copying: most of a box's sockets are not the server's
            # (a full parse of each cost 7 us; a box with 1,000 connections read in 4 ms)
            if mlen >= NLH.size + 6 and _PORT.unpack_from(data, off + NLH.size + 4)[0] in ports:
                c = _parse(family, data[off + NLH.size: off + mlen], ports)
                if c is not None:
                    out.append(c)
            off += (mlen + 3) & ~3


def read_conns(ports: set[int] | frozenset[int], *, timeout_s: float = TIMEOUT_S,
               sock: socket.socket | None = None) -> ConnRead:
    """Every established TCP connection whose local port is in ``ports`` (IPv4 and IPv6), read
    from the kernel (over ``sock`` when given: a socket made in another network namespace, read
    there). Never raises: a failure is the read's ``error`` in words."""
    t, mono = time.time(), time.monotonic()
    want = frozenset(int(p) for p in ports)
    if not want:
        return ConnRead(t, mono, ())
    if not hasattr(socket, "AF_NETLINK"):
        return ConnRead(t, mono, (), "no netlink on this system (the kernel's socket counters are Linux only)")
    deadline = mono + timeout_s
    conns: list[Conn] = []
    try:
        for fam in (socket.AF_INET, socket.AF_INET6):
            try:
                conns.extend(_dump(fam, want, deadline, sock=sock))
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                conns.extend(_dump(fam, want, deadline, filtered=False, sock=sock))  # a kernel that refuses the filter
    except (OSError, TimeoutError) as e:
        return ConnRead(t, mono, (), f"the kernel's socket table could not be read: {e}")
    conns.sort(key=lambda c: (c.local, c.remote))
    return ConnRead(t, mono, tuple(conns))


# --------------------------------------------------------------------------- another network namespace

CLONE_NEWNET = 0x40000000


def setns_net(path: str) -> None:
    """Move the calling thread into the network namespace at ``path`` (``/proc/PID/ns/net``).
    ``os.setns`` is Python 3.12+; libc's ``setns(2)`` otherwise. A network namespace is per
    thread: the rest of vtop stays where it was."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        setns = getattr(os, "setns", None)
        if setns is not None:
            setns(fd, CLONE_NEWNET)
            return
        import ctypes
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        if libc.setns(fd, CLONE_NEWNET) != 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
    finally:
        os.close(fd)


def netns_socket(ns_path: str, *, timeout_s: float = TIMEOUT_S) -> socket.socket:
    """A ``NETLINK_SOCK_DIAG`` socket made in the network namespace at ``ns_path`` (``/proc/PID/ns/net``).
    A socket stays in the namespace it was made in, whichever thread uses it after: so only its making
    needs a thread that enters the namespace (``setns``, which needs CAP_SYS_ADMIN, i.e. root), and the
    dumps and closes on it run where the caller runs, no thread a read. Raises OSError (no privilege,
    the process gone) or TimeoutError (the thread did not make it within ``timeout_s``)."""
    import threading

    got: list[socket.socket | OSError] = []
    abandoned = threading.Event()

    def run() -> None:
        try:
            setns_net(ns_path)
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG)
        except OSError as e:
            got.append(e)
            return
        got.append(sock)
        if abandoned.is_set():  # the caller gave up waiting: nobody will close it
            sock.close()

    th = threading.Thread(target=run, name="netns-socket", daemon=True)
    th.start()
    th.join(timeout_s)
    abandoned.set()
    if not got:
        raise TimeoutError(f"entering the network namespace {ns_path} took more than {timeout_s:g} s")
    r = got[0]
    if isinstance(r, OSError):
        raise r
    return r


class NetnsSockets:
    """The diag sockets made in other network namespaces, one a watched process, kept from read to read
    (the read in a container costs a dump, as on the host, not a thread: under load a thread a read cost
    0.1-0.6 s where the dump took 2-40 ms). A socket keeps its namespace alive: :meth:`keep_only` closes
    those of processes no longer read, :meth:`close` all."""

    def __init__(self, proc_root: str = "/proc") -> None:
        self.proc_root = proc_root
        #: pid -> (the namespace's inode, the socket made in it)
        self._socks: dict[int, tuple[int, socket.socket]] = {}
        #: sockets made so far (tests, the bench)
        self.made = 0

    def get(self, pid: int, *, timeout_s: float = TIMEOUT_S) -> socket.socket:
        """The socket in ``pid``'s network namespace (made at the first read, or when the process now
        has another namespace). Raises as :func:`netns_socket`."""
        path = f"{self.proc_root}/{pid}/ns/net"
        ino = os.stat(path).st_ino
        kept = self._socks.get(pid)
        if kept is not None and kept[0] == ino:
            return kept[1]
        self.drop(pid)
        sock = netns_socket(path, timeout_s=timeout_s)
        self._socks[pid] = (ino, sock)
        self.made += 1
        return sock

    def __len__(self) -> int:
        """The sockets kept now."""
        return len(self._socks)

    def drop(self, pid: int) -> None:
        """Close ``pid``'s socket (a read on it failed: the next read makes a new one)."""
        kept = self._socks.pop(pid, None)
        if kept is not None:
            kept[1].close()

    def keep_only(self, pids: set[int] | frozenset[int]) -> None:
        for pid in [p for p in self._socks if p not in pids]:
            self.drop(pid)

    def close(self) -> None:
        self.keep_only(frozenset())


def read_conns_in(pid: int, ports: set[int] | frozenset[int], *, url: str | None = None,
                  timeout_s: float = TIMEOUT_S, proc_root: str = "/proc",
                  sockets: NetnsSockets | None = None) -> ConnRead:
    """:func:`read_conns` in the network namespace of process ``pid`` (a server in a container without
    ``--network host``: its connections are in its namespace's socket table, not vtop's), over a socket
    made there (:func:`netns_socket`; kept in ``sockets`` from read to read when given, else made for
    this read and closed); the read carries ``url``, the server it is for. Never raises: no privilege is
    the read's ``error``, in words."""
    t, mono = time.time(), time.monotonic()
    where = f"the network namespace of pid {pid}"
    try:
        sock = sockets.get(pid, timeout_s=timeout_s) if sockets is not None else \
            netns_socket(f"{proc_root}/{pid}/ns/net", timeout_s=timeout_s)
    except TimeoutError:
        return ConnRead(t, mono, (), f"the socket dump in {where} {READ_GIVEN_UP}", url)
    except OSError as e:
        why = ("vtop may not enter it: reading a container's connections needs root (CAP_SYS_ADMIN)"
               if e.errno in (errno.EPERM, errno.EACCES) else
               "the server is gone" if e.errno in (errno.ENOENT, errno.ESRCH) else f"{e.strerror or e}")
        return ConnRead(t, mono, (), f"the connections in {where} could not be read: {why}", url)
    try:
        r = read_conns(ports, timeout_s=timeout_s, sock=sock)
    finally:
        if sockets is None:
            sock.close()
    if r.error is not None and sockets is not None:
        sockets.drop(pid)  # a socket that failed once is not trusted again: the next read makes a new one
    return ConnRead(r.t, r.mono, r.conns, r.error, url)
