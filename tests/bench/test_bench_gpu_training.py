"""bench/training/gpu_training.py: the published GPU training table is what `--report` makes of
the H200 run's results file (no figure typed by hand), and the reference runs on the
device asked for (`--cuda` is the reference's store_false CPU switch)."""

import argparse
import subprocess
import sys

import pytest
from bench.training import reference_throughput as throughput
from tests.conftest import REPO

_LOG = """| epoch   1 |     1/  142 batches | lr 30.00000 | ms/batch 30.00 | loss  9.2 | ppl 10000.00
| epoch   1 |     2/  142 batches | lr 30.00000 | ms/batch 10.00 | loss  8.2 | ppl  3000.00
| epoch   1 |     3/  142 batches | lr 30.00000 | ms/batch 12.00 | loss  7.2 | ppl  1300.00
| end of epoch   1 | time:  2.50s | valid loss  6.60 | valid ppl   735.10 | valid bpc    9.5
| End of training | test loss  6.56 | test ppl   703.32 | test bpc    9.458
"""


def test_gpu_training_table_comes_from_the_results_file():
    results = REPO / "bench" / "training" / "results"
    out = subprocess.run([sys.executable, "-m", "bench.training.gpu_training",
                          "--report", str(results / "gpu_training.json")], cwd=REPO,
                         capture_output=True, text=True, check=True, timeout=120).stdout
    published = (results / "gpu_training.md").read_text()
    rows = [line for line in out.splitlines() if line.startswith("|")]
    assert len(rows) == 6
    for line in rows:
        assert line in published, line
    assert any(line.startswith("| tflm, Keras on PyTorch | 25.75 |") for line in rows)


@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_reference_runs_on_the_device_asked_for(device, tmp_path, monkeypatch):
    seen = {}

    def fake_run(cmd, env, cwd, log_path, threads):
        seen["cmd"], seen["env"] = cmd, env
        log_path.write_text(_LOG)
        return 4.0

    monkeypatch.setattr(throughput, "run_process", fake_run)
    args = argparse.Namespace(reference=str(tmp_path / "awd"), device=device)
    result = throughput.run_reference(args, tmp_path / "data", tmp_path, 2, "t")
    assert ("--cuda" in seen["cmd"]) == (device == "cpu")
    assert (seen["env"].get("CUDA_VISIBLE_DEVICES") == "") == (device == "cpu")
    assert result["median_batch_ms"] == 11.0  # the first line (two batches) left out
    assert result["train_seconds"] == pytest.approx(0.052)
    assert result["batches"] == 4 and result["valid"] == 735.10 and result["test"] == 703.32
