"""Close one TCP connection on this side, as ``ss -K`` does: ``SOCK_DESTROY`` over ``NETLINK_SOCK_DIAG``.

Why: vLLM (up to 0.32 at least) stops a request when its client hangs up, and has no endpoint that
every server answers to stop one request by id (0.32's ``POST /inference/v1/abort_requests`` is
there only under ``--enable-scale-out`` or ``--tokens-only``; the ``/abort_requests`` of
``VLLM_SERVER_DEV_MODE`` aborts every request when given no id). Closing the request's connection on
the server's side is what its client hanging up does: uvicorn sees the disconnect and vLLM aborts it.

How (kernel ABI, linux/inet_diag.h and linux/sock_diag.h): first one ``SOCK_DIAG_BY_FAMILY`` dump of
the established TCP sockets whose local port is the server's (the filter of
:func:`vtop.sources.sockets.port_filter`), to find the one whose peer is the client and take its
exact identity (addresses, interface, the kernel's cookie); then one ``SOCK_DESTROY`` request with that
identity and ``NLM_F_ACK``: the kernel answers ``NLMSG_ERROR`` with 0 (closed: it sends the client a
reset and the server's socket reads ``ECONNABORTED``) or a negative errno (``EPERM``: no
``CAP_NET_ADMIN``; ``ENOENT``: gone already; ``EOPNOTSUPP``: a kernel without
``CONFIG_INET_DIAG_DESTROY``). The cookie makes sure a connection that reused the same addresses since
the dump is never the one closed.

pyroute2's ``DiagSocket`` (pyroute2.netlink.diag) reads the table and names ``SOCK_DESTROY = 21`` but offers no call
that sends it (its calls are the dumps); the conns reader already speaks this protocol on the stdlib's ``socket``,
and so does this module (a hundred lines, no new dependency).
Everything here acts in the calling thread's network namespace, or in that of the socket given (made in
the server's by :func:`vtop.sources.sockets.netns_socket`). Nothing here reads what a connection carries.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import time
from dataclasses import dataclass

# the netlink constants and structs of sock_diag, as the connection reader uses them (one home)
from vtop.sources.sockets import (
    INET_DIAG_REQ_BYTECODE,
    MSG_HEAD,
    MSG_SIZE,
    NETLINK_SOCK_DIAG,
    NLH,
    NLM_F_DUMP,
    NLM_F_REQUEST,
    NLMSG_DONE,
    NLMSG_ERROR,
    REQ,
    RTA,
    SOCK_DIAG_BY_FAMILY,
    SOCKID,
    SOCKID_REST,
    TCP_ESTABLISHED,
    port_filter,
    recv_within,
)

SOCK_DESTROY = 21
NLM_F_ACK = 0x4
#: every TCP state (the destroy request names one socket; its state is not a filter)
ALL_STATES = 0xFFFFFFFF
_ERR = struct.Struct("=i")


@dataclass(frozen=True)
class SockId:
    """One socket as the kernel names it (struct inet_diag_sockid), and its family."""

    family: int
    sport: int
    dport: int
    src: bytes
    dst: bytes
    ifindex: int
    cookie: tuple[int, int]

    @property
    def remote(self) -> str:
        """The peer's ``addr:port`` (an IPv4-mapped IPv6 peer written as IPv4), as the conns reader writes it."""
        return f"{_addr(self.family, self.dst)}:{self.dport}"

    @property
    def local(self) -> str:
        return f"{_addr(self.family, self.src)}:{self.sport}"


def _addr(family: int, raw: bytes) -> str:
    import ipaddress

    if family == socket.AF_INET:
        return str(ipaddress.IPv4Address(raw[:4]))
    a = ipaddress.IPv6Address(raw[:16])
    m = a.ipv4_mapped
    return str(m) if m is not None else f"[{a}]"


def dump_request(family: int, port: int, seq: int) -> bytes:
    """The ``SOCK_DIAG_BY_FAMILY`` dump of the established TCP sockets whose local port is ``port``."""
    req = REQ.pack(family, socket.IPPROTO_TCP, 0, 0, 1 << TCP_ESTABLISHED)
    req += SOCKID.pack(0, 0, bytes(16), bytes(16)) + SOCKID_REST.pack(0, 0, 0)
    bc = port_filter(frozenset({port}))
    req += RTA.pack(RTA.size + len(bc), INET_DIAG_REQ_BYTECODE) + bc
    return NLH.pack(NLH.size + len(req), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + req


def destroy_request(sid: SockId, seq: int) -> bytes:
    """The ``SOCK_DESTROY`` request for exactly ``sid`` (its cookie included), asking for an ack."""
    req = REQ.pack(sid.family, socket.IPPROTO_TCP, 0, 0, ALL_STATES)
    req += SOCKID.pack(sid.sport, sid.dport, sid.src, sid.dst)
    req += SOCKID_REST.pack(sid.ifindex, sid.cookie[0], sid.cookie[1])
    return NLH.pack(NLH.size + len(req), SOCK_DESTROY, NLM_F_REQUEST | NLM_F_ACK, seq, 0) + req


@dataclass(frozen=True)
class Batch:
    """What one ``recv`` of a dump held: the sockets, and whether the dump ended (``error``: its errno)."""

    socks: tuple[SockId, ...]
    done: bool
    error: int = 0


def parse_dump(data: bytes) -> Batch:
    """The ``inet_diag_msg`` records of one datagram of a dump (established sockets only)."""
    out: list[SockId] = []
    off = 0
    while off + NLH.size <= len(data):
        mlen, mtype, _flags, _seq, _pid = NLH.unpack_from(data, off)
        if mlen < NLH.size or off + mlen > len(data):
            return Batch(tuple(out), True, 0)
        if mtype == NLMSG_DONE:
            return Batch(tuple(out), True, 0)
        if mtype == NLMSG_ERROR:
            err = _ERR.unpack_from(data, off + NLH.size)[0] if mlen >= NLH.size + 4 else 0
            return Batch(tuple(out), True, -err)
        body = data[off + NLH.size: off + mlen]
        if len(body) >= MSG_SIZE:
            family, state, _timer, _retrans = MSG_HEAD.unpack_from(body, 0)
            sport, dport, src, dst = SOCKID.unpack_from(body, 4)
            ifindex, c0, c1 = SOCKID_REST.unpack_from(body, 4 + SOCKID.size)
            if state == TCP_ESTABLISHED:
                out.append(SockId(family, sport, dport, src, dst, ifindex, (c0, c1)))
        off += (mlen + 3) & ~3
    return Batch(tuple(out), False, 0)


def parse_ack(data: bytes, seq: int) -> int | None:
    """The errno of the kernel's answer to request ``seq`` (0: done); None when ``data`` holds none."""
    off = 0
    while off + NLH.size <= len(data):
        mlen, mtype, _flags, mseq, _pid = NLH.unpack_from(data, off)
        if mlen < NLH.size:
            return None
        if mtype == NLMSG_ERROR and mseq == seq and mlen >= NLH.size + 4:
            return -_ERR.unpack_from(data, off + NLH.size)[0]
        off += (mlen + 3) & ~3
    return None


def _seq() -> int:
    return (os.getpid() ^ int(time.monotonic() * 1000)) & 0x7FFFFFFF


def _socket(sock: socket.socket | None) -> contextlib.AbstractContextManager[socket.socket]:
    return contextlib.nullcontext(sock) if sock is not None else \
        socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG)


def find(port: int, remote: str, deadline: float, sock: socket.socket | None = None) -> SockId | None:
    """The established connection to local ``port`` whose peer is ``remote`` (``addr:port``), in this
    thread's network namespace, or ``sock``'s (made in the server's); None when there is none. Raises
    OSError / TimeoutError."""
    for fam in (socket.AF_INET, socket.AF_INET6):
        with _socket(sock) as s:
            s.send(dump_request(fam, port, seq := _seq()))
            found = None
            while True:
                data = recv_within(s, deadline, "the kernel's socket dump took too long")
                if len(data) >= NLH.size and NLH.unpack_from(data, 0)[3] != seq:
                    continue  # a reply to something earlier on this socket
                b = parse_dump(data)
                if b.error:
                    raise OSError(b.error, os.strerror(b.error))
                found = found or next((x for x in b.socks if x.sport == port and x.remote == remote), None)
                if b.done:
                    break
            if found is not None:
                return found
    return None


def destroy(sid: SockId, deadline: float, sock: socket.socket | None = None) -> int:
    """Close ``sid`` (``SOCK_DESTROY``; over ``sock`` when given); the kernel's errno (0: closed). Raises
    OSError / TimeoutError."""
    seq = _seq()
    with _socket(sock) as s:
        s.send(destroy_request(sid, seq))
        while True:
            got = parse_ack(recv_within(s, deadline, "the kernel did not answer the close in time"), seq)
            if got is not None:
                return got
