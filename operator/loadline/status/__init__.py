"""What the operator writes in an InferenceModel's status: pure builders of status patches, conditions,
readiness, incidents and owner references (:mod:`loadline.status.build`).

Nothing here imports kopf or a Kubernetes client: the handlers pass plain dicts in and get plain
dicts out, so every decision is unit-tested.
"""
