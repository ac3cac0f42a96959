# Copyright (c) mmcalidet contributors. All rights reserved.
"""Edit a prior file in words and write a site prior. Example::

    python tools/misc/edit_prior.py mmcalidet/data/priors/coco2017_train.json \
        --set "person|bicycle=0.95" --set "bicycle|person=0.0" \
        --out site.json

``--set "i|j=v"`` sets P(class i present | class j present) = v; ``*``
stands for every class on its side. Unknown class names are errors that
list close matches. The output is written atomically. An edited prior
keeps the class names, not the source's support (``num_images``,
``images_per_class``): its matrix was not measured on those images.
"""
import argparse
import os

# priors only: skip importing torch/mmdet (see mmcalidet/__init__.py)
os.environ.setdefault('MMCALIDET_LIGHT', '1')

from mmcalidet.priors.edit import MEASURED_KEYS, edit_prior
from mmcalidet.priors.prior import Prior
from mmcalidet.utils.cli import run_tool


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Edit a prior by class name')
    parser.add_argument('base', help='prior file to start from (.json)')
    parser.add_argument('--set', dest='edits', action='append', default=[],
                        metavar='"I|J=V"', help='set P(I present | J '
                        'present) = V; repeatable, applied in order')
    parser.add_argument('--out', required=True, help='prior file to write')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if not args.edits:
        raise ValueError('nothing to do: give at least one --set "I|J=V"')
    base = Prior.load(args.base, shipped_names=False)
    edited = edit_prior(base, args.edits)
    edited.save(args.out)
    changed = int((edited.matrix != base.matrix).sum())
    print(f'wrote {args.out}: {len(args.edits)} edits, {changed} entries '
          'changed')
    dropped = [k for k in MEASURED_KEYS if k in base.meta]
    if base.has_support:
        dropped = ['num_images', 'images_per_class'] + [
            k for k in dropped if k != 'num_images'
        ]
    if dropped:
        print(f'  not kept: {", ".join(dropped)} (the edited matrix was '
              'not measured on those images)')
    return 0


if __name__ == '__main__':
    run_tool(main)
