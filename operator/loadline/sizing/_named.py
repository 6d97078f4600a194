"""The weights of a model known only by its name: the catalog's exact count, else a lower bound read
from the name.

An incident written from a report (``loadline classify``) names the model it served and the GPU it
crashed on, but rarely the weights' size. The operator's own incidents carry the plan's figure; a
person's carry ``"model": "Qwen/Qwen3-30B-A3B"``. A catalog model is counted from its config.json as
the planner counts it. Any other name is read for what it states (``72B``, ``8x7B``, ``AWQ``,
``Q4_K_M``), and every figure taken from it is a floor (``data/name_markers.json`` says why each one
is): weights estimated from a name can say "too big for this GPU" only when the model is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

from loadline.errors import LoadlineError
from loadline.sizing._arch import parse_hf_config
from loadline.sizing._budget import DTYPE_BYTES, resolve_dtype, weights_bytes
from loadline.sizing._data import (
    CatalogModel,
    find_catalog_model,
    model_catalog,
    quantization_methods,
    read_json,
)
from loadline.sizing._params import count_parameters
from loadline.units import GIB

__all__ = ["NamedWeights", "weights_from_name"]

#: A parameter count as names write it: ``7B``, ``1.5b``, ``135M``, ``8x7B`` (experts × each), never a
#: count glued to a letter (``A3B`` is Qwen's active count, ``E4B`` Gemma 3n's effective one).
_COUNT = re.compile(r"(?<![A-Za-z0-9.])(?:(\d+)\s*[x×]\s*)?(\d+(?:\.\d+)?)\s*([bmt])(?![a-z])", re.IGNORECASE)
_SCALE = {"m": 1e-3, "b": 1.0, "t": 1e3}
#: What separates the words of a model's name when people write it instead of copying its id.
_SEPARATORS = re.compile(r"[\s_]+")


@dataclass(frozen=True)
class NamedWeights:
    """Weights of every GPU together, and how they were found."""

    gib: float
    #: Counted from the catalog's config.json (True), or a floor read from the name (False).
    exact: bool
    #: What the figure rests on, for an evidence sentence: "Qwen/Qwen3-8B in loadline's catalog: 8.19 B
    #: parameters in bfloat16".
    basis: str


@dataclass(frozen=True)
class _Marker:
    pattern: re.Pattern[str]
    #: None: the bits are the figure the name writes (the pattern's group: "3.0bpw").
    bits: float | None
    says: str
    #: Counts only when no other marker is in the name ("GGUF" beside "Q8_0" says nothing more).
    fallback: bool = False


@dataclass(frozen=True)
class _Markers:
    count_floor: float
    moe_share: float
    markers: tuple[_Marker, ...]
    ollama_bits: float
    ollama_says: str


@cache
def _markers() -> _Markers:
    raw = read_json("name_markers.json")
    return _Markers(
        count_floor=float(raw["name_count_floor"]),
        moe_share=float(raw["moe_share"]),
        markers=tuple(
            _Marker(
                re.compile(m["pattern"], re.IGNORECASE),
                None if m["bits"] == "group" else float(m["bits"]),
                str(m["says"]),
                bool(m.get("fallback", False)),
            )
            for m in raw["markers"]
        ),
        ollama_bits=float(raw["ollama_tag_bits"]),
        ollama_says=str(raw["ollama_tag_says"]),
    )


def _id_tail(name: str) -> str:
    """A model id's last part as people write it, made comparable: case folded, and a space or an
    underscore read as the hyphen Hugging Face ids use ("GPT-OSS 120B" is ``openai/gpt-oss-120b``)."""
    return _SEPARATORS.sub("-", name.strip().lower().rsplit("/", 1)[-1])


def _catalog_entry(name: str) -> CatalogModel | None:
    """The catalog model by its id, or by the id's last part when exactly one id ends with it."""
    entry = find_catalog_model(name)
    if entry is not None:
        return entry
    tail = _id_tail(name)
    ids = {model.id for key, model in model_catalog().items() if _id_tail(key) == tail}
    return find_catalog_model(ids.pop()) if len(ids) == 1 else None


def _from_catalog(entry: CatalogModel, dtype: str | None, quantization: str | None) -> NamedWeights | None:
    arch = parse_hf_config(entry.config, field_prefix=f"catalog[{entry.id}].config")
    resolved = resolve_dtype(arch, dtype if dtype in DTYPE_BYTES else "auto")
    method = quantization if quantization in quantization_methods() else None
    if method is None:
        method = arch.quantization.method if arch.quantization else "none"
        if method not in quantization_methods():
            return None
    counts = count_parameters(arch)
    gib = weights_bytes(arch, counts, resolved, method, None) / GIB
    precision = resolved if method == "none" else method
    basis = f"{entry.id} in loadline's catalog: {counts.total / 1e9:.2f} B parameters, {precision}"
    return NamedWeights(gib=gib, exact=True, basis=basis)


def _bits(text: str) -> tuple[float, str] | None:
    """The fewest bits a marker in ``text`` states, and how it says them."""
    found: list[tuple[float, str, bool]] = []
    for marker in _markers().markers:
        match = marker.pattern.search(text)
        if match is None:
            continue
        bits = marker.bits if marker.bits is not None else float(match.group(1))
        says = marker.says if marker.bits is not None else f"{bits:g} bits per weight"
        found.append((bits, says, marker.fallback))
    named = [(bits, says) for bits, says, fallback in found if not fallback]
    return min(named or [(bits, says) for bits, says, _ in found], default=None)


#: A quantization no marker knows is counted at the fewest bits any format has: the figure stays a floor.
_FEWEST_BITS = 1.5


def _name_bits(name: str, dtype: str | None, quantization: str | None) -> tuple[float, str]:
    if quantization:
        method = quantization_methods().get(quantization.strip().lower())
        if method is not None:
            return method.bits, f"{method.name} ({method.bits:g}-bit)"
        # The setting and the name together: "exl2" says the format, "-exl2-3.0" its bits.
        said = _bits(f" {quantization} {name} ")
        if said is not None:
            return said
        return _FEWEST_BITS, f"{quantization} (a quantization loadline does not know, at its fewest bits)"
    if dtype in DTYPE_BYTES:
        # vLLM serves a float32 request's weights as asked; a name's 16-bit floor still holds.
        return 8.0 * DTYPE_BYTES[dtype], dtype
    said = _bits(name)
    if said is not None:
        return said
    tag = name.rsplit("/", 1)[-1]
    if ":" in tag:
        return _markers().ollama_bits, _markers().ollama_says
    return 16.0, "16-bit (no quantization named)"


def _name_count(name: str) -> tuple[float, str] | None:
    """The largest parameter count the name states, in billions, with the floor applied."""
    m = _markers()
    best: tuple[float, str] | None = None
    for match in _COUNT.finditer(name.rsplit("/", 1)[-1]):
        experts, each, unit = match.group(1), float(match.group(2)), match.group(3).lower()
        billions = each * _SCALE[unit]
        how = match.group(0)
        if experts:
            billions *= int(experts) * m.moe_share
            how += ", experts replicating only their feed-forward blocks"
        if best is None or billions > best[0]:
            best = (billions, how)
    if best is None:
        return None
    return best[0] * m.count_floor, best[1]


def weights_from_name(
    name: str, dtype: str | None = None, quantization: str | None = None
) -> NamedWeights | None:
    """The weights of the model ``name`` (every GPU together), or None when neither the catalog nor the
    name says its size. ``dtype`` and ``quantization`` are the incident's settings when it has them
    (``quantization`` as vLLM's ``--quantization`` takes it; "none" is its default, the checkpoint's own)."""
    if not name.strip():
        return None
    if quantization is not None and quantization.strip().lower() in {"", "none"}:
        # vLLM without --quantization loads the checkpoint's own quantization_config: the name says it.
        quantization = None
    entry = _catalog_entry(name)
    if entry is not None:
        try:
            found = _from_catalog(entry, dtype, quantization)
        except LoadlineError:
            found = None
        if found is not None:
            return found
    count = _name_count(name)
    if count is None:
        return None
    billions, how = count
    bits, says = _name_bits(name, dtype, quantization)
    gib = billions * 1e9 * bits / 8 / GIB
    basis = f"the name {name.strip()!r}: at least {billions:.1f} B parameters ({how}) at {says}"
    return NamedWeights(gib=gib, exact=False, basis=basis)
