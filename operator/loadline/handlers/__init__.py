"""kopf glue: the only package that talks to kopf and the Kubernetes API.

Importing :mod:`loadline.handlers._registry` registers every handler with kopf; ``loadline run`` does
that and starts kopf's operator loop.
"""

from loadline.settings import OperatorSettings

__all__ = ["OperatorSettings"]
