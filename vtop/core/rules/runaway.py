"""``runaway``: a request that decodes on and on (the usual cause: a chat client that omits
``max_tokens``; vLLM then allows ``max_model_len - prompt`` tokens). A busy GPU is *not* required:
one decode stream on an H200 reads 10-23 % GPU-Util.

Evidence, either of two paths:

* quiet (:func:`_runaway_quiet`): requests running, generation tokens rising within ``rising_s``,
  and no request finished for ``runaway_s`` while ``waiting`` is zero or growing; or, with a short
  history, the request log names a request sent without ``max_tokens`` that has run that long;
* by age (:func:`_runaway_by_age`): whatever other traffic comes and goes, the oldest in-flight
  request is known from ``/metrics`` alone (``running`` never dropped below what is left of the
  requests running at t0, and fewer finishes of requests that began before t0, by their
  ``e2e_request_latency``, than were in flight; vtop/core/inflight.py) to have run ``runaway_age_s``
  or ``runaway_age_ordinary_x`` times what requests ordinarily take here, while tokens flow.
  With the request log on, the request itself is proven in flight (:func:`_proven_logged`:
  its effective ``max_tokens`` bucket of ``request_params_max_tokens`` shows fewer finishes
  since it came than requests of that bucket came before it; vtop/core/inflight.py
  ``oldest_logged``) and named. Time the generation counter stood still within the age (a
  frozen engine) does not count: that is the stall rule's.
  A request whose client set ``max_tokens`` is shown as info ("long request"), not alarmed.
  On a server on this box, the kernel's counters of its connections prove one request's age
  whatever else comes and goes, request log or not (vtop/core/conns.py): an answer still
  streaming on a connection whose request came N s ago is a request that has run N s; the
  client's address is then named (``runaway-short-traffic-no-request-log``). A non-streamed
  completion sends nothing until it ends: a connection whose request came N s ago with no byte
  of its answer since is a request N s in flight, taken only while nothing waits (then it is in
  the engine, not the queue) (``runaway-nonstreaming-short-traffic-no-request-log``).
  When what ``/metrics`` showed is too short (``doctor --window 15``, an attach), the log's
  history stands in (:meth:`vtop.core.loghistory.LogHistoryView.oldest_running`): no request
  began (no prompt throughput) since a stats line where requests ran, or the request log names a
  request sent without ``max_tokens``, never aborted, with requests running in every stats line
  since.

Corpus traces: tests/corpus/traces/runaway-alone-no-request-log, runaway-with-short-traffic,
runaway-streaming-after-others, h200-runaway-short-traffic (all replayed at the live
scraper's cadence, histograms every 5 s); quiet on normal-bursts-waiting-queue,
normal-idle-3min, normal-long-generation-max-tokens, normal-long-generation-20k, and on
h200-engine-stall-load (requests stuck 45 s in a frozen engine are no runaway).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from vtop.core.inflight import oldest_logged
from vtop.core.rates import histogram_delta, histogram_quantile
from vtop.core.rules.alert import Alert
from vtop.core.rules.context import Evidence, Memory, per_server
from vtop.core.rules.util import LIVE, cap_suggestion, dur, hist_count_at_least, num, plural, short_url
from vtop.core.stats import fmean

if TYPE_CHECKING:
    from vtop.core.requests import InFlight
    from vtop.core.rules.state import ServerState
    from vtop.core.server import ServerView


class Runaway:
    """The runaway rule (see the module's docstring for its evidence and traces)."""

    ids = ("runaway",)

    def check(self, ctx: Evidence, mem: Memory) -> list[Alert]:
        return per_server(ctx, mem, runaway)


def runaway(ctx: Evidence, mem: Memory, url: str, v: ServerView, st: ServerState) -> Alert | None:
    """Either path: nothing finished for ``runaway_s``, or the oldest request known to be old."""
    return _runaway_quiet(ctx, mem, url, v, st) or _runaway_by_age(ctx, mem, url, v, st)


def _ordinary_e2e_s(st: ServerState) -> float | None:
    """How long requests ordinarily take on this server, over the history: the p95 of
    the end-to-end latency of those that finished, or, by Little's law, the mean number
    running over the rate they finish at (whichever is longer; None when nothing finished)."""
    s = st.last
    old = next((x for x in st.samples if x.done is not None or x.e2e is not None), None)
    if s is None or old is None or old is s or s.t <= old.t:
        return None
    out: list[float] = []
    if s.e2e is not None and old.e2e is not None:
        d = histogram_delta(old.e2e, s.e2e)
        if d is not None and (d.count or 0) >= 5:
            q = histogram_quantile(0.95, d.buckets)
            if q is not None and math.isfinite(q):
                out.append(q)
    if s.done is not None and old.done is not None and s.done - old.done >= 5:
        rate = (s.done - old.done) / (s.t - old.t)
        runs = [x.running for x in st.samples if x.t >= old.t and x.running is not None]
        if runs and rate > 0:
            out.append(fmean(runs) / rate)
    return max(out) if out else None

def _proven_logged(ctx: Evidence, mem: Memory, url: str, st: ServerState) -> tuple[float, float, Any] | None:
    """(age, since, request): the logged request known to be in flight longest (the request
    log with the max_tokens histogram, :func:`vtop.core.inflight.oldest_logged`), or None."""
    reqs = ctx.requests_of(url)
    s = st.last
    if not reqs or s is None:
        return None
    # where the log has Added lines, one that has none yet was not taken by the engine (refused?)
    added_logged = any(r.added for r in reqs)
    rows = [(float(r.since), float(r.max_tokens), r) for r in reqs
            if isinstance(r.max_tokens, int)
            and (r.added or not added_logged)]
    busy = None if s.running is None else s.running + (s.waiting or 0.0)

    def generated_since(t: float) -> float | None:
        a = st.at(t)  # the sample at or before t (or the oldest: then fewer are counted out)
        if a is None or a.gen is None or s.gen is None or a.t > t:
            return None
        return s.gen - a.gen

    return oldest_logged(rows, st.max_tokens_ledger, st.oldest.pending_starts(), s.t, busy,
                         pending_but_length=st.oldest.pending_starts(but_length=True),
                         generated_since=generated_since,
                         logged_since_start=ctx.logged_since_start if url == ctx.log_target else None)


def _flat_s(st: ServerState, since: float, now: float) -> float:
    """Seconds of ``[since, now]`` the generation counter stood still between two samples
    (a frozen engine: its requests grow old without decoding)."""
    out = 0.0
    prev = None
    for x in st.samples[max(0, bisect_right(st.times, since) - 1):]:
        if x.t > now:
            break
        if prev is not None and prev.gen is not None and x.gen is not None and x.gen <= prev.gen:
            out += x.t - max(prev.t, since)
        prev = x
    return out


def _runaway_by_age(ctx: Evidence, mem: Memory, url: str, v: ServerView, st: ServerState) -> Alert | None:
    th = mem.th
    s = st.last
    if s is None or v.state not in LIVE or not s.running or s.running < 1:
        return None
    age = st.oldest.lower_bound_s
    ct = ctx.conns.get(url)
    conn = ct.oldest(ctx.now) if ct is not None else None
    if conn is not None and conn.pending and s.waiting != 0:
        # no answer yet: queued or decoding, the connection does not say which; with nothing waiting
        # (vLLM's gauge) every request in flight is in the engine. Else only a streaming answer counts.
        conn = ct.oldest(ctx.now, pending=False) if ct is not None else None
    if age < min(th.runaway_age_s, th.runaway_s) and not ctx.requests_of(url) and ctx.history_of(url) is None \
            and conn is None:
        # The limit below is never under that, and only the request log, the log's history or the
        # kernel's connections could raise the age: nothing can be proven here (every server, every
        # tick; a fleet has none of them).
        return None
    since = st.oldest.since
    running_then = st.oldest.running_then
    short = short_url(url)
    ordinary = _ordinary_e2e_s(st)
    # --runaway-threshold below 45 s lowers this too: a flag works the same on both paths
    limit = max(min(th.runaway_age_s, th.runaway_s), th.runaway_age_ordinary_x * ordinary if ordinary else 0.0)
    named = _named_request(ctx.requests_of(url))
    log_line = None
    proven = _proven_logged(ctx, mem, url, st)
    if proven is not None:
        p_age, p_since, req = proven
        mt = req.max_tokens
        no_client = req.no_client_max_tokens
        if p_age >= age or p_age >= limit:
            # proven in flight that long: it, not the log's oldest entry (which may have
            # ended unseen), is the request to name
            rid = req.request_id
            named = (rid, p_age, False, mt, no_client)
            if p_age >= age:
                age, since, running_then = p_age, p_since, None
                log_line = (
                    f"the request log: {rid} came {dur(s.t - p_since)} ago with max_tokens {num(mt)} and has no end or "
                    f"abort line; vLLM's request_params_max_tokens histogram counts every finish by its max_tokens, "
                    f"and none of those since can be it: it has run at least {dur(p_age)}")
    client = None
    pending = False
    if conn is not None and ctx.now - conn.since > age:
        # One HTTP/1.1 connection carries one request at a time: an answer still streaming on a
        # connection whose request came N s ago is a request that has run N s (vtop/core/conns.py).
        age, since, running_then = ctx.now - conn.since, conn.since, None
        client = conn.remote
        pending = conn.pending
        if pending:
            log_line = (
                f"the kernel's TCP counters for {short}: the request that came {dur(age)} ago on the connection "
                f"from {conn.remote} has had no byte of its answer yet (a completion without \"stream\": true is "
                f"sent whole when it ends), and no request waits: it is in the engine; a connection carries one "
                f"request at a time, so that request has been in flight {dur(age)}")
        else:
            sent = f", {conn.bytes_sent:,} bytes sent in the last {dur(conn.seen_s)}" if conn.bytes_sent else ""
            log_line = (
                f"the kernel's TCP counters for {short}: the answer to the request that came {dur(age)} ago on the "
                f"connection from {conn.remote} is still streaming{sent}; a connection carries one request at a "
                f"time, so that request has run {dur(age)}")
    hist = ctx.history_of(url)
    if age < limit and hist is not None and st.first_t is not None and st.busy_since is not None \
            and st.busy_since <= st.first_t and ctx.now - st.first_t < limit \
            and st.oldest.since is not None and st.oldest.since - st.first_t <= max(2.0, (ctx.now - st.first_t) / 3):
        # What /metrics saw is too short to tell (doctor's window, an attach), and does not
        # contradict it: requests ran at every sample, and one running from the first third of
        # it on has not finished by the end-to-end latencies of those that did (short requests
        # that come and go do not keep that up; vtop/core/inflight.py). The log's history says
        # since when.
        first = st.samples[0] if st.samples else None
        prompt_flat = first is not None and first.prompt is not None and s.prompt == first.prompt
        got = hist.oldest_running(ctx.now, st.first_t, prompt_flat, named)
        if got is not None and ctx.now - got[0] > age:
            since, running_then, log_line = got
            age = ctx.now - since
    if age < limit or since is None:
        return None
    flat = _flat_s(st, since, s.t)
    if age - flat < limit:
        return None  # it waited on a frozen engine, it did not decode that long (the stall rule's)
    r = st.at(s.t - th.rising_s)
    if r is None or r is s or r.gen is None or s.gen is None or not s.gen > r.gen or r.t >= s.t:
        return None  # no tokens flowing: a stall, not a runaway (the stall rule's)
    rate = (s.gen - r.gen) / (s.t - r.t)
    n = s.running
    w_now = s.waiting or 0.0
    mml = v.max_model_len
    ev = [
        log_line or (
            f"the oldest in-flight request has run at least {dur(age)}: {num(running_then)} running "
            f"{dur(age)} ago and running has never dropped below what is left of them, while requests that "
            f"finished since (their end-to-end latency says when they began) cannot all be those"),
        f"{plural(n, 'request')} running now, waiting {num(w_now)}; decoding {rate:,.0f} tok/s over the last "
        f"{s.t - r.t:.0f} s",
    ]
    if ordinary is not None:
        ev.append(f"requests that finished here took {dur(ordinary)} or less (p95)")
    legit = False
    if named is not None:
        rid, rage, upper, mt, no_client = named
        if no_client:
            ev.insert(0, f"request {rid}: the client sent no max_tokens, vLLM filled in {num(mt)}; running "
                         f"{'at most ' if upper else ''}{dur(rage or 0)}")
        elif mt is not None:
            legit = True
            ev.insert(0, f"oldest in-flight request {rid}: max_tokens {num(mt)} set by the client, running "
                         f"{'at most ' if upper else ''}{dur(rage or 0)}")
    if mml:
        per_req = rate / n if n else rate
        line = f"max_model_len {num(mml)}: a chat request without max_tokens may generate up to {num(mml)} - prompt tokens"
        if per_req > 0:
            line += f"; at {per_req:,.0f} tok/s per request that is up to {dur(mml / per_req)}"
        ev.append(line)
    if legit:
        title = f"Long request on {short}: running at least {dur(age)} (its client set max_tokens)"
        return Alert("runaway", "info", title, tuple(ev), (
            "It has a cap: it ends by itself. If it should not take this long, lower max_tokens in the client.",
        ), url, since)
    fix = _runaway_fixes(mml, ctx.request_logging_of(url) is False, client)
    title = (f"Runaway decode on {short}: a request {'in flight' if pending else 'running'} at least {dur(age)}, "
             f"{rate:,.0f} tok/s over {s.t - r.t:.0f} s"
             + (f" (client {client})" if client else "" if log_line else ", while other requests finish"))
    sev = "critical" if w_now > 0 else "warning"
    return Alert("runaway", sev, title, tuple(ev), tuple(fix), url, since)

def _runaway_fixes(mml: int | None, no_request_log: bool, client: str | None = None) -> list[str]:
    fix = [
        "Set max_tokens (or max_completion_tokens) in every client request; chat requests without it may run "
        f"to max_model_len{f' ({num(mml)})' if mml else ''}.",
        "Cap it on the server: restart vLLM with --override-generation-config "
        f"'{{\"max_new_tokens\": {cap_suggestion(mml)}}}' (there is no --max-tokens serve flag).",
        "To stop it now, cancel the client request: vLLM aborts a request when its client disconnects.",
    ]
    if client:
        port = client.rsplit(":", 1)[-1]
        fix.append(f"The client is {client}: on its host, ss -tnp 'sport = :{port}' names its process "
                   "(killing that connection also aborts the request).")
    if no_request_log:
        fix.append("Start vLLM with --enable-log-requests to let vtop name the request.")
    return fix

def _runaway_quiet(ctx: Evidence, mem: Memory, url: str, v: ServerView, st: ServerState) -> Alert | None:
    th = mem.th
    s = st.last
    if s is None or v.state not in LIVE or not s.running or s.running < 1:
        return None
    if st.last_finish_t is None or st.busy_since is None:
        return None
    # Requests have run without one finishing since then (idle time does not count).
    since = max(st.last_finish_t, st.busy_since)
    now = ctx.now
    named = _named_request(ctx.requests_of(url))
    if now - since < th.runaway_s:
        # The metrics history is too short (vtop doctor's 15 s window, or vtop just
        # started): the request log can still say how long the request has run.
        # Only a request the client sent without max_tokens counts, and only while
        # nothing finished in what vtop saw.
        if named is None or not named[4] or named[1] is None or named[1] < th.runaway_s:
            return None
        if st.last_finish_t > st.busy_since:
            return None
        since = min(since, now - named[1])
    a = st.at(since)
    r = st.at(s.t - th.rising_s)
    if r is s and len(st.samples) > 1:
        r = st.samples[0]
    if a is None or r is None or s.gen is None or a.gen is None or r.gen is None:
        return None
    if r is s and len(st.samples) > 1:
        r = st.samples[-2]
    if r.gen is None or not s.gen > r.gen or r.t >= s.t:
        return None
    w_now, w_then = s.waiting or 0.0, a.waiting or 0.0
    if not (w_now == 0 or w_now >= w_then):
        return None
    # The decode rate now (the last ``rising_s``), and the tokens made since it began.
    rate = (s.gen - r.gen) / (s.t - r.t)
    base = st.at(st.idle_before) if st.busy_known and st.idle_before is not None and st.idle_before >= st.last_finish_t else a
    made = s.gen - (base.gen if base is not None and base.gen is not None else a.gen)
    n = s.running
    per_req = rate / n if n else rate
    mml = v.max_model_len
    short = short_url(url)

    ev: list[str] = []
    # How old the oldest running request is.
    age: float | None = None
    age_txt = ""
    if named is not None:
        rid, rage, upper, mt, no_client = named
        if rage is not None:
            age = rage
        who = f"request {rid}"
        if no_client:
            ev.append(
                f"{who}: the client sent no max_tokens, vLLM filled in {num(mt)}; running "
                f"{'at most ' if upper else ''}{dur(rage or 0)}"
            )
        else:
            ev.append(f"oldest in-flight {who}: max_tokens {num(mt)}, running {'at most ' if upper else ''}{dur(rage or 0)}")
    if st.busy_since is not None:
        finished = max((s.done or 0.0) - st.busy_done0, st.busy_drops)
        if finished < st.busy_n0:
            est = now - st.busy_since
            if st.busy_known:
                age_txt = (
                    f"oldest running request started about {dur(est)} ago: running went 0 -> {num(st.busy_n0)} then "
                    f"and never back to 0, with {num(finished)} of those finished since"
                )
            else:
                age_txt = f"oldest running request: at least {dur(est)} (running > 0 since vtop started watching)"
            if age is None:
                age = est
    ev.append(
        f"{plural(n, 'request')} running, none finished for {dur(now - since)}; waiting {num(w_now)}"
    )
    if age_txt:
        ev.append(age_txt)
    ev.append(f"decoding {rate:,.0f} tok/s over the last {s.t - r.t:.0f} s; {num(made)} tokens generated since "
              "these requests started")
    if s.kv is not None and a.kv is not None and s.kv > a.kv:
        ev.append(f"KV cache {a.kv:.2f} % -> {s.kv:.2f} % and climbing (the sequences keep growing)")
    if mml:
        line = f"max_model_len {num(mml)}: a chat request without max_tokens may generate up to {num(mml)} - prompt tokens"
        if per_req > 0:
            line += f"; at {per_req:,.0f} tok/s per request that is up to {dur(mml / per_req)}"
        ev.append(line)
    # Histogram of resolved max_tokens over the remembered history: values near
    # max_model_len betray clients that omit it (the metric records the resolved value, the server's default
    # max_model_len - prompt when the client set none).
    old = next((x for x in st.samples if x.max_tokens is not None), None)
    if mml and old is not None and old.max_tokens is not None and s.max_tokens is not None and old is not s:
        d = histogram_delta(old.max_tokens, s.max_tokens)
        cnt, edge = hist_count_at_least(d, th.runaway_near_len_frac * mml)
        if cnt > 0 and d is not None:
            exact = ""
            if d.count == 1 and d.sum is not None:
                exact = f" (max_tokens {num(d.sum)})"
            line = (
                f"{plural(cnt, 'request')} finished in the last {dur(s.hist_t - old.hist_t)} with max_tokens above "
                f"{num(edge)}{exact}, near max_model_len {num(mml)}: clients omitting max_tokens"
            )
            if s.length is not None and old.length is not None and s.length > old.length:
                line += f"; {num(s.length - old.length)} finished with reason 'length'"
            ev.append(line)
    for idx in mem.gpus_of(ctx, url):
        gl = mem.gpu_line(idx, since, now)
        if gl:
            ev.append(gl + " (supporting only: one decode stream keeps a big GPU far from 100 %)")

    fix = _runaway_fixes(mml, ctx.request_logging_of(url) is False)
    dur_txt = f"running {dur(age)}" if age is not None else f"nothing finished for {dur(now - since)}"
    window = f"{s.t - r.t:.0f} s"
    title = f"Runaway decode on {short}: {plural(n, 'request')} {dur_txt}, {rate:,.0f} tok/s over {window}, nothing finished"
    if age is None:
        title = f"Runaway decode on {short}: {plural(n, 'request')} running, {rate:,.0f} tok/s over {window}, {dur_txt}"
    sev = "critical" if w_now > 0 else "warning"
    return Alert("runaway", sev, title, tuple(ev), tuple(fix), url, since)

def _named_request(reqs: Sequence[InFlight] | None) -> tuple[str, float | None, bool, int | None, bool] | None:
    """(id, age, age is an upper bound, max_tokens, client omitted it) of the request to name."""
    if not reqs:
        return None
    flagged = [r for r in reqs if r.no_client_max_tokens]
    pool = flagged or list(reqs)
    r = max(pool, key=lambda r: r.age_s)
    return (r.request_id, r.age_s, r.age_is_upper_bound, r.max_tokens, bool(flagged))

# ------------------------------------------------------------------ rule 2: engine stall
