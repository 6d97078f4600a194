"""Golden files of rendered manifests for several vLLM versions, and schema validation of every object.

The plans here are built by hand (fixed GPU layout and engine settings) so that the goldens test the
renderer alone and do not move when the planner's coefficients are refitted. Regenerate after an
intended change with ``LOADLINE_UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_render_golden.py`` and
review the diff like code.

Schema validation uses the ``kubernetes-validate`` package (strict: unknown fields are errors). The
LeaderWorkerSet is a CRD the package has no schema for, so its two pod templates are validated as
core ``PodTemplate`` objects and its own fields are checked against the LeaderWorkerSet v1 API types
(sigs.k8s.io/lws api/leaderworkerset/v1/leaderworkerset_types.go).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from loadline.api import InferenceModel, load_inference_models, parse_inference_model
from loadline.render import manifests_yaml, render_manifests
from loadline.sizing import (
    Candidate,
    EngineSettings,
    MemoryBudget,
    Plan,
    find_gpu,
    plan_inference_model,
    resolve_inputs,
    resolve_model,
)
from tests.conftest import LLAMA_8B

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden" / "render"
UPDATE = os.environ.get("LOADLINE_UPDATE_GOLDEN") == "1"
K8S_VERSIONS = ("1.31", "1.37")

LLAMA = LLAMA_8B  # the shared Llama-3.1-8B config (tests/conftest.py)
LLAMA_70B = {
    **LLAMA,
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_attention_heads": 64,
    "num_hidden_layers": 80,
}
LLAMA_405B = {
    **LLAMA,
    "hidden_size": 16384,
    "intermediate_size": 53248,
    "num_attention_heads": 128,
    "num_hidden_layers": 126,
}


def _obj(name: str, namespace: str, spec: dict[str, Any]) -> InferenceModel:
    return parse_inference_model(
        {
            "apiVersion": "loadline.dev/v1alpha1",
            "kind": "InferenceModel",
            "metadata": {"name": name, "namespace": namespace, "labels": {"team": "golden"}},
            "spec": spec,
        }
    )


def fixed_plan(
    obj: InferenceModel,
    gpu_name: str,
    tp: int,
    pp: int,
    nodes: int,
    *,
    weights_gib: float,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    kv_cache_gib: float,
    kv_cache_tokens: int,
) -> Plan:
    """A plan with the given layout and numbers, independent of the planner's model."""
    spec = obj.spec
    model = resolve_model(spec)
    inputs = resolve_inputs(spec, model)
    gpu = find_gpu(gpu_name)
    settings = EngineSettings(
        dtype=inputs.dtype,
        quantization=inputs.quantization,
        kv_cache_dtype=inputs.kv_cache_dtype,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        gpu_memory_utilization=0.9,
        max_model_len=inputs.max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        enforce_eager=inputs.enforce_eager,
        cuda_graph_in_kv_budget=False,
        block_size=16,
    )
    budget = MemoryBudget(
        total_gib=gpu.memory_gib,
        weights_gib=weights_gib,
        activation_gib=1.0,
        non_torch_gib=0.5,
        cuda_graph_gib=1.0,
        kv_cache_gib=kv_cache_gib,
        kv_cache_tokens=kv_cache_tokens,
        kv_bytes_per_token=131072,
        gpu_blocks=kv_cache_tokens // 16,
        max_concurrency=kv_cache_tokens / inputs.max_model_len,
        startup_headroom_gib=2.0,
        sampler_warmup_gib=0.5,
    )
    chosen = Candidate(gpu, tp, pp, nodes, settings, budget)
    return Plan(model, inputs, chosen, spec.replicas, (chosen,))


def chat_8b() -> tuple[InferenceModel, Plan]:
    obj = _obj(
        "chat",
        "team-a",
        {
            "model": {
                "name": "meta-llama/Llama-3.1-8B-Instruct",
                "servedName": "chat",
                "config": LLAMA,
                "tokenSecretRef": {"name": "hf-token"},
            },
            "dtype": "bfloat16",
            "maxModelLen": 8192,
            "concurrency": 8,
            "replicas": 2,
            "kvOffload": {"cpuGiB": 16},
            "engine": {
                "extraArgs": ["--enable-prefix-caching"],
                "env": [{"name": "VLLM_LOGGING_LEVEL", "value": "INFO"}],
            },
        },
    )
    plan = fixed_plan(
        obj,
        "L40S",
        1,
        1,
        1,
        weights_gib=14.96,
        max_num_seqs=256,
        max_num_batched_tokens=2048,
        kv_cache_gib=22.5,
        kv_cache_tokens=184320,
    )
    return obj, plan


def llama_70b_tp4() -> tuple[InferenceModel, Plan]:
    obj = _obj(
        "llama-70b",
        "team-a",
        {
            "model": {"name": "meta-llama/Llama-3.3-70B-Instruct", "config": LLAMA_70B},
            "maxModelLen": 16384,
            "kvCacheDtype": "fp8",
            "concurrency": 16,
            "engine": {"enforceEager": True},
        },
    )
    plan = fixed_plan(
        obj,
        "H100-80GB",
        4,
        1,
        1,
        weights_gib=32.85,
        max_num_seqs=1024,
        max_num_batched_tokens=8192,
        kv_cache_gib=35.0,
        kv_cache_tokens=458752,
    )
    return obj, plan


def llama_405b_pp2() -> tuple[InferenceModel, Plan]:
    obj = _obj(
        "llama-405b",
        "research",
        {
            "model": {
                "name": "meta-llama/Llama-3.1-405B",
                "config": LLAMA_405B,
                "tokenSecretRef": {"name": "hf"},
            },
            "maxModelLen": 8192,
            "concurrency": 4,
            "kvOffload": {"cpuGiB": 128},
            "gpu": {"types": ["H100-80GB"]},
        },
    )
    plan = fixed_plan(
        obj,
        "H100-80GB",
        8,
        2,
        2,
        weights_gib=47.25,
        max_num_seqs=1024,
        max_num_batched_tokens=8192,
        kv_cache_gib=19.6,
        kv_cache_tokens=652128,
    )
    return obj, plan


CASES = [
    *[("chat-8b", chat_8b, v) for v in ("0.8.0", "0.10.0", "0.11.0", "0.12.0", "0.17.0", "0.19.0", "0.30.0")],
    ("llama-70b-tp4", llama_70b_tp4, "0.19.0"),
    ("llama-405b-pp2", llama_405b_pp2, "0.11.0"),
    ("llama-405b-pp2", llama_405b_pp2, "0.30.0"),
]


@pytest.mark.parametrize(("name", "build", "version"), CASES, ids=[f"{n}-v{v}" for n, _, v in CASES])
def test_golden(name: str, build: Any, version: str) -> None:
    obj, plan = build()
    objects = render_manifests(obj, plan, vllm_version=version)
    text = manifests_yaml(objects, source=f"tests/test_render_golden.py {name}")
    path = GOLDEN / f"{name}-v{version}.yaml"
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with LOADLINE_UPDATE_GOLDEN=1"
    assert text == path.read_text(), (
        f"{path.name} differs: review, then regenerate with LOADLINE_UPDATE_GOLDEN=1"
    )
    assert list(yaml.safe_load_all(text)) == objects


# ---- schema validation ----

LWS_SPEC_FIELDS = {"replicas", "leaderWorkerTemplate", "rolloutStrategy", "startupPolicy", "networkConfig"}
LWS_TEMPLATE_FIELDS = {
    "leaderTemplate",
    "workerTemplate",
    "size",
    "restartPolicy",
    "subGroupPolicy",
    "volumeClaimTemplates",
    "persistentVolumeClaimRetentionPolicy",
}
LWS_RESTART_POLICIES = {"Default", "RecreateGroupOnPodRestart", "RecreateGroupAfterStart", "None"}


def _validate_core(obj: dict[str, Any]) -> None:
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(obj, version, strict=True)


def _validate_lws(obj: dict[str, Any]) -> None:
    assert obj["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    spec = obj["spec"]
    assert set(spec) <= LWS_SPEC_FIELDS
    assert spec["startupPolicy"] in {"LeaderCreated", "LeaderReady"}
    assert spec["rolloutStrategy"]["type"] == "RollingUpdate"
    assert set(spec["rolloutStrategy"]["rollingUpdateConfiguration"]) <= {
        "partition",
        "maxUnavailable",
        "maxSurge",
    }
    template = spec["leaderWorkerTemplate"]
    assert set(template) <= LWS_TEMPLATE_FIELDS
    assert isinstance(template["size"], int) and template["size"] >= 1
    assert template["restartPolicy"] in LWS_RESTART_POLICIES
    meta = {"apiVersion": "v1", "kind": "Service", "metadata": obj["metadata"], "spec": {}}
    _validate_core(meta)  # the object's metadata, validated as ObjectMeta
    for key in ("leaderTemplate", "workerTemplate"):
        _validate_core(
            {
                "apiVersion": "v1",
                "kind": "PodTemplate",
                "metadata": {"name": f"{obj['metadata']['name']}-{key.lower()}"},
                "template": template[key],
            }
        )


def validate(obj: dict[str, Any]) -> None:
    if obj["kind"] == "LeaderWorkerSet":
        _validate_lws(obj)
    else:
        _validate_core(obj)


@pytest.mark.parametrize(("name", "build", "version"), CASES, ids=[f"{n}-v{v}" for n, _, v in CASES])
def test_rendered_objects_validate_against_kubernetes_schemas(name: str, build: Any, version: str) -> None:
    obj, plan = build()
    for rendered in render_manifests(obj, plan, vllm_version=version):
        validate(rendered)


EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_examples_render_and_validate(path: Path) -> None:
    """Every example, planned by the real planner, renders to valid objects (what `make demo` shows)."""
    for obj in load_inference_models(path):
        objects = render_manifests(obj, plan_inference_model(obj.spec))
        assert objects[0]["kind"] in {"Deployment", "LeaderWorkerSet"}
        for rendered in objects:
            validate(rendered)


def test_schema_validation_catches_a_broken_object() -> None:
    obj, plan = chat_8b()
    deployment = render_manifests(obj, plan)[0]
    deployment["spec"]["template"]["spec"]["containers"][0]["terminationMessagePolicy"] = 42
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate_core(deployment)
