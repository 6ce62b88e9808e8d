"""`python -I .../launcher.py CMD...`: the parent of a `post files --run` script.

(Standard library only: jsonlbatch runs this file by path in isolated mode, without importing
the package.)

A script can read its parent's environment (`/proc/$PPID/environ`). Were jsonlbatch that
parent, every API key in jsonlbatch's environment would be one `open()` away, whatever was
taken out of the script's own. So jsonlbatch starts this small process with nothing but the
whitelisted environment (and the resource limits), and it runs CMD (the script, or bubblewrap
running the script) as its child and waits. Its exit status is CMD's; a CMD killed by a signal
kills it by the same signal, so jsonlbatch sees what happened to the script itself.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys


def main(argv: list[str]) -> int:
    if not argv:
        sys.stderr.write("usage: launcher.py CMD...\n")
        return 2
    try:
        proc = subprocess.Popen(argv, close_fds=True)
    except OSError as exc:
        sys.stderr.write(f"cannot start {argv[0]}: {exc.strerror or exc}\n")
        return 127
    while True:
        try:
            code = proc.wait()
            break
        except KeyboardInterrupt:  # the group got SIGINT: the script got it too; wait for it
            continue
    if code < 0:
        if -code != signal.SIGKILL:
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
