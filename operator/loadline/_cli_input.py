"""Reading a command's JSON input (a file, or ``-`` for standard input), with one-line errors.

Every way a file can be wrong (missing, a directory, not UTF-8, not JSON) becomes the command's own
:class:`~loadline.errors.SpecError` subclass naming the argument and the fix, never a traceback.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from loadline.errors import SpecError


def read_json(path: str, field: str, fix: str, error: type[SpecError] = SpecError) -> Any:
    """The JSON document at ``path`` (``-``: standard input); ``field`` names it in errors."""
    try:
        raw = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except IsADirectoryError:
        raise error(field, f"{path} is a directory", fix) from None
    except OSError as exc:
        raise error(field, f"cannot read {path}: {exc.strerror}", fix) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise error(field, f"{path} is not UTF-8 text (a binary or compressed file?)", fix) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(
            field, f"{path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})", fix
        ) from None
