"""Which tensor-parallel sizes vLLM can build a model's layers for (``data/quantization.json``).

vLLM splits every MLP, expert and attention projection over the tensor-parallel ranks, and refuses to
start when a rank's shard is not a whole number of elements, or, for a block-quantized checkpoint (fp8
``weight_block_size`` [128, 128]) or a group-quantized one (GPTQ/AWQ ``group_size`` 128), not a whole
number of blocks or groups: each scale covers one block or group, so a shard cannot cut through one.
The rules, with the vLLM source each was read from, are data (``tp_alignment``); this module only
applies them. A violated rule is a sentence naming the layer, its shard and the block or group, which
the planner puts in its notes and rejections and ``loadline size`` in its refusal.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from loadline.sizing._arch import Architecture
from loadline.sizing._data import parse_version, quantization_methods

Version = tuple[int, int, int]

#: What each dimension name of the table stands for, as said in a rejection.
_DIM_TEXT = {
    "mlp": "MLP intermediate size",
    "shared_expert": "shared-expert intermediate size",
    "experts": "expert intermediate size",
    "attention": "attention projection",
    "attention_out": "attention output projection",
}


@dataclass(frozen=True)
class AlignRule:
    """One row of ``tp_alignment.rules``."""

    methods: frozenset[str]
    dims: tuple[str, ...]
    multiple: int | str  # 1, "block" or "group"
    since: Version | None
    until: Version | None
    source: str

    def applies(self, method: str, version: Version) -> bool:
        if "*" not in self.methods and method not in self.methods:
            return False
        if self.since is not None and version < self.since:
            return False
        return self.until is None or version < self.until


def _rule(raw: dict[str, Any]) -> AlignRule:
    multiple = raw["multiple"]
    if not (multiple in ("block", "group") or (isinstance(multiple, int) and multiple >= 1)):
        raise RuntimeError(f"sizing/data/quantization.json: tp_alignment multiple {multiple!r} is not known")
    unknown = set(raw["dims"]) - set(_DIM_TEXT)
    if unknown:
        raise RuntimeError(
            f"sizing/data/quantization.json: tp_alignment dims {sorted(unknown)} are not known"
        )
    return AlignRule(
        methods=frozenset(raw["methods"]),
        dims=tuple(raw["dims"]),
        multiple=multiple,
        since=parse_version(raw["since"]) if raw.get("since") else None,
        until=parse_version(raw["until"]) if raw.get("until") else None,
        source=str(raw["source"]),
    )


@cache
def alignment_rules() -> tuple[AlignRule, ...]:
    """The table's rules, read once (bundled data: a malformed row is a packaging bug)."""
    node = resources.files("loadline.sizing").joinpath("data/quantization.json")
    raw = json.loads(node.read_text(encoding="utf-8"))["tp_alignment"]["rules"]
    return tuple(_rule(entry) for entry in raw)


def _shards(arch: Architecture, dim: str, tp: int) -> list[tuple[str, int, int]]:
    """(what, whole size, size per rank) of the layers ``dim`` names, for a model that has them."""
    if dim == "mlp":
        has_mlp = not arch.is_moe or arch.num_dense_layers > 0
        return [("mlp", arch.intermediate_size, arch.intermediate_size // tp)] if has_mlp else []
    if dim == "shared_expert":
        size = arch.shared_expert_intermediate_size
        return [("shared_expert", size, size // tp)] if size else []
    if dim == "experts":
        size = arch.moe_intermediate_size
        return [("experts", size, size // tp)] if arch.is_moe and size else []
    if arch.is_mla:
        return []
    q = arch.num_attention_heads * arch.head_dim
    out = [("attention", q, q // tp)]
    if dim == "attention":
        kv_heads = max(arch.num_kv_heads // tp, 1)
        out.append(("attention", arch.num_kv_heads * arch.head_dim, kv_heads * arch.head_dim))
    return out


def _unit(rule: AlignRule, arch: Architecture, method: str) -> tuple[int, str]:
    """The multiple a shard must be of under ``rule`` for this checkpoint (0: the rule does not bind)."""
    quant = arch.quantization
    if rule.multiple == "block":
        if quant is None or quant.block is None:
            return 0, ""  # per-tensor or per-channel fp8 (online or dynamic): no blocks
        block_n, block_k = quant.block
        return math.lcm(block_n, block_k), f"weight_block_size [{block_n}, {block_k}]"
    if rule.multiple == "group":
        group = quant.group_size if quant is not None and quant.group_size is not None else None
        if group is None:
            found = quantization_methods().get(method)
            group = found.group_size if found is not None else 0
        return (group, f"group_size {group}") if group > 0 else (0, "")
    assert isinstance(rule.multiple, int)
    return rule.multiple, ""


def tp_problem(arch: Architecture, quantization: str, version: str, tp: int) -> str:
    """Why vLLM ``version`` cannot build the model's layers at tensor-parallel size ``tp`` with this
    quantization (empty: it can). Memoised per architecture (by identity), method, version and size."""
    key = (id(arch), quantization, version, tp)
    found = _PROBLEMS.get(key)
    if found is None or found[0] is not arch:
        if len(_PROBLEMS) >= 4096:
            _PROBLEMS.clear()
        found = _PROBLEMS[key] = (arch, _problem(arch, quantization, parse_version(version), tp))
    return found[1]


_PROBLEMS: dict[tuple[int, str, str, int], tuple[Architecture, str]] = {}


def _problem(arch: Architecture, method: str, version: Version, tp: int) -> str:
    if tp <= 1:
        return ""
    for rule in alignment_rules():
        if not rule.applies(method, version):
            continue
        unit, named = _unit(rule, arch, method)
        if not unit:
            continue
        for dim in rule.dims:
            for what, size, shard in _shards(arch, dim, tp):
                if size % tp:
                    return f"{_DIM_TEXT[what]} {size} does not split into {tp} equal shards"
                if unit > 1 and shard % unit:
                    return (
                        f"{_DIM_TEXT[what]} {size} / TP {tp} = {shard} per rank is not a multiple of the "
                        f"checkpoint's {named} ({method}; vLLM refuses to load it)"
                    )
    return ""


def head_problem(arch: Architecture, tp: int) -> str:
    """Why the attention heads do not split over ``tp`` ranks (vLLM's own check: the query heads divide
    evenly, and the KV heads either divide evenly or are replicated a whole number of times)."""
    heads, kv_heads = arch.num_attention_heads, arch.num_kv_heads
    if heads % tp:
        return f"{tp} does not divide the model's {heads} attention heads"
    if kv_heads % tp and tp % kv_heads:
        return f"{tp} neither divides the model's {kv_heads} KV heads nor is a multiple of them"
    return ""
