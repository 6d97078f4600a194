"""The sizing tables (GPU catalog, quantization methods, engine versions, model catalog) as typed data.

They live as JSON package data so that adding a GPU or a vLLM release is a data change reviewed as
such; this module only reads and types them, once per process.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources
from typing import Any

import yaml

from loadline.errors import SpecError
from loadline.versions import parse_release


def read_json(*parts: str) -> Any:
    """A JSON table of ``loadline/sizing/data``."""
    return _read_json(*parts)


def _read_json(*parts: str) -> Any:
    node = resources.files("loadline.sizing").joinpath("data")
    for part in parts:
        node = node.joinpath(part)
    return json.loads(node.read_text(encoding="utf-8"))


def parse_version(text: str) -> tuple[int, int, int]:
    """``"0.19.0"`` → ``(0, 19, 0)`` (:func:`loadline.versions.parse_release`); a text that is no
    version is the spec's error."""
    release = parse_release(text)
    if release is None:
        raise SpecError("spec.engine.version", f"{text!r} is not a vLLM version", "write it like 0.19.0")
    return release


@dataclass(frozen=True)
class GPUType:
    name: str
    product: str
    memory_gib: float
    gpus_per_node: tuple[int, ...]
    interconnect: str
    multi_node: bool
    compute_capability: float
    bf16: bool
    fp8: bool
    flash_attention: bool
    price_per_gpu_hour: float
    instance_types: dict[str, str]

    @property
    def max_gpus_per_node(self) -> int:
        return max(self.gpus_per_node)

    def instance_type(self, gpus: int) -> str:
        for count in sorted(self.gpus_per_node):
            if count >= gpus:
                return self.instance_types.get(str(count), "")
        return self.instance_types.get(str(self.max_gpus_per_node), "")


@dataclass(frozen=True)
class QuantMethod:
    name: str
    bits: float
    group_size: int
    scale_bytes: float
    scope: str
    min_compute_capability: float
    startup_extra_gib: float = 0.0


@dataclass(frozen=True)
class BatchDefault:
    min_memory_gib: float
    exclude_name_contains: str
    max_num_batched_tokens: int
    max_num_seqs: int


@dataclass(frozen=True)
class EngineVersion:
    since: tuple[int, int, int]
    gpu_memory_utilization: float
    block_size: int
    cuda_graph_in_kv_budget: bool
    max_cudagraph_capture_size: int
    batch_defaults: tuple[BatchDefault, ...]

    def batch_default(self, gpu_name: str, memory_gib: float) -> BatchDefault:
        """vLLM's ``max_num_batched_tokens``/``max_num_seqs`` defaults for the OpenAI server on a GPU."""
        for tier in self.batch_defaults:
            excluded = tier.exclude_name_contains and tier.exclude_name_contains.lower() in gpu_name.lower()
            if memory_gib >= tier.min_memory_gib and not excluded:
                return tier
        return self.batch_defaults[-1]


@dataclass(frozen=True)
class ModelCoefficients:
    sampler_logit_copies: float
    forward_bytes_per_token_hidden: float
    forward_bytes_per_token_intermediate: float
    moe_bytes_per_token_expert_intermediate: float
    non_torch_gib_tp1: float
    non_torch_gib_tp_base: float
    non_torch_gib_per_tp_rank: float
    cuda_graph_gib_base: float
    cuda_graph_gib_per_layer: float
    cuda_graph_gib_per_khidden_layer_per_tp: float
    cuda_graph_gib_moe_extra: float
    sampler_warmup_logit_copies: float
    weights_overhead_gib: float
    # Non-torch memory at TP >= 2 between GPUs without NVLink (no peer-to-peer buffers; engine.json).
    non_torch_gib_tp_base_pcie: float
    non_torch_gib_per_tp_rank_pcie: float


#: A JSON or YAML file of GPU entries to add to (or replace in) the bundled catalog, in its shape:
#: ``{"gpus": [{...}, ...]}``. A mounted ConfigMap works; ``loadline gpus --probe`` prints such a file.
GPU_CATALOG_ENV = "LOADLINE_GPU_CATALOG"


def _gpu_type(entry: Any, where: str) -> GPUType:
    if not isinstance(entry, dict):
        raise SpecError(where, "is not a mapping", "write each GPU as in loadline gpus --probe's output")
    try:
        return GPUType(
            name=str(entry["name"]),
            product=str(entry["product"]),
            memory_gib=float(entry["memory_gib"]),
            gpus_per_node=tuple(int(n) for n in entry["gpus_per_node"]),
            interconnect=str(entry["interconnect"]),
            multi_node=bool(entry.get("multi_node", False)),
            compute_capability=float(entry["compute_capability"]),
            bf16=bool(entry["bf16"]),
            fp8=bool(entry["fp8"]),
            flash_attention=bool(entry["flash_attention"]),
            price_per_gpu_hour=float(entry["price_per_gpu_hour"]),
            instance_types={str(k): str(v) for k, v in dict(entry.get("instance_types") or {}).items()},
        )
    except KeyError as exc:
        raise SpecError(
            f"{where}.{exc.args[0]}", "is missing", "add it (see loadline gpus --probe)"
        ) from None
    except (TypeError, ValueError) as exc:
        raise SpecError(where, f"has a value of the wrong type ({exc})", "compare with gpus.json") from None


def read_user_catalog(path: str) -> Any:
    """A user catalog file (JSON or YAML) as data; an unreadable file is one SpecError naming it."""
    try:
        with open(path, encoding="utf-8") as handle:
            return yaml.safe_load(handle)
    except OSError as exc:
        raise SpecError(
            GPU_CATALOG_ENV, f"cannot read {path}: {exc.strerror}", "point it at a file"
        ) from None
    except yaml.YAMLError as exc:
        raise SpecError(GPU_CATALOG_ENV, f"{path} is not JSON or YAML: {exc}", "fix the file") from None


def read_gpu_catalog_file(path: str) -> list[GPUType]:
    """The GPU entries of a user catalog file (JSON or YAML); a bad file is one SpecError naming it."""
    raw = read_user_catalog(path)
    entries = raw.get("gpus") if isinstance(raw, dict) else raw
    if not isinstance(entries, list):
        raise SpecError(GPU_CATALOG_ENV, f"{path} has no list under 'gpus'", 'write {"gpus": [...]}')
    gpus = [_gpu_type(entry, f"{path}: gpus[{i}]") for i, entry in enumerate(entries)]
    for i, gpu in enumerate(gpus):
        if gpu.memory_gib <= 0 or not gpu.gpus_per_node or min(gpu.gpus_per_node) < 1:
            raise SpecError(
                f"{path}: gpus[{i}]", "needs a positive memory_gib and gpus_per_node", "fix the entry"
            )
    return gpus


@cache
def gpu_catalog() -> dict[str, GPUType]:
    """The bundled GPU types, then those of the file ``LOADLINE_GPU_CATALOG`` names (same name: the
    user's entry wins), so a platform team adds a GPU without waiting for a release."""
    catalog = {}
    for i, entry in enumerate(_read_json("gpus.json")["gpus"]):
        gpu = _gpu_type(entry, f"gpus.json: gpus[{i}]")
        catalog[gpu.name] = gpu
    user_file = os.environ.get(GPU_CATALOG_ENV, "").strip()
    if user_file:
        for gpu in read_gpu_catalog_file(user_file):
            catalog[gpu.name] = gpu
    return catalog


def find_gpu(name: str, field: str = "gpu") -> GPUType:
    """Look a GPU up by catalog name or node-label product value, case-insensitively."""
    catalog = gpu_catalog()
    index = _GPU_INDEX.get(id(catalog))
    if index is None or index[0] is not catalog:
        names: dict[str, GPUType] = {}
        for gpu in catalog.values():  # the first entry with the name or product wins, as a scan would
            names.setdefault(gpu.name.lower(), gpu)
            names.setdefault(gpu.product.lower(), gpu)
        _GPU_INDEX.clear()
        index = _GPU_INDEX[id(catalog)] = (catalog, names)
    found = index[1].get(name.strip().lower())
    if found is not None:
        return found
    known = ", ".join(catalog)
    raise SpecError(field, f"unknown GPU type {name!r}", f"use one of {known}")


# The catalog's lower-cased names and products, for the catalog object it was built from (one at a time).
_GPU_INDEX: dict[int, tuple[dict[str, GPUType], dict[str, GPUType]]] = {}


@cache
def quantization_methods() -> dict[str, QuantMethod]:
    raw = _read_json("quantization.json")["methods"]
    return {
        name: QuantMethod(
            name=name,
            bits=float(entry["bits"]),
            group_size=int(entry["group_size"]),
            scale_bytes=float(entry["scale_bytes"]),
            scope=str(entry["scope"]),
            min_compute_capability=float(entry["min_compute_capability"]),
            startup_extra_gib=float(entry.get("startup_extra_gib", 0.0)),
        )
        for name, entry in raw.items()
    }


@cache
def fp8_kv_min_compute_capability() -> float:
    return float(_read_json("quantization.json")["fp8_kv_min_compute_capability"])


@cache
def _engine_table() -> tuple[tuple[EngineVersion, ...], ModelCoefficients]:
    raw = _read_json("engine.json")
    versions = []
    for entry in raw["versions"]:
        versions.append(
            EngineVersion(
                since=parse_version(entry["since"]),
                gpu_memory_utilization=float(entry["gpu_memory_utilization"]),
                block_size=int(entry["block_size"]),
                cuda_graph_in_kv_budget=bool(entry["cuda_graph_in_kv_budget"]),
                max_cudagraph_capture_size=int(entry["max_cudagraph_capture_size"]),
                batch_defaults=tuple(
                    BatchDefault(
                        min_memory_gib=float(tier["min_memory_gib"]),
                        exclude_name_contains=str(tier["exclude_name_contains"]),
                        max_num_batched_tokens=int(tier["max_num_batched_tokens"]),
                        max_num_seqs=int(tier["max_num_seqs"]),
                    )
                    for tier in entry["batch_defaults"]
                ),
            )
        )
    versions.sort(key=lambda v: v.since)
    coefficients = {k: float(v) for k, v in raw["model"].items() if not k.startswith("_")}
    return tuple(versions), ModelCoefficients(**coefficients)


@cache
def engine_version(version: str) -> EngineVersion:
    """The budgeting rules of a vLLM version (versions before 0.8, the V0 engine, are refused)."""
    wanted = parse_version(version)
    table, _ = _engine_table()
    chosen = None
    for entry in table:
        if entry.since <= wanted:
            chosen = entry
    if chosen is None:
        oldest = ".".join(str(p) for p in table[0].since)
        raise SpecError(
            "spec.engine.version",
            f"vLLM {version} predates the V1 engine loadline sizes for",
            f"use vLLM {oldest} or newer",
        )
    return chosen


#: Engines whose accounting differs from V1's, each as overrides of the V1 coefficients in
#: ``engine.json`` (``model_<engine>``). "v0" is vLLM's V0 engine (0.6.4 to 0.10 with VLLM_USE_V1=0).
ENGINES = ("v1", "v0")


def coefficients(engine: str = "v1") -> ModelCoefficients:
    """The memory model's coefficients for one engine: V1's, with the engine's own overrides."""
    base = _engine_table()[1]
    if engine == "v1":
        return base
    return _engine_coefficients(engine)


@cache
def _engine_coefficients(engine: str) -> ModelCoefficients:
    if engine not in ENGINES:
        raise ValueError(f"unknown vLLM engine {engine!r} (known: {', '.join(ENGINES)})")
    overrides = _read_json("engine.json").get(f"model_{engine}", {})
    fields = {k: float(v) for k, v in overrides.items() if not k.startswith("_")}
    return replace(_engine_table()[1], **fields)


@dataclass(frozen=True)
class CatalogModel:
    id: str
    aliases: tuple[str, ...]
    source: str
    parameters: int | None
    config: dict[str, Any]


@cache
def model_catalog() -> dict[str, CatalogModel]:
    """Bundled model configs, keyed by lower-cased repository id and alias."""
    folder = resources.files("loadline.sizing").joinpath("data").joinpath("models")
    catalog: dict[str, CatalogModel] = {}
    for item in sorted(folder.iterdir(), key=lambda p: p.name):
        if not item.name.endswith(".json"):
            continue
        raw = json.loads(item.read_text(encoding="utf-8"))
        params = raw.get("parameters")
        model = CatalogModel(
            id=raw["id"],
            aliases=tuple(raw.get("aliases", [])),
            source=str(raw.get("source", "")),
            parameters=int(params) if isinstance(params, int) else None,
            config=dict(raw["config"]),
        )
        for key in (model.id, *model.aliases):
            catalog[key.lower()] = model
    return catalog


def find_catalog_model(model_id: str) -> CatalogModel | None:
    return model_catalog().get(model_id.strip().lower())
