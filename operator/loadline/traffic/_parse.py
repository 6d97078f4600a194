"""Reading ``/api/v1/query`` answers. Pure: JSON in, numbers (or None) out.

Anything unexpected (an error status, a matrix where a vector was asked for, NaN from a division by
zero, a label that is not a number) reads as "not available", never as an exception.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["bucket_increases", "samples", "scalar", "top_bucket"]


def samples(payload: Any) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of each finite sample of an instant-query answer (vector or scalar)."""
    if not isinstance(payload, Mapping) or payload.get("status") != "success":
        return []
    data = payload.get("data")
    if not isinstance(data, Mapping):
        return []
    kind, result = data.get("resultType"), data.get("result")
    if kind == "scalar":
        entries: list[Any] = [{"metric": {}, "value": result}]
    elif kind == "vector" and isinstance(result, list):
        entries = result
    else:
        return []
    out: list[tuple[dict[str, str], float]] = []
    for entry in entries:
        if not isinstance(entry, Mapping):
            continue
        value = entry.get("value")
        if not isinstance(value, list | tuple) or len(value) != 2:
            continue
        try:
            number = float(value[1])
        except (TypeError, ValueError):
            continue
        if not math.isfinite(number):
            continue
        metric = entry.get("metric")
        labels = {str(k): str(v) for k, v in metric.items()} if isinstance(metric, Mapping) else {}
        out.append((labels, number))
    return out


def scalar(payload: Any) -> float | None:
    """The value of a query that aggregates to one sample; None when it returned nothing.

    When a query still returns several samples the largest wins (the queries here all ask for a
    maximum or a sum, so that is the conservative reading).
    """
    values = [value for _, value in samples(payload)]
    return max(values) if values else None


def bucket_increases(payload: Any) -> dict[float, float]:
    """``le`` bound → increase, from a ``sum by (le) (increase(..._bucket[w]))`` answer."""
    out: dict[float, float] = {}
    for labels, value in samples(payload):
        try:
            bound = float(labels.get("le", ""))
        except ValueError:
            continue
        out[bound] = out.get(bound, 0.0) + value
    return out


def top_bucket(increases: Mapping[float, float], max_model_len: int | None = None) -> int | None:
    """The longest prompt the histogram saw: the upper bound of the highest bucket that gained any.

    Buckets are cumulative, so the highest bucket with observations is the first (smallest) bound whose
    count reaches the total. Its upper bound is an *at most* figure; with vLLM's 1-2-5 buckets it can be
    up to 2.5 times the real prompt. When that bucket is ``+Inf`` (vLLM's last finite bucket is the
    largest 1-2-5 value below max_model_len, e.g. 20000 for 32768) the bound is max_model_len, since
    vLLM refuses longer prompts; without max_model_len it is the last finite bound, then a lower bound.
    Finite bounds above max_model_len are capped to it as well. None when no request finished.
    """
    finite = sorted((b, v) for b, v in increases.items() if math.isfinite(b))
    total = increases.get(math.inf)
    if total is None:
        total = max((v for _, v in finite), default=0.0)
    if total <= 1e-9:
        return None
    # Increases of the buckets share one extrapolation factor, so equal counts give equal floats;
    # the tolerance only absorbs rounding in sums over engines.
    reached = total - max(1e-6, 1e-9 * total)
    for bound, value in finite:
        if value >= reached:
            if max_model_len is not None:
                return min(math.ceil(bound), max_model_len)
            return math.ceil(bound)
    if max_model_len is not None:
        return max_model_len
    return math.ceil(finite[-1][0]) if finite else None
