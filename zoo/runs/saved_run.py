"""What the evaluation commands open: a run directory or a saved model, with its corpus.

`python -m zoo.evaluate`, `zoo.dynamic_eval`, `zoo.generate`, `tools.word_similarity` and
`tools.embeddings` take `RUN_DIR|MODEL.keras`:

- a run directory of `python -m zoo.train` means its `best.keras` (the model training
  reported its final figures with), with the `config.json` and `vocab.txt` beside it;
- a `.keras` file means that model; a `config.json` / `vocab.txt` beside it are used when
  present (a run's `final.keras`), otherwise a corpus must be named.

The corpus is the run's own (`config.json`: a synthetic language, or PTB / WikiText-2 with
the run's token limits) unless one is named; either way its words are checked against the
model's (`zoo.models.vocabulary`) before anything is computed.
"""

import dataclasses
import json
import pathlib
import sys

from tflm.data import CorpusNotFoundError
from zoo.errors import UserError
from zoo.models.saving import load_model_file
from zoo.models.vocabulary import VOCAB_FILE, check_model_vocabulary, saved_vocabulary
from zoo.runs.corpora import load_data
from zoo.runs.settings import RunSettings, TrainingSettings
from zoo.runtime.user_errors import check_output_file

MODEL_FILE = "best.keras"
CONFIG_FILE = "config.json"


@dataclasses.dataclass
class SavedRun:
    """A loaded model and what lies beside it.

    Attributes:
        model: the loaded language model.
        model_path: the `.keras` file it came from.
        run_dir: the folder holding it (the run directory for a zoo run).
        config: the run's configuration (`config.json`), or None.
        settings: that configuration checked (`zoo.runs.settings.RunSettings`), or None.
        vocabulary: the words in id order: the run's `vocab.txt`, else the corpus'.
        corpus: the `tflm.data.Corpus` (None when `open_run(..., need_corpus=False)`).
        checked: "words" or "size": how the corpus was checked against the model
            (None without a corpus).
    """

    model: object
    model_path: pathlib.Path
    run_dir: pathlib.Path
    config: dict
    vocabulary: list
    corpus: object = None
    checked: str = None
    settings: RunSettings = None

    @property
    def training(self):
        """The run's `TrainingSettings`; the defaults for a model without a config.json."""
        return self.settings.training if self.settings is not None else TrainingSettings()


def model_path_of(target):
    """The `.keras` file `target` (a run directory or a model file) names; `UserError` when
    there is none."""
    path = pathlib.Path(target)
    if path.is_dir():
        model = path / MODEL_FILE
        if not model.exists():
            found = sorted(p.name for p in path.glob("*.keras"))
            hint = (f"; it holds {', '.join(found)}: pass one of them" if found else
                    "; pass the run directory of a finished or checkpointed "
                    "`python -m zoo.train` run, or a .keras file")
            raise UserError(f"{path} has no {MODEL_FILE}{hint}.")
        return model
    if not path.exists():
        raise UserError(f"{path}: no such run directory or model file.")
    if path.suffix != ".keras":
        raise UserError(f"{path} is not a .keras model file nor a run directory.")
    return path


def open_run(target, corpus=None, data_dir=None, need_corpus=True):
    """Load the model `target` names, its configuration and (unless `need_corpus` is False)
    the corpus it is evaluated on, checked against the model's words.

    Args:
        target: a run directory or a `.keras` file.
        corpus: None for the run's own corpus, or a name / directory (`ptb`, `wikitext-2`,
            a folder with train/valid/test files).
        data_dir: where named corpora live (default: `$TFLM_DATA_DIR`).
        need_corpus: False for tools that only need the model and its words.

    Raises `UserError` (a one-line message) for a missing or unreadable model, a missing
    corpus, or a corpus whose words are not the model's.
    """
    model_path = model_path_of(target)
    run_dir = model_path.parent
    config = settings = None
    if (run_dir / CONFIG_FILE).exists():
        try:
            config = json.loads((run_dir / CONFIG_FILE).read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as err:
            raise UserError(f"{run_dir / CONFIG_FILE} is not valid JSON ({err}).") from err
        settings = RunSettings.from_config(config)
    model = load_model_file(model_path, "the model")  # truncated, corrupt: one line
    if getattr(model, "vocab_size", None) is None:
        raise UserError(f"{model_path} is not a tflm language model (no vocab_size).")
    vocabulary = saved_vocabulary(model_path)
    run = SavedRun(model=model, model_path=model_path, run_dir=run_dir, config=config,
                   vocabulary=vocabulary, settings=settings)
    if not need_corpus and vocabulary is not None:
        return run
    if corpus is None and config is None:
        raise UserError(f"no {CONFIG_FILE} beside {model_path}: name the corpus it was "
                        "trained on with --corpus.")
    try:
        if corpus is None:
            loaded, _ = load_data(settings.corpus, data_dir)
        else:
            loaded, _ = load_data(corpus, data_dir)
    except CorpusNotFoundError as err:
        raise UserError(str(err)) from err
    run.checked = check_model_vocabulary(model_path, model.vocab_size, loaded.vocabulary)
    run.corpus = loaded
    if run.vocabulary is None:
        run.vocabulary = list(loaded.vocabulary)
    return run


def open_for_command(args, prog):
    """What an evaluation command (`zoo.evaluate`, `zoo.dynamic_eval`, `zoo.cache_pointer`)
    does first: check that its `--json` file can be written (before the passes, not after
    them), open `args.target` on its `--corpus` / `--data-dir` (`open_run`) and print the
    vocabulary warning, if any, to stderr. Returns the run."""
    if args.json:
        check_output_file(args.json, "--json")
    run = open_run(args.target, corpus=args.corpus, data_dir=args.data_dir)
    note = vocabulary_note(run, prog)
    if note:
        print(note, file=sys.stderr)
    return run


def vocabulary_note(run, prog):
    """A warning line when only the vocabulary size could be checked (no vocab.txt)."""
    if run.checked == "size":
        return (f"{prog}: warning: no {VOCAB_FILE} beside {run.model_path}; only the "
                "vocabulary size was checked, not that the words are in the model's order.")
    return None
