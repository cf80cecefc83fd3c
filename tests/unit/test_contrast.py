"""WCAG AA contrast of the dashboard's colours, computed from static/ledger.css (light and dark)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

CSS = (Path(__file__).parents[2] / "static" / "ledger.css").read_text()
AA = 4.5  # normal-size text
PAIRS = [("--muted", "--bg"), ("--muted", "--surface"), ("--muted", "--head"),
         ("--fg", "--bg"), ("--fg", "--surface"), ("--label", "--head"),
         ("--label", "--surface"), ("--accent", "--surface"), ("--accent", "--bg"),
         ("--bad", "--surface"), ("--ok", "--surface"), ("--errtext", "--surface")]


def _variables(block: str) -> dict[str, str]:
    """Return the custom properties set in the first :root rule of `block`."""
    root = re.search(r":root\s*\{([^}]*)\}", block)
    assert root, "no :root rule"
    return dict(re.findall(r"(--[\w-]+):\s*(#[0-9a-fA-F]{6})", root.group(1)))


def _luminance(hex_colour: str) -> float:
    """Return the WCAG relative luminance of #rrggbb."""
    channels = [int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    r, g, b = (c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in channels)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(a: str, b: str) -> float:
    """Return the WCAG contrast ratio of two colours."""
    hi, lo = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def test_the_ratio_matches_known_values() -> None:
    assert contrast("#000000", "#ffffff") == pytest.approx(21.0)
    assert contrast("#718096", "#f7fafc") == pytest.approx(3.83, abs=0.01)  # the old muted grey


LIGHT = _variables(CSS)
DARK = _variables(CSS[CSS.index("prefers-color-scheme: dark"):])


@pytest.mark.parametrize("scheme", ["light", "dark"])
@pytest.mark.parametrize(("text", "background"), PAIRS)
def test_text_colours_meet_aa(scheme: str, text: str, background: str) -> None:
    colours = LIGHT if scheme == "light" else {**LIGHT, **DARK}
    ratio = contrast(colours[text], colours[background])
    assert ratio >= AA, f"{scheme}: {text} on {background} is {ratio:.2f}:1"


def test_dark_mode_changes_the_background() -> None:
    assert _luminance(DARK["--bg"]) < 0.05 < _luminance(LIGHT["--bg"])
