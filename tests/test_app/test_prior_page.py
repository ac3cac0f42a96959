# Copyright (c) mmcalidet contributors. All rights reserved.
"""The prior page served for real: its ``/detect`` API called with
gradio_client, and the page driven in Debian's chromium (headless) by
Playwright. Nothing outside 127.0.0.1 is reached."""
import os
import os.path as osp
import shutil
import socket
import time

import pytest

from testing.app_model import coco_mini_val_image

# a server and a browser (another process): the tier of the tools run as
# subprocesses
pytestmark = pytest.mark.slow

CHROMIUM = shutil.which('chromium') or '/usr/bin/chromium'
#: the flags of an offline, headless, throw-away chromium
CHROMIUM_ARGS = ('--headless', '--no-sandbox', '--disable-gpu',
                 '--disable-quic', '--no-first-run',
                 '--disable-background-networking',
                 '--disable-component-update', '--disable-sync')


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


@pytest.fixture(scope='module')
def served(app_actions):
    """The page on a free port of 127.0.0.1, closed after the module; the
    addresses anything in this process connected to are recorded."""
    from mmcalidet.app.page import build_page, launch_page
    page = build_page(app_actions)
    url = launch_page(page, port=free_port(), block=False)
    yield page, url
    page.close()


@pytest.fixture
def outside_connections(monkeypatch):
    """The non-loopback addresses this process connects to meanwhile."""
    seen = []
    connect = socket.socket.connect

    def watched(sock, address):
        host = address[0] if isinstance(address, tuple) else str(address)
        if sock.family in (socket.AF_INET, socket.AF_INET6) and \
                host not in ('127.0.0.1', '::1', 'localhost'):
            seen.append(address)
        return connect(sock, address)

    monkeypatch.setattr(socket.socket, 'connect', watched)
    return seen


def by_box(result: dict) -> dict:
    return {
        (tuple(b), c): s
        for b, c, s in zip(result['bboxes'], result['classes'],
                           result['scores'])
    }


def test_detect_api(served, edited_prior_file, outside_connections):
    from gradio_client import Client, handle_file
    from gradio_client.exceptions import AppError
    _, url = served
    client = Client(url, verbose=False, download_files=False)
    img = handle_file(coco_mini_val_image())
    train = client.predict(img, 'E_t', None, 0.0, api_name='/detect')
    assert set(train) >= {'bboxes', 'scores', 'labels', 'classes'}
    assert train['prior'] == 'E_t' and len(train['scores']) > 0
    assert all(len(b) == 4 for b in train['bboxes'])
    # the edited prior, uploaded and as a path on the server
    edited = client.predict(
        img, 'E_t', handle_file(edited_prior_file), 0.0, api_name='/detect')
    on_server = client.predict(
        img, edited_prior_file, None, 0.0, api_name='/detect')
    assert by_box(on_server).keys() == by_box(edited).keys()
    # a DETR: the same boxes (and classes) under both priors, other scores
    a, b = by_box(train), by_box(edited)
    assert a.keys() == b.keys()
    moved = max(abs(a[k] - b[k]) for k in a)
    assert moved > 1e-4, moved
    # a bad prior: one line naming the problem
    bad = osp.join(osp.dirname(edited_prior_file), 'bad.json')
    with open(bad, 'w') as f:
        f.write('{"classes": ["a", "b"], "matrix": [[1, 2], [0, 1]]}')
    with pytest.raises(AppError) as err:
        client.predict(img, 'E_t', handle_file(bad), 0.0, api_name='/detect')
    message = str(err.value)
    assert '\n' not in message.strip(), message
    assert message.strip().startswith('bad.json: prior values'), message
    with pytest.raises(AppError, match='no shipped prior'):
        client.predict(img, 'no_such_prior', None, 0.0, api_name='/detect')
    client.close()
    assert outside_connections == []


def test_page_in_chromium(served, tmp_path, page_inputs):
    from playwright.sync_api import expect, sync_playwright
    _, url = served
    start = time.perf_counter()
    blocked = []
    shot = str(tmp_path / 'prior_app.png')
    with sync_playwright() as pw:
        # a fresh profile (--user-data-dir, which playwright passes)
        browser = pw.chromium.launch_persistent_context(
            str(tmp_path / 'profile'),
            executable_path=CHROMIUM,
            headless=True,
            args=list(CHROMIUM_ARGS),
            viewport={
                'width': 1280,
                'height': 1300
            })
        page = browser.new_page()

        def only_local(route):
            if route.request.url.startswith(url.rstrip('/')) or \
                    route.request.url.startswith(('data:', 'blob:')):
                return route.continue_()
            blocked.append(route.request.url)
            return route.abort()

        browser.route('**/*', only_local)
        page.goto(url)
        image, prior_name = page_inputs
        page.locator('#image input[type=file]').set_input_files(image)
        page.locator('#prior-choice input').fill(prior_name)
        page.keyboard.press('Enter')
        page.locator('#detect-button').click()
        status = page.locator('#status')
        expect(status).to_contain_text('changed detections', timeout=30000)
        for panel in ('#panel-train', '#panel-prior'):
            expect(page.locator(f'{panel} img')).to_be_visible()
        assert 'detections >= 0.30' in page.locator(
            '#panel-train').inner_text()
        rows = page.locator('#changes tbody tr')
        assert rows.count() > 0
        text = status.inner_text()
        counts = [
            int(w) for w in text.replace(';', ' ').split() if w.isdigit()
        ]
        assert counts[0] > 0 and counts[1] > 0, text
        page.screenshot(path=shot, full_page=True)
        # a broken prior: one error line, and the page still works
        bad = tmp_path / 'broken.json'
        bad.write_text('{"classes": ["a"], "matrix": [[1, 0.5')
        page.locator('#prior-file input[type=file]').set_input_files(str(bad))
        expect(status).to_contain_text('Error:', timeout=15000)
        assert 'broken.json' in status.inner_text()
        assert len(status.inner_text().strip().splitlines()) == 1
        browser.close()
    assert blocked == []
    assert osp.getsize(shot) > 10000
    assert time.perf_counter() - start < 60
    keep = os.environ.get('MMCALIDET_APP_SCREENSHOT')
    if keep:
        shutil.copyfile(shot, keep)
