"""What a run folder holds, for commands that run many (`zoo.search`, `zoo.study`):

    "finished"      metrics.json: the run ended and was evaluated
    "diverged"      diverged.json (`DIVERGED_FILE`): the run stopped on a non-finite loss,
                    and the command that ran it recorded why
    "interrupted"   an epoch checkpoint and no results: `--resume` continues it
    "new"           nothing of a run
"""

import pathlib

from zoo.runs.checkpoint import holds_checkpoint

DIVERGED_FILE = "diverged.json"


def run_state(path):
    """"finished", "diverged", "interrupted" or "new" (see the module docstring)."""
    path = pathlib.Path(path)
    if (path / "metrics.json").exists():
        return "finished"
    if (path / DIVERGED_FILE).exists():
        return "diverged"
    if holds_checkpoint(path):  # wherever a crash left it (zoo.runs.checkpoint.recover)
        return "interrupted"
    return "new"
