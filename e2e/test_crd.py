"""The InferenceModel CRD on a real API server: schema, CEL rules, explain and printer columns."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
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


def status_writers(
    kubectl: Kubectl, namespace: str, name: str
) -> tuple[Callable[[Any], Any], Callable[[dict[str, Any]], None]]:
    """Two hands writing one model's status: a JSON patch as the operator sends it (``write``), and a
    merge patch of other fields, as another writer would, meanwhile (``merge``)."""
    from kubernetes import client, config

    loaded = config.new_client_from_config(config_file=str(kubectl.kubeconfig))  # type: ignore[no-untyped-call]
    api = client.CustomObjectsApi(loaded)

    def write(ops: Any) -> Any:
        return api.patch_namespaced_custom_object_status(
            "loadline.dev", "v1alpha1", namespace, "inferencemodels", name, ops,
            _content_type="application/json-patch+json",
        )  # fmt: skip

    def merge(status: dict[str, Any]) -> None:
        args = ("patch", "inferencemodel", name, "-n", namespace, "--subresource=status", "--type=merge")
        kubectl(*args, "-p", json.dumps({"status": status}))

    return write, merge


def test_a_status_write_tested_on_fields_is_refused_only_when_one_of_them_changed(
    kubectl: Kubectl, crd: str, namespace: str
) -> None:
    """A child's readiness is written as a JSON patch that tests what the decision read
    (``build_readiness_patch``, ``loadline.status.patch.build_tested_status_patch``): the real API
    server must apply it whatever else changed meanwhile, leave the other hand's write in place, and refuse it
    (HTTP 422, what ``_kube.patch_status_tested`` raises ``Changed`` for) once a tested field changed.
    And why only plain scalars are tested: the server compares a test's strings as the bytes its own
    encoder wrote, so an equal string with "<" in it does not match."""
    from kubernetes.client.exceptions import ApiException

    from loadline.status import read_status
    from loadline.status.build import build_readiness_patch, build_readiness_status
    from loadline.status.patch import build_tested_status_patch

    code, err = create(kubectl, namespace, minimal_model("tested"))
    assert code == 0, err
    stamp = "2026-11-26T22:00:00Z"
    progressing = {"type": "Ready", "status": "False", "reason": "Progressing", "message": "rolling out",
                   "lastTransitionTime": stamp, "observedGeneration": 1}  # fmt: skip
    risk = {"type": "OOMRisk", "status": "Unknown", "reason": "InsufficientData", "lastTransitionTime": stamp,
            "message": "Theil–Sen over 25 bins: 0.40 < 1.645"}  # fmt: skip
    write, merge = status_writers(kubectl, namespace, "tested")
    merge({"phase": "Deploying", "observedGeneration": 1, "conditions": [progressing, risk]})
    read = kubectl.json("get", "inferencemodel", "tested", "-n", namespace)
    previous = read_status(read)
    changes = build_readiness_status(previous, ready=True, message="1/1 replicas available", now=stamp)
    assert changes is not None
    ops = build_tested_status_patch(read, *build_readiness_patch(previous, changes))
    assert ops is not None
    # Another hand writes what readiness does not read (a message, another condition's text): it lands.
    merge(
        {
            "message": "cheaper shapes rejected: 16 GiB < 22 GiB",
            "conditions": [progressing, {**risk, "message": "x"}],
        }
    )
    write(ops)
    status = kubectl.json("get", "inferencemodel", "tested", "-n", namespace)["status"]
    assert status["phase"] == "Ready" and status["message"].startswith("cheaper shapes")
    assert [c["message"] for c in status["conditions"]] == ["1/1 replicas available", "x"]
    # The phase changed since it was read: refused, nothing of it written.
    merge({"phase": "Failed"})
    with pytest.raises(ApiException) as refused:
        write(ops)
    assert refused.value.status == 422
    assert kubectl.json("get", "inferencemodel", "tested", "-n", namespace)["status"]["phase"] == "Failed"
    # An equal string with "<": the server's bytes (Go escapes it) never match a client's.
    with pytest.raises(ApiException) as unequal:
        write([{"op": "test", "path": "/status/message", "value": status["message"]}])
    assert unequal.value.status == 422


def test_a_crash_decision_lands_over_readiness_and_is_refused_by_a_spec_change_or_another_decision(
    kubectl: Kubectl, crd: str, namespace: str
) -> None:
    """A crash's decision is written as a JSON patch testing what it read (``_build.build_decision_patch``):
    on the real API server it must land over the readiness its own crash wrote meanwhile, and be
    refused (422) once the spec's generation (tested through the status subresource) or the last crash
    handled moved."""
    from kubernetes.client.exceptions import ApiException

    from loadline.status.build import build_decision_patch
    from loadline.status.patch import build_tested_status_patch

    code, err = create(kubectl, namespace, minimal_model("decided"))
    assert code == 0, err
    write, merge = status_writers(kubectl, namespace, "decided")
    merge(
        {"phase": "Ready", "observedGeneration": 1, "remediation": {"handledCrashes": ["c0"], "revision": 1}}
    )

    def decision(crash: str) -> Any:
        read = kubectl.json("get", "inferencemodel", "decided", "-n", namespace)
        remediation = read["status"]["remediation"]
        handled = [*remediation["handledCrashes"], crash]
        changes = {"remediation": {"handledCrashes": handled, "revision": remediation["revision"] + 1}}
        built = build_decision_patch(read, changes)
        assert built is not None
        ops = build_tested_status_patch(read, *built)
        assert ops is not None and {"op": "test", "path": "/metadata/generation", "value": 1} in ops
        return ops

    ops = decision("c1")
    merge({"phase": "Deploying"})  # the crash's own readiness, meanwhile
    write(ops)
    status = kubectl.json("get", "inferencemodel", "decided", "-n", namespace)["status"]
    assert status["phase"] == "Deploying" and status["remediation"]["handledCrashes"] == ["c0", "c1"]

    ops = decision("c2")
    other = {"handledCrashes": ["c0", "c1", "other"], "revision": 3}
    merge({"remediation": other})  # another crash decided meanwhile
    with pytest.raises(ApiException) as refused:
        write(ops)
    assert refused.value.status == 422

    ops = decision("c3")
    kubectl("patch", "inferencemodel", "decided", "-n", namespace, "--type=merge", "-p",
            json.dumps({"spec": {"maxModelLen": 2048}}))  # fmt: skip
    with pytest.raises(ApiException) as respecified:
        write(ops)
    assert respecified.value.status == 422
    status = kubectl.json("get", "inferencemodel", "decided", "-n", namespace)["status"]
    assert status["remediation"]["handledCrashes"] == ["c0", "c1", "other"]
