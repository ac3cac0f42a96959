# Copyright (c) mmcalidet contributors. All rights reserved.
"""One place per figure: no AP figure appears in two Markdown files.

The paper's figures live in ``configs/calidet/README.md``, the figures
measured here in ``docs/results.md`` (and the context-shift project's README
keeps its one results table and the selection tables that chose its
defaults); every other page links to them. This test reads README.md,
docs/**/*.md, configs/**/README.md and projects/**/README.md.

An **AP figure** is a decimal number (digits, a point, digits; a sign is
kept) in one of two places, code blocks (```) left out:

* **a table cell**: in a Markdown table whose header row or caption (the
  paragraph right above it) names AP (``AP``, ``AP50``, ``APs``, ``mAP``,
  ``AP(E_t)``...), in any column but the first, unless that column's header
  names another quantity (epsilon, MAE, alpha, time, runs, config,
  command) or the number carries a unit (``ms``, ``s``, ``min``, ``%``,
  ``x``, ``GiB``...). Its **row label** is the row's first cell, plain text
  (no ``**``, backticks, links or footnote marks), lower case; an empty
  first cell continues the row above.
* **prose**: a number or range (``a-b``, ``a to b``) written right before
  ``AP`` (``+2.9 AP``, ``37.9-53.2 AP``) or right after it (``AP 84.24``),
  unless a threshold word precedes it (at most, at least, within, up to,
  beyond, more than, by): those are rules, not measurements. A range or a
  number with two decimals or more names one measurement: its row label is
  the empty label. A single-decimal number (``2.5 AP``) names too little on
  its own, so its row label is the word before it (``gains +14.5 AP``:
  ``gains``). Prose figures thus clash only with prose figures.

Two files clash when they hold the same figure (as written) under the same
row label.
"""
import glob
import os.path as osp
import re
from collections import defaultdict

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))

AP_WORD = re.compile(r'\bm?AP(?:50|75|s|m|l)?\b')
NUMBER = re.compile(
    r'(?<![\w.])[+-]?\d+\.\d+(?![\d.]*\d)'  # not a version (2.13.0)
    r'(?!\s*(?:ms|s|min|h|%|x|GiB|MiB|GB|MB|KB|px|fps|it)\b)')
OTHER_QUANTITY = re.compile(
    r'epsilon|\bMAE\b|alpha|time|\bruns?\b|config|command', re.I)
RANGE = r'[+-]?\d+\.\d+(?:\s*(?:-|to)\s*[+-]?\d+\.\d+)?'
THRESHOLD = r'(?:at most|at least|within|up to|beyond|more than|by)\s+$'
PROSE_BEFORE_AP = re.compile(rf'(?<![\w.])({RANGE})\s+AP\b')
PROSE_AFTER_AP = re.compile(rf'\bAP\s+({RANGE})(?![\w.])')
SEPARATOR = re.compile(r'^\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$')


def markdown_files(root=ROOT):
    """README.md, docs/**/*.md, configs/**/README.md, projects/**/README.md
    under ``root``, as paths relative to it."""
    found = ['README.md'] if osp.exists(osp.join(root, 'README.md')) else []
    for pattern in ('docs/**/*.md', 'configs/**/README.md',
                    'projects/**/README.md'):
        found += [
            osp.relpath(path, root)
            for path in glob.glob(osp.join(root, pattern), recursive=True)
        ]
    return sorted(set(found))


def _without_code_blocks(text):
    """The text with fenced code blocks blanked, lines kept in place."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith('```'):
            fenced = not fenced
            lines.append('')
        else:
            lines.append('' if fenced else line)
    return lines


def _cells(line):
    line = line.strip()
    if line.startswith('|'):
        line = line[1:]
    if line.endswith('|'):
        line = line[:-1]
    return [cell.strip() for cell in line.split('|')]


def _plain(cell):
    """A cell as plain text: links as their text, no emphasis, code marks or
    footnote marks, lower case, single spaces."""
    cell = re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', cell)
    cell = re.sub(r'[*`¹²³⁴⁵⁶⁷⁸⁹⁰]', '', cell)
    return ' '.join(cell.lower().split()).rstrip(':')


def _caption(lines, header_index):
    """The paragraph right above a table (blank lines between skipped)."""
    i = header_index - 1
    while i >= 0 and not lines[i].strip():
        i -= 1
    paragraph = []
    while i >= 0 and lines[i].strip() and not lines[i].startswith(('#', '|')):
        paragraph.insert(0, lines[i])
        i -= 1
    return ' '.join(paragraph)


def _table_figures(lines):
    """(row label, figure, line number) of every AP table cell figure."""
    found, i = [], 0
    while i < len(lines) - 1:
        if not (lines[i].lstrip().startswith('|')
                and SEPARATOR.match(lines[i + 1].strip())):
            i += 1
            continue
        header = _cells(lines[i])
        is_ap = bool(AP_WORD.search(lines[i])
                     or AP_WORD.search(_caption(lines, i)))
        columns = [
            c for c in range(1, len(header))
            if not OTHER_QUANTITY.search(header[c])
        ]
        j, label = i + 2, ''
        while j < len(lines) and lines[j].lstrip().startswith('|'):
            cells = _cells(lines[j])
            label = _plain(cells[0]) or label
            if is_ap:
                for c in columns:
                    if c < len(cells):
                        found += [(label, m.group(0), j + 1)
                                  for m in NUMBER.finditer(cells[c])]
            j += 1
        i = j
    return found


def _prose_label(figure, before):
    """'' for a range or a number with two decimals or more, else the word
    before the figure (plain, lower case)."""
    if re.search(r'\d\s*(?:-|to)\s*[+-]?\d', figure) or \
            re.search(r'\.\d\d', figure):
        return ''
    words = re.findall(r"[\w'()]+", _plain(before))
    return words[-1] if words else ''


def _prose_figures(lines):
    """(row label, figure, line number) of every AP figure written in
    prose."""
    found = []
    for number, line in enumerate(lines, 1):
        if line.lstrip().startswith('|'):
            continue
        for pattern in (PROSE_BEFORE_AP, PROSE_AFTER_AP):
            for m in pattern.finditer(line):
                before = line[:m.start()]
                if re.search(THRESHOLD, before, re.I):
                    continue
                figure = ' '.join(m.group(1).split())
                found.append((_prose_label(figure, before), figure, number))
    return found


def ap_figures(text):
    """Every AP figure of a Markdown text: (row label, figure, line)."""
    lines = _without_code_blocks(text)
    return _table_figures(lines) + _prose_figures(lines)


def clashes(root=ROOT, files=None):
    """One line per (row label, figure) found in two or more files, naming
    the files and a line of each."""
    where = defaultdict(dict)
    for path in files if files is not None else markdown_files(root):
        with open(osp.join(root, path), encoding='utf-8') as f:
            for label, figure, line in ap_figures(f.read()):
                where[(label, figure)].setdefault(path, line)
    return [
        f'AP figure {figure!r} (row {label!r}) in ' +
        ', '.join(f'{path}:{line}' for path, line in sorted(places.items()))
        for (label, figure), places in sorted(where.items())
        if len(places) > 1
    ]


def test_ap_figures_are_table_cells_and_prose_phrases():
    text = '\n'.join([
        'AP on the val images, one run:',
        '',
        '| | E0 | E_x | time |',
        '|---|---|---|---|',
        '| **CaliDINO** (3,000 updates) | 51.4 | +64.3 (60.1-66.2) '
        '| 4.6 min |',
        '| | 52.0 | 2.5 ms | 1.5 |',
        '',
        '| method | epsilon | AP |',
        '|---|---|---|',
        '| [DINO](x.md) | 0.331 | 49.07 |',
        '',
        '| tool | seconds |',
        '|---|---|',
        '| eval | 16.23 |',
        '',
        'It gains +2.9 AP, scored 37.9-53.2 AP (AP 84.24) on torch 2.13.0;',
        'a drop of at most 0.3 AP is a tie, +0.25 to +1.39 AP a range.',
        '```',
        '| a | AP |',
        '|---|---|',
        '| b | 1.5 |',
        '+7.0 AP',
        '```',
    ])
    assert sorted(ap_figures(text)) == sorted([
        ('calidino (3,000 updates)', '51.4', 5),
        ('calidino (3,000 updates)', '+64.3', 5),
        ('calidino (3,000 updates)', '60.1', 5),
        ('calidino (3,000 updates)', '66.2', 5),
        ('calidino (3,000 updates)', '52.0', 6),
        ('dino', '49.07', 10),
        ('gains', '+2.9', 16),
        ('', '37.9-53.2', 16),
        ('', '84.24', 16),
        ('', '+0.25 to +1.39', 17),
    ])


def test_a_figure_in_two_files_is_found(tmp_path):
    (tmp_path / 'docs').mkdir()
    (tmp_path / 'configs' / 'calidet').mkdir(parents=True)
    table = ('| method | AP |\n|---|---|\n| DINO | 49.07 |\n'
             '| CaliDet | 51.94 |\n')
    (tmp_path / 'configs' / 'calidet' / 'README.md').write_text(table)
    (tmp_path / 'docs' / 'results.md').write_text(
        table.replace('51.94', '52.00') +
        '\nThe demo gains +14.5 AP, 2.5 AP under the DINO at E_t.\n')
    (tmp_path / 'README.md').write_text(
        'One run gains +14.5 AP; the threshold is at most 0.3 AP; another\n'
        'flip step 2.5 AP above E0.\n'
        '| other | AP |\n|---|---|\n| CaliDet | 49.07 |\n')
    assert markdown_files(str(tmp_path)) == [
        'README.md', 'configs/calidet/README.md', 'docs/results.md'
    ]
    assert clashes(str(tmp_path)) == [
        "AP figure '49.07' (row 'dino') in configs/calidet/README.md:3, "
        'docs/results.md:3',
        "AP figure '+14.5' (row 'gains') in README.md:1, docs/results.md:6",
    ]


def test_no_ap_figure_appears_in_two_markdown_files():
    files = markdown_files()
    assert 'docs/results.md' in files and 'configs/calidet/README.md' in files
    found = clashes(files=files)
    assert not found, (
        'an AP figure has one home: the paper\'s in '
        'configs/calidet/README.md, '
        'the ones measured here in docs/results.md; link to it instead:\n' +
        '\n'.join(found))


def test_the_metafile_lists_the_model_zoo_tables_box_ap():
    """configs/calidet/metafile.yml (mmdet's format, imported by the root
    model-index.yml that mim reads) names existing configs, and its COCO box
    AP is the one of the README's Results and Models table."""
    import yaml
    with open(osp.join(ROOT, 'model-index.yml')) as f:
        assert 'configs/calidet/metafile.yml' in yaml.safe_load(f)['Import']
    with open(osp.join(ROOT, 'configs', 'calidet', 'metafile.yml')) as f:
        meta = yaml.safe_load(f)
    collections = {c['Name'] for c in meta['Collections']}
    with open(osp.join(ROOT, 'configs', 'calidet', 'README.md')) as f:
        readme = f.read()
    zoo = readme.split('## Results and Models', 1)[1].split('\n### ', 1)[0]
    table_ap = {}
    for row in zoo.splitlines():
        cells = _cells(row) if row.startswith('|') else []
        match = re.search(r'\(\./([^)]+\.py)\)', row)
        if match and len(cells) > 3:
            table_ap[match.group(1)] = cells[3]
    assert table_ap, 'no Results and Models table'
    assert set(table_ap) == {
        osp.basename(model['Config'])
        for model in meta['Models']
    }
    for model in meta['Models']:
        assert model['In Collection'] in collections
        assert osp.isfile(osp.join(ROOT, model['Config'])), model['Config']
        assert model['Name'] == osp.splitext(osp.basename(model['Config']))[0]
        coco = [r for r in model['Results'] if r['Dataset'] == 'COCO']
        box_ap = coco[0].get('Metrics', {}).get('box AP') if coco else None
        in_table = table_ap[osp.basename(model['Config'])]
        assert (f'{box_ap:.2f}' if box_ap is not None else '-') == in_table, \
            (model['Name'], box_ap, in_table)
