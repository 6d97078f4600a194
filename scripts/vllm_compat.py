"""Regenerate the version columns of ``operator/loadline/sizing/data/vllm_compat.json`` from vLLM's source.

Why: whether a vLLM release can load a model is a fact of that release's source, not of loadline's
code. For each release unpacked under ``SRC_ROOT/<version>/`` (source distributions from ``pip download
vllm==V --no-deps --no-binary :all:``) this reads, with :mod:`ast` and without importing vLLM:

* ``vllm/model_executor/models/registry.py``: every architecture name in its ``_*_MODELS`` dicts (not
  ``_PREVIOUSLY_SUPPORTED_MODELS`` or ``_OOT_SUPPORTED_MODELS``), the names a checkpoint's
  ``config.json`` ``architectures`` list is matched against;
* ``vllm/model_executor/layers/quantization/__init__.py``: the ``--quantization`` methods
  (``QUANTIZATION_METHODS`` or the ``QuantizationMethods`` Literal) and, from 0.14 on,
  ``DEPRECATED_QUANTIZATION_METHODS`` (vLLM refuses those unless ``--allow-deprecated-quantization``).

It writes each name's first release (``since``; absent when already in the oldest) and the first
release without it (``until``), and keeps the hand-written checkpoint rules of the file as they are.
Usage: ``python scripts/vllm_compat.py SRC_ROOT``.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path
from typing import Any

TABLE = Path(__file__).resolve().parent.parent / "operator/loadline/sizing/data/vllm_compat.json"
# Published as wheels only: a name first seen right after them may already be in them (see lifecycle).
UNREAD = {"0.15.0": "wheels only on PyPI", "0.15.1": "wheels only on PyPI"}
SKIP = {
    "_PREVIOUSLY_SUPPORTED_MODELS",
    "_OOT_SUPPORTED_MODELS",
    "_VLLM_MODELS",
    "_TRANSFORMERS_BACKEND_MODELS",
}


def _version_key(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def architectures(root: Path) -> set[str]:
    tree = ast.parse((root / "vllm/model_executor/models/registry.py").read_text())
    out: set[str] = set()
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        if isinstance(node, ast.AnnAssign):
            target = node.target
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        if not isinstance(target, ast.Name) or not isinstance(value, ast.Dict):
            continue
        if not target.id.endswith("_MODELS") or target.id in SKIP:
            continue
        out.update(k.value for k in value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str))
    return out


def _string_list(root: Path, name: str) -> set[str]:
    """The strings of a module-level list ``name = [...]`` in the quantization package (empty if none)."""
    tree = ast.parse((root / "vllm/model_executor/layers/quantization/__init__.py").read_text())
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        if isinstance(node, ast.AnnAssign):
            target = node.target
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        if isinstance(target, ast.Name) and target.id == name and isinstance(value, ast.List):
            return {i.value for i in value.elts if isinstance(i, ast.Constant) and isinstance(i.value, str)}
    return set()


def quantization_methods(root: Path) -> set[str]:
    tree = ast.parse((root / "vllm/model_executor/layers/quantization/__init__.py").read_text())
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        if isinstance(node, ast.AnnAssign):
            target = node.target
        if not isinstance(target, ast.Name):
            continue
        value = node.value  # type: ignore[union-attr]
        if target.id == "QuantizationMethods" and isinstance(value, ast.Subscript):
            items = value.slice.elts if isinstance(value.slice, ast.Tuple) else [value.slice]
            return {i.value for i in items if isinstance(i, ast.Constant)}
        if target.id == "QUANTIZATION_METHODS" and isinstance(value, ast.List):
            return {i.value for i in value.elts if isinstance(i, ast.Constant)}
    raise SystemExit(f"{root}: no quantization method list found")


def lifecycle(name: str, versions: list[str], present: dict[str, set[str]]) -> dict[str, Any]:
    """since/until/absent of ``name``; a boundary next to an unread release errs towards support."""
    every = sorted([*versions, *UNREAD], key=_version_key)
    have = [v for v in versions if name in present[v]]
    entry: dict[str, Any] = {}
    if have[0] != versions[0]:
        before = versions[versions.index(have[0]) - 1]
        entry["since"] = every[every.index(before) + 1]
    after = versions[versions.index(have[-1]) + 1 :]
    if after:
        entry["until"] = after[0]
    gaps = [v for v in versions[versions.index(have[0]) : versions.index(have[-1])] if v not in have]
    if gaps:
        entry["absent"] = gaps
    return entry


def main(src: Path) -> None:
    versions = sorted((p.name for p in src.iterdir() if (p / "vllm").is_dir()), key=_version_key)
    archs = {v: architectures(src / v) for v in versions}
    quants = {v: quantization_methods(src / v) for v in versions}
    table = json.loads(TABLE.read_text()) if TABLE.exists() else {}
    table["releases"] = versions
    table["unread_releases"] = UNREAD
    table["architectures"] = {
        name: lifecycle(name, versions, archs) for name in sorted(set().union(*archs.values()))
    }
    deprecated = {v: _string_list(src / v, "DEPRECATED_QUANTIZATION_METHODS") for v in versions}
    table["quantization_methods"] = {}
    for name in sorted(set().union(*quants.values())):
        entry = lifecycle(name, versions, quants)
        if any(name in deprecated[v] & quants[v] for v in versions):
            # While deprecated, vLLM refuses it unless --allow-deprecated-quantization is given.
            entry["deprecated"] = lifecycle(name, versions, {v: deprecated[v] & quants[v] for v in versions})
        table["quantization_methods"][name] = entry
    order = ["_about", "releases", "unread_releases", "checkpoints", "quantization_methods", "architectures"]
    table = {key: table[key] for key in order if key in table}
    TABLE.write_text(json.dumps(table, indent=1) + "\n")
    print(
        f"{len(versions)} releases, {len(table['architectures'])} architectures, "
        f"{len(table['quantization_methods'])} quantization methods"
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
