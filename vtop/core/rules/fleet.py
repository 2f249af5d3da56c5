"""What only a fleet view adds to the rules: a server Prometheus says is down, a GPU with XID
errors, and, on every alert whose evidence or fix lives on the box, how to get there. Pure.

The rules themselves (runaway, stall, KV saturation, ...) are the same
:class:`~vtop.core.rules.Diagnoser` the local screen runs, fed from Prometheus' history
(:mod:`vtop.monitor.fleet`); these are the two that need inputs no local poll has.

``server_down``
    Prometheus' ``up`` is 0 for the instance's target (its scrape failed: refused, timed
    out, or answered an error), or the instance's series vanished while its job's others
    stay. Critical: on the box a DOWN server is a card; in a fleet of hundreds it must be
    named.
``gpu_xid``
    dcgm-exporter's ``DCGM_FI_DEV_XID_ERRORS`` (the value of the last XID error, 0 for none)
    was non-zero within 10 minutes on a GPU of the instance's host. XID 48 (double-bit
    ECC), 79 (fallen off the bus), 94/95 (contained / uncontained ECC), 119/120 (GSP) mean
    the GPU needs a reset or a drain; 13/31/43 are usually the application's fault.
"""

from __future__ import annotations

from collections.abc import Mapping

from vtop.core.engines import flags_of
from vtop.core.rules.alert import Alert
from vtop.model.fmt import dur

__all__ = ["BOX_RULES", "FLEET_RULES", "box_hint", "down_alert", "on_the_box", "xid_alert"]

FLEET_RULES = ("server_down", "gpu_xid")

#: rules whose evidence or fix needs the box itself: the server's log (the request named, the startup
#: phase, an OOM line) or a py-spy dump of the engine; Prometheus has neither
BOX_RULES = ("runaway", "engine_stall", "startup_stall", "startup_failure", "engine_died", "oom_startup",
             "oom_transient", "oom_steady", "api_unresponsive")

_XID_WORDS = {
    13: "graphics engine exception (usually the application)",
    31: "GPU memory page fault (usually the application)",
    43: "GPU stopped processing (usually the application)",
    45: "preemptive cleanup after an earlier error",
    48: "double-bit ECC error: drain the host and reset the GPU",
    63: "ECC page retirement or row remapping event",
    64: "ECC page retirement or row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus: drain the host, the GPU needs a reset or a reboot",
    92: "high single-bit ECC error rate",
    94: "contained ECC error: restart the application on that GPU",
    95: "uncontained ECC error: drain the host and reset the GPU",
    119: "GSP RPC timeout: reset the GPU",
    120: "GSP error: reset the GPU",
}


def box_hint(host: str) -> str:
    return f"ssh {host} vtop"


def on_the_box(a: Alert, host: str, engine: str | None = None) -> Alert:
    """``a`` with a last fix line saying what the box knows that Prometheus does not (the server's
    ``engine``: its name, from the engine table; vLLM's when not known)."""
    if a.rule not in BOX_RULES:
        return a
    line = (f"Prometheus has no {flags_of(engine)['name']} log and no process: `{box_hint(host)}` names the request "
            "(the log), dumps the engine's stack (d: py-spy) and shows the startup phase.")
    return Alert(a.rule, a.severity, a.title, a.evidence, (*a.fix, line), a.target, a.since)


def down_alert(url: str, label: str, host: str, *, since: float, now: float, why: str, last_ok_ago: float | None,
               engine: str | None = None) -> Alert:
    """An instance Prometheus cannot scrape; ``engine``: the one it served when last seen (its name from the
    engine table; vLLM's when never seen)."""
    name = flags_of(engine)["name"]
    ev = [why]
    if last_ok_ago is not None:
        ev.append(f"its last good sample in Prometheus is {dur(last_ok_ago)} old")
    fix = (f"On the box: `{box_hint(host)}` says whether {name} is starting, crashed or was stopped (its log and "
           "process); `systemctl status` / `docker ps -a` / `kubectl get pod` for how it was run.",
           "A target that is up but unreachable from Prometheus (a firewall, a moved port) reads the same: "
           f"curl http://{label}/metrics from the Prometheus host.")
    return Alert("server_down", "critical", f"{name} {label} is DOWN for {dur(max(0.0, now - since))}", tuple(ev), fix,
                 url, since)


def xid_alert(host: str, xids: Mapping[str, float], urls: list[str], *, now: float) -> Alert:
    ev = []
    worst = "warning"
    for gpu, x in sorted(xids.items()):
        code = int(x)
        words = _XID_WORDS.get(code, "see NVIDIA's XID catalogue")
        ev.append(f"gpu{gpu}: XID {code}: {words}")
        if code in (48, 79, 95, 119, 120, 64, 74):
            worst = "critical"
    if urls:
        ev.append("serving there: " + ", ".join(u.split("://", 1)[-1] for u in urls))
    fix = (f"`{box_hint(host)}` (or `nvidia-smi -q -d ECC,PAGE_RETIREMENT` and `dmesg | grep -i xid` there) to see "
           "the GPU's state; drain the host before a reset.",)
    gpus = ", ".join(f"gpu{g}" for g in sorted(xids))
    return Alert("gpu_xid", worst, f"XID errors on {host} ({gpus})", tuple(ev), fix, f"host:{host}", None)
