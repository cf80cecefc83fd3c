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


def test_the_async_rows_judge_the_async_intake_against_the_same_runs_baselines() -> None:
    def side(rate: float, p99: float, web_ms: float) -> dict[str, object]:
        return {"accepted_per_s": rate, "p99_ms": p99, "accepted_per_s_runs": [rate, rate],
                "p99_ms_runs": [p99, p99], "errors": 0, "cpu": {"web_ms": web_ms}}

    dup = {"dup_per_s": 600.0, "new_accepted_per_s": 500.0, "dup_new_receipts": 0}
    rows = {f.measure: f for f in run.async_figures({
        "async": side(700, 50, 0.6), "ours": side(650, 90, 1.5), "thin": side(500, 100, 1.2),
        "floor": side(1400, 40, 0.5), "duplicates": {"async": dup, "ours": dup},
        "workers": 4, "threads": 16, "rounds": 1})}
    assert rows["accepted/s, async intake vs thin as written"].met  # 1.4x >= 1.3x
    assert rows["p99, async intake vs thin as written"].met  # 0.5x <= 0.7x
    assert rows["web CPU per delivery, async intake vs the floor"].met  # 1.2x <= 1.35x
    assert rows["accepted/s, async intake vs shipped"].ratio == round(700 / 650, 3)
    assert "async 700, 700" in rows["accepted/s, async intake vs thin as written"].note


def test_the_page_bench_visits_every_get_endpoint(app) -> None:  # type: ignore[no-untyped-def]
    from bench import big

    endpoints = {r.endpoint for r in app.url_map.iter_rules() if "GET" in (r.methods or ())}
    assert endpoints - big.NOT_PAGES - set(big.PAGES) == set()
    sample = dict.fromkeys(
        f for visits in big.PAGES.values() for _, path in visits for f in big._fields(path))
    visits, untimed = big.pages(app, {k: "x" for k in sample})
    assert untimed == [] and len(visits) == sum(len(v) for v in big.PAGES.values())


def test_the_memory_row_judges_the_process_that_grew_most() -> None:
    [row] = run.memory_figures({"requests": 200_000, "processes": 2,
                            "rss_before_mb": [80.0, 100.0], "rss_after_mb": [100.0, 101.0]})
    assert (row.value, row.baseline_value, row.met) == (100.0, 80.0, False)  # 1.25x
    [row] = run.memory_figures({"requests": 200_000, "processes": 2,
                            "rss_before_mb": [80.0, 100.0], "rss_after_mb": [84.0, 101.0]})
    assert row.met and row.ratio == 1.05


def test_the_granian_rows_judge_each_shape_and_the_slow_body_probe() -> None:
    def side(rate: float, p99: float, web_ms: float) -> dict[str, object]:
        return {"accepted_per_s": rate, "p99_ms": p99, "accepted_per_s_runs": [rate, rate],
                "p99_ms_runs": [p99, p99], "errors": 0, "cpu": {"web_ms": web_ms}}

    def probe(ended: int, healthz: float | None) -> dict[str, object]:
        return {"slow_sockets": 4, "healthz_seconds": healthz, "healthz_wait_seconds": 3.0,
                "ended": ended, "deadline_seconds": 3, "margin_seconds": 3}

    rows = {f.measure: f for f in run.granian_figures({
        "granian": side(1400, 40, 0.6), "rsgi": side(1200, 90, 0.5),
        "thin": side(1000, 100, 1.0), "floor": side(2000, 30, 0.4),
        "probe": {"granian": probe(0, None), "rsgi": probe(4, 0.02), "ours": probe(4, 0.01)},
        "workers": 4, "threads": 4, "rounds": 2})}
    wsgi, rsgi = "granian WSGI 4 x 4", "granian RSGI 4 x 1, bodies on the loop"
    assert rows[f"accepted/s, {wsgi} vs thin as written"].met  # 1.4x >= 1.3x
    assert not rows[f"accepted/s, {rsgi} vs thin as written"].met  # 1.2x
    assert rows[f"p99, {wsgi} vs thin as written"].met  # 0.4x <= 0.7x
    assert not rows[f"web CPU per delivery, {wsgi} vs the floor"].met  # 1.5x
    assert rows[f"web CPU per delivery, {rsgi} vs the floor"].met  # 1.25x
    slow = rows["slow bodies ended by the body deadline, granian WSGI vs shipped"]
    assert (slow.value, slow.baseline_value, slow.met) == (0, 4, False)
    assert "granian WSGI not within 3 s, shipped 0.01 s" in slow.note
    on_loop = rows["slow bodies ended by the body deadline, granian RSGI vs shipped"]
    assert (on_loop.value, on_loop.met) == (4, True)
    assert "granian RSGI 0.02 s" in on_loop.note


def test_the_slow_body_probe_counts_the_sockets_the_server_answered_or_closed() -> None:
    import socket
    import time

    from bench import granian_intake

    with socket.create_server(("127.0.0.1", 0)) as server:
        kept = [socket.create_connection(server.getsockname()) for _ in range(3)]
        accepted = [server.accept()[0] for _ in kept]
        try:
            accepted[0].sendall(b"HTTP/1.1 408 Request Timeout\r\n\r\n")  # answered
            accepted[1].close()  # closed
            started = time.monotonic()
            assert granian_intake._trickle(kept, started + 1.5) == 2
            assert time.monotonic() - started >= 1.4  # the third stayed open to the end
            assert accepted[2].recv(16).startswith(b" ")  # and was sent a byte a second
        finally:
            for connection in kept + accepted:
                connection.close()
