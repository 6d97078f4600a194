"""Splitting the InferenceModels between operator replicas by hash of their uid.

Kubernetes 1.36's sharded list and watch (alpha, feature gate ``ShardedListAndWatch`` on
kube-apiserver) lets a client ask for the objects whose ``metadata.uid`` hashes (FNV-1a, 64 bit) into
``[start, end)`` ranges. loadline cuts the hash space into ``shards`` equal ranges; each range is owned
by whichever replica holds its Lease (``<lease name>-shard-<i>-of-<n>``), and a replica watches the
union of the ranges it holds. This package only *decides* (the ranges, the selector text, whether a
uid is ours, which free shards to claim, which to ask back or hand over when a replica returns);
:mod:`loadline.handlers._shards` does the I/O. It imports neither kopf nor the Kubernetes client.
"""

from loadline.sharding._assignment import ShardAssignment
from loadline.sharding._ranges import (
    HASH_SPACE,
    SHARD_LEASE_LABEL,
    ShardClaim,
    fair_share,
    lease_name,
    lease_selector,
    owns,
    plan_claims,
    selector,
    shard_of,
    shard_range,
    uid_hash,
)
from loadline.sharding._rebalance import (
    WANTED_AT_ANNOTATION,
    WANTED_BY_ANNOTATION,
    ShardRequest,
    plan_hand_over,
    plan_request,
)

__all__ = [
    "HASH_SPACE",
    "SHARD_LEASE_LABEL",
    "WANTED_AT_ANNOTATION",
    "WANTED_BY_ANNOTATION",
    "ShardAssignment",
    "ShardClaim",
    "ShardRequest",
    "fair_share",
    "lease_name",
    "lease_selector",
    "owns",
    "plan_claims",
    "plan_hand_over",
    "plan_request",
    "selector",
    "shard_of",
    "shard_range",
    "uid_hash",
]
