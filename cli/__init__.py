"""The ``tessera`` command line: serve the control plane, submit and watch runs."""

import sys

CLI_MODULES = ("typer", "click", "rich", "yaml")  # what the [cli] extra adds to the SDK


def main() -> None:
    """The ``tessera`` console script. Without the ``[cli]`` extra it says what to install
    instead of showing an ImportError traceback (the bare package is the SDK alone)."""
    try:
        from cli.main import main as run
    except ModuleNotFoundError as exc:
        if exc.name not in CLI_MODULES:
            raise
        sys.exit(f"tessera: the command line needs its [cli] extra ({exc.name} is not installed): "
                 "from a clone, pip install '.[cli]'")
    run()
