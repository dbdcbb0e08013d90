"""Soft cross-entropy, optimizers and learning-rate schedules."""

import math

import pytest
import torch
import torch.nn.functional as F

from api.specs import AdamWSpec, SchedulerSpec, SGDSpec
from workers.loss import soft_cross_entropy
from workers.optim import build_optimizer, build_scheduler, lr_multiplier


def test_index_targets_and_their_one_hot_rows_give_the_same_loss():
    logits, targets = torch.randn(16, 5), torch.randint(5, (16,))
    dense = F.one_hot(targets, 5).float()
    assert torch.allclose(soft_cross_entropy(logits, targets), soft_cross_entropy(logits, dense))
    assert torch.allclose(soft_cross_entropy(logits, targets), F.cross_entropy(logits, targets))


def test_dense_targets_weight_each_class_log_probability():
    logits = torch.randn(4, 3)
    targets = torch.tensor([[0.5, 0.5, 0.0]] * 4)
    expected = -(0.5 * F.log_softmax(logits, -1)[:, :2].sum(-1)).mean()
    assert torch.allclose(soft_cross_entropy(logits, targets), expected)


def test_loss_is_float32_under_bf16_autocast():
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = torch.nn.Linear(4, 3)(torch.randn(8, 4))
        loss = soft_cross_entropy(logits, torch.randint(3, (8,)))
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32


def test_dense_targets_of_the_wrong_shape_are_refused():
    with pytest.raises(ValueError, match="do not match"):
        soft_cross_entropy(torch.randn(4, 3), torch.rand(4, 5))


@pytest.mark.parametrize("spec, cls", [
    (SGDSpec(name="sgd", lr=0.1, momentum=0.9, nesterov=True), torch.optim.SGD),
    (AdamWSpec(name="adam", lr=1e-3), torch.optim.Adam),
    (AdamWSpec(name="adamw", lr=1e-3, weight_decay=0.05), torch.optim.AdamW),
])
def test_optimizers_are_built_with_the_spec_hyperparameters(spec, cls):
    optimizer = build_optimizer(torch.nn.Linear(2, 2).parameters(), spec)
    assert type(optimizer) is cls and optimizer.defaults["lr"] == spec.lr


def test_warmup_rises_linearly_then_cosine_decays_to_alpha_f():
    f = lambda step: lr_multiplier(step, schedule="cosine", warmup_batches=10, max_batches=110, alpha_f=0.1)  # noqa
    assert [f(s) for s in (0, 5, 10)] == [0.0, 0.5, 1.0]
    assert math.isclose(f(60), 0.55) and math.isclose(f(110), 0.1)


def test_linear_and_constant_schedules():
    assert math.isclose(lr_multiplier(50, schedule="linear", warmup_batches=0, max_batches=100, alpha_f=0.0), 0.5)
    assert lr_multiplier(99, schedule="constant", warmup_batches=0, max_batches=100, alpha_f=0.0) == 1.0


def test_scheduler_steps_the_optimizer_lr_per_batch():
    optimizer = build_optimizer(torch.nn.Linear(2, 2).parameters(), SGDSpec(name="sgd", lr=1.0))
    scheduler = build_scheduler(optimizer, SchedulerSpec(name="linear"), warmup_batches=2, max_batches=6)
    lrs = []
    for _ in range(6):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs == pytest.approx([0.0, 0.5, 1.0, 0.75, 0.5, 0.25])


def test_lean_scheduler_matches_torch_lambda_lr_bit_for_bit_and_shares_its_checkpoints():
    from torch.optim.lr_scheduler import LambdaLR

    from workers.optim import BatchLambdaLR

    def multiplier(step):
        return lr_multiplier(step, schedule="cosine", warmup_batches=3, max_batches=20, alpha_f=0.1)

    def two_groups():
        model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
        return torch.optim.SGD([{"params": model[0].parameters()}, {"params": model[1].parameters(), "lr": 0.3}],
                               lr=0.7)

    ours_optimizer, torch_optimizer = two_groups(), two_groups()
    ours, theirs = BatchLambdaLR(ours_optimizer, multiplier), LambdaLR(torch_optimizer, multiplier)
    for _ in range(25):  # past max_batches: the schedule holds at alpha_f
        assert [g["lr"] for g in ours_optimizer.param_groups] == [g["lr"] for g in torch_optimizer.param_groups]
        ours_optimizer.step(), torch_optimizer.step()
        ours.step(), theirs.step()
    assert ours.get_last_lr() == theirs.get_last_lr()
    # torch's step leaves a flag of its get_lr context in the instance; nothing else differs.
    theirs_state = {k: v for k, v in theirs.state_dict().items() if k != "_get_lr_called_within_step"}
    assert ours.state_dict() == theirs_state

    # A checkpoint of torch's scheduler resumes in ours (and the other way): same next rates.
    resumed_optimizer = two_groups()
    resumed = BatchLambdaLR(resumed_optimizer, multiplier)
    resumed.load_state_dict(theirs.state_dict())
    resumed_optimizer.load_state_dict(torch_optimizer.state_dict())
    resumed.step(), theirs.step()
    assert [g["lr"] for g in resumed_optimizer.param_groups] == [g["lr"] for g in torch_optimizer.param_groups]
    with pytest.raises(TypeError, match="takes no epoch"):
        ours.step(3)


def test_sequence_logits_count_every_token_as_one_example():
    from workers.loss import eval_metrics, eval_sums

    logits, targets = torch.randn(2, 5, 7), torch.randint(0, 7, (2, 5))
    flat = torch.nn.functional.cross_entropy(logits.reshape(10, 7), targets.reshape(10))
    assert torch.allclose(soft_cross_entropy(logits, targets), flat)
    one_hot = torch.nn.functional.one_hot(targets, 7).float()
    assert torch.allclose(soft_cross_entropy(logits, one_hot), flat)
    loss_sum, correct, count = eval_sums(logits, targets).tolist()
    assert count == 10 and correct == (logits.argmax(-1) == targets).sum().item()
    metrics = eval_metrics(loss_sum, correct, count, domain="text")
    assert metrics["eval/perplexity"] == pytest.approx(math.exp(flat.item()), rel=1e-5)
    assert "eval/perplexity" not in eval_metrics(loss_sum, correct, count, domain="vision")


def test_an_ignored_target_counts_for_nothing_in_the_loss_its_smoothed_form_and_the_eval_sums():
    from algorithms.label_smoothing import smooth_labels
    from algorithms.selective_backprop import per_example_loss
    from workers.loss import eval_sums

    logits, targets = torch.randn(2, 5, 7), torch.randint(0, 7, (2, 5))
    targets[0, 3:], targets[1, 4] = -100, -100  # padding: 3 of the 10 positions
    kept = targets != -100
    per_token = F.cross_entropy(logits[kept], targets[kept], reduction="none")
    assert torch.allclose(soft_cross_entropy(logits, targets), per_token.mean())
    # Smoothed: an ignored position's row is all zeros and the mean is over the 7 kept rows.
    smoothed = smooth_labels(logits, targets, 0.2, class_dim=-1)
    assert smoothed[~kept].abs().sum() == 0 and torch.allclose(smoothed[kept].sum(-1), torch.ones(7))
    expected = F.cross_entropy(logits[kept], targets[kept], label_smoothing=0.2)
    assert torch.allclose(soft_cross_entropy(logits, smoothed), expected)
    # Nothing kept (seq_length_warmup may cut a left-padded batch to padding): 0, not NaN.
    nothing = torch.full_like(targets, -100)
    assert soft_cross_entropy(logits, nothing) == 0
    assert soft_cross_entropy(logits, smooth_labels(logits, nothing, 0.2, class_dim=-1)) == 0
    # Selective backprop scores each sequence by its kept tokens' mean.
    scores = per_example_loss(logits, targets)
    assert torch.allclose(scores, torch.stack([per_token[:3].mean(), per_token[3:].mean()]))
    smoothed_scores = per_example_loss(logits, smoothed)  # dense rows: the zero rows are left out
    smoothed_tokens = -(smoothed * F.log_softmax(logits, -1)).sum(-1)
    assert torch.allclose(smoothed_scores, torch.stack([smoothed_tokens[0, :3].mean(), smoothed_tokens[1, :4].mean()]))
    loss_sum, correct, count = eval_sums(logits, targets).tolist()
    assert count == 7 and loss_sum == pytest.approx(per_token.sum().item(), rel=1e-5)
    assert correct == (logits.argmax(-1) == targets)[kept].sum().item()
