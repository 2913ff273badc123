"""The corpus a run's settings name: a synthetic language or a corpus on disk."""

import pathlib

from tflm import data
from zoo.errors import ConfigError, UserError
from zoo.runs.setting_keys import synthetic_maker
from zoo.runs.settings import CorpusSettings


def load_data(settings, data_dir=None):
    """(Corpus, optimal perplexity or None) for `settings`: a `CorpusSettings`, a corpus
    name or folder, or a configuration's `corpus` part (a dict, read into settings).

    `{"name": "synthetic", "kind": "markov" | "mixture" | "zipf", ...}` makes the language
    (`tflm.data.synthetic`, `tflm.data.zipf` for a large-vocabulary stand-in; its keyword
    arguments, plus `train_tokens` / `valid_tokens` /
    `test_tokens`) and reports its optimal perplexity. Any other name is `ptb`,
    `wikitext-2` or a directory (`tflm.data.load_corpus`, looked up in `data_dir`), or
    `lm1b`, the 1B Word benchmark (`tflm.data.lm1b`: `<data_dir>/` + the release's folder
    name unless `path` names the folder; `vocab_size` (100,000), `heldout` shard numbers,
    `verify` the published line counts (true), `cache` the encoded splits as .npy beside the
    release, in `<folder>-cache-<vocab_size>` (true)), or `text8` (`tflm.data.text8`:
    `path`, `verify` the published size and sha1 (true), `split_sizes` ([90M, 5M, 5M]));
    `max_train_tokens` / `max_valid_tokens` / `max_test_tokens` keep only the first tokens
    of a split, of any corpus (shortened reproductions on small machines).

    Raises `ConfigError` for bad synthetic-language settings and `UserError` for a corpus
    file that cannot be read (not UTF-8, a word outside a fixed vocab.txt), naming the
    value, or the file and line."""
    if isinstance(settings, (str, pathlib.Path)):
        settings = CorpusSettings(name=str(settings))
    elif not isinstance(settings, CorpusSettings):
        settings = CorpusSettings.from_dict(settings)
    name, cfg = settings.name, dict(settings.options)
    optimal = None
    if settings.synthetic:
        make = synthetic_maker(settings.kind)
        sizes = settings.split_sizes()
        try:
            language = make(**cfg)
            corpus = language.to_corpus(seed=language.seed + 1, **sizes)
        except (TypeError, ValueError) as err:
            raise ConfigError(f"bad synthetic corpus settings in corpus: {err}") from err
        optimal = float(language.optimal_perplexity)
    else:
        try:
            if name in data.lm1b.NAMES:
                corpus = _load_lm1b(cfg, data_dir)
            elif name in data.text8.NAMES:
                corpus = _load_text8(cfg, data_dir)
            else:
                corpus = data.load_corpus(name, data_dir=data_dir)
        except ConfigError:
            raise
        except ValueError as err:  # a file that is not UTF-8, a bad vocab.txt, an unknown word
            raise UserError(f"cannot read corpus {name}: {err}") from err
    for split in ("train", "valid", "test"):
        limit = settings.split_limit(split)
        if limit is not None:  # a shortened run: the first `limit` tokens of the split
            setattr(corpus, split, corpus.split(split)[:int(limit)])
    return corpus, optimal


def _load_lm1b(cfg, data_dir):
    """The 1B Word benchmark of a `corpus` part's options (see `load_data`)."""
    unknown = sorted(set(cfg) - {"path", "vocab_size", "heldout", "verify", "cache"})
    if unknown:
        raise ConfigError(f"corpus lm1b: unknown setting(s) {', '.join(unknown)}; it takes "
                          "path, vocab_size, heldout, verify, cache.")
    base = pathlib.Path(data_dir).expanduser() if data_dir else data.default_data_dir()
    root = pathlib.Path(cfg["path"]).expanduser() if cfg.get("path") else base / data.lm1b.ROOT
    vocab_size = int(cfg.get("vocab_size", 100_000))
    cache = (root.parent / f"{root.name}-cache-{vocab_size}") if cfg.get("cache", True) else None
    try:
        return data.lm1b.load_lm1b(root, vocab_size=vocab_size, heldout=cfg.get("heldout"),
                                   verify=bool(cfg.get("verify", True)), cache_dir=cache)
    except data.ChecksumError as err:  # an altered copy: the user replaces it
        raise UserError(str(err)) from err


def _load_text8(cfg, data_dir):
    """text8 (`tflm.data.text8`) with a `corpus` part's options: `path` (a text8 file or
    text8.zip instead of the data directory's), `verify` (the published size and sha1;
    true), `split_sizes` (train, valid, test characters; [90M, 5M, 5M]); `vocab_size`
    only documents the 27 characters."""
    text8 = data.text8
    try:
        return text8.load_text8(data_dir, path=cfg.get("path"),
                                split_sizes=cfg.get("split_sizes"),
                                verify=bool(cfg.get("verify", True)))
    except data.ChecksumError as err:  # not the published file: the user replaces it
        raise UserError(str(err)) from err


def check_split_sizes(corpus, training):
    """Raise `UserError` when a split is too short for its batch size (`training`, the
    `TrainingSettings`): every one of the B streams needs an input and a target token, so
    a split needs at least 2 B tokens (an empty split file has none)."""
    final = training.final_evaluation
    needs = (("train", "batch_size", None), ("valid", "eval_batch_size", "valid_batch_size"),
             ("test", "test_batch_size", "test_batch_size"))
    for split, key, override in needs:
        sizes = [(f"training.{key}", getattr(training, key))]
        if override is not None and getattr(final, override) is not None:
            sizes.append((f"training.final_evaluation.{override}", getattr(final, override)))
        tokens = len(corpus.split(split))
        for field, batch in sizes:
            if tokens < 2 * batch:
                path = corpus.paths.get(split)
                where = "" if path is None else (f" ({path} is empty)" if tokens == 0
                                                 else f" (read from {path})")
                raise UserError(f"the {split} split of corpus {corpus.name} has {tokens} "
                                f"tokens{where}; {field} = {batch} needs at least "
                                f"{2 * batch} (an input and a target per stream).")
