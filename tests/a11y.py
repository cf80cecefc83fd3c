"""Accessibility checks on rendered HTML: every form control has a label."""

from __future__ import annotations

from html.parser import HTMLParser

CONTROLS = {"input", "select", "textarea"}
UNLABELLED_TYPES = {"hidden", "submit", "button", "reset", "image"}


class _Controls(HTMLParser):
    """Collect form controls with whether a <label> encloses them, and label[for] ids."""

    def __init__(self) -> None:
        super().__init__()
        self.depth = 0  # open <label> elements
        self.controls: list[tuple[dict[str, str], bool]] = []
        self.label_for: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {k: v or "" for k, v in attrs}
        if tag == "label":
            self.depth += 1
            if values.get("for"):
                self.label_for.add(values["for"])
        elif tag in CONTROLS and values.get("type", "text") not in UNLABELLED_TYPES:
            self.controls.append((values, self.depth > 0))

    def handle_endtag(self, tag: str) -> None:
        if tag == "label" and self.depth:
            self.depth -= 1


def unlabelled_controls(html: str) -> list[dict[str, str]]:
    """Return the form controls of a page that no label names."""
    parser = _Controls()
    parser.feed(html)
    return [attrs for attrs, enclosed in parser.controls
            if not enclosed and not attrs.get("aria-label")
            and attrs.get("id", "\0") not in parser.label_for]
