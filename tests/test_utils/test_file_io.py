# Copyright (c) mmcalidet contributors. All rights reserved.
"""mmcalidet.utils.file_io.atomic_write: an interrupted write leaves
neither a half-written destination nor its temporary file."""
import os
import os.path as osp
import signal
import subprocess
import sys

import pytest

from mmcalidet.utils.file_io import atomic_write

PROJECT_ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))

# SIGINT as in a terminal: a test run started from a background job
# inherits SIGINT ignored, and Python then installs no KeyboardInterrupt
WRITER = '''
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
from mmcalidet.utils.file_io import atomic_write
with atomic_write(sys.argv[1]) as f:
    f.write('half of the new content')
    f.flush()
    print('writing', flush=True)
    time.sleep(60)
'''


@pytest.mark.parametrize('signum', [signal.SIGTERM, signal.SIGINT])
@pytest.mark.slow
def test_a_killed_writer_leaves_no_temporary_file(tmp_path, signum):
    out = tmp_path / 'ann.json'
    out.write_text('old content')
    env = dict(os.environ, MMCALIDET_LIGHT='1', PYTHONPATH=PROJECT_ROOT)
    proc = subprocess.Popen([sys.executable, '-c', WRITER,
                             str(out)],
                            stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE,
                            env=env,
                            text=True)
    try:
        assert proc.stdout.readline() == 'writing\n'
        names = os.listdir(tmp_path)
        # while it is written, the temporary file says what it is
        assert len(names) == 2 and any(
            n.startswith('ann.json.incomplete-') and n.endswith('.tmp')
            for n in names), names
        proc.send_signal(signum)
        proc.wait(timeout=20)
    finally:
        proc.kill()
        proc.wait()
    # the signal still ends the process (it is not swallowed); Ctrl-C as
    # a KeyboardInterrupt, which Python turns back into SIGINT at exit
    assert proc.returncode == -signum
    if signum == signal.SIGINT:
        assert 'KeyboardInterrupt' in proc.stderr.read()
    assert os.listdir(tmp_path) == ['ann.json']
    assert out.read_text() == 'old content'


def test_an_error_in_the_block_leaves_the_file_and_no_temporary(tmp_path):
    out = tmp_path / 'ann.json'
    out.write_text('old content')
    with pytest.raises(RuntimeError, match='failed'):
        with atomic_write(out) as f:
            f.write('half')
            raise RuntimeError('failed')
    assert os.listdir(tmp_path) == ['ann.json']
    assert out.read_text() == 'old content'
    # and the SIGTERM handler is the default again
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    with atomic_write(out) as f:
        f.write('new')
    assert out.read_text() == 'new'
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
