"""The corpus a run's configuration names: a synthetic language or a corpus on disk."""

from zoo.errors import ConfigError


def load_data(corpus_cfg, data_dir=None):
    """(Corpus, optimal perplexity or None) for the `corpus` part of a configuration.

    `{"name": "synthetic", "kind": "markov" | "mixture", ...}` makes the language
    (`tflm.data.synthetic`; its keyword arguments, plus `train_tokens` / `valid_tokens` /
    `test_tokens`) and reports its optimal perplexity. Any other name is `ptb`,
    `wikitext-2` or a directory (`tflm.data.load_corpus`, looked up in `data_dir`);
    `max_train_tokens` / `max_valid_tokens` / `max_test_tokens` keep only the first tokens
    of a split (shortened reproductions on small machines)."""
    from tflm import data
    cfg = dict(corpus_cfg)
    name = cfg.pop("name", "synthetic")
    if name == "synthetic":
        kind = cfg.pop("kind", "markov")
        makers = {"markov": data.synthetic.markov_language,
                  "mixture": data.synthetic.mixture_markov_language}
        if kind not in makers:
            raise ConfigError(f"unknown synthetic corpus kind {kind!r}; use markov or mixture.")
        sizes = {k: cfg.pop(k) for k in ("train_tokens", "valid_tokens", "test_tokens")
                 if k in cfg}
        try:
            language = makers[kind](**cfg)
        except TypeError as err:
            raise ConfigError(f"bad synthetic corpus settings: {err}") from err
        corpus = language.to_corpus(seed=language.seed + 1, **sizes)
        return corpus, float(language.optimal_perplexity)
    limits = {split: cfg.pop(f"max_{split}_tokens", None) for split in ("train", "valid", "test")}
    corpus = data.load_corpus(name, data_dir=data_dir)
    for split, limit in limits.items():
        if limit is not None:  # a shortened run: the first `limit` tokens of the split
            setattr(corpus, split, corpus.split(split)[:int(limit)])
    return corpus, None
