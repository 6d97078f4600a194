"""The InferenceModel API: what `kubectl apply` and `loadline plan` accept, and the CRD we ship."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from loadline.api import (
    build_inferencemodel_crd,
    load_inference_models,
    parse_inference_model,
    render_crds_yaml,
)
from loadline.errors import SpecError
from tests.conftest import REPO, inference_model

ISSUE_EXAMPLE = """
apiVersion: loadline.dev/v1alpha1
kind: InferenceModel
metadata: {name: chat, namespace: team-a}
spec:
  model:
    name: meta-llama/Llama-3.1-8B-Instruct
    config: {}
  dtype: bfloat16
  quantization: none
  kvCacheDtype: auto
  maxModelLen: 32768
  concurrency: 8
  engine: {version: "0.19.0", image: "", extraArgs: [], env: []}
  kvOffload: {cpuGiB: 16}
  gpu: {types: [L4, L40S, A100-80GB, H100-80GB]}
"""


def test_crds_directory_is_exactly_the_generated_output() -> None:
    shipped = sorted((REPO / "crds").glob("*.yaml"))
    assert [p.name for p in shipped] == [
        "loadline.dev_fleetpolicies.yaml",
        "loadline.dev_inferencemodels.yaml",
    ]
    assert "".join(p.read_text() for p in shipped) != ""
    generated = render_crds_yaml()
    for path in shipped:
        assert path.read_text().split("---\n", 1)[1] in generated, f"{path} is stale: run `make crds`"


def test_helm_chart_ships_the_same_crds() -> None:
    for path in sorted((REPO / "crds").glob("*.yaml")):
        chart_copy = REPO / "charts" / "loadline" / "crds" / path.name
        assert chart_copy.read_text() == path.read_text(), f"{chart_copy} is stale: run `make crds`"


def test_issue_example_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "chat.yaml"
    path.write_text(ISSUE_EXAMPLE)
    [obj] = load_inference_models(path)
    assert obj.spec.max_model_len == 32768
    assert obj.spec.kv_offload is not None and obj.spec.kv_offload.cpu_gi_b == 16
    assert obj.spec.gpu.types == ["L4", "L40S", "A100-80GB", "H100-80GB"]
    assert obj.spec.engine.version == "0.19.0"


def test_every_example_parses() -> None:
    examples = sorted((REPO / "examples").glob("*.yaml"))
    assert examples
    for path in examples:
        assert load_inference_models(path)


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        ({"maxModelLen": -5}, "spec.maxModelLen", "greater than or equal to 16"),
        ({"quantization": "int3"}, "spec.quantization", "awq"),
        ({"concurrency": 0}, "spec.concurrency", "greater than or equal to 1"),
        ({"engine": {"maxNumSeqs": 0}}, "spec.engine.maxNumSeqs", "greater than or equal to 1"),
        ({"engine": {"gpuMemoryUtilization": 1.5}}, "spec.engine.gpuMemoryUtilization", "less than or equal"),
        ({"dtype": "int8"}, "spec.dtype", "bfloat16"),
        ({"maxModelLen": 4096, "tokens": 3}, "spec.tokens", "remove it"),
    ],
)
def test_bad_fields_are_named_with_a_fix(spec: dict[str, object], field: str, words: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_inference_model(inference_model(**spec))
    assert caught.value.field == field
    assert words in str(caught.value)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"weightBits": 4}, "weightBits applies only together with a quantization method"),
        (
            {"engine": {"maxNumSeqs": 512, "maxNumBatchedTokens": 256}},
            "engine.maxNumBatchedTokens must be at least engine.maxNumSeqs",
        ),
        (
            {"kvOffload": {"cpuGiB": 64}, "resources": {"memoryGiB": 32}},
            "resources.memoryGiB must be larger than kvOffload.cpuGiB",
        ),
    ],
)
def test_cross_field_rules_match_the_crd_cel_rules(spec: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_inference_model(inference_model(**spec))
    rules = yaml.safe_dump(build_inferencemodel_crd())
    assert message.split(" (")[0] in rules, "the same rule must be enforced by the API server (CEL)"


def test_wrong_kind_is_refused() -> None:
    doc = inference_model()
    doc["kind"] = "Deployment"
    with pytest.raises(SpecError, match=r"apiVersion: loadline\.dev/v1alpha1 and kind: InferenceModel"):
        parse_inference_model(doc)


def test_invalid_yaml_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("spec: [unclosed")
    with pytest.raises(SpecError, match="is not valid YAML"):
        load_inference_models(path)


def _walk(schema: dict[str, object], path: str = "spec") -> list[str]:
    """Paths of spec properties that have no description."""
    missing = []
    props = schema.get("properties")
    if isinstance(props, dict):
        for name, sub in props.items():
            if not sub.get("description"):
                missing.append(f"{path}.{name}")
            missing.extend(_walk(sub, f"{path}.{name}"))
    items = schema.get("items")
    if isinstance(items, dict):
        missing.extend(_walk(items, f"{path}[]"))
    return missing


def test_crd_is_structural_and_every_spec_field_is_described() -> None:
    crd = build_inferencemodel_crd()
    version = crd["spec"]["versions"][0]
    schema = version["schema"]["openAPIV3Schema"]
    spec = schema["properties"]["spec"]
    assert _walk(spec) == []
    text = yaml.safe_dump(crd)
    for forbidden in ("$ref", "anyOf", "$defs", "additionalProperties: false", "title:"):
        assert forbidden not in text
    # kubectl scale, an HPA and KEDA scale a model through its scale subresource.
    assert version["subresources"] == {
        "status": {},
        "scale": {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        },
    }
    status = schema["properties"]["status"]["properties"]
    assert status["replicas"]["type"] == "integer" and status["selector"]["type"] == "string"
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Model"] == ".spec.model.name"
    assert columns["GPU"] == ".status.plan.gpu"
    assert columns["Phase"] == ".status.phase"
    assert columns["Age"] == ".metadata.creationTimestamp"
    assert crd["spec"]["names"]["shortNames"] == ["lim"]
    assert spec["properties"]["model"]["properties"]["config"]["x-kubernetes-preserve-unknown-fields"] is True
    assert spec["properties"]["quantization"]["enum"][0] == "none"
    assert spec["properties"]["maxModelLen"]["minimum"] == 16
