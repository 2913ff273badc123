"""Every Python snippet of README.md runs as written, on its own, in one fresh process.

Each snippet gets fresh globals (a user copies one snippet, not the page), so a snippet that
leans on a name another one defined fails here. Every `model` a snippet leaves is saved to
`.keras` and loaded back with the same parameter count. The snippets show full-size
settings; the run keeps their code as written and only makes the data small:
`tflm.data.load_corpus` returns a small synthetic corpus, `tflm.data.lm_dataset` cuts its
windows to at most 10 positions and, for 1-D ids, 4 streams (the full-size ODE and flow
heads' one step at 20 x 70 cost a minute of CI), and `fit` runs one step of one epoch
(patched in the child process, for this test only)."""

import os
import re
import subprocess
import sys
import textwrap

from tests.conftest import REPO

PRELUDE = """
import keras
import tflm.data
_corpus = tflm.data.markov_language(50, seed=0).to_corpus(
    train_tokens=4000, valid_tokens=2000, test_tokens=500)
tflm.data.load_corpus = lambda *args, **kwargs: _corpus
_lm_dataset = tflm.data.lm_dataset


def _small_windows(ids, batch_size, bptt, **kwargs):
    import numpy as np
    streams = np.ndim(ids) == 2  # batchified already: its rows are the batch
    return _lm_dataset(ids, int(batch_size) if streams else min(int(batch_size), 4),
                       min(int(bptt), 10), **kwargs)


tflm.data.lm_dataset = _small_windows
_lm_batches = tflm.data.lm_batches


def _small_batches(ids, batch_size, bptt, **kwargs):
    return _lm_batches(ids, batch_size, min(int(bptt), 10), **kwargs)


tflm.data.lm_batches = _small_batches
_fit = keras.Model.fit

def _one_step(self, *args, **kwargs):
    kwargs.update(epochs=1, steps_per_epoch=1, validation_steps=1, verbose=0)
    return _fit(self, *args, **kwargs)

keras.Model.fit = _one_step


def _run_alone(number, code):
    namespace = {"__name__": f"readme_snippet_{number}"}
    exec(compile(code, f"README snippet {number}", "exec"), namespace)
    model = namespace.get("model")
    if isinstance(model, keras.Model):
        import os, tempfile
        if not model.built:
            model.build((None, None))
        with tempfile.TemporaryDirectory() as folder:
            model.save(os.path.join(folder, "snippet.keras"))
            loaded = keras.saving.load_model(os.path.join(folder, "snippet.keras"))
        assert loaded.count_params() == model.count_params(), (number, loaded.count_params(),
                                                               model.count_params())
"""


def readme_snippets():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


JAX_MARK = "# KERAS_BACKEND=jax"  # a snippet for JAX: run there, on two host devices


def _for_jax(snippet):
    return textwrap.dedent(snippet).startswith(JAX_MARK)


def _run_snippets(numbered, env):
    code = PRELUDE + "".join(f"_run_alone({i}, {textwrap.dedent(s)!r})\n"
                             for i, s in numbered) + "print('README OK')\n"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=600,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="",
                                   PYTHONPATH=str(REPO), **env))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "README OK" in proc.stdout


def test_readme_python_snippets_run():
    snippets = list(enumerate(readme_snippets(), start=1))
    assert len(snippets) >= 3
    _run_snippets([(i, s) for i, s in snippets if not _for_jax(s)],
                  {"KERAS_BACKEND": "tensorflow"})


def test_readme_jax_snippets_run_on_two_devices():
    """The snippets marked for JAX (keras.distribution) run with KERAS_BACKEND=jax and
    two host devices, as their first lines tell a reader to."""
    snippets = [(i, s) for i, s in enumerate(readme_snippets(), start=1)
                if _for_jax(s)]
    assert snippets
    _run_snippets(snippets, {"KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu",
                             "XLA_FLAGS": "--xla_force_host_platform_device_count=2"})


# --- the shell transcripts ------------------------------------------------------------------

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_SPEED_OR_TIME = re.compile(r"^(?: words/s|s\b)")


def readme_transcripts():
    """The README's ```text blocks that show `$ python -m ...` commands with their output,
    as lists of (command, expected lines)."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    transcripts = []
    for block in re.findall(r"```text\n(.*?)```", text, flags=re.S):
        if not block.startswith("$ python -m "):
            continue
        steps = []
        for line in block.splitlines():
            if line.startswith("$ "):
                steps.append((line[2:], []))
            else:
                steps[-1][1].append(line)
        transcripts.append(steps)
    return transcripts


def line_matches(expected, actual, rel=0.02):
    """Whether an output line is the expected one: the words equal (runs of spaces as one),
    the decimal figures within `rel`, the whole numbers equal, a speed (`N words/s`) or a
    time (`Ns`) anything."""
    def parts(line):
        line = " ".join(line.split())
        return _NUMBER.split(line), _NUMBER.findall(line)
    (e_words, e_numbers), (a_words, a_numbers) = parts(expected), parts(actual)
    if e_words != a_words or len(e_numbers) != len(a_numbers):
        return False
    for e, a, after in zip(e_numbers, a_numbers, e_words[1:]):
        if _SPEED_OR_TIME.match(after):
            continue
        e_value, a_value = float(e.replace(",", "")), float(a.replace(",", ""))
        if "." in e:
            if abs(a_value - e_value) > rel * abs(e_value):
                return False
        elif e_value != a_value:
            return False
    return True


def transcript_mismatch(expected, actual):
    """None when `actual` (the output's lines) shows `expected` in order, a `...` line
    standing for any number of lines; else what differs."""
    j, skipping = 0, False
    for line in expected:
        if line.strip() == "...":
            skipping = True
            continue
        while j < len(actual) and not line_matches(line, actual[j]):
            if not skipping:
                return f"expected {line!r}, printed {actual[j]!r}"
            j += 1
        if j == len(actual):
            return f"expected {line!r}: not printed"
        j, skipping = j + 1, False
    if j < len(actual) and not skipping:
        return f"printed more than shown: {actual[j:]}"
    return None


def test_transcript_matching_accepts_the_output_and_refuses_a_change():
    expected = ["...", "test perplexity     24.17", "epoch 2 took 3.0s, 4,000 words/s"]
    printed = ["loss 3.3", "test perplexity 24.30", "epoch 2 took 1.1s, 48,982 words/s"]
    assert transcript_mismatch(expected, printed) is None
    assert "24.17" in transcript_mismatch(expected, ["test perplexity 24.80", printed[2]])
    assert transcript_mismatch(expected, ["test perplexity 24.17",
                                          "epoch 3 took 3.0s, 4,000 words/s"]) is not None
    assert transcript_mismatch(expected[1:], printed) is not None  # no "..." before
    assert "more than shown" in transcript_mismatch(expected, printed + ["extra"])
    assert transcript_mismatch(["w27 w37"], ["w27 w36"]) is not None


def test_readme_transcripts_print_what_the_readme_shows(tmp_path, monkeypatch, capsys):
    """Each `$ python -m zoo.X ARGS` of the README's transcripts runs (in this process, as
    `zoo.X.main(ARGS)`, in one folder for the whole page: the generation transcript uses
    the run the evaluation one trains) and prints the lines shown."""
    import importlib
    import shlex
    from tests.conftest import without_native_log_lines
    transcripts = readme_transcripts()
    assert len(transcripts) >= 2
    monkeypatch.chdir(tmp_path)
    for steps in transcripts:
        for command, expected in steps:
            words = shlex.split(command)
            assert words[:3] == ["python", "-m", words[2]] and words[2].startswith("zoo.")
            importlib.import_module(words[2]).main(words[3:])
            captured = capsys.readouterr()
            printed = without_native_log_lines(captured.out + captured.err).splitlines()
            problem = transcript_mismatch(expected, printed)
            assert problem is None, f"$ {command}: {problem}"


def test_ci_runs_the_readmes_test_command():
    """`.ci/run runs exactly this`: the README's test command, line for line, in .ci/run."""
    readme = (REPO / "README.md").read_text()
    command = re.search(r"```bash\n(python -m pip install -r requirements-dev\.txt.*)\n```",
                        readme).group(1)
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.lstrip().startswith("#")]
    ran = [line for line in ci if line.startswith("python -m ")]
    # .ci/run's installs are quiet (-q); the test command itself is the README's
    assert [part.strip() for part in command.split("&&")] == [
        line.replace("pip install -q ", "pip install ") for line in ran]
