"""Running the cells of a plan. ``local``: ``--jobs 1`` trains the cells one after another in this
process; ``--jobs N`` runs N long-lived worker processes (:mod:`upzoo.bench.worker`, each pays the
start-up once), each pinned to one device of ``--devices`` (``CUDA_VISIBLE_DEVICES``) or, on the
CPU, given its share of the threads. ``slurm``: one Slurm job
array through submitit (``pip install -e ".[cluster]"``); a preempted or timed-out cell is requeued
and continues from its ``last.pt``. Every cell runs its plan command (``upzoo train ... --continue``),
so a finished cell is never trained twice and a run folder in use by another launch is refused (its
lock). Failed cells are re-launched up to ``retries`` times. One line per cell start, finish and
failure; a bar over the cells."""

from __future__ import annotations

import os
import queue
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from upzoo.bench.cells import CellResult, exit_reason, last_error, report, run_in_process, run_subprocess
from upzoo.bench.plan import Cell, Plan
from upzoo.errors import ConfigError

__all__ = [
    "parse_devices",
    "check_devices",
    "launch_local",
    "launch_slurm",
    "SlurmOptions",
    "slurm_executor",
    "sbatch_preview",
]


class _Worker:
    """One long-lived worker process (:mod:`upzoo.bench.worker`) of a local launch: it pays the
    start-up once and trains the cells it is sent. A worker that dies (killed, out of memory) fails
    its cell with its exit code and is started again for the next one."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env, self.process = env, None

    def run(self, cell: Cell) -> CellResult:
        import json
        import sys

        Path(cell.log).parent.mkdir(parents=True, exist_ok=True)
        if self.process is None or self.process.poll() is not None:
            command = [sys.executable, "-m", "upzoo.bench.worker"]
            self.process = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=self.env, text=True
            )
        start = time.perf_counter()
        try:
            self.process.stdin.write(json.dumps(asdict(cell)) + "\n")
            self.process.stdin.flush()
            reply = self.process.stdout.readline()
        except BrokenPipeError:
            reply = ""
        if not reply:  # the worker died with this cell
            code = self.process.wait()
            reason = exit_reason(code, cell.log) if code < 0 else f"worker exited with {code}: {last_error(cell.log)}"
            return CellResult(cell, "failed", time.perf_counter() - start, reason)
        outcome = json.loads(reply)
        return CellResult(cell, outcome["status"], time.perf_counter() - start, outcome["error"])

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.stdin.close()
            self.process.wait()


def parse_devices(text: str | None) -> list[str] | None:
    """``--devices 0,1,2,3`` -> ``["0", "1", "2", "3"]`` (``None`` when not given).

    Raises:
        ConfigError: an empty entry, a non-number or a repeated GPU.
    """
    if text is None:
        return None
    devices = [d.strip() for d in str(text).split(",")]
    bad = [d for d in devices if not d.isdigit()]
    if bad or len(set(devices)) != len(devices):
        raise ConfigError(
            f"--devices must list distinct GPU numbers, e.g. 0,1,2,3, got {text!r}"
            + (f" ({bad[0]!r} is not a GPU number)" if bad else " (a GPU named twice)")
        )
    return devices


def check_devices(devices: Sequence[str] | None, jobs: int, nproc: int) -> None:
    """Each of ``jobs`` workers gets ``nproc`` GPUs of its own (a DDP cell ``nproc`` processes):
    ``devices`` must name exactly ``jobs x nproc`` GPUs that exist here.

    Raises:
        ConfigError: no CUDA here, a GPU that does not exist, or another count, with the fix.
    """
    if not devices:
        return
    import torch

    if not torch.cuda.is_available():
        raise ConfigError(f"--devices {','.join(devices)}: no CUDA device is available here; leave --devices out")
    count = torch.cuda.device_count()
    missing = [d for d in devices if int(d) >= count]
    if missing:
        raise ConfigError(
            f"--devices names GPU {missing[0]}, but this machine has {count} (0-{count - 1}); name GPUs that exist"
        )
    if len(devices) != jobs * nproc:
        raise ConfigError(
            f"--jobs {jobs} x --nproc {nproc} use {jobs * nproc} GPU(s), one per process, but --devices names "
            f"{len(devices)} ({','.join(devices)}): name {jobs * nproc}, or change --jobs/--nproc"
        )


def _worker_env(slot: int, jobs: int, devices: Sequence[str] | None, nproc: int = 1) -> dict[str, str]:
    """Worker ``slot``'s environment: its own ``nproc`` GPUs, or its share of the CPU's threads."""
    env = dict(os.environ)
    if devices:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(devices[slot * nproc : (slot + 1) * nproc])
    threads = str(max(1, (os.cpu_count() or 1) // (jobs * nproc)))
    env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
    return env


def launch_local(
    plan: Plan,
    *,
    jobs: int = 1,
    devices: Sequence[str] | None = None,
    retries: int = 0,
    echo: Callable[[str], None] = print,
    progress: bool = True,
) -> list[CellResult]:
    """Run every cell of ``plan`` on this machine (see the module); one result per cell.

    Raises:
        ConfigError: ``jobs`` < 1 or ``retries`` < 0.
    """
    if jobs < 1 or retries < 0:
        raise ConfigError(f"jobs must be >= 1 and retries >= 0, got jobs={jobs}, retries={retries}")
    nproc = max((cell.nproc for cell in plan.cells), default=1)
    check_devices(devices, jobs, nproc)
    from tqdm import tqdm

    in_process = jobs == 1 and not devices
    workers = [_Worker(_worker_env(slot, jobs, devices, nproc)) for slot in range(jobs)] if nproc == 1 else []
    slots: queue.Queue[int] = queue.Queue()
    for slot in range(jobs):
        slots.put(slot)
    bar = tqdm(total=len(plan.cells), desc="cells", unit="cell", disable=not progress, leave=False)

    def run(cell: Cell) -> CellResult:
        slot = slots.get()
        try:
            echo(f"start {cell.variant} seed {cell.seed} (worker {slot})")
            if cell.nproc > 1:  # a DDP cell: its own command launches torchrun
                result = run_subprocess(cell, _worker_env(slot, jobs, devices, cell.nproc))
            else:
                result = run_in_process(cell) if in_process else workers[slot].run(cell)
        finally:
            slots.put(slot)
        report(result, echo)
        bar.update(1)
        return result

    try:
        results = with_retries(plan.cells, _local_batches(run, jobs), retries, echo)
    finally:
        bar.close()
        for worker in workers:
            worker.close()
    return results


def with_retries(
    cells: Sequence[Cell], run_batch: Callable[[list[Cell]], Iterable[CellResult]], retries: int, echo
) -> list[CellResult]:
    """The one retry loop of every launcher: ``run_batch`` runs a list of cells (yielding one result
    each), then the failed ones run again, up to ``retries`` more times; one result per cell, its
    ``attempts`` counted."""
    results: dict[str, CellResult | None] = {c.folder: None for c in cells}
    pending = list(cells)
    for attempt in range(retries + 1):
        if not pending:
            break
        if attempt:
            echo(f"retry {attempt} of {retries}: {len(pending)} failed cell(s)")
        for result in run_batch(pending):
            result.attempts = attempt + 1
            results[result.cell.folder] = result
        pending = [r.cell for r in results.values() if r is not None and r.status == "failed"]
    return list(results.values())


def _local_batches(run: Callable[[Cell], CellResult], jobs: int):
    """Run a list of cells ``jobs`` at a time: in this thread for one (a cell trained in-process
    hears Ctrl-C at its next step), in a thread pool otherwise."""

    def batch(cells: list[Cell]) -> Iterable[CellResult]:
        if jobs == 1:
            yield from map(run, cells)
            return
        pool = ThreadPoolExecutor(max_workers=jobs)
        try:
            yield from pool.map(run, cells)
        finally:
            pool.shutdown(cancel_futures=True)

    return batch


@dataclass(frozen=True)
class SlurmOptions:
    """Resources of each cell and of the array (``bench compare --launcher slurm`` flags)."""

    partition: str | None = None
    time_min: int = 240
    gpus: int = 1
    cpus: int = 8
    parallelism: int = 32
    extra: dict[str, Any] | None = None  # more sbatch options, e.g. {"account": "lab", "qos": "high"}

    def parameters(self) -> dict[str, Any]:
        params: dict[str, Any] = dict(
            timeout_min=self.time_min,
            cpus_per_task=self.cpus,
            slurm_array_parallelism=self.parallelism,
            name="upzoo-compare",
        )
        if self.gpus:
            params["gpus_per_node"] = self.gpus
        if self.partition:
            params["slurm_partition"] = self.partition
        if self.extra:
            params["slurm_additional_parameters"] = dict(self.extra)
        return params


class CellJob:
    """A cell as a submitit job: runs the cell's command; on preemption or timeout submitit calls
    :meth:`checkpoint`, which requeues the same cell (its ``--continue`` resumes from ``last.pt``)."""

    def __init__(self, cell: Cell, threads: int) -> None:
        self.cell, self.threads = cell, threads

    def __call__(self) -> dict[str, Any]:
        env = dict(os.environ, OMP_NUM_THREADS=str(self.threads), MKL_NUM_THREADS=str(self.threads))
        result = run_subprocess(self.cell, env)
        return {"status": result.status, "seconds": result.seconds, "error": result.error}

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        import submitit

        return submitit.helpers.DelayedSubmission(CellJob(self.cell, self.threads))


def slurm_executor(folder: str | Path, options: SlurmOptions, cluster: str = "slurm") -> Any:
    """A submitit executor for the cells (``cluster="local"`` or ``"debug"`` runs the same code
    without a cluster, for tests).

    Raises:
        ConfigError: submitit is not installed.
    """
    try:
        import submitit
    except ImportError:
        raise ConfigError('--launcher slurm needs submitit: pip install -e ".[cluster]"') from None
    executor = submitit.AutoExecutor(folder=str(folder), cluster=cluster)
    executor.update_parameters(**options.parameters())
    return executor


def sbatch_preview(plan: Plan, options: SlurmOptions, folder: str | Path) -> str:
    """The sbatch script submitit submits for ``plan``'s job array with ``options`` (one array task per
    cell, ``%parallelism`` at once), for reading before submitting (``--plan-only`` writes it).

    Raises:
        ConfigError: submitit is not installed.
    """
    try:
        from submitit.slurm.slurm import _make_sbatch_string
    except ImportError:
        raise ConfigError('--launcher slurm needs submitit: pip install -e ".[cluster]"') from None
    import sys

    return _make_sbatch_string(
        command=f"{sys.executable} -u -m submitit.core._submit {folder}",
        folder=str(folder),
        job_name="upzoo-compare",
        partition=options.partition,
        time=options.time_min,
        cpus_per_task=options.cpus,
        gpus_per_node=options.gpus or None,
        array_parallelism=options.parallelism,
        map_count=len(plan.cells),
        additional_parameters=dict(options.extra or {}),
    )


def launch_slurm(
    plan: Plan,
    executor: Any,
    *,
    threads: int = 8,
    retries: int = 0,
    echo: Callable[[str], None] = print,
) -> list[CellResult]:
    """Submit the cells as one job array through ``executor`` and wait for them; failed cells are
    submitted again up to ``retries`` times."""

    def batch(cells: list[Cell]) -> Iterable[CellResult]:
        with executor.batch():
            jobs = [executor.submit(CellJob(cell, threads)) for cell in cells]
        echo(f"submitted {len(jobs)} cell(s) as a job array ({jobs[0].job_id.split('_')[0]})")
        for cell, job in zip(cells, jobs):
            outcome = _job_outcome(job)
            result = CellResult(cell, outcome["status"], outcome.get("seconds", 0.0), outcome.get("error", ""))
            report(result, echo)
            yield result

    return with_retries(plan.cells, batch, retries, echo)


def _job_outcome(job: Any) -> dict[str, Any]:
    try:
        return job.result()
    except Exception as exc:  # the job itself failed (node failure, cancelled): one line
        return {"status": "failed", "error": f"slurm job {job.job_id}: {str(exc).strip().splitlines()[-1][:300]}"}
