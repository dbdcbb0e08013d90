"""How a run attempt ended, told to the service: one path for ``workers.launch`` (a run's Ray
job) and ``workers.tune`` (a sweep's trials).

The trainer reports RUNNING and its metrics itself (``ServiceReporter``); the process that
called ``fit_with_ray`` reports the end: COMPLETED with a summary of the final evaluation, or
FAILED with the root cause as ``"Type: message"`` and its ``failure`` (``machine``: Ray lost a
process or node; ``code``: the training raised). COMPLETED says whether the final state was
checkpointed (``final_checkpoint``: a failed final save is recorded, not hidden). Reports retry
for the run's patience (``TESSERA_REPORT_PATIENCE_S``) through service and database outages; one
that still fails is logged, never raised, so the caller's own outcome stands. Each says when the
attempt ended (``ended_at``, taken before the first try): a report that arrives after an outage
does not make the run's ``finished_at`` the time the service came back. The spec's loggers
(MLflow) live in the process that trains rank 0, not here: they end their runs there
(``workers.loggers.closed_at_end``).
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Mapping

from api.client import Client
from api.views import RunStatus, StatusReport
from workers.errors import describe, failure_of
from workers.retry import call_with_retries
from workers.service_reporter import send_status

log = logging.getLogger(__name__)

MAX_ERROR_CHARS = 20_000   # what the service stores of an error
MAX_MESSAGE_CHARS = 2_000  # and of a status message
# The metric a run with checkpoints reports at its end (the trainer records it): 1 if its final
# state is committed, 0 if the final save failed after its retries (then COMPLETED says
# ``final_checkpoint: missing``). Here, not beside the checkpoints, so that the job driver, which
# imports this module, does not import torch's distributed checkpointing.
FINAL_SAVED_KEY = "checkpoint/final_saved"


def summary_of(metrics: Mapping[str, float]) -> str:
    """``"eval/accuracy=0.91, eval/loss=0.3"``: the final evaluation; without one (no eval set)
    the last training loss, ``"train/loss=0.42"``; ``"no metrics reported"`` without either."""
    text = ", ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items()) if k.startswith("eval/"))
    if not text and "train/loss" in metrics:
        text = f"train/loss={metrics['train/loss']:.4g}"
    return text[:MAX_MESSAGE_CHARS] or "no metrics reported"


def _now() -> datetime:
    return datetime.now(timezone.utc)


class RunOutcome:
    """Reports the end of one attempt of ``run_id`` with its bearer ``token``. Without a
    ``client`` (a sweep without a service) it reports nothing."""

    def __init__(self, client: Client | None, run_id: str, token: str | None):
        self.client, self.run_id = client, run_id
        self._token = token  # never logged

    def failed(self, exc: BaseException) -> str:
        """Report FAILED with ``exc``'s root cause and whether a lost machine or the training
        raised it (``failure_of``); returns that ``"Type: message"``."""
        error = describe(exc)
        self._report(StatusReport(status=RunStatus.FAILED, error=error[:MAX_ERROR_CHARS], failure=failure_of(exc),
                                  ended_at=_now()))
        return error

    def completed(self, metrics: Mapping[str, float]) -> bool:
        """Report COMPLETED with ``summary_of(metrics)`` and whether the final state was
        checkpointed; False if the service never heard it."""
        saved = metrics.get(FINAL_SAVED_KEY)
        final = None if saved is None else ("saved" if saved else "missing")
        message = summary_of(metrics) + ("; final checkpoint missing" if final == "missing" else "")
        return self._report(StatusReport(status=RunStatus.COMPLETED, message=message[:MAX_MESSAGE_CHARS],
                                         final_checkpoint=final, ended_at=_now()))

    def _report(self, body: StatusReport) -> bool:
        if self.client is None:
            return True
        client = self.client
        try:
            call_with_retries(lambda: send_status(client, self.run_id, self._token, body),
                              what=f"reporting {body.status.value}")
        except Exception as exc:  # e.g. a sweep canceled meanwhile: the run has ended already
            log.error("could not report %s for run %s: %s", body.status.value, self.run_id, describe(exc))
            return False
        return True
