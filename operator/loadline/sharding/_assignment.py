"""Which shards one operator process reconciles: built when its kopf run starts, handed to it.

A run watches a fixed set of shards (a wider or narrower set stops kopf and starts a new run), so
the assignment is a frozen value in the run's state rather than something the handlers look up."""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass, field

from loadline.sharding._ranges import owns, selector

__all__ = ["ShardAssignment"]


@dataclass(frozen=True)
class ShardAssignment:
    """``count`` shards in all, of which this process holds ``owned``; one shard (the default) owns
    every model."""

    count: int = 1
    owned: frozenset[int] = field(default_factory=frozenset)

    @property
    def sharded(self) -> bool:
        return self.count > 1

    def watch_selector(self) -> str:
        """The ``shardSelector`` of the InferenceModel watch ('' when not sharded)."""
        return selector(self.owned, self.count) if self.sharded else ""

    def owns_uid(self, uid: str | None) -> bool:
        """Whether this process handles the InferenceModel with this uid (always, when not sharded;
        never a child without an InferenceModel owner, when sharded)."""
        if not self.sharded:
            return True
        return bool(uid) and owns(str(uid), self.owned, self.count)

    def owns_key(self, key: str, owned_models: Container[str]) -> bool:
        """Whether ``namespace/name`` is one of this process's models, by its index of owned models."""
        return not self.sharded or key in owned_models
