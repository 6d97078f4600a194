"""The model cache and the start-up probe are sized from what the pod downloads, and an existing volume
can replace the emptyDir.

Sizes are checked against the checkpoint formats' arithmetic (parameters × bytes per parameter), not
against figures copied from the Hub: none were fetched here.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from loadline.api import InferenceModel, parse_inference_model
from loadline.errors import RenderError, SpecError
from loadline.render import render_manifests
from loadline.render._resources import DOWNLOAD_BYTES_PER_SECOND, LOAD_BYTES_PER_SECOND, pod_resources
from loadline.sizing import (
    checkpoint_download,
    count_parameters,
    find_catalog_model,
    parse_hf_config,
    plan_inference_model,
)
from loadline.sizing._download import checkpoint_formats
from tests.conftest import LLAMA_8B
from tests.test_render_golden import _validate_core

GB = 1e9
GIB = 1024**3


def _catalog_download(model_id: str) -> Any:
    entry = find_catalog_model(model_id)
    assert entry is not None
    return checkpoint_download(parse_hf_config(entry.config), entry.parameters)


def _obj(spec: dict[str, Any]) -> InferenceModel:
    return parse_inference_model(
        {
            "apiVersion": "loadline.dev/v1alpha1",
            "kind": "InferenceModel",
            "metadata": {"name": "chat", "namespace": "team-a"},
            "spec": spec,
        }
    )


def _deployment_pod(obj: InferenceModel) -> tuple[dict[str, Any], dict[str, Any]]:
    plan = plan_inference_model(obj.spec)
    objects = render_manifests(obj, plan)
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    _validate_core(deployment)
    pod = deployment["spec"]["template"]["spec"]
    return pod, pod["containers"][0]


LLAMA_SPEC: dict[str, Any] = {
    "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
    "maxModelLen": 8192,
    "gpu": {"types": ["L40S"]},
}


def test_bf16_8b_download_is_the_checkpoint_size() -> None:
    download = _catalog_download("meta-llama/Llama-3.1-8B-Instruct")
    assert download.format == "bfloat16"
    entry = find_catalog_model("meta-llama/Llama-3.1-8B-Instruct")
    assert entry is not None and entry.parameters is not None
    assert download.weights_bytes == pytest.approx(entry.parameters * 2, rel=0.001)  # bf16: 2 bytes each
    # The margin covers tokenizer/config files and headers, but is not a second copy.
    assert 0.5 * GIB <= download.margin_bytes <= 1 * GIB


def test_online_fp8_downloads_the_bf16_files_and_sizes_cache_and_probe_from_them() -> None:
    # 70B: large enough that the old rule (1.25 × in-GPU weights + 20 GiB) falls short of the download.
    spec = {
        **LLAMA_SPEC,
        "model": {"name": "meta-llama/Llama-3.1-70B-Instruct"},
        "gpu": {"types": ["H100-80GB"]},
    }
    bf16 = _obj(spec)
    fp8 = _obj({**spec, "quantization": "fp8"})
    plan_bf16, plan_fp8 = plan_inference_model(bf16.spec), plan_inference_model(fp8.spec)
    # On the GPUs fp8 holds about half (whatever the GPU count each plan tuned its way to); the pod
    # still downloads the bf16 checkpoint.
    fp8_total = plan_fp8.budget.weights_gib * plan_fp8.chosen.gpus
    assert fp8_total < 0.6 * plan_bf16.budget.weights_gib * plan_bf16.chosen.gpus
    assert plan_fp8.download == plan_bf16.download
    assert plan_fp8.summary().model_dump(by_alias=True, mode="json")["downloadGiB"] == round(
        plan_bf16.download.gib, 2
    )
    download = plan_fp8.download
    pod, container = _deployment_pod(fp8)
    data = next(v for v in pod["volumes"] if v["name"] == "data")
    size_limit = int(data["emptyDir"]["sizeLimit"].removesuffix("Gi"))
    gpu_weights_gib = plan_fp8.budget.weights_gib * plan_fp8.chosen.gpus
    assert download.gib > 1.8 * gpu_weights_gib
    assert size_limit >= download.gib > 1.25 * gpu_weights_gib + 20
    assert container["resources"]["requests"]["ephemeral-storage"] == data["emptyDir"]["sizeLimit"]
    probe = container["startupProbe"]
    budget = probe["failureThreshold"] * probe["periodSeconds"]
    assert budget >= download.bytes / DOWNLOAD_BYTES_PER_SECOND + download.bytes / LOAD_BYTES_PER_SECOND


def test_awq_and_gptq_4bit_checkpoints_download_about_a_quarter_of_the_linear_weights() -> None:
    bf16 = checkpoint_download(parse_hf_config(LLAMA_8B))
    counts = count_parameters(parse_hf_config(LLAMA_8B))
    margin = checkpoint_formats().margin
    for method in ("awq", "gptq"):
        config = {**LLAMA_8B, "quantization_config": {"quant_method": method, "bits": 4, "group_size": 128}}
        download = checkpoint_download(parse_hf_config(config))
        assert download.format.startswith(f"{method} 4-bit")
        # Linear layers: 4 bits plus an fp16 scale and a 4-bit zero per 128 weights; the rest bf16.
        expected = counts.linear * (4 + 20 / 128) / 8 + (counts.total - counts.linear) * 2
        assert download.weights_bytes == pytest.approx(expected, rel=1e-6)
        assert download.bytes == pytest.approx(
            expected * (1 + margin.fraction) + margin.fixed_gib * GIB, 1e-6
        )
        # Embeddings and lm_head stay bf16, so the whole is between a quarter and 40 %.
        assert 0.25 < download.weights_bytes / bf16.weights_bytes < 0.4
    # The catalog's GPTQ w4a16 build of Llama 3.1 8B is read from its own quantization_config.
    w4a16 = _catalog_download("RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w4a16")
    assert 0.25 < w4a16.weights_bytes / bf16.weights_bytes < 0.4


def test_mxfp4_gpt_oss_downloads_4bit_experts_and_bf16_rest() -> None:
    download = _catalog_download("openai/gpt-oss-20b")
    assert download.format.startswith("mxfp4 4-bit")
    # Not sized as a bf16 checkpoint (42 GB) nor as everything at 4 bits.
    entry = find_catalog_model("openai/gpt-oss-20b")
    assert entry is not None
    assert download.weights_bytes > entry.parameters * 0.5 * 1.1  # type: ignore[operator]
    assert download.weights_bytes < entry.parameters * 2 * 0.5  # type: ignore[operator]


def test_unknown_quant_format_is_sized_as_its_dtype_an_upper_bound() -> None:
    config = {**LLAMA_8B, "quantization_config": {"quant_method": "some-new-format", "bits": 2}}
    download = checkpoint_download(parse_hf_config(config))
    assert download.weights_bytes == checkpoint_download(parse_hf_config(LLAMA_8B)).weights_bytes
    assert "unknown format" in download.format


def test_existing_pvc_replaces_the_emptydir_and_the_probe_skips_the_download() -> None:
    cache = {"persistentVolumeClaim": {"claimName": "models"}, "subPath": "llama-8b"}
    obj = _obj({**LLAMA_SPEC, "modelCache": cache})
    pod, container = _deployment_pod(obj)
    data = next(v for v in pod["volumes"] if v["name"] == "data")
    assert data == {"name": "data", "persistentVolumeClaim": {"claimName": "models", "readOnly": False}}
    assert [v["name"] for v in pod["volumes"] if "emptyDir" in v] == ["dshm"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "data")
    assert mount == {"name": "data", "mountPath": "/data", "subPath": "llama-8b"}
    assert "ephemeral-storage" not in container["resources"]["requests"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["HF_HOME"] == "/data/huggingface" and env["HOME"] == "/data"


def test_with_an_existing_cache_the_probe_budgets_loading_not_downloading() -> None:
    spec = {"model": {"name": "meta-llama/Llama-3.1-70B-Instruct"}, "maxModelLen": 8192}
    spec["gpu"] = {"types": ["H100-80GB"]}
    fresh = _obj(spec)
    cached = _obj({**spec, "modelCache": {"persistentVolumeClaim": {"claimName": "models"}}})
    plan = plan_inference_model(fresh.spec)
    with_pvc = pod_resources(cached, plan).startup_seconds
    without = pod_resources(fresh, plan).startup_seconds
    download_seconds = plan.download.bytes / DOWNLOAD_BYTES_PER_SECOND
    # 133 GiB: ~48 min of download at the assumed floor, which the existing cache does not need.
    assert with_pvc >= plan.download.bytes / LOAD_BYTES_PER_SECOND
    assert without - with_pvc == pytest.approx(download_seconds, abs=10)


def test_read_only_pvc_gets_scratch_for_engine_caches_and_offline_hub() -> None:
    cache = {"persistentVolumeClaim": {"claimName": "models", "readOnly": True}}
    pod, container = _deployment_pod(_obj({**LLAMA_SPEC, "modelCache": cache}))
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["data"] == {"name": "data", "mountPath": "/data", "readOnly": True}
    assert mounts["scratch"]["mountPath"] == "/scratch"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["HOME"] == "/scratch" and env["HF_HUB_OFFLINE"] == "1"
    assert env["HF_HOME"] == "/data/huggingface"
    scratch = next(v for v in pod["volumes"] if v["name"] == "scratch")
    assert container["resources"]["requests"]["ephemeral-storage"] == scratch["emptyDir"]["sizeLimit"]


@pytest.mark.parametrize(
    ("cache", "field"),
    [
        ({"persistentVolumeClaim": {"claimName": "models"}, "subPath": "../other"}, "spec.modelCache"),
        ({"persistentVolumeClaim": {"claimName": "models"}, "subPath": "/abs"}, "spec.modelCache"),
        ({"persistentVolumeClaim": {}}, "spec.modelCache.persistentVolumeClaim.claimName"),
        (
            {"persistentVolumeClaim": {"claimName": "Bad_Name"}},
            "spec.modelCache.persistentVolumeClaim.claimName",
        ),
        ({"subPath": "x"}, "spec.modelCache.persistentVolumeClaim"),
    ],
)
def test_bad_model_cache_is_one_line_naming_the_field(cache: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as info:
        _obj({**LLAMA_SPEC, "modelCache": cache})
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(field)


def test_cache_size_limit_rule_from_download() -> None:
    obj = _obj(LLAMA_SPEC)
    plan = plan_inference_model(obj.spec)
    res = pod_resources(obj, plan)
    assert res.cache_gib == math.ceil(1.1 * plan.download.gib + 20)


def test_read_only_cache_refuses_engine_caches_on_the_read_only_volume() -> None:
    cache = {"persistentVolumeClaim": {"claimName": "models", "readOnly": True}}
    env = [{"name": "VLLM_CACHE_ROOT", "value": "/data/vllm"}]
    obj = _obj({**LLAMA_SPEC, "modelCache": cache, "engine": {"env": env}})
    with pytest.raises(RenderError, match=r"^spec\.engine\.env\[0\]: VLLM_CACHE_ROOT=.*/scratch"):
        render_manifests(obj, plan_inference_model(obj.spec))
    ok = _obj(
        {**LLAMA_SPEC, "modelCache": cache, "engine": {"env": [{"name": "HOME", "value": "/scratch/h"}]}}
    )
    _, container = _deployment_pod(ok)
    assert {"name": "HOME", "value": "/scratch/h"} in container["env"]
