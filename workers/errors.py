"""Errors that cross process boundaries, and finding the root cause inside wrapped ones.

Ray wraps a worker's exception several times (``WorkerGroupError`` holding per-rank
failures, ``UserExceptionWithTraceback``, ``RayTaskError``, ``ControllerError``). What the
user needs is the innermost error's type and message, e.g.
``FileNotFoundError: Fashion-MNIST files not found under /nope ...``.
"""

from __future__ import annotations

# Attributes through which Ray (and Python) point at the exception they wrap, in the order
# tried: per-rank worker failures, Ray Train's traceback wrapper, the controller's failure,
# Ray's task error, then the standard cause chain.
_WRAPPED_ATTRIBUTES = ("worker_failures", "_base_exc", "controller_failure", "cause", "__cause__")


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
