"""``loadline run``: start the operator (kopf) with the handlers in :mod:`loadline.handlers._registry`."""

from __future__ import annotations

import argparse
import os


def _cmd_run(args: argparse.Namespace) -> int:
    if args.namespace:
        os.environ["LOADLINE_NAMESPACES"] = ",".join(args.namespace)
    if args.standalone:
        os.environ["LOADLINE_STANDALONE"] = "true"
    import kopf

    from loadline.handlers import _registry

    settings = _registry.SETTINGS.__class__()  # re-read env after the flags above
    _registry.SETTINGS.__dict__.update(settings.__dict__)
    namespaces = settings.namespace_list
    kopf.configure(verbose=args.verbose, debug=args.debug)
    liveness = f"http://0.0.0.0:{settings.liveness_port}/healthz" if settings.liveness_port else None
    kopf.run(
        clusterwide=not namespaces,
        namespaces=namespaces,
        standalone=settings.standalone,
        priority=settings.priority,
        # A peering name makes peering mandatory in kopf (it pauses until the peering CRD exists).
        peering_name=None if settings.standalone else settings.peering_name,
        liveness_endpoint=liveness,
    )
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = sub.add_parser("run", help="run the operator against the current kubeconfig or in-cluster config")
    run.add_argument("--namespace", "-n", action="append", help="watch only this namespace (repeatable)")
    run.add_argument("--standalone", action="store_true", help="no peering with other operator replicas")
    run.add_argument("--verbose", action="store_true")
    run.add_argument("--debug", action="store_true")
    run.set_defaults(func=_cmd_run)
