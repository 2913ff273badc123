"""`zoo.runtime.progress`: Keras' bar on a terminal, one line per epoch into a file (where
the bar would print a line every 0.05 s)."""

import io

from zoo.runtime import progress


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_bar_on_a_terminal_a_line_per_epoch_elsewhere():
    assert progress.verbosity(_Terminal()) == progress.BAR == 1
    assert progress.verbosity(io.StringIO()) == progress.LINE_PER_EPOCH == 2
    closed = io.StringIO()
    closed.close()
    assert progress.verbosity(closed) == progress.LINE_PER_EPOCH
