# Copyright (c) mmcalidet contributors. All rights reserved.
"""Compare two benchmark ``results.json`` files table by table: each table
(and the claims, the expected orders, the self-calibration curves) is
``identical`` or its differences are listed, row by row. Timings, plots,
the command line and the machine are not compared. Example (the same
checkpoint evaluated before and after a change of the evaluation code)::

    python tools/analysis_tools/compare_results.py \
        outputs/before/results.json outputs/after/results.json

Exit status 0 when every compared table is identical (within ``--tol``),
1 otherwise.
"""
import argparse
import json
import math
import os
from numbers import Number
from typing import Dict, List, Optional, Sequence

# JSON only: skip importing torch/mmdet (see mmcalidet/__init__.py)
os.environ.setdefault('MMCALIDET_LIGHT', '1')

from mmcalidet.utils.cli import run_tool  # noqa: E402

#: keys that change from run to run without changing a figure
SKIP = ('timings', 'plots', 'machine', 'command', 'training_seconds',
        'seconds')
#: fields that name a row in a listed difference
ROW_NAMES = ('site', 'method', 'prior', 'key', 'alpha', 'size', 'radius',
             'labelled')


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='Compare two benchmark results.json table by table')
    parser.add_argument('a', help='the first results.json')
    parser.add_argument('b', help='the second results.json')
    parser.add_argument(
        '--tol',
        type=float,
        default=0.0,
        help='numbers within this absolute difference count as equal '
        '(default 0: identical)')
    parser.add_argument(
        '--tables',
        nargs='+',
        metavar='NAME',
        help='compare only these tables (default: every key both files '
        'share, less timings, plots, command and machine)')
    parser.add_argument(
        '--max-lines',
        type=int,
        default=20,
        help='differences listed per table (default 20)')
    return parser.parse_args(argv)


def differences(a, b, tol: float = 0.0, path: str = '') -> List[str]:
    """Where two JSON values differ, one line each (``path: a != b``).

    Args:
        a: a JSON value.
        b: the other.
        tol (float): numbers within this absolute difference are equal;
            ``nan`` equals ``nan``.
        path (str): where the values sit (for the lines).

    Returns:
        list[str]: the differences (empty when equal).
    """
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in list(a) + [k for k in b if k not in a]:
            if key in SKIP:
                continue
            where = f'{path}.{key}' if path else str(key)
            if key not in a or key not in b:
                out.append(f'{where}: only in '
                           f'{"the first" if key in a else "the second"}')
            else:
                out += differences(a[key], b[key], tol, where)
        return out
    if isinstance(a, list) and isinstance(b, list):
        out = []
        if len(a) != len(b):
            out.append(f'{path}: {len(a)} vs {len(b)} entries')
        for i, (x, y) in enumerate(zip(a, b)):
            out += differences(x, y, tol, f'{path}[{_row_name(x, i)}]')
        return out
    if _is_number(a) and _is_number(b):
        if math.isnan(a) and math.isnan(b):
            return []
        if a == b or abs(a - b) <= tol:
            return []
        return [f'{path}: {a!r} != {b!r} ({b - a:+.3g})']
    return [] if a == b else [f'{path}: {a!r} != {b!r}']


def _is_number(value) -> bool:
    return isinstance(value, Number) and not isinstance(value, bool)


def _row_name(row, index: int) -> str:
    """A row's index and the fields that name it (site, method, prior)."""
    if not isinstance(row, dict):
        return str(index)
    names = [f'{row[k]}' for k in ROW_NAMES if row.get(k) is not None]
    return f'{index}: ' + ', '.join(names) if names else str(index)


def compare_results(a: Dict,
                    b: Dict,
                    tol: float = 0.0,
                    tables: Optional[Sequence[str]] = None) -> Dict:
    """Compare two loaded ``results.json``, table by table.

    Args:
        a (dict): the first results.
        b (dict): the second.
        tol (float): see :func:`differences`.
        tables (Sequence[str], optional): the tables (default: every key
            both hold, less :data:`SKIP`).

    Returns:
        dict: table name -> its differences (empty list: identical);
        ``None`` for a table only one file holds.
    """
    names = list(tables) if tables else [
        k for k in a if k in b and k not in SKIP
    ] + sorted(k for k in set(a) ^ set(b) if k not in SKIP)
    out = {}
    for name in names:
        if name not in a or name not in b:
            out[name] = None
        else:
            out[name] = differences(a[name], b[name], tol, name)
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.tol < 0:
        raise ValueError(f'--tol must be >= 0, got {args.tol}')
    loaded = []
    for path in (args.a, args.b):
        with open(path) as f:
            try:
                loaded.append(json.load(f))
            except json.JSONDecodeError as exc:
                raise ValueError(f'{path}: not JSON ({exc})') from None
        if not isinstance(loaded[-1], dict):
            raise ValueError(f'{path}: not a results.json (no object)')
    missing = [
        t for t in args.tables or []
        if t not in loaded[0] and t not in loaded[1]
    ]
    if missing:
        raise ValueError(f'--tables: neither file has {missing[0]!r}')
    result = compare_results(*loaded, tol=args.tol, tables=args.tables)
    same = True
    for name, diffs in result.items():
        if diffs is None:
            same = False
            where = 'the first' if name in loaded[0] else 'the second'
            print(f'{name}: only in {where}')
        elif not diffs:
            print(f'{name}: identical')
        else:
            same = False
            print(f'{name}: {len(diffs)} difference(s)')
            for line in diffs[:args.max_lines]:
                print(f'  {line}')
            if len(diffs) > args.max_lines:
                print(f'  ... {len(diffs) - args.max_lines} more')
    print('identical' if same else 'different')
    return 0 if same else 1


if __name__ == '__main__':
    run_tool(main)
