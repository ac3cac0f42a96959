# Copyright (c) mmcalidet contributors. All rights reserved.
"""Guards of process-wide state for every test of the repository (tests/
and projects/*/tests): ``make test`` runs the files of both in the same
worker processes, so what one test leaves behind (the light-import switch,
mmengine's default scope, a stopped training stage) must not reach a test
of the other."""
import os
import uuid
from collections import Counter
from typing import List

import pytest
from mmengine.registry import DefaultScope


def pytest_configure(config: pytest.Config) -> None:
    """mmengine's ``BaseDataset`` collects the garbage after serialising
    its data list (``_serialize_data``): 0.24 s a time in a process that
    holds torch and mmdet, about 5 s of the unit tier's, for datasets of a
    few images. In the test processes (and the tool runs they fork) its
    module's ``gc`` collects nothing; memory is all it frees."""
    import types

    from mmengine.dataset import base_dataset
    base_dataset.gc = types.SimpleNamespace(collect=lambda *args: 0)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config,
                                  items: List[pytest.Item]) -> None:
    """Run the files with the most slow tests first, then the others with
    the most tests first (each file's tests keep their order). ``make
    test`` hands whole files to its workers in this order (``--dist
    loadfile --no-loadscope-reorder``; xdist's own order, by number of
    tests, put the few-test files that train or export last, where one
    worker ran them while the other sat idle). Runs after ``-m``/``-k``
    deselection, so it counts the tests that will run."""

    def file_of(item: pytest.Item) -> str:
        return item.nodeid.split('::', 1)[0]

    slow = Counter(
        file_of(item) for item in items if item.get_closest_marker('slow'))
    count = Counter(file_of(item) for item in items)
    first = {}
    for index, item in enumerate(items):
        first.setdefault(file_of(item), index)

    def order(item: pytest.Item) -> tuple:
        name = file_of(item)
        return -slow[name], -count[name], first[name]

    items.sort(key=order)


@pytest.fixture(autouse=True)
def _keep_light_import_switch():
    """Tools run in-process (runpy) set ``MMCALIDET_LIGHT=1`` for their own
    start-up; restore it so later subprocesses (train.py) import mmcalidet
    in full."""
    before = os.environ.get('MMCALIDET_LIGHT')
    yield
    if before is None:
        os.environ.pop('MMCALIDET_LIGHT', None)
    else:
        os.environ['MMCALIDET_LIGHT'] = before


@pytest.fixture(autouse=True)
def _restore_default_scope():
    """A Runner made in a test (``default_scope='mmengine'``, say) stays the
    process's current scope afterwards, and a later test that builds
    ``PackDetInputs`` by name would fail or pass depending on which tests
    ran before it in the same process (``make test`` spreads the files over
    worker processes). Make the scope a test found current again."""
    before = DefaultScope.get_current_instance()
    yield
    after = DefaultScope.get_current_instance()
    if before is not None and (after is None
                               or after.scope_name != before.scope_name):
        DefaultScope.get_instance(
            f'restored-{uuid.uuid4().hex}', scope_name=before.scope_name)


@pytest.fixture(autouse=True)
def _end_a_stopped_training_stage():
    """A Runner whose ``train()`` a test stops on an exception never runs
    ``after_train``: its message hub keeps ``loop_stage='train'`` and its
    dataset's classes, and a later test in the same process that builds and
    steps a model outside a Runner would read them as its own. End the
    stage a test left behind."""
    from mmengine.logging import MessageHub
    yield
    hub = MessageHub.get_current_instance()
    if hub.get_info('loop_stage') is not None:
        hub.pop_info('loop_stage')
