# Copyright (c) mmcalidet contributors. All rights reserved.
"""The benchmark's reuse rule and schedule bookkeeping
(``projects/context_shift/context_shift/training.py``)."""
from projects.context_shift.context_shift import training


def test_training_settings_name_a_checkpoint_one_way(tmp_path, monkeypatch):
    (tmp_path / 'w').mkdir()
    (tmp_path / 'w' / 'iter_4.pth').write_bytes(b'x')
    config = tmp_path / 'c.py'
    config.write_text("model = dict(type='M', prior='{{$MMCALIDET_CS_DATA:"
                      "d}}/E_t.json')\nload_from = None\n")
    monkeypatch.chdir(tmp_path)
    # a dumped config with the start checkpoint relative to the working
    # folder is the same training as one named by its absolute path
    relative = training.training_settings(
        str(config), ['load_from=w/iter_4.pth'])
    absolute = training.training_settings(
        str(config), [f'load_from={tmp_path}/w/iter_4.pth'])
    assert relative == absolute
    assert relative != training.training_settings(
        str(config), ['load_from=w/iter_5.pth'])
    assert relative != training.training_settings(str(config))
    # the data folder, through a link or not, is the same data
    (tmp_path / 'data').mkdir()
    (tmp_path / 'link').symlink_to(tmp_path / 'data')
    assert training.training_settings(str(config), data='link') == \
        training.training_settings(str(config), data=str(tmp_path / 'data'))


def test_ran_schedule_reads_the_decay_from_the_dumped_config(tmp_path):
    dino_dir, cali_dir = tmp_path / 'dino', tmp_path / 'cali'
    dino_dir.mkdir()
    cali_dir.mkdir()
    dumped = cali_dir / 'calidet.py'
    dumped.write_text("param_scheduler = [dict(type='MultiStepLR', "
                      'milestones=[100])]\n')
    sched = dict(dino=4, decay=3, init='cached', start=4, calidet=3,
                 calidet_decay=2)
    trained = dict(
        dino_dir=str(dino_dir),
        dino_config='projects/context_shift/configs/'
        'dino_tiny_context-shift.py',
        calidet_dir=str(cali_dir),
        calidet_config='projects/context_shift/configs/calidet.py')
    ran = training.ran_schedule(sched, trained)
    # no dumped DINO config: the planned decay; the calibrator's only
    # milestone lies past its 3 updates: a constant lr
    assert ran['decay'] == 3 and ran['calidet_decay'] is None
    assert sched['calidet_decay'] == 2  # the plan is left as it was
    dumped.write_text("param_scheduler = [dict(type='MultiStepLR', "
                      'milestones=[2, 1])]\n')
    assert training.ran_schedule(sched, trained)['calidet_decay'] == 1


def test_follow_training_reads_the_iterations_from_the_log(tmp_path, capsys):
    import subprocess
    import sys
    log = tmp_path / 'train.log'
    script = ('import sys, time\n'
              'for i in (2, 4):\n'
              '    print(f"Iter(train) [ {i}/4]  lr: 1e-4", flush=True)\n'
              '    time.sleep(0.1)\n'
              'sys.exit(int(sys.argv[1]))\n')
    for code in (0, 3):
        with open(log, 'w') as f:
            proc = subprocess.Popen([sys.executable, '-c', script,
                                     str(code)],
                                    stdout=f,
                                    stderr=subprocess.STDOUT)
        assert training.follow_training(
            proc, str(log), 4, 'dino', poll=0.02) == code
        # the bar (stderr) counted the logged iterations; the log stays
        bar = capsys.readouterr().err
        assert '4/4' in bar
        assert 'Iter(train) [ 4/4]' in log.read_text()
