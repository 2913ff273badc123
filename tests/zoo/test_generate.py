"""`zoo.generate`: sampling text from a saved language model, with every head, on every
Keras backend, from the library and from the command line."""

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from scipy import stats

import zoo
from tests.conftest import without_native_log_lines
from tests.conftest import REPO
from zoo import generate as gen
from zoo.errors import UserError
from zoo.runs.saved_run import open_run

PROMPT = "w3 w4"
JAX_SEED, TORCH_SEED, BACKEND_WORDS = 21, 22, 6


@pytest.fixture(scope="module")
def other_backends(tiny_run):
    """The JAX and PyTorch subprocesses (tests at the end of this file), started as soon as
    the tiny run exists so that they run while the tests in this process do."""
    procs = {"jax": _start("jax", ["-c", textwrap.dedent(f"""
        import json
        from zoo.runs.saved_run import open_run
        from zoo.generate import generate
        run = open_run({str(tiny_run)!r}, need_corpus=False)
        print(json.dumps(generate(run.model, run.vocabulary, {BACKEND_WORDS}, seed={JAX_SEED},
                                  prompt={PROMPT!r})))
        """)]),
             # `python -m zoo.generate` itself, with its own quiet start
             "torch": _start("torch", ["-m", "zoo.generate", str(tiny_run), "--words",
                                       str(BACKEND_WORDS), "--seed", str(TORCH_SEED),
                                       "--prompt", PROMPT], quiet=False)}
    yield procs
    for proc in procs.values():
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()


def _start(backend, args, quiet=True):
    """`python ARGS` under KERAS_BACKEND=backend, started (as tests/backends.py runs it);
    None when the backend is not installed."""
    if importlib.util.find_spec(backend) is None:
        return None
    env = dict(os.environ, KERAS_BACKEND=backend, JAX_PLATFORMS="cpu", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if quiet:
        env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    else:
        env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    return subprocess.Popen([sys.executable, *args], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _finish(procs, backend):
    proc = procs[backend]
    if proc is None:
        pytest.skip(f"Keras backend {backend!r} is not installed")
    try:
        out, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the {backend} subprocess took over 300 s:\n{err[-3000:]}")
    return proc.returncode, out, err


@pytest.fixture(scope="module")
def run(tiny_run, other_backends):
    """The tiny run's model and words, loaded once (no test changes them)."""
    return open_run(tiny_run, need_corpus=False)


def ids_of(words, vocabulary):
    return [vocabulary.index(w) for w in words]


def last_row(model, ids):
    """The model's next-word log-probabilities after `ids`, from zero state, in one call."""
    log_probs, _ = model.forward_with_state(np.asarray([ids], np.int32), None, training=False)
    return np.asarray(log_probs, np.float64)[0, -1]


def greedy(model, vocabulary, prompt_ids, n):
    """Greedy decoding with no state carried: the whole text re-read for every word."""
    ids = list(prompt_ids)
    for _ in range(n):
        ids.append(int(np.argmax(last_row(model, ids))))
    return [vocabulary[i] for i in ids[len(prompt_ids):]]


def draw(row, n, seed=0, **kwargs):
    rng = np.random.Generator(np.random.PCG64(seed))
    return np.bincount([gen.sample_next(row, rng, **kwargs) for _ in range(n)],
                       minlength=row.size)


def chi_square_p(counts, probs):
    """p-value of the counts under `probs`; cells expected below 5 pooled into one."""
    expected = probs / probs.sum() * counts.sum()
    small = expected < 5
    obs = np.append(counts[~small], counts[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    keep = exp > 0
    return stats.chisquare(obs[keep], exp[keep]).pvalue


# ---- the library ------------------------------------------------------------------------

def test_same_seed_same_text_other_seed_other_text(run):
    a = gen.generate(run.model, run.vocabulary, 15, seed=11, prompt=PROMPT)
    b = gen.generate(run.model, run.vocabulary, 15, seed=11, prompt=PROMPT)
    c = gen.generate(run.model, run.vocabulary, 15, seed=12, prompt=PROMPT)
    assert len(a) == 15 and set(a) <= set(run.vocabulary)
    assert a == b
    assert a != c


def test_words_are_drawn_one_uniform_each_from_the_rows_the_model_gives(run):
    """The stream's words equal `sample_next` replayed on its rows with the seed's generator
    (so the statistics of `sample_next` below are those of `generate`)."""
    steps = list(gen.sample_stream(run.model, run.vocabulary, 10, temperature=0.8, seed=5,
                                   prompt=PROMPT, top_k=7))
    rng = np.random.Generator(np.random.PCG64(5))
    assert [i for _, i, _ in steps] == [gen.sample_next(row, rng, 0.8, 7)
                                         for _, _, row in steps]
    np.testing.assert_allclose(steps[0][2], last_row(run.model, ids_of(PROMPT.split(),
                                                                          run.vocabulary)),
                               atol=1e-6)


def test_carried_state_equals_one_pass_over_the_whole_text(run):
    steps = list(gen.sample_stream(run.model, run.vocabulary, 12, seed=3, prompt=PROMPT))
    prompt = ids_of(PROMPT.split(), run.vocabulary)
    text = prompt + [i for _, i, _ in steps[:-1]]
    log_probs, _ = run.model.forward_with_state(np.asarray([text], np.int32))
    whole = np.asarray(log_probs, np.float64)[0, len(prompt) - 1:]
    np.testing.assert_allclose(np.stack([row for _, _, row in steps]), whole, atol=1e-5)
    # no prompt and no <eos> in the vocabulary: the text starts from id 0
    assert "<eos>" not in run.vocabulary
    step = next(gen.sample_stream(run.model, run.vocabulary, 1, seed=0))
    np.testing.assert_allclose(step[2], last_row(run.model, [0]), atol=1e-6)


def test_temperature_towards_zero_and_top_1_are_greedy(run):
    prompt = ids_of(PROMPT.split(), run.vocabulary)
    expected = greedy(run.model, run.vocabulary, prompt, 10)
    assert gen.generate(run.model, run.vocabulary, 10, temperature=1e-4, seed=1,
                        prompt=PROMPT) == expected
    assert gen.generate(run.model, run.vocabulary, 10, top_k=1, seed=2,
                        prompt=PROMPT) == expected


def test_sampling_distribution_is_the_models(run):
    row = last_row(run.model, ids_of(PROMPT.split(), run.vocabulary))
    probs = np.exp(row)
    n = 20000
    counts = draw(row, n, seed=1)
    assert chi_square_p(counts, probs) > 1e-3
    # the test has power: this distribution is far from uniform
    assert chi_square_p(counts, np.ones_like(probs)) < 1e-3
    # temperature 0.5: softmax(log p / 0.5)
    sharp = np.exp((row - row.max()) / 0.5)
    assert chi_square_p(draw(row, n, seed=2, temperature=0.5), sharp) > 1e-3
    assert chi_square_p(counts, sharp) < 1e-3
    # top-5: the five most likely words, renormalized; nothing else is ever drawn
    top = np.argsort(-row)[:5]
    restricted = np.zeros_like(probs)
    restricted[top] = probs[top]
    counts_k = draw(row, n, seed=3, top_k=5)
    assert counts_k[np.setdiff1d(np.arange(row.size), top)].sum() == 0
    assert chi_square_p(counts_k[top], restricted[top]) > 1e-3


def test_sample_next_edge_cases_and_the_text_format():
    rng = np.random.Generator(np.random.PCG64(0))
    row = np.array([np.log(0.5), -np.inf, np.log(0.5)])  # -inf is never drawn
    assert {gen.sample_next(row, rng) for _ in range(200)} == {0, 2}
    tie = np.log(np.full(4, 0.25))  # ties at the top-k boundary keep the lower ids
    assert {gen.sample_next(tie, rng, top_k=2) for _ in range(200)} == {0, 1}
    assert gen.sample_next(np.array([-1.0, -1.0 - 1e-3, -5.0]), rng, temperature=1e-6) == 0
    assert gen.format_text(["a", "<eos>", "b", "c", "<eos>"]) == "a\nb c\n"
    assert gen.format_text(["<eos>", "a"]) == "\na\n"
    assert gen.format_text(["a", "b"]) == "a b\n"


def test_bad_arguments_are_user_errors(run):
    m, v = run.model, run.vocabulary
    for kwargs, match in [(dict(temperature=0), "temperature must be a number > 0"),
                          (dict(temperature=-1.0), "temperature"),
                          (dict(temperature=float("nan")), "temperature"),
                          (dict(top_k=0), "top-k must be an integer >= 1"),
                          (dict(top_k=41), "at most the vocabulary size 40"),
                          (dict(prompt="w1 nope"), "'nope' is not in the model's vocabulary")]:
        with pytest.raises(UserError, match=match):
            gen.generate(m, v, 3, **kwargs)
    with pytest.raises(UserError, match="number of words must be an integer >= 1"):
        gen.generate(m, v, 0)
    with pytest.raises(UserError, match="predicts 40 words but the vocabulary has 39"):
        gen.generate(m, v[:-1], 3)



# ---- other heads ------------------------------------------------------------------------

@pytest.mark.parametrize("head", [{"type": "mos", "num_experts": 3}, {"type": "gss"},
                                  {"type": "plif", "num_intervals": 20}],
                         ids=["mos", "gss", "plif"])
def test_every_head_generates(head, tmp_path):
    vocabulary = ["<eos>", "<unk>"] + [f"t{i}" for i in range(10)]
    model = zoo.AWDLSTM(len(vocabulary), embed_dim=6, hidden_dim=8, num_layers=2, seed=4,
                        head=head)
    model.build()
    model.save(tmp_path / "m.keras")
    (tmp_path / "vocab.txt").write_text("\n".join(vocabulary) + "\n")
    loaded = open_run(tmp_path / "m.keras", need_corpus=False)
    assert loaded.vocabulary == vocabulary
    m = loaded.model
    words = gen.generate(m, vocabulary, 6, seed=9, prompt="t1 zzz t2")
    assert len(words) == 6 and words == gen.generate(m, vocabulary, 6, seed=9,
                                                     prompt="t1 <unk> t2")
    # no prompt: from <eos>, state carried, greedy with top_k=1
    eos = [vocabulary.index("<eos>")]
    steps = list(gen.sample_stream(m, vocabulary, 5, top_k=1))
    assert [w for w, _, _ in steps] == greedy(m, vocabulary, eos, 5)
    log_probs, _ = m.forward_with_state(np.asarray([eos + [i for _, i, _ in steps[:-1]]]))
    np.testing.assert_allclose(np.stack([r for _, _, r in steps]),
                               np.asarray(log_probs, np.float64)[0], atol=1e-5)


# ---- the command line (in this process: the function `python -m zoo.generate` runs) ----

def test_cli_writes_the_words_to_a_file_with_a_progress_bar(tiny_run, tmp_path, capsys,
                                                            monkeypatch, run):
    monkeypatch.setattr(gen, "PROGRESS_MIN_WORDS", 5)  # the bar above 5 words, not 200
    out = tmp_path / "text.txt"
    assert gen.main([str(tiny_run), "--words", "8", "--seed", "4", "--prompt", PROMPT,
                     "--top-k", "10", "--temperature", "0.9", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "8/8" in captured.err
    expected = gen.generate(run.model, run.vocabulary, 8, temperature=0.9, seed=4,
                            prompt=PROMPT, top_k=10)
    assert out.read_text() == " ".join(expected) + "\n"


BAD_INPUT = [  # (arguments, what the one line says); {run}: the tiny run
    (["{missing}", "--words", "3"], "no such run directory or model file"),
    (["{run}", "--words", "3", "--temperature", "0"], "temperature must be a number > 0"),
    (["{run}", "--words", "3", "--prompt", "w1 nope"], "'nope' is not in the model's"),
    (["{run}", "--words", "3", "--top-k", "0"], "top-k must be an integer >= 1"),
    (["{run}", "--words", "3", "--top-k", "99"], "at most the vocabulary size 40"),
    (["{run}", "--words", "0"], "number of words must be an integer >= 1"),
    (["{run}", "--words", "3", "--out", "{missing}/x.txt"], "no directory"),
]


def test_cli_bad_input_is_one_line_and_exit_2(tiny_run, tmp_path, capsys):
    for args, message in BAD_INPUT:  # one test, not one each: each test clears the session
        argv = [a.format(run=tiny_run, missing=tmp_path / "nothing") for a in args]
        assert gen.main(argv) == 2, argv
        captured = capsys.readouterr()
        assert captured.out == ""
        lines = captured.err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("zoo.generate: error: "), captured.err
        assert message in lines[0], (argv, lines[0])


# ---- other backends: one small subprocess each, the same words as TensorFlow's ----------

def test_jax_gives_the_same_words(run, other_backends):
    expected = gen.generate(run.model, run.vocabulary, BACKEND_WORDS, seed=JAX_SEED,
                            prompt=PROMPT)
    rc, out, err = _finish(other_backends, "jax")
    assert rc == 0, err[-3000:]
    assert json.loads(out.strip().splitlines()[-1]) == expected


def test_torch_command_line_gives_the_same_words(run, other_backends):
    """`python -m zoo.generate` itself, on PyTorch: exit 0, the words on stdout, nothing on
    stderr, the same words as TensorFlow for the same saved model and seed."""
    expected = gen.generate(run.model, run.vocabulary, BACKEND_WORDS, seed=TORCH_SEED,
                            prompt=PROMPT)
    rc, out, err = _finish(other_backends, "torch")
    assert rc == 0, err[-3000:]
    assert without_native_log_lines(err) == "", repr(err[-3000:])
    assert out == " ".join(expected) + "\n"
