"""Evaluation metrics of your own (``eval_metrics: [{import: "my_project.metrics:pr_auc"}]``).

Tessera calls each on the workers with the whole eval split: ``outputs``, the float32 logits
``(N, C)``; ``targets``, the int64 labels ``(N,)``. A number is reported as ``eval/<function
name>``, a ``{name: number}`` dict as ``eval/<name>`` each.
"""

import numpy as np
from sklearn.metrics import average_precision_score


def pr_auc(outputs, targets):
    """Area under the precision-recall curve of each class against the rest, averaged over the
    classes (scikit-learn's average precision, macro): for any number of classes."""
    scores = outputs.softmax(dim=1).numpy()
    labels = np.eye(scores.shape[1])[targets.numpy()]  # one column per class
    return average_precision_score(labels, scores, average="macro")


def errors_per_class(outputs, targets):
    """How many of each class's examples were misclassified: a dict, one metric per class."""
    wrong = outputs.argmax(dim=1) != targets
    return {f"errors_{c}": int(wrong[targets == c].sum()) for c in range(outputs.shape[1])}
