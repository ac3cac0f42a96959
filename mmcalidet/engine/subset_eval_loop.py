# Copyright (c) mmcalidet contributors. All rights reserved.
"""``SubsetEvalTestLoop``: subset evaluation, E_t against E_b (see
``loops.py``), through :func:`mmcalidet.evaluation.protocol.subsets`."""
from typing import Dict, Sequence

from mmdet.registry import LOOPS

from ..evaluation import METRICS, SUBSET_SIZES, Rescorer, cache_evaluator
from ..evaluation.protocol import subsets
from ..evaluation.sweep import Method
from .cached_test_loop import CachedTestLoop


@LOOPS.register_module()
class SubsetEvalTestLoop(CachedTestLoop):
    """Subset evaluation: COCO metrics averaged over random subsets of each
    size under E_t and under each subset's E_b.

    Metrics: ``subset<size>/<E_t|E_b>/<AP...>``, ``subset<size>/epsilon``.

    Args:
        sizes (Sequence[int]): subset sizes.
        seed (int): split seed.
        **kwargs: see :class:`CachedTestLoop`.
    """

    def __init__(self,
                 runner,
                 dataloader,
                 evaluator,
                 sizes: Sequence[int] = SUBSET_SIZES,
                 seed: int = 0,
                 **kwargs) -> None:
        super().__init__(runner, dataloader, evaluator, **kwargs)
        self.sizes = [int(s) for s in sizes]
        self.seed = seed

    def evaluate_cache(self, cache) -> Dict:
        method = Method(
            'model',
            Rescorer(self.detector, cache, batch_size=self.rescore_batch_size))
        table = subsets([method],
                        cache_evaluator(self.coco_evaluator()),
                        self.e_t,
                        self.sizes,
                        self.seed,
                        progress=False)
        self.runner.logger.info(f'subsets:\n{table.markdown}')
        metrics = {}
        for row in table.rows:
            prefix = f'subset{row["size"]}'
            if row['prior'] == 'E_b':
                metrics[f'{prefix}/epsilon'] = row['epsilon']
            for m in METRICS:
                if m in row:
                    metrics[f'{prefix}/{row["prior"]}/{m}'] = row[m]
        return metrics
