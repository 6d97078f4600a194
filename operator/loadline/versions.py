"""vLLM versions, read one way everywhere: PEP 440 as pip and vLLM's own wheels read them
(:mod:`packaging.version`), reduced to the release loadline's tables are keyed by.

A pre-, post-, dev- or local part is ignored (``0.12.0rc1``, ``0.10.1.post1``, ``0.19.0+cu124`` are
their release): a release candidate already carries the release's flags and metric names.
"""

from __future__ import annotations

import re

from packaging.version import InvalidVersion, Version

__all__ = ["Release", "parse_release", "release_of_image"]

#: ``(major, minor, patch)``.
Release = tuple[int, int, int]


def parse_release(text: str) -> Release | None:
    """``"0.19.0"``, ``"v0.19"`` → ``(0, 19, 0)``; None when ``text`` is no version with at least a
    major and a minor part (``"latest"``, ``"19"``)."""
    try:
        release = Version(text.strip()).release
    except InvalidVersion:
        return None
    if len(release) < 2:
        return None
    return release[0], release[1], release[2] if len(release) > 2 else 0


#: The release at the start of an image tag: tags are not PEP 440 (``v0.11.0-cu124``, ``0.9.2-custom``).
_TAG_RELEASE = re.compile(r"v?\d+(?:\.\d+)+")


def release_of_image(text: str) -> Release | None:
    """The release an image reference's tag names (``"vllm/vllm-openai:v0.11.0"`` → ``(0, 11, 0)``),
    or a bare version's; None when it names none (``:latest``)."""
    tag = text.rsplit(":", 1)[-1] if ":" in text else text
    release = parse_release(tag)
    if release is None and (start := _TAG_RELEASE.match(tag.strip())) is not None:
        release = parse_release(start.group(0))
    return release
