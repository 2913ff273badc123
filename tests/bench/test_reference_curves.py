"""bench.reproductions.reference_curves: the preset as main.py's flags, main.py's epoch lines
read back, the cut text both sides read, the gap-within-spread verdict; and
reference_launcher's weight-drop shim on a module laid out as the reference's WeightDrop."""

import sys
import types

import numpy as np
import pytest

from bench.reproductions import reference_curves as rc
from zoo.runs.config import resolve_config


def _flags(config, **kwargs):
    flags = rc.reference_flags(config, 141, 3, "text", "m.pt", cuda=False, **kwargs)
    return dict(zip(flags[::2], flags[1::2])), flags


def test_the_awd_lstm_preset_is_the_readmes_main_py_command():
    """The preset's reference command (README: --batch_size 20 --dropouti 0.4 --dropouth
    0.25 --seed 141, the rest main.py's defaults) as flags."""
    flags, listed = _flags(resolve_config("awd_lstm_ptb", []))
    assert (flags["--batch_size"], flags["--dropouti"], flags["--dropouth"]) == ("20", "0.4", "0.25")
    assert (flags["--emsize"], flags["--nhid"], flags["--nlayers"]) == ("400", "1150", "3")
    assert (flags["--lr"], flags["--clip"], flags["--bptt"], flags["--wdecay"]) == (
        "30.0", "0.25", "70", "1.2e-06")
    assert (flags["--dropout"], flags["--dropoute"], flags["--wdrop"]) == ("0.4", "0.1", "0.5")
    assert (flags["--alpha"], flags["--beta"], flags["--nonmono"]) == ("2.0", "1.0", "5")
    assert flags["--seed"] == "141" and flags["--epochs"] == "3" and listed[-1] == "--cuda"


def test_the_mos_preset_is_zihangdai_mos_readme_command():
    """MoS' README: --dropouti 0.4 --dropoutl 0.29 --dropouth 0.225 --seed 28 --batch_size 12
    --lr 20.0 --nhid 960 --nhidlast 620 --emsize 280 --n_experts 15 --single_gpu, its
    windows capped at bptt + max_seq_len_delta (40, its default)."""
    config = resolve_config("awd_lstm_mos_ptb", [])
    assert rc.reference_program(config) == "mos"
    flags, listed = _flags(config)
    assert (flags["--dropouti"], flags["--dropoutl"], flags["--dropouth"]) == (
        "0.4", "0.29", "0.225")
    assert (flags["--batch_size"], flags["--lr"], flags["--n_experts"]) == ("12", "20.0", "15")
    assert (flags["--nhid"], flags["--nhidlast"], flags["--emsize"]) == ("960", "620", "280")
    assert flags["--max_seq_len_delta"] == "40" and "--single_gpu" in listed


def test_a_checkout_of_the_other_reference_is_refused(tmp_path):
    (tmp_path / "main.py").write_text("parser.add_argument('--n_experts')\n")
    with pytest.raises(SystemExit, match="salesforce/awd-lstm-lm's main.py"):
        rc.check_checkout(tmp_path, "salesforce")
    rc.check_checkout(tmp_path, "mos")


def test_a_setting_main_py_cannot_take_is_refused():
    with pytest.raises(SystemExit, match="salesforce/awd-lstm-lm's main.py .softmax. or "
                                         "zihangdai/mos's .mos. only"):
        _flags(resolve_config("awd_lstm_doc_ptb", []))
    with pytest.raises(SystemExit, match="training.max_seq_len=90: main.py has no such"):
        _flags(resolve_config("awd_lstm_ptb", ["training.max_seq_len=90"]))
    with pytest.raises(SystemExit, match="eval_batch_size=20: main.py always uses 10"):
        _flags(resolve_config("awd_lstm_ptb", ["training.eval_batch_size=20"]))


def test_main_py_epoch_lines_are_read_back():
    out = ("| epoch   1 |   200/  663 batches | lr 30.00000 | ms/batch 1.00 | loss  6.50 | ppl"
           "   665.14 | bpc    9.378\n" + "-" * 89 + "\n"
           "| end of epoch   1 | time: 12.00s | valid loss  5.70 | valid ppl   298.87 | valid bpc"
           "    8.223\n| end of epoch   2 | time: 12.10s | valid loss  5.30 | valid ppl   200.34"
           " | valid bpc    7.646\n")
    assert rc.reference_curve(out) == [298.87, 200.34]


def test_the_text_is_cut_at_whole_lines_and_the_vocabulary_in_main_pys_order(tmp_path):
    source = tmp_path / "penn"
    source.mkdir()
    (source / "ptb.train.txt").write_text(" a b\n c\n d e f\n")
    (source / "ptb.valid.txt").write_text(" b g\n h\n")
    (source / "ptb.test.txt").write_text(" z\n")
    assert rc.cut_split([" a b", " c", " d e f"], 5) == [" a b", " c"]  # 3 + 2 tokens
    assert rc.cut_split([" a b"], None) == [" a b"]
    size = rc.write_text(source, tmp_path / "text", 5, 3)
    assert (tmp_path / "text" / "train.txt").read_text() == " a b\n c\n"
    assert (tmp_path / "text" / "valid.txt").read_text() == " b g\n"
    vocab = (tmp_path / "text" / "vocab.txt").read_text().split()
    assert vocab == ["a", "b", "<eos>", "c", "g", "z"] and size == 6


def test_within_the_spread_only_when_the_gap_is_at_most_it():
    curves = {("keras", 1): [100.0, 80.0], ("keras", 2): [110.0, 82.0],
              ("peer", 1): [104.0, 90.0], ("peer", 2): [108.0, 91.0]}
    text, within = rc.table(curves, [1, 2], "note")
    assert not within  # epoch 2: gap 9.5 > spread 2
    rows = [line for line in text.splitlines() if line.startswith("| 1 ") or line.startswith("| 2 ")]
    assert rows[0].endswith("| 1.0 | 10.0 | yes | 2/4 |")  # 100 < 104, 108; 110 < neither
    assert rows[1].endswith("| 9.5 | 2.0 | no | 4/4 |")
    curves["peer", 1][1], curves["peer", 2][1] = 81.0, 83.0
    assert rc.table(curves, [1, 2], "note")[1]


def reference_weight_drop():
    """A module laid out as the reference's WeightDrop (weight_drop.py)."""
    import torch
    from torch.nn import Parameter

    class WeightDrop(torch.nn.Module):
        def __init__(self, module, weights, dropout=0.0):
            super().__init__()
            self.module, self.weights, self.dropout, self.variational = (
                module, weights, dropout, False)
            for name in weights:
                data = getattr(module, name).data
                del module._parameters[name]
                module.register_parameter(name + "_raw", Parameter(data))

        def _setweights(self):  # the unshimmed behaviour: the raw Parameter in evaluation
            for name in self.weights:
                raw = getattr(self.module, name + "_raw")
                setattr(self.module, name, torch.nn.functional.dropout(
                    raw, p=self.dropout, training=self.training))

        def forward(self, *args):
            self._setweights()
            return self.module.forward(*args)


    return WeightDrop


def test_the_launcher_shim_trains_the_raw_weight_and_evaluates_between_steps(monkeypatch):
    """On a module laid out as the reference's WeightDrop (the raw weight registered as
    `<name>_raw`, the LSTM's own deleted), training reaches the raw weight's gradient and an
    evaluation pass no longer breaks the next training step (issue #79)."""
    torch = pytest.importorskip("torch")
    WeightDrop = reference_weight_drop()
    monkeypatch.setitem(sys.modules, "weight_drop", types.SimpleNamespace(WeightDrop=WeightDrop))
    from bench.reproductions import reference_launcher
    monkeypatch.setattr(torch, "load", torch.load)  # undone after the test
    reference_launcher.apply_shims()
    torch.manual_seed(0)
    lstm = WeightDrop(torch.nn.LSTM(3, 4), ["weight_hh_l0"], dropout=0.5)
    x = torch.randn(5, 2, 3)
    for training in (True, False, True):
        lstm.train(training)
        out, _ = lstm(x)
        if training:
            out.sum().backward()
    grad = lstm.module.weight_hh_l0_raw.grad
    assert grad is not None and np.isfinite(grad.numpy()).all() and grad.abs().sum() > 0
    assert "weight_hh_l0" not in dict(lstm.module.named_parameters())


def test_our_weights_reach_main_pys_model_under_its_names(monkeypatch):
    """`salesforce_arrays` + `reference_constructor` + the launcher's `reference_model` on a
    model laid out as main.py's `RNNModel` (encoder, WeightDrop-wrapped LSTMs whose
    recurrent matrix is `weight_hh_l0_raw`, the decoder tied): every parameter is named,
    shaped and valued as our model's (kernels transposed)."""
    torch = pytest.importorskip("torch")
    from torch import nn

    WeightDrop = reference_weight_drop()

    class RNNModel(nn.Module):  # model.py's layout, the LSTM branch
        def __init__(self, rnn_type, ntoken, ninp, nhid, nlayers, dropout, dropouth, dropouti,
                     dropoute, wdrop, tie_weights):
            super().__init__()
            assert rnn_type == "LSTM" and tie_weights
            self.encoder = nn.Embedding(ntoken, ninp)
            self.rnns = nn.ModuleList([WeightDrop(nn.LSTM(
                ninp if l == 0 else nhid, nhid if l != nlayers - 1 else ninp),
                ["weight_hh_l0"], dropout=wdrop) for l in range(nlayers)])
            self.decoder = nn.Linear(nhid if nlayers == 1 else ninp, ntoken)
            self.decoder.weight = self.encoder.weight

    monkeypatch.setitem(sys.modules, "model", types.SimpleNamespace(RNNModel=RNNModel))
    from bench.reproductions.reference_launcher import reference_model
    from zoo.runs.builders import build_model
    from zoo.runs.settings import RunSettings

    config = resolve_config("awd_lstm_ptb", ["model.embed_dim=4", "model.hidden_dim=6"])
    ours = build_model(RunSettings.from_config(config), 11)
    ours.build((None, None))
    net = reference_model(rc.salesforce_arrays(ours), rc.reference_constructor(config, 11))
    params = dict(net.named_parameters())
    assert len(params) == 2 + 4 * 3
    np.testing.assert_array_equal(params["encoder.weight"].detach().numpy(),
                                  ours.backbone.embedding.embeddings.numpy())
    for l, lstm in enumerate(ours.backbone.lstms):
        np.testing.assert_array_equal(
            params[f"rnns.{l}.module.weight_hh_l0_raw"].detach().numpy(),
            lstm.cell.recurrent_kernel.numpy().T)
        np.testing.assert_array_equal(params[f"rnns.{l}.module.bias_hh_l0"].detach().numpy(),
                                      lstm.recurrent_bias.numpy())
    with pytest.raises(SystemExit, match="the arrays name"):
        reference_model({"encoder.weight": np.zeros((11, 4))}, rc.reference_constructor(config, 11))


def test_main_py_timings_and_the_launchers_counts_are_read_back():
    out = ("| epoch   1 |   200/  663 batches | lr 30.00000 | ms/batch 15.00 | loss  6.50 |\n"
           "| epoch   1 |   400/  663 batches | lr 30.00000 | ms/batch 17.00 | loss  6.20 |\n"
           "| end of epoch   1 | time: 12.50s | valid loss  5.70 | valid ppl   298.87 |\n"
           "| end of epoch   2 | time: 11.25s | valid loss  5.30 | valid ppl   200.34 |\n"
           "reference_launcher: train windows 1300, target positions 1755000, peak CUDA "
           "allocator MiB 2048.5\n")
    timing = rc.reference_timing(out)
    assert timing == {"epoch_seconds": [12.5, 11.25], "ms_per_batch": [16.0, None],
                      "windows": 1300, "targets": 1755000, "peak_mib": 2048.5}
    assert rc.reference_timing(out.replace("2048.5", "-"))["peak_mib"] is None


def test_the_timing_table_gives_main_pys_words_per_second_from_its_counts():
    timings = {("peer", 1): {"epoch_seconds": [12.0, 11.0], "ms_per_batch": [15.0, 13.5],
                             "windows": 100, "targets": 135000, "peak_mib": None,
                             "wall_seconds": 40.0},
               ("keras", 1): {"epoch_seconds": [30.0, 9.0], "words_per_second": [5e4, 1.2e5],
                              "wall_seconds": 60.0, "peak_mib": 1500.0}}
    rows = rc.timing_table(timings).splitlines()[2:]
    assert rows[0] == "| tflm | 1 | 30.0 | 9.0 | 120,000 | 60.0 | 1,500 |"
    # 1,350 targets a window over 13.5 ms
    assert rows[1] == "| main.py | 1 | 12.0 | 11.0 | 100,000 | 40.0 | - |"


def test_the_launcher_counts_training_windows_and_scales_only_a_cut_one(monkeypatch):
    """`count_and_scale`: main.py's `train()` asks `get_batch` for windows of drawn lengths;
    the last one is cut at the end of the data. The counts cover `train()`'s calls only, and
    with the real-length shim the cut window's rate is scaled by real / drawn (a whole one's
    and `evaluate()`'s are left alone)."""
    torch = pytest.importorskip("torch")
    from bench.reproductions import reference_launcher

    def get_batch(source, i, args, seq_len=None, evaluation=False):
        seq_len = min(seq_len if seq_len else args.bptt, len(source) - 1 - i)
        return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].reshape(-1)

    monkeypatch.setitem(sys.modules, "utils", types.SimpleNamespace(get_batch=get_batch))
    counts, _ = reference_launcher.count_and_scale(real_length_rate=True)
    utils = sys.modules["utils"]
    source, args = torch.zeros(101, 4), types.SimpleNamespace(bptt=70)
    optimizer = types.SimpleNamespace(param_groups=[{"lr": 0.0}])
    namespace = {"utils": utils, "optimizer": optimizer}
    exec("def train(i, seq_len):\n"
         "    optimizer.param_groups[0]['lr'] = 30.0 * seq_len / 70\n"
         "    data, _ = utils.get_batch(source, i, args, seq_len=seq_len)\n"
         "    return len(data), optimizer.param_groups[0]['lr']\n"
         "def evaluate(i):\n"
         "    optimizer.param_groups[0]['lr'] = 30.0\n"
         "    data, _ = utils.get_batch(source, i, args, evaluation=True)\n"
         "    return len(data), optimizer.param_groups[0]['lr']\n",
         {**namespace, "source": source, "args": args}, namespace)
    assert namespace["train"](0, 60) == (60, pytest.approx(30.0 * 60 / 70))
    assert namespace["train"](60, 65) == (40, pytest.approx(30.0 * 40 / 70))  # cut: 100 - 60
    assert namespace["evaluate"](80) == (20, 30.0)
    assert counts == {"windows": 2, "targets": (60 + 40) * 4}
    counts, _ = reference_launcher.count_and_scale(real_length_rate=False)
    assert namespace["train"](60, 65) == (40, pytest.approx(30.0 * 65 / 70))  # main.py's rule


@pytest.mark.parametrize("flags, collected", [([], True), (["--no-gc-collect"], False),
                                              (["--real-length-rate", "--no-gc-collect"],
                                               False)])
def test_the_gc_experiment_skips_only_main_pys_collections(tmp_path, flags, collected):
    """`reference_launcher.py CHECKOUT --no-gc-collect ...`: main.py's `gc.collect()` returns
    at once (a cycle it made stays alive), its own flags reach it unchanged; without the
    experiment the same call collects the cycle."""
    pytest.importorskip("torch")
    import subprocess
    from bench.reproductions import reference_launcher
    (tmp_path / "weight_drop.py").write_text("class WeightDrop:\n    pass\n")
    (tmp_path / "utils.py").write_text("def get_batch(source, i, args, seq_len=None):\n"
                                       "    return None\n")
    (tmp_path / "main.py").write_text(
        "import gc, sys, weakref\n"
        "gc.disable()\n"
        "class Node:\n    pass\n"
        "a, b = Node(), Node()\n"
        "a.other, b.other = b, a\n"
        "alive = weakref.ref(a)\n"
        "del a, b\n"
        "gc.collect()\n"
        "print('collected', alive() is None, 'argv', sys.argv[1:])\n")
    proc = subprocess.run([sys.executable, reference_launcher.__file__, str(tmp_path), *flags,
                           "--epochs", "3"], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"collected {collected} argv ['--epochs', '3']" in proc.stdout
