"""A tiny Prometheus HTTP API client: instant queries, standard library only, never raising.

The operator must not block or fail because Prometheus is slow, down or misconfigured. So every
request has a timeout, the whole conversation has a deadline, and the first transport failure
(refused connection, DNS, timeout, 5xx) ends it: the remaining queries answer "not available" at once
instead of each waiting for its own timeout. A 4xx (a query Prometheus rejects) only loses that query.
"""

from __future__ import annotations

import http.client
import json
import logging
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

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
        params = urllib.parse.urlencode({"query": promql, "time": f"{at:.3f}"})
        request = urllib.request.Request(
            f"{self.base_url}/api/v1/query?{params}",
            headers={"Accept": "application/json", **self.headers},
        )
        try:
            with urllib.request.urlopen(request, timeout=min(self.timeout, left)) as response:
                body = response.read(_MAX_BODY + 1)
        except urllib.error.HTTPError as exc:
            if exc.code >= 500 or exc.code in (401, 403):
                self._give_up(f"HTTP {exc.code} from {self.base_url}")
            else:
                log.debug("Prometheus refused %r: HTTP %s %s", promql, exc.code, _error_text(exc))
            return None
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
            # URLError covers refused connections and DNS; socket timeouts are OSError (TimeoutError).
            self._give_up(f"{self.base_url} unreachable: {getattr(exc, 'reason', exc)}")
            return None
        if len(body) > _MAX_BODY:
            log.debug("Prometheus answer to %r too large; ignored", promql)
            return None
        try:
            return json.loads(body)
        except ValueError:
            log.debug("Prometheus answer to %r is not JSON; ignored", promql)
            return None

    def _give_up(self, why: str) -> None:
        self.failure = why
        log.warning("Prometheus metrics not available: %s", why)


def _error_text(exc: urllib.error.HTTPError) -> str:
    try:
        payload = json.loads(exc.read(64 * 1024))
    except (ValueError, OSError):
        return ""
    return str(payload.get("error", "")) if isinstance(payload, dict) else ""
