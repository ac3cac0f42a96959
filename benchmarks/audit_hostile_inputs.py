# Copyright (c) mmcalidet contributors. All rights reserved.
"""Audit the public surface with about 400 hostile and unusual inputs and
classify what each one gives (the audit of issue #75, re-runnable).

    OMP_NUM_THREADS=1 python benchmarks/audit_hostile_inputs.py \\
        --out work_dirs/audit/hostile_inputs.json

Families: ``Prior`` construction and files, ``set_prior`` /
``inference_detector`` (priors and images), the post-hoc corrections,
checkpoints, the compiled deform-attn kernel's ``num_threads``, the ONNX
export and runtime, the online calibrator, and the tools run as a user
runs them (each in a process of its own: a crash is a signal, a
traceback is what the user reads). The tiny coco-mini configs are built
with random weights: their outputs are judged only by comparing two routes
that must agree (ONNX and PyTorch, a call prior and ``set_prior``, a file
and its loaded ``Prior``, a path and its decoded array).

Each try is one of:

* ``clean refusal``: a one-line error naming the problem (the API: a
  ``ValueError`` / ``TypeError`` / ``OSError``; a tool: a non-zero exit,
  no traceback);
* ``correct``: accepted, and an independent check holds;
* ``silently wrong``: accepted, and wrong (a hostile input taken, or the
  independent check fails);
* ``crash``: the process died without a Python exception (a signal);
* ``traceback``: a tool printed a Python traceback, or the API raised an
  internal error (``IndexError``, ``KeyError``, ``AttributeError``, ...)
  or a message of several lines;
* ``late failure``: a tool refused only after the expensive work;
* ``leftover``: a refusal left files or folders behind;
* ``hang``: the try ran past its time limit;
* ``unclear refusal``: a clean refusal whose message does not name the
  problem; ``refused valid``: a valid input refused.

The tries are in ``benchmarks/audit_tries/`` (the API's families, the
models', the tools'). Prints a line per try and a table of outcomes per
family; writes every try (input, expected, outcome, message) as JSON to
``--out``; exits 1 if
any try is silently wrong or a crash, or more than ``--max-tracebacks``
are tracebacks.
"""
import argparse
import json
import logging
import os
import os.path as osp
import re
import signal
import sys
import time
import traceback
from collections import Counter, defaultdict
from typing import Any, Callable, Dict, List, Optional, Sequence

os.environ.setdefault('OMP_NUM_THREADS', '1')
os.environ.setdefault('MKL_NUM_THREADS', '1')
HERE = osp.dirname(osp.abspath(__file__))
sys.path.insert(0, osp.join(HERE, 'audit_tries'))
sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

OUTCOMES = ('clean refusal', 'correct', 'silently wrong', 'crash', 'traceback',
            'late failure', 'leftover', 'hang', 'unclear refusal',
            'refused valid')
#: exceptions an API refusal may raise (a user can catch and read them)
CLEAN_TYPES = (ValueError, TypeError, OSError)
#: a tool refusing after this many seconds did the work first
LATE_S = 20.0


class Audit:
    """The tries and their outcomes.

    Args:
        timeout (float): seconds a try may run.
        verbose (bool): print a line per try.
    """

    def __init__(self, timeout: float = 120.0, verbose: bool = True) -> None:
        self.timeout = timeout
        self.verbose = verbose
        self.tries: List[Dict[str, Any]] = []

    # ------------------------------------------------------------------
    def record(self, family: str, name: str, expected: str, outcome: str,
               message: str, seconds: float) -> str:
        """Store one try and print its line; return its outcome."""
        assert outcome in OUTCOMES, outcome
        self.tries.append(
            dict(
                family=family,
                input=name,
                expected=expected,
                outcome=outcome,
                message=message[-2000:],
                seconds=round(seconds, 3)))
        if self.verbose:
            line = message.strip().splitlines()[-1] if message.strip() \
                else ''
            print(
                f'[{len(self.tries):3d}] {family:<12} {outcome:<15} '
                f'{name[:60]:<60} {line[:110]}',
                flush=True)
        return outcome

    def api(self,
            family: str,
            name: str,
            fn: Callable[[], Any],
            expect: str = 'refuse',
            match: Optional[str] = None,
            check: Optional[Callable[[Any], Any]] = None,
            folder: Optional[str] = None) -> str:
        """Run ``fn()`` in this process and classify it.

        Args:
            family (str): the family of the try.
            name (str): what is tried.
            fn (callable): the try.
            expect (str): ``'refuse'`` (a hostile input: taking it is
                silently wrong unless ``check`` says otherwise) or
                ``'accept'`` (a valid one: ``check`` judges the result).
            match (str, optional): a regex the refusal must contain
                (case-insensitive): the problem it must name.
            check (callable, optional): ``check(result)`` -> a true value
                (or a string saying what held) if the result is right,
                False / a string starting ``'wrong'`` if not.
            folder (str, optional): a folder a refusal must leave as it
                was.
        """
        before = _listing(folder)
        start = time.perf_counter()
        previous = signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, self.timeout)
        try:
            result = fn()
        except _Hang:
            return self.record(family, name, expect, 'hang',
                               f'ran past {self.timeout:.0f} s',
                               time.perf_counter() - start)
        except BaseException as exc:  # noqa: B902 (classified below)
            if isinstance(exc, KeyboardInterrupt):
                raise
            seconds = time.perf_counter() - start
            message = f'{type(exc).__name__}: {exc}'
            if not isinstance(exc, CLEAN_TYPES) or '\n' in str(exc).strip() \
                    or not str(exc).strip():
                tb = ''.join(traceback.format_exception(exc)[-6:])
                return self.record(family, name, expect, 'traceback', tb,
                                   seconds)
            left = _new(folder, before) if before is not None and \
                _listing(folder) != before else None
            return self.refusal(family, name, expect, message, str(exc), match,
                                left, seconds)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        seconds = time.perf_counter() - start
        return self.judge(family, name, expect, result, check, seconds)

    def refusal(self,
                family: str,
                name: str,
                expect: str,
                message: str,
                text: str,
                match: Optional[str],
                left: Optional[str],
                seconds: float,
                late: bool = False) -> str:
        """Classify a refused try (an API's exception, a tool's exit
        status): a leftover, a late failure, a valid input refused, a
        refusal that does not name the problem, or a clean refusal.

        Args:
            family, name, expect, match: as :meth:`api`.
            message (str): the refusal as recorded.
            text (str): what ``match`` must be found in.
            left (str, optional): what the refusal left behind (None:
                nothing).
            seconds (float): the try's time.
            late (bool): refused only after the expensive work.
        """
        if left is not None:
            return self.record(family, name, expect, 'leftover',
                               f'{message} (left {left})', seconds)
        if late:
            return self.record(family, name, expect, 'late failure',
                               f'{message} (after {seconds:.0f} s)', seconds)
        if expect == 'accept':
            return self.record(family, name, expect, 'refused valid', message,
                               seconds)
        if match and not re.search(match, text, re.I):
            return self.record(family, name, expect, 'unclear refusal',
                               f'{message} (expected /{match}/)', seconds)
        return self.record(family, name, expect, 'clean refusal', message,
                           seconds)

    def judge(self, family: str, name: str, expect: str, result: Any,
              check: Optional[Callable[[Any], Any]], seconds: float) -> str:
        """Classify an accepted try by its independent check."""
        if check is None:
            verdict = 'wrong: a hostile input was accepted' \
                if expect == 'refuse' else 'accepted'
        else:
            try:
                verdict = check(result)
            except Exception as exc:  # the check itself failed: wrong
                verdict = f'wrong: the check raised {type(exc).__name__}: ' \
                    f'{exc}'
        if verdict is None or verdict is False or (isinstance(
                verdict, str) and verdict.startswith('wrong')):
            if expect == 'refuse' and check is None:
                message = f'{verdict}: {_short(result)}'
            else:
                message = str(verdict or 'wrong: the check failed')
            return self.record(family, name, expect, 'silently wrong', message,
                               seconds)
        return self.record(family, name, expect, 'correct',
                           verdict if isinstance(verdict, str) else 'ok',
                           seconds)

    # ------------------------------------------------------------------
    def tool(
        self,
        family: str,
        name: str,
        script: str,
        args: Sequence[str],
        cwd: str,
        expect: str = 'refuse',
        match: Optional[str] = None,
        check: Optional[Callable[[Any], Any]] = None,
        keep: Sequence[str] = ()
    ) -> str:
        """Run a tool as a user does (a process of its own, one thread)
        and classify it.

        Args:
            family, name, expect, match, check: as :meth:`api`
                (``check`` gets the ``CompletedProcess``).
            script (str): the tool, relative to the project root.
            args (Sequence[str]): its arguments.
            cwd (str): its working folder; a refusal must leave it as it
                was (but for the paths in ``keep``).
            keep (Sequence[str]): names in ``cwd`` a run may change.
        """
        import subprocess

        from testing import run_tool
        before = _listing(cwd, keep)
        start = time.perf_counter()
        try:
            res = run_tool(
                script, *args, threads=1, timeout=int(self.timeout), cwd=cwd)
        except subprocess.TimeoutExpired:
            return self.record(family, name, expect, 'hang',
                               f'ran past {self.timeout:.0f} s',
                               time.perf_counter() - start)
        seconds = time.perf_counter() - start
        out = (res.stdout or '') + (res.stderr or '')
        last = (res.stderr or res.stdout or '').strip().splitlines()[-1:] \
            or ['']
        if res.returncode < 0:
            return self.record(
                family, name, expect, 'crash',
                f'killed by signal {-res.returncode}: '
                f'{out[-600:]}', seconds)
        if 'Traceback (most recent call last)' in out:
            return self.record(family, name, expect, 'traceback',
                               (res.stderr or out)[-1500:], seconds)
        if res.returncode != 0:
            message = f'exit {res.returncode}: {last[0]}'
            left = _new(cwd, before, keep) \
                if _listing(cwd, keep) != before else None
            return self.refusal(
                family,
                name,
                expect,
                message,
                last[0],
                match,
                left,
                seconds,
                late=seconds > LATE_S)
        return self.judge(family, name, expect, res, check, seconds)

    # ------------------------------------------------------------------
    def summary(self) -> str:
        """The table of outcomes per family (markdown)."""
        families = list(dict.fromkeys(t['family'] for t in self.tries))
        counts = defaultdict(Counter)
        for t in self.tries:
            counts[t['family']][t['outcome']] += 1
            counts['all'][t['outcome']] += 1
        used = [o for o in OUTCOMES if counts['all'][o]]
        head = '| family | tries | ' + ' | '.join(used) + ' |'
        lines = [head, '|' + '---|' * (len(used) + 2)]
        for fam in families + ['all']:
            row = counts[fam]
            cells = ' | '.join(str(row[o]) for o in used)
            label = f'**{fam}**' if fam == 'all' else fam
            lines.append(f'| {label} | {sum(row.values())} | {cells} |')
        return '\n'.join(lines)


class _Hang(Exception):
    pass


def _on_alarm(signum, frame):
    raise _Hang()


def _listing(folder: Optional[str], keep: Sequence[str] = ()):
    """Every path under ``folder`` (None: not watched)."""
    if folder is None:
        return None
    found = set()
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            rel = osp.relpath(osp.join(root, name), folder)
            if rel.split(os.sep)[0] not in keep:
                found.add(rel)
    return found


def _new(folder: str, before: set, keep: Sequence[str] = ()) -> str:
    after = _listing(folder, keep)
    return ', '.join(
        sorted((after - before) | {f'-{p}'
                                   for p in before - after}))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) < 200 else text[:200] + '...'


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument(
        '--out',
        default='work_dirs/audit/hostile_inputs.json',
        help='the JSON of every try')
    parser.add_argument(
        '--families',
        nargs='+',
        default=None,
        help='run only these families (default: all)')
    parser.add_argument(
        '--max-tracebacks',
        type=int,
        default=3,
        help='the most tracebacks the audit passes with')
    parser.add_argument(
        '--timeout', type=float, default=120.0, help='seconds per try')
    parser.add_argument('--quiet', action='store_true', help='no try lines')
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    import warnings

    import audit_families as api
    import audit_model_tries as models
    import audit_tool_tries as tools

    from mmcalidet.utils.log_level import mmengine_log_level
    warnings.filterwarnings('ignore')
    os.environ.setdefault(
        'MMCALIDET_DATA',
        osp.join(
            osp.dirname(osp.dirname(osp.abspath(__file__))), '..', 'shared',
            'datasets'))
    import tempfile
    audit = Audit(args.timeout, verbose=not args.quiet)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix='audit-') as tmp, \
            mmengine_log_level(at_least=logging.ERROR):
        families = {
            'Prior': api.prior_family,
            'corrections': api.corrections_family,
            'kernel': api.kernel_family,
            'online': api.online_family,
            'inference': models.inference_family,
            'checkpoints': models.checkpoint_family,
            'onnx': models.onnx_family,
            'tools': tools.tools_family,
        }
        for name, run in families.items():
            if args.families and name not in args.families:
                continue
            print(f'--- {name}', flush=True)
            run(audit, osp.join(tmp, name.replace(' ', '_')))
    table = audit.summary()
    print()
    print(table)
    counts = Counter(t['outcome'] for t in audit.tries)
    os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
    with open(args.out, 'w', encoding='utf-8') as f:
        json.dump(
            dict(
                tries=audit.tries,
                counts=dict(counts),
                seconds=round(time.perf_counter() - start, 1),
                table=table),
            f,
            indent=1)
    print(f'\n{len(audit.tries)} tries in '
          f'{time.perf_counter() - start:.0f} s; wrote {args.out}')
    failed = counts['silently wrong'] + counts['crash']
    if failed or counts['traceback'] > args.max_tracebacks:
        print(f'FAILED: {counts["silently wrong"]} silently wrong, '
              f'{counts["crash"]} crash(es), {counts["traceback"]} '
              f'traceback(s) (at most {args.max_tracebacks})')
        return 1
    print('passed: no silently wrong result, no crash, '
          f'{counts["traceback"]} traceback(s) (at most '
          f'{args.max_tracebacks})')
    return 0


if __name__ == '__main__':
    sys.exit(main())
