# Copyright (c) mmcalidet contributors. All rights reserved.
"""Cached decoder outputs: run backbone + transformer once per image.

The decoder's hidden states and boxes do not depend on the prior (the
encoder's proposal head stays uncalibrated), so an evaluation under many
priors keeps, per image, the last decoder layer's hidden states ``h``
(Q x d) and boxes (Q x 4, normalised cx cy w h) and re-scores them with the
classification branch only (:mod:`mmcalidet.evaluation.scoring`).

Memory: ``Q * (d + 4) * 4`` bytes per image in float32, e.g. DINO-4scale
(Q = 900, d = 256): 0.89 MiB per image, 4.4 GiB for COCO val2017 (5,000
images) and 62 GiB for the filtered Objects365 val (71,316 images). With
``spill_dir`` the arrays are written to ``.npy`` chunks there and read back
through memory maps, so only the chunk being scored is resident; ``dtype=
torch.float16`` halves the size (scores then differ from a full forward by
the rounding of ``h``).
"""
import os
import os.path as osp
from typing import Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from mmdet.structures import DetDataSample
from torch import Tensor

from ..utils.progress import progress_bar

#: images per spilled ``.npy`` chunk
SPILL_CHUNK_IMAGES = 64


def strip_data_sample(data_sample: DetDataSample) -> DetDataSample:
    """A CPU copy of a data sample without predictions: metainfo (img_id,
    shapes, scale factor) and the ground truth, as evaluators need them."""
    out = DetDataSample(metainfo=data_sample.metainfo)
    for key in ('gt_instances', 'ignored_instances'):
        if key in data_sample:
            out.set_field(data_sample.get(key).cpu(), key)
    return out


def with_predictions(data_sample: DetDataSample, pred) -> DetDataSample:
    """A new data sample with the metainfo and ground truth of
    ``data_sample`` and ``pred_instances = pred`` (nothing is copied)."""
    out = DetDataSample(metainfo=data_sample.metainfo)
    for key in ('gt_instances', 'ignored_instances'):
        if key in data_sample:
            out.set_field(data_sample.get(key), key)
    out.pred_instances = pred
    return out


class HiddenStateCache:
    """Per-image last-decoder-layer hidden states and boxes of a detector.

    Filled by :func:`cache_hidden_states`; read by index with :meth:`get`.
    Images keep the order in which they were added (the data loader's).

    Args:
        spill_dir (str, optional): write the arrays to ``.npy`` files in
            this folder (created) and memory-map them, instead of keeping
            them in memory.
        dtype (torch.dtype): storage dtype, ``torch.float32`` (exact) or
            ``torch.float16`` (half the memory, approximate).
    """

    def __init__(self,
                 spill_dir: Optional[str] = None,
                 dtype: torch.dtype = torch.float32) -> None:
        if dtype not in (torch.float32, torch.float16):
            raise ValueError(f'cache dtype must be float32 or float16, got '
                             f'{dtype}')
        self.spill_dir = spill_dir
        self.dtype = dtype
        if spill_dir is not None:
            os.makedirs(spill_dir, exist_ok=True)
        self._hidden: List[Union[Tensor, np.ndarray]] = []
        self._boxes: List[Union[Tensor, np.ndarray]] = []
        self._pending: List[Tuple[Tensor, Tensor]] = []
        self._chunk_of: List[int] = []
        self._row_of: List[int] = []
        #: the stripped data samples (metainfo + ground truth), per image
        self.data_samples: List[DetDataSample] = []
        #: index of the evaluation batch each image came in
        self.batch_ids: List[int] = []
        #: index of the decoder layer whose outputs are kept
        self.layer_index: Optional[int] = None

    def __len__(self) -> int:
        return len(self.data_samples)

    @property
    def num_queries(self) -> int:
        return int(self._shape()[0])

    @property
    def embed_dims(self) -> int:
        return int(self._shape()[1])

    def _shape(self) -> tuple:
        if self._pending:
            return tuple(self._pending[0][0].shape[1:])
        if not self._hidden:
            raise ValueError('the cache is empty')
        return tuple(self._hidden[0].shape[1:])

    @property
    def bytes_per_image(self) -> int:
        """Bytes of hidden states and boxes per image."""
        q, d = self._shape()
        itemsize = torch.empty(0, dtype=self.dtype).element_size()
        return int(q * (d + 4) * itemsize)

    @property
    def nbytes(self) -> int:
        """Bytes of all cached arrays (on disk when spilled)."""
        return self.bytes_per_image * len(self) if len(self) else 0

    def add(self, hidden: Tensor, boxes: Tensor,
            data_samples: Sequence[DetDataSample], batch_id: int) -> None:
        """Append a batch.

        Args:
            hidden (Tensor): (B, Q, d) last-layer hidden states.
            boxes (Tensor): (B, Q, 4) last-layer boxes (normalised cxcywh).
            data_samples (list[DetDataSample]): the batch's data samples.
            batch_id (int): the evaluation batch index.
        """
        if hidden.dim() != 3 or boxes.shape[:2] != hidden.shape[:2] or \
                len(data_samples) != hidden.shape[0]:
            raise ValueError('hidden (B, Q, d), boxes (B, Q, 4) and B data '
                             'samples expected, got '
                             f'{tuple(hidden.shape)}, {tuple(boxes.shape)}, '
                             f'{len(data_samples)}')
        if len(self) and tuple(hidden.shape[1:]) != self._shape():
            raise ValueError(f'hidden states of shape {tuple(hidden.shape)} '
                             f'do not match the cache {self._shape()}')
        hidden = hidden.detach().to('cpu', self.dtype)
        boxes = boxes.detach().to('cpu', self.dtype)
        self.data_samples.extend(strip_data_sample(ds) for ds in data_samples)
        self.batch_ids.extend([batch_id] * hidden.shape[0])
        if self.spill_dir is None:
            self._chunk_of.extend([len(self._hidden)] * hidden.shape[0])
            self._row_of.extend(range(hidden.shape[0]))
            self._hidden.append(hidden.clone())
            self._boxes.append(boxes.clone())
            return
        self._pending.append((hidden, boxes))
        if sum(h.shape[0] for h, _ in self._pending) >= SPILL_CHUNK_IMAGES:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        hidden = torch.cat([h for h, _ in self._pending]).numpy()
        boxes = torch.cat([b for _, b in self._pending]).numpy()
        self._pending = []
        chunk = len(self._hidden)
        arrays = []
        for name, arr in (('hidden', hidden), ('boxes', boxes)):
            path = osp.join(self.spill_dir, f'{name}_{chunk:06d}.npy')
            np.save(path, arr)
            arrays.append(np.load(path, mmap_mode='r'))
        self._hidden.append(arrays[0])
        self._boxes.append(arrays[1])
        self._chunk_of.extend([chunk] * hidden.shape[0])
        self._row_of.extend(range(hidden.shape[0]))

    def finalize(self) -> 'HiddenStateCache':
        """Write the last spilled chunk (no-op in memory); returns self."""
        if self.spill_dir is not None:
            self._flush()
        return self

    def get(
        self,
        indices: Sequence[int],
        device: Union[str, torch.device] = 'cpu'
    ) -> Tuple[Tensor, Tensor, List[DetDataSample]]:
        """Gather images.

        Args:
            indices (Sequence[int]): image indices.
            device (str | torch.device): where to put the tensors.

        Returns:
            tuple: hidden states (B, Q, d) and boxes (B, Q, 4), float32, and
            the data samples.
        """
        if self._pending:
            self.finalize()
        hidden, boxes = [], []
        for k in indices:
            chunk, row = self._chunk_of[k], self._row_of[k]
            h, b = self._hidden[chunk][row], self._boxes[chunk][row]
            if self.spill_dir is not None:  # read the rows from the map
                h, b = torch.from_numpy(np.array(h)), torch.from_numpy(
                    np.array(b))
            hidden.append(h)
            boxes.append(b)
        return (torch.stack(hidden).to(device, torch.float32),
                torch.stack(boxes).to(device, torch.float32),
                [self.data_samples[k] for k in indices])

    def gt_label_lists(self) -> List[np.ndarray]:
        """Per-image ground-truth class indices (crowd boxes, which mmdet
        keeps in ``ignored_instances``, excluded)."""
        out = []
        for ds in self.data_samples:
            gt = ds.get('gt_instances', None)
            out.append(gt.labels.numpy().astype(np.int64) if gt is not None
                       and 'labels' in gt else np.zeros(0, dtype=np.int64))
        return out

    def img_ids(self) -> List:
        """The ``img_id`` of every image (``None`` where unknown)."""
        return [ds.metainfo.get('img_id') for ds in self.data_samples]


def run_decoder(model: torch.nn.Module, batch: dict) -> tuple:
    """Preprocess a batch (test mode) and run the backbone, the
    transformer and the head: what the decoder caches hold.

    Args:
        model (nn.Module): a DETR-family detector whose
            ``forward_transformer`` returns ``hidden_states`` and
            ``references`` (DINO, Deformable DETR, their CaliDet versions).
        batch (dict): ``dict(inputs=[...], data_samples=[...])`` as a data
            loader yields it.

    Returns:
        tuple: the preprocessed data samples, the hidden states of every
        decoder layer (L, B, Q, d) and the head's outputs (every layer's
        class logits and normalised boxes).
    """
    data = model.data_preprocessor(batch, False)
    samples = data['data_samples']
    head_inputs = model.forward_transformer(
        model.extract_feat(data['inputs']), samples)
    keys = ('hidden_states', 'references', 'cali_vectors')
    outs = model.bbox_head(
        **{k: head_inputs[k]
           for k in keys if k in head_inputs})
    return samples, head_inputs['hidden_states'], outs


def cache_hidden_states(model: torch.nn.Module,
                        data: Iterable[dict],
                        spill_dir: Optional[str] = None,
                        dtype: torch.dtype = torch.float32,
                        progress: bool = True,
                        callback=None,
                        before_batch=None) -> HiddenStateCache:
    """Run backbone + transformer once per image and cache the last
    decoder layer's hidden states and boxes.

    Works for any mmdet DETR-family detector whose ``forward_transformer``
    returns ``hidden_states`` and ``references`` (DINO, Deformable DETR and
    their CaliDet versions).

    Args:
        model (nn.Module): the detector (put in eval mode here).
        data (Iterable[dict]): batches as a data loader yields them
            (``dict(inputs=[...], data_samples=[...])``).
        spill_dir (str, optional): spill the cache to this folder.
        dtype (torch.dtype): storage dtype (see :class:`HiddenStateCache`).
        progress (bool): show a progress bar.
        callback (callable, optional): called as ``callback(batch_id,
            data_batch, outputs)`` after each batch, ``outputs`` being the
            data samples with the predictions under the model's current
            prior (what ``model.test_step`` returns), e.g. to call hooks.
        before_batch (callable, optional): called as ``before_batch(
            batch_id, data_batch)`` before each batch.

    Returns:
        HiddenStateCache: the filled cache.
    """
    model.eval()
    cache = HiddenStateCache(spill_dir=spill_dir, dtype=dtype)
    total = None
    dataset = getattr(data, 'dataset', None)
    if dataset is not None:
        total = len(dataset)
    head = model.bbox_head
    with progress_bar(desc='decoder cache', enabled=progress, total=total,
                      unit='img') as bar, \
            torch.no_grad():
        for batch_id, batch in enumerate(data):
            if before_batch is not None:
                before_batch(batch_id, batch)
            samples, hidden, outs = run_decoder(model, batch)
            cache.layer_index = hidden.shape[0] - 1
            cache.add(hidden[-1], outs[1][-1], samples, batch_id)
            if callback is not None:
                results = head.predict_by_feat(
                    *outs,
                    batch_img_metas=[ds.metainfo for ds in samples],
                    rescale=True)
                callback(batch_id, batch,
                         model.add_pred_to_datasample(samples, results))
            bar.update(len(samples))
    return cache.finalize()


def image_batches(model: torch.nn.Module,
                  images: Sequence,
                  batch_size: int = 1,
                  pipeline=None) -> Iterator[dict]:
    """Batches of images (file paths or HxWx3 BGR arrays) through the
    model's test pipeline, as :func:`mmdet.apis.inference_detector`
    prepares them.

    Args:
        model (nn.Module): a detector with ``cfg`` (``init_detector``).
        images (Sequence[str | np.ndarray]): the images.
        batch_size (int): images per batch.
        pipeline (Callable, optional): a test pipeline to use instead.

    Yields:
        dict: ``dict(inputs=[...], data_samples=[...])``.
    """
    if pipeline is None:
        from ..apis.inference import build_test_pipeline
        if getattr(model, 'cfg', None) is None:
            raise ValueError('the model has no cfg (build it with '
                             'mmdet.apis.init_detector) and no pipeline '
                             'was given')
        pipeline = build_test_pipeline(
            model.cfg,
            bool(len(images)) and isinstance(images[0], np.ndarray))
    for start in range(0, len(images), batch_size):
        batch = dict(inputs=[], data_samples=[])
        for k in range(start, min(start + batch_size, len(images))):
            img = images[k]
            item = dict(
                img=img, img_id=k) if isinstance(img, np.ndarray) else dict(
                    img_path=img, img_id=k)
            item = pipeline(item)
            batch['inputs'].append(item['inputs'])
            batch['data_samples'].append(item['data_samples'])
        yield batch


def cache_images(model: torch.nn.Module,
                 images: Sequence,
                 batch_size: int = 1,
                 pipeline=None,
                 **kwargs) -> HiddenStateCache:
    """:func:`cache_hidden_states` over images (paths or arrays).

    Args:
        model (nn.Module): a detector with ``cfg`` (or pass ``pipeline``).
        images (Sequence[str | np.ndarray]): the images.
        batch_size (int): images per forward.
        pipeline (Callable, optional): the test pipeline.
        **kwargs: passed to :func:`cache_hidden_states`.

    Returns:
        HiddenStateCache: the cache, images in the given order.
    """
    kwargs.setdefault('progress', False)
    return cache_hidden_states(
        model, image_batches(model, images, batch_size, pipeline), **kwargs)
