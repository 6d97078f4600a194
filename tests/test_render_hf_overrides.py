"""What the plan was sized on reaches the pod (issue 33): the rope scaling of an inline or ConfigMap
config.json is rendered as ``--hf-overrides``, since the pod reads the checkpoint's own config.json."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from loadline.errors import RenderError, SpecError
from loadline.render import _flags, render_manifests
from loadline.sizing import model_catalog, plan_inference_model
from tests.test_render import argv, flag_value, make_obj, render

QWEN3_YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}


def qwen3_with_yarn() -> dict[str, Any]:
    config = copy.deepcopy(dict(model_catalog()["qwen/qwen3-8b"].config))
    config["rope_scaling"] = QWEN3_YARN
    return config


def long_qwen3(**spec: Any) -> Any:
    return make_obj(
        {"model": {"name": "Qwen/Qwen3-8B", "config": qwen3_with_yarn()}, "maxModelLen": 131072, **spec}
    )


def test_inline_rope_scaling_is_rendered_as_hf_overrides() -> None:
    args = argv(render(long_qwen3()))
    assert flag_value(args, "--max-model-len") == "131072"
    overrides = json.loads(flag_value(args, "--hf-overrides") or "{}")
    assert overrides["rope_scaling"] == QWEN3_YARN


def test_a_config_map_config_is_rendered_the_same_way() -> None:
    obj = make_obj(
        {
            "model": {"name": "Qwen/Qwen3-8B", "config": None, "configMapRef": {"name": "qwen3"}},
            "maxModelLen": 131072,
        }
    )
    planned = plan_inference_model(obj.spec, config_map_config=qwen3_with_yarn())
    objects = render_manifests(obj, planned)
    overrides = json.loads(flag_value(argv(objects), "--hf-overrides") or "{}")
    assert overrides["rope_scaling"] == QWEN3_YARN


def test_a_config_whose_rope_states_its_window_renders_no_overrides() -> None:
    # Llama 3.1's llama3 rope scaling is in its hub config.json and changes no window in vLLM.
    assert "--hf-overrides" not in argv(render(make_obj()))


def test_hf_overrides_in_extra_args_are_the_users_and_nothing_is_rendered_twice() -> None:
    given = json.dumps({"rope_scaling": QWEN3_YARN})
    args = argv(render(long_qwen3(engine={"extraArgs": ["--hf-overrides", given]})))
    assert args.count("--hf-overrides") == 1 and flag_value(args, "--hf-overrides") == given


def test_hf_overrides_in_extra_args_without_the_configs_rope_scaling_are_refused() -> None:
    given = json.dumps({"max_position_embeddings": 40960})
    with pytest.raises(SpecError) as err:
        plan_inference_model(long_qwen3(engine={"extraArgs": ["--hf-overrides", given]}).spec)
    assert err.value.field == "spec.engine.extraArgs[0]" and "rope_scaling" in err.value.fix


def test_a_version_without_the_flag_is_refused_naming_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    table = _flags.flag_table()
    has = type(table).has

    def lacks_hf_overrides(self: Any, flag: str, version: Any) -> bool:
        return flag != "--hf-overrides" and has(self, flag, version)

    monkeypatch.setattr(type(table), "has", lacks_hf_overrides)
    with pytest.raises(RenderError) as err:
        render(long_qwen3())
    assert err.value.field == "spec.model.config"
    assert "--hf-overrides" in err.value.problem and "spec.engine.version" in err.value.fix
