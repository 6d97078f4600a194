"""What a vLLM pod downloads before it can start: the checkpoint's files, not the weights on the GPUs.

The two differ whenever vLLM quantizes at load time: ``quantization: fp8`` (or bitsandbytes, or
experts_int8) of a bf16 checkpoint holds ~1 byte per weight on the GPUs but downloads 2. Sizing the
model cache and the start-up probe from the GPU figure gets the pod evicted mid-download (the
emptyDir's ``sizeLimit``) or killed by its start-up probe. So the download is sized from the
checkpoint's own format: its ``torch_dtype``, or the pre-quantized format its ``quantization_config``
names. Bytes per parameter of each format are data (``data/checkpoint_formats.json``, with sources).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from loadline.sizing._arch import Architecture
from loadline.sizing._params import count_parameters
from loadline.units import GIB


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class CheckpointFormat(_Strict):
    """How a pre-quantized format stores the weights of its scope."""

    bits: float = Field(gt=0, le=16)
    group_size: int = Field(ge=0)
    group_bits: float = Field(ge=0)
    scope: Literal["linear", "experts"]
    source: str = Field(min_length=1)

    def bits_per_weight(self, bits: float | None, group_size: int | None) -> float:
        """Bits of one quantized weight with its share of the group's scale (the config's own bits
        and group size win over the table's defaults)."""
        group = self.group_size if group_size is None else group_size
        overhead = self.group_bits / group if group > 0 else 0.0
        return (bits or self.bits) + overhead


class _Margin(_Strict):
    fixed_gib: float = Field(ge=0)
    fraction: float = Field(ge=0, lt=1)


class CheckpointFormats(_Strict):
    """``data/checkpoint_formats.json``, validated once at the package boundary."""

    about: str = Field(alias="_about")
    default_dtype: str
    dtype_bytes: dict[str, float]
    margin: _Margin
    aliases: dict[str, str]
    formats: dict[str, CheckpointFormat]


@cache
def checkpoint_formats() -> CheckpointFormats:
    text = resources.files("loadline.sizing").joinpath("data/checkpoint_formats.json").read_text("utf-8")
    return CheckpointFormats.model_validate_json(text)


@dataclass(frozen=True)
class CheckpointDownload:
    """The bytes one pod downloads for a model, and what they were sized from."""

    weights_bytes: int
    margin_bytes: int
    format: str  # e.g. "bfloat16", "awq 4-bit (bfloat16 rest)"
    parameters: int

    @property
    def bytes(self) -> int:
        return self.weights_bytes + self.margin_bytes

    @property
    def gib(self) -> float:
        return self.bytes / GIB


def _dtype_bytes(arch: Architecture, table: CheckpointFormats) -> tuple[str, float]:
    name = (arch.torch_dtype or table.default_dtype).replace("torch.", "")
    if name not in table.dtype_bytes:
        name = table.default_dtype
    return name, table.dtype_bytes[name]


def checkpoint_download(arch: Architecture, exact_parameters: int | None = None) -> CheckpointDownload:
    """Download size of the checkpoint ``arch`` describes: parameters × the bytes its files store
    each in, plus a margin for tokenizer/config files and safetensors headers.

    Independent of ``spec.dtype`` and ``spec.quantization``: vLLM casts and quantizes after the
    download. ``exact_parameters`` (the catalog's count) scales the estimate, as for the weights.
    """
    table = checkpoint_formats()
    counts = count_parameters(arch)
    dtype, full = _dtype_bytes(arch, table)
    quant = arch.quantization
    method = table.aliases.get(quant.method, quant.method) if quant is not None else ""
    fmt = table.formats.get(method)
    if quant is None or fmt is None:
        weights = counts.total * full
        label = dtype if quant is None else f"{dtype} (unknown format {quant.method!r}: sized unquantized)"
    else:
        if fmt.scope == "experts":
            quantized = counts.experts
        else:
            quantized = counts.linear
            # Checkpoints that keep attention unquantized (gpt-oss style) say so by module name.
            if any("attn" in name for name in quant.not_converted):
                quantized -= counts.attention
        bits = fmt.bits_per_weight(quant.bits, quant.group_size)
        weights = quantized * bits / 8.0 + (counts.total - quantized) * full
        shown = quant.bits or fmt.bits
        label = f"{method} {shown:g}-bit ({dtype} rest)"
    parameters = counts.total
    if exact_parameters and counts.total:
        weights *= exact_parameters / counts.total
        parameters = exact_parameters
    margin = table.margin.fixed_gib * GIB + table.margin.fraction * weights
    return CheckpointDownload(
        weights_bytes=math.ceil(weights), margin_bytes=math.ceil(margin), format=label, parameters=parameters
    )
