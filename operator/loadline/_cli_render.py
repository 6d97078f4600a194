"""``loadline render``: plan the InferenceModels of files and print their manifests, like ``helm template``.

FleetPolicy documents among the files govern the models as in the cluster (see ``_cli_policy``).

The output is a YAML stream GitOps users can commit. Errors (an ``extraArgs`` flag the chosen vLLM
version lacks, an unplannable spec) are :class:`loadline.errors.LoadlineError`s, which the CLI prints
as one line naming the field and the fix, with exit status 2.
"""

from __future__ import annotations

import argparse
import sys

from loadline._cli_policy import govern, where
from loadline.api import load_manifests
from loadline.errors import LoadlineError
from loadline.render import beyond_table, manifests_yaml, render_manifests, resolve_version


def _cmd_render(args: argparse.Namespace) -> int:
    override: str | None = args.vllm_version
    if override is not None:
        resolve_version(override, "--vllm-version")
    out = []
    warned: set[str] = set()
    # FleetPolicies among the files fill defaults and refuse as admission would; the plan is made for
    # the version that will run (batching defaults differ between releases) and within the limits.
    for governed in govern(load_manifests(args.file), vllm_version=override):
        obj = governed.obj
        version = override if override is not None else obj.spec.engine.version
        try:
            objects = render_manifests(obj, governed.plan, vllm_version=override)
        except LoadlineError as exc:  # the renderer names the field; say which file and object
            raise exc.at(f"{governed.source}: {where(obj)}") from None
        warning = beyond_table(resolve_version(version, "spec.engine.version"))
        if warning and warning not in warned:
            warned.add(warning)
            print(f"loadline: warning: {warning}", file=sys.stderr)
        meta = obj.metadata
        ns = f"{meta['namespace']}/" if meta.get("namespace") else ""
        source = f"{governed.source} (InferenceModel {ns}{meta.get('name')})"
        out.append(manifests_yaml(objects, source=source))
    sys.stdout.write("".join(out))
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "render",
        help="plan the InferenceModels in a YAML file and print their vLLM manifests (like helm template)",
    )
    p.add_argument(
        "file",
        nargs="+",
        help="YAML files of InferenceModels, FleetPolicies and Namespaces; - for standard input",
    )
    p.add_argument(
        "--vllm-version",
        metavar="V",
        help="render for this vLLM version instead of spec.engine.version (e.g. 0.12.0)",
    )
    p.set_defaults(func=_cmd_render)
