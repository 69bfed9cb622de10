"""Converts user-given durations (seconds or ``datetime.timedelta``) to seconds."""

from __future__ import annotations

import datetime
import math
import numbers
from typing import Optional, Union

Duration = Union[float, int, datetime.timedelta]


def to_seconds(value: Optional[Duration], name: str) -> Optional[float]:
    """Returns ``value`` in seconds; ``None`` stays ``None`` (meaning no limit).

    Raises:
      TypeError: ``value`` is neither a number nor a ``datetime.timedelta``.
      ValueError: ``value`` is negative or not finite.
    """
    if value is None:
        return None
    if isinstance(value, datetime.timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise TypeError(f'{name} must be a number of seconds or a datetime.timedelta, '
                        f'got {type(value).__name__}: {value!r}')
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f'{name} must be a finite duration >= 0 seconds, got {value!r}')
    return seconds
