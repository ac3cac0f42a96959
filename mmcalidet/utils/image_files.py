# Copyright (c) mmcalidet contributors. All rights reserved.
"""The image files a demo runs on: a file or a folder's images, each
checked from its header before it is decoded (a file that is not an
image, one of too many pixels, or a truncated one is skipped and
named)."""
import os
import os.path as osp
import sys
import warnings
from typing import List, Optional, Tuple

from .cli import error_line

#: the file names read in a folder (mmdet's ``DetInferencer``'s)
IMG_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.ppm', '.bmp', '.pgm', '.tif',
                  '.tiff', '.webp')
#: the default pixel limit, Pillow's ``Image.MAX_IMAGE_PIXELS``
MAX_PIXELS = 89_478_485


def list_images(img: str) -> List[str]:
    """The image files of ``IMG``: itself, or a folder's files with an image
    extension, sorted.

    Args:
        img (str): an image file or a folder.

    Returns:
        list[str]: the files.

    Raises:
        ValueError: a folder without image files.
    """
    if not osp.isdir(img):
        return [img]
    files = sorted(
        osp.join(img, name) for name in os.listdir(img)
        if name.lower().endswith(IMG_EXTENSIONS)
        and osp.isfile(osp.join(img, name)))
    if not files:
        raise ValueError(f'no images ({", ".join(IMG_EXTENSIONS)}) found in '
                         f'{img}: nothing written')
    return files


def check_image(path: str, max_pixels: int) -> Optional[str]:
    """Why an image file cannot be run, or ``None`` if it can: its header
    is read first (size against ``max_pixels``, structure), and only an
    image within the limit is decoded (a truncated file is found there).

    Args:
        path (str): the image file.
        max_pixels (int): the largest width x height accepted.

    Returns:
        str | None: the reason, or ``None``.
    """
    from PIL import Image, UnidentifiedImageError
    limit = Image.MAX_IMAGE_PIXELS
    try:
        # Pillow's own bomb guard would refuse at a limit of its own; the
        # size is checked here against --max-pixels instead
        Image.MAX_IMAGE_PIXELS = None
        with warnings.catch_warnings():
            warnings.simplefilter('ignore', Image.DecompressionBombWarning)
            with Image.open(path) as image:
                width, height = image.size
                if width * height > max_pixels:
                    return (f'{width} x {height} = {width * height} pixels, '
                            f'over --max-pixels {max_pixels}')
                image.verify()  # the file's structure, without decoding
            # a truncated file passes verify() but fails to decode (the
            # demos' readers then fail mid-run): decode it, within the
            # pixel limit checked above
            with Image.open(path) as image:
                image.load()
    except UnidentifiedImageError:
        return 'not an image (or of a format Pillow cannot read)'
    except (OSError, SyntaxError, ValueError) as exc:
        # unreadable, or a broken image (Pillow's verify raises these)
        return f'unreadable image ({exc})'
    finally:
        Image.MAX_IMAGE_PIXELS = limit
    if width < 1 or height < 1:
        return f'empty image ({width} x {height})'
    return None


def check_images(files: List[str], max_pixels: int) -> Tuple[List[str], int]:
    """The files that can be run; a line on stderr names each other one.

    Args:
        files (list[str]): the image files.
        max_pixels (int): the largest width x height accepted.

    Returns:
        tuple[list[str], int]: the good files and the number skipped.

    Raises:
        ValueError: none of the files can be run.
    """
    good = []
    for path in files:
        reason = check_image(path, max_pixels)
        if reason is None:
            good.append(path)
        else:
            print(error_line(f'skipped {path}: {reason}'), file=sys.stderr)
    if not good:
        raise ValueError(f'none of the {len(files)} image(s) could be run: '
                         'nothing written')
    return good, len(files) - len(good)


def report_written(out_dir: str, folders: List[str], num_run: int,
                   skipped: int) -> int:
    """A demo's last lines: the folders written and, on stderr, how many
    images were skipped.

    Args:
        out_dir (str): the output folder.
        folders (list[str]): its sub-folders written (``vis``, ...).
        num_run (int): images run.
        skipped (int): images skipped (named earlier).

    Returns:
        int: the tool's exit status: 1 when an image was skipped, else 0.
    """
    print('wrote ' + ', '.join(osp.join(out_dir, d) for d in folders))
    if skipped:
        print(
            error_line(f'{skipped} of {num_run + skipped} image(s) '
                       'skipped (named above)'),
            file=sys.stderr)
        return 1
    return 0
