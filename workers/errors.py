"""Errors that cross process boundaries, and finding the root cause inside wrapped ones.

Ray wraps a worker's exception several times (``WorkerGroupError`` holding per-rank
failures, ``UserExceptionWithTraceback``, ``RayTaskError``, ``ControllerError``). What the
user needs is the innermost error's type and message, e.g.
``FileNotFoundError: Fashion-MNIST files not found under /nope ...``; what decides whether a
resume is worth it is whether, inside them, Ray says a process or node was lost
(``failure_of``: by the exceptions' types, never their text).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

from api.views import RunFailure

# Attributes through which Ray (and Python) point at the exception they wrap, in the order
# tried: per-rank worker failures, Ray Train's traceback wrapper, the controller's failure,
# Ray's task error, then the standard cause chain.
_WRAPPED_ATTRIBUTES = ("worker_failures", "_base_exc", "controller_failure", "cause", "__cause__")
# Where Ray Train's health check keeps the error of a worker that stopped answering: an
# ``ActorDiedError`` when its process or node is gone. Not a root cause: its message says more.
_LOSS_ATTRIBUTES = (*_WRAPPED_ATTRIBUTES, "health_check_failure")

# Ray's exceptions for a lost process or node (ray.exceptions, ray.train, Ray 2.60): a worker
# actor died or is unreachable, a worker or raylet crashed, a node died or was preempted, an
# object went with its node; Ray Train's health check of a worker failed or hung, or its
# worker group could not start because a node died meanwhile. Not among them: Ray's
# OutOfMemoryError, which the run's own size may cause again; ``RaySystemError``, which Ray
# raises for a worker that could not start (a bad runtime_env) and for what it cannot unpickle
# (ray/_private/serialization.py, 2.60): both fail every attempt alike; and a ``RayActorError``
# whose actor's ``__init__`` raised (``actor_init_failed``): the code's.
_RAY_LOSSES = {
    "ray.exceptions": ("RayActorError", "NodeDiedError", "WorkerCrashedError", "LocalRayletDiedError",
                       "ObjectLostError"),
    "ray.train.v2.api.exceptions": ("PreemptionError",),
    "ray.train.v2._internal.exceptions": ("WorkerHealthCheckFailedError", "WorkerHealthCheckTimeoutError",
                                          "WorkerGroupStartupFailedError"),
}
# Neither the machine's nor the code's: a worker group that timed out waiting for the cluster's
# resources (a busy cluster, or a run too big for it). Its failure is left unknown.
_RAY_NEITHER = {"ray.train.v2._internal.exceptions": ("WorkerGroupStartupTimeoutError",)}


class TrainingError(RuntimeError):
    """Training failed; the message is the root cause as ``"Type: message"``.

    Holds only a string, so it pickles across Ray and process boundaries.
    """

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def __reduce__(self):
        return (type(self), (self.message,))


def root_cause(exc: BaseException) -> BaseException:
    """The innermost exception inside Ray's and Python's wrappers."""
    seen: set[int] = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        inner = _wrapped(exc)
        if inner is None:
            return exc
        exc = inner
    return exc


def describe(exc: BaseException) -> str:
    """``"Type: message"`` of ``exc``'s root cause (just the type if it has no message)."""
    cause = root_cause(exc)
    if isinstance(cause, TrainingError):
        return cause.message
    message = str(cause).strip()
    return f"{type(cause).__name__}: {message}" if message else type(cause).__name__


def _wrapped(exc: BaseException) -> BaseException | None:
    for attribute in _WRAPPED_ATTRIBUTES:
        inner = getattr(exc, attribute, None)
        if isinstance(inner, dict) and inner:
            inner = inner[min(inner)]  # the lowest failing rank
        if isinstance(inner, BaseException) and inner is not exc:
            return inner
    return None


def failure_of(exc: BaseException) -> RunFailure | None:
    """``"machine"`` if anywhere inside ``exc`` (every rank's failure, not only the lowest's: a
    peer of a lost rank fails in its collective) is one of Ray's exceptions for a lost process
    or node, so another attempt may pass; None (not known) for a worker group that waited out
    its start for resources; else ``"code"``: the training raised (its code, spec or data), and
    a resume would raise again."""
    inside = list(_inside(exc))
    losses = _imported(_RAY_LOSSES)
    if any(isinstance(inner, losses) and not getattr(inner, "actor_init_failed", False) for inner in inside):
        return "machine"
    neither = _imported(_RAY_NEITHER)
    return None if any(isinstance(inner, neither) for inner in inside) else "code"


def _imported(classes: dict[str, tuple[str, ...]]) -> tuple[type[BaseException], ...]:
    """The named classes whose modules this process has imported: an exception of a module never
    imported cannot be inside (unpickling one imports its module), so a failure before Ray was
    loaded (a spec refused) does not wait seconds for ``ray.train`` to import."""
    found = []
    for module_name, names in classes.items():
        module = sys.modules.get(module_name)
        found += [cls for name in names if isinstance(cls := getattr(module, name, None), type)]
    return tuple(found)


def _inside(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and every exception it wraps, through every rank's failure."""
    seen: set[int] = set()
    stack = [exc]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        for attribute in _LOSS_ATTRIBUTES:
            inner = getattr(current, attribute, None)
            for candidate in inner.values() if isinstance(inner, dict) else (inner,):
                if isinstance(candidate, BaseException):
                    stack.append(candidate)
