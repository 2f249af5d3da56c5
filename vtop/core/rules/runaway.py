"""``runaway``: a request that decodes on and on (the usual cause: a chat client that omits
``max_tokens``; vLLM then allows ``max_model_len - prompt`` tokens). A busy GPU is *not* required:
one decode stream on an H200 reads 10-23 % GPU-Util.

The rule reads one answer: the server's requests in flight (``mem.in_flight``, made once a tick by
:func:`vtop.core.requests.requests_in_flight`), whose oldest is the request every face names, with its
age as a lower bound and what proves it (the request log with the ``max_tokens`` histogram, its
connection's counters, or ``/metrics`` alone: the per-sample candidates, and the time requests ran
against the finished ones' latencies, which holds under a closed loop of short requests). A request
whose answer went silent (its connection open, no byte for 8 s: a frozen engine, or a client that
stopped reading) is in flight but is no premise: the rule reads the oldest of the others
(``answering``), calls it "the oldest still answering" where the silent one is older, and says so in
a line of its own. It decides
on that answer (:class:`Finding`), by either of two paths of evidence, and words the alert in one
place (:func:`_alert`):

* by age (:func:`_by_age`): the oldest request has run ``runaway_age_s``, or ``runaway_age_ordinary_x``
  times what requests ordinarily take here, while tokens flow; time the generation counter stood
  still within the age (a frozen engine) does not count: that is the stall rule's. Where too few requests
  finished to know what is ordinary and the oldest is not one apart (the log says it has no max_tokens, or
  no other request still answering came within ``PEER_AGE_S`` of it), the bound is ``runaway_s``: a batch
  of long answers of one age looks the same as many runaways (h100-neighbour-gpu-bound: 32 streams of
  8,192 tokens, none done at 46 s). A request whose
  client set ``max_tokens`` is shown as info ("long request"), not alarmed; a connection's client is
  named (its address and port);
* quiet (:func:`_quiet`): requests running, generation tokens rising within ``rising_s``, and no
  request finished for ``runaway_s`` while ``waiting`` is zero or growing; or, with a short history,
  the request log names a request sent without ``max_tokens`` that came that long ago.

Corpus traces: tests/corpus/traces/runaway-alone-no-request-log, runaway-with-short-traffic,
runaway-streaming-after-others, h200-runaway-short-traffic, runaway-closed-loop-3-no-request-log and
runaway-closed-loop-8-no-request-log (a closed loop of short requests beside it, no request log, no
connection counters: only the tokens made against what the finished requests made tell it) (all
replayed at the live
scraper's cadence, histograms every 5 s); quiet on normal-bursts-waiting-queue,
normal-idle-3min, normal-long-generation-max-tokens, normal-long-generation-20k, and on
h200-engine-stall-load (requests stuck 45 s in a frozen engine are no runaway).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vtop.core.engines import flags_of
from vtop.core.rates import histogram_delta, histogram_quantile
from vtop.core.rules.alert import Alert
from vtop.core.rules.context import Evidence, Memory, per_server
from vtop.core.rules.util import LIVE, cap_suggestion, dur, engine_of, hist_count_at_least, num, plural, short_url
from vtop.core.stats import fmean
from vtop.model.requests import METRICS_BOUND, InFlightRequest, age_words, silent_words

if TYPE_CHECKING:
    from vtop.core.rules.state import Sample, ServerState
    from vtop.core.server import ServerView


class Runaway:
    """The runaway rule (see the module's docstring for its evidence and traces)."""

    ids = ("runaway",)

    def check(self, ev: Evidence, mem: Memory) -> list[Alert]:
        return per_server(ev, mem, runaway)


@dataclass(frozen=True, slots=True)
class Finding:
    """What the rule found on one server: decided here, worded by :func:`_alert`."""

    #: ``"quiet"``: nothing finished for ``runaway_s``; ``"age"``: the oldest request is known that old
    path: str
    #: when the condition began (monotonic): the alert's ``since``
    since: float
    #: the request every face names as the oldest (its bounds, its evidence, its max_tokens), if any
    oldest: InFlightRequest | None
    #: decode rate now (tokens/s), over ``rate_window_s``
    rate: float
    #: the span the rate was measured over (s): every face says it with the rate
    rate_window_s: float
    #: quiet: seconds since a request last finished (None on the age path)
    quiet_s: float | None = None
    #: age: how long requests ordinarily take here (p95), if known
    ordinary_s: float | None = None


def runaway(ev: Evidence, mem: Memory, url: str, v: ServerView, st: ServerState) -> Alert | None:
    """Either path (nothing finished for ``runaway_s``, or the oldest request known to be old),
    read from the one answer of the server's requests in flight (``mem.in_flight``)."""
    s = st.last
    if s is None or v.state not in LIVE or not s.running or s.running < 1:
        return None
    f = _quiet(ev, mem, url, st, s) or _by_age(mem, url, st, s)
    return _alert(ev, mem, url, v, st, s, f) if f is not None else None


def _oldest(mem: Memory, url: str) -> InFlightRequest | None:
    """The oldest request in flight whose answer has not gone silent (a runaway decodes; a silent answer
    is no sign of that: a frozen engine, or a client that stopped reading): the answer's ``answering``,
    which is its ``oldest`` wherever no older answer is silent."""
    answer = mem.in_flight.get(url)
    return answer.answering if answer is not None else None


def _silent_older(mem: Memory, url: str) -> InFlightRequest | None:
    """The oldest request in flight, where its answer went silent and the rule reads a younger one."""
    answer = mem.in_flight.get(url)
    if answer is None or answer.oldest is None or answer.oldest is answer.answering:
        return None
    return answer.oldest if answer.oldest.answer_silent_s is not None else None


def _rate(st: ServerState, s: Sample, rising_s: float, *, fallback: bool = False) -> tuple[float, float] | None:
    """(tokens/s, the span it was measured over) over the last ``rising_s``; None when they did not
    rise (a stall, not a runaway)."""
    r = st.at(s.t - rising_s)
    if fallback and r is s and len(st.samples) > 1:
        r = st.samples[0]
    if r is None or r is s or r.gen is None or s.gen is None or not s.gen > r.gen or r.t >= s.t:
        return None
    return (s.gen - r.gen) / (s.t - r.t), s.t - r.t


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


def _flat_s(st: ServerState, since: float, now: float) -> float:
    """Seconds of ``[since, now]`` the generation counter stood still between two samples
    (a frozen engine: its requests grow old without decoding): :meth:`ServerState.flat_s`."""
    return st.flat_s(since, now)


def _flat_s_scan(st: ServerState, since: float, now: float) -> float:
    """:func:`_flat_s` by a pass over the samples (the tests' reference)."""
    out = 0.0
    prev = None
    for x in st.samples[max(0, bisect_right(st.times, since) - 1):]:
        if x.t > now:
            break
        if prev is not None and prev.gen is not None and x.gen is not None and x.gen <= prev.gen:
            out += x.t - max(prev.t, since)
        prev = x
    return out


def _by_age(mem: Memory, url: str, st: ServerState, s: Sample) -> Finding | None:
    """The oldest request in flight (the one answer: the request log with the max_tokens histogram,
    a connection, or /metrics alone) has run ``runaway_age_s``, or ``runaway_age_ordinary_x`` times
    what requests ordinarily take here, while tokens flow; time the engine stood still does not count."""
    th = mem.th
    oldest = _oldest(mem, url)
    if oldest is None or oldest.age_min_s is None or oldest.since is None:
        return None
    age = oldest.age_min_s
    ordinary = _ordinary_e2e_s(st)
    # --runaway-threshold below 45 s lowers this too: a flag works the same on both paths
    limit = max(min(th.runaway_age_s, th.runaway_s), th.runaway_age_ordinary_x * ordinary if ordinary else 0.0)
    if ordinary is None and not _stands_out(mem, url, oldest):
        # many requests running and too few finished to know what is ordinary here: a batch of long answers
        # looks the same as many runaways, so the oldest is named only at the quiet path's bound, ``runaway_s``
        # (the real H100 recording of 32 streams of 8,192 tokens at 32-100 tok/s each: all 46 s old, none done)
        limit = max(limit, th.runaway_s)
    if age < limit or age - _flat_s(st, oldest.since, s.t) < limit:
        return None  # not that old, or it waited on a frozen engine (the stall rule's)
    rw = _rate(st, s, th.rising_s)
    if rw is None:
        return None  # no tokens flowing: a stall, not a runaway (the stall rule's)
    return Finding("age", oldest.since, oldest, rw[0], rw[1], ordinary_s=ordinary)


#: requests in flight this close in age to the oldest are its peers: one batch, sent together
PEER_AGE_S = 10.0


def _stands_out(mem: Memory, url: str, oldest: InFlightRequest) -> bool:
    """The oldest request is one apart, with nothing finished to compare it with: the request log says its
    client sent no max_tokens, or no other request still answering came within ``PEER_AGE_S`` of it (a
    batch of answers of one age is as much a batch of long answers as of runaways)."""
    if oldest.client_set_max_tokens is False:
        return True
    if oldest.age_min_s is None:
        return True
    answer = mem.in_flight.get(url)
    others = answer.requests if answer is not None else ()
    return not any(r is not oldest and r.answer_silent_s is None and r.age_min_s is not None
                   and r.age_min_s >= oldest.age_min_s - PEER_AGE_S for r in others)


def _quiet(ev: Evidence, mem: Memory, url: str, st: ServerState, s: Sample) -> Finding | None:
    """Requests running, tokens rising, and none finished for ``runaway_s`` while ``waiting`` is zero
    or growing; with a short history, the request log names a request sent without ``max_tokens``
    that came that long ago, and nothing finished in what vtop saw."""
    if st.last_finish_t is None or st.busy_since is None:
        return None
    since = _quiet_since(ev, mem, url, st)
    if since is None:
        return None
    a = st.at(since)
    rw = _rate(st, s, mem.th.rising_s, fallback=True)
    if a is None or a.gen is None or rw is None:
        return None
    w_now, w_then = s.waiting or 0.0, a.waiting or 0.0
    if not (w_now == 0 or w_now >= w_then):
        return None
    return Finding("quiet", since, _oldest(mem, url), rw[0], rw[1], quiet_s=ev.now - since)


def _quiet_since(ev: Evidence, mem: Memory, url: str, st: ServerState) -> float | None:
    """Since when requests have run without one finishing (idle time does not count), or None."""
    assert st.last_finish_t is not None and st.busy_since is not None
    since = max(st.last_finish_t, st.busy_since)
    if ev.now - since >= mem.th.runaway_s:
        return since
    # The metrics history is too short (vtop doctor's 15 s window, or vtop just started): the
    # request log can still say how long a request the client sent without max_tokens has been
    # open, while nothing finished in what vtop saw.
    answer = mem.in_flight.get(url)
    flagged = [r.age_max_s for r in (answer.logged if answer is not None else ())
               if r.no_client_max_tokens and r.age_max_s is not None]
    if not flagged or max(flagged) < mem.th.runaway_s or st.last_finish_t > st.busy_since:
        return None
    return min(since, ev.now - max(flagged))


# ------------------------------------------------------------------ wording


def _alert(ev: Evidence, mem: Memory, url: str, v: ServerView, st: ServerState, s: Sample, f: Finding) -> Alert:
    """The alert a finding makes: its title, evidence and fixes, in one place for both paths."""
    short = short_url(url)
    o = f.oldest
    legit = f.path == "age" and o is not None and o.client_set_max_tokens is True
    silent = _silent_older(mem, url)
    lines = _request_lines(o, engine_of(ev, url), silent is not None)
    lines += _quiet_lines(ev, st, s, f) if f.path == "quiet" else _age_lines(s, f)
    if silent is not None:
        lines.append(_silent_line(silent))
    word = flags_of(engine_of(ev, url))["len_word"]
    lines += _mml_lines(v.max_model_len, f.rate, s.running, shared=f.path == "age" and _finished_within(st, s, f),
                        word=word)
    if f.path == "quiet":
        lines += _finished_max_tokens_lines(mem, st, s, v.max_model_len, word)
        lines += [gl + " (supporting only: one decode stream keeps a big GPU far from 100 %)"
                  for gl in (mem.gpu_line(i, f.since, ev.now) for i in mem.gpus_of(ev, url)) if gl]
    if legit:
        assert o is not None and o.age_min_s is not None
        return Alert("runaway", "info", f"Long request on {short}: running {age_words(o)} (its client set max_tokens)",
                     tuple(lines), ("It has a cap: it ends by itself. If it should not take this long, lower "
                                    "max_tokens in the client.",), url, f.since)
    client = o.client if o is not None and f.path == "age" else None
    fix = _runaway_fixes(v.max_model_len, ev.request_logging_of(url) is False, client, engine_of(ev, url))
    sev = "critical" if (s.waiting or 0.0) > 0 else "warning"
    return Alert("runaway", sev, _title(short, s, f, silent is not None), tuple(lines), tuple(fix), url, f.since)


def _silent_line(r: InFlightRequest) -> str:
    """The older request the rule set aside, in the words every face names it with."""
    return (f"older, set aside: {r.name} in flight {age_words(r)}, {silent_words(r.answer_silent_s)} (a silent "
            "answer is no sign of decoding: a frozen engine, or a client that stopped reading)")


def _title(short: str, s: Sample, f: Finding, silent_older: bool = False) -> str:
    o = f.oldest
    w = f"{f.rate_window_s:.0f} s"
    n = s.running or 0.0
    if f.path == "age":
        assert o is not None
        tail = f" (client {o.client})" if o.client else ", while other requests finish" \
            if o.evidence[0] == METRICS_BOUND else ""
        word = "in flight" if o.answer_pending else "running"
        # the rate is the server's, the other requests' tokens in it: said so, or it reads as this request's
        return (f"Runaway decode on {short}: a request {word} {age_words(o)}, the server at {f.rate:,.0f} tok/s "
                f"over {w}{tail}")
    if o is not None and o.age_min_s is not None:
        oldest = "the oldest still answering" if silent_older else "the oldest"
        return (f"Runaway decode on {short}: {plural(n, 'request')} running, {oldest} {age_words(o)}, "
                f"{f.rate:,.0f} tok/s over {w}, nothing finished for {dur(f.quiet_s or 0.0)}")
    return (f"Runaway decode on {short}: {plural(n, 'request')} running, {f.rate:,.0f} tok/s over {w}, "
            f"nothing finished for {dur(f.quiet_s or 0.0)}")


def _request_lines(o: InFlightRequest | None, engine: str | None = None, silent_older: bool = False) -> list[str]:
    """Who the oldest request is (``silent_older``: the oldest still answering, an older one's answer
    silent): its id or client, whether its client set max_tokens, its age. Where the engine filled a cap
    in, its value; where the log says the client set none and shows no value filled in
    (:attr:`vtop.core.requests.events.RequestEvent.max_tokens_omitted`), the engine's words for how far it
    may run (:data:`vtop.core.engines.ENGINE_FLAGS`)."""
    if o is None or (o.request_id is None and o.client is None):
        return []
    if o.no_client_max_tokens:
        fl = flags_of(engine)
        cap = (f"{fl['name']} filled in {num(o.max_tokens)}" if o.max_tokens is not None else
               f"{fl['name']} lets it run to the context length ({fl['len']}) less its prompt")
        return [f"request {o.name}: the client sent no max_tokens, {cap}; running {age_words(o, upper=True)}"]
    if o.max_tokens is not None:
        which = "oldest request still answering" if silent_older else "oldest in-flight request"
        return [f"{which} {o.name}: max_tokens {num(o.max_tokens)} set by the client, running "
                f"{age_words(o, upper=True)}"]
    return []


def _age_lines(s: Sample, f: Finding) -> list[str]:
    o = f.oldest
    ev = [o.detail] if o is not None and o.detail else []
    ev.append(f"{plural(s.running or 0.0, 'request')} running now, waiting {num(s.waiting or 0.0)}; decoding "
              f"{f.rate:,.0f} tok/s over the last {f.rate_window_s:.0f} s")
    if f.ordinary_s is not None:
        ev.append(f"requests that finished here took {dur(f.ordinary_s)} or less (p95)")
    return ev


def _quiet_lines(ev: Evidence, st: ServerState, s: Sample, f: Finding) -> list[str]:
    a = st.at(f.since)
    base = st.at(st.idle_before) if st.busy_known and st.idle_before is not None \
        and st.last_finish_t is not None and st.idle_before >= st.last_finish_t else a
    made = (s.gen or 0.0) - (base.gen if base is not None and base.gen is not None else (a.gen if a else 0.0) or 0.0)
    out = [f"{plural(s.running or 0.0, 'request')} running, none finished for {dur(f.quiet_s or 0.0)}; "
           f"waiting {num(s.waiting or 0.0)}"]
    out += _busy_lines(ev, st, s)  # (the oldest's own evidence is the age path's first line)
    out.append(f"decoding {f.rate:,.0f} tok/s over the last {f.rate_window_s:.0f} s; {num(made)} tokens generated since these requests started")
    if a is not None and s.kv is not None and a.kv is not None and s.kv > a.kv:
        out.append(f"KV cache {a.kv:.2f} % -> {s.kv:.2f} % and climbing (the sequences keep growing)")
    return out


def _busy_lines(ev: Evidence, st: ServerState, s: Sample) -> list[str]:
    """Since when requests have run: fewer of those running when the stretch began have finished
    than there were."""
    if st.busy_since is None:
        return []
    finished = max((s.done or 0.0) - st.busy_done0, st.busy_drops)
    if finished >= st.busy_n0:
        return []
    est = ev.now - st.busy_since
    if st.busy_known:
        return [f"running went 0 -> {num(st.busy_n0)} {dur(est)} ago and never back to 0, with {num(finished)} of "
                f"those finished since: the oldest has run at least {dur(est)}"]
    return [f"running > 0 since vtop started watching, {dur(est)} ago: the oldest has run at least {dur(est)}"]


def _finished_within(st: ServerState, s: Sample, f: Finding) -> bool:
    """Requests finished over the rate's window: their tokens count in it."""
    a = st.at(s.t - f.rate_window_s)
    return a is not None and a is not s and s.done is not None and a.done is not None and s.done > a.done


def _mml_lines(mml: int | None, rate: float, n: float | None, *, shared: bool = False,
               word: str = "max_model_len") -> list[str]:
    """How far a request without max_tokens may run. ``shared``: the rate counts the tokens of requests that
    finished around the long one (the age path), so it is not the long one's: no time is worked out from it.
    On the real run of two servers on one H100 (tests/fixtures/h100-two-servers) the runaway shared its
    server with short requests: 1,039 tok/s over 1 running gave "up to 32s" for a request 46 s old."""
    if not mml:
        return []
    per_req = rate / n if n else rate
    line = f"{word} {num(mml)}: a chat request without max_tokens may generate up to {num(mml)} - prompt tokens"
    if shared:
        line += (f"; {rate:,.0f} tok/s is the server's whole rate, with the requests that finish around it, not "
                 "this request's own")
    elif per_req > 0:
        line += f"; at {per_req:,.0f} tok/s per request that is up to {dur(mml / per_req)}"
    return [line]


def _finished_max_tokens_lines(mem: Memory, st: ServerState, s: Sample, mml: int | None,
                               word: str = "max_model_len") -> list[str]:
    """The resolved max_tokens of the requests that finished over the history: values near
    max_model_len betray clients that omit it (the metric records the resolved value)."""
    old = next((x for x in st.samples if x.max_tokens is not None), None)
    if not mml or old is None or old.max_tokens is None or s.max_tokens is None or old is s:
        return []
    d = histogram_delta(old.max_tokens, s.max_tokens)
    cnt, edge = hist_count_at_least(d, mem.th.runaway_near_len_frac * mml)
    if cnt <= 0 or d is None:
        return []
    exact = f" (max_tokens {num(d.sum)})" if d.count == 1 and d.sum is not None else ""
    line = (f"{plural(cnt, 'request')} finished in the last {dur(s.hist_t - old.hist_t)} with max_tokens above "
            f"{num(edge)}{exact}, near {word} {num(mml)}: clients omitting max_tokens")
    if s.length is not None and old.length is not None and s.length > old.length:
        line += f"; {num(s.length - old.length)} finished with reason 'length'"
    return [line]


def _runaway_fixes(mml: int | None, no_request_log: bool, client: str | None = None,
                   engine: str | None = None) -> list[str]:
    fl = flags_of(engine)
    fix = [
        "Set max_tokens (or max_completion_tokens) in every client request; chat requests without it may run "
        f"to {fl['len_word']}{f' ({num(mml)})' if mml else ''}.",
    ]
    if fl["gen_cap"]:
        fix.append(f"Cap it on the server: restart {fl['name']} with "
                   + fl["gen_cap"].replace("{n}", str(cap_suggestion(mml))) + " (there is no --max-tokens serve flag).")
    else:
        fix.append(f"{fl['name']} has no server-side cap on generated tokens: the clients must set it.")
    fix.append(f"To stop it now, cancel the client request: {fl['name']} aborts a request when its client "
               "disconnects.")
    if client:
        port = client.rsplit(":", 1)[-1]
        fix.append(f"The client is {client}: on its host, ss -tnp 'sport = :{port}' names its process "
                   "(killing that connection also aborts the request).")
    if no_request_log:
        fix.append(f"Start {fl['name']} with {fl['log_requests']} to let vtop name the request.")
    return fix

# ------------------------------------------------------------------ rule 2: engine stall
