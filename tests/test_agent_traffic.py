"""The operator side of the agent: PromQL that reads its series (or DCGM's), and the measured-use figure."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from loadline.agent import METRIC_NAMES
from loadline.traffic import (
    AGENT_CONTAINER_MEMORY_USED,
    agent_gpu_memory_growth_query,
    gpu_memory_growth_query,
    gpu_memory_trend_query,
    gpu_memory_used_query,
    incident_metrics,
    measured_gpu_memory,
)
from tests.promserver import FakePrometheus

SEL = '{namespace="team-a",pod="vllm-0"}'
EXPORTED = '{exported_namespace="team-a",exported_pod="vllm-0"}'


def test_the_operator_queries_the_series_the_agent_exports() -> None:
    assert AGENT_CONTAINER_MEMORY_USED in METRIC_NAMES


def test_agent_growth_is_per_gpu_of_the_pod_in_gib_per_hour() -> None:
    assert agent_gpu_memory_growth_query("team-a", "vllm-0") == (
        f"(max(sum by (uuid) (deriv(loadline_gpu_container_memory_used_bytes{SEL}[1h]))) or "
        f"max(sum by (uuid) (deriv(loadline_gpu_container_memory_used_bytes{EXPORTED}[1h])))) * 3600 / 1073741824"
    )


def test_the_trend_asks_the_agent_first_then_dcgm() -> None:
    q = gpu_memory_trend_query("team-a", "vllm-0", window=7200, node="gpu-node-3")
    agent, dcgm = q.split(" or (max(deriv(DCGM", 1)
    assert agent == agent_gpu_memory_growth_query("team-a", "vllm-0", 7200)
    # The DCGM part is exactly the DCGM-only query: clusters without the agent see no change.
    assert "(max(deriv(DCGM" + dcgm == gpu_memory_growth_query("team-a", "vllm-0", 7200, "gpu-node-3")


def test_pod_names_are_escaped() -> None:
    assert 'pod="we\\"ird"' in gpu_memory_trend_query("ns", 'we"ird')


def test_used_query_reads_both_sources_per_gpu() -> None:
    q = gpu_memory_used_query("team-a", "vllm-0")
    assert q.startswith(f"(label_replace(sum by (uuid) (loadline_gpu_container_memory_used_bytes{SEL}) or ")
    assert (
        f'max by (uuid) (label_replace(DCGM_FI_DEV_FB_USED{SEL}, "uuid", "$1", "UUID", "(.*)")) * 1048576'
        in q
    )
    # Each sample says its source; DCGM's answers only for a GPU the agent does not report.
    assert '"source", "loadline-agent", "", "") or on (uuid) label_replace(' in q
    assert q.endswith('"source", "dcgm", "", "")) / 1073741824')


def vector(*samples: tuple[dict[str, str], float]) -> dict[str, Any]:
    return {
        "status": "success",
        "data": {"resultType": "vector", "result": [{"metric": m, "value": [0, str(v)]} for m, v in samples]},
    }


def test_measured_use_compares_the_busiest_gpu_with_the_plan() -> None:
    answers = {
        "vllm-0": vector(({"uuid": "GPU-a"}, 70.4), ({"uuid": "GPU-b"}, 71.26)),
        "vllm-1": vector(({"uuid": "GPU-c"}, 69.0)),
    }
    assert measured_gpu_memory(answers, planned_gib=70.9) == {
        "gpus": 3,
        "maxUsedGiB": 71.26,
        "plannedGiB": 70.9,
        "driftGiB": 0.36,
    }


def test_measured_use_names_the_busiest_gpus_source() -> None:
    answers = {
        "vllm-0": vector(({"uuid": "GPU-a", "source": "dcgm"}, 70.4)),
        "vllm-1": vector(({"uuid": "GPU-b", "source": "loadline-agent"}, 71.0)),
    }
    assert measured_gpu_memory(answers, planned_gib=70.9)["source"] == "loadline-agent"  # type: ignore[index]
    other = {"vllm-0": vector(({"uuid": "GPU-a", "source": "nvidia-smi"}, 1.0))}
    assert "source" not in (measured_gpu_memory(other, 1.0) or {})


def test_nothing_measured_leaves_status_alone() -> None:
    assert measured_gpu_memory({"vllm-0": vector()}, 70.0) is None
    assert measured_gpu_memory({"vllm-0": None}, 70.0) is None


@pytest.fixture
def prometheus() -> Iterator[str]:
    """Answers the agent's growth (and nothing else), as a cluster with the agent but no DCGM would."""
    server = FakePrometheus(lambda q: vector(({}, 0.75)) if AGENT_CONTAINER_MEMORY_USED in q else vector())
    yield server.url
    server.close()


def test_incident_metrics_take_the_growth_from_the_agent(prometheus: str) -> None:
    m = incident_metrics(prometheus, "team-a", "vllm-0", 1_800_000_000.0, "0.12.0")
    assert m == {"gpu_memory_growth_gib_per_hour": 0.75}
