"""A dataset's JSON Lines are read back line by line at "\n" only."""

from __future__ import annotations

import json

from training.trainers import jsonl_rows


def test_a_row_holding_a_line_separator_character_reads_back_whole(tmp_path):
    rows = [
        {"item": "a", "task": "first\u2028second\u2029third\x85fourth\x0cfifth"},
        {"item": "b", "task": "x"},
    ]
    path = tmp_path / "train.jsonl"
    # As a dataset writes them: those characters are not escaped (ensure_ascii=False).
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    assert "\u2028" in path.read_text(encoding="utf-8")

    assert jsonl_rows(path) == rows
