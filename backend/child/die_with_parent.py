"""Run a command that gets a signal (SIGTERM) when the process that started it dies (even by SIGKILL).

    python -m backend.child.die_with_parent PARENT_PID [SIGNAL] -- COMMAND [ARG...]

SIGNAL (a number, SIGTERM by default) is what the command gets. Sets PR_SET_PDEATHSIG and replaces itself with
COMMAND (exec: the engine keeps this process's pid and group). The app cannot do this between fork and exec itself
(subprocess's preexec_fn is unsafe in a process with threads), so this small program does it first. If the parent
died before the signal was armed, it exits instead of starting an orphan. Imports nothing of backend (child/)."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> None:
    sig = signal.SIGTERM
    if len(argv) > 2 and argv[1] != "--" and argv[1].isdigit():
        sig, argv = signal.Signals(int(argv[1])), [argv[0], *argv[2:]]
    if len(argv) < 3 or argv[1] != "--":
        sys.exit("usage: python -m backend.child.die_with_parent PARENT_PID [SIGNAL] -- COMMAND [ARG...]")
    parent, command = int(argv[0]), argv[2:]
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, sig)
    if os.getppid() != parent:  # the parent went before the signal was armed: nobody would stop the command
        sys.exit(1)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
