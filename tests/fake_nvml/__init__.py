"""A fake ``libnvidia-ml.so.1`` (fake_nvml.c), compiled at test time, and the script that drives it.

The real ``pynvml`` loads it by name through ``LD_LIBRARY_PATH`` in a subprocess, so the binding's
ctypes code (structures, the two-call process list, error classes) runs exactly as on a GPU node.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

SOURCE = Path(__file__).with_name("fake_nvml.c")
GIB = 1024**3
#: NVML return codes the tests script (nvml.h).
NOT_SUPPORTED = 3
DRIVER_NOT_LOADED = 9
GPU_IS_LOST = 15


def build(directory: Path, *, memory_v2: bool = True) -> Path:
    """Compile the fake into ``directory/libnvidia-ml.so.1`` with the system compiler; returns the dir."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler (cc) on PATH: the fake NVML library cannot be built")
    directory.mkdir(parents=True, exist_ok=True)
    cmd = [
        compiler,
        "-shared",
        "-fPIC",
        "-O1",
        "-Wall",
        "-Werror",
        "-o",
        str(directory / "libnvidia-ml.so.1"),
    ]
    if not memory_v2:
        cmd.append("-DFAKE_NVML_NO_MEMORY_V2")
    subprocess.run([*cmd, str(SOURCE)], check=True, capture_output=True, text=True)
    return directory


@dataclass
class FakeGPU:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    total: int = 81559 * 1024**2  # nvidia-smi's 81559 MiB
    reserved: int = 471 * 1024**2
    used: int = 0
    cc: tuple[int, int] = (9, 0)
    procs: list[tuple[int, int]] = field(default_factory=list)  # (host pid, bytes; -1: not available)
    errors: dict[str, int] = field(default_factory=dict)  # NVML function ('*': all) -> return code
    vanish: int = 0
    nvlink: bool | None = None


def write_script(
    path: Path,
    gpus: list[FakeGPU],
    *,
    driver: str = "550.54.15",
    init: int = 0,
    errors: dict[str, int] | None = None,
) -> Path:
    lines = [f"init {init}", f"driver {driver}"]
    lines += [f"error {call} {code}" for call, code in (errors or {}).items()]
    for i, gpu in enumerate(gpus):
        lines += [
            f"{i} name {gpu.name}",
            f"{i} uuid {gpu.uuid}",
            f"{i} memory {gpu.total} {gpu.reserved} {gpu.used}",
        ]
        lines.append(f"{i} cc {gpu.cc[0]} {gpu.cc[1]}")
        lines += [f"{i} proc {pid} {size}" for pid, size in gpu.procs]
        lines += [f"{i} error {call} {code}" for call, code in gpu.errors.items()]
        if gpu.vanish:
            lines.append(f"{i} vanish {gpu.vanish}")
        if gpu.nvlink is not None:
            lines.append(f"{i} nvlink {int(gpu.nvlink)}")
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)  # atomic: the library re-reads the script on every call
    return path


def nvml_env(libdir: Path, script: Path) -> dict[str, str]:
    """The environment that makes pynvml load the fake (and only the fake)."""
    return {**os.environ, "LD_LIBRARY_PATH": str(libdir), "FAKE_NVML_SCRIPT": str(script)}
