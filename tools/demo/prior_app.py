# Copyright (c) mmcalidet contributors. All rights reserved.
"""A web page to see a prior move the detections (gradio, offline).

    python tools/demo/prior_app.py CONFIG CHECKPOINT [--port 7860] \\
        [--host 127.0.0.1] [--device cpu]
    python tools/demo/prior_app.py          # the model `make demo` trained

Three tabs: detect an image under E_t and under a chosen prior (two
panels, a score threshold, the detections that changed most); edit the
prior in words, as ``tools/misc/edit_prior.py --set`` does (a pair's
slider, absent classes, a heatmap of E - E_t, the edited prior's JSON);
a labelled site's per-class AP under E_t and under the prior. The
``/detect`` endpoint serves scripts (``gradio_client``): see
docs/user_guides/inject_prior.md. Needs the app extra (``pip install
"mmcalidet[app]"``; ``tools/setup_env.sh`` installs it).

It runs offline: analytics off, no share link, bound to 127.0.0.1 unless
``--host`` says otherwise, uploads up to ``--max-upload-mb``, images up to
``--max-pixels``. Bad input shows as one line in the page.
"""
import argparse
import os

# before gradio is imported anywhere: no analytics, no version check
os.environ['GRADIO_ANALYTICS_ENABLED'] = 'False'

from mmcalidet.utils.cli import positive_int, run_tool  # noqa: E402
from mmcalidet.utils.image_files import MAX_PIXELS  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='Serve the prior page: detections under a prior, the '
        'prior edited in words, a site\'s AP')
    parser.add_argument(
        'config', nargs='?', help='CaliDet config (default: the demo\'s)')
    parser.add_argument(
        'checkpoint', nargs='?', help='its checkpoint (default: the demo\'s)')
    parser.add_argument(
        '--host',
        default='127.0.0.1',
        help='address to bind (127.0.0.1: this machine only)')
    parser.add_argument(
        '--port', type=positive_int, default=7860, help='port (7860)')
    parser.add_argument(
        '--device', default=None, help='e.g. cpu, cuda:0 (default: auto)')
    parser.add_argument(
        '--max-upload-mb',
        type=positive_int,
        default=20,
        help='the upload size limit in MB (20)')
    parser.add_argument(
        '--max-pixels',
        type=positive_int,
        default=MAX_PIXELS,
        help=f'refuse images of more pixels ({MAX_PIXELS}, as Pillow\'s)')
    parser.add_argument(
        '--max-site-images',
        type=positive_int,
        default=500,
        help='evaluate at most this many site images (500)')
    parser.add_argument(
        '--log-file',
        default='work_dirs/prior_app/prior_app.log',
        help='where the libraries\' output and warnings go '
        '(work_dirs/prior_app/prior_app.log)')
    parser.add_argument(
        '--demo-work-dir',
        default=None,
        help='where `make demo` trained its CaliDINO (without CONFIG)')
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from mmcalidet.app.model_files import DEMO_WORK_DIR, demo_model
    if (args.config is None) != (args.checkpoint is None):
        raise ValueError('give both CONFIG and CHECKPOINT, or neither (the '
                         'demo\'s model)')
    if args.config is None:
        args.config, args.checkpoint = demo_model(args.demo_work_dir
                                                  or DEMO_WORK_DIR)
    from mmcalidet.app.page import build_page, import_gradio, launch_page
    import_gradio()  # a missing extra fails before the model loads
    import torch

    from mmcalidet.app.model_files import open_actions
    from mmcalidet.utils.log_level import library_output_to
    device = args.device or ('cuda' if torch.cuda.is_available() else 'cpu')
    print(
        f'loading {args.checkpoint} ({device}; log: {args.log_file})',
        flush=True)
    with library_output_to(args.log_file) as console:
        actions = open_actions(args.config, args.checkpoint, device,
                               args.max_pixels, args.max_site_images)
        print(
            f'priors: {", ".join(actions.session.named)}',
            file=console,
            flush=True)
        page = build_page(actions)
        print(
            f'serving on http://{args.host}:{args.port} (Ctrl+C stops '
            'it)',
            file=console,
            flush=True)
        launch_page(page, args.host, args.port, f'{args.max_upload_mb}mb')
    return 0


if __name__ == '__main__':
    run_tool(main, errors=(ValueError, OSError, ImportError))
