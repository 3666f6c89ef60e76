"""The `ucp` command of the wheel (its console entry point): the `ucp` binary the
wheel carries (ucp/_bin/ucp, the same portable binary as the release's), so that
every command works as documented, `mpirun -np N ucp ...` included.

    ucp convert --input_folder=... --output_folder=...
"""

import os
import sys


def binary_path():
    """The bundled `ucp` binary."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "ucp")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    path = binary_path()
    if not os.access(path, os.X_OK):
        print(f"ucp: the bundled binary {path} is missing or not executable (reinstall the wheel)", file=sys.stderr)
        return 1
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(path, [path] + list(argv))


if __name__ == "__main__":
    sys.exit(main())
