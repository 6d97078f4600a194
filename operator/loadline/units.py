"""Units shared by every package: one definition, so that a GiB means the same everywhere.

vLLM, PyTorch's allocator and ``nvidia-smi`` all report memory in binary units (``GiB``, ``MiB``), and
Kubernetes quantities such as ``24Gi`` are binary too; the sizer, the renderer and the classifier
compare their figures with each other, so they must agree on the unit.
"""

from __future__ import annotations

__all__ = ["GIB", "MIB"]

#: Bytes in a gibibyte (``Gi``, ``GiB``).
GIB = 1024**3
#: Bytes in a mebibyte (``Mi``, ``MiB``).
MIB = 1024**2
