"""The spec as remediation left it: ``status.remediation.overrides`` laid over ``spec``."""

from __future__ import annotations

from loadline.api._v1alpha1 import InferenceModelSpec, KVOffload, Overrides


def apply_overrides(spec: InferenceModelSpec, overrides: Overrides | None) -> InferenceModelSpec:
    """A copy of ``spec`` with every set override in place (GPU floors are the planner's: see its kwargs)."""
    if overrides is None:
        return spec
    engine = spec.engine.model_copy(
        update={
            key: value
            for key, value in {
                "max_num_seqs": overrides.max_num_seqs,
                "max_num_batched_tokens": overrides.max_num_batched_tokens,
                "gpu_memory_utilization": overrides.gpu_memory_utilization,
            }.items()
            if value is not None
        }
    )
    update: dict[str, object] = {"engine": engine}
    if overrides.max_model_len is not None:
        update["max_model_len"] = overrides.max_model_len
    if overrides.kv_offload_cpu_gi_b is not None:
        update["kv_offload"] = KVOffload(cpu_gi_b=overrides.kv_offload_cpu_gi_b)
    if overrides.memory_gi_b is not None:
        update["resources"] = spec.resources.model_copy(update={"memory_gi_b": overrides.memory_gi_b})
    return spec.model_copy(update=update)
