"""JSON columns read back exactly as they were written, on both databases (``service.db.engine.json_loads``:
orjson where it reads a value as ``json.loads`` does, ``json.loads`` elsewhere)."""

from __future__ import annotations

import json
import random

import pytest

from api.specs import RunSpec
from service.db.engine import json_loads

# What orjson refuses or could read differently, and what it reads alike.
TRICKY = ['{"big": 1180591620717411303424}', '[-9223372036854775809, 18446744073709551616]', '[NaN, Infinity, -Infinity]',
          '"\\ud800"', '[1e400, -1e400]', '[0.1000000000000000055511151231257827]', '{"a": 1, "a": 2}',
          '{"name": "r\\u00e9sum\\u00e9 \\u6f22\\u5b57", "lr": 0.1, "n": null, "ok": true, "tags": []}',
          '[123456789012345678, 0.123456789012345678, 5e-324, 1.7976931348623157e308]']


@pytest.mark.parametrize("text", TRICKY)
def test_a_json_column_reads_as_json_loads_reads_it(text):
    for given in (text, text.encode()):  # SQLite hands a str, psycopg bytes
        assert repr(json_loads(given)) == repr(json.loads(text))


def test_numbers_of_every_length_read_as_json_loads_reads_them():
    rng = random.Random(0)
    for digits in range(1, 26):
        for _ in range(200):
            mantissa = "".join(rng.choice("0123456789") for _ in range(digits)).lstrip("0") or "0"
            point = rng.randint(0, len(mantissa))
            for text in (mantissa, f"-{mantissa[:point] or '0'}.{mantissa[point:] or '0'}e{rng.randint(-330, 310)}"):
                assert repr(json_loads(f"[{text}]")) == repr(json.loads(f"[{text}]")), text


def test_a_spec_with_an_integer_beyond_64_bits_reads_back_exactly(repo, example_body):
    """A user's model parameters are free-form: a 70-bit integer stays an integer, not a float."""
    example_body["model"] = {"import": "my_models:build", "params": {"big": 2**70, "small": -(2**63) - 1}}
    run = repo.create_run(RunSpec.model_validate(example_body))
    params = repo.get_run(run.id).spec["model"]["params"]
    assert params == {"big": 2**70, "small": -(2**63) - 1}
    assert type(params["big"]) is int and type(params["small"]) is int
