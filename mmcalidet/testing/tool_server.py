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

:func:`~mmcalidet.testing.run_tool` uses it unless ``MMCALIDET_TOOL_SERVER``
is ``0``, and falls back to a new interpreter for a run whose
``PYTHONPATH`` or light-import switch differs from the server's (the
imports would not be the run's own).
"""
import json
import os
import os.path as osp
import select
import signal
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional

#: what the server imports before it forks (what the tools import)
PRELOAD = ('torch', 'mmengine.runner', 'mmdet.apis', 'mmdet.models',
           'mmcalidet', 'mmcalidet.apis', 'mmcalidet.models',
           'mmcalidet.evaluation')
#: the environment variables whose value the server's imports depend on
IMPORT_ENV = ('PYTHONPATH', 'MMCALIDET_LIGHT')


def _run_child(request: Dict) -> None:
    """In the forked child: become the run (streams, environment, folder,
    arguments, threads, seeds), run the script as ``__main__`` and exit
    with its status; never returns."""
    import atexit
    import random
    import runpy
    import traceback
    code = 1
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, path in ((1, request['stdout']), (2, request['stderr'])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_TRUNC), fd)
        os.environ.clear()
        os.environ.update(request['env'])
        os.chdir(request['cwd'])
        script = request['script']
        sys.argv = [script, *request['args']]
        sys.path[0] = osp.dirname(script)
        import numpy as np
        import torch
        threads = request['env'].get('OMP_NUM_THREADS')
        if threads:  # else torch's default, as in a new interpreter
            torch.set_num_threads(int(threads))
        random.seed()
        np.random.seed()
        torch.seed()
        code = 0
        try:
            runpy.run_path(script, run_name='__main__')
        except SystemExit as exc:
            if isinstance(exc.code, str):
                print(exc.code, file=sys.stderr)
                code = 1
            else:
                code = exc.code or 0
        except BaseException:  # noqa: B902  (as the interpreter reports it)
            traceback.print_exc()
            code = 1
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def serve() -> None:
    """The server's loop: import :data:`PRELOAD`, then for each request
    (a JSON line on stdin) fork a child, report its pid and, when it has
    ended, its exit status (JSON lines on stdout); end at stdin's end."""
    import importlib
    for name in PRELOAD:
        importlib.import_module(name)
    out = sys.stdout
    print(json.dumps(dict(ready=True)), file=out, flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _run_child(request)
        print(json.dumps(dict(pid=pid)), file=out, flush=True)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        print(json.dumps(dict(returncode=code)), file=out, flush=True)


class ToolServer:
    """A client of one server process (started on first use).

    Args:
        env (dict): the server's environment (its ``PYTHONPATH`` and
            light-import switch decide what it imports).
    """

    def __init__(self, env: Dict[str, str]) -> None:
        self.env = {k: v for k, v in env.items() if k != 'MMCALIDET_LIGHT'}
        self._proc: Optional[subprocess.Popen] = None

    def serves(self, env: Dict[str, str]) -> bool:
        """Whether a run with this environment imports what the server
        has imported."""
        return all(env.get(name) == self.env.get(name) for name in IMPORT_ENV)

    def _server(self) -> subprocess.Popen:
        """The running server process, started and preloaded if needed."""
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen([
                sys.executable, '-c',
                'from mmcalidet.testing.tool_server import serve; '
                'serve()'
            ],
                                          stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE,
                                          env=self.env,
                                          text=True)
            self._reply(None)
        return self._proc

    def _reply(self, timeout: Optional[float]) -> Optional[Dict]:
        """The server's next JSON line, or None after ``timeout`` s."""
        stream = self._proc.stdout
        if timeout is not None:
            ready, _, _ = select.select([stream], [], [], max(timeout, 0))
            if not ready:
                return None
        line = stream.readline()
        if not line:
            raise RuntimeError('the tool server ended (exit status '
                               f'{self._proc.wait()})')
        return json.loads(line)

    def run(self, script: str, args: List[str], env: Dict[str, str], cwd: str,
            timeout: float) -> subprocess.CompletedProcess:
        """Run ``script`` with ``args`` in a forked child.

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
        server = self._server()
        with tempfile.TemporaryDirectory() as folder:
            streams = [osp.join(folder, name) for name in ('out', 'err')]
            for path in streams:
                open(path, 'w').close()
            request = dict(
                script=script,
                args=list(args),
                env=dict(env),
                cwd=cwd,
                stdout=streams[0],
                stderr=streams[1])
            server.stdin.write(json.dumps(request) + '\n')
            server.stdin.flush()
            pid = self._reply(None)['pid']
            reply = self._reply(timeout)
            if reply is None:
                os.kill(pid, signal.SIGKILL)
                self._reply(None)
                raise subprocess.TimeoutExpired([script, *args], timeout)
            output = []
            for path in streams:
                with open(path, errors='replace') as f:
                    output.append(f.read())
        return subprocess.CompletedProcess([sys.executable, script, *args],
                                           reply['returncode'], *output)

    def close(self) -> None:
        """End the server (its stdin closes; it exits)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.stdin.close()
            self._proc.wait(timeout=30)
        self._proc = None
