"""URLs of vLLM servers: normalised, split, and matched to a server process.

Apart from :mod:`vtop.sources.discovery` (its process scan and its regular
expressions) so the dashboard can lay out a card for each URL in its first
frame without importing the scanner, which then loads in the discovery
thread.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vtop.sources.discovery import ServerProcess

#: watched when no URL is given and no server is found, so a server started
#: later (or one in a container vtop cannot see into) still shows up
FALLBACK_URL = "http://localhost:8000"
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "0.0.0.0", "[::1]"})


@functools.lru_cache(maxsize=256)
def url_hostport(url: str) -> tuple[str, int]:
    """(host, port) of a URL. Cached: every poll of every server asks it of the
    same few URLs, and ``urlsplit`` was 0.6 % of vtop's CPU (py-spy, 2 servers)."""
    from urllib.parse import urlsplit

    u = urlsplit(url if "://" in url else "http://" + url)
    try:
        port = u.port
    except ValueError:
        port = None
    return (u.hostname or "localhost", port or (443 if u.scheme == "https" else 80))


def normalize_url(url: str) -> str:
    """``http://`` in front when no scheme is given; a bare port (``8201`` or ``:8201``) is
    that port on localhost, not a host named 8201."""
    url = url.strip().rstrip("/")
    if url.isdigit() or (url.startswith(":") and url[1:].isdigit()):
        return "http://localhost:" + url.lstrip(":")
    return url if "://" in url else "http://" + url


def url_matches(url: str, sp: ServerProcess) -> bool:
    """Whether ``url`` reaches server process ``sp`` (same port, a local host or its own). A server
    in a network namespace of its own (a container) is reached at its address there or at a port
    published on the host (``sp.published``: docker-proxy, a DNAT rule), not at this box's
    loopback on its own port."""
    host, port = url_hostport(url)
    for pub in sp.published:
        ph, pp = url_hostport("http://" + pub)
        if pp == port and (ph == host or (host in LOCAL_HOSTS and ph in LOCAL_HOSTS)):
            return True
    if port != sp.port:
        return False
    if sp.own_netns:
        return host == sp.host
    return host in LOCAL_HOSTS or host == sp.host or host == (sp.bind_host or "")
