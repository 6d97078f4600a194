"""Leader election between operator replicas, as decisions on a ``coordination.k8s.io/v1`` Lease.

The Helm chart runs two replicas; exactly one may reconcile. They share one Lease: the replica named in
``holderIdentity`` leads and renews ``renewTime`` every retry period; the others wait until it expires
(the leader died) or is released (the leader shut down and wrote an empty holder). This package only
*decides*: :func:`plan_lease` turns the Lease as read into an action and the record to write. It
imports neither kopf nor the Kubernetes client, so it is tested without a cluster or a clock;
:mod:`loadline.handlers._election` does the reads and the resourceVersion-guarded writes.
"""

from loadline.election._lease import (
    MICRO_TIME_FORMAT,
    LeaseAction,
    LeaseDecision,
    LeaseRecord,
    Reason,
    format_micro_time,
    parse_micro_time,
    plan_lease,
    release_record,
    seconds_until_expiry,
)

__all__ = [
    "MICRO_TIME_FORMAT",
    "LeaseAction",
    "LeaseDecision",
    "LeaseRecord",
    "Reason",
    "format_micro_time",
    "parse_micro_time",
    "plan_lease",
    "release_record",
    "seconds_until_expiry",
]
