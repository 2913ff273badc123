"""A run outlasts its machine (issue 46): started on JAX (a GPU image without TensorFlow,
say), it is resumed with `--resume` on TensorFlow (a CPU) from its checkpoint, and goes on
as the JAX run itself would have: with dropout off both backends compute the same function,
so the resumed second epoch matches a JAX run of two epochs to float tolerance."""

import json
import textwrap

import pytest

from tests.backends import run_in_backend
from tests.conftest import TINY_RUN_FLAGS
from zoo import train

FLAGS = [*TINY_RUN_FLAGS, "--seed", "3", "--set", "training.lr=5",
         *[arg for key in ("dropout", "dropout_h", "dropout_i", "dropout_e", "weight_dropout")
           for arg in ("--set", f"model.{key}=0")]]


def test_a_jax_run_resumes_on_tensorflow(tmp_path, capsys):
    code = textwrap.dedent(f"""
        from zoo import train
        assert train.main(["--epochs", "1", "--out", {str(tmp_path / "moved")!r}, *{FLAGS!r}]) == 0
        assert train.main(["--epochs", "2", "--out", {str(tmp_path / "stayed")!r}, *{FLAGS!r}]) == 0
    """)
    run_in_backend("jax", code)
    moved = tmp_path / "moved"
    before = json.loads((moved / "metrics.json").read_text())
    assert before["backend"] == "jax"
    assert train.main(["--resume", str(moved), "--epochs", "2", "--quiet"]) == 0
    assert f"resuming from the checkpoint of epoch 1 in {moved / 'checkpoint'}" in (
        capsys.readouterr().out)
    after = json.loads((moved / "metrics.json").read_text())
    stayed = json.loads((tmp_path / "stayed" / "metrics.json").read_text())
    assert after["backend"] == "tensorflow"
    assert after["history"][0] == before["history"][0]  # the JAX epoch, kept as it was
    for key in ("loss", "val_perplexity"):
        assert after["history"][1][key] == pytest.approx(stayed["history"][1][key], rel=1e-3)
    assert after["test_perplexity"] == pytest.approx(stayed["test_perplexity"], rel=1e-3)
