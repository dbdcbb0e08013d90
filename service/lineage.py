"""Fork and continue: the writes that give a run a child, or a COMPLETED run another attempt.

Fork: the parent's spec with the request's patch merged in (``api.lineage.merge_patch``) is
validated as a new ``RunSpec``; unless it starts from ``scratch``, the changes must leave the
parent's checkpoint loadable (``api.lineage.unloadable_changes``) and the service resolves
``from`` to one committed checkpoint of the parent, recorded in the child's ``fork`` column
with the patch. The worker reads it from the run's view (``RunView.fork``) and loads it when
the child has no checkpoint of its own yet, so users never name a checkpoint URL: a fork can
only load checkpoints of a run its key may read, in the same project.

Continue: a COMPLETED run goes back to QUEUED as its next attempt with a longer
``max_duration`` (same unit) in its spec; the attempt resumes from the run's newest committed
checkpoint exactly as ``resume`` does (the trainer's step counter, data position and schedule
carry on).
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from sqlalchemy import select

from api.lineage import (ForkInfo, ForkRequest, ForkStep, PatchError, loads_optimizer, longer_duration_problem,
                         merge_patch, replaced_object_hint, replaced_objects, unloadable_changes)
from api.specs import RunSpec, unrunnable_problems
from api.time import Time
from api.validation_errors import body_error, field_error, format_validation_errors, one_line
from api.views import CheckpointView, RunStatus
from service.db.models import Checkpoint, Run
from service.repository import Repository, RunNotFound, RunRecord
from service.run_writes import apply_run_status, insert_run
from service.state_machine import RUN_TRANSITIONS


class LineageRefused(ValueError):
    """A fork or continue that cannot be made as asked: ``errors`` are 422 items."""

    def __init__(self, errors: list[dict[str, Any]]):
        self.errors = errors
        super().__init__("; ".join(e["msg"] for e in errors))


def _patch_error(field: str, msg: str, value: Any) -> dict[str, Any]:
    return body_error(field, msg, value, within=("body", "patch"))


def forked_spec(parent: RunRecord, request: ForkRequest) -> RunSpec:
    """The child's validated spec: the parent's with the patch merged in; ``LineageRefused`` names
    each field that does not validate (under ``patch``; a field an object replaced for its new
    ``name`` lacks says so), that every worker would refuse (``api.specs.unrunnable_problems``),
    or that makes the checkpoint unloadable."""
    try:
        merged = merge_patch(parent.spec, request.patch)
    except PatchError as exc:
        raise LineageRefused([_patch_error(exc.field, exc.msg, exc.value)]) from None
    try:
        spec = RunSpec.model_validate(merged)
    except ValidationError as exc:
        items = format_validation_errors(list(exc.errors()), merged, RunSpec.model_json_schema())
        replaced = replaced_objects(parent.spec, request.patch)
        for item in items:
            hint = replaced_object_hint(item["field"], replaced) if item["msg"].startswith("Field required") else None
            if hint is not None:
                item["msg"] = f"{item['msg']}; {hint}"
        raise LineageRefused([body_error(item["field"], item["msg"], item["input"], within=("body", "patch"))
                              if item["field"] else item for item in items]) from exc
    unrunnable = unrunnable_problems(spec)  # a new run: what every worker would refuse, as POST /runs refuses it
    if unrunnable:
        raise LineageRefused([_patch_error(field, why, value) for field, value, why in unrunnable])
    if request.from_ != "scratch":
        child = spec.model_dump(mode="json")
        problems = unloadable_changes(parent.spec, child)
        if problems:
            raise LineageRefused([_patch_error(field, f"{why}; the fork starts from the parent's checkpoint",
                                               _value_at(child, field)) for field, why in problems])
    return spec


def _value_at(spec: dict[str, Any], field: str) -> Any:
    value: Any = spec
    for part in field.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def chosen_checkpoint(parent: RunRecord, checkpoints: list[CheckpointView], choice: Any) -> CheckpointView:
    """The parent's committed checkpoint that ``choice`` (``latest`` or ``ForkStep``) names."""
    committed = [c for c in checkpoints if c.committed]
    if not committed:
        raise LineageRefused([field_error("from", ["body", "from"], f"run {parent.id} has no committed checkpoint "
                                          f"yet; fork from 'scratch', or wait for one", _from_json(choice))])
    if choice == "latest":
        return max(committed, key=lambda c: c.step)
    match = [c for c in committed if c.step == choice.step]
    if not match:
        steps = ", ".join(str(c.step) for c in committed)
        raise LineageRefused([field_error("from.step", ["body", "from", "step"],
                                          f"run {parent.id} has no committed checkpoint at batch {choice.step}; "
                                          f"it has: {steps}", choice.step)])
    return match[-1]


def _from_json(choice: Any) -> Any:
    return choice.model_dump() if isinstance(choice, ForkStep) else choice


def fork_info(parent: RunRecord, spec: RunSpec, request: ForkRequest,
              checkpoint: CheckpointView | None) -> ForkInfo:
    """What the child records about its origin, and what its worker loads."""
    return ForkInfo(from_=request.from_, patch=request.patch,
                    checkpoint_url=checkpoint.url if checkpoint else None,
                    step=checkpoint.step if checkpoint else None,
                    load_optimizer=checkpoint is not None and loads_optimizer(parent.spec, spec.model_dump(mode="json")))


def insert_fork(repo: Repository, parent: RunRecord, spec: RunSpec, info: ForkInfo, *, by: str = "user") -> RunRecord:
    """Store the child as a QUEUED run in the parent's project, with its lineage (``by``: who
    forked it, named in its first event)."""
    origin = "fresh weights" if info.checkpoint_url is None else f"its checkpoint at batch {info.step}"
    with repo.db.write() as session:
        return RunRecord.from_row(insert_run(session, spec, message=f"forked from run {parent.id} ({origin}) by {by}",
                                             project=parent.project, parent_id=parent.id,
                                             fork=info.model_dump(mode="json", by_alias=True)))


def continue_run(repo: Repository, run_id: str, max_duration: Time, *, by: str = "user") -> RunRecord:
    """COMPLETED → QUEUED as the next attempt, with ``max_duration`` in the spec; 409 unless the
    run is COMPLETED with a committed checkpoint, ``LineageRefused`` unless the duration is
    longer in the same unit."""
    with repo.db.locked_write(Run, run_id, RunNotFound) as (session, run):
        current = RunStatus(run.status)
        if current is not RunStatus.COMPLETED:
            raise RUN_TRANSITIONS.refusal(run_id, current, RunStatus.QUEUED,
                                          f"run {run_id} is {current.value}; only COMPLETED runs can be continued "
                                          f"(resume FAILED, CANCELED or STOPPED ones)")
        committed = session.execute(select(Checkpoint.id).where(Checkpoint.run_id == run_id, Checkpoint.committed)
                                    .limit(1)).first()
        if committed is None:  # the attempt would train the whole duration again from batch 0
            raise RUN_TRANSITIONS.refusal(run_id, current, RunStatus.QUEUED,
                                          f"run {run_id} has no committed checkpoint to continue from; fork it from "
                                          f"'scratch' with the longer max_duration instead")
        before = run.spec["max_duration"]
        problem = longer_duration_problem(before, max_duration)
        if problem is not None:
            raise LineageRefused([field_error("max_duration", ["body", "max_duration"], problem, str(max_duration))])
        spec = {**run.spec, "max_duration": str(max_duration)}
        try:
            run.spec = RunSpec.model_validate(spec).model_dump(mode="json")
        except ValidationError as exc:  # a rule that spans fields and no longer holds
            raise LineageRefused([field_error("max_duration", ["body", "max_duration"], one_line(exc.errors()),
                                              str(max_duration))]) from exc
        apply_run_status(session, run, RunStatus.QUEUED, error=None,
                         message=f"continued by {by}: max_duration {before} → {max_duration}")
        session.flush()
        return RunRecord.from_row(run)


def children(repo: Repository, parent_id: str, *, limit: int) -> list[RunRecord]:
    """The first ``limit`` runs forked from ``parent_id``, oldest first (all in the parent's project)."""
    with repo.db.read() as session:
        rows = session.execute(select(Run).where(Run.parent_id == parent_id)
                               .order_by(Run.created_at, Run.id).limit(limit)).scalars()
        return [RunRecord.from_row(row) for row in rows]
