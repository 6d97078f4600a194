"""Compatibility by vLLM version (issue 12, item 4): what vLLM would refuse to load or run is refused at
plan or render time, naming the field and the fix, from data generated from vLLM's own source."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from loadline.api import InferenceModel, parse_inference_model, parse_spec
from loadline.cli import main
from loadline.errors import RenderError, SpecError
from loadline.render import render_manifests
from loadline.sizing import compat_table, model_catalog, plan_inference_model
from loadline.sizing._data import parse_version
from tests.conftest import LLAMA_8B, REPO, inference_model

AWQ_8B = {**LLAMA_8B, "torch_dtype": "float16",
          "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}}  # fmt: skip


def spec(**fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "config": copy.deepcopy(LLAMA_8B)}
    }
    body.update({"maxModelLen": 4096, "gpu": {"types": ["H100-80GB"]}})
    body.update(fields)
    return body


def plan(**fields: Any) -> Any:
    return plan_inference_model(parse_spec(spec(**fields)))


def refusal(**fields: Any) -> SpecError:
    with pytest.raises(SpecError) as err:
        plan(**fields)
    return err.value


# ---- the data ----


def test_every_catalog_architecture_is_in_the_table() -> None:
    table = compat_table()
    for entry in model_catalog().values():
        for name in entry.config.get("architectures", []):
            assert name in table.architectures, f"{entry.id}: {name}"


def test_the_table_spans_0_8_to_the_newest_release() -> None:
    table = compat_table()
    assert table.oldest == (0, 8, 0) and table.newest >= (0, 33, 0)
    raw = json.loads((REPO / "operator/loadline/sizing/data/vllm_compat.json").read_text())
    assert raw["checkpoints"]["_source"] and raw["_about"]
    conflicts = json.loads((REPO / "operator/loadline/render/data/vllm_conflicts.json").read_text())
    assert all(rule["source"] for rule in conflicts["rules"])


# ---- architectures ----


def test_an_architecture_newer_than_the_version_is_refused() -> None:
    qwen3 = {"model": {"name": "Qwen/Qwen3-8B"}, "engine": {"version": "0.8.0"}}
    err = refusal(**qwen3)
    assert err.field == "spec.engine.version"
    assert "Qwen3ForCausalLM" in err.problem and "added in 0.8.4" in err.problem
    assert "0.8.4 or newer" in err.fix
    assert (
        plan(model={"name": "Qwen/Qwen3-8B"}, engine={"version": "0.8.4"}).chosen.gpus >= 1
    )  # planned, not refused


def test_the_transformers_backend_is_an_explicit_way_out() -> None:
    engine = {"version": "0.8.0", "extraArgs": ["--model-impl", "transformers"]}
    assert plan(model={"name": "Qwen/Qwen3-8B"}, engine=engine).chosen.gpus >= 1  # planned, not refused


def test_an_architecture_no_release_lists_is_refused_by_name() -> None:
    # Not in any release's registry: vLLM refuses it, and its shape would only be guessed.
    config = {**LLAMA_8B, "architectures": ["SomeBrandNewForCausalLM"]}
    err = refusal(model={"name": "x/new", "config": config})
    assert err.field == "spec.model"
    assert "SomeBrandNewForCausalLM" in err.problem and "no vLLM release" in err.problem
    assert "--model-impl transformers" in err.fix
    # Asked explicitly through vLLM's Transformers backend, it is planned.
    engine = {"extraArgs": ["--model-impl", "transformers"]}
    assert plan(model={"name": "x/new", "config": config}, engine=engine).chosen.gpus >= 1


def test_a_pooling_class_vllm_adapts_from_a_listed_decoder_passes() -> None:
    # vLLM loads Qwen3ForSequenceClassification as Qwen3ForCausalLM through its pooling adapter (the
    # registry lists the class itself only in some releases).
    config = {**LLAMA_8B, "architectures": ["LlamaForSequenceClassification"]}
    assert plan(model={"name": "x/rerank", "config": config}).chosen.gpus >= 1


def test_gpt_oss_needs_0_10_1() -> None:
    err = refusal(model={"name": "openai/gpt-oss-20b"}, engine={"version": "0.10.0"})
    assert err.field == "spec.engine.version" and "0.10.1" in err.fix


def test_a_newer_version_is_judged_by_the_newest_release_known() -> None:
    assert (
        plan(model={"name": "Qwen/Qwen3-8B"}, engine={"version": "0.99.0"}).chosen.gpus >= 1
    )  # planned, not refused


# ---- quantization methods vs checkpoints ----


@pytest.mark.parametrize(
    "method", ["awq", "awq_marlin", "gptq", "gptq_marlin", "compressed-tensors", "mxfp4"]
)
def test_a_pre_quantized_method_on_a_bf16_checkpoint_is_refused(method: str) -> None:
    err = refusal(quantization=method)
    assert err.field == "spec.quantization"
    assert "has no quantization_config" in err.problem
    assert "fp8" in err.fix and "bitsandbytes" in err.fix  # the online methods that would work


@pytest.mark.parametrize("method", ["fp8", "bitsandbytes"])
def test_online_methods_quantize_a_bf16_checkpoint(method: str) -> None:
    assert plan(quantization=method).settings.quantization == method


def test_a_quantized_checkpoint_takes_its_own_method_or_a_kernel_for_it() -> None:
    awq = {"name": "x/llama-awq", "config": AWQ_8B}
    for method in ("none", "awq", "awq_marlin", "moe_wna16"):
        plan(model=awq, quantization=method)
    err = refusal(model=awq, quantization="gptq")
    assert err.field == "spec.quantization" and "quantized with awq" in err.problem
    assert "none" in err.fix
    err = refusal(model=awq, quantization="fp8")
    assert "already quantized with awq" in err.problem


def test_a_method_the_version_lacks_is_refused() -> None:
    err = refusal(quantization="bitsandbytes", engine={"version": "0.28.0"})
    assert err.field == "spec.quantization" and "removed in 0.28.0" in err.problem
    err = refusal(model={"name": "openai/gpt-oss-20b"}, engine={"version": "0.10.0", "extraArgs":
                  ["--model-impl", "transformers"]})  # fmt: skip
    assert "mxfp4" in err.problem and err.field == "spec.engine.version"


def test_a_deprecated_method_needs_vllms_opt_in() -> None:
    moe = {"name": "Qwen/Qwen1.5-MoE-A2.7B"}
    err = refusal(model=moe, quantization="experts_int8", engine={"version": "0.19.0"})
    assert err.field == "spec.engine.extraArgs" and "--allow-deprecated-quantization" in err.fix
    extra = {"version": "0.19.0", "extraArgs": ["--allow-deprecated-quantization"]}
    assert plan(model=moe, quantization="experts_int8", engine=extra).chosen.gpus >= 1  # planned, not refused
    assert (
        plan(model=moe, quantization="experts_int8", engine={"version": "0.13.0"}).chosen.gpus >= 1
    )  # planned, not refused


def test_the_cli_names_file_object_field_and_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(inference_model(maxModelLen=4096, quantization="awq")))
    assert main(["plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"loadline: {path}: InferenceModel team-a/chat: spec.quantization: awq loads")
    assert err.count("\n") == 1 and "(fix: " in err


# ---- flags that exclude what loadline sets ----


def obj(**fields: Any) -> InferenceModel:
    return parse_inference_model(
        {
            "apiVersion": "loadline.dev/v1alpha1",
            "kind": "InferenceModel",
            "metadata": {"name": "chat", "namespace": "ns"},
            "spec": spec(**fields),
        }
    )


def render(model: InferenceModel) -> list[dict[str, Any]]:
    return render_manifests(model, plan_inference_model(model.spec))


def render_refusal(**fields: Any) -> RenderError:
    with pytest.raises(RenderError) as err:
        render(obj(**fields))
    return err.value


def env_of(objects: list[dict[str, Any]]) -> dict[str, str]:
    env = objects[0]["spec"]["template"]["spec"]["containers"][0]["env"]
    return {e["name"]: e.get("value", "") for e in env}


@pytest.mark.parametrize(
    "extra",
    [["--kv-cache-memory-bytes", "20000000000"], ["--num-gpu-blocks-override", "100"], ["-dp", "2"],
     ["--data-parallel-size=4"]],
)  # fmt: skip
def test_flags_that_undo_the_plan_are_refused(extra: list[str]) -> None:
    err = render_refusal(engine={"extraArgs": ["--enable-prefix-caching", *extra]})
    assert err.field == "spec.engine.extraArgs[1]"
    assert err.fix.startswith("remove it")


def test_one_data_parallel_copy_is_harmless() -> None:
    render(obj(engine={"extraArgs": ["--data-parallel-size", "1"]}))


def test_kv_transfer_config_excludes_kv_offload() -> None:
    extra = ["--kv-transfer-config", '{"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}']
    err = render_refusal(engine={"extraArgs": extra}, kvOffload={"cpuGiB": 8})
    assert "spec.kvOffload" in err.problem and err.field == "spec.engine.extraArgs[0]"
    render(obj(engine={"extraArgs": extra}))


def test_no_chunked_prefill_needs_a_batch_as_long_as_a_sequence() -> None:
    err = render_refusal(engine={"extraArgs": ["--no-enable-chunked-prefill"], "maxNumBatchedTokens": 2048})
    assert "(2048 < 4096)" in err.problem and "maxNumBatchedTokens" in err.fix
    render(obj(engine={"extraArgs": ["--no-enable-chunked-prefill"], "maxNumBatchedTokens": 4096}))


@pytest.mark.parametrize("flag", ["--enable-sleep-mode", "--enable-cumem-allocator"])
def test_vllms_memory_pool_turns_expandable_segments_off(flag: str) -> None:
    env = env_of(render(obj(engine={"version": "0.22.0", "extraArgs": [flag]})))
    assert "expandable_segments" not in env.get("PYTORCH_CUDA_ALLOC_CONF", "")
    asked = [{"name": "PYTORCH_CUDA_ALLOC_CONF", "value": "expandable_segments:True"}]
    err = render_refusal(engine={"version": "0.22.0", "extraArgs": [flag], "env": asked})
    assert flag in err.problem and err.field == "spec.engine.extraArgs[0]"


def test_allocator_options_are_merged_not_dropped() -> None:
    asked = [{"name": "PYTORCH_CUDA_ALLOC_CONF", "value": "max_split_size_mb:512"}]
    env = env_of(render(obj(engine={"env": asked})))
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        assert env[name] == "expandable_segments:True,max_split_size_mb:512"


def test_compat_boundaries_come_from_the_source_tables() -> None:
    table = compat_table()
    assert table.architectures["Qwen3ForCausalLM"].since == parse_version("0.8.4")
    assert table.methods["mxfp4"].since == parse_version("0.10.1")


# ---- kernel alignment: the tensor-parallel sizes vLLM can build a model's layers for ----


def _arch(config: dict[str, Any]) -> Any:
    from loadline.sizing import parse_hf_config

    return parse_hf_config(config)


@pytest.mark.parametrize(
    ("config", "method", "tp", "needle"),
    [
        # Block fp8 (DeepSeek-V3 style [128, 128]): a dense MLP of 14336 splits into 1792 = 14 blocks at
        # TP 8, 896 = 7 at TP 16, but 448 at TP 32 (column-parallel gate/up: "not divisible by block_n").
        ({**LLAMA_8B, "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}},
         "fp8", 8, ""),
        ({**LLAMA_8B, "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}},
         "fp8", 32, "MLP intermediate size 14336 / TP 32 = 448 per rank"),
        # compressed-tensors' block strategy states its block in the weights' config group.
        ({**LLAMA_8B, "quantization_config": {"quant_method": "compressed-tensors", "config_groups": {"g": {
            "weights": {"num_bits": 8, "strategy": "block", "block_structure": [128, 128]}}}}},
         "compressed-tensors", 32, "weight_block_size [128, 128]"),
        # Group-quantized AWQ: only the row-parallel layers' input is split; 14336 / 16 = 896 = 7 × 128.
        (AWQ_8B, "awq_marlin", 16, ""),
        (AWQ_8B, "awq_marlin", 32, "MLP intermediate size 14336 / TP 32 = 448 per rank"),
        # Per-channel GPTQ (group_size -1) has no groups to cut through.
        ({**AWQ_8B, "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": -1}},
         "gptq_marlin", 32, ""),
        # bf16: only a whole number of elements per rank.
        ({**LLAMA_8B, "intermediate_size": 14000}, "none", 32, "MLP intermediate size 14000 does not split"),
        ({**LLAMA_8B, "intermediate_size": 14000}, "none", 16, ""),
    ],
)  # fmt: skip
def test_tp_alignment_follows_vllms_create_weights_checks(
    config: dict[str, Any], method: str, tp: int, needle: str
) -> None:
    from loadline.sizing._align import tp_problem

    problem = tp_problem(_arch(config), method, "0.19.0", tp)
    assert (needle in problem) if needle else problem == ""
    assert bool(problem) == bool(needle)


def test_every_alignment_rule_cites_the_vllm_source_it_was_read_from() -> None:
    from loadline.sizing._align import alignment_rules

    rules = alignment_rules()
    assert rules
    for rule in rules:
        assert "vllm/" in rule.source and ".py" in rule.source, rule


def test_kv_heads_must_split_or_replicate_evenly() -> None:
    from loadline.sizing._align import head_problem

    arch = _arch({**LLAMA_8B, "num_key_value_heads": 6, "num_attention_heads": 24})
    assert head_problem(arch, 2) == "" and head_problem(arch, 12) == ""  # 3 per rank; replicated twice
    assert head_problem(arch, 4) == "4 neither divides the model's 6 KV heads nor is a multiple of them"
    assert head_problem(arch, 16) == "16 does not divide the model's 24 attention heads"
