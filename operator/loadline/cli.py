"""The ``loadline`` command line: ``run | plan | size | render | classify | crds``.

Every sub-command is a thin shell around a pure function of the core; errors from the core
(:class:`loadline.errors.LoadlineError`) are printed as one line naming the field and the fix, with
exit status 2, and never as a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from loadline.errors import LoadlineError, NoFeasiblePlanError

Command = Callable[[argparse.Namespace], int]


def _cmd_crds(args: argparse.Namespace) -> int:
    from loadline.api import render_crds_yaml, write_crds

    if args.split:
        for path in write_crds(args.split):
            print(path)
    else:
        sys.stdout.write(render_crds_yaml())
    return 0


def _add_crds(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("crds", help="print the CustomResourceDefinitions generated from the API models")
    p.add_argument("--split", metavar="DIR", help="write one file per CRD into DIR instead of printing")
    p.set_defaults(func=_cmd_crds)


# Sub-command registrations, one function per command. Each adds its parser and sets `func`.
_REGISTRATIONS: list[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None]] = [_add_crds]


def _register(fn: Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None]) -> None:
    _REGISTRATIONS.append(fn)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="loadline",
        description="Size, render and keep vLLM model servers out of out-of-memory trouble.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _load_optional_commands()
    for register in _REGISTRATIONS:
        register(sub)
    return parser


def _load_optional_commands() -> None:
    """Import the modules that register further sub-commands (kept apart to keep start-up light)."""
    import importlib

    for name in ("loadline._cli_sizing", "loadline._cli_render", "loadline._cli_oom", "loadline._cli_run"):
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        register = getattr(module, "register", None)
        if register is not None and register not in _REGISTRATIONS:
            _REGISTRATIONS.append(register)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Command = args.func
    try:
        return func(args)
    except NoFeasiblePlanError as exc:
        print(f"loadline: {exc}", file=sys.stderr)
        for line in exc.rejections:
            print(f"  - {line}", file=sys.stderr)
        return 2
    except LoadlineError as exc:
        print(f"loadline: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
