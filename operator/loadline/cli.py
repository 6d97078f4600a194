"""The ``loadline`` command line: ``run | plan | size | render | classify | observe | crds | agent | gpus |
window``.

Every sub-command is a thin shell around a pure function of the core; errors from the core
(:class:`loadline.errors.LoadlineError`) are printed as one line naming the field and the fix, with
exit status 2, and never as a traceback. Anything else is a loadline bug: one line too, exit status 70.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from loadline.errors import LoadlineError, NoFeasiblePlanError

Command = Callable[[argparse.Namespace], int]
EXIT_INTERNAL = 70  # EX_SOFTWARE: distinct from 2 (bad input) so scripts can tell a bug from a refusal


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


def build_parser() -> argparse.ArgumentParser:
    # One registration function per command module; each adds its parser and sets `func`.
    from loadline import (
        _cli_agent,
        _cli_observe,
        _cli_oom,
        _cli_render,
        _cli_run,
        _cli_sizing,
        _cli_window,
    )

    parser = argparse.ArgumentParser(
        prog="loadline",
        description="Size, render and keep vLLM model servers out of out-of-memory trouble.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in (
        _add_crds,
        _cli_sizing.register,
        _cli_render.register,
        _cli_oom.register,
        _cli_observe.register,
        _cli_run.register,
        _cli_agent.register,
        _cli_window.register,
    ):
        register(sub)
    return parser


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
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:  # a bug, not bad input: still one line, and how to get the traceback
        if os.environ.get("LOADLINE_DEBUG"):
            raise
        print(
            f"loadline: internal error: {type(exc).__name__}: {exc} (fix: report it as a loadline bug with "
            "the input; LOADLINE_DEBUG=1 prints the traceback)",
            file=sys.stderr,
        )
        return EXIT_INTERNAL


if __name__ == "__main__":
    raise SystemExit(main())
