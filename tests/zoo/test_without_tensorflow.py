"""The main job on a machine without TensorFlow (issue 46): with KERAS_BACKEND=jax or torch
and `import tensorflow` made to fail (as where it is not installed: the import raises and
`importlib.util.find_spec` says None), `zoo.train` trains, checkpoints, saves and writes its
TensorBoard files, `zoo.evaluate` reproduces the run's test perplexity, and `zoo.dynamic_eval`,
`zoo.cache_pointer`, `zoo.generate`, `tools.qmatrix` and `tools.rank` run."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.conftest import REPO, TINY_RUN_FLAGS

NO_TENSORFLOW = 'import sys\nsys.modules["tensorflow"] = None\n'


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_train_and_evaluate_without_tensorflow(backend, tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(NO_TENSORFLOW)
    run = tmp_path / "run"
    code = textwrap.dedent(f"""
        import importlib.util, json, sys
        try:
            import tensorflow
        except ImportError:
            pass
        else:
            raise SystemExit("tensorflow imported")
        assert importlib.util.find_spec("tensorflow") is None
        from zoo import evaluate, train
        assert train.main(["--epochs", "2", "--seed", "3", "--out", {str(run)!r},
                           *{TINY_RUN_FLAGS!r}]) == 0
        assert evaluate.main([{str(run)!r}, "--batch-size", "10",
                              "--json", {str(tmp_path / "evaluate.json")!r}, "--quiet"]) == 0
        from zoo import cache_pointer, dynamic_eval, generate
        from tools import qmatrix, rank
        assert dynamic_eval.main([{str(run)!r}, "--batch-size", "10", "--max-batches", "5",
                                  "--quiet"]) == 0
        assert cache_pointer.main([{str(run)!r}, "--window", "20", "--quiet"]) == 0
        assert generate.main([{str(run)!r}, "--words", "5"]) == 0
        q = {str(tmp_path / "q.npy")!r}
        assert qmatrix.main([{str(run)!r}, "--corpus", "run", "--split", "test",
                             "--max-rows", "200", "--out", q]) == 0
        assert rank.main([q, "--json", {str(tmp_path / "ranks.json")!r}]) == 0
        assert sys.modules.get("tensorflow") is None
    """)
    env = dict(os.environ, KERAS_BACKEND=backend, JAX_PLATFORMS="cpu", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join([str(site), str(REPO)]))
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["backend"] == backend and len(metrics["history"]) == 2
    for name in ("best.keras", "final.keras", "checkpoint/model.keras", "config.json"):
        assert (run / name).is_file(), name
    evaluated = json.loads((tmp_path / "evaluate.json").read_text())
    assert evaluated["perplexity"] == pytest.approx(metrics["test_perplexity"], rel=1e-5)
    tags = {}
    for folder in ("train", "validation", "evaluation"):
        accumulator = EventAccumulator(str(run / "logs" / folder))
        accumulator.Reload()
        tags[folder] = set(accumulator.Tags()["tensors"])
    assert {"epoch_loss", "epoch_perplexity", "epoch_learning_rate"} <= tags["train"]
    assert {"epoch_perplexity", "top_predictions"} <= tags["validation"]
    assert {"evaluate/test_perplexity", "dynamic_eval/test_perplexity",
            "cache_pointer/test_perplexity"} <= tags["evaluation"]
    assert (run / "logs" / "embedding.tsv").is_file()
    assert json.loads((tmp_path / "ranks.json").read_text())["reports"]
