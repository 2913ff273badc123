"""The preloaded interpreter that runs the backend snippets: each command behaves as its own
`python -c` / `python -m` process would, and none sees what another did."""

import importlib.util
import json
import os
import subprocess
import sys
import time

import pytest

from tests import preloaded_python
from tests.conftest import REPO

pytestmark = pytest.mark.skipif(importlib.util.find_spec("jax") is None,
                                reason="the JAX backend is not installed")


def _env(**extra):
    return dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", **extra)


def _code(code, env=None, **kwargs):
    return preloaded_python.run([sys.executable, "-c", code], env or _env(), REPO, **kwargs)


def test_commands_run_in_forks_of_one_server_and_share_nothing():
    first = _code("import os, sys, json, tflm, jax\n"
                  "from zoo.runtime.allocator import jax_backend_started\n"
                  "tflm.MARK = 1\n"
                  "print(json.dumps([os.getpid(), os.getppid(), os.getcwd(), sys.argv,"
                  " sys.path[0], __name__, jax_backend_started(),"
                  " os.environ['PYTEST_CURRENT_TEST']]))\n"
                  "jax.numpy.ones(2)\n", timeout=120)
    assert first.returncode == 0, first.stderr
    pid, server, cwd, argv, path0, name, started, test = json.loads(first.stdout)
    assert (cwd, argv, path0, name, started) == (str(REPO), ["-c"], "", "__main__", False)
    assert test == os.environ["PYTEST_CURRENT_TEST"]  # the caller's environment, as it is now
    second = _code("import os, json, tflm\n"
                   "from zoo.runtime.allocator import jax_backend_started\n"
                   "print(json.dumps([os.getpid(), os.getppid(), hasattr(tflm, 'MARK'),"
                   " jax_backend_started()]))", timeout=120)
    assert second.returncode == 0, second.stderr
    pid2, server2, marked, started2 = json.loads(second.stdout)
    # Another process, forked by the same server, which the first one's import, attribute
    # and started JAX backend did not reach.
    assert pid2 != pid and server2 == server != os.getpid()
    assert (marked, started2) == (False, False)
    # The server keeps the modules imported before the fork.
    third = _code("import sys; print('tflm' in sys.modules, 'jax' in sys.modules)",
                  timeout=120)
    assert third.stdout.split() == ["True", "True"]


def test_exit_status_errors_and_shutdown_are_a_processes(tmp_path):
    marker = tmp_path / "atexit"
    ended = _code("import atexit, sys\n"
                  f"atexit.register(lambda: open({str(marker)!r}, 'w').write('ran'))\n"
                  "print('out'); print('err', file=sys.stderr); sys.exit(3)", timeout=120)
    assert (ended.returncode, ended.stdout, ended.stderr) == (3, "out\n", "err\n")
    assert marker.read_text() == "ran"
    failed = _code("raise ValueError('no such thing')", timeout=120)
    assert failed.returncode == 1
    assert "ValueError: no such thing" in failed.stderr
    assert failed.stderr.startswith("Traceback")


def test_modules_run_with_their_arguments(tmp_path):
    module = tmp_path / "echo_args.py"
    module.write_text("import json, os, sys\n"
                      "print(json.dumps([__name__, sys.argv[1:], sys.path[0], os.getcwd()]))\n")
    proc = preloaded_python.run([sys.executable, "-m", "echo_args", "x", "--y"], _env(),
                                tmp_path, timeout=120)  # found as python -m finds it: in cwd
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == ["__main__", ["x", "--y"], str(tmp_path), str(tmp_path)]


def test_a_server_first_asked_from_another_folder_starts(tmp_path):
    """The server starts from the repository whatever the first command's folder (it is
    `python -m tests.preloaded_python`); the command runs in its own folder."""
    env = _env(TFLM_TESTS_SERVER_FROM_ELSEWHERE="1")  # a key of its own: a new server
    assert preloaded_python.server_key(env) not in preloaded_python._servers
    proc = preloaded_python.run([sys.executable, "-c", "import os; print(os.getppid(), "
                                 "os.getcwd())"], env, tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    parent, folder = proc.stdout.split()
    assert int(parent) != os.getpid() and folder == str(tmp_path)


def test_a_command_past_its_timeout_is_killed_with_its_children(tmp_path):
    code = ("import subprocess, sys, time\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
            "print(child.pid, flush=True)\n"
            "time.sleep(300)\n")
    with pytest.raises(subprocess.TimeoutExpired) as raised:
        _code(code, timeout=2)
    grandchild = int(raised.value.output.split()[0])
    # The group was killed: the grandchild is gone once reaped by init (poll briefly).
    for _ in range(50):
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        with open(f"/proc/{grandchild}/stat") as f:
            if f.read().split(") ")[1].startswith("Z"):
                break
        time.sleep(0.1)
    else:
        pytest.fail("the command's child outlived the timeout")
    # The server still serves.
    assert _code("print(1)", timeout=120).stdout == "1\n"


def test_other_environments_other_backends_and_opt_outs_take_their_own_process():
    env = _env()
    assert preloaded_python.server_key(env) == preloaded_python.server_key(
        dict(env, PYTEST_CURRENT_TEST="another test"))
    assert preloaded_python.server_key(env) == preloaded_python.server_key(
        dict(env, TORCHINDUCTOR_CACHE_DIR="/tmp/set-by-torch-mid-session"))
    assert preloaded_python.server_key(env) != preloaded_python.server_key(
        dict(env, TFLM_SOMETHING_READ_AT_IMPORT="1"))  # another server
    probe = "import os; print(os.getppid())"
    assert int(_code(probe, timeout=120).stdout) != os.getpid()  # served
    assert int(_code(probe, fresh=True, timeout=120).stdout) == os.getpid()  # our own child
    tensorflow = dict(env, KERAS_BACKEND="tensorflow")
    assert int(_code(probe, env=tensorflow, timeout=120).stdout) == os.getpid()


def test_an_environment_whose_server_does_not_start_runs_fresh(monkeypatch):
    tried = []

    def refuse(env):
        tried.append(env)
        raise RuntimeError("the preloaded interpreter did not start")
    monkeypatch.setattr(preloaded_python, "_Server", refuse)
    env = _env(TFLM_NO_SERVER_FOR_THIS="1")
    monkeypatch.setattr(preloaded_python, "_unservable", set())
    probe = "import os; print(os.getppid())"
    for _ in range(2):  # the second call does not try again
        assert int(_code(probe, env=env, timeout=120).stdout) == os.getpid()
    assert preloaded_python._unservable == {preloaded_python.server_key(env)}
    assert len(tried) == 1
