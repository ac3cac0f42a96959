# Copyright (c) mmcalidet contributors. All rights reserved.
import contextlib
import json
import logging
import os
import os.path as osp
import subprocess
import sys
from typing import Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
from mmengine.config import Config
from mmengine.structures import InstanceData

from mmcalidet.utils.log_level import mmengine_log_level

#: the source checkout (configs/, tools/ live here): this folder's parent
#: (testing/ is never installed)
PROJECT_ROOT = osp.dirname(osp.dirname(osp.realpath(__file__)))


def data_root() -> str:
    """The shared data folder: ``$MMCALIDET_DATA``, default
    ``<project root>/../shared/datasets``."""
    return os.environ.get(
        'MMCALIDET_DATA',
        osp.normpath(osp.join(PROJECT_ROOT, '..', 'shared', 'datasets')))


def run_tool(script: str,
             *args: str,
             threads: Optional[int] = None,
             timeout: int = 600,
             cwd: str = PROJECT_ROOT,
             env: Optional[dict] = None) -> subprocess.CompletedProcess:
    """Run a project script (``tools/...``, ``benchmarks/...``) under this
    Python with the shared data folder, capturing its output: in a process
    of its own, forked from one that has imported torch, mmdet and
    mmcalidet already (:mod:`testing.tool_server`; a new
    interpreter with ``MMCALIDET_TOOL_SERVER=0``).

    Args:
        script (str): path relative to the project root (or absolute).
        *args (str): its command-line arguments.
        threads (int, optional): ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS``
            for the run (e.g. 1: the same arithmetic on every machine).
        timeout (int): seconds before the run is killed.
        cwd (str): its working folder (default: the project root).
        env (dict, optional): environment variables to set for the run,
            beside this process's.

    Returns:
        subprocess.CompletedProcess: with ``returncode``, ``stdout`` and
        ``stderr`` (text).
    """
    env = dict(os.environ, MMCALIDET_DATA=data_root(), **(env or {}))
    # a tool that wants the light import asks for it itself; one run
    # in-process before may have left the switch set in this process
    env.pop('MMCALIDET_LIGHT', None)
    if threads is not None:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    server = _tool_server()
    if server is not None and server.serves(env):
        return server.run(
            osp.join(PROJECT_ROOT, script), list(args), env, cwd, timeout)
    return subprocess.run(
        [sys.executable, osp.join(PROJECT_ROOT, script), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout)


def popen_tool(cmd: List[str],
               cwd: str,
               env: dict,
               stdout,
               stderr=None) -> subprocess.Popen:
    """``subprocess.Popen(cmd, cwd=cwd, env=env, stdout=stdout,
    stderr=stderr, text=True)`` for ``[sys.executable, script, *args]``:
    forked from the tool server as :func:`run_tool` does (a
    :class:`testing.tool_server.ForkedProcess`, read as a
    ``Popen``), else a new interpreter.

    Args:
        cmd (list[str]): the command.
        cwd (str): its working folder.
        env (dict): its environment.
        stdout: an open file its output goes to, or ``subprocess.PIPE``
            (with ``stderr=subprocess.STDOUT``; read with
            ``communicate``).
        stderr: ``subprocess.STDOUT`` or an open file.

    Returns:
        subprocess.Popen | ForkedProcess: the run.
    """
    server = _tool_server()
    into_stdout = stderr == subprocess.STDOUT
    piped = stdout == subprocess.PIPE and into_stdout
    # the command's form first: serves() starts the server
    forkable = (
        server is not None and len(cmd) >= 2 and cmd[0] == sys.executable
        and cmd[1].endswith('.py') and
        (piped or hasattr(stdout, 'name') and
         (into_stdout or hasattr(stderr, 'name'))) and server.serves(env))
    if not forkable:
        return subprocess.Popen(
            cmd, cwd=cwd, env=env, stdout=stdout, stderr=stderr, text=True)
    output = server.output_file() if piped else stdout.name
    for stream in (stdout, stderr):
        if hasattr(stream, 'flush'):
            stream.flush()
    proc = server.start(
        osp.join(cwd, cmd[1]), cmd[2:], env, cwd, output,
        None if into_stdout else stderr.name)
    if piped:
        proc.output = output
    return proc


_SERVER: list = []


def _tool_server():
    """This process's :class:`testing.tool_server.ToolServer`
    (made on first use, ended at exit), or None where
    ``MMCALIDET_TOOL_SERVER=0`` asks for a new interpreter per run."""
    if os.environ.get('MMCALIDET_TOOL_SERVER', '1') == '0':
        return None
    if not _SERVER:
        import atexit

        from .tool_server import ToolServer
        _SERVER.append(ToolServer(dict(os.environ)))
        atexit.register(_SERVER[0].close)
    return _SERVER[0]


def run_tool_in_process(
        script: str,
        *args: str,
        cwd: str = PROJECT_ROOT) -> subprocess.CompletedProcess:
    """Run a project script as :func:`run_tool` does, but in this process:
    for a test of what a tool says about bad input before it builds
    anything (its exit status and its one line), without the 6 s that a new
    interpreter spends importing torch, mmcv and mmdet.

    The script runs as ``__main__`` with its own ``sys.argv``, the project
    root as working folder and the shared data folder; this process's
    arguments, environment, working folder, streams, warning filters,
    root logger handlers and torch threads are restored afterwards (the
    handlers mmengine's logger gets from a tool's ``log_to_file`` too, with
    :func:`testing.logging_restored` around the call). A run that trains in
    its own process belongs in :func:`run_tool`, whose process leaves
    nothing behind; one that starts its trainings as processes (the
    benchmark's, forked by :func:`popen_tool`) may run here. A logging
    handler an earlier test left on a closed stream fails silently
    meanwhile, as it would not exist in a new process.

    Args:
        script (str): path relative to the project root (or absolute).
        *args (str): its command-line arguments.
        cwd (str): its working folder (default: the project root).

    Returns:
        subprocess.CompletedProcess: ``returncode`` as the interpreter
        would give it (``sys.exit`` with a message: 1, the message on
        stderr; an uncaught exception: 1, its traceback on stderr),
        ``stdout`` and ``stderr``.
    """
    import io
    import warnings

    from .tool_server import run_script
    path = osp.join(PROJECT_ROOT, script)
    out, err = io.StringIO(), io.StringIO()
    saved = (list(sys.argv), dict(os.environ), os.getcwd(),
             list(logging.root.handlers), logging.root.level,
             torch.get_num_threads(), logging.raiseExceptions)
    code = 0
    try:
        sys.argv = [path, *args]
        os.environ['MMCALIDET_DATA'] = data_root()
        os.environ.pop('MMCALIDET_LIGHT', None)
        os.chdir(cwd)
        # a logger an earlier test made may still write to that test's
        # closed capture: its failure is not the tool's output
        logging.raiseExceptions = False
        with warnings.catch_warnings(), contextlib.redirect_stdout(
                out), contextlib.redirect_stderr(err):
            code = run_script(path)
    finally:
        (sys.argv, env, cwd_before, handlers, level, threads,
         logging.raiseExceptions) = saved
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd_before)
        logging.root.handlers[:] = handlers
        logging.root.setLevel(level)
        torch.set_num_threads(threads)
    return subprocess.CompletedProcess([sys.executable, path, *args], code,
                                       out.getvalue(), err.getvalue())


def random_label_lists(num: int = 200,
                       seed: int = 0,
                       num_classes: int = 5) -> List[np.ndarray]:
    """Image-level label lists of 0-3 distinct classes each.

    Args:
        num (int): images.
        seed (int): the generator's seed.
        num_classes (int): K.

    Returns:
        list[np.ndarray]: one array of class indices per image.
    """
    rng = np.random.default_rng(seed)
    return [
        rng.choice(num_classes, size=rng.integers(0, 4), replace=False)
        for _ in range(num)
    ]


def brute_force_prior(label_lists: Sequence[np.ndarray],
                      num_classes: int = 5) -> np.ndarray:
    """E[i, j] = #(images with i and j) / #(images with j), 0.5 in a column
    of an absent class, 1 on the diagonal (the paper's reference code),
    by loops: the reference the fast statistics are tested against.

    Args:
        label_lists (Sequence[np.ndarray]): class indices per image.
        num_classes (int): K.

    Returns:
        np.ndarray: the K x K prior.
    """
    prior = np.full((num_classes, num_classes), 0.5)
    for j in range(num_classes):
        with_j = [set(x.tolist()) for x in label_lists if j in x]
        for i in range(num_classes):
            if with_j:
                prior[i, j] = sum(i in s for s in with_j) / len(with_j)
    np.fill_diagonal(prior, 1.0)
    return prior


def get_config(name: str, prior: Optional[str] = None) -> Config:
    """Load ``configs/<name>`` with the data folder of :func:`data_root`.

    Args:
        name (str): config path relative to ``configs/``.
        prior (str, optional): replace the config's prior (the model's
            default and the EdgeSampler's E_t) by this file or name.

    Returns:
        Config: the loaded config.
    """
    os.environ.setdefault('MMCALIDET_DATA', data_root())
    cfg = Config.fromfile(osp.join(PROJECT_ROOT, 'configs', name))
    if prior is not None and 'prior' in cfg.model:
        cfg.model.prior = prior  # the EdgeSampler takes the detector's
    return cfg


def coco_mini_label_lists(
        split: str = 'train') -> Tuple[List[np.ndarray], List[str]]:
    """Per-image class indices (crowd excluded) of a coco-mini split, in
    mmdet's contiguous COCO order.

    Returns:
        tuple[list[np.ndarray], list[str]]: label lists and class names.
    """
    path = osp.join(data_root(), 'coco-mini', 'reference',
                    f'instances_{split}2017_coco-mini.json')
    with open(path, encoding='utf-8') as f:
        coco = json.load(f)
    cats = sorted(coco['categories'], key=lambda c: c['id'])
    index = {c['id']: k for k, c in enumerate(cats)}
    labels = {img['id']: [] for img in coco['images']}
    for ann in coco['annotations']:
        if not ann.get('iscrowd', 0):
            labels[ann['image_id']].append(index[ann['category_id']])
    return [np.asarray(v, dtype=np.int64) for v in labels.values()], \
        [c['name'] for c in cats]


def save_coco_mini_prior(path: str, split: str = 'train') -> str:
    """Write E over a coco-mini split as a prior JSON file (with names)."""
    from mmcalidet.priors import batch_prior, save_prior
    label_lists, classes = coco_mini_label_lists(split)
    return save_prior(
        path,
        batch_prior(len(classes), label_lists),
        classes=classes,
        source=f'coco-mini {split}2017')


def demo_batch(labels: Sequence[Sequence[int]],
               size: int = 64,
               seed: int = 0) -> dict:
    """A batch for ``model.data_preprocessor``: random images and one box
    per label.

    Args:
        labels (Sequence[Sequence[int]]): class indices per image (an empty
            list is an image without objects).
        size (int): image height and width.
        seed (int): seed of the images and boxes.

    Returns:
        dict: ``dict(inputs=[...], data_samples=[...])``.
    """
    from mmdet.structures import DetDataSample
    gen = torch.Generator().manual_seed(seed)
    inputs, data_samples = [], []
    for image_labels in labels:
        inputs.append(
            torch.randint(
                0, 256, (3, size, size), generator=gen, dtype=torch.uint8))
        n = len(image_labels)
        xy = torch.rand(n, 2, generator=gen) * size * 0.6
        wh = torch.rand(n, 2, generator=gen) * size * 0.3 + size * 0.1
        sample = DetDataSample(
            metainfo=dict(
                img_shape=(size, size),
                ori_shape=(size, size),
                scale_factor=(1.0, 1.0),
                pad_shape=(size, size),
                batch_input_shape=(size, size)))
        sample.gt_instances = InstanceData(
            bboxes=torch.cat([xy, xy + wh], dim=1),
            labels=torch.as_tensor(list(image_labels), dtype=torch.long))
        sample.ignored_instances = InstanceData(
            bboxes=torch.zeros(0, 4), labels=torch.zeros(0, dtype=torch.long))
        data_samples.append(sample)
    return dict(inputs=inputs, data_samples=data_samples)


def train_steps(model: torch.nn.Module,
                batch: dict,
                steps: int = 8,
                lr: float = 2e-4,
                max_norm: float = 0.1) -> List[float]:
    """A few optimiser steps on one batch, as DINO trains (AdamW, gradient
    clipping), each with the same seeds; returns the total losses.

    Args:
        model (nn.Module): a detector with a data preprocessor.
        batch (dict): ``dict(inputs=..., data_samples=...)``.
        steps (int): optimiser steps.
        lr (float): learning rate.
        max_norm (float): gradient clipping norm.

    Returns:
        list[float]: the total loss before each step.
    """
    import copy
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    np.random.seed(0)
    history = []
    for _ in range(steps):
        torch.manual_seed(0)
        data = model.data_preprocessor(copy.deepcopy(batch), True)
        losses = model.loss(data['inputs'], data['data_samples'])
        total = sum(losses.values())
        optimizer.zero_grad()
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        optimizer.step()
        history.append(total.item())
    return history


def build_detector(name: str, seed: int = 0, **model) -> torch.nn.Module:
    """The detector of ``configs/<name>`` with seeded initial weights, on
    the CPU, in training mode: :func:`mmcalidet.apis.init_detector` without
    a checkpoint (``dataset_meta`` names the config's classes).

    Args:
        name (str): config path relative to ``configs/``.
        seed (int): torch seed of the initialisation.
        **model: entries that update ``cfg.model``.

    Returns:
        nn.Module: the detector.
    """
    from mmcalidet.apis import init_detector
    cfg = get_config(name)
    cfg.model.update(model)
    torch.manual_seed(seed)
    return init_detector(cfg, None, device='cpu').train()


def set_known_scores(model: torch.nn.Module,
                     classes: Sequence[int] = (1, 2),
                     high: float = 3.0,
                     low: float = -6.0,
                     cali_scale: float = 0.05) -> None:
    """Make a CaliDet model's decoder scores known, whatever its random
    weights: every query's logit of a class in ``classes`` is ``high``, of
    the others ``low``, plus the calibration term ``rho V'^T h`` shrunk by
    ``cali_scale``.

    The decoder's classification branches get zero weights and these
    biases; the CaliFormer's last LayerNorm (whose output is V') is scaled
    by ``cali_scale``. On the tiny models (d = 256, rho = 0.2, ``h`` and the
    unscaled V' of unit scale) the term then stays within about +-1, so
    with the defaults the classes in ``classes`` score 0.88-0.98 on every
    query and the others below 0.01, while the scores still depend (a
    little) on the prior. Box branches, hidden states and the encoder's
    proposal branch are unchanged. Keep every high-scoring candidate with
    ``test_cfg.max_per_img >= num_queries * len(classes)``, so that each
    image predicts every class in ``classes``.

    Args:
        model (nn.Module): a CaliDet detector (changed in place).
        classes (Sequence[int]): the classes that score high.
        high (float): their logit bias.
        low (float): the other classes' logit bias.
        cali_scale (float): factor of V'.
    """
    from mmcalidet.models.head_kinds.decoder import DECODER
    last_norm = model.bbox_head.califormer.encoder.layers[-1].norms[-1]
    with torch.no_grad():
        for branch in DECODER.cls_layers(model.bbox_head).values():
            branch.weight.zero_()
            branch.bias.fill_(low)
            branch.bias[list(classes)] = high
        last_norm.weight.mul_(cali_scale)
        last_norm.bias.mul_(cali_scale)


def random_prior(seed: int, num_classes: int = 80) -> np.ndarray:
    """A uniform random K x K prior with diagonal 1."""
    rng = np.random.default_rng(seed)
    prior = rng.uniform(size=(num_classes, num_classes))
    np.fill_diagonal(prior, 1.0)
    return prior


def eval_inputs(model: torch.nn.Module,
                labels: Sequence[Sequence[int]] = ((1, 2), (3, )),
                size: int = 64) -> tuple:
    """Preprocessed test inputs and data samples of a :func:`demo_batch`."""
    data = model.data_preprocessor(demo_batch(labels, size=size), False)
    return data['inputs'], data['data_samples']


@contextlib.contextmanager
def captured_log() -> Iterator[List[str]]:
    """Collect what mmengine's current logger writes inside the block, from
    INFO up, whatever level an earlier caller left the logger at (a tool
    run in the test process quiets it to WARNING, see
    :func:`mmcalidet.utils.log_level.quiet_mmengine`).

    Yields:
        list[str]: the messages, filled as they are logged.
    """
    messages: List[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    with mmengine_log_level(at_most=logging.INFO) as logger:
        logger.addHandler(handler)
        try:
            yield messages
        finally:
            logger.removeHandler(handler)


def damage_cache_file(folder: str, name: str, how: str) -> str:
    """Damage one file of a decoder cache as a crash, a full disk or a
    careless user would.

    Args:
        folder (str): the cache folder.
        name (str): the file (``hidden.npy``, ``metainfo.json``, ...).
        how (str): ``'truncate'`` (its last bytes cut), ``'delete'`` or
            ``'garble'`` (replaced by text that is not JSON).

    Returns:
        str: the file's path.
    """
    path = osp.join(folder, name)
    if how == 'truncate':
        with open(path, 'r+b') as f:
            f.truncate(osp.getsize(path) - 5)
    elif how == 'delete':
        os.remove(path)
    elif how == 'garble':
        with open(path, 'w') as f:
            f.write('[{"img_id": ')
    else:
        raise ValueError(f'unknown damage {how!r}')
    return path


def match_config_classes(model: torch.nn.Module, cfg) -> torch.nn.Module:
    """Give a detector built with ``MODELS.build`` its config's dataset
    classes, as :class:`~mmcalidet.engine.PriorClassesHook` does before a
    runner trains it (and ``init_detector`` when it sets ``dataset_meta``):
    a CaliDet model's named priors are reordered to them. The classes are
    the config's datasets' (``metainfo.classes``), else COCO's for a model
    of 80 classes (mmdet's default); a plain detector is left alone.

    Args:
        model (nn.Module): the detector.
        cfg (Config): its config.

    Returns:
        nn.Module: ``model``.
    """
    from mmcalidet.apis import config_classes
    match = getattr(model, 'match_prior_classes', None)
    if match is None:
        return model
    classes = config_classes(cfg)
    if classes is None and model.num_classes == 80:
        from mmdet.datasets import CocoDataset
        classes = list(CocoDataset.METAINFO['classes'])
    if classes is not None:
        match(classes)
    return model


def known_scores_setup(predicted: Sequence[int] = (1, 2),
                       num_images: int = 4) -> tuple:
    """The tiny CaliDINO with known scores (:func:`set_known_scores`: every
    image predicts exactly ``predicted``), its first ``num_images`` coco-mini
    val images at 96 x 96 cached, and their evaluator: the protocol's
    tests run on it.

    Args:
        predicted (Sequence[int]): the classes every query scores high.
        num_images (int): the cached images.

    Returns:
        tuple: ``(model, loader, cache, evaluator)``; the model in eval
        mode.
    """
    from mmdet.registry import MODELS
    from mmengine.registry import init_default_scope
    from mmengine.runner import Runner

    from mmcalidet.evaluation import CocoEvaluator, cache_hidden_states
    init_default_scope('mmdet')
    cfg = get_config('calidet/calidet_dino_tiny_coco-mini.py')
    cfg.test_dataloader.dataset.indices = num_images
    cfg.test_dataloader.dataset.pipeline[1].scale = (96, 96)
    # 30 queries x 2 classes: every high-scoring candidate is kept
    cfg.model.test_cfg.max_per_img = 30 * len(predicted)
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    set_known_scores(model, predicted)
    loader = Runner.build_dataloader(cfg.test_dataloader)
    model.dataset_meta = dict(loader.dataset.metainfo)
    model.eval()
    cache = cache_hidden_states(model, loader, progress=False)
    evaluator = CocoEvaluator(cfg.test_evaluator.ann_file,
                              loader.dataset.metainfo['classes'])
    return model, loader, cache, evaluator
