"""The embedding projector as a user opens it: a real TensorBoard server on localhost,
started from another directory, asked through its HTTP API (the projector plugin's routes)."""

import json
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np

from tflm.event_files import EventWriter
from tflm.tensorboard import EmbeddingProjector

TENSOR = "embedding/.ATTRIBUTES/VARIABLE_VALUE"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(port, route, timeout=30):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{route}", timeout=timeout) as r:
        return r.read().decode("utf-8")


def _wait_for_runs(port, server, deadline):
    while time.time() < deadline:
        if server.poll() is not None:
            break
        try:
            runs = json.loads(_get(port, "/data/plugin/projector/runs"))
            if runs:
                return runs
        except (OSError, json.JSONDecodeError):  # not up yet (URLError, timeout)
            pass
        time.sleep(0.5)
    return []


def test_projector_lists_the_run_with_shape_and_metadata_from_any_directory(tmp_path):
    """Every run the projector lists shows the words (issue 43): the scalar runs beside the
    embedding (train, validation, evaluation, as `zoo.train` and `zoo.evaluate` write them)
    list its checkpoint too, and the projector opens the first of them."""
    run = tmp_path / "run"
    (run / "checkpoint").mkdir(parents=True)  # a zoo run's epoch checkpoint folder
    (run / "checkpoint" / "model.keras").write_bytes(b"not a TF checkpoint state file")
    for name in ("train", "validation", "evaluation"):
        with EventWriter(run / "logs" / name) as events:
            events.scalar("epoch_perplexity", 100.0, 0)
    words = [f"w{i}" for i in range(30)]
    matrix = np.random.default_rng(0).normal(size=(30, 6)).astype("float32")
    projector = EmbeddingProjector(run / "logs", words, get_matrix=lambda: matrix,
                                   runs=("train", "validation", "evaluation"))
    projector.on_epoch_end(0)
    projector.on_epoch_end(1)  # a later epoch replaces the first
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(run / "logs"),
         "--host", "127.0.0.1", "--port", str(port)],
        cwd=elsewhere, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        runs = _wait_for_runs(port, server, time.time() + 120)
        assert sorted(runs) == [".", "evaluation", "train", "validation"], runs
        for listed in runs:
            info = json.loads(_get(port, f"/data/plugin/projector/info?run={listed}"))
            [embedding] = info["embeddings"]
            assert embedding["tensorName"] == TENSOR and embedding["tensorShape"] == [30, 6]
            metadata = _get(port, f"/data/plugin/projector/metadata?run={listed}&name={TENSOR}")
            assert metadata.splitlines() == words, listed
        raw = urllib.request.urlopen(
            f"http://127.0.0.1:{port}/data/plugin/projector/tensor?run=.&name={TENSOR}",
            timeout=30).read()
        np.testing.assert_array_equal(np.frombuffer(raw, "<f4").reshape(30, 6), matrix)
    finally:
        server.terminate()
        log = server.communicate(timeout=30)[0]
    assert "FailedPrecondition" not in log and "not found" not in log, log[-3000:]
    assert sorted(p.name for p in (run / "logs").glob("embedding-*.index")) == [
        "embedding-2.index"]
