"""Learned corrections: observations kept per family × GPU × vLLM minor × quantization, bounded, and
applied to the planner's KV budget within the stated bound (loadline.observe._learn)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadline.api import parse_inference_model
from loadline.api._observed import MAX_RECORDS, ObservationRecord
from loadline.cli import main
from loadline.errors import SpecError
from loadline.observe import MAX_CREDIT, MAX_PER_KEY, CorrectionStore, load_store, parse_startup_log
from loadline.sizing import plan_inference_model

LOG = Path(__file__).parent / "corpus" / "startup" / "vllm_0.19.0_llama70b_fp8_tp2_h100.log"

# The InferenceModel the server of LOG ran (its settings as the log states them).
MODEL = {
    "apiVersion": "loadline.dev/v1alpha1",
    "kind": "InferenceModel",
    "metadata": {"name": "llama-70b", "namespace": "team-b"},
    "spec": {
        "model": {"name": "RedHatAI/Llama-3.3-70B-Instruct-fp8-dynamic"},
        "maxModelLen": 8192,
        "concurrency": 8,
        "engine": {"version": "0.19.0", "gpuMemoryUtilization": 0.95},
        "gpu": {"types": ["H100-80GB"]},
    },
}


def _record(planned: float, observed: float, **over: object) -> ObservationRecord:
    fields: dict[str, object] = {
        "family": "llama",
        "gpuType": "H100-80GB",
        "vllmMinor": "0.19",
        "quantization": "compressed-tensors",
        "plannedKvCacheGiB": planned,
        "observedKvCacheGiB": observed,
        "source": "test",
    }
    fields.update(over)
    return ObservationRecord.model_validate(fields)


def _plan(store: CorrectionStore | None = None, **spec: object):  # type: ignore[no-untyped-def]
    obj = parse_inference_model({**MODEL, "spec": {**MODEL["spec"], **spec}})  # type: ignore[dict-item]
    return plan_inference_model(obj.spec, corrections=store)


def test_store_keeps_the_newest_per_key_and_in_all() -> None:
    store = CorrectionStore.of(_record(30.0, 29.0 - i * 0.01, source=f"n{i}") for i in range(MAX_PER_KEY + 5))
    assert len(store.records) == MAX_PER_KEY
    assert store.records[-1].source == f"n{MAX_PER_KEY + 4}"  # newest kept, oldest first
    many = CorrectionStore.of(_record(30.0, 29.0, gpuType=f"G{i}") for i in range(MAX_RECORDS + 10))
    assert len(many.records) == MAX_RECORDS


def test_a_shortfall_is_held_back_on_that_gpu_only() -> None:
    base = _plan()
    planned = base.budget.kv_cache_gib
    store = CorrectionStore.of([_record(planned, planned * 0.8, model="m1")])
    corrected = _plan(store)
    assert corrected.budget.kv_cache_gib == pytest.approx(planned * 0.8, abs=0.02)
    assert corrected.budget.kv_cache_tokens < base.budget.kv_cache_tokens
    note = corrected.summary().model_dump(by_alias=True, mode="json")["tuning"][-1]
    assert note.startswith("KV budget corrected by 1 observation of llama on H100-80GB, vLLM 0.19")
    # Another GPU type, family, quantization or release is untouched.
    for other in (
        {"gpuType": "A100-80GB"},
        {"family": "qwen2"},
        {"quantization": "none"},
        {"vllmMinor": "0.18"},
    ):
        plan = _plan(CorrectionStore.of([_record(planned, planned * 0.5, **other)]))
        assert plan.budget.kv_cache_gib == pytest.approx(planned)
        assert not plan.correction_notes


def test_a_correction_can_move_the_plan_to_more_gpus() -> None:
    base = _plan(concurrency=28)
    assert base.chosen.gpus == 2
    planned = base.budget.kv_cache_gib
    corrected = _plan(CorrectionStore.of([_record(planned, planned * 0.8)]), concurrency=28)
    assert corrected.chosen.gpus > 2


def test_credit_is_bounded() -> None:
    planned = _plan().budget.kv_cache_gib
    store = CorrectionStore.of([_record(planned, planned * 1.2)])
    corrected = _plan(store)
    bound = planned + MAX_CREDIT * planned * 1.2
    assert corrected.budget.kv_cache_gib == pytest.approx(bound, abs=0.02)
    assert corrected.budget.kv_cache_gib < planned * 1.2 - 1.0


def test_median_resists_one_odd_record() -> None:
    records = [_record(30.0, 28.0), _record(30.0, 28.2), _record(30.0, 5.0)]
    assert CorrectionStore.of(records).reserves("llama", "compressed-tensors", "0.19.0")[0][
        1
    ] == pytest.approx(2.0)


def test_real_log_against_its_plan_gives_a_small_correction(tmp_path: Path) -> None:
    model = tmp_path / "model.yaml"
    model.write_text(json.dumps(MODEL))
    store = tmp_path / "store.json"
    args = ["observe", str(LOG), "--gpu", "H100-80GB", "--plan", str(model), "--add-to", str(store)]
    assert main(args) == 0
    assert main(args) == 0  # a second observation of the same kind
    loaded = load_store(store.read_text(), "store")
    assert len(loaded.records) == 2
    record = loaded.records[0]
    assert record.observed_kv_cache_gi_b == parse_startup_log(LOG.read_text()).kv_cache_gib == 37.28
    assert abs(record.shortfall_gi_b) < 0.02 * record.observed_kv_cache_gi_b


def test_plan_observations_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    planned = _plan().budget.kv_cache_gib
    store = tmp_path / "store.json"
    store.write_text(CorrectionStore.of([_record(planned, planned * 0.8)]).to_json())
    model = tmp_path / "model.yaml"
    model.write_text(json.dumps(MODEL))
    assert main(["plan", str(model), "--observations", str(store), "--output", "json"]) == 0
    out = json.loads(capsys.readouterr().out)[0]
    assert out["plan"]["memory"]["kvCacheGiB"] == pytest.approx(planned * 0.8, abs=0.02)
    assert any(t.startswith("KV budget corrected by 1 observation") for t in out["plan"]["tuning"])


def test_observation_of_other_settings_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "model.yaml"
    model.write_text(json.dumps({**MODEL, "spec": {**MODEL["spec"], "maxModelLen": 16384}}))
    args = ["observe", str(LOG), "--gpu", "H100-80GB", "--plan", str(model), "--add-to", str(tmp_path / "s")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "max_model_len 8192 (the plan: 16384)" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "s").exists()


def test_store_from_configmap_yaml() -> None:
    inner = CorrectionStore.of([_record(30.0, 28.0)]).to_json()
    text = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: loadline-observations}\ndata:\n  observations.json: |\n"
    text += "".join(f"    {line}\n" for line in inner.splitlines())
    assert load_store(text, "f").records[0].observed_kv_cache_gi_b == 28.0


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[1, 2", "is not JSON or YAML"),
        ('{"kind": "ObservationStore", "observations": [{"family": "llama"}]}', "observations.0.gpuType"),
        ("kind: ConfigMap\ndata: {}\n", "without the key observations.json"),
    ],
)
def test_bad_store_is_one_named_error(text: str, says: str) -> None:
    with pytest.raises(SpecError, match=says):
        load_store(text, "--observations f")
