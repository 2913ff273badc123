"""bench.training.step_profile: busy and own time of timelines, the lines read from a JAX
trace (a real one on the CPU, a GPU's layout built by hand), and a whole run at a tiny size:
tflm on JAX, and salesforce main.py's step where a checkout is found ($AWD_LSTM_LM_CHECKOUT,
else awd-lstm-lm beside the repository); zihangdai/mos main.py's step for the MoS preset
($MOS_CHECKOUT, else mos beside it), and a MoS preset refusing salesforce's code before
anything runs."""

import json
import os
import pathlib
import time
import types

import pytest

from bench.training import step_profile as sp
from tests.conftest import REPO

CHECKOUT = pathlib.Path(os.environ.get("AWD_LSTM_LM_CHECKOUT", REPO.parent / "awd-lstm-lm"))
MOS_CHECKOUT = pathlib.Path(os.environ.get("MOS_CHECKOUT", REPO.parent / "mos"))
TINY_MOS = ["--preset", "awd_lstm_mos_ptb", "--set", "model.embed_dim=16",
            "--set", "model.hidden_dim=32", "--set", "model.last_dim=24",
            "--set", "model.head.num_experts=3", "--vocab", "50", "--steps", "2",
            "--warmup", "1", "--device", "cpu", "--no-publish"]


def test_busy_time_is_the_union_and_own_time_leaves_the_children_out():
    lines = [[("while", 0, 100), ("dot", 10, 30), ("add", 50, 20)],  # one thread, nested
             [("exp", 90, 40)],  # another, overlapping the first by 10 ns
             [("MemcpyH2D", 200, 10)]]
    found = sp.timeline_summary(lines, steps=2)
    assert found["busy_ms"] == pytest.approx((130 + 10) / 2e6)
    own = {t["name"]: t["ms_per_step"] * 2e6 for t in found["top"]}
    assert own == pytest.approx({"while": 50, "dot": 30, "add": 20, "exp": 40, "MemcpyH2D": 10})
    assert found["op_ms"] == pytest.approx(150 / 2e6)
    assert found["kernels_per_step"] == 2  # four kernels in two steps; the copy left out
    assert sum(t["share"] for t in found["top"]) == pytest.approx(1.0)
    assert sp.timeline_summary([], steps=3)["busy_ms"] is None


def _line(name, *events):
    return types.SimpleNamespace(name=name, events=[
        types.SimpleNamespace(name=n, start_ns=s, duration_ns=d, stats=stats)
        for n, s, d, stats in events])


def test_on_a_gpu_the_stream_lines_are_read_and_the_derived_op_lines_are_not():
    kernel = [("kernel_details", "regs:32")]
    gpu = types.SimpleNamespace(name="/device:GPU:0", lines=[
        _line("Stream #13(Kernel,MemcpyH2D)", ("fusion_1", 0, 10, kernel),
              ("MemcpyH2D", 20, 5, [("memcpy_details", "")])),
        _line("Stream #14(Kernel)", ("gemm", 5, 10, kernel)),
        _line("XLA Ops", ("fusion.1", 0, 10, [])), _line("XLA Modules", ("jit_step", 0, 30, []))])
    host = types.SimpleNamespace(name="/host:CPU", lines=[_line("python", ("f", 0, 99, []))])
    profile = types.SimpleNamespace(planes=[host, gpu])
    source, lines, layout = sp.xplane_lines(profile)
    assert source.startswith("GPU: the 'Stream #' lines")
    assert sorted(n for line in lines for n, _, _ in line) == ["MemcpyH2D", "fusion_1", "gemm"]
    assert layout["/device:GPU:0"] == [[line.name, len(line.events)] for line in gpu.lines]
    found = sp.timeline_summary(lines, steps=1)
    assert found["busy_ms"] == pytest.approx(20 / 1e6) and found["kernels_per_step"] == 2
    gpu.lines = [line for line in gpu.lines if not line.name.startswith("Stream #")]
    gpu.lines.append(_line("Kernels?", ("gemm", 5, 10, kernel), ("marker", 0, 50, [])))
    source, lines, _ = sp.xplane_lines(profile)
    assert "no 'Stream #' line" in source
    assert [n for line in lines for n, _, _ in line] == ["gemm"]


def test_a_cpu_trace_gives_the_xla_ops_of_the_traced_steps(tmp_path):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    step = jax.jit(lambda a: jnp.tanh(a @ a).sum())
    a = jnp.ones((128, 128))
    step(a).block_until_ready()

    def run(n):
        times = []
        for _ in range(n):
            start = time.perf_counter()
            step(a).block_until_ready()
            times.append(time.perf_counter() - start)
        return times

    times, found = sp.jax_profile(run, 3, tmp_path)
    assert found["source"].startswith("CPU") and "/host:CPU" in found["layout"]
    assert found["kernels_per_step"] >= 1 and found["top"]
    assert 0 < found["busy_ms"] <= 1e3 * sum(times) / 3


@pytest.mark.slow  # 8 s; a benchmark's tool, no README claim
def test_a_tiny_run_profiles_each_system(tmp_path, monkeypatch):
    pytest.importorskip("jax")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # no spinning thread pools on a busy machine
    argv = ["--backends", "jax", "--set", "model.embed_dim=16", "--set", "model.hidden_dim=32",
            "--vocab", "50", "--steps", "3", "--warmup", "1", "--device", "cpu",
            "--no-publish", "--out", str(tmp_path)]
    reference = (CHECKOUT / "main.py").is_file()
    assert sp.main(argv + (["--reference", str(CHECKOUT)] if reference else [])) == 0
    rows = json.loads((tmp_path / "step_profile.json").read_text())["rows"]
    rows = {r["system"]: r for r in rows}
    assert set(rows) == {"tflm, jax"} | ({sp.REFERENCE} if reference else set())
    for r in rows.values():
        assert (r["batch"], r["bptt"], r["tokens_per_step"]) == (20, 70, 20 * 70)
        assert len(r["step_ms"]) == 3 and r["wall_ms"] > 0
        assert r["words_per_s"] == pytest.approx(r["tokens_per_step"] / r["wall_ms"] * 1e3)
        assert 0 < r["busy_ms"] <= r["profiled_mean_ms"]
        assert r["idle_share"] == pytest.approx(1 - r["busy_ms"] / r["profiled_mean_ms"])
        assert r["kernels_per_step"] > 0 and 0 < len(r["top"]) <= sp.TOP
    ours = rows["tflm, jax"]
    assert ours["traces"] == 1 and ours["padded_to"] == 72  # one compile; zoo.train's padding
    assert ours["source"].startswith("CPU") and "/host:CPU" in ours["layout"]


@pytest.mark.skipif(not (MOS_CHECKOUT / "main.py").is_file(),
                    reason="no zihangdai/mos checkout ($MOS_CHECKOUT, or mos beside the repo)")
def test_the_mos_preset_profiles_zihangdai_mos_step(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert sp.main(TINY_MOS + ["--backends", "", "--reference", str(MOS_CHECKOUT),
                               "--out", str(tmp_path)]) == 0
    [row] = json.loads((tmp_path / "step_profile.json").read_text())["rows"]
    assert row["system"] == sp.REFERENCES["mos"] == "zihangdai/mos main.py's step"
    assert (row["batch"], row["bptt"]) == (12, 70)  # the preset's, main.py's flags
    assert len(row["step_ms"]) == 2 and row["kernels_per_step"] > 0
    assert 0 < row["busy_ms"] <= row["profiled_mean_ms"]


def test_a_mos_preset_with_salesforce_code_is_refused_saying_which_code(tmp_path, capsys):
    fake = tmp_path / "awd-lstm-lm"
    fake.mkdir()
    (fake / "main.py").write_text("parser.add_argument('--nhid')\n")  # no --n_experts
    with pytest.raises(SystemExit) as refused:
        sp.main(TINY_MOS + ["--backends", "", "--reference", str(fake),
                            "--out", str(tmp_path / "out")])
    assert refused.value.code == 2
    assert "this preset's reference is zihangdai/mos's main.py" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing ran
