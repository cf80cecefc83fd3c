"""The bench serves the ledger as shipped and keeps its expensive 10M record apart."""

from __future__ import annotations

import shlex

import pytest

from bench import env as benv
from bench import report, run


def test_the_ledger_is_served_by_the_procfiles_web_command() -> None:
    web = next(line for line in (benv.ROOT / "Procfile").read_text().splitlines()
               if line.startswith("web:"))
    command = benv.procfile_web()
    assert command[0] == str(benv.BIN / "gunicorn")
    assert command[1:] == shlex.split(web.removeprefix("web:"))[1:]


def test_a_default_run_shows_the_recorded_10m_rows_without_counting_them() -> None:
    rows = run.recorded_10m()
    assert rows, "bench/results/scale-10000000.json holds the last --scale 10m figures"
    assert all(row.not_run for row in rows)
    assert any(row.measure.startswith("purge us per receipt") for row in rows)


@pytest.mark.parametrize(("samples", "q", "expected"), [
    ([5.0, 1.0], 95, 5.0),            # two rounds: p95 is the slower one, not the minimum
    ([3.0], 95, 3.0),
    ([float(n) for n in range(1, 101)], 95, 95.0),
    ([float(n) for n in range(1, 101)], 99, 99.0),
    ([float(n) for n in range(1, 21)], 50, 10.0),
    ([], 95, 0.0),
])
def test_the_bench_percentile_is_the_nearest_rank(samples: list[float], q: float,
                                                  expected: float) -> None:
    assert report.percentile(samples, q) == expected


def test_the_page_bench_visits_every_get_endpoint(app) -> None:  # type: ignore[no-untyped-def]
    from bench import big

    endpoints = {r.endpoint for r in app.url_map.iter_rules() if "GET" in (r.methods or ())}
    assert endpoints - big.NOT_PAGES - set(big.PAGES) == set()
    sample = dict.fromkeys(
        f for visits in big.PAGES.values() for _, path in visits for f in big._fields(path))
    visits, untimed = big.pages(app, {k: "x" for k in sample})
    assert untimed == [] and len(visits) == sum(len(v) for v in big.PAGES.values())
