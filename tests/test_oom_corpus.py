"""The public incident corpus: cited, split before tuning, and classified at least as well as docs/oom.md says.

The corpus is the classifier's ground truth: real vLLM out-of-memory reports, each with its source and the
resolution that justifies its label, plus synthetic truncated variants of them. Each case is ``tune`` or
``heldout`` by a hash of its report's address (``split_for``); rules are tuned on ``tune`` only, so the
held-out accuracy is the honest figure, and the floors below are the ones docs/oom.md states.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from loadline.oom import OomClass, classify, parse_incident, propose_remediation
from loadline.oom._corpus import Case, load_corpus, precision_by_class, score, split_for

CORPUS = Path(__file__).parent / "corpus" / "oom"
CASES = load_corpus(CORPUS)
IDS = [c.name for c in CASES]
UNKNOWN_MAX_CONFIDENCE = 0.3
DECIDED_MIN_CONFIDENCE = 0.4

# Floors stated in docs/oom.md, at or below the 2026-11-28 measurement (held out: 19/21 real, 31/33 all;
# tune: 42/47 real), because one case moves these small sets by 2 to 5 points. The held-out floors are
# the bar (90 % overall; 85 % asked on real reports, 90 % held).
HELDOUT_REAL_FLOOR = 0.90
HELDOUT_ALL_FLOOR = 0.90
TUNE_REAL_FLOOR = 0.85


def _predict(incident: Mapping[str, Any]) -> str:
    return classify(parse_incident(incident)).oom_class.value


def _raw(case: Case) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CORPUS / f"{case.name}.json").read_text(encoding="utf-8"))
    return data


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_split_is_the_hash_rule_not_a_choice(case: Case) -> None:
    assert case.split == split_for(case.source, case.collected)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_corpus_incident_is_cited_and_quotes_the_report(case: Case) -> None:
    data = _raw(case)
    assert case.source.startswith(("https://github.com/", "/work/shared/calibration/"))
    assert len(data["note"]) > 20
    assert case.expected in {c.value for c in OomClass}
    # Every incident carries the report's own error text, except a bare OOMKilled (which has none).
    if data["reason"] != "OOMKilled":
        assert data.get("message") or data.get("log_tail"), "quote the real error text"


@pytest.mark.parametrize("case", [c for c in CASES if c.origin == "synthetic"], ids=lambda c: c.name)
def test_a_synthetic_case_has_a_real_parent_with_its_class_and_split(case: Case) -> None:
    parent = next(c for c in CASES if c.origin == "real" and case.name == f"synthetic_{c.name}_truncated")
    assert (parent.expected, parent.split, parent.source) == (case.expected, case.split, case.source)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_confidence_and_remediation_agree_with_the_answer(case: Case) -> None:
    incident = parse_incident(case.incident)
    diagnosis = classify(incident)
    remediation = propose_remediation(diagnosis, incident)
    assert diagnosis.evidence, "a diagnosis must say why"
    if diagnosis.oom_class is OomClass.UNKNOWN:
        assert diagnosis.confidence <= UNKNOWN_MAX_CONFIDENCE
        assert remediation.action == "none" and remediation.look_at
    else:
        assert diagnosis.confidence >= DECIDED_MIN_CONFIDENCE
        assert remediation.action != "none"
    for change in remediation.changes:
        assert change.new is not None and change.new != change.old


@pytest.mark.parametrize(
    ("split", "origins", "floor"),
    [
        ("heldout", {"real"}, HELDOUT_REAL_FLOOR),
        ("heldout", {"real", "paraphrase", "synthetic"}, HELDOUT_ALL_FLOOR),
        ("tune", {"real"}, TUNE_REAL_FLOOR),
    ],
    ids=["heldout-real", "heldout-all", "tune-real"],
)
def test_accuracy_stays_above_the_documented_floor(split: str, origins: set[str], floor: float) -> None:
    cases = [c for c in CASES if c.split == split and c.origin in origins]
    result = score(cases, _predict)
    assert result.total >= 10, "too few cases for the figure to mean anything"
    assert result.accuracy >= floor, f"{result.right}/{result.total}; misses: {result.misses}"


def test_corpus_covers_every_class_on_both_sides() -> None:
    real = [c for c in CASES if c.origin == "real"]
    assert len(real) >= 40
    assert {c.expected for c in real} == {c.value for c in OomClass}
    counts = Counter(c.split for c in real)
    assert counts["heldout"] >= 10 and counts["tune"] >= 20
    sources = " ".join(c.source for c in CASES)
    assert "record P26" in sources and "record P27" in sources


def test_the_fresh_set_is_cited_real_and_covers_every_cause() -> None:
    # The set gathered after the rules were written (issue 34): real threads from sources the first
    # corpus did not use, labelled from each thread's resolution, split by the same hash rule.
    fresh = [c for c in CASES if c.collected and "fresh set" in c.collected]
    assert len(fresh) >= 30
    assert {c.expected for c in fresh} == {c.value for c in OomClass} - {"unknown"}
    assert all(c.origin in {"real", "paraphrase"} for c in fresh)
    assert {c.split for c in fresh} == {"tune", "heldout"}


def test_the_precision_loadline_reports_is_the_current_measurement() -> None:
    # data/precision.json is what `loadline classify` reports as the corpus's confidence per class; a rule
    # change that moves it must rewrite it (benchmarks/oom_classify.py --write-precision).
    from loadline.oom._confidence import corpus_precision

    assert dict(corpus_precision()["classes"]) == precision_by_class(CASES, _predict)


def test_the_blind_sets_stay_at_their_measurement() -> None:
    # The first two blind sets (held out whole; the second gathered after the rules and measured once):
    # 17/22 on 2026-11-28, then 20/22 with the RAM, long-prompt and warm-up rules, every miss `unknown`.
    # A rule change must not lose one of their cases nor call one wrongly.
    later = [name for name, *_ in LATER_BLIND_SETS]
    first_two = [c for c in CASES if c.split == "blind" and not any(s in (c.collected or "") for s in later)]
    result = score(first_two, _predict)
    assert result.total == 22
    assert result.right >= 17, result.misses
    assert all(got == "unknown" for _, _, got in result.misses), result.misses


#: The later blind sets, each gathered from threads none of the rules were written beside and labelled
#: before the classifier ran: (its ``collected`` tag, its size, the floor of right answers, the most
#: wrong classes allowed). The floors are at or a case below the measurement:
#: - set 3 (2026-11-29): 6/19 measured once (4/12 real), one wrong class (a start-up CUDA error that a
#:   shorter max_model_len fixed, called batch settings); 8/19 after the wrapped-sentence and
#:   not-enough-memory rules, a tuning figure since;
#: - set 4 (2026-11-29, after set 3's rules): 6/12 measured once (4/6 real), every miss `unknown`; 7/12
#:   with the sleep-mode pool rule written after it;
#: - set 5 (2026-11-29, from TGI, Triton's TensorRT-LLM backend, KubeRay, Ray, LMCache, SGLang, GPUStack,
#:   aiconfigurator, GLM-4, ollama, vLLM...): 9/17 measured once (6/9 real), every miss `unknown`; the
#:   CUDA-runtime wording rule written after it moved no figure.
#: vLLM's "no available memory for the cache blocks" read as batch settings (issue 34's rule for vLLM's
#: refusals that name a setting; tuning figures since): set 3 9/19 with a second wrong class (a thread
#: resolved as fragmentation), set 5 10/17; a child reported killed by SIGKILL read as the OOM killer:
#: set 5 11/17.
#: - set 6 (2026-11-29, after the two rules above, from Qwen, vLLM and its recipes, LightLLM, SGLang,
#:   oMLX, MiniCPM-V, TGI, Tabby, NeMo Guardrails, Taiwan-LLM, ollama, Qwen2.5-Omni, exllamav3): 9/20
#:   measured once (8/14 real), every miss `unknown`; the rules of before the two gave 9/20 too. 11/20
#:   with the /dev/shm and CUDA-error-2 rules written after reading it (a tuning figure since); 12/20
#:   with PyTorch past vLLM's budget before Ready read as the weights.
#: - set 7 (2026-11-30, after the rule above, from llama.cpp, LMCache, LMDeploy, TGI, SGLang, Xinference,
#:   SkyRL, InternVL, club-3090, ninfer-3090, b00t and vLLM): 5/20 measured once (3/12 real), two wrong
#:   classes (a leak the kernel's OOM killer ended, called host memory; a TGI start-up whose figures show
#:   cached pieces, called fragmentation). 9/20 with the rules written after reading it (the CUDA
#:   runtime's "error: out of memory" prefixes, SIGBUS, an up-front KV cache allocation failing); the
#:   parser's fix (this process's figure, not the first process listed) made a third wrong class.
#: Memory climbing in other words ("continued to increase", VRAM) and a leak named without "OOM", written
#: after reading sets 4, 6 and 7 again (tuning figures since): set 4 8/12, set 6 13/20, set 7 10/20.
#: - set 8 (2026-11-30, after the rules above, from ollama, koboldcpp, llama.cpp, exllamav2, SGLang, TGI,
#:   Triton's TensorRT-LLM backend, LMDeploy, club-3090, l1 and vLLM): 4/20 measured once (3/12 real),
#:   one wrong class (Meta's reference llama whose KV cache for max_batch_size is made with the model,
#:   called model too big). 7/20 with the rules written after reading it (the KV cache's own failure
#:   outranks a coarse "loading" phase; a loader's own "out of memory" with no host words is the GPU's;
#:   "out of CUDA/GPU memory" and "out of VRAM" are GPU out-of-memory wordings).
#: The model's name as an incident field, added to every corpus case whose own text names it, with the
#: weights read from it (the catalog's count, else a floor the name states): set 3 10/19, set 6 15/20,
#: set 8 8/20 (tuning figures; no other split moved and no wrong class was added).
#: - set 9 (2026-11-30, after the model's name, from club-3090, DJL serving, Tenstorrent's vLLM and
#:   tt-inference-server, tt-xla, Kimi-VL, TokenSpeed, pegainfer, mistral.rs, mlx-serve, marin, vLLM,
#:   vLLM Ascend, llama.cpp, ollama, index-tts-vllm and GKE's samples): 3/20 measured once (2/12 real),
#:   one wrong class (a 75 B model over GPUs the incident does not count, called model too big from its
#:   name while vLLM's log said one GPU held 13.31 GiB). 7/20 with the rules written after reading it
#:   (vLLM's logged weights outrank a name's floor; a largest free block smaller than the request with
#:   enough free is fragmentation, whatever the phase; a TPU's HBM running out is the device's memory;
#:   "the CPU's memory" is the host's).
#: "OOM" as reports write it, a live process's own out-of-memory as the device's, fragmentation named,
#: a long context at start-up, a KV cache with no slot, CPU swap space, written after reading sets 1-9
#: again (tuning figures since): set 3 10/19 with one wrong class fewer, set 4 9/12, set 5 12/17, set 6
#: 16/20, set 7 11/20 with one wrong class fewer, set 8 10/20.
#: - set 10 (2026-11-30, after those rules, from club-3090, fak, home-ops, ht-llama.cpp, kilocode,
#:   llama-cpp-turboquant, Local-Multimodal-AI-Chat, LocalAI, ollama, private-gpt, qwen38-27b-rtx3090,
#:   Triton's TensorRT-LLM backend, vLLM and its recipes): 8/20 measured once (6/12 real), four wrong
#:   classes (a model released in MXFP4 named without its format, called too big from its name; cached
#:   pieces at a 0.972 utilization's start-up, called fragmentation; a long-context OOM that a pool leak
#:   caused; Ollama's "more system memory" for a 262k context, called host memory). 12/20 with the rules
#:   written after reading it (a catalog model found by its name as people write it, vLLM's Mamba cache
#:   refusal naming max_num_seqs, ggml's host context buffer).
#: - set 11 (2026-11-30, after set 10's rules and "not ... enough memory" with words between, from AIBrix,
#:   Kaito, LMDeploy, Xinference, GLM-4, exllamav2, vLLM, runpod worker-vllm, club-3090, Tabby, vLLM
#:   Ascend, qwen36-27b-single-3090, ollama, Mesh-LLM, vLLM production-stack and lmcache-vllm): 8/20
#:   measured once (5/12 real), three wrong classes (llama.cpp's "failed to find a memory slot" that a
#:   scattered KV cache caused, called KV overflow; cached pieces under a 0.98 utilization, called
#:   fragmentation; a start-up that a shorter max_model_len fixed, called batch settings). 8/20 with one
#:   wrong class after the rules written from it (llama.cpp's slot message is a full or a scattered
#:   cache; a utilization of 0.95 or more weighs against fragmentation); set 8 lost one case to the first
#:   (10/20) and set 10 one wrong class to the second (12/20).
#: A pinned host buffer the driver refused, transformers' refusal to put a quantized model on the CPU,
#: a start-up request larger than the GPU, a prompt of 32,000 tokens or more while serving, and memory
#: climbing said verb-first or per request, written after reading sets 1-11 again (tuning figures
#: since): set 7 12/20, set 9 11/20, set 11 10/20, no wrong class added.
#: - set 12 (2026-11-30, after those rules, from OpenLLM, ollama, LMDeploy, mistral.rs, vLLM, TGI, vLLM
#:   Ascend, TabbyAPI, vLLM production-stack and TensorRT-LLM): 4/20 measured once (3/11 real), every
#:   miss `unknown`; the rules of before that day's gave 4/20 too. 5/20 with the rule written after
#:   reading it (a batch setting named while the weights load was not what asked).
#: - set 13 (2026-11-30, after set 12's rule, from vllm-omni, sonar (Aphrodite), TGI, tt-xla, GPUStack,
#:   SkyRL, FreeToken, vLLM Ascend, TensorRT-LLM, llama.cpp, Jan, tt-inference-server, node-llama-cpp,
#:   ollama, llama-cpp-turboquant and aimee): 5/20 measured once (4/14 real), two wrong classes (an
#:   MoE model named at a size its engine offloads, called too big from its name; cached pieces beside
#:   a KV fraction that a lower one fixed, called fragmentation); the rules of before that day's gave
#:   5/20 too. 8/20 with the rules written after reading it (torch_npu's out-of-memory and its figures,
#:   "this process has X in use" condensed, a failed pool address reservation, a host-wide OOM); the
#:   first made a third wrong class (cached pieces at an NPU's start-up that a lower utilization fixed).
#: - set 14 (2026-11-30, from TGI, SGLang, functionary, exllamav2, tt-metal, ATOM, vLLM, vllm-ascend,
#:   llama-int8, text-generation-webui, SubgraphRAG, LMCache, verl, ollama, MiniMax-01): 5/20 measured
#:   once (4/14 real), two wrong classes (cached pieces at least the request on an 8 GB GPU, called
#:   fragmentation where a shorter context fixed it; memory growing per sleep/wake-up cycle, called
#:   batch settings from the sleep-mode pool); the classifier of the session's start (6d11fe3) is the
#:   same. Eight of its fifteen misses carry no out-of-memory wording at all. No rule written after it.
LATER_BLIND_SETS = [
    ("blind set 3", 19, 10, 1),
    ("blind set 4", 12, 9, 0),
    ("blind set 5", 17, 12, 0),
    ("blind set 6", 20, 16, 0),
    ("blind set 7", 20, 12, 2),
    ("blind set 8", 20, 10, 1),
    ("blind set 9", 20, 11, 0),
    ("blind set 10", 20, 12, 2),
    ("blind set 11", 20, 10, 1),
    ("blind set 12", 20, 5, 0),
    ("blind set 13", 20, 8, 3),
    ("blind set 14", 20, 5, 2),
]


@pytest.mark.parametrize(("collected", "size", "floor", "wrong"), LATER_BLIND_SETS)
def test_a_later_blind_set_stays_at_its_measurement(
    collected: str, size: int, floor: int, wrong: int
) -> None:
    cases = [c for c in CASES if collected in (c.collected or "")]
    result = score(cases, _predict)
    assert result.total == size
    assert result.right >= floor, result.misses
    assert sum(got != "unknown" for _, _, got in result.misses) <= wrong, result.misses
