"""The vLLM flag table (``data/vllm_flags.json``) as typed data, and the questions asked of it.

vLLM adds and removes command-line flags between releases, and an unknown flag makes ``vllm serve``
exit at once. The table says which flags exist in which release; this module only interprets it, so a
new vLLM release is a data change. Questions: does version V have flag F, how does V start its server,
and are a CR's ``extraArgs`` valid for V (errors name the offending list entry and the fix).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

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

    def present_in(self, version: Version) -> bool:
        if self.since is not None and version < self.since:
            return False
        return self.until is None or version < self.until

    def absence(self, version: Version) -> str:
        """Why ``version`` lacks the flag, in words (empty when it has it)."""
        if self.since is not None and version < self.since:
            return f"{self.name} was added in vLLM {_version_text(self.since)}"
        if self.until is not None and version >= self.until:
            return f"{self.name} was removed in vLLM {_version_text(self.until)}"
        return ""


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
            return self.flags.get("--" + name[len("--no-") :])
        return None

    def has(self, flag: str, version: Version) -> bool:
        """Whether ``version`` accepts ``flag``; flags the table does not know are assumed present."""
        entry = self.spec(flag)
        return entry is None or entry.present_in(version)

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
    if not flag.startswith("--"):
        return flag
    name = "--" + flag[2:].replace("_", "-")
    return name.split(".", 1)[0]


def _parse(text: str | None) -> Version | None:
    return parse_version(text) if text else None


@cache
def flag_table() -> FlagTable:
    """The table, read once per process."""
    node = resources.files("loadline.render").joinpath("data").joinpath("vllm_flags.json")
    raw: dict[str, Any] = json.loads(node.read_text(encoding="utf-8"))
    flags = {
        name: FlagSpec(
            name=name,
            since=_parse(entry.get("since")),
            until=_parse(entry.get("until")),
            owner=str(entry.get("owner", "")),
            replacement=str(entry.get("replacement", "")),
            note=str(entry.get("note", "")),
            source=str(entry["source"]),
        )
        for name, entry in raw["flags"].items()
    }
    launchers = tuple(
        sorted(
            (
                Launcher(
                    since=parse_version(entry["since"]),
                    command=tuple(entry["command"]),
                    model=str(entry["model"]),
                    source=str(entry["source"]),
                )
                for entry in raw["launchers"]
            ),
            key=lambda launcher: launcher.since,
        )
    )
    return FlagTable(
        oldest=parse_version(raw["oldest"]),
        newest=parse_version(raw["newest"]),
        releases=tuple(parse_version(v) for v in raw["releases"]),
        launchers=launchers,
        aliases=dict(raw["aliases"]),
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


def check_extra_args(args: list[str], version: Version) -> None:
    """Refuse extra arguments the version lacks or that would override what loadline renders.

    Raises :class:`RenderError` naming ``spec.engine.extraArgs[i]``. Flags the table does not know
    pass: the table records known lifecycles, not every flag vLLM has.
    """
    table = flag_table()
    for index, token in enumerate(args):
        parsed = split_flag(token)
        if parsed is None:
            continue
        name = parsed[0]
        entry = table.spec(name)
        if entry is None:
            continue
        field = f"spec.engine.extraArgs[{index}]"
        if entry.owner:
            raise RenderError(
                field,
                f"{name} is set by loadline from {entry.owner}",
                f"remove it from extraArgs and set {entry.owner} instead",
            )
        if not entry.present_in(version):
            why = entry.absence(version)
            fix = f"remove {name}"
            if entry.replacement:
                fix += f" ({entry.replacement})"
            fix += " or pick a spec.engine.version that has it"
            raise RenderError(field, f"vLLM {_version_text(version)} has no {name}: {why}", fix)


def version_text(version: Version) -> str:
    """``(0, 19, 0)`` → ``"0.19.0"``."""
    return _version_text(version)
