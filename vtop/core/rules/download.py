"""``startup_stall`` in downloading: a start fetching its weights from the Hub, and no byte comes.

Evidence: :class:`vtop.core.download.DownloadProgress` of the start at ``log_target`` (the
server's Hub cache, stat'ed while the start is in process start, engine init or weights): a
``blobs/*.incomplete`` file in flight and no byte more for ``download_stall_s`` (60 s) of vtop's
clock. While the bytes move, a silent log is a download, not a hang: :func:`download_in_flight`
keeps the silence rules (:mod:`vtop.core.rules.startup`) quiet then.

Real test: tests/real/test_real_download.py (the real vLLM CPU server fetching a tiny model from
a throttled local Hub, then the Hub paused mid-file).
"""

from __future__ import annotations

from vtop.core.rules.alert import Alert
from vtop.core.rules.context import Evidence, Memory
from vtop.core.rules.util import dur, short_url


def _starting(ctx: Evidence) -> bool:
    snap = ctx.startup
    return snap is None or snap.state == "starting"


def download_in_flight(ctx: Evidence) -> bool:
    """A download of this start has a file in flight (moving, or stalled: this module names that)."""
    d = ctx.download
    return _starting(ctx) and d is not None and d.active > 0


def download_stall(ctx: Evidence, mem: Memory) -> list[Alert]:
    """The stall of this start's download, when a file in flight got no byte for ``download_stall_s``
    (the startup-stall rule, :class:`vtop.core.rules.startup.StartupStall`, asks while one is in flight)."""
    d = ctx.download
    limit = mem.th.download_stall_s
    if d is None or not _starting(ctx) or d.active == 0 or d.quiet_s < limit:
        return []
    tgt = ctx.log_target
    ev = [
        f"{d.active} file(s) downloading from the Hub (blobs/*.incomplete in {d.cache_dir}, read from the "
        f"server's {'environment' if d.cache_from == 'environ' else 'default cache path'}) and no byte more "
        f"for {dur(d.quiet_s)} (a stall past {dur(limit)})",
        d.text(),
    ]
    if d.cut:
        ev.append("the cache scan stopped at its deadline: the numbers are partial")
    fix = (
        "Check the network to the Hub (or HF_ENDPOINT's mirror): a proxy, a firewall, a rate limit; the download "
        "resumes from the .incomplete file when the server restarts.",
        "For big models, HF_HUB_ENABLE_HF_TRANSFER=1 (pip install hf_transfer) downloads in parallel.",
        "Or download once (hf download " + d.repo + ") or copy the model in, and start with HF_HUB_OFFLINE=1 "
        "or a local path: no start waits on the network.",
    )
    title = (f"Startup of {short_url(tgt)} stalled in downloading {d.repo}: no byte for {dur(d.quiet_s)}")
    return [Alert("startup_stall", "warning", title, tuple(ev), fix, tgt, ctx.now - d.quiet_s)]
