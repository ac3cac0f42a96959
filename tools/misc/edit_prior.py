# Copyright (c) mmcalidet contributors. All rights reserved.
"""Edit a prior file in words and write a site prior. Example::

    python tools/misc/edit_prior.py mmcalidet/data/priors/coco2017_train.json \
        --set "person|bicycle=0.95" --set "bicycle|person=0.0" \
        --out site.json

``--set "i|j=v"`` sets P(class i present | class j present) = v; ``*``
stands for every class on its side. Unknown class names are errors that
list close matches. The output is written atomically.
"""
import argparse
import os

# priors only: skip importing torch/mmdet (see mmcalidet/__init__.py)
os.environ.setdefault('MMCALIDET_LIGHT', '1')

from mmcalidet.priors import load_prior, save_prior
from mmcalidet.priors.edit import apply_edits
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
    base, meta = load_prior(args.base, return_meta=True)
    classes = meta.pop('classes')
    if classes is None:
        raise ValueError(f'{args.base} has no class names to edit by')
    edited = apply_edits(base, classes, args.edits)
    meta.update(base=os.path.basename(args.base), edits=list(args.edits))
    save_prior(args.out, edited, classes, **meta)
    changed = int((edited != base).sum())
    print(f'wrote {args.out}: {len(args.edits)} edits, {changed} entries '
          'changed')
    return 0


if __name__ == '__main__':
    run_tool(main)
