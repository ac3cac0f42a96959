# Copyright (c) mmcalidet contributors. All rights reserved.
"""testing.run_tool_in_process: a tool's exit status and output
as a new interpreter gives them, and this process as it was."""
import logging
import os
import sys

import torch

from testing import PROJECT_ROOT, run_tool_in_process

SCRIPT = '''
import os, sys, logging
print('argv', sys.argv[1:], 'cwd', os.getcwd())
print('data', os.environ['MMCALIDET_DATA'], file=sys.stderr)
os.environ['LEAKED'] = '1'
logging.root.addHandler(logging.NullHandler())
import torch
torch.set_num_threads(1)
how = sys.argv[1]
if how == 'message':
    sys.exit('tool.py: error: a message')
if how == 'raise':
    raise RuntimeError('boom')
if how == 'code':
    sys.exit(3)
'''


def test_exit_status_output_and_restored_state(tmp_path):
    script = tmp_path / 'tool.py'
    script.write_text(SCRIPT)
    before = (list(sys.argv), os.getcwd(), list(logging.root.handlers),
              torch.get_num_threads())
    res = run_tool_in_process(str(script), 'ok', cwd=str(tmp_path))
    assert res.returncode == 0
    assert res.stdout == f"argv ['ok'] cwd {tmp_path}\n"
    assert res.stderr.startswith('data ')
    res = run_tool_in_process(str(script), 'message')
    assert res.returncode == 1
    assert res.stderr.splitlines()[-1] == 'tool.py: error: a message'
    assert f'cwd {PROJECT_ROOT}' in res.stdout
    res = run_tool_in_process(str(script), 'raise')
    assert res.returncode == 1
    assert 'Traceback' in res.stderr
    assert res.stderr.splitlines()[-1] == 'RuntimeError: boom'
    assert run_tool_in_process(str(script), 'code').returncode == 3
    assert 'LEAKED' not in os.environ
    assert (list(sys.argv), os.getcwd(), list(logging.root.handlers),
            torch.get_num_threads()) == before
