"""The kopf settings loadline starts with, where kopf's defaults cost API writes at fleet scale."""

from __future__ import annotations

import logging

import kopf
import pytest

from loadline.handlers import _registry
from loadline.handlers._state import OperatorState


def test_kopf_waits_for_its_own_patch_as_long_as_a_loaded_watch_lags(monkeypatch: pytest.MonkeyPatch) -> None:
    """kopf's 5 s default made one model in three reconcile twice at 100 crashes at once (its own patch's
    watch event came 8.7 s late, and it handled the older event as current); and kopf's own INFO
    Events would be a write per handler run, which a resync must not make."""
    # The metrics endpoint is not what this checks: binding its real port (9464) failed the test
    # whenever another process on the machine held it (an operator of an e2e run).
    monkeypatch.setattr(_registry._metrics, "serve", lambda port: None)
    settings = kopf.OperatorSettings()
    memo = kopf.Memo()
    _registry.configure(settings=settings, memo=memo)
    assert isinstance(memo["state"], OperatorState)  # the operator's memory, handed to every handler
    assert settings.persistence.consistency_timeout >= 30.0
    assert settings.posting.level == logging.WARNING
