"""What one operator process remembers between handler calls: pure bookkeeping, no I/O.

Not a model's ``status`` (that is :mod:`loadline.status`, what the API server holds): these are the
process's own notes, lost with it and rebuilt from the watches: the GPU node and pod views the planner
reads (kopf's indexes trimmed by :func:`node_entry` and :func:`pod_entry`), what it applied and rolled
out, what the workload and pod watches showed, the restart slots it took, and reads shared by a burst's
timers. ``loadline.handlers`` builds one of each at start (its ``OperatorState``) and hands them to the
handlers; tests build their own.
"""

from loadline.state._applied import APPLIED_VERSIONS_MAX, AppliedChildren, AppliedVersions, applied_now
from loadline.state._claims import CLAIM_SECONDS, RestartClaims
from loadline.state._index import (
    INSTANCE_LABEL,
    REMEDIATION_VIEW_SECONDS,
    VIEW_SECONDS,
    WATCH_SELECTORS,
    Views,
    entries,
    model_entry,
    node_entry,
    pairs,
    pod_entry,
)
from loadline.state._keys import ModelKey, ObjectKey
from loadline.state._reads import RecentReads
from loadline.state._rollouts import ROLL_OUT_GUARD_SECONDS, RollOuts
from loadline.state._status_reads import STATUS_READS_MAX, StatusReads
from loadline.state._watched import (
    REVISION_SECONDS,
    SCALE_WRITTEN_SECONDS,
    SEEN_WORKLOADS_MAX,
    ReadyPods,
    ScaleCounts,
    SeenWorkloads,
)

__all__ = [
    "APPLIED_VERSIONS_MAX",
    "CLAIM_SECONDS",
    "INSTANCE_LABEL",
    "REMEDIATION_VIEW_SECONDS",
    "REVISION_SECONDS",
    "ROLL_OUT_GUARD_SECONDS",
    "SCALE_WRITTEN_SECONDS",
    "SEEN_WORKLOADS_MAX",
    "STATUS_READS_MAX",
    "VIEW_SECONDS",
    "WATCH_SELECTORS",
    "AppliedChildren",
    "AppliedVersions",
    "ModelKey",
    "ObjectKey",
    "ReadyPods",
    "RecentReads",
    "RestartClaims",
    "RollOuts",
    "ScaleCounts",
    "SeenWorkloads",
    "StatusReads",
    "Views",
    "applied_now",
    "entries",
    "model_entry",
    "node_entry",
    "pairs",
    "pod_entry",
]
