"""Every Python snippet of README.md runs as written, on its own, in one fresh process.

Each snippet gets fresh globals (a user copies one snippet, not the page), so a snippet that
leans on a name another one defined fails here. Every `model` a snippet leaves is saved to
`.keras` and loaded back with the same parameter count. The snippets show full-size
settings; the run keeps their code as written and only makes the data small:
`tflm.data.load_corpus` returns a small synthetic corpus and `fit` runs one step of one
epoch (patched in the child process, for this test only)."""

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


def test_readme_python_snippets_run():
    snippets = readme_snippets()
    assert len(snippets) >= 3
    code = PRELUDE + "".join(f"_run_alone({i + 1}, {textwrap.dedent(s)!r})\n"
                             for i, s in enumerate(snippets)) + "print('README OK')\n"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=600,
                          env=dict(os.environ, KERAS_BACKEND="tensorflow",
                                   TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="",
                                   PYTHONPATH=str(REPO)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "README OK" in proc.stdout
