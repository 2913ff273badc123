"""TensorBoard event files written without TensorFlow.

Keras on JAX or PyTorch runs where TensorFlow is not installed (the usual GPU image), and
`tf.summary` is then missing. The `tensorboard` package writes the same files itself: its
`EventFileWriter` appends `Event` protocol buffers to `events.out.tfevents.*`, and the
scalar and text plugins' `scalar_pb` / `text_pb` build the summaries `tf.summary.scalar` /
`tf.summary.text` would (tensor summaries tagged for their plugin), so TensorBoard and
`EventAccumulator` read them as they read TensorFlow's. We use those pieces instead of a
writer of our own; only the three lines that wrap a summary in an event are ours.

Example:

>>> import tempfile
>>> folder = tempfile.mkdtemp()
>>> with EventWriter(folder) as writer:
...     writer.scalar("evaluate/test_perplexity", 81.2, step=3)
...     writer.text("top_predictions", "| context | next |", step=3)
>>> from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
>>> accumulator = EventAccumulator(folder)
>>> _ = accumulator.Reload()
>>> sorted(accumulator.Tags()["tensors"])
['evaluate/test_perplexity', 'top_predictions']
"""

import time

from tensorboard.compat.proto import event_pb2
from tensorboard.plugins.scalar import summary_v2 as scalar_summary
from tensorboard.plugins.text import summary_v2 as text_summary
from tensorboard.summary.writer.event_file_writer import EventFileWriter


class EventWriter:
    """Scalars and markdown text into a TensorBoard event file in `folder` (created when
    missing); a context manager that closes (flushes) the file."""

    def __init__(self, folder):
        self._file = EventFileWriter(str(folder))

    def scalar(self, tag, value, step):
        """The scalar `value` at `step`, as `tf.summary.scalar(tag, value, step)` logs it."""
        self._add(scalar_summary.scalar_pb(tag, float(value)), step)

    def text(self, tag, markdown, step):
        """The markdown string at `step`, as `tf.summary.text(tag, markdown, step)` logs it."""
        self._add(text_summary.text_pb(tag, markdown), step)

    def _add(self, summary, step):
        self._file.add_event(event_pb2.Event(summary=summary, step=int(step),
                                             wall_time=time.time()))

    def flush(self):
        self._file.flush()

    def close(self):
        self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
