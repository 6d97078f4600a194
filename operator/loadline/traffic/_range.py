"""Range queries for the request-rate history the restart-window finder learns from.

Through ``prometheus-api-client`` (the design card's choice), with the promise the instant-query
client keeps: a slow or absent Prometheus never blocks a handler and never raises. Each call is one
HTTP request with ``timeout`` and no retries (the library retries three times with back-off by
default, which would multiply the wait); ``query_range_async`` runs it in a worker thread and stops
waiting after ``deadline`` seconds, since a server that trickles bytes can keep a socket timeout from
ever firing. Failures are logged on ``loadline.traffic`` and answered with None.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from datetime import UTC, datetime

import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from urllib3.util.retry import Retry

from loadline.windows import Sample, SeriesError, series_from_prometheus

__all__ = ["query_range", "query_range_async"]

log = logging.getLogger("loadline.traffic")


def _moment(value: datetime | float) -> datetime:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    return datetime.fromtimestamp(float(value), UTC)


def query_range(
    base_url: str,
    promql: str,
    start: datetime | float,
    end: datetime | float,
    step: float = 300.0,
    *,
    timeout: float = 5.0,
    headers: Mapping[str, str] | None = None,
) -> list[list[Sample]] | None:
    """The series of ``promql`` from ``start`` to ``end`` every ``step`` seconds, or None.

    None when Prometheus is unreachable, slow, refuses the query or answers with something that is
    not a matrix; an answer without series is ``[]``. Keep ``(end - start) / step`` under Prometheus'
    11,000 points per series (four weeks at 5-minute steps is 8,064).
    """
    try:
        prom = PrometheusConnect(
            url=base_url.rstrip("/"),
            headers=dict(headers or {}),
            retry=Retry(total=0, connect=0, read=0, status=0, redirect=0),
            timeout=timeout,
        )
    except (TypeError, ValueError) as exc:
        log.warning("Prometheus range query not sent: %s", exc)
        return None
    try:
        result = prom.custom_query_range(
            promql, start_time=_moment(start), end_time=_moment(end), step=f"{step:g}"
        )
        return series_from_prometheus({"resultType": "matrix", "result": result}) if result else []
    except SeriesError as exc:
        log.warning("Prometheus range answer unusable for %r: %s", promql, exc.problem)
    except (PrometheusApiClientException, requests.RequestException, ValueError, KeyError) as exc:
        log.warning("Prometheus range query failed (%s): %s", base_url, exc)
    finally:
        prom.close()
    return None


async def query_range_async(
    base_url: str,
    promql: str,
    start: datetime | float,
    end: datetime | float,
    step: float = 300.0,
    *,
    timeout: float = 5.0,
    deadline: float = 10.0,
    headers: Mapping[str, str] | None = None,
) -> list[list[Sample]] | None:
    """:func:`query_range` off the event loop, given up after ``deadline`` seconds (then None)."""
    call = asyncio.to_thread(
        query_range, base_url, promql, start, end, step, timeout=timeout, headers=headers
    )
    try:
        return await asyncio.wait_for(call, deadline)
    except TimeoutError:
        log.warning("Prometheus range query gave no answer within %.1f s: %s", deadline, base_url)
        return None
