"""benchmarks/reductions_refresh.py rewrites its rows and sections of docs/benchmarks.md in place and leaves every
other line as make bench wrote it."""

from __future__ import annotations

from benchmarks.reductions_refresh import NOTE, note_in_opening, replace_row, replace_section

PAGE = """# Benchmarks

Produced by `make bench` on a day.

## Targets

| target | result |
|---|---|
| a replica fingerprint every 100 steps < 0.1% | old |
| hot path < 30 µs | kept |

## Rollback: keeping and restoring a good state by its size

old text

| old | table |

## Training step time

kept table

## Opt-in features, per sample

old opt-in
""".splitlines()


def test_only_the_named_rows_and_sections_change_and_the_opening_says_so() -> None:
    lines = list(PAGE)
    replace_row(lines, "| a replica fingerprint every 100 steps", "| a replica fingerprint every 100 steps | new |")
    replace_row(lines, "| replica checks every step", "| replica checks every step | added |", after="| a replica f")
    replace_section(
        lines,
        "## Rollback: keeping and restoring a good state by its size",
        ["## Rollback: keeping and restoring a good state by its size", "", "new text", ""],
    )
    replace_section(lines, "## Opt-in features, per sample", ["", "## Opt-in features, per sample", "", "new", ""])
    note_in_opening(lines, f"{NOTE} on a later day.")
    text = "\n".join(lines)
    assert "old" not in text
    assert text.count("kept") == 2 and "| a replica fingerprint every 100 steps | new |" in text
    added = lines.index("| replica checks every step | added |")
    assert lines[added - 1] == "| a replica fingerprint every 100 steps | new |"
    replace_row(lines, "| replica checks every step", "| replica checks every step | again |", after="| a replica f")
    assert lines[added] == "| replica checks every step | again |" and "added" not in "\n".join(lines)
    assert lines[2:4] == ["Produced by `make bench` on a day.", f"{NOTE} on a later day."]
    assert lines[lines.index("## Training step time") - 2] == "new text"
    assert lines[-2:] == ["new", ""]
    note_in_opening(lines, f"{NOTE} again.")  # a second refresh replaces its note
    assert sum(line.startswith(NOTE) for line in lines) == 1 and f"{NOTE} again." in lines
