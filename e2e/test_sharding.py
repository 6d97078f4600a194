"""Two replicas sharing the InferenceModels (chart value sharding.shards=2) on an API server with the
ShardedListAndWatch feature gate, as e2e/cluster-up.sh starts it: each model is reconciled by exactly
one replica, the one holding the Lease of its uid's shard, and when one replica dies the other takes
its shard over and reconciles its models; when a replacement comes, the survivor hands a shard back.
FleetPolicy restart slots hold across the shards: two models of different shards whose restarts come
due in the same second never restart together under `maxConcurrent: 1`."""

from __future__ import annotations

import copy
import functools
import json
import re
import signal
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from chart import ChartOperator
from kube import REPO, Kubectl, wait_for
from loadline import sharding
from operator_helpers import api_requests, example, model, wait_phase
from test_restarts import deploy, hold_restarts_one_at_a_time

SHARDS = 2


def _restart_replicas(operator: ChartOperator, values: dict[str, Any]) -> None:
    """`helm upgrade` with ``values``, then a rollout: the old replicas stop (SIGTERM, releasing their
    Leases) and two new ones start with the upgraded Deployment's env."""
    operator.upgrade(values)
    for replica in [r for r in operator.replicas if r.alive()]:
        operator.kill(replica, signal.SIGTERM, restart=False)
    operator.scale_to(2)
    operator.wait_replicas(2)
    # The API server may still hold a connection to a stopped replica's webhook (EOF on its next call):
    # wait until an admission round trip passes, as a client retrying after a rollout would.
    probe = json.dumps(chat("default", "admission-probe"))
    wait_for(
        lambda: (
            operator.kubectl.run("apply", "--dry-run=server", "-f", "-", input=probe, check=False).returncode
            == 0
            or None
        ),
        timeout=60,
        what="the new replicas' admission webhooks",
    )


def split(operator: ChartOperator) -> dict[int, str] | None:
    """Shard index → holder once each live replica holds one shard Lease (None before)."""
    held = shard_holders(operator)
    return held if all(held.values()) and len(set(held.values())) == SHARDS else None


@pytest.fixture
def sharded(operator: ChartOperator) -> Iterator[ChartOperator]:
    """Two replicas, each holding one shard. Started together, one may claim both shards before the
    other asks for its share; the tests begin after that hand-over, not in the middle of it."""
    _restart_replicas(operator, {"sharding": {"shards": SHARDS}})
    try:
        wait_for(lambda: split(operator), timeout=60, what="each replica to hold one shard Lease")
        yield operator
    finally:
        _restart_replicas(operator, {"sharding": {"shards": 1}})
        operator.active(timeout=60)


def shard_holders(operator: ChartOperator) -> dict[int, str]:
    holders = {}
    for index in range(SHARDS):
        name = sharding.lease_name(operator.lease_name, index, SHARDS)
        proc = operator.kubectl.run("get", "lease", name, "-n", operator.namespace, "-o", "json", check=False)
        # Not there yet on a fresh cluster: no replica has claimed that shard so far.
        holders[index] = (
            str(json.loads(proc.stdout)["spec"].get("holderIdentity") or "") if proc.returncode == 0 else ""
        )
    return holders


def lease_requests(operator: ChartOperator) -> dict[str, Counter[str]]:
    """Each live replica's own requests on Leases so far, by verb (its ``loadline_api_requests_total``)."""
    found: dict[str, Counter[str]] = {}
    for replica in operator.replicas:
        if replica.alive():
            requests = api_requests(replica)
            found[replica.pod_name] = Counter(
                {verb: count for (verb, resource), count in requests.items() if resource == "leases"}
            )
    return found


def reconciled_by(
    operator: ChartOperator, namespace: str, name: str, since: dict[str, int] | None = None
) -> list[str]:
    """Pod names of the replicas whose log says they ran the reconcile handler on the model."""
    line = re.compile(rf"\[{re.escape(namespace)}/{re.escape(name)}\] Handler 'reconcile' succeeded")
    found = []
    for replica, text in operator.logs():
        if line.search(text[(since or {}).get(replica.pod_name, 0) :]):
            found.append(replica.pod_name)
    return found


def chat(namespace: str, name: str) -> dict[str, Any]:
    doc = copy.deepcopy(example(REPO / "examples" / "chat-llama-8b.yaml", namespace))
    doc["metadata"]["name"] = name
    doc["spec"]["concurrency"] = 1
    return doc


def test_a_sharded_pair_reconciles_every_model_once_and_survives_a_replica_death(
    sharded: ChartOperator, kubectl: Kubectl, namespace: str
) -> None:
    operator = sharded

    # Each replica claims its share: one shard each, within a few retry periods.
    holders = wait_for(lambda: split(operator), timeout=60, what="each replica to hold one shard Lease")
    by_identity = {r.identity(): r for r in operator.replicas if r.alive()}
    assert set(holders.values()) == set(by_identity)

    # Models until each shard has two (uids are drawn by the API server).
    uids: dict[str, str] = {}
    while len(per_shard(uids)) < SHARDS or min(per_shard(uids).values()) < 2:
        name = f"chat-{len(uids)}"
        kubectl.apply(chat(namespace, name), namespace)
        uids[name] = model(kubectl, namespace, name)["metadata"]["uid"]
        assert len(uids) <= 12, "the API server's uids kept landing in one shard"
    for name in uids:
        wait_phase(kubectl, namespace, name, "Ready", timeout=90)
    for name, uid in uids.items():
        owner = by_identity[holders[sharding.shard_of(uid, SHARDS)]]
        assert reconciled_by(operator, namespace, name) == [owner.pod_name], name
    print(
        f"\n{len(uids)} models over {SHARDS} shards: {dict(per_shard(uids))}; each reconciled by its shard's holder only"
    )

    # At rest a replica reads no Lease: it renews its shard by writing it as it last wrote it, and sees
    # the other shard through its watch of the shard Leases (it read each one every retry period before).
    at_start = lease_requests(operator)
    time.sleep(4 * operator.retry_period)
    after = lease_requests(operator)
    for pod_name, counts in after.items():
        spent = counts - at_start.get(pod_name, Counter())
        assert spent["update"] >= 2, f"{pod_name} renewed its shard only {spent['update']} times"
        assert spent["get"] == 0, f"{pod_name} read Leases {spent['get']} times at rest: {dict(spent)}"
    print(f"at rest over {4 * operator.retry_period:g}s: Lease requests by replica {after}")

    # One replica dies (SIGKILL, not restarted: a node lost). The survivor takes its shard once the
    # Lease has expired and stayed free for a Lease duration, and reconciles that shard's models.
    victim = by_identity[holders[0]]
    survivor = next(r for r in by_identity.values() if r is not victim)
    offsets = {
        r.pod_name: len(r.log.read_text(errors="replace")) for r in operator.replicas if r.log.exists()
    }
    start = time.monotonic()
    operator.kill(victim, signal.SIGKILL, restart=False)
    wait_for(
        lambda: set(shard_holders(operator).values()) == {survivor.identity()} or None,
        timeout=90,
        what="the survivor to hold both shard Leases",
    )
    took_over = time.monotonic() - start
    print(f"kill -9 of the holder of shard 0: {survivor.pod_name} holds both shards after {took_over:.1f}s")
    # A model of the dead replica's shard changes, and a new model comes: the survivor does both.
    orphan = next(name for name, uid in uids.items() if sharding.shard_of(uid, SHARDS) == 0)
    kubectl(
        "patch", "inferencemodel", orphan, "-n", namespace, "--type=merge", "-p", '{"spec":{"concurrency":2}}'
    )
    kubectl.apply(chat(namespace, "after"), namespace)
    wait_phase(kubectl, namespace, "after", "Ready", timeout=90)

    def reconciled_again() -> dict[str, Any] | None:
        obj = model(kubectl, namespace, orphan)
        status = obj.get("status") or {}
        return obj if status.get("observedGeneration") == obj["metadata"]["generation"] else None

    wait_for(reconciled_again, timeout=60, what=f"{orphan}'s change reconciled")
    assert reconciled_by(operator, namespace, orphan, since=offsets) == [survivor.pod_name]
    assert reconciled_by(operator, namespace, "after", since=offsets) == [survivor.pod_name]

    # The ReplicaSet's replacement comes (a new pod, a new identity), finds both Leases held and asks
    # for its share; the survivor hands one shard over, and the newcomer reconciles that shard's models.
    before = {r.pod_name for r in operator.replicas}
    offsets = {
        r.pod_name: len(r.log.read_text(errors="replace")) for r in operator.replicas if r.log.exists()
    }
    start = time.monotonic()
    operator.scale_to(2)
    newcomer = next(r for r in operator.replicas if r.pod_name not in before)
    pair = {survivor.identity(), wait_for(newcomer.identity, timeout=30, what="the replacement's identity")}

    def one_each() -> dict[int, str] | None:
        held = shard_holders(operator)
        return held if set(held.values()) == pair else None

    rebalanced = wait_for(one_each, timeout=90, what="the survivor to hand a shard over to the replacement")
    print(f"replacement started: one shard each again after {time.monotonic() - start:.1f}s")
    handed = next(index for index, holder in rebalanced.items() if holder == newcomer.identity())
    moved = [name for name, uid in uids.items() if sharding.shard_of(uid, SHARDS) == handed]
    stayed = [name for name, uid in uids.items() if sharding.shard_of(uid, SHARDS) != handed]
    for name in (moved[0], stayed[0]):
        kubectl(
            "patch",
            "inferencemodel",
            name,
            "-n",
            namespace,
            "--type=merge",
            "-p",
            '{"spec":{"concurrency":3}}',
        )

    def observed(name: str) -> bool | None:
        obj = model(kubectl, namespace, name)
        return (obj.get("status") or {}).get("observedGeneration") == obj["metadata"]["generation"] or None

    for name in (moved[0], stayed[0]):
        wait_for(functools.partial(observed, name), timeout=60, what=f"{name}'s change reconciled")
    assert reconciled_by(operator, namespace, moved[0], since=offsets) == [newcomer.pod_name]
    assert reconciled_by(operator, namespace, stayed[0], since=offsets) == [survivor.pod_name]


def per_shard(uids: dict[str, str]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for uid in uids.values():
        shard = sharding.shard_of(uid, SHARDS)
        counts[shard] = counts.get(shard, 0) + 1
    return counts


def test_restart_slots_hold_across_shards(sharded: ChartOperator, kubectl: Kubectl, namespace: str) -> None:
    """The restart test's FleetPolicy (a window a few minutes ahead, ``maxConcurrent: 1``) over two
    models owned by different replicas: their restarts come due at the window's first second, each
    replica deciding for its own model, and still only one restarts at a time (the other waits for
    the slot, claimed in the slots Lease both replicas decide on)."""

    def no_pods(name: str) -> bool | None:
        selector = f"loadline.dev/inferencemodel={name}"
        return not kubectl.json("get", "pods", "-n", namespace, "-l", selector)["items"] or None

    def one_per_shard() -> dict[str, dict[str, Any]]:
        pods: dict[int, tuple[str, dict[str, Any]]] = {}
        for index in range(12):
            name = f"slot-{index}"
            pod = deploy(kubectl, namespace, name)[0]
            shard = sharding.shard_of(model(kubectl, namespace, name)["metadata"]["uid"], SHARDS)
            if shard in pods:
                # Gone, with its pod, before the next is deployed: the uids' luck must not run the test
                # cluster out of L4 GPUs (eight models in one shard did, about one run in 128).
                kubectl("delete", "inferencemodel", name, "-n", namespace, "--wait=true")
                wait_for(functools.partial(no_pods, name), timeout=60, what=f"{name}'s pod gone")
                continue
            pods[shard] = (name, pod)
            if len(pods) == SHARDS:
                return dict(pods.values())
        raise AssertionError("the API server's uids kept landing in one shard")

    hold_restarts_one_at_a_time(kubectl, namespace, one_per_shard)
    claims = kubectl.json("get", "lease", f"{sharded.lease_name}-restart-slots", "-n", sharded.namespace)
    assert "loadline.dev/restart-slots" in claims["metadata"]["annotations"], claims
