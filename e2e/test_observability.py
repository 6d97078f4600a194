"""The chart's observability objects on the real API server and their queries in the real Prometheus.

The Prometheus Operator's CRDs (from its Go module, e2e/install-tools.sh promcrds) are applied, and the
chart's PodMonitors, PrometheusRule and dashboard ConfigMap are accepted by the API server (a malformed
one is refused). Then the session's Prometheus scrapes the running operator's replicas and a loopback
exporter standing in for a model's vLLM pods and the GPU agent, while one model crashes until a person
is needed and another's GPU memory climbs toward its limit: every dashboard query answers with a
non-empty result, the alerts on those events fire (their whole expression answers), and the series part
of every other alert answers (docs/observability.md)."""

from __future__ import annotations

import functools
import json
import re
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from chart import ChartOperator, render
from crash import crash_container
from kube import REPO, STATE_DIR, Kubectl, lib_var, wait_for
from operator_helpers import example, model, pods_of, wait_phase
from test_oom import climbing_gpu_memory, handled, rolled_out
from test_prometheus import STEP, openmetrics
from test_restarts import backfill

ALL_ON = {
    "agent": {"enabled": True},
    "monitoring": {
        "podMonitors": {"operator": True, "agent": True, "models": True},
        "rules": {"enabled": True},
        "dashboard": {"enabled": True},
    },
}
KINDS = ("PodMonitor", "PrometheusRule")


@pytest.fixture(scope="module")
def prometheus_operator_crds(kubectl: Kubectl) -> None:
    crds = Path(lib_var("PROMCRDS_DIR"))
    if not (crds / ".complete").exists():
        import subprocess

        subprocess.run(["bash", str(REPO / "e2e" / "install-tools.sh"), "promcrds"], check=True, timeout=600)
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crds))
    kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", str(crds))


def _observability(namespace: str, release: str = "obs") -> list[dict[str, Any]]:
    docs = render(release, namespace, ALL_ON, include_crds=False)
    dashboard = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")]
    return [d for d in docs if d["kind"] in KINDS] + dashboard


def test_monitors_rules_and_dashboard_are_accepted_by_the_api_server(
    prometheus_operator_crds: None, kubectl: Kubectl, namespace: str
) -> None:
    docs = _observability(namespace)
    assert sorted(d["kind"] for d in docs) == [
        "ConfigMap",
        "PodMonitor",
        "PodMonitor",
        "PodMonitor",
        "PrometheusRule",
    ]
    stream = "".join("---\n" + json.dumps(d) + "\n" for d in docs)
    out = kubectl("apply", "--server-side", "-n", namespace, "-f", "-", input=stream)
    assert out.count("serverside-applied") == len(docs)
    rule = kubectl.json("get", "prometheusrule", "obs-loadline", "-n", namespace)
    assert len([r for g in rule["spec"]["groups"] for r in g["rules"]]) == 9
    # The schema is the real one: a malformed interval is refused, naming the field.
    monitor = next(d for d in docs if d["kind"] == "PodMonitor")
    monitor["spec"]["podMetricsEndpoints"][0]["interval"] = "thirty seconds"
    proc = kubectl.run(
        "apply", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(monitor), check=False
    )
    assert proc.returncode != 0 and "interval" in proc.stderr


class Exporter:
    """What a model's vLLM pod (both KV-cache names, as a 0.10 pod exports them, and waiting requests)
    and the GPU node agent (the pod's container memory) serve, with the labels the chart's PodMonitors
    give them (namespace, pod, inferencemodel)."""

    def __init__(self, namespace: str, pod: str) -> None:
        m = f'namespace="{namespace}",pod="{pod}",inferencemodel="chat",engine="0",model_name="chat"'
        a = f'namespace="{namespace}",pod="{pod}",container="vllm",node="gpu-0",gpu="0",uuid="GPU-0",product="L4"'
        text = (
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            f"vllm:kv_cache_usage_perc{{{m}}} 0.42\n"
            "# TYPE vllm:gpu_cache_usage_perc gauge\n"
            f"vllm:gpu_cache_usage_perc{{{m}}} 0.42\n"
            "# TYPE vllm:num_requests_waiting gauge\n"
            f"vllm:num_requests_waiting{{{m}}} 3\n"
            "# TYPE loadline_gpu_container_memory_used_bytes gauge\n"
            f"loadline_gpu_container_memory_used_bytes{{{a}}} 2.0e10\n"
        ).encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                self.wfile.write(text)

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.port = self.server.server_port


#: An alert's series part: its expression without the threshold it compares with, and what absent()
#: asks about (absent answers only while the series is missing).
_THRESHOLD = re.compile(r"\s*(>=|<=|==|!=|>|<)\s*[0-9.e+]+\s*$")
_ABSENT = re.compile(r"^absent\((.*)\)$")

#: The alerts whose cause this test makes happen: their whole expression, threshold and all, must
#: answer (the alert fires in the real Prometheus): three OOMKilled crashes of one model (the first
#: fix, raising the memory limit, recurs; no rung is left: a person is told), and a model whose GPU
#: memory climbs toward its GPU's limit.
FIRING = (
    "LoadlineCrashLoop",
    "LoadlineRemediationNeedsPerson",
    "LoadlineRemediationFailed",
    "LoadlineOOMRiskAhead",
)


def _series_part(expr: str) -> str:
    expr = _THRESHOLD.sub("", expr)
    return _ABSENT.sub(r"\1", expr)


def _answers(url: str, expr: str) -> list[dict[str, Any]] | None:
    with urllib.request.urlopen(
        f"{url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}", timeout=10
    ) as r:
        body = json.load(r)
    assert body["status"] == "success", f"{expr}: {body}"
    result: list[dict[str, Any]] = body["data"]["result"]
    return result or None


def _deploy(kubectl: Kubectl, namespace: str, name: str) -> str:
    doc = example(REPO / "examples" / "chat-llama-8b.yaml", namespace)
    doc["metadata"]["name"] = name
    doc["spec"].update(gpu={"types": ["L4"]})
    kubectl.apply(doc, namespace)
    wait_phase(kubectl, namespace, name, "Ready")
    [pod] = pods_of(kubectl, namespace, name)
    return str(pod["metadata"]["name"])


def _crash(kubectl: Kubectl, namespace: str, pod: str, count: int) -> dict[str, Any]:
    """The model ``chat`` once its ``count``-th OOMKilled crash (of ``pod``) is decided."""
    crash_container(kubectl, pod, namespace, "oomkilled")
    return handled(kubectl, namespace, count)


def test_every_dashboard_query_and_alert_answers_in_the_real_prometheus(
    prometheus_operator_crds: None,
    operator: ChartOperator,
    kubectl: Kubectl,
    namespace: str,
    prometheus_url: str,
) -> None:
    pod = _deploy(kubectl, namespace, "chat")
    risky = _deploy(kubectl, namespace, "risky")
    # Two hours of GPU memory climbing toward the L4's limit for the second model (the backfill
    # restarts Prometheus, so it comes before the scraping starts).
    end = (int(time.time()) - 60) // STEP * STEP
    backfill("observability-risk", openmetrics([climbing_gpu_memory(namespace, risky)], end), prometheus_url)
    exporter = Exporter(namespace, pod)
    targets = STATE_DIR / "prometheus" / "targets" / "observability.json"
    job = f"{operator.namespace}/{operator.release}-loadline"  # the operator PodMonitor's job
    replicas = [f"127.0.0.1:{r.env['LOADLINE_METRICS_PORT']}" for r in operator.replicas]
    targets.write_text(json.dumps([
        {"targets": replicas, "labels": {"job": job}},
        {"targets": [f"127.0.0.1:{exporter.port}"], "labels": {"job": f"{operator.namespace}/obs-models"}},
    ]))  # fmt: skip
    try:
        # Scraped before any crash: the model's incident series at 0 (what increase() counts from).
        chat = f'loadline_oom_incidents_total{{namespace="{namespace}",inferencemodel="chat"}}'
        wait_for(functools.partial(_answers, prometheus_url, chat), timeout=40, what="chat's series at 0")
        # OOMKilled: the memory limit is raised and rolled out at once; the pod running the raised
        # limit is OOMKilled again (the fix recurred, no rung left: a person is told), and once more.
        _crash(kubectl, namespace, pod, 1)
        pod = rolled_out(kubectl, namespace, pod)["metadata"]["name"]
        time.sleep(4)  # two scrapes of the judging series at 0
        assert model(kubectl, namespace, "chat")["status"]["phase"] != "Degraded"
        _crash(kubectl, namespace, pod, 2)
        assert _crash(kubectl, namespace, pod, 3)["status"]["phase"] == "Degraded"
        wait_for(
            lambda: (
                (model(kubectl, namespace, "risky").get("status") or {}).get("oomRisk", {}).get("predictedAt")
            ),
            timeout=90,
            what="an OOM-risk prediction for risky",
        )

        docs = render(operator.release, operator.namespace, ALL_ON, include_crds=False)
        [rule] = [d for d in docs if d["kind"] == "PrometheusRule"]
        [dashboard] = [
            d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")
        ]
        panels = json.loads(next(iter(dashboard["data"].values())))["panels"]
        queries = {p["title"]: t["expr"] for p in panels for t in p["targets"]}
        rules = {r["alert"]: r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]}
        alerts = {name: expr if name in FIRING else _series_part(expr) for name, expr in rules.items()}
        assert len(alerts) == 9 and len(queries) == 11 and set(FIRING) <= set(alerts)
        empty: dict[str, str] = {}
        for name, expr in {**queries, **alerts}.items():
            try:
                wait_for(functools.partial(_answers, prometheus_url, expr), timeout=40, what=name)
            except TimeoutError:
                empty[name] = expr
        lines = "\n".join(f"{k}: {v}" for k, v in empty.items())
        assert not empty, f"{len(empty)} queries answered nothing:\n{lines}"
    finally:
        targets.unlink(missing_ok=True)
        exporter.server.shutdown()
