"""Why a difference is there, and whether it may wait: the table of render changes by version.

``data/render_changes.json`` lists what loadline changed in the pods it renders, by the version that
made the change, each with the reason in words and an ``urgent`` flag for a fix of an out-of-memory
class. A difference the table explains is urgent only when the table says so; one it does not explain
is ordinary (it is this version's rendering, without a recorded reason: it waits for the window).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib.resources import files
from typing import Any

from packaging.version import InvalidVersion, Version

from loadline.upgrade._diff import Difference

__all__ = ["Explained", "RenderChange", "explain", "render_changes"]


@dataclass(frozen=True)
class RenderChange:
    """One row of the table."""

    since: Version
    kind: str
    name: str
    why: str
    urgent: bool
    oom_class: str | None = None

    def matches(self, difference: Difference) -> bool:
        if difference.kind != self.kind:
            return False
        if self.name.endswith("*"):
            return difference.name.startswith(self.name[:-1])
        return difference.name == self.name


@dataclass(frozen=True)
class Explained:
    """The differences with their reasons: ``lines`` (one sentence each), and whether any is urgent."""

    lines: tuple[str, ...]
    urgent: bool
    #: The out-of-memory classes the urgent changes fix.
    oom_classes: tuple[str, ...] = ()

    @property
    def summary(self) -> str:
        return "; ".join(self.lines)


@cache
def render_changes() -> tuple[RenderChange, ...]:
    """The table, validated once: a row with a bad version is an error in the package, not input."""
    raw: dict[str, Any] = json.loads(
        files("loadline.upgrade").joinpath("data/render_changes.json").read_text()
    )
    return tuple(
        RenderChange(
            since=Version(row["since"]),
            kind=row["kind"],
            name=row["name"],
            why=row["why"],
            urgent=bool(row["urgent"]),
            oom_class=row.get("oomClass"),
        )
        for row in raw["changes"]
    )


def _version(text: str | None) -> Version | None:
    try:
        return Version(text) if text else None
    except InvalidVersion:
        return None


def explain(differences: Sequence[Difference], rendered_by: str | None, current: str) -> Explained:
    """Each difference with the reason the table gives for it, counting the rows that came after the
    version that rendered the live children (``rendered_by``; None or unreadable: before loadline
    stamped them, so every row up to ``current`` counts)."""
    since, now = _version(rendered_by), _version(current)
    rows = [
        row
        for row in render_changes()
        if (since is None or row.since > since) and (now is None or row.since <= now)
    ]
    lines: list[str] = []
    urgent = False
    classes: list[str] = []
    for difference in differences:
        row = next((r for r in rows if r.matches(difference)), None)
        if row is None:
            lines.append(f"{difference.words}: this version renders it so")
            continue
        lines.append(
            f"{difference.words}: {row.why}" + (f" (fixes {row.oom_class} OOMs)" if row.urgent else "")
        )
        if row.urgent:
            urgent = True
            if row.oom_class and row.oom_class not in classes:
                classes.append(row.oom_class)
    return Explained(tuple(lines), urgent, tuple(classes))
