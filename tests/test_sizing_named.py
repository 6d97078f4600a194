"""A model known only by its name: the catalog's exact weights, else a floor the name states.

The classifier uses these figures to say "the weights do not fit this GPU" for an incident that names its
model but carries no plan; a floor that came out above the true size would make that a false verdict,
so each test here checks a figure against the true size the model's card gives.
"""

from __future__ import annotations

import pytest

from loadline.sizing import weights_from_name

GIB = 1024**3


def test_a_catalog_model_is_counted_from_its_config() -> None:
    found = weights_from_name("Qwen/Qwen3-30B-A3B")
    assert found is not None and found.exact
    # 30.5 B parameters in bfloat16 (the model card): about 56.9 GiB.
    assert found.gib == pytest.approx(30.53e9 * 2 / GIB, rel=0.01)
    assert "catalog" in found.basis


def test_a_catalog_model_is_found_by_the_last_part_of_its_id() -> None:
    by_id, by_tail = weights_from_name("google/gemma-3-12b-it"), weights_from_name("gemma-3-12b-it")
    assert by_id is not None and by_tail is not None and by_id.gib == by_tail.gib and by_tail.exact


@pytest.mark.parametrize("written", ["GPT-OSS 120B", "gpt_oss_120b", "Gpt-Oss-120B"])
def test_a_catalog_model_is_found_as_people_write_its_name(written: str) -> None:
    # gpt-oss ships in MXFP4: read as a 120B name at 16 bits it would be 3.5 times too big.
    found = weights_from_name(written)
    assert found is not None and found.exact and "mxfp4" in found.basis
    assert found.gib == pytest.approx(weights_from_name("openai/gpt-oss-120b").gib)  # type: ignore[union-attr]


def test_a_quantization_setting_shrinks_the_catalog_models_weights() -> None:
    full, awq = (
        weights_from_name("Qwen/Qwen2.5-72B-Instruct"),
        weights_from_name("Qwen/Qwen2.5-72B-Instruct", quantization="awq"),
    )
    assert full is not None and awq is not None
    assert awq.gib < 0.3 * full.gib


@pytest.mark.parametrize(
    ("name", "true_billions", "true_bits"),
    [
        # Names round their counts: Llama-2-7B has 6.74 B parameters (its card), below the 7 it says.
        ("meta-llama/Llama-2-7b-chat-hf", 6.74, 16),
        # Mixtral 8x7B has 46.7 B parameters, not 56: the experts share the attention layers.
        ("Mixtral 8x7B", 46.7, 16),
        ("Mixtral 8x22B Instruct", 141.0, 16),
        ("TheBloke/Llama-2-70B-Chat-AWQ", 68.98, 4),
        # Q4_K_M stores about 4.8 bits a weight (llama.cpp's table).
        ("Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf", 8.03, 4.8),
        # An Ollama tag without a quantization is Q4_K_M.
        ("llama3:70b", 70.6, 4.8),
        ("deepseek-r1:671b-fp16", 671.0, 16),
    ],
)
def test_a_name_gives_a_floor_below_the_true_size(name: str, true_billions: float, true_bits: float) -> None:
    found = weights_from_name(name)
    assert found is not None and not found.exact
    true_gib = true_billions * 1e9 * true_bits / 8 / GIB
    # A floor, and not a useless one: below the true size, within a factor of two of it.
    assert 0.5 * true_gib < found.gib <= true_gib, (name, found)


def test_a_specific_quantization_in_the_name_outranks_the_generic_gguf_marker() -> None:
    q8, bare = weights_from_name("Qwen1.5-14B-Chat Q8_0 GGUF"), weights_from_name("Qwen1.5-14B-Chat GGUF")
    assert q8 is not None and bare is not None
    assert q8.gib > 4 * bare.gib  # 8 bits said, against GGUF's smallest type when none is said


@pytest.mark.parametrize("name", ["Qwen3-30B-A3B-Instruct-2507", "Qwen1.5-MoE-A2.7B-Chat-GPTQ"])
def test_an_active_parameter_count_is_not_taken_for_the_models_size(name: str) -> None:
    found = weights_from_name(name)
    # Qwen's "A3B" is the active count of a mixture of experts; the model holds all of its experts.
    assert found is None or found.gib > 1.0
    if name.startswith("Qwen3-30B"):
        assert found is not None and found.gib > 25


@pytest.mark.parametrize("name", ["DeepSeek-V2-Lite", "gemma-3n-E4B-it", "phi-3-mini-4k", "", "   "])
def test_a_name_that_states_no_size_gives_none(name: str) -> None:
    assert weights_from_name(name) is None


def test_the_incidents_own_settings_outrank_the_name() -> None:
    fp8 = weights_from_name("Llama-3.3-70B-Instruct-custom", quantization="fp8")
    fp32 = weights_from_name("Llama-3.3-70B-Instruct-custom", dtype="float32")
    default = weights_from_name("Llama-3.3-70B-Instruct-custom", quantization="none")
    assert fp8 is not None and fp32 is not None and default is not None
    assert fp8.gib == pytest.approx(default.gib / 2) and fp32.gib == pytest.approx(default.gib * 2)


def test_bits_per_weight_the_name_writes_are_taken() -> None:
    # turboderp's EXL2 repositories name their bits per weight ("4.0bpw"); 70 B at 4 bits is 32.6 GiB.
    found = weights_from_name("turboderp/Llama-3-70B-Instruct-exl2 4.0bpw")
    assert found is not None and found.gib == pytest.approx(70 * 0.95 * 1e9 * 4 / 8 / GIB)
    with_setting = weights_from_name("Llama-3.1-Nemotron-70B-Instruct-HF-exl2-3.0", quantization="exl2")
    assert with_setting is not None and "3 bits per weight" in with_setting.basis


def test_a_quantization_nobody_knows_stays_a_floor() -> None:
    # An unknown format could be as small as any: counted at the fewest bits, never at 16.
    unknown = weights_from_name("Llama-3.3-70B-custom", quantization="some-new-format")
    sixteen = weights_from_name("Llama-3.3-70B-custom")
    assert unknown is not None and sixteen is not None and unknown.gib < sixteen.gib / 8
