"""The ``switchyard`` command line (typer); see :mod:`app.cli.main`."""
