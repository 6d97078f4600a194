"""The vLLM command line of one replica, for one vLLM version.

Every flag loadline writes comes from the plan or a spec field, and is checked against the flag table
before it is written: a flag the version lacks is never rendered. Rules worth knowing:

* ``--dtype`` is the resolved dtype the plan was sized with (never ``auto``), so what runs is what was
  budgeted.
* ``--quantization`` is written only when ``spec.quantization`` names a method. With ``none`` vLLM
  detects a quantized checkpoint's own ``quantization_config`` and picks its best kernel (e.g.
  ``awq_marlin`` for AWQ); naming a method it would not pick can only make it slower or refuse to start.
* ``--kv-cache-dtype`` only when it is not ``auto``; ``--pipeline-parallel-size`` only above 1;
  ``--served-model-name``/``--revision`` only when set.
* CPU KV offload (``spec.kvOffload.cpuGiB``): ``--kv-offloading-size`` (GiB for the whole engine) and
  ``--kv-offloading-backend native`` where the version has them (0.11.1 on). Older versions only have
  ``--swap-space``, which is GiB *per GPU* and which only the V0 engine ever used: it is rendered
  (divided by the replica's GPUs) so a V0 fallback on 0.8-0.10 gets it, and a note says plainly that
  the V1 engine offloads nothing with it.
* ``--hf-overrides`` (JSON) carries the rope scaling of an inline or ConfigMap ``config.json`` that
  extends the context window the plan was sized on: the pod reads the checkpoint's own config.json
  from the hub, and vLLM would otherwise refuse the planned ``--max-model-len``. Where the version has
  no such flag the render is refused naming the field. When ``extraArgs`` give ``--hf-overrides``
  themselves (and hold those keys: the planner checks), loadline renders none.
* ``extraArgs`` come last, after :func:`loadline.render._flags.check_extra_args` has refused flags
  the version lacks, values of the wrong type and flags loadline owns, and
  :func:`loadline.render._conflicts.check_conflicts` flags that would undo the plan or clash with a
  rendered flag (``data/vllm_conflicts.json``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from loadline.api import InferenceModel
from loadline.errors import RenderError
from loadline.render._conflicts import check_conflicts
from loadline.render._flags import Version, check_extra_args, flag_table, version_text
from loadline.sizing import HF_OVERRIDES_FLAG, Plan, given_hf_overrides

PORT = 8000
HOST = "0.0.0.0"  # the server must listen on the pod IP for the Service and the probes


@dataclass
class VllmCommand:
    """The server's argv, split as Kubernetes wants it, and what the renderer wants a reader to know."""

    launcher: list[str]
    args: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _number(value: float) -> str:
    return format(value, "g")


class _Builder:
    def __init__(self, version: Version) -> None:
        self.version = version
        self.table = flag_table()
        self.args: list[str] = []

    def flag(self, name: str, value: str | None = None) -> None:
        if not self.table.has(name, self.version):
            entry = self.table.spec(name)
            why = entry.absence(self.version) if entry else ""
            raise RenderError(
                "spec.engine.version",
                f"loadline would render {name}, which vLLM {version_text(self.version)} lacks ({why})",
                "report this as a loadline bug, or pick another spec.engine.version",
            )
        self.args.append(name)
        if value is not None:
            self.args.append(value)


def _offload(builder: _Builder, obj: InferenceModel, plan: Plan, notes: list[str]) -> None:
    offload = obj.spec.kv_offload
    if offload is None or offload.cpu_gi_b <= 0:
        return
    version, table = builder.version, builder.table
    gib = offload.cpu_gi_b
    if table.has("--kv-offloading-size", version):
        builder.flag("--kv-offloading-size", _number(gib))
        builder.flag("--kv-offloading-backend", "native")
        return
    if table.has("--swap-space", version):
        entry = table.spec("--kv-offloading-size")
        since = version_text(entry.since) if entry is not None and entry.since else "a later release"
        per_gpu = gib / plan.chosen.gpus
        builder.flag("--swap-space", _number(round(per_gpu, 3)))
        notes.append(
            f"spec.kvOffload: vLLM {version_text(version)} has no --kv-offloading-size (added in {since}); "
            f"rendered --swap-space {_number(round(per_gpu, 3))} (GiB per GPU), which only the V0 engine "
            f"uses: the V1 engine offloads no KV cache with it. Use vLLM {since} or newer for CPU KV offload."
        )
        return
    notes.append(
        f"spec.kvOffload: vLLM {version_text(version)} has no CPU KV offload flag; none was rendered."
    )


def _hf_overrides(builder: _Builder, obj: InferenceModel, plan: Plan) -> None:
    overrides = plan.model.hf_overrides
    if not overrides or given_hf_overrides(list(obj.spec.engine.extra_args)) is not None:
        return
    field = "spec.model.configMapRef" if obj.spec.model.config_map_ref is not None else "spec.model.config"
    if not builder.table.has(HF_OVERRIDES_FLAG, builder.version):
        entry = builder.table.spec(HF_OVERRIDES_FLAG)
        why = entry.absence(builder.version) if entry else "no release has it"
        raise RenderError(
            field,
            f"the plan is sized on its rope scaling ({', '.join(sorted(overrides))}), which vLLM "
            f"{version_text(builder.version)} cannot be given without {HF_OVERRIDES_FLAG} ({why}): the pod "
            "would read the checkpoint's config.json and refuse the planned max-model-len",
            f"pick a spec.engine.version with {HF_OVERRIDES_FLAG}, or drop the rope scaling and lower "
            "spec.maxModelLen to the model's own window",
        )
    builder.flag(HF_OVERRIDES_FLAG, json.dumps(dict(overrides), sort_keys=True, separators=(",", ":")))


def vllm_command(obj: InferenceModel, plan: Plan, version: Version) -> VllmCommand:
    """The full server command line: launcher, model, planned flags, then the CR's extraArgs."""
    spec, settings, chosen = obj.spec, plan.settings, plan.chosen
    table = flag_table()
    launcher = table.launcher(version)
    builder = _Builder(version)
    notes: list[str] = []

    if launcher.model == "positional":
        builder.args.append(spec.model.name)
    else:
        builder.flag(launcher.model, spec.model.name)
    if spec.model.served_name:
        builder.flag("--served-model-name", spec.model.served_name)
    if spec.model.revision:
        builder.flag("--revision", spec.model.revision)
    builder.flag("--host", HOST)
    builder.flag("--port", str(PORT))
    builder.flag("--tensor-parallel-size", str(chosen.tensor_parallel_size))
    if chosen.pipeline_parallel_size > 1:
        builder.flag("--pipeline-parallel-size", str(chosen.pipeline_parallel_size))
    if chosen.nodes > 1:
        builder.flag("--distributed-executor-backend", "ray")
    builder.flag("--dtype", settings.dtype)
    if spec.quantization != "none":
        builder.flag("--quantization", settings.quantization)
    if settings.kv_cache_dtype != "auto":
        builder.flag("--kv-cache-dtype", settings.kv_cache_dtype)
    builder.flag("--max-model-len", str(settings.max_model_len))
    builder.flag("--max-num-seqs", str(settings.max_num_seqs))
    builder.flag("--max-num-batched-tokens", str(settings.max_num_batched_tokens))
    builder.flag("--gpu-memory-utilization", _number(settings.gpu_memory_utilization))
    if settings.enforce_eager:
        builder.flag("--enforce-eager")
    _hf_overrides(builder, obj, plan)
    _offload(builder, obj, plan, notes)

    extra = list(spec.engine.extra_args)
    check_extra_args(extra, version)
    check_conflicts(
        extra,
        version,
        rendered=builder.args,
        max_model_len=settings.max_model_len,
        max_num_batched_tokens=settings.max_num_batched_tokens,
    )
    builder.args.extend(extra)
    return VllmCommand(list(launcher.command), builder.args, notes)
