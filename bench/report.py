"""Figures, the printed table and the records in bench/results/<measure>.json."""

from __future__ import annotations

import json
import math
import os
import platform
from dataclasses import asdict, dataclass, replace
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
    note: str = ""  # what this run measured that says why the figure is what it is
    # A row from an earlier record (the 10M rows of a default run): counted neither way.
    not_run: bool = False


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


def absolute(measure: str, value: float, unit: str, maximum: float, note: str = "") -> Figure:
    """A figure that must stay at or below a fixed `maximum`."""
    return Figure(measure=measure, value=round(value, 3), unit=unit, baseline="target",
                  baseline_value=maximum, ratio=round(value / maximum, 3),
                  target=f"<= {maximum:g} {unit}", met=value <= maximum, note=note)


def shown(measure: str, value: float, unit: str, baseline: str, baseline_value: float,
          note: str = "") -> Figure:
    """A figure measured to inform (a second baseline, a sweep), with no target."""
    return replace(at_least(measure, value, unit, baseline, baseline_value, 0.0, note),
                   target="", met=True)


def failed(measure: str, error: str) -> Figure:
    """A measure that could not run (its dependency missing or broken)."""
    return Figure(measure=measure, value=0.0, unit="", baseline="", baseline_value=0.0,
                  ratio=0.0, target="", met=False, note=f"NOT MEASURED: {error}"[:300])


def verdict(f: Figure) -> str:
    """Return met / missed / shown / recorded for the table."""
    if f.not_run:
        return "recorded earlier"
    if not f.target:
        return "shown" if not f.note.startswith("NOT MEASURED") else "**not measured**"
    return "met" if f.met else "**missed**"


def table(figures: list[Figure]) -> str:
    """Return the figures as a Markdown table, each row with what the run measured."""
    lines = ["| measure | value | baseline (same run) | ratio | target | verdict | measured |",
             "|---|---|---|---|---|---|---|"]
    for f in figures:
        value = f"{f.value:,.2f} {f.unit}".strip() if f.unit else "—"
        base = f"{f.baseline} {f.baseline_value:,.2f}" if f.baseline else "—"
        lines.append(f"| {f.measure} | {value} | {base} | {f.ratio:.2f} | {f.target or '—'}"
                     f" | {verdict(f)} | {f.note or ''} |")
    return "\n".join(lines)


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


def write(name: str, figures: list[Figure], result: dict[str, object],
          seconds: float) -> Path:
    """Write one measure's figures, raw result and machine as bench/results/<name>.json."""
    path = RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"measure": name, "seconds": seconds, "machine": machine(),
           "figures": [asdict(f) for f in figures], "result": result}
    path.write_text(json.dumps(doc, indent=2, default=_plain) + "\n")
    return path


def _plain(value: object) -> object:
    """Turn what json cannot (run objects, paths) into something it can."""
    to_json = getattr(value, "to_json", None)
    return to_json() if callable(to_json) else str(value)


def latest() -> list[Figure]:
    """Return the figures of every record in bench/results, by measure name."""
    figures: list[Figure] = []
    for path in sorted(RESULTS.glob("*.json")):
        doc = json.loads(path.read_text())
        figures += [Figure(**f) for f in doc.get("figures", [])]
    return figures


if __name__ == "__main__":  # python -m bench.report: the table of the latest records
    print(table(latest()))
