"""Whether the roll-out that fixes a crash waits for the window: by when the crash class comes back.

A crash that recurs at every start or on the first batch leaves the model down (or crash-looping)
until the fix rolls out, so waiting for a quiet window spares no one. A crash that recurs only
intermittently (long requests, hours of fragmentation) leaves the model serving between crashes: its
roll-out waits for the window, unless the crash recurs first. The table is data
(``data/crash_recurrence.json``), from the timing table of docs/oom.md.
"""

from __future__ import annotations

import json
from functools import cache
from importlib.resources import files
from typing import Any

__all__ = ["crash_urgency"]


@cache
def _table() -> dict[str, dict[str, Any]]:
    raw = json.loads(files("loadline.maintenance").joinpath("data/crash_recurrence.json").read_text())
    table: dict[str, dict[str, Any]] = raw["classes"]
    return table


def crash_urgency(oom_class: str, repeats: int) -> str | None:
    """Why the fix of a crash of ``oom_class`` rolls out now, or None when it may wait for the window.

    ``repeats``: how many crashes of this class the same crash loop has had (1: the first). A class
    not in the table is treated as recurring at once: waiting on an unknown cause is not safe.
    """
    entry = _table().get(oom_class)
    if entry is None or not entry["waits"]:
        recurs = entry["recurs"] if entry else "at any time (a class loadline does not know)"
        return f"a {oom_class} crash recurs {recurs}: waiting for a window spares no one"
    if repeats >= 2:
        return f"the {oom_class} crash recurred ({repeats} crashes): it will not wait for the window"
    return None
