# Copyright (c) mmcalidet contributors. All rights reserved.
"""mmengine reads an installed package's ``.mim`` model index once per
process (mmcalidet.utils.external_config_index): a config with
``mmdet::`` bases parses to the same dict, the index files are not read
again, a changed file is, and other files pass through."""
import os
import os.path as osp

from mmengine.config import Config
from mmengine.config import utils as config_utils

import mmcalidet  # noqa: F401  (installs the cache)
from mmcalidet.utils import external_config_index as index
from testing import PROJECT_ROOT

#: a config with mmdet:: bases (the DINO R50 CaliDINO's chain)
CONFIG = osp.join(PROJECT_ROOT, 'configs', 'calidet',
                  'calidet_dino-4scale_r50_8xb2-6e_coco.py')


def test_importing_mmcalidet_installs_the_cache_once():
    assert config_utils.load is index._cached_load
    index.cache_external_config_index()  # idempotent
    assert config_utils.load is index._cached_load
    assert index._LOAD is not index._cached_load


def test_configs_parse_alike_and_the_index_is_read_once(monkeypatch):
    reads = []

    def counting_load(file, *args, **kwargs):
        reads.append(file)
        return original(file, *args, **kwargs)

    original = index._LOAD
    cached = Config.fromfile(CONFIG).to_dict()
    # mmengine's own reads: the same config, every index file read
    monkeypatch.setattr(config_utils, 'load', counting_load)
    uncached = Config.fromfile(CONFIG).to_dict()
    assert uncached == cached
    assert any('.mim' in str(f) for f in reads)
    # through the cache: a second parse reads no index file
    monkeypatch.setattr(config_utils, 'load', index._cached_load)
    monkeypatch.setattr(index, '_LOAD', counting_load)
    Config.fromfile(CONFIG)
    reads.clear()
    assert Config.fromfile(CONFIG).to_dict() == cached
    assert not [f for f in reads if '.mim' in str(f)]


def test_a_changed_index_file_is_read_again_and_others_pass(tmp_path):
    mim = tmp_path / '.mim'
    mim.mkdir()
    path = str(mim / 'model-index.yml')
    with open(path, 'w') as f:
        f.write('Import: [a.yml]\n')
    assert index._cached_load(path) == {'Import': ['a.yml']}
    with open(path, 'w') as f:
        f.write('Import: [b.yml]\n')
    os.utime(path, (1, 1))  # another modification time
    assert index._cached_load(path) == {'Import': ['b.yml']}
    plain = str(tmp_path / 'plain.json')
    with open(plain, 'w') as f:
        f.write('{"x": 1}')
    assert index._cached_load(plain) == {'x': 1}
    with open(plain, 'w') as f:
        f.write('{"x": 2}')
    assert index._cached_load(plain) == {'x': 2}  # never cached
