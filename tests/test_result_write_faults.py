"""Every result file a command writes outside the run folder (`--json`, `zoo.generate --out`,
`tools.embeddings --out`, `tools.rank --json`) is replaced whole or not at all: a write that
fails at the rename (a full disk) leaves the previous file byte for byte, no temporary beside
it, and the command exits 2 with one line naming the file (issue 45)."""

import errno
import os
import shutil

import numpy as np
import pytest

from tests.conftest import without_native_log_lines
from zoo.runs import atomic_files

PREVIOUS = b'{"kept": "the previous result"}\n'


def _evaluate(run, target):
    from zoo import evaluate
    return evaluate.main, [str(run), "--quiet", "--json", str(target)]


def _dynamic_eval(run, target):
    from zoo import dynamic_eval
    return dynamic_eval.main, [str(run), "--batch-size", "10", "--max-batches", "5",
                               "--quiet", "--json", str(target)]


def _cache_pointer(run, target):
    from zoo import cache_pointer
    return cache_pointer.main, [str(run), "--window", "20", "--quiet", "--json", str(target)]


def _generate(run, target):
    from zoo import generate
    return generate.main, [str(run), "--words", "5", "--seed", "1", "--out",
                           str(target)]


def _embeddings(run, target):
    from tools import embeddings
    return embeddings.main, [str(run), "--out", str(target.parent)]


def _rank(run, target):
    from tools import rank
    q = target.parent / "q.npy"
    np.save(q, np.log(np.random.default_rng(0).dirichlet(np.ones(6), size=20)).astype("float32"))
    return rank.main, [str(q), "--json", str(target)]


COMMANDS = {"zoo.evaluate": (_evaluate, "result.json"),
            "zoo.dynamic_eval": (_dynamic_eval, "result.json"),
            "zoo.cache_pointer": (_cache_pointer, "result.json"),
            "zoo.generate": (_generate, "words.txt"),
            "tools.embeddings": (_embeddings, "embeddings.json"),
            "tools.rank": (_rank, "ranks.json")}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_failed_result_write_keeps_the_previous_file(command, tiny_run, tmp_path, capsys,
                                                       monkeypatch):
    make, name = COMMANDS[command]
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    results = tmp_path / "results"
    results.mkdir()
    target = results / name
    target.write_bytes(PREVIOUS)
    main, argv = make(run, target)
    replace = os.replace

    def full_disk(src, dst):
        if os.fspath(dst) == os.fspath(target):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return replace(src, dst)

    monkeypatch.setattr(atomic_files.os, "replace", full_disk)
    capsys.readouterr()
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = without_native_log_lines(captured.err).strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"{command}: error: cannot write {target} (No space left on "
                             "device)"), err
    assert target.read_bytes() == PREVIOUS
    if command == "zoo.generate":  # the words are printed instead
        assert len(captured.out.split()) == 5, captured.out
    assert not [p.name for p in results.iterdir() if atomic_files.TEMPORARY_MARK in p.name]
