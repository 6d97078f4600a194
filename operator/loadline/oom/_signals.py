"""The classifier's tables: text patterns, signal weights and thresholds, read from ``data/signals.json``.

Kept as data so that a new vLLM error wording or a retuned weight is a one-line change that the corpus
tests then check, not a code change.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from loadline.oom._model import CAUSES, OomClass

__all__ = ["Signal", "Tables", "tables"]


@dataclass(frozen=True)
class Signal:
    """One kind of evidence: what it adds to (or takes from) each class, and how to say it."""

    id: str
    weights: dict[OomClass, float]
    evidence: str


@dataclass(frozen=True)
class Tables:
    patterns: dict[str, re.Pattern[str]]
    signals: dict[str, Signal]
    thresholds: dict[str, float]

    def threshold(self, name: str) -> float:
        return self.thresholds[name]


def _load_raw() -> dict[str, Any]:
    text = resources.files("loadline.oom").joinpath("data/signals.json").read_text(encoding="utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


@cache
def tables() -> Tables:
    """The parsed tables (read once). Unknown class names in the data fail loudly, at first use."""
    raw = _load_raw()
    patterns = {name: re.compile(rx, re.MULTILINE) for name, rx in raw["patterns"].items()}
    signals: dict[str, Signal] = {}
    for sid, spec in raw["signals"].items():
        weights = {OomClass(name): float(w) for name, w in spec["weights"].items()}
        if OomClass.UNKNOWN in weights:
            raise ValueError(f"signal {sid}: 'unknown' is decided, not weighted")
        signals[sid] = Signal(id=sid, weights=weights, evidence=str(spec["evidence"]))
    thresholds = {name: float(v) for name, v in raw["thresholds"].items()}
    assert all(c in CAUSES for s in signals.values() for c in s.weights)
    return Tables(patterns=patterns, signals=signals, thresholds=thresholds)
