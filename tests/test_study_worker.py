"""capsmed run's long-lived worker: runs trained one after another in one process are
bit-identical to ``capsmed train`` in a fresh process, and a worker that fails or
dies costs only its command."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
from pathlib import Path

import yaml
from safetensors.numpy import load_file

from capsmed.pipeline import workers

ROOT = Path(__file__).resolve().parents[1]
TOY_CAPS = {"conv_channels": 8, "primary_types": 2, "primary_dim": 4, "class_dim": 4}


def _config(tmp_path: Path, name: str, data: Path, **train) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"data": str(data), "epochs": 1, "batch_size": 16,
                                    "device": "cpu", "seed": 3, **train}))
    return path


def _weights(run_dir: Path) -> dict:
    return load_file(str(run_dir / "checkpoint.safetensors"))


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)


def test_runs_in_one_worker_are_bit_identical_to_fresh_processes(tmp_path, tiny_h5):
    """A capsnet, then a lenet with augmentation, then an evaluation, all in one worker:
    the lenet's weights and the evaluation's report equal those of fresh processes."""
    env = {"OMP_NUM_THREADS": "1"}
    caps = _config(tmp_path, "caps", tiny_h5, arch="capsnet", model_kwargs=TOY_CAPS)
    lenet = _config(tmp_path, "lenet", tiny_h5, arch="lenet", augment=True, lr=3e-3)
    log = tmp_path / "worker.log"
    try:
        assert workers.run_in_worker(["train", "--config", str(caps), "--out",
                                      str(tmp_path / "w-caps")], log, env) == 0
        assert workers.run_in_worker(["train", "--config", str(lenet), "--out",
                                      str(tmp_path / "w-lenet")], log, env) == 0
        assert workers.run_in_worker(["evaluate", str(tmp_path / "w-lenet"), "--no-grids"],
                                     log, env) == 0
        # one process did all three
        [worker] = workers._pool._idle[workers.pool_key(env, preload=True)]
        assert worker.commands == 3
    finally:
        workers.close_workers()
    fresh = tmp_path / "f-lenet"
    for args in (["train", "--config", str(lenet), "--out", str(fresh)],
                 ["evaluate", str(fresh), "--no-grids"]):
        subprocess.run([sys.executable, "-m", "capsmed", *args], cwd=ROOT, check=True,
                       capture_output=True, env={**os.environ, **env})
    assert _same(_weights(tmp_path / "w-lenet"), _weights(fresh))
    text = log.read_text()
    assert text.count("$ ") == 3 and "run saved to" in text  # every command's output
    worker_report = (tmp_path / "w-lenet" / "report" / "report.csv").read_text()
    assert worker_report == (fresh / "report" / "report.csv").read_text()


def test_a_failing_command_gives_its_code_and_error_and_the_worker_goes_on(tmp_path):
    log = tmp_path / "w.log"
    try:
        code = workers.run_in_worker(["train", "--data", str(tmp_path / "missing.h5"),
                                      "--out", str(tmp_path / "r")], log)
        assert code == 1
        assert "error:" in log.read_text() and "missing.h5" in log.read_text()
        assert workers.run_in_worker(["train", "--help"], log) == 0  # the same worker
        [worker] = workers._pool._idle[workers.pool_key({}, preload=True)]
        assert worker.commands == 2
    finally:
        workers.close_workers()


def test_the_logged_command_line_keeps_paths_with_spaces_whole(tmp_path):
    """The log's ``$ ...`` line is the command to rerun: a run folder "-r ü, 2" was
    logged unquoted, three arguments (and one an option) when pasted into a shell."""
    from capsmed.pipeline.processes import run_logged

    log, args = tmp_path / "w.log", ["train", "--help", "--out", str(tmp_path / "-r ü, 2")]
    try:
        assert workers.run_in_worker(args, log) == 0
    finally:
        workers.close_workers()
    assert run_logged(["true", "a b", "-c 'd'"], log) == 0
    lines = [line[2:] for line in log.read_text().splitlines() if line.startswith("$ ")]
    assert shlex.split(lines[0])[-4:] == args and shlex.split(lines[1]) == ["true", "a b",
                                                                            "-c 'd'"]


def test_a_worker_killed_mid_command_fails_that_command_only(tmp_path):
    """SIGKILL of the worker (the OOM killer): the command's code says so, and the
    next command gets a fresh worker."""
    log = tmp_path / "w.log"
    started = threading.Event()
    spawn = workers._spawn

    def spawn_and_watch(start):
        proc = spawn(start)
        started.proc = proc  # type: ignore[attr-defined]
        started.set()
        return proc

    workers._spawn = spawn_and_watch
    killer = threading.Thread(target=lambda: started.wait(60) and
                              os.kill(started.proc.pid, signal.SIGKILL))  # type: ignore
    killer.start()
    try:
        code = workers.run_in_worker(["bench", "--help"], log)
        killer.join()
        assert code == -signal.SIGKILL
        assert workers.run_in_worker(["models"], log) == 0
    finally:
        workers._spawn = spawn
        workers.close_workers()


def test_a_bad_worker_option_is_one_line_before_anything_runs(tmp_path):
    """``executor: {local: {worker: yes-please}}``: exit 1, one error line naming the
    option, and no study folder made."""
    raw = yaml.safe_load((ROOT / "pipelines" / "smoke.yaml").read_text())
    raw["variables"]["out"] = str(tmp_path / "out")
    raw["executor"] = {"jobs": 2, "local": {"worker": "yes-please"}}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    done = subprocess.run([sys.executable, "-m", "capsmed", "run", str(path)], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "executor.local.worker" in errors[0], done.stderr
    assert not (tmp_path / "out").exists()


def test_a_dataset_made_in_a_worker_records_its_own_command(tmp_path):
    """Provenance says the command that made the file, as `capsmed ...` (not the
    worker's own command line, whose pipe numbers change from one study to the next
    and made a remade dataset's content digest differ)."""
    import h5py

    from capsmed.data.writer import command_line

    raw, out = tmp_path / "raw", tmp_path / "d.h5"
    log = tmp_path / "worker.log"
    args = ["preprocess", "mnist", str(raw), "-o", str(out), "--val", "8", "--seed", "0"]
    try:
        assert workers.run_in_worker(["synth", "mnist", str(raw), "--train", "40",
                                      "--test", "10", "--seed", "0"], log, {}) == 0
        assert workers.run_in_worker(args, log, {}) == 0, log.read_text()
    finally:
        workers.close_workers()
    with h5py.File(out, "r") as f:
        recorded = yaml.safe_load(f.attrs["provenance"])["command_line"]
    assert recorded == command_line(["capsmed", *args])
    assert sys.argv[0] != "capsmed"  # this process's own argv is left as it was


def test_a_benchmark_in_a_worker_reports_its_own_peak_memory(tmp_path):
    """``capsmed bench`` reports the peak memory of its process (on a CPU the peak of the
    process's whole life): after a bigger benchmark in the same worker it reported that
    one's peak, not its own. Each benchmark now gets a process of its own."""
    import json

    def bench(name: str, *options: str) -> float:
        results = tmp_path / f"{name}.jsonl"
        args = ["-q", "bench", "train", "--arch", "lenet", "--device", "cpu", "--steps",
                "1", "--warmup", "0", *options, "--results", str(results)]
        assert workers.run_in_worker(args, tmp_path / "w.log", {"OMP_NUM_THREADS": "1"}) == 0
        return json.loads(results.read_text())["peak_memory_mib"]

    try:
        big = bench("big", "--batch-size", "128", "--input-size", "96")
        small = bench("small", "--batch-size", "2")
    finally:
        workers.close_workers()
    assert small < big - 100, (small, big)  # ~360 MiB alone, ~540 after the big one


def test_a_benchmark_started_by_a_large_process_reports_its_own_peak(tmp_path):
    """A process inherits its parent's peak RSS through fork and exec (ru_maxrss): a
    benchmark started by a large runner (this test process after 1,000 tests) reported
    the runner's peak. Its own (VmHWM) starts anew with the program."""
    import subprocess
    import sys

    from capsmed.train.bench import peak_rss_mib

    ballast = bytearray(600 * 2**20)  # this process: 600 MiB more than the child needs
    ballast[::4096] = b"x" * len(ballast[::4096])
    code = "from capsmed.train.bench import peak_rss_mib; print(peak_rss_mib())"
    child = float(subprocess.run([sys.executable, "-c", code], capture_output=True,
                                 text=True, check=True).stdout)
    assert child < peak_rss_mib() - 400, (child, peak_rss_mib())
    del ballast


def test_compiled_variants_of_many_commands_never_fall_back_to_eager(tmp_path):
    """At dynamo's default of 8 variants per function, the ninth model variant a worker
    compiled ran eagerly, and a later `train --compile` trained otherwise than a fresh
    `capsmed train --compile`: every command's variant is compiled."""
    import torch

    from capsmed.cli.worker import run_command

    compiles = []

    def backend(gm, example_inputs):
        compiles.append(len(example_inputs))
        return gm.forward

    def forward(x):
        return x.sin() + 1

    compiled = torch.compile(forward, backend=backend, dynamic=False)
    try:
        for rank in range(1, 11):  # ten commands, each compiling one more variant
            compiled(torch.ones((2,) * rank))
            assert run_command(["--version"], str(tmp_path / "w.log")) == 0
        assert len(compiles) == 10
    finally:
        torch._dynamo.reset()


def test_a_later_commands_compile_is_what_a_fresh_process_compiles(tmp_path):
    """Dynamo marks a dimension dynamic once it has seen two sizes of it, and kept that
    (and the graphs it made) from one command of a worker to the next: a `train
    --compile` at batch size 32 after one at 16 (and its validation batches) ran
    dynamic-shape kernels where a fresh `capsmed train` compiles static ones, and its
    lenet's weights differed from the fresh run's by 0.012 after two epochs."""
    import torch

    from capsmed.cli.worker import run_command

    dynamic = []

    def backend(gm, example_inputs):
        dynamic.append(any(isinstance(x, torch.SymInt) for x in example_inputs))
        return gm.forward

    def forward(x):
        return x.sin() + 1

    compiled = torch.compile(forward, backend=backend)
    try:
        compiled(torch.ones(16))  # a command's training batches,
        compiled(torch.ones(40))  # then its validation batch: now dynamic
        assert dynamic == [False, True]
        assert run_command(["--version"], str(tmp_path / "w.log")) == 0
        compiled(torch.ones(32))  # the next command's first batch
        assert dynamic[2:] == [False]  # compiled static, as in a fresh process
    finally:
        torch._dynamo.reset()


def test_a_failed_routing_compile_is_tried_again_in_the_workers_next_command(monkeypatch,
                                                                            caplog):
    """A compile that failed once made every later run of the worker route eagerly (other
    weights than a fresh capsmed train), and only the first run's log said so."""
    from types import SimpleNamespace

    from capsmed.cli import worker
    from capsmed.models import compiled

    calls = []

    def broken_compile(fn, **kwargs):  # torch.compile fails when first called
        def call(*args):
            calls.append(fn.__name__)
            raise RuntimeError("no toolchain")
        return call

    monkeypatch.setattr(compiled.torch, "compile", broken_compile)

    @compiled.compiled_on_cuda
    def routed(x):
        return "eager"

    cuda_like = SimpleNamespace(is_cuda=True)  # takes the compiled path on any machine
    assert routed(cuda_like) == "eager" and routed(cuda_like) == "eager"
    assert calls == ["routed"]  # failed once: eager from then on, as before
    worker._release_memory()  # between two commands of a worker
    assert routed(cuda_like) == "eager" and calls == ["routed", "routed"]
    assert caplog.text.count("compiled routed failed") == 2


def test_a_warning_shown_in_one_command_is_shown_again_in_the_next(tmp_path):
    """Python shows a warning once per place in a process: a worker's later run's log
    lacked a warning that a fresh `capsmed train` of the same run prints."""
    import warnings

    from capsmed.cli import worker

    def warn():
        warnings.warn("a third-party warning", UserWarning, stacklevel=1)

    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("default")
        before = warnings.filters[:]
        warn()
        warn()  # once per place, as in a fresh process
        assert len(shown) == 1
        assert worker.run_command(["--version"], str(tmp_path / "a.log")) == 0
        assert warnings.filters == before
        warn()  # the next command shows it again
        assert len(shown) == 2
