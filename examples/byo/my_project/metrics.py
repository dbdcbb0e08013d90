"""Evaluation metrics of your own (``eval_metrics: [{import: "my_project.metrics:pr_auc"}]``).

Tessera calls each on the workers with the whole eval split: ``outputs``, the float32 logits
``(N, C)``; ``targets``, the int64 labels ``(N,)``. A number is reported as ``eval/<function
name>`` (or the spec's ``name``), a ``{name: number}`` dict as ``eval/<name>`` each.
"""

import math

import numpy as np
from sklearn.metrics import average_precision_score, fbeta_score


def pr_auc(outputs, targets):
    """Area under the precision-recall curve of each class against the rest, averaged over the
    classes that occur in the eval split (scikit-learn's average precision, macro): for any
    number of classes. A class with no example has no curve; it is left out, not scored 0."""
    scores = outputs.softmax(dim=1).numpy()
    labels = np.eye(scores.shape[1])[targets.numpy()]  # one column per class
    present = labels.sum(axis=0) > 0
    if not present.any():
        return math.nan
    return average_precision_score(labels[:, present], scores[:, present], average="macro")


def fbeta(outputs, targets, beta=1.0):
    """F-beta of the predicted classes, macro-averaged: ``params: {beta: 2}`` weighs recall more."""
    return fbeta_score(targets.numpy(), outputs.argmax(dim=1).numpy(), beta=beta, average="macro", zero_division=0)


def errors_per_class(outputs, targets):
    """How many of each class's examples were misclassified: a dict, one metric per class."""
    wrong = outputs.argmax(dim=1) != targets
    return {f"errors_{c}": int(wrong[targets == c].sum()) for c in range(outputs.shape[1])}
