"""Instant queries against Prometheus, through ``prometheus-api-client``, never raising.

The operator must not block or fail because Prometheus is slow, down or misconfigured. So every
request has a timeout and no retries, the whole conversation has a deadline, and the first transport
failure (refused connection, DNS, timeout, 5xx, 401/403) ends it: the remaining queries answer "not
available" at once instead of each waiting for its own timeout. A 4xx (a query Prometheus rejects) or
an answer that is not JSON only loses that query.

The library's ``custom_query`` keeps only ``data.result`` and says the HTTP status only in its
exception's text; the client reads both from the response itself (a hook on the session it hands the
library), so an answer keeps its ``resultType`` and a failure is told apart by its status code.
"""

from __future__ import annotations

import logging
import time
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from urllib3.util.retry import Retry

__all__ = ["PrometheusClient"]

log = logging.getLogger("loadline.traffic")

#: Bodies larger than this are not Prometheus answers to our queries.
_MAX_BODY = 4 * 1024 * 1024


class PrometheusClient:
    """Instant queries against ``base_url`` (e.g. ``http://prometheus.monitoring:9090``).

    ``timeout`` bounds each request; ``deadline`` bounds all requests of this client together.
    ``headers`` are sent with every request (e.g. ``Authorization``).
    """

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = 2.0,
        deadline: float = 10.0,
        headers: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.headers = dict(headers or {})
        self._clock = clock
        self._until = clock() + deadline
        #: Why the client gave up (None while it still talks to Prometheus).
        self.failure: str | None = None
        self._connect: PrometheusConnect | None = None
        self._answer: requests.Response | None = None
        scheme = urllib.parse.urlsplit(self.base_url).scheme
        if scheme not in ("http", "https"):
            self.failure = f"not an http(s) URL: {base_url!r}"

    def query(self, promql: str, at: float) -> Any | None:
        """The decoded JSON answer of ``/api/v1/query?query=…&time=at``, or None.

        None when Prometheus is unreachable, slow, answers with an error or with something that is
        not JSON; the reason is logged (once per client for transport failures).
        """
        if self.failure is not None:
            return None
        left = self._until - self._clock()
        if left <= 0:
            self._give_up("the deadline for Prometheus queries passed")
            return None
        self._answer = None
        try:
            self._prometheus().custom_query(
                promql, params={"time": f"{at:.3f}"}, timeout=min(self.timeout, left)
            )
        except PrometheusApiClientException:
            code = self._answer.status_code if self._answer is not None else 0
            if code >= 500 or code in (401, 403):
                self._give_up(f"HTTP {code} from {self.base_url}")
            else:
                log.debug("Prometheus refused %r: HTTP %s %s", promql, code, _error_text(self._answer))
            return None
        except (requests.JSONDecodeError, KeyError, TypeError):
            log.debug("Prometheus answer to %r is not a query answer; ignored", promql)
            return None
        except (requests.RequestException, OSError, ValueError) as exc:
            # Refused connections, DNS and timeouts are requests' ConnectionError and Timeout.
            self._give_up(f"{self.base_url} unreachable: {exc}")
            return None
        answer = self._answer
        if answer is None or len(answer.content) > _MAX_BODY:
            log.debug("Prometheus answer to %r too large; ignored", promql)
            return None
        return answer.json()

    def close(self) -> None:
        """Close the connections of this client's session (a closed client answers nothing)."""
        self.failure = self.failure or "closed"
        if self._connect is not None:
            self._connect.close()

    def __enter__(self) -> PrometheusClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _prometheus(self) -> PrometheusConnect:
        """The library's client on a session whose hook keeps the last response (made on first use)."""
        if self._connect is None:
            session = requests.Session()
            session.hooks["response"].append(self._keep)
            self._connect = PrometheusConnect(
                url=self.base_url,
                headers={"Accept": "application/json", **self.headers},
                retry=Retry(total=0, connect=0, read=0, status=0, redirect=0),
                session=session,
                timeout=self.timeout,
            )
        return self._connect

    def _keep(self, response: requests.Response, *_: Any, **__: Any) -> None:
        self._answer = response

    def _give_up(self, why: str) -> None:
        self.failure = why
        log.warning("Prometheus metrics not available: %s", why)


def _error_text(response: requests.Response | None) -> str:
    try:
        payload = response.json() if response is not None else None
    except ValueError:
        return ""
    return str(payload.get("error", "")) if isinstance(payload, dict) else ""
