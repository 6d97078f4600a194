"""What NVML says about this node's GPUs, read through the maintained binding (``nvidia-ml-py``).

One :meth:`NvmlSession.read` is one consistent pass over every GPU: name, UUID, memory (the v2 call
where the driver has it, else v1), compute capability and the compute processes with the memory each
holds. A call that fails does not end the pass: its failure is recorded (call name and NVML's error
name, e.g. ``GPU_IS_LOST``) and everything else is still read, so a GPU fallen off the bus costs that
GPU's figures and nothing more. Nothing here raises on an NVML error; only
:func:`require_gpus` turns "NVML has nothing to say" into a one-line :class:`NvmlUnavailableError`
for the command line.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any, TypeVar

from loadline.agent._product import gfd_product
from loadline.errors import LoadlineError

__all__ = [
    "GPU",
    "Failure",
    "Memory",
    "NodeReading",
    "NvmlSession",
    "NvmlUnavailableError",
    "Process",
    "error_name",
    "load_pynvml",
    "require_gpus",
]

log = logging.getLogger("loadline.agent")

T = TypeVar("T")

#: Errors of the v2 memory call that mean "this driver only has v1", not "this GPU is in trouble".
_V2_ABSENT = ("FUNCTION_NOT_FOUND", "NOT_SUPPORTED", "ARGUMENT_VERSION_MISMATCH")
#: The pseudo error of a process whose memory NVML reports as "not available" (e.g. WDDM, MIG).
VALUE_NOT_AVAILABLE = "VALUE_NOT_AVAILABLE"


class NvmlUnavailableError(LoadlineError):
    """NVML cannot be used here (no library, no driver, no GPU): the one line says which and the fix."""


@dataclass(frozen=True)
class Failure:
    """One NVML call that failed during a read. ``gpu`` is the device index, or None for system calls."""

    call: str
    error: str
    gpu: int | None = None


@dataclass(frozen=True)
class Memory:
    """Bytes of one GPU. ``reserved`` (driver and firmware) only comes with the v2 call (``version`` 2),
    where ``used`` excludes it; with v1 ``used`` includes it."""

    total: int
    used: int
    free: int
    reserved: int | None
    version: int


@dataclass(frozen=True)
class Process:
    """A compute process on a GPU (host PID) and the GPU memory it holds (None: NVML cannot tell)."""

    pid: int
    used_bytes: int | None


@dataclass(frozen=True)
class GPU:
    index: int
    uuid: str
    name: str
    memory: Memory | None
    compute_capability: tuple[int, int] | None
    processes: tuple[Process, ...] | None  # None: the list could not be read (not: no processes)
    nvlink: bool | None = None  # link 0 active; None: not asked or not supported

    @property
    def product(self) -> str:
        """The ``nvidia.com/gpu.product`` value GPU feature discovery gives this GPU."""
        return gfd_product(self.name) if self.name else ""


@dataclass(frozen=True)
class NodeReading:
    """One pass over the node. ``up``: NVML initialised and listed its devices."""

    up: bool
    driver_version: str = ""
    gpus: tuple[GPU, ...] = ()
    failures: tuple[Failure, ...] = ()


def load_pynvml() -> Any:
    """The ``pynvml`` module of ``nvidia-ml-py``. Importing it never touches the driver: the library
    ``libnvidia-ml.so.1`` is only loaded by ``nvmlInit``, so a node without it still gets this far."""
    return importlib.import_module("pynvml")


def error_name(nvml: Any, exc: BaseException) -> str:
    """NVML's name for an error, e.g. ``GPU_IS_LOST`` for 15, from the binding's own constants."""
    value = getattr(exc, "value", None)
    for attr in dir(nvml):
        if attr.startswith("NVML_ERROR_") and getattr(nvml, attr) == value:
            return attr.removeprefix("NVML_ERROR_")
    return f"CODE_{value}" if value is not None else type(exc).__name__


@dataclass
class NvmlSession:
    """NVML for the life of the agent: initialised on first use and again after it failed.

    ``nvml`` is the pynvml module (a stand-in in unit tests). NVML is initialised once, not per read:
    ``nvmlInit`` costs tens of milliseconds on a real driver and each init must be paired with a
    shutdown. A failed init is retried on the next read, so a driver that comes up after the agent
    (the GPU operator installs it as a DaemonSet too) is picked up without a restart.
    """

    nvml: Any = field(default_factory=load_pynvml)
    initialised: bool = False
    v2_memory: bool = True  # cleared once the driver showed it has only the v1 memory call

    def _init(self, failures: list[Failure]) -> bool:
        if self.initialised:
            return True
        try:
            self.nvml.nvmlInit()
        except self.nvml.NVMLError as exc:
            failures.append(Failure("nvmlInit", error_name(self.nvml, exc)))
            return False
        self.initialised = True
        return True

    def shutdown(self) -> None:
        if self.initialised:
            with contextlib.suppress(self.nvml.NVMLError):
                self.nvml.nvmlShutdown()
            self.initialised = False

    def read(self, *, nvlink: bool = False) -> NodeReading:
        """Everything NVML can say now; failures are part of the answer, never raised."""
        failures: list[Failure] = []
        if not self._init(failures):
            return NodeReading(up=False, failures=tuple(failures))

        def call(name: str, fn: Callable[[], T], gpu: int | None = None) -> T | None:
            try:
                return fn()
            except self.nvml.NVMLError as exc:
                failures.append(Failure(name, error_name(self.nvml, exc), gpu))
                return None

        driver = call("nvmlSystemGetDriverVersion", self.nvml.nvmlSystemGetDriverVersion)
        count = call("nvmlDeviceGetCount", self.nvml.nvmlDeviceGetCount)
        if count is None:
            return NodeReading(up=False, driver_version=str(driver or ""), failures=tuple(failures))
        gpus = []
        for index in range(int(count)):
            gpu = self._read_gpu(index, call, failures, nvlink)
            if gpu is not None:
                gpus.append(gpu)
        return NodeReading(True, str(driver or ""), tuple(gpus), tuple(failures))

    def _read_gpu(
        self, index: int, call: Callable[..., Any], failures: list[Failure], nvlink: bool
    ) -> GPU | None:
        nvml = self.nvml
        handle = call("nvmlDeviceGetHandleByIndex", lambda: nvml.nvmlDeviceGetHandleByIndex(index), index)
        if handle is None:
            return None
        uuid = call("nvmlDeviceGetUUID", lambda: nvml.nvmlDeviceGetUUID(handle), index)
        if uuid is None:  # without its identity a GPU's figures cannot be told apart over time
            return None
        name = call("nvmlDeviceGetName", lambda: nvml.nvmlDeviceGetName(handle), index)
        memory = self._memory(handle, index, call, failures)
        cc = call(
            "nvmlDeviceGetCudaComputeCapability",
            lambda: nvml.nvmlDeviceGetCudaComputeCapability(handle),
            index,
        )
        raw = call(
            "nvmlDeviceGetComputeRunningProcesses",
            lambda: nvml.nvmlDeviceGetComputeRunningProcesses(handle),
            index,
        )
        processes = None
        if raw is not None:
            processes = tuple(Process(int(p.pid), _bytes(p.usedGpuMemory)) for p in raw)
            failures.extend(
                Failure("nvmlDeviceGetComputeRunningProcesses", VALUE_NOT_AVAILABLE, index)
                for p in processes
                if p.used_bytes is None
            )
        link = None
        if nvlink:
            try:
                link = bool(nvml.nvmlDeviceGetNvLinkState(handle, 0))
            except nvml.NVMLError:
                link = None  # no NVLink on this GPU (PCIe boards say NOT_SUPPORTED): not a failure
        return GPU(
            index=index,
            uuid=str(uuid),
            name=str(name or ""),
            memory=memory,
            compute_capability=(int(cc[0]), int(cc[1])) if cc is not None else None,
            processes=processes,
            nvlink=link,
        )

    def _memory(
        self, handle: Any, index: int, call: Callable[..., Any], failures: list[Failure]
    ) -> Memory | None:
        nvml = self.nvml
        if self.v2_memory and hasattr(nvml, "nvmlMemory_v2"):
            try:
                m = nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2)
                return Memory(int(m.total), int(m.used), int(m.free), int(m.reserved), 2)
            except nvml.NVMLError as exc:
                error = error_name(nvml, exc)
                if error not in _V2_ABSENT:
                    failures.append(Failure("nvmlDeviceGetMemoryInfo_v2", error, index))
                    return None
                self.v2_memory = False
                log.info("GPU %d: no v2 memory call (%s); using nvmlDeviceGetMemoryInfo (v1)", index, error)
        m = call("nvmlDeviceGetMemoryInfo", lambda: nvml.nvmlDeviceGetMemoryInfo(handle), index)
        return Memory(int(m.total), int(m.used), int(m.free), None, 1) if m is not None else None


def _bytes(value: Any) -> int | None:
    return None if value is None else int(value)


@cache
def _nvml_table() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(
        resources.files("loadline.agent").joinpath("data", "nvml.json").read_text(encoding="utf-8")
    )
    return data


def require_gpus(reading: NodeReading) -> NodeReading:
    """The reading, or :class:`NvmlUnavailableError` naming why NVML had no GPU to describe."""
    if reading.up and reading.gpus:
        return reading
    if not reading.up:
        failure = reading.failures[0] if reading.failures else Failure("nvmlInit", "UNKNOWN")
        table = _nvml_table()
        fix = str(table["init_fixes"].get(failure.error, table["default_fix"]))
        raise NvmlUnavailableError(f"NVML: {failure.call} failed with {failure.error} (fix: {fix})")
    lost = ", ".join(f"GPU {f.gpu}: {f.call} {f.error}" for f in reading.failures)
    raise NvmlUnavailableError(
        f"NVML: no usable GPU on this machine{' (' + lost + ')' if lost else ''}"
        " (fix: run it on a GPU node; nvidia-smi -L lists what the driver sees)"
    )
