"""torch's CUDA out-of-memory text, both formats, read into exact figures (GiB)."""

from __future__ import annotations

import pytest

from loadline.oom import parse_oom_text

NEW = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 786.00 MiB. GPU 0 has a total capacity "
    "of 79.19 GiB of which 552.50 MiB is free. Including non-PyTorch memory, this process has 78.64 GiB "
    "memory in use. Of the allocated memory 74.91 GiB is allocated by PyTorch, with 626.00 MiB allocated in "
    "private pools (e.g., CUDA Graphs), and 1.78 GiB is reserved by PyTorch but unallocated. If reserved but "
    "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
)
OLD = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.63 GiB (GPU 0; 44.56 GiB total "
    "capacity; 27.91 GiB already allocated; 565.31 MiB free; 27.93 GiB reserved in total by PyTorch) If "
    "reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation."
)


def test_new_format_exact_figures() -> None:
    f = parse_oom_text(NEW)
    assert f is not None
    assert f.fmt == "new"
    assert f.gpu == 0
    assert f.requested_gib == pytest.approx(786 / 1024)
    assert f.total_gib == 79.19
    assert f.free_gib == pytest.approx(552.5 / 1024)
    assert f.process_in_use_gib == 78.64
    assert f.allocated_gib == 74.91
    assert f.private_pools_gib == pytest.approx(626 / 1024)
    assert f.reserved_unallocated_gib == 1.78
    assert f.reserved_total_gib is None
    # 79.19 - 0.54 free - 78.64 in use: nothing else holds this GPU.
    assert f.outside_gib == pytest.approx(79.19 - 552.5 / 1024 - 78.64, abs=1e-5)


def test_old_format_exact_figures() -> None:
    f = parse_oom_text(OLD)
    assert f is not None
    assert f.fmt == "old"
    assert f.gpu == 0
    assert f.requested_gib == 1.63
    assert f.total_gib == 44.56
    assert f.allocated_gib == 27.91
    assert f.free_gib == pytest.approx(565.31 / 1024)
    assert f.reserved_total_gib == 27.93
    assert f.reserved_unallocated_gib == pytest.approx(0.02)
    # ~16 GiB neither free nor PyTorch's: the report's "other processes taking up about 15G".
    assert f.outside_gib == pytest.approx(44.56 - 565.31 / 1024 - 27.93, abs=1e-5)


def test_old_format_with_allowed_field() -> None:
    text = (
        "OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB (GPU 3; 11.93 GiB total capacity; "
        "10.67 GiB already allocated; 515.38 MiB free; 11.93 GiB allowed; 10.92 GiB reserved in total by "
        "PyTorch)"
    )
    f = parse_oom_text(text)
    assert f is not None and f.fmt == "old"
    assert (f.gpu, f.requested_gib, f.reserved_total_gib) == (3, 4.0, 10.92)
    assert f.reserved_unallocated_gib == pytest.approx(0.25)


def test_torch_2_1_spelling_and_other_process_wording() -> None:
    text = (
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 518.00 MiB. GPU 0 has a total "
        "capacty of 21.67 GiB of which 4.06 MiB is free. Process 2417585 has 21.65 GiB memory in use. Of the "
        "allocated memory 21.32 GiB is allocated by PyTorch, and 1018.00 KiB is reserved by PyTorch but "
        "unallocated."
    )
    f = parse_oom_text(text)
    assert f is not None
    assert f.total_gib == 21.67
    assert f.process_in_use_gib == 21.65
    assert f.reserved_unallocated_gib == pytest.approx(1018 / 1024**2, abs=1e-6)
    assert f.private_pools_gib is None


def test_this_process_is_the_one_torch_names_so_not_the_first_process_listed() -> None:
    # torch lists every process NVML finds on the GPU: the others as "Process N", its own as "this
    # process". What is held outside this process is the others' share, not this process's.
    listed = (
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.75 GiB. GPU 0 has a total "
        "capacty of 23.64 GiB of which 950.44 MiB is free. Process 2316410 has 176.00 MiB memory in use. "
        "Process 3149588 has 250.00 MiB memory in use. Including non-PyTorch memory, this process has "
        "22.30 GiB memory in use. Of the allocated memory 19.44 GiB is allocated by PyTorch, and 2.51 GiB "
        "is reserved by PyTorch but unallocated."
    )
    f = parse_oom_text(listed)
    assert f is not None and f.process_in_use_gib == 22.30
    assert f.outside_gib == pytest.approx(23.64 - 950.44 / 1024 - 22.30)


def test_in_a_container_this_process_is_the_listed_one_that_holds_what_pytorch_holds() -> None:
    # Inside a container NVML's PIDs are the host's, so torch lists its own process as "Process N" too:
    # of several, the one holding at least what PyTorch holds (allocated plus cached) is this one.
    text = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 768.00 MiB. GPU 0 has a total "
        "capacity of 79.15 GiB of which 752.31 MiB is free. Process 25252 has 18.65 GiB memory in use. "
        "Process 36870 has 30.11 GiB memory in use. Process 28066 has 29.47 GiB memory in use. Of the "
        "allocated memory 28.83 GiB is allocated by PyTorch, and 12.70 MiB is reserved by PyTorch but "
        "unallocated."
    )
    f = parse_oom_text(text)
    assert f is not None and f.process_in_use_gib == 29.47


def test_line_wrapped_mid_word_by_a_log_collector() -> None:
    text = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 232.00 MiB. GPU 0 has a total capacity "
        "of 23.57 GiB of which 154.25 MiB is free. Including non-PyTorch memory, this proce\nss has 23.40 GiB "
        "memory in use. Of the allocated memory 22.88 GiB is allocated by PyTorch, and 188.29 MiB is reserved "
        "by PyTorch but unallocated."
    )
    f = parse_oom_text(text)
    assert f is not None
    assert f.process_in_use_gib == 23.40
    assert f.allocated_gib == 22.88


def test_first_of_several_ranks_is_read() -> None:
    rank1 = NEW.replace("GPU 0", "GPU 1").replace("1.78 GiB is reserved", "1.62 GiB is reserved")
    f = parse_oom_text("(rank 1) " + rank1 + "\n(rank 0) " + NEW)
    assert f is not None and f.gpu == 1 and f.reserved_unallocated_gib == 1.62


def test_partial_message_keeps_what_it_has() -> None:
    f = parse_oom_text("CUDA out of memory. Tried to allocate 1.15 GiB. GPU 0 has a total capac")
    assert f is not None
    assert f.fmt == "partial"
    assert f.requested_gib == 1.15
    assert f.total_gib is None


@pytest.mark.parametrize(
    "text",
    [
        "",
        "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.",
        "ValueError: No available memory for the cache blocks.",
        "RuntimeError: CUDA error: out of memory",
    ],
)
def test_no_allocator_figures(text: str) -> None:
    assert parse_oom_text(text) is None


def test_xlas_and_tt_metals_largest_free_block_is_read() -> None:
    pjrt = parse_oom_text(
        "RESOURCE_EXHAUSTED: Error allocating device buffer: Attempting to allocate 1.96G. That was not "
        "possible. There are 3.46G free. The largest contiguous region of free memory is 1.75G due to "
        "fragmentation."
    )
    assert pjrt is not None and (pjrt.requested_gib, pjrt.free_gib, pjrt.largest_free_gib) == (
        1.96,
        3.46,
        1.75,
    )
    tt = parse_oom_text(
        "Not enough space to allocate 1879048192 B DRAM buffer across 8 banks, where each bank needs to "
        "store 234881024 B, but bank size is 4272341376 B (allocated: 3993427840 B, free: 278913536 B, "
        "largest free block: 134217728 B)"
    )
    # Per bank, as the request is: 224 MiB asked, 266 MiB free, the largest block 128 MiB.
    assert tt is not None and tt.requested_gib == 0.21875 and tt.largest_free_gib == 0.125
    assert tt.free_gib is not None and abs(tt.free_gib - 278913536 / 1024**3) < 1e-6
