"""Python's cyclic garbage collector set for a command-line run: the start-up's objects are
frozen, so full collections no longer walk them.

CPython runs a full (generation 2) collection when the objects that survived the younger
generations since the last one reach a quarter of the long-lived ones, and each walks every
tracked object. A `python -m zoo.train` run on JAX (2-core AMD EPYC of bench/training/results/reference_throughput.md)
held three while importing the frameworks (0.11-0.19 s each, 260,000-410,000 objects
walked) and one inside its first training step (0.23-0.26 s), where tracing the step makes
hundreds of thousands of objects.

`hold_during_start()` turns automatic collection off while the frameworks are imported
(modules live as long as the process: a collection there finds next to nothing), and
`freeze_long_lived()` collects once what the imports left, moves every object tracked so
far to the permanent generation that collections skip (`gc.freeze()`), then turns
collection back on. The objects made later are collected as before.

`python -m zoo.train` holds from its first line, freezes once its imports are done and
again after the model and its datasets are built, just before training; `zoo.evaluate`
holds from its first line and freezes after its imports. In the run above the start-up then
held one full collection (0.25 s, against 0.46 s for the three), the first epoch 0.02-0.04
s of them (0.25 s before), and the first training step took 0.1-0.3 s less; the peak
memory was the same (1.45 GB).

A frozen object that becomes cyclic garbage later is never freed. At a command line's
start that is nearly nothing: the imported modules and the model live until the process
ends. In a long-lived process (a notebook, a test session) it could be a lot, so both
functions do nothing unless the process is one of the command lines
(`command_line_process()`, called by their `__main__` blocks), and nothing when
`TFLM_GC=default`.
"""

import gc
import os

OPT_OUT = "TFLM_GC"
_command_line = False
_frozen = []  # objects each call froze
_held = False


def _applies():
    return _command_line and os.environ.get(OPT_OUT, "").strip().lower() != "default"


def command_line_process():
    """Mark this process as a command line's (`python -m zoo.train`, `python -m
    zoo.evaluate`): `freeze_long_lived` then freezes."""
    global _command_line
    _command_line = True


def hold_during_start():
    """Turn automatic collection off until `freeze_long_lived` (a command line's start)."""
    global _held
    if _applies() and gc.isenabled():
        gc.disable()
        _held = True


def freeze_long_lived():
    """Freeze every object the collector tracks now (`gc.freeze()`); after a
    `hold_during_start`, collect once first and turn collection back on. In a command
    line's process only, unless `TFLM_GC=default`. Returns how many objects this call
    froze."""
    global _held
    if not _applies():
        return 0
    if _held:  # the garbage of the imports, in one collection instead of several
        gc.collect()
    before = gc.get_freeze_count()
    gc.freeze()
    if _held:
        gc.enable()
        _held = False
    _frozen.append(gc.get_freeze_count() - before)
    return _frozen[-1]


def frozen_counts():
    """What each `freeze_long_lived` call of this process froze, in order (empty where
    nothing was frozen)."""
    return list(_frozen)
