"""How the command lines show progress: a bar redrawn in place on a terminal, a line at the
end (of each epoch, of each pass) when stdout is a file or a pipe.

Keras' progress bar knows no terminal from a file: written to a file it prints a new line
every 0.05 s (`keras.utils.Progbar`'s interval), 164 KB for a few minutes' training.
`verbosity()` is the `verbose` a command passes to `fit` / `evaluate` /
`keras.utils.Progbar`: 1 (the bar) on a terminal, else 2 (Keras' one line per epoch, with
its metrics, or one line when a pass ends).
"""

import sys

BAR, LINE_PER_EPOCH = 1, 2


def verbosity(stream=None):
    """`BAR` (1) when `stream` (default: sys.stdout, where Keras writes) is a terminal, else
    `LINE_PER_EPOCH` (2)."""
    stream = sys.stdout if stream is None else stream
    try:
        terminal = stream.isatty()
    except (AttributeError, ValueError):  # no stream, or a closed one
        terminal = False
    return BAR if terminal else LINE_PER_EPOCH
