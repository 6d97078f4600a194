"""How many crash roll-outs run at once after a storm, and which go first.

A storm of out-of-memory crashes (a prompt pattern that grew across a whole fleet, a bad engine
release) makes every model's fix roll out together. The workload controllers then work on all of them
in turn, each roll-out's steps queued behind every other's, so that every model serves again at about
the time the last one does. Paced, the first models serve again within seconds and the rest follow
in order, while the control plane's work is the same: the fleet as a whole serves sooner.

:func:`plan_pacing` decides, from the roll-outs running and those waiting, which start now (at most
``PacingLimits.at_once`` fleet-wide and ``per_pool`` per GPU pool), in order of the models' priority,
then of what they serve (replicas × concurrency), then of when they asked; and, for each one left
waiting, how many are ahead of it and which limit holds it. Pure. :class:`Pacer` keeps the queue
(in memory) and answers with what this decides; the handlers carry it out.
"""

from loadline.pacing._pacer import Pacer
from loadline.pacing._plan import PacingLimits, PacingPlan, RollOutRequest, Waiting, plan_pacing

__all__ = ["Pacer", "PacingLimits", "PacingPlan", "RollOutRequest", "Waiting", "plan_pacing"]
