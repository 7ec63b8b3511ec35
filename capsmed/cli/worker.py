"""A long-lived capsmed process that runs commands one after another.

``capsmed run`` trains and evaluates many runs; started afresh, each ``capsmed
train`` and ``capsmed evaluate`` pays the import of torch and capsmed again (about
3.5 CPU-seconds, longer than a toy run's whole training). The local executor starts
one of these per slot instead (:mod:`capsmed.pipeline.workers`) and sends it the
commands, each exactly as ``python -m capsmed ARGS`` would run it: the same click
entry point, exit code and output, with stdout and stderr sent to the run's log.

Nothing of one command is left for the next: the CLI sets logging and progress
anew for every command, training seeds every generator and scopes its signal
handlers and precision flags to the run, and torch.compile's state and Python's
warning filters and registries are reset after each command (as a fresh process has
them), so a run trained here is bit-identical to one
trained by ``capsmed train`` (tests/test_study_worker.py).

Protocol (one JSON object per line): on file descriptor ``--requests`` the runner
writes ``{"args": [...], "log": PATH}``; this process answers ``{"code": N}`` on
``--replies`` when the command has ended, and exits at the end of its requests.
``--preload MODULE,...``: modules imported at start (torch and training for a worker
that will train), before the first command comes.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import sys
import traceback
import warnings
from collections.abc import Sequence
from typing import IO


def run_command(args: Sequence[str], log: str) -> int:
    """Run ``capsmed ARGS`` here with its output appended to ``log``; its exit code."""
    import typer

    from capsmed.cli import app, whole_summaries

    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    # sys.argv as `python -m capsmed ARGS` has it: what a dataset's provenance and
    # a run's record say made them (not this worker's own command line)
    saved_argv = sys.argv
    saved_filters = warnings.filters[:]
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        sys.argv = [capsmed_main(), *args]
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        try:
            command = whole_summaries(typer.main.get_command(app))
            command.main(args=list(args), prog_name="capsmed", standalone_mode=True)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
        except KeyboardInterrupt:
            sys.stderr.write("error: interrupted\n")
            code = 130
        except Exception:  # as an uncaught error ends `python -m capsmed`
            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
    finally:
        sys.argv = saved_argv
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (fd, *saved):
            os.close(f)
        _fresh_warnings(saved_filters)
    _release_memory()
    return code


def capsmed_main() -> str:
    """The path ``python -m capsmed`` puts in ``sys.argv[0]``."""
    import capsmed

    return os.path.join(os.path.dirname(capsmed.__file__), "__main__.py")


def _fresh_warnings(filters: list) -> None:
    """The warning filters as before the command, and every warning shown again: Python
    shows a warning once per place (or once at all) in a process, so a later run's log
    lacked a warning that `capsmed train` of the same run prints."""
    warnings.resetwarnings()  # bumps the filters' version: every module's registry is stale
    warnings.filters[:] = filters
    warnings.onceregistry.clear()


def _release_memory() -> None:
    # Nothing torch.compile made is kept for the next command: dynamo remembers which
    # dimensions it has seen in two sizes (automatic dynamic shapes) and reuses its
    # graphs while their guards pass, so a `train --compile` after another batch size or
    # input shape ran dynamic-shape kernels where a fresh `capsmed train` compiles
    # static ones, and trained other weights. reset() puts dynamo where a fresh process
    # starts (torch's on-disk compile caches still make the recompile quick), and with
    # it the recompile_limit count of variants per function.
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        dynamo.reset()
    compiled = sys.modules.get("capsmed.models.compiled")
    if compiled is not None:  # a compile that failed in one run is tried again in the next
        compiled.reset_compile_failures()
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def serve(requests: IO[str], replies: IO[str]) -> None:
    for line in requests:
        request = json.loads(line)
        code = run_command(request["args"], request["log"])
        replies.write(json.dumps({"code": code}) + "\n")
        replies.flush()


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    options = dict(zip(argv[0::2], argv[1::2], strict=True))
    with open(int(options["--requests"]), encoding="utf-8") as requests, \
            open(int(options["--replies"]), "w", encoding="utf-8") as replies, \
            contextlib.suppress(KeyboardInterrupt, BrokenPipeError):
        import capsmed.cli  # noqa: F401  (the imports every command needs, once)

        for module in filter(None, options.get("--preload", "").split(",")):
            with contextlib.suppress(ImportError):  # a speed-up only
                importlib.import_module(module)  # while the runner has no command for it
        serve(requests, replies)
    # Every command's files are written and closed: skip the interpreter's teardown of
    # torch and a thousand modules (about a second the runner would wait for).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
