"""The events of the training loop, at which algorithms and callbacks run.

``Event`` lives here rather than in ``workers`` because algorithms sit below the runtime in the
import order (``algorithms`` may import only torch, torchvision and ``api``) and must name the
events they act on; ``workers.events`` re-exports it for the runtime.
"""

from __future__ import annotations

import enum


class Event(str, enum.Enum):
    """Where in the loop an algorithm or callback runs. The loop, in pseudo-code::

        INIT                           # model built, not yet wrapped: surgery happens here
        <wrap model (DDP), build optimizer and scheduler>
        FIT_START
        while not done:
            EPOCH_START
            for batch in train_loader:
                AFTER_DATALOADER       # full per-worker batch in state.inputs/targets
                for microbatch in split(batch):
                    BEFORE_FORWARD
                    outputs = model(inputs)
                    AFTER_FORWARD
                    BEFORE_LOSS
                    loss = loss_fn(outputs, targets)
                    AFTER_LOSS
                    BEFORE_BACKWARD
                    loss.backward()
                    AFTER_BACKWARD
                <gradients synced across ranks; the GradScaler unscales them>
                AFTER_TRAIN_BATCH      # whole batch's true gradients: clipping happens here;
                                       # state.recompute_gradients() reruns the batch (SAM)
                optimizer.step(); scheduler.step()
                BATCH_END
                if eval is due:
                    EVAL_START
                    <evaluate>
                    EVAL_END
                if done: break
            EPOCH_END
        FIT_END

    Ordering rule (see ``workers.engine.Engine``): an event that *closes* a bracket -- the
    ``AFTER_*`` events and the ``*_END`` events, i.e. those with ``is_after`` -- runs algorithms
    in reverse list order, so the last algorithm to change something before is the first to
    undo it after (a stack). Every other event runs them in list order.
    """

    INIT = "init"
    FIT_START = "fit_start"
    EPOCH_START = "epoch_start"
    AFTER_DATALOADER = "after_dataloader"
    BEFORE_FORWARD = "before_forward"
    AFTER_FORWARD = "after_forward"
    BEFORE_LOSS = "before_loss"
    AFTER_LOSS = "after_loss"
    BEFORE_BACKWARD = "before_backward"
    AFTER_BACKWARD = "after_backward"
    AFTER_TRAIN_BATCH = "after_train_batch"
    BATCH_END = "batch_end"
    EPOCH_END = "epoch_end"
    EVAL_START = "eval_start"
    EVAL_END = "eval_end"
    FIT_END = "fit_end"

    @property
    def is_after(self) -> bool:
        """True for ``AFTER_*`` and ``*_END`` events: they run algorithms in reverse order."""
        return self.value.startswith("after_") or self.value.endswith("_end")

    @property
    def is_before(self) -> bool:
        """True for every event that runs algorithms in list order (``not is_after``)."""
        return not self.is_after
