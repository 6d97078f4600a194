"""Print the out-of-memory classifier's accuracy on the corpus, tune and held-out apart (not a test).

The corpus is tests/corpus/oom; each case's ``split`` comes from a hash of its report's address
(loadline.oom._corpus.split_for), fixed before any figure was measured. Rules and weights are tuned on
``tune`` only; ``heldout`` is the honest figure. Each split is printed for every case and for the
cases whose text is quoted from the report (``real``), with a confusion summary and the misses.

Run: `.venv/bin/python benchmarks/oom_classify.py [--json] [--write-precision]`. ``--write-precision``
rewrites operator/loadline/oom/data/precision.json, the per-class precision on the untuned splits that
``loadline classify`` reports as the corpus's confidence (tests/test_oom_corpus.py checks it is current).
To measure another classifier on the same split (main's, say), put its ``operator`` directory first on
PYTHONPATH; it needs only ``parse_incident`` and ``classify``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO / "tests" / "corpus" / "oom"

from loadline.errors import SpecError  # noqa: E402
from loadline.oom import classify, parse_incident  # noqa: E402
from loadline.oom._parse import parse_oom_text  # noqa: E402


def _corpus_module() -> ModuleType:
    """This checkout's corpus helpers, even when ``loadline`` itself comes from another checkout."""
    path = REPO / "operator" / "loadline" / "oom" / "_corpus.py"
    spec = importlib.util.spec_from_file_location("_oom_corpus", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["_oom_corpus"] = module
    spec.loader.exec_module(module)
    return module


_corpus = _corpus_module()
Case, Score, load_corpus, score = _corpus.Case, _corpus.Score, _corpus.load_corpus, _corpus.score
PRECISION = REPO / "operator" / "loadline" / "oom" / "data" / "precision.json"


def write_precision(cases: list[Any]) -> None:
    """Write the per-class precision on the untuned splits (data/precision.json)."""
    counted = [c for c in cases if c.split in _corpus.PRECISION_SPLITS]
    data = {
        "_about": "Per class the OOM classifier answered on the corpus splits never tuned on "
        f"({' and '.join(_corpus.PRECISION_SPLITS)}): [right, answered]. Its precision is what "
        "`loadline classify` reports as the corpus's confidence when no outcomes are given.",
        "measured_on": f"tests/corpus/oom, {len(counted)} cases of the splits "
        + ", ".join(_corpus.PRECISION_SPLITS),
        "command": ".venv/bin/python benchmarks/oom_classify.py --write-precision",
        "classes": _corpus.precision_by_class(cases, predict),
    }
    PRECISION.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def predict(incident: Mapping[str, Any]) -> str:
    try:
        parsed = parse_incident(incident)
    except SpecError:
        # A classifier from before the ``phase`` field (main's, for the before figure) refuses it:
        # it gets the incident without it, which is all it could have used.
        parsed = parse_incident({k: v for k, v in incident.items() if k != "phase"})
    return classify(parsed).oom_class.value


def _line(label: str, s: Any) -> str:
    return f"{label:<28} {s.right:>3}/{s.total:<3} {s.accuracy:6.1%}"


def _has_figures(case: Any) -> bool:
    """Whether the report's text carries the allocator's figures: what it asked for and the GPU's size."""
    figures = parse_oom_text(parse_incident(case.incident).text)
    return figures is not None and figures.requested_gib is not None and figures.total_gib is not None


def _groups(cases: list[Any]) -> dict[str, list[Any]]:
    groups: dict[str, list[Any]] = {}
    for split in ("tune", "heldout", "blind"):
        on_split = [c for c in cases if c.split == split]
        groups[f"{split} (all)"] = on_split
        groups[f"{split} (real messages)"] = [c for c in on_split if c.origin == "real"]
        groups[f"{split} (synthetic)"] = [c for c in on_split if c.origin == "synthetic"]
    # The blind sets by what their reports carry: the evidence the classes are decided from.
    blind = [c for c in cases if c.split == "blind"]
    groups["blind (allocator figures)"] = [c for c in blind if _has_figures(c)]
    groups["blind (real, no figures)"] = [c for c in blind if c.origin == "real" and not _has_figures(c)]
    groups["blind (report's words only)"] = [c for c in blind if c.origin != "real" and not _has_figures(c)]
    # Later collections, each on both sides of the split: "2026-11-28 fresh set (issue 34)" is shown
    # as "fresh set", and so on.
    for label in sorted({c.collected for c in cases if getattr(c, "collected", None)}):
        name = label.split(" (")[0].split(" ", 1)[-1]
        batch = [c for c in cases if getattr(c, "collected", None) == label]
        groups[f"{name} (all)"] = batch
        groups[f"{name} (real messages)"] = [c for c in batch if c.origin == "real"]
        groups[f"{name} (held out)"] = [c for c in batch if c.split == "heldout"]
    return groups


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--write-precision", action="store_true", help="rewrite the per-class precision data file"
    )
    args = parser.parse_args()
    cases = load_corpus(CORPUS)
    if args.write_precision:
        write_precision(cases)
    results = {name: score(group, predict) for name, group in _groups(cases).items()}
    if args.json:
        out = {
            k: {"right": v.right, "total": v.total, "accuracy": round(v.accuracy, 4)}
            for k, v in results.items()
        }
        print(json.dumps(out, indent=2))
        return 0
    origins = {o: sum(c.origin == o for c in cases) for o in ("real", "paraphrase", "synthetic")}
    print(f"corpus: {len(cases)} cases; " + ", ".join(f"{n} {o}" for o, n in origins.items()))
    for name, s in results.items():
        if s.total:
            print(_line(name, s))
    for split in ("tune", "heldout", "blind"):
        s = score([c for c in cases if c.split == split], predict)
        print(f"\n{split}: expected -> got (count)")
        for (expected, got), n in sorted(s.confusion.items()):
            mark = "" if expected == got else "   <- miss"
            print(f"  {expected:<24} -> {got:<24} {n}{mark}")
        for name, expected, got in s.misses:
            print(f"  miss: {name}: expected {expected}, got {got}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
