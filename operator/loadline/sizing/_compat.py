"""Can the chosen vLLM release load this model at all? (``data/vllm_compat.json``)

Sizing a model that vLLM refuses to load helps nobody: the pod is scheduled, downloads the weights and
crash-loops. So before planning, loadline checks three facts of the chosen release, all data generated
from vLLM's own source (``scripts/vllm_compat.py``) or written with a cited source:

* the release's model registry has the checkpoint's architecture (``config.json`` ``architectures``),
  directly or as vLLM's registry resolves a pooling class name (``XForSequenceClassification`` loads
  ``XForCausalLM`` through the pooling adapter); a name no release lists is refused, since loadline would
  only be guessing its shape, unless ``extraArgs`` ask for ``--model-impl transformers`` (vLLM's
  Transformers backend, which loads what transformers defines, sized as a standard decoder);
* the release has the ``spec.quantization`` method, and, while vLLM deprecates it, ``extraArgs`` carries
  ``--allow-deprecated-quantization`` (vLLM refuses to start without it);
* the method fits the checkpoint: a pre-quantized method (AWQ, GPTQ, compressed-tensors, MXFP4, ...)
  needs a checkpoint quantized that way, an online method (fp8, bitsandbytes) quantizes a bf16/fp16
  checkpoint, and an already quantized checkpoint cannot be quantized again with another method.

Every refusal is a :class:`SpecError` naming the field and the fix. A version newer than the table is
judged by the newest release it knows; one older than its oldest by the oldest.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from loadline.errors import SpecError
from loadline.sizing._arch import Architecture
from loadline.sizing._data import engine_version, parse_version

Version = tuple[int, int, int]


class _Span(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    since: str | None = None
    until: str | None = None
    absent: list[str] = Field(default_factory=list)


class _Method(_Span):
    deprecated: _Span | None = None


class _Checkpoints(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    source: str = Field(alias="_source", min_length=1)
    prequantized: dict[str, list[str]]
    online: list[str]
    checkpoint_names: dict[str, str]


class _Table(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    about: str = Field(alias="_about")
    releases: list[str]
    unread_releases: dict[str, str] = Field(default_factory=dict)
    checkpoints: _Checkpoints
    quantization_methods: dict[str, _Method]
    architectures: dict[str, _Span]


@dataclass(frozen=True)
class Span:
    """Releases ``since <= v < until`` except ``absent`` (None: open end)."""

    since: Version | None
    until: Version | None
    absent: tuple[Version, ...] = ()

    @classmethod
    def of(cls, raw: _Span) -> Span:
        return cls(
            parse_version(raw.since) if raw.since else None,
            parse_version(raw.until) if raw.until else None,
            tuple(parse_version(v) for v in raw.absent),
        )

    def covers(self, version: Version) -> bool:
        if self.since is not None and version < self.since:
            return False
        return version not in self.absent and (self.until is None or version < self.until)

    def why_not(self, what: str, version: Version) -> tuple[str, str]:
        """(problem, fix) for a version outside the span."""
        shown = _text(version)
        if self.since is not None and version < self.since:
            return f"vLLM {shown} has no {what} (added in {_text(self.since)})", (
                f"set spec.engine.version to {_text(self.since)} or newer"
            )
        if self.until is not None and version >= self.until:
            return f"vLLM {shown} has no {what} (removed in {_text(self.until)})", (
                f"set spec.engine.version below {_text(self.until)}"
            )
        return f"vLLM {shown} lacks {what}", "pick another spec.engine.version"


@dataclass(frozen=True)
class CompatTable:
    oldest: Version
    newest: Version
    architectures: dict[str, Span]
    methods: dict[str, Span]
    deprecated: dict[str, Span]
    prequantized: dict[str, frozenset[str]]
    online: frozenset[str]
    checkpoint_names: dict[str, str]


def _text(version: Version) -> str:
    return ".".join(str(part) for part in version)


@cache
def compat_table() -> CompatTable:
    """The table, read once and validated with pydantic at this boundary."""
    node = resources.files("loadline.sizing").joinpath("data/vllm_compat.json")
    try:
        raw = _Table.model_validate_json(node.read_text(encoding="utf-8"))
    except ValidationError as exc:  # a packaging bug, not user input
        raise RuntimeError(f"sizing/data/vllm_compat.json is malformed: {exc}") from None
    releases = sorted(parse_version(v) for v in raw.releases)
    return CompatTable(
        oldest=releases[0],
        newest=releases[-1],
        architectures={name: Span.of(span) for name, span in raw.architectures.items()},
        methods={name: Span.of(m) for name, m in raw.quantization_methods.items()},
        deprecated={
            name: Span.of(m.deprecated) for name, m in raw.quantization_methods.items() if m.deprecated
        },
        prequantized={m: frozenset(names) for m, names in raw.checkpoints.prequantized.items()},
        online=frozenset(raw.checkpoints.online),
        checkpoint_names=dict(raw.checkpoints.checkpoint_names),
    )


def _flag_values(extra_args: list[str], flag: str) -> list[str | None]:
    """Values given to ``flag`` in ``extraArgs`` (None: given without a value)."""
    out: list[str | None] = []
    for index, token in enumerate(extra_args):
        name, sep, value = token.partition("=")
        if name.replace("_", "-") != flag:
            continue
        if sep:
            out.append(value)
        elif index + 1 < len(extra_args) and not extra_args[index + 1].startswith("-"):
            out.append(extra_args[index + 1])
        else:
            out.append(None)
    return out


# vLLM's class-name suffixes (vllm/config/model.py _SUFFIX_TO_DEFAULTS, 0.10.2 on): a pooling class
# vLLM does not list is loaded as the generative class of the same stem through its pooling adapter
# (vllm/model_executor/models/registry.py _normalize_arch).
_GENERATIVE_SUFFIXES = ("ForCausalLM", "ForConditionalGeneration", "ChatModel", "LMHeadModel")
_POOLING_SUFFIXES = (
    "ForTextEncoding",
    "EmbeddingModel",
    "ForSequenceClassification",
    "ForTokenClassification",
    "ClassificationModel",
    "ForRewardModeling",
    "RewardModel",
    "Model",
)


def _adapted(name: str, table: CompatTable) -> Span | None:
    """The span of the generative class a pooling class name ``name`` is loaded as, if vLLM lists one."""
    for suffix in _POOLING_SUFFIXES:
        if name.endswith(suffix):
            stem = name[: -len(suffix)]
            for generative in _GENERATIVE_SUFFIXES:
                span = table.architectures.get(stem + generative)
                if span is not None:
                    return span
            return None
    return None


def check_compatibility(
    arch: Architecture, quantization: str, version_text: str, extra_args: list[str], model_name: str
) -> None:
    """Refuse a model the vLLM release ``version_text`` cannot load as asked (see the module docstring).

    ``quantization`` is ``spec.quantization`` as written (``none``: the checkpoint's own, if any).
    """
    table = compat_table()
    version = min(max(parse_version(version_text), table.oldest), table.newest)
    if "transformers" not in _flag_values(extra_args, "--model-impl"):
        for name in arch.architectures:
            span = table.architectures.get(name) or _adapted(name, table)
            if span is not None and not span.covers(version):
                problem, fix = span.why_not(f"model class {name} ({model_name}'s architecture)", version)
                raise SpecError(
                    "spec.engine.version", problem, fix + " (or load it with --model-impl transformers)"
                )
        known = [n for n in arch.architectures if n in table.architectures or _adapted(n, table)]
        if arch.architectures and not known:
            names = ", ".join(arch.architectures)
            raise SpecError(
                "spec.model",
                f"{model_name}'s config.json names the model class {names}, which no vLLM release from "
                f"{_text(table.oldest)} to {_text(table.newest)} lists (vLLM refuses to load it, and "
                "loadline would only guess its memory)",
                "check config.json's architectures; if transformers defines the class, add "
                "--model-impl transformers to spec.engine.extraArgs (vLLM's Transformers backend; loadline "
                "then sizes it as a standard decoder)",
            )
    checkpoint = arch.quantization.method if arch.quantization is not None else None
    if checkpoint is not None:
        checkpoint = table.checkpoint_names.get(checkpoint, checkpoint)
    method = quantization if quantization != "none" else checkpoint
    if method is not None and method in table.methods:
        # The checkpoint's own method (spec.quantization none) can only be fixed by the version.
        field = "spec.quantization" if quantization != "none" else "spec.engine.version"
        span = table.methods[method]
        if not span.covers(version):
            problem, fix = span.why_not(f"quantization method {method}", version)
            raise SpecError(field, problem, fix)
        deprecated = table.deprecated.get(method)
        if (
            deprecated is not None
            and deprecated.covers(version)
            and not _flag_values(extra_args, "--allow-deprecated-quantization")
        ):
            raise SpecError(
                "spec.engine.extraArgs",
                f"vLLM {_text(version)} deprecates quantization method {method} and refuses to load it "
                "without --allow-deprecated-quantization",
                "add --allow-deprecated-quantization to spec.engine.extraArgs, or use another method",
            )
    if quantization == "none":
        return
    accepts = table.prequantized.get(quantization)
    if accepts is not None:
        if checkpoint is None:
            raise SpecError(
                "spec.quantization",
                f"{quantization} loads checkpoints quantized with it, and {model_name}'s config.json has no "
                "quantization_config (vLLM refuses to load it)",
                f"serve a checkpoint quantized with {quantization}, or an online method on this one "
                f"({', '.join(sorted(table.online & set(table.methods)))}), or none",
            )
        if checkpoint not in accepts:
            raise SpecError(
                "spec.quantization",
                f"{quantization} cannot load {model_name}, a checkpoint quantized with {checkpoint} "
                "(vLLM refuses a method that does not match the checkpoint's)",
                "set spec.quantization to none (vLLM then loads the checkpoint's own quantization)",
            )
    elif quantization in table.online and checkpoint is not None and checkpoint != quantization:
        raise SpecError(
            "spec.quantization",
            f"{model_name} is already quantized with {checkpoint}; vLLM does not quantize it again with "
            f"{quantization}",
            "set spec.quantization to none (vLLM loads the checkpoint's own quantization), or serve the "
            "bf16/fp16 checkpoint",
        )


def beyond_tables(version_text: str) -> str:
    """One sentence when ``version_text`` is newer than every release loadline's tables know (empty
    otherwise): such a version is still planned, with the newest table of each kind, since a new
    release mostly keeps the old rules, but the user should know which rules those were."""
    newest = compat_table().newest
    version = parse_version(version_text)
    if version <= newest:
        return ""
    rules = _text(engine_version(_text(newest)).since)
    return (
        f"vLLM {_text(version)} is newer than every loadline table: planned as for {_text(newest)}, the "
        f"newest release of vllm_compat.json (model registry, quantization methods), with engine.json's "
        f"memory rules of {rules} on"
    )
