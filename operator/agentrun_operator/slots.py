"""When an AgentRunSchedule's slots come due: `spec.schedule` and `spec.timeZone`, parsed.

Pure: no clock, no I/O. `parse(schedule, time_zone)` returns the schedule's `Slots`, or
raises `InvalidSchedule` with the parser's own message (the schedule says it, Stalled).

- A 5-field cron expression is read by cronsim (a maintained library, not by hand) in the
  schedule's time zone (zoneinfo; default UTC). Daylight-saving changes follow cronsim,
  which follows Debian cron: a job at a fixed time that falls in the skipped hour runs once,
  at the first minute that exists; in the repeated hour it runs once, at the first of the
  two; a job whose hour field is `*` runs every real hour.
- `@yearly`, `@annually`, `@monthly`, `@weekly`, `@daily`, `@midnight`, `@hourly` are the
  5-field expressions CronJob gives them.
- `@every <duration>` (Go's notation: `90s`, `10m`, `1h30m`; at least 10 s): slots at the
  whole multiples of the duration since the Unix epoch, so that every replica and every
  restart computes the same slots (`@every 1h` comes due on the hour, UTC).

Slot times are whole seconds: a slot's run is named after its Unix second.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass
from typing import Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

UTC = datetime.UTC
# A shorter period would start a run more often than an agent reasonably finishes one.
EVERY_FLOOR_SECONDS = 10
# Counting the slots that came due during a long gap (a cron expression is stepped slot by
# slot) stops here: the gap is said to hold at least this many.
COUNT_LIMIT = 1000

_ALIASES = {
    "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


class InvalidSchedule(ValueError):
    """spec.schedule or spec.timeZone cannot be parsed; the message says why."""


@dataclass(frozen=True)
class Due:
    """What came due in an interval: its latest slot, and how many slots before it."""

    latest: datetime.datetime | None
    before: int  # slots in the interval before `latest` (at most COUNT_LIMIT)


class Slots(Protocol):
    def after(self, moment: datetime.datetime) -> datetime.datetime:
        """The first slot strictly after `moment`."""
        ...

    def due(self, since: datetime.datetime, until: datetime.datetime) -> Due:
        """The slots in (since, until]."""
        ...


@dataclass(frozen=True)
class Every:
    """`@every <duration>`: multiples of `seconds` since the Unix epoch."""

    seconds: int

    def after(self, moment: datetime.datetime) -> datetime.datetime:
        at = int(moment.timestamp() // self.seconds + 1) * self.seconds
        return datetime.datetime.fromtimestamp(at, UTC)

    def due(self, since: datetime.datetime, until: datetime.datetime) -> Due:
        first = int(since.timestamp() // self.seconds + 1)  # index of the first after since
        last = int(until.timestamp() // self.seconds)  # of the last at or before until
        if last < first:
            return Due(None, 0)
        return Due(datetime.datetime.fromtimestamp(last * self.seconds, UTC),
                   min(last - first, COUNT_LIMIT))


@dataclass(frozen=True)
class Cron:
    """A 5-field cron expression in a time zone."""

    expression: str
    zone: ZoneInfo

    def after(self, moment: datetime.datetime) -> datetime.datetime:
        start = moment.astimezone(self.zone)
        return next(iter(CronSim(self.expression, start))).astimezone(UTC)

    def due(self, since: datetime.datetime, until: datetime.datetime) -> Due:
        # cronsim's reverse iteration starts a second before the moment it is given: give it
        # the second after `until`, so that a slot at `until` itself counts.
        start = (until.replace(microsecond=0) + datetime.timedelta(seconds=1)).astimezone(
            self.zone)
        backwards = iter(CronSim(self.expression, start, reverse=True))
        latest = next(backwards).astimezone(UTC)
        if latest <= since:
            return Due(None, 0)
        before = 0
        while before < COUNT_LIMIT and next(backwards).astimezone(UTC) > since:
            before += 1
        return Due(latest, before)


def parse_every(text: str) -> int:
    """The seconds of an `@every` duration; raises InvalidSchedule."""
    found = _DURATION.match(text.strip())
    if not text.strip() or found is None:
        raise InvalidSchedule(
            f"@every takes a duration such as 90s, 10m or 1h30m (hours h, minutes m, "
            f"seconds s), not {text.strip()!r}")
    hours, minutes, seconds = (int(g or 0) for g in found.groups())
    total = hours * 3600 + minutes * 60 + seconds
    if total < EVERY_FLOOR_SECONDS:
        raise InvalidSchedule(f"@every {text.strip()} is shorter than the floor of "
                              f"{EVERY_FLOOR_SECONDS}s")
    return total


def parse_zone(name: str | None) -> ZoneInfo:
    """spec.timeZone (an IANA name; absent: UTC); raises InvalidSchedule."""
    try:
        return ZoneInfo(name or "UTC")
    except (ZoneInfoNotFoundError, ValueError) as e:
        raise InvalidSchedule(f"spec.timeZone {name!r} is not a time zone: "
                              f"{str(e).strip(chr(39)) or type(e).__name__}") from e


def parse(schedule: str | None, time_zone: str | None = None) -> Slots:
    """The slots of `schedule` in `time_zone`. Raises InvalidSchedule, whose message names
    the field and gives the parser's own words."""
    text = (schedule or "").strip()
    zone = parse_zone(time_zone)
    if text.startswith("@every"):
        return Every(parse_every(text[len("@every"):]))
    if text.startswith(("TZ=", "CRON_TZ=")):
        raise InvalidSchedule(f"spec.schedule {text!r} names a time zone: set spec.timeZone "
                              "instead")
    expression = _ALIASES.get(text, text)
    if expression.startswith("@"):
        raise InvalidSchedule(f"spec.schedule {text!r} is not one of "
                              f"{', '.join(sorted(_ALIASES))} or @every <duration>")
    fields = len(expression.split())
    if fields != 5:
        raise InvalidSchedule(f"spec.schedule {text!r} cannot be parsed: a cron expression "
                              f"has 5 fields (minute hour day-of-month month day-of-week), "
                              f"not {fields}")
    try:
        CronSim(expression, datetime.datetime(2000, 1, 1, tzinfo=zone))
    except (CronSimError, ValueError) as e:
        raise InvalidSchedule(f"spec.schedule {text!r} cannot be parsed: {e}") from e
    return Cron(expression, zone)
