"""Flags that cannot work together with what loadline renders (``data/vllm_conflicts.json``).

``check_extra_args`` asks whether vLLM *accepts* each flag; this module asks whether the flags given
*fit the plan*: a flag that resizes the KV cache behind the planner's back, starts engine copies on GPUs
the pod does not have, fights a flag loadline renders, or needs the allocator loadline configures off.
Each refusal names the ``extraArgs`` entry and the fix; the rules and their vLLM sources are data.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from loadline.errors import RenderError
from loadline.render._flags import canonical_flag, flag_table, split_flag
from loadline.sizing import parse_version

Version = tuple[int, int, int]
Kind = Literal["allocator_pool", "replaces_plan", "excludes_rendered", "needs_tokens_for_max_model_len"]


class _Rule(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    flag: str
    kind: Kind
    problem: str
    fix: str
    source: str = Field(min_length=1)
    above: float | None = None
    rendered: str = ""
    field: str = ""
    since: str | None = None
    until: str | None = None


class _Table(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    about: str = Field(alias="_about")
    rules: list[_Rule]


@cache
def _rules() -> tuple[_Rule, ...]:
    node = resources.files("loadline.render").joinpath("data").joinpath("vllm_conflicts.json")
    try:
        return tuple(_Table.model_validate_json(node.read_text(encoding="utf-8")).rules)
    except ValidationError as exc:  # a packaging bug, not user input
        raise RuntimeError(f"render/data/vllm_conflicts.json is malformed: {exc}") from None


@dataclass(frozen=True)
class Given:
    """One flag of ``extraArgs``: its canonical name, list index and value (None: none given)."""

    name: str
    index: int
    value: str | None


def given_flags(args: list[str]) -> list[Given]:
    """The flags of an argument list with their values (``--a=b``, or ``--a b`` when ``b`` is a value)."""
    aliases = flag_table().aliases
    out: list[Given] = []
    for index, token in enumerate(args):
        parsed = split_flag(token)
        if parsed is None:
            continue
        name, value = parsed
        if value is None and index + 1 < len(args) and split_flag(args[index + 1]) is None:
            value = args[index + 1]
        out.append(Given(canonical_flag(name, aliases), index, value))
    return out


def _applies(rule: _Rule, version: Version) -> bool:
    if rule.since is not None and version < parse_version(rule.since):
        return False
    return rule.until is None or version < parse_version(rule.until)


def allocator_pool_flags(args: list[str], version: Version) -> list[Given]:
    """The given flags that make vLLM allocate through its own pool (expandable segments must be off)."""
    pooled = {r.flag for r in _rules() if r.kind == "allocator_pool" and _applies(r, version)}
    return [g for g in given_flags(args) if g.name in pooled]


def check_conflicts(
    args: list[str],
    version: Version,
    *,
    rendered: list[str],
    max_model_len: int,
    max_num_batched_tokens: int,
) -> None:
    """Refuse extra flags that undo the plan or clash with the flags loadline rendered (``rendered``)."""
    by_flag: dict[str, list[_Rule]] = {}
    for rule in _rules():
        if _applies(rule, version):
            by_flag.setdefault(rule.flag, []).append(rule)
    for given in given_flags(args):
        for rule in by_flag.get(given.name, []):
            field = f"spec.engine.extraArgs[{given.index}]"
            if rule.kind == "replaces_plan":
                if rule.above is not None:
                    try:
                        if given.value is None or float(given.value) <= rule.above:
                            continue
                    except ValueError:
                        continue  # check_extra_args names a malformed value
                raise RenderError(field, f"{given.name} {rule.problem}", rule.fix)
            if rule.kind == "excludes_rendered" and rule.rendered in rendered:
                raise RenderError(
                    field, f"{given.name} cannot be used with {rule.field}: {rule.problem}", rule.fix
                )
            if rule.kind == "needs_tokens_for_max_model_len" and max_num_batched_tokens < max_model_len:
                raise RenderError(
                    field,
                    f"{given.name}: {rule.problem} ({max_num_batched_tokens} < {max_model_len})",
                    rule.fix,
                )
