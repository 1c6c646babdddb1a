"""A measurement worker process: `python -m autotune.worker`, driven by JSON lines.

The parent sends one command per line on stdin and reads one reply per line from a pipe
of its own (the file descriptor in `AUTOTUNE_REPLY_FD`), so nothing printed to stdout by
the user's code, a library or a `sitecustomize` can corrupt a reply. The worker dies with
its parent (Linux: `PR_SET_PDEATHSIG`), so a killed `autotune tune` leaves none behind.
Commands: `open` (target, config, device, protocol), `window`, `profile`, `summary`, and
`train` (target, config, device, seed, steps, warmup). A reply is `{"ok": true, ...}` or
`{"ok": false, "kind": ..., "error": ...}`. A DDP rank other than 0 (`AUTOTUNE_RANK` set,
see `autotune.ranks`) exits after a failure, so its sockets close and rank 0's pending
collective fails at once instead of waiting for the collective timeout.
"""

from __future__ import annotations

import json
import os
import signal
import sys


def _reply(out, payload) -> None:
    out.write(json.dumps(payload) + "\n")
    out.flush()


def _failure(exc: BaseException) -> dict:
    from .runner import classify

    f = classify(exc)
    return {"ok": False, "kind": f.kind.value, "error": f.reason, "traceback": f.detail}


def _die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux), and exit at
    once if the parent is already gone (it died before the request)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the parent's kill of the process group still ends it
    if os.getppid() != int(os.environ.get("AUTOTUNE_PARENT_PID", os.getppid())):
        os._exit(1)


def main() -> None:
    _die_with_parent()
    out = os.fdopen(int(os.environ["AUTOTUNE_REPLY_FD"]), "w")
    import dataclasses

    import torch

    from .config import from_dict
    from .loop import Trainer
    from .measure import Protocol, Session
    from .ranks import RankSpec
    from .workload import load_workload, with_world_size

    def workload(cmd: dict):  # the world size travels in the config (a --world-size flag)
        return with_world_size(load_workload(cmd["target"]), cmd["config"].get("distributed.world_size"))

    peer = RankSpec.from_env()

    session = None
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            if cmd["cmd"] == "open":
                wl = workload(cmd)
                session = Session(wl, from_dict(cmd["config"]), torch.device(cmd["device"]), Protocol(**cmd["protocol"]))
                _reply(out, {"ok": True})
            elif cmd["cmd"] == "window":
                w = session.window()
                _reply(out, {"ok": True, "samples_per_s": w.samples_per_s, "losses": w.losses,
                             "window": dataclasses.asdict(w) if peer else None})
            elif cmd["cmd"] == "profile":
                session.profile(cmd.get("trace"))
                _reply(out, {"ok": True, "comm": session.result.comm})
            elif cmd["cmd"] == "train":
                trainer = Trainer(workload(cmd), from_dict(cmd["config"]), torch.device(cmd["device"]),
                                  seed=cmd["seed"], rank=peer)
                run = trainer.run(cmd["steps"], cmd["warmup"])
                trainer.close()
                _reply(out, {"ok": True, "run": dataclasses.asdict(run)})
            elif cmd["cmd"] == "summary":
                _reply(out, {"ok": True, "summary": session.result.summary().model_dump(mode="json")})
            else:
                _reply(out, {"ok": False, "kind": "crash", "error": f"unknown command {cmd['cmd']!r}"})
        except BaseException as exc:  # noqa: BLE001 - every failure is reported to the parent
            _reply(out, _failure(exc))
            if peer is not None:
                os._exit(1)
            if isinstance(exc, KeyboardInterrupt):
                return
    if session is not None:
        session.close()


if __name__ == "__main__":
    main()
