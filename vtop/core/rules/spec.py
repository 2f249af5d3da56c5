"""``spec_decode_low``: speculative decoding that has stopped paying.

Evidence: the server exports vLLM's spec-decode counters (``--speculative-config``), draft tokens are
proposed (at least ``spec_min_draft_tokens`` in the view's window), and the share accepted stays below
``spec_low_acceptance_pct`` for ``spec_low_s`` (minutes). Each step then verifies k draft tokens that are
thrown away: the target model does extra work for next to no extra tokens, so speculation costs
throughput instead of adding it (a mean acceptance length near 1.0 is one token a step, as without
it). Recorded: the real CPU build with n-gram drafts sampled at temperature 1 (the random-weight
model's tokens rarely repeat) accepts a few per cent (tests/fixtures/vllm/signals/spec-random), at
temperature 0 ~94 % (spec-prefix). Quiet while the server sleeps, and while no drafts are proposed
(an idle window neither starts nor clears it).
"""

from __future__ import annotations

from vtop.core.rules.alert import Alert, Thresholds
from vtop.core.rules.context import Evidence, Memory
from vtop.core.rules.util import LIVE, dur, num, short_url
from vtop.core.server import ServerView, SpecView


class SpecLow:
    """The spec-decode acceptance rule (see the module's docstring). Keeps, per server, since when
    acceptance has been low."""

    ids = ("spec_decode_low",)

    def __init__(self) -> None:
        self._low_since: dict[str, float] = {}

    def check(self, ctx: Evidence, mem: Memory) -> list[Alert]:
        th = mem.th
        for url in list(self._low_since):
            if url not in ctx.servers:
                del self._low_since[url]
        out = []
        for url, v in ctx.servers.items():
            since = self._note(url, v, th, ctx.now)
            if since is not None and ctx.now - since >= th.spec_low_s and v.spec is not None:
                out.append(spec_low_alert(url, v, v.spec, since, ctx.now, th))
        return out

    def _note(self, url: str, v: ServerView, th: Thresholds, now: float) -> float | None:
        """Since when ``url``'s acceptance has been low (None: it is not)."""
        sp = v.spec
        if v.state not in LIVE or sp is None or v.sleep_level:
            self._low_since.pop(url, None)
            return None
        if sp.acceptance is None or (sp.draft_tokens or 0.0) < th.spec_min_draft_tokens:
            return None  # no drafts to judge: neither starts nor clears (nor says anything this tick)
        if 100.0 * sp.acceptance >= th.spec_low_acceptance_pct:
            self._low_since.pop(url, None)
            return None
        return self._low_since.setdefault(url, now)


def spec_low_alert(url: str, v: ServerView, sp: SpecView, since: float, now: float, th: Thresholds) -> Alert:
    """The words of a low acceptance (the finding: the server's :class:`SpecView` over its window, low since)."""
    pct = 100.0 * (sp.acceptance or 0.0)
    ev = [
        f"over the last {dur(v.window_s)}: {num(sp.draft_tokens)} draft tokens proposed"
        + (f" in {num(sp.drafts)} drafts" if sp.drafts else "")
        + f", {num(sp.accepted)} accepted ({pct:.1f} %); below {th.spec_low_acceptance_pct:g} % "
        f"for {dur(now - since)}",
    ]
    if sp.mean_len is not None:
        ev.append(f"mean acceptance length {sp.mean_len:.2f} tokens a step (1.00: what a step gives "
                  "without speculation)")
    if sp.per_pos:
        ev.append("accepted per draft position: " + ", ".join(f"{p:.3f}" for p in sp.per_pos))
    if v.gen_tps is not None:
        ev.append(f"generation {v.gen_tps:,.0f} tok/s")
    title = f"Speculative decoding on {short_url(url)} is not paying: {pct:.1f} % of draft tokens accepted " \
            f"for {dur(now - since)}"
    return Alert("spec_decode_low", "warning", title, tuple(ev), _SPEC_FIX, url, since)


_SPEC_FIX = (
    "Speculation costs here: every step verifies draft tokens that are thrown away. Restart without "
    "--speculative-config and compare the generation throughput.",
    "Or propose fewer: a smaller num_speculative_tokens in --speculative-config (n-gram: a larger "
    "prompt_lookup_min), or a draft model closer to the target (same family, same tokenizer).",
    "Sampling at high temperature lowers acceptance: speculation pays most on greedy or "
    "low-temperature, repetitive output (code, extraction, RAG).",
)
