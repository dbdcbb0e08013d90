"""The spec's ``eval_metrics`` (``workers.eval_metrics``): the built-ins agree with
scikit-learn's, across ranks they equal the metric of the whole eval split, and your own
callable's results are reported as ``eval/<name>``, its failures naming its field."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn import metrics as sk

from api.eval_metric_specs import BUILTIN_EVAL_METRICS
from api.specs import RunSpec
from tests.workers.byo_helpers import importable_user_package
from tests.workers.dist_helpers import spawn_ranks
from tests.workers.helpers_specs import digits_spec, tiny_spec
from workers.eval_metrics import EvalMetrics, auroc, binary_auroc
from workers.models.code_cache import UserCodeError
from workers.reporter import MemorySink
from workers.trainer import Trainer

BUILTINS = list(BUILTIN_EVAL_METRICS)

METRICS = '''
import numpy as np
import torch

CALLS = []


def label_mean(outputs, targets):
    CALLS.append((tuple(outputs.shape), outputs.dtype, tuple(targets.shape), targets.dtype))
    return targets.float().mean()


def several(outputs, targets, scale=1.0):
    return {"scaled_count": scale * len(targets), "numpy_value": np.float32(0.5)}


def broken(outputs, targets):
    raise RuntimeError("no AUC today")


def badly_named(outputs, targets):
    return {"Bad Name": 1.0}


def a_string(outputs, targets):
    return "0.9"


def clashing(outputs, targets):
    return {"accuracy": 1.0}


def one_argument(outputs):
    return 1.0


def zeroing(outputs, targets):
    outputs.zero_()
    targets.zero_()
    return 0.0
'''


@pytest.fixture
def user_package(tmp_path, monkeypatch):
    """``my_project`` (``tests.workers.byo_helpers``, plus ``metrics.py``) importable, forgotten after."""
    with importable_user_package(tmp_path / "src", monkeypatch) as package:
        (package / "metrics.py").write_text(METRICS)
        yield


def sample(n: int, classes: int, seed: int = 0, rounded: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits that lean towards the label (a model better than chance), rounded so that scores
    tie, and labels of which the last class never occurs (of more than two)."""
    generator = torch.Generator().manual_seed(seed)
    targets = torch.randint(0, classes - 1 if classes > 2 else 2, (n,), generator=generator)
    logits = torch.randn(n, classes, generator=generator)
    logits[torch.arange(n), targets] += 1.0
    return ((logits * 2).round() / 2 if rounded else logits), targets


def computed(names, logits, targets, *, chunks: int = 3, classes: int | None = None) -> dict[str, float]:
    metrics = EvalMetrics(names, num_classes=classes or logits.shape[-1], device=torch.device("cpu"))
    for part_logits, part_targets in zip(logits.chunk(chunks), targets.chunk(chunks)):
        if len(part_targets):  # a rank with no eval examples has no batch to update with
            metrics.update(part_logits, part_targets)
    return metrics.compute()


@pytest.mark.filterwarnings("ignore:y_pred contains classes not in y_true")  # the unseen class: on purpose
@pytest.mark.parametrize("classes", [2, 8])
def test_the_built_ins_agree_with_scikit_learn(classes):
    logits, targets = sample(300, classes)
    got = computed(BUILTINS, logits, targets)
    unrounded, _ = sample(300, classes, rounded=False)  # top-5 without ties, which scikit-learn breaks by index
    got["eval/top5_accuracy"] = computed(["top5_accuracy"], unrounded, targets)["eval/top5_accuracy"]
    y, predicted = targets.numpy(), logits.argmax(dim=1).numpy()
    scores = torch.softmax(logits.double(), dim=1).numpy()
    labels = np.arange(classes)
    expected = {
        "eval/top5_accuracy": (1.0 if classes == 2 else  # the top 5 of 2 classes hold every label
                               sk.top_k_accuracy_score(y, unrounded.numpy(), k=5, labels=labels)),
        "eval/precision_macro": sk.precision_score(y, predicted, average="macro", zero_division=0),
        "eval/recall_macro": sk.recall_score(y, predicted, average="macro", zero_division=0),
        "eval/f1_macro": sk.f1_score(y, predicted, average="macro", zero_division=0),
        "eval/balanced_accuracy": sk.balanced_accuracy_score(y, predicted),
        # Two classes: class 1's score. More: one-vs-rest over the classes that occur (the last never does).
        "eval/auroc": (sk.roc_auc_score(y, scores[:, 1]) if classes == 2 else
                       np.mean([sk.roc_auc_score(y == c, scores[:, c]) for c in range(classes - 1)])),
    }
    assert got == pytest.approx(expected, abs=1e-12)  # every built-in, each reporting its key


def test_auroc_counts_a_tie_as_one_half_and_is_nan_without_both_kinds_of_example():
    assert binary_auroc(torch.tensor([0.5, 0.5]), torch.tensor([True, False])) == 0.5
    assert binary_auroc(torch.tensor([0.1, 0.9]), torch.tensor([False, True])) == 1.0
    assert np.isnan(binary_auroc(torch.tensor([0.1, 0.9]), torch.tensor([True, True])))
    assert np.isnan(auroc(torch.zeros(4, 3), torch.zeros(4, dtype=torch.long)))


def test_text_top5_counts_kept_tokens_only():
    logits = torch.arange(8.0).expand(1, 4, 8).clone()  # tokens 3 to 7 are the top 5 at every position
    logits[0, 3, 2] = 3.0  # at the last position token 2 ties with token 3, the 5th
    targets = torch.tensor([[7, 1, -100, 2]])  # a hit, a miss, an ignored position, a tie for 5th: a hit
    assert computed(["top5_accuracy"], logits, targets, chunks=1) == {"eval/top5_accuracy": 2 / 3}


SHARES = (slice(0, 200), slice(200, None), slice(0, 0))  # of different sizes, the last rank's empty


def _ranks_compute(rank: int, world_size: int, init_file: str, result_path: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        logits, targets = sample(301, 4, seed=3)
        results = computed(BUILTINS, logits[SHARES[rank]], targets[SHARES[rank]])
        # Then a model 5 logits wide on data of 4 classes: the ranks with batches see it, the one
        # without none does not; all three must raise, none may wait in a collective for the others.
        try:
            computed(["f1_macro"], torch.zeros(len(targets), 5)[SHARES[rank]], targets[SHARES[rank]], classes=4)
            wrong_width = "nothing raised"
        except UserCodeError as exc:
            wrong_width = str(exc)
        Path(f"{result_path}.{rank}").write_text(json.dumps({"results": results, "wrong_width": wrong_width}))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_across_three_ranks_one_without_examples_every_metric_is_that_of_the_whole_eval_split(tmp_path):
    tag = os.urandom(4).hex()
    result = tmp_path / f"result-{tag}"
    spawn_ranks(_ranks_compute, [(rank, 3, str(tmp_path / f"pg-{tag}"), str(result)) for rank in range(3)],
                timeout_s=120)
    logits, targets = sample(301, 4, seed=3)
    whole = computed(BUILTINS, logits, targets)
    for rank in range(3):
        found = json.loads(Path(f"{result}.{rank}").read_text())
        assert found["results"] == pytest.approx(whole, abs=1e-12)
        assert found["wrong_width"] == ("eval_metrics: the model returned logits of another width than the data's 4 "
                                        "classes in 6 eval batch(es); these need one logit per class: f1_macro")


def test_a_run_reports_the_listed_metrics_at_every_evaluation_with_your_own_beside_them(user_package):
    from my_project import metrics

    spec = digits_spec(max_duration="2ep", eval_metrics=[
        "f1_macro", "auroc", {"import": "my_project.metrics:zeroing"}, {"import": "my_project.metrics:label_mean"},
        {"import": "my_project.metrics:several", "params": {"scale": 2.0}}])
    sink = MemorySink()
    final = Trainer(spec, sink=sink).fit()
    for key in ("eval/f1_macro", "eval/auroc", "eval/label_mean", "eval/scaled_count", "eval/numpy_value"):
        assert [step for step, _ in sink.values(key)] == [22, 44], key
    assert final["eval/auroc"] > 0.9 and final["eval/f1_macro"] > 0.5  # a trained model, 10 classes
    # Your callable saw the whole test split (360 digits) as float32 logits and int64 labels, its own copy
    # (zeroing, called before it, changed only its own).
    assert metrics.CALLS == [((360, 10), torch.float32, (360,), torch.int64)] * 2
    from workers.data.digits import load_digits
    assert final["eval/label_mean"] == pytest.approx(load_digits("test", 16)[1].float().mean().item())
    assert final["eval/scaled_count"] == 720.0 and final["eval/numpy_value"] == 0.5


@pytest.mark.parametrize("function, words", [
    ("broken", ["eval_metrics[0].import 'my_project.metrics:broken'", "RuntimeError: no AUC today",
                "logits (32, 4) and labels (32,)"]),
    ("badly_named", ["returned a metric named 'Bad Name'", "lowercase letters"]),
    ("a_string", ["returned '0.9' for eval/a_string", "a metric is a number"]),
    ("clashing", ["returned a metric named 'accuracy'; eval/accuracy is Tessera's own"]),
])
def test_a_callable_that_fails_or_returns_something_else_fails_the_run_naming_its_field(user_package, function,
                                                                                        words):
    spec = tiny_spec(eval_metrics=[{"import": f"my_project.metrics:{function}"}])
    with pytest.raises(UserCodeError) as raised:
        Trainer(spec).fit()
    for word in words:
        assert word in str(raised.value)


@pytest.mark.parametrize("metric, words", [
    ({"import": "my_project.metrics:label_maen"}, r"eval_metrics\[0\]\.import .*'label_maen' does not exist.*did "
                                                  r"you mean 'label_mean'"),
    ({"import": "my_project.metrics:one_argument"}, r"eval_metrics\[0\]\.import 'my_project.metrics:one_argument': "
                                                    r"a metric is called as fn\(outputs, targets\), which "
                                                    r"one_argument\(outputs\) does not take"),
    ({"import": "my_project.metrics:several", "params": {"scael": 2}}, r"fn\(outputs, targets, scael=2\), which "
                                                                      r"several\(outputs, targets, scale=1.0\) does "
                                                                      r"not take: got an unexpected keyword"),
])
def test_a_metric_that_cannot_be_called_fails_when_the_trainer_is_built_before_any_step(user_package, metric, words):
    with pytest.raises(UserCodeError, match=words):
        Trainer(tiny_spec(eval_metrics=[metric]))


def test_a_named_metric_reports_a_number_under_its_name_and_a_dict_after_it(user_package):
    sink = MemorySink()
    Trainer(tiny_spec(eval_metrics=[{"import": "my_project.metrics:label_mean", "name": "mean_a"},
                                    {"import": "my_project.metrics:several", "name": "b"}]), sink=sink).fit()
    assert {key for _, key, _ in sink.points if key.startswith("eval/")} == {
        "eval/loss", "eval/accuracy", "eval/mean_a", "eval/b_scaled_count", "eval/b_numpy_value"}


def test_a_spec_without_eval_metrics_stores_as_before():
    assert "eval_metrics" not in tiny_spec().model_dump(mode="json")
    assert RunSpec.model_validate(tiny_spec(eval_metrics=["auroc"]).model_dump(mode="json")).eval_metrics == ["auroc"]


def test_top5_takes_wider_logits_a_padded_vocabulary_but_fewer_than_the_classes_fail_when_computed():
    targets = torch.tensor([7, 1])
    wider = torch.arange(10.0).expand(2, 10)  # tokens 5 to 9 on top: label 7 a hit, 1 a miss
    assert computed(["top5_accuracy"], wider, targets, chunks=1, classes=8) == {"eval/top5_accuracy": 0.5}
    with pytest.raises(UserCodeError, match=r"these need one logit per class: f1_macro$"):  # top-5 took them
        computed(["top5_accuracy", "f1_macro"], wider, targets, chunks=1, classes=8)
    with pytest.raises(UserCodeError, match=r"logits of another width than the data's 8 classes in 1 eval batch\(es\); "
                                            r"these need one logit per class: top5_accuracy"):
        computed(["top5_accuracy"], torch.zeros(2, 4), targets, chunks=1, classes=8)  # label 7 is past the logits
    with pytest.raises(UserCodeError, match=r"these need one logit per class: top5_accuracy, f1_macro$"):
        computed(["top5_accuracy", "f1_macro"], torch.zeros(2, 4), targets, chunks=1, classes=8)
