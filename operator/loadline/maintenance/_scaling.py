"""Restarts and the autoscaler: a restart does not start while the model is being scaled.

A restart counts the model's pods to decide how many may be down at once and whether a surge pod fits;
while an HPA, KEDA or ``kubectl scale`` is moving the count (``spec.replicas`` differs from the pods the
workload has, ``status.replicas``), those counts are about to change under it, and evicting a pod of a
model that is scaling up for load takes capacity away exactly when it is short. So the start waits for
the count to settle; a restart already running carries on (it follows ``spec.replicas`` each step).
"""

from __future__ import annotations

__all__ = ["scaling_in_progress"]


def scaling_in_progress(desired: int, current: int | None) -> bool:
    """Whether the model is being scaled: its workload does not have the ``desired`` pods yet
    (``current`` None: not mirrored yet, nothing to wait for)."""
    return current is not None and current != desired
