"""The settings reference page and deploy/ledger.env.example, written from ledger.config.DECLARED.

`python -m ledger.config_render env-example > deploy/ledger.env.example` rewrites the example;
the docs build writes docs/reference/settings.md with `reference_markdown()`.
"""

from __future__ import annotations

import sys
import textwrap
from typing import Any

from ledger.config import DECLARED
from ledger.config_parsers import Setting

ENV_EXAMPLE_HEAD = """\
# /etc/ledger/ledger.env — read by every ledger unit (mode 0600, owner root:ledger).
# Written from ledger/config.py by `python -m ledger.config_render env-example`; do not edit
# by hand (tests/unit/test_settings_declared.py compares them).
# Uncommented: what a production host sets. Commented: the default, shown for reference.
"""


def shown_default(setting: Setting) -> str:
    """Return a setting's default as the reference states it."""
    if setting.shown_default is not None:
        return setting.shown_default
    value: Any = setting.default
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return "unset"
    return f"`{value}`"


def _cell(text: str) -> str:
    """Return text safe inside a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def reference_markdown() -> str:
    """Return the settings reference page, one table per section."""
    lines = [
        "# Settings",
        "",
        "Every environment variable the ledger reads, generated from its one declaration in",
        "`ledger/config.py`. Values are read strictly when a process starts: an empty value",
        "counts as unset, anything that does not parse or lies out of range stops the process",
        "with a message naming the variable (`ledger …` exits 2, gunicorn does not boot).",
        "*Production* marks the keys `LEDGER_ENV=production` refuses to start without; in",
        "development each is generated once into `LEDGER_VAR_DIR` (mode 0600).",
        "",
        "`deploy/ledger.env.example` is written from the same declarations. Link to one",
        "setting by its name: `settings.md#LEDGER_RETENTION_SECONDS`.",
    ]
    sections: dict[str, list[Setting]] = {}
    for setting in DECLARED:
        sections.setdefault(setting.section, []).append(setting)
    for section, settings in sections.items():
        lines += ["", f"## {section}", "",
                  "| variable | default | accepts | meaning |", "|---|---|---|---|"]
        for s in settings:
            required = " **Required in production.**" if s.production else ""
            lines.append(f"| <span id=\"{s.name}\"></span>`{s.name}` | "
                         f"{_cell(shown_default(s))} | "
                         f"{_cell(s.parser.accepts)} | {_cell(s.meaning)}.{required} |")
    return "\n".join(lines) + "\n"


def _env_value(setting: Setting) -> str | None:
    """Return the default written the way the variable is set, None when it is computed."""
    value: Any = setting.default
    if setting.shown_default is not None or value is None:
        return None
    if isinstance(value, bool):
        return "on" if value else "off"
    return ",".join(value) if isinstance(value, tuple) else str(value)


def env_example() -> str:
    """Return deploy/ledger.env.example: production's values set, the rest commented."""
    out = [ENV_EXAMPLE_HEAD]
    for s in DECLARED:
        note = " Required in production." if s.production else ""
        if s.example is None and _env_value(s) is None:
            note += f" Default: {shown_default(s).replace('`', '')}."
        out += textwrap.wrap(f"{s.name}: {s.meaning.replace('`', '')}.{note}", width=95,
                             initial_indent="# ", subsequent_indent="#   ")
        if s.example is not None:
            out.append(f"{s.name}={s.example}")
        else:
            out.append(f"# {s.name}={_env_value(s) or ''}")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Print the env example or the reference page (the first argument chooses)."""
    what = (argv if argv is not None else sys.argv[1:]) or ["env-example"]
    pages = {"env-example": env_example, "reference": reference_markdown}
    if what[0] not in pages:
        print(f"usage: python -m ledger.config_render {'|'.join(pages)}", file=sys.stderr)
        return 2
    sys.stdout.write(pages[what[0]]())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
