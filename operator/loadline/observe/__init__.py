"""Observed memory: what vLLM reported at start-up, and the corrections the fleet learns from it.

Pure: :func:`parse_startup_log` reads a start-up log into an :class:`Observation`; nothing here talks
to a cluster (the operator reads the log through the API server and hands the text in).
"""

from loadline.observe._learn import (
    MAX_CREDIT,
    MAX_PER_KEY,
    CorrectionStore,
    load_store,
    minor_of,
    mismatches,
    record_of,
)
from loadline.observe._parse import (
    Observation,
    ObserveError,
    logged_weights_gib,
    observation_from_cache_config,
    parse_startup_log,
)
from loadline.observe._status import (
    CAPACITY_CONDITION,
    capacity_condition,
    observed_concurrency,
    observed_status,
    plan_fingerprint,
    uncorrected_kv_gib,
)

__all__ = [
    "CAPACITY_CONDITION",
    "MAX_CREDIT",
    "MAX_PER_KEY",
    "CorrectionStore",
    "Observation",
    "ObserveError",
    "capacity_condition",
    "load_store",
    "logged_weights_gib",
    "minor_of",
    "mismatches",
    "observation_from_cache_config",
    "observed_concurrency",
    "observed_status",
    "parse_startup_log",
    "plan_fingerprint",
    "record_of",
    "uncorrected_kv_gib",
]
