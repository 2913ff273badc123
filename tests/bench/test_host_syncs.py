"""bench.training.host_syncs: the counter sees a Keras-on-PyTorch step's reads and copies
by call site (the batch's two arrays copied in each step), and its table sets trees side
by side."""

import pytest

from bench.training import host_syncs


def test_a_tiny_fit_counts_the_batch_copies_and_no_dropout_read(tmp_path):
    pytest.importorskip("torch")
    [(label, result)] = host_syncs.main([
        "--set", "model.embed_dim=6", "--set", "model.hidden_dim=8", "--vocab", "30",
        "--steps", "2", "--out", str(tmp_path), "--no-publish"])
    assert label.startswith("this tree")
    counts = {(kind, site): calls for kind, site, calls in result["counts"]}
    # Keras' data adapter maps its torch conversion over (inputs, targets) with keras.tree
    batch = [calls for (kind, site), calls in counts.items()
             if kind == "copy in" and "tree_api" in site]
    assert sum(batch) == 2 * 2  # inputs and targets, each of the two steps
    assert not [site for (kind, site) in counts if "seed_generator" in site]
    assert not [site for (kind, site) in counts if "random.py" in site]


@pytest.mark.parametrize("preset, settings", [
    ("awd_lstm_mos_frage_ptb", ["model.last_dim=6", "model.frage.popular=10",
                                "model.past_decode=0.001"]),
    ("mogrifier_ptb", ['model.head={"type": "doc", "num_components_per_layer": [2, 3]}'])])
def test_the_heads_regularizers_and_optimizers_steps_copy_and_read_nothing(tmp_path, preset,
                                                                           settings):
    """MoS with FRAGE's moments, Past Decode, embedding noise and averaged SGD; the
    Mogrifier's loop and state dropout, DOC and Adam: no tflm layer or optimizer makes a
    tensor of a Python number, or reads one back, in a train step."""
    pytest.importorskip("torch")
    sets = [item for setting in ["model.embed_dim=6", "model.hidden_dim=8", *settings]
            for item in ("--set", setting)]
    [(_, result)] = host_syncs.main(["--preset", preset, *sets, "--vocab", "30", "--steps",
                                     "2", "--out", str(tmp_path), "--no-publish"])
    sites = [site for _, site, _ in result["counts"]]
    assert any("tflm/padding.py" in site for site in sites)  # its one read a step: counted
    ours = [site for site in sites if "tflm/layers/" in site or "tflm/optimizers.py" in site
            or "/rnn.py" in site]
    assert ours == []


def test_the_report_sets_the_trees_side_by_side():
    results = [("this tree (a)", {"tree": "/a", "counts": [["read", "x.py:1", 4],
                                                          ["copy in", "y.py:2", 2]]}),
               ("base (b)", {"tree": "/b", "counts": [["read", "x.py:1", 8],
                                                      ["read", "z.py:3", 6]]})]
    text = host_syncs.report(results, steps=2)
    assert "| read | 2.0 | 7.0 |" in text and "| copy in | 1.0 | 0.0 |" in text
    assert "| read | `z.py:3` | 0.0 | 3.0 |" in text
