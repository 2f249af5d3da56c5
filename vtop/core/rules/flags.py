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
from typing import TYPE_CHECKING

from vtop.core.rules.alert import RANK, Alert
from vtop.core.rules.context import Evidence, Memory, per_server
from vtop.core.rules.util import cap_suggestion, flag, gib, json_keys, num, short_url, version_tuple
from vtop.model.fmt import to_float

if TYPE_CHECKING:
    from vtop.core.rules.state import ServerState
    from vtop.core.server import ServerView


class RiskyFlags:
    """The risky-flags rule (see the module's docstring)."""

    ids = ("risky_flags",)

    def check(self, ctx: Evidence, mem: Memory) -> list[Alert]:
        return per_server(ctx, mem, risky_flags)


def risky_flags(ctx: Evidence, mem: Memory, url: str, v: ServerView, st: ServerState) -> Alert | None:
    th = mem.th
    proc = ctx.process_of(url)
    if proc is None:
        return None
    items: list[tuple[str, str, str, str]] = []  # severity, headline, evidence, fix
    mml = v.max_model_len or proc.max_model_len
    facts = ctx.startup.facts if ctx.startup is not None and ctx.log_target == url else None
    if mml is None and facts is not None:
        mml = facts.max_model_len

    # A long context with no generation cap: one chat client without max_tokens runs to max_model_len.
    ogc = flag(proc, "--override-generation-config")
    gen_dir = flag(proc, "--generation-config")
    capped = bool(ogc) and "max_new_tokens" in json_keys(ogc)
    unknown = gen_dir not in (None, "", "auto", "vllm")
    if mml and mml >= th.long_context_len and not capped and not unknown:
        items.append((
            "info",
            f"no generation cap with max_model_len {num(mml)}",
            f"max_model_len {num(mml)} and no --override-generation-config max_new_tokens: a chat request without "
            f"max_tokens may generate up to {num(mml)} - prompt tokens",
            "Cap generation: --override-generation-config "
            f"'{{\"max_new_tokens\": {cap_suggestion(mml)}}}' (a hard cap since 0.20, and the default for "
            "requests that omit max_tokens).",
        ))
    mm = flag(proc, "--mm-processor-cache-gb")
    if mm is not None and to_float(mm) == 0.0:
        items.append((
            "info",
            "multimodal processor cache off (--mm-processor-cache-gb 0)",
            "--mm-processor-cache-gb 0 turns the multimodal processor cache off: every image or video is "
            "preprocessed again on the CPU, even when clients resend the same one",
            "Drop --mm-processor-cache-gb 0 (default 4 GiB) or use a small cache such as --mm-processor-cache-gb 1 "
            "if host RAM was the reason (it is held once per API server and per engine core).",
        ))
    seqs = proc.max_num_seqs
    if seqs and facts is not None and facts.max_concurrency:
        ratio = seqs / facts.max_concurrency
        if ratio >= th.risky_seqs_ratio:
            per = (facts.kv_cache_tokens / seqs) if facts.kv_cache_tokens else None
            items.append((
                "info",
                f"--max-num-seqs {seqs} is {ratio:.0f}x the KV cache's concurrency",
                f"--max-num-seqs {seqs}, but the KV cache holds {facts.max_concurrency:g} requests of "
                f"{num(facts.max_concurrency_len)} tokens"
                + (f" ({num(facts.kv_cache_tokens)} tokens: {num(per)} per sequence when all run)" if per else "")
                + "; long requests will preempt each other",
                f"Lower --max-num-seqs towards {max(1, int(facts.max_concurrency * 2))}, or give the KV cache more "
                "memory (--gpu-memory-utilization, --kv-cache-dtype fp8).",
            ))
    # --gpu-memory-utilization next to the other processes on the same GPU.
    util = to_float(flag(proc, "--gpu-memory-utilization"))
    if util is None:
        util = proc.gpu_memory_utilization
    default = util is None
    if util is None:
        ver = version_tuple(v.version)
        util = 0.92 if ver is not None and ver >= (0, 20) else 0.9
    mine = set(proc.gpu_pids) | st.gpu_pids
    for idx in mem.gpus_of(ctx, url):
        gs = mem.gpus.get(idx)
        p = gs.points[-1] if gs is not None and gs.points else None
        if p is None or not p.mem_total or p.procs is None:
            continue
        others = [q for q in p.procs if int(q.pid) not in mine and q.used_bytes]
        used = float(sum(q.used_bytes or 0 for q in others))
        if used > 0 and used + util * p.mem_total > p.mem_total:
            room = max(0.0, (p.mem_total - used) / p.mem_total - 0.02)
            items.append((
                "warning",
                f"--gpu-memory-utilization {util:g} leaves no room on gpu{idx}",
                f"gpu{idx}: other processes hold {gib(used)} ({', '.join(mem.proc_names(ctx, others))}); "
                f"--gpu-memory-utilization {util:g}{' (default)' if default else ''} asks for "
                f"{gib(util * p.mem_total)} of {gib(p.mem_total)}: together {gib(used + util * p.mem_total)}",
                f"Lower --gpu-memory-utilization to {math.floor(room * 100) / 100:.2f} or less (what is left next "
                "to the other processes), or move them to another GPU; as it is, a restart of this server or the "
                "other process's next allocation fails.",
            ))
    if not items:
        return None
    items.sort(key=lambda x: RANK[x[0]])
    sev = items[0][0]
    head = items[0][1] + (f" (+{len(items) - 1} more)" if len(items) > 1 else "")
    since = st.first_t if st.first_t is not None else ctx.now
    return Alert(
        "risky_flags", sev, f"Risky launch flags on {short_url(url)}: {head}",
        tuple(i[2] for i in items), tuple(i[3] for i in items), url, since,
    )
