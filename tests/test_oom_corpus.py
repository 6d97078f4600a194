"""Every public incident in tests/corpus/oom must be classified as its file says.

The corpus is the classifier's ground truth: real vLLM out-of-memory reports, each with its source. A
wrong class here means the operator would apply the wrong fix to that kind of crash; a confident
answer where the file expects ``unknown`` means it would act on evidence that does not decide.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from loadline.oom import OomClass, classify, parse_incident, propose_remediation

CORPUS = Path(__file__).parent / "corpus" / "oom"
FILES = sorted(CORPUS.glob("*.json"))
UNKNOWN_MAX_CONFIDENCE = 0.3
DECIDED_MIN_CONFIDENCE = 0.4


def _load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_corpus_incident_is_classified_as_expected(path: Path) -> None:
    data = _load(path)
    diagnosis = classify(parse_incident(data))
    assert diagnosis.oom_class.value == data["expected_class"], diagnosis.evidence
    if diagnosis.oom_class is OomClass.UNKNOWN:
        assert diagnosis.confidence <= UNKNOWN_MAX_CONFIDENCE
    else:
        assert diagnosis.confidence >= DECIDED_MIN_CONFIDENCE
    assert diagnosis.evidence, "a diagnosis must say why"


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_corpus_incident_is_cited_and_quotes_the_report(path: Path) -> None:
    data = _load(path)
    assert data["source"].startswith(("https://github.com/", "/work/shared/calibration/"))
    assert len(data["note"]) > 20
    # Every incident carries the report's own error text, except a bare OOMKilled (which has none).
    if data["reason"] != "OOMKilled":
        assert data.get("message") or data.get("log_tail"), "quote the real error text"


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_corpus_remediation_matches_the_class(path: Path) -> None:
    incident = parse_incident(_load(path))
    diagnosis = classify(incident)
    remediation = propose_remediation(diagnosis, incident)
    if diagnosis.oom_class is OomClass.UNKNOWN:
        assert remediation.action == "none"
        assert remediation.look_at
    else:
        assert remediation.action != "none"
    for change in remediation.changes:
        assert change.new is not None and change.new != change.old


def test_corpus_covers_every_class_with_real_reports() -> None:
    counts = Counter(_load(p)["expected_class"] for p in FILES)
    assert len(FILES) >= 20
    assert set(counts) == {c.value for c in OomClass}
    assert counts["unknown"] >= 2
    # Both public calibration OOM rows (P26, P27) are in.
    sources = " ".join(_load(p)["source"] for p in FILES)
    assert "record P26" in sources and "record P27" in sources
