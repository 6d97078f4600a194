"""Reading torch's CUDA out-of-memory text into numbers.

torch has printed two formats over the years, and vLLM logs them as they come, often several times
(one per worker rank) and sometimes wrapped mid-word by a log collector:

- old (torch < 2.1): "Tried to allocate 1.63 GiB (GPU 0; 44.56 GiB total capacity; 27.91 GiB already
  allocated; 565.31 MiB free; 27.93 GiB reserved in total by PyTorch)"
- new: "Tried to allocate 786.00 MiB. GPU 0 has a total capacity of 79.19 GiB of which 552.50 MiB is
  free. Including non-PyTorch memory, this process has 78.64 GiB memory in use. Of the allocated memory
  74.91 GiB is allocated by PyTorch, with 626.00 MiB allocated in private pools (e.g., CUDA Graphs), and
  1.78 GiB is reserved by PyTorch but unallocated."

The allocator figures are what separate fragmentation (much reserved but unallocated) from a real
shortage, and a crowded GPU (memory held outside this process) from a vLLM problem.
"""

from __future__ import annotations

import re

from loadline.oom._model import AllocatorFigures
from loadline.units import GIB

__all__ = ["parse_oom_text", "to_gib"]

_SIZE = r"(\d+(?:\.\d+)?)\s*([KMGT]i?B|bytes|B)\b"
# XLA's runtime (PJRT) prints sizes as "1.96G": binary units without the "B" (tsl's HumanReadableNumBytes).
_XLA_SIZE = r"(\d+(?:\.\d+)?)\s*([KMGT]i?B?|bytes|B)(?![A-Za-z])"

# vLLM labels some GiB figures "GB"; torch always prints binary units. Both are read as binary.
_UNIT_GIB = {
    "B": 1 / GIB,
    "bytes": 1 / GIB,
    "KiB": 1 / 1024**2,
    "KB": 1 / 1024**2,
    "MiB": 1 / 1024,
    "MB": 1 / 1024,
    "GiB": 1.0,
    "GB": 1.0,
    "TiB": 1024.0,
    "TB": 1024.0,
    "K": 1 / 1024**2,
    "M": 1 / 1024,
    "G": 1.0,
    "T": 1024.0,
}

# torch_npu (Ascend) words PyTorch's messages with "NPU" for "CUDA" and "GPU".
_START = re.compile(
    r"CUDA out of memory|NPU out of memory|OutOfMemoryError|would exceed allowed memory", re.IGNORECASE
)
_WINDOW = 1500

# torch_npu adds "X current active;" (what its allocator's active blocks hold) before "free".
_OLD = re.compile(
    r"\((?:GPU|NPU) (\d+); " + _SIZE + r" total capacity; " + _SIZE + r" already allocated;"
    r"(?: \d+(?:\.\d+)?\s*[KMGT]i?B current active;)? " + _SIZE + r" free;"
    r"(?: " + _SIZE + r" allowed;)? " + _SIZE + r" reserved in total by PyTorch\)"
)
_REQUESTED = re.compile(r"Tried to allocate " + _SIZE)
# "capacty" is how torch 2.1 spelled it; keep accepting it.
_TOTAL_FREE = re.compile(
    r"GPU (\d+) has a total capac(?:i)?ty of " + _SIZE + r" of which " + _SIZE + r" is free"
)
# torch lists every process NVML finds on the GPU: its own as "this process has X memory in use", any
# other as "Process N has X memory in use". Inside a container NVML's PIDs are the host's, so torch
# cannot tell its own apart and lists it as "Process N" too.
# Reports condense it to "this process has X in use".
_THIS_PROCESS = re.compile(r"this process has " + _SIZE + r" (?:memory )?in use")
_A_PROCESS = re.compile(r"Process \d+ has " + _SIZE + r" memory in use")
_ALLOCATED = re.compile(r"Of the allocated memory " + _SIZE + r" is allocated by PyTorch")
_POOLS = re.compile(r"with " + _SIZE + r" allocated in private pools")
_RESERVED_UNALLOC = re.compile(_SIZE + r" is reserved by PyTorch but unallocated")
# torch with a memory fraction set (``set_per_process_memory_fraction``; TGI's --cuda-memory-fraction):
# "Allocation on device 0 would exceed allowed memory. (out of memory)\nCurrently allocated : X\n
# Requested : Y\nDevice limit : Z\nFree (according to CUDA): W". The limit is what the process may use.
_FRACTION = re.compile(
    r"Currently allocated\s*:\s*"
    + _SIZE
    + r"\s*(?:\\n)?\s*Requested\s*:\s*"
    + _SIZE
    + r"\s*(?:\\n)?\s*Device limit\s*:\s*"
    + _SIZE
    + r"\s*(?:\\n)?\s*Free \(according to CUDA\)\s*:\s*"
    + _SIZE
)
# The same figures as people condense them ("GPU has 19.53 GiB total, 329.87 MiB free. PyTorch allocated:
# 18.40 GiB Reserved but unallocated: 402.27 MiB").
_SHORT_TOTAL_FREE = re.compile(r"GPU(?: \d+)? has " + _SIZE + r" total, " + _SIZE + r" free")
_SHORT_ALLOCATED = re.compile(r"PyTorch allocated:\s*" + _SIZE)
_SHORT_UNALLOC = re.compile(r"Reserved but unallocated:\s*" + _SIZE)


# Allocators that say how large their largest free block was: XLA's PJRT ("Attempting to allocate 1.96G.
# That was not possible. There are 3.46G free. The largest contiguous region of free memory is 1.75G")
# and tt-metal ("Not enough space to allocate N B DRAM buffer across 8 banks, where each bank needs to
# store M B, ... (allocated: A B, free: F B, largest free block: L B)"; per bank, as the request is).
_LARGEST = re.compile(
    r"largest (?:contiguous region of free memory is|free block:?)\s*" + _XLA_SIZE, re.IGNORECASE
)
_BLOCK_REQUESTED = re.compile(
    r"(?:each bank needs to store|Attempting to allocate|Not enough space to allocate)\s*" + _XLA_SIZE,
    re.IGNORECASE,
)
_BLOCK_FREE = re.compile(r"(?:There (?:are|is)\s*" + _XLA_SIZE + r"\s*free|\bfree:\s*" + _XLA_SIZE + ")")


def _parse_largest(text: str) -> AllocatorFigures | None:
    """The request, the free memory and the largest free block, from the message that names the block."""
    largest = _LARGEST.search(text)
    if largest is None:
        return None
    window = text[max(0, largest.start() - 800) : largest.end()]
    # The last figures before the block's: the message's own (per bank where it says "each bank").
    requested = [m for m in _BLOCK_REQUESTED.finditer(window)]
    bank = [m for m in requested if m.group(0).lower().startswith("each bank")]
    request = (bank or requested)[-1] if requested else None
    free = [m for m in _BLOCK_FREE.finditer(window)]
    free_gib = None
    if free:
        last = free[-1]
        free_gib = _gib(last, 1) if last.group(1) is not None else _gib(last, 3)
    return AllocatorFigures(
        fmt="largest_block",
        requested_gib=_gib(request, 1),
        free_gib=free_gib,
        largest_free_gib=_gib(largest, 1),
    )


def to_gib(number: str, unit: str) -> float:
    """A size as torch prints it ("552.50", "MiB") in GiB."""
    return float(number) * _UNIT_GIB[unit]


def _gib(match: re.Match[str] | None, first: int) -> float | None:
    if match is None:
        return None
    return round(to_gib(match.group(first), match.group(first + 1)), 6)


def _parse_old(window: str, requested: float | None) -> AllocatorFigures | None:
    m = _OLD.search(window)
    if m is None:
        return None
    total, allocated, free = _gib(m, 2), _gib(m, 4), _gib(m, 6)
    reserved_total = _gib(m, 10)
    unallocated = None
    if reserved_total is not None and allocated is not None:
        unallocated = round(max(0.0, reserved_total - allocated), 6)
    return AllocatorFigures(
        fmt="old",
        gpu=int(m.group(1)),
        requested_gib=requested,
        total_gib=total,
        free_gib=free,
        allocated_gib=allocated,
        reserved_total_gib=reserved_total,
        reserved_unallocated_gib=unallocated,
    )


def _process_in_use(window: str, held: float | None) -> float | None:
    """What this process holds on the GPU: torch's "this process" figure; without it, the one process
    listed, or of several the least that still covers what PyTorch holds (``held``: allocated plus
    reserved but unallocated), since this process holds at least that; the first listed when no
    figure says what PyTorch holds."""
    own = _THIS_PROCESS.search(window)
    if own is not None:
        return _gib(own, 1)
    listed = [_gib(m, 1) or 0.0 for m in _A_PROCESS.finditer(window)]
    if len(listed) <= 1 or held is None:
        return listed[0] if listed else None
    covering = [gib for gib in listed if gib >= held]
    return min(covering) if covering else max(listed)


def _parse_new(window: str, requested: float | None) -> AllocatorFigures | None:
    total_free = _TOTAL_FREE.search(window)
    allocated = _ALLOCATED.search(window)
    if total_free is None and allocated is None:
        return None
    allocated_gib = _gib(allocated, 1)
    unallocated = _gib(_RESERVED_UNALLOC.search(window), 1)
    held = None if allocated_gib is None else allocated_gib + (unallocated or 0.0)
    return AllocatorFigures(
        fmt="new",
        gpu=int(total_free.group(1)) if total_free else None,
        requested_gib=requested,
        total_gib=_gib(total_free, 2),
        free_gib=_gib(total_free, 4),
        process_in_use_gib=_process_in_use(window, held),
        allocated_gib=allocated_gib,
        private_pools_gib=_gib(_POOLS.search(window), 1),
        reserved_unallocated_gib=unallocated,
    )


def _parse_fraction(window: str) -> AllocatorFigures | None:
    m = _FRACTION.search(window)
    if m is None:
        return None
    return AllocatorFigures(
        fmt="fraction",
        allocated_gib=_gib(m, 1),
        requested_gib=_gib(m, 3),
        total_gib=_gib(m, 5),
        free_gib=_gib(m, 7),
    )


def _parse_short(window: str, requested: float | None) -> AllocatorFigures | None:
    total_free = _SHORT_TOTAL_FREE.search(window)
    if total_free is None:
        return None
    return AllocatorFigures(
        fmt="short",
        requested_gib=requested,
        total_gib=_gib(total_free, 1),
        free_gib=_gib(total_free, 3),
        allocated_gib=_gib(_SHORT_ALLOCATED.search(window), 1),
        reserved_unallocated_gib=_gib(_SHORT_UNALLOC.search(window), 1),
    )


def _parse_window(window: str) -> AllocatorFigures | None:
    requested = _gib(_REQUESTED.search(window), 1)
    figures = (
        _parse_old(window, requested)
        or _parse_new(window, requested)
        or _parse_fraction(window)
        or _parse_short(window, requested)
    )
    if figures is None and requested is not None:
        return AllocatorFigures(fmt="partial", requested_gib=requested)
    return figures


def _count(figures: AllocatorFigures) -> int:
    return sum(v is not None for v in figures.__dict__.values())


def parse_oom_text(text: str) -> AllocatorFigures | None:
    """The allocator figures of the first torch CUDA out-of-memory message in ``text``, or ``None``.

    Each message is read in a window from its start, once with line breaks as spaces and once with
    them removed (log collectors wrap lines mid-word: "this proce\\nss has"); the reading with more
    figures wins. A message that only says how much it tried to allocate gives a ``"partial"`` result.
    """
    for start in _START.finditer(text):
        # Look a little back too: the old format may print the "Tried to allocate" before the name.
        window = text[max(0, start.start() - 40) : start.start() + _WINDOW]
        readings = [
            r
            for r in (
                _parse_window(re.sub(r"\s*\n\s*", " ", window)),
                _parse_window(re.sub(r"\s*\n\s*", "", window)),
            )
            if r is not None
        ]
        if readings:
            return max(readings, key=_count)
    block = _parse_largest(text)
    if block is not None:
        return block
    # A bare "Tried to allocate" (some reports quote only that line).
    bare = _REQUESTED.search(text)
    return _parse_window(text[bare.start() : bare.start() + _WINDOW]) if bare else None
