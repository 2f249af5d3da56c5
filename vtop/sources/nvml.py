"""NVML adapter: every GPU on the box, one :class:`GpuPoll` per call.

Design (after nvitop's NVML discipline, written anew):

* ``poll()`` is blocking and is only ever called from a thread worker. It
  initialises NVML lazily on its first call (``nvmlInit`` can take seconds on
  a GPU without persistence mode) and caches the device handles.
* Each field is queried on its own; ``NotSupported`` gives ``None`` for that
  field alone, and the function is not asked again for that GPU (saves calls
  on every later tick). ``FunctionNotFound`` (an older driver than the
  binding) is noted once.
* ``GpuIsLost`` marks that GPU lost while the others go on; its handle is
  looked up again every ``relook_s`` seconds in case it comes back.
* No NVML at all (library missing, driver not loaded, no GPU) is not an
  error of vtop: the poll says ``absent`` with one plain sentence, and init is
  retried with a slow back-off (a driver can be loaded later).
* GPM (Hopper and later): SM activity, SM occupancy and DRAM bandwidth, from
  two GPM samples ``SLOW_EVERY_S`` (4 s) apart. A GPM sample is the dearest
  NVML call vtop makes (182 us of CPU on the H200, ~45 % of a GPU's poll), so
  it is taken every fourth tick at 1 Hz and the ticks between show the last
  reading, a 4 s average (the SM chart draws a cell per 4 s of history at 120
  columns, 9 s at 80). Until two samples are in, those fields are ``None``.
* Temperature, clocks, throttle reasons and the process list move slowly or
  matter at a coarser grain (the diagnoser compares processes' memory over
  minutes), and cost 61 us of CPU a GPU a tick on the H200: read every
  ``SLOW_EVERY_S`` too. Each process's SM share (``nvmlDeviceGetProcessUtilization``,
  1.6 ms of CPU a call on an H100 under load: the dearest call vtop makes) is read at
  those ticks only while two or more processes share the GPU, else every
  ``LONE_PROC_UTIL_S`` (30 s). Utilization, memory and power (133 us) are read every
  tick: the memory curve is what tells the OOMs apart. Measured on the H200 box
  with 8 simulated GPUs at its call costs, 4 s instead of 2 s took the NVML
  thread from 2.62-2.72 to 2.09-2.18 ms of CPU a second (bench/h200/ab-*session9*).
* The PCIe throughput counter blocks about 20 ms a call (21 ms measured on the H200):
  it is never read on the tick. A daemon thread of its own reads TX and RX of every
  GPU every ``PCIE_EVERY_S`` (30 s) and the poll shows the last reading.
* GPU faults: XID critical errors come from an NVML event set (``nvmlEventSetCreate``,
  ``nvmlDeviceRegisterEvents`` with ``nvmlEventTypeXidCriticalError``), drained at
  every poll in this thread with ``nvmlEventSetWait`` and a timeout of
  ``xid_wait_ms`` (0 by default: a wait that times out at once; the event set queues
  what came between polls, so nothing is lost by not blocking). ECC error counts
  (volatile, corrected and uncorrected), remapped rows (Ampere and later) and retired
  pages (older GPUs) change rarely and are read with the static fields, every
  ``STATIC_TTL_S``. What a GPU does not support is asked once.

The ``nvml`` module is injected so tests can pass a fake ``pynvml``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from vtop.clock import Clock, SystemClock
from vtop.model.gpu import ABSENT, ERROR, OK, GpuPoll, GpuProcess, GpuSample, XidEvent, decode_throttle
from vtop.threadname import name_this_thread

#: nvml.h's ``nvmlEventTypeXidCriticalError`` (also read from the binding when it has it)
XID_EVENT_TYPE = 0x8


class NvmlBinding(Protocol):
    """What :class:`NvmlSource` calls on its binding directly: NVIDIA's ``pynvml`` module,
    or a module-like stand-in (:class:`vtop.sources.fake_nvml.FakeNvml`).

    nvidia-ml-py ships no type information, so handles, structs and samples are ``Any``.
    Calls renamed across releases (:meth:`NvmlSource._fn`), the ``NVMLError_*`` classes
    and the ``NVML_*`` constants are looked up with ``getattr`` and are not listed here.
    """

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> Any: ...
    def nvmlSystemGetNVMLVersion(self) -> Any: ...
    def nvmlDeviceGetCount(self) -> Any: ...
    def nvmlDeviceGetHandleByIndex(self, index: int, /) -> Any: ...
    def nvmlDeviceGetName(self, handle: Any, /) -> Any: ...
    def nvmlDeviceGetUUID(self, handle: Any, /) -> Any: ...
    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any, /) -> Any: ...
    def nvmlDeviceGetUtilizationRates(self, handle: Any, /) -> Any: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any, /) -> Any: ...
    def nvmlDeviceGetPowerUsage(self, handle: Any, /) -> Any: ...
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int, /) -> Any: ...
    def nvmlDeviceGetClockInfo(self, handle: Any, clock_type: int, /) -> Any: ...
    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any, /) -> Any: ...
    def nvmlDeviceGetProcessUtilization(self, handle: Any, last_seen_us: int, /) -> Any: ...
    def nvmlGpmSampleAlloc(self) -> Any: ...
    def nvmlGpmSampleGet(self, handle: Any, sample: Any, /) -> Any: ...
    def nvmlGpmMetricsGet(self, metrics_get: Any, /) -> Any: ...
    def nvmlEventSetCreate(self) -> Any: ...
    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any, /) -> Any: ...
    def nvmlEventSetWait(self, event_set: Any, timeout_ms: int, /) -> Any: ...
    def nvmlEventSetFree(self, event_set: Any, /) -> Any: ...


class _GpuLost(Exception):
    pass


class _Unsupported(Exception):
    pass


@dataclass
class _Device:
    index: int
    handle: Any = None
    name: str = "GPU"
    uuid: str | None = None
    mem_total: int | None = None
    power_limit_w: float | None = None
    lost: bool = False
    lost_at: float = 0.0
    unsupported: set[str] = field(default_factory=set)
    gpm_ok: bool | None = None  # None: not asked yet
    gpm_prev: Any = None  # the sample taken last tick
    gpm_spare: Any = None  # an allocated sample holding nothing needed: this tick's buffer
    gpm_get: Any = None  # the metrics-get struct, filled in once and reused
    slow_at: float | None = None  # when the slow fields and GPM were last read (monotonic)
    slow_vals: tuple[Any, ...] = (None,) * 8  # and what they were (see _slow_fields)
    static_at: float = -1e9
    #: ECC corrected/uncorrected, remapped rows (uncorr, corr, pending, failed), retired pages
    faults: tuple[Any, ...] = (None,) * 7
    #: the PCIe thread's last (tx, rx) KB/s
    pcie: tuple[float | None, float | None] = (None, None)
    xid_registered: bool = False
    #: the newest timestamp (us) of the per-process utilization samples read so far
    util_seen_us: int = 0
    #: the last per-process utilization read: when (monotonic), of which processes, and what it gave
    util_read_at: float | None = None
    util_pids: frozenset[int] = frozenset()
    util_last: dict[int, float] | None = None


def _load_pynvml() -> NvmlBinding:
    # nvidia-ml-py has no py.typed and no stubs package: the module is Any, NvmlBinding types it.
    import pynvml  # nvidia-ml-py (pyproject.toml: no type information, ignored by mypy)

    if not hasattr(pynvml, "nvmlInitWithFlags"):
        # The old `pynvml` PyPI project (or a stub) shadows NVIDIA's binding.
        raise ImportError(
            "the installed `pynvml` module is not NVIDIA's nvidia-ml-py; "
            "run: pip uninstall pynvml && pip install nvidia-ml-py"
        )
    return pynvml


class NvmlSource:
    """Polls every GPU through NVML. Thread-confined: call ``poll`` from one worker."""

    STATIC_TTL_S = 30.0
    """Power limit and name change rarely; re-read them this often."""
    #: seconds between reads of the slow fields: temperature, clocks, throttle reasons, the
    #: process list (61 us of CPU a GPU on the H200) and a GPM sample (182 us); utilization,
    #: memory and power (133 us) are read every tick (see the module doc)
    SLOW_EVERY_S = 4.0
    #: a tick that comes up to this early still reads (1 Hz ticks are not exactly 1 s apart)
    EARLY_S = 0.25
    #: seconds between reads of a lone process's SM share (:meth:`_proc_sm_when_due`); with two or more
    #: processes on the GPU it is read at every slow tick
    LONE_PROC_UTIL_S = 30.0
    #: seconds between the PCIe thread's reads (two ~21 ms calls a GPU on the H200)
    PCIE_EVERY_S = 30.0
    #: at most this many XID events are taken from the event set at one poll (the rest wait)
    XID_MAX_PER_POLL = 32

    def __init__(
        self,
        nvml: NvmlBinding | None = None,
        *,
        loader: Callable[[], NvmlBinding] | None = None,
        clock: Clock | None = None,
        gpm: bool = True,
        processes: bool = True,
        relook_s: float = 10.0,
        init_retry_s: float = 30.0,
        xid: bool = True,
        xid_wait_ms: int = 0,
        faults: bool = True,
        pcie_every_s: float | None = None,
    ) -> None:
        #: set from the first ``_init`` on; every call below ``_init`` runs only once it is
        #: (``_inited``), hence the ``assert N is not None`` that tells mypy so
        self._nvml = nvml
        #: makes the module at the first poll (in the poll thread, after the first frame)
        self._loader = loader or _load_pynvml
        self._clock = clock or SystemClock()
        self._want_gpm = gpm
        self._want_procs = processes
        self._relook_s = relook_s
        self._init_retry_s = init_retry_s
        self._inited = False
        self._absent_msg: str | None = None
        self._next_init = 0.0
        self._devices: list[_Device] = []
        self._driver: str | None = None
        self._nvml_version: str | None = None
        self._notes: list[str] = []
        self._noted: set[str] = set()
        self._lock = threading.Lock()
        self._want_xid = xid
        self._want_faults = faults
        #: milliseconds each poll's first ``nvmlEventSetWait`` may wait for an XID event
        self.xid_wait_ms = max(0, int(xid_wait_ms))
        self._xid_set: Any = None
        #: the last poll's time spent draining the XID event set (wall, perf_counter seconds) and
        #: how many waits it made; for the benchmarks (bench/h200/xid_wait.py)
        self.xid_wait_s: float | None = None
        self.xid_waits = 0
        self._pcie_every_s = pcie_every_s
        self._pcie_thread: threading.Thread | None = None
        self._pcie_stop = threading.Event()

    @property
    def binding(self) -> NvmlBinding | None:
        """The NVML binding in use (pynvml, or the simulated one); None before the first poll."""
        return self._nvml

    @property
    def simulated(self) -> bool:
        """The GPUs are simulated (``--simulate-gpus``, tests): their processes' pids are made up
        and must not be looked up in this box's process table (pid 4003 may well be some other
        program here)."""
        return bool(getattr(self._nvml, "SIMULATED", False))

    # ----------------------------------------------------------------- init
    def _init(self) -> None:
        now = self._clock.monotonic()
        if self._inited or now < self._next_init:
            return
        try:
            if self._nvml is None:
                self._nvml = self._loader()
            N = self._nvml
            N.nvmlInit()
        except ImportError as e:
            self._absent(f"NVML binding not importable: {e}", now, retry=False)
            return
        except Exception as e:  # noqa: BLE001 - NVMLError subclasses, OSError from ctypes
            self._absent(self._explain_init_error(e), now, retry=True)
            return
        self._inited = True
        self._absent_msg = None
        self._driver = self._safe_str(lambda: N.nvmlSystemGetDriverVersion())
        self._nvml_version = self._safe_str(lambda: N.nvmlSystemGetNVMLVersion())
        try:
            count = int(N.nvmlDeviceGetCount())
        except Exception as e:  # noqa: BLE001 - any NVMLError: absent, init retried later
            self._inited = False
            self._absent(f"NVML could not count GPUs: {self._errname(e)}", now, retry=True)
            return
        self._devices = [_Device(index=i) for i in range(count)]
        for d in self._devices:
            self._acquire(d, now)
        if count == 0:
            self._absent_msg = "NVML works but reports no GPU on this host"
            return
        if self._want_xid:
            self._xid_setup()
        if self._pcie_every_s is not None and self._pcie_thread is None:
            self._pcie_stop.clear()
            self._pcie_thread = threading.Thread(target=self._pcie_loop, name="vtop-nvml-pcie", daemon=True)
            self._pcie_thread.start()

    # ------------------------------------------------------------------ XID
    def _xid_setup(self) -> None:
        """An event set with every GPU registered for XID critical errors (what it supports)."""
        N = self._nvml
        assert N is not None
        if self._xid_set is None:
            try:
                self._xid_set = N.nvmlEventSetCreate()
            except Exception as e:  # noqa: BLE001 - no XID events from this driver: noted, the rest goes on
                self._note("xid-set", f"no XID events: NVML event set not available ({self._errname(e)})")
                self._want_xid = False
                return
        for d in self._devices:
            self._xid_register(d)

    def _xid_register(self, d: _Device) -> None:
        N = self._nvml
        if self._xid_set is None or d.xid_registered or d.handle is None or N is None:
            return
        try:
            N.nvmlDeviceRegisterEvents(d.handle, getattr(N, "nvmlEventTypeXidCriticalError", XID_EVENT_TYPE),
                                       self._xid_set)
            d.xid_registered = True
        except Exception as e:  # noqa: BLE001 - NotSupported (some GPUs, some containers): noted once
            self._note(f"xid-reg-{d.index}", f"GPU {d.index}: XID events not available ({self._errname(e)})")

    def drain_xids(self, now: float, wall: float, timeout_ms: int | None = None) -> tuple[XidEvent, ...]:
        """The XID events queued since the last poll: the first wait may last ``timeout_ms``
        (``xid_wait_ms``), the next ones do not wait (the set queues what is pending)."""
        N = self._nvml
        if self._xid_set is None or N is None:
            self.xid_wait_s = None
            return ()
        wait = self.xid_wait_ms if timeout_ms is None else max(0, int(timeout_ms))
        timeout_cls = getattr(N, "NVMLError_Timeout", ())
        want = getattr(N, "nvmlEventTypeXidCriticalError", XID_EVENT_TYPE)
        out: list[XidEvent] = []
        t0 = time.perf_counter()
        waits = 0
        for _ in range(self.XID_MAX_PER_POLL):
            waits += 1
            try:
                data = N.nvmlEventSetWait(self._xid_set, wait)
            except Exception as e:
                if not isinstance(e, timeout_cls):
                    self._note("xid-wait", f"XID event wait failed: {self._errname(e)}")
                break
            wait = 0
            if not int(getattr(data, "eventType", want)) & want:
                continue
            out.append(XidEvent(self._xid_gpu(getattr(data, "device", None)), int(data.eventData), wall, now))
        self.xid_wait_s = time.perf_counter() - t0
        self.xid_waits = waits
        return tuple(out)

    def _xid_gpu(self, handle: Any) -> int | None:
        """The index of the GPU an event names (NVML gives its handle)."""
        N = self._nvml
        try:
            return int(N.nvmlDeviceGetIndex(handle))  # type: ignore[union-attr]
        except Exception:  # noqa: BLE001 - fall back on the handles vtop holds
            pass
        for d in self._devices:
            if d.handle is handle or (d.handle is not None and d.handle == handle):
                return d.index
        return None

    # ----------------------------------------------------------------- PCIe
    def _pcie_loop(self) -> None:
        """The PCIe thread: every GPU's TX and RX every ``PCIE_EVERY_S`` (never on the tick)."""
        name_this_thread("vtop-pcie")
        every = self._pcie_every_s or self.PCIE_EVERY_S
        while not self._pcie_stop.is_set():
            self.read_pcie()
            self._pcie_stop.wait(every)

    def read_pcie(self) -> None:
        """Read every GPU's PCIe TX/RX throughput once (about 21 ms a call on the H200)."""
        N = self._nvml
        if N is None or not self._inited:
            return
        tx_c = getattr(N, "NVML_PCIE_UTIL_TX_BYTES", 0)
        rx_c = getattr(N, "NVML_PCIE_UTIL_RX_BYTES", 1)
        for d in list(self._devices):
            if self._pcie_stop.is_set():
                return
            if d.lost or d.handle is None or "pcie" in d.unsupported:
                continue
            try:
                fn = self._fn("nvmlDeviceGetPcieThroughput")
                tx = self._q(d, "pcie", fn, tx_c)
                rx = self._q(d, "pcie", fn, rx_c)
            except _GpuLost:
                continue
            d.pcie = (None if tx is None else float(tx), None if rx is None else float(rx))

    def _absent(self, msg: str, now: float, *, retry: bool) -> None:
        self._absent_msg = msg
        self._next_init = now + self._init_retry_s if retry else float("inf")

    def _explain_init_error(self, e: Exception) -> str:
        name = self._errname(e)
        N = self._nvml
        if N is not None:
            if isinstance(e, getattr(N, "NVMLError_LibraryNotFound", ())):
                return "no NVIDIA driver: libnvidia-ml.so.1 not found (no GPU on this host?)"
            if isinstance(e, getattr(N, "NVMLError_DriverNotLoaded", ())):
                return "NVIDIA driver not loaded (nvidia-smi would fail too)"
            if isinstance(e, getattr(N, "NVMLError_NoPermission", ())):
                return "no permission to open the NVIDIA device files"
            if isinstance(e, getattr(N, "NVMLError_LibRmVersionMismatch", ())):
                return "NVIDIA driver/library version mismatch (reboot or reload the driver)"
        return f"NVML init failed: {name}"

    @staticmethod
    def _errname(e: BaseException) -> str:
        s = str(e).strip()
        return f"{type(e).__name__}: {s}" if s else type(e).__name__

    def _safe_str(self, fn: Callable[[], Any]) -> str | None:
        try:
            v = fn()
        except Exception:  # noqa: BLE001 - a version string is optional
            return None
        if isinstance(v, bytes):
            v = v.decode("utf-8", "replace")
        return str(v)

    def _acquire(self, d: _Device, now: float) -> None:
        N = self._nvml
        assert N is not None  # called once _init has loaded it
        try:
            d.handle = N.nvmlDeviceGetHandleByIndex(d.index)
        except Exception as e:  # noqa: BLE001 - any NVMLError: that GPU is lost, looked up again later
            d.handle = None
            d.lost = True
            d.lost_at = now
            self._note(f"gpu{d.index}-handle", f"GPU {d.index}: no handle ({self._errname(e)})")
            return
        d.lost = False
        d.static_at = -1e9
        d.slow_at, d.slow_vals = None, (None,) * 8  # nothing of before it was lost
        d.xid_registered = False
        if self._xid_set is not None:
            self._xid_register(d)

    def _note(self, key: str, text: str) -> None:
        if key not in self._noted:
            self._noted.add(key)
            self._notes.append(text)

    # ----------------------------------------------------------------- query
    def _q(self, d: _Device, key: str, fn: Callable[..., Any], *args: Any) -> Any:
        """One NVML call for one field: value, or None when unsupported/failed."""
        if key in d.unsupported:
            return None
        N = self._nvml
        try:
            return fn(d.handle, *args)
        except Exception as e:
            if isinstance(e, getattr(N, "NVMLError_GpuIsLost", ())):
                raise _GpuLost() from e
            if isinstance(e, getattr(N, "NVMLError_NotSupported", ())):
                d.unsupported.add(key)
                return None
            if isinstance(e, (getattr(N, "NVMLError_FunctionNotFound", ()), AttributeError)):
                d.unsupported.add(key)
                self._note(f"fnf-{key}", f"this driver lacks the NVML call for {key}")
                return None
            # Transient or unknown: leave the field empty this tick only.
            return None

    def _fn(self, *names: str) -> Callable[..., Any]:
        """The first function the binding has among ``names`` (API renames across releases)."""
        for n in names:
            f = getattr(self._nvml, n, None)
            if f is not None:
                return f

        def missing(*_a: Any) -> Any:
            raise AttributeError(names[0])

        return missing

    def _sample_device(self, d: _Device, now: float) -> GpuSample:
        N = self._nvml
        assert N is not None  # polled only once _init has loaded it
        if d.lost:
            if now - d.lost_at >= self._relook_s:
                self._acquire(d, now)
            if d.lost:
                return GpuSample(index=d.index, name=d.name, uuid=d.uuid, lost=True, error="GPU is lost")
        try:
            if now - d.static_at >= self.STATIC_TTL_S:
                name = self._q(d, "name", N.nvmlDeviceGetName)
                if name is not None:
                    d.name = name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)
                uuid = self._q(d, "uuid", N.nvmlDeviceGetUUID)
                if uuid is not None:
                    d.uuid = uuid.decode("utf-8", "replace") if isinstance(uuid, bytes) else str(uuid)
                pl = self._q(d, "power_limit", N.nvmlDeviceGetEnforcedPowerLimit)
                d.power_limit_w = None if pl is None else pl / 1000.0
                if self._want_faults:
                    d.faults = self._fault_fields(d)
                d.static_at = now
            util = self._q(d, "utilization", N.nvmlDeviceGetUtilizationRates)
            mem = self._q(d, "memory", N.nvmlDeviceGetMemoryInfo)
            power = self._q(d, "power", N.nvmlDeviceGetPowerUsage)
            if d.slow_at is None or now - d.slow_at >= self.SLOW_EVERY_S - self.EARLY_S:
                d.slow_vals = self._slow_fields(d, now)
                d.slow_at = now
            temp, smc, memc, thr, procs, sm_active, sm_occ, dram = d.slow_vals
            ecc_c, ecc_u, rows_u, rows_c, pending, failed, retired = d.faults
        except _GpuLost:
            d.lost = True
            d.lost_at = now
            self._free_gpm(d)
            return GpuSample(index=d.index, name=d.name, uuid=d.uuid, lost=True, error="GPU is lost")
        mem_total = None if mem is None else int(mem.total)
        return GpuSample(
            index=d.index,
            name=d.name,
            uuid=d.uuid,
            util_gpu=None if util is None else float(util.gpu),
            util_mem=None if util is None else float(util.memory),
            mem_used=None if mem is None else int(mem.used),
            mem_total=mem_total,
            power_w=None if power is None else power / 1000.0,
            power_limit_w=d.power_limit_w,
            temp_c=None if temp is None else float(temp),
            sm_clock_mhz=None if smc is None else float(smc),
            mem_clock_mhz=None if memc is None else float(memc),
            throttle=decode_throttle(None if thr is None else int(thr)),
            procs=procs,
            sm_active=sm_active,
            sm_occupancy=sm_occ,
            dram_bw=dram,
            ecc_corrected=ecc_c,
            ecc_uncorrected=ecc_u,
            rows_remapped=rows_u,
            rows_remapped_corr=rows_c,
            remap_pending=pending,
            remap_failed=failed,
            retired_pages=retired,
            pcie_tx_kbs=d.pcie[0],
            pcie_rx_kbs=d.pcie[1],
        )

    def _fault_fields(self, d: _Device) -> tuple[Any, ...]:
        """ECC counts (volatile), remapped rows, retired pages; None where the GPU has none."""
        N = self._nvml
        assert N is not None
        vol = getattr(N, "NVML_VOLATILE_ECC", 0)
        ecc_c = self._q(d, "ecc_corrected", self._fn("nvmlDeviceGetTotalEccErrors"),
                        getattr(N, "NVML_MEMORY_ERROR_TYPE_CORRECTED", 0), vol)
        ecc_u = self._q(d, "ecc_uncorrected", self._fn("nvmlDeviceGetTotalEccErrors"),
                        getattr(N, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1), vol)
        rows = self._q(d, "remapped_rows", self._fn("nvmlDeviceGetRemappedRows"))
        rows_c = rows_u = pending = failed = None
        if rows is not None:
            rows_c, rows_u, pending, failed = int(rows[0]), int(rows[1]), bool(rows[2]), bool(rows[3])
        retired = None
        if rows is None:  # page retirement is the older GPUs' way; Ampere and later remap rows
            sbe = self._q(d, "retired_sbe", self._fn("nvmlDeviceGetRetiredPages"),
                          getattr(N, "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS", 0))
            dbe = self._q(d, "retired_dbe", self._fn("nvmlDeviceGetRetiredPages"),
                          getattr(N, "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR", 1))
            if sbe is not None or dbe is not None:
                retired = len(sbe or ()) + len(dbe or ())
        return (
            None if ecc_c is None else int(ecc_c), None if ecc_u is None else int(ecc_u),
            rows_u, rows_c, pending, failed, retired,
        )

    def _slow_fields(self, d: _Device, now: float) -> tuple[Any, ...]:
        """Temperature, SM and memory clocks, throttle reasons, the process list, and
        SM activity, SM occupancy and DRAM bandwidth since the last GPM sample."""
        N = self._nvml
        assert N is not None  # polled only once _init has loaded it
        temp = self._q(d, "temperature", N.nvmlDeviceGetTemperature, getattr(N, "NVML_TEMPERATURE_GPU", 0))
        smc = self._q(d, "sm_clock", N.nvmlDeviceGetClockInfo, getattr(N, "NVML_CLOCK_SM", 1))
        memc = self._q(d, "mem_clock", N.nvmlDeviceGetClockInfo, getattr(N, "NVML_CLOCK_MEM", 2))
        thr = self._q(
            d,
            "throttle",
            self._fn("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"),
        )
        procs: tuple[GpuProcess, ...] | None = None
        if self._want_procs:
            raw = self._q(d, "procs", N.nvmlDeviceGetComputeRunningProcesses)
            if raw is not None:
                sm = self._proc_sm_when_due(d, frozenset(int(p.pid) for p in raw), now) if raw else None
                procs = tuple(GpuProcess(int(p.pid), _mem_or_none(getattr(p, "usedGpuMemory", None)),
                                         None if sm is None else sm.get(int(p.pid), 0.0)) for p in raw)
        gpm = self._gpm(d) if self._want_gpm else (None, None, None)
        return (temp, smc, memc, thr, procs, *gpm)

    def _proc_sm_when_due(self, d: _Device, pids: frozenset[int], now: float) -> dict[int, float] | None:
        """Each process's SM share, read at every slow tick while two or more processes share the GPU (whose
        share it is: the noisy neighbour, two servers on one GPU), and while one process is alone on it only
        when it is new or its last reading is ``LONE_PROC_UTIL_S`` old (its share is then the GPU's own busy
        time, asked only for the process view's column); between, the last reading stands. The call is
        the dearest vtop makes: 1.6 ms of CPU on a lent H100 80GB under a matmul (bench/nvml_calibrate.py,
        2026-12-06: 1,589 us a call 20 ms apart, 1,616 us 1 s apart; every other call of a tick together
        about 0.4 ms), 0.4 ms a second at the slow tick's 4 s."""
        if (len(pids) < 2 and pids == d.util_pids and d.util_read_at is not None
                and now - d.util_read_at < self.LONE_PROC_UTIL_S - self.EARLY_S):
            return d.util_last
        sm = self._proc_sm(d)
        d.util_read_at, d.util_pids, d.util_last = now, pids, sm
        return sm

    def _proc_sm(self, d: _Device) -> dict[int, float] | None:
        """Each process's mean SM share (%) over NVML's per-process samples since the last read (the
        driver keeps a few seconds of them); ``{}`` when it holds none (no kernel ran), None where
        the driver gives none at all (not supported, no permission, an older driver)."""
        N = self._nvml
        assert N is not None
        if "proc_util" in d.unsupported:
            return None
        try:
            raw = N.nvmlDeviceGetProcessUtilization(d.handle, d.util_seen_us)
        except Exception as e:
            if isinstance(e, getattr(N, "NVMLError_NotFound", ())):
                return {}  # no sample since the last read: no process ran a kernel
            if isinstance(e, getattr(N, "NVMLError_GpuIsLost", ())):
                raise _GpuLost() from e
            if isinstance(e, (getattr(N, "NVMLError_NotSupported", ()), getattr(N, "NVMLError_NoPermission", ()),
                              getattr(N, "NVMLError_FunctionNotFound", ()), AttributeError)):
                d.unsupported.add("proc_util")
                self._note("fnf-proc_util", "this GPU or driver gives no per-process utilization: "
                                            "another process's share of the GPU is not known")
            return None
        sums: dict[int, list[float]] = {}
        for smp in raw or ():
            ts, v = int(getattr(smp, "timeStamp", 0)), getattr(smp, "smUtil", None)
            d.util_seen_us = max(d.util_seen_us, ts)
            if v is None or not 0 <= v <= 100:  # an invalid sample (the driver marks them with UINT_MAX)
                continue
            sums.setdefault(int(smp.pid), []).append(float(v))
        return {pid: sum(vs) / len(vs) for pid, vs in sums.items()}

    # ------------------------------------------------------------------- GPM
    def _gpm(self, d: _Device) -> tuple[float | None, float | None, float | None]:
        """SM activity, SM occupancy and DRAM bandwidth since the last tick.

        Two GPM samples per GPU are allocated once and used in turn (this tick's
        reading goes into the one whose data the last tick used up), and the
        metrics-get struct is built once: two NVML calls a GPU a tick fewer than
        allocating and freeing a sample every tick, and no ctypes struct built.
        """
        N = self._nvml
        assert N is not None  # polled only once _init has loaded it
        if d.gpm_ok is None:
            sup = self._q(d, "gpm_support", self._fn("nvmlGpmQueryDeviceSupport"))
            d.gpm_ok = bool(sup is not None and getattr(sup, "isSupportedDevice", 0))
        if not d.gpm_ok:
            return None, None, None
        cur, d.gpm_spare = d.gpm_spare, None
        if cur is None:
            try:
                cur = N.nvmlGpmSampleAlloc()
            except Exception:  # noqa: BLE001 - no GPM on this GPU from now on
                d.gpm_ok = False
                return None, None, None
        try:
            N.nvmlGpmSampleGet(d.handle, cur)
        except Exception as e:
            d.gpm_spare = cur  # still allocated, holds nothing: next tick's buffer
            if isinstance(e, getattr(N, "NVMLError_GpuIsLost", ())):
                raise _GpuLost() from e
            return None, None, None
        prev, d.gpm_prev = d.gpm_prev, cur
        if prev is None:
            return None, None, None
        try:
            mg = d.gpm_get
            if mg is None:
                mg = d.gpm_get = gpm_metrics_get(N)
            mg.sample1 = prev
            mg.sample2 = cur
            N.nvmlGpmMetricsGet(mg)
            metrics = mg.metrics
            vals = (_pct_or_none(metrics[0].value), _pct_or_none(metrics[1].value), _pct_or_none(metrics[2].value))
        except Exception:  # noqa: BLE001 - GPM fields empty this tick
            vals = (None, None, None)
        finally:
            d.gpm_spare = prev  # its data is used up
        return vals

    def _free_gpm(self, d: _Device) -> None:
        for sample in (d.gpm_prev, d.gpm_spare):
            if sample is not None:
                _free(self._nvml, sample)
        d.gpm_prev = d.gpm_spare = d.gpm_get = None

    # ------------------------------------------------------------------ public
    def poll(self) -> GpuPoll:
        with self._lock:
            t0 = time.perf_counter()
            now = self._clock.monotonic()
            wall = self._clock.time()
            self._init()
            notes = tuple(self._notes)
            self._notes.clear()
            if not self._inited or not self._devices:
                return GpuPoll(
                    t=wall,
                    mono=now,
                    status=ABSENT,
                    message=self._absent_msg or "no GPU",
                    driver=self._driver,
                    nvml_version=self._nvml_version,
                    duration_s=time.perf_counter() - t0,
                    notes=notes,
                )
            gpus = tuple(self._sample_device(d, now) for d in self._devices)
            xids = self.drain_xids(now, wall) if self._xid_set is not None else ()
            notes = notes + tuple(self._notes)
            self._notes.clear()
            lost = [g.index for g in gpus if g.lost]
            status = OK if len(lost) < len(gpus) else ERROR
            msg = None
            if lost:
                msg = f"GPU {', '.join(map(str, lost))} lost" if status == OK else "every GPU is lost"
            return GpuPoll(
                t=wall,
                mono=now,
                status=status,
                message=msg,
                gpus=gpus,
                driver=self._driver,
                nvml_version=self._nvml_version,
                duration_s=time.perf_counter() - t0,
                notes=notes,
                xids=xids,
            )

    def close(self, wait_s: float = 1.0) -> bool:
        """Free the GPM samples and shut NVML down; False when a poll still holds NVML
        after ``wait_s`` (a hung driver call): then nothing is touched, as a shutdown
        beside a call in flight is not safe, and the caller goes on (its poll thread is a
        daemon). Waiting on the lock for good made ``--once`` as hung as the call."""
        self._pcie_stop.set()
        th = self._pcie_thread
        if th is not None and th is not threading.current_thread():
            th.join(max(0.0, wait_s))
            if th.is_alive():
                return False  # a PCIe read still in the driver: no shutdown beside it
            self._pcie_thread = None
        if not self._lock.acquire(timeout=max(0.0, wait_s)):
            return False
        try:
            for d in self._devices:
                self._free_gpm(d)
            N = self._nvml
            if self._xid_set is not None and N is not None:
                try:
                    N.nvmlEventSetFree(self._xid_set)
                except Exception:  # noqa: BLE001 - closing: best effort
                    pass
                self._xid_set = None
                for d in self._devices:
                    d.xid_registered = False
            if self._inited and N is not None:  # inited implies loaded
                try:
                    N.nvmlShutdown()
                except Exception:  # noqa: BLE001 - closing: nothing left to tell
                    pass
            self._inited = False
        finally:
            self._lock.release()
        return True


#: The GPM metrics vtop reads, in order: SM activity, SM occupancy, DRAM bandwidth.
#: Not GRAPHICS_UTIL (the busy share utilization.gpu estimates): asked with these, it
#: made the metrics-get cost 1.4-1.9 ms of CPU on the H200 instead of 8-14 us, far more
#: than the utilization call it would have replaced (tools/device/h200_gpm_util.py,
#: bench/h200/gpm-util-2026-12-01*.json).
GPM_METRICS = ("NVML_GPM_METRIC_SM_UTIL", "NVML_GPM_METRIC_SM_OCCUPANCY", "NVML_GPM_METRIC_DRAM_BW_UTIL")


def gpm_metrics_get(N: Any, metrics: tuple[str, ...] = GPM_METRICS) -> Any:
    """A metrics-get struct of binding ``N`` asking ``metrics`` (names of NVML's
    constants); fill in ``sample1``/``sample2`` and pass it to ``nvmlGpmMetricsGet``."""
    mg = N.c_nvmlGpmMetricsGet_t()
    mg.version = N.NVML_GPM_METRICS_GET_VERSION
    mg.numMetrics = len(metrics)
    for i, name in enumerate(metrics):
        mg.metrics[i].metricId = getattr(N, name)
    return mg


def _free(N: Any, sample: Any) -> None:
    try:
        N.nvmlGpmSampleFree(sample)
    except Exception:  # noqa: BLE001 - freeing is best effort
        pass


def _mem_or_none(v: Any) -> int | None:
    # NVML reports "not available" (e.g. in containers without the right
    # privileges) as None or as NVML_VALUE_NOT_AVAILABLE (2**64-1).
    if v is None:
        return None
    v = int(v)
    return None if v >= (1 << 63) else v


def _pct_or_none(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    if f != f or f < 0:  # NaN: GPM returns it for a metric it could not compute
        return None
    return min(f, 100.0)


def make_gpu_source(config: Any, *, one_round: bool = False) -> Any:
    """The GPU source a :class:`~vtop.config.Config` asks for: None with
    ``--no-gpu``, simulated GPUs with ``--simulate-gpus N``, else NVML.

    ``one_round`` (``vtop --once`` without ``--window``: one poll, then exit) leaves out what
    one poll cannot give and only delays the exit: GPM (SM activity needs two samples 4 s
    apart: the first gives nothing), the XID event set (it reports events from its
    registration on: none within one poll) and the PCIe thread (two ~21 ms calls a GPU on
    the H200, at once beside the poll, which ``close`` then waits for)."""
    if config.no_gpu:
        return None
    if config.simulate_gpus:
        n = int(config.simulate_gpus)

        def load() -> NvmlBinding:
            # Built at the first poll, as pynvml is imported for real GPUs: the fake
            # imports pynvml for its exception classes (8 ms on the dev VM), which the
            # first frame of a simulated run (the benchmark's) must not wait for either.
            from vtop.sources.fake_nvml import simulated

            # A demo's simulated GPUs cost nothing; the benchmark asks for each call to
            # spin the CPU time the real call takes on the H200 (bench/harness.py sets
            # VTOP_SIMULATED_NVML_COST=h200), so that its CPU figures mean something.
            priced = os.environ.get("VTOP_SIMULATED_NVML_COST", "").lower() == "h200"
            return simulated(n, call_cost_s=None if priced else 0.0)

        return NvmlSource(loader=load, gpm=not one_round, xid=not one_round)
    if one_round:
        return NvmlSource(gpm=False, xid=False)
    return NvmlSource(pcie_every_s=NvmlSource.PCIE_EVERY_S)
