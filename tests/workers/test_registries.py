"""Implementations list exactly the names in the catalog."""

from algorithms.registry import ALGORITHM_CLASSES
from api.algorithm_specs import ALGORITHM_SPECS
from api.catalog import ALGORITHMS, DATASETS, MODELS
from workers.data import DATASET_BUILDERS
from workers.models import MODEL_BUILDERS


def test_model_registry_matches_the_catalog():
    assert set(MODEL_BUILDERS) == set(MODELS)


def test_dataset_registry_matches_the_catalog():
    assert set(DATASET_BUILDERS) == set(DATASETS)


def test_algorithm_registry_matches_the_catalog_and_the_specs():
    assert set(ALGORITHM_CLASSES) == set(ALGORITHMS) == set(ALGORITHM_SPECS)


def test_surgery_flags_match_the_catalog():
    assert {n: c.changes_model for n, c in ALGORITHM_CLASSES.items()} == \
        {n: info.changes_model for n, info in ALGORITHMS.items()}
