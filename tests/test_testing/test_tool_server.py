# Copyright (c) mmcalidet contributors. All rights reserved.
"""ToolServer: a script run in a forked child behaves as in a new
interpreter (arguments, environment, folder, threads, seeds, output, exit
status, a time limit), and run_tool uses it only where the imports are
the run's own."""
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from testing import _utils, popen_tool, run_tool
from testing.tool_server import ForkedProcess, ToolServer

# each test starts a tool server (a process that imports torch and mmdet)
# and runs scripts in it: the tier of the tools run as subprocesses
pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent('''\
    import os, random, sys
    import torch
    print('argv', sys.argv[1:])
    print('cwd', os.getcwd())
    print('env', os.environ.get('PROBE'), 'LIGHT' in os.environ)
    print('threads', torch.get_num_threads())
    print('path0', sys.path[0])
    print('seed', random.random(), torch.initial_seed())
    print('stderr line', file=sys.stderr)
    if len(sys.argv) > 1 and sys.argv[1] == 'message':
        sys.exit('the message')
    if len(sys.argv) > 1 and sys.argv[1] == 'code':
        sys.exit(3)
    if len(sys.argv) > 1 and sys.argv[1] == 'raise':
        raise ValueError('raised here')
    if len(sys.argv) > 1 and sys.argv[1] == 'kill':
        os.kill(os.getpid(), 9)
    if len(sys.argv) > 1 and sys.argv[1] == 'sleep':
        import time
        time.sleep(60)
    ''')


@pytest.fixture(scope='module')
def server():
    server = ToolServer(dict(os.environ))
    yield server
    server.close()


@pytest.fixture
def script(tmp_path):
    path = tmp_path / 'probe.py'
    path.write_text(SCRIPT)
    return str(path)


def lines(res: subprocess.CompletedProcess) -> dict:
    return dict(line.split(' ', 1) for line in res.stdout.splitlines())


def test_a_run_is_its_own_process(server, script, tmp_path):
    env = dict(os.environ, PROBE='yes', OMP_NUM_THREADS='1')
    env.pop('MMCALIDET_LIGHT', None)
    res = server.run(script, ['a', '--b=c'], env, str(tmp_path), 60)
    out = lines(res)
    assert res.returncode == 0, res.stderr
    assert out['argv'] == "['a', '--b=c']"
    assert out['cwd'] == str(tmp_path)
    assert out['env'] == 'yes False'
    assert out['threads'] == '1'
    assert out['path0'] == str(tmp_path)
    assert res.stderr == 'stderr line\n'
    # another run: another environment, other threads and other seeds
    env.update(PROBE='no', OMP_NUM_THREADS='2')
    again = lines(server.run(script, [], env, str(tmp_path), 60))
    assert again['env'] == 'no False' and again['threads'] == '2'
    assert again['seed'] != out['seed']
    assert again['seed'].split()[1] != out['seed'].split()[1]


@pytest.mark.parametrize('how, code, stderr', [
    ('message', 1, 'the message\n'),
    ('code', 3, None),
    ('raise', 1, 'ValueError: raised here'),
    ('kill', -signal.SIGKILL, None),
])
def test_exit_status_as_the_interpreter_gives_it(server, script, tmp_path, how,
                                                 code, stderr):
    res = server.run(script, [how], dict(os.environ), str(tmp_path), 60)
    assert res.returncode == code
    if how != 'kill':  # what it printed before it ended
        assert 'argv' in res.stdout
    if stderr:
        assert stderr in res.stderr
        assert res.stderr.startswith('stderr line\n')


def test_a_run_over_its_time_is_killed_and_the_server_goes_on(
        server, script, tmp_path):
    with pytest.raises(subprocess.TimeoutExpired):
        server.run(script, ['sleep'], dict(os.environ), str(tmp_path), 2)
    res = server.run(script, [], dict(os.environ), str(tmp_path), 60)
    assert res.returncode == 0


def test_run_tool_forks_only_where_the_imports_are_the_runs(
        server, monkeypatch, tmp_path):
    base = os.environ.get('PYTHONPATH', '')
    assert server.serves(dict(os.environ))
    assert not server.serves(dict(os.environ, MMCALIDET_LIGHT='1'))
    # a folder of new modules before the server's PYTHONPATH: served
    probes = tmp_path / 'probes'
    probes.mkdir()
    (probes / 'my_probe_module.py').write_text('X = 1\n')
    with_probes = os.pathsep.join([str(probes), base])
    assert server.serves(dict(os.environ, PYTHONPATH=with_probes))
    # one that holds a module imported already, or another PYTHONPATH: not
    shadow = tmp_path / 'shadow'
    shadow.mkdir()
    (shadow / 'torch').mkdir()
    assert not server.serves(
        dict(os.environ, PYTHONPATH=os.pathsep.join([str(shadow), base])))
    if base:
        assert not server.serves(dict(os.environ, PYTHONPATH=str(probes)))
    runs = []
    start = server.start

    def recording(*args, **kwargs):
        runs.append(args)
        return start(*args, **kwargs)

    # run_tool's server: this module's, its runs recorded
    monkeypatch.setattr(server, 'start', recording)
    monkeypatch.setattr(_utils, '_SERVER', [server])
    res = run_tool('tools/analysis_tools/compute_prior.py', '--help')
    assert res.returncode == 0 and 'usage' in res.stdout
    assert len(runs) == 1
    # the probes' folder is on the run's sys.path, after the script's
    script = tmp_path / 'uses_probe.py'
    script.write_text('import sys, my_probe_module\n'
                      'print(my_probe_module.X, sys.path[1])\n')
    monkeypatch.setenv('PYTHONPATH', with_probes)
    res = run_tool(str(script))
    assert res.stdout == f'1 {probes}\n' and len(runs) == 2, res.stderr
    # a shadowing folder: a new interpreter
    monkeypatch.setenv('PYTHONPATH', os.pathsep.join([str(shadow), base]))
    res = run_tool('tools/analysis_tools/compute_prior.py', '--help')
    assert len(runs) == 2
    # and none at all where asked
    monkeypatch.setenv('MMCALIDET_TOOL_SERVER', '0')
    assert _utils._tool_server() is None


def test_popen_tool_appends_to_the_log_and_reads_as_a_popen(
        server, monkeypatch, script, tmp_path):
    """(The last test of the module: it ends the module's server.)"""
    monkeypatch.setattr(_utils, '_SERVER', [server])
    log = tmp_path / 'train.log'
    env = dict(os.environ, PROBE='log')
    env.pop('MMCALIDET_LIGHT', None)
    with open(log, 'w') as f:
        f.write('the command line\n')
        f.flush()
        proc = popen_tool([sys.executable, script, 'sleep'],
                          cwd=str(tmp_path),
                          env=env,
                          stdout=f,
                          stderr=subprocess.STDOUT)
    assert isinstance(proc, ForkedProcess)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.5)
    assert proc.poll() is None
    proc.kill()
    assert proc.wait(timeout=30) == -signal.SIGKILL
    with open(log, 'w') as f:
        f.write('the command line\n')
        f.flush()
        proc = popen_tool([sys.executable, script],
                          cwd=str(tmp_path),
                          env=env,
                          stdout=f,
                          stderr=subprocess.STDOUT)
    assert proc.wait(timeout=60) == 0 and proc.returncode == 0
    text = log.read_text()
    # the line written before, then the run's output and errors
    assert text.startswith('the command line\nargv []\n')
    assert 'env log False' in text and 'stderr line' in text
    # not a project script: a new interpreter
    with open(log, 'w') as f:
        other = popen_tool([sys.executable, '-c', 'print(1)'],
                           cwd=str(tmp_path),
                           env=env,
                           stdout=f,
                           stderr=subprocess.STDOUT)
    assert isinstance(other, subprocess.Popen) and other.wait() == 0
    # the server ends with its client
    proc = server._proc
    server.close()
    assert proc.poll() is not None
