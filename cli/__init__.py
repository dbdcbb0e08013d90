"""The ``tessera`` command line: serve the control plane, submit and watch runs."""
