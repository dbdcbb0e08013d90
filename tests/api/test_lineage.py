"""The fork patch merge and the continue duration rule, as pure functions."""

from __future__ import annotations

from api.lineage import ForkRequest, PatchError, longer_duration_problem, merge_patch, unloadable_changes
from api.specs import RunSpec
from api.time import Time
from tests.workers.helpers_specs import tiny_spec


def test_a_patch_merges_objects_deletes_nulls_replaces_lists_and_replaces_a_renamed_object():
    base = {"optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9}, "algorithms": [{"name": "cutmix"}], "seed": 1,
            "scheduler": {"name": "cosine"}}
    patch = {"optimizer": {"lr": 0.05}, "algorithms": [], "scheduler": None, "max_duration": "4ep"}
    assert merge_patch(base, patch) == {"optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9}, "algorithms": [],
                                        "seed": 1, "max_duration": "4ep"}
    assert merge_patch(base, {"optimizer": {"name": "adamw", "lr": 1e-3}})["optimizer"] == {"name": "adamw",
                                                                                             "lr": 1e-3}
    assert base["optimizer"]["lr"] == 0.1  # the parent's spec is not changed


def test_a_list_of_named_objects_is_patched_by_name_as_a_sweep_names_them():
    base = {"algorithms": [{"name": "label_smoothing", "smoothing": 0.1}, {"name": "cutmix", "alpha": 1.0}],
            "loggers": []}
    assert merge_patch(base, {"algorithms": {"label_smoothing": {"smoothing": 0.2}}})["algorithms"] == [
        {"name": "label_smoothing", "smoothing": 0.2}, {"name": "cutmix", "alpha": 1.0}]
    assert merge_patch(base, {"algorithms": {"cutmix": None, "ema": {"half_life": "10ba"}}})["algorithms"] == [
        {"name": "label_smoothing", "smoothing": 0.1}, {"name": "ema", "half_life": "10ba"}]
    assert merge_patch(base, {"loggers": {"tensorboard": {}}})["loggers"] == [{"name": "tensorboard"}]
    assert merge_patch(base, {"algorithms": [{"name": "ema"}]})["algorithms"] == [{"name": "ema"}]  # a list replaces
    assert merge_patch(base, {"algorithms": {"1": {"alpha": 0.5}}})["algorithms"][1] == {"name": "cutmix", "alpha": 0.5}
    assert merge_patch({"tags": []}, {"tags": {"a": 1}}) == {"tags": {"a": 1}}  # only algorithms and loggers
    assert merge_patch(base, {"algorithms": {"0": {"name": "ema"}}})["algorithms"][0] == {"name": "ema"}  # renamed
    twice = {"loggers": [{"name": "mlflow", "experiment": "a"}, {"name": "mlflow", "experiment": "b"}]}
    assert merge_patch(twice, {"loggers": {"1": {"experiment": "c"}}})["loggers"] == [
        {"name": "mlflow", "experiment": "a"}, {"name": "mlflow", "experiment": "c"}]  # that position, not the name
    assert merge_patch(twice, {"loggers": {"1": None}})["loggers"] == [{"name": "mlflow", "experiment": "a"}]
    for key in ("7", "\u00b2"):  # past the end; a digit Python's isdigit takes but no position
        try:
            merged = merge_patch(base, {"algorithms": {key: {"alpha": 1}}})
        except PatchError as exc:
            assert key == "7" and exc.field == "algorithms.7" and "positions 0 to 1" in exc.msg
        else:
            assert key != "7" and merged["algorithms"][-1] == {"name": key, "alpha": 1}
    assert base["algorithms"][0]["smoothing"] == 0.1


def test_fork_set_reaches_one_algorithm_s_field_by_its_name():
    from cli.lineage import patch_from_assignments

    parent = tiny_spec(algorithms=[{"name": "label_smoothing", "smoothing": 0.1}]).model_dump(mode="json")
    patch = patch_from_assignments(["algorithms.label_smoothing.smoothing=0.2"])
    child = RunSpec.model_validate(merge_patch(parent, patch))
    assert [a.model_dump() for a in child.algorithms] == [{"name": "label_smoothing", "smoothing": 0.2}]


def test_only_shape_bearing_changes_make_a_checkpoint_unloadable():
    parent = tiny_spec(algorithms=[{"name": "channels_last"}]).model_dump(mode="json")

    def changed(patch):
        return [field for field, _ in unloadable_changes(parent, RunSpec.model_validate(merge_patch(parent, patch))
                                                         .model_dump(mode="json"))]

    assert changed({"optimizer": {"name": "adamw", "lr": 1e-3}, "max_duration": "9ba", "seed": 3}) == []
    assert changed({"algorithms": [{"name": "channels_last"}, {"name": "label_smoothing"}]}) == []
    assert changed({"algorithms": None}) == ["algorithms"]
    assert changed({"model": {"params": {"width": 16}}}) == ["model"]
    assert changed({"data": {"train": {"num_classes": 5}, "eval": {"num_classes": 5}}}) == ["data.train"]
    assert changed({"data": {"train": {"num_samples": 128, "noise": 0.5}}}) == []


def test_your_own_data_set_s_task_bears_shapes_and_its_seq_len_does_not():
    """A vocabulary is not a set of classes: a changed task makes the checkpoint unloadable; a
    language model may go on at another seq_len (no tensor depends on it)."""
    tokens = {"import": "my_project.data:tokens", "task": "language_model", "seq_len": 16, "num_classes": 12}
    parent = RunSpec.model_validate({
        "name": "lm", "model": {"import": "my_project.nets:lm"}, "data": {"train": tokens, "batch_size": 8},
        "optimizer": {"name": "adamw", "lr": 0.003}, "max_duration": "4ba"}).model_dump(mode="json")

    def changed(train):
        child = merge_patch(parent, {"data": {"train": train}})
        return [field for field, _ in unloadable_changes(parent, RunSpec.model_validate(child).model_dump(mode="json"))]

    assert changed({"seq_len": 32}) == []
    assert changed({"task": None, "seq_len": None}) == ["data.train"]  # classification


def test_continue_needs_a_longer_duration_in_the_same_unit():
    assert longer_duration_problem("3ep", Time.parse("5ep")) is None
    assert "not longer" in longer_duration_problem("3ep", Time.parse("3ep"))
    assert "units cannot be mixed" in longer_duration_problem("3ep", Time.parse("900ba"))


def test_the_fork_request_reads_from_as_latest_scratch_or_a_step():
    assert ForkRequest().from_ == "latest"
    assert ForkRequest.model_validate({"from": {"step": 7}}).from_.step == 7
    assert ForkRequest.model_validate({"from": "scratch"}).model_dump() == {"patch": {}, "from": "scratch"}


def test_a_parent_stored_before_a_surgery_field_existed_forks_and_init_alone_may_change():
    factorize = {"name": "factorize", "min_channels": 32, "min_features": 32}
    child = tiny_spec(algorithms=[{**factorize, "init": "random"}]).model_dump(mode="json")
    parent = {**child, "algorithms": [factorize]}  # stored before factorize had ``init``
    assert unloadable_changes(parent, child) == []
    svd = RunSpec.model_validate(merge_patch(child, {"algorithms": [{**factorize, "init": "svd"}]}))
    assert unloadable_changes(parent, svd.model_dump(mode="json")) == []  # a resume under another init
    ranks = RunSpec.model_validate(merge_patch(child, {"algorithms": [{**factorize, "latent_features": 8}]}))
    assert [f for f, _ in unloadable_changes(parent, ranks.model_dump(mode="json"))] == ["algorithms"]


def test_the_spec_s_own_name_is_a_field_and_a_renamed_object_is_reported():
    from api.lineage import replaced_object_hint, replaced_objects

    base = {"name": "parent", "optimizer": {"name": "sgd", "lr": 0.1}, "data": {"train": {"name": "digits"}}}
    assert merge_patch(base, {"name": "child"}) == {**base, "name": "child"}  # not a whole new spec
    patch = {"name": "child", "optimizer": {"name": "adamw"}, "data": {"train": {"name": "synthetic"}}}
    replaced = replaced_objects(base, patch)
    assert replaced == [("optimizer", "sgd", "adamw"), ("data.train", "digits", "synthetic")]
    assert replaced_objects(base, {"optimizer": {"lr": 0.2}, "name": "child"}) == []
    assert replaced_object_hint("optimizer.lr", replaced) == ("optimizer was replaced because its name changed (sgd "
                                                              "to adamw): give its other fields too, e.g. optimizer.lr")
    assert replaced_object_hint("seed", replaced) is None
