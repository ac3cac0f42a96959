# Copyright (c) mmcalidet contributors. All rights reserved.
"""Tables of evaluation results: Markdown for people, JSON for scripts."""
import json
import math
import os.path as osp
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..utils.file_io import atomic_write

#: (key, header, format) of a column; format is a ``str.format`` spec
Column = Tuple[str, str, str]


def fmt_value(value: Any, spec: str = '') -> str:
    """Format one cell; ``None``/``nan`` give ``-``."""
    if value is None:
        return '-'
    if isinstance(value, str):
        return value
    if isinstance(value, float) and math.isnan(value):
        return '-'
    if spec == 'pct':  # a fraction shown x 100 with two decimals
        return f'{100 * value:.2f}'
    if spec == 'gain':
        return f'{100 * value:+.2f}'
    return format(value, spec) if spec else str(value)


def markdown_table(rows: Sequence[Dict], columns: Sequence[Column]) -> str:
    """A Markdown table of ``rows`` with the given columns."""
    lines = [
        '| ' + ' | '.join(h for _, h, _ in columns) + ' |',
        '|' + '|'.join('---' for _ in columns) + '|'
    ]
    for row in rows:
        lines.append('| ' + ' | '.join(
            fmt_value(row.get(k), spec) for k, _, spec in columns) + ' |')
    return '\n'.join(lines)


def metric_columns(spec: str = 'pct') -> List[Column]:
    """Table columns of the COCO metrics."""
    from .coco import METRICS
    return [(m, m, spec) for m in METRICS]


def injection_table(rows: Sequence[Dict]) -> str:
    """The injection table of :func:`~mmcalidet.evaluation.evaluate_priors`
    rows: method, prior, oracle and the COCO metrics."""
    return markdown_table(
        [dict(r, oracle='yes' if r['oracle'] else '') for r in rows],
        [('method', 'method', ''), ('prior', 'prior', ''),
         ('oracle', 'oracle', '')] + metric_columns())


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, float) and (math.isnan(obj) or math.isinf(obj)):
        return None
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    if hasattr(obj, 'item') and getattr(obj, 'ndim', 1) == 0:
        return _json_safe(obj.item())
    if hasattr(obj, 'tolist'):
        return _json_safe(obj.tolist())
    return obj


def write_report(out_dir: str, stem: str, title: str,
                 sections: Sequence[Tuple[Optional[str], str]],
                 data: Dict[str, Any]) -> List[str]:
    """Write ``<stem>.md`` and ``<stem>.json`` atomically.

    Args:
        out_dir (str): the folder (created).
        stem (str): file name without extension.
        title (str): the Markdown title.
        sections (Sequence[tuple]): ``(heading or None, markdown text)``.
        data (dict): the JSON content (nan becomes ``null``).

    Returns:
        list[str]: the two paths.
    """
    md = [f'# {title}', '']
    for heading, text in sections:
        if heading:
            md += [f'## {heading}', '']
        md += [text.rstrip(), '']
    md_path = osp.join(out_dir, f'{stem}.md')
    json_path = osp.join(out_dir, f'{stem}.json')
    with atomic_write(md_path, 'w', encoding='utf-8') as f:
        f.write('\n'.join(md))
    with atomic_write(json_path, 'w', encoding='utf-8') as f:
        json.dump(_json_safe(data), f, indent=1, allow_nan=False)
        f.write('\n')
    return [md_path, json_path]
