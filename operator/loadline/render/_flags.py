"""The vLLM flag table (``data/vllm_flags.json``) as typed data, and the questions asked of it.

vLLM adds and removes command-line flags between releases, and an unknown flag or a bad value makes
``vllm serve`` exit at once, after the pod was scheduled and the image pulled. The table (generated from
each release's source by ``scripts/vllm_flags.py``) says which flags exist in which release and what
value each takes; this module only interprets it, so a new vLLM release is a data change. Questions: does
version V have flag F, how does V start its server, and are a CR's ``extraArgs`` valid for V: every
flag known to V, every value of the type V parses (errors name the offending list entry and the fix).
A version newer than the table is checked as the newest release the table knows.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from loadline.errors import RenderError, SpecError
from loadline.sizing import parse_version

Version = tuple[int, int, int]

# A token that looks like a flag: "-x" or "--name", optionally "=value". Anything else ("- item", "---",
# a bare value) is a value of the preceding flag.
_FLAG_RE = re.compile(r"^(--?[A-Za-z0-9][A-Za-z0-9._-]*)(=.*)?$", re.DOTALL)
# The shape spec.engine.version allows (an optional "v" for the CLI); the version also names the image tag.
_VERSION_RE = re.compile(r"^v?[0-9]+\.[0-9]+(\.[0-9]+)?([.+-][0-9A-Za-z.+-]*)?$")


def _version_text(version: Version) -> str:
    return ".".join(str(part) for part in version)


@dataclass(frozen=True)
class FlagSpec:
    """One flag's lifecycle: present when ``since <= version < until``."""

    name: str
    since: Version | None
    until: Version | None
    owner: str
    replacement: str
    note: str
    source: str
    absent: tuple[Version, ...] = ()
    value: ValueSpec | None = None
    runs_code: str = ""  # which code from outside the image the flag makes vLLM run (empty: none)

    def present_in(self, version: Version) -> bool:
        if self.since is not None and version < self.since:
            return False
        if version in self.absent:
            return False
        return self.until is None or version < self.until

    def absence(self, version: Version) -> str:
        """Why ``version`` lacks the flag, in words (empty when it has it)."""
        if self.since is not None and version < self.since:
            return f"{self.name} was added in vLLM {_version_text(self.since)}"
        if self.until is not None and version >= self.until:
            return f"{self.name} was removed in vLLM {_version_text(self.until)}"
        if version in self.absent:
            return f"{self.name} is missing from vLLM {_version_text(version)} alone"
        return ""


@dataclass(frozen=True)
class ValueSpec:
    """What a flag's value must be, where vLLM's parser says so plainly."""

    type: Literal["int", "float", "bool", "choice"]
    choices: tuple[str, ...] = ()

    def problem(self, value: str) -> str:
        """Why vLLM's parser would refuse ``value`` (empty when it accepts it)."""
        if self.type == "int":
            try:
                int(value)
            except ValueError:
                return f"{value!r} is not an integer"
        elif self.type == "float":
            try:
                number = float(value)
            except ValueError:
                return f"{value!r} is not a number"
            if not math.isfinite(number):
                return f"{value!r} is not a finite number"
        elif self.type == "choice" and value not in self.choices:
            return f"{value!r} is not one of {', '.join(self.choices)}"
        return ""


class _RawValue(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["int", "float", "bool", "choice"]
    choices: list[str] = Field(default_factory=list)


class _RawFlag(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    since: str | None = None
    until: str | None = None
    absent: list[str] = Field(default_factory=list)
    value: _RawValue | None = None
    owner: str = ""
    replacement: str = ""
    note: str = ""
    runs_code: str = ""
    source: str = Field(min_length=1)


class _RawLauncher(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    since: str
    command: list[str]
    model: str
    source: str


class _RawTable(BaseModel):
    """The JSON file's shape: a malformed table fails on load, naming the entry, not mid-render."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    about: str = Field(alias="_about")
    oldest: str
    newest: str
    newest_source: str
    releases: list[str]
    unread_releases: dict[str, str] = Field(default_factory=dict)
    launchers: list[_RawLauncher]
    aliases: dict[str, str]
    flags: dict[str, _RawFlag]


@dataclass(frozen=True)
class Launcher:
    """How a range of versions starts the OpenAI-compatible server."""

    since: Version
    command: tuple[str, ...]
    model: str  # "positional" or the flag that names the model
    source: str


@dataclass(frozen=True)
class FlagTable:
    """The whole table, typed."""

    oldest: Version
    newest: Version
    releases: tuple[Version, ...]
    launchers: tuple[Launcher, ...]
    aliases: dict[str, str]
    flags: dict[str, FlagSpec]

    def spec(self, flag: str) -> FlagSpec | None:
        """The table entry of a flag as written on a command line (aliases, ``--no-`` and ``_`` folded)."""
        name = canonical_flag(flag, self.aliases)
        if name in self.flags:
            return self.flags[name]
        if name.startswith("--no-"):
            # argparse.BooleanOptionalAction gives every boolean flag a --no- twin.
            entry = self.flags.get("--" + name[len("--no-") :])
            switch = entry is not None and entry.value is not None and entry.value.type == "bool"
            return entry if switch else None
        return None

    def has(self, flag: str, version: Version) -> bool:
        """Whether ``version`` (or, past the table, its newest release) accepts ``flag``."""
        entry = self.spec(flag)
        return entry is not None and entry.present_in(min(version, self.newest))

    def launcher(self, version: Version) -> Launcher:
        chosen = self.launchers[0]
        for launcher in self.launchers:
            if launcher.since <= version:
                chosen = launcher
        return chosen


def canonical_flag(flag: str, aliases: dict[str, str]) -> str:
    """``--max_model_len`` → ``--max-model-len``; ``--foo.bar`` → ``--foo``; ``-tp`` → its long name.

    vLLM's argument parser accepts underscores for dashes and, for JSON-valued options, dotted
    sub-keys (``--compilation-config.level``); both name the same flag.
    """
    if flag in aliases:
        return aliases[flag]
    if flag.startswith("-O") and not flag.startswith("--"):
        # vLLM's FlexibleArgumentParser reads -O3, -O=3 and -O.level=3 as the optimization (compilation)
        # level in every release (vllm/utils argparse code); the value is not checked here.
        return "-O"
    if not flag.startswith("--"):
        return flag
    name = "--" + flag[2:].replace("_", "-")
    return name.split(".", 1)[0]


def _parse(text: str | None) -> Version | None:
    return parse_version(text) if text else None


def _flag_spec(name: str, raw: _RawFlag) -> FlagSpec:
    value = None
    if raw.value is not None:
        value = ValueSpec(raw.value.type, tuple(raw.value.choices))
    return FlagSpec(
        name=name,
        since=_parse(raw.since),
        until=_parse(raw.until),
        owner=raw.owner,
        replacement=raw.replacement,
        note=raw.note,
        source=raw.source,
        absent=tuple(parse_version(v) for v in raw.absent),
        value=value,
        runs_code=raw.runs_code,
    )


@cache
def flag_table() -> FlagTable:
    """The table, read once per process and validated with pydantic at this boundary."""
    node = resources.files("loadline.render").joinpath("data").joinpath("vllm_flags.json")
    try:
        raw = _RawTable.model_validate_json(node.read_text(encoding="utf-8"))
    except ValidationError as exc:  # a packaging bug, not user input
        raise RuntimeError(f"render/data/vllm_flags.json is malformed: {exc}") from None
    launchers = tuple(
        sorted(
            (
                Launcher(
                    since=parse_version(entry.since),
                    command=tuple(entry.command),
                    model=entry.model,
                    source=entry.source,
                )
                for entry in raw.launchers
            ),
            key=lambda launcher: launcher.since,
        )
    )
    aliases = dict(raw.aliases)
    aliases.setdefault("-O", "-O")
    flags = {name: _flag_spec(name, entry) for name, entry in raw.flags.items()}
    flags.setdefault(
        "-O",
        FlagSpec("-O", None, None, "", "", "", "vllm argparse: -O<level> in every release"),
    )
    return FlagTable(
        oldest=parse_version(raw.oldest),
        newest=parse_version(raw.newest),
        releases=tuple(parse_version(v) for v in raw.releases),
        launchers=launchers,
        aliases=aliases,
        flags=flags,
    )


def resolve_version(text: str, field: str) -> Version:
    """Parse and range-check the vLLM version manifests are rendered for."""
    table = flag_table()
    if len(text) > 40 or not _VERSION_RE.match(text):
        raise RenderError(field, f"{text!r} is not a vLLM version", "write it like 0.19.0")
    try:
        version = parse_version(text)
    except SpecError:  # parse_version names spec.engine.version; re-aim the error at our field
        raise RenderError(field, f"{text!r} is not a vLLM version", "write it like 0.19.0") from None
    if version < table.oldest:
        raise RenderError(
            field,
            f"vLLM {text} predates the V1 engine loadline renders for",
            f"use vLLM {_version_text(table.oldest)} or newer",
        )
    return version


def split_flag(token: str) -> tuple[str, str | None] | None:
    """``"--a=b"`` → ``("--a", "b")``, ``"--a"`` → ``("--a", None)``, a value → ``None``."""
    match = _FLAG_RE.match(token)
    if match is None:
        return None
    name, rest = match.group(1), match.group(2)
    return name, (rest[1:] if rest is not None else None)


def _is_value(token: str) -> bool:
    """A token that is a value, not a flag: anything not shaped like one, and negative numbers."""
    if split_flag(token) is None:
        return True
    try:
        float(token)
    except ValueError:
        return False
    return True


def extra_args_problems(args: list[str], version: Version) -> list[RenderError]:
    """Every extra argument ``vllm serve`` of ``version`` would refuse, or that overrides loadline,
    one error per problem (so one ``kubectl apply`` names them all).

    Every flag must be one of the version's (a version newer than the table is checked as the newest
    release it knows); a flag with a known value type gets a value of that type (a switch gets none);
    a value must follow a flag. Each error names ``spec.engine.extraArgs[i]``.
    """
    table = flag_table()
    checked = min(version, table.newest)
    shown = _version_text(checked)
    problems: list[RenderError] = []
    index = 0
    while index < len(args):
        token = args[index]
        field = f"spec.engine.extraArgs[{index}]"
        if _is_value(token):
            problems.append(
                RenderError(
                    field,
                    f"{token!r} is a value with no flag before it that takes one",
                    "put it after its flag (e.g. ['--seed', '7']) or write --flag=value",
                )
            )
            index += 1
            continue
        name, inline = split_flag(token) or (token, None)
        index += 1
        entry = table.spec(name)
        problem = _flag_problem(name, entry, checked, shown, field)
        if problem is not None or entry is None:  # (entry None always has a problem)
            if problem is not None:
                problems.append(problem)
            if inline is None:  # its values are not judged on their own
                while index < len(args) and _is_value(args[index]):
                    index += 1
            continue
        kind = entry.value
        if kind is None or name == "-O":
            # A value vLLM parses itself (JSON, paths, lists): the values that follow belong to it.
            if inline is None:
                while index < len(args) and _is_value(args[index]):
                    index += 1
            continue
        if kind.type == "bool":
            if inline is not None:
                problems.append(
                    RenderError(
                        field,
                        f"{name} is a switch and takes no value",
                        f"write {name} alone to turn it on"
                        + (
                            f" or --no-{entry.name[2:]} to turn it off"
                            if not name.startswith("--no-")
                            else ""
                        ),
                    )
                )
            continue
        if inline is None:
            if index >= len(args) or not _is_value(args[index]):
                problems.append(
                    RenderError(field, f"{name} needs a value", f"write {name}=VALUE or follow it with one")
                )
                continue
            value, value_field = args[index], f"spec.engine.extraArgs[{index}]"
            index += 1
        else:
            value, value_field = inline, field
        wrong = kind.problem(value)
        if wrong:
            wanted = {"int": "an integer", "float": "a number", "choice": f"one of {', '.join(kind.choices)}"}
            problems.append(RenderError(value_field, f"{name}: {wrong}", f"give {wanted[kind.type]}"))
    return problems


def _flag_problem(
    name: str, entry: FlagSpec | None, checked: Version, shown: str, field: str
) -> RenderError | None:
    """Why ``name`` cannot be given at all: unknown, owned by loadline, or absent from the version."""
    if entry is None:
        return RenderError(
            field,
            f"vLLM {shown} has no flag {name}",
            f"check its spelling (`vllm serve --help` of vLLM {shown} lists the flags) or remove it",
        )
    if entry.owner:
        return RenderError(
            field,
            f"{name} is set by loadline from {entry.owner}",
            f"remove it from extraArgs and set {entry.owner} instead",
        )
    if not entry.present_in(checked):
        fix = f"remove {name}"
        if entry.replacement:
            fix += f" ({entry.replacement})"
        fix += " or pick a spec.engine.version that has it"
        return RenderError(field, f"vLLM {shown} has no {name}: {entry.absence(checked)}", fix)
    return None


@dataclass(frozen=True)
class CodeFlag:
    """A flag of ``extraArgs`` the table marks ``runs_code``: where it is, its name, which code it runs."""

    index: int
    name: str  # the table's name (aliases, underscores and dotted sub-keys folded)
    runs_code: str


def code_flags(args: list[str]) -> list[CodeFlag]:
    """The flags among ``args`` that make vLLM run code from outside its image (the table's
    ``runs_code``). A switch's ``--no-`` twin turns it off and is not one of them."""
    table = flag_table()
    found: list[CodeFlag] = []
    for index, token in enumerate(args):
        parsed = split_flag(token)
        if parsed is None or parsed[0].startswith("--no-"):
            continue
        entry = table.spec(parsed[0])
        if entry is not None and entry.runs_code:
            found.append(CodeFlag(index, entry.name, entry.runs_code))
    return found


def check_extra_args(args: list[str], version: Version) -> None:
    """Raise the first of :func:`extra_args_problems` (the renderer stops at the first)."""
    problems = extra_args_problems(args, version)
    if problems:
        raise problems[0]


def beyond_table(version: Version) -> str:
    """The warning for a version newer than the table (empty when the table knows it): it is still
    rendered, with the newest known flag set, since a new release mostly keeps the old flags."""
    newest = flag_table().newest
    if version <= newest:
        return ""
    return (
        f"vLLM {_version_text(version)} is newer than loadline's flag table (newest "
        f"{_version_text(newest)}); flags were checked as for {_version_text(newest)}"
    )


def version_text(version: Version) -> str:
    """``(0, 19, 0)`` → ``"0.19.0"``."""
    return _version_text(version)
