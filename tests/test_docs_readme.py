"""The README is a screen and a half: short lines, the two commands near the top, links that resolve, and no
measured figures (those live on the dated study pages under docs/)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()
LINES = README.splitlines()


def test_readme_is_short_with_short_lines():
    assert len(LINES) < 200
    too_long = [(number, len(line)) for number, line in enumerate(LINES, 1) if len(line) > 120]
    assert not too_long


def test_the_two_commands_are_in_the_first_30_lines():
    head = "\n".join(LINES[:30])
    assert re.search(r"^make demo\b", head, flags=re.MULTILINE)
    assert re.search(r"^make test\b", head, flags=re.MULTILINE)


def test_every_relative_link_and_image_resolves():
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    local = [target for target in targets if "://" not in target]
    assert local
    missing = [target for target in local if not (REPO / target).exists()]
    assert not missing


def test_no_measured_figures_in_the_readme():
    # a percentage, a duration in minutes and seconds, or an interval such as [+0.5, +5.8]
    patterns = [r"\d+(\.\d+)?\s?%", r"\d+ min \d+ s", r"\[[+-]?\d+(\.\d+)?, [+-]?\d+(\.\d+)?\]"]
    found = [match.group(0) for pattern in patterns for match in re.finditer(pattern, README)]
    assert not found
