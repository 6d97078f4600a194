"""Regenerate the flag lifecycles of ``operator/loadline/render/data/vllm_flags.json`` from vLLM's source.

Why a script: vLLM adds and removes ``vllm serve`` flags in most releases and an unknown flag makes the
server exit at once, so loadline checks every ``extraArgs`` flag against the chosen release's flag set.
Those sets are read from the source distributions of each release (``pip download vllm==V --no-deps
--no-binary :all:``), statically, with :mod:`ast`: no vLLM (and no torch) is imported.

Per release it collects every option string of every ``add_argument`` call in the files that build the
``vllm serve`` parser (``vllm/engine/arg_utils.py``, ``vllm/entrypoints/openai/cli_args.py``,
``vllm/entrypoints/cli/serve.py``, ``vllm/utils/argparse_utils.py``, wherever ``cli_args.py`` moved),
plus the fields of the ``*Args`` dataclasses that ``cli_args.py`` turns into flags in a loop
(``FrontendArgs``). A value type is recorded
only where it is certain: an explicit ``type=int``/``float``, ``choices=[...]`` of literals,
``store_true``/``BooleanOptionalAction``, or, for flags built from a config dataclass
(``**model_kwargs["x"]``), the ``EngineArgs``/``FrontendArgs`` field annotation when it is plainly
``int``, ``float``, ``bool`` or a ``Literal`` of strings (what vLLM's ``get_kwargs`` maps them to).

Usage: ``python scripts/vllm_flags.py SRC_ROOT`` where ``SRC_ROOT/<version>/vllm/...`` hold the unpacked
sources (for each release: ``pip download vllm==V --no-deps --no-binary :all: --no-build-isolation
--no-clean`` fetches and unpacks the sdist under ``$TMPDIR/pip-download-*`` before its build fails for
want of torch; copy its ``vllm/`` tree to ``SRC_ROOT/V/``); it rewrites the table's ``releases``,
``newest`` and each flag's ``since``/``until``/``value``, keeping the hand-written ``owner``,
``replacement`` and ``note`` of flags loadline knows more about.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path
from typing import Any

TABLE = Path(__file__).resolve().parent.parent / "operator/loadline/render/data/vllm_flags.json"
FILES = (
    "vllm/engine/arg_utils.py",
    "vllm/entrypoints/openai/cli_args.py",  # moved to launchers/ (0.29) and common/ (0.33): globbed
    "vllm/entrypoints/cli/serve.py",
    "vllm/utils/argparse_utils.py",
)
LOOP_CLASSES = ("FrontendArgs", "BaseFrontendArgs")
# Releases published as wheels only (pip finds no source distribution): their flag sets are unknown, so a
# flag first seen after such a gap is taken to exist from the first unread release on, and one last seen
# before it to exist through it. Both err towards accepting a flag rather than refusing a valid one.
UNREAD = {"0.15.0": "wheels only on PyPI", "0.15.1": "wheels only on PyPI"}


def _version_key(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def _literal_strings(node: ast.expr, aliases: dict[str, ast.expr]) -> list[str] | None:
    """The strings of ``Literal["a", "b"]`` (through a module-level alias), else None."""
    if isinstance(node, ast.Name) and node.id in aliases:
        return _literal_strings(aliases[node.id], aliases)
    if (
        isinstance(node, ast.Subscript)
        and getattr(node.value, "id", getattr(node.value, "attr", "")) == "Literal"
    ):
        items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if all(isinstance(i, ast.Constant) and isinstance(i.value, str) for i in items):
            return [i.value for i in items]  # type: ignore[union-attr]
    return None


def _members(node: ast.expr) -> list[ast.expr]:
    """``Optional[X]``, ``Union[X, None]``, ``X | None`` → the non-None members."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _members(node.left) + _members(node.right)
    if isinstance(node, ast.Subscript):
        name = getattr(node.value, "id", getattr(node.value, "attr", ""))
        if name == "Optional":
            return _members(node.slice)
        if name == "Union":
            items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            return [m for item in items for m in _members(item)]
    if isinstance(node, ast.Constant) and node.value is None:
        return []
    return [node]


def _value_of_annotation(node: ast.expr, aliases: dict[str, ast.expr]) -> dict[str, Any] | None:
    members = _members(node)
    if len(members) != 1:
        return None
    only = members[0]
    if isinstance(only, ast.Name):
        if only.id == "bool":
            return {"type": "bool"}
        if only.id in {"int", "float"}:
            return {"type": only.id}
        if only.id in aliases:
            return _value_of_annotation(aliases[only.id], aliases)
    choices = _literal_strings(only, aliases)
    if choices:
        return {"type": "choice", "choices": choices}
    return None


def _fields(tree: ast.Module, name: str) -> dict[str, ast.expr]:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return {
                item.target.id: item.annotation
                for item in node.body
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
            }
    return {}


def _aliases(trees: list[ast.Module]) -> dict[str, ast.expr]:
    out: dict[str, ast.expr] = {}
    for tree in trees:
        for node in tree.body:
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
            ):
                out[node.targets[0].id] = node.value
            elif (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and node.value is not None
            ):
                out[node.target.id] = node.value
            elif type(node).__name__ == "TypeAlias":  # ``type X = ...`` (Python 3.12 sources)
                out[node.name.id] = node.value  # type: ignore[attr-defined]
    return out


def _explicit_value(call: ast.Call) -> dict[str, Any] | None:
    """The value type an ``add_argument`` call states itself (None: not stated, or not plainly)."""
    out: dict[str, Any] | None = None
    for kw in call.keywords:
        if kw.arg == "action":
            text = ast.unparse(kw.value)
            if "store_true" in text or "store_false" in text or "BooleanOptionalAction" in text:
                return {"type": "bool"}
        if kw.arg == "type" and isinstance(kw.value, ast.Name) and kw.value.id in {"int", "float"}:
            out = {"type": kw.value.id}
        literal = isinstance(kw.value, ast.List | ast.Tuple) and all(
            isinstance(e, ast.Constant) and isinstance(e.value, str)
            for e in kw.value.elts  # type: ignore[attr-defined]
        )
        if kw.arg == "choices" and literal:
            out = {"type": "choice", "choices": [e.value for e in kw.value.elts]}  # type: ignore[attr-defined]
        if kw.arg == "nargs":
            return None  # several values: not checked
    return out


def flags_of(root: Path) -> dict[str, dict[str, Any]]:
    """Every option string of ``vllm serve`` in one release, with its value type where certain."""
    trees: list[ast.Module] = []
    paths = {root / rel for rel in FILES} | set(root.glob("vllm/entrypoints/**/cli_args.py"))
    for path in sorted(paths):
        if path.exists():
            trees.append(ast.parse(path.read_text()))
    config_trees = [ast.parse(p.read_text()) for p in sorted(root.glob("vllm/config*.py"))]
    config_trees += [ast.parse(p.read_text()) for p in sorted(root.glob("vllm/config/*.py"))]
    aliases = _aliases(trees + config_trees)
    engine_fields: dict[str, ast.expr] = {}
    loop_fields: dict[str, ast.expr] = {}
    for tree in trees:
        engine_fields.update(_fields(tree, "EngineArgs"))
        for cls in LOOP_CLASSES:
            loop_fields.update(_fields(tree, cls))
    out: dict[str, dict[str, Any]] = {}
    for tree in trees:
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument"):
                continue
            names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            names = [n for n in names if n.startswith("-")]
            if any(isinstance(a, ast.JoinedStr) for a in node.args):
                for field, annotation in loop_fields.items():
                    out.setdefault(
                        "--" + field.replace("_", "-"), {"value": _value_of_annotation(annotation, aliases)}
                    )
                continue
            if not names:
                continue
            value = _explicit_value(node)
            if value is None and not any(
                kw.arg in {"nargs", "type", "choices", "action"} for kw in node.keywords
            ):
                field = names[0][2:].replace("-", "_")
                if field in engine_fields:
                    value = _value_of_annotation(engine_fields[field], aliases)
            for name in names:
                out.setdefault(name, {"value": value, "long": names[0]})
    return out


def main(src: Path) -> None:
    versions = sorted((p.name for p in src.iterdir() if (p / "vllm").is_dir()), key=_version_key)
    per_version = {v: flags_of(src / v) for v in versions}
    table = json.loads(TABLE.read_text())
    curated = table["flags"]
    every = sorted({f for flags in per_version.values() for f in flags})
    aliases: dict[str, str] = {}
    flags: dict[str, Any] = {}
    every_release = sorted([*versions, *UNREAD], key=_version_key)
    for name in every:
        present = [v for v in versions if name in per_version[v]]
        first, last = present[0], present[-1]
        later = versions[versions.index(last) + 1 :]
        gaps = [v for v in versions[versions.index(first) : versions.index(last) + 1] if v not in present]
        info = per_version[last][name]
        if not name.startswith("--"):
            aliases[name] = info.get("long", name)
            continue
        entry: dict[str, Any] = {}
        if first != versions[0]:
            before = versions[versions.index(first) - 1]  # the last release read without it
            entry["since"] = every_release[every_release.index(before) + 1]
        if later:
            entry["until"] = later[0]
        if gaps:
            entry["absent"] = gaps
        if info["value"] is not None:
            entry["value"] = info["value"]
        keep = curated.get(name, {})
        for key in ("owner", "replacement", "note", "runs_code"):
            if key in keep:
                entry[key] = keep[key]
        entry["source"] = "vllm sdists " + (f"{first}..{last}" if first != last else first)
        hand = str(keep.get("source", ""))
        if hand.startswith("vllm sdists "):  # written by an earlier run: keep only the hand-written rest
            hand = hand.partition("; ")[2]
        if hand and hand != "engine args, all releases":
            entry["source"] += "; " + hand
        flags[name] = entry
    for name, keep in curated.items():
        if name not in flags:  # loadline policy entries (e.g. --hf-token before vLLM had it)
            flags[name] = keep
    table["releases"] = every_release
    table["unread_releases"] = UNREAD
    table["newest"] = versions[-1]
    table["aliases"] = dict(sorted({**table["aliases"], **aliases}.items()))
    table["flags"] = flags
    TABLE.write_text(json.dumps(table, indent=1) + "\n")
    print(f"{len(versions)} releases, {len(flags)} flags, {len(aliases)} aliases")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
