"""The softmax bottleneck on a known high-rank language: MoS beats softmax, ranks as theory says."""

from tools.bottleneck_demo import DIM, run


def test_mos_breaks_the_softmax_bottleneck(tmp_path):
    results, optimal = run(epochs=16, seed=0, out_dir=tmp_path)
    softmax, mos = results["softmax"], results["mos"]
    assert softmax["press_rank"] == DIM + 2, softmax
    assert mos["press_rank"] > 5 * (DIM + 2), mos
    assert mos["val_perplexity"] < 0.95 * softmax["val_perplexity"], (mos, softmax)
    assert optimal < mos["val_perplexity"]
