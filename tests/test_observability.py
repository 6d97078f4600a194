"""The chart's observability objects (charts/loadline, values ``monitoring``): rendered with Helm, every
alert tested with ``promtool test rules`` (Prometheus's own evaluator), and every series they ask for one
the operator, its agent or vLLM exports (docs/observability.md).

Helm and promtool come from the e2e cache (``make tools``, e2e/install-tools.sh): missing, they are
built or unpacked here the same way, as e2e/chart.py does for Helm.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from loadline import lanes, telemetry
from loadline.agent._metrics import METRIC_NAMES as AGENT_METRICS
from loadline.handlers import _election
from loadline.traffic._names import KV_CACHE_USAGE_NAMES, REQUESTS_WAITING_NAMES
from tests.conftest import REPO

E2E = REPO / "e2e"
CHART = REPO / "charts" / "loadline"
DOC = REPO / "docs" / "observability.md"
ALL_ON = {
    "agent": {"enabled": True},
    "monitoring": {
        "podMonitors": {"operator": True, "agent": True, "models": True},
        "rules": {"enabled": True},
        "dashboard": {"enabled": True},
    },
}


def _lib_var(name: str) -> str:
    """A path from e2e/lib.sh, where the e2e tools are pinned and cached."""
    out = subprocess.run(
        ["bash", "-c", f'source "$1" && printf %s "${{{name}}}"', "lib.sh", str(E2E / "lib.sh")],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return out.stdout


@cache
def tool(component: str, var: str, binary: str) -> Path:
    """A binary of the e2e cache, installed by e2e/install-tools.sh when it is missing."""
    path = Path(_lib_var(var)) / binary
    if not path.exists():
        subprocess.run(["bash", str(E2E / "install-tools.sh"), component], check=True, timeout=3600)
    return path


def render(values: dict[str, Any], tmp_path: Path) -> list[dict[str, Any]]:
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    helm = tool("helm", "HELM_BIN", "helm")
    out = subprocess.run(
        [str(helm), "template", "obs", str(CHART), "--namespace", "ops", "--kube-version", "1.36.3",
         "-f", str(values_file)],
        check=True, capture_output=True, text=True, timeout=120,
    ).stdout  # fmt: skip
    return [doc for doc in yaml.safe_load_all(out) if doc]


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def rules(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    [rule] = of_kind(docs, "PrometheusRule")
    return [r for group in rule["spec"]["groups"] for r in group["rules"]]


def test_everything_is_off_by_default(tmp_path: Path) -> None:
    kinds = {d["kind"] for d in render({}, tmp_path)}
    assert not kinds & {"PodMonitor", "PrometheusRule"}
    assert not any(
        d["kind"] == "ConfigMap" and "dashboard" in d["metadata"]["name"] for d in render({}, tmp_path)
    )


def test_monitors_select_the_pods_the_operator_and_the_renderer_label(tmp_path: Path) -> None:
    from loadline.render import LABEL_MODEL, pod_selector

    docs = render(ALL_ON, tmp_path)
    monitors = {d["metadata"]["name"]: d["spec"] for d in of_kind(docs, "PodMonitor")}
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    agent = next(d for d in docs if d["kind"] == "DaemonSet")
    for name, workload in (("obs-loadline", deployment), ("obs-loadline-agent", agent)):
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert monitors[name]["selector"]["matchLabels"].items() <= labels.items()
        ports = {p["name"] for p in workload["spec"]["template"]["spec"]["containers"][0]["ports"]}
        assert monitors[name]["podMetricsEndpoints"][0]["port"] in ports
        # Their series name the model's namespace/pod: kept, not renamed exported_namespace.
        assert monitors[name]["podMetricsEndpoints"][0]["honorLabels"] is True
    models = monitors["obs-loadline-models"]
    keys = {e["key"] for e in models["selector"]["matchExpressions"]}
    assert LABEL_MODEL in keys and models["namespaceSelector"] == {"any": True}
    assert models["podMetricsEndpoints"][0]["port"] == "http"
    assert pod_selector("chat")["app.kubernetes.io/instance"] == "chat"
    watched = render({**ALL_ON, "settings": {"namespaces": "ml, team-b"}}, tmp_path)
    spec = next(d["spec"] for d in of_kind(watched, "PodMonitor") if d["metadata"]["name"].endswith("models"))
    assert spec["namespaceSelector"] == {"matchNames": ["ml", "team-b"]}


def _exported() -> set[str]:
    """Every series name the operator, the agent and vLLM (its table) export, as Prometheus names them."""
    names: set[str] = set()
    for metric in (*vars(telemetry).values(), _election.LEADER, lanes.LANE_WAIT):
        if hasattr(metric, "collect") and hasattr(metric, "_name"):
            base = metric._name
            kind = metric._type
            if kind == "counter":
                names.add(base + "_total")
            elif kind == "histogram":
                names |= {base + "_bucket", base + "_sum", base + "_count"}
            else:
                names.add(base)
    names |= set(AGENT_METRICS)
    names |= {m.name for m in (*KV_CACHE_USAGE_NAMES, *REQUESTS_WAITING_NAMES)}
    names.add("up")
    return names


#: The series an expression asks for: loadline's, vLLM's (the ``vllm:`` prefix) and Prometheus's ``up``.
_SERIES = re.compile(r"(?:loadline_|vllm:)[\w:]+|\bup(?=\{)")


def _series_in(expr: str) -> set[str]:
    return set(_SERIES.findall(expr))


def test_every_webhook_answer_is_a_series_at_zero_before_the_first() -> None:
    """The AdmissionFailing alert's rate() sees the first error only if a scrape saw its series at 0
    before: the process serving /metrics exports every webhook's every result from the start."""
    import socket
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for webhook in telemetry.WEBHOOKS:
        for result in telemetry.ADMISSION_RESULTS:
            with contextlib.suppress(KeyError):
                telemetry.ADMISSIONS.remove(webhook, result)
    telemetry.serve(port)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    for webhook in ("mutate-inferencemodel", "validate-inferencemodel", "validate-fleetpolicy"):
        assert f'loadline_admission_reviews_total{{result="error",webhook="{webhook}"}} 0.0' in text


def test_the_admission_process_hands_each_answer_to_its_recorder() -> None:
    """The webhooks run in a process of their own (loadline run): each answer goes to the recorder in
    that kopf run's memo, which relays it to the process serving /metrics."""
    import kopf

    from loadline.handlers import _registry

    seen: list[tuple[str, str]] = []
    memo = kopf.Memo(record_admission=lambda webhook, result, seconds: seen.append((webhook, result)))
    policy = {
        "apiVersion": "loadline.dev/v1alpha1", "kind": "FleetPolicy", "metadata": {"name": "p"},
        "spec": {"selector": {"namespaces": ["team-a"]}},
    }  # fmt: skip
    _registry.validate_fleet_policy(body=kopf.Body(policy), memo=memo)
    broken = {**policy, "spec": {"limits": {"vllmVersions": ">=0.17,,<"}}}
    with pytest.raises(kopf.AdmissionError):
        _registry.validate_fleet_policy(body=kopf.Body(broken), memo=memo)
    assert seen == [("validate-fleetpolicy", "allowed"), ("validate-fleetpolicy", "refused")]


def test_every_alert_and_panel_asks_for_series_that_exist(tmp_path: Path) -> None:
    docs = render(ALL_ON, tmp_path)
    [dashboard] = [d for d in of_kind(docs, "ConfigMap") if d["metadata"]["name"] == "obs-loadline-dashboard"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    panels = json.loads(dashboard["data"]["loadline-fleet.json"])["panels"]
    exprs = [r["expr"] for r in rules(docs)] + [t["expr"] for p in panels for t in p["targets"]]
    exported = _exported()
    for expr in exprs:
        asked = _series_in(expr)
        assert asked, expr
        assert asked <= exported, f"{expr}: {asked - exported} is exported by nothing"


def test_every_alert_has_a_runbook_section(tmp_path: Path) -> None:
    anchors = {
        re.sub(r"[^a-z0-9 -]", "", line[3:].strip().lower()).replace(" ", "-")
        for line in DOC.read_text().splitlines()
        if line.startswith("## ") or line.startswith("### ")
    }
    for rule in rules(render(ALL_ON, tmp_path)):
        url = rule["annotations"]["runbook_url"]
        assert url.split("#")[1] in anchors, f"{rule['alert']}: no section {url} in {DOC}"


# One case per alert: the series that make it fire (values every minute, promtool's notation), when it
# must not fire yet and when it must, with the labels and annotations it carries then.
M = 'namespace="ml",inferencemodel="chat"'
CASES: dict[str, dict[str, Any]] = {
    "LoadlineOperatorDown": {
        "series": {'up{job="ops/obs-loadline",pod="a"}': "1 1 1 0 0 0 0 0 0 0 0 0"},
        "quiet": 3,
        "fires": 10,
        "labels": {"severity": "critical"},
        "annotations": {
            "description": "No replica of ops/obs-loadline has been scraped for 5 minutes; models are not "
            "reconciled, crashes not remediated.",
        },
    },
    "LoadlineOperatorNotLeading": {
        "series": {
            'loadline_leader_election_status{job="ops/obs-loadline",pod="a",name="loadline"}': "1 1 0 0 0 0 0 0 0 0",
            'loadline_leader_election_status{job="ops/obs-loadline",pod="b",name="loadline"}': "0 0 0 0 0 0 0 0 0 0",
        },
        "quiet": 2,
        "fires": 9,
        "labels": {"severity": "critical"},
        "annotations": {
            "description": "The replicas of ops/obs-loadline are up but none has led for 5 minutes; nothing "
            "is reconciled.",
        },
    },
    "LoadlineAdmissionFailing": {
        "series": {
            'loadline_admission_reviews_total{webhook="validate-inferencemodel",result="error"}': "0+0x5 1+1x20",
            'loadline_admission_reviews_total{webhook="validate-inferencemodel",result="allowed"}': "0+5x25",
        },
        "quiet": 8,
        "fires": 20,
        "labels": {"severity": "warning", "webhook": "validate-inferencemodel"},
        "annotations": {
            "description": "The webhook validate-inferencemodel has answered with errors for 10 minutes; "
            "with failurePolicy Fail, InferenceModels and FleetPolicies cannot be applied.",
        },
    },
    "LoadlineOOMRiskAhead": {
        # Predicted at t = 30 h: the 6 h horizon is reached at t = 24 h (1440 min), firing 15 min later.
        "series": {
            f'loadline_oom_risk_predicted_crash_timestamp_seconds{{{M},signal="gpu_memory"}}': "108000x1500"
        },
        "quiet": 1440,
        "fires": 1460,
        "labels": {
            "severity": "warning",
            "namespace": "ml",
            "inferencemodel": "chat",
            "signal": "gpu_memory",
        },
        "annotations": {
            "description": "ml/chat: gpu_memory reaches its limit in 5h 40m 0s (kubectl get inferencemodel "
            "-o yaml: status.oomRisk).",
        },
    },
    "LoadlineCrashLoop": {
        "series": {f'loadline_oom_incidents_total{{{M},oom_class="kv_cache"}}': "0 1 1 1 2 2 2 3 3 3"},
        "quiet": 5,
        "fires": 9,
        "labels": {"severity": "critical", "namespace": "ml", "inferencemodel": "chat"},
        "annotations": {"description": "ml/chat crashed out of memory 3 times in 30 minutes."},
    },
    "LoadlineRemediationNeedsPerson": {
        "series": {
            f'loadline_remediations_total{{{M},action="none",outcome="needs_person"}}': "0 0 0 1 1 1",
            f'loadline_remediations_total{{{M},action="lower_max_num_seqs",outcome="applied"}}': "0 1 1 1 1 1",
        },
        "quiet": 2,
        "fires": 5,
        "labels": {"severity": "critical", "namespace": "ml", "inferencemodel": "chat"},
        "annotations": {
            "description": "ml/chat: the remediation is exhausted or not allowed (the NeedsAPerson Event says why).",
        },
    },
    "LoadlineRemediationFailed": {
        "series": {
            'loadline_remediation_outcomes_total{class="kv_cache",action="lower_max_num_seqs",result="recurred"}': "0 0 0 1 1 1",
            'loadline_remediation_outcomes_total{class="kv_cache",action="lower_max_num_seqs",result="worked"}': "0 1 2 3 4 5",
        },
        "quiet": 2,
        "fires": 5,
        "labels": {"severity": "warning", "class": "kv_cache", "action": "lower_max_num_seqs"},
        "annotations": {
            "description": "The fix lower_max_num_seqs for kv_cache crashes was followed by the same class again.",
        },
    },
    "LoadlineKVCacheSaturated": {
        # Two pods; one of an old version exports only the old name (operator/loadline/traffic/data).
        "series": {
            f'vllm:kv_cache_usage_perc{{{M},pod="chat-a"}}': "0.5x5 0.97x20",
            f'vllm:gpu_cache_usage_perc{{{M},pod="chat-b"}}': "0.2x25",
            'vllm:kv_cache_usage_perc{pod="unmanaged"}': "1x25",
        },
        "quiet": 12,
        "fires": 17,
        "labels": {"severity": "warning", "namespace": "ml", "inferencemodel": "chat"},
        "annotations": {
            "description": "ml/chat: KV-cache usage 97%; vLLM preempts requests and queues new ones.",
        },
    },
    "LoadlineShortOfConcurrency": {
        "series": {
            f'vllm:num_requests_waiting{{{M},pod="chat-a"}}': "0x5 2x20",
            f'vllm:num_requests_waiting{{{M},pod="chat-b"}}': "0x5 1x20",
        },
        "quiet": 12,
        "fires": 17,
        "labels": {"severity": "warning", "namespace": "ml", "inferencemodel": "chat"},
        "annotations": {
            "description": "ml/chat: 3 requests wait for room in the running batch; its replicas serve less "
            "concurrency than its callers send.",
        },
    },
}


def test_every_alert_fires_when_it_should_and_not_before(tmp_path: Path) -> None:
    rendered = rules(render(ALL_ON, tmp_path))
    by_name = {r["alert"]: r for r in rendered}
    assert set(by_name) == set(CASES), "every alert has a promtool case here, and every case an alert"
    [rule] = of_kind(render(ALL_ON, tmp_path), "PrometheusRule")
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    tests = []
    for name, case in CASES.items():
        annotations = {
            "summary": by_name[name]["annotations"]["summary"],
            "runbook_url": by_name[name]["annotations"]["runbook_url"],
            **case["annotations"],
        }
        tests.append({
            "interval": "1m",
            "input_series": [{"series": s, "values": v} for s, v in case["series"].items()],
            "alert_rule_test": [
                {"eval_time": f"{case['quiet']}m", "alertname": name, "exp_alerts": []},
                {"eval_time": f"{case['fires']}m", "alertname": name,
                 "exp_alerts": [{"exp_labels": case["labels"], "exp_annotations": annotations}]},
            ],
        })  # fmt: skip
    (tmp_path / "tests.yaml").write_text(
        yaml.safe_dump({"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests})
    )
    promtool = tool("prometheus", "PROMETHEUS_BIN", "promtool")
    check = subprocess.run(
        [str(promtool), "check", "rules", "rules.yaml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    result = subprocess.run(
        [str(promtool), "test", "rules", "tests.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_broken_alert_is_caught_by_promtool(tmp_path: Path) -> None:
    """The harness above fails when an alert misbehaves (here: a threshold no series reaches)."""
    values = {
        **ALL_ON,
        "monitoring": {**ALL_ON["monitoring"], "rules": {"enabled": True, "crashLoopCrashes": 99}},
    }
    [rule] = of_kind(render(values, tmp_path), "PrometheusRule")
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    case = CASES["LoadlineCrashLoop"]
    test = {
        "interval": "1m",
        "input_series": [{"series": s, "values": v} for s, v in case["series"].items()],
        "alert_rule_test": [{"eval_time": f"{case['fires']}m", "alertname": "LoadlineCrashLoop",
                             "exp_alerts": [{"exp_labels": case["labels"]}]}],
    }  # fmt: skip
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump({"rule_files": ["rules.yaml"], "tests": [test]}))
    promtool = tool("prometheus", "PROMETHEUS_BIN", "promtool")
    result = subprocess.run(
        [str(promtool), "test", "rules", "tests.yaml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode != 0 and "LoadlineCrashLoop" in result.stdout + result.stderr
