# Copyright (c) mmcalidet contributors. All rights reserved.
"""The trainings of the context-shift benchmark: the data, the schedules of
the plain DINO and the CaliDINO, and one ``tools/train.py`` run per work
folder, skipped when its last checkpoint exists and was trained with the
same model, optimizer, schedule and init on the same data (the config
mmengine keeps in the checkpoint, which records the data's identity,
:func:`data_identity`). A run's output goes to ``<work_dir>/train.log``;
the terminal shows a progress bar."""
import argparse
import hashlib
import json
import os
import os.path as osp
import re
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence

#: the repository root (tools/train.py and the configs are found from it)
ROOT = osp.dirname(
    osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))
CONFIGS = 'projects/context_shift/configs/'

#: (plain DINO, CaliDINO fine-tune, CaliDINO calibrator) configs and the
#: default data folder of each data variant; on 10 classes the calibrator
#: is the support-aware prior's, chosen by the rule of the project README
#: ("Relation-reading candidates"; the presence-trained one before it:
#: ``*_cached.py``, ``--calibrator-config``); on 40 classes it costs 3 AP
#: at E_t, so the presence-trained one stays
VARIANTS = {
    'digits':
    dict(
        dino=CONFIGS + 'dino_tiny_context-shift.py',
        calidet=CONFIGS + 'calidet_dino_tiny_context-shift.py',
        cached=CONFIGS + 'calidet_dino_tiny_context-shift_cached_support.py',
        data='data/context_shift'),
    'many-class':
    dict(
        dino=CONFIGS + 'dino_tiny_context-shift_many-class.py',
        calidet=CONFIGS + 'calidet_dino_tiny_context-shift_many-class.py',
        cached=CONFIGS +
        'calidet_dino_tiny_context-shift_many-class_cached.py',
        data='data/context_shift_many-class'),
}
#: the configs of the benchmark's one-stage RTMDet and two-stage Faster
#: R-CNN, whose CaliDet twins are calibrated on the plain detector's cached
#: features (dense locations, sampled RoIs; 10 classes only)
CACHED_ONLY = {
    'rtmdet':
    dict(
        baseline=CONFIGS + 'rtmdet_tiny_context-shift.py',
        # the support-aware prior with 10,000 CaliFormer updates at either
        # budget (the project README, "The one-stage calibrator's updates")
        cached=CONFIGS + 'calidet_rtmdet_tiny_context-shift_cached_support.py',
        updates=10000,
        cache_dir='dense_cache_train',
        variants=('digits', ),
        names=('RTMDet', 'CaliRTMDet')),
    'faster-rcnn':
    dict(
        baseline=CONFIGS + 'faster-rcnn_tiny_context-shift.py',
        # the support-aware prior with LoMa on the softmax probabilities
        # (the project README, "The two-stage calibrator's LoMa")
        cached=CONFIGS +
        'calidet_faster-rcnn_tiny_context-shift_cached_support.py',
        cache_dir='roi_cache_train',
        variants=('digits', ),
        names=('FasterRCNN', 'CaliFasterRCNN')),
}
#: the benchmark's detectors (``--detector``): the DETR (DINO, the
#: default), then those of :data:`CACHED_ONLY`
DETECTORS = ('dino', *CACHED_ONLY)
#: (dino iterations, fine-tune iterations, calibrator updates) per mode
SCHEDULES = dict(full=(3000, 1000, 10000), quick=(900, 300, 3000))

#: the config key under which a training records the identity of the
#: benchmark data it read (:func:`data_identity`)
DATA_KEY = 'context_shift_data'
#: the config parts that decide what a training produces
TRAINING_KEYS = ('model', 'optim_wrapper', 'param_scheduler', 'load_from',
                 'randomness', DATA_KEY)
#: the annotation files of a benchmark data folder that a training reads
#: (the splits of ``configs/_base_/context_shift_data.py``)
SPLIT_FILES = ('annotations/instances_train.json',
               'annotations/instances_val.json')
#: what a data identity holds, in the order differences are named
DATA_FIELDS = ('seed', 'variant', 'validation_sites', 'splits')

#: how a training process starts: ``subprocess.Popen`` (the project's
#: tests fork it from a process that has imported torch and mmdet once,
#: ``testing.popen_tool``)
launch = subprocess.Popen


def training_settings(config: str,
                      options: Sequence[str] = (),
                      data: Optional[str] = None) -> str:
    """The parts of a config (with ``--cfg-options`` applied) that decide
    what a training produces (:data:`TRAINING_KEYS`), as canonical JSON.

    Args:
        config (str): a config file (or the copy a training dumped).
        options (Sequence[str]): ``KEY=VALUE`` overrides.
        data (str, optional): the benchmark data folder
            (``MMCALIDET_CS_DATA``).

    Returns:
        str: JSON with sorted keys (tuples as lists); ``load_from`` as a
        real path (relative ones from the working folder).
    """
    from mmengine.config import Config, DictAction
    parser = argparse.ArgumentParser()
    parser.add_argument('--o', nargs='*', action=DictAction, default={})
    overrides = parser.parse_args(['--o'] + list(options)).o
    old = os.environ.get('MMCALIDET_CS_DATA')
    if data is not None:
        os.environ['MMCALIDET_CS_DATA'] = osp.realpath(data)
    try:
        cfg = Config.fromfile(config)
    finally:
        if old is None:
            os.environ.pop('MMCALIDET_CS_DATA', None)
        else:
            os.environ['MMCALIDET_CS_DATA'] = old
    cfg.merge_from_dict(overrides)
    return _settings(cfg)


def checkpoint_settings(checkpoint: str) -> Optional[str]:
    """:func:`training_settings` of the config a checkpoint was trained
    with, which mmengine keeps in its ``meta['cfg']``.

    Args:
        checkpoint (str): a checkpoint written by an mmengine runner.

    Returns:
        str | None: the settings, or ``None`` when the checkpoint keeps no
        config.

    Raises:
        CheckpointError: when the checkpoint cannot be read.
    """
    from mmengine.config import Config

    from mmcalidet.utils.checkpoint import read_checkpoint_mapped
    meta = read_checkpoint_mapped(checkpoint).get('meta')
    text = meta.get('cfg') if isinstance(meta, dict) else None
    if not isinstance(text, str):
        return None
    return _settings(Config.fromstring(text, '.py'))


def changed_keys(ran: str, planned: str) -> List[str]:
    """The :data:`TRAINING_KEYS` in which two :func:`training_settings`
    differ."""
    ran_d, planned_d = json.loads(ran), json.loads(planned)
    return [k for k in TRAINING_KEYS if ran_d.get(k) != planned_d.get(k)]


def _read_meta(folder: str) -> Optional[Dict]:
    """The ``meta.json`` of a benchmark data folder, or ``None`` when it is
    missing or unreadable (not a dict of JSON)."""
    try:
        with open(osp.join(folder, 'meta.json')) as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def splits_digest(folder: str) -> str:
    """A digest of the split files of a data folder (:data:`SPLIT_FILES`,
    what a training reads): another draw of the data, or files edited
    since, give another digest.

    Args:
        folder (str): the benchmark data folder.

    Returns:
        str: ``sha256:<hex>`` over each file's name and content (a missing
        file counts as such).
    """
    digest = hashlib.sha256()
    for name in SPLIT_FILES:
        digest.update(name.encode() + b'\0')
        path = osp.join(folder, name)
        if not osp.isfile(path):
            digest.update(b'missing\0')
            continue
        with open(path, 'rb') as f:
            for block in iter(lambda: f.read(1 << 20), b''):
                digest.update(block)
        digest.update(b'\0')
    return 'sha256:' + digest.hexdigest()


def data_identity(data: Optional[str]) -> Optional[Dict]:
    """The identity of the benchmark data a training reads: the data seed,
    the variant, whether its val split is validation sites
    (``make_data.py --validation-sites``), as its ``meta.json`` records
    them, and :func:`splits_digest` of its split files.

    Args:
        data (str, optional): the benchmark data folder.

    Returns:
        dict | None: ``seed``, ``variant``, ``validation_sites`` (``None``
        each where ``meta.json`` is missing or does not say) and
        ``splits``; ``None`` when there is no such folder.
    """
    if data is None or not osp.isdir(data):
        return None
    meta = _read_meta(data) or {}
    seed, variant = meta.get('seed'), meta.get('variant')
    return dict(
        seed=seed if isinstance(seed, int) else None,
        variant=variant if isinstance(variant, str) else None,
        validation_sites=('validation_sites' in meta) if meta else None,
        splits=splits_digest(data))


def data_options(identity: Optional[Dict]) -> List[str]:
    """The ``--cfg-options`` that record a data identity in a training's
    config (:data:`DATA_KEY`), so that its checkpoint keeps it.

    Args:
        identity (dict, optional): :func:`data_identity`'s result.

    Returns:
        list[str]: ``KEY=VALUE`` options.
    """
    if identity is None:
        return [f'{DATA_KEY}=None']
    return [f'{DATA_KEY}.{k}={identity[k]}' for k in DATA_FIELDS]


def data_changes(ran: Optional[Dict], planned: Optional[Dict]) -> List[str]:
    """How the data a training ran on differs from the planned data, in
    words.

    Args:
        ran (dict, optional): the identity its checkpoint records
            (``None``: none, or no data folder).
        planned (dict, optional): this run's :func:`data_identity`.

    Returns:
        list[str]: e.g. ``['seed 0, not 5', 'other split files']``; empty
        when they are the same.
    """
    if ran == planned:
        return []
    if not isinstance(ran, dict):
        return ['no record of its data']
    if not isinstance(planned, dict):
        return ['no data folder now']
    changes = []
    for key in DATA_FIELDS:
        if ran.get(key) == planned.get(key):
            continue
        if key == 'splits':
            changes.append('other split files')
        elif key == 'validation_sites':
            changes.append('validation sites, not deployment sites' if ran.
                           get(key) else 'deployment sites, not validation '
                           'sites')
        else:
            changes.append(f'{key} {ran.get(key)}, not {planned.get(key)}')
    return changes or ['another record of its data']


def _settings(cfg) -> str:
    """:func:`training_settings` of a loaded config."""
    picked = {k: cfg.get(k) for k in TRAINING_KEYS}
    if isinstance(picked['load_from'], str):
        # the same checkpoint, named relative to the working folder or not
        picked['load_from'] = osp.realpath(picked['load_from'])
    return json.dumps(
        json.loads(json.dumps(picked, default=str)), sort_keys=True)


class Training:
    """One tools/train.py run, skipped when ``iter_<max_iters>.pth``
    exists and was trained with the same :func:`training_settings` as this
    run (read from the checkpoint, :func:`checkpoint_settings`), unless
    ``retrain``. The settings include the identity of the data
    (:func:`data_identity`: data seed, variant, validation sites and a
    digest of the split files), which the run records in its config
    (:data:`DATA_KEY`): a checkpoint trained on other data, or one that
    does not record its data, is trained again. A checkpoint of another
    config in the same folder (another ``--calibrator-config``) is trained
    again, not reused. A checkpoint that keeps no config (one rebuilt from
    its weights) is compared through the copy of ``config`` dumped beside
    it; without either, nothing is overwritten: a ``ValueError`` asks for
    ``--retrain``.

    Args:
        config (str): the config.
        work_dir (str): its work folder.
        max_iters (int): the last iteration (names the last checkpoint).
        options (list[str]): ``--cfg-options``.
        retrain (bool): train even if the last checkpoint exists.
        data (str): the benchmark data folder.
        threads (int, optional): torch threads (trainings side by side).
        progress (bool): show a progress bar while waiting.
    """

    def __init__(self,
                 config: str,
                 work_dir: str,
                 max_iters: int,
                 options: List[str],
                 retrain: bool,
                 data: str,
                 threads: Optional[int] = None,
                 progress: bool = True) -> None:
        self.config, self.work_dir = config, work_dir
        self.progress = progress
        self.last = osp.join(work_dir, f'iter_{max_iters}.pth')
        self.proc = None
        self.start = time.perf_counter()
        # the data's identity goes into the config the checkpoint keeps
        options = list(options) + data_options(data_identity(data))
        if osp.isfile(self.last) and not retrain:
            why = self.why_train_again(options, data)
            if why is None:
                print(f'[train] reusing {self.last}')
                return
            print(f'[train] {self.last} {why}: training again')
        cmd = [
            sys.executable,
            osp.join(ROOT, 'tools', 'train.py'), config, '--work-dir',
            work_dir, '--cfg-options'
        ] + options
        os.makedirs(work_dir, exist_ok=True)
        self.log = osp.join(work_dir, 'train.log')
        print(
            f'[train] {osp.basename(config)} ({max_iters} iterations; '
            f'log: {self.log})',
            flush=True)
        env = dict(os.environ, MMCALIDET_CS_DATA=osp.realpath(data))
        env.pop('MMCALIDET_LIGHT', None)
        if threads:
            env.update(
                OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
        with open(self.log, 'w') as log:
            log.write(' '.join(cmd[1:]) + '\n')
            log.flush()
            self.proc = launch(
                cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.max_iters = max_iters

    def why_train_again(self, options: List[str], data: str) -> Optional[str]:
        """Why the existing last checkpoint cannot be reused.

        Args:
            options (list[str]): this run's ``--cfg-options``, with its
                data identity (:func:`data_options`).
            data (str): the benchmark data folder.

        Returns:
            str | None: the reason (unreadable, other data, or the
            settings that differ); ``None``: it can be reused.

        Raises:
            ValueError: when it keeps no config and none of this name was
                dumped beside it (nothing to compare; not overwritten).
        """
        from mmcalidet.utils.checkpoint import CheckpointError
        try:
            ran = checkpoint_settings(self.last)
        except CheckpointError as exc:
            return f'cannot be read ({exc})'
        if ran is None:  # compare the config dumped beside it instead
            dumped = trained_config(self.work_dir, self.config)
            if dumped == self.config:
                raise ValueError(
                    f'{self.last} keeps no config and no '
                    f'{osp.basename(self.config)} was dumped beside it: what '
                    'it was trained with is unknown; pass --retrain to train '
                    'over it, or choose another work folder')
            ran = training_settings(dumped)
        planned = training_settings(self.config, options, data)
        if ran == planned:
            return None
        keys = changed_keys(ran, planned)
        why = []
        if DATA_KEY in keys:
            keys.remove(DATA_KEY)
            why.append('was trained on other data (' + ', '.join(
                data_changes(
                    json.loads(ran).get(DATA_KEY),
                    json.loads(planned).get(DATA_KEY))) + ')')
        if keys:
            why.append('was trained with other settings (' + ', '.join(keys) +
                       (' differs)' if len(keys) == 1 else ' differ)'))
        return ' and '.join(why)

    def wait(self) -> float:
        """Wait for the run; returns its wall-clock seconds (0: reused)."""
        if self.proc is None:
            return 0.0
        code = follow_training(self.proc, self.log, self.max_iters,
                               osp.basename(self.work_dir), self.progress)
        if code != 0:
            with open(self.log, errors='replace') as f:
                tail = ''.join(f.readlines()[-20:])
            raise RuntimeError(f'training {self.config} failed (exit '
                               f'{code}); the end of {self.log}:\n{tail}')
        if not osp.isfile(self.last):
            raise RuntimeError(f'training {self.config} wrote no '
                               f'{self.last}')
        return time.perf_counter() - self.start


#: an mmengine training log line: ``Iter(train) [ 50/600] ...``
_ITER_LINE = re.compile(r'Iter\(train\)\s*\[\s*(\d+)/(\d+)\]')


def follow_training(proc: subprocess.Popen,
                    log: str,
                    total: int,
                    desc: str,
                    progress: bool = True,
                    poll: float = 1.0) -> int:
    """Wait for a training process whose output goes to ``log``, showing
    its iterations (mmengine's logged ``Iter(train) [i/n]``) as a progress
    bar.

    Args:
        proc (subprocess.Popen): the training process.
        log (str): the file its output is written to.
        total (int): the last iteration.
        desc (str): the bar's label.
        progress (bool): show the bar (else wait silently).
        poll (float): seconds between reads of the log.

    Returns:
        int: the process's exit code.
    """
    if not progress:
        return proc.wait()
    from tqdm import tqdm
    done = 0
    with open(
            log, errors='replace') as f, tqdm(
                total=total,
                desc=f'[train] {desc}',
                unit='it',
                dynamic_ncols=True) as bar:
        while True:
            code = proc.poll()
            for match in _ITER_LINE.finditer(f.read()):
                i = int(match.group(1))
                if i > done:
                    bar.update(i - done)
                    done = i
            if code is not None:
                if code == 0 and done < total:
                    bar.update(total - done)
                return code
            time.sleep(poll)


def trained_config(work_dir: str, config: str) -> str:
    """The config a training in ``work_dir`` ran with: the copy that
    mmengine dumps there (with every ``--cfg-options``/``--calidet-options``
    applied, e.g. a changed CaliFormer depth), else ``config``."""
    dumped = osp.join(work_dir, osp.basename(config))
    return dumped if osp.isfile(dumped) else config


def ran_schedule(sched: Dict, trained: Dict) -> Dict:
    """``sched`` with each training's lr decay as it ran: the first
    milestone, within its iterations, of the config the training dumped
    (``--cfg-options``/``--calidet-options`` may move or remove it). A
    work folder without a dumped config keeps the planned decay.

    Args:
        sched (dict): :func:`schedule`'s result.
        trained (dict): :func:`train_both`'s result.

    Returns:
        dict: ``sched`` with ``decay`` and ``calidet_decay`` as run
        (``None``: a constant lr).
    """
    from mmengine.config import Config
    out = dict(sched)
    for key, iters, work_dir, config in (('decay', sched['dino'],
                                          trained['dino_dir'],
                                          trained['dino_config']),
                                         ('calidet_decay', sched['calidet'],
                                          trained['calidet_dir'],
                                          trained['calidet_config'])):
        dumped = trained_config(work_dir, config)
        if dumped == config:
            continue
        scheds = Config.fromfile(dumped).get('param_scheduler') or []
        if isinstance(scheds, dict):
            scheds = [scheds]
        inside = sorted(
            m for s in scheds for m in s.get('milestones', []) if m < iters)
        out[key] = inside[0] if inside else None
    return out


def schedule(args: argparse.Namespace) -> Dict:
    """The iterations of both trainings (checked).

    Returns:
        dict: ``dino`` (iterations), ``decay`` (its lr x0.1 iteration),
        ``init`` (``--calidet-init``), ``start`` (the DINO checkpoint the
        CaliDINO starts from; 0: none), ``calidet`` (CaliDINO iterations,
        or CaliFormer updates when ``cached``) and ``calidet_decay`` (its
        lr x0.1 iteration).
    """
    dino, ft, updates = SCHEDULES['quick' if args.quick else 'full']
    # an explicit 0 is refused below, never replaced by the default
    dino = dino if args.dino_iters is None else args.dino_iters
    ft = ft if args.finetune_iters is None else args.finetune_iters
    updates = CACHED_ONLY.get(getattr(args, 'detector', 'dino'),
                              {}).get('updates', updates)
    updates = updates if args.calibrator_updates is None else \
        args.calibrator_updates
    if dino < 1 or ft < 1 or updates < 1:
        raise ValueError('--dino-iters, --finetune-iters and '
                         '--calibrator-updates must be >= 1')
    decay = int(round(dino * args.decay_at))
    init = args.calidet_init
    if init == 'cached':  # the CaliFormer alone, on the final DINO
        return dict(
            dino=dino,
            decay=decay,
            init=init,
            start=dino,
            calidet=updates,
            calidet_decay=int(round(updates * args.decay_at)))
    if init == 'finetune':  # the paper's: from the final DINO
        return dict(
            dino=dino,
            decay=decay,
            init=init,
            start=dino,
            calidet=ft,
            calidet_decay=int(round(ft * args.decay_at)))
    if init == 'scratch':
        return dict(
            dino=dino,
            decay=decay,
            init=init,
            start=0,
            calidet=dino,
            calidet_decay=decay)
    if not ft < dino or dino % ft:
        raise ValueError(f'--finetune-iters ({ft}) must divide '
                         f'--dino-iters ({dino}) and be smaller')
    if not dino - ft < decay <= dino:
        raise ValueError(f'the lr decay (iteration {decay}) must fall in '
                         'the fine-tune window')
    return dict(
        dino=dino,
        decay=decay,
        init=init,
        start=dino - ft,
        calidet=ft,
        calidet_decay=decay - dino + ft)


def data_differences(folder: str,
                     seed: int,
                     variant: str,
                     validation_sites: bool = False) -> List[str]:
    """How the benchmark data folder ``folder`` differs from the data asked
    for, by its ``meta.json``.

    Args:
        folder (str): an existing data folder.
        seed (int): the data seed asked for.
        variant (str): the variant asked for.
        validation_sites (bool): whether the val split asked for is
            validation sites (the benchmark's is the deployment sites).

    Returns:
        list[str]: what differs, in words (e.g. ``'seed 0, not 5'``);
        empty when the folder holds the data asked for.
    """
    if not osp.isfile(osp.join(folder, 'meta.json')):
        return ['it has no meta.json (not a finished benchmark folder)']
    meta = _read_meta(folder)
    if meta is None:
        return ['its meta.json cannot be read']
    differences = []
    for key, asked in (('seed', seed), ('variant', variant)):
        if meta.get(key) != asked:
            differences.append(f'{key} {meta.get(key)}, not {asked}')
    made_sites = 'validation_sites' in meta
    if made_sites != bool(validation_sites):
        differences.append(
            'validation sites, not the deployment sites'
            if made_sites else 'deployment sites, not validation sites')
    return differences


def own_data_folder(folder: str, variant: str) -> bool:
    """Whether ``folder`` is the benchmark's own data folder of a variant
    (its default, ``VARIANTS[variant]['data']``), which it may remake.

    Args:
        folder (str): the data folder.
        variant (str): the variant asked for.

    Returns:
        bool: the same folder (through links or not).
    """
    return osp.realpath(folder) == osp.realpath(VARIANTS[variant]['data'])


def ensure_data(args: argparse.Namespace) -> Dict:
    """The benchmark data of ``args.data``: reused when its ``meta.json``
    says it is the data asked for (``args.seed``, ``args.variant``, the
    deployment sites or, with ``args.validation_sites``, the simulated
    sites of a recipe-selection folder), generated when missing. A folder
    of other data is generated again when it is the benchmark's own (the
    variant's default folder, :func:`own_data_folder`), else refused.

    Args:
        args (argparse.Namespace): ``data``, ``seed``, ``variant``,
            ``validation_sites`` (optional) and ``no_progress``.

    Returns:
        dict: the folder's ``meta.json``.

    Raises:
        ValueError: ``args.data`` is not the benchmark's own folder and
            holds other data (naming what differs).
    """
    from .data import make_context_shift
    from .simulated_sites import make_validation_data
    validation = bool(getattr(args, 'validation_sites', False))
    overwrite = False
    if osp.exists(args.data):
        differences = data_differences(args.data, args.seed, args.variant,
                                       validation)
        if not differences:
            print(f'[data] reusing {args.data}')
            return _read_meta(args.data)
        what = '; '.join(differences)
        if not own_data_folder(args.data, args.variant):
            raise ValueError(
                f'--data {args.data} is not the data asked for ({what}): '
                'pass the --seed, --variant and --validation-sites it was '
                'made with, or another --data folder (the benchmark remakes '
                f'only its own, {VARIANTS[args.variant]["data"]})')
        print(f'[data] {args.data} is not the data asked for ({what}): '
              'generating it again')
        overwrite = True
    kind = ', validation sites' if validation else ''
    print(f'[data] generating {args.data} (seed {args.seed}, '
          f'{args.variant}{kind})')
    make = make_validation_data if validation else make_context_shift
    return make(
        args.data,
        seed=args.seed,
        progress=not args.no_progress,
        variant=args.variant,
        overwrite=overwrite)


def cache_dataset_key(config: str) -> str:
    """Where a calibrator config's ``DecoderCacheDataset`` sits, as a
    ``--cfg-options`` key: ``train_dataloader.dataset``, or deeper inside
    dataset wrappers (e.g. ``train_dataloader.dataset.dataset``).

    Args:
        config (str): the calibrator config.

    Returns:
        str: the key.

    Raises:
        ValueError: the config trains on no decoder cache.
    """
    from mmengine.config import Config
    dataset = Config.fromfile(config).train_dataloader.get('dataset')
    key = 'train_dataloader.dataset'
    while hasattr(dataset, 'get'):
        if dataset.get('type') == 'DecoderCacheDataset':
            return key
        dataset, key = dataset.get('dataset'), key + '.dataset'
    raise ValueError(f'{config} trains on no DecoderCacheDataset: it is '
                     'not a calibrator config (--calidet-init cached)')


def detector_configs(args: argparse.Namespace) -> Dict:
    """The configs and folders of ``--detector`` (checked against the
    variant and ``--calidet-init``).

    Args:
        args (argparse.Namespace): the benchmark's options (``detector``,
            ``variant``, ``calidet_init``, ``calibrator_config``).

    Returns:
        dict: ``baseline`` (the plain detector's config), ``calidet`` (the
        fine-tune config; ``None`` but for the DINO), ``cached`` (the
        calibrator config), ``baseline_dir`` and ``calidet_dir``
        (sub-folder names), ``cache_dir`` (the training cache's folder
        name, inside the baseline's) and ``names`` (plain, CaliDet).

    Raises:
        ValueError: the RTMDet or the Faster R-CNN with another variant
            or init.
    """
    detector = getattr(args, 'detector', 'dino')
    if detector == 'dino':
        configs = VARIANTS[args.variant]
        return dict(
            baseline=configs['dino'],
            calidet=configs['calidet'],
            cached=args.calibrator_config or configs['cached'],
            baseline_dir='dino',
            calidet_dir='calidet',
            cache_dir='decoder_cache_train',
            names=('DINO', 'CaliDINO'))
    one = CACHED_ONLY[detector]
    if args.variant not in one['variants']:
        raise ValueError(f'--detector {detector} has configs for --variant '
                         f'{" or ".join(one["variants"])} only')
    if args.calidet_init != 'cached':
        raise ValueError(f'--detector {detector}: only --calidet-init '
                         'cached (the calibrator on its feature cache)')
    return dict(
        baseline=one['baseline'],
        calidet=None,
        cached=args.calibrator_config or one['cached'],
        baseline_dir=detector,
        calidet_dir=f'calidet_{detector}',
        cache_dir=one['cache_dir'],
        names=one['names'])


def _schedule_options(iters: int, decay: int, interval: int) -> List[str]:
    """The ``--cfg-options`` of a training's schedule.

    Args:
        iters (int): its iterations.
        decay (int): the iteration of its learning-rate step.
        interval (int): iterations between checkpoints.

    Returns:
        list[str]: the options.
    """
    return [
        f'train_cfg.max_iters={iters}', f'train_cfg.val_begin={iters + 1}',
        f'param_scheduler.0.end={iters}',
        f'param_scheduler.0.milestones=[{decay}]',
        f'default_hooks.checkpoint.interval={interval}'
    ]


def train_both(args, sched: Dict, work_dir: str) -> Dict:
    """Train the plain detector (DINO or ``--detector``) and its CaliDet
    twin (see :func:`schedule`); with ``args.calibrator_seed`` (not
    ``None``), the calibrator under that seed, in ``<calidet
    folder>_seed<seed>``."""
    configs = detector_configs(args)
    dino_config, calidet_config = configs['baseline'], configs['calidet']
    cached_config = configs['cached']
    dino_dir = args.dino_work_dir or osp.join(work_dir,
                                              configs['baseline_dir'])
    cali_dir = osp.join(work_dir, configs['calidet_dir'])
    common = ['default_hooks.logger.interval=50'] + list(args.cfg_options)
    # both trainings seeded (before the user's overrides, which may reset
    # it): the same command trains the same models
    seeded = [f'randomness.seed={args.train_seed}']
    # another calibrator seed (--calibrator-seeds): its own folder, the
    # same DINO
    cali_seed = getattr(args, 'calibrator_seed', None)
    cali_seeded = seeded
    if cali_seed is not None:
        cali_dir += f'_seed{cali_seed}'
        cali_seeded = [f'randomness.seed={cali_seed}']

    def training(*a, **kw) -> Training:
        return Training(*a, progress=not args.no_progress, **kw)

    interval = sched['dino'] - sched['start'] if sched['init'] == \
        'same-budget' else sched['dino']
    dino_opts = _schedule_options(sched['dino'], sched['decay'], interval) + [
        'default_hooks.checkpoint.max_keep_ckpts=-1'
    ] + seeded + common
    cali_opts = _schedule_options(sched['calidet'], sched['calidet_decay'],
                                  sched['calidet']) + cali_seeded
    if sched['init'] == 'scratch':
        # the DINO's lr for every part, side by side with the DINO
        cali_opts += [
            'load_from=None', 'optim_wrapper.optimizer.lr=2e-4',
            'optim_wrapper.paramwise_cfg.custom_keys.califormer.lr_mult=1.0'
        ]
        threads = max(1, (os.cpu_count() or 2) // 2)
        dino = training(dino_config, dino_dir, sched['dino'], dino_opts,
                        args.retrain, args.data, threads)
        cali = training(calidet_config, cali_dir, sched['calidet'],
                        cali_opts + common + list(args.calidet_options),
                        args.retrain, args.data, threads)
        secs = dict(dino=dino.wait(), calidet=cali.wait())
    elif sched['init'] == 'cached':
        secs = dict(
            dino=training(dino_config, dino_dir, sched['dino'], dino_opts,
                          args.retrain, args.data).wait())
        start = osp.join(dino_dir, f'iter_{sched["dino"]}.pth')
        cache = cache_dataset_key(cached_config)
        cali_opts += [
            f'load_from={start}',  # the cache's source too (train.py)
            f'{cache}.source.config={dino_config}',
            f'{cache}.cache_dir={osp.join(dino_dir, configs["cache_dir"])}',
            f'default_hooks.logger.interval={max(1, sched["calidet"] // 10)}'
        ]
        secs['calidet'] = training(
            cached_config, cali_dir, sched['calidet'],
            cali_opts + list(args.cfg_options) + list(args.calidet_options),
            args.retrain or secs['dino'] > 0, args.data).wait()
    else:
        start = osp.join(dino_dir, f'iter_{sched["start"]}.pth')
        cali_opts.append(f'load_from={start}')
        secs = dict(
            dino=training(dino_config, dino_dir, sched['dino'], dino_opts,
                          args.retrain, args.data).wait())
        # a retrained DINO invalidates the CaliDINO fine-tuned from it
        secs['calidet'] = training(
            calidet_config, cali_dir, sched['calidet'],
            cali_opts + common + list(args.calidet_options), args.retrain
            or secs['dino'] > 0, args.data).wait()
    return dict(
        detector=getattr(args, 'detector', 'dino'),
        names=configs['names'],
        dino_dir=dino_dir,
        calidet_dir=cali_dir,
        dino_config=dino_config,
        calidet_config=cached_config
        if sched['init'] == 'cached' else calidet_config,
        dino_ckpt=osp.join(dino_dir, f'iter_{sched["dino"]}.pth'),
        calidet_ckpt=osp.join(cali_dir, f'iter_{sched["calidet"]}.pth'),
        seconds=secs)
