"""The contexts the papers chose for their next-word tables, located in the test split.

Yang et al. 2018 (Table 14) show six Penn Treebank test contexts where MoS predicts the
next word better than MoC; Parthiban 2020 (thesis Table 5.1, whose MoS‡ / MoC‡ rows are Yang
et al.'s) prints the same six with the top-5 next words of every model it trained. Each is
given here as the papers print its "Reference": the test sentence, cut before the predicted
word, and that word. The papers show the context as the previous sentence and the current
one up to the blank:

    Context #5   ... keep mr. <unk> behind bars <eos> pretoria has n't forgotten why ...
                 ... in the first place for sabotage and _____
    Reference #5 ... for sabotage and conspiracy to <unk> the government <eos>

`locate(ids, vocabulary, prefix, target)` finds the one position of the test split's token
stream where `prefix` ends and `target` follows: Q_theta's row there (row i of
`tools.qmatrix` is the distribution after the first i + 1 tokens) is the model's prediction
for the blank. The words are matched as the corpus spells them (the thesis prints `\\$` for
`$` and splits one word over a line, "fran- cisco"; the strings here are the corpus's).

Reference: Yang et al. 2018 (ICLR), Table 14; Parthiban 2020 thesis §5.1, Table 5.1
(seeds/000, seeds/001).
"""

import dataclasses

import numpy as np

from tflm.data.vocabulary import EOS


@dataclasses.dataclass(frozen=True)
class PublishedContexts:
    """Contexts of one published table: its source, corpus and split, and per context the
    sentence up to the blank (`prefix`) and the word that follows (`target`)."""

    source: str
    corpus: str
    split: str
    entries: tuple  # ((prefix, target), ...)


PUBLISHED = {
    "yang2018_table14": PublishedContexts(
        source="Yang et al. 2018 Table 14 = Parthiban 2020 Table 5.1 (the same six contexts)",
        corpus="ptb", split="test",
        entries=(
            ("canadian <unk> production totaled N metric tons in the week ended oct. N up N N "
             "from the preceding week 's total of N", "tons"),
            ("by contrast <unk> in the best retail locations in boston san francisco and "
             "chicago rarely top $ N", "a"),
            ("as the days go by the south", "african"),
            ("wall street 's takeover-stock speculators or risk arbitragers had placed "
             "unusually large bets that a takeover would succeed and", "ual"),
            ("pretoria has n't forgotten why they were all sentenced to life <unk> in the "
             "first place for sabotage and", "conspiracy"),
            ("the official china daily said retail prices of <unk> foods have n't risen since "
             "last december but acknowledged that huge government", "subsidies"),
        )),
}
PUBLISHED["parthiban2020_table_5_1"] = PUBLISHED["yang2018_table14"]


def _ids(words, vocabulary):
    return [vocabulary.token_to_id(w) for w in words]


def locate(ids, vocabulary, prefix, target):
    """The row of Q_theta (the index of `prefix`'s last token in `ids`) where `prefix` is
    followed by `target`; a `ValueError` unless exactly one place matches."""
    words = prefix.split() + [target]
    unknown = [w for w in words if w not in vocabulary]
    if unknown:
        raise ValueError(f"the vocabulary has no {unknown}: not the corpus of these contexts")
    pattern = np.asarray(_ids(words, vocabulary))
    ids = np.asarray(ids)
    n = len(pattern)
    if len(ids) < n:
        raise ValueError(f"the split has {len(ids)} tokens, fewer than the context's {n}")
    windows = np.lib.stride_tricks.sliding_window_view(ids, n)
    found = np.flatnonzero((windows == pattern).all(axis=1))
    if len(found) != 1:
        raise ValueError(f"{len(found)} places of the split read {' '.join(words)!r}; "
                         "need exactly one")
    return int(found[0] + n - 2)


def display_context(ids, vocabulary, row):
    """The words the papers show for the blank after `row`: the previous sentence and the
    current one up to and including token `row`."""
    eos = vocabulary.token_to_id(EOS)
    ends = np.flatnonzero(np.asarray(ids[:row + 1]) == eos)
    start = ends[-2] + 1 if len(ends) >= 2 else 0
    return [vocabulary.id_to_token(int(i)) for i in ids[start:row + 1]]


def reference_sentence(ids, vocabulary, row):
    """The sentence the blank after `row` lies in, to its `<eos>`."""
    eos = vocabulary.token_to_id(EOS)
    ids = np.asarray(ids)
    before = np.flatnonzero(ids[:row + 1] == eos)
    start = before[-1] + 1 if len(before) else 0
    after = np.flatnonzero(ids[row + 1:] == eos)
    end = row + 2 + after[0] if len(after) else len(ids)
    return [vocabulary.id_to_token(int(i)) for i in ids[start:end]]


def rows_of(name, ids, vocabulary):
    """[(row, display context, reference sentence)] of the published contexts `name`."""
    if name not in PUBLISHED:
        raise KeyError(f"no published contexts {name!r}; known: {', '.join(sorted(PUBLISHED))}")
    out = []
    for prefix, target in PUBLISHED[name].entries:
        row = locate(ids, vocabulary, prefix, target)
        out.append((row, display_context(ids, vocabulary, row),
                    reference_sentence(ids, vocabulary, row)))
    return out
