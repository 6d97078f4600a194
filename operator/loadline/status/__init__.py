"""What the operator reads and writes in an InferenceModel's status: the status read once into the API
model (:mod:`loadline.status.read`), pure builders of the patches, conditions, readiness, incidents and
owner references to write (:mod:`loadline.status.build`), and the tested JSON patches that write a
decision only while what it read holds (:mod:`loadline.status.patch`).

Nothing here imports kopf or a Kubernetes client, so every decision is unit-tested.
"""

from loadline.status.read import read_status, stored, with_changes

__all__ = ["read_status", "stored", "with_changes"]
