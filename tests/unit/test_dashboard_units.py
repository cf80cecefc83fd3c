"""Pieces of the dashboard that need no database: cursors, charts, durations."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from ledger.reads.cursor import BadCursor, decode_cursor, encode_cursor
from ledger.reads.receipts import prefix_bounds
from ledger.web.dashboard import ago
from ledger.web.dashboard.svg import projection_chart, series_chart

AT = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)


def test_cursor_round_trips_and_refuses_tampering() -> None:
    cursor = encode_cursor(AT, 7, "evt_1")
    assert decode_cursor(cursor, (datetime, int, str)) == (AT, 7, "evt_1")
    for bad in ("", "!!!", encode_cursor("x", 7, "evt_1"), encode_cursor(AT, "7", "evt_1"),
                encode_cursor(AT, 7), "A" * 5000):
        with pytest.raises(BadCursor):
            decode_cursor(bad, (datetime, int, str))


def test_prefix_bounds_cover_exactly_the_prefix() -> None:
    low, high = prefix_bounds("evt_a")
    assert low <= "evt_a" < high and low <= "evt_azzz" < high
    assert high <= "evt_b" and low > "evt_"


def test_series_chart_escapes_its_label_and_draws_both_lines() -> None:
    points = [(AT + timedelta(hours=h), 10 + h, h % 2) for h in range(5)]
    svg = str(series_chart(points, label="<script>x</script>"))
    assert "<script>" not in svg and "&lt;script&gt;" in svg
    assert svg.count("<polyline") == 2
    assert "no deliveries in 48 h" in str(series_chart([], label="acme/x"))


def test_projection_grows_until_retention_then_stays_flat() -> None:
    svg = str(projection_chart(events_per_day=1000, bytes_per_receipt=200, retention_days=7))
    points = svg.split('points="')[1].split('"')[0].split()
    ys = [float(p.split(",")[1]) for p in points]
    assert ys[0] > ys[3] > ys[7] and ys[7] == ys[-1]
    assert "retention 7 d" in svg


def test_ago_reads_like_a_person_would_say_it() -> None:
    assert [ago(s) for s in (None, 5, 125, 7260, 190000)] == ["—", "5s", "2m 5s", "2h 1m",
                                                                "2d 4h"]
