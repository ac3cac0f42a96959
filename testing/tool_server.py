# Copyright (c) mmcalidet contributors. All rights reserved.
"""Run project scripts in forked children of a process that has imported
torch, mmcv, mmdet and mmcalidet once.

A test that runs ``tools/train.py`` as a user would (its own process, its
command line, its exit status and output) pays a new interpreter's
imports each time: about 6 s of the 10 s that a 2-iteration training
takes on 2 CPU cores. :class:`ToolServer` starts one plain interpreter per
test process, imports those packages in it and then only forks: each run
is a child process that has done nothing but the imports, as a new
interpreter would have, with the run's own arguments, environment,
working folder, torch threads and fresh random seeds, its output in
files, and its exit status as the interpreter gives it (``sys.exit``
with a message: 1; an uncaught exception: 1 with its traceback; killed
by a signal: minus the signal). The server never runs torch's thread
pool, so forking it is safe.

:func:`testing.run_tool` uses it unless ``MMCALIDET_TOOL_SERVER``
is ``0``, and falls back to a new interpreter for a run whose
light-import switch differs from the server's, or whose ``PYTHONPATH``
is not the server's with folders of new modules before it (the imports
would not be the run's own).
"""
import json
import os
import os.path as osp
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional, Set

#: what the server imports before it forks (what the tools import)
#: environment variables that torch, MKL and oneDNN read when they load: a
#: run that sets another value than the server's gets a new interpreter
LOAD_TIME_ARITHMETIC = ('ATEN_CPU_CAPABILITY', 'MKL_CBWR',
                        'ONEDNN_MAX_CPU_ISA', 'MKL_ENABLE_INSTRUCTIONS')
PRELOAD = ('torch', 'mmengine.runner', 'mmdet.apis', 'mmdet.models',
           'mmcalidet', 'mmcalidet.apis', 'mmcalidet.models',
           'mmcalidet.evaluation', 'mmcalidet.calibration')


def _path_entries(env: Dict[str, str]) -> List[str]:
    """The non-empty entries of an environment's ``PYTHONPATH``."""
    return [p for p in env.get('PYTHONPATH', '').split(os.pathsep) if p]


def extra_path(env: Dict[str, str], server_env: Dict[str, str],
               imported: Set[str]) -> Optional[List[str]]:
    """The folders a run's ``PYTHONPATH`` puts before the server's, or
    None where the run's imports would differ from the server's (another
    ``PYTHONPATH``, or a folder that holds a module the server imported).

    Args:
        env (dict): the run's environment.
        server_env (dict): the server's.
        imported (set[str]): the top-level modules the server imported.

    Returns:
        list[str] | None: the folders (empty: the same ``PYTHONPATH``).
    """
    entries, base = _path_entries(env), _path_entries(server_env)
    if len(entries) < len(base) or entries[len(entries) - len(base):] != base:
        return None
    extra = entries[:len(entries) - len(base)]
    for folder in extra:
        names = os.listdir(folder) if osp.isdir(folder) else []
        for name in names:
            module = name[:-3] if name.endswith('.py') else name
            if module in imported:
                return None
    return extra


def _run_child(request: Dict) -> None:
    """In the forked child: become the run (streams, environment, folder,
    arguments, threads, seeds), run the script as ``__main__`` and exit
    with its status; never returns."""
    import atexit
    import random
    code = 1
    try:
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(os.open(request['stdout'], os.O_WRONLY | os.O_APPEND), 1)
        if request['stderr'] is None:  # into stdout, as subprocess.STDOUT
            os.dup2(1, 2)
        else:
            os.dup2(os.open(request['stderr'], os.O_WRONLY | os.O_APPEND), 2)
        os.environ.clear()
        os.environ.update(request['env'])
        os.chdir(request['cwd'])
        script = request['script']
        sys.argv = [script, *request['args']]
        # as a new interpreter: the script's folder, then PYTHONPATH's
        sys.path[0] = osp.dirname(script)
        sys.path[1:1] = request['extra_path']
        import numpy as np
        import torch
        threads = request['env'].get('OMP_NUM_THREADS')
        if threads:  # else torch's default, as in a new interpreter
            torch.set_num_threads(int(threads))
        random.seed()
        np.random.seed()
        torch.seed()
        code = run_script(script)
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def run_script(path: str) -> int:
    """Run a script as ``python path`` would, in this process, and give
    its exit status as the interpreter gives it: ``sys.exit`` with a
    message prints it and gives 1, with a number gives that number (0
    for none); an uncaught exception prints its traceback and gives 1.

    Args:
        path (str): the script.

    Returns:
        int: the exit status.
    """
    import runpy
    import traceback
    try:
        runpy.run_path(path, run_name='__main__')
    except SystemExit as exc:
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
            return 1
        return exc.code or 0
    except Exception:  # noqa: B902  (as the interpreter reports it)
        traceback.print_exc()
        return 1
    return 0


def _write_status(path: str, code: int) -> None:
    """Write a child's exit status to ``path``, whole (renamed into
    place)."""
    with open(path + '.tmp', 'w') as f:
        f.write(str(code))
    os.replace(path + '.tmp', path)


def _reap(status_files: Dict[int, str], lock: threading.Lock) -> None:
    """The server's reaper thread: wait for every child and write its exit
    status (as ``subprocess`` gives it) to its request's status file."""
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:  # none running
            time.sleep(0.02)
            continue
        with lock:
            path = status_files.pop(pid, None)
        if path is not None:
            _write_status(path, os.waitstatus_to_exitcode(status))


def serve() -> None:
    """The server's loop: import :data:`PRELOAD`, then for each request
    (a JSON line on stdin) fork a child and report its pid (a JSON line on
    stdout); a thread writes each child's exit status to the request's
    status file when it ends. The server ends at stdin's end."""
    import importlib
    for name in PRELOAD:
        importlib.import_module(name)
    status_files: Dict[int, str] = {}
    lock = threading.Lock()
    threading.Thread(
        target=_reap, args=(status_files, lock), daemon=True).start()
    out = sys.stdout
    imported = sorted({name.split('.')[0] for name in list(sys.modules)})
    print(json.dumps(dict(ready=True, modules=imported)), file=out, flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        with lock:  # the reaper must not miss a child that ends at once
            pid = os.fork()
            if pid == 0:
                _run_child(request)
            status_files[pid] = request['status']
        print(json.dumps(dict(pid=pid)), file=out, flush=True)


class ForkedProcess:
    """A run forked by the server, read as a ``subprocess.Popen``:
    ``pid``, ``returncode``, ``poll``, ``wait`` and ``kill``.

    Args:
        pid (int): the child's process id.
        status (str): the file its exit status is written to.
        args (list[str]): the command it stands for.
    """

    def __init__(self, pid: int, status: str, args: List[str]) -> None:
        self.pid, self.status, self.args = pid, status, args
        self.returncode: Optional[int] = None
        #: the file that stands for its stdout pipe (``communicate``)
        self.output: Optional[str] = None

    def communicate(self, timeout: Optional[float] = None) -> tuple:
        """Wait for the end; what it wrote to the file that stands for
        its stdout pipe (its errors with it), as ``Popen.communicate``
        with ``stderr=subprocess.STDOUT, text=True`` gives it.

        Raises:
            subprocess.TimeoutExpired: still running after ``timeout`` s.
        """
        self.wait(timeout)
        if self.output is None:
            return None, None
        with open(self.output, errors='replace') as f:
            return f.read(), None

    def poll(self) -> Optional[int]:
        """The exit status, or None while it runs."""
        if self.returncode is None and osp.isfile(self.status):
            with open(self.status) as f:
                self.returncode = int(f.read())
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        """Wait for the end; the exit status.

        Raises:
            subprocess.TimeoutExpired: still running after ``timeout`` s.
        """
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() > end:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.02)
        return self.returncode

    def kill(self) -> None:
        """Kill it (SIGKILL), unless it has ended."""
        if self.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class ToolServer:
    """A client of one server process (started on first use).

    Args:
        env (dict): the server's environment (its ``PYTHONPATH`` and
            light-import switch decide what it imports).
    """

    def __init__(self, env: Dict[str, str]) -> None:
        self.env = {k: v for k, v in env.items() if k != 'MMCALIDET_LIGHT'}
        self._proc: Optional[subprocess.Popen] = None
        self._folder = tempfile.TemporaryDirectory(prefix='tool_server_')
        self._count = 0
        self._imported: Set[str] = set()

    def serves(self, env: Dict[str, str]) -> bool:
        """Whether a run with this environment imports what the server
        has imported: the same light switch and load-time arithmetic
        (:data:`LOAD_TIME_ARITHMETIC`), and the server's
        ``PYTHONPATH`` or folders put before it that hold no module this
        process has imported (a test's probe modules, say)."""
        if env.get('MMCALIDET_LIGHT') != self.env.get('MMCALIDET_LIGHT'):
            return False
        if any(env.get(k) != self.env.get(k) for k in LOAD_TIME_ARITHMETIC):
            return False  # read when torch loaded: a new interpreter
        self._server()  # what it imported
        return extra_path(env, self.env, self._imported) is not None

    def _server(self) -> subprocess.Popen:
        """The running server process, started and preloaded if needed."""
        if self._proc is None or self._proc.poll() is not None:
            # this file as a script: the server imports nothing of the
            # checkout's test helpers, only PRELOAD
            self._proc = subprocess.Popen(
                [sys.executable, osp.abspath(__file__)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=self.env,
                text=True)
            self._imported = set(self._reply()['modules'])
        return self._proc

    def _reply(self) -> Dict:
        """The server's next JSON line."""
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError('the tool server ended (exit status '
                               f'{self._proc.wait()})')
        return json.loads(line)

    def output_file(self) -> str:
        """A new empty file in the server's folder, for a run's output."""
        self._count += 1
        path = osp.join(self._folder.name, f'{self._count}.out')
        open(path, 'w').close()
        return path

    def start(self,
              script: str,
              args: List[str],
              env: Dict[str, str],
              cwd: str,
              stdout: str,
              stderr: Optional[str] = None) -> ForkedProcess:
        """Start ``script`` with ``args`` in a forked child.

        Args:
            script (str): the script's absolute path.
            args (list[str]): its command-line arguments.
            env (dict): its environment.
            cwd (str): its working folder.
            stdout (str): the file its output is appended to.
            stderr (str, optional): the file its errors are appended to;
                None: into ``stdout``.

        Returns:
            ForkedProcess: the run.
        """
        server = self._server()
        self._count += 1
        status = osp.join(self._folder.name, f'{self._count}.status')
        request = dict(
            script=script,
            args=list(args),
            env=dict(env),
            cwd=cwd,
            stdout=stdout,
            stderr=stderr,
            status=status,
            extra_path=extra_path(env, self.env, self._imported) or [])
        server.stdin.write(json.dumps(request) + '\n')
        server.stdin.flush()
        return ForkedProcess(self._reply()['pid'], status, [script, *args])

    def run(self, script: str, args: List[str], env: Dict[str, str], cwd: str,
            timeout: float) -> subprocess.CompletedProcess:
        """Run ``script`` with ``args`` in a forked child and wait for it.

        Args:
            script (str): the script's absolute path.
            args (list[str]): its command-line arguments.
            env (dict): its environment.
            cwd (str): its working folder.
            timeout (float): seconds before it is killed.

        Returns:
            subprocess.CompletedProcess: as ``subprocess.run`` with
            ``capture_output=True, text=True`` gives it.

        Raises:
            subprocess.TimeoutExpired: it ran longer than ``timeout``.
        """
        with tempfile.TemporaryDirectory() as folder:
            streams = [osp.join(folder, name) for name in ('out', 'err')]
            for path in streams:
                open(path, 'w').close()
            proc = self.start(script, args, env, cwd, *streams)
            try:
                code = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise
            output = []
            for path in streams:
                with open(path, errors='replace') as f:
                    output.append(f.read())
        return subprocess.CompletedProcess([sys.executable, script, *args],
                                           code, *output)

    def close(self) -> None:
        """End the server (its stdin closes; it exits)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.stdin.close()
            self._proc.wait(timeout=30)
        self._proc = None
        self._folder.cleanup()


if __name__ == '__main__':
    serve()
