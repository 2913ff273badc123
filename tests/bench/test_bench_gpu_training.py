"""bench/training/gpu_training.py: the published GPU training table is what `--report` makes of
the H200 run's results file (no figure typed by hand), and the reference runs on the
device asked for (`--cuda` is the reference's store_false CPU switch); `--checkout` times
another tree of tflm beside this one."""

import argparse
import json
import os
import pathlib
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


def _fake_metrics(train_seconds):
    return {"history": [{"first_step_seconds": 1.0, "train_seconds": train_seconds,
                         "epoch_seconds": train_seconds + 2, "validation_seconds": 2.0}],
            "seconds": {"total": 10.0, "fit": train_seconds + 3, "build": 0.5},
            "valid_perplexity": 700.0, "test_perplexity": 690.0, "words_per_second": 1.0}


def test_a_checkout_runs_its_own_zoo_train_and_its_rows_name_its_commit(tmp_path,
                                                                         monkeypatch):
    """--checkout LABEL=PATH: that tree's zoo.train (its cwd and PYTHONPATH), beside this
    one, in the table under LABEL and the tree's commit."""
    old = tmp_path / "old"
    subprocess.run(["git", "worktree", "add", "--detach", str(old), "HEAD"], cwd=REPO,
                   check=True, capture_output=True)
    try:
        seen = []

        def fake_run(cmd, env, cwd, log_path, threads):
            seen.append((cwd, env["PYTHONPATH"]))
            out = pathlib.Path(cmd[cmd.index("--out") + 1])
            out.mkdir(parents=True)
            (out / "metrics.json").write_text(json.dumps(_fake_metrics(
                20.0 if cwd == REPO else 40.0)))
            return 30.0

        monkeypatch.setattr(throughput, "run_process", fake_run)
        args = argparse.Namespace(device="cpu", warm_jax_cache=False, checkouts={"old": old},
                                  backends=["jax"], threads=[1], repeats=1,
                                  train_tokens=1000, reference_commit=None)
        rows = {("jax", 1): [throughput.run_tflm(args, tmp_path, tmp_path, 1, "jax", "a")],
                (("jax", "old"), 1): [throughput.run_tflm(args, tmp_path, tmp_path, 1,
                                                          ("jax", "old"), "a")]}
        assert seen[0][0] == REPO and seen[0][1].split(os.pathsep)[0] == str(REPO)
        assert seen[1] == (old, str(old))
        table = throughput.report(args, rows, 1000, "0/0/0", "0/0/0", 1.0)
        commit = throughput.commit_of(old)
        assert commit and commit == throughput.commit_of(REPO)
        assert "| tflm, JAX | 1 | 50 |" in table
        assert f"| tflm, JAX, old ({commit}) | 1 | 25 |" in table
        assert f"this checkout, commit {commit}" in table
        assert "--checkout old=TFLM_CHECKOUT" in throughput.command_line(args)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=REPO,
                       capture_output=True)


def test_a_checkout_that_is_not_tflm_is_refused(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "bench.training.reference_throughput",
                           "--no-reference", "--reference", "x", "--checkout",
                           f"old={tmp_path}"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    assert f"--checkout old={tmp_path}: give LABEL=PATH" in proc.stderr
