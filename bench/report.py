"""Figures, the printed table and bench/results/latest.json."""

from __future__ import annotations

import json
import math
import os
import platform
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True, slots=True, kw_only=True)
class Figure:
    """One measure next to its baseline from the same run, and whether the target holds."""

    measure: str
    value: float
    unit: str
    baseline: str
    baseline_value: float
    ratio: float
    target: str
    met: bool
    note: str = ""
    # A row of the targets that this run did not measure (the 10M rows of a default run):
    # printed with its last recorded figures, counted neither met nor missed.
    not_run: bool = False
    # What this run measured about why the figure is what it is (bench/cpu.py's CPU per
    # request, say): printed under "Missed, and why" before the general explanation.
    profile: str = ""


def percentile(samples: list[float], q: float) -> float:
    """The q-th percentile (0 < q <= 100) of `samples` by nearest rank: the smallest sample
    with at least q % of the samples at or below it (p95 of two samples is the larger)."""
    if not samples:
        return 0.0
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def at_least(measure: str, value: float, unit: str, baseline: str, baseline_value: float,
             minimum: float, note: str = "") -> Figure:
    """A figure whose ratio to the baseline must be at least `minimum`."""
    ratio = value / baseline_value if baseline_value else 0.0
    return Figure(measure=measure, value=round(value, 2), unit=unit, baseline=baseline,
                  baseline_value=round(baseline_value, 2), ratio=round(ratio, 3),
                  target=f">= {minimum}x", met=ratio >= minimum, note=note)


def at_most(measure: str, value: float, unit: str, baseline: str, baseline_value: float,
            maximum: float, note: str = "") -> Figure:
    """A figure whose ratio to the baseline must be at most `maximum`."""
    ratio = value / baseline_value if baseline_value else float("inf")
    return Figure(measure=measure, value=round(value, 2), unit=unit, baseline=baseline,
                  baseline_value=round(baseline_value, 2), ratio=round(ratio, 3),
                  target=f"<= {maximum}x", met=ratio <= maximum, note=note)


def failed(measure: str, error: str) -> Figure:
    """A measure that could not run (its dependency missing or broken)."""
    return Figure(measure=measure, value=0.0, unit="", baseline="", baseline_value=0.0,
                  ratio=0.0, target="", met=False, note=f"NOT MEASURED: {error}"[:300])


def table(figures: list[Figure]) -> str:
    """Return the figures as a Markdown table."""
    lines = ["| measure | value | baseline (same run) | ratio | target | met |",
             "|---|---|---|---|---|---|"]
    for f in figures:
        value = f"{f.value:,.2f} {f.unit}".strip() if f.unit else "—"
        base = f"{f.baseline} {f.baseline_value:,.2f}" if f.baseline else "—"
        met = "not run" if f.not_run else "yes" if f.met else "**NO**"
        lines.append(f"| {f.measure} | {value} | {base} | {f.ratio:.3f} | {f.target} | {met} |")
    notes = [f"- {f.measure}: {f.note}" for f in figures if f.note]
    return "\n".join(lines + (["", *notes] if notes else []))


def machine() -> dict[str, str]:
    """Describe the machine the figures came from."""
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"host": platform.node(), "cpu": cpu, "cores": str(os.cpu_count()),
            "python": platform.python_version(), "system": platform.platform()}


def write(figures: list[Figure], extra: dict[str, object], path: Path | None = None) -> Path:
    """Write the figures, machine and run details as JSON; return the path."""
    path = path or RESULTS / "latest.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "machine": machine(),
           "figures": [asdict(f) for f in figures], "details": extra}
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return path


def record(report: dict[str, object], results: Path) -> None:
    """Print one bench's report as a JSON line and append it to its results file."""
    line = json.dumps(report, default=str)
    print(line, flush=True)
    results.parent.mkdir(exist_ok=True)
    with results.open("a") as handle:
        handle.write(line + "\n")
