"""The multirun summary: one row per override set; the markdown shows what varies."""

import json

from conftest import make_summary
from evora.tracking.sweep import summary_row, write_summary


def test_sweep_summary_lists_each_job_and_what_varies(tmp_path):
    es = make_summary(0.5, 0.95, 0.9, generations=3)
    pbt = make_summary(0.4, 0.7, strategy="pbt", generations=3, best_generation=None)
    rows = [
        summary_row(0, ["strategy=es", "seed=0", "generations=3"], "completed", "es", es, 12.34, "/s/0"),
        summary_row(1, ["strategy=pbt", "seed=0", "generations=3"], "completed", "pbt", pbt, 40.0, "/s/1"),
        summary_row(2, ["strategy=ga", "seed=0", "generations=3"], "failed", "ga", None, 1.0, "/s/2"),
    ]
    write_summary(tmp_path, rows)
    saved = json.loads((tmp_path / "sweep_summary.json").read_text())
    assert [r["final_heldout"] for r in saved] == [0.9, None, None]  # PBT has no final center adapter
    assert [r["best_heldout"] for r in saved] == [0.95, 0.7, None]
    assert saved[1]["base_heldout"] == 0.4 and saved[0]["wall_clock_s"] == 12.3
    markdown = (tmp_path / "sweep_summary.md").read_text().splitlines()
    assert "Every job: `seed=0 generations=3`" in markdown
    table = [line for line in markdown if line.startswith("| ") and "job" not in line and "---" not in line]
    assert [line.split(" | ")[1] for line in table] == ["strategy=es", "strategy=pbt", "strategy=ga"]
    assert "| failed |" in table[2] and "| 0.900 |" in table[0]
