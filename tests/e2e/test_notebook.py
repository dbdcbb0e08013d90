"""examples/sweep.ipynb runs top to bottom against a live service: a service-driven sweep and a
Ray Tune sweep driven from the notebook's own process, both ending COMPLETED with every trial a
run the runs API lists under its sweep.

Real components: the service (PostgreSQL, the session's Ray head), a Jupyter kernel of this
interpreter, Ray Tune in that kernel joined to the same head. A few minutes on 2 cores.
"""

from __future__ import annotations

import json
import uuid

import nbformat
import pytest
from nbclient import NotebookClient

from api.views import RunStatus, SweepStatus
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.integration

NOTEBOOK = REPO_ROOT / "examples" / "sweep.ipynb"
SETS = [[], ["label_smoothing"]]


def test_the_notebook_is_committed_without_outputs():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code and all(not cell.outputs and cell.execution_count is None for cell in code)


@pytest.mark.timeout(900)  # two sweeps of Ray Train trials, each paying tens of seconds of start-up
def test_sweep_notebook_runs_a_service_sweep_and_an_in_process_tune_sweep_to_completion(
        service, ray_head, monkeypatch, tmp_path):
    name = f"nb-{uuid.uuid4().hex[:8]}"
    # The kernel inherits this environment: the notebook reads its sizes and addresses from it.
    monkeypatch.setenv("TESSERA_URL", service.url)
    monkeypatch.setenv("RAY_ADDRESS", ray_head.address)  # the Tune part joins the session's head
    monkeypatch.setenv("TESSERA_EXAMPLE_NAME", name)
    monkeypatch.setenv("TESSERA_EXAMPLE_EPOCHS", "1")
    monkeypatch.setenv("TESSERA_EXAMPLE_IMAGE_SIZE", "8")
    monkeypatch.setenv("TESSERA_EXAMPLE_SETS", json.dumps(SETS))
    monkeypatch.setenv("TESSERA_EXAMPLE_TIMEOUT_S", "420")
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))
    examples_before = sorted(p.name for p in NOTEBOOK.parent.iterdir())

    notebook = nbformat.read(NOTEBOOK, as_version=4)
    # The native python3 kernel runs this interpreter (jupyter_client swaps in sys.executable);
    # it starts in a temp dir, so anything the notebook wrote beside itself would show below.
    try:
        NotebookClient(notebook, kernel_name="python3", timeout=540, startup_timeout=120,
                       resources={"metadata": {"path": str(tmp_path)}}).execute()  # raises on a cell error
    finally:
        nbformat.write(notebook, tmp_path / "executed.ipynb")  # what each cell printed, for a failure

    assert any(o.get("output_type") == "display_data" and "image/png" in o.get("data", {})
               for c in notebook.cells if c.cell_type == "code" for o in c.outputs), "no Pareto plot shown"
    assert sorted(p.name for p in NOTEBOOK.parent.iterdir()) == examples_before

    client = service.client()
    sweeps = {s.name: s for s in client.list_sweeps(limit=50).data if s.name.startswith(name)}
    assert set(sweeps) == {f"{name}-service", f"{name}-tune"}
    assert sweeps[f"{name}-service"].driver == "service" and sweeps[f"{name}-tune"].driver == "external"
    for sweep in sweeps.values():
        view = client.get_sweep(sweep.id)
        assert view.status is SweepStatus.COMPLETED, (view.name, view.error)
        assert sorted(t.algorithms for t in view.trials) == sorted(SETS)
        assert all(t.status is RunStatus.COMPLETED and t.metric is not None for t in view.trials), view.trials
        assert view.best_run_id in {t.run_id for t in view.trials} and view.pareto
        runs = client.list_runs(sweep_id=view.id, limit=100).data
        assert sorted(r.id for r in runs) == sorted(t.run_id for t in view.trials)
        assert all(r.sweep_id == view.id and r.trial_id and r.status is RunStatus.COMPLETED for r in runs)
