"""Plain data that the GPU source hands to the rest of vtop.

Every field that NVML could not give is ``None``: a GPU that does not report
its temperature must not look like one at 0 degrees, and a lost GPU must not
look idle.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# Clock-event ("throttle") reason bits, as in nvml.h. Kept here rather than read
# from pynvml so that decoding works (and is tested) without the library.
THROTTLE_BITS: tuple[tuple[int, str], ...] = (
    (0x0000000000000001, "idle"),
    (0x0000000000000002, "app-clocks"),
    (0x0000000000000004, "sw-power-cap"),
    (0x0000000000000008, "hw-slowdown"),
    (0x0000000000000010, "sync-boost"),
    (0x0000000000000020, "sw-thermal"),
    (0x0000000000000040, "hw-thermal"),
    (0x0000000000000080, "hw-power-brake"),
    (0x0000000000000100, "display-clocks"),
)

#: The clock-event reasons that slow the GPU below what its load asks for (a power cap, heat, an
#: external power brake), as opposed to idle, application clocks or sync boost.
SLOWDOWN_REASONS = frozenset({"sw-power-cap", "hw-slowdown", "sw-thermal", "hw-thermal", "hw-power-brake"})


def decode_throttle(mask: int | None) -> tuple[str, ...] | None:
    """Turn a clock-event bit mask into short names; ``None`` stays ``None``."""
    if mask is None:
        return None
    return tuple(name for bit, name in THROTTLE_BITS if mask & bit)


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A compute process on a GPU. ``pid`` is a host PID (NVML's view)."""

    pid: int
    used_bytes: int | None
    sm_util: float | None = None
    """Share of time (%) this process's kernels ran on the GPU's SMs since the read before, from
    NVML's per-process samples (``nvmlDeviceGetProcessUtilization``); 0.0 when the read succeeded and
    held no sample of it (no kernel of it ran); None when the driver gives no per-process samples.
    Read every slow tick (4 s) while two or more processes share the GPU, every 30 s while one is alone
    on it (the call costs 1.6 ms of CPU: :meth:`vtop.sources.nvml.NvmlSource._proc_sm_when_due`)."""


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU at one tick. Percentages are 0-100."""

    index: int
    name: str
    uuid: str | None = None
    lost: bool = False
    util_gpu: float | None = None
    """Share of time a kernel was running (``utilization.gpu``); not how busy the SMs are."""
    util_mem: float | None = None
    """Share of time the memory controller was busy (``utilization.memory``)."""
    mem_used: int | None = None
    mem_total: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    temp_c: float | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    throttle: tuple[str, ...] | None = None
    procs: tuple[GpuProcess, ...] | None = None
    sm_active: float | None = None
    """GPM SM activity over the tick (Hopper+): how busy the SMs really are."""
    sm_occupancy: float | None = None
    dram_bw: float | None = None
    """GPM DRAM bandwidth utilisation over the tick."""
    error: str | None = None
    ecc_corrected: int | None = None
    """Corrected ECC errors since the driver loaded (volatile count); None: no ECC or not read yet."""
    ecc_uncorrected: int | None = None
    """Uncorrected (double-bit) ECC errors since the driver loaded (volatile count)."""
    rows_remapped: int | None = None
    """Rows remapped for uncorrectable errors (Ampere and later; NVML's remapped rows, uncorrectable)."""
    rows_remapped_corr: int | None = None
    """Rows remapped for correctable errors."""
    remap_pending: bool | None = None
    """A row remap waits for a GPU reset (until then the bad row stays in use)."""
    remap_failed: bool | None = None
    """A row remap failed: the GPU needs service."""
    retired_pages: int | None = None
    """Pages retired for ECC errors (pre-Ampere page retirement, both causes)."""
    pcie_tx_kbs: float | None = None
    """PCIe transmit throughput, KB/s (NVML's 20 ms counter; read rarely, off the tick)."""
    pcie_rx_kbs: float | None = None

    @property
    def power_pct(self) -> float | None:
        """Power draw as a share of the enforced limit, 0-100 (None without either)."""
        if self.power_w is None or not self.power_limit_w:
            return None
        return 100.0 * self.power_w / self.power_limit_w

    @property
    def mem_pct(self) -> float | None:
        if self.mem_used is None or not self.mem_total:
            return None
        return 100.0 * self.mem_used / self.mem_total

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        for k in _FAULT_FIELDS:  # absent unless read: recordings of GPUs without them stay as they were
            if d[k] is None:
                del d[k]
        if self.procs is not None:  # [pid, bytes] or [pid, bytes, sm %]: older recordings stay as they were
            d["procs"] = [[p.pid, p.used_bytes] if p.sm_util is None else [p.pid, p.used_bytes, p.sm_util]
                          for p in self.procs]
        if self.throttle is not None:
            d["throttle"] = list(self.throttle)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> GpuSample:
        d = dict(d)
        procs = d.get("procs")
        if procs is not None:
            d["procs"] = tuple(GpuProcess(int(p[0]), None if p[1] is None else int(p[1]),
                                          float(p[2]) if len(p) > 2 and p[2] is not None else None) for p in procs)
        thr = d.get("throttle")
        if thr is not None:
            d["throttle"] = tuple(thr)
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in known})


_FAULT_FIELDS = (
    "ecc_corrected", "ecc_uncorrected", "rows_remapped", "rows_remapped_corr", "remap_pending", "remap_failed",
    "retired_pages", "pcie_tx_kbs", "pcie_rx_kbs",
)

#: What common XID numbers mean, from NVIDIA's public XID documentation, in short (our words).
#: An XID is the driver's report of a GPU error (the kernel log's "NVRM: Xid (PCI:...): N, ...").
XID_MEANINGS: dict[int, str] = {
    13: "graphics engine exception (a kernel fault: bad address, illegal instruction, or a hardware fault)",
    31: "GPU memory page fault (a kernel touched memory it does not own: usually an application bug)",
    43: "GPU stopped processing (the context was reset after an application fault)",
    45: "preemptive cleanup (a context was torn down, e.g. its process was killed or crashed)",
    48: "double-bit ECC error (uncorrectable memory error: the GPU needs a reset)",
    61: "internal microcontroller breakpoint/warning (firmware error: reset the GPU)",
    62: "internal microcontroller halt (firmware error: reset the GPU)",
    63: "ECC page retirement or row remap recorded (memory cell failing; reset to apply)",
    64: "ECC page retirement or row remap failed (the GPU needs service)",
    74: "NVLink error (a link between GPUs failed or flapped)",
    79: "GPU has fallen off the bus (it no longer answers on PCIe: a hardware, power or thermal event)",
    92: "high single-bit ECC error rate (memory degrading)",
    94: "contained ECC error (uncorrectable error confined to one application: restart it)",
    95: "uncontained ECC error (uncorrectable error that may affect every process: reset the GPU)",
    119: "GSP firmware RPC timeout (the GPU's system processor did not answer: reset the GPU)",
    120: "GSP firmware error (the GPU's system processor faulted: reset the GPU)",
}


def xid_text(xid: int) -> str:
    """``XID 79 (GPU has fallen off the bus ...)``; an unlisted number says so."""
    meaning = XID_MEANINGS.get(int(xid))
    return f"XID {int(xid)} ({meaning})" if meaning else f"XID {int(xid)} (see NVIDIA's XID catalogue)"


@dataclass(frozen=True, slots=True)
class XidEvent:
    """One XID critical-error event from NVML's event set, as the poll that drained it saw it."""

    gpu: int | None
    """GPU index (None: NVML named a device vtop could not map)."""
    xid: int
    t: float
    """Wall-clock time of the poll that drained it (NVML's event carries no timestamp)."""
    mono: float

    def to_json(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "xid": self.xid, "t": self.t, "mono": self.mono}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> XidEvent:
        gpu = d.get("gpu")
        return cls(None if gpu is None else int(gpu), int(d["xid"]), float(d["t"]), float(d.get("mono", d["t"])))


# Source states, shown on screen as they are.
OK = "ok"
ABSENT = "absent"  # no NVML / no driver / no GPU on this host
ERROR = "error"  # NVML answered with an error for the whole poll
OFF = "off"  # --no-gpu


@dataclass(frozen=True, slots=True)
class GpuPoll:
    """The result of one poll of every GPU."""

    t: float
    """Wall-clock time of the sample (Unix seconds)."""
    mono: float
    status: str
    message: str | None = None
    gpus: tuple[GpuSample, ...] = ()
    driver: str | None = None
    nvml_version: str | None = None
    duration_s: float | None = None
    """How long the poll took (for the overhead panel and the benchmarks)."""
    notes: tuple[str, ...] = field(default=())
    """One-time remarks, e.g. a function this driver lacks."""
    xids: tuple[XidEvent, ...] = field(default=())
    """XID critical-error events drained from NVML's event set at this poll."""

    def to_json(self) -> dict[str, Any]:
        return {
            "t": self.t,
            "mono": self.mono,
            "status": self.status,
            "message": self.message,
            "driver": self.driver,
            "nvml_version": self.nvml_version,
            "duration_s": self.duration_s,
            "notes": list(self.notes),
            "gpus": [g.to_json() for g in self.gpus],
            **({"xids": [x.to_json() for x in self.xids]} if self.xids else {}),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> GpuPoll:
        return cls(
            t=float(d["t"]),
            mono=float(d.get("mono", d["t"])),
            status=str(d.get("status", OK)),
            message=d.get("message"),
            gpus=tuple(GpuSample.from_json(g) for g in d.get("gpus", ())),
            driver=d.get("driver"),
            nvml_version=d.get("nvml_version"),
            duration_s=d.get("duration_s"),
            notes=tuple(d.get("notes") or ()),
            xids=tuple(XidEvent.from_json(x) for x in d.get("xids") or ()),
        )
