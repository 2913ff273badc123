"""bench.gpu_session: the stage folders read back into issue 41's targets (each met or
missed from its own figures), the packing of a stage's text files, and which stages run
(the A/B against a base tree only where one is carried)."""

import json
import os
import tarfile

import pytest

from bench import gpu_session


def _write(path, value):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value) if not isinstance(value, str) else value)


def test_the_report_reads_each_target_from_its_stage(tmp_path):
    ref = {"epoch_seconds": [10.0, 9.0], "ms_per_batch": [14.0, 14.0], "windows": 100,
           "targets": 140000, "wall_seconds": 40.0, "peak_mib": 600.0}
    _write(tmp_path / "curves" / "reference_curves_gpu.json", {
        "curves": {"keras-141": [300.0, 200.0], "keras-142": [305.0, 210.0],
                   "peer-141": [330.0, 205.0], "peer-142": [340.0, 206.0]},
        "timings": {"keras-141": {"epoch_seconds": [12.0, 8.0], "wall_seconds": 39.0,
                                  "words_per_second": [9e4, 1.4e5]},
                    "keras-142": {"epoch_seconds": [11.0, 8.0], "wall_seconds": 30.0,
                                  "words_per_second": [9e4, 1.2e5]},
                    "peer-141": ref, "peer-142": ref}})
    _write(tmp_path / "torch" / "results.json",
           {"backends": [{"train_words_per_s_steady": 90000.0}]})
    _write(tmp_path / "mos" / "reference-141" / "stdout.txt",
           "| epoch   1 |    20/   71 batches | lr 20.00 | ms/batch 100.00 | loss  7.83 |\n"
           "| end of epoch   1 | time: 12.00s | valid loss  5.70 | valid ppl   298.87 |\n"
           "reference_launcher: train windows 10, target positions 8000, peak CUDA "
           "allocator MiB 1700.0\n")
    # 80,000 tokens in 10 steps, 4 s after the first: 72,000 / 4 = 18,000 words/s once warm
    _write(tmp_path / "mos" / "tflm-142" / "metrics.json",
           {"history": [{"words_per_second": 16000.0, "train_seconds": 5.0,
                         "first_step_seconds": 1.0, "train_steps": 10,
                         "train_step_traces": 1}], "device_memory_mib": 1500.0})
    # a second compile inside the epoch: no warm figure from this seed
    _write(tmp_path / "mos" / "tflm-141" / "metrics.json",
           {"history": [{"words_per_second": 8000.0, "train_seconds": 10.0,
                         "first_step_seconds": 6.0, "train_steps": 10,
                         "train_step_traces": 2}], "device_memory_mib": 1600.0})
    _write(tmp_path / "curves" / "tflm-141" / "metrics.json",
           {"history": [{"train_step_traces": 1}, {"train_step_traces": 0}]})
    for n, wall, busy in ((72, 18.0, 12.0), (88, 19.8, 13.0)):
        _write(tmp_path / f"pad-{n}" / "step_profile.json",
               {"rows": [{"wall_ms": wall, "busy_ms": busy}]})
    _write(tmp_path / "bf16" / "run" / "metrics.json",
           {"history": [{"val_perplexity": 310.0, "words_per_second": 8e4},
                        {"val_perplexity": 199.0, "words_per_second": 1.5e5}],
            "test_perplexity": 195.0})
    rows = {line.split(" | ")[0].lstrip("| "): line
            for line in gpu_session.report(tmp_path).splitlines() if line.startswith("| ")}
    # main.py: 1,400 targets a window / 14 ms = 100,000 words/s; tflm 130,000 (mean)
    assert rows["AWD-LSTM: fastest Keras backend's training words/s once warm >= 1.3x "
                "main.py's"].endswith("= 1.30x | met |")
    assert "12.0 s (seed 141, empty compilation cache) / 10.0 s = 1.20x | met" in rows[
        "AWD-LSTM: first epoch (compiles included) <= 1.3x main.py's"]
    assert "39.0 s" in rows["AWD-LSTM: a whole 3-epoch run takes less wall time than "
                            "main.py's"] and "= 0.97x | met" in rows[
        "AWD-LSTM: a whole 3-epoch run takes less wall time than main.py's"]
    # MoS main.py: 800 targets a window / 100 ms = 8,000 words/s: 2.00x, less memory
    assert "18,000 (the steps after the first, one seed) / 8,000 = 2.25x; peak 1600.0 / " \
        "1700.0 MiB | met" in rows["MoS: >= 1.5x zihangdai/mos main.py's training words/s, " \
                                   "no more memory"]
    assert "seed 141: 1 / 0 |" in rows["AWD-LSTM: training programs compiled per epoch "
                                      "(`train_step_traces`)"]
    assert "19.80 / 18.00 ms wall = 1.10x; busy 13.00 / 12.00 ms" in rows[
        "A padded position's cost: a bptt-70 step padded to 88 against 72 (step_profile, "
        "JAX, synchronized steps)"]
    assert "90,000 (median step, compare_frameworks) / 100,000 = 0.90x | missed" in rows[
        "Keras on PyTorch >= 1.0x main.py"]
    assert "150,000 vs 140,000 (1.07x); valid ppl by epoch 310.0 / 199.0 vs 300.0 / 200.0" in \
        rows["mixed_bfloat16: speed and perplexity against float32 (measured)"]


def test_the_precision_stages_set_each_mixed_policy_beside_float32_of_the_session(tmp_path):
    for stage, ppl, words, test in (("bf16", (310.0, 199.0), 1.5e5, 195.0),
                                    ("f16", (305.0, 202.0), 1.8e5, 197.0),
                                    ("f32", (300.0, 201.5), 1.2e5, 196.25)):
        _write(tmp_path / stage / "run" / "metrics.json",
               {"history": [{"val_perplexity": ppl[0], "words_per_second": 8e4},
                            {"val_perplexity": ppl[1], "words_per_second": words}],
                "test_perplexity": test})
    row = [line for line in gpu_session.report(tmp_path).splitlines()
           if line.startswith("| mixed_bfloat16")]
    assert row == ["| mixed_bfloat16: speed and perplexity against float32 (measured) | "
                   "epoch 2 words/s 150,000 vs 120,000 (1.25x); valid ppl by epoch 310.0 / "
                   "199.0 vs 300.0 / 201.5 (seed 141, same session); test 195.0 vs 196.2 | - |"]
    row = [line for line in gpu_session.report(tmp_path).splitlines()
           if line.startswith("| mixed_float16")]
    assert row == ["| mixed_float16: speed and perplexity against float32 (measured) | "
                   "epoch 2 words/s 180,000 vs 120,000 (1.50x); valid ppl by epoch 305.0 / "
                   "202.0 vs 300.0 / 201.5 (seed 141, same session); test 197.0 vs 196.2 | - |"]
    (tmp_path / "f32" / "run" / "metrics.json").unlink()  # no float32 run: no rows
    assert not [line for line in gpu_session.report(tmp_path).splitlines() if "mixed" in line]


def test_the_mos_head_stage_reads_both_modes(tmp_path):
    _write(tmp_path / "mos-head" / "mos_targets.json",
           {"batched": {"seconds": 0.0125, "peak_mib": 2048.0},
            "targets": {"seconds": 0.005, "peak_mib": 512.0}})
    (row,) = [line for line in gpu_session.report(tmp_path).splitlines()
              if line.startswith("| MoS head")]
    assert row.endswith("| 5.0 / 12.5 ms a step = 2.50x; peak 512 / 2,048 MiB | - |")


def test_the_torch_mos_head_stage_reads_the_whole_window_and_the_chunks(tmp_path):
    _write(tmp_path / "mos-head-torch" / "mos_targets_torch.json",
           {"batched": {"seconds": 0.02, "peak_mib": 2000.0},
            "targets": {"seconds": 0.01, "peak_mib": 1900.0},
            "chunked": {"seconds": 0.025, "peak_mib": 400.0}})
    (row,) = [line for line in gpu_session.report(tmp_path).splitlines()
              if line.startswith("| MoS head on Keras on PyTorch")]
    assert row.endswith("| targets 10.0 / 20.0 ms a step = 2.00x, peak 1,900 / 2,000 MiB; "
                        "chunked 25.0 / 20.0 ms a step = 0.80x, peak 400 / 2,000 MiB | - |")


def test_a_stage_that_did_not_run_leaves_its_targets_out(tmp_path):
    assert gpu_session.report(tmp_path).splitlines()[2:] == []


def test_a_stage_is_packed_without_models_or_the_corpus_copy(tmp_path):
    stage = tmp_path / "curves"
    for name in ("reference_curves_gpu.md", "tflm-141/metrics.json", "text/train.txt",
                 "tflm-141/best.keras", "reference-141/model.pt"):
        _write(stage / name, "x")
    archive = tmp_path / "curves.tgz"
    gpu_session.pack(stage, archive)
    with tarfile.open(archive) as tar:
        assert sorted(tar.getnames()) == ["curves/reference_curves_gpu.md",
                                          "curves/tflm-141/metrics.json"]


def _profile_row(system, wall, busy, words):
    return {"system": system, "wall_ms": wall, "busy_ms": busy, "idle_share": 1 - busy / wall,
            "kernels_per_step": 800, "words_per_s": words, "peak_memory_mib": 900.0}


def test_the_torch_stages_give_the_target_and_the_a_b(tmp_path):
    from bench.training.step_profile import REFERENCE, REFERENCES
    _write(tmp_path / "torch" / "step_profile.json", {"rows": [
        _profile_row("tflm, torch", 20.0, 15.0, 70000.0),
        _profile_row(REFERENCE, 16.0, 12.0, 87500.0)]})
    _write(tmp_path / "torch-compile" / "step_profile.json", {"rows": [
        _profile_row("tflm, torch", 14.0, 13.0, 100000.0)]})
    _write(tmp_path / "torch-base" / "step_profile.json", {"rows": [
        _profile_row("tflm, torch", 30.0, 15.0, 46667.0)]})
    _write(tmp_path / "mos-profile" / "step_profile.json", {"rows": [
        _profile_row("tflm, jax", 25.0, 20.0, 33600.0),
        _profile_row(REFERENCES["mos"], 20.0, 18.0, 42000.0)]})
    text = gpu_session.report(tmp_path)
    rows = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines()
            if line.startswith("| ")}
    assert ("70,000 / 87,500 words/s = 0.80x; GPU idle 25% / 25% | missed" in rows[
        "Keras on PyTorch >= 1.0x main.py at the AWD-LSTM preset's size (step_profile: one "
        "synchronized step)"])
    assert rows["Keras on PyTorch with `jit_compile=True` (the forward pass compiled, "
                "`tflm.backends.torch_compiled_step`) >= 1.0x main.py at the AWD-LSTM "
                "preset's size (step_profile)"].endswith(
        "| 100,000 / 87,500 words/s = 1.14x; GPU idle 7%; kernels a step 800 | met |")
    assert "Keras on PyTorch, jit_compile=True (`torch-compile`" in text
    assert "20.00 / 30.00 ms a step = 1.50x the speed; GPU idle 25% / 50% | - |" in rows[
        "Keras on PyTorch, this tree against the base tree (an A/B)"]
    assert "Keras on PyTorch, the Mogrifier preset, this tree against the base tree (an A/B)" \
        not in rows  # its stages did not run
    _write(tmp_path / "mogrifier-torch" / "step_profile.json",
           {"rows": [_profile_row("tflm, torch", 40.0, 10.0, 1000.0)]})
    _write(tmp_path / "mogrifier-torch-base" / "step_profile.json",
           {"rows": [_profile_row("tflm, torch", 100.0, 10.0, 400.0)]})
    rows = {line.split(" | ")[0].lstrip("| "): line
            for line in gpu_session.report(tmp_path).splitlines() if line.startswith("| ")}
    assert "40.00 / 100.00 ms a step = 2.50x the speed; GPU idle 75% / 90% | - |" in rows[
        "Keras on PyTorch, the Mogrifier preset, this tree against the base tree (an A/B)"]
    assert "the MoS preset (`mos-profile`" in text
    assert "Keras on PyTorch >= 1.0x main.py: `zoo.train`" not in text  # no such stage here
    # 10 steps of 1,000 tokens, 1.8 s after the first: 9,000 / 1.8 = 5,000 words/s once warm
    _write(tmp_path / "torch-train" / "tflm-141" / "metrics.json",
           {"history": [{"words_per_second": 4000.0, "train_seconds": 2.5,
                         "first_step_seconds": 0.7, "train_steps": 10,
                         "train_step_traces": 1}], "device_memory_mib": 900.0})
    _write(tmp_path / "torch-train" / "reference-141" / "stdout.txt",
           "| epoch   1 |    10/   71 batches | lr 30.00 | ms/batch 250.00 | loss  7.83 |\n"
           "| end of epoch   1 | time: 12.00s | valid loss  5.70 | valid ppl   298.87 |\n"
           "reference_launcher: train windows 10, target positions 10000, peak CUDA "
           "allocator MiB 700.0\n")
    rows = {line.split(" | ")[0].lstrip("| "): line
            for line in gpu_session.report(tmp_path).splitlines() if line.startswith("| ")}
    # main.py: 1,000 targets a window / 250 ms = 4,000 words/s
    assert "5,000 (mean of 1 seed(s)) / 4,000 = 1.25x; peak 900 / 700 MiB | met" in rows[
        "Keras on PyTorch >= 1.0x main.py: `zoo.train`, one epoch (training words/s once warm)"]
    assert "| zihangdai/mos main.py's step | 20.00 | 18.00 | 10% | 800 | 900 |" in text


def test_the_steps_per_execution_stage_gives_its_a_b_row(tmp_path):
    _write(tmp_path / "spe" / "steps_per_execution.json", {"k": 8, "results": {
        "preset": {"one": 0.0169, "k": 0.013, "first_one": 20.0, "first_k": 24.5,
                   "diff": 2e-7, "traces": [1, 1], "preset": "awd_lstm_ptb"}}})
    known = gpu_session.stages(tmp_path / "work", tmp_path / "carried", small=False)
    command = known["spe"][2]
    assert command[command.index("--sizes") + 1:command.index("--k")] == ["preset", "mos"]
    assert command[command.index("--json") + 1] == str(
        tmp_path / "work" / "spe" / "steps_per_execution.json")
    rows = [line for line in gpu_session.report(tmp_path).splitlines()
            if "steps_per_execution" in line]
    assert rows == ["| `awd_lstm_ptb` (preset): steps_per_execution 8 (one scan a dispatch) "
                    "against 1 (JAX, same windows) | 16.90 / 13.00 ms a window = 1.30x; "
                    "first epoch (compiles) 20.0 / 24.5 s; weights within 2.0e-07 | - |"]


def test_the_default_stages_leave_the_a_b_out_without_a_base_tree(tmp_path, monkeypatch):
    carried = tmp_path / "carried"
    for name in ("data/penn/train.txt", "awd-lstm-lm/main.py", "mos/main.py"):
        _write(carried / name, "x")
    ran = []
    monkeypatch.setattr(gpu_session, "run_stage", lambda name, *rest: ran.append(name) or {
        "stage": name, "status": "exit 0", "seconds": 0})
    argv = ["--out", str(tmp_path / "out"), "--carried", str(carried), "--work",
            str(tmp_path / "work")]
    assert gpu_session.main(argv) == 0
    assert ran == ["info", "spe", "mos-head", "mos-profile", "torch", "torch-compile", "mos",
                   "torch-train", "f16", "f32", "bf16", "mos-head-torch",
                   "mos-profile-torch"]
    _write(carried / "tree-base" / "zoo" / "train.py", "x")
    ran.clear()
    assert gpu_session.main(argv + ["--stages", "torch", "torch-base"]) == 0
    assert ran == ["torch", "torch-base"]
    known = gpu_session.stages(tmp_path / "work", carried, small=False)
    assert known["torch-base"][3] == carried / "tree-base"  # run from the base tree
    assert known["torch-base"][1]["PYTHONPATH"].split(os.pathsep)[0] == str(
        carried / "tree-base")
    with pytest.raises(SystemExit):
        gpu_session.main(argv + ["--stages", "nope"])
