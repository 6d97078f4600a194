"""``loadline render``: plan the InferenceModels of a file and print their manifests, like ``helm template``.

The output is a YAML stream GitOps users can commit. Errors (an ``extraArgs`` flag the chosen vLLM
version lacks, an unplannable spec) are :class:`loadline.errors.LoadlineError`s, which the CLI prints
as one line naming the field and the fix, with exit status 2.
"""

from __future__ import annotations

import argparse
import sys

from loadline.api import load_inference_models
from loadline.render import manifests_yaml, render_manifests, resolve_version
from loadline.sizing import plan_inference_model


def _cmd_render(args: argparse.Namespace) -> int:
    override: str | None = args.vllm_version
    if override is not None:
        resolve_version(override, "--vllm-version")
    out = []
    for obj in load_inference_models(args.file):
        if override is not None:
            # Plan for the version that will run: batching defaults differ between releases.
            engine = obj.spec.engine.model_copy(update={"version": override})
            obj = obj.model_copy(update={"spec": obj.spec.model_copy(update={"engine": engine})})
        plan = plan_inference_model(obj.spec)
        objects = render_manifests(obj, plan, vllm_version=override)
        meta = obj.metadata
        where = f"{meta['namespace']}/" if meta.get("namespace") else ""
        out.append(manifests_yaml(objects, source=f"{args.file} (InferenceModel {where}{meta.get('name')})"))
    sys.stdout.write("".join(out))
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "render",
        help="plan the InferenceModels in a YAML file and print their vLLM manifests (like helm template)",
    )
    p.add_argument("file", help="InferenceModel YAML (one or more documents)")
    p.add_argument(
        "--vllm-version",
        metavar="V",
        help="render for this vLLM version instead of spec.engine.version (e.g. 0.12.0)",
    )
    p.set_defaults(func=_cmd_render)
