"""vLLM versions read one way everywhere (loadline.versions): as pip reads them, reduced to a release."""

from __future__ import annotations

import pytest

from loadline.errors import SpecError
from loadline.sizing import parse_version
from loadline.versions import parse_release, release_of_image


@pytest.mark.parametrize(
    ("text", "release"),
    [
        ("0.19.0", (0, 19, 0)),
        ("v0.19.1", (0, 19, 1)),
        ("0.19", (0, 19, 0)),
        ("0.10.1.1", (0, 10, 1)),  # a fourth part, as vLLM 0.10.1.1 had
        ("0.12.0rc1", (0, 12, 0)),
        ("0.9.2.post1", (0, 9, 2)),
        ("0.19.0+cu124", (0, 19, 0)),  # a local build of the release
        (" 0.19.0 ", (0, 19, 0)),
        ("latest", None),
        ("19", None),  # no minor: no table row to take
        ("0.19.0-custom", None),  # not PEP 440: not a version (an image tag may say it, below)
    ],
)
def test_a_version_is_its_release_as_pip_reads_it(text: str, release: tuple[int, int, int] | None) -> None:
    assert parse_release(text) == release


def test_a_spec_version_that_is_no_version_names_the_field_and_the_fix() -> None:
    with pytest.raises(SpecError) as caught:
        parse_version("latest")
    assert caught.value.field == "spec.engine.version" and "0.19.0" in str(caught.value)


@pytest.mark.parametrize(
    ("image", "release"),
    [
        ("vllm/vllm-openai:v0.11.0", (0, 11, 0)),
        ("registry.local:5000/vllm/vllm-openai:v0.6.3", (0, 6, 3)),
        ("mirror/vllm:v0.11.0-cu124", (0, 11, 0)),  # tags are not PEP 440; their leading release counts
        ("vllm/vllm-openai:latest", None),
    ],
)
def test_an_image_tag_names_its_release(image: str, release: tuple[int, int, int] | None) -> None:
    assert release_of_image(image) == release
