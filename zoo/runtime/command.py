"""The set-up every command line makes, once: `run_command(main)` in its `__main__` block,
`start_command()` first in its `main`, `imports_done()` once its imports are made."""


import sys

from zoo.runtime import allocator, interrupt, python_gc, quiet_start, xla_flags


def start_command():
    """What a command line does before any framework imports, in this order: hold the
    collector, set malloc (before any framework starts its threads), add the XLA flags
    (before JAX starts its backend), then import TensorFlow with its start-up lines
    filtered out. Each step is a no-op when made already."""
    python_gc.hold_during_start()
    allocator.keep_freed_memory()
    xla_flags.fast_cpu_compiles()
    quiet_start.start()


def imports_done():
    """The frameworks are imported: collect once, freeze what exists (no full collection
    walks it again) and turn the collector back on. Returns the count frozen."""
    return python_gc.freeze_long_lived()


def run_command(main):
    """A command line's `__main__` block: mark the process as a command line's, install
    the Ctrl-C handling of `zoo.runtime.interrupt` around `main()`, and exit with its
    return code."""
    python_gc.command_line_process()
    with interrupt.handle_ctrl_c():
        code = main()
    sys.exit(code)
