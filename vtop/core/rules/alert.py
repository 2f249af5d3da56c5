"""What a rule answers (:class:`Alert`), the numbers it compares against (:class:`Thresholds`),
and the stable ids (:data:`RULES`) and severities. Plain types: no state, no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SEVERITIES = ("critical", "warning", "info")
RANK = {s: i for i, s in enumerate(SEVERITIES)}

RULES = (
    "runaway",
    "engine_stall",
    "startup_stall",
    "startup_failure",
    "engine_died",
    "oom_startup",
    "oom_transient",
    "oom_steady",
    "oom_risk",
    "kv_saturation",
    "sm_idle",
    "risky_flags",
    "api_unresponsive",
    "spec_decode_low",
    "queue_wedge",
    "gpu_neighbour",
    "gpu_slowdown",
)


@dataclass(frozen=True, slots=True)
class Alert:
    """One diagnosis: a name, how bad, the numbers behind it, and what to do."""

    #: stable id, one of :data:`RULES`
    rule: str
    #: "info" | "warning" | "critical"
    severity: str
    #: one line, e.g. "Runaway decode on :8000: 1 request running 2m 05s, 460 tok/s, nothing finished"
    title: str
    #: lines with numbers
    evidence: tuple[str, ...] = ()
    #: what to do, with exact flags
    fix: tuple[str, ...] = ()
    #: server URL, "gpu0", or None (a start not tied to a known server)
    target: str | None = None
    #: monotonic time the condition began
    since: float | None = None

    @property
    def key(self) -> tuple[str, str | None]:
        return (self.rule, self.target)

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "severity": self.severity,
            "title": self.title,
            "evidence": list(self.evidence),
            "fix": list(self.fix),
            "target": self.target,
            "since": self.since,
        }


@dataclass(frozen=True, slots=True)
class Pending:
    """A rule's condition that holds now but has not yet held for its threshold: what a short window
    (``doctor --window 15``) says instead of "no alerts" when it ends inside an incident."""

    #: the rule that will name it, one of :data:`RULES`
    rule: str
    #: server URL, or None
    target: str | None
    #: monotonic time the condition began (as far back as the evidence dates it)
    since: float
    #: how long it must hold before the rule names it
    threshold_s: float
    #: what holds, in words ("running 3, waiting 0, no new token and no request finished")
    condition: str
    #: what is named when it holds that long ("an engine stall")
    names: str
    #: lines with numbers, and which source dated the condition
    evidence: tuple[str, ...] = ()
    #: when vtop first saw what the condition reads (its first sample of the server, its first process
    #: scan): a condition since then held over all vtop saw, however late that came in a window
    seen_from: float | None = None

    def held_s(self, now: float) -> float:
        return max(0.0, now - self.since)

    def to_json(self, now: float) -> dict[str, Any]:
        return {"rule": self.rule, "target": self.target, "since": self.since, "held_s": round(self.held_s(now), 1),
                "threshold_s": self.threshold_s, "condition": self.condition, "names": self.names,
                "evidence": list(self.evidence)}


@dataclass(frozen=True)
class Thresholds:
    """Every number the rules compare against. Seconds unless named ``_pct`` (0-100) or ``_ps`` (per second)."""

    #: runaway: no request finished for this long while requests run and tokens flow
    runaway_s: float = 120.0
    #: api_unresponsive: accepted scrapes without a complete answer for this long (a warning; two
    #: of the scraper's 3 s deadlines), and for this long (critical)
    api_silent_s: float = 6.0
    api_silent_critical_s: float = 30.0
    #: runaway: the oldest in-flight request known (from /metrics alone, vtop/core/requests/metrics_bound.py) to have
    #: run this long, while other requests finish around it; raised to ``runaway_age_ordinary_x`` times
    #: what requests ordinarily take on this server (the p95 of those that finished)
    runaway_age_s: float = 45.0
    runaway_age_ordinary_x: float = 3.0
    #: runaway: a resolved max_tokens at or above this share of max_model_len means the client omitted it
    runaway_near_len_frac: float = 0.5
    #: runaway: generation must have grown within this many seconds ("tokens rising")
    rising_s: float = 10.0
    #: engine stall: running > 0 with the token and finish counters flat this long
    engine_stall_s: float = 20.0
    #: KV saturation: usage at or above this percentage ...
    kv_saturation_pct: float = 95.0
    #: ... for at least this long
    kv_saturation_s: float = 15.0
    #: ... or, over the last ``kv_window_s``, at or above it this share of the time with the median within
    #: 5 points of it (usage dips for a scrape as requests finish and are preempted, then climbs back)
    kv_window_s: float = 30.0
    kv_window_frac: float = 0.6
    #: ... or, before vtop's first sample, the log's stats lines showing it full with requests waiting in bursts
    #: this long before now, with the preemption counter above 0 (``doctor --window 15`` between two bursts)
    kv_burst_lookback_s: float = 180.0
    #: preemptions and queue growth are judged over this window
    preempt_window_s: float = 60.0
    #: preemptions per second that make a KV saturation critical (a preemption storm)
    preempt_storm_ps: float = 1.0
    #: sm_idle: GPU-Util at or above this percentage ...
    sm_idle_util: float = 90.0
    #: ... while GPM SM activity stays below this percentage ...
    sm_idle_active: float = 15.0
    #: ... for this long
    sm_idle_s: float = 120.0
    #: gpu_neighbour: another process's mean share of the SMs' time (NVML per-process samples) ...
    neighbour_sm_pct: float = 15.0
    #: ... (gpu_slowdown: a slowdown clock-event reason on) for this long ...
    neighbour_s: float = 20.0
    #: ... while vLLM's tokens per running request fell by this percentage against ...
    neighbour_drop_pct: float = 25.0
    #: ... this window before it began
    neighbour_baseline_s: float = 60.0
    #: OOM: what happened this long before an OOM counts as its trigger (memory spike, long prompt, full KV)
    transient_window_s: float = 30.0
    #: OOM: GPU memory this many points above the level before the window counts as a spike
    mem_spike_pct: float = 3.0
    #: OOM: a prompt of at least this share of max_model_len counts as long
    long_prompt_frac: float = 0.25
    #: OOM: a server up this long with no other trigger points at allocator fragmentation
    fragmentation_uptime_s: float = 6 * 3600.0
    #: OOM: how long an OOM line seen in the log stays an alert (a failed start stays while it is failed)
    oom_hold_s: float = 600.0
    #: pre-OOM: GPU memory at or above this percentage ...
    oom_risk_pct: float = 95.0
    #: ... having climbed at least this many points ...
    oom_risk_rise_pct: float = 2.0
    #: ... steadily over this window
    oom_risk_window_s: float = 300.0
    #: risky flags: a max_model_len this long without a generation cap is flagged
    long_context_len: int = 16384
    #: risky flags: --max-num-seqs this many times the logged maximum concurrency is flagged
    risky_seqs_ratio: float = 8.0
    #: startup stall, a phase that prints progress (shards N/M, CUDA graphs N/M): no step for this many
    #: times its longest step so far ...
    startup_progress_x: float = 4.0
    #: ... and at least this long (named within 90 s of the last progress while steps take 15 s or less)
    startup_progress_floor_s: float = 60.0
    #: startup stall, a silent phase (torch.compile, profiling, process start): the log silent and the
    #: server's processes still (and the GPU idle, where known) for this long
    startup_still_s: float = 45.0
    #: ... "still": less CPU time than this share of one core over that window
    startup_still_cpu_frac: float = 0.01
    #: ... a doctor (or screen) that attached during the silence judges the processes over what it
    #: watched, when that is at least this long (the log's silence, read from its stamps, is the
    #: whole ``startup_still_s`` already): a busy compile uses a core every second
    startup_still_min_span_s: float = 10.0
    #: a start's working processes, or an engine process, stopped by a signal (state T) at every process
    #: scan for this long are stopped for good (until a SIGCONT): the stall is named without the still
    #: threshold (two scans 5 s apart; a py-spy dump stops a process for milliseconds)
    stopped_min_span_s: float = 5.0
    #: ... "GPU idle": mean GPU-Util below this percentage over that window
    startup_still_gpu_util: float = 5.0
    #: a start vtop has no log of (vtop/core/rules/stillness.py): starting this long from its process's
    #: start is said, busy or not (``--stall-threshold``, the log's ceiling)
    startup_ceiling_s: float = 600.0
    #: a silent phase of a start with history (vtop/core/start_history.py): silent for this many times the
    #: longest it took in this model's last starts here (the issue's "20 s the last three times is suspect
    #: at a few times that") ...
    startup_history_x: float = 5.0
    #: ... and at least this long (a phase of a few seconds is not suspect after 15 s)
    startup_history_floor_s: float = 60.0
    #: startup stall in downloading: a Hub download with a file in flight and no byte more for this long
    download_stall_s: float = 60.0
    #: spec_decode_low: draft-token acceptance below this percentage ...
    spec_low_acceptance_pct: float = 5.0
    #: ... for this long (minutes: a short dip is normal when the traffic changes) ...
    spec_low_s: float = 180.0
    #: ... judged only on windows with at least this many draft tokens proposed
    spec_min_draft_tokens: float = 100.0
    #: alert hysteresis: a severity falls (or an alert clears) only after the rules said lower for this
    #: long in a row (vtop/core/rules/hold.py); it rises at once
    alert_hold_s: float = 10.0
    #: ... and an alert the rules stop raising clears at once, but one of the same rule and target back within
    #: this long is the same incident (its start, its severity): a scrape or two under a line
    alert_clear_hold_s: float = 10.0
    #: queue_wedge: running 0, requests waiting and the counters flat for this long
    queue_wedge_s: float = 30.0
    #: how much per-server / per-GPU history the diagnoser keeps
    history_s: float = 900.0
