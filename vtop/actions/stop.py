"""Stop one request in flight on a vLLM server: close its TCP connection on the server's side.

vLLM aborts a request whose client hung up (uvicorn tells it of the disconnect: a streamed answer at
its next chunk, a non-streamed one by the disconnect listener of its handler), and a request has no
other handle that every vLLM answers to (see :mod:`vtop.actions.sockdestroy`: 0.32's abort endpoint is
off by default and needs the request id, which only the request log says). So the request is named by
what the kernel's counters of the server's connections named it by (:class:`InFlightRequest.client`),
and its connection is closed with ``SOCK_DESTROY`` in the server's network namespace (a container
without ``--network host``: a thread of its own enters it with ``setns``, as the conns reader does).

Privilege: ``SOCK_DESTROY`` needs ``CAP_NET_ADMIN``; entering another network namespace needs
``CAP_SYS_ADMIN``. Both are read from ``/proc/self/status`` (``CapEff``) before anything is tried:
without them nothing is closed and the key says why.

Then the face watches that vLLM aborted it (:func:`verdict`): the connection is gone (a fresh dump, in
the same thread, right after the close), and vLLM's abort line in its log (only where it logs requests),
or its ``request_success_total{finished_reason="abort"}`` counter rising, or a request leaving running +
waiting with no finish counted (vLLM 0.32 counts no abort of a client that hung up: measured on the real
CPU build), or, where /metrics counts no finishes, its running gauge dropping. Every stop becomes a :class:`StopRecord`, written into the next
snapshot bundle (``actions.json``): no prompt, nothing but what the confirmation showed and what came of it.
"""

from __future__ import annotations

import errno
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from vtop.model.requests import EVIDENCE_WORDS, InFlightRequest, age_words, silent_words

__all__ = ["CAP_NET_ADMIN", "CAP_SYS_ADMIN", "WAIT_S", "CloseResult", "Observation", "StopRecord", "StopTarget",
           "close_connection", "left_unfinished", "missing_privilege", "start_close", "target_for", "tokens_words",
           "verdict"]

CAP_NET_ADMIN = 12
CAP_SYS_ADMIN = 21
#: the most the close may take (a dump of the server's port, one destroy, a dump again: milliseconds)
CLOSE_TIMEOUT_S = 3.0
#: the face waits this long for the close's answer before it says that it waits. The close bounds each of its
#: waits for the kernel itself (``CLOSE_TIMEOUT_S``), but on a loaded box its thread may get the CPU seconds
#: late: the face gave up at this bound, dropped the answer and said "did not work" while the close went on
#: in its thread (issue 39: the docker container's vLLM left vtop's threads 0.00-0.06 of a core)
CLOSE_ANSWER_S = CLOSE_TIMEOUT_S + 2.0
#: ... and gives up waiting after this long (then whether the connection closed is not known)
CLOSE_GIVE_UP_S = 60.0
#: how long the face waits for vLLM to show the abort after the close (a streamed answer notices at its
#: next chunk, a non-streamed one at once; /metrics is polled every interval)
WAIT_S = 15.0


def cap_eff(status_text: str) -> int | None:
    """The effective capabilities (``CapEff:`` of ``/proc/PID/status``), or None when not there."""
    for line in status_text.splitlines():
        if line.startswith("CapEff:"):
            try:
                return int(line.split(":", 1)[1].strip(), 16)
            except ValueError:
                return None
    return None


def missing_privilege(*, netns: bool, status_path: str = "/proc/self/status") -> str | None:
    """Why vtop may not close a connection here (None: it may): ``CAP_NET_ADMIN``, and with ``netns``
    (the server has a network namespace of its own) ``CAP_SYS_ADMIN`` to enter it."""
    try:
        with open(status_path, encoding="ascii", errors="replace") as f:
            caps = cap_eff(f.read())
    except OSError as e:
        return f"vtop cannot read its own capabilities ({e.strerror or e}): nothing was closed"
    if caps is None:
        return "vtop cannot tell its own capabilities (no CapEff in /proc/self/status): nothing was closed"
    need = [("CAP_NET_ADMIN", CAP_NET_ADMIN, "to close a connection (SOCK_DESTROY, as ss -K)")]
    if netns:
        need.append(("CAP_SYS_ADMIN", CAP_SYS_ADMIN, "to enter the server's network namespace"))
    lack = [f"{name} ({why})" for name, bit, why in need if not caps >> bit & 1]
    if not lack:
        return None
    return (f"vtop lacks {' and '.join(lack)}: nothing was closed; run vtop as root, or give it the "
            f"capability (setcap cap_net_admin+ep, or docker run --cap-add NET_ADMIN)")


@dataclass(frozen=True)
class StopTarget:
    """One request to stop, and where its connection is."""

    request: InFlightRequest
    #: the server's URL
    server: str
    #: the port the server listens on where its sockets are (its own namespace's, in a container)
    port: int
    #: the client's ``addr:port`` as that namespace sees it
    client: str
    #: the server's pid when its sockets are in a network namespace of its own (entered), else None
    netns_pid: int | None = None

    @property
    def where(self) -> str:
        return (f"in the server's network namespace (pid {self.netns_pid})" if self.netns_pid is not None
                else "in this network namespace")


def target_for(url: str, process: Any, r: InFlightRequest, *, local: bool) -> StopTarget | str:
    """The target of ``r`` on the server at ``url`` (``process``: its vLLM process on this box, or None;
    ``local``: the URL's host is this box), or why it cannot be stopped from here."""
    if r.client is None:
        return (f"{r.name} is known from {' + '.join(EVIDENCE_WORDS.get(e, e) for e in r.evidence)} alone: vtop "
                "knows no connection of it to close (only a request its connection's counters name can be stopped)")
    if process is None and not local:
        return "the server runs on another box: its connections are in that box's kernel; run vtop there"
    from vtop.sources.urls import url_hostport

    port = process.inner_port if process is not None else url_hostport(url)[1]
    own = process is not None and bool(getattr(process, "own_netns", False))
    return StopTarget(r, url, int(port), r.client, process.pid if own else None)


def tokens_words(r: InFlightRequest) -> str:
    """What is known of the tokens it made so far (vLLM counts tokens per server, not per request)."""
    if r.answer_pending:
        return "no byte of its answer sent yet (not streamed, or not begun): its tokens so far are not known"
    quiet = "" if r.answer_silent_s is None else f"; {silent_words(r.answer_silent_s)}"
    if r.answer_bytes:
        return (f"not known per request (vLLM counts tokens for the whole server); its answer: "
                f"{r.answer_bytes:,} bytes sent since vtop first saw it{quiet}")
    if quiet:
        return f"not known per request (vLLM counts tokens for the whole server){quiet}"
    return "not known per request (vLLM counts tokens for the whole server)"


@dataclass(frozen=True)
class CloseResult:
    """How the close went."""

    closed: bool
    message: str
    #: a fresh dump right after the close no longer finds the connection (None: not read)
    gone: bool | None = None
    #: seconds the close took (its thread)
    elapsed_s: float = 0.0
    #: vtop lacked the privilege: nothing was tried
    refused: bool = False
    #: the face stopped waiting for the close's answer: whether it closed is not known
    unknown: bool = False


def _close_here(port: int, client: str, deadline: float, sock: Any = None) -> CloseResult:
    from vtop.actions.sockdestroy import destroy, find

    sid = find(port, client, deadline, sock)
    if sid is None:
        return CloseResult(False, f"no connection from {client} to port {port} any more: the request ended "
                                  "before it could be stopped", gone=True)
    err = destroy(sid, deadline, sock)
    if err != 0:
        why = {errno.EPERM: "the kernel refused (no CAP_NET_ADMIN over the server's network namespace)",
               errno.ENOENT: "the connection was gone already",
               errno.EOPNOTSUPP: "this kernel cannot close a socket from outside (no CONFIG_INET_DIAG_DESTROY)"
               }.get(err, f"the kernel answered {errno.errorcode.get(err, err)}")
        return CloseResult(False, f"the connection from {client} was not closed: {why}", gone=err == errno.ENOENT)
    gone = find(port, client, deadline, sock) is None
    return CloseResult(True, f"closed the connection from {client} to port {port}", gone=gone)


def close_connection(t: StopTarget, *, timeout_s: float = CLOSE_TIMEOUT_S,
                     status_path: str = "/proc/self/status", proc_root: str = "/proc", enter: bool = False) -> CloseResult:
    """Close ``t``'s connection; blocking (each wait for the kernel bounded by ``timeout_s``), never raises.
    A server in a network namespace of its own is reached in it: with ``enter`` the calling thread enters the
    namespace itself (``setns``: :func:`start_close`'s thread, which is the close's own and ends with it), else
    through a socket made there by a thread of its own (:func:`vtop.sources.sockets.netns_socket`, joined for
    ``timeout_s``: the caller's thread stays where it is). The deadline bounds the waits for the kernel, not a
    thread's turn on the CPU: on a loaded box a close whose answers had come was given up at 3 s when the whole
    close ran in a thread joined with the deadline, and a thread made to enter the namespace can wait longer
    than that for the CPU (issue 39: the docker container's vLLM left vtop's threads 0.00-0.06 of a core)."""
    t0 = time.monotonic()
    why = missing_privilege(netns=t.netns_pid is not None, status_path=status_path)
    if why is not None:
        return CloseResult(False, why, refused=True)
    deadline = t0 + timeout_s
    sock = None
    try:
        if t.netns_pid is not None:
            from vtop.sources import sockets

            path = f"{proc_root}/{t.netns_pid}/ns/net"
            if enter:
                sockets.setns_net(path)  # this thread's sockets are made there; no other thread to wait for
            else:
                sock = sockets.netns_socket(path, timeout_s=timeout_s)
        r = _close_here(t.port, t.client, deadline, sock)
    except TimeoutError as e:
        r = CloseResult(False, f"the connection was not closed: {e} (whether it closed is not known)")
    except OSError as e:
        r = CloseResult(False, f"the connection was not closed: {e.strerror or e}")
    finally:
        if sock is not None:
            sock.close()
    return CloseResult(r.closed, r.message, r.gone, time.monotonic() - t0, r.refused)


def start_close(t: StopTarget, **kw: Any) -> Future[CloseResult]:
    """:func:`close_connection` in a daemon thread of its own, which enters the server's network namespace
    itself when it has one (and ends with the close); its answer in a future (never an exception)."""
    fut: Future[CloseResult] = Future()

    def body() -> None:
        res = close_connection(t, **{"enter": True, **kw})
        if fut.set_running_or_notify_cancel():  # False: the face gave up waiting and cancelled it
            fut.set_result(res)

    threading.Thread(target=body, name="stop-request-runner", daemon=True).start()
    return fut


@dataclass(frozen=True)
class Observation:
    """What the face sees of the server after the close (the monitor's latest answer; every number from
    one scrape of ``/metrics``)."""

    #: seconds since the confirmation
    after_s: float
    #: vLLM's running gauge now (None: not known)
    running: float | None
    #: vLLM's ``request_success_total{finished_reason="abort"}`` now (None: not exported)
    aborts: float | None
    #: the request log has its ``Aborted request`` line (None: no request log, or the id is not known)
    abort_logged: bool | None = None
    #: vLLM's waiting gauge now (None: not known)
    waiting: float | None = None
    #: every finish vLLM counted so far (``request_success_total``, all reasons; None: not exported)
    finished: float | None = None

    @property
    def busy(self) -> float | None:
        return None if self.running is None else self.running + (self.waiting or 0.0)


def left_unfinished(before: Observation, now: Observation) -> float | None:
    """Requests that left vLLM's running + waiting since ``before`` without a finish it counted: an abort
    (vLLM 0.32 counts no abort of a client that hung up in ``request_success_total``; a request that
    arrived since only makes this smaller, never a stop that did not happen). None: not known."""
    if before.busy is None or now.busy is None or before.finished is None or now.finished is None:
        return None
    return (before.busy - now.busy) - (now.finished - before.finished)


def verdict(close: CloseResult, before: Observation, now: Observation, prev: Observation | None = None,
            wait_s: float = WAIT_S) -> tuple[bool, bool, str]:
    """``(final, stopped, line)``: whether the outcome is known (or past knowing: a close the face stopped
    waiting for), whether vLLM aborted the request, and the result line. ``before``: at the confirmation; ``prev``: the observation before ``now`` (None: the first).

    Stopped: the connection is closed and gone, and vLLM shows the request gone: its abort line, its abort
    counter up, a request that left running + waiting without a counted finish (since the confirmation,
    or between two polls: short requests arriving meanwhile hide one over the whole span, rarely over one
    poll), nothing in flight at all (it was, at the confirmation), or, where /metrics counts no finishes,
    running down. Not known until ``wait_s`` passed."""
    if not close.closed:
        return True, False, f"{'not known' if close.unknown else 'did not work'}: {close.message}"
    if close.gone is False:
        return True, False, f"did not work: {close.message}, but the kernel still lists it"
    took = f"{now.after_s:.1f} s after the confirmation"
    shown: list[str] = []
    counted = now.aborts is not None and before.aborts is not None and now.aborts > before.aborts
    if now.abort_logged:
        shown.append("its log says Aborted request")
    if counted:
        shown.append(f"vLLM's abort counter {before.aborts:,.0f} -> {now.aborts:,.0f}")
    for a, span in ((before, "since the confirmation"), (prev, "since the poll before")):
        gone = left_unfinished(a, now) if a is not None and not counted else None
        if gone is not None and gone >= 1 and a is not None:
            fin = (now.finished or 0.0) - (a.finished or 0.0)
            shown.append(f"running + waiting {a.busy:,.0f} -> {now.busy:,.0f} {span} with {fin:,.0f} finished: "
                         f"{gone:,.0f} left unfinished")
            break
    if not shown and now.busy == 0 and before.busy:
        shown.append(f"nothing in flight any more: running + waiting {before.busy:,.0f} -> 0")
    dropped = now.running is not None and before.running is not None and now.running < before.running
    if not shown and now.finished is None and dropped:
        shown.append(f"running {before.running:,.0f} -> {now.running:,.0f}")
    if shown:
        return True, True, f"stopped: {close.message}; vLLM aborted it ({'; '.join(shown)}), {took}"
    if now.after_s < wait_s:
        return False, False, f"{close.message}; waiting for vLLM to abort it ({now.after_s:.0f} s)"
    seen = "running " + ("?" if now.running is None else f"{now.running:,.0f}")
    traffic = (now.finished is not None and before.finished is not None and now.finished > before.finished) or (
        now.busy is not None and before.busy is not None and now.busy > before.busy)
    if traffic:  # requests came and went: one that came since hides one that left unfinished
        return True, False, (f"not confirmed: {close.message}, but after {wait_s:.0f} s vLLM shows no abort line or "
                             f"counter, and requests came and went meanwhile, so its gauges cannot tell ({seen})")
    return True, False, (f"did not work: {close.message}, but vLLM shows no abort after {wait_s:.0f} s ({seen}, "
                         "nothing left unfinished): it may still be generating")


@dataclass
class StopRecord:
    """One stop, as the next snapshot bundle keeps it (``actions.json``): no prompt, no credential."""

    t: float
    server: str
    request_id: str | None
    client: str
    age: str
    tokens: str
    evidence: tuple[str, ...]
    how: str
    result: str = "confirmed, not done yet"
    stopped: bool | None = None
    close_s: float | None = None
    seconds_to_abort: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, t: StopTarget, now: float) -> StopRecord:
        from vtop.core.rules.util import short_url

        r = t.request
        return cls(now, short_url(t.server), r.request_id, t.client, age_words(r, upper=True), tokens_words(r),
                   r.evidence, f"SOCK_DESTROY of its TCP connection {t.where}")

    def to_json(self) -> dict[str, Any]:
        import datetime as dt

        return {"action": "stop_request", "at": dt.datetime.fromtimestamp(self.t, dt.timezone.utc).isoformat(),
                "server": self.server, "request_id": self.request_id, "client": self.client, "age": self.age,
                "tokens_so_far": self.tokens, "evidence": list(self.evidence), "how": self.how,
                "result": self.result, "stopped": self.stopped, "close_s": self.close_s,
                "seconds_to_abort": self.seconds_to_abort, **self.extra}
