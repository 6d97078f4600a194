"""The InferenceModel CRD on a real API server: schema, CEL rules, explain and printer columns."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from kube import REPO, Kubectl, wait_for

CRD_DIR = REPO / "crds"
CRD_FILE = CRD_DIR / "loadline.dev_inferencemodels.yaml"
CRD_NAME = "inferencemodels.loadline.dev"


def _examples() -> list[Path]:
    return sorted(p for p in (REPO / "examples").glob("*.yaml") if _is_inference_model(p))


def _is_inference_model(path: Path) -> bool:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    return any(d.get("kind") == "InferenceModel" for d in docs)


def _crd_spec_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD_FILE.read_text())
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return schema


@pytest.fixture(scope="module")
def crd(kubectl: Kubectl) -> str:
    """The CRD applied from crds/ and Established."""
    assert CRD_FILE.exists(), f"{CRD_FILE} is missing: run `make crds`"
    kubectl("apply", "-f", str(CRD_DIR))
    kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")
    # The API server publishes a new CRD's OpenAPI schema (which explain reads) shortly after.
    wait_for(
        lambda: kubectl.run("explain", "inferencemodel", check=False).returncode == 0,
        timeout=60,
        what="the InferenceModel OpenAPI schema to be published",
    )
    return CRD_NAME


def minimal_model(name: str = "tiny", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"}, "maxModelLen": 4096}
    body.update(spec)
    return {
        "apiVersion": "loadline.dev/v1alpha1",
        "kind": "InferenceModel",
        "metadata": {"name": name},
        "spec": body,
    }


def create(kubectl: Kubectl, namespace: str, obj: dict[str, Any]) -> tuple[int, str]:
    proc = kubectl.run("create", "-n", namespace, "-f", "-", input=json.dumps(obj), check=False)
    return proc.returncode, proc.stderr


def test_crd_is_established_with_names_and_categories(kubectl: Kubectl, crd: str) -> None:
    obj = kubectl.json("get", "crd", crd)
    conditions = {c["type"]: c["status"] for c in obj["status"]["conditions"]}
    assert conditions["Established"] == "True"
    assert conditions["NamesAccepted"] == "True"
    resources = kubectl("api-resources", "--api-group=loadline.dev", "-o", "name")
    assert "inferencemodels.loadline.dev" in resources.split()


def test_explain_shows_the_field_descriptions(kubectl: Kubectl, crd: str) -> None:
    fields = list(_crd_spec_schema()["properties"])

    # The API server publishes a changed CRD's OpenAPI a moment after it is applied (an upgrade of the
    # CRD by an earlier test of the session): wait until explain lists every field, then compare.
    def explained() -> str | None:
        text = kubectl("explain", "inferencemodel.spec")
        return text if all(f in text for f in fields) else None

    out = wait_for(explained, timeout=60, what="kubectl explain to list every spec field")
    flat = " ".join(out.split())
    for field, prop in _crd_spec_schema()["properties"].items():
        assert field in out, f"kubectl explain does not list spec.{field}"
        description = " ".join(prop.get("description", "").split())
        assert description, f"spec.{field} has no description in {CRD_FILE.name}"
        # kubectl wraps long lines; compare a whitespace-normalised prefix.
        assert description[:40] in flat, f"spec.{field}: description {description[:40]!r} not shown"


@pytest.mark.parametrize("example", _examples(), ids=lambda p: p.name)
def test_example_is_accepted(kubectl: Kubectl, crd: str, namespace: str, example: Path) -> None:
    for doc in yaml.safe_load_all(example.read_text()):
        if not doc or doc.get("kind") != "InferenceModel":
            continue
        doc = copy.deepcopy(doc)
        doc["metadata"].pop("namespace", None)  # examples name their own namespace; use the test's
        code, err = create(kubectl, namespace, doc)
        assert code == 0, f"{example.name} rejected: {err}"
        stored = kubectl.json("get", "inferencemodel", doc["metadata"]["name"], "-n", namespace)
        assert stored["spec"]["model"]["name"] == doc["spec"]["model"]["name"]


def test_there_are_examples_to_check() -> None:
    assert _examples(), "examples/ holds no InferenceModel; the acceptance test would check nothing"


def test_schema_defaults_are_applied(kubectl: Kubectl, crd: str, namespace: str) -> None:
    code, err = create(kubectl, namespace, minimal_model())
    assert code == 0, err
    spec = kubectl.json("get", "inferencemodel", "tiny", "-n", namespace)["spec"]
    for field, prop in _crd_spec_schema()["properties"].items():
        if "default" in prop:
            assert spec[field] == prop["default"], field


INVALID: dict[str, tuple[dict[str, Any], list[str]]] = {
    "negative-max-model-len": (
        {"maxModelLen": -1},
        ["spec.maxModelLen", "should be greater than or equal to"],
    ),
    "unknown-quantization": (
        {"quantization": "int3"},
        ['spec.quantization: Unsupported value: "int3"', '"awq"'],
    ),
    "weight-bits-without-quantization": (
        {"quantization": "none", "weightBits": 4},
        ["weightBits applies only together with a quantization method"],
    ),
    "config-and-config-map-ref": (
        {
            "model": {
                "name": "org/custom",
                "config": {"model_type": "llama"},
                "configMapRef": {"name": "custom-config", "key": "config.json"},
            }
        },
        ["set at most one of model.config and model.configMapRef"],
    ),
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_invalid_model_is_rejected_with_a_clear_message(
    kubectl: Kubectl, crd: str, namespace: str, case: str
) -> None:
    spec, expected = INVALID[case]
    code, err = create(kubectl, namespace, minimal_model(case, **spec))
    assert code != 0, f"{case} was accepted"
    assert "is invalid" in err, err
    for text in expected:
        assert text in err, f"{text!r} not in: {err}"
    assert kubectl.json("get", "inferencemodels", "-n", namespace)["items"] == []


def test_printer_columns(kubectl: Kubectl, crd: str, namespace: str) -> None:
    code, err = create(kubectl, namespace, minimal_model("cols"))
    assert code == 0, err
    header, row = kubectl("get", "inferencemodels", "-n", namespace).splitlines()
    columns = header.split()
    assert columns[:2] == ["NAME", "MODEL"]
    for name in ("GPU", "PHASE", "AGE"):
        assert name in columns, header
    assert columns.index("GPU") < columns.index("PHASE") < columns.index("AGE")
    assert row.split()[:2] == ["cols", "Qwen/Qwen2.5-0.5B-Instruct"]
    # The short name and category work too.
    assert "cols" in kubectl("get", "lim", "-n", namespace)
    assert "cols" in kubectl("get", "loadline", "-n", namespace)


def test_a_status_write_tested_on_fields_is_refused_only_when_one_of_them_changed(
    kubectl: Kubectl, crd: str, namespace: str
) -> None:
    """The operator's status writes (a crash's decision, a child's readiness) are JSON patches that test
    the fields the decision read (``_kube.build_tested_status_patch``): the real API server must apply
    one whatever else changed meanwhile, take an absent field tested as null as still absent, and
    refuse one (HTTP 422) whose tested field another hand changed, writing nothing of it."""
    from loadline.handlers._kube import build_tested_status_patch
    from loadline.handlers._reconcile import READINESS_READS

    code, err = create(kubectl, namespace, minimal_model("tested"))
    assert code == 0, err
    ready = {"type": "Ready", "status": "False", "reason": "Progressing", "message": "rolling out",
             "lastTransitionTime": "2026-11-26T22:00:00Z"}  # fmt: skip

    def write(ops_or_merge: Any, kind: str) -> subprocess.CompletedProcess[str]:
        args = ("patch", "inferencemodel", "tested", "-n", namespace, "--subresource=status", "--type", kind)
        return kubectl.run(*args, "-p", json.dumps(ops_or_merge), check=False)

    assert write({"status": {"phase": "Deploying", "conditions": [ready]}}, "merge").returncode == 0
    read = kubectl.json("get", "inferencemodel", "tested", "-n", namespace)
    # Another hand writes a field readiness does not read: the readiness write still lands, beside it.
    assert write({"status": {"message": "another hand"}}, "merge").returncode == 0
    became_ready = build_tested_status_patch(
        read, {"phase": "Ready"}, (*READINESS_READS, "/status/remediation")
    )
    landed = write(became_ready, "json")
    assert landed.returncode == 0, landed.stderr
    status = kubectl.json("get", "inferencemodel", "tested", "-n", namespace)["status"]
    assert status["phase"] == "Ready" and status["message"] == "another hand"
    # A field it read changed since (the phase): refused with 422, nothing of it written.
    stale = build_tested_status_patch(read, {"phase": "Deploying", "message": "stale"}, READINESS_READS)
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException

    loaded = config.new_client_from_config(config_file=str(kubectl.kubeconfig))  # type: ignore[no-untyped-call]
    api = client.CustomObjectsApi(loaded)
    with pytest.raises(ApiException) as refused:
        api.patch_namespaced_custom_object_status(
            "loadline.dev", "v1alpha1", namespace, "inferencemodels", "tested", stale,
            _content_type="application/json-patch+json",
        )  # fmt: skip
    assert refused.value.status == 422  # what _kube.patch_status_tested raises Changed for
    status = kubectl.json("get", "inferencemodel", "tested", "-n", namespace)["status"]
    assert status["phase"] == "Ready" and status["message"] == "another hand"
