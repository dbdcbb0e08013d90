"""Ray submission ids of attempts: made by ``attempt_job_id``, read back by ``parse_attempt_job_id``
only when the id is exactly one it would make (the log archiver acts on what it parses)."""

import pytest

from service.attempt_store import attempt_job_id, parse_attempt_job_id


@pytest.mark.parametrize("record_id, attempt", [("f116b0c9839e", 1), ("a-attempt-3", 2), ("x", 12)])
def test_an_id_it_makes_reads_back(record_id, attempt):
    assert parse_attempt_job_id("run", attempt_job_id("run", record_id, attempt)) == (record_id, attempt)


@pytest.mark.parametrize("job_id", ["run-x-attempt-01", "run-x-attempt-\u0661", "run-x-attempt-\u00b2",
                                    "run-x-attempt-", "run--attempt-1", "sweep-x-attempt-1",
                                    "export-x-step-3-abc", "run-x-attempt-0", "runx-attempt-1"])
def test_any_other_id_is_none(job_id):
    assert parse_attempt_job_id("run", job_id) is None
