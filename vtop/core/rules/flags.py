"""``risky_flags``: launch flags that invite trouble, read from the server's command line
(and the log's startup facts).

Evidence: a ``max_model_len`` of ``long_context_len`` or more with no generation cap
(``--override-generation-config`` ``max_new_tokens``); ``--mm-processor-cache-gb 0``;
``--max-num-seqs`` ``risky_seqs_ratio`` times the KV cache's logged maximum concurrency;
``--gpu-memory-utilization`` (or its default: 0.92 from vLLM 0.20, 0.9 before) that leaves no room
next to the other processes NVML lists on the server's GPUs. Corpus traces: none raises it
(the CPU corpus has no GPU and short contexts); tests/unit/test_diagnose.py covers each flag.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vtop.core.engines import flags_of
from vtop.core.rules.alert import RANK, Alert
from vtop.core.rules.context import Evidence, Memory, per_server
from vtop.core.rules.util import cap_suggestion, flag, gib, json_keys, num, short_url, version_tuple
from vtop.model.fmt import to_float
from vtop.model.procs import ServerProcess

if TYPE_CHECKING:
    from vtop.core.phases.types import StartupFacts
    from vtop.core.rules.state import ServerState
    from vtop.core.server import ServerView


class RiskyFlags:
    """The risky-flags rule (see the module's docstring)."""

    ids = ("risky_flags",)

    def check(self, ctx: Evidence, mem: Memory) -> list[Alert]:
        return per_server(ctx, mem, risky_flags)


@dataclass(frozen=True)
class FlagFinding:
    """One risky flag: which (``kind``), how bad, and the numbers its words need."""

    kind: str  # "no_cap" | "mm_cache_off" | "seqs_over_kv" | "mem_util_no_room"
    severity: str
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_concurrency: float | None = None
    max_concurrency_len: int | None = None
    kv_cache_tokens: int | None = None
    gpu: int | None = None
    util: float | None = None
    util_default: bool = False
    others_bytes: float = 0.0
    others: tuple[str, ...] = ()
    mem_total: float | None = None
    #: the server's engine (:data:`vtop.core.engines.ENGINES`; None: vLLM's words): the words name its flags
    engine: str | None = None


def risky_flags(ctx: Evidence, mem: Memory, url: str, v: ServerView, st: ServerState) -> Alert | None:
    proc = ctx.process_of(url)
    if proc is None:
        return None
    facts = ctx.startup.facts if ctx.startup is not None and ctx.log_target == url else None
    found = flag_findings(ctx, mem, v, st, proc, facts)
    if not found:
        return None
    return risky_flags_alert(url, found, st.first_t if st.first_t is not None else ctx.now)


def flag_findings(ctx: Evidence, mem: Memory, v: ServerView, st: ServerState, proc: ServerProcess,
                  facts: StartupFacts | None) -> list[FlagFinding]:
    """Every risky flag of a server's command line."""
    th = mem.th
    mml = v.max_model_len or proc.max_model_len or (facts.max_model_len if facts is not None else None)
    fl = flags_of(proc.engine)
    out: list[FlagFinding] = []
    # A long context with no generation cap: one chat client without max_tokens runs to max_model_len (an
    # engine with no server-side cap has no fix to name: the runaway rule tells its clients to set one).
    if fl["gen_cap_flag"]:
        ogc = flag(proc, fl["gen_cap_flag"])
        capped = bool(ogc) and "max_new_tokens" in json_keys(ogc)
        unknown = flag(proc, fl["gen_config"]) not in (None, "", *fl["gen_config_plain"].split())
        if mml and mml >= th.long_context_len and not capped and not unknown:
            out.append(FlagFinding("no_cap", "info", max_model_len=mml, engine=proc.engine))
    mm = flag(proc, fl["mm_cache"]) if fl["mm_cache"] else None
    if mm is not None and to_float(mm) == 0.0:
        out.append(FlagFinding("mm_cache_off", "info", engine=proc.engine))
    seqs = proc.max_num_seqs
    if seqs and facts is not None and facts.max_concurrency and seqs / facts.max_concurrency >= th.risky_seqs_ratio:
        out.append(FlagFinding("seqs_over_kv", "info", max_num_seqs=seqs, max_concurrency=facts.max_concurrency,
                               max_concurrency_len=facts.max_concurrency_len, kv_cache_tokens=facts.kv_cache_tokens,
                               engine=proc.engine))
    out += _mem_util_findings(ctx, mem, v, st, proc)
    return out


def _mem_util_findings(ctx: Evidence, mem: Memory, v: ServerView, st: ServerState,
                       proc: ServerProcess) -> list[FlagFinding]:
    """The memory fraction flag (vLLM's utilization) next to the other processes on the same GPU."""
    fl = flags_of(proc.engine)
    util = to_float(flag(proc, fl["mem"]))
    if util is None:
        util = proc.gpu_memory_utilization
    default = util is None
    if util is None and not fl["mem_default"]:
        return []  # an engine that works its default fraction out itself: nothing to compare
    if util is None:
        ver, since = version_tuple(v.version), version_tuple(fl["mem_default_since"])
        util = float(fl["mem_default"] if ver is not None and since is not None and ver >= since
                     else fl["mem_default_before"])
    mine = set(proc.gpu_pids) | st.gpu_pids
    out = []
    for idx in mem.gpus_of(ctx, v.url):
        gs = mem.gpus.get(idx)
        p = gs.points[-1] if gs is not None and gs.points else None
        if p is None or not p.mem_total or p.procs is None:
            continue
        others = [q for q in p.procs if int(q.pid) not in mine and q.used_bytes]
        used = float(sum(q.used_bytes or 0 for q in others))
        if used > 0 and used + util * p.mem_total > p.mem_total:
            out.append(FlagFinding("mem_util_no_room", "warning", gpu=idx, util=util, util_default=default,
                                   others_bytes=used, others=tuple(mem.proc_names(ctx, others)),
                                   mem_total=p.mem_total, engine=proc.engine))
    return out


def _flag_words(f: FlagFinding) -> tuple[str, str, str]:
    """(headline, evidence line, fix) of one risky flag."""
    fl = flags_of(f.engine)
    if f.kind == "no_cap":
        mml = f.max_model_len
        return (
            f"no generation cap with {fl['len_word']} {num(mml)}",
            f"{fl['len_word']} {num(mml)} and no {fl['gen_cap_flag']} max_new_tokens: a chat request without "
            f"max_tokens may generate up to {num(mml)} - prompt tokens",
            "Cap generation: " + fl["gen_cap"].replace("{n}", str(cap_suggestion(mml))) + " (a hard cap since 0.20, "
            "and the default for "
            "requests that omit max_tokens).",
        )
    if f.kind == "mm_cache_off":
        return (
            f"multimodal processor cache off ({fl['mm_cache']} 0)",
            f"{fl['mm_cache']} 0 turns the multimodal processor cache off: every image or video is "
            "preprocessed again on the CPU, even when clients resend the same one",
            f"Drop {fl['mm_cache']} 0 (default 4 GiB) or use a small cache such as {fl['mm_cache']} 1 "
            "if host RAM was the reason (it is held once per API server and per engine core).",
        )
    if f.kind == "seqs_over_kv":
        seqs, conc = f.max_num_seqs or 0, f.max_concurrency or 1.0
        per = (f.kv_cache_tokens / seqs) if f.kv_cache_tokens else None
        return (
            f"{fl['seqs']} {seqs} is {seqs / conc:.0f}x the KV cache's concurrency",
            f"{fl['seqs']} {seqs}, but the KV cache holds {conc:g} requests of "
            f"{num(f.max_concurrency_len)} tokens"
            + (f" ({num(f.kv_cache_tokens)} tokens: {num(per)} per sequence when all run)" if per else "")
            + "; long requests will preempt each other",
            f"Lower {fl['seqs']} towards {max(1, int(conc * 2))}, or give the KV cache more "
            f"memory ({fl['mem']}, {fl['kv_fp8']}).",
        )
    util, total, used = f.util or 0.0, f.mem_total or 1.0, f.others_bytes
    room = max(0.0, (total - used) / total - 0.02)
    return (
        f"{fl['mem']} {util:g} leaves no room on gpu{f.gpu}",
        f"gpu{f.gpu}: other processes hold {gib(used)} ({', '.join(f.others)}); "
        f"{fl['mem']} {util:g}{' (default)' if f.util_default else ''} asks for "
        f"{gib(util * total)} of {gib(total)}: together {gib(used + util * total)}",
        f"Lower {fl['mem']} to {math.floor(room * 100) / 100:.2f} or less (what is left next "
        "to the other processes), or move them to another GPU; as it is, a restart of this server or the "
        "other process's next allocation fails.",
    )


def risky_flags_alert(url: str, found: list[FlagFinding], since: float) -> Alert:
    """The words of a server's risky flags: one alert, the worst first."""
    found = sorted(found, key=lambda f: RANK[f.severity])
    words = [_flag_words(f) for f in found]
    head = words[0][0] + (f" (+{len(words) - 1} more)" if len(words) > 1 else "")
    return Alert(
        "risky_flags", found[0].severity, f"Risky launch flags on {short_url(url)}: {head}",
        tuple(w[1] for w in words), tuple(w[2] for w in words), url, since,
    )
