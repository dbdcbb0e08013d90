"""Typed durations: ``"3ep"``, ``"100ba"``, ``"2048sp"``, ``"1e6tok"`` is refused, ``"0.5dur"``.

A ``Time`` is a non-negative amount in exactly one unit. Mixing units fails loudly: converting
between epochs and batches needs the length of an epoch, which only the trainer knows, so that
conversion lives in ``workers`` (``to_batches``) and not here.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer, WithJsonSchema


class TimeUnit(str, enum.Enum):
    EPOCH = "ep"
    BATCH = "ba"
    SAMPLE = "sp"
    TOKEN = "tok"
    DURATION = "dur"  # fraction of max_duration, in [0, 1]


_TIME_RE = re.compile(r"^\s*(?P<value>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>ep|ba|sp|tok|dur)\s*$")
_EXAMPLES = {"ep": "'3ep'", "ba": "'100ba'", "sp": "'50000sp'", "tok": "'2000000tok'"}


def allowed_forms(units: "tuple[TimeUnit, ...]") -> str:
    """How a Time string of ``units`` is written, for a refusal: "an integer followed by ep or ba
    (e.g. '3ep', '100ba')", ", or a fraction in [0, 1] followed by dur (e.g. '0.1dur')" when
    ``dur`` is one of them."""
    counts = [unit.value for unit in units if unit is not TimeUnit.DURATION]
    forms = []
    if counts:
        named = counts[0] if len(counts) == 1 else f"{', '.join(counts[:-1])} or {counts[-1]}"
        forms.append(f"an integer followed by {named} (e.g. {', '.join(_EXAMPLES[c] for c in counts[:2])})")
    if TimeUnit.DURATION in units:
        forms.append("a fraction in [0, 1] followed by dur (e.g. '0.1dur')")
    return ", or ".join(forms)


ALLOWED_FORMS = allowed_forms(tuple(TimeUnit))


@dataclass(frozen=True, order=False)
class Time:
    value: float
    unit: TimeUnit

    @classmethod
    def parse(cls, text: "str | Time", *, forms: str = ALLOWED_FORMS) -> "Time":
        """Parse ``"3ep"``-style text; raise ``ValueError`` saying what is allowed (``forms``:
        the forms a field takes, ``allowed_forms`` of its units)."""
        if isinstance(text, Time):
            return text
        if not isinstance(text, str):
            raise ValueError(f"{text!r} is not a Time string; expected {forms}")
        match = _TIME_RE.match(text)
        if match is None:
            raise ValueError(f"{text!r} is not a Time string; expected {forms}")
        unit = TimeUnit(match["unit"])
        raw = match["value"]
        if unit is TimeUnit.DURATION:
            value = float(raw)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{text!r}: a 'dur' fraction must lie in [0, 1]")
            return cls(value, unit)
        if "." in raw:
            raise ValueError(f"{text!r}: '{unit.value}' counts must be whole numbers; expected {forms}")
        return cls(int(raw), unit)

    def __str__(self) -> str:
        value = self.value if self.unit is TimeUnit.DURATION else int(self.value)
        return f"{value}{self.unit.value}"

    def _same_unit(self, other: "Time") -> None:
        if self.unit is not other.unit:
            raise ValueError(f"cannot compare {self} with {other}: units differ ({self.unit.value} vs {other.unit.value})")

    def __lt__(self, other: "Time") -> bool:
        self._same_unit(other)
        return self.value < other.value

    def __le__(self, other: "Time") -> bool:
        self._same_unit(other)
        return self.value <= other.value

    def __add__(self, other: "Time") -> "Time":
        self._same_unit(other)
        return Time(self.value + other.value, self.unit)


def _parse_time(value: Any) -> Time:
    return Time.parse(value)


def _time_validator(*units: TimeUnit, positive: bool = False):
    allowed = ", ".join(u.value for u in units)

    forms = allowed_forms(units)

    def check(value: Any) -> Time:
        time = Time.parse(value, forms=forms)
        if time.unit not in units:
            raise ValueError(f"{value!r} uses unit '{time.unit.value}'; allowed units here: {allowed}")
        if positive and time.value <= 0:
            raise ValueError(f"{value!r} must be greater than zero")
        return time

    return check


def time_field(*units: TimeUnit, positive: bool = False, example: str = "3ep"):
    """An annotated pydantic type for a Time string restricted to ``units``."""
    return Annotated[
        Time,
        BeforeValidator(_time_validator(*units, positive=positive)),
        PlainSerializer(str, return_type=str),
        WithJsonSchema({"type": "string", "pattern": _TIME_RE.pattern, "examples": [example]}),
    ]


ALL_UNITS = tuple(TimeUnit)
DurationTime = time_field(TimeUnit.EPOCH, TimeUnit.BATCH, TimeUnit.SAMPLE, TimeUnit.TOKEN, positive=True)
IntervalTime = time_field(*ALL_UNITS, positive=True, example="1ep")
OffsetTime = time_field(*ALL_UNITS, example="0.1dur")
