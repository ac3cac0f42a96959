# Copyright (c) mmcalidet contributors. All rights reserved.
"""The files the prior page opens: the demo's model, the config's example
images, and the priors it offers beside E_t and E0 (the bundled priors
that fit the model, a data folder's site statistics)."""
import glob
import json
import os.path as osp
from typing import Dict, List, Optional, Tuple

#: where ``make demo`` trains the CaliDINO (its tables go to outputs/demo)
DEMO_WORK_DIR = 'work_dirs/context_shift_quick/calidet'
#: the example images shown (one per site where the images name a site)
MAX_EXAMPLES = 4


def demo_model(work_dir: str = DEMO_WORK_DIR) -> Tuple[str, str]:
    """The config and checkpoint ``make demo`` trained: the config the
    training dumped in its work folder and its last checkpoint.

    Args:
        work_dir (str): the training's work folder.

    Returns:
        tuple[str, str]: the config and the checkpoint.

    Raises:
        ValueError: one line saying to run ``make demo`` first.
    """
    missing = (f'no demo model in {work_dir} (`make demo` trains it and '
               'writes its tables to outputs/demo): run `make demo` first, '
               'or give CONFIG CHECKPOINT')
    configs = sorted(glob.glob(osp.join(work_dir, '*.py')))
    last = osp.join(work_dir, 'last_checkpoint')
    ckpt = None
    if osp.isfile(last):
        with open(last) as f:
            ckpt = f.read().strip()
    if not ckpt or not osp.isfile(ckpt):
        found = sorted(
            glob.glob(osp.join(work_dir, 'iter_*.pth')),
            key=lambda p: int(osp.basename(p)[5:-4])
            if osp.basename(p)[5:-4].isdigit() else -1)
        ckpt = found[-1] if found else None
    if not configs or ckpt is None:
        raise ValueError(missing)
    return configs[0], ckpt


def test_dataset(cfg) -> Optional[dict]:
    """The config's test (else val) dataset, wrappers unwrapped."""
    for split in ('test', 'val'):
        dataset = (cfg.get(f'{split}_dataloader') or {}).get('dataset')
        while isinstance(dataset, dict) and 'ann_file' not in dataset and \
                isinstance(dataset.get('dataset'), dict):
            dataset = dataset['dataset']
        if isinstance(dataset, dict) and dataset.get('ann_file'):
            return dataset
    return None


def data_root(cfg) -> Optional[str]:
    """The test dataset's ``data_root`` (where the demo writes its
    ``priors/`` and site annotations), if it exists."""
    dataset = test_dataset(cfg)
    root = (dataset or {}).get('data_root')
    return root if root and osp.isdir(root) else None


def example_images(cfg, limit: int = MAX_EXAMPLES) -> List[str]:
    """Example images from the config's test set: the first of each site
    where its images name one (the demo's val sites), else the first
    ``limit``.

    Args:
        cfg (Config): the detector config.
        limit (int): the most examples.

    Returns:
        list[str]: existing image files (none when the data is missing).
    """
    dataset = test_dataset(cfg)
    if dataset is None:
        return []
    root = dataset.get('data_root') or ''
    ann_file = osp.join(root, dataset['ann_file'])
    prefix = (dataset.get('data_prefix') or {}).get('img', '')
    try:
        with open(ann_file, encoding='utf-8') as f:
            images = json.load(f).get('images', [])
    except (OSError, ValueError, AttributeError):
        return []
    picked, sites = [], set()
    for img in images:
        site = img.get('site')
        if site is not None:
            if site in sites:
                continue
            sites.add(site)
        path = osp.join(root, prefix, img.get('file_name', ''))
        if osp.isfile(path):
            picked.append(path)
        if len(picked) >= limit:
            break
    return picked


def offered_priors(session_resolve, root: Optional[str]) -> Dict[str, str]:
    """The priors offered beside E_t and E0: the bundled priors
    (``mmcalidet/data/priors``) and a data folder's site statistics
    (``<root>/priors/E_<site>.json``), those that fit the model.

    Args:
        session_resolve (callable): ``resolve(path)``, raising
            ``ValueError`` for a prior that does not fit the model.
        root (str, optional): the data folder.

    Returns:
        dict: name -> prior file.
    """
    bundled = osp.join(
        osp.dirname(osp.dirname(osp.abspath(__file__))), 'data', 'priors')
    found = {}
    for path in sorted(glob.glob(osp.join(bundled, '*.json'))):
        found[osp.splitext(osp.basename(path))[0]] = path
    if root:
        for path in sorted(glob.glob(osp.join(root, 'priors', 'E_*.json'))):
            site = osp.basename(path)[len('E_'):-len('.json')]
            if site == 't':  # the training set's: E_t itself
                continue
            name = 'all val sites' if site == 'v' else f'site {site}'
            found[f'{name} (statistics)'] = path
    fitting = {}
    for name, path in found.items():
        try:
            session_resolve(path)
        except ValueError:
            continue  # another class set (a COCO prior for the demo)
        fitting[name] = path
    return fitting


def open_actions(config: str,
                 checkpoint: str,
                 device: str = 'cpu',
                 max_pixels: Optional[int] = None,
                 max_site_images: int = 500,
                 out_dir: Optional[str] = None):
    """The page's logic on a checkpoint: the detector (its prior, E_t),
    the offered priors, the example images and the panel drawer.

    Args:
        config (str): the detector config.
        checkpoint (str): its checkpoint.
        device (str): e.g. ``cpu``, ``cuda:0``.
        max_pixels (int, optional): the image pixel limit (default
            Pillow's).
        max_site_images (int): the most site images evaluated.
        out_dir (str, optional): where edited priors are written.

    Returns:
        PageActions: ready for :func:`~.page.build_page`.

    Raises:
        ValueError: a missing file, or a checkpoint that does not fit
            (naming it).
    """
    from mmengine.config import Config

    from ..apis import init_detector
    from ..utils.image_files import MAX_PIXELS
    from .compare import PanelDrawer
    from .handlers import PageActions
    from .session import PriorSession
    for what, path in (('config', config), ('checkpoint', checkpoint)):
        if not osp.isfile(path):
            raise ValueError(f'{what} not found: {path}')
    cfg = Config.fromfile(config)
    model = init_detector(cfg, checkpoint, device=device)
    root = data_root(cfg)
    session = PriorSession(
        model, max_pixels or MAX_PIXELS, examples=example_images(cfg))
    for name, path in offered_priors(session.resolve, root).items():
        session.named[name] = session.resolve(path, name=name)
    return PageActions(
        session,
        PanelDrawer(model),
        out_dir=out_dir,
        max_site_images=max_site_images,
        data_root=root)
