"""The vLLM manifest renderer: structure, version gating of flags, extraArgs errors, env, resources,
multi-node LeaderWorkerSet, and that no CR string can change the YAML structure.

Models are given inline (spec.model.config) so these tests do not depend on the model catalog.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
import yaml

from loadline.api import InferenceModel, parse_inference_model
from loadline.errors import RenderError
from loadline.render import (
    ANNOTATION_NOTES,
    ANNOTATION_PLAN,
    canonical_flag,
    child_kinds,
    flag_table,
    manifests_yaml,
    pod_resources,
    render_manifests,
    service_name,
    version_text,
    workload_ref,
)
from loadline.render._template import environment, quote
from loadline.sizing import plan_inference_model
from tests.conftest import LLAMA_8B

LLAMA_405B = {
    **LLAMA_8B,
    "hidden_size": 16384,
    "intermediate_size": 53248,
    "num_attention_heads": 128,
    "num_hidden_layers": 126,
}
AWQ_8B = {
    **LLAMA_8B,
    "torch_dtype": "float16",
    "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True},
}

# Every minor release, and every patch release where some flag appears or disappears: the versions at
# which rendering can change (all 47 releases would triple this file's run time for no new case).
_BOUNDARIES = {b for f in flag_table().flags.values() for b in (f.since, f.until) if b is not None}
ALL_RELEASES = [version_text(v) for v in flag_table().releases if v[2] == 0 or v in _BOUNDARIES]


def make_obj(spec: dict[str, Any] | None = None, metadata: dict[str, Any] | None = None) -> InferenceModel:
    base: dict[str, Any] = {
        "model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "config": LLAMA_8B},
        "maxModelLen": 8192,
        "concurrency": 4,
        "engine": {"version": "0.19.0"},
        "gpu": {"types": ["L40S"]},
    }
    for key, value in (spec or {}).items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    return parse_inference_model(
        {
            "apiVersion": "loadline.dev/v1alpha1",
            "kind": "InferenceModel",
            "metadata": metadata if metadata is not None else {"name": "chat", "namespace": "team-a"},
            "spec": base,
        }
    )


def render(obj: InferenceModel, version: str | None = None) -> list[dict[str, Any]]:
    return render_manifests(obj, plan_inference_model(obj.spec), vllm_version=version)


def by_kind(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["kind"]: o for o in objects}


def pod_spec(objects: list[dict[str, Any]], role: str = "leader") -> dict[str, Any]:
    kinds = by_kind(objects)
    if "Deployment" in kinds:
        spec: dict[str, Any] = kinds["Deployment"]["spec"]["template"]["spec"]
        return spec
    template = kinds["LeaderWorkerSet"]["spec"]["leaderWorkerTemplate"][f"{role}Template"]
    lws_spec: dict[str, Any] = template["spec"]
    return lws_spec


def container(objects: list[dict[str, Any]], role: str = "leader") -> dict[str, Any]:
    c: dict[str, Any] = pod_spec(objects, role)["containers"][0]
    return c


def argv(objects: list[dict[str, Any]]) -> list[str]:
    c = container(objects)
    return [*c["command"], *c["args"]]


def flag_value(args: list[str], flag: str) -> str | None:
    if flag not in args:
        return None
    return args[args.index(flag) + 1]


# ---- structure of a single-node replica ----


def test_single_node_renders_deployment_service_and_pdb() -> None:
    objects = render(make_obj())
    assert [o["kind"] for o in objects] == ["Deployment", "Service", "PodDisruptionBudget"]
    labels = objects[0]["metadata"]["labels"]
    assert labels["app.kubernetes.io/name"] == "vllm"
    assert labels["app.kubernetes.io/instance"] == "chat"
    assert labels["app.kubernetes.io/managed-by"] == "loadline"
    assert labels["loadline.dev/inferencemodel"] == "chat"
    for obj in objects:
        assert obj["metadata"]["name"] == "chat"
        assert obj["metadata"]["namespace"] == "team-a"
    service = by_kind(objects)["Service"]
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP", "appProtocol": "http"}
    ]
    pdb = by_kind(objects)["PodDisruptionBudget"]
    assert pdb["spec"]["maxUnavailable"] == 1
    template_labels = objects[0]["spec"]["template"]["metadata"]["labels"]
    assert all(template_labels[k] == v for k, v in service["spec"]["selector"].items())
    assert all(template_labels[k] == v for k, v in pdb["spec"]["selector"]["matchLabels"].items())


def test_plan_summary_annotation() -> None:
    obj = make_obj()
    plan = plan_inference_model(obj.spec)
    objects = render_manifests(obj, plan)
    summary = yaml.safe_load(objects[0]["metadata"]["annotations"][ANNOTATION_PLAN])
    assert summary["gpu"] == plan.summary().model_dump(by_alias=True, mode="json")["gpu"]
    assert summary["tensorParallelSize"] == plan.chosen.tensor_parallel_size
    assert summary["pipelineParallelSize"] == 1
    assert summary["vllmVersion"] == "0.19.0"


def test_vllm_command_carries_the_plan() -> None:
    obj = make_obj({"kvCacheDtype": "fp8", "engine": {"enforceEager": True}})
    plan = plan_inference_model(obj.spec)
    args = argv(render_manifests(obj, plan))
    s = plan.settings
    assert args[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"]
    assert flag_value(args, "--max-model-len") == str(s.max_model_len)
    assert flag_value(args, "--max-num-seqs") == str(s.max_num_seqs)
    assert flag_value(args, "--max-num-batched-tokens") == str(s.max_num_batched_tokens)
    assert flag_value(args, "--gpu-memory-utilization") == format(s.gpu_memory_utilization, "g")
    assert flag_value(args, "--tensor-parallel-size") == str(plan.chosen.tensor_parallel_size)
    assert flag_value(args, "--dtype") == "bfloat16"
    assert flag_value(args, "--kv-cache-dtype") == "fp8"
    assert flag_value(args, "--port") == "8000"
    assert flag_value(args, "--host") == "0.0.0.0"
    assert "--enforce-eager" in args
    assert "--pipeline-parallel-size" not in args
    assert "--quantization" not in args
    assert "--served-model-name" not in args


def test_optional_model_flags() -> None:
    obj = make_obj({"model": {"servedName": "chat", "revision": "a1b2c3"}})
    args = argv(render(obj))
    assert flag_value(args, "--served-model-name") == "chat"
    assert flag_value(args, "--revision") == "a1b2c3"
    assert "--kv-cache-dtype" not in args


def test_quantization_only_when_the_spec_names_a_method() -> None:
    checkpoint = make_obj({"model": {"config": AWQ_8B}})
    assert "--quantization" not in argv(render(checkpoint))
    explicit = make_obj({"model": {"config": AWQ_8B}, "quantization": "awq_marlin"})
    assert flag_value(argv(render(explicit)), "--quantization") == "awq_marlin"


def test_pod_hardening_and_gpu_placement() -> None:
    obj = make_obj()
    plan = plan_inference_model(obj.spec)
    objects = render_manifests(obj, plan)
    spec = pod_spec(objects)
    c = container(objects)
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] == 1000
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"
    gpus = str(plan.chosen.gpus)
    assert c["resources"]["requests"]["nvidia.com/gpu"] == gpus
    assert c["resources"]["limits"]["nvidia.com/gpu"] == gpus
    assert c["resources"]["requests"]["memory"] == c["resources"]["limits"]["memory"]
    term = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["nodeSelectorTerms"][0]["matchExpressions"] == [
        {"key": "nvidia.com/gpu.product", "operator": "In", "values": [plan.chosen.gpu.product]}
    ]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    assert volumes["dshm"]["emptyDir"]["sizeLimit"].endswith("Gi")
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert {"/dev/shm", "/data"} <= mounts
    env = {e["name"]: e for e in c["env"]}
    assert env["PYTORCH_CUDA_ALLOC_CONF"]["value"] == "expandable_segments:True"
    assert env["PYTORCH_ALLOC_CONF"]["value"] == "expandable_segments:True"
    assert env["HOME"]["value"] == "/data"
    assert env["HF_HOME"]["value"].startswith("/data")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/health", "port": "http"}


def test_startup_probe_scales_with_weights() -> None:
    small = container(render(make_obj()))["startupProbe"]
    big_obj = make_obj({"model": {"config": LLAMA_405B}, "gpu": {"types": ["H100-80GB"]}, "concurrency": 1})
    big = container(render(big_obj))["startupProbe"]
    small_budget = small["failureThreshold"] * small["periodSeconds"]
    big_budget = big["failureThreshold"] * big["periodSeconds"]
    assert small_budget >= 600
    # ~750 GiB at 50 MB/s is over four hours.
    assert big_budget >= 4 * 3600
    assert big_budget > small_budget


def test_a_deployment_waits_its_pods_image_pull_and_start_up_budget_before_it_counts_as_stalled() -> None:
    """Kubernetes' default progress deadline (600 s) is the smallest start-up budget alone: a model
    still loading its weights would read as a failed roll-out (ProgressDeadlineExceeded) to Argo CD and
    ``kubectl rollout status``."""
    objects = by_kind(render(make_obj()))
    probe = container(list(objects.values()), "server")["startupProbe"]
    budget = probe["failureThreshold"] * probe["periodSeconds"]
    assert objects["Deployment"]["spec"]["progressDeadlineSeconds"] >= budget + 300 > 600
    # A bigger checkpoint takes longer to start, and the deadline follows it.
    big = make_obj({"model": {"config": LLAMA_405B}, "gpu": {"types": ["H100-80GB"]}, "concurrency": 1})
    assert pod_resources(big, plan_inference_model(big.spec)).progress_deadline_seconds >= 4 * 3600


def test_host_resources_default_rule_and_overrides() -> None:
    obj = make_obj()
    plan = plan_inference_model(obj.spec)
    res = container(render_manifests(obj, plan))["resources"]
    weights = plan.budget.weights_gib * plan.chosen.gpus
    memory = int(res["requests"]["memory"].removesuffix("Gi"))
    assert memory >= max(16, weights + 4)
    assert "cpu" not in res["limits"]  # no CPU limit: throttling the engine's busy loop costs latency
    offload = make_obj({"kvOffload": {"cpuGiB": 32}})
    res_offload = container(render(offload))["resources"]
    assert int(res_offload["requests"]["memory"].removesuffix("Gi")) >= memory + 32
    fixed = make_obj({"resources": {"memoryGiB": 48, "cpu": 6}})
    res_fixed = container(render(fixed))["resources"]
    assert res_fixed["requests"]["memory"] == "48Gi"
    assert res_fixed["limits"]["memory"] == "48Gi"
    assert res_fixed["requests"]["cpu"] == "6"


def test_image_follows_version_unless_set() -> None:
    assert container(render(make_obj()))["image"] == "vllm/vllm-openai:v0.19.0"
    assert container(render(make_obj(), "0.12.0"))["image"] == "vllm/vllm-openai:v0.12.0"
    custom = make_obj({"engine": {"image": "registry.example/vllm:patched"}})
    assert container(render(custom, "0.12.0"))["image"] == "registry.example/vllm:patched"


def test_owner_reference_when_uid_known() -> None:
    obj = make_obj(metadata={"name": "chat", "namespace": "ns", "uid": "1234-abcd"})
    for o in render(obj):
        ref = o["metadata"]["ownerReferences"][0]
        assert ref["kind"] == "InferenceModel"
        assert ref["uid"] == "1234-abcd"
        assert ref["controller"] is True
    assert "ownerReferences" not in render(make_obj())[0]["metadata"]


@pytest.mark.parametrize(
    ("metadata", "field"),
    [
        ({}, "metadata.name"),
        ({"name": "Chat.Model"}, "metadata.name"),
        ({"name": "9lives"}, "metadata.name"),
        ({"name": "a" * 64}, "metadata.name"),
        ({"name": "llama-lws"}, "metadata.name"),  # could take model llama's LWS Service name
        ({"name": "ok", "namespace": "Bad_NS"}, "metadata.namespace"),
    ],
)
def test_bad_names_are_render_errors(metadata: dict[str, Any], field: str) -> None:
    with pytest.raises(RenderError) as err:
        render(make_obj(metadata=metadata))
    assert err.value.field == field
    assert err.value.fix


# ---- environment ----


def test_hf_token_only_from_secret_ref() -> None:
    obj = make_obj({"model": {"tokenSecretRef": {"name": "hf", "key": "token"}}})
    env = {e["name"]: e for e in container(render(obj))["env"]}
    assert env["HF_TOKEN"] == {
        "name": "HF_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}},
    }
    literal = make_obj({"engine": {"env": [{"name": "HF_TOKEN", "value": "hf_secret"}]}})
    with pytest.raises(RenderError) as err:
        render(literal)
    assert err.value.field == "spec.engine.env[0]"
    assert "tokenSecretRef" in err.value.fix


def test_user_env_overrides_defaults_without_duplicates() -> None:
    obj = make_obj(
        {"engine": {"env": [{"name": "HF_HOME", "value": "/data/models"}, {"name": "FOO", "value": "1"}]}}
    )
    objects = render(obj)
    env = container(objects)["env"]
    names = [e["name"] for e in env]
    assert len(names) == len(set(names))
    assert {"name": "HF_HOME", "value": "/data/models"} in env
    assert names[-2:] == ["HF_HOME", "FOO"]  # user variables come last, in their order
    assert "HF_HOME" in objects[0]["metadata"]["annotations"][ANNOTATION_NOTES]


def alloc_env(env: list[dict[str, Any]] | None = None, extra_args: list[str] | None = None) -> list[Any]:
    obj = make_obj({"engine": {"env": env or [], "extraArgs": extra_args or []}})
    rendered = container(render(obj))["env"]
    return [e for e in rendered if e["name"] in {"PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"}]


def test_allocator_options_are_merged_over_expandable_segments_never_dropped() -> None:
    """Setting max_split_size_mb must not silently lose expandable segments (the fragmentation fix),
    and torch must see the same options under whichever name it reads."""
    merged = alloc_env([{"name": "PYTORCH_CUDA_ALLOC_CONF", "value": "max_split_size_mb:512"}])
    assert {e["value"] for e in merged} == {"expandable_segments:True,max_split_size_mb:512"}
    assert {e["name"] for e in merged} == {"PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"}
    off = alloc_env([{"name": "PYTORCH_ALLOC_CONF", "value": "expandable_segments:False"}])
    assert {e["value"] for e in off} == {"expandable_segments:False"}  # said explicitly: the user's
    assert {e["value"] for e in alloc_env()} == {"expandable_segments:True"}


def test_sleep_mode_and_expandable_segments_exclude_each_other() -> None:
    assert alloc_env(extra_args=["--enable-sleep-mode"]) == []  # the default is left off
    with pytest.raises(RenderError, match=r"spec\.engine\.extraArgs.*sleep-mode"):
        alloc_env(
            [{"name": "PYTORCH_CUDA_ALLOC_CONF", "value": "expandable_segments:True"}],
            ["--enable-sleep-mode"],
        )


def test_a_malformed_or_contradicting_allocator_option_names_the_variable() -> None:
    with pytest.raises(RenderError, match=r"spec\.engine\.env\[0\].*key:value"):
        alloc_env([{"name": "PYTORCH_CUDA_ALLOC_CONF", "value": "expandable_segments"}])
    with pytest.raises(RenderError, match=r"spec\.engine\.env\[1\]"):
        alloc_env(
            [
                {"name": "PYTORCH_CUDA_ALLOC_CONF", "value": "max_split_size_mb:512"},
                {"name": "PYTORCH_ALLOC_CONF", "value": "max_split_size_mb:128"},
            ]
        )


def test_duplicate_user_env_is_an_error() -> None:
    obj = make_obj({"engine": {"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}})
    with pytest.raises(RenderError) as err:
        render(obj)
    assert err.value.field == "spec.engine.env[1]"


# ---- version gating ----


@pytest.mark.parametrize("version", ALL_RELEASES)
def test_cpu_kv_offload_flags_follow_the_version(version: str) -> None:
    obj = make_obj({"kvOffload": {"cpuGiB": 16}})
    objects = render(obj, version)
    args = argv(objects)
    v = tuple(int(p) for p in version.split("."))
    notes = objects[0]["metadata"]["annotations"].get(ANNOTATION_NOTES, "")
    if v >= (0, 11, 1):  # first in the 0.11.1 source distribution
        assert flag_value(args, "--kv-offloading-size") == "16"
        assert flag_value(args, "--kv-offloading-backend") == "native"
        assert "--swap-space" not in args
    else:
        assert "--kv-offloading-size" not in args
        assert flag_value(args, "--swap-space") == "16"  # GiB per GPU: one GPU here
        assert "V1 engine offloads no KV cache" in notes
    if v >= (0, 18, 0):
        assert "--swap-space" not in args


def test_swap_space_is_per_gpu() -> None:
    obj = make_obj(
        {"model": {"config": LLAMA_405B}, "gpu": {"types": ["H100-80GB"]}, "kvOffload": {"cpuGiB": 64}}
    )
    plan = plan_inference_model(obj.spec)
    args = argv(render_manifests(obj, plan, vllm_version="0.11.0"))
    assert float(flag_value(args, "--swap-space") or 0) == pytest.approx(64 / plan.chosen.gpus)


@pytest.mark.parametrize("version", ALL_RELEASES)
def test_no_rendered_flag_is_missing_from_its_version(version: str) -> None:
    obj = make_obj(
        {
            "kvOffload": {"cpuGiB": 8},
            "kvCacheDtype": "fp8",
            "model": {"servedName": "chat", "revision": "main"},
            "engine": {"enforceEager": True},
        }
    )
    table = flag_table()
    v = tuple(int(p) for p in version.split("."))
    args = argv(render(obj, version))
    for token in args:
        if token.startswith("--"):
            assert table.has(token, v), f"{token} rendered for {version}"
    for name, entry in table.flags.items():
        if not entry.present_in(v):
            assert name not in args


def test_removed_flags_are_never_rendered_by_loadline() -> None:
    for version in ALL_RELEASES:
        args = argv(render(make_obj(), version))
        for flag in ("--disable-log-requests", "--preemption-mode", "--num-scheduler-steps"):
            assert flag not in args


def test_versions_before_v1_are_refused() -> None:
    with pytest.raises(RenderError) as err:
        render(make_obj(), "0.7.3")
    assert err.value.field == "--vllm-version"
    assert "0.8.0" in err.value.fix


def test_version_newer_than_table_renders_with_a_note() -> None:
    objects = render(make_obj(), "0.99.0")
    assert "newer than loadline's flag table" in objects[0]["metadata"]["annotations"][ANNOTATION_NOTES]
    assert container(objects)["image"] == "vllm/vllm-openai:v0.99.0"


# ---- extraArgs ----


@pytest.mark.parametrize(
    ("extra", "version", "index", "words"),
    [
        (["--enable-prefix-caching", "--disable-log-requests"], "0.17.0", 1, "removed in vLLM 0.17.0"),
        (["--preemption-mode", "recompute"], "0.11.0", 0, "removed in vLLM 0.11.0"),
        (["--preemption-mode=swap"], "0.19.0", 0, "removed in vLLM 0.11.0"),
        (["--num-scheduler-steps", "8"], "0.12.0", 0, "removed"),
        (["--enable-reasoning"], "0.10.0", 0, "removed in vLLM 0.10.0"),
        (["--no-enable-log-requests"], "0.9.0", 0, "added in vLLM 0.10.1"),
        (["--structured-outputs-config.backend", "xgrammar"], "0.10.0", 0, "added in vLLM 0.11.0"),
        (["--guided-decoding-backend", "xgrammar"], "0.12.0", 0, "removed in vLLM 0.11.0"),
    ],
)
def test_extra_args_the_version_lacks_are_errors(
    extra: list[str], version: str, index: int, words: str
) -> None:
    obj = make_obj({"engine": {"extraArgs": extra}})
    with pytest.raises(RenderError) as err:
        render(obj, version)
    assert err.value.field == f"spec.engine.extraArgs[{index}]"
    assert words in err.value.problem
    assert err.value.fix.startswith("remove")


@pytest.mark.parametrize(
    ("extra", "version"),
    [
        (["--disable-log-requests"], "0.16.0"),
        (["--preemption-mode", "recompute"], "0.10.2"),
        (["--enable-log-requests"], "0.19.0"),
        (["--no-enable-log-requests"], "0.19.0"),
        (["--structured-outputs-config.backend", "xgrammar"], "0.19.0"),
        (["--enable-sleep-mode"], "0.99.0"),  # newer than the table: checked as its newest release
        (["--seed", "-1", "--enable-prefix-caching"], "0.19.0"),  # a negative number is a value
        (["--compilation-config", '{"level": 3}', "-O3"], "0.19.0"),
    ],
)
def test_extra_args_the_version_has_are_appended(extra: list[str], version: str) -> None:
    args = argv(render(make_obj({"engine": {"extraArgs": extra}}), version))
    assert args[-len(extra) :] == extra


@pytest.mark.parametrize(
    "extra",
    [
        ["--max-model-len", "4096"],
        ["--max_model_len=4096"],
        ["-tp", "2"],
        ["--tensor-parallel-size=2"],
        ["--swap-space", "4"],
        ["--kv-offloading-size", "4"],
        ["--port", "9000"],
        ["--hf-token", "hf_x"],
        ["--no-enforce-eager"],
    ],
)
def test_extra_args_may_not_override_what_loadline_renders(extra: list[str]) -> None:
    with pytest.raises(RenderError) as err:
        render(make_obj({"engine": {"extraArgs": extra}}))
    assert err.value.field == "spec.engine.extraArgs[0]"
    assert "set by loadline" in err.value.problem
    assert "instead" in err.value.fix


def test_canonical_flag_names() -> None:
    aliases = flag_table().aliases
    assert canonical_flag("--max_model_len", aliases) == "--max-model-len"
    assert canonical_flag("--compilation-config.level", aliases) == "--compilation-config"
    assert canonical_flag("-tp", aliases) == "--tensor-parallel-size"


def test_flag_table_is_well_formed() -> None:
    table = flag_table()
    assert table.oldest == (0, 8, 0)
    assert table.newest == max(table.releases)
    for required in ("0.8.0", "0.10.0", "0.11.0", "0.12.0", "0.17.0", "0.19.0"):
        assert tuple(int(p) for p in required.split(".")) in table.releases
    for entry in table.flags.values():
        assert entry.source
        if entry.since and entry.until:
            assert entry.since < entry.until
    assert table.flags["--swap-space"].until == (0, 18, 0)
    assert table.flags["--kv-offloading-size"].since == (0, 11, 1)
    assert table.flags["--disable-log-requests"].until == (0, 17, 0)
    assert table.flags["--preemption-mode"].until == (0, 11, 0)


# ---- multi-node ----


def multi_node_obj(**extra: Any) -> InferenceModel:
    return make_obj(
        {
            "model": {"name": "meta-llama/Llama-3.1-405B", "config": LLAMA_405B},
            "gpu": {"types": ["H100-80GB"], "allowMultiNode": True},
            "concurrency": 1,
            **extra,
        },
        metadata={"name": "llama-405b", "namespace": "research"},
    )


def test_multi_node_renders_a_leaderworkerset_with_ray() -> None:
    obj = multi_node_obj(replicas=2)
    plan = plan_inference_model(obj.spec)
    assert plan.chosen.nodes == 2
    objects = render_manifests(obj, plan)
    assert [o["kind"] for o in objects] == ["LeaderWorkerSet", "Service", "PodDisruptionBudget"]
    lws = objects[0]
    assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    assert lws["spec"]["replicas"] == 2
    template = lws["spec"]["leaderWorkerTemplate"]
    assert template["size"] == 2
    assert template["restartPolicy"] == "RecreateGroupOnPodRestart"

    leader = container(objects, "leader")
    assert leader["command"][:2] == ["/bin/sh", "-c"]
    script = leader["command"][2]
    assert "ray start --head --port=6379" in script
    assert script.rstrip().endswith('exec "$@"')
    args = leader["args"]
    assert args[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-405B"]
    assert flag_value(args, "--tensor-parallel-size") == str(plan.chosen.tensor_parallel_size)
    assert flag_value(args, "--pipeline-parallel-size") == str(plan.chosen.pipeline_parallel_size)
    assert flag_value(args, "--distributed-executor-backend") == "ray"
    assert "startupProbe" in leader

    worker = container(objects, "worker")
    assert worker["command"] == ["ray", "start"]
    assert "--address=$(LWS_LEADER_ADDRESS):6379" in worker["args"]
    assert "--block" in worker["args"]
    assert "startupProbe" not in worker and "ports" not in worker
    per_pod = str(plan.chosen.gpus // plan.chosen.nodes)
    for c in (leader, worker):
        assert c["resources"]["requests"]["nvidia.com/gpu"] == per_pod
        assert c["resources"]["limits"]["nvidia.com/gpu"] == per_pod
        assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert worker["env"] == leader["env"]

    service = by_kind(objects)["Service"]
    assert service["spec"]["selector"]["loadline.dev/role"] == "leader"
    assert template["leaderTemplate"]["metadata"]["labels"]["loadline.dev/role"] == "leader"
    # Names: the client Service and the PDB keep the model's name; the LWS (whose controller creates a
    # headless Service of the LWS's own name) takes another.
    assert [o["metadata"]["name"] for o in objects] == ["llama-405b-lws", "llama-405b", "llama-405b"]
    for role in ("leader", "worker"):
        assert (
            template[f"{role}Template"]["metadata"]["labels"]["loadline.dev/inferencemodel"] == "llama-405b"
        )
    assert lws["metadata"]["labels"]["loadline.dev/inferencemodel"] == "llama-405b"


def test_single_node_never_uses_ray() -> None:
    assert "--distributed-executor-backend" not in argv(render(make_obj()))


# ---- no CR string changes the structure ----

HOSTILE = [
    "line1\nline2",
    "key: value",
    "{a: b}",
    "- item",
    "---",
    "...",
    "'single' \"double\"",
    "# not a comment",
    "&anchor *alias !!python/object:os.system",
    "  leading and trailing  ",
    "tab\there",
    "| block",
    "> folded",
    "% directive",
    "@at `back`",
    "null",
    "true",
    "0x1F",
    "1e3",
    "~",
    "emoji 🦙 and nel \x85 and ls \u2028 and bom \ufeff",
    "{{ jinja }} {% raw %}",
    "$(HF_TOKEN) ${HOME}",
    "\\ backslash \\n",
    "",
]


def _shape(node: Any) -> Any:
    """The structure of a parsed object with every string replaced: what hostile input must not alter."""
    if isinstance(node, dict):
        return {k if not isinstance(k, str) else "k": _shape(v) for k, v in sorted(node.items())}
    if isinstance(node, list):
        return [_shape(v) for v in node]
    if isinstance(node, str):
        return "s"
    return node


def _hostile_obj(value: str, index: int) -> InferenceModel:
    return make_obj(
        {
            "engine": {
                "image": f"registry.example/vllm:{index}{value}",
                "extraArgs": ["--chat-template", value, f"--override-generation-config={value}"],
                "env": [{"name": "USER_TEXT", "value": value}],
            }
        },
        metadata={
            "name": "chat",
            "namespace": "team-a",
            "labels": {"team": value, f"x{index}/{value}": "v"},
            "annotations": {"note": value},
        },
    )


def _hostile_shape(objects: list[dict[str, Any]]) -> Any:
    # Label keys come from the CR; compare the label map by size only.
    shaped = copy.deepcopy(objects)
    for obj in shaped:
        obj["metadata"]["labels"] = len(obj["metadata"]["labels"])
    return _shape(shaped)


@pytest.mark.parametrize("index", range(len(HOSTILE)))
def test_hostile_strings_cannot_change_the_manifest_structure(index: int) -> None:
    value = HOSTILE[index]
    benign = render(_hostile_obj("plain", index))
    hostile_obj = _hostile_obj(value, index)
    objects = render(hostile_obj)
    assert _hostile_shape(objects) == _hostile_shape(benign)

    c = container(objects)
    assert c["image"] == f"registry.example/vllm:{index}{value}"
    assert c["args"][-3:] == ["--chat-template", value, f"--override-generation-config={value}"]
    assert {"name": "USER_TEXT", "value": value} in c["env"]
    for obj in objects:
        assert obj["metadata"]["labels"]["team"] == value
        assert obj["metadata"]["labels"][f"x{index}/{value}"] == "v"
        assert "note" not in obj["metadata"].get("annotations", {})

    # The printed stream parses back to exactly the same objects.
    stream = manifests_yaml(objects, source=value)
    assert list(yaml.safe_load_all(stream)) == objects


def test_every_template_value_must_be_quoted() -> None:
    env = environment()
    with pytest.raises(TypeError, match="without the q filter"):
        env.from_string("a: {{ x }}").render(x="b: c")
    assert env.from_string("a: {{ x | q }}").render(x="b: c") == 'a: "b: c"'
    assert quote("\u2028") == '"\\u2028"'


# ---- names: stable across layouts, valid for every derived object ----

DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
# Names at and around the limits: the longest kept as <name>-lws (41 + 4 = 45), the first one cut, one
# cut right after a '-', and the longest a model may have.
LONG_NAMES = ["a" * 41, "b" * 42, "c" * 31 + "-" + "d" * 20, "m" + "0123456789" * 6 + "yz"]


def layouts_obj(name: str, gpu: str) -> InferenceModel:
    """Llama 3.1 405B in bf16: two H100-80GB nodes (LeaderWorkerSet), or one H200 node (Deployment)."""
    return make_obj(
        {
            "model": {"name": "meta-llama/Llama-3.1-405B", "config": LLAMA_405B},
            "gpu": {"types": [gpu], "allowMultiNode": True},
            "concurrency": 1,
        },
        metadata={"name": name, "namespace": "research"},
    )


def both_layouts(name: str) -> dict[str, list[dict[str, Any]]]:
    """The same InferenceModel rendered after a re-plan to another GPU type changed its layout."""
    out = {}
    for layout, gpu in (("single", "H200"), ("multi", "H100-80GB")):
        obj = layouts_obj(name, gpu)
        plan = plan_inference_model(obj.spec)
        assert (plan.chosen.nodes > 1) == (layout == "multi")
        out[layout] = render_manifests(obj, plan)
    return out


def test_client_service_keeps_its_name_when_the_layout_changes() -> None:
    rendered = both_layouts("llama-405b")
    single, multi = (by_kind(rendered[k])["Service"] for k in ("single", "multi"))
    assert single["metadata"]["name"] == multi["metadata"]["name"] == "llama-405b"
    assert service_name("llama-405b") == "llama-405b"
    assert single["spec"]["ports"] == multi["spec"]["ports"]
    # Only the role changes: the server pods of a Deployment, the leader pods of a LeaderWorkerSet.
    assert single["spec"]["selector"] == {**multi["spec"]["selector"], "loadline.dev/role": "server"}
    assert multi["spec"]["selector"]["loadline.dev/role"] == "leader"
    assert multi["spec"]["selector"]["app.kubernetes.io/instance"] == "llama-405b"
    pdbs = [by_kind(rendered[k])["PodDisruptionBudget"]["metadata"]["name"] for k in ("single", "multi")]
    assert pdbs == ["llama-405b", "llama-405b"]
    # The LWS controller's headless Service is named after the LWS: not the client Service's name.
    lws = by_kind(rendered["multi"])["LeaderWorkerSet"]
    assert lws["metadata"]["name"] != multi["metadata"]["name"]


@pytest.mark.parametrize("name", ["llama-405b", *LONG_NAMES], ids=lambda n: f"len{len(n)}")
def test_every_rendered_name_is_a_dns_1035_label(name: str) -> None:
    assert len(LONG_NAMES[-1]) == 63
    for layout, objects in both_layouts(name).items():
        for obj in objects:
            child = obj["metadata"]["name"]
            assert len(child) <= 63 and DNS_1035.match(child), (layout, obj["kind"], child)
            if obj["kind"] != "LeaderWorkerSet":
                assert child == name
            assert obj["metadata"]["labels"]["loadline.dev/inferencemodel"] == name


@pytest.mark.parametrize("name", ["llama-405b", *LONG_NAMES], ids=lambda n: f"len{len(n)}")
def test_names_the_leaderworkerset_controller_derives_stay_valid(name: str) -> None:
    """What sigs.k8s.io/lws makes from the LWS name L, at the largest indices its webhook admits
    (replicas <= 1,000,000; replicas x size <= 2^31-1): headless Service L; StatefulSets L and
    L-<group>, whose pods carry controller-revision-hash=<StatefulSet>-<10-char hash>; pods L-<group>
    and L-<group>-<worker>. Each must be a DNS-1035/1123 label of at most 63 characters."""
    lws = by_kind(both_layouts(name)["multi"])["LeaderWorkerSet"]["metadata"]["name"]
    group, worker, revision_hash = "999999", str(2**31 - 2), "x" * 10
    headless_service = lws
    statefulsets = [lws, f"{lws}-{group}"]
    pods = [f"{lws}-{group}", f"{lws}-{group}-{worker}"]
    revision_labels = [f"{sts}-{revision_hash}" for sts in statefulsets]
    for derived in [headless_service, *statefulsets, *pods, *revision_labels]:
        assert len(derived) <= 63 and DNS_1035.match(derived), derived
    assert lws.endswith("-lws")
    if len(name) + len("-lws") <= 45:
        assert lws == f"{name}-lws"


def test_long_names_that_share_a_prefix_get_distinct_leaderworkersets() -> None:
    a, b = "x" * 62 + "a", "x" * 62 + "b"
    lws = {workload_ref(n, multi_node=True)[2] for n in (a, b)}
    assert len(lws) == 2
    assert workload_ref(a, multi_node=True) == workload_ref(a, multi_node=True)  # deterministic


@pytest.mark.parametrize("name", ["llama-405b", LONG_NAMES[-1]], ids=lambda n: f"len{len(n)}")
def test_workload_ref_names_the_rendered_workload(name: str) -> None:
    for layout, objects in both_layouts(name).items():
        workload = objects[0]
        assert workload["kind"] in {"Deployment", "LeaderWorkerSet"}
        ref = (workload["apiVersion"], workload["kind"], workload["metadata"]["name"])
        assert workload_ref(name, multi_node=layout == "multi") == ref
    assert workload_ref(name, multi_node=False) == ("apps/v1", "Deployment", name)


def test_child_kinds_are_exactly_what_either_layout_renders() -> None:
    rendered = both_layouts("llama-405b")
    produced = {(o["apiVersion"], o["kind"]) for objects in rendered.values() for o in objects}
    kinds = child_kinds()
    assert len(set(kinds)) == len(kinds)
    assert set(kinds) == produced
    assert kinds[:2] == (("apps/v1", "Deployment"), ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"))
    # The workload of each layout is one of them, so the operator can always find the one left behind.
    for multi_node in (False, True):
        assert workload_ref("llama-405b", multi_node)[:2] in kinds


def test_each_character_yaml_cannot_carry_raw_is_escaped_and_reads_back_the_same() -> None:
    """Every code point, once: those YAML forbids in a stream or folds as a line break come out as
    \\uXXXX, every other one as JSON writes it, and YAML reads such values back as they were."""
    from loadline.render._template import _YAML_UNSAFE

    for code in range(0x110000):
        char = chr(code)
        placed = quote(f"a{char}b")
        if code in _YAML_UNSAFE:
            assert placed == f'"a\\u{code:04x}b"', hex(code)
        else:
            assert char in placed or code < 0x20 or char in '"\\', hex(code)
    for char in ("\x85", "\u2028", "\u2029", "\ufeff", "\x7f", "é", "🦙"):
        assert yaml.safe_load(f"v: {quote(char)}") == {"v": char}
