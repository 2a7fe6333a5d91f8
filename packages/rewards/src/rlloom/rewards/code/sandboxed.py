# mypy: allow-untyped-defs, allow-untyped-calls, allow-incomplete-defs
"""The program the sandbox starts: read the job, load the harness, hand over to `supervisor.main`.

Started by `runner.py` as `python -I -S -B sandboxed.py CFG_FD TESTS_FD RESULT_FD`; `-I -S` keeps site-packages
off the path and start-up short. The job (marshal, from CFG_FD) carries the harness itself, `wire`, `channel` and
`supervisor` compiled by the parent: this file stays small because a script is compiled at every start and
nothing here may rely on a .pyc (PYTHONDONTWRITEBYTECODE, read-only installs), so each run compiles only these
lines. See `supervisor.py` for what happens next.
"""

import marshal
import os
import sys

SETUP_FAILED = 121  # exit code meaning "the sandbox could not be sealed"; the parent reports a sandbox error


def _bootstrap():
    cfg_fd, tests_fd, result_fd = (int(a) for a in sys.argv[1:4])
    try:
        with os.fdopen(cfg_fd, "rb") as f:
            cfg = marshal.loads(f.read())
        for name, code in cfg.pop("modules"):  # wire, channel, meters, supervisor: each imports those before it
            module = type(sys)(name)
            sys.modules[name] = module
            exec(code, module.__dict__)
    except BaseException as exc:
        os.write(2, f"rlloom sandbox setup failed: {type(exc).__name__}: {exc}\n".encode())
        os._exit(SETUP_FAILED)
    sys.modules["supervisor"].main(cfg, tests_fd, result_fd)


if __name__ == "__main__":
    _bootstrap()
