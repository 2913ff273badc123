"""A Python interpreter with a Keras backend and tflm imported once, that runs each command
(`python -c CODE`, `python -m MODULE ARGS`) in a fork of itself.

The tests run many snippets and test files under the JAX and PyTorch backends, each in a
process of its own (`tests/backends.py`: Keras fixes its backend per process). Each such
process used to import Keras, the backend, NumPy, SciPy, tflm and zoo before it did
anything: 9.8 s with JAX and 18.4 s with PyTorch beside a running suite on CI's two cores,
for about 150 processes a suite run. Here one server per test process and environment
imports them, then forks for each command: the child starts from those modules as
imported, with the caller's environment, working directory, `sys.argv` and `sys.path[0]`,
its output in files, and ends as that command's process would (Python's normal shutdown:
non-daemon threads joined, `atexit` handlers run, the exit status of `SystemExit` or 1
after a traceback). Nothing a command does reaches the server or the next command.

What stays as it was:

- settings read at import time from the environment: the server is keyed by the whole
  environment but `PYTEST_CURRENT_TEST`, so another environment gets another server;
- JAX's backend starts in each child: the server checks that importing did not start it,
  and where it did (or the server does not start at all) that environment's commands run
  in new processes;
- commands under TensorFlow, and calls with `fresh=True` (code that tests what importing
  does) or under `TFLM_TESTS_FRESH_PROCESSES=1`, run in a new process. TensorFlow is not
  preloaded: a fork of it is the riskier kind (a hang costs CI its whole run), and many of
  its commands' tests check the start-up itself.

The protocol: the client writes one JSON request a line to the server's stdin (`argv`,
`env`, `cwd`, `stdout` and `stderr` file paths); the server answers `{"pid": N}` when the
child has started and `{"rc": N}` when it ended, on a descriptor of its own (what the
imports print goes to its stderr, not into the protocol). A client that times out kills the
child's process group, as `subprocess.run(timeout=...)` kills its child.
"""

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import types

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FRESH = "TFLM_TESTS_FRESH_PROCESSES"
PRELOAD = {"jax": ["jax", "jax.numpy"], "torch": ["torch"]}
COMMON = ["numpy", "scipy", "scipy.special", "keras", "pytest", "tflm", "zoo"]
# Set mid-session and read by no import: pytest's name of the current test; PyTorch's
# inductor cache folder, which torch writes into os.environ (its default) the first time it
# asks for it, so that a worker's later commands would otherwise get a server of their own.
_VOLATILE = ("PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR")
_servers = {}  # environment key -> _Server
_unservable = set()  # environment keys whose server could not start
_MAX_SERVERS = 3


class _Server:
    """One preloaded interpreter (client side)."""

    def __init__(self, env):
        self.log = tempfile.TemporaryFile()  # what the imports print
        self.process = subprocess.Popen(  # from the repository, where `-m tests...` is found
            [sys.executable, "-m", "tests.preloaded_python"], cwd=_REPO, env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log)
        try:
            ready = self._read(timeout=300)
        except RuntimeError:
            ready = None
        if not (ready or {}).get("ready"):
            self.log.seek(0)
            printed = self.log.read().decode(errors="replace")[-4000:]
            self.close()
            raise RuntimeError(f"the preloaded interpreter did not start ({ready}):\n{printed}")

    def _read(self, timeout):
        """The next reply line, or None when `timeout` seconds pass first."""
        if timeout is not None:
            readable, _, _ = select.select([self.process.stdout], [], [], max(timeout, 0))
            if not readable:
                return None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError("the preloaded interpreter ended")
        return json.loads(line)

    def run(self, argv, env, cwd, timeout):
        with tempfile.TemporaryDirectory(prefix="preloaded-") as folder:
            out, err = os.path.join(folder, "stdout"), os.path.join(folder, "stderr")
            request = {"argv": list(argv), "env": dict(env), "cwd": str(cwd), "stdout": out,
                       "stderr": err}
            self.process.stdin.write((json.dumps(request) + "\n").encode())
            self.process.stdin.flush()
            started = time.monotonic()
            pid = self._read(timeout=60)["pid"]
            remaining = None if timeout is None else timeout - (time.monotonic() - started)
            reply = self._read(timeout=remaining)
            timed_out = reply is None
            if timed_out:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                reply = self._read(timeout=60)
            with open(out, errors="replace") as f:
                stdout = f.read()
            with open(err, errors="replace") as f:
                stderr = f.read()
        if timed_out:
            raise subprocess.TimeoutExpired(argv, timeout, output=stdout, stderr=stderr)
        return subprocess.CompletedProcess(argv, reply["rc"], stdout, stderr)

    def alive(self):
        return self.process.poll() is None

    def close(self):
        if self.alive():
            self.process.stdin.close()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.log.close()


def _close_all():
    for server in _servers.values():
        server.close()
    _servers.clear()


atexit.register(_close_all)


def server_key(env):
    """Which server serves `env`: one per environment, but for what pytest sets per test."""
    return tuple(sorted((k, v) for k, v in env.items() if k not in _VOLATILE))


def run(argv, env, cwd, timeout=None, fresh=False):
    """`subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True,
    timeout=timeout)` for `argv` = `[sys.executable, "-c", CODE]` or
    `[sys.executable, "-m", MODULE, ...]`, in a fork of a preloaded interpreter where the
    environment's Keras backend is JAX or PyTorch; a fresh process otherwise, with `fresh`,
    or with `TFLM_TESTS_FRESH_PROCESSES=1`."""
    backend = env.get("KERAS_BACKEND", "tensorflow")
    if (fresh or backend not in PRELOAD or os.environ.get(FRESH) == "1"
            or len(argv) < 3 or argv[0] != sys.executable or argv[1] not in ("-c", "-m")):
        return _fresh(argv, env, cwd, timeout)
    key = server_key(env)
    if key in _unservable:
        return _fresh(argv, env, cwd, timeout)
    server = _servers.get(key)
    if server is None or not server.alive():
        if server is not None:  # it ended: its place is this key's
            _servers.pop(key).close()
        elif len(_servers) >= _MAX_SERVERS:  # the oldest goes
            _servers.pop(next(iter(_servers))).close()
        try:
            server = _servers[key] = _Server(env)
        except RuntimeError:  # e.g. importing started JAX: this environment runs fresh
            _unservable.add(key)
            return _fresh(argv, env, cwd, timeout)
    return server.run(argv, env, cwd, timeout)


def _fresh(argv, env, cwd, timeout):
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


# --- the server -------------------------------------------------------------------------

def _serve():
    """Import, then fork a child per request; returns (in the child only) its request."""
    import importlib
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # what the imports and the server print stays out of the protocol
    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    for name in PRELOAD.get(backend, []) + COMMON:
        importlib.import_module(name)
    from zoo.runtime.allocator import jax_backend_started
    if jax_backend_started():
        replies.write(json.dumps({"ready": False, "why": "importing started JAX"}) + "\n")
        sys.exit(1)
    replies.write(json.dumps({"ready": True}) + "\n")
    requests = sys.stdin.buffer
    while True:
        line = requests.readline()
        if not line:
            sys.exit(0)
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            replies.close()
            return request
        replies.write(json.dumps({"pid": pid}) + "\n")
        _, status = os.waitpid(pid, 0)
        replies.write(json.dumps({"rc": os.waitstatus_to_exitcode(status)}) + "\n")


def _become(request):
    """Make this forked child the process `request["argv"]` would have started."""
    os.setpgid(0, 0)  # a timed-out client kills the group
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(f, fd)
        os.close(f)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    import numpy
    numpy.random.seed()  # a fresh process seeds NumPy's global generator from the OS
    _, flag, *rest = request["argv"]
    if flag == "-c":
        sys.argv = ["-c", *rest[1:]]
        sys.path[0] = ""
        main = types.ModuleType("__main__")
        main.__builtins__ = __builtins__
        sys.modules["__main__"] = main
        exec(compile(rest[0], "<string>", "exec"), main.__dict__)
    else:
        import runpy
        sys.argv = [rest[0], *rest[1:]]
        sys.path[0] = request["cwd"]
        runpy.run_module(rest[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    _become(_serve())
