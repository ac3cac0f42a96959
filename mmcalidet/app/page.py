# Copyright (c) mmcalidet contributors. All rights reserved.
"""The prior page's gradio layout: three tabs (detect under a prior, edit
the prior in words, a site's AP) and the ``/detect`` API endpoint, on
:class:`~.handlers.PageActions`.

gradio is an optional extra (``pip install mmcalidet[app]``), imported
here only when a page is built. Every handler shows a bad input as one
line in the tab's status line (``#status``, ``#edit-status``,
``#site-status``) and leaves the page as it was.
"""
import os
from typing import Any

from .compare import CHANGE_COLUMNS
from .handlers import UPLOADED, PageActions, error_text

#: the page's title
TITLE = 'CaliDet: see a prior move the detections'
#: the /detect endpoint's name (a stable API: docs/user_guides/inject_prior.md)
API_NAME = 'detect'


def import_gradio() -> Any:
    """gradio, offline: analytics (and its version check) off.

    Raises:
        ImportError: one line saying how to install it.
    """
    os.environ['GRADIO_ANALYTICS_ENABLED'] = 'False'
    try:
        import gradio
    except ImportError:
        raise ImportError(
            'the prior page needs gradio: pip install '
            '"mmcalidet[app]" (or bash tools/setup_env.sh)') from None
    return gradio


def build_page(actions: PageActions):
    """The page.

    Args:
        actions (PageActions): the page's logic on a detector.

    Returns:
        gradio.Blocks: the page (launch it with :func:`launch_page`).
    """
    gr = import_gradio()
    session = actions.session
    classes = session.classes
    with gr.Blocks(title=TITLE, analytics_enabled=False) as page:
        edited = gr.State(None)
        shown = gr.State(None)
        gr.Markdown(f'## {TITLE}\n{len(classes)} classes; E_t is the '
                    'checkpoint\'s prior. A prior reaches only the '
                    'classification: the boxes stay, their classes and '
                    'scores move.')
        choice, prior_file = _detect_tab(gr, actions, edited, shown)
        _edit_tab(gr, actions, choice, prior_file, edited)
        _site_tab(gr, actions, choice, prior_file, edited)
        _api(gr, actions)
    return page


def _detect_tab(gr, actions, edited, shown):
    """The Detect tab: an image, a prior, the two panels (E_t and the
    prior), the score slider and the table of the detections that changed
    most.

    Returns:
        tuple: the prior's dropdown and its upload, which the other tabs
        fill.
    """
    session = actions.session
    with gr.Tab('Detect under a prior'):
        with gr.Row():
            image = gr.Image(
                type='filepath',
                sources=['upload'],
                label='Image',
                elem_id='image',
                height=320)
            with gr.Column():
                choice = gr.Dropdown(
                    actions.choices,
                    value=actions.default_choice(),
                    label='Prior (right panel)',
                    elem_id='prior-choice')
                prior_file = gr.File(
                    label='Prior JSON (for "uploaded '
                    'JSON")',
                    file_types=['.json'],
                    elem_id='prior-file')
                thr = gr.Slider(
                    0, 1, value=0.3, step=0.01, label='Score threshold')
                run = gr.Button(
                    'Detect', variant='primary', elem_id='detect-button')
        status = gr.Markdown(
            'Upload an image or pick an example.', elem_id='status')
        with gr.Row():
            left = gr.Image(
                label='E_t',
                interactive=False,
                elem_id='panel-train',
                format='png')
            right = gr.Image(
                label='the prior',
                interactive=False,
                elem_id='panel-prior',
                format='png')
        table = gr.Dataframe(
            headers=list(CHANGE_COLUMNS),
            label='Detections that changed most',
            elem_id='changes',
            interactive=False)
        if session.examples:
            gr.Examples(session.examples, inputs=image, label='Examples')

    _wire_detect(gr, actions, run, (image, choice, prior_file, edited, thr),
                 (left, right, table, status, shown))
    return choice, prior_file


def _wire_detect(gr, actions, run, inputs, outputs) -> None:
    """The Detect tab's events: the button, the slider's release and
    a prior's upload; an error shows as the status line."""
    image, choice, prior_file, edited, thr = inputs
    left, right, table, status, shown = outputs

    def on_detect(img, ch, pf, ed, t):
        try:
            out = actions.detect(img, ch, pf, ed, t)
        except Exception as exc:  # shown in the page, never raised
            return gr.skip(), gr.skip(), gr.skip(), error_text(exc), \
                gr.skip()
        return (gr.Image(out['panels'][0], label=out['labels'][0]),
                gr.Image(out['panels'][1], label=out['labels'][1]),
                out['rows'], out['status'], out)

    def on_threshold(sh, t):
        if not sh:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip()
        try:
            out = actions.draw(sh, t)
        except Exception as exc:
            return gr.skip(), gr.skip(), gr.skip(), error_text(exc)
        return (gr.Image(out['panels'][0], label=out['labels'][0]),
                gr.Image(out['panels'][1],
                         label=out['labels'][1]), out['rows'], out['status'])

    def on_upload(pf):
        try:
            line = actions.check_upload(pf)
        except Exception as exc:
            return gr.skip(), error_text(exc)
        return UPLOADED, line

    run.click(
        on_detect, [image, choice, prior_file, edited, thr],
        [left, right, table, status, shown],
        api_name=False)
    thr.release(
        on_threshold, [shown, thr], [left, right, table, status],
        api_name=False)
    prior_file.upload(on_upload, prior_file, [choice, status], api_name=False)


def _edit_tab(gr, actions, choice, prior_file, edited) -> None:
    """The Edit tab: a pair's slider, absent classes, the edits in words,
    the heatmap of E - E_t and the edited prior's JSON."""
    classes = actions.session.classes
    with gr.Tab('Edit the prior'):
        gr.Markdown('Edits read as `tools/misc/edit_prior.py --set`: '
                    '`i|j=v` sets P(i present | j present) = v, `*` is '
                    'every class. An absent class is `c|*=0`.')
        base = gr.Dropdown(
            actions.choices,
            value='E_t',
            label='Start from',
            elem_id='edit-base')
        with gr.Row():
            class_i = gr.Dropdown(classes, value=classes[0], label='i')
            class_j = gr.Dropdown(
                classes,
                value=classes[min(1,
                                  len(classes) - 1)],
                label='given j')
            value = gr.Slider(0, 1, step=0.01, label='P(i | j)')
            add = gr.Button('Add this edit')
        absent = gr.Dropdown(
            classes, multiselect=True, label='Absent at this site')
        edits = gr.Textbox(
            lines=4,
            label='Edits, one per line',
            placeholder='e.g. ' + f'{classes[0]}|*=0.9',
            elem_id='edits')
        apply = gr.Button('Apply', variant='primary', elem_id='edit-apply')
        edit_status = gr.Markdown(elem_id='edit-status')
        with gr.Row():
            heatmap = gr.Plot(label='E - E_t')
            download = gr.File(
                label='The edited prior (JSON)',
                elem_id='edited-file',
                interactive=False)

        def on_pair(b, pf, ed, i, j):
            try:
                return actions.pair_value(b, pf, ed, i, j), gr.skip()
            except Exception as exc:
                return gr.skip(), error_text(exc)

        def on_add(text, i, j, v):
            from .edit import pair_edit
            try:
                line = pair_edit(i, j, v)
            except Exception as exc:
                return gr.skip(), error_text(exc)
            text = (text or '').rstrip('\n')
            return (text + '\n' if text else '') + line, f'added {line}'

        def on_apply(b, pf, ed, text, ab):
            try:
                out = actions.apply_edits(b, pf, ed, text, ab)
            except Exception as exc:
                return gr.skip(), gr.skip(), gr.skip(), error_text(exc)
            return out['prior'], out['figure'], out['file'], out['status']

        for source in (class_i, class_j, base):
            source.change(
                on_pair, [base, prior_file, edited, class_i, class_j],
                [value, edit_status],
                api_name=False)
        add.click(
            on_add, [edits, class_i, class_j, value], [edits, edit_status],
            api_name=False)
        apply.click(
            on_apply, [base, prior_file, edited, edits, absent],
            [edited, heatmap, download, edit_status],
            api_name=False)


def _site_tab(gr, actions, choice, prior_file, edited) -> None:
    """The site tab: a labelled site's per-class AP under E_t and under
    the chosen prior."""
    from .site_ap import default_sites
    sites = default_sites(actions.data_root)
    with gr.Tab('A site\'s AP'):
        gr.Markdown('A COCO annotation file (its images beside it or in '
                    '`images/`), or a folder with one, or a folder of YOLO '
                    'labels. The prior is the Detect tab\'s.')
        site = gr.Dropdown(
            sites,
            value=sites[0] if sites else None,
            allow_custom_value=True,
            label='Site',
            elem_id='site')
        run = gr.Button('Evaluate', variant='primary', elem_id='site-run')
        site_status = gr.Markdown(elem_id='site-status')
        chart = gr.Plot(label='AP(prior) - AP(E_t) per class')
        table = gr.Dataframe(
            headers=['class', 'AP under E_t', 'AP under the prior', 'change'],
            interactive=False)

        def on_site(s, ch, pf, ed, progress=gr.Progress()):
            try:
                out = actions.site(s, ch, pf, ed,
                                   lambda f, text: progress(f, desc=text))
            except Exception as exc:
                return gr.skip(), gr.skip(), error_text(exc)
            return out['figure'], out['rows'], out['status']

        run.click(
            on_site, [site, choice, prior_file, edited],
            [chart, table, site_status],
            api_name=False)


def _api(gr, actions) -> None:
    """The ``/detect`` endpoint (hidden from the page)."""
    with gr.Row(visible=False):
        image = gr.File(label='image')
        prior = gr.Textbox(value='E_t', label='prior')
        prior_file = gr.File(label='prior_file')
        score_thr = gr.Number(value=0.0, label='score_thr')
        result = gr.JSON(label='detections')
        button = gr.Button('detect')

    def detect(img, p, pf, t):
        try:
            return actions.api_detect(img, p, pf, t)
        except Exception as exc:
            raise gr.Error(error_text(exc)[len('Error: '):]) from None

    button.click(
        detect, [image, prior, prior_file, score_thr],
        result,
        api_name=API_NAME)


def launch_page(page,
                host: str = '127.0.0.1',
                port: int = 7860,
                max_file_size: str = '20mb',
                block: bool = True):
    """Serve the page offline: no share link, bound to ``host``.

    Args:
        page (gradio.Blocks): from :func:`build_page`.
        host (str): the address to bind (127.0.0.1: this machine only).
        port (int): the port.
        max_file_size (str): the upload size limit (e.g. ``'20mb'``).
        block (bool): serve until interrupted; ``False`` returns at once
            (``page.close()`` stops it).

    Returns:
        str: the page's local URL.
    """
    page.queue(default_concurrency_limit=1)
    _, url, _ = page.launch(
        server_name=host,
        server_port=port,
        share=False,
        inbrowser=False,
        max_file_size=max_file_size,
        prevent_thread_lock=not block,
        show_error=False,
        quiet=True,
        ssr_mode=False,
        footer_links=['api'])
    return url
