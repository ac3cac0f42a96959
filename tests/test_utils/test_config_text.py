# Copyright (c) mmcalidet contributors. All rights reserved.
"""cache_config_formatting: the same config text, one yapf pass."""
import pytest
from mmengine.config import Config
from mmengine.config import config as config_module

from mmcalidet.utils.config_text import cache_config_formatting
from testing import PROJECT_ROOT


def test_one_yapf_pass_per_text_and_the_same_text(monkeypatch):
    cfg = Config.fromfile(
        f'{PROJECT_ROOT}/configs/calidet/calidet_dino_tiny_coco-mini.py')
    expected = cfg.pretty_text  # mmengine's own formatting
    calls = []
    original = config_module.FormatCode

    def counted(text, style_config=None, **kwargs):
        calls.append(text)
        return original(text, style_config=style_config, **kwargs)

    monkeypatch.setattr(config_module, 'FormatCode', counted)
    cached = cache_config_formatting()
    assert cache_config_formatting() is cached  # idempotent
    assert cached.uncached is counted
    assert cfg.pretty_text == expected
    assert cfg.pretty_text == expected
    assert len(calls) == 1
    # another text is formatted, and is the text mmengine writes
    cfg.merge_from_dict({'train_cfg.max_iters': 7})
    text = cfg.pretty_text
    assert len(calls) == 2 and 'max_iters=7' in text
    monkeypatch.setattr(config_module, 'FormatCode', original)
    assert cfg.pretty_text == text


@pytest.mark.parametrize('maxsize', [0, -1, 2.5, float('nan'), float('inf')])
def test_a_bad_cache_size_is_refused(maxsize):
    with pytest.raises(ValueError, match='^maxsize must be an integer'):
        cache_config_formatting(maxsize)
