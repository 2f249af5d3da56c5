"""``vtop web``: the same screen in a browser, through ``textual-serve``.

For the teammate without SSH. Each browser tab that connects gets its own ``vtop`` process (that is how
textual-serve works: it runs a command per connection and speaks Textual's web driver over a
websocket), started with the arguments given here, so everything vtop takes (URLs, ``--log``, the
thresholds, ``--simulate-gpus``...) works as on the terminal.

Safe by default:

* it binds 127.0.0.1 unless ``--host`` is given;
* the screen is read-only (``--readonly``: ``s``, ``d``, ``t``, ``x`` do nothing and say so) unless
  ``--allow-actions``;
* it prints the URL with a random token, and the page needs it. textual-serve has no hook for that
  in its API, so :class:`TokenServer` wraps its public request handlers (``handle_index``,
  ``handle_websocket``, ``handle_download``, methods of its ``Server`` class that its own routes
  call): the page answers only with ``?token=`` right, and then sets an HttpOnly, SameSite=Strict
  cookie holding the token, which the websocket (where the app runs) and downloads must carry.
  A missing or wrong token is refused with 403 before any vtop process starts.

textual-serve serves with aiohttp, its own dependency; vtop installs it with ``pip install
'vtop[web]'`` (pyproject.toml says why the pin).
"""

from __future__ import annotations

import argparse
import hmac
import os
import secrets
import shlex
import socket
import sys
from collections.abc import Callable, Sequence
from typing import Any

COOKIE = "vtop_web_token"
#: what a request without the right token gets (no vtop process is started for it)
REFUSED = ("vtop web: this page needs the token that vtop web printed when it started "
           "(the whole URL, with ?token=...).\n")
WILDCARD = ("0.0.0.0", "::", "")


def free_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def app_command(vtop_args: Sequence[str], *, allow_actions: bool) -> str:
    """The shell command textual-serve runs for each browser tab: this Python's vtop, with the
    arguments given, read-only unless actions are allowed, and delivering no alert (``--on-alert``,
    ``--webhook``): every open tab would send each incident again; a ``vtop watch`` beside it delivers."""
    args = list(vtop_args)
    if not allow_actions and "--readonly" not in args:
        args.append("--readonly")
    if "--no-alert-delivery" not in args:
        args.append("--no-alert-delivery")
    return " ".join(shlex.quote(a) for a in (sys.executable, "-m", "vtop", *args))


def make_server(command: str, host: str, port: int, token: str, *, public_url: str,
                say: Callable[[str], None] = print) -> Any:
    """A textual-serve ``Server`` whose page, websocket and downloads need ``token``."""
    from aiohttp import web
    from textual_serve.server import Server

    def ok(request: web.Request, *, from_query: bool) -> bool:
        given = request.query.get("token", "") if from_query else request.cookies.get(COOKIE, "")
        return bool(given) and hmac.compare_digest(given.encode(), token.encode())

    def refuse() -> web.HTTPForbidden:
        return web.HTTPForbidden(text=REFUSED)

    import asyncio

    tabs: set[asyncio.Task[Any]] = set()
    """The websocket handlers of the open tabs (one vtop each)."""

    class TokenServer(Server):
        def initialize_logging(self) -> None:
            import logging

            logging.basicConfig(level=logging.WARNING, format="vtop web: %(message)s")

        async def on_startup(self, app: web.Application) -> None:
            say(f"vtop web: open {public_url}/?token={token}")

        async def on_shutdown(self, app: web.Application) -> None:
            """Ctrl+C or SIGTERM: end every open tab's vtop now. aiohttp waits for the handlers still
            running (each open tab's websocket) up to its shutdown timeout, 60 s, which textual-serve does
            not set: a stop with a browser attached took 24 s or more. Cancelling a tab's handler is
            what textual-serve does itself when aiohttp cancels it: the tab's vtop is told to quit and
            waited for, and the websocket is closed."""
            await super().on_shutdown(app)
            for t in list(tabs):
                t.cancel()
            if tabs:
                await asyncio.wait(list(tabs), timeout=10)

        async def handle_index(self, request: web.Request) -> web.StreamResponse:
            if not ok(request, from_query=True):
                raise refuse()
            resp: web.StreamResponse = await super().handle_index(request)
            resp.set_cookie(COOKIE, token, httponly=True, samesite="Strict", path="/")
            resp.headers["Cache-Control"] = "no-store"
            return resp

        async def handle_websocket(self, request: web.Request) -> web.WebSocketResponse:
            if not ok(request, from_query=False):
                raise refuse()  # before textual-serve starts a vtop for it
            task = asyncio.current_task()
            if task is not None:
                tabs.add(task)
            try:
                return await super().handle_websocket(request)
            finally:
                tabs.discard(task)

        async def handle_download(self, request: web.Request) -> web.StreamResponse:
            if not ok(request, from_query=False):
                raise refuse()
            return await super().handle_download(request)

    return TokenServer(command, host=host, port=port, title="vtop", public_url=public_url)


def parser() -> argparse.ArgumentParser:
    from vtop.exitcodes import UsageParser as Parser

    p = Parser(prog="vtop web", usage="vtop web [--host HOST] [--port PORT] [--allow-actions] [vtop's arguments ...]",
               description=("Serve vtop's screen in a browser (textual-serve). Binds 127.0.0.1 unless --host; "
                            "read-only (s, d, t, x off) unless --allow-actions; prints the URL with a random token "
                            "the page needs. Every other argument is vtop's (URLs, --log, --interval, ...)."))
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this box only; 0.0.0.0 for every interface)")
    p.add_argument("--port", type=int, default=0, help="port (default: a free one, printed)")
    p.add_argument("--allow-actions", dest="allow_actions", action="store_true",
                   help="let the browser use s (snapshot), d (py-spy dump) and t (test request)")
    return p


def main(argv: Sequence[str], *, check_vtop_args: Callable[[list[str]], object] | None = None) -> int:
    """``vtop web ...``. ``check_vtop_args`` parses the arguments meant for vtop (the command line's
    own parser), so a bad one ends here with vtop's message rather than in each browser tab."""
    from vtop.exitcodes import EXIT_USAGE

    p = parser()
    ns, rest = p.parse_known_args(list(argv))
    if any(a in ("--once", "--json") for a in rest):
        p.exit(EXIT_USAGE, "vtop web: error: --once/--json print a report; vtop web serves the screen\n")
    if check_vtop_args is not None:
        check_vtop_args(rest)
    try:
        import textual_serve  # noqa: F401
    except ImportError:
        p.exit(EXIT_USAGE, "vtop web: error: textual-serve is not installed: pip install 'vtop[web]'\n")
    if not 0 <= ns.port <= 65535:
        p.exit(EXIT_USAGE, f"vtop web: error: --port: 0 to 65535, got {ns.port}\n")
    try:
        port = ns.port or free_port(ns.host if ns.host not in WILDCARD else "0.0.0.0")
    except OSError as e:
        p.exit(EXIT_USAGE, f"vtop web: error: cannot listen on {ns.host}: {e.strerror or e}\n")
    shown = socket.gethostname() if ns.host in WILDCARD else (f"[{ns.host}]" if ":" in ns.host else ns.host)
    public_url = f"http://{shown}:{port}"
    if os.environ.get("TERM", "dumb") == "dumb":
        os.environ["TERM"] = "xterm-256color"  # the tabs' vtop draws for xterm.js, whatever this terminal is
    token = secrets.token_urlsafe(24)
    command = app_command(rest, allow_actions=ns.allow_actions)
    server = make_server(command, ns.host, port, token, public_url=public_url,
                         say=lambda s: print(s, flush=True))
    mode = "actions allowed (s, d, t, x)" if ns.allow_actions else "read-only: s, d, t, x off (--allow-actions turns them on)"
    print(f"vtop web: serving vtop on {ns.host}:{port}, {mode}; each browser tab runs its own vtop; Ctrl+C stops",
          flush=True)
    if ns.host not in ("127.0.0.1", "::1", "localhost"):
        print(f"vtop web: note: {ns.host} is reachable beyond this box over plain HTTP, token included; "
              "prefer an SSH tunnel (ssh -L) or a TLS reverse proxy", flush=True)
    try:
        server.serve()
    except OSError as e:
        p.exit(EXIT_USAGE, f"vtop web: error: cannot serve on {ns.host}:{port}: {e.strerror or e}\n")
    return 0
