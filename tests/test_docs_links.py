# Copyright (c) mmcalidet contributors. All rights reserved.
"""Every relative link in the Markdown docs names a file that exists, and
every ``#anchor`` a heading of its target (as GitHub makes the anchors)."""
import glob
import os.path as osp
import re

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))


def _docs():
    """README.md and the Markdown files under docs/ and configs/."""
    found = [osp.join(ROOT, 'README.md')]
    for folder in ('docs', 'configs'):
        found += glob.glob(
            osp.join(ROOT, folder, '**', '*.md'), recursive=True)
    return sorted(found)


def _prose(text: str) -> str:
    return re.sub(r'```.*?```', '', text, flags=re.S)


def heading_anchors(text: str) -> set:
    """GitHub's anchors of a Markdown text's headings: lower case,
    punctuation but ``-`` and ``_`` dropped, spaces as ``-``, a repeated
    one suffixed ``-1``, ``-2``, ..."""
    anchors, seen = set(), {}
    for line in _prose(text).splitlines():
        match = re.match(r'^#+\s+(.*?)\s*$', line)
        if not match:
            continue
        slug = re.sub(r'[^\w\- ]', '',
                      match.group(1).lower()).replace(' ', '-')
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if not count else f'{slug}-{count}')
    return anchors


def test_heading_anchors_as_github_makes_them():
    text = '# A, b: c\n```\n# not a heading\n```\n## A, b: c\n### E0 -> E_x\n'
    assert heading_anchors(text) == {'a-b-c', 'a-b-c-1', 'e0---e_x'}


def test_relative_links_and_anchors_resolve():
    docs = _docs()
    assert len(docs) > 10, docs
    broken = []
    for doc in docs:
        with open(doc) as f:
            text = _prose(f.read())
        for link in re.findall(r'\]\(([^)\s]+)\)', text):
            if re.match(r'^[a-z]+:', link):
                continue  # https://, mailto:
            path, _, anchor = link.partition('#')
            target = osp.normpath(osp.join(osp.dirname(doc), path)) \
                if path else doc
            if not osp.exists(target):
                broken.append(f'{osp.relpath(doc, ROOT)}: {link} (no file)')
            elif anchor and target.endswith('.md'):
                with open(target) as f:
                    if anchor not in heading_anchors(f.read()):
                        broken.append(
                            f'{osp.relpath(doc, ROOT)}: {link} (no heading)')
    assert not broken, '\n'.join(broken)
