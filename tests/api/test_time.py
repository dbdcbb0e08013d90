import pytest

from api.time import Time, TimeUnit


@pytest.mark.parametrize(
    ("text", "value", "unit"),
    [("3ep", 3, TimeUnit.EPOCH), ("100ba", 100, TimeUnit.BATCH), ("2048sp", 2048, TimeUnit.SAMPLE),
     ("512tok", 512, TimeUnit.TOKEN), ("0.5dur", 0.5, TimeUnit.DURATION), ("1dur", 1.0, TimeUnit.DURATION),
     (" 7ep ", 7, TimeUnit.EPOCH), (".25dur", 0.25, TimeUnit.DURATION)],
)
def test_time_strings_parse_to_value_and_unit(text, value, unit):
    time = Time.parse(text)
    assert (time.value, time.unit) == (value, unit)


@pytest.mark.parametrize("text", ["3 epochs", "ep", "3", "-1ep", "1.5ep", "2dur", "3EP", "", "1e3ba"])
def test_malformed_time_strings_are_refused_with_the_allowed_forms(text):
    with pytest.raises(ValueError) as info:
        Time.parse(text)
    message = str(info.value)
    assert repr(text) in message
    assert "dur" in message


def test_time_round_trips_through_its_string_form():
    for text in ["3ep", "100ba", "0.1dur", "64sp", "9tok"]:
        assert str(Time.parse(text)) == text


def test_comparing_times_of_different_units_fails_loudly():
    with pytest.raises(ValueError, match="units differ"):
        Time.parse("3ep") < Time.parse("100ba")
    assert Time.parse("3ep") < Time.parse("4ep")
    assert Time.parse("3ep") + Time.parse("2ep") == Time.parse("5ep")


def test_a_field_that_takes_no_fraction_does_not_offer_one():
    from pydantic import TypeAdapter, ValidationError

    from api.time import DurationTime, IntervalTime

    with pytest.raises(ValidationError) as duration:
        TypeAdapter(DurationTime).validate_python("3epochs")
    assert str(duration.value.errors()[0]["msg"]).endswith("expected an integer followed by ep, ba, sp or tok "
                                                             "(e.g. '3ep', '100ba')")
    with pytest.raises(ValidationError) as interval:
        TypeAdapter(IntervalTime).validate_python("3epochs")
    assert "or a fraction in [0, 1] followed by dur" in str(interval.value.errors()[0]["msg"])
    from api.algorithm_specs import BatchOrEpochTime  # a method's field: only what it takes is offered

    with pytest.raises(ValidationError) as method:
        TypeAdapter(BatchOrEpochTime).validate_python("3 epochs")
    assert str(method.value.errors()[0]["msg"]).endswith("expected an integer followed by ba or ep (e.g. '100ba', '3ep')")
