"""The labelled corpus of out-of-memory incidents, its tune/held-out split, and how it is scored.

Lives beside the classifier (not in the tests) because the benchmark, the corpus tests and the docs'
table all need the same split rule and the same scoring, and because the rule must not be tuned: a case
is held out by a hash of its report's address, decided before anything is measured, so moving a hard
case into ``tune`` is visible as a changed rule, never a quiet edit of one file.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "BLIND_COLLECTIONS",
    "CORPUS_KEYS",
    "HELDOUT_MODULUS",
    "PRECISION_SPLITS",
    "Case",
    "Score",
    "load_corpus",
    "precision_by_class",
    "score",
    "split_for",
]

#: Annotation keys a corpus file carries besides the INCIDENT.json fields; the classifier ignores them.
CORPUS_KEYS = frozenset(
    {"source", "expected_class", "note", "split", "message_origin", "timing", "resolution", "collected"}
)

#: A case is held out when the first 8 hex digits of sha256(source address), as an integer, are
#: divisible by this: about a third of the reports, fixed before any result was seen.
HELDOUT_MODULUS = 3

#: Where the message text came from: quoted from the report, the reporter's own sentence standing in
#: for an error text the report does not quote, or written here (a variant of a real case).
ORIGINS = ("real", "paraphrase", "synthetic")


#: Collections held out whole (split ``"blind"``): gathered, labelled and measured before any rule was
#: changed after them, and never tuned on. A blind set is scored on its own, before and after.
BLIND_COLLECTIONS = frozenset(
    {
        "2026-11-28 blind set (issue 34; held out whole, measured before any rule change)",
        "2026-11-28 blind set 2 (issue 34; gathered after the rules, measured once)",
        "2026-11-29 blind set 3 (issue 34; gathered after the rules, measured once)",
        "2026-11-29 blind set 4 (issue 34; gathered after the rules, measured once)",
        "2026-11-29 blind set 5 (issue 34; gathered after the rules, measured once)",
        "2026-11-29 blind set 6 (issue 34; gathered after the rules, measured once)",
        "2026-11-30 blind set 7 (issue 34; gathered after the rules, measured once)",
        "2026-11-30 blind set 8 (issue 34; gathered after the rules, measured once)",
        "2026-11-30 blind set 9 (issue 34; gathered after the rules, measured once)",
        "2026-11-30 blind set 10 (issue 34; gathered after the rules, measured once)",
        "2026-11-30 blind set 11 (issue 34; gathered after the rules, measured once)",
        "2026-11-30 blind set 12 (issue 34; gathered after the rules, measured once)",
        "2026-11-30 blind set 13 (issue 34; gathered after the rules, measured once)",
        "2026-11-30 blind set 14 (issue 34; gathered after the rules, measured once)",
    }
)


def split_for(source: str, collected: str | None = None) -> str:
    """``"blind"``, ``"heldout"`` or ``"tune"`` for a report.

    A report of a blind collection is ``"blind"``; any other is split by its address alone (the first
    word of ``source``). Several incidents from one thread share the thread's address, so they always
    fall on the same side: a report tuned on can never also score the held-out figure.
    """
    if collected in BLIND_COLLECTIONS:
        return "blind"
    address = source.split()[0] if source.split() else source
    digest = hashlib.sha256(address.encode("utf-8")).hexdigest()
    return "heldout" if int(digest[:8], 16) % HELDOUT_MODULUS == 0 else "tune"


@dataclass(frozen=True)
class Case:
    """One corpus file: the incident as INCIDENT.json gives it, and its annotations."""

    name: str
    incident: Mapping[str, Any]
    expected: str
    split: str
    origin: str
    source: str
    #: Which later collection the case came in (None for the first corpus): a set gathered after the
    #: rules were written, so its before/after figures are measured on data the rules were not written on.
    collected: str | None = None


def load_corpus(directory: Path) -> list[Case]:
    """Every ``*.json`` under ``directory``, sorted by name. A file without its annotations is an error."""
    cases: list[Case] = []
    for path in sorted(directory.glob("*.json")):
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        missing = {"source", "expected_class", "split", "message_origin"} - set(data)
        if missing:
            raise ValueError(f"{path.name}: missing corpus keys {sorted(missing)}")
        if data["message_origin"] not in ORIGINS:
            raise ValueError(f"{path.name}: message_origin must be one of {ORIGINS}")
        incident = {k: v for k, v in data.items() if k not in CORPUS_KEYS}
        cases.append(
            Case(
                name=path.stem,
                incident=incident,
                expected=str(data["expected_class"]),
                split=str(data["split"]),
                origin=str(data["message_origin"]),
                source=str(data["source"]),
                collected=data.get("collected"),
            )
        )
    return cases


@dataclass
class Score:
    """Right answers over a set of cases, with the confusion counts and the misses named."""

    total: int = 0
    right: int = 0
    confusion: Counter[tuple[str, str]] = field(default_factory=Counter)
    misses: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def accuracy(self) -> float:
        return self.right / self.total if self.total else 0.0


def score(cases: Iterable[Case], predict: Callable[[Mapping[str, Any]], str]) -> Score:
    """Score ``predict`` (incident mapping → class name) on ``cases``."""
    result = Score()
    for case in cases:
        got = predict(case.incident)
        result.total += 1
        result.confusion[(case.expected, got)] += 1
        if got == case.expected:
            result.right += 1
        else:
            result.misses.append((case.name, case.expected, got))
    return result


#: The splits never tuned on, where a class's precision is an honest figure.
PRECISION_SPLITS = ("heldout", "blind")


def precision_by_class(
    cases: Iterable[Case], predict: Callable[[Mapping[str, Any]], str]
) -> dict[str, list[int]]:
    """Per class the classifier answered on the untuned splits: ``[right, answered]`` (its precision)."""
    counts: dict[str, list[int]] = {}
    for case in cases:
        if case.split not in PRECISION_SPLITS:
            continue
        got = predict(case.incident)
        right_said = counts.setdefault(got, [0, 0])
        right_said[0] += got == case.expected
        right_said[1] += 1
    return dict(sorted(counts.items()))
