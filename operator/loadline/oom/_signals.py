"""The classifier's tables: text patterns, signal weights and thresholds (``data/signals.json``) and the
field guide's timing table (``data/timing.json``).

Kept as data so that a new vLLM error wording, a retuned weight or a timing row is a one-line change that
the corpus tests then check, not a code change.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from loadline.oom._model import CAUSES, OomClass

__all__ = ["Opening", "Signal", "Tables", "TimingRow", "tables"]


@dataclass(frozen=True)
class Signal:
    """One kind of evidence: what it adds to (or takes from) each class, and how to say it."""

    id: str
    weights: dict[OomClass, float]
    evidence: str


@dataclass(frozen=True)
class TimingRow:
    """One row of the field guide's timing table: a moment of the pod's life and the class it points to."""

    id: str
    oom_class: OomClass
    confidence: float
    when: str


#: The opening of a known message: the head to find and the rest the text may end inside.
Opening = tuple[re.Pattern[str], str]


@dataclass(frozen=True)
class Tables:
    patterns: dict[str, re.Pattern[str]]
    #: Per fact, the openings of the messages that state it (see ``openings`` in signals.json).
    openings: dict[str, tuple[Opening, ...]]
    signals: dict[str, Signal]
    thresholds: dict[str, float]
    timing: dict[str, TimingRow]
    timing_thresholds: dict[str, float]

    def threshold(self, name: str) -> float:
        return self.thresholds[name]

    def timing_threshold(self, name: str) -> float:
        return self.timing_thresholds[name]


def _load_raw(name: str) -> dict[str, Any]:
    text = resources.files("loadline.oom").joinpath(f"data/{name}").read_text(encoding="utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def _timing_rows(raw: dict[str, Any]) -> dict[str, TimingRow]:
    rows: dict[str, TimingRow] = {}
    for rid, spec in raw["rows"].items():
        cls = OomClass(spec["class"])
        if cls is OomClass.UNKNOWN:
            raise ValueError(f"timing row {rid}: a row must name a cause, not 'unknown'")
        confidence = float(spec["confidence"])
        if not 0.0 < confidence <= 1.0:
            raise ValueError(f"timing row {rid}: confidence {confidence} is not in (0, 1]")
        rows[rid] = TimingRow(id=rid, oom_class=cls, confidence=confidence, when=str(spec["when"]))
    return rows


@cache
def tables() -> Tables:
    """The parsed tables (read once). Unknown class names in the data fail loudly, at first use."""
    raw = _load_raw("signals.json")
    timing = _load_raw("timing.json")
    patterns = {name: re.compile(rx, re.MULTILINE) for name, rx in raw["patterns"].items()}
    openings = {
        name: tuple((re.compile(head), str(rest)) for head, rest in rows)
        for name, rows in raw["openings"].items()
        if not name.startswith("_")
    }
    signals: dict[str, Signal] = {}
    for sid, spec in raw["signals"].items():
        weights = {OomClass(name): float(w) for name, w in spec["weights"].items()}
        if OomClass.UNKNOWN in weights:
            raise ValueError(f"signal {sid}: 'unknown' is decided, not weighted")
        signals[sid] = Signal(id=sid, weights=weights, evidence=str(spec["evidence"]))
    thresholds = {name: float(v) for name, v in raw["thresholds"].items()}
    assert all(c in CAUSES for s in signals.values() for c in s.weights)
    return Tables(
        patterns=patterns,
        openings=openings,
        signals=signals,
        thresholds=thresholds,
        timing=_timing_rows(timing),
        timing_thresholds={name: float(v) for name, v in timing["thresholds"].items()},
    )
