"""Time conversions and the loop's Timestamp."""

import pytest

from workers.timekeeping import Time, TimeUnit, Timestamp, to_batches

EPOCH = dict(batches_per_epoch=22, samples_per_batch=64)


def test_epochs_convert_to_epochs_times_batches_per_epoch():
    assert to_batches("3ep", **EPOCH) == 66


def test_batches_stay_batches():
    assert to_batches(Time.parse("100ba"), **EPOCH) == 100


def test_samples_round_up_to_whole_batches():
    assert to_batches("64sp", **EPOCH) == 1
    assert to_batches("65sp", **EPOCH) == 2


def test_a_duration_fraction_is_a_share_of_max_batches():
    assert to_batches("0.5dur", **EPOCH, max_batches=66) == 33
    assert to_batches("0.1dur", **EPOCH, max_batches=66) == 7  # 6.6 rounds to 7


def test_a_duration_fraction_without_max_batches_raises():
    with pytest.raises(ValueError, match="fraction of max_duration"):
        to_batches("0.5dur", **EPOCH)


def test_tokens_without_a_token_count_raise():
    with pytest.raises(ValueError, match="tokens"):
        to_batches("1000tok", **EPOCH)


def test_comparing_times_in_different_units_raises():
    with pytest.raises(ValueError, match="units differ"):
        assert Time.parse("3ep") < Time.parse("100ba")


def test_timestamp_counts_batches_samples_and_epochs():
    ts = Timestamp()
    for _ in range(3):
        ts = ts.after_batch(samples=64)
    ts = ts.after_epoch().after_batch(samples=64)
    assert (ts.epoch, ts.batch, ts.batch_in_epoch, ts.sample) == (1, 4, 1, 256)
    assert ts.get(TimeUnit.EPOCH) == 1 and ts.get(TimeUnit.SAMPLE) == 256


def test_progress_advances_every_batch_and_stops_at_one():
    ts, seen = Timestamp(), []
    for _ in range(5):
        ts = ts.after_batch(samples=8)
        seen.append(ts.progress(max_batches=4))
    assert seen == [0.25, 0.5, 0.75, 1.0, 1.0]
