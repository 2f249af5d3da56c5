"""``vtop --once [--json] --prometheus URL`` and ``vtop doctor --prometheus URL``: the fleet, no Textual.

The same :class:`~vtop.monitor.fleet.Fleet` the fleet screen drives: one refresh, the
history from ``query_range`` (the same rules over it), and, for ``doctor`` or a ``--window``,
more refreshes for that long. JSON schema ``vtop.fleet/1``
(``vtop/schema/fleet-v1.schema.json``). Exit status as ``vtop --once``: 0 OK, 1 a warning,
2 a critical alert or an instance DOWN, 3 unknown (Prometheus did not answer, or no vLLM
instance in it).
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from vtop import __version__
from vtop.config import Config
from vtop.core.engines import flags_of
from vtop.exitcodes import EXIT_CRITICAL, EXIT_OK, EXIT_UNKNOWN, EXIT_WARNING
from vtop.model.fmt import dur
from vtop.monitor.fleet import BOX_ONLY, Fleet, FleetRow, client_from_config

SCHEMA = "vtop.fleet/1"


async def _watch(fleet: Fleet, window_s: float) -> None:
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    try:
        await fleet.start()
        while loop.time() - t0 + fleet.refresh_s <= window_s:
            await asyncio.sleep(fleet.refresh_s)
            await fleet.start()
    finally:
        await fleet.aclose()


def exit_code(fleet: Fleet) -> int:
    if fleet.error is not None or not fleet.rows:
        return EXIT_UNKNOWN
    sev = {a.severity for a in fleet.alerts}
    if "critical" in sev or any(r.state == "down" for r in fleet.rows.values()):
        return EXIT_CRITICAL
    if "warning" in sev:
        return EXIT_WARNING
    return EXIT_OK


def exit_reason(fleet: Fleet) -> str:
    """Why :func:`exit_code` is what it is, in one line (``exit 2: gpu-3:8000 is down``)."""
    code = exit_code(fleet)
    causes: list[str] = []
    if code == EXIT_UNKNOWN:
        causes = [f"Prometheus: {fleet.error}" if fleet.error is not None else "no vLLM instance in Prometheus"]
    elif code == EXIT_CRITICAL:
        causes = [f"[CRITICAL] {a.title}" for a in fleet.alerts if a.severity == "critical"]
        causes += [f"{r.instance} is down" for r in fleet.rows.values() if r.state == "down"]
    elif code == EXIT_WARNING:
        causes = [f"[WARNING] {a.title}" for a in fleet.alerts if a.severity == "warning"]
    else:
        causes = [f"no alert; {len(fleet.rows)} instance(s)"]
    more = f" (and {len(causes) - 1} more)" if len(causes) > 1 else ""
    return f"exit {code}: {causes[0] if causes else 'unknown'}{more}"


def report_json(fleet: Fleet) -> dict[str, Any]:
    d = fleet.to_json()
    return {"schema": SCHEMA, "vtop_version": __version__, "exit_code": exit_code(fleet),
            "exit_reason": exit_reason(fleet), **d}


def _v(x: float | None, fmt: str = "{:.0f}", unit: str = "") -> str:
    return "-" if x is None else fmt.format(x) + unit


def row_text(r: FleetRow) -> str:
    g = r.gpus
    gpu = "-" if g is None else (f"{g.n or '?'} GPU util {_v(g.util)}% SM {_v(g.sm)}% mem {_v(g.mem_pct)}%"
                                 + (f" XID {','.join(str(int(x)) for x in g.xid.values())}" if g.xid else ""))
    fin = ",".join(f"{k} {v:.0f}" for k, v in sorted((r.finished or {}).items())) or "-"
    eng = flags_of(r.engine)["name"] if r.engine else "-"
    return (f"{r.instance:<24} {r.state.upper():<9} {eng:<6} run {_v(r.running):>4} wait {_v(r.waiting):>4} "
            f"KV {_v(r.kv_pct, unit='%'):>5} gen {_v(r.gen_tps, unit=' tok/s'):>10} "
            f"TTFT p50/p99 {_v(r.ttft_p50, '{:.2f}')}/{_v(r.ttft_p99, '{:.2f}')} s  finished/min {fin}  {gpu}"
            + (f"  [needs the box: {r.box}]" if r.box else ""))


def format_text(fleet: Fleet, *, doctor: bool = False) -> str:
    lines = [f"vtop {__version__} fleet from Prometheus {fleet.client.base}: {len(fleet.rows)} vLLM instance(s), "
             f"{fleet.last_queries} queries per refresh"]
    if fleet.error:
        lines.append(f"PROMETHEUS: {fleet.error}")
    for e in fleet.partial:
        lines.append(f"partly: {e}")
    if fleet.backfill_note:
        lines.append(fleet.backfill_note)
    if fleet.alerts:
        lines.append("")
        lines.append("ALERTS (worst first):")
        for a in fleet.alerts:
            lines.append(f"  [{a.severity.upper()}] {a.title}")
            if doctor:
                lines += [f"      {e}" for e in a.evidence]
                lines += [f"      fix: {f}" for f in a.fix]
    elif fleet.error is None and exit_code(fleet) == EXIT_OK:  # never "no alerts" beside exit 2
        lines.append("no alerts")
    lines.append("")
    for r in fleet.sorted_rows():
        lines.append(row_text(r))
    if doctor:
        lines.append("")
        lines.append("What Prometheus cannot tell (run `ssh HOST vtop` on the box for it):")
        lines += [f"  - {b}" for b in BOX_ONLY]
    return "\n".join(lines) + "\n"


def run_fleet_once(cfg: Config, *, window_s: float, as_json: bool, doctor: bool = False, out: Any = None) -> int:
    out = out or sys.stdout
    fleet = Fleet(cfg, client_from_config(cfg))
    try:
        asyncio.run(_watch(fleet, window_s))
    except KeyboardInterrupt:
        return 130
    if as_json:
        out.write(json.dumps(report_json(fleet), indent=2) + "\n")
    else:
        out.write(format_text(fleet, doctor=doctor))
        if fleet.error is None and not fleet.rows:
            out.write("no vLLM instance in Prometheus (no vllm:num_requests_running series)\n")
        out.write(exit_reason(fleet) + "\n")
    return exit_code(fleet)


__all__ = ["SCHEMA", "dur", "exit_code", "exit_reason", "format_text", "report_json", "run_fleet_once"]
