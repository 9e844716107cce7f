"""slots.parse(): cron expressions and time zones, the next slot and what came due, across
daylight-saving changes, against the library's own answer; @every; what is refused."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from zoneinfo import ZoneInfo

import pytest
from agentrun_operator.slots import COUNT_LIMIT, Cron, Every, InvalidSchedule, parse
from cronsim import CronSim

UTC = datetime.UTC
PARIS = ZoneInfo("Europe/Paris")


def utc(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text).replace(tzinfo=UTC)


@dataclass(frozen=True)
class Next:
    name: str
    schedule: str
    zone: str
    after: str  # UTC
    expected: str  # UTC: the next slot


# Paris: summer time starts 2026-03-29 at 02:00 CET (01:00Z, clocks go to 03:00 CEST) and
# ends 2026-10-25 at 03:00 CEST (01:00Z, clocks go back to 02:00 CET).
NEXT = [
    Next("daily 02:30 on the spring day runs at 03:00 CEST, the first minute that exists",
         "30 2 * * *", "Europe/Paris", "2026-03-28T12:00:00", "2026-03-29T01:00:00"),
    Next("daily 02:30 the day after spring: 02:30 CEST", "30 2 * * *", "Europe/Paris",
         "2026-03-29T01:00:00", "2026-03-30T00:30:00"),
    Next("daily 01:30 before the spring change: still CET", "30 1 * * *", "Europe/Paris",
         "2026-03-28T12:00:00", "2026-03-29T00:30:00"),
    Next("daily 03:00 on the spring day: 03:00 CEST", "0 3 * * *", "Europe/Paris",
         "2026-03-28T12:00:00", "2026-03-29T01:00:00"),
    Next("daily 02:30 on the autumn day runs once, at the first 02:30 (CEST)", "30 2 * * *",
         "Europe/Paris", "2026-10-24T12:00:00", "2026-10-25T00:30:00"),
    Next("... and not again at the second 02:30 (CET)", "30 2 * * *", "Europe/Paris",
         "2026-10-25T00:30:00", "2026-10-26T01:30:00"),
    Next("hourly in the repeated hour: every real hour", "0 * * * *", "Europe/Paris",
         "2026-10-25T00:00:00", "2026-10-25T01:00:00"),
    Next("hourly across the skipped hour: every real hour", "0 * * * *", "Europe/Paris",
         "2026-03-29T00:00:00", "2026-03-29T01:00:00"),
    Next("daily 09:00 in winter: 08:00Z", "0 9 * * *", "Europe/Paris",
         "2026-01-10T12:00:00", "2026-01-11T08:00:00"),
    Next("daily 09:00 in summer: 07:00Z", "0 9 * * *", "Europe/Paris",
         "2026-07-10T12:00:00", "2026-07-11T07:00:00"),
    Next("no zone is UTC", "0 9 * * *", "", "2026-07-10T12:00:00", "2026-07-11T09:00:00"),
    Next("@daily is midnight in its zone", "@daily", "Europe/Paris", "2026-07-10T12:00:00",
         "2026-07-10T22:00:00"),
    Next("@hourly", "@hourly", "UTC", "2026-07-10T12:00:00", "2026-07-10T13:00:00"),
    Next("@weekly is Sunday midnight", "@weekly", "UTC", "2026-07-10T12:00:00",
         "2026-07-12T00:00:00"),
    Next("@every 10m: multiples of 600 s since the epoch", "@every 10m", "Europe/Paris",
         "2026-07-10T12:04:59", "2026-07-10T12:10:00"),
    Next("@every 1h30m", "@every 1h30m", "UTC", "2026-07-10T12:00:00", "2026-07-10T13:30:00"),
    Next("a slot is strictly after the moment", "@every 10s", "UTC", "2026-07-10T12:00:10",
         "2026-07-10T12:00:20"),
]


@pytest.mark.parametrize("row", NEXT, ids=[r.name for r in NEXT])
def test_the_next_slot(row: Next) -> None:
    slots = parse(row.schedule, row.zone or None)
    assert slots.after(utc(row.after)) == utc(row.expected)


@pytest.mark.parametrize("row", [r for r in NEXT if not r.schedule.startswith("@")],
                         ids=[r.name for r in NEXT if not r.schedule.startswith("@")])
def test_the_next_slot_is_the_librarys(row: Next) -> None:
    """The same answer as cronsim's, asked directly in the zone (compared in UTC: PEP 495
    makes a time in a repeated hour unequal to every time of another zone)."""
    zone = ZoneInfo(row.zone or "UTC")
    expected = next(CronSim(row.schedule, utc(row.after).astimezone(zone))).astimezone(UTC)
    assert parse(row.schedule, row.zone or None).after(utc(row.after)) == expected


@dataclass(frozen=True)
class Gap:
    name: str
    schedule: str
    zone: str
    since: str
    until: str
    latest: str | None
    before: int


GAPS = [
    Gap("nothing came due", "0 * * * *", "UTC", "2026-07-10T12:00:00", "2026-07-10T12:59:59",
        None, 0),
    Gap("a slot at `until` itself came due", "0 * * * *", "UTC", "2026-07-10T12:00:00",
        "2026-07-10T13:00:00", "2026-07-10T13:00:00", 0),
    Gap("a slot at `since` itself is not new", "0 * * * *", "UTC", "2026-07-10T13:00:00",
        "2026-07-10T13:30:00", None, 0),
    Gap("three hours down: the latest, and two before it", "0 * * * *", "UTC",
        "2026-07-10T09:30:00", "2026-07-10T12:10:00", "2026-07-10T12:00:00", 2),
    Gap("across the autumn change in Paris: the repeated hour counts", "0 * * * *",
        "Europe/Paris", "2026-10-24T22:30:00", "2026-10-25T02:30:00",
        "2026-10-25T02:00:00", 3),
    Gap("@every 10s, a minute down", "@every 10s", "UTC", "2026-07-10T12:00:00",
        "2026-07-10T12:01:05", "2026-07-10T12:01:00", 5),
    Gap("@every 10s, a day down: counted up to the limit", "@every 10s", "UTC",
        "2026-07-10T12:00:00", "2026-07-11T12:00:00", "2026-07-11T12:00:00", COUNT_LIMIT),
    Gap("every minute, a day down: counted up to the limit", "* * * * *", "UTC",
        "2026-07-10T12:00:00", "2026-07-11T12:00:30", "2026-07-11T12:00:00", COUNT_LIMIT),
]


@pytest.mark.parametrize("row", GAPS, ids=[r.name for r in GAPS])
def test_what_came_due(row: Gap) -> None:
    due = parse(row.schedule, row.zone).due(utc(row.since), utc(row.until))
    assert due.latest == (utc(row.latest) if row.latest else None)
    assert due.before == row.before


def test_parsed_kinds() -> None:
    assert parse("@every 1m") == Every(60)
    assert parse("*/5 * * * *", "Europe/Paris") == Cron("*/5 * * * *", PARIS)
    assert parse("@monthly") == Cron("0 0 1 * *", ZoneInfo("UTC"))


@pytest.mark.parametrize(("schedule", "zone", "said"), [
    ("61 * * * *", None, "spec.schedule '61 * * * *' cannot be parsed: Bad minute"),
    ("0 25 * * *", None, "cannot be parsed: Bad hour"),
    ("0 0 31 2 *", None, "cannot be parsed: Bad day-of-month"),
    ("* * * *", None, "a cron expression has 5 fields (minute hour day-of-month month "
     "day-of-week), not 4"),
    ("0 * * * * *", None, "not 6"),
    ("", None, "not 0"),
    ("@fortnightly", None, "is not one of @annually, @daily, @hourly"),
    ("@every 5s", None, "@every 5s is shorter than the floor of 10s"),
    ("@every 10", None, "@every takes a duration such as 90s, 10m or 1h30m"),
    ("@every", None, "@every takes a duration"),
    ("@every 1d", None, "not '1d'"),
    ("TZ=Europe/Paris 0 9 * * *", None, "names a time zone: set spec.timeZone instead"),
    ("0 9 * * *", "Mars/Olympus", "spec.timeZone 'Mars/Olympus' is not a time zone: No time "
     "zone found with key Mars/Olympus"),
    ("0 9 * * *", "../../etc/passwd", "spec.timeZone '../../etc/passwd' is not a time zone"),
], ids=lambda v: str(v))
def test_what_cannot_be_parsed_says_why(schedule: str, zone: str | None, said: str) -> None:
    with pytest.raises(InvalidSchedule) as refused:
        parse(schedule, zone)
    assert said in str(refused.value)
