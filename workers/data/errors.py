"""``DataError``: data that cannot be read as the spec says, with the URL or key and what was expected."""

from __future__ import annotations


class DataError(ValueError):
    """Bad or missing data. The message names the shard, file or sample and what was expected,
    so the run fails with it (it pickles across DataLoader workers and Ray)."""

    def __reduce__(self):
        return (type(self), (str(self),))

