"""A measurement worker process: `python -m autotune.worker`, driven by JSON lines.

The parent sends one command per line on stdin and reads one reply per line from a
dedicated pipe (the original stdout); anything the user's code prints goes to stderr.
Commands: `open` (target, config, device, protocol), `window`, `profile`, `summary`.
A reply is `{"ok": true, ...}` or `{"ok": false, "kind": ..., "error": ...}`.
"""

from __future__ import annotations

import json
import os
import sys


def _reply(out, payload) -> None:
    out.write(json.dumps(payload) + "\n")
    out.flush()


def _failure(exc: BaseException) -> dict:
    from .runner import classify

    f = classify(exc)
    return {"ok": False, "kind": f.kind.value, "error": f.reason, "traceback": f.detail}


def main() -> None:
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # user prints (Python or C) must not corrupt the reply pipe
    sys.stdout = sys.stderr
    import torch

    from .config import from_dict
    from .measure import Protocol, Session
    from .workload import load_workload

    session = None
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            if cmd["cmd"] == "open":
                wl = load_workload(cmd["target"])
                session = Session(wl, from_dict(cmd["config"]), torch.device(cmd["device"]), Protocol(**cmd["protocol"]))
                _reply(out, {"ok": True})
            elif cmd["cmd"] == "window":
                w = session.window()
                _reply(out, {"ok": True, "samples_per_s": w.samples_per_s, "losses": w.losses})
            elif cmd["cmd"] == "profile":
                session.profile(cmd.get("trace"))
                _reply(out, {"ok": True})
            elif cmd["cmd"] == "summary":
                _reply(out, {"ok": True, "summary": session.result.summary().model_dump(mode="json")})
            else:
                _reply(out, {"ok": False, "kind": "crash", "error": f"unknown command {cmd['cmd']!r}"})
        except BaseException as exc:  # noqa: BLE001 - every failure is reported to the parent
            _reply(out, _failure(exc))
            if isinstance(exc, KeyboardInterrupt):
                return


if __name__ == "__main__":
    main()
