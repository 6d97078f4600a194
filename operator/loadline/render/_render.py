"""From an InferenceModel and its plan to the Kubernetes objects that serve it.

The function is pure: no cluster, no clock, no randomness; the same inputs give the same objects, which
is what lets GitOps users commit ``loadline render`` output and the operator diff what it applies.
All values are computed here as plain data; the templates only place them (see ``_template``).

Choices a reviewer should know:

* One replica on one node → ``Deployment``. One replica over several nodes → ``LeaderWorkerSet``
  (group size = nodes): the leader runs the Ray head and ``vllm serve`` with the Ray executor, the
  workers join its Ray cluster. Plus a ``Service`` (port 8000, named ``http``; leaders only) and a
  ``PodDisruptionBudget`` (``maxUnavailable: 1``, which never blocks a drain outright, even at one
  replica, and with multi-node replicas bounds drains to one broken group at a time).
* Names (``_names``): the Deployment, the Service and the PodDisruptionBudget take the
  InferenceModel's name; the LeaderWorkerSet is ``<name>-lws`` (cut and hashed when long), because its
  controller owns a headless Service of the LWS's name. So the client Service is ``<name>`` in both
  layouts and a re-plan that changes the layout keeps the clients' address. A model name ending in
  ``-lws`` is refused: its Service could take another model's LWS Service name.
* The container runs as UID 1000 (``runAsNonRoot``; the vLLM image defaults to root), so ``HOME``,
  ``HF_HOME`` and the caches point into the writable ``/data`` emptyDir and ``USER`` is set (torch's
  compile cache asks ``getpass.getuser()``, which fails for a UID without a passwd entry).
* Environment: loadline's defaults first, then ``spec.engine.env``. A user variable with the name of
  a default replaces it in place (never a duplicate name). The allocator options
  (``PYTORCH_CUDA_ALLOC_CONF`` and its newer name ``PYTORCH_ALLOC_CONF``, which newer torch reads
  first) are merged, not replaced: the user's options over ``expandable_segments:True``, under both
  names; with ``--enable-sleep-mode`` expandable segments are left off (and refused when asked for).
  ``HF_TOKEN`` may only come from ``spec.model.tokenSecretRef`` (a ``secretKeyRef``), never as a
  literal. ``HOME``, ``HF_HOME`` and the other cache roots may be moved only within ``/data``: elsewhere
  the non-root container cannot write and the volume sized for the download is not used, so such an
  override is refused rather than rendered.
* CR labels are copied onto the rendered objects (loadline's own keys win); CR annotations are not
  (they often carry tool state such as ``kubectl.kubernetes.io/last-applied-configuration``).
* When ``metadata.uid`` is known (objects read from the cluster), the children get an owner reference
  to the InferenceModel, so deleting it garbage-collects them.
"""

from __future__ import annotations

import json
import re
from functools import cache
from typing import Any

from loadline.api import API_VERSION, KIND, InferenceModel, ModelCache
from loadline.errors import RenderError
from loadline.render._args import PORT, VllmCommand, vllm_command
from loadline.render._conflicts import allocator_pool_flags
from loadline.render._flags import Version, beyond_table, resolve_version, version_text
from loadline.render._names import LWS_SUFFIX, pod_selector, service_name, workload_ref
from loadline.render._resources import STARTUP_PERIOD_SECONDS, PodResources, pod_resources
from loadline.render._template import environment, render_object
from loadline.sizing import Plan

__all__ = ["ANNOTATION_NOTES", "ANNOTATION_PLAN", "ANNOTATION_VERSION", "render_manifests"]

ANNOTATION_PLAN = "loadline.dev/plan"
ANNOTATION_VERSION = "loadline.dev/vllm-version"
ANNOTATION_NOTES = "loadline.dev/render-notes"
LABEL_ROLE = "loadline.dev/role"
LABEL_MODEL = "loadline.dev/inferencemodel"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "loadline"

UID = 1000
DATA_DIR = "/data"
# Writable home for the engine's own caches when spec.modelCache is mounted read-only.
SCRATCH_DIR = "/scratch"
CONTAINER = "vllm"
TERMINATION_GRACE_SECONDS = 60

# A Service name is a DNS-1035 label; the children share the CR's name, so it must be one too.
_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS_1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_ALLOC_CONF = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
# Variables loadline points into the data volume; a value elsewhere cannot be merged, so it is refused.
_IN_DATA_VOLUME = ("HOME", "HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "VLLM_CACHE_ROOT")
# Of those, the ones the engine writes to: with a read-only spec.modelCache they belong in SCRATCH_DIR.
_WRITABLE = ("HOME", "VLLM_CACHE_ROOT")


def _under(path: str, root: str) -> bool:
    parts = path.rstrip("/").split("/")
    return path.startswith("/") and ".." not in parts and (path.rstrip("/") + "/").startswith(root + "/")


def _metadata_strings(obj: InferenceModel) -> tuple[str, str | None]:
    meta = obj.metadata
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise RenderError("metadata.name", "is required to name the rendered objects", "set metadata.name")
    if len(name) > 63 or not _DNS_1035.match(name):
        raise RenderError(
            "metadata.name",
            f"{name!r} cannot name a Service (a DNS-1035 label: at most 63 lower-case letters, digits "
            "and '-', starting with a letter)",
            "rename the InferenceModel, e.g. llama-70b",
        )
    if name.endswith(LWS_SUFFIX):
        raise RenderError(
            "metadata.name",
            f"{name!r} ends in {LWS_SUFFIX!r}, the suffix of loadline's LeaderWorkerSets: its Service "
            "could take the name of the headless Service another model's LeaderWorkerSet owns",
            f"rename the InferenceModel so that it does not end in {LWS_SUFFIX}",
        )
    namespace = meta.get("namespace")
    if namespace is not None and (
        not isinstance(namespace, str) or len(namespace) > 63 or not _DNS_1123_LABEL.match(namespace)
    ):
        raise RenderError(
            "metadata.namespace", f"{namespace!r} is not a namespace name", "use a DNS-1123 label"
        )
    return name, namespace


def _string_map(value: Any, field: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise RenderError(field, "must map strings to strings", f"fix {field}")
    return dict(value)


def _env(obj: InferenceModel, notes: list[str], version: Version) -> list[dict[str, Any]]:
    spec = obj.spec
    read_only = spec.model_cache is not None and spec.model_cache.persistent_volume_claim.read_only
    defaults: list[dict[str, Any]] = [
        # A read-only cache cannot take torch.compile's, Triton's or vLLM's caches: HOME moves to scratch.
        {"name": "HOME", "value": SCRATCH_DIR if read_only else DATA_DIR},
        {"name": "USER", "value": "vllm"},
        {"name": "HF_HOME", "value": f"{DATA_DIR}/huggingface"},
        {"name": "VLLM_NO_USAGE_STATS", "value": "1"},
        # Read-only: the checkpoint must be there; the hub client must not try to write refs or locks.
        *([{"name": "HF_HUB_OFFLINE", "value": "1"}] if read_only else []),
        {"name": "PYTORCH_CUDA_ALLOC_CONF", "value": "expandable_segments:True"},
        {"name": "PYTORCH_ALLOC_CONF", "value": "expandable_segments:True"},
    ]
    user: dict[str, int] = {}
    for index, var in enumerate(spec.engine.env):
        field = f"spec.engine.env[{index}]"
        if var.name in user:
            raise RenderError(
                field,
                f"{var.name} is already set by spec.engine.env[{user[var.name]}]",
                "keep one entry per variable",
            )
        if read_only and var.name in _WRITABLE and not _under(var.value, SCRATCH_DIR):
            raise RenderError(
                field,
                f"{var.name}={var.value!r} is not writable: spec.modelCache is mounted read-only at "
                f"{DATA_DIR}, so the engine's caches live in the {SCRATCH_DIR} emptyDir",
                f"use a path under {SCRATCH_DIR}, or leave {var.name} to loadline",
            )
        if (
            var.name in _IN_DATA_VOLUME
            and not (read_only and var.name in _WRITABLE)
            and not _under(var.value, DATA_DIR)
        ):
            raise RenderError(
                field,
                f"{var.name}={var.value!r} is outside the {DATA_DIR} volume, the only writable place in the "
                "pod (the container runs as a non-root user) and the one sized for the model download",
                f"use a path under {DATA_DIR}, or leave {var.name} to loadline",
            )
        if var.name in {"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"}:
            raise RenderError(
                field,
                f"{var.name} would put a secret in the manifest in clear text",
                "store it in a Secret and set spec.model.tokenSecretRef",
            )
        user[var.name] = index
    alloc = _allocator_conf(spec, user, notes, version)
    env: list[dict[str, Any]] = []
    for default in defaults:
        if default["name"] in _ALLOC_CONF:
            if alloc:  # the user's allocator options, merged (both names: torch reads either)
                env.append({"name": default["name"], "value": alloc})
        elif default["name"] not in user:
            env.append(default)
    overridden = [var["name"] for var in defaults if var["name"] in user and var["name"] not in _ALLOC_CONF]
    if overridden:
        notes.append(f"spec.engine.env overrides loadline's defaults for {', '.join(overridden)}")
    ref = spec.model.token_secret_ref
    if ref is not None:
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    env.extend(
        {"name": var.name, "value": var.value} for var in spec.engine.env if var.name not in _ALLOC_CONF
    )
    return env


def _allocator_conf(spec: Any, user: dict[str, int], notes: list[str], version: Version) -> str:
    """The PyTorch allocator options the container gets, under both names torch reads (the newer
    ``PYTORCH_ALLOC_CONF`` first): the user's options merged over ``expandable_segments:True``, never
    dropped. vLLM's sleep mode (and ``--enable-cumem-allocator``) allocate through its own memory pool,
    which expandable segments break, so with such a flag (``data/vllm_conflicts.json``, kind
    ``allocator_pool``) the default is left out and an explicit ``True`` is refused."""
    options: dict[str, str] = {}
    for name in _ALLOC_CONF:
        if name not in user:
            continue
        field = f"spec.engine.env[{user[name]}]"
        for item in filter(None, (part.strip() for part in spec.engine.env[user[name]].value.split(","))):
            key, sep, value = item.partition(":")
            if not sep or not key.strip() or not value.strip():
                raise RenderError(
                    field, f"{name} option {item!r} is not key:value", "write it like max_split_size_mb:512"
                )
            if options.get(key.strip(), value.strip()) != value.strip():
                raise RenderError(field, f"{name} sets {key.strip()} unlike the other allocator variable",
                                  "give both variables the same options, or set only one")  # fmt: skip
            options[key.strip()] = value.strip()
    pooled = allocator_pool_flags(spec.engine.extra_args, version)
    if pooled:
        flag = pooled[0]
        if options.get("expandable_segments", "False").lower() == "true":
            raise RenderError(
                f"spec.engine.extraArgs[{flag.index}]",
                f"{flag.name} cannot run with expandable_segments:True (vLLM's memory pool refuses it)",
                f"remove expandable_segments:True from the allocator variable, or {flag.name}",
            )
        if "expandable_segments" not in options:
            notes.append(f"{flag.name}: expandable segments left off (vLLM's memory pool refuses them)")
    elif "expandable_segments" not in options:
        options = {"expandable_segments": "True", **options}
    elif any(name in user for name in _ALLOC_CONF):
        notes.append("spec.engine.env sets expandable_segments itself")
    return ",".join(f"{key}:{value}" for key, value in options.items())


def _plan_annotation(plan: Plan, version: Version) -> str:
    s = plan.summary().model_dump(by_alias=True, mode="json")  # the keys of status.plan
    keys = (
        "gpu",
        "gpuProduct",
        "gpusPerReplica",
        "tensorParallelSize",
        "pipelineParallelSize",
        "nodesPerReplica",
        "maxModelLen",
        "maxNumSeqs",
        "maxNumBatchedTokens",
        "gpuMemoryUtilization",
        "kvCacheTokens",
    )
    summary = {key: s[key] for key in keys}
    summary["vllmVersion"] = version_text(version)
    return json.dumps(summary, separators=(",", ":"))


def default_image(version_string: str) -> str:
    """The image used when ``spec.engine.image`` is empty (fleet policies check its registry too)."""
    tag = version_string.strip().removeprefix("v")
    return f"vllm/vllm-openai:v{tag}"


def _image(obj: InferenceModel, version_string: str) -> str:
    if obj.spec.engine.image:
        return obj.spec.engine.image
    return default_image(version_string)


@cache
def _leader_script() -> str:
    return environment().get_template("leader.sh.j2").render().strip() + "\n"


def _pod(
    *,
    labels: dict[str, str],
    image: str,
    command: list[str],
    args: list[str],
    env: list[dict[str, Any]],
    res: PodResources,
    gpu_product: str,
    serves: bool,
    cache: ModelCache | None,
) -> dict[str, Any]:
    cache_claim: dict[str, Any] | None = None
    cache_sub_path = ""
    if cache is not None:
        claim = cache.persistent_volume_claim
        cache_claim = {"claimName": claim.claim_name, "readOnly": claim.read_only}
        cache_sub_path = cache.sub_path or ""
    requests = {"cpu": str(res.cpu), "memory": f"{res.memory_gib}Gi"}
    # The pod's own disk: the emptyDir sized for the download, or the scratch beside a read-only cache.
    if res.cache_gib or res.scratch_gib:
        requests["ephemeral-storage"] = f"{res.cache_gib or res.scratch_gib}Gi"
    requests["nvidia.com/gpu"] = str(res.gpus)
    limits = {"memory": f"{res.memory_gib}Gi", "nvidia.com/gpu": str(res.gpus)}
    return {
        "labels": labels,
        "annotations": {"kubectl.kubernetes.io/default-container": CONTAINER},
        "termination_grace_seconds": TERMINATION_GRACE_SECONDS,
        "uid": UID,
        "gpu_product": gpu_product,
        "container": CONTAINER,
        "image": image,
        "command": command,
        "args": args,
        "env": env,
        "serves": serves,
        "port": PORT,
        "startup_period": STARTUP_PERIOD_SECONDS,
        "startup_failure_threshold": res.startup_failure_threshold,
        "requests": requests,
        "limits": limits,
        "data_dir": DATA_DIR,
        "shm_size": f"{res.shm_gib}Gi",
        "cache_size": f"{res.cache_gib}Gi",
        "cache_claim": cache_claim,
        "cache_sub_path": cache_sub_path,
        "scratch_dir": SCRATCH_DIR,
        "scratch_size": f"{res.scratch_gib}Gi" if res.scratch_gib else "",
    }


def render_manifests(
    obj: InferenceModel, plan: Plan, *, vllm_version: str | None = None
) -> list[dict[str, Any]]:
    """The objects serving ``obj`` as ``plan`` says: workload, Service, PodDisruptionBudget.

    ``vllm_version`` overrides ``spec.engine.version`` (flags and the default image follow it).
    Raises :class:`loadline.errors.RenderError` naming the field at fault and the fix.
    """
    name, namespace = _metadata_strings(obj)
    version_string = vllm_version if vllm_version is not None else obj.spec.engine.version
    field = "--vllm-version" if vllm_version is not None else "spec.engine.version"
    version = resolve_version(version_string, field)
    notes: list[str] = [warning] if (warning := beyond_table(version)) else []

    command = vllm_command(obj, plan, version)
    notes.extend(command.notes)
    env = _env(obj, notes, version)
    selector = pod_selector(name)
    annotations = {ANNOTATION_PLAN: _plan_annotation(plan, version), ANNOTATION_VERSION: version_string}
    if notes:
        annotations[ANNOTATION_NOTES] = "\n".join(notes)
    meta = _object_meta(obj, name, namespace, selector, annotations)
    small_meta = {key: value for key, value in meta.items() if key != "annotations"}
    multi_node = plan.chosen.nodes > 1
    _, _, workload_name = workload_ref(name, multi_node)
    pod = {
        "image": _image(obj, version_string),
        "env": env,
        "res": pod_resources(obj, plan),
        "gpu_product": plan.chosen.gpu.product,
        "cache": obj.spec.model_cache,
    }
    pod_labels = {**selector, LABEL_MODEL: name}
    render_workload = _leader_worker_set if multi_node else _deployment
    workload, service_role = render_workload(
        {**meta, "name": workload_name}, plan, selector, pod_labels, command, pod
    )
    # The same name in both layouts (the LWS's own headless Service is named after the LWS, not N).
    service_meta = {**small_meta, "name": service_name(name)}
    service = render_object(
        "service.yaml.j2",
        {"meta": service_meta, "selector": {**selector, LABEL_ROLE: service_role}, "port": PORT},
    )
    budget = render_object("poddisruptionbudget.yaml.j2", {"meta": small_meta, "selector": selector})
    return [workload, service, budget]


def _object_meta(
    obj: InferenceModel,
    name: str,
    namespace: str | None,
    selector: dict[str, str],
    annotations: dict[str, str],
) -> dict[str, Any]:
    """The metadata every child carries: the model's labels with ours, the annotations, and the model
    as its controller owner (when it has a uid: a model not stored yet, as ``loadline render`` sees it,
    has none)."""
    labels = {
        **_string_map(obj.metadata.get("labels"), "metadata.labels"),
        **selector,
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_MODEL: name,
    }
    meta: dict[str, Any] = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    meta["labels"] = labels
    meta["annotations"] = annotations
    uid = obj.metadata.get("uid")
    if isinstance(uid, str) and uid:
        meta["ownerReferences"] = [
            {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": name,
                "uid": uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    return meta


def _deployment(
    meta: dict[str, Any],
    plan: Plan,
    selector: dict[str, str],
    pod_labels: dict[str, str],
    command: VllmCommand,
    pod: dict[str, Any],
) -> tuple[dict[str, Any], str]:
    """One node per replica: a Deployment of vLLM servers (and the role its Service selects)."""
    server = _pod(
        labels={**pod_labels, LABEL_ROLE: "server"},
        command=command.launcher,
        args=command.args,
        serves=True,
        **pod,
    )
    context = {
        "meta": meta,
        "replicas": plan.replicas,
        "selector": selector,
        "server": server,
        "progress_deadline": pod["res"].progress_deadline_seconds,
    }
    return render_object("deployment.yaml.j2", context), "server"


def _leader_worker_set(
    meta: dict[str, Any],
    plan: Plan,
    selector: dict[str, str],
    pod_labels: dict[str, str],
    command: VllmCommand,
    pod: dict[str, Any],
) -> tuple[dict[str, Any], str]:
    """Several nodes per replica: a LeaderWorkerSet whose leader runs vLLM over a Ray cluster of its
    workers (and the role its Service selects)."""
    leader = _pod(
        labels={**pod_labels, LABEL_ROLE: "leader"},
        command=["/bin/sh", "-c", _leader_script(), "loadline-leader"],
        args=[*command.launcher, *command.args],
        serves=True,
        **pod,
    )
    worker = _pod(
        labels={**pod_labels, LABEL_ROLE: "worker"},
        command=["ray", "start"],
        args=["--address=$(LWS_LEADER_ADDRESS):6379", "--block", "--disable-usage-stats"],
        serves=False,
        **pod,
    )
    context = {
        "meta": meta,
        "replicas": plan.replicas,
        "group_size": plan.chosen.nodes,
        "leader": leader,
        "worker": worker,
    }
    return render_object("leaderworkerset.yaml.j2", context), "leader"
