"""Spread independent jobs (parameter settings, figure panels) over the machine's cores.

:func:`run_sweep` evaluates a picklable function on every item in worker processes
(:class:`concurrent.futures.ProcessPoolExecutor`, started with ``spawn``: the parent may
already run numba's thread pool, which does not survive ``fork``), with a rich progress
bar on a terminal, and returns the results in item order. Every job derives its
randomness from its own item (seeded streams), so the results do not depend on the
number of workers or on the order in which jobs finish.

Each worker runs the numba kernels with ``cores // workers`` threads, so processes
times threads never exceeds the cores.

With ``scheduler="tcp://HOST:PORT"`` the jobs go to a Dask cluster instead (``pip install
'nlagg[dask]'``, :func:`run_on_scheduler`): the same function of the same items, so the same
results, on as many machines as the cluster's workers run on.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import contextmanager
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def available_cores() -> int:
    """Cores this process may run on (the affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _init_worker(threads: int) -> None:
    import signal

    import numba

    # Ctrl-C reaches the whole process group: the parent stops the workers (no traceback from each).
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    numba.set_num_threads(max(1, min(threads, numba.get_num_threads())))


def run_sweep(
    fn: Callable[[T], R],
    items: Sequence[T],
    *,
    workers: int | None = None,
    description: str = "sweep",
    on_result: Callable[[int, R], None] | None = None,
    scheduler: str | None = None,
) -> list[R]:
    """``[fn(item) for item in items]``, computed on up to ``workers`` processes (or a Dask cluster).

    Parameters
    ----------
    fn
        A module-level (picklable) function of one item.
    items
        The jobs; each must be picklable.
    workers
        Worker processes; ``None`` uses one per core (at most one per item), ``1`` runs
        the jobs in this process, one after the other.
    description
        Label of the progress bar (shown only when stderr is a terminal).
    on_result
        Called in this process as ``on_result(index, result)`` when a job finishes.
    scheduler
        A Dask scheduler's address (``tcp://HOST:PORT``): the jobs run on its workers
        (:func:`run_on_scheduler`) and ``workers`` is ignored.
    """
    if scheduler is not None:
        with _progress(description, len(items)) as advance:
            return run_on_scheduler(fn, items, scheduler, on_result=on_result, advance=advance)
    n_jobs = len(items)
    cores = available_cores()
    count = min(n_jobs, cores if workers is None else max(1, workers))
    results: dict[int, R] = {}
    with _progress(description, n_jobs) as advance:
        if count <= 1:
            for i, item in enumerate(items):
                results[i] = fn(item)
                if on_result is not None:
                    on_result(i, results[i])
                advance()
        else:
            context = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(
                max_workers=count,
                mp_context=context,
                initializer=_init_worker,
                initargs=(max(1, cores // count),),
            ) as pool:
                pending: dict[Future[R], int] = {pool.submit(fn, item): i for i, item in enumerate(items)}
                try:
                    while pending:
                        done, _ = wait(pending, return_when=FIRST_COMPLETED)
                        for future in done:
                            i = pending.pop(future)
                            results[i] = future.result()
                            if on_result is not None:
                                on_result(i, results[i])
                            advance()
                except BaseException:
                    # A failed job or callback (or Ctrl-C) ends the sweep now: the jobs not
                    # started yet are dropped instead of run before the error is raised.
                    pool.shutdown(wait=False, cancel_futures=True)
                    for worker in multiprocessing.active_children():  # the jobs running: not awaited
                        worker.terminate()
                    raise
    return [results[i] for i in range(n_jobs)]


CONNECT_TIMEOUT = 10.0
"""Seconds to wait for a Dask scheduler to answer."""


def run_on_scheduler(
    fn: Callable[[T], R],
    items: Sequence[T],
    scheduler: str,
    *,
    on_result: Callable[[int, R], None] | None = None,
    advance: Callable[[], None] = lambda: None,
) -> list[R]:
    """``[fn(item) for item in items]`` on the workers of the Dask scheduler at ``scheduler``.

    Every job is submitted as impure (``pure=False``: two equal items are two jobs, as in the
    process pool) and its result returned in item order; ``on_result(index, result)`` runs here
    as each one finishes. A job's exception is raised here and cancels the jobs not finished.

    Raises
    ------
    ConfigError
        ``scheduler=...``: the ``distributed`` package is missing (the ``nlagg[dask]`` extra), or
        no scheduler answered at that address within :data:`CONNECT_TIMEOUT` seconds.
    """
    from .errors import ConfigError

    try:
        from distributed import Client, as_completed
    except ImportError:
        raise ConfigError(
            "scheduler", scheduler, "needs the Dask client: pip install 'nlagg[dask]' (distributed)"
        ) from None
    try:
        client = Client(scheduler, timeout=CONNECT_TIMEOUT, set_as_default=False)  # type: ignore[no-untyped-call]
    except (OSError, TimeoutError) as exc:
        why = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        raise ConfigError("scheduler", scheduler, f"no Dask scheduler answered there ({why})") from None
    with client:
        futures = [client.submit(fn, item, pure=False) for item in items]
        index = {future.key: i for i, future in enumerate(futures)}
        results: dict[int, R] = {}
        try:
            for future in as_completed(futures, loop=client.loop):  # type: ignore[no-untyped-call]
                i = index[future.key]
                results[i] = future.result()
                if on_result is not None:
                    on_result(i, results[i])
                advance()
        except BaseException:
            client.cancel(futures)  # type: ignore[no-untyped-call]
            raise
    return [results[i] for i in range(len(items))]


@contextmanager
def _progress(description: str, total: int) -> Iterator[Callable[[], None]]:
    """A rich progress bar on stderr (when it is a terminal); the context value advances it by one."""
    if not sys.stderr.isatty():
        yield lambda: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task(description, total=total)
        yield lambda: bar.advance(task)
