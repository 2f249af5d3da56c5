"""A stand-in for the ``pynvml`` module: scripted GPUs for tests, benchmarks and ``--simulate-gpus``.

It raises the *real* ``pynvml`` exception classes (importing ``pynvml`` needs no
driver), so :class:`vtop.sources.nvml.NvmlSource` is exercised exactly as with
NVIDIA's binding. Each call can cost CPU like the real one (:data:`H200_CALL_S`,
3-182 us a call, ~0.39 ms a GPU a tick), so the benchmarks measure vtop's
overhead under real call costs. Those are CPU times of calls made a second
apart, as vtop makes them; the recorded H200 probe's 2-9 us (h200-probe.json,
``us_per_call``) are wall times of the same call repeated in a tight loop,
which the driver answers from a short-lived cache.
"""

from __future__ import annotations

import functools
import hashlib
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

# nvidia-ml-py has no py.typed and no stubs package: only its exception classes and codes are used.
import pynvml as _real

NVMLError = _real.NVMLError
NVMLError_NotSupported = _real.NVMLError_NotSupported
NVMLError_GpuIsLost = _real.NVMLError_GpuIsLost
NVMLError_LibraryNotFound = _real.NVMLError_LibraryNotFound
NVMLError_DriverNotLoaded = _real.NVMLError_DriverNotLoaded
NVMLError_FunctionNotFound = _real.NVMLError_FunctionNotFound
NVMLError_NoPermission = _real.NVMLError_NoPermission
NVMLError_Unknown = _real.NVMLError_Unknown
NVMLError_Timeout = _real.NVMLError_Timeout
NVMLError_NotFound = _real.NVMLError_NotFound

NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_GPM_METRIC_SM_UTIL = 2
NVML_GPM_METRIC_SM_OCCUPANCY = 3
NVML_GPM_METRIC_DRAM_BW_UTIL = 10
NVML_GPM_METRICS_GET_VERSION = 1
NVML_VOLATILE_ECC = 0
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
nvmlEventTypeXidCriticalError = 0x8


@dataclass
class FakeGpu:
    """One simulated GPU. ``script`` may override any reading with a value or an exception."""

    name: str = "NVIDIA H200"
    mem_total: int = 150_754_820_096
    power_limit_mw: int = 700_000
    gpm: bool = True
    lost: bool = False
    overrides: dict[str, Any] = field(default_factory=dict)
    phase: float = 0.0

    def reading(self, key: str, default: Callable[[], Any]) -> Any:
        if self.lost:
            raise NVMLError_GpuIsLost(_real.NVML_ERROR_GPU_IS_LOST)
        v = self.overrides.get(key, _MISSING)
        if v is _MISSING:
            return default()
        if isinstance(v, BaseException) or (isinstance(v, type) and issubclass(v, BaseException)):
            raise v if isinstance(v, BaseException) else v()
        if callable(v):
            return v()
        return v


_MISSING = object()


class FakeNvml:
    """Module-like object: ``NvmlSource(nvml=FakeNvml(...))``."""

    SIMULATED = True
    """Its processes' pids are made up (4000 + index): :attr:`NvmlSource.simulated`."""

    def __init__(
        self,
        gpus: list[FakeGpu] | None = None,
        *,
        init_error: BaseException | None = None,
        call_cost_s: float | dict[str, float] = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.gpus = gpus if gpus is not None else [FakeGpu()]
        self.init_error = init_error
        self.call_cost_s = call_cost_s
        self.clock = clock
        self.calls = 0
        self.inited = 0
        self.gpm_live = 0  # allocated GPM samples not yet freed (leak check)
        self._lock = threading.Lock()
        self._due = threading.local()  # the cost of the call under way (set by _cost)
        #: XID events waiting in the (one) event set: (gpu index, xid); :meth:`inject_xid` adds one
        self.xid_queue: list[tuple[int, int]] = []
        self.event_sets = 0  # created and not freed (leak check)
        self.registered: set[int] = set()  # GPU indexes registered for XID events
        #: each nvmlEventSetWait's timeout (ms), in order
        self.waits: list[int] = []
        # Module constants and classes, so code can use them as on pynvml.
        for k, v in globals().items():
            if k.startswith(("NVML_", "NVMLError", "nvmlEventType")):
                setattr(self, k, v)

    # The real binding checks for this to tell NVIDIA's module from the old project.
    def nvmlInitWithFlags(self, flags: int) -> None:
        self.nvmlInit()

    def _cost(self, what: str = "") -> None:
        """Count the call, and say what it costs: :func:`_priced` spins the rest of it."""
        with self._lock:
            self.calls += 1
        c = self.call_cost_s
        self._due.cost = c.get(what, DEFAULT_CALL_S) if isinstance(c, dict) else c

    def _gpu(self, h: Any, what: str = "") -> FakeGpu:
        self._cost(what)
        return self.gpus[h]

    def _wave(self, g: FakeGpu, period: float, lo: float, hi: float) -> float:
        x = math.sin(self.clock() * 2 * math.pi / period + g.phase)
        return lo + (hi - lo) * (x + 1) / 2

    def nvmlInit(self) -> None:
        self._cost()
        if self.init_error is not None:
            raise self.init_error
        self.inited += 1

    def nvmlShutdown(self) -> None:
        self._cost()

    def nvmlSystemGetDriverVersion(self) -> str:
        return "580.159.04 (simulated)"

    def nvmlSystemGetNVMLVersion(self) -> str:
        return "13.580.159.04"

    def nvmlDeviceGetCount(self) -> int:
        self._cost()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        self._cost()
        if self.gpus[i].lost:
            raise NVMLError_GpuIsLost(_real.NVML_ERROR_GPU_IS_LOST)
        return i

    def nvmlDeviceGetName(self, h: int) -> str:
        g = self._gpu(h, "name")
        return g.reading("name", lambda: g.name)

    def nvmlDeviceGetUUID(self, h: int) -> str:
        g = self._gpu(h, "uuid")
        return g.reading("uuid", lambda: f"GPU-fake-{h:04d}")

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        g = self._gpu(h, "power_limit")
        return g.reading("power_limit", lambda: g.power_limit_mw)

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        g = self._gpu(h, "utilization")
        return g.reading(
            "utilization",
            lambda: SimpleNamespace(gpu=round(self._wave(g, 40, 20, 100)), memory=round(self._wave(g, 40, 5, 40))),
        )

    def nvmlDeviceGetMemoryInfo(self, h: int, version: Any = None) -> Any:
        g = self._gpu(h, "memory")

        def mem() -> Any:
            used = int(g.mem_total * self._wave(g, 120, 0.5, 0.92))
            return SimpleNamespace(total=g.mem_total, used=used, free=g.mem_total - used)

        return g.reading("memory", mem)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        g = self._gpu(h, "power")
        return g.reading("power", lambda: int(self._wave(g, 40, 120_000, 690_000)))

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        g = self._gpu(h, "temperature")
        return g.reading("temperature", lambda: int(self._wave(g, 200, 38, 71)))

    def nvmlDeviceGetClockInfo(self, h: int, kind: int) -> int:
        g = self._gpu(h, "mem_clock" if kind == NVML_CLOCK_MEM else "sm_clock")
        if kind == NVML_CLOCK_MEM:
            return g.reading("mem_clock", lambda: 3201)
        return g.reading("sm_clock", lambda: int(self._wave(g, 40, 1455, 1980)))

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        g = self._gpu(h, "throttle")
        return g.reading("throttle", lambda: 0)

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        g = self._gpu(h, "procs")
        return g.reading("procs", lambda: [SimpleNamespace(pid=4000 + h, usedGpuMemory=70 * 2**30)])

    # GPU faults ------------------------------------------------------------
    def nvmlDeviceGetProcessUtilization(self, h: int, last_seen_us: int) -> list[Any]:
        """Per-process samples: ``overrides["proc_util"]`` is ``{pid: sm %}`` (or an exception); by
        default the one process of :meth:`nvmlDeviceGetComputeRunningProcesses` at the GPU's load."""
        g = self._gpu(h, "proc_util")
        ts = int(self.clock() * 1e6)

        def default() -> dict[int, float]:
            return {4000 + h: round(self._wave(g, 30.0, 40, 100))}
        shares = g.reading("proc_util", default)
        if not shares:
            raise NVMLError_NotFound(_real.NVML_ERROR_NOT_FOUND)
        return [SimpleNamespace(pid=pid, timeStamp=ts, smUtil=v, memUtil=0, encUtil=0, decUtil=0)
                for pid, v in shares.items()]

    def nvmlDeviceGetTotalEccErrors(self, h: int, error_type: int, counter: int) -> int:
        key = "ecc_uncorrected" if error_type == NVML_MEMORY_ERROR_TYPE_UNCORRECTED else "ecc_corrected"
        g = self._gpu(h, key)
        return g.reading(key, lambda: 0)

    def nvmlDeviceGetRemappedRows(self, h: int) -> tuple[int, int, int, int]:
        g = self._gpu(h, "remapped_rows")
        return g.reading("remapped_rows", lambda: (0, 0, 0, 0))

    def nvmlDeviceGetRetiredPages(self, h: int, cause: int) -> list[int]:
        g = self._gpu(h, "retired_pages")
        return g.reading("retired_pages", lambda: [])

    def nvmlDeviceGetPcieThroughput(self, h: int, counter: int) -> int:
        g = self._gpu(h, "pcie")
        return g.reading("pcie", lambda: 1200 if counter == NVML_PCIE_UTIL_TX_BYTES else 3400)

    def nvmlDeviceGetIndex(self, h: int) -> int:
        self._cost()
        return int(h)

    # XID events ---------------------------------------------------------------
    def inject_xid(self, gpu: int, xid: int) -> None:
        """An XID critical error on GPU ``gpu``: the next event-set wait returns it."""
        with self._lock:
            self.xid_queue.append((gpu, xid))

    def nvmlEventSetCreate(self) -> Any:
        self._cost()
        with self._lock:
            self.event_sets += 1
        return SimpleNamespace(kind="event-set")

    def nvmlEventSetFree(self, es: Any) -> None:
        self._cost()
        with self._lock:
            self.event_sets -= 1

    def nvmlDeviceRegisterEvents(self, h: int, types: int, es: Any) -> None:
        g = self._gpu(h, "register_events")
        g.reading("register_events", lambda: None)
        self.registered.add(int(h))

    def nvmlEventSetWait(self, es: Any, timeout_ms: int) -> Any:
        """The oldest queued XID (only of a registered GPU), else NVML's timeout error at once
        (the fake never sleeps: tests inject clocks; the real wait is timed on the H200)."""
        self._cost("xid_wait")
        with self._lock:
            self.waits.append(int(timeout_ms))
            for i, (gpu, xid) in enumerate(self.xid_queue):
                if gpu in self.registered:
                    del self.xid_queue[i]
                    return SimpleNamespace(device=gpu, eventType=nvmlEventTypeXidCriticalError, eventData=xid,
                                           gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)
        raise NVMLError_Timeout(_real.NVML_ERROR_TIMEOUT)

    # GPM -------------------------------------------------------------------
    def nvmlGpmQueryDeviceSupport(self, h: int) -> Any:
        g = self._gpu(h, "gpm_support")
        if not g.gpm:
            raise NVMLError_NotSupported(_real.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(isSupportedDevice=1)

    def nvmlGpmSampleAlloc(self) -> Any:
        self._cost()
        with self._lock:
            self.gpm_live += 1
        return SimpleNamespace(h=None, t=None)

    def nvmlGpmSampleFree(self, s: Any) -> None:
        self._cost()
        with self._lock:
            self.gpm_live -= 1

    def nvmlGpmSampleGet(self, h: int, s: Any) -> None:
        g = self._gpu(h, "gpm_sample")
        g.reading("gpm_sample", lambda: None)
        s.h = h
        s.t = self.clock()

    def c_nvmlGpmMetricsGet_t(self) -> Any:
        return SimpleNamespace(
            version=0, numMetrics=0, sample1=None, sample2=None,
            metrics=[SimpleNamespace(metricId=0, value=0.0) for _ in range(8)],
        )

    def nvmlGpmMetricsGet(self, mg: Any) -> Any:
        g = self._gpu(mg.sample2.h, "gpm_metrics")
        vals = g.reading(
            "gpm",
            lambda: {
                NVML_GPM_METRIC_SM_UTIL: self._wave(g, 40, 5, 95),
                NVML_GPM_METRIC_SM_OCCUPANCY: self._wave(g, 40, 2, 30),
                NVML_GPM_METRIC_DRAM_BW_UTIL: self._wave(g, 40, 1, 60),
            },
        )
        for i in range(mg.numMetrics):
            mg.metrics[i].value = vals.get(mg.metrics[i].metricId, float("nan"))
        return mg


def _priced(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Make a fake call take the CPU time its real call takes, its own work included:
    it runs, then spins (this thread's CPU time) until the call's cost is spent. So a
    simulated GPU costs what a real one does, not the fake's Python work on top."""

    @functools.wraps(fn)
    def call(self: FakeNvml, *a: Any, **k: Any) -> Any:
        t0 = time.thread_time()
        due = self._due
        due.cost = 0.0
        try:
            return fn(self, *a, **k)
        finally:
            cost, due.cost = due.cost, 0.0  # a nested call (init with flags) pays once
            if cost > 0:
                _spin_until(t0 + cost)

    return call


def _spin_until(end: float) -> None:
    """Burn this thread's CPU time until ``end`` (``time.thread_time``).

    Hashing 2 KB or more lets go of the GIL, as a real call (ctypes) does: a bare loop
    would hold it and stall the UI thread as real NVML never does. The last few
    microseconds go in small steps: whole 4 KB steps (~10 us on the dev VM) overshot
    each price by ~5 us on average, 45 % of an 11 us power read."""
    while (left := end - time.thread_time()) > 0:
        hashlib.sha256(_BURN if left > _TAIL_S else _TAIL)


_BURN = bytes(2048)  # CPython hashes at least 2048 bytes with the GIL released (~5 us)
_TAIL = bytes(64)  # ~0.3 us, under the GIL
_TAIL_S = 6e-6


for _name, _fn in list(vars(FakeNvml).items()):
    if _name.startswith("nvml") and callable(_fn):
        setattr(FakeNvml, _name, _priced(_fn))


#: CPU time of each call vtop makes a tick, measured on the H200 box through
#: nvidia-ml-py, calls a second apart as vtop makes them (median of 20;
#: bench/nvml_calibrate.py, bench/h200/nvml-calibrate-2026-12-01.json).
#: A GPM sample is most of it. Calls not listed (init, handles, names, GPM
#: sample alloc/free) cost DEFAULT_CALL_S. A fake call spins what is left of
#: its cost after its own Python work (:func:`_priced`).
H200_CALL_S: dict[str, float] = {
    "utilization": 49.7e-6,
    "memory": 72.8e-6,
    "power": 11.1e-6,
    "temperature": 10.0e-6,
    "sm_clock": 6.5e-6,
    "mem_clock": 3.1e-6,
    "throttle": 7.8e-6,
    "procs": 34.3e-6,
    "gpm_sample": 182.2e-6,
    "gpm_metrics": 7.9e-6,
    # nvmlDeviceGetProcessUtilization with a process running kernels: measured on a lent H100 80GB, not the H200
    # (bench/nvml_calibrate.py, 2026-12-06, under a bf16 matmul: 1,589 us a call 20 ms apart, 1,616 us 1 s apart)
    "proc_util": 1.6e-3,
}
DEFAULT_CALL_S = 5e-6


def simulated(n: int, *, call_cost_s: float | dict[str, float] | None = None) -> FakeNvml:
    """``n`` H200-like GPUs with staggered load waves (for ``--simulate-gpus`` and benchmarks);
    each call spins the CPU time the real call took on the H200 box (:data:`H200_CALL_S`)."""
    cost = dict(H200_CALL_S) if call_cost_s is None else call_cost_s
    return FakeNvml([FakeGpu(phase=i * 0.7) for i in range(n)], call_cost_s=cost)
